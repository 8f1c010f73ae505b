//! Backends: how a domain is isolated and how a call reaches it. The core (policy, recovery, tracker, shadow log)
//! drives a backend through [`Backend`]; a backend knows nothing of extension classes.

pub(crate) mod mpk;
#[allow(unsafe_code)]
pub(crate) mod none;
pub(crate) use none::NativeEntry;
pub(crate) mod process;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use ward_xpc::Deadline;

use ward_abi::{RegArgs, RegRet};

use crate::call::RetType;
use crate::events::RestartVia;
use crate::fault::FaultKind;
use crate::tracker::{RecordId, Tracker};

/// One extension of a domain, as the backend loads it.
#[derive(Debug, Clone)]
pub(crate) struct ExtensionSpec {
    pub path: PathBuf,
    /// Called with no arguments after loading; nonzero fails the load.
    pub init: Option<String>,
    /// Call its functions poisoned (policy `poison`; process domains only).
    pub poison: bool,
    /// The library it opens itself (a class adapter's plugin). A backend that cannot let it call the host's
    /// dynamic linker (mpk) loads the library with it; the others ignore this.
    pub opens: Option<PathBuf>,
    /// A run-time library fault for the calls of the library it opens, else its own (policy `library_fault`).
    /// A backend whose domain runtime binds the C library's allocation and copy functions (mpk) injects it; a
    /// process domain gets it from its preloaded library instead.
    pub library_fault: Option<crate::libfault::LibraryFault>,
}

/// Why a backend operation did not complete.
#[derive(Debug)]
pub(crate) enum BackendError {
    /// The domain failed; the core recovers it.
    Fault(FaultKind),
    /// The request was wrong (unknown symbol, arguments that do not fit); the domain is fine.
    Usage(String),
    /// The symbol does not exist in that extension.
    UnknownSymbol,
    /// The call's deadline passed; the core stops the domain and reports a timeout.
    TimedOut,
    /// The call was ended because the domain was closed under it: another thread's call failed in it (an mpk
    /// domain that several threads run in). The domain is being, or has been, recovered; the core treats the call
    /// as one a nested recovery overtook.
    Closed,
}

/// A value on its way into a domain, already translated by the core (handles to objects, callbacks to slots).
/// Outputs carry the host's buffer: a backend that runs the function on the host's thread may lend it as it is,
/// one that copies writes the results back into it.
#[derive(Debug)]
pub(crate) enum WireValue<'a> {
    Int(u64),
    F64(f64),
    F32(f32),
    In(&'a [u8]),
    Out(&'a mut [u8]),
    InOut(&'a mut [u8]),
    /// Input the extension may write: lent writable, never copied back.
    Scratch(&'a [u8]),
    /// NUL-terminated bytes.
    Str(&'a [u8]),
    Callback(usize),
}

/// The host's output buffers among `args`, in argument order (one per `Out`/`InOut`).
pub(crate) fn outputs<'w, 'a: 'w>(args: &'w mut [WireValue<'a>]) -> impl Iterator<Item = &'w mut [u8]> + use<'w, 'a> {
    args.iter_mut().filter_map(|a| match a {
        WireValue::Out(b) | WireValue::InOut(b) => Some(&mut **b),
        _ => None,
    })
}

/// A resolved function: how the core calls it. Resolved once per incarnation and kept by the core.
#[derive(Clone)]
pub(crate) enum Callable {
    /// It runs on the calling host thread (`none`, `mpk`): the core calls it with its own state released.
    OnThread(Arc<dyn ThreadFunction>),
    /// It runs in the domain's process: the core drives the call through the backend's [`Ring`], by this id.
    Ring(u32),
}

impl std::fmt::Debug for Callable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Callable::OnThread(_) => f.write_str("Callable::OnThread"),
            Callable::Ring(id) => write!(f, "Callable::Ring({id})"),
        }
    }
}

/// Runs `call` with the core's state released (so a callback may call the domain again, and other threads may
/// call it meanwhile where the isolation allows); false when the domain was recovered meanwhile, so the call's
/// results mean nothing and must not be copied back.
pub(crate) type Unlocked<'r> = &'r mut dyn FnMut(&mut dyn FnMut()) -> bool;

/// A function of a domain that runs on the calling host thread.
pub(crate) trait ThreadFunction: Send + Sync {
    /// One call: place `args` where the function can use them, run it inside `unlocked`, and, when the call
    /// returned and still counts, write its outputs into the host's buffers (`WireValue::Out`/`InOut`).
    /// `deadline` bounds the function's own time where the backend can stop it.
    fn call(
        &self,
        args: &mut [WireValue<'_>],
        deadline: Duration,
        unlocked: Unlocked<'_>,
    ) -> Result<RegRet, BackendError>;

    /// The function as the host may call it itself, with nothing between: only where the backend has nothing to
    /// do around a call (no boundary to cross, no buffer to place, no deadline it could keep).
    fn native_entry(&self) -> Option<NativeEntry> {
        None
    }
}

/// What happened next in a call.
#[derive(Debug)]
pub(crate) enum Step {
    /// The call returned.
    Done(RegRet),
    /// The extension called back into the host; answer with [`Ring::answer_callback`].
    Callback { token: u64, slot: usize, regs: RegArgs },
}

/// A buffer lent to a domain for one call; its tracker record releases it if the call never finishes.
#[derive(Debug)]
pub(crate) struct Loan {
    /// The tracker record of the pool buffer; None for a host buffer lent in place (nothing to free).
    pub record: Option<RecordId>,
    pub pool: u32,
    pub rich: ward_xpc::RichPtr,
    /// An output: copied back into the host when the call returns, unless it was lent in place.
    pub output: bool,
}

/// The buffers one call lent.
pub(crate) type Loans = smallvec::SmallVec<[Loan; 4]>;

/// A call started in a domain: its id and what it borrowed.
#[derive(Debug)]
pub(crate) struct Frame {
    pub id: u64,
    /// Inline for the usual few buffers of a call: a call allocates nothing.
    pub loans: Loans,
}

/// How a running domain took one more extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Added {
    /// Loaded into the running incarnation: its state and everything else is as it was.
    InPlace,
    /// Listed, but the running incarnation does not have it: restart it (and replay).
    NeedsRestart,
}

/// Why a running domain refused one more extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub reason: String,
    /// The running incarnation was lost trying (it died or hung loading it): restart it, without the extension.
    pub restart: bool,
}

/// The calls of a domain in another process, through its rings: a call is started, its steps (callbacks, the
/// return) awaited and answered one by one by the core, which serves callbacks with its state released.
pub(crate) trait Ring {
    /// Start a call: marshal the arguments into the domain and send it. `in_place`: buffers may be lent where they
    /// lie in the host's memory (the arena) instead of copied; false for a call that may outlive its caller's
    /// buffers (a real-time call handed to another thread when late), which then borrows none of them.
    fn begin(
        &mut self,
        tracker: &mut Tracker,
        func: u32,
        args: &[WireValue<'_>],
        ret: RetType,
        in_place: bool,
    ) -> Result<Frame, BackendError>;

    /// Wait for the next step of the innermost call.
    fn wait(&mut self, frame: &Frame, deadline: &mut Deadline) -> Result<Step, BackendError>;

    /// Answer a callback of the innermost call.
    fn answer_callback(&mut self, token: u64, ret: RegRet) -> Result<(), BackendError>;

    /// Finish a call that returned: copy output buffers back (in argument order, one per `Out`/`InOut`), release
    /// what it lent.
    fn finish(&mut self, tracker: &mut Tracker, frame: Frame, outputs: &mut [&mut [u8]]);

    /// Abandon a call whose domain failed (its loans are released by the tracker).
    fn abandon(&mut self, frame: Frame);

    /// Queue a call with no reply awaited; `args` are scalars or small inputs carried in the record.
    fn defer(&mut self, func: u32, args: &[WireValue<'_>]) -> Result<(), BackendError>;

    /// Send queued deferred calls.
    fn flush(&mut self) -> Result<(), BackendError>;

    /// Check the domain answers within the deadline.
    fn ping(&mut self, deadline: &mut Deadline) -> Result<(), BackendError>;
}

/// Why a backend could not start an incarnation (load, spawn or initialise what it runs).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct StartError(Box<dyn std::error::Error + Send + Sync>);

impl StartError {
    pub(crate) fn new(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StartError {
        StartError(e.into())
    }
}

/// A backend's lifecycle: what every backend does for real. How its functions are called is in what
/// [`Backend::resolve`] gives.
pub(crate) trait Backend: Send {
    /// Resolve a symbol of extension `ext` (its index in load order) for the current incarnation.
    fn resolve(&mut self, ext: usize, symbol: &str) -> Result<Callable, BackendError>;

    /// The rings its calls go through, for a backend whose domain is another process ([`Callable::Ring`]).
    fn ring(&mut self) -> Option<&mut dyn Ring> {
        None
    }

    /// Stop the domain (it failed, or is being torn down) and wait until it is gone.
    fn stop(&mut self);

    /// Start a fresh incarnation with the extensions loaded and initialised. Descriptors and other per-incarnation
    /// resources are recorded in `tracker`.
    fn restart(&mut self, tracker: &mut Tracker) -> Result<RestartVia, StartError>;

    /// Load one more extension (a group gained a member). A backend that can load it into the running incarnation
    /// does, and says [`Added::InPlace`]; else it lists it for the next restart and says [`Added::NeedsRestart`]
    /// (the core restarts and replays). A refused extension is not listed.
    fn add_extension(&mut self, tracker: &mut Tracker, spec: ExtensionSpec) -> Result<Added, Refused>;

    /// Load extension `index` (in the order added) from `path` from the next restart on.
    fn replace_image(&mut self, index: usize, path: PathBuf);

    /// Load the library extension `index` opens (its [`ExtensionSpec::opens`], a class adapter's plugin) from
    /// `path` from the next restart on. Only a backend that loads that library itself needs to know; the others
    /// let the adapter open whatever path its (rewritten) calls name.
    fn replace_opened(&mut self, _index: usize, _path: PathBuf) {}

    /// The extensions it loads, in order (for a move to another backend).
    fn extensions(&self) -> Vec<ExtensionSpec>;

    /// The process id of the running incarnation, for a backend that has one.
    fn pid(&self) -> Option<i32> {
        None
    }

    /// Buffers lent in place (host memory the extension used directly, no copy) so far.
    fn lent_in_place(&self) -> u64 {
        0
    }

    /// The warm copies restarts come from (a process domain's zygote) that failed since the last ask, each with
    /// how: each was killed, and the next restart comes from a new one. The core reports them.
    fn take_zygote_failures(&mut self) -> Vec<FaultKind> {
        Vec::new()
    }
}
