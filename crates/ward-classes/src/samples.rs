//! Scans over a block's samples that every block pays for: where a port's trailing zeros start (they are not sent),
//! and whether an output holds a NaN or an infinity (the policy's `check_output`).
//!
//! Both look at whole chunks first, folded into one word with no early exit inside a chunk, over slices of whole
//! words, so that the compiler makes vector code of them (checked in the disassembly: the earlier shapes, lanes
//! of four and samples rebuilt from bytes, came out as one scalar load per sample). A block of silence is scanned
//! whole on every call, and a sample at a time that costs more than the round trip into a domain.

/// Samples a chunk holds.
const CHUNK: usize = 32;

/// The exponent bits of an IEEE-754 single: all ones for an infinity or a NaN.
const EXPONENT: u32 = 0x7f80_0000;

/// The sign bit, and what carries into it.
const TOP: u32 = 0x8000_0000;
const EXPONENT_LOW: u32 = 0x0080_0000;

/// The length of `s` without its trailing samples whose bits are all zero (`+0.0`; `-0.0` is not trailing zero).
pub(crate) fn without_trailing_zeros(s: &[f32]) -> usize {
    let whole = s.len() / CHUNK * CHUNK;
    let (chunked, tail) = s.split_at(whole);
    let last_set = |part: &[f32]| part.iter().rposition(|v| v.to_bits() != 0);
    if let Some(last) = last_set(tail) {
        return whole + last + 1;
    }
    let any_set = |chunk: &[f32]| chunk.iter().fold(0u32, |acc, v| acc | v.to_bits()) != 0;
    match chunked.chunks_exact(CHUNK).rposition(any_set) {
        None => 0,
        Some(k) => k * CHUNK + last_set(&chunked[k * CHUNK..(k + 1) * CHUNK]).map_or(0, |last| last + 1),
    }
}

/// The sign bit set where `bits` is a NaN or an infinity: an exponent of all ones carries into it, any other does
/// not. Plain adds and masks, which vector code has without SSE4.1's compare-and-max.
fn non_finite_top(bits: u32) -> u32 {
    (bits & EXPONENT).wrapping_add(EXPONENT_LOW)
}

/// Whether the sample with these bits is a NaN or an infinity.
fn is_non_finite(bits: u32) -> bool {
    non_finite_top(bits) & TOP != 0
}

fn first_non_finite_word(words: &[u32]) -> Option<usize> {
    let mut chunks = words.chunks_exact(CHUNK);
    for (k, chunk) in chunks.by_ref().enumerate() {
        if chunk.iter().fold(0u32, |acc, w| acc | non_finite_top(*w)) & TOP != 0 {
            return chunk.iter().position(|w| is_non_finite(*w)).map(|i| k * CHUNK + i);
        }
    }
    let done = words.len() / CHUNK * CHUNK;
    chunks.remainder().iter().position(|w| is_non_finite(*w)).map(|i| done + i)
}

/// The index of the first sample in `bytes` (native-endian `f32`s, in any alignment) that is a NaN or an infinity.
pub(crate) fn first_non_finite(bytes: &[u8]) -> Option<usize> {
    let whole = &bytes[..bytes.len() / 4 * 4];
    match bytemuck::try_cast_slice::<u8, u32>(whole) {
        Ok(words) => first_non_finite_word(words),
        // Out of a word's alignment (packing buffers hold samples at multiples of four from an allocation's
        // start, so only odd layouts come here): a sample at a time.
        Err(_) => whole.chunks_exact(4).position(|c| is_non_finite(u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &[f32]) -> Vec<u8> {
        s.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    #[test]
    fn trailing_zeros_are_found_at_every_position_and_length() {
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 512, 515] {
            assert_eq!(without_trailing_zeros(&vec![0.0; len]), 0, "silence of {len}");
            for last in 0..len {
                let mut s = vec![0.0f32; len];
                s[last] = 0.25;
                if last > 0 {
                    s[0] = 1.0;
                }
                assert_eq!(without_trailing_zeros(&s), last + 1, "len {len}, last non-zero at {last}");
            }
        }
    }

    #[test]
    fn negative_zero_is_not_a_trailing_zero() {
        let mut s = vec![0.0f32; 40];
        s[37] = -0.0;
        assert_eq!(without_trailing_zeros(&s), 38);
    }

    #[test]
    fn the_first_nan_or_infinity_is_found_at_every_position_and_length() {
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 512, 515] {
            assert_eq!(first_non_finite(&bytes(&vec![0.5; len])), None, "finite, {len}");
            for at in 0..len {
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut s = vec![0.5f32; len];
                    s[at] = bad;
                    if at + 1 < len {
                        s[len - 1] = f32::NAN;
                    }
                    assert_eq!(first_non_finite(&bytes(&s)), Some(at), "len {len}, {bad} at {at}");
                }
            }
        }
    }

    #[test]
    fn large_finite_values_and_subnormals_are_finite() {
        let s = [f32::MAX, f32::MIN, f32::MIN_POSITIVE / 2.0, -0.0, 1e-40];
        assert_eq!(first_non_finite(&bytes(&s)), None);
    }

    #[test]
    fn bytes_out_of_alignment_are_read_as_samples() {
        for at in [0, 2, 31, 32, 33, 70] {
            let mut s = vec![1.0f32; 71];
            s[at] = f32::NAN;
            s[70] = f32::INFINITY;
            let mut b = vec![0u8];
            b.extend(bytes(&s));
            assert_eq!(first_non_finite(&b[1..]), Some(at), "NaN at {at}, one byte out of alignment");
        }
    }

    #[test]
    fn aligned_samples_take_the_word_path() {
        let mut words = vec![1.0f32.to_bits(); 100];
        words[64] = f32::NEG_INFINITY.to_bits();
        let b: &[u8] = bytemuck::cast_slice(&words);
        assert!(bytemuck::try_cast_slice::<u8, u32>(b).is_ok());
        assert_eq!(first_non_finite(b), Some(64));
        assert_eq!(first_non_finite(&b[..64 * 4]), None);
    }
}
