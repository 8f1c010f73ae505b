//! The arena: large host buffers that a process domain can be lent in place, without a copy.
//!
//! Copying a buffer through a pool costs a pass over memory on each side; for an 8 MB video frame that is more than
//! many filters spend on the frame itself. So a host may put its large blocks (1 MiB and up) in the arena
//! ([`host`]): `ward run`'s shim serves the host's large `malloc`s from it. Each block is a memfd of its own, mapped
//! at the block's address. A buffer of a call that lies in one block then crosses as a rich pointer of pool
//! [`POOL_ARENA`] naming the block, the offset in it and the length ([`BlockRef`]), and the domain ([`view`]) maps
//! just those pages for the duration of the call: read-only for an input, writable for an output, and for an input
//! the extension may write (scratch) read-only until its first write, which the domain's fault handler turns into a
//! private copy of the pages ([`view::on_write_fault`]). Between calls the pages are inaccessible in the domain, and
//! every mapping ends at a page the domain cannot touch, so a write past a lent buffer faults as it does in a pool.
//!
//! A domain holds a descriptor only for the blocks it was lent ([`BlockMessage`], sent over its control socket the
//! first time a block is lent to it): a read-only one for a block lent as an input or scratch, so that it can neither
//! map the host's other blocks nor write a block it may only read; the read-write one once the block is lent as an
//! output. A block lent to a domain is never handed out again once the host frees it (its memory goes with its
//! memfd), so a descriptor a domain still holds reaches nothing of the host's.
//!
//! What the arena gives up against the pools: an output is written in place, so a call that fails part-way leaves
//! what it wrote in the host's buffer (the retry overwrites it); see DECISIONS.md.

#[allow(unsafe_code)]
pub mod host;
#[allow(unsafe_code)]
pub mod view;

/// The pool id of rich pointers into the arena: `(POOL_ARENA, BlockRef::to_wire, length)`.
pub const POOL_ARENA: u32 = 2;

/// Bits of a wire reference that hold the offset in the block; the bits above hold the block.
const OFFSET_BITS: u32 = 36;
/// The largest block the arena serves: every offset in it fits a wire reference.
pub const MAX_BLOCK_LEN: usize = 1 << OFFSET_BITS;
/// The last block id a wire reference can carry (ids are never reused; past it the arena serves no new block).
pub const MAX_BLOCK_ID: u64 = (1 << (64 - OFFSET_BITS)) - 1;

/// A place in the arena: a block (its id, never reused) and an offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRef {
    pub block: u64,
    pub offset: u64,
}

impl BlockRef {
    /// The reference as the `a` field of a wire argument: the block in the high bits, the offset in the low ones.
    /// None when either does not fit. References into one block keep their order, and ranges of different blocks
    /// never overlap, so page ranges of wire references compare as page ranges of the blocks.
    pub fn to_wire(self) -> Option<u64> {
        if self.block == 0 || self.block > MAX_BLOCK_ID || self.offset >= MAX_BLOCK_LEN as u64 {
            return None;
        }
        Some(self.block << OFFSET_BITS | self.offset)
    }

    /// The reference a wire argument names.
    pub fn from_wire(a: u64) -> BlockRef {
        BlockRef { block: a >> OFFSET_BITS, offset: a & (MAX_BLOCK_LEN as u64 - 1) }
    }
}

/// The page-aligned range `[first, end)` that `[offset, offset + len)` lies in (saturating: a range past the end of
/// the address space is refused by whoever maps it).
pub fn pages_of(offset: u64, len: u64) -> (u64, u64) {
    let page = crate::shm::page_size() as u64;
    (offset / page * page, offset.saturating_add(len).div_ceil(page) * page)
}

/// What the host tells a domain about its blocks, on the domain's control socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockMessage {
    /// The descriptor that comes with this message is block `block`'s: read-write when `writable`, else read-only.
    Lend { block: u64, writable: bool },
    /// Block `block` is no longer the domain's: close its descriptor and unmap it.
    Drop { block: u64 },
}

impl BlockMessage {
    /// As a control message: `arena lend BLOCK ro|rw` or `arena drop BLOCK`.
    pub fn to_text(self) -> String {
        match self {
            BlockMessage::Lend { block, writable } => {
                format!("arena lend {block} {}", if writable { "rw" } else { "ro" })
            }
            BlockMessage::Drop { block } => format!("arena drop {block}"),
        }
    }

    /// Parse a control message; None when it is not one of these.
    pub fn parse(text: &str) -> Option<BlockMessage> {
        let mut words = text.strip_prefix("arena ")?.split(' ');
        let message = match (words.next()?, words.next()?.parse().ok()?, words.next()) {
            ("lend", block, Some("ro")) => BlockMessage::Lend { block, writable: false },
            ("lend", block, Some("rw")) => BlockMessage::Lend { block, writable: true },
            ("drop", block, None) => BlockMessage::Drop { block },
            _ => return None,
        };
        words.next().is_none().then_some(message)
    }
}

/// Errors of the arena.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    /// A rich pointer does not lie inside its block.
    #[error("{len} bytes at offset {offset} are outside arena block {block} of {size} bytes")]
    OutOfBounds { block: u64, offset: u64, len: u64, size: u64 },
    /// A rich pointer names a block the domain holds no descriptor for.
    #[error("arena block {0} was not lent to this domain")]
    NotLent(u64),
    /// A block lent read-only was to be written.
    #[error("arena block {0} was lent read-only")]
    ReadOnly(u64),
    /// The control socket that brings block descriptors failed, or brought something else.
    #[error("cannot receive arena blocks: {0}")]
    Channel(#[source] std::io::Error),
    /// A system call on the domain's view failed.
    #[error("cannot {what} lent arena pages: {source}")]
    Map {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// More scratch buffers lent at once than the fault handler can track.
    #[error("more than {0} scratch buffers lent at once")]
    TooManyScratch(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_refs_round_trip_and_odd_ones_do_not_fit() {
        for r in [BlockRef { block: 1, offset: 0 }, BlockRef { block: MAX_BLOCK_ID, offset: MAX_BLOCK_LEN as u64 - 1 }]
        {
            assert_eq!(BlockRef::from_wire(r.to_wire().unwrap()), r);
        }
        assert_eq!(BlockRef { block: 0, offset: 0 }.to_wire(), None, "block 0 is never one");
        assert_eq!(BlockRef { block: MAX_BLOCK_ID + 1, offset: 0 }.to_wire(), None);
        assert_eq!(BlockRef { block: 1, offset: MAX_BLOCK_LEN as u64 }.to_wire(), None);
        let (a, b) = (BlockRef { block: 1, offset: 4096 }, BlockRef { block: 2, offset: 0 });
        assert!(a.to_wire() < b.to_wire());
    }

    #[test]
    fn block_messages_round_trip_and_odd_ones_are_refused() {
        for m in [
            BlockMessage::Lend { block: 7, writable: false },
            BlockMessage::Lend { block: 8, writable: true },
            BlockMessage::Drop { block: 9 },
        ] {
            assert_eq!(BlockMessage::parse(&m.to_text()), Some(m));
        }
        for bad in ["arena lend 7", "arena lend x ro", "arena lend 7 rx", "arena drop 7 ro", "lend 7 ro", "arena"] {
            assert_eq!(BlockMessage::parse(bad), None, "{bad:?}");
        }
    }
}
