//! Interface faults: the function uses whatever a register or stack slot held before instead of the parameter it
//! was passed.
//!
//! Under the System V x86-64 ABI the first six integer parameters arrive in rdi, rsi, rdx, rcx, r8 and r9. A
//! function takes them up near its start, by copying them elsewhere (`mov rbx, rdi`, `lea rax, [rdi+rsi]`), loading
//! through them (`mov eax, [rdi+8]`) or, without optimisation, spilling them to the frame (`mov [rbp-0x18], rdi`) and
//! reloading them later (`mov rax, [rbp-0x18]`). Replacing such an instruction with NOPs leaves its destination with
//! a stale value: the register's previous contents, or the slot's uninitialised bytes.
//!
//! Which instructions qualify:
//! - in the prologue (the code from the entry up to the first unconditional jump, return, call or loop head, at
//!   most [`WINDOW`] instructions), a pure write (`mov`, `movzx`, `lea`, ...) with a source that is a
//!   parameter register still holding its incoming value;
//! - anywhere after it, a pure register load from a stack slot that such a prologue store filled.

use iced_x86::{FlowControl, InstructionInfoFactory, OpAccess, OpKind, Register};

use super::{reads, stack_slot, writes};
use crate::decode::{is_filler, Listing};

/// The integer parameter registers, in argument order.
const PARAMS: [Register; 6] = [Register::RDI, Register::RSI, Register::RDX, Register::RCX, Register::R8, Register::R9];

/// How many instructions from the entry count as "near the start": enough for a prologue that saves six
/// callee-saved registers and moves all six parameters, short enough that later reuse of the registers as
/// scratch is not mistaken for parameter handling.
const WINDOW: usize = 32;

pub(super) fn sites(listing: &Listing<'_>) -> Vec<usize> {
    let mut factory = InstructionInfoFactory::new();
    // Parameter registers (full width) not yet overwritten since the entry.
    let mut live: Vec<Register> = PARAMS.to_vec();
    // Stack slots a parameter was stored to.
    let mut slots: Vec<(Register, i64)> = Vec::new();
    let mut in_prologue = true;
    let mut out = Vec::new();
    // Targets of backward branches. Code at and after a loop head runs many times: it no longer takes up the
    // parameters, it works with them.
    let loop_heads: Vec<u64> = listing
        .instrs
        .iter()
        .filter(|i| i.is_jcc_short_or_near() || i.is_jmp_short_or_near() || i.is_loop() || i.is_loopcc())
        .filter(|i| i.near_branch_target() <= i.ip() && i.near_branch_target() >= listing.function.address)
        .map(|i| i.near_branch_target())
        .collect();

    for (i, instr) in listing.instrs.iter().enumerate() {
        if is_filler(instr) {
            continue;
        }
        if loop_heads.contains(&instr.ip()) {
            in_prologue = false;
        }
        let info = factory.info(instr);
        let pure_write = instr.op_count() >= 2 && info.op_access(0) == OpAccess::Write;
        let slot = stack_slot(instr);

        if pure_write && instr.op_kind(0) == OpKind::Register && slot.is_some_and(|s| slots.contains(&s)) {
            out.push(i);
        } else if in_prologue && pure_write {
            let reads_param = (1..instr.op_count()).any(|op| match instr.op_kind(op) {
                // `xor esi, esi` names esi but does not read it.
                OpKind::Register => reads(info.op_access(op)) && live.contains(&instr.op_register(op).full_register()),
                OpKind::Memory => {
                    live.contains(&instr.memory_base().full_register())
                        || live.contains(&instr.memory_index().full_register())
                }
                _ => false,
            });
            if reads_param {
                out.push(i);
                if instr.op_kind(0) == OpKind::Memory {
                    slots.extend(slot);
                }
            }
        }

        let flow = instr.flow_control();
        let is_call = matches!(flow, FlowControl::Call | FlowControl::IndirectCall);
        for used in info.used_registers() {
            if !writes(used.access()) {
                continue;
            }
            let reg = used.register().full_register();
            live.retain(|&p| p != reg);
            // A slot addressed from rsp names other memory once rsp moves; a call puts rsp back before it returns.
            if reg == Register::RSP && !is_call {
                slots.retain(|&(base, _)| base != Register::RSP);
            }
        }
        if in_prologue {
            // The callee may overwrite every parameter register.
            if is_call {
                live.clear();
            }
            if !matches!(flow, FlowControl::Next | FlowControl::ConditionalBranch) || i + 1 >= WINDOW || live.is_empty()
            {
                in_prologue = false;
            }
        }
    }
    out
}
