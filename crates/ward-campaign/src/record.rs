//! One run's record: the line written to `trials.jsonl` (and printed with `--json`) when its trial ends.

use serde::{Deserialize, Serialize};
use ward::libfault::LibraryFault;
use ward_inject::InjectedFault;

use crate::classify::Outcome;
use crate::config::RunMode;
use crate::plan::TrialId;
use crate::trial_fault::TrialFault;
use crate::trial_host::{HangDetection, SeenFault};

/// One run of one trial: a mutated extension (or, for a library fault kind, the unmutated one with a library fault)
/// run by one kind of host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub extension: String,
    /// A code fault type (`nop`) or a library fault kind (`alloc`).
    pub fault_type: TrialFault,
    /// The trial's number within its fault type, from 0.
    pub trial: u32,
    /// The trial's seed. For a code fault type, the injector's: `ward inject --type T --seed S --count N` writes
    /// the same mutated extension; for a library kind, what `library_fault` was drawn from.
    pub seed: u64,
    /// `native`, or the isolation kind under ward.
    pub isolation: RunMode,
    pub outcome: Outcome,
    /// What the outcome rests on: the signal, the fault ward saw, the first wrong result.
    pub detail: String,
    /// Calls whose result differs from the reference, and of those, calls that failed with an error (or were
    /// skipped) rather than return a wrong value.
    pub wrong_calls: u32,
    pub failed_calls: u32,
    /// Restarts of the extension under ward (0 natively).
    pub restarts: u64,
    /// The injected code faults (the same in every run of the trial; none for a library kind).
    pub faults: Vec<FaultSite>,
    /// A library kind's run-time library fault, as `ward::libfault` writes it (`alloc:nth=3,count=1`): natively
    /// the host process, under ward the extension's domain, ran with it (the same in every run of the trial).
    /// Absent for code fault types, and in records written before library faults existed.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "library_fault")]
    pub library_fault: Option<LibraryFault>,
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

/// A library fault by its text form, which `ward::libfault` reads back.
mod library_fault {
    use serde::{Deserialize, Deserializer, Serializer};
    use ward::libfault::LibraryFault;

    pub fn serialize<S: Serializer>(fault: &Option<LibraryFault>, s: S) -> Result<S::Ok, S::Error> {
        match fault {
            Some(f) => s.collect_str(f),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<LibraryFault>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| t.parse().map_err(serde::de::Error::custom)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line of a campaign recorded before library faults existed.
    const OLD: &str = r#"{"extension":"well","fault_type":"nop","trial":1,"seed":42,"isolation":"process","outcome":"recovered","detail":"d","wrong_calls":0,"failed_calls":0,"restarts":1,"faults":[{"function":"well_add","offset":4096,"function_offset":4,"before":"add eax, esi","after":"nop"}],"detected":[],"hangs":[],"bypassed":0,"duration_ms":12,"session":"1.2.0"}"#;

    #[test]
    fn old_records_read_back_and_library_faults_are_written_by_name() {
        let old: RunRecord = serde_json::from_str(OLD).unwrap();
        assert_eq!(old.fault_type, TrialFault::Code(ward_inject::FaultType::Nop));
        assert_eq!(old.library_fault, None);
        assert_eq!(serde_json::to_string(&old).unwrap(), OLD, "a code trial's record is written as it always was");

        let fault: LibraryFault = "alloc:nth=3,count=1".parse().unwrap();
        let new = RunRecord {
            fault_type: TrialFault::Library(fault.kind()),
            faults: Vec::new(),
            library_fault: Some(fault),
            ..old
        };
        let json = serde_json::to_string(&new).unwrap();
        assert!(
            json.contains(r#""fault_type":"alloc""#) && json.contains(r#""library_fault":"alloc:nth=3,count=1""#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<RunRecord>(&json).unwrap(), new);
        let bad = json.replace("nth=3", "nth=0");
        assert!(serde_json::from_str::<RunRecord>(&bad).is_err());
    }
}
