//! What the mpk loader reads from an extension's ELF file before mapping it: the executable segments (to scan),
//! the libraries it needs, whether `dlopen` would take it at all, and every undefined
//! dynamic symbol with its version and the library that version comes from.
//!
//! Once [`Image::parse`] has succeeded, everything here is plain data: the byte ranges of executable segments
//! were checked against the file's length, and no later accessor can fail.

use std::fmt;
use std::ops::Range;

use object::elf;
use object::read::elf::{Dyn, FileHeader, ProgramHeader, SectionHeader, Sym, SymbolTable, VersionTable};
use object::{LittleEndian as LE, SymbolIndex};
use serde::Serialize;

type Header = elf::FileHeader64<LE>;

/// Positions in `e_ident` (EI_CLASS and EI_DATA in the ELF specification) and the header fields read before the
/// parser is trusted with the file.
const EI_CLASS: usize = 4;
const EI_DATA: usize = 5;
const E_TYPE: Range<usize> = 16..18;
const E_MACHINE: Range<usize> = 18..20;
/// The header is 64 bytes in ELF64; reading `e_machine` needs only the first 20.
pub const IDENT_AND_TYPE_LEN: usize = 20;

/// Why a file is not something the checker can read as an x86-64 shared object. Each names what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    NoElfHeader,
    Elf32,
    BigEndian,
    Machine(u16),
    Relocatable,
    Executable,
    Core,
    OtherType(u16),
    NoSectionHeaders,
    Malformed(String),
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unreadable::NoElfHeader => f.write_str("no ELF header"),
            Unreadable::Elf32 => {
                f.write_str("a 32-bit ELF file; ward runs 64-bit x86-64 extensions, rebuild it for x86-64")
            }
            Unreadable::BigEndian => {
                f.write_str("a big-endian ELF file; ward runs x86-64 extensions, which are little-endian")
            }
            Unreadable::Machine(m) => {
                write!(f, "built for {} (e_machine {m}), not x86-64; use an x86-64 build", machine_name(*m))
            }
            Unreadable::Relocatable => f.write_str("a relocatable object (.o); link it with -shared into a .so"),
            Unreadable::Executable => f.write_str("an executable, not a shared object; link it with -shared"),
            Unreadable::Core => f.write_str("a core dump"),
            Unreadable::OtherType(t) => write!(f, "ELF type {t}, not a shared object"),
            Unreadable::NoSectionHeaders => {
                f.write_str("no section headers (stripped with sstrip?); the checker needs its dynamic symbol table")
            }
            Unreadable::Malformed(why) => write!(f, "malformed ELF: {why}"),
        }
    }
}

/// The processor an ELF `e_machine` names, for a refusal (`ward check`, the injector).
pub fn machine_name(machine: u16) -> &'static str {
    match machine {
        elf::EM_386 => "i386",
        elf::EM_ARM => "32-bit Arm",
        elf::EM_AARCH64 => "AArch64",
        elf::EM_RISCV => "RISC-V",
        elf::EM_PPC64 => "PowerPC 64",
        elf::EM_S390 => "s390",
        elf::EM_MIPS => "MIPS",
        elf::EM_LOONGARCH => "LoongArch",
        _ => "another processor",
    }
}

/// A `PF_X` `PT_LOAD` segment: bytes the processor may execute once the extension is mapped.
#[derive(Debug, Clone)]
pub struct ExecSegment<'data> {
    /// File offset of the first byte.
    pub offset: u64,
    /// Virtual address of the first byte, as linked.
    pub address: u64,
    /// The bytes present in the file (`p_filesz`); the zero-filled tail of `p_memsz` holds no instructions.
    pub code: &'data [u8],
}

/// A named stretch of the address space: a function symbol, or an allocated section.
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    pub address: u64,
    pub size: u64,
}

impl Span {
    fn contains(&self, address: u64) -> bool {
        address >= self.address && address - self.address < self.size
    }
}

/// What kind of thing an import names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SymbolKind {
    Function,
    Object,
    Tls,
    /// `STT_NOTYPE` (common for weak toolchain hooks) or anything else.
    Other,
}

/// One undefined symbol of `.dynsym`.
#[derive(Debug, Clone)]
pub struct RawImport {
    pub name: String,
    /// The symbol version it asks for (`GLIBC_2.2.5`), when versioned.
    pub version: Option<String>,
    /// The library that version belongs to (`libm.so.6`), from `.gnu.version_r`.
    pub library: Option<String>,
    pub weak: bool,
    pub kind: SymbolKind,
}

/// An extension as the mpk loader sees it.
#[derive(Debug, Clone)]
pub struct Image<'data> {
    pub exec_segments: Vec<ExecSegment<'data>>,
    /// A `PT_INTERP` segment or `DF_1_PIE`: a position-independent executable, which `dlopen` refuses.
    pub is_pie: bool,
    /// `DF_1_NOOPEN`: marked as not to be opened with `dlopen`.
    pub no_dlopen: bool,
    /// `DT_NEEDED`, in file order.
    pub needed: Vec<String>,
    /// Undefined `.dynsym` entries, in symbol-table order.
    pub imports: Vec<RawImport>,
    /// Function symbols with a size (from `.symtab` when present, else `.dynsym`), for naming scan hits.
    functions: Vec<Span>,
    /// Allocated sections, for naming scan hits no function covers.
    sections: Vec<Span>,
}

impl<'data> Image<'data> {
    /// Reads `bytes` as an x86-64 ELF shared object.
    pub fn parse(bytes: &'data [u8]) -> Result<Image<'data>, Unreadable> {
        check_ident(bytes)?;
        let malformed = |e: object::Error| Unreadable::Malformed(e.to_string());
        let header = Header::parse(bytes).map_err(malformed)?;
        let endian = header.endian().map_err(malformed)?;
        let segments = header.program_headers(endian, bytes).map_err(malformed)?;
        let sections = header.sections(endian, bytes).map_err(malformed)?;
        if sections.is_empty() {
            return Err(Unreadable::NoSectionHeaders);
        }

        let mut exec_segments = Vec::new();
        let mut is_pie = false;
        for ph in segments {
            match ph.p_type(endian) {
                elf::PT_LOAD if ph.p_flags(endian) & elf::PF_X != 0 => {
                    let offset = ph.p_offset(endian);
                    let code = ph.data(endian, bytes).map_err(|()| {
                        Unreadable::Malformed(format!(
                            "executable segment at file offset {offset:#x} runs past the end of the file"
                        ))
                    })?;
                    exec_segments.push(ExecSegment { offset, address: ph.p_vaddr(endian), code });
                }
                elf::PT_INTERP => is_pie = true,
                _ => {}
            }
        }

        let mut needed = Vec::new();
        let mut no_dlopen = false;
        if let Some((entries, strtab_index)) = sections.dynamic(endian, bytes).map_err(malformed)? {
            let strings = sections.strings(endian, bytes, strtab_index).map_err(malformed)?;
            for entry in entries {
                match entry.tag32(endian) {
                    Some(elf::DT_NEEDED) => {
                        let name = entry.string(endian, strings).map_err(malformed)?;
                        needed.push(String::from_utf8_lossy(name).into_owned());
                    }
                    Some(elf::DT_FLAGS_1) => {
                        let flags = entry.d_val(endian);
                        is_pie |= flags & u64::from(elf::DF_1_PIE) != 0;
                        no_dlopen |= flags & u64::from(elf::DF_1_NOOPEN) != 0;
                    }
                    Some(elf::DT_NULL) => break,
                    _ => {}
                }
            }
        }

        let dynsym = sections.symbols(endian, bytes, elf::SHT_DYNSYM).map_err(malformed)?;
        let symtab = sections.symbols(endian, bytes, elf::SHT_SYMTAB).map_err(malformed)?;
        let versions = sections.versions(endian, bytes).map_err(malformed)?;
        let imports = imports(&dynsym, versions.as_ref(), endian)?;

        let functions_from = if symtab.is_empty() { &dynsym } else { &symtab };
        let functions = functions_from
            .iter()
            .filter(|s| s.st_type() == elf::STT_FUNC && s.is_definition(endian) && s.st_size(endian) > 0)
            .map(|s| Span {
                name: name_in(functions_from, s, endian),
                address: s.st_value(endian),
                size: s.st_size(endian),
            })
            .collect();
        let sections = sections
            .iter()
            .filter(|s| s.sh_flags(endian) & u64::from(elf::SHF_ALLOC) != 0 && s.sh_size(endian) > 0)
            .map(|s| Span {
                name: String::from_utf8_lossy(sections.section_name(endian, s).unwrap_or(b"?")).into_owned(),
                address: s.sh_addr(endian),
                size: s.sh_size(endian),
            })
            .collect();

        Ok(Image { exec_segments, is_pie, no_dlopen, needed, imports, functions, sections })
    }

    /// The function containing `address` as `name+0xoff`, if a function symbol covers it.
    pub fn function_at(&self, address: u64) -> Option<String> {
        self.functions.iter().find(|f| f.contains(address)).map(|f| format!("{}+{:#x}", f.name, address - f.address))
    }

    /// The allocated section containing `address`.
    pub fn section_at(&self, address: u64) -> Option<String> {
        self.sections.iter().find(|s| s.contains(address)).map(|s| s.name.clone())
    }
}

/// Checks the identification bytes before the parser sees the file, so each common mistake gets its own message.
pub fn check_ident(bytes: &[u8]) -> Result<(), Unreadable> {
    if bytes.len() < IDENT_AND_TYPE_LEN || bytes[..4] != elf::ELFMAG {
        return Err(Unreadable::NoElfHeader);
    }
    match bytes[EI_CLASS] {
        elf::ELFCLASS64 => {}
        elf::ELFCLASS32 => return Err(Unreadable::Elf32),
        c => return Err(Unreadable::Malformed(format!("unknown ELF class {c}"))),
    }
    if bytes[EI_DATA] != elf::ELFDATA2LSB {
        return Err(Unreadable::BigEndian);
    }
    let e_type = u16::from_le_bytes([bytes[E_TYPE.start], bytes[E_TYPE.start + 1]]);
    let e_machine = u16::from_le_bytes([bytes[E_MACHINE.start], bytes[E_MACHINE.start + 1]]);
    if e_machine != elf::EM_X86_64 {
        return Err(Unreadable::Machine(e_machine));
    }
    match e_type {
        // Shared objects and position-independent executables are both ET_DYN; the dynamic section tells them
        // apart later, and a PIE is reported as not loadable rather than refused here.
        elf::ET_DYN => Ok(()),
        elf::ET_EXEC => Err(Unreadable::Executable),
        elf::ET_REL => Err(Unreadable::Relocatable),
        elf::ET_CORE => Err(Unreadable::Core),
        t => Err(Unreadable::OtherType(t)),
    }
}

/// Every undefined symbol of `.dynsym` (index 0, the null symbol, excepted).
fn imports(
    dynsym: &SymbolTable<'_, Header>,
    versions: Option<&VersionTable<'_, Header>>,
    endian: LE,
) -> Result<Vec<RawImport>, Unreadable> {
    let mut found = Vec::new();
    for (index, sym) in dynsym.enumerate() {
        if index == SymbolIndex(0) || !sym.is_undefined(endian) {
            continue;
        }
        let version = match versions {
            Some(table) => {
                table.version(table.version_index(endian, index)).map_err(|e| Unreadable::Malformed(e.to_string()))?
            }
            None => None,
        };
        found.push(RawImport {
            name: name_in(dynsym, sym, endian),
            version: version.map(|v| String::from_utf8_lossy(v.name()).into_owned()),
            library: version.and_then(|v| v.file()).map(|f| String::from_utf8_lossy(f).into_owned()),
            weak: sym.st_bind() == elf::STB_WEAK,
            kind: match sym.st_type() {
                elf::STT_FUNC | elf::STT_GNU_IFUNC => SymbolKind::Function,
                elf::STT_OBJECT | elf::STT_COMMON => SymbolKind::Object,
                elf::STT_TLS => SymbolKind::Tls,
                _ => SymbolKind::Other,
            },
        });
    }
    Ok(found)
}

/// A symbol's name; a name the string table cannot give is shown as `?` rather than failing the whole check.
fn name_in(table: &SymbolTable<'_, Header>, sym: &elf::Sym64<LE>, endian: LE) -> String {
    String::from_utf8_lossy(table.symbol_name(endian, sym).unwrap_or(b"?")).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(class: u8, data: u8, e_type: u16, machine: u16) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(&elf::ELFMAG);
        h[EI_CLASS] = class;
        h[EI_DATA] = data;
        h[E_TYPE].copy_from_slice(&e_type.to_le_bytes());
        h[E_MACHINE].copy_from_slice(&machine.to_le_bytes());
        h
    }

    #[test]
    fn refuses_what_is_not_an_x86_64_shared_object() {
        let err = |b: &[u8]| Image::parse(b).unwrap_err();
        assert_eq!(err(b"#!/bin/sh\n"), Unreadable::NoElfHeader);
        assert_eq!(err(b""), Unreadable::NoElfHeader);
        assert_eq!(err(&header(elf::ELFCLASS32, elf::ELFDATA2LSB, elf::ET_DYN, elf::EM_386)), Unreadable::Elf32);
        assert_eq!(err(&header(elf::ELFCLASS64, elf::ELFDATA2MSB, elf::ET_DYN, elf::EM_PPC64)), Unreadable::BigEndian);
        assert_eq!(
            err(&header(elf::ELFCLASS64, elf::ELFDATA2LSB, elf::ET_DYN, elf::EM_AARCH64)),
            Unreadable::Machine(elf::EM_AARCH64)
        );
        assert_eq!(
            err(&header(elf::ELFCLASS64, elf::ELFDATA2LSB, elf::ET_REL, elf::EM_X86_64)),
            Unreadable::Relocatable
        );
        assert_eq!(
            err(&header(elf::ELFCLASS64, elf::ELFDATA2LSB, elf::ET_EXEC, elf::EM_X86_64)),
            Unreadable::Executable
        );
        // A header that passes the identification checks but whose tables are garbage.
        assert!(matches!(
            err(&header(elf::ELFCLASS64, elf::ELFDATA2LSB, elf::ET_DYN, elf::EM_X86_64)),
            Unreadable::Malformed(_) | Unreadable::NoSectionHeaders
        ));
    }
}
