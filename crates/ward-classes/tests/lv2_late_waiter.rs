//! A domain waits for its late real-time calls on one thread of its own, started at its first and kept: not a thread
//! per late call (a plugin late at every block would start one per block). A test file of its own: the threads it
//! counts are the process's, and another test's domain would have one too.

use std::io::Write as _;

mod common;
mod gated;

use gated::Gated;

/// The process's threads that wait for late calls, by id.
fn late_waiters() -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir("/proc/self/task")
        .expect("the process's threads")
        .filter_map(|task| {
            let task = task.ok()?;
            let name = std::fs::read_to_string(task.path().join("comm")).ok()?;
            (name.trim_end() == "ward-late").then(|| task.file_name().to_str()?.parse().ok())?
        })
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn one_thread_waits_for_every_late_block_of_a_domain() {
    // A normal deadline of a minute: each late block returns long before it.
    let policy = "[defaults]\ndeadline_floor_ms = 60000\ndeadline_ceiling_ms = 60000\nhistory_replay_ms = 600000\n";
    let g = Gated::new("waiter", policy);
    g.run_up_to_the_gate();
    assert_eq!(late_waiters(), Vec::<u64>::new(), "a waiter before any block was late");
    let mut waiters = Vec::new();
    for round in 0..3u8 {
        let v = 100.0 * f32::from(round + 1);
        g.gated_block(v);
        // Opening the FIFO for writing waits until the plugin has it open for reading.
        std::fs::OpenOptions::new().write(true).open(&g.fifo).unwrap().write_all(&[1]).unwrap();
        // A block runs only once the late one is over: its waiter is done with it by then.
        g.block_when_back(v + 1.0, |reason| reason.contains("still running a late real-time call"));
        waiters.push(late_waiters());
    }
    let seen = g.seen.borrow().clone();
    assert!(seen.iter().filter(|e| matches!(e, ward::Event::Late { .. })).count() >= 3, "{seen:?}");
    assert!(!seen.iter().any(|e| matches!(e, ward::Event::Fault { .. })), "{seen:?}");
    // The same one thread after each late block, still there for the next.
    assert_eq!(waiters[0].len(), 1, "{waiters:?}");
    assert!(waiters.iter().all(|w| *w == waiters[0]), "{waiters:?}");
}
