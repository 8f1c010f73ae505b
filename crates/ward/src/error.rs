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
    #[error("restart_from of extension {extension} names {path}, which cannot be loaded: {reason}; fix the policy")]
    RestartImage { extension: String, path: PathBuf, reason: String },
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
    #[error("extension {domain} is disabled {why} (last fault: {last}); calls fail fast")]
    Disabled { domain: String, restarts: u32, last: String, why: String },
    /// A real-time call found its domain being recovered (or held by another thread's call past its period): it was
    /// not made, and nothing waited.
    #[error("extension {domain} is being recovered; the real-time call was not made")]
    Recovering { domain: String },
    /// A real-time call passed its real-time deadline (`deadline`) and was handed to another thread: its caller
    /// gets this at once, while the call goes on in the domain within the function's normal deadline. Its outputs
    /// are dropped; returning in time, it is logged as made and nothing failed; else it is a hang, recovered as one.
    #[error(
        "real-time call {call} of extension {domain} missed its deadline of {:.2} ms: it goes on late, its results \
         dropped",
        .deadline.as_secs_f64() * 1e3
    )]
    Late { domain: String, call: String, deadline: std::time::Duration },
    /// A real-time call found an earlier one ([`Error::Late`]) still running late in its domain: it was not made,
    /// and nothing waited.
    #[error("extension {domain} is still running a late real-time call; this one was not made")]
    Busy { domain: String },
    #[error("isolation `{0}` is not available: {1}")]
    IsolationUnavailable(String, String),
    /// A `library_fault` policy for an isolation kind that cannot carry one.
    #[error(
        "extension {extension} has a library_fault, which needs a domain (a library preloaded into its domain \
         process, or an mpk domain's runtime, injects it), but it would run with isolation `{isolation}`; use \
         isolation \"process\" or \"mpk\", or remove library_fault"
    )]
    LibraryFaultNeedsDomain { extension: String, isolation: crate::policy::Isolation },
    /// `poison` for an extension that would not run in a process domain.
    #[error(
        "extension {extension} has poison = true, which needs a process domain (the domain calls it through the          poisoning trampoline; in the host's own process a fault it turns up would be the host's), but it would run          with isolation `{isolation}`; use isolation \"process\" or remove poison"
    )]
    PoisonNeedsProcess { extension: String, isolation: crate::policy::Isolation },
    /// A `library_fault` policy for an extension that shares its group's domain.
    #[error(
        "extension {extension} has a library_fault but shares the domain of group {group}; a library fault needs \
         the extension in a domain of its own: remove its group or the library_fault"
    )]
    LibraryFaultInGroup { extension: String, group: String },
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
