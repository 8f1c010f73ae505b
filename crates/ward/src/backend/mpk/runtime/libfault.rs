//! Run-time library faults in an mpk domain: what the preloaded `ward_libfault` does in a process domain
//! (`crate::libfault`), done by the domain runtime. The imports of one image (the extension, or the plugin its
//! class adapter opens) that the fault's kind concerns are bound to the functions here instead of their usual
//! binding; every other image keeps its own. The count of eligible calls lives in the runtime block, so a restore
//! from the snapshot taken after loading goes back to the count loading left, as a process forked from a zygote
//! continues from its parent's.

use std::ffi::{c_char, c_int, c_void};

use super::{
    block, rt_abort, rt_calloc, rt_free, rt_malloc, rt_memalign, rt_posix_memalign, rt_realloc, Raw, RuntimeBlock,
};
use crate::libfault::{LibraryFault, LibraryFaultKind};

/// The fault a domain's runtime injects, in its block (all zero: none).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FaultPlan {
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

fn code(kind: LibraryFaultKind) -> u32 {
    match kind {
        LibraryFaultKind::Alloc => ALLOC,
        LibraryFaultKind::Leak => LEAK,
        LibraryFaultKind::CopyOverrun => COPY,
    }
}

impl FaultPlan {
    pub(crate) fn new(fault: &LibraryFault) -> FaultPlan {
        FaultPlan {
            kind: code(fault.kind()),
            nth: fault.nth(),
            count: fault.count(),
            extra: fault.extra().unwrap_or(LibraryFault::DEFAULT_EXTRA),
            calls: 0,
        }
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
pub(crate) fn function(kind: LibraryFaultKind, name: &str) -> Option<Raw> {
    let f: Raw = match (kind, name) {
        (LibraryFaultKind::Alloc, "malloc") => lf_malloc as Raw,
        (LibraryFaultKind::Alloc, "calloc") => lf_calloc as Raw,
        (LibraryFaultKind::Alloc, "realloc") => lf_realloc as Raw,
        (LibraryFaultKind::Alloc, "memalign" | "aligned_alloc") => lf_memalign as Raw,
        (LibraryFaultKind::Alloc, "posix_memalign") => lf_posix_memalign as Raw,
        (LibraryFaultKind::Leak, "free") => lf_free as Raw,
        (LibraryFaultKind::CopyOverrun, "memcpy") => lf_memcpy as Raw,
        (LibraryFaultKind::CopyOverrun, "memmove") => lf_memmove as Raw,
        (LibraryFaultKind::CopyOverrun, "memset") => lf_memset as Raw,
        (LibraryFaultKind::CopyOverrun, "strcpy") => lf_strcpy as Raw,
        (LibraryFaultKind::CopyOverrun, "strncpy") => lf_strncpy as Raw,
        (LibraryFaultKind::CopyOverrun, "__memcpy_chk") => lf_memcpy_chk as Raw,
        (LibraryFaultKind::CopyOverrun, "__memmove_chk") => lf_memmove_chk as Raw,
        (LibraryFaultKind::CopyOverrun, "__memset_chk") => lf_memset_chk as Raw,
        (LibraryFaultKind::CopyOverrun, "__strcpy_chk") => lf_strcpy_chk as Raw,
        (LibraryFaultKind::CopyOverrun, "__strncpy_chk") => lf_strncpy_chk as Raw,
        _ => return None,
    };
    Some(f)
}

// ---- allocation: a hit fails with ENOMEM ----

fn failed() -> *mut c_void {
    super::set_errno(libc::ENOMEM);
    std::ptr::null_mut()
}

extern "C" fn lf_malloc(size: usize, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> *mut c_void {
    if block(b).library_fault.hits(ALLOC) {
        return failed();
    }
    rt_malloc(size, 0, 0, 0, 0, b)
}

extern "C" fn lf_calloc(n: usize, size: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> *mut c_void {
    if block(b).library_fault.hits(ALLOC) {
        return failed();
    }
    rt_calloc(n, size, 0, 0, 0, b)
}

extern "C" fn lf_realloc(p: usize, size: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> *mut c_void {
    if block(b).library_fault.hits(ALLOC) {
        return failed();
    }
    rt_realloc(p, size, 0, 0, 0, b)
}

extern "C" fn lf_memalign(
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

extern "C" fn lf_posix_memalign(
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

extern "C" fn lf_free(p: usize, _: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) {
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

extern "C" fn lf_memcpy(dst: usize, src: usize, n: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    // SAFETY: the extension's own call, with the length made wrong on purpose: what it touches is the domain's
    // business, and a fault there is the domain's (the gate recovers it).
    unsafe { libc::memcpy(dst as *mut c_void, src as *const c_void, n) as usize }
}

extern "C" fn lf_memmove(dst: usize, src: usize, n: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    // SAFETY: as in `lf_memcpy`.
    unsafe { libc::memmove(dst as *mut c_void, src as *const c_void, n) as usize }
}

extern "C" fn lf_memset(dst: usize, c: c_int, n: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    // SAFETY: as in `lf_memcpy`.
    unsafe { libc::memset(dst as *mut c_void, c, n) as usize }
}

/// The string at `src`, its terminator and `extra` bytes after it in the source, moved to `dst`.
fn copy_string(dst: usize, src: usize, extra: usize) -> usize {
    // SAFETY: as in `lf_memcpy`: the extension's own strings.
    unsafe {
        let n = libc::strlen(src as *const c_char) + 1 + extra;
        libc::memmove(dst as *mut c_void, src as *const c_void, n) as usize
    }
}

extern "C" fn lf_strcpy(dst: usize, src: usize, _: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let extra = block(b).library_fault.overrun();
    copy_string(dst, src, extra)
}

extern "C" fn lf_strncpy(dst: usize, src: usize, n: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    // SAFETY: as in `lf_memcpy`.
    unsafe { libc::strncpy(dst as *mut c_char, src as *const c_char, n) as usize }
}

/// Ends the call as glibc's fortified check would, as the domain's abort, when `n` bytes exceed `dstlen`.
fn check(n: usize, dstlen: usize, b: *mut RuntimeBlock) {
    if n > dstlen {
        rt_abort(0, 0, 0, 0, 0, b);
    }
}

extern "C" fn lf_memcpy_chk(dst: usize, src: usize, n: usize, dstlen: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    check(n, dstlen, b);
    // SAFETY: as in `lf_memcpy`.
    unsafe { libc::memcpy(dst as *mut c_void, src as *const c_void, n) as usize }
}

extern "C" fn lf_memmove_chk(dst: usize, src: usize, n: usize, dstlen: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    check(n, dstlen, b);
    // SAFETY: as in `lf_memcpy`.
    unsafe { libc::memmove(dst as *mut c_void, src as *const c_void, n) as usize }
}

extern "C" fn lf_memset_chk(dst: usize, c: c_int, n: usize, dstlen: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    check(n, dstlen, b);
    // SAFETY: as in `lf_memcpy`.
    unsafe { libc::memset(dst as *mut c_void, c, n) as usize }
}

extern "C" fn lf_strcpy_chk(dst: usize, src: usize, dstlen: usize, _: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let extra = block(b).library_fault.overrun();
    // SAFETY: as in `lf_memcpy`.
    let n = unsafe { libc::strlen(src as *const c_char) } + 1 + extra;
    check(n, dstlen, b);
    copy_string(dst, src, extra)
}

extern "C" fn lf_strncpy_chk(dst: usize, src: usize, n: usize, dstlen: usize, _: usize, b: *mut RuntimeBlock) -> usize {
    let n = n + block(b).library_fault.overrun();
    check(n, dstlen, b);
    // SAFETY: as in `lf_memcpy`.
    unsafe { libc::strncpy(dst as *mut c_char, src as *const c_char, n) as usize }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nth_eligible_call_and_count_after_it_are_hit_and_other_kinds_are_not_counted() {
        let fault = LibraryFault::new(LibraryFaultKind::Alloc, 3).unwrap().with_count(2).unwrap();
        let mut plan = FaultPlan::new(&fault);
        assert!(!plan.hits(LEAK), "another kind");
        let hits: Vec<bool> = (0..6).map(|_| plan.hits(ALLOC)).collect();
        assert_eq!(hits, [false, false, true, true, false, false]);
        let every = LibraryFault::new(LibraryFaultKind::Leak, 2).unwrap().with_count(0).unwrap();
        let mut plan = FaultPlan::new(&every);
        let hits: Vec<bool> = (0..4).map(|_| plan.hits(LEAK)).collect();
        assert_eq!(hits, [false, true, true, true], "count 0: every call from the nth on");
    }

    #[test]
    fn a_copy_overrun_writes_extra_bytes_once() {
        let fault = LibraryFault::new(LibraryFaultKind::CopyOverrun, 1).unwrap().with_extra(8).unwrap();
        let mut plan = FaultPlan::new(&fault);
        assert_eq!(plan.overrun(), 8);
        assert_eq!(plan.overrun(), 0, "count 1 by default");
    }

    #[test]
    fn only_the_functions_of_the_faults_kind_are_rebound() {
        assert!(function(LibraryFaultKind::Alloc, "malloc").is_some());
        assert!(function(LibraryFaultKind::Alloc, "free").is_none());
        assert!(function(LibraryFaultKind::Leak, "free").is_some());
        assert!(function(LibraryFaultKind::CopyOverrun, "__memcpy_chk").is_some());
        assert!(function(LibraryFaultKind::CopyOverrun, "malloc").is_none());
    }
}
