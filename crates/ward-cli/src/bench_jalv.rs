//! `ward bench jalv`: jalv, a real-time LV2 host, in a JACK server with the dummy backend at 48 kHz and 128-frame
//! periods, with one heavy plugin, natively and under `ward run` (issue 31's second benchmark): the CPU time per
//! period of the host (and of its domain's processes under ward), and the xruns JACK counted.
//!
//! Each run of each side gets a JACK server of its own (`jackd -n NAME -d dummy -r 48000 -p 128`), under a private
//! name (`ward-bench-jalv-PID-N`), so that it never meets a user's server and every count belongs to one run; clients
//! find it by `JACK_DEFAULT_SERVER` and are forbidden to start one of their own (`JACK_NO_START_SERVER`). Readiness
//! is polled, never slept for: the server is up when `jack_lsp` connects to it, jalv when its ports are listed. Then
//! the run settles for [`SETTLE`] (jalv's activation and the plugin's first periods are not measured) and the
//! measured window of `--seconds` begins:
//!
//! - **CPU** is `utime + stime + cutime + cstime` from `/proc/PID/stat` of jalv and every process beneath it (under
//!   ward its domain's processes, which are its children; the `c` fields keep the time of those that exited and were
//!   reaped), summed at both ends of the window; the difference is divided by the periods the window lasted (its
//!   wall time times 48000 / 128: the dummy driver wakes on the clock, once a period).
//! - **xruns** are the lines jackd writes to its standard error within the window: `JackEngine::XRun` (a client
//!   did not finish its period: what ward could cause) and `JackTimedDriver::Process XRun` (the dummy driver itself
//!   woke late: the machine's scheduling). jackd2 offers no other count without a client of our own.
//!
//! After the window jalv's standard input is closed (it quits at end of input), then the server is stopped. Runs
//! alternate native and ward, so that drift on a shared machine hits both alike. The target (issue 31): no xrun
//! under ward that the native run does not have, read as: ward's xruns of both kinds over all runs at most
//! native's.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::bench_hosts::{
    catch_interrupts, check_interrupted, cpus, load_average, need_program, progress, round, summarise, Finished,
    TempDir,
};
use crate::bench_lv2::{mpk_unavailable, named, plugin_lines, WardSaid};
use crate::load::Load;
use crate::output::{say, Columns};

/// zam-plugins' ZamVerb: a convolution reverb (zita-convolver with its built-in room response), whose cost per
/// period does not depend on the signal (JACK's dummy backend gives silence); DECISIONS.md says why this one.
pub const DEFAULT_PLUGIN: &str = "urn:zamaudio:ZamVerb";
pub const SAMPLE_RATE: u32 = 48_000;
pub const PERIOD: u32 = 128;
/// The JACK client name jalv takes (`-n`), by which its ports are found.
const CLIENT: &str = "ward-bench-jalv";
/// Seconds of a measured window: the issue's 60, and a few for `--quick`.
const FULL_SECONDS: u32 = 60;
const QUICK_SECONDS: u32 = 3;
/// Between jalv's ports appearing and the window: its activation and the plugin's first periods.
const SETTLE: Duration = Duration::from_secs(1);
/// How long a server or jalv may take to come up or to stop, on a loaded two-core machine: generous.
const DEADLINE: Duration = Duration::from_secs(60);
/// How often readiness, Ctrl-C and jalv's life are looked at.
const POLL: Duration = Duration::from_millis(50);

/// jackd's lines for the two kinds of xrun (the client's "was not finished"; not its "finished after current
/// callback", which follows the same xrun in jackd's verbose mode).
const CLIENT_XRUN: &str = "JackEngine::XRun: client = ";
const DRIVER_XRUN: &str = "JackTimedDriver::Process XRun";

#[derive(Args)]
pub struct JalvArgs {
    #[command(flatten)]
    flags: crate::bench::Flags,
    /// The LV2 plugin jalv runs (its URI, on the LV2 path); a heavy one of the corpus by default.
    #[arg(long, value_name = "URI", default_value = DEFAULT_PLUGIN)]
    plugin: String,
    /// Seconds each run is measured (after jalv is up and has settled); 60, or 3 with --quick.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3600))]
    seconds: Option<u32>,
    /// Runs of each side, native and ward alternating.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    runs: u32,
    /// Isolation of the plugin under `ward run`.
    #[arg(long, value_enum, default_value_t = JalvIsolation::Process)]
    isolation: JalvIsolation,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JalvIsolation {
    Process,
    /// Only where the processor has protection keys; elsewhere the benchmark says it cannot measure mpk.
    Mpk,
}

impl JalvIsolation {
    fn name(self) -> &'static str {
        match self {
            JalvIsolation::Process => "process",
            JalvIsolation::Mpk => "mpk",
        }
    }
}

/// What one measured window gave.
#[derive(Clone, Serialize)]
struct Sample {
    /// The window's wall time.
    seconds: f64,
    /// Periods the window lasted (its wall time in periods).
    periods: f64,
    /// CPU seconds of jalv and the processes beneath it over the window.
    cpu_s: f64,
    /// `cpu_s` per period, in microseconds.
    cpu_per_period_us: f64,
    client_xruns: usize,
    driver_xruns: usize,
    /// Under ward: what ward reported about the plugin in this run (faults, recoveries), each line once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ward_reported: Vec<String>,
}

impl Sample {
    fn xruns(&self) -> usize {
        self.client_xruns + self.driver_xruns
    }
}

/// One side's runs: measured ones, and the reasons of those that failed.
#[derive(Default)]
struct Side {
    samples: Vec<Sample>,
    failed: Vec<String>,
}

impl Side {
    fn cpu_per_period(&self) -> Vec<f64> {
        self.samples.iter().map(|s| s.cpu_per_period_us).collect()
    }

    fn client_xruns(&self) -> usize {
        self.samples.iter().map(|s| s.client_xruns).sum()
    }

    fn driver_xruns(&self) -> usize {
        self.samples.iter().map(|s| s.driver_xruns).sum()
    }

    fn xruns(&self) -> usize {
        self.samples.iter().map(Sample::xruns).sum()
    }
}

/// The programs every run starts, and where their output goes.
struct Bench {
    jackd: PathBuf,
    jack_lsp: PathBuf,
    jalv: PathBuf,
    ward: PathBuf,
    uri: String,
    isolation: JalvIsolation,
    dir: TempDir,
    /// Servers started so far, for their unique names.
    servers: u32,
    /// Lines `ward run` printed about the machine (a sandbox part missing): said once.
    notes: Vec<String>,
}

pub fn jalv(args: JalvArgs) -> Result<bool> {
    catch_interrupts();
    let crate::bench::Flags { json, quick, load } = args.flags;
    let seconds = args.seconds.unwrap_or(if quick { QUICK_SECONDS } else { FULL_SECONDS });
    // The plugin must be on the LV2 path (bad input otherwise), and its package is said beside it.
    let plugin = named(std::slice::from_ref(&args.plugin))?.into_iter().next().context("no plugin found")?;
    let mut bench = Bench {
        jackd: need_program("jackd")?,
        jack_lsp: need_program("jack_lsp")?,
        jalv: need_program("jalv")?,
        ward: std::env::current_exe().context("cannot find the running ward program")?,
        uri: plugin.uri.clone(),
        isolation: args.isolation,
        dir: TempDir::new("ward-bench-jalv")?,
        servers: 0,
        notes: Vec::new(),
    };
    let mpk_missing = (args.isolation == JalvIsolation::Mpk && !ward::mpk_available()).then(mpk_unavailable);

    let load_before = load_average();
    let load = Load::start(load)?;
    let window = Duration::from_secs(u64::from(seconds));
    let (mut native, mut warded) = (Side::default(), Side::default());
    for run in 1..=args.runs {
        let mut sides = vec![(false, &mut native)];
        if mpk_missing.is_none() {
            sides.push((true, &mut warded));
        }
        for (under_ward, side) in sides {
            let name = if under_ward { args.isolation.name() } else { "native" };
            match bench.run(under_ward, window)? {
                Ok(s) => {
                    progress(&format!(
                        "jalv run {run}/{} {name}: {:.1} us CPU a period, {} client and {} driver xruns",
                        args.runs, s.cpu_per_period_us, s.client_xruns, s.driver_xruns
                    ));
                    side.samples.push(s);
                }
                Err(reason) => {
                    progress(&format!("jalv run {run}/{} {name}: failed: {reason}", args.runs));
                    side.failed.push(format!("run {run}: {reason}"));
                }
            }
        }
    }
    let finished = Finished::from(load);
    let report = Report {
        bench: &bench,
        plugin_package: &plugin.package,
        seconds,
        runs: args.runs,
        native: &native,
        warded: &warded,
        mpk_missing: mpk_missing.as_deref(),
        finished: &finished,
        load: (load_before, load_average()),
    };
    if json {
        report.json()?;
    } else {
        report.text()?;
    }
    // A run that failed (natively or under ward) leaves the comparison incomplete.
    Ok(native.failed.is_empty() && warded.failed.is_empty() && !native.samples.is_empty())
}

impl Bench {
    /// One run of one side: a server, jalv in it, the measured window, both stopped. `Err` only when the benchmark
    /// cannot go on (a program cannot be started, Ctrl-C); the inner `Err` is why this run failed.
    fn run(&mut self, under_ward: bool, window: Duration) -> Result<Result<Sample, String>> {
        self.servers += 1;
        let tag = if under_ward { "ward" } else { "native" };
        let server = match JackServer::start(self, tag)? {
            Ok(server) => server,
            Err(reason) => return Ok(Err(reason)),
        };
        let mut cmd = if under_ward {
            let mut c = Command::new(&self.ward);
            // --verbose: ward says that it put the plugin under ward, and reports its faults and recoveries.
            c.args(["run", "--verbose", "--isolation", self.isolation.name(), "--"]).arg(&self.jalv);
            c
        } else {
            Command::new(&self.jalv)
        };
        cmd.args(["-n", CLIENT, &self.uri]);
        let out_path = self.dir.path().join(format!("jalv-{}-{tag}.out", self.servers));
        let err_path = self.dir.path().join(format!("jalv-{}-{tag}.err", self.servers));
        let mut jalv = Jalv::start(&mut cmd, &server, &out_path, &err_path)?;
        let measured = measure(&server, &mut jalv, window);
        let status = jalv.stop()?;
        let log = server.stop()?;
        let stderr = read_lossy(&err_path);
        let sample = match measured? {
            Ok(m) => m,
            Err(reason) => return Ok(Err(with_output(reason, &stderr))),
        };
        let mut reported = Vec::new();
        if under_ward {
            let said = WardSaid::read(&stderr, self.isolation.name());
            for note in said.notes {
                if !self.notes.contains(&note) {
                    self.notes.push(note);
                }
            }
            if !said.under_ward {
                return Ok(Err(said.problem.unwrap_or_else(|| "the plugin did not run under ward".into())));
            }
            reported = said.reported;
        }
        match status {
            Some(s) if s.success() => {}
            Some(s) => return Ok(Err(with_output(format!("jalv ended with {s}"), &stderr))),
            None => return Ok(Err(with_output("jalv did not quit at end of input: stopped".into(), &stderr))),
        }
        let window_log = log.get(sample.log_from..sample.log_to.min(log.len())).unwrap_or_default();
        let (client_xruns, driver_xruns) = count_xruns(&String::from_utf8_lossy(window_log));
        let periods = sample.elapsed.as_secs_f64() * f64::from(SAMPLE_RATE) / f64::from(PERIOD);
        Ok(Ok(Sample {
            seconds: round(sample.elapsed.as_secs_f64(), 3),
            periods: periods.round(),
            cpu_s: round(sample.cpu_s, 3),
            cpu_per_period_us: round(sample.cpu_s * 1e6 / periods, 2),
            client_xruns,
            driver_xruns,
            ward_reported: reported,
        }))
    }
}

/// A run's reason with the last lines jalv printed that are not ward's.
fn with_output(reason: String, stderr: &str) -> String {
    match plugin_lines(stderr) {
        lines if lines.is_empty() => reason,
        lines => format!("{reason}: {lines}"),
    }
}

/// The window as measured, before jackd's log is read.
struct Window {
    elapsed: Duration,
    cpu_s: f64,
    /// Where the window starts and ends in jackd's standard error (bytes).
    log_from: usize,
    log_to: usize,
}

/// Waits for jalv's ports, lets it settle, then measures the window. The inner `Err`: why the run failed.
fn measure(server: &JackServer, jalv: &mut Jalv, window: Duration) -> Result<Result<Window, String>> {
    let prefix = format!("{CLIENT}:");
    let start = Instant::now();
    loop {
        check_interrupted()?;
        if server.ports()?.is_some_and(|ports| ports.iter().any(|p| p.starts_with(&prefix))) {
            break;
        }
        if let Some(status) = jalv.exited()? {
            return Ok(Err(format!("jalv ended ({status}) before its ports were listed")));
        }
        if start.elapsed() >= DEADLINE {
            return Ok(Err(format!("jalv showed no ports within {} s", DEADLINE.as_secs())));
        }
        std::thread::sleep(POLL);
    }
    // The settling and the window are the run's point, stretches of real-time processing: slept through, with
    // jalv's life and Ctrl-C looked at every poll.
    if let Some(why) = keep_running(jalv, SETTLE)? {
        return Ok(Err(why));
    }
    let (log_from, cpu_from) = (server.log_len(), tree_cpu_ticks(jalv.pid()));
    let from = Instant::now();
    if let Some(why) = keep_running(jalv, window)? {
        return Ok(Err(why));
    }
    let (cpu_to, elapsed, log_to) = (tree_cpu_ticks(jalv.pid()), from.elapsed(), server.log_len());
    let ticks = clock_ticks_per_second();
    Ok(Ok(Window { elapsed, cpu_s: cpu_to.saturating_sub(cpu_from) as f64 / ticks, log_from, log_to }))
}

/// Lets jalv run for `time`; why not, if it ended before.
fn keep_running(jalv: &mut Jalv, time: Duration) -> Result<Option<String>> {
    let start = Instant::now();
    while start.elapsed() < time {
        check_interrupted()?;
        if let Some(status) = jalv.exited()? {
            return Ok(Some(format!("jalv ended ({status}) {:.1} s into the run", start.elapsed().as_secs_f64())));
        }
        std::thread::sleep(POLL.min(time.saturating_sub(start.elapsed())));
    }
    Ok(None)
}

/// Client and driver xruns in a stretch of jackd's standard error.
fn count_xruns(log: &str) -> (usize, usize) {
    let client = log.lines().filter(|l| l.contains(CLIENT_XRUN)).count();
    let driver = log.lines().filter(|l| l.contains(DRIVER_XRUN)).count();
    (client, driver)
}

fn read_lossy(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// A running `jackd -d dummy`, our child, in a process group of its own (Ctrl-C at the terminal is the benchmark's to
/// handle); stopped with SIGINT (so that it removes its files in /dev/shm), SIGKILL past the deadline.
struct JackServer {
    name: String,
    jack_lsp: PathBuf,
    child: Option<Child>,
    log_path: PathBuf,
}

impl JackServer {
    /// Starts the server and waits until it accepts clients; the inner `Err` says why it did not.
    fn start(bench: &Bench, tag: &str) -> Result<Result<JackServer, String>> {
        let name = format!("ward-bench-jalv-{}-{}", std::process::id(), bench.servers);
        let log_path = bench.dir.path().join(format!("jackd-{}-{tag}.err", bench.servers));
        let log = File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
        let child = Command::new(&bench.jackd)
            .args(["-n", &name, "-d", "dummy", "-r", &SAMPLE_RATE.to_string(), "-p", &PERIOD.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {}", bench.jackd.display()))?;
        let mut server = JackServer { name, jack_lsp: bench.jack_lsp.clone(), child: Some(child), log_path };
        let start = Instant::now();
        loop {
            check_interrupted()?;
            if server.ports()?.is_some() {
                return Ok(Ok(server));
            }
            let exited = server.child.as_mut().map(Child::try_wait).transpose().context("cannot wait for jackd")?;
            if let Some(Some(status)) = exited {
                return Ok(Err(format!("jackd ended ({status}) before accepting clients: {}", server.log_tail())));
            }
            if start.elapsed() >= DEADLINE {
                return Ok(Err(format!("jackd accepted no client within {} s", DEADLINE.as_secs())));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Points a client at this server, and forbids it to start one.
    fn client_env<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.env("JACK_DEFAULT_SERVER", &self.name).env("JACK_NO_START_SERVER", "1")
    }

    /// Every port of the server (`jack_lsp`), or None while it accepts no client.
    fn ports(&self) -> Result<Option<Vec<String>>> {
        let out = self
            .client_env(&mut Command::new(&self.jack_lsp))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", self.jack_lsp.display()))?;
        Ok(out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()))
    }

    fn log_len(&self) -> usize {
        std::fs::metadata(&self.log_path).map_or(0, |m| m.len() as usize)
    }

    fn log_tail(&self) -> String {
        crate::bench_hosts::tail(&read_lossy(&self.log_path), 3).replace('\n', " / ")
    }

    /// Stops the server; its whole standard error.
    fn stop(mut self) -> Result<Vec<u8>> {
        if let Some(child) = self.child.take() {
            stop_child(child, libc::SIGINT, "jackd")?;
        }
        Ok(std::fs::read(&self.log_path).unwrap_or_default())
    }
}

impl Drop for JackServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = stop_child(child, libc::SIGINT, "jackd");
        }
    }
}

/// jalv (alone, or `ward run ... -- jalv`, which execs it: the child is jalv either way), our child in a process
/// group of its own, its input a pipe that we close to make it quit.
struct Jalv {
    child: Option<Child>,
    stdin: Option<std::process::ChildStdin>,
}

impl Jalv {
    fn start(cmd: &mut Command, server: &JackServer, out_path: &Path, err_path: &Path) -> Result<Jalv> {
        let out = File::create(out_path).with_context(|| format!("cannot create {}", out_path.display()))?;
        let err = File::create(err_path).with_context(|| format!("cannot create {}", err_path.display()))?;
        let mut child = server
            .client_env(cmd)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot run {cmd:?}"))?;
        let stdin = child.stdin.take();
        Ok(Jalv { child: Some(child), stdin })
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn exited(&mut self) -> Result<Option<ExitStatus>> {
        match &mut self.child {
            Some(c) => c.try_wait().context("cannot wait for jalv"),
            None => Ok(None),
        }
    }

    /// Closes jalv's input (it quits at end of input) and waits; SIGINT past the deadline, then SIGKILL. How it
    /// ended; None when it had to be interrupted or killed.
    fn stop(&mut self) -> Result<Option<ExitStatus>> {
        if let Some(mut stdin) = self.stdin.take() {
            // A broken pipe means jalv has already gone; its status says why.
            let _ = stdin.write_all(b"\n");
        }
        let Some(mut child) = self.child.take() else { return Ok(None) };
        if let Some(status) = wait_within(&mut child, DEADLINE)? {
            return Ok(Some(status));
        }
        progress(&format!("jalv did not quit at end of input within {} s: SIGINT", DEADLINE.as_secs()));
        stop_child(child, libc::SIGINT, "jalv")?;
        Ok(None)
    }
}

impl Drop for Jalv {
    fn drop(&mut self) {
        self.stdin.take();
        if let Some(child) = self.child.take() {
            let _ = stop_child(child, libc::SIGINT, "jalv");
        }
    }
}

/// Waits for our child up to `limit`: its status, or None while it still runs.
fn wait_within(child: &mut Child, limit: Duration) -> Result<Option<ExitStatus>> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("cannot wait for a child")? {
            return Ok(Some(status));
        }
        if start.elapsed() >= limit {
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// Sends `signal` to our child (by its id, which stays ours until we reap it) and waits; SIGKILL past the deadline.
fn stop_child(mut child: Child, signal: libc::c_int, what: &str) -> Result<Option<ExitStatus>> {
    if let Some(status) = child.try_wait().with_context(|| format!("cannot wait for {what}"))? {
        return Ok(Some(status));
    }
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        let _ = child.kill();
        return Ok(child.wait().ok());
    };
    // SAFETY: kill(2) with a positive pid signals exactly that process; it is our unreaped child, so the id cannot
    // have been reused by another process.
    unsafe { libc::kill(pid, signal) };
    if let Some(status) = wait_within(&mut child, DEADLINE)? {
        return Ok(Some(status));
    }
    progress(&format!("{what} did not stop within {} s: killed", DEADLINE.as_secs()));
    let _ = child.kill();
    let _ = child.wait();
    Ok(None)
}

/// The clock ticks of `/proc/PID/stat`'s times.
fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        // Linux's USER_HZ, which the kernel's interfaces use whatever its own tick rate.
        100.0
    }
}

/// One process's line of `/proc/PID/stat`: its parent, and its CPU time and that of its reaped children, in ticks.
fn parse_stat(stat: &str) -> Option<(u32, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces and parentheses: fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // From field 3 (state) on: ppid is field 4, utime, stime, cutime and cstime fields 14 to 17.
    let ppid = fields.get(1)?.parse().ok()?;
    let mut ticks = 0u64;
    for i in 11..=14 {
        ticks += fields.get(i)?.parse::<u64>().ok()?;
    }
    Some((ppid, ticks))
}

/// The CPU time, in ticks, of `root` and every process beneath it, each with its reaped children's.
fn tree_cpu_ticks(root: u32) -> u64 {
    let mut procs: Vec<(u32, u32, u64)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            // A process that ended since the directory was read is simply gone; its time is its parent's now.
            if let Some((ppid, ticks)) =
                std::fs::read_to_string(entry.path().join("stat")).ok().as_deref().and_then(parse_stat)
            {
                procs.push((pid, ppid, ticks));
            }
        }
    }
    tree_sum(&procs, root)
}

/// The sum of `(pid, ppid, ticks)` over `root` and its descendants.
fn tree_sum(procs: &[(u32, u32, u64)], root: u32) -> u64 {
    let mut total = 0;
    let mut todo = vec![root];
    let mut seen = std::collections::HashSet::new();
    while let Some(pid) = todo.pop() {
        if !seen.insert(pid) {
            continue;
        }
        for &(p, ppid, ticks) in procs {
            if p == pid {
                total += ticks;
            }
            if ppid == pid && p != pid {
                todo.push(p);
            }
        }
    }
    total
}

struct Report<'a> {
    bench: &'a Bench,
    plugin_package: &'a str,
    seconds: u32,
    runs: u32,
    native: &'a Side,
    warded: &'a Side,
    mpk_missing: Option<&'a str>,
    finished: &'a Finished,
    load: (Option<f64>, Option<f64>),
}

/// What is measured, for the header and the JSON.
const MEASURE_NOTE: &str = "CPU: utime+stime (and that of reaped children) of jalv and every process beneath it \
                            (under ward its domain's) over the measured window, per period (window wall time x \
                            48000 / 128); xruns: jackd's XRun lines within the window, client (a client did not \
                            finish its period) and driver (the dummy driver woke late)";

impl Report<'_> {
    fn median_cpu(side: &Side) -> Option<f64> {
        (!side.samples.is_empty()).then(|| summarise(&side.cpu_per_period()).median)
    }

    fn ratio(&self) -> Option<f64> {
        Some(Self::median_cpu(self.warded)? / Self::median_cpu(self.native)?).filter(|r| r.is_finite())
    }

    /// The target, where both sides were measured in every run.
    fn target_met(&self) -> Option<bool> {
        let complete = |s: &Side| s.failed.is_empty() && !s.samples.is_empty();
        (complete(self.native) && complete(self.warded)).then(|| self.warded.xruns() <= self.native.xruns())
    }

    fn period_us() -> f64 {
        f64::from(PERIOD) * 1e6 / f64::from(SAMPLE_RATE)
    }

    fn text(&self) -> Result<()> {
        let b = self.bench;
        say!(
            "ward bench jalv: jalv -n {CLIENT} {} ({}) in a JACK server of its own per run (dummy backend, \
             {SAMPLE_RATE} Hz, {PERIOD} frames: {:.3} ms a period); {} s measured per run after {} s to settle, {} \
             run{} of each side, alternating; {} CPUs",
            b.uri,
            self.plugin_package,
            Self::period_us() / 1000.0,
            self.seconds,
            SETTLE.as_secs(),
            self.runs,
            if self.runs == 1 { "" } else { "s" },
            cpus()
        )?;
        say!("measured: {MEASURE_NOTE}")?;
        self.finished.say()?;
        if let Some(why) = self.mpk_missing {
            say!("{why}")?;
        }
        for note in &b.notes {
            say!("ward said: {note}")?;
        }
        say!("")?;
        let cols = Columns::new(&[9, 9, 15, 22, 11, 8, 13]);
        say!(
            "{}",
            cols.row(&[
                "side",
                "isolation",
                "CPU a period",
                "range (min-max)",
                "% of period",
                "periods",
                "xruns",
                "client / driver"
            ])
        )?;
        for (name, isolation, side, unavailable) in
            [("native", "-", self.native, None), ("ward run", b.isolation.name(), self.warded, self.mpk_missing)]
        {
            if side.samples.is_empty() {
                let why = match (unavailable, side.failed.first()) {
                    (Some(why), _) => why.to_string(),
                    (None, Some(f)) => format!("failed: {f}"),
                    (None, None) => "not measured".to_string(),
                };
                say!("{}", cols.row(&[name, isolation, &why]))?;
                continue;
            }
            let s = summarise(&side.cpu_per_period());
            let periods: f64 = side.samples.iter().map(|s| s.periods).sum();
            say!(
                "{}",
                cols.row(&[
                    name,
                    isolation,
                    &format!("{:.2} us", s.median),
                    &format!("{:.2}-{:.2} us", s.min, s.max),
                    &format!("{:.2}%", s.median / Self::period_us() * 100.0),
                    &format!("{periods:.0}"),
                    &side.xruns().to_string(),
                    &format!("{} / {}", side.client_xruns(), side.driver_xruns()),
                ])
            )?;
            for f in &side.failed {
                say!("  {name} failed, not counted: {f}")?;
            }
        }
        say!("")?;
        match self.ratio() {
            Some(r) => say!("CPU a period, ward over native (medians): {r:.3}x")?,
            None => say!("CPU a period, ward over native: not measured")?,
        }
        let target = match self.target_met() {
            Some(met) => format!(
                "{} (ward {} xruns, native {})",
                if met { "met" } else { "MISSED" },
                self.warded.xruns(),
                self.native.xruns()
            ),
            None if self.mpk_missing.is_some() => "not measured: the ward side cannot run here".to_string(),
            None => "not measured (a side did not complete every run)".to_string(),
        };
        say!("target: no xrun under ward that the native run does not have (ward's xruns <= native's): {target}")?;
        let reported: Vec<String> = self
            .warded
            .samples
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.ward_reported.iter().map(move |l| format!("run {}: {l}", i + 1)))
            .collect();
        say!("ward reported during the runs: {}", if reported.is_empty() { "nothing" } else { "" })?;
        for line in reported {
            say!("  {line}")?;
        }
        let show = |l: Option<f64>| l.map_or_else(|| "?".to_string(), |l| format!("{l:.2}"));
        say!("load average (1 min) before / after: {} / {}", show(self.load.0), show(self.load.1))
    }

    fn json_side(&self, side: &Side, name: &'static str, isolation: &'static str) -> JsonSide {
        let available = !(name == "ward" && self.mpk_missing.is_some());
        let s = summarise(&side.cpu_per_period());
        let measured = !side.samples.is_empty();
        JsonSide {
            side: name,
            isolation,
            available,
            unavailable_reason: (!available).then(|| self.mpk_missing.unwrap_or_default().to_string()),
            cpu_per_period_us_median: measured.then_some(s.median),
            cpu_per_period_us_min: measured.then_some(s.min),
            cpu_per_period_us_max: measured.then_some(s.max),
            percent_of_period: measured.then(|| round(s.median / Self::period_us() * 100.0, 3)),
            periods: side.samples.iter().map(|s| s.periods).sum(),
            xruns: side.xruns(),
            client_xruns: side.client_xruns(),
            driver_xruns: side.driver_xruns(),
            runs: side.samples.clone(),
            failed: side.failed.clone(),
        }
    }

    fn json(&self) -> Result<()> {
        let b = self.bench;
        let report = JsonReport {
            bench: "jalv",
            note: MEASURE_NOTE,
            plugin: b.uri.clone(),
            package: self.plugin_package.to_string(),
            sample_rate: SAMPLE_RATE,
            period_frames: PERIOD,
            seconds: self.seconds,
            settle_s: SETTLE.as_secs(),
            runs: self.runs,
            cpus: cpus(),
            load_processes: self.finished.processes,
            load_before: self.load.0,
            load_after: self.load.1,
            ward_said: b.notes.clone(),
            native: self.json_side(self.native, "native", "-"),
            ward: self.json_side(self.warded, "ward", b.isolation.name()),
            cpu_ratio: self.ratio().map(|r| round(r, 4)),
            target: "no xrun under ward that the native run does not have: ward's xruns <= native's, over all runs",
            target_met: self.target_met(),
        };
        let text = serde_json::to_string_pretty(&report).context("cannot encode the results as JSON")?;
        say!("{text}")
    }
}

#[derive(Serialize)]
struct JsonReport {
    bench: &'static str,
    note: &'static str,
    plugin: String,
    package: String,
    sample_rate: u32,
    period_frames: u32,
    /// Measured seconds per run.
    seconds: u32,
    settle_s: u64,
    runs: u32,
    cpus: usize,
    load_processes: usize,
    load_before: Option<f64>,
    load_after: Option<f64>,
    /// Lines of `ward run` about the machine (a part of the sandbox missing), each once.
    ward_said: Vec<String>,
    native: JsonSide,
    ward: JsonSide,
    /// The ward side's median CPU a period over native's.
    cpu_ratio: Option<f64>,
    target: &'static str,
    target_met: Option<bool>,
}

#[derive(Serialize)]
struct JsonSide {
    side: &'static str,
    isolation: &'static str,
    available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    unavailable_reason: Option<String>,
    cpu_per_period_us_median: Option<f64>,
    cpu_per_period_us_min: Option<f64>,
    cpu_per_period_us_max: Option<f64>,
    percent_of_period: Option<f64>,
    /// Over all measured runs.
    periods: f64,
    xruns: usize,
    client_xruns: usize,
    driver_xruns: usize,
    runs: Vec<Sample>,
    failed: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_last_parenthesis() {
        let line = "4242 (jalv (x) y) S 17 4242 4242 0 -1 4194560 900 0 0 0 150 25 7 3 20 0 4 0 1 2 3\n";
        assert_eq!(parse_stat(line), Some((17, 150 + 25 + 7 + 3)));
        assert_eq!(parse_stat("1 (init) S"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn the_tree_sums_the_root_and_its_descendants_only() {
        // 10 is jalv; 11 and 12 its domain's processes, 13 a child of 12; 20 another process, 21 its child.
        let procs = [(10, 1, 100), (11, 10, 20), (12, 10, 5), (13, 12, 2), (20, 1, 1000), (21, 20, 7)];
        assert_eq!(tree_sum(&procs, 10), 127);
        assert_eq!(tree_sum(&procs, 12), 7);
        assert_eq!(tree_sum(&procs, 99), 0);
    }

    #[test]
    fn xruns_are_told_apart_by_kind() {
        let log = "JackEngine::XRun: client = ward-bench-jalv was not finished, state = Triggered\n\
                   JackAudioDriver::ProcessGraphAsyncMaster: Process error\n\
                   JackTimedDriver::Process XRun = 3120 usec\n\
                   JackEngine::XRun: client = ward-bench-jalv was not finished, state = Triggered\n";
        assert_eq!(count_xruns(log), (2, 1));
        assert_eq!(count_xruns(""), (0, 0));
    }
}
