//! An extension that reads a little past an input reads zeros instead of faulting, never the host's bytes; reading
//! further, or writing past an output, still faults (issue 33). The `overread` built-in reads `past` bytes after its
//! input and returns their sum plus one each (so all zeros give `past`), or writes one byte past its output.
//!
//! Process domains: inputs copied into the input pool (every size class) and inputs lent in place from the host's
//! arena. mpk domains pass inputs in place (the domain reads host memory, as natively): what they copy is the class
//! adapters' buffers, tested with the classes (`ward-classes` tests, UV Map).

mod common;

use common::*;
use ward::{Arg, Event, FaultKind, Isolation, Policy, RetType, Supervisor, Value};
use ward_xpc::arena::host;
use ward_xpc::layout::{PAGE, READ_PAST_INPUT};

fn overread() -> (Supervisor, ward::Extension, std::sync::mpsc::Receiver<Event>) {
    overread_with("")
}

/// The extension with `keys` in its policy section, a failed call not retried.
fn overread_with(keys: &str) -> (Supervisor, ward::Extension, std::sync::mpsc::Receiver<Event>) {
    let text = format!("[extension.overread]\non_fault = \"fail\"\n{keys}\n");
    let policy = Policy::from_toml_str(&text, "test").unwrap();
    let sup = Supervisor::new(policy);
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("overread"), Some(Isolation::Process)).unwrap();
    (sup, ext, events)
}

fn sum_past(ext: &ward::Extension, input: &[u8], past: usize) -> Result<Value, ward::Error> {
    let mut args = [Arg::In(input), Arg::U64(input.len() as u64), Arg::U64(past as u64)];
    ext.call("overread_sum", &mut args, RetType::I64)
}

fn segv(events: &std::sync::mpsc::Receiver<Event>) -> bool {
    events.try_iter().any(
        |e| matches!(e, Event::Fault { fault } if matches!(fault.kind, FaultKind::Signal { signo: libc::SIGSEGV, .. })),
    )
}

/// Every size class of the input pool, lengths that end on a page and lengths that do not: the allowance reads as
/// zeros (whatever the slot held before), a page more faults.
#[test]
fn reading_past_an_input_in_the_pool_reads_zeros_up_to_the_allowance_and_faults_further() {
    let (_s, ext, events) = overread();
    for len in [100, 4096, 5000, 65536, 70000, 1 << 20, (1 << 20) + 8, 3 << 20] {
        // Non-zero bytes everywhere, so a byte of this input (or of an earlier one in the slot) would show.
        let input = vec![0xffu8; len];
        assert_eq!(sum_past(&ext, &input, 1).unwrap(), Value::I64(1), "{len}: one byte past");
        let shorter = vec![0xeeu8; len - 3];
        // The three bytes this input no longer covers held the longer one's 0xff before.
        assert_eq!(sum_past(&ext, &shorter, READ_PAST_INPUT).unwrap(), Value::I64(READ_PAST_INPUT as i64), "{len}");
        assert!(!segv(&events), "{len}: reading within the allowance faulted");
    }
    assert_eq!(ext.stats().faults, 0);
    // Past the allowance and the slot's rounding: the guard page.
    let input = vec![0x11u8; 4096];
    let r = sum_past(&ext, &input, READ_PAST_INPUT + PAGE);
    assert!(r.is_err(), "reading past the allowance succeeded: {r:?}");
    assert!(segv(&events), "reading past the allowance is a SIGSEGV fault");
    // And the domain, recovered, reads zeros again.
    assert_eq!(sum_past(&ext, &input, 64).unwrap(), Value::I64(64));
}

/// The output pool keeps its guard right after every slot: one byte past an output faults.
#[test]
fn writing_past_an_output_in_the_pool_faults() {
    let (_s, ext, events) = overread();
    for len in [4096usize, 65536, 1 << 20] {
        let mut out = vec![0u8; len];
        let mut args = [Arg::Out(&mut out), Arg::U64(len as u64), Arg::U64(0)];
        assert_eq!(ext.call("overread_write_past", &mut args, RetType::I64).unwrap(), Value::I64(len as i64));
        assert!(out.iter().all(|&b| b == 0x5a));
        let mut args = [Arg::Out(&mut out), Arg::U64(len as u64), Arg::U64(1)];
        let r = ext.call("overread_write_past", &mut args, RetType::I64);
        assert!(r.is_err(), "{len}: writing one byte past an output succeeded: {r:?}");
        assert!(segv(&events), "{len}: writing past an output is a SIGSEGV fault");
    }
}

/// A block of the host's arena, freed on drop.
struct Block {
    ptr: *mut u8,
    len: usize,
}

impl Block {
    fn new(len: usize, byte: u8) -> Block {
        host::enable(1 << 30).expect("the arena");
        let ptr = host::alloc(len, 64).expect("an arena block");
        // SAFETY: the block is `len` writable bytes this test owns.
        unsafe { std::ptr::write_bytes(ptr, byte, len) };
        Block { ptr, len }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the block is `len` bytes this test owns until drop; `&mut self` makes the slice the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        host::free(self.ptr);
    }
}

/// An input of a megabyte and more lent in place from the host's arena: what follows it in its block (the host's
/// bytes, never lent) reads as zeros up to the allowance, whether the input ends on a page or not; further on faults.
#[test]
fn reading_past_an_input_lent_in_place_from_the_arena_reads_zeros_not_the_rest_of_its_block() {
    // Before the domain starts: a domain gets arena blocks when the host has an arena.
    host::enable(1 << 30).expect("the arena");
    let (_s, ext, events) = overread();
    const LEN: usize = 2 << 20;
    let mut block = Block::new(LEN + (1 << 20), 0xff);
    for len in [LEN, LEN - 100, LEN + 8] {
        let before = ext.stats().lent_in_place;
        let input = &block.bytes()[..len];
        assert_eq!(sum_past(&ext, input, READ_PAST_INPUT).unwrap(), Value::I64(READ_PAST_INPUT as i64), "{len}");
        assert_eq!(ext.stats().lent_in_place - before, 1, "{len}: the input crossed in place");
        // Lent again the same way (the domain keeps its windows): still zeros.
        let input = &block.bytes()[..len];
        assert_eq!(sum_past(&ext, input, 1).unwrap(), Value::I64(1), "{len}");
        assert!(!segv(&events), "{len}: reading within the allowance faulted");
    }
    // Past the allowance: a fault, and the host's block is as it was.
    let input = &block.bytes()[..LEN];
    let r = sum_past(&ext, input, READ_PAST_INPUT + PAGE);
    assert!(r.is_err(), "reading past the allowance succeeded: {r:?}");
    assert!(segv(&events), "reading past the allowance is a SIGSEGV fault");
    assert!(block.bytes().iter().all(|&b| b == 0xff), "the host's block changed");
}

/// `read_past_input_kb` sets the allowance: 0 faults at the first byte past an input that ends its slot, 64 reads
/// 64 KiB of zeros (and a page more faults), in the pool and in the arena alike.
#[test]
fn the_policy_sets_how_far_past_an_input_reads_zeros() {
    host::enable(1 << 30).expect("the arena");
    let mut block = Block::new(3 << 20, 0xff);
    let (_s, ext, events) = overread_with("read_past_input_kb = 0");
    let pooled = vec![0x11u8; 4096];
    assert!(sum_past(&ext, &pooled, 1).is_err(), "no allowance: one byte past the slot faults");
    assert!(segv(&events));
    let input = &block.bytes()[..2 << 20];
    assert!(sum_past(&ext, input, 1).is_err(), "no allowance: one byte past the arena input faults");
    assert!(segv(&events));

    let (_s, ext, events) = overread_with("read_past_input_kb = 64");
    assert_eq!(sum_past(&ext, &pooled, 64 << 10).unwrap(), Value::I64(64 << 10));
    let input = &block.bytes()[..2 << 20];
    assert_eq!(sum_past(&ext, input, 64 << 10).unwrap(), Value::I64(64 << 10));
    assert!(!segv(&events), "reading within the allowance faulted");
    assert!(sum_past(&ext, &pooled, (64 << 10) + PAGE).is_err(), "past the allowance");
    assert!(segv(&events));
}
