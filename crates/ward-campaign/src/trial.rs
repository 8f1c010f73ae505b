//! One trial: mutate a copy of the extension (or, for a library fault kind, copy it unmutated and draw its library
//! fault), run it natively and under each isolation kind, each run in its own throwaway host, and judge every run
//! against the reference output.

use std::borrow::Cow;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use ward::libfault::LibraryFault;
use ward_inject::Plan;

use crate::classify::{classify, Judgement};
use crate::config::{CampaignConfig, FaultModel, RunMode};
use crate::error::Error;
use crate::launch::{HostRequest, HostRun, Launcher};
use crate::plan::{library_fault, TrialId};
use crate::record::{FaultSite, RunRecord};
use crate::trial_fault::TrialFault;
use crate::trial_host::HostReport;
use crate::workload::Entry;

/// What every trial of a campaign shares.
pub(crate) struct TrialRunner<'a> {
    pub config: &'a CampaignConfig,
    /// The unmutated extension: its path (for messages and its file name) and bytes.
    pub extension_path: &'a Path,
    pub original: &'a [u8],
    pub reference: &'a [Entry],
    pub work_dir: &'a Path,
    pub launcher: &'a dyn Launcher,
    pub session: &'a str,
}

/// One host run, judged.
pub(crate) struct Judged {
    pub run: HostRun,
    pub report: Option<HostReport>,
    pub judgement: Judgement,
    pub took: Duration,
}

impl TrialRunner<'_> {
    pub fn run(&self, id: TrialId) -> Result<Vec<RunRecord>, Error> {
        let seed = id.seed(self.config.seed);
        // A code fault mutates the copy; a library fault leaves it as it is and comes with every run.
        let (bytes, faults, library_fault) = match id.fault_type {
            TrialFault::Code(fault_type) => {
                let plan = Plan { fault_type, seed, count: self.config.faults_per_trial as usize, function: None };
                let injection = ward_inject::inject(self.original, &plan)
                    .map_err(|source| Error::Inject { path: self.extension_path.to_path_buf(), source })?;
                let faults: Vec<FaultSite> = injection.faults.iter().map(FaultSite::from).collect();
                (Cow::Owned(injection.bytes), faults, None)
            }
            TrialFault::Library(kind) => (Cow::Borrowed(self.original), Vec::new(), Some(library_fault(kind, seed)?)),
        };
        // The copy keeps the extension's file name: ward names an extension after its file. A library fault's copy
        // is a file of its own too, so that the fault's target (found by path) is this trial's and nothing else.
        let dir = self.work_dir.join(id.slug());
        let path = dir.join(self.extension_path.file_name().unwrap_or_else(|| "extension.so".as_ref()));
        write_extension(&dir, &path, &bytes)?;

        let restart_from = (self.config.fault_model == FaultModel::Transient).then_some(self.extension_path);
        let mut records = Vec::new();
        for mode in self.config.modes() {
            let run = Run { path: &path, restart_from, library_fault, mode };
            let judged = match run_and_judge(self.config, self.launcher, &run, self.reference) {
                Ok(j) => j,
                Err(e) => {
                    let _ = fs::remove_dir_all(&dir);
                    return Err(e);
                }
            };
            let report = judged.report.as_ref();
            records.push(RunRecord {
                extension: self.config.extension.clone(),
                fault_type: id.fault_type,
                trial: id.index,
                seed,
                isolation: mode,
                outcome: judged.judgement.outcome,
                detail: judged.judgement.detail,
                wrong_calls: judged.judgement.wrong_calls,
                failed_calls: judged.judgement.failed_calls,
                restarts: report.map_or(0, |r| r.restarts),
                faults: faults.clone(),
                library_fault,
                detected: report.map(|r| r.faults.clone()).unwrap_or_default(),
                hangs: report.map(|r| r.hangs.clone()).unwrap_or_default(),
                bypassed: report.map_or(0, |r| r.bypassed.len() as u32),
                duration_ms: judged.took.as_millis() as u64,
                session: self.session.to_string(),
            });
        }
        // The seed reproduces the copy (`ward inject`); keeping hundreds of them would only fill the disk.
        let _ = fs::remove_dir_all(&dir);
        Ok(records)
    }
}

/// One host run of an extension.
pub(crate) struct Run<'a> {
    /// The extension to load.
    pub path: &'a Path,
    /// Under ward, the file a restart loads instead (a transient fault); ignored natively.
    pub restart_from: Option<&'a Path>,
    /// A library fault for the calls `path` makes.
    pub library_fault: Option<LibraryFault>,
    pub mode: RunMode,
}

impl<'a> Run<'a> {
    /// The unmutated extension at `path`, with no fault: the reference and preflight runs.
    pub fn clean(path: &'a Path, mode: RunMode) -> Run<'a> {
        Run { path, restart_from: None, library_fault: None, mode }
    }
}

/// Do `run` in one throwaway host and judge it.
pub(crate) fn run_and_judge(
    config: &CampaignConfig,
    launcher: &dyn Launcher,
    run: &Run<'_>,
    reference: &[Entry],
) -> Result<Judged, Error> {
    let request = HostRequest {
        workload: &config.workload,
        path: run.path,
        restart_from: run.restart_from.filter(|_| run.mode != RunMode::Native),
        mode: run.mode,
        library_fault: run.library_fault,
        deadline: config.deadline_ms.map(Duration::from_millis),
        poison: config.poison && run.mode != RunMode::Native,
    };
    let started = Instant::now();
    let host = launcher.launch(&request, Duration::from_millis(config.host_timeout_ms))?;
    let took = started.elapsed();
    if let Some(message) = host.setup_error() {
        return Err(Error::HostSetup { mode: run.mode, message });
    }
    let report = host.report();
    let judgement = classify(host.end, &host.stderr, report.as_ref(), reference);
    Ok(Judged { run: host, report, judgement, took })
}

fn write_extension(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), Error> {
    fs::create_dir_all(dir).map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    fs::write(path, bytes).map_err(|e| Error::io(format!("cannot write {}", path.display()), e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io(format!("cannot make {} executable", path.display()), e))
}
