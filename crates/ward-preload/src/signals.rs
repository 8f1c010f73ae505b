//! `sigaction` and `signal` as the host sees them: through ward, so that a handler the host installs after its
//! plugins are in mpk domains still runs with the host's rights, and one for a signal ward handles does not take
//! ward's place (see `ward::host_sigaction`). Without mpk domains both are libc's.

use std::ffi::c_int;

/// The host's `sigaction`.
///
/// # Safety
/// As libc's: `act` and `old` are null or valid, and a handler in `act` follows the C signal handler ABI.
#[no_mangle]
pub unsafe extern "C" fn sigaction(signal: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { ward::host_sigaction(signal, act, old) }
}

/// The host's `signal`, with glibc's (BSD) meaning: the handler stays installed, interrupted system calls restart,
/// and the signal is blocked while its handler runs.
///
/// # Safety
/// As libc's: `handler` is SIG_DFL, SIG_IGN or a function that follows the C signal handler ABI.
#[no_mangle]
pub unsafe extern "C" fn signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if signal <= 0 || signal > libc::SIGRTMAX() {
        set_errno(libc::EINVAL);
        return libc::SIG_ERR;
    }
    // SAFETY: all-zero is a valid sigaction (SIG_DFL, empty mask, no flags), for both.
    let (mut act, mut old): (libc::sigaction, libc::sigaction) = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: a valid set, and a signal number checked above.
    unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaddset(&mut act.sa_mask, signal);
    }
    // SAFETY: both actions are valid; the handler is the caller's, under the caller's guarantee.
    if unsafe { ward::host_sigaction(signal, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

fn set_errno(errno: c_int) {
    // SAFETY: __errno_location gives this thread's errno.
    unsafe { *libc::__errno_location() = errno };
}
