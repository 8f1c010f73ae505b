//! Finding the machine code of an x86-64 ELF object: its functions, each with the file bytes it occupies.
//!
//! Where the code comes from, in order of preference:
//! 1. `.symtab`: every defined `STT_FUNC` symbol with a nonzero size inside an executable section;
//! 2. `.dynsym`, the same way, when the object was stripped of `.symtab`, together with every function the unwind
//!    tables (`.eh_frame`) describe that no dynamic symbol covers: the stripped object's internal functions, named
//!    `sub_` and their address in hex, as disassemblers name them;
//! 3. with no such symbols, each executable section as one region named after the section;
//! 4. with no section headers at all, each executable `PT_LOAD` segment.
//!
//! Only these byte ranges are ever handed to the mutators, which is what guarantees that headers, tables and data
//! stay untouched.

use std::collections::HashSet;

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, SectionHeader};
use object::{Endianness, Object, ObjectSection, ObjectSymbol, SectionIndex, SymbolFlags};
use serde::Serialize;

use ward_mpk::assess::elf::{check_ident, machine_name, Unreadable, IDENT_AND_TYPE_LEN};

use crate::error::InjectError;

/// A stretch of machine code the injector may mutate: one function, or one executable section (or segment) of an
/// object without function symbols.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Function {
    /// The symbol's name, or the section's (`.text`) when the object has no function symbols.
    pub name: String,
    /// The section holding the code (`.text`), or `segment N` for an object without section headers.
    pub section: String,
    /// Virtual address of the first byte (as linked; branch targets in reports are in these terms).
    pub address: u64,
    /// File offset of the first byte.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
    /// Start-up or tear-down code the toolchain adds to every object (`frame_dummy`, `_init`, ...). It models no
    /// mistake of the extension's author and parts of it run inside `dlopen`, so a fault there would fail the load
    /// rather than the extension: it is skipped unless named explicitly.
    pub toolchain: bool,
}

impl Function {
    pub(crate) fn file_range(&self) -> std::ops::Range<usize> {
        // Both were checked against the file's length when the function was found.
        self.offset as usize..(self.offset + self.size) as usize
    }
}

/// Functions that crt1/crti/crtbegin/crtend and the linker contribute to shared objects and executables.
const TOOLCHAIN_FUNCTIONS: &[&str] = &[
    "_init",
    "_fini",
    "_start",
    "deregister_tm_clones",
    "register_tm_clones",
    "__do_global_dtors_aux",
    "frame_dummy",
    "__libc_csu_init",
    "__libc_csu_fini",
    "_dl_relocate_static_pie",
];

/// Executable sections that hold linker stubs rather than compiled code: mutating a PLT entry or the `_init`
/// prologue breaks symbol resolution or loading, which is no fault of the extension's code.
const STUB_SECTIONS: &[&str] = &[".init", ".fini", ".plt", ".plt.got", ".plt.sec", ".iplt"];

/// Every function of the ELF object in `bytes`, sorted by file offset. Symbols that alias one another (same
/// offset and size) are listed once, under the alphabetically first name.
pub fn functions(bytes: &[u8]) -> Result<Vec<Function>, InjectError> {
    check_header(bytes)?;
    let file = ElfFile64::<Endianness>::parse(bytes).map_err(|e| InjectError::Malformed(e.to_string()))?;
    let sections = executable_sections(&file, bytes.len() as u64);

    let mut found = symbol_functions(file.symbols(), &sections);
    if found.is_empty() {
        found = symbol_functions(file.dynamic_symbols(), &sections);
        let unnamed = unwound_functions(&file, &sections, &found);
        found.extend(unnamed);
    }
    if found.is_empty() {
        found = sections
            .iter()
            .filter(|s| !STUB_SECTIONS.contains(&s.name.as_str()) && s.size > 0)
            .map(|s| Function {
                name: s.name.clone(),
                section: s.name.clone(),
                address: s.address,
                offset: s.offset,
                size: s.size,
                toolchain: false,
            })
            .collect();
    }
    if found.is_empty() && file.elf_header().e_shnum(file.endian()) == 0 {
        found = executable_segments(&file, bytes.len() as u64);
    }
    if found.is_empty() {
        return Err(InjectError::NoExecutableCode);
    }
    found.sort_by(|a, b| (a.offset, a.size, &a.name).cmp(&(b.offset, b.size, &b.name)));
    found.dedup_by(|later, first| later.offset == first.offset && later.size == first.size);
    Ok(found)
}

/// Checks the identification bytes before handing the file to the parser, so each common mistake gets its own
/// message rather than a generic parse error. The checks themselves are the mpk loader's (`check_ident`, which
/// `ward check` and loading use too); the injector words them its own way, and takes executables as well.
fn check_header(bytes: &[u8]) -> Result<(), InjectError> {
    if bytes.len() < 4 || bytes[..4] != elf::ELFMAG {
        return Err(InjectError::NotElf);
    }
    if bytes.len() < IDENT_AND_TYPE_LEN {
        return Err(InjectError::Malformed("truncated ELF header".into()));
    }
    match check_ident(bytes) {
        Ok(()) | Err(Unreadable::Executable) => Ok(()),
        Err(Unreadable::Elf32) => Err(InjectError::Not64Bit),
        Err(Unreadable::BigEndian) => {
            Err(InjectError::Malformed("big-endian ELF file; x86-64 objects are little-endian".into()))
        }
        Err(Unreadable::Machine(machine)) => Err(InjectError::WrongMachine(machine, machine_name(machine))),
        Err(Unreadable::Relocatable) => Err(InjectError::Relocatable),
        Err(Unreadable::Core) => Err(InjectError::Malformed("a core dump, not a shared object".into())),
        Err(Unreadable::OtherType(t)) => {
            Err(InjectError::Malformed(format!("ELF type {t} is neither a shared object nor an executable")))
        }
        // An unknown class, as `unknown ELF class N`.
        Err(Unreadable::Malformed(why)) => Err(InjectError::Malformed(why)),
        // Not from the header's first bytes (the magic and the length were checked above).
        Err(other @ (Unreadable::NoElfHeader | Unreadable::NoSectionHeaders)) => {
            Err(InjectError::Malformed(other.to_string()))
        }
    }
}

struct ExecSection {
    index: SectionIndex,
    name: String,
    address: u64,
    offset: u64,
    size: u64,
}

/// Sections with `SHF_EXECINSTR` whose bytes are in the file and inside it.
fn executable_sections(file: &ElfFile64<'_, Endianness>, file_len: u64) -> Vec<ExecSection> {
    let endian = file.endian();
    file.sections()
        .filter_map(|s| {
            let header = s.elf_section_header();
            if header.sh_type(endian) != elf::SHT_PROGBITS
                || header.sh_flags(endian) & u64::from(elf::SHF_EXECINSTR) == 0
            {
                return None;
            }
            let (offset, size) = s.file_range()?;
            if offset.checked_add(size)? > file_len {
                return None;
            }
            Some(ExecSection {
                index: s.index(),
                name: s.name().unwrap_or("?").to_owned(),
                address: s.address(),
                offset,
                size,
            })
        })
        .collect()
}

/// Defined `STT_FUNC` symbols of nonzero size lying wholly inside one of `sections`.
fn symbol_functions<'data, S: ObjectSymbol<'data>>(
    symbols: impl Iterator<Item = S>,
    sections: &[ExecSection],
) -> Vec<Function> {
    let toolchain: HashSet<&str> = TOOLCHAIN_FUNCTIONS.iter().copied().collect();
    symbols
        .filter_map(|sym| {
            let SymbolFlags::Elf { st_info, .. } = sym.flags() else { return None };
            if st_info & 0xf != elf::STT_FUNC || sym.is_undefined() || sym.size() == 0 {
                return None;
            }
            let name = sym.name().ok().filter(|n| !n.is_empty())?;
            let section = sections.iter().find(|s| Some(s.index) == sym.section_index())?;
            let start = sym.address().checked_sub(section.address)?;
            if start.checked_add(sym.size())? > section.size {
                return None;
            }
            Some(Function {
                name: name.to_owned(),
                section: section.name.clone(),
                address: sym.address(),
                offset: section.offset + start,
                size: sym.size(),
                toolchain: toolchain.contains(name),
            })
        })
        .collect()
}

/// The functions `.eh_frame` describes that lie wholly inside one executable section (not a linker stub section)
/// and overlap none of `named`, each named `sub_ADDRESS`.
fn unwound_functions(file: &ElfFile64<'_, Endianness>, sections: &[ExecSection], named: &[Function]) -> Vec<Function> {
    let Some(eh_frame) = file.section_by_name(".eh_frame") else { return Vec::new() };
    let Ok(data) = eh_frame.data() else { return Vec::new() };
    let mut found: Vec<Function> = Vec::new();
    for fde in crate::ehframe::fdes(data, eh_frame.address()) {
        let Some(end) = fde.start.checked_add(fde.len) else { continue };
        let Some(section) = sections
            .iter()
            .find(|s| !STUB_SECTIONS.contains(&s.name.as_str()) && s.address <= fde.start && end <= s.address + s.size)
        else {
            continue;
        };
        let overlaps = |f: &Function| f.address < end && fde.start < f.address + f.size;
        if named.iter().chain(found.iter()).any(overlaps) {
            continue;
        }
        found.push(Function {
            name: format!("sub_{:x}", fde.start),
            section: section.name.clone(),
            address: fde.start,
            offset: section.offset + (fde.start - section.address),
            size: fde.len,
            toolchain: false,
        });
    }
    found
}

/// Executable `PT_LOAD` segments, for objects whose section headers were stripped.
fn executable_segments(file: &ElfFile64<'_, Endianness>, file_len: u64) -> Vec<Function> {
    let endian = file.endian();
    file.elf_program_headers()
        .iter()
        .enumerate()
        .filter(|(_, ph)| ph.p_type(endian) == elf::PT_LOAD && ph.p_flags(endian) & elf::PF_X != 0)
        .filter(|(_, ph)| {
            ph.p_filesz(endian) > 0 && ph.p_offset(endian).saturating_add(ph.p_filesz(endian)) <= file_len
        })
        .map(|(i, ph)| Function {
            name: format!("segment {i}"),
            section: format!("segment {i}"),
            address: ph.p_vaddr(endian),
            offset: ph.p_offset(endian),
            size: ph.p_filesz(endian),
            toolchain: false,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(class: u8, machine: u16, e_type: u16) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(&elf::ELFMAG);
        h[4] = class; // EI_CLASS
        h[5] = elf::ELFDATA2LSB; // EI_DATA
        h[16..18].copy_from_slice(&e_type.to_le_bytes());
        h[18..20].copy_from_slice(&machine.to_le_bytes());
        h
    }

    /// The loader's header checks, in the injector's words; an executable passes (its code can be mutated).
    #[test]
    fn the_header_checks_are_the_loaders_in_the_injectors_words() {
        let malformed = |bytes: &[u8]| match check_header(bytes) {
            Err(InjectError::Malformed(why)) => why,
            other => panic!("not malformed: {other:?}"),
        };
        assert_eq!(malformed(b"\x7fELF\x02\x01\x01"), "truncated ELF header");
        let mut big = header(elf::ELFCLASS64, elf::EM_X86_64, elf::ET_DYN);
        big[5] = elf::ELFDATA2MSB;
        assert_eq!(malformed(&big), "big-endian ELF file; x86-64 objects are little-endian");
        assert_eq!(
            malformed(&header(elf::ELFCLASS64, elf::EM_X86_64, elf::ET_CORE)),
            "a core dump, not a shared object"
        );
        assert_eq!(
            malformed(&header(elf::ELFCLASS64, elf::EM_X86_64, 0x1234)),
            "ELF type 4660 is neither a shared object nor an executable"
        );
        assert_eq!(malformed(&header(7, elf::EM_X86_64, elf::ET_DYN)), "unknown ELF class 7");
        assert!(check_header(&header(elf::ELFCLASS64, elf::EM_X86_64, elf::ET_EXEC)).is_ok());
        assert!(check_header(&header(elf::ELFCLASS64, elf::EM_X86_64, elf::ET_DYN)).is_ok());
    }

    #[test]
    fn each_wrong_header_gets_its_own_error() {
        assert!(matches!(functions(b"hello world\n"), Err(InjectError::NotElf)));
        assert!(matches!(functions(b""), Err(InjectError::NotElf)));
        assert!(matches!(functions(&header(elf::ELFCLASS32, elf::EM_386, elf::ET_DYN)), Err(InjectError::Not64Bit)));
        assert!(matches!(
            functions(&header(elf::ELFCLASS64, elf::EM_AARCH64, elf::ET_DYN)),
            Err(InjectError::WrongMachine(elf::EM_AARCH64, "AArch64"))
        ));
        assert!(matches!(
            functions(&header(elf::ELFCLASS64, elf::EM_X86_64, elf::ET_REL)),
            Err(InjectError::Relocatable)
        ));
        // A plausible header over garbage: the parser's complaint, not a panic.
        let mut junk = header(elf::ELFCLASS64, elf::EM_X86_64, elf::ET_DYN);
        junk[0x3c] = 0xff; // e_shnum
        junk[0x28] = 0xff; // e_shoff
        assert!(functions(&junk).is_err());
    }
}
