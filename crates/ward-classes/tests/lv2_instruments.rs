//! The LV2 instrument corpus: every instrument in Debian's swh-lv2, mda-lv2, x42-plugins, lsp-plugins-lv2 and
//! zam-plugins (installed by scripts/deps; their bundles found with `dpkg -L`), plus ward's built-in synth, driven
//! with one fixed MIDI sequence natively (`native_calls::lv2`, twice) and through the class under `Isolation::None`
//! and `Isolation::Process`, every output port compared bit for bit (an atom output by the bytes of its atom).
//!
//! An instrument is a plugin of type `lv2:InstrumentPlugin`, or one with an atom input that supports
//! `midi:MidiEvent`, no audio input and at least one audio output. The table of verdicts is printed and written to
//! `target/lv2-instruments.md` (docs/CORPUS.md carries it).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ward::{Isolation, Policy, Supervisor};
use ward_classes::lv2::bundle::{self, Direction, PluginInfo, PortInfo, PortKind as BundleKind};
use ward_classes::lv2::{uri, Features, Host, Library, OptionValue, PortBuffer, PortSpec, Setup, UridMap};
use ward_classes::native_calls::lv2 as native;
use ward_classes::Processed;

const PACKAGES: &[&str] = &["swh-lv2", "mda-lv2", "x42-plugins", "lsp-plugins-lv2", "zam-plugins"];
const RATE: f64 = 48000.0;
const BLOCK: usize = 512;
/// 188 blocks of 512 frames: just over 2 s at 48 kHz.
const BLOCKS: usize = 188;
/// The capacity of an atom port that declares no minimum size.
const ATOM_CAPACITY: usize = 8192;

const INSTRUMENT_PLUGIN: &str = "http://lv2plug.in/ns/lv2core#InstrumentPlugin";
const MIDI_EVENT: &str = "http://lv2plug.in/ns/ext/midi#MidiEvent";
const IN_PLACE_BROKEN: &str = "http://lv2plug.in/ns/lv2core#inPlaceBroken";
const ATOM_INT: &str = "http://lv2plug.in/ns/ext/atom#Int";
const MIN_BLOCK_LENGTH: &str = "http://lv2plug.in/ns/ext/buf-size#minBlockLength";
const MAX_BLOCK_LENGTH: &str = "http://lv2plug.in/ns/ext/buf-size#maxBlockLength";
const NOMINAL_BLOCK_LENGTH: &str = "http://lv2plug.in/ns/ext/buf-size#nominalBlockLength";
const SYNTH: &str = "urn:ward:lv2:synth";

/// The MIDI sequence: (block, frame in the block, message). Notes on and off at varied offsets and velocities, two
/// events at one frame, a note on at a block's last frame, and a release that rings out to the end.
const MIDI: &[(usize, u32, [u8; 3])] = &[
    (0, 0, [0x90, 60, 100]),
    (3, 100, [0x90, 64, 80]),
    (10, 511, [0x90, 67, 127]),
    (20, 256, [0x80, 60, 0]),
    (30, 17, [0x80, 64, 64]),
    (30, 17, [0x90, 72, 40]),
    (45, 300, [0x90, 48, 90]),
    (60, 1, [0x80, 67, 0]),
    (60, 300, [0x80, 72, 0]),
    (80, 5, [0x90, 55, 64]),
    (80, 6, [0x90, 59, 70]),
    (100, 480, [0x80, 48, 0]),
    (120, 200, [0x80, 55, 0]),
    (121, 0, [0x80, 59, 0]),
];

/// URIs every host maps first, in this order, so that each run (native or not) numbers them alike.
const PREMAPPED: &[&str] = &[
    uri::ATOM_SEQUENCE,
    uri::ATOM_FRAME_TIME,
    uri::ATOM_CHUNK,
    MIDI_EVENT,
    ATOM_INT,
    MIN_BLOCK_LENGTH,
    MAX_BLOCK_LENGTH,
    NOMINAL_BLOCK_LENGTH,
];

/// The features both hosts offer: the ones `native_calls::lv2` has (the class has them all).
const OFFERED: &[&str] = &[
    uri::URID_MAP,
    uri::URID_UNMAP,
    uri::OPTIONS,
    uri::BOUNDED_BLOCK_LENGTH,
    uri::FIXED_BLOCK_LENGTH,
    uri::POWER_OF_2_BLOCK_LENGTH,
];

/// One instrument to run.
struct Instrument {
    package: String,
    info: PluginInfo,
}

fn package_version(package: &str) -> String {
    let out = Command::new("dpkg-query").args(["-W", "-f=${Version}", package]).output().expect("dpkg-query runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The bundle directories the package installed.
fn bundles_of(package: &str) -> Vec<PathBuf> {
    let out = Command::new("dpkg").args(["-L", package]).output().expect("dpkg runs");
    assert!(
        out.status.success(),
        "{package} is not installed: run scripts/deps (it installs Debian's LV2 plugin packages)"
    );
    let mut dirs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.extension().is_some_and(|e| e == "lv2") && p.join("manifest.ttl").is_file())
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

fn is_instrument(info: &PluginInfo) -> bool {
    let audio = |dir| info.ports.iter().any(|p| p.kind == BundleKind::Audio && p.direction == dir);
    let midi_in = info.ports.iter().any(|p| {
        matches!(p.kind, BundleKind::Atom { .. })
            && p.direction == Direction::Input
            && p.supports.iter().any(|s| s == MIDI_EVENT)
    });
    info.types.iter().any(|t| t == INSTRUMENT_PLUGIN)
        || (midi_in && !audio(Direction::Input) && audio(Direction::Output))
}

/// Every instrument of the packages, then the built-in synth; bundles that cannot be read, with the reason.
fn corpus() -> (Vec<Instrument>, Vec<String>) {
    let mut found = Vec::new();
    let mut unread = Vec::new();
    for package in PACKAGES {
        for dir in bundles_of(package) {
            match bundle::read_bundle(&dir) {
                Ok(b) => found.extend(
                    b.plugins
                        .into_iter()
                        .filter(is_instrument)
                        .map(|info| Instrument { package: package.to_string(), info }),
                ),
                Err(e) => unread.push(format!("{package}: {e}")),
            }
        }
    }
    let dir = ward_extensions::lv2_bundle_of("lv2_synth").expect("the built-in bundles are written");
    let synth = bundle::read_bundle(&dir).expect("the built-in synth's bundle reads");
    let info = synth.plugins.into_iter().find(|p| p.uri == SYNTH).expect("the synth's bundle declares it");
    assert!(is_instrument(&info), "the built-in synth counts as an instrument");
    found.push(Instrument { package: "ward (built in)".into(), info });
    found.sort_by(|a, b| (&a.package, &a.info.uri).cmp(&(&b.package, &b.info.uri)));
    found.dedup_by(|a, b| a.info.uri == b.info.uri);
    (found, unread)
}

/// A URID map with [`PREMAPPED`] mapped, in order.
fn host_map() -> Arc<UridMap> {
    let map = Arc::new(UridMap::new());
    for u in PREMAPPED {
        map.map(u);
    }
    map
}

fn setup(info: &PluginInfo, map: &Arc<UridMap>) -> Setup {
    let int = map.map(ATOM_INT);
    let block_length = |key: &str| OptionValue {
        context: 0,
        subject: 0,
        key: map.map(key),
        value_type: int,
        value: (BLOCK as i32).to_le_bytes().to_vec(),
    };
    Setup {
        sample_rate: RATE,
        bundle: info.bundle.clone(),
        ports: info.ports.iter().map(PortSpec::from).collect(),
        features: Features {
            urid_map: true,
            urid_unmap: true,
            bounded_block_length: true,
            fixed_block_length: true,
            power_of_2_block_length: true,
            options: Some([MIN_BLOCK_LENGTH, MAX_BLOCK_LENGTH, NOMINAL_BLOCK_LENGTH].map(block_length).to_vec()),
            ..Features::default()
        },
        host: Arc::clone(map) as Arc<dyn Host>,
        realtime: false,
    }
}

/// A required feature neither host offers, if the plugin has one.
fn missing_feature(info: &PluginInfo) -> Option<&str> {
    info.required_features.iter().map(String::as_str).find(|f| !OFFERED.contains(f) && *f != IN_PLACE_BROKEN)
}

/// The buffer of one port, kept across blocks.
enum Store {
    In(Vec<f32>),
    Out(Vec<f32>),
    AtomIn { words: Vec<u64>, midi: bool },
    AtomOut(Vec<u64>),
    Unconnected,
}

fn atom_words(p: &PortInfo) -> Vec<u64> {
    vec![0u64; (p.minimum_size.map_or(ATOM_CAPACITY, |s| s as usize).max(64)).div_ceil(8)]
}

fn stores(info: &PluginInfo) -> Vec<Store> {
    info.ports
        .iter()
        .map(|p| match (&p.kind, p.direction) {
            (BundleKind::Audio | BundleKind::Cv, Direction::Input) => Store::In(vec![0.0; BLOCK]),
            (BundleKind::Audio | BundleKind::Cv, Direction::Output) => Store::Out(vec![0.0; BLOCK]),
            (BundleKind::Control, Direction::Input) => Store::In(vec![p.default.or(p.minimum).unwrap_or(0.0)]),
            (BundleKind::Control, Direction::Output) => Store::Out(vec![0.0]),
            (BundleKind::Atom { .. }, Direction::Input) => {
                Store::AtomIn { words: atom_words(p), midi: p.supports.iter().any(|s| s == MIDI_EVENT) }
            }
            (BundleKind::Atom { .. }, Direction::Output) => Store::AtomOut(atom_words(p)),
            (BundleKind::Other(_), _) => Store::Unconnected,
        })
        .collect()
}

/// The sample `i` of the test signal of audio input `port` (for instruments that also take audio): a quiet sine
/// whose pitch depends on the port.
fn signal(port: usize, i: usize) -> f32 {
    let f = 220.0 * (1.0 + port as f32 * 0.25);
    (i as f32 * f * std::f32::consts::TAU / RATE as f32).sin() * 0.25
}

/// Write block `b`'s inputs into the stores: the signal, the MIDI events of the block (an empty sequence for an atom
/// input that takes no MIDI), and atom outputs emptied with their header's type Chunk.
fn fill(stores: &mut [Store], b: usize, map: &UridMap) {
    let (sequence, chunk, midi_event) = (map.map(uri::ATOM_SEQUENCE), map.map(uri::ATOM_CHUNK), map.map(MIDI_EVENT));
    for (port, s) in stores.iter_mut().enumerate() {
        match s {
            Store::In(v) if v.len() == BLOCK => {
                v.iter_mut().enumerate().for_each(|(i, x)| *x = signal(port, b * BLOCK + i));
            }
            Store::AtomIn { words, midi } => {
                let mut body = vec![0u8; 8]; // unit 0, pad 0
                for (_, frame, msg) in MIDI.iter().filter(|e| *midi && e.0 == b) {
                    body.extend_from_slice(&i64::from(*frame).to_le_bytes());
                    body.extend_from_slice(&(msg.len() as u32).to_le_bytes());
                    body.extend_from_slice(&midi_event.to_le_bytes());
                    body.extend_from_slice(msg);
                    body.resize(body.len().next_multiple_of(8), 0);
                }
                let bytes = bytemuck::cast_slice_mut::<u64, u8>(words);
                bytes.fill(0);
                bytes[0..4].copy_from_slice(&(body.len() as u32).to_le_bytes());
                bytes[4..8].copy_from_slice(&sequence.to_le_bytes());
                bytes[8..8 + body.len()].copy_from_slice(&body);
            }
            Store::AtomOut(words) => {
                let bytes = bytemuck::cast_slice_mut::<u64, u8>(words);
                bytes.fill(0);
                let capacity = (bytes.len() - 8) as u32;
                bytes[0..4].copy_from_slice(&capacity.to_le_bytes());
                bytes[4..8].copy_from_slice(&chunk.to_le_bytes());
            }
            _ => {}
        }
    }
}

fn buffers(stores: &mut [Store]) -> Vec<PortBuffer<'_>> {
    stores
        .iter_mut()
        .map(|s| match s {
            Store::In(v) => PortBuffer::Input(v),
            Store::Out(v) => PortBuffer::Output(v),
            Store::AtomIn { words, .. } => PortBuffer::AtomInput(bytemuck::cast_slice(words)),
            Store::AtomOut(words) => PortBuffer::AtomOutput(bytemuck::cast_slice_mut(words)),
            Store::Unconnected => PortBuffer::Unconnected,
        })
        .collect()
}

/// Every output port's data over the whole run: samples as bits, an atom as its header and body per block.
type Outputs = BTreeMap<usize, Vec<u8>>;

fn record(stores: &[Store], outputs: &mut Outputs) {
    for (port, s) in stores.iter().enumerate() {
        let bytes: &[u8] = match s {
            Store::Out(v) => bytemuck::cast_slice(v),
            Store::AtomOut(words) => {
                let b = bytemuck::cast_slice::<u64, u8>(words);
                let size = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
                &b[..(8 + size).min(b.len())]
            }
            _ => continue,
        };
        outputs.entry(port).or_default().extend_from_slice(bytes);
    }
}

/// Drive an instance through the sequence: `block` runs one block on the buffers.
fn drive(
    info: &PluginInfo,
    map: &UridMap,
    mut block: impl FnMut(usize, &mut [PortBuffer<'_>]) -> Result<(), String>,
) -> Result<Outputs, String> {
    let mut stores = stores(info);
    let mut outputs = Outputs::new();
    for b in 0..BLOCKS {
        fill(&mut stores, b, map);
        block(b, &mut buffers(&mut stores))?;
        record(&stores, &mut outputs);
    }
    Ok(outputs)
}

fn run_native(info: &PluginInfo) -> Result<Outputs, String> {
    let map = host_map();
    let lib = native::Library::open(&info.binary).map_err(|e| e.to_string())?;
    let plugin = lib.find(&info.uri).map_err(|e| e.to_string())?;
    let mut inst = plugin.instantiate(setup(info, &map)).map_err(|e| format!("instantiate: {e}"))?;
    inst.activate();
    let out = drive(info, &map, |b, ports| inst.run(BLOCK, ports).map_err(|e| format!("block {b}: {e}")))?;
    inst.deactivate();
    Ok(out)
}

/// The libraries opened under ward, by isolation and binary (one domain per binary, as a host would have).
struct Ward {
    supervisor: Supervisor,
    libraries: HashMap<(String, PathBuf), Library>,
}

impl Ward {
    fn library(&mut self, iso: Isolation, binary: &Path) -> Result<Library, String> {
        let key = (format!("{iso:?}"), binary.to_path_buf());
        if let Some(lib) = self.libraries.get(&key) {
            return Ok(lib.clone());
        }
        let lib = Library::open(&self.supervisor, binary, Some(iso)).map_err(|e| format!("open: {e}"))?;
        self.libraries.insert(key, lib.clone());
        Ok(lib)
    }

    fn run(&mut self, iso: Isolation, info: &PluginInfo) -> Result<Outputs, String> {
        let map = host_map();
        let lib = self.library(iso, &info.binary)?;
        let d = lib.plugin(&info.uri).map_err(|e| e.to_string())?.clone();
        let inst = lib.instantiate(d.index, setup(info, &map)).map_err(|e| format!("instantiate: {e}"))?;
        let ran = |p: Processed, what: &str| match p {
            Processed::Ran => Ok(()),
            Processed::Bypassed { reason } => Err(format!("{what} bypassed: {reason}")),
        };
        ran(inst.activate().map_err(|e| format!("activate: {e}"))?, "activate")?;
        let out = drive(info, &map, |b, ports| {
            let p = inst.run(BLOCK, ports).map_err(|e| format!("block {b}: {e}"))?;
            ran(p, &format!("block {b}"))
        })?;
        ran(inst.deactivate().map_err(|e| format!("deactivate: {e}"))?, "deactivate")?;
        Ok(out)
    }
}

/// Where two runs' outputs first differ, said for a person.
fn first_difference(info: &PluginInfo, a: &Outputs, b: &Outputs) -> Option<String> {
    for (port, x) in a {
        let Some(y) = b.get(port) else {
            return Some(format!("port {port} missing"));
        };
        if x == y {
            continue;
        }
        let symbol = &info.ports[*port].symbol;
        let at = x.iter().zip(y).position(|(p, q)| p != q).unwrap_or(x.len().min(y.len()));
        return Some(match info.ports[*port].kind {
            BundleKind::Audio | BundleKind::Cv => {
                let sample = at / 4;
                format!("port {port} ({symbol}) first differs at block {}, frame {}", sample / BLOCK, sample % BLOCK)
            }
            BundleKind::Control => format!("control output {port} ({symbol}) first differs at block {}", at / 4),
            _ => format!("atom output {port} ({symbol}) first differs at byte {at} of {}", x.len()),
        });
    }
    None
}

/// The largest magnitude of the audio outputs' samples: whether the plugin made a sound at all.
fn peak(info: &PluginInfo, outputs: &Outputs) -> f32 {
    outputs
        .iter()
        .filter(|(port, _)| info.ports[**port].kind == BundleKind::Audio)
        .flat_map(|(_, bytes)| bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).abs()))
        .fold(0.0, f32::max)
}

#[derive(Clone)]
enum Verdict {
    Identical,
    Differs(String),
    /// Natively not run (a required feature neither host offers) or failed: nothing to compare with.
    CannotRun(String),
    /// Its two native runs differ: not compared.
    Nondeterministic(String),
}

impl Verdict {
    fn cell(&self) -> String {
        match self {
            Verdict::Identical => "identical".into(),
            Verdict::Differs(why) => format!("**differs**: {why}"),
            Verdict::CannotRun(why) => format!("cannot run: {why}"),
            Verdict::Nondeterministic(why) => format!("nondeterministic: {why}"),
        }
    }
}

fn cell_text(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

#[test]
fn every_lv2_instrument_sounds_the_same_under_ward_as_natively() {
    let started = std::time::Instant::now();
    let (instruments, unread) = corpus();
    assert!(instruments.len() > 1, "no instrument found in {PACKAGES:?}");
    let kinds = [Isolation::None, Isolation::Process];
    let mut ward = Ward { supervisor: Supervisor::new(Policy::default()), libraries: HashMap::new() };
    let mut rows = Vec::new();
    for inst in &instruments {
        let info = &inst.info;
        let (native, verdicts): (String, Vec<Verdict>) = match missing_feature(info) {
            Some(f) => {
                let why = format!("requires {f}, which neither host offers");
                (format!("cannot run: {why}"), vec![Verdict::CannotRun(why); kinds.len()])
            }
            None => match (run_native(info), run_native(info)) {
                (Err(e), _) | (_, Err(e)) => (format!("fails: {e}"), vec![Verdict::CannotRun(e); kinds.len()]),
                (Ok(a), Ok(b)) => match first_difference(info, &a, &b) {
                    Some(d) => {
                        let v = Verdict::Nondeterministic(format!("two native runs differ: {d}"));
                        ("ran, nondeterministic".into(), vec![v; kinds.len()])
                    }
                    None => {
                        let native = format!("ran, peak {:.3}", peak(info, &a));
                        let verdicts = kinds
                            .iter()
                            .map(|&iso| match ward.run(iso, info) {
                                Err(e) => Verdict::Differs(e),
                                Ok(w) => match first_difference(info, &a, &w) {
                                    None => Verdict::Identical,
                                    Some(d) => Verdict::Differs(d),
                                },
                            })
                            .collect();
                        (native, verdicts)
                    }
                },
            },
        };
        rows.push((inst, native, verdicts));
    }

    let mut table = String::new();
    let versions: Vec<String> = PACKAGES.iter().map(|p| format!("{p} {}", package_version(p))).collect();
    let _ = writeln!(
        table,
        "{} instruments ({}, and ward's built-in synth); {BLOCKS} blocks of {BLOCK} frames at {RATE} Hz, {} MIDI events; \
         {:.1} s.\n",
        rows.len(),
        versions.join(", "),
        MIDI.len(),
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(table, "| plugin | package | native (peak of its audio outputs) | none | process |");
    let _ = writeln!(table, "|---|---|---|---|---|");
    for (inst, native, verdicts) in &rows {
        let cells: Vec<String> = verdicts.iter().map(|v| cell_text(&v.cell())).collect();
        let _ = writeln!(
            table,
            "| `{}` | {} | {} | {} |",
            inst.info.uri,
            inst.package,
            cell_text(native),
            cells.join(" | ")
        );
    }
    for u in &unread {
        let _ = writeln!(table, "\nBundle not read: {}", cell_text(u));
    }
    println!("{table}");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let written =
        std::fs::create_dir_all(&target).and_then(|()| std::fs::write(target.join("lv2-instruments.md"), &table));
    if let Err(e) = written {
        println!("could not write {}: {e}", target.join("lv2-instruments.md").display());
    }

    let differ: Vec<String> = rows
        .iter()
        .flat_map(|(inst, _, verdicts)| {
            verdicts.iter().zip(kinds).filter_map(move |(v, iso)| match v {
                Verdict::Differs(why) => Some(format!("{} under {iso:?}: {why}", inst.info.uri)),
                _ => None,
            })
        })
        .collect();
    assert!(differ.is_empty(), "{} runs differ from native:\n{}", differ.len(), differ.join("\n"));
    let synth = rows.iter().find(|(i, _, _)| i.info.uri == SYNTH).expect("the synth is in the corpus");
    assert!(synth.2.iter().all(|v| matches!(v, Verdict::Identical)), "the built-in synth is compared and identical");
    assert!(synth.1.starts_with("ran, peak") && !synth.1.ends_with(" 0.000"), "the synth sounds: {}", synth.1);
}

#[test]
fn the_native_host_refuses_features_it_lacks_and_buffers_that_do_not_fit() {
    use ward_classes::NativeCallError;
    let dir = ward_extensions::lv2_bundle_of("lv2_synth").expect("the built-in bundles are written");
    let info = bundle::read_bundle(&dir).expect("reads").plugins.into_iter().find(|p| p.uri == SYNTH).expect("synth");
    let lib = native::Library::open(&info.binary).expect("the synth's binary loads");
    assert!(matches!(lib.find("urn:ward:lv2:none"), Err(NativeCallError::NoSuchPlugin { .. })));
    let plugin = lib.find(SYNTH).expect("the synth is in its binary");
    let map = host_map();
    for (log, worker) in [(true, false), (false, true)] {
        let mut s = setup(&info, &map);
        (s.features.log, s.features.worker_schedule) = (log, worker);
        assert!(matches!(plugin.instantiate(s), Err(NativeCallError::FeatureNotOffered { .. })));
    }
    let mut inst = plugin.instantiate(setup(&info, &map)).expect("instantiates with the corpus's features");
    inst.activate();
    assert!(matches!(inst.run(BLOCK, &mut []), Err(NativeCallError::PortCount { given: 0, .. })));
    // An atom input one byte off its 8-byte alignment, then an audio output a sample short of the block.
    let atom = info.ports.iter().position(|p| matches!(p.kind, BundleKind::Atom { .. })).expect("a MIDI input");
    let words = vec![0u64; 64];
    let mut kept = stores(&info);
    fill(&mut kept, 0, &map);
    let mut ports = buffers(&mut kept);
    ports[atom] = PortBuffer::AtomInput(&bytemuck::cast_slice::<u64, u8>(&words)[1..]);
    assert!(matches!(inst.run(BLOCK, &mut ports), Err(NativeCallError::WrongBuffer { port, .. }) if port == atom));
    let audio = info.ports.iter().position(|p| p.kind == BundleKind::Audio).expect("an audio output");
    let mut short = vec![0f32; BLOCK - 1];
    let mut kept = stores(&info);
    fill(&mut kept, 0, &map);
    let mut ports = buffers(&mut kept);
    ports[audio] = PortBuffer::Output(&mut short);
    assert!(matches!(inst.run(BLOCK, &mut ports), Err(NativeCallError::WrongBuffer { port, .. }) if port == audio));
    // With fitting buffers the same instance runs, and its first note sounds.
    let mut kept = stores(&info);
    fill(&mut kept, 0, &map);
    inst.run(BLOCK, &mut buffers(&mut kept)).expect("a block with fitting buffers runs");
    let mut out = Outputs::new();
    record(&kept, &mut out);
    assert!(peak(&info, &out) > 0.0, "the note on at frame 0 sounds in block 0");
}
