//! The campaign's report: a Markdown summary (`report.md`, also printed), the same numbers for machines
//! (`report.json`) and the outcome chart (`outcomes.svg`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::campaign::Finished;
use crate::classify::Outcome;
use crate::config::{type_list, CampaignConfig, Mode};
use crate::error::Error;
use crate::store::write_atomically;
use crate::summary::{summarize, Row, Summary, Targets, TRANSPARENCY_TARGET};
use crate::workload::{self, Entry};

/// The files written, in the campaign directory.
#[derive(Debug, Clone)]
pub struct Written {
    pub markdown: PathBuf,
    pub json: PathBuf,
    pub chart: PathBuf,
}

#[derive(Serialize)]
struct ReportJson<'a> {
    config: &'a CampaignConfig,
    no_site: Vec<&'static str>,
    trials: u32,
    resumed_trials: usize,
    ran_trials: usize,
    elapsed_ms: u64,
    reference: &'a [Entry],
    summary: &'a Summary,
}

/// Summarises `finished` and writes the three files into `dir`; returns the summary and the Markdown.
pub fn write(dir: &Path, finished: &Finished) -> Result<(Summary, String, Written), Error> {
    let summary = summarize(&finished.config, &finished.records);
    let markdown = markdown(finished, &summary);
    let written =
        Written { markdown: dir.join("report.md"), json: dir.join("report.json"), chart: dir.join("outcomes.svg") };
    write_atomically(&written.markdown, markdown.as_bytes())?;
    let json = ReportJson {
        config: &finished.config,
        no_site: finished.no_site.iter().map(|t| t.as_str()).collect(),
        trials: summary.total.trials,
        resumed_trials: finished.resumed_trials,
        ran_trials: finished.ran_trials,
        elapsed_ms: finished.elapsed.as_millis() as u64,
        reference: &finished.reference,
        summary: &summary,
    };
    let text = serde_json::to_string_pretty(&json).map_err(|source| Error::Json { what: "the report", source })?;
    write_atomically(&written.json, format!("{text}\n").as_bytes())?;
    let svg = crate::chart::svg(&finished.config, &summary)?;
    write_atomically(&written.chart, svg.as_bytes())?;
    Ok((summary, markdown, written))
}

/// The whole Markdown report.
pub fn markdown(finished: &Finished, summary: &Summary) -> String {
    let c = &finished.config;
    let isolations: Vec<Mode> = c.isolations.clone();
    let iso_names = isolations.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(" and ");
    let mut s = String::new();
    let _ = writeln!(s, "# ward campaign: {}\n", c.extension);
    let what = workload::for_extension(&c.extension).map(|w| w.describe()).unwrap_or("");
    let types: Vec<_> = c.fault_types.iter().filter(|t| !finished.no_site.contains(t)).copied().collect();
    let _ = writeln!(
        s,
        "{} trials: {} trials of each fault type ({}), {} faults of that type per trial, seed {}. Each trial's \
         mutated {} ran natively and under isolation {}, every run in a throwaway host process doing the same \
         workload ({what}). Under ward every call had a deadline of {}; a host still running after {} counted as \
         hung.",
        summary.total.trials,
        c.trials_per_type,
        type_list(&types),
        c.faults_per_trial,
        c.seed,
        c.extension,
        iso_names,
        duration(Duration::from_millis(c.deadline_ms)),
        duration(Duration::from_millis(c.host_timeout_ms)),
    );
    if !finished.no_site.is_empty() {
        let _ = writeln!(
            s,
            "\nNo trials of {}: the extension has no instruction that fault type applies to.",
            type_list(&finished.no_site)
        );
    }

    let _ = writeln!(s, "\n## Host failures (Nooks, Figure 6)\n");
    let _ = writeln!(
        s,
        "Trials whose native host crashed or hung; of those, how many isolated hosts survived (neither crashed nor \
         hung); of the survivors, how many saw exactly the reference output (fully transparent), and how many of \
         the others saw only clean errors (every result that differs is an error returned by ward, none a wrong \
         value).\n"
    );
    let mut header = "| fault type | trials | native crashed | native hung |".to_string();
    let mut rule = "| --- | ---: | ---: | ---: |".to_string();
    for m in &isolations {
        let _ = write!(header, " survived ({m}) | transparent ({m}) | clean errors only ({m}) |");
        rule.push_str(" ---: | ---: | ---: |");
    }
    let _ = writeln!(s, "{header}\n{rule}");
    for row in summary.rows.iter().chain(std::iter::once(&summary.total)) {
        let native = row.runs.get(&Mode::Native).copied().unwrap_or_default();
        let _ = write!(s, "| {} | {} | {} | {} |", name(row), row.trials, native.host_crashed, native.host_hung);
        for m in &isolations {
            let survived = row.survived.get(m).copied().unwrap_or(0);
            let transparent = row.transparent.get(m).copied().unwrap_or(0);
            let clean = row.clean.get(m).copied().unwrap_or(0);
            let _ = write!(
                s,
                " {} | {} | {} |",
                of(survived, row.native_lost),
                of(transparent, survived),
                of(clean, survived)
            );
        }
        s.push('\n');
    }

    let _ = writeln!(s, "\n## Every outcome (Nooks, Figure 7)\n");
    let mut header = "| fault type | run |".to_string();
    let mut rule = "| --- | --- |".to_string();
    for o in Outcome::ALL {
        let _ = write!(header, " {} |", o.label());
        rule.push_str(" ---: |");
    }
    let _ = writeln!(s, "{header}\n{rule}");
    for row in summary.rows.iter().chain(std::iter::once(&summary.total)) {
        for mode in c.modes() {
            let counts = row.runs.get(&mode).copied().unwrap_or_default();
            let _ = write!(s, "| {} | {mode} |", name(row));
            for o in Outcome::ALL {
                let applies = mode != Mode::Native || !matches!(o, Outcome::Recovered | Outcome::RecoveredWrongOutput);
                if applies {
                    let _ = write!(s, " {} |", counts.get(o));
                } else {
                    s.push_str(" – |");
                }
            }
            s.push('\n');
        }
    }

    let _ = writeln!(s, "\n## Targets (issue 5)\n");
    let _ = writeln!(s, "| isolation | target | measured | met |\n| --- | --- | --- | --- |");
    for t in &summary.targets {
        target_rows(&mut s, t);
    }
    let _ = writeln!(
        s,
        "\nThis invocation ran {} trials in {}; {} were recorded by an earlier one.",
        finished.ran_trials,
        duration(finished.elapsed),
        finished.resumed_trials
    );
    s
}

fn target_rows(s: &mut String, t: &Targets) {
    let yes = |met: bool| if met { "yes" } else { "**no**" };
    let _ = writeln!(
        s,
        "| {} | the host survives every native crash and hang (100%) | {} | {} |",
        t.isolation,
        of(t.survived, t.native_lost),
        yes(t.survival_met)
    );
    let _ = writeln!(
        s,
        "| {} | of those, recovered fully transparently (at least {:.0}%) | {} | {} |",
        t.isolation,
        TRANSPARENCY_TARGET * 100.0,
        of(t.transparent, t.survived),
        yes(t.transparency_met)
    );
    let _ = writeln!(
        s,
        "| {} | (no target) of those, the others saw only clean errors | {} | – |",
        t.isolation,
        of(t.clean, t.survived)
    );
    let h = &t.hangs;
    let slowest = h.slowest_us.map_or("none".into(), |us| duration(Duration::from_micros(us)));
    let _ = writeln!(
        s,
        "| {} | every injected hang detected within its deadline ({} + {} slack) | {} of {} native hangs detected; \
         {} detections in all, {} late, slowest {} | {} |",
        t.isolation,
        duration(Duration::from_micros(h.deadline_us)),
        duration(Duration::from_micros(h.slack_us)),
        h.detected,
        h.injected,
        h.detections,
        h.late,
        slowest,
        yes(h.met)
    );
}

fn name(row: &Row) -> String {
    if row.fault_type == "total" {
        "**total**".into()
    } else {
        row.fault_type.clone()
    }
}

/// "12 of 13 (92.3%)", or "0 of 0".
fn of(part: u32, whole: u32) -> String {
    if whole == 0 {
        return "0 of 0".into();
    }
    format!("{part} of {whole} ({:.1}%)", 100.0 * f64::from(part) / f64::from(whole))
}

/// "2 s", "250 ms", "1.234 s", "3 min 20 s".
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms >= 60_000 {
        format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000)
    } else if ms >= 1000 && d.subsec_millis() == 0 {
        format!("{} s", ms / 1000)
    } else if ms >= 1000 {
        format!("{:.3} s", d.as_secs_f64())
    } else {
        format!("{ms} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_shares_and_durations() {
        assert_eq!(of(12, 13), "12 of 13 (92.3%)");
        assert_eq!(of(0, 0), "0 of 0");
        assert_eq!(duration(Duration::from_millis(2000)), "2 s");
        assert_eq!(duration(Duration::from_millis(2004)), "2.004 s");
        assert_eq!(duration(Duration::from_millis(250)), "250 ms");
        assert_eq!(duration(Duration::from_secs(200)), "3 min 20 s");
    }
}
