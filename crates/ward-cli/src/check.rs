//! `ward check`: which isolation kinds each extension can get, and why not. The library reads the files; this
//! file expands directories, keeps going past bad inputs, and prints.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use ward::check::{CheckReport, KindVerdict};
use ward::Isolation;

use crate::report::{self, say, Columns};

#[derive(Args)]
pub struct CheckArgs {
    /// One JSON object per extension per line.
    #[arg(long, conflicts_with = "brief")]
    json: bool,
    /// Only one summary line per extension, without the reasons.
    #[arg(long)]
    brief: bool,
    /// Extensions (.so files), or directories: every *.so directly inside one is checked, in name order.
    #[arg(value_name = "PATH", required = true)]
    paths: Vec<PathBuf>,
}

/// Some inputs could not be checked (each was reported on its own line); `main` exits with status 2.
#[derive(Debug)]
pub struct BadInputs {
    bad: usize,
    total: usize,
}

impl fmt::Display for BadInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.total == 1 { "" } else { "s" };
        write!(f, "{} of {} input{s} could not be checked (see above)", self.bad, self.total)
    }
}

impl std::error::Error for BadInputs {}

pub fn is_bad_input(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<BadInputs>())
}

pub fn run(args: CheckArgs) -> Result<bool> {
    // Inputs are the files checked plus the arguments that did not even give files.
    let mut bad = 0;
    let mut unexpanded = 0;
    let mut files = Vec::new();
    for path in &args.paths {
        match expand(path) {
            Ok(found) => files.extend(found),
            Err(message) => {
                eprintln!("ward: error: {message}");
                bad += 1;
                unexpanded += 1;
            }
        }
    }

    let mut reports = Vec::new();
    for file in &files {
        match ward::check::check(file) {
            Ok(report) if args.json => report::json_line(&report)?,
            Ok(report) => reports.push(report),
            Err(e) => {
                eprintln!("ward: error: {e}");
                bad += 1;
            }
        }
    }

    if !args.json {
        print_human(&reports, args.brief)?;
    }
    if bad > 0 {
        return Err(BadInputs { bad, total: files.len() + unexpanded }.into());
    }
    Ok(true)
}

/// A file stands for itself; a directory for the `*.so` files directly inside it, sorted by name.
fn expand(path: &Path) -> Result<Vec<PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| format!("cannot read directory {}: {e}", path.display()))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read directory {}: {e}", path.display()))?;
        let file = entry.path();
        if file.extension().is_some_and(|x| x == "so") && file.is_file() {
            found.push(file);
        }
    }
    if found.is_empty() {
        return Err(format!("{} holds no *.so files; give extensions or directories of them", path.display()));
    }
    found.sort();
    Ok(found)
}

fn print_human(reports: &[CheckReport], brief: bool) -> Result<()> {
    let width = reports.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let columns = Columns::new(&[width]);
    for r in reports {
        let verdicts: Vec<String> = r.kinds.iter().map(summary).collect();
        say!("{}", columns.row(&[&r.name, &verdicts.join("  ")]))?;
        if !brief {
            for verdict in r.kinds.iter().filter(|k| !k.ok) {
                for reason in &verdict.reasons {
                    say!("    {}: {reason}", verdict.isolation)?;
                }
            }
        }
    }
    let mpk = reports.iter().filter(|r| r.allows(Isolation::Mpk)).count();
    let s = if reports.len() == 1 { "" } else { "s" };
    say!("{mpk} of {} extension{s} can run under mpk", reports.len())
}

/// `mpk ok` or `mpk NO (3 reasons)`.
fn summary(verdict: &KindVerdict) -> String {
    match verdict.reasons.len() {
        _ if verdict.ok => format!("{} ok", verdict.isolation),
        1 => format!("{} NO (1 reason)", verdict.isolation),
        n => format!("{} NO ({n} reasons)", verdict.isolation),
    }
}
