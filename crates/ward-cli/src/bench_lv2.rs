//! `ward bench lv2`: Debian's `lv2bench` (lilv-utils) over the LV2 corpus, natively and under `ward run`, plugin by
//! plugin (issue 31).
//!
//! The corpus is every effect plugin (at least one audio input port and one audio output port, as its bundle says,
//! read by `ward_classes::lv2::bundle`) of the Debian packages in [`PACKAGES`], or the plugins named with `--plugin`.
//! Each run is one process, `lv2bench -b 512 -n FRAMES URI`: natively, and as `ward run --verbose --isolation
//! process -- lv2bench ...` (and `mpk` where this machine has protection keys; `ward` being this program).
//!
//! **The figure is lv2bench's own.** lv2bench reads the wall clock before the first block and after the last, and
//! prints the seconds between (six decimals) and the plugin's URI: its loop of `FRAMES / 512` calls of `run`, on a
//! silent input with every control at its default. Nothing else of the process is in it: not its start, not lilv's
//! loading of the bundles, not instantiation or activation, and under `ward run` not the shim's start or the
//! domain's. The process's own wall time is not used.
//!
//! Per plugin: one untimed native run of [`CALIBRATION_BLOCKS`] blocks comes first. A plugin that fails it (lv2bench
//! skips one that requires a feature it does not offer, and one that cannot be instantiated; or it crashes) is
//! listed apart with the reason and not counted. From its time the frames of the timed runs are chosen so that the
//! native loop takes about [`NATIVE_TARGET_S`], within [`MIN_BLOCKS`] and [`MAX_BLOCKS`] blocks (`--frames` fixes
//! them instead): plugins differ in cost per block by more than two orders of magnitude, and a run must be long
//! against lv2bench's microsecond and against a plugin's first, cold blocks. Then `--runs` rounds, each running
//! native and every ward variant in turn, so that drift on a shared machine hits them alike. A ward run counts only when `ward run
//! --verbose` said the plugin ran under ward with the isolation asked for and reported no fault; otherwise the
//! plugin is listed apart for that variant, with what ward said.
//!
//! The ratio of a plugin is its median ward time over its median native time, both over the same frames, so it does
//! not depend on how many. Over all plugins: the median and the 90th percentile (nearest rank) of those ratios,
//! against the targets for the median.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use clap::Args;
use serde::Serialize;
use ward_classes::lv2::bundle::{self, Direction, PluginInfo, PortKind};

use crate::bench_hosts::{
    catch_interrupts, check_interrupted, cpus, load_average, need_program, progress, round, summarise, tail, Finished,
    TempDir,
};
use crate::load::Load;
use crate::output::{say, Columns};
use crate::run::BadInput;

/// The Debian packages whose effect plugins are the corpus (issue 31).
pub const PACKAGES: [&str; 5] = ["swh-lv2", "mda-lv2", "x42-plugins", "lsp-plugins-lv2", "zam-plugins"];
/// Where Debian installs LV2 bundles.
const SYSTEM_LV2: &str = "/usr/lib/lv2";

/// Frames per block (`lv2bench -b`), as the issue asks.
const BLOCK: u32 = 512;
/// Blocks of the untimed native run that chooses the frames of the timed ones.
const CALIBRATION_BLOCKS: u32 = 256;
/// How long the native loop of a timed run should take, where the block bounds allow.
const NATIVE_TARGET_S: f64 = 0.1;
/// At least this many blocks per timed run: a heavy plugin's first blocks (page faults, caches) stay a small part.
const MIN_BLOCKS: u32 = 256;
/// At most this many blocks per timed run: a plugin that does next to nothing per block would otherwise need
/// millions to last 0.1 s natively, and each block under `ward run` costs a round trip to its domain.
const MAX_BLOCKS: u32 = 8192;
/// A run that takes longer is stopped and counts as failed (a plugin that hangs must not stall the benchmark).
const RUN_LIMIT: Duration = Duration::from_secs(300);
/// How often a running lv2bench is looked at, for [`RUN_LIMIT`] and Ctrl-C; its own clock is what is measured.
const POLL: Duration = Duration::from_millis(5);

/// The median ratio over all plugins each isolation kind should stay under (issue 31).
const PROCESS_TARGET: f64 = 1.15;
const MPK_TARGET: f64 = 1.05;

#[derive(Args)]
pub struct Lv2Args {
    /// Timed runs of each variant per plugin (after one untimed native run).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// Benchmark this plugin (repeatable) instead of every effect plugin of the corpus.
    #[arg(long = "plugin", value_name = "URI")]
    plugins: Vec<String>,
    /// Frames of every run (`lv2bench -n`), a multiple of 512; without it they are chosen per plugin so that its
    /// native run takes about 0.1 s.
    #[arg(long, value_parser = parse_frames)]
    frames: Option<u32>,
    /// One JSON document instead of tables.
    #[arg(long)]
    json: bool,
    /// Only list the plugins that would be benchmarked (and the corpus bundles that cannot be read), one a line.
    #[arg(long)]
    list: bool,
    /// Policy file (TOML) for the `ward run` variants, as `ward run --policy` takes it; ward's defaults without one.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Run with this many processes of busy work beside every variant, native included (started and stopped by the
    /// benchmark).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    load: u32,
}

/// `--frames`: a whole number of blocks (lv2bench runs `FRAMES / 512` of them and drops the rest), at least one, and
/// within what lv2bench's `atoi` reads.
fn parse_frames(text: &str) -> Result<u32, String> {
    let frames: u32 = text.parse().map_err(|e| format!("{text:?} is not a number of frames: {e}"))?;
    if frames == 0 || !frames.is_multiple_of(BLOCK) || frames > i32::MAX as u32 {
        return Err(format!("{frames} frames: give a positive multiple of {BLOCK} (the block length)"));
    }
    Ok(frames)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Native,
    Process,
    Mpk,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Native => "native",
            Variant::Process | Variant::Mpk => "ward run",
        }
    }

    fn isolation(self) -> &'static str {
        match self {
            Variant::Native => "-",
            Variant::Process => "process",
            Variant::Mpk => "mpk",
        }
    }

    /// Short, for progress lines and the JSON.
    fn key(self) -> &'static str {
        match self {
            Variant::Native => "native",
            Variant::Process => "process",
            Variant::Mpk => "mpk",
        }
    }

    fn target(self) -> Option<f64> {
        match self {
            Variant::Native => None,
            Variant::Process => Some(PROCESS_TARGET),
            Variant::Mpk => Some(MPK_TARGET),
        }
    }
}

/// One plugin to benchmark.
#[derive(Clone)]
pub(crate) struct Plugin {
    pub(crate) uri: String,
    /// The Debian package of its bundle; "-" for a plugin named with `--plugin` outside the corpus packages.
    pub(crate) package: String,
}

/// A bundle of a corpus package that ward's bundle reader refuses: its plugins are not known, so not benchmarked.
struct Unreadable {
    bundle: PathBuf,
    package: &'static str,
    reason: String,
}

/// One plugin's timed runs.
struct Measured {
    plugin: Plugin,
    frames: u32,
    /// lv2bench's seconds per timed run, per variant in the order of [`Bench::variants`]; empty where it failed.
    seconds: Vec<Vec<f64>>,
    /// Why a ward variant is not counted for this plugin, where it failed.
    failed: Vec<Option<String>>,
}

impl Measured {
    fn median(&self, i: usize) -> f64 {
        summarise(&self.seconds[i]).median
    }

    /// The variant's median over native's, where the variant ran.
    fn ratio(&self, i: usize) -> Option<f64> {
        (self.failed[i].is_none() && !self.seconds[i].is_empty()).then(|| self.median(i) / self.median(0))
    }

    fn blocks(&self) -> u32 {
        self.frames / BLOCK
    }
}

/// A plugin left out of the figures, natively or under one ward variant.
struct LeftOut {
    plugin: Plugin,
    variant: Variant,
    reason: String,
}

/// How every run is started.
struct Bench {
    lv2bench: PathBuf,
    ward: PathBuf,
    policy: Option<PathBuf>,
    variants: Vec<Variant>,
    /// Where each run's standard output and error go.
    dir: TempDir,
    /// Lines `ward run` printed that are about the machine, not the plugin (a sandbox part missing): said once.
    notes: BTreeSet<String>,
}

pub fn lv2(args: Lv2Args) -> Result<bool> {
    catch_interrupts();
    let (plugins, unreadable) = if args.plugins.is_empty() { corpus()? } else { (named(&args.plugins)?, Vec::new()) };
    if args.list {
        return list(&plugins, &unreadable);
    }
    let lv2bench = need_program("lv2bench")?;
    let policy = match &args.policy {
        Some(p) => {
            // Read once here, so that a mistake in it is bad input before anything runs.
            ward::Policy::from_file(p)?;
            Some(std::path::absolute(p).unwrap_or_else(|_| p.clone()))
        }
        None => None,
    };
    let mut variants = vec![Variant::Native, Variant::Process];
    if ward::mpk_available() {
        variants.push(Variant::Mpk);
    }
    let mut bench = Bench {
        lv2bench,
        ward: std::env::current_exe().context("cannot find the running ward program")?,
        policy,
        variants,
        dir: TempDir::new("ward-bench-lv2")?,
        notes: BTreeSet::new(),
    };

    let load_before = load_average();
    let load = Load::start(args.load)?;
    let mut measured = Vec::new();
    let mut left_out = Vec::new();
    for (n, plugin) in plugins.iter().enumerate() {
        let counter = format!("[{}/{}] {}", n + 1, plugins.len(), plugin.uri);
        match measure(&mut bench, plugin, args.runs, args.frames)? {
            Ok(m) => {
                progress(&format!("lv2 {counter}: {}", progress_line(&bench, &m)));
                for (i, &v) in bench.variants.iter().enumerate() {
                    if let Some(reason) = &m.failed[i] {
                        left_out.push(LeftOut { plugin: plugin.clone(), variant: v, reason: reason.clone() });
                    }
                }
                measured.push(m);
            }
            Err(out) => {
                progress(&format!("lv2 {counter}: fails natively: {}", out.reason));
                left_out.push(out);
            }
        }
    }
    let load = Finished::from(load);
    let load_after = load_average();

    let report = Report {
        bench: &bench,
        args: &args,
        measured: &measured,
        left_out: &left_out,
        unreadable: &unreadable,
        load: (load_before, load_after),
        finished: &load,
    };
    if args.json {
        report.json()?;
    } else {
        report.text()?;
    }
    // A plugin that runs natively but not under ward is a failure of ward's, and nothing measured measures nothing.
    let ward_failed = left_out.iter().any(|l| l.variant != Variant::Native);
    let any_counted = measured.iter().any(|m| (1..bench.variants.len()).any(|i| m.ratio(i).is_some()));
    Ok(!ward_failed && any_counted)
}

/// `--list`: the plugins, then the bundles left out.
fn list(plugins: &[Plugin], unreadable: &[Unreadable]) -> Result<bool> {
    for p in plugins {
        say!("{} ({})", p.uri, p.package)?;
    }
    say!("{} plugins", plugins.len())?;
    for u in unreadable {
        say!(
            "bundle refused by ward's reader, its plugins left out: {} ({}): {}",
            u.bundle.display(),
            u.package,
            u.reason
        )?;
    }
    Ok(true)
}

/// One plugin: the untimed native run, then the timed rounds. `Err` when it fails natively.
fn measure(
    bench: &mut Bench,
    plugin: &Plugin,
    runs: u32,
    fixed_frames: Option<u32>,
) -> Result<Result<Measured, LeftOut>> {
    let natively = |reason: String| LeftOut { plugin: plugin.clone(), variant: Variant::Native, reason };
    let first_frames = fixed_frames.unwrap_or(CALIBRATION_BLOCKS * BLOCK);
    let frames = match bench.run(Variant::Native, &plugin.uri, first_frames)? {
        Ok(seconds) => fixed_frames.unwrap_or_else(|| frames_for(seconds)),
        Err(reason) => return Ok(Err(natively(reason))),
    };
    let n = bench.variants.len();
    let mut m = Measured { plugin: plugin.clone(), frames, seconds: vec![Vec::new(); n], failed: vec![None; n] };
    for round in 1..=runs {
        for (i, v) in bench.variants.clone().into_iter().enumerate() {
            if m.failed[i].is_some() {
                continue;
            }
            match bench.run(v, &plugin.uri, frames)? {
                Ok(seconds) => m.seconds[i].push(seconds),
                Err(reason) if v == Variant::Native => {
                    return Ok(Err(natively(format!("timed run {round}: {reason}"))));
                }
                Err(reason) => {
                    m.seconds[i].clear();
                    m.failed[i] = Some(if round == 1 { reason } else { format!("timed run {round}: {reason}") });
                }
            }
        }
    }
    if m.median(0) <= 0.0 {
        return Ok(Err(natively(format!(
            "lv2bench measured 0 s natively over {} blocks (it prints microseconds): give more --frames",
            m.blocks()
        ))));
    }
    Ok(Ok(m))
}

/// The frames of the timed runs, from the seconds of the native run of [`CALIBRATION_BLOCKS`] blocks.
fn frames_for(calibration_s: f64) -> u32 {
    let per_block = calibration_s / f64::from(CALIBRATION_BLOCKS);
    let blocks = if per_block > 0.0 { (NATIVE_TARGET_S / per_block).ceil() } else { f64::INFINITY };
    // In range after the clamp, so the conversion is exact.
    let blocks = blocks.clamp(f64::from(MIN_BLOCKS), f64::from(MAX_BLOCKS)) as u32;
    blocks * BLOCK
}

fn progress_line(bench: &Bench, m: &Measured) -> String {
    let mut line = format!("{} blocks: native {:.6} s", m.blocks(), m.median(0));
    for (i, &v) in bench.variants.iter().enumerate().skip(1) {
        match m.ratio(i) {
            Some(r) => line.push_str(&format!(", {} {:.6} s ({r:.3}x)", v.key(), m.median(i))),
            None => line.push_str(&format!(", {} failed", v.key())),
        }
    }
    line
}

impl Bench {
    /// One lv2bench run of `uri` as `variant`: lv2bench's seconds, or why there are none. `Err` only when the
    /// benchmark itself cannot go on (lv2bench cannot be started, Ctrl-C).
    fn run(&mut self, variant: Variant, uri: &str, frames: u32) -> Result<Result<f64, String>> {
        let mut cmd = match variant {
            Variant::Native => Command::new(&self.lv2bench),
            Variant::Process | Variant::Mpk => {
                let mut c = Command::new(&self.ward);
                // --verbose: ward says which plugins it put under ward, which is how a run under ward is told from
                // one where the plugin was loaded without it.
                c.args(["run", "--verbose", "--isolation", variant.isolation()]);
                if let Some(policy) = &self.policy {
                    c.arg("--policy").arg(policy);
                }
                c.arg("--").arg(&self.lv2bench);
                c
            }
        };
        cmd.args(["-b", &BLOCK.to_string(), "-n", &frames.to_string(), uri]);
        let out_path = self.dir.path().join(format!("stdout-{}.txt", variant.key()));
        let err_path = self.dir.path().join(format!("stderr-{}.txt", variant.key()));
        let out = File::create(&out_path).with_context(|| format!("cannot create {}", out_path.display()))?;
        let err = File::create(&err_path).with_context(|| format!("cannot create {}", err_path.display()))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let mut child = cmd.spawn().with_context(|| format!("cannot run {}", self.lv2bench.display()))?;
        let status = wait_within(&mut child, RUN_LIMIT)?;
        check_interrupted()?;
        let stdout = String::from_utf8_lossy(&std::fs::read(&out_path).unwrap_or_default()).into_owned();
        let stderr = String::from_utf8_lossy(&std::fs::read(&err_path).unwrap_or_default()).into_owned();
        let Some(status) = status else {
            return Ok(Err(format!("no result within {} s: stopped", RUN_LIMIT.as_secs())));
        };
        if variant != Variant::Native {
            let said = WardSaid::read(&stderr, variant.isolation());
            self.notes.extend(said.notes);
            if let Some(problem) = said.problem {
                return Ok(Err(problem));
            }
        }
        if !status.success() {
            return Ok(Err(failure(status, &stderr)));
        }
        Ok(lv2bench_seconds(&stdout, uri).ok_or_else(|| match plugin_lines(&stderr) {
            lines if lines.is_empty() => "lv2bench printed no time for it".to_string(),
            lines => lines,
        }))
    }
}

/// Wait for `child` at most `limit`; past it, kill it (our own child, by its handle) and return `None`.
fn wait_within(child: &mut std::process::Child, limit: Duration) -> Result<Option<ExitStatus>> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("cannot wait for lv2bench")? {
            return Ok(Some(status));
        }
        if start.elapsed() > limit || check_interrupted().is_err() {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// Why a run that exited unsuccessfully failed: its status and what it printed last.
fn failure(status: ExitStatus, stderr: &str) -> String {
    let lines = plugin_lines(stderr);
    if lines.is_empty() {
        format!("lv2bench {status}")
    } else {
        format!("lv2bench {status}: {lines}")
    }
}

/// The last lines of standard error that are not ward's, joined: lv2bench's reason for skipping a plugin, or the
/// plugin's own complaint.
///
/// A Rust panic's first two lines (where, and its message) come first: the last lines of its backtrace name only
/// the thread's start, and without them a run that aborted says nothing of why.
pub(crate) fn plugin_lines(stderr: &str) -> String {
    let own: Vec<&str> = stderr.lines().filter(|l| !l.starts_with("ward: ") && !l.trim().is_empty()).collect();
    let last = tail(&own.join("\n"), 3).replace('\n', " / ");
    match own.iter().position(|l| l.contains("panicked at")) {
        Some(at) => {
            let panic = own[at..(at + 2).min(own.len())].join(" / ");
            if last.contains(&panic) {
                last
            } else {
                format!("{panic} / ... / {last}")
            }
        }
        None => last,
    }
}

/// lv2bench's time for `uri`: its line `SECONDS URI` (the form without `-f`).
fn lv2bench_seconds(stdout: &str, uri: &str) -> Option<f64> {
    stdout.lines().find_map(|line| {
        let (seconds, rest) = line.trim().split_once(char::is_whitespace)?;
        if rest.trim() != uri {
            return None;
        }
        seconds.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0)
    })
}

/// What `ward run --verbose` said about one run (of lv2bench here, of jalv in `ward bench jalv`).
pub(crate) struct WardSaid {
    /// Why the run does not count: the plugin was not under ward with the isolation asked for, or ward reported
    /// something about it (a fault, a recovery, a refusal).
    pub(crate) problem: Option<String>,
    /// Whether ward said the plugin ran under ward with the isolation asked for.
    pub(crate) under_ward: bool,
    /// What ward reported about the plugin beyond how things are: faults, recoveries, refusals.
    pub(crate) reported: Vec<String>,
    /// Lines about the machine rather than the plugin.
    pub(crate) notes: Vec<String>,
}

impl WardSaid {
    /// `isolation`: the one `ward run --isolation` was given.
    pub(crate) fn read(stderr: &str, isolation: &str) -> WardSaid {
        let asked = format!("LV2 plugin under ward (isolation {isolation}");
        let mut under_ward = false;
        let mut notes = Vec::new();
        let mut reported = Vec::new();
        for line in stderr.lines().filter_map(|l| l.strip_prefix("ward: ")) {
            if line.contains(&asked) {
                under_ward = true;
            } else if line.contains("plugin under ward (isolation") {
                // Under ward with another isolation than asked for: not what this variant measures (said below).
            } else if line.starts_with("this machine lacks part of") {
                notes.push(line.to_string());
            } else if !informational(line) {
                reported.push(line.to_string());
            }
        }
        let problem = if !reported.is_empty() {
            Some(format!("ward reported: {}", reported.join(" / ")))
        } else if !under_ward {
            Some(format!(
                "the plugin did not run under ward with isolation {isolation} (`ward run --verbose` did not say so){}",
                match plugin_lines(stderr) {
                    lines if lines.is_empty() => String::new(),
                    lines => format!(": {lines}"),
                }
            ))
        } else {
            None
        };
        WardSaid { problem, under_ward, reported, notes }
    }
}

/// `ward run --verbose` lines that say how things are, not that anything went wrong.
fn informational(line: &str) -> bool {
    line.starts_with("heap blocks of 1 MiB and more come from ward's arena")
        || line.contains(": closed by the host (0 restarts")
        || line.contains("features ward's LV2 class does not know were left out")
        || line.contains("history past its bound")
        || line.contains("is not in its bundle's description: left out")
        || line.contains("instantiated by a real-time host")
        || line.contains("run from a real-time thread")
}

/// Every effect plugin of the corpus packages, in package order; and the bundles that could not be read.
fn corpus() -> Result<(Vec<Plugin>, Vec<Unreadable>)> {
    let mut plugins = Vec::new();
    let mut unreadable = Vec::new();
    let mut seen = HashSet::new();
    for package in PACKAGES {
        for dir in bundles_of_package(package)? {
            match bundle::read_bundle(&dir) {
                Ok(b) => plugins.extend(
                    b.plugins
                        .iter()
                        .filter(|p| is_effect(p) && seen.insert(p.uri.clone()))
                        .map(|p| Plugin { uri: p.uri.clone(), package: package.to_string() }),
                ),
                Err(e) => unreadable.push(Unreadable { bundle: dir, package, reason: e.to_string() }),
            }
        }
    }
    Ok((plugins, unreadable))
}

/// An effect: audio in and audio out.
fn is_effect(plugin: &PluginInfo) -> bool {
    let audio = |direction| plugin.ports.iter().any(|p| p.kind == PortKind::Audio && p.direction == direction);
    audio(Direction::Input) && audio(Direction::Output)
}

/// The bundle directories a Debian package installs under [`SYSTEM_LV2`].
fn bundles_of_package(package: &str) -> Result<BTreeSet<PathBuf>> {
    let output = Command::new("dpkg").args(["-L", package]).stdin(Stdio::null()).output().map_err(|e| {
        anyhow!(BadInput(format!(
            "cannot run dpkg ({e}): the corpus is read from Debian's packages; name plugins with --plugin instead"
        )))
    })?;
    if !output.status.success() {
        return Err(anyhow!(BadInput(format!(
            "the package {package} is not installed (the LV2 corpus is {}); run scripts/deps",
            PACKAGES.join(", ")
        ))));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| l.starts_with(SYSTEM_LV2) && l.ends_with("/manifest.ttl"))
        .filter_map(|l| Path::new(l).parent().map(Path::to_path_buf))
        .collect())
}

/// The plugins named with `--plugin`, each found in a bundle on the LV2 path (lilv's, which lv2bench searches).
pub(crate) fn named(uris: &[String]) -> Result<Vec<Plugin>> {
    let path = bundle::search_path();
    let bundles = bundle::all_bundles(&path);
    // The package of each corpus bundle, where dpkg knows it; a plugin elsewhere has none.
    let mut owner = BTreeMap::new();
    for package in PACKAGES {
        for dir in bundles_of_package(package).unwrap_or_default() {
            owner.insert(dir, package);
        }
    }
    let mut plugins: Vec<Plugin> = Vec::new();
    for uri in uris {
        if plugins.iter().any(|p| &p.uri == uri) {
            continue;
        }
        let found = bundles.iter().flatten().find(|b| b.plugins.iter().any(|p| &p.uri == uri));
        let Some(b) = found else {
            let unreadable = bundles.iter().filter(|b| b.is_err()).count();
            return Err(anyhow!(BadInput(format!(
                "no LV2 plugin {uri} in the bundles on the LV2 path ({}){}",
                path.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":"),
                if unreadable > 0 { format!("; {unreadable} bundles there could not be read") } else { String::new() }
            ))));
        };
        let package = owner.get(&b.dir).map_or("-", |p| p);
        plugins.push(Plugin { uri: uri.clone(), package: package.to_string() });
    }
    Ok(plugins)
}

/// The `p`th percentile of `values` by nearest rank: the smallest value with at least `p`% of them at or below it.
fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Between 1 and the count after the clamp, so the conversion is exact.
    let rank = (p / 100.0 * sorted.len() as f64).ceil().clamp(1.0, sorted.len() as f64) as usize;
    sorted[rank - 1]
}

/// Why this machine cannot run mpk domains, from the processor's flags as the kernel shows them.
pub(crate) fn mpk_unavailable() -> String {
    let flags = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("flags"))
                .map(|l| l.split_whitespace().map(str::to_string).collect::<HashSet<String>>())
        })
        .unwrap_or_default();
    let why = if !flags.contains("pku") {
        "the processor has no memory protection keys (no pku flag in /proc/cpuinfo)"
    } else if !flags.contains("ospke") {
        "the kernel has not enabled the processor's memory protection keys (no ospke flag in /proc/cpuinfo)"
    } else if !flags.contains("fsgsbase") {
        "the processor or kernel lacks FSGSBASE, which mpk domains need"
    } else {
        "ward cannot use this machine's memory protection keys (ward::mpk_available is false)"
    };
    format!("cannot measure mpk: {why}")
}

/// "1.234x", or "-" where there is no ratio.
fn ratio_text(ratio: f64) -> String {
    if ratio.is_finite() {
        format!("{ratio:.3}x")
    } else {
        "-".to_string()
    }
}

/// "none", or the count before the list that follows.
fn count_text(n: usize) -> String {
    if n == 0 {
        "none".to_string()
    } else {
        n.to_string()
    }
}

/// One isolation kind's figures over all plugins.
struct Overall {
    variant: Variant,
    ratios: Vec<f64>,
}

impl Overall {
    fn median(&self) -> f64 {
        summarise(&self.ratios).median
    }

    fn p90(&self) -> f64 {
        percentile(&self.ratios, 90.0)
    }

    fn met(&self) -> Option<bool> {
        let target = self.variant.target()?;
        (!self.ratios.is_empty()).then(|| self.median() <= target)
    }
}

struct Report<'a> {
    bench: &'a Bench,
    args: &'a Lv2Args,
    measured: &'a [Measured],
    left_out: &'a [LeftOut],
    unreadable: &'a [Unreadable],
    load: (Option<f64>, Option<f64>),
    finished: &'a Finished,
}

/// What the figure is, for the header and the JSON.
const TIME_NOTE: &str = "each time is lv2bench's own figure: the wall-clock seconds of its loop of run() calls on \
                         512-frame blocks of silence (controls at their defaults), not the process's wall time: \
                         starting the process, loading lilv's world, instantiating and ward's domain start are \
                         outside it";

impl Report<'_> {
    fn overall(&self) -> Vec<Overall> {
        self.bench
            .variants
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, &variant)| Overall { variant, ratios: self.measured.iter().filter_map(|m| m.ratio(i)).collect() })
            .collect()
    }

    /// Plugins and variants with a target that had a run over twice their median.
    fn outliers(&self) -> Vec<String> {
        let mut found = Vec::new();
        for m in self.measured {
            for (i, &v) in self.bench.variants.iter().enumerate() {
                let s = summarise(&m.seconds[i]);
                if v.target().is_some() && m.failed[i].is_none() && s.max > 2.0 * s.median {
                    found.push(format!("{} ({})", m.plugin.uri, v.key()));
                }
            }
        }
        found
    }

    fn frames_text(&self) -> String {
        match self.args.frames {
            Some(f) => format!("{f} frames ({} blocks of {BLOCK}) per run, fixed by --frames", f / BLOCK),
            None => format!(
                "frames per plugin, so that its native loop takes about {NATIVE_TARGET_S} s ({MIN_BLOCKS} to \
                 {MAX_BLOCKS} blocks of {BLOCK}), from an untimed native run of {CALIBRATION_BLOCKS} blocks"
            ),
        }
    }

    fn corpus_text(&self) -> String {
        if self.args.plugins.is_empty() {
            format!("every effect plugin (audio in and out) of {}", PACKAGES.join(", "))
        } else {
            "the plugins named with --plugin".to_string()
        }
    }

    fn text(&self) -> Result<()> {
        let plugins = self.measured.len() + self.left_out.iter().filter(|l| l.variant == Variant::Native).count();
        say!(
            "ward bench lv2: lv2bench -b {BLOCK} over {plugins} plugin{} ({}); {} timed runs of each variant per \
             plugin, interleaved, after one untimed native run; {} CPUs",
            if plugins == 1 { "" } else { "s" },
            self.corpus_text(),
            self.args.runs,
            cpus()
        )?;
        say!("time: {TIME_NOTE}")?;
        say!("frames: {}", self.frames_text())?;
        self.finished.say()?;
        say!(
            "policy of the ward run variants: {}",
            self.bench.policy.as_ref().map_or_else(|| "ward's defaults".to_string(), |p| p.display().to_string())
        )?;
        if !self.bench.variants.contains(&Variant::Mpk) {
            say!("{}", mpk_unavailable())?;
        }
        for note in &self.bench.notes {
            say!("ward said: {note}")?;
        }
        let cols = Columns::new(&[10, 9, 10, 10, 10, 10]);
        say!("")?;
        if !self.measured.is_empty() {
            say!("{}", cols.row(&["variant", "isolation", "median", "min", "max", "per block", "ratio"]))?;
        }
        for m in self.measured {
            say!("{} ({}): {} blocks, -n {}", m.plugin.uri, m.plugin.package, m.blocks(), m.frames)?;
            for (i, &v) in self.bench.variants.iter().enumerate() {
                if let Some(reason) = &m.failed[i] {
                    say!("{}", cols.row(&[v.name(), v.isolation(), &format!("failed, not counted: {reason}")]))?;
                    continue;
                }
                let s = summarise(&m.seconds[i]);
                say!(
                    "{}",
                    cols.row(&[
                        v.name(),
                        v.isolation(),
                        &format!("{:.6} s", s.median),
                        &format!("{:.6} s", s.min),
                        &format!("{:.6} s", s.max),
                        &crate::output::fmt_ns(s.median * 1e9 / f64::from(m.blocks())),
                        &m.ratio(i).map_or_else(String::new, |r| format!("{r:.3}x")),
                    ])
                )?;
            }
        }

        say!("")?;
        say!(
            "over all plugins: per plugin the ratio of its median ward time to its median native time; their median \
             and 90th percentile (nearest rank)"
        )?;
        let cols = Columns::new(&[9, 8, 13, 16]);
        say!("{}", cols.row(&["isolation", "plugins", "median ratio", "90th percentile", "target"]))?;
        for o in self.overall() {
            let target = match (o.variant.target(), o.met()) {
                (Some(t), Some(met)) => format!("median <= {t:.2}x: {}", if met { "met" } else { "MISSED" }),
                (Some(t), None) => format!("median <= {t:.2}x: no plugin measured"),
                (None, _) => String::new(),
            };
            say!(
                "{}",
                cols.row(&[
                    o.variant.isolation(),
                    &o.ratios.len().to_string(),
                    &ratio_text(o.median()),
                    &ratio_text(o.p90()),
                    &target,
                ])
            )?;
        }
        if !self.bench.variants.contains(&Variant::Mpk) {
            say!("{}", cols.row(&["mpk", "-", &format!("{}; target median <= {MPK_TARGET:.2}x", mpk_unavailable())]))?;
        }
        let outliers = self.outliers();
        say!(
            "no run over twice its median: {}",
            if outliers.is_empty() { "met".to_string() } else { format!("MISSED ({})", outliers.join(", ")) }
        )?;
        let natively: Vec<&LeftOut> = self.left_out.iter().filter(|l| l.variant == Variant::Native).collect();
        let under_ward: Vec<&LeftOut> = self.left_out.iter().filter(|l| l.variant != Variant::Native).collect();
        say!("failed natively under lv2bench, not counted: {}", count_text(natively.len()))?;
        for l in natively {
            say!("  {} ({}): {}", l.plugin.uri, l.plugin.package, l.reason)?;
        }
        say!("failed under ward, not counted: {}", count_text(under_ward.len()))?;
        for l in under_ward {
            say!("  {} ({}), isolation {}: {}", l.plugin.uri, l.plugin.package, l.variant.isolation(), l.reason)?;
        }
        if !self.unreadable.is_empty() {
            say!("bundles ward's reader refuses, their plugins not benchmarked:")?;
            for u in self.unreadable {
                say!("  {} ({}): {}", u.bundle.display(), u.package, u.reason)?;
            }
        }
        let show = |l: Option<f64>| l.map_or_else(|| "?".to_string(), |l| format!("{l:.2}"));
        say!("load average (1 min) before / after: {} / {}", show(self.load.0), show(self.load.1))?;
        Ok(())
    }

    fn json(&self) -> Result<()> {
        let mpk_reason = (!self.bench.variants.contains(&Variant::Mpk)).then(mpk_unavailable);
        let mut overall: Vec<JsonOverall> = self
            .overall()
            .iter()
            .map(|o| JsonOverall {
                isolation: o.variant.isolation(),
                available: true,
                unavailable_reason: None,
                plugins: o.ratios.len(),
                median_ratio: (!o.ratios.is_empty()).then(|| round(o.median(), 4)),
                p90_ratio: (!o.ratios.is_empty()).then(|| round(o.p90(), 4)),
                target_median_ratio: o.variant.target(),
                target_met: o.met(),
            })
            .collect();
        if let Some(reason) = &mpk_reason {
            overall.push(JsonOverall {
                isolation: "mpk",
                available: false,
                unavailable_reason: Some(reason.clone()),
                plugins: 0,
                median_ratio: None,
                p90_ratio: None,
                target_median_ratio: Some(MPK_TARGET),
                target_met: None,
            });
        }
        let report = JsonReport {
            bench: "lv2",
            note: TIME_NOTE,
            corpus: self.corpus_text(),
            block_frames: BLOCK,
            frames: self.frames_text(),
            runs: self.args.runs,
            cpus: cpus(),
            load_processes: self.finished.processes,
            policy: self.bench.policy.as_ref().map(|p| p.display().to_string()),
            load_before: self.load.0,
            load_after: self.load.1,
            ward_said: self.bench.notes.iter().cloned().collect(),
            plugins: self.measured.iter().map(|m| self.json_plugin(m)).collect(),
            overall,
            no_run_over_twice_its_median: self.outliers().is_empty(),
            failed: self
                .left_out
                .iter()
                .map(|l| JsonFailed {
                    uri: l.plugin.uri.clone(),
                    package: l.plugin.package.clone(),
                    variant: l.variant.key(),
                    reason: l.reason.clone(),
                })
                .collect(),
            unreadable_bundles: self
                .unreadable
                .iter()
                .map(|u| JsonUnreadable {
                    bundle: u.bundle.display().to_string(),
                    package: u.package,
                    reason: u.reason.clone(),
                })
                .collect(),
        };
        let text = serde_json::to_string_pretty(&report).context("cannot encode the results as JSON")?;
        say!("{text}")
    }

    fn json_plugin(&self, m: &Measured) -> JsonPlugin {
        let variants = self
            .bench
            .variants
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let ran = m.failed[i].is_none();
                let s = summarise(&m.seconds[i]);
                let ratio = m.ratio(i).map(|r| round(r, 4));
                JsonVariant {
                    variant: v.key(),
                    isolation: v.isolation(),
                    failed: m.failed[i].clone(),
                    median_s: ran.then_some(s.median),
                    min_s: ran.then_some(s.min),
                    max_s: ran.then_some(s.max),
                    samples_s: m.seconds[i].clone(),
                    ratio,
                    over_twice_median: ran.then_some(s.max > 2.0 * s.median),
                }
            })
            .collect();
        JsonPlugin {
            uri: m.plugin.uri.clone(),
            package: m.plugin.package.clone(),
            frames: m.frames,
            blocks: m.blocks(),
            variants,
        }
    }
}

#[derive(Serialize)]
struct JsonReport {
    bench: &'static str,
    note: &'static str,
    corpus: String,
    block_frames: u32,
    frames: String,
    runs: u32,
    cpus: usize,
    /// Busy processes beside every variant (`--load`).
    load_processes: usize,
    /// The policy file of the `ward run` variants; none for ward's defaults.
    policy: Option<String>,
    load_before: Option<f64>,
    load_after: Option<f64>,
    /// Lines of `ward run` about the machine (a part of the sandbox missing), each once.
    ward_said: Vec<String>,
    plugins: Vec<JsonPlugin>,
    overall: Vec<JsonOverall>,
    no_run_over_twice_its_median: bool,
    /// Plugins left out natively (`variant` "native") or under one ward variant, with the reason.
    failed: Vec<JsonFailed>,
    unreadable_bundles: Vec<JsonUnreadable>,
}

#[derive(Serialize)]
struct JsonPlugin {
    uri: String,
    package: String,
    frames: u32,
    blocks: u32,
    variants: Vec<JsonVariant>,
}

#[derive(Serialize)]
struct JsonVariant {
    variant: &'static str,
    isolation: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    median_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_s: Option<f64>,
    samples_s: Vec<f64>,
    /// Median over native's median.
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    over_twice_median: Option<bool>,
}

#[derive(Serialize)]
struct JsonOverall {
    isolation: &'static str,
    available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    unavailable_reason: Option<String>,
    plugins: usize,
    median_ratio: Option<f64>,
    /// 90th percentile, nearest rank.
    p90_ratio: Option<f64>,
    target_median_ratio: Option<f64>,
    target_met: Option<bool>,
}

#[derive(Serialize)]
struct JsonFailed {
    uri: String,
    package: String,
    variant: &'static str,
    reason: String,
}

#[derive(Serialize)]
struct JsonUnreadable {
    bundle: String,
    package: &'static str,
    reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_named_before_the_last_lines_of_its_backtrace() {
        let stderr = "jalv starting\nthread '<unnamed>' panicked at crates/x/src/y.rs:10:5:\nindex out of bounds\n\
                      stack backtrace:\n   0: f\n   1: g\n  at clone3.S:81:0\nnote: omitted\n\
                      thread caused non-unwinding panic. aborting.\nward: something ward said\n";
        let lines = plugin_lines(stderr);
        assert!(
            lines.starts_with("thread '<unnamed>' panicked at crates/x/src/y.rs:10:5: / index out of bounds / ... / "),
            "{lines}"
        );
        assert!(lines.ends_with("thread caused non-unwinding panic. aborting."), "{lines}");
        assert_eq!(plugin_lines("a\nb\nc\nd\nward: e\n"), "b / c / d");
        let short = "thread 'm' panicked at a.rs:1:1:\nboom\n";
        assert_eq!(plugin_lines(short), "thread 'm' panicked at a.rs:1:1: / boom");
    }

    #[test]
    fn lv2bench_time_is_read_from_its_line_for_the_uri() {
        let uri = "http://plugin.org.uk/swh-plugins/amp";
        assert_eq!(lv2bench_seconds(&format!("0.000194 {uri}\n"), uri), Some(0.000194));
        assert_eq!(lv2bench_seconds(&format!("noise\n1.5 {uri}x\n0.25 {uri}\n"), uri), Some(0.25));
        assert_eq!(lv2bench_seconds("", uri), None);
        assert_eq!(lv2bench_seconds(&format!("nan {uri}\n"), uri), None);
    }

    #[test]
    fn frames_aim_at_the_native_target_within_the_block_bounds() {
        // 1 ms per block: 100 blocks wanted, the minimum is taken.
        assert_eq!(frames_for(0.001 * f64::from(CALIBRATION_BLOCKS)), MIN_BLOCKS * BLOCK);
        // 2^-14 s (61 us) per block: 1638.4 blocks wanted, 1639 run.
        assert_eq!(frames_for(f64::from(CALIBRATION_BLOCKS) / 16384.0), 1639 * BLOCK);
        // Next to nothing, or below lv2bench's resolution: the maximum.
        assert_eq!(frames_for(1e-6), MAX_BLOCKS * BLOCK);
        assert_eq!(frames_for(0.0), MAX_BLOCKS * BLOCK);
    }

    #[test]
    fn the_90th_percentile_is_by_nearest_rank() {
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&ten, 90.0), 9.0);
        assert_eq!(percentile(&[3.0], 90.0), 3.0);
        let eleven: Vec<f64> = (1..=11).rev().map(f64::from).collect();
        assert_eq!(percentile(&eleven, 90.0), 10.0);
        assert!(percentile(&[], 90.0).is_nan());
    }

    #[test]
    fn frames_must_be_whole_blocks() {
        assert_eq!(parse_frames("1024"), Ok(1024));
        assert!(parse_frames("1000").is_err());
        assert!(parse_frames("0").is_err());
        assert!(parse_frames("x").is_err());
    }

    #[test]
    fn a_ward_run_counts_only_under_ward_and_without_reports() {
        let under = "ward: heap blocks of 1 MiB and more come from ward's arena (lent to process domains in place)\n\
                     ward: /usr/lib/lv2/amp-swh.lv2/plugin-linux.so: LV2 plugin under ward (isolation process, \
                     domain process 7)\n\
                     ward: plugin-linux: closed by the host (0 restarts, 0 buffers lent in place)\n";
        assert!(WardSaid::read(under, "process").problem.is_none());
        let problem = WardSaid::read(under, "mpk").problem.unwrap_or_default();
        assert!(problem.contains("did not run under ward with isolation mpk"), "{problem}");
        let fallback = "ward: /x/plugin.so: loaded without ward: no bundle\n";
        let problem = WardSaid::read(fallback, "process").problem.unwrap_or_default();
        assert!(problem.contains("loaded without ward"), "{problem}");
        let fault = format!("{under}ward: plugin-linux: fault: SIGSEGV\n");
        let problem = WardSaid::read(&fault, "process").problem.unwrap_or_default();
        assert!(problem.contains("fault: SIGSEGV"), "{problem}");
        let sandbox = format!("{under}ward: this machine lacks part of the process domains' sandbox: landlock\n");
        let said = WardSaid::read(&sandbox, "process");
        assert!(said.problem.is_none());
        assert_eq!(said.notes.len(), 1);
    }

    #[test]
    fn effects_have_audio_in_and_out() {
        let port = |index, kind, direction| bundle::PortInfo {
            index,
            symbol: format!("p{index}"),
            name: None,
            direction,
            kind,
            connection_optional: false,
            minimum_size: None,
            supports: Vec::new(),
            default: None,
            minimum: None,
            maximum: None,
        };
        let mut plugin = PluginInfo {
            uri: "urn:x".into(),
            bundle: PathBuf::from("/b"),
            binary: PathBuf::from("/b/x.so"),
            name: None,
            types: Vec::new(),
            ports: vec![
                port(0, PortKind::Atom { sequence: true }, Direction::Input),
                port(1, PortKind::Audio, Direction::Output),
            ],
            required_features: Vec::new(),
            optional_features: Vec::new(),
            extension_data: Vec::new(),
        };
        assert!(!is_effect(&plugin), "an instrument: MIDI in, audio out");
        plugin.ports.push(port(2, PortKind::Audio, Direction::Input));
        assert!(is_effect(&plugin));
    }
}
