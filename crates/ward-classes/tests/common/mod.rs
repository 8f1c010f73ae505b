//! Helpers shared by the class tests.

// Each test file uses some of them.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::mpsc::Receiver;

use ward::Event;
use ward_xpc::mix::SplitMix64;

/// A scratch directory for one test (`ward-classes-SUITE-PID-TEST` in the temporary directory), emptied first and
/// removed at the end.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(suite: &str, test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ward-classes-{suite}-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The files the extension's image was switched to (`restart_from`), in order.
pub fn switched_to(events: &Receiver<Event>) -> Vec<PathBuf> {
    events
        .try_iter()
        .filter_map(|e| match e {
            Event::ImageSwitched { path, .. } => Some(path),
            _ => None,
        })
        .collect()
}

/// A deterministic test image: pseudo-random pixels (splitmix64), every channel used.
pub fn image(seed: u32, pixels: usize) -> Vec<u32> {
    let mut stream = SplitMix64::new(u64::from(seed));
    // The high half: SplitMix64's best-mixed bits.
    (0..pixels).map(|_| (stream.next_u64() >> 32) as u32).collect()
}

/// For the tests that need PKU, which are marked `#[ignore = "needs PKU"]` (`scripts/test` runs them where the
/// processor has PKU, under emulation where it has not; tests/mpk.rs checks the fallback a host gets without it):
/// fails the test, saying why, where there is no PKU, so that a run with `--include-ignored` on such a machine fails
/// instead of passing without having run.
pub fn require_pku() {
    assert!(
        ward::mpk_available(),
        "this test needs memory protection keys (PKU), which this machine does not have: run it under scripts/pku-vm"
    );
}
