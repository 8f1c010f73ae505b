//! The corpus's native runners: a plugin loaded with dlopen straight into this (throwaway) process and driven
//! through its C interface, with no ward at all, the way an ordinary host would. The calls into the plugin are
//! `ward_classes::native_calls`'s; what is the corpus's own is here: the memory the plugin finds (perturbed or not), the
//! margins around its buffers, and the checks on what it does. Every unsafe block of the corpus is here.

use std::path::Path;

use ward_classes::ladspa::{Port, PORT_AUDIO, PORT_CONTROL, PORT_INPUT, PORT_OUTPUT};
use ward_classes::native_calls::ladspa::Entry;
use ward_classes::native_calls::{frei0r, ladspa, Words};

use super::input::{self, Digest, BLOCKS, HEIGHT, MAX_BLOCK, SAMPLE_RATE, TIMES, WIDTH};
use super::Listed;
use crate::hosts::native_host::NativeLib;

/// Values of margin on each side of a LADSPA port buffer, and rows on each side of a frei0r frame.
const PORT_MARGIN: usize = 64;
const FRAME_MARGIN_ROWS: usize = 4;

/// Lower this process's core-size limit to zero: a plugin that crashes natively should not leave a core file.
pub fn no_core_files() {
    let rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `rl` is a valid rlimit; lowering our own limit needs no privilege. Failure only means core files.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &rl) };
}

/// How the native run treats memory the plugin did not initialise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// As the process leaves it (deterministic in a fresh process).
    AsIs,
    /// Fresh heap memory filled with one pattern and freed memory with another (glibc's `M_PERTURB`), and the
    /// stack the plugin is about to use scribbled over before every call into it, and the margins around input
    /// buffers filled with a pattern: output that depends on uninitialised memory, or on memory just outside the
    /// inputs, comes out different from an [`Memory::AsIs`] run.
    Perturbed,
}

/// The byte glibc fills allocations with (the complement when they are freed) in a perturbed run.
const PERTURB_BYTE: i32 = 0xA5;
/// Bytes of stack scribbled over before each call into the plugin in a perturbed run.
const SCRIBBLE_BYTES: usize = 128 * 1024;

impl Memory {
    /// What the margins around input buffers hold: reading past a buffer then gives different output in an
    /// [`Memory::AsIs`] and a [`Memory::Perturbed`] run.
    fn margin_bits(self) -> u32 {
        match self {
            Memory::AsIs => 0,
            Memory::Perturbed => 0xA5A5_A5A5,
        }
    }

    fn start(self) {
        if self == Memory::Perturbed {
            // SAFETY: mallopt only changes glibc's allocator settings; no allocation is in flight (one thread).
            // Large blocks come from the heap too (mmap'd ones are always zero, and perturbing skips them).
            unsafe {
                libc::mallopt(libc::M_PERTURB, PERTURB_BYTE);
                libc::mallopt(libc::M_MMAP_MAX, 0);
            }
        }
    }

    /// Before a call into the plugin: fill the stack below this frame, where the plugin's frames will be.
    #[inline(never)]
    fn before_call(self) {
        if self == Memory::Perturbed {
            let mut junk = [0x5Au8; SCRIBBLE_BYTES];
            std::hint::black_box(&mut junk);
        }
    }
}

fn open(path: &Path) -> Result<NativeLib, String> {
    NativeLib::open(path).map_err(|e| format!("{e:#}"))
}

/// What the margins around output buffers hold before each call, to see whether the plugin writes outside them.
const CANARY: u32 = 0x5EED_CAFE;

// Buffers between margins (`Words::padded`): the plugin gets the middle. Margins around inputs are filled per
// [`Memory`]; margins around outputs hold [`CANARY`] and are checked.

/// Fill everything from `used` values into the middle to the end, and the margin before, with `bits`.
fn fill_outside(buf: &mut Words, used: usize, bits: u32) {
    let from = buf.margin() + used.min(buf.words().len());
    let margin = buf.margin();
    let all = buf.all_mut();
    all[..margin].fill(bits);
    all[from..].fill(bits);
}

/// Whether everything outside the first `used` values still holds `bits`.
fn outside_holds(buf: &Words, used: usize, bits: u32) -> bool {
    let (all, margin) = (buf.all(), buf.margin());
    let from = margin + used.min(buf.words().len());
    all[..margin].iter().chain(&all[from..]).all(|&v| v == bits)
}

fn as_f32(bits: &[u32]) -> Vec<f32> {
    bits.iter().map(|&b| f32::from_bits(b)).collect()
}

fn ladspa_library(lib: &NativeLib) -> Result<ladspa::Library, String> {
    let sym = lib.symbol("ladspa_descriptor").map_err(|e| format!("no LADSPA library: {e:#}"))?;
    // SAFETY: `sym` is the library's `ladspa_descriptor` (non-null: `symbol` refuses NULL), and the library is
    // never unloaded in this process.
    unsafe { ladspa::Library::from_entry(sym) }.map_err(|e| e.to_string())
}

/// Every plugin of a LADSPA library, as `ladspa_descriptor` lists them.
pub fn ladspa_list(path: &Path) -> Result<Vec<Listed>, String> {
    let lib = ladspa_library(&open(path)?)?;
    let mut found = Vec::new();
    while found.len() < ladspa::MAX_DESCRIPTORS {
        let Some(d) = lib.plugin(found.len()) else { break };
        found.push(Listed { index: found.len(), label: d.label(), name: d.name() });
    }
    if found.is_empty() {
        return Err("ladspa_descriptor(0) returned NULL: the library has no plugins".into());
    }
    Ok(found)
}

/// The ports of a descriptor, in the class's representation (so that both runners compute control values alike).
fn ladspa_ports(d: &ladspa::Plugin<'_>) -> Result<Vec<Port>, String> {
    let count = d.port_count();
    if count > 0 && !d.has_port_arrays() {
        return Err("the descriptor has ports but no port descriptors or range hints".into());
    }
    let mut ports = Vec::with_capacity(count);
    for p in 0..count {
        let (descriptor, (hint, lower, upper)) = (d.port_flags(p), d.port_hint(p));
        let input = descriptor & PORT_INPUT != 0;
        let output = descriptor & PORT_OUTPUT != 0;
        let audio = descriptor & PORT_AUDIO != 0;
        let control = descriptor & PORT_CONTROL != 0;
        if input == output || audio == control {
            return Err(format!("port {p} has flags {descriptor:#x}: not one direction and kind"));
        }
        ports.push(Port { descriptor, name: String::new(), hint, lower, upper });
    }
    Ok(ports)
}

/// Run plugin `index` of a LADSPA library on the corpus's input: instantiate at 48 kHz, set the input controls,
/// connect every port, activate, run the blocks, deactivate, clean up. The digest covers every output port of
/// every block, ports in order.
pub fn ladspa_run(path: &Path, index: usize, memory: Memory) -> Result<Digest, String> {
    memory.start();
    let lib = ladspa_library(&open(path)?)?;
    let d = lib.plugin(index).ok_or_else(|| format!("the library has no plugin #{index}"))?;
    let ports = ladspa_ports(&d)?;
    if !(d.has(Entry::Instantiate) && d.has(Entry::ConnectPort) && d.has(Entry::Run)) {
        return Err("the plugin lacks instantiate, connect_port or run".into());
    }

    // One buffer per port, kept for the whole run: audio ports hold the largest block, control ports one value,
    // each between margins (floats as bits).
    let mut buffers: Vec<Words> =
        ports.iter().map(|p| Words::padded(p.values_in_block(MAX_BLOCK), PORT_MARGIN)).collect();
    let mut signals = Vec::new();
    for (port, buf) in ports.iter().zip(buffers.iter_mut()) {
        if port.is_input() && port.is_control() {
            buf.words_mut()[0] = input::control_input(port).to_bits();
            fill_outside(buf, 1, memory.margin_bits());
        }
        if port.is_input() && port.is_audio() {
            signals.push(input::audio_input(signals.len()));
        }
    }

    memory.before_call();
    // instantiate and connect_port are there (checked above), so the only failure is a NULL instance.
    let mut instance =
        d.instantiate(SAMPLE_RATE).map_err(|_| format!("instantiate at {SAMPLE_RATE} Hz returned NULL"))?;
    for (p, buf) in buffers.into_iter().enumerate() {
        instance.connect_port(p, buf).map_err(|e| e.to_string())?;
    }
    if d.has(Entry::Activate) {
        memory.before_call();
        instance.activate();
    }
    let mut digest = Digest::default();
    let mut at = 0;
    for samples in BLOCKS {
        let mut k = 0;
        for (p, port) in ports.iter().enumerate() {
            let buf = instance.buffer_mut(p).expect("every port is connected");
            let used = port.values_in_block(samples);
            if port.is_input() && port.is_audio() {
                let signal = &signals[k][at..at + samples];
                buf.words_mut()[..samples].iter_mut().zip(signal).for_each(|(d, s)| *d = s.to_bits());
                fill_outside(buf, samples, memory.margin_bits());
                k += 1;
            }
            if port.is_output() {
                fill_outside(buf, used, CANARY);
            }
        }
        memory.before_call();
        instance.run(samples).map_err(|e| e.to_string())?;
        for (p, port) in ports.iter().enumerate() {
            if port.is_output() {
                let buf = instance.buffer(p).expect("every port is connected");
                let used = port.values_in_block(samples);
                if !outside_holds(buf, used, CANARY) {
                    // Not called again: no deactivate nor cleanup after it wrote where it should not.
                    instance.abandon();
                    return Err(format!("it writes outside output port {p} in a block of {samples} samples"));
                }
                digest.f32s(&as_f32(&buf.words()[..used]));
            }
        }
        at += samples;
    }
    instance.deactivate();
    // Cleaned up, then its buffers freed.
    drop(instance);
    Ok(digest)
}

/// The frei0r library at `path`'s entry points; it must export `f0r_get_plugin_info` and `f0r_construct`.
fn frei0r_library(lib: &NativeLib) -> Result<frei0r::Library, String> {
    for required in ["f0r_get_plugin_info", "f0r_construct"] {
        lib.symbol(required).map_err(|e| format!("no frei0r library: {e:#}"))?;
    }
    // SAFETY: `symbol` finds the named symbols of the library, which is never unloaded in this process.
    unsafe { frei0r::Library::from_lookup(|name| lib.symbol(name).ok()) }.map_err(|e| e.to_string())
}

fn frei0r_init(f: &frei0r::Library) -> Result<(), String> {
    if f.init() {
        Ok(())
    } else {
        Err("f0r_init returned 0 (failure)".into())
    }
}

/// The one plugin of a frei0r library.
pub fn frei0r_list(path: &Path) -> Result<Vec<Listed>, String> {
    let lib = open(path)?;
    let f = frei0r_library(&lib)?;
    frei0r_init(&f)?;
    let (name, plugin_type) = f.name_and_type();
    f.deinit();
    Ok(vec![Listed { index: 0, label: name, name: type_name(plugin_type) }])
}

pub fn type_name(plugin_type: i32) -> String {
    match plugin_type {
        0 => "filter".into(),
        1 => "source".into(),
        2 => "mixer2".into(),
        3 => "mixer3".into(),
        t => format!("type {t}"),
    }
}

/// Run a frei0r library's plugin on the corpus's input: construct at 128x96 with default parameters, update three
/// frames (a filter gets one test image, a mixer two or three, a source none). The digest covers the output frames.
pub fn frei0r_run(path: &Path, memory: Memory) -> Result<Digest, String> {
    memory.start();
    let lib = open(path)?;
    let f = frei0r_library(&lib)?;
    frei0r_init(&f)?;
    let (_, plugin_type) = f.name_and_type();
    let inputs = match plugin_type {
        0 => 1,
        1 => 0,
        2 => 2,
        3 => 3,
        t => return Err(format!("unknown plugin type {t}")),
    };
    let (has_update, has_update2) = (f.exports("f0r_update"), f.exports("f0r_update2"));
    if inputs >= 2 && !has_update2 {
        return Err("a mixer without f0r_update2".into());
    }
    if !has_update && !has_update2 {
        return Err("neither f0r_update nor f0r_update2".into());
    }
    memory.before_call();
    let mut instance = f.construct(WIDTH, HEIGHT).map_err(|e| e.to_string())?;
    let pixels = (WIDTH * HEIGHT) as usize;
    let margin = FRAME_MARGIN_ROWS * WIDTH as usize;
    // One output frame for all updates, as hosts (and the class adapter) keep one; every frame between margins.
    let mut out = Words::padded(pixels, margin);
    let mut images: Vec<Words> = (0..inputs).map(|_| Words::padded(pixels, margin)).collect();
    let mut digest = Digest::default();
    for (frame, &time) in TIMES.iter().enumerate() {
        for (i, image) in images.iter_mut().enumerate() {
            image.words_mut().copy_from_slice(&input::image(i, frame));
            fill_outside(image, pixels, memory.margin_bits());
        }
        fill_outside(&mut out, pixels, CANARY);
        memory.before_call();
        // Every frame holds WIDTH x HEIGHT pixels; a source's input is NULL, as are a mixer's unused inputs.
        if inputs <= 1 && has_update {
            instance.update(time, images.first(), &mut out).map_err(|e| e.to_string())?;
        } else {
            instance
                .update2(time, [images.first(), images.get(1), images.get(2)], &mut out)
                .map_err(|e| e.to_string())?;
        }
        if !outside_holds(&out, pixels, CANARY) {
            // Not called again: no f0r_destruct nor f0r_deinit after it wrote where it should not.
            instance.abandon();
            return Err(format!("it writes outside its output frame (frame {frame})"));
        }
        digest.u32s(out.words());
    }
    drop(instance);
    f.deinit();
    Ok(digest)
}
