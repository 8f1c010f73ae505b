//! ffmpeg's `lv2` filter with two corpus plugins (swh's amp, mda's stereo delay with its feedback tail), natively and
//! under `ward run`: the raw 32-bit float output compared byte for byte. ffmpeg, swh-lv2 and mda-lv2 come from
//! scripts/deps.
//!
//! Until ward has an LV2 class (issue 31), `ward run` loads LV2 plugins natively; the test that the plugins are
//! under ward waits for the class.

use std::path::Path;
use std::process::Command;

mod common;
use common::{host, output, stderr, ward, Scratch};

/// (name, filter): the plugin URI with its colons escaped for ffmpeg's filter graph (`\\:`), then control values.
const FILTERS: [(&str, &str); 2] = [
    ("swh-amp", "lv2=p=http\\\\://plugin.org.uk/swh-plugins/amp:c=gain=-6"),
    ("mda-delay", "lv2=p=http\\\\://drobilla.net/plugins/mda/Delay:c=feedback=0.6|fx_mix=0.5"),
];

/// ffmpeg filtering two seconds of a 48 kHz sine and writing raw f32 samples to `out`.
fn ffmpeg_args(filter: &str, out: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "-hide_banner",
        "-nostdin",
        "-loglevel",
        "error",
        "-y",
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:beep_factor=4:sample_rate=48000:duration=2",
        "-af",
        filter,
        "-f",
        "f32le",
        "-c:a",
        "pcm_f32le",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push(out.display().to_string());
    args
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Runs every filter natively and under `ward run --isolation process -v`, asserts identical output, and returns
/// ward's standard error for each.
fn natively_and_under_ward(s: &Scratch) -> Vec<(&'static str, String)> {
    let mut errs = Vec::new();
    for (name, filter) in FILTERS {
        let native_out = s.path(&format!("{name}-native.f32"));
        let native = output(Command::new(host("ffmpeg")).args(ffmpeg_args(filter, &native_out)));
        assert!(native.status.success(), "{name} natively: {}", stderr(&native));
        let samples = read(&native_out);
        assert!(samples.len() >= 2 * 48_000 * 4, "{name}: ffmpeg wrote only {} bytes natively", samples.len());
        assert!(samples.iter().any(|&b| b != 0), "{name}: the native output is silent");

        let ward_out = s.path(&format!("{name}-ward.f32"));
        let warded = output(
            ward()
                .args(["run", "--isolation", "process", "-v", "--", host("ffmpeg")])
                .args(ffmpeg_args(filter, &ward_out)),
        );
        let err = stderr(&warded);
        assert!(warded.status.success(), "{name} under ward: {:?}\n{err}", warded.status);
        assert!(samples == read(&ward_out), "{name}: the output under ward differs from the native one\n{err}");
        errs.push((name, err));
    }
    errs
}

#[test]
fn ffmpeg_lv2_filters_give_the_native_samples_under_ward() {
    let s = Scratch::new("lv2-ffmpeg", "identical");
    natively_and_under_ward(&s);
}

#[test]
fn under_ward_ffmpegs_lv2_filters_run_in_process_domains() {
    let s = Scratch::new("lv2-ffmpeg", "under-ward");
    for (name, err) in natively_and_under_ward(&s) {
        assert!(err.contains("LV2 plugin under ward (isolation process"), "{name}: not under ward:\n{err}");
    }
}

/// ffmpeg's `lv2` filter with ward's built-in faulty identity `mode`, failing at block `at_block`.
fn faulty_filter(mode: &str, at_block: u64) -> String {
    format!("lv2=p=urn\\\\:ward\\\\:lv2\\\\:faulty#{mode}:c=at_block={at_block}")
}

/// How long a host may take before it counts as hung (natively) or too slow (under ward): generous, not a timing
/// claim.
const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);
const NATIVE_HANG_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

#[test]
fn faulty_lv2_plugins_kill_or_hang_ffmpeg_natively_and_under_ward_it_finishes_with_the_fault_free_output() {
    use common::bounded::{run_within, Ending};
    let s = Scratch::new("lv2-ffmpeg", "faulty");
    let lv2_path = ward_extensions::lv2_bundles().expect("the built-in LV2 bundles");
    // The fault-free run: the identity with its fault beyond the stream.
    let clean = s.path("clean.f32");
    let native = output(
        Command::new(host("ffmpeg"))
            .env("LV2_PATH", &lv2_path)
            .args(ffmpeg_args(&faulty_filter("crash", 1 << 30), &clean)),
    );
    assert!(native.status.success(), "the fault-free run: {}", stderr(&native));
    let clean = read(&clean);
    for mode in ["crash", "abort", "hang"] {
        let filter = faulty_filter(mode, 20);
        let out = s.path(&format!("{mode}-native.f32"));
        let mut cmd = Command::new(host("ffmpeg"));
        cmd.env("LV2_PATH", &lv2_path).args(ffmpeg_args(&filter, &out));
        let run = run_within(&mut cmd, NATIVE_HANG_LIMIT, &s.path(&format!("{mode}-native.err")));
        let expected_native = match mode {
            "crash" => Ending::Signalled(libc::SIGSEGV),
            "abort" => Ending::Signalled(libc::SIGABRT),
            _ => Ending::TimedOut(NATIVE_HANG_LIMIT),
        };
        assert_eq!(run.ending, expected_native, "{mode} natively: {}", run.stderr);

        let out = s.path(&format!("{mode}-ward.f32"));
        let mut cmd = ward();
        cmd.env("LV2_PATH", &lv2_path)
            .args(["run", "--isolation", "process", "--", host("ffmpeg")])
            .args(ffmpeg_args(&filter, &out));
        let run = run_within(&mut cmd, LIMIT, &s.path(&format!("{mode}-ward.err")));
        assert!(run.ending.success(), "{mode} under ward: {}\n{}", run.ending, run.stderr);
        assert!(run.stderr.contains("recovered"), "{mode}: no recovery reported\n{}", run.stderr);
        assert!(read(&out) == clean, "{mode}: the output under ward is not the fault-free one\n{}", run.stderr);
    }
}
