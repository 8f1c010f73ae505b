//! The classes in mpk domains: a class adapter and its plugin loaded together into one protection domain of the
//! host's own process, where the domain runtime's `dlopen` and `dlsym` answer from what was loaded, and the
//! adapter's guard pages come from the runtime's `mmap` and `mprotect`.
//!
//! LV2 plugins come with their bundles: the ports are read from the bundle as a host reads them.
//!
//! These need PKU and are marked `#[ignore = "needs PKU"]`, so a plain `cargo test` reports them as not run;
//! `scripts/test` runs them where the processor has PKU and inside an emulated machine that has it where it has
//! not. On a machine without PKU, the one test that runs checks what a host gets there instead.

use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;

use common::{image, require_pku};

use ward::{Error, Isolation, Policy, Supervisor};
use ward_classes::lv2::{self, bundle, Host, UridMap};
use ward_classes::{frei0r, ladspa, ClassError, Processed};

const AMP: &str = "/usr/lib/ladspa/amp.so";
const INVERT0R: &str = "/usr/lib/frei0r-1/invert0r.so";
const SWH_AMP_LV2: &str = "/usr/lib/lv2/amp-swh.lv2/plugin-linux.so";
const SWH_AMP_URI: &str = "http://plugin.org.uk/swh-plugins/amp";
const X42_BALANCE: &str = "/usr/lib/lv2/balance.lv2/balance.so";
const X42_BALANCE_URI: &str = "http://gareus.org/oss/lv2/balance";

fn installed(path: &str) -> &Path {
    let path = Path::new(path);
    assert!(path.exists(), "{} is missing: run scripts/deps", path.display());
    path
}

/// Without PKU, a plugin asked for in an mpk domain is refused with the reason, and `auto` runs it in a process.
#[test]
fn without_pku_an_mpk_domain_is_refused_and_auto_runs_the_plugin_in_a_process() {
    if ward::mpk_available() {
        eprintln!("this machine has PKU: the test of its absence did not run here");
        return;
    }
    let sup = Supervisor::new(Policy::default());
    let err = ladspa::Library::open(&sup, installed(AMP), Some(Isolation::Mpk)).err();
    assert!(
        matches!(err, Some(ClassError::Ward(Error::IsolationUnavailable(..)))),
        "mpk without PKU must be refused: {err:?}"
    );
    let auto = ladspa::Library::open(&sup, installed(AMP), Some(Isolation::Auto)).unwrap();
    assert_eq!(auto.extension().isolation(), Isolation::Process);
}

fn block(input: &[f32], gain: f32, isolation: Isolation) -> (Isolation, Vec<f32>) {
    let sup = Supervisor::new(Policy::default());
    let lib = ladspa::Library::open(&sup, installed(AMP), Some(isolation)).unwrap();
    let mut inst = lib.instantiate(0, 48000).unwrap();
    assert_eq!(inst.activate().unwrap(), Processed::Ran);
    let mut out = vec![0f32; input.len()];
    let ports = &mut [
        ladspa::PortBuffer::Input(&[gain]),
        ladspa::PortBuffer::Input(input),
        ladspa::PortBuffer::Output(&mut out),
    ];
    assert_eq!(inst.run(input.len(), ports).unwrap(), Processed::Ran);
    (lib.extension().isolation(), out)
}

#[test]
#[ignore = "needs PKU"]
fn a_ladspa_plugin_runs_in_an_mpk_domain_with_its_adapter_and_matches_none() {
    require_pku();
    let input: Vec<f32> = (0..4096).map(|i| ((i as f32) * 0.01).sin()).collect();
    let (isolation, mpk) = block(&input, 0.5, Isolation::Mpk);
    assert_eq!(isolation, Isolation::Mpk);
    let (_, none) = block(&input, 0.5, Isolation::None);
    assert_eq!(mpk, none);
    assert_eq!(mpk, input.iter().map(|x| x * 0.5).collect::<Vec<_>>());
    let (isolation, _) = block(&input, 0.5, Isolation::Auto);
    assert_eq!(isolation, Isolation::Mpk, "auto takes mpk where PKU is");
}

#[test]
#[ignore = "needs PKU"]
fn a_library_that_is_no_plugin_is_refused_by_name_in_an_mpk_domain() {
    require_pku();
    let sup = Supervisor::new(Policy::default());
    let err = ladspa::Library::open(&sup, installed(INVERT0R), Some(Isolation::Mpk)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ClassError::NotAPlugin { .. }), "{msg}");
    assert!(msg.contains("ladspa_descriptor"), "the adapter's reason comes back: {msg}");
}

#[test]
#[ignore = "needs PKU"]
fn a_frei0r_filter_runs_in_an_mpk_domain_with_guarded_frames_and_matches_none() {
    require_pku();
    let plugin: PathBuf = installed(INVERT0R).to_path_buf();
    let (w, h) = (64u32, 36u32);
    let input = image(1, (w * h) as usize);
    let mut results = Vec::new();
    for iso in [Isolation::Mpk, Isolation::None] {
        let sup = Supervisor::new(Policy::default());
        let lib = frei0r::Library::open(&sup, &plugin, Some(iso)).unwrap();
        assert_eq!(lib.extension().isolation(), iso);
        assert_eq!(lib.info().name, "Invert0r");
        let mut inst = lib.construct(w, h).unwrap();
        let mut out = vec![0u32; input.len()];
        for frame in 0..3 {
            assert_eq!(inst.update(f64::from(frame) / 25.0, &input, &mut out).unwrap(), Processed::Ran, "{iso:?}");
        }
        // A second instance of the same library: the adapter finds it opened already (its lock, its list).
        let mut second = lib.construct(w, h).unwrap();
        let mut again = vec![0u32; input.len()];
        assert_eq!(second.update(1.0, &input, &mut again).unwrap(), Processed::Ran);
        assert!(again == out, "{iso:?}: the second instance differs");
        results.push(out);
    }
    assert!(results[0] == results[1], "mpk and none differ");
    assert!(results[0].iter().zip(&input).all(|(o, i)| o & 0x00FF_FFFF == (i ^ 0x00FF_FFFF) & 0x00FF_FFFF));
}

// ---- LV2 ---------------------------------------------------------------------------------------------------------

#[test]
fn without_pku_an_lv2_plugin_asked_for_mpk_is_refused_and_auto_runs_it_in_a_process() {
    if ward::mpk_available() {
        eprintln!("this machine has PKU: the test of its absence did not run here");
        return;
    }
    let sup = Supervisor::new(Policy::default());
    let err = lv2::Library::open(&sup, installed(SWH_AMP_LV2), Some(Isolation::Mpk)).err();
    assert!(
        matches!(err, Some(ClassError::Ward(Error::IsolationUnavailable(..)))),
        "mpk without PKU must be refused: {err:?}"
    );
    let auto = lv2::Library::open(&sup, installed(SWH_AMP_LV2), Some(Isolation::Auto)).unwrap();
    assert_eq!(auto.extension().isolation(), Isolation::Process);
}

/// What an LV2 plugin gave over some blocks: every output port's data, block after block, by port index.
#[derive(Debug, PartialEq)]
struct Lv2Run {
    isolation: Isolation,
    /// Audio, CV and control outputs: their samples (one per block for a control port).
    samples: Vec<Vec<f32>>,
    /// Atom outputs: their bytes, header included, block after block.
    atoms: Vec<Vec<u8>>,
}

const LV2_BLOCKS: usize = 6;
const LV2_FRAMES: usize = 256;

/// The test signal of input port `index` in block `block`: a different sine for each port, never silent.
fn lv2_signal(index: u32, block: usize) -> Vec<f32> {
    let step = 0.01 + 0.003 * index as f32;
    (0..LV2_FRAMES).map(|i| (((block * LV2_FRAMES + i) as f32) * step).sin() * 0.5).collect()
}

/// Runs plugin `uri` of `binary` in a domain of `isolation` for [`LV2_BLOCKS`] blocks, its ports as its bundle
/// describes them: control inputs at `controls` (by symbol) or their default, audio and CV inputs on
/// [`lv2_signal`], atom inputs an empty sequence, atom outputs of their declared minimum size.
fn run_lv2(binary: &str, uri: &str, isolation: Isolation, controls: &[(&str, f32)], features: lv2::Features) -> Lv2Run {
    let infos = bundle::plugins_of_binary(installed(binary)).unwrap_or_else(|e| panic!("{binary}: {e}"));
    let info = infos.into_iter().find(|p| p.uri == uri).unwrap_or_else(|| panic!("{binary}: no plugin {uri}"));
    let host = Arc::new(UridMap::new());
    let sequence = host.map(lv2::uri::ATOM_SEQUENCE);
    let chunk = host.map(lv2::uri::ATOM_CHUNK);
    let sup = Supervisor::new(Policy::default());
    let lib = lv2::Library::open(&sup, installed(binary), Some(isolation)).unwrap();
    let index = lib.plugin(uri).unwrap().index;
    let setup = lv2::Setup {
        sample_rate: 48000.0,
        bundle: info.bundle.clone(),
        ports: info.ports.iter().map(lv2::PortSpec::from).collect(),
        features,
        host: host.clone(),
        realtime: false,
    };
    let inst = lib.instantiate(index, setup).unwrap();
    assert_eq!(inst.activate().unwrap(), Processed::Ran);
    let n = info.ports.len();
    let mut run =
        Lv2Run { isolation: lib.extension().isolation(), samples: vec![Vec::new(); n], atoms: vec![Vec::new(); n] };
    for block in 0..LV2_BLOCKS {
        let mut samples: Vec<Vec<f32>> = info
            .ports
            .iter()
            .map(|p| match (&p.kind, p.direction) {
                (bundle::PortKind::Control, bundle::Direction::Input) => {
                    let set = controls.iter().find(|(symbol, _)| *symbol == p.symbol).map(|(_, v)| *v);
                    vec![set.or(p.default).unwrap_or(0.0)]
                }
                (bundle::PortKind::Control, bundle::Direction::Output) => vec![0.0],
                (bundle::PortKind::Audio | bundle::PortKind::Cv, bundle::Direction::Input) => {
                    lv2_signal(p.index, block)
                }
                (bundle::PortKind::Audio | bundle::PortKind::Cv, bundle::Direction::Output) => vec![0.0; LV2_FRAMES],
                _ => Vec::new(),
            })
            .collect();
        let mut atoms: Vec<Vec<u8>> = info
            .ports
            .iter()
            .map(|p| {
                let atom = |size: u32, kind: u32, body: usize| {
                    let mut b = size.to_le_bytes().to_vec();
                    b.extend_from_slice(&kind.to_le_bytes());
                    b.resize(8 + body, 0);
                    b
                };
                match (&p.kind, p.direction) {
                    // An empty sequence: the header, then its body's unit and padding.
                    (bundle::PortKind::Atom { .. }, bundle::Direction::Input) => atom(8, sequence, 8),
                    // Room for the plugin, its size in the header (as LV2 hosts hand an output over).
                    (bundle::PortKind::Atom { .. }, bundle::Direction::Output) => {
                        let capacity = p.minimum_size.unwrap_or(8192).max(64);
                        atom(capacity - 8, chunk, capacity as usize - 8)
                    }
                    _ => Vec::new(),
                }
            })
            .collect();
        let mut ports: Vec<lv2::PortBuffer<'_>> = info
            .ports
            .iter()
            .zip(samples.iter_mut().zip(atoms.iter_mut()))
            .map(|(p, (s, a))| match (&p.kind, p.direction) {
                (bundle::PortKind::Atom { .. }, bundle::Direction::Input) => lv2::PortBuffer::AtomInput(a),
                (bundle::PortKind::Atom { .. }, bundle::Direction::Output) => lv2::PortBuffer::AtomOutput(a),
                (bundle::PortKind::Other(_), _) => lv2::PortBuffer::Unconnected,
                (_, bundle::Direction::Input) => lv2::PortBuffer::Input(s),
                (_, bundle::Direction::Output) => lv2::PortBuffer::Output(s),
            })
            .collect();
        assert_eq!(inst.run(LV2_FRAMES, &mut ports).unwrap(), Processed::Ran, "{isolation:?}, block {block}");
        drop(ports);
        for (i, p) in info.ports.iter().enumerate() {
            if p.direction == bundle::Direction::Output {
                run.samples[i].extend_from_slice(&samples[i]);
                run.atoms[i].extend_from_slice(&atoms[i]);
            }
        }
    }
    run
}

#[test]
#[ignore = "needs PKU"]
fn an_lv2_plugin_runs_in_an_mpk_domain_with_its_adapter_and_matches_none() {
    require_pku();
    let gain = [("gain", 20.0)];
    let mpk = run_lv2(SWH_AMP_LV2, SWH_AMP_URI, Isolation::Mpk, &gain, lv2::Features::default());
    assert_eq!(mpk.isolation, Isolation::Mpk);
    let none = run_lv2(SWH_AMP_LV2, SWH_AMP_URI, Isolation::None, &gain, lv2::Features::default());
    assert_eq!(none.isolation, Isolation::None);
    assert!(mpk.samples == none.samples && mpk.atoms == none.atoms, "mpk and none differ");
    // swh's amp: port 2 is its output, port 1 its input; +20 dB is a gain of exactly 10.
    let input: Vec<f32> = (0..LV2_BLOCKS).flat_map(|block| lv2_signal(1, block)).collect();
    assert_eq!(mpk.samples[2], input.iter().map(|x| x * 10.0).collect::<Vec<_>>());
    let auto = run_lv2(SWH_AMP_LV2, SWH_AMP_URI, Isolation::Auto, &gain, lv2::Features::default());
    assert_eq!(auto.isolation, Isolation::Mpk, "auto takes mpk where PKU is");
}

/// x42's balance requires the URID map, which it calls from `instantiate`: from inside an mpk domain the call leaves
/// through the instance's callback to the host's map. It has atom ports in and out.
#[test]
#[ignore = "needs PKU"]
fn an_lv2_plugin_mapping_uris_through_the_host_runs_in_an_mpk_domain_and_matches_none() {
    require_pku();
    let features = || lv2::Features { urid_map: true, ..lv2::Features::default() };
    let controls = [("balance", 0.25), ("trim", -3.0)];
    let mpk = run_lv2(X42_BALANCE, X42_BALANCE_URI, Isolation::Mpk, &controls, features());
    assert_eq!(mpk.isolation, Isolation::Mpk);
    let none = run_lv2(X42_BALANCE, X42_BALANCE_URI, Isolation::None, &controls, features());
    assert_eq!(mpk, Lv2Run { isolation: Isolation::Mpk, ..none });
    assert!(mpk.samples.iter().any(|s| s.iter().any(|&x| x != 0.0)), "the balance gave only silence");
}
