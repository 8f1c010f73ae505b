//! The frei0r class on Debian's frei0r-plugins (/usr/lib/frei0r-1, installed by scripts/deps) under isolation
//! `none` and `process`, and its recovery driven by the built-in faulty plugin (`faulty_frei0r`).
//!
//! faulty_invert counts its updates per instance, so a fault armed "at update 2" fires on the second update of
//! every incarnation: a retried update runs on a freshly constructed instance (its parameters replayed) and is that
//! incarnation's first, so it succeeds, and the next update faults again. Tests of a transparent recovery rely on
//! exactly that; a fault armed at update 1 fires on the retry too and ends in a bypass.

use std::path::{Path, PathBuf};

mod common;

use common::{image, require_pku};

use ward::{Isolation, Policy, Supervisor};
use ward_classes::frei0r::{ColorModel, Instance, Library, ParamKind, ParamValue, PluginType};
use ward_classes::{ClassError, Processed};

const FREI0R_DIR: &str = "/usr/lib/frei0r-1";

/// Test frames: a multiple of 4 pixels, so the adapter's frames end exactly at their guard pages.
const W: u32 = 64;
const H: u32 = 36;
const PIXELS: usize = (W * H) as usize;

/// R, G and B of an RGBA8888 (or BGRA8888) pixel read as a little-endian u32.
const RGB_MASK: u32 = 0x00FF_FFFF;

/// What faulty_invert writes past the frame when it overruns.
const OVERRUN_VALUE: u32 = 0xDEAD_BEEF;

// faulty_invert's parameters and fault kinds.
const KIND: usize = 0;
const FRAME: usize = 1;
const REPEAT: usize = 2;
const NULL_DEREF: f64 = 1.0;
const INFINITE_LOOP: f64 = 5.0;
const OVERRUN: f64 = 20.0;
const HOST_WRITE: f64 = 22.0;

fn plugin(name: &str) -> PathBuf {
    let path = Path::new(FREI0R_DIR).join(format!("{name}.so"));
    assert!(path.exists(), "{} is missing: run scripts/deps (it installs frei0r-plugins)", path.display());
    path
}

fn faulty_path() -> PathBuf {
    ward_extensions::path_of("faulty_frei0r").expect("the built-in faulty_frei0r extracts")
}

fn inverted(input: &[u32]) -> Vec<u32> {
    input.iter().map(|p| p ^ RGB_MASK).collect()
}

/// A supervisor whose policy has `[extension.faulty_frei0r]` with `keys` (and anything after them).
fn supervisor(keys: &str) -> Supervisor {
    let text = format!("[extension.faulty_frei0r]\n{keys}\n");
    Supervisor::new(Policy::from_toml_str(&text, "frei0r test policy").unwrap())
}

/// A faulty_invert instance under process isolation with its fault armed.
fn armed(sup: &Supervisor, kind: f64, frame: f64, repeat: bool) -> (Library, Instance) {
    armed_in(sup, kind, frame, repeat, Isolation::Process)
}

/// A faulty_invert instance under `isolation` with its fault armed.
fn armed_in(sup: &Supervisor, kind: f64, frame: f64, repeat: bool, isolation: Isolation) -> (Library, Instance) {
    let lib = Library::open(sup, &faulty_path(), Some(isolation)).unwrap();
    assert_eq!(lib.extension().isolation(), isolation);
    assert_eq!(lib.extension().name(), "faulty_frei0r", "the policy section applies to the plugin");
    let mut inst = lib.construct(W, H).unwrap();
    for (index, value) in [
        (KIND, ParamValue::Double(kind)),
        (FRAME, ParamValue::Double(frame)),
        (REPEAT, ParamValue::Bool(if repeat { 1.0 } else { 0.0 })),
    ] {
        assert_eq!(inst.set_param(index, &value).unwrap(), Processed::Ran);
    }
    (lib, inst)
}

#[test]
fn info_is_read_through_the_domain() {
    let sup = Supervisor::new(Policy::default());
    for iso in [Isolation::None, Isolation::Process] {
        let lib = Library::open(&sup, &plugin("invert0r"), Some(iso)).unwrap();
        assert_eq!(lib.extension().isolation(), iso);
        let info = lib.info();
        assert_eq!(info.name, "Invert0r", "{iso:?}");
        assert_eq!(info.plugin_type, PluginType::Filter);
        assert_eq!(info.color_model, ColorModel::Rgba8888);
        assert_eq!(info.frei0r_version, 1);
        assert_eq!((info.major_version, info.minor_version), (0, 9));
        assert!(!info.author.is_empty() && !info.explanation.is_empty(), "{info:?}");
        assert!(info.params.is_empty() && info.has_update, "{info:?}");

        let lib = Library::open(&sup, &faulty_path(), Some(iso)).unwrap();
        let info = lib.info();
        assert_eq!((info.name.as_str(), info.author.as_str()), ("faulty_invert", "ward"));
        assert_eq!(info.explanation, "Inverts colours; fails on command");
        assert_eq!((info.major_version, info.minor_version), (1, 0));
        let params: Vec<(&str, ParamKind)> = info.params.iter().map(|p| (p.name.as_str(), p.kind)).collect();
        assert_eq!(params, [("kind", ParamKind::Double), ("frame", ParamKind::Double), ("repeat", ParamKind::Bool)]);
        assert_eq!(info.params[2].explanation, "Fault on every call from frame on");

        let lib = Library::open(&sup, &plugin("cairogradient"), Some(iso)).unwrap();
        let kinds: Vec<ParamKind> = lib.info().params.iter().map(|p| p.kind).collect();
        assert_eq!(kinds[..4], [ParamKind::String, ParamKind::Color, ParamKind::Double, ParamKind::Color]);
        let lib = Library::open(&sup, &plugin("RGB"), Some(iso)).unwrap();
        assert_eq!(lib.info().plugin_type, PluginType::Mixer3);
        assert!(lib.info().has_update2 && !lib.info().has_update);
        let lib = Library::open(&sup, &plugin("onecol0r"), Some(iso)).unwrap();
        assert_eq!((lib.info().plugin_type, lib.info().color_model), (PluginType::Source, ColorModel::Bgra8888));
    }
}

#[test]
fn a_filter_processes_identically_under_none_and_process() {
    let sup = Supervisor::new(Policy::default());
    for (w, h) in [(W, H), (1920, 1080)] {
        let pixels = (w * h) as usize;
        let input = image(7, pixels);
        let expected = inverted(&input);
        let mut results = Vec::new();
        for iso in [Isolation::None, Isolation::Process] {
            let lib = Library::open(&sup, &plugin("invert0r"), Some(iso)).unwrap();
            let mut inst = lib.construct(w, h).unwrap();
            let mut out = vec![0u32; pixels];
            for frame in 0..3 {
                assert_eq!(inst.update(frame as f64 / 25.0, &input, &mut out).unwrap(), Processed::Ran, "{iso:?}");
                assert!(out == expected, "{iso:?} {w}x{h}: invert0r's output is not the inverted image");
            }
            // update2 serves a filter without f0r_update2 through f0r_update.
            assert!(!lib.info().has_update2);
            assert_eq!(inst.update2(0.5, Some(&input), None, None, &mut out).unwrap(), Processed::Ran);
            assert!(out == expected, "{iso:?} {w}x{h}: update2");
            // The byte interface gives the same frame.
            let bytes: Vec<u8> = input.iter().flat_map(|p| p.to_ne_bytes()).collect();
            let mut out_bytes = vec![0u8; pixels * 4];
            assert_eq!(inst.update_bytes(1.0, &bytes, &mut out_bytes).unwrap(), Processed::Ran);
            let expected_bytes: Vec<u8> = expected.iter().flat_map(|p| p.to_ne_bytes()).collect();
            assert!(out_bytes == expected_bytes, "{iso:?} {w}x{h}: update_bytes differs from update");
            results.push(out);
        }
        assert!(results[0] == results[1], "{w}x{h}: none and process differ");
    }
}

#[test]
fn a_plugin_writing_into_its_input_frame_works_and_leaves_the_hosts_frame_alone() {
    // cairogradient premultiplies its input frame in place, const or not.
    let sup = Supervisor::new(Policy::default());
    let input = image(11, PIXELS);
    let bytes: Vec<u8> = input.iter().flat_map(|p| p.to_ne_bytes()).collect();
    let mut results = Vec::new();
    for iso in [Isolation::None, Isolation::Process] {
        let lib = Library::open(&sup, &plugin("cairogradient"), Some(iso)).unwrap();
        let mut inst = lib.construct(W, H).unwrap();
        let mut out = vec![0u8; PIXELS * 4];
        let host_input = bytes.clone();
        assert_eq!(inst.update_bytes(0.0, &host_input, &mut out).unwrap(), Processed::Ran, "{iso:?}");
        assert!(host_input == bytes, "{iso:?}: the host's input frame changed");
        assert_eq!(lib.extension().stats().faults, 0, "{iso:?}");
        results.push(out);
    }
    assert!(results[0] == results[1], "none and process differ");
}

#[test]
fn mixers_and_sources_go_through_update2() {
    let sup = Supervisor::new(Policy::default());
    for iso in [Isolation::None, Isolation::Process] {
        // addition: per channel a saturating sum, alpha the smaller one (RGBA8888, little-endian pixels).
        let lib = Library::open(&sup, &plugin("addition"), Some(iso)).unwrap();
        let mut inst = lib.construct(W, H).unwrap();
        let (a, b) = (image(1, PIXELS), image(2, PIXELS));
        let mut out = vec![0u32; PIXELS];
        assert_eq!(inst.update2(0.0, Some(&a), Some(&b), None, &mut out).unwrap(), Processed::Ran);
        let expected: Vec<u32> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| {
                let (x, y) = (x.to_le_bytes(), y.to_le_bytes());
                let c = |i: usize| x[i].saturating_add(y[i]);
                u32::from_le_bytes([c(0), c(1), c(2), x[3].min(y[3])])
            })
            .collect();
        assert!(out == expected, "{iso:?}: addition");
        let bytes = |frame: &[u32]| -> Vec<u8> { frame.iter().flat_map(|p| p.to_ne_bytes()).collect() };
        let mut out_bytes = vec![0u8; PIXELS * 4];
        let outcome = inst.update2_bytes(0.0, Some(&bytes(&a)), Some(&bytes(&b)), None, &mut out_bytes);
        assert_eq!(outcome.unwrap(), Processed::Ran);
        assert!(out_bytes == bytes(&expected), "{iso:?}: addition through update2_bytes");
        // A third frame is not needed by a mixer2 and not sent.
        assert_eq!(inst.update2(0.0, Some(&a), Some(&b), Some(&a), &mut out).unwrap(), Processed::Ran);
        assert!(out == expected, "{iso:?}: addition with a spare frame");

        // RGB (a mixer3, update2 only): red from the first frame, green from the second, blue from the third.
        let lib = Library::open(&sup, &plugin("RGB"), Some(iso)).unwrap();
        for (w, h) in [(W, H), (1920, 1080)] {
            let pixels = (w * h) as usize;
            let mut inst = lib.construct(w, h).unwrap();
            let grey = |v: u32, alpha: u32| vec![(alpha << 24) | (v * 0x01_0101); pixels];
            let mut out = vec![0u32; pixels];
            let outcome =
                inst.update2(0.0, Some(&grey(0x10, 0xFF)), Some(&grey(0x20, 0x80)), Some(&grey(0x30, 0x40)), &mut out);
            assert_eq!(outcome.unwrap(), Processed::Ran, "{iso:?} {w}x{h}");
            assert!(out.iter().all(|&p| p == 0xFF30_2010), "{iso:?} {w}x{h}: RGB gave {:08x?}", &out[..4]);
            let grey_bytes = |v: u8, alpha: u8| [v, v, v, alpha].repeat(pixels);
            let mut out_bytes = vec![0u8; pixels * 4];
            let (x, y, z) = (grey_bytes(0x10, 0xFF), grey_bytes(0x20, 0x80), grey_bytes(0x30, 0x40));
            let outcome = inst.update2_bytes(0.0, Some(&x), Some(&y), Some(&z), &mut out_bytes);
            assert_eq!(outcome.unwrap(), Processed::Ran, "{iso:?} {w}x{h}: update2_bytes");
            assert!(out_bytes == [0x10, 0x20, 0x30, 0xFF].repeat(pixels), "{iso:?} {w}x{h}: RGB through update2_bytes");
        }

        // onecol0r: a source painting its colour parameter (BGRA8888), through update and update2.
        let lib = Library::open(&sup, &plugin("onecol0r"), Some(iso)).unwrap();
        let mut inst = lib.construct(W, H).unwrap();
        let red = ParamValue::Color { r: 1.0, g: 0.0, b: 0.0 };
        assert_eq!(inst.set_param(0, &red).unwrap(), Processed::Ran);
        let mut out = vec![0u32; PIXELS];
        assert_eq!(inst.update(0.0, &[], &mut out).unwrap(), Processed::Ran);
        assert!(out.iter().all(|&p| p == 0xFFFF_0000), "{iso:?}: onecol0r red gave {:08x?}", &out[..4]);
        assert_eq!(inst.set_param(0, &ParamValue::Color { r: 0.0, g: 1.0, b: 0.0 }).unwrap(), Processed::Ran);
        assert_eq!(inst.update2(0.0, None, None, None, &mut out).unwrap(), Processed::Ran);
        assert!(out.iter().all(|&p| p == 0xFF00_FF00), "{iso:?}: onecol0r green gave {:08x?}", &out[..4]);
    }
}

#[test]
fn parameters_of_every_kind_round_trip() {
    let sup = Supervisor::new(Policy::default());
    for iso in [Isolation::None, Isolation::Process] {
        let lib = Library::open(&sup, &plugin("cairogradient"), Some(iso)).unwrap();
        let mut inst = lib.construct(W, H).unwrap();
        assert_eq!(inst.get_param(0).unwrap(), ParamValue::String("gradient_linear".into()), "{iso:?}");
        let radial = ParamValue::String("gradient_radial".into());
        assert_eq!(inst.set_param(0, &radial).unwrap(), Processed::Ran);
        assert_eq!(inst.get_param(0).unwrap(), radial);
        let colour = ParamValue::Color { r: 0.25, g: 0.5, b: 0.75 };
        assert_eq!(inst.set_param(1, &colour).unwrap(), Processed::Ran);
        assert_eq!(inst.get_param(1).unwrap(), colour);
        assert_eq!(inst.set_param(2, &ParamValue::Double(0.125)).unwrap(), Processed::Ran);
        assert_eq!(inst.get_param(2).unwrap(), ParamValue::Double(0.125));
        // The string set was kept alive by the adapter: the plugin still works with it.
        let mut out = vec![0u32; PIXELS];
        assert_eq!(inst.update(0.0, &image(3, PIXELS), &mut out).unwrap(), Processed::Ran);

        let lib = Library::open(&sup, &plugin("perspective"), Some(iso)).unwrap();
        let mut inst = lib.construct(W, H).unwrap();
        assert_eq!(inst.get_param(3).unwrap(), ParamValue::Position { x: 1.0, y: 1.0 });
        let corner = ParamValue::Position { x: 0.75, y: 0.875 };
        assert_eq!(inst.set_param(3, &corner).unwrap(), Processed::Ran);
        assert_eq!(inst.get_param(3).unwrap(), corner);

        let lib = Library::open(&sup, &faulty_path(), Some(iso)).unwrap();
        let mut inst = lib.construct(W, H).unwrap();
        assert_eq!(inst.get_param(REPEAT).unwrap(), ParamValue::Bool(0.0));
        assert_eq!(inst.set_param(REPEAT, &ParamValue::Bool(1.0)).unwrap(), Processed::Ran);
        assert_eq!(inst.get_param(REPEAT).unwrap(), ParamValue::Bool(1.0));
    }
}

#[test]
fn wrong_arguments_are_the_hosts_error() {
    let sup = Supervisor::new(Policy::default());
    let lib = Library::open(&sup, &faulty_path(), Some(Isolation::Process)).unwrap();
    let mut inst = lib.construct(W, H).unwrap();
    let bad = |r: Result<Processed, ClassError>| assert!(matches!(r, Err(ClassError::BadArguments { .. })), "{r:?}");
    let input = image(4, PIXELS);
    let mut out = vec![0u32; PIXELS];
    let mut short = vec![0u32; PIXELS - 1];
    bad(inst.update(0.0, &input[1..], &mut out));
    bad(inst.update(0.0, &input, &mut short));
    bad(inst.update(0.0, &[], &mut out));
    bad(inst.update2(0.0, None, Some(&input), None, &mut out));
    bad(inst.update2(0.0, None, None, None, &mut out));
    bad(inst.update_bytes(0.0, &[0u8; 8], &mut [0u8; 8]));
    bad(inst.set_param(3, &ParamValue::Double(1.0)));
    bad(inst.set_param(KIND, &ParamValue::String("1".into())));
    bad(inst.set_param(REPEAT, &ParamValue::Double(1.0)));
    assert!(matches!(inst.get_param(3), Err(ClassError::BadArguments { .. })));
    assert!(matches!(lib.construct(0, 10), Err(ClassError::BadArguments { .. })));
    // The output was never touched, and the instance still works.
    assert!(out.iter().all(|&p| p == 0));
    assert_eq!(inst.update(0.0, &input, &mut out).unwrap(), Processed::Ran);
    assert!(out == inverted(&input));

    let mixer = Library::open(&sup, &plugin("addition"), Some(Isolation::Process)).unwrap();
    let mut mix = mixer.construct(W, H).unwrap();
    bad(mix.update(0.0, &input, &mut out));
    bad(mix.update2(0.0, Some(&input), None, None, &mut out));
    let strings = Library::open(&sup, &plugin("cairogradient"), Some(Isolation::Process)).unwrap();
    let mut grad = strings.construct(W, H).unwrap();
    bad(grad.set_param(0, &ParamValue::String("a\0b".into())));
    assert_eq!(lib.extension().stats().faults + mixer.extension().stats().faults, 0);
}

#[test]
fn the_shadow_log_holds_an_instance_until_it_is_dropped() {
    let sup = Supervisor::new(Policy::default());
    let lib = Library::open(&sup, &faulty_path(), Some(Isolation::Process)).unwrap();
    let opened = lib.extension().stats();
    assert_eq!((opened.shadow_log, opened.handles), (1, 1), "the library's opening: {opened:?}");
    let mut inst = lib.construct(W, H).unwrap();
    for _ in 0..5 {
        // The same value again and again is logged once.
        assert_eq!(inst.set_param(FRAME, &ParamValue::Double(9.0)).unwrap(), Processed::Ran);
    }
    assert_eq!(inst.set_param(KIND, &ParamValue::Double(0.0)).unwrap(), Processed::Ran);
    let stats = lib.extension().stats();
    assert_eq!((stats.shadow_log, stats.handles), (4, 2), "open, construct, two parameters: {stats:?}");
    drop(inst);
    let stats = lib.extension().stats();
    assert_eq!((stats.shadow_log, stats.handles), (1, 1), "destruct forgets the instance: {stats:?}");
}

/// The filter crashes at its second update; replaying its history (the first update) brings its count back, so the
/// retry crashes again. The history is then dropped and the update retried once more on an incarnation with the
/// configuration only, which counts it as its first: the host gets the right frame.
#[test]
fn a_fault_that_the_replayed_history_brings_back_is_retried_on_the_configuration_only() {
    let sup = supervisor("");
    let (lib, mut inst) = armed(&sup, NULL_DEREF, 2.0, false);
    let mut out = vec![0u32; PIXELS];
    let input = image(5, PIXELS);
    assert_eq!(inst.update(0.0, &input, &mut out).unwrap(), Processed::Ran);
    assert_eq!(lib.extension().stats().shadow_log, 6, "open, construct, three parameters, one update");
    let input = image(6, PIXELS);
    assert_eq!(inst.update(0.04, &input, &mut out).unwrap(), Processed::Ran);
    assert!(out == inverted(&input), "the recovered update's output");
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts, stats.incarnation), (2, 2, 3), "{stats:?}");
    assert_eq!(stats.shadow_log, 6, "the first update's history dropped, the retried one kept: {stats:?}");
    assert!(!stats.disabled, "the history's fault is not counted in a row");
}

#[test]
fn a_crash_is_recovered_transparently_with_the_parameters_replayed() {
    crash_recovered(Isolation::Process);
}

/// Without history (`history_mb = 0`): the restarted filter counts its updates from 1 again, so the retried update
/// does not crash. With history (the default) see
/// `a_fault_that_the_replayed_history_brings_back_is_retried_on_the_configuration_only`.
fn crash_recovered(isolation: Isolation) {
    let sup = supervisor("history_mb = 0");
    let (lib, mut inst) = armed_in(&sup, NULL_DEREF, 2.0, false, isolation);
    let mut out = vec![0u32; PIXELS];
    let input = image(5, PIXELS);
    assert_eq!(inst.update(0.0, &input, &mut out).unwrap(), Processed::Ran);
    assert!(out == inverted(&input));
    assert_eq!(lib.extension().stats().restarts, 0);

    // Update 2 crashes; the domain is restarted, open, construct and both parameters are replayed, and the update
    // is retried on the new instance, as its first update.
    let input = image(6, PIXELS);
    out.fill(0);
    assert_eq!(inst.update(0.04, &input, &mut out).unwrap(), Processed::Ran);
    assert!(out == inverted(&input), "the recovered update's output");
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts, stats.incarnation), (1, 1, 2), "{stats:?}");
    assert_eq!(stats.shadow_log, 5, "open, construct, three parameters: {stats:?}");
    assert_eq!(inst.get_param(KIND).unwrap(), ParamValue::Double(NULL_DEREF));
    assert_eq!(inst.get_param(FRAME).unwrap(), ParamValue::Double(2.0));

    // The replayed instance is armed like the first: its second update crashes too, and is recovered alike.
    let input = image(8, PIXELS);
    assert_eq!(inst.update(0.08, &input, &mut out).unwrap(), Processed::Ran);
    assert!(out == inverted(&input));
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts, stats.incarnation), (2, 2, 3), "{stats:?}");

    // Disarmed, it runs on without faults.
    assert_eq!(inst.set_param(KIND, &ParamValue::Double(0.0)).unwrap(), Processed::Ran);
    for seed in 10..14 {
        let input = image(seed, PIXELS);
        assert_eq!(inst.update(0.0, &input, &mut out).unwrap(), Processed::Ran);
        assert!(out == inverted(&input));
    }
    assert_eq!(lib.extension().stats().faults, 2);
}

#[test]
fn an_overrun_is_caught_as_a_fault() {
    overrun_caught(Isolation::Process);
}

fn overrun_caught(isolation: Isolation) {
    let sup = supervisor("");
    // Armed at update 1: the retry on the restarted instance overruns again, so the frame is bypassed.
    let (lib, mut inst) = armed_in(&sup, OVERRUN, 1.0, false, isolation);
    let input = image(9, PIXELS);
    let mut out = vec![0u32; PIXELS];
    let outcome = inst.update(0.0, &input, &mut out).unwrap();
    let Processed::Bypassed { reason } = outcome else { panic!("an overrun passed unnoticed: {outcome:?}") };
    assert!(reason.contains("SIGSEGV"), "{reason}");
    assert!(out == input, "a bypassed frame is the input frame");
    assert!(!out.contains(&OVERRUN_VALUE));
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts), (2, 2), "{stats:?}");

    // Through update2 as well.
    let outcome = inst.update2(0.0, Some(&input), None, None, &mut out).unwrap();
    assert!(matches!(outcome, Processed::Bypassed { .. }), "{outcome:?}");
    assert!(out == input);

    // The instance survives: disarmed, it inverts again.
    assert_eq!(inst.set_param(KIND, &ParamValue::Double(0.0)).unwrap(), Processed::Ran);
    assert_eq!(inst.update(0.0, &input, &mut out).unwrap(), Processed::Ran);
    assert!(out == inverted(&input));
}

#[test]
fn a_plugin_failing_on_every_frame_is_disabled_and_bypassed() {
    let sup = supervisor("max_restarts = 3");
    let (lib, mut inst) = armed(&sup, NULL_DEREF, 1.0, true);
    let mut out = vec![0u32; PIXELS];
    let mut frames = 0;
    while !lib.extension().stats().disabled {
        frames += 1;
        assert!(frames <= 10, "never disabled: {:?}", lib.extension().stats());
        let input = image(frames, PIXELS);
        out.fill(0);
        let outcome = inst.update(f64::from(frames), &input, &mut out).unwrap();
        assert!(matches!(outcome, Processed::Bypassed { .. }), "frame {frames}: {outcome:?}");
        assert!(out == input, "frame {frames}: a bypassed frame is the input frame");
    }
    // Disabled: every frame passes through at once, the host never sees an error.
    for seed in 20..23 {
        let input = image(seed, PIXELS);
        let outcome = inst.update(0.0, &input, &mut out).unwrap();
        let Processed::Bypassed { reason } = outcome else { panic!("{outcome:?}") };
        assert!(reason.contains("disabled"), "{reason}");
        assert!(out == input);
        let outcome = inst.update2(0.0, Some(&input), None, None, &mut out).unwrap();
        assert!(matches!(outcome, Processed::Bypassed { .. }), "{outcome:?}");
    }
    assert!(matches!(inst.set_param(KIND, &ParamValue::Double(0.0)).unwrap(), Processed::Bypassed { .. }));
    assert!(matches!(inst.get_param(KIND), Err(ClassError::Ward(ward::Error::Disabled { .. }))));
    assert!(lib.construct(W, H).is_err());
}

#[test]
fn a_hang_is_ended_by_the_deadline_and_recovered() {
    let sup = supervisor("max_restarts = 3\n[extension.faulty_frei0r.function.ward_frei0r_update]\ndeadline_ms = 1000");
    let (lib, mut inst) = armed(&sup, INFINITE_LOOP, 2.0, false);
    let mut out = vec![0u32; PIXELS];
    for seed in 1..=2 {
        let input = image(seed, PIXELS);
        assert_eq!(inst.update(0.0, &input, &mut out).unwrap(), Processed::Ran, "update {seed}");
        assert!(out == inverted(&input), "update {seed}");
    }
    let stats = lib.extension().stats();
    assert_eq!((stats.faults, stats.restarts), (1, 1), "the second update hung once: {stats:?}");
}

#[test]
fn a_library_that_is_no_frei0r_plugin_is_refused_by_name() {
    let sup = Supervisor::new(Policy::default());
    let well = ward_extensions::path_of("well").unwrap();
    for iso in [Isolation::None, Isolation::Process] {
        let err = Library::open(&sup, &well, Some(iso)).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ClassError::NotAPlugin { .. }), "{msg}");
        assert!(msg.contains("well.so") && msg.contains("frei0r") && msg.contains("f0r_get_plugin_info"), "{msg}");
    }
    let err = Library::open(&sup, Path::new("/nonexistent/x.so"), Some(Isolation::Process)).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/x.so"), "{err}");
}

// ---- the same in an mpk domain -----------------------------------------------------------------------------------

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_a_crash_is_recovered_transparently_with_the_parameters_replayed() {
    require_pku();
    crash_recovered(Isolation::Mpk);
}

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_an_overrun_faults_at_the_adapters_guard_page() {
    require_pku();
    overrun_caught(Isolation::Mpk);
}

/// A plugin that faults only in an mpk domain (it writes host memory that a process of its own would own) moves to a
/// process domain after `escalate_after` faults, and the update in flight is retried there: the host gets every frame
/// right, with the parameters it set, as from a plugin that never failed.
#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_a_plugin_faulting_only_there_escalates_and_every_frame_is_right() {
    require_pku();
    let sup = supervisor("escalate_after = 2\nmax_retries = 2");
    let (lib, mut inst) = armed_in(&sup, HOST_WRITE, 2.0, true, Isolation::Mpk);
    let mut out = vec![0u32; PIXELS];
    let input = image(1, PIXELS);
    assert_eq!(inst.update(0.0, &input, &mut out).unwrap(), Processed::Ran);
    assert!(out == inverted(&input));
    assert_eq!(lib.extension().isolation(), Isolation::Mpk);

    // Update 2 faults in the mpk domain; the restarted instance's first update does not, so it is retried and
    // right there. Update 3 is the new instance's second: it faults, and that is the second fault, so the domain
    // moves to a process, where the replayed instance's retried update runs on without faults.
    for (seed, time) in [(2, 0.04), (3, 0.08), (4, 0.12), (5, 0.16)] {
        let input = image(seed, PIXELS);
        out.fill(0);
        assert_eq!(inst.update(time, &input, &mut out).unwrap(), Processed::Ran, "update of image {seed}");
        assert!(out == inverted(&input), "update of image {seed}: the output is not the inverted input");
    }
    assert_eq!(lib.extension().isolation(), Isolation::Process, "two faults move the domain to a process");
    let stats = lib.extension().stats();
    assert_eq!(stats.faults, 2, "{stats:?}");
    assert_eq!(inst.get_param(KIND).unwrap(), ParamValue::Double(HOST_WRITE), "the parameters moved along");
    assert_eq!(inst.get_param(REPEAT).unwrap(), ParamValue::Bool(1.0));
}

// ---- reading past an input (issue 33) -----------------------------------------------------------------------------

/// A map frame for UV Map: red and green from a few values (0 and 255 among them, which send the pixel to the far
/// edge), blue above or below 128 (whether the pixel is taken at all). The first pixel reads furthest: a row and a
/// pixel past the end of the source frame.
fn uv_map(pixels: usize) -> Vec<u32> {
    const LEVELS: [u32; 5] = [0, 64, 128, 200, 255];
    let mut map: Vec<u32> = image(11, pixels)
        .iter()
        .map(|&x| {
            let (r, g) = (LEVELS[(x % 5) as usize], LEVELS[((x >> 8) % 5) as usize]);
            let b = if (x >> 16) & 1 == 1 { 255 } else { 0 };
            r | g << 8 | b << 16
        })
        .collect();
    map[0] = 255 | 255 << 16;
    map
}

/// What UV Map gives natively when the memory after its source frame holds zeros: for each map pixel with blue above
/// 128, `src[px + w * py]` with `px = lrintf(w * red / 255)`, `py = lrintf(h * (1 - green / 255))` (in the plugin's
/// float arithmetic), and zero past the frame.
fn uv_mapped(map: &[u32], src: &[u32], w: u32, h: u32) -> Vec<u32> {
    map.iter()
        .map(|&m| {
            let (r, g, b) = (m & 0xff, (m >> 8) & 0xff, (m >> 16) & 0xff);
            let fx = (f64::from(r as f32) / 255.0) as f32;
            let fy = (1.0 - f64::from((f64::from(g as f32) / 255.0) as f32)) as f32;
            let px = (w as f32 * fx).round_ties_even() as usize;
            let py = (h as f32 * fy).round_ties_even() as usize;
            if b > 128 {
                src.get(px + w as usize * py).copied().unwrap_or(0)
            } else {
                0
            }
        })
        .collect()
}

/// Debian's UV Map reads up to a row and a pixel past its second input frame (`src[px + w * py]`, px up to w, py up
/// to h). Natively that reads whatever follows the host's frame; under ward it reads zeros (the adapter's copy of the
/// frame is followed by READ_PAST_INPUT bytes of them), so the update runs, is not bypassed, and gives what it gives
/// natively on a frame followed by zeros.
fn uv_map_reads_zeros_past_its_source(isolation: Isolation) {
    let sup = Supervisor::new(Policy::default());
    let lib = Library::open(&sup, &plugin("uvmap"), Some(isolation)).unwrap();
    assert_eq!(lib.extension().isolation(), isolation);
    // Up to 4000 pixels a row: 16004 bytes read past the frame, within the 16 KiB allowance.
    for (w, h) in [(W, H), (1920, 1080), (4000, 3)] {
        let pixels = (w * h) as usize;
        let map = uv_map(pixels);
        let src = image(12, pixels);
        let expected = uv_mapped(&map, &src, w, h);
        let mut inst = lib.construct(w, h).unwrap();
        let mut out = vec![0u32; pixels];
        let outcome = inst.update2(0.0, Some(&map), Some(&src), None, &mut out).unwrap();
        assert_eq!(outcome, Processed::Ran, "{isolation:?} {w}x{h}");
        assert_eq!(out[0], 0, "{isolation:?} {w}x{h}: the pixel read past the frame is not zero");
        assert!(out == expected, "{isolation:?} {w}x{h}: the output differs from the zero-padded native one");
        // Again: the copy's tail is still zeros.
        let outcome = inst.update2(0.04, Some(&map), Some(&src), None, &mut out).unwrap();
        assert_eq!(outcome, Processed::Ran, "{isolation:?} {w}x{h}");
        assert!(out == expected, "{isolation:?} {w}x{h}: the second update");
    }
    assert_eq!(lib.extension().stats().faults, 0, "{isolation:?}");
}

#[test]
fn uv_map_reads_zeros_past_its_source_frame_under_none_and_process() {
    for iso in [Isolation::None, Isolation::Process] {
        uv_map_reads_zeros_past_its_source(iso);
    }
}

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_uv_map_reads_zeros_past_its_source_frame() {
    require_pku();
    uv_map_reads_zeros_past_its_source(Isolation::Mpk);
}

/// At 4200 pixels a row UV Map reads 16804 bytes past its source frame, further than the allowance: that still faults
/// (the frame is bypassed), in a process domain and in an mpk one.
fn uv_map_reading_past_the_allowance_faults(isolation: Isolation) {
    let sup = Supervisor::new(Policy::default());
    let lib = Library::open(&sup, &plugin("uvmap"), Some(isolation)).unwrap();
    let (w, h) = (4200, 2);
    let pixels = (w * h) as usize;
    let map = uv_map(pixels);
    let src = image(13, pixels);
    let mut inst = lib.construct(w, h).unwrap();
    let mut out = vec![0u32; pixels];
    let outcome = inst.update2(0.0, Some(&map), Some(&src), None, &mut out).unwrap();
    let Processed::Bypassed { reason } = outcome else { panic!("{isolation:?}: read past the allowance: {outcome:?}") };
    assert!(reason.contains("SIGSEGV"), "{isolation:?}: {reason}");
    assert!(lib.extension().stats().faults >= 1, "{isolation:?}");
}

#[test]
fn uv_map_reading_past_the_allowance_faults_in_a_process_domain() {
    uv_map_reading_past_the_allowance_faults(Isolation::Process);
}

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_uv_map_reading_past_the_allowance_faults() {
    require_pku();
    uv_map_reading_past_the_allowance_faults(Isolation::Mpk);
}

/// With `read_past_input_kb = 0` nothing follows a copy of an input but its guard page: UV Map faults as it did
/// before issue 33, and its frame is bypassed.
#[test]
fn without_an_allowance_uv_map_faults_on_its_source_frames_guard_page() {
    let policy = Policy::from_toml_str("[extension.uvmap]\nread_past_input_kb = 0\n", "test").unwrap();
    let sup = Supervisor::new(policy);
    let lib = Library::open(&sup, &plugin("uvmap"), Some(Isolation::Process)).unwrap();
    let pixels = PIXELS;
    let map = uv_map(pixels);
    let src = image(14, pixels);
    let mut inst = lib.construct(W, H).unwrap();
    let mut out = vec![0u32; pixels];
    let outcome = inst.update2(0.0, Some(&map), Some(&src), None, &mut out).unwrap();
    let Processed::Bypassed { reason } = outcome else { panic!("no allowance, yet: {outcome:?}") };
    assert!(reason.contains("SIGSEGV"), "{reason}");
}
