//! `ward bench sox`, `ward bench ffmpeg` and `ward bench scan`: unmodified hosts timed natively and under
//! `ward run`, side by side. `scan` times hosts that open every LADSPA library they find before working: Debian's
//! `listplugins`, and a test host that scans then processes one second of audio through one plugin
//! (`hosts/scan_host.c`, built with the system's C compiler).
//!
//! Each variant runs the same host command: plain (native), then through `ward run --isolation none`,
//! `ward run --isolation process` and, where the machine has protection keys, `ward run --isolation mpk` (the
//! `ward` being this program). Without `--policy` two more variants run `ward run --isolation process`: one with
//! every plugin of the host in one domain that spins longer before sleeping (`[defaults] group = "host"`,
//! `spin = 100000`), the configuration DECISIONS.md offers for speed, and one with the sandbox turned off
//! (`crate::bench::SANDBOX_OFF_POLICY`): the default process variant against it is what the sandbox costs. The
//! variants are interleaved run by run, so drift on a shared machine hits all of them alike. `--load N` starts N
//! processes of busy work (`ward __busy`) before the first variant and stops them after the last, so that every
//! variant, native included, runs on a machine that is not idle. One untimed round comes first: it warms the page
//! cache and the plugins' files, and its outputs are compared with native's (sox's output files byte for byte; for
//! ffmpeg, which discards its frames in the timed runs, a checksum of every output frame). Each time is the wall
//! time of `Command::status()`; the table gives the median, the minimum and the maximum of the timed runs of each
//! variant and the ratio of its median to native's median.

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::load::Load;
use crate::output::{say, Columns};
use crate::run::BadInput;

/// What every host benchmark takes.
#[derive(Args)]
pub struct HostArgs {
    /// Timed runs of each variant (after one untimed check run).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    runs: u32,
    /// One JSON document instead of a table.
    #[arg(long)]
    json: bool,
    /// Policy file (TOML) for the `ward run` variants, as `ward run --policy` takes it; ward's defaults without one.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Run with this many processes of busy work beside every variant, native included (started and stopped by the
    /// benchmark), so that the ratios compare like with like on a machine that is not idle.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    load: u32,
}

pub type SoxArgs = HostArgs;
pub type ScanArgs = HostArgs;

#[derive(Args)]
pub struct FfmpegArgs {
    #[command(flatten)]
    host: HostArgs,
    /// The frei0r filter, as ffmpeg's `frei0r=` takes it: NAME or NAME:PARAMS. invert0r (next to no work per pixel:
    /// the worst case for the boundary's share) is measured too.
    #[arg(long, default_value = "vignette")]
    filter: String,
}

/// Where Debian installs the plugins (swh-plugins, ladspa-sdk, frei0r-plugins).
const LADSPA_DIR: &str = "/usr/lib/ladspa";
const FREI0R_DIRS: &[&str] = &["/usr/lib/frei0r-1", "/usr/local/lib/frei0r-1"];

/// The sox chain: five real effects, each with a value for every control port, control outputs included (sox's
/// `ladspa` effect asks for those too). `-r` runs a mono plugin once per channel.
const SOX_CHAIN: &[(&str, &str, bool, &str, &str)] = &[
    // (file, label, one instance per channel, arguments, what it does)
    ("amp_1181.so", "amp", true, "-3", "amp: gain -3 dB"),
    ("svf_1214.so", "svf", true, "2 80 0.3 0", "state-variable filter: high-pass 80 Hz"),
    ("delay.so", "delay_5s", true, "0.25 0.3", "delay line: 250 ms, 30% wet"),
    ("sc4_1882.so", "sc4", false, "0 20 200 -18 4 6 6 0 0", "SC4 stereo compressor: -18 dB, 4:1, +6 dB makeup"),
    (
        "triple_para_1204.so",
        "triplePara",
        true,
        "3 100 0.5 -2 400 1 2 3000 1 -4 8000 0.5 1 12000 0.5",
        "triple-band parametric EQ with shelves",
    ),
];

/// The ratios to native the process variants should stay under (issue 30), on an idle machine and with one CPU busy.
#[derive(Debug, Clone, Copy)]
struct Targets {
    /// One process domain per plugin library (ward's default policy).
    process: f64,
    /// Every plugin of the host in one domain.
    grouped: f64,
}

impl Targets {
    fn sox(loaded: bool) -> Targets {
        if loaded {
            Targets { process: 1.35, grouped: 1.30 }
        } else {
            Targets { process: 1.15, grouped: 1.10 }
        }
    }

    fn ffmpeg(loaded: bool) -> Targets {
        let t = if loaded { 1.30 } else { 1.15 };
        Targets { process: t, grouped: t }
    }

    /// A scanning host's short job.
    fn scan() -> Targets {
        Targets { process: 1.30, grouped: 1.30 }
    }
}
/// The scanning test host, and the LADSPA declarations it is built with.
const SCAN_HOST_SOURCE: &str = include_str!("../hosts/scan_host.c");
const LADSPA_ABI_HEADER: &str = include_str!("../../../include/ward_ladspa_abi.h");
/// The plugin the scanning test host processes with, after its scan.
const SCAN_PLUGIN: (&str, &str) = ("amp.so", "amp_mono");
const MPK_TARGET: f64 = 1.05;
/// What the worst case of pure overhead is measured with.
const WORST_CASE_FILTER: &str = "invert0r";

/// The video: 300 frames of 1920x1080 at 25 frames per second.
const WIDTH: u64 = 1920;
const HEIGHT: u64 = 1080;
const FRAMES: u64 = 300;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Native,
    WardNone,
    WardProcess,
    /// Process domains, every plugin of the host in one (see [`GROUPED_POLICY`]).
    WardGrouped,
    /// Process domains with every part of the sandbox that can be turned off turned off (see
    /// [`crate::bench::SANDBOX_OFF_POLICY`]): what the sandbox costs is the default variant against this one.
    WardUnsandboxed,
    WardMpk,
}

/// The policy of the grouped variant: one domain for all the host's plugins, awake between calls.
const GROUPED_POLICY: &str = "[defaults]\ngroup = \"host\"\nspin = 100000\n";

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Native => "native",
            Variant::WardNone | Variant::WardProcess | Variant::WardMpk => "ward run",
            Variant::WardGrouped => "ward run, grouped",
            Variant::WardUnsandboxed => "ward run, no sandbox",
        }
    }

    fn isolation(self) -> &'static str {
        match self {
            Variant::Native => "-",
            Variant::WardNone => "none",
            Variant::WardProcess | Variant::WardGrouped | Variant::WardUnsandboxed => "process",
            Variant::WardMpk => "mpk",
        }
    }

    /// Short, for file names and progress lines.
    fn key(self) -> &'static str {
        match self {
            Variant::Native => "native",
            Variant::WardNone => "none",
            Variant::WardProcess => "process",
            Variant::WardGrouped => "process-grouped",
            Variant::WardUnsandboxed => "process-unsandboxed",
            Variant::WardMpk => "mpk",
        }
    }

    /// The ratio to native this variant should stay under, if it has a target.
    fn target(self, case: &Case) -> Option<f64> {
        match self {
            Variant::WardProcess => Some(case.target.process),
            Variant::WardGrouped => Some(case.target.grouped),
            Variant::WardMpk => Some(MPK_TARGET),
            Variant::Native | Variant::WardNone | Variant::WardUnsandboxed => None,
        }
    }
}

/// This program, and how its `ward run` variants run.
struct Ward {
    exe: PathBuf,
    policy: Option<PathBuf>,
    /// The grouped variant's policy file, when the user gave no policy of their own.
    grouped: Option<PathBuf>,
    /// The unsandboxed variant's policy file, when the user gave no policy of their own.
    unsandboxed: Option<PathBuf>,
}

impl Ward {
    /// `dir`: where the grouped variant's policy file goes.
    fn new(policy: Option<&Path>, dir: &Path) -> Result<Ward> {
        let exe = std::env::current_exe().context("cannot find the running ward program")?;
        if let Some(p) = policy {
            // Read once here, so that a mistake in it is bad input before anything is timed.
            ward::Policy::from_file(p)?;
            let policy = Some(std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()));
            return Ok(Ward { exe, policy, grouped: None, unsandboxed: None });
        }
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        };
        let grouped = Some(write("grouped.toml", GROUPED_POLICY)?);
        let unsandboxed = Some(write("unsandboxed.toml", crate::bench::SANDBOX_OFF_POLICY)?);
        Ok(Ward { exe, policy: None, grouped, unsandboxed })
    }

    /// The variants to run: the grouped one without a user policy, mpk only where the machine has protection keys.
    fn variants(&self) -> Vec<Variant> {
        let mut v = vec![Variant::Native, Variant::WardNone, Variant::WardProcess];
        if self.grouped.is_some() {
            v.push(Variant::WardGrouped);
        }
        if self.unsandboxed.is_some() {
            v.push(Variant::WardUnsandboxed);
        }
        if ward::mpk_available() {
            v.push(Variant::WardMpk);
        }
        v
    }

    fn policy_text(&self) -> String {
        self.policy.as_ref().map_or_else(|| "ward's defaults".to_string(), |p| p.display().to_string())
    }
}

/// A case's host arguments, given the file the variant may write its output to and whether this is the check run.
type ArgsFn = Box<dyn Fn(&Path, bool) -> Vec<OsString>>;

/// One host command to time.
struct Case {
    /// What this case is called in the table and the JSON ("sox", "vignette").
    name: String,
    program: PathBuf,
    args: ArgsFn,
    /// Extension of the check run's output file.
    ext: &'static str,
    /// What the check run's outputs are, for the report.
    compared: &'static str,
    target: Targets,
    /// Environment the host runs with, every variant alike.
    env: Vec<(&'static str, OsString)>,
    /// The check run's output is what the host writes to its standard output (else a file it is given).
    output_is_stdout: bool,
}

/// Wall seconds of the timed runs of each variant, in `variants` order.
struct Timings {
    variants: Vec<Variant>,
    seconds: Vec<Vec<f64>>,
    identical: bool,
    /// Which ward variants' output differed from native's.
    differing: Vec<&'static str>,
    /// The 1-minute load average before the check run and after the last timed run: this machine is shared.
    load: (Option<f64>, Option<f64>),
}

#[derive(Serialize)]
struct JsonReport {
    bench: &'static str,
    note: &'static str,
    runs: u32,
    cpus: usize,
    /// Busy processes beside every variant (`--load`).
    load_processes: usize,
    /// The policy file of the `ward run` variants; none for ward's defaults.
    policy: Option<String>,
    workload: String,
    cases: Vec<JsonCase>,
}

#[derive(Serialize)]
struct JsonCase {
    name: String,
    command: String,
    outputs_identical: bool,
    /// What the check run compared.
    compared: &'static str,
    /// The 1-minute load average before the first and after the last run of the case.
    load_before: Option<f64>,
    load_after: Option<f64>,
    variants: Vec<JsonVariant>,
    /// The default process variant's median over the unsandboxed one's, when both ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox_cost: Option<f64>,
}

#[derive(Serialize)]
struct JsonVariant {
    variant: &'static str,
    isolation: &'static str,
    available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    unavailable_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    median_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_s: Option<f64>,
    /// Median over native's median.
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    samples_s: Vec<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target_met: Option<bool>,
}

pub fn sox(args: SoxArgs) -> Result<bool> {
    catch_interrupts();
    let sox = need_program("sox")?;
    for (file, ..) in SOX_CHAIN {
        let p = Path::new(LADSPA_DIR).join(file);
        if !p.is_file() {
            return Err(anyhow!(BadInput(format!(
                "the LADSPA plugin {} is missing (packages swh-plugins, ladspa-sdk); run scripts/deps",
                p.display()
            ))));
        }
    }
    let tmp = TempDir::new("ward-bench-sox")?;
    let ward = Ward::new(args.policy.as_deref(), tmp.path())?;
    let input = tmp.path().join("in.wav");
    progress("sox: making 60 s of 48 kHz stereo 16-bit audio (two sines and pink noise, fixed seed)");
    let made = Command::new(&sox)
        .args(["-D", "-R", "-r", "48000", "-c", "2", "-b", "16", "-n"])
        .arg(&input)
        .args("synth 60 sine 440 sine 660 synth pinknoise mix vol 0.4".split(' '))
        .stdin(Stdio::null())
        .status()
        .context("cannot run sox")?;
    check_interrupted()?;
    if !made.success() {
        bail!("sox could not make the test audio ({made})");
    }

    let chain: Vec<OsString> = SOX_CHAIN
        .iter()
        .flat_map(|(file, label, per_channel, values, _)| {
            let mut a: Vec<OsString> = vec!["ladspa".into()];
            if *per_channel {
                a.push("-r".into());
            }
            a.push(Path::new(LADSPA_DIR).join(file).into_os_string());
            a.push((*label).into());
            a.extend(values.split(' ').map(OsString::from));
            a
        })
        .collect();
    let input_arg = input.clone().into_os_string();
    let case = Case {
        name: "sox".into(),
        program: sox,
        args: Box::new(move |out, _check| {
            let mut a: Vec<OsString> = vec!["-D".into(), input_arg.clone(), out.as_os_str().to_owned()];
            a.extend(chain.iter().cloned());
            a
        }),
        ext: "wav",
        compared: "the output files, byte for byte",
        target: Targets::sox(args.load > 0),
        env: Vec::new(),
        output_is_stdout: false,
    };
    let load = Load::start(args.load)?;
    let timings = measure(&case, &ward, tmp.path(), args.runs)?;
    let load = Finished::from(load);
    let workload = "60 s of 48 kHz stereo 16-bit WAV (sine 440 Hz left, 660 Hz right, pink noise, seed fixed by -R)";
    if args.json {
        let cases = [(&case, &timings, command_text(&case, tmp.path()))];
        return print_json("sox", args.runs, &ward, load, workload, &cases);
    }
    say!(
        "ward bench sox: {} timed runs of each variant, interleaved, after one untimed check run; {} CPUs",
        args.runs,
        cpus()
    )?;
    say!("workload: {workload}")?;
    load.say()?;
    say!("policy of the ward run variants: {}", ward.policy_text())?;
    say!("command: sox -D in.wav out.wav, then five LADSPA effects (sox's ladspa effect):")?;
    for (file, label, per_channel, values, what) in SOX_CHAIN {
        say!("  ladspa {}{LADSPA_DIR}/{file} {label} {values}    ({what})", if *per_channel { "-r " } else { "" })?;
    }
    say!("")?;
    print_table(&case, &timings)?;
    Ok(true)
}

pub fn ffmpeg(args: FfmpegArgs) -> Result<bool> {
    let FfmpegArgs { host, filter } = args;
    catch_interrupts();
    let ffmpeg = need_program("ffmpeg")?;
    let mut filters = vec![filter.clone()];
    if plugin_name(&filter) != WORST_CASE_FILTER {
        filters.push(WORST_CASE_FILTER.to_string());
    }
    for f in &filters {
        let name = plugin_name(f);
        if name.is_empty()
            || name.contains('/')
            || !FREI0R_DIRS.iter().any(|d| Path::new(d).join(format!("{name}.so")).is_file())
        {
            return Err(anyhow!(BadInput(format!(
                "no frei0r filter {name:?} in {} (package frei0r-plugins; run scripts/deps)",
                FREI0R_DIRS.join(" or ")
            ))));
        }
    }
    let tmp = TempDir::new("ward-bench-ffmpeg")?;
    let ward = Ward::new(host.policy.as_deref(), tmp.path())?;
    let input = tmp.path().join("in.rgba");
    let size = format!("{WIDTH}x{HEIGHT}");
    progress(&format!(
        "ffmpeg: making {FRAMES} frames of {size} raw RGBA video (testsrc2, {:.1} GB) so that decoding is a plain read",
        (WIDTH * HEIGHT * 4 * FRAMES) as f64 / 1e9
    ));
    let made = Command::new(&ffmpeg)
        .args(["-nostdin", "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i"])
        .arg(format!("testsrc2=size={size}:rate=25:duration={}", FRAMES / 25))
        .args(["-pix_fmt", "rgba", "-f", "rawvideo", "-y"])
        .arg(&input)
        .stdin(Stdio::null())
        .status()
        .context("cannot run ffmpeg")?;
    check_interrupted()?;
    let len = std::fs::metadata(&input).map(|m| m.len()).unwrap_or(0);
    if !made.success() || len != WIDTH * HEIGHT * 4 * FRAMES {
        bail!("ffmpeg could not make the test video ({made}, {len} bytes)");
    }

    let cases: Vec<Case> = filters
        .iter()
        .map(|filter| {
            let input = input.clone().into_os_string();
            let size = size.clone();
            let filter = filter.clone();
            Case {
                name: filter.clone(),
                program: ffmpeg.clone(),
                args: Box::new(move |out, check| {
                    let mut a: Vec<OsString> = ["-nostdin", "-hide_banner", "-loglevel", "error"]
                        .into_iter()
                        .chain(["-f", "rawvideo", "-pix_fmt", "rgba", "-s", &size, "-r", "25", "-i"])
                        .map(OsString::from)
                        .collect();
                    a.push(input.clone());
                    a.push("-vf".into());
                    a.push(format!("frei0r={filter}").into());
                    // The check run writes an Adler-32 of every output frame (MD5 of 2.5 GB would take longer than the
                    // filtering); the timed runs throw the frames away.
                    if check {
                        a.extend(["-f", "framecrc", "-y"].map(OsString::from));
                        a.push(out.as_os_str().to_owned());
                    } else {
                        a.extend(["-f", "null", "-"].map(OsString::from));
                    }
                    a
                }),
                ext: "framecrc",
                compared: "the Adler-32 of every output frame (ffmpeg -f framecrc)",
                target: Targets::ffmpeg(host.load > 0),
                env: Vec::new(),
                output_is_stdout: false,
            }
        })
        .collect();
    let workload = format!(
        "{FRAMES} frames of {size} RGBA (testsrc2, made once, read raw), one frei0r filter each, output -f null"
    );
    let page = Page {
        name: "ffmpeg",
        workload: &workload,
        notes: &["ffmpeg's own threading left at its defaults (its frei0r filter runs on one thread)"],
        command_prefix: "",
    };
    measure_cases(&page, &cases, &ward, tmp.path(), host.runs, host.load, host.json)
}

pub fn scan(args: ScanArgs) -> Result<bool> {
    catch_interrupts();
    let listplugins = need_program("listplugins")?;
    let plugin = Path::new(LADSPA_DIR).join(SCAN_PLUGIN.0);
    if !plugin.is_file() {
        return Err(anyhow!(BadInput(format!(
            "the LADSPA plugin {} is missing (package ladspa-sdk); run scripts/deps",
            plugin.display()
        ))));
    }
    let libraries = std::fs::read_dir(LADSPA_DIR)
        .with_context(|| format!("cannot read {LADSPA_DIR}"))?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "so"))
        .count();
    let tmp = TempDir::new("ward-bench-scan")?;
    let ward = Ward::new(args.policy.as_deref(), tmp.path())?;
    progress("scan: building the scanning test host with cc");
    let host = build_scan_host(tmp.path())?;
    let ladspa_path = vec![("LADSPA_PATH", OsString::from(LADSPA_DIR))];
    let cases = [
        Case {
            name: "listplugins".into(),
            program: listplugins,
            args: Box::new(|_, _| Vec::new()),
            ext: "txt",
            compared: "the listing on standard output",
            target: Targets::scan(),
            env: ladspa_path.clone(),
            output_is_stdout: true,
        },
        Case {
            name: "scan then process".into(),
            program: host,
            args: Box::new(move |out, _| {
                vec![
                    LADSPA_DIR.into(),
                    plugin.clone().into_os_string(),
                    SCAN_PLUGIN.1.into(),
                    out.as_os_str().to_owned(),
                ]
            }),
            ext: "raw",
            compared: "the processed samples, byte for byte",
            target: Targets::scan(),
            env: ladspa_path,
            output_is_stdout: false,
        },
    ];
    let workload = format!(
        "every LADSPA library in {LADSPA_DIR} ({libraries}) opened and described; the test host then runs one second \
         of 48 kHz audio through {} {}",
        SCAN_PLUGIN.0, SCAN_PLUGIN.1
    );
    let prefix = format!("LADSPA_PATH={LADSPA_DIR} ");
    let page = Page { name: "scan", workload: &workload, notes: &[], command_prefix: &prefix };
    measure_cases(&page, &cases, &ward, tmp.path(), args.runs, args.load, args.json)
}

/// What a benchmark of several cases says around its tables.
struct Page<'a> {
    /// `ward bench NAME`.
    name: &'static str,
    workload: &'a str,
    /// Lines after the policy's.
    notes: &'a [&'a str],
    /// Before each case's command (the environment it runs with).
    command_prefix: &'a str,
}

/// Measure every case under the load asked for, then print the tables (or the JSON) of `ward bench NAME`.
fn measure_cases(
    page: &Page<'_>,
    cases: &[Case],
    ward: &Ward,
    tmp: &Path,
    runs: u32,
    load: u32,
    json: bool,
) -> Result<bool> {
    let mut measured = Vec::new();
    let load = Load::start(load)?;
    for case in cases {
        measured.push(measure(case, ward, tmp, runs)?);
    }
    let load = Finished::from(load);
    if json {
        let list: Vec<_> = cases.iter().zip(&measured).map(|(c, t)| (c, t, command_text(c, tmp))).collect();
        return print_json(page.name, runs, ward, load, page.workload, &list);
    }
    say!(
        "ward bench {}: {} timed runs of each variant, interleaved, after one untimed check run; {} CPUs",
        page.name,
        runs,
        cpus()
    )?;
    say!("workload: {}", page.workload)?;
    load.say()?;
    say!("policy of the ward run variants: {}", ward.policy_text())?;
    for note in page.notes {
        say!("{note}")?;
    }
    for (case, t) in cases.iter().zip(&measured) {
        say!("")?;
        say!("command: {}{}", page.command_prefix, command_text(case, tmp))?;
        print_table(case, t)?;
    }
    Ok(true)
}

/// The scanning test host, compiled into `dir`.
fn build_scan_host(dir: &Path) -> Result<PathBuf> {
    let source = dir.join("scan_host.c");
    std::fs::write(&source, SCAN_HOST_SOURCE).with_context(|| format!("cannot write {}", source.display()))?;
    let header = dir.join("ward_ladspa_abi.h");
    std::fs::write(&header, LADSPA_ABI_HEADER).with_context(|| format!("cannot write {}", header.display()))?;
    let exe = dir.join("scan_host");
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(dir)
        .arg(&source)
        .args(["-ldl", "-lm"])
        .stdin(Stdio::null())
        .status()
        .map_err(|e| anyhow!(BadInput(format!("cannot run the C compiler cc, which builds the test host: {e}"))))?;
    check_interrupted()?;
    if !status.success() {
        bail!("cc could not build the scanning test host ({status})");
    }
    Ok(exe)
}

/// The `--load` of a finished measurement: its busy processes stopped, how many there were kept for the report.
pub(crate) struct Finished {
    pub(crate) processes: usize,
    text: Option<String>,
}

impl From<Load> for Finished {
    fn from(load: Load) -> Finished {
        // Dropping `load` stops its processes before anything is printed.
        Finished { processes: load.processes(), text: load.describe() }
    }
}

impl Finished {
    pub(crate) fn say(&self) -> Result<()> {
        if let Some(text) = &self.text {
            say!("{text}")?;
        }
        Ok(())
    }
}

/// The plugin's name in a `frei0r=` argument: what comes before the first `:`.
fn plugin_name(filter: &str) -> &str {
    filter.split(':').next().unwrap_or("")
}

/// The 1-minute load average, from /proc/loadavg.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

pub(crate) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

pub(crate) fn progress(text: &str) {
    eprintln!("bench {text}");
}

/// `program` in PATH, or bad input that says how to install it.
pub(crate) fn need_program(program: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file()))
        .ok_or_else(|| anyhow!(BadInput(format!("{program} is not installed (not found in PATH); run scripts/deps"))))
}

/// The host command as it is timed, for the report, with files of the temporary directory by their names only.
fn command_text(case: &Case, dir: &Path) -> String {
    let out = dir.join(format!("out.{}", case.ext));
    let mut text = case.program.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    for a in (case.args)(&out, false) {
        let p = Path::new(&a);
        let shown = match p.strip_prefix(dir) {
            Ok(rest) => rest.as_os_str().to_string_lossy(),
            Err(_) => a.to_string_lossy(),
        };
        text.push(' ');
        text.push_str(&shown);
    }
    text
}

/// The check run, then `runs` interleaved timed runs of every variant.
fn measure(case: &Case, ward: &Ward, dir: &Path, runs: u32) -> Result<Timings> {
    let load_before = load_average();
    let out_of = |v: Variant| dir.join(format!("out-{}-{}.{}", case_slug(&case.name), v.key(), case.ext));
    let variants = ward.variants();
    for &v in &variants {
        let secs = run_once(case, ward, v, &out_of(v), true, dir)?;
        progress(&format!("{}: check run, {:<7} {secs:.2} s", case.name, v.key()));
    }
    let native = std::fs::read(out_of(Variant::Native))
        .with_context(|| format!("{}: the native check run wrote no output", case.name))?;
    let mut differing = Vec::new();
    for &v in variants.iter().filter(|&&v| v != Variant::Native) {
        let out = std::fs::read(out_of(v)).unwrap_or_default();
        if out != native {
            differing.push(v.key());
        }
    }
    let mut seconds: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 1..=runs {
        let mut line = format!("{}: run {round}/{runs}:", case.name);
        for (i, &v) in variants.iter().enumerate() {
            let secs = run_once(case, ward, v, &out_of(v), false, dir)?;
            seconds[i].push(secs);
            line.push_str(&format!(" {} {secs:.2} s", v.key()));
        }
        progress(&line);
    }
    Ok(Timings { variants, seconds, identical: differing.is_empty(), differing, load: (load_before, load_average()) })
}

fn case_slug(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// One run of the host as `variant`; its wall time in seconds. A failed run, or ward reporting a fault, is an error:
/// a recovery would be timed instead of the plugins.
fn run_once(case: &Case, ward: &Ward, variant: Variant, out: &Path, check: bool, dir: &Path) -> Result<f64> {
    let args = (case.args)(out, check);
    let mut cmd = match variant {
        Variant::Native => Command::new(&case.program),
        Variant::WardNone
        | Variant::WardProcess
        | Variant::WardGrouped
        | Variant::WardUnsandboxed
        | Variant::WardMpk => {
            let mut c = Command::new(&ward.exe);
            c.args(["run", "--isolation", variant.isolation()]);
            let policy = match variant {
                Variant::WardGrouped => ward.grouped.as_ref(),
                Variant::WardUnsandboxed => ward.unsandboxed.as_ref(),
                _ => ward.policy.as_ref(),
            };
            if let Some(policy) = policy {
                c.arg("--policy").arg(policy);
            }
            c.arg("--").arg(&case.program);
            c
        }
    };
    cmd.args(&args).envs(case.env.iter().map(|(k, v)| (k, v)));
    let stdout = if check && case.output_is_stdout {
        Stdio::from(File::create(out).with_context(|| format!("cannot create {}", out.display()))?)
    } else {
        Stdio::null()
    };
    let err_path = dir.join(format!("stderr-{}.txt", variant.key()));
    let err = File::create(&err_path).with_context(|| format!("cannot create {}", err_path.display()))?;
    cmd.stdin(Stdio::null()).stdout(stdout).stderr(err);
    let t = Instant::now();
    let status = cmd.status().with_context(|| format!("cannot run {}", case.program.display()))?;
    let secs = t.elapsed().as_secs_f64();
    check_interrupted()?;
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let what = format!("{} ({} {})", case.name, variant.name(), variant.isolation());
    if !status.success() {
        bail!("{what} failed ({status}):\n{}", tail(&stderr, 20));
    }
    if variant != Variant::Native && stderr.lines().any(|l| l.starts_with("ward: ")) {
        bail!("{what}: ward reported faults, so the plugins do not run cleanly under ward:\n{}", tail(&stderr, 20));
    }
    Ok(secs)
}

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub(crate) struct Summary {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

pub(crate) fn summarise(v: &[f64]) -> Summary {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    };
    Summary { median, min: s.first().copied().unwrap_or(f64::NAN), max: s.last().copied().unwrap_or(f64::NAN) }
}

/// What the sandbox may cost a host, as the default process variant's median over the unsandboxed one's.
const SANDBOX_TARGET: f64 = 1.02;

/// The default process variant's median over the unsandboxed one's, when both ran.
fn sandbox_cost(t: &Timings) -> Option<f64> {
    let median_of = |want: Variant| {
        let i = t.variants.iter().position(|&v| v == want)?;
        Some(summarise(&t.seconds[i]).median)
    };
    Some(median_of(Variant::WardProcess)? / median_of(Variant::WardUnsandboxed)?)
}

/// Why there is no mpk line.
fn mpk_unavailable() -> String {
    "unavailable: no PKU on this machine".into()
}

fn print_table(case: &Case, t: &Timings) -> Result<()> {
    let cols = Columns::new(&[20, 9, 9, 9, 9, 7]);
    say!("{}", cols.row(&["variant", "isolation", "median", "min", "max", "ratio", "target"]))?;
    let native = summarise(&t.seconds[0]).median;
    for (i, &v) in t.variants.iter().enumerate() {
        let s = summarise(&t.seconds[i]);
        let ratio = s.median / native;
        let target = match v.target(case) {
            Some(target) => format!("<= {target:.2}x: {}", if ratio <= target { "met" } else { "MISSED" }),
            None => String::new(),
        };
        say!(
            "{}",
            cols.row(&[
                v.name(),
                v.isolation(),
                &format!("{:.3} s", s.median),
                &format!("{:.3} s", s.min),
                &format!("{:.3} s", s.max),
                &format!("{ratio:.3}x"),
                &target,
            ])
        )?;
    }
    if !t.variants.contains(&Variant::WardMpk) {
        say!("{}", cols.row(&["ward run", "mpk", &format!("{}; target <= {MPK_TARGET:.2}x", mpk_unavailable())]))?;
    }
    // Issue 30: no single run of a variant with a target more than twice its median.
    let outliers: Vec<&str> = t
        .variants
        .iter()
        .enumerate()
        .filter(|&(i, &v)| {
            v.target(case).is_some() && {
                let s = summarise(&t.seconds[i]);
                s.max > 2.0 * s.median
            }
        })
        .map(|(_, &v)| v.key())
        .collect();
    say!(
        "no run over twice its median: {}",
        if outliers.is_empty() { "met".to_string() } else { format!("MISSED ({})", outliers.join(", ")) }
    )?;
    if let Some(cost) = sandbox_cost(t) {
        say!(
            "sandbox cost: process against process without sandbox {cost:.3}x (target <= {SANDBOX_TARGET:.2}x: {})",
            if cost <= SANDBOX_TARGET { "met" } else { "MISSED" }
        )?;
    }
    if t.identical {
        let kinds: Vec<&str> = t.variants.iter().filter(|&&v| v != Variant::Native).map(|&v| Variant::key(v)).collect();
        say!("outputs identical: yes (ward run {} against native: {})", kinds.join(", "), case.compared)?;
    } else {
        say!("outputs identical: no (differing from native: {})", t.differing.join(", "))?;
    }
    let show = |l: Option<f64>| l.map_or_else(|| "?".to_string(), |l| format!("{l:.2}"));
    say!("load average (1 min) before / after: {} / {}", show(t.load.0), show(t.load.1))?;
    Ok(())
}

fn print_json(
    bench: &'static str,
    runs: u32,
    ward: &Ward,
    load: Finished,
    workload: &str,
    cases: &[(&Case, &Timings, String)],
) -> Result<bool> {
    let report = JsonReport {
        bench,
        note: "wall seconds per run of the whole host; ratio = median / native median",
        runs,
        cpus: cpus(),
        load_processes: load.processes,
        policy: ward.policy.as_ref().map(|p| p.display().to_string()),
        workload: workload.to_string(),
        cases: cases
            .iter()
            .map(|(case, t, command)| {
                let native = summarise(&t.seconds[0]).median;
                let mut rows: Vec<JsonVariant> = t
                    .variants
                    .iter()
                    .copied()
                    .enumerate()
                    .map(|(i, v)| {
                        let s = summarise(&t.seconds[i]);
                        let ratio = round(s.median / native, 4);
                        let target = v.target(case);
                        JsonVariant {
                            variant: v.key(),
                            isolation: v.isolation(),
                            available: true,
                            unavailable_reason: None,
                            median_s: Some(round(s.median, 4)),
                            min_s: Some(round(s.min, 4)),
                            max_s: Some(round(s.max, 4)),
                            ratio: Some(ratio),
                            samples_s: t.seconds[i].iter().map(|&x| round(x, 4)).collect(),
                            target_ratio: target,
                            target_met: target.map(|r| ratio <= r),
                        }
                    })
                    .collect();
                if !t.variants.contains(&Variant::WardMpk) {
                    rows.push(JsonVariant {
                        variant: "mpk",
                        isolation: "mpk",
                        available: false,
                        unavailable_reason: Some(mpk_unavailable()),
                        median_s: None,
                        min_s: None,
                        max_s: None,
                        ratio: None,
                        samples_s: Vec::new(),
                        target_ratio: Some(MPK_TARGET),
                        target_met: None,
                    });
                }
                JsonCase {
                    name: case.name.clone(),
                    command: command.clone(),
                    outputs_identical: t.identical,
                    compared: case.compared,
                    load_before: t.load.0,
                    load_after: t.load.1,
                    variants: rows,
                    sandbox_cost: sandbox_cost(t).map(|c| round(c, 4)),
                }
            })
            .collect(),
    };
    let text = serde_json::to_string_pretty(&report).context("cannot encode the results as JSON")?;
    say!("{text}")?;
    Ok(true)
}

pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C stops the host being timed (it gets the signal too) and then the benchmark, which removes its temporary
/// directory (gigabytes of video for ffmpeg) on the way out instead of dying with it in place.
pub(crate) fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe; the hosts started later get the
        // default disposition back when they exec.
        unsafe { libc::signal(signal, on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

pub(crate) fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// A directory of this process's own under the system's temporary directory, removed when dropped.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(prefix: &str) -> Result<TempDir> {
        let base = std::env::temp_dir();
        for attempt in 0..100u32 {
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
            let p = base.join(format!("{prefix}-{}-{nanos}-{attempt}", std::process::id()));
            match std::fs::create_dir(&p) {
                Ok(()) => return Ok(TempDir(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("cannot create {}", p.display())),
            }
        }
        bail!("cannot create a temporary directory under {}", base.display())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        let s = summarise(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(summarise(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert!(summarise(&[]).median.is_nan());
    }

    #[test]
    fn plugin_names_drop_parameters() {
        assert_eq!(plugin_name("vignette"), "vignette");
        assert_eq!(plugin_name("vignette:0.5|0.2|0.1"), "vignette");
        assert_eq!(plugin_name(""), "");
    }

    #[test]
    fn command_text_names_temporary_files_by_name() {
        let dir = Path::new("/tmp/ward-bench-x");
        let input = dir.join("in.wav").into_os_string();
        let case = Case {
            name: "sox".into(),
            program: PathBuf::from("/usr/bin/sox"),
            args: Box::new(move |out, _| vec!["-D".into(), input.clone(), out.as_os_str().to_owned(), "amp".into()]),
            ext: "wav",
            compared: "",
            target: Targets::sox(false),
            env: Vec::new(),
            output_is_stdout: false,
        };
        assert_eq!(command_text(&case, dir), "sox -D in.wav out.wav amp");
    }

    #[test]
    fn the_sox_chain_has_five_plugins() {
        assert_eq!(SOX_CHAIN.len(), 5);
    }
}
