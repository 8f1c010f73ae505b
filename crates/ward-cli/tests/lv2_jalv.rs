//! jalv, a real-time LV2 host, in a JACK server with the dummy backend (48 kHz, 128-frame periods: a deadline of
//! 2.7 ms a period): an swh effect runs for a fixed time natively and under `ward run`, each in a server of its own,
//! and the xruns JACK counted are reported for both. jalv, jackd2 and swh-lv2 come from scripts/deps.
//!
//! Until ward has an LV2 class (issue 31), `ward run` loads LV2 plugins natively, so the run under ward shows that
//! the host and ward's preload get along in a real-time host; the test that the plugin is under ward waits for the
//! class.

use std::process::Command;
use std::time::Duration;

mod common;
use common::jack::{run_jalv, JalvRun};
use common::{host, ward, Scratch};

/// swh's DJ EQ: an effect (stereo in and out, three gains) with one control output, its latency, which its `run`
/// sets to 3 samples: after a run, jalv's `monitors` shows `latency = 3.000000` only if the plugin processed.
const PLUGIN: &str = "http://plugin.org.uk/swh-plugins/dj_eq";
const PROCESSED: &str = "latency = 3.000000";
/// The JACK client name jalv takes (`-n`), by which its ports are found.
const CLIENT: &str = "ward-jalv";
/// How long each run processes once its client is up: a few seconds, about 1,900 periods.
const RUN_FOR: Duration = Duration::from_secs(5);

fn jalv_args() -> [&'static str; 3] {
    ["-n", CLIENT, PLUGIN]
}

fn native(test: &str) -> JalvRun {
    let s = Scratch::new("lv2-jalv", &format!("{test}-native"));
    let mut jalv = Command::new(host("jalv"));
    jalv.args(jalv_args());
    run_jalv(&s, "native", jalv, CLIENT, RUN_FOR)
}

fn under_ward(test: &str) -> JalvRun {
    let s = Scratch::new("lv2-jalv", &format!("{test}-ward"));
    let mut cmd = ward();
    cmd.args(["run", "--isolation", "process", "-v", "--", host("jalv")]).args(jalv_args());
    run_jalv(&s, "ward", cmd, CLIENT, RUN_FOR)
}

/// jalv ended by itself at end of input, with status 0, having processed (the plugin's output control was set).
fn assert_processed(what: &str, run: &JalvRun) {
    let status = run.status;
    assert!(
        status.is_some_and(|s| s.success()),
        "{what}: jalv did not quit cleanly at end of input: {status:?}\nstdout: {}\nstderr: {}\njackd: {}",
        run.stdout,
        run.stderr,
        run.xruns.log
    );
    assert!(
        run.stdout.contains(PROCESSED),
        "{what}: the plugin's latency output was never set ({PROCESSED} missing), so it did not process\nstdout: {}\n\
         stderr: {}",
        run.stdout,
        run.stderr
    );
}

fn report(what: &str, run: &JalvRun) {
    println!(
        "{what}: jalv {PLUGIN} for {} s at {} Hz, {} frames: {} client xruns, {} driver xruns",
        RUN_FOR.as_secs(),
        common::jack::SAMPLE_RATE,
        common::jack::PERIOD,
        run.xruns.client,
        run.xruns.driver
    );
}

#[test]
fn jalv_processes_an_lv2_effect_in_jack_natively_and_under_ward() {
    let native = native("both");
    report("native", &native);
    assert_processed("native", &native);
    let warded = under_ward("both");
    report("under ward", &warded);
    assert_processed("under ward", &warded);
}

#[test]
fn under_ward_jalvs_plugin_runs_in_a_process_domain() {
    let warded = under_ward("line");
    report("under ward", &warded);
    assert_processed("under ward", &warded);
    assert!(
        warded.stderr.contains("LV2 plugin under ward (isolation process"),
        "ward did not put the plugin under ward:\n{}",
        warded.stderr
    );
}

/// Blocks of 128 frames before ward's faulty plugins fail: about half a second into the run.
const FAULT_AT_BLOCK: &str = "at_block=200";

fn faulty(mode: &str, native: bool) -> JalvRun {
    let uri = format!("urn:ward:lv2:faulty#{mode}");
    let tag = if native { "native" } else { "ward" };
    let s = Scratch::new("lv2-jalv", &format!("faulty-{mode}-{tag}"));
    let lv2_path = ward_extensions::lv2_bundles().expect("the built-in LV2 bundles");
    let mut cmd = if native {
        Command::new(host("jalv"))
    } else {
        let mut c = ward();
        c.args(["run", "--isolation", "process", "-v", "--", host("jalv")]);
        c
    };
    cmd.env("LV2_PATH", lv2_path).args(["-n", CLIENT, "-c", FAULT_AT_BLOCK, &uri]);
    run_jalv(&s, tag, cmd, CLIENT, RUN_FOR)
}

#[test]
fn faulty_lv2_plugins_kill_jalv_natively_and_under_ward_it_keeps_running_with_each_fault_recovered() {
    // Natively each of these ends jalv (or hangs its process callback, and jalv has to be interrupted).
    for mode in ["crash", "abort", "atom-overrun", "work-crash", "hang"] {
        let run = faulty(mode, true);
        assert!(
            !run.status.is_some_and(|s| s.success()) || !run.xruns.log.is_empty() && mode == "hang",
            "{mode}: jalv survived natively: {:?}\nstdout: {}\nstderr: {}",
            run.status,
            run.stdout,
            run.stderr
        );
    }
    // Under ward jalv runs on and quits cleanly at the end of its input; every fault is reported and recovered (a
    // malformed atom sequence never reaches jalv: it is a fault too; a crash in save is one of ward's checkpoints).
    for mode in ["crash", "abort", "hang", "atom-overrun", "atom-malformed", "work-crash", "save-crash"] {
        let run = faulty(mode, false);
        println!("{mode} under ward: {} client xruns, {} driver xruns", run.xruns.client, run.xruns.driver);
        assert!(
            run.status.is_some_and(|s| s.success()),
            "{mode} under ward: jalv did not quit cleanly: {:?}\nstdout: {}\nstderr: {}",
            run.status,
            run.stdout,
            run.stderr
        );
        assert!(run.stderr.contains("fault:"), "{mode}: no fault reported\n{}", run.stderr);
        assert!(run.stderr.contains("recovered"), "{mode}: no recovery reported\n{}", run.stderr);
    }
}
