//! The domain's side of the arena: windows onto the host's arena file, opened for one call at a time.
//!
//! A window maps the pages of one lent range (`MAP_SHARED`) and is followed by a reserved page that is never
//! accessible, so running off the end of a lent buffer faults. Windows are kept between calls (a host lends the same
//! frames again and again, and mapping 8 MB afresh costs thousands of page faults). When a call begins, exactly the
//! ranges lent to the calls in progress are accessible ([`ArenaView::seal_idle`] closes the others). Protection
//! changes walk the page table of every page (over half a millisecond per 8 MB frame on a virtual machine), so they
//! are kept off the host's critical path where possible: a range lent again the same way needs none, and between
//! calls [`ArenaView::settle`] opens what the next call is predicted to lend and closes the rest while the host is
//! busy with other work. The cache is bounded; the least recently used idle windows are unmapped when it is full.
//!
//! A scratch input (the extension may write it, the host's bytes must not change) is lent read-only and registered
//! with [`on_write_fault`], which the domain's `SIGSEGV` handler calls: the first write replaces the lent pages by a
//! private copy-on-write mapping of the same file range, and the write is retried there. When the call ends the
//! shared mapping is put back (the private copy is dropped).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};

use crate::shm::page_size;

use super::ArenaError;

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
    /// The arena file's descriptor in this process.
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
        // SAFETY: [start, start + len) is a range of our own window mapping onto the arena file at `offset`, lent
        // to the running call as scratch; MAP_FIXED replaces exactly those pages with a private mapping of the same
        // file range, so every address stays mapped and reads the same bytes until written.
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

struct Window {
    /// Page-aligned offset in the arena file and length of the mapped pages.
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
    window: usize,
    /// The lent pages: address, length, file offset.
    pages: (usize, usize, usize),
    scratch: Option<usize>,
    /// A writable range's first and last pages when the range covers them only in part: private copies, so that
    /// what the extension writes beside the range (past its end, say) never reaches the host. The bytes of the
    /// range in them are written back to the file when the call ends.
    edges: [Option<Edge>; 2],
}

/// A page of a writable range mapped private: its address and file offset, and the part of it the range covers.
#[derive(Debug, Clone, Copy)]
struct Edge {
    addr: usize,
    file_offset: usize,
    skip: usize,
    len: usize,
}

/// The domain's windows onto the host's arena.
pub struct ArenaView {
    fd: OwnedFd,
    size: u64,
    page: usize,
    windows: Vec<Window>,
    mapped: usize,
    /// Bytes of idle windows kept mapped at most.
    cache: usize,
    clock: u64,
    /// What was open when each of the last three calls began (file offset of the open pages, and how they were
    /// open; sorted), oldest first: the history [`ArenaView::settle`] predicts the next call's ranges from.
    recent: [Option<Vec<(usize, Open)>>; 3],
    /// `settle` has run since the last call began.
    settled: bool,
}

impl ArenaView {
    /// A view of the arena file `fd`, keeping up to `cache` bytes of windows mapped between calls.
    pub fn new(fd: OwnedFd, cache: usize) -> Result<ArenaView, ArenaError> {
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct, and fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is a valid, writable `stat`; fd is open.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(ArenaError::Map { what: "inspect the arena for", source: io::Error::last_os_error() });
        }
        Ok(ArenaView {
            fd,
            size: st.st_size as u64,
            page: page_size(),
            windows: Vec::new(),
            mapped: 0,
            cache,
            clock: 0,
            recent: [None, None, None],
            settled: false,
        })
    }

    /// Make `[offset, offset + len)` of the arena accessible as `access` until [`ArenaView::end`].
    pub fn lend(&mut self, offset: u64, len: u64, access: Access) -> Result<Lent, ArenaError> {
        let out_of_bounds = ArenaError::OutOfBounds { offset, len, size: self.size };
        let end = match offset.checked_add(len) {
            Some(end) if len > 0 && end <= self.size => end,
            _ => return Err(out_of_bounds),
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
            w.file_offset <= first && last <= w.file_offset + w.len && (w.busy == 0 || w.open == Some(wanted))
        };
        let w = match self.windows.iter().position(fits) {
            Some(w) => w,
            None => self.map_window(first, last - first)?,
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
        window.busy += 1;
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
                    slot.fd.store(self.fd.as_raw_fd(), Ordering::Relaxed);
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
        let mut lent =
            Lent { ptr: (addr + (offset as usize - first)) as *mut u8, window: w, pages, scratch, edges: [None, None] };
        if access == Access::ReadWrite {
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
            // mapping of the same file page: same address, same bytes until written.
            let private =
                unsafe { map_file_over(edge.addr, page, rw, Sharing::Private, self.fd.as_raw_fd(), edge.file_offset) };
            private.map_err(|source| ArenaError::Map { what: "privatise the edges of", source })?;
            // Recorded as soon as it is private, so `end` restores it even if the other edge fails.
            lent.edges[i] = Some(*edge);
        }
        Ok(())
    }

    /// Write the range's bytes in a private edge page back to the file, then map the shared page back.
    fn restore_edge(&self, edge: &Edge) {
        // SAFETY: [edge.addr + skip, + len) lies inside the private page mapped in `privatise_edges`, readable; pwrite
        // copies it into the arena file (the host's memory) at the same place.
        unsafe {
            libc::pwrite(
                self.fd.as_raw_fd(),
                (edge.addr + edge.skip) as *const libc::c_void,
                edge.len,
                (edge.file_offset + edge.skip) as libc::off_t,
            )
        };
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: MAP_FIXED over that same page of our window, with the shared file page, writable as the rest of
        // the range stays until sealed; the private copy is dropped (its bytes were just written back).
        let _ =
            unsafe { map_file_over(edge.addr, self.page, rw, Sharing::Shared, self.fd.as_raw_fd(), edge.file_offset) };
    }

    /// The call is over: the lent pages become inaccessible again (a scratch copy is dropped).
    pub fn end(&mut self, lent: Lent) {
        for edge in lent.edges.iter().flatten() {
            self.restore_edge(edge);
        }
        let (addr, len, file_offset) = lent.pages;
        let restored = lent.scratch.is_some_and(|i| {
            let slot = &SCRATCH[i];
            let private = slot.private.load(Ordering::Relaxed);
            slot.start.store(0, Ordering::Release);
            private
        });
        if restored {
            // SAFETY: [addr, addr + len) is the range that on_write_fault replaced by a private mapping inside our
            // window; mapping the shared file range back over it (MAP_FIXED) restores the window as it was (open
            // read-only, see `lend`) and drops the private copy nobody refers to any more (the call is over).
            let back =
                unsafe { map_file_over(addr, len, libc::PROT_READ, Sharing::Shared, self.fd.as_raw_fd(), file_offset) };
            if back.is_err() {
                // The private copy stays; make it inaccessible so no later call reads it for the host's bytes (which
                // it never wrote).
                let _ = protect(addr, len, libc::PROT_NONE);
                if let Some(w) = self.windows.get_mut(lent.window) {
                    w.open = None;
                }
            }
        }
        // The pages stay accessible until the next call that does not lend them begins (`seal_idle`): only calls
        // run the extension's code, and a host lending the same frame again is spared two protection changes.
        if let Some(w) = self.windows.get_mut(lent.window) {
            w.busy = w.busy.saturating_sub(1);
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
        let mut lent: Vec<(usize, Open)> =
            self.windows.iter().filter_map(|w| w.open.map(|o| (w.file_offset + (o.addr - w.addr), o))).collect();
        lent.sort_by_key(|&(offset, o)| (offset, o.addr));
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
        // A window unmapped since (the cache trimmed) is not opened again, and its address, should the kernel reuse it
        // for another window, matches no prediction: the file offset must match too.
        let wanted_in = |w: &Window| {
            predicted
                .iter()
                .find(|(offset, o)| {
                    o.addr >= w.addr && o.addr + o.len <= w.addr + w.len && w.file_offset + (o.addr - w.addr) == *offset
                })
                .map(|&(_, o)| o)
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

    /// Map a new window of `len` bytes at file offset `file_offset`, followed by an inaccessible reserved page.
    fn map_window(&mut self, file_offset: usize, len: usize) -> Result<usize, ArenaError> {
        self.mapped += len;
        self.trim();
        let reserve = len + self.page;
        // SAFETY: a fresh anonymous reservation chosen by the kernel overlaps nothing.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            self.mapped -= len;
            return Err(ArenaError::Map { what: "reserve", source: io::Error::last_os_error() });
        }
        // SAFETY: MAP_FIXED over the first `len` bytes of the reservation just made (ours alone), with the arena
        // file's pages; the reserved page after it stays inaccessible.
        let mapped = unsafe {
            map_file_over(base as usize, len, libc::PROT_NONE, Sharing::Shared, self.fd.as_raw_fd(), file_offset)
        };
        if let Err(e) = mapped {
            // SAFETY: unmapping the reservation made above, which nothing refers to.
            unsafe { libc::munmap(base, reserve) };
            self.mapped -= len;
            return Err(ArenaError::Map { what: "map", source: e });
        }
        self.windows.push(Window { file_offset, len, addr: base as usize, busy: 0, last_used: self.clock, open: None });
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
            if self.windows.iter().skip(i + 1).any(|w| w.busy > 0) {
                // Removing it would renumber a window a call is still using; keep it for now.
                return;
            }
            let w = self.windows.remove(i);
            // SAFETY: the window (and its reserved page) is ours, idle (no call uses it), and no longer listed.
            unsafe { libc::munmap(w.addr as *mut libc::c_void, w.len + self.page) };
            self.mapped -= w.len;
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

/// Map the arena file's pages from `file_offset` over `[addr, addr + len)` (`MAP_FIXED`), with `prot`: the same
/// addresses now show the file's bytes, shared with the host or as a private copy. Async-signal-safe (one `mmap`).
///
/// # Safety
///
/// `[addr, addr + len)` must be page-aligned and lie inside a window (or window reservation) of this module, where
/// Rust owns nothing, and whatever it held must be unneeded or equal to the file's bytes there; `fd` must be the arena
/// file.
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

    fn view_of(host: &SharedMemory, cache: usize) -> ArenaView {
        ArenaView::new(host.fd().try_clone_to_owned().unwrap(), cache).unwrap()
    }

    #[test]
    fn lent_ranges_read_and_write_the_host_pages() {
        let host = SharedMemory::create("view-test", 1 << 20).unwrap();
        host.write_at(5000, b"frame").unwrap();
        let mut view = view_of(&host, 1 << 20);
        let lent = view.lend(5000, 5, Access::Read).unwrap();
        // SAFETY: the range is lent readable for 5 bytes.
        let seen = unsafe { std::slice::from_raw_parts(lent.ptr, 5) }.to_vec();
        assert_eq!(seen, b"frame");
        view.end(lent);
        let out = view.lend(5000, 5, Access::ReadWrite).unwrap();
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
        let mut view = view_of(&host, 1 << 20);
        let lent = view.lend(8192, 5, Access::Scratch).unwrap();
        assert!(!on_write_fault(lent.ptr as usize + 4096 * 10), "addresses outside the range are not handled");
        // What the signal handler does on the first write.
        assert!(on_write_fault(lent.ptr as usize));
        // SAFETY: the range is now a private writable copy of 5 bytes and more.
        unsafe { std::ptr::copy_nonoverlapping(b"XXXXX".as_ptr(), lent.ptr, 5) };
        // SAFETY: as above, readable.
        assert_eq!(unsafe { std::slice::from_raw_parts(lent.ptr, 5) }, b"XXXXX");
        view.end(lent);
        let mut back = [0u8; 5];
        host.read_at(8192, &mut back).unwrap();
        assert_eq!(&back, b"input");
        let again = view.lend(8192, 5, Access::Read).unwrap();
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
        let lent = view.lend(offset as u64, len as u64, Access::ReadWrite).unwrap();
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
        let again = view.lend(0, 3 * 4096, Access::Read).unwrap();
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
        let lent = view.lend(0, 3 * 4096, Access::ReadWrite).unwrap();
        let addr = lent.ptr as usize + 4096;
        assert_eq!(perms_at(addr), "rw-s");
        view.end(lent);
        assert_eq!(perms_at(addr), "rw-s", "open until the next call");
        let again = view.lend(0, 3 * 4096, Access::Read).unwrap();
        assert_eq!(perms_at(addr), "r--s", "lent read-only this time");
        view.seal_idle();
        assert_eq!(perms_at(addr), "r--s", "a range lent to a call in progress stays open");
        view.end(again);
        view.seal_idle();
        assert_eq!(perms_at(addr), "---s", "closed once a call that does not lend it begins");
    }

    /// One call as the domain serves it: lend, seal the rest, run (nothing here), end.
    fn one_call(view: &mut ArenaView, offset: u64, access: Access) -> usize {
        let lent = view.lend(offset, 3 * 4096, access).unwrap();
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
        let lent = view.lend(b, 3 * 4096, Access::ReadWrite).unwrap();
        view.seal_idle();
        assert_eq!((perms_at(at_a), perms_at(at_b)), ("---s".into(), "rw-s".into()));
        view.end(lent);
        view.settle(|| false);
        assert_eq!((perms_at(at_a), perms_at(at_b)), ("rw-s".into(), "---s".into()));
        let lent = view.lend(b, 3 * 4096, Access::Read).unwrap();
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
        let lent = view.lend(0, 3 * 4096, Access::Read).unwrap();
        view.seal_idle();
        view.settle(|| false);
        assert_eq!(perms_at(at), "r--s", "a range lent to a call in progress is left alone");
        view.end(lent);
        view.settle(|| false);
        assert_eq!(perms_at(at), "---s");
    }

    #[test]
    fn ranges_outside_the_arena_are_refused_and_the_cache_is_bounded() {
        let host = SharedMemory::create("view-bounds", 1 << 20).unwrap();
        let mut view = view_of(&host, 256 << 10);
        assert!(matches!(view.lend(1 << 20, 1, Access::Read), Err(ArenaError::OutOfBounds { .. })));
        assert!(matches!(view.lend(u64::MAX, 2, Access::Read), Err(ArenaError::OutOfBounds { .. })));
        assert!(matches!(view.lend(0, 0, Access::Read), Err(ArenaError::OutOfBounds { .. })));
        for i in 0..8u64 {
            let lent = view.lend(i * (128 << 10), 128 << 10, Access::Read).unwrap();
            assert!(view.mapped() <= 256 << 10, "{} bytes mapped", view.mapped());
            view.end(lent);
        }
        assert_eq!(view.windows.len(), 2, "the two most recent windows stay");
    }
}
