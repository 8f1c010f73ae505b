//! The classes in mpk domains: a class adapter and its plugin loaded together into one protection domain of the
//! host's own process, where the domain runtime's `dlopen` and `dlsym` answer from what was loaded, and the
//! adapter's guard pages come from the runtime's `mmap` and `mprotect`.
//!
//! These need PKU and are marked `#[ignore = "needs PKU"]`, so a plain `cargo test` reports them as not run;
//! `scripts/test` runs them where the processor has PKU and inside an emulated machine that has it where it has
//! not. On a machine without PKU, the one test that runs checks what a host gets there instead.

use std::path::{Path, PathBuf};

mod common;

use common::{image, require_pku};

use ward::{Error, Isolation, Policy, Supervisor};
use ward_classes::{frei0r, ladspa, ClassError, Processed};

const AMP: &str = "/usr/lib/ladspa/amp.so";
const INVERT0R: &str = "/usr/lib/frei0r-1/invert0r.so";

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
