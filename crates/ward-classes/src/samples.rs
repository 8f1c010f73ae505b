//! Scans over a block's samples that every block pays for: where a port's trailing zeros start (they are not sent),
//! and whether an output holds a NaN or an infinity (the policy's `check_output`).
//!
//! Both look at whole chunks first, with no early exit inside a chunk, so that the compiler turns them into vector
//! code: a block of silence is scanned whole on every call, and a sample at a time that costs more than the round
//! trip into a domain.

/// Samples a chunk holds.
const CHUNK: usize = 16;

/// The exponent bits of an IEEE-754 single: all ones for an infinity or a NaN.
const EXPONENT: u32 = 0x7f80_0000;

/// The bits of every sample of a chunk, or'ed: four lanes of four, the shape the compiler makes vector code of.
fn any_bits(chunk: &[f32]) -> u32 {
    let mut lanes = [0u32; 4];
    for quad in chunk.chunks_exact(4) {
        for (lane, v) in lanes.iter_mut().zip(quad) {
            *lane |= v.to_bits();
        }
    }
    lanes[0] | lanes[1] | lanes[2] | lanes[3]
}

/// Whether any sample of a chunk (as bytes) is a NaN or an infinity, in the same shape as [`any_bits`].
fn any_non_finite(chunk: &[u8]) -> bool {
    let mut lanes = [0u32; 4];
    for quad in chunk.chunks_exact(16) {
        for (lane, c) in lanes.iter_mut().zip(quad.chunks_exact(4)) {
            *lane |= u32::from(is_non_finite(c));
        }
    }
    lanes[0] | lanes[1] | lanes[2] | lanes[3] != 0
}

/// The length of `s` without its trailing samples whose bits are all zero (`+0.0`; `-0.0` is not trailing zero).
pub(crate) fn without_trailing_zeros(s: &[f32]) -> usize {
    let mut end = s.len();
    while !end.is_multiple_of(CHUNK) {
        if s[end - 1].to_bits() != 0 {
            return end;
        }
        end -= 1;
    }
    while end > 0 {
        let chunk = &s[end - CHUNK..end];
        if any_bits(chunk) != 0 {
            return end - CHUNK + chunk.iter().rposition(|v| v.to_bits() != 0).map_or(0, |last| last + 1);
        }
        end -= CHUNK;
    }
    0
}

fn is_non_finite(c: &[u8]) -> bool {
    u32::from_ne_bytes([c[0], c[1], c[2], c[3]]) & EXPONENT == EXPONENT
}

/// The index of the first sample in `bytes` (native-endian `f32`s, in any alignment) that is a NaN or an infinity.
pub(crate) fn first_non_finite(bytes: &[u8]) -> Option<usize> {
    let mut chunks = bytes.chunks_exact(CHUNK * 4);
    for (k, chunk) in chunks.by_ref().enumerate() {
        if any_non_finite(chunk) {
            return chunk.chunks_exact(4).position(is_non_finite).map(|i| k * CHUNK + i);
        }
    }
    let done = bytes.len() / (CHUNK * 4) * CHUNK;
    chunks.remainder().chunks_exact(4).position(is_non_finite).map(|i| done + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &[f32]) -> Vec<u8> {
        s.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }

    #[test]
    fn trailing_zeros_are_found_at_every_position_and_length() {
        for len in [0, 1, 15, 16, 17, 31, 32, 33, 512, 515] {
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
        for len in [0, 1, 15, 16, 17, 33, 512, 515] {
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
        let mut b = vec![0u8];
        b.extend(bytes(&[1.0, 2.0, f32::NAN]));
        assert_eq!(first_non_finite(&b[1..]), Some(2));
    }
}
