//! The arena: large host buffers that a process domain can be lent in place, without a copy.
//!
//! Copying a buffer through a pool costs a pass over memory on each side; for an 8 MB video frame that is more than
//! many filters spend on the frame itself. So a host may put its large blocks (1 MiB and up) in one shared memfd,
//! the arena ([`host`]): `ward run`'s shim serves the host's large `malloc`s from it. A buffer of a call that lies
//! in one arena block then crosses as a rich pointer of pool [`POOL_ARENA`] (offset into the arena, length), and the
//! domain ([`view`]) maps just those pages for the duration of the call: read-only for an input, writable for an
//! output, and for an input the extension may write (scratch) read-only until its first write, which the domain's
//! fault handler turns into a private copy of the pages ([`view::on_write_fault`]). Between calls the pages are
//! inaccessible in the domain, and every mapping ends at a page the domain cannot touch, so a write past a lent
//! buffer faults as it does in a pool.
//!
//! What the arena gives up against the pools: an output is written in place, so a call that fails part-way leaves
//! what it wrote in the host's buffer (the retry overwrites it); see DECISIONS.md.

#[allow(unsafe_code)]
pub mod host;
#[allow(unsafe_code)]
pub mod view;

/// The pool id of rich pointers into the arena: `(POOL_ARENA, offset into the arena file, length)`.
pub const POOL_ARENA: u32 = 2;

/// The page-aligned range `[first, end)` of the arena file that `[offset, offset + len)` lies in (saturating: a
/// range past the end of the address space is refused by whoever maps it).
pub fn pages_of(offset: u64, len: u64) -> (u64, u64) {
    let page = crate::shm::page_size() as u64;
    (offset / page * page, offset.saturating_add(len).div_ceil(page) * page)
}

/// Errors of the arena.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    /// Creating or mapping the arena file failed.
    #[error("cannot set up the arena: {0}")]
    Setup(#[from] crate::shm::ShmError),
    /// A rich pointer does not lie inside the arena.
    #[error("{len} bytes at arena offset {offset} are outside the arena of {size} bytes")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
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
