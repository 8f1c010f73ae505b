//! Resource limits that hold (issue 28): a process domain's cgroup bounds its memory (shared memory and memfd pages
//! included) and its processes, the zygote and its incarnations together, and is gone when the domain ends; a
//! thread that burns CPU between calls is a fault. `extensions/resources.c` takes what the limits forbid.
//!
//! The cgroup tests need a cgroup the test process may create (root, or a delegated subtree): where the machine has
//! none, each says so on standard error and checks nothing else. The CPU test needs none.

mod common;

use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::*;
use ward::{Arg, Error, Event, Extension, FaultKind, Isolation, Policy, RetType, Supervisor};

/// A fault fails the call (no retry: the retried call would take as much again); restarts are not limited; the
/// heartbeat reports a domain killed between calls without waiting for the next call.
const POLICY: &str = r#"
[extension.resources]
on_fault = "fail"
heartbeat_ms = 100
deadline_ms = 60000
max_restarts = 1000
restart_period_s = 1
backoff_initial_ms = 0.001
backoff_max_ms = 0.001
[extension.resources.limits]
address_space_mb = 0
memory_mb = 64
pids = 16
"#;

/// Far beyond the memory limit.
const TOO_MUCH_MIB: i64 = 1024;

fn load(extra: &str) -> (Supervisor, Extension, Receiver<Event>) {
    let policy = Policy::from_toml_str(&format!("{POLICY}{extra}"), "resources policy").expect("the policy parses");
    let sup = Supervisor::new(policy);
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("resources"), Some(Isolation::Process)).expect("load resources");
    (sup, ext, events)
}

fn call(ext: &Extension, function: &str, args: &mut [Arg<'_>]) -> Result<i64, Error> {
    ext.call(function, args, RetType::I64).map(|v| v.as_i64().expect("an i64 result"))
}

/// Whether this machine gives domains the cgroup `part` of (`cgroup-memory`, `cgroup-pids`); says so when not.
fn cgroup_has(part: &str, test: &str) -> bool {
    let missing: Vec<_> = ward::sandbox::missing()
        .iter()
        .filter(|m| m.protection == part || m.protection == "cgroup")
        .map(|m| format!("{}: {}", m.protection, m.why))
        .collect();
    if missing.is_empty() {
        return true;
    }
    eprintln!("NOT CHECKED: {test}: this machine gives no cgroup for it ({})", missing.join("; "));
    false
}

/// The call failed with the memory-limit fault of `resources`, which was reported, and the extension serves the
/// next call.
fn assert_memory_fault(what: &str, result: Result<i64, Error>, ext: &Extension, events: &Receiver<Event>) {
    match &result {
        Err(Error::Fault(f)) => {
            assert_eq!(f.kind, FaultKind::MemoryLimit { limit_mb: 64 }, "{what}: {f}");
            assert_eq!(f.domain, "resources");
            assert!(f.to_string().contains("memory limit of 64 MiB reached"), "{f}");
        }
        other => panic!("{what}: no memory-limit fault: {other:?}"),
    }
    assert!(
        faults(events).iter().any(|f| matches!(f.kind, FaultKind::MemoryLimit { .. })),
        "{what}: the fault was not reported"
    );
    assert_eq!(call(ext, "resources_ping", &mut []).ok(), Some(42), "{what}: the extension serves the next call");
}

#[test]
fn anonymous_memory_past_the_limit_is_a_memory_fault_of_the_extension() {
    if !cgroup_has("cgroup-memory", "anonymous memory past the limit") {
        return;
    }
    let (_sup, ext, events) = load("");
    let result = call(&ext, "resources_anon", &mut [Arg::I64(TOO_MUCH_MIB)]);
    assert_memory_fault("anonymous memory", result, &ext, &events);
}

#[test]
fn a_memfd_past_the_limit_is_a_memory_fault_when_the_filter_allows_memfds() {
    if !cgroup_has("cgroup-memory", "a memfd past the limit") {
        return;
    }
    let (_sup, ext, events) =
        load("[extension.resources.sandbox]\nseccomp = false\nreason = \"a test: memfd_create is filtered\"\n");
    let result = call(&ext, "resources_memfd", &mut [Arg::I64(TOO_MUCH_MIB)]);
    assert_memory_fault("memfd", result, &ext, &events);
}

#[test]
fn dev_shm_past_the_limit_is_a_memory_fault_when_the_sandbox_allows_writing_there() {
    if !cgroup_has("cgroup-memory", "/dev/shm past the limit") {
        return;
    }
    let (_sup, ext, events) =
        load("[extension.resources.sandbox]\nwritable = [\"/dev/shm\"]\nreason = \"a test: shared memory files\"\n");
    let result = call(&ext, "resources_shm", &mut [Arg::I64(TOO_MUCH_MIB)]);
    assert_memory_fault("/dev/shm", result, &ext, &events);
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| d.flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().starts_with("ward-resources-")))
        .into_iter()
        .flatten()
        .collect();
    assert!(left.is_empty(), "files left in /dev/shm: {left:?}");
}

#[test]
fn forking_past_the_pids_limit_is_refused_and_no_child_outlives_the_domain() {
    if !cgroup_has("cgroup-pids", "forking past the pids limit") {
        return;
    }
    let (sup, ext, _events) =
        load("[extension.resources.sandbox]\nfork = true\nreason = \"a test: forks past the pids limit\"\n");
    let forked = call(&ext, "resources_fork", &mut [Arg::I64(100)]).expect("the call returns");
    assert!((1..16).contains(&forked), "forked {forked} of 100 children under a limit of 16 (zygote included)");
    let dirs = cgroup_dirs(ext.pid().expect("a live incarnation"));
    drop(ext);
    drop(sup);
    for dir in &dirs {
        assert!(!dir.exists(), "{} is left after the domain ended", dir.display());
    }
}

#[test]
fn the_zygote_and_its_incarnation_share_one_cgroup_which_is_gone_after_the_domain() {
    if !cgroup_has("cgroup-memory", "the domain's cgroup") {
        return;
    }
    let (sup, ext, _events) = load("");
    assert_eq!(call(&ext, "resources_ping", &mut []).ok(), Some(42));
    let pid = ext.pid().expect("a live incarnation");
    let zygote = parent_of(pid);
    assert_eq!(std::fs::read_to_string(format!("/proc/{zygote}/comm")).ok().as_deref(), Some("ward-domain\n"));
    let dirs = cgroup_dirs(pid);
    assert!(!dirs.is_empty(), "the incarnation is in no ward cgroup: {:?}", std::fs::read_to_string(cgroup_of(pid)));
    assert_eq!(cgroup_dirs(zygote), dirs, "the zygote is in the incarnation's cgroup");
    for dir in &dirs {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).expect("read cgroup.procs");
        let procs: Vec<i32> = procs.lines().filter_map(|l| l.parse().ok()).collect();
        assert!(procs.contains(&pid) && procs.contains(&zygote), "{}: {procs:?}", dir.display());
    }
    let memory = dirs.iter().find(|d| d.join("memory.limit_in_bytes").exists() || d.join("memory.max").exists());
    let memory = memory.expect("a memory cgroup");
    let limit = std::fs::read_to_string(memory.join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(memory.join("memory.max")))
        .expect("read the memory limit");
    assert_eq!(limit.trim(), (64u64 << 20).to_string());
    drop(ext);
    drop(sup);
    for dir in &dirs {
        assert!(!dir.exists(), "{} is left after the domain ended", dir.display());
    }
}

#[test]
fn a_thread_burning_cpu_between_calls_is_a_fault_and_the_extension_restarts() {
    let (_sup, ext, events) = load("");
    assert_eq!(call(&ext, "resources_burn", &mut []).ok(), Some(0), "the burning thread starts");
    let burner = ext.pid().expect("a live incarnation");
    // The thread burns until the domain is killed: any budget is exceeded, sooner or later.
    let deadline = Instant::now() + Duration::from_secs(120);
    let fault = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.recv_timeout(left) {
            Ok(Event::Fault { fault }) => break fault,
            Ok(_) => continue,
            Err(e) => panic!("no fault within 120 s of burning CPU between calls ({e})"),
        }
    };
    assert_eq!(fault.domain, "resources");
    match &fault.kind {
        FaultKind::IdleCpu { used, allowed, .. } => assert!(used > allowed, "{fault}"),
        other => panic!("a fault, but not of CPU between calls: {other:?} ({fault})"),
    }
    let text = fault.to_string();
    assert!(text.contains("of CPU in") && text.contains("between calls (policy allows"), "{text}");
    assert_eq!(call(&ext, "resources_ping", &mut []).ok(), Some(42), "the extension serves the next call");
    assert_ne!(ext.pid(), Some(burner), "a new incarnation serves it");
}

#[test]
fn with_the_check_off_a_burning_thread_is_no_fault_of_cpu_between_calls() {
    let (_sup, ext, events) = load("idle_cpu_ms = 0\n");
    assert_eq!(call(&ext, "resources_burn", &mut []).ok(), Some(0));
    // Windows of the check and heartbeats (every 100 ms) later, the domain is the same and nothing was reported.
    let pid = ext.pid();
    for _ in 0..3 {
        let _ = events.recv_timeout(window_and_more());
    }
    assert!(faults(&events).is_empty(), "a fault with the check off");
    assert_eq!(call(&ext, "resources_ping", &mut []).ok(), Some(42));
    assert_eq!(ext.pid(), pid, "the same incarnation");
}

/// The time between calls over which the check adds CPU up, and a second more.
fn window_and_more() -> Duration {
    Duration::from_secs(2)
}

/// The parent of process `pid` (field 4 of its stat line).
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read the stat line");
    let rest = &stat[stat.rfind(')').expect("a stat line") + 1..];
    rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("a parent")
}

fn cgroup_of(pid: i32) -> String {
    format!("/proc/{pid}/cgroup")
}

/// The directories of the ward cgroups process `pid` is in, from its /proc entry and this process's mounts.
fn cgroup_dirs(pid: i32) -> Vec<PathBuf> {
    let groups = std::fs::read_to_string(cgroup_of(pid)).expect("read /proc/PID/cgroup");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let mut dirs = Vec::new();
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if !path.contains("/ward-") {
            continue;
        }
        let mount = mounts.lines().find_map(|m| {
            let (left, right) = m.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let fits = if controllers.is_empty() {
                right.first() == Some(&"cgroup2")
            } else {
                right.first() == Some(&"cgroup")
                    && controllers.split(',').all(|c| right.get(2).is_some_and(|o| o.split(',').any(|x| x == c)))
            };
            fits.then(|| (left[3].to_string(), PathBuf::from(left[4])))
        });
        if let Some((root, point)) = mount {
            let rest = if root == "/" { path } else { path.strip_prefix(root.as_str()).unwrap_or(path) };
            dirs.push(point.join(rest.trim_start_matches('/')));
        }
    }
    dirs.sort();
    dirs.dedup();
    dirs
}
