//! The campaign's report: a Markdown summary (`report.md`, also printed), the same numbers for machines
//! (`report.json`) and the outcome chart (`outcomes.svg`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use ward::libfault::{LibraryFault, LibraryFaultKind};

use crate::campaign::Finished;
use crate::classify::Outcome;
use crate::config::{type_list, CampaignConfig, FaultModel, RunMode};
use crate::error::Error;
use crate::record::RunRecord;
use crate::store::write_atomically;
use crate::summary::{summarize, survival_target, Row, Summary, Targets};
use crate::trial_fault::TrialFault;
use crate::workload::{self, Entry};

/// The files written, in the campaign directory.
#[derive(Debug, Clone)]
pub struct Written {
    pub markdown: PathBuf,
    pub json: PathBuf,
    /// Outcomes per fault type.
    pub chart: PathBuf,
    /// Outcomes per extension (a report over several campaigns only).
    pub chart_by_extension: Option<PathBuf>,
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
    let written = Written {
        markdown: dir.join("report.md"),
        json: dir.join("report.json"),
        chart: dir.join("outcomes.svg"),
        chart_by_extension: None,
    };
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

/// One extension's part of a report over several campaigns.
#[derive(Serialize)]
struct ExtensionJson<'a> {
    extension: &'a str,
    workload: &'a str,
    extension_hash: &'a str,
    no_site: Vec<&'static str>,
    trials: u32,
    resumed_trials: usize,
    ran_trials: usize,
    summary: &'a Summary,
}

#[derive(Serialize)]
struct CombinedJson<'a> {
    extensions: Vec<ExtensionJson<'a>>,
    /// Each extension's totals, then the total over all (`fault_type` names the extension).
    by_extension: &'a [Row],
    /// Every trial of every extension, per fault type, with the targets over all of them.
    summary: &'a Summary,
    elapsed_ms: u64,
}

/// Reports several campaigns with the same settings (one per extension) together, into `dir`: `report.md`,
/// `report.json`, `outcomes.svg` (per fault type, over every extension) and `outcomes-by-extension.svg`. Returns
/// the summary over every extension and the Markdown. `elapsed` is the invocation's wall time.
pub fn write_combined(
    dir: &Path,
    campaigns: &[Finished],
    elapsed: Duration,
) -> Result<(Summary, String, Written), Error> {
    let Some(first) = campaigns.first() else {
        return Err(Error::EmptyList { what: "--extension" });
    };
    let all = CampaignConfig { extension: format!("{} extensions", campaigns.len()), ..first.config.clone() };
    let records: Vec<RunRecord> = campaigns.iter().flat_map(|f| f.records.iter().cloned()).collect();
    let summary = summarize(&all, &records);
    let each: Vec<Summary> = campaigns.iter().map(|f| summarize(&f.config, &f.records)).collect();
    let mut by_extension: Vec<Row> =
        each.iter().map(|s| Row { fault_type: s.extension.clone(), ..s.total.clone() }).collect();
    by_extension.push(summary.total.clone());
    let markdown = combined_markdown(campaigns, &all, &summary, &by_extension, elapsed);

    let written = Written {
        markdown: dir.join("report.md"),
        json: dir.join("report.json"),
        chart: dir.join("outcomes.svg"),
        chart_by_extension: Some(dir.join("outcomes-by-extension.svg")),
    };
    write_atomically(&written.markdown, markdown.as_bytes())?;
    let json = CombinedJson {
        extensions: campaigns
            .iter()
            .zip(&each)
            .map(|(f, s)| ExtensionJson {
                extension: &f.config.extension,
                workload: &f.config.workload,
                extension_hash: &f.config.extension_hash,
                no_site: f.no_site.iter().map(|t| t.as_str()).collect(),
                trials: s.total.trials,
                resumed_trials: f.resumed_trials,
                ran_trials: f.ran_trials,
                summary: s,
            })
            .collect(),
        by_extension: &by_extension,
        summary: &summary,
        elapsed_ms: elapsed.as_millis() as u64,
    };
    let text = serde_json::to_string_pretty(&json).map_err(|source| Error::Json { what: "the report", source })?;
    write_atomically(&written.json, format!("{text}\n").as_bytes())?;
    let modes = all.modes();
    let bars = modes.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ");
    let title = format!(
        "ward campaign: {} extensions — outcomes per fault type ({} trials; bars: {bars})",
        campaigns.len(),
        summary.total.trials
    );
    write_atomically(&written.chart, crate::chart::svg_of(&title, &modes, &summary.rows)?.as_bytes())?;
    let title = format!(
        "ward campaign — outcomes per extension ({} trials of each fault type with a site; bars: {bars})",
        all.trials_per_type
    );
    let per = crate::chart::svg_of(&title, &modes, &by_extension[..by_extension.len() - 1])?;
    if let Some(path) = &written.chart_by_extension {
        write_atomically(path, per.as_bytes())?;
    }
    Ok((summary, markdown, written))
}

fn combined_markdown(
    campaigns: &[Finished],
    all: &CampaignConfig,
    summary: &Summary,
    by_extension: &[Row],
    elapsed: Duration,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# ward campaign: {} extensions\n", campaigns.len());
    let names: Vec<String> =
        campaigns.iter().map(|f| format!("{} ({})", f.config.extension, f.config.workload)).collect();
    let iso_names = all.isolations.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(" and ");
    let copy = if all.fault_types.iter().any(|t| t.is_library()) { "copy of the" } else { "mutated" };
    let _ = writeln!(
        s,
        "{} trials over {} extensions: {}. Each extension had {} trials of each {}, for each type with a site in it, \
         seed {}. Each trial's {copy} extension ran natively and under isolation {}, every run in a throwaway host \
         process doing its workload. Under ward {}; a host still running after {} counted as hung. {}{}{}",
        summary.total.trials,
        campaigns.len(),
        names.join(", "),
        all.trials_per_type,
        what_each(&all.fault_types, all.faults_per_trial),
        all.seed,
        iso_names,
        policy_clause(all.deadline_ms),
        duration(Duration::from_millis(all.host_timeout_ms)),
        fault_model_sentence(all.fault_model, &all.fault_types),
        poison_sentence(all.poison),
        library_sentence(&all.fault_types, all.fault_model),
    );
    let _ = writeln!(s, "\nWorkloads:\n");
    let mut workloads: Vec<&str> = campaigns.iter().map(|f| f.config.workload.as_str()).collect();
    workloads.sort_unstable();
    workloads.dedup();
    for w in workloads {
        let what = workload::by_name(w).map(|w| w.describe()).unwrap_or("");
        let _ = writeln!(s, "- `{w}`: {what}.");
    }
    let missing: Vec<String> = campaigns
        .iter()
        .filter(|f| !f.no_site.is_empty())
        .map(|f| format!("{} ({})", f.config.extension, type_list(&f.no_site)))
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(s, "\nFault types without a site (no trials): {}.", missing.join("; "));
    }
    figure6(&mut s, "Host failures per extension (Nooks, Figure 6)", "extension", by_extension.iter(), &all.isolations);
    let rows = || summary.rows.iter().chain(std::iter::once(&summary.total));
    figure6(&mut s, "Host failures per fault type, all extensions", "fault type", rows(), &all.isolations);
    figure7(&mut s, "Every outcome per extension (Nooks, Figure 7)", "extension", by_extension.iter(), &all.modes());
    figure7(&mut s, "Every outcome per fault type, all extensions", "fault type", rows(), &all.modes());
    targets_section(&mut s, summary);
    let ran: usize = campaigns.iter().map(|f| f.ran_trials).sum();
    let resumed: usize = campaigns.iter().map(|f| f.resumed_trials).sum();
    let _ = writeln!(
        s,
        "\nThis invocation ran {ran} trials in {}; {resumed} were recorded by an earlier one.",
        duration(elapsed)
    );
    s
}

/// What each trial of `types` injects, after "N trials of each": `fault type (branch,nop), 5 faults of that type
/// per trial`, `library fault kind (alloc,leak)`, or both joined by ", and of each".
fn what_each(types: &[TrialFault], faults_per_trial: u32) -> String {
    let (library, code): (Vec<TrialFault>, Vec<TrialFault>) = types.iter().partition(|t| t.is_library());
    let code = format!("fault type ({}), {faults_per_trial} faults of that type per trial", type_list(&code));
    let library = format!("library fault kind ({})", type_list(&library));
    match (types.iter().any(|t| !t.is_library()), types.iter().any(|t| t.is_library())) {
        (true, true) => format!("{code}, and of each {library}"),
        (false, true) => library,
        _ => code,
    }
}

/// What the library fault kinds among `types` did, as a paragraph of its own (it starts with a blank line); empty
/// when there are none.
fn library_sentence(types: &[TrialFault], model: FaultModel) -> String {
    let kinds: Vec<LibraryFaultKind> = types.iter().filter_map(|t| t.library()).collect();
    if kinds.is_empty() {
        return String::new();
    }
    let each: Vec<String> = kinds
        .iter()
        .map(|k| {
            let does = match k {
                LibraryFaultKind::Alloc => {
                    "one allocation (malloc, calloc, realloc, the aligned allocators) fails with ENOMEM".to_string()
                }
                LibraryFaultKind::Leak => "every free from that call on does nothing".to_string(),
                LibraryFaultKind::CopyOverrun => format!(
                    "one copy (memcpy, memmove, memset, strcpy, strncpy and their _chk forms) writes {} bytes past its \
                     end",
                    LibraryFault::DEFAULT_EXTRA
                ),
            };
            format!("{k}: {does}")
        })
        .collect();
    let restart = match model {
        FaultModel::Persistent => "",
        FaultModel::Transient => {
            " A restart under ward loads the unmutated original file, which the fault does not target."
        }
    };
    format!(
        "\n\nLibrary fault kinds mutate nothing: the trial's copy is the unmutated extension, run with ward's \
         preload library (`ward_libfault.so`) acting on the C library calls the extension's own code makes \
         (attributed by return address, so what the extension allocates through another library, such as C++'s \
         operator new, is untouched) — {}. The call affected (the 1st to the {}th of its kind, counted per \
         process) is drawn from the trial's seed and named in each record (`library_fault`, e.g. \
         `alloc:nth=3,count=1`). Natively the library was preloaded into the host process, under ward into the \
         extension's domain process.{restart}",
        each.join("; "),
        crate::plan::LIBRARY_NTH_MAX,
    )
}

/// What policy runs under ward had, as a clause of the report's first paragraph.
fn policy_clause(deadline_ms: Option<u64>) -> String {
    match deadline_ms {
        Some(ms) => format!("every call had a deadline of {}", duration(Duration::from_millis(ms))),
        None => "the extension ran with ward's default policy only: each function's deadline learned from its \
                 calls (before that, its class's first deadline for the call, else the ceiling), and the default \
                 restart limits, backoff and history"
            .into(),
    }
}

/// What the fault model means for the runs under ward, in one sentence.
fn fault_model_sentence(model: FaultModel, types: &[TrialFault]) -> &'static str {
    let library = types.iter().any(|t| t.is_library());
    let code = types.iter().any(|t| !t.is_library());
    match model {
        FaultModel::Persistent if library && !code => {
            "Faults were persistent: every incarnation under ward loaded the same copy with the same library fault, \
             counted from the same start, so a restart met the same fault again."
        }
        FaultModel::Persistent if library => {
            "Faults were persistent: every incarnation under ward loaded the same copy (mutated, or with its library \
             fault, counted from the same start), so a restart met the same fault again."
        }
        FaultModel::Persistent => {
            "Faults were persistent: every incarnation under ward loaded the mutated copy, so a restart ran the same \
             faulty code again."
        }
        FaultModel::Transient => {
            "Faults were transient, as Nooks and NewtOS injected them into running code: under ward, a restart \
             loaded the unmutated file (`restart_from`), so a recovered run could finish with the reference output."
        }
    }
}

/// Whether ward's calls into the extension were poisoned (a sentence that follows the fault model's, or nothing).
fn poison_sentence(poison: bool) -> &'static str {
    if poison {
        " Under ward the extension's calls were poisoned (policy `poison`): every register and stack slot a call \
         did not give held poison."
    } else {
        ""
    }
}

/// The whole Markdown report.
pub fn markdown(finished: &Finished, summary: &Summary) -> String {
    let c = &finished.config;
    let isolations: Vec<RunMode> = c.isolations.clone();
    let iso_names = isolations.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(" and ");
    let mut s = String::new();
    let _ = writeln!(s, "# ward campaign: {}\n", c.extension);
    let what = workload::by_name(&c.workload).map(|w| w.describe()).unwrap_or("");
    let types: Vec<_> = c.fault_types.iter().filter(|t| !finished.no_site.contains(t)).copied().collect();
    let copy = if types.iter().any(|t| t.is_library()) { "copy of" } else { "mutated" };
    let _ = writeln!(
        s,
        "{} trials: {} trials of each {}, seed {}. Each trial's {copy} {} ran natively and under isolation {}, every \
         run in a throwaway host process doing the same workload ({what}). Under ward {}; a host still running \
         after {} counted as hung. {}{}{}",
        summary.total.trials,
        c.trials_per_type,
        what_each(&types, c.faults_per_trial),
        c.seed,
        c.extension,
        iso_names,
        policy_clause(c.deadline_ms),
        duration(Duration::from_millis(c.host_timeout_ms)),
        fault_model_sentence(c.fault_model, &types),
        poison_sentence(c.poison),
        library_sentence(&types, c.fault_model),
    );
    let (library, code): (Vec<TrialFault>, Vec<TrialFault>) = finished.no_site.iter().partition(|t| t.is_library());
    if !code.is_empty() {
        let _ = writeln!(
            s,
            "\nNo trials of {}: the extension has no instruction that fault type applies to.",
            type_list(&code)
        );
    }
    if !library.is_empty() {
        let _ = writeln!(
            s,
            "\nNo trials of {}: the extension imports none of the C library functions that library fault kind \
             intercepts.",
            type_list(&library)
        );
    }

    let rows = || summary.rows.iter().chain(std::iter::once(&summary.total));
    figure6(&mut s, "Host failures (Nooks, Figure 6)", "fault type", rows(), &isolations);
    figure7(&mut s, "Every outcome (Nooks, Figure 7)", "fault type", rows(), &c.modes());
    targets_section(&mut s, summary);
    let _ = writeln!(
        s,
        "\nThis invocation ran {} trials in {}; {} were recorded by an earlier one.",
        finished.ran_trials,
        duration(finished.elapsed),
        finished.resumed_trials
    );
    s
}

/// Nooks' Figure 6 in numbers: native host failures, and what became of them under each isolation kind. `rows`
/// are fault types or extensions (`what` says which), the total last.
fn figure6<'r>(s: &mut String, heading: &str, what: &str, rows: impl Iterator<Item = &'r Row>, isolations: &[RunMode]) {
    let _ = writeln!(s, "\n## {heading}\n");
    let _ = writeln!(
        s,
        "Trials whose native host crashed or hung; of those, how many isolated hosts survived (neither crashed nor \
         hung); of the survivors, how many saw exactly the reference output (fully transparent), and how many of \
         the others saw only clean errors (every result that differs is an error returned by ward, none a wrong \
         value).\n"
    );
    let mut header = format!("| {what} | trials | native crashed | native hung |");
    let mut rule = "| --- | ---: | ---: | ---: |".to_string();
    for m in isolations {
        let _ = write!(header, " survived ({m}) | transparent ({m}) | clean errors only ({m}) |");
        rule.push_str(" ---: | ---: | ---: |");
    }
    let _ = writeln!(s, "{header}\n{rule}");
    for row in rows {
        let native = row.runs.get(&RunMode::Native).copied().unwrap_or_default();
        let _ = write!(s, "| {} | {} | {} | {} |", name(row), row.trials, native.host_crashed, native.host_hung);
        for m in isolations {
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
}

/// Nooks' Figure 7 in numbers: every outcome of every kind of run.
fn figure7<'r>(s: &mut String, heading: &str, what: &str, rows: impl Iterator<Item = &'r Row>, modes: &[RunMode]) {
    let _ = writeln!(s, "\n## {heading}\n");
    let mut header = format!("| {what} | run |");
    let mut rule = "| --- | --- |".to_string();
    for o in Outcome::ALL {
        let _ = write!(header, " {} |", o.label());
        rule.push_str(" ---: |");
    }
    let _ = writeln!(s, "{header}\n{rule}");
    for row in rows {
        for &mode in modes {
            let counts = row.runs.get(&mode).copied().unwrap_or_default();
            let _ = write!(s, "| {} | {mode} |", name(row));
            for o in Outcome::ALL {
                let applies =
                    mode != RunMode::Native || !matches!(o, Outcome::Recovered | Outcome::RecoveredWrongOutput);
                if applies {
                    let _ = write!(s, " {} |", counts.get(o));
                } else {
                    s.push_str(" – |");
                }
            }
            s.push('\n');
        }
    }
}

fn targets_section(s: &mut String, summary: &Summary) {
    let _ = writeln!(s, "\n## Targets (issues 5 and 33)\n");
    let _ = writeln!(s, "| isolation | target | measured | met |\n| --- | --- | --- | --- |");
    for t in &summary.targets {
        target_rows(s, t);
    }
}

fn target_rows(s: &mut String, t: &Targets) {
    let yes = |met: bool| if met { "yes" } else { "**no**" };
    let _ = writeln!(
        s,
        "| {} | the host survives {} | {} | {} |",
        t.isolation,
        match survival_target(t.isolation) {
            all if all >= 1.0 => "every native crash and hang (100%)".to_string(),
            share => format!("the native crashes and hangs (at least {:.1}%)", share * 100.0),
        },
        of(t.survived, t.native_lost),
        yes(t.survival_met)
    );
    let _ = writeln!(
        s,
        "| {} | of those, recovered fully transparently (at least {:.0}%) | {} | {} |",
        t.isolation,
        t.transparency_target * 100.0,
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
    let us = |us: u64| duration(Duration::from_micros(us));
    let within = match (h.deadline_us, h.slack_us) {
        (Some(deadline), Some(slack)) => format!("{} + {} slack", us(deadline), us(slack)),
        _ => "the deadline each call had, learned or first, + 10% slack, at least 50 ms".into(),
    };
    let slowest = match (h.slowest_us, h.slowest_deadline_us) {
        (None, _) => "none".to_string(),
        (Some(slowest), Some(deadline)) if h.deadline_us.is_none() => {
            let past = h.most_past_deadline_us.map_or("0 ms".into(), us);
            format!("{} (its deadline {}), at most {past} past a deadline", us(slowest), us(deadline))
        }
        (Some(slowest), _) => us(slowest),
    };
    let _ = writeln!(
        s,
        "| {} | every injected hang detected within its deadline ({within}) | {} isolated hosts hung; {} \
         detections, {} late, slowest {}; of {} native hangs, {} hung under ward too | {} |",
        t.isolation,
        h.isolated_hung,
        h.detections,
        h.late,
        slowest,
        h.injected,
        h.detected,
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

    #[test]
    fn says_what_each_trial_injects() {
        let nop = TrialFault::Code(ward_inject::FaultType::Nop);
        let (alloc, leak) = (TrialFault::Library(LibraryFaultKind::Alloc), TrialFault::Library(LibraryFaultKind::Leak));
        assert_eq!(what_each(&[nop], 5), "fault type (nop), 5 faults of that type per trial");
        assert_eq!(what_each(&[alloc, leak], 5), "library fault kind (alloc,leak)");
        assert_eq!(
            what_each(&[nop, alloc], 5),
            "fault type (nop), 5 faults of that type per trial, and of each library fault kind (alloc)"
        );
        assert_eq!(library_sentence(&[nop], FaultModel::Persistent), "");
        let said = library_sentence(&[nop, alloc, leak], FaultModel::Transient);
        assert!(said.starts_with("\n\nLibrary fault kinds mutate nothing"), "{said}");
        assert!(said.contains("alloc: one allocation") && said.contains("leak: every free"), "{said}");
        assert!(!said.contains("copy-overrun"), "only the kinds that ran: {said}");
        assert!(said.contains("the 1st to the 8th") && said.contains("which the fault does not target"), "{said}");
    }
}
