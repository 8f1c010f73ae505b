//! Text faults: one random bit of one random instruction flipped, as in Nooks.
//!
//! One restriction over the paper's injector: the flipped bytes must still decode as one valid instruction of the
//! same length. A flip that changes the length makes the CPU read the following instructions from the wrong
//! boundaries, so one fault would silently become several unrelated ones and the report's `after` would describe
//! something the CPU never executes. Bits are tried in random order until one keeps the boundary.

use iced_x86::{Code, Decoder, DecoderOptions};

use super::flip_bit;
use crate::decode::{is_filler, Listing};
use crate::rng::Rng;

pub(super) fn sites(listing: &Listing<'_>) -> Vec<usize> {
    (0..listing.instrs.len()).filter(|&i| !is_filler(&listing.instrs[i])).collect()
}

pub(super) fn apply(listing: &Listing<'_>, i: usize, rng: &mut Rng) -> Option<Vec<u8>> {
    let original = listing.bytes(i);
    let ip = listing.instrs[i].ip();
    let mut bits: Vec<usize> = (0..original.len() * 8).collect();
    rng.shuffle(&mut bits);
    bits.into_iter().map(|bit| flip_bit(original, 0, bit)).find(|flipped| {
        let mut decoder = Decoder::with_ip(64, flipped, ip, DecoderOptions::NONE);
        let instr = decoder.decode();
        instr.code() != Code::INVALID && instr.len() == flipped.len()
    })
}
