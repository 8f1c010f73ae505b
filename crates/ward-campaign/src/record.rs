//! One run's record: the line written to `trials.jsonl` (and printed with `--json`) when its trial ends.

use serde::{Deserialize, Serialize};
use ward_inject::{FaultType, InjectedFault};

use crate::classify::Outcome;
use crate::config::Mode;
use crate::host::{HangDetection, SeenFault};
use crate::plan::TrialId;

/// One run of one trial: a mutated extension run by one kind of host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub extension: String,
    #[serde(with = "crate::config::fault_type")]
    pub fault_type: FaultType,
    /// The trial's number within its fault type, from 0.
    pub trial: u32,
    /// The injector's seed: `ward inject --type T --seed S --count N` writes the same mutated extension.
    pub seed: u64,
    /// `native`, or the isolation kind under ward.
    pub isolation: Mode,
    pub outcome: Outcome,
    /// What the outcome rests on: the signal, the fault ward saw, the first wrong result.
    pub detail: String,
    /// Calls whose result differs from the reference, and of those, calls that failed with an error (or were
    /// skipped) rather than return a wrong value.
    pub wrong_calls: u32,
    pub failed_calls: u32,
    /// Restarts of the extension under ward (0 natively).
    pub restarts: u64,
    /// The injected faults (the same in every run of the trial).
    pub faults: Vec<FaultSite>,
    /// Faults ward reported, in order (none natively).
    pub detected: Vec<SeenFault>,
    /// Hangs ward detected, each with how long it took.
    pub hangs: Vec<HangDetection>,
    /// Calls the class wrapper bypassed (blocks or frames the plugin could not process; 0 natively).
    #[serde(default)]
    pub bypassed: u32,
    /// Wall time of the host process.
    pub duration_ms: u64,
    /// Which invocation of `ward campaign` ran it: `UNIX-SECONDS.PID.N`.
    pub session: String,
}

impl RunRecord {
    pub fn trial_id(&self) -> TrialId {
        TrialId { fault_type: self.fault_type, index: self.trial }
    }
}

/// One injected fault, as `ward inject` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultSite {
    pub function: String,
    /// File offset of the mutated instruction.
    pub offset: u64,
    pub function_offset: u64,
    /// The original instruction and what replaced it, Intel syntax.
    pub before: String,
    pub after: String,
}

impl From<&InjectedFault> for FaultSite {
    fn from(f: &InjectedFault) -> FaultSite {
        FaultSite {
            function: f.function.clone(),
            offset: f.offset,
            function_offset: f.function_offset,
            before: f.before.clone(),
            after: f.after.clone(),
        }
    }
}
