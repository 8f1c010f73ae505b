//! Shared objects compiled from C by a build script, embedded with `include_bytes!`, and written to a private
//! per-user directory when something needs them as files (dlopen needs a path).
//!
//! Used by the built-in test extensions, the class adapters and the preload proxies: each crate names its set with
//! a prefix and lists its members with [`embedded!`].

#[cfg(feature = "build")]
pub mod build;

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// One embedded shared object.
#[derive(Debug)]
pub struct Embedded {
    /// The file stem, e.g. `"well"`.
    pub name: &'static str,
    /// The file name, e.g. `"well.so"`.
    pub file_name: &'static str,
    /// What it is for.
    pub description: &'static str,
    /// The ELF shared object.
    pub bytes: &'static [u8],
}

/// An [`Embedded`] built by the crate's build script into `OUT_DIR/<name>.so`.
#[macro_export]
macro_rules! embedded {
    ($name:literal, $description:literal) => {
        $crate::Embedded {
            name: $name,
            file_name: concat!($name, ".so"),
            description: $description,
            bytes: include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".so")),
        }
    };
}

/// A named set of embedded shared objects, extracted together.
#[derive(Debug)]
pub struct EmbeddedSet {
    /// Prefix of the extraction directory, e.g. `"ward-extensions"`.
    pub prefix: &'static str,
    pub members: &'static [Embedded],
    /// Hash of the members, computed once.
    hash: OnceLock<u64>,
}

/// Mode of the extracted shared objects.
const FILE_MODE: u32 = 0o755;
/// Mode of the per-user directory.
const DIR_MODE: u32 = 0o700;

impl EmbeddedSet {
    pub const fn new(prefix: &'static str, members: &'static [Embedded]) -> EmbeddedSet {
        EmbeddedSet { prefix, members, hash: OnceLock::new() }
    }

    /// The member called `name` (its file stem), if any.
    pub fn get(&self, name: &str) -> Option<&'static Embedded> {
        self.members.iter().find(|b| b.name == name)
    }

    /// Writes every member into `dir` (created if missing), each atomically (temporary file + rename) with mode
    /// 0755; returns `dir`.
    pub fn extract_to(&self, dir: &Path) -> io::Result<PathBuf> {
        fs::create_dir_all(dir)?;
        for member in self.members {
            write_atomically(&dir.join(member.file_name), member.bytes)?;
        }
        Ok(dir.to_path_buf())
    }

    /// FNV-1a (64 bit) over the names and bytes of every member.
    fn content_hash(&self) -> u64 {
        *self.hash.get_or_init(|| {
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            let mut feed = |bytes: &[u8]| {
                for &b in bytes {
                    hash ^= u64::from(b);
                    hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
                }
            };
            for member in self.members {
                feed(member.file_name.as_bytes());
                feed(&(member.bytes.len() as u64).to_le_bytes());
                feed(member.bytes);
            }
            hash
        })
    }

    /// The per-user extraction directory under [`std::env::temp_dir`], named
    /// `<prefix>-<uid>-<16 hex digits of a hash of all members>`. The members are extracted into it unless every
    /// file is already there with the right size; returns it.
    ///
    /// The directory is created with mode 0700; an existing one must be a real directory owned by the current user
    /// and not writable by anybody else, otherwise this fails with `PermissionDenied` (someone else could have
    /// planted shared objects in it).
    pub fn extracted(&self) -> io::Result<PathBuf> {
        let uid = euid();
        let dir = std::env::temp_dir().join(format!("{}-{uid}-{:016x}", self.prefix, self.content_hash()));
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
        let complete = self.members.iter().all(|b| {
            fs::symlink_metadata(dir.join(b.file_name))
                .is_ok_and(|m| m.file_type().is_file() && m.len() == b.bytes.len() as u64)
        });
        if complete {
            Ok(dir)
        } else {
            self.extract_to(&dir)
        }
    }

    /// The path of the extracted member called `name` (see [`EmbeddedSet::extracted`]); a `NotFound` error naming
    /// it if there is no such member.
    pub fn path_of(&self, name: &str) -> io::Result<PathBuf> {
        let member = self.get(name).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no shared object named `{name}` in {}", self.prefix))
        })?;
        Ok(self.extracted()?.join(member.file_name))
    }
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

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
