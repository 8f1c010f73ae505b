//! Calling a C function from a register image.
#![allow(unsafe_code)]

use core::arch::asm;
use core::ffi::c_void;

use crate::regs::{RegArgs, RegRet};

/// Calls `func` with the registers of `args`; returns rax and xmm0.
///
/// Loads `args.ints` into `rdi, rsi, rdx, rcx, r8, r9`, `args.floats` into the low 64 bits of `xmm0..xmm7`
/// (upper bits zero), sets `al = 8` for variadic callees, and calls `func` with the stack 16-byte aligned. No
/// allocation, no locks: the cost is fourteen loads, an indirect call, and saving the six callee-saved registers
/// around it (a callee that breaks the calling convention and leaves them changed, or the direction flag set,
/// must not break its caller: the domain process, or the host under `none`).
///
/// # Safety
/// `func` must point to executable code of a function following the System V x86-64 ABI whose parameters are all
/// integer/pointer or float/double scalars passed in registers (at most 6 + 8) and whose return is void, an integer
/// or pointer, or a float/double; and the arguments must be valid for it.
///
/// In addition `func` must not unwind (a C++ exception or a Rust panic leaving it is undefined behaviour), and it
/// must return normally: leaving it by `longjmp` or by rewriting the context in a signal handler is only sound if
/// the caller of `call_native` arranged for that (no frame with a destructor in between).
#[inline]
pub unsafe fn call_native(func: *const c_void, args: &RegArgs) -> RegRet {
    let int: u64;
    let float: u64;
    // SAFETY: the caller guarantees that `func` is a System V function taking only register-passed scalars, and
    // that the values in `args` are valid arguments for it; registers it does not take are ignored by the ABI, and
    // `al` is only read by variadic callees, for which 8 is a valid upper bound. `args` is a live reference to a
    // `RegArgs` whose layout (ints at 0, floats at 48, 8-byte aligned) is checked at compile time in `regs`, so all
    // fourteen loads through r11 are in bounds. Operand registers r10/r11 are not argument registers, so loading
    // rdi..r9 does not overwrite them before the call. The block is not `nostack`, so Rust guarantees the stack
    // is aligned for a call and the red zone is free; not `nomem`, so the compiler assumes the callee reads and
    // writes memory. `clobber_abi("C")` declares every register the callee may change. The six callee-saved
    // registers are pushed and popped around the call (48 bytes keep the stack 16-byte aligned), and the direction
    // flag is cleared after it, so a callee that breaks the ABI there changes nothing of its caller's. The x87/MXCSR
    // control bits are the callee's to keep.
    unsafe {
        asm!(
            "push rbx",
            "push rbp",
            "push r12",
            "push r13",
            "push r14",
            "push r15",
            load_argument_registers!("r11"),
            // Upper bound on vector registers used, read by variadic callees.
            "mov eax, 8",
            "call r10",
            "cld",
            "pop r15",
            "pop r14",
            "pop r13",
            "pop r12",
            "pop rbp",
            "pop rbx",
            in("r10") func,
            in("r11") args as *const RegArgs,
            lateout("rax") int,
            lateout("xmm0") float,
            clobber_abi("C"),
        );
    }
    RegRet { int, float }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regs::ArgPacker;
    use crate::testutil::ward_abi_test_rsp_probe;
    use core::ffi::{c_char, c_int};

    extern "C" fn mixed(a: i64, b: f64, c: i32, d: f32, e: u64, f: f64) -> f64 {
        a as f64 * 1000.0 + b * 100.0 + f64::from(c) * 10.0 + f64::from(d) + e as f64 * 0.5 - f
    }

    extern "C" fn six_ints(a: u64, b: u64, c: u64, d: u64, e: u64, f: u64) -> u64 {
        // Weighted so a swapped pair changes the result.
        [a, b, c, d, e, f].iter().zip(1u64..).fold(a ^ f, |acc, (v, w)| acc.wrapping_add(v.wrapping_mul(w)))
    }

    #[allow(clippy::too_many_arguments)]
    extern "C" fn eight_doubles(a: f64, b: f64, c: f64, d: f64, e: f64, f: f64, g: f64, h: f64) -> f64 {
        a + 2.0 * b + 4.0 * c + 8.0 * d + 16.0 * e + 32.0 * f + 64.0 * g + 128.0 * h
    }

    extern "C" fn float_ret(a: f32, b: i32, c: f32) -> f32 {
        a * b as f32 - c
    }

    extern "C" fn negative_i32(a: i32, b: i32) -> i32 {
        a.wrapping_sub(b)
    }

    extern "C" fn write_through(out: *mut u64, v: u64, scale: f64) {
        // SAFETY: the tests pass a pointer to a live, writable, aligned u64.
        unsafe { out.write((v as f64 * scale) as u64) }
    }

    /// 6 ints and 8 floats in interleaved declaration order.
    #[allow(clippy::too_many_arguments)]
    extern "C" fn interleaved(
        f0: f64,
        i0: u8,
        f1: f32,
        i1: i16,
        f2: f64,
        f3: f64,
        i2: *const u64,
        f4: f32,
        i3: i64,
        f5: f64,
        i4: u32,
        f6: f64,
        f7: f32,
        i5: i32,
    ) -> i64 {
        // SAFETY: the test passes a pointer to a live u64.
        let p = unsafe { *i2 } as i64;
        let ints = i64::from(i0) + 10 * i64::from(i1) + 100 * p + 1000 * i3 + 10_000 * i64::from(i4);
        let floats = f0 + 2.0 * f64::from(f1) + 4.0 * f2 + 8.0 * f3 + 16.0 * f64::from(f4) + 32.0 * f5 + 64.0 * f6
            - 128.0 * f64::from(f7);
        ints * 1_000_000 + floats as i64 + 100_000 * i64::from(i5)
    }

    extern "C" {
        fn snprintf(buf: *mut c_char, n: usize, fmt: *const c_char, ...) -> c_int;
    }

    fn call(func: *const c_void, args: &RegArgs) -> RegRet {
        // SAFETY: every caller in these tests passes a function defined above whose signature matches the packed
        // arguments and is within the register-only limits.
        unsafe { call_native(func, args) }
    }

    #[test]
    fn mixed_signature_double_return() {
        let mut p = ArgPacker::new();
        p.push_int(3).unwrap();
        p.push_f64(0.5).unwrap();
        p.push_int((-2i64) as u64).unwrap();
        p.push_f32(0.25).unwrap();
        p.push_int(8).unwrap();
        p.push_f64(1.0).unwrap();
        let r = call(mixed as *const c_void, &p.finish());
        assert_eq!(r.as_f64(), mixed(3, 0.5, -2, 0.25, 8, 1.0));
        assert_eq!(r.as_f64(), 3000.0 + 50.0 - 20.0 + 0.25 + 4.0 - 1.0);
    }

    #[test]
    fn six_integer_args() {
        let mut p = ArgPacker::new();
        let vals = [1u64, 1 << 40, 7, u64::MAX - 5, 0xdead_beef, 42];
        for v in vals {
            p.push_int(v).unwrap();
        }
        let r = call(six_ints as *const c_void, &p.finish());
        assert_eq!(r.int, six_ints(vals[0], vals[1], vals[2], vals[3], vals[4], vals[5]));
    }

    #[test]
    fn eight_double_args() {
        let mut p = ArgPacker::new();
        for i in 0..8 {
            p.push_f64(f64::from(i) + 0.5).unwrap();
        }
        let r = call(eight_doubles as *const c_void, &p.finish());
        assert_eq!(r.as_f64(), eight_doubles(0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5));
    }

    #[test]
    fn float_return() {
        let mut p = ArgPacker::new();
        p.push_f32(1.5).unwrap();
        p.push_int(4).unwrap();
        p.push_f32(0.5).unwrap();
        let r = call(float_ret as *const c_void, &p.finish());
        assert_eq!(r.as_f32(), 5.5);
    }

    #[test]
    fn negative_i32_return() {
        let mut p = ArgPacker::new();
        p.push_int(5).unwrap();
        p.push_int(12).unwrap();
        let r = call(negative_i32 as *const c_void, &p.finish());
        assert_eq!(r.as_i32(), -7);
        // A negative i32 argument, sign-extended as the packer contract asks.
        let mut p = ArgPacker::new();
        p.push_int((-5i64) as u64).unwrap();
        p.push_int((i32::MAX as i64) as u64).unwrap();
        let r = call(negative_i32 as *const c_void, &p.finish());
        assert_eq!(r.as_i32(), (-5i32).wrapping_sub(i32::MAX));
    }

    #[test]
    fn void_function_writes_through_pointer() {
        let mut out = 0u64;
        let mut p = ArgPacker::new();
        p.push_int(&mut out as *mut u64 as u64).unwrap();
        p.push_int(21).unwrap();
        p.push_f64(2.0).unwrap();
        call(write_through as *const c_void, &p.finish());
        assert_eq!(out, 42);
    }

    #[test]
    fn six_ints_and_eight_floats_interleaved() {
        let target = 9u64;
        let mut p = ArgPacker::new();
        p.push_f64(1.0).unwrap(); // f0
        p.push_int(200).unwrap(); // i0: u8
        p.push_f32(0.5).unwrap(); // f1
        p.push_int((-3i64) as u64).unwrap(); // i1: i16
        p.push_f64(0.25).unwrap(); // f2
        p.push_f64(0.125).unwrap(); // f3
        p.push_int(&target as *const u64 as u64).unwrap(); // i2
        p.push_f32(2.0).unwrap(); // f4
        p.push_int((-4i64) as u64).unwrap(); // i3
        p.push_f64(3.0).unwrap(); // f5
        p.push_int(5).unwrap(); // i4
        p.push_f64(-1.0).unwrap(); // f6
        p.push_f32(0.75).unwrap(); // f7
        p.push_int((-6i64) as u64).unwrap(); // i5
        let a = p.finish();
        assert_eq!(p.push_int(0), Err(crate::PackError::TooManyInts));
        assert_eq!(p.push_f32(0.0), Err(crate::PackError::TooManyFloats));
        let r = call(interleaved as *const c_void, &a);
        let expect = interleaved(1.0, 200, 0.5, -3, 0.25, 0.125, &target, 2.0, -4, 3.0, 5, -1.0, 0.75, -6);
        assert_eq!(r.as_i64(), expect);
    }

    #[test]
    fn variadic_callee_sees_al_and_xmm() {
        let mut buf = [0u8; 64];
        let fmt = c"%d|%.3f|%ld|%.1f|%s";
        let mut p = ArgPacker::new();
        p.push_int(buf.as_mut_ptr() as u64).unwrap();
        p.push_int(buf.len() as u64).unwrap();
        p.push_int(fmt.as_ptr() as u64).unwrap();
        p.push_int((-17i64) as u64).unwrap();
        p.push_f64(3.25).unwrap();
        p.push_int(1 << 40).unwrap();
        // Variadic floats are promoted to double.
        p.push_f64(-0.5).unwrap();
        p.push_int(c"ok".as_ptr() as u64).unwrap();
        let r = call(snprintf as *const c_void, &p.finish());
        let expect = "-17|3.250|1099511627776|-0.5|ok";
        assert_eq!(r.as_i32(), expect.len() as i32);
        assert_eq!(&buf[..expect.len()], expect.as_bytes());
        assert_eq!(buf[expect.len()], 0);
    }

    #[test]
    fn stack_is_aligned_at_call() {
        let r = call(ward_abi_test_rsp_probe as *const c_void, &RegArgs::default());
        assert_eq!(r.int, 8);
    }

    // Returns 7 with every callee-saved register but rsp set to a pattern and the direction flag set: a callee
    // that breaks the calling convention.
    core::arch::global_asm!(
        ".pushsection .text.ward_abi_test_clobber, \"ax\", @progbits",
        ".hidden ward_abi_test_clobber_callee_saved",
        "ward_abi_test_clobber_callee_saved:",
        "mov rbx, 0x5a5a5a5a",
        "mov rbp, rbx",
        "mov r12, rbx",
        "mov r13, rbx",
        "mov r14, rbx",
        "mov r15, rbx",
        "std",
        "mov eax, 7",
        "ret",
        ".popsection",
    );

    extern "C" {
        fn ward_abi_test_clobber_callee_saved() -> u64;
    }

    #[test]
    fn a_callee_that_breaks_the_calling_convention_leaves_its_caller_intact() {
        // Values live across the calls, some of them in callee-saved registers.
        let xs: [u64; 10] = core::array::from_fn(|i| std::hint::black_box(i as u64 * 0x1111));
        let mut total = 0u64;
        for _ in 0..3 {
            let r = call(ward_abi_test_clobber_callee_saved as *const c_void, &RegArgs::default());
            total += r.int;
            total += xs.iter().sum::<u64>();
        }
        assert_eq!(total, 3 * (7 + (0..10).map(|i| i * 0x1111).sum::<u64>()));
        let direction_flag: u64;
        // SAFETY: reads the flags register.
        unsafe { asm!("pushfq", "pop {}", out(reg) direction_flag) };
        assert_eq!(direction_flag & 0x400, 0, "the direction flag is clear");
    }

    #[test]
    fn values_live_across_call_survive() {
        // Many live values force the compiler to keep some in registers across the asm block; a wrong clobber
        // list would corrupt them.
        let xs: [u64; 12] = core::array::from_fn(|i| std::hint::black_box(i as u64 * 0x0101_0101));
        let fs: [f64; 8] = core::array::from_fn(|i| std::hint::black_box(i as f64 * 1.5));
        let mut p = ArgPacker::new();
        for i in 0..6 {
            p.push_int(u64::MAX - i).unwrap();
        }
        for i in 0..8 {
            p.push_f64(-(i as f64)).unwrap();
        }
        let a = p.finish();
        let mut acc = 0u64;
        for _ in 0..4 {
            acc = acc.wrapping_add(call(six_ints as *const c_void, &a).int);
            acc = acc.wrapping_add(call(eight_doubles as *const c_void, &a).float);
        }
        std::hint::black_box(acc);
        for (i, x) in xs.iter().enumerate() {
            assert_eq!(*x, i as u64 * 0x0101_0101);
        }
        for (i, f) in fs.iter().enumerate() {
            assert_eq!(*f, i as f64 * 1.5);
        }
    }
}
