//! Hangs that used to escape detection: a host callback that waits for another thread's call into the same domain.

mod common;

use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use ward::{Arg, Error, FaultKind, Isolation, Policy, RetType, Signature, Supervisor, ValType, Value};

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
