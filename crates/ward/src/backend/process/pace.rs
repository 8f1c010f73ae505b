//! How a process domain and its caller wait for each other: spinning on two processors, or handing one processor
//! over for each call (`ward::placement`), and, for an adaptive wait, which of the two the calls' pattern favours.
//!
//! Spinning pays when calls come close together: the domain, still spinning after its last reply, sees the next
//! request at once. When calls come further apart than the domain spins, every call finds the domain asleep and
//! pays a wake-up across processors (tens of microseconds on a virtual machine), and the spinning only burns both
//! processors; handing the caller's processor over is then cheaper. A call that finds the domain asleep costs a
//! spinning caller several times what a hand-over costs, and one that finds it awake a fraction of it, so handing
//! over pays once about a quarter of the calls find it asleep. Only for short calls, though: a call that takes
//! [`LONG_CALL`] or more loses little to a wake-up, and the domain may have work to do after its reply (the arena's
//! protection changes after a frame, say) that runs beside the caller on another processor but in its way on the
//! same one. An adaptive wait starts spinning, hands over once [`ASLEEP_OF_RECENT`] of the last [`RECENT`] calls
//! found the domain asleep and were short, and goes back to spinning once
//! [`AGREE`] calls in a row came within a short gap of the reply before them ([`short_gap`]: well inside the time
//! the domain spins, so a spinning domain would surely have been awake for each). Bursts of calls with pauses
//! between them hand over only when the pauses are frequent, and go back only when the bursts are long, so the
//! choice does not flap between the two.
//!
//! On a busy machine spinning does not pay at all: the waits of both sides stop spinning as soon as the other side
//! cannot be running (`ward_xpc::ring`, "Spinning only while it can pay"), and each call then costs two wake-ups.
//! Handing over costs less, so an adaptive wait counts a call whose wait for the reply was cut short so for handing
//! over, however long it took. Calls back to back still take it back to spinning, crowded machine or not: their
//! waits end within the first turns, before any look, and a wait that is cut short later sleeps at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ward_xpc::layout::WAIT_FLAG_NO_RUNQUEUE;
use ward_xpc::runqueue;
use ward_xpc::Region;

use super::{placement, ProcessBackend};

/// Consecutive calls close together that take an adaptive wait from handing over back to spinning.
pub(super) const AGREE: u8 = 8;
/// One bit per call an adaptive wait that spins looks back on ...
type Recent = u16;
pub(super) const RECENT: u32 = Recent::BITS;
/// ... and how many of them must have found the domain asleep for it to hand over.
pub(super) const ASLEEP_OF_RECENT: u32 = 4;
const _: () = assert!(ASLEEP_OF_RECENT <= RECENT);
/// A call that found the domain asleep and took this long or longer (request to reply) does not argue for handing
/// over: two wake-ups across processors (30 to 60 us here) are a small part of it.
pub(super) const LONG_CALL: Duration = Duration::from_micros(200);
/// The longest gap [`short_gap`] gives.
const SHORT_GAP_MAX: Duration = Duration::from_micros(10);
/// What one turn of a spin (a pause and a look at the ring) is taken to cost at least, for [`short_gap`]. A bare
/// pause-and-load loop takes 24 ns a turn on the machines here, so a gap measured against this is well inside the
/// spin.
const SPIN_TURN_AT_LEAST: Duration = Duration::from_nanos(5);

/// A call this soon after the previous reply would have found a domain that spins `spin` turns still spinning.
pub(crate) fn short_gap(spin: u32) -> Duration {
    SPIN_TURN_AT_LEAST.saturating_mul(spin).min(SHORT_GAP_MAX)
}

/// How the two sides wait during a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PaceMode {
    /// Each on its own processor, spinning a while before sleeping (or, for `wait = "poll"`, for as long as the
    /// other side can be running: see `ward_xpc::ring`).
    Spin,
    /// The domain runs on the caller's processor and both sleep at once.
    HandOver,
}

/// What the policy asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pacing {
    Fixed(PaceMode),
    /// Chosen from the calls' pattern (`wait = "adaptive"`); a call within `short_gap` of the last reply counts
    /// for spinning.
    Learned {
        short_gap: Duration,
    },
}

/// How a request found the domain while spinning.
#[derive(Debug, Clone, Copy)]
enum Found {
    /// Spinning for it.
    Awake,
    /// Asleep: it was woken at this time.
    Asleep(Instant),
}

#[derive(Debug)]
pub(super) struct Pace {
    /// `Some(short gap)` when the mode is learned.
    learned: Option<Duration>,
    mode: PaceMode,
    /// While handing over: calls in a row that came close together.
    in_a_row: u8,
    /// While spinning: one bit per recent call, newest lowest, set when it found the domain asleep and was short.
    asleep: Recent,
    /// While spinning: how the call in flight found the domain (its vote waits for the reply).
    found: Option<Found>,
    /// When the last reply came, while handing over.
    replied_at: Option<Instant>,
}

impl Pace {
    pub(super) fn new(pacing: Pacing) -> Self {
        let (learned, mode) = match pacing {
            Pacing::Fixed(mode) => (None, mode),
            Pacing::Learned { short_gap } => (Some(short_gap), PaceMode::Spin),
        };
        Pace { learned, mode, in_a_row: 0, asleep: 0, found: None, replied_at: None }
    }

    pub(super) fn mode(&self) -> PaceMode {
        self.mode
    }

    /// Keep to `mode` from now on (when the domain cannot be moved, say).
    pub(super) fn fix(&mut self, mode: PaceMode) {
        *self = Pace::new(Pacing::Fixed(mode));
    }

    /// A request the caller will wait for is about to go out: the mode to send it in. `now` is read only while
    /// handing over, where a call costs microseconds anyway.
    pub(super) fn call(&mut self, now: impl FnOnce() -> Instant) -> PaceMode {
        if let (Some(gap), PaceMode::HandOver) = (self.learned, self.mode) {
            let short = self.replied_at.is_some_and(|t| now().saturating_duration_since(t) < gap);
            self.in_a_row = if short { self.in_a_row + 1 } else { 0 };
            if self.in_a_row >= AGREE {
                self.switch(PaceMode::Spin);
            }
        }
        self.mode
    }

    /// The request went out; `woke`: the domain was asleep and had to be woken. `now` is read only then, when the
    /// call costs a wake-up anyway.
    pub(super) fn published(&mut self, woke: bool, now: impl FnOnce() -> Instant) {
        if self.learned.is_none() || self.mode != PaceMode::Spin {
            return;
        }
        // Its vote comes with the reply, once its length is known and whether the wait for it was cut short.
        self.found = Some(if woke { Found::Asleep(now()) } else { Found::Awake });
    }

    /// A reply came; `cut_short`: the wait for it stopped spinning early because the domain could not be running
    /// (the machine was crowded, or the domain waited on the caller's processor).
    pub(super) fn replied(&mut self, now: impl FnOnce() -> Instant, cut_short: bool) {
        if self.learned.is_none() {
            return;
        }
        match self.mode {
            PaceMode::HandOver => self.replied_at = Some(now()),
            PaceMode::Spin => match self.found.take() {
                Some(Found::Asleep(woken)) => {
                    let short = now().saturating_duration_since(woken) < LONG_CALL;
                    self.vote(short || cut_short);
                }
                Some(Found::Awake) => self.vote(cut_short),
                None => {}
            },
        }
    }

    /// While spinning: one more call, which found the domain asleep and was short (`for_hand_over`) or not.
    fn vote(&mut self, for_hand_over: bool) {
        self.asleep = (self.asleep << 1) | Recent::from(for_hand_over);
        if self.asleep.count_ones() >= ASLEEP_OF_RECENT {
            self.switch(PaceMode::HandOver);
        }
    }

    fn switch(&mut self, to: PaceMode) {
        self.mode = to;
        self.in_a_row = 0;
        self.asleep = 0;
        self.found = None;
        self.replied_at = None;
    }
}

/// Say once per process, at debug level, that this side's waits, or a domain's, cannot read the machine's run
/// queue and so spin briefly only, whatever the policy's `spin`.
fn say_if_waits_spin_blind(region: &Region) {
    static HOST_SAID: AtomicBool = AtomicBool::new(false);
    static DOMAIN_SAID: AtomicBool = AtomicBool::new(false);
    if !HOST_SAID.load(Ordering::Relaxed) && !HOST_SAID.swap(true, Ordering::Relaxed) {
        if let Some(why) = runqueue::unavailable() {
            tracing::debug!(why, "the host's waits for replies cannot see whether the domain runs: they spin briefly");
        }
    }
    if !DOMAIN_SAID.load(Ordering::Relaxed)
        && region.domain_wait_stats().flags & WAIT_FLAG_NO_RUNQUEUE != 0
        && !DOMAIN_SAID.swap(true, Ordering::Relaxed)
    {
        tracing::debug!("a domain's waits for requests cannot read the run queue: they spin briefly");
    }
}

/// Waits for a reply while handing over that [`Stay`] looks back on ...
type Waits = u16;
pub(super) const WAITS: u32 = Waits::BITS;
/// ... how many of them must have woken the caller on another processor for it to be held on its own ...
pub(super) const MOVED_OF_WAITS: u32 = 3;
const _: () = assert!(MOVED_OF_WAITS <= WAITS);
/// ... and for how many waits it is held before it is watched again.
pub(super) const HOLD_FOR: u32 = 256;

/// Whether a caller that hands over is held on its processor while it sleeps for a reply (`placement::hold_here`).
///
/// The scheduler wakes a sleeping thread where it thinks best; a caller woken on an idle processor rather than the
/// one its domain ran on pays an inter-processor wake-up, and moves its domain on the next call. Some hosts are
/// never moved (a bare loop of calls), others often (sox: a quarter of its waits), and holding costs two
/// `sched_setaffinity` calls a wait (3 us here), so a caller is held only once [`MOVED_OF_WAITS`] of its last
/// [`WAITS`] waits woke it elsewhere, for [`HOLD_FOR`] waits, and then watched afresh.
#[derive(Debug, Default)]
pub(super) struct Stay {
    /// One bit per recent wait while not holding, newest lowest, set when it woke the caller on another processor.
    moved: Waits,
    /// Waits left to hold the caller for.
    holding: u32,
    /// Holding failed once (a processor set that forbids it): never again.
    cannot: bool,
}

impl Stay {
    /// Whether to hold the caller during the next wait.
    pub(super) fn hold(&self) -> bool {
        self.holding > 0 && !self.cannot
    }

    /// A wait for a reply while handing over ended; `moved`: the caller woke on another processor than it slept on.
    pub(super) fn waited(&mut self, moved: bool) {
        if self.holding > 0 {
            self.holding -= 1;
            return;
        }
        self.moved = (self.moved << 1) | Waits::from(moved);
        if self.moved.count_ones() >= MOVED_OF_WAITS {
            self.moved = 0;
            self.holding = HOLD_FOR;
        }
    }

    /// Holding the caller failed: wait unheld from now on.
    pub(super) fn give_up(&mut self) {
        self.cannot = true;
    }
}

impl ProcessBackend {
    /// A request the caller will wait for is about to go out: choose how the two sides wait for it (`pace`) and
    /// place the domain to match. Before the record is made, which says how the domain is to wait after it.
    pub(super) fn pace_request(&mut self) {
        let before = self.pace.mode();
        match self.pace.call(Instant::now) {
            PaceMode::HandOver => self.move_to_caller(),
            PaceMode::Spin if before == PaceMode::HandOver => self.release_domain(),
            PaceMode::Spin => {}
        }
    }

    /// Publish a request the caller will wait for, telling `pace` whether the domain had to be woken for it.
    pub(super) fn publish_request(&mut self) {
        let woke = self.requests.publish();
        if woke {
            // A wake-up costs microseconds: a look at the domain's statistics is nothing beside it.
            say_if_waits_spin_blind(&self.region);
        }
        self.pace.published(woke, Instant::now);
    }

    /// Move the domain to the calling thread's processor, so the wake-up and the reply's are hand-overs on one
    /// processor (`super::placement`). Only when the processor changed.
    pub(super) fn move_to_caller(&mut self) {
        if self.cannot_move {
            return;
        }
        let (Some(live), Some(cpu)) = (self.live.as_mut(), placement::current_cpu()) else {
            return;
        };
        if live.cpu == Some(cpu) {
            return;
        }
        if live.spread.is_none() {
            live.spread = placement::affinity(live.pid).ok();
        }
        match placement::pin(live.pid, cpu) {
            Ok(()) => live.cpu = Some(cpu),
            // Gone: the wait that follows finds out why.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => {
                // A processor set that forbids it (a cgroup's, say). Sleeping at once still holds for `sleep`; an
                // adaptive wait goes back to spinning, which pays off without a move.
                tracing::warn!(error = %e, "cannot move the domain to its caller's processor; it stays where the \
                    scheduler puts it");
                self.cannot_move = true;
                if matches!(self.cfg.pacing, Pacing::Learned { .. }) {
                    self.pace.fix(PaceMode::Spin);
                }
            }
        }
    }

    /// Let the domain run where it could before it was first moved (where this thread may, if that was not read).
    fn release_domain(&mut self) {
        let Some(live) = self.live.as_mut() else { return };
        if live.cpu.take().is_none() {
            return;
        }
        let Some(spread) = live.spread.clone().or_else(|| placement::affinity(0).ok()) else { return };
        if let Err(e) = placement::confine(live.pid, &spread) {
            tracing::debug!(error = %e, "cannot give the domain back its processors");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_micros(10);
    const LEARNED: Pacing = Pacing::Learned { short_gap: SHORT };

    #[test]
    fn the_short_gap_grows_with_the_spin_up_to_its_bound() {
        assert_eq!(short_gap(0), Duration::ZERO);
        assert_eq!(short_gap(100), Duration::from_nanos(500));
        assert_eq!(short_gap(2000), SHORT_GAP_MAX);
        assert_eq!(short_gap(u32::MAX), SHORT_GAP_MAX);
    }

    /// A call while spinning that found the domain asleep (`asleep`) or awake.
    fn spinning_call(p: &mut Pace, asleep: bool) -> PaceMode {
        spinning_call_taking(p, asleep, Duration::from_micros(20))
    }

    /// The same, for a call that takes `took` from request to reply.
    fn spinning_call_taking(p: &mut Pace, asleep: bool, took: Duration) -> PaceMode {
        spinning_call_cut(p, asleep, took, false)
    }

    /// The same, `cut_short`: the wait for the reply stopped spinning early (a crowded machine).
    fn spinning_call_cut(p: &mut Pace, asleep: bool, took: Duration, cut_short: bool) -> PaceMode {
        let start = Instant::now();
        let mode = p.call(|| panic!("no clock read while spinning"));
        p.published(asleep, || if asleep { start } else { panic!("no clock read for a domain found awake") });
        p.replied(|| if asleep { start + took } else { panic!("no clock read for a domain found awake") }, cut_short);
        mode
    }

    #[test]
    fn long_calls_that_find_the_domain_asleep_keep_it_spinning() {
        let mut p = Pace::new(LEARNED);
        for _ in 0..10 * RECENT {
            assert_eq!(spinning_call_taking(&mut p, true, LONG_CALL), PaceMode::Spin);
        }
        for _ in 0..ASLEEP_OF_RECENT {
            spinning_call_taking(&mut p, true, LONG_CALL / 2);
        }
        assert_eq!(p.mode(), PaceMode::HandOver, "short ones hand over");
    }

    /// A call while handing over that came `gap` after the previous reply; its own reply comes at once.
    fn handed_call(p: &mut Pace, at: &mut Instant, gap: Duration) -> PaceMode {
        *at += gap;
        let t = *at;
        let mode = p.call(|| t);
        p.replied(|| t, false);
        mode
    }

    #[test]
    fn an_adaptive_wait_hands_over_once_a_quarter_of_recent_calls_find_the_domain_asleep() {
        let mut p = Pace::new(LEARNED);
        // One call in eight finding it asleep (a pause now and then between bursts): spinning pays.
        for i in 0..10 * RECENT {
            assert_eq!(spinning_call(&mut p, i % 8 == 7), PaceMode::Spin);
        }
        // One in three: it hands over, at the call that makes four of the last sixteen.
        let mut calls = 0;
        while p.mode() == PaceMode::Spin {
            assert_eq!(
                spinning_call(&mut p, calls % 3 == 2),
                PaceMode::Spin,
                "the call that tips it went out spinning"
            );
            calls += 1;
            assert!(calls <= RECENT, "still spinning after {calls} calls, a third of them finding the domain asleep");
        }
        assert_eq!(p.mode(), PaceMode::HandOver);
    }

    #[test]
    fn calls_that_all_find_the_domain_asleep_hand_over_after_a_few() {
        let mut p = Pace::new(LEARNED);
        for _ in 0..ASLEEP_OF_RECENT - 1 {
            spinning_call(&mut p, true);
        }
        assert_eq!(p.mode(), PaceMode::Spin);
        spinning_call(&mut p, true);
        assert_eq!(p.mode(), PaceMode::HandOver);
    }

    #[test]
    fn an_adaptive_wait_goes_back_to_spinning_after_calls_in_a_row_come_close_together() {
        let mut p = Pace::new(LEARNED);
        for _ in 0..ASLEEP_OF_RECENT {
            spinning_call(&mut p, true);
        }
        assert_eq!(p.mode(), PaceMode::HandOver);
        let mut at = Instant::now();
        let long = SHORT * 10;
        let short = SHORT / 10;
        // The first call has no reply before it to measure from; long gaps keep handing over.
        for _ in 0..3 * AGREE {
            assert_eq!(handed_call(&mut p, &mut at, long), PaceMode::HandOver);
        }
        for _ in 0..AGREE - 1 {
            assert_eq!(handed_call(&mut p, &mut at, short), PaceMode::HandOver);
        }
        assert_eq!(handed_call(&mut p, &mut at, long), PaceMode::HandOver, "a long gap starts the count again");
        for _ in 0..AGREE - 1 {
            assert_eq!(handed_call(&mut p, &mut at, short), PaceMode::HandOver);
        }
        assert_eq!(handed_call(&mut p, &mut at, short), PaceMode::Spin, "the call that tips it goes out spinning");
        assert_eq!(p.mode(), PaceMode::Spin);
    }

    #[test]
    fn gaps_between_the_two_bounds_keep_whichever_mode_is_in_force() {
        // Calls that come soon enough to find a spinning domain awake, but not within the short gap.
        let mut p = Pace::new(LEARNED);
        for _ in 0..100 {
            assert_eq!(spinning_call(&mut p, false), PaceMode::Spin);
        }
        for _ in 0..ASLEEP_OF_RECENT {
            spinning_call(&mut p, true);
        }
        let mut at = Instant::now();
        for _ in 0..100 {
            assert_eq!(handed_call(&mut p, &mut at, SHORT * 2), PaceMode::HandOver);
        }
    }

    #[test]
    fn calls_whose_waits_are_cut_short_hand_over_whatever_they_take() {
        let mut p = Pace::new(LEARNED);
        // Calls that found the domain awake, or asleep and long, but whose waits stopped spinning early because
        // the domain could not be running (a crowded machine): they count for handing over.
        for i in 0..ASLEEP_OF_RECENT - 1 {
            assert_eq!(spinning_call_cut(&mut p, i % 2 == 0, LONG_CALL * 10, true), PaceMode::Spin);
        }
        assert_eq!(p.mode(), PaceMode::Spin);
        spinning_call_cut(&mut p, false, LONG_CALL, true);
        assert_eq!(p.mode(), PaceMode::HandOver);
        // Not cut short, the same calls keep it spinning.
        let mut p = Pace::new(LEARNED);
        for i in 0..10 * RECENT {
            assert_eq!(spinning_call_cut(&mut p, i % 2 == 0, LONG_CALL * 10, false), PaceMode::Spin);
        }
    }

    #[test]
    fn fixed_modes_never_change() {
        let mut spin = Pace::new(Pacing::Fixed(PaceMode::Spin));
        let mut hand = Pace::new(Pacing::Fixed(PaceMode::HandOver));
        let mut at = Instant::now();
        for _ in 0..10 * AGREE {
            assert_eq!(spinning_call(&mut spin, true), PaceMode::Spin);
            assert_eq!(handed_call(&mut hand, &mut at, Duration::ZERO), PaceMode::HandOver);
        }
    }

    #[test]
    fn a_caller_that_is_rarely_woken_elsewhere_is_never_held() {
        let mut stay = Stay::default();
        for wait in 0..100 * WAITS {
            assert!(!stay.hold());
            stay.waited(wait % WAITS == 0);
        }
    }

    #[test]
    fn a_caller_often_woken_elsewhere_is_held_for_a_while_then_watched_again() {
        let mut stay = Stay::default();
        for _ in 0..MOVED_OF_WAITS - 1 {
            stay.waited(true);
            assert!(!stay.hold());
        }
        stay.waited(true);
        for _ in 0..HOLD_FOR {
            assert!(stay.hold(), "held");
            stay.waited(false);
        }
        assert!(!stay.hold(), "watched again");
        for _ in 0..MOVED_OF_WAITS - 1 {
            stay.waited(true);
        }
        assert!(!stay.hold(), "the waits before the hold do not count again");
        stay.waited(true);
        assert!(stay.hold());
    }

    #[test]
    fn a_caller_that_cannot_be_held_is_not_held_again() {
        let mut stay = Stay::default();
        for _ in 0..MOVED_OF_WAITS {
            stay.waited(true);
        }
        assert!(stay.hold());
        stay.give_up();
        for _ in 0..HOLD_FOR + WAITS {
            assert!(!stay.hold());
            stay.waited(true);
        }
    }
}
