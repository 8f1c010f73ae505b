//! What comes back from the domain: records of the reply ring copied out and parsed (replies and callbacks only),
//! waiting for them as the pace says, and each reply checked against the innermost call in flight.

use ward_abi::{RegArgs, RegRet};
use ward_xpc::ring::WaitOutcome;
use ward_xpc::wire::{Message, Status};
use ward_xpc::Deadline;

use super::pace::PaceMode;
use super::{placement, ProcessBackend};
use crate::backend::BackendError;
use crate::fault::FaultKind;

/// Handing over, how many times the caller yields its processor to the domain before it sleeps for the reply. A
/// domain that runs there takes it at the first and gives it back when it sleeps after the reply; the rest cover
/// a domain that is preempted or (its move refused) runs elsewhere, for a few tens of microseconds at most.
const HAND_OVER_YIELDS: u32 = 64;

/// A record the domain may send: a reply to a request, or a callback from a call in flight.
pub(super) enum Incoming {
    Reply { id: u64, status: Status, ret: RegRet },
    Callback { id: u64, slot: usize, regs: RegArgs },
}

/// A protocol violation by the domain: a fault of the extension.
pub(super) fn protocol(what: String) -> BackendError {
    BackendError::Fault(FaultKind::Protocol { what })
}

fn op_name(m: &Message<'_>) -> &'static str {
    match m {
        Message::Call { .. } => "call",
        Message::Reply { .. } => "reply",
        Message::Callback { .. } => "callback",
        Message::CallbackReply { .. } => "callback-reply",
        Message::Resolve { .. } => "resolve",
        Message::Ping { .. } => "ping",
        Message::Load { .. } => "load",
    }
}

impl ProcessBackend {
    /// Copy the next reply-ring record into `self.record` and parse it. Only replies and callbacks may come.
    pub(super) fn next_from_domain(&mut self, deadline: &mut Deadline) -> Result<Incoming, BackendError> {
        loop {
            match self.replies.pop(&mut self.record) {
                Err(e) => return Err(protocol(format!("reply ring: {e}"))),
                Ok(Some(len)) => {
                    let message = Message::parse(&self.record[..len])
                        .map_err(|e| protocol(format!("malformed record from the domain: {e}")))?;
                    return match message {
                        Message::Reply { id, status, ret_int, ret_float } => {
                            let cut_short = self.replies.take_cut_short();
                            self.pace.replied(std::time::Instant::now, cut_short);
                            Ok(Incoming::Reply { id, status, ret: RegRet { int: ret_int, float: ret_float } })
                        }
                        Message::Callback { id, slot, ints, floats, .. } => {
                            Ok(Incoming::Callback { id, slot: slot as usize, regs: RegArgs { ints, floats } })
                        }
                        other => Err(protocol(format!("unexpected {} record from the domain", op_name(&other)))),
                    };
                }
                Ok(None) => {
                    self.fault_if_dead()?;
                    // Handing over, the domain runs on this processor: spinning would only keep it waiting.
                    let spin = if self.pace.mode() == PaceMode::HandOver { 0 } else { self.cfg.spin };
                    let Some(live) = &self.live else {
                        return Err(BackendError::Fault(FaultKind::Vanished));
                    };
                    let handing_over = spin == 0;
                    if handing_over {
                        // The ring is empty, as when a wait would look at the deadline: look here, or an extension
                        // that calls back at once, in a loop, would have its next callback ready after every turn.
                        if deadline.passed() && self.replies.is_empty().unwrap_or(true) {
                            return Err(BackendError::TimedOut);
                        }
                        // The domain runs on this processor: yield it, and the reply needs no wake-up, which
                        // the scheduler could deliver on another processor. Sleep only if it is slow to come.
                        let yielded = self
                            .replies
                            .yield_for(HAND_OVER_YIELDS, &|| live.death.is_dead())
                            .map_err(|e| protocol(format!("reply ring: {e}")))?;
                        if yielded.is_some() {
                            continue;
                        }
                    }
                    let held = if handing_over && self.stay.hold() {
                        placement::hold_here().unwrap_or_else(|e| {
                            tracing::debug!(error = %e, "cannot hold the caller on its processor");
                            self.stay.give_up();
                            None
                        })
                    } else {
                        None
                    };
                    // Only a caller that hands over is watched for being woken elsewhere.
                    let slept_on = handing_over.then(placement::current_cpu);
                    let outcome = self.replies.wait(spin, Some(&mut *deadline), &|| live.death.is_dead());
                    drop(held);
                    if let Some(slept_on) = slept_on {
                        self.stay.waited(slept_on != placement::current_cpu());
                    }
                    let outcome = outcome.map_err(|e| protocol(format!("reply ring: {e}")))?;
                    if outcome == WaitOutcome::TimedOut && self.replies.is_empty().unwrap_or(true) {
                        return Err(BackendError::TimedOut);
                    }
                }
            }
        }
    }

    /// The next reply, for a request that cannot serve callbacks (a resolve, a heartbeat). Callbacks of deferred
    /// calls that come first are kept for the next `wait`: the domain answers these requests while it waits for
    /// the callback's answer.
    pub(super) fn next_reply(&mut self, deadline: &mut Deadline) -> Result<(u64, Status, RegRet), BackendError> {
        loop {
            match self.next_from_domain(deadline)? {
                Incoming::Reply { id, status, ret } => return Ok((id, status, ret)),
                Incoming::Callback { id, slot, regs } => self.stashed.push_back((id, slot, regs)),
            }
        }
    }

    /// Expect the reply to the innermost call in flight.
    pub(super) fn check_reply(&mut self, id: u64, status: Status) -> Result<(), BackendError> {
        match self.in_flight.last() {
            Some(&expected) if expected == id => {
                self.in_flight.pop();
                if self.in_flight.is_empty() {
                    self.activity.settled();
                }
            }
            _ => return Err(protocol(format!("reply for call {id:#x}, which is not in flight"))),
        }
        match status {
            Status::Ok => Ok(()),
            Status::UnknownFunction => Err(protocol("the domain does not know a function it resolved".into())),
            Status::BadArgs => Err(protocol("the domain rejected arguments the host built".into())),
            Status::ResolveFailed => Err(BackendError::UnknownSymbol),
            Status::UnknownOp | Status::LoadFailed | Status::Unknown(_) => {
                Err(protocol(format!("unexpected status {status:?}")))
            }
        }
    }
}
