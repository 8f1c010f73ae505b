//! C-callable stubs that capture their argument registers and land in one Rust dispatcher.
//!
//! The stubs are [`CALLBACK_SLOTS`] fixed-size entries starting at the symbol `ward_abi_stubs`, one every
//! [`STUB_STRIDE`] bytes. Stub `n` is `mov r11d, n; jmp ward_abi_stub_common`; `r11` is a scratch register that
//! carries no argument in the System V ABI, so every argument register reaches the common body untouched. The
//! common body builds a frame, stores `rdi..r9` and `xmm0..xmm7` into a [`RegArgs`] on its stack, calls
//! [`ward_abi_dispatch`] with the slot and pointers to that `RegArgs` and a [`RegRet`], then returns
//! `RegRet::int` in `rax` and `RegRet::float` in `xmm0`.
#![allow(unsafe_code)]

use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, Ordering};

use crate::regs::{RegArgs, RegRet};

/// Number of distinct callback entry points.
pub const CALLBACK_SLOTS: usize = 256;

/// Distance in bytes between consecutive stubs. Each stub is at most 11 bytes (a 6-byte `mov r11d, imm32` and a
/// jump of at most 5), padded to this stride with `int3`.
const STUB_STRIDE: usize = 16;

/// The process-wide handler every callback stub lands in.
pub type CallbackDispatch = fn(slot: usize, args: &RegArgs) -> RegRet;

/// The installed [`CallbackDispatch`] as a data pointer, or null before the first install. Only values produced by
/// casting a `CallbackDispatch` are ever stored.
static DISPATCH: AtomicPtr<()> = AtomicPtr::new(core::ptr::null_mut());

/// Installs (or replaces) the process-wide dispatcher. Before any is installed, a stub call returns zeroes.
///
/// The store is a release and every stub call loads with acquire, so state the dispatcher reads that was
/// initialised before this call is visible to it on every thread. A stub call already running keeps the
/// dispatcher it loaded.
pub fn set_callback_dispatch(dispatch: CallbackDispatch) {
    DISPATCH.store(dispatch as *mut (), Ordering::Release);
}

fn current_dispatch() -> Option<CallbackDispatch> {
    let raw = DISPATCH.load(Ordering::Acquire);
    if raw.is_null() {
        return None;
    }
    // SAFETY: `DISPATCH` is private and written only by `set_callback_dispatch`, which stores a
    // `CallbackDispatch` cast to `*mut ()`; function and data pointers have the same size and representation on
    // x86-64, so transmuting back yields the same non-null function pointer.
    Some(unsafe { core::mem::transmute::<*mut (), CallbackDispatch>(raw) })
}

/// A C-callable function pointer that, when called with any register-passed signature, captures rdi..r9 and
/// xmm0..xmm7 into a RegArgs, calls the dispatcher with (slot, &args) and returns RegRet.int in rax and RegRet.float
/// in xmm0. None if slot >= CALLBACK_SLOTS.
///
/// The pointer is valid for the life of the process and the same on every call for a given slot. Any number of
/// threads may call stubs at once, and a dispatcher may itself call native code that calls stubs. A panic in the
/// dispatcher aborts the process: unwinding into C is never allowed.
pub fn callback_stub(slot: usize) -> Option<*const c_void> {
    if slot >= CALLBACK_SLOTS {
        return None;
    }
    let base = ward_abi_stubs as *const u8;
    Some(base.wrapping_add(slot * STUB_STRIDE).cast())
}

/// Entered from `ward_abi_stub_common` only.
///
/// `args` points to the stub frame's fully written `RegArgs`, `ret` to its `RegRet`; both live for this call.
extern "C" fn ward_abi_dispatch(slot: usize, args: *const RegArgs, ret: *mut RegRet) {
    // SAFETY: the common stub body passes `rsp`, which after `sub rsp, 128` points to 112 bytes it has just
    // written with the fourteen argument registers; `rsp` is 16-byte aligned there (so aligned for `RegArgs`),
    // and the frame outlives this call. Nothing else refers to that memory while the reference lives.
    let args = unsafe { &*args };
    let out = match current_dispatch() {
        None => RegRet::default(),
        // A panic must not unwind through the assembly frame into C. `abort` rather than a message: the panic
        // hook has already reported the panic.
        Some(dispatch) => std::panic::catch_unwind(|| dispatch(slot, args)).unwrap_or_else(|_| std::process::abort()),
    };
    // SAFETY: `ret` is `rsp + 112` in the common stub frame: 16 writable bytes, 16-byte aligned, disjoint from
    // `args`, read by the stub only after this function returns.
    unsafe { ret.write(out) }
}

extern "C" {
    /// Start of the stub array defined below; only its address is used, it is never called as `fn()`.
    fn ward_abi_stubs();
}

// Stack layout of the common body after its prologue (rsp 16-byte aligned; on entry it was 8 mod 16 because the
// C caller's `call` pushed a return address and the stub jumped rather than called):
//   [rsp + 0   .. rsp + 48)   RegArgs::ints   (rdi, rsi, rdx, rcx, r8, r9)
//   [rsp + 48  .. rsp + 112)  RegArgs::floats (xmm0..xmm7, low 64 bits)
//   [rsp + 112 .. rsp + 128)  RegRet
//   [rsp + 128]               saved rbp        (rbp points here)
//   [rsp + 136]               return address into the C caller
// The offsets match `RegArgs` and `RegRet`, whose layouts `regs` checks at compile time.
core::arch::global_asm!(
    ".pushsection .text.ward_abi_callbacks, \"ax\", @progbits",
    ".balign {stride}",
    ".globl ward_abi_stubs",
    ".hidden ward_abi_stubs",
    ".type ward_abi_stubs, @function",
    "ward_abi_stubs:",
    ".set .Lward_abi_slot, 0",
    ".rept {slots}",
    ".balign {stride}, 0xcc",
    "mov r11d, offset .Lward_abi_slot",
    "jmp ward_abi_stub_common",
    ".set .Lward_abi_slot, .Lward_abi_slot + 1",
    ".endr",
    ".size ward_abi_stubs, . - ward_abi_stubs",
    "",
    ".balign 16, 0xcc",
    ".type ward_abi_stub_common, @function",
    "ward_abi_stub_common:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rbp, rsp",
    ".cfi_def_cfa_register rbp",
    "sub rsp, 128",
    store_argument_registers!("rsp"),
    "mov edi, r11d",
    "mov rsi, rsp",
    "lea rdx, [rsp + 112]",
    "call {dispatch}",
    "mov rax, qword ptr [rsp + 112]",
    "movq xmm0, qword ptr [rsp + 120]",
    "leave",
    ".cfi_def_cfa rsp, 8",
    "ret",
    ".cfi_endproc",
    ".size ward_abi_stub_common, . - ward_abi_stub_common",
    ".popsection",
    slots = const CALLBACK_SLOTS,
    stride = const STUB_STRIDE,
    dispatch = sym ward_abi_dispatch,
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::call_native;
    use crate::regs::ArgPacker;
    use crate::testutil::ward_abi_test_rsp_probe;
    use std::cell::{Cell, RefCell};

    thread_local! {
        /// Every dispatch on this thread, in order.
        static LOG: RefCell<Vec<(usize, RegArgs)>> = const { RefCell::new(Vec::new()) };
        /// What the next dispatch on this thread returns.
        static NEXT_RET: Cell<RegRet> = const { Cell::new(RegRet { int: 0, float: 0 }) };
    }

    /// What `recorder` does besides logging, per thread.
    #[derive(Clone, Copy)]
    enum Mode {
        /// Return `NEXT_RET`.
        Plain,
        /// Call (through `call_native`) the stub whose slot is in `rdi`, with `rsi + 1` and `xmm0 * 2`, then
        /// switch to `Plain`; return the inner result plus 1000 (int) and plus 0.5 (double).
        Nest,
        /// Call the stack-alignment probe and return what it saw.
        Probe,
    }

    thread_local! {
        static MODE: Cell<Mode> = const { Cell::new(Mode::Plain) };
    }

    /// Tests run on many threads at once but all install this same function, and it keeps its state per thread.
    fn recorder(slot: usize, args: &RegArgs) -> RegRet {
        LOG.with(|l| l.borrow_mut().push((slot, *args)));
        match MODE.with(Cell::get) {
            Mode::Nest => {
                MODE.with(|m| m.set(Mode::Plain));
                let inner = callback_stub(args.ints[0] as usize).unwrap();
                let mut p = ArgPacker::new();
                p.push_int(args.ints[1] + 1).unwrap();
                p.push_f64(f64::from_bits(args.floats[0]) * 2.0).unwrap();
                // SAFETY: `inner` is a stub, which accepts any register-only signature.
                let r = unsafe { call_native(inner, &p.finish()) };
                RegRet { int: r.int + 1000, float: (r.as_f64() + 0.5).to_bits() }
            }
            Mode::Probe => {
                // SAFETY: the probe takes no arguments and returns an integer.
                unsafe { call_native(ward_abi_test_rsp_probe as *const c_void, &RegArgs::default()) }
            }
            Mode::Plain => NEXT_RET.with(Cell::get),
        }
    }

    fn setup(ret: RegRet) {
        set_callback_dispatch(recorder);
        LOG.with(|l| l.borrow_mut().clear());
        NEXT_RET.with(|r| r.set(ret));
        MODE.with(|m| m.set(Mode::Plain));
    }

    fn take_log() -> Vec<(usize, RegArgs)> {
        LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
    }

    #[test]
    fn slot_out_of_range_is_none() {
        assert!(callback_stub(CALLBACK_SLOTS).is_none());
        assert!(callback_stub(usize::MAX).is_none());
        assert!(callback_stub(CALLBACK_SLOTS - 1).is_some());
    }

    #[test]
    fn stubs_have_fixed_stride_and_encode_their_slot() {
        for slot in 0..CALLBACK_SLOTS {
            let p = callback_stub(slot).unwrap().cast::<u8>();
            // SAFETY: `p` points to the start of stub `slot` in the executable text section, which is readable and
            // at least 6 bytes long (the `mov r11d, imm32`).
            let bytes = unsafe { core::slice::from_raw_parts(p, 6) };
            assert_eq!(&bytes[..2], &[0x41, 0xbb], "stub {slot} does not start with mov r11d, imm32");
            assert_eq!(u32::from_le_bytes(bytes[2..6].try_into().unwrap()) as usize, slot);
        }
    }

    #[test]
    fn slot0_mixed_signature() {
        setup(RegRet { int: 0, float: 6.25f64.to_bits() });
        let stub = callback_stub(0).unwrap();
        // SAFETY: a stub accepts any register-only signature; the dispatcher returns a double in xmm0.
        let f =
            unsafe { core::mem::transmute::<*const c_void, extern "C" fn(i64, f64, i32, f32, u64, f64) -> f64>(stub) };
        assert_eq!(f(-3, 1.5, -7, 0.25, u64::MAX, -2.0), 6.25);
        let log = take_log();
        assert_eq!(log.len(), 1);
        let (slot, a) = log[0];
        assert_eq!(slot, 0);
        assert_eq!(a.ints[0], (-3i64) as u64);
        // An i32 argument is defined only in the low 32 bits.
        assert_eq!(a.ints[1] as u32 as i32, -7);
        assert_eq!(a.ints[2], u64::MAX);
        assert_eq!(a.floats[0], 1.5f64.to_bits());
        // A float argument is defined only in the low 32 bits.
        assert_eq!(a.floats[1] as u32, 0.25f32.to_bits());
        assert_eq!(a.floats[2], (-2.0f64).to_bits());
    }

    #[test]
    fn slot1_int_return_negative_i32() {
        setup(RegRet { int: (-9i64) as u64, float: 0 });
        let stub = callback_stub(1).unwrap();
        // SAFETY: a stub accepts any register-only signature; the dispatcher returns an int in eax.
        let f =
            unsafe { core::mem::transmute::<*const c_void, extern "C" fn(u64, u64, u64, u64, u64, u64) -> i32>(stub) };
        assert_eq!(f(1, 2, 3, 4, 5, 6), -9);
        let log = take_log();
        assert_eq!(log, vec![(1, RegArgs { ints: [1, 2, 3, 4, 5, 6], floats: log[0].1.floats })]);
    }

    #[test]
    fn slot255_eight_doubles_u64_return() {
        setup(RegRet { int: 0x1234_5678_9abc_def0, float: 0 });
        let stub = callback_stub(255).unwrap();
        type Eight = extern "C" fn(f64, f64, f64, f64, f64, f64, f64, f64) -> u64;
        // SAFETY: a stub accepts any register-only signature; the dispatcher returns a u64 in rax.
        let f = unsafe { core::mem::transmute::<*const c_void, Eight>(stub) };
        assert_eq!(f(0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5), 0x1234_5678_9abc_def0);
        let log = take_log();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].0, 255);
        let expect: [u64; 8] = core::array::from_fn(|i| (i as f64 + 0.5).to_bits());
        assert_eq!(log[0].1.floats, expect);
    }

    #[test]
    fn float_return_and_interleaved_args() {
        setup(RegRet { int: 0, float: u64::from((-3.75f32).to_bits()) });
        let stub = callback_stub(17).unwrap();
        type Sig = extern "C" fn(f32, *const u8, f64, u16, f32) -> f32;
        // SAFETY: a stub accepts any register-only signature; the dispatcher returns a float in xmm0.
        let f = unsafe { core::mem::transmute::<*const c_void, Sig>(stub) };
        let marker = 0u8;
        assert_eq!(f(1.25, &marker, 9.0, 0xbeef, -0.5), -3.75);
        let (slot, a) = take_log()[0];
        assert_eq!(slot, 17);
        assert_eq!(a.ints[0], &marker as *const u8 as u64);
        assert_eq!(a.ints[1] as u16, 0xbeef);
        assert_eq!(a.floats[0] as u32, 1.25f32.to_bits());
        assert_eq!(a.floats[1], 9.0f64.to_bits());
        assert_eq!(a.floats[2] as u32, (-0.5f32).to_bits());
    }

    #[test]
    fn every_slot_reaches_dispatcher_with_its_number() {
        setup(RegRet { int: 77, float: 0 });
        for slot in 0..CALLBACK_SLOTS {
            // SAFETY: a stub accepts any register-only signature; the dispatcher returns an integer in rax.
            let f = unsafe {
                core::mem::transmute::<*const c_void, extern "C" fn(u64) -> u64>(callback_stub(slot).unwrap())
            };
            assert_eq!(f(slot as u64 * 3), 77);
        }
        let log = take_log();
        assert_eq!(log.len(), CALLBACK_SLOTS);
        for (i, (slot, a)) in log.iter().enumerate() {
            assert_eq!(*slot, i);
            assert_eq!(a.ints[0], i as u64 * 3);
        }
    }

    #[test]
    fn stub_through_call_native_sees_all_fourteen_registers() {
        setup(RegRet { int: u64::MAX - 1, float: (-1e300f64).to_bits() });
        let args = RegArgs {
            ints: [0x1111, 0x2222_0000_0000, u64::MAX, 0, 0x8000_0000_0000_0000, 0x5555],
            floats: core::array::from_fn(|i| 0x4000_0000_0000_0000 | (i as u64) << 20 | 0xabc),
        };
        let stub = callback_stub(42).unwrap();
        // SAFETY: a stub accepts any register-only signature, and all fourteen registers with it.
        let r = unsafe { call_native(stub, &args) };
        assert_eq!(r, RegRet { int: u64::MAX - 1, float: (-1e300f64).to_bits() });
        assert_eq!(take_log(), vec![(42, args)]);
    }

    #[test]
    fn nested_native_call_into_stub_from_dispatcher() {
        setup(RegRet { int: 5, float: 0.25f64.to_bits() });
        let mut p = ArgPacker::new();
        p.push_int(9).unwrap(); // inner slot
        p.push_int(100).unwrap();
        p.push_f64(1.5).unwrap();
        MODE.with(|m| m.set(Mode::Nest));
        // SAFETY: a stub accepts any register-only signature.
        let r = unsafe { call_native(callback_stub(200).unwrap(), &p.finish()) };
        assert_eq!(r.int, 1005);
        assert_eq!(r.as_f64(), 0.75);
        let log = take_log();
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].0, 200);
        assert_eq!(log[1].0, 9);
        assert_eq!(log[1].1.ints[0], 101);
        assert_eq!(log[1].1.floats[0], 3.0f64.to_bits());
    }

    #[test]
    fn dispatcher_runs_on_an_aligned_stack() {
        setup(RegRet::default());
        MODE.with(|m| m.set(Mode::Probe));
        // Entered directly from Rust and through call_native: both callers align, so must the stub frame.
        // SAFETY: a stub accepts any register-only signature; the dispatcher returns an integer in rax.
        let f = unsafe { core::mem::transmute::<*const c_void, extern "C" fn() -> u64>(callback_stub(201).unwrap()) };
        assert_eq!(f(), 8);
        // SAFETY: a stub accepts any register-only signature, here one with no arguments; the dispatcher returns an
        // integer in rax.
        let r = unsafe { call_native(callback_stub(201).unwrap(), &RegArgs::default()) };
        assert_eq!(r.int, 8);
    }

    #[test]
    fn stubs_are_thread_safe() {
        let handles: Vec<_> = (0..8u64)
            .map(|t| {
                std::thread::spawn(move || {
                    setup(RegRet { int: t, float: 0 });
                    let slot = 100 + t as usize;
                    // SAFETY: a stub accepts any register-only signature; the dispatcher returns an integer in rax.
                    let f = unsafe {
                        core::mem::transmute::<*const c_void, extern "C" fn(u64, f64) -> u64>(
                            callback_stub(slot).unwrap(),
                        )
                    };
                    for i in 0..1000 {
                        assert_eq!(f(i, i as f64), t);
                    }
                    let log = take_log();
                    assert_eq!(log.len(), 1000);
                    for (i, (s, a)) in log.iter().enumerate() {
                        assert_eq!((*s, a.ints[0], a.floats[0]), (slot, i as u64, (i as f64).to_bits()));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
