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
use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use parking_lot::{ReentrantMutex, ReentrantMutexGuard};
use smallvec::SmallVec;
use ward_xpc::Deadline;

mod learn;
mod recovery;

use crate::backend::{Added, Backend, BackendError, ExtensionSpec, Step, WireValue};
use crate::call::{Arg, RetType, Value};
use crate::error::Error;
use crate::events::{Disablement, Event, EventBus};
use crate::fault::{Fault, FaultKind};
use crate::policy::{ExtensionPolicy, FunctionPolicy, OnFault};
use crate::shadow::{HandleMap, HistoryBounds, Kept, OwnedArg, ShadowEntry, ShadowLog};
use crate::tracker::{RecordId, ResourceKind, Tracker};

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
    /// The backend's id for this incarnation; None until resolved.
    func: Option<u32>,
    policy: FunctionPolicy,
    /// What its recent successful calls took, for its learned deadline.
    times: learn::CallTimes,
    /// Its calls that failed in a row, each again after the recovery from the one before: within
    /// [`learn::FAILS_AGAIN_WITHIN`] successful calls of it.
    failures_in_row: u32,
    /// Its successful calls since its last failure, while `failures_in_row` is not 0.
    ok_since_failure: u32,
}

/// Where an extension's code comes from, for `restart_from`.
struct Image {
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
    images: Vec<Image>,
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
    Box<dyn Fn(Vec<ExtensionSpec>, &mut Tracker) -> Result<Box<dyn Backend>, String> + Send + Sync>;

pub(crate) struct Domain {
    pub name: String,
    /// The isolation it runs with now (an mpk domain may escalate to a process).
    isolation: Mutex<crate::policy::Isolation>,
    /// How to escalate, for a domain that may.
    escalation: Option<Escalation>,
    policy: ExtensionPolicy,
    events: Arc<EventBus>,
    lock: ReentrantMutex<RefCell<State>>,
    /// Whether the thread holding `lock` is out in a host callback, for threads waiting for it.
    callbacks: CallbackWatch,
    /// The running incarnation (a copy of the state's), for a fault made without the lock.
    incarnation: AtomicU64,
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
        };
        Domain {
            name,
            isolation: Mutex::new(isolation),
            escalation: None,
            policy,
            events,
            lock: ReentrantMutex::new(RefCell::new(state)),
            callbacks: CallbackWatch::default(),
            incarnation: AtomicU64::new(1),
        }
    }

    /// Take the domain's lock for a call of the function `symbol` (for its deadline), shown as `call` (for the
    /// fault). At once when it is free or this thread holds it already (a nested call). Otherwise this thread waits
    /// its turn, for as long as the holder's call takes, except that a holder found in one host callback for the
    /// whole of the call's deadline ends the wait: the callback may itself be waiting for this thread's call, which
    /// could then never run. That ends as a [`FaultKind::BusyInCallback`] fault of this call, reported; the domain
    /// is not recovered (nothing is wrong with it) and the holder's call goes on.
    fn lock_for(&self, symbol: &str, call: &str) -> Result<Guard<'_>, Error> {
        if let Some(g) = self.lock.try_lock() {
            return Ok(g);
        }
        self.lock_contended(symbol, call)
    }

    #[cold]
    fn lock_contended(&self, symbol: &str, call: &str) -> Result<Guard<'_>, Error> {
        let deadline = self.policy.deadline_for(symbol);
        // The holder's callback this thread has seen, and since when.
        let mut seen: Option<(u64, Instant)> = None;
        loop {
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
                Some((_, since)) => since + deadline,
                None => now + TURN_LOOK.min(deadline),
            };
            if let Some(g) = self.lock.try_lock_until(until) {
                return Ok(g);
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
            st.images.push(Image { opened, switched: started_from.is_some(), rewrite });
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
        let path = spec.path.clone();
        let added = {
            let mut st = g.borrow_mut();
            let st = &mut *st;
            st.backend.add_extension(&mut st.tracker, spec)
        };
        let outcome = added.map(|how| {
            let mut st = g.borrow_mut();
            st.extensions.push((name, policy));
            st.images.push(Image { opened, switched: false, rewrite: None });
            (st.extensions.len() - 1, how == Added::NeedsRestart)
        });
        let restart = match &outcome {
            Ok((_, restart)) => *restart,
            Err(refused) => refused.restart,
        };
        if restart {
            g.borrow_mut().backend.stop();
            self.restart_and_replay(&mut g).map_err(|reason| Error::Spawn { domain: self.name.clone(), reason })?;
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
        let mut g = self.lock_for(name, call.unwrap_or(name))?;
        let existing = g.borrow().symbol_index.get(ext).and_then(|m| m.get(name)).copied();
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
            });
            let i = st.symbols.len() - 1;
            if st.symbol_index.len() <= ext {
                st.symbol_index.resize_with(ext + 1, HashMap::new);
            }
            st.symbol_index[ext].insert(name.to_string(), i);
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
                    m.remove(name);
                }
                Err(e)
            }
        }
    }

    pub fn stats(&self) -> DomainStats {
        let g = self.lock.lock();
        let st = g.borrow();
        let mut s = st.stats.clone();
        s.shadow_log = st.shadow.len();
        (s.history_bytes, s.history_replay) = st.shadow.history_held();
        s.tracked = st.tracker.len();
        s.handles = st.handles.lock().map(|h| h.len()).unwrap_or(0);
        s.disabled = st.disabled.is_some();
        s.lent_in_place = st.backend.lent_in_place();
        s
    }

    pub fn pid(&self) -> Option<i32> {
        let g = self.lock.lock();
        let st = g.borrow();
        st.backend.pid()
    }

    /// Resolve a symbol for the current incarnation if needed.
    fn resolved(&self, g: &Guard<'_>, sym: usize) -> Result<u32, Error> {
        let mut st = g.borrow_mut();
        if let Some(f) = st.symbols.get(sym).and_then(|s| s.func) {
            return Ok(f);
        }
        let (ext, name, call, func) = match st.symbols.get(sym) {
            Some(s) => (s.ext, s.name.clone(), s.call.clone(), s.func),
            None => return Err(Error::BadArguments { call: format!("#{sym}"), reason: "no such function".into() }),
        };
        if let Some(f) = func {
            return Ok(f);
        }
        match st.backend.resolve(ext, &name) {
            Ok(f) => {
                st.symbols[sym].func = Some(f);
                Ok(f)
            }
            Err(BackendError::UnknownSymbol) => {
                let extension = st.extensions.get(ext).map(|e| e.0.clone()).unwrap_or_default();
                Err(Error::UnknownSymbol { extension, symbol: name.to_string() })
            }
            Err(BackendError::Usage(reason)) => Err(Error::BadArguments { call: call.to_string(), reason }),
            Err(BackendError::TimedOut | BackendError::Closed) => {
                Err(self.fault_error(&st, FaultKind::Vanished, Some(call.to_string())))
            }
            Err(BackendError::Fault(kind)) => Err(self.fault_error(&st, kind, Some(call.to_string()))),
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
        let mut g = self.lock_for(name, call)?;
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
        if let Some(e) = self.disabled_error(&g.borrow()) {
            return Err(e);
        }
        let fault = {
            let mut st = g.borrow_mut();
            // The call's wrong result must not be replayed as history: the caller retries the call itself.
            let st = &mut *st;
            let index = st.symbol_index.get(ext).and_then(|m| m.get(symbol)).copied();
            st.shadow.drop_last_history(|s| Some(s) == index);
            let call = index.and_then(|i| st.symbols.get(i)).map_or_else(|| symbol.to_string(), |s| s.call.to_string());
            Fault { kind, domain: self.name.clone(), call: Some(call), incarnation: st.incarnation }
        };
        self.recover(&mut g, fault)
    }

    /// Bookkeeping after a successful call: handles, shadow log, destroyed instances.
    fn after_success(
        &self,
        g: &Guard<'_>,
        sym: usize,
        fpolicy: &FunctionPolicy,
        args: &[Arg<'_>],
        ret: RetType,
        value: Value,
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
        if fpolicy.state {
            let args = args.iter().map(OwnedArg::from_arg).collect();
            let entry = ShadowEntry { symbol: sym, args, ret, created, history: false, replay: Duration::ZERO };
            match fpolicy.replaces_same {
                Some(key) => st.shadow.record_replacing(entry, key),
                None => st.shadow.record(entry),
            }
        } else if fpolicy.history && self.isolation() != crate::policy::Isolation::None {
            // (No history without isolation: nothing recovers such a domain, so nothing would replay it.)
            let ext = st.symbols.get(sym).map_or(0, |s| s.ext);
            let bounds = st.extensions.get(ext).map(|e| HistoryBounds {
                bytes: usize::try_from(e.1.history_mb).unwrap_or(usize::MAX).saturating_mul(1 << 20),
                replay: e.1.history_replay,
            });
            if let Some(bounds) = bounds.filter(|b| b.bytes > 0 && !b.replay.is_zero()) {
                let took = st.symbols[sym].times.last();
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

    /// One try of a call on the current incarnation.
    fn attempt(
        &self,
        g: &mut Guard<'_>,
        sym: usize,
        args: &mut [Arg<'_>],
        ret: RetType,
        timeout: Duration,
        replaying: bool,
    ) -> Outcome {
        let func = match self.resolved(g, sym) {
            Ok(f) => f,
            Err(Error::Fault(f)) => return Outcome::Failed(f.kind),
            Err(e) => return Outcome::Error(e),
        };
        if g.borrow().backend.is_direct() {
            let gated = g.borrow().backend.gated(func);
            return match gated {
                Some(call) => self.attempt_gated(g, sym, call, args, ret, timeout, replaying),
                None => self.attempt_direct(g, sym, func, args, ret),
            };
        }
        let (incarnation, rewrite) = {
            let st = g.borrow();
            (st.incarnation, st.rewrite_for(sym))
        };
        let frame = {
            let mut st = g.borrow_mut();
            let rewrite = rewrite.as_ref().map(|(from, to)| (from.as_c_str(), to.as_bytes_with_nul()));
            let wire = match self.translate(&mut st, args, sym, replaying, rewrite) {
                Ok(w) => w,
                Err(e) => return Outcome::Error(e),
            };
            let st = &mut *st;
            match st.backend.begin(&mut st.tracker, func, &wire, ret) {
                Ok(f) => f,
                Err(e) => return backend_outcome(e, st.symbols.get(sym)),
            }
        };
        // The deadline bounds the domain's own time in this call: time the host spends serving a callback (which
        // may include nested calls) moves it later by as much, and nothing else does. An extension that keeps
        // calling back in a loop therefore still runs out of time.
        // Fixed at the first look (most replies come before it): a clock read is a tenth of a polling round trip.
        let mut deadline = Deadline::after(timeout);
        loop {
            let step = g.borrow_mut().backend.wait(&frame, &mut deadline);
            match step {
                Ok(Step::Done(regs)) => {
                    let mut st = g.borrow_mut();
                    let mut outputs: Vec<&mut [u8]> = args
                        .iter_mut()
                        .filter_map(|a| match a {
                            Arg::Out(b) | Arg::InOut(b) => Some(&mut **b),
                            _ => None,
                        })
                        .collect();
                    let st = &mut *st;
                    st.backend.finish(&mut st.tracker, frame, &mut outputs);
                    // The domain's own time in the call, read from its deadline: no clock read for a fast call.
                    st.symbols[sym].times.record(deadline.counted());
                    return Outcome::Done(Value::from_regs(ret, regs));
                }
                Ok(Step::Callback { token, slot, regs }) => {
                    if !g.borrow().lent_callbacks.contains_key(&slot) {
                        g.borrow_mut().backend.abandon(frame);
                        return Outcome::Failed(FaultKind::Protocol {
                            what: format!("call of callback slot {slot}, which this domain was never given"),
                        });
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
                    let mut st = g.borrow_mut();
                    if st.incarnation != incarnation {
                        st.backend.abandon(frame);
                        return Outcome::Stale;
                    }
                    let Some(answer) = answer else {
                        st.backend.abandon(frame);
                        return Outcome::Failed(FaultKind::Protocol {
                            what: format!("call of callback slot {slot}, which is no longer registered"),
                        });
                    };
                    if let Err(e) = st.backend.answer_callback(token, answer) {
                        st.backend.abandon(frame);
                        return backend_outcome(e, st.symbols.get(sym));
                    }
                }
                Err(e) => {
                    g.borrow_mut().backend.abandon(frame);
                    return backend_outcome_timeout(e, timeout);
                }
            }
        }
    }

    /// A backend with a gate on the host's thread (mpk): arguments are placed in the domain with the state
    /// borrowed, the call runs with nothing borrowed (a callback may call this domain again), outputs come back.
    #[allow(clippy::too_many_arguments)]
    fn attempt_gated(
        &self,
        g: &mut Guard<'_>,
        sym: usize,
        call: crate::backend::mpk::GatedCall,
        args: &mut [Arg<'_>],
        ret: RetType,
        timeout: Duration,
        replaying: bool,
    ) -> Outcome {
        let (incarnation, rewrite) = {
            let st = g.borrow();
            (st.incarnation, st.rewrite_for(sym))
        };
        let prepared = {
            let mut st = g.borrow_mut();
            let rewrite = rewrite.as_ref().map(|(from, to)| (from.as_c_str(), to.as_bytes_with_nul()));
            let wire = match self.translate(&mut st, args, sym, replaying, rewrite) {
                Ok(w) => w,
                Err(e) => return Outcome::Error(e),
            };
            match call.prepare(&wire) {
                Ok(p) => p,
                Err(e) => return backend_outcome(e, st.symbols.get(sym)),
            }
        };
        let (regs, frame) = prepared;
        // A gated call has no deadline object to read its time from: time it while learning, then now and then.
        let started = g.borrow_mut().symbols[sym].times.time_gated().then(Instant::now);
        let result = if replaying {
            // Recovery holds the lock until the new incarnation has its state back.
            call.run(&regs, timeout)
        } else {
            // Other threads may call the domain meanwhile, each on a stack of its own there. A failure of one of
            // theirs closes the domain under this call, which then ends (`BackendError::Closed`).
            Guard::unlocked(g, || call.run(&regs, timeout))
        };
        // Another call (a nested one, or another thread's) recovered the domain while this one ran or was out in the
        // host: its result means nothing.
        if g.borrow().incarnation != incarnation {
            call.finish(frame, None);
            return Outcome::Stale;
        }
        match result {
            Ok(regs) => {
                let mut outputs: SmallVec<[&mut [u8]; 2]> = args
                    .iter_mut()
                    .filter_map(|a| match a {
                        Arg::Out(b) | Arg::InOut(b) => Some(&mut **b),
                        _ => None,
                    })
                    .collect();
                call.finish(frame, Some(&mut outputs));
                if let Some(started) = started {
                    g.borrow_mut().symbols[sym].times.record(started.elapsed());
                }
                Outcome::Done(Value::from_regs(ret, regs))
            }
            Err(e) => {
                call.finish(frame, None);
                backend_outcome_timeout(e, timeout)
            }
        }
    }

    /// The `none` backend: the function is called right here, host pointers and all.
    fn attempt_direct(&self, g: &Guard<'_>, sym: usize, func: u32, args: &mut [Arg<'_>], ret: RetType) -> Outcome {
        // Private copies of scratch inputs, alive until the call returns.
        let mut copies = Vec::new();
        let (function, regs) = {
            let st = g.borrow();
            let name = &*st.symbols[sym].call;
            let Some(function) = st.backend.direct_function(func) else {
                return Outcome::Error(Error::BadArguments { call: name.into(), reason: "not resolved".into() });
            };
            if let Err(reason) = check_registers(args) {
                return Outcome::Error(Error::BadArguments { call: name.into(), reason });
            }
            let handles = st.handles.lock().unwrap_or_else(|e| e.into_inner());
            let mut unknown = None;
            let packed = crate::call::pack_in_process(
                args,
                &mut copies,
                |h| {
                    handles.object(h).ok_or_else(|| {
                        unknown = Some(h);
                        String::new()
                    })
                },
                |c| Ok(c.stub() as u64),
            );
            let regs = match (packed, unknown) {
                (Ok(regs), _) => regs,
                (Err(_), Some(handle)) => {
                    return Outcome::Error(Error::UnknownHandle { call: name.into(), handle });
                }
                (Err(reason), None) => return Outcome::Error(Error::BadArguments { call: name.into(), reason }),
            };
            (function, regs)
        };
        Outcome::Done(Value::from_regs(ret, function.call(&regs)))
    }

    /// Host arguments to what crosses into the domain: handles to objects, callbacks to lent slots; a string equal
    /// to `rewrite.0` (a switched adapter's plugin path) is sent as `rewrite.1`.
    fn translate<'a>(
        &self,
        st: &mut State,
        args: &'a [Arg<'_>],
        sym: usize,
        replaying: bool,
        rewrite: Option<(&CStr, &'a [u8])>,
    ) -> Result<SmallVec<[WireValue<'a>; 6]>, Error> {
        let name = |st: &State| st.symbols.get(sym).map(|s| s.call.to_string()).unwrap_or_default();
        if let Err(reason) = check_registers(args) {
            return Err(Error::BadArguments { call: name(st), reason });
        }
        let mut out = SmallVec::new();
        for a in args {
            if let Some(scalar) = plain_scalar(a) {
                out.push(scalar);
                continue;
            }
            out.push(match a {
                Arg::I64(_) | Arg::U64(_) | Arg::Ptr(_) | Arg::F64(_) | Arg::F32(_) => continue,
                Arg::In(b) => WireValue::In(b),
                Arg::Out(b) => WireValue::Out(b.len()),
                Arg::InOut(b) => WireValue::InOut(b),
                Arg::Scratch(b) => WireValue::Scratch(b),
                Arg::Str(s) => match rewrite {
                    Some((from, to)) if *s == from => WireValue::Str(to),
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
                    if !st.lent_callbacks.contains_key(&slot) {
                        let held = (*c).clone();
                        let record = st.tracker.track(ResourceKind::Callback, move || drop(held));
                        st.lent_callbacks.insert(slot, record);
                    }
                    WireValue::Callback(slot)
                }
            });
        }
        Ok(out)
    }

    /// Queue a call (of function `name`) with no reply awaited.
    pub fn defer(&self, sym: usize, name: &str, call: &str, args: &[Arg<'_>]) -> Result<(), Error> {
        let mut g = self.lock_for(name, call)?;
        // The hot path, in one borrow: a healthy isolated domain, a resolved function, plain scalar arguments.
        // Anything else (and any failure here, which queues nothing) takes the general path below.
        {
            let mut st = g.borrow_mut();
            let plain = args.len() <= ward_abi::MAX_INT_ARGS && args.iter().all(|a| plain_scalar(a).is_some());
            let func = st.symbols.get(sym).and_then(|s| s.func);
            if let (true, Some(func), true, false) = (plain, func, st.disabled.is_none(), st.backend.is_direct()) {
                let wire: SmallVec<[WireValue<'_>; 6]> = args.iter().filter_map(plain_scalar).collect();
                if st.backend.defer(func, &wire).is_ok() {
                    return Ok(());
                }
            }
        }
        if let Some(e) = self.disabled_error(&g.borrow()) {
            return Err(e);
        }
        if g.borrow().backend.is_direct() {
            // No boundary to batch across: run it now.
            let mut owned: Vec<Arg<'_>> = args.iter().map(reborrow).collect();
            return match self.attempt(&mut g, sym, &mut owned, RetType::Void, self.policy.deadline, false) {
                Outcome::Error(e) => Err(e),
                _ => Ok(()),
            };
        }
        for _ in 0..2 {
            let func = match self.resolved(&g, sym) {
                Ok(f) => f,
                Err(Error::Fault(f)) => {
                    self.recover(&mut g, f)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let rewrite = g.borrow().rewrite_for(sym);
            let result = {
                let mut st = g.borrow_mut();
                let rewrite = rewrite.as_ref().map(|(from, to)| (from.as_c_str(), to.as_bytes_with_nul()));
                let wire = self.translate(&mut st, args, sym, false, rewrite)?;
                st.backend.defer(func, &wire)
            };
            match result {
                Ok(()) => return Ok(()),
                Err(BackendError::Usage(reason)) => {
                    return Err(Error::BadArguments { call: call_name(&g, sym), reason })
                }
                Err(e) => {
                    let kind = match backend_outcome_timeout(e, self.policy.deadline) {
                        Outcome::Failed(k) => k,
                        _ => FaultKind::Vanished,
                    };
                    let fault = self.make_fault(&g, kind, Some(call_name(&g, sym)));
                    // The call had not been queued: queue it again on the new incarnation.
                    self.recover(&mut g, fault)?;
                }
            }
        }
        Err(Error::BadArguments { call: call_name(&g, sym), reason: "the domain failed twice while queueing".into() })
    }

    /// Send queued deferred calls.
    pub fn flush(&self) -> Result<(), Error> {
        let mut g = self.lock_for("flush", "flush")?;
        let r = g.borrow_mut().backend.flush();
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                let kind = match backend_outcome_timeout(e, self.policy.deadline) {
                    Outcome::Failed(k) => k,
                    _ => FaultKind::Vanished,
                };
                let fault = self.make_fault(&g, kind, None);
                self.recover(&mut g, fault.clone())?;
                Err(Error::Fault(fault))
            }
        }
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
        if g.borrow().disabled.is_some() || g.borrow().recovering {
            return;
        }
        let r = g.borrow_mut().backend.ping(&mut Deadline::after(interval));
        let kind = match r {
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

/// The name of function `sym` (for messages and events).
/// The call of function `sym` as faults, events and messages name it.
fn call_name(g: &Guard<'_>, sym: usize) -> String {
    g.borrow().symbols.get(sym).map(|s| s.call.to_string()).unwrap_or_default()
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
fn check_registers(args: &[Arg<'_>]) -> Result<(), String> {
    if args.len() <= ward_abi::MAX_INT_ARGS {
        return Ok(());
    }
    let floats = args.iter().filter(|a| matches!(a, Arg::F64(_) | Arg::F32(_))).count();
    let ints = args.len() - floats;
    if ints > ward_abi::MAX_INT_ARGS || floats > ward_abi::MAX_FLOAT_ARGS {
        return Err(format!(
            "{ints} integer/pointer and {floats} floating-point arguments; ward passes at most {} and {} \
             (in registers)",
            ward_abi::MAX_INT_ARGS,
            ward_abi::MAX_FLOAT_ARGS
        ));
    }
    Ok(())
}

/// What a backend's error means for a call of `function` (None: a call whose function does not matter here).
fn backend_outcome(e: BackendError, function: Option<&Symbol>) -> Outcome {
    let (symbol, call) = function.map_or_else(Default::default, |f| (f.name.to_string(), f.call.to_string()));
    match e {
        BackendError::Fault(k) => Outcome::Failed(k),
        BackendError::TimedOut => Outcome::Failed(FaultKind::Vanished),
        // Another call's failure closed the domain under this one, and recovers it.
        BackendError::Closed => Outcome::Stale,
        BackendError::Usage(reason) => Outcome::Error(Error::BadArguments { call, reason }),
        BackendError::UnknownSymbol => Outcome::Error(Error::UnknownSymbol { extension: String::new(), symbol }),
    }
}

fn backend_outcome_timeout(e: BackendError, timeout: Duration) -> Outcome {
    match e {
        BackendError::TimedOut => Outcome::Failed(FaultKind::Timeout { deadline: timeout }),
        other => backend_outcome(other, None),
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
        Arg::Out(b) | Arg::InOut(b) => Arg::In(b),
        Arg::Scratch(b) => Arg::Scratch(b),
        Arg::Str(s) => Arg::Str(s),
        Arg::Handle(h) => Arg::Handle(*h),
        Arg::Callback(c) => Arg::Callback(c),
    }
}
