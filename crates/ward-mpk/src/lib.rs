//! mpk domains: extensions on the host's thread, in memory tagged with a protection key of their own (DESIGN.md
//! §1, §7).
//!
//! Two halves. [`assess`] needs no hardware: it reads an extension's ELF file and says what it contains or needs
//! that an mpk domain cannot hold, which `ward check` reports and the loader refuses. [`domain`] is the domain's
//! machinery, which needs PKU: protection keys, memory tagged with them, the gate and its fault handler, the thread
//! blocks a domain runs with, call deadlines, the loader and the domain runtime. ward's mpk backend puts the two
//! together behind its backend interface; this crate knows nothing of ward's core.

#![deny(unsafe_code)]

pub mod assess;
pub mod domain;

pub use assess::{assess, Assessment, Image, Import};
pub use domain::pku_available;
