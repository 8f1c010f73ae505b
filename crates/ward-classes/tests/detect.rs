//! Classifying the files a host opens: bounded, and never stuck on a file that is not a regular one.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use object::read::elf::{FileHeader, SectionHeader};
use ward_classes::{class_of, classify, Class, Classification, ClassifyError};

mod common;
use common::Scratch;

fn builtin(name: &str) -> PathBuf {
    ward_extensions::path_of(name).expect("the built-in extracts")
}

const EIGHT_GIB: u64 = 8 << 30;

#[test]
fn the_builtins_are_classified_by_their_exports() {
    assert_eq!(classify(&builtin("faulty_ladspa")).unwrap(), Classification::Plugin(Class::Ladspa));
    assert_eq!(classify(&builtin("faulty_frei0r")).unwrap(), Classification::Plugin(Class::Frei0r));
    assert_eq!(classify(&builtin("well")).unwrap(), Classification::NotAPlugin);
    // A bad plugin is still a plugin: ward decides what to do with it, not the classifier.
    assert_eq!(class_of(&builtin("bad_ladspa_ctor_crash")), Some(Class::Ladspa));
}

#[test]
fn devices_and_fifos_are_refused_unread() {
    let err = classify(Path::new("/dev/zero")).unwrap_err();
    assert!(matches!(&err, ClassifyError::NotRegular { what: "a character device", .. }), "{err}");
    assert!(err.to_string().contains("/dev/zero"), "{err}");
    assert!(matches!(classify(Path::new("/")), Err(ClassifyError::NotRegular { what: "a directory", .. })));

    let s = Scratch::new("detect", "fifo");
    let fifo = s.path("plugin.so");
    let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; the result is checked.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    // Nobody writes to it: opening it to read would wait for ever.
    assert!(matches!(classify(&fifo), Err(ClassifyError::NotRegular { what: "a FIFO", .. })));
    assert_eq!(class_of(&fifo), None);
}

#[test]
fn a_big_sparse_file_is_classified_from_its_headers() {
    let s = Scratch::new("detect", "sparse");
    // 8 GiB of nothing: no ELF file, said from its first bytes.
    let zeros = s.path("zeros.so");
    std::fs::File::create(&zeros).unwrap().set_len(EIGHT_GIB).unwrap();
    assert_eq!(classify(&zeros).unwrap(), Classification::NotAPlugin);

    // A real plugin with 8 GiB of holes after it: still that plugin, read no further than its symbols.
    let padded = s.path("padded.so");
    std::fs::copy(builtin("faulty_ladspa"), &padded).unwrap();
    std::fs::OpenOptions::new().write(true).open(&padded).unwrap().set_len(EIGHT_GIB).unwrap();
    assert_eq!(classify(&padded).unwrap(), Classification::Plugin(Class::Ladspa));
}

/// Where in the ELF file `bytes` the `sh_size` field of its dynamic symbol table's section header is.
fn dynsym_size_field(bytes: &[u8]) -> u64 {
    let endian = object::Endianness::Little;
    let header = object::elf::FileHeader64::<object::Endianness>::parse(bytes).unwrap();
    let sections = header.section_headers(endian, bytes).unwrap();
    let index = sections.iter().position(|s| s.sh_type(endian) == object::elf::SHT_DYNSYM).expect("a .dynsym");
    // Elf64_Shdr: sh_size is at byte 32 of each 64-byte header.
    header.e_shoff.get(endian) + index as u64 * 64 + 32
}

#[test]
fn symbol_tables_beyond_the_bound_are_refused_not_read() {
    let s = Scratch::new("detect", "huge-symbols");
    let path = s.path("huge.so");
    let bytes = std::fs::read(builtin("faulty_ladspa")).unwrap();
    let field = dynsym_size_field(&bytes);
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&bytes).unwrap();
    // The file holds 8 GiB (sparse) and its dynamic symbol table claims 6 GiB of them.
    file.set_len(EIGHT_GIB).unwrap();
    file.seek(SeekFrom::Start(field)).unwrap();
    file.write_all(&(6u64 << 30).to_le_bytes()).unwrap();
    drop(file);
    let err = classify(&path).unwrap_err();
    assert!(matches!(&err, ClassifyError::TooLarge { .. }), "{err}");
    assert_eq!(class_of(&path), None);
}

#[test]
fn a_truncated_elf_file_is_malformed() {
    let s = Scratch::new("detect", "truncated");
    let path = s.path("truncated.so");
    let bytes = std::fs::read(builtin("faulty_ladspa")).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    // Its section headers are at the end, which is gone.
    let err = classify(&path).unwrap_err();
    assert!(matches!(&err, ClassifyError::Malformed { .. }), "{err}");
}
