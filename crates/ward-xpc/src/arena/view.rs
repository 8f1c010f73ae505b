//! The domain's side of the arena: windows onto the host's arena blocks, opened for one call at a time.
//!
//! The host sends the descriptor of each block it lends the first time it lends it ([`super::BlockMessage`], on the
//! incarnation's control socket, before the call that names it): read-only for an input or scratch, read-write for
//! an output. The view keeps them until the host drops the block, and maps only from them: a block it was not lent
//! is not in this process at all, and a block lent read-only cannot be mapped writable and shared (the kernel
//! refuses `PROT_WRITE` on a shared mapping of a read-only descriptor, and any later `mprotect` to it).
//!
//! A window maps the pages of one lent range (`MAP_SHARED`) and is followed by reserved pages: [`READ_PAST_INPUT`]
//! bytes and then a page that is never accessible, so running off the end of a lent buffer faults. While a range is
//! lent read-only (an input), what follows it reads as zeros for [`READ_PAST_INPUT`] bytes, never as the rest of its
//! block (the host's bytes, not lent): the rest of its last page is a private copy, zeroed past the range, and the
//! pages after it (the window's other pages, or the reservation) are anonymous zeros, read-only, until the call
//! ends; an extension that reads a little past an input works, as it does natively.
//!
//! Windows are kept between calls (a host lends the same frames again and again, and mapping 8 MB afresh costs
//! thousands of page faults). When a call begins, exactly the ranges lent to the calls in progress are accessible
//! ([`ArenaView::seal_idle`] closes the others). Protection changes walk the page table of every page (over half a
//! millisecond per 8 MB frame on a virtual machine), so they are kept off the host's critical path where possible: a
//! range lent again the same way needs none, and between calls [`ArenaView::settle`] opens what the next call is
//! predicted to lend and closes the rest while the host is busy with other work. The cache is bounded; the least
//! recently used idle windows are unmapped when it is full.
//!
//! A scratch input (the extension may write it, the host's bytes must not change) is lent read-only and registered
//! with [`on_write_fault`], which the domain's `SIGSEGV` handler calls: the first write replaces the lent pages by a
//! private copy-on-write mapping of the same block range (which a read-only descriptor allows), and the write is
//! retried there. When the call ends the shared mapping is put back (the private copy is dropped).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use crate::control::ControlSocket;
use crate::layout::READ_PAST_INPUT;
use crate::shm::page_size;

use super::{ArenaError, BlockMessage};

/// How the extension may use a lent range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read only: a write faults (and fails the call).
    Read,
    /// Read, and writes go to a private copy.
    Scratch,
    /// Read and written in place.
    ReadWrite,
}

/// Scratch ranges lent at once (calls nest, each may lend a few).
pub const MAX_SCRATCH: usize = 8;

struct ScratchSlot {
    /// Page-aligned start address; 0 = free slot.
    start: AtomicUsize,
    len: AtomicUsize,
    file_offset: AtomicUsize,
    /// The block's descriptor in this process.
    fd: AtomicI32,
    /// The pages are a private copy now (written at least once).
    private: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE_SLOT: ScratchSlot = ScratchSlot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    file_offset: AtomicUsize::new(0),
    fd: AtomicI32::new(-1),
    private: AtomicBool::new(false),
};
static SCRATCH: [ScratchSlot; MAX_SCRATCH] = [FREE_SLOT; MAX_SCRATCH];

/// For the domain's `SIGSEGV` handler: if `addr` lies in a lent scratch range not yet copied, replace the range by a
/// private copy-on-write mapping (writable) and return true: the faulting write can be retried. Async-signal-safe
/// (atomics and one `mmap`).
pub fn on_write_fault(addr: usize) -> bool {
    for slot in &SCRATCH {
        let start = slot.start.load(Ordering::Acquire);
        let len = slot.len.load(Ordering::Relaxed);
        if start <= 1 || addr < start || addr >= start + len || slot.private.load(Ordering::Relaxed) {
            continue;
        }
        let offset = slot.file_offset.load(Ordering::Relaxed);
        let fd = slot.fd.load(Ordering::Relaxed);
        // SAFETY: [start, start + len) is a range of our own window mapping onto the block at `offset`, lent to the
        // running call as scratch; MAP_FIXED replaces exactly those pages with a private mapping of the same block
        // range, so every address stays mapped and reads the same bytes until written.
        if unsafe { map_file_over(start, len, libc::PROT_READ | libc::PROT_WRITE, Sharing::Private, fd, offset) }
            .is_err()
        {
            return false;
        }
        slot.private.store(true, Ordering::Relaxed);
        return true;
    }
    false
}

/// A block the host lent this domain.
struct Held {
    block: u64,
    /// The best descriptor the host sent: read-write once it lent the block as an output.
    fd: OwnedFd,
    /// Descriptors a later one replaced (a read-only one by a read-write one): kept, because windows, scratch slots
    /// and lent ranges may still name them by number.
    replaced: Vec<OwnedFd>,
    size: u64,
    writable: bool,
    /// The host dropped it while a window of it was still in use: closed once no window of it is left.
    dropped: bool,
}

struct Window {
    block: u64,
    /// Mapped from a read-write descriptor: a window mapped from a read-only one can never be made writable.
    writable: bool,
    /// Page-aligned offset in the block and length of the mapped pages.
    file_offset: usize,
    len: usize,
    addr: usize,
    /// Ranges of this window lent to calls in progress.
    busy: u32,
    last_used: u64,
    /// The pages of it that are accessible now, and how: the last range lent, until [`ArenaView::seal_idle`].
    open: Option<Open>,
}

/// Accessible pages of a window: address, length, protection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Open {
    addr: usize,
    len: usize,
    prot: libc::c_int,
}

/// A range lent to one call; give it back with [`ArenaView::end`].
#[derive(Debug)]
#[must_use = "a lent range stays accessible until it is ended"]
pub struct Lent {
    /// The buffer's address in this process.
    pub ptr: *mut u8,
    /// The address of its window (windows come and go with blocks, so they are found by it).
    window: usize,
    /// The block's descriptor the pages were mapped from.
    fd: RawFd,
    /// The lent pages: address, length, offset in the block.
    pages: (usize, usize, usize),
    scratch: Option<usize>,
    /// A writable range's first and last pages when the range covers them only in part: private copies, so that
    /// what the extension writes beside the range (past its end, say) never reaches the host. The bytes of the
    /// range in them are written back to the block when the call ends.
    edges: [Option<Edge>; 2],
    /// A read-only range: what was made to read as zeros after it, put back when the call ends.
    tail: Option<Tail>,
}

/// What follows a read-only range while it is lent: the rest of its last page, when the range ends inside it, is a
/// private copy zeroed past the range (`last_page`: its address and offset in the block), and `zeros` bytes of
/// anonymous zero pages follow the range's pages, of which the first `over_window` replaced pages of the window
/// (mapped from the block at `window_offset`) and the rest lie in the window's reservation.
#[derive(Debug, Clone, Copy)]
struct Tail {
    last_page: Option<(usize, usize)>,
    zeros_at: usize,
    zeros: usize,
    over_window: usize,
    window_offset: usize,
}

/// A page of a writable range mapped private: its address and offset in the block, and the part of it the range
/// covers.
#[derive(Debug, Clone, Copy)]
struct Edge {
    addr: usize,
    file_offset: usize,
    skip: usize,
    len: usize,
}

/// What was open when a call began: block, offset of the open pages in it, and how they were open.
type OpenAt = (u64, usize, Open);

/// The domain's windows onto the host's arena blocks.
pub struct ArenaView {
    /// Where the host's block descriptors come from; None until [`ArenaView::attach`].
    channel: Option<ControlSocket>,
    blocks: Vec<Held>,
    page: usize,
    /// Bytes after an input that read as zeros (whole pages; 0: none); each window's reservation holds them, then an
    /// inaccessible page.
    read_past: usize,
    windows: Vec<Window>,
    mapped: usize,
    /// Bytes of idle windows kept mapped at most.
    cache: usize,
    clock: u64,
    /// What was open when each of the last three calls began (sorted), oldest first: the history
    /// [`ArenaView::settle`] predicts the next call's ranges from.
    recent: [Option<Vec<OpenAt>>; 3],
    /// `settle` has run since the last call began.
    settled: bool,
}

impl ArenaView {
    /// A view holding no block yet, keeping up to `cache` bytes of windows mapped between calls, with
    /// [`READ_PAST_INPUT`] bytes of zeros after an input.
    pub fn new(cache: usize) -> ArenaView {
        Self::with_read_past(cache, READ_PAST_INPUT)
    }

    /// As [`ArenaView::new`], with `read_past` bytes of zeros after an input (rounded up to whole pages; 0: reading
    /// past an input reaches the rest of its last page, then faults).
    pub fn with_read_past(cache: usize, read_past: usize) -> ArenaView {
        ArenaView {
            channel: None,
            blocks: Vec::new(),
            page: page_size(),
            read_past: read_past.div_ceil(page_size()).saturating_mul(page_size()),
            windows: Vec::new(),
            mapped: 0,
            cache,
            clock: 0,
            recent: [None, None, None],
            settled: false,
        }
    }

    /// Take block descriptors from `channel` (this incarnation's control socket) from now on.
    pub fn attach(&mut self, channel: ControlSocket) {
        self.channel = Some(channel);
    }

    /// The descriptor this view holds for `block`, if the host lent it (for tests and diagnostics).
    pub fn descriptor(&self, block: u64) -> Option<BorrowedFd<'_>> {
        self.held(block).map(|h| h.fd.as_fd())
    }

    fn held(&self, block: u64) -> Option<&Held> {
        self.blocks.iter().find(|h| h.block == block && !h.dropped)
    }

    /// Take every message the host has sent: blocks lent, blocks dropped. The host sends a block's descriptor before
    /// the call that first names it, so a call never waits here.
    fn receive(&mut self) -> Result<(), ArenaError> {
        loop {
            let message = match &self.channel {
                Some(channel) => channel.try_recv().map_err(ArenaError::Channel)?,
                None => None,
            };
            let Some(message) = message else { return Ok(()) };
            match (BlockMessage::parse(&message.text), message.fd) {
                (Some(BlockMessage::Lend { block, writable }), Some(fd)) => self.accept(block, writable, fd)?,
                (Some(BlockMessage::Drop { block }), None) => self.forget(block),
                _ => {
                    return Err(ArenaError::Channel(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("unexpected control message `{}`", message.text),
                    )))
                }
            }
        }
    }

    /// The host lent `block` (again): keep its descriptor, unless a read-write one is already here.
    fn accept(&mut self, block: u64, writable: bool, fd: OwnedFd) -> Result<(), ArenaError> {
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct, and fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is a valid, writable `stat`; fd is open.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(ArenaError::Map { what: "inspect the block of", source: io::Error::last_os_error() });
        }
        let size = st.st_size as u64;
        match self.blocks.iter_mut().find(|h| h.block == block) {
            Some(h) if h.writable && !h.dropped && !writable => {}
            Some(h) => {
                let old = std::mem::replace(&mut h.fd, fd);
                h.replaced.push(old);
                (h.size, h.writable, h.dropped) = (size, writable, false);
                if writable {
                    // Windows mapped from the read-only descriptor can never be written: the idle ones go.
                    self.unmap_idle(|w| w.block == block && !w.writable);
                }
            }
            None => self.blocks.push(Held { block, fd, replaced: Vec::new(), size, writable, dropped: false }),
        }
        Ok(())
    }

    /// The host dropped `block`: unmap its idle windows, and close its descriptors once none is left.
    fn forget(&mut self, block: u64) {
        if let Some(h) = self.blocks.iter_mut().find(|h| h.block == block) {
            h.dropped = true;
        }
        self.unmap_idle(|w| w.block == block);
        self.purge(block);
    }

    /// Forget a dropped block that no window uses any more.
    fn purge(&mut self, block: u64) {
        let dropped = self.blocks.iter().any(|h| h.block == block && h.dropped);
        if dropped && !self.windows.iter().any(|w| w.block == block) {
            self.blocks.retain(|h| h.block != block);
        }
    }

    /// Unmap the idle windows `which` selects.
    fn unmap_idle(&mut self, which: impl Fn(&Window) -> bool) {
        let mut i = 0;
        while i < self.windows.len() {
            if self.windows[i].busy == 0 && which(&self.windows[i]) {
                self.unmap_window(i);
            } else {
                i += 1;
            }
        }
    }

    fn unmap_window(&mut self, i: usize) {
        let w = self.windows.remove(i);
        // SAFETY: the window (and its reserved pages) is ours, idle (no call uses it), and no longer listed.
        unsafe { libc::munmap(w.addr as *mut libc::c_void, w.len + self.read_past + self.page) };
        self.mapped -= w.len;
    }

    /// Make `[offset, offset + len)` of block `block` accessible as `access` until [`ArenaView::end`].
    pub fn lend(&mut self, block: u64, offset: u64, len: u64, access: Access) -> Result<Lent, ArenaError> {
        let need_write = access == Access::ReadWrite;
        if self.held(block).is_none_or(|h| need_write && !h.writable) {
            self.receive()?;
        }
        let held = self.held(block).ok_or(ArenaError::NotLent(block))?;
        if need_write && !held.writable {
            return Err(ArenaError::ReadOnly(block));
        }
        let (size, fd, writable_fd) = (held.size, held.fd.as_raw_fd(), held.writable);
        let end = match offset.checked_add(len) {
            Some(end) if len > 0 && end <= size => end,
            _ => return Err(ArenaError::OutOfBounds { block, offset, len, size }),
        };
        let (first, last) = super::pages_of(offset, len);
        let (first, last) = (first as usize, last as usize);
        let prot = match access {
            Access::Read | Access::Scratch => libc::PROT_READ,
            Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        };
        // A window holding these pages that is idle, or open exactly so already (an outer call lent other pages of
        // a busy window: this lend gets a window of its own rather than change what the outer call sees).
        let fits = |w: &Window| {
            let wanted = Open { addr: w.addr + first.wrapping_sub(w.file_offset), len: last - first, prot };
            w.block == block
                && (w.writable || !need_write)
                && w.file_offset <= first
                && last <= w.file_offset + w.len
                && (w.busy == 0 || w.open == Some(wanted))
        };
        let w = match self.windows.iter().position(fits) {
            Some(w) => w,
            None => self.map_window(block, fd, writable_fd, first, last - first)?,
        };
        self.clock += 1;
        let window = &mut self.windows[w];
        window.last_used = self.clock;
        let addr = window.addr + (first - window.file_offset);
        let pages = (addr, last - first, first);
        let wanted = Open { addr, len: pages.1, prot };
        // Protection changes cost a page-table walk over megabytes: a window lent the same way as last time (a host
        // reusing its frames) is left as it is.
        if window.open != Some(wanted) {
            if let Some(old) = window.open.take() {
                if (old.addr, old.len) != (addr, pages.1) {
                    protect(old.addr, old.len, libc::PROT_NONE)?;
                }
            }
            protect(addr, pages.1, prot)?;
            window.open = Some(wanted);
        }
        // The first call to use the window makes what follows an input read as zeros (a nested call lending the
        // same range sees the outer call's zeros).
        let first_user = window.busy == 0;
        window.busy += 1;
        let window_addr = window.addr;
        let window_end = window.addr + window.len;
        let scratch = if access == Access::Scratch {
            // Claim a free slot atomically (a slot is claimed by a non-zero start; 1 is never a page address).
            let claimed = SCRATCH
                .iter()
                .position(|s| s.start.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok());
            match claimed {
                Some(i) => {
                    let slot = &SCRATCH[i];
                    slot.len.store(pages.1, Ordering::Relaxed);
                    slot.file_offset.store(pages.2, Ordering::Relaxed);
                    slot.fd.store(fd, Ordering::Relaxed);
                    slot.private.store(false, Ordering::Relaxed);
                    slot.start.store(pages.0, Ordering::Release);
                    Some(i)
                }
                None => {
                    self.windows[w].busy -= 1;
                    return Err(ArenaError::TooManyScratch(MAX_SCRATCH));
                }
            }
        } else {
            None
        };
        let mut lent = Lent {
            ptr: (addr + (offset as usize - first)) as *mut u8,
            window: window_addr,
            fd,
            pages,
            scratch,
            edges: [None, None],
            tail: None,
        };
        if access == Access::Read && first_user && self.read_past > 0 {
            if let Err(e) = self.zero_tail(&mut lent, end as usize, window_end) {
                self.end(lent);
                return Err(e);
            }
        }
        if need_write {
            if let Err(e) = self.privatise_edges(&mut lent, offset as usize, end as usize) {
                self.end(lent);
                return Err(e);
            }
        }
        Ok(lent)
    }

    /// Map the partly covered first and last pages of a writable range `[offset, end)` private (see [`Lent`]).
    fn privatise_edges(&self, lent: &mut Lent, offset: usize, end: usize) -> Result<(), ArenaError> {
        let page = self.page;
        let (addr, len, file_offset) = lent.pages;
        let first = Edge {
            addr,
            file_offset,
            skip: offset - file_offset,
            len: (end - offset).min(page - (offset - file_offset)),
        };
        let last_page = file_offset + len - page;
        let last = Edge { addr: addr + len - page, file_offset: last_page, skip: 0, len: end - last_page.max(offset) };
        let mut edges = [None, None];
        if first.len < page {
            edges[0] = Some(first);
        }
        if last_page != file_offset && last.len < page {
            edges[1] = Some(last);
        }
        for (i, edge) in edges.iter().enumerate() {
            let Some(edge) = edge else { continue };
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            // SAFETY: one page of our own window (inside the lent range, just made writable), replaced by a private
            // mapping of the same block page: same address, same bytes until written.
            let private = unsafe { map_file_over(edge.addr, page, rw, Sharing::Private, lent.fd, edge.file_offset) };
            private.map_err(|source| ArenaError::Map { what: "privatise the edges of", source })?;
            // Recorded as soon as it is private, so `end` restores it even if the other edge fails.
            lent.edges[i] = Some(*edge);
        }
        Ok(())
    }

    /// Make the [`READ_PAST_INPUT`] bytes after a read-only range `[.., end)` read as zeros (see [`Tail`]); its
    /// window ends at `window_end`.
    fn zero_tail(&self, lent: &mut Lent, end: usize, window_end: usize) -> Result<(), ArenaError> {
        let page = self.page;
        let (addr, len, file_offset) = lent.pages;
        let pages_end = addr + len;
        // The window's pages after the range, as many as the zeros cover; the block offset of the first is the range
        // pages' end.
        let over_window = (window_end - pages_end).min(self.read_past);
        let mut tail = Tail {
            last_page: None,
            zeros_at: pages_end,
            zeros: self.read_past,
            over_window,
            window_offset: file_offset + len,
        };
        // SAFETY: [pages_end, + read_past) lies in our window and its reservation (which holds read_past bytes
        // after the window, then a page): pages of the block no call in progress uses (this call is the window's
        // only user) or reserved, inaccessible pages. Anonymous zero pages replace them until `end` puts them back.
        let p = unsafe {
            libc::mmap(
                pages_end as *mut libc::c_void,
                self.read_past,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ArenaError::Map { what: "map zeros after", source: io::Error::last_os_error() });
        }
        lent.tail = Some(tail);
        let covered = end - file_offset;
        if covered < len {
            let last = pages_end - page;
            let last_offset = file_offset + len - page;
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            // SAFETY: the range's last page in our window, open read-only for this call: a private copy of the same
            // block page replaces it (the same bytes until written).
            let private = unsafe { map_file_over(last, page, rw, Sharing::Private, lent.fd, last_offset) };
            private.map_err(|source| ArenaError::Map { what: "copy the last page of", source })?;
            tail.last_page = Some((last, last_offset));
            lent.tail = Some(tail);
            // SAFETY: [addr + covered, pages_end) is the part of the private page past the range, writable, ours.
            unsafe { std::ptr::write_bytes((addr + covered) as *mut u8, 0, len - covered) };
            protect(last, page, libc::PROT_READ)?;
        }
        Ok(())
    }

    /// Put back what [`ArenaView::zero_tail`] changed: the shared last page, open read-only as the range is; the
    /// window's pages, shared and inaccessible; the reservation, inaccessible.
    fn restore_tail(&self, fd: RawFd, tail: &Tail) {
        if let Some((addr, offset)) = tail.last_page {
            // SAFETY: the range's last page in our window (a private copy nobody needs once the call is over), mapped
            // back shared from the block, read-only as the range stays open until sealed.
            let _ = unsafe { map_file_over(addr, self.page, libc::PROT_READ, Sharing::Shared, fd, offset) };
        }
        if tail.over_window > 0 {
            // SAFETY: window pages that zero_tail replaced by zeros: the block's pages again, inaccessible as the
            // window's pages outside an open range are.
            let _ = unsafe {
                map_file_over(tail.zeros_at, tail.over_window, libc::PROT_NONE, Sharing::Shared, fd, tail.window_offset)
            };
        }
        let reserved = tail.zeros - tail.over_window;
        if reserved > 0 {
            let _ = protect(tail.zeros_at + tail.over_window, reserved, libc::PROT_NONE);
        }
    }

    /// Write the range's bytes in a private edge page back to the block, then map the shared page back.
    fn restore_edge(&self, fd: RawFd, edge: &Edge) {
        // SAFETY: [edge.addr + skip, + len) lies inside the private page mapped in `privatise_edges`, readable; pwrite
        // copies it into the block (the host's memory) at the same place, through the read-write descriptor it was
        // lent with.
        unsafe {
            libc::pwrite(
                fd,
                (edge.addr + edge.skip) as *const libc::c_void,
                edge.len,
                (edge.file_offset + edge.skip) as libc::off_t,
            )
        };
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: MAP_FIXED over that same page of our window, with the shared block page, writable as the rest of
        // the range stays until sealed; the private copy is dropped (its bytes were just written back).
        let _ = unsafe { map_file_over(edge.addr, self.page, rw, Sharing::Shared, fd, edge.file_offset) };
    }

    /// The call is over: the lent pages become inaccessible again (a scratch copy is dropped).
    pub fn end(&mut self, lent: Lent) {
        for edge in lent.edges.iter().flatten() {
            self.restore_edge(lent.fd, edge);
        }
        if let Some(tail) = &lent.tail {
            self.restore_tail(lent.fd, tail);
        }
        let (addr, len, file_offset) = lent.pages;
        let restored = lent.scratch.is_some_and(|i| {
            let slot = &SCRATCH[i];
            let private = slot.private.load(Ordering::Relaxed);
            slot.start.store(0, Ordering::Release);
            private
        });
        let window = self.windows.iter().position(|w| w.addr == lent.window);
        if restored {
            // SAFETY: [addr, addr + len) is the range that on_write_fault replaced by a private mapping inside our
            // window; mapping the shared block range back over it (MAP_FIXED) restores the window as it was (open
            // read-only, see `lend`) and drops the private copy nobody refers to any more (the call is over).
            let back = unsafe { map_file_over(addr, len, libc::PROT_READ, Sharing::Shared, lent.fd, file_offset) };
            if back.is_err() {
                // The private copy stays; make it inaccessible so no later call reads it for the host's bytes (which
                // it never wrote).
                let _ = protect(addr, len, libc::PROT_NONE);
                if let Some(w) = window {
                    self.windows[w].open = None;
                }
            }
        }
        // The pages stay accessible until the next call that does not lend them begins (`seal_idle`): only calls
        // run the extension's code, and a host lending the same frame again is spared two protection changes.
        if let Some(w) = window {
            let window = &mut self.windows[w];
            window.busy = window.busy.saturating_sub(1);
            let block = window.block;
            if window.busy == 0 && !self.blocks.iter().any(|h| h.block == block && !h.dropped) {
                // Its block was dropped during the call.
                self.unmap_window(w);
                self.purge(block);
            }
        }
        self.trim();
    }

    /// Before a call runs: every window no call in progress uses becomes inaccessible, so the extension can reach
    /// exactly the ranges lent to the calls in progress.
    pub fn seal_idle(&mut self) {
        for w in self.windows.iter_mut().filter(|w| w.busy == 0) {
            if let Some(open) = w.open {
                // A failure (the kernel out of memory for the change) leaves it open, to be tried again next call.
                if protect(open.addr, open.len, libc::PROT_NONE).is_ok() {
                    w.open = None;
                }
            }
        }
        let mut lent: Vec<OpenAt> = self
            .windows
            .iter()
            .filter_map(|w| w.open.map(|o| (w.block, w.file_offset + (o.addr - w.addr), o)))
            .collect();
        lent.sort_by_key(|&(block, offset, o)| (block, offset, o.addr));
        self.recent.rotate_left(1);
        self.recent[2] = Some(lent);
        self.settled = false;
    }

    /// Between calls, with none in progress: open what the next call is predicted to lend, as it will be lent, and
    /// close everything else, so that the protection changes happen while the host works instead of after its next
    /// request. A host that alternates between buffers (ffmpeg between its two output frames) lends every call what
    /// the call before last did; when the last three calls show that pattern (or lent the same thrice) the ranges of
    /// the call before last are opened, otherwise everything is closed. The next call's [`ArenaView::lend`] and
    /// [`ArenaView::seal_idle`] correct a wrong guess, so what a call can reach is the same either way. `interrupt`
    /// is asked before each change: when it says a request is waiting, the rest is left to that call.
    pub fn settle(&mut self, mut interrupt: impl FnMut() -> bool) {
        if self.settled || self.windows.iter().any(|w| w.busy > 0) {
            return;
        }
        let predicted = match &self.recent {
            [Some(before_last), Some(previous), Some(last)] if before_last == last => previous.clone(),
            _ => Vec::new(),
        };
        // A window unmapped since (the cache trimmed, its block dropped) is not opened again, and its address, should
        // the kernel reuse it for another window, matches no prediction: the block and offset must match too.
        let wanted_in = |w: &Window| {
            predicted
                .iter()
                .find(|(block, offset, o)| {
                    *block == w.block
                        && o.addr >= w.addr
                        && o.addr + o.len <= w.addr + w.len
                        && w.file_offset + (o.addr - w.addr) == *offset
                })
                .map(|&(_, _, o)| o)
        };
        // Close first, then open: nothing is reachable beyond what the prediction names at any moment.
        for opening in [false, true] {
            for i in 0..self.windows.len() {
                let wanted = wanted_in(&self.windows[i]);
                let w = &mut self.windows[i];
                if w.open == wanted || (wanted.is_some() != opening) {
                    continue;
                }
                if interrupt() {
                    return;
                }
                if let Some(old) = w.open.take() {
                    if protect(old.addr, old.len, libc::PROT_NONE).is_err() {
                        w.open = Some(old);
                        continue;
                    }
                }
                if let Some(new) = wanted {
                    if protect(new.addr, new.len, new.prot).is_ok() {
                        w.open = Some(new);
                    }
                }
            }
        }
        self.settled = true;
    }

    /// Map a new window of `len` bytes of block `block` (descriptor `fd`) at `file_offset`, followed by
    /// inaccessible reserved pages (room for the zeros after an input, then a page that stays so).
    fn map_window(
        &mut self,
        block: u64,
        fd: RawFd,
        writable: bool,
        file_offset: usize,
        len: usize,
    ) -> Result<usize, ArenaError> {
        self.mapped += len;
        self.trim();
        let reserve = len + self.read_past + self.page;
        let base = crate::shm::reserve(reserve).map_err(|source| {
            self.mapped -= len;
            ArenaError::Map { what: "reserve", source }
        })?;
        // SAFETY: MAP_FIXED over the first `len` bytes of the reservation just made (ours alone), with the block's
        // pages; the reserved pages after it stay inaccessible.
        let mapped = unsafe { map_file_over(base as usize, len, libc::PROT_NONE, Sharing::Shared, fd, file_offset) };
        if let Err(e) = mapped {
            // SAFETY: unmapping the reservation made above, which nothing refers to.
            unsafe { libc::munmap(base, reserve) };
            self.mapped -= len;
            return Err(ArenaError::Map { what: "map", source: e });
        }
        self.windows.push(Window {
            block,
            writable,
            file_offset,
            len,
            addr: base as usize,
            busy: 0,
            last_used: self.clock,
            open: None,
        });
        Ok(self.windows.len() - 1)
    }

    /// Unmap the least recently used idle windows while more than the cache allows is mapped.
    fn trim(&mut self) {
        while self.mapped > self.cache {
            let victim = self
                .windows
                .iter()
                .enumerate()
                .filter(|(_, w)| w.busy == 0)
                .min_by_key(|(_, w)| w.last_used)
                .map(|(i, _)| i);
            let Some(i) = victim else { return };
            let block = self.windows[i].block;
            self.unmap_window(i);
            self.purge(block);
        }
    }

    /// Bytes of windows mapped (for tests and diagnostics).
    pub fn mapped(&self) -> usize {
        self.mapped
    }
}

/// Whether a range mapped over a window sees the host's pages or a private copy-on-write copy of them.
#[derive(Clone, Copy)]
enum Sharing {
    Shared,
    Private,
}

/// Map a block's pages from `file_offset` over `[addr, addr + len)` (`MAP_FIXED`), with `prot`: the same addresses
/// now show the block's bytes, shared with the host or as a private copy. Async-signal-safe (one `mmap`).
///
/// # Safety
///
/// `[addr, addr + len)` must be page-aligned and lie inside a window (or window reservation) of this module, where
/// Rust owns nothing, and whatever it held must be unneeded or equal to the block's bytes there; `fd` must be the
/// descriptor of the window's block.
unsafe fn map_file_over(
    addr: usize,
    len: usize,
    prot: libc::c_int,
    sharing: Sharing,
    fd: RawFd,
    file_offset: usize,
) -> io::Result<()> {
    let sharing = match sharing {
        Sharing::Shared => libc::MAP_SHARED,
        Sharing::Private => libc::MAP_PRIVATE,
    };
    // SAFETY: the caller vouches for the range (see above); MAP_FIXED replaces exactly those pages.
    let p = unsafe {
        libc::mmap(addr as *mut libc::c_void, len, prot, sharing | libc::MAP_FIXED, fd, file_offset as libc::off_t)
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn protect(addr: usize, len: usize, prot: libc::c_int) -> Result<(), ArenaError> {
    // SAFETY: [addr, addr + len) is a page-aligned range of one of our windows, which this module alone manages;
    // changing its protection affects no memory Rust owns.
    if unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) } != 0 {
        return Err(ArenaError::Map { what: "change the protection of", source: io::Error::last_os_error() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::SharedMemory;

    /// The block the tests lend.
    const B: u64 = 1;

    /// Lend `host` as block `block` over `socket`, read-write or read-only, as a host does.
    fn lend(socket: &ControlSocket, block: u64, host: &SharedMemory, writable: bool) {
        let fd = if writable { host.fd().try_clone_to_owned().unwrap() } else { host.read_only_fd().unwrap() };
        socket.send(&BlockMessage::Lend { block, writable }.to_text(), Some(fd.as_fd())).unwrap();
    }

    /// A view attached to a control socket, and the host's end of it.
    fn attached(cache: usize) -> (ControlSocket, ArenaView) {
        let (host, domain) = ControlSocket::pair().unwrap();
        let mut view = ArenaView::new(cache);
        view.attach(domain);
        (host, view)
    }

    /// A view that was lent `host` as block B, read-write.
    fn view_of(host: &SharedMemory, cache: usize) -> ArenaView {
        let (socket, view) = attached(cache);
        lend(&socket, B, host, true);
        view
    }

    #[test]
    fn what_follows_an_input_reads_as_zeros_while_it_is_lent_and_the_block_is_untouched() {
        let host = SharedMemory::create("view-zeros", 1 << 20).unwrap();
        host.write_at(0, &vec![0xffu8; 1 << 20]).unwrap();
        let mut view = view_of(&host, 1 << 20);
        // Ending inside a page, on a page, and in a window that holds more of the block after the range.
        for (offset, len) in [(5000usize, 10_000usize), (8192, 8192), (0, 65536), (4096, 4096 * 3 + 7)] {
            let lent = view.lend(B, offset as u64, len as u64, Access::Read).unwrap();
            // SAFETY: the range is lent readable, and READ_PAST_INPUT bytes after it read as zeros while it is.
            let (range, past) = unsafe {
                (
                    std::slice::from_raw_parts(lent.ptr, len).to_vec(),
                    std::slice::from_raw_parts(lent.ptr.add(len), READ_PAST_INPUT).to_vec(),
                )
            };
            assert!(range.iter().all(|&b| b == 0xff), "{offset} {len}: the range");
            assert!(past.iter().all(|&b| b == 0), "{offset} {len}: what follows the range");
            view.end(lent);
        }
        // The whole block first, then a part of it in the same window: the window's pages after the part read
        // as zeros too, and as the block again when lent.
        let whole = view.lend(B, 0, 1 << 20, Access::Read).unwrap();
        view.end(whole);
        let part = view.lend(B, 100, 5000, Access::Read).unwrap();
        // SAFETY: lent readable, zeros after.
        let past = unsafe { std::slice::from_raw_parts(part.ptr.add(5000), READ_PAST_INPUT).to_vec() };
        assert!(past.iter().all(|&b| b == 0));
        view.end(part);
        let whole = view.lend(B, 0, 1 << 20, Access::Read).unwrap();
        // SAFETY: lent readable for the whole block.
        let seen = unsafe { std::slice::from_raw_parts(whole.ptr, 1 << 20).to_vec() };
        assert!(seen.iter().all(|&b| b == 0xff), "the window shows the block again");
        view.end(whole);
        let mut back = vec![0u8; 1 << 20];
        host.read_at(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0xff), "the host's block changed");
    }

    #[test]
    fn lent_ranges_read_and_write_the_host_pages() {
        let host = SharedMemory::create("view-test", 1 << 20).unwrap();
        host.write_at(5000, b"frame").unwrap();
        let mut view = view_of(&host, 1 << 20);
        let lent = view.lend(B, 5000, 5, Access::Read).unwrap();
        // SAFETY: the range is lent readable for 5 bytes.
        let seen = unsafe { std::slice::from_raw_parts(lent.ptr, 5) }.to_vec();
        assert_eq!(seen, b"frame");
        view.end(lent);
        let out = view.lend(B, 5000, 5, Access::ReadWrite).unwrap();
        // SAFETY: the range is lent writable for 5 bytes.
        unsafe { std::ptr::copy_nonoverlapping(b"FRAME".as_ptr(), out.ptr, 5) };
        view.end(out);
        let mut back = [0u8; 5];
        host.read_at(5000, &mut back).unwrap();
        assert_eq!(&back, b"FRAME");
        assert_eq!(view.windows.len(), 1, "the same pages reuse their window");
    }

    #[test]
    fn a_written_scratch_range_becomes_private_and_the_host_keeps_its_bytes() {
        let host = SharedMemory::create("view-scratch", 1 << 20).unwrap();
        host.write_at(8192, b"input").unwrap();
        // Lent read-only: a private copy-on-write mapping needs no more.
        let (socket, mut view) = attached(1 << 20);
        lend(&socket, B, &host, false);
        let lent = view.lend(B, 8192, 5, Access::Scratch).unwrap();
        assert!(!on_write_fault(lent.ptr as usize + 4096 * 10), "addresses outside the range are not handled");
        // What the signal handler does on the first write.
        assert!(on_write_fault(lent.ptr as usize));
        // SAFETY: the range is now a private writable copy of 5 bytes and more.
        unsafe { std::ptr::copy_nonoverlapping(b"XXXXX".as_ptr(), lent.ptr, 5) };
        // SAFETY: the range is still lent (ended below) and its private copy is readable for 5 bytes; no &mut to it
        // is alive.
        assert_eq!(unsafe { std::slice::from_raw_parts(lent.ptr, 5) }, b"XXXXX");
        view.end(lent);
        let mut back = [0u8; 5];
        host.read_at(8192, &mut back).unwrap();
        assert_eq!(&back, b"input");
        let again = view.lend(B, 8192, 5, Access::Read).unwrap();
        // SAFETY: lent readable for 5 bytes.
        assert_eq!(unsafe { std::slice::from_raw_parts(again.ptr, 5) }, b"input", "the shared pages are back");
        view.end(again);
    }

    #[test]
    fn writes_beside_a_writable_range_never_reach_the_host() {
        let host = SharedMemory::create("view-edges", 1 << 20).unwrap();
        host.write_at(0, &[0x11; 3 * 4096]).unwrap();
        let mut view = view_of(&host, 1 << 20);
        // Bytes 100..(2 * 4096 + 50): partial first and last pages.
        let (offset, len) = (100usize, 2 * 4096 - 50);
        let lent = view.lend(B, offset as u64, len as u64, Access::ReadWrite).unwrap();
        // SAFETY: the lent pages are writable from the start of the first page to the end of the last: the range
        // itself and, beside it, private copies of its edge pages.
        unsafe {
            std::ptr::write_bytes(lent.ptr.sub(100), 0xee, 100);
            std::ptr::write_bytes(lent.ptr, 0x22, len);
            std::ptr::write_bytes(lent.ptr.add(len), 0xee, 3 * 4096 - offset - len);
        }
        view.end(lent);
        let mut back = vec![0u8; 3 * 4096];
        host.read_at(0, &mut back).unwrap();
        assert!(back[..offset].iter().all(|&b| b == 0x11), "before the range");
        assert!(back[offset..offset + len].iter().all(|&b| b == 0x22), "the range");
        assert!(back[offset + len..].iter().all(|&b| b == 0x11), "after the range");
        // The edge pages are shared again: a new lend reads what the host holds.
        let again = view.lend(B, 0, 3 * 4096, Access::Read).unwrap();
        // SAFETY: lent readable for the three pages.
        let seen = unsafe { std::slice::from_raw_parts(again.ptr, 3 * 4096) }.to_vec();
        view.end(again);
        assert_eq!(seen, back);
    }

    /// The protection of the mapping holding `addr`, as /proc/self/maps shows it (`rw-s`).
    fn perms_at(addr: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for line in maps.lines() {
            let mut fields = line.split_whitespace();
            let (range, perms) = (fields.next().unwrap(), fields.next().unwrap());
            let (lo, hi) = range.split_once('-').unwrap();
            let (lo, hi) = (usize::from_str_radix(lo, 16).unwrap(), usize::from_str_radix(hi, 16).unwrap());
            if (lo..hi).contains(&addr) {
                return perms.to_owned();
            }
        }
        panic!("{addr:#x} is not mapped");
    }

    #[test]
    fn a_range_stays_open_after_its_call_until_a_call_that_does_not_lend_it() {
        let host = SharedMemory::create("view-seal", 1 << 20).unwrap();
        let mut view = view_of(&host, 1 << 20);
        let lent = view.lend(B, 0, 3 * 4096, Access::ReadWrite).unwrap();
        let addr = lent.ptr as usize + 4096;
        assert_eq!(perms_at(addr), "rw-s");
        view.end(lent);
        assert_eq!(perms_at(addr), "rw-s", "open until the next call");
        let again = view.lend(B, 0, 3 * 4096, Access::Read).unwrap();
        assert_eq!(perms_at(addr), "r--s", "lent read-only this time");
        view.seal_idle();
        assert_eq!(perms_at(addr), "r--s", "a range lent to a call in progress stays open");
        view.end(again);
        view.seal_idle();
        assert_eq!(perms_at(addr), "---s", "closed once a call that does not lend it begins");
    }

    /// One call as the domain serves it: lend, seal the rest, run (nothing here), end.
    fn one_call(view: &mut ArenaView, offset: u64, access: Access) -> usize {
        let lent = view.lend(B, offset, 3 * 4096, access).unwrap();
        view.seal_idle();
        let addr = lent.ptr as usize;
        view.end(lent);
        addr
    }

    #[test]
    fn between_calls_an_alternating_hosts_next_range_is_opened_and_the_rest_closed() {
        let host = SharedMemory::create("view-settle", 1 << 20).unwrap();
        let mut view = view_of(&host, 1 << 20);
        let (a, b) = (0u64, 64 << 10);
        let at_a = one_call(&mut view, a, Access::ReadWrite);
        view.settle(|| false);
        assert_eq!(perms_at(at_a), "---s", "no pattern yet: everything is closed between calls");
        let at_b = one_call(&mut view, b, Access::ReadWrite);
        view.settle(|| false);
        assert_eq!((perms_at(at_a), perms_at(at_b)), ("---s".into(), "---s".into()));
        one_call(&mut view, a, Access::ReadWrite);
        view.settle(|| false);
        assert_eq!(perms_at(at_b), "rw-s", "A, B, A: B is opened for the next call, as it was lent");
        assert_eq!(perms_at(at_a), "---s", "and the last call's range is closed");
        // The call that comes as predicted finds its range open; the one that does not is served all the same.
        let lent = view.lend(B, b, 3 * 4096, Access::ReadWrite).unwrap();
        view.seal_idle();
        assert_eq!((perms_at(at_a), perms_at(at_b)), ("---s".into(), "rw-s".into()));
        view.end(lent);
        view.settle(|| false);
        assert_eq!((perms_at(at_a), perms_at(at_b)), ("rw-s".into(), "---s".into()));
        let lent = view.lend(B, b, 3 * 4096, Access::Read).unwrap();
        view.seal_idle();
        assert_eq!(perms_at(at_a), "---s", "a wrong guess is closed when the call begins");
        assert_eq!(perms_at(at_b), "r--s", "and the range is open as this call lends it");
        view.end(lent);
        view.settle(|| false);
        assert_eq!((perms_at(at_a), perms_at(at_b)), ("---s".into(), "---s".into()), "B, A, B read: no pattern");
    }

    #[test]
    fn settling_stops_when_a_request_is_waiting_and_never_runs_during_a_call() {
        let host = SharedMemory::create("view-settle-stop", 1 << 20).unwrap();
        let mut view = view_of(&host, 1 << 20);
        let at = one_call(&mut view, 0, Access::Read);
        view.settle(|| true);
        assert_eq!(perms_at(at), "r--s", "interrupted before its first change");
        let lent = view.lend(B, 0, 3 * 4096, Access::Read).unwrap();
        view.seal_idle();
        view.settle(|| false);
        assert_eq!(perms_at(at), "r--s", "a range lent to a call in progress is left alone");
        view.end(lent);
        view.settle(|| false);
        assert_eq!(perms_at(at), "---s");
    }

    /// Whether `fd` can be mapped shared and writable (the mapping is undone at once).
    fn maps_writable(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
        // SAFETY: a fresh mapping chosen by the kernel, unmapped at once if made.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the mapping just made.
        unsafe { libc::munmap(p, len) };
        Ok(())
    }

    #[test]
    fn a_block_never_lent_is_refused_and_one_lent_read_only_cannot_be_written() {
        let host = SharedMemory::create("view-read-only", 1 << 20).unwrap();
        host.write_at(0, b"input").unwrap();
        let (socket, mut view) = attached(1 << 20);
        assert!(matches!(view.lend(B, 0, 5, Access::Read), Err(ArenaError::NotLent(B))), "nothing lent yet");
        lend(&socket, B, &host, false);
        assert!(matches!(view.lend(B + 1, 0, 5, Access::Read), Err(ArenaError::NotLent(_))), "another block");
        assert!(view.descriptor(B + 1).is_none());
        assert!(matches!(view.lend(B, 0, 5, Access::ReadWrite), Err(ArenaError::ReadOnly(B))));
        let lent = view.lend(B, 0, 5, Access::Read).unwrap();
        // SAFETY: lent readable for 5 bytes.
        assert_eq!(unsafe { std::slice::from_raw_parts(lent.ptr, 5) }, b"input");
        view.end(lent);
        // What an extension could try on its own: the descriptor maps shared only for reading, and the open window
        // cannot be made writable. (A range that ends inside a page has a private copy of that page, zeroed past
        // the range: that one may be made writable, but it is nobody's but the domain's.)
        let lent = view.lend(B, 0, page_size() as u64, Access::Read).unwrap();
        let fd = view.descriptor(B).unwrap();
        assert_eq!(maps_writable(fd, 1 << 20).unwrap_err().raw_os_error(), Some(libc::EACCES));
        let page_start = lent.ptr as usize & !(page_size() - 1);
        let err = protect(page_start, page_size(), libc::PROT_READ | libc::PROT_WRITE).unwrap_err();
        assert!(matches!(err, ArenaError::Map { source, .. } if source.raw_os_error() == Some(libc::EACCES)));
        view.end(lent);
        let mut back = [0u8; 5];
        host.read_at(0, &mut back).unwrap();
        assert_eq!(&back, b"input");
    }

    #[test]
    fn a_block_lent_writable_later_is_written_in_place_and_a_dropped_one_is_gone() {
        let host = SharedMemory::create("view-upgrade", 1 << 20).unwrap();
        let (socket, mut view) = attached(1 << 20);
        lend(&socket, B, &host, false);
        let lent = view.lend(B, 0, 3 * 4096, Access::Read).unwrap();
        view.end(lent);
        assert_eq!(view.windows.len(), 1);
        // Lent as an output now: the read-write descriptor comes, and the read-only window goes.
        lend(&socket, B, &host, true);
        let out = view.lend(B, 0, 3 * 4096, Access::ReadWrite).unwrap();
        assert_eq!(view.windows.len(), 1, "the window of the read-only descriptor was unmapped");
        // SAFETY: lent writable for three pages.
        unsafe { std::ptr::write_bytes(out.ptr, 0x5a, 3 * 4096) };
        view.end(out);
        let mut back = vec![0u8; 3 * 4096];
        host.read_at(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0x5a));
        maps_writable(view.descriptor(B).unwrap(), 1 << 20).unwrap();
        // Lent read-only again: the domain keeps what it has (the residue SECURITY.md names).
        lend(&socket, B, &host, false);
        let lent = view.lend(B, 0, 4096, Access::ReadWrite).unwrap();
        view.end(lent);
        // Dropped: its windows and descriptors go, and it is not lent any more.
        socket.send(&BlockMessage::Drop { block: B }.to_text(), None).unwrap();
        lend(&socket, B + 1, &host, false);
        let lent = view.lend(B + 1, 0, 4096, Access::Read).unwrap();
        view.end(lent);
        assert!(view.descriptor(B).is_none());
        assert!(view.windows.iter().all(|w| w.block != B), "the dropped block's windows are unmapped");
        assert!(matches!(view.lend(B, 0, 4096, Access::Read), Err(ArenaError::NotLent(B))));
    }

    #[test]
    fn a_block_dropped_during_a_call_stays_until_the_call_ends() {
        let host = SharedMemory::create("view-drop-busy", 1 << 20).unwrap();
        host.write_at(0, b"frame").unwrap();
        let (socket, mut view) = attached(1 << 20);
        lend(&socket, B, &host, false);
        let outer = view.lend(B, 0, 5, Access::Read).unwrap();
        socket.send(&BlockMessage::Drop { block: B }.to_text(), None).unwrap();
        lend(&socket, B + 1, &host, false);
        let inner = view.lend(B + 1, 0, 5, Access::Read).unwrap();
        // SAFETY: still lent readable for 5 bytes.
        assert_eq!(unsafe { std::slice::from_raw_parts(outer.ptr, 5) }, b"frame");
        view.end(inner);
        view.end(outer);
        assert!(view.blocks.iter().all(|h| h.block != B), "forgotten once its call ended");
        assert!(view.windows.iter().all(|w| w.block != B));
    }

    #[test]
    fn anything_else_on_the_control_socket_is_refused() {
        let (socket, mut view) = attached(1 << 20);
        socket.send("arena lend 1 rw", None).unwrap();
        assert!(matches!(view.lend(B, 0, 5, Access::Read), Err(ArenaError::Channel(_))), "a lend without a descriptor");
    }

    #[test]
    fn ranges_outside_the_arena_are_refused_and_the_cache_is_bounded() {
        let host = SharedMemory::create("view-bounds", 1 << 20).unwrap();
        let mut view = view_of(&host, 256 << 10);
        assert!(matches!(view.lend(B, 1 << 20, 1, Access::Read), Err(ArenaError::OutOfBounds { .. })));
        assert!(matches!(view.lend(B, u64::MAX, 2, Access::Read), Err(ArenaError::OutOfBounds { .. })));
        assert!(matches!(view.lend(B, 0, 0, Access::Read), Err(ArenaError::OutOfBounds { .. })));
        for i in 0..8u64 {
            let lent = view.lend(B, i * (128 << 10), 128 << 10, Access::Read).unwrap();
            assert!(view.mapped() <= 256 << 10, "{} bytes mapped", view.mapped());
            view.end(lent);
        }
        assert_eq!(view.windows.len(), 2, "the two most recent windows stay");
    }
}
