//! What history costs, per class, over the installed plugins: the bytes one block or frame holds, the replay time it
//! is charged (what the call took), and what replaying it took in fact (the recovery after a kill, less the recovery
//! of the same plugin without history, divided by the calls replayed). The figures of docs/RELIABILITY.md
//! ("History") and the defaults of `history_mb` and `history_replay_ms` come from it.
//!
//! ```sh
//! cargo run --release -p ward-classes --example history_cost -- [LADSPA_DIR] [FREI0R_DIR]
//! ```
//!
//! Every plugin runs in a process domain of its own, one at a time; a plugin that fails to load or run is skipped
//! and counted.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use ward::{Event, Isolation, Policy, Supervisor};
use ward_classes::{frei0r, ladspa};

/// Calls made before the restart, per plugin.
const AUDIO_BLOCKS: usize = 64;
const FRAMES: usize = 8;

/// What one plugin's history cost at one size.
struct Cost {
    bytes_per_call: f64,
    /// Charged replay time per call (what the calls took, at least a replayed call's charge), in microseconds.
    charged_us: f64,
    /// Replay time per call, measured, in microseconds.
    replayed_us: f64,
}

/// Bounds far above what the measurement keeps, so nothing is dropped; or no history at all.
fn supervisor(history: bool) -> (Supervisor, Receiver<Event>) {
    let keys = if history { "history_mb = 65536\nhistory_replay_ms = 3600000" } else { "history_mb = 0" };
    let policy = Policy::from_toml_str(&format!("[defaults]\n{keys}\n"), "history_cost").expect("a valid policy");
    let sup = Supervisor::new(policy);
    let events = sup.subscribe();
    (sup, events)
}

fn kill(pid: Option<i32>) -> Option<()> {
    let pid = pid?;
    // SAFETY: the plugin's own domain process, started by this program.
    (unsafe { libc::kill(pid, libc::SIGKILL) } == 0).then_some(())
}

/// The recovery of the latest restart: its time and the calls it replayed.
fn recovery(events: &Receiver<Event>) -> Option<(Duration, usize)> {
    events.try_iter().fold(None, |last, e| match e {
        Event::Recovered { took, replayed, .. } => Some((took, replayed)),
        _ => last,
    })
}

/// A plugin's calls, a kill, one more call (`run`): the stats before the kill, and the recovery.
type Run<'a> = dyn FnMut(&Supervisor) -> Option<ward::DomainStats> + 'a;

fn measure(history: bool, run: &mut Run<'_>) -> Option<(ward::DomainStats, Duration, usize)> {
    let (sup, events) = supervisor(history);
    let stats = run(&sup)?;
    let (took, replayed) = recovery(&events)?;
    Some((stats, took, replayed))
}

fn ladspa_cost(path: &Path, index: usize, block: usize) -> Option<Cost> {
    let mut go = |sup: &Supervisor| -> Option<ward::DomainStats> {
        let lib = ladspa::Library::open(sup, path, Some(Isolation::Process)).ok()?;
        let plugin = lib.plugins().get(index)?.clone();
        let mut inst = lib.instantiate(index, 48000).ok()?;
        inst.activate().ok()?;
        let controls: Vec<[f32; 1]> =
            plugin.ports.iter().map(|p| [p.default_value(48000).unwrap_or(p.lower.max(0.0))]).collect();
        let mut stats = None;
        for n in 0..=AUDIO_BLOCKS {
            if n == AUDIO_BLOCKS {
                stats = Some(lib.extension().stats());
                kill(lib.extension().pid())?;
            }
            let input: Vec<f32> = (0..block).map(|i| (((n * block + i) as f32) * 0.01).sin() * 0.5).collect();
            let mut outs: Vec<Vec<f32>> = plugin.ports.iter().map(|_| vec![0f32; block]).collect();
            let mut ports: Vec<ladspa::PortBuffer<'_>> = plugin
                .ports
                .iter()
                .zip(controls.iter().zip(outs.iter_mut()))
                .map(|(p, (c, o))| match (p.is_input(), p.is_audio()) {
                    (true, true) => ladspa::PortBuffer::Input(&input),
                    (true, false) => ladspa::PortBuffer::Input(c),
                    (false, true) => ladspa::PortBuffer::Output(o),
                    (false, false) => ladspa::PortBuffer::Output(&mut o[..1]),
                })
                .collect();
            if inst.run(block, &mut ports).ok()? != ward_classes::Processed::Ran {
                return None;
            }
        }
        stats
    };
    cost(&mut go, AUDIO_BLOCKS)
}

fn frei0r_cost(path: &Path, width: u32, height: u32) -> Option<Cost> {
    let mut go = |sup: &Supervisor| -> Option<ward::DomainStats> {
        let lib = frei0r::Library::open(sup, path, Some(Isolation::Process)).ok()?;
        let mut inst = lib.construct(width, height).ok()?;
        let pixels = (width * height) as usize;
        let mut out = vec![0u32; pixels];
        let mut stats = None;
        for n in 0..=FRAMES {
            if n == FRAMES {
                stats = Some(lib.extension().stats());
                kill(lib.extension().pid())?;
            }
            let input: Vec<u32> = (0..pixels)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(n as u32 * 977) | 0xff00_0000)
                .collect();
            if inst.update(n as f64 * 0.04, &input, &mut out).ok()? != ward_classes::Processed::Ran {
                return None;
            }
        }
        stats
    };
    cost(&mut go, FRAMES)
}

/// The cost of `calls` calls' history, from a run with history and one without.
fn cost(go: &mut Run<'_>, calls: usize) -> Option<Cost> {
    let (stats, with, replayed) = measure(true, go)?;
    let (_, without, replayed_without) = measure(false, go)?;
    let history_calls = replayed.checked_sub(replayed_without)?;
    if history_calls != calls {
        return None;
    }
    let n = calls as f64;
    Some(Cost {
        bytes_per_call: stats.history_bytes as f64 / n,
        charged_us: stats.history_replay.as_secs_f64() * 1e6 / n,
        replayed_us: with.saturating_sub(without).as_secs_f64() * 1e6 / n,
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(what: &str, costs: &[Cost], skipped: usize) {
    let column = |f: fn(&Cost) -> f64| {
        let mut v: Vec<f64> = costs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let bytes = column(|c| c.bytes_per_call);
    let charged = column(|c| c.charged_us);
    let replayed = column(|c| c.replayed_us);
    println!(
        "| {what} | {} ({skipped} skipped) | {:.0} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} |",
        costs.len(),
        percentile(&bytes, 0.5),
        percentile(&charged, 0.5),
        percentile(&charged, 0.9),
        percentile(&charged, 1.0),
        percentile(&replayed, 0.5),
        percentile(&replayed, 0.9),
        percentile(&replayed, 1.0),
    );
}

fn libraries(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "so")).collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

fn main() {
    let mut args = std::env::args_os().skip(1);
    let ladspa_dir = args.next().map_or_else(|| PathBuf::from("/usr/lib/ladspa"), PathBuf::from);
    let frei0r_dir = args.next().map_or_else(|| PathBuf::from("/usr/lib/frei0r-1"), PathBuf::from);
    println!(
        "| class, size | plugins measured | bytes per call (median) | charged replay per call, us (median / p90 / \
         max) | replay per call, measured, us (median / p90 / max) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    for block in [1024usize, 8192] {
        let (mut costs, mut skipped) = (Vec::new(), 0);
        for path in libraries(&ladspa_dir) {
            let sup = Supervisor::new(Policy::default());
            let count = ladspa::Library::open(&sup, &path, Some(Isolation::Process)).map_or(0, |l| l.plugins().len());
            drop(sup);
            for index in 0..count {
                match ladspa_cost(&path, index, block) {
                    Some(c) => costs.push(c),
                    None => skipped += 1,
                }
            }
        }
        report(&format!("LADSPA, blocks of {block} samples"), &costs, skipped);
    }
    for (width, height) in [(640u32, 480u32), (1920, 1080)] {
        let (mut costs, mut skipped) = (Vec::new(), 0);
        for path in libraries(&frei0r_dir) {
            let sup = Supervisor::new(Policy::default());
            let filter = frei0r::Library::open(&sup, &path, Some(Isolation::Process))
                .is_ok_and(|l| l.info().plugin_type == frei0r::PluginType::Filter && l.info().has_update);
            drop(sup);
            if !filter {
                continue;
            }
            match frei0r_cost(&path, width, height) {
                Some(c) => costs.push(c),
                None => skipped += 1,
            }
        }
        report(&format!("frei0r filters, {width}x{height}"), &costs, skipped);
    }
}
