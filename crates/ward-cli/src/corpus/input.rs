//! The corpus's fixed test input and the digest of a plugin's output, shared by the native runner and the runner
//! under ward so that both feed a plugin exactly the same bytes and hash its output the same way.

use ward_classes::ladspa::{Port, HINT_BOUNDED_ABOVE, HINT_BOUNDED_BELOW, HINT_SAMPLE_RATE};
use ward_xpc::mix::Fnv1a;

/// LADSPA: the sample rate every plugin is instantiated at.
pub const SAMPLE_RATE: u64 = 48_000;
/// LADSPA: the blocks run, in order (the second deliberately not a power of two).
pub const BLOCKS: [usize; 2] = [1024, 333];
/// LADSPA: the largest block, the length of every audio port buffer.
pub const MAX_BLOCK: usize = 1024;

/// frei0r: the frame size (both multiples of 16, which some plugins need).
pub const WIDTH: u32 = 128;
pub const HEIGHT: u32 = 96;
/// frei0r: the time of each frame updated, in seconds.
pub const TIMES: [f64; 3] = [0.0, 0.04, 0.08];

/// A small linear congruential generator (Numerical Recipes' constants): deterministic noise.
struct Lcg(u32);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        self.0
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        f64::from(self.next() >> 8) / f64::from(1u32 << 23) - 1.0
    }
}

/// The value an input control port is set to: its default when it has one, else its lower bound when bounded
/// below, else its upper bound when bounded above, else 0; then clamped into its bounds.
pub fn control_input(port: &Port) -> f32 {
    let scale = if port.hint & HINT_SAMPLE_RATE != 0 { SAMPLE_RATE as f32 } else { 1.0 };
    let (lo, hi) = (port.lower * scale, port.upper * scale);
    let below = port.hint & HINT_BOUNDED_BELOW != 0;
    let above = port.hint & HINT_BOUNDED_ABOVE != 0;
    let mut value = port.default_value(SAMPLE_RATE).unwrap_or(if below {
        lo
    } else if above {
        hi
    } else {
        0.0
    });
    // Not f32::clamp: a port may claim a lower bound above its upper one (the lower bound then wins).
    if above && value > hi {
        value = hi;
    }
    if below && value < lo {
        value = lo;
    }
    value
}

/// The whole signal (both blocks) connected to the `k`-th audio input: two sines whose frequencies depend on `k`,
/// plus a little noise.
pub fn audio_input(k: usize) -> Vec<f32> {
    let total: usize = BLOCKS.iter().sum();
    let f1 = 110.0 * (k as f64 + 1.0) + 3.7;
    let f2 = 1_000.0 + 577.0 * k as f64;
    let mut noise = Lcg(0x5eed_0000 ^ k as u32);
    let rate = SAMPLE_RATE as f64;
    (0..total)
        .map(|n| {
            let t = n as f64 / rate;
            let s = 0.45 * (std::f64::consts::TAU * f1 * t).sin()
                + 0.25 * (std::f64::consts::TAU * f2 * t + 0.3).sin()
                + 0.05 * noise.unit();
            s as f32
        })
        .collect()
}

/// The `input`-th test image (0 for a filter's input; 0, 1, 2 for a mixer's) of frame `frame`: gradients that
/// differ per input and move per frame, plus noise, alpha 255. Bytes in memory R, G, B, A.
pub fn image(input: usize, frame: usize) -> Vec<u32> {
    let (w, h) = (WIDTH as usize, HEIGHT as usize);
    let mut noise = Lcg(0x0001_a9e5_u32.wrapping_add((input * 131 + frame * 7) as u32));
    let mut pixels = Vec::with_capacity(w * h);
    for y in 0..h {
        for x in 0..w {
            let n = noise.next() >> 27; // 0..31
            let r = (x * 2 + frame * 9 + input * 70) as u32 & 0xff;
            let g = (y * 2 + frame * 5 + input * 40) as u32 & 0xff;
            let b = ((x + y) as u32 + n + (input as u32) * 90) & 0xff;
            pixels.push(r | g << 8 | b << 16 | 0xff << 24);
        }
    }
    pixels
}

/// 64-bit FNV-1a over the output bytes, and how many there were.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digest {
    hash: Fnv1a,
    pub bytes: u64,
}

impl Digest {
    pub fn bytes(&mut self, data: &[u8]) {
        self.hash.write(data);
        self.bytes += data.len() as u64;
    }

    pub fn hash(&self) -> u64 {
        self.hash.finish()
    }

    pub fn f32s(&mut self, data: &[f32]) {
        data.iter().for_each(|v| self.bytes(&v.to_le_bytes()));
    }

    pub fn u32s(&mut self, data: &[u32]) {
        data.iter().for_each(|v| self.bytes(&v.to_le_bytes()));
    }

    pub fn hex(&self) -> String {
        format!("{:016x}", self.hash())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(hint: i32, lower: f32, upper: f32) -> Port {
        Port { descriptor: 0x5, name: String::new(), hint, lower, upper }
    }

    #[test]
    fn control_values_follow_default_then_bounds() {
        // DEFAULT_1 within [0, 10].
        assert_eq!(control_input(&port(0x3 | 0x240, 0.0, 10.0)), 1.0);
        // No default: lower bound, else upper bound, else 0.
        assert_eq!(control_input(&port(0x3, 2.0, 10.0)), 2.0);
        assert_eq!(control_input(&port(0x2, 2.0, 10.0)), 10.0);
        assert_eq!(control_input(&port(0, 2.0, 10.0)), 0.0);
        // DEFAULT_440 clamped into [1, 100]; DEFAULT_0 clamped up to a lower bound of 5.
        assert_eq!(control_input(&port(0x3 | 0x2C0, 1.0, 100.0)), 100.0);
        assert_eq!(control_input(&port(0x1 | 0x200, 5.0, 0.0)), 5.0);
        // Bounds scaled by the sample rate.
        assert_eq!(control_input(&port(0x1 | 0x8, 0.25, 0.5)), 12_000.0);
    }

    #[test]
    fn inputs_are_deterministic_and_distinct() {
        assert_eq!(audio_input(0), audio_input(0));
        assert_ne!(audio_input(0), audio_input(1));
        assert_eq!(audio_input(0).len(), 1357);
        assert!(audio_input(3).iter().all(|s| s.abs() < 1.0));
        assert_eq!(image(1, 2), image(1, 2));
        assert_ne!(image(0, 0), image(1, 0));
        assert_ne!(image(0, 0), image(0, 1));
        assert!(image(2, 1).iter().all(|p| p >> 24 == 0xff));
    }

    #[test]
    fn digest_is_fnv1a() {
        let mut d = Digest::default();
        d.bytes(b"a");
        assert_eq!(d.hash(), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(d.bytes, 1);
    }
}
