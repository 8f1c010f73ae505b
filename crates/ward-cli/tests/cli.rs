//! The `ward` program end to end.
//!
//! `demo` and `bench` start `ward-domain` processes, which the library finds beside the `ward` binary. `cargo test
//! -p ward-cli` builds only this package's binary, so build the workspace (or `cargo build -p ward-domain`) with the
//! same profile and target directory first; the CI script builds the whole workspace before testing.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

mod common;

use common::require_pku;

fn ward() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ward"));
    cmd.env("WARD_CACHE_DIR", common::fresh_cache_dir());
    cmd
}

/// Fail with instructions, not with a puzzling domain error, when ward-domain was not built.
fn require_domain() {
    if std::env::var_os("WARD_DOMAIN").is_some() {
        return;
    }
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ward"));
    let beside = exe.with_file_name("ward-domain");
    assert!(
        beside.is_file(),
        "{} is missing: run `cargo build -p ward-domain` (same profile and target directory) before these tests, \
         or set WARD_DOMAIN to its path",
        beside.display()
    );
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("cannot run the ward binary")
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

fn expected_class(kind: i64) -> &'static str {
    match kind {
        4 => "exit",
        5 => "timeout",
        10 | 11 => "protocol",
        // 8, the descriptor leak, ends in abort() once open() fails.
        _ => "signal",
    }
}

#[test]
fn demo_contains_every_fault() {
    require_domain();
    let out = run(ward().args(["demo", "--json"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = json_lines(&out);
    let faults: Vec<&Value> = lines.iter().filter(|l| l["type"] == "fault" && l["isolation"] == "process").collect();
    assert_eq!(faults.len(), 13, "13 process fault lines expected; stdout: {lines:#?}\nstderr: {stderr}");
    for (i, f) in faults.iter().enumerate() {
        let kind = f["kind"].as_i64().expect("kind is a number");
        assert_eq!(kind, i as i64 + 1, "faults in order: {f}");
        assert_eq!(f["contained"], true, "fault {kind} not contained: {f}");
        assert_eq!(f["fault_class"], expected_class(kind), "fault {kind}: {f}");
        assert_eq!(f["retried_ok"], true, "fault {kind}: {f}");
        assert!(f["restart_us"].as_u64().is_some(), "fault {kind} has no restart time: {f}");
        for key in ["fault", "native", "ward", "cause", "via"] {
            assert!(f[key].is_string(), "fault {kind} lacks {key}: {f}");
        }
        assert_eq!(f["replayed"], 2, "fault {kind}: {f}");
    }
    // Then the faults mpk domains can hold, or one line saying this machine has no protection keys.
    check_mpk_part(&lines);
    let well: Vec<&Value> = lines.iter().filter(|l| l["type"] == "well").collect();
    assert_eq!(well.len(), 3, "{lines:#?}");
    assert!(well.iter().all(|w| w["ok"] == true), "{well:#?}");
    // A runtime: plugins compiled from source in its domain, a crashing one and a compiler crash contained.
    let runtime: Vec<&Value> = lines.iter().filter(|l| l["type"] == "runtime").collect();
    assert_eq!(runtime.len(), 5, "{lines:#?}");
    assert!(runtime.iter().all(|r| r["ok"] == true && r["isolation"] == "process"), "{runtime:#?}");
    assert!(out.status.success(), "exit status {:?}; stderr: {stderr}", out.status);
}

/// The mpk rows of a demo: every fault an mpk domain can hold, contained and restored from the snapshot; or, on a
/// machine without protection keys, a line saying the part did not run.
fn check_mpk_part(lines: &[Value]) {
    let mpk: Vec<&Value> = lines.iter().filter(|l| l["isolation"] == "mpk").collect();
    if !ward::mpk_available() {
        assert!(mpk.iter().any(|l| l["type"] == "skipped"), "no line says mpk did not run: {lines:#?}");
        return;
    }
    let kinds: Vec<i64> = mpk.iter().filter(|l| l["type"] == "fault").filter_map(|l| l["kind"].as_i64()).collect();
    assert_eq!(kinds, [1, 2, 3, 4, 5, 6, 7, 12, 13], "{mpk:#?}");
    for f in mpk.iter().filter(|l| l["type"] == "fault") {
        assert_eq!(f["contained"], true, "mpk: {f}");
        assert_eq!(f["via"], "snapshot", "mpk: {f}");
        assert_eq!(f["replayed"], 2, "mpk: {f}");
    }
}

#[test]
#[ignore = "needs PKU"]
fn demo_under_mpk_contains_every_fault_an_mpk_domain_can_hold() {
    require_pku();
    let out = run(ward().args(["demo", "--isolation", "mpk", "--json"]));
    let lines = json_lines(&out);
    assert!(out.status.success(), "exit status {:?}; stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    check_mpk_part(&lines);
    let well: Vec<&Value> = lines.iter().filter(|l| l["type"] == "well").collect();
    assert_eq!(well.len(), 3, "{lines:#?}");
    assert!(well.iter().all(|w| w["ok"] == true && w["isolation"] == "mpk"), "{well:#?}");
    let runtime: Vec<&Value> = lines.iter().filter(|l| l["type"] == "runtime").collect();
    assert_eq!(runtime.len(), 5, "{lines:#?}");
    assert!(runtime.iter().all(|r| r["ok"] == true && r["isolation"] == "mpk"), "{runtime:#?}");
}

#[test]
fn demo_under_mpk_without_protection_keys_says_the_part_did_not_run() {
    if ward::mpk_available() {
        eprintln!("this machine has PKU: the test of its absence did not run here");
        return;
    }
    let out = run(ward().args(["demo", "--isolation", "mpk", "--json"]));
    assert!(out.status.success(), "exit status {:?}; stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    check_mpk_part(&json_lines(&out));
}

/// Where there are protection keys, every mpk line of the benchmark was measured (none skipped).
#[test]
#[ignore = "needs PKU"]
fn bench_measures_every_mpk_line() {
    require_pku();
    require_domain();
    let out = run(ward().args(["bench", "xpc", "--json", "--quick"]));
    assert!(out.status.success(), "exit status {:?}; stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let lines = json_lines(&out);
    let mpk: Vec<&Value> = lines.iter().filter(|l| l["isolation"] == "mpk").collect();
    assert!(!mpk.is_empty(), "no mpk line: {lines:#?}");
    for l in mpk {
        assert!(!l["skipped"].is_string(), "an mpk line was skipped on a machine with PKU: {l}");
        let ns = l["ns"].as_f64().unwrap_or_else(|| panic!("ns is not a number: {l}"));
        assert!(ns > 0.0 && ns.is_finite(), "{l}");
    }
}

#[test]
fn bench_reports_every_isolation() {
    require_domain();
    let out = run(ward().args(["bench", "xpc", "--json", "--quick"]));
    assert!(out.status.success(), "exit status {:?}; stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let lines = json_lines(&out);
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(l["name"].is_string(), "{l}");
        assert!(l["isolation"].is_string(), "{l}");
        // Only mpk lines may be skipped, and only where the processor has no protection keys.
        if l["skipped"].is_string() {
            assert_eq!(l["isolation"], "mpk", "{l}");
            assert!(!ward::mpk_available(), "an mpk line was skipped on a machine with PKU: {l}");
            continue;
        }
        let ns = l["ns"].as_f64().unwrap_or_else(|| panic!("ns is not a number: {l}"));
        assert!(ns > 0.0 && ns.is_finite(), "{l}");
    }
    for iso in ["native", "none", "process", "mpk"] {
        assert!(lines.iter().any(|l| l["isolation"] == iso), "no {iso} line: {lines:#?}");
    }
    for name in ["null_call", "buffer_4k", "buffer_1m", "deferred", "recovery", "start"] {
        assert!(lines.iter().any(|l| l["name"] == name), "no {name} line: {lines:#?}");
    }
    // What the sandbox costs: each group without it, then with it against a target.
    for name in ["sandbox_poll", "sandbox_sleep", "sandbox_start"] {
        let group: Vec<&Value> = lines.iter().filter(|l| l["name"] == name).collect();
        let variants: Vec<&str> = group.iter().filter_map(|l| l["variant"].as_str()).collect();
        assert_eq!(variants, ["off", "on"], "{name}: {group:#?}");
        assert!(group[1]["target"].is_string() && group[1]["target_met"].is_boolean(), "{name}: {group:#?}");
    }
    // The machine's floors, the sleeping ones both across processors and on one.
    for variant in ["spin", "futex", "futex-one-cpu"] {
        assert!(
            lines.iter().any(|l| l["name"] == "floor" && l["variant"] == variant),
            "no floor {variant}: {lines:#?}"
        );
    }
}

/// `--load N` runs N busy processes beside the benchmark, says so in every line, and leaves none behind.
#[test]
fn bench_under_load_reports_it_and_stops_its_busy_processes() {
    require_domain();
    let child = ward()
        .args(["bench", "xpc", "--json", "--quick", "--load", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start ward bench");
    let bench_pid = child.id();
    let out = child.wait_with_output().expect("wait for ward bench");
    assert!(out.status.success(), "exit status {:?}; stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let lines = json_lines(&out);
    assert!(lines.iter().filter(|l| l["ns"].is_number()).all(|l| l["load"] == 1), "{lines:#?}");
    // Every busy process carries the benchmark's pid on its command line.
    let marker = format!("__busy\0--parent\0{bench_pid}\0");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok().map(|c| (e.file_name(), c)))
        .filter(|(_, c)| String::from_utf8_lossy(c).contains(&marker))
        .map(|(pid, _)| pid.to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "busy processes left running: {left:?}");
}

#[test]
fn a_bad_flag_is_a_usage_error() {
    let out = run(ward().args(["demo", "--no-such-flag"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
}

#[test]
fn an_unknown_isolation_names_the_valid_ones() {
    let out = run(ward().args(["demo", "--isolation", "bogus"]));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bogus") && err.contains("process") && err.contains("none"), "{err}");
}
