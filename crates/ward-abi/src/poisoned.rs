//! Calling a C function with poison in every register and stack slot it was not given.
//!
//! The same trampoline the class adapters use (`include/ward_poisoned_call.h`): it saves the callee-saved registers,
//! fills them, the scratch registers, `xmm8..xmm15` and 16 KiB of stack below the call with [`POISON`], loads the
//! argument registers from the image, calls, and restores. A correct function never sees the difference; one that
//! reads a stale register or an uninitialised local finds a value that faults as a pointer and is a NaN as a float,
//! so its bug becomes a fault ward recovers from instead of a wrong result. See docs/DECISIONS.md.
#![allow(unsafe_code)]

use core::ffi::c_void;

use crate::regs::{RegArgs, RegRet};

/// The poison: non-canonical as a pointer, a quiet NaN as a double and as either float half, negative as an integer.
pub const POISON: u64 = 0xfffa_fffa_fffa_fffa;

/// The trampoline's call image; the assembly hard-codes these offsets.
#[repr(C)]
struct CallImage {
    func: *const c_void,
    ints: [u64; 6],
    floats: [u64; 8],
    ret_int: u64,
    ret_float: u64,
}

const _: () = {
    assert!(core::mem::offset_of!(CallImage, ints) == 8);
    assert!(core::mem::offset_of!(CallImage, floats) == 56);
    assert!(core::mem::offset_of!(CallImage, ret_int) == 120);
    assert!(core::mem::offset_of!(CallImage, ret_float) == 128);
};

extern "C" {
    fn ward_call_poisoned(image: *mut CallImage);
}

/// Calls `func` as [`crate::call_native`] does, after poisoning every register and stack slot it is not given.
///
/// `args` should come from [`crate::ArgPacker::finish_poisoned`], so the argument registers the function does not
/// take hold the poison too.
///
/// # Safety
/// As for [`crate::call_native`]: `func` is a System V function taking only register-passed scalars that are valid
/// in `args`, that neither unwinds nor leaves by `longjmp`.
pub unsafe fn call_native_poisoned(func: *const c_void, args: &RegArgs) -> RegRet {
    let mut image = CallImage { func, ints: args.ints, floats: args.floats, ret_int: POISON, ret_float: POISON };
    // SAFETY: `image` is a live, writable CallImage with the layout the trampoline reads (checked above); the
    // trampoline preserves every callee-saved register and the stack pointer (it saves them around the call and
    // writes its poison only below its own frame, in stack the callee is about to use anyway), so to Rust it is an
    // ordinary C function. The call of `func` itself is sound by the caller's guarantee.
    unsafe { ward_call_poisoned(&mut image) };
    RegRet { int: image.ret_int, float: image.ret_float }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regs::ArgPacker;

    // Probes that return what a faulty callee would read: a callee-saved register, an argument register it was not
    // given, the upper half of a float argument, a stack slot below its frame.
    core::arch::global_asm!(
        ".pushsection .text.ward_abi_test_poison_probes, \"ax\", @progbits",
        ".hidden ward_abi_test_read_rbx",
        "ward_abi_test_read_rbx:",
        "mov rax, rbx",
        "ret",
        ".hidden ward_abi_test_read_r15",
        "ward_abi_test_read_r15:",
        "mov rax, r15",
        "ret",
        ".hidden ward_abi_test_read_rsi",
        "ward_abi_test_read_rsi:",
        "mov rax, rsi",
        "ret",
        ".hidden ward_abi_test_read_rdi",
        "ward_abi_test_read_rdi:",
        "mov rax, rdi",
        "ret",
        ".hidden ward_abi_test_read_xmm0_and_xmm1",
        "ward_abi_test_read_xmm0_and_xmm1:",
        "movq rax, xmm0",
        "movq xmm0, xmm1",
        "ret",
        ".hidden ward_abi_test_read_stack",
        "ward_abi_test_read_stack:",
        "mov rax, qword ptr [rsp - 4096]",
        "ret",
        ".popsection",
    );

    extern "C" {
        fn ward_abi_test_read_rbx() -> u64;
        fn ward_abi_test_read_r15() -> u64;
        fn ward_abi_test_read_rsi() -> u64;
        fn ward_abi_test_read_rdi() -> u64;
        fn ward_abi_test_read_xmm0_and_xmm1() -> u64;
        fn ward_abi_test_read_stack() -> u64;
    }

    fn call(probe: unsafe extern "C" fn() -> u64, args: RegArgs) -> RegRet {
        // SAFETY: every probe takes no memory arguments, only reads registers or its own stack, and returns.
        unsafe { call_native_poisoned(probe as *const c_void, &args) }
    }

    #[test]
    fn a_callee_finds_poison_in_every_register_and_stack_slot_it_was_not_given() {
        let none = ArgPacker::new().finish_poisoned();
        assert_eq!(call(ward_abi_test_read_rbx, none).int, POISON);
        assert_eq!(call(ward_abi_test_read_r15, none).int, POISON);
        assert_eq!(call(ward_abi_test_read_rsi, none).int, POISON);
        assert_eq!(call(ward_abi_test_read_stack, none).int, POISON);
    }

    #[test]
    fn a_callee_finds_its_arguments_intact() {
        let mut p = ArgPacker::new();
        p.push_int(42).unwrap();
        p.push_f32(1.5).unwrap();
        let args = p.finish_poisoned();
        assert_eq!(call(ward_abi_test_read_rdi, args).int, 42);
        assert_eq!(call(ward_abi_test_read_rsi, args).int, POISON, "the second integer register was not given");
        let r = call(ward_abi_test_read_xmm0_and_xmm1, args);
        assert_eq!(r.int as u32, 1.5f32.to_bits(), "the float's own bits");
        assert_eq!(r.int >> 32, POISON >> 32, "the float's upper half, as a native movss leaves it");
        assert_eq!(r.float, POISON, "xmm1 was not given");
    }

    #[test]
    fn the_caller_gets_its_callee_saved_registers_back() {
        // Values kept live across the calls in callee-saved registers (the optimiser's choice) must survive the
        // poisoning; a sum over many of them makes that likely.
        let kept: [u64; 8] = core::array::from_fn(|i| (i as u64 + 1) * 0x0101_0101);
        let mut sum = 0u64;
        for k in kept {
            sum = sum.wrapping_add(call(ward_abi_test_read_rdi, ArgPacker::new().finish_poisoned()).int ^ k);
        }
        let expected = kept.iter().fold(0u64, |s, k| s.wrapping_add(POISON ^ k));
        assert_eq!(sum, expected);
    }
}
