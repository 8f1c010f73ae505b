//! An LV2 plugin whose domain dies mid-stream resumes with the state it had: ward's built-in `lv2_delay` (a
//! feedback delay whose output depends on all its past input, with `state:interface`) through its last checkpoint
//! and the history around it, exactly even when the history's window is shorter than the stream, and
//! `lv2_counter` (state but no `state:interface`) through its history alone. Output identical to the fault-free
//! run; and without either, visibly not.

use std::io::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ward::{Event, Isolation, Policy, Supervisor};
use ward_classes::lv2::bundle::{self, Direction, PortKind as BundleKind};
use ward_classes::lv2::{Features, Library, PortBuffer, PortSpec, Setup, UridMap};
use ward_classes::Processed;

mod common;
mod gated;

use gated::Gated;

const RATE: f64 = 48000.0;
const BLOCK: usize = 256;
const BLOCKS: usize = 600;
/// A stream longer than a 1 MiB history holds (about 450 blocks of this test's).
const LONG: usize = 1500;
/// The block before which the domain is killed: past two seconds of audio, so past two default checkpoints.
const KILL_AT: usize = 400;

/// A deterministic signal: a sweep plus a little noise from a fixed-seed LCG.
fn signal(blocks: usize) -> Vec<f32> {
    let mut seed = 0x2545_f491u32;
    (0..BLOCK * blocks)
        .map(|i| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let noise = (seed >> 9) as f32 / (1u32 << 23) as f32 - 0.5;
            let t = i as f32 / RATE as f32;
            (t * (200.0 + 300.0 * t) * std::f32::consts::TAU).sin() * 0.5 + noise * 0.05
        })
        .collect()
}

struct Run {
    output: Vec<f32>,
    restarts: u64,
    bypassed: usize,
}

/// Stream the signal through `uri` of the built-in bundle `name` under `policy`, killing its domain before block
/// `kill_at` when given.
fn stream(name: &str, uri: &str, policy: &str, kill_at: Option<usize>) -> Run {
    stream_of(BLOCKS, name, uri, policy, kill_at)
}

fn stream_of(blocks: usize, name: &str, uri: &str, policy: &str, kill_at: Option<usize>) -> Run {
    let sup = Supervisor::new(Policy::from_toml_str(policy, "test policy").unwrap());
    let events = sup.subscribe();
    let bundle_dir = ward_extensions::lv2_bundle_of(name).unwrap();
    let binary = bundle_dir.join(format!("{name}.so"));
    let infos = bundle::plugins_of_binary(&binary).unwrap();
    let info = infos.iter().find(|i| i.uri == uri).unwrap();
    let lib = Library::open(&sup, &binary, Some(Isolation::Process)).unwrap();
    let d = lib.plugin(uri).unwrap().clone();
    let setup = Setup {
        sample_rate: RATE,
        bundle: bundle_dir.clone(),
        ports: info.ports.iter().map(PortSpec::from).collect(),
        features: Features { urid_map: true, urid_unmap: true, ..Features::default() },
        host: Arc::new(UridMap::new()),
        realtime: false,
    };
    let inst = lib.instantiate(d.index, setup).unwrap();
    assert_eq!(inst.activate().unwrap(), Processed::Ran);
    let input = signal(blocks);
    let mut output = Vec::with_capacity(input.len());
    let mut bypassed = 0;
    let controls: Vec<f32> = info.ports.iter().map(|p| p.default.unwrap_or(0.0)).collect();
    for (b, block) in input.chunks(BLOCK).enumerate() {
        if Some(b) == kill_at {
            let pid = lib.extension().pid().expect("a process domain");
            // SAFETY: kill(2) with a pid and a signal number; the pid is the domain process this test started.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        }
        let mut out = vec![0f32; BLOCK];
        let mut control_out = vec![[0f32; 1]; info.ports.len()];
        let mut ports: Vec<PortBuffer<'_>> = Vec::new();
        let mut outs = Some(&mut out);
        for ((p, c), co) in info.ports.iter().zip(&controls).zip(control_out.iter_mut()) {
            ports.push(match (&p.kind, p.direction) {
                (BundleKind::Audio, Direction::Input) => PortBuffer::Input(block),
                (BundleKind::Audio, Direction::Output) => PortBuffer::Output(outs.take().expect("one audio output")),
                (BundleKind::Control, Direction::Input) => PortBuffer::Input(std::slice::from_ref(c)),
                (BundleKind::Control, Direction::Output) => PortBuffer::Output(co),
                (k, _) => panic!("{uri}: port kind {k:?} not driven by this test"),
            });
        }
        match inst.run(BLOCK, &mut ports).unwrap() {
            Processed::Ran => {}
            Processed::Bypassed { .. } => bypassed += 1,
        }
        drop(ports);
        output.extend_from_slice(&out);
    }
    let restarts = lib.extension().stats().restarts;
    if kill_at.is_some() {
        assert!(events.try_iter().any(|e| matches!(e, Event::Recovered { .. })), "{uri}: no recovery");
    }
    Run { output, restarts, bypassed }
}

const DELAY: (&str, &str) = ("lv2_delay", "urn:ward:lv2:delay");
const COUNTER: (&str, &str) = ("lv2_counter", "urn:ward:lv2:counter");

fn same_as_fault_free((name, uri): (&str, &str), policy: &str) {
    let clean = stream(name, uri, policy, None);
    let faulted = stream(name, uri, policy, Some(KILL_AT));
    assert_eq!(faulted.restarts, 1, "{uri}");
    assert_eq!(faulted.bypassed, 0, "{uri}: the block the domain died in was retried, not bypassed");
    let first = clean.output.iter().zip(&faulted.output).position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(first, None, "{uri} under {policy:?}: first differing sample");
}

#[test]
fn a_delay_killed_mid_stream_resumes_from_its_checkpoint_and_history_exactly() {
    same_as_fault_free(DELAY, "");
}

#[test]
fn a_delay_resumes_exactly_past_its_history_window_from_its_checkpoint() {
    // A 1 MiB history holds about a third of this stream: the delay's memory reaches further back, and only the
    // checkpoint (every second, the default) brings it back exactly; without it the resumed delay differs.
    let policy = "[defaults]\nhistory_mb = 1\nhistory_replay_ms = 60000\n";
    let clean = stream_of(LONG, DELAY.0, DELAY.1, policy, None);
    let faulted = stream_of(LONG, DELAY.0, DELAY.1, policy, Some(LONG - 50));
    assert_eq!(faulted.restarts, 1);
    let first = clean.output.iter().zip(&faulted.output).position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(first, None, "first differing sample");
    let without = format!("{policy}checkpoint_ms = 0\n");
    let clean = stream_of(LONG, DELAY.0, DELAY.1, &without, None);
    let faulted = stream_of(LONG, DELAY.0, DELAY.1, &without, Some(LONG - 50));
    assert_eq!(faulted.restarts, 1);
    assert!(
        clean.output.iter().zip(&faulted.output).any(|(a, b)| a.to_bits() != b.to_bits()),
        "the window alone was enough"
    );
}

#[test]
fn a_delay_checkpointed_every_block_needs_no_history_to_resume_exactly() {
    // No history at all: only the checkpoint taken after the block before the crash can bring the delay line back.
    same_as_fault_free(DELAY, "[defaults]\nhistory_mb = 0\ncheckpoint_ms = 5\n");
}

#[test]
fn a_plugin_without_state_interface_resumes_exactly_from_its_history() {
    same_as_fault_free(COUNTER, "");
}

#[test]
fn without_checkpoints_or_history_the_resumed_delay_has_lost_its_state() {
    let policy = "[defaults]\nhistory_mb = 0\ncheckpoint_ms = 0\n";
    let clean = stream(DELAY.0, DELAY.1, policy, None);
    let faulted = stream(DELAY.0, DELAY.1, policy, Some(KILL_AT));
    assert_eq!(faulted.restarts, 1);
    let first = clean.output.iter().zip(&faulted.output).position(|(a, b)| a.to_bits() != b.to_bits());
    assert!(first.is_some_and(|i| i >= KILL_AT * BLOCK), "the two runs part where the domain died: {first:?}");
}

#[test]
fn a_real_time_instance_bypasses_blocks_while_its_domain_is_recovered_apart_then_runs_again() {
    let (name, uri) = DELAY;
    let sup = Supervisor::new(Policy::default());
    let bundle_dir = ward_extensions::lv2_bundle_of(name).unwrap();
    let binary = bundle_dir.join(format!("{name}.so"));
    let info = bundle::plugins_of_binary(&binary).unwrap().into_iter().find(|i| i.uri == uri).unwrap();
    let lib = Library::open(&sup, &binary, Some(Isolation::Process)).unwrap();
    let setup = Setup {
        sample_rate: RATE,
        bundle: bundle_dir,
        ports: info.ports.iter().map(PortSpec::from).collect(),
        features: Features { urid_map: true, ..Features::default() },
        host: Arc::new(UridMap::new()),
        realtime: true,
    };
    let inst = lib.instantiate(0, setup).unwrap();
    inst.activate().unwrap();
    let input = vec![0.25f32; BLOCK];
    let mix = [0.5f32];
    let block = |out: &mut Vec<f32>| {
        let mut blocks = [0f32];
        let mut ports = [
            PortBuffer::Input(&input),
            PortBuffer::Output(out),
            PortBuffer::Input(&mix),
            PortBuffer::Output(&mut blocks),
        ];
        inst.run(BLOCK, &mut ports).unwrap()
    };
    let mut out = vec![0f32; BLOCK];
    for _ in 0..20 {
        assert_eq!(block(&mut out), Processed::Ran);
    }
    let pid = lib.extension().pid().expect("a process domain");
    // SAFETY: kill(2) with a pid and a signal number; the pid is the domain process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // The block that finds the domain dead is bypassed at once (input to output), not retried.
    let Processed::Bypassed { reason } = block(&mut out) else { panic!("the dead domain's block ran") };
    assert!(reason.contains("SIGKILL") || reason.contains("vanished") || reason.contains("died"), "{reason}");
    assert_eq!(out, input);
    // Blocks are bypassed while the recovery runs on its own thread, then the plugin is back.
    let mut while_recovering = 0u64;
    while let Processed::Bypassed { reason } = block(&mut out) {
        assert!(reason.contains("being recovered"), "{reason}");
        while_recovering += 1;
        std::thread::yield_now();
        assert!(while_recovering < 1 << 40);
    }
    assert_eq!(lib.extension().stats().restarts, 1);
    assert!(!lib.extension().stats().disabled);
}

#[test]
fn a_real_time_block_that_misses_its_period_is_late_not_hung_and_is_replayed_as_the_plugin_ran_it() {
    // A normal deadline of a minute: the gate is opened long before it. A history that holds every block however
    // slowly a loaded machine runs them (it is bounded by their replay time too).
    let policy = "[defaults]\ndeadline_floor_ms = 60000\ndeadline_ceiling_ms = 60000\nhistory_replay_ms = 600000\n";
    let g = Gated::new("late", policy);
    g.run_up_to_the_gate();
    g.gated_block(25.0);
    // Open the gate: opening the FIFO for writing waits until the plugin has it open for reading.
    std::fs::OpenOptions::new().write(true).open(&g.fifo).unwrap().write_all(&[1]).unwrap();
    // From now on no block waits (a replay runs the gated one again).
    std::fs::remove_file(&g.fifo).unwrap();
    // The late block completes in the domain; real-time blocks are bypassed at once until it has, then run on a
    // plugin that ran it: the sum checked at each block has it.
    for v in [1000.0, 2000.0, 3000.0] {
        g.block_when_back(v, |reason| reason.contains("still running a late real-time call"));
    }
    assert_eq!(g.late.get(), None);
    let seen = g.seen.borrow().clone();
    assert!(!seen.iter().any(|e| matches!(e, Event::Fault { .. })), "a late block is no fault: {seen:?}");
    assert!(seen.iter().any(|e| matches!(e, Event::Late { call, .. } if call == "run")), "{seen:?}");
    assert_eq!(g.restarts(), 0, "no restart for a late block");
    assert_eq!(g.lib.extension().stats().incarnation, 1);
    // A recovery now replays the history: the late block is in it with the input the plugin really got.
    let pid = g.lib.extension().pid().expect("a process domain");
    // SAFETY: kill(2) with a pid and a signal number; the pid is the domain process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    g.block_when_back(4000.0, |reason| {
        reason.contains("SIGKILL")
            || reason.contains("vanished")
            || reason.contains("being recovered")
            || reason.contains("still running a late real-time call")
    });
    assert_eq!(g.restarts(), 1);
}

#[test]
fn a_real_time_block_that_never_returns_is_a_hang_at_its_normal_deadline_and_recovered() {
    // A normal deadline of two seconds, the floor: far above any block of this plugin's on a loaded machine; and a
    // history that holds every block however slowly such a machine runs them.
    let g = Gated::new("hang", "[defaults]\ndeadline_floor_ms = 2000\nhistory_replay_ms = 600000\n");
    g.run_up_to_the_gate();
    g.gated_block(25.0);
    // The gate never opens: at the block's normal deadline it is a hang of its incarnation, recovered.
    let fault = g.next_fault();
    let ward::FaultKind::Timeout { deadline } = fault.kind else { panic!("not a hang: {fault}") };
    assert!(deadline >= Duration::from_secs(2), "{deadline:?}");
    assert_eq!(fault.incarnation, 1);
    assert_eq!(fault.call.as_deref(), Some("run"));
    assert!(!g.seen.borrow().iter().any(|e| matches!(e, Event::Late { .. })), "the hung block returned");
    // The recovered plugin never ran the hung block: the sum checked does not have it.
    g.block_when_back(1000.0, |reason| {
        reason.contains("still running a late real-time call") || reason.contains("being recovered")
    });
    assert_eq!(g.restarts(), 1);
}

#[test]
fn while_a_block_runs_late_the_domains_counters_process_and_reports_answer_at_once() {
    // A normal deadline of a minute: the late block returns long before it. Had the calls below waited for it with
    // the gate shut, they would have returned only once it was a hang, its domain recovered.
    let policy = "[defaults]\ndeadline_floor_ms = 60000\ndeadline_ceiling_ms = 60000\nhistory_replay_ms = 600000\n";
    let g = Gated::new("late-counters", policy);
    g.run_up_to_the_gate();
    let ext = g.lib.extension();
    let pid = ext.pid().expect("a process domain");
    let ran = ext.stats().shadow_log;
    g.gated_block(25.0);
    // The thread that waits for the late block takes the domain a moment after the block is handed over: asked over
    // and over for a while, they are surely asked while it holds the domain (a bound, not a timing claim).
    let until = Instant::now() + Duration::from_secs(1);
    let mut asked = 0u64;
    while asked == 0 || Instant::now() < until {
        let stats = ext.stats();
        assert_eq!((stats.incarnation, stats.restarts, stats.faults), (1, 0, 0), "{stats:?}");
        assert!(stats.shadow_log >= ran, "{stats:?}");
        assert_eq!(ext.pid(), Some(pid));
        asked += 1;
        std::thread::yield_now();
    }
    // A report the class makes meanwhile is said once the late block is over, not waited for.
    ext.report_own_output("ward_lv2_run", "a report made while a block ran late");
    assert!(!g.look_at_events(), "the late block returned before its gate opened");
    assert!(!g.seen.borrow().iter().any(|e| matches!(e, Event::Fault { .. } | Event::OwnOutput { .. })));
    std::fs::OpenOptions::new().write(true).open(&g.fifo).unwrap().write_all(&[1]).unwrap();
    std::fs::remove_file(&g.fifo).unwrap();
    g.block_when_back(1000.0, |reason| reason.contains("still running a late real-time call"));
    g.look_at_events();
    let seen = g.seen.borrow().clone();
    let late = seen.iter().position(|e| matches!(e, Event::Late { .. })).expect("the late block returned");
    let report = seen.iter().position(|e| matches!(e, Event::OwnOutput { call, .. } if call == "run"));
    assert!(report.is_some_and(|r| r > late), "the report comes after the late block: {seen:?}");
    assert!(!seen.iter().any(|e| matches!(e, Event::Fault { .. })), "{seen:?}");
    assert_eq!(ext.stats().restarts, 0);
}

#[test]
fn a_fault_declared_while_a_block_runs_late_is_recovered_once_it_returns_without_waiting_for_it() {
    let policy = "[defaults]\ndeadline_floor_ms = 60000\ndeadline_ceiling_ms = 60000\nhistory_replay_ms = 600000\n";
    let g = Gated::new("late-declared", policy);
    g.run_up_to_the_gate();
    let ext = g.lib.extension();
    g.gated_block(25.0);
    let until = Instant::now() + Duration::from_secs(1);
    let mut declared = false;
    while !declared || Instant::now() < until {
        if !declared {
            let kind = ward::FaultKind::BadOutput { what: "declared while a block ran late".into() };
            ext.declare_fault_apart("ward_lv2_run", kind).unwrap();
            declared = true;
        }
        // Not recovered under the late block, nor waited for: it is still at its gate.
        assert_eq!(ext.stats().restarts, 0);
        std::thread::yield_now();
    }
    assert!(!g.look_at_events(), "the late block returned before its gate opened");
    std::fs::OpenOptions::new().write(true).open(&g.fifo).unwrap().write_all(&[1]).unwrap();
    std::fs::remove_file(&g.fifo).unwrap();
    // The late block returns, then the declared fault is recovered.
    let fault = g.next_fault();
    assert!(matches!(fault.kind, ward::FaultKind::BadOutput { .. }), "{fault}");
    assert_eq!(fault.incarnation, 1);
    assert!(g.seen.borrow().iter().any(|e| matches!(e, Event::Late { .. })), "the late block returned first");
    // The recovered plugin has the late block (history), not the one before it, whose result the fault was
    // declared of (the last before the gate, of 24): dropped from the history as the class's declaration asks.
    assert_eq!(g.late.take(), Some(25.0));
    g.total.set(g.total.get() + 25.0 - gated::BEFORE_GATE as f32);
    g.block_when_back(1000.0, |reason| {
        reason.contains("still running a late real-time call") || reason.contains("being recovered")
    });
    assert_eq!(g.restarts(), 1);
}

/// A tracing subscriber, for the thread running a real-time block, that stops the domain process `pid` (SIGSTOP) at
/// the block's report that its wrong output is the plugin's own: after the block's run returned, before the class
/// fetches the worker requests that run queued, so that fetch runs late.
struct StopAtOwnOutput {
    pid: i32,
    stopped: std::sync::atomic::AtomicBool,
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for StopAtOwnOutput {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0.contains("wrong output again after recovery") && !self.stopped.swap(true, Ordering::SeqCst) {
            // SAFETY: kill(2) with a pid and a signal number; the pid is the domain process this test started.
            assert_eq!(unsafe { libc::kill(self.pid, libc::SIGSTOP) }, 0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn worker_requests_whose_fetch_ran_late_are_fetched_again_not_lost() {
    // `lv2_worker` schedules a request numbered N at each block N that is a multiple of 16. A normal deadline of a
    // minute: the late fetch returns long before it. Blocks of about a second (256 samples at 250 Hz): their
    // real-time deadline is at least that, so the blocks before the one stopped are not late even on a loaded
    // machine (a late one would still run, but shift the plugin's count of blocks off the loop's).
    let policy = "[defaults]\ndeadline_floor_ms = 60000\ndeadline_ceiling_ms = 60000\nhistory_replay_ms = 600000\n";
    let sup = Supervisor::new(Policy::from_toml_str(policy, "test policy").unwrap());
    let events = sup.subscribe();
    let (name, uri) = ("lv2_worker", "urn:ward:lv2:worker");
    let bundle_dir = ward_extensions::lv2_bundle_of(name).unwrap();
    let binary = bundle_dir.join(format!("{name}.so"));
    let info = bundle::plugins_of_binary(&binary).unwrap().into_iter().find(|i| i.uri == uri).unwrap();
    let lib = Library::open(&sup, &binary, Some(Isolation::Process)).unwrap();
    let setup = Setup {
        sample_rate: 250.0,
        bundle: bundle_dir,
        ports: info.ports.iter().map(PortSpec::from).collect(),
        features: Features { urid_map: true, worker_schedule: true, ..Features::default() },
        host: Arc::new(UridMap::new()),
        realtime: true,
    };
    let inst = lib.instantiate(0, setup).unwrap();
    assert_eq!(inst.activate().unwrap(), Processed::Ran);
    let requests = std::cell::RefCell::new(Vec::<u32>::new());
    let block = |v: f32| {
        let input = vec![v; BLOCK];
        let mut out = vec![0f32; BLOCK];
        let mut ports = [PortBuffer::Input(&input), PortBuffer::Output(&mut out)];
        let processed = inst.run(BLOCK, &mut ports).unwrap();
        for request in inst.take_work() {
            requests.borrow_mut().push(u32::from_ne_bytes(request.as_slice().try_into().expect("a block number")));
        }
        processed
    };
    let until = Instant::now() + Duration::from_secs(120);
    let when_back = |v: f32| loop {
        assert!(Instant::now() < until, "the plugin did not come back");
        match block(v) {
            Processed::Ran => return,
            Processed::Bypassed { .. } => std::thread::yield_now(),
        }
    };
    // Past the fetch's learned deadline (eight fetches, one each 16 blocks) and a new incarnation's first calls:
    // its real-time deadline is then shorter than its normal one, and a fetch that misses it runs late.
    const GATED: u32 = 16 * 12;
    for _ in 0..GATED {
        when_back(1.0);
    }
    // Block GATED, of NaN: its output is declared wrong, the block bypassed and the domain recovered, the block
    // dropped from the history: the recovered plugin is at block GATED again.
    let Processed::Bypassed { reason } = block(f32::NAN) else { panic!("a NaN block passed its check") };
    assert!(reason.contains("output check failed"), "{reason}");
    let until_recovered = Instant::now() + Duration::from_secs(120);
    while !events.try_iter().any(|e| matches!(e, Event::Recovered { .. })) {
        assert!(Instant::now() < until_recovered, "no recovery");
        std::thread::yield_now();
    }
    let pid = lib.extension().pid().expect("a process domain");
    // Block GATED again, of NaN again: the plugin's own output, passed on, and the request it queued is fetched
    // after that is said, with the domain stopped: the fetch runs late.
    let stop = Arc::new(StopAtOwnOutput { pid, stopped: Default::default() });
    tracing::subscriber::with_default(Arc::clone(&stop), || when_back(f32::NAN));
    assert!(stop.stopped.load(Ordering::SeqCst), "the block reported no output of its own");
    // SAFETY: kill(2) with a pid and a signal number; the pid is the domain process this test stopped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    for _ in 0..40 {
        when_back(1.0);
    }
    let seen: Vec<Event> = events.try_iter().collect();
    assert!(seen.iter().any(|e| matches!(e, Event::Late { call, .. } if call == "schedule_work")), "{seen:?}");
    // Every request the plugin queued reached the host once: the late fetch's too (GATED's, when no block before
    // it ran late).
    let requests = requests.into_inner();
    let last = requests.last().copied().unwrap_or_default();
    assert!(last >= GATED + 16, "{requests:?}");
    assert_eq!(requests, (0..=last).step_by(16).collect::<Vec<u32>>());
}
