//! A domain and its recovery manager: the call path (translate, send, serve callbacks, copy back), and what
//! happens when the domain fails (DESIGN.md §4): classify, stop, release, restart, replay, retry or fail, within
//! the policy's restart limits.
//!
//! One domain may hold several extensions (a group). Calls into a domain are serialised by a re-entrant lock: the
//! thread inside a call may call the domain again from a callback (nested calls), other threads wait their turn
//! and, if the domain fails meanwhile, find it already recovered. A domain behind a gate on the host's own threads
//! (mpk) is the exception: the lock is let go while its function runs, so several threads can be in it at once,
//! as in a process; a thread whose call fails recovers the domain with the lock held, which first ends the other
//! threads' calls in it (they see [`Outcome::Stale`] and are retried or fail as the policy says).
//!
//! Each call's deadline is the policy's `deadline_ms` when it sets one, else learned from the function's recent calls
//! (`learn`); a function that fails again after each recovery, `max_failures_in_row` times, disables the domain
//! at once (`recovery`).
//!
//! A thread waiting for its turn while the holder is out in a host callback waits at most its deadline for that
//! callback to return: a callback that waits for a call into the same domain from another thread would otherwise
//! never return, and the host would hang with no fault (see [`Domain::lock_for`]).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use parking_lot::{ReentrantMutex, ReentrantMutexGuard};
use smallvec::SmallVec;
use ward_xpc::Deadline;

mod learn;
mod plain;
mod realtime;
mod recovery;

pub(crate) use plain::PlainFunction;

use crate::backend::{
    self, Added, Backend, BackendError, Callable, ExtensionSpec, StartError, Step, ThreadFunction, WireValue,
};
use crate::call::{Arg, RetType, Value};
use crate::error::Error;
use crate::events::{Disablement, Event, EventBus};
use crate::fault::{Fault, FaultKind};
use crate::policy::{ExtensionPolicy, FunctionPolicy, OnFault};
use crate::shadow::{HandleMap, HistoryBounds, Kept, OwnedArg, ShadowEntry, ShadowLog};
use crate::tracker::{RecordId, ResourceKind, Tracker};

/// A call's arguments on their way into a domain.
type Wire<'a> = SmallVec<[WireValue<'a>; 6]>;

/// Counters of one domain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainStats {
    /// The running incarnation (1 is the first).
    pub incarnation: u64,
    /// Restarts so far.
    pub restarts: u64,
    /// Faults so far.
    pub faults: u64,
    /// Calls recorded in the shadow log.
    pub shadow_log: usize,
    /// Resources the tracker holds for the domain now.
    pub tracked: usize,
    /// Live instance handles.
    pub handles: usize,
    /// Set when the domain is disabled (past its restart limit).
    pub disabled: bool,
    /// Buffers lent in place so far: host memory the extension used directly, without a copy (a process domain
    /// given blocks of the host's arena, `ward_xpc::arena`).
    pub lent_in_place: u64,
    /// Heartbeats the domain answered in time.
    pub heartbeats: u64,
    /// Bytes the data calls kept for replay (history) hold.
    pub history_bytes: usize,
    /// What replaying the kept data calls is expected to take.
    pub history_replay: Duration,
}

struct Symbol {
    ext: usize,
    /// The symbol the backend resolves, and the key of the function's policy.
    name: Arc<str>,
    /// The call as faults, events and messages name it: what whoever resolved the function called it (a class
    /// adapter's function is named for the plugin's call it makes, `run`, not `ward_ladspa_run`), else the symbol.
    call: Arc<str>,
    /// How to call it in this incarnation; None until resolved.
    func: Option<Callable>,
    policy: FunctionPolicy,
    /// What its recent successful calls took, for its learned deadline.
    times: learn::CallTimes,
    /// Its calls that failed in a row, each again after the recovery from the one before: within
    /// [`learn::FAILS_AGAIN_WITHIN`] successful calls of it.
    failures_in_row: u32,
    /// Its successful calls since its last failure, while `failures_in_row` is not 0.
    ok_since_failure: u32,
    /// Its successful real-time calls in the incarnation `realtime_incarnation` (`realtime`: a new incarnation's
    /// first calls get the normal deadline).
    realtime_calls: u32,
    realtime_incarnation: u64,
}

/// Where an extension's code comes from, for `restart_from`.
struct CodeOrigin {
    /// The plugin a class adapter opens by this path in the domain (the adapter is the file loaded); `None`: the
    /// extension is the file loaded.
    opened: Option<PathBuf>,
    /// The extension now restarts from its policy's `restart_from`.
    switched: bool,
    /// Once switched, for an adapter: its plugin's path and the file to open in its place, both NUL-terminated.
    rewrite: Option<(CString, CString)>,
}

struct State {
    backend: Box<dyn Backend>,
    /// Per extension of the domain: its name and policy.
    extensions: Vec<(String, ExtensionPolicy)>,
    /// Per extension of the domain: where its code comes from.
    images: Vec<CodeOrigin>,
    symbols: Vec<Symbol>,
    /// Per extension: symbol name to index in `symbols`.
    symbol_index: Vec<HashMap<String, usize>>,
    tracker: Tracker,
    shadow: ShadowLog,
    handles: Arc<Mutex<HandleMap>>,
    /// Tracker records of live instances, by host handle.
    instances: HashMap<u64, RecordId>,
    /// Callback slots lent to this incarnation, with their tracker records.
    lent_callbacks: HashMap<usize, RecordId>,
    incarnation: u64,
    restart_times: VecDeque<Instant>,
    consecutive_faults: u32,
    stats: DomainStats,
    /// The fault that disabled the domain, and why it did.
    disabled: Option<(Fault, Disablement)>,
    /// True while recovery runs (a fault during replay must not recurse into another recovery).
    recovering: bool,
    /// Some image has a `rewrite` (checked first, so calls of other domains pay one load).
    rewriting: bool,
    /// A real-time call that missed its real-time deadline and goes on in the domain, waited for by the next thread
    /// that takes the domain (`realtime`).
    late: Option<Box<realtime::LateCall>>,
}

impl State {
    /// The plugin path an adapter extension's calls must have rewritten since its image switched (`restart_from`).
    fn rewrite_for(&self, sym: usize) -> Option<(CString, CString)> {
        if !self.rewriting {
            return None;
        }
        let ext = self.symbols.get(sym)?.ext;
        self.images.get(ext)?.rewrite.clone()
    }
}

/// Makes the backend a domain moves to when it escalates: from the extensions it loads.
pub(crate) type Escalation =
    Box<dyn Fn(Vec<ExtensionSpec>, &mut Tracker) -> Result<Box<dyn Backend>, StartError> + Send + Sync>;

pub(crate) struct Domain {
    pub name: String,
    /// The isolation it runs with now (an mpk domain may escalate to a process).
    isolation: Mutex<crate::policy::Isolation>,
    /// It runs with isolation `none`, for good: its calls are not let go of the domain's lock while they run (as
    /// an mpk domain's are), so they stay serialised as they always were.
    unisolated: bool,
    /// Calls may take the plain path (`plain`): the domain has no isolation and has never been recovered.
    plain_calls: AtomicBool,
    /// How to escalate, for a domain that may.
    escalation: Option<Escalation>,
    policy: ExtensionPolicy,
    events: Arc<EventBus>,
    lock: ReentrantMutex<RefCell<State>>,
    /// The state's handle map, shared: a plain call (`plain`) translates a handle without the domain's lock.
    handles: Arc<Mutex<HandleMap>>,
    /// Whether the thread holding `lock` is out in a host callback, for threads waiting for it.
    callbacks: CallbackWatch,
    /// The running incarnation (a copy of the state's), for a fault made without the lock.
    incarnation: AtomicU64,
    /// The domain is being recovered, on any thread (a real-time call's fault on a thread of its own, another
    /// thread's on that thread): real-time calls fail at once meanwhile (`realtime`).
    recovering_now: AtomicBool,
    /// The incarnation whose process was given the scheduling of a real-time caller (`realtime`; 0: none).
    realtime_scheduled: AtomicU64,
    /// That the domain could not be given a real-time caller's scheduling was said.
    realtime_said: AtomicBool,
    /// A real-time call is running late in the domain (`realtime`): real-time calls fail at once meanwhile, and
    /// the next thread to take the domain waits for that call first. Set with the domain held; cleared only with
    /// `deferred` held too ([`Domain::end_late`]), so nothing deferred while it is set is left behind.
    late_now: AtomicBool,
    /// The domain's counters and process id as they were when the late call was handed over: what
    /// [`Domain::stats`] and [`Domain::pid`] answer while the thread waiting for it holds the domain.
    late_view: Mutex<(DomainStats, Option<i32>)>,
    /// What was asked of the domain while a late call held it and needs no answer now: done when that call ends.
    deferred: Mutex<Vec<realtime::Deferred>>,
    /// The queue of the domain's thread that waits for its late calls, once it has one (`realtime`).
    late_waiter: Mutex<Option<mpsc::Sender<Arc<Domain>>>>,
}

/// Host callbacks the thread holding a domain's lock is in now: how deeply nested, and how many have begun or
/// ended so far (so a waiting thread can tell one long callback from a series of short ones). Only the holder
/// changes it.
#[derive(Default)]
struct CallbackWatch {
    depth: AtomicU32,
    changes: AtomicU64,
}

impl CallbackWatch {
    /// The holder goes out to a host callback until the guard drops.
    fn enter(&self) -> CallbackOut<'_> {
        self.depth.fetch_add(1, Ordering::AcqRel);
        self.changes.fetch_add(1, Ordering::AcqRel);
        CallbackOut(self)
    }

    /// The callback the holder is in now, as the count of changes when it began or returned last; None when it is
    /// in none.
    fn current(&self) -> Option<u64> {
        let changes = self.changes.load(Ordering::Acquire);
        (self.depth.load(Ordering::Acquire) > 0).then_some(changes)
    }
}

struct CallbackOut<'a>(&'a CallbackWatch);

impl Drop for CallbackOut<'_> {
    fn drop(&mut self) {
        self.0.depth.fetch_sub(1, Ordering::AcqRel);
        self.0.changes.fetch_add(1, Ordering::AcqRel);
    }
}

/// A thread waiting for a domain whose holder is in no callback looks again this often (the holder's own call
/// is bounded by its deadline, and its recovery by the restart limits).
const TURN_LOOK: Duration = Duration::from_millis(50);

/// How waiting for a ring call ended, short of its return.
enum RingEnd {
    /// The backend said so (a fault, the deadline passed, the domain closed under it).
    Backend(BackendError),
    /// What the call comes to.
    Outcome(Outcome),
}

/// How a ring call's run ended: with what the call comes to, or still in the domain.
enum RingRun {
    Done(Outcome),
    Unfinished(Box<UnfinishedRing>),
}

/// A ring call whose wait ended short of its return: the frame (still out in the domain), why the wait ended, the
/// incarnation it went to, and its deadline as it stood.
struct UnfinishedRing {
    frame: crate::backend::Frame,
    end: RingEnd,
    incarnation: u64,
    deadline: Deadline,
}

/// What one attempt of a call came to.
enum Outcome {
    Done(Value),
    Failed(FaultKind),
    /// The domain was recovered while this call waited for a nested callback to finish: it must be retried or
    /// reported, but recovery already happened.
    Stale,
    Error(Error),
}

type Guard<'a> = ReentrantMutexGuard<'a, RefCell<State>>;

impl Domain {
    pub fn new(
        name: String,
        isolation: crate::policy::Isolation,
        policy: ExtensionPolicy,
        events: Arc<EventBus>,
        backend: Box<dyn Backend>,
        tracker: Tracker,
    ) -> Domain {
        let state = State {
            backend,
            extensions: Vec::new(),
            images: Vec::new(),
            symbols: Vec::new(),
            symbol_index: Vec::new(),
            tracker,
            shadow: ShadowLog::default(),
            handles: Arc::new(Mutex::new(HandleMap::default())),
            instances: HashMap::new(),
            lent_callbacks: HashMap::new(),
            incarnation: 1,
            restart_times: VecDeque::new(),
            consecutive_faults: 0,
            stats: DomainStats { incarnation: 1, ..DomainStats::default() },
            disabled: None,
            recovering: false,
            rewriting: false,
            late: None,
        };
        Domain {
            name,
            isolation: Mutex::new(isolation),
            unisolated: isolation == crate::policy::Isolation::None,
            plain_calls: AtomicBool::new(isolation == crate::policy::Isolation::None),
            escalation: None,
            policy,
            events,
            handles: state.handles.clone(),
            lock: ReentrantMutex::new(RefCell::new(state)),
            callbacks: CallbackWatch::default(),
            incarnation: AtomicU64::new(1),
            recovering_now: AtomicBool::new(false),
            realtime_scheduled: AtomicU64::new(0),
            realtime_said: AtomicBool::new(false),
            late_now: AtomicBool::new(false),
            late_view: Mutex::new((DomainStats::default(), None)),
            deferred: Mutex::new(Vec::new()),
            late_waiter: Mutex::new(None),
        }
    }

    /// Take the domain's lock for a call of the function `symbol` (for its deadline), shown as `call` (for the
    /// fault). At once when it is free or this thread holds it already (a nested call). Otherwise this thread waits
    /// its turn, for as long as the holder's call takes, except that a holder found in one host callback for the
    /// whole of the call's deadline ends the wait: the callback may itself be waiting for this thread's call, which
    /// could then never run. That ends as a [`FaultKind::BusyInCallback`] fault of this call, reported; the domain
    /// is not recovered (nothing is wrong with it) and the holder's call goes on.
    /// A real-time call running late in the domain is waited for first (see [`Domain::settle_late`]): nothing else
    /// may go to the domain while it is there.
    fn lock_for(&self, symbol: &str, call: &str) -> Result<Guard<'_>, Error> {
        let mut g = match self.lock.try_lock() {
            Some(g) => g,
            None => loop {
                // Given `false`, it returns only with the lock (or the error).
                if let Some(g) = self.lock_contended(symbol, call, false)? {
                    break g;
                }
            },
        };
        if self.late_now.load(Ordering::Acquire) {
            self.settle_late(&mut g);
        }
        Ok(g)
    }

    /// The waiting of [`Domain::lock_for`] for a held domain; with `unless_late`, `None` as soon as a late call
    /// is found holding it (or about to).
    #[cold]
    fn lock_contended(&self, symbol: &str, call: &str, unless_late: bool) -> Result<Option<Guard<'_>>, Error> {
        let deadline = self.policy.deadline_for(symbol);
        // The holder's callback this thread has seen, and since when.
        let mut seen: Option<(u64, Instant)> = None;
        loop {
            if unless_late && self.late_now.load(Ordering::Acquire) {
                return Ok(None);
            }
            let now = Instant::now();
            seen = match (self.callbacks.current(), seen) {
                (Some(now_in), Some((was_in, since))) if now_in == was_in => Some((was_in, since)),
                (Some(now_in), _) => Some((now_in, now)),
                (None, _) => None,
            };
            let until = match seen {
                Some((_, since)) if now.duration_since(since) >= deadline => {
                    let fault = Fault {
                        kind: FaultKind::BusyInCallback { deadline },
                        domain: self.name.clone(),
                        call: Some(call.to_string()),
                        incarnation: self.incarnation.load(Ordering::Relaxed),
                    };
                    self.events.emit(Event::Fault { fault: fault.clone() });
                    return Err(Error::Fault(fault));
                }
                Some((_, since)) => (since + deadline).min(now + if unless_late { TURN_LOOK } else { deadline }),
                None => now + TURN_LOOK.min(deadline),
            };
            if let Some(g) = self.lock.try_lock_until(until) {
                return Ok(Some(g));
            }
        }
    }

    /// Lets this domain move to the backend `escalation` makes after `escalate_after` faults (policy).
    pub fn with_escalation(mut self, escalation: Escalation) -> Domain {
        self.escalation = Some(escalation);
        self
    }

    /// The isolation the domain runs with now.
    pub fn isolation(&self) -> crate::policy::Isolation {
        *self.isolation.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register an extension of this domain (already loaded by the backend); returns its index. `opened`: the
    /// plugin a class adapter will open in the domain, when the extension is an adapter.
    /// `started_from`: the extension's `restart_from` file, when the domain had to start from it (the extension's
    /// own file failed to load); a class adapter's opens of its plugin are then rewritten to open that file.
    pub fn register_extension(
        &self,
        name: String,
        policy: ExtensionPolicy,
        opened: Option<PathBuf>,
        started_from: Option<PathBuf>,
    ) -> usize {
        let g = self.lock.lock();
        let index = {
            let mut st = g.borrow_mut();
            let st = &mut *st;
            let rewrite = match (&opened, &started_from) {
                (Some(from), Some(to)) => recovery::path_cstring(from).ok().zip(recovery::path_cstring(to).ok()),
                _ => None,
            };
            st.rewriting |= rewrite.is_some();
            st.extensions.push((name.clone(), policy));
            st.images.push(CodeOrigin { opened, switched: started_from.is_some(), rewrite });
            st.extensions.len() - 1
        };
        if let Some(path) = started_from {
            self.events.emit(Event::ImageSwitched { domain: self.name.clone(), extension: name, path });
        }
        index
    }

    /// Add an extension to a running group domain. The backend loads it into the running incarnation when it can,
    /// so the members already there keep their state; else the domain restarts with it and the shadow log is
    /// replayed. An extension that cannot be loaded is refused and the group goes on without it.
    pub fn add_extension(
        &self,
        spec: ExtensionSpec,
        name: String,
        policy: ExtensionPolicy,
        opened: Option<PathBuf>,
    ) -> Result<usize, Error> {
        let mut g = self.lock.lock();
        self.settle_late(&mut g);
        let path = spec.path.clone();
        let added = {
            let mut st = g.borrow_mut();
            let st = &mut *st;
            st.backend.add_extension(&mut st.tracker, spec)
        };
        let outcome = added.map(|how| {
            let mut st = g.borrow_mut();
            st.extensions.push((name, policy));
            st.images.push(CodeOrigin { opened, switched: false, rewrite: None });
            (st.extensions.len() - 1, how == Added::NeedsRestart)
        });
        let restart = match &outcome {
            Ok((_, restart)) => *restart,
            Err(refused) => refused.restart,
        };
        if restart {
            g.borrow_mut().backend.stop();
            self.restart_and_replay(&mut g)
                .map_err(|e| Error::Spawn { domain: self.name.clone(), reason: e.to_string() })?;
        }
        outcome.map(|(index, _)| index).map_err(|refused| Error::Load { path, reason: refused.reason })
    }

    /// The effective policy of extension `ext` of this domain.
    pub fn extension_policy(&self, ext: usize) -> ExtensionPolicy {
        let g = self.lock.lock();
        let st = g.borrow();
        st.extensions.get(ext).map(|e| e.1.clone()).unwrap_or_else(|| self.policy.clone())
    }

    /// Find or resolve a symbol; returns its index in the symbol table. `call` names its calls in faults, events
    /// and messages (a class adapter's function is named for the plugin's call, see [`Symbol::call`]); `None`
    /// keeps the name it has, the symbol at first. The core only stores the name: it knows no class.
    pub fn symbol(&self, ext: usize, name: &str, call: Option<&str>) -> Result<usize, Error> {
        self.symbol_keyed(ext, name, call, name)
    }

    /// As [`Domain::symbol`], as a function of its own for each `instance`: its own learned deadline and its own
    /// count of failures in a row (a runtime's one entry point calls many plugins).
    pub fn distinct_symbol(&self, ext: usize, name: &str, call: &str, instance: u64) -> Result<usize, Error> {
        self.symbol_keyed(ext, name, Some(call), &format!("{name}\u{0}{instance}"))
    }

    fn symbol_keyed(&self, ext: usize, name: &str, call: Option<&str>, key: &str) -> Result<usize, Error> {
        let mut g = self.lock_for(name, call.unwrap_or(name))?;
        let existing = g.borrow().symbol_index.get(ext).and_then(|m| m.get(key)).copied();
        if let Some(i) = existing {
            if let Some(call) = call.filter(|c| *g.borrow().symbols[i].call != **c) {
                g.borrow_mut().symbols[i].call = call.into();
            }
            return Ok(i);
        }
        let index = {
            let mut st = g.borrow_mut();
            let policy = st.extensions.get(ext).map(|e| e.1.function(name)).unwrap_or_default();
            if ext >= st.extensions.len() {
                return Err(Error::BadArguments { call: name.into(), reason: format!("no extension #{ext}") });
            }
            st.symbols.push(Symbol {
                ext,
                name: name.into(),
                call: call.unwrap_or(name).into(),
                func: None,
                policy,
                times: learn::CallTimes::default(),
                failures_in_row: 0,
                ok_since_failure: 0,
                realtime_calls: 0,
                realtime_incarnation: 0,
            });
            let i = st.symbols.len() - 1;
            if st.symbol_index.len() <= ext {
                st.symbol_index.resize_with(ext + 1, HashMap::new);
            }
            st.symbol_index[ext].insert(key.to_string(), i);
            i
        };
        // Resolve now so an unknown symbol is reported at once, not at the first call. A domain found dead here
        // is recovered like at any call, and asked once more.
        let mut result = self.resolved(&g, index);
        if let Err(Error::Fault(fault)) = result {
            result = self.recover(&mut g, fault).and_then(|()| self.resolved(&g, index));
        }
        match result {
            Ok(_) => Ok(index),
            Err(e) => {
                let mut st = g.borrow_mut();
                if let Some(m) = st.symbol_index.get_mut(ext) {
                    m.remove(key);
                }
                Err(e)
            }
        }
    }

    /// The domain's counters; while a late call holds the domain, as they were when it was handed over (nothing
    /// but that call changes them until it ends), at once.
    pub fn stats(&self) -> DomainStats {
        match self.lock_unless_late() {
            Some(g) => stats_of(&g.borrow()),
            None => self.late_view.lock().unwrap_or_else(|e| e.into_inner()).0.clone(),
        }
    }

    /// The process id of the running incarnation; while a late call holds the domain, that call's, at once.
    pub fn pid(&self) -> Option<i32> {
        match self.lock_unless_late() {
            Some(g) => g.borrow().backend.pid(),
            None => self.late_view.lock().unwrap_or_else(|e| e.into_inner()).1,
        }
    }

    /// The domain's lock, for a look at its state that sends the domain nothing: it waits for a call in progress
    /// as long as that takes, but not for a late one (`realtime`), which may take the function's whole deadline:
    /// `None` then, as soon as that is found.
    fn lock_unless_late(&self) -> Option<Guard<'_>> {
        loop {
            if let Some(g) = self.lock.try_lock() {
                return Some(g);
            }
            if self.late_now.load(Ordering::Acquire) {
                return None;
            }
            if let Some(g) = self.lock.try_lock_for(TURN_LOOK) {
                return Some(g);
            }
        }
    }

    /// Resolve a symbol for the current incarnation if needed.
    fn resolved(&self, g: &Guard<'_>, sym: usize) -> Result<Callable, Error> {
        let mut st = g.borrow_mut();
        let Some(s) = st.symbols.get(sym) else {
            return Err(Error::BadArguments { call: format!("#{sym}"), reason: "no such function".into() });
        };
        if let Some(f) = &s.func {
            return Ok(f.clone());
        }
        let (ext, name) = (s.ext, s.name.clone());
        match st.backend.resolve(ext, &name) {
            Ok(f) => {
                st.symbols[sym].func = Some(f.clone());
                Ok(f)
            }
            Err(e) => {
                let deadline = self.policy.deadline_for(&name);
                Err(match self.outcome_of(&st, e, Some(sym), deadline) {
                    Outcome::Error(e) => e,
                    Outcome::Failed(kind) => self.fault_error(&st, kind, Some(call_of(&st, sym))),
                    // Closed under the resolve: the incarnation it asked is gone.
                    Outcome::Stale | Outcome::Done(_) => {
                        self.fault_error(&st, FaultKind::Vanished, Some(call_of(&st, sym)))
                    }
                })
            }
        }
    }

    /// What a backend's error means for a call of function `sym` that had `deadline`: the one mapping every call
    /// path uses.
    fn outcome_of(&self, st: &State, e: BackendError, sym: Option<usize>, deadline: Duration) -> Outcome {
        let call = || sym.map(|sym| call_of(st, sym)).unwrap_or_default();
        match e {
            BackendError::Fault(k) => Outcome::Failed(k),
            BackendError::TimedOut => Outcome::Failed(FaultKind::Timeout { deadline }),
            // Another call's failure closed the domain under this one, and recovers it.
            BackendError::Closed => Outcome::Stale,
            BackendError::Usage(reason) => Outcome::Error(Error::BadArguments { call: call(), reason }),
            BackendError::UnknownSymbol => {
                let function = sym.and_then(|sym| st.symbols.get(sym));
                let extension =
                    function.and_then(|f| st.extensions.get(f.ext)).map(|e| e.0.clone()).unwrap_or_default();
                let symbol = function.map(|f| f.name.to_string()).unwrap_or_default();
                Outcome::Error(Error::UnknownSymbol { extension, symbol })
            }
        }
    }

    fn fault_error(&self, st: &State, kind: FaultKind, call: Option<String>) -> Error {
        Error::Fault(Fault { kind, domain: self.name.clone(), call, incarnation: st.incarnation })
    }

    fn disabled_error(&self, st: &State) -> Option<Error> {
        st.disabled.as_ref().map(|(f, why)| {
            let restarts = st.stats.restarts as u32;
            Error::Disabled {
                domain: self.name.clone(),
                restarts,
                last: f.cause(),
                why: match why {
                    Disablement::RestartLimit => format!("after {restarts} restarts"),
                    why => why.to_string(),
                },
            }
        })
    }

    /// Call a function (`name`: its symbol, `call`: what its calls are called, see [`Domain::symbol`]): the whole
    /// protocol of DESIGN.md §3 and §4.
    pub fn call(&self, sym: usize, name: &str, call: &str, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, Error> {
        let g = self.lock_for(name, call)?;
        self.call_locked(g, sym, args, ret)
    }

    /// Call the function `symbol` of extension `ext` by its name, resolving it first if it never was: one turn of
    /// the lock, and no allocation once it is resolved.
    pub fn call_symbol(&self, ext: usize, symbol: &str, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, Error> {
        let g = self.lock_for(symbol, symbol)?;
        let known = g.borrow().symbol_index.get(ext).and_then(|m| m.get(symbol)).copied();
        let sym = match known {
            Some(sym) => sym,
            // The lock is re-entrant: resolving takes it again on this thread.
            None => self.symbol(ext, symbol, None)?,
        };
        self.call_locked(g, sym, args, ret)
    }

    /// [`Domain::call`] with the lock taken.
    fn call_locked(&self, mut g: Guard<'_>, sym: usize, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, Error> {
        let (fpolicy, mut timeout, mut source) = {
            let st = g.borrow();
            if let Some(e) = self.disabled_error(&st) {
                return Err(e);
            }
            let s = st
                .symbols
                .get(sym)
                .ok_or_else(|| Error::BadArguments { call: format!("#{sym}"), reason: "no such function".into() })?;
            let ext_policy = &st.extensions[s.ext].1;
            let (timeout, source) = learn::deadline(&s.policy, ext_policy, &s.times);
            (s.policy.clone(), timeout, source)
        };
        // Only failures need the name: it is looked up then, not on every call.
        let retry_allowed = fpolicy.retryable && self.policy.on_fault == OnFault::Retry;
        let mut retries = 0u32;
        // This call timed out at its learned deadline and is retried with its first one: if it then succeeds, the
        // learned deadline was a false alarm and is learned again.
        let mut outgrew_learned = false;
        // This call's failures dropped the history once (below).
        let mut history_dropped = false;
        loop {
            let outcome = self.attempt(&mut g, sym, args, ret, timeout, false);
            let kind = match outcome {
                Outcome::Done(value) => {
                    if outgrew_learned {
                        g.borrow_mut().symbols[sym].times.forget();
                    }
                    let value = self.after_success(&g, sym, &fpolicy, args, ret, value);
                    if retries > 0 {
                        self.events.emit(Event::Retried {
                            domain: self.name.clone(),
                            call: call_name(&g, sym),
                            ok: true,
                        });
                    }
                    return Ok(value);
                }
                Outcome::Error(e) => return Err(e),
                Outcome::Failed(kind) => (kind, false),
                Outcome::Stale => {
                    if let Some(e) = self.disabled_error(&g.borrow()) {
                        return Err(e);
                    }
                    let what = "the domain was recovered from a failure while this call was in it".into();
                    (FaultKind::Protocol { what }, true)
                }
            };
            let (kind, stale) = kind;
            if !stale && source == learn::DeadlineSource::Learned && matches!(kind, FaultKind::Timeout { .. }) {
                // Slower than the calls before it, or hung: a retry gets the first deadline, so a call that only
                // grew slower is not failed for it twice.
                let st = g.borrow();
                let s = &st.symbols[sym];
                timeout = learn::first(&s.policy, &st.extensions[s.ext].1);
                source = learn::DeadlineSource::First;
                outgrew_learned = true;
            }
            let fault = {
                let st = g.borrow();
                Fault { kind, domain: self.name.clone(), call: Some(call_name(&g, sym)), incarnation: st.incarnation }
            };
            // The retry failed again on an incarnation given the history: the fault may follow from the state the
            // history rebuilt (a plugin that fails at its Nth block fails at it again), so the history goes and the
            // call gets one more try on an incarnation with its configuration only, as without history; that
            // failure is the history's, not counted in a row.
            let history_blamed = !stale && retries > 0 && !history_dropped && g.borrow().shadow.replayed_history();
            if history_blamed {
                g.borrow_mut().shadow.drop_history();
                history_dropped = true;
                tracing::info!(
                    domain = %self.name,
                    "the retried call failed again after the history was replayed: history dropped, the next \
                     restart replays the configuration only"
                );
            }
            // A stale call's domain was already recovered by the call that saw the fault (a nested one, or another
            // thread's).
            if !stale {
                let in_row = {
                    let mut st = g.borrow_mut();
                    let s = &mut st.symbols[sym];
                    if !history_blamed {
                        s.failures_in_row = s.failures_in_row.saturating_add(1);
                    }
                    s.ok_since_failure = 0;
                    s.failures_in_row
                };
                if let Err(e) = self.recover_counted(&mut g, fault.clone(), in_row) {
                    if retries > 0 {
                        self.events.emit(Event::Retried {
                            domain: self.name.clone(),
                            call: call_name(&g, sym),
                            ok: false,
                        });
                    }
                    return Err(e);
                }
            }
            if retry_allowed && (retries < self.policy.max_retries || history_blamed) {
                retries += 1;
                continue;
            }
            if retries > 0 {
                self.events.emit(Event::Retried { domain: self.name.clone(), call: call_name(&g, sym), ok: false });
            }
            return Err(Error::Fault(fault));
        }
    }

    /// A class wrapper found the result of a call of `symbol` (of extension `ext`) wrong: recover the domain as if
    /// the call had faulted. The fault names the call as the function was named when resolved. The caller retries
    /// the call itself if it wants to (the recovered domain is ready for it) and gets an error when the domain is
    /// or becomes disabled.
    pub fn declare_fault(&self, ext: usize, symbol: &str, kind: FaultKind) -> Result<(), Error> {
        let mut g = self.lock_for(symbol, symbol)?;
        let fault = self.declared_fault(&g, ext, symbol, kind, true)?;
        self.recover(&mut g, fault)
    }

    /// See [`crate::Extension::report_own_output`]. Said once a late call holding the domain ends, not waited for.
    pub fn report_own_output(&self, ext: usize, symbol: &str, what: &str) {
        let mut report = realtime::Deferred::OwnOutput { ext, symbol: symbol.to_string(), what: what.to_string() };
        loop {
            let taken = match self.lock.try_lock() {
                Some(g) => Ok(Some(g)),
                None => self.lock_contended(symbol, symbol, true),
            };
            // Taken before the late call's thread took it, the domain is held here with the late state set, which
            // only a holder changes: the report is deferred all the same, said after the late call as ever.
            match taken {
                Ok(held) => match (self.defer_while_late(report), held) {
                    (Ok(()), _) => return,
                    (Err(back), Some(mut g)) => return self.run_deferred(&mut g, vec![back]),
                    // It ended meanwhile: the domain is free again.
                    (Err(back), None) => report = back,
                },
                Err(_) => {
                    let call = symbol.to_string();
                    self.events.emit(Event::OwnOutput { domain: self.name.clone(), call, what: what.to_string() });
                    return;
                }
            }
        }
    }

    /// The fault a class declares for a call of `symbol` whose result was wrong (see [`Domain::declare_fault`]), its
    /// result dropped from the history when `drop_result` (else it was already); an error when the domain is
    /// disabled.
    fn declared_fault(
        &self,
        g: &Guard<'_>,
        ext: usize,
        symbol: &str,
        kind: FaultKind,
        drop_result: bool,
    ) -> Result<Fault, Error> {
        if let Some(e) = self.disabled_error(&g.borrow()) {
            return Err(e);
        }
        let mut st = g.borrow_mut();
        // The call's wrong result must not be replayed as history: the caller retries the call itself.
        if drop_result {
            realtime::drop_declared_result(&mut st, ext, symbol);
        }
        let index = st.symbol_index.get(ext).and_then(|m| m.get(symbol)).copied();
        let call = index.and_then(|i| st.symbols.get(i)).map_or_else(|| symbol.to_string(), |s| s.call.to_string());
        Ok(Fault { kind, domain: self.name.clone(), call: Some(call), incarnation: st.incarnation })
    }

    /// Bookkeeping after a successful call: handles, shadow log, destroyed instances.
    fn after_success(
        &self,
        g: &Guard<'_>,
        sym: usize,
        fpolicy: &FunctionPolicy,
        args: &mut [Arg<'_>],
        ret: RetType,
        value: Value,
    ) -> Value {
        self.after_success_charged(g, sym, fpolicy, args, ret, value, None)
    }

    /// [`Domain::after_success`], a history entry charged `replay` (what replaying it is expected to take, before
    /// the round trip and copies) where given, else what the call took.
    #[allow(clippy::too_many_arguments)]
    fn after_success_charged(
        &self,
        g: &Guard<'_>,
        sym: usize,
        fpolicy: &FunctionPolicy,
        args: &mut [Arg<'_>],
        ret: RetType,
        value: Value,
        replay: Option<Duration>,
    ) -> Value {
        let mut st = g.borrow_mut();
        st.consecutive_faults = 0;
        let s = &mut st.symbols[sym];
        if s.failures_in_row > 0 {
            s.ok_since_failure += 1;
            if s.ok_since_failure >= learn::FAILS_AGAIN_WITHIN {
                s.failures_in_row = 0;
            }
        }
        let mut value = value;
        let mut created = None;
        if let Value::Handle(object) = value {
            if object != 0 {
                let handle = st.handles.lock().unwrap_or_else(|e| e.into_inner()).create(object);
                let handles = st.handles.clone();
                let record = st.tracker.track(ResourceKind::Instance, move || {
                    // The object died with its incarnation; replay may bring it back.
                    if let Ok(mut h) = handles.lock() {
                        h.rebind(handle, 0);
                    }
                });
                st.instances.insert(handle, record);
                created = Some(handle);
                value = Value::Handle(handle);
            }
        }
        if fpolicy.destroys {
            if let Some(h) = args.iter().find_map(|a| if let Arg::Handle(h) = a { Some(*h) } else { None }) {
                st.shadow.forget_handle(h);
                st.handles.lock().unwrap_or_else(|e| e.into_inner()).remove(h);
                if let Some(record) = st.instances.remove(&h) {
                    st.tracker.forget(record);
                }
            }
        }
        // A constructor that created nothing (a null handle) is not logged: replayed, it would create nothing again.
        let created_nothing = ret == RetType::Handle && created.is_none();
        if fpolicy.state && !created_nothing {
            let args = args.iter().map(OwnedArg::from_arg).collect();
            let entry = ShadowEntry { symbol: sym, args, ret, created, history: false, replay: Duration::ZERO };
            match fpolicy.replaces_same {
                Some(key) => st.shadow.record_replacing(entry, key),
                None => st.shadow.record(entry),
            }
        } else if fpolicy.history && !self.unisolated {
            // (No history without isolation: nothing recovers such a domain, so nothing would replay it.)
            let ext = st.symbols.get(sym).map_or(0, |s| s.ext);
            let bounds = st.extensions.get(ext).map(|e| HistoryBounds {
                bytes: usize::try_from(e.1.history_mb).unwrap_or(usize::MAX).saturating_mul(1 << 20),
                replay: e.1.history_replay,
            });
            if let Some(bounds) = bounds.filter(|b| b.bytes > 0 && !b.replay.is_zero()) {
                let took = replay.unwrap_or_else(|| st.symbols[sym].times.last());
                let was_trimmed = st.shadow.history_trimmed();
                let kept = st.shadow.record_history(sym, args, ret, created, took, bounds);
                if kept != Kept::Whole && !was_trimmed && st.shadow.history_trimmed() {
                    // Once per domain: from now on a restart rebuilds the state from a window, not exactly.
                    self.events.emit(Event::HistoryWindowed {
                        domain: self.name.clone(),
                        history_mb: (bounds.bytes >> 20) as u64,
                        history_replay_ms: u64::try_from(bounds.replay.as_millis()).unwrap_or(u64::MAX),
                    });
                }
            }
        }
        value
    }

    /// One try of a call on the current incarnation: the function resolved, then called the way its backend
    /// runs it (the one place the core tells the ways apart).
    fn attempt(
        &self,
        g: &mut Guard<'_>,
        sym: usize,
        args: &mut [Arg<'_>],
        ret: RetType,
        timeout: Duration,
        replaying: bool,
    ) -> Outcome {
        match self.resolved(g, sym) {
            Ok(Callable::OnThread(function)) => {
                self.attempt_on_thread(g, sym, &*function, args, ret, timeout, replaying)
            }
            // Through the rings of a domain in another process: started, then each step awaited; a callback is
            // served with nothing borrowed (it may call this domain again) and answered.
            Ok(Callable::Ring(func)) => match self.run_ring(g, sym, func, args, ret, timeout, replaying, true) {
                RingRun::Done(outcome) => outcome,
                RingRun::Unfinished(unfinished) => {
                    abandon(g, unfinished.frame);
                    self.ring_outcome(g, unfinished.end, sym, timeout)
                }
            },
            Err(Error::Fault(f)) => Outcome::Failed(f.kind),
            Err(e) => Outcome::Error(e),
        }
    }

    /// Translate, start and await a ring call of `func` (its buffers lent in place where `in_place` allows). A wait
    /// that ends short of the return leaves the frame with the caller, to abandon or to hand over.
    #[allow(clippy::too_many_arguments)]
    fn run_ring(
        &self,
        g: &mut Guard<'_>,
        sym: usize,
        func: u32,
        args: &mut [Arg<'_>],
        ret: RetType,
        timeout: Duration,
        replaying: bool,
        in_place: bool,
    ) -> RingRun {
        let (incarnation, rewrite) = {
            let st = g.borrow();
            (st.incarnation, st.rewrite_for(sym))
        };
        // Filled in place: the list is a few hundred bytes, and returning it would copy it on every call.
        let mut wire = Wire::new();
        if let Err(e) = self.translate(&mut g.borrow_mut(), args, sym, replaying, &rewrite, &mut wire) {
            return RingRun::Done(Outcome::Error(e));
        }
        let frame = match self.start_ring(g, sym, func, &wire, ret, timeout, in_place) {
            Ok(frame) => frame,
            Err(outcome) => return RingRun::Done(outcome),
        };
        // The deadline bounds the domain's own time in this call: time the host spends serving a callback (which
        // may include nested calls) moves it later by as much, and nothing else does. An extension that keeps
        // calling back in a loop therefore still runs out of time.
        // Fixed at the first look (most replies come before it): a clock read is a tenth of a polling round trip.
        let mut deadline = Deadline::after(timeout);
        match self.wait_ring(g, &frame, &mut deadline, incarnation) {
            Ok(regs) => RingRun::Done(self.finish_ring(g, sym, frame, &mut wire, ret, regs, &deadline)),
            Err(end) => RingRun::Unfinished(Box::new(UnfinishedRing { frame, end, incarnation, deadline })),
        }
    }

    /// Start a ring call of `func` with the translated arguments `wire` (lent in place where `in_place` allows).
    #[allow(clippy::too_many_arguments)]
    fn start_ring(
        &self,
        g: &Guard<'_>,
        sym: usize,
        func: u32,
        wire: &[WireValue<'_>],
        ret: RetType,
        timeout: Duration,
        in_place: bool,
    ) -> Result<crate::backend::Frame, Outcome> {
        let mut st = g.borrow_mut();
        let st = &mut *st;
        let Some(ring) = st.backend.ring() else { return Err(Outcome::Stale) };
        ring.begin(&mut st.tracker, func, wire, ret, in_place).map_err(|e| self.outcome_of(st, e, Some(sym), timeout))
    }

    /// Wait for the ring call `frame` (of incarnation `incarnation`) to return within `deadline`, serving its
    /// callbacks. On an error the caller abandons the frame, or (a deadline passed) may wait again later.
    fn wait_ring(
        &self,
        g: &mut Guard<'_>,
        frame: &crate::backend::Frame,
        deadline: &mut Deadline,
        incarnation: u64,
    ) -> Result<ward_abi::RegRet, RingEnd> {
        loop {
            let step = {
                let mut st = g.borrow_mut();
                // The domain moved to another backend (escalation) while this call was out in a callback.
                let Some(ring) = st.backend.ring() else { return Err(RingEnd::Outcome(Outcome::Stale)) };
                ring.wait(frame, deadline)
            };
            match step {
                Ok(Step::Done(regs)) => return Ok(regs),
                Ok(Step::Callback { token, slot, regs }) => {
                    if !g.borrow().lent_callbacks.contains_key(&slot) {
                        return Err(RingEnd::Outcome(Outcome::Failed(FaultKind::Protocol {
                            what: format!("call of callback slot {slot}, which this domain was never given"),
                        })));
                    }
                    // No borrow is held while host code runs: it may call this domain again.
                    // Fixes the deadline if no wait has yet, so an extension that calls back at once, in a loop,
                    // still runs out of time.
                    deadline.instant();
                    let host_started = Instant::now();
                    let answer = {
                        // Threads waiting for this domain meanwhile may give up (`lock_for`).
                        let _out = self.callbacks.enter();
                        crate::callback::invoke(slot, &regs)
                    };
                    deadline.extend(host_started.elapsed());
                    if g.borrow().incarnation != incarnation {
                        return Err(RingEnd::Outcome(Outcome::Stale));
                    }
                    let Some(answer) = answer else {
                        return Err(RingEnd::Outcome(Outcome::Failed(FaultKind::Protocol {
                            what: format!("call of callback slot {slot}, which is no longer registered"),
                        })));
                    };
                    let answered = match g.borrow_mut().backend.ring() {
                        Some(ring) => ring.answer_callback(token, answer),
                        None => Err(BackendError::Closed),
                    };
                    answered.map_err(RingEnd::Backend)?;
                }
                Err(e) => return Err(RingEnd::Backend(e)),
            }
        }
    }

    /// A ring call returned `regs`: its outputs copied into the host's buffers among `wire`, its loans released,
    /// the domain's own time in it (`deadline`) learned.
    #[allow(clippy::too_many_arguments)]
    fn finish_ring(
        &self,
        g: &Guard<'_>,
        sym: usize,
        frame: crate::backend::Frame,
        wire: &mut Wire<'_>,
        ret: RetType,
        regs: ward_abi::RegRet,
        deadline: &Deadline,
    ) -> Outcome {
        let mut st = g.borrow_mut();
        let st = &mut *st;
        let mut outputs: SmallVec<[&mut [u8]; 2]> = backend::outputs(wire).collect();
        if let Some(ring) = st.backend.ring() {
            ring.finish(&mut st.tracker, frame, &mut outputs);
        }
        // The domain's own time in the call, read from its deadline: no clock read for a fast call.
        st.symbols[sym].times.record(deadline.counted());
        Outcome::Done(Value::from_regs(ret, regs))
    }

    /// What a ring call of `sym` with deadline `timeout` that ended in `end` comes to.
    fn ring_outcome(&self, g: &Guard<'_>, end: RingEnd, sym: usize, timeout: Duration) -> Outcome {
        match end {
            RingEnd::Outcome(outcome) => outcome,
            RingEnd::Backend(e) => self.outcome_of(&g.borrow(), e, Some(sym), timeout),
        }
    }

    /// A call of a function that runs on this host thread (`none`, `mpk`): its arguments translated with the
    /// state borrowed, the function run with nothing borrowed (a callback may call this domain again) and, in an
    /// isolated domain, the domain's lock let go, so other threads may call it meanwhile, each on a stack of its
    /// own there. A failure of one of theirs closes the domain under this call, which then ends
    /// (`BackendError::Closed`).
    #[allow(clippy::too_many_arguments)]
    fn attempt_on_thread(
        &self,
        g: &mut Guard<'_>,
        sym: usize,
        function: &dyn ThreadFunction,
        args: &mut [Arg<'_>],
        ret: RetType,
        timeout: Duration,
        replaying: bool,
    ) -> Outcome {
        let (incarnation, rewrite) = {
            let st = g.borrow();
            (st.incarnation, st.rewrite_for(sym))
        };
        // Filled in place: the list is a few hundred bytes, and returning it would copy it on every call.
        let mut wire = Wire::new();
        if let Err(e) = self.translate(&mut g.borrow_mut(), args, sym, replaying, &rewrite, &mut wire) {
            return Outcome::Error(e);
        }
        // No deadline object to read its time from: timed while learning, then now and then (a domain without
        // isolation has no deadline to learn).
        let timed = !self.unisolated && g.borrow_mut().symbols[sym].times.time_gated();
        // Recovery holds the lock until the new incarnation has its state back.
        let let_go = !replaying && !self.unisolated;
        let mut took = None;
        let result = {
            let mut unlocked = |run: &mut dyn FnMut()| -> bool {
                let started = timed.then(Instant::now);
                if let_go {
                    Guard::unlocked(g, run);
                } else {
                    run();
                }
                took = started.map(|s| s.elapsed());
                // Another call (a nested one, or another thread's) recovered the domain while this one ran or was
                // out in the host: its result means nothing.
                g.borrow().incarnation == incarnation
            };
            function.call(&mut wire, timeout, &mut unlocked)
        };
        drop(wire);
        if g.borrow().incarnation != incarnation {
            return Outcome::Stale;
        }
        match result {
            Ok(regs) => {
                if let Some(took) = took {
                    g.borrow_mut().symbols[sym].times.record(took);
                }
                Outcome::Done(Value::from_regs(ret, regs))
            }
            Err(e) => self.outcome_of(&g.borrow(), e, Some(sym), timeout),
        }
    }

    /// Host arguments to what crosses into the domain: handles to objects, callbacks to lent slots; a string equal
    /// to `rewrite.0` (a switched adapter's plugin path) is sent as `rewrite.1`.
    fn translate<'a>(
        &self,
        st: &mut State,
        args: &'a mut [Arg<'_>],
        sym: usize,
        replaying: bool,
        rewrite: &'a Option<(CString, CString)>,
        out: &mut Wire<'a>,
    ) -> Result<(), Error> {
        let name = |st: &State| call_of(st, sym);
        if let Err(too_many) = check_registers(args) {
            return Err(Error::BadArguments { call: name(st), reason: too_many.to_string() });
        }
        for a in args.iter_mut() {
            if let Some(scalar) = plain_scalar(a) {
                out.push(scalar);
                continue;
            }
            out.push(match a {
                Arg::I64(_) | Arg::U64(_) | Arg::Ptr(_) | Arg::F64(_) | Arg::F32(_) => continue,
                Arg::In(b) => WireValue::In(b),
                Arg::InVec(v) => WireValue::In(v),
                Arg::Out(b) => WireValue::Out(b),
                Arg::InOut(b) => WireValue::InOut(b),
                Arg::Scratch(b) => WireValue::Scratch(b),
                Arg::Str(s) => match rewrite {
                    Some((from, to)) if *s == from.as_c_str() => WireValue::Str(to.as_bytes_with_nul()),
                    _ => WireValue::Str(s.to_bytes_with_nul()),
                },
                Arg::Handle(h) => {
                    let object = st.handles.lock().unwrap_or_else(|e| e.into_inner()).object(*h);
                    match object {
                        None => return Err(Error::UnknownHandle { call: name(st), handle: *h }),
                        Some(0) if !replaying => {
                            return Err(Error::BadArguments {
                                call: name(st),
                                reason: format!(
                                    "handle {h:#x} refers to an object lost when the extension restarted; mark the \
                                     function that creates it `state = true` in the policy so it is replayed"
                                ),
                            })
                        }
                        Some(o) => WireValue::Int(o),
                    }
                }
                Arg::Callback(c) => {
                    let slot = c.slot();
                    // A domain that can be recovered holds the callbacks it was given until its incarnation ends
                    // (it may call one later); without isolation the host's own `Callback` keeps it, as ever.
                    if !self.unisolated && !st.lent_callbacks.contains_key(&slot) {
                        let held = (*c).clone();
                        let record = st.tracker.track(ResourceKind::Callback, move || drop(held));
                        st.lent_callbacks.insert(slot, record);
                    }
                    WireValue::Callback(slot)
                }
            });
        }
        Ok(())
    }

    /// Queue a call (of function `name`) with no reply awaited.
    pub fn defer(&self, sym: usize, name: &str, call: &str, args: &[Arg<'_>]) -> Result<(), Error> {
        let mut g = self.lock_for(name, call)?;
        // The hot path, in one borrow: a healthy domain behind rings, a resolved function, plain scalar arguments.
        // Anything else (and any failure here, which queues nothing) takes the general path below.
        {
            let mut st = g.borrow_mut();
            let plain = args.len() <= ward_abi::MAX_INT_ARGS && args.iter().all(|a| plain_scalar(a).is_some());
            let func = match st.symbols.get(sym).and_then(|s| s.func.as_ref()) {
                Some(Callable::Ring(func)) => Some(*func),
                _ => None,
            };
            if let (true, Some(func), true) = (plain, func, st.disabled.is_none()) {
                let wire: SmallVec<[WireValue<'_>; 6]> = args.iter().filter_map(plain_scalar).collect();
                if st.backend.ring().is_some_and(|ring| ring.defer(func, &wire).is_ok()) {
                    return Ok(());
                }
            }
        }
        if let Some(e) = self.disabled_error(&g.borrow()) {
            return Err(e);
        }
        // Deferred calls only read their arguments: an output is lent as an input.
        let mut owned: SmallVec<[Arg<'_>; 6]> = args.iter().map(reborrow).collect();
        for _ in 0..2 {
            let func = match self.resolved(&g, sym) {
                Ok(Callable::Ring(func)) => func,
                Ok(Callable::OnThread(_)) => {
                    // No boundary to batch across: run it now.
                    return match self.attempt(&mut g, sym, &mut owned, RetType::Void, self.policy.deadline, false) {
                        Outcome::Error(e) => Err(e),
                        _ => Ok(()),
                    };
                }
                Err(Error::Fault(f)) => {
                    self.recover(&mut g, f)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if args.iter().any(|a| matches!(a, Arg::Out(_) | Arg::InOut(_))) {
                let reason = "a deferred call cannot have output or scratch buffers".into();
                return Err(Error::BadArguments { call: call_name(&g, sym), reason });
            }
            let rewrite = g.borrow().rewrite_for(sym);
            let result = {
                let mut st = g.borrow_mut();
                let mut wire = Wire::new();
                self.translate(&mut st, &mut owned, sym, false, &rewrite, &mut wire)?;
                match st.backend.ring() {
                    Some(ring) => ring.defer(func, &wire),
                    // Moved to another backend: resolved again below.
                    None => Err(BackendError::Closed),
                }
            };
            let kind = match result {
                Ok(()) => return Ok(()),
                Err(e) => match self.outcome_of(&g.borrow(), e, Some(sym), self.policy.deadline) {
                    Outcome::Error(e) => return Err(e),
                    Outcome::Failed(k) => k,
                    Outcome::Stale | Outcome::Done(_) => FaultKind::Vanished,
                },
            };
            let fault = self.make_fault(&g, kind, Some(call_name(&g, sym)));
            // The call had not been queued: queue it again on the new incarnation.
            self.recover(&mut g, fault)?;
        }
        Err(Error::BadArguments { call: call_name(&g, sym), reason: "the domain failed twice while queueing".into() })
    }

    /// Send queued deferred calls.
    pub fn flush(&self) -> Result<(), Error> {
        let mut g = self.lock_for("flush", "flush")?;
        let flushed = match g.borrow_mut().backend.ring() {
            Some(ring) => ring.flush(),
            // Calls on the host's thread are never queued.
            None => Ok(()),
        };
        let Err(e) = flushed else { return Ok(()) };
        let kind = match self.outcome_of(&g.borrow(), e, None, self.policy.deadline) {
            Outcome::Failed(k) => k,
            _ => FaultKind::Vanished,
        };
        let fault = self.make_fault(&g, kind, None);
        self.recover(&mut g, fault.clone())?;
        Err(Error::Fault(fault))
    }

    /// Heartbeat: when the domain is idle, check it answers within `interval`. Busy domains are skipped (their
    /// calls have deadlines of their own), and so are domains that do not run in a process of their own (an mpk
    /// domain that may move to one later has its heartbeat from then on).
    pub fn heartbeat(&self, interval: Duration) {
        if self.isolation() != crate::policy::Isolation::Process {
            return;
        }
        let Some(mut g) = self.lock.try_lock() else {
            return;
        };
        // A real-time call running late is in the domain: it is busy.
        if g.borrow().disabled.is_some() || g.borrow().recovering || self.late_now.load(Ordering::Acquire) {
            return;
        }
        let pinged = g.borrow_mut().backend.ring().map(|ring| ring.ping(&mut Deadline::after(interval)));
        let kind = match pinged.unwrap_or(Ok(())) {
            Ok(()) => {
                g.borrow_mut().stats.heartbeats += 1;
                return;
            }
            Err(BackendError::TimedOut) => FaultKind::HeartbeatMissed { interval },
            Err(BackendError::Fault(k)) => k,
            Err(_) => return,
        };
        let fault = self.make_fault(&g, kind, None);
        let _ = self.recover(&mut g, fault);
    }

    fn make_fault(&self, g: &Guard<'_>, kind: FaultKind, call: Option<String>) -> Fault {
        Fault { kind, domain: self.name.clone(), call, incarnation: g.borrow().incarnation }
    }
}

/// The domain's counters, read from its state.
fn stats_of(st: &State) -> DomainStats {
    let mut s = st.stats.clone();
    s.shadow_log = st.shadow.len();
    (s.history_bytes, s.history_replay) = st.shadow.history_held();
    s.tracked = st.tracker.len();
    s.handles = st.handles.lock().map(|h| h.len()).unwrap_or(0);
    s.disabled = st.disabled.is_some();
    s.lent_in_place = st.backend.lent_in_place();
    s
}

/// The call of function `sym` as faults, events and messages name it.
fn call_name(g: &Guard<'_>, sym: usize) -> String {
    call_of(&g.borrow(), sym)
}

/// [`call_name`] with the state already borrowed.
fn call_of(st: &State, sym: usize) -> String {
    st.symbols.get(sym).map(|s| s.call.to_string()).unwrap_or_default()
}

/// The wire form of an argument that needs no translation (numbers and raw addresses); None for the rest.
fn plain_scalar(a: &Arg<'_>) -> Option<WireValue<'static>> {
    Some(match a {
        Arg::I64(v) => WireValue::Int(*v as u64),
        Arg::U64(v) => WireValue::Int(*v),
        Arg::Ptr(v) => WireValue::Int(*v as u64),
        Arg::F64(v) => WireValue::F64(*v),
        Arg::F32(v) => WireValue::F32(*v),
        _ => return None,
    })
}

/// ward passes arguments in registers only (DECISIONS.md): at most 6 integer-class and 8 float-class.
fn check_registers(args: &[Arg<'_>]) -> Result<(), TooManyArguments> {
    if args.len() <= ward_abi::MAX_INT_ARGS {
        return Ok(());
    }
    let floats = args.iter().filter(|a| matches!(a, Arg::F64(_) | Arg::F32(_))).count();
    let ints = args.len() - floats;
    if ints > ward_abi::MAX_INT_ARGS || floats > ward_abi::MAX_FLOAT_ARGS {
        return Err(TooManyArguments { ints, floats });
    }
    Ok(())
}

/// A call with more arguments than the registers hold.
#[derive(Debug, thiserror::Error)]
#[error(
    "{ints} integer/pointer and {floats} floating-point arguments; ward passes at most {max_ints} and {max_floats} \
     (in registers)",
    max_ints = ward_abi::MAX_INT_ARGS,
    max_floats = ward_abi::MAX_FLOAT_ARGS
)]
struct TooManyArguments {
    ints: usize,
    floats: usize,
}

/// Abandon the ring call `frame` of a failed or stale attempt (the tracker releases its loans).
fn abandon(g: &Guard<'_>, frame: crate::backend::Frame) {
    if let Some(ring) = g.borrow_mut().backend.ring() {
        ring.abandon(frame);
    }
}

/// A shared re-borrow of an argument (deferred calls only read their arguments).
fn reborrow<'a>(a: &'a Arg<'_>) -> Arg<'a> {
    match a {
        Arg::I64(v) => Arg::I64(*v),
        Arg::U64(v) => Arg::U64(*v),
        Arg::F64(v) => Arg::F64(*v),
        Arg::F32(v) => Arg::F32(*v),
        Arg::Ptr(v) => Arg::Ptr(*v),
        Arg::In(b) => Arg::In(b),
        Arg::InVec(v) => Arg::In(v),
        Arg::Out(b) | Arg::InOut(b) => Arg::In(b),
        Arg::Scratch(b) => Arg::Scratch(b),
        Arg::Str(s) => Arg::Str(s),
        Arg::Handle(h) => Arg::Handle(*h),
        Arg::Callback(c) => Arg::Callback(c),
    }
}
