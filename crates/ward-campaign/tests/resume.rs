//! Campaigns end to end with a stand-in launcher: no process is started, every host's end is made up, and each
//! launch is counted, so what a campaign runs again after an interruption is known exactly.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ward::libfault::{LibraryFault, LibraryFaultKind};
use ward_campaign::trial_host::{HostReport, SeenFault};
use ward_campaign::workload::Entry;
use ward_campaign::{
    Campaign, Error, FaultModel, HostEnd, HostRequest, HostRun, Launcher, Observer, Options, Outcome, RunMode,
    RunRecord, TrialFault,
};
use ward_inject::FaultType;

/// Native hosts of mutated copies crash; isolated ones recover with the reference output. After `fail_after`
/// trial launches every further one fails, as if the machine ran out of processes.
struct Stand {
    original: PathBuf,
    launches: AtomicUsize,
    trial_launches: AtomicUsize,
    fail_after: usize,
    /// Every launch's isolation, whether it was a trial's, and the file it was to restart from.
    restart_froms: Mutex<Vec<(RunMode, bool, Option<PathBuf>)>>,
    /// Every launch, with its library fault.
    faults: Mutex<Vec<Launched>>,
}

/// One launch as the stand-in saw it.
#[derive(Debug, Clone)]
struct Launched {
    mode: RunMode,
    /// The trial copy's directory (`alloc-0002`); `None` for the original.
    slug: Option<String>,
    fault: Option<LibraryFault>,
    /// The file to load held the original's bytes.
    unmutated: bool,
    /// Its calls were to be poisoned.
    poison: bool,
}

impl Stand {
    fn new(original: &Path, fail_after: usize) -> Stand {
        Stand {
            original: original.to_path_buf(),
            launches: AtomicUsize::new(0),
            trial_launches: AtomicUsize::new(0),
            fail_after,
            restart_froms: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
        }
    }
}

fn reference() -> Vec<Entry> {
    vec![Entry { call: "well_add(2, 40)".into(), result: "42".into() }]
}

fn printed(report: &HostReport) -> String {
    serde_json::to_string(report).expect("a report encodes")
}

impl Launcher for Stand {
    fn launch(&self, request: &HostRequest<'_>, _bound: Duration) -> Result<HostRun, Error> {
        self.launches.fetch_add(1, Ordering::SeqCst);
        let trial = request.path != self.original;
        self.restart_froms.lock().unwrap().push((request.mode, trial, request.restart_from.map(Path::to_path_buf)));
        let slug = trial.then(|| {
            let dir =
                request.path.parent().and_then(Path::file_name).expect("a trial's copy is in a directory of its own");
            dir.to_string_lossy().into_owned()
        });
        let unmutated = std::fs::read(request.path).expect("the copy exists while it runs")
            == std::fs::read(&self.original).expect("the original");
        self.faults.lock().unwrap().push(Launched {
            mode: request.mode,
            slug,
            fault: request.library_fault,
            unmutated,
            poison: request.poison,
        });
        let exited =
            |report: HostReport| HostRun { end: HostEnd::Exited(0), stdout: printed(&report), stderr: String::new() };
        if request.path == self.original {
            return Ok(exited(HostReport { output: reference(), ..HostReport::default() }));
        }
        if self.trial_launches.fetch_add(1, Ordering::SeqCst) >= self.fail_after {
            return Err(Error::Launch("out of processes".into()));
        }
        Ok(match request.mode {
            RunMode::Native => {
                HostRun { end: HostEnd::Signaled(libc::SIGSEGV), stdout: String::new(), stderr: String::new() }
            }
            _ => exited(HostReport {
                output: reference(),
                faults: vec![SeenFault {
                    kind: "signal".into(),
                    cause: "null dereference (SIGSEGV at 0x0)".into(),
                    call: Some("well_add".into()),
                }],
                restarts: 1,
                ..HostReport::default()
            }),
        })
    }
}

struct Quiet;
impl Observer for Quiet {}

fn options(out: &Path, seed: u64) -> Options {
    Options {
        extension_path: ward_extensions::path_of("well").expect("the built-in well.so"),
        fault_types: vec![FaultType::Pointer.into(), FaultType::Nop.into()],
        trials_per_type: 3,
        faults_per_trial: 5,
        isolations: vec![RunMode::Process],
        seed,
        deadline: Some(Duration::from_millis(200)),
        host_timeout: Duration::from_secs(3),
        fault_model: FaultModel::Persistent,
        poison: false,
        out: out.to_path_buf(),
        jobs: 2,
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ward-campaign-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn sessions(records: &[RunRecord]) -> BTreeSet<&str> {
    records.iter().map(|r| r.session.as_str()).collect()
}

#[test]
fn a_finished_campaign_runs_nothing_again_and_refuses_another_seed() {
    let out = scratch("finished");
    let campaign = Campaign::new(options(&out, 1)).expect("a campaign");
    let stand = Stand::new(&campaign.extension_path, usize::MAX);
    let first = campaign.run(&stand, &Quiet).expect("the campaign runs");
    // One reference run, one preflight, then six trials of two runs each.
    assert_eq!(stand.launches.load(Ordering::SeqCst), 2 + 6 * 2);
    assert_eq!(first.records.len(), 12);
    assert_eq!(first.ran_trials, 6);
    for r in &first.records {
        let expected = if r.isolation == RunMode::Native { Outcome::HostCrashed } else { Outcome::Recovered };
        assert_eq!(r.outcome, expected, "{r:?}");
        assert!(!r.faults.is_empty(), "{r:?}");
    }

    let stand = Stand::new(&campaign.extension_path, usize::MAX);
    let again = campaign.run(&stand, &Quiet).expect("the campaign resumes");
    assert_eq!(stand.launches.load(Ordering::SeqCst), 2, "only the reference and the preflight run again");
    assert_eq!((again.ran_trials, again.resumed_trials), (0, 6));
    assert_eq!(again.records, first.records);

    let other = Campaign::new(options(&out, 2)).expect("a campaign");
    let err = other.run(&Stand::new(&other.extension_path, usize::MAX), &Quiet).expect_err("another seed");
    assert!(err.is_bad_input());
    assert!(err.to_string().contains("seed 1 recorded, 2 asked"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn an_interrupted_campaign_runs_only_what_is_missing() {
    let out = scratch("interrupted");
    let campaign = Campaign::new(options(&out, 3)).expect("a campaign");
    // Eight trial launches succeed, the ninth fails: at most four trials end whole, and the campaign stops.
    let stand = Stand::new(&campaign.extension_path, 8);
    let err = campaign.run(&stand, &Quiet).expect_err("the launcher fails");
    assert!(matches!(err, Error::Launch(_)), "{err}");

    let stand = Stand::new(&campaign.extension_path, usize::MAX);
    let finished = campaign.run(&stand, &Quiet).expect("the campaign resumes");
    assert_eq!(finished.records.len(), 12);
    assert_eq!(finished.resumed_trials + finished.ran_trials, 6);
    assert!(finished.resumed_trials >= 1 && finished.resumed_trials <= 4, "{}", finished.resumed_trials);
    assert_eq!(stand.trial_launches.load(Ordering::SeqCst), 2 * finished.ran_trials, "no recorded trial ran again");
    assert_eq!(sessions(&finished.records).len(), 2, "two invocations ran the trials");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_transient_campaign_restarts_isolated_trials_from_the_unmutated_file() {
    for model in [FaultModel::Persistent, FaultModel::Transient] {
        let out = scratch(&format!("model-{model}"));
        let campaign = Campaign::new(Options { fault_model: model, ..options(&out, 4) }).expect("a campaign");
        assert_eq!(campaign.config.fault_model, model);
        let stand = Stand::new(&campaign.extension_path, usize::MAX);
        campaign.run(&stand, &Quiet).expect("the campaign runs");
        let launches = stand.restart_froms.lock().unwrap().clone();
        assert_eq!(launches.len(), 2 + 6 * 2);
        for (mode, trial, restart_from) in launches {
            let expected = (model == FaultModel::Transient && trial && mode != RunMode::Native)
                .then(|| campaign.extension_path.clone());
            assert_eq!(restart_from, expected, "{model}: a {mode} launch (trial: {trial})");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn a_poisoned_campaign_poisons_every_run_under_ward_and_no_native_one_and_resumes_only_as_such() {
    for poison in [false, true] {
        let out = scratch(&format!("poison-{poison}"));
        let campaign = Campaign::new(Options { poison, ..options(&out, 7) }).expect("a campaign");
        assert_eq!(campaign.config.poison, poison);
        let stand = Stand::new(&campaign.extension_path, usize::MAX);
        campaign.run(&stand, &Quiet).expect("the campaign runs");
        let launches = stand.faults.lock().unwrap().clone();
        assert_eq!(launches.len(), 2 + 6 * 2);
        for launch in &launches {
            assert_eq!(launch.poison, poison && launch.mode != RunMode::Native, "{launch:?}");
        }
        if poison {
            // Resuming with the other setting would mix two kinds of trial in one table: refused.
            let err = Campaign::new(Options { poison: false, ..options(&out, 7) })
                .and_then(|c| c.run(&Stand::new(&campaign.extension_path, usize::MAX), &Quiet).map(|_| ()))
                .expect_err("a campaign recorded poisoned does not resume unpoisoned");
            assert!(err.to_string().contains("poisoned calls true recorded, false asked"), "{err}");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// A library-fault trial loads an unmutated copy, and its fault goes with both its runs: the native host's (whose
/// launcher sets it in the environment) and the isolated one's (whose host puts it in the extension's policy). Code
/// trials and the reference and preflight runs have none.
#[test]
fn library_fault_trials_carry_their_fault_to_native_and_isolated_hosts() {
    let out = scratch("library");
    let types: Vec<TrialFault> =
        vec![FaultType::Nop.into(), LibraryFaultKind::Alloc.into(), LibraryFaultKind::CopyOverrun.into()];
    let campaign = Campaign::new(Options { fault_types: types.clone(), ..options(&out, 5) }).expect("a campaign");
    let stand = Stand::new(&campaign.extension_path, usize::MAX);
    let finished = campaign.run(&stand, &Quiet).expect("the campaign runs");
    assert!(finished.no_site.is_empty(), "well.so imports malloc, free and memcpy");
    assert_eq!(finished.records.len(), 3 * 3 * 2);

    let launches = stand.faults.lock().unwrap().clone();
    assert_eq!(launches.len(), 2 + 3 * 3 * 2);
    let mut by_trial: std::collections::BTreeMap<String, Vec<(RunMode, Option<LibraryFault>)>> = Default::default();
    for Launched { mode, slug, fault, unmutated, .. } in launches {
        let Some(slug) = slug else {
            assert_eq!(fault, None, "the reference and preflight runs ({mode}) have no fault");
            continue;
        };
        let library = slug.starts_with("alloc-") || slug.starts_with("copy-overrun-");
        assert_eq!(unmutated, library, "{slug}: only a code trial's copy is mutated");
        assert_eq!(fault.is_some(), library, "{slug} ({mode}): {fault:?}");
        if let Some(f) = fault {
            assert!(slug.starts_with(&format!("{}-", f.kind())), "{slug}: {f}");
            assert!((1..=8).contains(&f.nth()), "{f}");
        }
        by_trial.entry(slug).or_default().push((mode, fault));
    }
    assert_eq!(by_trial.len(), 9);
    for (slug, runs) in &by_trial {
        let modes: BTreeSet<RunMode> = runs.iter().map(|r| r.0).collect();
        assert_eq!(modes, BTreeSet::from([RunMode::Native, RunMode::Process]), "{slug}");
        assert_eq!(runs[0].1, runs[1].1, "{slug}: the native and the isolated run get the same fault");
    }

    for r in &finished.records {
        match r.fault_type {
            TrialFault::Code(_) => assert!(!r.faults.is_empty() && r.library_fault.is_none(), "{r:?}"),
            TrialFault::Library(kind) => {
                let fault = r.library_fault.unwrap_or_else(|| panic!("no library fault: {r:?}"));
                assert_eq!(fault.kind(), kind);
                assert!(r.faults.is_empty(), "{r:?}");
                let slug = format!("{}-{:04}", kind, r.trial);
                assert!(
                    by_trial[&slug].iter().all(|run| run.1 == Some(fault)),
                    "{slug}: the record names the fault run"
                );
            }
        }
    }
    let order: Vec<TrialFault> = finished.records.iter().map(|r| r.fault_type).collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "records in type order: {order:?}");

    // Resumed, nothing runs again, and the faults read back from trials.jsonl.
    let again = campaign.run(&Stand::new(&campaign.extension_path, usize::MAX), &Quiet).expect("resumes");
    assert_eq!((again.ran_trials, again.resumed_trials), (0, 9));
    assert_eq!(again.records, finished.records);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn library_kinds_are_refused_under_isolation_none_before_anything_runs() {
    let out = scratch("library-none");
    let options = Options {
        fault_types: vec![FaultType::Nop.into(), LibraryFaultKind::Leak.into()],
        isolations: vec![RunMode::Process, RunMode::None],
        ..options(&out, 6)
    };
    let err = Campaign::new(options).expect_err("library faults need a domain");
    assert!(err.is_bad_input(), "{err}");
    assert!(err.to_string().contains("library fault kinds (leak) cannot run under isolation `none`"), "{err}");
    assert!(!out.exists());
}
