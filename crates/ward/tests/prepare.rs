//! A supervisor asked to prepare its process domains (`Supervisor::prepare_process_domains`: a host opened a plugin
//! library and will likely instantiate from it soon) starts its domain template and the template's spare beside
//! the caller, so that its first domain takes that spare as later domains do, instead of waiting for the template's
//! exec. The counter of domains started from spares is per process, so the supervisor runs in a host of its own
//! (this program again), with the template and spares on whatever the environment says.

mod common;

use std::process::Command;

use common::*;
use ward::{Arg, Isolation, Policy, Supervisor};

/// Set in the environment of this test program when it runs as the host of `host_that_prepares_its_domains`.
const HOST_ENV: &str = "WARD_TEST_PREPARE_HOST";

/// Not a test of its own: the host `a_prepared_supervisor_starts_its_first_domain_from_a_spare` runs.
#[test]
#[ignore = "run by a_prepared_supervisor_starts_its_first_domain_from_a_spare as its host"]
fn host_that_prepares_its_domains() {
    if std::env::var_os(HOST_ENV).is_none() {
        return;
    }
    let sup = Supervisor::new(Policy::default());
    sup.prepare_process_domains();
    // Asked twice (a host opening a second library first): still one template, one spare.
    sup.prepare_process_domains();
    let well = sup.load_with(builtin("well"), Some(Isolation::Process)).expect("load in a process domain");
    assert_eq!(ward::domains_started_from_spares(), 1, "the first domain took the spare made ahead");
    assert_eq!(i64_call(&well, "well_add", &mut [Arg::I64(2), Arg::I64(3)]), 5);
    let faulty = sup.load_with(builtin("faulty"), Some(Isolation::Process)).expect("load in a process domain");
    assert_eq!(ward::domains_started_from_spares(), 2, "the second domain took the next spare");
    assert_eq!(i64_call(&faulty, "faulty_counter_add", &mut [Arg::I64(4)]), 4);
    println!("prepared host: done");
}

#[test]
fn a_prepared_supervisor_starts_its_first_domain_from_a_spare() {
    let out = Command::new(std::env::current_exe().expect("this test program"))
        .args(["--ignored", "--exact", "host_that_prepares_its_domains", "--nocapture", "--test-threads", "1"])
        .env(HOST_ENV, "1")
        .env_remove("WARD_DOMAIN_SPARE")
        .env_remove("WARD_DOMAIN_TEMPLATE")
        .output()
        .expect("run the host");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("prepared host: done"),
        "the host failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
