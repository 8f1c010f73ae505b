//! The host's large heap blocks, served from ward's arena so they can be lent to a process domain in place.
//!
//! A video host's frames are heap blocks of several megabytes; copying each into a pool and the result back costs
//! more than many filters spend on the frame. So the shim defines the `malloc` family: blocks of
//! [`arena::host::MIN_BLOCK`] and more come from the arena (each a memfd of its own, given to a domain only when a
//! call lends it), everything else
//! goes to the C library's allocator as before (`__libc_malloc` and friends, which glibc exports for exactly this).
//! `free`, `realloc` and `malloc_usable_size` tell the two apart by address.
//!
//! The arena is set up when the library is loaded, unless `WARD_ISOLATION` is `none` or `mpk` (nothing crosses a
//! process boundary) or `WARD_ARENA=0` (the user's way out); without it every function here forwards to the C library.
//!
//! These functions run inside the host's allocations, so they never allocate through Rust and never panic.

use std::ffi::c_void;

use ward_xpc::arena;

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_calloc(count: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// Runs when the dynamic loader loads the shim, before the host's `main`.
#[used]
#[link_section = ".init_array"]
static SET_UP_ARENA: extern "C" fn() = set_up_arena;

extern "C" fn set_up_arena() {
    let isolation = std::env::var_os("WARD_ISOLATION");
    let wanted = std::env::var_os("WARD_ARENA");
    // Nothing crosses a process boundary under `none` or `mpk`: the arena would only cost.
    if isolation.as_deref().is_some_and(|i| i == "none" || i == "mpk")
        || wanted.as_deref() == Some(std::ffi::OsStr::new("0"))
    {
        return;
    }
    let said = std::env::var_os(ARENA_SAID).is_some();
    let line = match arena::host::enable(arena::host::DEFAULT_RESERVE) {
        Ok(()) if std::env::var_os("WARD_VERBOSE").is_some_and(|v| v == "1") => {
            "ward: heap blocks of 1 MiB and more come from ward's arena (lent to process domains in place)".to_string()
        }
        Ok(()) => return,
        // Not fatal: large buffers are then copied through the pools, as for any host.
        Err(e) => format!("ward: {e}; large buffers will be copied to the domains"),
    };
    if !said {
        eprintln!("{line}");
        // Said once per `ward run`: the processes the host execs inherit the mark with the environment. This
        // constructor runs before `main`, while the process has one thread, so changing the environment is safe.
        std::env::set_var(ARENA_SAID, "1");
    }
}

/// In the environment once a process of this `ward run` has said how its heap is served (`ward run` clears it).
const ARENA_SAID: &str = "WARD_ARENA_SAID";

fn set_errno(code: i32) {
    // SAFETY: __errno_location returns this thread's errno, always valid to write.
    unsafe { *libc::__errno_location() = code };
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// # Safety
/// The C `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    if let Some(p) = arena::host::alloc(size, 16) {
        return p.cast();
    }
    // SAFETY: forwarding the caller's request to the C library's allocator.
    unsafe { __libc_malloc(size) }
}

/// # Safety
/// The C `free` contract: `ptr` is null or a live block of this family.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if ptr.is_null() || arena::host::free(ptr.cast()) {
        return;
    }
    // SAFETY: not an arena block, so the C library's allocator made it.
    unsafe { __libc_free(ptr) }
}

/// # Safety
/// The C `calloc` contract.
#[no_mangle]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    let Some(total) = count.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    if let Some(p) = arena::host::alloc(total, 16) {
        // SAFETY: the block is `total` writable bytes just handed out; a reused block is not zero by itself.
        unsafe { std::ptr::write_bytes(p, 0, total) };
        return p.cast();
    }
    // SAFETY: forwarding the caller's request to the C library's allocator.
    unsafe { __libc_calloc(count, size) }
}

/// # Safety
/// The C `realloc` contract.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if ptr.is_null() {
        // SAFETY: realloc(NULL, n) is malloc(n).
        return unsafe { malloc(size) };
    }
    let Some(usable) = arena::host::usable_size(ptr.cast()) else {
        if arena::host::contains(ptr.cast()) {
            // In the arena's range but not a live block: a bug of the caller's; refuse rather than corrupt.
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: a block of the C library's; it stays there (grown or shrunk by it).
        return unsafe { __libc_realloc(ptr, size) };
    };
    if size == 0 {
        // SAFETY: glibc's realloc(p, 0) frees p and returns NULL.
        unsafe { free(ptr) };
        return std::ptr::null_mut();
    }
    if size <= usable && size >= arena::host::MIN_BLOCK {
        return ptr;
    }
    // SAFETY: the caller's request for a fresh block.
    let moved = unsafe { malloc(size) };
    if moved.is_null() {
        return moved;
    }
    // SAFETY: `ptr` has `usable` readable bytes, `moved` at least `size` writable ones; distinct blocks.
    unsafe {
        std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), moved.cast::<u8>(), usable.min(size));
        free(ptr);
    }
    moved
}

/// # Safety
/// The glibc `reallocarray` contract.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, count: usize, size: usize) -> *mut c_void {
    let Some(total) = count.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // SAFETY: the same contract as realloc.
    unsafe { realloc(ptr, total) }
}

/// An aligned block, or null with `errno` set.
fn aligned(align: usize, size: usize) -> *mut c_void {
    if let Some(p) = arena::host::alloc(size, align) {
        return p.cast();
    }
    // SAFETY: forwarding an aligned request to the C library's allocator.
    unsafe { __libc_memalign(align, size) }
}

/// # Safety
/// The POSIX `posix_memalign` contract: `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a writable pointer for the result.
    unsafe { *out = p };
    0
}

/// # Safety
/// The C `aligned_alloc` contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    aligned(align, size)
}

/// # Safety
/// The glibc `memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: the same contract as aligned_alloc (glibc accepts any size for both).
    unsafe { aligned_alloc(align, size) }
}

/// # Safety
/// The glibc `valloc` contract.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(page(), size)
}

/// # Safety
/// The glibc `pvalloc` contract.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let Some(rounded) = size.checked_add(page() - 1).map(|n| n / page() * page()) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    aligned(page(), rounded.max(page()))
}

/// # Safety
/// The glibc `malloc_usable_size` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    if ptr.is_null() {
        return 0;
    }
    if let Some(n) = arena::host::usable_size(ptr.cast()) {
        return n;
    }
    libc_usable_size(ptr)
}

/// The C library's `malloc_usable_size` (it has no `__libc_` alias), found once.
fn libc_usable_size(ptr: *mut c_void) -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the definition after ours (the C library's).
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) } as usize;
        if f == 0 {
            return 0;
        }
        REAL.store(f, Ordering::Release);
    }
    // SAFETY: `f` is the C library's malloc_usable_size, whose signature this is; `ptr` is a block of its own.
    unsafe {
        let real: unsafe extern "C" fn(*mut c_void) -> usize = std::mem::transmute(f);
        real(ptr)
    }
}
