//! Issue 31's acceptance under lilv's `lv2apply`: ward's built-in faulty LV2 identities (a crash, an abort, a hang at
//! a block) kill or hang the host natively; under `ward run` it finishes, the recoveries reported, with the output of
//! the fault-free run. (ffmpeg's `lv2` filter: `lv2_ffmpeg.rs`; jalv under JACK: `lv2_jalv.rs`.)

use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod common;
use common::bounded::{run_within, Ending};
use common::{host, ward, wav, Scratch};

/// A tenth of a second at 48 kHz: lv2apply runs one sample a block, so 4,800 blocks.
const SAMPLES: usize = 4800;
const AT_BLOCK: &str = "500";
const LIMIT: Duration = Duration::from_secs(120);
const NATIVE_HANG_LIMIT: Duration = Duration::from_secs(15);

fn write_input(path: &Path) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 48_000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(path, spec).expect("create the input");
    for i in 0..SAMPLES {
        w.write_sample((i as f32 * 0.0575).sin() * 0.5).expect("write a sample");
    }
    w.finalize().expect("finish the input");
}

fn lv2apply(input: &Path, out: &Path, mode: &str, at_block: &str) -> Vec<std::ffi::OsString> {
    let uri = format!("urn:ward:lv2:faulty#{mode}");
    [input.as_os_str(), out.as_os_str()]
        .iter()
        .zip(["-i", "-o"])
        .flat_map(|(p, flag)| [flag.into(), p.to_os_string()])
        .chain(["-c".into(), "at_block".into(), at_block.into(), uri.into()])
        .collect()
}

#[test]
fn faulty_lv2_plugins_kill_or_hang_lv2apply_natively_and_under_ward_it_finishes_with_the_fault_free_output() {
    let s = Scratch::new("lv2-faults", "lv2apply");
    let lv2_path = ward_extensions::lv2_bundles().expect("the built-in LV2 bundles");
    let input = s.path("in.wav");
    write_input(&input);
    let clean = s.path("clean.wav");
    let mut cmd = Command::new(host("lv2apply"));
    cmd.env("LV2_PATH", &lv2_path).args(lv2apply(&input, &clean, "crash", "1000000000"));
    let run = run_within(&mut cmd, LIMIT, &s.path("clean.err"));
    assert!(run.ending.success(), "the fault-free run: {}\n{}", run.ending, run.stderr);
    let clean = wav::comparable(&clean);
    assert!(clean.len() > SAMPLES * 4, "the fault-free run wrote {} bytes", clean.len());

    for mode in ["crash", "abort", "hang"] {
        let out = s.path(&format!("{mode}-native.wav"));
        let mut cmd = Command::new(host("lv2apply"));
        cmd.env("LV2_PATH", &lv2_path).args(lv2apply(&input, &out, mode, AT_BLOCK));
        let run = run_within(&mut cmd, NATIVE_HANG_LIMIT, &s.path(&format!("{mode}-native.err")));
        let expected = match mode {
            "crash" => Ending::Signalled(libc::SIGSEGV),
            "abort" => Ending::Signalled(libc::SIGABRT),
            _ => Ending::TimedOut(NATIVE_HANG_LIMIT),
        };
        assert_eq!(run.ending, expected, "{mode} natively: {}", run.stderr);

        let out = s.path(&format!("{mode}-ward.wav"));
        let mut cmd = ward();
        cmd.env("LV2_PATH", &lv2_path)
            .args(["run", "--isolation", "process", "--", host("lv2apply")])
            .args(lv2apply(&input, &out, mode, AT_BLOCK));
        let run = run_within(&mut cmd, LIMIT, &s.path(&format!("{mode}-ward.err")));
        assert!(run.ending.success(), "{mode} under ward: {}\n{}", run.ending, run.stderr);
        assert!(run.stderr.contains("recovered"), "{mode}: no recovery reported\n{}", run.stderr);
        assert!(
            wav::comparable(&out) == clean,
            "{mode}: the output under ward is not the fault-free one\n{}",
            run.stderr
        );
    }
}
