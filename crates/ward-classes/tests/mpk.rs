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

/// A host that keeps what an LV2 plugin logs, and makes paths under `/session/`.
#[derive(Default)]
struct LoggingHost {
    map: UridMap,
    logged: std::sync::Mutex<Vec<(u32, String)>>,
}

impl Host for LoggingHost {
    fn map(&self, uri: &str) -> u32 {
        self.map.map(uri)
    }
    fn unmap(&self, urid: u32) -> Option<String> {
        self.map.unmap(urid)
    }
    fn log(&self, log_type: u32, message: &str) {
        self.logged.lock().unwrap_or_else(|e| e.into_inner()).push((log_type, message.to_string()));
    }
    fn make_path(&self, path: &str) -> Option<String> {
        Some(format!("/session/{path}"))
    }
}

/// ward's built-in `lv2_options` logs a note from `instantiate` through `log:log`: from inside an mpk domain the
/// message (formatted there) leaves through the instance's callback and reaches the host's log. Its options are
/// got and set through the domain too, and the path its makePath got from the host comes back.
#[test]
#[ignore = "needs PKU"]
fn an_lv2_plugins_log_message_in_an_mpk_domain_reaches_the_hosts_log() {
    require_pku();
    let dir = ward_extensions::lv2_bundle_of("lv2_options").unwrap();
    let binary = dir.join("lv2_options.so");
    let infos = bundle::plugins_of_binary(&binary).unwrap();
    let sup = Supervisor::new(Policy::default());
    let lib = lv2::Library::open(&sup, &binary, Some(Isolation::Mpk)).unwrap();
    assert_eq!(lib.extension().isolation(), Isolation::Mpk);
    let host = Arc::new(LoggingHost::default());
    let setup = lv2::Setup {
        sample_rate: 48000.0,
        bundle: dir,
        ports: infos[0].ports.iter().map(lv2::PortSpec::from).collect(),
        features: lv2::Features {
            urid_map: true,
            log: true,
            paths: lv2::PathFeatures { make_path: true, ..lv2::PathFeatures::default() },
            ..lv2::Features::default()
        },
        host: host.clone(),
        realtime: false,
    };
    let inst = lib.instantiate(lib.plugin("urn:ward:lv2:options").unwrap().index, setup).unwrap();
    let note = host.map("http://lv2plug.in/ns/ext/log#Note");
    assert_eq!(
        *host.logged.lock().unwrap(),
        [(note, "lv2_options: instantiated at 48000 Hz\n".to_string())],
        "the plugin's message in the host's log"
    );
    let gain = lv2::OptionValue {
        context: 0,
        subject: 0,
        key: host.map("urn:ward:lv2:options#gain"),
        value_type: host.map("http://lv2plug.in/ns/ext/atom#Float"),
        value: 0.5f32.to_ne_bytes().to_vec(),
    };
    assert_eq!(inst.set_options(std::slice::from_ref(&gain)).unwrap(), 0);
    let got = inst.get_options(&[lv2::OptionKey { context: 0, subject: 0, key: gain.key }]).unwrap();
    assert_eq!(got.values, [Some(gain)]);
    let scratch = lv2::OptionKey { context: 0, subject: 0, key: host.map("urn:ward:lv2:options#scratch") };
    let got = inst.get_options(&[scratch]).unwrap();
    let value = got.values[0].as_ref().map(|v| v.value.as_slice());
    assert_eq!(value, Some(&b"/session/scratch.wav\0"[..]), "makePath reached the host and its answer the plugin");
    let input: Vec<f32> = (0..LV2_FRAMES).map(|i| i as f32).collect();
    let mut out = vec![0f32; LV2_FRAMES];
    let mut ports = [lv2::PortBuffer::Input(&input), lv2::PortBuffer::Output(&mut out)];
    assert_eq!(inst.run(LV2_FRAMES, &mut ports).unwrap(), Processed::Ran);
    assert_eq!(out, input.iter().map(|x| x * 0.5).collect::<Vec<_>>());
}

/// Runtimes (issue 32) in mpk domains: plugins compiled by libtcc inside the domain, their code made executable by
/// the domain runtime once scanned, linked, called and unlinked; after each kind of failure the other plugins
/// answer. The transforms' sources are built in, so the tests need no file inside the emulated machine.
mod runtime_in_mpk {
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use ward::{Arg, Error, Isolation, Policy, RetType, Signature, Supervisor, ValType, Value};
    use ward_classes::runtime::{Code, Runtime, RuntimeError, RuntimeOptions};

    use super::common::require_pku;

    const ADD: &str = "#include <stdint.h>\nint64_t add(int64_t a, int64_t b) { return a + b; }\n";
    const IMAGE_HEADER: &str = include_str!("../../../extensions/runtime/ward_image.h");
    const GRAYSCALE: &str = include_str!("../../../extensions/runtime/grayscale.c");
    const FAULTY: &str = include_str!("../../../extensions/runtime/faulty.c");
    const GRAY_PIXELS: [u8; 6] = [18, 18, 18, 76, 76, 76];

    fn options(isolation: Isolation) -> RuntimeOptions {
        // Generous: emulation is slow, and the machine may be loaded; the looping plugin is the only one that
        // reaches the quantum.
        RuntimeOptions {
            isolation: Some(isolation),
            quantum: Duration::from_secs(5),
            compile_deadline: Duration::from_secs(120),
            ..RuntimeOptions::default()
        }
    }

    fn runtime_with_basics(sup: &Supervisor) -> Runtime {
        require_pku();
        let rt = Runtime::open(sup, "basics", &options(Isolation::Mpk)).unwrap();
        assert_eq!(rt.isolation(), Isolation::Mpk);
        rt.header("ward_image.h", IMAGE_HEADER).unwrap();
        rt.create("add", Code::Source(ADD)).unwrap();
        rt.create("grayscale", Code::Source(GRAYSCALE)).unwrap();
        rt
    }

    fn add(rt: &Runtime, a: i64, b: i64) -> i64 {
        let id = rt.lookup("add").expect("add is linked");
        rt.call(id, &mut [Arg::I64(a), Arg::I64(b)], RetType::I64).unwrap().as_i64().unwrap()
    }

    fn gray(rt: &Runtime) -> Vec<u8> {
        let id = rt.lookup("grayscale").expect("grayscale is linked");
        let input = [10u8, 20, 30, 255, 0, 0];
        let mut out = vec![0u8; 16 + 6];
        let n = rt
            .call(id, &mut [Arg::In(&input), Arg::I64(2), Arg::I64(1), Arg::Out(&mut out), Arg::I64(22)], RetType::I64)
            .unwrap();
        assert_eq!(n.as_i64(), Some(22));
        assert_eq!(&out[..16], &[2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        out[16..].to_vec()
    }

    /// The other plugins answer, and the runtime still compiles.
    fn the_others_answer(rt: &Runtime) {
        assert_eq!(add(rt, 30, 12), 42);
        assert_eq!(gray(rt), GRAY_PIXELS);
        let name = format!("later{}", rt.plugins().len());
        let id = rt.create(&name, Code::Source(&format!("long {name}(long a) {{ return a + 2; }}"))).unwrap();
        assert_eq!(rt.call(id, &mut [Arg::I64(40)], RetType::I64).unwrap(), Value::I64(42));
    }

    #[test]
    fn without_pku_a_runtime_asked_for_mpk_is_refused_saying_so() {
        if ward::mpk_available() {
            eprintln!("this machine has PKU: the test of its absence did not run here");
            return;
        }
        let sup = Supervisor::new(Policy::default());
        let err = Runtime::open(&sup, "nopku", &options(Isolation::Mpk)).unwrap_err();
        assert!(matches!(err, RuntimeError::Ward(Error::IsolationUnavailable(..))), "{err:?}");
        assert!(err.to_string().starts_with("isolation `mpk` is not available"), "{err}");
        // auto runs it in a process, with shared objects.
        let rt = Runtime::open(&sup, "nopku", &options(Isolation::Auto)).unwrap();
        assert_eq!(rt.isolation(), Isolation::Process);
    }

    #[test]
    #[ignore = "needs PKU"]
    fn an_mpk_runtime_creates_looks_up_calls_and_deletes_plugins() {
        let sup = Supervisor::new(Policy::default());
        let rt = runtime_with_basics(&sup);
        assert_eq!(rt.plugins(), ["add", "grayscale"]);
        assert_eq!(add(&rt, 2, 40), 42);
        assert_eq!(gray(&rt), GRAY_PIXELS);
        let id = rt.lookup("add").unwrap();
        rt.delete("add").unwrap();
        assert_eq!(rt.lookup("add"), None);
        assert!(matches!(
            rt.call(id, &mut [Arg::I64(1), Arg::I64(2)], RetType::I64),
            Err(RuntimeError::StalePlugin { .. })
        ));
        let again = rt.create("add", Code::Source(ADD)).unwrap();
        assert_ne!(again, id);
        assert_eq!(add(&rt, 5, 6), 11);
        // A plugin with globals: its data is writable, on pages apart from its code.
        let counter = "static long calls;\nlong tally[4] = {1, 2, 3, 4};\n\
                       long counted(long i) { calls++; tally[i & 3] += calls; return tally[i & 3]; }\n";
        let counted = rt.create("counted", Code::Source(counter)).unwrap();
        assert_eq!(rt.call(counted, &mut [Arg::I64(1)], RetType::I64).unwrap(), Value::I64(3));
        assert_eq!(rt.call(counted, &mut [Arg::I64(1)], RetType::I64).unwrap(), Value::I64(5));
        // A compile error comes back as in a process (libtcc recovers from it with the runtime's longjmp).
        let broken = "long broken(long a) {\n    return a + missing;\n}\n";
        let Err(RuntimeError::Compile { first, .. }) = rt.create("broken", Code::Source(broken)) else {
            panic!("a broken source compiled");
        };
        assert_eq!(first.line, Some(2), "{first}");
        assert!(first.message.contains("missing"), "{first}");
        assert_eq!(add(&rt, 1, 1), 2);
    }

    #[test]
    #[ignore = "needs PKU"]
    fn an_mpk_runtime_refuses_code_holding_wrpkru_and_shared_objects_and_goes_on() {
        let sup = Supervisor::new(Policy::default());
        let rt = runtime_with_basics(&sup);
        // WRPKRU's bytes in a plugin's code: the domain runtime's scan refuses to make the page executable.
        let wrpkru = "long sneaky(long a) {\n    __asm__(\".byte 0x0f, 0x01, 0xef\");\n    return a;\n}\n";
        let Err(RuntimeError::Compile { first, .. }) = rt.create("sneaky", Code::Source(wrpkru)) else {
            panic!("code holding WRPKRU was linked into an mpk runtime");
        };
        assert!(first.message.contains("WRPKRU"), "{first}");
        assert_eq!(rt.lookup("sneaky"), None);
        let Err(RuntimeError::Compile { first, .. }) =
            rt.create("shared", Code::Shared(std::path::Path::new("/nonexistent/libshared.so")))
        else {
            panic!("an mpk runtime linked a shared object");
        };
        assert!(first.message.contains("an mpk runtime links no shared objects"), "{first}");
        the_others_answer(&rt);
    }

    #[test]
    #[ignore = "needs PKU"]
    fn a_crashing_plugin_in_an_mpk_runtime_is_unlinked_and_the_others_answer() {
        let sup = Supervisor::new(Policy::default());
        let rt = runtime_with_basics(&sup);
        let crash = "long crash(long x) { volatile long *p = (long *)0; return *p + x; }\n";
        let id = rt.create("crash", Code::Source(crash)).unwrap();
        let Err(RuntimeError::PluginFault { plugin, fault, unlinked }) = rt.call(id, &mut [Arg::I64(1)], RetType::I64)
        else {
            panic!("a null read did not fault");
        };
        assert_eq!(plugin, "crash");
        assert_eq!(fault.kind_name(), "signal");
        assert_eq!(unlinked, ["crash"]);
        assert_eq!(rt.lookup("crash"), None);
        the_others_answer(&rt);
        // The faulty transform too.
        let faulty = rt.create("faulty", Code::Source(FAULTY)).unwrap();
        let input = [1u8; 12];
        let mut out = vec![0u8; 28];
        let r = rt.call(
            faulty,
            &mut [Arg::In(&input), Arg::I64(2), Arg::I64(2), Arg::Out(&mut out), Arg::I64(28)],
            RetType::I64,
        );
        assert!(matches!(r, Err(RuntimeError::PluginFault { .. })), "{r:?}");
        the_others_answer(&rt);
    }

    #[test]
    #[ignore = "needs PKU"]
    fn a_plugin_past_its_quantum_in_an_mpk_runtime_is_unlinked_and_the_others_answer() {
        let sup = Supervisor::new(Policy::default());
        let rt = runtime_with_basics(&sup);
        let spin = "long spin(long x) { volatile long n = x; for (;;) n++; return n; }\n";
        let id = rt.create("spin", Code::Source(spin)).unwrap();
        let Err(RuntimeError::PluginFault { plugin, fault, .. }) = rt.call(id, &mut [Arg::I64(1)], RetType::I64) else {
            panic!("an endless loop returned");
        };
        assert_eq!(plugin, "spin");
        assert_eq!(fault.kind_name(), "timeout");
        the_others_answer(&rt);
    }

    #[test]
    #[ignore = "needs PKU"]
    fn a_plugin_overrunning_its_buffer_in_an_mpk_runtime_is_unlinked_and_the_others_answer() {
        let sup = Supervisor::new(Policy::default());
        let rt = runtime_with_basics(&sup);
        let overrun = "#include <stdint.h>\nint64_t overrun(uint8_t *out, int64_t len) {\n    for (int64_t i = 0; \
                       i < len + 65536; i++) out[i] = 7;\n    return len;\n}\n";
        let id = rt.create("overrun", Code::Source(overrun)).unwrap();
        let mut out = vec![0u8; 1000];
        let r = rt.call(id, &mut [Arg::Out(&mut out), Arg::I64(1000)], RetType::I64);
        assert!(matches!(r, Err(RuntimeError::PluginFault { .. })), "{r:?}");
        assert!(out.iter().all(|&b| b == 0), "the failed call's output was not copied back");
        the_others_answer(&rt);
    }

    #[test]
    #[ignore = "needs PKU"]
    fn source_that_crashes_the_compiler_in_an_mpk_runtime_costs_a_recovery() {
        let sup = Supervisor::new(Policy::default());
        let rt = runtime_with_basics(&sup);
        // Nesting deep enough to overflow the compiler's stack as it parses.
        let depth = 2_000_000;
        let source = format!("long deep(void) {{ return {}1{}; }}\n", "(".repeat(depth), ")".repeat(depth));
        match rt.create("deep", Code::Source(&source)) {
            Err(RuntimeError::CompilerFault { plugin, .. }) => assert_eq!(plugin, "deep"),
            other => panic!("the compiler survived {depth} parentheses: {other:?}"),
        }
        assert_eq!(rt.lookup("deep"), None);
        the_others_answer(&rt);
    }

    /// Whether the page holding `addr` is mapped executable in this process (the test's, which holds the domain).
    fn executable(addr: u64) -> bool {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().any(|line| {
            let mut fields = line.split_whitespace();
            let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { return false };
            let Some((from, to)) = range.split_once('-') else { return false };
            let (from, to) = (u64::from_str_radix(from, 16).unwrap(), u64::from_str_radix(to, 16).unwrap());
            (from..to).contains(&addr) && perms.as_bytes().get(2) == Some(&b'x')
        })
    }

    #[test]
    #[ignore = "needs PKU"]
    fn the_code_of_a_deleted_or_failed_plugin_is_executable_no_more() {
        let sup = Supervisor::new(Policy::default());
        let rt = runtime_with_basics(&sup);
        let whereabouts = "long here(void) { return (long)(void *)here; }\n";
        let here = rt.create("here", Code::Source(whereabouts)).unwrap();
        let at = rt.call(here, &mut [], RetType::I64).unwrap().as_i64().unwrap() as u64;
        assert!(executable(at), "a linked plugin's code is executable");
        rt.delete("here").unwrap();
        assert!(!executable(at), "a deleted plugin's code page is back to read-write");
        let fragile =
            "long fragile(long x) {\n    if (x) return *(volatile long *)0;\n    return (long)(void *)fragile;\n}\n";
        // Alone in its runtime, so that the plugins linked again after the fault make no page executable.
        let lone = Runtime::open(&sup, "lone", &options(Isolation::Mpk)).unwrap();
        let fragile = lone.create("fragile", Code::Source(fragile)).unwrap();
        let at = lone.call(fragile, &mut [Arg::I64(0)], RetType::I64).unwrap().as_i64().unwrap() as u64;
        assert!(executable(at));
        let r = lone.call(fragile, &mut [Arg::I64(1)], RetType::I64);
        assert!(matches!(r, Err(RuntimeError::PluginFault { .. })), "{r:?}");
        assert!(!executable(at), "after the recovery, the failed plugin's code page is not executable");
        the_others_answer(&rt);
    }

    #[test]
    #[ignore = "needs PKU"]
    fn a_plugin_in_an_mpk_runtime_calls_a_built_in_of_the_host() {
        let sup = Supervisor::new(Policy::default());
        let rt = runtime_with_basics(&sup);
        let seen = Arc::new(AtomicI64::new(0));
        let seen_by_host = seen.clone();
        rt.builtin("host_scale", Signature::new(&[ValType::I64], RetType::I64), move |args| {
            let x = args.first().and_then(Value::as_i64).unwrap_or(0);
            seen_by_host.fetch_add(1, Ordering::SeqCst);
            Value::I64(x * 3)
        })
        .unwrap();
        let source = "long host_scale(long);\nlong scaled(long x) { return host_scale(x) + 1; }\n";
        let id = rt.create("scaled", Code::Source(source)).unwrap();
        assert_eq!(rt.call(id, &mut [Arg::I64(5)], RetType::I64).unwrap(), Value::I64(16));
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        // After a crash elsewhere the plugin is linked again and still reaches the host.
        let crash = rt.create("crash", Code::Source("long crash(void) { return *(volatile long *)8; }")).unwrap();
        assert!(matches!(rt.call(crash, &mut [], RetType::I64), Err(RuntimeError::PluginFault { .. })));
        assert_eq!(rt.call(id, &mut [Arg::I64(7)], RetType::I64).unwrap(), Value::I64(22));
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        the_others_answer(&rt);
    }
}
