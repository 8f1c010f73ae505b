//! What can stop a campaign. Mistakes in what was asked ([`Error::is_bad_input`]) say what to do instead; the
//! others name what broke. A trial's outcome, however bad, is never an error: it is what the campaign measures.

use std::path::PathBuf;

use crate::config::RunMode;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "unknown fault type `{given}`; valid types: {}; or `all` (every code fault type) and `library` (every \
         library fault kind)",
        crate::trial_fault::TrialFault::names().join(", ")
    )]
    UnknownFaultType { given: String },
    #[error(
        "library fault kinds ({kinds}) cannot run under isolation `{mode}`: a library fault is injected by the \
         extension's domain (its process's preloaded library, or an mpk domain's runtime), and `{mode}` has none; \
         drop `{mode}` from --isolation, or the library kinds from --types"
    )]
    LibraryFaultNeedsDomain { kinds: String, mode: RunMode },
    #[error(
        "--poison cannot run under isolation `{mode}`: poisoned calls are made by the dispatcher of a domain \
         process; drop `{mode}` from --isolation, or --poison"
    )]
    PoisonNeedsProcess { mode: RunMode },
    #[error(
        "isolation mpk needs memory protection keys, and this machine has none (no PKU); drop mpk from --isolation"
    )]
    MpkUnavailable,
    #[error(
        "a host bound of {bound_s} s is too short for the default policy: a call it has not learned the deadline of \
         may run {ceiling_s} s before ward stops it, and its retry as long again, so such a hang would count as the \
         host's; give --host-timeout-s more than {} (30, say)",
        2 * ceiling_s
    )]
    HostBoundTooShort { bound_s: u64, ceiling_s: u64 },
    #[error("unknown isolation `{given}`; valid: mpk, process, none{hint}")]
    UnknownIsolation { given: String, hint: &'static str },
    #[error("unknown fault model `{given}`; valid: persistent, transient")]
    UnknownFaultModel { given: String },
    #[error("{what} lists nothing; give at least one value")]
    EmptyList { what: &'static str },
    #[error("no campaign workload for extension `{extension}`; extensions with one: {available}")]
    NoWorkload { extension: String, available: String },
    #[error("extension {extension} is given twice (extensions are named after their file); give each once")]
    DuplicateExtension { extension: String },
    #[error("extension {path} does not exist; give the path of an x86-64 ELF shared object or a built-in name")]
    ExtensionMissing { path: PathBuf },
    #[error("{path}: {source}")]
    Inject {
        path: PathBuf,
        #[source]
        source: ward_inject::InjectError,
    },
    #[error("cannot read the imported functions of {path}: {reason}")]
    Imports { path: PathBuf, reason: String },
    #[error("no eligible site in {extension} for any fault type asked ({types}); choose other types")]
    NothingToInject { extension: String, types: String },
    #[error(
        "{out} holds another campaign ({differences}); use another --out, or delete {out} to start this one afresh"
    )]
    OtherCampaign { out: PathBuf, differences: String },
    #[error("another ward campaign is running in {out}; wait for it, or use another --out")]
    Busy { out: PathBuf },
    #[error("{path} line {line} is not a trial record ({reason}); the directory is damaged: use another --out")]
    Damaged { path: PathBuf, line: usize, reason: String },
    #[error("the unmutated extension's output changed since this campaign started ({diff}); use another --out")]
    ReferenceChanged { diff: String },
    #[error("the reference run of the unmutated extension failed natively: {0}")]
    Reference(String),
    #[error(
        "the unmutated extension under ward (isolation {mode}) does not match its native output: {detail}; \
         every trial would be misjudged, so the campaign stops"
    )]
    Preflight { mode: RunMode, detail: String },
    #[error("a {mode} host could not set itself up: {message}")]
    HostSetup { mode: RunMode, message: String },
    #[error("cannot start a throwaway host: {0}")]
    Launch(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode {what} as JSON: {source}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot draw the chart: {0}")]
    Chart(String),
    #[error("a trial's library fault: {0}")]
    LibraryFault(#[from] ward::libfault::LibraryFaultError),
}

impl Error {
    /// A mistake in what the user asked for (the command line, or an `--out` that holds something else): the
    /// program exits with status 2 for these.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::UnknownFaultType { .. }
                | Error::LibraryFaultNeedsDomain { .. }
                | Error::PoisonNeedsProcess { .. }
                | Error::MpkUnavailable
                | Error::HostBoundTooShort { .. }
                | Error::Imports { .. }
                | Error::UnknownIsolation { .. }
                | Error::UnknownFaultModel { .. }
                | Error::EmptyList { .. }
                | Error::NoWorkload { .. }
                | Error::DuplicateExtension { .. }
                | Error::ExtensionMissing { .. }
                | Error::Inject { .. }
                | Error::NothingToInject { .. }
                | Error::OtherCampaign { .. }
                | Error::Damaged { .. }
                | Error::Busy { .. }
        )
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { context: context.into(), source }
    }
}
