//! `history_mb` and `history = true`: data calls kept with their inputs and replayed in order after a restart, so
//! the new incarnation is in the state the old one had, not only its configuration; a history past its bound is
//! dropped whole.

mod common;

use common::*;
use ward::{Arg, Isolation};

const HISTORY: &str = "[extension.faulty.function.faulty_counter_add]\nhistory = true\n";

/// The faulty policy with `faulty_counter_add` a data call (not a state call) and `history_mb` set.
fn policy(history_mb: u64) -> String {
    let base = FAULTY_POLICY.replace("[extension.faulty.function.faulty_counter_add]\nstate = true\n", HISTORY);
    base.replacen("[extension.faulty]\n", &format!("[extension.faulty]\nhistory_mb = {history_mb}\n"), 1)
}

/// Kill the domain from outside, as a crash between calls would.
fn kill_domain(ext: &ward::Extension) {
    let pid = ext.pid().expect("a process domain");
    // SAFETY: our own domain process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

#[test]
fn a_restarted_extension_gets_its_data_calls_replayed_in_order() {
    let (_sup, ext, events) = faulty_with(Isolation::Process, &policy(1));
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(7)]), 12);
    kill_domain(&ext);
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 12, "both additions replayed");
    assert_eq!(faults(&events).len(), 1);
    assert_eq!(ext.stats().shadow_log, 2);
}

#[test]
fn without_history_mb_data_calls_are_not_kept() {
    let (_sup, ext, _events) = faulty_with(Isolation::Process, &policy(0));
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    kill_domain(&ext);
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 0, "nothing replayed");
    assert_eq!(ext.stats().shadow_log, 0);
}

#[test]
fn a_history_past_its_bound_is_dropped_and_the_restart_replays_state_only() {
    let (_sup, ext, _events) = faulty_with(Isolation::Process, &policy(1));
    // Each call is charged 64 bytes: 16 384 fill 1 MiB, the next one overflows it.
    let calls = (1 << 20) / 64 + 1;
    for _ in 0..calls {
        i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(1)]);
    }
    assert_eq!(ext.stats().shadow_log, 0, "the whole history dropped");
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(1)]), calls + 1);
    assert_eq!(ext.stats().shadow_log, 0, "and no longer kept");
    kill_domain(&ext);
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 0);
}
