//! Class wrappers: one hand-written set per plugin ABI, shared by every plugin of that ABI (Nooks' wrapper sharing)
//! and independent of the isolation kind that runs it (DESIGN.md §2).
//!
//! A class has two halves. Its **adapter** is a small C library loaded into the domain in place of the plugin: it
//! opens the plugin there and turns the plugin's pointer-rich interface (descriptor structs, function pointers,
//! port pointers) into flat calls the generic call API carries. Its **wrapper** here is the typed Rust API a host
//! uses: it checks arguments, packs buffers call-by-value-result, tells the core which calls establish state (so they
//! are replayed after a restart), and degrades gracefully when the plugin is disabled (audio passes through, a
//! frame is copied unchanged).
//!
//! * [`ladspa`]: LADSPA audio plugins.
//! * [`frei0r`]: frei0r video filters.
//! * [`lv2`]: LV2 plugins, with the host's features proxied.
//! * [`runtime`]: runtimes of plugins compiled from C at run time, linked into a running domain.
//! * [`native_calls`]: the ABIs called directly in this process, without ward (native hosts, campaigns, the corpora).

#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod abi;
mod adapters;
pub mod cache;
pub mod detect;
mod error;
pub mod frei0r;
pub mod ladspa;
pub mod lv2;
#[allow(unsafe_code)]
pub mod native_calls;
mod plausible;
mod reader;
pub mod runtime;
mod samples;

pub use detect::{class_of, classify, inspect, Class, Classification, ClassifyError, Inspected};
pub use error::{ClassError, DescriptionError, NativeCallError};

/// What a wrapper did with one processing call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed {
    /// The plugin processed it (possibly after a transparent recovery).
    Ran,
    /// The plugin could not (disabled, or the call failed even after recovery): the output is the class's fallback
    /// (input passed through, or silence where there is no input). `reason` says why.
    Bypassed { reason: String },
}
