//! Signal dispositions as a host sees them in a process with mpk domains: what `ward-preload` puts in place of
//! libc's `sigaction` ([`host_sigaction`]) and of the older ways a host installs a handler (`signal`,
//! `sysv_signal`, `sigset`, each with glibc's meaning, built on it), and the wrapping of every host handler so that
//! it runs with the host's rights wherever its signal finds the thread ([`adopt_host_handlers`]). A program
//! compiled for strict ISO C calls `__sysv_signal` when its source says `signal`; System V code calls `sigset`.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::ptr;

use super::assembly::{ward_mpk_host_signal_entry, ward_mpk_signal_entry};
use super::handlers::{
    handled_signals, handlers_installed, host_action, real_sigaction, remember_host_action, run_host_action,
    wards_action,
};
use super::ACTIVE;
use crate::domain::runtime::set_errno;

/// The entry ward wraps host handlers in (what the kernel has installed for a wrapped signal).
#[cfg(test)]
pub fn host_signal_entry() -> libc::sighandler_t {
    ward_mpk_host_signal_entry as *const () as libc::sighandler_t
}

/// `sigaction` as the host sees it once ward's handlers are in (what ward-preload's `sigaction` calls): for a
/// signal ward handles, the host's action is recorded for ward to chain to and ward's handler stays; a host handler
/// for any other signal is wrapped ([`adopt_host_handlers`]); either way `old` reports the host's own previous
/// action, never ward's. Before ward's handlers are in, and for SIGKILL and SIGSTOP, it is plain `sigaction`.
///
/// # Safety
/// As `sigaction`'s.
pub unsafe fn host_sigaction(
    signal: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    let taken_over = handlers_installed()
        && signal != libc::SIGKILL
        && signal != libc::SIGSTOP
        && signal != GLIBC_SETXID
        && (1..=libc::SIGRTMAX()).contains(&signal);
    if !taken_over {
        // SAFETY: `act` and `old` are null or valid and a handler follows the C signal handler ABI: this function's
        // contract, which is `sigaction`'s.
        return unsafe { real_sigaction(signal, act, old) };
    }
    let previous = match host_action(signal) {
        Some(previous) => previous,
        None => {
            // SAFETY: all-zero is a valid sigaction, overwritten by the query.
            let mut current: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
            // SAFETY: a query into memory we own.
            if unsafe { real_sigaction(signal, ptr::null(), &mut current) } != 0 {
                return -1;
            }
            current
        }
    };
    // SAFETY: the caller passes null or a valid action.
    if let Some(act) = unsafe { act.as_ref() } {
        let handler = act.sa_sigaction;
        if handled_signals().contains(&signal) {
            remember_host_action(signal, Some(*act));
        } else if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            // SAFETY: `act` is valid (this function's contract) and its handler is SIG_DFL or SIG_IGN.
            if unsafe { real_sigaction(signal, act, ptr::null_mut()) } != 0 {
                return -1;
            }
            remember_host_action(signal, None);
        } else {
            wrap_host_action(signal, act);
        }
    }
    // SAFETY: the caller passes null or memory for one sigaction.
    if let Some(old) = unsafe { old.as_mut() } {
        *old = previous;
    }
    0
}

/// Wraps every handler the host has installed for a signal ward does not handle, so that it runs with the host's
/// rights wherever the signal finds the thread; and puts ward's own handler back where the host replaced it, passing
/// the host's signals on to the host's (a domain's faults would otherwise reach the host's handler).
///
/// The kernel starts a handler with its initial PKRU, which allows key 0 only. A host handler that the signal finds
/// inside a domain would run on the domain's stack, which that PKRU denies; one installed with `SA_ONSTACK` runs on
/// ward's alternate stack, tagged with the signal key, which it denies too. Either way its first push faults and
/// the process dies (or, on kernels that write signal frames with every key allowed, the fault is taken for the
/// domain's). Wrapped, the signal goes to ward's alternate stack (written under the interrupted code's PKRU, which
/// allows the signal key in the host and in every domain); ward's entry allows every key, marks the thread outside
/// its domain (a fault in the host's handler is the host's, and the watchdog leaves it alone) and runs the host's
/// action with the mask it asked for. `sigaction` then reports ward's entry for those signals; a handler the host
/// installs later is wrapped at the next domain load or the next thread's first gate call, or at once when it goes
/// through `ward-preload`'s `sigaction`. glibc's own two signals cannot be changed through `sigaction`; its set-id
/// signal is wrapped past it ([`adopt_glibc_setxid_handler`]), its cancellation signal stays as it is.
pub fn adopt_host_handlers() {
    if !handlers_installed() {
        return;
    }
    adopt_glibc_setxid_handler();
    for signal in 1..=libc::SIGRTMAX() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: all-zero is a valid sigaction, overwritten by the query.
        let mut current: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
        // SAFETY: querying the action only, into memory we own.
        if unsafe { real_sigaction(signal, ptr::null(), &mut current) } != 0 {
            continue;
        }
        let handler = current.sa_sigaction;
        if handled_signals().contains(&signal) {
            if handler != ward_mpk_signal_entry as *const () as usize {
                // The host put its own in ward's place: ward's goes back, and passes the host's signals to it.
                remember_host_action(signal, Some(current));
                // SAFETY: ward's action, as `install` made it.
                unsafe { real_sigaction(signal, &wards_action(), ptr::null_mut()) };
            }
            continue;
        }
        if handler == libc::SIG_DFL
            || handler == libc::SIG_IGN
            || handler == ward_mpk_host_signal_entry as *const () as usize
        {
            continue;
        }
        wrap_host_action(signal, &current);
    }
}

/// glibc's set-id signal (the kernel's first real-time signal plus one): `setuid` and its kind in a multithreaded
/// process send it to every other thread, whose handler makes the same change for itself and counts down. The caller
/// waits until all have.
pub(super) const GLIBC_SETXID: libc::c_int = 33;

/// The kernel's form of a signal action (`rt_sigaction`), which glibc's `sigaction` hides.
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelAction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// `rt_sigaction` itself, for the signals glibc's `sigaction` refuses.
///
/// # Safety
/// As `sigaction`'s: `act` and `old` are null or valid, and a handler installed follows the C signal handler ABI
/// and returns through `act.restorer`.
unsafe fn kernel_sigaction(signal: libc::c_int, act: *const KernelAction, old: *mut KernelAction) -> libc::c_long {
    // SAFETY: `act` and `old` are null or valid, a handler follows the C ABI and returns through its restorer (this
    // function's contract); the set size is the kernel's (64 signals).
    unsafe { libc::syscall(libc::SYS_rt_sigaction, signal, act, old, 8usize) }
}

/// Wraps glibc's handler of its set-id signal as [`wrap_host_action`] wraps a host's. A thread that `setuid` finds
/// inside a domain would otherwise run that handler on the domain's stack with the kernel's initial PKRU, and
/// through the domain's FS base: its first push faults, the fault is taken for the domain's, the handler never
/// counts down, and `setuid` waits for ever. Wrapped, it runs on ward's alternate stack with the host's rights and
/// thread pointer, as anywhere in the host.
fn adopt_glibc_setxid_handler() {
    let signal = GLIBC_SETXID;
    if signal >= libc::SIGRTMIN() {
        // Not glibc's reserved signal on this libc.
        return;
    }
    let mut current = KernelAction { handler: 0, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: a query into memory we own.
    if unsafe { kernel_sigaction(signal, ptr::null(), &mut current) } != 0 {
        return;
    }
    let entry = ward_mpk_host_signal_entry as *const () as usize;
    if current.handler == libc::SIG_DFL || current.handler == libc::SIG_IGN || current.handler == entry {
        return;
    }
    // SAFETY: all-zero is a valid sigaction; sigemptyset and sigaddset write into it.
    let mut glibcs: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
    glibcs.sa_sigaction = current.handler;
    glibcs.sa_flags = current.flags as libc::c_int;
    // SAFETY: sa_mask is a valid set.
    unsafe { libc::sigemptyset(&mut glibcs.sa_mask) };
    for other in 1..=64 {
        if current.mask & (1u64 << (other - 1)) != 0 {
            // SAFETY: sa_mask is a valid set and `other` a signal number. glibc's sigaddset refuses its own two
            // signals, so they stay out; a second set-id signal cannot come while this one is handled (the caller holds
            // glibc's lock until all have counted).
            unsafe { libc::sigaddset(&mut glibcs.sa_mask, other) };
        }
    }
    remember_host_action(signal, Some(glibcs));
    let flags = wrapped_flags(current.flags as libc::c_int) as u64;
    // Every signal blocked until the entry has allowed the keys, as for every wrapped handler; glibc's restorer kept.
    let wrapped = KernelAction { handler: entry, flags, restorer: current.restorer, mask: u64::MAX };
    // SAFETY: the entry follows the C signal handler ABI and returns through glibc's own restorer, which the kernel
    // reported for glibc's action; glibc's action is remembered above for the entry to run.
    unsafe { kernel_sigaction(signal, &wrapped, ptr::null_mut()) };
}

/// Installs ward's entry for `signal` in place of the host's `host` action, which it remembers and runs.
fn wrap_host_action(signal: libc::c_int, host: &libc::sigaction) {
    remember_host_action(signal, Some(*host));
    let mut action = *host;
    action.sa_sigaction = ward_mpk_host_signal_entry as *const () as usize;
    action.sa_flags = wrapped_flags(host.sa_flags);
    // SAFETY: sa_mask is a valid set to fill; the entry follows the C signal handler ABI (the stub, then
    // `on_host_signal`), and the host's action it replaces is remembered above.
    unsafe {
        libc::sigfillset(&mut action.sa_mask);
        real_sigaction(signal, &action, ptr::null_mut());
    }
}

/// The flags of ward's entry wrapping a handler installed with `flags`. The handler's own (SA_RESTART,
/// SA_RESETHAND, SA_NOCLDSTOP, ...) stand; the entry takes siginfo and ward's alternate stack, and never runs with
/// its signal unblocked: with a full mask, nothing interrupts it before it has allowed the keys, for the reason
/// `install` gives (`run_host_action` then applies the handler's own mask).
fn wrapped_flags(flags: libc::c_int) -> libc::c_int {
    (flags | libc::SA_SIGINFO | libc::SA_ONSTACK) & !libc::SA_NODEFER
}

/// The Rust half of a wrapped host handler (after `ward_mpk_host_signal_entry`, with every key allowed).
pub(super) extern "C" fn on_host_signal(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let Some(host) = host_action(signal) else {
        return;
    };
    let frame = ACTIVE.with(Cell::get);
    // SAFETY: a non-null ACTIVE is this thread's live activation, in host memory; only this thread writes it, and
    // the code the signal interrupted is suspended until this handler returns.
    let was_outside = unsafe { frame.as_mut().map(|f| std::mem::replace(&mut f.outside, 1)) };
    run_host_action(&host, signal, info, context);
    if let Some(outside) = was_outside {
        // SAFETY: `frame`, non-null here, is this thread's live activation, in host memory; only this thread writes
        // it.
        unsafe { (*frame).outside = outside };
    }
}

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
unsafe fn install_disposition(
    signal: c_int,
    handler: libc::sighandler_t,
    flags: c_int,
    mask_self: bool,
) -> libc::sighandler_t {
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
    // SAFETY: `handler` is SIG_DFL, SIG_IGN or a C signal handler (this function's contract).
    unsafe { install_disposition(signal, handler, libc::SA_RESTART, true) }
}

/// glibc's `sysv_signal` (`__sysv_signal`): the handler is reset to the default as it starts, the signal is not
/// blocked while it runs, and interrupted system calls fail with EINTR.
///
/// # Safety
/// As for [`host_signal`].
pub unsafe fn host_sysv_signal(signal: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: `handler` is SIG_DFL, SIG_IGN or a C signal handler (this function's contract).
    unsafe { install_disposition(signal, handler, libc::SA_RESETHAND | libc::SA_NODEFER, false) }
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
    // SAFETY: `disposition`, not SIG_HOLD here, is SIG_DFL, SIG_IGN or a C signal handler (this function's
    // contract).
    let previous = unsafe { install_disposition(signal, disposition, 0, false) };
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
        // SAFETY: the handler follows the C ABI and does nothing; the signals are sent by no one.
        unsafe {
            assert_eq!(host_signal(ours, handler), handler);
            libc::signal(glibcs, handler);
        }
        assert_eq!(action(ours), action(glibcs));
        assert_eq!(action(ours).1, libc::SA_RESTART);
        // sigset: SIG_HOLD blocks and keeps the action; a handler unblocks and says the signal was held.
        // SAFETY: the handler follows the C ABI and does nothing; the signals are sent by no one, and blocked on this
        // thread only while the test runs.
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
        crate::domain::require_pku();
        crate::domain::gate::signal_key().expect("ward's handlers");
        let handler = quiet as *const () as libc::sighandler_t;
        let wrapped = host_signal_entry();
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
