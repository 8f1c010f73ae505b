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
//! check_output = false       # class output checks (audio with NaN or infinity is a fault)
//! poison = false             # call with poison in every register and stack slot not given (process only)
//! read_past_input_kb = 16    # an extension reading this far past an input reads zeros (0 = faults at once; <= 1024)
//! history_mb = 16            # data calls (history = true) kept for replay: at most this many MiB ... (0 = off)
//! history_replay_ms = 1000  # ... and at most this long to replay (0 = off); past either, the most recent kept
//! library_fault = "none"     # fault testing: see below
//! native_fallback = true     # `ward run`: a file that looks like a plugin ward cannot take loads without ward
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

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::libfault::LibraryFault;
use crate::sandbox::{RawSandbox, SandboxOverride, SandboxPolicy};

// ---------------------------------------------------------------------------
// Keyword enums
// ---------------------------------------------------------------------------

/// Implements `as_str`, `ALL`, `FromStr` and `Display` for an enum whose
/// values are written as keywords.
macro_rules! keywords {
    ($ty:ident, $what:literal, { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in the order the documentation lists them.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The keyword naming this value in policy files and on the command line.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($ty::$variant => $text),+
                }
            }

            /// The accepted keywords, quoted and separated by commas.
            fn keywords() -> String {
                quoted_list(Self::ALL.iter().map(|v| v.as_str()))
            }
        }

        impl FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| {
                        format!(
                            "unknown {} {:?}: expected one of {}",
                            $what,
                            s,
                            Self::keywords()
                        )
                    })
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// How an extension is isolated from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// In the host process, unprotected.
    None,
    /// In a separate domain process.
    Process,
    /// In the host process, behind memory protection keys.
    Mpk,
    /// `Mpk` where the hardware supports it, else `Process`.
    Auto,
}

keywords!(Isolation, "isolation", {
    None => "none",
    Process => "process",
    Mpk => "mpk",
    Auto => "auto",
});

/// How a caller waits for the reply of its domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Spin a while ([`ExtensionPolicy::spin`]), then sleep. A process domain whose short calls keep finding it
    /// asleep (they come further apart than it spins) is moved to its caller's processor and both sides then sleep
    /// at once, as with `Sleep`; when calls come close together again it goes back to spinning on its own processor.
    Adaptive,
    /// Spin only.
    Poll,
    /// Do not spin. A process domain then runs on the processor of the thread that calls it, so each call is a
    /// hand-over on one processor rather than a wake-up across processors (`ward::placement`): the caller yields
    /// that processor to the domain, and sleeps only if the reply is slow to come.
    Sleep,
}

keywords!(WaitMode, "wait mode", {
    Adaptive => "adaptive",
    Poll => "poll",
    Sleep => "sleep",
});

/// What the call in flight gets when its extension fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFault {
    /// Re-issued after the restart, if the function is retryable and
    /// retries are left; else it fails.
    Retry,
    /// Fails at once.
    Fail,
}

keywords!(OnFault, "on_fault value", {
    Retry => "retry",
    Fail => "fail",
});

/// What happens past the restart limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimit {
    /// The extension is disabled: every later call fails.
    Disable,
    /// The failure is reported to the host as fatal.
    Fail,
}

keywords!(OnLimit, "on_limit value", {
    Disable => "disable",
    Fail => "fail",
});

// ---------------------------------------------------------------------------
// Effective policies
// ---------------------------------------------------------------------------

/// Resource limits of a domain.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Address space in MiB; 0 = unlimited.
    pub address_space_mb: u64,
    /// CPU time in seconds; 0 = unlimited.
    pub cpu_s: u64,
    /// Open file descriptors; at least 1.
    pub open_files: u64,
    /// Memory of the domain's cgroup in MiB (its processes' memory, and the shared memory and memfd pages they
    /// touch); 0 = unlimited. Without a usable cgroup only `address_space_mb` holds.
    pub memory_mb: u64,
    /// Processes and threads in the domain's cgroup (the zygote and its incarnations together); 0 = unlimited.
    pub pids: u64,
    /// CPU quota of the domain's cgroup, in percent of one processor; 0 = none.
    pub cpu_percent: u64,
    /// CPU the domain may use per second between calls, in ms, before that is a fault; 0 = not checked.
    pub idle_cpu_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            address_space_mb: 1024,
            cpu_s: 0,
            open_files: 256,
            memory_mb: 1024,
            pids: 128,
            cpu_percent: 0,
            idle_cpu_ms: 100,
        }
    }
}

/// The policy of one function of an extension.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionPolicy {
    /// State-establishing: logged in the shadow log, replayed after restart.
    pub state: bool,
    /// May be re-issued after a fault.
    pub retryable: bool,
    /// Deadline of one call; `None`: the extension's.
    pub deadline: Option<Duration>,
    /// Releases the handle passed as its first Handle argument: its
    /// shadow-log entries are dropped.
    pub destroys: bool,
    /// For a state-establishing setter: a call whose first `n` arguments
    /// equal an earlier logged call's replaces it, so the shadow log keeps
    /// only the last value (a parameter set every frame does not grow it).
    /// `None`: every call is kept. Set by class wrappers, not by policy files.
    pub replaces_same: Option<usize>,
    /// A data call that advances the extension's state (an audio block, a frame through a filter with memory):
    /// while the extension's `history_mb` allows, it is kept in the shadow log with its inputs and replayed in
    /// order, so a restarted extension is back in the very state it had, not only its configuration.
    pub history: bool,
    /// The deadline of this function's calls while its deadline is learned and too few calls have been seen to
    /// learn it (see [`ExtensionPolicy::deadline_learned`]); `None`: the extension's `deadline_ceiling`. Set by
    /// class wrappers (their default for a class call: an audio block, a frame), not by policy files.
    pub first_deadline: Option<Duration>,
}

impl Default for FunctionPolicy {
    fn default() -> Self {
        FunctionPolicy {
            state: false,
            retryable: true,
            deadline: None,
            destroys: false,
            replaces_same: None,
            history: false,
            first_deadline: None,
        }
    }
}

/// The effective policy of one extension (or of one group's domain).
#[derive(Debug, Clone, PartialEq)]
pub struct ExtensionPolicy {
    /// How the extension is isolated.
    pub isolation: Isolation,
    /// The group whose domain the extension shares; `None`: its own domain.
    pub group: Option<String>,
    /// Deadline of one call when deadlines are fixed (`deadline_learned` false); else the bound of ward's own waits
    /// that belong to no function (deferred calls, a zygote's answers, an extension's `init`).
    pub deadline: Duration,
    /// Each function's deadline follows what its calls took before (DECISIONS.md, "Deadlines that learn"). On by
    /// default; a policy section that sets `deadline_ms` turns it off for the extensions it applies to.
    pub deadline_learned: bool,
    /// The least a learned deadline can be.
    pub deadline_floor: Duration,
    /// The most a learned deadline (or a first call's) can be.
    pub deadline_ceiling: Duration,
    /// One call failing this many times in a row, each time again after its recovery, disables the extension at
    /// once, whatever the restart intensity allows; 0: never (only `max_restarts` disables).
    pub max_failures_in_row: u32,
    /// What the host gets from the extension once it is disabled, for the message that says so (a class's bypass:
    /// "audio passes through unchanged"); `None`: its calls fail. Set by class wrappers, not by policy files.
    pub when_disabled: Option<String>,
    /// Heartbeat interval of the domain; `None`: off. Only a domain process is pinged: an mpk domain has its
    /// heartbeat once it has moved to a process (`escalate_after`).
    pub heartbeat: Option<Duration>,
    /// Restart intensity: at most this many restarts ...
    pub max_restarts: u32,
    /// ... within this period.
    pub restart_period: Duration,
    /// Backoff before the second consecutive restart.
    pub backoff_initial: Duration,
    /// Largest backoff.
    pub backoff_max: Duration,
    /// Growth of the backoff from one restart to the next (at least 1.0).
    pub backoff_factor: f64,
    /// What the call in flight gets when the extension fails.
    pub on_fault: OnFault,
    /// How many times one call is retried (at most 100).
    pub max_retries: u32,
    /// After this many faults in an mpk domain, the domain moves to a process domain; 0: never.
    pub escalate_after: u32,
    /// What happens past the restart limit.
    pub on_limit: OnLimit,
    /// Restart from a pre-forked, pre-loaded process.
    pub zygote: bool,
    /// How callers wait for replies.
    pub wait: WaitMode,
    /// Spin iterations before sleeping in adaptive mode.
    pub spin: u32,
    /// Function called (no arguments, returns int64; nonzero = load
    /// failure) after load.
    pub init: Option<String>,
    /// Class output checks: a class wrapper treats wrong output (audio with NaN or infinity) as a fault.
    pub check_output: bool,
    /// Call the extension's functions with poison in every register and stack slot they are not given (process
    /// isolation only), so a stale register or an uninitialised local read faults instead of giving a wrong result.
    /// Costs about 0.3 us a call (the stack fill).
    pub poison: bool,
    /// How many MiB of data calls' inputs ([`FunctionPolicy::history`]) the shadow log keeps for replay; 0: none.
    /// Past it (or past `history_replay`) the oldest data calls are dropped: a restart replays the most recent
    /// window of the stream (docs/RELIABILITY.md, "History").
    pub history_mb: u64,
    /// How many KiB past an input an extension may read, reading zeros, before a guard page faults (rounded up to
    /// whole pages): after the inputs of a process domain (its input pool, arena inputs lent in place; the domain's
    /// value) and after the class adapters' copies of input frames and ports (the extension's). 0: a read past an
    /// input faults at once. Writing past an output faults whatever this says.
    pub read_past_input_kb: u32,
    /// How long replaying the kept data calls may take, as the sum of what each took when it was made (at least
    /// a replayed call's round trip each); zero: no history.
    pub history_replay: Duration,
    /// A run-time library fault injected into the extension's own calls to its C library (fault testing; process
    /// isolation only); `None`: off.
    pub library_fault: Option<LibraryFault>,
    /// After a failure, restart the extension from this file instead of the one it was loaded from (a known-good
    /// or patched version); `None`: from the same file.
    pub restart_from: Option<PathBuf>,
    /// What the preload shim of `ward run` does with a file the host opens that looks like a plugin but that ward
    /// cannot take (a file it cannot classify, a plugin of an ABI it has no class for): load it without ward
    /// (`true`), or refuse it, so the host's `dlopen` fails (`false`). A plugin of a class ward has is never loaded
    /// without ward, whatever this says: once it failed under ward, the host gets a load error.
    pub native_fallback: bool,
    /// Resource limits of the domain.
    pub limits: Limits,
    /// The sandbox of a process domain (see [`crate::sandbox`]).
    pub sandbox: SandboxPolicy,
    /// Policies of single functions, by name.
    pub functions: BTreeMap<String, FunctionPolicy>,
}

/// The default bounds of an extension's history (data calls kept for replay), chosen from the measurement in
/// docs/RELIABILITY.md ("History"): 16 MiB hold about 20 s of a stereo audio stream at 48 kHz with its outputs
/// (longer than a delay's or a reverb's memory, so a window past it rebuilds their state), while a host pays for
/// every fresh megabyte it first touches (64 MiB cost sox 28% per plugin on the machines measured, 16 MiB 4%); and
/// replaying a second's worth of recorded calls is the most a restart should add to the host's wait.
pub const DEFAULT_HISTORY_MB: u64 = 16;
/// See [`DEFAULT_HISTORY_MB`].
pub const DEFAULT_HISTORY_REPLAY: Duration = Duration::from_secs(1);

impl Default for ExtensionPolicy {
    fn default() -> Self {
        ExtensionPolicy {
            isolation: Isolation::Process,
            group: None,
            deadline: Duration::from_secs(10),
            deadline_learned: true,
            deadline_floor: Duration::from_millis(200),
            deadline_ceiling: Duration::from_secs(10),
            max_failures_in_row: 3,
            when_disabled: None,
            heartbeat: None,
            max_restarts: 10,
            restart_period: Duration::from_secs(60),
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_secs(1),
            backoff_factor: 2.0,
            on_fault: OnFault::Retry,
            max_retries: 1,
            escalate_after: 3,
            on_limit: OnLimit::Disable,
            zygote: true,
            wait: WaitMode::Adaptive,
            spin: 2000,
            init: None,
            check_output: false,
            poison: false,
            read_past_input_kb: DEFAULT_READ_PAST_INPUT_KB,
            history_mb: DEFAULT_HISTORY_MB,
            history_replay: DEFAULT_HISTORY_REPLAY,
            library_fault: None,
            restart_from: None,
            native_fallback: true,
            limits: Limits::default(),
            sandbox: SandboxPolicy::default(),
            functions: BTreeMap::new(),
        }
    }
}

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

// ---------------------------------------------------------------------------
// Overrides
// ---------------------------------------------------------------------------

/// Resource limits set by one section; every field optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitsOverride {
    /// See [`Limits::address_space_mb`].
    pub address_space_mb: Option<u64>,
    /// See [`Limits::cpu_s`].
    pub cpu_s: Option<u64>,
    /// See [`Limits::open_files`].
    pub open_files: Option<u64>,
    /// See [`Limits::memory_mb`].
    pub memory_mb: Option<u64>,
    /// See [`Limits::pids`].
    pub pids: Option<u64>,
    /// See [`Limits::cpu_percent`].
    pub cpu_percent: Option<u64>,
    /// See [`Limits::idle_cpu_ms`].
    pub idle_cpu_ms: Option<u64>,
}

/// The policy of one function as set by one section; every field optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FunctionOverride {
    /// See [`FunctionPolicy::state`].
    pub state: Option<bool>,
    /// See [`FunctionPolicy::retryable`].
    pub retryable: Option<bool>,
    /// See [`FunctionPolicy::deadline`].
    pub deadline: Option<Duration>,
    /// See [`FunctionPolicy::destroys`].
    pub destroys: Option<bool>,
    /// See [`FunctionPolicy::history`].
    pub history: Option<bool>,
}

/// The settings of one section (`[defaults]`, `[extension.NAME]` or
/// `[group.NAME]`); every field optional. See [`ExtensionPolicy`] for the
/// meaning of each.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtensionOverride {
    pub isolation: Option<Isolation>,
    pub group: Option<String>,
    pub deadline: Option<Duration>,
    pub deadline_floor: Option<Duration>,
    pub deadline_ceiling: Option<Duration>,
    pub max_failures_in_row: Option<u32>,
    /// `Some(None)`: heartbeat explicitly off.
    pub heartbeat: Option<Option<Duration>>,
    pub max_restarts: Option<u32>,
    pub restart_period: Option<Duration>,
    pub backoff_initial: Option<Duration>,
    pub backoff_max: Option<Duration>,
    pub backoff_factor: Option<f64>,
    pub on_fault: Option<OnFault>,
    pub max_retries: Option<u32>,
    pub escalate_after: Option<u32>,
    pub on_limit: Option<OnLimit>,
    pub zygote: Option<bool>,
    pub wait: Option<WaitMode>,
    pub spin: Option<u32>,
    pub init: Option<String>,
    pub check_output: Option<bool>,
    pub poison: Option<bool>,
    pub history_mb: Option<u64>,
    pub read_past_input_kb: Option<u32>,
    pub history_replay: Option<Duration>,
    /// `Some(None)`: library faults explicitly off.
    pub library_fault: Option<Option<LibraryFault>>,
    pub restart_from: Option<PathBuf>,
    pub native_fallback: Option<bool>,
    pub limits: LimitsOverride,
    pub sandbox: SandboxOverride,
    pub functions: BTreeMap<String, FunctionOverride>,
}

/// Overwrites `$dst.$field` with `$src.$field` where the latter is set.
macro_rules! overlay {
    ($dst:expr, $src:expr, $($field:ident),+ $(,)?) => {
        $(
            if let Some(value) = &$src.$field {
                $dst.$field = value.clone();
            }
        )+
    };
}

impl ExtensionOverride {
    /// Applies the fields this section sets to `policy`.
    fn apply(&self, policy: &mut ExtensionPolicy) {
        overlay!(
            policy,
            self,
            isolation,
            deadline,
            deadline_floor,
            deadline_ceiling,
            max_failures_in_row,
            heartbeat,
            max_restarts,
            restart_period,
            backoff_initial,
            backoff_max,
            backoff_factor,
            on_fault,
            max_retries,
            escalate_after,
            on_limit,
            zygote,
            wait,
            spin,
            check_output,
            poison,
            library_fault,
            history_mb,
            read_past_input_kb,
            history_replay,
            native_fallback,
        );
        if self.deadline.is_some() {
            policy.deadline_learned = false;
        }
        if let Some(group) = &self.group {
            policy.group = Some(group.clone());
        }
        if let Some(init) = &self.init {
            policy.init = Some(init.clone());
        }
        if let Some(path) = &self.restart_from {
            policy.restart_from = Some(path.clone());
        }
        overlay!(
            policy.limits,
            self.limits,
            address_space_mb,
            cpu_s,
            open_files,
            memory_mb,
            pids,
            cpu_percent,
            idle_cpu_ms
        );
        self.sandbox.apply(&mut policy.sandbox);
        for (name, section) in &self.functions {
            let function = policy.functions.entry(name.clone()).or_default();
            overlay!(function, section, state, retryable, destroys, history);
            if let Some(deadline) = section.deadline {
                function.deadline = Some(deadline);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Policy
// ---------------------------------------------------------------------------

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
    /// Parses and checks a policy. `origin` names the text in messages
    /// (usually the file name).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let raw: RawPolicy = toml::from_str(text).map_err(|e| invalid(text, origin, &e))?;
        if raw.defaults.restart_from.is_some() {
            // One file for every extension would restart each of them as the same library.
            let (line, column) = text.find("restart_from").map_or((0, 0), |at| line_column(text, at));
            return Err(PolicyError::Invalid {
                origin: origin.to_string(),
                line,
                column,
                reason: "restart_from is set per extension: put it in [extension.NAME], not [defaults]".into(),
            });
        }
        Ok(raw.into_policy())
    }

    /// Reads, parses and checks a policy file. A relative `restart_from` is taken relative to the file's directory.
    /// Only a regular file of at most [`MAX_POLICY_BYTES`] is read: a device, a FIFO or a huge file is refused
    /// before it is read.
    pub fn from_file(path: &Path) -> Result<Policy, PolicyError> {
        let text = read_policy_text(path)?;
        let mut policy = Policy::from_toml_str(&text, &path.display().to_string())?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for section in policy.extensions.values_mut() {
            if let Some(from) = section.restart_from.as_mut().filter(|p| p.is_relative()) {
                *from = dir.join(&*from);
            }
        }
        Ok(policy)
    }

    /// Effective policy of the extension with this name: built-in defaults
    /// <- `[defaults]` <- `[extension.NAME]`.
    pub fn for_extension(&self, name: &str) -> ExtensionPolicy {
        let mut policy = ExtensionPolicy::default();
        self.defaults.apply(&mut policy);
        if let Some(section) = self.extensions.get(name) {
            section.apply(&mut policy);
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
        self.defaults.apply(&mut policy);
        if let Some(section) = self.groups.get(group) {
            section.apply(&mut policy);
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

/// Largest policy file read: a policy is a few hundred bytes; a larger file is not one.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;

/// The text of the policy file at `path`, if it is a regular file of at most [`MAX_POLICY_BYTES`].
fn read_policy_text(path: &Path) -> Result<String, PolicyError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let read_error = |source| PolicyError::Read { path: path.to_path_buf(), source };
    let regular = |meta: &std::fs::Metadata| {
        if !meta.is_file() {
            return Err(PolicyError::NotAFile { path: path.to_path_buf() });
        }
        if meta.len() > MAX_POLICY_BYTES {
            return Err(PolicyError::TooLarge { path: path.to_path_buf(), len: meta.len() });
        }
        Ok(())
    };
    // Looked at before it is opened (opening a FIFO blocks), and again once open, in case it changed between.
    regular(&std::fs::metadata(path).map_err(read_error)?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(read_error)?;
    regular(&file.metadata().map_err(read_error)?)?;
    let mut bytes = Vec::new();
    // A file that grew meanwhile is read no further than the limit (and refused).
    file.take(MAX_POLICY_BYTES + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > MAX_POLICY_BYTES {
        return Err(PolicyError::TooLarge { path: path.to_path_buf(), len: bytes.len() as u64 });
    }
    String::from_utf8(bytes)
        .map_err(|e| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}"))))
}

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The path names a device, a FIFO, a directory...: nothing is read from it.
    #[error("policy file {path} is not a regular file")]
    NotAFile { path: PathBuf },
    /// The file is larger than any policy.
    #[error("policy file {path} has {len} bytes; a policy has at most {MAX_POLICY_BYTES}")]
    TooLarge { path: PathBuf, len: u64 },
    /// The file could not be read.
    #[error("cannot read policy file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The text is not a valid policy. `line` and `column` start at 1
    /// (0 when unknown); `reason` names the key and what is accepted.
    #[error("{origin}:{line}:{column}: {reason}")]
    Invalid { origin: String, line: usize, column: usize, reason: String },
}

/// Turns toml's error into [`PolicyError::Invalid`].
fn invalid(text: &str, origin: &str, error: &toml::de::Error) -> PolicyError {
    let (line, column) = match error.span() {
        Some(span) => line_column(text, span.start),
        None => (0, 0),
    };
    // toml's message may continue on further lines ("invalid table
    // header" / "duplicate key ..."); keep it on one line.
    let mut reason = error.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
    if reason.is_empty() {
        reason.push_str("invalid policy");
    }
    // serde's word for a TOML table.
    if let Some(head) = reason.strip_suffix(", expected a map") {
        reason = format!("{head}, expected a table");
    }
    if let Some(hint) = hint(&reason) {
        reason.push_str(&hint);
    }
    PolicyError::Invalid { origin: origin.to_string(), line, column, reason }
}

/// Line and column (both from 1; the column counts characters) of a byte
/// offset in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Fields of `[extension.NAME]` (and `[defaults]`) that a `[group.NAME]`
/// section cannot set, being per extension.
const EXTENSION_ONLY_FIELDS: &[&str] = &[
    "group",
    "on_fault",
    "max_retries",
    "init",
    "check_output",
    "poison",
    "library_fault",
    "restart_from",
    "native_fallback",
    "function",
];

/// For serde's "unknown field `x`, expected one of `a`, `b`" message, what
/// to do: set a per-extension field elsewhere, or the closest expected field.
fn hint(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (unknown, expected) = rest.split_once('`')?;
    let candidates: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    let in_group_section = candidates.contains(&"zygote") && !candidates.contains(&"function");
    if in_group_section && EXTENSION_ONLY_FIELDS.contains(&unknown) {
        return Some(format!("; `{unknown}` is set per extension: put it in [extension.NAME] or [defaults]"));
    }
    let (distance, best) = candidates
        .iter()
        .map(|candidate| (edit_distance(unknown, candidate), candidate))
        .min_by_key(|(distance, _)| *distance)?;
    let limit = (unknown.chars().count() / 3).clamp(1, 3);
    (distance <= limit).then(|| format!("; did you mean `{best}`?"))
}

/// Levenshtein distance between two short strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

// ---------------------------------------------------------------------------
// The file format
// ---------------------------------------------------------------------------

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a policy document")]
struct RawPolicy {
    #[serde(default)]
    defaults: RawExtension,
    #[serde(default)]
    extension: BTreeMap<ExtensionName, RawExtension>,
    #[serde(default)]
    group: BTreeMap<GroupName, RawGroup>,
}

impl RawPolicy {
    fn into_policy(self) -> Policy {
        Policy {
            defaults: self.defaults.into_override(),
            extensions: self.extension.into_iter().map(|(name, section)| (name.0, section.into_override())).collect(),
            groups: self.group.into_iter().map(|(name, section)| (name.0, section.into_override())).collect(),
        }
    }
}

/// `[defaults]` and `[extension.NAME]`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of extension settings")]
struct RawExtension {
    #[serde(default, deserialize_with = "de_isolation")]
    isolation: Option<Isolation>,
    #[serde(default, deserialize_with = "de_group")]
    group: Option<String>,
    #[serde(default, deserialize_with = "de_deadline_ms")]
    deadline_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_deadline_floor_ms")]
    deadline_floor_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_deadline_ceiling_ms")]
    deadline_ceiling_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_max_failures_in_row")]
    max_failures_in_row: Option<u32>,
    #[serde(default, deserialize_with = "de_heartbeat_ms")]
    heartbeat_ms: Option<Option<Duration>>,
    #[serde(default, deserialize_with = "de_max_restarts")]
    max_restarts: Option<u32>,
    #[serde(default, deserialize_with = "de_restart_period_s")]
    restart_period_s: Option<Duration>,
    #[serde(default, deserialize_with = "de_backoff_initial_ms")]
    backoff_initial_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_backoff_max_ms")]
    backoff_max_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_backoff_factor")]
    backoff_factor: Option<f64>,
    #[serde(default, deserialize_with = "de_on_fault")]
    on_fault: Option<OnFault>,
    #[serde(default, deserialize_with = "de_max_retries")]
    max_retries: Option<u32>,
    #[serde(default, deserialize_with = "de_escalate_after")]
    escalate_after: Option<u32>,
    #[serde(default, deserialize_with = "de_on_limit")]
    on_limit: Option<OnLimit>,
    #[serde(default, deserialize_with = "de_zygote")]
    zygote: Option<bool>,
    #[serde(default, deserialize_with = "de_wait")]
    wait: Option<WaitMode>,
    #[serde(default, deserialize_with = "de_spin")]
    spin: Option<u32>,
    #[serde(default, deserialize_with = "de_init")]
    init: Option<String>,
    #[serde(default, deserialize_with = "de_check_output")]
    check_output: Option<bool>,
    #[serde(default, deserialize_with = "de_poison")]
    poison: Option<bool>,
    #[serde(default, deserialize_with = "de_history_mb")]
    history_mb: Option<u64>,
    #[serde(default, deserialize_with = "de_read_past_input_kb")]
    read_past_input_kb: Option<u32>,
    #[serde(default, deserialize_with = "de_history_replay_ms")]
    history_replay_ms: Option<Duration>,
    #[serde(default, deserialize_with = "crate::libfault::de_library_fault")]
    library_fault: Option<Option<LibraryFault>>,
    #[serde(default, deserialize_with = "de_restart_from")]
    restart_from: Option<PathBuf>,
    #[serde(default, deserialize_with = "de_native_fallback")]
    native_fallback: Option<bool>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    sandbox: RawSandbox,
    #[serde(default)]
    function: BTreeMap<FunctionName, RawFunction>,
}

impl RawExtension {
    fn into_override(self) -> ExtensionOverride {
        ExtensionOverride {
            isolation: self.isolation,
            group: self.group,
            deadline: self.deadline_ms,
            deadline_floor: self.deadline_floor_ms,
            deadline_ceiling: self.deadline_ceiling_ms,
            max_failures_in_row: self.max_failures_in_row,
            heartbeat: self.heartbeat_ms,
            max_restarts: self.max_restarts,
            restart_period: self.restart_period_s,
            backoff_initial: self.backoff_initial_ms,
            backoff_max: self.backoff_max_ms,
            backoff_factor: self.backoff_factor,
            on_fault: self.on_fault,
            max_retries: self.max_retries,
            escalate_after: self.escalate_after,
            on_limit: self.on_limit,
            zygote: self.zygote,
            wait: self.wait,
            spin: self.spin,
            init: self.init,
            check_output: self.check_output,
            poison: self.poison,
            history_mb: self.history_mb,
            read_past_input_kb: self.read_past_input_kb,
            history_replay: self.history_replay_ms,
            library_fault: self.library_fault,
            restart_from: self.restart_from,
            native_fallback: self.native_fallback,
            limits: self.limits.into_override(),
            sandbox: self.sandbox.into_override(),
            functions: self.function.into_iter().map(|(name, section)| (name.0, section.into_override())).collect(),
        }
    }
}

/// `[group.NAME]`: the domain-level fields only.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of group settings")]
struct RawGroup {
    #[serde(default, deserialize_with = "de_isolation")]
    isolation: Option<Isolation>,
    #[serde(default, deserialize_with = "de_deadline_ms")]
    deadline_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_deadline_floor_ms")]
    deadline_floor_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_deadline_ceiling_ms")]
    deadline_ceiling_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_max_failures_in_row")]
    max_failures_in_row: Option<u32>,
    #[serde(default, deserialize_with = "de_heartbeat_ms")]
    heartbeat_ms: Option<Option<Duration>>,
    #[serde(default, deserialize_with = "de_max_restarts")]
    max_restarts: Option<u32>,
    #[serde(default, deserialize_with = "de_restart_period_s")]
    restart_period_s: Option<Duration>,
    #[serde(default, deserialize_with = "de_backoff_initial_ms")]
    backoff_initial_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_backoff_max_ms")]
    backoff_max_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_backoff_factor")]
    backoff_factor: Option<f64>,
    #[serde(default, deserialize_with = "de_on_limit")]
    on_limit: Option<OnLimit>,
    #[serde(default, deserialize_with = "de_zygote")]
    zygote: Option<bool>,
    #[serde(default, deserialize_with = "de_wait")]
    wait: Option<WaitMode>,
    #[serde(default, deserialize_with = "de_spin")]
    spin: Option<u32>,
    #[serde(default, deserialize_with = "de_read_past_input_kb")]
    read_past_input_kb: Option<u32>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    sandbox: RawSandbox,
}

impl RawGroup {
    fn into_override(self) -> ExtensionOverride {
        ExtensionOverride {
            isolation: self.isolation,
            deadline: self.deadline_ms,
            deadline_floor: self.deadline_floor_ms,
            deadline_ceiling: self.deadline_ceiling_ms,
            max_failures_in_row: self.max_failures_in_row,
            heartbeat: self.heartbeat_ms,
            max_restarts: self.max_restarts,
            restart_period: self.restart_period_s,
            backoff_initial: self.backoff_initial_ms,
            backoff_max: self.backoff_max_ms,
            backoff_factor: self.backoff_factor,
            on_limit: self.on_limit,
            zygote: self.zygote,
            wait: self.wait,
            spin: self.spin,
            read_past_input_kb: self.read_past_input_kb,
            limits: self.limits.into_override(),
            sandbox: self.sandbox.into_override(),
            ..ExtensionOverride::default()
        }
    }
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of resource limits")]
struct RawLimits {
    #[serde(default, deserialize_with = "de_address_space_mb")]
    address_space_mb: Option<u64>,
    #[serde(default, deserialize_with = "de_cpu_s")]
    cpu_s: Option<u64>,
    #[serde(default, deserialize_with = "de_open_files")]
    open_files: Option<u64>,
    #[serde(default, deserialize_with = "de_memory_mb")]
    memory_mb: Option<u64>,
    #[serde(default, deserialize_with = "de_pids")]
    pids: Option<u64>,
    #[serde(default, deserialize_with = "de_cpu_percent")]
    cpu_percent: Option<u64>,
    #[serde(default, deserialize_with = "de_idle_cpu_ms")]
    idle_cpu_ms: Option<u64>,
}

impl RawLimits {
    fn into_override(self) -> LimitsOverride {
        LimitsOverride {
            address_space_mb: self.address_space_mb,
            cpu_s: self.cpu_s,
            open_files: self.open_files,
            memory_mb: self.memory_mb,
            pids: self.pids,
            cpu_percent: self.cpu_percent,
            idle_cpu_ms: self.idle_cpu_ms,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of function settings")]
struct RawFunction {
    #[serde(default, deserialize_with = "de_state")]
    state: Option<bool>,
    #[serde(default, deserialize_with = "de_retryable")]
    retryable: Option<bool>,
    #[serde(default, deserialize_with = "de_deadline_ms")]
    deadline_ms: Option<Duration>,
    #[serde(default, deserialize_with = "de_destroys")]
    destroys: Option<bool>,
    #[serde(default, deserialize_with = "de_history")]
    history: Option<bool>,
}

impl RawFunction {
    fn into_override(self) -> FunctionOverride {
        FunctionOverride {
            state: self.state,
            retryable: self.retryable,
            deadline: self.deadline_ms,
            destroys: self.destroys,
            history: self.history,
        }
    }
}

// --- Section names ----------------------------------------------------------

/// Defines a table-key newtype checked by `$check` when deserialized, so a
/// bad name is reported at the key.
macro_rules! checked_name {
    ($ty:ident, $check:expr) => {
        #[derive(PartialEq, Eq, PartialOrd, Ord)]
        struct $ty(String);

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let name = String::deserialize(d)?;
                let check: fn(&str) -> Result<(), String> = $check;
                check(&name).map_err(de::Error::custom)?;
                Ok($ty(name))
            }
        }
    };
}

checked_name!(ExtensionName, |s| check_name("extension name", s));
checked_name!(GroupName, |s| check_name("group name", s));
checked_name!(FunctionName, |s| check_identifier("function name", s));

/// A group or extension name: non-empty, of `[A-Za-z0-9_.-]`.
fn check_name(what: &str, name: &str) -> Result<(), String> {
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if valid {
        Ok(())
    } else {
        Err(format!("{what} must be non-empty and made of letters, digits, '_', '.' and '-', got {name:?}"))
    }
}

/// A C function name: `[A-Za-z_][A-Za-z0-9_]*`.
fn check_identifier(what: &str, name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{what} must be a C function name (letters, digits and '_', not starting with a digit), got {name:?}"
        ))
    }
}

// --- Values -----------------------------------------------------------------

/// Any TOML value, as far as messages about it need to know.
enum Scalar {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    /// An array, table or date-time, described ("an array").
    Other(&'static str),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(v) => write!(f, "{v}"),
            // Debug keeps the fraction visible: "10.0", not "10".
            Scalar::Float(v) => write!(f, "{v:?}"),
            Scalar::Bool(v) => write!(f, "{v}"),
            Scalar::Str(v) => write!(f, "{v:?}"),
            Scalar::Other(what) => f.write_str(what),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

/// The field name under which toml hands a date-time to a visitor.
const TOML_DATETIME_FIELD: &str = "$__toml_private_datetime";

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other("an array"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        let mut what = "a table";
        if let Some(key) = map.next_key::<String>()? {
            if key == TOML_DATETIME_FIELD {
                what = "a date-time";
            }
            map.next_value::<IgnoredAny>()?;
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        }
        Ok(Scalar::Other(what))
    }
}

/// Reads one value and checks it with `check`; a refusal becomes a serde
/// error, to which toml attaches the value's position.
fn checked<'de, D, T>(d: D, check: impl FnOnce(&Scalar) -> Result<T, String>) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
{
    let value = Scalar::deserialize(d)?;
    check(&value).map(Some).map_err(de::Error::custom)
}

/// "`key` must be `expected`, got `value`".
fn refuse(key: &str, expected: &str, value: &Scalar) -> String {
    format!("{key} must be {expected}, got {value}")
}

/// Longest duration accepted anywhere: 100 years.
const MAX_DURATION_S: u64 = 100 * 365 * 24 * 60 * 60;

/// Unit of a duration key.
#[derive(Clone, Copy)]
enum Unit {
    Milliseconds,
    Seconds,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Milliseconds => "milliseconds",
            Unit::Seconds => "seconds",
        }
    }

    fn nanos(self) -> u64 {
        match self {
            Unit::Milliseconds => 1_000_000,
            Unit::Seconds => 1_000_000_000,
        }
    }

    /// `MAX_DURATION_S` in this unit.
    fn max(self) -> u64 {
        MAX_DURATION_S * (1_000_000_000 / self.nanos())
    }
}

/// A duration written as an integer or float count of `unit`. Zero is
/// accepted only if `zero` is `Some(note)`, the note saying what zero means.
fn duration(key: &str, unit: Unit, zero: Option<&str>, value: &Scalar) -> Result<Duration, String> {
    let expected = match zero {
        Some(note) => format!("a non-negative number of {}{note}", unit.name()),
        None => format!("a positive number of {}", unit.name()),
    };
    let nanos: u128 = match value {
        Scalar::Int(v) if *v >= 0 => v.unsigned_abs() * u128::from(unit.nanos()),
        Scalar::Float(v) if v.is_finite() && *v >= 0.0 => {
            // Bounded below; the upper bound is checked next.
            let nanos = (v * unit.nanos() as f64).round();
            if nanos > u128::from(u64::MAX) as f64 {
                u128::MAX
            } else {
                nanos as u128
            }
        }
        _ => return Err(refuse(key, &expected, value)),
    };
    if nanos > u128::from(MAX_DURATION_S) * 1_000_000_000 {
        let expected = format!("{expected} of at most {} (100 years)", unit.max());
        return Err(refuse(key, &expected, value));
    }
    if nanos == 0 && zero.is_none() {
        return Err(refuse(key, &expected, value));
    }
    // At most MAX_DURATION_S seconds, so it fits.
    Ok(Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
}

/// A whole number within `min..=max`.
fn whole(key: &str, min: u64, max: u64, expected: &str, value: &Scalar) -> Result<u64, String> {
    match value {
        Scalar::Int(v) if *v >= i128::from(min) && *v <= i128::from(max) => {
            u64::try_from(*v).map_err(|_| refuse(key, expected, value))
        }
        _ => Err(refuse(key, expected, value)),
    }
}

fn boolean(key: &str, value: &Scalar) -> Result<bool, String> {
    match value {
        Scalar::Bool(v) => Ok(*v),
        _ => Err(refuse(key, "true or false", value)),
    }
}

/// One of the keywords of `T`.
fn keyword<T>(key: &str, value: &Scalar, all: fn() -> String) -> Result<T, String>
where
    T: FromStr,
{
    let expected = format!("one of {}", all());
    match value {
        Scalar::Str(s) => s.parse().map_err(|_| refuse(key, &expected, value)),
        _ => Err(refuse(key, &expected, value)),
    }
}

fn quoted_list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ")
}

fn de_isolation<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Isolation>, D::Error> {
    checked(d, |v| keyword("isolation", v, Isolation::keywords))
}

fn de_on_fault<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OnFault>, D::Error> {
    checked(d, |v| keyword("on_fault", v, OnFault::keywords))
}

fn de_on_limit<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OnLimit>, D::Error> {
    checked(d, |v| keyword("on_limit", v, OnLimit::keywords))
}

fn de_wait<'de, D: Deserializer<'de>>(d: D) -> Result<Option<WaitMode>, D::Error> {
    checked(d, |v| keyword("wait", v, WaitMode::keywords))
}

fn de_group<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked(d, |v| match v {
        Scalar::Str(s) => check_name("group", s).map(|()| s.clone()),
        _ => Err(refuse("group", "a group name (a string of letters, digits, '_', '.' and '-')", v)),
    })
}

fn de_init<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    checked(d, |v| match v {
        Scalar::Str(s) => check_identifier("init", s).map(|()| s.clone()),
        _ => Err(refuse("init", "the name of a C function (a string)", v)),
    })
}

fn de_deadline_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked(d, |v| duration("deadline_ms", Unit::Milliseconds, None, v))
}

fn de_deadline_floor_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked(d, |v| duration("deadline_floor_ms", Unit::Milliseconds, None, v))
}

fn de_deadline_ceiling_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked(d, |v| duration("deadline_ceiling_ms", Unit::Milliseconds, None, v))
}

fn de_max_failures_in_row<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    const EXPECTED: &str = "a whole number of failures from 0 (never) to 1000";
    checked(d, |v| whole("max_failures_in_row", 0, 1000, EXPECTED, v).map(|n| n as u32))
}

fn de_heartbeat_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<Duration>>, D::Error> {
    checked(d, |v| {
        duration("heartbeat_ms", Unit::Milliseconds, Some(" (0 = off)"), v).map(|t| (!t.is_zero()).then_some(t))
    })
}

fn de_restart_period_s<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked(d, |v| duration("restart_period_s", Unit::Seconds, None, v))
}

fn de_backoff_initial_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked(d, |v| duration("backoff_initial_ms", Unit::Milliseconds, Some(""), v))
}

fn de_backoff_max_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked(d, |v| duration("backoff_max_ms", Unit::Milliseconds, Some(""), v))
}

fn de_backoff_factor<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    checked(d, |v| {
        let factor = match v {
            Scalar::Int(i) => *i as f64,
            Scalar::Float(f) => *f,
            _ => f64::NAN,
        };
        if factor.is_finite() && factor >= 1.0 {
            Ok(factor)
        } else {
            Err(refuse("backoff_factor", "a number of at least 1.0", v))
        }
    })
}

fn de_max_restarts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    const EXPECTED: &str = "a whole number from 0 to 4294967295";
    checked(d, |v| whole("max_restarts", 0, u32::MAX.into(), EXPECTED, v).map(|n| n as u32))
}

fn de_max_retries<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    checked(d, |v| whole("max_retries", 0, 100, "a whole number from 0 to 100", v).map(|n| n as u32))
}

fn de_escalate_after<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    const EXPECTED: &str = "a whole number of faults from 0 (never) to 1000000";
    checked(d, |v| whole("escalate_after", 0, 1_000_000, EXPECTED, v).map(|n| n as u32))
}

fn de_spin<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    checked(d, |v| whole("spin", 0, 10_000_000, "a whole number from 0 to 10000000", v).map(|n| n as u32))
}

fn de_history<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    checked(d, |v| boolean("history", v))
}

/// What an extension may read past an input by default: UV Map reads up to a row and a pixel past its second frame,
/// 15 KiB at 3840 pixels a row.
pub const DEFAULT_READ_PAST_INPUT_KB: u32 = 16;
/// The most `read_past_input_kb` allows.
pub const MAX_READ_PAST_INPUT_KB: u32 = 1024;

fn de_read_past_input_kb<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    checked(d, |v| {
        let expected = "a whole number of KiB from 0 to 1024";
        let kb = whole("read_past_input_kb", 0, u64::from(MAX_READ_PAST_INPUT_KB), expected, v)?;
        u32::try_from(kb).map_err(|_| refuse("read_past_input_kb", expected, v))
    })
}

fn de_history_mb<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    checked(d, |v| whole("history_mb", 0, 1 << 20, "a whole number of MiB from 0 to 1048576", v))
}

fn de_history_replay_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    checked(d, |v| duration("history_replay_ms", Unit::Milliseconds, Some(" (0 = no history)"), v))
}

fn de_check_output<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    checked(d, |v| boolean("check_output", v))
}

fn de_poison<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    checked(d, |v| boolean("poison", v))
}

fn de_restart_from<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    checked(d, |v| match v {
        Scalar::Str(s) if !s.is_empty() && !s.contains('\0') => Ok(PathBuf::from(s)),
        _ => Err(refuse("restart_from", "the path of a shared object (a non-empty string)", v)),
    })
}

fn de_native_fallback<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    checked(d, |v| boolean("native_fallback", v))
}

fn de_zygote<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    checked(d, |v| boolean("zygote", v))
}

fn de_state<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    checked(d, |v| boolean("state", v))
}

fn de_retryable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    checked(d, |v| boolean("retryable", v))
}

fn de_destroys<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    checked(d, |v| boolean("destroys", v))
}

/// Largest address-space limit whose size in bytes fits a u64.
const MAX_ADDRESS_SPACE_MB: u64 = u64::MAX >> 20;
/// Smallest address-space limit: below it not even an empty domain fits (its program, its C library, the rings and
/// pools it maps), so every load would fail.
pub const MIN_ADDRESS_SPACE_MB: u64 = 16;

fn de_address_space_mb<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    checked(d, |v| domain_megabytes("address_space_mb", v))
}

/// A memory limit `key` in MiB: 0 for none, else at least what an empty domain needs.
fn domain_megabytes(key: &str, v: &Scalar) -> Result<u64, String> {
    let expected = format!(
        "0 (unlimited) or a whole number of MiB from {MIN_ADDRESS_SPACE_MB} (less cannot hold a domain) to \
         {MAX_ADDRESS_SPACE_MB}"
    );
    match whole(key, 0, MAX_ADDRESS_SPACE_MB, &expected, v)? {
        mb @ 1..MIN_ADDRESS_SPACE_MB => Err(format!("{key} must be {expected}, got {mb}")),
        mb => Ok(mb),
    }
}

fn de_cpu_s<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    checked(d, |v| whole("cpu_s", 0, u64::MAX, "a non-negative whole number of seconds (0 = unlimited)", v))
}

fn de_open_files<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    checked(d, |v| whole("open_files", 1, u64::MAX, "a whole number of at least 1", v))
}

/// Smallest pids limit: the zygote, an incarnation, a trial load and their threads.
pub const MIN_PIDS: u64 = 8;

fn de_memory_mb<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    checked(d, |v| domain_megabytes("memory_mb", v))
}

fn de_pids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    checked(d, |v| {
        let expected = format!(
            "0 (unlimited) or a whole number of at least {MIN_PIDS} (the zygote, an incarnation and their threads)"
        );
        match whole("pids", 0, u64::from(u32::MAX), &expected, v)? {
            n @ 1..MIN_PIDS => Err(format!("pids must be {expected}, got {n}")),
            n => Ok(n),
        }
    })
}

fn de_cpu_percent<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    checked(d, |v| {
        whole("cpu_percent", 0, 100_000, "0 (no quota) or a whole percentage of one processor, at most 100000", v)
    })
}

fn de_idle_cpu_ms<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    checked(d, |v| whole("idle_cpu_ms", 0, 1000, "0 (not checked) or whole ms of CPU per second, at most 1000", v))
}

// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the module documentation.
    const EXAMPLE: &str = r#"
[defaults]                 # any extension field
isolation = "process"      # none | process | mpk | auto
deadline_ms = 10000
heartbeat_ms = 1000        # 0 = off
max_restarts = 10
restart_period_s = 60      # integer or float
backoff_initial_ms = 1     # integer or float
backoff_max_ms = 1000
backoff_factor = 2.0
on_fault = "retry"         # retry | fail
max_retries = 1
on_limit = "disable"       # disable | fail
zygote = true
wait = "adaptive"          # adaptive | poll | sleep
spin = 2000
init = "well_init"
[defaults.limits]
address_space_mb = 1024    # 0 = unlimited
cpu_s = 0
open_files = 256

[extension.faulty]
group = "demo"
deadline_ms = 500
[extension.faulty.limits]
open_files = 64
[extension.faulty.function.faulty_counter_add]
state = true
retryable = true
deadline_ms = 100
destroys = false

[group.demo]
zygote = false
"#;

    fn parse(text: &str) -> Policy {
        match Policy::from_toml_str(text, "test.toml") {
            Ok(policy) => policy,
            Err(e) => panic!("policy refused: {e}"),
        }
    }

    /// The line, column and reason of an `Invalid` error.
    fn refused(text: &str) -> (usize, usize, String) {
        match Policy::from_toml_str(text, "test.toml") {
            Err(PolicyError::Invalid { origin, line, column, reason }) => {
                assert_eq!(origin, "test.toml");
                (line, column, reason)
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn read_past_input_kb_is_set_per_extension_or_group_and_bounded() {
        assert_eq!(ExtensionPolicy::default().read_past_input_kb, 16);
        let policy = parse(
            "[defaults]\nread_past_input_kb = 4\n[extension.a]\nread_past_input_kb = 0\n[group.g]\nread_past_input_kb = 1024\n",
        );
        assert_eq!(policy.for_extension("a").read_past_input_kb, 0);
        assert_eq!(policy.for_extension("b").read_past_input_kb, 4);
        assert_eq!(policy.for_group("g").read_past_input_kb, 1024);
        for bad in ["1025", "-1", "4.5", "\"4\""] {
            let (line, _, reason) = refused(&format!("[defaults]\nread_past_input_kb = {bad}\n"));
            assert_eq!(line, 2, "{bad}");
            assert!(reason.contains("read_past_input_kb") && reason.contains("0 to 1024"), "{bad}: {reason}");
        }
    }

    #[test]
    fn empty_text_gives_built_in_defaults() {
        let policy = parse("");
        assert_eq!(policy, Policy::default());
        let p = policy.for_extension("anything");
        assert_eq!(p, ExtensionPolicy::default());
        assert_eq!(p.isolation, Isolation::Process);
        assert_eq!(p.group, None);
        assert_eq!(p.deadline, Duration::from_secs(10));
        assert!(p.deadline_learned);
        assert_eq!(p.deadline_floor, Duration::from_millis(200));
        assert_eq!(p.deadline_ceiling, Duration::from_secs(10));
        assert_eq!(p.max_failures_in_row, 3);
        assert_eq!(p.when_disabled, None);
        assert_eq!(p.heartbeat, None);
        assert_eq!(p.max_restarts, 10);
        assert_eq!(p.restart_period, Duration::from_secs(60));
        assert_eq!(p.backoff_initial, Duration::from_millis(1));
        assert_eq!(p.backoff_max, Duration::from_secs(1));
        assert_eq!(p.backoff_factor, 2.0);
        assert_eq!(p.on_fault, OnFault::Retry);
        assert_eq!(p.max_retries, 1);
        assert_eq!(p.on_limit, OnLimit::Disable);
        assert!(p.zygote);
        assert_eq!(p.wait, WaitMode::Adaptive);
        assert_eq!(p.spin, 2000);
        assert_eq!(p.init, None);
        assert_eq!((p.history_mb, p.history_replay), (16, Duration::from_secs(1)), "history is on by default");
        assert_eq!(p.limits, Limits { address_space_mb: 1024, cpu_s: 0, open_files: 256, ..Limits::default() });
        assert!(p.functions.is_empty());
    }

    #[test]
    fn history_replay_ms_is_a_duration_that_may_be_zero() {
        let p = parse("[extension.a]\nhistory_replay_ms = 250.5\nhistory_mb = 8\n").for_extension("a");
        assert_eq!((p.history_mb, p.history_replay), (8, Duration::from_micros(250_500)));
        assert_eq!(parse("[defaults]\nhistory_replay_ms = 0\n").for_extension("a").history_replay, Duration::ZERO);
        let err = Policy::from_toml_str("[defaults]\nhistory_replay_ms = -1\n", "p").unwrap_err().to_string();
        assert!(err.contains("history_replay_ms"), "{err}");
    }

    #[test]
    fn full_example_parses_to_expected_values() {
        let policy = parse(EXAMPLE);
        let d = &policy.defaults;
        assert_eq!(d.isolation, Some(Isolation::Process));
        assert_eq!(d.deadline, Some(Duration::from_millis(10_000)));
        assert_eq!(d.heartbeat, Some(Some(Duration::from_millis(1000))));
        assert_eq!(d.max_restarts, Some(10));
        assert_eq!(d.restart_period, Some(Duration::from_secs(60)));
        assert_eq!(d.backoff_initial, Some(Duration::from_millis(1)));
        assert_eq!(d.backoff_max, Some(Duration::from_millis(1000)));
        assert_eq!(d.backoff_factor, Some(2.0));
        assert_eq!(d.on_fault, Some(OnFault::Retry));
        assert_eq!(d.max_retries, Some(1));
        assert_eq!(d.on_limit, Some(OnLimit::Disable));
        assert_eq!(d.zygote, Some(true));
        assert_eq!(d.wait, Some(WaitMode::Adaptive));
        assert_eq!(d.spin, Some(2000));
        assert_eq!(d.init.as_deref(), Some("well_init"));
        assert_eq!(
            d.limits,
            LimitsOverride {
                address_space_mb: Some(1024),
                cpu_s: Some(0),
                open_files: Some(256),
                ..LimitsOverride::default()
            }
        );

        let faulty = policy.for_extension("faulty");
        assert_eq!(faulty.group.as_deref(), Some("demo"));
        assert_eq!(faulty.deadline, Duration::from_millis(500));
        assert_eq!(faulty.heartbeat, Some(Duration::from_secs(1)));
        assert_eq!(faulty.init.as_deref(), Some("well_init"));
        assert_eq!(faulty.limits.open_files, 64);
        assert_eq!(faulty.limits.address_space_mb, 1024);
        assert_eq!(
            faulty.function("faulty_counter_add"),
            FunctionPolicy {
                state: true,
                retryable: true,
                deadline: Some(Duration::from_millis(100)),
                destroys: false,
                replaces_same: None,
                history: false,
                first_deadline: None,
            }
        );
        assert!(!policy.for_group("demo").zygote);
        assert_eq!(policy.groups.len(), 1);
        assert_eq!(policy.extensions.len(), 1);
    }

    #[test]
    fn deadline_ms_fixes_deadlines_and_the_learning_keys_are_read() {
        let policy = parse(
            "[defaults]\ndeadline_floor_ms = 50\ndeadline_ceiling_ms = 4000.5\nmax_failures_in_row = 0\n\
             [extension.fixed]\ndeadline_ms = 300\n[group.g]\nmax_failures_in_row = 5\n",
        );
        let learned = policy.for_extension("learned");
        assert!(learned.deadline_learned);
        assert_eq!(learned.deadline_floor, Duration::from_millis(50));
        assert_eq!(learned.deadline_ceiling, Duration::from_micros(4_000_500));
        assert_eq!(learned.max_failures_in_row, 0);
        let fixed = policy.for_extension("fixed");
        assert!(!fixed.deadline_learned);
        assert_eq!(fixed.deadline, Duration::from_millis(300));
        assert_eq!(policy.for_group("g").max_failures_in_row, 5);
        assert!(policy.for_group("g").deadline_learned);
        assert!(!parse("[defaults]\ndeadline_ms = 10000\n").for_extension("x").deadline_learned);
    }

    #[test]
    fn bad_learning_values_are_refused_with_their_line() {
        let (line, _, reason) = refused("[defaults]\n\ndeadline_floor_ms = 0\n");
        assert_eq!(line, 3);
        assert_eq!(reason, "deadline_floor_ms must be a positive number of milliseconds, got 0");
        let (line, _, reason) = refused("[group.g]\ndeadline_ceiling_ms = -1\n");
        assert_eq!(line, 2);
        assert!(reason.starts_with("deadline_ceiling_ms must be a positive"), "{reason}");
        let (line, _, reason) = refused("[extension.e]\nmax_failures_in_row = 1.5\n");
        assert_eq!(line, 2);
        assert!(reason.starts_with("max_failures_in_row must be a whole number"), "{reason}");
        let (_, _, reason) = refused("[extension.e]\nmax_failures_in_a_row = 2\n");
        assert!(reason.ends_with("did you mean `max_failures_in_row`?"), "{reason}");
    }

    #[test]
    fn extension_overrides_defaults() {
        let policy = parse(
            r#"
[defaults]
isolation = "mpk"
deadline_ms = 2000
max_retries = 3
escalate_after = 5
[defaults.limits]
cpu_s = 5
open_files = 100

[extension.a]
isolation = "none"
on_fault = "fail"
heartbeat_ms = 0
escalate_after = 0
[extension.a.limits]
open_files = 10
"#,
        );
        let a = policy.for_extension("a");
        assert_eq!(a.isolation, Isolation::None);
        assert_eq!(a.on_fault, OnFault::Fail);
        assert_eq!(a.heartbeat, None);
        assert_eq!(a.deadline, Duration::from_secs(2));
        assert_eq!(a.max_retries, 3);
        assert_eq!(a.escalate_after, 0);
        assert_eq!(policy.for_extension("b").escalate_after, 5);
        assert_eq!(ExtensionPolicy::default().escalate_after, 3);
        assert_eq!(a.limits.cpu_s, 5);
        assert_eq!(a.limits.open_files, 10);
        assert_eq!(a.limits.address_space_mb, 1024);

        let b = policy.for_extension("b");
        assert_eq!(b.isolation, Isolation::Mpk);
        assert_eq!(b.on_fault, OnFault::Retry);
        assert_eq!(b.limits.open_files, 100);
    }

    #[test]
    fn function_policy_lookup_and_default_function_policy() {
        let policy = parse(
            r#"
[defaults.function.shared_close]
destroys = true
retryable = false

[extension.e]
deadline_ms = 300
[extension.e.function.e_open]
state = true
[extension.e.function.e_slow]
deadline_ms = 2500.5
[extension.e.function.shared_close]
retryable = true
"#,
        );
        let e = policy.for_extension("e");
        let open = e.function("e_open");
        assert!(open.state);
        assert!(open.retryable);
        assert_eq!(open.deadline, None);
        assert!(!open.destroys);
        assert_eq!(e.deadline_for("e_open"), Duration::from_millis(300));
        assert_eq!(e.deadline_for("e_slow"), Duration::from_micros(2_500_500));
        let close = e.function("shared_close");
        assert!(close.destroys && close.retryable && !close.state);

        let unknown = e.function("not_listed");
        assert_eq!(unknown, FunctionPolicy::default());
        assert_eq!(unknown, FunctionPolicy::default());
        assert_eq!(e.deadline_for("not_listed"), Duration::from_millis(300));
    }

    #[test]
    fn group_policy_applies_defaults_then_group_section() {
        let policy = parse(
            r#"
[defaults]
max_restarts = 4
wait = "poll"
on_fault = "fail"

[extension.x]
group = "g1"
zygote = false

[group.g1]
isolation = "auto"
restart_period_s = 2.5
wait = "sleep"
heartbeat_ms = 250
[group.g1.limits]
address_space_mb = 0
"#,
        );
        let g = policy.for_group("g1");
        assert_eq!(g.group.as_deref(), Some("g1"));
        assert_eq!(g.isolation, Isolation::Auto);
        assert_eq!(g.restart_period, Duration::from_millis(2500));
        assert_eq!(g.wait, WaitMode::Sleep);
        assert_eq!(g.heartbeat, Some(Duration::from_millis(250)));
        assert_eq!(g.limits.address_space_mb, 0);
        assert_eq!(g.max_restarts, 4);
        assert_eq!(g.on_fault, OnFault::Fail);
        // Extension sections do not leak into the group's domain policy.
        assert!(g.zygote);

        let other = policy.for_group("g2");
        assert_eq!(other.group.as_deref(), Some("g2"));
        assert_eq!(other.wait, WaitMode::Poll);
    }

    #[test]
    fn group_section_refuses_extension_only_fields() {
        let (line, _, reason) = refused("[group.g]\nzygote = true\non_fault = \"fail\"\n");
        assert_eq!(line, 3);
        assert!(reason.starts_with("unknown field `on_fault`"), "{reason}");
        assert!(reason.ends_with("put it in [extension.NAME] or [defaults]"), "{reason}");
    }

    #[test]
    fn backoff_sequence_and_cap() {
        let p = ExtensionPolicy::default();
        let ms = Duration::from_millis;
        assert_eq!(p.backoff(0), Duration::ZERO);
        assert_eq!(p.backoff(1), Duration::ZERO);
        assert_eq!(p.backoff(2), ms(1));
        assert_eq!(p.backoff(3), ms(2));
        assert_eq!(p.backoff(4), ms(4));
        assert_eq!(p.backoff(11), ms(512));
        assert_eq!(p.backoff(12), ms(1000));
        assert_eq!(p.backoff(13), ms(1000));
        assert_eq!(p.backoff(u32::MAX), ms(1000));

        let constant = ExtensionPolicy { backoff_factor: 1.0, backoff_initial: ms(7), ..ExtensionPolicy::default() };
        assert_eq!(constant.backoff(2), ms(7));
        assert_eq!(constant.backoff(1000), ms(7));

        let above_cap = ExtensionPolicy { backoff_initial: ms(5000), ..ExtensionPolicy::default() };
        assert_eq!(above_cap.backoff(2), ms(1000));

        let triple = ExtensionPolicy {
            backoff_factor: 3.0,
            backoff_initial: ms(10),
            backoff_max: ms(100),
            ..ExtensionPolicy::default()
        };
        let seq: Vec<_> = (1..=6).map(|n| triple.backoff(n)).collect();
        assert_eq!(seq, [ms(0), ms(10), ms(30), ms(90), ms(100), ms(100)]);
    }

    #[test]
    fn unknown_key_at_top_level_gives_its_line() {
        let (line, column, reason) = refused("\n[defaults]\nspin = 1\n\n[defualts]\n");
        assert_eq!((line, column), (5, 2));
        assert!(reason.starts_with("unknown field `defualts`"), "{reason}");
        assert!(reason.contains("did you mean `defaults`?"), "{reason}");
    }

    #[test]
    fn unknown_key_in_extension_gives_its_line() {
        let (line, column, reason) = refused("[extension.faulty]\ngroup = \"demo\"\n  dedline_ms = 500\n");
        assert_eq!((line, column), (3, 3));
        assert!(reason.starts_with("unknown field `dedline_ms`, expected one of"), "{reason}");
        assert!(reason.contains("`deadline_ms`"), "{reason}");
        assert!(reason.ends_with("did you mean `deadline_ms`?"), "{reason}");
    }

    #[test]
    fn unknown_key_in_limits_gives_its_line() {
        let (line, _, reason) = refused("[extension.e]\n[extension.e.limits]\nopen_files = 3\nopen_file = 4\n");
        assert_eq!(line, 4);
        assert!(reason.starts_with("unknown field `open_file`"), "{reason}");
        let (line, _, _) = refused("[defaults.limits]\n\nstack_mb = 8\n");
        assert_eq!(line, 3);
    }

    #[test]
    fn unknown_key_in_function_section_gives_its_line() {
        let (line, _, reason) =
            refused("[extension.e]\ndeadline_ms = 5\n[extension.e.function.f]\nstate = true\nidempotent = true\n");
        assert_eq!(line, 5);
        assert!(reason.starts_with("unknown field `idempotent`"), "{reason}");
        assert!(reason.contains("`retryable`"), "{reason}");
    }

    #[test]
    fn bad_isolation_string_lists_valid_values() {
        let (line, column, reason) = refused("[defaults]\nisolation = \"vm\"\n");
        assert_eq!((line, column), (2, 13));
        assert_eq!(reason, r#"isolation must be one of "none", "process", "mpk", "auto", got "vm""#);
        let err = "vm".parse::<Isolation>().unwrap_err();
        for valid in ["none", "process", "mpk", "auto"] {
            assert!(err.contains(valid), "{err}");
        }
    }

    #[test]
    fn deadline_ms_zero_refused_with_its_line() {
        let (line, _, reason) = refused("[extension.e]\ngroup = \"g\"\ndeadline_ms = 0\n");
        assert_eq!(line, 3);
        assert_eq!(reason, "deadline_ms must be a positive number of milliseconds, got 0");
        let (line, _, reason) = refused("[extension.e.function.f]\n\ndeadline_ms = 0.0\n");
        assert_eq!(line, 3);
        assert!(reason.starts_with("deadline_ms must be a positive"), "{reason}");
    }

    #[test]
    fn wrong_type_refused() {
        let (line, _, reason) = refused("[defaults]\ndeadline_ms = \"10s\"\n");
        assert_eq!(line, 2);
        assert_eq!(reason, "deadline_ms must be a positive number of milliseconds, got \"10s\"");
        let (line, _, reason) = refused("[defaults]\nspin = 1\nzygote = \"yes\"\n");
        assert_eq!(line, 3);
        assert_eq!(reason, "zygote must be true or false, got \"yes\"");
        let (_, _, reason) = refused("[defaults]\nmax_restarts = 10.0\n");
        assert!(reason.ends_with("got 10.0"), "{reason}");
        let (_, _, reason) = refused("[defaults]\nwait = [1]\n");
        assert!(reason.ends_with("got an array"), "{reason}");
        let (_, _, reason) = refused("[defaults]\non_limit = 1979-05-27\n");
        assert!(reason.ends_with("got a date-time"), "{reason}");
        let (line, _, reason) = refused("[defaults]\nlimits = 3\n");
        assert_eq!(line, 2);
        assert!(reason.contains("resource limits"), "{reason}");
    }

    #[test]
    fn bad_values_refused() {
        let cases = [
            ("heartbeat_ms = -1", "heartbeat_ms must be a non-negative"),
            ("restart_period_s = nan", "restart_period_s must be a positive"),
            ("restart_period_s = 0", "restart_period_s must be a positive"),
            ("backoff_initial_ms = -0.5", "backoff_initial_ms must be"),
            ("backoff_max_ms = inf", "backoff_max_ms must be"),
            ("deadline_ms = 1e300", "of at most"),
            ("backoff_factor = 0.5", "backoff_factor must be a number of at least 1.0"),
            ("max_retries = 101", "max_retries must be a whole number from 0 to 100"),
            ("escalate_after = -1", "escalate_after must be a whole number of faults from 0 (never) to 1000000"),
            ("max_restarts = -1", "max_restarts must be a whole number"),
            ("spin = 10000001", "spin must be a whole number from 0 to 10000000"),
            ("group = \"\"", "group must be non-empty"),
            ("group = \"a/b\"", "group must be non-empty"),
            ("init = \"9lives\"", "init must be a C function name"),
            ("on_fault = \"ignore\"", r#"one of "retry", "fail""#),
            ("limits.open_files = 0", "open_files must be a whole number of at least 1"),
            ("limits.cpu_s = -3", "cpu_s must be"),
        ];
        for (line, expected) in cases {
            let (n, _, reason) = refused(&format!("[defaults]\n{line}\n"));
            assert_eq!(n, 2, "{line}");
            assert!(reason.contains(expected), "{line}: {reason}");
        }
    }

    #[test]
    fn bad_section_names_refused_at_the_name() {
        let (line, column, reason) = refused("[extension.ok]\n[extension.\"bad name\"]\n");
        assert_eq!((line, column), (2, 12));
        assert!(reason.starts_with("extension name must be"), "{reason}");
        let (line, _, reason) = refused("\n[group.\"\"]\n");
        assert_eq!(line, 2);
        assert!(reason.starts_with("group name must be"), "{reason}");
        let (line, _, reason) = refused("[extension.e.function.\"a-b\"]\n");
        assert_eq!(line, 1);
        assert!(reason.starts_with("function name must be"), "{reason}");
        // Dots and dashes are fine in extension and group names.
        let policy = parse("[extension.\"my-ext.v2\"]\n[group.g-1]\n");
        assert!(policy.extensions.contains_key("my-ext.v2"));
        assert!(policy.groups.contains_key("g-1"));
    }

    #[test]
    fn float_and_integer_durations() {
        let policy = parse("[defaults]\nrestart_period_s = 1.5\nbackoff_initial_ms = 0.25\nbackoff_max_ms = 0\n");
        let p = policy.for_extension("x");
        assert_eq!(p.restart_period, Duration::from_millis(1500));
        assert_eq!(p.backoff_initial, Duration::from_micros(250));
        assert_eq!(p.backoff_max, Duration::ZERO);
        assert_eq!(p.backoff(5), Duration::ZERO);
    }

    #[test]
    fn syntax_error_gives_its_line() {
        let (line, _, reason) = refused("[defaults]\nspin = \n");
        assert_eq!(line, 2);
        assert!(!reason.contains('\n') && !reason.is_empty(), "{reason}");
        let (line, _, reason) = refused("[defaults]\n\n[defaults]\n");
        assert_eq!(line, 3);
        assert!(reason.contains("duplicate key `defaults`"), "{reason}");
        let (_, _, reason) = refused("extension = 3\n");
        assert!(reason.ends_with("expected a table"), "{reason}");
    }

    #[test]
    fn from_file_missing_path_names_the_path() {
        let path = std::env::temp_dir().join("ward-policy-test-does-not-exist/policy.toml");
        let err = Policy::from_file(&path).unwrap_err();
        assert!(matches!(&err, PolicyError::Read { path: p, .. } if *p == path));
        assert!(err.to_string().contains(&path.display().to_string()), "{err}");
    }

    #[test]
    fn from_file_reads_and_names_origin() {
        let dir = std::env::temp_dir().join(format!("ward-policy-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.toml");
        std::fs::write(&good, EXAMPLE).unwrap();
        assert_eq!(Policy::from_file(&good).unwrap(), parse(EXAMPLE));
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "[defaults]\nspin = -1\n").unwrap();
        let message = Policy::from_file(&bad).unwrap_err().to_string();
        assert!(message.starts_with(&format!("{}:2:", bad.display())), "{message}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn display_of_invalid_starts_with_origin_line_column() {
        let err = Policy::from_toml_str("[defaults]\ndeadline_ms = 0\n", "ward.toml").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("ward.toml:2:15: "), "{text}");
        assert_eq!(text, "ward.toml:2:15: deadline_ms must be a positive number of milliseconds, got 0");
        let err = PolicyError::Invalid { origin: "o".into(), line: 0, column: 0, reason: "r".into() };
        assert_eq!(err.to_string(), "o:0:0: r");
    }

    #[test]
    fn builder_overrides() {
        let mut policy = Policy::default();
        policy.set_default_isolation(Isolation::None);
        policy.extension_mut("a").deadline = Some(Duration::from_millis(20));
        policy
            .extension_mut("a")
            .functions
            .insert("a_open".into(), FunctionOverride { state: Some(true), ..FunctionOverride::default() });
        policy.group_mut("g").zygote = Some(false);
        let a = policy.for_extension("a");
        assert_eq!(a.isolation, Isolation::None);
        assert_eq!(a.deadline, Duration::from_millis(20));
        assert!(a.function("a_open").state);
        assert_eq!(policy.for_extension("b").deadline, Duration::from_secs(10));
        assert!(!policy.for_group("g").zygote);
        assert_eq!(policy.extensions.len(), 1);
    }

    #[test]
    fn keywords_round_trip() {
        for iso in Isolation::ALL {
            assert_eq!(iso.as_str().parse::<Isolation>(), Ok(*iso));
            assert_eq!(iso.to_string(), iso.as_str());
        }
        for w in WaitMode::ALL {
            assert_eq!(w.as_str().parse::<WaitMode>(), Ok(*w));
        }
        for f in OnFault::ALL {
            assert_eq!(f.as_str().parse::<OnFault>(), Ok(*f));
        }
        for l in OnLimit::ALL {
            assert_eq!(l.as_str().parse::<OnLimit>(), Ok(*l));
        }
        assert!("Process".parse::<Isolation>().is_err());
    }

    #[test]
    fn native_fallback_defaults_to_true_and_is_set_per_extension() {
        assert!(Policy::default().for_extension("x").native_fallback);
        let policy = parse("[defaults]\nnative_fallback = false\n[extension.trusted]\nnative_fallback = true\n");
        assert!(!policy.for_extension("x").native_fallback);
        assert!(policy.for_extension("trusted").native_fallback);
        let (line, _, reason) = refused("[defaults]\nnative_fallback = \"no\"\n");
        assert_eq!(line, 2);
        assert!(reason.contains("native_fallback must be true or false"), "{reason}");
        // Per extension: a group's domain has no say in it.
        let (_, _, reason) = refused("[group.g]\nnative_fallback = false\n");
        assert!(reason.contains("`native_fallback` is set per extension"), "{reason}");
    }

    #[test]
    fn an_address_space_too_small_for_any_domain_is_refused() {
        for mb in [1, 15] {
            let (_, _, reason) = refused(&format!("[defaults.limits]\naddress_space_mb = {mb}\n"));
            assert!(reason.contains("less cannot hold a domain"), "{reason}");
        }
        for mb in [0, MIN_ADDRESS_SPACE_MB, 4096] {
            let policy = parse(&format!("[defaults.limits]\naddress_space_mb = {mb}\n"));
            assert_eq!(policy.for_extension("x").limits.address_space_mb, mb);
        }
    }

    #[test]
    fn cgroup_limits_and_the_idle_cpu_budget_are_checked_and_inherited() {
        let defaults = Limits::default();
        assert_eq!(
            (defaults.memory_mb, defaults.pids, defaults.cpu_percent, defaults.idle_cpu_ms),
            (1024, 128, 0, 100)
        );
        for (key, bad, says) in [
            ("memory_mb", 8, "less cannot hold a domain"),
            ("pids", 3, "at least 8"),
            ("cpu_percent", 100_001, "at most 100000"),
            ("idle_cpu_ms", 1001, "at most 1000"),
        ] {
            let (line, _, reason) = refused(&format!("[defaults.limits]\n{key} = {bad}\n"));
            assert_eq!(line, 2);
            assert!(reason.contains(key) && reason.contains(says), "{reason}");
        }
        let policy = parse(
            "[defaults.limits]\nmemory_mb = 0\npids = 16\n[extension.x.limits]\ncpu_percent = 50\nidle_cpu_ms = 0\n\
             [group.g.limits]\nmemory_mb = 64\n",
        );
        let x = policy.for_extension("x").limits;
        assert_eq!((x.memory_mb, x.pids, x.cpu_percent, x.idle_cpu_ms), (0, 16, 50, 0));
        let y = policy.for_extension("y").limits;
        assert_eq!((y.memory_mb, y.pids, y.cpu_percent, y.idle_cpu_ms), (0, 16, 0, 100));
        assert_eq!(policy.for_group("g").limits.memory_mb, 64);
    }

    #[test]
    fn from_file_refuses_devices_fifos_and_huge_files_unread() {
        let err = Policy::from_file(Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(&err, PolicyError::NotAFile { .. }), "{err}");
        assert!(err.to_string().contains("/dev/zero"), "{err}");
        let dir = std::env::temp_dir().join(format!("ward-policy-special-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A FIFO nobody writes to: opening it to read would block for ever.
        let fifo = dir.join("fifo.toml");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo");
        assert!(made.success(), "mkfifo {}", fifo.display());
        assert!(matches!(Policy::from_file(&fifo), Err(PolicyError::NotAFile { .. })));
        // A sparse file of 8 GiB: refused by its size, not read.
        let big = dir.join("big.toml");
        std::fs::File::create(&big).unwrap().set_len(8 << 30).unwrap();
        let err = Policy::from_file(&big).unwrap_err();
        assert!(matches!(&err, PolicyError::TooLarge { len, .. } if *len == 8 << 30), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn line_column_counts_characters() {
        assert_eq!(line_column("", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("é = 1\nx", 2), (1, 2));
        assert_eq!(line_column("é = 1\nx", 1), (1, 1));
        assert_eq!(line_column("ab", 99), (1, 3));
    }
}
