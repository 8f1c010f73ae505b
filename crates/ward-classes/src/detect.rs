//! Which class a shared object belongs to, from the symbols it exports: what the preload shim asks of every library
//! a host opens, before deciding whether to put it under ward.
//!
//! Classifying reads only what it needs, and at most [`MAX_READ`] bytes of it: the ELF file header, the section
//! headers, and the dynamic symbol table with its string table. A file that is not a regular file (a device such
//! as `/dev/zero`, a FIFO, a directory) is refused before anything is read from it, and it is never opened in a way
//! that could block or have side effects (a FIFO is only looked at, a device never opened).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::Endianness;

/// A plugin ABI ward has a class for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Ladspa,
    Frei0r,
    Lv2,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Ladspa => "LADSPA",
            Class::Frei0r => "frei0r",
            Class::Lv2 => "LV2",
        }
    }

    /// The functions a library of the class may export for its host: what a proxy standing in for it exports, where
    /// the library does (which of them make a library one of the class, `classify_exports` says).
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Class::Ladspa => &["ladspa_descriptor"],
            Class::Lv2 => &["lv2_descriptor", "lv2_lib_descriptor"],
            Class::Frei0r => &[
                "f0r_init",
                "f0r_deinit",
                "f0r_get_plugin_info",
                "f0r_get_param_info",
                "f0r_construct",
                "f0r_destruct",
                "f0r_set_param_value",
                "f0r_get_param_value",
                "f0r_update",
                "f0r_update2",
            ],
        }
    }
}

/// What a readable ELF file is, as far as plugins go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classification {
    /// A plugin library of a class ward has.
    Plugin(Class),
    /// A plugin library of an ABI ward has no class for (or only part of a class's entry points): `abi` names it.
    OtherPlugin { abi: &'static str },
    /// No plugin: an ordinary library, or not an ELF file at all.
    NotAPlugin,
}

impl Classification {
    /// The class, for a plugin of a known class.
    pub fn class(self) -> Option<Class> {
        match self {
            Classification::Plugin(class) => Some(class),
            _ => None,
        }
    }
}

/// Why a file could not be classified.
#[derive(Debug, thiserror::Error)]
pub enum ClassifyError {
    /// Not a regular file (a device, a FIFO, a socket, a directory): nothing is read from it.
    #[error("{path} is {what}, not a regular file")]
    NotRegular { path: PathBuf, what: &'static str },
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An ELF file whose headers do not hold together.
    #[error("{path} is a malformed ELF file: {reason}")]
    Malformed { path: PathBuf, reason: String },
    /// Classifying it would mean reading more than [`MAX_READ`] bytes.
    #[error("{path}: its symbol tables are larger than {} MiB", MAX_READ >> 20)]
    TooLarge { path: PathBuf },
}

/// Bytes of an ELF identification (`e_ident`), and where in it the class (32 or 64 bits) is.
const EI_NIDENT: usize = 16;
const EI_CLASS: usize = 4;

/// Most bytes classifying one file reads (headers and dynamic symbols; a large library's are a few MiB).
pub const MAX_READ: u64 = 64 << 20;

/// Entry points of plugin ABIs ward has no class for, with the ABI's name.
const OTHER_ABIS: &[(&str, &str)] = &[
    ("dssi_descriptor", "DSSI"),
    ("lv2ui_descriptor", "LV2 UI"),
    ("vampGetPluginDescriptor", "Vamp"),
    ("clap_entry", "CLAP"),
    ("VSTPluginMain", "VST"),
];

/// The class of the shared object at `path`, or `None` when it is no plugin of a known class or cannot be
/// classified (see [`classify`] for which).
pub fn class_of(path: &Path) -> Option<Class> {
    classify(path).ok().and_then(Classification::class)
}

/// What the file at `path` is. Reads at most [`MAX_READ`] bytes of it, and nothing of a file that is not regular.
pub fn classify(path: &Path) -> Result<Classification, ClassifyError> {
    inspect(path).map(|i| i.classification)
}

/// A classified file and the names of the dynamic symbols it defines.
#[derive(Debug, Clone)]
pub struct Inspected {
    pub classification: Classification,
    /// Every name the file exports (defined dynamic symbols); empty for a file that is not ELF.
    pub exports: Vec<String>,
}

/// As [`classify`], with the names the file exports: what a proxy standing in for it must export, no more.
pub fn inspect(path: &Path) -> Result<Inspected, ClassifyError> {
    let io_error = |source| ClassifyError::Io { path: path.to_path_buf(), source };
    // Looked at before it is opened: opening a device can have effects, opening a FIFO blocks.
    let meta = std::fs::metadata(path).map_err(io_error)?;
    refuse_irregular(path, &meta)?;
    // O_NONBLOCK and O_NOCTTY in case the file was swapped for something else meanwhile; checked again below.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io_error)?;
    let opened = file.metadata().map_err(io_error)?;
    refuse_irregular(path, &opened)?;
    let mut reader = Bounded { source: Source::File(&file), len: opened.len(), left: MAX_READ, path };
    inspect_elf(&mut reader)
}

/// What the ELF file `reader` reads is (not an ELF file: no plugin).
fn classify_elf(reader: &mut Bounded<'_>) -> Result<Classification, ClassifyError> {
    inspect_elf(reader).map(|i| i.classification)
}

fn inspect_elf(reader: &mut Bounded<'_>) -> Result<Inspected, ClassifyError> {
    let ident = reader.read(0, (EI_NIDENT as u64).min(reader.len))?;
    let ident = ident.bytes();
    if ident.len() < EI_NIDENT || ident[..4] != elf::ELFMAG {
        return Ok(Inspected { classification: Classification::NotAPlugin, exports: Vec::new() });
    }
    let exports = match ident[EI_CLASS] {
        elf::ELFCLASS64 => exports::<elf::FileHeader64<Endianness>>(reader)?,
        elf::ELFCLASS32 => exports::<elf::FileHeader32<Endianness>>(reader)?,
        other => return Err(reader.malformed(format!("ELF class {other}"))),
    };
    Ok(Inspected { classification: classify_exports(&exports), exports })
}

/// As [`classify`], on a whole file already in memory; a file that cannot be classified is no plugin.
pub fn class_of_bytes(bytes: &[u8]) -> Option<Class> {
    let path = Path::new("(bytes)");
    let mut reader = Bounded { source: Source::Bytes(bytes), len: bytes.len() as u64, left: MAX_READ, path };
    classify_elf(&mut reader).ok().and_then(Classification::class)
}

/// Which class the exported names make a library.
pub(crate) fn classify_exports(exports: &[String]) -> Classification {
    let exported = |name: &str| exports.iter().any(|e| e == name);
    if exported("ladspa_descriptor") {
        return Classification::Plugin(Class::Ladspa);
    }
    if exported("lv2_descriptor") || exported("lv2_lib_descriptor") {
        return Classification::Plugin(Class::Lv2);
    }
    match (exported("f0r_construct"), exported("f0r_get_plugin_info")) {
        (true, true) => return Classification::Plugin(Class::Frei0r),
        (true, false) | (false, true) => return Classification::OtherPlugin { abi: "frei0r (incomplete)" },
        (false, false) => {}
    }
    match OTHER_ABIS.iter().find(|(symbol, _)| exported(symbol)) {
        Some((_, abi)) => Classification::OtherPlugin { abi },
        None => Classification::NotAPlugin,
    }
}

fn refuse_irregular(path: &Path, meta: &std::fs::Metadata) -> Result<(), ClassifyError> {
    let kind = meta.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    Err(ClassifyError::NotRegular { path: path.to_path_buf(), what })
}

/// What is classified: an opened file, or its bytes.
enum Source<'a> {
    File(&'a File),
    Bytes(&'a [u8]),
}

/// Reads of one file within a budget of bytes.
struct Bounded<'a> {
    source: Source<'a>,
    len: u64,
    left: u64,
    path: &'a Path,
}

/// Bytes read into 8-byte aligned memory, so that ELF structures can be viewed in place.
struct Aligned {
    words: Vec<u64>,
    len: usize,
}

impl Aligned {
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }
}

impl Bounded<'_> {
    fn malformed(&self, reason: String) -> ClassifyError {
        ClassifyError::Malformed { path: self.path.to_path_buf(), reason }
    }

    /// `len` bytes at `offset`, within the file and the budget.
    fn read(&mut self, offset: u64, len: u64) -> Result<Aligned, ClassifyError> {
        let end = offset.checked_add(len).filter(|&end| end <= self.len);
        if end.is_none() {
            return Err(self.malformed(format!("{len} bytes at {offset} lie beyond the end of the file")));
        }
        if len > self.left {
            return Err(ClassifyError::TooLarge { path: self.path.to_path_buf() });
        }
        self.left -= len;
        // Within the budget, so it fits in memory.
        let len = usize::try_from(len).map_err(|_| ClassifyError::TooLarge { path: self.path.to_path_buf() })?;
        let mut words = vec![0u64; len.div_ceil(8)];
        let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len];
        match self.source {
            Source::File(file) => file
                .read_exact_at(bytes, offset)
                .map_err(|source| ClassifyError::Io { path: self.path.to_path_buf(), source })?,
            // Within the length, checked above.
            Source::Bytes(all) => bytes.copy_from_slice(&all[offset as usize..offset as usize + len]),
        }
        Ok(Aligned { words, len })
    }
}

/// The names of the symbols the ELF file defines in its dynamic symbol table.
fn exports<Elf: FileHeader<Endian = Endianness>>(reader: &mut Bounded<'_>) -> Result<Vec<String>, ClassifyError> {
    let header_bytes = reader.read(0, std::mem::size_of::<Elf>() as u64)?;
    let header = Elf::parse(header_bytes.bytes()).map_err(|e| reader.malformed(e.to_string()))?;
    let endian = header.endian().map_err(|e| reader.malformed(e.to_string()))?;
    let shoff: u64 = header.e_shoff(endian).into();
    if shoff == 0 {
        return Ok(Vec::new()); // no section headers: no dynamic symbol table to find
    }
    let entry = std::mem::size_of::<Elf::SectionHeader>() as u64;
    if u64::from(header.e_shentsize(endian)) != entry {
        return Err(reader.malformed(format!("section headers of {} bytes", header.e_shentsize(endian))));
    }
    let mut count = u64::from(header.e_shnum(endian));
    if count == 0 {
        // More than 0xff00 sections: the count is in the first section header.
        let first = reader.read(shoff, entry)?;
        let first: &Elf::SectionHeader =
            object::pod::from_bytes(first.bytes()).map_err(|_| reader.malformed("section header 0".into()))?.0;
        count = first.sh_size(endian).into();
    }
    let table_len = count.checked_mul(entry).ok_or_else(|| reader.malformed(format!("{count} sections")))?;
    let table = reader.read(shoff, table_len)?;
    let sections: &[Elf::SectionHeader] = object::pod::slice_from_all_bytes(table.bytes())
        .map_err(|_| reader.malformed("the section header table".into()))?;
    let mut names = Vec::new();
    for dynsym in sections.iter().filter(|s| s.sh_type(endian) == elf::SHT_DYNSYM) {
        let strtab = sections
            .get(dynsym.sh_link(endian) as usize)
            .ok_or_else(|| reader.malformed("the dynamic symbols' string table is missing".into()))?;
        let (sym_at, sym_len): (u64, u64) = (dynsym.sh_offset(endian).into(), dynsym.sh_size(endian).into());
        let (str_at, str_len): (u64, u64) = (strtab.sh_offset(endian).into(), strtab.sh_size(endian).into());
        let symbols = reader.read(sym_at, sym_len - sym_len % std::mem::size_of::<Elf::Sym>() as u64)?;
        let strings = reader.read(str_at, str_len)?;
        let symbols: &[Elf::Sym] = object::pod::slice_from_all_bytes(symbols.bytes())
            .map_err(|_| reader.malformed("the dynamic symbol table".into()))?;
        let strings = strings.bytes();
        for symbol in symbols.iter().filter(|s| s.is_definition(endian)) {
            let Some(name) = strings.get(symbol.st_name(endian) as usize..) else { continue };
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            names.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_decide_the_class() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(classify_exports(&names(&["ladspa_descriptor"])), Classification::Plugin(Class::Ladspa));
        let frei0r = names(&["f0r_construct", "f0r_get_plugin_info", "f0r_init"]);
        assert_eq!(classify_exports(&frei0r), Classification::Plugin(Class::Frei0r));
        assert!(matches!(classify_exports(&names(&["f0r_construct"])), Classification::OtherPlugin { .. }));
        assert_eq!(classify_exports(&names(&["lv2_descriptor"])), Classification::Plugin(Class::Lv2));
        assert_eq!(classify_exports(&names(&["lv2_lib_descriptor"])), Classification::Plugin(Class::Lv2));
        assert_eq!(classify_exports(&names(&["lv2ui_descriptor"])), Classification::OtherPlugin { abi: "LV2 UI" });
        assert_eq!(classify_exports(&names(&["malloc", "sox_init"])), Classification::NotAPlugin);
    }
}
