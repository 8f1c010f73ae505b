//! The workload of a LADSPA plugin library: every plugin of the library (up to [`MAX_PLUGINS`]) is instantiated at
//! 48 kHz, its control inputs set to their default values, activated, run on [`BLOCKS`] blocks of [`BLOCK`]
//! samples of a fixed test signal, deactivated and cleaned up. The output: how many plugins the library has, each
//! plugin's description, and after each block every output port (an audio port as the digest, RMS and peak of its
//! samples, a control port as its value), so native and ward runs compare sample for sample.
//!
//! Natively the host calls the plugin through its descriptor (`native_plugins`); under ward, through the LADSPA class
//! wrapper, which opens the library in the domain with the class adapter. A block the wrapper bypasses (the plugin
//! failed even after recovery, or is disabled) is noted as such: the host was told, and its output is the class's
//! fallback (the input passed through), recorded as usual.

use std::f64::consts::TAU;
use std::path::Path;
use std::time::Duration;

use ward::{Extension, Isolation, Policy, Supervisor};
use ward_classes::ladspa::{
    Descriptor, Instance, Library, Port, PortBuffer, HINT_BOUNDED_ABOVE, HINT_BOUNDED_BELOW, HINT_SAMPLE_RATE,
};
use ward_classes::Processed;

use super::native_plugins::{self, LadspaInstance, Words};
use super::{class_policy, digest, Recorder, Symbols, Workload, WorkloadError};
use crate::plan::mix;

pub struct Ladspa;

const SAMPLE_RATE: u64 = 48_000;
/// Samples of one block.
const BLOCK: usize = 1024;
/// Blocks each plugin runs.
const BLOCKS: usize = 4;
/// Plugins of one library the workload drives (swh libraries have at most a handful).
const MAX_PLUGINS: usize = 16;

impl Workload for Ladspa {
    fn name(&self) -> &'static str {
        "ladspa"
    }

    fn builtin(&self) -> Option<&'static str> {
        None
    }

    fn describe(&self) -> &'static str {
        "every plugin of the library instantiated at 48 kHz with default control values, activated, run on 4 \
         blocks of 1024 samples of a fixed test signal (tones, hiss and a click), deactivated; every output port \
         of every block compared"
    }

    fn policy(&self, deadline: Option<Duration>) -> Policy {
        class_policy(deadline)
    }

    fn run_native(&self, symbols: &dyn Symbols, out: &mut Recorder) {
        let lib = match native_plugins::ladspa(symbols) {
            Ok(lib) => lib,
            Err(e) => {
                out.call("plugins", || Err::<usize, WorkloadError>(e), |_| String::new());
                return;
            }
        };
        let count = out.call("plugins", || Ok::<usize, WorkloadError>(lib.count()), usize::to_string).unwrap_or(0);
        for index in 0..count.min(MAX_PLUGINS) {
            let plugin = lib.plugin(index);
            let described = out.call(
                format!("plugin {index}: describe"),
                || Ok::<_, WorkloadError>(plugin.as_ref().ok_or(WorkloadError::NoDescriptor)?.describe(index)?),
                describe,
            );
            let (Some(plugin), Some(d)) = (plugin, described) else {
                skip_plugin(out, index, None, "no descriptor");
                continue;
            };
            let instance = out.call(
                format!("plugin {index}: instantiate at {SAMPLE_RATE} Hz"),
                || native_plugins::instantiate(&plugin, SAMPLE_RATE, BLOCK),
                |_| "instance".into(),
            );
            let Some(mut instance) = instance else {
                skip_plugin(out, index, Some(&d), "no instance");
                continue;
            };
            if d.has_activate {
                out.call(
                    format!("plugin {index}: activate"),
                    || {
                        instance.activate();
                        Ok::<(), WorkloadError>(())
                    },
                    done,
                );
            }
            for block in 0..BLOCKS {
                let call = || {
                    fill_native(&d, &mut instance, block);
                    instance.run(BLOCK)?;
                    Ok::<String, WorkloadError>(outputs(&d, |p| {
                        instance.buffer(p).map_or_else(Vec::new, Words::floats)
                    }))
                };
                out.call(run_call(index, block), call, String::clone);
            }
            if d.has_deactivate {
                out.call(
                    format!("plugin {index}: deactivate"),
                    || {
                        instance.deactivate();
                        Ok::<(), WorkloadError>(())
                    },
                    done,
                );
            }
            // Cleaned up here, as a host does when it is done with an instance.
            drop(instance);
        }
    }

    fn run_ward(
        &self,
        sup: &Supervisor,
        path: &Path,
        isolation: Isolation,
        out: &mut Recorder,
    ) -> Result<Extension, WorkloadError> {
        let lib = Library::open(sup, path, Some(isolation))?;
        let count = lib.plugins().len();
        out.call("plugins", || Ok::<usize, WorkloadError>(count), usize::to_string);
        for index in 0..count.min(MAX_PLUGINS) {
            let d = lib.plugins()[index].clone();
            out.call(format!("plugin {index}: describe"), || Ok::<&Descriptor, WorkloadError>(&d), |d| describe(d));
            let instance = out.call(
                format!("plugin {index}: instantiate at {SAMPLE_RATE} Hz"),
                || lib.instantiate(index, SAMPLE_RATE),
                |_| "instance".into(),
            );
            let Some(mut instance) = instance else {
                skip_plugin(out, index, Some(&d), "no instance");
                continue;
            };
            if d.has_activate {
                ward_call(out, format!("plugin {index}: activate"), || instance.activate().map(|p| (p, done(&()))));
            }
            let mut buffers = port_buffers(&d);
            for block in 0..BLOCKS {
                ward_call(out, run_call(index, block), || {
                    fill(&d, &mut buffers, block);
                    let mut ports: Vec<PortBuffer<'_>> = d
                        .ports
                        .iter()
                        .zip(buffers.iter_mut())
                        .map(|(port, buf)| {
                            if port.is_input() {
                                PortBuffer::Input(buf.as_slice())
                            } else {
                                PortBuffer::Output(buf.as_mut_slice())
                            }
                        })
                        .collect();
                    let processed = instance.run(BLOCK, &mut ports)?;
                    drop(ports);
                    Ok((processed, outputs(&d, |p| buffers[p].clone())))
                });
            }
            if d.has_deactivate {
                ward_call(out, format!("plugin {index}: deactivate"), || instance.deactivate().map(|p| (p, done(&()))));
            }
            drop::<Instance>(instance);
        }
        Ok(lib.extension().clone())
    }
}

/// One call through the class wrapper: its result is recorded, and a bypass is noted.
fn ward_call(
    out: &mut Recorder,
    call: String,
    f: impl FnOnce() -> Result<(Processed, String), ward_classes::ClassError>,
) {
    let mut bypassed = None;
    let result = || match f() {
        Ok((Processed::Ran, text)) => Ok(text),
        Ok((Processed::Bypassed { reason }, text)) => {
            bypassed = Some(reason);
            Ok(text)
        }
        Err(e) => Err(e),
    };
    out.call(call, result, String::clone);
    if let Some(reason) = bypassed {
        out.bypassed(reason);
    }
}

fn done(_: &()) -> String {
    "done".into()
}

fn run_call(index: usize, block: usize) -> String {
    format!("plugin {index}: run block {} of {BLOCKS} ({BLOCK} samples)", block + 1)
}

/// The calls a plugin without a descriptor (`d` is `None`) or without an instance does not get to make.
fn skip_plugin(out: &mut Recorder, index: usize, d: Option<&Descriptor>, why: &str) {
    if d.is_none() {
        out.skip(format!("plugin {index}: instantiate at {SAMPLE_RATE} Hz"), why);
    }
    if d.is_some_and(|d| d.has_activate) {
        out.skip(format!("plugin {index}: activate"), why);
    }
    for block in 0..BLOCKS {
        out.skip(run_call(index, block), why);
    }
    if d.is_some_and(|d| d.has_deactivate) {
        out.skip(format!("plugin {index}: deactivate"), why);
    }
}

/// A plugin's description as text: everything a host takes from it to drive the plugin.
fn describe(d: &Descriptor) -> String {
    let ports: Vec<String> = d
        .ports
        .iter()
        .map(|p| format!("{:?} {:#x} hint {:#x} [{:?}, {:?}]", p.name, p.descriptor, p.hint, p.lower, p.upper))
        .collect();
    format!(
        "{} {:?} (id {}, properties {:#x}, run {}, activate {}, deactivate {}): {}",
        d.label,
        d.name,
        d.unique_id,
        d.properties,
        d.has_run,
        d.has_activate,
        d.has_deactivate,
        ports.join(", ")
    )
}

/// The value a control input gets: its default, else its lower bound, else 0 (or its upper bound if below 0).
fn control_value(port: &Port) -> f32 {
    if let Some(v) = port.default_value(SAMPLE_RATE) {
        return v;
    }
    let scale = if port.hint & HINT_SAMPLE_RATE != 0 { SAMPLE_RATE as f32 } else { 1.0 };
    if port.hint & HINT_BOUNDED_BELOW != 0 {
        port.lower * scale
    } else if port.hint & HINT_BOUNDED_ABOVE != 0 {
        (port.upper * scale).min(0.0)
    } else {
        0.0
    }
}

/// Block `block` of the test signal of the `channel`-th audio input: two tones, a little hiss and, at the very
/// start, a click, within ±1.
fn signal(channel: usize, block: usize) -> Vec<f32> {
    (0..BLOCK)
        .map(|i| {
            let n = (block * BLOCK + i) as u64;
            let t = n as f64 / SAMPLE_RATE as f64;
            let tone =
                0.4 * (TAU * 220.0 * (channel + 1) as f64 * t).sin() + 0.2 * (TAU * 3170.0 * t + channel as f64).sin();
            let hiss = (mix(n ^ ((channel as u64) << 40)) >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            let click = if n == 0 { 0.3 } else { 0.0 };
            (tone + 0.1 * hiss + click) as f32
        })
        .collect()
}

/// A buffer per port, zero: a block of samples for an audio port, one value for a control port.
fn port_buffers(d: &Descriptor) -> Vec<Vec<f32>> {
    d.ports.iter().map(|p| vec![0.0; p.values_in_block(BLOCK)]).collect()
}

/// The inputs of block `block`: the test signal on audio inputs, the control values on control inputs.
fn inputs(d: &Descriptor, block: usize) -> impl Iterator<Item = (usize, Vec<f32>)> + '_ {
    let mut channel = 0;
    d.ports.iter().enumerate().filter(|(_, p)| p.is_input()).map(move |(i, p)| {
        if p.is_audio() {
            channel += 1;
            (i, signal(channel - 1, block))
        } else {
            (i, vec![control_value(p)])
        }
    })
}

fn fill(d: &Descriptor, buffers: &mut [Vec<f32>], block: usize) {
    for (i, values) in inputs(d, block) {
        buffers[i].copy_from_slice(&values);
    }
}

fn fill_native(d: &Descriptor, instance: &mut LadspaInstance<'_>, block: usize) {
    for (i, values) in inputs(d, block) {
        if let Some(b) = instance.buffer_mut(i) {
            b.set_floats(&values);
        }
    }
}

/// The output ports after a block, as text: `#1 <digest> rms 0.353553 peak 0.500000` for an audio port (the
/// digest is of the samples' bits), `#2 = 0.25` for a control port.
fn outputs(d: &Descriptor, values: impl Fn(usize) -> Vec<f32>) -> String {
    let mut parts = Vec::new();
    for (i, p) in d.ports.iter().enumerate().filter(|(_, p)| p.is_output()) {
        let v = values(i);
        if p.is_audio() {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
            let sum: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            let rms = (sum / v.len().max(1) as f64).sqrt();
            let peak = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            parts.push(format!("#{i} {:016x} rms {rms:.6} peak {peak:.6}", digest(&bytes)));
        } else {
            parts.push(format!("#{i} = {:?}", v.first().copied().unwrap_or(0.0)));
        }
    }
    if parts.is_empty() {
        "no output ports".into()
    } else {
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ward_classes::ladspa::{PORT_AUDIO, PORT_CONTROL, PORT_INPUT, PORT_OUTPUT};

    fn port(descriptor: i32, hint: i32, lower: f32, upper: f32) -> Port {
        Port { descriptor, name: "p".into(), hint, lower, upper }
    }

    #[test]
    fn controls_get_defaults_else_a_bound_else_zero() {
        let c = PORT_INPUT | PORT_CONTROL;
        assert_eq!(control_value(&port(c, 0x1 | 0x2 | 0x140, -1.0, 3.0)), 3.0, "default maximum");
        assert_eq!(control_value(&port(c, HINT_BOUNDED_BELOW, 0.5, 0.0)), 0.5);
        assert_eq!(control_value(&port(c, HINT_BOUNDED_BELOW | HINT_SAMPLE_RATE, 0.125, 0.0)), 6000.0);
        assert_eq!(control_value(&port(c, HINT_BOUNDED_ABOVE, 0.0, -2.0)), -2.0);
        assert_eq!(control_value(&port(c, HINT_BOUNDED_ABOVE, 0.0, 2.0)), 0.0);
        assert_eq!(control_value(&port(c, 0, 0.0, 0.0)), 0.0);
    }

    #[test]
    fn the_signal_is_fixed_and_within_range() {
        let a = signal(0, 0);
        assert_eq!(a.len(), BLOCK);
        assert_eq!(a, signal(0, 0));
        assert_ne!(a, signal(1, 0));
        assert_ne!(a, signal(0, 1));
        assert!((0..BLOCKS).flat_map(|b| signal(0, b)).all(|x| x.abs() <= 1.0));
    }

    #[test]
    fn outputs_name_each_output_port() {
        let d = Descriptor {
            index: 0,
            unique_id: 1,
            label: "amp".into(),
            properties: 0,
            name: "Amp".into(),
            maker: String::new(),
            copyright: String::new(),
            ports: vec![
                port(PORT_INPUT | PORT_AUDIO, 0, 0.0, 0.0),
                port(PORT_OUTPUT | PORT_AUDIO, 0, 0.0, 0.0),
                port(PORT_OUTPUT | PORT_CONTROL, 0, 0.0, 0.0),
            ],
            has_activate: false,
            has_deactivate: false,
            has_run: true,
            has_run_adding: false,
            has_set_run_adding_gain: false,
        };
        let text = outputs(&d, |p| if p == 1 { vec![0.5, -0.5] } else { vec![0.25] });
        assert!(text.starts_with("#1 ") && text.contains(" rms 0.500000 peak 0.500000; #2 = 0.25"), "{text}");
        let mut buffers = port_buffers(&d);
        fill(&d, &mut buffers, 0);
        assert_eq!(buffers[0], signal(0, 0));
        assert_eq!(buffers[2], [0.0]);
    }
}
