//! Calls from a real-time thread (`Function::call_realtime`): a fault fails the call at once, without a retry, and
//! the domain is recovered on a thread of its own, its state replayed; a call still running at the function's
//! learned deadline without the policy's floor (never below one period) is late: its caller gets it back then, and
//! it is a hang only at the function's normal deadline.

mod common;

use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::*;
use ward::policy::ExtensionPolicy;
use ward::{Arg, Event, FaultKind, Function, Isolation, RetType};

fn faulty() -> (ward::Supervisor, ward::Extension, Receiver<Event>) {
    let policy = "[extension.faulty]\nmax_restarts = 1000\nrestart_period_s = 3600\nbackoff_initial_ms = 0.001\n\
                  backoff_max_ms = 0.001\n[extension.faulty.function.faulty_counter_add]\nstate = true\n";
    faulty_with(Isolation::Process, policy)
}

/// Wait for the domain's next `Recovered` event (a generous bound, not a timing claim).
fn recovered(events: &Receiver<Event>) {
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        if let Ok(Event::Recovered { .. }) = events.recv_timeout(Duration::from_secs(1)) {
            return;
        }
    }
    panic!("no recovery within two minutes");
}

fn compute_rt(f: &Function, x: i64, period: Duration) -> Result<i64, ward::Error> {
    f.call_realtime(&mut [Arg::I64(x)], RetType::I64, period).map(|v| v.as_i64().unwrap())
}

/// Call compute from the real-time thread until the domain is no longer being recovered (the recovery event comes
/// a moment before the recovery thread lets go of the domain).
fn compute_when_back(f: &Function, x: i64, period: Duration) -> Result<i64, ward::Error> {
    loop {
        match compute_rt(f, x, period) {
            Err(ward::Error::Recovering { .. } | ward::Error::Busy { .. }) => std::thread::yield_now(),
            other => return other,
        }
    }
}

#[test]
fn a_crash_fails_the_real_time_call_at_once_and_the_domain_comes_back_with_its_state() {
    let (_sup, ext, events) = faulty();
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(12)]), 12);
    let compute = ext.function("faulty_compute").unwrap();
    let period = Duration::from_millis(5);
    assert_eq!(compute_rt(&compute, 3, period).unwrap(), 10);
    ext.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
    // A normal call would have been recovered and retried here, and returned 37: a real-time one is not retried.
    let e = compute_rt(&compute, 6, period).unwrap_err();
    assert!(matches!(&e, ward::Error::Fault(f) if matches!(f.kind, FaultKind::Signal { .. })), "{e}");
    recovered(&events);
    // Back, with the state its shadow log replays.
    assert_eq!(compute_when_back(&compute, 6, period).unwrap(), 37);
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 12);
    assert_eq!(ext.stats().restarts, 1);
}

#[test]
fn calls_made_while_the_domain_is_recovered_apart_fail_at_once_with_recovering() {
    let (_sup, ext, events) = faulty();
    let compute = ext.function("faulty_compute").unwrap();
    let period = Duration::from_millis(5);
    ext.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
    assert!(compute_rt(&compute, 1, period).is_err());
    // Until the recovery is done, each call is either refused at once (naming the domain) or, once it is done, made.
    let result = loop {
        match compute_rt(&compute, 2, period) {
            Err(ward::Error::Recovering { domain }) => {
                assert_eq!(domain, "faulty");
                std::thread::yield_now();
            }
            other => break other,
        }
    };
    assert_eq!(result.unwrap(), 5);
    recovered(&events);
}

#[test]
fn a_real_time_hang_is_late_at_its_real_time_deadline_and_a_fault_only_at_its_normal_one() {
    let (_sup, ext, events) = faulty();
    let compute = ext.function("faulty_compute").unwrap();
    let period = Duration::from_millis(50);
    for i in 0..40 {
        assert_eq!(compute_rt(&compute, i, period).unwrap(), i * i + 1);
    }
    ext.call("faulty_arm", &mut [Arg::I64(5), Arg::I64(0)], RetType::Void).unwrap();
    // The caller gets the call back at its real-time deadline, late: no fault yet, the call goes on in the domain.
    let e = compute_rt(&compute, 6, period).unwrap_err();
    let ward::Error::Late { deadline, call, .. } = e else { panic!("not late: {e}") };
    assert_eq!(call, "faulty_compute");
    // Calls of microseconds: the deadline is the period (more only if two of the 40 calls were kept off the
    // processor for over 12 ms), far below the floor a normal call's learned deadline keeps.
    assert!(deadline >= period, "{deadline:?}");
    assert!(deadline < ExtensionPolicy::default().deadline_floor, "{deadline:?}");
    // It never returns: at its normal deadline (the floor, for calls of microseconds) it is a hang, recovered.
    let until = Instant::now() + Duration::from_secs(120);
    let fault = loop {
        assert!(Instant::now() < until, "no fault within two minutes");
        if let Ok(Event::Fault { fault }) = events.recv_timeout(Duration::from_secs(1)) {
            break fault;
        }
    };
    let FaultKind::Timeout { deadline: normal } = fault.kind else { panic!("not a hang: {fault}") };
    assert!(normal >= ExtensionPolicy::default().deadline_floor, "{normal:?}");
    assert_eq!(fault.incarnation, 1);
    recovered(&events);
    assert_eq!(compute_when_back(&compute, 6, period).unwrap(), 37);
    assert_eq!(ext.stats().restarts, 1);
}

#[test]
fn while_a_real_time_call_runs_late_real_time_calls_fail_at_once_with_busy() {
    // A normal deadline of seconds: the calls below surely come while the late call is still waited for.
    let policy = "[extension.faulty]\nmax_restarts = 1000\nrestart_period_s = 3600\nbackoff_initial_ms = 0.001\n\
                  backoff_max_ms = 0.001\ndeadline_floor_ms = 5000\n";
    let (_sup, ext, events) = faulty_with(Isolation::Process, policy);
    let compute = ext.function("faulty_compute").unwrap();
    let period = Duration::from_millis(50);
    for i in 0..40 {
        compute_rt(&compute, i, period).unwrap();
    }
    ext.call("faulty_arm", &mut [Arg::I64(5), Arg::I64(0)], RetType::Void).unwrap();
    assert!(matches!(compute_rt(&compute, 6, period), Err(ward::Error::Late { .. })));
    // Until the late call is a fault (it never returns), each call is refused at once, naming the domain; then the
    // recovery's and finally the recovered domain's answers come.
    let mut busy = 0u64;
    let result = loop {
        match compute_rt(&compute, 2, period) {
            Err(ward::Error::Busy { domain }) => {
                assert_eq!(domain, "faulty");
                busy += 1;
                std::thread::yield_now();
            }
            Err(ward::Error::Recovering { .. }) => std::thread::yield_now(),
            other => break other,
        }
    };
    assert_eq!(result.unwrap(), 5);
    assert!(busy > 0, "no call found the late one running");
    recovered(&events);
}
