//! `ward run` end to end: unmodified Debian hosts (`applyplugin`, `sox`, `ffmpeg`) with Debian's plugins and the
//! built-in faulty ones, natively and under ward. The hosts come from scripts/deps, which the test command runs
//! first.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{host, output, require_pku, stderr, ward, Scratch};

/// A mono 16-bit WAV of `seconds` seconds at 48 kHz: a sine, made by sox itself without dither.
fn sine_wav(path: &Path, seconds: u32) {
    let out =
        output(Command::new(host("sox")).args(["-D", "-n", "-r", "48000", "-c", "1", "-b", "16"]).arg(path).args([
            "synth",
            &seconds.to_string(),
            "sine",
            "440",
            "vol",
            "0.5",
        ]));
    assert!(out.status.success(), "sox could not make a test signal: {}", stderr(&out));
}

/// The directory the built-in extensions are extracted to (LADSPA_PATH and FREI0R_PATH for the hosts).
fn builtin_dir() -> PathBuf {
    ward_extensions::extracted().expect("extract the built-in extensions")
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn applyplugin_output_is_bit_identical_under_ward() {
    let s = Scratch::new("run", "applyplugin");
    sine_wav(&s.path("in.wav"), 1);
    let native = output(Command::new(host("applyplugin")).arg(s.path("in.wav")).arg(s.path("native.wav")).args([
        "/usr/lib/ladspa/amp.so",
        "amp_mono",
        "0.5",
    ]));
    assert!(native.status.success(), "{}", stderr(&native));
    for iso in ["process", "none"] {
        let out = output(
            ward()
                .args(["run", "--verbose", "--isolation", iso, "--", "applyplugin"])
                .arg(s.path("in.wav"))
                .arg(s.path("ward.wav"))
                .args(["/usr/lib/ladspa/amp.so", "amp_mono", "0.5"]),
        );
        let err = stderr(&out);
        assert!(out.status.success(), "{iso}: {err}");
        assert!(err.contains(&format!("amp.so: LADSPA plugin under ward (isolation {iso}")), "{err}");
        assert_eq!(read(&s.path("native.wav")), read(&s.path("ward.wav")), "{iso}: outputs differ");
    }
}

#[test]
#[ignore = "needs PKU"]
fn under_mpk_applyplugin_is_bit_identical_and_sox_survives_a_crashing_plugin() {
    require_pku();
    let s = Scratch::new("run", "mpk");
    sine_wav(&s.path("in.wav"), 1);
    let amp = ["/usr/lib/ladspa/amp.so", "amp_mono", "0.5"];
    let native = output(Command::new(host("applyplugin")).arg(s.path("in.wav")).arg(s.path("native.wav")).args(amp));
    assert!(native.status.success(), "{}", stderr(&native));
    let out = output(
        ward()
            .args(["run", "--verbose", "--isolation", "mpk", "--", "applyplugin"])
            .arg(s.path("in.wav"))
            .arg(s.path("ward.wav"))
            .args(amp),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("amp.so: LADSPA plugin under ward (isolation mpk"), "{err}");
    assert_eq!(read(&s.path("native.wav")), read(&s.path("ward.wav")), "outputs differ");

    // A null dereference at block 3: the plugin runs in sox's own address space, and sox still finishes with every
    // block processed.
    let args = sox_faulty(&s, "out.wav", "0.5", "1", "3", "0");
    let policy = recurring_crash_policy(&s);
    let out = output(
        ward()
            .args(["run", "--isolation", "mpk", "--policy"])
            .arg(&policy)
            .args(["--", "sox"])
            .args(&args)
            .env("LADSPA_PATH", builtin_dir()),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "under ward sox finishes: {:?}\n{err}", out.status);
    assert!(err.contains("ward: faulty_ladspa: fault: null dereference"), "{err}");
    assert!(err.contains("retried: succeeded"), "{err}");
    let clean = sox_faulty(&s, "clean.wav", "0.5", "0", "0", "0");
    let reference = output(Command::new("sox").args(&clean).env("LADSPA_PATH", builtin_dir()));
    assert!(reference.status.success(), "{}", stderr(&reference));
    assert_eq!(read(&s.path("out.wav")), read(&s.path("clean.wav")));
}

#[test]
#[ignore = "needs PKU"]
fn under_mpk_ffmpeg_frei0r_is_bit_identical_and_survives_a_crashing_filter() {
    require_pku();
    let s = Scratch::new("run", "mpk-ffmpeg");
    // A real Debian filter in ffmpeg's own address space: the same frames as natively.
    let native = output(Command::new(host("ffmpeg")).args(ffmpeg_args("frei0r=invert0r", &s.path("native.rgba"))));
    assert!(native.status.success(), "{}", stderr(&native));
    let args = ffmpeg_args("frei0r=invert0r", &s.path("ward.rgba"));
    let out = output(ward().args(["run", "--verbose", "--isolation", "mpk", "--", "ffmpeg"]).args(&args));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("invert0r.so: frei0r plugin under ward (isolation mpk"), "{err}");
    assert!(read(&s.path("native.rgba")) == read(&s.path("ward.rgba")), "frames differ");

    // A null dereference at frame 5: ffmpeg finishes with every frame filtered, as a run without the fault.
    let policy = recurring_crash_policy(&s);
    ffmpeg_recovers_the_crashing_filter(
        &s,
        ward().args(["run", "--isolation", "mpk", "--policy"]).arg(&policy).args(["--", "ffmpeg"]),
    );
}

/// A filter that faults only in an mpk domain (faulty_frei0r's kind 22 writes a byte of the host's environment back
/// unchanged, from frame 2 on): after three faults (the default `escalate_after`) it moves to a process domain,
/// where it runs without faults, and ffmpeg gets every frame as from a filter that never failed.
#[test]
#[ignore = "needs PKU"]
fn under_mpk_a_filter_faulting_only_there_moves_to_a_process_and_every_frame_is_right() {
    require_pku();
    let s = Scratch::new("run", "mpk-escalation");
    let args = ffmpeg_args("frei0r=faulty_frei0r:22|2|y", &s.path("out.rgba"));
    let out = output(
        ward().args(["run", "--isolation", "mpk", "--", "ffmpeg"]).args(&args).env("FREI0R_PATH", builtin_dir()),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "under ward ffmpeg finishes: {:?}\n{err}", out.status);
    assert!(
        err.contains("ward: faulty_frei0r: isolation mpk failed 3 times: it runs with isolation process from now on"),
        "{err}"
    );
    let clean = ffmpeg_args("frei0r=faulty_frei0r:0", &s.path("clean.rgba"));
    let reference = output(Command::new("ffmpeg").args(&clean).env("FREI0R_PATH", builtin_dir()));
    assert!(reference.status.success(), "{}", stderr(&reference));
    let (got, want) = (read(&s.path("out.rgba")), read(&s.path("clean.rgba")));
    assert_eq!(got.len(), want.len(), "{err}");
    let frame = 160 * 120 * 4;
    let differing: Vec<usize> =
        (0..got.len() / frame).filter(|f| got[f * frame..][..frame] != want[f * frame..][..frame]).collect();
    assert!(differing.is_empty(), "frames {differing:?} differ from the run without the fault\n{err}");
}

/// A policy under which a faulty plugin's crash at block (frame) N is recovered on every recurrence and only the
/// restart limit disables it. The restart replays the configuration only (`history_mb = 0`): a restarted plugin
/// counts its blocks from 1 again, so its retried block does not crash (with its history replayed, the retry would
/// crash again and be retried once more on the configuration only: two restarts a crash, which a 25-frame ffmpeg
/// run crashing every fifth frame takes past the restart limit). It crashes again N - 1 blocks after each recovery:
/// with the default `max_failures_in_row` it would be disabled after its third crash as a plugin that keeps failing.
/// The tests using this are about recovering each crash transparently.
fn recurring_crash_policy(s: &Scratch) -> PathBuf {
    let policy = s.path("recurring.toml");
    std::fs::write(&policy, "[defaults]\nmax_failures_in_row = 0\nhistory_mb = 0\n").expect("write the policy");
    policy
}

/// sox's ladspa effect wants a value for every control port, outputs included: gain, fault kind, fault at block,
/// repeat, and the "Blocks" output.
fn sox_faulty(s: &Scratch, out: &str, gain: &str, kind: &str, at: &str, repeat: &str) -> Vec<String> {
    let mut args: Vec<String> =
        ["-D", "in.wav", out, "ladspa", "faulty_ladspa", "faulty_amp"].map(String::from).to_vec();
    args.extend([gain, kind, at, repeat, "0"].map(String::from));
    args[1] = s.path("in.wav").display().to_string();
    args[2] = s.path(out).display().to_string();
    args
}

#[test]
fn sox_finishes_with_a_crashing_ladspa_plugin_that_kills_it_natively() {
    let s = Scratch::new("run", "sox-crash");
    sine_wav(&s.path("in.wav"), 2);
    let args = sox_faulty(&s, "out.wav", "0.5", "1", "3", "0");
    let native = output(Command::new(host("sox")).args(&args).env("LADSPA_PATH", builtin_dir()));
    assert_eq!(native.status.signal(), Some(libc::SIGSEGV), "natively sox dies: {:?}", native.status);

    let log = s.path("events.log");
    let policy = recurring_crash_policy(&s);
    let out = output(
        ward()
            .args(["run", "--policy"])
            .arg(&policy)
            .args(["--log"])
            .arg(&log)
            .args(["--", "sox"])
            .args(&args)
            .env("LADSPA_PATH", builtin_dir()),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "under ward sox finishes: {:?}\n{err}", out.status);
    assert!(err.contains("ward: faulty_ladspa: fault: null dereference"), "{err}");
    assert!(err.contains("ward: faulty_ladspa: recovered in"), "{err}");
    assert!(err.contains("retried: succeeded"), "{err}");
    let logged = String::from_utf8_lossy(&read(&log)).into_owned();
    assert!(logged.contains("recovered in"), "the log file gets the events too: {logged}");

    // Every block was processed (transparent recovery, the failed block retried): the output is the input at half
    // gain, exactly as a run without the fault gives.
    let clean = sox_faulty(&s, "clean.wav", "0.5", "0", "0", "0");
    let reference = output(Command::new("sox").args(&clean).env("LADSPA_PATH", builtin_dir()));
    assert!(reference.status.success(), "{}", stderr(&reference));
    assert_eq!(read(&s.path("out.wav")), read(&s.path("clean.wav")));
}

/// Every plugin in one domain (`group = "host"`): the second plugin sox opens joins the running domain (and, for
/// a process, its zygote), so when it crashes the group restarts with both, and sox gets every block. `second` is
/// the other plugin's effect arguments.
fn sox_grouped_survives_a_crashing_plugin(isolation: &str, seconds: u32, second: &[&str]) {
    let s = Scratch::new("run", &format!("sox-grouped-{isolation}"));
    sine_wav(&s.path("in.wav"), seconds);
    let policy = s.path("policy.toml");
    // max_failures_in_row: see recurring_crash_policy.
    std::fs::write(&policy, "[defaults]\ngroup = \"host\"\nmax_failures_in_row = 0\n").expect("write the policy");
    let second: Vec<String> = second.iter().map(|a| a.to_string()).collect();
    let mut args = sox_faulty(&s, "out.wav", "0.5", "1", "3", "0");
    args.extend(second.clone());
    let out = output(
        ward()
            .args(["run", "--isolation", isolation, "--policy"])
            .arg(&policy)
            .args(["--", "sox"])
            .args(&args)
            .env("LADSPA_PATH", builtin_dir()),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{isolation}: {:?}\n{err}", out.status);
    assert!(err.contains("ward: host: fault: null dereference"), "the group's domain is named after it: {err}");
    assert!(err.contains("retried: succeeded"), "{err}");
    let mut clean = sox_faulty(&s, "clean.wav", "0.5", "0", "0", "0");
    clean.extend(second);
    let reference = output(Command::new("sox").args(&clean).env("LADSPA_PATH", builtin_dir()));
    assert!(reference.status.success(), "{}", stderr(&reference));
    assert_eq!(read(&s.path("out.wav")), read(&s.path("clean.wav")), "{isolation}: outputs differ");
}

#[test]
fn sox_with_its_plugins_in_one_domain_finishes_when_one_of_them_crashes() {
    sox_grouped_survives_a_crashing_plugin("process", 2, &["ladspa", "/usr/lib/ladspa/amp_1181.so", "amp", "-6"]);
}

#[test]
#[ignore = "needs PKU"]
fn under_mpk_sox_with_its_plugins_in_one_domain_finishes_when_one_of_them_crashes() {
    require_pku();
    sox_grouped_survives_a_crashing_plugin("mpk", 1, &["ladspa", "/usr/lib/ladspa/amp.so", "amp_mono", "0.5"]);
}

#[test]
fn sox_gets_its_audio_through_when_the_plugin_is_disabled() {
    let s = Scratch::new("run", "sox-disabled");
    sine_wav(&s.path("in.wav"), 1);
    let policy = s.path("policy.toml");
    std::fs::write(&policy, "[defaults]\nmax_restarts = 2\n").expect("write the policy");
    // Faults on every block: restarted twice, then disabled and bypassed.
    let args = sox_faulty(&s, "out.wav", "0.5", "3", "0", "1");
    let out = output(
        ward().args(["run", "--policy"]).arg(&policy).args(["--", "sox"]).args(&args).env("LADSPA_PATH", builtin_dir()),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{:?}\n{err}", out.status);
    assert!(err.contains("disabled after 2 restarts"), "{err}");
    // Bypassed: the input, not the half-gain output.
    let plain = output(Command::new("sox").arg("-D").arg(s.path("in.wav")).arg(s.path("plain.wav")));
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert_eq!(read(&s.path("out.wav")), read(&s.path("plain.wav")));
}

/// ffmpeg reading a generated test pattern and writing raw frames through a frei0r filter.
fn ffmpeg_args(filter: &str, out: &Path) -> Vec<String> {
    ffmpeg_pattern_args("testsrc=size=160x120:rate=25:duration=1", filter, out)
}

/// ffmpeg reading the lavfi test pattern `source` and writing raw RGBA frames through `filter` to `out`.
fn ffmpeg_pattern_args(source: &str, filter: &str, out: &Path) -> Vec<String> {
    let mut args: Vec<String> =
        ["-hide_banner", "-nostdin", "-loglevel", "error", "-f", "lavfi", "-i"].map(String::from).to_vec();
    args.push(source.into());
    args.extend(["-vf".into(), filter.into(), "-f".into(), "rawvideo".into(), "-pix_fmt".into(), "rgba".into()]);
    args.extend(["-y".into(), out.display().to_string()]);
    args
}

#[test]
fn ffmpeg_finishes_with_a_crashing_frei0r_filter_that_kills_it_natively() {
    let s = Scratch::new("run", "ffmpeg-crash");
    let crash = ffmpeg_args("frei0r=faulty_frei0r:1|5", &s.path("out.rgba"));
    let native = output(Command::new(host("ffmpeg")).args(&crash).env("FREI0R_PATH", builtin_dir()));
    assert_eq!(native.status.signal(), Some(libc::SIGSEGV), "natively ffmpeg dies: {:?}", native.status);

    let policy = recurring_crash_policy(&s);
    ffmpeg_recovers_the_crashing_filter(&s, ward().args(["run", "--policy"]).arg(&policy).args(["--", "ffmpeg"]));
}

/// Runs `ward_run` (a `ward run ... -- ffmpeg` command) with faulty_frei0r crashing at frame 5 and checks that
/// ffmpeg finishes, the fault is reported and recovered, and the frames are those of a run without the fault.
fn ffmpeg_recovers_the_crashing_filter(s: &Scratch, ward_run: &mut Command) {
    let crash = ffmpeg_args("frei0r=faulty_frei0r:1|5", &s.path("out.rgba"));
    let out = output(ward_run.args(&crash).env("FREI0R_PATH", builtin_dir()));
    let err = stderr(&out);
    assert!(out.status.success(), "under ward ffmpeg finishes: {:?}\n{err}", out.status);
    assert!(err.contains("ward: faulty_frei0r: fault: null dereference"), "{err}");
    assert!(err.contains("recovered in"), "{err}");

    // The same frames as a run without the fault.
    let clean = ffmpeg_args("frei0r=faulty_frei0r:0", &s.path("clean.rgba"));
    let reference = output(Command::new("ffmpeg").args(&clean).env("FREI0R_PATH", builtin_dir()));
    assert!(reference.status.success(), "{}", stderr(&reference));
    let (got, want) = (read(&s.path("out.rgba")), read(&s.path("clean.rgba")));
    assert_eq!(got.len(), 25 * 160 * 120 * 4);
    assert!(got == want, "frames differ from the run without the fault");
}

#[test]
fn ffmpeg_real_frei0r_filter_is_bit_identical_under_ward() {
    let s = Scratch::new("run", "ffmpeg-real");
    let args = ffmpeg_args("frei0r=invert0r", &s.path("native.rgba"));
    let native = output(Command::new(host("ffmpeg")).args(&args));
    assert!(native.status.success(), "{}", stderr(&native));
    let args = ffmpeg_args("frei0r=invert0r", &s.path("ward.rgba"));
    let out = output(ward().args(["run", "--verbose", "--isolation", "process", "--", "ffmpeg"]).args(&args));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("invert0r.so: frei0r plugin under ward (isolation process, domain process"), "{err}");
    // ffmpeg tries each directory of frei0r's search path in turn: where there is no such file, nothing is loaded
    // with ward or without, and ward says nothing about it.
    assert!(!err.contains("loaded without ward"), "{err}");
    assert!(read(&s.path("native.rgba")) == read(&s.path("ward.rgba")), "frames differ");
}

#[test]
fn bad_input_gets_one_clear_message_and_status_2() {
    let s = Scratch::new("run", "bad-input");
    let mut cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--isolation".into(), "sideways".into(), "--".into(), "true".into()], "sideways"),
        (vec!["--".into(), "/nonexistent/host".into()], "/nonexistent/host"),
        (
            vec!["--policy".into(), s.path("missing.toml").display().to_string(), "--".into(), "true".into()],
            "missing.toml",
        ),
    ];
    if !ward::mpk_available() {
        // mpk asked for where there are no protection keys: said, not silently run as something else.
        cases.push((vec!["--isolation".into(), "mpk".into(), "--".into(), "true".into()], "PKU"));
    }
    for (args, named) in cases {
        let out = output(ward().arg("run").args(&args));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(named), "{args:?}: the message names {named}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    }
    // Hosts the dynamic linker will not preload into: set-user-ID (passwd, in every Debian), statically linked.
    let out = output(ward().args(["run", "--", "/usr/bin/passwd", "--help"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("set-user-ID"), "{}", stderr(&out));
    std::fs::write(s.path("st.c"), "int main(void) { return 0; }\n").expect("write");
    let cc = output(Command::new("cc").arg("-static").arg("-o").arg(s.path("st")).arg(s.path("st.c")));
    assert!(cc.status.success(), "cc -static: {}", stderr(&cc));
    let out = output(ward().arg("run").arg("--").arg(s.path("st")));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("statically linked"), "{}", stderr(&out));
    // Static-PIE (Debian's own ldconfig is one): no interpreter either, so refused the same way.
    let cc = output(Command::new("cc").arg("-static-pie").arg("-o").arg(s.path("sp")).arg(s.path("st.c")));
    assert!(cc.status.success(), "cc -static-pie: {}", stderr(&cc));
    let out = output(ward().arg("run").arg("--").arg(s.path("sp")));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("static-PIE"), "{}", stderr(&out));
    // The dynamic linker run as a program has no interpreter of its own, but honours LD_PRELOAD: not refused.
    let out = output(ward().args(["run", "--", "/lib64/ld-linux-x86-64.so.2", "--version"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    std::fs::write(s.path("bad.toml"), "[defaults]\nmax_restarts = -1\n").expect("write");
    let out = output(ward().arg("run").arg("--policy").arg(s.path("bad.toml")).args(["--", "true"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("max_restarts"), "{}", stderr(&out));
}

#[test]
fn the_hosts_exit_status_is_passed_on_and_other_libraries_are_untouched() {
    let out = output(ward().args(["run", "--", "sh", "-c", "exit 7"]));
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    // A host that opens no plugin runs as it would without ward, and ward says nothing.
    let out = output(ward().args(["run", "--", "sox", "--version"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "nothing from ward when no plugin is opened: {}", stderr(&out));
}

#[test]
fn builtins_names_the_directory_hosts_find_the_test_plugins_in() {
    let out = output(ward().args(["builtins", "--dir"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    for name in ["faulty_ladspa.so", "faulty_frei0r.so", "well.so", "faulty.so"] {
        assert!(dir.join(name).is_file(), "{} has no {name}", dir.display());
    }
    let out = output(ward().arg("builtins"));
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(listing.lines().any(|l| l.starts_with("faulty_ladspa") && l.contains("faulty_ladspa.so")), "{listing}");
}

#[test]
fn a_host_opening_a_library_by_bare_name_finds_it_along_its_own_runpath_and_rpath() {
    let s = Scratch::new("run", "runpath");
    std::fs::create_dir_all(s.path("lib")).unwrap();
    std::fs::write(s.path("mod.c"), "int mod_value(void) { return 42; }\n").unwrap();
    let lib = s.path("lib/libwardmod.so");
    let built = output(Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(s.path("mod.c")));
    assert!(built.status.success(), "{}", stderr(&built));
    std::fs::write(
        s.path("host.c"),
        "#include <dlfcn.h>\n#include <stdio.h>\n\
         int main(void) {\n\
           void *h = dlopen(\"libwardmod.so\", RTLD_NOW);\n\
           if (!h) { fprintf(stderr, \"%s\\n\", dlerror()); return 3; }\n\
           int (*f)(void) = (int (*)(void))dlsym(h, \"mod_value\");\n\
           printf(\"%d\\n\", f());\n\
           return 0;\n\
         }\n",
    )
    .unwrap();
    for (host, tags) in [("host_runpath", "--enable-new-dtags"), ("host_rpath", "--disable-new-dtags")] {
        let exe = s.path(host);
        let built = output(
            Command::new("cc")
                .arg("-o")
                .arg(&exe)
                .arg(s.path("host.c"))
                .arg(format!("-Wl,-rpath,$ORIGIN/lib,{tags}"))
                .arg("-ldl"),
        );
        assert!(built.status.success(), "{}", stderr(&built));
        let native = output(&mut Command::new(&exe));
        assert_eq!(String::from_utf8_lossy(&native.stdout), "42\n", "{host} natively: {}", stderr(&native));
        let under = output(ward().arg("run").arg("--").arg(&exe));
        assert!(under.status.success(), "{host} under ward: {}", stderr(&under));
        assert_eq!(String::from_utf8_lossy(&under.stdout), "42\n", "{host} under ward");
    }
}

/// ffmpeg at 640x480 (1.2 MB frames: heap blocks of the shim's arena) through a frei0r filter.
fn ffmpeg_large_frames(filter: &str, out: &Path) -> Vec<String> {
    ffmpeg_pattern_args("testsrc=size=640x480:rate=25:duration=0.4", filter, out)
}

#[test]
fn ffmpeg_frames_cross_in_place_and_come_out_bit_identical() {
    let s = Scratch::new("run", "ffmpeg-in-place");
    // invert0r reads its input and writes every output pixel; cairogradient writes into its "const" input frame
    // (premultiplying it in place), which in place means a private copy of the pages it writes.
    for filter in ["invert0r", "cairogradient"] {
        let native = output(
            Command::new(host("ffmpeg"))
                .args(ffmpeg_large_frames(&format!("frei0r={filter}"), &s.path(&format!("{filter}-native.rgba")))),
        );
        assert!(native.status.success(), "{}", stderr(&native));
        let args = ffmpeg_large_frames(&format!("frei0r={filter}"), &s.path(&format!("{filter}-ward.rgba")));
        let out = output(ward().args(["run", "--verbose", "--isolation", "process", "--", "ffmpeg"]).args(&args));
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        assert!(err.contains("heap blocks of 1 MiB and more come from ward's arena"), "{err}");
        // 10 frames, each an input and an output lent in place.
        let lent = err
            .lines()
            .find_map(|l| l.split(" restarts, ").nth(1)?.strip_suffix(" buffers lent in place)")?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no closing line with the buffers lent in place: {err}"));
        assert!(lent >= 20, "{filter}: {lent} buffers lent in place\n{err}");
        assert!(
            read(&s.path(&format!("{filter}-native.rgba"))) == read(&s.path(&format!("{filter}-ward.rgba"))),
            "{filter}: frames differ"
        );
    }
    // WARD_ARENA=0 turns it off: the same frames, all copied.
    let args = ffmpeg_large_frames("frei0r=invert0r", &s.path("copied.rgba"));
    let out = output(
        ward().args(["run", "--verbose", "--isolation", "process", "--", "ffmpeg"]).args(&args).env("WARD_ARENA", "0"),
    );
    let err = stderr(&out);
    assert!(out.status.success() && !err.contains("ward's arena"), "{err}");
    assert!(err.contains(" 0 buffers lent in place"), "{err}");
    assert!(read(&s.path("invert0r-native.rgba")) == read(&s.path("copied.rgba")), "frames differ");
}

#[test]
fn ffmpeg_recovers_a_crashing_filter_on_frames_lent_in_place() {
    let s = Scratch::new("run", "ffmpeg-in-place-crash");
    let crash = ffmpeg_large_frames("frei0r=faulty_frei0r:1|4", &s.path("out.rgba"));
    let policy = recurring_crash_policy(&s);
    let out = output(
        ward()
            .args(["run", "--policy"])
            .arg(&policy)
            .args(["--", "ffmpeg"])
            .args(&crash)
            .env("FREI0R_PATH", builtin_dir()),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "under ward ffmpeg finishes: {:?}\n{err}", out.status);
    assert!(err.contains("ward: faulty_frei0r: fault: null dereference"), "{err}");
    let clean = ffmpeg_large_frames("frei0r=faulty_frei0r:0", &s.path("clean.rgba"));
    let reference = output(Command::new("ffmpeg").args(&clean).env("FREI0R_PATH", builtin_dir()));
    assert!(reference.status.success(), "{}", stderr(&reference));
    assert!(read(&s.path("out.rgba")) == read(&s.path("clean.rgba")), "frames differ from the run without the fault");
}

/// A host exercising the malloc family on large blocks, and fork: prints where its first block lives.
const HEAP_HOST: &str = r#"
#define _GNU_SOURCE
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG (8u << 20)
static int fail(const char *what) { fprintf(stderr, "heap host: %s\n", what); return 1; }

/* Whether p lies in a mapping whose name contains `name` (from /proc/self/maps). */
static int in_mapping(void *p, const char *name) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (f && fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi)
            found = strstr(line, name) != NULL;
    }
    if (f) fclose(f);
    return found;
}

int main(void) {
    unsigned char *a = malloc(BIG);
    if (!a) return fail("malloc");
    memset(a, 1, BIG);
    unsigned char *z = calloc(4, BIG / 4);
    if (!z) return fail("calloc");
    for (size_t i = 0; i < BIG; i += 4096) if (z[i]) return fail("calloc not zero");
    void *p = NULL;
    if (posix_memalign(&p, 4096, BIG) || ((uintptr_t)p & 4095)) return fail("posix_memalign");
    if (malloc_usable_size(p) < BIG) return fail("malloc_usable_size");
    unsigned char *r = realloc(a, 2 * BIG);
    if (!r || r[0] != 1 || r[BIG - 1] != 1) return fail("realloc up");
    memset(r + BIG, 2, BIG);
    r = realloc(r, 100);
    if (!r || r[0] != 1 || r[99] != 1) return fail("realloc down");
    /* A forked child writing its copy of a block leaves the parent's alone, and can allocate. */
    unsigned char *f = malloc(BIG);
    memset(f, 7, BIG);
    pid_t pid = fork();
    if (pid == 0) {
        memset(f, 9, BIG);
        unsigned char *c = malloc(BIG);
        if (!c) _exit(2);
        memset(c, 3, BIG);
        free(c);
        free(f);
        _exit(f == NULL);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return fail("child");
    if (f[0] != 7 || f[BIG - 1] != 7) return fail("the child's writes reached the parent");
    free(z); free(p); free(r);
    unsigned char *again = malloc(BIG);
    printf("%s\n", in_mapping(again, "ward-arena") ? "arena" : "heap");
    free(again);
    free(f);
    return 0;
}
"#;

#[test]
fn the_shim_serves_large_heap_blocks_from_the_arena_and_forks_keep_them_apart() {
    let s = Scratch::new("run", "heap");
    std::fs::write(s.path("heap.c"), HEAP_HOST).unwrap();
    let exe = s.path("heap_host");
    let built = output(Command::new("cc").arg("-O1").arg("-o").arg(&exe).arg(s.path("heap.c")));
    assert!(built.status.success(), "{}", stderr(&built));
    let native = output(&mut Command::new(&exe));
    assert!(native.status.success(), "natively: {}", stderr(&native));
    assert_eq!(String::from_utf8_lossy(&native.stdout), "heap\n");
    for (isolation, arena, expect) in
        [("process", None, "arena"), ("none", None, "heap"), ("process", Some("0"), "heap")]
    {
        let mut cmd = ward();
        cmd.args(["run", "--isolation", isolation, "--"]).arg(&exe);
        if let Some(v) = arena {
            cmd.env("WARD_ARENA", v);
        }
        let out = output(&mut cmd);
        assert!(out.status.success(), "{isolation} {arena:?}: {}", stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{expect}\n"), "{isolation} {arena:?}");
    }
}

/// `cmd`'s output; a command still running after `limit` is killed and the test fails (a safety net against a
/// hung host, never a measurement: a host that is only slow has far more time than it needs).
fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::process::Stdio;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap_or_else(|e| panic!("cannot wait for {cmd:?}: {e}")),
        Err(_) => {
            // The child this test started, by its own pid (ward run execs the host in place).
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("{cmd:?} still ran after {limit:?}: the host hung");
        }
    }
}

const SAFETY_NET: std::time::Duration = std::time::Duration::from_secs(120);

/// A policy for the bad plugins: a short deadline, so a plugin hanging in its constructor is given up on soon.
fn short_deadline_policy(s: &Scratch) -> PathBuf {
    let policy = s.path("policy.toml");
    std::fs::write(&policy, "[defaults]\ndeadline_ms = 1500\nmax_restarts = 2\n").expect("write the policy");
    policy
}

/// The one line ward says about refusing `file`, and how many there are.
fn refusals(err: &str, file: &str) -> Vec<String> {
    err.lines()
        .filter(|l| l.starts_with("ward: ") && l.contains(file) && l.contains(": not loaded: "))
        .map(String::from)
        .collect()
}

/// `plugin` (a built-in bad_ladspa_*) fails under ward before the host can use it: analyseplugin and sox, which it
/// kills or hangs natively, get a load error instead, exit without a signal, and ward says once why.
fn refused_under_ward(plugin: &str) {
    let s = Scratch::new("run", plugin);
    let policy = short_deadline_policy(&s);
    let file = format!("{plugin}.so");
    let path = builtin_dir().join(&file);

    let out = output_within(
        ward()
            .args(["run", "--isolation", "process", "--policy"])
            .arg(&policy)
            .args(["--", host("analyseplugin")])
            .arg(&path),
        SAFETY_NET,
    );
    let err = stderr(&out);
    assert_eq!(out.status.signal(), None, "analyseplugin {plugin}: {:?}\n{err}", out.status);
    assert!(!out.status.success(), "analyseplugin {plugin} cannot have described it: {err}");
    let said = refusals(&err, &file);
    assert_eq!(said.len(), 1, "analyseplugin {plugin}: one line says why: {err}");
    assert!(said[0].contains("failed under ward"), "{err}");
    // The host's dlerror() gives ward's reason, naming the plugin.
    assert!(
        err.lines().any(|l| !l.starts_with("ward: ") && l.contains(&file) && l.contains("refused by ward")),
        "{err}"
    );

    sine_wav(&s.path("in.wav"), 1);
    let args = ["-D".into(), s.path("in.wav").display().to_string(), s.path("out.wav").display().to_string()]
        .into_iter()
        .chain(["ladspa", plugin, "bad"].map(String::from));
    let out = output_within(
        ward()
            .args(["run", "--isolation", "process", "--policy"])
            .arg(&policy)
            .args(["--", host("sox")])
            .args(args)
            .env("LADSPA_PATH", builtin_dir()),
        SAFETY_NET,
    );
    let err = stderr(&out);
    assert_eq!(out.status.signal(), None, "sox {plugin}: {:?}\n{err}", out.status);
    assert!(!out.status.success(), "sox {plugin} cannot have run it: {err}");
    let said = refusals(&err, &file);
    assert_eq!(said.len(), 1, "sox {plugin}: one line says why: {err}");
    assert!(said[0].contains("failed under ward"), "{err}");
}

#[test]
fn a_plugin_whose_constructor_crashes_is_refused() {
    refused_under_ward("bad_ladspa_ctor_crash");
}

#[test]
fn a_plugin_whose_constructor_hangs_is_refused() {
    refused_under_ward("bad_ladspa_ctor_hang");
}

#[test]
fn a_plugin_whose_descriptor_is_a_wild_pointer_is_refused() {
    refused_under_ward("bad_ladspa_wild");
}

#[test]
fn a_plugin_claiming_a_billion_ports_is_refused() {
    refused_under_ward("bad_ladspa_ports");
}

#[test]
fn a_plugin_with_null_port_arrays_is_refused() {
    refused_under_ward("bad_ladspa_null_ports");
}

#[test]
fn a_plugin_with_an_unterminated_name_is_refused() {
    refused_under_ward("bad_ladspa_unterminated");
}

/// The shim and the domain program, beside the `ward` program.
fn shim_env(cmd: &mut Command) -> &mut Command {
    let ward = Path::new(env!("CARGO_BIN_EXE_ward"));
    cmd.env("LD_PRELOAD", ward.with_file_name("libward_preload.so"))
        .env("WARD_DOMAIN", ward.with_file_name("ward-domain"))
        .env("WARD_ISOLATION", "process")
        .env("WARD_CACHE_DIR", common::fresh_cache_dir())
}

#[test]
fn with_an_unusable_policy_the_shim_loads_no_plugin_without_ward() {
    let s = Scratch::new("run", "shim-bad-policy");
    std::fs::write(s.path("bad.toml"), "[defaults]\nmax_restarts = -1\n").expect("write");
    // ward run would refuse this policy; a host started with the shim directly must not load plugins unprotected.
    let amp = "/usr/lib/ladspa/amp.so";
    for policy in [s.path("bad.toml"), s.path("missing.toml"), PathBuf::from("/dev/zero")] {
        let out = output_within(
            shim_env(&mut Command::new(host("analyseplugin"))).env("WARD_POLICY", &policy).arg(amp),
            SAFETY_NET,
        );
        let err = stderr(&out);
        assert!(!out.status.success(), "{}: {err}", policy.display());
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("Mono Amplifier"),
            "{}: described: {err}",
            policy.display()
        );
        let said = refusals(&err, "amp.so");
        assert_eq!(said.len(), 1, "{}: {err}", policy.display());
        assert!(said[0].contains("the policy (WARD_POLICY) is unusable"), "{err}");
        assert!(said[0].contains(&policy.display().to_string()), "the policy is named: {err}");
    }
}

#[test]
fn native_fallback_false_refuses_a_plugin_ward_has_no_class_for() {
    let s = Scratch::new("run", "native-fallback");
    // A plugin of an ABI ward has no class for: it exports vampGetPluginDescriptor, and no ladspa_descriptor.
    std::fs::write(
        s.path("vamp.c"),
        "const void *vampGetPluginDescriptor(unsigned v, unsigned i) { (void)v; (void)i; return 0; }\n",
    )
    .unwrap();
    let lib = s.path("fake_vamp.so");
    let built = output(Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(s.path("vamp.c")));
    assert!(built.status.success(), "{}", stderr(&built));
    let strict = s.path("strict.toml");
    std::fs::write(&strict, "[extension.fake_vamp]\nnative_fallback = false\n").unwrap();

    // By default it is loaded without ward: analyseplugin itself finds no LADSPA entry point in it.
    let out = output_within(ward().args(["run", "--", host("analyseplugin")]).arg(&lib), SAFETY_NET);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(refusals(&err, "fake_vamp.so").is_empty(), "loaded natively: {err}");
    assert!(!err.contains("refused by ward"), "{err}");

    // native_fallback = false: dlopen itself fails, and says why.
    let out = output_within(
        ward().args(["run", "--policy"]).arg(&strict).args(["--", host("analyseplugin")]).arg(&lib),
        SAFETY_NET,
    );
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    let said = refusals(&err, "fake_vamp.so");
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("a Vamp plugin, which ward has no class for"), "{err}");
    assert!(said[0].contains("native_fallback = false"), "{err}");
    assert!(err.lines().any(|l| !l.starts_with("ward: ") && l.contains("refused by ward")), "dlerror says it: {err}");

    // Ordinary libraries the host opens are never affected: sox opens its format libraries by path.
    std::fs::write(s.path("all.toml"), "[defaults]\nnative_fallback = false\n").unwrap();
    sine_wav(&s.path("in.wav"), 1);
    let out = output_within(
        ward()
            .args(["run", "--policy"])
            .arg(s.path("all.toml"))
            .args(["--", host("sox"), "-D"])
            .arg(s.path("in.wav"))
            .arg(s.path("out.wav"))
            .args(["vol", "0.5"]),
        SAFETY_NET,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}

#[test]
fn policies_that_cannot_work_stop_ward_run_before_the_host() {
    let s = Scratch::new("run", "policy-cannot-work");
    std::fs::write(s.path("tiny.toml"), "[defaults.limits]\naddress_space_mb = 1\n").unwrap();
    std::fs::write(s.path("restart.toml"), "[extension.amp]\nrestart_from = \"v2/amp.so\"\n").unwrap();
    let cases = [
        (s.path("tiny.toml"), "address_space_mb"),
        (s.path("restart.toml"), "v2/amp.so"),
        (PathBuf::from("/dev/zero"), "not a regular file"),
    ];
    for (policy, named) in cases {
        let out = output_within(ward().arg("run").arg("--policy").arg(&policy).args(["--", "true"]), SAFETY_NET);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{}: {err}", policy.display());
        assert!(err.contains(named), "{}: names {named}: {err}", policy.display());
        assert_eq!(err.lines().count(), 1, "{}: one line: {err}", policy.display());
    }
}

/// A host that asks each plugin which frei0r entry points it has (as ffmpeg does to learn a plugin's type) gets the
/// same answers under ward as natively: the proxy exports the plugin's entry points, not all of the class's.
#[test]
fn a_plugins_proxy_exports_exactly_the_entry_points_the_plugin_does() {
    let s = Scratch::new("run", "proxy-exports");
    let source = s.path("entries.c");
    std::fs::write(
        &source,
        r#"#include <dlfcn.h>
#include <stdio.h>
static const char *entries[] = {"f0r_init", "f0r_deinit", "f0r_get_plugin_info", "f0r_get_param_info",
    "f0r_construct", "f0r_destruct", "f0r_set_param_value", "f0r_get_param_value", "f0r_update", "f0r_update2"};
int main(int argc, char **argv) {
    for (int a = 1; a < argc; a++) {
        void *h = dlopen(argv[a], RTLD_NOW);
        if (!h) { printf("%s: cannot open\n", argv[a]); continue; }
        for (unsigned i = 0; i < sizeof entries / sizeof *entries; i++)
            printf("%s %s %s\n", argv[a], entries[i], dlsym(h, entries[i]) ? "yes" : "no");
    }
    return 0;
}
"#,
    )
    .expect("write the host");
    let host_path = s.path("entries");
    let cc = output(Command::new("cc").arg("-o").arg(&host_path).arg(&source));
    assert!(cc.status.success(), "cc: {}", stderr(&cc));
    // uvmap and RGB export f0r_update2 only, invert0r f0r_update only (Debian's frei0r-plugins, from scripts/deps).
    let plugins: Vec<String> =
        ["uvmap", "RGB", "invert0r"].iter().map(|p| format!("/usr/lib/frei0r-1/{p}.so")).collect();
    for p in &plugins {
        assert!(Path::new(p).is_file(), "{p} is not installed: run scripts/deps (it installs frei0r-plugins)");
    }
    let native = output(Command::new(&host_path).args(&plugins));
    assert!(native.status.success(), "{}", stderr(&native));
    let text = String::from_utf8_lossy(&native.stdout).into_owned();
    assert!(text.contains("uvmap.so f0r_update no") && text.contains("invert0r.so f0r_update2 no"), "{text}");
    let under = output(ward().args(["run", "-v", "--"]).arg(&host_path).args(&plugins));
    assert!(under.status.success(), "{}", stderr(&under));
    // Only looked up, never constructed: described under ward, without a domain of its own.
    assert!(stderr(&under).contains("uvmap.so: frei0r plugin described under ward"), "{}", stderr(&under));
    assert_eq!(String::from_utf8_lossy(&under.stdout), text, "{}", stderr(&under));
}

/// Issue 33: a host mixing two frames through Debian's UV Map (a mixer2, which reads up to a row and a pixel past its
/// second input frame), natively with that frame followed by zeros (so its result is deterministic) and under
/// `ward run`: the plugin is neither faulted nor bypassed, and every frame comes out as natively. Frames of 64x36
/// (copied through the pools) and 1920x1080 (8 MB, served from the shim's arena and lent in place).
#[test]
fn uv_map_mixing_two_frames_reads_zeros_past_its_input_and_gives_the_native_output() {
    let s = Scratch::new("run", "uvmap-overread");
    let source = s.path("mix.c");
    std::fs::write(
        &source,
        r#"#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
typedef int (*init_fn)(void);
typedef void *(*construct_fn)(unsigned, unsigned);
typedef void (*update2_fn)(void *, double, const uint32_t *, const uint32_t *, const uint32_t *, uint32_t *);
static uint32_t next(uint32_t *x) { *x ^= *x << 13; *x ^= *x >> 17; *x ^= *x << 5; return *x; }
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    init_fn init = (init_fn)dlsym(h, "f0r_init");
    construct_fn construct = (construct_fn)dlsym(h, "f0r_construct");
    update2_fn update2 = (update2_fn)dlsym(h, "f0r_update2");
    if (!init || !construct || !update2 || !init()) return 1;
    unsigned sizes[2][2] = {{64, 36}, {1920, 1080}};
    for (int k = 0; k < 2; k++) {
        unsigned w = sizes[k][0], hh = sizes[k][1];
        size_t n = (size_t)w * hh;
        void *inst = construct(w, hh);
        uint32_t *map = malloc(n * 4), *out = malloc(n * 4);
        /* Natively UV Map reads what follows its source frame: zeros here, for a result that does not depend on
         * the heap. */
        uint32_t *src = calloc(n + w + 1024, 4);
        if (!inst || !map || !out || !src) return 1;
        uint32_t x = 12345;
        for (int frame = 0; frame < 3; frame++) {
            for (size_t i = 0; i < n; i++) {
                uint32_t r = next(&x);
                map[i] = r & 0x80ffffffu;
                src[i] = next(&x);
            }
            map[0] = 0x00ff00ffu; /* red 255, green 0, blue 255: reads a row and a pixel past the source */
            update2(inst, frame / 25.0, map, src, NULL, out);
            uint64_t hash = 1469598103934665603ull;
            for (size_t i = 0; i < n; i++) { hash ^= out[i]; hash *= 1099511628211ull; }
            printf("%ux%u frame %d: %016llx first %08x\n", w, hh, frame, (unsigned long long)hash, out[0]);
        }
    }
    return 0;
}
"#,
    )
    .expect("write the host");
    let host_path = s.path("mix");
    let cc = output(Command::new("cc").arg("-O2").arg("-o").arg(&host_path).arg(&source).arg("-ldl"));
    assert!(cc.status.success(), "cc: {}", stderr(&cc));
    let plugin = "/usr/lib/frei0r-1/uvmap.so";
    assert!(Path::new(plugin).is_file(), "{plugin} is not installed: run scripts/deps (it installs frei0r-plugins)");
    let native = output(Command::new(&host_path).arg(plugin));
    assert!(native.status.success(), "{}", stderr(&native));
    let text = String::from_utf8_lossy(&native.stdout).into_owned();
    assert_eq!(text.lines().count(), 6, "{text}");
    assert!(text.lines().all(|l| l.ends_with("first 00000000")), "the pixel read past the frame: {text}");
    for isolation in ["process", "none"] {
        let under = output(ward().args(["run", "-v", "--isolation", isolation, "--"]).arg(&host_path).arg(plugin));
        let err = stderr(&under);
        assert!(under.status.success(), "{isolation}: {err}");
        assert!(err.contains("uvmap.so: frei0r plugin under ward"), "{isolation}: {err}");
        assert!(!err.contains("fault") && !err.contains("bypass") && !err.contains("disabled"), "{isolation}: {err}");
        assert_eq!(String::from_utf8_lossy(&under.stdout), text, "{isolation}: {err}");
    }
}

/// sox reading raw audio from a pipe through Debian's amp and writing WAV to its standard output, in a process group
/// of its own (as a shell's foreground job is), natively or under `ward run`: once its flow runs (its plugin loaded)
/// and it waits for more input, SIGINT to its process group, as Ctrl-C in a terminal sends it, and then the end of
/// its input. Raw, not WAV: a WAV header says how much comes, and sox would end without waiting for more.
fn interrupted(s: &Scratch, under_ward: bool) -> Output {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let raw = read(&s.path("in.raw"));
    let mut cmd = if under_ward {
        let mut c = ward();
        c.args(["run", "--isolation", "process", "--", host("sox")]);
        c
    } else {
        Command::new(host("sox"))
    };
    cmd.args(["-D", "-t", "raw", "-r", "48000", "-e", "signed", "-b", "16", "-c", "1", "-", "-t", "wav", "-"])
        .args(["ladspa", "/usr/lib/ladspa/amp.so", "amp_mono", "0.5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("sox's output")));
    let stderr = drain(Box::new(child.stderr.take().expect("sox's standard error")));
    let mut input = child.stdin.take().expect("sox's input");
    // Several times what a pipe holds: once it is all written, sox has read most of it, so it has loaded its plugin
    // and its flow runs.
    assert!(raw.len() > 4 * 65536, "a long enough input");
    input.write_all(&raw).expect("feed sox");
    // Then wait (bounded) until it has read the rest, and is waiting for more.
    let started = std::time::Instant::now();
    loop {
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, the bytes not yet read from the pipe, into `unread`.
        let rc = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&input), libc::FIONREAD, &mut unread) };
        if rc != 0 || unread == 0 {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(120), "sox does not read its input");
        std::thread::yield_now();
    }
    // SAFETY: kill takes no pointers; the group is the one the child (not yet reaped) leads.
    assert_eq!(unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGINT) }, 0);
    drop(input);
    let status = child.wait().expect("wait for sox");
    Output {
        status,
        stdout: stdout.join().expect("the output reader"),
        stderr: stderr.join().expect("the standard error reader"),
    }
}

/// Issue 33: domains live outside the host's process group and session, so Ctrl-C (SIGINT to the host's group)
/// never reaches them: no fault reported, and sox ends as it does natively.
#[test]
fn sigint_to_the_hosts_process_group_reaches_no_domain_and_the_host_ends_as_natively() {
    let s = Scratch::new("run", "sigint");
    let made = output(
        Command::new(host("sox"))
            .args(["-D", "-n", "-r", "48000", "-c", "1", "-b", "16", "-e", "signed"])
            .args(["-t", "raw"])
            .arg(s.path("in.raw"))
            .args(["synth", "4", "sine", "440", "vol", "0.5"]),
    );
    assert!(made.status.success(), "sox could not make a test signal: {}", stderr(&made));
    let native = interrupted(&s, false);
    let warded = interrupted(&s, true);
    let err = stderr(&warded);
    assert_eq!(
        (warded.status.code(), warded.status.signal()),
        (native.status.code(), native.status.signal()),
        "sox ends under ward as natively\nnative: {}\nunder ward: {err}",
        stderr(&native)
    );
    let reported: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ward: "))
        .filter(|l| ["fault", "vanished", "recovered", "retried", "disabled"].iter().any(|w| l.contains(w)))
        .collect();
    assert!(reported.is_empty(), "ward reported something: {reported:?}\n{err}");
    assert!(warded.stdout.starts_with(b"RIFF"), "sox wrote its WAV: {err}");
    assert_eq!(warded.stdout.len(), native.stdout.len(), "sox wrote as much under ward as natively");
}

/// The hang detector of the tests below: a host still running after this is killed and the test fails. Never a
/// measurement: with the default policy each of these hosts finishes in seconds.
const GIVE_UP_NET: std::time::Duration = std::time::Duration::from_secs(60);

/// The host finished, its plugin's hangs in `call` (the plugin's call, as the host made it) were reported, and the
/// plugin was disabled (the same call failing three times in a row, whatever the restart limit allows) with a
/// message saying what the host gets instead.
fn assert_given_up(out: &Output, plugin: &str, call: &str, host_gets: &str) {
    let err = stderr(out);
    assert!(out.status.success(), "the host finishes: {:?}\n{err}", out.status);
    assert!(err.contains(&format!("ward: {plugin}: fault: hang (no reply within")), "{err}");
    let disabled = err.lines().find(|l| l.starts_with(&format!("ward: {plugin}: disabled "))).unwrap_or_default();
    assert!(
        disabled.contains(&format!("after {call} failed 3 times in a row, each time again after its recovery")),
        "{err}"
    );
    assert!(disabled.ends_with(&format!("from now on {host_gets}")), "{err}");
}

const AUDIO_BYPASS: &str = "audio passes through unchanged (outputs with no input of their own are silent)";
const FRAME_BYPASS: &str = "frames pass through unchanged (a source's frames are left as the host gave them)";

#[test]
fn sox_with_a_plugin_hanging_on_every_block_from_the_tenth_finishes_with_it_disabled() {
    let s = Scratch::new("run", "sox-hang");
    // About 60 blocks: restarted without its history, the plugin counts its blocks from 1 again and hangs again
    // ten blocks into each incarnation, so the third hang comes at about the 28th block.
    sine_wav(&s.path("in.wav"), 10);
    let args = sox_faulty(&s, "out.wav", "0.5", "5", "10", "1");
    let out =
        output_within(ward().args(["run", "--", "sox"]).args(&args).env("LADSPA_PATH", builtin_dir()), GIVE_UP_NET);
    assert_given_up(&out, "faulty_ladspa", "run", AUDIO_BYPASS);
    // Every block came out, processed or passed through: as long as the output of a run without the fault.
    let clean = sox_faulty(&s, "clean.wav", "0.5", "0", "0", "0");
    let reference = output(Command::new("sox").args(&clean).env("LADSPA_PATH", builtin_dir()));
    assert!(reference.status.success(), "{}", stderr(&reference));
    assert_eq!(read(&s.path("out.wav")).len(), read(&s.path("clean.wav")).len());
}

#[test]
fn applyplugin_with_a_plugin_hanging_on_every_block_from_the_tenth_finishes_with_it_disabled() {
    let s = Scratch::new("run", "applyplugin-hang");
    sine_wav(&s.path("in.wav"), 3);
    let plugin = builtin_dir().join("faulty_ladspa.so");
    // Gain, fault kind (5: spin forever), at block 10, repeat.
    let controls = ["faulty_amp", "0.5", "5", "10", "1"];
    let out = output_within(
        ward()
            .args(["run", "--", "applyplugin"])
            .arg(s.path("in.wav"))
            .arg(s.path("out.wav"))
            .arg(&plugin)
            .args(controls),
        GIVE_UP_NET,
    );
    assert_given_up(&out, "faulty_ladspa", "run", AUDIO_BYPASS);
}

#[test]
fn ffmpeg_with_a_ladspa_plugin_hanging_on_every_block_from_the_tenth_finishes_with_it_disabled() {
    let s = Scratch::new("run", "ffmpeg-ladspa-hang");
    sine_wav(&s.path("in.wav"), 10);
    let filter = "ladspa=f=faulty_ladspa:p=faulty_amp:c=c0=0.5|c1=5|c2=10|c3=1";
    let out = output_within(
        ward()
            .args(["run", "--", "ffmpeg", "-hide_banner", "-nostdin", "-loglevel", "error", "-i"])
            .arg(s.path("in.wav"))
            .args(["-af", filter, "-y"])
            .arg(s.path("out.wav"))
            .env("LADSPA_PATH", builtin_dir()),
        GIVE_UP_NET,
    );
    assert_given_up(&out, "faulty_ladspa", "run", AUDIO_BYPASS);
}

#[test]
fn ffmpeg_with_a_frei0r_filter_hanging_on_every_frame_from_the_tenth_finishes_with_it_disabled() {
    let s = Scratch::new("run", "ffmpeg-frei0r-hang");
    // Fault kind 5 (spin forever), from frame 10, repeated.
    // 75 frames: the third hang comes at about the 28th (see the sox test).
    let source = "testsrc=size=160x120:rate=25:duration=3";
    let args = ffmpeg_pattern_args(source, "frei0r=faulty_frei0r:5|10|y", &s.path("out.rgba"));
    let out =
        output_within(ward().args(["run", "--", "ffmpeg"]).args(&args).env("FREI0R_PATH", builtin_dir()), GIVE_UP_NET);
    assert_given_up(&out, "faulty_frei0r", "f0r_update", FRAME_BYPASS);
    assert_eq!(read(&s.path("out.rgba")).len(), 75 * 160 * 120 * 4, "every frame came out");
}

/// Debian's frei0r Curves hangs on its first frame, natively too. Under ward with the default policy ffmpeg gets
/// every frame through unchanged: the frames of the same pipeline without the filter.
#[test]
fn ffmpeg_with_debians_curves_which_hangs_on_its_first_frame_finishes_with_the_frames_passed_through() {
    let s = Scratch::new("run", "ffmpeg-curves");
    let args = ffmpeg_args("frei0r=curves", &s.path("out.rgba"));
    let out = output_within(ward().args(["run", "--", host("ffmpeg")]).args(&args), GIVE_UP_NET);
    assert_given_up(&out, "curves", "f0r_update", FRAME_BYPASS);
    let plain = ffmpeg_args("null", &s.path("plain.rgba"));
    let reference = output(Command::new("ffmpeg").args(&plain));
    assert!(reference.status.success(), "{}", stderr(&reference));
    assert!(read(&s.path("out.rgba")) == read(&s.path("plain.rgba")), "the frames passed through unchanged");
}

/// A fault names the plugin's call as the host made it (LADSPA's `run`, frei0r's `f0r_update`), never the adapter
/// function of ward's that makes it for the host (`ward_ladspa_run`, `ward_frei0r_update`).
#[test]
fn a_faults_message_names_the_plugins_call_not_wards_adapter() {
    let s = Scratch::new("run", "fault-names");
    sine_wav(&s.path("in.wav"), 1);
    let sox = output(
        ward()
            .args(["run", "--", "sox"])
            .args(sox_faulty(&s, "out.wav", "0.5", "1", "3", "0"))
            .env("LADSPA_PATH", builtin_dir()),
    );
    let ffmpeg = output(
        ward()
            .args(["run", "--", "ffmpeg"])
            .args(ffmpeg_args("frei0r=faulty_frei0r:1|5", &s.path("out.rgba")))
            .env("FREI0R_PATH", builtin_dir()),
    );
    for (out, plugin, call) in [(&sox, "faulty_ladspa", "run"), (&ffmpeg, "faulty_frei0r", "f0r_update")] {
        let err = stderr(out);
        assert!(out.status.success(), "{plugin}: {:?}\n{err}", out.status);
        let fault = err.lines().find(|l| l.starts_with(&format!("ward: {plugin}: fault: "))).unwrap_or_default();
        assert!(fault.contains(&format!(" in call {call} (domain {plugin}, incarnation 1)")), "{err}");
        assert!(err.contains(&format!("ward: {plugin}: {call} retried: succeeded")), "{err}");
        assert!(!err.contains("ward_"), "no adapter function is named: {err}");
    }
}

/// `-v` says once per `ward run` that the host's large heap blocks come from ward's arena, not once in every
/// process of the host's: a shell that runs another shell that runs a program is one host.
#[test]
fn verbose_says_where_the_heap_comes_from_once_however_many_programs_the_host_runs() {
    let arena_line = "ward: heap blocks of 1 MiB and more come from ward's arena";
    let count = |out: &Output| stderr(out).lines().filter(|l| l.starts_with(arena_line)).count();
    let single = output(ward().args(["run", "-v", "--isolation", "process", "--", "true"]));
    assert!(single.status.success(), "{}", stderr(&single));
    assert_eq!(count(&single), 1, "a host of one process says it: {}", stderr(&single));
    // sh, a second sh (forked and exec'd), and true exec'd by each: four processes with the shim.
    let script = "sh -c 'true; true'; true";
    let tree = output(ward().args(["run", "-v", "--isolation", "process", "--", "sh", "-c", script]));
    assert!(tree.status.success(), "{}", stderr(&tree));
    assert_eq!(count(&tree), 1, "{}", stderr(&tree));
    // A mark left in the environment by an earlier `ward run` does not silence this one.
    let marked = output(ward().args(["run", "-v", "--isolation", "process", "--", "true"]).env("WARD_ARENA_SAID", "1"));
    assert_eq!(count(&marked), 1, "{}", stderr(&marked));
}

/// A history that outgrows its bound is said once, and only when asked for (`-v`): nothing failed, but a recovery
/// from then on rebuilds the plugin's state from a window of the stream, not exactly.
#[test]
fn verbose_says_once_that_a_history_outgrew_its_bound_and_quiet_runs_do_not() {
    let s = Scratch::new("run", "history-bound");
    sweep_wav(&s.path("in.wav"));
    std::fs::write(s.path("policy.toml"), "[defaults]\nhistory_mb = 1\n").unwrap();
    let line = "delay_1898: history past its bound (1 MiB";
    let sox = |verbose: bool| {
        let mut cmd = ward();
        cmd.arg("run");
        if verbose {
            cmd.arg("-v");
        }
        cmd.arg("--policy").arg(s.path("policy.toml")).args(["--isolation", "process", "--", host("sox")]);
        // 4 s of mono at 48 kHz is 768 KB of input blocks: five passes through the delay outgrow 1 MiB.
        cmd.arg(s.path("in.wav")).arg(s.path("out.wav")).args(["repeat", "4", "ladspa"]);
        cmd.args(["/usr/lib/ladspa/delay_1898.so", "delay_n", "0.1", "0.5"]);
        output(&mut cmd)
    };
    let verbose = sox(true);
    assert!(verbose.status.success(), "{}", stderr(&verbose));
    assert_eq!(stderr(&verbose).matches(line).count(), 1, "said once: {}", stderr(&verbose));
    let quiet = sox(false);
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert!(!stderr(&quiet).contains("history past its bound"), "{}", stderr(&quiet));
}

/// A 4 s sweep, 100 Hz to 3 kHz, mono 16-bit at 48 kHz: made by sox without dither.
fn sweep_wav(path: &Path) {
    let out = output(
        Command::new(host("sox"))
            .args(["-D", "-n", "-r", "48000", "-c", "1", "-b", "16"])
            .arg(path)
            .args(["synth", "4", "sine", "100-3000", "vol", "0.5"]),
    );
    assert!(out.status.success(), "sox could not make a test signal: {}", stderr(&out));
}

/// One stateful Debian plugin in one host, for `a_stateful_debian_plugin_crashed_once_mid_stream...`.
struct Stateful {
    /// The plugin's file stem in /usr/lib/ladspa (also its extension's name).
    module: &'static str,
    host: &'static str,
    /// The host's arguments, given the input, the output and the plugin file (applyplugin takes a path, the others
    /// find the module in LADSPA_PATH).
    args: fn(&Path, &Path, &Path) -> Vec<String>,
    /// The block the crashing build faults at: mid-stream for this host's block size.
    at_block: u32,
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

fn path_string(p: &Path) -> String {
    p.display().to_string()
}

const STATEFUL: [Stateful; 4] = [
    // A comb filter with 0.9 feedback: each block feeds the next. sox runs blocks of 8192 samples (about 23 here).
    Stateful {
        module: "comb_1190",
        host: "sox",
        args: |i, o, _| {
            [
                strings(&["-D"]),
                vec![path_string(i), path_string(o)],
                strings(&["ladspa", "comb_1190", "comb", "172", "0.9"]),
            ]
            .concat()
        },
        at_block: 10,
    },
    // A delay line of 0.3 s in a 1 s buffer.
    Stateful {
        module: "delay_1898",
        host: "sox",
        args: |i, o, _| {
            [
                strings(&["-D"]),
                vec![path_string(i), path_string(o)],
                strings(&["ladspa", "delay_1898", "delay_n", "1", "0.3"]),
            ]
            .concat()
        },
        at_block: 10,
    },
    // A reverb with a 5 s tail, mono in, stereo out.
    Stateful {
        module: "gverb_1216",
        host: "ffmpeg",
        args: |i, o, _| {
            let filter = "ladspa=file=gverb_1216:plugin=gverb:controls=c0=50|c1=5|c2=0.5|c3=0.75|c4=-10|c5=-10|c6=-10";
            [
                strings(&["-hide_banner", "-loglevel", "error", "-y", "-i"]),
                vec![path_string(i)],
                strings(&["-af", filter, "-f", "s16le"]),
                vec![path_string(o)],
            ]
            .concat()
        },
        at_block: 20,
    },
    // A plate reverb; applyplugin runs blocks of 2048 samples (about 94 here).
    Stateful {
        module: "plate_1423",
        host: "applyplugin",
        args: |i, o, plugin| {
            [vec![path_string(i), path_string(o), path_string(plugin)], strings(&["plate", "4", "0.25", "0.5"])]
                .concat()
        },
        at_block: 40,
    },
];

/// Issue 33's acceptance: a stateful Debian plugin (a feedback comb, a delay, two reverbs) crashed once, mid-stream,
/// under `ward run` with the default policy, gives the output of the run without the fault, byte for byte, which is
/// the native output. The
/// fault strikes once as a build would whose bug the good file does not have: the plugin the host opens is
/// `crash_once_ladspa` (every call forwarded to the Debian plugin, a NULL dereference at one block), and the policy's
/// `restart_from` names the Debian plugin. The restart replays the blocks before the fault (history, on by default)
/// into the Debian plugin, so its delay lines and reverb tails are what they were. Without history (`history_mb =
/// 0`) the comb's output differs after the fault: the test can tell.
#[test]
fn a_stateful_debian_plugin_crashed_once_mid_stream_gives_the_fault_free_output_with_the_default_policy() {
    let crash_once = builtin_dir().join("crash_once_ladspa.so");
    for case in &STATEFUL {
        let module = case.module;
        let debian = PathBuf::from(format!("/usr/lib/ladspa/{module}.so"));
        assert!(debian.is_file(), "{} is missing: run scripts/deps (it installs swh-plugins)", debian.display());
        let s = Scratch::new("run", &format!("history-{module}"));
        sweep_wav(&s.path("in.wav"));
        // The crashing build, under the plugin's own file name, where the host looks for it.
        let builds = s.path("builds");
        std::fs::create_dir_all(&builds).expect("a directory for the crashing build");
        let crashing = builds.join(format!("{module}.so"));
        std::fs::copy(&crash_once, &crashing).expect("copy the crashing build");
        let run = |under_ward: Option<&str>, plugin: &Path, out: &str| {
            let mut cmd = match under_ward {
                Some(policy) => {
                    let file = s.path(&format!("{out}.toml"));
                    std::fs::write(&file, policy).expect("write the policy");
                    let mut cmd = ward();
                    cmd.args(["run", "--policy"]).arg(file).args(["--", case.host]);
                    cmd
                }
                None => Command::new(host(case.host)),
            };
            cmd.args((case.args)(&s.path("in.wav"), &s.path(out), plugin))
                .env("LADSPA_PATH", plugin.parent().expect("a directory"))
                .env("WARD_CRASH_ONCE_LADSPA", &debian)
                .env("WARD_CRASH_ONCE_AT_BLOCK", case.at_block.to_string());
            let result = output_within(&mut cmd, SAFETY_NET);
            assert!(result.status.success(), "{module}: {out}: {:?}\n{}", result.status, stderr(&result));
            (read(&s.path(out)), stderr(&result))
        };
        let (native, _) = run(None, &debian, "native.wav");
        let (fault_free, _) = run(Some(""), &debian, "ward.wav");
        let restart_from = format!("[extension.{module}]\nrestart_from = {debian:?}\n");
        let (recovered, err) = run(Some(&restart_from), &crashing, "recovered.wav");
        assert!(err.contains(&format!("ward: {module}: fault: null dereference")), "{module}: it crashed: {err}");
        assert!(err.contains(&format!("restarts from {}", debian.display())), "{module}: {err}");
        assert!(err.contains("retried: succeeded"), "{module}: {err}");
        assert!(recovered == fault_free, "{module}: the output after the recovery is not the fault-free run's\n{err}");
        assert!(fault_free == native, "{module}: the output under ward is not the native one");
        if module == "comb_1190" {
            let (without, _) = run(Some(&format!("{restart_from}history_mb = 0\n")), &crashing, "without.wav");
            assert!(without != fault_free, "{module}: without history the comb's memory is lost at the restart");
        }
    }
}

/// How a Debian host calls a Debian plugin, for `hosts_get_the_native_output_byte_for_byte_from_plugins_that...`.
struct Transparent {
    name: &'static str,
    host: &'static str,
    /// The host's arguments, given the input and the output.
    args: fn(&Path, &Path) -> Vec<String>,
}

const TRANSPARENT: [Transparent; 3] = [
    // applyplugin runs both reverbs in place: the input and the first output are one buffer, and each reads its
    // input sample again after writing that output sample (the dry mix), so it mixes in what it wrote.
    Transparent {
        name: "gverb",
        host: "applyplugin",
        args: |i, o| {
            [
                vec![path_string(i), path_string(o)],
                strings(&["/usr/lib/ladspa/gverb_1216.so", "gverb", "75", "7", "0.5", "0.75", "-70", "0", "-17.5"]),
            ]
            .concat()
        },
    },
    Transparent {
        name: "plate",
        host: "applyplugin",
        args: |i, o| {
            [
                vec![path_string(i), path_string(o)],
                strings(&["/usr/lib/ladspa/plate_1423.so", "plate", "4", "0.25", "0.5"]),
            ]
            .concat()
        },
    },
    // swh's delay_n leaves the end of a block's output unwritten when its ring buffer wraps inside the block: sox's
    // output buffer keeps what it held there.
    Transparent {
        name: "delay_n",
        host: "sox",
        args: |i, o| {
            [
                strings(&["-D"]),
                vec![path_string(i), path_string(o)],
                strings(&["ladspa", "delay_1898", "delay_n", "1", "0.3"]),
            ]
            .concat()
        },
    },
];

/// Issue 33: with no fault, a host cannot tell ward is there, even where it relies on what LADSPA leaves open: a
/// plugin run in place reads and writes one buffer in its domain too, and an output sample the plugin does not
/// write keeps what the host's buffer held. Under both none and process isolation (the class adapter and the
/// proxy, not the domain, decide this). Without either, each of these outputs differs from the native one.
#[test]
fn hosts_get_the_native_output_byte_for_byte_from_plugins_that_run_in_place_or_skip_output_samples() {
    let s = Scratch::new("run", "transparent");
    sweep_wav(&s.path("in.wav"));
    for case in &TRANSPARENT {
        let native_out = s.path(&format!("{}-native.wav", case.name));
        let native = output_within(
            Command::new(host(case.host))
                .args((case.args)(&s.path("in.wav"), &native_out))
                .env("LADSPA_PATH", "/usr/lib/ladspa"),
            SAFETY_NET,
        );
        assert!(native.status.success(), "{}: native: {}", case.name, stderr(&native));
        let native = read(&native_out);
        for iso in ["none", "process"] {
            let ward_out = s.path(&format!("{}-{iso}.wav", case.name));
            let run = output_within(
                ward()
                    .args(["run", "--isolation", iso, "--", case.host])
                    .args((case.args)(&s.path("in.wav"), &ward_out))
                    .env("LADSPA_PATH", "/usr/lib/ladspa"),
                SAFETY_NET,
            );
            assert!(run.status.success(), "{} under {iso}: {}", case.name, stderr(&run));
            let under_ward = read(&ward_out);
            let first = native.iter().zip(&under_ward).position(|(a, b)| a != b);
            assert!(
                native == under_ward,
                "{} under {iso}: the output is not the native one (first differing byte {first:?}, lengths {} and {})",
                case.name,
                native.len(),
                under_ward.len()
            );
        }
    }
}
