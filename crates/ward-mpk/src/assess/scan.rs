//! Finding instructions that can change the PKRU register or the FS base in bytes the processor may execute.
//!
//! An mpk domain is entered by writing PKRU; code that can write PKRU itself can open every other domain and the
//! host. Two user-mode instructions do: WRPKRU, and XRSTOR (with REX.W, XRSTOR64) when its save area requests the
//! PKRU component. XRSTORS restores PKRU as well; it is privileged and faults in user mode, but refusing it costs
//! nothing and keeps the rule simple: nothing that loads PKRU.
//!
//! The gate also switches the FS base to the domain's thread block, and ward's code finds its way back to the host
//! thread through the block FS points at (`thread_block`). Code that wrote the FS base itself (WRFSBASE) would leave
//! that way pointing nowhere, and the next signal would end the host, so WRFSBASE is refused as well.
//!
//! The scan looks at **every byte offset**, not at an instruction stream: a jump can land in the middle of an
//! instruction (or in data that shares an executable page), and the bytes from there on decode afresh. Prefixes
//! need no special case for the same reason: `48 0F AE 2F` (XRSTOR64) contains `0F AE 2F` (XRSTOR), which the
//! scan finds one byte later. Reported offsets are those of the `0F` escape byte.
//!
//! The patterns, in the encoding tables' terms:
//! - WRPKRU: `0F 01 EF`.
//! - XRSTOR: `0F AE /5` with a memory operand (ModRM.mod != 3). The register forms `0F AE E8`..`EF` are LFENCE,
//!   which every compiler emits; they are not flagged. `/4` (XSAVE) and `/6` (XSAVEOPT) do not write PKRU.
//! - XRSTORS: `0F C7 /3` with a memory operand.
//! - WRFSBASE: `F3 0F AE /2` with a register operand (ModRM `D0`..`D7`), with or without REX. The scan does not
//!   require the `F3`: legacy prefixes may come in any order, and without it the bytes are an invalid instruction,
//!   which no compiler emits. The memory form of `/2` is LDMXCSR, which is not flagged.

use serde::Serialize;

/// An instruction that can write PKRU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Forbidden {
    Wrpkru,
    Xrstor,
    Xrstors,
    Wrfsbase,
}

impl Forbidden {
    pub fn mnemonic(self) -> &'static str {
        match self {
            Forbidden::Wrpkru => "WRPKRU",
            Forbidden::Xrstor => "XRSTOR",
            Forbidden::Xrstors => "XRSTORS",
            Forbidden::Wrfsbase => "WRFSBASE",
        }
    }
}

const ESCAPE: u8 = 0x0f;
const WRPKRU: [u8; 3] = [0x0f, 0x01, 0xef];
/// Second opcode bytes of the groups holding XRSTOR (group 15) and XRSTORS (group 9).
const GROUP_15: u8 = 0xae;
const GROUP_9: u8 = 0xc7;
/// The ModRM `reg` field selecting XRSTOR in group 15 and XRSTORS in group 9.
const XRSTOR_REG: u8 = 5;
const XRSTORS_REG: u8 = 3;
/// The ModRM `reg` field selecting WRFSBASE (register form) in group 15.
const WRFSBASE_REG: u8 = 2;

/// ModRM fields.
fn modrm_mod(modrm: u8) -> u8 {
    modrm >> 6
}

fn modrm_reg(modrm: u8) -> u8 {
    (modrm >> 3) & 7
}

/// `mod` 3 selects a register operand; the others address memory.
const MOD_REGISTER: u8 = 3;

/// Every offset in `code` where an instruction that can write PKRU begins, in increasing order.
pub fn find_forbidden(code: &[u8]) -> Vec<(usize, Forbidden)> {
    code.windows(3).enumerate().filter_map(|(at, window)| forbidden_at(window).map(|kind| (at, kind))).collect()
}

/// The first offset in `code` where such an instruction begins, if any. It allocates nothing: the domain runtime
/// scans code made at run time with it, inside the domain, where the host's heap is not to be written.
pub fn first_forbidden(code: &[u8]) -> Option<(usize, Forbidden)> {
    code.windows(3).enumerate().find_map(|(at, window)| forbidden_at(window).map(|kind| (at, kind)))
}

/// The forbidden instruction the three bytes `window` begin, if any.
fn forbidden_at(window: &[u8]) -> Option<Forbidden> {
    if window.len() < 3 || window[0] != ESCAPE {
        return None;
    }
    let (opcode, modrm) = (window[1], window[2]);
    let memory = modrm_mod(modrm) != MOD_REGISTER;
    if window[..3] == WRPKRU {
        Some(Forbidden::Wrpkru)
    } else if opcode == GROUP_15 && memory && modrm_reg(modrm) == XRSTOR_REG {
        Some(Forbidden::Xrstor)
    } else if opcode == GROUP_9 && memory && modrm_reg(modrm) == XRSTORS_REG {
        Some(Forbidden::Xrstors)
    } else if opcode == GROUP_15 && !memory && modrm_reg(modrm) == WRFSBASE_REG {
        Some(Forbidden::Wrfsbase)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_wrpkru_inside_another_instruction() {
        // push rbp; mov eax, 0xef010f90 (B8 90 0F 01 EF); ret. Decoded from the start it is harmless, but a jump to
        // offset 3 (or to the NOP-like 0x90 before it) executes WRPKRU.
        let code = [0x55, 0xb8, 0x90, 0x0f, 0x01, 0xef, 0xc3];
        assert_eq!(find_forbidden(&code), vec![(3, Forbidden::Wrpkru)]);
    }

    #[test]
    fn finds_xrstor_with_and_without_prefixes() {
        // xrstor [rdi]; xrstor64 [rsi] (REX.W); xrstor [rax+0x10] with an operand-size prefix and a displacement;
        // xrstor [r8] (REX.B); xrstors [rcx]; xrstors64 [rdx].
        let code = [
            0x0f, 0xae, 0x2f, // 0
            0x48, 0x0f, 0xae, 0x2e, // 3
            0x66, 0x0f, 0xae, 0x68, 0x10, // 7
            0x41, 0x0f, 0xae, 0x28, // 12
            0x0f, 0xc7, 0x19, // 16
            0x48, 0x0f, 0xc7, 0x1a, // 19
        ];
        assert_eq!(
            find_forbidden(&code),
            vec![
                (0, Forbidden::Xrstor),
                (4, Forbidden::Xrstor),
                (8, Forbidden::Xrstor),
                (13, Forbidden::Xrstor),
                (16, Forbidden::Xrstors),
                (20, Forbidden::Xrstors),
            ]
        );
    }

    #[test]
    fn finds_wrfsbase_and_leaves_ldmxcsr_and_rdfsbase_alone() {
        let code = [
            0xf3, 0x48, 0x0f, 0xae, 0xd7, // wrfsbase rdi
            0xf3, 0x0f, 0xae, 0xd0, // wrfsbase eax
            0x0f, 0xae, 0x17, // ldmxcsr [rdi] (/2, memory)
            0xf3, 0x48, 0x0f, 0xae, 0xc0, // rdfsbase rax (/0)
            0xf3, 0x48, 0x0f, 0xae, 0xd8, // wrgsbase rax (/3): GS is no one's here
        ];
        assert_eq!(find_forbidden(&code), vec![(2, Forbidden::Wrfsbase), (6, Forbidden::Wrfsbase)]);
    }

    #[test]
    fn leaves_lfence_xsave_and_neighbours_alone() {
        let code = [
            0x0f, 0xae, 0xe8, // lfence (0F AE /5, register form)
            0x0f, 0xae, 0xef, // also decodes as lfence
            0x0f, 0xae, 0x27, // xsave [rdi] (/4)
            0x0f, 0xae, 0x37, // xsaveopt [rdi] (/6)
            0x0f, 0xae, 0xf0, // mfence
            0x0f, 0xae, 0xf8, // sfence
            0x0f, 0x01, 0xee, // rdpkru
            0x0f, 0x01, 0xd0, // xgetbv
            0x0f, 0xc7, 0x0f, // cmpxchg8b [rdi] (/1)
            0x0f, 0xc7, 0xf0, // rdrand eax (/6, register)
            0x0f, 0xc7, 0xd8, // /3 register form: not XRSTORS
            0x0f, 0xae, // a truncated group-15 instruction at the very end
        ];
        assert_eq!(find_forbidden(&code), vec![]);
    }

    #[test]
    fn every_xrstor_memory_form_and_wrfsbase_register_form_is_found() {
        for modrm in 0..=u8::MAX {
            let code = [0x0f, 0xae, modrm];
            let xrstor = modrm_reg(modrm) == 5 && modrm >> 6 != 3;
            let wrfsbase = modrm_reg(modrm) == 2 && modrm >> 6 == 3;
            assert_eq!(!find_forbidden(&code).is_empty(), xrstor || wrfsbase, "modrm {modrm:#04x}");
        }
    }

    #[test]
    fn the_first_hit_is_the_first_of_all_hits() {
        let code = [0x90, 0x0f, 0xae, 0x2f, 0x0f, 0x01, 0xef];
        assert_eq!(first_forbidden(&code), find_forbidden(&code).first().copied());
        assert_eq!(first_forbidden(&code), Some((1, Forbidden::Xrstor)));
        assert_eq!(first_forbidden(&[0x0f, 0xae, 0xe8, 0xc3]), None);
    }

    #[test]
    fn overlapping_hits_are_all_reported() {
        // 0F 0F 01 EF: the first 0F starts a 3DNow! escape, the second a WRPKRU.
        assert_eq!(find_forbidden(&[0x0f, 0x0f, 0x01, 0xef]), vec![(1, Forbidden::Wrpkru)]);
        assert_eq!(find_forbidden(&[]), vec![]);
        assert_eq!(find_forbidden(&[0x0f, 0x01]), vec![]);
    }
}
