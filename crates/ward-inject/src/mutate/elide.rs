//! Faults that delete an instruction: any instruction (nop), or the store that initialises a local (init). The
//! branch and interface faults delete instructions too and share [`drop`]; only their choice of site differs.

use iced_x86::{InstructionInfoFactory, Mnemonic, OpAccess, OpKind};

use super::stack_slot;
use crate::decode::{is_filler, Listing};
use crate::encode::nop_fill;

/// The instruction's bytes become NOPs of the same total length.
pub(super) fn drop(listing: &Listing<'_>, i: usize) -> Vec<u8> {
    nop_fill(listing.instrs[i].len())
}

/// Any instruction but padding, and but `endbr64`, which does nothing unless indirect-branch tracking is on, so
/// deleting it would be a trial that tests nothing.
pub(super) fn nop_sites(listing: &Listing<'_>) -> Vec<usize> {
    (0..listing.instrs.len())
        .filter(|&i| {
            let instr = &listing.instrs[i];
            !is_filler(instr) && !matches!(instr.mnemonic(), Mnemonic::Endbr64 | Mnemonic::Endbr32)
        })
        .collect()
}

/// A store of a register or an immediate, and nothing else (`mov`, `movaps`, `movq`, ... but not `add`), into a
/// stack slot of the function's own frame (see [`stack_slot`]).
pub(super) fn init_sites(listing: &Listing<'_>) -> Vec<usize> {
    let mut factory = InstructionInfoFactory::new();
    (0..listing.instrs.len())
        .filter(|&i| {
            let instr = &listing.instrs[i];
            !is_filler(instr)
                && instr.op_count() == 2
                && instr.op0_kind() == OpKind::Memory
                && (instr.op1_kind() == OpKind::Register || is_immediate_store(instr.op1_kind()))
                && stack_slot(instr).is_some()
                && factory.info(instr).op_access(0) == OpAccess::Write
        })
        .collect()
}

fn is_immediate_store(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    )
}
