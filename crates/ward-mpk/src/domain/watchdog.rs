//! Call deadlines for threads inside mpk domains, kept by one watchdog thread (DESIGN.md §7: kernel plugins' time
//! quantum).
//!
//! A call with a deadline stores, in its thread's slot, the time by which it must be back; the watchdog looks at
//! every slot each millisecond and sends a late thread the gate's timeout signal, again each tick until the call is
//! over. Arming is a clock read (through the vDSO) and a store, disarming a store: no system call. The signal comes
//! after the deadline, never before it: up to a tick later, plus however long the watchdog waits for a processor.
//! It can arrive after its call is over: the handler asks [`passed`] before it acts on one.
//!
//! The watchdog queues at most one signal per thread at a time (the handler's [`heard`] lets it send the next), so
//! a late thread that has the signal blocked cannot fill the process's queue of pending signals. Each signal carries
//! a value only this process's watchdog knows ([`from_watchdog`]): one that a host sends itself, of the same number,
//! goes on to the host's handler.
//!
//! With no deadline armed for a second the watchdog slows to a tick every 50 ms; the next call to arm one wakes it.

use std::cell::{Cell, RefCell};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::thread::Thread;
use std::time::Duration;

/// How often the watchdog looks while any deadline is armed.
const TICK: Duration = Duration::from_millis(1);
/// How often it looks when none has been armed for [`IDLE_TICKS`] ticks.
const SLOW_TICK: Duration = Duration::from_millis(50);
const IDLE_TICKS: u32 = 1000;

/// One thread's deadline: monotonic nanoseconds (see [`now_ns`]), 0 when none is armed. Only its thread writes it.
struct Slot {
    tid: libc::pid_t,
    deadline_ns: AtomicU64,
    /// A timeout signal is queued for the thread and its handler has not run yet: the watchdog sends no other.
    signal_queued: AtomicBool,
}

impl Slot {
    fn new(tid: libc::pid_t, deadline_ns: u64) -> Slot {
        Slot { tid, deadline_ns: AtomicU64::new(deadline_ns), signal_queued: AtomicBool::new(false) }
    }
}

/// Every thread that has armed a deadline, for the watchdog to look at.
static SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());
/// The watchdog thread, once started (in this process: a fork's child starts its own).
static WATCHDOG: Mutex<Option<Thread>> = Mutex::new(None);
/// True while the watchdog ticks every [`TICK`]; when false, arming a deadline wakes it.
static FAST: AtomicBool = AtomicBool::new(false);
/// Some deadline was armed since the watchdog's last look (a call shorter than a tick leaves no other trace).
static ARMED_SINCE_LAST_LOOK: AtomicBool = AtomicBool::new(false);
/// The value the watchdog's signals carry (0 until the watchdog first starts).
static SIGNAL_COOKIE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's slot (null until its first deadline), as the arming code and the signal handler read it.
    static SLOT: Cell<*const Slot> = const { Cell::new(std::ptr::null()) };
    /// The same slot, taken off the watchdog's list when the thread ends.
    static SLOT_OWNER: RefCell<Option<Registered>> = const { RefCell::new(None) };
    /// The locks [`before_fork`] took, held across a `fork` by the thread that makes it.
    static FORK_LOCKS: RefCell<Option<ForkLocks>> = const { RefCell::new(None) };
}

/// A thread's slot on the watchdog's list.
struct Registered(Arc<Slot>);

impl Drop for Registered {
    fn drop(&mut self) {
        SLOT.with(|s| s.set(std::ptr::null()));
        let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|s| !Arc::ptr_eq(s, &self.0));
    }
}

/// Monotonic nanoseconds (`CLOCK_MONOTONIC`, through the vDSO: no system call). Async-signal-safe.
fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is valid for the call; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// This thread's slot, or None before its first deadline.
///
/// The reference must not be kept past the function that asked for it: the slot is freed when the thread ends (its
/// `Registered` nulls [`SLOT`] first) and replaced in a fork's child (`after_fork_in_child`, which points SLOT at the
/// new one), neither of which can happen while this thread is inside one of this module's functions.
fn this_threads_slot<'a>() -> Option<&'a Slot> {
    let at = SLOT.with(Cell::get);
    // SAFETY: a non-null SLOT points into the Arc that SLOT_OWNER keeps; see above for how long.
    unsafe { at.as_ref() }
}

/// This thread's slot, registered (and the watchdog's fork handlers installed) on first use.
fn slot<'a>() -> &'a Slot {
    if let Some(slot) = this_threads_slot() {
        return slot;
    }
    static AT_FORK: Once = Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: the three handlers take and release this module's locks and, in the child, allocate one slot;
        // they run in the forking thread, outside any signal handler, where both are allowed (glibc makes malloc
        // usable in the child of a multithreaded parent).
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child)) };
    });
    // SAFETY: gettid has no preconditions.
    let slot = Arc::new(Slot::new(unsafe { libc::gettid() }, 0));
    SLOTS.lock().unwrap_or_else(|e| e.into_inner()).push(slot.clone());
    let at = Arc::as_ptr(&slot);
    SLOT.with(|s| s.set(at));
    SLOT_OWNER.with(|o| *o.borrow_mut() = Some(Registered(slot)));
    // SAFETY: SLOT_OWNER now keeps the Arc, as in `this_threads_slot`.
    unsafe { &*at }
}

/// Arms this thread's deadline to `after` from now, in place of the one armed (a nested call's deadline replaces
/// its caller's for its own time). Returns the one it replaced, for [`restore`].
pub fn arm(after: Duration) -> io::Result<u64> {
    let slot = slot();
    let after_ns = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
    let previous = slot.deadline_ns.load(Ordering::Relaxed);
    slot.deadline_ns.store(now_ns().saturating_add(after_ns).max(1), Ordering::SeqCst);
    // Tell a watchdog about to slow down (or slowed down) that a deadline is armed. The flag is stored at most once
    // a tick, so threads arming at once do not fight over its cache line.
    if !ARMED_SINCE_LAST_LOOK.load(Ordering::Relaxed) {
        ARMED_SINCE_LAST_LOOK.store(true, Ordering::SeqCst);
    }
    // The deadline and the flag are stored before FAST is read, and the watchdog stores FAST before it reads the
    // flag a last time (all SeqCst): either this sees it slow and wakes it, or it sees the flag and stays fast.
    if !FAST.load(Ordering::SeqCst) {
        wake()?;
    }
    Ok(previous)
}

/// Puts back the deadline [`arm`] replaced (0: none).
pub fn restore(previous: u64) {
    if let Some(slot) = this_threads_slot() {
        slot.deadline_ns.store(previous, Ordering::Relaxed);
    }
}

/// Whether this thread's armed deadline has passed: a timeout signal that finds it not (its call is over, or the
/// next call's deadline is not reached yet) is stale. Async-signal-safe.
pub fn passed() -> bool {
    this_threads_slot().is_some_and(|slot| {
        let deadline = slot.deadline_ns.load(Ordering::Relaxed);
        deadline != 0 && now_ns() >= deadline
    })
}

/// Whether `info` is a signal this process's watchdog sent (queued with its value, from this process).
/// Async-signal-safe.
pub fn from_watchdog(info: &libc::siginfo_t) -> bool {
    let cookie = SIGNAL_COOKIE.load(Ordering::Relaxed);
    // SAFETY: for SI_QUEUE the kernel fills the sender's pid and the value (the `_rt` member of the union).
    cookie != 0
        && info.si_code == libc::SI_QUEUE
        && unsafe { info.si_pid() } == std::process::id() as libc::pid_t
        && unsafe { info.si_value() }.sival_ptr as u64 == cookie
}

/// The value an eviction carries: the watchdog's, inverted (never equal to it, and as unknown to others).
fn eviction_value(cookie: u64) -> u64 {
    !cookie
}

/// Whether `info` is an eviction [`evict`] sent (in this process). Async-signal-safe.
pub fn is_eviction(info: &libc::siginfo_t) -> bool {
    let cookie = SIGNAL_COOKIE.load(Ordering::Relaxed);
    // SAFETY: for SI_QUEUE the kernel fills the sender's pid and the value (the `_rt` member of the union).
    cookie != 0
        && info.si_code == libc::SI_QUEUE
        && unsafe { info.si_pid() } == std::process::id() as libc::pid_t
        && unsafe { info.si_value() }.sival_ptr as u64 == eviction_value(cookie)
}

/// Sends thread `tid` of this process the timeout signal as an *eviction*: a domain it is running in was closed
/// (another thread's call faulted in it), and the handler ends the thread's call if it is still inside that
/// domain. An eviction that finds the thread elsewhere is dropped, so sending one late does no harm.
pub fn evict(tid: libc::pid_t) -> io::Result<()> {
    // Nothing may have armed a deadline yet.
    choose_cookie();
    let info = QueuedSignalInfo::timeout(eviction_value(SIGNAL_COOKIE.load(Ordering::Relaxed)));
    let (pid, signal) = (info.pid, info.signo);
    // SAFETY: rt_tgsigqueueinfo to a thread of this process with a siginfo it only reads (see `watch`). A thread
    // that has ended since is an error (ESRCH), not another thread: ids are not reused while the caller holds the
    // lane that names it (its thread removes it as it ends).
    let r = unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, signal, &info) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The handler has taken this thread's timeout signal: the watchdog may send another. Async-signal-safe.
pub fn heard() {
    if let Some(slot) = this_threads_slot() {
        slot.signal_queued.store(false, Ordering::SeqCst);
    }
}

/// Whether this thread has a deadline armed.
#[cfg(test)]
pub fn armed() -> bool {
    this_threads_slot().is_some_and(|slot| slot.deadline_ns.load(Ordering::Relaxed) != 0)
}

/// Starts the watchdog, or wakes it from its slow ticks.
fn wake() -> io::Result<()> {
    let mut watchdog = WATCHDOG.lock().unwrap_or_else(|e| e.into_inner());
    match watchdog.as_ref() {
        Some(thread) => thread.unpark(),
        None => {
            choose_cookie();
            FAST.store(true, Ordering::SeqCst);
            let handle = std::thread::Builder::new().name("ward-watchdog".into()).spawn(watch)?;
            *watchdog = Some(handle.thread().clone());
        }
    }
    Ok(())
}

/// Chooses the value the watchdog's signals carry, once: whichever of the watchdog's start and the first eviction
/// comes first; it never changes after.
fn choose_cookie() {
    if SIGNAL_COOKIE.load(Ordering::SeqCst) == 0 {
        let _ = SIGNAL_COOKIE.compare_exchange(0, new_cookie(), Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// A value no one else would put in a signal of the timeout signal's number: random, never 0.
fn new_cookie() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom fills at most the 8 bytes of the buffer it is given.
    let filled = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    let random = if filled == 8 {
        u64::from_ne_bytes(bytes)
    } else {
        // No getrandom: the clock and this process's id are as unlikely in a host's signal.
        now_ns() ^ (u64::from(std::process::id()) << 40)
    };
    random.max(1)
}

/// `siginfo_t` as `rt_tgsigqueueinfo` reads it for a queued signal (x86-64: the union starts at byte 16).
#[repr(C)]
struct QueuedSignalInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    pid: libc::pid_t,
    uid: libc::uid_t,
    value: u64,
    _rest: [u64; 12],
}

const _: () = assert!(std::mem::size_of::<QueuedSignalInfo>() == std::mem::size_of::<libc::siginfo_t>());

impl QueuedSignalInfo {
    /// The timeout signal, queued from this process with `value`.
    fn timeout(value: u64) -> QueuedSignalInfo {
        QueuedSignalInfo {
            signo: super::gate::timeout_signal(),
            errno: 0,
            code: libc::SI_QUEUE,
            _pad: 0,
            pid: std::process::id() as libc::pid_t,
            // SAFETY: getuid has no preconditions.
            uid: unsafe { libc::getuid() },
            value,
            _rest: [0; 12],
        }
    }
}

/// The watchdog thread's loop.
fn watch() {
    // No signal is for this thread: a host's process-directed ones go to its own threads.
    // SAFETY: blocking signals on this thread only, with a valid full set.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    let info = QueuedSignalInfo::timeout(SIGNAL_COOKIE.load(Ordering::Relaxed));
    let (pid, signal) = (info.pid, info.signo);
    let mut idle = 0;
    loop {
        #[cfg(test)]
        tests::LOOKS.fetch_add(1, Ordering::SeqCst);
        let now = now_ns();
        let mut armed = ARMED_SINCE_LAST_LOOK.swap(false, Ordering::SeqCst);
        for slot in SLOTS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let deadline = slot.deadline_ns.load(Ordering::SeqCst);
            armed |= deadline != 0;
            if deadline != 0 && now >= deadline && !slot.signal_queued.swap(true, Ordering::SeqCst) {
                // The list's lock keeps the thread from ending (its slot leaves the list first), so the id is
                // still its own. SAFETY: rt_tgsigqueueinfo to a thread of this process, with a siginfo it only
                // reads; a negative code (SI_QUEUE) may be sent to any thread of one's own process.
                let r = unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, slot.tid, signal, &info) };
                if r != 0 {
                    // Not queued (the queue is full): try again next tick.
                    slot.signal_queued.store(false, Ordering::SeqCst);
                }
            }
        }
        idle = if armed { 0 } else { idle + 1 };
        if idle < IDLE_TICKS {
            if !FAST.load(Ordering::Relaxed) {
                FAST.store(true, Ordering::SeqCst);
            }
            std::thread::sleep(TICK);
            continue;
        }
        FAST.store(false, Ordering::SeqCst);
        // A deadline armed while FAST was still true: its thread did not wake us, so look again now.
        if ARMED_SINCE_LAST_LOOK.load(Ordering::SeqCst) {
            continue;
        }
        std::thread::park_timeout(SLOW_TICK);
    }
}

/// The locks held across a fork, so that the child finds neither half-changed.
struct ForkLocks {
    _watchdog: MutexGuard<'static, Option<Thread>>,
    slots: MutexGuard<'static, Vec<Arc<Slot>>>,
}

extern "C" fn before_fork() {
    let watchdog = WATCHDOG.lock().unwrap_or_else(|e| e.into_inner());
    let slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
    FORK_LOCKS.with(|l| *l.borrow_mut() = Some(ForkLocks { _watchdog: watchdog, slots }));
}

extern "C" fn after_fork_in_parent() {
    FORK_LOCKS.with(|l| l.borrow_mut().take());
}

/// The child has only the thread that forked, and no watchdog: the next deadline starts one.
extern "C" fn after_fork_in_child() {
    let Some(mut locks) = FORK_LOCKS.with(|l| l.borrow_mut().take()) else {
        return;
    };
    let own = SLOT.with(Cell::get);
    locks.slots.retain(|s| Arc::as_ptr(s) == own);
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    if let Some(slot) = locks.slots.first_mut() {
        // The forking thread has a new id in the child; its slot is replaced, not changed (it is shared).
        let renewed = Arc::new(Slot::new(tid, slot.deadline_ns.load(Ordering::Relaxed)));
        SLOT.with(|s| s.set(Arc::as_ptr(&renewed)));
        *slot = renewed.clone();
        // The old slot's Registered would remove the new one by pointer: swap it for one that names the new.
        SLOT_OWNER.with(|o| {
            if let Some(old) = o.borrow_mut().as_mut() {
                old.0 = renewed;
            }
        });
    }
    FAST.store(false, Ordering::Release);
    let ForkLocks { _watchdog: mut watchdog, slots } = locks;
    *watchdog = None;
    drop(slots);
    drop(watchdog);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI32;

    /// Waits, up to a bound no loaded machine reaches, for `what`; whether it came.
    fn eventually(what: impl Fn() -> bool) -> bool {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < until {
            if what() {
                return true;
            }
            std::thread::yield_now();
        }
        what()
    }

    /// Blocks the timeout signal on this thread: a test here lets a deadline pass outside any gate call, and the
    /// watchdog's signal would then find no handler of ward's (none on a machine without PKU) and end the process.
    /// A signal still pending when the test's thread ends goes with it.
    fn block_the_timeout_signal() {
        // SAFETY: changing this thread's own signal mask, with valid sets.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, crate::domain::gate::timeout_signal());
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
    }

    #[test]
    fn a_nested_deadline_replaces_its_callers_and_restore_puts_the_callers_back() {
        block_the_timeout_signal();
        let outer = arm(Duration::from_secs(3600)).unwrap();
        assert_eq!(outer, 0, "nothing was armed on this thread before");
        assert!(armed() && !passed(), "an hour's deadline is armed and not passed");
        let caller = arm(Duration::ZERO).unwrap();
        assert_ne!(caller, 0, "the nested arm returns the caller's deadline");
        assert!(eventually(passed), "a zero deadline passes within a tick");
        restore(caller);
        assert!(armed() && !passed(), "the caller's hour is back");
        restore(outer);
        assert!(!armed(), "nothing is armed after the outermost call");
    }

    /// How many times the watchdog has looked at the slots.
    pub(super) static LOOKS: AtomicU64 = AtomicU64::new(0);

    /// Takes a timeout signal queued for this thread (which blocks it), waiting up to a bound no loaded machine
    /// reaches; None when none came.
    fn take_the_timeout_signal() -> Option<libc::siginfo_t> {
        // SAFETY: sigtimedwait with valid sets and a siginfo it fills; the signal is blocked on this thread.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, crate::domain::gate::timeout_signal());
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let bound = libc::timespec { tv_sec: 30, tv_nsec: 0 };
            (libc::sigtimedwait(&set, &mut info, &bound) > 0).then_some(info)
        }
    }

    /// Whether a timeout signal is pending for this thread.
    fn timeout_signal_pending() -> bool {
        // SAFETY: sigpending fills a valid set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut set);
            libc::sigismember(&set, crate::domain::gate::timeout_signal()) == 1
        }
    }

    #[test]
    fn a_late_thread_gets_one_signal_at_a_time_never_before_its_deadline() {
        block_the_timeout_signal();
        let deadline = Duration::from_millis(20);
        let armed_at = now_ns();
        let caller = arm(deadline).unwrap();
        let info = take_the_timeout_signal().expect("the watchdog signals a late thread");
        assert!(now_ns() - armed_at >= deadline.as_nanos() as u64, "the signal came before the deadline");
        assert!(from_watchdog(&info), "the signal carries the watchdog's value");
        // Until the handler has heard it, the watchdog queues no other, however many times it looks.
        let looks = LOOKS.load(Ordering::SeqCst);
        assert!(eventually(|| LOOKS.load(Ordering::SeqCst) >= looks + 5), "the watchdog keeps looking");
        assert!(!timeout_signal_pending(), "a second signal was queued before the first was heard");
        heard();
        assert!(take_the_timeout_signal().is_some_and(|i| from_watchdog(&i)), "once heard, the next one comes");
        heard();
        restore(caller);
    }

    #[test]
    fn a_timeout_numbered_signal_the_host_sends_itself_is_not_the_watchdogs() {
        block_the_timeout_signal();
        let signal = crate::domain::gate::timeout_signal();
        // SAFETY: raise sends the signal to this thread, which blocks it.
        assert_eq!(unsafe { libc::raise(signal) }, 0);
        let raised = take_the_timeout_signal().expect("raise queues the signal");
        assert!(!from_watchdog(&raised), "a raised signal is the host's");
        // Queued like the watchdog's, from this process, with another value.
        let info = QueuedSignalInfo {
            signo: signal,
            errno: 0,
            code: libc::SI_QUEUE,
            _pad: 0,
            pid: std::process::id() as libc::pid_t,
            // SAFETY: getuid has no preconditions.
            uid: unsafe { libc::getuid() },
            value: 42,
            _rest: [0; 12],
        };
        // SAFETY: queues the signal to this very thread, which blocks it, with a siginfo the kernel only reads.
        let r =
            unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, std::process::id(), libc::gettid(), signal, &info) };
        assert_eq!(r, 0, "rt_tgsigqueueinfo: {}", io::Error::last_os_error());
        let queued = take_the_timeout_signal().expect("the queued signal arrives");
        assert!(!from_watchdog(&queued), "a queued signal with another value is the host's");
    }

    static SIGNALLED: AtomicI32 = AtomicI32::new(0);

    extern "C" fn note_signal(_: libc::c_int) {
        SIGNALLED.fetch_add(1, Ordering::SeqCst);
    }

    /// The watchdog runs in a fork's child too: the child's late thread (the one that forked, under its new id)
    /// gets the signal from a watchdog of the child's own.
    #[test]
    fn after_a_fork_the_child_has_a_watchdog_of_its_own() {
        // The parent's watchdog runs first (and this thread has a slot that the child must renew).
        restore(arm(Duration::from_secs(1)).unwrap());
        // SAFETY: the child only installs a handler, arms a deadline, waits for the signal and exits; glibc makes
        // malloc and thread creation work in the child of a multithreaded parent.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: a plain handler that only increments an atomic.
            unsafe {
                libc::signal(crate::domain::gate::timeout_signal(), note_signal as *const () as libc::sighandler_t)
            };
            let signalled =
                arm(Duration::from_millis(1)).is_ok() && eventually(|| SIGNALLED.load(Ordering::SeqCst) > 0);
            // SAFETY: ends the child at once, running nothing of the parent's (no test harness, no destructors).
            unsafe { libc::_exit(if signalled { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child's late thread got no signal");
    }
}
