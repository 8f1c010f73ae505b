//! A long, seeded property test of the parsers that read what the other side of a domain wrote: the ring's record
//! framing (`Consumer::pop` over a data area written byte by byte), `Message::parse`, the `CallView` fast path,
//! `RecordHeader::parse` and `BatchView::parse`.
//!
//! The properties, each over many generated inputs:
//! - every valid message, emitted, parses back to itself (and a call's fast view agrees);
//! - a valid record with some bytes changed, cut short or run long never makes a parser panic, and whatever still
//!   parses emits and parses back to the same message;
//! - arbitrary bytes never make a parser panic;
//! - a ring whose data area holds anything at all hands out only well-framed records, or says it is corrupt, and
//!   never panics.
//!
//! The generator is seeded, so a failure is reproducible: its message names the seed and the case. The run is
//! bounded by an iteration count (some seconds in a release build); `WARD_FUZZ_ITERATIONS` sets another count and
//! `WARD_FUZZ_SEED` another seed, for a longer search by hand.

use ward_xpc::batch::{BatchView, BatchWriter};
use ward_xpc::layout::{MIN_RING_CAPACITY, REQ_DATA_OFF};
use ward_xpc::mix::SplitMix64;
use ward_xpc::wire::{CallView, RecordHeader, MAX_ARGS};
use ward_xpc::{ArgKind, ArgList, Message, Op, Region, RetKind, RingError, Status, WireArg, MAX_RECORD};

/// Cases per property unless `WARD_FUZZ_ITERATIONS` says otherwise.
const DEFAULT_ITERATIONS: u64 = 500_000;
const DEFAULT_SEED: u64 = 0x5eed_f00d_3a11_7e57;

fn iterations() -> u64 {
    std::env::var("WARD_FUZZ_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_ITERATIONS)
}

fn seed() -> u64 {
    std::env::var("WARD_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_SEED)
}

/// splitmix64: a small generator whose whole state is one word, so a case is named by the seed and its index.
struct Generator(SplitMix64);

impl Generator {
    /// The generator of case `case` of a run seeded with `seed`.
    fn for_case(seed: u64, case: u64) -> Generator {
        let mut g = Generator(SplitMix64::new(seed ^ case.wrapping_mul(0xa076_1d64_78bd_642f)));
        g.next();
        g
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// A 64-bit word, often a small or an edge value rather than a uniform one (lengths and offsets hide there).
    fn word(&mut self) -> u64 {
        match self.below(4) {
            0 => self.below(1024) as u64,
            1 => [0, 1, u64::MAX, u64::from(u32::MAX), 1 << 63, 4096, 4095][self.below(7)],
            _ => self.next(),
        }
    }

    fn ret(&mut self) -> RetKind {
        [RetKind::Void, RetKind::Int, RetKind::F64, RetKind::F32][self.below(4)]
    }
}

/// Argument kinds a call may carry besides `Inline`.
const PLAIN_KINDS: [ArgKind; 9] = [
    ArgKind::Int,
    ArgKind::F64,
    ArgKind::F32,
    ArgKind::BufIn,
    ArgKind::BufOut,
    ArgKind::BufInOut,
    ArgKind::Str,
    ArgKind::Callback,
    ArgKind::BufScratch,
];

/// Where a call's inline bytes start, with `nargs` arguments (the record header, function and arguments before).
fn inline_base(nargs: usize) -> usize {
    ward_xpc::wire::inline_base(nargs)
}

/// The bytes a generated message borrows.
struct Backing {
    inline: Vec<u8>,
    text: Vec<u8>,
    more_text: Vec<u8>,
}

fn backing(g: &mut Generator) -> Backing {
    // Mostly short, now and then long (two of them, a Load's path and init, still fit in MAX_RECORD).
    let mut some_bytes = || {
        let len = if g.chance(8) { g.below(MAX_RECORD / 3) } else { g.below(64) };
        g.bytes(len)
    };
    Backing { inline: some_bytes(), text: some_bytes(), more_text: some_bytes() }
}

/// A valid message of a random op, borrowing its bytes from `b`.
fn valid_message<'a>(g: &mut Generator, b: &'a Backing) -> Message<'a> {
    let id = g.word();
    match g.below(7) {
        0 => {
            let nargs = g.below(MAX_ARGS + 1);
            let base = inline_base(nargs) as u64;
            let inline = &b.inline[..];
            let end = inline.len() as u64;
            let mut args = ArgList::new();
            for _ in 0..nargs {
                let kind = if g.chance(3) { ArgKind::Inline } else { PLAIN_KINDS[g.below(PLAIN_KINDS.len())] };
                let (a, len) = if kind == ArgKind::Inline {
                    // A range inside the inline bytes (offsets count from the record's start).
                    let start = g.below(inline.len() + 1) as u64;
                    (base + start, g.below((end - start) as usize + 1) as u64)
                } else {
                    (g.word(), g.word())
                };
                args.push(WireArg { kind, pool: g.next() as u32, a, b: len }).expect("at most MAX_ARGS");
            }
            // The inline bytes must end where an Inline argument ends: the last argument (or none, without bytes).
            let inline = if nargs == 0 {
                &inline[..0]
            } else {
                let mut list: Vec<WireArg> = args.as_slice().to_vec();
                if let Some(last) = list.last_mut() {
                    let start = g.below(inline.len() + 1) as u64;
                    *last = WireArg { kind: ArgKind::Inline, pool: last.pool, a: base + start, b: end - start };
                }
                args = ArgList::from_slice(&list).expect("at most MAX_ARGS");
                inline
            };
            Message::Call { id, deferred: g.chance(2), func: g.next() as u32, ret: g.ret(), args, inline }
        }
        1 => Message::Reply { id, status: Status::from(g.next() as u32 % 8), ret_int: g.word(), ret_float: g.word() },
        2 => {
            let mut ints = [0u64; 6];
            let mut floats = [0u64; 8];
            ints.iter_mut().chain(floats.iter_mut()).for_each(|w| *w = g.word());
            Message::Callback { id, slot: g.next() as u32, ret: g.ret(), ints, floats }
        }
        3 => Message::CallbackReply { id, ret_int: g.word(), ret_float: g.word() },
        4 => Message::Resolve { id, ext: g.next() as u32, name: &b.text },
        5 => Message::Ping { id },
        _ => Message::Load { id, poison: g.chance(2), path: &b.text, init: &b.more_text, reason: (g.word(), g.word()) },
    }
}

fn emit(m: &Message<'_>) -> Vec<u8> {
    let mut out = vec![0xa5; m.wire_len()];
    let n = m.emit(&mut out).unwrap_or_else(|e| panic!("a valid message emits ({e}): {m:?}"));
    assert_eq!(n, out.len(), "emit writes wire_len bytes: {m:?}");
    out
}

/// Every parser over `record`; never panics (that is the property), and what parses is consistent: the fast view
/// and the full parser accept the same calls and see the same call, and a parsed message emits and parses back. A
/// parser that panics fails the test naming the case and the record.
fn parse_everything(record: &[u8], case: &str) {
    if std::panic::catch_unwind(|| check_parsers(record, case)).is_err() {
        panic!("{case}: a parser panicked (above) on the record {record:?}");
    }
}

fn check_parsers(record: &[u8], case: &str) {
    let _ = RecordHeader::parse(record);
    let parsed = Message::parse(record);
    match (CallView::parse(record), &parsed) {
        (Ok(view), Ok(m)) => assert_eq!(view.to_message(), *m, "{case}: the fast view disagrees"),
        (Ok(_), Err(e)) => panic!("{case}: the fast view accepts what the parser refuses ({e})"),
        (Err(e), Ok(m @ Message::Call { .. })) => panic!("{case}: the fast view refuses a call ({e}): {m:?}"),
        (Err(_), _) => {}
    }
    if let Ok(m) = parsed {
        let again = emit(&m);
        assert_eq!(Message::parse(&again), Ok(m), "{case}: a parsed message emits and parses back to itself");
        if let Message::Call { args, .. } = m {
            for arg in args.as_slice().iter().filter(|a| a.kind == ArgKind::Inline) {
                assert!(m.inline_arg(arg).is_some(), "{case}: an inline argument of a parsed call is in range");
            }
        }
    }
    if let Ok(batch) = BatchView::parse(record) {
        let entries: Vec<_> = batch.entries().collect();
        assert_eq!(entries.len(), batch.len(), "{case}: a parsed batch hands out every entry it counted");
        for entry in entries {
            assert!(entry.nargs() <= MAX_ARGS, "{case}");
            assert_eq!(entry.args().count(), entry.nargs(), "{case}");
        }
    }
}

/// `record` with a few changes of one of the kinds a broken or hostile peer makes.
fn mutate(g: &mut Generator, mut record: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + g.below(4) {
        match g.below(6) {
            // A byte anywhere, often in the header and the first argument, where the parser looks hardest.
            0 | 1 if !record.is_empty() => {
                let at = if g.chance(2) { g.below(record.len().min(48)) } else { g.below(record.len()) };
                record[at] = if g.chance(2) { g.next() as u8 } else { record[at] ^ (1 << g.below(8)) };
            }
            // A new length field.
            2 if record.len() >= 4 => {
                let len = match g.below(3) {
                    0 => record.len() as u32 + 16 * g.below(4) as u32,
                    1 => (record.len() as u32).saturating_sub(16 * g.below(4) as u32),
                    _ => g.next() as u32,
                };
                record[..4].copy_from_slice(&len.to_le_bytes());
            }
            // A word of the body (an inline offset or length, a name length, a count) set to an edge value.
            3 if record.len() >= 24 => {
                let at = 16 + 8 * g.below((record.len() - 16) / 8);
                record[at..at + 8].copy_from_slice(&g.word().to_le_bytes());
            }
            // Cut short.
            4 => {
                let keep = g.below(record.len() + 1);
                record.truncate(keep);
            }
            // Run long (parsers read only what the length field says).
            _ => {
                let more = g.below(64);
                let more = g.bytes(more);
                record.extend(more);
            }
        }
    }
    record
}

#[test]
fn every_valid_message_emitted_parses_back_to_itself() {
    let seed = seed();
    let mut calls = 0;
    for case in 0..iterations() {
        let g = &mut Generator::for_case(seed, case);
        let b = backing(g);
        let m = valid_message(g, &b);
        let name = format!("seed {seed} case {case}");
        let record = emit(&m);
        assert_eq!(record.len() % 16, 0, "{name}");
        assert_eq!(Message::parse(&record), Ok(m), "{name}: the emitted record parses back");
        if let Message::Call { .. } = m {
            calls += 1;
            let view = CallView::parse(&record).unwrap_or_else(|e| panic!("{name}: the fast view refuses ({e})"));
            assert_eq!(view.to_message(), m, "{name}");
        }
        // A parser is handed a buffer that may run past the record: what follows is not read.
        let mut longer = record.clone();
        let more = 1 + g.below(32);
        longer.extend(g.bytes(more));
        assert_eq!(Message::parse(&longer), Ok(m), "{name}: bytes past the record change nothing");
    }
    assert!(calls > iterations() / 10, "the generator made calls too ({calls})");
}

#[test]
fn a_changed_valid_record_never_panics_a_parser_and_what_still_parses_round_trips() {
    let seed = seed();
    let (mut still_parsed, mut refused) = (0u64, 0u64);
    for case in 0..iterations() {
        let g = &mut Generator::for_case(seed ^ 1, case);
        let b = backing(g);
        let m = valid_message(g, &b);
        let record = mutate(g, emit(&m));
        parse_everything(&record, &format!("seed {seed} case {case} (changed {m:?})"));
        if Message::parse(&record).is_ok() {
            still_parsed += 1;
        } else {
            refused += 1;
        }
    }
    // Both ways out of the parser were taken often: the changes neither all missed nor all broke the records.
    assert!(still_parsed > iterations() / 50 && refused > iterations() / 50, "{still_parsed} parsed, {refused} not");
}

#[test]
fn arbitrary_bytes_never_panic_a_parser() {
    let seed = seed();
    for case in 0..iterations() {
        let g = &mut Generator::for_case(seed ^ 2, case);
        let len = if g.chance(4) { g.below(MAX_RECORD + 64) } else { g.below(160) };
        let mut record = g.bytes(len);
        // Half of them with a length field that matches and a known op, so the parsers get past the framing.
        if record.len() >= 16 && g.chance(2) {
            let len = (record.len() & !15) as u32;
            record[..4].copy_from_slice(&len.to_le_bytes());
            record[4] = 1 + g.below(10) as u8;
        }
        parse_everything(&record, &format!("seed {seed} case {case}"));
    }
}

#[test]
fn a_batch_of_random_calls_reads_back_call_for_call_and_a_changed_one_never_panics() {
    let seed = seed();
    let scalar = [ArgKind::Int, ArgKind::F64, ArgKind::F32, ArgKind::Callback];
    let mut writer = BatchWriter::new();
    for case in 0..iterations() / 4 {
        let g = &mut Generator::for_case(seed ^ 3, case);
        let name = format!("seed {seed} case {case}");
        writer.clear();
        let mut pushed: Vec<(u32, Vec<WireArg>)> = Vec::new();
        for _ in 0..1 + g.below(40) {
            let nargs = g.below(MAX_ARGS + 1);
            if !writer.fits(nargs) {
                break;
            }
            let args: Vec<WireArg> =
                (0..nargs).map(|_| WireArg { kind: scalar[g.below(4)], pool: 0, a: g.word(), b: 0 }).collect();
            let func = g.next() as u32;
            writer.push(func, args.iter().copied()).unwrap_or_else(|e| panic!("{name}: a call that fits ({e})"));
            pushed.push((func, args));
        }
        let id = g.word();
        let record = writer.finish(id).to_vec();
        assert_eq!(record.get(4).copied().map(Op::from), Some(Op::Batch), "{name}");
        let view = BatchView::parse(&record).unwrap_or_else(|e| panic!("{name}: a written batch parses ({e})"));
        assert_eq!(view.id(), id, "{name}");
        let read: Vec<(u32, Vec<WireArg>)> = view.entries().map(|e| (e.func, e.args().collect())).collect();
        assert_eq!(read, pushed, "{name}: the batch reads back call for call");
        parse_everything(&mutate(g, record), &name);
    }
}

/// A request ring's data area as a broken or hostile producer might leave it: from position 0, slots that are
/// valid records (some changed after the fact), padding, lengths of any value, and now and then the zero length
/// that ends what was published.
fn ring_data(g: &mut Generator, capacity: usize) -> Vec<u8> {
    let mut data = vec![0u8; capacity];
    let mut at = 0;
    while at + 16 <= capacity {
        let slot: Vec<u8> = match g.below(10) {
            0 => break,
            1 => {
                let len = 16 * (1 + g.below(8));
                let mut pad = g.bytes(len);
                pad[..4].copy_from_slice(&(len as u32).to_le_bytes());
                pad[4] = Op::Pad.into();
                pad
            }
            2 => {
                // A length word of any value, then whatever.
                let len = 16 * (1 + g.below(4));
                let mut junk = g.bytes(len);
                junk[..4].copy_from_slice(&(g.word() as u32).to_le_bytes());
                junk
            }
            _ => {
                let b = backing(g);
                let m = valid_message(g, &b);
                let record = emit(&m);
                if g.chance(3) {
                    // Changed in place: same slot size, so the framing stays plausible.
                    let mut changed = mutate(g, record.clone());
                    changed.resize(record.len(), 0);
                    changed
                } else {
                    record
                }
            }
        };
        let n = slot.len().min(capacity - at);
        data[at..at + n].copy_from_slice(&slot[..n]);
        at += slot.len().max(16);
    }
    data
}

#[test]
fn a_ring_holding_anything_hands_out_only_framed_records_or_says_it_is_corrupt() {
    let seed = seed();
    let capacity = MIN_RING_CAPACITY;
    let region = Region::create(capacity).expect("a shared-memory region");
    let (mut records, mut corrupt) = (0u64, 0u64);
    for case in 0..iterations() / 50 {
        let g = &mut Generator::for_case(seed ^ 4, case);
        let name = format!("seed {seed} case {case}");
        region.reset();
        region.memory().write_at(REQ_DATA_OFF, &ring_data(g, capacity)).expect("the request ring's data area");
        let (mut consumer, _producer) = region.domain_endpoints();
        // Now and then a buffer shorter than a record may be: such a record is refused, not cut.
        let mut buf = vec![0u8; if g.chance(8) { 16 * (1 + g.below(MAX_RECORD / 16)) } else { MAX_RECORD }];
        // More pops than the ring has slots: a ring that goes round (its records left in place) is still bounded.
        for _ in 0..2 * capacity / 16 {
            match consumer.pop(&mut buf) {
                Ok(None) => break,
                Ok(Some(n)) => {
                    records += 1;
                    assert!(n >= 16 && n % 16 == 0 && n <= MAX_RECORD.min(buf.len()), "{name}: a record of {n}");
                    assert_eq!(buf[..4], (n as u32).to_le_bytes(), "{name}: the length handed out is the one checked");
                    assert_ne!(buf[4], u8::from(Op::Pad), "{name}: padding is skipped, not handed out");
                    parse_everything(&buf[..n], &name);
                }
                Err(RingError::Corrupt(_) | RingError::BadRecord(_)) => {
                    corrupt += 1;
                    break;
                }
                Err(e) => panic!("{name}: pop failed with {e}"),
            }
        }
    }
    assert!(records > iterations() / 50 && corrupt > iterations() / 500, "{records} records, {corrupt} corrupt rings");
}
