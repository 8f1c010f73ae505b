//! Each fault type does what Table II says, checked by decoding the instruction before and after.

mod common;

use common::*;
use iced_x86::{ConditionCode, FlowControl, Instruction, Mnemonic, OpKind, Register};
use ward_inject::{FaultType, InjectedFault, Plan};

/// Faults of type `t` from several seeds (five each) in `object`.
fn faults(object: &[u8], t: FaultType, seeds: std::ops::Range<u64>) -> Vec<InjectedFault> {
    seeds.flat_map(|seed| inject_ok(object, &plan(t, seed)).faults).collect()
}

fn all_nops(instrs: &[Instruction]) -> bool {
    !instrs.is_empty() && instrs.iter().all(|i| i.mnemonic() == Mnemonic::Nop)
}

fn is_conditional_branch(i: &Instruction) -> bool {
    i.flow_control() == FlowControl::ConditionalBranch
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

const PARAMS: [Register; 6] = [Register::RDI, Register::RSI, Register::RDX, Register::RCX, Register::R8, Register::R9];

#[test]
fn branch_deletes_a_conditional_branch() {
    for f in faults(well(), FaultType::Branch, 0..8).iter().chain(&faults(unoptimised(), FaultType::Branch, 0..4)) {
        assert!(is_conditional_branch(&before_instr(f)), "{f:?}");
        let after = after_instrs(f);
        assert!(all_nops(&after), "{f:?}");
        assert!(!after.iter().any(is_conditional_branch), "{f:?}");
    }
}

#[test]
fn loop_inverts_a_backward_branch() {
    for f in faults(well(), FaultType::Loop, 0..8).iter().chain(&faults(unoptimised(), FaultType::Loop, 0..4)) {
        let before = before_instr(f);
        let after = after_instrs(f);
        assert_eq!(after.len(), 1, "{f:?}");
        let after = after[0];
        assert!(before.is_jcc_short_or_near() && after.is_jcc_short_or_near(), "{f:?}");
        assert!(before.near_branch_target() <= before.ip(), "{f:?}: not a backward branch");
        assert_eq!(after.near_branch_target(), before.near_branch_target(), "{f:?}: target moved");
        let mut negated = before;
        negated.negate_condition_code();
        assert_eq!(after.condition_code(), negated.condition_code(), "{f:?}");
        assert_ne!(after.condition_code(), before.condition_code(), "{f:?}");
    }
}

fn off_by_one_pair(cc: ConditionCode) -> Option<ConditionCode> {
    use ConditionCode as C;
    Some(match cc {
        C::l => C::le,
        C::le => C::l,
        C::g => C::ge,
        C::ge => C::g,
        C::b => C::be,
        C::be => C::b,
        C::a => C::ae,
        C::ae => C::a,
        _ => return None,
    })
}

#[test]
fn off_by_one_moves_a_boundary_by_one() {
    let mut seen_cc = false;
    let mut seen_cmp = false;
    for f in faults(well(), FaultType::OffByOne, 0..8).iter().chain(&faults(unoptimised(), FaultType::OffByOne, 0..8)) {
        let before = before_instr(f);
        let after = after_instrs(f);
        assert_eq!(after.len(), 1, "{f:?}");
        let after = after[0];
        if before.mnemonic() == Mnemonic::Cmp {
            seen_cmp = true;
            assert_eq!(after.mnemonic(), Mnemonic::Cmp, "{f:?}");
            let (old, new) = (before.immediate(1) as i64, after.immediate(1) as i64);
            assert_eq!((old - new).abs(), 1, "{f:?}");
        } else {
            seen_cc = true;
            assert_eq!(off_by_one_pair(before.condition_code()), Some(after.condition_code()), "{f:?}");
            if before.is_jcc_short_or_near() {
                assert_eq!(after.near_branch_target(), before.near_branch_target(), "{f:?}");
            }
        }
    }
    assert!(seen_cc && seen_cmp, "both forms should occur");
}

#[test]
fn off_by_one_turns_jl_into_jle() {
    // `i < n` at -O0 is `cmp; jl` at the bottom of the loop.
    let plan = Plan { function: Some("count_below".into()), count: 100, ..plan(FaultType::OffByOne, 0) };
    let injection = inject_ok(unoptimised(), &plan);
    let jl = injection.faults.iter().find(|f| before_instr(f).mnemonic() == Mnemonic::Jl).expect("a jl in the loop");
    assert_eq!(after_instrs(jl)[0].mnemonic(), Mnemonic::Jle, "{jl:?}");
    assert!(jl.before.starts_with("jl ") && jl.after.starts_with("jle "), "{jl:?}");
}

#[test]
fn destination_writes_another_register_of_the_same_size() {
    for f in faults(well(), FaultType::Destination, 0..8) {
        let before = before_instr(&f);
        let after = after_instrs(&f)[0];
        assert_eq!(after.mnemonic(), before.mnemonic(), "{f:?}");
        let changed: Vec<u32> =
            (0..before.op_count()).filter(|&op| before.op_register(op) != after.op_register(op)).collect();
        assert_eq!(changed.len(), 1, "{f:?}: one register operand changes");
        let (old, new) = (before.op_register(changed[0]), after.op_register(changed[0]));
        assert!(old.is_gpr() && new.is_gpr() && old.size() == new.size(), "{f:?}");
        assert_ne!(new.full_register(), Register::RSP, "{f:?}");
    }
}

#[test]
fn source_reads_another_register_or_a_flipped_immediate() {
    let (mut registers, mut immediates) = (0, 0);
    for f in faults(well(), FaultType::Source, 0..12) {
        let before = before_instr(&f);
        let after = after_instrs(&f)[0];
        assert_eq!(after.mnemonic(), before.mnemonic(), "{f:?}");
        let changed_reg: Vec<u32> = (0..before.op_count())
            .filter(|&op| before.op_kind(op) == OpKind::Register && before.op_register(op) != after.op_register(op))
            .collect();
        if changed_reg.is_empty() {
            immediates += 1;
            let op = (0..before.op_count())
                .find(|&op| is_immediate(before.op_kind(op)) && before.immediate(op) != after.immediate(op))
                .expect("an immediate changed");
            // Exactly one bit of the encoded field.
            let differing: u32 =
                unhex(&f.before_bytes).iter().zip(unhex(&f.after_bytes)).map(|(a, b)| (a ^ b).count_ones()).sum();
            assert_eq!(differing, 1, "{f:?} (operand {op})");
        } else {
            registers += 1;
            assert_eq!(changed_reg.len(), 1, "{f:?}");
            let (old, new) = (before.op_register(changed_reg[0]), after.op_register(changed_reg[0]));
            assert!(old.is_gpr() && new.is_gpr() && old.size() == new.size(), "{f:?}");
        }
    }
    assert!(registers > 0 && immediates > 0, "registers {registers}, immediates {immediates}");
}

#[test]
fn pointer_changes_only_the_address() {
    for f in faults(well(), FaultType::Pointer, 0..8).iter().chain(&faults(unoptimised(), FaultType::Pointer, 0..4)) {
        let before = before_instr(f);
        let after = after_instrs(f)[0];
        assert_eq!(after.code(), before.code(), "{f:?}");
        let address = |i: &Instruction| (i.memory_base(), i.memory_index(), i.memory_displacement64());
        assert_ne!(address(&before), address(&after), "{f:?}");
        for op in 0..before.op_count() {
            if before.op_kind(op) == OpKind::Register {
                assert_eq!(before.op_register(op), after.op_register(op), "{f:?}");
            }
        }
    }
}

#[test]
fn interface_drops_the_use_of_a_parameter() {
    for f in faults(well(), FaultType::Interface, 0..8).iter().chain(&faults(unoptimised(), FaultType::Interface, 0..8))
    {
        assert!(all_nops(&after_instrs(f)), "{f:?}");
        let before = before_instr(f);
        let reads_param = (1..before.op_count()).any(|op| match before.op_kind(op) {
            OpKind::Register => PARAMS.contains(&before.op_register(op).full_register()),
            OpKind::Memory => {
                PARAMS.contains(&before.memory_base().full_register())
                    || PARAMS.contains(&before.memory_index().full_register())
                    // A reload from the slot a parameter was spilled to.
                    || matches!(before.memory_base(), Register::RBP | Register::RSP)
            }
            _ => false,
        });
        assert!(reads_param, "{f:?}");
    }
}

#[test]
fn interface_finds_reloads_of_spilled_parameters() {
    // At -O0, count_below spills v, n and limit to [rbp-..] and reloads them in the loop.
    let plan = Plan { function: Some("count_below".into()), count: 100, ..plan(FaultType::Interface, 0) };
    let injection = inject_ok(unoptimised(), &plan);
    let spills = injection.faults.iter().filter(|f| {
        let i = before_instr(f);
        i.op0_kind() == OpKind::Memory && i.memory_base() == Register::RBP
    });
    let reloads = injection.faults.iter().filter(|f| {
        let i = before_instr(f);
        i.op0_kind() == OpKind::Register && i.op1_kind() == OpKind::Memory && i.memory_base() == Register::RBP
    });
    assert_eq!(spills.count(), 3, "{:#?}", injection.faults);
    // `v` is reloaded into rax; n and limit are only compared with in place, which is no load to drop.
    assert!(reloads.count() >= 1, "{:#?}", injection.faults);
}

#[test]
fn init_drops_a_store_to_a_stack_slot() {
    let faults = faults(unoptimised(), FaultType::Init, 0..8);
    for f in &faults {
        assert!(all_nops(&after_instrs(f)), "{f:?}");
        let before = before_instr(f);
        assert_eq!(before.op0_kind(), OpKind::Memory, "{f:?}");
        let d = before.memory_displacement64() as i64;
        let slot =
            (before.memory_base() == Register::RBP && d < 0) || (before.memory_base() == Register::RSP && d >= 0);
        assert!(slot && before.memory_index() == Register::None, "{f:?}");
    }
    // `long tmp[4] = {a, b, 3, 4}` stores immediates.
    assert!(faults.iter().any(|f| before_instr(f).op1_kind() != OpKind::Register), "{faults:#?}");
}

#[test]
fn text_flips_exactly_one_bit() {
    for f in faults(well(), FaultType::Text, 0..8) {
        let differing: u32 =
            unhex(&f.before_bytes).iter().zip(unhex(&f.after_bytes)).map(|(a, b)| (a ^ b).count_ones()).sum();
        assert_eq!(differing, 1, "{f:?}");
        let after = after_instrs(&f);
        assert_eq!(after.len(), 1, "{f:?}: the flip must keep the instruction's length");
        assert!(!after[0].is_invalid(), "{f:?}");
    }
}

#[test]
fn nop_deletes_an_instruction() {
    for f in faults(well(), FaultType::Nop, 0..8) {
        assert_ne!(before_instr(&f).mnemonic(), Mnemonic::Nop, "{f:?}");
        assert!(all_nops(&after_instrs(&f)), "{f:?}");
        assert!(f.after.starts_with("nop"), "{f:?}");
    }
}
