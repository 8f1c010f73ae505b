//! Deadlines that learn, and giving up on a call that keeps failing whatever the clock says: with the default policy
//! (no `deadline_ms`), each function's deadline follows what its calls took; `deadline_ms` fixes it; a call that
//! fails again after each recovery (before 64 calls of it succeeded), `max_failures_in_row` times, disables the
//! extension at once.

mod common;

use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::*;
use ward::events::Disablement;
use ward::policy::ExtensionPolicy;
use ward::{Arg, Event, FaultKind, Isolation, RetType};

/// The faulty extension with deadlines learned (no `deadline_ms`), restart limits far away, and `extra` keys.
fn learning(extra: &str) -> (ward::Supervisor, ward::Extension, Receiver<Event>) {
    let policy = format!(
        "[extension.faulty]\nmax_restarts = 1000\nrestart_period_s = 3600\nbackoff_initial_ms = 0.001\n\
         backoff_max_ms = 0.001\n{extra}\n[extension.faulty.function.faulty_counter_add]\nstate = true\n"
    );
    faulty_with(Isolation::Process, &policy)
}

/// Enough fast calls of faulty_compute for its deadline to be learned.
fn teach_compute(ext: &ward::Extension) {
    for i in 0..40 {
        assert_eq!(i64_call(ext, "faulty_compute", &mut [Arg::I64(i)]), i * i + 1);
    }
}

/// Arm a hang for the next compute and call it: the hung call is ended at its deadline, the domain recovered and
/// the call retried (unarmed, it returns). The hang's fault.
fn hang_once(ext: &ward::Extension, events: &Receiver<Event>) -> ward::Fault {
    ext.call("faulty_arm", &mut [Arg::I64(5), Arg::I64(0)], RetType::Void).unwrap();
    assert_eq!(i64_call(ext, "faulty_compute", &mut [Arg::I64(6)]), 37);
    let f = faults(events);
    assert_eq!(f.len(), 1, "{f:?}");
    f.into_iter().next().unwrap()
}

#[test]
fn a_learned_deadline_catches_a_hang_far_sooner_than_the_default_deadline() {
    let (_sup, ext, events) = learning("");
    teach_compute(&ext);
    let fault = hang_once(&ext, &events);
    let defaults = ExtensionPolicy::default();
    // Calls of microseconds: the learned deadline is the floor, fifty times below the fixed default (more only if
    // two of the calls were kept off the processor for over 50 ms on a loaded machine).
    let FaultKind::Timeout { deadline } = fault.kind else { panic!("not a hang: {fault}") };
    assert!(deadline >= defaults.deadline_floor, "{fault}");
    assert!(deadline * 5 <= defaults.deadline, "far below deadline_ms's default: {fault}");
    assert_eq!(fault.call.as_deref(), Some("faulty_compute"));
}

#[test]
fn an_explicit_deadline_ms_overrides_the_learned_deadline() {
    let (_sup, ext, events) = learning("deadline_ms = 1500");
    teach_compute(&ext);
    let fault = hang_once(&ext, &events);
    assert_eq!(fault.kind, FaultKind::Timeout { deadline: Duration::from_millis(1500) }, "{fault}");
}

#[test]
fn a_slow_first_call_is_no_false_alarm_and_a_call_that_outgrows_its_deadline_relearns_it() {
    let (_sup, ext, events) = learning("");
    // Five times the floor, before anything is learned: judged by the first deadline (here the ceiling).
    assert_eq!(i64_call(&ext, "faulty_slow", &mut [Arg::I64(1000)]), 1000);
    assert_eq!(faults(&events), [], "a slow first call is no fault");
    for _ in 0..40 {
        assert_eq!(i64_call(&ext, "faulty_slow", &mut [Arg::I64(0)]), 0);
    }
    // Learned from instant calls: the floor (200 ms). A call of 1.5 s is ended at the learned deadline, then retried
    // with the first deadline, and returns; what was learned is forgotten, so the same slow call again is no fault.
    assert_eq!(i64_call(&ext, "faulty_slow", &mut [Arg::I64(1500)]), 1500);
    let f = faults(&events);
    assert_eq!(f.len(), 1, "{f:?}");
    let FaultKind::Timeout { deadline } = f[0].kind else { panic!("not a hang: {}", f[0]) };
    assert!(deadline < Duration::from_millis(1500), "ended at the learned deadline: {}", f[0]);
    assert_eq!(i64_call(&ext, "faulty_slow", &mut [Arg::I64(1500)]), 1500);
    assert_eq!(faults(&events), [], "learning started again");
    assert!(!ext.stats().disabled);
}

/// The Disabled event among `events`, and its line.
fn disabled_event(events: &Receiver<Event>) -> (Disablement, String) {
    let disabled: Vec<Event> = events.try_iter().filter(|e| matches!(e, Event::Disabled { .. })).collect();
    assert_eq!(disabled.len(), 1, "{disabled:?}");
    let line = disabled[0].to_string();
    match disabled.into_iter().next() {
        Some(Event::Disabled { why, .. }) => (why, line),
        _ => unreachable!("filtered above"),
    }
}

#[test]
fn a_call_failing_again_after_each_recovery_disables_at_once_and_says_so() {
    let (_sup, ext, events) = learning("");
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(4)]), 4);
    // Three crashes of faulty_compute, each followed by as many successes of it as end a row: never twice in a row.
    for _ in 0..3 {
        crash_compute_then_succeed(&ext, 64);
    }
    // faulty_null_deref faults every time: the call and its retry fail, 2 in a row.
    let e = ext.call("faulty_null_deref", &mut [], RetType::Void).unwrap_err();
    assert!(matches!(e, ward::Error::Fault(_)), "{e}");
    assert!(!ext.stats().disabled, "two in a row is not three");
    // Other calls succeeding meanwhile do not end the row: only successes of the call itself do.
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 4);
    let e = ext.call("faulty_null_deref", &mut [], RetType::Void).unwrap_err();
    assert!(matches!(e, ward::Error::Disabled { .. }), "{e}");
    assert!(e.to_string().contains("disabled after faulty_null_deref failed 3 times in a row"), "{e}");
    let stats = ext.stats();
    assert!(stats.disabled);
    assert_eq!(stats.restarts, 5, "far below max_restarts: {stats:?}");
    let (why, line) = disabled_event(&events);
    assert_eq!(why, Disablement::FailedInRow { call: "faulty_null_deref".into(), times: 3 });
    assert!(line.contains("faulty: disabled after faulty_null_deref failed 3 times in a row"), "{line}");
    assert!(line.ends_with("from now on its calls fail"), "{line}");
    assert!(matches!(ext.call("faulty_counter_get", &mut [], RetType::I64), Err(ward::Error::Disabled { .. })));
}

/// One crash of faulty_compute (recovered, the retry succeeds), then `ok` successful calls of it.
fn crash_compute_then_succeed(ext: &ward::Extension, ok: i64) {
    ext.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
    assert_eq!(i64_call(ext, "faulty_compute", &mut [Arg::I64(6)]), 37);
    for i in 0..ok {
        assert_eq!(i64_call(ext, "faulty_compute", &mut [Arg::I64(i)]), i * i + 1);
    }
}

#[test]
fn a_call_failing_again_a_few_calls_after_each_recovery_disables_too() {
    // As a plugin restarted without its history that fails again ten blocks into each incarnation.
    let (_sup, ext, events) = learning("");
    crash_compute_then_succeed(&ext, 9);
    crash_compute_then_succeed(&ext, 9);
    assert!(!ext.stats().disabled);
    ext.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
    let e = ext.call("faulty_compute", &mut [Arg::I64(6)], RetType::I64).unwrap_err();
    assert!(matches!(e, ward::Error::Disabled { .. }), "{e}");
    let (why, _) = disabled_event(&events);
    assert_eq!(why, Disablement::FailedInRow { call: "faulty_compute".into(), times: 3 });
}

#[test]
fn hangs_count_like_crashes_towards_disabling() {
    // A ceiling of 300 ms: the first deadline of a function no class describes, so each hang ends there.
    let (_sup, ext, events) = learning("deadline_ceiling_ms = 300\ndeadline_floor_ms = 100");
    let e = ext.call("faulty_infinite_loop", &mut [], RetType::Void).unwrap_err();
    assert!(matches!(e.fault().map(|f| &f.kind), Some(FaultKind::Timeout { .. })), "{e}");
    let e = ext.call("faulty_infinite_loop", &mut [], RetType::Void).unwrap_err();
    assert!(matches!(e, ward::Error::Disabled { .. }), "{e}");
    let (why, line) = disabled_event(&events);
    assert_eq!(why, Disablement::FailedInRow { call: "faulty_infinite_loop".into(), times: 3 });
    assert!(line.contains("hang (no reply within 300 ms)"), "{line}");
}

#[test]
fn max_failures_in_row_zero_leaves_disabling_to_the_restart_limit() {
    let (_sup, ext, events) = learning("max_failures_in_row = 0");
    for _ in 0..3 {
        let e = ext.call("faulty_null_deref", &mut [], RetType::Void).unwrap_err();
        assert!(matches!(e, ward::Error::Fault(_)), "{e}");
    }
    assert!(!ext.stats().disabled);
    assert!(!events.try_iter().any(|e| matches!(e, Event::Disabled { .. })));
}
