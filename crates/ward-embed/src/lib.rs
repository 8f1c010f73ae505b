//! Shared objects compiled from C by a build script, embedded with `include_bytes!`, and written to a private
//! per-user directory when something needs them as files (dlopen needs a path).
//!
//! Used by the built-in test extensions, the class adapters and the preload proxies: each crate names its set with
//! a prefix and lists its members with [`embedded!`].

#![deny(unsafe_code)]

#[cfg(feature = "build")]
pub mod build;

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use ward_xpc::mix::Fnv1a;

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
    /// The private directory this process extracted the members into because the shared one was not safe to use
    /// (see [`EmbeddedSet::extracted`]); once there, it stays there.
    private: Mutex<Option<PathBuf>>,
    /// The shared directory as last found safe and complete, and when: a host that opens a hundred plugins in a
    /// scan checks it once, not once per plugin (a dozen system calls each).
    checked: Mutex<Option<(PathBuf, Instant)>>,
}

/// How long a shared directory found safe and complete is taken as it is without a new look. Short beside what
/// removes files from a temporary directory (cleaners that work by the day), long beside a host's scan.
const CHECKED_FOR: Duration = Duration::from_secs(10);

/// Mode of the extracted shared objects.
const FILE_MODE: u32 = 0o755;
/// Mode of the per-user directory.
const DIR_MODE: u32 = 0o700;

impl EmbeddedSet {
    pub const fn new(prefix: &'static str, members: &'static [Embedded]) -> EmbeddedSet {
        EmbeddedSet { prefix, members, hash: OnceLock::new(), private: Mutex::new(None), checked: Mutex::new(None) }
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
            let mut hash = Fnv1a::new();
            for member in self.members {
                hash.write(member.file_name.as_bytes());
                hash.write(&(member.bytes.len() as u64).to_le_bytes());
                hash.write(member.bytes);
            }
            hash.finish()
        })
    }

    /// The per-user extraction directory under [`std::env::temp_dir`], named
    /// `<prefix>-<uid>-<16 hex digits of a hash of all members>`. The members are extracted into it unless every
    /// file is already there with the right size; returns it.
    ///
    /// The directory is created with mode 0700. An existing one must be a real directory (not a symlink) owned by
    /// the current user and writable by nobody else: otherwise someone else could have planted shared objects in
    /// it, and nothing is taken from it. The members then go to a fresh directory of this process's own (created
    /// with mode 0700 by this call, so nobody else can have made it or written to it), which later calls return too.
    pub fn extracted(&self) -> io::Result<PathBuf> {
        self.extracted_under(&std::env::temp_dir(), Instant::now())
    }

    /// As [`EmbeddedSet::extracted`], under `base` instead of the temporary directory, at `now`.
    fn extracted_under(&self, base: &Path, now: Instant) -> io::Result<PathBuf> {
        let mut private = self.private.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dir) = private.as_ref() {
            return Ok(dir.clone());
        }
        let uid = euid();
        let shared = base.join(format!("{}-{uid}-{:016x}", self.prefix, self.content_hash()));
        let mut checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((dir, at)) = checked.as_ref() {
            if *dir == shared && now.saturating_duration_since(*at) < CHECKED_FOR {
                return Ok(shared);
            }
        }
        *checked = None;
        match DirBuilder::new().mode(DIR_MODE).create(&shared) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if private_to(&shared, uid)? {
            let dir = self.complete(&shared)?;
            *checked = Some((dir.clone(), now));
            return Ok(dir);
        }
        // Squatted: a directory nobody else can have touched, made now.
        let dir = self.fresh_private_dir(&shared, uid)?;
        let dir = self.extract_to(&dir)?;
        *private = Some(dir.clone());
        Ok(dir)
    }

    /// `dir`, with every member in it (extracted unless each is there with the right size).
    fn complete(&self, dir: &Path) -> io::Result<PathBuf> {
        let complete = self.members.iter().all(|b| {
            fs::symlink_metadata(dir.join(b.file_name))
                .is_ok_and(|m| m.file_type().is_file() && m.len() == b.bytes.len() as u64)
        });
        if complete {
            Ok(dir.to_path_buf())
        } else {
            self.extract_to(dir)
        }
    }

    /// A new directory beside `shared`, created by this call with mode 0700 (a name that exists already, whatever it
    /// is, is passed over) and checked to be private to `uid`.
    fn fresh_private_dir(&self, shared: &Path, uid: u32) -> io::Result<PathBuf> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        for _ in 0..64 {
            let mut name = shared.as_os_str().to_owned();
            name.push(format!("-{}-{stamp:x}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
            let dir = PathBuf::from(name);
            match DirBuilder::new().mode(DIR_MODE).create(&dir) {
                // mkdir does not follow a symlink in the last component: a made directory is a new one.
                Ok(()) if private_to(&dir, uid)? => return Ok(dir),
                Ok(()) => {
                    return Err(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        format!("{} was made with mode 0700 but is not private to uid {uid}", dir.display()),
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory owned by uid {uid} and writable only by it, and no private directory beside \
                 it could be made",
                shared.display()
            ),
        ))
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

/// Whether `dir` is a real directory (not a symlink) owned by `uid` and writable by nobody else: what a directory
/// must be before this user's processes take anything from it (the extraction directory here, ward's cache of
/// descriptions).
pub fn private_to(dir: &Path, uid: u32) -> io::Result<bool> {
    let meta = fs::symlink_metadata(dir)?;
    Ok(meta.file_type().is_dir() && meta.uid() == uid && meta.mode() & 0o022 == 0)
}

/// The effective user id of this process.
// The crate's one system call without a safe wrapper in its dependencies.
#[allow(unsafe_code)]
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMBERS: &[Embedded] =
        &[Embedded { name: "member", file_name: "member.so", description: "test bytes", bytes: b"the real member" }];

    /// A scratch base directory for one test, removed at the end.
    struct Base(PathBuf);

    impl Base {
        fn new(test: &str) -> Base {
            let dir = std::env::temp_dir().join(format!("ward-embed-test-{}-{test}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Base(dir)
        }
    }

    impl Drop for Base {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn shared_dir(set: &EmbeddedSet, base: &Path) -> PathBuf {
        base.join(format!("{}-{}-{:016x}", set.prefix, euid(), set.content_hash()))
    }

    /// What a squatter planted: a file with the member's name and size but other bytes.
    fn plant(dir: &Path) {
        fs::write(dir.join("member.so"), b"planted bytes!!").unwrap();
        assert_eq!(b"planted bytes!!".len(), MEMBERS[0].bytes.len());
    }

    /// The set extracted under `base` avoids the squatted shared directory: it gets a private one with the real
    /// member in it, and keeps it.
    fn avoids_the_shared_directory(set: &EmbeddedSet, base: &Path) {
        let shared = shared_dir(set, base);
        let dir = set.extracted_under(base, Instant::now()).unwrap();
        assert_ne!(dir, shared);
        let meta = fs::symlink_metadata(&dir).unwrap();
        assert!(meta.file_type().is_dir() && meta.uid() == euid() && meta.mode() & 0o077 == 0, "{meta:?}");
        assert_eq!(fs::read(dir.join("member.so")).unwrap(), MEMBERS[0].bytes);
        assert_eq!(set.extracted_under(base, Instant::now()).unwrap(), dir, "the private directory is kept");
    }

    #[test]
    fn an_unsquatted_directory_is_shared() {
        let base = Base::new("shared");
        let set = EmbeddedSet::new("t", MEMBERS);
        let dir = set.extracted_under(&base.0, Instant::now()).unwrap();
        assert_eq!(dir, shared_dir(&set, &base.0));
        assert_eq!(fs::read(dir.join("member.so")).unwrap(), MEMBERS[0].bytes);
        assert_eq!(fs::symlink_metadata(&dir).unwrap().mode() & 0o777, DIR_MODE);
    }

    #[test]
    fn a_shared_directory_is_looked_at_again_only_after_a_while() {
        let base = Base::new("checked");
        let set = EmbeddedSet::new("t", MEMBERS);
        let start = Instant::now();
        let dir = set.extracted_under(&base.0, start).unwrap();
        let member = dir.join("member.so");
        fs::remove_file(&member).unwrap();
        assert_eq!(set.extracted_under(&base.0, start + CHECKED_FOR / 2).unwrap(), dir);
        assert!(!member.exists(), "within the while, the directory is taken as it was found");
        assert_eq!(set.extracted_under(&base.0, start + CHECKED_FOR).unwrap(), dir);
        assert_eq!(fs::read(&member).unwrap(), MEMBERS[0].bytes, "after it, a missing member is extracted again");
    }

    #[test]
    fn a_symlinked_directory_is_not_used() {
        let base = Base::new("symlink");
        let set = EmbeddedSet::new("t", MEMBERS);
        let elsewhere = base.0.join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        plant(&elsewhere);
        std::os::unix::fs::symlink(&elsewhere, shared_dir(&set, &base.0)).unwrap();
        avoids_the_shared_directory(&set, &base.0);
        assert_eq!(fs::read(elsewhere.join("member.so")).unwrap(), b"planted bytes!!", "left alone");
    }

    #[test]
    fn a_directory_others_can_write_is_not_used() {
        let base = Base::new("writable");
        let set = EmbeddedSet::new("t", MEMBERS);
        let shared = shared_dir(&set, &base.0);
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        plant(&shared);
        avoids_the_shared_directory(&set, &base.0);
    }

    #[test]
    fn a_file_in_place_of_the_directory_is_not_used() {
        let base = Base::new("file");
        let set = EmbeddedSet::new("t", MEMBERS);
        fs::write(shared_dir(&set, &base.0), b"not a directory").unwrap();
        avoids_the_shared_directory(&set, &base.0);
    }

    #[test]
    fn a_directory_of_another_user_is_not_used() {
        let base = Base::new("owner");
        let set = EmbeddedSet::new("t", MEMBERS);
        let shared = shared_dir(&set, &base.0);
        fs::create_dir(&shared).unwrap();
        plant(&shared);
        if euid() == 0 {
            // Given away to nobody (65534): as root, the only way a test can make another user's directory.
            std::os::unix::fs::chown(&shared, Some(65534), Some(65534)).unwrap();
            avoids_the_shared_directory(&set, &base.0);
        } else {
            // Not root: this user's own directory, with the planted file of the right size, is used as it is (the
            // squatting cases are the others).
            assert_eq!(set.extracted_under(&base.0, Instant::now()).unwrap(), shared);
        }
    }
}
