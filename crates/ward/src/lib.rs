//! ward keeps a host program alive when the native extensions it loads fail.
//!
//! A [`Supervisor`] loads each extension (an ELF shared object with a C ABI) into a protection domain of the
//! isolation kind its [`Policy`] asks for, interposes on every call, tracks what the extension holds, and when the
//! extension fails (a crash, a hang, a protocol violation) stops it, releases what it held, restarts it, replays
//! its state and retries the call, so the host sees nothing or, at worst, a clean error.
//!
//! ```no_run
//! use ward::{Arg, Policy, RetType, Supervisor};
//! let sup = Supervisor::new(Policy::default());
//! let ext = sup.load("well.so")?;
//! let sum = ext.call("well_add", &mut [Arg::I64(2), Arg::I64(3)], RetType::I64)?;
//! assert_eq!(sum.as_i64(), Some(5));
//! # Ok::<(), ward::Error>(())
//! ```
//!
//! The layering follows DESIGN.md §2: [`backend`]s isolate and carry calls and know nothing of extension classes;
//! the core (domain, recovery, [`tracker`], shadow log, [`policy`]) drives them.

#![deny(unsafe_code)]

mod backend;
pub mod call;
pub mod callback;
pub mod check;
mod domain;
pub mod error;
pub mod events;
pub mod fault;
pub mod libfault;
#[allow(unsafe_code)]
mod monitor;
pub mod policy;
mod shadow;
mod supervisor;
pub mod tracker;

pub use call::{Arg, RetType, Signature, ValType, Value};
pub use callback::Callback;
pub use domain::DomainStats;
pub use error::Error;
pub use events::{Event, RestartVia};
pub use fault::{DomainHint, Fault, FaultKind, SignalCause};
pub use policy::{Isolation, Policy};
/// Whether this machine has memory protection keys enabled, which isolation `mpk` needs.
pub fn mpk_available() -> bool {
    backend::mpk::pku_available()
}

pub use supervisor::{domain_program, extension_name, AdapterLoad, Extension, Function, Supervisor};
