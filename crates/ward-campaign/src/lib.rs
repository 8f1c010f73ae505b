//! ward's reliability campaigns, in the manner of Nooks' evaluation (section 4.1 of the paper): inject faults into
//! an extension's machine code, run the very same mutated binary natively and under ward, and classify what
//! happened to the host each time.
//!
//! A [`Campaign`] has trials of each fault type. A trial writes one mutated copy of the extension
//! ([`ward_inject::inject`], seeded from the campaign seed and the trial's number) and runs its extension's
//! [`Workload`] on it in a throwaway host process per run: natively, then under each isolation kind. A trial of a
//! library fault kind ([`TrialFault::Library`]: allocation failure, leak, copy overrun) writes the copy unmutated
//! and runs it with a run-time library fault drawn from its seed ([`ward::libfault`]). Each run gets
//! an [`Outcome`] from how its host ended, whether ward detected a fault, and whether the output equals the
//! reference (the unmutated extension's native output). Records go to the campaign directory as each trial ends,
//! so an interrupted campaign resumes where it stopped; [`report::write`] summarises them against the targets
//! (Markdown, JSON and an SVG chart).
//!
//! The library does not start processes itself: the program that runs a campaign provides a [`Launcher`] that
//! runs [`trial_host::run_native`] or [`trial_host::run_ward`] in a child process (the `ward` CLI re-runs itself).
//!
//! Unsafe code is allowed only where a native host must call the extension directly (`workload::caller` and
//! `workload::well` for built-in extensions, `workload::native` for the plugin ABIs) and where the campaign
//! directory is locked (`store`).
#![deny(unsafe_code)]

mod campaign;
mod chart;
pub mod classify;
pub mod config;
mod error;
pub mod launch;
pub mod plan;
pub mod record;
pub mod report;
mod store;
pub mod summary;
mod trial;
pub mod trial_fault;
pub mod trial_host;
pub mod workload;

pub use campaign::{Campaign, Finished, Observer, Options};
pub use classify::{classify, Judgement, Outcome};
pub use config::{parse_isolations, parse_types, CampaignConfig, FaultModel, RunMode};
pub use error::Error;
pub use launch::{HostEnd, HostRequest, HostRun, Launcher};
pub use record::{FaultSite, RunRecord};
pub use trial_fault::TrialFault;
pub use workload::Workload;
