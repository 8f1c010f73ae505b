//! Call deadlines for threads inside mpk domains, kept by one watchdog thread (DESIGN.md §7: kernel plugins' time
//! quantum).
//!
//! A call with a deadline stores, in its thread's slot, the time by which it must be back; the watchdog looks at
//! every slot each millisecond and sends a late thread the gate's timeout signal (`tgkill`), again each tick until
//! the call is over. Arming and disarming are a load and a store each, with no system call: the time they add the
//! deadline to is the watchdog's own clock reading from its last tick. A deadline therefore ends up to one tick late
//! (it is padded by a tick, never early), and a signal can arrive after its call is over: the handler asks
//! [`passed`] before it acts on one.
//!
//! With no deadline armed for a second the watchdog slows to a tick every 50 ms; the next call to arm one reads the
//! clock itself and wakes it. In the moment it slows down, a deadline armed may be seen up to 50 ms late.

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
}

/// Every thread that has armed a deadline, for the watchdog to look at.
static SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());
/// The watchdog thread, once started (in this process: a fork's child starts its own).
static WATCHDOG: Mutex<Option<Thread>> = Mutex::new(None);
/// The watchdog's clock reading at its last tick.
static TICK_NS: AtomicU64 = AtomicU64::new(0);
/// True while the watchdog ticks every [`TICK`], so [`TICK_NS`] is at most a tick old.
static FAST: AtomicBool = AtomicBool::new(false);

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

/// This thread's slot, registered (and the watchdog started) on first use.
fn slot() -> io::Result<&'static Slot> {
    let at = SLOT.with(Cell::get);
    if !at.is_null() {
        // SAFETY: a non-null SLOT points into the Arc SLOT_OWNER keeps until the thread ends (its drop nulls SLOT
        // first).
        return Ok(unsafe { &*at });
    }
    static AT_FORK: Once = Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: the three handlers are plain functions that only take and release this module's locks.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child)) };
    });
    // SAFETY: gettid has no preconditions.
    let slot = Arc::new(Slot { tid: unsafe { libc::gettid() }, deadline_ns: AtomicU64::new(0) });
    SLOTS.lock().unwrap_or_else(|e| e.into_inner()).push(slot.clone());
    let at = Arc::as_ptr(&slot);
    SLOT.with(|s| s.set(at));
    SLOT_OWNER.with(|o| *o.borrow_mut() = Some(Registered(slot)));
    // SAFETY: as above: SLOT_OWNER now keeps it.
    Ok(unsafe { &*at })
}

/// Arms this thread's deadline to `after` from now, in place of the one armed (a nested call's deadline replaces
/// its caller's for its own time). Returns the one it replaced, for [`restore`].
pub(crate) fn arm(after: Duration) -> io::Result<u64> {
    let slot = slot()?;
    let now = if FAST.load(Ordering::Acquire) { TICK_NS.load(Ordering::Relaxed) } else { wake()? };
    let after_ns = u64::try_from(after.saturating_add(TICK).as_nanos()).unwrap_or(u64::MAX);
    let previous = slot.deadline_ns.load(Ordering::Relaxed);
    slot.deadline_ns.store(now.saturating_add(after_ns).max(1), Ordering::Relaxed);
    Ok(previous)
}

/// Puts back the deadline [`arm`] replaced (0: none).
pub(crate) fn restore(previous: u64) {
    let at = SLOT.with(Cell::get);
    // SAFETY: as in `slot`: non-null while the thread lives.
    if let Some(slot) = unsafe { at.as_ref() } {
        slot.deadline_ns.store(previous, Ordering::Relaxed);
    }
}

/// Whether this thread's armed deadline has passed: a timeout signal that finds it not (its call is over, or the
/// next call's deadline is not reached yet) is stale. Async-signal-safe.
pub(crate) fn passed() -> bool {
    let at = SLOT.with(Cell::get);
    // SAFETY: as in `slot`.
    let Some(slot) = (unsafe { at.as_ref() }) else {
        return false;
    };
    let deadline = slot.deadline_ns.load(Ordering::Relaxed);
    deadline != 0 && now_ns() >= deadline
}

/// Whether this thread has a deadline armed.
#[cfg(test)]
pub(crate) fn armed() -> bool {
    // SAFETY: as in `slot`.
    unsafe { SLOT.with(Cell::get).as_ref() }.is_some_and(|slot| slot.deadline_ns.load(Ordering::Relaxed) != 0)
}

/// Starts the watchdog, or wakes it from its slow ticks; returns the time now.
fn wake() -> io::Result<u64> {
    let now = now_ns();
    let mut watchdog = WATCHDOG.lock().unwrap_or_else(|e| e.into_inner());
    match watchdog.as_ref() {
        Some(thread) => thread.unpark(),
        None => {
            TICK_NS.store(now, Ordering::Relaxed);
            let handle = std::thread::Builder::new().name("ward-watchdog".into()).spawn(watch)?;
            *watchdog = Some(handle.thread().clone());
        }
    }
    Ok(now)
}

/// The watchdog thread's loop.
fn watch() {
    let pid = std::process::id() as libc::pid_t;
    let signal = super::gate::timeout_signal();
    let mut idle = 0;
    loop {
        let now = now_ns();
        TICK_NS.store(now, Ordering::Relaxed);
        FAST.store(true, Ordering::Release);
        let mut armed = false;
        for slot in SLOTS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let deadline = slot.deadline_ns.load(Ordering::Relaxed);
            armed |= deadline != 0;
            if deadline != 0 && now >= deadline {
                // The list's lock keeps the thread from ending (its slot leaves the list first), so the id is
                // still its own. SAFETY: tgkill with this process's id and a thread of it.
                unsafe { libc::syscall(libc::SYS_tgkill, pid, slot.tid, signal) };
            }
        }
        idle = if armed { 0 } else { idle + 1 };
        if idle >= IDLE_TICKS {
            FAST.store(false, Ordering::Release);
            std::thread::park_timeout(SLOW_TICK);
        } else {
            std::thread::sleep(TICK);
        }
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
        let renewed = Arc::new(Slot { tid, deadline_ns: AtomicU64::new(slot.deadline_ns.load(Ordering::Relaxed)) });
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
            libc::sigaddset(&mut set, crate::backend::mpk::gate::timeout_signal());
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
                libc::signal(
                    crate::backend::mpk::gate::timeout_signal(),
                    note_signal as *const () as libc::sighandler_t,
                )
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
