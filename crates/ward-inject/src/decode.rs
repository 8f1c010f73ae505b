//! A function's code decoded once, front to back, with each instruction's place in the file.
//!
//! Compilers emit no data inside x86-64 functions (jump tables live in `.rodata`), so a linear sweep from the
//! symbol's start finds the real instruction boundaries. Mutators only ever pick among these instructions and
//! replace each with bytes of the same length, so the sweep stays valid after every fault.

use std::ops::Range;

use iced_x86::{Code, ConstantOffsets, Decoder, DecoderOptions, Instruction, Mnemonic};

use crate::elf::Function;

pub(crate) struct Listing<'a> {
    pub function: &'a Function,
    /// The function's bytes.
    pub code: &'a [u8],
    pub instrs: Vec<Instruction>,
    /// Where the displacement and immediates sit inside each instruction's bytes.
    pub consts: Vec<ConstantOffsets>,
}

impl<'a> Listing<'a> {
    /// Decodes `function`, whose bytes are `code`, with instruction pointers at its linked address so that relative
    /// branch targets and RIP-relative operands come out as absolute addresses and re-encode to the same ones.
    pub fn decode(function: &'a Function, code: &'a [u8]) -> Self {
        let mut decoder = Decoder::with_ip(64, code, function.address, DecoderOptions::NONE);
        let mut instrs = Vec::new();
        let mut consts = Vec::new();
        let mut instr = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut instr);
            consts.push(decoder.get_constant_offsets(&instr));
            instrs.push(instr);
        }
        Listing { function, code, instrs, consts }
    }

    /// Byte range of instruction `i` within the function.
    pub fn range(&self, i: usize) -> Range<usize> {
        let start = (self.instrs[i].ip() - self.function.address) as usize;
        start..start + self.instrs[i].len()
    }

    pub fn bytes(&self, i: usize) -> &'a [u8] {
        &self.code[self.range(i)]
    }

    /// File offset of instruction `i`.
    pub fn file_offset(&self, i: usize) -> u64 {
        self.function.offset + self.range(i).start as u64
    }
}

/// Padding and undecodable bytes: never a site, because mutating them changes nothing a program does (or would be
/// reported as an instruction that is not one).
pub(crate) fn is_filler(instr: &Instruction) -> bool {
    instr.code() == Code::INVALID || matches!(instr.mnemonic(), Mnemonic::Nop | Mnemonic::Int3 | Mnemonic::Fnop)
}
