//! What was injected, in terms a person can check against `objdump -d -M intel` and a campaign can store.

use iced_x86::{Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter, MemorySizeOptions};
use serde::Serialize;

use crate::fault_type::FaultType;

/// One mutated instruction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InjectedFault {
    pub fault_type: FaultType,
    /// The function's name, or the section's for objects without function symbols.
    pub function: String,
    /// File offset of the mutated instruction.
    pub offset: u64,
    /// Offset of the mutated instruction from the start of the function.
    pub function_offset: u64,
    /// Virtual address of the mutated instruction as linked (add the load base to match a crash address).
    pub address: u64,
    /// The original instruction, Intel syntax.
    pub before: String,
    /// What replaced it, Intel syntax; several instructions (a re-encoding and its NOP padding) joined by `; `.
    pub after: String,
    /// The original bytes, lowercase hex.
    pub before_bytes: String,
    /// The replacement bytes (same length), lowercase hex.
    pub after_bytes: String,
}

/// Intel syntax as objdump prints it with `-M intel`, but with `0x` numbers and `, ` between operands.
pub(crate) struct Disasm {
    formatter: IntelFormatter,
}

impl Disasm {
    pub(crate) fn new() -> Self {
        let mut formatter = IntelFormatter::new();
        let options = formatter.options_mut();
        options.set_space_after_operand_separator(true);
        options.set_hex_prefix("0x");
        options.set_hex_suffix("");
        options.set_uppercase_hex(false);
        options.set_branch_leading_zeros(false);
        options.set_show_branch_size(false);
        // Always `dword ptr`, as objdump: a report is read without the surrounding code that disambiguates.
        options.set_memory_size_options(MemorySizeOptions::Always);
        Disasm { formatter }
    }

    pub(crate) fn instruction(&mut self, instr: &Instruction) -> String {
        let mut out = String::new();
        self.formatter.format(instr, &mut out);
        out
    }

    /// Every instruction in `bytes`, decoded at `ip`, joined by `; `.
    pub(crate) fn bytes(&mut self, bytes: &[u8], ip: u64) -> String {
        let mut decoder = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
        let mut parts = Vec::new();
        while decoder.can_decode() {
            let instr = decoder.decode();
            parts.push(self.instruction(&instr));
        }
        parts.join("; ")
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_objdump_intel_with_hex_prefix() {
        let mut d = Disasm::new();
        assert_eq!(d.bytes(&[0x83, 0xf8, 0x05], 0), "cmp eax, 5");
        assert_eq!(d.bytes(&[0x48, 0x83, 0xec, 0x18], 0), "sub rsp, 0x18");
        assert_eq!(d.bytes(&[0x7c, 0x0e], 0x1000), "jl 0x1010");
        assert_eq!(d.bytes(&[0x89, 0xd8, 0x90], 0), "mov eax, ebx; nop");
        assert_eq!(hex(&[0x0f, 0x1f, 0x00]), "0f1f00");
    }
}
