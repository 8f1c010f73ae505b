//! What can go wrong when injecting faults. Every variant is a problem with the input (the object, or what was
//! asked of it), so each message says what is wrong and what to do instead.

use crate::fault_type::FaultType;

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The bytes do not start with the ELF magic.
    #[error("not an ELF file (it does not start with \\x7fELF): give an x86-64 ELF shared object (.so)")]
    NotElf,
    /// A 32-bit ELF file.
    #[error("a 32-bit ELF file: ward inject mutates x86-64 code only; give a 64-bit shared object")]
    Not64Bit,
    /// An ELF file for another processor.
    #[error("an ELF file for machine {0} ({1}), not x86-64: give an x86-64 shared object")]
    WrongMachine(u16, &'static str),
    /// A relocatable object (`.o`): its code still has unresolved relocations that re-encoding would clobber.
    #[error("a relocatable object (.o): link it into a shared object first (cc -shared)")]
    Relocatable,
    /// The ELF structure is broken (truncated, offsets out of range).
    #[error("malformed ELF file: {0}")]
    Malformed(String),
    /// Nothing to mutate: no executable section (or segment) with bytes in the file, or only the linker's stubs
    /// and the toolchain's start-up code.
    #[error("no executable code of its own: the object holds no code but linker stubs and start-up code")]
    NoExecutableCode,
    /// `Plan::function` names no function of the object.
    #[error("no function named `{name}` in the object; list its functions with `ward inject --list-functions`")]
    UnknownFunction { name: String },
    /// The fault type applies nowhere in the code chosen.
    #[error("no eligible site for {fault_type} faults in {scope}: choose another fault type{hint}")]
    NoEligibleSite { fault_type: FaultType, scope: String, hint: &'static str },
}

/// A name given for a fault type that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault type `{given}`; valid types: {}", FaultType::names().join(", "))]
pub struct UnknownFaultType {
    pub given: String,
}
