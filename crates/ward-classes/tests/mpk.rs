//! The classes in mpk domains: a class adapter and its plugin loaded together into one protection domain of the
//! host's own process, where the domain runtime's `dlopen` and `dlsym` answer from what was loaded, and the
//! adapter's guard pages come from the runtime's `mmap` and `mprotect`.
//!
//! These need PKU. On a machine without it they check what a host gets there instead (mpk refused with the reason,
//! `auto` running a process domain) and say that the rest did not run; `scripts/test` runs them again inside an
//! emulated machine that has PKU.

use std::path::{Path, PathBuf};

mod common;

use common::image;

use ward::{Error, Isolation, Policy, Supervisor};
use ward_classes::{frei0r, ladspa, ClassError, Processed};

const AMP: &str = "/usr/lib/ladspa/amp.so";
const INVERT0R: &str = "/usr/lib/frei0r-1/invert0r.so";

fn installed(path: &str) -> &Path {
    let path = Path::new(path);
    assert!(path.exists(), "{} is missing: run scripts/deps", path.display());
    path
}

/// Whether mpk domains can run here; if not, checks what a host gets instead, once per test, and says so.
fn pku_or_fallback(plugin: &Path) -> bool {
    if ward::mpk_available() {
        return true;
    }
    let sup = Supervisor::new(Policy::default());
    let err = ladspa::Library::open(&sup, plugin, Some(Isolation::Mpk)).err();
    assert!(
        matches!(err, Some(ClassError::Ward(Error::IsolationUnavailable(..)))),
        "mpk without PKU must be refused: {err:?}"
    );
    let auto = ladspa::Library::open(&sup, plugin, Some(Isolation::Auto)).unwrap();
    assert_eq!(auto.extension().isolation(), Isolation::Process);
    eprintln!("no PKU on this machine: checked the fallback only; the mpk part runs under scripts/pku-vm");
    false
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
fn a_ladspa_plugin_runs_in_an_mpk_domain_with_its_adapter_and_matches_none() {
    if !pku_or_fallback(installed(AMP)) {
        return;
    }
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
fn a_library_that_is_no_plugin_is_refused_by_name_in_an_mpk_domain() {
    if !pku_or_fallback(installed(AMP)) {
        return;
    }
    let sup = Supervisor::new(Policy::default());
    let err = ladspa::Library::open(&sup, installed(INVERT0R), Some(Isolation::Mpk)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ClassError::NotAPlugin { .. }), "{msg}");
    assert!(msg.contains("ladspa_descriptor"), "the adapter's reason comes back: {msg}");
}

#[test]
fn a_frei0r_filter_runs_in_an_mpk_domain_with_guarded_frames_and_matches_none() {
    if !pku_or_fallback(installed(AMP)) {
        return;
    }
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
