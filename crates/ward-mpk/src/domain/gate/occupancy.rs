//! Who is inside a domain, and closing it: the epoch every call records, each thread's running mark, and the
//! eviction and process-wide barrier that let a recovering thread know no other runs the domain's code.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::domain::watchdog;

/// Whether a domain may be entered, and closing it: what a thread recovering a domain that other threads may be
/// running in needs before it puts the domain's memory back or lets it go.
///
/// Each call records the epoch it was made in. [`Occupancy::close`] moves the epoch on: from then no call made
/// before goes into the domain's code, or back into it from a call out to the host (the gate's entry and the
/// outward stub's way back in compare the epochs and end the call there, as a fault would); a thread running the
/// domain's code just then is sent an eviction (the timeout signal, see `watchdog::evict`), which ends its call
/// the same way; `close` returns once none is left in the domain's code. A thread that is out in the host stays
/// there undisturbed, and its call ends when it comes back.
#[derive(Debug, Default)]
pub struct Occupancy {
    pub(super) epoch: AtomicU64,
}

/// One thread's presence in one domain, for a thread closing the domain to look at.
#[derive(Debug)]
pub struct Occupant {
    tid: libc::pid_t,
    /// 1 while the thread runs the domain's code: from the gate's entry to its way out or its resume path, less
    /// its calls out to the host. (Only one activation of a thread runs at a time, so one word does for nested
    /// calls.) Written by the gate and the outward stubs.
    pub(super) running: AtomicU64,
}

/// How long [`Occupancy::close`] waits for threads to leave a domain before it says so in the log (it goes on
/// waiting: restoring the memory under a thread still running there would corrupt the new incarnation).
const CLOSE_WARN_AFTER: std::time::Duration = std::time::Duration::from_secs(5);
/// How long [`Occupancy::close`] waits before it sends a thread that has not left another eviction.
const EVICT_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(10);

impl Occupancy {
    /// The epoch calls made now are made in.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Closes the domain to every call made before (see [`Occupancy`]) and waits until none of `occupants` (every
    /// thread that has entered the domain) is running its code.
    pub fn close<'a>(&self, occupants: impl Iterator<Item = &'a Occupant> + Clone) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        // The gate marks a thread running with a plain store, then reads the epoch, and this thread stores the
        // epoch, then reads the marks: without a barrier on both sides each could miss the other's store. The
        // barrier on the gate's side is this system call, which makes every thread of the process execute one
        // (a closing is rare, a gate crossing is not).
        if let Err(e) = process_barrier() {
            tracing::warn!(
                "mpk: membarrier failed while closing a domain ({e}); a thread entering it just now may be missed"
            );
        }
        let started = std::time::Instant::now();
        let mut evicted_at: Option<std::time::Instant> = None;
        let mut warned = false;
        for round in 0u32.. {
            let running: Vec<&Occupant> = occupants.clone().filter(|o| o.is_running()).collect();
            if running.is_empty() {
                return;
            }
            // One eviction each, and again now and then for a thread that has not left (it may have had the
            // signal blocked, or been between its mark and its gate's span when the first came).
            if evicted_at.is_none_or(|at| at.elapsed() >= EVICT_AGAIN_AFTER) {
                for occupant in &running {
                    occupant.evict();
                }
                evicted_at = Some(std::time::Instant::now());
            }
            if !warned && started.elapsed() > CLOSE_WARN_AFTER {
                tracing::warn!("a thread is still running in a failed mpk domain after an eviction; waiting for it");
                warned = true;
            }
            // Waiting for other threads' signal handlers to take them out: a handler runs within microseconds, so
            // the processor is given up at first, and only then does this thread sleep between looks.
            if round < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    }
}

impl Occupant {
    /// This thread's.
    pub fn for_this_thread() -> Occupant {
        // SAFETY: gettid has no preconditions.
        Occupant { tid: unsafe { libc::gettid() }, running: AtomicU64::new(0) }
    }

    /// Whether its thread is running the domain's code.
    fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst) != 0
    }

    /// Sends its thread an eviction.
    fn evict(&self) {
        if let Err(e) = watchdog::evict(self.tid) {
            tracing::debug!("mpk: cannot evict thread {} from a closed domain: {e}", self.tid);
        }
    }
}

/// Where a call into a domain records itself: the domain's [`Occupancy`] and this thread's [`Occupant`] there.
#[derive(Clone, Copy)]
pub struct Presence<'a> {
    pub occupancy: &'a Occupancy,
    pub occupant: &'a Occupant,
    /// The epoch the call was made in ([`Occupancy::epoch`] when it was prepared).
    pub epoch: u64,
}

/// `membarrier(2)` commands.
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Readies this process for [`Occupancy::close`]'s barrier (registers it for private expedited `membarrier`, once);
/// an error when the kernel cannot (before Linux 4.14).
pub fn closing_ready() -> io::Result<()> {
    static REGISTERED: OnceLock<Result<(), i32>> = OnceLock::new();
    let registered = REGISTERED.get_or_init(|| {
        // SAFETY: membarrier takes integers only; registering changes nothing but what the process may ask later.
        let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOSYS))
        }
    });
    registered.map_err(io::Error::from_raw_os_error)
}

/// A full memory barrier executed by every running thread of this process, as far as memory order goes.
fn process_barrier() -> io::Result<()> {
    closing_ready()?;
    // SAFETY: membarrier takes integers only and touches no memory of ours; the process is registered.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The epoch word of calls made with no [`Presence`]: never closed.
pub(super) static NEVER_CLOSED: AtomicU64 = AtomicU64::new(0);
