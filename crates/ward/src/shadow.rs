//! The shadow log (Nooks' shadow drivers, in the small): state-establishing calls are recorded with owned copies of
//! their inputs and replayed into a new incarnation, and instance handles are remapped so the host keeps using the
//! handles it already has.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::time::Duration;

use crate::call::{Arg, RetType};
use crate::callback::Callback;

/// An argument kept for replay.
#[derive(Debug, Clone)]
pub(crate) enum OwnedArg {
    I64(i64),
    U64(u64),
    F64(f64),
    F32(f32),
    Ptr(usize),
    In(Vec<u8>),
    /// Outputs are not kept; replay gives the extension a scratch buffer of the same length.
    Out(usize),
    InOut(Vec<u8>),
    Scratch(Vec<u8>),
    Str(CString),
    Handle(u64),
    Callback(Callback),
}

impl OwnedArg {
    pub fn from_arg(arg: &Arg<'_>) -> OwnedArg {
        match arg {
            Arg::I64(v) => OwnedArg::I64(*v),
            Arg::U64(v) => OwnedArg::U64(*v),
            Arg::F64(v) => OwnedArg::F64(*v),
            Arg::F32(v) => OwnedArg::F32(*v),
            Arg::Ptr(v) => OwnedArg::Ptr(*v),
            Arg::In(b) => OwnedArg::In(b.to_vec()),
            Arg::InVec(v) => OwnedArg::In(v.to_vec()),
            Arg::Out(b) => OwnedArg::Out(b.len()),
            Arg::InOut(b) => OwnedArg::InOut(b.to_vec()),
            Arg::Scratch(b) => OwnedArg::Scratch(b.to_vec()),
            Arg::Str(s) => OwnedArg::Str((*s).to_owned()),
            Arg::Handle(h) => OwnedArg::Handle(*h),
            Arg::Callback(c) => OwnedArg::Callback((*c).clone()),
        }
    }

    /// As [`OwnedArg::from_arg`], copying buffers into `spare` ones where there are: a buffer of a dropped history
    /// entry already has its pages, so keeping a frame every call costs a copy and no allocation or page fault.
    /// An `InVec`'s buffer is taken, not copied, and the caller gets the spare (or an empty buffer) in its place.
    fn from_arg_reusing(arg: &mut Arg<'_>, spare: &mut Vec<Vec<u8>>) -> OwnedArg {
        if let Arg::InVec(v) = arg {
            return OwnedArg::In(std::mem::replace(&mut **v, spare.pop().unwrap_or_default()));
        }
        let mut copy = |b: &[u8]| {
            let mut v = spare.pop().unwrap_or_default();
            v.clear();
            v.extend_from_slice(b);
            v
        };
        match arg {
            Arg::In(b) => OwnedArg::In(copy(b)),
            Arg::InOut(b) => OwnedArg::InOut(copy(b)),
            Arg::Scratch(b) => OwnedArg::Scratch(copy(b)),
            other => OwnedArg::from_arg(other),
        }
    }

    /// The buffer this argument owns, if any.
    fn into_buffer(self) -> Option<Vec<u8>> {
        match self {
            OwnedArg::In(b) | OwnedArg::InOut(b) | OwnedArg::Scratch(b) => Some(b),
            _ => None,
        }
    }
}

/// Bytes a call's arguments would hold as a history entry, before any is copied.
fn held_by(args: &[Arg<'_>]) -> usize {
    ENTRY_CHARGE
        + args
            .iter()
            .map(|a| match a {
                Arg::In(b) | Arg::Scratch(b) => b.len(),
                Arg::InVec(v) => v.len(),
                Arg::InOut(b) => b.len(),
                _ => 0,
            })
            .sum::<usize>()
}

/// What each entry is charged besides its buffers, so calls with scalar arguments only count too.
const ENTRY_CHARGE: usize = 64;

/// What replaying a history call is charged besides what the call took: the round trip of a replayed call, which a
/// call answered within the first spin slice (recorded as taking no time) still costs ...
pub(crate) const REPLAY_CALL_CHARGE: Duration = Duration::from_micros(40);
/// ... and the copies of its buffers into the domain and back, at this many bytes a microsecond. Both measured over
/// Debian's plugins in docs/RELIABILITY.md ("History"), rounded so the charge is not below what replay took.
const REPLAY_BYTES_PER_US: u64 = 1000;

/// What replaying a call that took `took` and holds `held` bytes is expected to take.
pub(crate) fn replay_charge(took: Duration, held: usize) -> Duration {
    took + REPLAY_CALL_CHARGE + Duration::from_micros(held as u64 / REPLAY_BYTES_PER_US)
}

/// A call is kept as history only if the bounds hold at least this many calls like it: a shorter window rebuilds
/// little of a stream's state and would cost the copy of every call all the same (a 1080p frame and its output
/// frame are 16.6 MB, more than the default 16 MiB hold: copying them cost a third more time per frame than the
/// call itself crossing, docs/RELIABILITY.md, "History").
pub(crate) const MIN_WINDOW_CALLS: usize = 16;

/// The bounds of a domain's history: the bytes its entries hold, and the time replaying them is expected to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HistoryBounds {
    pub bytes: usize,
    pub replay: Duration,
}

/// What [`ShadowLog::record_history`] did with a data call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    /// Kept, and every history call since the instance was set up is still there.
    Whole,
    /// Kept; the oldest history calls were dropped to make room (a restart rebuilds the state from a window).
    Window,
    /// Not kept: the bounds do not hold [`MIN_WINDOW_CALLS`] calls like this one; the history was dropped.
    Nothing,
}

/// Two arguments that are the same scalar or handle (buffers, strings and callbacks never are).
fn same_scalar(a: &OwnedArg, b: &OwnedArg) -> bool {
    match (a, b) {
        (OwnedArg::I64(x), OwnedArg::I64(y)) => x == y,
        (OwnedArg::U64(x), OwnedArg::U64(y)) => x == y,
        (OwnedArg::F64(x), OwnedArg::F64(y)) => x.to_bits() == y.to_bits(),
        (OwnedArg::F32(x), OwnedArg::F32(y)) => x.to_bits() == y.to_bits(),
        (OwnedArg::Ptr(x), OwnedArg::Ptr(y)) => x == y,
        (OwnedArg::Handle(x), OwnedArg::Handle(y)) => x == y,
        _ => false,
    }
}

/// One recorded call.
#[derive(Debug, Clone)]
pub(crate) struct ShadowEntry {
    /// Index into the domain's symbol table.
    pub symbol: usize,
    pub args: Vec<OwnedArg>,
    pub ret: RetType,
    /// The host handle this call created, if it returned one.
    pub created: Option<u64>,
    /// A data call kept as history (see [`crate::policy::FunctionPolicy::history`]), not a state call.
    pub history: bool,
    /// For a history call: what replaying it is expected to take ([`replay_charge`]).
    pub replay: Duration,
}

impl ShadowEntry {
    /// Bytes this entry holds: its inputs, and a fixed charge for the entry itself (so calls with scalar
    /// arguments only count too).
    fn held(&self) -> usize {
        ENTRY_CHARGE
            + self
                .args
                .iter()
                .map(|a| match a {
                    OwnedArg::In(b) | OwnedArg::InOut(b) | OwnedArg::Scratch(b) => b.len(),
                    _ => 0,
                })
                .sum::<usize>()
    }

    fn uses(&self, handle: u64) -> bool {
        self.created == Some(handle) || self.args.iter().any(|a| matches!(a, OwnedArg::Handle(h) if *h == handle))
    }
}

#[derive(Debug, Default)]
pub(crate) struct ShadowLog {
    entries: VecDeque<ShadowEntry>,
    /// Bytes held by history entries.
    history_bytes: usize,
    /// The replay time charged to history entries.
    history_replay: Duration,
    /// History entries were dropped to stay within the bounds: a restart no longer rebuilds the exact state.
    history_trimmed: bool,
    /// Buffers of dropped history entries, for the next ones to copy into.
    spare: Vec<Vec<u8>>,
    /// The latest replay ([`ShadowLog::take_entries`]) had history in it.
    replayed_history: bool,
}

impl ShadowLog {
    pub fn record(&mut self, entry: ShadowEntry) {
        self.entries.push_back(entry);
    }

    /// Record `entry`, dropping earlier entries of the same function whose first `key` arguments are the same
    /// (a setter: only the last value needs replaying). Only scalars and handles count as the same.
    pub fn record_replacing(&mut self, entry: ShadowEntry, key: usize) {
        let same = |e: &ShadowEntry| {
            e.symbol == entry.symbol
                && e.args.len() >= key
                && entry.args.len() >= key
                && e.args[..key].iter().zip(&entry.args[..key]).all(|(a, b)| same_scalar(a, b))
        };
        self.entries.retain(|e| !same(e));
        self.entries.push_back(entry);
    }

    /// Keep a data call (a call of a function marked history) with copies of its inputs (an `InVec`'s own buffer,
    /// exchanged for a spare one), within `bounds`: the
    /// oldest history entries are dropped until this one fits (the state entries stay, and the order), so the
    /// history is the most recent window of the stream. A call of which the bounds do not hold
    /// [`MIN_WINDOW_CALLS`] drops the whole history and is not copied. `took` is what the call took (zero when it
    /// was answered before its first look at the clock).
    pub fn record_history(
        &mut self,
        symbol: usize,
        args: &mut [Arg<'_>],
        ret: RetType,
        created: Option<u64>,
        took: Duration,
        bounds: HistoryBounds,
    ) -> Kept {
        let held = held_by(args);
        let replay = replay_charge(took, held);
        let window = MIN_WINDOW_CALLS as u32;
        if held.saturating_mul(MIN_WINDOW_CALLS) > bounds.bytes || replay.saturating_mul(window) > bounds.replay {
            // Copying it would only be thrown away with the next call.
            let had = self.history_bytes > 0;
            self.drop_history();
            self.history_trimmed |= had;
            return Kept::Nothing;
        }
        let mut trimmed = false;
        while self.history_bytes + held > bounds.bytes || self.history_replay + replay > bounds.replay {
            if !self.drop_oldest_history() {
                break;
            }
            trimmed = true;
        }
        let args = args.iter_mut().map(|a| OwnedArg::from_arg_reusing(a, &mut self.spare)).collect();
        self.entries.push_back(ShadowEntry { symbol, args, ret, created, history: true, replay });
        self.history_bytes += held;
        self.history_replay += replay;
        self.history_trimmed |= trimmed;
        if self.history_trimmed {
            Kept::Window
        } else {
            Kept::Whole
        }
    }

    /// Drop the oldest history entry, keeping its buffers for reuse; false when there is none.
    fn drop_oldest_history(&mut self) -> bool {
        let Some(at) = self.entries.iter().position(|e| e.history) else { return false };
        if let Some(entry) = self.entries.remove(at) {
            self.forget_history_entry(entry, true);
        }
        true
    }

    fn forget_history_entry(&mut self, entry: ShadowEntry, keep_buffers: bool) {
        self.history_bytes = self.history_bytes.saturating_sub(entry.held());
        self.history_replay = self.history_replay.saturating_sub(entry.replay);
        if keep_buffers {
            // The next entry (of the same function, mostly: the same buffers in the same order) takes them from the
            // top, first argument first.
            self.spare.clear();
            self.spare.extend(entry.args.into_iter().rev().filter_map(OwnedArg::into_buffer));
        }
    }

    /// Drop every history entry (the state entries stay); the next data calls start a new history.
    pub fn drop_history(&mut self) {
        self.replayed_history = false;
        self.entries.retain(|e| !e.history);
        self.history_bytes = 0;
        self.history_replay = Duration::ZERO;
        self.spare.clear();
    }

    /// Record `entry`, a checkpoint of the instance `handle` (of the whole extension when `None`), in place of its
    /// earlier checkpoints (entries of the same function for the same handle, or of the same function). The history stays: a plugin's saved state may be its configuration only (most
    /// LV2 plugins save their settings, not their delay lines), and the blocks replayed around the checkpoint rebuild
    /// what it lacks, while a state that is whole makes the restart exact past the history's window.
    pub fn checkpoint(&mut self, entry: ShadowEntry, handle: Option<u64>) {
        self.entries.retain(|e| !(e.symbol == entry.symbol && !e.history && handle.is_none_or(|h| e.uses(h))));
        self.entries.push_back(entry);
    }

    /// Forget the latest history entry of a symbol `of` accepts (a call whose result turned out wrong).
    pub fn drop_last_history(&mut self, of: impl Fn(usize) -> bool) {
        if let Some(at) = self.entries.iter().rposition(|e| e.history && of(e.symbol)) {
            if let Some(entry) = self.entries.remove(at) {
                self.forget_history_entry(entry, false);
            }
        }
    }

    /// Whether history entries were ever dropped to stay within the bounds (a restart rebuilds the state from the
    /// most recent window only, or not at all).
    pub fn history_trimmed(&self) -> bool {
        self.history_trimmed
    }

    /// The bytes the history holds and the replay time it is charged.
    pub fn history_held(&self) -> (usize, Duration) {
        (self.history_bytes, self.history_replay)
    }

    /// The handle's object was destroyed: its history no longer needs replaying.
    pub fn forget_handle(&mut self, handle: u64) {
        self.entries.retain(|e| !e.uses(handle));
        self.history_bytes = self.entries.iter().filter(|e| e.history).map(ShadowEntry::held).sum();
        self.history_replay = self.entries.iter().filter(|e| e.history).map(|e| e.replay).sum();
    }

    /// In the entries of the symbols `of` accepts, replace string arguments equal to `from` by `to`; returns how
    /// many were replaced. How a class adapter's `open(path)` is pointed at another file (`restart_from`).
    pub fn replace_string(&mut self, of: impl Fn(usize) -> bool, from: &CStr, to: &CStr) -> usize {
        let mut replaced = 0;
        for entry in self.entries.iter_mut().filter(|e| of(e.symbol)) {
            for arg in &mut entry.args {
                if matches!(arg, OwnedArg::Str(s) if s.as_c_str() == from) {
                    *arg = OwnedArg::Str(to.to_owned());
                    replaced += 1;
                }
            }
        }
        replaced
    }

    #[cfg(test)]
    pub fn entries(&self) -> &VecDeque<ShadowEntry> {
        &self.entries
    }

    /// Take the entries out (to replay them with the domain borrowed); [`ShadowLog::put_back`] returns them.
    pub fn take_entries(&mut self) -> VecDeque<ShadowEntry> {
        self.replayed_history = self.history_bytes > 0;
        std::mem::take(&mut self.entries)
    }

    /// Whether the latest replay had history in it (and none was recorded since it was dropped).
    pub fn replayed_history(&self) -> bool {
        self.replayed_history
    }

    /// Return entries taken with [`ShadowLog::take_entries`], before any recorded since.
    pub fn put_back(&mut self, mut entries: VecDeque<ShadowEntry>) {
        entries.append(&mut self.entries);
        self.entries = entries;
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Host handles and the objects of the current incarnation they stand for.
///
/// Host handles are ward's own numbers, never the extension's pointers: they stay valid across restarts, and a
/// pointer from a domain is never mistaken for a host address.
#[derive(Debug)]
pub(crate) struct HandleMap {
    next: u64,
    current: HashMap<u64, u64>,
}

/// Host handles count up from here, so they are recognisable in a debugger and never small integers.
const HANDLE_BASE: u64 = 0x5744_0000_0000_0000;

impl Default for HandleMap {
    fn default() -> Self {
        HandleMap { next: HANDLE_BASE, current: HashMap::new() }
    }
}

impl HandleMap {
    /// A new host handle for an object of the current incarnation.
    pub fn create(&mut self, object: u64) -> u64 {
        self.next += 1;
        self.current.insert(self.next, object);
        self.next
    }

    /// The current object behind a host handle.
    pub fn object(&self, handle: u64) -> Option<u64> {
        self.current.get(&handle).copied()
    }

    /// After replay: the handle now stands for this object of the new incarnation.
    pub fn rebind(&mut self, handle: u64, object: u64) {
        self.current.insert(handle, object);
    }

    pub fn remove(&mut self, handle: u64) -> bool {
        self.current.remove(&handle).is_some()
    }

    pub fn len(&self) -> usize {
        self.current.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setter(symbol: usize, handle: u64, index: u64, value: &[u8]) -> ShadowEntry {
        let args = vec![OwnedArg::Handle(handle), OwnedArg::U64(index), OwnedArg::In(value.to_vec())];
        ShadowEntry { symbol, args, ret: RetType::I64, created: None, history: false, replay: Duration::ZERO }
    }

    #[test]
    fn a_replacing_setter_keeps_only_its_last_value_per_key() {
        let mut log = ShadowLog::default();
        log.record(setter(0, 7, 0, b"create"));
        for frame in 0..1000u32 {
            log.record_replacing(setter(1, 7, 0, &frame.to_le_bytes()), 2);
            log.record_replacing(setter(1, 7, 1, b"other"), 2);
            log.record_replacing(setter(1, 8, 0, b"another instance"), 2);
        }
        // The creation, and one entry per (instance, index), the last in order.
        assert_eq!(log.len(), 4);
        let last: Vec<&ShadowEntry> = log.entries().iter().skip(1).collect();
        assert!(matches!(&last[0].args[2], OwnedArg::In(v) if v[..] == 999u32.to_le_bytes()));
        assert!(matches!(&last[0].args[1], OwnedArg::U64(0)));
        assert!(matches!(&last[1].args[1], OwnedArg::U64(1)));
        assert!(matches!(&last[2].args[0], OwnedArg::Handle(8)));
        // Another function's entries are never replaced.
        assert!(matches!(&log.entries()[0].args[2], OwnedArg::In(v) if v == b"create"));
    }

    #[test]
    fn a_checkpoint_replaces_only_its_instances_earlier_checkpoint_and_keeps_the_history() {
        let mut log = ShadowLog::default();
        let b = bounds(1 << 20, 1000);
        log.record(setter(0, 7, 0, b"create 7"));
        log.record(setter(0, 8, 0, b"create 8"));
        data_call(&mut log, 2, 7, &[0; 100], MS, b);
        log.checkpoint(setter(3, 8, 0, b"state of 8"), Some(8));
        log.checkpoint(setter(3, 7, 0, b"state 1"), Some(7));
        data_call(&mut log, 2, 7, &[9; 100], MS, b);
        log.checkpoint(setter(3, 7, 0, b"state 2"), Some(7));
        data_call(&mut log, 2, 7, &[10; 100], MS, b);
        let shape: Vec<(usize, u64, bool)> = log
            .entries()
            .iter()
            .map(|e| {
                let OwnedArg::Handle(h) = e.args[0] else { panic!("no handle") };
                (e.symbol, h, e.history)
            })
            .collect();
        // Both creations, every block in order, instance 8's checkpoint, and instance 7's last one in its place.
        assert_eq!(
            shape,
            [(0, 7, false), (0, 8, false), (2, 7, true), (3, 8, false), (2, 7, true), (3, 7, false), (2, 7, true)]
        );
        assert!(matches!(&log.entries()[5].args[2], OwnedArg::In(v) if v == b"state 2"));
        assert_eq!(log.history_held().0, 3 * HELD);
    }

    const MS: Duration = Duration::from_millis(1);
    /// Bytes a data call of a 100-byte block holds.
    const HELD: usize = 64 + 100;
    const WINDOW: usize = MIN_WINDOW_CALLS;

    /// Bounds of `bytes` bytes and `ms` milliseconds.
    fn bounds(bytes: usize, ms: u64) -> HistoryBounds {
        HistoryBounds { bytes, replay: MS * ms as u32 }
    }

    /// A data call of instance `handle` on `block`, which took `took`; what the log did with it.
    fn data_call(
        log: &mut ShadowLog,
        symbol: usize,
        handle: u64,
        block: &[u8],
        took: Duration,
        b: HistoryBounds,
    ) -> Kept {
        let mut out = vec![0u8; block.len()];
        let mut args = [Arg::Handle(handle), Arg::In(block), Arg::Out(&mut out)];
        log.record_history(symbol, &mut args, RetType::I64, None, took, b)
    }

    /// The first byte of each kept history call's block, in order.
    fn kept_blocks(log: &ShadowLog) -> Vec<u8> {
        log.entries()
            .iter()
            .filter(|e| e.history)
            .map(|e| match &e.args[1] {
                OwnedArg::In(b) => b[0],
                _ => unreachable!("a data call's block"),
            })
            .collect()
    }

    fn range(from: u8, count: usize) -> Vec<u8> {
        (from..).take(count).collect()
    }

    #[test]
    fn history_past_its_byte_bound_keeps_the_most_recent_window_with_the_state_calls_in_order() {
        let mut log = ShadowLog::default();
        log.record(setter(0, 7, 0, b"create"));
        // Room for WINDOW + 1 blocks.
        let b = bounds(HELD * (WINDOW + 1), 60_000);
        for block in 0..=WINDOW as u8 {
            assert_eq!(data_call(&mut log, 1, 7, &[block; 100], MS, b), Kept::Whole);
        }
        log.record(setter(2, 7, 0, b"gain"));
        assert_eq!(kept_blocks(&log), range(0, WINDOW + 1));
        assert!(!log.history_trimmed());
        // The wrong result of the latest block is forgotten.
        log.drop_last_history(|s| s == 1);
        assert_eq!(kept_blocks(&log), range(0, WINDOW));
        assert_eq!(data_call(&mut log, 1, 7, &[WINDOW as u8; 100], MS, b), Kept::Whole);
        // Past the bound: the oldest block goes, the rest and the state calls stay, in their order.
        assert_eq!(data_call(&mut log, 1, 7, &[WINDOW as u8 + 1; 100], MS, b), Kept::Window);
        assert!(log.history_trimmed());
        assert_eq!(kept_blocks(&log), range(1, WINDOW + 1));
        assert_eq!(data_call(&mut log, 1, 7, &[WINDOW as u8 + 2; 100], MS, b), Kept::Window);
        assert_eq!(kept_blocks(&log), range(2, WINDOW + 1));
        let symbols: Vec<usize> = log.entries().iter().map(|e| e.symbol).collect();
        // Blocks 2 to WINDOW - 1 before the gain, WINDOW to WINDOW + 2 after it.
        let mut expected = vec![0];
        expected.extend([1].repeat(WINDOW - 2));
        expected.push(2);
        expected.extend([1, 1, 1]);
        assert_eq!(symbols, expected, "the creation first, the gain where it was set");
        assert_eq!(log.history_held().0, (WINDOW + 1) * HELD);
    }

    #[test]
    fn history_past_its_replay_bound_keeps_the_calls_that_replay_within_it() {
        let mut log = ShadowLog::default();
        // Each is charged 1 ms and a replayed call's round trip: 64 of them fit.
        let charge = replay_charge(MS, HELD);
        let b = HistoryBounds { bytes: 1 << 30, replay: charge * 64 };
        for block in 0..64u8 {
            assert_eq!(data_call(&mut log, 1, 7, &[block; 100], MS, b), Kept::Whole);
        }
        assert_eq!(log.history_held().1, b.replay);
        // One more is past the bound: the oldest goes.
        assert_eq!(data_call(&mut log, 1, 7, &[64; 100], MS, b), Kept::Window);
        assert_eq!(kept_blocks(&log), range(1, 64));
        // A call of 3 ms makes room for itself by dropping as many as it takes: three.
        assert_eq!(data_call(&mut log, 1, 7, &[65; 100], MS * 3, b), Kept::Window);
        assert_eq!(kept_blocks(&log), range(4, 62));
        assert!(log.history_held().1 <= b.replay);
    }

    #[test]
    fn a_call_that_took_no_measurable_time_is_charged_its_round_trip_and_copies() {
        assert_eq!(replay_charge(Duration::ZERO, 64), REPLAY_CALL_CHARGE);
        assert_eq!(replay_charge(MS, 8 << 20), MS + REPLAY_CALL_CHARGE + Duration::from_micros(8388));
        let mut log = ShadowLog::default();
        let b = HistoryBounds { bytes: 1 << 30, replay: replay_charge(Duration::ZERO, HELD) * WINDOW as u32 };
        for block in 0..=WINDOW as u8 {
            data_call(&mut log, 1, 7, &[block; 100], Duration::ZERO, b);
        }
        assert_eq!(kept_blocks(&log), range(1, WINDOW));
    }

    #[test]
    fn a_call_of_which_the_bounds_hold_too_few_drops_the_history_and_is_not_copied() {
        let b = bounds(HELD * WINDOW, 1000);
        let slow = Duration::from_micros(1_000_000 / WINDOW as u64);
        for (block, took) in [(101, MS), (100, slow)] {
            let mut log = ShadowLog::default();
            log.record(setter(0, 7, 0, b"create"));
            assert_eq!(data_call(&mut log, 1, 7, &[1; 100], MS, b), Kept::Whole);
            assert_eq!(data_call(&mut log, 1, 7, &vec![2; block], took, b), Kept::Nothing, "{block} {took:?}");
            assert_eq!(log.len(), 1, "the state call stays, the history is gone");
            assert_eq!(log.history_held(), (0, Duration::ZERO));
            assert!(log.history_trimmed(), "identity is lost");
            // The history starts again with the next call that fits.
            assert_eq!(data_call(&mut log, 1, 7, &[3; 100], MS, b), Kept::Window);
            assert_eq!(kept_blocks(&log), [3]);
        }
    }

    #[test]
    fn a_dropped_entrys_buffer_takes_the_next_block_without_an_allocation() {
        let mut log = ShadowLog::default();
        let b = bounds(WINDOW * (64 + 4096), 60_000);
        for block in 0..WINDOW as u8 {
            assert_eq!(data_call(&mut log, 1, 7, &[block; 4096], MS, b), Kept::Whole);
        }
        let oldest = match &log.entries()[0].args[1] {
            OwnedArg::In(v) => v.as_ptr(),
            _ => unreachable!("a data call's block"),
        };
        assert_eq!(data_call(&mut log, 1, 7, &[99; 4096], MS, b), Kept::Window);
        let newest = match &log.entries()[WINDOW - 1].args[1] {
            OwnedArg::In(v) => (v.as_ptr(), v[0], v.len()),
            _ => unreachable!("a data call's block"),
        };
        assert_eq!(newest, (oldest, 99, 4096), "the oldest block's buffer, holding the newest block");
    }

    #[test]
    fn an_in_vec_block_is_kept_as_its_own_buffer_and_the_caller_gets_a_dropped_entrys() {
        let mut log = ShadowLog::default();
        let b = bounds(WINDOW * (64 + 4096), 60_000);
        let mut block = Vec::new();
        let mut kept = Vec::new();
        for n in 0..=WINDOW as u8 {
            block.clear();
            block.resize(4096, n);
            let given = block.as_ptr();
            let mut out = [0u8; 4];
            let mut args = [Arg::Handle(7), Arg::InVec(&mut block), Arg::Out(&mut out)];
            log.record_history(1, &mut args, RetType::I64, None, MS, b);
            let newest = match &log.entries().back().map(|e| &e.args[1]) {
                Some(OwnedArg::In(v)) => (v.as_ptr(), v[0], v.len()),
                _ => unreachable!("a data call's block"),
            };
            assert_eq!(newest, (given, n, 4096), "block {n}: the caller's own buffer, not a copy");
            kept.push(given);
        }
        // The history was full at the last block: the caller now holds the dropped oldest entry's buffer.
        assert_eq!(block.as_ptr(), kept[0]);
        assert_eq!(kept_blocks(&log), (1..=WINDOW as u8).collect::<Vec<_>>());
        assert_eq!(log.history_held().0, WINDOW * (64 + 4096));
    }

    #[test]
    fn destroying_an_instance_forgets_its_history_and_frees_its_bound() {
        let mut log = ShadowLog::default();
        let b = bounds(HELD * WINDOW, 60_000);
        for _ in 0..WINDOW {
            data_call(&mut log, 1, 7, &[0; 100], MS, b);
        }
        log.forget_handle(7);
        assert_eq!(log.len(), 0);
        assert_eq!(log.history_held(), (0, Duration::ZERO));
        for _ in 0..WINDOW {
            assert_eq!(data_call(&mut log, 1, 8, &[0; 100], MS, b), Kept::Whole, "the bound is free again");
        }
    }

    #[test]
    fn handles_are_stable_across_rebinding() {
        let mut m = HandleMap::default();
        let h = m.create(0x1000);
        assert_eq!(m.object(h), Some(0x1000));
        m.rebind(h, 0);
        assert_eq!(m.object(h), Some(0));
        m.rebind(h, 0x2000);
        assert_eq!(m.object(h), Some(0x2000));
        assert!(m.remove(h));
        assert_eq!(m.object(h), None);
    }

    #[test]
    fn forgetting_a_handle_drops_its_history_only() {
        let mut log = ShadowLog::default();
        log.record(ShadowEntry {
            symbol: 0,
            args: vec![OwnedArg::I64(1)],
            ret: RetType::Handle,
            created: Some(7),
            history: false,
            replay: Duration::ZERO,
        });
        log.record(ShadowEntry {
            symbol: 1,
            args: vec![OwnedArg::Handle(7)],
            ret: RetType::I64,
            created: None,
            history: false,
            replay: Duration::ZERO,
        });
        log.record(ShadowEntry {
            symbol: 2,
            args: vec![OwnedArg::I64(5)],
            ret: RetType::I64,
            created: None,
            history: false,
            replay: Duration::ZERO,
        });
        log.forget_handle(7);
        assert_eq!(log.len(), 1);
        assert_eq!(log.entries()[0].symbol, 2);
    }
}
