//! What an LV2 checkpoint costs and when it pays: for each plugin with `state:interface` (ward's `lv2_delay`, and
//! the effects of the Debian bundles given), the bytes its state holds, what saving it takes against what a second
//! of its audio takes to process, and whether the state is whole: a second instance given the saved state computes
//! the next blocks exactly as the first (then a checkpoint makes a restart exact however far back the plugin's memory
//! reaches; otherwise the state is its settings only, and only the history rebuilds the rest). The figures of
//! docs/RELIABILITY.md ("Checkpoints") and the default of `checkpoint_ms` come from it.
//!
//! ```sh
//! cargo run --release -p ward-classes --example checkpoint_cost -- [BUNDLE_DIR...]
//! ```
//!
//! Each plugin runs in a process domain of its own, one at a time, on a fixed signal in 512-frame blocks at 48 kHz,
//! controls at their defaults; a plugin that fails to load or run is skipped and said.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ward::{Isolation, Policy, Supervisor};
use ward_classes::lv2::bundle::{self, Direction, PluginInfo, PortKind as Kind};
use ward_classes::lv2::{uri, Features, Instance, Library, PortBuffer, PortSpec, Setup, UridMap};

const RATE: f64 = 48000.0;
const BLOCK: usize = 512;
/// Blocks in one second of audio.
const SECOND: usize = 94;
const SAVES: usize = 21;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One instance of `info` in `lib`, activated.
fn instance(lib: &Library, info: &PluginInfo, map: &Arc<UridMap>) -> Result<Instance, String> {
    let d = lib.plugin(&info.uri).map_err(|e| e.to_string())?.clone();
    let setup = Setup {
        sample_rate: RATE,
        bundle: info.bundle.clone(),
        ports: info.ports.iter().map(PortSpec::from).collect(),
        features: Features { urid_map: true, urid_unmap: true, options: Some(Vec::new()), ..Features::default() },
        host: Arc::clone(map) as Arc<dyn ward_classes::lv2::Host>,
        realtime: false,
    };
    let inst = lib.instantiate(d.index, setup).map_err(|e| e.to_string())?;
    inst.activate().map_err(|e| e.to_string())?;
    Ok(inst)
}

/// Run block `b` of the signal through `inst`: every output's bytes.
fn block(inst: &Instance, info: &PluginInfo, seq: u32, b: usize) -> Result<Vec<u8>, String> {
    let input: Vec<f32> = (0..BLOCK).map(|i| (((b * BLOCK + i) as f32) * 0.05).sin() * 0.3).collect();
    let controls: Vec<f32> = info.ports.iter().map(|p| p.default.unwrap_or(0.0)).collect();
    let mut audio: Vec<Vec<f32>> = info.ports.iter().map(|_| vec![0f32; BLOCK]).collect();
    let mut atoms: Vec<Vec<u8>> = info
        .ports
        .iter()
        .map(|p| match p.direction {
            Direction::Input => empty_sequence(seq),
            Direction::Output => {
                let cap = p.minimum_size.unwrap_or(8192) as usize;
                let mut b = vec![0u8; 8 + cap];
                b[..4].copy_from_slice(&(cap as u32).to_le_bytes());
                b
            }
        })
        .collect();
    let mut ports = Vec::new();
    for (((p, c), a), at) in info.ports.iter().zip(&controls).zip(audio.iter_mut()).zip(atoms.iter_mut()) {
        ports.push(match (&p.kind, p.direction) {
            (Kind::Audio | Kind::Cv, Direction::Input) => PortBuffer::Input(&input),
            (Kind::Audio | Kind::Cv, Direction::Output) => PortBuffer::Output(a),
            (Kind::Control, Direction::Input) => PortBuffer::Input(std::slice::from_ref(c)),
            (Kind::Control, Direction::Output) => PortBuffer::Output(&mut a[..1]),
            (Kind::Atom { .. }, Direction::Input) => PortBuffer::AtomInput(at),
            (Kind::Atom { .. }, Direction::Output) => PortBuffer::AtomOutput(at),
            (Kind::Other(_), _) => PortBuffer::Unconnected,
        });
    }
    match inst.run(BLOCK, &mut ports).map_err(|e| e.to_string())? {
        ward_classes::Processed::Ran => {}
        ward_classes::Processed::Bypassed { reason } => return Err(format!("bypassed: {reason}")),
    }
    drop(ports);
    let mut out = Vec::new();
    for ((p, a), at) in info.ports.iter().zip(&audio).zip(&atoms) {
        if p.direction == Direction::Output {
            match p.kind {
                Kind::Atom { .. } => out.extend_from_slice(at),
                _ => out.extend(a.iter().flat_map(|x| x.to_le_bytes())),
            }
        }
    }
    Ok(out)
}

struct Measured {
    bytes: usize,
    save: Duration,
    second: Duration,
    whole: bool,
}

/// A second of audio through an instance, its state saved SAVES times, then a second instance given that state:
/// do the next blocks come out the same?
fn measure(info: &PluginInfo) -> Result<Measured, String> {
    let sup = Supervisor::new(Policy::default());
    let lib = Library::open(&sup, &info.binary, Some(Isolation::Process)).map_err(|e| e.to_string())?;
    let map = Arc::new(UridMap::new());
    let seq = map_sequence(&map);
    let first = instance(&lib, info, &map)?;
    let started = Instant::now();
    for b in 0..SECOND {
        block(&first, info, seq, b)?;
    }
    let second = started.elapsed();
    let mut took = Vec::new();
    let mut state = Vec::new();
    for _ in 0..SAVES {
        let t = Instant::now();
        state = first.save().map_err(|e| e.to_string())?;
        took.push(t.elapsed());
    }
    let other = instance(&lib, info, &map)?;
    other.restore(&state).map_err(|e| e.to_string())?;
    let mut whole = true;
    for b in SECOND..SECOND + 10 {
        whole &= block(&first, info, seq, b)? == block(&other, info, seq, b)?;
    }
    Ok(Measured { bytes: state.len(), save: median(took), second, whole })
}

fn map_sequence(map: &UridMap) -> u32 {
    use ward_classes::lv2::Host;
    map.map(uri::ATOM_SEQUENCE)
}

fn empty_sequence(seq: u32) -> Vec<u8> {
    let mut b = vec![0u8; 16];
    b[..4].copy_from_slice(&8u32.to_le_bytes());
    b[4..8].copy_from_slice(&seq.to_le_bytes());
    b
}

fn plugins(dirs: &[PathBuf]) -> Vec<PluginInfo> {
    let mut out = Vec::new();
    for dir in dirs {
        let bundles: Vec<PathBuf> = if dir.join("manifest.ttl").exists() {
            vec![dir.clone()]
        } else {
            let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
                .map(|r| r.flatten().map(|e| e.path()).filter(|p| p.join("manifest.ttl").exists()).collect())
                .unwrap_or_default();
            v.sort();
            v
        };
        for b in bundles {
            let Ok(bundle) = bundle::read_bundle(&b) else { continue };
            out.extend(bundle.plugins.into_iter().filter(|p| {
                p.extension_data.iter().any(|e| e == uri::STATE_INTERFACE)
                    && p.ports.iter().any(|q| q.kind == Kind::Audio && q.direction == Direction::Input)
                    && p.ports.iter().any(|q| q.kind == Kind::Audio && q.direction == Direction::Output)
                    && p.required_features
                        .iter()
                        .all(|f| f == uri::URID_MAP || f == uri::OPTIONS || f.ends_with("#boundedBlockLength"))
            }));
        }
    }
    out
}

fn main() {
    let mut dirs: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    match ward_extensions::lv2_bundle_of("lv2_delay") {
        Ok(d) => dirs.insert(0, d),
        Err(e) => eprintln!("the built-in lv2_delay is not available: {e}"),
    }
    println!("plugin | state bytes | save (median of {SAVES}) | one second of audio | save per second | state whole");
    println!("--- | ---: | ---: | ---: | ---: | ---");
    let (mut whole, mut all) = (0, 0);
    for info in plugins(&dirs) {
        let name = Path::new(&info.uri).file_name().map_or(info.uri.clone(), |n| n.to_string_lossy().into_owned());
        match measure(&info) {
            Ok(m) => {
                all += 1;
                whole += usize::from(m.whole);
                println!(
                    "{} | {} | {:.3} ms | {:.2} ms | {:.2}% | {}",
                    info.uri,
                    m.bytes,
                    m.save.as_secs_f64() * 1e3,
                    m.second.as_secs_f64() * 1e3,
                    100.0 * m.save.as_secs_f64() / m.second.as_secs_f64().max(1e-9),
                    if m.whole { "yes" } else { "no" }
                );
            }
            Err(e) => eprintln!("{name}: skipped: {e}"),
        }
    }
    println!("\n{whole} of {all} plugins' saved state is whole");
}
