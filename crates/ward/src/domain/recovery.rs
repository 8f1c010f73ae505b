//! The recovery manager (Nooks' recovery manager, MINIX's reincarnation server): after a fault, stop the domain,
//! release what the tracker holds, apply the restart limits and backoff, start a new incarnation and replay the
//! shadow log into it (DESIGN.md §4, steps 3 to 8).

use std::ffi::CString;
use std::path::Path;
use std::time::Instant;

use super::{Domain, Guard, Outcome};
use crate::backend::StartError;
use crate::call::{Arg, Value};
use crate::error::Error;
use crate::events::{Disablement, Event, RestartVia};
use crate::fault::{Fault, FaultKind};
use crate::policy::Isolation;
use crate::shadow::{OwnedArg, ShadowEntry};
use crate::tracker::ResourceKind;

impl Domain {
    /// The recovery manager. Err when the domain ends up disabled.
    pub(super) fn recover(&self, g: &mut Guard<'_>, fault: Fault) -> Result<(), Error> {
        self.recover_counted(g, fault, 0)
    }

    /// The recovery manager, for a fault of a call that has now failed `in_row` times in a row, each time after the
    /// recovery from the one before (0: a fault of no call counted so). Past `max_failures_in_row` of those, or of
    /// restarts that fail in a row, the domain is disabled at once, whatever the restart intensity allows: a call
    /// that keeps failing would otherwise be given up on only as fast as the clock lets restarts pile up.
    pub(super) fn recover_counted(&self, g: &mut Guard<'_>, fault: Fault, in_row: u32) -> Result<(), Error> {
        if g.borrow().recovering {
            // A fault during replay: the outer recovery loop handles it.
            return Err(Error::Fault(fault));
        }
        let started = Instant::now();
        // Real-time callers do not wait for this (`realtime`).
        let _raised = Raised::on(&self.recovering_now);
        // From now on calls keep the counts of failures in a row: none takes the plain path again.
        self.plain_calls.store(false, std::sync::atomic::Ordering::Release);
        self.events.emit(Event::Fault { fault: fault.clone() });
        let mut fault = fault;
        let limit = self.policy.max_failures_in_row;
        let mut restarts_failed = 0u32;
        loop {
            let released = {
                let mut st = g.borrow_mut();
                st.stats.faults += 1;
                st.backend.stop();
                // A real-time call running late ended with the incarnation (its loans go with the rest), and so
                // does one this recovery is under (taken out by the thread waiting for it): what was deferred
                // while it ran is done now.
                if st.late.take().is_some() || self.late_now.load(std::sync::atomic::Ordering::Acquire) {
                    let deferred = self.end_late();
                    self.deferred_at_restart(&mut st, deferred);
                }
                let released = st.tracker.release_all();
                st.instances.clear();
                st.lent_callbacks.clear();
                // Past the restart intensity (at most N restarts in T), the domain is disabled.
                let now = Instant::now();
                let period = self.policy.restart_period;
                while st.restart_times.front().is_some_and(|t| now.duration_since(*t) > period) {
                    st.restart_times.pop_front();
                }
                // A domain about to move to a process domain gets that chance first: the failures in a row were
                // its isolation's, not yet the extension's for good (counted again from the move).
                let escalating = self.escalation_due(st.stats.faults);
                let why = if st.restart_times.len() >= self.policy.max_restarts as usize {
                    Some(Disablement::RestartLimit)
                } else if limit > 0 && in_row >= limit && !escalating {
                    let call = fault.call.clone().unwrap_or_else(|| "a call".into());
                    Some(Disablement::FailedInRow { call, times: in_row })
                } else if limit > 0 && restarts_failed >= limit {
                    Some(Disablement::RestartFailed { times: restarts_failed })
                } else {
                    None
                };
                if let Some(why) = why {
                    st.disabled = Some((fault.clone(), why.clone()));
                    let restarts = st.stats.restarts as u32;
                    let host_gets = host_gets(&st.extensions);
                    drop(st);
                    let domain = self.name.clone();
                    self.events.emit(Event::Disabled { domain, restarts, fault: fault.clone(), why, host_gets });
                    return Err(self.disabled_error(&g.borrow()).unwrap_or(Error::Fault(fault)));
                }
                st.restart_times.push_back(now);
                st.consecutive_faults += 1;
                released
            };
            let backoff = self.policy.backoff(g.borrow().consecutive_faults);
            if !backoff.is_zero() {
                self.events.emit(Event::BackingOff { domain: self.name.clone(), delay: backoff });
                // A policy delay between restarts of a repeatedly failing extension, not synchronisation.
                std::thread::sleep(backoff);
            }
            self.switch_images(g);
            self.escalate_if_due(g);
            g.borrow_mut().recovering = true;
            let result = self.restart_and_replay(g);
            g.borrow_mut().recovering = false;
            match result {
                Ok((via, replayed)) => {
                    let incarnation = g.borrow().incarnation;
                    self.events.emit(Event::Recovered {
                        domain: self.name.clone(),
                        incarnation,
                        via,
                        released,
                        replayed,
                        took: started.elapsed(),
                    });
                    return Ok(());
                }
                Err(failure) => {
                    // Restarting or replaying failed: that is a fault of the new incarnation; go round again
                    // (the restart limit, or `max_failures_in_row` such failures, ends this).
                    restarts_failed += 1;
                    if g.borrow().shadow.replayed_history() {
                        // The history may be what fails (a block the new incarnation cannot take again): the next
                        // try replays the configuration only.
                        g.borrow_mut().shadow.drop_history();
                        tracing::info!(domain = %self.name, "replaying the history failed: history dropped");
                    }
                    fault = Fault {
                        kind: FaultKind::RestartFailed { reason: failure.to_string() },
                        domain: self.name.clone(),
                        call: fault.call.clone(),
                        incarnation: g.borrow().incarnation,
                    };
                    self.events.emit(Event::Fault { fault: fault.clone() });
                }
            }
        }
    }

    /// Whether this domain, having had `faults` faults, moves to a process domain at its next restart.
    fn escalation_due(&self, faults: u64) -> bool {
        let after = u64::from(self.policy.escalate_after);
        self.escalation.is_some() && self.isolation() == Isolation::Mpk && after > 0 && faults >= after
    }

    /// Past `escalate_after` faults, an mpk domain moves to a process domain (UMDF moves a failing driver into a
    /// host process of its own the same way). The restart that follows starts it; the shadow log replays into it.
    fn escalate_if_due(&self, g: &Guard<'_>) {
        let faults = g.borrow().stats.faults;
        let Some(escalation) = self.escalation.as_ref().filter(|_| self.escalation_due(faults)) else { return };
        let from = self.isolation();
        let mut st = g.borrow_mut();
        let st = &mut *st;
        let specs = st.backend.extensions();
        match escalation(specs, &mut st.tracker) {
            Ok(backend) => {
                st.backend = backend;
                // A new isolation: what failed in a row under the old one starts again from nothing.
                for s in &mut st.symbols {
                    s.failures_in_row = 0;
                    s.ok_since_failure = 0;
                }
                *self.isolation.lock().unwrap_or_else(|e| e.into_inner()) = Isolation::Process;
                self.events.emit(Event::Escalated { domain: self.name.clone(), faults, from, to: Isolation::Process });
            }
            Err(why) => {
                tracing::warn!(domain = %self.name, "cannot move to a process domain, staying in mpk: {why}");
            }
        }
    }

    /// Point every extension whose policy names a `restart_from` at that file, once: a directly loaded extension
    /// is loaded from it by the next incarnation; a class adapter's recorded `open` of its plugin is rewritten to
    /// open it instead.
    fn switch_images(&self, g: &Guard<'_>) {
        let mut switched = Vec::new();
        {
            let mut st = g.borrow_mut();
            let st = &mut *st;
            for (index, ((name, policy), image)) in st.extensions.iter().zip(st.images.iter_mut()).enumerate() {
                let Some(to) = policy.restart_from.as_ref().filter(|_| !image.switched) else { continue };
                image.switched = true;
                let to = std::path::absolute(to).unwrap_or_else(|_| to.clone());
                match &image.opened {
                    None => st.backend.replace_image(index, to.clone()),
                    Some(opened) => {
                        let (Ok(from), Ok(to_c)) = (path_cstring(opened), path_cstring(&to)) else { continue };
                        // A backend that loads the plugin itself (mpk) must load the good file for the rewritten
                        // open to find it.
                        st.backend.replace_opened(index, to.clone());
                        // The recorded open is rewritten for the direct backend, which replays it as recorded;
                        // every call that crosses to a domain is rewritten on its way (the retried open included).
                        let symbols = &st.symbols;
                        st.shadow.replace_string(|s| symbols.get(s).is_some_and(|s| s.ext == index), &from, &to_c);
                        image.rewrite = Some((from, to_c));
                        st.rewriting = true;
                    }
                }
                switched.push((name.clone(), to));
            }
        }
        for (extension, path) in switched {
            self.events.emit(Event::ImageSwitched { domain: self.name.clone(), extension, path });
        }
    }

    /// Start a new incarnation and replay the shadow log into it.
    pub(super) fn restart_and_replay(&self, g: &mut Guard<'_>) -> Result<(RestartVia, usize), RecoveryError> {
        let (restarted, zygotes) = {
            let mut st = g.borrow_mut();
            let st = &mut *st;
            // The functions resolved in the old incarnation go first: an mpk domain's hold its memory, which must be
            // let go before the new incarnation maps its own (or a restart needs twice the memory).
            for s in &mut st.symbols {
                s.func = None;
            }
            let restarted = st.backend.restart(&mut st.tracker);
            // A zygote found failed since the last restart (while the last incarnation's end was read) or during
            // this one.
            (restarted, st.backend.take_zygote_failures())
        };
        for how in zygotes {
            self.events.emit(Event::ZygoteReplaced { domain: self.name.clone(), how });
        }
        let via = restarted?;
        {
            let mut st = g.borrow_mut();
            st.incarnation += 1;
            st.stats.incarnation = st.incarnation;
            st.stats.restarts += 1;
            self.incarnation.store(st.incarnation, std::sync::atomic::Ordering::Relaxed);
        }
        // Taken out rather than copied (the history may hold many MiB); nothing records while the lock is held
        // for the replay, and the entries go back whatever the replay gives.
        let entries = g.borrow_mut().shadow.take_entries();
        let replayed = entries.iter().try_for_each(|entry| self.replay(g, entry));
        let count = entries.len();
        g.borrow_mut().shadow.put_back(entries);
        replayed.map(|()| (via, count))
    }

    fn replay(&self, g: &mut Guard<'_>, entry: &ShadowEntry) -> Result<(), RecoveryError> {
        let mut scratch: Vec<Vec<u8>> = entry
            .args
            .iter()
            .filter_map(|a| match a {
                OwnedArg::Out(n) => Some(vec![0u8; *n]),
                OwnedArg::InOut(b) => Some(b.clone()),
                _ => None,
            })
            .collect();
        let mut scratch_iter = scratch.iter_mut();
        let mut args: Vec<Arg<'_>> = Vec::with_capacity(entry.args.len());
        for a in &entry.args {
            args.push(match a {
                OwnedArg::I64(v) => Arg::I64(*v),
                OwnedArg::U64(v) => Arg::U64(*v),
                OwnedArg::F64(v) => Arg::F64(*v),
                OwnedArg::F32(v) => Arg::F32(*v),
                OwnedArg::Ptr(v) => Arg::Ptr(*v),
                OwnedArg::In(b) => Arg::In(b),
                OwnedArg::Scratch(b) => Arg::Scratch(b),
                OwnedArg::Str(s) => Arg::Str(s),
                OwnedArg::Handle(h) => Arg::Handle(*h),
                OwnedArg::Callback(c) => Arg::Callback(c),
                OwnedArg::Out(_) => Arg::Out(scratch_iter.next().map(|v| v.as_mut_slice()).unwrap_or_default()),
                OwnedArg::InOut(_) => Arg::InOut(scratch_iter.next().map(|v| v.as_mut_slice()).unwrap_or_default()),
            });
        }
        let (name, timeout) = {
            let st = g.borrow();
            match st.symbols.get(entry.symbol) {
                Some(s) => {
                    let policy = st.extensions.get(s.ext).map_or(&self.policy, |e| &e.1);
                    (s.call.clone(), super::learn::deadline(&s.policy, policy, &s.times).0)
                }
                None => (Default::default(), self.policy.deadline),
            }
        };
        match self.attempt(g, entry.symbol, &mut args, entry.ret, timeout, true) {
            Outcome::Done(value) => {
                // A replayed call warms the new incarnation as a live one would (see `realtime`'s warm calls).
                {
                    let mut st = g.borrow_mut();
                    let incarnation = st.incarnation;
                    if let Some(s) = st.symbols.get_mut(entry.symbol) {
                        if s.realtime_incarnation != incarnation {
                            s.realtime_incarnation = incarnation;
                            s.realtime_calls = 0;
                        }
                        s.realtime_calls = s.realtime_calls.saturating_add(1);
                    }
                }
                if let (Some(handle), Value::Handle(object)) = (entry.created, value) {
                    let mut st = g.borrow_mut();
                    st.handles.lock().unwrap_or_else(|e| e.into_inner()).rebind(handle, object);
                    let handles = st.handles.clone();
                    let record = st.tracker.track(ResourceKind::Instance, move || {
                        if let Ok(mut h) = handles.lock() {
                            h.rebind(handle, 0);
                        }
                    });
                    st.instances.insert(handle, record);
                }
                Ok(())
            }
            Outcome::Failed(kind) => {
                Err(RecoveryError::Replay { call: name.to_string(), why: ReplayFailure::Fault(kind) })
            }
            Outcome::Stale => Err(RecoveryError::Replay { call: name.to_string(), why: ReplayFailure::Restarted }),
            Outcome::Error(e) => {
                Err(RecoveryError::Replay { call: name.to_string(), why: ReplayFailure::Refused(Box::new(e)) })
            }
        }
    }
}

/// A flag raised for as long as this lives.
struct Raised<'a>(&'a std::sync::atomic::AtomicBool);

impl<'a> Raised<'a> {
    fn on(flag: &'a std::sync::atomic::AtomicBool) -> Raised<'a> {
        flag.store(true, std::sync::atomic::Ordering::Release);
        Raised(flag)
    }
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Why a recovery could not bring a domain back; a fault of its own ([`FaultKind::RestartFailed`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecoveryError {
    /// The backend could not start the new incarnation.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The new incarnation did not take a call of its shadow log.
    #[error("replaying {call}: {why}")]
    Replay { call: String, why: ReplayFailure },
}

/// Why a replayed call did not go through.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplayFailure {
    #[error("{}", .0.cause())]
    Fault(FaultKind),
    #[error("the domain restarted")]
    Restarted,
    #[error("{0}")]
    Refused(Box<Error>),
}

/// What the host gets from a disabled domain's extensions, when they all say the same (a class's bypass).
fn host_gets(extensions: &[(String, crate::policy::ExtensionPolicy)]) -> Option<String> {
    let first = extensions.first()?.1.when_disabled.as_ref()?;
    extensions.iter().all(|e| e.1.when_disabled.as_ref() == Some(first)).then(|| first.clone())
}

pub(super) fn path_cstring(path: &Path) -> Result<CString, std::ffi::NulError> {
    CString::new(path.as_os_str().as_encoded_bytes())
}
