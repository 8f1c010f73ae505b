//! Domain processes forked from the host's template instead of exec'd (issue 30): every domain of a supervisor
//! after the template exists is forked from it (its processes show the template's command line), a killed template
//! is replaced and leaves the domains forked from it working, and a forked domain gets the sandbox an exec'd one
//! gets (`WARD_DOMAIN_TEMPLATE=off` execs every domain, for the comparison).

mod common;

use std::process::Command;

use common::*;
use ward::{Arg, Isolation, Policy, RetType, Supervisor};

/// Set in the environment of this test program when it runs as the host of `host_that_reports_its_sandbox`.
const HOST_ENV: &str = "WARD_TEST_TEMPLATE_HOST";

/// The command line of process `pid`, its arguments joined by spaces.
fn command_line(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw).split('\0').filter(|a| !a.is_empty()).collect::<Vec<_>>().join(" ")
}

fn forked_from_a_template(pid: i32) -> bool {
    command_line(pid).contains("--mode template")
}

/// The processes whose parent is `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|_| stat_field::<i32>(p, 4) == pid))
        .collect()
}

/// The process started for the domain of `ext` (the zygote's, outside its namespace if it has one).
fn started_for_extension(ext: &ward::Extension) -> i32 {
    let incarnation = ext.pid().expect("a process domain has a process");
    started_for(stat_field(incarnation, 4))
}

/// Whether process `pid` ends within a generous time (its pidfd becomes readable; a zombie has ended).
fn ends(pid: i32) -> bool {
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return true;
    }
    let mut pfd = libc::pollfd { fd: fd as i32, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd; then the descriptor pidfd_open gave us is closed once.
    unsafe {
        let ended = libc::poll(&mut pfd, 1, 60_000) > 0;
        libc::close(fd as i32);
        ended
    }
}

/// The only test of this program that starts domains in its own process: so the template found among this
/// process's children is this supervisor's.
#[test]
fn domains_are_forked_from_the_template_and_a_killed_template_is_replaced() {
    let sup = Supervisor::new(Policy::default());
    let load = |name: &str| sup.load_with(builtin(name), Some(Isolation::Process)).expect("load in a process domain");
    let well = load("well");
    let faulty = load("faulty");
    let stale = load("stale");
    assert_eq!(i64_call(&well, "well_add", &mut [Arg::I64(2), Arg::I64(3)]), 5);
    assert_eq!(i64_call(&faulty, "faulty_counter_add", &mut [Arg::I64(4)]), 4);
    let domains = [started_for_extension(&well), started_for_extension(&faulty), started_for_extension(&stale)];
    let host = std::process::id() as i32;
    for started in domains {
        assert_eq!(stat_field::<i32>(started, 4), host, "process {started} is the host's child, as an exec'd one");
        assert!(
            forked_from_a_template(started),
            "the domain process {started} was exec'd: `{}`",
            command_line(started)
        );
    }
    // The template: the host's child with the template's command line that is none of the domains' processes.
    let templates: Vec<i32> =
        children_of(host).into_iter().filter(|p| forked_from_a_template(*p) && !domains.contains(p)).collect();
    assert_eq!(templates.len(), 1, "one template per supervisor: {templates:?}");
    let template = templates[0];
    // SAFETY: kill takes no pointers; the template is this process's child, not reaped until the library reaps it.
    assert_eq!(unsafe { libc::kill(template, libc::SIGKILL) }, 0);
    assert!(ends(template), "the killed template ended");
    // The domains forked from it do not depend on it.
    assert_eq!(i64_call(&well, "well_add", &mut [Arg::I64(20), Arg::I64(22)]), 42);
    assert_eq!(i64_call(&faulty, "faulty_counter_add", &mut [Arg::I64(1)]), 5);
    // The next domain starts all the same, from a new template.
    let hostile = load("hostile");
    let rc = hostile.call("hostile_attack", &mut [Arg::I64(0)], RetType::I64).expect("a call to the new domain");
    assert_eq!(rc.as_i64(), Some(-i64::from(libc::EINVAL)));
    let started = started_for_extension(&hostile);
    assert!(forked_from_a_template(started), "the domain after the kill was exec'd: `{}`", command_line(started));
    let replaced: Vec<i32> = children_of(host)
        .into_iter()
        .filter(|p| forked_from_a_template(*p) && !domains.contains(p) && *p != started)
        .collect();
    assert_eq!(replaced.len(), 1, "a new template replaced the killed one: {replaced:?}");
    assert_ne!(replaced[0], template);
}

/// The attacks of hostile.c (the low 8 bits of its argument) this comparison makes.
const ATTACKS: [(&str, i64); 5] = [("exec", 1), ("fork", 3), ("memfd", 4), ("tmp-file", 5), ("traceme", 6)];

/// `/proc/PID/status` lines that show a process's sandbox.
const SANDBOX_FIELDS: [&str; 8] =
    ["NoNewPrivs:", "Seccomp:", "Seccomp_filters:", "CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"];

/// Not a test of its own: the host `a_forked_domain_has_the_sandbox_of_an_exec_d_one` runs (this program again,
/// with or without the template). It prints how its domain was started and what of the sandbox can be seen from
/// outside and from the attacks' outcomes, one line each.
#[test]
#[ignore = "run by a_forked_domain_has_the_sandbox_of_an_exec_d_one as its host"]
fn host_that_reports_its_sandbox() {
    if std::env::var_os(HOST_ENV).is_none() {
        return;
    }
    let policy = Policy::from_toml_str(
        "[extension.hostile]\non_fault = \"fail\"\ndeadline_ms = 30000\nmax_restarts = 1000\nmax_failures_in_row = 0\n",
        "test policy",
    )
    .expect("the policy parses");
    let sup = Supervisor::new(policy);
    // Two domains, so that the second starts from a template that exists already.
    let _well = sup.load_with(builtin("well"), Some(Isolation::Process)).expect("load well");
    let ext = sup.load_with(builtin("hostile"), Some(Isolation::Process)).expect("load hostile");
    let attack = |code: i64| match ext.call("hostile_attack", &mut [Arg::I64(code)], RetType::I64) {
        Ok(v) => format!("returned {:?}", v.as_i64()),
        Err(ward::Error::Fault(f)) => match f.kind {
            ward::FaultKind::Signal { signo, .. } => format!("fault: signal {signo}"),
            other => format!("fault: {other:?}"),
        },
        Err(e) => format!("error {e}"),
    };
    assert_eq!(attack(0), format!("returned {:?}", Some(-i64::from(libc::EINVAL))), "the domain serves");
    let mut report = Vec::new();
    let incarnation = ext.pid().expect("a process domain has a process");
    let zygote: i32 = stat_field(incarnation, 4);
    let started = started_for(zygote);
    let host = std::process::id() as i32;
    let namespace = |pid: i32, ns: &str| std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok();
    let cgroup = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    for (who, pid) in [("incarnation", incarnation), ("zygote", zygote)] {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read the status");
        for field in SANDBOX_FIELDS {
            let line = status.lines().find(|l| l.starts_with(field)).unwrap_or(field);
            report.push(format!("{who} {line}"));
        }
        for ns in ["pid", "mnt"] {
            report.push(format!("{who} own {ns} namespace: {}", namespace(pid, ns) != namespace(host, ns)));
        }
        report.push(format!("{who} own cgroup: {}", cgroup(pid) != cgroup(host)));
        report.push(format!("{who} own process group: {}", stat_field::<i32>(pid, 5) != stat_field::<i32>(host, 5)));
    }
    for (name, code) in ATTACKS {
        report.push(format!("attack {name}: {}", attack(code | (i64::from(host) << 8))));
    }
    let _ = std::fs::remove_file(format!("/tmp/ward-hostile-{host}-lib"));
    println!("started by {}", if forked_from_a_template(started) { "template" } else { "exec" });
    for line in report {
        println!("sandbox-report {line}");
    }
}

/// What `host_that_reports_its_sandbox` printed, run with the template on or off: how its domain was started, and
/// the lines about its sandbox.
fn sandbox_report(template: bool) -> (String, Vec<String>) {
    let mut host = Command::new(std::env::current_exe().expect("this test program"));
    host.args(["--ignored", "--exact", "host_that_reports_its_sandbox", "--nocapture", "--test-threads", "1"])
        .env(HOST_ENV, "1");
    if !template {
        host.env("WARD_DOMAIN_TEMPLATE", "off");
    }
    let out = host.output().expect("run the host");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the host failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // The test harness may print the test's name on the same line first.
    let started = stdout
        .lines()
        .find_map(|l| Some(l[l.find("started by ")? + "started by ".len()..].to_string()))
        .expect("the host says how its domain started");
    let sandbox = stdout
        .lines()
        .filter_map(|l| Some(l[l.find("sandbox-report ")? + "sandbox-report ".len()..].to_string()))
        .collect();
    (started, sandbox)
}

#[test]
fn a_forked_domain_has_the_sandbox_of_an_exec_d_one() {
    let (forked_by, forked) = sandbox_report(true);
    let (execd_by, execd) = sandbox_report(false);
    assert_eq!(forked_by, "template");
    assert_eq!(execd_by, "exec");
    assert_eq!(forked.len(), ATTACKS.len() + 2 * (SANDBOX_FIELDS.len() + 4), "every line: {forked:?}");
    assert_eq!(forked, execd, "the forked domain's sandbox differs from the exec'd one's");
    // The comparison is worth something only where the sandbox is there to compare: no attack got through.
    for line in forked.iter().filter(|l| l.starts_with("attack")) {
        assert!(!line.contains("returned Some(0)"), "an attack got through: {line}");
    }
}
