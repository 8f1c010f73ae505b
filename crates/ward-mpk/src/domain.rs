//! The machinery of an mpk domain, which needs PKU: protection keys ([`pku`]), memory tagged with them
//! ([`memory`]), the gate and its fault handler ([`gate`]), each host thread's lane ([`lanes`]), the thread blocks
//! the domain runs with ([`thread_block`]), call deadlines ([`watchdog`]), the loader ([`loader`]) and the domain
//! runtime ([`runtime`]): the modules whose job is unsafe code, each marked so with what it touches.

// Touches the memory a domain's pointers name, inside the domain.
#[allow(unsafe_code)]
pub mod checks;
// The gate into and out of a domain, and the fault handler that ends a faulting call.
#[allow(unsafe_code)]
pub mod gate;
// Each host thread's stack and argument area in a domain.
#[allow(unsafe_code)]
pub mod lanes;
// Places an extension's image in a domain's memory and relocates it.
#[allow(unsafe_code)]
pub mod loader;
// Memory tagged with a protection key.
#[allow(unsafe_code)]
pub mod memory;
// Values a domain keeps per host thread, found without a lock.
#[allow(unsafe_code)]
pub mod per_thread;
// Protection keys and the PKRU register.
#[allow(unsafe_code)]
pub mod pku;
// The functions an extension's imports are bound to inside the domain.
#[allow(unsafe_code)]
pub mod runtime;
// The FS base a domain runs with: copies of the host thread's TLS and control blocks.
#[allow(unsafe_code)]
pub mod thread_block;
// Call deadlines: one thread signals the threads that are late.
#[allow(unsafe_code)]
pub mod watchdog;

/// Whether mpk domains can run here: the processor has memory protection keys and the kernel enables them, and the
/// kernel lets user code switch the FS base itself (FSGSBASE, Linux 5.9 and later), which the gate does at every
/// crossing. Every processor with PKU has FSGSBASE.
pub fn pku_available() -> bool {
    pku::available() && thread_block::fsgsbase_enabled()
}

/// For the tests that need PKU, which are marked `#[ignore = "needs PKU"]` (`scripts/test` runs them where the
/// processor has PKU, under emulation where it has not): fails the test, saying why, where there is no PKU, so that
/// a test run with `--include-ignored` on such a machine fails instead of passing without having run.
#[cfg(test)]
pub(crate) fn require_pku() {
    assert!(
        pku_available(),
        "this test needs memory protection keys (PKU), which this machine does not have: run it under scripts/pku-vm"
    );
}
