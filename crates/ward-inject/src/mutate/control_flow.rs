//! Faults in control flow: a deleted branch (branch), an inverted loop test (loop), and a boundary test off by one
//! (off-by-one).

use std::collections::HashMap;
use std::sync::OnceLock;

use iced_x86::{Code, ConditionCode, EncodingKind, FlowControl, Instruction, Mnemonic, OpCodeTableKind, OpKind};

use crate::decode::Listing;
use crate::encode::reencode;
use crate::rng::Rng;

/// `jcc`, `jrcxz`, `loop`: a relative branch taken or not depending on the flags or a counter.
fn is_conditional_branch(instr: &Instruction) -> bool {
    instr.flow_control() == FlowControl::ConditionalBranch
        && matches!(instr.op0_kind(), OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64)
}

pub(super) fn branch_sites(listing: &Listing<'_>) -> Vec<usize> {
    (0..listing.instrs.len()).filter(|&i| is_conditional_branch(&listing.instrs[i])).collect()
}

/// A `jcc` whose target is at or before itself: the test at the bottom of a loop, which compilers emit for every
/// `for` and `while` (rotated so the body falls through to the test).
pub(super) fn loop_sites(listing: &Listing<'_>) -> Vec<usize> {
    (0..listing.instrs.len())
        .filter(|&i| {
            let instr = &listing.instrs[i];
            instr.is_jcc_short_or_near() && instr.near_branch_target() <= instr.ip()
        })
        .collect()
}

/// The inverted branch exits the loop after its first pass, or never, as a wrong termination test would.
pub(super) fn apply_loop(listing: &Listing<'_>, i: usize) -> Option<Vec<u8>> {
    let mut instr = listing.instrs[i];
    instr.negate_condition_code();
    reencode(&instr, instr.len())
}

/// `<` ↔ `<=` and `>` ↔ `>=`, signed and unsigned.
fn off_by_one_condition(cc: ConditionCode) -> Option<ConditionCode> {
    Some(match cc {
        ConditionCode::l => ConditionCode::le,
        ConditionCode::le => ConditionCode::l,
        ConditionCode::g => ConditionCode::ge,
        ConditionCode::ge => ConditionCode::g,
        ConditionCode::b => ConditionCode::be,
        ConditionCode::be => ConditionCode::b,
        ConditionCode::a => ConditionCode::ae,
        ConditionCode::ae => ConditionCode::a,
        _ => return None,
    })
}

/// The same instruction form (`jcc rel8`, `jcc rel32`, `setcc`, `cmovcc` of one operand size) with condition `cc`.
/// These opcodes carry the condition in their low nibble; iced has no setter for it, so the forms are looked up by
/// (opcode table, opcode high nibble, operand size, condition) once, from iced's own opcode tables.
fn with_condition(code: Code, cc: ConditionCode) -> Option<Code> {
    type Key = (OpCodeTableKind, u32, u32, ConditionCode);
    static FORMS: OnceLock<HashMap<Key, Code>> = OnceLock::new();
    let key = |c: Code| {
        let op = c.op_code();
        (op.table(), op.op_code() & 0xf0, op.operand_size(), c.condition_code())
    };
    let is_cc_form = |c: Code| {
        let op = c.op_code();
        op.encoding() == EncodingKind::Legacy
            && matches!(
                (op.table(), op.op_code() & 0xf0),
                (OpCodeTableKind::Normal, 0x70) | (OpCodeTableKind::T0F, 0x40 | 0x80 | 0x90)
            )
    };
    let forms = FORMS.get_or_init(|| Code::values().filter(|&c| is_cc_form(c)).map(|c| (key(c), c)).collect());
    if !is_cc_form(code) {
        return None;
    }
    let (table, high, size, _) = key(code);
    forms.get(&(table, high, size, cc)).copied()
}

fn is_cmp_with_immediate(listing: &Listing<'_>, i: usize) -> bool {
    let instr = &listing.instrs[i];
    instr.mnemonic() == Mnemonic::Cmp && listing.consts[i].immediate_size() > 0
}

fn has_off_by_one_condition(instr: &Instruction) -> bool {
    off_by_one_condition(instr.condition_code()).is_some_and(|cc| with_condition(instr.code(), cc).is_some())
}

pub(super) fn off_by_one_sites(listing: &Listing<'_>) -> Vec<usize> {
    (0..listing.instrs.len())
        .filter(|&i| has_off_by_one_condition(&listing.instrs[i]) || is_cmp_with_immediate(listing, i))
        .collect()
}

pub(super) fn apply_off_by_one(listing: &Listing<'_>, i: usize, rng: &mut Rng) -> Option<Vec<u8>> {
    let original = listing.instrs[i];
    if let Some(cc) = off_by_one_condition(original.condition_code()) {
        let mut changed = original;
        changed.set_code(with_condition(original.code(), cc)?);
        return reencode(&changed, original.len());
    }
    if is_cmp_with_immediate(listing, i) {
        let first = if rng.coin() { 1 } else { -1 };
        return [first, -first].into_iter().find_map(|delta| nudge_immediate(listing, i, delta));
    }
    None
}

/// The compare's immediate plus `delta`, written over its encoded bytes; `None` if the result does not fit the
/// field as a signed number (the field is sign-extended to the operand size in all but the 8-bit forms, and an
/// 8-bit `0x7f + 1` would compare as -128, which is no longer off by one).
fn nudge_immediate(listing: &Listing<'_>, i: usize, delta: i64) -> Option<Vec<u8>> {
    let consts = &listing.consts[i];
    let size = consts.immediate_size();
    let start = consts.immediate_offset();
    let mut bytes = listing.bytes(i).to_vec();
    let field = &mut bytes[start..start + size];
    let mut raw = [0u8; 8];
    raw[..size].copy_from_slice(field);
    let shift = 64 - 8 * size as u32;
    // Sign-extend the field to 64 bits.
    let value = (i64::from_le_bytes(raw) << shift) >> shift;
    let new = value.checked_add(delta)?;
    if (new << shift) >> shift != new {
        return None;
    }
    field.copy_from_slice(&new.to_le_bytes()[..size]);
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_forms_are_found_for_every_family() {
        let pairs = [
            (Code::Jl_rel8_64, Code::Jle_rel8_64),
            (Code::Jle_rel32_64, Code::Jl_rel32_64),
            (Code::Jb_rel8_64, Code::Jbe_rel8_64),
            (Code::Ja_rel32_64, Code::Jae_rel32_64),
            (Code::Jg_rel8_64, Code::Jge_rel8_64),
            (Code::Setl_rm8, Code::Setle_rm8),
            (Code::Seta_rm8, Code::Setae_rm8),
            (Code::Cmovl_r32_rm32, Code::Cmovle_r32_rm32),
            (Code::Cmovbe_r64_rm64, Code::Cmovb_r64_rm64),
            (Code::Cmovg_r16_rm16, Code::Cmovge_r16_rm16),
        ];
        for (from, to) in pairs {
            let cc = off_by_one_condition(from.condition_code()).expect("a boundary test");
            assert_eq!(with_condition(from, cc), Some(to), "{from:?}");
            let back = off_by_one_condition(to.condition_code()).expect("a boundary test");
            assert_eq!(with_condition(to, back), Some(from), "{to:?}");
        }
        assert_eq!(off_by_one_condition(ConditionCode::e), None);
        assert_eq!(with_condition(Code::Add_r32_rm32, ConditionCode::l), None);
    }
}
