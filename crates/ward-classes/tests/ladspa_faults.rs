//! The LADSPA class's recovery, driven by the built-in faulty plugin library (`faulty_ladspa`): every crash kind, a
//! hang, an overrun and NaN output in the middle of a stream of blocks, a plugin that fails on every block until it
//! is disabled, run_adding, two instances sharing a domain, and what the host's buffers see through all of it.
//!
//! faulty_amp's block counter ("Blocks") is reset by `activate`, so it tells the incarnations apart: a retried block
//! runs on a restarted instance (instantiate and activate replayed) and reports 1. The same reset means a fault
//! armed "at block 1" fires again on the retry: tests of a transparent recovery arm a later block.

use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::time::Duration;

mod common;

use common::require_pku;

use ward::{Event, FaultKind, Isolation, Policy, SignalCause, Supervisor};
use ward_classes::ladspa::{Instance, Library, PortBuffer};
use ward_classes::{ClassError, Processed};

/// Samples per block (a multiple of 4: the adapter's audio buffers then end exactly at their guard page).
const N: usize = 64;
/// faulty_amp's gain in most tests.
const GAIN: f32 = 0.5;
/// What the host's output buffers hold before a block: a value no plugin or fallback of these tests produces.
const SENTINEL: f32 = -777.0;
/// Extra host output samples past the block: never written.
const TAIL: usize = 16;
/// The call a block's faults name: the plugin's `run`, which the host made, not the adapter function
/// (`ward_ladspa_run`) that makes it.
const RUN: &str = "run";

const NULL_DEREF: f32 = 1.0;
const ABORT: f32 = 3.0;
const EXIT3: f32 = 4.0;
const INFINITE_LOOP: f32 = 5.0;
const RECURSION: f32 = 6.0;
const DIV_ZERO: f32 = 12.0;
const ILLEGAL: f32 = 13.0;
const OVERRUN: f32 = 20.0;
const NAN: f32 = 21.0;

/// How a block's fault ports are set.
#[derive(Debug, Clone, Copy)]
struct Arm {
    kind: f32,
    /// 0 = every block.
    at: f32,
    repeat: bool,
}

const CLEAN: Arm = Arm { kind: 0.0, at: 1.0, repeat: false };

fn arm(kind: f32, at: u32) -> Arm {
    Arm { kind, at: at as f32, repeat: false }
}

fn plugin_path() -> PathBuf {
    ward_extensions::path_of("faulty_ladspa").expect("the built-in faulty_ladspa extracts")
}

/// A supervisor whose policy for the library is `keys` (lines of `[extension.faulty_ladspa]`), subscribed to its
/// events, and the library opened with `isolation`.
/// faulty_ladspa under a policy of `keys`, restarted with its configuration only (`history_mb = 0`) unless `keys`
/// sets `history_mb`: its faults strike at a block count, and these tests recover a fault that the retry does not
/// bring back, which needs the restarted plugin to count again from 1. How the default (history) handles such a
/// fault: `a_fault_that_the_replayed_history_brings_back_is_retried_on_the_configuration_only` (tests/frei0r.rs).
fn open(keys: &str, isolation: Isolation) -> (Supervisor, Library, Receiver<Event>) {
    if keys.contains("history_mb") {
        open_as_written(keys, isolation)
    } else {
        open_as_written(&format!("history_mb = 0\n{keys}"), isolation)
    }
}

/// faulty_ladspa under a policy of `keys` and nothing else.
fn open_as_written(keys: &str, isolation: Isolation) -> (Supervisor, Library, Receiver<Event>) {
    let text = format!("[extension.faulty_ladspa]\n{keys}\n");
    let sup = Supervisor::new(Policy::from_toml_str(&text, "ladspa_faults policy").unwrap());
    let events = sup.subscribe();
    let lib = Library::open(&sup, &plugin_path(), Some(isolation)).unwrap();
    assert_eq!(lib.extension().name(), "faulty_ladspa", "the policy section applies to the library");
    (sup, lib, events)
}

/// An activated faulty_amp of `lib`.
fn amp(lib: &Library) -> Instance {
    let index = lib.plugin("faulty_amp").unwrap().index;
    let mut inst = lib.instantiate(index, 48000).unwrap();
    assert_eq!(inst.activate().unwrap(), Processed::Ran);
    inst
}

/// A block of input: exact binary fractions, so gains of powers of two give exact products and sums.
fn signal(seed: usize) -> Vec<f32> {
    (0..N).map(|i| (((i * 7 + seed * 13) % 33) as f32 - 16.0) / 8.0).collect()
}

fn scaled(input: &[f32], gain: f32) -> Vec<f32> {
    input.iter().map(|x| x * gain).collect()
}

/// A host output buffer: the block plus a tail, all SENTINEL.
fn output() -> Vec<f32> {
    vec![SENTINEL; N + TAIL]
}

/// What one block of faulty_amp came to.
#[derive(Debug)]
struct Block {
    processed: Processed,
    /// The host's output buffer after the block (block and tail).
    out: Vec<f32>,
    /// The "Blocks" control output (SENTINEL when nothing wrote it).
    blocks: f32,
}

impl Block {
    fn state(&self) -> (Processed, f32) {
        (self.processed.clone(), self.blocks)
    }

    fn audio(&self) -> &[f32] {
        &self.out[..N]
    }

    fn assert_tail_untouched(&self) {
        assert!(self.out[N..].iter().all(|&v| v == SENTINEL), "samples past the block were written: {:?}", self.out);
    }
}

/// Runs one block of faulty_amp with `gain` and `arm` on `input`, into `out` (run_adding when `adding`). The host
/// never gets an error for a block: a fault is recovered or bypassed.
fn amp_block(inst: &mut Instance, gain: f32, arm: Arm, input: &[f32], mut out: Vec<f32>, adding: bool) -> Block {
    let copy = input.to_vec();
    let (gain, kind, at, repeat) = ([gain], [arm.kind], [arm.at], [if arm.repeat { 1.0 } else { 0.0 }]);
    let mut blocks = [SENTINEL];
    let mut ports = [
        PortBuffer::Input(input),
        PortBuffer::Output(&mut out),
        PortBuffer::Input(&gain),
        PortBuffer::Input(&kind),
        PortBuffer::Input(&at),
        PortBuffer::Input(&repeat),
        PortBuffer::Output(&mut blocks),
    ];
    let processed = if adding { inst.run_adding(N, &mut ports) } else { inst.run(N, &mut ports) }
        .unwrap_or_else(|e| panic!("a block of faulty_amp ({arm:?}) failed the host: {e}"));
    assert_eq!(input, &copy[..], "the host's input buffer was modified");
    let block = Block { processed, out, blocks: blocks[0] };
    block.assert_tail_untouched();
    block
}

fn run(inst: &mut Instance, arm: Arm, input: &[f32]) -> Block {
    amp_block(inst, GAIN, arm, input, output(), false)
}

fn faults(events: &[Event]) -> Vec<ward::Fault> {
    events.iter().filter_map(|e| if let Event::Fault { fault } = e { Some(fault.clone()) } else { None }).collect()
}

fn replayed(events: &[Event]) -> Vec<usize> {
    events
        .iter()
        .filter_map(|e| if let Event::Recovered { replayed, .. } = e { Some(*replayed) } else { None })
        .collect()
}

fn retried(events: &[Event]) -> Vec<bool> {
    events.iter().filter_map(|e| if let Event::Retried { ok, .. } = e { Some(*ok) } else { None }).collect()
}

fn disabled(events: &[Event]) -> bool {
    events.iter().any(|e| matches!(e, Event::Disabled { .. }))
}

fn is_bypassed(p: &Processed) -> bool {
    matches!(p, Processed::Bypassed { .. })
}

fn assert_no_nan(block: &Block) {
    assert!(block.out.iter().all(|v| v.is_finite()), "a non-finite sample reached the host: {:?}", block.out);
}

// ---- no fault ----------------------------------------------------------------------------------------------------

#[test]
fn without_faults_both_isolations_process_identically_and_count_blocks() {
    for iso in [Isolation::None, Isolation::Process] {
        let (_sup, lib, events) = open("", iso);
        let mut inst = amp(&lib);
        for n in 1..=4 {
            let input = signal(n);
            let b = run(&mut inst, CLEAN, &input);
            assert_eq!(b.processed, Processed::Ran, "{iso:?} block {n}");
            assert_eq!(b.audio(), scaled(&input, GAIN), "{iso:?} block {n}");
            assert_eq!(b.blocks, n as f32, "{iso:?}: the block counter");
        }
        let stats = lib.extension().stats();
        assert_eq!((stats.faults, stats.restarts, stats.incarnation), (0, 0, 1), "{iso:?}");
        assert!(events.try_iter().next().is_none(), "{iso:?}: no recovery events without faults");
    }
}

// ---- crashes and a hang at block 3 -------------------------------------------------------------------------------

/// Blocks 1 and 2 run; block 3 crashes with `kind` and is recovered transparently: restart, replay of the
/// library's opening, the instantiation and the activation, retry on intact input. Returns the one fault.
fn transparent_at_block_3(kind: f32, keys: &str) -> ward::Fault {
    transparent_at_block_3_in(kind, keys, Isolation::Process)
}

fn transparent_at_block_3_in(kind: f32, keys: &str, isolation: Isolation) -> ward::Fault {
    let (_sup, lib, events) = open(keys, isolation);
    assert_eq!(lib.extension().isolation(), isolation);
    let mut inst = amp(&lib);
    let armed = arm(kind, 3);
    for n in 1..=2 {
        let input = signal(n);
        let b = run(&mut inst, armed, &input);
        assert_eq!(b.processed, Processed::Ran, "kind {kind}, block {n}");
        assert_eq!(b.audio(), scaled(&input, GAIN));
        assert_eq!(b.blocks, n as f32);
    }
    assert_eq!(lib.extension().stats().restarts, 0);

    let input = signal(3);
    let b = run(&mut inst, armed, &input);
    assert_eq!(b.processed, Processed::Ran, "kind {kind}: block 3 is recovered transparently");
    assert_eq!(b.audio(), scaled(&input, GAIN), "kind {kind}: the retried block is correct");
    // The retry ran on a new instance, instantiated and activated by the replay: its counter started again.
    assert_eq!(b.blocks, 1.0, "kind {kind}: the block was retried on the new incarnation");
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts, stats.incarnation), (1, 1, 2), "kind {kind}: {stats:?}");
    assert!(!stats.disabled);
    let seen: Vec<Event> = events.try_iter().collect();
    assert_eq!(replayed(&seen), [3], "kind {kind}: open, instantiate and activate replayed: {seen:?}");
    assert_eq!(retried(&seen), [true], "kind {kind}: {seen:?}");
    let mut fault = faults(&seen);
    assert_eq!(fault.len(), 1, "kind {kind}: {fault:?}");
    let fault = fault.remove(0);
    assert_eq!(fault.call.as_deref(), Some(RUN));
    assert_eq!(fault.incarnation, 1);

    // The new incarnation counts on from 1: its block 2 is clean, its block 3 is armed again and recovered again.
    let input = signal(4);
    let b = run(&mut inst, armed, &input);
    assert_eq!(b.state(), (Processed::Ran, 2.0), "kind {kind}");
    assert_eq!(b.audio(), scaled(&input, GAIN));
    assert_eq!(lib.extension().stats().faults, 1, "kind {kind}: the new incarnation's block 2 is clean");
    let input = signal(5);
    let b = run(&mut inst, armed, &input);
    assert_eq!(b.state(), (Processed::Ran, 1.0), "kind {kind}");
    assert_eq!(b.audio(), scaled(&input, GAIN));
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts, stats.incarnation), (2, 2, 3), "kind {kind}: {stats:?}");
    fault
}

fn signal_cause(fault: &ward::Fault) -> (String, SignalCause) {
    match fault.kind {
        FaultKind::Signal { signo, cause, .. } => (ward::fault::signal_name(signo), cause),
        ref other => panic!("expected a signal fault, got {other:?}"),
    }
}

#[test]
fn a_null_dereference_at_block_3_is_recovered_transparently() {
    let f = transparent_at_block_3(NULL_DEREF, "");
    assert_eq!(signal_cause(&f), ("SIGSEGV".into(), SignalCause::NullDereference));
}

#[test]
fn an_abort_at_block_3_is_recovered_transparently() {
    let f = transparent_at_block_3(ABORT, "");
    assert_eq!(signal_cause(&f), ("SIGABRT".into(), SignalCause::Abort));
}

#[test]
fn an_exit_at_block_3_is_recovered_transparently() {
    let f = transparent_at_block_3(EXIT3, "");
    assert_eq!(f.kind, FaultKind::Exited { status: 3 });
}

#[test]
fn a_stack_overflow_at_block_3_is_recovered_transparently() {
    let f = transparent_at_block_3(RECURSION, "");
    assert_eq!(signal_cause(&f), ("SIGSEGV".into(), SignalCause::StackOverflow));
}

#[test]
fn a_division_by_zero_at_block_3_is_recovered_transparently() {
    let f = transparent_at_block_3(DIV_ZERO, "");
    assert_eq!(signal_cause(&f), ("SIGFPE".into(), SignalCause::Arithmetic));
}

#[test]
fn an_illegal_instruction_at_block_3_is_recovered_transparently() {
    let f = transparent_at_block_3(ILLEGAL, "");
    assert_eq!(signal_cause(&f), ("SIGILL".into(), SignalCause::IllegalInstruction));
}

#[test]
fn a_hang_at_block_3_is_stopped_at_the_deadline_and_recovered_transparently() {
    let f = transparent_at_block_3(INFINITE_LOOP, "deadline_ms = 1000");
    assert_eq!(f.kind, FaultKind::Timeout { deadline: Duration::from_millis(1000) });
}

// ---- overrun ----------------------------------------------------------------------------------------------------

#[test]
fn an_output_overrun_is_caught_as_a_segfault_never_silent_corruption() {
    overrun_caught(Isolation::Process);
}

fn overrun_caught(isolation: Isolation) {
    let (_sup, lib, events) = open("", isolation);
    let mut inst = amp(&lib);
    let armed = arm(OVERRUN, 3);
    for n in 1..=3 {
        let input = signal(n);
        let b = run(&mut inst, armed, &input);
        assert_eq!(b.processed, Processed::Ran, "block {n}");
        // No trace of the overrun's 1e30 anywhere in the host's buffer (the tail is checked by amp_block).
        assert_eq!(b.audio(), scaled(&input, GAIN), "block {n}");
    }
    let seen: Vec<Event> = events.try_iter().collect();
    let f = faults(&seen);
    assert_eq!(f.len(), 1, "the overrun is a fault: {seen:?}");
    assert_eq!(signal_cause(&f[0]).0, "SIGSEGV", "{:?}", f[0]);
    assert_eq!(f[0].call.as_deref(), Some(RUN));
    assert_eq!(retried(&seen), [true]);
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts), (1, 1));
}

// ---- NaN output ---------------------------------------------------------------------------------------------------

#[test]
fn without_output_checks_nan_output_passes_unnoticed() {
    let (_sup, lib, events) = open("check_output = false", Isolation::Process);
    assert!(!lib.extension().policy().check_output);
    let mut inst = amp(&lib);
    let b = run(&mut inst, arm(NAN, 1), &signal(1));
    assert_eq!(b.processed, Processed::Ran);
    assert!(b.audio().iter().all(|v| v.is_nan()), "{:?}", b.out);
    assert_eq!(lib.extension().stats().faults, 0);
    assert!(events.try_iter().next().is_none());
}

#[test]
fn by_default_a_nan_block_is_a_fault_recovered_and_retried() {
    let (_sup, lib, events) = open("", Isolation::Process);
    assert!(lib.extension().policy().check_output, "output checks are on by default");
    let mut inst = amp(&lib);
    let armed = arm(NAN, 3);
    for n in 1..=3 {
        let input = signal(n);
        let b = run(&mut inst, armed, &input);
        assert_eq!(b.processed, Processed::Ran, "block {n}");
        assert_eq!(b.audio(), scaled(&input, GAIN), "block {n}");
        assert_no_nan(&b);
        if n == 3 {
            assert_eq!(b.blocks, 1.0, "the NaN block was retried on a new incarnation");
        }
    }
    let seen: Vec<Event> = events.try_iter().collect();
    let f = faults(&seen);
    assert_eq!(f.len(), 1, "{seen:?}");
    assert!(matches!(f[0].kind, FaultKind::BadOutput { .. }), "{:?}", f[0]);
    assert_eq!(f[0].call.as_deref(), Some(RUN));
    assert_eq!(replayed(&seen), [3]);
    assert!(!seen.iter().any(|e| matches!(e, Event::OwnOutput { .. })), "{seen:?}");
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts, stats.incarnation), (1, 1, 2));
}

#[test]
fn a_plugin_that_writes_nan_again_after_its_recovery_has_it_passed_on_as_natively() {
    let (_sup, lib, events) = open("", Isolation::Process);
    let mut inst = amp(&lib);
    // From block 1 on, every block: the retry, block 1 of the new incarnation, writes NaN again, as it would
    // natively.
    let always = Arm { kind: NAN, at: 1.0, repeat: true };
    for n in 1..=3 {
        let b = run(&mut inst, always, &signal(n));
        assert_eq!(b.processed, Processed::Ran, "block {n}");
        assert!(b.audio().iter().all(|v| v.is_nan()), "block {n}: the plugin's own output: {:?}", b.out);
        assert_eq!(b.blocks, n as f32, "block {n}: the recovered instance counts on (its blocks were replayed)");
    }
    let seen: Vec<Event> = events.try_iter().collect();
    let f = faults(&seen);
    assert_eq!(f.len(), 1, "one recovery, then the output is the plugin's own: {seen:?}");
    assert!(matches!(f[0].kind, FaultKind::BadOutput { .. }), "{:?}", f[0]);
    let own: Vec<&Event> = seen.iter().filter(|e| matches!(e, Event::OwnOutput { .. })).collect();
    assert_eq!(own.len(), 1, "said once: {seen:?}");
    let line = own[0].to_string();
    assert!(line.contains(RUN) && line.contains("plugin's own output"), "{line}");
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts), (1, 1));
    assert!(!stats.disabled);
}

#[test]
fn with_no_retries_a_nan_block_is_bypassed() {
    let (_sup, lib, events) = open("max_retries = 0", Isolation::Process);
    let mut inst = amp(&lib);
    let input = signal(1);
    let b = run(&mut inst, arm(NAN, 1), &input);
    assert!(is_bypassed(&b.processed), "{:?}", b.processed);
    assert_eq!(b.audio(), input, "bypass: the input passes through");
    assert_no_nan(&b);
    assert_eq!(b.blocks, SENTINEL, "a bypassed block leaves the control outputs alone");
    let seen: Vec<Event> = events.try_iter().collect();
    assert!(faults(&seen).iter().all(|f| matches!(f.kind, FaultKind::BadOutput { .. })), "{seen:?}");
    assert!(!replayed(&seen).is_empty(), "the domain was recovered: {seen:?}");

    // A clean block afterwards runs again.
    let input = signal(2);
    let b = run(&mut inst, CLEAN, &input);
    assert_eq!(b.processed, Processed::Ran);
    assert_eq!(b.audio(), scaled(&input, GAIN));
}

// ---- past the restart limit --------------------------------------------------------------------------------------

/// Only the restart limit disables here (not `max_failures_in_row`, which tests of its own cover).
const DISABLE_KEYS: &str = "max_restarts = 3\nrestart_period_s = 3600\nbackoff_initial_ms = 0.001\n\
                            backoff_max_ms = 0.001\nmax_failures_in_row = 0";

#[test]
fn a_plugin_crashing_on_every_block_is_disabled_and_bypassed() {
    let (_sup, lib, events) = open(DISABLE_KEYS, Isolation::Process);
    let mut inst = amp(&lib);
    let every = arm(NULL_DEREF, 0);
    for n in 1..=4 {
        let input = signal(n);
        let b = run(&mut inst, every, &input);
        assert!(is_bypassed(&b.processed), "block {n}: {:?}", b.processed);
        assert_eq!(b.audio(), input, "block {n}: bypass passes the input through");
        assert_eq!(b.blocks, SENTINEL, "block {n}: control outputs keep their values");
    }
    let stats = lib.extension().stats();
    assert!(stats.disabled, "{stats:?}");
    assert_eq!(stats.restarts, 3, "{stats:?}");
    let seen: Vec<Event> = events.try_iter().collect();
    assert!(disabled(&seen), "{seen:?}");
    assert!(faults(&seen).iter().all(|f| signal_cause(f).1 == SignalCause::NullDereference), "{seen:?}");

    // Disabled: blocks fail fast, with a reason saying so, and nothing else reaches the host either.
    let input = signal(5);
    let b = run(&mut inst, CLEAN, &input);
    match &b.processed {
        Processed::Bypassed { reason } => assert!(reason.contains("disabled"), "{reason}"),
        other => panic!("a disabled plugin ran: {other:?}"),
    }
    assert_eq!(b.audio(), input);
    assert!(events.try_iter().all(|e| !matches!(e, Event::Fault { .. } | Event::Recovered { .. })));
    assert!(is_bypassed(&inst.deactivate().unwrap()));
    assert!(is_bypassed(&inst.activate().unwrap()));
    assert!(is_bypassed(&inst.set_run_adding_gain(0.25).unwrap()));
    // run_adding's fallback mixes the input in with the run-adding gain.
    let base = signal(6);
    let b = amp_block(&mut inst, GAIN, CLEAN, &input, [base.clone(), vec![SENTINEL; TAIL]].concat(), true);
    assert!(is_bypassed(&b.processed));
    let mixed: Vec<f32> = base.iter().zip(&input).map(|(o, i)| o + i * 0.25).collect();
    assert_eq!(b.audio(), mixed);
}

#[test]
fn a_disabled_generator_is_bypassed_to_silence() {
    let (_sup, lib, events) = open(DISABLE_KEYS, Isolation::Process);
    let tone = lib.plugin("faulty_tone").unwrap().clone();
    assert!(tone.ports.iter().all(|p| !(p.is_input() && p.is_audio())), "a generator: no audio input");
    let mut inst = lib.instantiate(tone.index, 48000).unwrap();
    assert_eq!(inst.activate().unwrap(), Processed::Ran);
    let (freq, kind, at, repeat) = ([440.0f32], [NULL_DEREF], [0.0f32], [0.0f32]);
    for n in 1..=4 {
        let mut out = output();
        let processed = inst
            .run(
                N,
                &mut [
                    PortBuffer::Output(&mut out),
                    PortBuffer::Input(&freq),
                    PortBuffer::Input(&kind),
                    PortBuffer::Input(&at),
                    PortBuffer::Input(&repeat),
                ],
            )
            .unwrap();
        assert!(is_bypassed(&processed), "block {n}: {processed:?}");
        assert!(out[..N].iter().all(|&v| v == 0.0), "block {n}: a bypassed generator is silent: {out:?}");
        assert!(out[N..].iter().all(|&v| v == SENTINEL), "block {n}: {out:?}");
    }
    assert!(lib.extension().stats().disabled);
    assert!(disabled(&events.try_iter().collect::<Vec<_>>()));
}

// ---- run_adding ---------------------------------------------------------------------------------------------------

const ADDING_GAIN: f32 = 0.25;

/// run_adding with faulty_amp's gain and a run-adding gain of ADDING_GAIN, `arm`ed, over blocks 1 to 3: each must
/// mix exactly once into what the host's output held.
fn run_adding_over_three_blocks(keys: &str, armed: Arm) -> Vec<Event> {
    let (_sup, lib, events) = open(keys, Isolation::Process);
    let mut inst = amp(&lib);
    assert_eq!(inst.set_run_adding_gain(ADDING_GAIN).unwrap(), Processed::Ran);
    for n in 1..=3 {
        let input = signal(n);
        let base = signal(n + 10);
        let out = [base.clone(), vec![SENTINEL; TAIL]].concat();
        let b = amp_block(&mut inst, GAIN, armed, &input, out, true);
        assert_eq!(b.processed, Processed::Ran, "block {n}");
        let mixed: Vec<f32> = base.iter().zip(&input).map(|(o, i)| o + i * (GAIN * ADDING_GAIN)).collect();
        assert_eq!(b.audio(), mixed, "block {n}: output += input * gain * run-adding gain");
        let expect_blocks = if n == 3 { 1.0 } else { n as f32 };
        assert_eq!(b.blocks, expect_blocks, "block {n}");
    }
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts), (1, 1));
    events.try_iter().collect()
}

#[test]
fn run_adding_mixes_with_its_gain_across_a_crash() {
    // The overrun mixes into the domain's copy of the output before it crashes: the retry must mix into the
    // host's original output once, with the run-adding gain replayed into the new instance.
    let seen = run_adding_over_three_blocks("", arm(OVERRUN, 3));
    assert_eq!(faults(&seen)[0].call.as_deref(), Some("run_adding"));
    assert_eq!(replayed(&seen), [4], "open, instantiate, activate and set_run_adding_gain: {seen:?}");
}

#[test]
fn run_adding_mixes_with_its_gain_across_a_nan_block() {
    let seen = run_adding_over_three_blocks("check_output = true", arm(NAN, 3));
    assert!(matches!(faults(&seen)[0].kind, FaultKind::BadOutput { .. }), "{seen:?}");
}

// ---- two instances, one domain -------------------------------------------------------------------------------------

#[test]
fn a_fault_in_one_instance_leaves_the_other_working() {
    let (_sup, lib, events) = open("", Isolation::Process);
    let (mut a, mut b) = (amp(&lib), amp(&lib));
    const GAIN_B: f32 = 2.0;
    let armed = arm(NULL_DEREF, 3);
    for n in 1..=2 {
        let input = signal(n);
        let ra = run(&mut a, armed, &input);
        let rb = amp_block(&mut b, GAIN_B, CLEAN, &input, output(), false);
        assert_eq!(ra.state(), (Processed::Ran, n as f32));
        assert_eq!(rb.state(), (Processed::Ran, n as f32));
        assert_eq!(rb.audio(), scaled(&input, GAIN_B));
    }
    let input = signal(3);
    let ra = run(&mut a, armed, &input);
    assert_eq!(ra.state(), (Processed::Ran, 1.0), "A's block 3 recovered and retried");
    assert_eq!(ra.audio(), scaled(&input, GAIN));
    let seen: Vec<Event> = events.try_iter().collect();
    assert_eq!(faults(&seen).len(), 1);
    assert_eq!(replayed(&seen), [5], "open, and instantiate and activate of both instances: {seen:?}");

    // B lost its old instance with the domain; the replay made it a fresh, activated one (its counter restarts).
    for n in 1..=2 {
        let input = signal(10 + n);
        let rb = amp_block(&mut b, GAIN_B, CLEAN, &input, output(), false);
        assert_eq!(rb.state(), (Processed::Ran, n as f32), "B after the recovery, block {n}");
        assert_eq!(rb.audio(), scaled(&input, GAIN_B));
    }
    // And the handles still point at the right instances: A counts on from its retried block.
    let input = signal(20);
    let ra = run(&mut a, CLEAN, &input);
    assert_eq!(ra.state(), (Processed::Ran, 2.0));
    assert_eq!(ra.audio(), scaled(&input, GAIN));
    assert_eq!(lib.extension().stats().restarts, 1);
}

// ---- the host's buffers ---------------------------------------------------------------------------------------------

#[test]
fn the_hosts_input_is_never_modified_and_output_is_written_only_on_success_or_bypass() {
    // No retries: a faulted attempt's block is bypassed at once (a NaN retried and written again would be the
    // plugin's own output, passed on).
    let (_sup, lib, _events) = open("check_output = true\nmax_retries = 0", Isolation::Process);
    let mut inst = amp(&lib);
    let input = signal(1);
    let copy = input.clone();

    // A host error (the output buffer too short for the block): nothing is written.
    let (gain, kind, at, repeat) = ([GAIN], [0.0f32], [1.0f32], [0.0f32]);
    let mut short = vec![SENTINEL; N - 1];
    let mut blocks = [SENTINEL];
    let err = inst.run(
        N,
        &mut [
            PortBuffer::Input(&input),
            PortBuffer::Output(&mut short),
            PortBuffer::Input(&gain),
            PortBuffer::Input(&kind),
            PortBuffer::Input(&at),
            PortBuffer::Input(&repeat),
            PortBuffer::Output(&mut blocks),
        ],
    );
    assert!(matches!(err, Err(ClassError::BadArguments { .. })), "{err:?}");
    assert!(short.iter().all(|&v| v == SENTINEL) && blocks[0] == SENTINEL, "a refused block wrote output");
    assert_eq!(input, copy);

    // Faulted attempts write nothing: neither the overrun's output (written before it crashed) nor NaN reach the
    // host; the block is bypassed.
    for (what, armed) in [("overrun", arm(OVERRUN, 1)), ("NaN", Arm { kind: NAN, at: 1.0, repeat: true })] {
        let b = run(&mut inst, armed, &input);
        assert!(is_bypassed(&b.processed), "{what}: {:?}", b.processed);
        assert_eq!(b.audio(), input, "{what}: the bypassed block passes the input through");
        assert_eq!(b.blocks, SENTINEL, "{what}: no control output of a failed attempt");
        assert_no_nan(&b);
        assert_eq!(input, copy, "{what}");
    }

    // A block that succeeds writes the block, and only the block.
    let b = run(&mut inst, CLEAN, &input);
    assert_eq!(b.processed, Processed::Ran);
    assert_eq!(b.audio(), scaled(&input, GAIN));
    assert_eq!(b.blocks, 1.0);
    assert_eq!(input, copy);
    assert!(!lib.extension().stats().disabled);
}

#[test]
fn with_history_a_restarted_plugin_resumes_in_the_state_it_had() {
    // History is on by default; `history_mb = 0` turns it off.
    for (keys, counted) in [("", 3.0), ("history_mb = 0", 1.0)] {
        let (_sup, lib, events) = open_as_written(keys, Isolation::Process);
        let mut inst = amp(&lib);
        for n in 1..=3 {
            if n == 3 {
                // A crash between blocks, as far as the host can tell.
                let pid = lib.extension().pid().expect("a process domain");
                // SAFETY: our own domain process.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let input = signal(n);
            let b = run(&mut inst, CLEAN, &input);
            assert_eq!(b.processed, Processed::Ran, "{keys:?}: block {n}");
            assert_eq!(b.audio(), scaled(&input, GAIN), "{keys:?}: block {n}");
            let expected = if n == 3 { counted } else { n as f32 };
            assert_eq!(b.blocks, expected, "{keys:?}: block {n}: the counter, replayed with the history or not");
        }
        let seen: Vec<Event> = events.try_iter().collect();
        assert_eq!(faults(&seen).len(), 1, "{keys:?}: {seen:?}");
        let replayed_calls = if counted == 3.0 { 3 + 2 } else { 3 };
        assert_eq!(replayed(&seen), [replayed_calls], "{keys:?}: open, instantiate, activate (and two blocks)");
    }
}

// ---- the same in an mpk domain -----------------------------------------------------------------------------------

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_every_crash_kind_at_block_3_is_recovered_transparently() {
    require_pku();
    let f = transparent_at_block_3_in(NULL_DEREF, "", Isolation::Mpk);
    assert_eq!(signal_cause(&f), ("SIGSEGV".into(), SignalCause::NullDereference));
    let f = transparent_at_block_3_in(ABORT, "", Isolation::Mpk);
    assert_eq!(signal_cause(&f), ("SIGABRT".into(), SignalCause::Abort));
    let f = transparent_at_block_3_in(EXIT3, "", Isolation::Mpk);
    assert_eq!(f.kind, FaultKind::Exited { status: 3 });
    let f = transparent_at_block_3_in(RECURSION, "", Isolation::Mpk);
    assert_eq!(signal_cause(&f), ("SIGSEGV".into(), SignalCause::StackOverflow));
    let f = transparent_at_block_3_in(DIV_ZERO, "", Isolation::Mpk);
    assert_eq!(signal_cause(&f), ("SIGFPE".into(), SignalCause::Arithmetic));
    let f = transparent_at_block_3_in(ILLEGAL, "", Isolation::Mpk);
    assert_eq!(signal_cause(&f), ("SIGILL".into(), SignalCause::IllegalInstruction));
}

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_an_output_overrun_faults_at_the_adapters_guard_page() {
    require_pku();
    overrun_caught(Isolation::Mpk);
}

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_a_hang_at_block_3_is_stopped_at_the_deadline_and_recovered_transparently() {
    require_pku();
    let f = transparent_at_block_3_in(INFINITE_LOOP, "deadline_ms = 2000", Isolation::Mpk);
    assert_eq!(f.kind, FaultKind::Timeout { deadline: Duration::from_millis(2000) });
}

// ---- given up on, whatever the clock says ------------------------------------------------------------------------

/// With the default policy (deadlines learned, the restart limit far away), a plugin hanging on every block from
/// the first is judged by the class's first deadline for a block, and its third hang in a row disables it: the
/// block is bypassed and the event says the host gets its audio through.
#[test]
fn a_plugin_hanging_on_every_block_is_disabled_at_its_third_hang_in_a_row() {
    let (_sup, lib, events) = open("", Isolation::Process);
    let mut inst = amp(&lib);
    let every = Arm { kind: INFINITE_LOOP, at: 0.0, repeat: true };
    for n in 1..=2 {
        let input = signal(n);
        let b = run(&mut inst, every, &input);
        assert!(is_bypassed(&b.processed), "block {n}: {:?}", b.processed);
        assert_eq!(b.audio(), input, "block {n}: bypass passes the input through");
    }
    let stats = lib.extension().stats();
    assert!(stats.disabled, "{stats:?}");
    assert_eq!(stats.restarts, 2, "the block and its retry, then the next block: {stats:?}");
    let seen: Vec<Event> = events.try_iter().collect();
    assert!(
        faults(&seen).iter().all(|f| f.kind == FaultKind::Timeout { deadline: Duration::from_secs(1) }),
        "the class's first deadline for a block: {seen:?}"
    );
    let line = seen.iter().find(|e| matches!(e, Event::Disabled { .. })).map(Event::to_string).unwrap_or_default();
    assert!(line.contains(&format!("disabled after {RUN} failed 3 times in a row")), "{seen:?}");
    assert!(
        line.ends_with("from now on audio passes through unchanged (outputs with no input of their own are silent)"),
        "{line}"
    );
}
