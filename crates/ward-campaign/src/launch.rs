//! Starting a trial's host. Each run happens in a throwaway process, so neither the extension nor a bug in ward can
//! take the campaign down; the program that starts it (the `ward` CLI re-running itself with a hidden subcommand)
//! implements [`Launcher`].

use std::path::Path;
use std::time::Duration;

use ward::libfault::LibraryFault;

use crate::config::RunMode;
use crate::error::Error;
use crate::trial_host::HostReport;

/// What one host is to do.
#[derive(Debug, Clone, Copy)]
pub struct HostRequest<'a> {
    /// The workload, by name (`well`, `ladspa`, `frei0r`).
    pub workload: &'a str,
    /// The extension to load (a mutated copy, an unmutated one for a library fault, or the original for the
    /// reference run).
    pub path: &'a Path,
    /// Under ward: the file a restart loads instead of `path` (the unmutated extension, for a transient fault).
    pub restart_from: Option<&'a Path>,
    pub mode: RunMode,
    /// A library fault for the calls `path` makes. A native host gets it from its environment
    /// ([`ward::libfault::env_for`] of `path`: the launcher starts it so), a host under ward through the
    /// extension's policy (`library_fault`; [`crate::trial_host::run_ward`]).
    pub library_fault: Option<LibraryFault>,
    /// Deadline of every call under ward, with the workload's policy for campaigns; `None`: ward's default policy
    /// only.
    pub deadline: Option<Duration>,
    /// Under ward, the extension's calls are poisoned (policy `poison`); ignored natively.
    pub poison: bool,
}

/// How a host process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostEnd {
    Exited(i32),
    Signaled(i32),
    /// Still running at the bound; it was killed.
    Hung(Duration),
}

/// A finished host: how it ended and what it printed.
#[derive(Debug, Clone)]
pub struct HostRun {
    pub end: HostEnd,
    pub stdout: String,
    pub stderr: String,
}

impl HostRun {
    /// The host's report: the last line of its stdout that is one.
    pub fn report(&self) -> Option<HostReport> {
        self.stdout.lines().rev().find_map(|line| serde_json::from_str(line.trim()).ok())
    }

    /// The message of a host that could not set itself up.
    pub fn setup_error(&self) -> Option<String> {
        if self.end != HostEnd::Exited(crate::trial_host::SETUP_FAILED) {
            return None;
        }
        let said = self.stdout.lines().find_map(|l| l.strip_prefix("error ")).map(str::to_string);
        Some(said.unwrap_or_else(|| self.stderr.trim().to_string()))
    }
}

/// Runs one host in a throwaway process and waits at most `bound` for it.
pub trait Launcher: Sync {
    fn launch(&self, request: &HostRequest<'_>, bound: Duration) -> Result<HostRun, Error>;
}
