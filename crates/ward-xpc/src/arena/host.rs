//! The host's side of the arena: one shared memfd, reserved once and sparse, from which large blocks are handed out.
//!
//! The allocator is called from inside `malloc` (`ward run`'s shim), so it must never allocate itself: its state is
//! fixed-size arrays behind a spin lock, and it gives up (the caller then uses the C library) when they are full, the
//! arena is exhausted, or the request is small or over-aligned. Blocks are page-granular and each ends on a page
//! boundary, so a block's pages are its own and a domain lent the block can be given exactly those pages.
//!
//! Freed blocks stay resident for reuse up to [`RETAIN`] bytes (a video host frees and reallocates frames of one
//! size); beyond that their pages go back to the kernel.
//!
//! The arena is `MAP_SHARED`, which `fork` would share with the child: a child writing its copy of a heap buffer
//! would write the parent's. A fork handler therefore gives the child private copies of the live blocks and stops
//! the child allocating from the arena.

use std::cell::UnsafeCell;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::shm::{page_size, SharedMemory};

use super::ArenaError;

/// Blocks smaller than this come from the C library: below it a copy costs less than lending pages.
pub const MIN_BLOCK: usize = 1 << 20;
/// Address space the arena reserves (sparse: only pages in use take memory).
pub const DEFAULT_RESERVE: usize = 16 << 30;
/// Freed bytes kept resident for reuse before pages are returned to the kernel.
pub const RETAIN: usize = 256 << 20;
const MAX_BLOCKS: usize = 1024;
const MAX_FREE: usize = 1024;
/// `malloc`'s own alignment guarantee on x86-64.
const MIN_ALIGN: usize = 16;

static ARENA: OnceLock<SharedMemory> = OnceLock::new();
/// `[BASE, END)` is the arena's address range; both 0 until [`enable`].
static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// False until [`enable`], and again in a forked child (whose blocks are private copies).
static ALLOCATING: AtomicBool = AtomicBool::new(false);
static STATE: Locked = Locked { held: AtomicBool::new(false), state: UnsafeCell::new(State::EMPTY) };

/// A page-aligned range of the arena, as offsets.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: usize,
    len: usize,
}

/// A live block: its address, the pages it occupies, and the size asked for.
#[derive(Clone, Copy, Debug)]
struct Block {
    ptr: usize,
    span: Span,
}

impl Block {
    /// Bytes from `ptr` to the end of the block's last page.
    fn usable(&self, base: usize) -> usize {
        base + self.span.start + self.span.len - self.ptr
    }
}

struct State {
    blocks: [Block; MAX_BLOCKS],
    nblocks: usize,
    /// Free spans below `top`, sorted by start, never adjacent (merged on free).
    free: [Span; MAX_FREE],
    nfree: usize,
    /// Everything from here to the end of the arena has never been handed out (or came back in one piece).
    top: usize,
    /// Freed bytes whose pages are still resident (approximate: reuse subtracts what it takes).
    retained: usize,
}

impl State {
    const EMPTY: State = State {
        blocks: [Block { ptr: 0, span: Span { start: 0, len: 0 } }; MAX_BLOCKS],
        nblocks: 0,
        free: [Span { start: 0, len: 0 }; MAX_FREE],
        nfree: 0,
        top: 0,
        retained: 0,
    };

    fn find(&self, ptr: usize) -> Option<usize> {
        self.blocks[..self.nblocks].iter().position(|b| b.ptr == ptr)
    }

    /// Take `len` bytes: the first free span that fits, else the top. None when the arena is full.
    fn take(&mut self, len: usize, size: usize) -> Option<Span> {
        if let Some(i) = self.free[..self.nfree].iter().position(|s| s.len >= len) {
            let span = Span { start: self.free[i].start, len };
            self.free[i].start += len;
            self.free[i].len -= len;
            if self.free[i].len == 0 {
                self.free.copy_within(i + 1..self.nfree, i);
                self.nfree -= 1;
            }
            self.retained = self.retained.saturating_sub(len);
            return Some(span);
        }
        let end = self.top.checked_add(len)?;
        if end > size {
            return None;
        }
        let span = Span { start: self.top, len };
        self.top = end;
        self.retained = self.retained.saturating_sub(len);
        Some(span)
    }

    /// Give `span` back, merging it with its neighbours. False when the free list is full (the span is then lost
    /// to reuse; its pages are released by the caller).
    fn give_back(&mut self, span: Span) -> bool {
        let i = self.free[..self.nfree].partition_point(|s| s.start < span.start);
        let merges_prev = i > 0 && self.free[i - 1].start + self.free[i - 1].len == span.start;
        let merges_next = i < self.nfree && span.start + span.len == self.free[i].start;
        match (merges_prev, merges_next) {
            (true, true) => {
                self.free[i - 1].len += span.len + self.free[i].len;
                self.free.copy_within(i + 1..self.nfree, i);
                self.nfree -= 1;
            }
            (true, false) => self.free[i - 1].len += span.len,
            (false, true) => {
                self.free[i].start = span.start;
                self.free[i].len += span.len;
            }
            (false, false) => {
                if self.nfree == MAX_FREE {
                    return false;
                }
                self.free.copy_within(i..self.nfree, i + 1);
                self.free[i] = span;
                self.nfree += 1;
            }
        }
        // A free span that reaches the top joins it.
        if self.nfree > 0 {
            let last = self.free[self.nfree - 1];
            if last.start + last.len == self.top {
                self.top = last.start;
                self.nfree -= 1;
            }
        }
        true
    }
}

/// A spin lock that can be taken in a fork's prepare handler and released in another function: allocation is rare
/// (large blocks only) and short, so spinning with a yield is enough.
struct Locked {
    held: AtomicBool,
    state: UnsafeCell<State>,
}

// SAFETY: the state is only reached through `with`, which holds the lock for the whole access, so no two threads
// touch it at once.
unsafe impl Sync for Locked {}

impl Locked {
    fn acquire(&self) {
        while self.held.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
    }

    fn release(&self) {
        self.held.store(false, Ordering::Release);
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.acquire();
        // SAFETY: the lock is held until after `f` returns, so this is the only reference to the state.
        let r = f(unsafe { &mut *self.state.get() });
        self.release();
        r
    }
}

extern "C" {
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> libc::c_int;
}

unsafe extern "C" fn before_fork() {
    STATE.acquire();
}

unsafe extern "C" fn after_fork_parent() {
    STATE.release();
}

unsafe extern "C" fn after_fork_child() {
    privatise();
    STATE.release();
}

/// Create the arena (`reserve` bytes of address space) and start serving [`alloc`]. Idempotent: a second call
/// keeps the first arena.
pub fn enable(reserve: usize) -> Result<(), ArenaError> {
    if ARENA.get().is_some() {
        return Ok(());
    }
    let memory = SharedMemory::create("ward-arena", reserve)?;
    let base = memory.as_ptr() as usize;
    let len = memory.len();
    if ARENA.set(memory).is_err() {
        // Another thread won the race; its arena stands.
        return Ok(());
    }
    // SAFETY: the handlers only touch this module's statics and make system calls; they stay valid for the life of
    // the process (this is a static function set, never unregistered).
    let rc = unsafe { pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child)) };
    if rc != 0 {
        // Without the fork handler a child would share the parent's heap blocks: do not serve blocks at all.
        return Err(ArenaError::Map {
            what: "register the fork handler for",
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    BASE.store(base, Ordering::Relaxed);
    END.store(base + len, Ordering::Relaxed);
    ALLOCATING.store(true, Ordering::Release);
    Ok(())
}

/// The arena's descriptor, to pass to domains; None without an arena (or in a forked child, which lends nothing in
/// place).
pub fn shared_fd() -> Option<BorrowedFd<'static>> {
    if !ALLOCATING.load(Ordering::Acquire) {
        return None;
    }
    ARENA.get().map(|m| m.fd())
}

/// Whether `ptr` is inside the arena's address range (live block or not).
pub fn contains(ptr: *const u8) -> bool {
    let p = ptr as usize;
    p >= BASE.load(Ordering::Relaxed) && p < END.load(Ordering::Relaxed)
}

/// A block of at least `size` bytes aligned to `align` (a power of two), or None: the caller then allocates
/// elsewhere. Its contents are whatever the pages held (zero when fresh).
pub fn alloc(size: usize, align: usize) -> Option<*mut u8> {
    let page = page_size();
    let align = align.max(MIN_ALIGN);
    if size < MIN_BLOCK || align > page || !align.is_power_of_two() || !ALLOCATING.load(Ordering::Acquire) {
        return None;
    }
    let len = size.checked_add(page - 1)? / page * page;
    let base = BASE.load(Ordering::Relaxed);
    let arena_len = END.load(Ordering::Relaxed) - base;
    STATE.with(|st| {
        if st.nblocks == MAX_BLOCKS {
            return None;
        }
        let span = st.take(len, arena_len)?;
        // The block ends where its last page does; aligning down stays inside the first page, which the span starts
        // on (page-aligned, and align <= page).
        let ptr = (base + span.start + len - size) & !(align - 1);
        st.blocks[st.nblocks] = Block { ptr, span };
        st.nblocks += 1;
        Some(ptr as *mut u8)
    })
}

/// Free a block if `ptr` is one of the arena's: true when it was (the caller must not free it elsewhere). A pointer
/// in the arena's range that is not a live block (a double free) is ignored.
pub fn free(ptr: *mut u8) -> bool {
    if !contains(ptr) {
        return false;
    }
    let base = BASE.load(Ordering::Relaxed);
    let allocating = ALLOCATING.load(Ordering::Acquire);
    STATE.with(|st| {
        let Some(i) = st.find(ptr as usize) else { return };
        let span = st.blocks[i].span;
        st.blocks[i] = st.blocks[st.nblocks - 1];
        st.nblocks -= 1;
        if !allocating {
            // A forked child: the block is a private copy outside the arena's bookkeeping; it stays mapped.
            return;
        }
        let keep = st.retained + span.len <= RETAIN;
        if !keep || !st.give_back(span) {
            release_pages(base + span.start, span.len);
        } else {
            st.retained += span.len;
        }
    });
    true
}

/// The usable size of an arena block (from `ptr` to the end of its pages), or None if `ptr` is not one.
pub fn usable_size(ptr: *const u8) -> Option<usize> {
    if !contains(ptr) {
        return None;
    }
    let base = BASE.load(Ordering::Relaxed);
    STATE.with(|st| st.find(ptr as usize).map(|i| st.blocks[i].usable(base)))
}

/// Where `[ptr, ptr + len)` lies in the arena file, if it is inside one live block: its offset, for a rich pointer
/// of [`super::POOL_ARENA`].
pub fn locate(ptr: *const u8, len: usize) -> Option<u64> {
    if len == 0 || !contains(ptr) || !ALLOCATING.load(Ordering::Acquire) {
        return None;
    }
    let base = BASE.load(Ordering::Relaxed);
    let p = ptr as usize;
    let end = p.checked_add(len)?;
    STATE.with(|st| {
        st.blocks[..st.nblocks].iter().find(|b| p >= b.ptr && end <= b.ptr + b.usable(base)).map(|_| (p - base) as u64)
    })
}

/// Return a span's pages to the kernel (they read as zero afterwards).
fn release_pages(addr: usize, len: usize) {
    // SAFETY: the range is page-aligned, inside the arena mapping, and belongs to no live block (it was just freed),
    // so no one may rely on its contents; MADV_REMOVE only drops the pages of the shared file.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_REMOVE) };
}

/// In a forked child (the lock is held): replace each live block's pages by a private copy and stop allocating.
fn privatise() {
    ALLOCATING.store(false, Ordering::Release);
    let base = BASE.load(Ordering::Relaxed);
    // SAFETY: the fork handler holds the lock (taken in `before_fork`), and the child has one thread.
    let st = unsafe { &mut *STATE.state.get() };
    for b in &st.blocks[..st.nblocks] {
        let addr = base + b.span.start;
        let len = b.span.len;
        // SAFETY: a fresh private anonymous mapping chosen by the kernel overlaps nothing.
        let copy = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if copy == libc::MAP_FAILED {
            continue;
        }
        // SAFETY: both ranges are `len` bytes of readable/writable mappings (the block's pages and the fresh copy),
        // distinct mappings so they do not overlap; then the copy is moved over the block's pages (MREMAP_FIXED
        // unmaps what was there), so the block's address now holds private memory with the same bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(addr as *const u8, copy.cast::<u8>(), len);
            libc::mremap(copy, len, len, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, addr as *mut libc::c_void);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The arena is process-wide: one test exercises it end to end so nothing races on the statics.
    #[test]
    fn blocks_are_page_aligned_at_the_end_reused_and_located() {
        enable(1 << 30).unwrap();
        assert!(shared_fd().is_some());
        assert_eq!(alloc(4096, 16), None, "small blocks are not the arena's");
        let page = page_size();
        let size = (3 << 20) + 100;
        let a = alloc(size, 64).unwrap();
        assert!(contains(a));
        assert_eq!(a as usize % 64, 0);
        // The block ends within one alignment step of a page boundary.
        let end = a as usize + size;
        assert!(end.next_multiple_of(page) - end < 64, "block end {end:#x}");
        assert!(usable_size(a).unwrap() >= size);
        // SAFETY: the block is `size` writable bytes this test owns.
        unsafe { std::ptr::write_bytes(a, 0xab, size) };
        let off = locate(a, size).unwrap();
        assert_eq!(locate(a.wrapping_add(10), size - 10), Some(off + 10));
        assert_eq!(locate(a, size + page), None, "ranges past the block are not located");
        let b = alloc(2 << 20, 4096).unwrap();
        assert_eq!(b as usize % 4096, 0);
        assert!(free(a));
        assert_eq!(usable_size(a), None);
        assert_eq!(locate(a, 16), None, "a freed block is not located");
        // The freed span is reused for a block that fits in it.
        let c = alloc(3 << 20, 16).unwrap();
        assert!(c as usize <= a as usize && (c as usize) + (3 << 20) <= end.next_multiple_of(page));
        assert!(free(b) && free(c));
        assert!(!free(std::ptr::null_mut()));
        let mut on_heap = vec![0u8; 16];
        assert!(!free(on_heap.as_mut_ptr()), "pointers outside the arena are not its");
    }
}
