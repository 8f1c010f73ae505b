//! The LV2 interfaces ward wraps, through the transparent proxy, to an unmodified lilv host: a small C host
//! (`lv2_hosts/lilv_state_host.c`, built here) gets and sets the options of ward's built-in `lv2_options` through
//! its `options:interface`, and saves and restores its state offering its own `state:mapPath`, `makePath` and
//! `freePath`. Under `ward run` the host sees what it sees natively: the same answers, its own path functions called
//! with the same paths, its strings freed with its own freePath; and no options interface from a plugin without one.
//! A second host (`lv2_hosts/lilv_block_host.c`) runs blocks through the proxy on separate buffers (borrowed as they
//! are) and in place (copied), with silence in and around them (sent short), and gets native's bytes back.

use std::path::Path;
use std::process::Command;

mod common;
use common::{output, stderr, ward, Scratch};

/// The host `name` (`lv2_hosts/NAME.c`) built from its source with lilv (Debian's liblilv-dev); the test fails when
/// it cannot be.
fn build_host(s: &Scratch, name: &str) -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/lv2_hosts/{name}.c"));
    let flags = output(Command::new("pkg-config").args(["--cflags", "--libs", "lilv-0"]));
    assert!(flags.status.success(), "pkg-config finds no lilv-0: run scripts/deps (it installs liblilv-dev)");
    let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
    let program = s.path(name);
    let built = output(
        Command::new("cc")
            .args(["-std=c11", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&program)
            .arg(&source)
            .args(flags.split_whitespace()),
    );
    assert!(built.status.success(), "building the lilv host failed:\n{}", stderr(&built));
    program
}

/// Its lines, sorted: a save under ward frees the host's string before the plugin's store reaches the host, so the
/// order of those two lines differs; everything else is compared in order below.
fn sorted(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines
}

#[test]
fn a_lilv_host_gets_and_sets_options_and_maps_paths_through_the_proxy_as_natively() {
    let s = Scratch::new("lv2-interfaces", "lilv-host");
    let host = build_host(&s, "lilv_state_host");
    let lv2_path = ward_extensions::lv2_bundles().expect("the built-in LV2 bundles");
    let session = s.path("session");
    let scratch = s.path("scratch");
    let args = [session.as_os_str(), scratch.as_os_str()];

    let native = output(Command::new(&host).env("LV2_PATH", &lv2_path).args(args));
    assert!(native.status.success(), "natively: {}", stderr(&native));
    let native_out = String::from_utf8_lossy(&native.stdout).into_owned();

    let warded = output(
        ward().env("LV2_PATH", &lv2_path).args(["run", "--isolation", "process", "-v", "--"]).arg(&host).args(args),
    );
    let err = stderr(&warded);
    assert!(warded.status.success(), "under ward: {:?}\n{err}", warded.status);
    assert!(err.contains("LV2 plugin under ward (isolation process"), "not under ward:\n{err}");
    let warded_out = String::from_utf8_lossy(&warded.stdout).into_owned();
    assert_eq!(sorted(&warded_out), sorted(&native_out), "under ward:\n{warded_out}\nnatively:\n{native_out}\n{err}");

    // What the host saw, which the comparison above shows it sees under ward too.
    let (session, scratch) = (session.display(), scratch.display());
    for line in [
        "options interface: yes, state interface: yes".to_string(),
        "unknown interface: NULL".into(),
        "log http://lv2plug.in/ns/ext/log#Note: lv2_options: instantiated at 48000 Hz".into(),
        format!("host makePath(scratch.wav) = {scratch}/scratch.wav"),
        format!("host freePath({scratch}/scratch.wav)"),
        format!("  urn:ward:lv2:options#scratch: \"{scratch}/scratch.wav\""),
        "set gain 0.5: status 0".into(),
        "set gain NaN: status 8".into(),
        "out: 0 0.0625 0.125 3.9375".into(),
        "set file: status 0".into(),
        format!("host abstract_path({session}/takes/one.wav) = takes/one.wav"),
        "stored urn:ward:lv2:options#file (atom:Path) takes/one.wav".into(),
        "host freePath(takes/one.wav)".into(),
        "save: status 0".into(),
        format!("host absolute_path(takes/one.wav) = {session}/takes/one.wav"),
        "restore: status 0".into(),
        "second: get status 4".into(),
        "  urn:ward:lv2:options#gain: 0.5".into(),
        format!("  urn:ward:lv2:options#file: \"{session}/takes/one.wav\""),
        "  urn:ward:lv2:options#scratch: \"\"".into(),
        "  urn:ward:no-such-option: none".into(),
        "amp options interface: NULL".into(),
    ] {
        assert!(native_out.lines().any(|l| l == line), "no line {line:?} natively:\n{native_out}");
    }
}

#[test]
fn a_lilv_host_gets_native_bytes_for_silent_and_loud_blocks_on_separate_buffers_and_in_place() {
    let s = Scratch::new("lv2-interfaces", "block-host");
    let host = build_host(&s, "lilv_block_host");
    let lv2_path = ward_extensions::lv2_bundles().expect("the built-in LV2 bundles");

    let native = output(Command::new(&host).env("LV2_PATH", &lv2_path));
    assert!(native.status.success(), "natively: {}", stderr(&native));
    let native_out = String::from_utf8_lossy(&native.stdout).into_owned();
    assert_eq!(native_out.lines().count(), 16, "eight blocks of each kind natively:\n{native_out}");

    let warded =
        output(ward().env("LV2_PATH", &lv2_path).args(["run", "--isolation", "process", "-v", "--"]).arg(&host));
    let err = stderr(&warded);
    assert!(warded.status.success(), "under ward: {:?}\n{err}", warded.status);
    assert!(err.contains("LV2 plugin under ward (isolation process"), "not under ward:\n{err}");
    assert!(err.contains("(0 restarts"), "a block failed under ward:\n{err}");
    let warded_out = String::from_utf8_lossy(&warded.stdout).into_owned();
    assert_eq!(warded_out, native_out, "under ward:\n{warded_out}\nnatively:\n{native_out}\n{err}");
}
