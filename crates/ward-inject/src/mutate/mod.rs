//! The code transformations, one module per family. Each fault type has two halves:
//!
//! - `sites`: the instructions of a function the type applies to. This is a cheap, syntactic test; it may admit an
//!   instruction for which no mutation fits (say, every other register needs a longer encoding).
//! - `apply`: the replacement bytes for one site, of exactly the site's length, or `None` when nothing fits, in which
//!   case the planner moves on to another site.
//!
//! Mutations never change an instruction's length: shorter encodings are padded with NOPs, longer ones refused.

mod control_flow;
mod elide;
mod interface;
mod operand;
mod pointer;
mod regs;
mod text;

use iced_x86::{Instruction, OpAccess, OpKind, Register};

use crate::decode::Listing;
use crate::fault_type::FaultType;
use crate::rng::Rng;

/// Indices (into `listing.instrs`) of the instructions `fault` applies to, in address order.
pub(crate) fn sites(fault: FaultType, listing: &Listing<'_>) -> Vec<usize> {
    match fault {
        FaultType::Source => operand::source_sites(listing),
        FaultType::Destination => operand::destination_sites(listing),
        FaultType::Pointer => pointer::sites(listing),
        FaultType::Interface => interface::sites(listing),
        FaultType::Branch => control_flow::branch_sites(listing),
        FaultType::Loop => control_flow::loop_sites(listing),
        FaultType::OffByOne => control_flow::off_by_one_sites(listing),
        FaultType::Text => text::sites(listing),
        FaultType::Nop => elide::nop_sites(listing),
        FaultType::Init => elide::init_sites(listing),
    }
}

/// The replacement for instruction `i` of `listing`: exactly as long as the original.
pub(crate) fn apply(fault: FaultType, listing: &Listing<'_>, i: usize, rng: &mut Rng) -> Option<Vec<u8>> {
    let out = match fault {
        FaultType::Source => operand::apply_source(listing, i, rng),
        FaultType::Destination => operand::apply_destination(listing, i, rng),
        FaultType::Pointer => pointer::apply(listing, i, rng),
        FaultType::Branch | FaultType::Nop | FaultType::Init | FaultType::Interface => Some(elide::drop(listing, i)),
        FaultType::Loop => control_flow::apply_loop(listing, i),
        FaultType::OffByOne => control_flow::apply_off_by_one(listing, i, rng),
        FaultType::Text => text::apply(listing, i, rng),
    }?;
    let original = listing.bytes(i);
    debug_assert_eq!(out.len(), original.len(), "{fault} changed an instruction's length");
    // A length change would shift every following instruction; a mutation that reproduces the original bytes
    // would be reported as a fault that is not one.
    (out.len() == original.len() && out != original).then_some(out)
}

pub(crate) fn reads(access: OpAccess) -> bool {
    matches!(access, OpAccess::Read | OpAccess::CondRead)
}

pub(crate) fn writes(access: OpAccess) -> bool {
    matches!(access, OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite)
}

/// The stack slot an explicit memory operand names, as (frame register, displacement): `[rsp+d]` with `d >= 0`
/// (locals and outgoing arguments below the frame's top) or `[rbp-d]` (locals of a frame-pointer frame). `[rbp+d]`
/// is the caller's frame (return address, stack arguments), so it is not a local.
pub(crate) fn stack_slot(instr: &Instruction) -> Option<(Register, i64)> {
    if instr.memory_index() != Register::None || !(0..instr.op_count()).any(|i| instr.op_kind(i) == OpKind::Memory) {
        return None;
    }
    let displacement = instr.memory_displacement64() as i64;
    match instr.memory_base() {
        Register::RSP if displacement >= 0 => Some((Register::RSP, displacement)),
        Register::RBP if displacement < 0 => Some((Register::RBP, displacement)),
        _ => None,
    }
}

/// Flips bit `bit` of the little-endian field `field` (a byte range) of `bytes`.
pub(crate) fn flip_bit(bytes: &[u8], field_start: usize, bit: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[field_start + bit / 8] ^= 1 << (bit % 8);
    out
}
