//! Deterministic mixing written once for the whole workspace: the SplitMix64 generator (seeded test data, fault
//! plans, trial seeds) and 64-bit FNV-1a (digests and fingerprints of bytes). Both are for reproducibility and
//! equality checks, not a defence against anyone: neither is a cryptographic function.
//!
//! It lives in ward-xpc because ward-xpc is the lowest crate of the workspace with no build script; nothing in it
//! is about transport.

/// SplitMix64's increment: the golden ratio in 64 bits (an odd number, so the Weyl sequence has a full period).
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64 (Steele, Lea and Flood): a Weyl sequence through a 64-bit finaliser. Its whole state is one word, so a
/// stream is named by its seed; every seed, 0 included, gives a full-period, well-mixed stream.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The first number of the SplitMix64 stream seeded with `z`: neighbouring inputs give unrelated outputs, so it
/// turns a counter or a combination of small numbers into a seed.
pub fn splitmix64(z: u64) -> u64 {
    SplitMix64::new(z).next_u64()
}

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// 64-bit FNV-1a over bytes fed in any number of pieces: the same bytes give the same hash however they are split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Fnv1a {
        Fnv1a::new()
    }
}

impl Fnv1a {
    pub const fn new() -> Fnv1a {
        Fnv1a(FNV_OFFSET_BASIS)
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
    }

    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = Fnv1a::new();
    hash.write(bytes);
    hash.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_gives_the_reference_stream() {
        // The first outputs for seed 0 of the reference implementation (Vigna's splitmix64.c).
        let mut g = SplitMix64::new(0);
        assert_eq!(g.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(g.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(g.next_u64(), 0x06c4_5d18_8009_454f);
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn fnv1a_gives_the_reference_hashes_however_the_bytes_are_split() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        let mut pieces = Fnv1a::default();
        pieces.write(b"foo");
        pieces.write(b"");
        pieces.write(b"bar");
        assert_eq!(pieces.finish(), fnv1a(b"foobar"));
    }
}
