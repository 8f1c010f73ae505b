//! Deadlines that read the clock only when someone needs the instant.
//!
//! A call's deadline is checked every few hundred spins of a wait; a call whose reply comes before the first
//! check never needs the time at all. Reading the clock costs about 30 ns here, close to a tenth of a whole
//! polling round trip, so a deadline made with [`Deadline::after`] fixes its instant at the first look instead of
//! when the call starts. It starts late by at most the time before that look (the first spin slice, microseconds
//! against deadlines of milliseconds).

use std::time::{Duration, Instant};

/// A deadline fixed now ([`Deadline::at`]) or on first use ([`Deadline::after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    timeout: Duration,
    at: Option<Instant>,
}

impl Deadline {
    /// `timeout` after the first time the instant is asked for.
    pub fn after(timeout: Duration) -> Self {
        Deadline { timeout, at: None }
    }

    /// A fixed instant.
    pub fn at(instant: Instant) -> Self {
        Deadline { timeout: Duration::ZERO, at: Some(instant) }
    }

    /// The instant, fixing it now if nothing has asked before.
    pub fn instant(&mut self) -> Instant {
        *self.at.get_or_insert_with(|| Instant::now() + self.timeout)
    }

    /// Whether it has passed (fixing it first if need be: a deadline first looked at has not passed).
    pub fn passed(&mut self) -> bool {
        match self.at {
            Some(at) => Instant::now() >= at,
            None => {
                self.instant();
                self.timeout.is_zero()
            }
        }
    }

    /// The time counted against a deadline made with [`Deadline::after`] so far: since it was fixed, less what it was moved later by; zero when it was
    /// never fixed (the wait ended before its first look at the clock, within the first spin slice). Reads the
    /// clock only when it was fixed, so timing a fast call costs nothing.
    pub fn counted(&self) -> Duration {
        match self.at {
            Some(at) => (Instant::now() + self.timeout).saturating_duration_since(at),
            None => Duration::ZERO,
        }
    }

    /// Move it later by `by`; one not yet fixed is fixed first, so time already waited still counts.
    pub fn extend(&mut self, by: Duration) {
        let at = self.instant();
        self.at = Some(at + by);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_fixes_its_instant_on_first_use_and_keeps_it() {
        let before = Instant::now();
        let mut d = Deadline::after(Duration::from_secs(5));
        let first = d.instant();
        assert!(first >= before + Duration::from_secs(5));
        assert_eq!(d.instant(), first);
    }

    #[test]
    fn a_fixed_past_instant_has_passed_and_a_far_one_has_not() {
        assert!(Deadline::at(Instant::now()).passed());
        assert!(!Deadline::at(Instant::now() + Duration::from_secs(3600)).passed());
        assert!(!Deadline::after(Duration::from_secs(3600)).passed());
        assert!(Deadline::after(Duration::ZERO).passed());
    }

    #[test]
    fn counted_is_zero_unfixed_and_leaves_out_what_it_was_extended_by() {
        let mut d = Deadline::after(Duration::from_secs(60));
        assert_eq!(d.counted(), Duration::ZERO);
        d.instant();
        d.extend(Duration::from_secs(30));
        assert!(d.counted() < Duration::from_secs(30), "the extension is not counted: {:?}", d.counted());
    }

    #[test]
    fn extend_moves_a_fixed_deadline_and_fixes_an_unfixed_one_first() {
        let now = Instant::now();
        let mut fixed = Deadline::at(now);
        fixed.extend(Duration::from_secs(2));
        assert_eq!(fixed.instant(), now + Duration::from_secs(2));

        let before = Instant::now();
        let mut lazy = Deadline::after(Duration::from_secs(1));
        lazy.extend(Duration::from_secs(2));
        assert!(lazy.instant() >= before + Duration::from_secs(3));
    }
}
