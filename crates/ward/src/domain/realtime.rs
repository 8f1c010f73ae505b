//! Calls from a real-time thread (an audio host's process callback, due every period): such a thread must never
//! wait for a recovery. A fault in its call fails the call at once (the class bypasses that block) and the domain is
//! recovered on a thread of its own; its calls meanwhile fail at once too. Its deadline is the learned one without
//! the floor, but never below one period (eight times that for a new incarnation's first calls, which fault their
//! pages in): a hang costs the periods the plugin's own slowest blocks would, not the floor made for calls of any
//! kind. The domain's process gets the caller's real-time scheduling, so the audio thread does not wait for a
//! process the scheduler ranks below every ordinary one. And checkpoints: a state the class read from the extension (a plugin's saved
//! state), logged as the call that restores it, in place of the instance's earlier one.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{call_name, learn, Domain, Guard, Outcome};
use crate::backend::process::placement;
use crate::call::{Arg, RetType, Value};
use crate::error::Error;
use crate::fault::{Fault, FaultKind};
use crate::shadow::{OwnedArg, ShadowEntry};

/// Real-time calls of a new incarnation whose deadline is [`WARM_SLACK`] times the learned one.
const WARM_CALLS: u32 = 16;
const WARM_SLACK: u32 = 8;

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
        if self.recovering_now.load(Ordering::Acquire) {
            return Err(recovering());
        }
        // Another thread's call (a worker's, a state save) may hold the domain for a while: wait at most a period.
        let Some(mut g) = self.lock.try_lock_for(period) else { return Err(recovering()) };
        if self.recovering_now.load(Ordering::Acquire) {
            return Err(recovering());
        }
        let (fpolicy, timeout) = {
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
            (s.policy.clone(), timeout)
        };
        self.schedule_like_caller(&mut g);
        let kind = match self.attempt(&mut g, sym, args, ret, timeout, false) {
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
        let fault = {
            let st = g.borrow();
            Fault { kind, domain: self.name.clone(), call: Some(call_name(&g, sym)), incarnation: st.incarnation }
        };
        let in_row = {
            let mut st = g.borrow_mut();
            let s = &mut st.symbols[sym];
            s.failures_in_row = s.failures_in_row.saturating_add(1);
            s.ok_since_failure = 0;
            s.failures_in_row
        };
        // Failing again right after a recovery that replayed the history: the history may be what brings the fault
        // back (a plugin that fails at its Nth block), so the next incarnation gets the configuration only, as a
        // normal call's retry would (see `call_locked`).
        if in_row > 1 && g.borrow().shadow.replayed_history() {
            g.borrow_mut().shadow.drop_history();
            tracing::info!(domain = %self.name, "failed again after the history was replayed: history dropped");
        }
        self.recover_apart(g, fault.clone(), in_row);
        Err(Error::Fault(fault))
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
    /// but on a thread of its own.
    pub(crate) fn declare_fault_apart(
        self: &Arc<Self>,
        ext: usize,
        symbol: &str,
        kind: FaultKind,
    ) -> Result<(), Error> {
        let g = self.lock.lock();
        let fault = self.declared_fault(&g, ext, symbol, kind)?;
        self.recover_apart(g, fault, 0);
        Ok(())
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
