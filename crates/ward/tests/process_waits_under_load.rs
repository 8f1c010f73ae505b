//! On a machine whose other processors are all busy with another program, a process domain and its host hand the
//! processor over (or sleep) rather than spin for each other, whatever the wait mode: the grouped policy's long
//! spin (`spin = 100000`, adaptive) and `wait = "poll"` alike. Not timed: the spin turns and sleeps each side
//! counts in the shared region (`ward_xpc::layout::WaitStats`) are compared with the calls made. Between calls the
//! host works a while, as a real one does (sox between two plugins' blocks): a domain that spins for the next
//! request spins through that work.

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Stdio};

use common::*;
use ward::{Arg, Extension, Isolation, Policy, RetType, Supervisor};
use ward_xpc::layout::{wait_stats, WaitStats, REP_CTRL_OFF, REQ_CTRL_OFF, WAIT_FLAG_NO_RUNQUEUE};
use ward_xpc::{Protection, SharedMemory};

/// Calls made under load, per wait mode.
const CALLS: u64 = 5000;
/// Work the host does between two calls (turns of a xorshift generator: a few hundred microseconds).
const HOST_WORK: u32 = 200_000;
/// Spin turns per call, on average, that the waits of either side may take under load. Stopping at its first look
/// a wait takes `ward_xpc::ring::FIRST_LOOK` (64) turns at most; a domain that spins through the host's work, as
/// before, took ten to a hundred times this (see DECISIONS.md).
const MAX_TURNS_PER_CALL: u64 = 640;

/// The host's work between two calls.
fn host_work(seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..HOST_WORK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

/// Processes of busy work that keep the other processors busy, killed when dropped (a panic included).
struct Busy(Vec<Child>);

impl Busy {
    fn start(n: usize) -> Busy {
        let mut busy = Busy(Vec::new());
        for _ in 0..n {
            let child = Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("start a busy process");
            busy.0.push(child);
        }
        busy
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn online_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("read the online processors");
    text.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<usize>().expect("a processor") - a.parse::<usize>().expect("a processor") + 1,
            None => 1,
        })
        .sum()
}

/// The host's mapping of the region it shares with the domain process `pid`: the `ward-xpc` memfd among this
/// process's descriptors that is the one the domain maps (the same inode).
fn region_of(pid: i32) -> SharedMemory {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read the domain's maps (as root)");
    let inode: u64 = maps
        .lines()
        .find(|l| l.contains("/memfd:ward-xpc"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|i| i.parse().ok())
        .expect("the domain maps its region");
    for entry in std::fs::read_dir("/proc/self/fd").expect("list this process's descriptors").flatten() {
        let path = entry.path();
        let is_region = std::fs::read_link(&path).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:ward-xpc"));
        if is_region && std::fs::metadata(&path).is_ok_and(|m| m.ino() == inode) {
            let file = std::fs::File::open(&path).expect("reopen the region");
            return SharedMemory::from_fd(file.into(), Protection::ReadOnly).expect("map the region");
        }
    }
    panic!("no descriptor of this process is the region domain {pid} maps");
}

fn add(ext: &Extension, d: i64) -> i64 {
    match ext.call("faulty_counter_add", &mut [Arg::I64(d)], RetType::I64) {
        Ok(ward::Value::I64(v)) => v,
        other => panic!("faulty_counter_add: {other:?}"),
    }
}

/// What the two sides' waits did over `CALLS` calls of a domain waiting as `policy` says, and the processors the
/// domain may run on at the end. The domain measured is the host's second, started from the spare its template made
/// after the first, as every later domain of a host is: a spare opens the run queue before its domain's setup
/// comes, and that setup must not take the descriptor from under it.
fn waits_over_calls(policy: &str) -> (WaitStats, WaitStats, Vec<usize>) {
    let policy = FAULTY_POLICY.replacen("[extension.faulty]\n", &format!("[extension.faulty]\n{policy}\n"), 1);
    let sup = Supervisor::new(Policy::from_toml_str(&policy, "test policy").expect("the test's policy"));
    let _first = sup.load_with(builtin("well"), Some(Isolation::Process)).expect("the host's first domain");
    let spares_before = ward::domains_started_from_spares();
    let ext = sup.load_with(builtin("faulty"), Some(Isolation::Process)).expect("the domain measured");
    assert_eq!(ward::domains_started_from_spares(), spares_before + 1, "the domain measured took the spare");
    // The first call starts nothing more; the statistics count from the incarnation's start.
    add(&ext, 0);
    let pid = ext.pid().expect("a process domain has a process");
    let region = region_of(pid);
    let read = || {
        let domain = wait_stats(&region, REQ_CTRL_OFF).expect("the domain's statistics");
        let host = wait_stats(&region, REP_CTRL_OFF).expect("the host's statistics");
        (domain, host)
    };
    let (domain_before, host_before) = read();
    let mut work = 0;
    for i in 1..=CALLS {
        assert_eq!(add(&ext, 1), i as i64);
        work ^= host_work(i);
    }
    std::hint::black_box(work);
    assert_eq!(ext.pid(), Some(pid), "the same incarnation throughout");
    let (domain, host) = read();
    let processors = ward::placement::affinity(pid).expect("the domain's processors");
    let since = |after: WaitStats, before: WaitStats| WaitStats {
        flags: after.flags,
        spin_turns: after.spin_turns - before.spin_turns,
        sleeps: after.sleeps - before.sleeps,
        cut_short: after.cut_short - before.cut_short,
    };
    (since(domain, domain_before), since(host, host_before), processors)
}

#[test]
fn with_the_other_processors_busy_host_and_domain_hand_over_rather_than_spin() {
    let cpus = online_cpus();
    assert!(
        ward_xpc::runqueue::unavailable().is_none(),
        "this test needs the run queue (/proc/loadavg): {:?}",
        ward_xpc::runqueue::unavailable()
    );
    let _busy = Busy::start(cpus.saturating_sub(1));
    for policy in ["spin = 100000", "wait = \"poll\""] {
        let (domain, host, processors) = waits_over_calls(policy);
        eprintln!("{policy}: {CALLS} calls on {cpus} processors; domain {domain:?}; host {host:?}");
        for (side, stats) in [("domain", domain), ("host", host)] {
            assert_eq!(stats.flags & WAIT_FLAG_NO_RUNQUEUE, 0, "{policy}: the {side} reads the run queue");
            assert!(
                stats.spin_turns <= CALLS * MAX_TURNS_PER_CALL,
                "{policy}: the {side} spun {} turns for {CALLS} calls ({} a call; at most {MAX_TURNS_PER_CALL})",
                stats.spin_turns,
                stats.spin_turns / CALLS
            );
        }
        // That the statistics are this domain's, live: each request came after the host's work, and found the
        // domain asleep.
        assert!(domain.sleeps >= CALLS / 10, "{policy}: the domain slept {} times in {CALLS} calls", domain.sleeps);
        if policy.starts_with("spin") {
            // An adaptive wait whose waits are cut short hands over: the domain runs on its caller's processor.
            assert_eq!(processors.len(), 1, "{policy}: the domain may run on {processors:?}: it was not handed over");
        }
    }
}
