//! `sigaction` and the older ways to install a handler (`signal`, `bsd_signal`, `sysv_signal`, `sigset`) as the
//! host sees them: through ward, so that a handler the host installs after its plugins are in mpk domains still runs
//! with the host's rights, and one for a signal ward handles does not take ward's place (see
//! `ward::host_sigaction`). Without mpk domains each means what libc's means.

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

/// The host's `signal`, with glibc's (BSD) meaning.
///
/// # Safety
/// As libc's: `handler` is SIG_DFL, SIG_IGN or a function that follows the C signal handler ABI.
#[no_mangle]
pub unsafe extern "C" fn signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { ward::host_signal(signal, handler) }
}

/// The host's `bsd_signal`: glibc's `signal`.
///
/// # Safety
/// As for [`signal`].
#[no_mangle]
pub unsafe extern "C" fn bsd_signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { ward::host_signal(signal, handler) }
}

/// The host's `sysv_signal`.
///
/// # Safety
/// As for [`signal`].
#[no_mangle]
pub unsafe extern "C" fn sysv_signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { ward::host_sysv_signal(signal, handler) }
}

/// What `signal` calls in a program compiled for strict ISO C (glibc's headers redirect it here).
///
/// # Safety
/// As for [`signal`].
#[no_mangle]
pub unsafe extern "C" fn __sysv_signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { ward::host_sysv_signal(signal, handler) }
}

/// The host's `sigset`.
///
/// # Safety
/// As for [`signal`]; `SIG_HOLD` is also a valid disposition.
#[no_mangle]
pub unsafe extern "C" fn sigset(signal: c_int, disposition: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { ward::host_sigset(signal, disposition) }
}
