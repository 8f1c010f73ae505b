//! ward's built-in C test extensions.
//!
//! The build script compiles every `extensions/*.c` of the workspace into a shared object; this crate embeds them
//! ([`ALL`]) and writes them to disk on demand ([`extract_to`], [`extracted`], [`path_of`]) so that they can be
//! loaded like any other extension. The LV2 plugins among them also come as LV2 bundles ([`LV2_BUNDLES`],
//! [`lv2_bundles`], [`lv2_bundle_of`]): a directory for `LV2_PATH` that lilv hosts (lv2apply, lv2bench, jalv,
//! ffmpeg's `lv2` filter) load natively.
//!
//! * `well` – well-behaved: arithmetic, buffers, callbacks, state.
//! * `faulty` – deliberately faulty: every fault kind, armed or immediate.
//! * `faulty_ladspa` – a LADSPA plugin library whose plugins fail on command (crash, hang, overrun, NaN).
//! * `faulty_frei0r` – a frei0r filter that fails on command.
//! * `crash_once_ladspa` – another LADSPA library (`WARD_CRASH_ONCE_LADSPA`, a path) with every call forwarded,
//!   which dereferences NULL once, at a block `WARD_CRASH_ONCE_AT_BLOCK` says: a build whose fault the good file
//!   (`restart_from`) does not have, for a real plugin crashed mid-stream.
//! * `faulty_mpk` – `faulty` without the kinds that need a process of their own, so an mpk domain can hold it.
//! * `calls` – work that is C library calls (allocations, copies), for run-time library faults.
//! * `calls_plugin` – `calls` without `calls_via` and its `dlopen`: the plugin a stand-in class adapter opens in
//!   an mpk domain, which lets an opened library look up nothing.
//! * `stale_ladspa` – a LADSPA plugin that reports the registers and stack it was not given (poisoned calls).
//! * `stale` – generic functions that return a register or stack slot they were not given (policy `poison`).
//! * `threads` – functions several host threads run in one domain at once: one waits there, others share its heap
//!   and a mutex, one crashes.
//! * `hostile` – generic functions that attack the machine (exec, fork, a loopback connection, a memfd, a file in
//!   /tmp, `PTRACE_TRACEME`): what a process domain's sandbox must refuse.
//! * `hostile_ladspa` – a LADSPA plugin (an identity) that attacks its host, its sibling domains and the machine on
//!   command: the hostile-plugin battery of `ward run`.
//! * `overread` – generic functions that read past their input (the sum of the bytes there) or write past their
//!   output: what must read zeros (a little past an input) or fault.
//! * `resources` – generic functions that take more than a process domain's cgroup allows (anonymous memory, a
//!   memfd, a file in /dev/shm, forks) or burn CPU in a thread between calls.
//! * `bad_ladspa_*` – LADSPA libraries broken before any plugin call, one way each: a constructor that crashes
//!   (`ctor_crash`) or hangs (`ctor_hang`), a descriptor that is a wild pointer (`wild`), claims a billion ports
//!   (`ports`), has NULL port arrays (`null_ports`) or an unterminated name (`unterminated`). Never load them
//!   natively: they kill or hang whoever does.
//!
//! LV2 plugins, each a bundle `<name>.lv2` (Turtle in `extensions/lv2/`), URIs under `urn:ward:lv2:`, mono float
//! audio, deterministic; ports, state layouts and fault rules are in each C file's opening comment:
//!
//! * `lv2_amp` – `urn:ward:lv2:amp`: out = in × `gain` (default 0.5), control output `peak`; needs nothing.
//! * `lv2_delay` – `urn:ward:lv2:delay`: a 0.25 s feedback delay (feedback 0.6, `mix`) with a block counter and
//!   `state:interface` (the line and its position as an atom:Chunk, the counter as an atom:Int); needs urid:map.
//! * `lv2_synth` – `urn:ward:lv2:synth`: an instrument, a sine per held MIDI note, event-accurate, with an atom
//!   output that notifies the count of held notes; needs urid:map.
//! * `lv2_worker` – `urn:ward:lv2:worker`: out = in × a gain its `work` computes every 16 blocks; needs
//!   worker:schedule and urid:map, logs once at instantiate through log:log where offered.
//! * `lv2_options` – `urn:ward:lv2:options`: out = in × a gain got and set through `options:interface`, a file
//!   path saved and restored through `state:mapPath`, a scratch path from `state:makePath`; needs urid:map, logs
//!   once at instantiate through log:log where offered.
//! * `lv2_counter` – `urn:ward:lv2:counter`: out = in + a ramp of the samples processed so far, with no
//!   `state:interface`.
//! * `lv2_gate` – `urn:ward:lv2:gate`: out = in + the sum of every block's first input sample so far; a block run
//!   with control `wait` set waits until its host writes to the FIFO `gate` in its bundle directory (a test makes
//!   a bundle directory of its own with one), so a block can be made late on purpose; without that file it never
//!   waits.
//! * `lv2_faulty` – `urn:ward:lv2:faulty#crash`, `#hang`, `#abort`, `#atom-overrun`, `#atom-malformed`,
//!   `#work-crash`, `#save-crash`: identities that fail at block `at_block` (default 10), one way each. They kill,
//!   hang or corrupt whoever loads them natively.

#![deny(unsafe_code)]

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use ward_embed::{embedded, EmbeddedSet};

/// One built-in extension, embedded at build time.
pub type Builtin = ward_embed::Embedded;

/// Every built-in extension.
pub const ALL: &[Builtin] = &[
    embedded!("bad_ladspa_ctor_crash", "a LADSPA library whose constructor dereferences NULL"),
    embedded!("bad_ladspa_ctor_hang", "a LADSPA library whose constructor never returns"),
    embedded!("bad_ladspa_null_ports", "a LADSPA descriptor with NULL port arrays"),
    embedded!("bad_ladspa_ports", "a LADSPA descriptor claiming a billion ports"),
    embedded!("bad_ladspa_unterminated", "a LADSPA descriptor whose name has no terminating NUL"),
    embedded!("bad_ladspa_wild", "a LADSPA library whose descriptor is a wild pointer"),
    embedded!("crash_once_ladspa", "another LADSPA library (WARD_CRASH_ONCE_LADSPA) that crashes once, at a block"),
    embedded!("faulty", "deliberately faulty: every fault kind, armed or immediate"),
    embedded!("faulty_frei0r", "a frei0r filter that fails on command"),
    embedded!(
        "faulty_mpk",
        "faulty without the process-only kinds (descriptors, SIGKILL, ring attacks): mpk can hold it"
    ),
    embedded!("faulty_ladspa", "LADSPA plugins that fail on command: crash, hang, overrun, NaN"),
    embedded!("hostile", "attacks on the machine (exec, fork, loopback connect, memfd, /tmp, ptrace): for sandboxes"),
    embedded!("hostile_ladspa", "a LADSPA plugin that attacks its host, its sibling domains and the machine"),
    embedded!("overread", "reads past its input or writes past its output: zeros to read, or a fault"),
    embedded!("resources", "takes more than a domain's limits allow: memory, shared memory, processes, idle CPU"),
    embedded!("calls", "C library calls (allocations, copies) for run-time library faults"),
    embedded!("calls_plugin", "calls without its dlopen: a plugin a stand-in adapter opens, which mpk can hold"),
    embedded!("stale_ladspa", "a LADSPA plugin that reports the registers and stack it was not given"),
    embedded!("stale", "functions that return a register or stack slot they were not given"),
    embedded!("threads", "for several threads in one domain at once: a wait, a shared count under a mutex, a crash"),
    embedded!("well", "well-behaved: arithmetic, buffers, callbacks, state"),
    embedded!("lv2_amp", "LV2 urn:ward:lv2:amp: out = in * gain, with a peak output"),
    embedded!("lv2_counter", "LV2 urn:ward:lv2:counter: out = in + a ramp of the samples so far, no state interface"),
    embedded!("lv2_delay", "LV2 urn:ward:lv2:delay: a feedback delay with a long tail and state:interface"),
    embedded!("lv2_faulty", "LV2 urn:ward:lv2:faulty#...: identities that crash, hang, abort or break atoms or work"),
    embedded!("lv2_gate", "LV2 urn:ward:lv2:gate: out = in + a running sum; a block waits for its bundle's gate FIFO"),
    embedded!("lv2_options", "LV2 urn:ward:lv2:options: a gain set through options:interface, a path saved by mapPath"),
    embedded!("lv2_synth", "LV2 urn:ward:lv2:synth: an instrument, a sine per held MIDI note, with notifications"),
    embedded!("lv2_worker", "LV2 urn:ward:lv2:worker: a gain computed by its worker every 16 blocks"),
];

static SET: EmbeddedSet = EmbeddedSet::new("ward-extensions", ALL);

/// The built-in extension called `name` (its file stem), if any.
pub fn get(name: &str) -> Option<&'static Builtin> {
    SET.get(name)
}

/// Writes every builtin into `dir` (created if missing), each atomically; returns `dir`.
pub fn extract_to(dir: &Path) -> io::Result<PathBuf> {
    SET.extract_to(dir)
}

/// The per-user extraction directory, with every builtin in it (see [`EmbeddedSet::extracted`]).
pub fn extracted() -> io::Result<PathBuf> {
    SET.extracted()
}

/// The path of the extracted builtin called `name`; a `NotFound` error naming it if there is no such builtin.
pub fn path_of(name: &str) -> io::Result<PathBuf> {
    SET.path_of(name)
}

/// One LV2 bundle of the built-in plugins: the Turtle files of `extensions/lv2/<name>.lv2/`, embedded; its binary
/// is the builtin called `name` (the manifest names it `<name>.so`).
#[derive(Debug)]
pub struct Lv2Bundle {
    /// The bundle's directory name without `.lv2`, and its binary's builtin, e.g. `"lv2_amp"`.
    pub name: &'static str,
    /// The Turtle files, `manifest.ttl` among them: (file name, bytes), sorted by name.
    pub turtle: &'static [(&'static str, &'static [u8])],
}

include!(concat!(env!("OUT_DIR"), "/lv2_bundles.rs"));

/// Mode of a bundle's binary: loadable.
const LV2_BINARY_MODE: u32 = 0o755;
/// Mode of a bundle's Turtle files: readable.
const LV2_TURTLE_MODE: u32 = 0o644;

/// The per-user directory holding every LV2 bundle of [`LV2_BUNDLES`] as `<name>.lv2/` (its Turtle files and its
/// binary): what `LV2_PATH` should name for a host to find the built-in LV2 plugins.
///
/// It lies inside [`extracted`] (a directory private to the user, see [`EmbeddedSet::extracted`]) and is named
/// `lv2-<16 hex digits of a hash of every bundle's files>`. It is made whole in a temporary directory beside it and
/// renamed into place, so a process sees either no directory or a complete one; concurrent callers agree on the
/// first that got there. One found incomplete (files removed or truncated since) is replaced the same way.
pub fn lv2_bundles() -> io::Result<PathBuf> {
    lv2_bundles_in(&extracted()?)
}

/// As [`lv2_bundles`], in `base` (a directory private to the user) instead of [`extracted`].
fn lv2_bundles_in(base: &Path) -> io::Result<PathBuf> {
    let dir = base.join(format!("lv2-{:016x}", lv2_content_hash()?));
    // A few rounds: another process may be replacing an incomplete directory at the same time.
    for _ in 0..8 {
        if lv2_complete(&dir)? {
            return Ok(dir);
        }
        let staged = lv2_stage(base)?;
        match fs::rename(&staged, &dir) {
            Ok(()) => return Ok(dir),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty | io::ErrorKind::NotADirectory
                ) =>
            {
                let _ = fs::remove_dir_all(&staged);
                if !lv2_complete(&dir)? {
                    // Incomplete: move it aside (whoever does so first wins) and try again.
                    let aside = base.join(format!(".lv2-old-{}-{}", std::process::id(), lv2_seq()));
                    if fs::rename(&dir, &aside).is_ok() {
                        let _ = fs::remove_dir_all(&aside);
                    }
                }
            }
            Err(e) => {
                let _ = fs::remove_dir_all(&staged);
                return Err(e);
            }
        }
    }
    Err(io::Error::other(format!("{} keeps being replaced by another process", dir.display())))
}

/// The directory of the built-in LV2 bundle `name` (e.g. `"lv2_amp"`, without `.lv2`) inside [`lv2_bundles`]; a
/// `NotFound` error naming it if there is no such bundle.
pub fn lv2_bundle_of(name: &str) -> io::Result<PathBuf> {
    let bundle = LV2_BUNDLES.iter().find(|b| b.name == name).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("no LV2 bundle named `{name}` in ward-extensions"))
    })?;
    Ok(lv2_bundles()?.join(format!("{}.lv2", bundle.name)))
}

/// The binary of `bundle`: its builtin's bytes.
fn lv2_binary(bundle: &Lv2Bundle) -> io::Result<&'static [u8]> {
    get(bundle.name).map(|b| b.bytes).ok_or_else(|| {
        io::Error::new(io::ErrorKind::NotFound, format!("LV2 bundle `{}` has no builtin binary", bundle.name))
    })
}

/// One file of a bundle directory.
struct Lv2File {
    bundle: &'static str,
    name: &'static str,
    bytes: &'static [u8],
    mode: u32,
}

/// Every file of every bundle: its Turtle, then its binary.
fn lv2_files() -> io::Result<Vec<Lv2File>> {
    let mut files = Vec::new();
    for bundle in LV2_BUNDLES {
        for (name, bytes) in bundle.turtle {
            files.push(Lv2File { bundle: bundle.name, name, bytes, mode: LV2_TURTLE_MODE });
        }
        let name = get(bundle.name).map(|b| b.file_name).unwrap_or_default();
        files.push(Lv2File { bundle: bundle.name, name, bytes: lv2_binary(bundle)?, mode: LV2_BINARY_MODE });
    }
    Ok(files)
}

/// FNV-1a (64 bit) over every bundle's file names and bytes.
fn lv2_content_hash() -> io::Result<u64> {
    let mut hash = ward_xpc::mix::Fnv1a::new();
    for file in lv2_files()? {
        for part in [file.bundle.as_bytes(), file.name.as_bytes(), file.bytes] {
            hash.write(&(part.len() as u64).to_le_bytes());
            hash.write(part);
        }
    }
    Ok(hash.finish())
}

/// Whether `dir` is a real directory holding every bundle file as a regular file of the right size.
fn lv2_complete(dir: &Path) -> io::Result<bool> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_dir() => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    Ok(lv2_files()?.into_iter().all(|file| {
        fs::symlink_metadata(dir.join(format!("{}.lv2", file.bundle)).join(file.name))
            .is_ok_and(|m| m.file_type().is_file() && m.len() == file.bytes.len() as u64)
    }))
}

fn lv2_seq() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// A new directory in `base` holding every bundle, written and synced; removed again if writing fails.
fn lv2_stage(base: &Path) -> io::Result<PathBuf> {
    let staged = base.join(format!(".lv2-staged-{}-{}", std::process::id(), lv2_seq()));
    DirBuilder::new().mode(0o700).create(&staged)?;
    let result = (|| {
        for bundle in LV2_BUNDLES {
            DirBuilder::new().mode(0o755).create(staged.join(format!("{}.lv2", bundle.name)))?;
        }
        for file in lv2_files()? {
            let path = staged.join(format!("{}.lv2", file.bundle)).join(file.name);
            let mut written = OpenOptions::new().write(true).create_new(true).mode(file.mode).open(&path)?;
            written.write_all(file.bytes)?;
            // The umask may have removed bits.
            written.set_permissions(fs::Permissions::from_mode(file.mode))?;
            written.sync_all()?;
        }
        // Readable by the user's other processes (the base directory is private to the user anyway).
        fs::set_permissions(&staged, fs::Permissions::from_mode(0o755))
    })();
    match result {
        Ok(()) => Ok(staged),
        Err(e) => {
            let _ = fs::remove_dir_all(&staged);
            Err(e)
        }
    }
}

/// Writes a copy of the shared object `src` to `dst` whose function `function` (a dynamic or a static symbol) starts
/// with `ud2`: the copy dies of SIGILL the moment the function is called, and nowhere else. Tests use it as a
/// broken build of an extension whose good build is `src`.
pub fn copy_with_trap(src: &Path, function: &str, dst: &Path) -> io::Result<()> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {what}", src.display()));
    let mut bytes = std::fs::read(src)?;
    let offset = {
        let file = object::File::parse(&*bytes).map_err(|e| invalid(e.to_string()))?;
        let symbol = file
            .dynamic_symbols()
            .chain(file.symbols())
            .find(|s| s.name() == Ok(function) && s.kind() == object::SymbolKind::Text)
            .ok_or_else(|| invalid(format!("no function {function}")))?;
        let section = symbol
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .ok_or_else(|| invalid(format!("{function} is in no section")))?;
        let (start, size) = section.file_range().ok_or_else(|| invalid(format!("{function} has no file bytes")))?;
        let within = symbol.address() - section.address();
        if within + 2 > size {
            return Err(invalid(format!("{function} lies outside its section")));
        }
        (start + within) as usize
    };
    bytes[offset..offset + 2].copy_from_slice(&[0x0f, 0x0b]);
    std::fs::write(dst, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch base directory for one test, removed at the end.
    struct Base(PathBuf);

    impl Base {
        fn new(test: &str) -> Base {
            let dir = std::env::temp_dir().join(format!("ward-extensions-test-{}-{test}", std::process::id()));
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

    fn assert_whole(dir: &Path) {
        for bundle in LV2_BUNDLES {
            let path = dir.join(format!("{}.lv2", bundle.name));
            let binary = get(bundle.name).unwrap();
            assert_eq!(fs::read(path.join(binary.file_name)).unwrap(), binary.bytes, "{}", bundle.name);
            for (name, bytes) in bundle.turtle {
                assert_eq!(fs::read(path.join(name)).unwrap(), *bytes, "{}/{name}", bundle.name);
            }
        }
    }

    #[test]
    fn every_bundle_has_a_builtin_binary_and_a_manifest() {
        assert!(!LV2_BUNDLES.is_empty());
        for bundle in LV2_BUNDLES {
            assert!(get(bundle.name).is_some(), "{}", bundle.name);
            assert!(bundle.turtle.iter().any(|(name, _)| *name == "manifest.ttl"), "{}", bundle.name);
        }
    }

    #[test]
    fn concurrent_callers_get_one_whole_directory() {
        let base = Base::new("lv2-concurrent");
        let dirs: Vec<PathBuf> = std::thread::scope(|scope| {
            let callers: Vec<_> = (0..4).map(|_| scope.spawn(|| lv2_bundles_in(&base.0).unwrap())).collect();
            callers.into_iter().map(|c| c.join().unwrap()).collect()
        });
        assert!(dirs.iter().all(|d| *d == dirs[0]), "{dirs:?}");
        assert_whole(&dirs[0]);
        // Nothing staged is left behind: the base holds the bundle directory only.
        let entries: Vec<_> = fs::read_dir(&base.0).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(entries, [dirs[0].clone()]);
    }

    #[test]
    fn a_directory_missing_a_file_is_made_whole_again() {
        let base = Base::new("lv2-repair");
        let dir = lv2_bundles_in(&base.0).unwrap();
        let binary = dir.join("lv2_amp.lv2/lv2_amp.so");
        fs::write(&binary, b"").unwrap();
        fs::remove_file(dir.join("lv2_delay.lv2/manifest.ttl")).unwrap();
        assert_eq!(lv2_bundles_in(&base.0).unwrap(), dir);
        assert_whole(&dir);
    }
}
