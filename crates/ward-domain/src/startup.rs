//! What the domain process does to itself at start, below the safe API: the descriptors the host handed over taken
//! into ownership once, its life tied to the host's, its own pidfd, every other descriptor closed.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Descriptor numbers the host hands over.
const FD_CONTROL: i32 = 3;
const FD_REGION: i32 = 4;
const FD_POOL_IN: i32 = 5;
const FD_POOL_OUT: i32 = 6;
/// The first descriptor number above those the host hands over: where a domain keeps what it opens before they
/// are all in place (a spare, before its domain's setup comes).
pub(crate) const FIRST_OWN_FD: i32 = FD_POOL_OUT + 1;

/// The descriptors the host started this process with.
pub(crate) struct Inherited {
    pub control: OwnedFd,
    pub region: OwnedFd,
    pub pool_in: OwnedFd,
    pub pool_out: OwnedFd,
}

static TAKEN: AtomicBool = AtomicBool::new(false);

impl Inherited {
    /// Takes the host's descriptors into ownership; None if they were taken already (each must have one owner).
    pub(crate) fn take() -> Option<Inherited> {
        if TAKEN.swap(true, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: the host started this process with these four numbers open (`spawn`, and the zygote's fork) and
        // nothing in this process has taken them: `TAKEN` lets this run once, and `close_other_descriptors` spares
        // them. Each becomes the one owner of its descriptor.
        let own = |fd| unsafe { OwnedFd::from_raw_fd(fd) };
        Some(Inherited {
            control: own(FD_CONTROL),
            region: own(FD_REGION),
            pool_in: own(FD_POOL_IN),
            pool_out: own(FD_POOL_OUT),
        })
    }
}

/// This process's id (inside its PID namespace, if it entered one).
pub(crate) fn own_pid() -> i32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// A pidfd of this process, for the host (which cannot use a pid from inside a namespace).
pub(crate) fn own_pidfd() -> std::io::Result<OwnedFd> {
    // SAFETY: getpid has no preconditions; pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Be killed when the thread that started this process ends (`PR_SET_PDEATHSIG`), and say whether `parent` is still
/// this process's parent. The host starts domains without running anything in the child before exec, so the domain
/// sets this itself; a host that ended before that has left this process to another parent, which the check sees.
pub(crate) fn die_with(parent: i32) -> bool {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number, no pointers.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return false;
    }
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() == parent }
}

/// Close every descriptor the host did not give us (a host may leak descriptors without `O_CLOEXEC`).
pub(crate) fn close_other_descriptors() {
    let first = FIRST_OWN_FD;
    // SAFETY: close_range only closes descriptors; none from `first` on is owned by anything in this process yet.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
    if rc != 0 {
        // Kernels before 5.9: close them one by one.
        // SAFETY: sysconf has no preconditions.
        let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
        for fd in first..(max.clamp(0, 65536) as i32) {
            // SAFETY: close takes a number; none from `first` on is owned by anything in this process yet (as for
            // close_range), and EBADF for unused numbers is harmless.
            unsafe { libc::close(fd) };
        }
    }
}
