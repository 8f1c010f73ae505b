//! ward's software-implemented fault injector (SWIFI), after Nooks (section 4.1 and Table II of the paper), which
//! adapted the Rio file cache's injector: it changes single instructions of an extension's machine code to emulate
//! common programming errors, so that the same mutated binary can be run natively and under ward and the outcomes
//! compared.
//!
//! [`inject`] takes the bytes of an x86-64 ELF shared object and a [`Plan`] (fault type, seed, count, optionally one
//! function) and returns the mutated bytes with a report of every [`InjectedFault`]. It is a pure function of its
//! inputs: the same bytes and plan give byte-identical output and the same report, which is what lets a campaign
//! replay a trial from its seed.
//!
//! Guarantees:
//! - only bytes of executable code change: ELF headers, tables and every other section are copied as they were;
//! - every mutated instruction keeps its length (re-encodings that come out shorter are padded with NOPs, longer
//!   ones are refused), so every other instruction stays where it was and every branch still lands on an
//!   instruction boundary; relative branches that are re-encoded keep their targets;
//! - faults never share a byte.

#![deny(unsafe_code)]

mod decode;
mod ehframe;
mod elf;
mod encode;
mod error;
mod fault_type;
mod injected;
mod mutate;
mod plan;
mod rng;

pub use elf::{functions, Function};
pub use error::{InjectError, UnknownFaultType};
pub use fault_type::FaultType;
pub use injected::InjectedFault;

use decode::Listing;
use injected::{hex, Disasm};
use rng::Rng;

/// How many faults a plan asks for unless told otherwise: Nooks injected five per trial.
pub const DEFAULT_COUNT: usize = 5;

/// What to inject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub fault_type: FaultType,
    /// Every random choice derives from this.
    pub seed: u64,
    /// How many faults to inject, each at a different instruction. When the code has fewer sites that take this
    /// fault type, [`inject`] injects as many as there are; compare with [`Injection::faults`]`.len()`.
    pub count: usize,
    /// Only this function (a symbol name, or a section name for objects without symbols). `None`: every function
    /// except the toolchain's start-up and tear-down code (see [`Function::toolchain`]).
    pub function: Option<String>,
}

impl Plan {
    /// [`DEFAULT_COUNT`] faults of `fault_type` anywhere in the extension's own code.
    pub fn new(fault_type: FaultType, seed: u64) -> Self {
        Plan { fault_type, seed, count: DEFAULT_COUNT, function: None }
    }
}

/// The outcome of [`inject`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// The mutated object, as long as the input.
    pub bytes: Vec<u8>,
    /// What changed, sorted by file offset.
    pub faults: Vec<InjectedFault>,
}

/// Mutates a copy of the ELF object `input` according to `plan`.
///
/// Fails if `input` is not a 64-bit x86-64 ELF shared object or executable, has no code of its own, has no function
/// named `plan.function`, or has no instruction that a fault of `plan.fault_type` applies to.
pub fn inject(input: &[u8], plan: &Plan) -> Result<Injection, InjectError> {
    let all = functions(input)?;
    let targets: Vec<&Function> = match &plan.function {
        Some(name) => {
            let found: Vec<&Function> = all.iter().filter(|f| &f.name == name).collect();
            if found.is_empty() {
                return Err(InjectError::UnknownFunction { name: name.clone() });
            }
            found
        }
        None => all.iter().filter(|f| !f.toolchain).collect(),
    };
    if targets.is_empty() {
        return Err(InjectError::NoExecutableCode);
    }

    let listings: Vec<Listing<'_>> = targets.iter().map(|f| Listing::decode(f, &input[f.file_range()])).collect();
    let mut rng = Rng::new(plan.seed);
    let chosen = plan::choose(plan.fault_type, plan.count, &listings, &mut rng);
    if chosen.is_empty() && plan.count > 0 {
        let (scope, hint) = match &plan.function {
            Some(name) => (format!("function `{name}`"), " or another function"),
            None => ("the object".to_owned(), ""),
        };
        return Err(InjectError::NoEligibleSite { fault_type: plan.fault_type, scope, hint });
    }

    let mut bytes = input.to_vec();
    let mut disasm = Disasm::new();
    let mut faults: Vec<InjectedFault> = chosen
        .into_iter()
        .map(|c| {
            let listing = &listings[c.listing];
            let instr = &listing.instrs[c.instr];
            let offset = listing.file_offset(c.instr);
            let before = listing.bytes(c.instr);
            bytes[offset as usize..offset as usize + before.len()].copy_from_slice(&c.bytes);
            InjectedFault {
                fault_type: plan.fault_type,
                function: listing.function.name.clone(),
                offset,
                function_offset: offset - listing.function.offset,
                address: instr.ip(),
                before: disasm.instruction(instr),
                after: disasm.bytes(&c.bytes, instr.ip()),
                before_bytes: hex(before),
                after_bytes: hex(&c.bytes),
            }
        })
        .collect();
    faults.sort_by_key(|f| f.offset);
    Ok(Injection { bytes, faults })
}
