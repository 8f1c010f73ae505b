//! Shared memory: one `memfd` mapped `MAP_SHARED`.
//!
//! The host creates the file ([`SharedMemory::create`]) and passes the descriptor to the domain, which maps it with
//! [`SharedMemory::from_fd`]. Both sides see the same pages, so everything in them may change under the reader's
//! feet: this type therefore never hands out references into the mapping, only a raw pointer and the bounds-checked
//! copies [`SharedMemory::write_at`] and [`SharedMemory::read_at`].
//!
//! Files made by [`SharedMemory::create`] are sealed against shrinking and growing after they get their size: a
//! peer that could `ftruncate` the file would make every access of the creator beyond the new end raise `SIGBUS`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};

/// `madvise` advice that installs guard regions (Linux 6.13; `asm-generic/mman-common.h`); the libc crate lacks it.
const MADV_GUARD_INSTALL: libc::c_int = 102;
/// Whether this kernel takes [`MADV_GUARD_INSTALL`] on shared mappings; cleared at the first refusal.
static GUARD_REGIONS: AtomicBool = AtomicBool::new(true);
/// Whether this kernel takes [`MADV_GUARD_INSTALL`] from `process_madvise` on this process; cleared at the first
/// refusal.
static VECTORED_GUARDS: AtomicBool = AtomicBool::new(true);

/// A pidfd of this process.
fn own_pidfd() -> io::Result<OwnedFd> {
    // SAFETY: getpid has no preconditions; pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Access rights of (part of) a mapping in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    ReadOnly,
    ReadWrite,
    None,
}

impl Protection {
    fn bits(self) -> libc::c_int {
        match self {
            Protection::ReadOnly => libc::PROT_READ,
            Protection::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
            Protection::None => libc::PROT_NONE,
        }
    }
}

/// Errors of [`SharedMemory`].
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// The name holds a NUL byte.
    #[error("memfd name {0:?} holds a NUL byte")]
    BadName(String),
    /// A mapping of zero bytes was asked for, or the file is empty.
    #[error("shared memory of zero bytes")]
    Empty,
    /// The size does not fit the platform's types.
    #[error("shared memory of {0} bytes is too large")]
    TooLarge(u64),
    /// `memfd_create` failed.
    #[error("memfd_create failed: {0}")]
    Create(#[source] io::Error),
    /// `ftruncate` failed.
    #[error("cannot size the memfd: {0}")]
    Truncate(#[source] io::Error),
    /// `fcntl(F_ADD_SEALS)` failed.
    #[error("cannot seal the memfd: {0}")]
    Seal(#[source] io::Error),
    /// `fstat` failed.
    #[error("cannot stat the shared memory descriptor: {0}")]
    Stat(#[source] io::Error),
    /// Reopening the memfd read-only failed.
    #[error("cannot reopen the shared memory read-only: {0}")]
    Reopen(#[source] io::Error),
    /// `mmap` failed.
    #[error("cannot map the shared memory: {0}")]
    Map(#[source] io::Error),
    /// `mprotect` failed.
    #[error("cannot change the protection of the shared memory: {0}")]
    Protect(#[source] io::Error),
    /// A range does not lie inside the mapping.
    #[error("range of {len} bytes at offset {offset} is outside the mapping of {size} bytes")]
    OutOfBounds { offset: usize, len: usize, size: usize },
    /// A range handed to [`SharedMemory::protect`] is not page-aligned.
    #[error("range of {len} bytes at offset {offset} is not page-aligned")]
    Unaligned { offset: usize, len: usize },
    /// A copy needs an access right the mapping was not made with.
    #[error("the mapping is {0:?}")]
    Access(Protection),
}

/// One `MAP_SHARED` mapping of a memfd. Unmapped when dropped; the descriptor is closed then too.
#[derive(Debug)]
pub struct SharedMemory {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    /// Protection the whole mapping was made with (sub-ranges changed by [`SharedMemory::protect`] are not tracked).
    prot: Protection,
}

// SAFETY: the mapping belongs to the process, not to a thread: any thread may access it, and unmapping it in drop
// from another thread is fine. This type never hands out references into the mapping, only a raw pointer and copies;
// concurrent access from several threads is no different from the concurrent access by the peer process that every
// user of the mapping must already tolerate.
unsafe impl Send for SharedMemory {}
// SAFETY: see `Send`; every `&self` method is either read-only bookkeeping or a copy through raw pointers that
// tolerates concurrent writers (the peer process is one anyway).
unsafe impl Sync for SharedMemory {}

/// The system page size.
/// Reserve `len` bytes of address space, inaccessible and backed by nothing (`PROT_NONE`, `MAP_NORESERVE`), for
/// mappings placed inside it later with `MAP_FIXED`. The caller unmaps it.
pub(crate) fn reserve(len: usize) -> io::Result<*mut libc::c_void> {
    // SAFETY: a fresh inaccessible anonymous reservation chosen by the kernel overlaps nothing.
    let base = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(base)
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|n| n / to * to)
}

impl SharedMemory {
    /// Create a memfd called `name` (close-on-exec) of `len` bytes rounded up to the page, seal its size, and map it
    /// read-write and shared.
    pub fn create(name: &str, len: usize) -> Result<Self, ShmError> {
        if len == 0 {
            return Err(ShmError::Empty);
        }
        let len = round_up(len, page_size()).ok_or(ShmError::TooLarge(len as u64))?;
        let size = libc::off_t::try_from(len).map_err(|_| ShmError::TooLarge(len as u64))?;
        let cname = CString::new(name).map_err(|_| ShmError::BadName(name.to_owned()))?;
        // SAFETY: cname is a valid NUL-terminated string that outlives the call.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(ShmError::Create(io::Error::last_os_error()));
        }
        // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on a descriptor we own; no memory is involved.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(ShmError::Truncate(io::Error::last_os_error()));
        }
        // SAFETY: fcntl(F_ADD_SEALS) on a descriptor we own takes an int argument; no memory is involved.
        let sealed = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) };
        if sealed != 0 {
            return Err(ShmError::Seal(io::Error::last_os_error()));
        }
        Self::map(fd, len, Protection::ReadWrite)
    }

    /// Map an existing memfd, all of it (its size from `fstat`), with `prot`.
    pub fn from_fd(fd: OwnedFd, prot: Protection) -> Result<Self, ShmError> {
        // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: st is a valid, writable `stat` for fstat to fill.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(ShmError::Stat(io::Error::last_os_error()));
        }
        let len = usize::try_from(st.st_size).map_err(|_| ShmError::TooLarge(st.st_size as u64))?;
        if len == 0 {
            return Err(ShmError::Empty);
        }
        Self::map(fd, len, prot)
    }

    fn map(fd: OwnedFd, len: usize, prot: Protection) -> Result<Self, ShmError> {
        // SAFETY: a fresh mapping chosen by the kernel (null hint, no MAP_FIXED) cannot overlap anything Rust owns;
        // fd is an open descriptor.
        let p = unsafe { libc::mmap(ptr::null_mut(), len, prot.bits(), libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(ShmError::Map(io::Error::last_os_error()));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| ShmError::Map(io::Error::other("mmap returned null")))?;
        Ok(SharedMemory { fd, base, len, prot })
    }

    /// The memfd, to pass to the peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A read-only descriptor of the memfd, to pass to a peer that must not write it ([`reopen_read_only`]).
    pub fn read_only_fd(&self) -> Result<OwnedFd, ShmError> {
        reopen_read_only(self.fd.as_fd()).map_err(ShmError::Reopen)
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty mappings cannot be made.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the mapping. Valid for `len()` bytes while `self` lives; the peer may write it at any time.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), ShmError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(ShmError::OutOfBounds { offset, len, size: self.len }),
        }
    }

    /// Change the protection of the page-aligned range `[offset, offset + len)` in this process only.
    pub fn protect(&self, offset: usize, len: usize, prot: Protection) -> Result<(), ShmError> {
        self.check_pages(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range is page-aligned and inside our own mapping (checked above), so this changes no memory
        // that Rust owns elsewhere; no reference into the mapping exists (this type hands out none), so revoking
        // access cannot invalidate one. Raw pointers that users hold may fault afterwards, which is the point.
        let rc = unsafe { libc::mprotect(self.base.as_ptr().add(offset).cast(), len, prot.bits()) };
        if rc != 0 {
            return Err(ShmError::Protect(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// That a range is page-aligned and inside the mapping, as `mprotect` and `madvise` want it.
    fn check_pages(&self, offset: usize, len: usize) -> Result<(), ShmError> {
        let page = page_size();
        // The page size is a power of two.
        if offset & (page - 1) != 0 || len & (page - 1) != 0 {
            return Err(ShmError::Unaligned { offset, len });
        }
        // The last page of a mapping whose length is not a page multiple is whole in the kernel's eyes.
        let mapped = round_up(self.len, page).unwrap_or(self.len);
        match offset.checked_add(len) {
            Some(end) if end <= mapped => Ok(()),
            _ => Err(ShmError::OutOfBounds { offset, len, size: self.len }),
        }
    }

    /// Make a page-aligned range fault on every access for the rest of the mapping's life: a guard region
    /// (`MADV_GUARD_INSTALL`) where the kernel has them, else `PROT_NONE`. A guard region leaves the mapping one
    /// area in the kernel, where each `PROT_NONE` range splits it in up to three: a domain's pools carry over two
    /// hundred guard pages, and every area makes its start-up and each fork slower. [`SharedMemory::protect`] does
    /// not lift a guard region.
    pub fn guard(&self, offset: usize, len: usize) -> Result<(), ShmError> {
        if !GUARD_REGIONS.load(Ordering::Relaxed) {
            return self.protect(offset, len, Protection::None);
        }
        self.check_pages(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range is page-aligned and inside our own mapping (check_pages above), and no reference into
        // the mapping exists (this type hands out none); the advice only makes later accesses fault, it changes no
        // contents.
        let rc = unsafe { libc::madvise(self.base.as_ptr().add(offset).cast(), len, MADV_GUARD_INSTALL) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EINVAL) {
            // A kernel without guard regions (before 6.13), or without them for shared files: remember, and use
            // the protection instead from now on.
            GUARD_REGIONS.store(false, Ordering::Relaxed);
            return self.protect(offset, len, Protection::None);
        }
        Err(ShmError::Protect(err))
    }

    /// [`SharedMemory::guard`] for many ranges at once: one `process_madvise` on this process where the kernel
    /// takes guard regions that way (it takes any advice on the caller itself since Linux 6.14), instead of one
    /// `madvise` per range; range by range otherwise. A pool has over a hundred guards, each a system call. For a
    /// process not yet under a domain's system call filter, which allows neither `pidfd_open` to a serving process
    /// nor `process_madvise` (a domain maps its pools before its sandbox).
    pub fn guard_all(&self, ranges: &[(usize, usize)]) -> Result<(), ShmError> {
        for &(offset, len) in ranges {
            self.check_pages(offset, len)?;
        }
        if GUARD_REGIONS.load(Ordering::Relaxed)
            && VECTORED_GUARDS.load(Ordering::Relaxed)
            && self.guard_vectored(ranges)
        {
            return Ok(());
        }
        ranges.iter().try_for_each(|&(offset, len)| self.guard(offset, len))
    }

    /// Every range guarded by `process_madvise` calls (ranges checked by the caller): false when the kernel did not
    /// guard them all, which the caller then does range by range (guarding a range twice is harmless).
    fn guard_vectored(&self, ranges: &[(usize, usize)]) -> bool {
        let iovecs: Vec<libc::iovec> = ranges
            .iter()
            .filter(|&&(_, len)| len > 0)
            // offset + len lies inside the mapping (checked by the caller).
            .map(|&(offset, len)| libc::iovec {
                iov_base: self.base.as_ptr().wrapping_add(offset).cast(),
                iov_len: len,
            })
            .collect();
        let Ok(me) = own_pidfd() else {
            VECTORED_GUARDS.store(false, Ordering::Relaxed);
            return false;
        };
        // The kernel takes at most UIO_MAXIOV (1024) ranges a call.
        for chunk in iovecs.chunks(1024) {
            let wanted: usize = chunk.iter().map(|v| v.iov_len).sum();
            // SAFETY: `chunk` is a valid array of iovecs for the call, each a page-aligned range of our own mapping
            // (checked by the caller); no reference into the mapping exists (this type hands out none), and the
            // advice only makes later accesses fault, it changes no contents. `me` is a pidfd of this process.
            let done = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    me.as_raw_fd(),
                    chunk.as_ptr(),
                    chunk.len(),
                    MADV_GUARD_INSTALL,
                    0u32,
                )
            };
            if done < 0 || done as usize != wanted {
                // A kernel that takes guard regions only from madvise: remember.
                VECTORED_GUARDS.store(false, Ordering::Relaxed);
                return false;
            }
        }
        true
    }

    /// Copy `src` into the mapping at `offset`.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<(), ShmError> {
        if self.prot != Protection::ReadWrite {
            return Err(ShmError::Access(self.prot));
        }
        self.check(offset, src.len())?;
        // SAFETY: [offset, offset + src.len()) lies inside the mapping (checked), which is mapped writable and lives
        // as long as self; src is private memory, so the ranges cannot overlap. Concurrent readers in the peer see
        // bytes, never Rust values.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), self.base.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Copy bytes at `offset` out of the mapping into `dst`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), ShmError> {
        if self.prot == Protection::None {
            return Err(ShmError::Access(self.prot));
        }
        self.check(offset, dst.len())?;
        // SAFETY: [offset, offset + dst.len()) lies inside the readable mapping (checked), alive while self is; dst
        // is private memory, so the ranges cannot overlap. The bytes are copied once into dst and only the copy is
        // used, so a concurrent writer can make them garbage but cannot make us read them twice.
        unsafe { ptr::copy_nonoverlapping(self.base.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}

/// A read-only descriptor of the file `fd` is open on: a new open file description (a reopen through
/// `/proc/self/fd`), so that whoever is given it cannot map the file writable (`mmap` with `PROT_WRITE` and
/// `MAP_SHARED` fails with `EACCES`), where a duplicate would share `fd`'s access mode. Makes no allocation (the
/// arena calls it with its lock held, from inside `malloc`).
pub fn reopen_read_only(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    let mut path = [0u8; 40];
    path[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 12];
    let mut n = u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    let mut count = 0;
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (i, d) in digits[..count].iter().rev().enumerate() {
        path[PREFIX.len() + i] = *d;
    }
    // The byte after the digits stays 0: the path is NUL-terminated.
    // SAFETY: `path` is a NUL-terminated string on this stack frame, alive for the call.
    let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: base/len describe the mapping made in `map`, which nothing else unmaps; no reference into it can
        // outlive self because this type hands none out.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_rounds_to_the_page_and_copies() {
        let m = SharedMemory::create("ward-test", 100).unwrap();
        assert_eq!(m.len(), page_size());
        m.write_at(10, b"hello").unwrap();
        let mut out = [0u8; 5];
        m.read_at(10, &mut out).unwrap();
        assert_eq!(&out, b"hello");
    }

    #[test]
    fn out_of_range_copies_fail() {
        let m = SharedMemory::create("ward-test", 4096).unwrap();
        assert!(matches!(m.write_at(4095, b"ab"), Err(ShmError::OutOfBounds { .. })));
        assert!(matches!(m.write_at(usize::MAX, b"a"), Err(ShmError::OutOfBounds { .. })));
        let mut out = [0u8; 2];
        assert!(matches!(m.read_at(4095, &mut out), Err(ShmError::OutOfBounds { .. })));
        m.write_at(4096, b"").unwrap();
    }

    #[test]
    fn zero_and_bad_names_are_refused() {
        assert!(matches!(SharedMemory::create("x", 0), Err(ShmError::Empty)));
        assert!(matches!(SharedMemory::create("a\0b", 10), Err(ShmError::BadName(_))));
    }

    #[test]
    fn second_mapping_shares_bytes_and_size_is_sealed() {
        let m = SharedMemory::create("ward-test", 8192).unwrap();
        let dup = m.fd().try_clone_to_owned().unwrap();
        // SAFETY: ftruncate on a descriptor we own; the seal must refuse it.
        let rc = unsafe { libc::ftruncate(dup.as_raw_fd(), 4096) };
        assert_ne!(rc, 0, "shrinking a sealed memfd must fail");
        let ro = SharedMemory::from_fd(dup, Protection::ReadOnly).unwrap();
        assert_eq!(ro.len(), 8192);
        m.write_at(5000, b"shared").unwrap();
        let mut out = [0u8; 6];
        ro.read_at(5000, &mut out).unwrap();
        assert_eq!(&out, b"shared");
        assert!(matches!(ro.write_at(0, b"x"), Err(ShmError::Access(Protection::ReadOnly))));
    }

    #[test]
    fn a_read_only_descriptor_maps_for_reading_and_never_for_shared_writing() {
        let m = SharedMemory::create("ward-test", 8192).unwrap();
        m.write_at(100, b"host").unwrap();
        let ro = m.read_only_fd().unwrap();
        // SAFETY: a fresh mapping chosen by the kernel; it is unmapped below if made.
        let writable = unsafe {
            libc::mmap(ptr::null_mut(), 8192, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, ro.as_raw_fd(), 0)
        };
        assert_eq!(writable, libc::MAP_FAILED, "a shared writable mapping of a read-only descriptor");
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EACCES));
        let view = SharedMemory::from_fd(ro, Protection::ReadOnly).unwrap();
        // Nor can the read-only mapping be made writable afterwards.
        assert!(matches!(view.protect(0, 4096, Protection::ReadWrite), Err(ShmError::Protect(_))));
        let mut out = [0u8; 4];
        view.read_at(100, &mut out).unwrap();
        assert_eq!(&out, b"host");
    }

    #[test]
    fn protect_checks_alignment_and_bounds() {
        let m = SharedMemory::create("ward-test", 8192).unwrap();
        assert!(matches!(m.protect(1, 4096, Protection::ReadOnly), Err(ShmError::Unaligned { .. })));
        assert!(matches!(m.protect(4096, 8192, Protection::ReadOnly), Err(ShmError::OutOfBounds { .. })));
        m.protect(4096, 4096, Protection::ReadOnly).unwrap();
        m.protect(4096, 4096, Protection::ReadWrite).unwrap();
        m.write_at(4096, b"ok").unwrap();
    }

    #[test]
    fn guard_checks_alignment_and_bounds() {
        let m = SharedMemory::create("ward-test", 8192).unwrap();
        assert!(matches!(m.guard(1, 4096), Err(ShmError::Unaligned { .. })));
        assert!(matches!(m.guard(4096, 8192), Err(ShmError::OutOfBounds { .. })));
        m.guard(8192, 0).unwrap();
    }

    /// Read the byte at `offset` of `m` in a forked child: how the child ended (`Ok(())` for a clean exit, else
    /// the signal that ended it).
    fn read_in_child(m: &SharedMemory, offset: usize) -> Result<(), i32> {
        let at = m.as_ptr().wrapping_add(offset);
        // SAFETY: the child only reads one byte (volatile, so the read happens) and calls `_exit`, both
        // async-signal-safe, so forking the multithreaded test process is sound; the parent only waits for it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: `at` lies inside the mapping, which the child inherited; a guard makes the read fault.
            unsafe {
                ptr::read_volatile(at);
                libc::_exit(0);
            }
        }
        assert!(pid > 0, "fork: {}", io::Error::last_os_error());
        let mut status = 0;
        // SAFETY: waits for the child just forked; `status` is a valid place for its status.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if libc::WIFSIGNALED(status) {
            Err(libc::WTERMSIG(status))
        } else {
            assert_eq!(libc::WEXITSTATUS(status), 0);
            Ok(())
        }
    }

    #[test]
    fn a_guarded_page_faults_on_access_here_and_in_a_forked_child_and_its_neighbours_do_not() {
        let page = page_size();
        let m = SharedMemory::create("ward-test", 3 * page).unwrap();
        let ro = SharedMemory::from_fd(m.fd().try_clone_to_owned().unwrap(), Protection::ReadOnly).unwrap();
        m.guard(page, page).unwrap();
        ro.guard(page, page).unwrap();
        for mapping in [&m, &ro] {
            assert_eq!(read_in_child(mapping, 0), Ok(()));
            assert_eq!(read_in_child(mapping, page), Err(libc::SIGSEGV), "the guarded page");
            assert_eq!(read_in_child(mapping, 2 * page), Ok(()));
        }
        // The guard is in this mapping only: the bytes under it are the file's, and the rest still copies.
        m.write_at(2 * page, b"after").unwrap();
        let mut out = [0u8; 5];
        ro.read_at(2 * page, &mut out).unwrap();
        assert_eq!(&out, b"after");
    }

    #[test]
    fn guards_installed_at_once_fault_and_the_pages_between_do_not() {
        let page = page_size();
        let m = SharedMemory::create("ward-test", 8 * page).unwrap();
        let ro = SharedMemory::from_fd(m.fd().try_clone_to_owned().unwrap(), Protection::ReadOnly).unwrap();
        let guards = [(page, page), (3 * page, 2 * page), (7 * page, page), (6 * page, 0)];
        m.guard_all(&guards).unwrap();
        ro.guard_all(&guards).unwrap();
        for mapping in [&m, &ro] {
            for (i, guarded) in [false, true, false, true, true, false, false, true].into_iter().enumerate() {
                let expected = if guarded { Err(libc::SIGSEGV) } else { Ok(()) };
                assert_eq!(read_in_child(mapping, i * page), expected, "page {i}");
            }
        }
        assert!(matches!(m.guard_all(&[(page, page), (1, page)]), Err(ShmError::Unaligned { .. })));
        assert!(matches!(m.guard_all(&[(8 * page, page)]), Err(ShmError::OutOfBounds { .. })));
    }
}
