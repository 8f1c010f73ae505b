//! Register images of arguments and return values, and the argument classifier.

/// Number of integer-class argument registers (`rdi, rsi, rdx, rcx, r8, r9`).
pub const MAX_INT_ARGS: usize = 6;
/// Number of float-class argument registers (`xmm0..xmm7`).
pub const MAX_FLOAT_ARGS: usize = 8;

/// Register image of a call's arguments. f32 values travel as their bits in the low 32 bits of a float slot;
/// f64 as their bits.
///
/// `ints[i]` is the i-th integer-class argument register (`rdi, rsi, rdx, rcx, r8, r9`), `floats[i]` the low 64
/// bits of `xmm{i}`. The layout is fixed (`repr(C)`, ints at offset 0, floats at offset 48): the assembly in this
/// crate reads and writes it directly.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegArgs {
    /// `rdi, rsi, rdx, rcx, r8, r9`, in that order.
    pub ints: [u64; 6],
    /// Low 64 bits of `xmm0..xmm7`, in that order.
    pub floats: [u64; 8],
}

/// Register image of a return: `rax` and the low 64 bits of `xmm0`.
///
/// Which one is meaningful depends on the signature; for a `void` function neither is. The layout is fixed
/// (`repr(C)`, `int` at offset 0, `float` at offset 8): the callback stubs read it directly.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegRet {
    /// `rax`.
    pub int: u64,
    /// Low 64 bits of `xmm0`; a `float` return is in the low 32 of them.
    pub float: u64,
}

// The assembly in `call` and `callback`, and the two macros below, hard-code these offsets and sizes.
const _: () = {
    assert!(core::mem::offset_of!(RegArgs, ints) == 0);
    assert!(core::mem::offset_of!(RegArgs, floats) == 48);
    assert!(core::mem::size_of::<RegArgs>() == 112);
    assert!(core::mem::offset_of!(RegRet, int) == 0);
    assert!(core::mem::offset_of!(RegRet, float) == 8);
    assert!(core::mem::size_of::<RegRet>() == 16);
};

/// Assembly (Intel syntax, one instruction a line) that stores the fourteen argument registers into a [`RegArgs`]
/// image at `[BASE]`: `rdi, rsi, rdx, rcx, r8, r9`, then the low halves of `xmm0..xmm7`. `BASE` is a string
/// literal naming the address: a register, or a register plus anything the assembler adds (`rsp`,
/// `"\\base + \\offset"` inside a `.macro`, `"rbx + {ints}"` with an operand). For `asm!` and `global_asm!`
/// templates: the one copy of the spill that the callback stubs here and the mpk gate's outward stubs both make of
/// a C caller's arguments. Clobbers nothing.
#[rustfmt::skip]
#[macro_export]
macro_rules! store_argument_registers {
    ($base:literal) => {
        concat!(
            "mov qword ptr [", $base, "], rdi\n",
            "mov qword ptr [", $base, " + 8], rsi\n",
            "mov qword ptr [", $base, " + 16], rdx\n",
            "mov qword ptr [", $base, " + 24], rcx\n",
            "mov qword ptr [", $base, " + 32], r8\n",
            "mov qword ptr [", $base, " + 40], r9\n",
            "movq qword ptr [", $base, " + 48], xmm0\n",
            "movq qword ptr [", $base, " + 56], xmm1\n",
            "movq qword ptr [", $base, " + 64], xmm2\n",
            "movq qword ptr [", $base, " + 72], xmm3\n",
            "movq qword ptr [", $base, " + 80], xmm4\n",
            "movq qword ptr [", $base, " + 88], xmm5\n",
            "movq qword ptr [", $base, " + 96], xmm6\n",
            "movq qword ptr [", $base, " + 104], xmm7\n",
        )
    };
}

/// Assembly that loads the fourteen argument registers from a [`RegArgs`] image at `[BASE]`: the reverse of
/// [`store_argument_registers!`], with `BASE` written the same way. The one copy of the load that [`call_native`]
/// and the mpk gate (entering a domain, and an outward stub calling the host) both make before a call. Writes
/// only the fourteen registers, so `BASE` must not use one of them.
///
/// [`call_native`]: crate::call_native
#[rustfmt::skip]
#[macro_export]
macro_rules! load_argument_registers {
    ($base:literal) => {
        concat!(
            "mov rdi, qword ptr [", $base, "]\n",
            "mov rsi, qword ptr [", $base, " + 8]\n",
            "mov rdx, qword ptr [", $base, " + 16]\n",
            "mov rcx, qword ptr [", $base, " + 24]\n",
            "mov r8, qword ptr [", $base, " + 32]\n",
            "mov r9, qword ptr [", $base, " + 40]\n",
            "movq xmm0, qword ptr [", $base, " + 48]\n",
            "movq xmm1, qword ptr [", $base, " + 56]\n",
            "movq xmm2, qword ptr [", $base, " + 64]\n",
            "movq xmm3, qword ptr [", $base, " + 72]\n",
            "movq xmm4, qword ptr [", $base, " + 80]\n",
            "movq xmm5, qword ptr [", $base, " + 88]\n",
            "movq xmm6, qword ptr [", $base, " + 96]\n",
            "movq xmm7, qword ptr [", $base, " + 104]\n",
        )
    };
}

impl RegRet {
    /// `xmm0` as a `double` return.
    pub fn as_f64(&self) -> f64 {
        f64::from_bits(self.float)
    }

    /// `xmm0` as a `float` return (its low 32 bits).
    pub fn as_f32(&self) -> f32 {
        // Truncation intended: a float return occupies the low 32 bits of xmm0.
        f32::from_bits(self.float as u32)
    }

    /// `rax` as a 64-bit signed return (`long`, `int64_t`, `ssize_t`).
    pub fn as_i64(&self) -> i64 {
        self.int as i64
    }

    /// `eax` as an `int` return. The ABI leaves the upper 32 bits of `rax` unspecified for 32-bit returns, so use
    /// this rather than [`RegRet::as_i64`] for `int`.
    pub fn as_i32(&self) -> i32 {
        // Truncation intended: a 32-bit return occupies the low 32 bits of rax.
        self.int as u32 as i32
    }

    /// `eax` as an `unsigned int` return (upper 32 bits of `rax` ignored, as for [`RegRet::as_i32`]).
    pub fn as_u32(&self) -> u32 {
        // Truncation intended: a 32-bit return occupies the low 32 bits of rax.
        self.int as u32
    }
}

/// Why an argument did not fit in registers.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum PackError {
    /// A 7th integer-class argument would go on the stack.
    #[error("more than 6 integer or pointer arguments (ward passes arguments in registers only)")]
    TooManyInts,
    /// A 9th float-class argument would go on the stack.
    #[error("more than 8 floating-point arguments (ward passes arguments in registers only)")]
    TooManyFloats,
}

/// Fills a RegArgs in argument order, as the ABI classifies them.
///
/// Push the arguments in declaration order; integers and pointers go to the next integer register, `float` and
/// `double` to the next XMM register. A rejected push leaves the packer unchanged. Registers never pushed stay 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArgPacker {
    args: RegArgs,
    next_int: usize,
    next_float: usize,
    /// Float slots holding a `float` (bit i: `xmm{i}`), whose upper half no callee reads.
    narrow_floats: u8,
}

impl ArgPacker {
    /// An empty packer.
    #[inline]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an integer-class argument (integer, pointer, `bool`, enum). Narrow integers must already be extended
    /// as their C type requires (sign-extend signed types, zero-extend unsigned ones).
    #[inline]
    pub fn push_int(&mut self, v: u64) -> Result<(), PackError> {
        let slot = self.args.ints.get_mut(self.next_int).ok_or(PackError::TooManyInts)?;
        *slot = v;
        self.next_int += 1;
        Ok(())
    }

    /// Adds a `double` argument.
    #[inline]
    pub fn push_f64(&mut self, v: f64) -> Result<(), PackError> {
        self.push_float_bits(v.to_bits())
    }

    /// Adds a `float` argument (its bits in the low 32 bits of the slot, upper bits zero).
    #[inline]
    pub fn push_f32(&mut self, v: f32) -> Result<(), PackError> {
        let slot = self.next_float;
        self.push_float_bits(u64::from(v.to_bits()))?;
        self.narrow_floats |= 1 << slot;
        Ok(())
    }

    /// The register image: pushed arguments in order, zero elsewhere.
    #[inline]
    pub fn finish(self) -> RegArgs {
        self.args
    }

    /// The register image as [`ArgPacker::finish`] gives it, in place: a caller that only passes it on to
    /// [`crate::call_native`] saves a copy of it.
    #[inline]
    pub fn regs(&self) -> &RegArgs {
        &self.args
    }

    /// The register image for [`crate::call_native_poisoned`]: pushed arguments in order, [`crate::POISON`] in
    /// every argument register not pushed and in the upper half of each `float` (where a native caller's `movss`
    /// leaves whatever was there).
    pub fn finish_poisoned(self) -> RegArgs {
        let poison = crate::POISON;
        let mut args = self.args;
        for slot in &mut args.ints[self.next_int..] {
            *slot = poison;
        }
        for slot in &mut args.floats[self.next_float..] {
            *slot = poison;
        }
        for (i, slot) in args.floats[..self.next_float].iter_mut().enumerate() {
            if self.narrow_floats & (1 << i) != 0 {
                *slot |= poison & 0xffff_ffff_0000_0000;
            }
        }
        args
    }

    #[inline]
    fn push_float_bits(&mut self, bits: u64) -> Result<(), PackError> {
        let slot = self.args.floats.get_mut(self.next_float).ok_or(PackError::TooManyFloats)?;
        *slot = bits;
        self.next_float += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packer_classifies_ints_and_floats_independently() {
        let mut p = ArgPacker::new();
        p.push_int(1).unwrap();
        p.push_f64(2.5).unwrap();
        p.push_int((-3i64) as u64).unwrap();
        p.push_f32(-1.5).unwrap();
        let in_place = *p.regs();
        let a = p.finish();
        assert_eq!(in_place, a, "the image in place is the finished one");
        assert_eq!(a.ints, [1, (-3i64) as u64, 0, 0, 0, 0]);
        assert_eq!(a.floats, [2.5f64.to_bits(), u64::from((-1.5f32).to_bits()), 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn packer_rejects_seventh_int_and_keeps_state() {
        let mut p = ArgPacker::new();
        for i in 0..MAX_INT_ARGS as u64 {
            p.push_int(i + 10).unwrap();
        }
        assert_eq!(p.push_int(99), Err(PackError::TooManyInts));
        // Float registers are still free, and the rejected push changed nothing.
        p.push_f64(1.0).unwrap();
        let a = p.finish();
        assert_eq!(a.ints, [10, 11, 12, 13, 14, 15]);
        assert_eq!(a.floats[0], 1.0f64.to_bits());
    }

    #[test]
    fn packer_rejects_ninth_float() {
        let mut p = ArgPacker::new();
        for i in 0..MAX_FLOAT_ARGS {
            if i % 2 == 0 {
                p.push_f64(i as f64).unwrap();
            } else {
                p.push_f32(i as f32).unwrap();
            }
        }
        assert_eq!(p.push_f64(9.0), Err(PackError::TooManyFloats));
        assert_eq!(p.push_f32(9.0), Err(PackError::TooManyFloats));
        p.push_int(7).unwrap();
        let a = p.finish();
        assert_eq!(a.floats[7], u64::from(7.0f32.to_bits()));
        assert_eq!(a.ints[0], 7);
    }

    #[test]
    fn pack_error_messages() {
        assert_eq!(
            PackError::TooManyInts.to_string(),
            "more than 6 integer or pointer arguments (ward passes arguments in registers only)"
        );
        assert_eq!(
            PackError::TooManyFloats.to_string(),
            "more than 8 floating-point arguments (ward passes arguments in registers only)"
        );
    }

    #[test]
    fn regret_views() {
        let r = RegRet { int: 0xffff_ffff, float: u64::from(2.5f32.to_bits()) };
        assert_eq!(r.as_i32(), -1);
        assert_eq!(r.as_u32(), u32::MAX);
        assert_eq!(r.as_i64(), 0xffff_ffff);
        assert_eq!(r.as_f32(), 2.5);
        let r = RegRet { int: u64::MAX, float: (-0.125f64).to_bits() };
        assert_eq!(r.as_i64(), -1);
        assert_eq!(r.as_f64(), -0.125);
    }
}
