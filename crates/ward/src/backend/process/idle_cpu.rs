//! CPU a domain uses between calls: a fault past the policy's budget (`idle_cpu_ms` per second).
//!
//! The rule: every [`super::monitor::PERIOD`] the monitor thread reads the CPU time of the domain's threads other
//! than the one that serves calls (`/proc/PID/stat` for the whole process, dead threads included, less
//! `/proc/PID/task/PID/stat` for the serving thread, which is the process's first). An interval between two reads
//! counts as *between calls* when no call was in flight when it began and no call began before it ended, as the
//! host saw it ([`Activity`]). Once such intervals add up to [`WINDOW`], the CPU used in them is checked against
//! the budget for that time; past it, the domain is killed and the fault says how much it used.
//!
//! Why so:
//! - The serving thread is left out because the CPU it uses between calls is ward's: after each reply it spins for
//!   the next request (`spin`, or for as long as that can pay with `wait = "poll"`) and settles the arena. A
//!   plugin's own threads have no business running when it has no call: a thread left spinning after its call
//!   returned is what this catches.
//! - The host's view of calls, not the domain's: the domain could claim to be busy forever. A call the host made
//!   (deferred ones included) counts as in flight until a reply shows that the domain has run it.
//! - Only intervals wholly between calls count, so a call's own work (in worker threads too) is never charged,
//!   however long the call. The price: a host that calls at least once every period never gives the check an
//!   interval, and a domain's threads may burn CPU between such calls unseen (the cgroup's CPU quota bounds them).

use std::fs;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fault::FaultKind;

/// Time between calls over which the budget is checked.
pub(crate) const WINDOW: Duration = Duration::from_secs(1);
/// Clock ticks per second of `/proc/PID/stat` (`USER_HZ`, fixed at 100 in the kernel's ABI).
const TICKS_PER_S: u64 = 100;

/// Whether the host has a call in a domain, as the monitor thread reads it. Written only by the thread that holds
/// the domain, so a plain load and store, no locked instruction on the call path.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// Calls (deferred ones and loads too) the host has sent, counted.
    seq: AtomicU64,
    /// A call sent has not been seen to end yet.
    busy: AtomicBool,
}

impl Activity {
    /// A call (or deferred call, or load) is about to go to the domain.
    pub(crate) fn began(&self) {
        self.seq.store(self.seq.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        self.busy.store(true, Ordering::Release);
    }

    /// The domain has answered everything the host sent (the outermost reply came, which follows every earlier
    /// record), or the incarnation is gone.
    pub(crate) fn settled(&self) {
        self.busy.store(false, Ordering::Release);
    }

    fn read(&self) -> Mark {
        Mark { busy: self.busy.load(Ordering::Acquire), seq: self.seq.load(Ordering::Acquire) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mark {
    seq: u64,
    busy: bool,
}

/// One look at the domain: the host's activity before and after the CPU was read.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    before: Mark,
    cpu: Duration,
}

/// The check of one incarnation.
#[derive(Debug)]
pub(crate) struct IdleCpu {
    pid: i32,
    /// CPU allowed per second between calls.
    budget: Duration,
    last: Option<Sample>,
    /// Time between calls seen since the last check, and the CPU used in it.
    idle: Duration,
    used: Duration,
}

impl IdleCpu {
    pub(crate) fn new(pid: i32, budget_ms_per_s: u64) -> IdleCpu {
        IdleCpu {
            pid,
            budget: Duration::from_millis(budget_ms_per_s),
            last: None,
            idle: Duration::ZERO,
            used: Duration::ZERO,
        }
    }

    /// Look at the domain now: the fault, once it has used more than its budget between calls.
    pub(crate) fn sample(&mut self, at: Instant, activity: &Activity) -> Option<FaultKind> {
        let before = activity.read();
        let cpu = other_threads_cpu(self.pid)?;
        let after = activity.read();
        self.observe(at, before, cpu, after)
    }

    fn observe(&mut self, at: Instant, before: Mark, cpu: Duration, after: Mark) -> Option<FaultKind> {
        let last = self.last.replace(Sample { at, before, cpu });
        let last = last?;
        // Nothing in flight when the interval began, and nothing sent until after its CPU was read.
        let between_calls = !last.before.busy && !after.busy && last.before.seq == after.seq;
        if !between_calls {
            return None;
        }
        self.idle += at.saturating_duration_since(last.at);
        self.used += cpu.saturating_sub(last.cpu);
        if self.idle < WINDOW {
            return None;
        }
        let over = std::mem::take(&mut self.idle);
        let used = std::mem::take(&mut self.used);
        let allowed = self.budget.mul_f64(over.as_secs_f64());
        (used > allowed).then_some(FaultKind::IdleCpu { used, over, allowed })
    }
}

/// CPU used so far by the process's threads other than its first (live and ended ones).
fn other_threads_cpu(pid: i32) -> Option<Duration> {
    let all = stat_cpu(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    let first = stat_cpu(&fs::read_to_string(format!("/proc/{pid}/task/{pid}/stat")).ok()?)?;
    Some(all.saturating_sub(first))
}

/// User and system time of a `stat` line (fields 14 and 15; the name, field 2, may hold spaces and parentheses).
fn stat_cpu(line: &str) -> Option<Duration> {
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis(user.saturating_add(system).saturating_mul(1000 / TICKS_PER_S)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Mark = Mark { seq: 7, busy: false };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Feed samples every 100 ms with the CPU given, the host's activity as `marks` says (before and after).
    fn run(check: &mut IdleCpu, start: Instant, samples: &[(Mark, u64, Mark)]) -> Vec<Option<FaultKind>> {
        samples
            .iter()
            .enumerate()
            .map(|(i, (before, cpu, after))| check.observe(start + ms(100 * i as u64), *before, ms(*cpu), *after))
            .collect()
    }

    #[test]
    fn reads_user_and_system_time_of_a_stat_line() {
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 3 0 1 2 3";
        assert_eq!(stat_cpu(line), Some(ms(2800)));
        assert_eq!(stat_cpu("garbage"), None);
    }

    #[test]
    fn a_thread_burning_between_calls_is_a_fault_after_a_window() {
        let mut check = IdleCpu::new(1, 100);
        let samples: Vec<(Mark, u64, Mark)> = (0..=10).map(|i| (IDLE, 90 * i, IDLE)).collect();
        let out = run(&mut check, Instant::now(), &samples);
        assert!(out[..10].iter().all(Option::is_none), "{out:?}");
        match &out[10] {
            Some(FaultKind::IdleCpu { used, over, allowed }) => {
                assert_eq!((*used, *over, *allowed), (ms(900), ms(1000), ms(100)));
                let text = out[10].as_ref().map(FaultKind::cause).unwrap_or_default();
                assert_eq!(text, "used 900 ms of CPU in 1 s between calls (policy allows 100 ms)");
            }
            other => panic!("no fault after a window of burning: {other:?}"),
        }
    }

    #[test]
    fn cpu_within_the_budget_is_no_fault() {
        let mut check = IdleCpu::new(1, 100);
        let samples: Vec<(Mark, u64, Mark)> = (0..=30).map(|i| (IDLE, 9 * i, IDLE)).collect();
        assert!(run(&mut check, Instant::now(), &samples).iter().all(Option::is_none));
    }

    #[test]
    fn intervals_with_a_call_in_flight_or_begun_are_not_charged() {
        let mut check = IdleCpu::new(1, 100);
        let busy = Mark { seq: 7, busy: true };
        let later = Mark { seq: 8, busy: false };
        // Every interval either starts with a call in flight or sees one begin: 1000 ms of CPU, none charged.
        let samples: Vec<(Mark, u64, Mark)> =
            (0..=40).map(|i| if i % 2 == 0 { (busy, 100 * i, busy) } else { (IDLE, 100 * i, later) }).collect();
        assert!(run(&mut check, Instant::now(), &samples).iter().all(Option::is_none));
        assert_eq!(check.idle, Duration::ZERO);
    }
}
