//! `ward bench jalv` end to end, short (`--quick`: a few seconds a side): the shape of its JSON and that what it
//! measured is plausible, never how fast anything is nor how many xruns a loaded machine had. It starts its own JACK
//! servers and runs Debian's jalv and zam-plugins' ZamVerb (scripts/deps installs jackd2, jalv and the LV2
//! collections), and `ward run`, which needs the whole workspace built (the preload shim and `ward-domain` beside
//! `ward`).

use std::process::Output;

use serde_json::Value;

mod common;
use common::{host, output, stderr, ward};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn report(out: &Output) -> Value {
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n{}", stdout(out), stderr(out)))
}

/// A side that ran its one run: periods elapsed, CPU used, and the figures derived from them.
fn assert_measured(side: &Value, name: &str, isolation: &str) {
    assert_eq!(side["side"], name, "{side}");
    assert_eq!(side["isolation"], isolation, "{side}");
    assert_eq!(side["available"], true, "{side}");
    assert_eq!(side["failed"].as_array().map(Vec::len), Some(0), "{name}: a run failed: {side}");
    let runs = side["runs"].as_array().unwrap_or_else(|| panic!("{name}: no list of runs: {side}"));
    assert_eq!(runs.len(), 1, "{name}: one run: {side}");
    let run = &runs[0];
    // --quick measures 3 s: about 1,125 periods of 128 frames at 48 kHz.
    let periods = run["periods"].as_f64().unwrap_or_default();
    assert!(periods >= 1000.0, "{name}: periods elapsed: {run}");
    assert!(run["cpu_s"].as_f64().is_some_and(|c| c > 0.0), "{name}: no CPU time measured: {run}");
    let per_period = run["cpu_per_period_us"].as_f64().unwrap_or_default();
    assert!(per_period > 0.0, "{name}: CPU a period: {run}");
    assert_eq!(side["cpu_per_period_us_median"].as_f64(), Some(per_period), "{side}");
    assert!(side["percent_of_period"].as_f64().is_some_and(|p| p > 0.0), "{side}");
    let (client, driver) = (run["client_xruns"].as_u64(), run["driver_xruns"].as_u64());
    assert!(client.is_some() && driver.is_some(), "{name}: xruns of both kinds counted: {run}");
    assert_eq!(side["xruns"].as_u64(), Some(client.unwrap_or_default() + driver.unwrap_or_default()), "{side}");
}

#[test]
fn a_quick_run_measures_cpu_per_period_and_xruns_natively_and_under_ward() {
    for program in ["jackd", "jack_lsp", "jalv"] {
        host(program);
    }
    let out = output(ward().args(["bench", "jalv", "--quick", "--json"]));
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let r = report(&out);
    assert_eq!(r["bench"], "jalv");
    assert_eq!(r["plugin"], "urn:zamaudio:ZamVerb");
    assert_eq!(r["package"], "zam-plugins");
    assert_eq!((r["sample_rate"].as_u64(), r["period_frames"].as_u64()), (Some(48_000), Some(128)));
    assert_eq!((r["seconds"].as_u64(), r["runs"].as_u64()), (Some(3), Some(1)), "--quick: one run of 3 s");
    assert_measured(&r["native"], "native", "-");
    assert_measured(&r["ward"], "ward", "process");
    assert!(r["cpu_ratio"].as_f64().is_some_and(|x| x > 0.0), "{}", r["cpu_ratio"]);
    // Met or missed as the machine's load decides; but decided, since both sides ran.
    let met = r["target_met"].as_bool().unwrap_or_else(|| panic!("the target is decided: {r}"));
    assert_eq!(met, r["ward"]["xruns"].as_u64() <= r["native"]["xruns"].as_u64(), "{r}");
    // Each run is said on standard error as it ends (a run under ward that did not put the plugin under ward would
    // have failed above).
    assert!(stderr(&out).contains("bench jalv run 1/1 process: "), "{}", stderr(&out));
}

#[test]
fn mpk_is_said_to_be_unmeasurable_without_protection_keys() {
    if ward::mpk_available() {
        eprintln!("this machine has PKU: `--isolation mpk` runs here, so there is no refusal to check");
        return;
    }
    let out = output(ward().args(["bench", "jalv", "--quick", "--json", "--isolation", "mpk", "--seconds", "1"]));
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let r = report(&out);
    assert_eq!(r["ward"]["available"], false, "{r}");
    assert_eq!(r["ward"]["isolation"], "mpk", "{r}");
    let reason = r["ward"]["unavailable_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("cannot measure mpk: "), "{reason}");
    assert!(r["target_met"].is_null(), "no target without the ward side: {r}");
    assert!(r["native"]["cpu_per_period_us_median"].as_f64().is_some_and(|c| c > 0.0), "native still runs: {r}");
}

#[test]
fn a_plugin_not_on_the_lv2_path_is_bad_input() {
    let out = output(ward().args(["bench", "jalv", "--quick", "--plugin", "urn:ward:no-such-plugin"]));
    assert_eq!(out.status.code(), Some(2), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("no LV2 plugin urn:ward:no-such-plugin"), "{}", stderr(&out));
}
