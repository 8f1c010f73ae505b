//! What a campaign is: the extension, the fault types, how many trials of each and faults per trial, the isolation
//! kinds to compare with the native host, the seed and the time bounds. Two invocations with equal configurations
//! are the same campaign, so the records of one stand for the other (that is how a campaign resumes).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use ward::Isolation;

use crate::error::Error;
use crate::trial_fault::TrialFault;

/// How a trial's host runs the extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunMode {
    /// Loaded with dlopen and called directly, as hosts do without ward.
    Native,
    /// Under ward, in an mpk domain: the host's own process, behind protection keys.
    Mpk,
    /// Under ward, in a `ward-domain` process.
    Process,
    /// Under ward with isolation `none`: interposed and tracked, but in the host's own process.
    None,
}

impl RunMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RunMode::Native => "native",
            RunMode::Mpk => "mpk",
            RunMode::Process => "process",
            RunMode::None => "none",
        }
    }

    /// The isolation kind ward is asked for; `None` for the native host.
    pub fn isolation(self) -> Option<Isolation> {
        match self {
            RunMode::Native => None,
            RunMode::Mpk => Some(Isolation::Mpk),
            RunMode::Process => Some(Isolation::Process),
            RunMode::None => Some(Isolation::None),
        }
    }
}

impl fmt::Display for RunMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunMode {
    type Err = Error;

    /// The isolation kinds a campaign can compare: `mpk`, `process` and `none` (and `native`, for the hidden host).
    fn from_str(s: &str) -> Result<RunMode, Error> {
        match s {
            "native" => Ok(RunMode::Native),
            "mpk" => Ok(RunMode::Mpk),
            "process" => Ok(RunMode::Process),
            "none" => Ok(RunMode::None),
            "auto" => Err(Error::UnknownIsolation {
                given: s.to_string(),
                hint: " (auto would mean mpk or process by machine and extension: name the kinds to compare)",
            }),
            _ => Err(Error::UnknownIsolation { given: s.to_string(), hint: "" }),
        }
    }
}

/// Where an injected fault lives, which decides what a restart under ward brings back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultModel {
    /// In the file: every incarnation loads the mutated copy, so a restart runs the same faulty code again.
    #[default]
    Persistent,
    /// In the loaded image, as Nooks' and NewtOS's injectors patched running code: the first incarnation runs the
    /// mutated copy, and a restart loads the unmutated file (ward's `restart_from`).
    Transient,
}

impl FaultModel {
    pub fn as_str(self) -> &'static str {
        match self {
            FaultModel::Persistent => "persistent",
            FaultModel::Transient => "transient",
        }
    }
}

impl fmt::Display for FaultModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultModel {
    type Err = Error;

    fn from_str(s: &str) -> Result<FaultModel, Error> {
        match s {
            "persistent" => Ok(FaultModel::Persistent),
            "transient" => Ok(FaultModel::Transient),
            _ => Err(Error::UnknownFaultModel { given: s.to_string() }),
        }
    }
}

/// Everything that decides which trials a campaign runs and how they are judged (not how fast: `--jobs` is not
/// here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CampaignConfig {
    /// The extension's name (as ward names it: `well`, `amp_1181`).
    pub extension: String,
    /// Its workload: `well`, `ladspa` or `frei0r`. Campaigns recorded before plugins had workloads were all of
    /// `well`.
    #[serde(default = "well")]
    pub workload: String,
    /// FNV-1a (64 bit, hex) of the unmutated extension: a rebuilt extension makes another campaign.
    pub extension_hash: String,
    /// Fault types asked for, in [`TrialFault`] order (code types, then library kinds), by name.
    pub fault_types: Vec<TrialFault>,
    pub trials_per_type: u32,
    pub faults_per_trial: u32,
    /// Isolation kinds each trial also runs under (the native run always comes first).
    pub isolations: Vec<RunMode>,
    pub seed: u64,
    /// Deadline of every call under ward, which then runs the extension with the workload's policy for campaigns
    /// (this deadline, a restart budget, short backoffs, history for plugins); `None`: with ward's default policy
    /// only (deadlines learned from each function's calls, the default restart limits, backoff and history), as a
    /// user who never tuned it runs plugins. The trial's own settings (the fault model's `restart_from`, a library
    /// fault, `poison`) are added either way. Campaigns recorded before the default policy could be asked for all
    /// had a deadline.
    pub deadline_ms: Option<u64>,
    /// A host still running after this long is hung: it is killed.
    pub host_timeout_ms: u64,
    /// Where the faults live. Campaigns recorded before this field were all persistent.
    #[serde(default)]
    pub fault_model: FaultModel,
    /// Under ward the extension's calls were poisoned (policy `poison`). Campaigns recorded before this field were
    /// not.
    #[serde(default)]
    pub poison: bool,
}

impl CampaignConfig {
    /// The runs of each trial: native first, then each isolation kind.
    pub fn modes(&self) -> Vec<RunMode> {
        std::iter::once(RunMode::Native).chain(self.isolations.iter().copied()).collect()
    }

    /// Field by field, what differs from `other` (`seed 1 recorded, 2 asked`), or `None` when they are equal.
    pub fn differences(&self, asked: &CampaignConfig) -> Option<String> {
        let mut out = Vec::new();
        let mut check = |name: &str, recorded: String, now: String| {
            if recorded != now {
                out.push(format!("{name} {recorded} recorded, {now} asked"));
            }
        };
        check("extension", self.extension.clone(), asked.extension.clone());
        check("workload", self.workload.clone(), asked.workload.clone());
        check("extension hash", self.extension_hash.clone(), asked.extension_hash.clone());
        check("types", type_list(&self.fault_types), type_list(&asked.fault_types));
        check("trials per type", self.trials_per_type.to_string(), asked.trials_per_type.to_string());
        check("faults per trial", self.faults_per_trial.to_string(), asked.faults_per_trial.to_string());
        check("isolation", mode_list(&self.isolations), mode_list(&asked.isolations));
        check("seed", self.seed.to_string(), asked.seed.to_string());
        check("policy", policy_name(self.deadline_ms), policy_name(asked.deadline_ms));
        check("host timeout", format!("{} ms", self.host_timeout_ms), format!("{} ms", asked.host_timeout_ms));
        check("fault model", self.fault_model.to_string(), asked.fault_model.to_string());
        check("poisoned calls", self.poison.to_string(), asked.poison.to_string());
        (!out.is_empty()).then(|| out.join("; "))
    }
}

fn well() -> String {
    "well".into()
}

/// The policy runs under ward get, for messages: "a 500 ms deadline", "the default policy".
fn policy_name(deadline_ms: Option<u64>) -> String {
    match deadline_ms {
        Some(ms) => format!("a {ms} ms deadline"),
        None => "the default policy".into(),
    }
}

/// Fault type names separated by commas: code fault types (`nop`), library fault kinds (`alloc`), and the
/// keywords `all` (every code fault type) and `library` (every library fault kind), mixed at will; returned in
/// [`TrialFault`] order without repeats.
pub fn parse_types(text: &str) -> Result<Vec<TrialFault>, Error> {
    let mut types = Vec::new();
    for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match name {
            "all" => types.extend(TrialFault::all_code()),
            "library" => types.extend(TrialFault::all_library()),
            _ => types.push(name.parse::<TrialFault>()?),
        }
    }
    if types.is_empty() {
        return Err(Error::EmptyList { what: "--types" });
    }
    types.sort();
    types.dedup();
    Ok(types)
}

/// Isolation kinds separated by commas (`mpk`, `process`, `none`), without repeats, in that order.
pub fn parse_isolations(text: &str) -> Result<Vec<RunMode>, Error> {
    let mut modes = Vec::new();
    for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match name.parse::<RunMode>()? {
            RunMode::Native => {
                return Err(Error::UnknownIsolation { given: name.into(), hint: " (native always runs)" })
            }
            mode => modes.push(mode),
        }
    }
    if modes.is_empty() {
        return Err(Error::EmptyList { what: "--isolation" });
    }
    modes.sort();
    modes.dedup();
    Ok(modes)
}

pub fn type_list(types: &[TrialFault]) -> String {
    types.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(",")
}

fn mode_list(modes: &[RunMode]) -> String {
    modes.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(",")
}

/// FNV-1a, 64 bit, as 16 hex digits: a fingerprint for equality checks, not a defence against anyone.
pub fn fingerprint(bytes: &[u8]) -> String {
    format!("{:016x}", crate::workload::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ward::libfault::LibraryFaultKind;
    use ward_inject::FaultType;

    fn code(types: &[FaultType]) -> Vec<TrialFault> {
        types.iter().map(|&t| t.into()).collect()
    }

    #[test]
    fn parses_types_in_table_order_without_repeats() {
        assert_eq!(parse_types("all").unwrap(), code(&FaultType::ALL));
        assert_eq!(parse_types("nop, branch,nop").unwrap(), code(&[FaultType::Branch, FaultType::Nop]));
        let err = parse_types("nop,bogus").unwrap_err();
        assert!(err.is_bad_input());
        let msg = err.to_string();
        assert!(msg.contains("`bogus`") && msg.contains("off-by-one") && msg.contains("all"), "{msg}");
        assert!(msg.contains("alloc, leak, copy-overrun") && msg.contains("`library`"), "{msg}");
        assert!(matches!(parse_types(" , "), Err(Error::EmptyList { .. })));
    }

    #[test]
    fn parses_library_kinds_and_mixes_them_with_code_types() {
        let library: Vec<TrialFault> =
            [LibraryFaultKind::Alloc, LibraryFaultKind::Leak, LibraryFaultKind::CopyOverrun].map(Into::into).to_vec();
        assert_eq!(parse_types("library").unwrap(), library);
        assert_eq!(parse_types("copy-overrun,alloc,leak,alloc").unwrap(), library, "in their order, once each");
        let mixed = parse_types("alloc,nop").unwrap();
        assert_eq!(mixed, vec![FaultType::Nop.into(), LibraryFaultKind::Alloc.into()], "code types first");
        let everything = parse_types("library, all").unwrap();
        assert_eq!(everything.len(), 13);
        assert_eq!(everything[..10], code(&FaultType::ALL)[..], "`all` keeps meaning the ten code types");
        assert_eq!(everything[10..], library[..]);
        assert_eq!(type_list(&everything[8..]), "init,off-by-one,alloc,leak,copy-overrun");
        assert!(parse_types("all,libraries").unwrap_err().to_string().contains("`libraries`"));
    }

    #[test]
    fn parses_isolations() {
        assert_eq!(parse_isolations("none,process").unwrap(), vec![RunMode::Process, RunMode::None]);
        let err = parse_isolations("process,jail").unwrap_err();
        assert!(err.is_bad_input());
        assert!(err.to_string().contains("`jail`; valid: mpk, process, none"), "{err}");
        assert_eq!(parse_isolations("process, mpk").unwrap(), vec![RunMode::Mpk, RunMode::Process]);
        assert!(parse_isolations("auto").unwrap_err().to_string().contains("name the kinds to compare"));
        assert!(parse_isolations("native").is_err());
    }

    #[test]
    fn names_what_differs() {
        let a = CampaignConfig {
            extension: "well".into(),
            workload: "well".into(),
            extension_hash: fingerprint(b"x"),
            fault_types: vec![FaultType::Nop.into()],
            trials_per_type: 2,
            faults_per_trial: 5,
            isolations: vec![RunMode::Process],
            seed: 1,
            deadline_ms: Some(2000),
            host_timeout_ms: 20_000,
            fault_model: FaultModel::Persistent,
            poison: false,
        };
        assert_eq!(a.differences(&a.clone()), None);
        let b = CampaignConfig { seed: 2, ..a.clone() };
        assert_eq!(a.differences(&b).as_deref(), Some("seed 1 recorded, 2 asked"));
        let c = CampaignConfig { fault_model: FaultModel::Transient, ..a.clone() };
        assert_eq!(a.differences(&c).as_deref(), Some("fault model persistent recorded, transient asked"));
        let d = CampaignConfig { deadline_ms: None, ..a.clone() };
        assert_eq!(a.differences(&d).as_deref(), Some("policy a 2000 ms deadline recorded, the default policy asked"));
        let json_default = serde_json::to_string(&d).unwrap();
        assert!(json_default.contains(r#""deadline_ms":null"#), "{json_default}");
        assert_eq!(serde_json::from_str::<CampaignConfig>(&json_default).unwrap(), d);
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.contains(r#""fault_types":["nop"]"#), "{json}");
        assert_eq!(serde_json::from_str::<CampaignConfig>(&json).unwrap(), a);
        // Recorded before the fault model existed: persistent.
        let old = json.replace(r#","fault_model":"persistent""#, "");
        assert_ne!(old, json);
        assert_eq!(serde_json::from_str::<CampaignConfig>(&old).unwrap(), a);
        assert_eq!("transient".parse::<FaultModel>().unwrap(), FaultModel::Transient);
        let err = "sometimes".parse::<FaultModel>().unwrap_err();
        assert!(err.is_bad_input() && err.to_string().contains("persistent, transient"), "{err}");
    }
}
