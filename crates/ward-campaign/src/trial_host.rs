//! Inside a trial's throwaway host: run the workload, natively or under ward, and say what happened in a
//! [`HostReport`], which the host prints as one JSON line for the campaign to judge. Whatever the extension does
//! to this process ends here.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use ward::libfault::LibraryFault;
use ward::{Event, FaultKind, Isolation, Supervisor};

use crate::workload::{Entry, Recorder, Span, Symbols, Workload};

/// Exit status of a host that could not set itself up (it prints `error MESSAGE` on stdout first): a broken
/// campaign, not an outcome.
pub const SETUP_FAILED: i32 = 125;

/// What one host saw. A native host fills in only `output`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReport {
    /// The workload's output.
    pub output: Vec<Entry>,
    /// Every fault ward reported, in order.
    pub faults: Vec<SeenFault>,
    /// Restarts of the extension's domain.
    pub restarts: u64,
    /// The domain ended disabled (past its restart limit).
    pub disabled: bool,
    /// Every hang ward detected, with how long it took.
    pub hangs: Vec<HangDetection>,
    /// ward refused or failed to load the extension; the workload did not run.
    pub load_error: Option<String>,
    /// Why each call the class wrapper bypassed (a plugin's block or frame it could not process) was bypassed.
    #[serde(default)]
    pub bypassed: Vec<String>,
}

/// A fault as ward reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenFault {
    /// `signal`, `exit`, `timeout`, `heartbeat`, `protocol` or `vanished`.
    pub kind: String,
    /// `null dereference (SIGSEGV at 0x0)`.
    pub cause: String,
    /// The call in flight.
    pub call: Option<String>,
}

/// A call past its deadline, and how long after the attempt began ward stopped waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HangDetection {
    pub call: Option<String>,
    pub deadline_us: u64,
    pub detected_after_us: u64,
}

/// Why a trial's host could not set itself up (the workload's own failures are part of its report).
#[derive(Debug, thiserror::Error)]
pub enum TrialHostError {
    #[error("cannot start the event listener thread: {0}")]
    ListenerThread(std::io::Error),
}

/// Run `workload` natively; `symbols` are the extension's, loaded into this process.
pub fn run_native(workload: &dyn Workload, symbols: &dyn Symbols) -> HostReport {
    let mut out = Recorder::new(Instant::now());
    workload.run_native(symbols, &mut out);
    HostReport { output: out.into_entries(), ..HostReport::default() }
}

/// Run `workload` on the extension at `path` under ward with `isolation` and every call's deadline `deadline` (none:
/// ward's default policy, see [`Workload::policy`]); after a
/// failure the extension restarts from `restart_from` when given; with `library_fault`, the extension's domain runs
/// with that run-time library fault (policy `library_fault`: it needs isolation `process` or `mpk`, and hits the calls
/// of the file at `path`, so a restart from another file runs without it). Fails only if this host cannot set itself
/// up.
///
/// The restarts reported are those of the extension's domain when the workload ended; when the workload could not
/// load the extension at all (a plugin whose opening failed even after recovery, say), they are unknown and
/// reported as 0, and the faults ward reported say what happened.
pub fn run_ward(
    workload: &dyn Workload,
    path: &Path,
    isolation: Isolation,
    deadline: Option<Duration>,
    restart_from: Option<&Path>,
    library_fault: Option<LibraryFault>,
    poison: bool,
) -> Result<HostReport, TrialHostError> {
    let origin = Instant::now();
    let mut policy = workload.policy(deadline);
    let name = ward::extension_name(path);
    if let Some(good) = restart_from {
        policy.extension_mut(&name).restart_from = Some(good.to_path_buf());
    }
    if let Some(fault) = library_fault {
        policy.extension_mut(&name).library_fault = Some(Some(fault));
    }
    if poison {
        policy.extension_mut(&name).poison = Some(true);
    }
    let sup = Supervisor::new(policy);
    let listener = Listener::start(sup.subscribe(), origin)?;
    let mut out = Recorder::new(origin);
    let (restarts, disabled, load_error) = match workload.run_ward(&sup, path, isolation, &mut out) {
        Ok(ext) => {
            let stats = ext.stats();
            (stats.restarts, stats.disabled, None)
        }
        Err(e) => (0, false, Some(e.to_string())),
    };
    let bypassed = out.bypasses().to_vec();
    let events = listener.finish();
    let hangs = hang_detections(&events, out.spans());
    let faults = events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Fault { fault } => {
                Some(SeenFault { kind: fault.kind_name().to_string(), cause: fault.cause(), call: fault.call.clone() })
            }
            _ => None,
        })
        .collect();
    Ok(HostReport { output: out.into_entries(), faults, restarts, disabled, hangs, load_error, bypassed })
}

/// Receives ward's events on a thread of its own and notes when each arrived: events are emitted inside the
/// calls, so only a second thread can time them.
struct Listener {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(Duration, Event)>>,
}

/// How long the listener waits for an event before it looks at the stop flag again; it bounds how long
/// [`Listener::finish`] takes, nothing else.
const LISTEN_POLL: Duration = Duration::from_millis(20);

impl Listener {
    fn start(events: Receiver<Event>, origin: Instant) -> Result<Listener, TrialHostError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("campaign-events".into())
            .spawn(move || {
                let mut seen = Vec::new();
                loop {
                    match events.recv_timeout(LISTEN_POLL) {
                        Ok(e) => seen.push((origin.elapsed(), e)),
                        // Every event of the workload was queued before the flag was set: the queue is empty now.
                        Err(RecvTimeoutError::Timeout) if flag.load(Ordering::Acquire) => return seen,
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return seen,
                    }
                }
            })
            .map_err(TrialHostError::ListenerThread)?;
        Ok(Listener { stop, thread })
    }

    /// Every event so far, with when it arrived.
    fn finish(self) -> Vec<(Duration, Event)> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or_default()
    }
}

/// For each timeout: the time from the start of the attempt that hung (the call's start, or the end of the
/// recovery before its retry) to the fault.
pub fn hang_detections(events: &[(Duration, Event)], spans: &[Span]) -> Vec<HangDetection> {
    let mut hangs = Vec::new();
    let mut last_recovery: Option<Duration> = None;
    for (at, event) in events {
        match event {
            Event::Recovered { .. } => last_recovery = Some(*at),
            Event::Fault { fault } => {
                let FaultKind::Timeout { deadline } = fault.kind else { continue };
                let call_start = spans.iter().rev().find(|s| s.start <= *at).map_or(Duration::ZERO, |s| s.start);
                let attempt_start = last_recovery.filter(|r| *r >= call_start).unwrap_or(call_start);
                hangs.push(HangDetection {
                    call: fault.call.clone(),
                    deadline_us: deadline.as_micros() as u64,
                    detected_after_us: at.saturating_sub(attempt_start).as_micros() as u64,
                });
            }
            _ => {}
        }
    }
    hangs
}

#[cfg(test)]
mod tests {
    use super::*;
    use ward::{Fault, RestartVia};

    fn timeout(call: &str) -> Event {
        Event::Fault {
            fault: Fault {
                kind: FaultKind::Timeout { deadline: Duration::from_millis(200) },
                domain: "well".into(),
                call: Some(call.into()),
                incarnation: 1,
            },
        }
    }

    fn recovered() -> Event {
        Event::Recovered {
            domain: "well".into(),
            incarnation: 2,
            via: RestartVia::Zygote,
            released: Default::default(),
            replayed: 0,
            took: Duration::from_millis(1),
        }
    }

    #[test]
    fn times_each_hang_from_its_attempt() {
        let ms = Duration::from_millis;
        let spans = [Span { start: ms(0), end: ms(1) }, Span { start: ms(10), end: ms(430) }];
        // The second call hangs, is recovered at 212 ms, retried, and hangs again.
        let events = [(ms(211), timeout("well_sum")), (ms(212), recovered()), (ms(413), timeout("well_sum"))];
        let hangs = hang_detections(&events, &spans);
        let after: Vec<u64> = hangs.iter().map(|h| h.detected_after_us).collect();
        assert_eq!(after, [201_000, 201_000]);
        assert!(hangs.iter().all(|h| h.deadline_us == 200_000 && h.call.as_deref() == Some("well_sum")));
    }
}
