//! mpk domains through the supervisor, as a host uses them: the built-in extensions loaded, called, faulted and
//! recovered, through the public API only. The tests that need PKU are marked `#[ignore = "needs PKU"]`, so a plain
//! `cargo test` reports them as not run; `scripts/test` runs them where the processor has PKU and under emulation
//! (`scripts/pku-vm`) where it has not. The test of what happens without PKU runs everywhere else.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ward::{Arg, Error, Event, Extension, FaultKind, Isolation, Policy, RestartVia, RetType, Signature, Supervisor};
use ward::{SignalCause, ValType, Value};

mod common;

use common::{builtin, require_pku};

/// Protection keys are few (15 per process): the tests that make domains take turns.
static KEYS: Mutex<()> = Mutex::new(());

/// Takes this test's turn with the protection keys; first fails the test, saying why, where there is no PKU (run
/// with `--include-ignored` on such a machine, it must not pass without having run).
fn one_at_a_time() -> MutexGuard<'static, ()> {
    require_pku();
    KEYS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A thread's floating-point control state: MXCSR without its exception flags, and the x87 control word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FloatState {
    mxcsr: u32,
    x87_control: u16,
}

/// This thread's floating-point control state now.
fn float_state_of_this_thread() -> FloatState {
    /// MXCSR's six exception flags, which arithmetic sets: not control.
    const MXCSR_FLAGS: u32 = 0x3f;
    let mut mxcsr = 0u32;
    let mut x87_control = 0u16;
    // SAFETY: both instructions only store the current control state into the two locals.
    unsafe {
        std::arch::asm!(
            "stmxcsr dword ptr [{m}]",
            "fnstcw word ptr [{c}]",
            m = in(reg) &mut mxcsr,
            c = in(reg) &mut x87_control,
            options(nostack, preserves_flags),
        )
    };
    FloatState { mxcsr: mxcsr & !MXCSR_FLAGS, x87_control }
}

/// faulty_mpk's policy: a deadline generous enough for emulation, a 64 MiB heap, its counter replayed.
const POLICY: &str = r#"
[extension.faulty_mpk]
deadline_ms = 5000
# These tests provoke the same fault call after call: never disabled for failing in a row.
max_failures_in_row = 0
max_restarts = 1000
restart_period_s = 1
backoff_initial_ms = 0.001
backoff_max_ms = 0.001
[extension.faulty_mpk.limits]
address_space_mb = 64
[extension.faulty_mpk.function.faulty_counter_add]
state = true
[extension.well]
init = "well_init"
[extension.threads]
deadline_ms = 120000
max_restarts = 1000
restart_period_s = 1
backoff_initial_ms = 0.001
backoff_max_ms = 0.001
[extension.threads.function.threads_crash]
retryable = false
"#;

fn load(name: &str, isolation: Isolation) -> (Supervisor, Extension, Receiver<Event>) {
    let sup = Supervisor::new(Policy::from_toml_str(POLICY, "test policy").expect("the test policy parses"));
    let events = sup.subscribe();
    let ext = sup.load_with(builtin(name), Some(isolation)).expect("the extension loads under mpk");
    (sup, ext, events)
}

fn int(ext: &Extension, f: &str, args: &mut [Arg<'_>]) -> i64 {
    ext.call(f, args, RetType::I64).expect(f).as_i64().expect("an integer")
}

fn faults(events: &Receiver<Event>) -> Vec<ward::Fault> {
    events.try_iter().filter_map(|e| if let Event::Fault { fault } = e { Some(fault) } else { None }).collect()
}

#[test]
#[ignore = "needs PKU"]
fn a_well_behaved_extension_runs_in_an_mpk_domain_with_scalars_buffers_strings_and_its_init() {
    let _keys = one_at_a_time();
    let (_sup, ext, _events) = load("well", Isolation::Mpk);
    assert_eq!(ext.isolation(), Isolation::Mpk);
    assert_eq!(int(&ext, "well_initialised", &mut []), 1, "the policy's init function ran in the domain");
    assert_eq!(int(&ext, "well_add", &mut [Arg::I64(40), Arg::I64(2)]), 42);
    let fma = ext.call("well_fma", &mut [Arg::F64(2.0), Arg::F64(3.0), Arg::F64(0.5)], RetType::F64).unwrap();
    assert_eq!(fma.as_f64(), Some(6.5));
    let bytes: Vec<u8> = (1..=100).collect();
    assert_eq!(int(&ext, "well_sum", &mut [Arg::In(&bytes), Arg::U64(100)]), 5050);
    let mut out = vec![0u8; 100];
    ext.call("well_xor", &mut [Arg::In(&bytes), Arg::Out(&mut out), Arg::U64(100), Arg::U64(0xff)], RetType::Void)
        .unwrap();
    assert!(out.iter().zip(&bytes).all(|(o, b)| *o == b ^ 0xff), "the output came back");
    let mut inout = b"abcdef".to_vec();
    ext.call("well_reverse", &mut [Arg::InOut(&mut inout), Arg::U64(6)], RetType::Void).unwrap();
    assert_eq!(inout, b"fedcba");
    let s = std::ffi::CString::new("protection keys").unwrap();
    assert_eq!(int(&ext, "well_strlen", &mut [Arg::Str(&s)]), 15);
    // A deferred call runs at once: there is no queue to cross.
    ext.defer("counter_add", &[Arg::I64(3)]).unwrap();
    ext.flush().unwrap();
    assert_eq!(int(&ext, "counter_get", &mut []), 3);
}

#[test]
#[ignore = "needs PKU"]
fn library_code_setting_errno_sets_the_domains_errno_without_a_fault() {
    let _keys = one_at_a_time();
    let (_sup, ext, events) = load("well", Isolation::Mpk);
    // libm's sqrt and libc's strtod run in the domain and store errno through the FS base, which is the domain's
    // thread block there: the store lands in the domain's errno, which the extension reads back in its next call.
    let f64_call = |f: &str, args: &mut [Arg<'_>]| ext.call(f, args, RetType::F64).expect(f).as_f64().expect(f);
    ext.call("well_clear_errno", &mut [], RetType::Void).unwrap();
    assert!(f64_call("well_sqrt", &mut [Arg::F64(-1.0)]).is_nan());
    assert_eq!(int(&ext, "well_errno", &mut []), i64::from(libc::EDOM));
    ext.call("well_clear_errno", &mut [], RetType::Void).unwrap();
    assert_eq!(f64_call("well_sqrt", &mut [Arg::F64(4.0)]), 2.0);
    assert_eq!(int(&ext, "well_errno", &mut []), 0);
    let huge = std::ffi::CString::new("1e999").unwrap();
    assert_eq!(f64_call("well_strtod", &mut [Arg::Str(&huge)]), f64::INFINITY);
    assert_eq!(int(&ext, "well_errno", &mut []), i64::from(libc::ERANGE));
    assert!(faults(&events).is_empty(), "errno stores are no faults");
    assert_eq!(ext.stats().restarts, 0);
}

#[test]
#[ignore = "needs PKU"]
fn strtok_in_a_domain_runs_on_a_position_of_the_domains_own() {
    let _keys = one_at_a_time();
    let (_sup, ext, events) = load("calls_plugin", Isolation::Mpk);
    // glibc's strtok keeps its position in the host's libc, where the domain may not write: bound to glibc's, this
    // call would fault. The runtime's keeps it in the domain.
    let text = std::ffi::CString::new("one, two\tthree  four").unwrap();
    assert_eq!(int(&ext, "calls_count_words", &mut [Arg::Str(&text)]), 4);
    let again = std::ffi::CString::new("five six").unwrap();
    assert_eq!(int(&ext, "calls_count_words", &mut [Arg::Str(&again)]), 2);
    assert!(faults(&events).is_empty());
}

#[test]
#[ignore = "needs PKU"]
fn callbacks_reach_the_host_and_the_host_calls_the_domain_again_from_inside_one() {
    let _keys = one_at_a_time();
    let (sup, ext, _events) = load("well", Isolation::Mpk);
    let square = sup
        .register_callback(Signature::new(&[ValType::I64], RetType::I64), |a| {
            let x = a[0].as_i64().unwrap_or(0);
            Value::I64(x * x)
        })
        .unwrap();
    // 0 + 1 + 4 + 9 = 14
    assert_eq!(int(&ext, "well_map_sum", &mut [Arg::Callback(&square), Arg::I64(4)]), 14);

    // well_nest(f, depth) returns f(depth) + 1; the host's f(d) returns well_nest(f, d - 1) + 1, and 0 for d = 0:
    // well_nest(f, 3) = 7, three rounds deep.
    let slot: Arc<Mutex<Option<ward::Callback>>> = Arc::new(Mutex::new(None));
    let inner = ext.clone();
    let again = slot.clone();
    let nest = sup
        .register_callback(Signature::new(&[ValType::I64], RetType::I64), move |a| {
            let depth = a[0].as_i64().unwrap_or(0);
            if depth <= 0 {
                return Value::I64(0);
            }
            let cb = again.lock().unwrap().clone().expect("registered");
            let r = inner.call("well_nest", &mut [Arg::Callback(&cb), Arg::I64(depth - 1)], RetType::I64);
            Value::I64(r.map(|v| v.as_i64().unwrap_or(-1)).unwrap_or(-1) + 1)
        })
        .unwrap();
    *slot.lock().unwrap() = Some(nest.clone());
    assert_eq!(int(&ext, "well_nest", &mut [Arg::Callback(&nest), Arg::I64(3)]), 7);
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_is_entered_again_through_another_domains_callback() {
    let _keys = one_at_a_time();
    let sup = Supervisor::new(Policy::from_toml_str(POLICY, "test policy").expect("the test policy parses"));
    let a = sup.load_with(builtin("well"), Some(Isolation::Mpk)).expect("well loads under mpk");
    let b = sup.load_with(builtin("well"), Some(Isolation::Mpk)).expect("a second well loads under mpk");
    // well_nest(f, depth) returns f(depth) + 1; the host's f(d) calls well_nest(f, d - 1) of the other domain for
    // even d and of the first for odd d, and returns 0 for d = 0: A, B, A, B, four rounds, so 2 * 4 + 1 = 9.
    let slot: Arc<Mutex<Option<ward::Callback>>> = Arc::new(Mutex::new(None));
    let (into_a, into_b, again) = (a.clone(), b.clone(), slot.clone());
    let nest = sup
        .register_callback(Signature::new(&[ValType::I64], RetType::I64), move |args| {
            let depth = args[0].as_i64().unwrap_or(0);
            if depth <= 0 {
                return Value::I64(0);
            }
            let next = if depth % 2 == 0 { &into_b } else { &into_a };
            let cb = again.lock().unwrap().clone().expect("registered");
            let r = next.call("well_nest", &mut [Arg::Callback(&cb), Arg::I64(depth - 1)], RetType::I64);
            Value::I64(r.map(|v| v.as_i64().unwrap_or(-100)).unwrap_or(-100) + 1)
        })
        .unwrap();
    *slot.lock().unwrap() = Some(nest.clone());
    assert_eq!(int(&a, "well_nest", &mut [Arg::Callback(&nest), Arg::I64(4)]), 9);
    // Both go on as before.
    assert_eq!(int(&a, "well_add", &mut [Arg::I64(40), Arg::I64(2)]), 42);
    assert_eq!(int(&b, "well_add", &mut [Arg::I64(1), Arg::I64(2)]), 3);
    assert_eq!(a.stats().restarts + b.stats().restarts, 0);
}

/// A host global the extension is given the address of.
static HOST_GLOBAL: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(7);

/// Arms `kind`, calls compute with the counter at 12: the call must come back right after a recovery from the
/// snapshot, with the counter replayed. Returns the fault.
fn recovers_from(kind: i64, arg: i64) -> ward::Fault {
    let (_sup, ext, events) = load("faulty_mpk", Isolation::Mpk);
    assert_eq!(int(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    assert_eq!(int(&ext, "faulty_counter_add", &mut [Arg::I64(7)]), 12);
    ext.call("faulty_arm", &mut [Arg::I64(kind), Arg::I64(arg)], RetType::Void).unwrap();
    assert_eq!(int(&ext, "faulty_compute", &mut [Arg::I64(6)]), 37, "kind {kind}: the retried call's result");
    assert_eq!(int(&ext, "faulty_counter_get", &mut []), 12, "kind {kind}: the counter was replayed");
    let all: Vec<Event> = events.try_iter().collect();
    assert!(
        all.iter().any(|e| matches!(e, Event::Recovered { via: RestartVia::Snapshot, .. })),
        "kind {kind}: restored from the snapshot: {all:?}"
    );
    let f: Vec<ward::Fault> =
        all.into_iter().filter_map(|e| if let Event::Fault { fault } = e { Some(fault) } else { None }).collect();
    assert_eq!(f.len(), 1, "kind {kind}: one fault: {f:?}");
    f[0].clone()
}

fn signal_of(fault: &ward::Fault) -> (i32, SignalCause) {
    match fault.kind {
        FaultKind::Signal { signo, cause, .. } => (signo, cause),
        ref other => panic!("not a signal: {other:?}"),
    }
}

#[test]
#[ignore = "needs PKU"]
fn every_built_in_fault_is_caught_and_recovered_from_the_snapshot() {
    let _keys = one_at_a_time();
    assert_eq!(signal_of(&recovers_from(1, 0)), (libc::SIGSEGV, SignalCause::NullDereference));
    assert_eq!(signal_of(&recovers_from(3, 0)), (libc::SIGABRT, SignalCause::Abort));
    assert_eq!(recovers_from(4, 0).kind, FaultKind::Exited { status: 3 });
    assert!(matches!(recovers_from(5, 0).kind, FaultKind::Timeout { .. }));
    assert_eq!(signal_of(&recovers_from(6, 0)), (libc::SIGSEGV, SignalCause::StackOverflow));
    assert_eq!(signal_of(&recovers_from(7, 0)).1, SignalCause::OutOfMemory);
    assert_eq!(signal_of(&recovers_from(12, 0)), (libc::SIGFPE, SignalCause::Arithmetic));
    assert_eq!(signal_of(&recovers_from(13, 0)), (libc::SIGILL, SignalCause::IllegalInstruction));
}

/// faulty_clobber_callee_saved returns 7 with rbx, rbp and r12 to r15 pointing at zeroed memory of the domain's
/// and the direction flag set: in an mpk domain nothing of that reaches the host, so the call is no fault at all.
#[test]
#[ignore = "needs PKU"]
fn an_extension_that_breaks_the_calling_convention_returns_its_result_to_an_intact_host() {
    let _keys = one_at_a_time();
    let (_sup, ext, events) = load("faulty_mpk", Isolation::Mpk);
    assert_eq!(int(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    for _ in 0..3 {
        assert_eq!(int(&ext, "faulty_clobber_callee_saved", &mut []), 7);
    }
    assert_eq!(int(&ext, "faulty_counter_add", &mut [Arg::I64(2)]), 7, "the domain goes on with its state");
    assert_eq!(faults(&events), [], "no fault");
}

/// Flush-to-zero and denormals-are-zero in MXCSR.
const FLUSH_DENORMALS: i64 = 0x8040;

/// faulty_flush_denormals sets two MXCSR bits and leaves them set: the domain keeps them from call to call, as a
/// process domain would, the host never sees them, and a restore from the snapshot takes them back.
#[test]
#[ignore = "needs PKU"]
fn an_extension_keeps_the_floating_point_control_it_sets_and_the_host_keeps_its_own() {
    let _keys = one_at_a_time();
    let host = float_state_of_this_thread();
    assert_eq!(i64::from(host.mxcsr) & FLUSH_DENORMALS, 0, "the test thread does not flush denormals itself");
    let (_sup, ext, events) = load("faulty_mpk", Isolation::Mpk);
    assert_eq!(int(&ext, "faulty_flush_denormals", &mut []) & FLUSH_DENORMALS, FLUSH_DENORMALS);
    assert_eq!(float_state_of_this_thread(), host, "the host's MXCSR is its own");
    assert_eq!(int(&ext, "faulty_float_control", &mut []) & FLUSH_DENORMALS, FLUSH_DENORMALS, "the domain kept it");
    ext.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
    assert_eq!(int(&ext, "faulty_compute", &mut [Arg::I64(6)]), 37, "the call that faulted, retried");
    assert_eq!(ext.isolation(), Isolation::Mpk, "still in an mpk domain");
    assert_eq!(faults(&events).len(), 1, "one fault");
    assert_eq!(int(&ext, "faulty_float_control", &mut []) & FLUSH_DENORMALS, 0, "restored with the snapshot's");
    assert_eq!(float_state_of_this_thread(), host);
}

#[test]
#[ignore = "needs PKU"]
fn each_thread_keeps_its_own_floating_point_control_in_a_domain() {
    let _keys = one_at_a_time();
    let (_sup, ext, _events) = load("faulty_mpk", Isolation::Mpk);
    assert_eq!(int(&ext, "faulty_flush_denormals", &mut []) & FLUSH_DENORMALS, FLUSH_DENORMALS);
    // Another thread's calls run with the state the domain was left in by its initialisers, as a new thread of a
    // process would, not with this thread's.
    let there = std::thread::scope(|s| s.spawn(|| int(&ext, "faulty_float_control", &mut [])).join().unwrap());
    assert_eq!(there & FLUSH_DENORMALS, 0, "the other thread does not flush denormals");
    assert_eq!(int(&ext, "faulty_float_control", &mut []) & FLUSH_DENORMALS, FLUSH_DENORMALS, "this one still does");
}

#[test]
#[ignore = "needs PKU"]
fn a_write_into_a_host_global_faults_and_leaves_the_global_unchanged() {
    let _keys = one_at_a_time();
    let address = HOST_GLOBAL.as_ptr() as i64;
    let fault = recovers_from(2, address);
    assert_eq!(signal_of(&fault), (libc::SIGSEGV, SignalCause::InvalidAccess));
    assert!(matches!(fault.kind, FaultKind::Signal { addr: Some(a), .. } if a == address as u64));
    assert_eq!(HOST_GLOBAL.load(std::sync::atomic::Ordering::SeqCst), 7);
}

#[test]
#[ignore = "needs PKU"]
fn a_buffer_lent_to_a_domain_ends_at_a_guard_page() {
    let _keys = one_at_a_time();
    // Never moved to a process domain, however many faults: every overrun here is caught by mpk's guard pages.
    let policy = POLICY.replacen("[extension.faulty_mpk]\n", "[extension.faulty_mpk]\nescalate_after = 0\n", 1);
    let sup = Supervisor::new(Policy::from_toml_str(&policy, "test policy").expect("the test policy parses"));
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("faulty_mpk"), Some(Isolation::Mpk)).expect("loads under mpk");
    let overrun = |len: usize, past: i64| {
        let (mut out, mut other) = (vec![0u8; len], vec![0u8; 64]);
        let r = ext.call(
            "faulty_overrun",
            &mut [Arg::Out(&mut out), Arg::I64(len as i64), Arg::I64(past), Arg::Out(&mut other)],
            RetType::Void,
        );
        (r.is_ok(), out, other)
    };
    // Within the buffer: every byte written, the other buffer untouched.
    for len in [100, 4096, 5000] {
        let (ok, out, other) = overrun(len, 0);
        assert!(ok && out.iter().all(|&b| b == 0xAB) && other.iter().all(|&b| b == 0), "{len} bytes");
    }
    assert!(faults(&events).is_empty());
    // Sixteen bytes past the end reach the guard page whatever the length (a buffer starts 16-byte aligned).
    for len in [100, 4096, 5000] {
        let (ok, ..) = overrun(len, 16);
        assert!(!ok, "{len} bytes and 16 past the end");
        let f = faults(&events);
        assert!(!f.is_empty(), "{len}: a fault");
        assert!(
            f.iter().all(|x| matches!(
                x.kind,
                FaultKind::Signal { signo: libc::SIGSEGV, cause: SignalCause::InvalidAccess, .. }
            )),
            "{len}: {f:?}"
        );
    }
    assert_eq!(ext.isolation(), Isolation::Mpk);
}

/// Calls `function` of faulty_mpk, which hands a host-gated C library function a pointer: the call fails with a
/// fault of the domain (the same one each time it is tried), the host goes on, and so does the domain, its counter
/// replayed. Returns the fault.
fn gate_misuse(function: &str, args: &mut [Arg<'_>]) -> ward::Fault {
    let (_sup, ext, events) = load("faulty_mpk", Isolation::Mpk);
    assert_eq!(int(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    let result = ext.call(function, args, RetType::I64);
    assert!(result.is_err(), "{function}: {result:?}");
    assert_eq!(int(&ext, "faulty_counter_get", &mut []), 5, "{function}: the domain recovered with its state");
    let f = faults(&events);
    assert!(!f.is_empty(), "{function}: a fault was reported");
    assert!(f.iter().all(|x| x.kind == f[0].kind), "{function}: one kind of fault: {f:?}");
    f[0].clone()
}

/// An address no mapping of a test process uses (below the heap and libraries' usual places).
const UNMAPPED: i64 = 1 << 46;

#[test]
#[ignore = "needs PKU"]
fn a_host_gate_handed_a_pointer_the_domain_cannot_read_faults_the_domain_not_the_host() {
    let _keys = one_at_a_time();
    // gettext's domain name, near null: a null dereference, as natively.
    let fault = gate_misuse("faulty_gate_read", &mut [Arg::I64(8)]);
    assert_eq!(
        fault.kind,
        FaultKind::Signal { signo: libc::SIGSEGV, cause: SignalCause::NullDereference, addr: Some(8) }
    );
    // A string printf would read for a `%s`.
    let fault = gate_misuse("faulty_gate_format", &mut [Arg::I64(UNMAPPED)]);
    assert_eq!(
        fault.kind,
        FaultKind::Signal { signo: libc::SIGSEGV, cause: SignalCause::InvalidAccess, addr: Some(UNMAPPED as u64) }
    );
}

/// glibc's fortify failure, run inside the domain, stores its message in libc's own data before it aborts: the store
/// is what faults (the domain may not write host memory), and the host never sees the abort.
#[test]
#[ignore = "needs PKU"]
fn a_fortified_copy_that_fails_its_check_is_a_fault_of_the_domain() {
    let _keys = one_at_a_time();
    let (_sup, ext, events) = load("faulty_mpk", Isolation::Mpk);
    assert_eq!(int(&ext, "faulty_fortified_copy", &mut [Arg::I64(16)]), 0, "within the buffer");
    let result = ext.call("faulty_fortified_copy", &mut [Arg::I64(64)], RetType::I64);
    assert!(result.is_err(), "{result:?}");
    let f = faults(&events);
    assert!(!f.is_empty(), "a fault was reported");
    assert_eq!(int(&ext, "faulty_counter_get", &mut []), 0, "the host and the domain go on");
}

#[test]
#[ignore = "needs PKU"]
fn a_host_gate_reads_host_memory_the_domain_may_read() {
    let _keys = one_at_a_time();
    static HOST_TEXT: &std::ffi::CStr = c"host";
    let (_sup, ext, events) = load("faulty_mpk", Isolation::Mpk);
    assert_eq!(int(&ext, "faulty_gate_format", &mut [Arg::I64(HOST_TEXT.as_ptr() as i64)]), 6, "snprintf gave [host]");
    assert!(faults(&events).is_empty());
}

#[test]
#[ignore = "needs PKU"]
fn a_host_gate_asked_to_write_host_memory_faults_the_domain_and_the_memory_is_unchanged() {
    let _keys = one_at_a_time();
    let address = HOST_GLOBAL.as_ptr() as i64;
    let fault = gate_misuse("faulty_gate_write", &mut [Arg::I64(address)]);
    assert_eq!(signal_of(&fault), (libc::SIGSEGV, SignalCause::InvalidAccess));
    assert!(matches!(fault.kind, FaultKind::Signal { addr: Some(a), .. } if a == address as u64), "{fault:?}");
    assert_eq!(HOST_GLOBAL.load(std::sync::atomic::Ordering::SeqCst), 7);
}

#[test]
#[ignore = "needs PKU"]
fn a_host_gate_handed_something_that_is_no_stream_refuses_the_call() {
    let _keys = one_at_a_time();
    let fault = gate_misuse("faulty_gate_stream", &mut []);
    let FaultKind::Protocol { what } = &fault.kind else { panic!("a refused call: {fault:?}") };
    assert!(what.contains("fputs") && what.contains("no stream"), "{what}");
}

#[test]
#[ignore = "needs PKU"]
fn a_write_into_another_domain_faults_there_and_the_other_domain_goes_on() {
    let _keys = one_at_a_time();
    let (_sup_a, a, events_a) = load("faulty_mpk", Isolation::Mpk);
    let (_sup_b, b, events_b) = load("faulty_mpk", Isolation::Mpk);
    assert_eq!(int(&b, "faulty_counter_add", &mut [Arg::I64(9)]), 9);
    // An address inside b's domain: where b saw an output buffer (its copy in b's argument area).
    let mut out = [0u8; 16];
    let inside_b = int(&b, "faulty_address_of", &mut [Arg::Out(&mut out)]);
    let e = a.call("faulty_wild_write", &mut [Arg::I64(inside_b)], RetType::Void);
    assert!(e.is_err(), "a write into another domain must fail the call");
    let f = faults(&events_a);
    assert!(!f.is_empty());
    assert!(
        matches!(f[0].kind, FaultKind::Signal { signo: libc::SIGSEGV, addr: Some(x), .. } if x == inside_b as u64),
        "{f:?}"
    );
    assert_eq!(int(&b, "faulty_counter_get", &mut []), 9, "b kept its state");
    assert!(faults(&events_b).is_empty(), "b did not fault");
}

#[test]
#[ignore = "needs PKU"]
fn an_extension_the_runtime_cannot_hold_is_refused_under_mpk_with_every_reason_and_auto_uses_a_process() {
    let _keys = one_at_a_time();
    let sup = Supervisor::new(Policy::default());
    let Err(e) = sup.load_with(builtin("faulty"), Some(Isolation::Mpk)) else {
        panic!("faulty cannot run under mpk");
    };
    let text = e.to_string();
    assert!(matches!(e, Error::Load { .. }), "{text}");
    for import in ["open", "pause", "raise", "syscall"] {
        assert!(text.contains(import), "the reason names {import}: {text}");
    }
    let ext = sup.load_with(builtin("faulty"), Some(Isolation::Auto)).expect("auto falls back to a process");
    assert_eq!(ext.isolation(), Isolation::Process);
    let ext = sup.load_with(builtin("well"), Some(Isolation::Auto)).expect("auto takes mpk");
    assert_eq!(ext.isolation(), Isolation::Mpk);
}

#[test]
fn without_pku_mpk_is_unavailable_and_auto_means_process() {
    if ward::mpk_available() {
        eprintln!("this machine has PKU: the test of its absence did not run here");
        return;
    }
    let sup = Supervisor::new(Policy::default());
    let Err(e) = sup.load_with(builtin("well"), Some(Isolation::Mpk)) else {
        panic!("no mpk without PKU");
    };
    assert!(matches!(e, Error::IsolationUnavailable(..)), "{e}");
    assert!(e.to_string().contains("PKU"), "{e}");
    let ext = sup.load_with(builtin("well"), Some(Isolation::Auto)).expect("auto loads");
    assert_eq!(ext.isolation(), Isolation::Process);
}

#[test]
#[ignore = "needs PKU"]
fn after_escalate_after_faults_an_mpk_domain_moves_to_a_process_domain_with_its_state() {
    let _keys = one_at_a_time();
    let policy = POLICY.replacen("[extension.faulty_mpk]\n", "[extension.faulty_mpk]\nescalate_after = 2\n", 1);
    let sup = Supervisor::new(Policy::from_toml_str(&policy, "test policy").expect("the test policy parses"));
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("faulty_mpk"), Some(Isolation::Mpk)).expect("loads under mpk");
    assert_eq!(int(&ext, "faulty_counter_add", &mut [Arg::I64(12)]), 12);
    for round in 1..=2 {
        ext.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
        assert_eq!(int(&ext, "faulty_compute", &mut [Arg::I64(6)]), 37, "round {round}");
        let expected = if round == 1 { Isolation::Mpk } else { Isolation::Process };
        assert_eq!(ext.isolation(), expected, "after fault {round}");
    }
    assert_eq!(int(&ext, "faulty_counter_get", &mut []), 12, "the counter was replayed into the process domain");
    assert!(ext.pid().is_some(), "a process domain runs it now");
    let all: Vec<Event> = events.try_iter().collect();
    let escalated: Vec<&Event> = all.iter().filter(|e| matches!(e, Event::Escalated { .. })).collect();
    assert_eq!(escalated.len(), 1, "{all:?}");
    assert!(matches!(escalated[0], Event::Escalated { faults: 2, from: Isolation::Mpk, to: Isolation::Process, .. }));
}

/// A domain that moved to a process gets the heartbeat its policy asks for: stopped there, it misses a beat and is
/// restarted, its state replayed. (In the mpk domain before, there was nothing to ping.)
#[test]
#[ignore = "needs PKU"]
fn an_escalated_domain_has_a_heartbeat() {
    let _keys = one_at_a_time();
    let keys = "[extension.faulty_mpk]\nescalate_after = 1\nheartbeat_ms = 500\n";
    let policy = POLICY.replacen("[extension.faulty_mpk]\n", keys, 1);
    let sup = Supervisor::new(Policy::from_toml_str(&policy, "test policy").expect("the test policy parses"));
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("faulty_mpk"), Some(Isolation::Mpk)).expect("loads under mpk");
    assert_eq!(int(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    ext.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
    assert_eq!(int(&ext, "faulty_compute", &mut [Arg::I64(6)]), 37);
    assert_eq!(ext.isolation(), Isolation::Process);
    let pid = ext.pid().expect("a process domain runs it now");
    let _ = events.try_iter().count();
    // SAFETY: the domain process this test's supervisor started; SIGSTOP freezes it without ending it.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let bound = Duration::from_secs(120);
    let fault = loop {
        match events.recv_timeout(bound).expect("a heartbeat fault within the bound") {
            Event::Fault { fault } => break fault,
            _ => continue,
        }
    };
    assert!(matches!(fault.kind, FaultKind::HeartbeatMissed { .. }), "{fault:?}");
    while !matches!(events.recv_timeout(bound).expect("recovery within the bound"), Event::Recovered { .. }) {}
    assert_ne!(ext.pid(), Some(pid), "restarted in a new process");
    assert_eq!(int(&ext, "faulty_counter_get", &mut []), 5, "the counter was replayed");
}

#[test]
#[ignore = "needs PKU"]
fn an_extensions_own_thread_locals_are_per_thread_from_their_initial_values_and_reset_by_recovery() {
    let _keys = one_at_a_time();
    let (_sup, ext, events) = load("well", Isolation::Mpk);
    // General dynamic (the total), local dynamic (the last value) and initial-exec (the count) accesses.
    assert_eq!(int(&ext, "well_thread_initialised", &mut []), 1, "the policy's init ran on this thread");
    assert_eq!(int(&ext, "well_thread_add", &mut [Arg::I64(5)]), 1005);
    assert_eq!(int(&ext, "well_thread_add", &mut [Arg::I64(2)]), 1007);
    assert_eq!(int(&ext, "well_thread_calls_and_last", &mut []), 2002);
    std::thread::scope(|s| {
        let there = s
            .spawn(|| {
                (int(&ext, "well_thread_add", &mut [Arg::I64(7)]), int(&ext, "well_thread_calls_and_last", &mut []))
            })
            .join()
            .unwrap();
        assert_eq!(there, (1007, 1007), "another thread's own, from the initial values");
        let there = s.spawn(|| int(&ext, "well_thread_initialised", &mut [])).join().unwrap();
        assert_eq!(there, 0, "init did not run on that thread");
    });
    assert_eq!(int(&ext, "well_thread_calls_and_last", &mut []), 2002, "this thread's kept");
    assert!(faults(&events).is_empty());
    // Recovery puts the domain's memory back as it was after initialisation, thread-locals included (what init set
    // on this thread stays set).
    ext.declare_fault("well_thread_add", FaultKind::BadOutput { what: "a test's".into() }).unwrap();
    assert_eq!(int(&ext, "well_thread_initialised", &mut []), 1);
    assert_eq!(int(&ext, "well_thread_add", &mut [Arg::I64(1)]), 1001);
    assert_eq!(int(&ext, "well_thread_calls_and_last", &mut []), 1001);
}

#[test]
#[ignore = "needs PKU"]
fn a_write_off_the_end_of_the_heap_in_use_is_a_fault_of_the_domain() {
    let _keys = one_at_a_time();
    let (_sup, ext, events) = load("faulty_mpk", Isolation::Mpk);
    assert_eq!(int(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    // Within its own block: no fault.
    assert_eq!(int(&ext, "faulty_heap_overrun", &mut [Arg::I64(0)]), 63);
    // A megabyte past a 64-byte block: off the end of the part of the heap in use (the quota is 64 MiB).
    let fault = ext.call("faulty_heap_overrun", &mut [Arg::I64(1 << 20)], RetType::I64).unwrap_err();
    assert!(matches!(fault, Error::Fault(_)), "{fault:?}");
    // Each attempt (the call and its retry) faults the same way.
    let seen = faults(&events);
    assert!(!seen.is_empty(), "a fault");
    for fault in &seen {
        assert_eq!(signal_of(fault), (libc::SIGSEGV, SignalCause::InvalidAccess), "{seen:?}");
    }
    assert_eq!(int(&ext, "faulty_counter_add", &mut [Arg::I64(2)]), 7, "recovered, its state replayed");
    assert_eq!(int(&ext, "faulty_heap_overrun", &mut [Arg::I64(0)]), 63);
}

/// `threads_wait` on another thread: it tells `arrived` when it is in, then waits in the domain until `go` is set.
fn wait_in_the_domain<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    sup: &Supervisor,
    ext: &'s Extension,
    go: &'static AtomicI64,
    arrived: &'static AtomicUsize,
) -> std::thread::ScopedJoinHandle<'s, Result<Value, Error>> {
    let arrive = sup
        .register_callback(Signature::new(&[], RetType::I64), move |_| {
            arrived.fetch_add(1, Ordering::SeqCst);
            Value::I64(0)
        })
        .unwrap();
    scope.spawn(move || {
        ext.call("threads_wait", &mut [Arg::Ptr(go.as_ptr() as usize), Arg::Callback(&arrive)], RetType::I64)
    })
}

/// Waits until `arrived` reaches `n` (another thread's progress; the deadline only ends a test that went wrong).
fn until_arrived(arrived: &AtomicUsize, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while arrived.load(Ordering::SeqCst) < n {
        assert!(std::time::Instant::now() < deadline, "the waiting call never arrived in the domain");
        std::thread::yield_now();
    }
}

#[test]
#[ignore = "needs PKU"]
fn several_threads_run_in_one_domain_at_once_sharing_its_heap_and_a_mutex() {
    let _keys = one_at_a_time();
    static GO: AtomicI64 = AtomicI64::new(0);
    static ARRIVED: AtomicUsize = AtomicUsize::new(0);
    let (sup, ext, events) = load("threads", Isolation::Mpk);
    std::thread::scope(|s| {
        let waiting = wait_in_the_domain(s, &sup, &ext, &GO, &ARRIVED);
        until_arrived(&ARRIVED, 1);
        // With one thread inside, waiting for the host, two more call in and finish: calls are not serialised.
        let counters: Vec<_> = (0..2).map(|_| s.spawn(|| int(&ext, "threads_count", &mut [Arg::I64(500)]))).collect();
        let counts: Vec<i64> = counters.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(counts.contains(&1000), "the last to finish saw every increment: {counts:?}");
        GO.store(5, Ordering::SeqCst);
        assert_eq!(waiting.join().unwrap().unwrap().as_i64(), Some(5));
    });
    assert_eq!(int(&ext, "threads_count", &mut [Arg::I64(0)]), 1000, "no increment lost");
    assert_eq!(ARRIVED.load(Ordering::SeqCst), 1, "the waiting call ran once");
    assert!(faults(&events).is_empty());
}

#[test]
#[ignore = "needs PKU"]
fn two_threads_in_one_domain_while_one_of_them_faults() {
    let _keys = one_at_a_time();
    static GO: AtomicI64 = AtomicI64::new(0);
    static ARRIVED: AtomicUsize = AtomicUsize::new(0);
    let (sup, ext, events) = load("threads", Isolation::Mpk);
    assert_eq!(int(&ext, "threads_count", &mut [Arg::I64(3)]), 3);
    std::thread::scope(|s| {
        let waiting = wait_in_the_domain(s, &sup, &ext, &GO, &ARRIVED);
        until_arrived(&ARRIVED, 1);
        // This thread's call crashes while the other is in the domain: the domain is closed (the other thread's
        // call ends where it is), restored and replayed, and the crash (not retryable) is reported.
        let crash = ext.call("threads_crash", &mut [], RetType::I64).unwrap_err();
        let Error::Fault(fault) = crash else { panic!("a fault: {crash:?}") };
        assert_eq!(signal_of(&fault), (libc::SIGSEGV, SignalCause::NullDereference));
        // The other thread's call was ended by the recovery and made again (it arrived a second time); it now
        // finishes in the new incarnation.
        until_arrived(&ARRIVED, 2);
        GO.store(9, Ordering::SeqCst);
        assert_eq!(waiting.join().unwrap().unwrap().as_i64(), Some(9));
    });
    assert_eq!(ARRIVED.load(Ordering::SeqCst), 2, "ended once, then made again once");
    let seen = faults(&events);
    assert!(seen.len() == 1 && seen[0].call.as_deref() == Some("threads_crash"), "one fault, the crash: {seen:?}");
    // The shared count was not marked state: the restored domain starts it again.
    assert_eq!(int(&ext, "threads_count", &mut [Arg::I64(1)]), 1);
    assert_eq!(ext.stats().restarts, 1);
}

/// `well`, `faulty_mpk` and `faulty` in group `g`; well's counter is not marked state-establishing, so only a member
/// that joined without a restart keeps it. (`faulty` has kinds that need a process of its own: mpk refuses it.)
const GROUP_POLICY: &str = r#"
[group.g]
deadline_ms = 5000
max_restarts = 1000
restart_period_s = 1
backoff_initial_ms = 0.001
backoff_max_ms = 0.001
[extension.well]
group = "g"
init = "well_init"
[extension.faulty_mpk]
group = "g"
[extension.faulty_mpk.function.faulty_counter_add]
state = true
[extension.faulty]
group = "g"
"#;

fn mpk_group_with_well() -> (Supervisor, Extension, Receiver<Event>) {
    let sup = Supervisor::new(Policy::from_toml_str(GROUP_POLICY, "test policy").expect("the group policy parses"));
    let events = sup.subscribe();
    let well = sup.load_with(builtin("well"), Some(Isolation::Mpk)).expect("well loads under mpk");
    assert_eq!(int(&well, "counter_add", &mut [Arg::I64(20)]), 20);
    (sup, well, events)
}

#[test]
#[ignore = "needs PKU"]
fn a_member_added_to_a_running_mpk_group_joins_it_in_place() {
    let _keys = one_at_a_time();
    let (sup, well, events) = mpk_group_with_well();
    let faulty = sup.load_with(builtin("faulty_mpk"), Some(Isolation::Mpk)).expect("faulty_mpk joins");
    assert_eq!(faulty.domain(), "g");
    assert_eq!(well.stats().restarts, 0, "no restart");
    assert_eq!(int(&well, "counter_add", &mut [Arg::I64(1)]), 21, "state no replay restores is still there");
    assert_eq!(int(&faulty, "faulty_counter_add", &mut [Arg::I64(12)]), 12);
    // A fault of the new member restarts the group: loaded afresh (the snapshot predates the new member), both
    // members there, the new one's state replayed.
    faulty.call("faulty_arm", &mut [Arg::I64(1), Arg::I64(0)], RetType::Void).unwrap();
    assert_eq!(int(&faulty, "faulty_compute", &mut [Arg::I64(6)]), 37, "the retried call's result");
    assert_eq!(int(&faulty, "faulty_counter_get", &mut []), 12, "replayed");
    assert_eq!(int(&well, "counter_get", &mut []), 0, "well's counter is not replayed: this was a restart");
    assert_eq!(int(&well, "well_initialised", &mut []), 1, "well's init ran again");
    assert!(events.try_iter().any(|e| matches!(e, Event::Recovered { via: RestartVia::Reload, .. })), "loaded afresh");
    // After the reload the group takes one more member in place again.
    let restarts = well.stats().restarts;
    let second = sup.load_with(builtin("faulty_mpk"), Some(Isolation::Mpk)).expect("a second faulty_mpk joins");
    assert_eq!(int(&second, "faulty_counter_add", &mut [Arg::I64(3)]), 3, "its own copy, with its own counter");
    assert_eq!(well.stats().restarts, restarts, "no restart");
    assert_eq!(int(&well, "well_add", &mut [Arg::I64(40), Arg::I64(2)]), 42);
}

#[test]
#[ignore = "needs PKU"]
fn a_member_mpk_refuses_is_refused_and_the_mpk_group_goes_on() {
    let _keys = one_at_a_time();
    let (sup, well, events) = mpk_group_with_well();
    let e = sup.load_with(builtin("faulty"), Some(Isolation::Mpk)).unwrap_err();
    assert!(matches!(e, Error::Load { .. }), "{e}");
    assert_eq!(well.stats().restarts, 0, "the running domain was left alone");
    assert_eq!(int(&well, "counter_add", &mut [Arg::I64(1)]), 21);
    assert!(faults(&events).is_empty());
    // The group still takes members.
    let faulty = sup.load_with(builtin("faulty_mpk"), Some(Isolation::Mpk)).expect("faulty_mpk joins");
    assert_eq!(int(&faulty, "faulty_counter_add", &mut [Arg::I64(2)]), 2);
    assert_eq!(int(&well, "counter_add", &mut [Arg::I64(1)]), 22);
}

#[test]
#[ignore = "needs PKU"]
fn a_call_out_in_the_host_while_another_thread_recovers_the_domain_ends_when_it_comes_back_and_is_made_again() {
    let _keys = one_at_a_time();
    static GO: AtomicI64 = AtomicI64::new(0);
    static ARRIVED: AtomicUsize = AtomicUsize::new(0);
    static RECOVERED: AtomicUsize = AtomicUsize::new(0);
    static NESTED: AtomicI64 = AtomicI64::new(-1);
    let (sup, ext, events) = load("threads", Isolation::Mpk);
    assert_eq!(int(&ext, "threads_count", &mut [Arg::I64(5)]), 5);
    let inner = ext.clone();
    // The first time: wait in the host until the other thread has recovered the domain, then call it again from
    // here (a nested call, into the new incarnation). The second time (the call made again): return at once.
    let arrive = sup
        .register_callback(Signature::new(&[], RetType::I64), move |_| {
            if ARRIVED.fetch_add(1, Ordering::SeqCst) == 0 {
                until_arrived(&RECOVERED, 1);
                NESTED.store(int(&inner, "threads_count", &mut [Arg::I64(1)]), Ordering::SeqCst);
            }
            Value::I64(0)
        })
        .unwrap();
    std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            ext.call("threads_wait", &mut [Arg::Ptr(GO.as_ptr() as usize), Arg::Callback(&arrive)], RetType::I64)
        });
        until_arrived(&ARRIVED, 1);
        // The other thread is out in the host: the recovery does not wait for it.
        assert!(ext.call("threads_crash", &mut [], RetType::I64).is_err());
        RECOVERED.store(1, Ordering::SeqCst);
        // Its nested call ran in the new incarnation (the count restarted), its callback returned into the closed
        // domain's call, which ended there and was made again.
        until_arrived(&ARRIVED, 2);
        GO.store(4, Ordering::SeqCst);
        assert_eq!(waiting.join().unwrap().unwrap().as_i64(), Some(4));
    });
    assert_eq!(NESTED.load(Ordering::SeqCst), 1, "the nested call saw the new incarnation's count");
    assert_eq!(ARRIVED.load(Ordering::SeqCst), 2);
    assert_eq!(faults(&events).len(), 1, "one fault: the crash");
    assert_eq!(ext.stats().restarts, 1);
}
