//! The campaign directory (`--out`): what makes a campaign resumable.
//!
//! - `campaign.json`: the configuration, written when the campaign starts; a later invocation with another
//!   configuration is refused, so records of different campaigns never mix.
//! - `reference.json`: the unmutated extension's native output.
//! - `trials.jsonl`: one [`RunRecord`] per line. A trial's lines are appended in one write when the trial ends, so
//!   an interruption loses at most the trials still running; a torn last line, or a trial with only some of its
//!   runs, is dropped when the directory is opened again and the trial runs anew.
//! - `work/`: the mutated copies of the trials running now (emptied when the directory is opened).
//! - `lock`: held while a campaign runs, so two invocations never write the same directory.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::config::CampaignConfig;
use crate::error::Error;
use crate::plan::TrialId;
use crate::record::RunRecord;
use crate::workload::Entry;

const CONFIG: &str = "campaign.json";
const REFERENCE: &str = "reference.json";
const TRIALS: &str = "trials.jsonl";
const WORK: &str = "work";
const LOCK: &str = "lock";

/// An open campaign directory.
pub struct Store {
    dir: PathBuf,
    trials: File,
    /// Holds the directory's lock until the store is dropped.
    _lock: File,
}

impl Store {
    /// Opens the directory for `config`, creating it if needed, and returns the records of every trial already
    /// complete (all `runs_per_trial` runs recorded).
    pub fn open(dir: &Path, config: &CampaignConfig, runs_per_trial: usize) -> Result<(Store, Vec<RunRecord>), Error> {
        fs::create_dir_all(dir).map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        let lock = lock(dir)?;
        // Copies left by an interrupted invocation: their trials were not recorded and will run again.
        let work = dir.join(WORK);
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(&work).map_err(|e| Error::io(format!("cannot create {}", work.display()), e))?;
        let trials_path = dir.join(TRIALS);
        let config_path = dir.join(CONFIG);
        match fs::read_to_string(&config_path) {
            Ok(text) => {
                let recorded: CampaignConfig = serde_json::from_str(&text).map_err(|e| Error::Damaged {
                    path: config_path.clone(),
                    line: e.line(),
                    reason: e.to_string(),
                })?;
                if let Some(differences) = recorded.differences(config) {
                    return Err(Error::OtherCampaign { out: dir.to_path_buf(), differences });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if fs::metadata(&trials_path).is_ok_and(|m| m.len() > 0) {
                    return Err(Error::Damaged {
                        path: trials_path,
                        line: 0,
                        reason: format!("records without the {CONFIG} that says which campaign they belong to"),
                    });
                }
                let text = serde_json::to_string_pretty(config)
                    .map_err(|source| Error::Json { what: "the configuration", source })?;
                write_atomically(&config_path, format!("{text}\n").as_bytes())?;
            }
            Err(e) => return Err(Error::io(format!("cannot read {}", config_path.display()), e)),
        }

        let (kept, dropped) = read_records(&trials_path, runs_per_trial)?;
        if dropped {
            // Rewrite without the torn line and the incomplete trials: they run again and must not be counted twice.
            write_atomically(&trials_path, lines(&kept)?.as_bytes())?;
        }
        let trials = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&trials_path)
            .map_err(|e| Error::io(format!("cannot open {}", trials_path.display()), e))?;
        Ok((Store { dir: dir.to_path_buf(), trials, _lock: lock }, kept))
    }

    /// Where mutated copies are written.
    pub fn work_dir(&self) -> PathBuf {
        self.dir.join(WORK)
    }

    /// Appends one trial's records in a single write.
    pub fn append(&mut self, records: &[RunRecord]) -> Result<(), Error> {
        let text = lines(records)?;
        self.trials
            .write_all(text.as_bytes())
            .map_err(|e| Error::io(format!("cannot append to {}", self.dir.join(TRIALS).display()), e))
    }

    /// The reference output recorded when the campaign started, if any.
    pub fn reference(&self) -> Result<Option<Vec<Entry>>, Error> {
        let path = self.dir.join(REFERENCE);
        match fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| Error::Damaged {
                path,
                line: e.line(),
                reason: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("cannot read {}", path.display()), e)),
        }
    }

    pub fn save_reference(&self, reference: &[Entry]) -> Result<(), Error> {
        let text = serde_json::to_string_pretty(reference)
            .map_err(|source| Error::Json { what: "the reference output", source })?;
        write_atomically(&self.dir.join(REFERENCE), format!("{text}\n").as_bytes())
    }
}

/// Takes the directory's lock, or says another campaign holds it. The kernel drops the lock with the process, so a
/// killed campaign never leaves it behind.
fn lock(dir: &Path) -> Result<File, Error> {
    let path = dir.join(LOCK);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    // SAFETY: flock only reads the descriptor, which `file` keeps open for the call.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Error::Busy { out: dir.to_path_buf() },
            _ => Error::io(format!("cannot lock {}", path.display()), e),
        });
    }
    Ok(file)
}

/// The records of complete trials, and whether anything (a torn line, an incomplete trial) was left out.
fn read_records(path: &Path, runs_per_trial: usize) -> Result<(Vec<RunRecord>, bool), Error> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), false)),
        Err(e) => return Err(Error::io(format!("cannot read {}", path.display()), e)),
    };
    // Only a line ended by a newline was written whole.
    let whole = text.rfind('\n').map_or("", |i| &text[..=i]);
    let mut dropped = whole.len() != text.len();
    let mut records = Vec::new();
    for (i, line) in whole.lines().enumerate() {
        let record: RunRecord = serde_json::from_str(line).map_err(|e| Error::Damaged {
            path: path.to_path_buf(),
            line: i + 1,
            reason: e.to_string(),
        })?;
        records.push(record);
    }
    let mut runs: HashMap<TrialId, usize> = HashMap::new();
    for r in &records {
        *runs.entry(r.trial_id()).or_default() += 1;
    }
    let before = records.len();
    records.retain(|r| runs.get(&r.trial_id()) == Some(&runs_per_trial));
    dropped |= records.len() != before;
    Ok((records, dropped))
}

fn lines(records: &[RunRecord]) -> Result<String, Error> {
    let mut text = String::new();
    for r in records {
        text.push_str(&serde_json::to_string(r).map_err(|source| Error::Json { what: "a trial record", source })?);
        text.push('\n');
    }
    Ok(text)
}

/// Through a temporary file and a rename, so a reader never sees half a file.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let result = fs::write(&tmp, bytes).and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Outcome;
    use crate::config::{fingerprint, RunMode};
    use ward_inject::FaultType;

    fn config(seed: u64) -> CampaignConfig {
        CampaignConfig {
            extension: "well".into(),
            workload: "well".into(),
            extension_hash: fingerprint(b"well"),
            fault_types: vec![FaultType::Nop.into()],
            trials_per_type: 3,
            faults_per_trial: 5,
            isolations: vec![RunMode::Process],
            seed,
            deadline_ms: Some(2000),
            host_timeout_ms: 20_000,
            fault_model: crate::FaultModel::Persistent,
            poison: false,
        }
    }

    fn record(trial: u32, isolation: RunMode) -> RunRecord {
        RunRecord {
            extension: "well".into(),
            fault_type: FaultType::Nop.into(),
            trial,
            seed: 1,
            isolation,
            outcome: Outcome::NoEffect,
            detail: String::new(),
            wrong_calls: 0,
            failed_calls: 0,
            restarts: 0,
            faults: Vec::new(),
            library_fault: None,
            detected: Vec::new(),
            hangs: Vec::new(),
            bypassed: 0,
            duration_ms: 1,
            session: "s".into(),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ward-campaign-store-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn keeps_complete_trials_and_refuses_another_campaign() {
        let dir = scratch("resume");
        let (mut store, old) = Store::open(&dir, &config(1), 2).unwrap();
        assert!(old.is_empty());
        store.append(&[record(0, RunMode::Native), record(0, RunMode::Process)]).unwrap();
        store.append(&[record(1, RunMode::Native), record(1, RunMode::Process)]).unwrap();
        drop(store);

        let (_, again) = Store::open(&dir, &config(1), 2).unwrap();
        assert_eq!(again.len(), 4);

        let err = Store::open(&dir, &config(2), 2).err().expect("another seed is another campaign");
        assert!(err.is_bad_input());
        assert!(err.to_string().contains("seed 1 recorded, 2 asked"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn drops_a_torn_line_and_an_incomplete_trial() {
        let dir = scratch("torn");
        let (mut store, _) = Store::open(&dir, &config(1), 2).unwrap();
        store.append(&[record(0, RunMode::Native), record(0, RunMode::Process)]).unwrap();
        // Trial 1 was cut short: its native line is whole, its process line torn.
        store.append(&[record(1, RunMode::Native)]).unwrap();
        drop(store);
        let mut f = OpenOptions::new().append(true).open(dir.join(TRIALS)).unwrap();
        f.write_all(br#"{"extension":"we"#).unwrap();
        drop(f);

        let (_, kept) = Store::open(&dir, &config(1), 2).unwrap();
        assert_eq!(kept.iter().map(|r| r.trial).collect::<Vec<_>>(), [0, 0]);
        let text = fs::read_to_string(dir.join(TRIALS)).unwrap();
        assert_eq!(text.lines().count(), 2, "rewritten without the partial trial: {text}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn one_campaign_at_a_time_per_directory() {
        let dir = scratch("busy");
        let (held, _) = Store::open(&dir, &config(1), 2).unwrap();
        let err = Store::open(&dir, &config(1), 2).err().expect("the directory is in use");
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        drop(held);
        assert!(Store::open(&dir, &config(1), 2).is_ok());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn refuses_a_damaged_line() {
        let dir = scratch("damaged");
        let (store, _) = Store::open(&dir, &config(1), 2).unwrap();
        drop(store);
        fs::write(dir.join(TRIALS), "not json\n").unwrap();
        let err = Store::open(&dir, &config(1), 2).err().expect("damaged");
        assert!(matches!(err, Error::Damaged { line: 1, .. }), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }
}
