//! Judging a run: how the host ended, whether ward saw a fault, and whether the output equals the reference.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::launch::HostEnd;
use crate::trial_host::HostReport;
use crate::workload::{count_differences, first_difference, Entry};

/// What came of one run. A native run can only crash, hang, give wrong output or show no effect: no one there
/// detects anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The host was killed by a signal or exited abnormally (or before finishing its workload).
    HostCrashed,
    /// The host was still running at the bound and was killed.
    HostHung,
    /// ward detected a fault and the output equals the reference: fully transparent recovery.
    Recovered,
    /// ward detected a fault; the output differs (a call failed with an error, or returned something else).
    RecoveredWrongOutput,
    /// No fault detected, yet the output differs.
    WrongOutputUndetected,
    /// No fault detected and the output equals the reference.
    NoEffect,
}

impl Outcome {
    /// In the order reports list them.
    pub const ALL: [Outcome; 6] = [
        Outcome::HostCrashed,
        Outcome::HostHung,
        Outcome::Recovered,
        Outcome::RecoveredWrongOutput,
        Outcome::WrongOutputUndetected,
        Outcome::NoEffect,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::HostCrashed => "host_crashed",
            Outcome::HostHung => "host_hung",
            Outcome::Recovered => "recovered",
            Outcome::RecoveredWrongOutput => "recovered_wrong_output",
            Outcome::WrongOutputUndetected => "wrong_output_undetected",
            Outcome::NoEffect => "no_effect",
        }
    }

    /// Words for tables.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::HostCrashed => "host crashed",
            Outcome::HostHung => "host hung",
            Outcome::Recovered => "recovered",
            Outcome::RecoveredWrongOutput => "recovered, wrong output",
            Outcome::WrongOutputUndetected => "wrong output, undetected",
            Outcome::NoEffect => "no effect",
        }
    }

    /// The host is gone: what Nooks counted as a system crash.
    pub fn host_lost(self) -> bool {
        matches!(self, Outcome::HostCrashed | Outcome::HostHung)
    }

    /// The host saw exactly the reference output.
    pub fn transparent(self) -> bool {
        matches!(self, Outcome::Recovered | Outcome::NoEffect)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An outcome with what it rests on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub outcome: Outcome,
    /// In words: the signal, the faults ward saw, the first wrong result.
    pub detail: String,
    /// Calls whose result differs from the reference (0 when the host did not finish) ...
    pub wrong_calls: u32,
    /// ... and of those, calls that failed cleanly: an error instead of a result, not a wrong result.
    pub failed_calls: u32,
}

/// Judge a run from how its host ended, its stderr (for the reason of an abnormal exit), its report (if it printed
/// one) and the reference output.
pub fn classify(end: HostEnd, stderr: &str, report: Option<&HostReport>, reference: &[Entry]) -> Judgement {
    let finished = if report.is_some() { " after finishing its workload" } else { "" };
    let lost = |outcome, what: String| Judgement {
        outcome,
        detail: format!("{what}{finished}"),
        wrong_calls: 0,
        failed_calls: 0,
    };
    let report = match (end, report) {
        (HostEnd::Hung(bound), _) => {
            return lost(Outcome::HostHung, format!("host hung (killed after {})", seconds(bound)));
        }
        (HostEnd::Signaled(sig), _) => {
            return lost(Outcome::HostCrashed, format!("host killed by {}", ward::fault::signal_name(sig)));
        }
        (HostEnd::Exited(code), _) if code != 0 => {
            let why = last_line(stderr).map(|l| format!(": {l}")).unwrap_or_default();
            return lost(Outcome::HostCrashed, format!("host exited with status {code}{why}"));
        }
        (HostEnd::Exited(_), None) => {
            return lost(Outcome::HostCrashed, "host exited with status 0 before finishing its workload".into());
        }
        (HostEnd::Exited(_), Some(r)) => r,
    };

    // A call the class wrapper bypassed counts as detected even without a fault event: the host survived and was
    // told.
    let detected = !report.faults.is_empty() || report.load_error.is_some() || !report.bypassed.is_empty();
    let difference = match &report.load_error {
        Some(e) => Some(format!("ward did not load the extension: {e}")),
        None => first_difference(reference, &report.output),
    };
    let mut parts = Vec::new();
    if detected {
        parts.push(fault_summary(report));
    }
    if let Some(d) = &difference {
        parts.push(d.clone());
    }
    let outcome = match (detected, difference.is_some()) {
        (true, false) => Outcome::Recovered,
        (true, true) => Outcome::RecoveredWrongOutput,
        (false, true) => Outcome::WrongOutputUndetected,
        (false, false) => Outcome::NoEffect,
    };
    let (wrong_calls, failed_calls) = match report.load_error {
        Some(_) => (reference.len() as u32, reference.len() as u32),
        None => count_differences(reference, &report.output),
    };
    Judgement { outcome, detail: parts.join("; "), wrong_calls, failed_calls }
}

/// "2 faults (first: null dereference (SIGSEGV at 0x0) in call well_sum), 2 restarts, disabled".
fn fault_summary(report: &HostReport) -> String {
    let mut s = match report.faults.first() {
        Some(f) => {
            let call = f.call.as_ref().map(|c| format!(" in call {c}")).unwrap_or_default();
            let n = report.faults.len();
            format!("{n} fault{} (first: {}{call})", if n == 1 { "" } else { "s" }, f.cause)
        }
        None => "no fault event".to_string(),
    };
    s.push_str(&format!(", {} restart{}", report.restarts, if report.restarts == 1 { "" } else { "s" }));
    if report.disabled {
        s.push_str(", extension disabled");
    }
    if let Some(first) = report.bypassed.first() {
        let n = report.bypassed.len();
        let first: String = first.chars().take(120).collect();
        s.push_str(&format!(", {n} call{} bypassed (first: {first})", if n == 1 { "" } else { "s" }));
    }
    s
}

fn seconds(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// The last non-empty line, cut to a readable length (a panic message, an abort reason).
fn last_line(text: &str) -> Option<String> {
    let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trial_host::SeenFault;
    use std::time::Duration;

    fn reference() -> Vec<Entry> {
        vec![Entry { call: "well_add(2, 40)".into(), result: "42".into() }]
    }

    fn report(result: &str, faults: usize) -> HostReport {
        HostReport {
            output: vec![Entry { call: "well_add(2, 40)".into(), result: result.into() }],
            faults: (0..faults)
                .map(|_| SeenFault {
                    kind: "signal".into(),
                    cause: "null dereference (SIGSEGV at 0x0)".into(),
                    call: Some("well_add".into()),
                })
                .collect(),
            restarts: faults as u64,
            ..HostReport::default()
        }
    }

    fn judge(end: HostEnd, r: Option<&HostReport>) -> Judgement {
        classify(end, "", r, &reference())
    }

    #[test]
    fn a_signal_is_a_crash() {
        let j = judge(HostEnd::Signaled(libc::SIGSEGV), None);
        assert_eq!(j.outcome, Outcome::HostCrashed);
        assert_eq!(j.detail, "host killed by SIGSEGV");
    }

    #[test]
    fn an_abnormal_exit_is_a_crash_with_its_reason() {
        let j = classify(HostEnd::Exited(101), "thread 'main' panicked at x.rs:1:1:\nboom\n\n", None, &reference());
        assert_eq!(j.outcome, Outcome::HostCrashed);
        assert_eq!(j.detail, "host exited with status 101: boom");
        let quiet = judge(HostEnd::Exited(0), None);
        assert_eq!(quiet.outcome, Outcome::HostCrashed, "exit 0 without a report: the workload did not finish");
    }

    #[test]
    fn past_the_bound_is_a_hang_even_after_the_workload() {
        let r = report("42", 0);
        let j = judge(HostEnd::Hung(Duration::from_secs(20)), Some(&r));
        assert_eq!(j.outcome, Outcome::HostHung);
        assert_eq!(j.detail, "host hung (killed after 20 s) after finishing its workload");
    }

    #[test]
    fn a_detected_fault_with_the_reference_output_is_recovered() {
        let j = judge(HostEnd::Exited(0), Some(&report("42", 1)));
        assert_eq!(j.outcome, Outcome::Recovered);
        assert_eq!(j.detail, "1 fault (first: null dereference (SIGSEGV at 0x0) in call well_add), 1 restart");
    }

    #[test]
    fn a_detected_fault_with_other_output_is_recovered_wrong_output() {
        let mut r = report("error: extension failed", 2);
        r.disabled = true;
        let j = judge(HostEnd::Exited(0), Some(&r));
        assert_eq!(j.outcome, Outcome::RecoveredWrongOutput);
        assert!(j.detail.starts_with("2 faults (first: "), "{}", j.detail);
        let end = "2 restarts, extension disabled; well_add(2, 40): expected 42, got error: extension failed";
        assert!(j.detail.ends_with(end), "{}", j.detail);
        assert_eq!((j.wrong_calls, j.failed_calls), (1, 1), "a clean error");
    }

    #[test]
    fn other_output_without_a_fault_is_undetected() {
        let j = judge(HostEnd::Exited(0), Some(&report("41", 0)));
        assert_eq!(j.outcome, Outcome::WrongOutputUndetected);
        assert_eq!(j.detail, "well_add(2, 40): expected 42, got 41");
        assert_eq!((j.wrong_calls, j.failed_calls), (1, 0), "a wrong value, not an error");
    }

    #[test]
    fn the_reference_output_without_a_fault_is_no_effect() {
        let j = judge(HostEnd::Exited(0), Some(&report("42", 0)));
        assert_eq!(j.outcome, Outcome::NoEffect);
        assert_eq!(j.detail, "");
    }

    #[test]
    fn a_bypassed_call_is_detected_even_without_a_fault_event() {
        let mut r = report("41", 0);
        r.bypassed = vec!["extension disabled".into()];
        let j = judge(HostEnd::Exited(0), Some(&r));
        assert_eq!(j.outcome, Outcome::RecoveredWrongOutput);
        assert_eq!(
            j.detail,
            "no fault event, 0 restarts, 1 call bypassed (first: extension disabled); well_add(2, 40): expected 42, \
             got 41"
        );
        r.output[0].result = "42".into();
        assert_eq!(judge(HostEnd::Exited(0), Some(&r)).outcome, Outcome::Recovered, "a bypass with the same output");
    }

    #[test]
    fn a_refused_load_is_detected_with_wrong_output() {
        let r = HostReport { load_error: Some("cannot load well.so: domain died".into()), ..HostReport::default() };
        let j = judge(HostEnd::Exited(0), Some(&r));
        assert_eq!(j.outcome, Outcome::RecoveredWrongOutput);
        assert!(j.detail.contains("ward did not load the extension"), "{}", j.detail);
    }

    #[test]
    fn outcomes_serialise_in_snake_case() {
        let names: Vec<String> = Outcome::ALL.iter().map(|o| serde_json::to_string(o).unwrap()).collect();
        let expected = Outcome::ALL.map(|o| format!("\"{}\"", o.as_str()));
        assert_eq!(names, expected);
    }
}
