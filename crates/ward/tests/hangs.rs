//! Hangs that used to escape detection: a host callback that waits for another thread's call into the same domain,
//! and a zygote that does not answer.

mod common;

use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ward::{
    Arg, Error, Event, Extension, FaultKind, Isolation, Policy, RetType, Signature, Supervisor, ValType, Value,
};

/// Safety net for calls that must return: far above any deadline here. No test waits for it unless it fails.
const SAFETY_NET: Duration = Duration::from_secs(60);

/// `f` on a thread of its own; its result, or a panic naming `what` when it does not come within the safety net.
fn returns<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(SAFETY_NET) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not return: the host hangs"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

fn busy_fault(result: &Result<Value, Error>, call: &str) {
    match result {
        Err(Error::Fault(f)) => {
            assert_eq!(f.kind, FaultKind::BusyInCallback { deadline: Duration::from_millis(500) }, "{f}");
            assert_eq!(f.domain, "well", "{f}");
            assert_eq!(f.call.as_deref(), Some(call), "{f}");
            let text = result.as_ref().map(|_| ()).unwrap_err().to_string();
            assert!(text.contains("busy in a host callback") && text.contains("domain well"), "{text}");
        }
        other => panic!("{call}: expected a busy fault, got {other:?}"),
    }
}

#[test]
fn a_callback_waiting_for_another_threads_call_into_its_domain_is_a_fault_within_the_deadline() {
    let policy = Policy::from_toml_str("[extension.well]\ndeadline_ms = 500\n", "test policy").unwrap();
    let sup = Supervisor::new(policy);
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    let add = ext.function("well_add").unwrap();
    assert_eq!(add.call(&mut [Arg::I64(1), Arg::I64(2)], RetType::I64).unwrap(), Value::I64(3));

    // The callback starts a thread that calls the same domain (a resolved function, and one not resolved yet)
    // and waits for it: the domain is busy in the call that made the callback.
    let inner: Arc<Mutex<Vec<Result<Value, Error>>>> = Arc::default();
    let seen = inner.clone();
    let (ext2, add2) = (ext.clone(), add.clone());
    let cb = sup
        .register_callback(Signature::new(&[ValType::I64], RetType::I64), move |a| {
            let (ext, add) = (ext2.clone(), add2.clone());
            let other = std::thread::spawn(move || {
                let resolved = add.call(&mut [Arg::I64(2), Arg::I64(3)], RetType::I64);
                let unresolved = ext.call("well_mul3", &mut [Arg::I64(2), Arg::I64(3), Arg::I64(7)], RetType::I64);
                vec![resolved, unresolved]
            });
            let results = other.join().expect("the other thread does not panic");
            seen.lock().unwrap().extend(results);
            Value::I64(a[0].as_i64().unwrap_or(0) * 10)
        })
        .unwrap();

    let outer_ext = ext.clone();
    let outer_cb = cb.clone();
    let outer = returns("the call whose callback waits for another thread's call", move || {
        outer_ext.call("well_nest", &mut [Arg::Callback(&outer_cb), Arg::I64(4)], RetType::I64)
    });
    // The first call completes: its callback returned once the other thread's calls failed.
    assert_eq!(outer.unwrap(), Value::I64(41));
    let inner = std::mem::take(&mut *inner.lock().unwrap());
    assert_eq!(inner.len(), 2);
    busy_fault(&inner[0], "well_add");
    busy_fault(&inner[1], "well_mul3");
    let reported: Vec<_> = faults(&events);
    assert_eq!(reported.len(), 2, "{reported:?}");
    assert!(reported.iter().all(|f| matches!(f.kind, FaultKind::BusyInCallback { .. })), "{reported:?}");

    // The domain was never at fault: same incarnation, no restart, and it serves calls (and callbacks) as before.
    let pid = ext.pid();
    assert_eq!(add.call(&mut [Arg::I64(2), Arg::I64(3)], RetType::I64).unwrap(), Value::I64(5));
    assert_eq!(i64_call(&ext, "well_mul3", &mut [Arg::I64(2), Arg::I64(3), Arg::I64(7)]), 42);
    let square = sup
        .register_callback(Signature::new(&[ValType::I64], RetType::I64), |a| {
            let x = a[0].as_i64().unwrap_or(0);
            Value::I64(x * x)
        })
        .unwrap();
    assert_eq!(i64_call(&ext, "well_map_sum", &mut [Arg::Callback(&square), Arg::I64(10)]), 285);
    assert_eq!(ext.pid(), pid);
    assert_eq!(ext.stats().restarts, 0);
}

/// The zygote the domain's incarnation was forked from: checked to be this process's child, so that the tests
/// signal only processes they started.
fn zygote_of(ext: &Extension) -> i32 {
    let incarnation = ext.pid().expect("a process domain");
    let zygote: i32 = stat_field(incarnation, 4);
    assert_ne!(zygote, std::process::id() as i32, "the incarnation was forked from a zygote");
    let started = started_for(zygote);
    assert_eq!(stat_field::<i32>(started, 4), std::process::id() as i32, "the zygote was started by this process");
    zygote
}

/// Field 3 of `/proc/PID/stat` (the state letter), None once the process is gone.
fn state_of(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].chars().next()
}

/// Stop `pid` and wait (bounded) until it is stopped.
fn stop(pid: i32) {
    // SAFETY: kill takes no pointers; `pid` is a zygote this test's supervisor started (`zygote_of`), not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let started = Instant::now();
    while state_of(pid) != Some('T') {
        assert!(started.elapsed() < SAFETY_NET, "the zygote does not stop");
        std::thread::yield_now();
    }
}

/// What the tests need of a recovery through a new zygote: the fault and its recovery reported, the stopped zygote
/// reported as failed to answer within the policy's deadline and gone (killed and reaped), the new incarnation
/// forked from a new zygote.
fn replaced(ext: &Extension, events: &Receiver<Event>, old_zygote: i32, old_start: u64) {
    let events: Vec<Event> = events.try_iter().collect();
    let deadline = Duration::from_millis(500);
    assert!(
        events.iter().any(|e| matches!(e, Event::ZygoteReplaced { domain, how: FaultKind::Timeout { deadline: d } }
            if domain == "faulty" && *d == deadline)),
        "{events:?}"
    );
    assert!(events.iter().any(|e| matches!(e, Event::Fault { .. })), "{events:?}");
    assert!(events.iter().any(|e| matches!(e, Event::Recovered { .. })), "{events:?}");
    let gone = match std::fs::read_to_string(format!("/proc/{old_zygote}/stat")) {
        Err(_) => true,
        // The number was given to another process since.
        Ok(_) => stat_field::<u64>(old_zygote, 22) != old_start,
    };
    assert!(gone, "the stopped zygote was reaped (state {:?})", state_of(old_zygote));
    assert_ne!(zygote_of(ext), old_zygote);
}

fn faulty_500ms() -> (Supervisor, Extension, Receiver<Event>) {
    let policy = FAULTY_POLICY.replacen("deadline_ms = 3000", "deadline_ms = 500", 1);
    faulty_with(Isolation::Process, &policy)
}

#[test]
fn a_zygote_stopped_before_an_incarnation_fails_is_replaced_and_recovery_goes_on() {
    let (_sup, ext, events) = faulty_500ms();
    let zygote = zygote_of(&ext);
    let start: u64 = stat_field(zygote, 22);
    stop(zygote);
    // The incarnation crashes; the zygote never says how it ended, nor forks the next.
    let crashing = ext.clone();
    let value = returns("the crashing call", move || arm_and_compute(&crashing, 1, 0));
    assert_eq!(value.as_i64(), Some(37));
    replaced(&ext, &events, zygote, start);
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(1)]), 13);
}

#[test]
fn a_zygote_stopped_before_a_fork_is_replaced_and_recovery_goes_on() {
    let (_sup, ext, events) = faulty_500ms();
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(8)]), 8);
    let zygote = zygote_of(&ext);
    let start: u64 = stat_field(zygote, 22);
    let incarnation = ext.pid().unwrap();
    // SAFETY: kill takes no pointers; the incarnation is our domain's, started by this test's supervisor.
    assert_eq!(unsafe { libc::kill(incarnation, libc::SIGKILL) }, 0);
    // The zygote reaps it (and says so on its control socket, almost always before it is stopped): the restart
    // then finds it stopped when it asks for a fork.
    let started = Instant::now();
    while state_of(incarnation).is_some() {
        assert!(started.elapsed() < SAFETY_NET, "the zygote does not reap the incarnation");
        std::thread::yield_now();
    }
    stop(zygote);
    let caller = ext.clone();
    let value = returns("the call after the kill", move || i64_call(&caller, "faulty_counter_get", &mut []));
    assert_eq!(value, 8);
    replaced(&ext, &events, zygote, start);
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(1)]), 9);
}
