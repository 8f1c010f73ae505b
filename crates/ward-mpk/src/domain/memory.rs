//! Memory of a protection key: anonymous mappings tagged with one key, with an inaccessible guard page at each
//! end, so running off either end (a stack overflow, a write past a buffer) is a fault rather than a write into
//! whatever the kernel mapped next.

use std::io;
use std::ptr::NonNull;

use super::pku;

/// An anonymous read-write region tagged with one protection key, between two guard pages. Unmapped on drop.
#[derive(Debug)]
pub struct KeyedRegion {
    /// The whole mapping, guard pages included.
    base: NonNull<u8>,
    mapped: usize,
    /// The usable part: `[base + page, base + page + len)`.
    len: usize,
    page: usize,
}

// SAFETY: the region is plain memory owned by this object; which threads may touch it is up to PKRU, not to Rust.
unsafe impl Send for KeyedRegion {}
// SAFETY: the region is plain memory owned by this object, and the object itself is never mutated through a shared
// reference.
unsafe impl Sync for KeyedRegion {}

impl KeyedRegion {
    /// At least `len` usable bytes (rounded up to pages), zeroed, tagged with `key`.
    pub fn new(len: usize, key: u32) -> io::Result<KeyedRegion> {
        let page = page_size();
        let len = len.max(1).div_ceil(page) * page;
        let mapped = len + 2 * page;
        // SAFETY: a fresh private anonymous mapping at an address the kernel picks overlaps nothing of anyone's.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let region = KeyedRegion { base, mapped, len, page };
        // SAFETY: the usable part lies inside the mapping just made, which this object owns.
        unsafe { pku::protect_with_key(region.start(), len, libc::PROT_READ | libc::PROT_WRITE, key)? };
        Ok(region)
    }

    /// The first usable byte.
    pub fn start(&self) -> *mut u8 {
        self.base.as_ptr().wrapping_add(self.page)
    }

    /// One past the last usable byte (the top of a stack).
    pub fn end(&self) -> *mut u8 {
        self.start().wrapping_add(self.len)
    }

    // A region is never empty (`new` rounds up to at least a page), so no `is_empty`.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether `addr` lies in the usable part.
    #[cfg(test)]
    pub fn contains(&self, addr: usize) -> bool {
        (self.start() as usize..self.end() as usize).contains(&addr)
    }
}

impl Drop for KeyedRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `new` with this base and length and nothing else refers to it once its
        // owner is gone.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
    }
}

pub fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the process.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096)
}

/// How much more address space this process may map under its `RLIMIT_AS` (a host run with `ulimit -v`, say):
/// `None` when it has no limit. A domain's reservations count against the host's limit, as every mapping does.
pub fn address_space_room() -> Option<usize> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct it is given, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    let limit = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
    // The first field of statm is the size of every mapping, in pages.
    let mapped_pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse::<usize>().ok()))
        .unwrap_or(0);
    Some(limit.saturating_sub(mapped_pages.saturating_mul(page_size())))
}
