//! The workload of a frei0r plugin: read what it says about itself, construct an instance for [`WIDTH`] x
//! [`HEIGHT`] frames with its parameters at their defaults (none is set), and send [`FRAMES`] frames of a fixed
//! test image through it (a filter gets one input frame, a mixer two or three, a source none). The output: the
//! plugin's info and each output frame (the digest of its bytes and the mean of each byte of a pixel), so native
//! and ward runs compare byte for byte.
//!
//! Natively the host calls the plugin's entry points (`native_plugins`); under ward, through the frei0r class wrapper,
//! which opens the plugin in the domain with the class adapter. A frame the wrapper bypasses (the plugin failed
//! even after recovery, or is disabled) is noted as such: the host was told, and its output is the class's fallback
//! (a copy of the first input frame), recorded as usual.

use std::path::Path;
use std::time::Duration;

use ward::{Extension, Isolation, Policy, Supervisor};
use ward_classes::frei0r::{Instance, Library, PluginInfo, PluginType};
use ward_classes::Processed;

use super::native_plugins::{self, Frei0rInstance, Words};
use super::{class_policy, digest, Recorder, Symbols, Workload, WorkloadError};
use crate::plan::mix;

pub struct Frei0r;

const WIDTH: u32 = 64;
const HEIGHT: u32 = 48;
const PIXELS: usize = (WIDTH * HEIGHT) as usize;
/// Frames sent through the instance.
const FRAMES: usize = 4;
/// The frames' rate: frame `k` is at `k / RATE` seconds.
const RATE: f64 = 25.0;

impl Workload for Frei0r {
    fn name(&self) -> &'static str {
        "frei0r"
    }

    fn builtin(&self) -> Option<&'static str> {
        None
    }

    fn describe(&self) -> &'static str {
        "the plugin's info read, an instance for 64x48 frames constructed with default parameters, 4 frames of a \
         fixed test image (gradients, a moving square, noise) sent through it; every output frame compared"
    }

    fn policy(&self, deadline: Option<Duration>) -> Policy {
        class_policy(deadline)
    }

    fn run_native(&self, symbols: &dyn Symbols, out: &mut Recorder) {
        let lib = native_plugins::frei0r(symbols);
        let lib = lib.and_then(|lib| if lib.init() { Ok(lib) } else { Err(WorkloadError::InitFailed) });
        let (lib, info) = match lib {
            Ok(lib) => {
                let info = lib.info();
                out.call("info", || Ok::<&PluginInfo, WorkloadError>(&info), |i| describe(i));
                (lib, info)
            }
            Err(e) => {
                out.call("info", || Err::<(), WorkloadError>(e), |_| String::new());
                return;
            }
        };
        let instance = out.call(construct_call(), || lib.construct(WIDTH, HEIGHT), |_| "instance".into());
        let Some(mut instance) = instance else {
            skip_frames(out, "no instance");
            return;
        };
        let mut output = Words::new(PIXELS);
        for frame in 0..FRAMES {
            let call = || {
                native_frame(&info, &mut instance, frame, &mut output)?;
                Ok::<String, WorkloadError>(frame_text(&words_bytes(output.words())))
            };
            out.call(frame_call(frame), call, String::clone);
        }
        drop::<Frei0rInstance<'_>>(instance);
    }

    fn run_ward(
        &self,
        sup: &Supervisor,
        path: &Path,
        isolation: Isolation,
        out: &mut Recorder,
    ) -> Result<Extension, WorkloadError> {
        let lib = Library::open(sup, path, Some(isolation))?;
        let info = lib.info().clone();
        out.call("info", || Ok::<&PluginInfo, WorkloadError>(&info), |i| describe(i));
        let instance = out.call(construct_call(), || lib.construct(WIDTH, HEIGHT), |_| "instance".into());
        let Some(mut instance) = instance else {
            skip_frames(out, "no instance");
            return Ok(lib.extension().clone());
        };
        let mut output = vec![0u8; PIXELS * 4];
        for frame in 0..FRAMES {
            let mut bypassed = None;
            let call = || {
                match ward_frame(&info, &mut instance, frame, &mut output)? {
                    Processed::Ran => {}
                    Processed::Bypassed { reason } => bypassed = Some(reason),
                }
                Ok::<String, WorkloadError>(frame_text(&output))
            };
            out.call(frame_call(frame), call, String::clone);
            if let Some(reason) = bypassed {
                out.bypassed(reason);
            }
        }
        drop::<Instance>(instance);
        Ok(lib.extension().clone())
    }
}

fn construct_call() -> String {
    format!("construct {WIDTH}x{HEIGHT}")
}

fn frame_call(frame: usize) -> String {
    format!("frame {} of {FRAMES} (t = {:.2} s)", frame + 1, frame as f64 / RATE)
}

fn skip_frames(out: &mut Recorder, why: &str) {
    for frame in 0..FRAMES {
        out.skip(frame_call(frame), why);
    }
}

/// What the plugin says about itself, as text.
fn describe(i: &PluginInfo) -> String {
    let params: Vec<String> = i.params.iter().map(|p| format!("{:?} {:?}", p.name, p.kind)).collect();
    format!(
        "{:?} by {:?}: {:?}, {:?}, frei0r {}, version {}.{}, {} parameters: {}",
        i.name,
        i.author,
        i.plugin_type,
        i.color_model,
        i.frei0r_version,
        i.major_version,
        i.minor_version,
        i.params.len(),
        params.join(", ")
    )
}

/// How many input frames the plugin's type takes; an error for a type frei0r does not define.
fn input_frames(info: &PluginInfo) -> Result<usize, WorkloadError> {
    info.plugin_type.input_frames().ok_or(WorkloadError::UndefinedPluginType { plugin_type: info.plugin_type })
}

/// Input frame `input` (0 to 2) of frame `frame`, as pixels: gradients that move from frame to frame, a bright
/// square crossing the picture, a little noise, and alpha varying across it.
fn image(frame: usize, input: usize) -> Vec<u32> {
    let (w, h) = (WIDTH as usize, HEIGHT as usize);
    let side = h / 4;
    let (sx, sy) = ((frame * 7 + input * 13) % (w - side), (frame * 5 + input * 3) % (h - side));
    (0..h)
        .flat_map(|y| (0..w).map(move |x| (x, y)))
        .map(|(x, y)| {
            let n = mix(((frame * h + y) * w + x) as u64 ^ ((input as u64) << 48));
            let grain = (n & 0x0f) as usize;
            let inside = (sx..sx + side).contains(&x) && (sy..sy + side).contains(&y);
            let r = if inside { 250 } else { (x * 4 + frame * 8 + input * 50 + grain) & 0xff };
            let g = if inside { 240 } else { (y * 5 + frame * 3 + grain) & 0xff };
            let b = ((x ^ y) * 3 + frame * 16 + input * 90 + grain) & 0xff;
            let a = 200 + (x * y + frame) % 56;
            u32::from_ne_bytes([r as u8, g as u8, b as u8, a as u8])
        })
        .collect()
}

fn words_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// An output frame as text: the digest of its bytes and the mean of each of a pixel's four bytes.
fn frame_text(bytes: &[u8]) -> String {
    let mut sums = [0u64; 4];
    for px in bytes.chunks_exact(4) {
        for (s, &b) in sums.iter_mut().zip(px) {
            *s += u64::from(b);
        }
    }
    let n = (bytes.len() / 4).max(1) as f64;
    let means: Vec<String> = sums.iter().map(|&s| format!("{:.3}", s as f64 / n)).collect();
    format!("{:016x}, byte means {}", digest(bytes), means.join(" "))
}

fn native_frame(
    info: &PluginInfo,
    instance: &mut Frei0rInstance<'_>,
    frame: usize,
    output: &mut Words,
) -> Result<(), WorkloadError> {
    let count = input_frames(info)?;
    let time = frame as f64 / RATE;
    let frames: Vec<Words> = (0..count)
        .map(|k| {
            let mut w = Words::new(PIXELS);
            w.words_mut().copy_from_slice(&image(frame, k));
            w
        })
        .collect();
    let updated = match info.plugin_type {
        PluginType::Source | PluginType::Filter => instance.update(time, frames.first(), output),
        _ => instance.update2(time, [frames.first(), frames.get(1), frames.get(2)], output),
    };
    Ok(updated?)
}

fn ward_frame(
    info: &PluginInfo,
    instance: &mut Instance,
    frame: usize,
    output: &mut [u8],
) -> Result<Processed, WorkloadError> {
    let count = input_frames(info)?;
    let time = frame as f64 / RATE;
    let frames: Vec<Vec<u8>> = (0..count).map(|k| words_bytes(&image(frame, k))).collect();
    let input = |k: usize| frames.get(k).map(Vec::as_slice);
    let processed = match info.plugin_type {
        PluginType::Source | PluginType::Filter => instance.update_bytes(time, input(0).unwrap_or(&[]), output),
        _ => instance.update2_bytes(time, input(0), input(1), input(2), output),
    };
    Ok(processed?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_image_is_fixed_and_moves() {
        let a = image(0, 0);
        assert_eq!(a.len(), PIXELS);
        assert_eq!(a, image(0, 0));
        assert_ne!(a, image(1, 0));
        assert_ne!(a, image(0, 1));
    }

    #[test]
    fn a_frame_reads_as_digest_and_means() {
        let text = frame_text(&[0, 10, 20, 255, 2, 10, 20, 255]);
        assert!(text.ends_with(", byte means 1.000 10.000 20.000 255.000"), "{text}");
        assert_eq!(text.len(), 16 + ", byte means 1.000 10.000 20.000 255.000".len());
    }
}
