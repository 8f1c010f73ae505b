//! Recovery behaviour: detection of deaths from outside, heartbeats, restart limits and disabling, faults deep in
//! nested calls, groups, restarting without a zygote, and what policy says the call in flight gets.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::*;
use ward::{
    Arg, Event, Extension, FaultKind, Isolation, Policy, RestartVia, RetType, Signature, Supervisor, ValType, Value,
};

/// Generous bound for events that a healthy machine delivers in milliseconds.
const EVENT_BOUND: Duration = Duration::from_secs(60);

#[test]
fn a_domain_killed_from_outside_is_recovered_at_the_next_call() {
    let (_sup, ext, events) = faulty(Isolation::Process, "");
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(9)]), 9);
    let pid = ext.pid().unwrap();
    // SAFETY: our own domain process.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 9);
    let f = faults(&events);
    assert_eq!(f.len(), 1);
    assert!(matches!(f[0].kind, FaultKind::Signal { signo: libc::SIGTERM, .. }), "{f:?}");
    assert_ne!(ext.pid(), Some(pid));
}

#[test]
fn a_stopped_domain_misses_its_heartbeat_and_is_restarted() {
    let (_sup, ext, events) = faulty(Isolation::Process, "heartbeat_ms = 100");
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(4)]), 4);
    let pid = ext.pid().unwrap();
    // SAFETY: our own domain process; SIGSTOP freezes it without killing it.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let fault = loop {
        match events.recv_timeout(EVENT_BOUND).expect("a heartbeat fault within the bound") {
            Event::Fault { fault } => break fault,
            _ => continue,
        }
    };
    assert!(matches!(fault.kind, FaultKind::HeartbeatMissed { .. }), "{fault:?}");
    loop {
        if let Event::Recovered { .. } = events.recv_timeout(EVENT_BOUND).expect("recovery within the bound") {
            break;
        }
    }
    assert_ne!(ext.pid(), Some(pid));
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 4);
}

#[test]
fn past_the_restart_limit_the_extension_is_disabled_and_fails_fast() {
    let policy = r#"
[extension.faulty]
max_restarts = 3
restart_period_s = 3600
backoff_initial_ms = 0.001
max_retries = 1
max_failures_in_row = 0
"#;
    let (_sup, ext, events) = faulty_with(Isolation::Process, policy);
    // faulty_null_deref faults every time: each call is one fault plus one retry.
    let e1 = ext.call("faulty_null_deref", &mut [], RetType::Void).unwrap_err();
    assert!(matches!(e1, ward::Error::Fault(_)), "{e1}");
    let e2 = ext.call("faulty_null_deref", &mut [], RetType::Void).unwrap_err();
    assert!(matches!(e2, ward::Error::Disabled { .. }), "{e2}");
    let e3 = ext.call("faulty_counter_get", &mut [], RetType::I64).unwrap_err();
    assert!(matches!(e3, ward::Error::Disabled { .. }), "{e3}");
    assert!(e3.to_string().contains("disabled"));
    assert!(ext.stats().disabled);
    assert_eq!(ext.stats().restarts, 3);
    assert!(events.try_iter().any(|e| matches!(e, Event::Disabled { .. })));
}

#[test]
fn on_fault_fail_returns_the_fault_and_keeps_the_domain_running() {
    let (_sup, ext, _events) = faulty(Isolation::Process, "on_fault = \"fail\"");
    ext.call("faulty_arm", &mut [Arg::I64(3), Arg::I64(0)], RetType::Void).unwrap();
    let e = ext.call("faulty_compute", &mut [Arg::I64(2)], RetType::I64).unwrap_err();
    let fault = e.fault().expect("a fault");
    assert!(matches!(fault.kind, FaultKind::Signal { signo: libc::SIGABRT, .. }));
    assert_eq!(i64_call(&ext, "faulty_compute", &mut [Arg::I64(2)]), 5);
}

#[test]
fn a_function_deadline_overrides_the_extension_deadline() {
    let policy = format!(
        "{FAULTY_POLICY}\n[extension.faulty.function.faulty_infinite_loop]\ndeadline_ms = 200\nretryable = false\n"
    );
    let (_sup, ext, _events) = faulty_with(Isolation::Process, &policy);
    let e = ext.call("faulty_infinite_loop", &mut [], RetType::Void).unwrap_err();
    assert!(
        matches!(e.fault().map(|f| &f.kind), Some(FaultKind::Timeout { deadline }) if deadline.as_millis() == 200),
        "{e}"
    );
    assert_eq!(i64_call(&ext, "faulty_compute", &mut [Arg::I64(1)]), 2);
}

#[test]
fn restarting_without_a_zygote_spawns_a_fresh_domain() {
    let (_sup, ext, events) = faulty(Isolation::Process, "zygote = false");
    assert_eq!(arm_and_compute(&ext, 1, 0).as_i64(), Some(37));
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 12);
    let via: Vec<RestartVia> =
        events.try_iter().filter_map(|e| if let Event::Recovered { via, .. } = e { Some(via) } else { None }).collect();
    assert_eq!(via, vec![RestartVia::Spawn]);
}

#[test]
fn a_fault_at_depth_three_of_nested_calls_is_contained() {
    // host -> well_nest(3) -> cb(3) -> well_nest(2) -> cb(2) -> well_nest(1) -> cb(1) -> faulty... is another
    // domain; here the fault is in the same domain: cb(1) calls faulty_null_deref through a group peer.
    let policy = r#"
[extension.well]
group = "pair"
max_retries = 0
[extension.well.function.counter_add]
state = true
[extension.faulty]
group = "pair"
[group.pair]
max_restarts = 100
backoff_initial_ms = 0.001
# Retries call faulty_null_deref again and again: only the restart limit may disable here.
max_failures_in_row = 0
"#;
    let sup = Supervisor::new(Policy::from_toml_str(policy, "test").unwrap());
    let events = sup.subscribe();
    let well = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    let faulty = sup.load_with(builtin("faulty"), Some(Isolation::Process)).unwrap();
    assert_eq!(well.pid(), faulty.pid(), "one group, one domain process");
    assert_eq!(i64_call(&well, "counter_add", &mut [Arg::I64(3)]), 3);
    let slot: Arc<OnceLock<(Extension, Extension, ward::Callback)>> = Arc::new(OnceLock::new());
    let inner = slot.clone();
    let cb = sup
        .register_callback(Signature::new(&[ValType::I64], RetType::I64), move |a| {
            let d = a[0].as_i64().unwrap_or(0);
            let (well, faulty, cb) = inner.get().expect("set");
            if d == 1 {
                // Depth 3 from the host: the domain crashes here.
                return match faulty.call("faulty_null_deref", &mut [], RetType::Void) {
                    Ok(_) => Value::I64(1000),
                    Err(_) => Value::I64(-1000),
                };
            }
            well.call("well_nest", &mut [Arg::Callback(cb), Arg::I64(d - 1)], RetType::I64).unwrap_or(Value::I64(-1))
        })
        .unwrap();
    let _ = slot.set((well.clone(), faulty.clone(), cb.clone()));
    let r = well.call("well_nest", &mut [Arg::Callback(&cb), Arg::I64(3)], RetType::I64);
    // The outer calls were in the incarnation that died: they fail cleanly (no retries in this policy).
    assert!(r.is_err(), "{r:?}");
    // The host is fine and so is the domain: state replayed, calls work again.
    assert_eq!(i64_call(&well, "counter_add", &mut [Arg::I64(1)]), 4);
    assert_eq!(i64_call(&faulty, "faulty_compute", &mut [Arg::I64(4)]), 17);
    let f = faults(&events);
    assert!(f.iter().any(|f| matches!(f.kind, FaultKind::Signal { signo: libc::SIGSEGV, .. })), "{f:?}");
}

#[test]
fn a_group_shares_one_domain_and_is_restarted_as_a_whole() {
    let policy = r#"
[extension.well]
group = "g"
[extension.well.function.counter_add]
state = true
[extension.faulty]
group = "g"
[extension.faulty.function.faulty_counter_add]
state = true
"#;
    let sup = Supervisor::new(Policy::from_toml_str(policy, "test").unwrap());
    let well = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    assert_eq!(i64_call(&well, "counter_add", &mut [Arg::I64(20)]), 20);
    let faulty = sup.load_with(builtin("faulty"), Some(Isolation::Process)).unwrap();
    assert_eq!(well.domain(), "g");
    assert_eq!(well.pid(), faulty.pid());
    // The member joined the running process (groups.rs has the details).
    assert_eq!(i64_call(&well, "counter_get", &mut []), 20);
    assert_eq!(arm_and_compute(&faulty, 1, 0).as_i64(), Some(37));
    assert_eq!(i64_call(&well, "counter_get", &mut []), 20, "the peer's state is replayed too");
    assert_eq!(i64_call(&faulty, "faulty_counter_get", &mut []), 12);
}

#[test]
fn an_unloadable_extension_is_a_clear_load_error() {
    // A shared object that needs a library that does not exist: dlopen fails inside the domain.
    let sup = Supervisor::new(Policy::default());
    let so = library_with_a_missing_dependency(&scratch_dir("unloadable"));
    let e = sup.load_with(&so, Some(Isolation::Process)).unwrap_err();
    assert!(matches!(e, ward::Error::Load { .. }), "{e}");
    assert!(e.to_string().contains("libward_missing_dependency"), "{e}");
}

#[test]
fn writing_past_a_lent_buffer_hits_its_guard_page_and_the_host_buffer_is_untouched() {
    let sup = Supervisor::new(Policy::default());
    let events = sup.subscribe();
    let well = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    let input = vec![7u8; 8192];
    let mut out = vec![0u8; 4096];
    // well_copy copies `len` bytes: 8192 into a 4096-byte output buffer overruns it.
    let r = well.call("well_copy", &mut [Arg::In(&input), Arg::Out(&mut out), Arg::U64(8192)], RetType::Void);
    let e = r.unwrap_err();
    assert!(matches!(e.fault().map(|f| &f.kind), Some(FaultKind::Signal { signo: libc::SIGSEGV, .. })), "{e}");
    assert!(out.iter().all(|&b| b == 0), "outputs are copied back only when the call succeeds");
    assert!(!faults(&events).is_empty());
    // The domain is back and correct.
    ward_sum_is_correct(&well);
}

fn ward_sum_is_correct(well: &Extension) {
    assert_eq!(i64_call(well, "well_sum", &mut [Arg::In(&[1, 2, 3]), Arg::U64(3)]), 6);
}

#[test]
fn another_host_thread_waiting_on_a_failing_domain_gets_correct_results() {
    let (_sup, ext, _events) = faulty(Isolation::Process, "");
    let worker = {
        let ext = ext.clone();
        std::thread::spawn(move || {
            for i in 0..2000i64 {
                let v = ext.call("faulty_compute", &mut [Arg::I64(i % 100)], RetType::I64);
                // Either this call was armed (then it faulted and was retried) or not: correct both ways.
                assert_eq!(v.unwrap().as_i64(), Some((i % 100) * (i % 100) + 1));
            }
        })
    };
    for _ in 0..20 {
        // Whichever thread's compute comes next takes the fault.
        ext.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
        assert_eq!(i64_call(&ext, "faulty_compute", &mut [Arg::I64(6)]), 37);
    }
    worker.join().unwrap();
    assert!(ext.stats().restarts >= 1);
}

#[test]
fn an_extension_that_keeps_calling_back_still_runs_out_of_time() {
    // well_map_sum(f, n) calls f n times: with an enormous n it loops through the host forever. The deadline bounds
    // the domain's own time, so the host's time in the callbacks does not keep it alive, however the host waits
    // (handing over, the host yields its processor to the domain and may find the next callback at every turn).
    for wait in ["adaptive", "sleep", "poll"] {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let policy = format!(
                "[extension.well]\nwait = \"{wait}\"\n\
                 [extension.well.function.well_map_sum]\ndeadline_ms = 300\nretryable = false\n"
            );
            let sup = Supervisor::new(Policy::from_toml_str(&policy, "test").unwrap());
            let well = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
            let identity = sup.register_callback(Signature::new(&[ValType::I64], RetType::I64), |a| a[0]).unwrap();
            let e = well
                .call("well_map_sum", &mut [Arg::Callback(&identity), Arg::I64(i64::MAX)], RetType::I64)
                .unwrap_err();
            assert!(matches!(e.fault().map(|f| &f.kind), Some(FaultKind::Timeout { .. })), "wait {wait}: {e}");
            ward_sum_is_correct(&well);
            let _ = done.send(());
        });
        // Generous: the deadline is 300 ms, but a loaded machine may be slow to notice and restart.
        match finished.recv_timeout(std::time::Duration::from_secs(120)) {
            Ok(()) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("wait {wait}: the endless callbacks never timed out")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("wait {wait}: the calling thread failed"),
        }
    }
}
