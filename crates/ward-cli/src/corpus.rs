//! `ward corpus`: every plugin of the installed LADSPA and frei0r collections run on a fixed test input natively
//! and under each isolation kind, outputs compared byte for byte.
//!
//! Every run happens in a throwaway child (`ward __corpus-run`, see [`runner`]) that prints a digest of the output,
//! so a plugin that crashes or hangs natively takes only its child down. Each plugin runs natively twice, the second
//! time with uninitialised memory and the memory around its buffers filled with patterns: a plugin whose two native
//! outputs differ depends on time, randomness or memory it does not own, and its output under ward is not compared
//! (a fault under ward is then no failure of ward's either). Then it runs once under each kind; when an output
//! under ward differs, the plugin runs natively a few more times before the difference counts. The verdict per
//! kind is `identical`, `differs` (a failure: ward changed what the plugin does), `cannot run` with the reason, or
//! `nondeterministic` (ran, not compared).

mod input;
#[allow(unsafe_code)]
mod native_runner;
pub mod runner;

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{value_parser, Args, ValueEnum};
use serde::Serialize;
use ward::Isolation;

use crate::hosts::child::{self, End};
use crate::output::{say, Columns};

/// Where Debian installs each collection.
const LADSPA_DIR: &str = "/usr/lib/ladspa";
const FREI0R_DIR: &str = "/usr/lib/frei0r-1";

/// Further plain native runs of a plugin whose output under ward differs from its first two native runs.
const NATIVE_RECHECKS: usize = 4;

/// Stderr progress: one line per this many plugins.
const PROGRESS_EVERY: usize = 25;

#[derive(Args)]
pub struct CorpusArgs {
    /// Which plugins: ladspa, frei0r or all.
    #[arg(long, value_enum, default_value_t = ClassArg::All)]
    class: ClassArg,
    /// Isolation kinds to compare with the native runs, separated by commas (none, process, mpk) [default: every
    /// kind; those this build or machine lacks are listed as unavailable].
    #[arg(long, value_name = "KIND,...")]
    isolation: Option<String>,
    /// One JSON document on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the coverage tables, as Markdown, to FILE.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Runs at once [default: the number of CPUs].
    #[arg(long, value_name = "N", value_parser = value_parser!(u32).range(1..=256))]
    jobs: Option<u32>,
    /// A run still going after this many seconds is killed and counts as timed out.
    #[arg(long, default_value_t = 60, value_name = "S", value_parser = value_parser!(u64).range(1..=3600))]
    timeout_s: u64,
    /// Plugin libraries, or directories of them (every *.so directly inside) [default: /usr/lib/ladspa/*.so for
    /// LADSPA, /usr/lib/frei0r-1/*.so for frei0r].
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ClassArg {
    Ladspa,
    Frei0r,
    All,
}

/// A plugin class the corpus covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Ladspa,
    Frei0r,
}

impl Class {
    fn as_str(self) -> &'static str {
        match self {
            Class::Ladspa => "ladspa",
            Class::Frei0r => "frei0r",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Class::Ladspa => "LADSPA",
            Class::Frei0r => "frei0r",
        }
    }

    fn default_dir(self) -> &'static str {
        match self {
            Class::Ladspa => LADSPA_DIR,
            Class::Frei0r => FREI0R_DIR,
        }
    }

    /// The corpus class of a plugin library; LV2 binaries are not run here (their corpus runs through lv2apply:
    /// `crates/ward-cli/tests/lv2_corpus.rs`).
    fn of(found: ward_classes::Class) -> Option<Class> {
        match found {
            ward_classes::Class::Ladspa => Some(Class::Ladspa),
            ward_classes::Class::Frei0r => Some(Class::Frei0r),
            ward_classes::Class::Lv2 => None,
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One plugin as the helper lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub index: usize,
    pub label: String,
    pub name: String,
}

impl Listed {
    fn clean(s: &str) -> String {
        s.replace(['\t', '\n', '\r'], " ")
    }

    pub fn line(&self) -> String {
        format!("plugin {}\t{}\t{}", self.index, Listed::clean(&self.label), Listed::clean(&self.name))
    }

    fn parse(line: &str) -> Option<Listed> {
        let rest = line.strip_prefix("plugin ")?;
        let mut parts = rest.splitn(3, '\t');
        let index = parts.next()?.parse().ok()?;
        let label = parts.next()?.to_string();
        let name = parts.next().unwrap_or("").to_string();
        Some(Listed { index, label, name })
    }
}

/// A mistake in what the user asked for (unknown kind, missing path...): `main` exits with status 2.
#[derive(Debug)]
pub struct BadInput(String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

pub fn is_bad_input(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<BadInput>())
}

/// A kind asked for, and why it cannot be run when it cannot.
struct Kind {
    isolation: Isolation,
    unavailable: Option<String>,
}

fn parse_kinds(list: Option<&str>) -> Result<Vec<Kind>, BadInput> {
    let isolations: Vec<Isolation> = match list {
        None => vec![Isolation::None, Isolation::Process, Isolation::Mpk],
        Some(list) => {
            let mut kinds = Vec::new();
            for word in list.split(',').map(str::trim) {
                let iso: Isolation = word.parse().map_err(|e: ward::policy::UnknownKeyword| BadInput(e.to_string()))?;
                if iso == Isolation::Auto {
                    return Err(BadInput(
                        "--isolation auto is no kind of its own (it is mpk or process): name none, process or mpk"
                            .into(),
                    ));
                }
                if !kinds.contains(&iso) {
                    kinds.push(iso);
                }
            }
            kinds
        }
    };
    Ok(isolations.into_iter().map(|isolation| Kind { isolation, unavailable: unavailable(isolation) }).collect())
}

/// Why this build or machine cannot run `isolation`, if it cannot.
fn unavailable(isolation: Isolation) -> Option<String> {
    match isolation {
        Isolation::Process => ward::domain_program().err().map(|e| e.to_string()),
        Isolation::Mpk => {
            (!ward::mpk_available()).then(|| "this machine has no memory protection keys (PKU)".to_string())
        }
        Isolation::None | Isolation::Auto => None,
    }
}

/// The plugin libraries to run, with their class: every path given (a directory standing for its `*.so` files), or
/// the default directory of each class asked for.
fn libraries(class: ClassArg, paths: &[PathBuf]) -> Result<Vec<(Class, PathBuf)>> {
    let wanted: Vec<Class> = match class {
        ClassArg::Ladspa => vec![Class::Ladspa],
        ClassArg::Frei0r => vec![Class::Frei0r],
        ClassArg::All => vec![Class::Ladspa, Class::Frei0r],
    };
    let mut errors = Vec::new();
    let mut found = Vec::new();
    if paths.is_empty() {
        for &c in &wanted {
            let dir = Path::new(c.default_dir());
            if !dir.is_dir() {
                errors.push(format!(
                    "{} does not exist: install the {} plugins (scripts/deps does) or give plugin paths",
                    dir.display(),
                    c.title()
                ));
                continue;
            }
            match scan(dir, &[c]) {
                Ok(libs) => found.extend(libs),
                Err(e) => errors.push(e),
            }
        }
    }
    for path in paths {
        if !path.exists() {
            errors.push(format!("{} does not exist", path.display()));
        } else if path.is_dir() {
            match scan(path, &wanted) {
                Ok(libs) => found.extend(libs),
                Err(e) => errors.push(e),
            }
        } else {
            match ward_classes::class_of(path).and_then(Class::of) {
                Some(c) if wanted.contains(&c) => found.push((c, path.clone())),
                Some(c) => {
                    errors.push(format!("{} is a {} plugin library, not {}", path.display(), c.title(), want(&wanted)))
                }
                None => errors.push(format!("{} is no {} plugin library", path.display(), want(&wanted))),
            }
        }
    }
    match errors.len() {
        0 => Ok(found),
        1 => Err(BadInput(errors.remove(0)).into()),
        n => {
            for e in &errors {
                eprintln!("ward: error: {e}");
            }
            Err(BadInput(format!("{n} of the paths are bad input (see above)")).into())
        }
    }
}

fn want(classes: &[Class]) -> String {
    classes.iter().map(|c| c.title()).collect::<Vec<_>>().join(" or ")
}

/// The plugin libraries of the wanted classes directly inside `dir`, by name.
fn scan(dir: &Path, wanted: &[Class]) -> Result<Vec<(Class, PathBuf)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read directory {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let file = entry.map_err(|e| format!("cannot read directory {}: {e}", dir.display()))?.path();
        if file.extension().is_some_and(|x| x == "so") && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    let found: Vec<(Class, PathBuf)> = files
        .into_iter()
        .filter_map(|f| ward_classes::class_of(&f).and_then(Class::of).filter(|c| wanted.contains(c)).map(|c| (c, f)))
        .collect();
    if found.is_empty() {
        return Err(format!("{} holds no {} plugin libraries", dir.display(), want(wanted)));
    }
    Ok(found)
}

/// How one child run ended.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Digest { hash: String, bytes: u64, faults: u64 },
    Bypassed(String),
    Cannot(String),
    Died(String),
    Hung(Duration),
}

impl Outcome {
    fn describe(&self) -> String {
        match self {
            Outcome::Digest { .. } => "runs".into(),
            Outcome::Bypassed(r) => format!("the class wrapper bypassed it: {r}"),
            Outcome::Cannot(r) | Outcome::Died(r) => r.clone(),
            Outcome::Hung(d) => format!("timed out (killed after {} s)", d.as_secs()),
        }
    }
}

/// The settings every child run shares.
struct Runs {
    timeout: Duration,
}

impl Runs {
    fn child(&self, args: Vec<OsString>) -> (End, String, String) {
        match child::run_bounded(&args, &[], self.timeout) {
            Ok(run) => (run.end, run.stdout, run.stderr),
            Err(e) => (End::Exited(-1), String::new(), format!("{e:#}")),
        }
    }

    fn list(&self, class: Class, path: &Path) -> Result<Vec<Listed>, String> {
        let args = vec!["__corpus-run".into(), "--class".into(), class.as_str().into(), "--list".into(), path.into()];
        let (end, stdout, stderr) = self.child(args);
        if let Some(reason) = stdout.lines().find_map(|l| l.strip_prefix("cannot ")) {
            return Err(reason.to_string());
        }
        let listed: Vec<Listed> = stdout.lines().filter_map(Listed::parse).collect();
        match end {
            End::Exited(0) if !listed.is_empty() => Ok(listed),
            end => Err(died(end, &stderr)),
        }
    }

    /// One run; `perturb` (native runs only) fills uninitialised memory with patterns first.
    fn run(&self, class: Class, path: &Path, index: usize, how: runner::How, perturb: bool) -> Outcome {
        let mut args: Vec<OsString> = vec![
            "__corpus-run".into(),
            "--class".into(),
            class.as_str().into(),
            "--isolation".into(),
            how.as_str().into(),
        ];
        if perturb {
            args.push("--perturb".into());
        }
        args.extend([path.into(), index.to_string().into()]);
        let (end, stdout, stderr) = self.child(args);
        let line = stdout.lines().next().unwrap_or("");
        match end {
            End::Exited(0) => parse_reply(line).unwrap_or_else(|| Outcome::Died(died(end, &stderr))),
            End::Hung(after) => Outcome::Hung(after),
            end => Outcome::Died(died(end, &stderr)),
        }
    }
}

fn parse_reply(line: &str) -> Option<Outcome> {
    let (word, rest) = line.split_once(' ')?;
    match word {
        "digest" => {
            let mut parts = rest.split(' ');
            let hash = parts.next()?.to_string();
            let bytes = parts.next()?.parse().ok()?;
            let faults = parts.next()?.parse().ok()?;
            Some(Outcome::Digest { hash, bytes, faults })
        }
        "bypassed" => Some(Outcome::Bypassed(rest.to_string())),
        "cannot" => Some(Outcome::Cannot(rest.to_string())),
        _ => None,
    }
}

/// "crashed (killed by SIGSEGV)", "exited with status 3: <its last message>".
fn died(end: End, stderr: &str) -> String {
    let last = stderr.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let last: String = last.chars().take(200).collect();
    let said = if last.is_empty() { String::new() } else { format!(": {last}") };
    match end {
        End::Signaled(sig) => format!("crashed (killed by {})", ward::fault::signal_name(sig)),
        End::Hung(after) => format!("timed out (killed after {} s)", after.as_secs()),
        End::Exited(0) => format!("exited without a result{said}"),
        End::Exited(code) => format!("exited with status {code}{said}"),
    }
}

/// What the two native runs say.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum Native {
    Deterministic { digest: String, bytes: u64 },
    Nondeterministic { reason: String },
    CannotRun { reason: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum VerdictKind {
    Identical,
    Differs,
    CannotRun,
    /// Not compared: the plugin's native output is not reproducible.
    Nondeterministic,
}

impl VerdictKind {
    fn text(self) -> &'static str {
        match self {
            VerdictKind::Identical => "identical",
            VerdictKind::Differs => "differs",
            VerdictKind::CannotRun => "cannot run",
            VerdictKind::Nondeterministic => "nondeterministic",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Verdict {
    kind: String,
    verdict: VerdictKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Faults ward recovered during the run (the output was identical all the same, or not).
    faults: u64,
}

impl Verdict {
    fn text(&self) -> String {
        match &self.reason {
            Some(r) => format!("{}: {r}", self.verdict.text()),
            None => self.verdict.text().to_string(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct PluginResult {
    class: Class,
    path: PathBuf,
    /// None when the library's plugins could not even be listed.
    index: Option<usize>,
    label: String,
    name: String,
    native: Native,
    verdicts: Vec<Verdict>,
}

impl PluginResult {
    fn identical_everywhere(&self) -> bool {
        self.verdicts.iter().all(|v| v.verdict == VerdictKind::Identical)
    }

    fn who(&self) -> String {
        let file =
            self.path.file_name().map_or_else(|| self.path.display().to_string(), |f| f.to_string_lossy().into());
        match self.index {
            Some(i) if self.class == Class::Ladspa => format!("{file} #{i} {}", self.label),
            _ => format!("{file} {}", self.label),
        }
    }
}

/// Judge the native runs.
fn judge_native(first: &Outcome, second: Option<&Outcome>) -> Native {
    match (first, second) {
        (Outcome::Digest { hash: a, bytes, .. }, Some(Outcome::Digest { hash: b, .. })) if a == b => {
            Native::Deterministic { digest: a.clone(), bytes: *bytes }
        }
        (Outcome::Digest { hash: a, .. }, Some(Outcome::Digest { hash: b, .. })) => Native::Nondeterministic {
            reason: format!(
                "the two native runs differ (digests {a} and {b}; the second with uninitialised memory and the \
                 memory around its buffers perturbed)"
            ),
        },
        (Outcome::Digest { .. }, Some(other)) => Native::Nondeterministic {
            reason: format!("the plain native run gives output; the perturbed one: {}", other.describe()),
        },
        (other, Some(Outcome::Digest { .. })) => Native::Nondeterministic {
            reason: format!("the plain native run: {}; the perturbed one gives output", other.describe()),
        },
        (other, _) => Native::CannotRun { reason: other.describe() },
    }
}

impl Native {
    fn text(&self) -> String {
        match self {
            Native::Deterministic { .. } => "deterministic".into(),
            Native::Nondeterministic { reason } => format!("nondeterministic: {reason}"),
            Native::CannotRun { reason } => format!("cannot run: {reason}"),
        }
    }
}

/// Judge a run under `kind` against the native runs.
fn judge(native: &Native, kind: Isolation, ward: &Outcome) -> Verdict {
    let (verdict, reason) = match (native, ward) {
        (Native::CannotRun { reason }, w) => {
            (VerdictKind::CannotRun, format!("natively: {reason}; under ward: {}", w.describe()))
        }
        (Native::Deterministic { digest, .. }, Outcome::Digest { hash, .. }) if hash == digest => {
            (VerdictKind::Identical, String::new())
        }
        (Native::Deterministic { digest, bytes: nb }, Outcome::Digest { hash, bytes, .. }) => (
            VerdictKind::Differs,
            format!("output differs from the native run (digest {hash}, {bytes} bytes; natively {digest}, {nb} bytes)"),
        ),
        (Native::Nondeterministic { .. }, Outcome::Digest { .. }) => {
            (VerdictKind::Nondeterministic, "runs; not compared (natively nondeterministic)".to_string())
        }
        // Output that depends on memory the plugin does not own may end in a fault where that memory differs (a
        // guard page after a buffer under ward): not ward's doing.
        (Native::Nondeterministic { .. }, w) => {
            (VerdictKind::CannotRun, format!("{}; natively nondeterministic", w.describe()))
        }
        (_, Outcome::Bypassed(r)) => (VerdictKind::Differs, format!("the class wrapper bypassed the plugin: {r}")),
        (_, Outcome::Died(r)) => (VerdictKind::Differs, format!("the run {r}; natively it runs")),
        (_, Outcome::Cannot(r)) => (VerdictKind::CannotRun, r.clone()),
        (_, w @ Outcome::Hung(_)) => (VerdictKind::CannotRun, w.describe()),
    };
    let faults = match ward {
        Outcome::Digest { faults, .. } => *faults,
        _ => 0,
    };
    Verdict { kind: kind.to_string(), verdict, reason: (!reason.is_empty()).then_some(reason), faults }
}

fn how(kind: Isolation) -> runner::How {
    match kind {
        Isolation::None => runner::How::None,
        Isolation::Mpk => runner::How::Mpk,
        Isolation::Process | Isolation::Auto => runner::How::Process,
    }
}

/// One plugin: natively twice, then under each kind.
fn run_plugin(runs: &Runs, kinds: &[Isolation], job: &Job) -> PluginResult {
    let (class, path) = (job.class, &job.path);
    let base = |native: Native, verdicts: Vec<Verdict>| PluginResult {
        class,
        path: path.clone(),
        index: job.listed.as_ref().ok().map(|l| l.index),
        label: job.listed.as_ref().map_or_else(|_| String::new(), |l| l.label.clone()),
        name: job.listed.as_ref().map_or_else(|_| String::new(), |l| l.name.clone()),
        native,
        verdicts,
    };
    let listed = match &job.listed {
        Ok(l) => l,
        Err(reason) => {
            let reason = format!("its library's plugins cannot be listed natively: {reason}");
            let verdicts = kinds
                .iter()
                .map(|k| Verdict {
                    kind: k.to_string(),
                    verdict: VerdictKind::CannotRun,
                    reason: Some(reason.clone()),
                    faults: 0,
                })
                .collect();
            return base(Native::CannotRun { reason }, verdicts);
        }
    };
    let first = runs.run(class, path, listed.index, runner::How::Native, false);
    // A plugin that hangs natively is not given another minute, natively or under ward.
    if let Outcome::Hung(_) = first {
        let native = judge_native(&first, None);
        let verdicts = kinds
            .iter()
            .map(|k| Verdict {
                kind: k.to_string(),
                verdict: VerdictKind::CannotRun,
                reason: Some(format!("natively: {}; not run under ward", first.describe())),
                faults: 0,
            })
            .collect();
        return base(native, verdicts);
    }
    let second = runs.run(class, path, listed.index, runner::How::Native, true);
    let mut native = judge_native(&first, Some(&second));
    let outcomes: Vec<Outcome> = kinds.iter().map(|&k| runs.run(class, path, listed.index, how(k), false)).collect();
    // Before calling an output under ward different, make sure the native output really is reproducible: some
    // plugins vary only now and then (FFTW plans chosen by timing, say).
    if let Native::Deterministic { digest, .. } = &native {
        let differs = outcomes.iter().any(|o| matches!(o, Outcome::Digest { hash, .. } if hash != digest));
        if differs {
            for _ in 0..NATIVE_RECHECKS {
                if let Outcome::Digest { hash, .. } = runs.run(class, path, listed.index, runner::How::Native, false) {
                    if &hash != digest {
                        native = Native::Nondeterministic {
                            reason: format!(
                                "native runs differ when run again (digests {digest} and {hash}), after the output \
                                 under ward differed"
                            ),
                        };
                        break;
                    }
                }
            }
            if differs && matches!(native, Native::Deterministic { .. }) && links_fftw(path) {
                native = Native::Nondeterministic {
                    reason: format!(
                        "it links FFTW, whose plans are chosen by timing (FFTW_MEASURE), and its output under ward \
                         differed from {} native runs that agreed",
                        NATIVE_RECHECKS + 2
                    ),
                };
            }
        }
    }
    let verdicts = kinds.iter().zip(&outcomes).map(|(&k, o)| judge(&native, k, o)).collect();
    base(native, verdicts)
}

/// Whether the library at `path` needs FFTW (`libfftw3*`). FFTW's planner times candidate algorithms and keeps
/// the fastest, so the same input can come out with different rounding from one run to another, more often on a
/// busy machine (seen with swh's `imp`: three digests, one of them only under ward).
fn links_fftw(path: &Path) -> bool {
    use object::read::elf::{Dyn, FileHeader};
    let Ok(data) = std::fs::read(path) else { return false };
    let Ok(header) = object::elf::FileHeader64::<object::LittleEndian>::parse(&*data) else { return false };
    let endian = object::LittleEndian;
    let Ok(sections) = header.sections(endian, &*data) else { return false };
    let Ok(Some((dynamic, link))) = sections.dynamic(endian, &*data) else { return false };
    let Ok(strings) = sections.strings(endian, &*data, link) else { return false };
    dynamic.iter().any(|d| {
        d.tag32(endian) == Some(object::elf::DT_NEEDED)
            && d.string(endian, strings).is_ok_and(|name| name.starts_with(b"libfftw3"))
    })
}

/// One plugin to run (or a library whose plugins could not be listed).
struct Job {
    class: Class,
    path: PathBuf,
    listed: Result<Listed, String>,
}

/// `f` over `items` on `jobs` threads, results in the items' order; `done` is told of every finished item.
fn parallel<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    f: impl Fn(&T) -> R + Sync,
    done: impl Fn(usize) + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                done(finished.fetch_add(1, Ordering::Relaxed) + 1);
            });
        }
    });
    results.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().map(|r| r.expect("every item ran")).collect()
}

/// Counts of one class under one kind.
#[derive(Debug, Clone, Default, Serialize)]
struct KindTotals {
    kind: String,
    identical: usize,
    differs: usize,
    cannot_run: usize,
    nondeterministic: usize,
    /// Identical plugins among the natively deterministic ones, in percent.
    identical_share: f64,
}

#[derive(Debug, Clone, Serialize)]
struct ClassTotals {
    class: Class,
    libraries: usize,
    plugins: usize,
    natively_deterministic: usize,
    natively_nondeterministic: usize,
    natively_cannot_run: usize,
    kinds: Vec<KindTotals>,
}

#[derive(Debug, Serialize)]
struct Unavailable {
    kind: String,
    reason: String,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    classes: Vec<Class>,
    kinds: Vec<String>,
    unavailable: Vec<Unavailable>,
    jobs: usize,
    timeout_s: u64,
    seconds: f64,
    differs: usize,
    totals: Vec<ClassTotals>,
    plugins: Vec<PluginResult>,
}

fn totals(class: Class, results: &[PluginResult], kinds: &[Isolation]) -> ClassTotals {
    let mine: Vec<&PluginResult> = results.iter().filter(|r| r.class == class).collect();
    let mut libraries: Vec<&Path> = mine.iter().map(|r| r.path.as_path()).collect();
    libraries.dedup();
    let count = |f: fn(&Native) -> bool| mine.iter().filter(|r| f(&r.native)).count();
    let deterministic = count(|n| matches!(n, Native::Deterministic { .. }));
    let kinds = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let mut t = KindTotals { kind: k.to_string(), ..KindTotals::default() };
            for r in &mine {
                match r.verdicts[i].verdict {
                    VerdictKind::Identical => t.identical += 1,
                    VerdictKind::Differs => t.differs += 1,
                    VerdictKind::CannotRun => t.cannot_run += 1,
                    VerdictKind::Nondeterministic => t.nondeterministic += 1,
                }
            }
            t.identical_share = if deterministic == 0 {
                0.0
            } else {
                (1000.0 * t.identical as f64 / deterministic as f64).round() / 10.0
            };
            t
        })
        .collect();
    ClassTotals {
        class,
        libraries: libraries.len(),
        plugins: mine.len(),
        natively_deterministic: deterministic,
        natively_nondeterministic: count(|n| matches!(n, Native::Nondeterministic { .. })),
        natively_cannot_run: count(|n| matches!(n, Native::CannotRun { .. })),
        kinds,
    }
}

pub fn run(args: CorpusArgs) -> Result<bool> {
    let started = Instant::now();
    let kinds = parse_kinds(args.isolation.as_deref())?;
    let libs = libraries(args.class, &args.paths)?;
    let jobs = args.jobs.map_or_else(|| std::thread::available_parallelism().map_or(1, usize::from), |j| j as usize);
    let runs = Runs { timeout: Duration::from_secs(args.timeout_s) };
    let run_kinds: Vec<Isolation> = kinds.iter().filter(|k| k.unavailable.is_none()).map(|k| k.isolation).collect();

    let s = if libs.len() == 1 { "y" } else { "ies" };
    eprintln!("ward corpus: listing the plugins of {} librar{s}", libs.len());
    let listings = parallel(&libs, jobs, |(class, path)| runs.list(*class, path), |_| {});
    let mut work = Vec::new();
    for ((class, path), listing) in libs.iter().zip(listings) {
        match listing {
            Ok(plugins) => {
                work.extend(plugins.into_iter().map(|l| Job { class: *class, path: path.clone(), listed: Ok(l) }))
            }
            Err(reason) => work.push(Job { class: *class, path: path.clone(), listed: Err(reason) }),
        }
    }
    let total = work.len();
    let kind_names: Vec<&str> = run_kinds.iter().map(|k| k.as_str()).collect();
    eprintln!(
        "ward corpus: {total} plugins, each natively twice and under {} ({jobs} at once)",
        if kind_names.is_empty() { "no kind".to_string() } else { kind_names.join(", ") }
    );
    let progress = |done: usize| {
        if done.is_multiple_of(PROGRESS_EVERY) || done == total {
            eprintln!("ward corpus: {done}/{total} plugins ({:.0} s)", started.elapsed().as_secs_f64());
        }
    };
    let results = parallel(&work, jobs, |job| run_plugin(&runs, &run_kinds, job), progress);

    let mut classes: Vec<Class> = libs.iter().map(|(c, _)| *c).collect();
    classes.sort();
    classes.dedup();
    let report = Report {
        command: command_line(),
        classes: classes.clone(),
        kinds: run_kinds.iter().map(|k| k.to_string()).collect(),
        unavailable: kinds
            .iter()
            .filter_map(|k| {
                k.unavailable.as_ref().map(|r| Unavailable { kind: k.isolation.to_string(), reason: r.clone() })
            })
            .collect(),
        jobs,
        timeout_s: args.timeout_s,
        seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        differs: results.iter().filter(|r| r.verdicts.iter().any(|v| v.verdict == VerdictKind::Differs)).count(),
        totals: classes.iter().map(|&c| totals(c, &results, &run_kinds)).collect(),
        plugins: results,
    };

    if let Some(file) = &args.markdown {
        std::fs::write(file, markdown(&report)).with_context(|| format!("cannot write {}", file.display()))?;
    }
    if args.json {
        say!("{}", serde_json::to_string_pretty(&report).context("cannot encode the report as JSON")?)?;
    } else {
        print_human(&report)?;
    }
    Ok(report.differs == 0)
}

/// This program's command line, as typed (for the record).
fn command_line() -> String {
    let mut words = vec!["ward".to_string()];
    words.extend(std::env::args().skip(1).map(|a| {
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)) {
            format!("'{}'", a.replace('\'', r"'\''"))
        } else {
            a
        }
    }));
    words.join(" ")
}

fn print_human(report: &Report) -> Result<()> {
    let columns = Columns::new(&[6, 7, 7, 9, 7, 10]);
    say!("{}", columns.row(&["class", "kind", "plugins", "identical", "differs", "cannot run", "nondeterministic"]))?;
    for t in &report.totals {
        for k in &t.kinds {
            let cells = [
                t.class.as_str().to_string(),
                k.kind.clone(),
                t.plugins.to_string(),
                k.identical.to_string(),
                k.differs.to_string(),
                k.cannot_run.to_string(),
                k.nondeterministic.to_string(),
            ];
            let refs: Vec<&str> = cells.iter().map(String::as_str).collect();
            say!("{}", columns.row(&refs))?;
        }
    }
    for u in &report.unavailable {
        say!("{}: not run: {}", u.kind, u.reason)?;
    }
    let exceptions: Vec<&PluginResult> = report.plugins.iter().filter(|r| !r.identical_everywhere()).collect();
    if !exceptions.is_empty() {
        say!("")?;
        say!("Not identical under every kind ({}):", exceptions.len())?;
        for r in exceptions {
            say!("  {} {}", r.class, r.who())?;
            say!("      natively: {}", r.native.text())?;
            for v in r.verdicts.iter().filter(|v| v.verdict != VerdictKind::Identical) {
                say!("      {}: {}", v.kind, v.text())?;
            }
        }
    }
    say!("")?;
    let (s, verb) = if report.differs == 1 { ("", "differs") } else { ("s", "differ") };
    say!(
        "{} plugins, {} plugin{s} {verb} under ward; took {:.1} s with {} jobs",
        report.plugins.len(),
        report.differs,
        report.seconds,
        report.jobs
    )
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The coverage tables: per class the totals per kind, then every plugin not identical under some kind.
fn markdown(report: &Report) -> String {
    let mut md = String::new();
    let mut line = |s: &str| {
        md.push_str(s);
        md.push('\n');
    };
    line(&format!(
        "Produced by `{}` in {:.0} s ({} runs at once, {} s timeout per run).",
        report.command, report.seconds, report.jobs, report.timeout_s
    ));
    line("");
    for u in &report.unavailable {
        line(&format!("`{}` is not run: {}.", u.kind, u.reason));
        line("");
    }
    for t in &report.totals {
        line(&format!("## {} ({} plugins in {} libraries)", t.class.title(), t.plugins, t.libraries));
        line("");
        line(&format!(
            "Natively {} plugins are deterministic, {} nondeterministic (the plain and the perturbed native run \
             differ; under ward they are run but not compared), {} cannot run.",
            t.natively_deterministic, t.natively_nondeterministic, t.natively_cannot_run
        ));
        line("");
        line("| kind | identical | differs | cannot run | nondeterministic | identical of deterministic |");
        line("| --- | ---: | ---: | ---: | ---: | ---: |");
        for k in &t.kinds {
            line(&format!(
                "| {} | {} | {} | {} | {} | {:.1}% |",
                k.kind, k.identical, k.differs, k.cannot_run, k.nondeterministic, k.identical_share
            ));
        }
        for u in &report.unavailable {
            line(&format!("| {} | not run: unavailable | | | | |", u.kind));
        }
        line("");
        let exceptions: Vec<&PluginResult> =
            report.plugins.iter().filter(|r| r.class == t.class && !r.identical_everywhere()).collect();
        if exceptions.is_empty() {
            line(&format!("Every {} plugin is identical under every kind run.", t.class.title()));
            line("");
            continue;
        }
        line(&format!("### Not identical under some kind ({})", exceptions.len()));
        line("");
        let mut header = "| plugin | natively |".to_string();
        let mut rule = "| --- | --- |".to_string();
        for k in &report.kinds {
            header.push_str(&format!(" {k} |"));
            rule.push_str(" --- |");
        }
        line(&header);
        line(&rule);
        for r in exceptions {
            let mut row = format!("| `{}` | {} |", cell(&r.who()), cell(&r.native.text()));
            for v in &r.verdicts {
                row.push_str(&format!(" {} |", cell(&v.text())));
            }
            line(&row);
        }
        line("");
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_that_links_fftw_is_told_from_one_that_does_not() {
        let (fftw, plain) = (Path::new("/usr/lib/ladspa/imp_1199.so"), Path::new("/usr/lib/ladspa/amp_1181.so"));
        for p in [fftw, plain] {
            assert!(p.is_file(), "{} is missing: run scripts/deps (it installs swh-plugins)", p.display());
        }
        assert!(links_fftw(fftw));
        assert!(!links_fftw(plain));
        assert!(!links_fftw(Path::new("/nonexistent/plugin.so")));
    }

    #[test]
    fn listed_lines_round_trip() {
        let l = Listed { index: 3, label: "amp\tmono".into(), name: "Mono Amplifier".into() };
        assert_eq!(
            Listed::parse(&l.line()),
            Some(Listed { index: 3, label: "amp mono".into(), name: "Mono Amplifier".into() })
        );
    }

    #[test]
    fn replies_parse() {
        assert_eq!(
            parse_reply("digest 00ff 4096 1"),
            Some(Outcome::Digest { hash: "00ff".into(), bytes: 4096, faults: 1 })
        );
        assert_eq!(parse_reply("cannot no such plugin"), Some(Outcome::Cannot("no such plugin".into())));
        assert_eq!(parse_reply("garbage"), None);
    }

    #[test]
    fn verdicts() {
        let digest = |h: &str| Outcome::Digest { hash: h.into(), bytes: 8, faults: 0 };
        let native = judge_native(&digest("a"), Some(&digest("a")));
        assert!(matches!(native, Native::Deterministic { .. }));
        assert_eq!(judge(&native, Isolation::Process, &digest("a")).verdict, VerdictKind::Identical);
        assert_eq!(judge(&native, Isolation::Process, &digest("b")).verdict, VerdictKind::Differs);
        assert_eq!(judge(&native, Isolation::None, &Outcome::Bypassed("x".into())).verdict, VerdictKind::Differs);
        assert_eq!(judge(&native, Isolation::None, &Outcome::Cannot("x".into())).verdict, VerdictKind::CannotRun);
        let flaky = judge_native(&digest("a"), Some(&digest("b")));
        assert!(matches!(flaky, Native::Nondeterministic { .. }));
        assert_eq!(judge(&flaky, Isolation::None, &digest("c")).verdict, VerdictKind::Nondeterministic);
        let crashes = judge_native(&Outcome::Died("crashed".into()), Some(&Outcome::Died("crashed".into())));
        assert!(matches!(crashes, Native::CannotRun { .. }));
        assert_eq!(judge(&crashes, Isolation::Process, &digest("a")).verdict, VerdictKind::CannotRun);
    }

    #[test]
    fn kinds_parse() {
        let kinds = parse_kinds(Some("process,none,process")).unwrap();
        let names: Vec<Isolation> = kinds.iter().map(|k| k.isolation).collect();
        assert_eq!(names, [Isolation::Process, Isolation::None]);
        assert!(parse_kinds(Some("mpk")).unwrap()[0].unavailable.is_some());
        assert!(parse_kinds(Some("bogus")).is_err());
        assert!(parse_kinds(Some("auto")).is_err());
    }
}
