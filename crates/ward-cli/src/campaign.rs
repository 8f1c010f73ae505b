//! `ward campaign`: the reliability campaign (issue 5). The ward-campaign library plans, judges, records and
//! reports; this file reads the command line, starts each run's host as a child of this program
//! (`ward __campaign-host`), shows progress, and prints the summary.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{value_parser, ArgAction, Args};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ward_campaign::{
    workload, Campaign, FaultModel, HostEnd, HostRequest, HostRun, Launcher, Observer, Options, RunMode, RunRecord,
};

use crate::hosts::child::{self, End};
use crate::output::{self, say};

#[derive(Args)]
pub struct CampaignArgs {
    /// The extensions, one campaign each: built-in names (well) or paths of LADSPA or frei0r plugin libraries,
    /// separated by commas or given by repeating the option. With more than one, each campaign has its own
    /// directory under --out (named after its extension) and a report over all of them is written to --out.
    #[arg(long, default_value = "well", value_name = "NAME|PATH,...", value_delimiter = ',', action = ArgAction::Append)]
    extension: Vec<String>,
    /// Fault types, separated by commas: code fault types (source, destination, pointer, interface, branch, loop,
    /// text, nop, init, off-by-one; `all` is every one of them) mutate a copy of the extension's machine code;
    /// library fault kinds (alloc, leak, copy-overrun; `library` is every one) run the unmutated extension with a
    /// run-time fault in the C library calls its own code makes: an allocation fails, frees leak, or a copy
    /// overruns, from a call drawn from the trial's seed. Mix them at will (`all,library`, `nop,alloc`). Library
    /// kinds need a domain to inject them: isolation process or mpk (not none).
    #[arg(long, default_value = "all", value_name = "all|library|TYPE,...")]
    types: String,
    /// Trials of each fault type.
    #[arg(long, default_value_t = 50, value_name = "N", value_parser = value_parser!(u32).range(1..=100_000))]
    trials_per_type: u32,
    /// Faults injected into each trial's copy, all of its type (Nooks injected five); code fault types only (a
    /// library-fault trial has one fault).
    #[arg(long, default_value_t = 5, value_name = "N", value_parser = value_parser!(u32).range(1..=100))]
    faults_per_trial: u32,
    /// Isolation kinds each trial also runs under, after the native run: mpk (on a machine with protection keys),
    /// process, none (comma-separated).
    #[arg(long, default_value = "process", value_name = "KIND,...")]
    isolation: String,
    /// Seed of every trial's injection (and of every library-fault trial's drawn call).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Trials run at once [default: the number of CPUs].
    #[arg(long, value_name = "N", value_parser = value_parser!(u32).range(1..=1024))]
    jobs: Option<u32>,
    /// The campaign directory: records, reports, and what lets an interrupted campaign resume (with several
    /// extensions, a directory per extension in it, and the report over all of them).
    #[arg(long, default_value = "ward-campaign", value_name = "DIR")]
    out: PathBuf,
    /// Print every run's record as a JSON line (and no summary).
    #[arg(long)]
    json: bool,
    /// Deadline of every call under ward, in milliseconds, with the campaign's own policy (a restart budget, short
    /// backoffs, history for plugins).
    #[arg(long, default_value_t = 2000, value_name = "MS", value_parser = value_parser!(u64).range(1..=3_600_000))]
    deadline_ms: u64,
    /// Run under ward with ward's default policy only, as a user who never tuned it does: deadlines learned per
    /// function, the default restart limits, backoff and history (the fault model's restart file, a library fault
    /// and --poison are still added). Takes no --deadline-ms, and a --host-timeout-s above twice the default
    /// deadline ceiling.
    #[arg(long, conflicts_with = "deadline_ms")]
    default_policy: bool,
    /// A host still running after this many seconds is hung and killed.
    #[arg(long, default_value_t = 20, value_name = "S", value_parser = value_parser!(u64).range(1..=86_400))]
    host_timeout_s: u64,
    /// Where the faults live: `persistent` (in the file: a restart runs the same faulty code) or `transient` (in
    /// the loaded image, as Nooks injected them: a restart under ward loads the unmutated file).
    #[arg(long, default_value = "persistent", value_name = "MODEL")]
    fault_model: String,
    /// Under ward, call the extension with poison in every register and stack slot it is not given (policy
    /// `poison`), so a mutated extension that reads what it was not given faults instead of computing with stale
    /// values. Plugins' class adapters poison their calls into the plugin with or without it
    #[arg(long)]
    poison: bool,
}

/// Whether `e` is a mistake in what the user asked for: `main` exits with status 2 for those.
pub fn is_bad_input(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<ward_campaign::Error>().is_some_and(ward_campaign::Error::is_bad_input))
}

pub fn run(args: CampaignArgs) -> Result<bool> {
    let started = Instant::now();
    let fault_types = ward_campaign::parse_types(&args.types)?;
    let isolations = ward_campaign::parse_isolations(&args.isolation)?;
    let fault_model: FaultModel = args.fault_model.trim().parse()?;
    let jobs = args.jobs.map_or_else(|| std::thread::available_parallelism().map_or(1, usize::from), |j| j as usize);
    let names: Vec<&str> = args.extension.iter().map(|e| e.trim()).filter(|e| !e.is_empty()).collect();
    if names.is_empty() {
        return Err(ward_campaign::Error::EmptyList { what: "--extension" }.into());
    }
    // Every extension is checked before any campaign starts (or creates a directory).
    let several = names.len() > 1;
    let mut campaigns = Vec::with_capacity(names.len());
    for name in &names {
        let path = extension_path(name)?;
        let out = if several { args.out.join(ward::extension_name(&path)) } else { args.out.clone() };
        let campaign = Campaign::new(Options {
            extension_path: path,
            fault_types: fault_types.clone(),
            trials_per_type: args.trials_per_type,
            faults_per_trial: args.faults_per_trial,
            isolations: isolations.clone(),
            seed: args.seed,
            deadline: (!args.default_policy).then(|| Duration::from_millis(args.deadline_ms)),
            host_timeout: Duration::from_secs(args.host_timeout_s),
            fault_model,
            poison: args.poison,
            out,
            jobs,
        })?;
        if campaigns.iter().any(|c: &Campaign| c.config.extension == campaign.config.extension) {
            return Err(ward_campaign::Error::DuplicateExtension { extension: campaign.config.extension }.into());
        }
        campaigns.push(campaign);
    }

    let mut finished = Vec::with_capacity(campaigns.len());
    for (i, campaign) in campaigns.iter().enumerate() {
        let label = if several {
            format!("[{}/{}] {} ", i + 1, campaigns.len(), campaign.config.extension)
        } else {
            String::new()
        };
        let progress = Progress::new(args.json, isolations.first().copied().unwrap_or(RunMode::Process), label);
        let result = campaign.run(&ChildHosts, &progress);
        progress.bar.finish_and_clear();
        let done = result?;
        progress.take_error()?;
        let (_, markdown, written) = ward_campaign::report::write(&campaign.out, &done)?;
        if !args.json && !several {
            say!("{}", markdown.trim_end())?;
            say!("")?;
            say!(
                "Written: {}, {}, {} (records: {})",
                written.markdown.display(),
                written.json.display(),
                written.chart.display(),
                campaign.out.join("trials.jsonl").display()
            )?;
        }
        finished.push(done);
    }
    if several {
        let (_, markdown, written) = ward_campaign::report::write_combined(&args.out, &finished, started.elapsed())?;
        if !args.json {
            say!("{}", markdown.trim_end())?;
            say!("")?;
            let by_extension =
                written.chart_by_extension.as_ref().map(|p| format!(", {}", p.display())).unwrap_or_default();
            say!(
                "Written: {}, {}, {}{by_extension} (each extension's records and report: {})",
                written.markdown.display(),
                written.json.display(),
                written.chart.display(),
                args.out.join("EXTENSION").display()
            )?;
        }
    }
    Ok(true)
}

/// A built-in extension's name, or a path (anything with a `/` or ending in `.so`).
fn extension_path(arg: &str) -> Result<PathBuf> {
    if arg.contains('/') || arg.ends_with(".so") {
        return Ok(PathBuf::from(arg));
    }
    if workload::for_builtin(arg).is_none() {
        return Err(
            ward_campaign::Error::NoWorkload { extension: arg.to_string(), available: workload::available() }.into()
        );
    }
    ward_extensions::path_of(arg).with_context(|| format!("cannot extract the built-in extension {arg}.so"))
}

/// Each run's host is this program again, with a hidden subcommand, bounded in time by the demo's machinery.
struct ChildHosts;

impl Launcher for ChildHosts {
    fn launch(&self, request: &HostRequest<'_>, bound: Duration) -> Result<HostRun, ward_campaign::Error> {
        let mut args: Vec<OsString> = vec![
            "__campaign-host".into(),
            "--workload".into(),
            request.workload.into(),
            "--mode".into(),
            request.mode.as_str().into(),
        ];
        // Without a deadline the host runs ward's default policy.
        if let Some(deadline) = request.deadline {
            args.extend(["--deadline-ms".into(), deadline.as_millis().to_string().into()]);
        }
        if let Some(good) = request.restart_from {
            args.extend(["--restart-from".into(), good.as_os_str().to_owned()]);
        }
        if request.poison {
            args.push("--poison".into());
        }
        // A library fault: a native host opens the extension itself, so it is started with the preload library
        // targeting the extension; a host under ward puts the fault in the extension's policy, and its domain gets
        // the preload (the host process itself runs without it).
        let mut env = Vec::new();
        if let Some(fault) = &request.library_fault {
            match request.mode {
                RunMode::Native => {
                    env = ward::libfault::env_for(request.path, fault)
                        .map_err(|e| ward_campaign::Error::Launch(format!("{e:#}")))?;
                }
                RunMode::Mpk | RunMode::Process | RunMode::None => {
                    args.extend(["--library-fault".into(), fault.to_string().into()])
                }
            }
        }
        args.extend(["--".into(), request.path.as_os_str().to_owned()]);
        let run = child::run_bounded(&args, &env, bound).map_err(|e| ward_campaign::Error::Launch(format!("{e:#}")))?;
        let end = match run.end {
            End::Exited(code) => HostEnd::Exited(code),
            End::Signaled(sig) => HostEnd::Signaled(sig),
            End::Hung(after) => HostEnd::Hung(after),
        };
        Ok(HostRun { end, stdout: run.stdout, stderr: run.stderr })
    }
}

/// The progress bar (on stderr, when it is a terminal and the output is not JSON) and the JSON lines.
struct Progress {
    bar: ProgressBar,
    json: bool,
    /// Which campaign, when there are several: `[3/22] gverb_1216 `.
    label: String,
    /// The isolation kind the bar's message counts.
    shown: RunMode,
    tally: Mutex<Tally>,
    /// The first failure to print a JSON line; the campaign goes on (its records are on disk) and reports it last.
    error: Mutex<Option<anyhow::Error>>,
}

#[derive(Default)]
struct Tally {
    native_lost: u32,
    survived: u32,
    transparent: u32,
}

impl Progress {
    fn new(json: bool, shown: RunMode, label: String) -> Progress {
        let target = if !json && std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        // Until the trials are counted (after the reference runs), only the time and what is going on.
        let bar = ProgressBar::with_draw_target(None, target);
        if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} {msg}") {
            bar.set_style(style);
        }
        bar.set_message(format!("{label}reference runs of the unmutated extension"));
        Progress { bar, json, label, shown, tally: Mutex::new(Tally::default()), error: Mutex::new(None) }
    }

    fn take_error(&self) -> Result<()> {
        match self.error.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn count(&self, records: &[RunRecord]) {
        let mut t = self.tally.lock().unwrap_or_else(|e| e.into_inner());
        let native = records.iter().find(|r| r.isolation == RunMode::Native);
        let shown = records.iter().find(|r| r.isolation == self.shown);
        if let (Some(native), Some(shown)) = (native, shown) {
            if native.outcome.host_lost() {
                t.native_lost += 1;
                t.survived += u32::from(!shown.outcome.host_lost());
                t.transparent += u32::from(shown.outcome.transparent());
            }
        }
        self.bar.set_message(format!(
            "{}native hosts lost {}, under {} survived {} ({} transparent)",
            self.label, t.native_lost, self.shown, t.survived, t.transparent
        ));
    }

    fn print(&self, records: &[RunRecord]) {
        if !self.json {
            return;
        }
        let mut error = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if error.is_some() {
            return;
        }
        for r in records {
            if let Err(e) = output::json_line(r) {
                *error = Some(e);
                return;
            }
        }
    }
}

impl Observer for Progress {
    fn planned(&self, total: usize, recorded: &[RunRecord]) {
        let style = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} trials, eta {eta}  {msg}");
        if let Ok(style) = style {
            self.bar.set_style(style.progress_chars("=> "));
        }
        self.bar.set_length(total as u64);
        let mut trials: Vec<_> = recorded.iter().map(RunRecord::trial_id).collect();
        trials.dedup();
        self.bar.set_position(trials.len() as u64);
        for trial in recorded.chunk_by(|a, b| a.trial_id() == b.trial_id()) {
            self.count(trial);
        }
        self.print(recorded);
        if recorded.is_empty() {
            self.bar.set_message(self.label.clone());
        }
    }

    fn trial_done(&self, records: &[RunRecord]) {
        self.bar.inc(1);
        self.count(records);
        self.print(records);
    }
}
