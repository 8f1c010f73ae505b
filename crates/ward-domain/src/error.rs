//! Why the domain could not start, load or serve: each reaches the host as the text of an `error` line on the
//! control socket (or on standard error before there is one), so each says what it was doing.

use std::path::PathBuf;

use ward_xpc::{LayoutError, PoolError};

use crate::sandbox::SandboxError;

/// A command line the host would not write (`ward-domain` is started by the ward library only).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error("{flag} needs a value")]
    NeedsValue { flag: String },
    #[error("unknown mode `{mode}` (serve or zygote)")]
    UnknownMode { mode: String },
    #[error("--allow takes network, exec, fork or writes, got `{what}`")]
    UnknownAllowance { what: String },
    /// `--poison` or `--init` before any `--ext`.
    #[error("{flag} must follow an --ext")]
    BeforeExtension { flag: &'static str },
    #[error("unknown argument `{arg}`")]
    UnknownArgument { arg: String },
    #[error("missing {flag}")]
    Missing { flag: &'static str },
    #[error("no --ext given")]
    NoExtension,
    #[error("{flag} takes a number, got `{text}`")]
    NotANumber { flag: String, text: String },
}

/// An extension that would not load (the host's `load` request, or one named on the command line).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("extension path {} contains a NUL byte", path.display())]
    NulInPath { path: PathBuf },
    /// dlopen refused, in the dynamic linker's words.
    #[error("cannot load {}: {reason}", path.display())]
    Dlopen { path: PathBuf, reason: String },
    #[error("init function `{init}` not found in {}", path.display())]
    NoInit { init: String, path: PathBuf },
    #[error("init function `{init}` of {} returned {code}", path.display())]
    InitFailed { init: String, path: PathBuf, code: i64 },
    #[error("too many extensions")]
    TooMany,
}

/// What kept the domain from getting ready.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot join the domain's cgroup ({}): {source}", procs.display())]
    Cgroup { procs: PathBuf, source: std::io::Error },
    #[error("cannot open a pidfd of the domain: {0}")]
    Pidfd(std::io::Error),
    #[error("cannot map the shared region: {0}")]
    Region(LayoutError),
    #[error("cannot install fault handlers: {0}")]
    FaultHandlers(std::io::Error),
    #[error("bad pool geometry: {0}")]
    PoolGeometry(PoolError),
    #[error("cannot map the {which} pool: {source}")]
    Pool { which: &'static str, source: PoolError },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot apply resource limits: {0}")]
    Limits(std::io::Error),
}

/// Why a zygote's trial load of an extension, in a throwaway fork, did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum TrialLoadError {
    #[error("fork failed: {0}")]
    Fork(std::io::Error),
    #[error("loading it did not finish within {seconds} s")]
    TimedOut { seconds: u64 },
    #[error("it killed the process loading it ({ended})")]
    Killed { ended: String },
    /// The trial passed and the zygote's own load failed (dlopen's error, an init function's result).
    #[error(transparent)]
    Load(#[from] LoadError),
}
