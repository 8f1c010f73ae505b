//! One trial: mutate a copy of the extension, run it natively and under each isolation kind, each run in its own
//! throwaway host, and judge every run against the reference output.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use ward_inject::Plan;

use crate::classify::{classify, Judgement};
use crate::config::{CampaignConfig, FaultModel, Mode};
use crate::error::Error;
use crate::host::HostReport;
use crate::launch::{HostRequest, HostRun, Launcher};
use crate::plan::TrialId;
use crate::record::{FaultSite, RunRecord};
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
        let plan =
            Plan { fault_type: id.fault_type, seed, count: self.config.faults_per_trial as usize, function: None };
        let injection = ward_inject::inject(self.original, &plan)
            .map_err(|source| Error::Inject { path: self.extension_path.to_path_buf(), source })?;
        // The copy keeps the extension's file name: ward names an extension after its file.
        let dir = self.work_dir.join(id.slug());
        let path = dir.join(self.extension_path.file_name().unwrap_or_else(|| "extension.so".as_ref()));
        write_extension(&dir, &path, &injection.bytes)?;
        let faults: Vec<FaultSite> = injection.faults.iter().map(FaultSite::from).collect();

        let restart_from = (self.config.fault_model == FaultModel::Transient).then_some(self.extension_path);
        let mut records = Vec::new();
        for mode in self.config.modes() {
            let judged = match run_and_judge(self.config, self.launcher, &path, restart_from, mode, self.reference) {
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

/// Run the workload on the extension at `path` in one throwaway host and judge the run. Under ward, a restart
/// loads `restart_from` when given (a transient fault).
pub(crate) fn run_and_judge(
    config: &CampaignConfig,
    launcher: &dyn Launcher,
    path: &Path,
    restart_from: Option<&Path>,
    mode: Mode,
    reference: &[Entry],
) -> Result<Judged, Error> {
    let request = HostRequest {
        workload: &config.workload,
        path,
        restart_from: restart_from.filter(|_| mode != Mode::Native),
        mode,
        deadline: Duration::from_millis(config.deadline_ms),
    };
    let started = Instant::now();
    let run = launcher.launch(&request, Duration::from_millis(config.host_timeout_ms))?;
    let took = started.elapsed();
    if let Some(message) = run.setup_error() {
        return Err(Error::HostSetup { mode, message });
    }
    let report = run.report();
    let judgement = classify(run.end, &run.stderr, report.as_ref(), reference);
    Ok(Judged { run, report, judgement, took })
}

fn write_extension(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), Error> {
    fs::create_dir_all(dir).map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    fs::write(path, bytes).map_err(|e| Error::io(format!("cannot write {}", path.display()), e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io(format!("cannot make {} executable", path.display()), e))
}
