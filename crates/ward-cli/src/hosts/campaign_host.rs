//! `ward __campaign-host`: the throwaway host of one campaign run. It takes an ordinary host's limits, runs the
//! workload on the extension natively (dlopen) or under ward, and prints its report as one JSON line. Whatever the
//! extension (or ward) does to this process, only this process pays.

use std::ffi::c_void;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use ward::libfault::LibraryFault;
use ward_campaign::trial_host::{self, HostReport, SETUP_FAILED};
use ward_campaign::workload::{self, Symbols, WorkloadError};
use ward_campaign::RunMode;

use crate::hosts::native_host::NativeLib;
use crate::output;

/// A campaign host's address space: room for the workload and ward, not for a runaway allocation.
const ADDRESS_SPACE: u64 = 1 << 30;

#[derive(Args)]
pub struct CampaignHostArgs {
    /// The workload: well, ladspa or frei0r.
    #[arg(long)]
    workload: String,
    /// `native`, `mpk`, `process` or `none`.
    #[arg(long)]
    mode: String,
    /// Deadline of every call under ward, with the workload's policy for campaigns; without it, ward's default
    /// policy.
    #[arg(long)]
    deadline_ms: Option<u64>,
    /// Under ward, the file a restart loads (the unmutated extension, for a transient fault).
    #[arg(long)]
    restart_from: Option<PathBuf>,
    /// Under ward, a run-time library fault for the extension's calls (`alloc:nth=3,count=1`), put in its policy. A
    /// native host gets its fault from its environment instead (LD_PRELOAD and WARD_LIBFAULT, which the campaign
    /// sets).
    #[arg(long, value_name = "FAULT")]
    library_fault: Option<LibraryFault>,
    /// Under ward, the extension's calls are poisoned (policy `poison`).
    #[arg(long)]
    poison: bool,
    /// The extension (a mutated copy).
    path: PathBuf,
}

pub fn main(args: CampaignHostArgs) -> Result<bool> {
    let seen = match run(&args) {
        Ok(seen) => seen,
        Err(e) => {
            // The campaign tells a broken setup from an outcome by this status and line.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "error {e:#}").and_then(|()| out.flush());
            std::process::exit(SETUP_FAILED);
        }
    };
    output::json_line(&seen)?;
    Ok(true)
}

fn run(args: &CampaignHostArgs) -> Result<HostReport> {
    crate::hosts::ordinary::become_ordinary_host(ADDRESS_SPACE)?;
    let workload =
        workload::by_name(&args.workload).with_context(|| format!("no workload called {}", args.workload))?;
    let mode: RunMode = args.mode.parse()?;
    match mode.isolation() {
        None if args.library_fault.is_some() => {
            bail!("--library-fault is for hosts under ward; a native host gets its library fault from its environment")
        }
        None => {
            let lib = NativeLib::open(&args.path)?;
            Ok(trial_host::run_native(workload, &Loaded(&lib)))
        }
        Some(isolation) => trial_host::run_ward(
            workload,
            &args.path,
            isolation,
            args.deadline_ms.map(Duration::from_millis),
            args.restart_from.as_deref(),
            args.library_fault,
            args.poison,
        )
        .map_err(|e| anyhow!(e)),
    }
}

/// The native host's own dlopen/dlsym, as the workload's symbol source.
struct Loaded<'a>(&'a NativeLib);

impl Symbols for Loaded<'_> {
    fn address(&self, symbol: &str) -> Result<*const c_void, WorkloadError> {
        self.0.symbol(symbol).map_err(|e| WorkloadError::Symbol { reason: format!("{e:#}") })
    }
}
