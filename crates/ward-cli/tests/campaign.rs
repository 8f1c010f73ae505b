//! `ward campaign` end to end on the built-in `well` extension and on two of Debian's plugins (a LADSPA and a frei0r
//! one): real mutated copies, real throwaway hosts, the process domain. Build ward-domain with the same profile and target directory first (see tests/cli.rs).
//!
//! The campaigns use seed 4, short deadlines and a short hang bound, so that each takes about a second. Which
//! instructions a seed mutates depends only on well.so's code, which the build compiles the same way every time.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;

use common::require_pku;

fn ward() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ward"))
}

fn require_domain() {
    if std::env::var_os("WARD_DOMAIN").is_some() {
        return;
    }
    let beside = PathBuf::from(env!("CARGO_BIN_EXE_ward")).with_file_name("ward-domain");
    assert!(
        beside.is_file(),
        "{} is missing: run `cargo build -p ward-domain` (same profile and target directory) before these tests",
        beside.display()
    );
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ward-cli-campaign-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `ward campaign ARGS --out OUT` with the quick bounds.
fn campaign(out: &Path, args: &[&str]) -> Output {
    campaign_bounded(out, "200", "3", args)
}

/// `ward campaign ARGS --out OUT` with these bounds: every call's deadline and the hang bound of every host.
fn campaign_bounded(out: &Path, deadline_ms: &str, host_timeout_s: &str, args: &[&str]) -> Output {
    let bounds = ["--deadline-ms", deadline_ms, "--host-timeout-s", host_timeout_s, "--jobs", "2", "--json"];
    ward().arg("campaign").args(bounds).args(args).arg("--out").arg(out).output().expect("cannot run ward")
}

fn records(out: &Output) -> Vec<Value> {
    assert!(out.status.success(), "status {:?}; stderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}

const OUTCOMES: [&str; 6] =
    ["host_crashed", "host_hung", "recovered", "recovered_wrong_output", "wrong_output_undetected", "no_effect"];

/// The workload's output on the unmutated well.so, worked out here from well.c's definitions.
/// Nothing recovers natively, and no host failure escapes process isolation.
fn check_outcome_for_isolation(l: &Value, outcome: &str) {
    check_outcome_under(l, outcome, "process");
}

/// Nothing recovers natively, and no host failure escapes `isolated`, the one isolation kind the campaign ran.
fn check_outcome_under(l: &Value, outcome: &str, isolated: &str) {
    match l["isolation"].as_str() {
        Some("native") => assert!(!outcome.starts_with("recovered"), "nothing detects faults natively: {l}"),
        Some(kind) if kind == isolated => {
            assert!(
                outcome != "host_crashed" && outcome != "host_hung",
                "a host failure escaped {isolated} isolation: {l}"
            )
        }
        _ => panic!("unexpected isolation: {l}"),
    }
}

/// The campaign crashed some of `ext`'s native hosts, and ward detected some faults under `isolated`.
fn check_crashes_and_detections(lines: &[Value], ext: &str, isolated: &str) {
    let of = |isolation: &str, outcome: &str| {
        lines.iter().filter(|l| l["extension"] == ext && l["isolation"] == isolation && l["outcome"] == outcome).count()
    };
    assert!(of("native", "host_crashed") > 0, "{ext}: the campaign should crash some native hosts");
    let recovered = of(isolated, "recovered") + of(isolated, "recovered_wrong_output");
    assert!(recovered > 0, "{ext}: ward should detect some faults under {isolated}");
}

fn expected_reference() -> Vec<(String, String)> {
    let sum: u32 = (0..200u32).map(|i| i * 7 % 251).sum();
    let xored: String = b"WardKeepsTheHostAlive".iter().map(|b| format!("{:02x}", b ^ 0x20)).collect();
    let reversed: String = (1..=16u8).rev().map(|b| format!("{b:02x}")).collect();
    let squares: i64 = (0..10).map(|i| i * i).sum();
    let mut e: Vec<(String, String)> = vec![
        ("well_add(2, 40)".into(), "42".into()),
        ("well_add(-7, 1000000007)".into(), "1000000000".into()),
        ("well_mul3(3, 5, 7)".into(), "105".into()),
        ("well_fma(1.5, 2.0, 0.25)".into(), format!("3.25 ({:#018x})", 3.25f64.to_bits())),
        ("well_halve(3.0)".into(), format!("1.5 ({:#010x})", 1.5f32.to_bits())),
        ("well_sum(200 bytes)".into(), sum.to_string()),
        ("well_xor(\"WardKeepsTheHostAlive\", 0x20)".into(), xored),
        ("well_reverse(01..10)".into(), reversed),
        ("well_strlen(\"ward campaign\")".into(), "13".into()),
        ("well_map_sum(square, 10)".into(), squares.to_string()),
    ];
    for d in 1..=5 {
        e.push((format!("counter_add({d})"), (d * (d + 1) / 2).to_string()));
    }
    for (call, result) in [
        ("counter_get()", "15"),
        ("acc_new(100)", "instance"),
        ("acc_add(acc, 5)", "105"),
        ("acc_add(acc, -3)", "102"),
        ("acc_get(acc)", "102"),
        ("acc_free(acc)", "done"),
    ] {
        e.push((call.into(), result.into()));
    }
    e
}

#[test]
fn no_host_crash_escapes_under_process_isolation() {
    require_domain();
    let out = scratch("small");
    let lines = records(&campaign(&out, &["--types", "all", "--trials-per-type", "2", "--seed", "4"]));

    // init has no site in well.so (-O2 keeps locals in registers): nine types, two trials, two runs each.
    assert_eq!(lines.len(), 9 * 2 * 2, "{lines:#?}");
    let types: BTreeSet<&str> = lines.iter().filter_map(|l| l["fault_type"].as_str()).collect();
    assert_eq!(types.len(), 9);
    assert!(!types.contains("init"));
    for l in &lines {
        assert_eq!(l["extension"], "well", "{l}");
        assert!(l["seed"].is_u64() && l["trial"].is_u64() && l["restarts"].is_u64(), "{l}");
        assert!(l["detail"].is_string(), "{l}");
        let outcome = l["outcome"].as_str().unwrap_or_else(|| panic!("no outcome: {l}"));
        assert!(OUTCOMES.contains(&outcome), "{l}");
        let faults = l["faults"].as_array().unwrap_or_else(|| panic!("no faults: {l}"));
        assert!(!faults.is_empty(), "{l}");
        for f in faults {
            assert!(f["function"].is_string() && f["offset"].is_u64(), "{f}");
            assert!(f["before"].is_string() && f["after"].is_string(), "{f}");
        }
        check_outcome_for_isolation(l, outcome);
    }
    let native_crashes = lines.iter().filter(|l| l["isolation"] == "native" && l["outcome"] == "host_crashed").count();
    assert!(native_crashes > 0, "the campaign should crash some native hosts");

    let reference: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("reference.json")).expect("reference.json"))
            .expect("reference.json is JSON");
    let got: Vec<(String, String)> = reference
        .iter()
        .map(|e| (e["call"].as_str().unwrap_or("").to_string(), e["result"].as_str().unwrap_or("").to_string()))
        .collect();
    assert_eq!(got, expected_reference());

    let svg = std::fs::read_to_string(out.join("outcomes.svg")).expect("outcomes.svg");
    assert!(svg.starts_with("<svg") && svg.contains("pointer"), "{}", &svg[..svg.len().min(200)]);
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report.json")).expect("JSON");
    assert_eq!(report["summary"]["targets"][0]["survival"], 1.0, "{:#}", report["summary"]["targets"]);
    let markdown = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(markdown.contains("## Targets (issues 5 and 33)"), "{markdown}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_campaign_resumes_and_refuses_another_configuration() {
    require_domain();
    let out = scratch("resume");
    let args = ["--types", "pointer,nop", "--trials-per-type", "2", "--seed", "4"];
    let first = records(&campaign(&out, &args));
    assert_eq!(first.len(), 2 * 2 * 2);
    let recorded = std::fs::read_to_string(out.join("trials.jsonl")).expect("trials.jsonl");

    // The same command again: every trial is recorded, none runs again; --json still lists them all.
    let second = records(&campaign(&out, &args));
    assert_eq!(std::fs::read_to_string(out.join("trials.jsonl")).expect("trials.jsonl"), recorded);
    let key = |l: &Value| (l["fault_type"].to_string(), l["trial"].to_string(), l["isolation"].to_string());
    let mut a: Vec<_> = first.iter().map(|l| (key(l), l["session"].clone())).collect();
    let mut b: Vec<_> = second.iter().map(|l| (key(l), l["session"].clone())).collect();
    a.sort_by(|x, y| x.0.cmp(&y.0));
    b.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(a, b, "same records from the same session");

    // As if interrupted: the last trial's lines are gone and the one before is torn. Those two trials run again,
    // and only they.
    let lines: Vec<&str> = recorded.lines().collect();
    let kept = format!("{}\n{}", lines[..4].join("\n"), &lines[4][..lines[4].len() / 2]);
    std::fs::write(out.join("trials.jsonl"), kept).expect("rewrite trials.jsonl");
    let third = records(&campaign(&out, &args));
    assert_eq!(third.len(), 8);
    let sessions: BTreeSet<&str> = third.iter().filter_map(|l| l["session"].as_str()).collect();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    let now = std::fs::read_to_string(out.join("trials.jsonl")).expect("trials.jsonl");
    assert!(now.starts_with(&lines[..4].join("\n")), "the whole trials stay as they were");
    assert_eq!(now.lines().count(), 8);

    let other = campaign(&out, &["--types", "pointer,nop", "--trials-per-type", "2", "--seed", "5"]);
    assert_eq!(other.status.code(), Some(2), "stderr: {}", String::from_utf8_lossy(&other.stderr));
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(stderr.contains("another campaign (seed 4 recorded, 5 asked)"), "{stderr}");
    assert!(other.stdout.is_empty());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_input_exits_2_with_one_message() {
    let out = scratch("bad");
    let cases: [(&[&str], &str); 10] = [
        (&["--types", "nop,bogus"], "unknown fault type `bogus`; valid types: source, destination, pointer"),
        (
            &["--types", "nop,alloc", "--isolation", "process,none"],
            "library fault kinds (alloc) cannot run under isolation `none`",
        ),
        (&["--isolation", "mpk", "--poison"], "--poison cannot run under isolation `mpk`"),
        (&["--isolation", "jail"], "unknown isolation `jail`; valid: mpk, process, none"),
        (&["--extension", "/nonexistent/well.so"], "/nonexistent/well.so does not exist"),
        (
            &["--extension", "faulty"],
            "no campaign workload for extension `faulty`; extensions with one: well, and any LADSPA or frei0r plugin",
        ),
        (&["--trials-per-type", "0"], "0 is not in 1..=100000"),
        (&["--extension", "well,well"], "extension well is given twice"),
        (&["--default-policy", "--deadline-ms", "500"], "'--default-policy' cannot be used with '--deadline-ms <MS>'"),
        (&["--default-policy", "--host-timeout-s", "10"], "a host bound of 10 s is too short for the default policy"),
    ];
    for (args, message) in cases {
        let run = ward().arg("campaign").args(args).arg("--out").arg(&out).output().expect("cannot run ward");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(run.stdout.is_empty(), "{args:?}");
        assert!(!out.exists(), "{args:?} created {}", out.display());
    }
    let run = ward().args(["campaign", "--types", "bogus", "--out"]).arg(&out).output().expect("cannot run ward");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(stderr.lines().count(), 1, "one message: {stderr}");
    assert!(stderr.contains("off-by-one") && stderr.contains("`all`"), "{stderr}");
}

/// Under mpk, on a machine without protection keys, the campaign is refused before it starts, saying why.
#[test]
fn an_mpk_campaign_without_protection_keys_is_refused() {
    if ward::mpk_available() {
        println!("this machine has protection keys: mpk campaigns run (see no_host_crash_escapes_under_mpk_isolation)");
        return;
    }
    let out = scratch("no-pku");
    let run = ward().args(["campaign", "--isolation", "process,mpk", "--out"]).arg(&out).output().expect("ward");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("isolation mpk needs memory protection keys, and this machine has none"), "{stderr}");
    assert!(!out.exists(), "the refused campaign created {}", out.display());
}

/// The built-in extension and a LADSPA and a frei0r plugin, each mutated copy run natively and in an mpk domain: the
/// extension shares the host's process, and still no host failure escapes (on these seeds; the target allows 0.5%),
/// code faults and run-time library faults alike.
/// Needs protection keys: scripts/test runs it, in an emulated machine that has them where this one has not.
#[test]
#[ignore = "needs PKU"]
fn no_host_crash_escapes_under_mpk_isolation() {
    require_pku();
    require_plugins();
    let out = scratch("mpk");
    let extensions = format!("well,{AMP},{INVERT}");
    let args = [
        "--extension",
        &extensions,
        "--isolation",
        "mpk",
        "--types",
        "all,library",
        "--trials-per-type",
        "2",
        "--seed",
        "4",
    ];
    // Emulated machines are slow: longer bounds, so that only a hang reaches them.
    let lines = records(&campaign_bounded(&out, "1000", "60", &args));
    let extensions: BTreeSet<&str> = lines.iter().filter_map(|l| l["extension"].as_str()).collect();
    assert_eq!(extensions, BTreeSet::from(["well", "amp_1181", "invert0r"]));
    for l in &lines {
        let outcome = l["outcome"].as_str().unwrap_or_else(|| panic!("no outcome: {l}"));
        check_outcome_under(l, outcome, "mpk");
    }
    for ext in ["well", "amp_1181", "invert0r"] {
        check_crashes_and_detections(&lines, ext, "mpk");
    }
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report.json")).expect("JSON");
    let targets = &report["summary"]["targets"][0];
    assert_eq!(targets["isolation"], "mpk", "{targets:#}");
    assert_eq!(targets["survival"], 1.0, "{targets:#}");
    let markdown = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(
        markdown.contains("| mpk | the host survives the native crashes and hangs (at least 99.5%) |"),
        "{markdown}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// The smallest plugins of Debian's collections: the swh amplifier and the frei0r inverter (scripts/deps installs
/// swh-plugins and frei0r-plugins).
const AMP: &str = "/usr/lib/ladspa/amp_1181.so";
const INVERT: &str = "/usr/lib/frei0r-1/invert0r.so";

fn require_plugins() {
    for (path, package) in [(AMP, "swh-plugins"), (INVERT, "frei0r-plugins")] {
        assert!(Path::new(path).exists(), "{path} is missing: run scripts/deps (it installs {package})");
    }
}

/// A campaign over a real LADSPA plugin and a real frei0r plugin, stripped as Debian ships them: both workloads
/// run natively and under process isolation on the same mutated copies, and no host failure escapes.
#[test]
fn plugin_campaigns_keep_every_host_alive_under_process_isolation() {
    require_domain();
    require_plugins();
    let out = scratch("plugins");
    let extensions = format!("{AMP},{INVERT}");
    let args = ["--extension", &extensions, "--types", "all", "--trials-per-type", "3", "--seed", "4"];
    let lines = records(&campaign(&out, &args));

    let extensions: BTreeSet<&str> = lines.iter().filter_map(|l| l["extension"].as_str()).collect();
    assert_eq!(extensions, BTreeSet::from(["amp_1181", "invert0r"]));
    for l in &lines {
        let outcome = l["outcome"].as_str().unwrap_or_else(|| panic!("no outcome: {l}"));
        assert!(OUTCOMES.contains(&outcome), "{l}");
        match l["isolation"].as_str() {
            Some("native") => {
                assert!(!outcome.starts_with("recovered"), "nothing detects faults natively: {l}");
                assert_eq!(l["bypassed"], 0, "{l}");
            }
            Some("process") => assert!(
                outcome != "host_crashed" && outcome != "host_hung",
                "a host failure escaped process isolation: {l}"
            ),
            _ => panic!("unexpected isolation: {l}"),
        }
    }
    for ext in ["amp_1181", "invert0r"] {
        check_crashes_and_detections(&lines, ext, "process");
    }
    // Debian strips its plugins: faults still reach their internal functions (found through the unwind tables).
    let internal = |l: &&Value| {
        l["faults"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["function"].as_str().is_some_and(|n| n.starts_with("sub_"))))
    };
    assert!(lines.iter().any(|l| l["extension"] == "amp_1181" && internal(&l)), "no fault in amp's internal functions");
    // A plugin that fails in every retry of a block ends bypassed: the host is told, so the run counts as detected.
    assert!(
        lines.iter().any(|l| l["isolation"] == "process" && l["bypassed"].as_u64().is_some_and(|b| b > 0)),
        "no block or frame was bypassed"
    );

    // The unmutated plugins' reference output, measured natively (and matched under ward before any trial ran).
    let reference = |ext: &str| -> Vec<(String, String)> {
        let text = std::fs::read_to_string(out.join(ext).join("reference.json")).expect("reference.json");
        let entries: Vec<Value> = serde_json::from_str(&text).expect("reference.json is JSON");
        entries
            .iter()
            .map(|e| (e["call"].as_str().unwrap_or("").to_string(), e["result"].as_str().unwrap_or("").to_string()))
            .collect()
    };
    let amp = reference("amp_1181");
    assert_eq!(amp[0], ("plugins".to_string(), "1".to_string()));
    assert!(amp[1].1.starts_with("amp \"Simple amplifier\" (id 1181"), "{amp:?}");
    assert_eq!(amp.len(), 3 + 4, "plugins, describe, instantiate and four blocks: {amp:?}");
    let invert = reference("invert0r");
    assert!(invert[0].1.starts_with("\"Invert0r\" by "), "{invert:?}");
    assert_eq!(invert.len(), 2 + 4, "info, construct and four frames: {invert:?}");

    // The report over both campaigns.
    let markdown = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(markdown.contains("# ward campaign: 2 extensions"), "{markdown}");
    assert!(markdown.contains("| amp_1181 | ") && markdown.contains("| invert0r | "), "{markdown}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report.json")).expect("JSON");
    assert_eq!(report["summary"]["targets"][0]["survival"], 1.0, "{:#}", report["summary"]["targets"]);
    assert_eq!(report["extensions"].as_array().map(Vec::len), Some(2));
    for chart in ["outcomes.svg", "outcomes-by-extension.svg"] {
        let svg = std::fs::read_to_string(out.join(chart)).expect(chart);
        assert!(svg.starts_with("<svg") && svg.contains("invert0r") == (chart != "outcomes.svg"), "{chart}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The same plugins with transient faults: a restart under ward loads the unmutated plugin, so a call retried after a
/// fault succeeds and nothing is bypassed (the persistent campaign above bypasses blocks and frames).
#[test]
fn with_transient_faults_a_restart_runs_the_unmutated_plugin() {
    require_domain();
    require_plugins();
    let out = scratch("transient");
    let extensions = format!("{AMP},{INVERT}");
    let args = [
        "--extension",
        &extensions,
        "--types",
        "pointer,interface,text",
        "--trials-per-type",
        "4",
        "--seed",
        "4",
        "--fault-model",
        "transient",
    ];
    let lines = records(&campaign(&out, &args));
    let process: Vec<&Value> = lines.iter().filter(|l| l["isolation"] == "process").collect();
    assert!(!process.is_empty());
    for l in &process {
        let outcome = l["outcome"].as_str().unwrap_or_default();
        assert!(outcome != "host_crashed" && outcome != "host_hung", "a host failure escaped: {l}");
        assert_eq!(l["bypassed"], 0, "a retry on the unmutated plugin failed: {l}");
    }
    assert!(
        process.iter().any(|l| l["outcome"] == "recovered" && l["restarts"].as_u64().is_some_and(|r| r > 0)),
        "no trial recovered transparently after a restart"
    );
    let markdown = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(markdown.contains("Faults were transient"), "{markdown}");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("amp_1181").join("campaign.json")).expect("campaign.json"),
    )
    .expect("campaign.json is JSON");
    assert_eq!(config["fault_model"], "transient", "{config:#}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `--default-policy`: the isolated runs get ward's default policy only (no deadline, restart budget, backoff or
/// history of the campaign's), as the acceptance of issue 33 asks. Hosts still survive, the configuration and the
/// report say which policy ran, and each hang is judged by the deadline its call had, not by a campaign deadline.
#[test]
fn a_default_policy_campaign_keeps_every_host_alive_and_judges_each_hang_by_its_own_deadline() {
    require_domain();
    require_plugins();
    let out = scratch("default-policy");
    let extensions = format!("{AMP},{INVERT}");
    let args = [
        "--default-policy",
        "--host-timeout-s",
        "30",
        "--jobs",
        "2",
        "--json",
        "--extension",
        &extensions,
        "--types",
        "pointer,interface,text",
        "--trials-per-type",
        "3",
        "--seed",
        "4",
        "--fault-model",
        "transient",
    ];
    let run = ward().arg("campaign").args(args).arg("--out").arg(&out).output().expect("cannot run ward");
    let lines = records(&run);
    let process: Vec<&Value> = lines.iter().filter(|l| l["isolation"] == "process").collect();
    assert!(!process.is_empty());
    for l in &process {
        let outcome = l["outcome"].as_str().unwrap_or_default();
        assert!(outcome != "host_crashed" && outcome != "host_hung", "a host failure escaped: {l}");
    }
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("amp_1181").join("campaign.json")).expect("campaign.json"),
    )
    .expect("campaign.json is JSON");
    assert_eq!(config["deadline_ms"], Value::Null, "no campaign deadline: {config:#}");
    let markdown = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(markdown.contains("with ward's default policy only"), "{markdown}");
    assert!(markdown.contains("recovered fully transparently (at least 95%)"), "transient faults: {markdown}");
    assert!(markdown.contains("within its deadline (the deadline each call had, learned or first"), "{markdown}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report.json")).expect("JSON");
    let hangs = &report["summary"]["targets"][0]["hangs"];
    assert_eq!(hangs["deadline_us"], Value::Null, "{hangs:#}");
    assert_eq!(hangs["late"], 0, "{hangs:#}");
    // The same plugins and faults with a campaign deadline: resuming under the default policy is refused.
    let other = campaign(&out.join("amp_1181"), &["--extension", AMP, "--fault-model", "transient"]);
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("policy the default policy recorded, a 200 ms deadline asked"), "{stderr}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `--poison`: the isolated runs call well poisoned; the campaign records it and says so in its report, and a host
/// failure still never escapes.
#[test]
fn a_poisoned_campaign_records_and_reports_it() {
    require_domain();
    let out = scratch("poison");
    let args = ["--types", "interface,init", "--trials-per-type", "3", "--seed", "4", "--poison"];
    let lines = records(&campaign(&out, &args));
    assert!(lines.iter().any(|l| l["isolation"] == "process"));
    for l in &lines {
        check_outcome_for_isolation(l, l["outcome"].as_str().unwrap_or_default());
    }
    let markdown = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(markdown.contains("calls were poisoned"), "{markdown}");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("campaign.json")).expect("campaign.json"))
            .expect("campaign.json is JSON");
    assert_eq!(config["poison"], true, "{config:#}");
    let again = ward()
        .arg("campaign")
        .args(["--types", "interface,init", "--trials-per-type", "3", "--seed", "4", "--out"])
        .arg(&out)
        .output()
        .expect("cannot run ward");
    assert_eq!(again.status.code(), Some(2), "resuming without --poison is refused as a bad input");
    assert!(String::from_utf8_lossy(&again.stderr).contains("poisoned calls true recorded"));
    let _ = std::fs::remove_dir_all(&out);
}

/// A Debian LADSPA plugin that allocates (its descriptors, its delay lines) and clears memory with the C library:
/// it imports malloc, calloc, free and memset.
const COMB: &str = "/usr/lib/ladspa/comb_1190.so";

/// Library-fault trials (`--types alloc,copy-overrun`) on a real plugin: the unmutated plugin runs with a library
/// fault natively (preloaded into the host) and under process isolation (preloaded into its domain); no host failure
/// escapes, every record names its fault, and the fault reaches the plugin in both kinds of host.
#[test]
fn library_fault_trials_keep_every_host_alive_under_process_isolation() {
    require_domain();
    assert!(Path::new(COMB).exists(), "{COMB} is missing: run scripts/deps (it installs swh-plugins)");
    let out = scratch("library");
    let args = ["--extension", COMB, "--types", "alloc,copy-overrun", "--trials-per-type", "3", "--seed", "4"];
    let lines = records(&campaign(&out, &args));

    assert_eq!(lines.len(), 2 * 3 * 2, "{lines:#?}");
    let mut faults = std::collections::BTreeMap::new();
    for l in &lines {
        assert_eq!(l["extension"], "comb_1190", "{l}");
        assert!(l["seed"].is_u64() && l["trial"].is_u64(), "{l}");
        let kind = l["fault_type"].as_str().unwrap_or_else(|| panic!("no fault type: {l}"));
        assert!(kind == "alloc" || kind == "copy-overrun", "{l}");
        assert_eq!(l["faults"].as_array().map(Vec::len), Some(0), "nothing is mutated: {l}");
        let fault = l["library_fault"].as_str().unwrap_or_else(|| panic!("no library fault: {l}"));
        assert!(fault.starts_with(&format!("{kind}:nth=")), "{l}");
        let trial = (kind.to_string(), l["trial"].to_string());
        assert_eq!(faults.entry(trial).or_insert(fault.to_string()), fault, "both runs of a trial get its fault");
        let outcome = l["outcome"].as_str().unwrap_or_else(|| panic!("no outcome: {l}"));
        assert!(OUTCOMES.contains(&outcome), "{l}");
        check_outcome_for_isolation(l, outcome);
    }
    assert_eq!(faults.len(), 6);
    // Seed 4 draws the first allocation for one alloc trial: the plugin's descriptors are not made, natively or in
    // the domain.
    for isolation in ["native", "process"] {
        assert!(
            lines.iter().any(|l| l["isolation"] == isolation
                && l["library_fault"] == "alloc:nth=1,count=1"
                && l["outcome"] != "no_effect"),
            "the failed allocation reaches the plugin in the {isolation} host: {lines:#?}"
        );
    }

    let markdown = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(markdown.contains("3 trials of each library fault kind (alloc,copy-overrun)"), "{markdown}");
    assert!(markdown.contains("Library fault kinds mutate nothing"), "{markdown}");
    assert!(markdown.contains("| alloc | native |") && markdown.contains("| copy-overrun | process |"), "{markdown}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("report.json")).expect("JSON");
    let rows: Vec<&str> = report["summary"]["rows"]
        .as_array()
        .map_or(Vec::new(), |r| r.iter().filter_map(|r| r["fault_type"].as_str()).collect());
    assert_eq!(rows, ["alloc", "copy-overrun"]);
    assert_eq!(report["config"]["fault_types"], serde_json::json!(["alloc", "copy-overrun"]));
    let svg = std::fs::read_to_string(out.join("outcomes.svg")).expect("outcomes.svg");
    assert!(svg.contains("copy-overrun"), "the chart has a bar group per library kind");
    let _ = std::fs::remove_dir_all(&out);
}

/// Mutated copies that crashed an mpk host in the 25-trials-per-type campaign of RELIABILITY.md, each as
/// (plugin, fault type, seed): butterworth's initialiser reserves 128 MiB, which the snapshot used to copy whole;
/// comb returns with rbx not restored, which the gate used to trust as its frame.
const ONCE_CRASHED_AN_MPK_HOST: [(&str, &str, &str); 2] = [
    ("/usr/lib/ladspa/butterworth_1902.so", "source", "16421822494284282098"),
    ("/usr/lib/ladspa/comb_1190.so", "destination", "9263023066645383812"),
];

/// Each copy above, mutated as the campaign did it, in the campaign's host with an mpk domain and the unmutated
/// plugin as `restart_from`: the host ends its workload and reports, loading went through, and butterworth's fault
/// (a null dereference once the adapter describes it) is recovered, with the unmutated plugin's output.
/// Needs protection keys: scripts/test runs it, in an emulated machine that has them where this one has not.
#[test]
#[ignore = "needs PKU"]
fn mutations_that_once_crashed_the_host_are_contained_under_mpk_isolation() {
    require_pku();
    let dir = scratch("once-crashed");
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let host = |mode: &str, plugin: &Path, extra: &[&str]| -> Value {
        let run = ward()
            .args(["__campaign-host", "--workload", "ladspa", "--mode", mode, "--deadline-ms", "1000"])
            .args(extra)
            .arg(plugin)
            .output()
            .expect("cannot run ward");
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert!(run.status.success(), "{mode} host on {}: {:?}; {stdout}", plugin.display(), run.status);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not a JSON report ({e}): {stdout}"))
    };
    for (plugin, kind, seed) in ONCE_CRASHED_AN_MPK_HOST {
        assert!(Path::new(plugin).exists(), "{plugin} is missing: run scripts/deps (it installs swh-plugins)");
        let copy = dir.join(format!("{kind}.so"));
        let inject =
            ward().args(["inject", "--type", kind, "--seed", seed, "--count", "5", plugin, "-o"]).arg(&copy).output();
        let inject = inject.expect("cannot run ward");
        assert!(inject.status.success(), "inject: {}", String::from_utf8_lossy(&inject.stderr));
        let report = host("mpk", &copy, &["--restart-from", plugin]);
        assert_eq!(report["load_error"], Value::Null, "{plugin}: {report}");
        assert_eq!(report["disabled"], false, "{plugin}: {report}");
        if kind == "source" {
            assert_eq!(report["restarts"], 1, "{plugin}: {report}");
            let native = host("native", Path::new(plugin), &[]);
            assert_eq!(report["output"], native["output"], "{plugin}: the recovered output is the plugin's own");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
