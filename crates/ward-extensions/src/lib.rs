//! ward's built-in C test extensions.
//!
//! The build script compiles every `extensions/*.c` of the workspace into a shared object; this crate embeds them
//! ([`ALL`]) and writes them to disk on demand ([`extract_to`], [`extracted`], [`path_of`]) so that they can be
//! loaded like any other extension.
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

#![deny(unsafe_code)]

use std::io;
use std::path::{Path, PathBuf};

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
