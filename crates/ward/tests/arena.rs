//! Buffers in the host's arena cross to a process domain in place: no copy, the extension works on the host's
//! pages, and the pool guarantees still hold (inputs read-only, scratch inputs private, nothing past a buffer
//! reachable, a failed call's inputs intact).
//!
//! The arena is process-wide; each test makes its own blocks in it, and enables it before loading the extension
//! (a domain gets the arena when it starts).

mod common;

use common::*;
use ward::{Arg, Event, FaultKind, Isolation, Policy, RetType, Supervisor, Value};
use ward_xpc::arena::host;

/// A block of the arena, freed on drop.
struct Block {
    ptr: *mut u8,
    len: usize,
}

impl Block {
    fn new(len: usize, fill: impl Fn(usize) -> u8) -> Block {
        host::enable(1 << 30).expect("the arena");
        let ptr = host::alloc(len, 64).expect("an arena block");
        let mut b = Block { ptr, len };
        for (i, byte) in b.bytes().iter_mut().enumerate() {
            *byte = fill(i);
        }
        b
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the block is `len` bytes this test allocated and owns until drop; `&mut self` makes the slice the
        // only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        host::free(self.ptr);
    }
}

const LEN: usize = 3 << 20;

fn pattern(i: usize) -> u8 {
    (i * 7 + i / 4096) as u8
}

fn well(policy: &str) -> (Supervisor, ward::Extension, std::sync::mpsc::Receiver<Event>) {
    host::enable(1 << 30).expect("the arena");
    let sup = Supervisor::new(Policy::from_toml_str(policy, "test").unwrap());
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    (sup, ext, events)
}

#[test]
fn inputs_outputs_and_in_out_buffers_are_lent_in_place() {
    let (_s, ext, _e) = well("");
    let mut input = Block::new(LEN, pattern);
    let expected: i64 = input.bytes().iter().map(|&b| i64::from(b)).sum();
    let before = ext.stats().lent_in_place;
    let sum = ext.call("well_sum", &mut [Arg::In(input.bytes()), Arg::U64(LEN as u64)], RetType::I64).unwrap();
    assert_eq!(sum, Value::I64(expected));

    let mut output = Block::new(LEN, |_| 0);
    let (i, o) = (input.bytes(), output.bytes());
    ext.call("well_xor", &mut [Arg::In(i), Arg::InOut(o), Arg::U64(LEN as u64), Arg::I64(0x5a)], RetType::Void)
        .unwrap();
    assert!(output.bytes().iter().enumerate().all(|(i, &b)| b == pattern(i) ^ 0x5a));

    ext.call("well_reverse", &mut [Arg::InOut(output.bytes()), Arg::U64(LEN as u64)], RetType::Void).unwrap();
    assert!(output.bytes().iter().enumerate().all(|(i, &b)| b == pattern(LEN - 1 - i) ^ 0x5a));
    assert_eq!(ext.stats().lent_in_place - before, 4, "every buffer crossed in place");

    // Small buffers and buffers outside the arena are copied as before.
    let small: Vec<u8> = (0..4096).map(pattern).collect();
    let heap: Vec<u8> = (0..LEN).map(pattern).collect();
    for data in [&small[..], &heap[..]] {
        let want: i64 = data.iter().map(|&b| i64::from(b)).sum();
        let got = ext.call("well_sum", &mut [Arg::In(data), Arg::U64(data.len() as u64)], RetType::I64).unwrap();
        assert_eq!(got, Value::I64(want));
    }
    assert_eq!(ext.stats().lent_in_place - before, 4);
}

#[test]
fn a_scratch_input_is_written_privately_and_the_host_keeps_its_bytes() {
    let (_s, ext, _e) = well("");
    let mut input = Block::new(LEN, pattern);
    for _ in 0..3 {
        // well_reverse writes its buffer: as scratch the extension gets a private copy of the pages it writes.
        ext.call("well_reverse", &mut [Arg::Scratch(input.bytes()), Arg::U64(LEN as u64)], RetType::Void).unwrap();
        assert!(input.bytes().iter().enumerate().all(|(i, &b)| b == pattern(i)), "the host's bytes changed");
    }
    let sum = ext.call("well_sum", &mut [Arg::In(input.bytes()), Arg::U64(LEN as u64)], RetType::I64).unwrap();
    assert_eq!(sum, Value::I64(input.bytes().iter().map(|&b| i64::from(b)).sum()));
    assert_eq!(ext.stats().faults, 0, "writing scratch is not a fault");
}

#[test]
fn writing_an_input_lent_in_place_is_a_fault_and_leaves_it_intact() {
    let (_s, ext, events) = well("[extension.well]\non_fault = \"fail\"\n");
    let mut input = Block::new(LEN, pattern);
    let r = ext.call("well_reverse", &mut [Arg::In(input.bytes()), Arg::U64(LEN as u64)], RetType::Void);
    assert!(r.is_err(), "a write into a read-only input fails the call");
    let kind = fault_kinds(&events).into_iter().next().expect("a fault event");
    assert!(matches!(kind, FaultKind::Signal { signo: libc::SIGSEGV, .. }), "{kind:?}");
    assert!(input.bytes().iter().enumerate().all(|(i, &b)| b == pattern(i)), "the host's bytes changed");
}

#[test]
fn a_restarted_domain_is_lent_its_blocks_again_whether_forked_by_a_zygote_or_spawned() {
    for zygote in [true, false] {
        let (_s, ext, events) = well(&format!("[extension.well]\non_fault = \"fail\"\nzygote = {zygote}\n"));
        let mut input = Block::new(LEN, pattern);
        let expected = Value::I64(input.bytes().iter().map(|&b| i64::from(b)).sum());
        let before = ext.stats().lent_in_place;
        let sum = |input: &mut Block| {
            ext.call("well_sum", &mut [Arg::In(input.bytes()), Arg::U64(LEN as u64)], RetType::I64).unwrap()
        };
        assert_eq!(sum(&mut input), expected, "zygote {zygote}");
        // A write into the read-only input kills the incarnation; the next one holds no block until lent it.
        let r = ext.call("well_reverse", &mut [Arg::In(input.bytes()), Arg::U64(LEN as u64)], RetType::Void);
        assert!(r.is_err(), "zygote {zygote}: a write into a read-only input fails the call");
        assert!(!fault_kinds(&events).is_empty(), "zygote {zygote}: no fault reported");
        assert_eq!(sum(&mut input), expected, "zygote {zygote}: after the restart");
        assert_eq!(ext.stats().lent_in_place - before, 3, "zygote {zygote}: every call lent the block in place");
    }
}

/// How many arena blocks process `pid` holds a descriptor of.
fn arena_descriptors(pid: i32) -> usize {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the domain's descriptors");
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|to| to.to_string_lossy().starts_with("/memfd:ward-arena"))
        })
        .count()
}

#[test]
fn a_domain_holds_at_most_its_share_of_blocks_and_drops_those_the_host_freed() {
    // 16 descriptors: the domain may hold 4 blocks.
    let (_s, ext, _e) = well("[extension.well.limits]\nopen_files = 16\n");
    let mut blocks: Vec<Block> = (0..8).map(|i| Block::new(LEN, move |j| pattern(j + i * 13))).collect();
    let sum = |block: &mut Block| {
        let want: i64 = block.bytes().iter().map(|&b| i64::from(b)).sum();
        let got = ext.call("well_sum", &mut [Arg::In(block.bytes()), Arg::U64(LEN as u64)], RetType::I64).unwrap();
        assert_eq!(got, Value::I64(want));
    };
    let before = ext.stats().lent_in_place;
    for _ in 0..2 {
        for block in &mut blocks {
            sum(block);
        }
    }
    assert_eq!(ext.stats().lent_in_place - before, 16, "every call lent its block in place");
    let pid = ext.pid().expect("a process domain");
    let held = arena_descriptors(pid);
    assert!((1..=4).contains(&held), "the domain holds {held} blocks");
    // Lent writable as well (in-out buffers: outputs are copied): freed, they are retired, never handed out again, and the next block lent
    // tells the domain to drop them. (Blocks lent read-only only are kept for reuse, and a domain may keep them.)
    let source = vec![0x42u8; LEN];
    let before = ext.stats().lent_in_place;
    for block in &mut blocks {
        let args = &mut [Arg::In(&source), Arg::InOut(block.bytes()), Arg::U64(LEN as u64)];
        ext.call("well_copy", args, RetType::Void).unwrap();
        assert!(block.bytes().iter().all(|&b| b == 0x42), "the output was written");
    }
    assert_eq!(ext.stats().lent_in_place - before, 8, "every output was lent in place");
    drop(blocks);
    let mut fresh = Block::new(LEN, pattern);
    sum(&mut fresh);
    assert_eq!(arena_descriptors(pid), 1, "the blocks the host freed were dropped");
}

#[test]
fn writing_past_an_output_lent_in_place_faults_or_stays_private() {
    let (_s, ext, events) = well("[extension.well]\non_fault = \"fail\"\n");
    // Two neighbouring blocks; the first is the output, the second must never change.
    let mut input = Block::new(LEN + (1 << 20), pattern);
    // The output is the block's first LEN bytes; the rest of the block (padding, as a video host's frames have)
    // shares the output's last page.
    let mut output = Block::new(LEN + 100, |_| 0);
    let mut neighbour = Block::new(LEN, |_| 0x33);
    // Copy 64 bytes more than the output holds: they land in a private copy of its last page, not in the host.
    let len = LEN as u64;
    let o = &mut output.bytes()[..LEN];
    ext.call("well_copy", &mut [Arg::In(input.bytes()), Arg::InOut(o), Arg::U64(len + 64)], RetType::Void).unwrap();
    assert!(output.bytes()[..LEN].iter().enumerate().all(|(i, &b)| b == pattern(i)));
    assert!(output.bytes()[LEN..].iter().all(|&b| b == 0), "bytes past the output changed");
    // A whole megabyte more runs into the guard page after the lent pages.
    let o = &mut output.bytes()[..LEN];
    let r =
        ext.call("well_copy", &mut [Arg::In(input.bytes()), Arg::InOut(o), Arg::U64(len + (1 << 20))], RetType::Void);
    assert!(r.is_err(), "an overrun past the page is a fault");
    assert!(fault_kinds(&events).iter().any(|k| matches!(k, FaultKind::Signal { signo: libc::SIGSEGV, .. })));
    assert!(neighbour.bytes().iter().all(|&b| b == 0x33), "the neighbouring block changed");
}

#[test]
fn a_range_opened_ahead_for_an_alternating_host_is_closed_to_a_call_that_does_not_lend_it() {
    host::enable(1 << 30).expect("the arena");
    let sup = Supervisor::new(Policy::from_toml_str("[extension.faulty]\non_fault = \"fail\"\n", "test").unwrap());
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("faulty"), Some(Isolation::Process)).unwrap();
    let mut frames = [Block::new(LEN, |_| 0x44), Block::new(LEN, |_| 0x55)];
    // Lent writable as A, B, A: between calls the domain opens B ahead of the next call, as a host alternating
    // between two frames would lend it next.
    let mut address = [0u64; 2];
    for which in [0, 1, 0] {
        let lent = Arg::InOut(frames[which].bytes());
        match ext.call("faulty_address_of", &mut [lent], RetType::I64).unwrap() {
            Value::I64(a) => address[which] = a as u64,
            other => panic!("faulty_address_of returned {other:?}"),
        }
    }
    assert_ne!(address[0], address[1]);
    // A call that lends nothing writes where B was lent (a pointer kept past its call): it must fault, whether or
    // not the domain had opened B ahead when the call arrived.
    let r = ext.call("faulty_wild_write", &mut [Arg::U64(address[1])], RetType::Void);
    assert!(r.is_err(), "a write into a range the call was not lent must fail the call");
    assert!(fault_kinds(&events).iter().any(|k| matches!(k, FaultKind::Signal { signo: libc::SIGSEGV, .. })));
    assert!(frames[1].bytes().iter().all(|&b| b == 0x55), "the host's frame changed");
    assert!(frames[0].bytes().iter().all(|&b| b == 0x44), "the host's frame changed");
}

fn fault_kinds(events: &std::sync::mpsc::Receiver<Event>) -> Vec<FaultKind> {
    events
        .try_iter()
        .filter_map(|e| match e {
            Event::Fault { fault } => Some(fault.kind),
            _ => None,
        })
        .collect()
}
