//! ward's cross-domain transport: the shared region between a host and a `ward-domain` process, the rings and
//! records that carry calls over it, the pools that lend buffers, and the control socket beside them.
//!
//! # Trust model
//!
//! The host trusts nothing the domain writes. The domain runs native extensions that may be buggy or hostile, and
//! it shares memory with the host, so every byte in that memory can change at any moment, including between two
//! reads of the same field. Hence:
//!
//! - Shared memory is only touched through raw pointers, atomics and copies ([`shm`], [`ring`]); no `&[u8]` is
//!   ever formed over memory the peer may write.
//! - Ring indices are owned by one side each. Each side keeps its own position privately, publishes it, and never
//!   reads it back; the peer's index is validated on every read (a tail more than the capacity ahead of the head,
//!   a head beyond the published tail, a record that straddles the end or runs past the tail are all
//!   [`RingError::Corrupt`]: the peer is broken, stop talking to it).
//! - A record is copied into private memory before anything parses it; [`Message::parse`] validates every length,
//!   count, kind and range, and the result refers only to the private copy.
//! - Pool buffers are named by rich pointers `(pool, offset, len)`; the domain turns one into an address only when
//!   it lies inside one slot's data ([`MappedPool::resolve`]), and the host only copies with bounds checks.
//! - The host's memfds are sealed against resizing, so the domain cannot make host accesses fault by truncating
//!   them.
//!
//! The domain, for its part, maps what it must not change read-only: the request ring's data (the host re-reads
//! requests after a crash) and the input pool. For the rings that protects against the extension's bugs only (the
//! domain holds the region read-write, to write its replies), and the host's safety does not depend on it. The input
//! pool and arena blocks lent as inputs come through read-only descriptors, which a hostile domain cannot map
//! writable either (reopening them read-write is refused by its sandbox's system call filter).
//!
//! The domain's fault record ([`FaultRecord`]) is likewise only a claim, read as a copy after the domain died.

#![deny(unsafe_code)]

pub mod arena;
pub mod batch;
#[allow(unsafe_code)]
pub mod control;
pub mod deadline;
#[allow(unsafe_code)]
pub mod futex;
#[allow(unsafe_code)]
pub mod layout;
pub mod mix;
pub mod pool;
#[allow(unsafe_code)]
pub mod ring;
#[allow(unsafe_code)]
pub mod runqueue;
#[allow(unsafe_code)]
pub mod shm;
pub mod wire;

pub use deadline::Deadline;
pub use layout::{FaultRecord, LayoutError, Region};
pub use pool::{HostPool, Lease, MappedPool, PoolError, PoolGeometry, RichPtr, SlotClass};
pub use ring::{Consumer, Producer, RingError, WaitOutcome, MAX_RECORD};
pub use shm::{Protection, SharedMemory, ShmError};
pub use wire::{ArgKind, ArgList, Message, Op, RetKind, Status, WireArg, WireError};
