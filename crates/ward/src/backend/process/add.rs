//! Adding an extension to a running domain: loaded into the zygote first (so a failing one is refused while the
//! others go on serving), then into the live incarnation by a `load` request on the ring.

use std::os::fd::AsFd;

use ward_abi::RegRet;
use ward_xpc::control::LoadRequest;
use ward_xpc::pool::POOL_OUT;
use ward_xpc::wire::{Message, Status};
use ward_xpc::Deadline;

use super::lending::lock;
use super::receive::protocol;
use super::{spawn, ProcessBackend, KILL_TIMEOUT};
use crate::backend::{BackendError, ExtensionSpec, Refused};
use crate::tracker::Tracker;

/// Room for why a domain could not load an extension (dlerror's message, an init function's result).
const LOAD_REASON_LEN: usize = 1024;

/// The zygote's `load` request for an extension; None when the control socket cannot carry it (a path that is not
/// UTF-8 or too long).
pub(super) fn load_request_text(spec: &ExtensionSpec) -> Option<String> {
    LoadRequest { path: spec.path.to_str()?, init: spec.init.as_deref(), poison: spec.poison }.to_text()
}

impl ProcessBackend {
    /// Ask the zygote to load one more extension. Ok(true): it has it; Ok(false): the zygote answered out of turn
    /// and was stopped (the next one is started with the whole set); Err: the extension is refused.
    pub(super) fn zygote_load(&mut self, request: &str) -> Result<bool, Refused> {
        let refused = |reason: String| Refused { reason, restart: false };
        let Some(z) = self.zygote.as_ref() else {
            return Ok(false);
        };
        if z.control.send(request, None).is_err() {
            self.kill_zygote();
            return Ok(false);
        }
        let deadline = std::time::Instant::now() + spawn::START_TIMEOUT;
        let answer = loop {
            let Some(z) = self.zygote.as_mut() else {
                return Ok(false);
            };
            let answer = z.control.recv(Some(deadline.saturating_duration_since(std::time::Instant::now())));
            match answer {
                // The running incarnation ended meanwhile: its status is for collect_death.
                Ok(Some(m)) if m.text.starts_with("exit ") => z.exit_said = Some(m.text),
                other => break other,
            }
        };
        let expected = self.cfg.extensions.len();
        match answer {
            Ok(Some(m)) if m.text.strip_prefix("loaded ").and_then(|n| n.parse::<usize>().ok()) == Some(expected) => {
                Ok(true)
            }
            Ok(Some(m)) => match m.text.strip_prefix("error ") {
                Some(reason) => Err(refused(reason.to_string())),
                None => {
                    self.kill_zygote();
                    Ok(false)
                }
            },
            // The zygote closed its end (it is dying) or did not answer in time: the extension's constructors or
            // init function killed or hung it.
            other => {
                let closed = matches!(other, Ok(None)) && std::time::Instant::now() < deadline;
                let status = match self.zygote.as_mut() {
                    Some(z) if closed && spawn::wait_dead(z.pidfd.as_fd(), KILL_TIMEOUT) => z.child.wait().ok(),
                    _ => None,
                };
                self.kill_zygote();
                Err(refused(match status {
                    Some(s) => format!("the domain's process died loading it ({s})"),
                    None => format!("loading it did not finish within {} s", spawn::START_TIMEOUT.as_secs()),
                }))
            }
        }
    }

    /// Load one more extension into the running incarnation.
    pub(super) fn load_live(&mut self, tracker: &mut Tracker, spec: &ExtensionSpec) -> Result<(), Refused> {
        let lost = |reason: String| Refused { reason, restart: true };
        let refused = |reason: String| Refused { reason, restart: false };
        let path = spec.path.to_str().ok_or_else(|| refused("its path is not UTF-8".into()))?;
        let init = spec.init.as_deref().unwrap_or("");
        let loan = self
            .lend(tracker, POOL_OUT, None, LOAD_REASON_LEN, true)
            .map_err(|e| refused(format!("cannot lend a buffer for the answer: {e:?}")))?;
        let outcome = self.send_load(path.as_bytes(), init.as_bytes(), spec.poison, loan.rich);
        let answer = match outcome {
            Ok((Status::Ok, ret)) if ret.int == self.cfg.extensions.len() as u64 => Ok(()),
            Ok((Status::Ok, ret)) => Err(lost(format!(
                "the domain loaded it as extension {} where the host expected {}",
                ret.int,
                self.cfg.extensions.len()
            ))),
            Ok((_, ret)) => {
                let mut reason = vec![0u8; (ret.int as usize).min(LOAD_REASON_LEN)];
                let read = lock(&self.pools).output.memory().read_at(loan.rich.offset as usize, &mut reason);
                Err(refused(match read {
                    Ok(()) if !reason.is_empty() => String::from_utf8_lossy(&reason).into_owned(),
                    _ => "the domain could not load it and gave no reason".into(),
                }))
            }
            Err(BackendError::Fault(kind)) => Err(lost(format!("the domain failed loading it: {}", kind.cause()))),
            Err(BackendError::TimedOut) => {
                Err(lost(format!("loading it did not finish within {} s", spawn::START_TIMEOUT.as_secs())))
            }
            Err(BackendError::Usage(what)) => Err(refused(what)),
            Err(BackendError::UnknownSymbol) => Err(lost("the domain answered a load as a resolve".into())),
            // Only an mpk domain is closed under a call.
            Err(BackendError::Closed) => Err(lost("the domain was closed while loading it".into())),
        };
        if let Some(record) = loan.record {
            tracker.release(record);
        }
        answer
    }

    /// Send a Load request and wait for its reply: the status and what it returned.
    fn send_load(
        &mut self,
        path: &[u8],
        init: &[u8],
        poison: bool,
        reason: ward_xpc::RichPtr,
    ) -> Result<(Status, RegRet), BackendError> {
        let load = |id| Message::Load { id, poison, path, init, reason: (reason.offset, reason.len) };
        // Loading runs the extension's constructors.
        self.activity.began();
        let (id, status, ret) = self.request(load, &mut Deadline::after(spawn::START_TIMEOUT))?;
        if status == Status::LoadFailed {
            // Answered, and not a status check_reply knows: pop it here.
            if self.in_flight.last() != Some(&id) {
                return Err(protocol(format!("reply for call {id:#x}, which is not in flight")));
            }
            self.in_flight.pop();
            if self.in_flight.is_empty() {
                self.activity.settled();
            }
            return Ok((status, ret));
        }
        self.check_reply(id, status)?;
        Ok((status, ret))
    }
}
