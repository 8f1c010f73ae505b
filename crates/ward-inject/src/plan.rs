//! Choosing where the faults go, deterministically from the seed.
//!
//! Each fault first picks a function, with probability proportional to its size in bytes, among the functions that
//! still have an untried site for the fault type; then one of those sites uniformly. Weighting by size gives every
//! byte of code about the same chance to hold a fault, as in Nooks' injector, which worked on a module's whole
//! text; picking the function first keeps a one-instruction helper from being as likely as a 2 KiB routine while
//! still naming a function for every fault. A site whose mutation does not fit (see `mutate`) is dropped and the
//! draw repeated, so a plan fails only when no site at all takes the fault.

use std::ops::Range;

use crate::decode::Listing;
use crate::fault_type::FaultType;
use crate::mutate;
use crate::rng::Rng;

pub(crate) struct Chosen {
    /// Index into the listings.
    pub listing: usize,
    /// Index into that listing's instructions.
    pub instr: usize,
    /// The replacement, exactly as long as the instruction.
    pub bytes: Vec<u8>,
}

/// Up to `count` faults of type `fault` in `listings`, each on a different instruction; fewer when the code has
/// fewer sites that take one.
pub(crate) fn choose(fault: FaultType, count: usize, listings: &[Listing<'_>], rng: &mut Rng) -> Vec<Chosen> {
    let mut untried: Vec<Vec<usize>> = listings.iter().map(|l| mutate::sites(fault, l)).collect();
    // File ranges already mutated. Listings come from distinct symbols, which could still overlap (nested or
    // partly aliased symbols), so distinct faults are kept apart by bytes, not by instruction index.
    let mut taken: Vec<Range<u64>> = Vec::new();
    let mut chosen = Vec::new();
    while chosen.len() < count {
        let Some(li) = pick_function(listings, &untried, rng) else { break };
        let sites = &mut untried[li];
        let instr = sites.swap_remove(rng.below(sites.len()));
        let listing = &listings[li];
        let start = listing.file_offset(instr);
        let range = start..start + listing.instrs[instr].len() as u64;
        if taken.iter().any(|t| t.start < range.end && range.start < t.end) {
            continue;
        }
        if let Some(bytes) = mutate::apply(fault, listing, instr, rng) {
            taken.push(range);
            chosen.push(Chosen { listing: li, instr, bytes });
        }
    }
    chosen
}

/// A listing with untried sites, weighted by its function's size; `None` when every site has been tried.
fn pick_function(listings: &[Listing<'_>], untried: &[Vec<usize>], rng: &mut Rng) -> Option<usize> {
    let weight = |i: usize| if untried[i].is_empty() { 0 } else { listings[i].function.size as usize };
    let total: usize = (0..listings.len()).map(weight).sum();
    if total == 0 {
        return None;
    }
    let mut ticket = rng.below(total);
    for i in 0..listings.len() {
        let w = weight(i);
        if ticket < w {
            return Some(i);
        }
        ticket -= w;
    }
    None
}
