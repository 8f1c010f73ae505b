//! The older ways a host installs a signal handler (`signal`, `sysv_signal`, `sigset`), each with glibc's meaning,
//! built on [`host_sigaction`] so that a handler installed through them is wrapped or recorded like one installed
//! with `sigaction` (see `gate`). A program compiled for strict ISO C calls `__sysv_signal` when its source says
//! `signal`; System V code calls `sigset`. `ward-preload` puts these in place of libc's.

use std::ffi::c_int;
use std::mem::MaybeUninit;
use std::ptr;

use super::gate::host_sigaction;
use super::runtime::set_errno;

/// The disposition `sigset` takes to mean "block the signal" (glibc's `SIG_HOLD`, which the libc crate lacks).
pub const SIG_HOLD: libc::sighandler_t = 2;

fn valid(signal: c_int) -> bool {
    (1..=libc::SIGRTMAX()).contains(&signal)
}

fn empty_action() -> libc::sigaction {
    // SAFETY: all-zero is a valid sigaction (SIG_DFL, empty mask, no flags).
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// Installs `handler` with `flags` and a mask of `mask_self` (the signal itself) or nothing; the previous handler.
///
/// # Safety
/// `handler` is SIG_DFL, SIG_IGN or a function that follows the C signal handler ABI.
unsafe fn install(signal: c_int, handler: libc::sighandler_t, flags: c_int, mask_self: bool) -> libc::sighandler_t {
    if !valid(signal) || handler == libc::SIG_ERR {
        set_errno(libc::EINVAL);
        return libc::SIG_ERR;
    }
    let (mut act, mut old) = (empty_action(), empty_action());
    act.sa_sigaction = handler;
    act.sa_flags = flags;
    // SAFETY: a valid set, and a signal number checked above.
    unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        if mask_self {
            libc::sigaddset(&mut act.sa_mask, signal);
        }
    }
    // SAFETY: both actions are valid; the handler is the caller's, under the caller's guarantee.
    if unsafe { host_sigaction(signal, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// glibc's `signal` (and `bsd_signal`): the handler stays installed, interrupted system calls restart, and the
/// signal is blocked while its handler runs.
///
/// # Safety
/// `handler` is SIG_DFL, SIG_IGN or a function that follows the C signal handler ABI.
pub unsafe fn host_signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee.
    unsafe { install(signal, handler, libc::SA_RESTART, true) }
}

/// glibc's `sysv_signal` (`__sysv_signal`): the handler is reset to the default as it starts, the signal is not
/// blocked while it runs, and interrupted system calls fail with EINTR.
///
/// # Safety
/// As for [`host_signal`].
pub unsafe fn host_sysv_signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee.
    unsafe { install(signal, handler, libc::SA_RESETHAND | libc::SA_NODEFER, false) }
}

/// This thread's signal mask changed by `how` for `signal` alone; whether the signal was blocked before.
fn change_mask(how: c_int, signal: c_int) -> Option<bool> {
    let mut set = MaybeUninit::<libc::sigset_t>::zeroed();
    let mut before = MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: both sets are valid memory for a sigset_t, filled before they are read; the signal is valid.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), signal);
        if libc::pthread_sigmask(how, set.as_ptr(), before.as_mut_ptr()) != 0 {
            return None;
        }
        Some(libc::sigismember(before.as_ptr(), signal) == 1)
    }
}

/// System V's `sigset`, as glibc has it: `SIG_HOLD` blocks the signal and leaves its action; any other disposition
/// is installed (no flags, empty mask) and unblocks the signal. Returns `SIG_HOLD` when the signal was blocked
/// before, else the previous handler.
///
/// # Safety
/// As for [`host_signal`].
pub unsafe fn host_sigset(signal: c_int, disposition: libc::sighandler_t) -> libc::sighandler_t {
    if !valid(signal) || disposition == libc::SIG_ERR {
        set_errno(libc::EINVAL);
        return libc::SIG_ERR;
    }
    if disposition == SIG_HOLD {
        let Some(was_blocked) = change_mask(libc::SIG_BLOCK, signal) else {
            return libc::SIG_ERR;
        };
        if was_blocked {
            return SIG_HOLD;
        }
        let mut old = empty_action();
        // SAFETY: a query into memory we own.
        if unsafe { host_sigaction(signal, ptr::null(), &mut old) } != 0 {
            return libc::SIG_ERR;
        }
        return old.sa_sigaction;
    }
    // SAFETY: the caller's guarantee.
    let previous = unsafe { install(signal, disposition, 0, false) };
    if previous == libc::SIG_ERR {
        return libc::SIG_ERR;
    }
    match change_mask(libc::SIG_UNBLOCK, signal) {
        Some(true) => SIG_HOLD,
        Some(false) => previous,
        None => libc::SIG_ERR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn quiet(_: c_int) {}

    extern "C" {
        fn __sysv_signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
        fn sigset(signal: c_int, disposition: libc::sighandler_t) -> libc::sighandler_t;
    }

    /// The action as the host sees it (its own handler, never ward's entry).
    fn action(signal: c_int) -> (libc::sighandler_t, c_int, bool, bool) {
        let mut now = empty_action();
        // SAFETY: a query into memory we own.
        assert_eq!(unsafe { host_sigaction(signal, ptr::null(), &mut now) }, 0);
        // Only the flags these functions set: the kernel adds SA_RESTORER, and ward's wrapping SA_SIGINFO.
        let flags = now.sa_flags & (libc::SA_RESTART | libc::SA_RESETHAND | libc::SA_NODEFER);
        // SAFETY: a valid set from the query.
        let masks = |s: c_int| unsafe { libc::sigismember(&now.sa_mask, s) == 1 };
        (now.sa_sigaction, flags, masks(signal), masks(libc::SIGTERM))
    }

    /// Each of ward's functions leaves the action glibc's own leaves, compared on two signals no other test uses.
    #[test]
    fn the_older_ways_of_installing_a_handler_mean_what_glibcs_mean() {
        let (ours, glibcs) = (libc::SIGRTMIN() + 13, libc::SIGRTMIN() + 14);
        let handler = quiet as *const () as libc::sighandler_t;
        // SAFETY: the handler follows the C ABI and does nothing; the signals are sent by no one.
        unsafe {
            assert_eq!(host_sysv_signal(ours, handler), libc::SIG_DFL);
            __sysv_signal(glibcs, handler);
        }
        assert_eq!(action(ours), action(glibcs));
        assert_eq!(action(ours).1, libc::SA_RESETHAND | libc::SA_NODEFER);
        // SAFETY: as above.
        unsafe {
            assert_eq!(host_signal(ours, handler), handler);
            libc::signal(glibcs, handler);
        }
        assert_eq!(action(ours), action(glibcs));
        assert_eq!(action(ours).1, libc::SA_RESTART);
        // sigset: SIG_HOLD blocks and keeps the action; a handler unblocks and says the signal was held.
        // SAFETY: as above; the signals are blocked on this thread only while the test runs.
        unsafe {
            assert_eq!(host_sigset(ours, SIG_HOLD), handler, "the previous handler");
            assert_eq!(sigset(glibcs, SIG_HOLD), handler);
            assert_eq!(change_mask(libc::SIG_BLOCK, ours), Some(true), "held");
            assert_eq!(host_sigset(ours, SIG_HOLD), SIG_HOLD, "already held");
            assert_eq!(host_sigset(ours, handler), SIG_HOLD, "was held");
            assert_eq!(sigset(glibcs, handler), SIG_HOLD);
        }
        assert_eq!(change_mask(libc::SIG_UNBLOCK, ours), Some(false), "unblocked again");
        assert_eq!(change_mask(libc::SIG_UNBLOCK, glibcs), Some(false));
        assert_eq!(action(ours), action(glibcs));
        // Bad numbers fail with EINVAL, as glibc's do.
        // SAFETY: nothing is installed for them.
        unsafe {
            assert_eq!(host_sysv_signal(0, handler), libc::SIG_ERR);
            assert_eq!(host_sigset(libc::SIGRTMAX() + 1, handler), libc::SIG_ERR);
        }
        // SAFETY: back to the default for signals no one sends.
        unsafe {
            host_signal(ours, libc::SIG_DFL);
            libc::signal(glibcs, libc::SIG_DFL);
        }
    }

    /// With ward's handlers in (under PKU), a handler installed the older ways is wrapped, as one installed with
    /// `sigaction` is.
    #[test]
    #[ignore = "needs PKU"]
    fn a_handler_installed_the_older_ways_is_wrapped_once_wards_handlers_are_in() {
        super::super::require_pku();
        super::super::gate::signal_key().expect("ward's handlers");
        let handler = quiet as *const () as libc::sighandler_t;
        let wrapped = super::super::gate::host_signal_entry();
        for (i, install) in [host_signal, host_sysv_signal, host_sigset].into_iter().enumerate() {
            let signal = libc::SIGRTMIN() + 15 + i as c_int;
            // SAFETY: the handler does nothing; no one sends the signal.
            unsafe { install(signal, handler) };
            let mut kernels = empty_action();
            // SAFETY: a query straight to the kernel, past ward.
            unsafe { libc::syscall(libc::SYS_rt_sigaction, signal, ptr::null::<u8>(), &mut kernels, 8) };
            assert_eq!(kernels.sa_sigaction, wrapped, "signal {signal}: wrapped");
            assert_eq!(action(signal).0, handler, "signal {signal}: the host sees its own handler");
            // SAFETY: back to the default.
            unsafe { host_signal(signal, libc::SIG_DFL) };
        }
    }
}
