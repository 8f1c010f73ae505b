//! The monitor thread: notices domain processes dying (their pidfds become readable) and starts domain processes.
//!
//! Death is noticed by the kernel's pidfd notification, not by polling: one `epoll` over every live domain's pidfd.
//! When one fires, the domain's [`DeathWatch`] is marked and the host thread waiting on that domain's reply ring is
//! woken, so a crash is seen within microseconds whatever the waiting thread was doing.
//!
//! Jobs that look at domains at intervals ([`Monitor::every`]: the CPU a domain uses between calls) run on this
//! thread too, every [`PERIOD`] while there are any: the thread then waits for events at most that long.
//!
//! Domain processes are spawned on this thread too: `PR_SET_PDEATHSIG` fires when the *thread* that forked a child
//! exits, and this thread lives as long as the supervisor, while the host thread that happened to load an extension
//! may not.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ward_xpc::Region;

/// How often periodic jobs run.
pub(crate) const PERIOD: Duration = Duration::from_millis(100);

/// Set when a domain process has ended.
pub(crate) struct DeathWatch {
    dead: AtomicBool,
    region: Region,
    /// Why ward killed the process, when ward did (a job of this thread): the fault to report for its death.
    killed_for: Mutex<Option<crate::fault::FaultKind>>,
}

impl DeathWatch {
    pub fn new(region: Region) -> Arc<DeathWatch> {
        Arc::new(DeathWatch { dead: AtomicBool::new(false), region, killed_for: Mutex::new(None) })
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Say why ward is about to kill the process: its death is then reported as `kind`.
    pub fn blame(&self, kind: crate::fault::FaultKind) {
        *self.killed_for.lock().unwrap_or_else(|e| e.into_inner()) = Some(kind);
    }

    /// Why ward killed the process, if it did.
    pub fn blamed(&self) -> Option<crate::fault::FaultKind> {
        self.killed_for.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn mark_dead(&self) {
        self.dead.store(true, Ordering::Release);
        self.region.kick_reply_ring();
    }
}

type Job = Box<dyn FnOnce() + Send>;
/// A job run every [`PERIOD`], given the time.
type Periodic = Box<dyn FnMut(Instant) + Send>;

struct Shared {
    epoll: OwnedFd,
    wake: OwnedFd,
    watches: Mutex<HashMap<u64, Arc<DeathWatch>>>,
    jobs: Mutex<Vec<Job>>,
    periodic: Mutex<HashMap<u64, Periodic>>,
    stop: AtomicBool,
}

/// Token 0 is the wake-up eventfd; watches count up from 1.
const WAKE_TOKEN: u64 = 0;

pub(crate) struct Monitor {
    shared: Arc<Shared>,
    next: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Removes its watch from the monitor when dropped. Drop it before closing the pidfd.
pub(crate) struct WatchGuard {
    shared: Arc<Shared>,
    token: u64,
    fd: RawFd,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        // SAFETY: fd is the pidfd this guard registered, still open (the guard is dropped before it); removing an
        // fd from an epoll set has no memory effects.
        unsafe { libc::epoll_ctl(self.shared.epoll.as_raw_fd(), libc::EPOLL_CTL_DEL, self.fd, std::ptr::null_mut()) };
        self.shared.watches.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.token);
    }
}

/// Removes its periodic job from the monitor when dropped (waiting for a run in progress to end).
pub(crate) struct PeriodicGuard {
    shared: Arc<Shared>,
    token: u64,
}

impl Drop for PeriodicGuard {
    fn drop(&mut self) {
        self.shared.periodic.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.token);
    }
}

impl Monitor {
    pub fn start() -> std::io::Result<Arc<Monitor>> {
        // SAFETY: epoll_create1 and eventfd take no pointers; results are checked and owned below.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        // SAFETY: eventfd takes no pointers; the result is checked and owned below.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        add(epoll.as_raw_fd(), wake.as_raw_fd(), WAKE_TOKEN, libc::EPOLLIN as u32)?;
        let shared = Arc::new(Shared {
            epoll,
            wake,
            watches: Mutex::new(HashMap::new()),
            jobs: Mutex::new(Vec::new()),
            periodic: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new().name("ward-monitor".into()).spawn(move || run(&thread_shared))?;
        Ok(Arc::new(Monitor { shared, next: AtomicU64::new(1), thread: Mutex::new(Some(thread)) }))
    }

    /// Watch a pidfd: when its process ends, `watch` is marked dead and its reply ring kicked.
    pub fn watch(&self, pidfd: BorrowedFd<'_>, watch: Arc<DeathWatch>) -> std::io::Result<WatchGuard> {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.shared.watches.lock().unwrap_or_else(|e| e.into_inner()).insert(token, watch);
        let guard = WatchGuard { shared: self.shared.clone(), token, fd: pidfd.as_raw_fd() };
        add(self.shared.epoll.as_raw_fd(), pidfd.as_raw_fd(), token, (libc::EPOLLIN | libc::EPOLLONESHOT) as u32)?;
        Ok(guard)
    }

    /// Run `job` on the monitor thread every [`PERIOD`] (or a little later, when spawning a domain keeps the thread
    /// busy) until the guard is dropped. A job must not drop a guard of this monitor.
    pub fn every(&self, job: impl FnMut(Instant) + Send + 'static) -> PeriodicGuard {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.shared.periodic.lock().unwrap_or_else(|e| e.into_inner()).insert(token, Box::new(job));
        // Wake the thread so that it starts waiting with a timeout.
        kick(&self.shared.wake);
        PeriodicGuard { shared: self.shared.clone(), token }
    }

    /// Run `f` on the monitor thread and return its result.
    pub fn on_thread<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> std::io::Result<R> {
        let (tx, rx) = mpsc::channel();
        self.shared.jobs.lock().unwrap_or_else(|e| e.into_inner()).push(Box::new(move || {
            let _ = tx.send(f());
        }));
        kick(&self.shared.wake);
        rx.recv().map_err(|_| std::io::Error::other("the monitor thread has stopped"))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        kick(&self.shared.wake);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn add(epoll: RawFd, fd: RawFd, token: u64, events: u32) -> std::io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: ev is a valid epoll_event; both descriptors are open.
    if unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn kick(eventfd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a valid u64 to an eventfd.
    unsafe { libc::write(eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn run(shared: &Shared) {
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut next_periodic = Instant::now() + PERIOD;
    while !shared.stop.load(Ordering::Acquire) {
        let timeout = if shared.periodic.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            -1
        } else {
            next_periodic.saturating_duration_since(Instant::now()).as_millis().min(i32::MAX as u128) as i32
        };
        // SAFETY: events is a valid array of the length given.
        let n =
            unsafe { libc::epoll_wait(shared.epoll.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, timeout) };
        let now = Instant::now();
        if now >= next_periodic {
            next_periodic = now + PERIOD;
            for job in shared.periodic.lock().unwrap_or_else(|e| e.into_inner()).values_mut() {
                job(now);
            }
        }
        if n < 0 {
            continue; // EINTR
        }
        for ev in &events[..n as usize] {
            let token = ev.u64;
            if token == WAKE_TOKEN {
                let mut buf = 0u64;
                // SAFETY: reads 8 bytes into a valid u64 (non-blocking eventfd).
                unsafe { libc::read(shared.wake.as_raw_fd(), (&mut buf as *mut u64).cast(), 8) };
                let jobs = std::mem::take(&mut *shared.jobs.lock().unwrap_or_else(|e| e.into_inner()));
                for job in jobs {
                    job();
                }
            } else if let Some(w) = shared.watches.lock().unwrap_or_else(|e| e.into_inner()).get(&token) {
                w.mark_dead();
            }
        }
    }
}
