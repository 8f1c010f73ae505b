//! Calls from a real-time thread (an audio host's process callback, due every period): such a thread must never
//! wait for a recovery. A fault in its call fails the call at once (the class bypasses that block) and the domain is
//! recovered on a thread of its own; its calls meanwhile fail at once too. Its deadline is the learned one without
//! the floor, but never below one period (eight times that for a new incarnation's first calls, which fault their
//! pages in). A call that misses it is late, not yet hung: its caller gets an error at once (the block is bypassed)
//! and the call, still in the domain, is handed over to the domain's late-call thread (one for the domain's life,
//! started at its first late call, taking them from a queue), which waits for it with the function's
//! normal deadline, the one a call from any other thread gets. Returned in time, it is done as a success is (the
//! shadow log's history keeps it, from copies of its inputs taken before its caller returned; its duration is
//! learned) but its outputs are dropped; past that deadline it is a hang, recovered there. Until then the domain's
//! real-time calls fail at once, and any other thread that takes the domain waits for the late call first; but a
//! look that sends the domain nothing does not wait for it: `stats` and `pid` answer what they were at the hand-over
//! (only the late call changes them until it ends), and a fault declared or an output reported meanwhile is deferred
//! to the end of the late call, done there by whoever waited for it, the domain still held. A
//! domain whose functions run on the caller's own thread (mpk) cannot hand a call over: its real-time deadline is
//! a hang's, as before. The domain's process gets the caller's real-time scheduling, so the audio thread does not
//! wait for a process the scheduler ranks below every ordinary one. And checkpoints: a state the class read from the
//! extension (a plugin's saved state), logged as the call that restores it, in place of the instance's earlier one.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ward_xpc::Deadline;

use super::{abandon, call_name, learn, stats_of, Domain, Guard, Outcome, RingEnd, RingRun, State, UnfinishedRing};
use crate::backend::process::placement;
use crate::backend::{BackendError, Callable, Frame};
use crate::call::{Arg, RetType, Value};
use crate::error::Error;
use crate::events::Event;
use crate::fault::{Fault, FaultKind};
use crate::policy::FunctionPolicy;
use crate::shadow::{OwnedArg, ShadowEntry};

/// Real-time calls of a new incarnation whose deadline is [`WARM_SLACK`] times the learned one.
const WARM_CALLS: u32 = 16;
const WARM_SLACK: u32 = 8;

/// A real-time call that missed its real-time deadline, still in the domain (see the module's comment). It owns what
/// it needs: its pool loans stay allocated until it returns or its incarnation ends, and its arguments are copies.
pub(super) struct LateCall {
    sym: usize,
    frame: Frame,
    ret: RetType,
    incarnation: u64,
    /// Its arguments as a success logs them (outputs as their lengths), copied before its caller returned.
    args: Vec<OwnedArg>,
    policy: FunctionPolicy,
    /// The real-time deadline it missed.
    missed: Duration,
    /// The function's normal deadline: the domain's own time it may take in all.
    deadline: Duration,
    /// The domain's own time in it when it was handed over, and when that was.
    counted: Duration,
    handed: Instant,
}

/// What a thread asked of the domain while a late call held it, done once that call ends (by whoever waited for it,
/// with the domain still held), so the asker does not wait for it.
pub(super) enum Deferred {
    /// [`Domain::declare_fault_apart`] of incarnation `incarnation`: recovered then if that incarnation still runs;
    /// if a recovery ended it first (the late call hung), that recovery drops the call's wrong result from the
    /// history as the declaration would have.
    /// `history_dropped`: its result was dropped from the history already, before the late call was logged.
    Fault { ext: usize, symbol: String, kind: FaultKind, incarnation: u64, history_dropped: bool },
    /// [`Domain::report_own_output`].
    OwnOutput { ext: usize, symbol: String, what: String },
}

/// Drop from the history the wrong result a class declared of `symbol` (of extension `ext`): its last call's.
pub(super) fn drop_declared_result(st: &mut State, ext: usize, symbol: &str) {
    let index = st.symbol_index.get(ext).and_then(|m| m.get(symbol)).copied();
    st.shadow.drop_last_history(|s| Some(s) == index);
}

/// `args` as a call's arguments: buffers taken as they are (an input is moved into the history, not copied), an
/// output given a buffer of its length from `outputs` (in order).
fn borrow_owned<'a>(args: &'a mut [OwnedArg], outputs: &'a mut [Vec<u8>]) -> Vec<Arg<'a>> {
    let mut outputs = outputs.iter_mut();
    args.iter_mut()
        .map(|a| match a {
            OwnedArg::I64(v) => Arg::I64(*v),
            OwnedArg::U64(v) => Arg::U64(*v),
            OwnedArg::F64(v) => Arg::F64(*v),
            OwnedArg::F32(v) => Arg::F32(*v),
            OwnedArg::Ptr(v) => Arg::Ptr(*v),
            OwnedArg::In(b) => Arg::InVec(b),
            OwnedArg::Out(_) => Arg::Out(outputs.next().map(|v| v.as_mut_slice()).unwrap_or_default()),
            OwnedArg::InOut(b) => Arg::InOut(b),
            OwnedArg::Scratch(b) => Arg::Scratch(b),
            OwnedArg::Str(s) => Arg::Str(s),
            OwnedArg::Handle(h) => Arg::Handle(*h),
            OwnedArg::Callback(c) => Arg::Callback(c),
        })
        .collect()
}

impl Domain {
    /// Give the domain's process, once per incarnation, the real-time scheduling of the calling thread when it has
    /// one: a real-time host's audio thread would otherwise wait for a domain the scheduler ranks below every
    /// ordinary process. Where that is not allowed (no `CAP_SYS_NICE`, no `RLIMIT_RTPRIO`), it is said once and the
    /// domain runs as it did.
    fn schedule_like_caller(&self, g: &mut Guard<'_>) {
        let incarnation = g.borrow().incarnation;
        if self.realtime_scheduled.swap(incarnation, Ordering::Relaxed) == incarnation {
            return;
        }
        let Some(scheduling) = placement::realtime_scheduling() else { return };
        let Some(pid) = g.borrow().backend.pid() else { return };
        if let Err(e) = placement::schedule_process(pid, scheduling) {
            if !self.realtime_said.swap(true, Ordering::Relaxed) {
                tracing::warn!(domain = %self.name, error = %e, "the domain cannot be given the real-time scheduling of its caller");
            }
        }
    }

    /// Call `sym` from a real-time thread whose calls are due every `period` (see the module's comment).
    pub(crate) fn call_realtime(
        self: &Arc<Self>,
        sym: usize,
        args: &mut [Arg<'_>],
        ret: RetType,
        period: Duration,
    ) -> Result<Value, Error> {
        let recovering = || Error::Recovering { domain: self.name.clone() };
        let busy = || Error::Busy { domain: self.name.clone() };
        if self.recovering_now.load(Ordering::Acquire) {
            return Err(recovering());
        }
        // Whoever waits for the late call holds the domain: this call would wait for it.
        if self.late_now.load(Ordering::Acquire) {
            return Err(busy());
        }
        // Another thread's call (a worker's, a state save) may hold the domain for a while: wait at most a period.
        let Some(mut g) = self.lock.try_lock_for(period) else { return Err(recovering()) };
        if self.recovering_now.load(Ordering::Acquire) {
            return Err(recovering());
        }
        if self.late_now.load(Ordering::Acquire) {
            return Err(busy());
        }
        let (fpolicy, timeout, normal) = {
            let mut st = g.borrow_mut();
            if let Some(e) = self.disabled_error(&st) {
                return Err(e);
            }
            let incarnation = st.incarnation;
            let st = &mut *st;
            let s = st
                .symbols
                .get_mut(sym)
                .ok_or_else(|| Error::BadArguments { call: format!("#{sym}"), reason: "no such function".into() })?;
            if s.realtime_incarnation != incarnation {
                s.realtime_incarnation = incarnation;
                s.realtime_calls = 0;
            }
            let ext_policy = &st.extensions[s.ext].1;
            let (normal, source) = learn::deadline(&s.policy, ext_policy, &s.times);
            // A new incarnation's first calls fault its pages in and fill its caches: they get WARM_SLACK times the
            // learned deadline, not one they would miss for nothing, nor the floor.
            let slack = if s.realtime_calls >= WARM_CALLS { 1 } else { WARM_SLACK };
            let timeout = match (source, s.times.learned()) {
                (learn::DeadlineSource::Learned, Some(learned)) => (learned.max(period) * slack).min(normal),
                _ => normal,
            };
            (s.policy.clone(), timeout, normal)
        };
        self.schedule_like_caller(&mut g);
        // A call whose real-time deadline is shorter than its normal one, through rings (its domain serves it on a
        // thread of its own), is handed over when it misses the first; one on this thread (mpk) cannot be.
        let outcome = match self.resolved(&g, sym) {
            Ok(Callable::Ring(func)) if timeout < normal => {
                match self.attempt_ring_realtime(&mut g, sym, func, args, ret, timeout, normal, &fpolicy) {
                    Ok(outcome) => outcome,
                    Err(late) => return Err(self.hand_over(g, late)),
                }
            }
            _ => self.attempt(&mut g, sym, args, ret, timeout, false),
        };
        let kind = match outcome {
            Outcome::Done(value) => {
                let value = self.after_success(&g, sym, &fpolicy, args, ret, value);
                let mut st = g.borrow_mut();
                let s = &mut st.symbols[sym];
                s.realtime_calls = s.realtime_calls.saturating_add(1);
                return Ok(value);
            }
            Outcome::Error(e) => return Err(e),
            Outcome::Failed(kind) => kind,
            // Recovered under this call by another thread: nothing left to do but skip this block.
            Outcome::Stale => return Err(self.disabled_error(&g.borrow()).unwrap_or_else(recovering)),
        };
        let (fault, in_row) = self.realtime_fault(&g, sym, kind);
        self.recover_apart(g, fault.clone(), in_row);
        Err(Error::Fault(fault))
    }

    /// A real-time call of `sym` failed with `kind`: the fault, counted in a row. Failing again right after a
    /// recovery that replayed the history: the history may be what brings the fault back (a plugin that fails at
    /// its Nth block), so the next incarnation gets the configuration only, as a normal call's retry would (see
    /// `call_locked`).
    fn realtime_fault(&self, g: &Guard<'_>, sym: usize, kind: FaultKind) -> (Fault, u32) {
        let fault = {
            let st = g.borrow();
            Fault { kind, domain: self.name.clone(), call: Some(call_name(g, sym)), incarnation: st.incarnation }
        };
        let in_row = {
            let mut st = g.borrow_mut();
            let s = &mut st.symbols[sym];
            s.failures_in_row = s.failures_in_row.saturating_add(1);
            s.ok_since_failure = 0;
            s.failures_in_row
        };
        if in_row > 1 && g.borrow().shadow.replayed_history() {
            g.borrow_mut().shadow.drop_history();
            tracing::info!(domain = %self.name, "failed again after the history was replayed: history dropped");
        }
        (fault, in_row)
    }

    /// A real-time ring call of `sym` with real-time deadline `timeout`: its outcome, or, when the deadline passed
    /// with the call still in the domain, the call as it is to be handed over. Its buffers are copied through the
    /// pools, never lent in place: the call may outlive its caller's buffers.
    #[allow(clippy::too_many_arguments)]
    fn attempt_ring_realtime(
        &self,
        g: &mut Guard<'_>,
        sym: usize,
        func: u32,
        args: &mut [Arg<'_>],
        ret: RetType,
        timeout: Duration,
        normal: Duration,
        policy: &FunctionPolicy,
    ) -> Result<Outcome, Box<LateCall>> {
        let unfinished = match self.run_ring(g, sym, func, args, ret, timeout, false, false) {
            RingRun::Done(outcome) => return Ok(outcome),
            RingRun::Unfinished(unfinished) => unfinished,
        };
        let UnfinishedRing { frame, end, incarnation, deadline } = *unfinished;
        match end {
            RingEnd::Backend(BackendError::TimedOut) => {
                // Taken now: the caller's buffers are its own again once it returns.
                let args = args.iter().map(OwnedArg::from_arg).collect();
                Err(Box::new(LateCall {
                    sym,
                    frame,
                    ret,
                    incarnation,
                    args,
                    policy: policy.clone(),
                    missed: timeout,
                    deadline: normal,
                    counted: deadline.counted(),
                    handed: Instant::now(),
                }))
            }
            end => {
                abandon(g, frame);
                Ok(self.ring_outcome(g, end, sym, timeout))
            }
        }
    }

    /// Hand the call `late` over, letting go of the domain: the domain's late-call thread waits for it (where that
    /// thread cannot be started, this one). What its caller gets.
    fn hand_over(self: &Arc<Self>, g: Guard<'_>, late: Box<LateCall>) -> Error {
        let error = Error::Late { domain: self.name.clone(), call: call_name(&g, late.sym), deadline: late.missed };
        {
            // What `stats` and `pid` answer until it ends: the thread waiting for it holds the domain.
            let st = g.borrow();
            *self.late_view.lock().unwrap_or_else(|e| e.into_inner()) = (stats_of(&st), st.backend.pid());
        }
        g.borrow_mut().late = Some(late);
        self.late_now.store(true, Ordering::Release);
        drop(g);
        if !self.queue_late() {
            let mut g = self.lock.lock();
            self.settle_late(&mut g);
        }
        error
    }

    /// Give the late call just handed over to the domain's late-call thread, starting it on first need: one thread
    /// for the domain's life, not one per late call (a plugin late at every block would start one per block).
    /// False when there is no such thread and none can be started.
    fn queue_late(self: &Arc<Self>) -> bool {
        let mut waiter = self.late_waiter.lock().unwrap_or_else(|e| e.into_inner());
        // The thread is gone only if it panicked: a new one is started.
        if let Some(sender) = waiter.as_ref() {
            if sender.send(Arc::clone(self)).is_ok() {
                return true;
            }
        }
        let (sender, queue) = mpsc::channel::<Arc<Domain>>();
        // It holds no domain between calls: each comes with the domain it is late in, let go once settled. The
        // domain holds the queue's sender: when the domain goes, so does the thread.
        let started = std::thread::Builder::new().name("ward-late".into()).spawn(move || {
            for domain in queue {
                let mut g = domain.lock.lock();
                domain.settle_late(&mut g);
            }
        });
        if started.is_err() {
            *waiter = None;
            return false;
        }
        let queued = sender.send(Arc::clone(self)).is_ok();
        *waiter = Some(sender);
        queued
    }

    /// Wait for the real-time call running late in the domain, if one is, until it returns or its normal deadline
    /// passes: returned, it is done as a success is, its outputs dropped; else it is a fault of its function,
    /// recovered here. Then what was deferred while it ran. Every thread that takes the domain to send it something
    /// does this first.
    pub(super) fn settle_late(&self, g: &mut Guard<'_>) {
        if !self.late_now.load(Ordering::Acquire) {
            return;
        }
        // None: this thread is waiting for it already, and calls the domain from a callback of it.
        let Some(late) = g.borrow_mut().late.take() else { return };
        let deferred = self.wait_late(g, late);
        self.run_deferred(g, deferred);
    }

    /// No late call holds the domain any more: what was deferred meanwhile, to be done now.
    pub(super) fn end_late(&self) -> Vec<Deferred> {
        let mut deferred = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        self.late_now.store(false, Ordering::Release);
        std::mem::take(&mut *deferred)
    }

    /// Defer `what` until the late call holding the domain ends; given back when none does any more.
    pub(super) fn defer_while_late(&self, what: Deferred) -> Result<(), Deferred> {
        let mut deferred = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        // Read with `deferred` held: it is cleared only so (`end_late`), which then takes this.
        if !self.late_now.load(Ordering::Acquire) {
            return Err(what);
        }
        deferred.push(what);
        Ok(())
    }

    /// Do what was deferred, with the domain held.
    pub(super) fn run_deferred(&self, g: &mut Guard<'_>, deferred: Vec<Deferred>) {
        for what in deferred {
            match what {
                Deferred::OwnOutput { ext, symbol, what } => self.own_output(&g.borrow(), ext, &symbol, what),
                Deferred::Fault { ext, symbol, kind, incarnation, history_dropped } => {
                    if g.borrow().incarnation != incarnation {
                        // Recovered meanwhile: the result it was about is gone with its incarnation.
                        continue;
                    }
                    // An error is the domain disabled: its calls say so from now on.
                    if let Ok(fault) = self.declared_fault(g, ext, &symbol, kind, !history_dropped) {
                        let _ = self.recover_counted(g, fault, 0);
                    }
                }
            }
        }
    }

    /// The late call's incarnation ends in a recovery: what was deferred while it ran, done as far as it still
    /// means something. A declared fault of that incarnation has its wrong result dropped from the history (the
    /// recovery it asked for is this one).
    pub(super) fn deferred_at_restart(&self, st: &mut State, deferred: Vec<Deferred>) {
        for what in deferred {
            match what {
                Deferred::OwnOutput { ext, symbol, what } => self.own_output(st, ext, &symbol, what),
                Deferred::Fault { ext, symbol, incarnation, history_dropped: false, .. }
                    if incarnation == st.incarnation =>
                {
                    drop_declared_result(st, ext, &symbol);
                }
                Deferred::Fault { .. } => {}
            }
        }
    }

    /// The late call returned and is about to be logged: the wrong results that faults declared meanwhile are about
    /// came before it, and are dropped from the history first (after it, each would be the late call's own).
    fn drop_declared_before_late(&self, st: &mut State, deferred: &mut [Deferred]) {
        for what in deferred {
            if let Deferred::Fault { ext, symbol, incarnation, history_dropped, .. } = what {
                if *incarnation == st.incarnation && !*history_dropped {
                    drop_declared_result(st, *ext, symbol);
                    *history_dropped = true;
                }
            }
        }
    }

    /// Say that the output of `symbol` (of extension `ext`) is its own ([`Event::OwnOutput`]).
    pub(super) fn own_output(&self, st: &State, ext: usize, symbol: &str, what: String) {
        let index = st.symbol_index.get(ext).and_then(|m| m.get(symbol)).copied();
        let call = index.and_then(|i| st.symbols.get(i)).map_or_else(|| symbol.to_string(), |s| s.call.to_string());
        self.events.emit(Event::OwnOutput { domain: self.name.clone(), call, what });
    }

    /// [`Domain::settle_late`]'s wait, which ends the late state: what was deferred meanwhile.
    fn wait_late(&self, g: &mut Guard<'_>, late: Box<LateCall>) -> Vec<Deferred> {
        let LateCall { sym, frame, ret, incarnation, mut args, policy, missed, deadline: normal, counted, handed } =
            *late;
        if g.borrow().incarnation != incarnation {
            // It ended with its incarnation (recovery drops it; this is only a second guard).
            return self.end_late();
        }
        // What is left of the normal deadline, counted from the hand-over.
        let gap = handed.elapsed();
        let mut deadline = Deadline::after(normal.saturating_sub(counted).saturating_sub(gap));
        deadline.instant();
        let regs = match self.wait_ring(g, &frame, &mut deadline, incarnation) {
            Ok(regs) => regs,
            Err(end) => {
                abandon(g, frame);
                match self.ring_outcome(g, end, sym, normal) {
                    Outcome::Failed(kind) => {
                        let (fault, in_row) = self.realtime_fault(g, sym, kind);
                        // An error here is the domain disabled: its calls say so from now on.
                        let _ = self.recover_counted(g, fault, in_row);
                    }
                    // Recovered under it by a nested call.
                    Outcome::Stale | Outcome::Done(_) => {}
                    Outcome::Error(e) => tracing::debug!(domain = %self.name, error = %e, "a late call ended"),
                }
                return self.end_late();
            }
        };
        let took = counted + gap + deadline.counted();
        {
            let mut st = g.borrow_mut();
            let st = &mut *st;
            // Its outputs go nowhere: the caller went on without them.
            if let Some(ring) = st.backend.ring() {
                ring.finish(&mut st.tracker, frame, &mut []);
            }
            let s = &mut st.symbols[sym];
            s.times.record(took);
            s.realtime_calls = s.realtime_calls.saturating_add(1);
        }
        // Logged from the copies taken before its caller returned: a replay gives the extension what it really got.
        let mut outputs: Vec<Vec<u8>> = args
            .iter()
            .filter_map(|a| match a {
                OwnedArg::Out(n) => Some(vec![0u8; *n]),
                _ => None,
            })
            .collect();
        let mut borrowed = borrow_owned(&mut args, &mut outputs);
        // Its history entry is charged at most the deadline it missed: past that it mostly waited (for a processor,
        // say), which a replay does not, and charged all of it, one late block could push the whole history out.
        let replay = Some(took.min(missed));
        let value = Value::from_regs(ret, regs);
        let deferred = {
            // Held until the late state ends: a fault declared meanwhile is about a result before this call's.
            let mut deferred = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
            self.drop_declared_before_late(&mut g.borrow_mut(), &mut deferred);
            let _ = self.after_success_charged(g, sym, &policy, &mut borrowed, ret, value, replay);
            self.late_now.store(false, Ordering::Release);
            std::mem::take(&mut *deferred)
        };
        let call = call_name(g, sym);
        self.events.emit(Event::Late { domain: self.name.clone(), call, deadline: missed, took });
        deferred
    }

    /// Recover from `fault` (of a call that failed `in_row` times in a row) on a thread of its own, letting go of
    /// the lock `g` first; real-time calls fail at once until it is done. Where no thread can be started, here.
    fn recover_apart(self: &Arc<Self>, g: Guard<'_>, fault: Fault, in_row: u32) {
        self.recovering_now.store(true, Ordering::Release);
        drop(g);
        let domain = Arc::clone(self);
        let apart = fault.clone();
        let spawned = std::thread::Builder::new().name("ward-recovery".into()).spawn(move || {
            let mut g = domain.lock.lock();
            // An error here is the domain disabled: its calls say so from now on.
            let _ = domain.recover_counted(&mut g, apart, in_row);
            drop(g);
            domain.recovering_now.store(false, Ordering::Release);
        });
        if spawned.is_err() {
            let mut g = self.lock.lock();
            let _ = self.recover_counted(&mut g, fault, in_row);
            drop(g);
            self.recovering_now.store(false, Ordering::Release);
        }
    }

    /// A class found the result of a real-time call of `symbol` wrong: recover as [`Domain::declare_fault`] does,
    /// but on a thread of its own. While a late call holds the domain, the declaration waits for it to end, on the
    /// thread that waits for it: the caller does not.
    pub(crate) fn declare_fault_apart(
        self: &Arc<Self>,
        ext: usize,
        symbol: &str,
        kind: FaultKind,
    ) -> Result<(), Error> {
        let incarnation = self.incarnation.load(Ordering::Acquire);
        let mut declared =
            Deferred::Fault { ext, symbol: symbol.to_string(), kind, incarnation, history_dropped: false };
        loop {
            // Taken before the late call's thread took it, the domain is held here with the late state set, which
            // only a holder changes: the declaration is deferred all the same.
            let g = self.lock_unless_late();
            declared = match self.defer_while_late(declared) {
                Ok(()) => return Ok(()),
                Err(back) => back,
            };
            // It ended meanwhile: the domain is free again.
            let Some(g) = g else { continue };
            let Deferred::Fault { kind, .. } = declared else { return Ok(()) };
            let fault = self.declared_fault(&g, ext, symbol, kind, true)?;
            self.recover_apart(g, fault, 0);
            return Ok(());
        }
    }

    /// Run `f` holding the domain for this thread: other threads' calls wait (real-time ones at most a period, then
    /// fail with [`Error::Recovering`]); this thread's calls go ahead.
    pub(crate) fn exclusively<T>(&self, f: impl FnOnce() -> T) -> T {
        let _held = self.lock.lock();
        f()
    }

    /// Log a call of `sym` with `args` as made, without making it: a checkpoint of the instance whose handle is
    /// its first handle argument, in place of that instance's earlier checkpoint (see `ShadowLog::checkpoint`).
    pub(crate) fn record_checkpoint(&self, sym: usize, args: &[Arg<'_>], ret: RetType) -> Result<(), Error> {
        let g = self.lock.lock();
        let mut st = g.borrow_mut();
        if st.symbols.get(sym).is_none() {
            return Err(Error::BadArguments { call: format!("#{sym}"), reason: "no such function".into() });
        }
        let handle = args.iter().find_map(|a| if let Arg::Handle(h) = a { Some(*h) } else { None });
        let args = args.iter().map(OwnedArg::from_arg).collect();
        let entry = ShadowEntry { symbol: sym, args, ret, created: None, history: false, replay: Duration::ZERO };
        st.shadow.checkpoint(entry, handle);
        Ok(())
    }
}
