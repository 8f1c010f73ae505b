//! The gate on a machine with PKU. The tests that need it are marked `#[ignore = "needs PKU"]`, so a plain
//! `cargo test` reports them as not run; `scripts/test` runs them where the processor has PKU, and inside a virtual
//! machine whose emulated processor has it where it has not (`scripts/pku-vm`). Run anyway without PKU, they fail.

use std::arch::asm;
use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use std::mem::MaybeUninit;

use super::assembly::{ward_mpk_host_signal_entry, ward_mpk_refuse, ward_mpk_signal_entry};
use super::handlers::real_sigaction;
use super::host_signals::GLIBC_SETXID;
use super::outward::OUTWARD_TARGETS;
use super::*;
use crate::domain::memory::KeyedRegion;
use crate::domain::pku::{ProtectionKey, HOST_KEY};
use crate::domain::require_pku;
use crate::domain::thread_block::{ThreadBlocks, TlsLayout};

/// The floating-point control of the tests' domains: a process's initial state, which no test but the one that
/// checks it changes (that one has its own).
static FLOAT: FloatControl = FloatControl::new(FloatState::INITIAL);

/// A domain for a test: its key, a stack and some data memory tagged with it, and the rights it runs with.
struct TestDomain {
    key: ProtectionKey,
    stack: KeyedRegion,
    data: KeyedRegion,
    rights: Pkru,
    blocks: std::sync::Arc<ThreadBlocks>,
}

thread_local! {
    /// The thread block of the test domain this thread called last: what the host functions of the nesting tests
    /// call back in with.
    static LAST_THREAD_POINTER: Cell<usize> = const { Cell::new(0) };
}

fn last_thread_pointer() -> usize {
    LAST_THREAD_POINTER.with(Cell::get)
}

impl TestDomain {
    /// A new domain; fails the test where there is no PKU.
    fn new() -> TestDomain {
        require_pku();
        let key = ProtectionKey::allocate().expect("a protection key");
        let signal = signal_key().expect("the signal key");
        let stack = KeyedRegion::new(256 * 1024, key.number()).expect("a domain stack");
        let data = KeyedRegion::new(4096, key.number()).expect("domain memory");
        let rights = Pkru::DENY_ALL.read_only(HOST_KEY).allow(key.number()).allow(signal);
        let blocks = std::sync::Arc::new(ThreadBlocks::new(key.number(), TlsLayout::default()));
        TestDomain { key, stack, data, rights, blocks }
    }

    /// Call `func` in this domain with integer arguments.
    fn call(&self, func: *const c_void, ints: &[u64]) -> Result<RegRet, GateFault> {
        self.call_with(&FLOAT, func, ints)
    }

    /// Call `func` in this domain with integer arguments and the floating-point control `float`.
    fn call_with(&self, float: &FloatControl, func: *const c_void, ints: &[u64]) -> Result<RegRet, GateFault> {
        let mut args = RegArgs::default();
        args.ints[..ints.len()].copy_from_slice(ints);
        // SAFETY: every function the tests call is an `extern "C"` function of this file taking integer or pointer
        // arguments only; the stack is this domain's own, used by no other call.
        unsafe { super::call(func, &args, self.rights, self.stack.end(), None, self.thread_pointer(), float, None) }
            .expect("the gate's thread set-up")
    }

    /// Call `func` in this domain from a thread started for the call (this one waits, so the stack is free).
    fn call_from_a_new_thread(&self, func: *const c_void, ints: &[u64]) -> Result<RegRet, GateFault> {
        let func = func as usize;
        std::thread::scope(|s| {
            s.spawn(|| {
                allow_on_this_thread(self.key.number());
                self.call(func as *const c_void, ints)
            })
            .join()
            .unwrap()
        })
    }

    /// This thread's block in the domain.
    fn thread_pointer(&self) -> usize {
        let pointer = self.blocks.pointer_for_this_thread().expect("a thread block");
        LAST_THREAD_POINTER.with(|p| p.set(pointer));
        pointer
    }

    fn data_word(&self) -> *mut u64 {
        self.data.start().cast()
    }
}

extern "C" fn add(a: u64, b: u64) -> u64 {
    a.wrapping_add(b)
}

extern "C" fn read_word(at: *const u64) -> u64 {
    // SAFETY: a test's deliberate read; the gate turns a fault into an error.
    unsafe { at.read_volatile() }
}

extern "C" fn write_word(at: *mut u64, value: u64) {
    // SAFETY: a test's deliberate write; the gate turns a fault into an error.
    unsafe { at.write_volatile(value) }
}

extern "C" fn stack_pointer() -> u64 {
    let rsp: u64;
    // SAFETY: reads a register.
    unsafe { asm!("mov {}, rsp", out(reg) rsp, options(nomem, nostack, preserves_flags)) };
    rsp
}

extern "C" fn recurse(depth: u64) -> u64 {
    let mut local = [0u8; 512];
    local[0] = depth as u8;
    black_box(&mut local);
    if depth == 0 {
        return u64::from(local[0]);
    }
    recurse(black_box(depth - 1)).wrapping_add(u64::from(black_box(local[1])))
}

extern "C" fn illegal_instruction() {
    // SAFETY: raises SIGILL on purpose.
    unsafe { asm!("ud2", options(nomem, nostack)) };
}

extern "C" fn breakpoint() {
    // SAFETY: raises SIGTRAP on purpose.
    unsafe { asm!("int3", options(nomem, nostack)) };
}

static HOST_WORD: AtomicU64 = AtomicU64::new(7);

impl GateFault {
    /// The signal that ended the call; fails the test when it ended otherwise.
    fn signalled(self) -> SignalFault {
        match self {
            GateFault::Signal(fault) => fault,
            other => panic!("the call ended without a signal: {other:?}"),
        }
    }
}

fn f(func: *const ()) -> *const c_void {
    func.cast()
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_call_returns_its_result_and_runs_on_the_domain_stack() {
    let d = TestDomain::new();
    assert_eq!(d.call(f(add as *const ()), &[2, 3]).unwrap().int, 5);
    let rsp = d.call(f(stack_pointer as *const ()), &[]).unwrap().int as usize;
    assert!(d.stack.contains(rsp), "the function ran on the domain stack ({rsp:#x})");
}

#[test]
#[ignore = "needs PKU"]
fn a_write_into_host_memory_faults_and_leaves_it_unchanged_and_the_thread_goes_on() {
    let d = TestDomain::new();
    let at = HOST_WORD.as_ptr();
    let fault = d.call(f(write_word as *const ()), &[at as u64, 99]).unwrap_err().signalled();
    assert!(fault.is_key_violation(), "{fault:?}");
    assert_eq!(fault.addr, at as usize);
    assert_eq!(HOST_WORD.load(Ordering::SeqCst), 7, "the host's word is unchanged");
    assert_eq!(d.call(f(add as *const ()), &[40, 2]).unwrap().int, 42, "the next call works");
    // The host's own rights are back: it may write its memory (and the domain's) after the fault.
    HOST_WORD.store(8, Ordering::SeqCst);
    HOST_WORD.store(7, Ordering::SeqCst);
}

#[test]
#[ignore = "needs PKU"]
fn host_memory_is_readable_from_a_domain() {
    let d = TestDomain::new();
    let word = Box::new(0x1234_5678_u64);
    assert_eq!(d.call(f(read_word as *const ()), &[ptr::from_ref(&*word) as u64]).unwrap().int, 0x1234_5678);
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_writes_its_own_memory_and_the_host_reads_it() {
    let d = TestDomain::new();
    d.call(f(write_word as *const ()), &[d.data_word() as u64, 42]).unwrap();
    // SAFETY: the domain's data page, which this thread's rights allow (it allocated the key).
    assert_eq!(unsafe { d.data_word().read_volatile() }, 42);
}

#[test]
#[ignore = "needs PKU"]
fn another_domains_memory_is_out_of_reach() {
    let a = TestDomain::new();
    let b = TestDomain::new();
    // SAFETY: b's data page, which this thread may write.
    unsafe { b.data_word().write_volatile(5) };
    let read = a.call(f(read_word as *const ()), &[b.data_word() as u64]).unwrap_err().signalled();
    assert!(read.is_key_violation(), "{read:?}");
    let write = a.call(f(write_word as *const ()), &[b.data_word() as u64, 6]).unwrap_err().signalled();
    assert!(write.is_key_violation(), "{write:?}");
    // SAFETY: b's data page, which this thread may read.
    assert_eq!(unsafe { b.data_word().read_volatile() }, 5);
}

#[test]
#[ignore = "needs PKU"]
fn a_null_dereference_an_illegal_instruction_and_a_breakpoint_are_caught() {
    let d = TestDomain::new();
    let null = d.call(f(read_word as *const ()), &[0]).unwrap_err().signalled();
    assert_eq!((null.signal, null.code, null.addr), (libc::SIGSEGV, 1, 0), "SEGV_MAPERR at 0");
    let ill = d.call(f(illegal_instruction as *const ()), &[]).unwrap_err().signalled();
    assert_eq!(ill.signal, libc::SIGILL);
    assert_eq!(ill.pc, ill.addr, "SIGILL reports the instruction");
    let trap = d.call(f(breakpoint as *const ()), &[]).unwrap_err().signalled();
    assert_eq!(trap.signal, libc::SIGTRAP);
    assert_eq!(d.call(f(add as *const ()), &[1, 1]).unwrap().int, 2);
}

#[test]
#[ignore = "needs PKU"]
fn a_stack_overflow_inside_a_domain_is_caught_on_the_alternate_stack() {
    let d = TestDomain::new();
    let fault = d.call(f(recurse as *const ()), &[1 << 20]).unwrap_err().signalled();
    assert_eq!(fault.signal, libc::SIGSEGV);
    let guard = d.stack.start() as usize - super::super::memory::page_size();
    assert!((guard..d.stack.start() as usize).contains(&fault.addr), "the guard page below the stack: {fault:?}");
    assert_eq!(d.call(f(recurse as *const ()), &[10]).unwrap().int, 0, "a shallow recursion works afterwards");
}

#[test]
#[ignore = "needs PKU"]
fn two_threads_in_one_domain_one_faulting() {
    let d = TestDomain::new();
    let second_stack = KeyedRegion::new(64 * 1024, d.key.number()).unwrap();
    let key = d.key.number();
    let rights = d.rights;
    let stack_top = second_stack.end() as usize;
    let blocks = d.blocks.clone();
    std::thread::scope(|s| {
        let faulting = s.spawn(move || {
            allow_on_this_thread(key);
            let thread_pointer = blocks.pointer_for_this_thread().expect("a thread block");
            let mut args = RegArgs::default();
            args.ints[0] = 0;
            // SAFETY: read_word takes one pointer; the stack is the second one, used only here.
            unsafe {
                super::call(
                    f(read_word as *const ()),
                    &args,
                    rights,
                    stack_top as *mut u8,
                    None,
                    thread_pointer,
                    &FLOAT,
                    None,
                )
            }
            .unwrap()
        });
        for i in 0..1000 {
            assert_eq!(d.call(f(add as *const ()), &[i, 1]).unwrap().int, i + 1);
        }
        let fault = faulting.join().unwrap().unwrap_err().signalled();
        assert_eq!(fault.signal, libc::SIGSEGV);
    });
}

/// The cases below need a process of their own: what happens to a fault outside a domain depends on what the host
/// installed before ward did.
const CHILD_CASE: &str = "WARD_GATE_TEST_CHILD";

/// The name the test runner knows the test it is written in by (its path below the crate), for running it again.
macro_rules! this_test {
    () => {{
        fn here() {}
        let path = std::any::type_name_of_val(&here);
        let path = path.strip_suffix("::here").unwrap_or(path);
        path.split_once("::").map_or(path, |(_crate, below)| below)
    }};
}

/// A test whose case runs in a child process, `test` run again there with [`CHILD_CASE`] set to `case`. In that
/// child this runs `child` and returns `None`; in the test's own process it fails where there is no PKU (the gate
/// tests' rule) and otherwise runs the child and returns how it ended.
fn in_a_child_process(case: &str, test: &str, child: impl FnOnce()) -> Option<std::process::Output> {
    if std::env::var(CHILD_CASE).as_deref() == Ok(case) {
        child();
        return None;
    }
    require_pku();
    let exe = std::env::current_exe().expect("the test binary's path");
    // The test is one of the ignored ones (it needs PKU): the child must be told to run it all the same.
    let out = Command::new(exe)
        .args(["--include-ignored", "--exact", test, "--nocapture", "--test-threads", "1"])
        .env(CHILD_CASE, case)
        .output()
        .expect("the test binary runs again");
    Some(out)
}

/// The child ran to its end and printed `says`.
fn assert_child_said(out: &std::process::Output, says: &str) {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed: {stderr}");
    assert!(stdout.contains(says), "the child did not say {says:?}: {stdout}");
}

/// The test it is written in, run again in a child process as `case` ([`in_a_child_process`]), where it runs
/// `child`; here, the child ran to its end and printed `says` ([`assert_child_said`]).
macro_rules! in_a_child_that_says {
    ($case:expr, $says:expr, $child:expr) => {
        if let Some(out) = in_a_child_process($case, this_test!(), $child) {
            assert_child_said(&out, $says);
        }
    };
}

static HOST_TRAPS: AtomicU64 = AtomicU64::new(0);

extern "C" fn host_trap_handler(_: libc::c_int) {
    HOST_TRAPS.fetch_add(1, Ordering::SeqCst);
}

#[test]
#[ignore = "needs PKU"]
fn a_fault_outside_any_domain_goes_to_the_handler_the_host_installed() {
    let child = || {
        // SAFETY: installs a plain handler that only bumps an atomic.
        unsafe { libc::signal(libc::SIGTRAP, host_trap_handler as *const () as usize) };
        let d = TestDomain::new();
        assert_eq!(d.call(f(breakpoint as *const ()), &[]).unwrap_err().signalled().signal, libc::SIGTRAP);
        assert_eq!(HOST_TRAPS.load(Ordering::SeqCst), 0, "a domain's trap is not the host's");
        breakpoint();
        assert_eq!(HOST_TRAPS.load(Ordering::SeqCst), 1, "the host's own trap reached its handler");
        println!("child: host handler chained");
    };
    in_a_child_that_says!("host-handler", "child: host handler chained", child);
}

#[test]
#[ignore = "needs PKU"]
fn a_host_handler_put_in_wards_place_is_chained_to_once_ward_looks_again() {
    let child = || {
        let d = TestDomain::new();
        assert_eq!(d.call(f(add as *const ()), &[1, 2]).unwrap().int, 3, "ward's handlers are in");
        // SAFETY: installs a plain handler that only bumps an atomic, straight through glibc, in ward's place.
        unsafe { libc::signal(libc::SIGTRAP, host_trap_handler as *const () as usize) };
        adopt_host_handlers();
        assert_eq!(d.call(f(breakpoint as *const ()), &[]).unwrap_err().signalled().signal, libc::SIGTRAP);
        assert_eq!(HOST_TRAPS.load(Ordering::SeqCst), 0, "a domain's trap is not the host's");
        breakpoint();
        assert_eq!(HOST_TRAPS.load(Ordering::SeqCst), 1, "the host's own trap reached its handler");
        println!("child: replaced handler chained");
    };
    in_a_child_that_says!("replaced-handler", "child: replaced handler chained", child);
}

#[test]
#[ignore = "needs PKU"]
fn a_fault_outside_any_domain_with_no_host_handler_ends_the_process_as_it_would_without_ward() {
    let child = || {
        let d = TestDomain::new();
        assert!(d.call(f(read_word as *const ()), &[0]).is_err());
        println!("child: about to fault in the host");
        read_word(black_box(ptr::null()));
        println!("child: survived a host fault (wrong)");
    };
    if let Some(out) = in_a_child_process("default", this_test!(), child) {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("about to fault"));
    }
}

/// In a domain: call `out(x)` (a host function behind an outward stub) and add one.
extern "C" fn call_out(out: extern "C" fn(u64) -> u64, x: u64) -> u64 {
    out(x).wrapping_add(1)
}

static OUTWARD_HOST_WORD: AtomicU64 = AtomicU64::new(0);
static OUTWARD_HOST_RSP: AtomicU64 = AtomicU64::new(0);

/// In the host: double `x`, writing host memory on the way (which the domain could not).
extern "C" fn host_double(x: u64) -> u64 {
    OUTWARD_HOST_WORD.store(x, Ordering::SeqCst);
    OUTWARD_HOST_RSP.store(stack_pointer(), Ordering::SeqCst);
    x * 2
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_calls_the_host_through_an_outward_stub() {
    let d = TestDomain::new();
    // host_double takes one integer and returns normally.
    let stub = outward_for(f(host_double as *const ())).expect("an outward slot");
    assert_eq!(d.call(f(call_out as *const ()), &[stub as u64, 20]).unwrap().int, 41);
    assert_eq!(OUTWARD_HOST_WORD.load(Ordering::SeqCst), 20, "the host function wrote host memory");
    let rsp = OUTWARD_HOST_RSP.load(Ordering::SeqCst) as usize;
    assert!(!d.stack.contains(rsp), "the host function ran on the host's stack, not the domain's ({rsp:#x})");
    // Called from the host itself, the stub is a plain call.
    // SAFETY: the stub stands for host_double.
    let direct: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(stub) };
    assert_eq!(direct(5), 10);
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_that_calls_out_with_its_stack_pointer_past_its_stack_faults_as_itself() {
    let d = TestDomain::new();
    let stub = outward_for(f(host_double as *const ())).expect("an outward slot");
    // The stub reads the caller's stack arguments before it hands them to the host: here they would lie in the
    // guard page past the domain's stack. That read is the domain's, so the fault is the domain's, not the host's.
    let r = d.call(f(ward_test_call_out_from_the_stack_end as *const ()), &[stub as u64, d.stack.end() as u64]);
    let fault = r.expect_err("the call faults").signalled();
    assert_eq!(fault.signal, libc::SIGSEGV);
    assert_eq!(d.call(f(add as *const ()), &[40, 2]).unwrap().int, 42, "the host and the domain go on");
}

/// In a domain: call `out` with twelve integer arguments, the last six of them on the stack.
#[allow(clippy::type_complexity)]
extern "C" fn call_out_with_twelve(
    out: extern "C" fn(u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64) -> u64,
) -> u64 {
    out(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
}

/// In the host: the sum of each argument times its position, so every argument counts in its own place.
#[allow(clippy::too_many_arguments)]
extern "C" fn host_weighted_sum(
    a1: u64,
    a2: u64,
    a3: u64,
    a4: u64,
    a5: u64,
    a6: u64,
    a7: u64,
    a8: u64,
    a9: u64,
    a10: u64,
    a11: u64,
    a12: u64,
) -> u64 {
    [a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12].iter().zip(1..).map(|(a, i)| a * i).sum()
}

/// The host buffer the variadic test's snprintf writes (the host's memory: the domain could not).
static FORMATTED: std::sync::Mutex<[u8; 64]> = std::sync::Mutex::new([0; 64]);

type Snprintf = unsafe extern "C" fn(*mut libc::c_char, usize, *const libc::c_char, ...) -> libc::c_int;

/// In a domain: format ten integers with `out` (snprintf behind an outward stub) into `buf`: four of them on the
/// stack.
extern "C" fn format_ten(out: Snprintf, buf: *mut libc::c_char) -> u64 {
    // SAFETY: `out` is snprintf; `buf` has 64 bytes; the format takes ten ints.
    let n = unsafe { out(buf, 64, c"%d %d %d %d %d %d %d %d %d %d".as_ptr(), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10) };
    n as u64
}

#[test]
#[ignore = "needs PKU"]
fn a_host_function_called_out_of_a_domain_gets_its_stack_arguments() {
    let d = TestDomain::new();
    // host_weighted_sum takes twelve integers (six on the stack) and returns normally.
    let stub = outward_for(f(host_weighted_sum as *const ())).expect("an outward slot");
    let expected: u64 = (1..=12).map(|i| i * i).sum();
    assert_eq!(d.call(f(call_out_with_twelve as *const ()), &[stub as u64]).unwrap().int, expected);
    // Called from the host itself, the stub passes them on too.
    // SAFETY: the stub stands for host_weighted_sum.
    let direct: extern "C" fn(u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64) -> u64 =
        unsafe { std::mem::transmute(stub) };
    assert_eq!(direct(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), expected);

    // A variadic function: snprintf with ten integers.
    // snprintf takes a buffer, its size, a format and what the format names (at most 16 words on the
    // stack here).
    let stub = outward_for(f(libc::snprintf as *const ())).expect("an outward slot");
    let mut buf = FORMATTED.lock().unwrap_or_else(|e| e.into_inner());
    let n = d.call(f(format_ten as *const ()), &[stub as u64, buf.as_mut_ptr() as u64]).unwrap().int;
    let text = std::ffi::CStr::from_bytes_until_nul(&buf[..]).expect("a C string").to_str().expect("ASCII");
    assert_eq!(text, "1 2 3 4 5 6 7 8 9 10");
    assert_eq!(n as usize, text.len());
}

/// The rights of the domain the nesting test uses (set by the test before it calls in).
static NESTED_RIGHTS: AtomicU32 = AtomicU32::new(0);
/// And its stack.
static NESTED_STACK_START: AtomicU64 = AtomicU64::new(0);
static NESTED_STACK_END: AtomicU64 = AtomicU64::new(0);
static NESTED_INNER_RSP: AtomicU64 = AtomicU64::new(0);
static NESTED_FAULT_SIGNAL: AtomicU64 = AtomicU64::new(0);

/// In the host, called out of the domain (depth 2): call into the same domain again (depth 3), once to see where
/// its stack is and once into a fault; return 100 when the fault came back as an error.
extern "C" fn host_calls_back_in(_: u64) -> u64 {
    let stack = NESTED_STACK_START.load(Ordering::SeqCst) as usize..NESTED_STACK_END.load(Ordering::SeqCst) as usize;
    let top = nested_stack_top(stack).expect("called out of a domain");
    let rights = Pkru(NESTED_RIGHTS.load(Ordering::SeqCst));
    let args = RegArgs::default();
    // SAFETY: stack_pointer takes nothing; the stack is the domain's own, below the part its outer call uses.
    let inner = unsafe {
        super::call(f(stack_pointer as *const ()), &args, rights, top, None, last_thread_pointer(), &FLOAT, None)
    }
    .unwrap()
    .unwrap();
    NESTED_INNER_RSP.store(inner.int, Ordering::SeqCst);
    // SAFETY: read_word takes one pointer (null here, on purpose).
    let fault = unsafe {
        super::call(f(read_word as *const ()), &args, rights, top, None, last_thread_pointer(), &FLOAT, None)
    }
    .unwrap()
    .unwrap_err();
    // Not a signal: 0, which the test's assertion refuses.
    let signal = if let GateFault::Signal(fault) = fault { fault.signal } else { 0 };
    NESTED_FAULT_SIGNAL.store(signal as u64, Ordering::SeqCst);
    100
}

#[test]
#[ignore = "needs PKU"]
fn nested_calls_host_domain_host_domain_with_a_fault_at_depth_three() {
    let d = TestDomain::new();
    NESTED_RIGHTS.store(d.rights.0, Ordering::SeqCst);
    NESTED_STACK_START.store(d.stack.start() as u64, Ordering::SeqCst);
    NESTED_STACK_END.store(d.stack.end() as u64, Ordering::SeqCst);
    // host_calls_back_in takes one integer and returns normally.
    let stub = outward_for(f(host_calls_back_in as *const ())).expect("an outward slot");
    let outer = d.call(f(call_out as *const ()), &[stub as u64, 0]);
    assert_eq!(outer.unwrap().int, 101, "the outer call went on after the fault at depth three");
    assert_eq!(NESTED_FAULT_SIGNAL.load(Ordering::SeqCst), libc::SIGSEGV as u64);
    let inner = NESTED_INNER_RSP.load(Ordering::SeqCst) as usize;
    assert!(d.stack.contains(inner), "the inner call ran on the domain's stack");
    assert!(inner < d.stack.end() as usize - 256, "below the outer call's frames ({inner:#x})");
    assert!(
        nested_stack_top(d.stack.start() as usize..d.stack.end() as usize).is_none(),
        "back in the host, outside every domain"
    );
    assert_eq!(d.call(f(add as *const ()), &[1, 2]).unwrap().int, 3);
}

extern "C" fn host_breakpoint(x: u64) -> u64 {
    breakpoint();
    x
}

#[test]
#[ignore = "needs PKU"]
fn a_fault_in_the_host_while_a_domain_has_called_out_is_the_hosts() {
    let child = || {
        // SAFETY: installs a plain handler that only bumps an atomic.
        unsafe { libc::signal(libc::SIGTRAP, host_trap_handler as *const () as usize) };
        let d = TestDomain::new();
        // host_breakpoint takes one integer and returns normally (after its trap is handled).
        let stub = outward_for(f(host_breakpoint as *const ())).expect("an outward slot");
        assert_eq!(d.call(f(call_out as *const ()), &[stub as u64, 6]).unwrap().int, 7);
        assert_eq!(HOST_TRAPS.load(Ordering::SeqCst), 1, "the host's trap reached the host's handler");
        println!("child: host fault while outside went to the host");
    };
    in_a_child_that_says!("outward-host-fault", "went to the host", child);
}

extern "C" fn spin_forever() {
    loop {
        std::hint::spin_loop();
    }
}

#[test]
#[ignore = "needs PKU"]
fn a_call_past_its_deadline_is_interrupted_and_a_prompt_one_is_not() {
    let d = TestDomain::new();
    let mut args = RegArgs::default();
    // SAFETY: spin_forever takes nothing; the stack is the domain's own.
    let stuck = unsafe {
        super::call(
            f(spin_forever as *const ()),
            &args,
            d.rights,
            d.stack.end(),
            Some(Duration::from_millis(20)),
            d.thread_pointer(),
            &FLOAT,
            None,
        )
    };
    let fault = stuck.unwrap().unwrap_err().signalled();
    assert_eq!((fault.signal, fault.code), (timeout_signal(), libc::SI_QUEUE));
    args.ints[..2].copy_from_slice(&[2, 2]);
    // SAFETY: add takes two integers.
    let prompt = unsafe {
        super::call(
            f(add as *const ()),
            &args,
            d.rights,
            d.stack.end(),
            Some(Duration::from_secs(60)),
            d.thread_pointer(),
            &FLOAT,
            None,
        )
    };
    assert_eq!(prompt.unwrap().unwrap().int, 4);
    assert!(!watchdog::armed(), "no deadline is left armed after the call");
}

static SLOW_HOST_ENTERED: AtomicU64 = AtomicU64::new(0);
static SLOW_HOST_DONE: AtomicU64 = AtomicU64::new(0);

/// The domain's deadline in the test below: long enough that even an emulated, loaded machine has the domain call
/// the host well before it passes.
const CALL_OUT_DEADLINE: Duration = Duration::from_secs(2);

/// In the host, called out of a domain: busy until the domain's deadline has surely passed, then return. The deadline
/// was armed before the domain called out, so waiting the whole deadline from here outlasts it, however slowly the
/// domain got here.
extern "C" fn slow_host(x: u64) -> u64 {
    SLOW_HOST_ENTERED.store(1, Ordering::SeqCst);
    let until = std::time::Instant::now() + CALL_OUT_DEADLINE + Duration::from_millis(50);
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
    SLOW_HOST_DONE.store(1, Ordering::SeqCst);
    x
}

/// In a domain: call the host, then never return.
extern "C" fn call_out_then_spin(out: extern "C" fn(u64) -> u64) {
    out(1);
    spin_forever();
}

#[test]
#[ignore = "needs PKU"]
fn a_deadline_passing_while_the_domain_calls_the_host_interrupts_the_domain_once_it_is_back() {
    let d = TestDomain::new();
    // slow_host takes one integer and returns normally.
    let stub = outward_for(f(slow_host as *const ())).expect("an outward slot");
    let mut args = RegArgs::default();
    args.ints[0] = stub as u64;
    // SAFETY: call_out_then_spin takes one function pointer; the stack is the domain's own.
    let r = unsafe {
        super::call(
            f(call_out_then_spin as *const ()),
            &args,
            d.rights,
            d.stack.end(),
            Some(CALL_OUT_DEADLINE),
            d.thread_pointer(),
            &FLOAT,
            None,
        )
    };
    assert_eq!(SLOW_HOST_ENTERED.load(Ordering::SeqCst), 1, "the domain called the host before its deadline");
    assert_eq!(r.unwrap().unwrap_err().signalled().signal, timeout_signal());
    assert_eq!(SLOW_HOST_DONE.load(Ordering::SeqCst), 1, "the host's code ran to its end");
}

/// Zeroed host memory: what a faulty domain's registers point at in the tests below. Read as a gate frame it
/// would give the host all rights and a null stack.
static ZEROES: [u64; 64] = [0; 64];

std::arch::global_asm!(
    // In a domain: return 7 with every callee-saved register but rsp := rdi, and the direction flag set.
    ".globl ward_test_clobber_callee_saved",
    "ward_test_clobber_callee_saved:",
    "mov rbx, rdi",
    "mov rbp, rdi",
    "mov r12, rdi",
    "mov r13, rdi",
    "mov r14, rdi",
    "mov r15, rdi",
    "std",
    "mov eax, 7",
    "ret",
    // In a domain: call rdi(rsi) with the direction flag set; return what it returns.
    ".globl ward_test_call_out_backwards",
    "ward_test_call_out_backwards:",
    "push rbx",
    "mov rax, rdi",
    "mov rdi, rsi",
    "std",
    "call rax",
    "cld",
    "pop rbx",
    "ret",
    // In a domain: MXCSR := edi and the x87 control word := si, then every x87 register in use (an MMX move, no
    // `emms`); then call rdx when it is not null and return what it returns, else return 7.
    ".globl ward_test_set_float_control",
    "ward_test_set_float_control:",
    "push rbx",
    "sub rsp, 16",
    "mov dword ptr [rsp], edi",
    "ldmxcsr dword ptr [rsp]",
    "mov word ptr [rsp + 4], si",
    "fldcw word ptr [rsp + 4]",
    "movq mm0, rdi",
    "mov eax, 7",
    "test rdx, rdx",
    "jz 2f",
    "call rdx",
    "2:",
    "add rsp, 16",
    "pop rbx",
    "ret",
    // In a domain: return MXCSR in the low half and the x87 control word in the high half.
    ".globl ward_test_float_control",
    "ward_test_float_control:",
    "sub rsp, 8",
    "stmxcsr dword ptr [rsp]",
    "fnstcw word ptr [rsp + 4]",
    "mov eax, dword ptr [rsp]",
    "movzx ecx, word ptr [rsp + 4]",
    "shl rcx, 32",
    "or rax, rcx",
    "add rsp, 8",
    "ret",
    // In a domain: return the x87 status word, after waiting for pending x87 exceptions (one flagged and unmasked
    // traps there, on hardware).
    ".globl ward_test_x87_wait_and_status",
    "ward_test_x87_wait_and_status:",
    "fwait",
    "fnstsw ax",
    "movzx eax, ax",
    "ret",
    // In a domain: tgkill(rdi, rsi, rdx) by system call (a signal for this very thread), then return 7.
    ".globl ward_test_signal_this_thread",
    "ward_test_signal_this_thread:",
    "mov eax, 234",
    "syscall",
    "mov eax, 7",
    "ret",
    // In a domain: call `out` (rdi) with the stack pointer moved to the end of the domain's stack (rsi), so the
    // stack arguments an outward stub passes on would lie in the guard page past it.
    ".globl ward_test_call_out_from_the_stack_end",
    "ward_test_call_out_from_the_stack_end:",
    "mov rsp, rsi",
    "call rdi",
    "ud2",
    // In a domain: enter the outward stubs' common body past the stub at rdi, with slot esi.
    ".globl ward_test_jump_into_outward_common",
    "ward_test_jump_into_outward_common:",
    "mov r11d, esi",
    "lea rax, [rdi + 6]",
    "jmp rax",
);

extern "C" {
    fn ward_test_clobber_callee_saved(to: u64) -> u64;
    fn ward_test_call_out_backwards(out: extern "C" fn(u64) -> u64, x: u64) -> u64;
    fn ward_test_jump_into_outward_common(stub: u64, slot: u64) -> u64;
    fn ward_test_call_out_from_the_stack_end(out: u64, stack_end: u64) -> u64;
    fn ward_test_set_float_control(mxcsr: u64, x87_control: u64, then: u64) -> u64;
    fn ward_test_float_control() -> u64;
    fn ward_test_x87_wait_and_status() -> u64;
    fn ward_test_signal_this_thread(pid: u64, tid: u64, signal: u64) -> u64;
}

/// Whether the direction flag is set.
fn direction_flag() -> bool {
    let flags: u64;
    // SAFETY: reads the flags through the stack (a push and a pop).
    unsafe { asm!("pushfq", "pop {}", out(reg) flags, options(nomem, preserves_flags)) };
    flags & (1 << 10) != 0
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_that_breaks_the_calling_convention_returns_to_a_host_with_its_own_registers() {
    let d = TestDomain::new();
    let zeroes = ZEROES.as_ptr() as u64 + 256;
    for _ in 0..3 {
        let r = d.call(f(ward_test_clobber_callee_saved as *const ()), &[zeroes]);
        assert!(!direction_flag(), "the direction flag is clear again in the host");
        assert_eq!(r.unwrap().int, 7, "the call returned its result");
    }
    assert_eq!(d.call(f(add as *const ()), &[40, 2]).unwrap().int, 42, "the next call works");
    let copied: Vec<u64> = (0..1000).collect::<Vec<_>>().clone();
    assert_eq!(copied[999], 999, "copies in the host go forwards");
}

extern "C" fn host_sees_direction_flag(x: u64) -> u64 {
    if direction_flag() {
        u64::MAX
    } else {
        x + 1
    }
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_that_calls_the_host_with_the_direction_flag_set_reaches_it_clear() {
    let d = TestDomain::new();
    // host_sees_direction_flag takes one integer and returns normally.
    let stub = outward_for(f(host_sees_direction_flag as *const ())).expect("an outward slot");
    assert_eq!(d.call(f(ward_test_call_out_backwards as *const ()), &[stub as u64, 1]).unwrap().int, 2);
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_that_jumps_into_the_outward_stubs_with_a_slot_of_no_stub_faults_there() {
    let d = TestDomain::new();
    let stub = outward_for(f(host_double as *const ())).expect("an outward slot") as u64;
    let jump = f(ward_test_jump_into_outward_common as *const ());
    // The last slot is in range but has no stub: the tests and the backends in this process take far fewer.
    assert_eq!(OUTWARD_TARGETS[OUTWARD_SLOTS - 1].load(Ordering::Acquire), 0, "the last outward slot is free");
    for slot in [(OUTWARD_SLOTS - 1) as u64, OUTWARD_SLOTS as u64, u64::from(u32::MAX)] {
        let ended = d.call(jump, &[stub, slot]).unwrap_err();
        assert!(!matches!(ended, GateFault::Refused(_)), "slot {slot}: no check refused it: {ended:?}");
        let fault = ended.signalled();
        assert_eq!((fault.signal, fault.pc), (libc::SIGILL, ward_mpk_refuse as *const () as usize), "slot {slot}");
    }
    assert_eq!(d.call(f(call_out as *const ()), &[stub, 20]).unwrap().int, 41, "the stub itself still works");
}

/// Round toward zero, flush to zero, denormals are zero, every exception masked; x87 rounding toward zero: a
/// state no host runs with.
const ODD_FLOAT: FloatState = FloatState { mxcsr: 0x1f80 | 0x6000 | 0x8000 | 0x0040, x87_control: 0x0f7f };

/// The x87 tag word: 0xffff when every x87 register is empty.
fn x87_tag_word() -> u16 {
    let mut environment = [0u16; 14];
    // SAFETY: fnstenv stores the 28-byte x87 environment into the array (the tag word is its fifth word) and
    // masks every x87 exception; fldenv loads the same environment back, undoing that.
    unsafe {
        asm!("fnstenv [{e}]", "fldenv [{e}]", e = in(reg) environment.as_mut_ptr(), options(nostack, preserves_flags))
    };
    environment[4]
}

/// One tenth, computed at run time: rounded to nearest (up, in binary) only under the host's own control state;
/// rounded toward zero it is one unit in the last place less.
fn a_tenth_is_rounded_to_nearest() -> bool {
    black_box(1.0f64) / black_box(10.0f64) == 0.1
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_keeps_the_floating_point_control_it_sets_and_the_host_keeps_its_own() {
    let d = TestDomain::new();
    let host = FloatState::of_this_thread();
    let domain = FloatControl::new(host);
    let set = f(ward_test_set_float_control as *const ());
    let args = [u64::from(ODD_FLOAT.mxcsr), u64::from(ODD_FLOAT.x87_control), 0];
    assert_eq!(d.call_with(&domain, set, &args).unwrap().int, 7);
    assert_eq!(FloatState::of_this_thread(), host, "the host has its own control state back");
    assert_eq!(x87_tag_word(), 0xffff, "the x87 registers are empty again in the host");
    assert!(a_tenth_is_rounded_to_nearest(), "the host's arithmetic rounds as before");
    assert_eq!(domain.get(), ODD_FLOAT, "the domain's state is kept");
    let seen = d.call_with(&domain, f(ward_test_float_control as *const ()), &[]).unwrap().int;
    let seen = FloatState { mxcsr: seen as u32 & !0x3f, x87_control: (seen >> 32) as u16 };
    assert_eq!(seen, ODD_FLOAT, "the domain's next call starts with the state it left");
    assert_eq!(FloatState::of_this_thread(), host, "and the host still has its own");
}

/// What the host sees while a domain has called it: its control state, packed, or all ones when an x87 register
/// is in use.
extern "C" fn host_float_control() -> u64 {
    if x87_tag_word() != 0xffff {
        return u64::MAX;
    }
    let state = FloatState::of_this_thread();
    u64::from(state.mxcsr) | u64::from(state.x87_control) << 32
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_that_calls_the_host_reaches_it_with_the_hosts_floating_point_control() {
    let d = TestDomain::new();
    let host = FloatState::of_this_thread();
    let domain = FloatControl::new(host);
    let stub = outward_for(f(host_float_control as *const ())).expect("an outward slot") as u64;
    let args = [u64::from(ODD_FLOAT.mxcsr), u64::from(ODD_FLOAT.x87_control), stub];
    let seen = d.call_with(&domain, f(ward_test_set_float_control as *const ()), &args).unwrap().int;
    assert_eq!(
        seen,
        u64::from(host.mxcsr) | u64::from(host.x87_control) << 32,
        "the host function ran with the host's"
    );
    assert_eq!(domain.get(), ODD_FLOAT, "the domain had its own back after the call out, and kept it");
    assert_eq!(FloatState::of_this_thread(), host);
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_that_faults_after_changing_its_floating_point_control_leaves_the_host_its_own() {
    let d = TestDomain::new();
    let host = FloatState::of_this_thread();
    let domain = FloatControl::new(host);
    // A call to address 8 faults on the fetch, after the state has changed.
    let args = [u64::from(ODD_FLOAT.mxcsr), u64::from(ODD_FLOAT.x87_control), 8];
    let fault = d.call_with(&domain, f(ward_test_set_float_control as *const ()), &args).unwrap_err().signalled();
    assert_eq!(fault.signal, libc::SIGSEGV);
    assert_eq!(FloatState::of_this_thread(), host, "the host has its own control state back");
    assert_eq!(x87_tag_word(), 0xffff, "the x87 registers are empty again in the host");
    assert!(a_tenth_is_rounded_to_nearest());
    assert_eq!(domain.get(), host, "a failed call's state is not kept");
}

/// The x87 status word.
fn x87_status_word() -> u16 {
    let mut status = 0u16;
    // SAFETY: fnstsw only stores the status word into the local.
    unsafe { asm!("fnstsw word ptr [{s}]", s = in(reg) &mut status, options(nostack, preserves_flags)) };
    status
}

/// The x87 zero-divide exception: its flag in the status word, its mask in the control word.
const X87_ZERO_DIVIDE: u16 = 0x04;

/// Divide by zero on the x87 with the exception masked: the result is infinity and the zero-divide flag stays set.
fn flag_an_x87_zero_divide() {
    let zero = 0.0f32;
    // SAFETY: pushes 1, divides it by the local zero (masked: infinity) and pops it, leaving the x87 stack empty.
    unsafe { asm!("fld1", "fdiv dword ptr [{z}]", "fstp st(0)", z = in(reg) &zero, options(nostack, readonly)) };
}

#[test]
fn under_round_toward_zero_a_tenth_is_not_rounded_to_nearest() {
    let host = FloatState::of_this_thread();
    let toward_zero = host.mxcsr | 0x6000;
    // SAFETY: ldmxcsr with the host's own control bits and round toward zero, then the host's MXCSR back.
    unsafe { asm!("ldmxcsr dword ptr [{m}]", m = in(reg) &toward_zero, options(nostack, readonly)) };
    let rounded = a_tenth_is_rounded_to_nearest();
    // SAFETY: ldmxcsr with the host's own MXCSR, as it was before the test.
    unsafe { asm!("ldmxcsr dword ptr [{m}]", m = in(reg) &host.mxcsr, options(nostack, readonly)) };
    assert!(!rounded, "the helper the floating-point tests use tells the two roundings apart");
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_that_unmasks_an_x87_exception_the_host_left_flagged_starts_with_it_cleared() {
    let d = TestDomain::new();
    let host = FloatState::of_this_thread();
    let domain = FloatControl::new(FloatState { x87_control: host.x87_control & !X87_ZERO_DIVIDE, ..host });
    flag_an_x87_zero_divide();
    assert_ne!(x87_status_word() & X87_ZERO_DIVIDE, 0, "the host has a zero divide flagged");
    let status = d.call_with(&domain, f(ward_test_x87_wait_and_status as *const ()), &[]).map(|r| r.int as u16);
    assert_eq!(status.map(|s| s & X87_ZERO_DIVIDE), Ok(0), "the domain starts with no x87 exception flagged");
    assert_eq!(FloatState::of_this_thread(), host);
}

static HOST_HANDLER_RAN: AtomicU64 = AtomicU64::new(0);

/// A host's handler: it uses its stack (a call, locals) and counts.
extern "C" fn count_host_signal(_: libc::c_int) {
    let mut words = black_box([0u64; 32]);
    words[7] = HOST_HANDLER_RAN.load(Ordering::SeqCst);
    HOST_HANDLER_RAN.store(black_box(words)[7] + 1, Ordering::SeqCst);
}

#[test]
#[ignore = "needs PKU"]
fn a_host_handler_runs_when_its_signal_comes_inside_a_domain_or_on_wards_alternate_stack() {
    let d = TestDomain::new();
    // A signal no other test uses, with a host handler that asks for the alternate stack.
    let signal = libc::SIGRTMIN() + 9;
    // SAFETY: all-zero is a valid sigaction; the handler is a plain C-ABI function.
    unsafe {
        let mut action: libc::sigaction = MaybeUninit::zeroed().assume_init();
        action.sa_sigaction = count_host_signal as *const () as usize;
        action.sa_flags = libc::SA_ONSTACK;
        assert_eq!(libc::sigaction(signal, &action, ptr::null_mut()), 0);
    }
    // This thread has ward's alternate stack after its first call; the backend adopts handlers on each load.
    assert_eq!(d.call(f(add as *const ()), &[1, 2]).unwrap().int, 3);
    adopt_host_handlers();
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid() as u64, libc::gettid() as u64) };
    let inside = d.call(f(ward_test_signal_this_thread as *const ()), &[pid, tid, signal as u64]);
    assert_eq!(inside.map(|r| r.int), Ok(7), "the domain goes on after the host's handler");
    assert_eq!(HOST_HANDLER_RAN.load(Ordering::SeqCst), 1, "the host's handler ran for the signal inside the domain");
    // SAFETY: raise signals this thread, whose handler is the host's, wrapped.
    assert_eq!(unsafe { libc::raise(signal) }, 0);
    assert_eq!(HOST_HANDLER_RAN.load(Ordering::SeqCst), 2, "and for one in the host, on ward's alternate stack");
    // SAFETY: back to the default action for a signal nothing sends any more.
    unsafe { libc::signal(signal, libc::SIG_DFL) };
}

static LATE_HANDLER_RAN: AtomicU64 = AtomicU64::new(0);
static TRAP_HANDLER_RAN: AtomicU64 = AtomicU64::new(0);

extern "C" fn count_late_signal(_: libc::c_int) {
    LATE_HANDLER_RAN.fetch_add(black_box(1), Ordering::SeqCst);
}

extern "C" fn count_trap(_: libc::c_int) {
    TRAP_HANDLER_RAN.fetch_add(black_box(1), Ordering::SeqCst);
}

/// The action the kernel has for `signal`, past any interposer.
fn kernels_action(signal: libc::c_int) -> libc::sigaction {
    // SAFETY: all-zero is a valid sigaction; the query only fills it.
    unsafe {
        let mut action: libc::sigaction = MaybeUninit::zeroed().assume_init();
        assert_eq!(real_sigaction(signal, ptr::null(), &mut action), 0);
        action
    }
}

/// A plain handler's action: empty mask, no flags.
fn plain_action(handler: libc::sighandler_t) -> libc::sigaction {
    // SAFETY: all-zero is a valid sigaction.
    let mut action: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
    action.sa_sigaction = handler;
    action
}

#[test]
#[ignore = "needs PKU"]
fn a_handler_the_host_installs_through_ward_is_wrapped_or_chained_to_and_reported_as_the_hosts() {
    let d = TestDomain::new();
    assert_eq!(d.call(f(add as *const ()), &[1, 2]).unwrap().int, 3, "ward's handlers are in");
    // A handler for a signal ward does not handle, installed after ward's (no SA_ONSTACK).
    let signal = libc::SIGRTMIN() + 10;
    let late = plain_action(count_late_signal as *const () as libc::sighandler_t);
    // SAFETY: valid actions; the handler is a plain C-ABI function.
    assert_eq!(unsafe { host_sigaction(signal, &late, ptr::null_mut()) }, 0);
    assert_eq!(kernels_action(signal).sa_sigaction, ward_mpk_host_signal_entry as *const () as usize, "wrapped");
    let mut reported = plain_action(libc::SIG_DFL);
    // SAFETY: a query into a valid action.
    assert_eq!(unsafe { host_sigaction(signal, ptr::null(), &mut reported) }, 0);
    assert_eq!(reported.sa_sigaction, late.sa_sigaction, "the host is told its own handler");
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid() as u64, libc::gettid() as u64) };
    let inside = d.call(f(ward_test_signal_this_thread as *const ()), &[pid, tid, signal as u64]);
    assert_eq!(inside.map(|r| r.int), Ok(7));
    assert_eq!(LATE_HANDLER_RAN.load(Ordering::SeqCst), 1, "the late handler ran for the signal inside the domain");
    // Asked to be reset once it has run, it is, and the host is told so.
    let mut once = late;
    once.sa_flags = libc::SA_RESETHAND;
    // SAFETY: valid actions, as above.
    assert_eq!(unsafe { host_sigaction(signal, &once, ptr::null_mut()) }, 0);
    // SAFETY: raise signals this thread, whose handler is the host's, wrapped.
    assert_eq!(unsafe { libc::raise(signal) }, 0);
    assert_eq!(LATE_HANDLER_RAN.load(Ordering::SeqCst), 2, "the one-shot handler ran");
    // SAFETY: a query into a valid action.
    assert_eq!(unsafe { host_sigaction(signal, ptr::null(), &mut reported) }, 0);
    assert_eq!(reported.sa_sigaction, libc::SIG_DFL, "the host is told its handler was reset");
    assert_eq!(kernels_action(signal).sa_sigaction, libc::SIG_DFL, "and the kernel has the default action");
    // SAFETY: the default action back, through ward.
    assert_eq!(unsafe { host_sigaction(signal, &plain_action(libc::SIG_DFL), ptr::null_mut()) }, 0);
    assert_eq!(kernels_action(signal).sa_sigaction, libc::SIG_DFL, "SIG_DFL reaches the kernel");

    // A handler for a signal ward handles: recorded for ward to chain to; ward's stays in the kernel.
    let trap = plain_action(count_trap as *const () as libc::sighandler_t);
    let mut before = plain_action(libc::SIG_DFL);
    // SAFETY: valid actions; the handler is a plain C-ABI function.
    assert_eq!(unsafe { host_sigaction(libc::SIGTRAP, &trap, &mut before) }, 0);
    assert_eq!(kernels_action(libc::SIGTRAP).sa_sigaction, ward_mpk_signal_entry as *const () as usize);
    // SAFETY: raise signals this thread; SIGTRAP from raise is the host's, which ward passes on.
    assert_eq!(unsafe { libc::raise(libc::SIGTRAP) }, 0);
    assert_eq!(TRAP_HANDLER_RAN.load(Ordering::SeqCst), 1, "the host's SIGTRAP handler got the host's SIGTRAP");
    // SAFETY: the host's previous action back, through ward.
    assert_eq!(unsafe { host_sigaction(libc::SIGTRAP, &before, ptr::null_mut()) }, 0);
}

/// Round down, in both units: another state no host runs with.
const ROUND_DOWN: FloatState = FloatState { mxcsr: 0x1f80 | 0x2000, x87_control: 0x077f };

thread_local! {
    /// The domain the floating-point nesting test calls back into: its rights and its stack.
    static FLOAT_NESTING_DOMAIN: Cell<(u32, usize, usize)> = const { Cell::new((0, 0, 0)) };
}

/// In the host, called out of a domain: call into the same domain twice, once to read its floating-point control
/// and once to set it to [`ROUND_DOWN`]; return what the first saw, packed.
extern "C" fn host_calls_back_in_for_float_control(_: u64) -> u64 {
    let (rights, start, end) = FLOAT_NESTING_DOMAIN.with(Cell::get);
    let top = nested_stack_top(start..end).expect("called out of a domain");
    // What the backend would pass: the domain's control as of its last return, which is not what it has now.
    let as_of_last_return = FloatControl::new(FloatState::of_this_thread());
    let args = RegArgs::default();
    // SAFETY: ward_test_float_control takes nothing; the stack is the domain's own, below the part in use.
    let seen = unsafe {
        super::call(
            f(ward_test_float_control as *const ()),
            &args,
            Pkru(rights),
            top,
            None,
            last_thread_pointer(),
            &as_of_last_return,
            None,
        )
    };
    let mut set = RegArgs::default();
    set.ints[..3].copy_from_slice(&[u64::from(ROUND_DOWN.mxcsr), u64::from(ROUND_DOWN.x87_control), 0]);
    // SAFETY: ward_test_set_float_control takes three integers (no function to call: 0); the stack as above.
    let set = unsafe {
        super::call(
            f(ward_test_set_float_control as *const ()),
            &set,
            Pkru(rights),
            top,
            None,
            last_thread_pointer(),
            &as_of_last_return,
            None,
        )
    };
    assert_eq!(set.ok().and_then(Result::ok).map(|r| r.int), Some(7));
    seen.ok().and_then(Result::ok).map_or(u64::MAX, |r| r.int)
}

#[test]
#[ignore = "needs PKU"]
fn a_call_back_into_a_domain_that_called_out_continues_its_floating_point_control() {
    let d = TestDomain::new();
    FLOAT_NESTING_DOMAIN.with(|c| c.set((d.rights.0, d.stack.start() as usize, d.stack.end() as usize)));
    let host = FloatState::of_this_thread();
    let domain = FloatControl::new(host);
    let stub = outward_for(f(host_calls_back_in_for_float_control as *const ())).expect("an outward slot") as u64;
    let args = [u64::from(ODD_FLOAT.mxcsr), u64::from(ODD_FLOAT.x87_control), stub];
    let seen = d.call_with(&domain, f(ward_test_set_float_control as *const ()), &args).unwrap().int;
    let seen = FloatState { mxcsr: seen as u32 & !0x3f, x87_control: (seen >> 32) as u16 };
    assert_eq!(seen, ODD_FLOAT, "the nested call started with the control the domain had when it called out");
    assert_eq!(domain.get(), ROUND_DOWN, "and the domain went on with the control the nested call left");
    assert_eq!(FloatState::of_this_thread(), host, "the host has its own");
}

type Sprintf = unsafe extern "C" fn(*mut std::ffi::c_char, *const std::ffi::c_char, ...) -> libc::c_int;

/// In a domain: `sprintf(dst, format, word)` through the stub; what it returns.
extern "C" fn format_through(
    stub: Sprintf,
    dst: *mut std::ffi::c_char,
    format: *const std::ffi::c_char,
    word: *const std::ffi::c_char,
) -> u64 {
    // SAFETY: the stub stands for sprintf; the arguments are the test's.
    unsafe { stub(dst, format, word) as u64 }
}

#[test]
#[ignore = "needs PKU"]
fn a_sprintf_that_would_run_past_the_domains_memory_faults_in_the_domain_and_one_that_fits_runs() {
    let d = TestDomain::new();
    let check = crate::domain::checks::for_import("sprintf");
    let stub = outward_for_checked(f(libc::sprintf as *const ()), check).expect("an outward slot") as u64;
    let format = c"%s";
    let short = c"hello";
    let call = f(format_through as *const ());
    let fits = d.call(call, &[stub, d.data.start() as u64, format.as_ptr() as u64, short.as_ptr() as u64]);
    assert_eq!(fits.map(|r| r.int), Ok(5));
    // SAFETY: the domain's data, which the host may read.
    assert_eq!(unsafe { std::slice::from_raw_parts(d.data.start(), 6) }, b"hello\0");
    // Sixteen bytes before the end of the domain's data, and past it the guard page: 33 bytes do not fit.
    let long = c"thirty-two characters, no fewer.";
    let near_end = d.data.end().wrapping_sub(16) as u64;
    let fault = d.call(call, &[stub, near_end, format.as_ptr() as u64, long.as_ptr() as u64]).unwrap_err().signalled();
    assert_eq!(fault.signal, libc::SIGSEGV, "the check touched the page past the end, as the domain");
    assert_eq!(fault.addr, d.data.end() as usize, "at the first byte past the domain's memory");
}

/// In a domain: the thread pointer it runs with (`%fs:0`).
extern "C" fn thread_pointer_here() -> u64 {
    let pointer: u64;
    // SAFETY: reads the first word of the thread block FS points at.
    unsafe { asm!("mov {}, qword ptr fs:[0]", out(reg) pointer, options(nostack, readonly, preserves_flags)) };
    pointer
}

/// In a domain: the stack guard compiled C code checks (`%fs:0x28`).
extern "C" fn stack_guard_here() -> u64 {
    let guard: u64;
    // SAFETY: reads the stack guard word of the thread block FS points at.
    unsafe { asm!("mov {}, qword ptr fs:[0x28]", out(reg) guard, options(nostack, readonly, preserves_flags)) };
    guard
}

/// In a domain: the 32-bit word at `offset` from the thread pointer, sign-extended.
extern "C" fn thread_word_here(offset: u64) -> u64 {
    let word: i32;
    // SAFETY: reads a word of the thread block FS points at (the tests pass offsets inside it).
    unsafe {
        asm!("mov {:e}, dword ptr fs:[{}]", out(reg) word, in(reg) offset, options(nostack, readonly, preserves_flags))
    };
    i64::from(word) as u64
}

fn host_fs_base() -> u64 {
    let base: u64;
    // SAFETY: reads the FS base register (the machines with PKU enable FSGSBASE, which require_pku checks).
    unsafe { asm!("rdfsbase {}", out(reg) base, options(nomem, nostack, preserves_flags)) };
    base
}

#[test]
#[ignore = "needs PKU"]
fn a_domain_runs_with_a_thread_block_of_its_own_and_the_host_gets_its_own_back() {
    let d = TestDomain::new();
    let host = host_fs_base();
    let inside = d.call(f(thread_pointer_here as *const ()), &[]).unwrap().int;
    assert_eq!(inside as usize, d.thread_pointer(), "the domain's %fs:0 names its own block");
    assert_ne!(inside, host, "not the host thread's");
    assert_eq!(host_fs_base(), host, "the host's FS base is back after the call");
    assert_eq!(d.call(f(stack_guard_here as *const ()), &[]).unwrap().int, stack_guard_here(), "the same guard");
    // The copy of the kernel's restartable-sequences area reads as unregistered (glibc's `sched_getcpu` then asks
    // the kernel instead of reading a stale processor number).
    if let Some((rseq_offset, _)) = crate::domain::thread_block::rseq_area() {
        let cpu_id = d.call(f(thread_word_here as *const ()), &[(rseq_offset + 4) as u64]).unwrap().int;
        assert_eq!(cpu_id as i64, -1, "the domain's rseq cpu_id");
    }
    // After a fault, too.
    assert!(d.call(f(read_word as *const ()), &[0]).is_err());
    assert_eq!(host_fs_base(), host, "the host's FS base is back after a fault");
    // A second thread gets a block of its own.
    let blocks = d.blocks.clone();
    let other = std::thread::spawn(move || blocks.pointer_for_this_thread().expect("a thread block")).join().unwrap();
    assert_ne!(other, d.thread_pointer(), "one block per thread");
}

/// In a domain: set errno through libc's `__errno_location` (as libm and strtod do) and read it back.
extern "C" fn set_errno_through_libc(value: u64) -> u64 {
    // SAFETY: glibc's errno of the running thread (inside a domain, the domain's block).
    unsafe {
        *libc::__errno_location() = value as i32;
        *libc::__errno_location() as u64
    }
}

/// In a domain: errno, through libc.
extern "C" fn errno_through_libc() -> u64 {
    // SAFETY: glibc's errno of the running thread (inside a domain, the domain's block), readable by it.
    unsafe { *libc::__errno_location() as u64 }
}

fn host_errno() -> i32 {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() }
}

fn set_host_errno(value: i32) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = value };
}

#[test]
#[ignore = "needs PKU"]
fn errno_written_in_a_domain_is_the_domains_per_thread_and_the_hosts_is_untouched() {
    let d = TestDomain::new();
    // The first call makes this thread's block (with system calls of its own, which may set errno).
    assert_eq!(d.call(f(add as *const ()), &[1, 2]).unwrap().int, 3);
    set_host_errno(5);
    assert_eq!(d.call(f(set_errno_through_libc as *const ()), &[libc::EDOM as u64]).unwrap().int, libc::EDOM as u64);
    assert_eq!(host_errno(), 5, "the host's errno is untouched");
    assert_eq!(d.call(f(errno_through_libc as *const ()), &[]).unwrap().int, libc::EDOM as u64, "kept");
    // Another thread writes its own errno in the domain; this thread's stays.
    let theirs = d.call_from_a_new_thread(f(set_errno_through_libc as *const ()), &[libc::ERANGE as u64]);
    assert_eq!(theirs.unwrap().int, libc::ERANGE as u64);
    assert_eq!(d.call(f(errno_through_libc as *const ()), &[]).unwrap().int, libc::EDOM as u64, "per thread");
}

thread_local! {
    /// A host thread-local, set after the test's domain made this thread's block (so the block's copy is stale).
    static HOST_LOCAL: Cell<u64> = const { Cell::new(0) };
}

static HOST_LOCAL_IN_HANDLER: AtomicU64 = AtomicU64::new(0);
static HOST_LOCAL_CALLED_OUT: AtomicU64 = AtomicU64::new(0);

extern "C" fn record_host_local_in_handler(_: libc::c_int) {
    HOST_LOCAL_IN_HANDLER.store(HOST_LOCAL.with(Cell::get), Ordering::SeqCst);
}

/// In the host, called out of a domain: record the host thread-local, return its argument.
extern "C" fn record_host_local_called_out(x: u64) -> u64 {
    HOST_LOCAL_CALLED_OUT.store(HOST_LOCAL.with(Cell::get), Ordering::SeqCst);
    x
}

#[test]
#[ignore = "needs PKU"]
fn host_code_a_domain_reaches_by_a_signal_or_a_call_out_reads_the_host_threads_locals() {
    let d = TestDomain::new();
    let signal = libc::SIGRTMIN() + 11;
    let action = plain_action(record_host_local_in_handler as *const () as libc::sighandler_t);
    // SAFETY: a valid action; the handler is a plain C-ABI function.
    assert_eq!(unsafe { host_sigaction(signal, &action, ptr::null_mut()) }, 0);
    assert_eq!(d.call(f(add as *const ()), &[1, 2]).unwrap().int, 3);
    HOST_LOCAL.with(|l| l.set(41));
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid() as u64, libc::gettid() as u64) };
    let inside = d.call(f(ward_test_signal_this_thread as *const ()), &[pid, tid, signal as u64]);
    assert_eq!(inside.map(|r| r.int), Ok(7));
    assert_eq!(HOST_LOCAL_IN_HANDLER.load(Ordering::SeqCst), 41, "the handler read the host thread's local");
    // record_host_local_called_out takes one integer and returns normally.
    let stub = outward_for(f(record_host_local_called_out as *const ())).expect("an outward slot");
    assert_eq!(d.call(f(call_out as *const ()), &[stub as u64, 1]).unwrap().int, 2);
    assert_eq!(HOST_LOCAL_CALLED_OUT.load(Ordering::SeqCst), 41, "the host function read the host thread's local");
    // SAFETY: back to the default action for a signal nothing sends any more.
    assert_eq!(unsafe { host_sigaction(signal, &plain_action(libc::SIG_DFL), ptr::null_mut()) }, 0);
}

#[test]
#[ignore = "needs PKU"]
fn a_thread_started_by_a_thread_that_has_called_a_domain_can_call_it_too() {
    let d = TestDomain::new();
    // This thread gives its restartable-sequences area up on its first call; glibc then registers none for the
    // threads it starts.
    assert_eq!(d.call(f(add as *const ()), &[1, 2]).unwrap().int, 3);
    // The new thread is prepared for gate calls (the call panics if it is not), and its call works.
    assert_eq!(d.call_from_a_new_thread(f(add as *const ()), &[20, 22]).map(|r| r.int), Ok(42));
}

static SETXID_RELEASE: AtomicU64 = AtomicU64::new(0);

/// Says it is inside (a word of domain memory), then waits until the host lets it go (a word of host memory, which
/// the domain may read).
extern "C" fn enter_then_wait(entered: *mut u64, release: *const AtomicU64) -> u64 {
    // SAFETY: the test passes a word of this domain's memory and a static of the host.
    unsafe {
        entered.write_volatile(1);
        while (*release).load(Ordering::SeqCst) == 0 {
            std::hint::spin_loop();
        }
    }
    7
}

#[test]
#[ignore = "needs PKU"]
fn setuid_in_another_thread_finishes_while_a_thread_is_inside_a_domain() {
    let d = TestDomain::new();
    // This thread has ward's alternate stack after its first call; the backend adopts handlers on each load.
    assert_eq!(d.call(f(add as *const ()), &[1, 2]).unwrap().int, 3);
    adopt_host_handlers();
    SETXID_RELEASE.store(0, Ordering::SeqCst);
    // SAFETY: the domain's data word, which nothing else uses now.
    unsafe { d.data_word().write_volatile(0) };
    let entered = d.data_word() as usize;
    let key = d.key.number();
    let (inside, setuid) = std::thread::scope(|s| {
        let helper = s.spawn(move || {
            allow_on_this_thread(key);
            let give_up = std::time::Instant::now() + Duration::from_secs(120);
            // SAFETY: the domain's data word; this thread may read the domain's key.
            while unsafe { (entered as *const u64).read_volatile() } == 0 && std::time::Instant::now() < give_up {
                std::thread::yield_now();
            }
            // glibc sends its set-id signal to every other thread, the one inside the domain among them, and waits
            // until each has handled it.
            let (sender, receiver) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                // SAFETY: setting the user id this process already has.
                let rc = unsafe { libc::setuid(libc::getuid()) };
                let _ = sender.send(rc);
            });
            let finished = receiver.recv_timeout(Duration::from_secs(120)).ok();
            SETXID_RELEASE.store(1, Ordering::SeqCst);
            finished
        });
        let inside = d.call(f(enter_then_wait as *const ()), &[entered as u64, ptr::addr_of!(SETXID_RELEASE) as u64]);
        (inside.map(|r| r.int), helper.join().unwrap())
    });
    assert_eq!(setuid, Some(0), "setuid finished while a thread was inside the domain");
    assert_eq!(inside, Ok(7), "the thread inside went on as if nothing had come");
    // The host still cannot change glibc's signal, as without ward.
    // SAFETY: a query into memory we own.
    let changed = unsafe {
        let mut old: libc::sigaction = MaybeUninit::zeroed().assume_init();
        host_sigaction(GLIBC_SETXID, ptr::null(), &mut old)
    };
    assert_eq!(changed, -1);
}

/// In a domain: note its arrival in a word of the domain's memory, then wait until a host word is non-zero.
extern "C" fn arrive_then_wait(arrived: *mut u64, go: *const u64) -> u64 {
    // SAFETY: `arrived` is a word of the domain's memory, `go` a host word it may read.
    unsafe {
        arrived.write_volatile(1);
        while go.read_volatile() == 0 {
            std::hint::spin_loop();
        }
    }
    7
}

/// Call `func` in `d` as a call made in `epoch` of `occupancy`, with `occupant` this thread's.
fn call_present(
    d: &TestDomain,
    occupancy: &Occupancy,
    occupant: &Occupant,
    epoch: u64,
    func: *const c_void,
    ints: &[u64],
) -> Result<RegRet, GateFault> {
    let mut args = RegArgs::default();
    args.ints[..ints.len()].copy_from_slice(ints);
    let presence = Presence { occupancy, occupant, epoch };
    // SAFETY: the tests' functions take integer or pointer arguments only; the stack is the domain's own, used by
    // this call alone; the occupant is this thread's.
    unsafe { super::call(func, &args, d.rights, d.stack.end(), None, d.thread_pointer(), &FLOAT, Some(presence)) }
        .expect("the gate's thread set-up")
}

/// Calls `call` (a function and its integer arguments) in `d` from another thread, as a call made before
/// `occupancy` closes; once `there()` says that call got where the test wants it, closes the domain to it, runs
/// `after_close`, and returns how the call ended.
fn close_while_another_thread_calls(
    d: &TestDomain,
    occupancy: &Occupancy,
    call: (*const c_void, &[u64]),
    there: impl Fn() -> bool,
    after_close: impl FnOnce(),
) -> Result<RegRet, GateFault> {
    let before = occupancy.epoch();
    let (func, ints) = (call.0 as usize, call.1);
    std::thread::scope(|s| {
        let (occupant_tx, occupant_rx) = std::sync::mpsc::channel();
        let calling = s.spawn(move || {
            allow_on_this_thread(d.key.number());
            let occupant = std::sync::Arc::new(Occupant::for_this_thread());
            occupant_tx.send(occupant.clone()).unwrap();
            call_present(d, occupancy, &occupant, before, func as *const c_void, ints)
        });
        let occupant = occupant_rx.recv().unwrap();
        while !there() {
            std::thread::yield_now();
        }
        occupancy.close(std::iter::once(&*occupant));
        after_close();
        calling.join().unwrap()
    })
}

/// A host word nothing sets: what the evicted call waits for.
static NEVER: AtomicU64 = AtomicU64::new(0);

#[test]
#[ignore = "needs PKU"]
fn closing_a_domain_ends_the_call_running_in_it_and_keeps_calls_made_before_from_going_in() {
    let d = TestDomain::new();
    allow_on_this_thread(d.key.number());
    let occupancy = Occupancy::default();
    let before = occupancy.epoch();
    let arrived = d.data_word();
    let (arrived_at, never_at) = (arrived as usize, NEVER.as_ptr() as usize);
    let func = f(arrive_then_wait as *const ());
    let waiting = close_while_another_thread_calls(
        &d,
        &occupancy,
        (func, &[arrived_at as u64, never_at as u64]),
        // SAFETY: the domain's word, readable by this thread (its key allowed above).
        || unsafe { (arrived_at as *const u64).read_volatile() } != 0,
        // The other thread is in the domain's code, waiting for a word no one sets: closing ends its call.
        || (),
    );
    let fault = waiting.expect_err("the call was ended").signalled();
    assert_eq!(fault.signal, timeout_signal(), "ended by an eviction: {fault:?}");
    assert_ne!(occupancy.epoch(), before);

    // A call made before the close does not go in: the function (which would write 5) never runs.
    let me = Occupant::for_this_thread();
    let write = f(write_word as *const ());
    assert!(call_present(&d, &occupancy, &me, before, write, &[arrived as u64, 5]).is_err());
    // SAFETY: `arrived` is a word of the domain's data, which this thread's rights allow (it allocated the key).
    assert_eq!(unsafe { arrived.read_volatile() }, 1, "the stale call did not run");
    // One made now does.
    call_present(&d, &occupancy, &me, occupancy.epoch(), write, &[arrived as u64, 5]).unwrap();
    // SAFETY: `arrived` is a word of the domain's data, which this thread's rights allow.
    assert_eq!(unsafe { arrived.read_volatile() }, 5);
}

static OUT_ENTERED: AtomicU64 = AtomicU64::new(0);
/// Set by the test once the domain is closed (or, so that a failing test does not hang, by a timer after a
/// minute: then 2).
static OUT_RELEASE: AtomicU64 = AtomicU64::new(0);

/// In the host, called out of a domain: wait until the test lets it go.
extern "C" fn host_wait_for_release(x: u64) -> u64 {
    OUT_ENTERED.store(1, Ordering::SeqCst);
    while OUT_RELEASE.load(Ordering::SeqCst) == 0 {
        std::hint::spin_loop();
    }
    x
}

/// In a domain: call `out`, then write what it returned into `mark` (domain memory).
extern "C" fn call_out_then_mark(out: extern "C" fn(u64) -> u64, mark: *mut u64) -> u64 {
    let r = out(3);
    // SAFETY: a word of the domain's memory.
    unsafe { mark.write_volatile(r) };
    r
}

#[test]
#[ignore = "needs PKU"]
fn closing_a_domain_leaves_a_call_out_in_the_host_alone_and_ends_it_when_it_comes_back() {
    let d = TestDomain::new();
    allow_on_this_thread(d.key.number());
    let occupancy = Occupancy::default();
    let mark = d.data_word();
    let stub = outward_for(f(host_wait_for_release as *const ())).expect("an outward slot") as usize;
    std::thread::spawn(|| {
        // Not synchronisation: only a test that went wrong (a close that waits for the host) gets this far.
        std::thread::sleep(Duration::from_secs(60));
        OUT_RELEASE.store(2, Ordering::SeqCst);
    });
    let mark_at = mark as usize;
    let func = f(call_out_then_mark as *const ());
    let ended = close_while_another_thread_calls(
        &d,
        &occupancy,
        (func, &[stub as u64, mark_at as u64]),
        || OUT_ENTERED.load(Ordering::SeqCst) != 0,
        // Out in the host: the close does not wait for it.
        || assert_eq!(OUT_RELEASE.swap(1, Ordering::SeqCst), 0, "the close returned without waiting for the host"),
    );
    let fault = ended.expect_err("the call ended when it came back");
    assert_eq!(fault, GateFault::Closed, "ended by the gate, not by a signal: {fault:?}");
    // SAFETY: the domain's word, readable by this thread.
    assert_eq!(unsafe { mark.read_volatile() }, 0, "the domain's code after the call out never ran");
}

/// What the handler records becomes one of the ways a call ends; a trap whose words name nothing is the illegal
/// instruction it is. (No PKU needed: no call is made.)
#[test]
fn a_caught_signal_becomes_a_fault_a_refusal_an_ending_or_a_closing() {
    let sigill = SignalFault { signal: libc::SIGILL, code: 2, addr: 0x1000, pc: 0x1000 };
    let caught = |trap| Caught { signal: sigill, trap };
    assert_eq!(caught(Trap::None).into_fault(), GateFault::Signal(sigill));
    assert_eq!(Caught::NOTHING.into_fault(), GateFault::Closed, "no signal recorded: the gate ended it");
    for ending in [Ending::Exit { status: 3 }, Ending::Exit { status: -1 }, Ending::Abort] {
        let (kind, status) = ending.words();
        assert_ne!(kind, 0, "{ending:?}: a kind of 0 would read as none");
        assert_eq!(caught(Trap::Ending { kind, status }).into_fault(), GateFault::Ended(ending));
    }
    assert_eq!(caught(Trap::Ending { kind: 0, status: 0 }).into_fault(), GateFault::Signal(sigill));
    assert_eq!(caught(Trap::Ending { kind: 99, status: 0 }).into_fault(), GateFault::Signal(sigill));
    // Code 0 is no refusal; the last slot has no stub and so no check.
    assert_eq!(caught(Trap::Refusal { slot: 0, code: 0 }).into_fault(), GateFault::Signal(sigill));
    assert_eq!(caught(Trap::Refusal { slot: OUTWARD_SLOTS - 1, code: 1 }).into_fault(), GateFault::Signal(sigill));
}
