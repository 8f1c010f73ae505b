//! Deadlines that learn: the rule is that a function's call may take [`FACTOR`] times the second longest of the
//! function's last [`WINDOW`] successful calls, kept between the policy's floor and ceiling, once [`MIN_SAMPLES`]
//! calls have been seen; before that, its first deadline (a class's default for the call, else the ceiling). A
//! policy that fixes the deadline (`deadline_ms`) turns all of this off.
//!
//! Why so: a hang in a call that usually takes microseconds (an audio block) is then caught at the floor, tens of
//! times sooner than a fixed deadline made for the slowest call of any plugin, while a call that is slow from the
//! start (a first frame) is judged by the class's generous default. The second longest, not the longest, so one
//! odd call (a page fault storm, a preemption on a loaded machine) does not raise the deadline for 64 calls; four
//! times it, so the spread of a loaded machine stays inside. The numbers are argued in DECISIONS.md.
//!
//! Cost on the call path: [`CallTimes::record`] stores one number and, only when that number is a new high or the
//! window has turned a sixteenth of the way, scans 64 numbers; no allocation, no lock but the domain's, which the
//! call holds already. The duration comes from the call's own deadline (see `ward_xpc::Deadline::counted`), so a
//! call answered before its first look at the clock reads no clock to be learned from.

use std::time::Duration;

use crate::policy::{ExtensionPolicy, FunctionPolicy};

/// How many recent successful calls a function's deadline follows.
pub(crate) const WINDOW: usize = 64;
/// Calls seen before the deadline is learned.
pub(crate) const MIN_SAMPLES: u32 = 8;
/// The learned deadline is this many times the second longest recent call.
pub(crate) const FACTOR: u32 = 4;
/// A function that fails again before this many of its calls succeeded since its last failure "fails again after
/// its recovery": counted in a row towards `max_failures_in_row`. A plugin restarted without its history (past its
/// bounds, or once a replayed history brought the fault back) loses the state that made it fail and may pass a few
/// calls before it fails again the same way (one that hangs from its tenth block hangs again ten blocks into each
/// incarnation); a transient fault strikes once.
pub(crate) const FAILS_AGAIN_WITHIN: u32 = WINDOW as u32;
/// A full scan of the window at least this often (samples), so a deadline also comes down when slow calls leave it.
const RESCAN: u32 = 16;

/// What one function's recent calls took, in microseconds (saturating at about 71 minutes).
#[derive(Clone)]
pub(crate) struct CallTimes {
    micros: [u32; WINDOW],
    /// The slot the next sample goes to.
    next: usize,
    /// Samples recorded since the last [`CallTimes::forget`] (saturating).
    seen: u32,
    /// The second longest in the window, as of the last scan.
    high: u32,
    /// Gated calls counted, to time one in [`GATED_SAMPLE`] of them once the deadline is learned.
    gated: u32,
    /// The latest sample: what the latest timed call took (a history entry's replay charge).
    last: u32,
}

/// Once learned, one gated (mpk) call in this many is timed: those calls have no deadline object to read the time
/// from, and two clock reads are a good part of such a call.
const GATED_SAMPLE: u32 = 16;

impl Default for CallTimes {
    fn default() -> Self {
        CallTimes { micros: [0; WINDOW], next: 0, seen: 0, high: 0, gated: 0, last: 0 }
    }
}

impl CallTimes {
    /// A successful call took `took`.
    pub fn record(&mut self, took: Duration) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        self.micros[self.next] = micros;
        self.last = micros;
        self.next = (self.next + 1) % WINDOW;
        self.seen = self.seen.saturating_add(1);
        if micros > self.high || self.next.is_multiple_of(RESCAN as usize) {
            self.high = second_largest(&self.micros[..(self.seen as usize).min(WINDOW)]);
        }
    }

    /// What the latest timed call took: the call just made, unless it was a gated call left untimed (then the
    /// latest one timed stands for it).
    pub fn last(&self) -> Duration {
        Duration::from_micros(u64::from(self.last))
    }

    /// Start learning again: what was seen no longer says what the calls take (a call timed out at the learned
    /// deadline and then succeeded, given longer).
    pub fn forget(&mut self) {
        self.next = 0;
        self.seen = 0;
        self.high = 0;
    }

    /// The learned deadline before the floor and ceiling apply; `None` until enough calls were seen.
    pub fn learned(&self) -> Option<Duration> {
        (self.seen >= MIN_SAMPLES).then(|| Duration::from_micros(u64::from(self.high) * u64::from(FACTOR)))
    }

    /// Whether this gated call should be timed: every one until the deadline is learned, then one in
    /// [`GATED_SAMPLE`].
    pub fn time_gated(&mut self) -> bool {
        self.gated = self.gated.wrapping_add(1);
        self.seen < MIN_SAMPLES || self.gated.is_multiple_of(GATED_SAMPLE)
    }
}

/// The second largest of `values` (the largest when there is one).
fn second_largest(values: &[u32]) -> u32 {
    let (mut first, mut second) = (0u32, 0u32);
    for &v in values {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    if values.len() < 2 {
        first
    } else {
        second
    }
}

/// Where a call's deadline came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeadlineSource {
    /// The policy's `deadline_ms` (the function's or the extension's): nothing is learned.
    Fixed,
    /// Too few calls seen yet: the first deadline.
    First,
    /// Learned from the function's recent calls.
    Learned,
}

/// The deadline of a call of a function with policy `function` of an extension with policy `extension`, whose
/// recent calls are `times`.
pub(crate) fn deadline(
    function: &FunctionPolicy,
    extension: &ExtensionPolicy,
    times: &CallTimes,
) -> (Duration, DeadlineSource) {
    if let Some(fixed) = function.deadline {
        return (fixed, DeadlineSource::Fixed);
    }
    if !extension.deadline_learned {
        return (extension.deadline, DeadlineSource::Fixed);
    }
    match times.learned() {
        Some(learned) => (bounded(learned, extension), DeadlineSource::Learned),
        None => (first(function, extension), DeadlineSource::First),
    }
}

/// The deadline of a call before anything is learned (or after a false alarm): the first deadline, bounded.
pub(crate) fn first(function: &FunctionPolicy, extension: &ExtensionPolicy) -> Duration {
    bounded(function.first_deadline.unwrap_or(extension.deadline_ceiling), extension)
}

/// `d` kept between the extension's floor and ceiling; the ceiling wins when they cross.
fn bounded(d: Duration, extension: &ExtensionPolicy) -> Duration {
    d.max(extension.deadline_floor).min(extension.deadline_ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nothing_is_learned_before_min_samples_calls() {
        let mut t = CallTimes::default();
        for _ in 0..MIN_SAMPLES - 1 {
            t.record(ms(1));
        }
        assert_eq!(t.learned(), None);
        t.record(ms(1));
        assert_eq!(t.learned(), Some(ms(4)));
    }

    #[test]
    fn one_odd_call_does_not_raise_the_deadline_but_two_do() {
        let mut t = CallTimes::default();
        for _ in 0..WINDOW {
            t.record(ms(2));
        }
        t.record(ms(500));
        assert_eq!(t.learned(), Some(ms(8)));
        t.record(ms(300));
        assert_eq!(t.learned(), Some(ms(1200)));
    }

    #[test]
    fn slow_calls_that_leave_the_window_stop_counting() {
        let mut t = CallTimes::default();
        t.record(ms(100));
        t.record(ms(100));
        for _ in 0..WINDOW + RESCAN as usize {
            t.record(ms(1));
        }
        assert_eq!(t.learned(), Some(ms(4)));
    }

    #[test]
    fn forget_starts_learning_again() {
        let mut t = CallTimes::default();
        for _ in 0..WINDOW {
            t.record(ms(1));
        }
        t.forget();
        assert_eq!(t.learned(), None);
        for _ in 0..MIN_SAMPLES {
            t.record(ms(50));
        }
        assert_eq!(t.learned(), Some(ms(200)));
    }

    #[test]
    fn the_policy_bounds_and_fixes_deadlines() {
        let ext = ExtensionPolicy::default();
        let class = FunctionPolicy { first_deadline: Some(ms(1000)), ..FunctionPolicy::default() };
        let mut t = CallTimes::default();
        assert_eq!(deadline(&class, &ext, &t), (ms(1000), DeadlineSource::First));
        assert_eq!(deadline(&FunctionPolicy::default(), &ext, &t), (ext.deadline_ceiling, DeadlineSource::First));
        for _ in 0..MIN_SAMPLES {
            t.record(Duration::from_micros(30));
        }
        assert_eq!(deadline(&class, &ext, &t), (ext.deadline_floor, DeadlineSource::Learned));
        for _ in 0..WINDOW {
            t.record(Duration::from_secs(5));
        }
        assert_eq!(deadline(&class, &ext, &t), (ext.deadline_ceiling, DeadlineSource::Learned));

        let fixed_ext = ExtensionPolicy { deadline: ms(700), deadline_learned: false, ..ExtensionPolicy::default() };
        assert_eq!(deadline(&class, &fixed_ext, &t), (ms(700), DeadlineSource::Fixed));
        let fixed_fn = FunctionPolicy { deadline: Some(ms(90)), ..class };
        assert_eq!(deadline(&fixed_fn, &ext, &t), (ms(90), DeadlineSource::Fixed));
    }
}
