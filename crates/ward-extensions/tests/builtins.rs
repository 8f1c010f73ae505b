//! The embedded builtins themselves: ELF files, one per `extensions/*.c`,
//! extraction to disk.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

#[test]
fn every_builtin_is_an_elf_shared_object() {
    assert!(!ward_extensions::ALL.is_empty());
    for b in ward_extensions::ALL {
        assert!(b.bytes.starts_with(b"\x7fELF"), "{} is not ELF", b.name);
        assert_eq!(b.file_name, format!("{}.so", b.name));
        assert!(!b.description.is_empty());
        assert_eq!(ward_extensions::get(b.name).unwrap().bytes, b.bytes);
    }
    assert!(ward_extensions::get("nope").is_none());
}

#[test]
fn every_source_file_is_embedded() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../extensions");
    let mut stems: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    stems.sort();
    let mut names: Vec<String> = ward_extensions::ALL.iter().map(|b| b.name.to_owned()).collect();
    names.sort();
    assert_eq!(stems, names, "extensions/*.c and ward_extensions::ALL differ");
}

#[test]
fn extract_to_writes_every_builtin() {
    let dir = std::env::temp_dir().join(format!("ward-extensions-test-{}/nested", std::process::id()));
    let _ = fs::remove_dir_all(dir.parent().unwrap());
    // Twice: the second run replaces the files of the first.
    for _ in 0..2 {
        let got = ward_extensions::extract_to(&dir).unwrap();
        assert_eq!(got, dir);
        for b in ward_extensions::ALL {
            let path = dir.join(b.file_name);
            assert_eq!(fs::read(&path).unwrap(), b.bytes);
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o755, "{}", path.display());
        }
        // No temporary files are left behind.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), ward_extensions::ALL.len());
    }
    fs::remove_dir_all(dir.parent().unwrap()).unwrap();
}

#[test]
fn extracted_is_a_stable_per_user_directory() {
    let first = ward_extensions::extracted().unwrap();
    let second = ward_extensions::extracted().unwrap();
    assert_eq!(first, second);
    assert!(first.starts_with(std::env::temp_dir()));
    let name = first.file_name().unwrap().to_string_lossy().into_owned();
    let hash = name.rsplit('-').next().unwrap();
    assert!(name.starts_with("ward-extensions-"), "{name}");
    assert_eq!(hash.len(), 16, "{name}");
    assert!(hash.bytes().all(|c| c.is_ascii_hexdigit()), "{name}");
    for b in ward_extensions::ALL {
        let path = ward_extensions::path_of(b.name).unwrap();
        assert_eq!(path, first.join(b.file_name));
        assert_eq!(fs::read(&path).unwrap(), b.bytes);
    }
}

#[test]
fn path_of_an_unknown_builtin_fails() {
    let err = ward_extensions::path_of("nope").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert!(err.to_string().contains("nope"), "{err}");
}
