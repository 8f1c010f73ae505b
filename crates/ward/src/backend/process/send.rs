//! What goes to the domain: records pushed on the request ring and published, deferred calls collected into batch
//! records, and requests that are not calls (a resolve, a ping, a load) sent and waited for.

use ward_abi::RegRet;
use ward_xpc::ring::RingError;
use ward_xpc::wire::{ArgKind, Message, RetKind, Status, WireArg};
use ward_xpc::Deadline;

use super::pace::PaceMode;
use super::ProcessBackend;
use crate::backend::{BackendError, WireValue};
use crate::call::RetType;
use crate::fault::FaultKind;

/// Deferred records are published at least this often, so a long batch keeps the domain busy.
const DEFER_BATCH: u32 = 64;

/// The wire form of a scalar argument; None for buffers and strings.
pub(super) fn scalar_wire(a: &WireValue<'_>) -> Option<WireArg> {
    Some(match a {
        WireValue::Int(v) => WireArg { kind: ArgKind::Int, pool: 0, a: *v, b: 0 },
        WireValue::F64(v) => WireArg { kind: ArgKind::F64, pool: 0, a: v.to_bits(), b: 0 },
        WireValue::F32(v) => WireArg { kind: ArgKind::F32, pool: 0, a: u64::from(v.to_bits()), b: 0 },
        WireValue::Callback(slot) => WireArg { kind: ArgKind::Callback, pool: 0, a: *slot as u64, b: 0 },
        WireValue::In(_) | WireValue::Out(_) | WireValue::InOut(_) | WireValue::Scratch(_) | WireValue::Str(_) => {
            return None
        }
    })
}

/// How the domain is to read a call's return value.
pub(super) fn ret_kind(ret: RetType) -> RetKind {
    match ret {
        RetType::Void => RetKind::Void,
        RetType::I64 | RetType::Handle => RetKind::Int,
        RetType::F64 => RetKind::F64,
        RetType::F32 => RetKind::F32,
    }
}

impl ProcessBackend {
    /// Send a request that is not a call (a resolve, a ping, a load) and wait for its reply, keeping callbacks of
    /// deferred calls that come first for the next `wait`. `message` makes the record from the request's id.
    pub(super) fn request<'m>(
        &mut self,
        message: impl FnOnce(u64) -> Message<'m>,
        deadline: &mut Deadline,
    ) -> Result<(u64, Status, RegRet), BackendError> {
        self.fault_if_dead()?;
        self.close_batch()?;
        let id = self.next_id;
        self.next_id += 1;
        self.pace_request();
        let len = self.encode(&message(id))?;
        self.push(len)?;
        self.publish_request();
        self.in_flight.push(id);
        self.next_reply(deadline)
    }

    /// Push one record; if the ring is full, publish and wait for the domain to make room.
    pub(super) fn push(&mut self, len: usize) -> Result<(), BackendError> {
        if self.callbacks_open > 0 {
            ward_xpc::wire::mark_nested(&mut self.record[..len]);
        }
        if self.pace.mode() == PaceMode::HandOver {
            ward_xpc::wire::mark_hand_over(&mut self.record[..len]);
        }
        loop {
            match self.requests.push(&self.record[..len]) {
                Ok(()) => return Ok(()),
                Err(RingError::Full) => {
                    self.requests.publish();
                    self.fault_if_dead()?;
                    std::hint::spin_loop();
                }
                Err(e) => return Err(BackendError::Fault(FaultKind::Protocol { what: format!("request ring: {e}") })),
            }
        }
    }

    pub(super) fn encode(&mut self, message: &Message<'_>) -> Result<usize, BackendError> {
        message.emit(&mut self.record).map_err(|e| BackendError::Usage(format!("cannot encode the call: {e}")))
    }

    /// Put the collected deferred calls on the ring as one batch record (not yet published). Everything else that
    /// goes on the ring closes the batch first, so calls reach the domain in the order the host made them.
    pub(super) fn close_batch(&mut self) -> Result<(), BackendError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let id = self.next_id;
        self.next_id += 1;
        let len = {
            let record = self.batch.finish(id);
            self.record[..record.len()].copy_from_slice(record);
            record.len()
        };
        self.batch.clear();
        self.push(len)
    }

    /// Publish deferred records in batches, so a long run of them keeps the domain busy without a wake-up each.
    pub(super) fn after_deferred_push(&mut self) {
        self.deferred_unpublished += 1;
        if self.deferred_unpublished >= DEFER_BATCH {
            self.requests.publish();
            self.deferred_unpublished = 0;
        }
    }
}
