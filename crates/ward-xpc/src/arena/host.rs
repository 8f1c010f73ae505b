//! The host's side of the arena: large blocks, each a memfd of its own mapped at the block's address inside one
//! address range reserved once.
//!
//! The allocator is called from inside `malloc` (`ward run`'s shim), so it must never allocate itself: its state is
//! fixed-size arrays behind a spin lock, and it gives up (the caller then uses the C library) when they are full, the
//! reservation or the descriptor budget is exhausted, or the request is small or over-aligned. Blocks are
//! page-granular and each ends on a page boundary, so a block's pages are its own and a domain lent the block can be
//! given exactly those pages. Creating a block costs a few system calls (`memfd_create`, `ftruncate`, `fcntl`,
//! `mmap`), made outside the lock.
//!
//! A block is lent to a domain by descriptor ([`descriptor`]): a read-only reopen of its memfd, made once and kept,
//! or the read-write memfd itself. A block that was ever lent writable is never handed out again once freed: its
//! pages are unmapped and its memfd closed, so what a domain still holds of it is memory nobody else uses, and
//! [`retired`] tells the lenders to have their domains drop it. Other freed blocks are kept for reuse up to
//! [`RETAIN`] bytes, under the same id and descriptors (a video host frees and reallocates frames of one size, and
//! fresh pages for every frame cost more than the filter: ffmpeg's invert0r took 5x its native time); beyond that
//! they are released too. The price: a domain once lent a kept block read-only can read what the host puts in it
//! when it is handed out again (never write it).
//!
//! The blocks are `MAP_SHARED`, which `fork` would share with the child: a child writing its copy of a heap buffer
//! would write the parent's. A fork handler therefore gives the child private copies of the live blocks, closes the
//! child's copies of the descriptors and stops the child allocating from the arena.

use std::cell::UnsafeCell;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::shm::{page_size, reopen_read_only};

use super::{ArenaError, BlockRef, MAX_BLOCK_ID, MAX_BLOCK_LEN};

/// Blocks smaller than this come from the C library: below it a copy costs less than lending pages.
pub const MIN_BLOCK: usize = 1 << 20;
/// Address space the arena reserves (only pages of live and kept blocks take memory).
pub const DEFAULT_RESERVE: usize = 16 << 30;
/// Bytes of freed blocks (never lent writable) kept for reuse before blocks are released.
pub const RETAIN: usize = 256 << 20;
const MAX_BLOCKS: usize = 1024;
const MAX_FREE: usize = 1024;
const MAX_KEPT: usize = 64;
/// `malloc`'s own alignment guarantee on x86-64.
const MIN_ALIGN: usize = 16;
/// The memfds of live and kept blocks take at most this fraction of the process's descriptor limit (and their
/// read-only reopens as many again): the rest is the host's.
const DESCRIPTOR_SHARE: u64 = 8;

/// Set once the arena is set up (by [`enable`]).
static SET_UP: Mutex<bool> = Mutex::new(false);
/// `[BASE, END)` is the arena's address range; both 0 until [`enable`].
static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// False until [`enable`], and again in a forked child (whose blocks are private copies).
static ALLOCATING: AtomicBool = AtomicBool::new(false);
/// Blocks with a memfd (live and kept) at most.
static DESCRIPTOR_BUDGET: AtomicUsize = AtomicUsize::new(MAX_BLOCKS);
/// Lent blocks freed so far.
static RETIRED: AtomicU64 = AtomicU64::new(0);
static STATE: Locked = Locked { held: AtomicBool::new(false), state: UnsafeCell::new(State::EMPTY) };

/// A page-aligned range of the reservation, as offsets.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: usize,
    len: usize,
}

/// A live block: its address, the pages it occupies, its memfd.
#[derive(Clone, Copy, Debug)]
struct Block {
    ptr: usize,
    span: Span,
    id: u64,
    /// The block's memfd, read-write; -1 while the block is being created.
    fd: RawFd,
    /// A read-only reopen of the memfd, made the first time the block is lent read-only; -1 until then.
    read_only: RawFd,
    /// Lent to a domain at least once.
    lent: bool,
    /// Lent writable at least once: released, never kept, when freed (a domain may still write through its
    /// descriptor; what the host put there next would not be the host's alone).
    lent_writable: bool,
}

impl Block {
    /// Bytes from `ptr` to the end of the block's last page.
    fn usable(&self, base: usize) -> usize {
        base + self.span.start + self.span.len - self.ptr
    }
}

/// A freed block never lent writable, still mapped, kept for reuse (with its id and descriptors: a domain it was
/// lent to read-only keeps its descriptor, so the block is lent again without sending another).
#[derive(Clone, Copy, Debug)]
struct Kept {
    span: Span,
    id: u64,
    fd: RawFd,
    read_only: RawFd,
    lent: bool,
}

/// What is left to do outside the lock: unmap a block's pages and close its descriptors.
#[derive(Clone, Copy, Debug)]
struct Release {
    span: Span,
    fd: RawFd,
    read_only: RawFd,
}

struct State {
    blocks: [Block; MAX_BLOCKS],
    nblocks: usize,
    /// Kept blocks, oldest first.
    kept: [Kept; MAX_KEPT],
    nkept: usize,
    kept_bytes: usize,
    /// Free spans of the reservation below `top`, sorted by start, never adjacent (merged on free).
    free: [Span; MAX_FREE],
    nfree: usize,
    /// Everything from here to the end of the reservation has never been handed out (or came back in one piece).
    top: usize,
    /// The id of the next block created; ids are never reused.
    next_id: u64,
}

const NO_SPAN: Span = Span { start: 0, len: 0 };

impl State {
    const EMPTY: State = State {
        blocks: [Block { ptr: 0, span: NO_SPAN, id: 0, fd: -1, read_only: -1, lent: false, lent_writable: false };
            MAX_BLOCKS],
        nblocks: 0,
        kept: [Kept { span: NO_SPAN, id: 0, fd: -1, read_only: -1, lent: false }; MAX_KEPT],
        nkept: 0,
        kept_bytes: 0,
        free: [NO_SPAN; MAX_FREE],
        nfree: 0,
        top: 0,
        next_id: 1,
    };

    fn find(&self, ptr: usize) -> Option<usize> {
        self.blocks[..self.nblocks].iter().position(|b| b.ptr == ptr)
    }

    fn find_id(&self, id: u64) -> Option<usize> {
        self.blocks[..self.nblocks].iter().position(|b| b.id == id)
    }

    fn remove(&mut self, i: usize) -> Block {
        let b = self.blocks[i];
        self.blocks[i] = self.blocks[self.nblocks - 1];
        self.nblocks -= 1;
        b
    }

    fn remove_kept(&mut self, i: usize) -> Kept {
        let k = self.kept[i];
        self.kept.copy_within(i + 1..self.nkept, i);
        self.nkept -= 1;
        self.kept_bytes -= k.span.len;
        k
    }

    /// Take `len` bytes of the reservation: the first free span that fits, else the top. None when it is full.
    fn take(&mut self, len: usize, size: usize) -> Option<Span> {
        if let Some(i) = self.free[..self.nfree].iter().position(|s| s.len >= len) {
            let span = Span { start: self.free[i].start, len };
            self.free[i].start += len;
            self.free[i].len -= len;
            if self.free[i].len == 0 {
                self.free.copy_within(i + 1..self.nfree, i);
                self.nfree -= 1;
            }
            return Some(span);
        }
        let end = self.top.checked_add(len)?;
        if end > size {
            return None;
        }
        let span = Span { start: self.top, len };
        self.top = end;
        Some(span)
    }

    /// Give `span` back, merging it with its neighbours. When the free list is full the span is lost to reuse
    /// (address space only: its pages were released).
    fn give_back(&mut self, span: Span) {
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
                    return;
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
    }
}

/// A spin lock that can be taken in a fork's prepare handler and released in another function: allocation is rare
/// (large blocks only) and short, so spinning with a yield is enough.
struct Locked {
    held: AtomicBool,
    state: UnsafeCell<State>,
}

// SAFETY: the state is only reached through `with`, which holds the lock for the whole access, so no two threads
// touch it at once (and the fork handler, which holds it too).
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

/// Reserve the arena (`reserve` bytes of address space) and start serving [`alloc`]. Idempotent: a second call
/// keeps the first arena.
pub fn enable(reserve: usize) -> Result<(), ArenaError> {
    let mut set_up = SET_UP.lock().unwrap_or_else(|e| e.into_inner());
    if *set_up {
        return Ok(());
    }
    let page = page_size();
    let reserve = reserve.div_ceil(page) * page;
    let base =
        crate::shm::reserve(reserve).map_err(|source| ArenaError::Map { what: "reserve address space for", source })?;
    // SAFETY: the handlers only touch this module's statics and make system calls; they stay valid for the life of
    // the process (this is a static function set, never unregistered).
    let rc = unsafe { pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child)) };
    if rc != 0 {
        // Without the fork handler a child would share the parent's heap blocks: do not serve blocks at all.
        // SAFETY: unmapping the reservation just made, which nothing uses.
        unsafe { libc::munmap(base, reserve) };
        return Err(ArenaError::Map {
            what: "register the fork handler for",
            source: std::io::Error::from_raw_os_error(rc),
        });
    }
    DESCRIPTOR_BUDGET.store(descriptor_budget(), Ordering::Relaxed);
    BASE.store(base as usize, Ordering::Relaxed);
    END.store(base as usize + reserve, Ordering::Relaxed);
    ALLOCATING.store(true, Ordering::Release);
    *set_up = true;
    Ok(())
}

/// How many blocks may hold a memfd at once: a share of the descriptor limit, so the host keeps most of its table.
fn descriptor_budget() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the rlimit it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return MAX_BLOCKS;
    }
    usize::try_from(limit.rlim_cur / DESCRIPTOR_SHARE).unwrap_or(MAX_BLOCKS).clamp(1, MAX_BLOCKS)
}

/// Whether the arena serves blocks (not before [`enable`], nor in a forked child, which lends nothing in place).
pub fn enabled() -> bool {
    ALLOCATING.load(Ordering::Acquire)
}

/// Whether `ptr` is inside the arena's address range (live block or not).
pub fn contains(ptr: *const u8) -> bool {
    let p = ptr as usize;
    p >= BASE.load(Ordering::Relaxed) && p < END.load(Ordering::Relaxed)
}

/// The address of a block of `size` bytes aligned to `align` that ends as close to the end of `span` as alignment
/// allows: aligning down stays inside the span's first page or later (the span holds `size`, align <= page).
fn place(base: usize, span: Span, size: usize, align: usize) -> usize {
    (base + span.start + span.len - size) & !(align - 1)
}

/// What [`alloc`] found to do under the lock.
enum Plan {
    /// A kept block serves: nothing more to do.
    Reused(usize),
    /// A new block, to create outside the lock; `evicted` is a kept block released to stay within the budget.
    Create { ptr: usize, id: u64, span: Span, evicted: Option<Release> },
}

/// A block of at least `size` bytes aligned to `align` (a power of two), or None: the caller then allocates
/// elsewhere. Its contents are whatever the pages held (zero when fresh).
pub fn alloc(size: usize, align: usize) -> Option<*mut u8> {
    // Every allocation of the host passes here: the common answer (a small block) first, before anything else.
    if size < MIN_BLOCK {
        return None;
    }
    let page = page_size();
    let align = align.max(MIN_ALIGN);
    if align > page || !align.is_power_of_two() || !ALLOCATING.load(Ordering::Acquire) {
        return None;
    }
    let len = size.checked_add(page - 1)? / page * page;
    if len > MAX_BLOCK_LEN {
        return None;
    }
    let base = BASE.load(Ordering::Relaxed);
    let reserved = END.load(Ordering::Relaxed) - base;
    let budget = DESCRIPTOR_BUDGET.load(Ordering::Relaxed);
    let plan = STATE.with(|st| {
        if st.nblocks == MAX_BLOCKS {
            return None;
        }
        // A kept block that holds it without wasting more than it uses: the smallest such.
        let fits = st.kept[..st.nkept]
            .iter()
            .enumerate()
            .filter(|(_, k)| k.span.len >= len && k.span.len / 2 < len)
            .min_by_key(|(_, k)| k.span.len)
            .map(|(i, _)| i);
        if let Some(i) = fits {
            let k = st.remove_kept(i);
            let ptr = place(base, k.span, size, align);
            st.blocks[st.nblocks] = Block {
                ptr,
                span: k.span,
                id: k.id,
                fd: k.fd,
                read_only: k.read_only,
                lent: k.lent,
                lent_writable: false,
            };
            st.nblocks += 1;
            return Some(Plan::Reused(ptr));
        }
        let over_budget = st.nblocks + st.nkept >= budget;
        if st.next_id > MAX_BLOCK_ID || (over_budget && st.nkept == 0) {
            return None;
        }
        let span = st.take(len, reserved)?;
        // Within the budget of descriptors: the oldest kept block makes room.
        let evicted = over_budget.then(|| {
            let k = st.remove_kept(0);
            if k.lent {
                RETIRED.fetch_add(1, Ordering::Release);
            }
            Release { span: k.span, fd: k.fd, read_only: k.read_only }
        });
        let id = st.next_id;
        st.next_id += 1;
        let ptr = place(base, span, size, align);
        // Listed while it is created (fd -1), so its slot is taken; nobody knows its address or id yet.
        st.blocks[st.nblocks] = Block { ptr, span, id, fd: -1, read_only: -1, lent: false, lent_writable: false };
        st.nblocks += 1;
        Some(Plan::Create { ptr, id, span, evicted })
    })?;
    let (ptr, id, span) = match plan {
        Plan::Reused(ptr) => return Some(ptr as *mut u8),
        Plan::Create { ptr, id, span, evicted } => {
            if let Some(evicted) = evicted {
                release(evicted);
            }
            (ptr, id, span)
        }
    };
    match create_block(base + span.start, span.len) {
        Ok(fd) => {
            STATE.with(|st| {
                if let Some(i) = st.find_id(id) {
                    st.blocks[i].fd = fd;
                }
            });
            Some(ptr as *mut u8)
        }
        Err(()) => {
            STATE.with(|st| {
                if let Some(i) = st.find_id(id) {
                    st.remove(i);
                }
            });
            release(Release { span, fd: -1, read_only: -1 });
            None
        }
    }
}

/// Create a sealed memfd of `len` bytes and map it read-write and shared at `addr` (a span of the reservation this
/// thread alone holds): its descriptor.
fn create_block(addr: usize, len: usize) -> Result<RawFd, ()> {
    // SAFETY: memfd_create takes a NUL-terminated name (a literal) and flags.
    let fd = unsafe { libc::memfd_create(c"ward-arena".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(());
    }
    // SAFETY: ftruncate and fcntl on the memfd just created, which this function owns; no memory is involved. The
    // seals keep a domain lent the block read-write from resizing it under the host (accesses past a shrunk end
    // would raise SIGBUS in the host).
    let sized = unsafe {
        libc::ftruncate(fd, len as libc::off_t) == 0
            && libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) == 0
    };
    // SAFETY: MAP_FIXED over [addr, addr + len), a span of the arena's reservation that no block uses and that only
    // this thread holds (taken under the lock); nothing Rust owns is there.
    let mapped = sized
        && unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            )
        } != libc::MAP_FAILED;
    if !mapped {
        // SAFETY: closing the memfd this function created.
        unsafe { libc::close(fd) };
        return Err(());
    }
    Ok(fd)
}

/// Unmap a block's pages (an inaccessible reservation takes their place, so the span can serve again) and close its
/// descriptors; then its span is free.
fn release(r: Release) {
    let base = BASE.load(Ordering::Relaxed);
    // SAFETY: MAP_FIXED over a span of the reservation that belongs to no live block (it was just removed from the
    // state, or never handed out), so no one may rely on its contents.
    let reserved = unsafe {
        libc::mmap(
            (base + r.span.start) as *mut libc::c_void,
            r.span.len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    for fd in [r.fd, r.read_only] {
        if fd >= 0 {
            // SAFETY: the block's descriptors, owned by the arena and listed nowhere any more.
            unsafe { libc::close(fd) };
        }
    }
    // A span that could not be unmapped is not handed out again (only its address space is lost).
    if reserved != libc::MAP_FAILED && r.span.len > 0 {
        STATE.with(|st| st.give_back(r.span));
    }
}

/// Free a block if `ptr` is one of the arena's: true when it was (the caller must not free it elsewhere). A pointer
/// in the arena's range that is not a live block (a double free) is ignored.
pub fn free(ptr: *mut u8) -> bool {
    if !contains(ptr) {
        return false;
    }
    let allocating = ALLOCATING.load(Ordering::Acquire);
    let released = STATE.with(|st| {
        let i = st.find(ptr as usize)?;
        let b = st.remove(i);
        if !allocating || b.fd < 0 {
            // A forked child: the block is a private copy outside the arena's bookkeeping; it stays mapped.
            return None;
        }
        if !b.lent_writable && st.kept_bytes + b.span.len <= RETAIN && st.nkept < MAX_KEPT {
            st.kept[st.nkept] = Kept { span: b.span, id: b.id, fd: b.fd, read_only: b.read_only, lent: b.lent };
            st.nkept += 1;
            st.kept_bytes += b.span.len;
            return None;
        }
        if b.lent {
            RETIRED.fetch_add(1, Ordering::Release);
        }
        Some(Release { span: b.span, fd: b.fd, read_only: b.read_only })
    });
    if let Some(r) = released {
        release(r);
    }
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

/// Where `[ptr, ptr + len)` lies, if it is inside one live block: the block and the offset in it, for a rich
/// pointer of [`super::POOL_ARENA`].
pub fn locate(ptr: *const u8, len: usize) -> Option<BlockRef> {
    if len == 0 || !contains(ptr) || !ALLOCATING.load(Ordering::Acquire) {
        return None;
    }
    let base = BASE.load(Ordering::Relaxed);
    let p = ptr as usize;
    let end = p.checked_add(len)?;
    STATE.with(|st| {
        st.blocks[..st.nblocks]
            .iter()
            .find(|b| b.fd >= 0 && p >= b.ptr && end <= b.ptr + b.usable(base))
            .map(|b| BlockRef { block: b.id, offset: (p - (base + b.span.start)) as u64 })
    })
}

/// A descriptor of live block `block` to lend to a domain: read-only (a reopen of the memfd, made once and kept
/// with the block) unless `writable`. The block counts as lent from now on: once freed it is never handed out
/// again. None when the block is not live or the descriptor cannot be made (the caller copies instead).
pub fn descriptor(block: u64, writable: bool) -> Option<OwnedFd> {
    if !ALLOCATING.load(Ordering::Acquire) {
        return None;
    }
    STATE.with(|st| {
        let i = st.find_id(block)?;
        let b = &mut st.blocks[i];
        if b.fd < 0 {
            return None;
        }
        if !writable && b.read_only < 0 {
            // SAFETY: the block's memfd is open while the block is live, and the lock keeps it so for this call.
            let fd = unsafe { BorrowedFd::borrow_raw(b.fd) };
            let reopened = reopen_read_only(fd).ok()?;
            b.read_only = std::os::fd::IntoRawFd::into_raw_fd(reopened);
        }
        b.lent = true;
        b.lent_writable |= writable;
        let source = if writable { b.fd } else { b.read_only };
        // SAFETY: F_DUPFD_CLOEXEC duplicates a descriptor the block owns (open while the lock is held); the copy is
        // new and the caller's alone.
        let copy = unsafe { libc::fcntl(source, libc::F_DUPFD_CLOEXEC, 0) };
        // SAFETY: `copy` is a new descriptor that nothing else owns.
        (copy >= 0).then(|| unsafe { OwnedFd::from_raw_fd(copy) })
    })
}

/// Whether block `block` is live (allocated, or freed and kept for reuse under the same id): a domain that holds
/// it may keep holding it.
pub fn is_live(block: u64) -> bool {
    STATE.with(|st| st.find_id(block).is_some() || st.kept[..st.nkept].iter().any(|k| k.id == block))
}

/// How many lent blocks have been freed so far: when it changes, the blocks a lender's domain holds may include
/// some that are no longer live ([`is_live`]), for the domain to drop.
pub fn retired() -> u64 {
    RETIRED.load(Ordering::Acquire)
}

/// In a forked child (the lock is held): replace each live block's pages by a private copy, close the child's
/// copies of the arena's descriptors, and stop allocating.
fn privatise() {
    ALLOCATING.store(false, Ordering::Release);
    let base = BASE.load(Ordering::Relaxed);
    // SAFETY: the fork handler holds the lock (taken in `before_fork`), and the child has one thread.
    let st = unsafe { &mut *STATE.state.get() };
    for b in &mut st.blocks[..st.nblocks] {
        // A block another thread of the parent was creating (no descriptor yet) was never handed out here, and may
        // not be mapped: nothing to copy.
        let created = b.fd >= 0;
        for fd in [b.fd, b.read_only] {
            if fd >= 0 {
                // SAFETY: the child's copy of a descriptor the arena owns; the child lends nothing.
                unsafe { libc::close(fd) };
            }
        }
        b.fd = -1;
        b.read_only = -1;
        let addr = base + b.span.start;
        let len = b.span.len;
        if !created {
            continue;
        }
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
    for k in &mut st.kept[..st.nkept] {
        for fd in [k.fd, k.read_only] {
            if fd >= 0 {
                // SAFETY: the child's copy of a descriptor the arena owns, closed once (reset to -1 below); kept
                // blocks are never handed out in the child, so nothing there uses it.
                unsafe { libc::close(fd) };
            }
        }
        k.fd = -1;
        k.read_only = -1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Map `len` bytes of `fd` shared with `prot`: the address, or the error.
    fn map(fd: &OwnedFd, len: usize, prot: libc::c_int) -> std::io::Result<*mut u8> {
        // SAFETY: a fresh mapping chosen by the kernel; the test unmaps it.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(p.cast())
    }

    // The arena is process-wide: one test exercises it end to end so nothing races on the statics.
    #[test]
    fn blocks_are_page_aligned_at_the_end_lent_by_descriptor_reused_only_if_never_lent_writable() {
        enable(1 << 30).unwrap();
        assert!(enabled());
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
        let at = locate(a, size).unwrap();
        assert_eq!(locate(a.wrapping_add(10), size - 10), Some(BlockRef { offset: at.offset + 10, ..at }));
        assert_eq!(locate(a, size + page), None, "ranges past the block are not located");

        // Lent read-only: the descriptor maps for reading, never shared and writable.
        let read_only = descriptor(at.block, false).unwrap();
        let file_len = at.offset as usize + size;
        let err = map(&read_only, file_len, libc::PROT_READ | libc::PROT_WRITE).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES));
        let seen = map(&read_only, file_len, libc::PROT_READ).unwrap();
        // SAFETY: the mapping is file_len readable bytes; the block's bytes start at at.offset.
        assert_eq!(unsafe { *seen.add(at.offset as usize + size - 1) }, 0xab);
        // Lent read-write: what the domain writes, the host sees.
        let read_write = descriptor(at.block, true).unwrap();
        let written = map(&read_write, file_len, libc::PROT_READ | libc::PROT_WRITE).unwrap();
        // SAFETY: the mapping is file_len writable bytes.
        unsafe { *written.add(at.offset as usize) = 0x11 };
        // SAFETY: the block's first byte, this test's.
        assert_eq!(unsafe { *a }, 0x11);
        // SAFETY: unmapping the two test mappings made above.
        unsafe {
            libc::munmap(seen.cast(), file_len);
            libc::munmap(written.cast(), file_len);
        }

        // Freed after being lent: retired, and its memory never serves again.
        let retired_before = retired();
        assert!(is_live(at.block));
        assert!(free(a));
        assert_eq!(usable_size(a), None);
        assert_eq!(locate(a, 16), None, "a freed block is not located");
        assert!(!is_live(at.block));
        assert_eq!(retired(), retired_before + 1);
        assert!(descriptor(at.block, false).is_none(), "a freed block is lent no more");
        let b = alloc(size, 64).unwrap();
        let b_at = locate(b, size).unwrap();
        assert_ne!(b_at.block, at.block, "a lent block is never reused");
        // SAFETY: the new block's first byte, this test's: fresh memory, not the lent block's.
        assert_eq!(unsafe { *b }, 0, "a new block starts zeroed");
        // The descriptors the domain would still hold see the old block, not the new one.
        // SAFETY: the new block's first byte.
        unsafe { *b = 0x77 };
        let stale = map(&read_write, file_len, libc::PROT_READ).unwrap();
        // SAFETY: the mapping is file_len readable bytes.
        assert_eq!(unsafe { *stale.add(at.offset as usize) }, 0x11);
        // SAFETY: unmapping the test mapping.
        unsafe { libc::munmap(stale.cast(), file_len) };

        // Freed without being lent: kept, and the next block of that size is the same one.
        assert!(free(b));
        assert_eq!(retired(), retired_before + 1, "a block never lent is not retired");
        let c = alloc(size, 64).unwrap();
        assert_eq!(locate(c, size).map(|r| r.block), Some(b_at.block), "a block never lent is reused");
        let d = alloc(2 << 20, 4096).unwrap();
        assert_eq!(d as usize % 4096, 0);

        // Lent read-only only: kept when freed, live under its id, not retired, and handed out again as the same
        // block, whose read-only descriptor (still the domain's) sees what the host writes next, and never writes.
        let c_at = locate(c, size).unwrap();
        let held = descriptor(c_at.block, false).unwrap();
        assert!(free(c));
        assert!(is_live(c_at.block), "a block lent read-only only is kept under its id");
        assert_eq!(retired(), retired_before + 1, "a block lent read-only only is not retired");
        let e = alloc(size, 64).unwrap();
        assert_eq!(locate(e, size).map(|r| r.block), Some(c_at.block), "a block lent read-only only is reused");
        // SAFETY: the reused block's first byte, this test's.
        unsafe { *e = 0x5a };
        let file_len = c_at.offset as usize + size;
        let seen = map(&held, file_len, libc::PROT_READ).unwrap();
        // SAFETY: the mapping is file_len readable bytes.
        assert_eq!(unsafe { *seen.add(c_at.offset as usize) }, 0x5a);
        // SAFETY: unmapping the test mapping.
        unsafe { libc::munmap(seen.cast(), file_len) };
        assert!(map(&held, file_len, libc::PROT_READ | libc::PROT_WRITE).is_err(), "and never writable");
        // Lent writable once: retired when freed, never kept.
        drop(descriptor(c_at.block, true).unwrap());
        assert!(free(e));
        assert!(!is_live(c_at.block), "a block once lent writable is not kept");
        assert_eq!(retired(), retired_before + 2);
        assert!(free(d));
        assert!(!free(std::ptr::null_mut()));
        let mut on_heap = vec![0u8; 16];
        assert!(!free(on_heap.as_mut_ptr()), "pointers outside the arena are not its");
    }
}
