//! The plugin part of `ward demo`: the built-in faulty LADSPA and frei0r plugins, and the built-in LV2 delay, through
//! their class wrappers, as a host using ward's typed APIs sees them. A crash in the middle of a stream is recovered
//! and the block or frame retried on intact input; a plugin that fails on every block ends disabled and bypassed; a
//! stateful plugin whose domain is killed resumes with its state.

use anyhow::{Context, Result};
use serde::Serialize;
use std::sync::Arc;
use ward::{Isolation, Policy, Supervisor};

use ward_classes::frei0r;
use ward_classes::ladspa::{self, PortBuffer};
use ward_classes::lv2;
use ward_classes::Processed;

use crate::output::{self, say};

/// Samples per LADSPA block.
const BLOCK: usize = 1024;
/// Blocks (and frames) per scenario.
const STEPS: usize = 6;
/// The step at which the plugin is told to fail.
const FAULT_AT: usize = 3;
/// Frame size for frei0r.
const WIDTH: u32 = 64;
const HEIGHT: u32 = 48;

#[derive(Serialize)]
struct PluginLine {
    #[serde(rename = "type")]
    kind_of_line: &'static str,
    class: &'static str,
    scenario: &'static str,
    isolation: String,
    steps: usize,
    ran: usize,
    bypassed: usize,
    /// Every step's output is what it must be: processed, or the input passed through when bypassed.
    output_ok: bool,
    restarts: u64,
    ok: bool,
}

impl PluginLine {
    /// The line of a scenario that ran `STEPS` steps: `counts` is (processed, bypassed, every output right). A
    /// one-off fault must have been recovered every time; a repeating one must have ended in bypass.
    fn new(
        class: &'static str,
        scenario: &'static str,
        isolation: Isolation,
        repeat: bool,
        counts: (usize, usize, bool),
        restarts: u64,
    ) -> PluginLine {
        PluginLine::of_steps(class, scenario, isolation, repeat, STEPS, counts, restarts)
    }

    fn of_steps(
        class: &'static str,
        scenario: &'static str,
        isolation: Isolation,
        repeat: bool,
        steps: usize,
        (ran, bypassed, output_ok): (usize, usize, bool),
        restarts: u64,
    ) -> PluginLine {
        let ok = output_ok && if repeat { bypassed > 0 } else { ran == steps && restarts >= 1 };
        PluginLine {
            kind_of_line: "plugin",
            class,
            scenario,
            isolation: isolation.to_string(),
            steps,
            ran,
            bypassed,
            output_ok,
            restarts,
            ok,
        }
    }
}

/// Run every scenario; false when an output is wrong.
pub fn run(isolation: Isolation, json: bool) -> Result<bool> {
    if !json {
        say!("")?;
        say!("plugins through their class wrappers (isolation {isolation}), {STEPS} blocks or frames each (the LV2 delay {LV2_STEPS}):")?;
    }
    let mut all = true;
    let lines = [
        ladspa_scenario(isolation, "crash every 3rd block of an incarnation, recovered", 1, false)?,
        ladspa_scenario(isolation, "overrun of the output port at block 3", 20, false)?,
        ladspa_scenario(isolation, "crash on every block from 3: disabled, bypassed", 1, true)?,
        frei0r_scenario(isolation, "crash every 3rd frame of an incarnation, recovered", 1.0, false)?,
        frei0r_scenario(isolation, "abort on every frame: disabled, bypassed", 3.0, true)?,
        lv2_scenario(isolation, "a delay's domain killed mid-stream: state kept")?,
    ];
    for line in lines {
        all &= line.ok;
        if json {
            output::json_line(&line)?;
        } else {
            let verdict = if line.ok { "correct" } else { "WRONG" };
            say!(
                "  {:<7} {:<52} {} processed, {} bypassed, {} restarts: output {verdict}",
                line.class,
                line.scenario,
                line.ran,
                line.bypassed,
                line.restarts
            )?;
        }
    }
    Ok(all)
}

/// A policy whose restart limit a repeating fault reaches within the scenario. Without history (`history_mb = 0`):
/// the scenarios' faults strike at a block count of the incarnation, so a restarted plugin must count from 1 again
/// (with its history replayed the retry would fail again and take a second restart, DECISIONS.md).
fn demo_policy() -> Result<Policy> {
    let text = "[defaults]\nmax_restarts = 2\ndeadline_ms = 2000\nhistory_mb = 0\n";
    Ok(Policy::from_toml_str(text, "the demo's policy")?)
}

fn ladspa_scenario(isolation: Isolation, scenario: &'static str, kind: i32, repeat: bool) -> Result<PluginLine> {
    let path = ward_extensions::path_of("faulty_ladspa").context("cannot extract faulty_ladspa.so")?;
    let sup = Supervisor::new(demo_policy()?);
    let lib = ladspa::Library::open(&sup, &path, Some(isolation))
        .with_context(|| format!("cannot open {} under ward", path.display()))?;
    let index = lib.plugin("faulty_amp")?.index;
    let mut inst = lib.instantiate(index, 48_000)?;
    inst.activate()?;
    let gain = 0.5f32;
    let (mut ran, mut bypassed, mut output_ok) = (0, 0, true);
    for step in 1..=STEPS {
        let input: Vec<f32> = (0..BLOCK).map(|i| ((step * BLOCK + i) as f32 * 0.01).sin()).collect();
        let mut output = vec![0f32; BLOCK];
        let mut blocks = [0f32];
        // Once: the plugin faults on its FAULT_AT-th block since activation; a recovered incarnation counts from 1
        // again, so the retried block passes and the fault comes back FAULT_AT blocks later. Repeating: from step
        // FAULT_AT on, the plugin faults on every block, the retry included.
        let (armed, at) = match repeat {
            false => (kind as f32, FAULT_AT as f32),
            true if step >= FAULT_AT => (kind as f32, 0.0),
            true => (0.0, 0.0),
        };
        let outcome = inst.run(
            BLOCK,
            &mut [
                PortBuffer::Input(&input),
                PortBuffer::Output(&mut output),
                PortBuffer::Input(&[gain]),
                PortBuffer::Input(&[armed]),
                PortBuffer::Input(&[at]),
                PortBuffer::Input(&[0.0]),
                PortBuffer::Output(&mut blocks),
            ],
        )?;
        let expected: Vec<f32> = match outcome {
            Processed::Ran => {
                ran += 1;
                input.iter().map(|x| x * gain).collect()
            }
            Processed::Bypassed { .. } => {
                bypassed += 1;
                input.clone()
            }
        };
        output_ok &= output == expected;
    }
    Ok(PluginLine::new(
        "LADSPA",
        scenario,
        isolation,
        repeat,
        (ran, bypassed, output_ok),
        lib.extension().stats().restarts,
    ))
}

fn frei0r_scenario(isolation: Isolation, scenario: &'static str, kind: f64, repeat: bool) -> Result<PluginLine> {
    let path = ward_extensions::path_of("faulty_frei0r").context("cannot extract faulty_frei0r.so")?;
    let sup = Supervisor::new(demo_policy()?);
    let lib = frei0r::Library::open(&sup, &path, Some(isolation))
        .with_context(|| format!("cannot open {} under ward", path.display()))?;
    let mut inst = lib.construct(WIDTH, HEIGHT)?;
    // Once: a fault on the plugin's FAULT_AT-th update (a recovered incarnation counts from 1 again). Repeating: a
    // fault on every update, retries included.
    inst.set_param(0, &frei0r::ParamValue::Double(kind))?;
    inst.set_param(1, &frei0r::ParamValue::Double(if repeat { 0.0 } else { FAULT_AT as f64 }))?;
    let pixels = (WIDTH * HEIGHT) as usize;
    let (mut ran, mut bypassed, mut output_ok) = (0, 0, true);
    for step in 0..STEPS {
        let input: Vec<u32> = (0..pixels).map(|i| (i as u32).wrapping_mul(2_654_435_761) ^ (step as u32)).collect();
        let mut output = vec![0u32; pixels];
        let outcome = inst.update(step as f64 / 25.0, &input, &mut output)?;
        let expected: Vec<u32> = match outcome {
            Processed::Ran => {
                ran += 1;
                input.iter().map(|p| p ^ 0x00FF_FFFF).collect()
            }
            Processed::Bypassed { .. } => {
                bypassed += 1;
                input.clone()
            }
        };
        output_ok &= output == expected;
    }
    Ok(PluginLine::new(
        "frei0r",
        scenario,
        isolation,
        repeat,
        (ran, bypassed, output_ok),
        lib.extension().stats().restarts,
    ))
}

/// Blocks of the LV2 scenario: past the delay's quarter second twice over, so its output carries its memory.
const LV2_STEPS: usize = 40;
/// The block before which the LV2 delay's domain is killed.
const LV2_KILL_AT: usize = 20;

/// ward's built-in LV2 delay (its output depends on all its past input), its domain killed before block
/// `LV2_KILL_AT`: every block processed, the output identical to that of a run without the kill.
fn lv2_scenario(isolation: Isolation, scenario: &'static str) -> Result<PluginLine> {
    let clean = lv2_delay_stream(isolation, None)?;
    let (output, restarts) = lv2_delay_stream(isolation, Some(LV2_KILL_AT))?;
    let ran = output.iter().filter(|b| b.is_some()).count();
    let same = output.iter().zip(&clean.0).all(|(a, b)| a.is_some() && a == b);
    Ok(PluginLine::of_steps("LV2", scenario, isolation, false, LV2_STEPS, (ran, LV2_STEPS - ran, same), restarts))
}

/// The delay's output block by block (`None`: bypassed), and its restarts.
fn lv2_delay_stream(isolation: Isolation, kill_at: Option<usize>) -> Result<(Vec<Option<Vec<f32>>>, u64)> {
    let bundle_dir = ward_extensions::lv2_bundle_of("lv2_delay").context("cannot write out the LV2 bundles")?;
    let binary = bundle_dir.join("lv2_delay.so");
    let info = lv2::bundle::plugins_of_binary(&binary)?
        .into_iter()
        .find(|p| p.uri == "urn:ward:lv2:delay")
        .context("lv2_delay's bundle does not describe urn:ward:lv2:delay")?;
    let sup = Supervisor::new(Policy::default());
    let lib = lv2::Library::open(&sup, &binary, Some(isolation))?;
    let setup = lv2::Setup {
        sample_rate: 48_000.0,
        bundle: bundle_dir,
        ports: info.ports.iter().map(lv2::PortSpec::from).collect(),
        features: lv2::Features { urid_map: true, ..lv2::Features::default() },
        host: Arc::new(lv2::UridMap::new()),
        realtime: false,
    };
    let inst = lib.instantiate(lib.plugin(&info.uri)?.index, setup)?;
    inst.activate()?;
    let mut blocks = Vec::with_capacity(LV2_STEPS);
    for step in 0..LV2_STEPS {
        if Some(step) == kill_at {
            // A fault from outside: the domain process (this program's own child) killed, as the OOM killer would.
            let pid = lib.extension().pid().context("the delay has no domain process")?;
            let killed = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            anyhow::ensure!(killed.is_ok_and(|s| s.success()), "cannot kill the delay's domain process {pid}");
        }
        let input: Vec<f32> = (0..BLOCK).map(|i| ((step * BLOCK + i) as f32 * 0.013).sin() * 0.5).collect();
        let mut output = vec![0f32; BLOCK];
        let mut count = [0f32];
        let outcome = inst.run(
            BLOCK,
            &mut [
                lv2::PortBuffer::Input(&input),
                lv2::PortBuffer::Output(&mut output),
                lv2::PortBuffer::Input(&[0.5]),
                lv2::PortBuffer::Output(&mut count),
            ],
        )?;
        blocks.push(matches!(outcome, Processed::Ran).then_some(output));
    }
    Ok((blocks, lib.extension().stats().restarts))
}
