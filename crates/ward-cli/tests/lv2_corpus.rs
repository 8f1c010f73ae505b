//! The LV2 corpus through a real host: every LV2 effect plugin of Debian's swh-lv2, mda-lv2, x42-plugins,
//! lsp-plugins-lv2 and zam-plugins (installed by scripts/deps) runs through `lv2apply` (lilv-utils) on a fixed test
//! signal, natively twice and then under `ward run --isolation process -v`, and the output files are compared byte
//! for byte.
//!
//! The plugins of a package are found from its files: `dpkg -L` names its bundles, a directory of links to them is
//! the only entry of `LV2_PATH`, and `lv2ls`/`lv2info` there list its plugins and their ports. An effect has at least
//! one audio input and one audio output; a plugin that also has an atom or event input that is not
//! `connectionOptional` (MIDI, patch messages) needs input lv2apply cannot give, and is listed without being run.
//! lv2apply maps the channels of its input file to the audio inputs, so the signal has as many channels as the
//! plugin has audio inputs. Outputs are compared byte for byte, all but the time of writing libsndfile stamps into a
//! float WAV's PEAK chunk. lv2apply offers the plugin no feature and connects only audio and control ports: a plugin that
//! needs more fails natively, and is listed with lv2apply's reason, not compared. The second native run fills fresh
//! heap memory with a pattern (`MALLOC_PERTURB_`); a plugin whose two native outputs differ is nondeterministic (it
//! depends on time, randomness or memory it never wrote): listed, run under ward, not compared. A plugin whose output
//! under ward differs runs natively four more times before the difference counts, as in `ward corpus`.
//!
//! The test writes its table to `target/lv2-corpus.md` (docs/CORPUS.md's "LV2" section is pasted from it) and fails
//! on any output that differs under ward, any run that fails only under ward, and any run under ward whose `-v`
//! output does not say the plugin is under ward: that last needs ward's LV2 class (issue 31), until which `ward run`
//! loads LV2 plugins natively, and so the test is ignored.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;
use common::bounded::{run_within, Finished};
use common::{host, output, stderr, ward, wav, Scratch};

const PACKAGES: [&str; 5] = ["swh-lv2", "mda-lv2", "x42-plugins", "lsp-plugins-lv2", "zam-plugins"];
const SAMPLE_RATE: u32 = 48_000;
/// Per lv2apply run, natively or under ward: generous (the slowest plugins take about a second natively).
const RUN_LIMIT: Duration = Duration::from_secs(60);
/// Plugins run at once: the machine has two cores.
const JOBS: usize = 2;
/// What ward's verbose output says of an LV2 plugin it put under ward.
const UNDER_WARD: &str = "LV2 plugin under ward";

const AUDIO_PORT: &str = "lv2core#AudioPort";
const INPUT_PORT: &str = "lv2core#InputPort";
const OUTPUT_PORT: &str = "lv2core#OutputPort";
const ATOM_PORT: &str = "atom#AtomPort";
const EVENT_PORT: &str = "event#EventPort";
const OPTIONAL: &str = "lv2core#connectionOptional";

/// One plugin as lv2info describes it.
#[derive(Debug, Clone)]
struct Plugin {
    package: &'static str,
    uri: String,
    audio_in: usize,
    audio_out: usize,
    /// The symbol of an atom or event input the plugin needs connected, if it has one.
    required_message_input: Option<String>,
}

/// What became of one plugin.
#[derive(Debug, Clone)]
enum Verdict {
    Identical,
    /// The output under ward differs from the (reproducible) native one.
    Differs,
    /// Natively fine, under ward not.
    FailsUnderWard(String),
    FailsNatively(String),
    /// The two native outputs differ; with what happened under ward.
    Nondeterministic(String),
    /// Not run: needs an atom or event input.
    NeedsMessageInput(String),
}

impl Verdict {
    fn label(&self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::Differs => "differs",
            Verdict::FailsUnderWard(_) => "fails only under ward",
            Verdict::FailsNatively(_) => "fails natively",
            Verdict::Nondeterministic(_) => "nondeterministic",
            Verdict::NeedsMessageInput(_) => "not run: needs an atom/MIDI input",
        }
    }

    fn reason(&self) -> String {
        match self {
            Verdict::Identical => String::new(),
            Verdict::Differs => "the output under ward differs from the native one".into(),
            Verdict::FailsUnderWard(r) | Verdict::FailsNatively(r) | Verdict::Nondeterministic(r) => r.clone(),
            Verdict::NeedsMessageInput(symbol) => format!("its atom/event input `{symbol}` is not optional"),
        }
    }

    /// A failure of the test (the line assertion is counted apart).
    fn fails(&self) -> bool {
        matches!(self, Verdict::Differs | Verdict::FailsUnderWard(_))
    }
}

struct Outcome {
    plugin: Plugin,
    verdict: Verdict,
    /// Under ward: whether `-v` said the plugin was under ward (None: not run under ward).
    said_under_ward: Option<bool>,
    /// Seconds natively (first run) and under ward.
    native_s: f64,
    ward_s: f64,
}

/// The directory cargo builds into (`target`), where the table is written.
fn target_dir() -> PathBuf {
    let ward = PathBuf::from(env!("CARGO_BIN_EXE_ward"));
    ward.parent().and_then(Path::parent).map(Path::to_path_buf).expect("the ward binary lies in target/PROFILE")
}

/// The installed version of a Debian package, for the table.
fn version(package: &str) -> String {
    let out = output(Command::new("dpkg-query").args(["-W", "-f=${Version}", package]));
    assert!(
        out.status.success(),
        "{package} is not installed: run scripts/deps (it installs the LV2 collections)\n{}",
        stderr(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A directory holding a link to each LV2 bundle `package` installs: the `LV2_PATH` that shows only its plugins.
fn package_lv2_path(s: &Scratch, package: &str) -> PathBuf {
    let out = output(Command::new("dpkg").args(["-L", package]));
    assert!(out.status.success(), "dpkg -L {package}: {}", stderr(&out));
    let dir = s.path(&format!("lv2-path-{package}"));
    std::fs::create_dir_all(&dir).expect("create the package's LV2_PATH directory");
    let mut bundles = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let path = Path::new(line);
        let is_bundle = path.extension().is_some_and(|e| e == "lv2") && path.join("manifest.ttl").is_file();
        if let (true, Some(name)) = (is_bundle, path.file_name()) {
            symlink(path, dir.join(name)).unwrap_or_else(|e| panic!("link {}: {e}", path.display()));
            bundles += 1;
        }
    }
    assert!(bundles > 0, "{package} installs no LV2 bundle");
    dir
}

/// Every plugin of `package`, described by lv2info.
fn package_plugins(s: &Scratch, package: &'static str) -> Vec<Plugin> {
    let lv2_path = package_lv2_path(s, package);
    let out = output(Command::new(host("lv2ls")).env("LV2_PATH", &lv2_path));
    assert!(out.status.success(), "lv2ls for {package}: {}", stderr(&out));
    let uris: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    assert!(!uris.is_empty(), "lv2ls lists no plugin of {package}");
    uris.into_iter()
        .map(|uri| {
            let out = output(Command::new(host("lv2info")).arg(&uri).env("LV2_PATH", &lv2_path));
            assert!(out.status.success(), "lv2info {uri}: {}", stderr(&out));
            describe(package, uri, &String::from_utf8_lossy(&out.stdout))
        })
        .collect()
}

/// Reads the ports out of lv2info's text: each port is a block that starts with a line `Port N:` and lists its
/// types and properties by URI.
fn describe(package: &'static str, uri: String, info: &str) -> Plugin {
    let mut plugin = Plugin { package, uri, audio_in: 0, audio_out: 0, required_message_input: None };
    for block in info.split("\n\tPort ").skip(1) {
        let symbol = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("Symbol:"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let input = block.contains(INPUT_PORT);
        if block.contains(AUDIO_PORT) {
            if input {
                plugin.audio_in += 1;
            } else if block.contains(OUTPUT_PORT) {
                plugin.audio_out += 1;
            }
        } else if (block.contains(ATOM_PORT) || block.contains(EVENT_PORT))
            && input
            && !block.contains(OPTIONAL)
            && plugin.required_message_input.is_none()
        {
            plugin.required_message_input = Some(symbol);
        }
    }
    plugin
}

/// The test signal on `channels` channels, 1 s at 48 kHz, interleaved: an exponential sweep from 20 Hz to 20 kHz
/// (0.5 s) with a little noise under it, then noise alone (0.25 s), then silence (0.25 s: tails, and what a plugin
/// does with denormals). Each channel has its own sweep phase and noise seed, so that a plugin that mixes or swaps
/// channels shows it. The noise is a fixed-seed LCG: the same bits every run. One second, not several: lv2apply
/// calls `run` once a frame, so the corpus's time grows with the signal's length (see DECISIONS.md).
fn test_signal(channels: usize) -> Vec<f32> {
    let rate = f64::from(SAMPLE_RATE);
    let frames = SAMPLE_RATE as usize;
    let sweep_end = frames / 2;
    let noise_end = frames * 3 / 4;
    let mut samples = vec![0f32; frames * channels];
    for ch in 0..channels {
        let mut lcg: u32 = 0x2545_f491 ^ (ch as u32).wrapping_mul(0x9e37_79b9);
        let mut noise = move || {
            lcg = lcg.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            f64::from(lcg >> 8) / f64::from(1u32 << 24) * 2.0 - 1.0
        };
        let mut phase = ch as f64 * 0.7;
        let sweep_s = sweep_end as f64 / rate;
        for frame in 0..frames {
            let value = if frame < sweep_end {
                let t = frame as f64 / rate;
                let freq = 20.0 * 1000f64.powf(t / sweep_s);
                phase += 2.0 * std::f64::consts::PI * freq / rate;
                0.5 * phase.sin() + 0.02 * noise()
            } else if frame < noise_end {
                0.3 * noise()
            } else {
                0.0
            };
            samples[frame * channels + ch] = value as f32;
        }
    }
    samples
}

/// The test signal as a 32-bit float WAV (lv2apply writes the format it reads, so float output is compared at full
/// precision).
fn write_signal(path: &Path, channels: usize) {
    let spec = hound::WavSpec {
        channels: u16::try_from(channels).expect("channel count"),
        sample_rate: SAMPLE_RATE,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut wav = hound::WavWriter::create(path, spec).expect("create the test signal");
    for sample in test_signal(channels) {
        wav.write_sample(sample).expect("write the test signal");
    }
    wav.finalize().expect("finish the test signal");
}

fn lv2apply(input: &Path, out: &Path, uri: &str) -> Vec<std::ffi::OsString> {
    vec!["-i".into(), input.into(), "-o".into(), out.into(), uri.into()]
}

/// Why a run failed, in one line: how it ended and the last thing it said.
fn failure(run: &Finished) -> String {
    let said = run.stderr.lines().rev().find(|l| !l.trim().is_empty() && !l.starts_with("ward: ")).unwrap_or("");
    if said.is_empty() {
        run.ending.to_string()
    } else {
        format!("{}: {}", run.ending, said.trim())
    }
}

/// One plugin: natively twice, then under ward; its output files are removed afterwards.
fn check(s: &Scratch, n: usize, plugin: Plugin, inputs: &Mutex<BTreeMap<usize, PathBuf>>) -> Outcome {
    if let Some(symbol) = &plugin.required_message_input {
        let verdict = Verdict::NeedsMessageInput(symbol.clone());
        return Outcome { plugin, verdict, said_under_ward: None, native_s: 0.0, ward_s: 0.0 };
    }
    let input = {
        let mut inputs = inputs.lock().expect("the inputs lock");
        inputs
            .entry(plugin.audio_in)
            .or_insert_with(|| {
                let path = s.path(&format!("signal-{}ch.wav", plugin.audio_in));
                write_signal(&path, plugin.audio_in);
                path
            })
            .clone()
    };
    let [first, second, warded] = ["native1", "native2", "ward"].map(|k| s.path(&format!("p{n}-{k}.wav")));
    let err = s.path(&format!("p{n}.err"));

    let run1 = run_within(Command::new(host("lv2apply")).args(lv2apply(&input, &first, &plugin.uri)), RUN_LIMIT, &err);
    let native_s = run1.elapsed.as_secs_f64();
    let mut outcome = Outcome { plugin, verdict: Verdict::Identical, said_under_ward: None, native_s, ward_s: 0.0 };
    let uri = outcome.plugin.uri.clone();
    if !run1.ending.success() {
        outcome.verdict = Verdict::FailsNatively(failure(&run1));
        return outcome;
    }
    // The second native run gets fresh heap memory filled with a pattern (glibc's MALLOC_PERTURB_), as the LADSPA
    // corpus's perturbed run: a plugin that reads memory it never wrote then differs natively, not under ward.
    let run2 = run_within(
        Command::new("lv2apply").args(lv2apply(&input, &second, &uri)).env("MALLOC_PERTURB_", "165"),
        RUN_LIMIT,
        &err,
    );
    let reproducible = run2.ending.success() && wav::comparable(&first) == wav::comparable(&second);

    let mut cmd = ward();
    cmd.args(["run", "--isolation", "process", "-v", "--", "lv2apply"]).args(lv2apply(&input, &warded, &uri));
    let under = run_within(&mut cmd, RUN_LIMIT, &err);
    outcome.ward_s = under.elapsed.as_secs_f64();
    outcome.said_under_ward = Some(under.stderr.contains(UNDER_WARD));
    outcome.verdict = match (reproducible, under.ending.success()) {
        (false, ward_ok) => {
            let why = if run2.ending.success() {
                "the two native outputs differ (the second with fresh heap memory perturbed)".to_owned()
            } else {
                format!("the second native run failed ({})", failure(&run2))
            };
            let there = if ward_ok { "runs".to_owned() } else { format!("fails ({})", failure(&under)) };
            Verdict::Nondeterministic(format!("{why}; under ward it {there}, not compared"))
        }
        (true, false) => Verdict::FailsUnderWard(failure(&under)),
        (true, true) if wav::comparable(&first) == wav::comparable(&warded) => Verdict::Identical,
        (true, true) => match native_differs_again(&input, &first, &second, &uri, &err) {
            Some(run) => Verdict::Nondeterministic(format!(
                "the output under ward differed, and then native run {run} differed from the first; not compared"
            )),
            None => Verdict::Differs,
        },
    };
    for f in [&first, &second, &warded, &err] {
        let _ = std::fs::remove_file(f);
    }
    outcome
}

/// How often a plugin whose output under ward differs runs natively again before the difference counts.
const MORE_NATIVE_RUNS: usize = 4;

/// Runs the plugin natively `MORE_NATIVE_RUNS` more times (writing to `scratch_out`), and returns the number of the
/// first run whose output differs from `first`, if one does: a plugin that reads state it never set may come out
/// the same in two native runs and different in a third, and such a difference is not ward's.
fn native_differs_again(input: &Path, first: &Path, scratch_out: &Path, uri: &str, err: &Path) -> Option<usize> {
    let expected = wav::comparable(first);
    (0..MORE_NATIVE_RUNS).find_map(|k| {
        let _ = std::fs::remove_file(scratch_out);
        let run = run_within(Command::new("lv2apply").args(lv2apply(input, scratch_out, uri)), RUN_LIMIT, err);
        (!run.ending.success() || wav::comparable(scratch_out) != expected).then_some(k + 3)
    })
}

/// Runs `plugins` on `JOBS` threads, in the order given.
fn check_all(s: &Scratch, plugins: Vec<Plugin>) -> Vec<Outcome> {
    let next = AtomicUsize::new(0);
    let inputs = Mutex::new(BTreeMap::new());
    let done = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..JOBS {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Some(plugin) = plugins.get(n) else { break };
                let outcome = check(s, n, plugin.clone(), &inputs);
                println!("[{}/{}] {} {}", n + 1, plugins.len(), plugin.uri, outcome.verdict.label());
                done.lock().expect("the results lock").push((n, outcome));
            });
        }
    });
    let mut done = done.into_inner().expect("the results lock");
    done.sort_by_key(|(n, _)| *n);
    done.into_iter().map(|(_, o)| o).collect()
}

fn escape(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The markdown for docs/CORPUS.md: per package the counts, then every plugin that is not identical.
fn markdown(outcomes: &[Outcome], not_effects: &BTreeMap<&str, usize>, elapsed: Duration) -> String {
    let mut md = String::new();
    let versions: Vec<String> = PACKAGES.iter().map(|p| format!("{p} {}", version(p))).collect();
    let _ = writeln!(md, "Packages: {}; lv2apply from lilv-utils {}.\n", versions.join(", "), version("lilv-utils"));
    let _ = writeln!(
        md,
        "{} effect plugins in {:.0} s ({JOBS} at once, {} s limit per run); under ward: `ward run --isolation \
         process -v -- lv2apply`.\n",
        outcomes.len(),
        elapsed.as_secs_f64(),
        RUN_LIMIT.as_secs()
    );
    let _ = writeln!(
        md,
        "| package | effects | identical | differs | fails only under ward | nondeterministic | fails natively | \
         not run (atom/MIDI input) | not effects |"
    );
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for package in PACKAGES {
        let mine: Vec<&Outcome> = outcomes.iter().filter(|o| o.plugin.package == package).collect();
        let count = |label: &str| mine.iter().filter(|o| o.verdict.label() == label).count();
        let _ = writeln!(
            md,
            "| {package} | {} | {} | {} | {} | {} | {} | {} | {} |",
            mine.len(),
            count("identical"),
            count("differs"),
            count("fails only under ward"),
            count("nondeterministic"),
            count("fails natively"),
            count("not run: needs an atom/MIDI input"),
            not_effects.get(package).copied().unwrap_or(0)
        );
    }
    let exceptions: Vec<&Outcome> = outcomes.iter().filter(|o| !matches!(o.verdict, Verdict::Identical)).collect();
    let _ = writeln!(md, "\n#### Not compared or not identical ({})\n", exceptions.len());
    let _ = writeln!(md, "| plugin | package | verdict | reason |");
    let _ = writeln!(md, "| --- | --- | --- | --- |");
    for o in exceptions {
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} |",
            o.plugin.uri,
            o.plugin.package,
            o.verdict.label(),
            escape(&o.verdict.reason())
        );
    }
    md
}

#[test]
fn every_lv2_effect_gives_the_native_output_through_lv2apply_under_ward() {
    host("lv2apply");
    let s = Scratch::new("lv2-corpus", "lv2apply");
    let start = Instant::now();
    let mut plugins = Vec::new();
    let mut not_effects = BTreeMap::new();
    for package in PACKAGES {
        for plugin in package_plugins(&s, package) {
            if plugin.audio_in > 0 && plugin.audio_out > 0 {
                plugins.push(plugin);
            } else {
                *not_effects.entry(package).or_insert(0) += 1;
            }
        }
    }
    let listed = start.elapsed();
    println!("{} effect plugins listed in {:.1} s", plugins.len(), listed.as_secs_f64());
    assert!(!plugins.is_empty(), "no LV2 effect plugin found");

    let outcomes = check_all(&s, plugins);
    let elapsed = start.elapsed();
    for o in &outcomes {
        let line = match o.said_under_ward {
            Some(true) => "under ward",
            Some(false) => "NOT under ward",
            None => "-",
        };
        println!(
            "{:<70} {:<16} {:<34} {:>6.2} s {:>6.2} s  {line}  {}",
            o.plugin.uri,
            o.plugin.package,
            o.verdict.label(),
            o.native_s,
            o.ward_s,
            o.verdict.reason()
        );
    }
    let md = markdown(&outcomes, &not_effects, elapsed);
    println!("\n{md}");
    let table = target_dir().join("lv2-corpus.md");
    std::fs::write(&table, &md).unwrap_or_else(|e| panic!("write {}: {e}", table.display()));
    println!("table written to {}; {:.0} s in all", table.display(), elapsed.as_secs_f64());

    let failing: Vec<String> = outcomes
        .iter()
        .filter(|o| o.verdict.fails())
        .map(|o| format!("{}: {}: {}", o.plugin.uri, o.verdict.label(), o.verdict.reason()))
        .collect();
    let compared = outcomes.iter().filter(|o| o.said_under_ward.is_some()).count();
    let not_under_ward: Vec<&str> =
        outcomes.iter().filter(|o| o.said_under_ward == Some(false)).map(|o| o.plugin.uri.as_str()).collect();
    assert!(failing.is_empty(), "{} plugins fail under ward:\n{}", failing.len(), failing.join("\n"));
    assert!(compared > 0, "no plugin ran under ward");
    assert!(
        not_under_ward.is_empty(),
        "of {compared} plugins run under ward, {} were not under ward (`-v` lacks \"{UNDER_WARD}\"): {}",
        not_under_ward.len(),
        not_under_ward.join(", ")
    );
}
