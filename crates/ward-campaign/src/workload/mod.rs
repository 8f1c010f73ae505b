//! Workloads: what a trial's host does with the extension. Each kind of extension a campaign can take has one, a
//! fixed sequence of calls covering its interface whose results make the run's output; the unmutated extension's
//! native output is the reference every run is compared with.
//!
//! A workload runs twice over: natively, where the host resolves symbols itself and calls them directly, and under
//! ward, through a [`Supervisor`]. Built-in test extensions are driven through the generic call API ([`Caller`]);
//! plugin libraries (LADSPA, frei0r) through their class wrappers, which load the class's adapter into the domain
//! and open the plugin there themselves: so [`Workload::run_ward`] gets the supervisor and the plugin's path, not a
//! loaded extension. A plugin's workload is chosen by its class ([`ward_classes::class_of`]), a built-in
//! extension's by its name ([`for_path`]).

mod caller;
mod error;
mod frei0r;
mod ladspa;
mod native_plugins;
mod recorder;
mod well;

use std::path::Path;
use std::time::Duration;

use ward::{Extension, Isolation, Policy, Supervisor};
use ward_classes::Class;

pub use caller::{Caller, NativeCaller, Symbols, WardCaller};
pub use error::WorkloadError;
pub use recorder::{count_differences, first_difference, Entry, Recorder, Span};

/// What a host does with one kind of extension.
pub trait Workload: Sync {
    /// The workload's name (`well`, `ladspa`, `frei0r`): what a host is told to run.
    fn name(&self) -> &'static str;

    /// The built-in extension this workload drives (as ward names extensions: `well` for `libwell.so`); `None` for
    /// a plugin class's workload, which drives any plugin of its class.
    fn builtin(&self) -> Option<&'static str>;

    /// One sentence on what it does, for reports.
    fn describe(&self) -> &'static str;

    /// The policy the extension runs under in ward. With a `deadline`, the campaign's: a restart budget,
    /// `deadline` for every call, short backoffs (and history for plugins); with none, ward's default policy
    /// only. Either way, for a built-in extension, which calls establish state and which destroy instances (what a
    /// class wrapper says of its own adapter's functions).
    fn policy(&self, deadline: Option<Duration>) -> Policy;

    /// Run natively: the extension is loaded into this process; `symbols` finds its functions.
    fn run_native(&self, symbols: &dyn Symbols, out: &mut Recorder);

    /// Run under ward: load the extension at `path` through `sup` (made with [`Workload::policy`]) with
    /// `isolation`, and do the work. Returns the extension, for its statistics, or why it could not be loaded or
    /// opened (then the workload did not run).
    fn run_ward(
        &self,
        sup: &Supervisor,
        path: &Path,
        isolation: Isolation,
        out: &mut Recorder,
    ) -> Result<Extension, WorkloadError>;
}

/// Every workload.
static WORKLOADS: &[&dyn Workload] = &[&well::Well, &ladspa::Ladspa, &frei0r::Frei0r];

/// The workload called `name`.
pub fn by_name(name: &str) -> Option<&'static dyn Workload> {
    WORKLOADS.iter().copied().find(|w| w.name() == name)
}

/// The workload of the built-in extension called `name`.
pub fn for_builtin(name: &str) -> Option<&'static dyn Workload> {
    WORKLOADS.iter().copied().find(|w| w.builtin() == Some(name))
}

/// The workload of the extension at `path`: its plugin class's, else its built-in name's.
pub fn for_path(path: &Path) -> Option<&'static dyn Workload> {
    match ward_classes::class_of(path) {
        Some(Class::Ladspa) => Some(&ladspa::Ladspa),
        Some(Class::Frei0r) => Some(&frei0r::Frei0r),
        // LV2 plugins have no campaign workload yet: a binary alone does not say its ports.
        Some(Class::Lv2) | None => for_builtin(&ward::extension_name(path)),
    }
}

/// What has a workload, for messages.
pub fn available() -> String {
    let builtin: Vec<&str> = WORKLOADS.iter().filter_map(|w| w.builtin()).collect();
    format!("{}, and any LADSPA or frei0r plugin library (by path)", builtin.join(", "))
}

/// FNV-1a (64 bit) of `bytes`: how a plugin workload writes a buffer into its output, so that equal outputs are
/// equal text and a report line stays short.
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    ward_xpc::mix::fnv1a(bytes)
}

/// Restarts a plugin's domain may have in a minute: enough for a deterministic fault in every block or frame to
/// cost its two (the failed call, and its retry), and few enough that a plugin that hangs in every call is disabled
/// (and bypassed at once) long before the host's bound.
const PLUGIN_MAX_RESTARTS: u32 = 12;

/// What every workload's policy sets: every call's `deadline`, at most `max_restarts` restarts a minute, and short
/// backoffs (a deterministic fault fails again at every retry; long pauses would only add to a trial's time).
pub(crate) fn trial_policy(deadline: Duration, max_restarts: u32) -> Policy {
    let mut policy = Policy::default();
    let d = policy.defaults_mut();
    d.deadline = Some(deadline);
    d.max_restarts = Some(max_restarts);
    d.restart_period = Some(Duration::from_secs(60));
    d.backoff_initial = Some(Duration::from_micros(100));
    d.backoff_max = Some(Duration::from_millis(10));
    policy
}

/// The history a plugin's domain keeps (`history_mb`): more than any workload's stream of blocks or frames.
const PLUGIN_HISTORY_MB: u64 = 64;

/// The policy of a plugin class's workload: with a `deadline`, [`trial_policy`] with the plugins' restart budget,
/// and history kept; without, ward's default policy, history and all (what a user who never tuned it gets). Which
/// adapter calls establish state, destroy instances or may be retried is the class's business.
pub(crate) fn class_policy(deadline: Option<Duration>) -> Policy {
    let Some(deadline) = deadline else { return Policy::default() };
    let mut policy = trial_policy(deadline, PLUGIN_MAX_RESTARTS);
    let d = policy.defaults_mut();
    // Blocks and frames are kept for replay (the workloads' streams are a few MiB at most), so a plugin restarted
    // in the middle of a stream resumes in the state it had: with a transient fault the output is then the
    // reference's, delay lines and filter memories included.
    d.history_mb = Some(PLUGIN_HISTORY_MB);
    policy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_gets_its_class_workload_and_a_builtin_its_own() {
        let well = ward_extensions::path_of("well").expect("the built-in well.so");
        assert_eq!(for_path(&well).map(|w| w.name()), Some("well"));
        assert_eq!(for_builtin("well").map(|w| w.name()), Some("well"));
        assert!(for_builtin("faulty").is_none());
        for (path, name) in [("/usr/lib/ladspa/amp_1181.so", "ladspa"), ("/usr/lib/frei0r-1/invert0r.so", "frei0r")] {
            assert!(Path::new(path).exists(), "{path} is missing: run scripts/deps");
            assert_eq!(for_path(Path::new(path)).map(|w| w.name()), Some(name), "{path}");
            assert_eq!(by_name(name).map(|w| w.builtin()), Some(None));
        }
        assert!(available().starts_with("well, and any LADSPA or frei0r"), "{}", available());
    }
}
