//! Lending a call's buffers to the domain: copied through the shared pools (inputs into the read-only one, outputs
//! and scratch into the writable one), or lent in place where they lie in a block of the host's arena.
//!
//! The arena blocks the live incarnation holds (`ward_xpc::arena`), and what it is told about them on its control
//! socket: a block's descriptor the first time a call lends the block (read-only for an input or scratch, read-write
//! for an output), and to drop blocks the host has freed since, or the least recently lent ones beyond its share of
//! descriptors. Nothing here makes a system call for a block the domain already holds as it is lent.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use ward_xpc::arena::{self, host, BlockMessage, BlockRef, POOL_ARENA};
use ward_xpc::control::ControlSocket;
use ward_xpc::pool::{HostPool, Lease, POOL_IN, POOL_OUT};
use ward_xpc::wire::{ArgKind, WireArg};

use super::send::scalar_wire;
use super::ProcessBackend;
use crate::backend::{BackendError, Loan, Loans, WireValue};
use crate::tracker::{Releaser, ResourceKind, Tracker};

pub(crate) struct Lending {
    /// The incarnation's control socket.
    channel: ControlSocket,
    /// The blocks it holds.
    held: HashMap<u64, Held>,
    clock: u64,
    /// `host::retired()` when the held blocks were last checked for freed ones.
    retired_seen: u64,
    /// Blocks it may hold at once.
    cap: usize,
}

struct Held {
    writable: bool,
    last_lent: u64,
}

impl Lending {
    /// For an incarnation reached on `channel` whose descriptor limit is `open_files`: it may hold a quarter of
    /// them as blocks (the extension keeps the rest).
    pub fn new(channel: ControlSocket, open_files: u64) -> Lending {
        let cap = usize::try_from(open_files / 4).unwrap_or(usize::MAX).clamp(1, 256);
        Lending { channel, held: HashMap::new(), clock: 0, retired_seen: host::retired(), cap }
    }

    /// See that the domain holds `block`, writable if `writable`, before a call names it. `busy` says whether a
    /// block is lent to a call in flight (never dropped to make room). False when it cannot be given: the caller
    /// copies the buffer instead.
    pub fn ensure(&mut self, block: u64, writable: bool, busy: impl Fn(u64) -> bool) -> bool {
        self.clock += 1;
        self.drop_retired();
        let known = match self.held.get_mut(&block) {
            Some(h) if h.writable || !writable => {
                h.last_lent = self.clock;
                return true;
            }
            Some(_) => true,
            None => false,
        };
        if !known && !self.make_room(&busy) {
            return false;
        }
        let Some(fd) = host::descriptor(block, writable) else { return false };
        // Never waits: a domain that does not read its socket gets copies instead.
        if self.channel.offer(&BlockMessage::Lend { block, writable }.to_text(), Some(fd.as_fd())).is_err() {
            return false;
        }
        self.held.insert(block, Held { writable, last_lent: self.clock });
        true
    }

    /// Tell the domain to drop the blocks it holds that the host has freed (checked only when some lent block was).
    fn drop_retired(&mut self) {
        let now = host::retired();
        if now == self.retired_seen {
            return;
        }
        let freed: Vec<u64> = self.held.keys().copied().filter(|&b| !host::is_live(b)).collect();
        let mut told = true;
        for block in freed {
            told &= self.tell_drop(block);
        }
        if told {
            self.retired_seen = now;
        }
    }

    fn tell_drop(&mut self, block: u64) -> bool {
        let sent = self.channel.offer(&BlockMessage::Drop { block }.to_text(), None).is_ok();
        if sent {
            self.held.remove(&block);
        }
        sent
    }

    /// Below the cap, dropping the least recently lent blocks no call in flight uses.
    fn make_room(&mut self, busy: &impl Fn(u64) -> bool) -> bool {
        while self.held.len() >= self.cap {
            let victim = self.held.iter().filter(|(b, _)| !busy(**b)).min_by_key(|(_, h)| h.last_lent).map(|(b, _)| *b);
            match victim {
                Some(block) if self.tell_drop(block) => {}
                _ => return false,
            }
        }
        true
    }
}

/// Buffers in the host's arena at least this large are lent in place; smaller ones cost less to copy than the
/// domain's two protection changes.
const LEND_IN_PLACE_MIN: usize = 64 << 10;

/// The domain's two pools: inputs (read-only in the domain) and outputs and scratch (writable there).
pub(super) struct Pools {
    pub(super) input: HostPool,
    pub(super) output: HostPool,
}

/// Shared with the tracker, which frees a loan's buffer when the loan's record is released.
pub(super) type SharedPools = Arc<Mutex<Pools>>;

/// The pools, even if a thread panicked holding them (each operation leaves them consistent).
pub(super) fn lock(pools: &SharedPools) -> std::sync::MutexGuard<'_, Pools> {
    pools.lock().unwrap_or_else(|e| e.into_inner())
}

/// The tracker gives a lent buffer back to its pool through this: the token is the pool and the lease's slot (one
/// word) and the lease's generation, so a record is made without a closure (nor an allocation) per buffer.
impl Releaser for Mutex<Pools> {
    fn release(&self, token: [u64; 2]) {
        let (pool_id, slot, generation) = ((token[0] >> 32) as u32, token[0] as u32 as usize, token[1]);
        let mut p = self.lock().unwrap_or_else(|e| e.into_inner());
        if pool_id == POOL_IN {
            p.input.free_slot(slot, generation);
        } else {
            p.output.free_slot(slot, generation);
        }
    }
}

/// The token of a lease of pool `pool_id`, for [`Releaser::release`]; `None` for a slot number past 32 bits (a pool
/// has far fewer slots).
fn lease_token(pool_id: u32, lease: &Lease) -> Option<[u64; 2]> {
    let (slot, generation) = lease.slot_and_generation();
    let slot = u32::try_from(slot).ok()?;
    Some([u64::from(pool_id) << 32 | u64::from(slot), generation])
}

impl ProcessBackend {
    /// Lend a `len`-byte buffer of pool `pool_id` (filled with `bytes` if given) for one call; its record in the
    /// tracker frees it.
    pub(super) fn lend(
        &mut self,
        tracker: &mut Tracker,
        pool_id: u32,
        bytes: Option<&[u8]>,
        len: usize,
        output: bool,
    ) -> Result<Loan, BackendError> {
        let mut pools = lock(&self.pools);
        let pool = if pool_id == POOL_IN { &mut pools.input } else { &mut pools.output };
        let lease =
            pool.alloc(len).map_err(|e| BackendError::Usage(format!("cannot lend a {len}-byte buffer: {e}")))?;
        if let Some(b) = bytes {
            pool.write(&lease, b).map_err(|e| BackendError::Usage(format!("cannot fill a lent buffer: {e}")))?;
        }
        let rich = lease.rich;
        let Some(token) = lease_token(pool_id, &lease) else {
            pool.free(lease);
            return Err(BackendError::Usage(format!("cannot lend a {len}-byte buffer: slot number out of range")));
        };
        drop(pools);
        let record = tracker.track_by(ResourceKind::PoolBuffer, &self.releaser, token);
        Ok(Loan { record: Some(record), pool: pool_id, rich, output })
    }

    /// Lend `bytes` in place if they lie in one block of the host's arena (and are worth it, and no call in flight
    /// has their pages): the wire argument naming them, and its loan. None: copy them through a pool instead.
    fn lend_in_place(&mut self, bytes: &[u8], kind: ArgKind, output: bool) -> Option<(WireArg, Loan)> {
        if !self.arena || bytes.len() < LEND_IN_PLACE_MIN {
            return None;
        }
        let at = arena::host::locate(bytes.as_ptr(), bytes.len())?;
        let offset = at.to_wire()?;
        let len = bytes.len() as u64;
        let pages = arena::pages_of(offset, len);
        if self.in_place_pages.iter().any(|&(a, b)| a < pages.1 && pages.0 < b) {
            return None;
        }
        // The domain gets the block's descriptor the first time (read-write only for an output).
        let in_flight = &self.in_place_pages;
        let busy = |block: u64| in_flight.iter().any(|&(first, _)| BlockRef::from_wire(first).block == block);
        let lending = self.live.as_mut()?.lending.as_mut()?;
        if !lending.ensure(at.block, output, busy) {
            return None;
        }
        self.in_place_pages.push(pages);
        self.lent_in_place += 1;
        let rich = ward_xpc::RichPtr { pool: POOL_ARENA, offset, len };
        let wire = WireArg { kind, pool: POOL_ARENA, a: offset, b: len };
        Some((wire, Loan { record: None, pool: POOL_ARENA, rich, output }))
    }

    /// A loan ended (its call returned or was abandoned): its arena pages may be lent again.
    pub(super) fn unlend(&mut self, loan: &Loan) {
        if loan.pool == POOL_ARENA {
            let pages = arena::pages_of(loan.rich.offset, loan.rich.len);
            if let Some(i) = self.in_place_pages.iter().position(|&p| p == pages) {
                self.in_place_pages.swap_remove(i);
            }
        }
    }

    /// The wire form of a call's arguments, lending each buffer (in place where `in_place` allows, else through a
    /// pool) into `loans`.
    pub(super) fn wire_args(
        &mut self,
        tracker: &mut Tracker,
        args: &[WireValue<'_>],
        loans: &mut Loans,
        in_place: bool,
    ) -> Result<SmallVec<[WireArg; 6]>, BackendError> {
        if args.len() > ward_xpc::wire::MAX_ARGS {
            return Err(BackendError::Usage("too many arguments (at most 14)".into()));
        }
        let mut list = SmallVec::new();
        for a in args {
            if let Some(scalar) = scalar_wire(a) {
                list.push(scalar);
                continue;
            }
            let lent = match a {
                _ if !in_place => None,
                WireValue::In(b) => self.lend_in_place(b, ArgKind::BufIn, false),
                WireValue::Scratch(b) => self.lend_in_place(b, ArgKind::BufScratch, false),
                WireValue::InOut(b) => self.lend_in_place(b, ArgKind::BufInOut, true),
                _ => None,
            };
            if let Some((wire, loan)) = lent {
                loans.push(loan);
                list.push(wire);
                continue;
            }
            let wire = match a {
                WireValue::Int(_) | WireValue::F64(_) | WireValue::F32(_) | WireValue::Callback(_) => continue,
                WireValue::In(b) | WireValue::Str(b) => {
                    let loan = self.lend(tracker, POOL_IN, Some(b), b.len(), false)?;
                    let kind = if matches!(a, WireValue::Str(_)) { ArgKind::Str } else { ArgKind::BufIn };
                    let w = WireArg { kind, pool: loan.pool, a: loan.rich.offset, b: loan.rich.len };
                    loans.push(loan);
                    w
                }
                WireValue::Out(out) => {
                    let loan = self.lend(tracker, POOL_OUT, None, out.len(), true)?;
                    let w = WireArg { kind: ArgKind::BufOut, pool: loan.pool, a: loan.rich.offset, b: loan.rich.len };
                    loans.push(loan);
                    w
                }
                WireValue::InOut(b) => {
                    let loan = self.lend(tracker, POOL_OUT, Some(b), b.len(), true)?;
                    let w = WireArg { kind: ArgKind::BufInOut, pool: loan.pool, a: loan.rich.offset, b: loan.rich.len };
                    loans.push(loan);
                    w
                }
                WireValue::Scratch(b) => {
                    // Writable in the domain (the output pool), ending at a guard page; not an output, so
                    // nothing comes back.
                    let loan = self.lend(tracker, POOL_OUT, Some(b), b.len(), false)?;
                    let w = WireArg { kind: ArgKind::BufInOut, pool: loan.pool, a: loan.rich.offset, b: loan.rich.len };
                    loans.push(loan);
                    w
                }
            };
            list.push(wire);
        }
        Ok(list)
    }
}
