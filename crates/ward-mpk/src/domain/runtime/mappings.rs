//! Anonymous mappings and their protections, inside the domain: `mmap` hands out zeroed, page-aligned memory from
//! the domain's heap (so it carries the domain's key, counts against its quota and is restored with it), and
//! `mprotect` changes the protection of heap pages with the domain's key: a guard page an extension makes faults as
//! it would in a process, and nothing the domain does gives a page another key.
//!
//! Code made at run time (a compiler in the domain, as the runtime class's libtcc) becomes executable here, on the
//! domain's own terms: only heap pages, only read and execute (never writable and executable at once, so the bytes
//! checked are the bytes run), and only once the scan the loader runs on every image (`assess::scan`) finds no
//! instruction an mpk domain may not hold in them, nor across the edge of an executable page beside them; a page
//! that holds one stays as it was and `mprotect` fails with `EPERM`. Pages made executable go back to read-write,
//! not executable, when their mapping is unmapped; a restore of the domain's memory makes the whole heap
//! read-write first and never re-applies an executable protection. `sysconf` answers what such code asks it (the
//! page size, the processor count).

use std::ffi::c_void;

use super::{allocate, block, give_back, live_block, RuntimeBlock};

/// Protection changes the runtime remembers (each a range the domain made other than read-write, or set back).
pub const PROTECTED_SLOTS: usize = 256;

/// One protection change of heap pages: `[start, start + len)` got `prot`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct Protection {
    start: usize,
    len: usize,
    prot: i32,
}

const READ_WRITE: i32 = libc::PROT_READ | libc::PROT_WRITE;
const READ_EXECUTE: i32 = libc::PROT_READ | libc::PROT_EXEC;
/// Bytes an instruction the scan refuses spans past its first: an executable page beside the range is scanned
/// this far into it.
const SCAN_REACH: usize = 2;

/// `pkey_mprotect` made from inside the domain, as a raw system call: the runtime calls no library code.
pub(super) fn pkey_mprotect(start: usize, len: usize, prot: i32, key: u32) -> i64 {
    let ret: i64;
    // SAFETY: the system call changes only the protection of pages the caller checked are the domain's heap; it
    // reads and writes no memory; rcx and r11 are the registers `syscall` clobbers.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_pkey_mprotect => ret,
            in("rdi") start,
            in("rsi") len,
            in("rdx") prot as i64,
            in("r10") key as i64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// The protection changes in force, clamped to the heap (the block is the domain's to scribble on).
pub(super) fn ranges(b: &RuntimeBlock) -> Vec<(usize, usize, i32)> {
    let page = b.page.max(1);
    b.protected[..b.protected_count.min(PROTECTED_SLOTS)]
        .iter()
        .filter_map(|p| {
            let end = p.start.checked_add(p.len)?;
            let inside = p.start >= b.heap_start && end <= b.heap_end && p.start.is_multiple_of(page);
            // Executable pages are not made so again: they come back read-write (the heap's own protection).
            (inside && p.prot & libc::PROT_EXEC == 0).then_some((p.start, p.len, p.prot & READ_WRITE))
        })
        .collect()
}

fn fail(errno: i32) -> i32 {
    super::set_errno(errno);
    -1
}

// `mmap`'s sixth argument (the file offset) arrives as the block: only anonymous mappings are made, and they have
// no offset. The address is a hint, which the heap does not take.
/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_mmap(
    _hint: usize,
    len: usize,
    prot: i32,
    flags: i32,
    _fd: i32,
    b: *mut RuntimeBlock,
) -> *mut c_void {
    let mut locked = block(b);
    let b = &mut *locked;
    let failed = libc::MAP_FAILED;
    let kind = flags & (libc::MAP_SHARED | libc::MAP_PRIVATE | libc::MAP_SHARED_VALIDATE);
    if flags & libc::MAP_ANONYMOUS == 0
        || kind != libc::MAP_PRIVATE
        || flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0
        || len == 0
    {
        // A file, shared memory or a fixed address: none of them can be the domain's.
        fail(libc::EINVAL);
        return failed;
    }
    if prot & !READ_WRITE != 0 {
        fail(libc::EACCES);
        return failed;
    }
    let page = b.page;
    let Some(len) = len.checked_next_multiple_of(page) else {
        fail(libc::ENOMEM);
        return failed;
    };
    let p = allocate(b, len, page);
    if p.is_null() {
        return failed;
    }
    // SAFETY: `len` bytes were just allocated at p, domain memory; a reused block is not zero.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, len) };
    if prot != READ_WRITE && protect(b, p as usize, len, prot) != 0 {
        give_back(b, p as usize);
        return failed;
    }
    p
}

/// Unmaps a whole mapping `mmap` made (its start; the length is the mapping's own). Part of a mapping, or memory
/// `mmap` did not hand out, is refused with EINVAL.
///
/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_munmap(
    addr: usize,
    _len: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> i32 {
    let mut locked = block(b);
    let b = &mut *locked;
    if !addr.is_multiple_of(b.page) {
        return fail(libc::EINVAL);
    }
    let Some((class, start)) = live_block(b, addr) else {
        return fail(libc::EINVAL);
    };
    // The block's pages after `addr` go back to read-write before the heap may hand them out again.
    let end = (start + (16usize << class)) / b.page * b.page;
    let n = b.protected_count.min(PROTECTED_SLOTS);
    let mut kept = 0;
    let mut touched = false;
    for i in 0..n {
        let p = b.protected[i];
        if p.start >= addr && p.start < end {
            touched = true;
        } else {
            b.protected[kept] = p;
            kept += 1;
        }
    }
    b.protected_count = kept;
    if touched && end > addr && pkey_mprotect(addr, end - addr, READ_WRITE, b.key) != 0 {
        return fail(libc::EINVAL);
    }
    give_back(b, addr);
    0
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_mprotect(
    addr: usize,
    len: usize,
    prot: i32,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> i32 {
    protect(&mut block(b), addr, len, prot)
}

/// Changes the protection of heap pages `[addr, addr + len)` and remembers it for a restore.
fn protect(b: &mut RuntimeBlock, addr: usize, len: usize, prot: i32) -> i32 {
    let executable = prot & libc::PROT_EXEC != 0;
    if prot & !(READ_WRITE | libc::PROT_EXEC) != 0 || (executable && prot & libc::PROT_WRITE != 0) {
        // Writable code could be changed after the scan below; other bits (PROT_GROWSDOWN, say) have no heap use.
        return fail(libc::EACCES);
    }
    // Executable pages are readable: the scan reads them, and the code's own constants are there.
    let prot = if executable { READ_EXECUTE } else { prot };
    let Some(len) = len.checked_next_multiple_of(b.page) else {
        return fail(libc::ENOMEM);
    };
    let inside = addr.checked_add(len).is_some_and(|end| addr >= b.heap_start && end <= b.heap_top);
    if !addr.is_multiple_of(b.page) || !inside {
        // Outside the heap: the images, the stack, the host's memory. None of it is the domain's to re-protect.
        return fail(if addr.is_multiple_of(b.page) { libc::ENOMEM } else { libc::EINVAL });
    }
    if len == 0 {
        return 0;
    }
    if executable {
        if let Err(errno) = scannable(b, addr, len) {
            return fail(errno);
        }
    }
    let n = b.protected_count.min(PROTECTED_SLOTS);
    match b.protected[..n].iter().position(|p| p.start == addr && p.len == len) {
        Some(i) if prot == READ_WRITE => {
            b.protected.copy_within(i + 1..n, i);
            b.protected_count = n - 1;
        }
        Some(i) => b.protected[i].prot = prot,
        None if n == PROTECTED_SLOTS => return fail(libc::ENOMEM),
        None => {
            b.protected[n] = Protection { start: addr, len, prot };
            b.protected_count = n + 1;
        }
    }
    let r = pkey_mprotect(addr, len, prot, b.key);
    if r != 0 {
        return fail((-r) as i32);
    }
    0
}

/// The protection the domain gave the heap page at `page_at` (read-write unless it changed it).
fn protection_of(b: &RuntimeBlock, page_at: usize) -> i32 {
    let n = b.protected_count.min(PROTECTED_SLOTS);
    // The latest change covering the page is the one in force.
    b.protected[..n]
        .iter()
        .rev()
        .find(|p| p.start <= page_at && page_at - p.start < p.len)
        .map_or(READ_WRITE, |p| p.prot)
}

/// Whether the heap pages `[addr, addr + len)` (page-aligned, inside the used heap) may become executable: every
/// page readable now, and no instruction the loader refuses in their bytes, nor across the edge into an executable
/// page beside them. `Err` carries the errno: `EACCES` for an unreadable page, `EPERM` for a forbidden instruction.
fn scannable(b: &RuntimeBlock, addr: usize, len: usize) -> Result<(), i32> {
    let page = b.page;
    let end = addr + len;
    if (addr..end).step_by(page).any(|p| protection_of(b, p) & libc::PROT_READ == 0) {
        return Err(libc::EACCES);
    }
    let beside_executable =
        |p: usize| p >= b.heap_start && p < b.heap_top && protection_of(b, p) & libc::PROT_EXEC != 0;
    let from = if addr >= page && beside_executable(addr - page) { addr - SCAN_REACH } else { addr };
    let to = if beside_executable(end) { end + SCAN_REACH } else { end };
    // SAFETY: [addr, end) is heap memory the domain can read (every page checked readable above); the bytes added
    // at either end lie in an executable page of the heap, readable too.
    let code = unsafe { std::slice::from_raw_parts(from as *const u8, to - from) };
    match crate::assess::scan::first_forbidden(code) {
        Some(_) => Err(libc::EPERM),
        None => Ok(()),
    }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_sysconf(
    name: i32,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> i64 {
    let mut locked = block(b);
    let b = &mut *locked;
    match name {
        libc::_SC_PAGESIZE => b.page as i64,
        libc::_SC_NPROCESSORS_CONF | libc::_SC_NPROCESSORS_ONLN => b.processors,
        libc::_SC_CLK_TCK => 100,
        _ => i64::from(fail(libc::EINVAL)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::fresh;
    use super::*;

    #[test]
    fn mmap_hands_out_zeroed_pages_and_munmap_takes_back_only_whole_mappings() {
        // SAFETY: the thunk contract: `bp` is a block laid out by `fresh`, alive for the test, whose heap the mappings
        // come from; the slice read lies in the 5000 bytes mapped at `p`.
        unsafe {
            let mut heap = vec![0u8; 1 << 20];
            let mut b = fresh(&mut heap);
            let bp: *mut RuntimeBlock = &mut **b;
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            let p = rt_mmap(0, 5000, READ_WRITE, flags, -1, bp) as usize;
            assert_ne!(p, libc::MAP_FAILED as usize);
            assert_eq!(p % b.page, 0);
            // 5000 bytes (two pages) were mapped at p.
            assert!(std::slice::from_raw_parts(p as *const u8, 5000).iter().all(|&x| x == 0));
            assert_eq!(rt_munmap(p + b.page, 4096, 0, 0, 0, bp), -1, "part of a mapping");
            assert_eq!(super::super::errno(), libc::EINVAL);
            assert_eq!(rt_munmap(p, 5000, 0, 0, 0, bp), 0);
            assert_eq!(rt_munmap(p, 5000, 0, 0, 0, bp), -1, "twice");
            let shared = rt_mmap(0, 4096, READ_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, bp);
            assert_eq!(shared, libc::MAP_FAILED);
            let file = rt_mmap(0, 4096, READ_WRITE, libc::MAP_PRIVATE, 3, bp);
            assert_eq!(file, libc::MAP_FAILED);
            let exec = rt_mmap(0, 4096, libc::PROT_READ | libc::PROT_EXEC, flags, -1, bp);
            assert_eq!(exec, libc::MAP_FAILED);
            assert_eq!(super::super::errno(), libc::EACCES);
        }
    }

    #[test]
    fn mprotect_refuses_memory_outside_the_heap() {
        // SAFETY: the thunk contract: `bp` is a block laid out by `fresh`, alive for the test, whose heap the mappings
        // come from.
        unsafe {
            let mut heap = vec![0u8; 1 << 20];
            let mut b = fresh(&mut heap);
            let bp: *mut RuntimeBlock = &mut **b;
            let p = rt_mmap(0, 8192, READ_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, bp) as usize;
            let outside = b.heap_end;
            assert_eq!(rt_mprotect(outside, 4096, libc::PROT_READ, 0, 0, bp), -1);
            assert_eq!(rt_mprotect(p + 1, 4096, libc::PROT_READ, 0, 0, bp), -1);
            assert_eq!(super::super::errno(), libc::EINVAL);
            assert!(ranges(&b).is_empty(), "nothing refused is remembered");
        }
    }

    #[test]
    fn heap_pages_become_executable_only_read_only_and_only_without_forbidden_instructions() {
        // Only the refusals reach no system call: making the pages executable (pkey_mprotect) needs a processor
        // with protection keys, and the mpk runtime tests do it.
        // SAFETY: the thunk contract: `bp` is a block laid out by `fresh`, alive for the test, whose heap the mappings
        // come from; the bytes written lie in the two pages mapped at `p`, read-write.
        unsafe {
            let mut heap = vec![0u8; 1 << 20];
            let mut b = fresh(&mut heap);
            let bp: *mut RuntimeBlock = &mut **b;
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            let page = b.page;
            let p = rt_mmap(0, 2 * page, READ_WRITE, flags, -1, bp) as usize;
            let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
            assert_eq!(rt_mprotect(p, page, rwx, 0, 0, bp), -1, "writable and executable at once");
            assert_eq!(super::super::errno(), libc::EACCES);
            // WRPKRU in the second page.
            std::ptr::copy_nonoverlapping([0x0f, 0x01, 0xef].as_ptr(), (p + page) as *mut u8, 3);
            assert_eq!(rt_mprotect(p + page, page, READ_EXECUTE, 0, 0, bp), -1);
            assert_eq!(super::super::errno(), libc::EPERM);
            assert!(ranges(&b).is_empty(), "nothing refused is remembered");
            assert_eq!(scannable(&b, p, page), Ok(()), "the first page holds none");
            // A forbidden instruction across the edge of an executable page: the first page's last byte starts one
            // that the second page ends.
            *((p + page - 1) as *mut u8) = 0x0f;
            *((p + page) as *mut [u8; 3]) = [0x01, 0xef, 0x90];
            assert_eq!(scannable(&b, p + page, page), Ok(()), "beside a page that is not executable");
            b.protected[0] = Protection { start: p, len: page, prot: READ_EXECUTE };
            b.protected_count = 1;
            assert_eq!(protection_of(&b, p), READ_EXECUTE);
            assert_eq!(protection_of(&b, p + page), READ_WRITE);
            assert_eq!(scannable(&b, p + page, page), Err(libc::EPERM), "beside an executable page");
            assert!(ranges(&b).is_empty(), "executable pages are never made so again by a restore");
            // A page made inaccessible is not scanned.
            b.protected[0] = Protection { start: p, len: page, prot: libc::PROT_NONE };
            assert_eq!(scannable(&b, p, page), Err(libc::EACCES));
        }
    }

    #[test]
    fn sysconf_answers_the_page_size_and_refuses_the_rest() {
        // SAFETY: the thunk contract: `bp` is a block laid out by `fresh`, alive for the test, whose heap the mappings
        // come from.
        unsafe {
            let mut heap = vec![0u8; 4096];
            let mut b = fresh(&mut heap);
            let bp: *mut RuntimeBlock = &mut **b;
            assert_eq!(rt_sysconf(libc::_SC_PAGESIZE, 0, 0, 0, 0, bp), crate::domain::memory::page_size() as i64);
            assert!(rt_sysconf(libc::_SC_NPROCESSORS_ONLN, 0, 0, 0, 0, bp) >= 1);
            assert_eq!(rt_sysconf(libc::_SC_OPEN_MAX, 0, 0, 0, 0, bp), -1);
            assert_eq!(super::super::errno(), libc::EINVAL);
        }
    }
}
