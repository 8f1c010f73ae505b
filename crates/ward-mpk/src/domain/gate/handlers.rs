//! ward's fault handlers: installing them with the signal key, readying a thread for gate calls (its alternate
//! signal stack), taking a signal that is a domain's, and passing every other one on to the handler the host had
//! installed.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::io;
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::OnceLock;

use super::assembly::{ward_mpk_end, ward_mpk_gate_resume, ward_mpk_refuse, ward_mpk_signal_entry};
use super::host_signals::adopt_host_handlers;
use super::{allow_on_this_thread, Caught, SignalFault, Trap, ACTIVE};
use crate::domain::memory::KeyedRegion;
use crate::domain::pku::{self, Pkru, ProtectionKey};
use crate::domain::{thread_block, watchdog};

/// PKRU the signal handler runs with: key 0 and the signal key allowed (set once, before any handler is installed).
pub(super) static HANDLER_PKRU: AtomicU32 = AtomicU32::new(0x5555_5554);

/// The signals a domain's fault raises.
const FAULT_SIGNALS: [libc::c_int; 5] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP];

/// The signal the watchdog sends a thread past its deadline: a real-time signal near the top, clear of glibc's own
/// (at the bottom of the range) and of the ones programs usually pick (`SIGRTMIN + n`). One a host sends itself
/// (anything but the watchdog's queued signal, see `watchdog::from_watchdog`) is passed on to the host's handler.
pub fn timeout_signal() -> libc::c_int {
    libc::SIGRTMAX() - 2
}

/// Every signal ward handles: the fault signals, then the timeout signal.
pub(super) fn handled_signals() -> [libc::c_int; FAULT_SIGNALS.len() + 1] {
    let [a, b, c, d, e] = FAULT_SIGNALS;
    [a, b, c, d, e, timeout_signal()]
}

/// ward's handlers are installed, with this signal key. (What the host had installed before is in
/// [`HOST_ACTIONS`].)
struct Installed {
    signal_key: ProtectionKey,
}

static INSTALLED: OnceLock<Result<Installed, i32>> = OnceLock::new();

thread_local! {
    /// This thread's alternate signal stack, tagged with the signal key (made on its first gate call).
    static ALT_STACK: RefCell<Option<AltStack>> = const { RefCell::new(None) };
}

/// Bytes of a thread's alternate signal stack: the signal frame (with the XSAVE area) and the handler.
const ALT_STACK_BYTES: usize = 64 * 1024;

/// A thread's alternate signal stack, unregistered and unmapped when the thread ends.
struct AltStack {
    /// Held for its mapping, unmapped after the drop below unregisters it.
    _mapping: KeyedRegion,
}

impl Drop for AltStack {
    fn drop(&mut self) {
        let disable = libc::stack_t { ss_sp: ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
        // SAFETY: this runs on the thread that registered the stack, as it ends; after SS_DISABLE no signal is
        // delivered on it, so unmapping it (the region's drop, next) is safe.
        unsafe { libc::sigaltstack(&disable, ptr::null_mut()) };
    }
}

/// Whether ward's handlers are installed (the first gate call, or a domain's load, installs them).
pub(super) fn handlers_installed() -> bool {
    matches!(INSTALLED.get(), Some(Ok(_)))
}

/// The process-wide signal key (allocated, and the handlers installed, on first use).
pub fn signal_key() -> io::Result<u32> {
    match INSTALLED.get_or_init(install_handlers) {
        Ok(installed) => Ok(installed.signal_key.number()),
        Err(errno) => Err(io::Error::from_raw_os_error(*errno)),
    }
}

/// Allocate the signal key and install the fault handlers, remembering the host's.
fn install_handlers() -> Result<Installed, i32> {
    thread_block::choose_secret();
    let signal_key = ProtectionKey::allocate().map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
    HANDLER_PKRU.store(Pkru::DENY_ALL.allow(pku::HOST_KEY).allow(signal_key.number()).0, Ordering::SeqCst);
    // SAFETY: all-zero is a valid sigaction (no handler, empty mask, no flags); each is overwritten below.
    let mut previous: [libc::sigaction; FAULT_SIGNALS.len() + 1] = unsafe { MaybeUninit::zeroed().assume_init() };
    let signals = handled_signals();
    let action = wards_action();
    for (i, signal) in signals.iter().enumerate() {
        // SAFETY: sigaction installs a handler that follows the C signal handler ABI (the entry stub, then
        // `on_signal`) and stores the old action in memory we own.
        let r = unsafe { real_sigaction(*signal, &action, &mut previous[i]) };
        if r != 0 {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
            // Put back what was there: no handler of ward's stays installed without its signal key.
            for (signal, old) in signals.iter().zip(&previous).take(i) {
                // SAFETY: `old` is what sigaction reported for that signal a moment ago.
                unsafe { real_sigaction(*signal, old, ptr::null_mut()) };
            }
            return Err(errno);
        }
    }
    for (signal, previous) in signals.iter().zip(previous) {
        remember_host_action(*signal, Some(previous));
    }
    Ok(Installed { signal_key })
}

/// ward's action for each of [`handled_signals`].
pub(super) fn wards_action() -> libc::sigaction {
    // SAFETY: all-zero is a valid sigaction (no handler, empty mask, no flags).
    let mut action: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
    action.sa_sigaction = ward_mpk_signal_entry as *const () as usize;
    // SA_RESTART: the watchdog's signal may reach host code a late domain called out to; most of its system
    // calls then go on (those the kernel never restarts, such as poll, select and nanosleep, fail with EINTR,
    // as after any handled signal). Every signal is blocked while the handler runs: one delivered on top of it
    // before its first instructions have given it the signal key would have its frame written to the
    // alternate stack, tagged with that key, under the PKRU the kernel starts handlers with, which denies it,
    // and a kernel that writes frames under the thread's PKRU (the emulated machine's 6.1 does) then ends the
    // process with SIGSEGV. The watchdog's signal, queued every tick for a late thread, made that happen in
    // about half the runs of a test. `chain` gives a host's handler the mask it asked for.
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    // SAFETY: sa_mask is a valid sigset to fill.
    unsafe { libc::sigfillset(&mut action.sa_mask) };
    action
}

/// Ready this thread for gate calls: the handlers installed, an alternate signal stack tagged with the signal key,
/// this thread's host PKRU allowing the signal key (so a host fault here can still be delivered), and the timeout
/// signal unblocked (hosts often block every signal on their worker threads, and a deadline has to reach them).
/// Cheap after the first time on a thread.
pub(super) fn prepare_thread() -> io::Result<()> {
    if ALT_STACK.with(|s| s.borrow().is_some()) {
        return Ok(());
    }
    let key = signal_key()?;
    adopt_host_handlers();
    unregister_rseq()?;
    let region = KeyedRegion::new(ALT_STACK_BYTES, key)?;
    let stack = libc::stack_t { ss_sp: region.start().cast(), ss_flags: 0, ss_size: region.len() };
    allow_on_this_thread(key);
    // SAFETY: the stack is a live mapping this thread keeps (ALT_STACK) until it ends, when AltStack's drop
    // unregisters it before unmapping it.
    if unsafe { libc::sigaltstack(&stack, ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    ALT_STACK.with(|s| *s.borrow_mut() = Some(AltStack { _mapping: region }));
    // SAFETY: unblocking one signal on this thread, whose handler (ward's) is installed, with a valid set.
    unsafe {
        let mut timeout = MaybeUninit::<libc::sigset_t>::zeroed().assume_init();
        libc::sigemptyset(&mut timeout);
        libc::sigaddset(&mut timeout, timeout_signal());
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &timeout, ptr::null_mut());
    }
    Ok(())
}

/// The signature glibc registers its rseq areas with on x86.
const RSEQ_SIG: u32 = 0x5305_3053;
const RSEQ_FLAG_UNREGISTER: u64 = 1;

/// Take this thread's restartable-sequences area away from the kernel.
///
/// glibc registers one per thread, inside the thread's control block (host memory, key 0), and the kernel writes
/// it whenever it delivers a signal to the thread or returns to it after moving it to another CPU, with the PKRU
/// of the code it interrupted. Inside a domain that PKRU forbids writing key 0: the write fails and the kernel
/// kills the process with SIGSEGV. Unregistered, the kernel leaves the area alone; glibc only reads it to answer
/// `sched_getcpu`, and falls back to the system call once the kernel marks it unregistered.
fn unregister_rseq() -> io::Result<()> {
    let Some((offset, size)) = thread_block::rseq_area() else {
        return Ok(());
    };
    let area = thread_block::host_thread_pointer().wrapping_add_signed(offset);
    // A thread may have none: glibc registers a new thread's area only when the thread that created it had one,
    // and a thread that has called a domain has given its own up. Its `cpu_id` (the second word) is then negative.
    // SAFETY: the area lies in this thread's control block, host memory this thread reads.
    let cpu_id = unsafe { ((area + 4) as *const i32).read_volatile() };
    if cpu_id < 0 {
        return Ok(());
    }
    // The kernel wants the length registered: 32 bytes for every glibc so far, `__rseq_size` if a later one differs.
    let mut last = io::Error::from_raw_os_error(libc::EINVAL);
    for len in [32, size] {
        // SAFETY: unregistering this thread's own area only stops the kernel writing it; nothing reads it but
        // glibc, which copes (see above).
        let r = unsafe { libc::syscall(libc::SYS_rseq, area, len, RSEQ_FLAG_UNREGISTER, RSEQ_SIG) };
        if r == 0 {
            return Ok(());
        }
        last = io::Error::last_os_error();
    }
    Err(last)
}

/// The Rust half of the fault handler (after `ward_mpk_signal_entry`).
pub(super) extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let frame = ACTIVE.with(Cell::get);
    // SAFETY: the kernel passes a valid siginfo.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // SAFETY: a non-null ACTIVE is this thread's live activation (see `call`), in host memory.
    let (inside, outside) = unsafe { frame.as_ref().map_or((false, false), |f| (f.inside != 0, f.outside != 0)) };
    let ours = if signal == timeout_signal() {
        // SAFETY: the kernel passes a valid siginfo.
        let queued = unsafe { &*info };
        if watchdog::is_eviction(queued) {
            // A closing thread's: this call's domain was closed while it ran (see `Occupancy`). One that finds the
            // thread in another domain's call, or out in the host, is not for it: dropped.
            // SAFETY: a non-null ACTIVE is this thread's live activation; its epoch word outlives it (the domain's,
            // held by the caller of `call`, or NEVER_CLOSED).
            let closed =
                unsafe { frame.as_ref() }.is_some_and(|f| unsafe { (*f.epoch_at).load(Ordering::SeqCst) } != f.epoch);
            inside && !outside && closed
        } else if watchdog::from_watchdog(queued) {
            watchdog::heard();
            // The watchdog's. While the domain is calling the host, the host's code is not interrupted; the domain
            // is, once it is back (the watchdog sends the signal again every tick while the deadline stays passed).
            // One that arrives after its call is over, or early for the next call, is stale: dropped.
            inside && !outside && watchdog::passed()
        } else {
            // Sent by someone else, the host itself included: not ward's.
            chain(signal, info, context);
            return;
        }
    } else {
        // Raised by the processor (code > 0) in the domain's span of its gate call.
        code > 0 && inside && !outside
    };
    if !ours {
        if signal != timeout_signal() {
            chain(signal, info, context);
        }
        return;
    }
    let uc = context.cast::<libc::ucontext_t>();
    // SAFETY: the kernel passes this thread's interrupted context; `frame` is this thread's live activation, in
    // host memory the handler may write, and the interrupted code lies in the span the gate marked inside, where
    // its resume path is safe to take.
    unsafe {
        let gregs = &mut (*uc).uc_mcontext.gregs;
        let pc = gregs[libc::REG_RIP as usize] as usize;
        // A trap at one of ward's two known addresses carries its words in the first two argument registers.
        let arguments = (gregs[libc::REG_RDI as usize] as u64, gregs[libc::REG_RSI as usize] as u64);
        let trapped_at = |at: usize| signal == libc::SIGILL && pc == at;
        let trap = if trapped_at(ward_mpk_refuse as *const () as usize) {
            Trap::Refusal { slot: arguments.0 as usize, code: arguments.1 }
        } else if trapped_at(ward_mpk_end as *const () as usize) {
            Trap::Ending { kind: arguments.0, status: arguments.1 }
        } else {
            Trap::None
        };
        (*frame).fault = Caught { signal: SignalFault { signal, code, addr, pc }, trap };
        gregs[libc::REG_RIP as usize] = ward_mpk_gate_resume as *const () as i64;
        gregs[libc::REG_RBX as usize] = frame as i64;
    }
}

/// Hand a signal that is not a domain's to what the host had installed.
pub(super) fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    if let Some(host) = host_action(signal) {
        run_host_action(&host, signal, info, context);
    }
}

/// Do what the host's `previous` action for `signal` says, from inside a handler of ward's.
pub(super) fn run_host_action(
    previous: &libc::sigaction,
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut c_void,
) {
    if previous.sa_flags & libc::SA_RESETHAND != 0 {
        // As the kernel does for the host's own handler: the next such signal gets the default action.
        if let Some(cell) = host_action_cell(signal) {
            cell.store(ptr::addr_of!(DEFAULT_ACTION).cast_mut(), Ordering::Release);
        }
    }
    match previous.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // The default action (end the process, with a core where the signal has one), as without ward.
            // SAFETY: restoring the default disposition and re-raising is async-signal-safe; all-zero is a valid
            // sigaction (SIG_DFL, empty mask, no flags).
            unsafe {
                let default: libc::sigaction = MaybeUninit::zeroed().assume_init();
                real_sigaction(signal, &default, ptr::null_mut());
                libc::raise(signal);
            }
        }
        handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            unblock_as_the_host_asked(signal, previous, context);
            // SAFETY: the host installed this address as an SA_SIGINFO handler for this signal.
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(handler) };
            handler(signal, info, context);
        }
        handler => {
            unblock_as_the_host_asked(signal, previous, context);
            // SAFETY: the host installed this address as a plain handler for this signal.
            let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            handler(signal);
        }
    }
}

/// The signal mask the kernel would have given the host's own handler: the interrupted code's, plus the handler's
/// `sa_mask`, plus the signal itself unless `SA_NODEFER`. (Returning from ward's handler restores the interrupted
/// code's mask whatever this sets.)
fn unblock_as_the_host_asked(signal: libc::c_int, previous: &libc::sigaction, context: *mut c_void) {
    let uc = context.cast::<libc::ucontext_t>();
    // SAFETY: the kernel passed this thread's interrupted context; sigset operations on valid sets and
    // pthread_sigmask are async-signal-safe.
    unsafe {
        let mut mask = (*uc).uc_sigmask;
        for other in 1..=libc::SIGRTMAX() {
            if libc::sigismember(&previous.sa_mask, other) == 1 {
                libc::sigaddset(&mut mask, other);
            }
        }
        if previous.sa_flags & libc::SA_NODEFER == 0 {
            libc::sigaddset(&mut mask, signal);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, ptr::null_mut());
    }
}

/// The host's own action for each signal ward has taken over, by signal number (null: not taken over): those it
/// handles, and those whose host handler it wraps. An entry is replaced, never freed, so a handler can read it
/// without a lock: hosts change their handlers a handful of times.
static HOST_ACTIONS: [AtomicPtr<libc::sigaction>; 65] = [const { AtomicPtr::new(ptr::null_mut()) }; 65];

/// The default action (SIG_DFL, empty mask, no flags), for a host action that asked to be reset once it has run.
/// Never written.
// SAFETY: all-zero is a valid sigaction.
static DEFAULT_ACTION: libc::sigaction = unsafe { std::mem::zeroed() };

/// The entry of [`HOST_ACTIONS`] for `signal`, if it is a signal number.
fn host_action_cell(signal: libc::c_int) -> Option<&'static AtomicPtr<libc::sigaction>> {
    HOST_ACTIONS.get(usize::try_from(signal).ok()?)
}

/// The host's action for `signal`, if ward has taken the signal over. Async-signal-safe.
pub(super) fn host_action(signal: libc::c_int) -> Option<libc::sigaction> {
    let cell = host_action_cell(signal)?;
    // SAFETY: non-null entries are leaked boxes that are never freed (see HOST_ACTIONS).
    unsafe { cell.load(Ordering::Acquire).as_ref() }.copied()
}

/// Records `action` as the host's for `signal` (None: ward no longer has the signal).
pub(super) fn remember_host_action(signal: libc::c_int, action: Option<libc::sigaction>) {
    if let Some(cell) = host_action_cell(signal) {
        cell.store(action.map_or(ptr::null_mut(), |a| Box::into_raw(Box::new(a))), Ordering::Release);
    }
}

extern "C" {
    /// glibc's `sigaction` under its other exported name, which a host's (or ward-preload's) `sigaction` does not
    /// interpose: ward's own changes must reach the kernel.
    fn __sigaction(signal: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int;
}

/// `sigaction` itself, past any interposer.
///
/// # Safety
/// As `sigaction`'s: `act` and `old` are null or valid, and a handler installed follows the C signal handler ABI.
pub(super) unsafe fn real_sigaction(
    signal: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    // SAFETY: `act` and `old` are null or valid and a handler follows the C signal handler ABI (this function's
    // contract).
    unsafe { __sigaction(signal, act, old) }
}
