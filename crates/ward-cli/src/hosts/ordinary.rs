//! What makes a throwaway host an ordinary one, shared by the demo's hosts and the campaign's: the resource limits
//! a host would run with and the signal dispositions of a C program.

use anyhow::{Context, Result};

/// Descriptors an ordinary host may have open.
pub const OPEN_FILES: u64 = 1024;

/// Give this process the limits of an ordinary host (`address_space` bytes, [`OPEN_FILES`] descriptors), no core
/// files, and the default action for SIGSEGV/SIGBUS.
///
/// The Rust runtime installs its own SIGSEGV/SIGBUS handlers (to report stack overflows of Rust threads); a C host
/// has none, so they are reset to show what such a host sees.
pub fn become_ordinary_host(address_space: u64) -> Result<()> {
    for (resource, value, what) in [
        (libc::RLIMIT_AS, address_space, "address space"),
        (libc::RLIMIT_NOFILE, OPEN_FILES, "open files"),
        (libc::RLIMIT_CORE, 0, "core size"),
    ] {
        let rl = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: `rl` is a valid rlimit; lowering our own limits needs no privilege.
        if unsafe { libc::setrlimit(resource, &rl) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("cannot limit {what}"));
        }
    }
    for sig in [libc::SIGSEGV, libc::SIGBUS] {
        // SAFETY: restoring the default disposition of a signal is always valid.
        if unsafe { libc::signal(sig, libc::SIG_DFL) } == libc::SIG_ERR {
            return Err(std::io::Error::last_os_error()).context("cannot reset a signal handler");
        }
    }
    Ok(())
}
