//! Single-producer single-consumer rings of variable-length records in shared memory.
//!
//! Each ring is a control page and a data area of `capacity` bytes (a power of two). Positions are byte counts that
//! only grow; a position's offset in the data area is `pos & (capacity - 1)`. The control page holds:
//!
//! | offset | field    | written by | meaning                                       |
//! |--------|----------|------------|-----------------------------------------------|
//! | 0      | tail u64 | producer   | end of the published records (a wake-up hint) |
//! | 128    | head u64 | consumer   | start of the records not yet consumed         |
//! | 256    | waiting  | consumer   | 1 while the consumer sleeps (or is about to)  |
//! | 260    | doorbell | producer   | futex word, bumped to wake a sleeping consumer |
//! | 384    | cpu      | consumer   | processor + 1 it last waited on (0: unknown)  |
//! | 448    | stats    | consumer   | wait statistics (flags, spin turns, sleeps, waits cut short) |
//!
//! Records are 16-byte aligned; each starts with its total length (u32, little-endian, a multiple of 16). A record
//! never straddles the end of the data area: when the next one does not fit before the end, the producer fills the
//! rest with a PAD record (op 9) and starts again at offset 0.
//!
//! # Readiness
//!
//! A record is ready when the length word of its slot is non-zero. The producer writes a record's body, then a zero
//! length into the slot right after it, then the record's own length (after a release fence); the consumer reads the
//! length at its head (then an acquire fence) and, if it is zero, has nothing to do. So a consumer waiting for the
//! next record polls the one cache line the record arrives in, and a round trip moves one line less each way than
//! with a separate tail. The producer keeps 16 bytes free after its last record for that zeroed slot, and a reset
//! between incarnations zeroes the slot at 0. A record is visible once pushed; [`Producer::publish`] stores the
//! tail and wakes a sleeping consumer.
//!
//! # Trust
//!
//! Each side keeps its own position privately and only *publishes* it; it never reads its own index back. The peer's
//! index is read, then validated against what this side knows: a head outside `[last head, pushed tail]`, a record
//! whose length is not a multiple of 16, is too large or straddles the end, a ring of nothing but padding are all
//! [`RingError::Corrupt`]: the peer is broken or hostile, and the caller should stop talking to it. (The consumer does
//! not read the tail at all: a producer lying about it changes nothing.) Records are copied out of shared memory into
//! the caller's buffer before anything looks at them, with the header validated once and written back over the copy, so
//! the producer rewriting a record concurrently can garble its contents but not its framing.
//!
//! # Waking
//!
//! The consumer announces that it will sleep (`waiting = 1`, SeqCst fence), reads the doorbell, re-checks the ring and
//! only then sleeps on the doorbell with `FUTEX_WAIT`. The producer, having written the record's length, publishes the
//! tail with a SeqCst swap and, if `waiting` is set, bumps the doorbell and wakes. The two fences guarantee that either
//! the producer sees `waiting` or the consumer sees the new length, so no wake-up is lost. A hostile peer can at worst
//! cost the other side useless wake-ups, or make it sleep until its timeout slice (at most 50 ms) ends.
//!
//! # Spinning only while it can pay
//!
//! A consumer waiting for a record spins before it sleeps (`spin` turns, or for ever), which pays only while the
//! producer runs on another processor. The first [`FIRST_LOOK`] turns (a couple of microseconds) cost nothing more
//! than the look at the ring: a record that comes that soon is the fast path. From then on the wait *looks* every
//! [`LOOK_EVERY`] turns and stops spinning, to sleep at once, when the producer cannot be running:
//!
//! - the producer's side last waited on this very processor (each consumer publishes its processor, `cpu` above,
//!   when a wait of its turns slow and when it wakes from one, and forgets it when it waits without spinning, as
//!   when the two hand a processor over; the producer of one ring is the consumer of the other): it can only run
//!   once this side stops, as when both are confined to one processor;
//! - the machine has more runnable tasks than processors ([`crate::runqueue`], sampled at most every few tens of
//!   microseconds in the whole process): someone waits for a processor, maybe the producer for this one. A producer
//!   whose `waiting` word still says it sleeps was woken for what this side waits for and may not be counted yet:
//!   it counts as one more.
//!
//! Where the run queue cannot be read, a wait spins at most [`BLIND_SPIN`] turns, and says so in its statistics.
//!
//! A side whose records keep coming long after its spin ends (a call that computes for half a millisecond, a host
//! that calls once per audio period) spins only the fast path's turns until one comes soon after that short spin
//! ([`SpinTrim`]).

use std::hint;
use std::ptr;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::deadline::Deadline;
use crate::futex;
use crate::layout::{
    Region, CTRL_CPU, CTRL_CUT_SHORT, CTRL_DOORBELL, CTRL_HEAD, CTRL_SLEEPS, CTRL_SPIN_TURNS, CTRL_TAIL, CTRL_WAITING,
    CTRL_WAIT_FLAGS, WAIT_FLAG_NO_RUNQUEUE,
};
use crate::runqueue::{self, Crowding};
use crate::wire::{HEADER_LEN, OP_PAD};

/// Alignment (and granularity) of records.
pub const RECORD_ALIGN: usize = 16;
/// Bytes the producer keeps free after its last record: the zeroed length word of the next slot lives there.
const GAP: usize = RECORD_ALIGN;
/// Largest record either side accepts (PAD records excepted: they may fill the rest of the data area).
pub const MAX_RECORD: usize = 4096;

/// Longest single futex sleep in [`Consumer::wait`]: the consumer re-checks `stop()` at least this often.
const SLEEP_SLICE: Duration = Duration::from_millis(50);
/// Spin iterations between checks of `stop()` and the clock.
const SPIN_CHECK_EVERY: u32 = 256;
/// Spin turns a wait takes before its first look at whether the producer can be running (see the module docs):
/// about two microseconds at the 20 to 40 ns a turn takes. A record that comes sooner costs nothing more.
pub const FIRST_LOOK: u64 = 64;
/// Spin turns between two looks after the first (a look is a clock read and `sched_getcpu`, tens of nanoseconds;
/// the run queue itself is read at most every [`runqueue::SAMPLE_EVERY`] by the whole process).
pub const LOOK_EVERY: u64 = 256;
/// The most turns a wait spins where the run queue cannot be read, whatever its `spin` (about 50 us).
pub const BLIND_SPIN: u64 = 2000;
/// Waits whose spin ran out and whose sleep then lasted [`LONG_SLEEP`] or more, this many with no wait between them
/// that a spin past the fast path caught, before a consumer trims its spin to [`TRIMMED_SPIN`] (see [`SpinTrim`]).
pub const LONG_WAITS_TO_TRIM: u32 = 8;
/// A sleep this long after a spin ran out says the records come well after any spin ends (a spin of the default
/// 2000 turns is about 50 us).
pub const LONG_SLEEP: Duration = Duration::from_micros(200);
/// The turns a trimmed wait spins: the fast path's, which catch a record that comes within a couple of microseconds.
pub const TRIMMED_SPIN: u64 = FIRST_LOOK;

/// Errors of the rings.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RingError {
    /// Not enough room until the consumer frees some.
    #[error("ring full")]
    Full,
    /// The peer broke the ring's invariants: stop using this ring.
    #[error("corrupt ring: {0}")]
    Corrupt(&'static str),
    /// A record handed to [`Producer::push`] is malformed, or a record does not fit the buffer given to
    /// [`Consumer::pop`].
    #[error("record of {0} bytes is malformed or too large")]
    BadRecord(usize),
}

/// What ended [`Consumer::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// A record is available.
    Ready,
    /// The deadline passed first.
    TimedOut,
    /// `stop()` returned true first.
    Stopped,
}

/// One ring of a [`Region`]: pointers into the mapping, kept alive by the region clone held alongside.
#[derive(Debug)]
pub(crate) struct RingShared {
    _region: Region,
    ctrl: *mut u8,
    data: *mut u8,
    capacity: usize,
}

impl RingShared {
    /// The ring whose control page is at `ctrl_off` and data at `data_off` (offsets the layout fixes; both inside
    /// the mapping, page-aligned, data `capacity` bytes long).
    pub(crate) fn new(region: Region, ctrl_off: usize, data_off: usize) -> Self {
        let base = region.memory().as_ptr();
        let capacity = region.capacity();
        debug_assert!(data_off + capacity <= region.memory().len());
        RingShared { ctrl: base.wrapping_add(ctrl_off), data: base.wrapping_add(data_off), capacity, _region: region }
    }

    fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: ctrl points at a page-aligned control page inside the mapping, which self keeps alive (it holds
        // the Region); `off` is one of the layout's u64 field offsets (multiples of 8, < PAGE), so the pointer is
        // in bounds and aligned. The page is read-write in both processes and these words are only ever accessed
        // atomically; any bit pattern is a valid u64.
        unsafe { &*self.ctrl.add(off).cast::<AtomicU64>() }
    }

    fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: ctrl points at the control page inside the mapping, which self keeps alive (it holds the Region);
        // `off` is one of the layout's u32 field offsets (multiples of 4, < PAGE), so the pointer is in bounds and
        // aligned. Both processes access these words only atomically; any bit pattern is a valid u32.
        unsafe { &*self.ctrl.add(off).cast::<AtomicU32>() }
    }

    fn tail(&self) -> &AtomicU64 {
        self.atomic_u64(CTRL_TAIL)
    }

    fn head(&self) -> &AtomicU64 {
        self.atomic_u64(CTRL_HEAD)
    }

    fn waiting(&self) -> &AtomicU32 {
        self.atomic_u32(CTRL_WAITING)
    }

    fn doorbell(&self) -> &AtomicU32 {
        self.atomic_u32(CTRL_DOORBELL)
    }

    /// The processor this ring's consumer last waited on, plus one.
    fn cpu(&self) -> &AtomicU32 {
        self.atomic_u32(CTRL_CPU)
    }

    fn mask(&self) -> u64 {
        self.capacity as u64 - 1
    }

    /// Zero every control field.
    pub(crate) fn reset(&self) {
        // Position 0 is where both sides start again: its slot must not show a record of the old incarnation.
        self.store_len(0, 0);
        self.tail().store(0, Ordering::SeqCst);
        self.head().store(0, Ordering::SeqCst);
        self.waiting().store(0, Ordering::SeqCst);
        self.doorbell().store(0, Ordering::SeqCst);
        self.cpu().store(0, Ordering::SeqCst);
        self.atomic_u32(CTRL_WAIT_FLAGS).store(0, Ordering::SeqCst);
        for off in [CTRL_SPIN_TURNS, CTRL_SLEEPS, CTRL_CUT_SHORT] {
            self.atomic_u64(off).store(0, Ordering::SeqCst);
        }
    }

    /// Ring the doorbell and wake every sleeper, whatever `waiting` says.
    pub(crate) fn kick(&self) {
        self.doorbell().fetch_add(1, Ordering::SeqCst);
        futex::wake(self.doorbell(), i32::MAX);
    }

    /// Copy `src` into the data area at `off`.
    ///
    /// The caller guarantees `off + src.len() <= capacity`.
    fn write_data(&self, off: usize, src: &[u8]) {
        debug_assert!(off + src.len() <= self.capacity);
        // SAFETY: [off, off + len) is inside the data area (caller's guarantee), which is writable in this process
        // (the producer's side of the data) and alive while self is; src is private memory, so no overlap. The
        // consumer does not read this space until we publish a tail past it; if it does anyway, it reads bytes.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(off), src.len()) };
    }

    /// Copy the data area at `off` into `dst`.
    ///
    /// The caller guarantees `off + dst.len() <= capacity`.
    fn read_data(&self, off: usize, dst: &mut [u8]) {
        debug_assert!(off + dst.len() <= self.capacity);
        // SAFETY: [off, off + len) is inside the readable data area (caller's guarantee) and alive while self is;
        // dst is private memory. The producer may be rewriting these bytes: the copy is taken once and only the copy
        // is used afterwards.
        unsafe { ptr::copy_nonoverlapping(self.data.add(off), dst.as_mut_ptr(), dst.len()) };
    }

    /// The length word of the record slot at `off`, read once; what the producer wrote before it (the record's
    /// body, the next slot's zeroed length) is visible after it.
    ///
    /// The caller guarantees `off` is 16-aligned and `off + 4 <= capacity`.
    fn load_len(&self, off: usize) -> u32 {
        debug_assert!(off & (RECORD_ALIGN - 1) == 0 && off + 4 <= self.capacity);
        // SAFETY: the 4 bytes are inside the readable data area (caller's guarantee) and 4-aligned (off is
        // 16-aligned, the area page-aligned). A volatile read of shared memory the peer writes: read exactly once.
        let len = unsafe { ptr::read_volatile(self.data.add(off).cast::<u32>()) };
        // Pairs with the fence in `store_len`: the record's bytes are read after its length.
        fence(Ordering::Acquire);
        u32::from_le(len)
    }

    /// Write the length word of the record slot at `off`, after everything written before it.
    ///
    /// The caller guarantees `off` is 16-aligned and `off + 4 <= capacity`, in space it owns.
    fn store_len(&self, off: usize, len: u32) {
        debug_assert!(off & (RECORD_ALIGN - 1) == 0 && off + 4 <= self.capacity);
        // The record's bytes (and the next slot's zeroed length) before its length.
        fence(Ordering::Release);
        // SAFETY: inside the writable data area (caller's guarantee), 4-aligned; a volatile write the consumer may
        // read at any moment (it reads either the old or the new word: a u32 store is not torn on x86-64).
        unsafe { ptr::write_volatile(self.data.add(off).cast::<u32>(), len.to_le()) };
    }

    /// Read the 16-byte record header at `off` once.
    ///
    /// The caller guarantees `off` is 16-aligned and `off + 16 <= capacity`.
    fn read_header(&self, off: usize) -> [u8; HEADER_LEN] {
        debug_assert!(off & (RECORD_ALIGN - 1) == 0 && off + HEADER_LEN <= self.capacity);
        // SAFETY: the 16 bytes are inside the readable data area (caller's guarantee), aligned for [u8; 16]; a
        // volatile read happens exactly once, so the values checked are the values used.
        unsafe { ptr::read_volatile(self.data.add(off).cast::<[u8; HEADER_LEN]>()) }
    }
}

// SAFETY: RingShared only holds pointers into a mapping owned by the Region (an Arc<SharedMemory>, Send + Sync) that
// it keeps alive; nothing about it is tied to the creating thread. Access through it goes through atomics and raw
// copies that already tolerate a concurrent peer process.
unsafe impl Send for RingShared {}

/// The writing side of a ring.
#[derive(Debug)]
pub struct Producer {
    ring: RingShared,
    /// End of what we pushed (private, the only truth about our position).
    tail: u64,
    /// What we last stored to the shared tail.
    published: u64,
    /// Last consumer head we read and validated.
    head: u64,
}

impl Producer {
    pub(crate) fn new(ring: RingShared) -> Self {
        Producer { ring, tail: 0, published: 0, head: 0 }
    }

    fn free_known(&self) -> usize {
        // tail - head <= capacity is kept by push and by refresh_head's validation.
        self.ring.capacity - self.tail.wrapping_sub(self.head) as usize
    }

    /// A consumer head is valid when it is record-aligned and lies in `[last head, pushed tail]` (a record is
    /// visible once pushed).
    fn head_is_valid(head: u64, last: u64, tail: u64) -> bool {
        head.wrapping_sub(last) <= tail.wrapping_sub(last) && head & (RECORD_ALIGN as u64 - 1) == 0
    }

    /// Read the consumer's head and check it.
    fn refresh_head(&mut self) -> Result<(), RingError> {
        let head = self.ring.head().load(Ordering::Acquire);
        if !Self::head_is_valid(head, self.head, self.tail) {
            return Err(RingError::Corrupt("consumer head is misaligned or outside [previous head, pushed tail]"));
        }
        self.head = head;
        Ok(())
    }

    /// Copy one complete record into the ring without making it visible.
    ///
    /// `record.len()` must be a multiple of 16 in `[16, MAX_RECORD]` and equal the length in its first 4 bytes
    /// (else `BadRecord`). `Full` when the consumer has not freed enough room; `Corrupt` when its head is invalid.
    ///
    /// On `Full`, publish and back off (spin a little, or wait) before retrying: each retry reads the consumer's
    /// head, pulling its cache line away from a consumer that writes it on every pop.
    pub fn push(&mut self, record: &[u8]) -> Result<(), RingError> {
        let len = record.len();
        if len < HEADER_LEN || len & (RECORD_ALIGN - 1) != 0 || len > MAX_RECORD {
            return Err(RingError::BadRecord(len));
        }
        match record.first_chunk::<4>() {
            Some(first) if u32::from_le_bytes(*first) as usize == len => {}
            _ => return Err(RingError::BadRecord(len)),
        }
        let off = (self.tail & self.ring.mask()) as usize;
        let to_end = self.ring.capacity - off;
        let need = if len <= to_end { len } else { to_end + len };
        // GAP more: the slot after the record is zeroed, and must not be the consumer's.
        if need + GAP > self.free_known() {
            self.refresh_head()?;
            if need + GAP > self.free_known() {
                return Err(RingError::Full);
            }
        }
        if len > to_end {
            // The record at 0, complete, before the PAD that sends the consumer there.
            self.write_record(0, record);
            let mut pad = [0u8; HEADER_LEN];
            pad[4] = OP_PAD;
            self.ring.write_data(off + 4, &pad[4..]);
            // to_end is a non-zero multiple of 16 below the capacity, which fits a u32.
            self.ring.store_len(off, to_end as u32);
            self.tail = self.tail.wrapping_add(to_end as u64);
        } else {
            self.write_record(off, record);
        }
        self.tail = self.tail.wrapping_add(len as u64);
        Ok(())
    }

    /// Write `record` at `off` (it fits before the end): its body, a zero length in the slot after it (so the
    /// consumer, reaching that slot, waits there), and its own length last, which makes it visible.
    fn write_record(&mut self, off: usize, record: &[u8]) {
        let len = record.len();
        self.ring.write_data(off + 4, &record[4..]);
        self.ring.store_len((off + len) & (self.ring.capacity - 1), 0);
        self.ring.store_len(off, len as u32);
    }

    /// Make every pushed record visible; wake the consumer if it sleeps. Cheap when nothing is pending. Whether
    /// the consumer was asleep (and so was woken).
    pub fn publish(&mut self) -> bool {
        if self.tail == self.published {
            return false;
        }
        // A sequentially consistent swap, not a store and a fence: it orders the tail before the load of
        // `waiting` below (pairing with the consumer's fence between `waiting = 1` and its re-check of the tail),
        // and on x86 one locked instruction is much cheaper than a store followed by MFENCE.
        self.ring.tail().swap(self.tail, Ordering::SeqCst);
        self.published = self.tail;
        if self.ring.waiting().load(Ordering::SeqCst) != 0 {
            self.ring.doorbell().fetch_add(1, Ordering::Release);
            futex::wake(self.ring.doorbell(), 1);
            return true;
        }
        false
    }

    /// Records pushed but not yet published.
    pub fn pending(&self) -> bool {
        self.tail != self.published
    }

    /// Free bytes as far as this side knows, with a fresh look at the consumer's head (0 if that head is corrupt:
    /// the next push that needs room reports it).
    pub fn free_space(&self) -> usize {
        let head = self.ring.head().load(Ordering::Acquire);
        if Self::head_is_valid(head, self.head, self.tail) {
            self.ring.capacity - self.tail.wrapping_sub(head) as usize
        } else {
            0
        }
    }

    /// Capacity of the ring's data area.
    pub fn capacity(&self) -> usize {
        self.ring.capacity
    }
}

/// The reading side of a ring.
#[derive(Debug)]
pub struct Consumer {
    ring: RingShared,
    /// The other ring of the region, whose consumer is the side this one waits for: where it says which processor
    /// it last waited on.
    partner: RingShared,
    /// Start of the next record (private, the only truth about our position).
    head: u64,
    /// What we last stored to the shared head.
    published: u64,
    /// Longest single sleep.
    slice: Duration,
    /// Sleeps that ran their whole slice (a test hook: with a long slice, any of them would be a lost wake-up).
    full_sleeps: u64,
    /// What the machine's run queue says about spinning ([`runqueue::crowding`]; tests give their own).
    crowding: fn(u32) -> Crowding,
    /// A wait stopped spinning early since [`Consumer::take_cut_short`] was last asked.
    cut_short: bool,
    /// This side's wait statistics, as published in the control page.
    stats: WaitTotals,
    /// Whether this side's spins pay, from how its recent waits ended.
    trim: SpinTrim,
}

/// How a wait ended, for [`SpinTrim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// A record within the fast path's turns ([`TRIMMED_SPIN`]), or already there.
    Quick,
    /// A record caught by spinning past the fast path: the spin paid.
    Spun,
    /// The spin ran out (or stopped early) and the record came after a sleep this long.
    Slept(Duration),
}

/// A consumer's spin, trimmed to the fast path while spinning does not pay: when the records come long after any
/// spin ends (a call that computes for half a millisecond, a host that calls once per audio period), a full spin
/// burns its processor for nothing on every wait, on both sides of a process domain. After
/// [`LONG_WAITS_TO_TRIM`] waits that slept [`LONG_SLEEP`] or more after their spin, with none between them caught
/// by spinning past the fast path, the spin is trimmed to [`TRIMMED_SPIN`] turns; a record that then comes soon
/// after such a spin (a sleep shorter than [`LONG_SLEEP`]: a full spin might have caught it) gives the full spin
/// back at once. Records that come within the fast path say nothing either way: a short call between long ones
/// costs no more trimmed than untrimmed. The glibc adaptive mutex's spin count, learned from how its spins end,
/// is the same idea.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SpinTrim {
    long_in_a_row: u32,
    trimmed: bool,
}

impl SpinTrim {
    /// The turns to spin of a wait asked to spin `asked` (`u64::MAX`: for as long as spinning can pay, which a
    /// policy of polling asked for and keeps).
    pub fn limit(&self, asked: u64) -> u64 {
        if self.trimmed && asked != u64::MAX {
            asked.min(TRIMMED_SPIN)
        } else {
            asked
        }
    }

    /// A wait ended so.
    pub fn ended(&mut self, end: WaitEnd) {
        match end {
            WaitEnd::Quick => {}
            WaitEnd::Slept(slept) if slept >= LONG_SLEEP => {
                if !self.trimmed {
                    self.long_in_a_row += 1;
                    self.trimmed = self.long_in_a_row >= LONG_WAITS_TO_TRIM;
                }
            }
            WaitEnd::Spun | WaitEnd::Slept(_) => *self = SpinTrim::default(),
        }
    }

    /// Whether waits spin only the fast path's turns now.
    pub fn trimmed(&self) -> bool {
        self.trimmed
    }
}

/// What a wait publishes about itself (`CTRL_WAIT_FLAGS` and after), kept here so that publishing is a store.
#[derive(Debug, Default, Clone, Copy)]
struct WaitTotals {
    flags: u32,
    turns: u64,
    sleeps: u64,
    cut_short: u64,
}

/// What a look during a spin decides (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// The producer can be running elsewhere: spin on.
    Spin,
    /// The producer cannot be running while this side spins: sleep now.
    Stop,
    /// Nothing says: spin on, but not beyond [`BLIND_SPIN`] turns.
    Blind,
}

/// The rule of a look: stop when the producer's side last waited on this very processor (`partner_cpu`, as it
/// published it: processor + 1, 0 for not known; `here`: where this thread runs), which it cannot have left while
/// this side spins here; otherwise as the run queue says (`crowding`, asked only then, with the number of
/// runnable tasks it may not count yet: 1 when the partner has not said it is awake, `partner_asleep`, since it
/// was woken for what this side waits for).
pub fn look(partner_cpu: u32, partner_asleep: bool, here: Option<u32>, crowding: impl FnOnce(u32) -> Crowding) -> Look {
    if partner_cpu != 0 && here.is_some_and(|cpu| cpu.saturating_add(1) == partner_cpu) {
        return Look::Stop;
    }
    match crowding(u32::from(partner_asleep)) {
        Crowding::Room => Look::Spin,
        Crowding::Crowded => Look::Stop,
        Crowding::Unknown => Look::Blind,
    }
}

/// Where the next real record is.
struct Next {
    off: usize,
    header: [u8; HEADER_LEN],
    len: usize,
}

impl Consumer {
    /// The consumer of `ring`, whose producer is the consumer of `partner`.
    pub(crate) fn new(ring: RingShared, partner: RingShared) -> Self {
        Consumer {
            ring,
            partner,
            head: 0,
            published: 0,
            slice: SLEEP_SLICE,
            full_sleeps: 0,
            crowding: runqueue::crowding,
            cut_short: false,
            stats: WaitTotals::default(),
            trim: SpinTrim::default(),
        }
    }

    /// Whether this side's waits spin only the fast path's turns, their full spin not paying (see [`SpinTrim`]).
    pub fn spin_trimmed(&self) -> bool {
        self.trim.trimmed()
    }

    #[cfg(test)]
    pub(crate) fn set_crowding(&mut self, crowding: fn(u32) -> Crowding) {
        self.crowding = crowding;
    }

    /// Whether a wait stopped spinning early, because the producer could not be running, since this was last
    /// asked.
    pub fn take_cut_short(&mut self) -> bool {
        std::mem::take(&mut self.cut_short)
    }

    /// Publish where this side waits, for the partner's looks.
    fn publish_cpu(&self) {
        if let Some(cpu) = runqueue::current_cpu() {
            self.ring.cpu().store(cpu.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// Say that where this side waits is not known.
    fn forget_cpu(&self) {
        if self.ring.cpu().load(Ordering::Relaxed) != 0 {
            self.ring.cpu().store(0, Ordering::Relaxed);
        }
    }

    #[cfg(test)]
    pub(crate) fn set_sleep_slice(&mut self, slice: Duration) {
        self.slice = slice;
    }

    #[cfg(test)]
    pub(crate) fn full_sleeps(&self) -> u64 {
        self.full_sleeps
    }

    fn publish_head(&mut self) {
        if self.head != self.published {
            // Release: our copies out of the data area happen before the producer may reuse it.
            self.ring.head().store(self.head, Ordering::Release);
            self.published = self.head;
        }
    }

    /// Find the next real record, skipping (and consuming) PAD records. Does not publish the head.
    ///
    /// Readiness is the length word of the slot at the head: zero until the producer has written the whole record
    /// there (it zeroes each next slot before it publishes a length). So waiting reads one cache line, the one the
    /// record arrives in, not a separate tail and then the record.
    fn next(&mut self) -> Result<Option<Next>, RingError> {
        let mut skipped = 0usize;
        loop {
            let off = (self.head & self.ring.mask()) as usize;
            let to_end = self.ring.capacity - off;
            // head is 16-aligned (it only advances by validated lengths), so the header fits before the end.
            let len = self.ring.load_len(off) as usize;
            if len == 0 {
                return Ok(None);
            }
            let mut header = self.ring.read_header(off);
            // The length checked is the one the record is taken with.
            header[..4].copy_from_slice(&(len as u32).to_le_bytes());
            if len < HEADER_LEN || len & (RECORD_ALIGN - 1) != 0 {
                return Err(RingError::Corrupt("record length is not a positive multiple of 16"));
            }
            if len > to_end {
                return Err(RingError::Corrupt("record straddles the end of the ring"));
            }
            if header[4] == OP_PAD {
                skipped += len;
                if skipped > self.ring.capacity {
                    return Err(RingError::Corrupt("nothing but padding all round the ring"));
                }
                self.head = self.head.wrapping_add(len as u64);
                continue;
            }
            if len > MAX_RECORD {
                return Err(RingError::Corrupt("record longer than MAX_RECORD"));
            }
            return Ok(Some(Next { off, header, len }));
        }
    }

    /// Copy the next record into `buf`, skip PAD records, advance and publish the head. `Ok(None)` when empty.
    ///
    /// `buf` should be at least [`MAX_RECORD`] long; a record longer than `buf` is left in the ring and reported as
    /// `BadRecord(len)`. `Corrupt` means the producer broke the ring (see the module docs).
    pub fn pop(&mut self, buf: &mut [u8]) -> Result<Option<usize>, RingError> {
        let next = match self.next() {
            Ok(Some(next)) => next,
            Ok(None) => {
                self.publish_head();
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let Some(dst) = buf.get_mut(..next.len) else {
            self.publish_head();
            return Err(RingError::BadRecord(next.len));
        };
        self.ring.read_data(next.off, dst);
        // The header we validated, not whatever the producer may have rewritten since.
        dst[..HEADER_LEN].copy_from_slice(&next.header);
        self.head = self.head.wrapping_add(next.len as u64);
        // The producer only needs our head to know how much room it has: publishing it after every record would
        // bounce its cache line for nothing. Publish when a quarter of the ring has been consumed; the ring being
        // found empty (below, and in `is_empty`/`wait`) publishes the rest.
        if self.head.wrapping_sub(self.published) as usize >= self.ring.capacity / 4 {
            self.publish_head();
        }
        Ok(Some(next.len))
    }

    /// Whether no record is available (PAD records are consumed on the way).
    pub fn is_empty(&mut self) -> Result<bool, RingError> {
        let next = self.next()?;
        self.publish_head();
        Ok(next.is_none())
    }

    /// Give this thread's processor away (`sched_yield`) up to `yields` times, looking at the ring before each:
    /// `Some(Ready)` or `Some(Stopped)` as soon as a record is there or `stop()` returns true, `None` if neither
    /// came. For a producer that runs on this processor: yielding lets it run at once, and a consumer that yields
    /// instead of sleeping needs no wake-up for the record (so the scheduler has no chance to wake it on another
    /// processor). A producer elsewhere gets a short spin out of it, at a system call a turn.
    pub fn yield_for(&mut self, yields: u32, stop: &dyn Fn() -> bool) -> Result<Option<WaitOutcome>, RingError> {
        for _ in 0..yields {
            if !self.is_empty()? {
                return Ok(Some(WaitOutcome::Ready));
            }
            if stop() {
                return Ok(Some(WaitOutcome::Stopped));
            }
            std::thread::yield_now();
        }
        Ok((!self.is_empty()?).then_some(WaitOutcome::Ready))
    }

    /// Block until a record is available (`Ready`), `deadline` passes (`TimedOut`) or `stop()` returns true
    /// (`Stopped`). A record already there wins over both.
    ///
    /// Spins up to `spin` iterations first (fewer while its spins do not pay: [`SpinTrim`]; checking `stop()` and
    /// the clock every 256), then sleeps on the doorbell
    /// in slices of at most 50 ms; `spin == u32::MAX` spins for as long as spinning can pay. The spin stops early,
    /// for the sleep, once the producer cannot be running (see the module docs). `Corrupt` if the producer broke
    /// the ring. A [`Deadline::after`] is fixed at the first check, so a record that comes sooner costs no clock
    /// read.
    pub fn wait(
        &mut self,
        spin: u32,
        mut deadline: Option<&mut Deadline>,
        stop: &dyn Fn() -> bool,
    ) -> Result<WaitOutcome, RingError> {
        if !self.is_empty()? {
            return Ok(WaitOutcome::Ready);
        }
        let asked = if spin == u32::MAX { u64::MAX } else { u64::from(spin) };
        let mut limit = self.trim.limit(asked);
        let mut spun: u64 = 0;
        let mut next_look = FIRST_LOOK;
        let spun_out = loop {
            if spun >= limit {
                break None;
            }
            hint::spin_loop();
            if !self.is_empty()? {
                break Some(WaitOutcome::Ready);
            }
            spun += 1;
            if spun & (u64::from(SPIN_CHECK_EVERY) - 1) == 0 {
                if stop() {
                    break Some(WaitOutcome::Stopped);
                }
                if deadline.as_deref_mut().is_some_and(Deadline::passed) {
                    break Some(WaitOutcome::TimedOut);
                }
            }
            if spun == next_look {
                if spun == FIRST_LOOK {
                    // The wait turns slow: say where, for the partner's looks.
                    self.publish_cpu();
                }
                next_look += LOOK_EVERY;
                let partner_cpu = self.partner.cpu().load(Ordering::Relaxed);
                let partner_asleep = self.partner.waiting().load(Ordering::Relaxed) != 0;
                match look(partner_cpu, partner_asleep, runqueue::current_cpu(), self.crowding) {
                    Look::Spin => {}
                    Look::Stop => {
                        self.cut_short = true;
                        self.stats.cut_short += 1;
                        self.ring.atomic_u64(CTRL_CUT_SHORT).store(self.stats.cut_short, Ordering::Relaxed);
                        break None;
                    }
                    Look::Blind => {
                        limit = limit.min(BLIND_SPIN);
                        if self.stats.flags & WAIT_FLAG_NO_RUNQUEUE == 0 {
                            self.stats.flags |= WAIT_FLAG_NO_RUNQUEUE;
                            self.ring.atomic_u32(CTRL_WAIT_FLAGS).store(self.stats.flags, Ordering::Relaxed);
                        }
                    }
                }
            }
        };
        if spun != 0 {
            // One store to a line only this side writes: nothing the fast path would notice.
            self.stats.turns += spun;
            self.ring.atomic_u64(CTRL_SPIN_TURNS).store(self.stats.turns, Ordering::Relaxed);
        }
        if let Some(outcome) = spun_out {
            if outcome == WaitOutcome::Ready && spin != 0 {
                self.trim.ended(if spun <= TRIMMED_SPIN { WaitEnd::Quick } else { WaitEnd::Spun });
            }
            return Ok(outcome);
        }
        if spin == 0 {
            // Handing over: where this side sleeps was chosen for it, and the partner does not spin meanwhile.
            // What it said before is stale (it ran where it was put): it says nothing.
            self.forget_cpu();
        }
        // A sleep costs microseconds: two clock reads to learn whether spinning pays are nothing beside it.
        let asleep_at = (spin != 0).then(Instant::now);
        let outcome = self.sleep(deadline.map(Deadline::instant), stop);
        self.ring.waiting().store(0, Ordering::Relaxed);
        if let (Some(at), Ok(WaitOutcome::Ready)) = (asleep_at, &outcome) {
            self.trim.ended(WaitEnd::Slept(at.elapsed()));
        }
        if spin != 0 {
            // Woken, maybe on another processor than before: say where this side runs now.
            self.publish_cpu();
        }
        outcome
    }

    /// The sleeping half of `wait`; the caller clears `waiting` afterwards.
    fn sleep(&mut self, deadline: Option<Instant>, stop: &dyn Fn() -> bool) -> Result<WaitOutcome, RingError> {
        loop {
            self.ring.waiting().store(1, Ordering::Relaxed);
            // Pairs with the producer's fence between its tail store and its load of `waiting`.
            fence(Ordering::SeqCst);
            let bell = self.ring.doorbell().load(Ordering::Acquire);
            if !self.is_empty()? {
                return Ok(WaitOutcome::Ready);
            }
            if stop() {
                return Ok(WaitOutcome::Stopped);
            }
            let now = Instant::now();
            let slice = match deadline {
                None => self.slice,
                Some(d) => match d.checked_duration_since(now) {
                    Some(left) if !left.is_zero() => left.min(self.slice),
                    _ => return Ok(WaitOutcome::TimedOut),
                },
            };
            futex::wait(self.ring.doorbell(), bell, Some(slice));
            self.stats.sleeps += 1;
            self.ring.atomic_u64(CTRL_SLEEPS).store(self.stats.sleeps, Ordering::Relaxed);
            if now.elapsed() >= slice {
                self.full_sleeps += 1;
            }
        }
    }

    /// Capacity of the ring's data area.
    pub fn capacity(&self) -> usize {
        self.ring.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{rep_data_off, WaitStats, REP_CTRL_OFF, REQ_CTRL_OFF, REQ_DATA_OFF};
    use std::cell::Cell;
    use std::rc::Rc;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    const CAP: usize = 8192;

    /// A record of `len` bytes carrying `seq` in its id and a pattern derived from it in its body.
    fn record(len: usize, seq: u64) -> Vec<u8> {
        let mut r = vec![0u8; len];
        r[..4].copy_from_slice(&(len as u32).to_le_bytes());
        r[4] = 7;
        r[8..16].copy_from_slice(&seq.to_le_bytes());
        for (i, b) in r[16..].iter_mut().enumerate() {
            *b = (seq as u8).wrapping_mul(31).wrapping_add(i as u8);
        }
        r
    }

    fn pair(cap: usize) -> (Region, Producer, Consumer) {
        let region = Region::create(cap).unwrap();
        let (p, c) = region.host_endpoints();
        // Use the request ring both ways: producer from the host pair, consumer from the domain pair.
        let (dc, _dp) = region.domain_endpoints();
        drop(c);
        (region, p, dc)
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn records_cross_the_wrap_in_order() {
        let (_r, mut p, mut c) = pair(CAP);
        let mut rng = Rng(0x1234_5678);
        let mut buf = [0u8; MAX_RECORD];
        let (mut sent, mut got) = (0u64, 0u64);
        let mut in_flight = std::collections::VecDeque::new();
        while got < 5000 {
            // Push a random number of random-size records, then pop a random number.
            for _ in 0..rng.next() % 8 {
                let len = ((rng.next() as usize % MAX_RECORD) / 16 + 1) * 16;
                let rec = record(len, sent);
                match p.push(&rec) {
                    Ok(()) => {
                        in_flight.push_back(rec);
                        sent += 1;
                    }
                    Err(RingError::Full) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            p.publish();
            for _ in 0..rng.next() % 8 {
                match c.pop(&mut buf).unwrap() {
                    Some(n) => {
                        let want = in_flight.pop_front().expect("popped more than pushed");
                        assert_eq!(&buf[..n], &want[..]);
                        got += 1;
                    }
                    None => {
                        assert!(in_flight.is_empty());
                        break;
                    }
                }
            }
        }
        // Positions went round the ring many times.
        assert!(p.tail > 100 * CAP as u64);
    }

    #[test]
    fn full_until_the_consumer_frees() {
        let (_r, mut p, mut c) = pair(CAP);
        assert_eq!(p.free_space(), CAP);
        let rec = record(1024, 1);
        // A gap of 16 bytes always stays free (the zeroed slot after the last record): seven records of 1 KiB and
        // one of 1 KiB - 16 fill the ring.
        for _ in 0..CAP / 1024 - 1 {
            p.push(&rec).unwrap();
        }
        p.push(&record(1024 - 16, 1)).unwrap();
        assert_eq!(p.push(&record(16, 2)), Err(RingError::Full));
        assert_eq!(p.free_space(), 16);
        // Pushed is visible, published or not: publishing only wakes a sleeper.
        assert!(!c.is_empty().unwrap());
        assert!(p.pending());
        p.publish();
        assert!(!p.pending());
        let mut buf = [0u8; MAX_RECORD];
        assert_eq!(c.pop(&mut buf).unwrap(), Some(1024));
        // The head is published lazily: not after one record...
        assert_eq!(p.free_space(), 16);
        assert_eq!(p.push(&record(16, 2)), Err(RingError::Full));
        // ...but once a quarter of the ring has been consumed...
        for _ in 1..CAP / 4 / 1024 {
            assert_eq!(c.pop(&mut buf).unwrap(), Some(1024));
        }
        assert_eq!(p.free_space(), CAP / 4 + 16);
        p.push(&rec).unwrap();
        // ...and whenever the consumer finds the ring empty.
        while c.pop(&mut buf).unwrap().is_some() {}
        assert_eq!(p.free_space(), CAP);
    }

    #[test]
    fn pad_fills_the_end_and_is_skipped() {
        let (region, mut p, mut c) = pair(CAP);
        let mut buf = [0u8; MAX_RECORD];
        // Leave 48 bytes before the end (in two records: CAP - 48 > MAX_RECORD), then push a record of 64: a PAD of
        // 48 then the record at 0.
        p.push(&record(4096, 0)).unwrap();
        p.push(&record(CAP - 48 - 4096, 1)).unwrap();
        p.publish();
        assert_eq!(c.pop(&mut buf).unwrap(), Some(4096));
        assert_eq!(c.pop(&mut buf).unwrap(), Some(CAP - 48 - 4096));
        p.push(&record(64, 2)).unwrap();
        p.publish();
        // The PAD is in the data area.
        let mut pad = [0u8; 16];
        region.memory().read_at(REQ_DATA_OFF + CAP - 48, &mut pad).unwrap();
        assert_eq!(u32::from_le_bytes(pad[..4].try_into().unwrap()), 48);
        assert_eq!(pad[4], OP_PAD);
        assert_eq!(c.pop(&mut buf).unwrap(), Some(64));
        assert_eq!(&buf[..64], &record(64, 2)[..]);
        assert_eq!(c.pop(&mut buf).unwrap(), None);
        assert_eq!(c.head, p.tail);
    }

    #[test]
    fn nothing_but_padding_is_corrupt() {
        let (region, _p, mut c) = pair(CAP);
        // Forge PADs all round the ring: the consumer would go round for ever.
        let mut pad = [0u8; 16];
        pad[..4].copy_from_slice(&(CAP as u32 / 2).to_le_bytes());
        pad[4] = OP_PAD;
        region.memory().write_at(REQ_DATA_OFF, &pad).unwrap();
        region.memory().write_at(REQ_DATA_OFF + CAP / 2, &pad).unwrap();
        assert_eq!(c.is_empty(), Err(RingError::Corrupt("nothing but padding all round the ring")));
    }

    #[test]
    fn a_zero_length_slot_is_empty_and_a_reset_empties_the_ring() {
        let (region, mut p, mut c) = pair(CAP);
        assert!(c.is_empty().unwrap());
        p.push(&record(64, 1)).unwrap();
        assert!(!c.is_empty().unwrap());
        // Between incarnations the host resets the rings: the old record must not be seen again.
        region.reset();
        let (mut p, _) = region.host_endpoints();
        let (mut c, _) = region.domain_endpoints();
        assert!(c.is_empty().unwrap());
        p.push(&record(32, 2)).unwrap();
        let mut buf = [0u8; MAX_RECORD];
        assert_eq!(c.pop(&mut buf).unwrap(), Some(32));
        assert_eq!(&buf[..32], &record(32, 2)[..]);
    }

    #[test]
    fn bad_records_are_refused_by_push() {
        let (_r, mut p, _c) = pair(CAP);
        assert_eq!(p.push(&[]), Err(RingError::BadRecord(0)));
        assert_eq!(p.push(&[0u8; 8]), Err(RingError::BadRecord(8)));
        assert_eq!(p.push(&record(32, 0)[..24]), Err(RingError::BadRecord(24)));
        let mut wrong = record(32, 0);
        wrong[0] = 48;
        assert_eq!(p.push(&wrong), Err(RingError::BadRecord(32)));
        let mut big = vec![0u8; MAX_RECORD + 16];
        big[..4].copy_from_slice(&((MAX_RECORD + 16) as u32).to_le_bytes());
        assert_eq!(p.push(&big), Err(RingError::BadRecord(MAX_RECORD + 16)));
        assert!(!p.pending());
    }

    /// A consumer over a ring whose control and data we forge through the mapping.
    fn forged() -> (Region, Consumer) {
        let region = Region::create(CAP).unwrap();
        let (c, _p) = region.domain_endpoints();
        (region, c)
    }

    fn set_tail(region: &Region, tail: u64) {
        region.memory().write_at(REQ_CTRL_OFF + CTRL_TAIL, &tail.to_le_bytes()).unwrap();
    }

    fn set_len(region: &Region, off: usize, len: u32) {
        region.memory().write_at(REQ_DATA_OFF + off, &len.to_le_bytes()).unwrap();
    }

    #[test]
    fn the_tail_word_is_only_a_wake_up_hint() {
        // A producer that scribbles on the shared tail cannot mislead the consumer: readiness is the record's own
        // length word.
        let mut buf = [0u8; MAX_RECORD];
        let (region, mut c) = forged();
        set_tail(&region, CAP as u64 + 16);
        assert_eq!(c.pop(&mut buf).unwrap(), None);
        set_len(&region, 0, 16);
        set_tail(&region, 8);
        assert_eq!(c.pop(&mut buf).unwrap(), Some(16));
        assert_eq!(c.pop(&mut buf).unwrap(), None);
    }

    #[test]
    fn corrupt_lengths_are_detected() {
        let mut buf = [0u8; MAX_RECORD];
        let cases: [(u32, &str); 4] = [
            (8, "record length is not a positive multiple of 16"),
            (24, "record length is not a positive multiple of 16"),
            (MAX_RECORD as u32 + 16, "record longer than MAX_RECORD"),
            (CAP as u32 + 16, "record straddles the end of the ring"),
        ];
        for (len, why) in cases {
            let (region, mut c) = forged();
            set_len(&region, 0, len);
            assert_eq!(c.pop(&mut buf), Err(RingError::Corrupt(why)), "len {len}");
        }
        // Straddling at a non-zero offset.
        let (region, mut c) = forged();
        set_len(&region, 0, (CAP - 64) as u32);
        region.memory().write_at(REQ_DATA_OFF + 4, &[OP_PAD]).unwrap();
        set_len(&region, CAP - 64, 128);
        assert_eq!(c.pop(&mut buf), Err(RingError::Corrupt("record straddles the end of the ring")));
    }

    #[test]
    fn pop_into_a_small_buffer_keeps_the_record() {
        let (_r, mut p, mut c) = pair(CAP);
        p.push(&record(64, 5)).unwrap();
        p.publish();
        let mut small = [0u8; 32];
        assert_eq!(c.pop(&mut small), Err(RingError::BadRecord(64)));
        let mut buf = [0u8; MAX_RECORD];
        assert_eq!(c.pop(&mut buf).unwrap(), Some(64));
    }

    #[test]
    fn the_copy_keeps_the_validated_header() {
        // Whatever the producer writes to the shared header after validation, the copy carries the validated one:
        // check the simplest part of that, that the header in the buffer is the one the length came from.
        let (region, mut c) = forged();
        let rec = record(48, 9);
        region.memory().write_at(REQ_DATA_OFF, &rec).unwrap();
        set_tail(&region, 48);
        let mut buf = [0xffu8; MAX_RECORD];
        assert_eq!(c.pop(&mut buf).unwrap(), Some(48));
        assert_eq!(&buf[..48], &rec[..]);
    }

    #[test]
    fn corrupt_heads_are_detected_by_the_producer() {
        let (region, mut p, _c) = pair(CAP);
        p.push(&record(4096, 0)).unwrap();
        p.push(&record(2048, 1)).unwrap();
        // Head beyond the pushed tail.
        region.memory().write_at(REQ_CTRL_OFF + CTRL_HEAD, &(CAP as u64 + 16).to_le_bytes()).unwrap();
        assert!(matches!(p.push(&record(4096, 2)), Err(RingError::Corrupt(_))));
        region.memory().write_at(REQ_CTRL_OFF + CTRL_HEAD, &8u64.to_le_bytes()).unwrap();
        assert!(matches!(p.push(&record(4096, 2)), Err(RingError::Corrupt(_))));
        region.memory().write_at(REQ_CTRL_OFF + CTRL_HEAD, &4096u64.to_le_bytes()).unwrap();
        p.push(&record(2048, 2)).unwrap();
        // Head moving backwards.
        region.memory().write_at(REQ_CTRL_OFF + CTRL_HEAD, &0u64.to_le_bytes()).unwrap();
        assert!(matches!(p.push(&record(4096, 3)), Err(RingError::Corrupt(_))));
    }

    #[test]
    fn endpoints_can_move_between_threads() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<Producer>();
        send::<Consumer>();
        send_sync::<Region>();
        send_sync::<crate::shm::SharedMemory>();
        send_sync::<crate::pool::MappedPool>();
        send::<crate::pool::HostPool>();
    }

    #[test]
    fn both_rings_are_separate() {
        let region = Region::create(CAP).unwrap();
        let (mut hp, mut hc) = region.host_endpoints();
        let (mut dc, mut dp) = region.domain_endpoints();
        let mut buf = [0u8; MAX_RECORD];
        hp.push(&record(32, 1)).unwrap();
        hp.publish();
        dp.push(&record(48, 2)).unwrap();
        dp.publish();
        assert_eq!(dc.pop(&mut buf).unwrap(), Some(32));
        assert_eq!(hc.pop(&mut buf).unwrap(), Some(48));
        let mut raw = [0u8; 48];
        region.memory().read_at(rep_data_off(CAP), &mut raw).unwrap();
        assert_eq!(&raw[..], &record(48, 2)[..]);
        let mut tail = [0u8; 8];
        region.memory().read_at(REP_CTRL_OFF + CTRL_TAIL, &mut tail).unwrap();
        assert_eq!(u64::from_le_bytes(tail), 48);
    }

    #[test]
    fn wait_times_out() {
        let (_r, _p, mut c) = pair(CAP);
        for spin in [0, 1000] {
            let start = Instant::now();
            let deadline = start + Duration::from_millis(30);
            assert_eq!(c.wait(spin, Some(&mut Deadline::at(deadline)), &|| false).unwrap(), WaitOutcome::TimedOut);
            assert!(Instant::now() >= deadline);
        }
        // A deadline already past, with a pure-polling consumer.
        let past = Instant::now();
        assert_eq!(c.wait(u32::MAX, Some(&mut Deadline::at(past)), &|| false).unwrap(), WaitOutcome::TimedOut);
    }

    #[test]
    fn wait_stops() {
        let (_r, _p, mut c) = pair(CAP);
        assert_eq!(c.wait(0, None, &|| true).unwrap(), WaitOutcome::Stopped);
        assert_eq!(c.wait(u32::MAX, None, &|| true).unwrap(), WaitOutcome::Stopped);
        assert_eq!(c.wait(1000, None, &|| true).unwrap(), WaitOutcome::Stopped);
    }

    #[test]
    fn wait_sees_a_ready_record_first() {
        let (_r, mut p, mut c) = pair(CAP);
        p.push(&record(16, 0)).unwrap();
        p.publish();
        assert_eq!(c.wait(0, Some(&mut Deadline::at(Instant::now())), &|| true).unwrap(), WaitOutcome::Ready);
    }

    #[test]
    fn yielding_sees_a_record_or_a_stop_and_otherwise_gives_up() {
        let (_r, mut p, mut c) = pair(CAP);
        assert_eq!(c.yield_for(8, &|| false).unwrap(), None, "nothing came");
        assert_eq!(c.yield_for(8, &|| true).unwrap(), Some(WaitOutcome::Stopped));
        assert_eq!(c.yield_for(0, &|| true).unwrap(), None, "no turn, no look at stop");
        p.push(&record(16, 0)).unwrap();
        assert!(!p.publish(), "a consumer that yields is not asleep: no wake-up");
        assert_eq!(c.yield_for(8, &|| true).unwrap(), Some(WaitOutcome::Ready), "a record wins over a stop");
        assert_eq!(c.yield_for(0, &|| false).unwrap(), Some(WaitOutcome::Ready), "and is seen without a turn");
    }

    #[test]
    fn a_record_published_while_the_consumer_yields_is_seen_without_a_wake_up() {
        let (_r, mut p, mut c) = pair(CAP);
        let consumer = std::thread::spawn(move || {
            // As many turns as it takes: the producer publishes after the consumer has begun.
            let outcome = c.yield_for(u32::MAX, &|| false);
            (outcome, c)
        });
        p.push(&record(16, 0)).unwrap();
        assert!(!p.publish(), "the consumer yields, it does not sleep");
        let (outcome, _c) = consumer.join().unwrap();
        assert_eq!(outcome.unwrap(), Some(WaitOutcome::Ready));
    }

    #[test]
    fn publish_says_whether_it_woke_a_sleeping_consumer() {
        let (_r, mut p, mut c) = pair(CAP);
        assert!(!p.publish(), "nothing pending");
        p.push(&record(16, 0)).unwrap();
        assert!(!p.publish(), "the consumer is not asleep");
        let mut buf = [0u8; 64];
        assert_eq!(c.pop(&mut buf).unwrap(), Some(16));
        let sleeper = std::thread::spawn(move || {
            let outcome = c.wait(0, None, &|| false);
            (outcome, c)
        });
        // Until the consumer says it sleeps (or is about to: it checks the ring once more after saying so).
        while p.ring.waiting().load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        p.push(&record(16, 1)).unwrap();
        assert!(p.publish(), "the consumer was asleep");
        let (outcome, _c) = sleeper.join().unwrap();
        assert_eq!(outcome.unwrap(), WaitOutcome::Ready);
    }

    #[test]
    fn a_kick_wakes_a_sleeper_to_see_stop() {
        let region = Region::create(CAP).unwrap();
        let (_p, mut c) = region.host_endpoints();
        // A slice far longer than the test: only the kick can end the sleep in time.
        c.set_sleep_slice(Duration::from_secs(60));
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let sleeper = std::thread::spawn(move || {
            let outcome = c.wait(0, None, &|| stop2.load(Ordering::SeqCst));
            (outcome, c)
        });
        stop.store(true, Ordering::SeqCst);
        region.kick_reply_ring();
        let (outcome, c) = sleeper.join().unwrap();
        assert_eq!(outcome.unwrap(), WaitOutcome::Stopped);
        assert_eq!(c.full_sleeps(), 0);
    }

    fn room(_: u32) -> Crowding {
        Crowding::Room
    }

    fn crowded(_: u32) -> Crowding {
        Crowding::Crowded
    }

    fn unknown(_: u32) -> Crowding {
        Crowding::Unknown
    }

    /// A `stop` for `wait` that says stop from its `n`th question on, and how many it was asked.
    fn stop_at(n: u32) -> (impl Fn() -> bool, Rc<Cell<u32>>) {
        let asked = Rc::new(Cell::new(0u32));
        let counter = Rc::clone(&asked);
        let stop = move || {
            counter.set(counter.get() + 1);
            counter.get() >= n
        };
        (stop, asked)
    }

    /// Wait on an empty ring (the request ring's consumer, whose statistics are the domain's) with `spin`, as
    /// `crowding` says, until `stop` (asked every 256 turns and once before each sleep) says stop.
    fn wait_empty(spin: u32, crowding: fn(u32) -> Crowding, stop_at_question: u32) -> (WaitStats, bool, u32) {
        let (region, _p, mut c) = pair(CAP);
        c.set_crowding(crowding);
        let (stop, asked) = stop_at(stop_at_question);
        assert_eq!(c.wait(spin, None, &stop).unwrap(), WaitOutcome::Stopped);
        (region.domain_wait_stats(), c.take_cut_short(), asked.get())
    }

    #[test]
    fn with_room_on_the_machine_a_wait_spins_all_its_turns_before_it_sleeps() {
        // 100000 turns check `stop` 390 times; the 391st question is the sleep's.
        let (stats, cut, asked) = wait_empty(100_000, room, 391);
        assert_eq!(stats.spin_turns, 100_000, "every turn spun");
        assert_eq!((stats.cut_short, cut, stats.flags), (0, false, 0));
        assert_eq!(asked, 391, "then went to sleep, which asked once more");
        assert_eq!(stats.sleeps, 0, "and was stopped before the futex");
    }

    #[test]
    fn the_rule_of_a_trimmed_spin() {
        let long = WaitEnd::Slept(LONG_SLEEP);
        let mut trim = SpinTrim::default();
        assert_eq!(trim.limit(2000), 2000);
        for _ in 1..LONG_WAITS_TO_TRIM {
            trim.ended(long);
            // Records within the fast path say nothing either way.
            trim.ended(WaitEnd::Quick);
        }
        assert!(!trim.trimmed(), "one long wait short of trimming");
        trim.ended(WaitEnd::Spun);
        for _ in 1..LONG_WAITS_TO_TRIM {
            trim.ended(long);
        }
        assert!(!trim.trimmed(), "a spin that paid starts the count again");
        trim.ended(long);
        assert!(trim.trimmed());
        assert_eq!(trim.limit(2000), TRIMMED_SPIN);
        assert_eq!(trim.limit(10), 10, "never more than asked");
        assert_eq!(trim.limit(u64::MAX), u64::MAX, "a polling wait keeps polling");
        trim.ended(long);
        trim.ended(WaitEnd::Quick);
        assert!(trim.trimmed(), "long sleeps and quick records keep it trimmed");
        trim.ended(WaitEnd::Slept(LONG_SLEEP - Duration::from_micros(1)));
        assert!(!trim.trimmed(), "a record soon after the trimmed spin gives the full spin back");
        assert_eq!(trim.limit(2000), 2000);
        trim.ended(long);
        assert!(!trim.trimmed(), "and the count starts again");
    }

    #[test]
    fn a_consumer_whose_records_come_long_after_its_spin_trims_it() {
        let (region, mut p, mut c) = pair(CAP);
        c.set_crowding(room);
        let waits = LONG_WAITS_TO_TRIM as u64;
        let consumer = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            for _ in 0..waits {
                assert_eq!(c.wait(2000, None, &|| false).unwrap(), WaitOutcome::Ready);
                assert_eq!(c.pop(&mut buf).unwrap(), Some(16));
            }
            let trimmed = c.spin_trimmed();
            let (stop, _) = stop_at(2);
            assert_eq!(c.wait(2000, None, &stop).unwrap(), WaitOutcome::Stopped);
            trimmed
        });
        let empty = p.free_space();
        for seq in 0..waits {
            // Each record well after the consumer went to sleep for it: its spin ran out, and the sleep was long. The
            // consumer has taken every record before (it publishes that as its wait begins) and says it sleeps again:
            // a `waiting` left over from its sleep for the record before, not yet cleared by a consumer slow to wake
            // on a loaded machine, would start this sleep too early.
            while p.free_space() != empty || p.ring.waiting().load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            std::thread::sleep(LONG_SLEEP * 2);
            p.push(&record(16, seq)).unwrap();
            p.publish();
        }
        assert!(consumer.join().unwrap(), "trimmed after {waits} long waits");
        let stats = region.domain_wait_stats();
        assert_eq!(stats.spin_turns, waits * 2000 + TRIMMED_SPIN, "the last wait spun the fast path's turns only");
    }

    #[test]
    fn with_room_on_the_machine_a_polling_wait_never_sleeps() {
        let (stats, cut, asked) = wait_empty(u32::MAX, room, 1000);
        assert_eq!(asked, 1000);
        assert_eq!(stats.spin_turns, 1000 * u64::from(SPIN_CHECK_EVERY), "stopped while spinning");
        assert_eq!((stats.cut_short, cut, stats.sleeps), (0, false, 0));
    }

    #[test]
    fn on_a_crowded_machine_a_wait_stops_spinning_at_its_first_look() {
        for spin in [100_000, u32::MAX] {
            let (stats, cut, asked) = wait_empty(spin, crowded, 1);
            assert_eq!(stats.spin_turns, FIRST_LOOK, "spin {spin}");
            assert_eq!((stats.cut_short, cut), (1, true), "spin {spin}");
            assert_eq!(asked, 1, "spin {spin}: the first question was the sleep's");
        }
        // A wait too short to look never stops early.
        let (stats, cut, _) = wait_empty(FIRST_LOOK as u32 - 1, crowded, 1);
        assert_eq!((stats.spin_turns, stats.cut_short, cut), (FIRST_LOOK - 1, 0, false));
    }

    #[test]
    fn where_the_run_queue_cannot_be_read_a_wait_spins_briefly_and_says_so() {
        for spin in [100_000, u32::MAX] {
            let questions = (BLIND_SPIN / u64::from(SPIN_CHECK_EVERY)) as u32 + 1;
            let (stats, cut, asked) = wait_empty(spin, unknown, questions);
            assert_eq!(stats.spin_turns, BLIND_SPIN, "spin {spin}");
            assert_eq!(stats.flags, WAIT_FLAG_NO_RUNQUEUE);
            assert_eq!((stats.cut_short, cut, asked), (0, false, questions), "spin {spin}");
        }
        let (stats, _, _) = wait_empty(100, unknown, 1);
        assert_eq!(stats.spin_turns, 100, "a shorter spin is kept");
    }

    #[test]
    fn the_rule_of_a_look() {
        assert_eq!(look(0, false, Some(0), room), Look::Spin, "0: the partner's processor is not known");
        assert_eq!(look(4, false, Some(3), |_| panic!("no need to ask")), Look::Stop, "the partner waits for this one");
        assert_eq!(look(4, false, Some(2), room), Look::Spin);
        assert_eq!(look(4, false, None, room), Look::Spin);
        assert_eq!(look(4, false, Some(2), crowded), Look::Stop);
        assert_eq!(look(0, false, None, unknown), Look::Blind);
        // Two processors, two tasks counted: room, unless the partner is being woken and not counted yet.
        let two_of_two = |uncounted: u32| {
            if runqueue::may_spin(2 + uncounted, 2) {
                Crowding::Room
            } else {
                Crowding::Crowded
            }
        };
        assert_eq!(look(0, false, Some(0), two_of_two), Look::Spin);
        assert_eq!(look(0, true, Some(0), two_of_two), Look::Stop, "a partner not yet awake counts");
    }

    /// Let the calling thread run on `cpu` only.
    fn pin_this_thread(cpu: u32) {
        // SAFETY: an all-zero cpu_set_t is the empty set; `cpu` comes from sched_getcpu, below CPU_SETSIZE.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is a processor number the kernel gave, inside the set's bits.
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
        // SAFETY: `set` is an initialised cpu_set_t of the size given; the kernel only reads it.
        let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
    }

    #[test]
    fn a_wait_stops_spinning_when_its_partner_last_waited_on_this_processor() {
        // A thread of its own, pinned, so that the processor it publishes and looks from stays the same.
        std::thread::spawn(|| {
            let cpu = runqueue::current_cpu().expect("sched_getcpu");
            pin_this_thread(cpu);
            let (region, _p, mut c) = pair(CAP);
            c.set_crowding(room);
            // The partner of the request ring's consumer is the reply ring's.
            region.memory().write_at(REP_CTRL_OFF + CTRL_CPU, &(cpu + 1).to_le_bytes()).unwrap();
            let (stop, _) = stop_at(1);
            assert_eq!(c.wait(100_000, None, &stop).unwrap(), WaitOutcome::Stopped);
            let stats = region.domain_wait_stats();
            assert_eq!((stats.spin_turns, stats.cut_short), (FIRST_LOOK, 1));
            // And it said where it waits, for its own partner.
            let mut own = [0u8; 4];
            region.memory().read_at(REQ_CTRL_OFF + CTRL_CPU, &mut own).unwrap();
            assert_eq!(u32::from_le_bytes(own), cpu + 1);
        })
        .join()
        .expect("the pinned thread");
    }

    #[test]
    fn a_wait_that_does_not_spin_forgets_where_it_waited() {
        let (region, _p, mut c) = pair(CAP);
        c.set_crowding(crowded);
        let (stop, _) = stop_at(1);
        c.wait(1000, None, &stop).unwrap();
        let said = || {
            let mut own = [0u8; 4];
            region.memory().read_at(REQ_CTRL_OFF + CTRL_CPU, &mut own).unwrap();
            u32::from_le_bytes(own)
        };
        assert_ne!(said(), 0, "a spinning wait said where it waited");
        let (stop, _) = stop_at(1);
        c.wait(0, None, &stop).unwrap();
        assert_eq!(said(), 0, "one handing over does not");
    }

    #[test]
    fn a_reset_clears_the_processor_and_the_statistics() {
        let (region, _p, mut c) = pair(CAP);
        c.set_crowding(crowded);
        let (stop, _) = stop_at(1);
        c.wait(1000, None, &stop).unwrap();
        assert_ne!(region.domain_wait_stats(), WaitStats::default());
        region.reset();
        assert_eq!(region.domain_wait_stats(), WaitStats::default());
        let mut own = [0u8; 4];
        region.memory().read_at(REQ_CTRL_OFF + CTRL_CPU, &mut own).unwrap();
        assert_eq!(own, [0; 4]);
    }

    /// Producer and consumer on two threads; the consumer blocks in `wait` between pops.
    fn transfer(spin: u32, records: u64) {
        let region = Region::create(1 << 16).unwrap();
        let (mut p, _hc) = region.host_endpoints();
        let (mut c, _dp) = region.domain_endpoints();
        // With a slice this long, a lost wake-up shows as a sleep that ran out (and a very slow test).
        c.set_sleep_slice(Duration::from_secs(30));
        let producer = std::thread::spawn(move || {
            let mut rng = Rng(0xfeed_f00d);
            let mut sum = 0u64;
            let mut seq = 0u64;
            while seq < records {
                let batch = 1 + rng.next() % 32;
                for _ in 0..batch {
                    if seq == records {
                        break;
                    }
                    let len = 16 * (1 + (rng.next() as usize % 20));
                    let rec = record(len, seq);
                    loop {
                        match p.push(&rec) {
                            Ok(()) => break,
                            Err(RingError::Full) => {
                                p.publish();
                                std::thread::yield_now();
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    sum = sum.wrapping_add(checksum(&rec));
                    seq += 1;
                }
                p.publish();
            }
            sum
        });
        let mut buf = [0u8; MAX_RECORD];
        let mut sum = 0u64;
        let mut next = 0u64;
        while next < records {
            match c.pop(&mut buf).unwrap() {
                Some(n) => {
                    let rec = &buf[..n];
                    assert_eq!(u64::from_le_bytes(rec[8..16].try_into().unwrap()), next);
                    assert_eq!(rec, &record(n, next)[..]);
                    sum = sum.wrapping_add(checksum(rec));
                    next += 1;
                }
                None => assert_eq!(c.wait(spin, None, &|| false).unwrap(), WaitOutcome::Ready),
            }
        }
        assert_eq!(producer.join().unwrap(), sum);
        assert!(c.is_empty().unwrap());
        assert_eq!(c.full_sleeps(), 0, "a sleep ran its whole slice: a wake-up was lost");
    }

    fn checksum(rec: &[u8]) -> u64 {
        crate::mix::fnv1a(rec)
    }

    #[test]
    fn million_records_sleeping_consumer() {
        transfer(0, 1_000_000);
    }

    #[test]
    fn million_records_spinning_consumer() {
        transfer(2000, 1_000_000);
    }

    #[test]
    fn records_polling_consumer() {
        transfer(u32::MAX, 200_000);
    }
}
