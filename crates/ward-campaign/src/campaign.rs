//! Running a campaign: check the extension and the directory, measure the reference output, make sure the
//! unmutated extension gives it under every isolation kind too, then run the trials not yet recorded, `jobs` at a
//! time, recording each as it ends.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::classify::Outcome;
use crate::config::{fingerprint, CampaignConfig, FaultModel, RunMode};
use crate::error::Error;
use crate::launch::{HostEnd, Launcher};
use crate::plan::{self, TrialId};
use crate::record::RunRecord;
use crate::store::Store;
use crate::trial::{run_and_judge, Run, TrialRunner};
use crate::trial_fault::TrialFault;
use crate::workload::{self, first_difference, Entry};

/// What the user asks for.
#[derive(Debug, Clone)]
pub struct Options {
    /// The unmutated extension; its class (a plugin's) or its name (a built-in extension's) picks the workload.
    pub extension_path: PathBuf,
    /// Code fault types and library fault kinds.
    pub fault_types: Vec<TrialFault>,
    pub trials_per_type: u32,
    pub faults_per_trial: u32,
    pub isolations: Vec<RunMode>,
    pub seed: u64,
    /// Every call's deadline under ward, with the workload's policy for campaigns; `None`: ward's default policy
    /// only (see [`CampaignConfig::deadline_ms`]).
    pub deadline: Option<Duration>,
    pub host_timeout: Duration,
    pub fault_model: FaultModel,
    /// Under ward, call the extension with poison in every register and stack slot it is not given (policy
    /// `poison`; class adapters poison their plugin calls whatever this says).
    pub poison: bool,
    /// The campaign directory.
    pub out: PathBuf,
    /// Trials run at once.
    pub jobs: usize,
}

/// A campaign ready to run.
#[derive(Debug, Clone)]
pub struct Campaign {
    pub config: CampaignConfig,
    pub extension_path: PathBuf,
    original: Vec<u8>,
    pub out: PathBuf,
    pub jobs: usize,
}

/// Told about progress as the campaign goes; called from one thread at a time.
pub trait Observer: Sync {
    /// Before the trials run: how many there are, and the records of those an earlier invocation completed.
    fn planned(&self, _total: usize, _recorded: &[RunRecord]) {}
    /// A trial ended; its records are in the campaign directory.
    fn trial_done(&self, _records: &[RunRecord]) {}
}

/// A campaign that ran to the end.
#[derive(Debug, Clone)]
pub struct Finished {
    pub config: CampaignConfig,
    /// Every trial's records (earlier invocations' included), in fault type order (Table II, then the library
    /// kinds), then trial, then run.
    pub records: Vec<RunRecord>,
    pub reference: Vec<Entry>,
    /// Fault types asked for that have no site in the extension (no trials): code types that apply to none of
    /// its instructions, library kinds none of whose functions it imports.
    pub no_site: Vec<TrialFault>,
    /// Trials recorded by earlier invocations, and run by this one.
    pub resumed_trials: usize,
    pub ran_trials: usize,
    /// This invocation's wall time.
    pub elapsed: Duration,
}

impl Campaign {
    /// Reads the extension and picks its workload; refuses what no campaign can run.
    pub fn new(options: Options) -> Result<Campaign, Error> {
        let path = options.extension_path;
        let original = std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::ExtensionMissing { path: path.clone() },
            _ => Error::io(format!("cannot read {}", path.display()), e),
        })?;
        let extension = ward::extension_name(&path);
        let Some(workload) = workload::for_path(&path) else {
            return Err(Error::NoWorkload { extension, available: workload::available() });
        };
        if options.fault_types.is_empty() {
            return Err(Error::EmptyList { what: "--types" });
        }
        if options.isolations.is_empty() {
            return Err(Error::EmptyList { what: "--isolation" });
        }
        let library: Vec<TrialFault> = options.fault_types.iter().copied().filter(|t| t.is_library()).collect();
        // A library fault needs a domain's runtime or preloaded library to inject it; poisoned calls, a domain
        // process's dispatcher.
        if options.isolations.contains(&RunMode::None) && !library.is_empty() {
            return Err(Error::LibraryFaultNeedsDomain {
                kinds: crate::config::type_list(&library),
                mode: RunMode::None,
            });
        }
        let in_host_process = options.isolations.iter().copied().find(|m| matches!(m, RunMode::Mpk | RunMode::None));
        if let (Some(mode), true) = (in_host_process, options.poison) {
            return Err(Error::PoisonNeedsProcess { mode });
        }
        if options.isolations.contains(&RunMode::Mpk) && !ward::mpk_available() {
            return Err(Error::MpkUnavailable);
        }
        if options.deadline.is_none() {
            // Under the default policy a call whose deadline is not learned yet (the workloads make few calls of
            // each function) runs up to the ceiling; a hang, and its retry's hang, must fit under the host's bound.
            let ceiling = ward::policy::ExtensionPolicy::default().deadline_ceiling;
            if options.host_timeout <= 2 * ceiling {
                return Err(Error::HostBoundTooShort {
                    bound_s: options.host_timeout.as_secs(),
                    ceiling_s: ceiling.as_secs(),
                });
            }
        }
        let config = CampaignConfig {
            extension,
            workload: workload.name().to_string(),
            extension_hash: fingerprint(&original),
            fault_types: options.fault_types,
            trials_per_type: options.trials_per_type,
            faults_per_trial: options.faults_per_trial,
            isolations: options.isolations,
            seed: options.seed,
            deadline_ms: options.deadline.map(|d| d.as_millis() as u64),
            host_timeout_ms: options.host_timeout.as_millis() as u64,
            fault_model: options.fault_model,
            poison: options.poison,
        };
        // A transient fault's restart loads this file, from wherever the domain runs.
        let path = std::path::absolute(&path).unwrap_or(path);
        Ok(Campaign { config, extension_path: path, original, out: options.out, jobs: options.jobs.max(1) })
    }

    pub fn run(&self, launcher: &dyn Launcher, observer: &dyn Observer) -> Result<Finished, Error> {
        let started = Instant::now();
        let config = &self.config;
        let (types, no_site) = plan::eligible(&self.extension_path, &self.original, &config.fault_types)?;
        if types.is_empty() {
            return Err(plan::nothing_to_inject(&config.extension, &no_site));
        }
        let modes = config.modes();
        let (mut store, earlier) = Store::open(&self.out, config, modes.len())?;
        let reference = self.reference(launcher, &store)?;
        self.preflight(launcher, &reference)?;

        let all = plan::trials(&types, config.trials_per_type);
        let done: HashSet<TrialId> = earlier.iter().map(RunRecord::trial_id).collect();
        let pending: Vec<TrialId> = all.iter().copied().filter(|t| !done.contains(t)).collect();
        observer.planned(all.len(), &earlier);

        let session = session_id();
        let work_dir = store.work_dir();
        let runner = TrialRunner {
            config,
            extension_path: &self.extension_path,
            original: &self.original,
            reference: &reference,
            work_dir: &work_dir,
            launcher,
            session: &session,
        };
        let mut records = earlier;
        let ran = run_parallel(&runner, &pending, self.jobs, |trial| {
            store.append(&trial)?;
            observer.trial_done(&trial);
            records.extend(trial);
            Ok(())
        })?;
        // Left empty by the trials; a leftover means one was interrupted, and the next invocation redoes it.
        let _ = std::fs::remove_dir(&work_dir);

        let order = |r: &RunRecord| (r.fault_type, r.trial, r.isolation);
        records.sort_by_key(order);
        Ok(Finished {
            config: config.clone(),
            records,
            reference,
            no_site,
            resumed_trials: done.len(),
            ran_trials: ran,
            elapsed: started.elapsed(),
        })
    }

    /// The unmutated extension's native output: measured now, and checked against the one recorded when the
    /// campaign began (a workload whose output varies from run to run would make every comparison meaningless).
    fn reference(&self, launcher: &dyn Launcher, store: &Store) -> Result<Vec<Entry>, Error> {
        let judged = run_and_judge(&self.config, launcher, &Run::clean(&self.extension_path, RunMode::Native), &[])?;
        let output = match (judged.run.end, judged.report) {
            (HostEnd::Exited(0), Some(report)) => report.output,
            _ => return Err(Error::Reference(judged.judgement.detail)),
        };
        match store.reference()? {
            Some(recorded) => match first_difference(&recorded, &output) {
                Some(diff) => Err(Error::ReferenceChanged { diff }),
                None => Ok(recorded),
            },
            None => {
                store.save_reference(&output)?;
                Ok(output)
            }
        }
    }

    /// Under each isolation kind the unmutated extension must give the reference output with no fault; otherwise
    /// the setup (or ward) is broken and every trial would be misjudged.
    fn preflight(&self, launcher: &dyn Launcher, reference: &[Entry]) -> Result<(), Error> {
        for &mode in &self.config.isolations {
            let judged = run_and_judge(&self.config, launcher, &Run::clean(&self.extension_path, mode), reference)?;
            if judged.judgement.outcome != Outcome::NoEffect {
                let detail = format!("{}: {}", judged.judgement.outcome, judged.judgement.detail);
                return Err(Error::Preflight { mode, detail });
            }
        }
        Ok(())
    }
}

/// Runs `pending` on `jobs` threads; `record` takes each finished trial's records on this thread, in the order
/// trials end. Stops at the first error (trials running then still finish and are recorded). Returns how many
/// trials ran.
fn run_parallel(
    runner: &TrialRunner<'_>,
    pending: &[TrialId],
    jobs: usize,
    mut record: impl FnMut(Vec<RunRecord>) -> Result<(), Error>,
) -> Result<usize, Error> {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let mut first_error = None;
    let mut ran = 0;
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        for _ in 0..jobs.min(pending.len()) {
            let tx = tx.clone();
            let (next, stop) = (&next, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let Some(&id) = pending.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
                    if tx.send(runner.run(id)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for result in rx {
            let recorded = result.and_then(&mut record);
            match recorded {
                Ok(()) => ran += 1,
                Err(e) => {
                    stop.store(true, Ordering::Release);
                    first_error.get_or_insert(e);
                }
            }
        }
    });
    match first_error {
        Some(e) => Err(e),
        None => Ok(ran),
    }
}

/// `UNIX-SECONDS.PID.N`: tells apart the invocations that ran a campaign's trials (N counts the runs of one
/// process, which may start several campaigns).
fn session_id() -> String {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{secs}.{}.{}", std::process::id(), RUNS.fetch_add(1, Ordering::Relaxed))
}
