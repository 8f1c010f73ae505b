//! Anonymous mappings and their protections, inside the domain: `mmap` hands out zeroed, page-aligned memory from
//! the domain's heap (so it carries the domain's key, counts against its quota and is restored with it), and
//! `mprotect` changes the protection of heap pages with the domain's key, read and write at most: a guard page
//! an extension makes faults as it would in a process, and nothing the domain does makes a page executable or
//! gives it another key. `sysconf` answers what such code asks it (the page size, the processor count).

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
            inside.then_some((p.start, p.len, p.prot & READ_WRITE))
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
    if prot & !READ_WRITE != 0 {
        // Executable pages would be code the loader never scanned for WRPKRU.
        return fail(libc::EACCES);
    }
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
    fn mprotect_refuses_execute_and_memory_outside_the_heap() {
        // SAFETY: the thunk contract: `bp` is a block laid out by `fresh`, alive for the test, whose heap the mappings
        // come from.
        unsafe {
            let mut heap = vec![0u8; 1 << 20];
            let mut b = fresh(&mut heap);
            let bp: *mut RuntimeBlock = &mut **b;
            let p = rt_mmap(0, 8192, READ_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, bp) as usize;
            assert_eq!(rt_mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC, 0, 0, bp), -1);
            assert_eq!(super::super::errno(), libc::EACCES);
            let outside = b.heap_end;
            assert_eq!(rt_mprotect(outside, 4096, libc::PROT_READ, 0, 0, bp), -1);
            assert_eq!(rt_mprotect(p + 1, 4096, libc::PROT_READ, 0, 0, bp), -1);
            assert_eq!(super::super::errno(), libc::EINVAL);
            assert!(ranges(&b).is_empty(), "nothing refused is remembered");
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
