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
pub mod policy;
#[allow(unsafe_code)] // two probes of the kernel (Landlock, seccomp), no pointers
pub mod sandbox;
mod shadow;
mod supervisor;
pub mod tracker;

/// Where a sleeping process domain runs (its caller's processor); public for `ward bench xpc`'s floor.
pub use backend::process::placement;
pub use call::{Arg, RetType, Signature, ValType, Value};
pub use callback::Callback;
pub use domain::DomainStats;
pub use error::Error;
pub use events::{Disablement, Event, RestartVia};
pub use fault::{DomainHint, Fault, FaultKind, SignalCause};
pub use policy::{Isolation, Policy};
/// Whether this machine has memory protection keys enabled, which isolation `mpk` needs.
pub fn mpk_available() -> bool {
    backend::mpk::pku_available()
}

pub use supervisor::{domain_program, extension_name, AdapterLoad, Extension, Function, Supervisor};

/// How many process domains this process started from a spare made ahead: a process the domain template forked, and
/// that entered its PID namespace, before the domain asked for it (`WARD_DOMAIN_SPARE=off` turns spares off). For
/// tests and diagnosis: a later domain's start should take one.
pub fn domains_started_from_spares() -> u64 {
    backend::process::domains_started_from_spares()
}

/// `sigaction` as a host should see it in a process with mpk domains: what `ward-preload` puts in place of libc's.
///
/// Once ward's signal handlers are installed, a handler the host installs for one of the signals ward handles
/// (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP and the watchdog's) is recorded for ward to pass the host's own
/// signals on to, and one for any other signal is wrapped so that it runs with the host's rights even when its signal
/// comes while a thread is inside a domain; `old` reports the host's own previous action. Before that, and in a
/// process without mpk domains, it is plain `sigaction`.
///
/// # Safety
/// As `sigaction`'s: `act` and `old` are null or valid, and a handler in `act` follows the C signal handler ABI.
#[allow(unsafe_code)]
pub unsafe fn host_sigaction(
    signal: std::ffi::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> std::ffi::c_int {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { backend::mpk::host_sigaction(signal, act, old) }
}

/// glibc's `signal` (and `bsd_signal`) built on [`host_sigaction`]: the handler stays installed, interrupted system
/// calls restart, and the signal is blocked while its handler runs.
///
/// # Safety
/// `handler` is SIG_DFL, SIG_IGN or a function that follows the C signal handler ABI.
#[allow(unsafe_code)]
pub unsafe fn host_signal(signal: std::ffi::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { backend::mpk::host_signal(signal, handler) }
}

/// glibc's `sysv_signal` (what `signal` means in a program compiled for strict ISO C) built on [`host_sigaction`]:
/// the handler is reset to the default as it starts, and the signal is not blocked while it runs.
///
/// # Safety
/// As for [`host_signal`].
#[allow(unsafe_code)]
pub unsafe fn host_sysv_signal(signal: std::ffi::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { backend::mpk::host_sysv_signal(signal, handler) }
}

/// System V's `sigset` built on [`host_sigaction`]: [`SIG_HOLD`] blocks the signal on this thread; any other
/// disposition is installed and unblocks it. Returns `SIG_HOLD` when the signal was blocked, else the previous
/// handler.
///
/// # Safety
/// As for [`host_signal`].
#[allow(unsafe_code)]
pub unsafe fn host_sigset(signal: std::ffi::c_int, disposition: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { backend::mpk::host_sigset(signal, disposition) }
}

/// The disposition [`host_sigset`] takes to mean "block the signal" (glibc's `SIG_HOLD`).
pub const SIG_HOLD: libc::sighandler_t = backend::mpk::SIG_HOLD;
