//! The mpk backend: extensions on the host's thread, in memory tagged with a protection key of their own
//! (DESIGN.md §1, §7).
//!
//! The machinery is the `ward-mpk` crate: what an extension must not contain or need for an mpk domain to hold it
//! (`ward_mpk::assess`, which `check` uses too), and the domain's keys, memory, gate, loader and runtime
//! (`ward_mpk::domain`), which need PKU. Here is the [`MpkBackend`] that puts them together behind ward's backend
//! interface, and what ward's own types need converted on the way down.

#[allow(unsafe_code)]
mod backend;

pub(crate) use self::backend::{MpkBackend, MpkConfig};
pub(crate) use ward_mpk::domain::gate::{host_sigaction, host_signal, host_sigset, host_sysv_signal, SIG_HOLD};
pub(crate) use ward_mpk::pku_available;

use ward_mpk::domain::runtime::{InjectedFault, InjectedFaultKind};

use crate::libfault::{LibraryFault, LibraryFaultKind};

impl From<LibraryFaultKind> for InjectedFaultKind {
    fn from(kind: LibraryFaultKind) -> InjectedFaultKind {
        match kind {
            LibraryFaultKind::Alloc => InjectedFaultKind::Alloc,
            LibraryFaultKind::Leak => InjectedFaultKind::Leak,
            LibraryFaultKind::CopyOverrun => InjectedFaultKind::CopyOverrun,
        }
    }
}

impl From<&LibraryFault> for InjectedFault {
    fn from(fault: &LibraryFault) -> InjectedFault {
        InjectedFault {
            kind: fault.kind().into(),
            nth: fault.nth(),
            count: fault.count(),
            extra: fault.extra().unwrap_or(LibraryFault::DEFAULT_EXTRA),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_fault_reaches_the_domain_runtime_as_written_with_its_defaults() {
        let overrun = LibraryFault::new(LibraryFaultKind::CopyOverrun, 1).unwrap().with_extra(8).unwrap();
        let injected = InjectedFault::from(&overrun);
        assert_eq!(injected, InjectedFault { kind: InjectedFaultKind::CopyOverrun, nth: 1, count: 1, extra: 8 });
        let every = LibraryFault::new(LibraryFaultKind::Leak, 2).unwrap().with_count(0).unwrap();
        assert_eq!(InjectedFault::from(&every).count, 0, "count 0: every call from the nth on");
        assert_eq!(InjectedFault::from(&every).kind, InjectedFaultKind::Leak);
        let alloc = LibraryFault::new(LibraryFaultKind::Alloc, 3).unwrap();
        assert_eq!(InjectedFault::from(&alloc).kind, InjectedFaultKind::Alloc);
    }
}
