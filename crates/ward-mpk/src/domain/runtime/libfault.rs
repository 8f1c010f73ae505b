//! Run-time library faults in an mpk domain: what the preloaded `ward_libfault` does in a process domain
//! (ward's `libfault`), done by the domain runtime. The imports of one image (the extension, or the plugin its
//! class adapter opens) that the fault's kind concerns are bound to the functions here instead of their usual
//! binding; every other image keeps its own. The count of eligible calls lives in the runtime block, so a restore
//! from the snapshot taken after loading goes back to the count loading left, as a process forked from a zygote
//! continues from its parent's.

use std::ffi::{c_char, c_int, c_void};

use super::{block, rt_calloc, rt_free, rt_malloc, rt_memalign, rt_posix_memalign, rt_realloc, Raw, RuntimeBlock};

/// What an injected library fault does to the faulted image's calls: the kinds of ward's `InjectedFaultKind`,
/// which parses and checks them (ward's mpk backend converts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectedFaultKind {
    /// Allocations fail with `ENOMEM`.
    Alloc,
    /// `free` does nothing.
    Leak,
    /// Copies write [`InjectedFault::extra`] bytes too many.
    CopyOverrun,
}

/// One library fault for the domain runtime to inject: the `nth` eligible call of its kind (from 1) and the
/// `count - 1` after it (`count` 0: every one from the `nth` on). Built from ward's `LibraryFault`, already checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedFault {
    pub kind: InjectedFaultKind,
    pub nth: u64,
    pub count: u64,
    /// Bytes too many per copy overrun; unused by the other kinds.
    pub extra: u64,
}

/// The fault a domain's runtime injects, in its block (all zero: none).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultPlan {
    /// 0: none; else [`code`] of the kind.
    kind: u32,
    nth: u64,
    count: u64,
    extra: u64,
    /// Eligible calls so far.
    calls: u64,
}

const ALLOC: u32 = 1;
const LEAK: u32 = 2;
const COPY: u32 = 3;

fn code(kind: InjectedFaultKind) -> u32 {
    match kind {
        InjectedFaultKind::Alloc => ALLOC,
        InjectedFaultKind::Leak => LEAK,
        InjectedFaultKind::CopyOverrun => COPY,
    }
}

impl FaultPlan {
    pub fn new(fault: &InjectedFault) -> FaultPlan {
        FaultPlan { kind: code(fault.kind), nth: fault.nth, count: fault.count, extra: fault.extra, calls: 0 }
    }

    /// Whether this eligible call of `kind` gets the fault; counts it.
    fn hits(&mut self, kind: u32) -> bool {
        if self.kind != kind {
            return false;
        }
        self.calls += 1;
        let n = self.calls;
        n >= self.nth && (self.count == 0 || n - self.nth < self.count)
    }

    /// Bytes too many this copy writes.
    fn overrun(&mut self) -> usize {
        if self.hits(COPY) {
            self.extra as usize
        } else {
            0
        }
    }
}

/// The function an import of the faulted image is bound to under `kind`, when the kind concerns it (the same
/// functions `ward_libfault` interposes on).
pub fn function(kind: impl Into<InjectedFaultKind>, name: &str) -> Option<Raw> {
    let f: Raw = match (kind.into(), name) {
        (InjectedFaultKind::Alloc, "malloc") => lf_malloc as Raw,
        (InjectedFaultKind::Alloc, "calloc") => lf_calloc as Raw,
        (InjectedFaultKind::Alloc, "realloc") => lf_realloc as Raw,
        (InjectedFaultKind::Alloc, "memalign" | "aligned_alloc") => lf_memalign as Raw,
        (InjectedFaultKind::Alloc, "posix_memalign") => lf_posix_memalign as Raw,
        (InjectedFaultKind::Leak, "free") => lf_free as Raw,
        (InjectedFaultKind::CopyOverrun, "memcpy") => lf_memcpy as Raw,
        (InjectedFaultKind::CopyOverrun, "memmove") => lf_memmove as Raw,
        (InjectedFaultKind::CopyOverrun, "memset") => lf_memset as Raw,
        (InjectedFaultKind::CopyOverrun, "strcpy") => lf_strcpy as Raw,
        (InjectedFaultKind::CopyOverrun, "strncpy") => lf_strncpy as Raw,
        (InjectedFaultKind::CopyOverrun, "__memcpy_chk") => lf_memcpy_chk as Raw,
        (InjectedFaultKind::CopyOverrun, "__memmove_chk") => lf_memmove_chk as Raw,
        (InjectedFaultKind::CopyOverrun, "__memset_chk") => lf_memset_chk as Raw,
        (InjectedFaultKind::CopyOverrun, "__strcpy_chk") => lf_strcpy_chk as Raw,
        (InjectedFaultKind::CopyOverrun, "__strncpy_chk") => lf_strncpy_chk as Raw,
        _ => return None,
    };
    Some(f)
}

// ---- allocation: a hit fails with ENOMEM ----

fn failed() -> *mut c_void {
    super::set_errno(libc::ENOMEM);
    std::ptr::null_mut()
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_malloc(
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    if block(b).library_fault.hits(ALLOC) {
        return failed();
    }
    rt_malloc(size, 0, 0, 0, 0, b)
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_calloc(
    n: usize,
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    if block(b).library_fault.hits(ALLOC) {
        return failed();
    }
    rt_calloc(n, size, 0, 0, 0, b)
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_realloc(
    p: usize,
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    if block(b).library_fault.hits(ALLOC) {
        return failed();
    }
    rt_realloc(p, size, 0, 0, 0, b)
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_memalign(
    align: usize,
    size: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    if block(b).library_fault.hits(ALLOC) {
        return failed();
    }
    rt_memalign(align, size, 0, 0, 0, b)
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_posix_memalign(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> i32 {
    if block(b).library_fault.hits(ALLOC) {
        return libc::ENOMEM;
    }
    rt_posix_memalign(out, align, size, 0, 0, b)
}

// ---- leak: a hit frees nothing (free(NULL) is not counted) ----

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_free(p: usize, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) {
    if p != 0 && block(b).library_fault.hits(LEAK) {
        return;
    }
    rt_free(p, 0, 0, 0, 0, b)
}

// ---- copies: a hit writes `extra` bytes too many ----
//
// The copies run the C library's own functions, inside the domain (they are pure). The fortified forms check
// the destination's size here, with the wrong length, as glibc's would: a failed check is the domain's abort (glibc's
// would end the host's process from inside the domain).

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_memcpy(dst: usize, src: usize, n: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    // SAFETY: the extension's own call, with the length made wrong on purpose: what it touches is the domain's
    // business, and a fault there is the domain's (the gate recovers it).
    unsafe { libc::memcpy(dst as *mut c_void, src as *const c_void, n) as usize }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_memmove(dst: usize, src: usize, n: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    // SAFETY: the extension's own call (the thunk contract), the length made wrong on purpose: a fault is the
    // domain's.
    unsafe { libc::memmove(dst as *mut c_void, src as *const c_void, n) as usize }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_memset(dst: usize, c: c_int, n: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    // SAFETY: the extension's own call (the thunk contract), the length made wrong on purpose: a fault is the
    // domain's.
    unsafe { libc::memset(dst as *mut c_void, c, n) as usize }
}

/// The string at `src`, its terminator and `extra` bytes after it in the source, moved to `dst`.
fn copy_string(dst: usize, src: usize, extra: usize) -> usize {
    // SAFETY: the extension's own strings (the thunk contract), the length made wrong on purpose: a fault is the
    // domain's.
    unsafe {
        let n = libc::strlen(src as *const c_char) + 1 + extra;
        libc::memmove(dst as *mut c_void, src as *const c_void, n) as usize
    }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_strcpy(dst: usize, src: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let extra = block(b).library_fault.overrun();
    copy_string(dst, src, extra)
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_strncpy(dst: usize, src: usize, n: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    // SAFETY: the extension's own call (the thunk contract), the length made wrong on purpose: a fault is the
    // domain's.
    unsafe { libc::strncpy(dst as *mut c_char, src as *const c_char, n) as usize }
}

/// Ends the call as glibc's fortified check would, as the domain's abort, when `n` bytes exceed `dstlen`.
fn check(n: usize, dstlen: usize) {
    if n > dstlen {
        crate::domain::gate::end_call(crate::domain::gate::Ending::Abort);
    }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_memcpy_chk(
    dst: usize,
    src: usize,
    n: usize,
    dstlen: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> usize {
    let n = n + block(b).library_fault.overrun();
    check(n, dstlen);
    // SAFETY: the extension's own call (the thunk contract), the length made wrong on purpose: a fault is the
    // domain's.
    unsafe { libc::memcpy(dst as *mut c_void, src as *const c_void, n) as usize }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_memmove_chk(
    dst: usize,
    src: usize,
    n: usize,
    dstlen: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> usize {
    let n = n + block(b).library_fault.overrun();
    check(n, dstlen);
    // SAFETY: the extension's own call (the thunk contract), the length made wrong on purpose: a fault is the
    // domain's.
    unsafe { libc::memmove(dst as *mut c_void, src as *const c_void, n) as usize }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_memset_chk(
    dst: usize,
    c: c_int,
    n: usize,
    dstlen: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> usize {
    let n = n + block(b).library_fault.overrun();
    check(n, dstlen);
    // SAFETY: the extension's own call (the thunk contract), the length made wrong on purpose: a fault is the
    // domain's.
    unsafe { libc::memset(dst as *mut c_void, c, n) as usize }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_strcpy_chk(
    dst: usize,
    src: usize,
    dstlen: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> usize {
    let extra = block(b).library_fault.overrun();
    // SAFETY: the extension's own call (the thunk contract), the length made wrong on purpose: a fault is the
    // domain's.
    let n = unsafe { libc::strlen(src as *const c_char) } + 1 + extra;
    check(n, dstlen);
    copy_string(dst, src, extra)
}

/// # Safety
/// The thunk contract (the runtime's module doc).
unsafe extern "C" fn lf_strncpy_chk(
    dst: usize,
    src: usize,
    n: usize,
    dstlen: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> usize {
    let n = n + block(b).library_fault.overrun();
    check(n, dstlen);
    // SAFETY: the extension's own call (the thunk contract), the length made wrong on purpose: a fault is the
    // domain's.
    unsafe { libc::strncpy(dst as *mut c_char, src as *const c_char, n) as usize }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nth_eligible_call_and_count_after_it_are_hit_and_other_kinds_are_not_counted() {
        let fault = InjectedFault { kind: InjectedFaultKind::Alloc, nth: 3, count: 2, extra: 64 };
        let mut plan = FaultPlan::new(&fault);
        assert!(!plan.hits(LEAK), "another kind");
        let hits: Vec<bool> = (0..6).map(|_| plan.hits(ALLOC)).collect();
        assert_eq!(hits, [false, false, true, true, false, false]);
        let every = InjectedFault { kind: InjectedFaultKind::Leak, nth: 2, count: 0, extra: 64 };
        let mut plan = FaultPlan::new(&every);
        let hits: Vec<bool> = (0..4).map(|_| plan.hits(LEAK)).collect();
        assert_eq!(hits, [false, true, true, true], "count 0: every call from the nth on");
    }

    #[test]
    fn a_copy_overrun_writes_extra_bytes_once() {
        // Count 1: what ward's `LibraryFault` defaults a copy overrun to (its conversion is tested in ward).
        let fault = InjectedFault { kind: InjectedFaultKind::CopyOverrun, nth: 1, count: 1, extra: 8 };
        let mut plan = FaultPlan::new(&fault);
        assert_eq!(plan.overrun(), 8);
        assert_eq!(plan.overrun(), 0, "count 1");
    }

    #[test]
    fn only_the_functions_of_the_faults_kind_are_rebound() {
        assert!(function(InjectedFaultKind::Alloc, "malloc").is_some());
        assert!(function(InjectedFaultKind::Alloc, "free").is_none());
        assert!(function(InjectedFaultKind::Leak, "free").is_some());
        assert!(function(InjectedFaultKind::CopyOverrun, "__memcpy_chk").is_some());
        assert!(function(InjectedFaultKind::CopyOverrun, "malloc").is_none());
    }
}
