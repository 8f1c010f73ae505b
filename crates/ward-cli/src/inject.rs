//! `ward inject`: write a copy of an extension with SWIFI faults in its machine code. The ward-inject library does
//! the mutation; this file reads and writes files, checks paths, and prints the report.

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use ward_inject::{FaultType, InjectedFault, Plan};

use crate::output::{self, say, Columns};

const DEFAULT_COUNT: u32 = ward_inject::DEFAULT_COUNT as u32;

#[derive(Args)]
pub struct InjectArgs {
    /// Fault type: source, destination, pointer, interface, branch, loop, text, nop, init or off-by-one.
    #[arg(long = "type", value_name = "TYPE", required_unless_present = "list_functions")]
    fault_type: Option<FaultType>,
    /// Seed of every random choice: the same input, type, seed, count and function give the same output.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// How many faults, each at a different instruction (Nooks injected five per trial).
    #[arg(long, default_value_t = DEFAULT_COUNT, value_parser = clap::value_parser!(u32).range(1..))]
    count: u32,
    /// Put the faults only into this function (see --list-functions).
    #[arg(long, value_name = "NAME")]
    function: Option<String>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
    /// List the functions faults can go into, with their sizes, and exit.
    #[arg(long, conflicts_with_all = ["fault_type", "output", "function"])]
    list_functions: bool,
    /// The extension to mutate, an x86-64 ELF shared object. It is only read.
    #[arg(value_name = "INPUT.so")]
    input: PathBuf,
    /// Where to write the mutated copy (not the input itself).
    #[arg(short, long, value_name = "OUTPUT.so", required_unless_present = "list_functions")]
    output: Option<PathBuf>,
}

/// A mistake in what the user asked for, with what to do instead; `main` exits with status 2 for it.
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

fn bad(message: String) -> anyhow::Error {
    anyhow::Error::new(BadInput(message))
}

/// One fault as a JSON line: the report's fields and the seed that reproduces it.
#[derive(Serialize)]
struct FaultLine<'a> {
    seed: u64,
    #[serde(flatten)]
    fault: &'a InjectedFault,
}

pub fn run(args: InjectArgs) -> Result<bool> {
    let input = fs::read(&args.input).map_err(|e| {
        bad(format!("cannot read {}: {e}; give the path of an x86-64 ELF shared object", args.input.display()))
    })?;
    let (Some(fault_type), Some(output)) = (args.fault_type, args.output.as_deref()) else {
        return list_functions(&args.input, &input, args.json);
    };
    if same_file(&args.input, output) {
        return Err(bad(format!(
            "refusing to overwrite the input {}: ward inject never changes the original; give another path with -o",
            output.display()
        )));
    }

    let plan = Plan { fault_type, seed: args.seed, count: args.count as usize, function: args.function.clone() };
    let injection = ward_inject::inject(&input, &plan).map_err(|e| bad(format!("{}: {e}", args.input.display())))?;
    write_copy(&args.input, output, &injection.bytes)?;

    if args.json {
        for fault in &injection.faults {
            output::json_line(&FaultLine { seed: args.seed, fault })?;
        }
    } else {
        let columns = Columns::new(&[28, 10, 11]);
        for f in &injection.faults {
            let place = format!("{}+{:#x}", f.function, f.function_offset);
            let offset = format!("{:#x}", f.offset);
            say!(
                "{}",
                columns.row(&[&place, &offset, f.fault_type.as_str(), &format!("{} -> {}", f.before, f.after)])
            )?;
        }
        say!(
            "wrote {} with {} {fault_type} fault(s), seed {}; {} is unchanged",
            output.display(),
            injection.faults.len(),
            args.seed,
            args.input.display()
        )?;
    }
    if injection.faults.len() < plan.count {
        eprintln!(
            "ward: warning: only {} of {} {fault_type} faults fit: {} has no more eligible sites{}",
            injection.faults.len(),
            plan.count,
            args.input.display(),
            if plan.function.is_some() { " in that function" } else { "" }
        );
    }
    Ok(true)
}

fn list_functions(path: &Path, input: &[u8], json: bool) -> Result<bool> {
    let functions = ward_inject::functions(input).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let columns = Columns::new(&[28, 10, 8, 10]);
    if !json {
        say!("{}", columns.row(&["function", "offset", "size", "section", "note"]))?;
    }
    for f in &functions {
        if json {
            output::json_line(f)?;
        } else {
            let note = if f.toolchain { "toolchain start-up code: only with --function" } else { "" };
            say!("{}", columns.row(&[&f.name, &format!("{:#x}", f.offset), &f.size.to_string(), &f.section, note]))?;
        }
    }
    Ok(true)
}

/// Whether `output` names the same file as `input`, by path or, when it exists, by device and inode (a hard link or
/// another spelling of the path).
fn same_file(input: &Path, output: &Path) -> bool {
    if input == output {
        return true;
    }
    match (fs::metadata(input), fs::metadata(output)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Writes `bytes` to `output` through a temporary file and a rename, so a reader never sees half a shared object,
/// with the input's permissions (a shared object is usually executable).
fn write_copy(input: &Path, output: &Path, bytes: &[u8]) -> Result<()> {
    let name = output.file_name().with_context(|| format!("{} names no file", output.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = output.with_file_name(tmp_name);
    let result = (|| -> Result<()> {
        let mut file = fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        file.write_all(bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
        if let Ok(meta) = fs::metadata(input) {
            file.set_permissions(meta.permissions())
                .with_context(|| format!("cannot set the permissions of {}", tmp.display()))?;
        }
        drop(file);
        fs::rename(&tmp, output).with_context(|| format!("cannot write {}", output.display()))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
