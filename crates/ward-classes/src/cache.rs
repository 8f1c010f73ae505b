//! The user's cache of descriptions: what a describer read of a LADSPA library or frei0r plugin, kept so that a
//! host scanning the same unchanged file again gets its descriptions without a describer domain and without loading
//! any of its code (DECISIONS.md, "A cache of descriptions").
//!
//! One file per library, named by a hash of the path the host opened it by, holding the file's identity (device,
//! inode, size, modification and change times to the nanosecond), the version of the description format, the
//! library's class and the entry points it exports, and the descriptions exactly as the class adapter wrote them in
//! the describer. A file is written whole under a temporary name and renamed into place, so two hosts writing at once
//! leave one complete entry, and no read-modify-write of a shared file can lose the other's. Everything read back is
//! untrusted: an entry that does not parse, is of another version, is not of this very file, or whose descriptions
//! fail the checks every description read from a domain gets (they go through the same parser) is a miss, never an
//! error.
//!
//! The directory is `$WARD_CACHE_DIR`, else `$XDG_CACHE_HOME/ward`, else `$HOME/.cache/ward`: created with mode 0700,
//! and used only while it is a real directory (no symlink) owned by this user and writable by no one else.

use std::fs::{self, DirBuilder, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use crate::detect::{classify_exports, Class, Classification};
use crate::{adapters, frei0r, ladspa};

/// The environment variable naming the cache directory (tests give each run its own).
pub const CACHE_DIR_ENV: &str = "WARD_CACHE_DIR";

/// The version of an entry's layout; raised whenever [`Entry`] or what its descriptions mean changes. The class
/// adapter's own bytes are part of the version too (see [`version`]), so a changed description format misses even
/// where this is forgotten.
const FORMAT: u32 = 1;

/// Mode of the directory and of each entry.
const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;

/// The largest entry read: more than any library's descriptions take (a LADSPA library of 4096 plugins of 4096
/// ports with long names would not fit, and no library comes near it).
const MAX_ENTRY: u64 = 64 << 20;
/// The most descriptions one entry may hold.
const MAX_DESCRIPTIONS: usize = 1 << 16;

/// What makes a file the same file: a replaced file has another inode (or, reusing one, another change time), and a
/// file changed in place another change time, which no process can set back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileIdentity {
    pub device: u64,
    pub inode: u64,
    pub size: u64,
    /// Last modification, in seconds and nanoseconds since the epoch.
    pub modified: (i64, i64),
    /// Last change of the file or its inode (ctime), likewise.
    pub changed: (i64, i64),
}

impl FileIdentity {
    /// The identity of the regular file `path` leads to (symbolic links followed, as the dynamic linker does).
    pub fn of(path: &Path) -> io::Result<FileIdentity> {
        let meta = fs::metadata(path)?;
        if !meta.file_type().is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
        }
        Ok(FileIdentity {
            device: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// The descriptions of one library, as the class adapter wrote them in the describer: what the cache keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wire(pub(crate) Vec<Vec<u8>>);

/// What the cache gives back, checked as a describer's reading is.
#[derive(Debug, Clone, PartialEq)]
pub enum Described {
    Ladspa(Vec<Arc<ladspa::Descriptor>>),
    Frei0r(frei0r::PluginInfo),
}

/// A library found in the cache.
#[derive(Debug, Clone)]
pub struct Cached {
    pub class: Class,
    /// The class's entry points the library exports (what its proxy must export).
    pub entry_points: Vec<String>,
    pub described: Described,
}

/// One entry on disk.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    format: u32,
    /// [`version`] of the class's description format.
    version: String,
    identity: FileIdentity,
    /// [`Class::name`].
    class: String,
    entry_points: Vec<String>,
    /// Each description as the adapter wrote it, in hexadecimal.
    descriptions: Vec<String>,
}

/// Why the cache directory is not used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CacheRefused {
    /// Neither the environment variable, `XDG_CACHE_HOME` nor `HOME` names a place for it.
    #[error("no directory for it: none of {CACHE_DIR_ENV}, XDG_CACHE_HOME and HOME is set")]
    NoPlace,
    #[error("{dir}: cannot make the directory: {reason}")]
    Unmade { dir: PathBuf, reason: String },
    /// Someone else could have planted entries in it.
    #[error("{dir} is not a directory (a symbolic link is none) owned by uid {uid} and writable only by it")]
    NotPrivate { dir: PathBuf, uid: u32 },
}

/// The user's cache of descriptions. The directory is made and checked at first use.
#[derive(Debug)]
pub struct DescriptionCache {
    dir: Option<PathBuf>,
    ready: OnceLock<Result<(), CacheRefused>>,
}

impl DescriptionCache {
    /// The cache where the environment puts it (see the module's documentation).
    pub fn from_env() -> DescriptionCache {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let dir = var(CACHE_DIR_ENV)
            .or_else(|| var("XDG_CACHE_HOME").filter(|d| d.is_absolute()).map(|d| d.join("ward")))
            .or_else(|| var("HOME").map(|h| h.join(".cache").join("ward")));
        DescriptionCache { dir, ready: OnceLock::new() }
    }

    /// The cache in `dir`.
    pub fn at(dir: impl Into<PathBuf>) -> DescriptionCache {
        DescriptionCache { dir: Some(dir.into()), ready: OnceLock::new() }
    }

    /// Where it is (or would be).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Whether the directory can be used: made (mode 0700) if missing, and private to this user. Decided at the
    /// first call; the same answer after.
    pub fn usable(&self) -> Result<(), &CacheRefused> {
        self.ready.get_or_init(|| self.prepare()).as_ref().map(|_| ())
    }

    /// Whether entries may be read, without making the directory: one that is not there holds none (a host that
    /// opens no plugin library leaves no directory behind). One that is there is checked as [`Self::usable`]
    /// checks it.
    pub fn readable(&self) -> Result<bool, &CacheRefused> {
        let missing = || self.dir.as_deref().is_some_and(|dir| fs::symlink_metadata(dir).is_err());
        if self.ready.get().is_none() && missing() {
            return Ok(false);
        }
        self.usable().map(|()| true)
    }

    fn prepare(&self) -> Result<(), CacheRefused> {
        let dir = self.dir.as_deref().ok_or(CacheRefused::NoPlace)?;
        // Missing parents (`~/.cache` itself) are made private too, as the XDG specification asks.
        if let Err(e) = DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir) {
            return Err(CacheRefused::Unmade { dir: dir.to_path_buf(), reason: e.to_string() });
        }
        let uid = ward_embed::euid();
        match ward_embed::private_to(dir, uid) {
            Ok(true) => Ok(()),
            Ok(false) => Err(CacheRefused::NotPrivate { dir: dir.to_path_buf(), uid }),
            Err(e) => Err(CacheRefused::Unmade { dir: dir.to_path_buf(), reason: e.to_string() }),
        }
    }

    /// The entry file of the library the host opened as `path`.
    fn entry_path(&self, path: &Path) -> Option<PathBuf> {
        let dir = self.dir.as_deref()?;
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let mut hasher = std::hash::DefaultHasher::new();
        absolute.as_os_str().as_bytes().hash(&mut hasher);
        Some(dir.join(format!("{:016x}.json", hasher.finish())))
    }

    /// The library the host opened as `path`, whose file has `identity`, as the cache holds it; `None` for a miss:
    /// no usable cache or entry, or an entry that is not of this file, of this version, or believable.
    pub fn get(&self, path: &Path, identity: &FileIdentity) -> Option<Cached> {
        if !matches!(self.readable(), Ok(true)) {
            return None;
        }
        let file = fs::File::open(self.entry_path(path)?).ok()?;
        // Room for the whole entry as it is now, so that it is read in one call (growing from nothing took eight for
        // a small library); a file that grows meanwhile still stops at the limit.
        let len = file.metadata().ok()?.len();
        if len > MAX_ENTRY {
            return None;
        }
        let mut bytes = Vec::with_capacity(len as usize + 1);
        file.take(MAX_ENTRY + 1).read_to_end(&mut bytes).ok()?;
        if bytes.len() as u64 > MAX_ENTRY {
            return None;
        }
        let entry: Entry = serde_json::from_slice(&bytes).ok()?;
        let class = [Class::Ladspa, Class::Frei0r].into_iter().find(|c| c.name() == entry.class)?;
        if entry.format != FORMAT || &entry.identity != identity || entry.version != *version(class)? {
            return None;
        }
        // The entry points must be some of the class's, and make the file one of the class as `inspect` would.
        if !entry.entry_points.iter().all(|e| class.entry_points().contains(&e.as_str()))
            || classify_exports(&entry.entry_points) != Classification::Plugin(class)
            || entry.descriptions.len() > MAX_DESCRIPTIONS
        {
            return None;
        }
        let wire: Vec<Vec<u8>> = entry.descriptions.iter().map(|h| from_hex(h)).collect::<Option<_>>()?;
        let described = match class {
            Class::Ladspa => Described::Ladspa(ladspa::parse_described(&wire).ok()?),
            Class::Frei0r => match wire.as_slice() {
                [one] => Described::Frei0r(frei0r::PluginInfo::parse(one).ok()?),
                _ => return None,
            },
            Class::Lv2 => return None,
        };
        Some(Cached { class, entry_points: entry.entry_points, described })
    }

    /// Keep what a describer read (`wire`) of the library the host opened as `path`, a `class` library that exports
    /// `exports` (its entry points among them) and whose file had `identity` before and after it was described.
    pub fn put(
        &self,
        path: &Path,
        identity: &FileIdentity,
        class: Class,
        exports: &[String],
        wire: &Wire,
    ) -> Result<(), PutError> {
        self.usable().map_err(|e| PutError::Refused(e.clone()))?;
        let version = version(class).ok_or(PutError::NoClass(class.name()))?;
        let entry_points: Vec<String> =
            exports.iter().filter(|e| class.entry_points().contains(&e.as_str())).cloned().collect();
        let entry = Entry {
            format: FORMAT,
            version: version.clone(),
            identity: *identity,
            class: class.name().to_string(),
            entry_points,
            descriptions: wire.0.iter().map(|d| to_hex(d)).collect(),
        };
        let bytes = serde_json::to_vec(&entry).map_err(|e| PutError::Write(io::Error::other(e)))?;
        let dest = self.entry_path(path).ok_or(PutError::Refused(CacheRefused::NoPlace))?;
        write_atomically(&dest, &bytes).map_err(PutError::Write)
    }
}

/// Why an entry was not written.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error("the cache is not used: {0}")]
    Refused(CacheRefused),
    #[error("the {0} class keeps no descriptions in the cache")]
    NoClass(&'static str),
    #[error("{0}")]
    Write(io::Error),
}

/// The version of `class`'s description format: [`FORMAT`], ward's version and a hash of the class adapter that
/// writes the descriptions (a rebuilt adapter may write them otherwise); `None` for a class the cache does not keep.
fn version(class: Class) -> Option<&'static String> {
    static LADSPA: OnceLock<String> = OnceLock::new();
    static FREI0R: OnceLock<String> = OnceLock::new();
    let (cell, adapter) = match class {
        Class::Ladspa => (&LADSPA, ladspa::ADAPTER),
        Class::Frei0r => (&FREI0R, frei0r::ADAPTER),
        Class::Lv2 => return None,
    };
    Some(cell.get_or_init(|| {
        let mut hasher = std::hash::DefaultHasher::new();
        adapters::bytes_of(adapter).hash(&mut hasher);
        format!("{FORMAT}-{}-{:016x}", env!("CARGO_PKG_VERSION"), hasher.finish())
    }))
}

/// `bytes` written to `dest` whole: under a temporary name in the same directory (created anew, mode 0600), then
/// renamed over `dest`, so a reader sees the old entry or the new one, never a part. Not synced: an entry torn by a
/// crash of the machine is a miss, described again.
fn write_atomically(dest: &Path, bytes: &[u8]) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp =
        dest.with_file_name(format!(".{name}.{}-{}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let written = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(&tmp)?;
        file.write_all(bytes)?;
        drop(file);
        fs::rename(&tmp, dest)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks_exact(2).map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_is_no_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&bytes)), Some(bytes));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("+1"), None);
        assert_eq!(from_hex(""), Some(Vec::new()));
    }
}
