//! ward's built-in C test extensions.
//!
//! The build script compiles every `extensions/*.c` of the workspace into a
//! shared object; this crate embeds them ([`ALL`]) and writes them to disk on
//! demand ([`extract_to`], [`extracted`], [`path_of`]) so that they can be
//! loaded like any other extension.
//!
//! * `well` – well-behaved: arithmetic, buffers, callbacks, state.
//! * `faulty` – deliberately faulty: every fault kind, armed or immediate.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// One built-in extension, embedded at build time.
#[derive(Debug)]
pub struct Builtin {
    /// The file stem, e.g. `"well"`.
    pub name: &'static str,
    /// The file name of the shared object, e.g. `"well.so"`.
    pub file_name: &'static str,
    /// What the extension is for.
    pub description: &'static str,
    /// The ELF shared object.
    pub bytes: &'static [u8],
}

macro_rules! builtin {
    ($name:literal, $description:literal) => {
        Builtin {
            name: $name,
            file_name: concat!($name, ".so"),
            description: $description,
            bytes: include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".so")),
        }
    };
}

/// Every built-in extension.
pub const ALL: &[Builtin] = &[
    builtin!("well", "well-behaved: arithmetic, buffers, callbacks, state"),
    builtin!("faulty", "deliberately faulty: every fault kind, armed or immediate"),
];

/// Mode of the extracted shared objects.
const FILE_MODE: u32 = 0o755;
/// Mode of the per-user directory created by [`extracted`].
const DIR_MODE: u32 = 0o700;

/// The built-in extension called `name` (its file stem), if any.
pub fn get(name: &str) -> Option<&'static Builtin> {
    ALL.iter().find(|b| b.name == name)
}

/// Writes every builtin into `dir` (created if missing), each atomically
/// (temporary file + rename) with mode 0755; returns `dir`.
pub fn extract_to(dir: &Path) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    for builtin in ALL {
        write_atomically(&dir.join(builtin.file_name), builtin.bytes)?;
    }
    Ok(dir.to_path_buf())
}

fn write_atomically(dest: &Path, bytes: &[u8]) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let file_name =
        dest.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?.to_string_lossy();
    let tmp =
        dest.with_file_name(format!(".{file_name}.tmp-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(&tmp)?;
        file.write_all(bytes)?;
        // The umask may have removed bits.
        file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, dest)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// FNV-1a (64 bit) over the names and bytes of every builtin.
fn content_hash() -> u64 {
    static HASH: OnceLock<u64> = OnceLock::new();
    *HASH.get_or_init(|| {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |bytes: &[u8]| {
            for &b in bytes {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        for builtin in ALL {
            feed(builtin.file_name.as_bytes());
            feed(&(builtin.bytes.len() as u64).to_le_bytes());
            feed(builtin.bytes);
        }
        hash
    })
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The per-user extraction directory under [`std::env::temp_dir`], named
/// `ward-extensions-<uid>-<16 hex digits of a hash of all builtins>`.
/// The builtins are extracted into it unless every file is already there
/// with the right size; returns it.
///
/// The directory is created with mode 0700; an existing one must be a real
/// directory owned by the current user and not writable by anybody else,
/// otherwise this fails with `PermissionDenied` (someone else could have
/// planted shared objects in it).
pub fn extracted() -> io::Result<PathBuf> {
    let uid = euid();
    let dir = std::env::temp_dir().join(format!("ward-extensions-{uid}-{:016x}", content_hash()));
    match DirBuilder::new().mode(DIR_MODE).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(&dir)?;
    if !meta.file_type().is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory owned by uid {uid} and writable only by it", dir.display()),
        ));
    }
    let complete = ALL.iter().all(|b| {
        fs::symlink_metadata(dir.join(b.file_name))
            .is_ok_and(|m| m.file_type().is_file() && m.len() == b.bytes.len() as u64)
    });
    if complete {
        Ok(dir)
    } else {
        extract_to(&dir)
    }
}

/// The path of the extracted builtin called `name` (see [`extracted`]);
/// a `NotFound` error naming it if there is no such builtin.
pub fn path_of(name: &str) -> io::Result<PathBuf> {
    let builtin = get(name)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no built-in extension named `{name}`")))?;
    Ok(extracted()?.join(builtin.file_name))
}
