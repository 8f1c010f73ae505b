//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::mpsc::Receiver;

use ward::{Arg, Event, Extension, Isolation, Policy, RetType, Supervisor};

pub fn builtin(name: &str) -> PathBuf {
    ward_extensions::path_of(name).expect("built-in extensions extract")
}

/// The faulty extension's policy: generous but finite deadline, small limits, its counter replayed. Only the
/// restart limit disables (the tests crash it over and over on purpose); tests/deadlines.rs covers
/// `max_failures_in_row`.
pub const FAULTY_POLICY: &str = r#"
[extension.faulty]
deadline_ms = 3000
max_restarts = 1000
restart_period_s = 1
max_failures_in_row = 0
backoff_initial_ms = 0.001
backoff_max_ms = 0.001
[extension.faulty.limits]
open_files = 64
address_space_mb = 256
[extension.faulty.function.faulty_counter_add]
state = true
"#;

/// The faulty policy with `extra` keys added to its `[extension.faulty]` table.
pub fn faulty(isolation: Isolation, extra: &str) -> (Supervisor, Extension, Receiver<Event>) {
    let policy = FAULTY_POLICY.replacen("[extension.faulty]\n", &format!("[extension.faulty]\n{extra}\n"), 1);
    faulty_with(isolation, &policy)
}

pub fn faulty_with(isolation: Isolation, policy: &str) -> (Supervisor, Extension, Receiver<Event>) {
    let policy = Policy::from_toml_str(policy, "test policy").unwrap();
    let sup = Supervisor::new(policy);
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("faulty"), Some(isolation)).unwrap();
    (sup, ext, events)
}

pub fn i64_call(ext: &Extension, f: &str, args: &mut [Arg<'_>]) -> i64 {
    ext.call(f, args, RetType::I64).unwrap().as_i64().unwrap()
}

/// Establish state (counter = 12), arm `kind`, call compute: must come back correct.
pub fn arm_and_compute(ext: &Extension, kind: i64, arg: i64) -> ward::Value {
    assert_eq!(i64_call(ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    assert_eq!(i64_call(ext, "faulty_counter_add", &mut [Arg::I64(7)]), 12);
    ext.call("faulty_arm", &mut [Arg::I64(kind), Arg::I64(arg)], RetType::Void).unwrap();
    ext.call("faulty_compute", &mut [Arg::I64(6)], RetType::I64).unwrap()
}

pub fn faults(events: &Receiver<Event>) -> Vec<ward::Fault> {
    events
        .try_iter()
        .filter_map(|e| match e {
            Event::Fault { fault } => Some(fault),
            _ => None,
        })
        .collect()
}

/// A fresh directory for one test's files: `what` tells tests of one binary apart.
pub fn scratch_dir(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ward-test-{}-{what}", std::process::id()));
    std::fs::create_dir_all(&d).expect("create a scratch directory");
    d
}

/// Compile C `source` with `cc`, giving it `args` (the source is read from standard input, `-x c -`).
pub fn cc(args: &[&str], source: &[u8]) {
    use std::io::Write;
    let mut c =
        std::process::Command::new("cc").args(args).stdin(std::process::Stdio::piped()).spawn().expect("run cc");
    c.stdin.take().expect("cc's standard input").write_all(source).expect("write the source to cc");
    assert!(c.wait().expect("wait for cc").success(), "cc failed");
}

/// `dir/libbroken.so`, whose DT_NEEDED names a library that is gone: dlopen of it fails, naming
/// `libward_missing_dependency`.
pub fn library_with_a_missing_dependency(dir: &std::path::Path) -> PathBuf {
    let so = dir.join("libbroken.so");
    // Link against a stub library, then delete it.
    let stub = dir.join("libward_missing_dependency.so");
    cc(&["-shared", "-fPIC", "-o", stub.to_str().unwrap(), "-x", "c", "-"], b"int g(void){return 2;}\n");
    cc(
        &[
            "-shared",
            "-fPIC",
            "-o",
            so.to_str().unwrap(),
            "-x",
            "c",
            "-",
            "-L",
            dir.to_str().unwrap(),
            "-lward_missing_dependency",
        ],
        b"int g(void); int f(void){return g();}\n",
    );
    std::fs::remove_file(&stub).expect("remove the stub library");
    so
}

/// `dir/libboom.so`, whose constructor dereferences null: loading it kills the process that loads it.
pub fn library_with_a_crashing_constructor(dir: &std::path::Path) -> PathBuf {
    let so = dir.join("libboom.so");
    cc(
        &["-shared", "-fPIC", "-o", so.to_str().unwrap(), "-x", "c", "-"],
        b"__attribute__((constructor)) static void boom(void) { *(volatile int *)0 = 1; }\nint f(void) { return 1; }\n",
    );
    so
}

/// Field `n` (counted from 1, as `proc(5)` does) of `/proc/PID/stat`, read after the command's closing parenthesis
/// (the command may hold spaces).
pub fn stat_field<T: std::str::FromStr>(pid: i32, n: usize) -> T {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    let after_name = &stat[stat.rfind(')').expect("a stat line names its command in parentheses") + 2..];
    // The text after the parenthesis starts at field 3.
    after_name.split(' ').nth(n - 3).and_then(|f| f.parse().ok()).unwrap_or_else(|| panic!("stat field {n} of {pid}"))
}

/// The ids process `pid` has in each PID namespace it is in, outermost first (`NSpid:` in `/proc/PID/status`).
pub fn ns_pids(pid: i32) -> Vec<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:")).expect("an NSpid line");
    line.split_whitespace().map(|p| p.parse().expect("a process id")).collect()
}

/// The process a supervisor started for the domain whose process proper is `domain` (a zygote, or a domain spawned
/// directly): in a PID namespace of its own the domain is pid 2 there, under the namespace's init (pid 1), under the
/// process started outside it; without one, the domain itself.
pub fn started_for(domain: i32) -> i32 {
    if ns_pids(domain).len() > ns_pids(std::process::id() as i32).len() {
        stat_field(stat_field(domain, 4), 4)
    } else {
        domain
    }
}

/// Whether this machine gives domains a PID namespace; when it does not, says so on standard error for the test
/// that needs one, which then does not run its checks.
pub fn pid_namespace_or_say(test: &str) -> bool {
    match ward::sandbox::missing().iter().find(|m| m.protection == "pid-namespace") {
        Some(m) => {
            eprintln!("SKIPPED {test}: this machine gives domains no PID namespace ({})", m.why);
            false
        }
        None => true,
    }
}

/// For the tests that need PKU, which are marked `#[ignore = "needs PKU"]` (`scripts/test` runs them where the
/// processor has PKU, under emulation where it has not): fails the test, saying why, where there is no PKU, so that
/// a run with `--include-ignored` on such a machine fails instead of passing without having run.
pub fn require_pku() {
    assert!(
        ward::mpk_available(),
        "this test needs memory protection keys (PKU), which this machine does not have: run it under scripts/pku-vm"
    );
}
