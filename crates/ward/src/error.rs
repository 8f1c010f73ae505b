//! The library's errors.

use std::path::PathBuf;

use crate::fault::Fault;

/// Errors of loading, calling and configuring.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("extension {path} does not exist; check the path")]
    NotFound { path: PathBuf },
    #[error("{path} is not an ELF shared object ({reason}); ward loads .so files with a C ABI")]
    NotElf { path: PathBuf, reason: String },
    /// An ELF file that is no x86-64 shared object (32-bit, another processor, an executable, malformed).
    #[error("{path} cannot be used as an extension: {reason}")]
    Unusable { path: PathBuf, reason: String },
    #[error("cannot load {path}: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error(
        "symbol `{symbol}` not found in extension {extension}; check the name (it must be exported with C linkage)"
    )]
    UnknownSymbol { extension: String, symbol: String },
    #[error("bad arguments to {call}: {reason}")]
    BadArguments { call: String, reason: String },
    #[error("unknown handle {handle:#x} passed to {call}: pass a handle an earlier call returned")]
    UnknownHandle { call: String, handle: u64 },
    #[error("extension failed: {0}")]
    Fault(Fault),
    #[error("extension {domain} is disabled after {restarts} restarts (last fault: {last}); calls fail fast")]
    Disabled { domain: String, restarts: u32, last: String },
    #[error("isolation `{0}` is not available: {1}")]
    IsolationUnavailable(String, String),
    #[error("cannot find the ward-domain program ({0}); build it (cargo build -p ward-domain) or set WARD_DOMAIN to its path")]
    DomainProgramMissing(String),
    #[error("cannot start a domain for {domain}: {reason}")]
    Spawn { domain: String, reason: String },
    #[error("all {0} callback slots are in use")]
    TooManyCallbacks(usize),
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The fault behind this error, if it is one.
    pub fn fault(&self) -> Option<&Fault> {
        match self {
            Error::Fault(f) => Some(f),
            _ => None,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { context: context.into(), source }
    }
}
