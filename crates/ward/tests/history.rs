//! History: data calls (`history = true`) kept with their inputs and replayed in order after a restart, so the new
//! incarnation is in the state the old one had, not only its configuration. On by default (`history_mb` and
//! `history_replay_ms` have non-zero defaults) for functions marked history; past either bound the oldest data calls
//! are dropped and a restart replays the most recent window.

mod common;

use std::time::Duration;

use common::*;
use ward::{Arg, Isolation};

const HISTORY: &str = "[extension.faulty.function.faulty_counter_add]\nhistory = true\n";

/// The faulty policy with `faulty_counter_add` a data call (not a state call) and `keys` in its extension table.
fn policy(keys: &str) -> String {
    let base = FAULTY_POLICY.replace("[extension.faulty.function.faulty_counter_add]\nstate = true\n", HISTORY);
    base.replacen("[extension.faulty]\n", &format!("[extension.faulty]\n{keys}\n"), 1)
}

/// Kill the domain from outside, as a crash between calls would.
fn kill_domain(ext: &ward::Extension) {
    let pid = ext.pid().expect("a process domain");
    // SAFETY: our own domain process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

#[test]
fn by_default_a_restarted_extension_gets_its_data_calls_replayed_in_order() {
    let (_sup, ext, events) = faulty_with(Isolation::Process, &policy(""));
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(7)]), 12);
    kill_domain(&ext);
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 12, "both additions replayed");
    assert_eq!(faults(&events).len(), 1);
    assert_eq!(ext.stats().shadow_log, 2);
}

#[test]
fn a_function_not_marked_history_is_not_kept_by_default() {
    // FAULTY_POLICY marks faulty_counter_add a state call; here it is neither.
    let text = FAULTY_POLICY.replace("[extension.faulty.function.faulty_counter_add]\nstate = true\n", "");
    let (_sup, ext, _events) = faulty_with(Isolation::Process, &text);
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    assert_eq!(ext.stats().shadow_log, 0);
    kill_domain(&ext);
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 0, "nothing replayed");
}

#[test]
fn with_history_mb_zero_data_calls_are_not_kept() {
    for keys in ["history_mb = 0", "history_replay_ms = 0"] {
        let (_sup, ext, _events) = faulty_with(Isolation::Process, &policy(keys));
        assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
        kill_domain(&ext);
        assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 0, "{keys}: nothing replayed");
        assert_eq!(ext.stats().shadow_log, 0, "{keys}");
    }
}

#[test]
fn past_history_mb_the_restart_replays_the_most_recent_calls_that_fit() {
    // The replay bound far away: only the memory bound counts here.
    let (_sup, ext, _events) = faulty_with(Isolation::Process, &policy("history_mb = 1\nhistory_replay_ms = 600000"));
    // Each call is charged 64 bytes: 16 384 fill 1 MiB; the 100 after them push out the oldest 100.
    let fit = (1 << 20) / 64;
    for n in 1..=fit + 100 {
        // The latest calls add 2: a window of them is told apart from the oldest.
        let add = if n > 100 { 2 } else { 1 };
        i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(add)]);
    }
    let stats = ext.stats();
    assert_eq!(stats.shadow_log as i64, fit);
    assert_eq!(stats.history_bytes, 1 << 20);
    kill_domain(&ext);
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 2 * fit, "the latest 16 384 additions, of 2 each");
}

#[test]
fn past_history_replay_ms_the_restart_replays_the_most_recent_calls_that_replay_within_it() {
    let (_sup, ext, _events) = faulty_with(Isolation::Process, &policy("history_replay_ms = 20"));
    // Each call is charged at least a replayed call's round trip (tens of microseconds), so 20 ms holds at most
    // about five hundred of them, however fast the machine.
    let calls = 1000;
    for _ in 0..calls {
        i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(1)]);
    }
    let stats = ext.stats();
    let kept = stats.shadow_log as i64;
    assert!((1..calls).contains(&kept), "a window of the calls is kept: {kept} of {calls}");
    assert!(stats.history_replay <= Duration::from_millis(20), "{:?}", stats.history_replay);
    kill_domain(&ext);
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), kept, "exactly the kept calls replayed");
}
