//! Policy: how each extension is isolated, supervised and recovered.
//!
//! A policy file is TOML with three kinds of sections:
//!
//! - `[defaults]`: any extension setting; applies to every extension.
//! - `[extension.NAME]`: settings of one extension. `NAME` is the extension's
//!   name: the file stem without a leading `lib` and the `.so`
//!   (`libfaulty.so` is `faulty`). Its `function.FN` sub-tables describe
//!   single functions.
//! - `[group.NAME]`: domain-level settings of a group of extensions that
//!   share one protection domain (isolation, deadline, heartbeat, restart
//!   intensity, backoff, `on_limit`, `zygote`, `wait`, `spin`, `read_past_input_kb`, `limits`).
//!
//! The effective policy of an extension is the built-in default, overridden
//! by `[defaults]`, overridden by `[extension.NAME]`
//! ([`Policy::for_extension`]). The effective policy of a group's domain is
//! the built-in default, overridden by `[defaults]`, overridden by
//! `[group.NAME]` ([`Policy::for_group`]).
//!
//! ```toml
//! [defaults]                 # any extension field
//! isolation = "process"      # none | process | mpk | auto
//! deadline_ms = 10000        # fixes how long one call may take (unset: deadlines are learned, below)
//! deadline_floor_ms = 200    # a learned deadline is at least this ...
//! deadline_ceiling_ms = 10000 # ... and at most this
//! max_failures_in_row = 3    # one call failing this often in a row, each time after its recovery, disables (0 = off)
//! heartbeat_ms = 1000        # 0 = off; domain processes only (an mpk domain once it escalated)
//! max_restarts = 10          # restart intensity: at most max_restarts ...
//! restart_period_s = 60      # ... within restart_period_s (integer or float)
//! backoff_initial_ms = 1     # pause before the 2nd consecutive restart (integer or float)
//! backoff_max_ms = 1000      # the pause doubles (backoff_factor) up to this
//! backoff_factor = 2.0
//! on_fault = "retry"         # the call in flight when the extension fails: retry | fail
//! max_retries = 1
//! escalate_after = 3         # after this many faults in an mpk domain, move to a process domain (0 = never)
//! on_limit = "disable"       # past the restart limit: disable | fail
//! zygote = true              # restart from a pre-forked, pre-loaded process
//! wait = "adaptive"          # adaptive | poll | sleep (see WaitMode: where a process domain runs)
//! spin = 2000                # spin iterations before sleeping (adaptive)
//! init = "well_init"         # called after load (no args, returns int64; nonzero = load failure)
//! check_output = true        # class output checks (audio with NaN or infinity is a fault, retried once)
//! poison = false             # call with poison in every register and stack slot not given (process only)
//! read_past_input_kb = 16    # an extension reading this far past an input reads zeros (0 = faults at once; <= 1024)
//! history_mb = 16            # data calls (history = true) kept for replay: at most this many MiB ... (0 = off)
//! history_replay_ms = 1000  # ... and at most this long to replay (0 = off); past either, the most recent kept
//! checkpoint_ms = 1000       # stream time between saves of a plugin that can save its state (LV2; 0 = never)
//! library_fault = "none"     # fault testing: see below
//! native_fallback = true     # `ward run`: a file that looks like a plugin ward cannot take loads without ward
//! describe_cache = true      # `ward run`: descriptions of unchanged LADSPA/frei0r libraries from the user's cache
//! [defaults.limits]
//! address_space_mb = 1024    # 0 = unlimited, else at least 16
//! cpu_s = 0                  # 0 = unlimited
//! open_files = 256
//! memory_mb = 1024           # the domain's cgroup: memory, shared memory included (0 = unlimited, else >= 16)
//! pids = 128                 # the domain's cgroup: processes and threads (0 = unlimited, else >= 8)
//! cpu_percent = 0            # the domain's cgroup: CPU quota in % of one processor (0 = none)
//! idle_cpu_ms = 100          # CPU a domain may use per second between calls before it is a fault (0 = no check)
//!
//! [extension.faulty]
//! group = "demo"
//! deadline_ms = 500
//! restart_from = "v2/libfaulty.so" # after a failure, restart from this file (relative: to the policy file)
//! [extension.faulty.limits]
//! open_files = 64
//! [extension.faulty.function.faulty_counter_add]
//! state = true               # state-establishing: logged, replayed after a restart
//! retryable = true           # may be re-issued after a fault
//! deadline_ms = 100          # default: the extension's (learned when that is)
//! destroys = false           # releases the handle passed as its first Handle argument
//! history = false            # a data call (processes a block): kept for replay within history_mb and
//!                            # history_replay_ms (the classes mark LADSPA blocks and frei0r frames so)
//!
//! [group.demo]               # domain-level fields for a group
//! zygote = false
//! ```
//!
//! Deadlines are learned unless `deadline_ms` is set: each function's
//! calls get four times the second longest of its last 64 successful
//! calls (about their 98th percentile) once 8 have been seen, kept
//! between `deadline_floor_ms` and `deadline_ceiling_ms`; before that, a
//! class's default for the function (a LADSPA block: 1 s, a frei0r frame:
//! 2 s), else the ceiling. `deadline_ms` in any section that applies to an
//! extension (or a function's own `deadline_ms`) fixes its deadlines: then
//! nothing is learned and the floor and ceiling do not apply. A call that
//! fails `max_failures_in_row` times in a row (hangs count like crashes),
//! each time again after the extension was recovered (before 64 calls of
//! it succeeded since), disables the extension at once, whatever
//! `max_restarts` allows; so does a recovery whose restart fails that many
//! times in a row.
//!
//! Every key is checked: an unknown key or a value out of range is refused
//! with [`PolicyError::Invalid`], which names the file, line and column and
//! says what is accepted. Accepted values:
//!
//! - durations (`*_ms`, `*_s`): non-negative integers or floats, at most
//!   100 years; `deadline_ms` and `restart_period_s` must be positive;
//! - `backoff_factor`: at least 1.0; `max_retries`: at most 100; `spin`: at
//!   most 10 000 000; `limits.open_files`: at least 1;
//!   `limits.address_space_mb` and `limits.memory_mb`: 0 (unlimited) or at
//!   least 16 (less cannot hold a domain); `limits.pids`: 0 (unlimited) or at
//!   least 8; `limits.cpu_percent`: at most 100 000; `limits.idle_cpu_ms`: at
//!   most 1000;
//! - extension and group names: non-empty, of `[A-Za-z0-9_.-]`; function
//!   names and `init`: C function names.
//!
//! `library_fault` injects a run-time library fault into the calls the
//! extension itself makes to its C library (see [`crate::libfault`]):
//! `{ kind = "alloc", nth = 3, count = 1 }`, or the same as a string,
//! `"alloc:nth=3,count=1"`; `"none"` (the default) turns it off. `kind` is
//! `alloc` (allocations fail), `leak` (`free` does nothing) or
//! `copy-overrun` (`mem*`/`str*cpy` write `extra` bytes too many, default
//! 64, at most 1048576); the `nth` eligible call of the process (from 1,
//! default 1) and the `count - 1` after it are affected (`count` 0: every
//! one from then on; default 1, 0 for `leak`). A class adapter's fault
//! applies to the plugin it opens. It needs a domain of the extension's own
//! (no `group`): isolation `process` (a preloaded library injects it) or
//! `mpk` (the domain runtime does; `auto` means `process` then); loading
//! refuses it otherwise.
//!
//! Every key is written once, in `keys.rs` (its field, type, default and documentation, its key in the file, the
//! sections that may set it, and how its value is checked); `section.rs` turns each list of keys into the effective
//! struct ([`ExtensionPolicy`], [`Limits`], [`FunctionPolicy`], [`SandboxPolicy`]), the override one section sets
//! ([`ExtensionOverride`], ...) and the reading of its file form; `file.rs` reads a policy file and turns what it
//! refuses into one [`PolicyError`]; `values.rs` says what each kind of value accepts; `keywords.rs` holds the
//! values that are words ([`Isolation`], ...).

mod file;
mod keys;
mod keywords;
mod section;
mod values;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

pub use file::{PolicyError, MAX_POLICY_BYTES};
pub use keys::{
    ExtensionOverride, ExtensionPolicy, FunctionOverride, FunctionPolicy, Limits, LimitsOverride, SandboxOverride,
    SandboxPolicy,
};
pub use keywords::{Isolation, OnFault, OnLimit, UnknownKeyword, WaitMode};

/// The default bounds of an extension's history (data calls kept for replay), chosen from the measurement in
/// docs/RELIABILITY.md ("History"): 16 MiB hold about 20 s of a stereo audio stream at 48 kHz with its outputs
/// (longer than a delay's or a reverb's memory, so a window past it rebuilds their state), while a host pays for
/// every fresh megabyte it first touches (64 MiB cost sox 28% per plugin on the machines measured, 16 MiB 4%); and
/// replaying a second's worth of recorded calls is the most a restart should add to the host's wait.
pub const DEFAULT_HISTORY_MB: u64 = 16;
/// See [`DEFAULT_HISTORY_MB`].
pub const DEFAULT_HISTORY_REPLAY: Duration = Duration::from_secs(1);
/// The default stream time between checkpoints of a plugin that can save its state: a second of audio, so a
/// restart replays at most about a second of history (the bound `history_replay` sets anyway), while the save's
/// copy is paid once a second, not once a block (docs/RELIABILITY.md, "Checkpoints").
pub const DEFAULT_CHECKPOINT: Duration = Duration::from_secs(1);
/// What an extension may read past an input by default: UV Map reads up to a row and a pixel past its second frame,
/// 15 KiB at 3840 pixels a row.
pub const DEFAULT_READ_PAST_INPUT_KB: u32 = 16;
/// The most `read_past_input_kb` allows.
pub const MAX_READ_PAST_INPUT_KB: u32 = 1024;
/// Smallest address-space limit: below it not even an empty domain fits (its program, its C library, the rings and
/// pools it maps), so every load would fail.
pub const MIN_ADDRESS_SPACE_MB: u64 = 16;
/// Smallest pids limit: the zygote, an incarnation, a trial load and their threads.
pub const MIN_PIDS: u64 = 8;

impl ExtensionPolicy {
    /// The policy of one function: its own section if any, else the default
    /// (state false, retryable true, deadline None, destroys false).
    pub fn function(&self, name: &str) -> FunctionPolicy {
        self.functions.get(name).cloned().unwrap_or_default()
    }

    /// The deadline of a call to this function: its own, else the extension's.
    pub fn deadline_for(&self, name: &str) -> Duration {
        self.functions.get(name).and_then(|f| f.deadline).unwrap_or(self.deadline)
    }

    /// Backoff before the n-th consecutive restart (n starts at 1): 0 for
    /// n = 1, then `backoff_initial * backoff_factor^(n-2)`, capped at
    /// `backoff_max`. `n = 0` is taken as 1.
    pub fn backoff(&self, n: u32) -> Duration {
        if n <= 1 {
            return Duration::ZERO;
        }
        let max = self.backoff_max;
        let exponent = i32::try_from(n - 2).unwrap_or(i32::MAX);
        let nanos = self.backoff_initial.as_nanos() as f64 * self.backoff_factor.powi(exponent);
        // Compare in nanoseconds; NaN (never produced by a valid factor) and
        // infinity fall back to the cap.
        if nanos.is_nan() || nanos >= max.as_nanos() as f64 {
            return max;
        }
        // Below the cap, hence below u64::MAX nanoseconds (durations are
        // bounded by MAX_DURATION_S when parsed); saturate all the same.
        Duration::from_nanos(nanos.round() as u64).min(max)
    }
}

/// A whole policy: defaults, per-extension overrides, per-group sections.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// The `[defaults]` section.
    pub defaults: ExtensionOverride,
    /// The `[extension.NAME]` sections, by extension name.
    pub extensions: BTreeMap<String, ExtensionOverride>,
    /// The `[group.NAME]` sections, by group name. Only domain-level fields
    /// are ever set in these.
    pub groups: BTreeMap<String, ExtensionOverride>,
}

impl Policy {
    /// Effective policy of the extension with this name: built-in defaults
    /// <- `[defaults]` <- `[extension.NAME]`.
    pub fn for_extension(&self, name: &str) -> ExtensionPolicy {
        let mut policy = ExtensionPolicy::default();
        apply(&self.defaults, &mut policy);
        if let Some(section) = self.extensions.get(name) {
            apply(section, &mut policy);
        }
        policy
    }

    /// Effective domain-level policy of a group: built-in defaults <-
    /// `[defaults]` <- `[group.NAME]`. Isolation, deadline, heartbeat,
    /// restart intensity, backoff, `on_limit`, `zygote`, `wait`, `spin` and
    /// `limits` apply per domain; the other fields are those of
    /// `[defaults]`. `group` is `Some(group)`.
    pub fn for_group(&self, group: &str) -> ExtensionPolicy {
        let mut policy = ExtensionPolicy::default();
        apply(&self.defaults, &mut policy);
        if let Some(section) = self.groups.get(group) {
            apply(section, &mut policy);
        }
        policy.group = Some(group.to_string());
        policy
    }

    /// Sets the isolation of `[defaults]`.
    pub fn set_default_isolation(&mut self, iso: Isolation) {
        self.defaults.isolation = Some(iso);
    }

    /// The `[defaults]` section, to set fields on.
    pub fn defaults_mut(&mut self) -> &mut ExtensionOverride {
        &mut self.defaults
    }

    /// The `[extension.NAME]` section, created empty if missing.
    pub fn extension_mut(&mut self, name: &str) -> &mut ExtensionOverride {
        self.extensions.entry(name.to_string()).or_default()
    }

    /// The `[group.NAME]` section, created empty if missing.
    pub fn group_mut(&mut self, name: &str) -> &mut ExtensionOverride {
        self.groups.entry(name.to_string()).or_default()
    }
}

/// Applies one section: its keys, then what setting `deadline_ms` means (deadlines fixed, nothing learned).
fn apply(section: &ExtensionOverride, policy: &mut ExtensionPolicy) {
    section.apply(policy);
    if section.deadline.is_some() {
        policy.deadline_learned = false;
    }
}
