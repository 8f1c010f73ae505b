//! Recovery events: every fault, restart, replay, retry and disablement goes to `tracing` and to every subscriber.

use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Mutex;
use std::time::Duration;

use crate::fault::{Fault, FaultKind};
use crate::tracker::Released;

/// How a new incarnation was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartVia {
    /// Forked from the warm zygote.
    Zygote,
    /// A new `ward-domain` process was spawned and loaded the extensions.
    Spawn,
    /// The extension was loaded again in this process.
    Reload,
    /// The domain's memory was restored from the snapshot taken after it was loaded and initialised (mpk).
    Snapshot,
}

/// Why a domain was disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disablement {
    /// Past the restart intensity (`max_restarts` within `restart_period_s`).
    RestartLimit,
    /// One call failed this many times in a row, each time again after its recovery (`max_failures_in_row`).
    FailedInRow { call: String, times: u32 },
    /// Restarting the domain failed this many times in a row (`max_failures_in_row`).
    RestartFailed { times: u32 },
}

impl std::fmt::Display for Disablement {
    /// What follows "disabled": "after X failed 3 times in a row, each time again after its recovery".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Disablement::RestartLimit => f.write_str("at its restart limit"),
            Disablement::FailedInRow { call, times } => {
                write!(f, "after {call} failed {times} times in a row, each time again after its recovery")
            }
            Disablement::RestartFailed { times } => write!(f, "after restarting it failed {times} times in a row"),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Event {
    /// A domain failed.
    Fault { fault: Fault },
    /// A failed domain is running again: resources released, new incarnation, shadow log replayed.
    Recovered {
        domain: String,
        incarnation: u64,
        via: RestartVia,
        released: Released,
        replayed: usize,
        /// From the fault's detection to ready (replay included).
        took: Duration,
    },
    /// The call in flight was retried on the new incarnation.
    Retried { domain: String, call: String, ok: bool },
    /// Waiting before a restart (repeated faults).
    BackingOff { domain: String, delay: Duration },
    /// The domain is disabled (`why`): calls fail fast, and the host gets `host_gets` (a class's bypass; `None`:
    /// its calls fail).
    Disabled { domain: String, restarts: u32, fault: Fault, why: Disablement, host_gets: Option<String> },
    /// After its first failure, an extension restarts from another file (its policy's `restart_from`).
    ImageSwitched { domain: String, extension: String, path: PathBuf },
    /// An mpk domain failed `escalate_after` times: it runs in a process domain from now on.
    Escalated { domain: String, faults: u64, from: crate::policy::Isolation, to: crate::policy::Isolation },
    /// A process domain's zygote failed (it did not answer a fork request or report how an incarnation ended
    /// within the policy's deadline, answered out of turn, or died): it was killed and reaped, and restarts come
    /// from a new one. `how` says what it did; `Timeout` names the deadline it missed.
    ZygoteReplaced { domain: String, how: FaultKind },
    /// This machine lacks some protections of the process domains' sandbox (said once per supervisor, at its first
    /// process domain): each entry names the protection and what still holds. The domains run with the rest.
    SandboxIncomplete { missing: Vec<String> },
    /// A domain's history outgrew a bound (`history_mb` or `history_replay_ms`; said once per domain): from now on
    /// a restart replays only the most recent data calls, so a plugin's state after a recovery may differ from the
    /// uninterrupted run. Informational: nothing failed.
    HistoryWindowed { domain: String, history_mb: u64, history_replay_ms: u64 },
    /// A class's output check found the same kind of wrong output again right after the recovery the first one
    /// caused: it is the extension's own (a native host gets it too), so it is passed on as written, and that
    /// check stops for the instance (said once per instance).
    OwnOutput { domain: String, call: String, what: String },
    /// A real-time call missed its real-time deadline (`deadline`), its caller went on without it, and it returned
    /// later, after `took` of the domain's time, within the function's normal deadline: late, not hung. Its
    /// outputs were dropped; it is logged as made. Informational: nothing failed.
    Late { domain: String, call: String, deadline: Duration, took: Duration },
}

impl Event {
    /// Whether the event only informs (nothing failed, nothing was recovered): hosts' users see it when they ask
    /// for detail (`ward run -v`), not otherwise.
    pub fn is_informational(&self) -> bool {
        matches!(self, Event::HistoryWindowed { .. } | Event::Late { .. })
    }
}

/// One line per event, for logs and standard error.
impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::Fault { fault } => write!(f, "{}: fault: {fault}", fault.domain),
            Event::Recovered { domain, incarnation, via, replayed, took, .. } => {
                let via = match via {
                    RestartVia::Zygote => "forked from the zygote",
                    RestartVia::Spawn => "spawned",
                    RestartVia::Reload => "reloaded",
                    RestartVia::Snapshot => "restored from its snapshot",
                };
                write!(
                    f,
                    "{domain}: recovered in {:.2} ms (incarnation {incarnation}, {via}, {replayed} calls replayed)",
                    took.as_secs_f64() * 1e3
                )
            }
            Event::Retried { domain, call, ok: true } => write!(f, "{domain}: {call} retried: succeeded"),
            Event::Retried { domain, call, ok: false } => write!(f, "{domain}: {call} retried: failed again"),
            Event::BackingOff { domain, delay } => {
                write!(f, "{domain}: backing off {:.1} ms before restarting", delay.as_secs_f64() * 1e3)
            }
            Event::Disabled { domain, restarts, fault, why, host_gets } => {
                match why {
                    Disablement::RestartLimit => write!(f, "{domain}: disabled after {restarts} restarts")?,
                    why => write!(f, "{domain}: disabled {why}")?,
                }
                let host_gets = host_gets.as_deref().unwrap_or("its calls fail");
                write!(f, " (last fault: {fault}); from now on {host_gets}")
            }
            Event::ImageSwitched { domain, extension, path } => {
                write!(f, "{domain}: {extension} restarts from {} (restart_from)", path.display())
            }
            Event::Escalated { domain, faults, from, to } => {
                write!(f, "{domain}: isolation {from} failed {faults} times: it runs with isolation {to} from now on")
            }
            Event::ZygoteReplaced { domain, how } => {
                write!(f, "{domain}: zygote failed ({}): killed, restarts come from a new one", how.cause())
            }
            Event::SandboxIncomplete { missing } => {
                write!(f, "this machine lacks part of the process domains' sandbox (running with the rest): ")?;
                write!(f, "{}", missing.join("; "))
            }
            Event::HistoryWindowed { domain, history_mb, history_replay_ms } => write!(
                f,
                "{domain}: history past its bound ({history_mb} MiB, {history_replay_ms} ms of replay): a restart \
                 replays only the most recent data calls, so the plugin's state after a recovery may differ from the \
                 uninterrupted run"
            ),
            Event::OwnOutput { domain, call, what } => write!(
                f,
                "{domain}: {call}: {what} again after its recovery: it is the plugin's own output, passed on as \
                 written (as natively); this instance's output is not checked from now on"
            ),
            Event::Late { domain, call, deadline, took } => write!(
                f,
                "{domain}: real-time call {call} missed its deadline of {:.2} ms and returned late, after {:.2} ms \
                 (its results dropped, the block bypassed; not a hang)",
                deadline.as_secs_f64() * 1e3,
                took.as_secs_f64() * 1e3
            ),
        }
    }
}

/// Events a subscriber has not read are kept up to this many; older ones are dropped (a host that never reads
/// must not grow without bound).
const QUEUE: usize = 4096;

#[derive(Default)]
pub(crate) struct EventBus {
    subscribers: Mutex<Vec<SyncSender<Event>>>,
}

impl EventBus {
    pub fn subscribe(&self) -> Receiver<Event> {
        let (tx, rx) = sync_channel(QUEUE);
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).push(tx);
        rx
    }

    pub fn emit(&self, event: Event) {
        match &event {
            Event::Fault { fault } => tracing::warn!(domain = %fault.domain, "fault: {fault}"),
            Event::Recovered { domain, incarnation, via, replayed, took, .. } => tracing::info!(
                domain = %domain, incarnation, ?via, replayed, took_us = took.as_micros() as u64, "recovered"
            ),
            Event::Retried { domain, call, ok } => {
                tracing::info!(domain = %domain, call = %call, ok, "retried")
            }
            Event::BackingOff { domain, delay } => {
                tracing::info!(domain = %domain, delay_us = delay.as_micros() as u64, "backing off")
            }
            Event::Disabled { domain, restarts, fault, why, .. } => {
                tracing::error!(domain = %domain, restarts, "disabled {why}; last: {fault}")
            }
            Event::Escalated { domain, faults, from, to } => {
                tracing::warn!(domain = %domain, faults, %from, %to, "isolation escalated")
            }
            Event::ImageSwitched { domain, extension, path } => {
                tracing::warn!(domain = %domain, extension = %extension, path = %path.display(), "restarts from")
            }
            Event::ZygoteReplaced { domain, how } => {
                tracing::warn!(domain = %domain, "zygote failed ({}): replaced", how.cause())
            }
            Event::SandboxIncomplete { missing } => tracing::warn!("sandbox incomplete: {}", missing.join("; ")),
            Event::HistoryWindowed { domain, history_mb, history_replay_ms } => tracing::info!(
                domain = %domain, history_mb, history_replay_ms, "history past its bound: restarts replay a window"
            ),
            Event::OwnOutput { domain, call, what } => {
                tracing::warn!(domain = %domain, call = %call, "wrong output again after recovery, passed on: {what}")
            }
            Event::Late { domain, call, deadline, took } => tracing::info!(
                domain = %domain, call = %call, deadline_us = deadline.as_micros() as u64,
                took_us = took.as_micros() as u64, "real-time call returned late"
            ),
        }
        let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subs.retain(|tx| !matches!(tx.try_send(event.clone()), Err(TrySendError::Disconnected(_))));
    }
}
