//! The preload shim of `ward run` (DESIGN.md §5, transparent mode).
//!
//! `ward run` starts an unmodified host with this library in `LD_PRELOAD`. The shim defines `dlopen` and `dlclose`:
//! when the host opens a shared object of a known class (a LADSPA, frei0r or LV2 plugin, recognised by its exports), the
//! shim opens the plugin under ward instead (in a domain of the isolation `ward run` asked for) and hands the host a
//! **proxy**: a small library exporting the class's entry points, whose functions are the class wrappers. The host
//! cannot tell: it reads descriptors and calls function pointers as it always did. Everything else the host opens
//! goes to the real `dlopen` untouched.
//!
//! It fails closed: a plugin of a known class that cannot be opened under ward (it crashed or hung in its domain,
//! described itself wrongly, or the policy is unusable) is never loaded without ward. The host's `dlopen` returns
//! NULL and its next `dlerror` on that thread says why (the shim defines `dlerror` for that, passing through to
//! libc's otherwise); ward says it once on standard error. Only files ward cannot take at all (no plugin of a
//! known class, or a file it cannot classify) load natively, and the policy's `native_fallback = false` refuses
//! those that look like plugins too. Classifying a file reads only its headers and dynamic symbols, within a bound,
//! and nothing of a file that is not a regular file.
//!
//! It also defines `sigaction` and `signal` ([`signals`]), so that handlers the host installs late are wrapped for
//! mpk domains like the ones it installed before.
//!
//! It also serves the host's large heap blocks from ward's arena ([`heap`]), so a process domain can be lent a
//! video frame in place instead of a copy of it.
//!
//! Configuration comes from the environment `ward run` sets: `WARD_ISOLATION`, `WARD_POLICY` (a policy file),
//! `WARD_LOG` (a file that receives the recovery events too). Recovery events go to standard error, one line each.
//!
//! This crate is one of the few whose job is unsafe code: it implements C entry points called by foreign code with
//! raw pointers. Every unsafe block says why it is sound, given the class's C contract.

#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod frei0r;
mod guard;
#[allow(unsafe_code)]
mod heap;
#[allow(unsafe_code)]
mod instance;
#[allow(unsafe_code)]
mod interpose;
#[allow(unsafe_code)]
mod ladspa;
#[allow(unsafe_code)]
mod lv2;
#[allow(unsafe_code)]
mod proxy;
mod runtime;
#[allow(unsafe_code)]
mod search;
#[allow(unsafe_code)]
mod signals;

/// A plugin's name or description as a C string for the host (a NUL inside, which C cannot carry, is dropped).
fn c_string(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s.replace('\0', "")).unwrap_or_default()
}
