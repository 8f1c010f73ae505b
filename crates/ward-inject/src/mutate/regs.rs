//! General-purpose registers grouped by size, for swapping one operand register for another of the same width.

use iced_x86::Register;

use crate::rng::Rng;

const GPR64: [Register; 16] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RBX,
    Register::RSP,
    Register::RBP,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

const GPR32: [Register; 16] = [
    Register::EAX,
    Register::ECX,
    Register::EDX,
    Register::EBX,
    Register::ESP,
    Register::EBP,
    Register::ESI,
    Register::EDI,
    Register::R8D,
    Register::R9D,
    Register::R10D,
    Register::R11D,
    Register::R12D,
    Register::R13D,
    Register::R14D,
    Register::R15D,
];

const GPR16: [Register; 16] = [
    Register::AX,
    Register::CX,
    Register::DX,
    Register::BX,
    Register::SP,
    Register::BP,
    Register::SI,
    Register::DI,
    Register::R8W,
    Register::R9W,
    Register::R10W,
    Register::R11W,
    Register::R12W,
    Register::R13W,
    Register::R14W,
    Register::R15W,
];

/// Low bytes, reachable in any instruction with a REX prefix.
const GPR8_LOW: [Register; 16] = [
    Register::AL,
    Register::CL,
    Register::DL,
    Register::BL,
    Register::SPL,
    Register::BPL,
    Register::SIL,
    Register::DIL,
    Register::R8L,
    Register::R9L,
    Register::R10L,
    Register::R11L,
    Register::R12L,
    Register::R13L,
    Register::R14L,
    Register::R15L,
];

/// The legacy byte registers: `ah`..`bh` exist only in instructions without a REX prefix, where the low bytes
/// of the first four registers are their only siblings.
const GPR8_LEGACY: [Register; 8] =
    [Register::AL, Register::CL, Register::DL, Register::BL, Register::AH, Register::CH, Register::DH, Register::BH];

pub(crate) fn is_stack_pointer(reg: Register) -> bool {
    reg.full_register() == Register::RSP
}

/// The other general-purpose registers of `reg`'s size, in random order; empty if `reg` is not one.
///
/// `keep_stack_pointer` decides whether the stack pointer may be chosen. Source and destination faults model a
/// wrong variable in an assignment; handing one the stack pointer would crash at the next `ret` whatever the
/// assignment was, so they leave it out. A corrupted base register is exactly what a pointer fault is about, so
/// they keep it.
pub(crate) fn others(reg: Register, keep_stack_pointer: bool, rng: &mut Rng) -> Vec<Register> {
    let family: &[Register] = if matches!(reg, Register::AH | Register::CH | Register::DH | Register::BH) {
        &GPR8_LEGACY
    } else if reg.is_gpr8() {
        &GPR8_LOW
    } else if reg.is_gpr16() {
        &GPR16
    } else if reg.is_gpr32() {
        &GPR32
    } else if reg.is_gpr64() {
        &GPR64
    } else {
        &[]
    };
    let mut out: Vec<Register> =
        family.iter().copied().filter(|&r| r != reg && (keep_stack_pointer || !is_stack_pointer(r))).collect();
    rng.shuffle(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_without_the_original() {
        let mut rng = Rng::new(1);
        let r = others(Register::EAX, false, &mut rng);
        assert_eq!(r.len(), 14);
        assert!(r.iter().all(|x| x.is_gpr32() && *x != Register::EAX && *x != Register::ESP));
        assert_eq!(others(Register::RBX, true, &mut rng).len(), 15);
        assert!(others(Register::AH, false, &mut rng).iter().all(|x| GPR8_LEGACY.contains(x)));
        assert!(others(Register::XMM0, false, &mut rng).is_empty());
        assert!(others(Register::RIP, true, &mut rng).is_empty());
    }
}
