//! The generic call API on every isolation kind: scalars, buffers, strings, callbacks (nested), deferred calls
//! and instance handles.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use ward::{Arg, Extension, Isolation, Policy, RetType, Signature, Supervisor, ValType, Value};

const KINDS: [Isolation; 2] = [Isolation::None, Isolation::Process];

const WELL_POLICY: &str = r#"
[extension.well.function.counter_add]
state = true
[extension.well.function.acc_new]
state = true
[extension.well.function.acc_add]
state = true
[extension.well.function.acc_free]
destroys = true
"#;

fn well(iso: Isolation) -> (Supervisor, Extension) {
    let sup = Supervisor::new(Policy::from_toml_str(WELL_POLICY, "test").unwrap());
    let ext = sup.load_with(builtin("well"), Some(iso)).unwrap();
    (sup, ext)
}

#[test]
fn integer_and_float_scalars() {
    for iso in KINDS {
        let (_s, ext) = well(iso);
        assert_eq!(i64_call(&ext, "well_add", &mut [Arg::I64(-5), Arg::I64(3)]), -2);
        assert_eq!(i64_call(&ext, "well_mul3", &mut [Arg::I64(2), Arg::I64(3), Arg::I64(7)]), 42);
        let fma = ext.call("well_fma", &mut [Arg::F64(1.5), Arg::F64(2.0), Arg::F64(0.25)], RetType::F64).unwrap();
        assert_eq!(fma, Value::F64(3.25));
        let half = ext.call("well_halve", &mut [Arg::F32(3.0)], RetType::F32).unwrap();
        assert_eq!(half, Value::F32(1.5));
        let mix = ext
            .call("well_mix", &mut [Arg::I64(1), Arg::F64(0.5), Arg::I64(-3), Arg::F32(0.25)], RetType::F64)
            .unwrap();
        assert_eq!(mix, Value::F64(-1.25), "{iso}");
    }
}

#[test]
fn in_out_and_in_out_buffers_and_strings() {
    for iso in KINDS {
        let (_s, ext) = well(iso);
        let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        let expected: i64 = data.iter().map(|&b| i64::from(b)).sum();
        assert_eq!(i64_call(&ext, "well_sum", &mut [Arg::In(&data), Arg::U64(data.len() as u64)]), expected);

        let mut out = vec![0u8; data.len()];
        ext.call(
            "well_xor",
            &mut [Arg::In(&data), Arg::Out(&mut out), Arg::U64(data.len() as u64), Arg::I64(0x5a)],
            RetType::Void,
        )
        .unwrap();
        assert!(out.iter().zip(&data).all(|(o, d)| *o == d ^ 0x5a));

        let mut buf = b"abcdef".to_vec();
        ext.call("well_reverse", &mut [Arg::InOut(&mut buf), Arg::U64(6)], RetType::Void).unwrap();
        assert_eq!(&buf, b"fedcba");

        let s = std::ffi::CString::new("protection domain").unwrap();
        assert_eq!(i64_call(&ext, "well_strlen", &mut [Arg::Str(&s)]), 17, "{iso}");
    }
}

#[test]
fn a_megabyte_crosses_both_ways() {
    let (_s, ext) = well(Isolation::Process);
    let data: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    let mut out = vec![0u8; data.len()];
    ext.call("well_copy", &mut [Arg::In(&data), Arg::Out(&mut out), Arg::U64(data.len() as u64)], RetType::Void)
        .unwrap();
    assert_eq!(out, data);
}

#[test]
fn callbacks_into_the_host() {
    for iso in KINDS {
        let (sup, ext) = well(iso);
        let square = sup
            .register_callback(Signature::new(&[ValType::I64], RetType::I64), |a| {
                let x = a[0].as_i64().unwrap_or(0);
                Value::I64(x * x)
            })
            .unwrap();
        assert_eq!(i64_call(&ext, "well_map_sum", &mut [Arg::Callback(&square), Arg::I64(10)]), 285);
        let scale = sup
            .register_callback(Signature::new(&[ValType::F64, ValType::I64], RetType::F64), |a| {
                Value::F64(a[0].as_f64().unwrap_or(0.0) * a[1].as_i64().unwrap_or(0) as f64)
            })
            .unwrap();
        let v =
            ext.call("well_apply_f", &mut [Arg::Callback(&scale), Arg::F64(1.25), Arg::I64(4)], RetType::F64).unwrap();
        assert_eq!(v, Value::F64(10.0), "{iso}");
    }
}

#[test]
fn nested_calls_both_ways() {
    for iso in KINDS {
        let (sup, ext) = well(iso);
        // f(d) = well_nest(f, d - 1) for d > 0, else 0; well_nest(f, d) = f(d) + 1: depth 6 gives 6... plus one.
        let slot: Arc<OnceLock<(Extension, ward::Callback)>> = Arc::new(OnceLock::new());
        let inner = slot.clone();
        let deepest = Arc::new(AtomicI64::new(i64::MAX));
        let seen = deepest.clone();
        let cb = sup
            .register_callback(Signature::new(&[ValType::I64], RetType::I64), move |a| {
                let d = a[0].as_i64().unwrap_or(0);
                seen.fetch_min(d, Ordering::SeqCst);
                if d == 0 {
                    return Value::I64(0);
                }
                let (ext, cb) = inner.get().expect("set before the first call");
                ext.call("well_nest", &mut [Arg::Callback(cb), Arg::I64(d - 1)], RetType::I64).unwrap()
            })
            .unwrap();
        let _ = slot.set((ext.clone(), cb.clone()));
        assert_eq!(i64_call(&ext, "well_nest", &mut [Arg::Callback(&cb), Arg::I64(6)]), 7, "{iso}");
        assert_eq!(deepest.load(Ordering::SeqCst), 0);
    }
}

#[test]
fn deferred_calls_run_in_order_before_the_next_call() {
    for iso in KINDS {
        let (_s, ext) = well(iso);
        let add = ext.function("counter_add").unwrap();
        for i in 1..=1000 {
            add.defer(&[Arg::I64(i)]).unwrap();
        }
        assert_eq!(i64_call(&ext, "counter_get", &mut []), 500_500, "{iso}");
        // Order across a batch (and the domain's chunks of it): the reset lands between the two runs of adds.
        let reset = ext.function("counter_reset").unwrap();
        for _ in 0..100 {
            add.defer(&[Arg::I64(1)]).unwrap();
        }
        reset.defer(&[]).unwrap();
        for i in 1..=50 {
            add.defer(&[Arg::I64(i)]).unwrap();
        }
        assert_eq!(i64_call(&ext, "counter_get", &mut []), 1275, "{iso}");
        ext.defer("well_sum", &[Arg::In(b"\x01\x02\x03"), Arg::U64(3)]).unwrap();
        ext.flush().unwrap();
    }
}

#[test]
fn deferred_calls_that_call_back_run_in_order_before_the_next_call() {
    for iso in KINDS {
        let (sup, ext) = well(iso);
        // What the callback saw, in the order it ran: the domain calls back from inside a batch, and the host
        // answers once it next waits for the domain.
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let scale = sup
            .register_callback(Signature::new(&[ValType::F64, ValType::I64], RetType::F64), move |a| {
                let (x, n) = (a[0].as_f64().unwrap_or(0.0), a[1].as_i64().unwrap_or(0));
                record.lock().unwrap().push((x, n));
                Value::F64(x * n as f64)
            })
            .unwrap();
        let apply = ext.function("well_apply_f").unwrap();
        // First with a function the next call has yet to resolve (the resolve waits behind the deferred calls),
        // then with one resolved already.
        for round in 0..2 {
            let calls: Vec<i64> = (1..=20).map(|i| i + 20 * round).collect();
            for &i in &calls {
                apply.defer(&[Arg::Callback(&scale), Arg::F64(0.5 * i as f64), Arg::I64(i)]).unwrap();
            }
            assert_eq!(i64_call(&ext, "well_add", &mut [Arg::I64(2), Arg::I64(3)]), 5, "{iso}");
            let expected: Vec<(f64, i64)> = calls.iter().map(|&i| (0.5 * i as f64, i)).collect();
            assert_eq!(*seen.lock().unwrap(), expected, "{iso}: every deferred call ran, in order, before the call");
            seen.lock().unwrap().clear();
        }
        assert_eq!(ext.stats().restarts, 0, "{iso}: no fault");
    }
}

#[test]
fn a_heartbeat_while_a_deferred_call_waits_for_its_callback_is_answered_not_a_fault() {
    let policy = format!("[extension.well]\nheartbeat_ms = 500\n{WELL_POLICY}");
    let sup = Supervisor::new(Policy::from_toml_str(&policy, "test").unwrap());
    let ext = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    let called = Arc::new(AtomicI64::new(0));
    let count = called.clone();
    let cb = sup
        .register_callback(Signature::new(&[ValType::F64, ValType::I64], RetType::F64), move |_| {
            count.fetch_add(1, Ordering::SeqCst);
            Value::F64(0.0)
        })
        .unwrap();
    ext.defer("well_apply_f", &[Arg::Callback(&cb), Arg::F64(1.0), Arg::I64(1)]).unwrap();
    ext.flush().unwrap();
    // The domain now waits for the callback's answer, which comes when the host next waits on it; the heartbeat
    // thread pings it meanwhile, and the domain answers the pings from inside that wait. (Each ping may take the
    // whole interval to be answered: half a second is far more than a loaded machine needs.)
    let bound = Instant::now() + Duration::from_secs(120);
    while ext.stats().heartbeats < 2 {
        assert!(Instant::now() < bound, "two heartbeats within the bound");
        // A polling interval, not synchronisation: the loop ends on what it observes.
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!((ext.stats().faults, ext.stats().restarts), (0, 0), "the pings found the domain well");
    assert_eq!(called.load(Ordering::SeqCst), 0, "the callback waits for the thread that calls");
    assert_eq!(i64_call(&ext, "well_add", &mut [Arg::I64(2), Arg::I64(3)]), 5);
    assert_eq!(called.load(Ordering::SeqCst), 1, "the next call served it first");
}

#[test]
fn handles_are_stable_and_remapped_after_a_restart() {
    let (_s, ext) = well(Isolation::Process);
    let h = ext.call("acc_new", &mut [Arg::I64(100)], RetType::Handle).unwrap().as_handle().unwrap();
    assert_eq!(i64_call(&ext, "acc_add", &mut [Arg::Handle(h), Arg::I64(5)]), 105);
    assert_eq!(ext.stats().handles, 1);
    // Kill the domain from outside; the next call finds it dead, recovers, replays acc_new and acc_add.
    let pid = ext.pid().unwrap();
    // SAFETY: the pid is our own domain process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(i64_call(&ext, "acc_get", &mut [Arg::Handle(h)]), 105);
    assert_ne!(ext.pid().unwrap(), pid);
    ext.call("acc_free", &mut [Arg::Handle(h)], RetType::Void).unwrap();
    assert_eq!(ext.stats().handles, 0);
    assert_eq!(ext.stats().shadow_log, 0, "a destroyed instance's history is dropped");
    let err = ext.call("acc_get", &mut [Arg::Handle(h)], RetType::I64).unwrap_err();
    assert!(matches!(err, ward::Error::UnknownHandle { .. }), "{err}");
}

#[test]
fn unknown_symbols_and_bad_files_are_clear_errors() {
    let (_s, ext) = well(Isolation::Process);
    let e = ext.call("no_such_function", &mut [], RetType::Void).unwrap_err();
    assert!(matches!(e, ward::Error::UnknownSymbol { .. }), "{e}");
    assert!(e.to_string().contains("no_such_function"));
    let sup = Supervisor::new(Policy::default());
    let e = sup.load("/nonexistent/plugin.so").unwrap_err();
    assert!(matches!(e, ward::Error::NotFound { .. }), "{e}");
    let e = sup.load("/etc/hostname").unwrap_err();
    assert!(matches!(e, ward::Error::NotElf { .. }), "{e}");
    let mut seven: Vec<Arg<'_>> = (0..7).map(Arg::I64).collect();
    let e = ext.call("well_add", &mut seven, RetType::I64);
    assert!(matches!(e, Err(ward::Error::BadArguments { .. })), "{e:?}");
}

#[test]
fn a_scratch_input_may_be_written_by_the_extension_but_the_host_never_sees_it() {
    for iso in [Isolation::None, Isolation::Process] {
        let (_s, ext) = well(iso);
        let buf = b"abcdef".to_vec();
        // well_reverse writes into its buffer: as scratch it works on a private copy.
        ext.call("well_reverse", &mut [Arg::Scratch(&buf), Arg::U64(6)], RetType::Void).unwrap();
        assert_eq!(&buf, b"abcdef", "{iso}: the host's bytes are unchanged");
        // And the extension reads what the host gave.
        assert_eq!(i64_call(&ext, "well_sum", &mut [Arg::Scratch(&buf), Arg::U64(6)]), 597, "{iso}");
    }
    // As a plain input in a process domain the same write is a fault: inputs are read-only there.
    let (_s, ext) = well(Isolation::Process);
    let buf = b"abcdef".to_vec();
    let err = ext.call("well_reverse", &mut [Arg::In(&buf), Arg::U64(6)], RetType::Void).unwrap_err();
    assert!(matches!(err, ward::Error::Fault(_) | ward::Error::Disabled { .. }), "{err}");
    assert_eq!(&buf, b"abcdef");
}

#[test]
fn an_extension_parsing_with_strtok_runs_under_every_isolation_this_machine_has() {
    let mut kinds = vec![Isolation::None, Isolation::Process];
    if ward::mpk_available() {
        kinds.push(Isolation::Mpk);
    }
    for iso in kinds {
        let sup = Supervisor::new(Policy::default());
        let ext = sup.load_with(builtin("calls_plugin"), Some(iso)).unwrap();
        let words = std::ffi::CString::new("one, two\tthree  four").unwrap();
        assert_eq!(i64_call(&ext, "calls_count_words", &mut [Arg::Str(&words)]), 4, "{iso}");
        let again = std::ffi::CString::new("five six").unwrap();
        assert_eq!(i64_call(&ext, "calls_count_words", &mut [Arg::Str(&again)]), 2, "{iso}");
    }
}

/// Isolation `none` calls a resolved function as the host would without ward: another thread's call of the same
/// domain goes through while one thread's call is inside the extension (here, out in a host callback).
#[test]
fn a_none_function_is_called_without_the_domains_lock() {
    let (sup, ext) = well(Isolation::None);
    let add = ext.function("well_add").unwrap();
    let (inside_tx, inside_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<i64>();
    let done_rx = std::sync::Mutex::new(done_rx);
    let inside_tx = std::sync::Mutex::new(inside_tx);
    let wait_for_other = sup
        .register_callback(Signature::new(&[ValType::I64], RetType::I64), move |_| {
            let _ = inside_tx.lock().unwrap().send(());
            // Generous: the other thread's call must finish while this call is inside; it never did when calls
            // of `none` held the domain's lock (it waited its turn, then failed at the deadline).
            let sum = done_rx.lock().unwrap().recv_timeout(Duration::from_secs(120)).unwrap_or(-1);
            Value::I64(sum)
        })
        .unwrap();
    let map_sum = ext.function("well_map_sum").unwrap();
    let other = std::thread::spawn(move || {
        inside_rx.recv_timeout(Duration::from_secs(120)).expect("the first call never got inside");
        let sum = add.call(&mut [Arg::I64(2), Arg::I64(3)], RetType::I64);
        let _ = done_tx.send(sum.as_ref().map_or(-2, |v| v.as_i64().unwrap_or(-3)));
        sum
    });
    let v = map_sum.call(&mut [Arg::Callback(&wait_for_other), Arg::I64(1)], RetType::I64).unwrap();
    let inner = other.join().unwrap();
    assert_eq!(inner.unwrap(), Value::I64(5), "the second thread's call");
    assert_eq!(v, Value::I64(5), "the first call saw the second one's result through its callback");
}

/// What the plain path of `none` leaves to the full one still works there: a `state` function is logged, a handle
/// is translated, and after a recovery every call keeps the core's counts.
#[test]
fn none_calls_that_need_the_core_still_get_it() {
    let (_sup, ext) = well(Isolation::None);
    let counter_add = ext.function("counter_add").unwrap();
    counter_add.call(&mut [Arg::I64(4)], RetType::I64).unwrap();
    assert_eq!(ext.stats().shadow_log, 1, "a state function's call is logged");
    let new = ext.function("acc_new").unwrap();
    let add = ext.function("acc_add").unwrap();
    let Value::Handle(h) = new.call(&mut [Arg::I64(10)], RetType::Handle).unwrap() else { panic!("no handle") };
    assert_eq!(add.call(&mut [Arg::Handle(h), Arg::I64(5)], RetType::I64).unwrap(), Value::I64(15));
    let plain = ext.function("well_add").unwrap();
    assert_eq!(plain.call(&mut [Arg::I64(1), Arg::I64(2)], RetType::I64).unwrap(), Value::I64(3));
    ext.declare_fault("well_add", ward::FaultKind::BadOutput { what: "a test".into() }).unwrap();
    assert_eq!(ext.stats().restarts, 1);
    assert_eq!(plain.call(&mut [Arg::I64(1), Arg::I64(2)], RetType::I64).unwrap(), Value::I64(3));
}
