//! Where a sleeping domain process runs: on the processor of the thread that calls it.
//!
//! A synchronous call never runs host and domain at the same time: the caller waits for the reply. When both sides
//! sleep instead of spinning, a call is two wake-ups, and waking a process that sleeps on another processor costs an
//! inter-processor interrupt (in a virtual machine, waking a halted virtual CPU: tens of microseconds here). Woken on
//! the caller's own processor, the domain runs as soon as the caller goes to sleep, and the reply wakes the caller
//! there in turn: a hand-over, as an L4 kernel switches directly from client to server (the caller in fact yields the
//! processor rather than sleeping, so the reply needs no wake-up at all). The host's threads are the host's business
//! and are never moved; the domain's serving thread follows them. The scheduler may still wake a caller that had to
//! sleep on another, idle processor (or pull it there while the domain runs), which costs the hand-over an
//! inter-processor wake-up and the next call a move of the domain; a caller that keeps being taken away is
//! [`held`](hold_here) on its processor while it sleeps for a reply, and let go as soon as it wakes, before any of the
//! host's code runs. `ward bench xpc` uses the same functions for the machine's own floor of a hand-over.

use std::io;
use std::marker::PhantomData;

/// The processor the calling thread runs on now, if the system says.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: `sched_getcpu` takes no arguments and only reads the calling thread's state (through the vDSO or
    // the kernel's restartable-sequences area).
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The calling thread's real-time scheduling (its policy, `SCHED_FIFO` or `SCHED_RR`, and priority), if it has one:
/// an audio host's process thread, say.
pub fn realtime_scheduling() -> Option<(i32, i32)> {
    // SAFETY: sched_getscheduler(0) takes a number and reads the calling thread's policy.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy != libc::SCHED_FIFO && policy != libc::SCHED_RR {
        return None;
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_getparam writes one sched_param into the valid place given.
    if unsafe { libc::sched_getparam(0, &mut param) } != 0 {
        return None;
    }
    Some((policy, param.sched_priority))
}

/// Give every thread of the process `pid` (a domain's) the scheduling `(policy, priority)`: a real-time caller's,
/// so the domain it waits for is not ranked below every ordinary process. Needs `CAP_SYS_NICE` or a high enough
/// `RLIMIT_RTPRIO`.
pub fn schedule_process(pid: i32, (policy, priority): (i32, i32)) -> io::Result<()> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<i32>() else { continue };
        let param = libc::sched_param { sched_priority: priority };
        // SAFETY: sched_setscheduler reads one valid sched_param; a thread that has exited fails with ESRCH.
        if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Let the thread `tid` (a domain's serving thread; a process's first thread has the process's id) run on `cpu`
/// only.
pub fn pin(tid: i32, cpu: usize) -> io::Result<()> {
    confine(tid, &[cpu])
}

/// Let the thread `tid` run on the processors `cpus` only.
pub fn confine(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: an all-zero `cpu_set_t` is the empty set (it is a plain bit array).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: `cpu` is below `CPU_SETSIZE` (checked above), so the bit is inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    write_set(tid, &set)
}

/// The processors thread `tid` may run on (0: the calling thread), in ascending order.
pub fn affinity(tid: i32) -> io::Result<Vec<usize>> {
    let set = read_set(tid)?;
    // SAFETY: every index tested is below `CPU_SETSIZE`, inside `set`.
    Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
}

fn read_set(tid: i32) -> io::Result<libc::cpu_set_t> {
    // SAFETY: an all-zero `cpu_set_t` is the empty set (it is a plain bit array).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed; the kernel writes at most that much into it.
    let rc = unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(set)
}

fn write_set(tid: i32, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: `set` is a valid, initialised `cpu_set_t` of the size passed; the kernel only reads it.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread, held on the processor it runs on until this is dropped (on the same thread), when it may
/// run where it could before.
#[derive(Debug)]
#[must_use = "the thread is let go when this is dropped"]
pub struct Held {
    before: libc::cpu_set_t,
    /// Dropped on the thread it holds: `sched_setaffinity(0, ...)` means the calling thread.
    _this_thread: PhantomData<*const ()>,
}

/// Hold the calling thread on the processor it runs on now. `None` when it may run on that processor only anyway,
/// or when the system does not say which processor that is.
pub fn hold_here() -> io::Result<Option<Held>> {
    let Some(cpu) = current_cpu() else { return Ok(None) };
    let before = read_set(0)?;
    // SAFETY: `before` is an initialised `cpu_set_t`; `CPU_COUNT` only reads it.
    if unsafe { libc::CPU_COUNT(&before) } <= 1 {
        return Ok(None);
    }
    pin(0, cpu)?;
    Ok(Some(Held { before, _this_thread: PhantomData }))
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Err(e) = write_set(0, &self.before) {
            // Its processor set changed under it (a cgroup's, say) so that none it had is left: it keeps the one.
            tracing::warn!(error = %e, "cannot let a held thread run where it could before");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_process_pinned_runs_on_one_processor_and_confined_again_on_all_it_had() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let pid = child.id() as i32;
        let cpu = current_cpu().expect("sched_getcpu");
        let before = affinity(pid);
        let pinned = pin(pid, cpu).map(|()| affinity(pid));
        let restored = before.as_ref().map(|b| confine(pid, b).map(|()| affinity(pid)));
        let _ = child.kill();
        let _ = child.wait();
        let restored = restored.expect("affinity").expect("confine").expect("affinity");
        let before = before.expect("affinity");
        assert!(before.contains(&cpu), "a child may run where its parent runs");
        assert_eq!(pinned.expect("pin").expect("affinity"), vec![cpu]);
        assert_eq!(restored, before);
    }

    #[test]
    fn a_held_thread_runs_on_its_processor_only_and_where_it_could_when_let_go() {
        // A thread of its own, so the test harness's threads keep their processors whatever happens.
        std::thread::spawn(|| {
            let before = affinity(0).expect("affinity");
            let held = hold_here().expect("hold");
            let during = affinity(0).expect("affinity");
            let cpu = current_cpu().expect("sched_getcpu");
            drop(held);
            let after = affinity(0).expect("affinity");
            if before.len() > 1 {
                assert_eq!(during, vec![cpu], "held on the processor it ran on");
            } else {
                assert_eq!(during, before, "a thread that may run on one processor only is left as it is");
            }
            assert_eq!(after, before);
        })
        .join()
        .expect("the holding thread");
    }

    #[test]
    fn a_thread_that_may_run_on_one_processor_only_is_not_held() {
        std::thread::spawn(|| {
            let cpu = current_cpu().expect("sched_getcpu");
            pin(0, cpu).expect("pin");
            assert!(hold_here().expect("hold").is_none());
            assert_eq!(affinity(0).expect("affinity"), vec![cpu]);
        })
        .join()
        .expect("the pinned thread");
    }

    #[test]
    fn pinning_to_a_processor_beyond_the_set_is_refused() {
        let err = pin(std::process::id() as i32, libc::CPU_SETSIZE as usize).expect_err("refused");
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }
}
