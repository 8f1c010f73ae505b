//! `ward __corpus-run`: one plugin run on the corpus's fixed input in a throwaway process, natively or under ward,
//! or one library's plugins listed. It prints one line (a listing one line per plugin) on stdout:
//!
//! * `digest HASH BYTES FAULTS`: the output's 64-bit FNV-1a, its length, and the faults ward recovered (0
//!   natively);
//! * `bypassed REASON`: the class wrapper could not run the plugin and fell back (its output is not the plugin's);
//! * `cannot REASON`: the plugin could not be run (refused by the class wrapper, no such plugin...);
//! * `plugin INDEX<TAB>LABEL<TAB>NAME`: a listed plugin.
//!
//! A plugin that crashes or hangs takes this process down instead; the parent says so.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use ward::{Isolation, Policy, Supervisor};
use ward_classes::{frei0r, ladspa, Processed};

use super::input::{self, Digest, BLOCKS, HEIGHT, MAX_BLOCK, SAMPLE_RATE, TIMES, WIDTH};
use super::{native_runner, Class, Listed};

/// How the helper runs the plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum How {
    /// dlopen'd directly, no ward.
    Native,
    None,
    Process,
    Mpk,
}

impl How {
    pub fn as_str(self) -> &'static str {
        match self {
            How::Native => "native",
            How::None => "none",
            How::Process => "process",
            How::Mpk => "mpk",
        }
    }
}

#[derive(Args)]
pub struct RunArgs {
    #[arg(long, value_enum)]
    class: Class,
    /// How to run it: natively or under ward with this isolation.
    #[arg(long, value_enum, required_unless_present = "list")]
    isolation: Option<How>,
    /// List the library's plugins natively instead of running one.
    #[arg(long, conflicts_with = "isolation")]
    list: bool,
    path: PathBuf,
    /// Natively: fill uninitialised heap and stack memory with patterns first (see `native_runner::Memory`).
    #[arg(long)]
    perturb: bool,
    /// The plugin's index in its library (0 for frei0r).
    #[arg(required_unless_present = "list")]
    index: Option<usize>,
}

/// What one run came to.
enum Reply {
    Digest(Digest, u64),
    Bypassed(String),
}

pub fn main(args: RunArgs) -> Result<bool> {
    native_runner::no_core_files();
    let mut lines = Vec::new();
    if args.list {
        let listed = match args.class {
            Class::Ladspa => native_runner::ladspa_list(&args.path),
            Class::Frei0r => native_runner::frei0r_list(&args.path),
        };
        match listed {
            Ok(plugins) => lines.extend(plugins.iter().map(Listed::line)),
            Err(reason) => lines.push(format!("cannot {}", one_line(&reason))),
        }
    } else {
        let index = args.index.unwrap_or(0);
        let how = args.isolation.unwrap_or(How::Native);
        let memory = if args.perturb { native_runner::Memory::Perturbed } else { native_runner::Memory::AsIs };
        let result = match (args.class, how) {
            (Class::Ladspa, How::Native) => {
                native_runner::ladspa_run(&args.path, index, memory).map(|d| Reply::Digest(d, 0))
            }
            (Class::Frei0r, How::Native) => native_runner::frei0r_run(&args.path, memory).map(|d| Reply::Digest(d, 0)),
            (Class::Ladspa, how) => ladspa_ward(&args.path, index, isolation(how)),
            (Class::Frei0r, how) => frei0r_ward(&args.path, isolation(how)),
        };
        lines.push(match result {
            Ok(Reply::Digest(d, faults)) => format!("digest {} {} {faults}", d.hex(), d.bytes),
            Ok(Reply::Bypassed(reason)) => format!("bypassed {}", one_line(&reason)),
            Err(reason) => format!("cannot {}", one_line(&reason)),
        });
    }
    let mut out = std::io::stdout().lock();
    for line in lines {
        writeln!(out, "{line}").context("cannot write the result")?;
    }
    out.flush().context("cannot write the result")?;
    Ok(true)
}

fn isolation(how: How) -> Isolation {
    match how {
        How::None => Isolation::None,
        How::Mpk => Isolation::Mpk,
        How::Process | How::Native => Isolation::Process,
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Remember the first bypass of a run.
fn note(outcome: Processed, bypass: &mut Option<String>) {
    if let Processed::Bypassed { reason } = outcome {
        bypass.get_or_insert(reason);
    }
}

/// The LADSPA run of the native runner, through the class API: same input, same order of output bytes.
fn ladspa_ward(path: &Path, index: usize, isolation: Isolation) -> Result<Reply, String> {
    let sup = Supervisor::new(Policy::default());
    let lib = ladspa::Library::open(&sup, path, Some(isolation)).map_err(|e| e.to_string())?;
    let plugin = lib.plugins().get(index).cloned().ok_or_else(|| format!("the library has no plugin #{index}"))?;
    let mut inst = lib.instantiate(index, SAMPLE_RATE).map_err(|e| e.to_string())?;
    let ports = &plugin.ports;
    let mut buffers: Vec<Vec<f32>> = ports.iter().map(|p| vec![0.0; p.values_in_block(MAX_BLOCK)]).collect();
    let mut signals = Vec::new();
    for (port, buf) in ports.iter().zip(buffers.iter_mut()) {
        if port.is_input() && port.is_control() {
            buf[0] = input::control_input(port);
        }
        if port.is_input() && port.is_audio() {
            signals.push(input::audio_input(signals.len()));
        }
    }
    let mut bypass = None;
    if plugin.has_activate {
        note(inst.activate().map_err(|e| e.to_string())?, &mut bypass);
    }
    let mut digest = Digest::default();
    let mut at = 0;
    for samples in BLOCKS {
        let mut k = 0;
        for (port, buf) in ports.iter().zip(buffers.iter_mut()) {
            if port.is_input() && port.is_audio() {
                buf[..samples].copy_from_slice(&signals[k][at..at + samples]);
                k += 1;
            }
        }
        let mut views: Vec<ladspa::PortBuffer<'_>> = ports
            .iter()
            .zip(buffers.iter_mut())
            .map(
                |(port, buf)| {
                    if port.is_input() {
                        ladspa::PortBuffer::Input(buf)
                    } else {
                        ladspa::PortBuffer::Output(buf)
                    }
                },
            )
            .collect();
        note(inst.run(samples, &mut views).map_err(|e| e.to_string())?, &mut bypass);
        for (port, buf) in ports.iter().zip(buffers.iter()) {
            if port.is_output() {
                digest.f32s(&buf[..port.values_in_block(samples)]);
            }
        }
        at += samples;
    }
    if plugin.has_deactivate {
        note(inst.deactivate().map_err(|e| e.to_string())?, &mut bypass);
    }
    drop(inst);
    Ok(match bypass {
        Some(reason) => Reply::Bypassed(reason),
        None => Reply::Digest(digest, lib.extension().stats().faults),
    })
}

/// The frei0r run of the native runner, through the class API.
fn frei0r_ward(path: &Path, isolation: Isolation) -> Result<Reply, String> {
    let sup = Supervisor::new(Policy::default());
    let lib = frei0r::Library::open(&sup, path, Some(isolation)).map_err(|e| e.to_string())?;
    let info = lib.info().clone();
    let inputs =
        info.plugin_type.input_frames().ok_or_else(|| format!("unknown plugin type {:?}", info.plugin_type))?;
    let mut inst = lib.construct(WIDTH, HEIGHT).map_err(|e| e.to_string())?;
    let mut out = vec![0u32; (WIDTH * HEIGHT) as usize];
    let mut digest = Digest::default();
    let mut bypass = None;
    for (frame, &time) in TIMES.iter().enumerate() {
        let images: Vec<Vec<u32>> = (0..inputs).map(|i| input::image(i, frame)).collect();
        let outcome = if inputs <= 1 && info.has_update {
            let input = images.first().map_or(&[][..], Vec::as_slice);
            inst.update(time, input, &mut out)
        } else {
            let arg = |i: usize| images.get(i).map(Vec::as_slice);
            inst.update2(time, arg(0), arg(1), arg(2), &mut out)
        };
        note(outcome.map_err(|e| e.to_string())?, &mut bypass);
        digest.u32s(&out);
    }
    drop(inst);
    Ok(match bypass {
        Some(reason) => Reply::Bypassed(reason),
        None => Reply::Digest(digest, lib.extension().stats().faults),
    })
}
