//! Producing replacement bytes that fit exactly where the original instruction was, so every following
//! instruction, and every branch into them, stays where it was.

use iced_x86::{Encoder, Instruction};

/// The recommended multi-byte NOPs of the Intel SDM (volume 2B, "NOP"), indexed by length - 1: one instruction
/// per hole keeps reports short. Except for two bytes: the SDM's `66 90` disassembles as `xchg ax, ax`, which in
/// a report reads like an injected exchange, so two plain NOPs stand in for it.
const NOPS: [&[u8]; 9] = [
    &[0x90],
    &[0x90, 0x90],
    &[0x0f, 0x1f, 0x00],
    &[0x0f, 0x1f, 0x40, 0x00],
    &[0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
    &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],
    &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
    &[0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
];

/// `len` bytes of NOPs: as few instructions as possible.
pub(crate) fn nop_fill(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut left = len;
    while left > 0 {
        let n = left.min(NOPS.len());
        out.extend_from_slice(NOPS[n - 1]);
        left -= n;
    }
    out
}

/// Encodes `instr` at its own address and pads it with NOPs to `len` bytes; `None` if it cannot be encoded (an
/// operand the form does not allow) or needs more than `len` bytes. Encoding at the original address keeps the
/// absolute targets of relative branches and RIP-relative operands.
pub(crate) fn reencode(instr: &Instruction, len: usize) -> Option<Vec<u8>> {
    let mut encoder = Encoder::new(64);
    let n = encoder.encode(instr, instr.ip()).ok()?;
    if n > len {
        return None;
    }
    let mut bytes = encoder.take_buffer();
    bytes.extend_from_slice(&nop_fill(len - n));
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use iced_x86::{Code, Decoder, DecoderOptions, Mnemonic, Register};

    use super::*;

    fn decode_all(bytes: &[u8]) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE);
        let mut out = Vec::new();
        while d.can_decode() {
            out.push(d.decode());
        }
        out
    }

    #[test]
    fn every_fill_length_is_nops_only_and_exact() {
        for len in 0..=40 {
            let fill = nop_fill(len);
            assert_eq!(fill.len(), len);
            let instrs = decode_all(&fill);
            assert_eq!(instrs.iter().map(|i| i.len()).sum::<usize>(), len);
            assert!(instrs.iter().all(|i| i.mnemonic() == Mnemonic::Nop), "len {len}: {instrs:?}");
            let expected = len.div_ceil(9) + usize::from(len % 9 == 2);
            assert_eq!(instrs.len(), expected, "len {len}");
        }
    }

    #[test]
    fn shorter_encodings_are_padded_longer_ones_refused() {
        // mov eax, ebx: 2 bytes; re-encoded into a 5-byte hole it is followed by a 3-byte NOP.
        let mut mov = Instruction::with2(Code::Mov_r32_rm32, Register::EAX, Register::EBX).expect("valid");
        mov.set_ip(0x1000);
        let bytes = reencode(&mov, 5).expect("fits");
        let instrs = decode_all(&bytes);
        assert_eq!(instrs.len(), 2);
        assert_eq!(instrs[0].code(), Code::Mov_r32_rm32);
        assert_eq!(instrs[1].len(), 3);
        // mov r9d, ebx needs a REX prefix: 3 bytes, which a 2-byte hole cannot take.
        mov.set_op0_register(Register::R9D);
        assert!(reencode(&mov, 2).is_none());
    }

    #[test]
    fn relative_branches_keep_their_target() {
        let mut d = Decoder::with_ip(64, &[0x7c, 0x10], 0x2000, DecoderOptions::NONE);
        let mut jl = d.decode();
        let target = jl.near_branch_target();
        jl.negate_condition_code();
        let bytes = reencode(&jl, 2).expect("fits");
        let mut d = Decoder::with_ip(64, &bytes, 0x2000, DecoderOptions::NONE);
        let jge = d.decode();
        assert_eq!(jge.mnemonic(), Mnemonic::Jge);
        assert_eq!(jge.near_branch_target(), target);
    }
}
