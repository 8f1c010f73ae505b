//! `ward bench lv2` end to end, on a few plugins and a few blocks: what it prints and how it counts, never how fast
//! anything is. It runs Debian's `lv2bench` (lilv-utils) and the LV2 collections, which scripts/deps installs, and
//! `ward run`, which needs the whole workspace built (the preload shim and `ward-domain` beside `ward`).

use std::process::Output;

use serde_json::Value;

mod common;
use common::{host, output, stderr, ward};

/// A cheap plugin of swh-lv2: audio in, audio out, one gain control.
const SWH_AMP: &str = "http://plugin.org.uk/swh-plugins/amp";
/// A plugin lilv-utils' lv2bench cannot run: it requires `options:options`, which lv2bench does not offer.
const NEEDS_OPTIONS: &str = "urn:zamaudio:ZamComp";

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The ratio printed at the end of a line ("12.345x").
fn ends_in_ratio(line: &str) -> bool {
    line.split_whitespace().last().and_then(|r| r.strip_suffix('x')).is_some_and(|r| r.parse::<f64>().is_ok())
}

#[test]
fn one_swh_plugin_gets_a_native_line_a_ward_line_and_a_ratio() {
    host("lv2bench");
    let out = output(ward().args(["bench", "lv2", "--plugin", SWH_AMP, "--runs", "1", "--frames", "5120"]));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("lv2bench's own figure"), "the output says what is timed:\n{text}");
    let section: Vec<&str> = text.lines().skip_while(|l| !l.starts_with(SWH_AMP)).take(3).collect();
    assert!(section.first().is_some_and(|l| l.contains("10 blocks, -n 5120")), "{text}");
    let native = section.iter().find(|l| l.starts_with("native ")).unwrap_or_else(|| panic!("no native line:\n{text}"));
    let process = section
        .iter()
        .find(|l| l.starts_with("ward run") && l.contains(" process "))
        .unwrap_or_else(|| panic!("no ward run process line:\n{text}"));
    assert!(native.contains(" s "), "{native}");
    assert!(ends_in_ratio(process), "no ratio on the ward line: {process}");
    let overall = text.lines().find(|l| l.starts_with("process ")).unwrap_or_else(|| panic!("no summary:\n{text}"));
    assert!(overall.split_whitespace().nth(1) == Some("1"), "one plugin counted: {overall}");
    assert!(overall.contains("median <= 1.15x: "), "{overall}");
    assert!(text.contains("failed under ward, not counted: none"), "{text}");
    if !ward::mpk_available() {
        assert!(text.contains("cannot measure mpk: "), "the output says why mpk is not measured:\n{text}");
    }
}

#[test]
fn a_plugin_lv2bench_cannot_run_is_listed_apart_with_its_reason_and_not_counted() {
    host("lv2bench");
    let out = output(ward().args([
        "bench",
        "lv2",
        "--json",
        "--plugin",
        NEEDS_OPTIONS,
        "--plugin",
        SWH_AMP,
        "--runs",
        "1",
        "--frames",
        "5120",
    ]));
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out:?}"));
    let failed = report["failed"].as_array().expect("a list of failed plugins");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["uri"], NEEDS_OPTIONS);
    assert_eq!(failed[0]["variant"], "native");
    let reason = failed[0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("requires feature"), "lv2bench's own reason is kept: {reason}");
    let plugins = report["plugins"].as_array().expect("a list of measured plugins");
    assert_eq!(plugins.len(), 1, "only the plugin that ran is measured: {plugins:?}");
    assert_eq!(plugins[0]["uri"], SWH_AMP);
    let process = &report["overall"][0];
    assert_eq!(process["isolation"], "process");
    assert_eq!(process["plugins"], 1, "{process}");
    assert!(process["median_ratio"].as_f64().is_some_and(|r| r > 0.0), "{process}");
}

#[test]
fn the_corpus_is_the_effect_plugins_of_the_five_packages() {
    let out = output(ward().args(["bench", "lv2", "--list"]));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    let listed: Vec<&str> = text.lines().filter(|l| l.ends_with(')') && !l.starts_with("bundle ")).collect();
    assert!(listed.contains(&format!("{SWH_AMP} (swh-lv2)").as_str()), "{text}");
    for package in ["swh-lv2", "mda-lv2", "x42-plugins", "lsp-plugins-lv2", "zam-plugins"] {
        assert!(listed.iter().any(|l| l.ends_with(&format!("({package})"))), "nothing of {package}:\n{text}");
    }
    // An instrument (MIDI in, audio out) is no effect.
    assert!(!text.contains("http://drobilla.net/plugins/mda/DX10 "), "{text}");
    assert!(text.contains(&format!("\n{} plugins\n", listed.len())), "{text}");
}
