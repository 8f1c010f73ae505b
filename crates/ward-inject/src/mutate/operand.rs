//! Source and destination faults: an assignment that reads the wrong variable or writes the wrong one.
//!
//! A register operand becomes another general-purpose register of the same size (re-encoded, so the result is a
//! real instruction a compiler could have emitted, not the arbitrary bit pattern a raw flip gives); an immediate
//! source gets one of its encoded bits flipped, in place.

use iced_x86::{InstructionInfoFactory, OpKind};

use super::{flip_bit, reads, regs, writes};
use crate::decode::{is_filler, Listing};
use crate::encode::reencode;
use crate::rng::Rng;

/// One operand that can be changed.
#[derive(Clone, Copy)]
enum Target {
    /// Explicit register operand number n.
    Register(u32),
    /// The (first) immediate.
    Immediate,
}

fn is_immediate(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Immediate8
            | OpKind::Immediate16
            | OpKind::Immediate32
            | OpKind::Immediate64
            | OpKind::Immediate8to16
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32to64
    )
}

/// Register operands only read (the sources of `mov`, both operands of `cmp` and `test`), and immediates.
fn source_targets(listing: &Listing<'_>, i: usize, info: &mut InstructionInfoFactory) -> Vec<Target> {
    let instr = &listing.instrs[i];
    if is_filler(instr) {
        return Vec::new();
    }
    let info = info.info(instr);
    let mut out = Vec::new();
    for op in 0..instr.op_count() {
        let kind = instr.op_kind(op);
        if kind == OpKind::Register && instr.op_register(op).is_gpr() && reads(info.op_access(op)) {
            out.push(Target::Register(op));
        } else if is_immediate(kind) && listing.consts[i].immediate_size() > 0 {
            out.push(Target::Immediate);
        }
    }
    out
}

/// Register operands written (pure writes as in `mov`, and read-modify-writes as in `add`).
fn destination_targets(listing: &Listing<'_>, i: usize, info: &mut InstructionInfoFactory) -> Vec<Target> {
    let instr = &listing.instrs[i];
    if is_filler(instr) {
        return Vec::new();
    }
    let info = info.info(instr);
    (0..instr.op_count())
        .filter(|&op| {
            instr.op_kind(op) == OpKind::Register && instr.op_register(op).is_gpr() && writes(info.op_access(op))
        })
        .map(Target::Register)
        .collect()
}

pub(super) fn source_sites(listing: &Listing<'_>) -> Vec<usize> {
    let mut info = InstructionInfoFactory::new();
    (0..listing.instrs.len()).filter(|&i| !source_targets(listing, i, &mut info).is_empty()).collect()
}

pub(super) fn destination_sites(listing: &Listing<'_>) -> Vec<usize> {
    let mut info = InstructionInfoFactory::new();
    (0..listing.instrs.len()).filter(|&i| !destination_targets(listing, i, &mut info).is_empty()).collect()
}

pub(super) fn apply_source(listing: &Listing<'_>, i: usize, rng: &mut Rng) -> Option<Vec<u8>> {
    let targets = source_targets(listing, i, &mut InstructionInfoFactory::new());
    change_one(listing, i, targets, rng)
}

pub(super) fn apply_destination(listing: &Listing<'_>, i: usize, rng: &mut Rng) -> Option<Vec<u8>> {
    let targets = destination_targets(listing, i, &mut InstructionInfoFactory::new());
    change_one(listing, i, targets, rng)
}

/// Tries the operands in random order and returns the first change that fits.
fn change_one(listing: &Listing<'_>, i: usize, mut targets: Vec<Target>, rng: &mut Rng) -> Option<Vec<u8>> {
    rng.shuffle(&mut targets);
    targets.into_iter().find_map(|t| match t {
        Target::Register(op) => swap_register(listing, i, op, rng),
        Target::Immediate => flip_immediate_bit(listing, i, rng),
    })
}

/// Operand `op` of instruction `i` replaced by the first other register of its size whose encoding fits. Forms
/// with a fixed register (`shl eax, cl`, `add eax, imm32`'s short form) refuse every other one and yield `None`.
fn swap_register(listing: &Listing<'_>, i: usize, op: u32, rng: &mut Rng) -> Option<Vec<u8>> {
    let original = listing.instrs[i];
    let len = original.len();
    regs::others(original.op_register(op), false, rng).into_iter().find_map(|reg| {
        let mut changed = original;
        changed.set_op_register(op, reg);
        reencode(&changed, len)
    })
}

fn flip_immediate_bit(listing: &Listing<'_>, i: usize, rng: &mut Rng) -> Option<Vec<u8>> {
    let consts = &listing.consts[i];
    let bits = consts.immediate_size() * 8;
    Some(flip_bit(listing.bytes(i), consts.immediate_offset(), rng.below(bits)))
}
