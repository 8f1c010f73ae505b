//! Pointer faults: a wrong address computation. One part of an explicit memory operand `[base + index*scale +
//! displacement]` changes: a bit of the displacement (a wrong field or element offset), or the base or index
//! register (a pointer taken from the wrong variable). `lea` counts: it is how compilers do pointer arithmetic.

use iced_x86::{Instruction, Mnemonic, OpKind};

use super::{flip_bit, regs};
use crate::decode::{is_filler, Listing};
use crate::encode::reencode;
use crate::rng::Rng;

#[derive(Clone, Copy)]
enum Part {
    Displacement,
    Base,
    Index,
}

fn has_memory_operand(instr: &Instruction) -> bool {
    (0..instr.op_count()).any(|op| instr.op_kind(op) == OpKind::Memory)
}

fn parts(listing: &Listing<'_>, i: usize) -> Vec<Part> {
    let instr = &listing.instrs[i];
    // Prefetches and hint NOPs compute an address but never fault or change state through it.
    if is_filler(instr)
        || !has_memory_operand(instr)
        || matches!(
            instr.mnemonic(),
            Mnemonic::Prefetchnta | Mnemonic::Prefetcht0 | Mnemonic::Prefetcht1 | Mnemonic::Prefetcht2
        )
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    if listing.consts[i].displacement_size() > 0 {
        out.push(Part::Displacement);
    }
    // RIP cannot be swapped for a register without re-basing the displacement; its displacement still changes.
    if instr.memory_base().is_gpr() {
        out.push(Part::Base);
    }
    if instr.memory_index().is_gpr() {
        out.push(Part::Index);
    }
    out
}

pub(super) fn sites(listing: &Listing<'_>) -> Vec<usize> {
    (0..listing.instrs.len()).filter(|&i| !parts(listing, i).is_empty()).collect()
}

pub(super) fn apply(listing: &Listing<'_>, i: usize, rng: &mut Rng) -> Option<Vec<u8>> {
    let mut parts = parts(listing, i);
    rng.shuffle(&mut parts);
    let original = listing.instrs[i];
    let len = original.len();
    parts.into_iter().find_map(|part| match part {
        Part::Displacement => {
            let consts = &listing.consts[i];
            let bit = rng.below(consts.displacement_size() * 8);
            Some(flip_bit(listing.bytes(i), consts.displacement_offset(), bit))
        }
        Part::Base => regs::others(original.memory_base(), true, rng).into_iter().find_map(|reg| {
            let mut changed = original;
            changed.set_memory_base(reg);
            reencode(&changed, len)
        }),
        // Without the stack pointer: its encoding as an index means "no index".
        Part::Index => regs::others(original.memory_index(), false, rng).into_iter().find_map(|reg| {
            let mut changed = original;
            changed.set_memory_index(reg);
            reencode(&changed, len)
        }),
    })
}
