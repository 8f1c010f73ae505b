//! A real-time instance of the built-in `lv2_gate` whose block waits at a FIFO the test opens: a block that misses
//! its real-time deadline, late, for as long as a test likes. Shared by the test files that need one.

// Each test file uses some of it.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ward::{Event, Isolation, Policy, Supervisor};
use ward_classes::lv2::bundle;
use ward_classes::lv2::{Features, Library, PortBuffer, PortSpec, Setup, UridMap};
use ward_classes::Processed;

use crate::common;

const RATE: f64 = 48000.0;
pub const BLOCK: usize = 256;

pub const GATE: (&str, &str) = ("lv2_gate", "urn:ward:lv2:gate");
/// Blocks `lv2_gate` runs before the one gated in the tests below: past a new incarnation's first real-time calls
/// (16), so the block's real-time deadline is the learned one, shorter than its normal deadline.
pub const BEFORE_GATE: usize = 24;
/// Bounds of waits for what the tests wait for: generous, not timing claims.
pub const BOUND: Duration = Duration::from_secs(120);

/// Every sample of `out` is `expected` (bit for bit), or the first that is not is said.
pub fn every_sample_is(out: &[f32], expected: f32, what: &str) {
    let wrong = out.iter().position(|s| s.to_bits() != expected.to_bits());
    assert_eq!(wrong.map(|i| (i, out[i])), None, "{what}: expected {expected} everywhere");
}

/// A real-time instance of `lv2_gate` whose bundle directory is a scratch directory holding the FIFO `gate`, and
/// the sum of the inputs of the blocks it ran, as the plugin keeps it.
pub struct Gated {
    _sup: Supervisor,
    pub lib: Library,
    pub inst: ward_classes::lv2::Instance,
    pub events: Receiver<Event>,
    /// Every event so far, in order.
    pub seen: RefCell<Vec<Event>>,
    pub fifo: PathBuf,
    _scratch: common::Scratch,
    /// The sum of the first input sample of every block the plugin ran.
    pub total: Cell<f32>,
    /// The input of the block last bypassed because it missed its real-time deadline: the plugin runs it if it
    /// returns late ([`Event::Late`]), not if its domain is recovered first.
    pub late: Cell<Option<f32>>,
}

impl Gated {
    pub fn new(test: &str, policy: &str) -> Gated {
        let scratch = common::Scratch::new("lv2-recovery", test);
        let fifo = scratch.path("gate");
        let c_fifo = CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo(3) with a NUL-terminated path this test owns and a mode.
        assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0, "mkfifo {}", fifo.display());
        let sup = Supervisor::new(Policy::from_toml_str(policy, "test policy").unwrap());
        let events = sup.subscribe();
        let (name, uri) = GATE;
        let binary = ward_extensions::lv2_bundle_of(name).unwrap().join(format!("{name}.so"));
        let info = bundle::plugins_of_binary(&binary).unwrap().into_iter().find(|i| i.uri == uri).unwrap();
        let lib = Library::open(&sup, &binary, Some(Isolation::Process)).unwrap();
        let setup = Setup {
            sample_rate: RATE,
            // The plugin reads nothing else there: its bundle directory is where its gate is.
            bundle: scratch.path(""),
            ports: info.ports.iter().map(PortSpec::from).collect(),
            features: Features::default(),
            host: Arc::new(UridMap::new()),
            realtime: true,
        };
        let inst = lib.instantiate(0, setup).unwrap();
        assert_eq!(inst.activate().unwrap(), Processed::Ran);
        let (seen, total, late) = (RefCell::new(Vec::new()), Cell::new(0.0), Cell::new(None));
        Gated { _sup: sup, lib, inst, events, seen, fifo, _scratch: scratch, total, late }
    }

    /// One block whose every input sample is `v`, waiting at the gate if `wait`: what became of it, its output.
    pub fn raw_block(&self, v: f32, wait: bool) -> (Processed, Vec<f32>) {
        let input = vec![v; BLOCK];
        let mut out = vec![f32::NAN; BLOCK];
        let wait = [if wait { 1.0 } else { 0.0 }];
        let mut ports = [PortBuffer::Input(&input), PortBuffer::Output(&mut out), PortBuffer::Input(&wait)];
        let processed = self.inst.run(BLOCK, &mut ports).unwrap();
        (processed, out)
    }

    /// The events since the last look, kept; whether a late call returned among them.
    pub fn look_at_events(&self) -> bool {
        let fresh: Vec<Event> = self.events.try_iter().collect();
        let returned = fresh.iter().any(|e| matches!(e, Event::Late { .. }));
        self.seen.borrow_mut().extend(fresh);
        returned
    }

    /// The block bypassed as late last has returned or was dropped (a block ran since, or another went late: either
    /// comes only after): the sum has it if it returned.
    pub fn settle_late(&self) {
        let returned = self.look_at_events();
        if let Some(v) = self.late.take().filter(|_| returned) {
            self.total.set(self.total.get() + v);
        }
    }

    /// A block of `v` that does not wait, its output checked against the sum: `Ok` if it ran, else why it was
    /// bypassed. A block that misses its real-time deadline (on a loaded machine) is counted once it returns.
    pub fn block(&self, v: f32, wait: bool) -> Result<(), String> {
        let (processed, out) = self.raw_block(v, wait);
        match processed {
            Processed::Ran => {
                self.settle_late();
                self.total.set(self.total.get() + v);
                every_sample_is(&out, v + self.total.get(), "a block that ran");
                Ok(())
            }
            Processed::Bypassed { reason } => {
                every_sample_is(&out, v, "a bypassed block passes its input through");
                if reason.contains("missed its deadline") {
                    self.settle_late();
                    self.late.set(Some(v));
                }
                Err(reason)
            }
        }
    }

    /// Blocks of `v` until one runs; those before it bypassed, each late or for a reason `bypassed` accepts.
    pub fn block_when_back(&self, v: f32, bypassed: impl Fn(&str) -> bool) {
        let until = Instant::now() + BOUND;
        while let Err(reason) = self.block(v, false) {
            assert!(reason.contains("missed its deadline") || bypassed(&reason), "{reason}");
            assert!(Instant::now() < until, "the plugin did not come back");
            std::thread::yield_now();
        }
    }

    /// [`BEFORE_GATE`] blocks that ran, inputs 1, 2, ...
    pub fn run_up_to_the_gate(&self) {
        for b in 0..BEFORE_GATE {
            self.block_when_back((b + 1) as f32, |reason| reason.contains("still running a late real-time call"));
        }
    }

    /// The gated block, of `v`: its caller gets it back at its real-time deadline while the plugin still waits at
    /// the gate (nothing has opened it yet), bypassed.
    pub fn gated_block(&self, v: f32) {
        let reason = self.block(v, true).expect_err("the gated block ran before its gate opened");
        assert!(reason.contains("missed its deadline"), "{reason}");
    }

    /// The next fault reported.
    pub fn next_fault(&self) -> ward::Fault {
        let until = Instant::now() + BOUND;
        loop {
            assert!(Instant::now() < until, "no fault");
            if let Ok(e) = self.events.recv_timeout(Duration::from_secs(1)) {
                self.seen.borrow_mut().push(e.clone());
                if let Event::Fault { fault } = e {
                    return fault;
                }
            }
        }
    }

    pub fn restarts(&self) -> u64 {
        self.lib.extension().stats().restarts
    }
}
