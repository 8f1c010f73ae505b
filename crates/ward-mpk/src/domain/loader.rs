//! The mpk loader: an extension's image copied into domain memory, relocated, and every import bound through the
//! caller's binder; no code of the dynamic linker runs, so nothing of the image lands in host memory.
//!
//! What [`place`] does, in order: checks the load segments fit the space given, copies each segment's file bytes
//! (the rest stays zero, as the region is fresh), applies the dynamic relocations (`RELATIVE`, `64`, `GLOB_DAT`,
//! `JUMP_SLOT`, and for thread-local storage `DTPMOD64`, `DTPOFF64` and `TPOFF64`; anything else is refused by
//! name), and reports the protection every page should get, with `PT_GNU_RELRO` pages read-only.
//!
//! An image's own thread-local storage ([`tls_template`]) lives in the domain's thread blocks (`thread_block`), at
//! an offset below the thread pointer the caller chooses and hands to [`place`] as a [`TlsModule`]. It touches no page protection itself: the caller tags the pages with the
//! domain's key once the image is complete.
//!
//! Symbols the image defines bind to its own definitions (as `-Bsymbolic` would): an extension's calls of its own
//! functions stay in its domain. Everything undefined goes to the binder; an unbound weak import is null, as the
//! dynamic linker makes it, and every unbound strong import is listed in one error.

use std::collections::HashMap;
use std::ops::Range;

use object::elf;
use object::read::elf::{Dyn, FileHeader, ProgramHeader, Rela, SectionHeader, Sym};
use object::{LittleEndian as LE, SymbolIndex};

type Header = elf::FileHeader64<LE>;

/// One undefined symbol the binder is asked for.
#[derive(Debug)]
pub struct ImportRequest<'a> {
    pub name: &'a str,
    pub version: Option<&'a str>,
    /// The library that version comes from (`libmvec.so.1`), from `.gnu.version_r`.
    pub library: Option<&'a str>,
    /// Data rather than code (`STT_OBJECT`, `STT_COMMON`, `STT_TLS`).
    pub object: bool,
}

/// Why an image could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("malformed ELF: {0}")]
    Malformed(String),
    #[error("the image needs {needed} bytes of address space; the domain reserves {reserved}")]
    TooLarge { needed: u64, reserved: usize },
    #[error("relocation type {kind} at {offset:#x} is not one the mpk loader applies (it handles RELATIVE, 64, GLOB_DAT, JUMP_SLOT, DTPMOD64, DTPOFF64 and TPOFF64)")]
    Relocation { kind: u32, offset: u64 },
    #[error("the thread-local relocation at {offset:#x} names {what}, not the image's own thread-local storage")]
    ForeignTls { offset: u64, what: String },
    #[error("imports the domain cannot bind: {}", .0.join(", "))]
    Unbound(Vec<String>),
}

fn malformed(e: impl std::fmt::Display) -> LoadError {
    LoadError::Malformed(e.to_string())
}

/// The address space an image needs: from its first load segment's page to its last one's end, in whole pages.
pub fn span(bytes: &[u8], page: usize) -> Result<usize, LoadError> {
    let header = Header::parse(bytes).map_err(malformed)?;
    let endian = header.endian().map_err(malformed)?;
    let (low, high) = load_bounds(header, endian, bytes, page)?;
    usize::try_from(high - low).map_err(malformed)
}

fn load_bounds(header: &Header, endian: LE, bytes: &[u8], page: usize) -> Result<(u64, u64), LoadError> {
    let page = page as u64;
    let mut low = u64::MAX;
    let mut high = 0u64;
    for ph in header.program_headers(endian, bytes).map_err(malformed)? {
        if ph.p_type(endian) != elf::PT_LOAD {
            continue;
        }
        let start = ph.p_vaddr(endian);
        let end = start
            .checked_add(ph.p_memsz(endian))
            .ok_or_else(|| LoadError::Malformed(format!("load segment at {start:#x} wraps around")))?;
        low = low.min(start / page * page);
        high = high.max(end.div_ceil(page) * page);
    }
    if low >= high {
        return Err(LoadError::Malformed("no load segment".into()));
    }
    // Anything past a terabyte is a hostile header, not an extension.
    if high - low > 1 << 40 {
        return Err(LoadError::TooLarge { needed: high - low, reserved: 0 });
    }
    Ok((low, high))
}

/// An image's thread-local storage: what each thread's copy starts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsTemplate {
    /// `.tdata`: the initialised part.
    pub init: Vec<u8>,
    /// The whole block (`.tdata` and `.tbss`), in bytes.
    pub size: usize,
    /// Its alignment (a power of two, at most a page).
    pub align: usize,
}

/// Where an image's thread-local storage is in every thread block of its domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsModule {
    /// The module number `DTPMOD64` gives and `__tls_get_addr` is asked for.
    pub id: usize,
    /// The block starts this many bytes below the thread pointer.
    pub below: usize,
}

/// The image's `PT_TLS` segment, if it has one.
pub fn tls_template(bytes: &[u8], page: usize) -> Result<Option<TlsTemplate>, LoadError> {
    let header = Header::parse(bytes).map_err(malformed)?;
    let endian = header.endian().map_err(malformed)?;
    let Some(ph) =
        header.program_headers(endian, bytes).map_err(malformed)?.iter().find(|ph| ph.p_type(endian) == elf::PT_TLS)
    else {
        return Ok(None);
    };
    let init = ph.data(endian, bytes).map_err(|()| malformed("the TLS segment runs past the end of the file"))?;
    let size = usize::try_from(ph.p_memsz(endian)).map_err(malformed)?;
    let align = usize::try_from(ph.p_align(endian).max(1)).map_err(malformed)?;
    if init.len() > size || size > 1 << 30 {
        return Err(malformed(format!("a TLS segment of {size} bytes with {} initialised", init.len())));
    }
    // glibc copes with a block that starts off its alignment; no toolchain makes one, and ward does not.
    if !align.is_power_of_two() || align > page || ph.p_vaddr(endian) % align as u64 != 0 {
        return Err(malformed(format!("a TLS segment aligned to {align} at {:#x}", ph.p_vaddr(endian))));
    }
    Ok(Some(TlsTemplate { init: init.to_vec(), size, align }))
}

/// An image placed in domain memory.
#[derive(Debug)]
pub struct Placed {
    /// Exported definitions: name to run-time address.
    pub exports: HashMap<String, usize>,
    /// Initialisers to run once placed, in order: `DT_INIT`, then the `DT_INIT_ARRAY` entries.
    pub init: Vec<usize>,
    /// Per page of the span, the protection it gets (`PROT_*` bits; 0 for a gap between segments).
    pub page_prot: Vec<i32>,
}

impl Placed {
    pub fn export(&self, name: &str) -> Option<usize> {
        self.exports.get(name).copied()
    }
}

/// Places the image `bytes` at `at` (page-aligned, `len` bytes the caller may write, zeroed), asking `bind` for
/// every undefined symbol; `tls` is where its thread-local storage is, when it has any.
///
/// # Safety
/// `at..at + len` is memory the caller owns and may write, used by nothing else.
pub unsafe fn place(
    bytes: &[u8],
    at: *mut u8,
    len: usize,
    page: usize,
    tls: Option<TlsModule>,
    mut bind: impl FnMut(&ImportRequest<'_>) -> Option<usize>,
) -> Result<Placed, LoadError> {
    let header = Header::parse(bytes).map_err(malformed)?;
    let endian = header.endian().map_err(malformed)?;
    let (low, high) = load_bounds(header, endian, bytes, page)?;
    let needed = high - low;
    if needed > len as u64 {
        return Err(LoadError::TooLarge { needed, reserved: len });
    }
    let bias = (at as usize).wrapping_sub(low as usize);
    let segments = header.program_headers(endian, bytes).map_err(malformed)?;
    let pages = (needed / page as u64) as usize;
    let mut page_prot = vec![0i32; pages];
    let mut relro: Option<Range<u64>> = None;
    for ph in segments {
        match ph.p_type(endian) {
            elf::PT_LOAD => {
                let vaddr = ph.p_vaddr(endian);
                let data = ph.data(endian, bytes).map_err(|()| {
                    LoadError::Malformed(format!("load segment at {vaddr:#x} runs past the end of the file"))
                })?;
                if data.len() as u64 > ph.p_memsz(endian) {
                    return Err(LoadError::Malformed(format!(
                        "load segment at {vaddr:#x}: file size past memory size"
                    )));
                }
                let offset = (vaddr - low) as usize;
                // SAFETY: offset + data.len() <= memsz end <= needed <= len (checked above), inside the caller's
                // writable memory; the source is the file's bytes, which cannot overlap it.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at.add(offset), data.len()) };
                let flags = ph.p_flags(endian);
                let prot = if flags & elf::PF_R != 0 { libc::PROT_READ } else { 0 }
                    | if flags & elf::PF_W != 0 { libc::PROT_WRITE } else { 0 }
                    | if flags & elf::PF_X != 0 { libc::PROT_EXEC } else { 0 };
                let first = ((vaddr - low) / page as u64) as usize;
                let last = ((vaddr + ph.p_memsz(endian) - low).div_ceil(page as u64)) as usize;
                for p in &mut page_prot[first..last.min(pages)] {
                    *p |= prot;
                }
            }
            elf::PT_GNU_RELRO => {
                let start = ph.p_vaddr(endian);
                relro = Some(start..start + ph.p_memsz(endian));
            }
            _ => {}
        }
    }

    let sections = header.sections(endian, bytes).map_err(malformed)?;
    let dynsym = sections.symbols(endian, bytes, elf::SHT_DYNSYM).map_err(malformed)?;
    let versions = sections.versions(endian, bytes).map_err(malformed)?;
    let in_image = |vaddr: u64, size: u64| vaddr >= low && vaddr.checked_add(size).is_some_and(|end| end <= high);

    // Every symbol's run-time value, resolved once: definitions by the bias, imports by the binder.
    let mut values: Vec<Option<usize>> = Vec::with_capacity(dynsym.len());
    let mut unbound = Vec::new();
    let mut exports = HashMap::new();
    for (index, sym) in dynsym.enumerate() {
        if index == SymbolIndex(0) {
            values.push(Some(0));
            continue;
        }
        let name = String::from_utf8_lossy(dynsym.symbol_name(endian, sym).map_err(malformed)?).into_owned();
        if sym.is_undefined(endian) {
            let (version, library) = match &versions {
                Some(table) => match table.version(table.version_index(endian, index)).map_err(malformed)? {
                    Some(v) => (
                        Some(String::from_utf8_lossy(v.name()).into_owned()),
                        v.file().map(|f| String::from_utf8_lossy(f).into_owned()),
                    ),
                    None => (None, None),
                },
                None => (None, None),
            };
            let weak = sym.st_bind() == elf::STB_WEAK;
            let object = matches!(sym.st_type(), elf::STT_OBJECT | elf::STT_COMMON | elf::STT_TLS);
            let bound =
                bind(&ImportRequest { name: &name, version: version.as_deref(), library: library.as_deref(), object });
            match bound {
                Some(address) => values.push(Some(address)),
                None if weak => values.push(Some(0)),
                None => {
                    unbound.push(name);
                    values.push(None);
                }
            }
            continue;
        }
        if sym.st_shndx(endian) == elf::SHN_ABS {
            values.push(Some(sym.st_value(endian) as usize));
            continue;
        }
        let value = bias.wrapping_add(sym.st_value(endian) as usize);
        values.push(Some(value));
        let exported = matches!(sym.st_bind(), elf::STB_GLOBAL | elf::STB_WEAK)
            && sym.st_visibility() == elf::STV_DEFAULT
            && sym.st_type() != elf::STT_TLS;
        if exported {
            exports.entry(name).or_insert(value);
        }
    }
    if !unbound.is_empty() {
        unbound.sort();
        unbound.dedup();
        return Err(LoadError::Unbound(unbound));
    }

    for section in sections.iter() {
        if section.sh_flags(endian) & u64::from(elf::SHF_ALLOC) == 0 {
            continue;
        }
        let Some((relocations, _)) = section.rela(endian, bytes).map_err(malformed)? else {
            if section.sh_type(endian) == elf::SHT_RELA || section.sh_type(endian) == elf::SHT_REL {
                return Err(LoadError::Malformed("REL relocations on x86-64".into()));
            }
            continue;
        };
        for r in relocations {
            let offset = r.r_offset(endian);
            if !in_image(offset, 8) {
                return Err(LoadError::Malformed(format!("relocation at {offset:#x} lies outside the image")));
            }
            let kind = r.r_type(endian, false);
            let addend = r.r_addend(endian) as usize;
            let symbol = || -> Result<usize, LoadError> {
                let index = r.r_sym(endian, false) as usize;
                values
                    .get(index)
                    .copied()
                    .flatten()
                    .ok_or_else(|| LoadError::Malformed(format!("relocation at {offset:#x} names symbol {index}")))
            };
            // The offset of a thread-local symbol (none: the module's own block) inside the image's TLS block.
            let tls_offset = || -> Result<(TlsModule, usize), LoadError> {
                let index = r.r_sym(endian, false) as usize;
                let foreign = |what: String| LoadError::ForeignTls { offset, what };
                let module = tls.ok_or_else(|| foreign("an image without a TLS segment".into()))?;
                if index == 0 {
                    return Ok((module, 0));
                }
                let sym = dynsym.symbol(SymbolIndex(index)).map_err(malformed)?;
                let name = || String::from_utf8_lossy(dynsym.symbol_name(endian, sym).unwrap_or_default()).into_owned();
                if sym.is_undefined(endian) || sym.st_type() != elf::STT_TLS {
                    return Err(foreign(format!("symbol {}", name())));
                }
                Ok((module, sym.st_value(endian) as usize))
            };
            let value = match kind {
                elf::R_X86_64_NONE => continue,
                elf::R_X86_64_RELATIVE => bias.wrapping_add(addend),
                elf::R_X86_64_64 => symbol()?.wrapping_add(addend),
                elf::R_X86_64_GLOB_DAT | elf::R_X86_64_JUMP_SLOT => symbol()?,
                elf::R_X86_64_DTPMOD64 => tls_offset()?.0.id,
                elf::R_X86_64_DTPOFF64 => tls_offset()?.1.wrapping_add(addend),
                elf::R_X86_64_TPOFF64 => {
                    let (module, at) = tls_offset()?;
                    at.wrapping_add(addend).wrapping_sub(module.below)
                }
                _ => return Err(LoadError::Relocation { kind, offset }),
            };
            // SAFETY: the eight bytes lie inside the image (checked above), in the caller's writable memory; they
            // may be unaligned in a hostile file, hence the unaligned write.
            unsafe { at.add((offset - low) as usize).cast::<usize>().write_unaligned(value) };
        }
    }

    if let Some(relro) = relro {
        // Whole pages only: the tail of the last relro page may share its page with data.
        let first = (relro.start.saturating_sub(low)).div_ceil(page as u64) as usize;
        let last = ((relro.end.saturating_sub(low)) / page as u64) as usize;
        for p in page_prot.iter_mut().take(last.min(pages)).skip(first) {
            *p &= !libc::PROT_WRITE;
        }
    }

    let mut init = Vec::new();
    if let Some((entries, _)) = sections.dynamic(endian, bytes).map_err(malformed)? {
        let mut array: Option<(u64, u64)> = None;
        let mut single = None;
        for entry in entries {
            match entry.tag32(endian) {
                Some(elf::DT_INIT) => single = Some(entry.d_val(endian)),
                Some(elf::DT_INIT_ARRAY) => array = Some((entry.d_val(endian), array.map_or(0, |a| a.1))),
                Some(elf::DT_INIT_ARRAYSZ) => array = Some((array.map_or(0, |a| a.0), entry.d_val(endian))),
                Some(elf::DT_NULL) => break,
                _ => {}
            }
        }
        if let Some(address) = single {
            init.push(bias.wrapping_add(address as usize));
        }
        if let Some((address, size)) = array {
            if size > 0 && !in_image(address, size) {
                return Err(LoadError::Malformed(format!("init array at {address:#x} lies outside the image")));
            }
            for i in 0..size / 8 {
                // SAFETY: inside the image (checked above), relocated already.
                let entry = unsafe { at.add((address - low + i * 8) as usize).cast::<usize>().read_unaligned() };
                // 0 and -1 are placeholders the toolchain may leave.
                if entry != 0 && entry != usize::MAX {
                    init.push(entry);
                }
            }
        }
    }
    for &f in &init {
        let inside = f.checked_sub(at as usize).is_some_and(|o| (o as u64) < needed);
        let page_ok = inside && page_prot[(f - at as usize) / page] & libc::PROT_EXEC != 0;
        if !page_ok {
            return Err(LoadError::Malformed(format!("initialiser {f:#x} is not in the image's code")));
        }
    }
    Ok(Placed { exports, init, page_prot })
}
