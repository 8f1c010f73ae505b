//! Whether a wait that spins for the other side of a ring can pay: the machine's run queue, sampled lazily and
//! shared by every waiter of the process, and the processor the calling thread runs on.
//!
//! A waiter that spins keeps its processor, which pays only while the side it waits for runs meanwhile on another
//! one. The kernel's count of runnable tasks (`nr_running`, the first half of the fourth field of `/proc/loadavg`,
//! `running/total`) says whether that can be so: no more runnable tasks than online processors, and every one of
//! them has a processor, so a runnable partner is running; more, and some task waits for a processor, perhaps the
//! partner for this very one, and a spin only delays it. glibc's adaptive mutexes and the kernel's optimistic
//! spinning on a mutex's owner give up on the same grounds (the owner is off its processor, or another task needs
//! this one). [`may_spin`] is that rule, [`crowding`] applies it to the machine as it is. A partner just woken is
//! runnable before the kernel counts it (a wake-up on another processor is queued there until that processor takes
//! its interrupt: tens of microseconds in a virtual machine), so a waiter whose partner has not yet said it is awake
//! counts it itself.
//!
//! Reading `/proc/loadavg` is a system call (about a microsecond), so it is read only by a wait that has already
//! spun a while, at most once per [`SAMPLE_EVERY`] in the whole process ([`crowding`]: the last sample and its time
//! are atomics every waiter shares, and one waiter at a time takes a new one), through a descriptor opened once
//! and read with `pread`. A process that will lose the right to open files (a sandboxed domain) opens it first
//! ([`open_above`]), on a number above those it will yet place descriptors on. Where it cannot be read at all the
//! answer is [`Crowding::Unknown`], and the waits spin briefly only.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The longest a sample of the run queue is used for before a waiter that still spins takes a new one.
pub const SAMPLE_EVERY: Duration = Duration::from_micros(40);

/// What the run queue says about spinning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crowding {
    /// Every runnable task has a processor: a partner that is runnable is running, spinning for it can pay.
    Room,
    /// More tasks are runnable than there are processors: the partner may be waiting for this one.
    Crowded,
    /// The run queue cannot be read here (no `/proc`, or it is not what it should be).
    Unknown,
}

/// The rule: spinning can pay while `running` runnable tasks (the spinner included, and a partner being woken)
/// fit on `cpus` processors.
pub fn may_spin(running: u32, cpus: u32) -> bool {
    running <= cpus
}

/// The number of runnable tasks in the text of `/proc/loadavg` (`0.52 0.58 0.59 3/1234 56789`).
pub fn parse_running(loadavg: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(loadavg).ok()?;
    let field = text.split_ascii_whitespace().nth(3)?;
    let (running, _total) = field.split_once('/')?;
    running.parse().ok()
}

/// The processor the calling thread runs on now, if the system says (`sched_getcpu`: a few nanoseconds, through
/// the vDSO or the kernel's restartable-sequences area).
pub fn current_cpu() -> Option<u32> {
    // SAFETY: `sched_getcpu` takes no arguments and only reads the calling thread's state.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).ok()
}

/// The gauge of one process: the open `/proc/loadavg` and the processors online, or why there is none.
struct Gauge {
    loadavg: Result<File, String>,
    cpus: u32,
    /// Origin of the sample times below.
    opened_at: Instant,
}

static GAUGE: OnceLock<Gauge> = OnceLock::new();
/// When the last sample was taken, in nanoseconds after `Gauge::opened_at`, plus one (0: never).
static SAMPLED_AT: AtomicU64 = AtomicU64::new(0);
/// The runnable tasks the last sample counted (0 until the first sample is in; [`UNREAD`]: it could not be read).
static LAST: AtomicU32 = AtomicU32::new(0);
const UNREAD: u32 = u32::MAX;

impl Gauge {
    /// The gauge, its descriptor numbered `lowest` or above.
    fn open(lowest: RawFd) -> Gauge {
        let opened_at = Instant::now();
        // SAFETY: sysconf takes a name and reads system state only.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let cpus = u32::try_from(online).unwrap_or(0);
        let loadavg = if cpus == 0 {
            Err("the number of online processors is not known".to_string())
        } else {
            File::open("/proc/loadavg")
                .map_err(|e| format!("cannot open /proc/loadavg: {e}"))
                .and_then(|file| above(file, lowest))
                .and_then(|file| read_running(&file).map(|_| file))
        };
        Gauge { loadavg, cpus, opened_at }
    }
}

/// `file` on a descriptor numbered `lowest` or above (moved there if it is below).
fn above(file: File, lowest: RawFd) -> Result<File, String> {
    if file.as_raw_fd() >= lowest {
        return Ok(file);
    }
    // SAFETY: F_DUPFD_CLOEXEC takes a descriptor this process owns (`file`, open for the call) and a number; it
    // returns a new descriptor or -1, and touches no memory.
    let moved = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, lowest) };
    if moved < 0 {
        return Err(format!(
            "cannot move /proc/loadavg to a descriptor from {lowest} on: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `moved` was just returned by fcntl, so it is open and owned by nothing else; `file` (the old number)
    // closes when dropped here.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(moved) }))
}

fn read_running(file: &File) -> Result<u32, String> {
    let mut buf = [0u8; 128];
    let n = file.read_at(&mut buf, 0).map_err(|e| format!("cannot read /proc/loadavg: {e}"))?;
    parse_running(&buf[..n]).ok_or_else(|| "/proc/loadavg does not say how many tasks are runnable".to_string())
}

/// Open the gauge now, if not yet done, on a descriptor numbered `lowest` or above: for a process that cannot
/// open files later (the domain, before its sandbox) and that will yet put descriptors of its own on numbers below
/// `lowest` (a spare: its domain's shared memory comes later, onto 4, 5 and 6, where a descriptor opened before
/// would be closed from under the gauge and the number reused). Waits open it on first use otherwise. Why it
/// cannot be read, if it cannot.
pub fn open_above(lowest: RawFd) -> Option<&'static str> {
    GAUGE.get_or_init(|| Gauge::open(lowest)).loadavg.as_ref().err().map(String::as_str)
}

/// Why the run queue cannot be read in this process, if it cannot (opening the gauge if not yet done).
pub fn unavailable() -> Option<&'static str> {
    open_above(0)
}

/// The run queue as last sampled, with `uncounted` more runnable tasks than the kernel counted (a partner being
/// woken): sampled afresh when the last sample is older than [`SAMPLE_EVERY`] and no other waiter is already
/// taking one (it then answers from the sample before).
pub fn crowding(uncounted: u32) -> Crowding {
    let gauge = GAUGE.get_or_init(|| Gauge::open(0));
    let Ok(file) = &gauge.loadavg else {
        return Crowding::Unknown;
    };
    // Nanoseconds since the gauge opened fit a u64 for centuries.
    let now = (gauge.opened_at.elapsed().as_nanos() as u64).saturating_add(1);
    let at = SAMPLED_AT.load(Ordering::Relaxed);
    let fresh = at != 0 && now.saturating_sub(at) < SAMPLE_EVERY.as_nanos() as u64;
    let running = if fresh || SAMPLED_AT.compare_exchange(at, now, Ordering::Relaxed, Ordering::Relaxed).is_err() {
        LAST.load(Ordering::Relaxed)
    } else {
        let running = read_running(file).unwrap_or(UNREAD);
        LAST.store(running, Ordering::Relaxed);
        running
    };
    match running {
        UNREAD => Crowding::Unknown,
        running if may_spin(running.saturating_add(uncounted), gauge.cpus) => Crowding::Room,
        _ => Crowding::Crowded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_pays_while_every_runnable_task_has_a_processor() {
        assert!(may_spin(1, 1));
        assert!(may_spin(2, 2), "spinner and partner on two processors");
        assert!(may_spin(3, 8));
        assert!(!may_spin(3, 2), "one of three waits for a processor");
        assert!(!may_spin(2, 1));
        assert!(!may_spin(65, 64));
    }

    #[test]
    fn the_running_count_is_read_from_loadavg() {
        assert_eq!(parse_running(b"0.52 0.58 0.59 3/1234 56789\n"), Some(3));
        assert_eq!(parse_running(b"10.00 9.10 8.00 17/2048 1"), Some(17));
        assert_eq!(parse_running(b"0.52 0.58 0.59"), None);
        assert_eq!(parse_running(b"0.52 0.58 0.59 x/1234 5"), None);
        assert_eq!(parse_running(b"0.52 0.58 0.59 31234 5"), None);
        assert_eq!(parse_running(&[0xff, 0xfe]), None);
    }

    #[test]
    fn this_machine_has_a_run_queue_to_read() {
        // Linux with /proc mounted (the test machines): the gauge works, and a sample counts at least this thread.
        assert_eq!(unavailable(), None);
        let gauge = GAUGE.get().expect("opened above");
        let file = gauge.loadavg.as_ref().expect("open");
        assert!(read_running(file).expect("readable") >= 1);
        assert!(gauge.cpus >= 1);
        assert_ne!(crowding(0), Crowding::Unknown);
        // However many tasks the last sample counted, one more than there are processors crowds them.
        assert_eq!(crowding(gauge.cpus + 1), Crowding::Crowded);
    }

    #[test]
    fn the_gauge_moves_above_the_numbers_a_spare_fills_later() {
        let low = File::open("/proc/loadavg").expect("open");
        let low_fd = low.as_raw_fd();
        let moved = above(low, low_fd + 50).expect("moved");
        assert!(moved.as_raw_fd() >= low_fd + 50, "on {}", moved.as_raw_fd());
        assert!(read_running(&moved).expect("still the run queue") >= 1);
        let other = File::open("/proc/loadavg").expect("open");
        let other_fd = other.as_raw_fd();
        let kept = above(other, 0).expect("already above 0");
        assert_eq!(kept.as_raw_fd(), other_fd, "a descriptor already high enough stays where it is");
    }

    #[test]
    fn the_processor_is_known() {
        let cpu = current_cpu().expect("sched_getcpu");
        assert!(cpu < 1 << 16);
    }
}
