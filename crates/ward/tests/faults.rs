//! Every built-in fault kind under a process domain: the host survives, the fault is classified, the extension is
//! restarted, its state replayed, the call retried and the next calls are correct.

mod common;

use common::*;
use ward::{Arg, FaultKind, Isolation, SignalCause};

/// Runs fault `kind` armed for the next compute; returns the single fault seen.
fn contained(kind: i64, arg: i64) -> ward::Fault {
    contained_with(FAULTY_POLICY, kind, arg)
}

/// [`contained`] under `policy`.
fn contained_with(policy: &str, kind: i64, arg: i64) -> ward::Fault {
    let (_sup, ext, events) = faulty_with(Isolation::Process, policy);
    let v = arm_and_compute(&ext, kind, arg);
    assert_eq!(v.as_i64(), Some(37), "the retried call is correct");
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 12, "state replayed");
    assert_eq!(i64_call(&ext, "faulty_compute", &mut [Arg::I64(3)]), 10, "later calls are correct");
    let stats = ext.stats();
    assert_eq!(stats.restarts, 1);
    assert_eq!(stats.incarnation, 2);
    let mut faults = faults(&events);
    assert_eq!(faults.len(), 1, "{faults:?}");
    let f = faults.remove(0);
    assert_eq!(f.call.as_deref(), Some("faulty_compute"));
    f
}

fn signal(f: &ward::Fault) -> (i32, SignalCause) {
    match f.kind {
        FaultKind::Signal { signo, cause, .. } => (signo, cause),
        ref other => panic!("expected a signal fault, got {other:?}"),
    }
}

#[test]
fn null_dereference() {
    let f = contained(1, 0);
    assert_eq!(signal(&f), (libc::SIGSEGV, SignalCause::NullDereference));
    assert!(matches!(f.kind, FaultKind::Signal { addr: Some(0), .. }));
}

#[test]
fn wild_write_to_a_host_address_leaves_host_data_unchanged() {
    let host_data: Box<i64> = Box::new(42);
    let addr = &*host_data as *const i64 as i64;
    let f = contained(2, addr);
    assert_eq!(signal(&f), (libc::SIGSEGV, SignalCause::InvalidAccess));
    assert!(matches!(f.kind, FaultKind::Signal { addr: Some(a), .. } if a == addr as u64));
    assert_eq!(*host_data, 42);
}

#[test]
fn abort() {
    assert_eq!(signal(&contained(3, 0)), (libc::SIGABRT, SignalCause::Abort));
}

#[test]
fn exit_3() {
    assert_eq!(contained(4, 0).kind, FaultKind::Exited { status: 3 });
}

/// Without a zygote the host reads how a domain ended from the process it started, which in a PID namespace is the
/// waiter outside it, not the domain: it must end with the domain's own signal or exit code.
#[test]
fn without_a_zygote_a_crash_an_abort_and_an_exit_report_the_domains_own_status() {
    let policy = FAULTY_POLICY.replacen("[extension.faulty]\n", "[extension.faulty]\nzygote = false\n", 1);
    assert_eq!(signal(&contained_with(&policy, 1, 0)), (libc::SIGSEGV, SignalCause::NullDereference));
    assert_eq!(signal(&contained_with(&policy, 3, 0)), (libc::SIGABRT, SignalCause::Abort));
    assert_eq!(contained_with(&policy, 4, 0).kind, FaultKind::Exited { status: 3 });
}

#[test]
fn infinite_loop_is_stopped_at_its_deadline() {
    let f = contained(5, 0);
    assert!(matches!(f.kind, FaultKind::Timeout { deadline } if deadline.as_millis() == 3000), "{f:?}");
}

#[test]
fn unbounded_recursion_is_a_stack_overflow() {
    assert_eq!(signal(&contained(6, 0)), (libc::SIGSEGV, SignalCause::StackOverflow));
}

#[test]
fn memory_bomb_is_stopped_by_the_address_space_limit() {
    // malloc fails at the limit and the bomb writes through the null it got; the domain's handler finds the
    // address space all but used up, so the fault is named for that, not for the null. Touching the whole limit
    // can take seconds on a loaded machine: the deadline is a minute, so only the limit stops the bomb.
    let policy = FAULTY_POLICY.replacen("deadline_ms = 3000", "deadline_ms = 60000", 1);
    assert_ne!(policy, FAULTY_POLICY);
    let f = contained_with(&policy, 7, 0);
    assert_eq!(signal(&f), (libc::SIGSEGV, SignalCause::OutOfMemory));
    assert!(f.cause().starts_with("out of memory (address-space limit reached) (SIGSEGV at 0x"), "{}", f.cause());
}

#[test]
fn descriptor_leak_ends_at_the_descriptor_limit() {
    // The leak aborts when open() fails at the policy's open_files limit, in the domain's own table; the domain's
    // handler finds that table full.
    let f = contained(8, 0);
    assert_eq!(signal(&f), (libc::SIGABRT, SignalCause::OutOfDescriptors));
    assert_eq!(f.cause(), "out of descriptors (open-files limit reached) (SIGABRT)");
}

#[test]
fn raise_sigkill() {
    assert_eq!(signal(&contained(9, 0)), (libc::SIGKILL, SignalCause::Killed));
}

#[test]
fn garbage_in_a_reply_is_a_protocol_violation() {
    let f = contained(10, 0);
    assert!(
        matches!(&f.kind, FaultKind::Protocol { what } if what.contains("malformed") || what.contains("ring")),
        "{f:?}"
    );
}

#[test]
fn a_forged_reply_for_a_call_not_in_flight_is_a_protocol_violation() {
    let f = contained(11, 0);
    assert!(matches!(&f.kind, FaultKind::Protocol { what } if what.contains("not in flight")), "{f:?}");
}

#[test]
fn division_by_zero() {
    assert_eq!(signal(&contained(12, 0)), (libc::SIGFPE, SignalCause::Arithmetic));
}

#[test]
fn illegal_instruction() {
    assert_eq!(signal(&contained(13, 0)), (libc::SIGILL, SignalCause::IllegalInstruction));
}

/// faulty_clobber_callee_saved returns 7 with every callee-saved register but rsp pointing at zeroed memory and the
/// direction flag set. Natively that breaks the caller; in a process domain the caller is the domain process, whose
/// call path saves and restores them (as the mpk gate does): the call is no fault at all, and the domain goes on.
#[test]
fn a_call_that_breaks_the_calling_convention_returns_its_result_and_the_domain_goes_on() {
    let (_sup, ext, events) = faulty_with(Isolation::Process, FAULTY_POLICY);
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    for _ in 0..3 {
        assert_eq!(i64_call(&ext, "faulty_clobber_callee_saved", &mut []), 7);
    }
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(2)]), 7, "the domain goes on with its state");
    assert_eq!(faults(&events), [], "no fault");
}
