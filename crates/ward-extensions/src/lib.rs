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

use std::io;
use std::path::{Path, PathBuf};

use ward_embed::{embedded, EmbeddedSet};

/// One built-in extension, embedded at build time.
pub type Builtin = ward_embed::Embedded;

/// Every built-in extension.
pub const ALL: &[Builtin] = &[
    embedded!("faulty", "deliberately faulty: every fault kind, armed or immediate"),
    embedded!("faulty_frei0r", "a frei0r filter that fails on command"),
    embedded!("faulty_ladspa", "LADSPA plugins that fail on command: crash, hang, overrun, NaN"),
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
