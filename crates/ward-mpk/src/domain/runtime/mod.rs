//! The domain runtime: ward's own implementation of the imports an mpk domain cannot take from the host's libc
//! (its heap, errno, atexit list, random-number state, and `setjmp`/`longjmp`), and the functions that turn `exit`, `abort` and their
//! kind into faults.
//!
//! Every function here runs inside the domain, on its stack, with its rights: it reads host memory at most and
//! writes only the domain's. Its state is a [`RuntimeBlock`] in the domain's memory, so the snapshot taken after
//! load restores it with everything else. The extension's imports are bound to *thunks* in the domain's code
//! pages, one per import: `mov r9, block; mov rax, function; jmp rax`. None of these functions takes six
//! arguments, so the block arrives as the sixth.
//!
//! Several host threads may run in a domain at once, so a function holds the block's lock while it uses the block
//! ([`block`]). A thread that faults holding it leaves it held; the restore after the fault puts the lock word back
//! with the block, and the domain's other threads were ended before that (`gate::Occupancy`).
//!
//! # Safety: the thunk contract
//!
//! Every `rt_` function here and in the submodules, and every `lf_` one in `libfault`, is an `unsafe extern "C" fn`
//! with one contract, which each names instead of restating it: it is called only through a thunk of the domain it
//! serves (or by a test standing in for one), so
//! - `b`, the sixth argument, is that domain's [`RuntimeBlock`] (for the functions that read it: the lock
//!   functions do not), laid out by [`RuntimeBlock::init`] with its lock word [`LOCK_BYTES`] before it, alive for
//!   the call;
//! - it runs on a thread inside that domain, with the domain's rights, or on a host thread whose rights cover the
//!   domain's memory;
//! - every other argument is what the C function it stands for is given by a caller keeping that function's own
//!   contract (a pointer names memory of the size the C function reads or writes, a string ends in a NUL, a
//!   comparison function is one). An extension that breaks it faults in its own domain, as it would in its own
//!   process: the function's unsafe operations touch only what the arguments name, with the domain's rights.

use std::ffi::c_void;
use std::ops::{Deref, DerefMut};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

mod jumps;
mod libfault;
mod libraries;
mod locks;
mod mappings;

pub use self::libfault::function as library_fault_function;
use self::libfault::FaultPlan;
pub use self::libfault::{InjectedFault, InjectedFaultKind};
pub use self::libraries::LibraryTable;
use self::mappings::Protection;
use super::gate::Ending;

/// Size classes of the heap: class `k` holds blocks of `16 << k` bytes, header included.
const CLASSES: usize = 36;
/// Bytes before every pointer the heap hands out.
const HEADER: usize = 16;
/// Marks a live block's header; anything else handed to `free` is a fault of the domain.
const LIVE: u32 = 0x5741_5244;
/// Destructors `__cxa_atexit` can hold.
const ATEXIT_SLOTS: usize = 64;
/// glibc's `random()` state: the TYPE_3 additive generator, `r[i] = r[i-3] + r[i-31]`.
const RANDOM_DEG: usize = 31;
const RANDOM_SEP: usize = 3;

/// Bytes before the block in the runtime page: its lock word, on a cache line of its own. The word lies outside
/// the block because the thread holding the lock borrows the whole block.
pub const LOCK_BYTES: usize = 64;

/// The runtime's state, [`LOCK_BYTES`] into the domain's runtime page.
#[repr(C)]
pub struct RuntimeBlock {
    heap_start: usize,
    heap_top: usize,
    heap_end: usize,
    /// When not 0, the heap past `committed` (page-aligned, at or past `heap_top`) is kept inaccessible, as the
    /// end of a process's heap is: a write that runs off the end of the last block faults instead of landing in the
    /// quota's unused memory. The heap grows it a page at a time.
    guard_top: u32,
    committed: usize,
    free: [usize; CLASSES],
    /// Set when an allocation failed for want of room (the quota).
    pub exhausted: u32,
    random: [u32; RANDOM_DEG],
    random_front: u32,
    random_rear: u32,
    rand48: [u16; 3],
    rand48_mult: [u16; 3],
    rand48_add: u16,
    /// Where `strtok` goes on from: the domain's own, as its random state is.
    strtok_next: *mut libc::c_char,
    /// `std::nothrow`: the object the nothrow forms of `new` take (its address only matters).
    nothrow: u8,
    atexit_count: usize,
    atexit: [(usize, usize); ATEXIT_SLOTS],
    /// The domain's protection key, which the runtime's `mprotect` applies.
    key: u32,
    /// The page size and processor count `sysconf` answers with.
    page: usize,
    processors: i64,
    /// Pages of the heap whose protection `mprotect` changed from read-write, in the order it changed them.
    protected_count: usize,
    protected: [Protection; mappings::PROTECTED_SLOTS],
    /// The libraries loaded with the extension, which its `dlopen` opens (see [`LibraryTable`]).
    libraries: usize,
    libraries_len: usize,
    /// The message `dlerror` hands out, NUL-terminated, and whether one is pending.
    dl_error_pending: u32,
    dl_error: [u8; libraries::ERROR_BYTES],
    /// The run-time library fault the calls of one image get (the policy's `library_fault`), and its count.
    library_fault: FaultPlan,
}

impl RuntimeBlock {
    /// Lays out a fresh block at `block` with the heap `[heap, heap + heap_len)`.
    ///
    /// # Safety
    /// `block` is writable memory of `size_of::<RuntimeBlock>()` bytes, aligned for it, used by nothing else.
    pub unsafe fn init(block: *mut RuntimeBlock, heap: usize, heap_len: usize, key: u32) {
        // SAFETY: `block` is writable, aligned and unshared (this function's contract); all-zero is a valid block
        // (every field is an integer, a null pointer or an array of integers).
        unsafe {
            ptr::write_bytes(block, 0, 1);
            (*block).heap_start = heap;
            (*block).heap_top = heap;
            (*block).heap_end = heap + heap_len;
            (*block).key = key;
            (*block).page = super::memory::page_size();
            (*block).processors = std::thread::available_parallelism().map_or(1, |n| n.get() as i64);
            srandom_state(&mut *block, 1);
            (*block).rand48_mult = [0xe66d, 0xdeec, 0x5];
            (*block).rand48_add = 0xb;
        }
    }

    /// Injects `fault` into the calls bound to [`library_fault_function`]s.
    pub fn set_library_fault(&mut self, fault: impl Into<InjectedFault>) {
        self.library_fault = FaultPlan::new(&fault.into());
    }

    /// Keeps the heap past what is in use inaccessible from now on (the caller has made it so): see `guard_top`.
    pub fn guard_heap_top(&mut self) {
        self.guard_top = 1;
        self.committed = self.heap_top.next_multiple_of(self.page);
    }

    /// Where the accessible heap ends when the rest is kept inaccessible (a restore puts that back).
    pub fn heap_committed(&self) -> Option<usize> {
        (self.guard_top != 0).then(|| self.committed.clamp(self.heap_start, self.heap_end))
    }

    /// The part of the heap in use since the block was laid out: what a snapshot must keep.
    pub fn heap_used(&self) -> (usize, usize) {
        (self.heap_start, self.heap_top)
    }

    /// Hands the domain the libraries its `dlopen` opens: a table laid out by [`LibraryTable`] at `at`.
    pub fn set_libraries(&mut self, at: usize, len: usize) {
        self.libraries = at;
        self.libraries_len = len;
    }

    /// The heap's ranges whose protection the domain changed, clamped to the heap: what a restore re-applies.
    pub fn protected_ranges(&self) -> Vec<(usize, usize, i32)> {
        mappings::ranges(self)
    }

    /// The address of `std::nothrow` in this block.
    pub fn nothrow_address(block: *mut RuntimeBlock) -> usize {
        block as usize + std::mem::offset_of!(RuntimeBlock, nothrow)
    }

    /// Whether an allocation failed for want of room: a hint for classifying a fault, read while other threads
    /// may be running in the domain (and writing the word), as shared memory is read.
    ///
    /// # Safety
    /// `block` is a block laid out by [`RuntimeBlock::init`], readable by this thread.
    pub unsafe fn exhausted(block: *const RuntimeBlock) -> bool {
        // SAFETY: the caller's guarantee; the word is an aligned u32, read as an atomic (the domain's threads write
        // it as a plain word, so a value read is one some thread wrote).
        unsafe { AtomicU32::from_ptr(ptr::addr_of!((*block).exhausted).cast_mut()).load(Ordering::Relaxed) != 0 }
    }

    /// Destructors registered with `__cxa_atexit`, newest first.
    pub fn destructors(&self) -> Vec<(usize, usize)> {
        let n = self.atexit_count.min(ATEXIT_SLOTS);
        self.atexit[..n].iter().rev().copied().collect()
    }
}

/// A runtime function as the thunk calls it: up to five arguments of the import, then the block.
type Raw = *const c_void;

/// The runtime's functions by import name. Names not here that the classification calls domain runtime are
/// data (`std::nothrow`, bound by the backend).
pub fn function(name: &str) -> Option<Raw> {
    let f: Raw = match name {
        "malloc" | "_Znwm" | "_Znam" => rt_malloc as Raw,
        "_ZnwmRKSt9nothrow_t" | "_ZnamRKSt9nothrow_t" => rt_malloc as Raw,
        "calloc" => rt_calloc as Raw,
        "realloc" => rt_realloc as Raw,
        "reallocarray" => rt_reallocarray as Raw,
        "free"
        | "cfree"
        | "_ZdlPv"
        | "_ZdaPv"
        | "_ZdlPvm"
        | "_ZdaPvm"
        | "_ZdlPvRKSt9nothrow_t"
        | "_ZdaPvRKSt9nothrow_t"
        | "_ZdlPvSt11align_val_t"
        | "_ZdaPvSt11align_val_t"
        | "_ZdlPvmSt11align_val_t"
        | "_ZdaPvmSt11align_val_t"
        | "_ZdlPvSt11align_val_tRKSt9nothrow_t"
        | "_ZdaPvSt11align_val_tRKSt9nothrow_t" => rt_free as Raw,
        "posix_memalign" => rt_posix_memalign as Raw,
        "aligned_alloc" | "memalign" => rt_memalign as Raw,
        "_ZnwmSt11align_val_t" | "_ZnamSt11align_val_t" => rt_new_aligned as Raw,
        "_ZnwmSt11align_val_tRKSt9nothrow_t" | "_ZnamSt11align_val_tRKSt9nothrow_t" => rt_new_aligned as Raw,
        "valloc" => rt_valloc as Raw,
        "pvalloc" => rt_pvalloc as Raw,
        "malloc_usable_size" => rt_usable_size as Raw,
        "strdup" | "__strdup" => rt_strdup as Raw,
        "strndup" | "__strndup" => rt_strndup as Raw,
        "wcsdup" => rt_wcsdup as Raw,
        "qsort" => rt_qsort as Raw,
        "qsort_r" => rt_qsort_r as Raw,
        "__cxa_atexit" => rt_cxa_atexit as Raw,
        "__tls_get_addr" => super::thread_block::tls_get_addr(),
        "__cxa_finalize" => rt_cxa_finalize as Raw,
        "rand" | "random" | "lrand48" => rt_random as Raw,
        "srand" | "srandom" => rt_srandom as Raw,
        "initstate" => rt_initstate as Raw,
        "setstate" => rt_setstate as Raw,
        "drand48" => rt_drand48 as Raw,
        "srand48" => rt_srand48 as Raw,
        "mrand48" => rt_mrand48 as Raw,
        "seed48" => rt_seed48 as Raw,
        "lcong48" => rt_lcong48 as Raw,
        "strtok" => rt_strtok as Raw,
        "mmap" | "mmap64" => mappings::rt_mmap as Raw,
        "munmap" => mappings::rt_munmap as Raw,
        "mprotect" => mappings::rt_mprotect as Raw,
        "sysconf" | "__sysconf" => mappings::rt_sysconf as Raw,
        "pthread_mutex_init" => locks::rt_mutex_init as Raw,
        "pthread_mutex_destroy" | "pthread_mutexattr_destroy" => locks::rt_destroy as Raw,
        "pthread_mutex_lock" => locks::rt_mutex_lock as Raw,
        "pthread_mutex_trylock" => locks::rt_mutex_trylock as Raw,
        "pthread_mutex_unlock" => locks::rt_mutex_unlock as Raw,
        "pthread_mutexattr_init" => locks::rt_mutexattr_init as Raw,
        "pthread_mutexattr_settype" => locks::rt_mutexattr_settype as Raw,
        "pthread_mutexattr_gettype" => locks::rt_mutexattr_gettype as Raw,
        "dlopen" => libraries::rt_dlopen as Raw,
        "dlsym" => libraries::rt_dlsym as Raw,
        "dlerror" => libraries::rt_dlerror as Raw,
        "dlclose" => libraries::rt_dlclose as Raw,
        "_setjmp" | "setjmp" | "__sigsetjmp" => jumps::setjmp(),
        "longjmp" | "_longjmp" | "siglongjmp" => jumps::longjmp(),
        "__longjmp_chk" => jumps::longjmp_checked(),
        _ => return None,
    };
    Some(f)
}

/// The fault function for an import of the `exit` group.
pub fn fault_function(name: &str) -> Raw {
    match name {
        "exit" | "_exit" | "_Exit" | "quick_exit" => rt_exit as Raw,
        _ => rt_abort as Raw,
    }
}

/// Stops the domain here: an illegal instruction, which the gate turns into a fault of the call.
fn stop() -> ! {
    // SAFETY: `ud2` raises SIGILL and never returns; the gate's handler takes the thread back to the host.
    unsafe { std::arch::asm!("ud2", options(noreturn, nomem, nostack)) }
}

// ---- heap ----

fn class_for(bytes: usize) -> Option<usize> {
    let total = bytes.checked_add(HEADER)?.max(2 * HEADER);
    let class = (total.next_power_of_two().trailing_zeros() as usize).checked_sub(4)?;
    (class < CLASSES).then_some(class)
}

/// A block of `class` from its free list or the top of the heap; null when the quota is spent.
fn take_block(b: &mut RuntimeBlock, class: usize) -> usize {
    let head = b.free[class];
    if head != 0 {
        // SAFETY: a free block's first word is the next free block of its class, written by `give_back`.
        b.free[class] = unsafe { *(head as *const usize) };
        return head;
    }
    let size = 16usize << class;
    match b.heap_top.checked_add(size) {
        Some(end) if end <= b.heap_end && commit(b, end) => {
            let block = b.heap_top;
            b.heap_top = end;
            block
        }
        _ => {
            b.exhausted = 1;
            0
        }
    }
}

/// Makes the heap up to `end` accessible, when its unused part is kept inaccessible; false when the kernel refuses.
fn commit(b: &mut RuntimeBlock, end: usize) -> bool {
    if b.guard_top == 0 || end <= b.committed {
        return true;
    }
    let to = end.next_multiple_of(b.page).min(b.heap_end);
    if mappings::pkey_mprotect(b.committed, to - b.committed, libc::PROT_READ | libc::PROT_WRITE, b.key) != 0 {
        return false;
    }
    b.committed = to;
    true
}

/// `bytes` at an `align`-aligned address (a power of two, at least 16): the header right before the pointer
/// holds the class, a mark, and the distance back to the block's start.
fn allocate(b: &mut RuntimeBlock, bytes: usize, align: usize) -> *mut c_void {
    let extra = align.saturating_sub(HEADER);
    let Some(class) = bytes.checked_add(extra).and_then(class_for) else {
        b.exhausted = 1;
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    let block = take_block(b, class);
    if block == 0 {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    }
    let user = (block + HEADER + align - 1) & !(align - 1);
    let header = (user - HEADER) as *mut u32;
    // SAFETY: the header lies inside the block (user - HEADER >= block), which is domain memory of `16 << class`
    // bytes this allocation owns.
    unsafe {
        *header = class as u32;
        *header.add(1) = LIVE;
        *(header.add(2) as *mut usize) = user - block;
    }
    user as *mut c_void
}

/// The class and block start of a pointer the heap handed out; a pointer it did not hand out stops the domain.
fn block_of(b: &RuntimeBlock, p: usize) -> (usize, usize) {
    match live_block(b, p) {
        Some(found) => found,
        None => stop(),
    }
}

/// The class and block start of a pointer the heap handed out, or None.
fn live_block(b: &RuntimeBlock, p: usize) -> Option<(usize, usize)> {
    if p < b.heap_start + HEADER || p >= b.heap_top || !p.is_multiple_of(16) {
        return None;
    }
    let header = (p - HEADER) as *const u32;
    // SAFETY: inside the used heap (checked above), domain memory.
    let (class, mark, back) = unsafe { (*header as usize, *header.add(1), *(header.add(2) as *const usize)) };
    if mark != LIVE || class >= CLASSES || back < HEADER || back > p - b.heap_start {
        return None;
    }
    Some((class, p - back))
}

fn usable(b: &RuntimeBlock, p: usize) -> usize {
    let (class, block) = block_of(b, p);
    block + (16usize << class) - p
}

fn give_back(b: &mut RuntimeBlock, p: usize) {
    if p == 0 {
        return;
    }
    let (class, block) = block_of(b, p);
    // SAFETY: the block is the heap's (checked by block_of); its header mark is cleared so a second free of the
    // same pointer is caught, and its first word links it into its class's list.
    unsafe {
        *((p - HEADER + 4) as *mut u32) = 0;
        *(block as *mut usize) = b.free[class];
    }
    b.free[class] = block;
}

/// The block, locked until the value is dropped.
///
/// # Safety
/// `b` is a block laid out by [`RuntimeBlock::init`], [`LOCK_BYTES`] into its runtime page, that outlives `'a`:
/// what the thunk contract (module doc) promises of the sixth argument.
unsafe fn block<'a>(b: *mut RuntimeBlock) -> Locked<'a> {
    // SAFETY: by this function's contract the lock word lies LOCK_BYTES before `b`, in the runtime page (zero
    // when the block is laid out, and so in the snapshot), alive for 'a.
    let lock = unsafe { &*(b.cast::<u8>().sub(LOCK_BYTES).cast::<AtomicU32>()) };
    while lock.swap(1, Ordering::Acquire) != 0 {
        let mut spins = 0u32;
        while lock.load(Ordering::Relaxed) != 0 {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(1024) {
                give_way();
            }
        }
    }
    Locked { block: b, lock, _life: std::marker::PhantomData }
}

/// Runs `f` on the block with its lock held: for the host, changing the block while threads may be running in the
/// domain.
///
/// # Safety
/// `block` is a block laid out by [`RuntimeBlock::init`] (with its lock word before it), writable by this thread.
pub unsafe fn with_block<R>(block_at: *mut RuntimeBlock, f: impl FnOnce(&mut RuntimeBlock) -> R) -> R {
    f(&mut block(block_at))
}

/// The runtime's block while this thread holds its lock.
struct Locked<'a> {
    block: *mut RuntimeBlock,
    lock: &'a AtomicU32,
    _life: std::marker::PhantomData<&'a mut RuntimeBlock>,
}

impl Deref for Locked<'_> {
    type Target = RuntimeBlock;
    fn deref(&self) -> &RuntimeBlock {
        // SAFETY: the lock is held (see `block`): no other thread uses the block meanwhile, and the runtime does
        // not take it again while it holds it.
        unsafe { &*self.block }
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut RuntimeBlock {
        // SAFETY: the lock is held (see `block`): no other thread uses the block meanwhile, and the runtime does
        // not take it again while it holds it; `&mut self` makes this the only reference.
        unsafe { &mut *self.block }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.lock.store(0, Ordering::Release);
    }
}

/// Lets another thread run (a thread waiting for a lock another thread of the domain holds): `sched_yield` as a
/// raw system call, since the runtime calls no library code.
pub(super) fn give_way() {
    // SAFETY: sched_yield takes no arguments and touches no memory; rax, rcx and r11 are what `syscall` clobbers.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_sched_yield => _,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack, nomem),
        );
    }
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_malloc(
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    allocate(&mut block(b), size, HEADER)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_calloc(
    n: usize,
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    let mut locked = block(b);
    let b = &mut *locked;
    let Some(bytes) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return ptr::null_mut();
    };
    let p = allocate(b, bytes, HEADER);
    if !p.is_null() {
        // SAFETY: `bytes` bytes were just allocated at p; a reused block is not zero.
        unsafe { ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
    }
    p
}

fn reallocate(b: &mut RuntimeBlock, p: usize, size: usize) -> *mut c_void {
    if p == 0 {
        return allocate(b, size, HEADER);
    }
    let have = usable(b, p);
    if size <= have {
        return p as *mut c_void;
    }
    let q = allocate(b, size, HEADER);
    if !q.is_null() {
        // SAFETY: both blocks are the heap's, distinct, and `have` bytes fit in each.
        unsafe { ptr::copy_nonoverlapping(p as *const u8, q.cast::<u8>(), have) };
        give_back(b, p);
    }
    q
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_realloc(
    p: usize,
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    reallocate(&mut block(b), p, size)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_reallocarray(
    p: usize,
    n: usize,
    size: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    let mut locked = block(b);
    let b = &mut *locked;
    match n.checked_mul(size) {
        Some(bytes) => reallocate(b, p, bytes),
        None => {
            set_errno(libc::ENOMEM);
            ptr::null_mut()
        }
    }
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_free(p: usize, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) {
    give_back(&mut block(b), p);
}

fn aligned(b: &mut RuntimeBlock, align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    allocate(b, size, align.max(HEADER))
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_posix_memalign(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> i32 {
    let mut locked = block(b);
    let b = &mut *locked;
    if !align.is_power_of_two() || align < std::mem::size_of::<usize>() {
        return libc::EINVAL;
    }
    let p = allocate(b, size, align.max(HEADER));
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: `out` is the extension's own pointer; a bad one faults here, inside the domain, as it would in libc.
    unsafe { *out = p };
    0
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_memalign(
    align: usize,
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    aligned(&mut block(b), align, size)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_new_aligned(
    size: usize,
    align: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    aligned(&mut block(b), align, size)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_valloc(
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    aligned(&mut block(b), 4096, size)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_pvalloc(
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    aligned(&mut block(b), 4096, size.div_ceil(4096).max(1) * 4096)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_usable_size(p: usize, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    if p == 0 {
        0
    } else {
        usable(&block(b), p)
    }
}

fn duplicate(b: &mut RuntimeBlock, src: *const u8, len: usize, unit: usize) -> *mut c_void {
    let Some(bytes) = len.checked_add(1).and_then(|n| n.checked_mul(unit)) else {
        return ptr::null_mut();
    };
    let p = allocate(b, bytes, HEADER);
    if !p.is_null() {
        // SAFETY: `len * unit` bytes of the source were just measured; the copy fits the block; the terminator is
        // written after it.
        unsafe {
            ptr::copy_nonoverlapping(src, p.cast::<u8>(), len * unit);
            ptr::write_bytes(p.cast::<u8>().add(len * unit), 0, unit);
        }
    }
    p
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_strdup(
    s: *const u8,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    // SAFETY: the extension passes a C string; reading it faults in the domain if it does not.
    let len = unsafe { libc::strlen(s.cast()) };
    duplicate(&mut block(b), s, len, 1)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_strndup(
    s: *const u8,
    n: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    // SAFETY: `s` is the extension's string (the thunk contract), read up to its NUL or n bytes, whichever comes
    // first.
    let len = unsafe { libc::strnlen(s.cast(), n) };
    duplicate(&mut block(b), s, len, 1)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_wcsdup(
    s: *const u8,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    let mut len = 0usize;
    // SAFETY: the extension passes a wide string ending in a zero wchar_t (4 bytes on Linux).
    while unsafe { (s as *const u32).add(len).read_unaligned() } != 0 {
        len += 1;
    }
    duplicate(&mut block(b), s, len, 4)
}

// ---- sort ----

type Compare = extern "C" fn(*const c_void, *const c_void, *mut c_void) -> i32;

/// Heap sort in place: no memory beyond the array, O(n log n) whatever the input.
fn sort(base: *mut u8, n: usize, size: usize, less: &mut dyn FnMut(*const u8, *const u8) -> bool) {
    if n < 2 || size == 0 {
        return;
    }
    let at = |i: usize| base.wrapping_add(i * size);
    let swap = |i: usize, j: usize| {
        // SAFETY: i and j index elements of the array the extension handed in; distinct, so not overlapping.
        unsafe { ptr::swap_nonoverlapping(at(i), at(j), size) }
    };
    let sift = |mut root: usize, end: usize, less: &mut dyn FnMut(*const u8, *const u8) -> bool| loop {
        let mut child = 2 * root + 1;
        if child >= end {
            break;
        }
        if child + 1 < end && less(at(child), at(child + 1)) {
            child += 1;
        }
        if !less(at(root), at(child)) {
            break;
        }
        swap(root, child);
        root = child;
    };
    for start in (0..n / 2).rev() {
        sift(start, n, less);
    }
    for end in (1..n).rev() {
        swap(0, end);
        sift(0, end, less);
    }
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_qsort(base: *mut u8, n: usize, size: usize, compare: usize, _: usize, _: *mut RuntimeBlock) {
    // SAFETY: the extension passes its comparison function, `int (*)(const void *, const void *)`; passing it a
    // third argument it ignores is harmless in the System V ABI.
    let compare: Compare = unsafe { std::mem::transmute(compare) };
    sort(base, n, size, &mut |a, b| compare(a.cast(), b.cast(), ptr::null_mut()) < 0);
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_qsort_r(
    base: *mut u8,
    n: usize,
    size: usize,
    compare: usize,
    arg: usize,
    _: *mut RuntimeBlock,
) {
    // SAFETY: the extension passes `int (*)(const void *, const void *, void *)` and its argument.
    let compare: Compare = unsafe { std::mem::transmute(compare) };
    sort(base, n, size, &mut |a, b| compare(a.cast(), b.cast(), arg as *mut c_void) < 0);
}

// ---- errno, atexit ----

/// Sets the calling thread's errno (for the runtime, and for the host-side signal functions). Inside a domain the FS
/// base is the domain's thread block, so this is the domain's errno, the one the extension reads through
/// `__errno_location`; the host's is untouched.
pub fn set_errno(value: i32) {
    // SAFETY: glibc's `__errno_location` gives the address of errno in the running thread's block, always writable
    // by the code running on it.
    unsafe { *libc::__errno_location() = value };
}

/// The calling thread's errno (the tests read what the runtime set).
#[cfg(test)]
pub fn errno() -> i32 {
    // SAFETY: glibc's `__errno_location` gives the address of errno in the running thread's block, readable by the
    // code running on it.
    unsafe { *libc::__errno_location() }
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_cxa_atexit(func: usize, arg: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> i32 {
    let mut locked = block(b);
    let b = &mut *locked;
    if b.atexit_count >= ATEXIT_SLOTS {
        return -1;
    }
    b.atexit[b.atexit_count] = (func, arg);
    b.atexit_count += 1;
    0
}

/// The destructors run when the domain is torn down (the backend calls them); an extension's own fini code calls
/// this first, which has nothing to do then.
///
/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_cxa_finalize(_: usize, _: usize, _: usize, _: usize, _: usize, _: *mut RuntimeBlock) {}

// ---- random numbers ----

fn srandom_state(b: &mut RuntimeBlock, seed: u32) {
    let seed = if seed == 0 { 1 } else { seed };
    b.random[0] = seed;
    let mut word = seed as i32;
    for i in 1..RANDOM_DEG {
        // glibc's initialisation: 16807 * word mod (2^31 - 1), by Schrage's method.
        let hi = word / 127_773;
        let lo = word % 127_773;
        word = 16_807i32.wrapping_mul(lo).wrapping_sub(2_836i32.wrapping_mul(hi));
        if word < 0 {
            word = word.wrapping_add(2_147_483_647);
        }
        b.random[i] = word as u32;
    }
    b.random_front = RANDOM_SEP as u32;
    b.random_rear = 0;
    for _ in 0..RANDOM_DEG * 10 {
        next_random(b);
    }
}

fn next_random(b: &mut RuntimeBlock) -> i64 {
    let front = b.random_front as usize % RANDOM_DEG;
    let rear = b.random_rear as usize % RANDOM_DEG;
    b.random[front] = b.random[front].wrapping_add(b.random[rear]);
    let result = b.random[front] >> 1;
    b.random_front = ((front + 1) % RANDOM_DEG) as u32;
    b.random_rear = ((rear + 1) % RANDOM_DEG) as u32;
    i64::from(result)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_random(_: usize, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> i64 {
    next_random(&mut block(b))
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_srandom(seed: u32, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) {
    srandom_state(&mut block(b), seed);
}

/// The domain keeps one generator; `initstate` reseeds it and hands back a token `setstate` accepts.
///
/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_initstate(
    seed: u32,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    srandom_state(&mut block(b), seed);
    // SAFETY: only the field's address is taken.
    unsafe { ptr::addr_of_mut!((*b).random).cast() }
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_setstate(
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    // SAFETY: only the field's address is taken.
    unsafe { ptr::addr_of_mut!((*b).random).cast() }
}

fn next48(b: &mut RuntimeBlock) -> u64 {
    let x = u64::from(b.rand48[0]) | u64::from(b.rand48[1]) << 16 | u64::from(b.rand48[2]) << 32;
    let a = u64::from(b.rand48_mult[0]) | u64::from(b.rand48_mult[1]) << 16 | u64::from(b.rand48_mult[2]) << 32;
    let next = (a.wrapping_mul(x).wrapping_add(u64::from(b.rand48_add))) & ((1 << 48) - 1);
    b.rand48 = [next as u16, (next >> 16) as u16, (next >> 32) as u16];
    next
}

/// `strtok` with the position kept in the domain's block: glibc's keeps it in the host's libc, where the domain may
/// not write, and the host's own parsing would go on from the extension's string.
///
/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_strtok(
    text: *mut libc::c_char,
    delimiters: *const libc::c_char,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut libc::c_char {
    next_token(&mut block(b), text, delimiters)
}

fn next_token(b: &mut RuntimeBlock, text: *mut libc::c_char, delimiters: *const libc::c_char) -> *mut libc::c_char {
    // SAFETY: strtok_r reads and writes only the string and the delimiters the extension passed (its contract with
    // strtok) and the position, which is this block's.
    unsafe { libc::strtok_r(text, delimiters, &mut b.strtok_next) }
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_drand48(_: usize, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> f64 {
    next48(&mut block(b)) as f64 / (1u64 << 48) as f64
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_mrand48(_: usize, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> i64 {
    i64::from((next48(&mut block(b)) >> 16) as u32 as i32)
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_srand48(seed: i64, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) {
    let mut locked = block(b);
    let b = &mut *locked;
    b.rand48 = [0x330e, seed as u16, (seed >> 16) as u16];
    b.rand48_mult = [0xe66d, 0xdeec, 0x5];
    b.rand48_add = 0xb;
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_seed48(
    seed: *const u16,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut u16 {
    let mut locked = block(b);
    let b = &mut *locked;
    // SAFETY: the extension passes three unsigned shorts.
    let new = unsafe { [*seed, *seed.add(1), *seed.add(2)] };
    b.rand48 = new;
    b.rand48_mult = [0xe66d, 0xdeec, 0x5];
    b.rand48_add = 0xb;
    b.rand48.as_mut_ptr()
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_lcong48(params: *const u16, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) {
    let mut locked = block(b);
    let b = &mut *locked;
    // SAFETY: the extension passes seven unsigned shorts: the state, the multiplier, the addend.
    unsafe {
        b.rand48 = [*params, *params.add(1), *params.add(2)];
        b.rand48_mult = [*params.add(3), *params.add(4), *params.add(5)];
        b.rand48_add = *params.add(6);
    }
}

// ---- the end of the process, as faults ----

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_exit(status: i32, _: usize, _: usize, _: usize, _: usize, _: *mut RuntimeBlock) -> ! {
    super::gate::end_call(Ending::Exit { status })
}

/// # Safety
/// The thunk contract (module doc).
unsafe extern "C" fn rt_abort(_: usize, _: usize, _: usize, _: usize, _: usize, _: *mut RuntimeBlock) -> ! {
    super::gate::end_call(Ending::Abort)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime page as a domain has it: the lock word, then the block.
    #[repr(C)]
    pub(super) struct TestPage {
        lock: [u8; LOCK_BYTES],
        block: RuntimeBlock,
    }

    impl std::ops::Deref for TestPage {
        type Target = RuntimeBlock;
        fn deref(&self) -> &RuntimeBlock {
            &self.block
        }
    }

    impl std::ops::DerefMut for TestPage {
        fn deref_mut(&mut self) -> &mut RuntimeBlock {
            &mut self.block
        }
    }

    pub(super) fn fresh(heap: &mut [u8]) -> Box<TestPage> {
        // SAFETY: all-zero is a valid page (a free lock, and a valid block); init lays the block out over the
        // test's own heap buffer.
        let mut b: Box<TestPage> = Box::new(unsafe { std::mem::zeroed() });
        let start = (heap.as_mut_ptr() as usize + 15) & !15;
        let len = heap.len() - (start - heap.as_mut_ptr() as usize);
        // SAFETY: the block is live and aligned.
        unsafe { RuntimeBlock::init(&mut b.block, start, len, 0) };
        b
    }

    #[test]
    fn the_heap_hands_out_aligned_blocks_reuses_freed_ones_and_says_when_it_is_spent() {
        let mut heap = vec![0u8; 1 << 16];
        let mut b = fresh(&mut heap);
        let p = allocate(&mut b, 100, HEADER) as usize;
        assert_eq!(p % 16, 0);
        assert!(usable(&b, p) >= 100);
        give_back(&mut b, p);
        assert_eq!(allocate(&mut b, 90, HEADER) as usize, p, "a freed block of the class is reused");
        let q = allocate(&mut b, 10, 256) as usize;
        assert_eq!(q % 256, 0);
        assert!(allocate(&mut b, 1 << 20, HEADER).is_null());
        assert_eq!(b.exhausted, 1);
        assert_eq!(errno(), libc::ENOMEM);
    }

    #[test]
    fn realloc_keeps_the_contents() {
        let mut heap = vec![0u8; 1 << 16];
        let mut b = fresh(&mut heap);
        let p = allocate(&mut b, 8, HEADER) as *mut u8;
        // SAFETY: 8 bytes were allocated at p.
        unsafe { ptr::copy_nonoverlapping(b"abcdefgh".as_ptr(), p, 8) };
        let q = reallocate(&mut b, p as usize, 1000) as *const u8;
        assert_ne!(q, p as *const u8);
        // SAFETY: at least 8 bytes were copied to q.
        assert_eq!(unsafe { std::slice::from_raw_parts(q, 8) }, b"abcdefgh");
    }

    #[test]
    fn random_matches_glibc_for_the_same_seed() {
        let mut heap = vec![0u8; 4096];
        let mut b = fresh(&mut heap);
        srandom_state(&mut b, 42);
        let ours: Vec<i64> = (0..5).map(|_| next_random(&mut b)).collect();
        // SAFETY: srand and rand (glibc's srandom and random) only touch libc's own generator state; no other
        // test uses it.
        let theirs: Vec<i64> = unsafe {
            libc::srand(42);
            (0..5).map(|_| i64::from(libc::rand())).collect()
        };
        assert_eq!(ours, theirs);
    }

    #[test]
    fn strtok_goes_on_from_the_domains_position_as_glibcs_does() {
        let mut heap = vec![0u8; 4096];
        let mut b = fresh(&mut heap);
        let split = |b: &mut RuntimeBlock, text: &mut [u8]| {
            let mut words = Vec::new();
            let mut at = text.as_mut_ptr().cast::<libc::c_char>();
            loop {
                let word = next_token(b, at, c" ,".as_ptr());
                if word.is_null() {
                    break;
                }
                // SAFETY: strtok_r returns a NUL-terminated token inside `text`.
                words.push(unsafe { std::ffi::CStr::from_ptr(word) }.to_string_lossy().into_owned());
                at = ptr::null_mut();
            }
            words
        };
        let mut first = *b" 0.5, 1,,2 \0";
        assert_eq!(split(&mut b, &mut first), ["0.5", "1", "2"]);
        // A fresh string starts again; once it is used up, going on finds nothing.
        let mut second = *b"a b\0";
        assert_eq!(split(&mut b, &mut second), ["a", "b"]);
        assert!(next_token(&mut b, ptr::null_mut(), c" ".as_ptr()).is_null());
    }

    #[test]
    fn sort_orders_elements() {
        let mut v: Vec<u32> = vec![5, 3, 9, 1, 1, 8, 0, 7];
        sort(v.as_mut_ptr().cast(), v.len(), 4, &mut |a, b| {
            // SAFETY: a and b point at elements of v.
            unsafe { *(a as *const u32) < *(b as *const u32) }
        });
        assert_eq!(v, vec![0, 1, 1, 3, 5, 7, 8, 9]);
    }
}
