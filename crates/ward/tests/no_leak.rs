//! 10,000 crash-restart cycles leave the host's open descriptors and resident memory flat.
//!
//! Alone in its own test binary so nothing else opens descriptors or allocates meanwhile.

mod common;

use common::*;
use ward::{Arg, Isolation, RetType};

const CYCLES: usize = 10_000;
/// Warm-up cycles before the baseline: allocator arenas, event queues and caches reach their steady size.
const WARM_UP: usize = 500;
/// Resident growth allowed over the measured cycles (allocator noise, not per-cycle leaks: a leak of even 1 KiB
/// per cycle would be 10 MiB).
const RSS_SLACK: u64 = 4 * 1024 * 1024;

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

fn crash_and_recover(ext: &ward::Extension, cycle: usize) {
    ext.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
    let v = ext.call("faulty_compute", &mut [Arg::I64(cycle as i64 % 1000)], RetType::I64).unwrap();
    let x = (cycle % 1000) as i64;
    assert_eq!(v.as_i64(), Some(x * x + 1));
}

#[test]
fn ten_thousand_crash_restart_cycles_leak_nothing() {
    let policy = FAULTY_POLICY.replace("max_restarts = 1000", "max_restarts = 1000000");
    let (_sup, ext, _events) = faulty_with(Isolation::Process, &policy);
    // A replayed state call each cycle, so the shadow log and the descriptor records are exercised.
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(12)]), 12);
    for cycle in 0..WARM_UP {
        crash_and_recover(&ext, cycle);
    }
    let fds = open_descriptors();
    let rss = resident_bytes();
    for cycle in WARM_UP..CYCLES {
        crash_and_recover(&ext, cycle);
    }
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 12, "state survived every restart");
    let stats = ext.stats();
    assert_eq!(stats.restarts, CYCLES as u64);
    assert_eq!(stats.tracked, 1, "only the live incarnation's descriptor is tracked: {stats:?}");
    assert_eq!(open_descriptors(), fds, "host descriptors after {CYCLES} restarts");
    let grown = resident_bytes().saturating_sub(rss);
    assert!(grown <= RSS_SLACK, "resident memory grew by {grown} bytes over {} restarts", CYCLES - WARM_UP);
}
