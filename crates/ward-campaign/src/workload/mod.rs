//! Workloads: what a trial's host does with the extension. Each extension a campaign can take has one, a fixed
//! sequence of calls covering its interface whose results make the run's output; the unmutated extension's native
//! output is the reference every run is compared with.
//!
//! A workload runs twice over: natively, where the host resolves symbols itself and calls them directly, and under
//! ward, through a [`Supervisor`]. Built-in test extensions are driven through the generic call API ([`Caller`]);
//! plugin classes (LADSPA, frei0r) will drive theirs through their class wrappers, which is why the trait takes the
//! extension in both forms rather than one call interface.

mod caller;
mod recorder;
mod well;

use std::time::Duration;

use ward::{Extension, Policy, Supervisor};

pub use caller::{Caller, NativeCaller, Symbols, WardCaller};
pub use recorder::{count_differences, first_difference, Entry, Recorder, Span};

/// What a host does with one extension.
pub trait Workload: Sync {
    /// The name of the extension this workload drives (as ward names extensions: `well` for `libwell.so`).
    fn extension(&self) -> &'static str;

    /// One sentence on what it does, for reports.
    fn describe(&self) -> &'static str;

    /// The policy the extension runs under in ward: which calls establish state, which destroy instances, and
    /// `deadline` for every call.
    fn policy(&self, deadline: Duration) -> Policy;

    /// Run natively: the extension is loaded into this process; `symbols` finds its functions.
    fn run_native(&self, symbols: &dyn Symbols, out: &mut Recorder);

    /// Run under ward: `ext` was loaded by `sup` with [`Workload::policy`].
    fn run_ward(&self, sup: &Supervisor, ext: &Extension, out: &mut Recorder);
}

/// Every workload, one per extension.
static WORKLOADS: &[&dyn Workload] = &[&well::Well];

/// The workload of the extension called `name`.
pub fn for_extension(name: &str) -> Option<&'static dyn Workload> {
    WORKLOADS.iter().copied().find(|w| w.extension() == name)
}

/// The extensions that have a workload, comma-separated.
pub fn available() -> String {
    WORKLOADS.iter().map(|w| w.extension()).collect::<Vec<_>>().join(", ")
}
