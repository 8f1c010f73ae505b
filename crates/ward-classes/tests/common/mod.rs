//! Helpers shared by the class tests.

// Each test file uses some of them.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::mpsc::Receiver;

use ward::Event;

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

/// A deterministic test image: pseudo-random pixels (xorshift), every channel used.
pub fn image(seed: u32, pixels: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9) | 1;
    (0..pixels)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        })
        .collect()
}

/// Whether this machine has PKU; says so when it has not (`scripts/test` runs the mpk tests again in an emulated
/// machine that has it; tests/mpk.rs checks the fallback a host gets without it).
pub fn pku() -> bool {
    let here = ward::mpk_available();
    if !here {
        eprintln!("no PKU on this machine: the mpk part of this test did not run here");
    }
    here
}
