//! Every key of a policy, written once: the effective policy's field (its type, default and documentation), the key
//! of the file that sets it, the sections that may, and how its value is read and checked. `section.rs` turns each
//! list into the effective struct, its override and its file form; a new key is one entry here. Users learn of it
//! from the documented example of `mod.rs` and the README; `tests.rs` sets every key and fails until the new one
//! is set there too.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::file::{functions, table, KeyError};
use super::keywords::{Isolation, OnFault, OnLimit, WaitMode};
use super::section::policy_section;
use super::values::{
    check, domain_megabytes, duration, factor, flag, function_name, group_name, keyword, library_path, millis,
    millis_or_zero, pids, text, whole, AbsolutePaths, LibraryFaultValue, Unit,
};
use super::{
    DEFAULT_CHECKPOINT, DEFAULT_HISTORY_MB, DEFAULT_HISTORY_REPLAY, DEFAULT_READ_PAST_INPUT_KB, MAX_READ_PAST_INPUT_KB,
};
use crate::libfault::LibraryFault;

policy_section! {
    /// The effective policy of one extension (or of one group's domain).
    #[derive(Debug, Clone, PartialEq)]
    pub struct ExtensionPolicy;
    /// The settings of one section (`[defaults]`, `[extension.NAME]` or `[group.NAME]`); every field optional.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct ExtensionOverride, read as "a table of extension settings";
    keys {
        /// How the extension is isolated.
        isolation: Isolation = Isolation::Process;
            "isolation", Domain, set Option<Isolation> => keyword();
        /// The group whose domain the extension shares; `None`: its own domain.
        group: Option<String> = None;
            "group", Extension, some Option<String> => group_name();
        /// Deadline of one call when deadlines are fixed (`deadline_learned` false); else the bound of ward's own
        /// waits that belong to no function (deferred calls, a zygote's answers, an extension's `init`).
        deadline: Duration = Duration::from_secs(10);
            "deadline_ms", Domain, set Option<Duration> => millis();
        /// The least a learned deadline can be.
        deadline_floor: Duration = Duration::from_millis(200);
            "deadline_floor_ms", Domain, set Option<Duration> => millis();
        /// The most a learned deadline (or a first call's) can be.
        deadline_ceiling: Duration = Duration::from_secs(10);
            "deadline_ceiling_ms", Domain, set Option<Duration> => millis();
        /// One call failing this many times in a row, each time again after its recovery, disables the extension
        /// at once, whatever the restart intensity allows; 0: never (only `max_restarts` disables).
        max_failures_in_row: u32 = 3;
            "max_failures_in_row", Domain, set Option<u32> =>
                whole(0, 1000, "a whole number of failures from 0 (never) to 1000");
        /// Heartbeat interval of the domain; `None`: off. Only a domain process is pinged: an mpk domain has its
        /// heartbeat once it has moved to a process (`escalate_after`). In an override, `Some(None)`: explicitly
        /// off.
        heartbeat: Option<Duration> = None;
            "heartbeat_ms", Domain, set Option<Option<Duration>> => check(|key, v| {
                duration(key, Unit::Milliseconds, Some(" (0 = off)"), v).map(|t| (!t.is_zero()).then_some(t))
            });
        /// Restart intensity: at most this many restarts ...
        max_restarts: u32 = 10;
            "max_restarts", Domain, set Option<u32> => whole(0, u32::MAX.into(), "a whole number from 0 to 4294967295");
        /// ... within this period.
        restart_period: Duration = Duration::from_secs(60);
            "restart_period_s", Domain, set Option<Duration> =>
                check(|key, v| duration(key, Unit::Seconds, None, v));
        /// Backoff before the second consecutive restart.
        backoff_initial: Duration = Duration::from_millis(1);
            "backoff_initial_ms", Domain, set Option<Duration> => millis_or_zero("");
        /// Largest backoff.
        backoff_max: Duration = Duration::from_secs(1);
            "backoff_max_ms", Domain, set Option<Duration> => millis_or_zero("");
        /// Growth of the backoff from one restart to the next (at least 1.0).
        backoff_factor: f64 = 2.0;
            "backoff_factor", Domain, set Option<f64> => factor();
        /// What the call in flight gets when the extension fails.
        on_fault: OnFault = OnFault::Retry;
            "on_fault", Extension, set Option<OnFault> => keyword();
        /// How many times one call is retried (at most 100).
        max_retries: u32 = 1;
            "max_retries", Extension, set Option<u32> => whole(0, 100, "a whole number from 0 to 100");
        /// After this many faults in an mpk domain, the domain moves to a process domain; 0: never.
        escalate_after: u32 = 3;
            "escalate_after", Extension, set Option<u32> =>
                whole(0, 1_000_000, "a whole number of faults from 0 (never) to 1000000");
        /// What happens past the restart limit.
        on_limit: OnLimit = OnLimit::Disable;
            "on_limit", Domain, set Option<OnLimit> => keyword();
        /// Restart from a pre-forked, pre-loaded process.
        zygote: bool = true;
            "zygote", Domain, set Option<bool> => flag();
        /// How callers wait for replies.
        wait: WaitMode = WaitMode::Adaptive;
            "wait", Domain, set Option<WaitMode> => keyword();
        /// Spin iterations before sleeping in adaptive mode.
        spin: u32 = 2000;
            "spin", Domain, set Option<u32> => whole(0, 10_000_000, "a whole number from 0 to 10000000");
        /// Function called (no arguments, returns int64; nonzero = load
        /// failure) after load.
        init: Option<String> = None;
            "init", Extension, some Option<String> => function_name();
        /// Class output checks: a class wrapper treats wrong output (audio with NaN or infinity) as a fault and
        /// retries the call on the recovered domain; the same wrong output again right after that recovery is the
        /// plugin's own and is passed on (and that instance's checks stop).
        check_output: bool = true;
            "check_output", Extension, set Option<bool> => flag();
        /// Call the extension's functions with poison in every register and stack slot they are not given (process
        /// isolation only), so a stale register or an uninitialised local read faults instead of giving a wrong
        /// result. Costs about 0.3 us a call (the stack fill).
        poison: bool = false;
            "poison", Extension, set Option<bool> => flag();
        /// How many MiB of data calls' inputs ([`FunctionPolicy::history`]) the shadow log keeps for replay; 0: none.
        /// Past it (or past `history_replay`) the oldest data calls are dropped: a restart replays the most recent
        /// window of the stream (docs/RELIABILITY.md, "History").
        history_mb: u64 = DEFAULT_HISTORY_MB;
            "history_mb", Extension, set Option<u64> => whole(0, 1 << 20, "a whole number of MiB from 0 to 1048576");
        /// How many KiB past an input an extension may read, reading zeros, before a guard page faults (rounded up
        /// to whole pages): after the inputs of a process domain (its input pool, arena inputs lent in place; the
        /// domain's value) and after the class adapters' copies of input frames and ports (the extension's). 0: a
        /// read past an input faults at once. Writing past an output faults whatever this says.
        read_past_input_kb: u32 = DEFAULT_READ_PAST_INPUT_KB;
            "read_past_input_kb", Domain, set Option<u32> =>
                whole(0, MAX_READ_PAST_INPUT_KB.into(), "a whole number of KiB from 0 to 1024");
        /// How long replaying the kept data calls may take, as the sum of what each took when it was made (at least
        /// a replayed call's round trip each); zero: no history.
        history_replay: Duration = DEFAULT_HISTORY_REPLAY;
            "history_replay_ms", Extension, set Option<Duration> => millis_or_zero(" (0 = no history)");
        /// How much of the stream (audio time, not the clock's) passes between checkpoints of an instance whose
        /// plugin can save its state (LV2's `state:interface`): the class saves it and a restart restores the last
        /// save and replays only the history since (docs/RELIABILITY.md, "Checkpoints"); for a runtime, the least
        /// time (the clock's) between snapshots of its heap, which a restart restores; zero: never.
        checkpoint: Duration = DEFAULT_CHECKPOINT;
            "checkpoint_ms", Extension, set Option<Duration> => millis_or_zero(" (0 = no checkpoints)");
        /// A run-time library fault injected into the extension's own calls to its C library (fault testing;
        /// process isolation only); `None`: off. In an override, `Some(None)`: explicitly off.
        library_fault: Option<LibraryFault> = None;
            "library_fault", Extension, set Option<Option<LibraryFault>> => LibraryFaultValue;
        /// After a failure, restart the extension from this file instead of the one it was loaded from (a
        /// known-good or patched version); `None`: from the same file.
        restart_from: Option<PathBuf> = None;
            "restart_from", Own, some Option<PathBuf> => library_path();
        /// What the preload shim of `ward run` does with a file the host opens that looks like a plugin but that
        /// ward cannot take (a file it cannot classify, a plugin of an ABI it has no class for): load it without
        /// ward (`true`), or refuse it, so the host's `dlopen` fails (`false`). A plugin of a class ward has is
        /// never loaded without ward, whatever this says: once it failed under ward, the host gets a load error.
        native_fallback: bool = true;
            "native_fallback", Extension, set Option<bool> => flag();
        /// Whether the preload shim of `ward run` keeps what the describer read of a LADSPA library or frei0r plugin
        /// in the user's cache of descriptions, and takes it from there while the file is unchanged (same device,
        /// inode, size, modification and change times), so a host that scans it again starts no describer and
        /// loads none of its code; `false`: every scan describes it anew. What the cache holds is checked as a
        /// description read from a domain is.
        describe_cache: bool = true;
            "describe_cache", Extension, set Option<bool> => flag();
        /// Resource limits of the domain.
        limits: Limits = Limits::default();
            "limits", Domain, nested LimitsOverride => table();
        /// The sandbox of a process domain (see [`crate::sandbox`]).
        sandbox: SandboxPolicy = SandboxPolicy::default();
            "sandbox", Domain, nested SandboxOverride => table();
        /// Policies of single functions, by name.
        functions: BTreeMap<String, FunctionPolicy> = BTreeMap::new();
            "function", Extension, nested BTreeMap<String, FunctionOverride> => functions();
    }
    set_by_code {
        /// Each function's deadline follows what its calls took before (DECISIONS.md, "Deadlines that learn"). On
        /// by default; a policy section that sets `deadline_ms` turns it off for the extensions it applies to.
        deadline_learned: bool = true;
        /// What the host gets from the extension once it is disabled, for the message that says so (a class's
        /// bypass: "audio passes through unchanged"); `None`: its calls fail. Set by class wrappers, not by policy
        /// files.
        when_disabled: Option<String> = None;
    }
}

policy_section! {
    /// Resource limits of a domain.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Limits;
    /// Resource limits set by one section; every field optional.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct LimitsOverride, read as "a table of resource limits";
    keys {
        /// Address space in MiB; 0 = unlimited.
        address_space_mb: u64 = 1024;
            "address_space_mb", Domain, set Option<u64> => domain_megabytes();
        /// CPU time in seconds; 0 = unlimited.
        cpu_s: u64 = 0;
            "cpu_s", Domain, set Option<u64> =>
                whole(0, u64::MAX, "a non-negative whole number of seconds (0 = unlimited)");
        /// Open file descriptors; at least 1.
        open_files: u64 = 256;
            "open_files", Domain, set Option<u64> => whole(1, u64::MAX, "a whole number of at least 1");
        /// Memory of the domain's cgroup in MiB (its processes' memory, and the shared memory and memfd pages they
        /// touch); 0 = unlimited. Without a usable cgroup only `address_space_mb` holds.
        memory_mb: u64 = 1024;
            "memory_mb", Domain, set Option<u64> => domain_megabytes();
        /// Processes and threads in the domain's cgroup (the zygote and its incarnations together); 0 = unlimited.
        pids: u64 = 128;
            "pids", Domain, set Option<u64> => pids();
        /// CPU quota of the domain's cgroup, in percent of one processor; 0 = none.
        cpu_percent: u64 = 0;
            "cpu_percent", Domain, set Option<u64> =>
                whole(0, 100_000, "0 (no quota) or a whole percentage of one processor, at most 100000");
        /// CPU the domain may use per second between calls, in ms, before that is a fault; 0 = not checked.
        idle_cpu_ms: u64 = 100;
            "idle_cpu_ms", Domain, set Option<u64> =>
                whole(0, 1000, "0 (not checked) or whole ms of CPU per second, at most 1000");
    }
    set_by_code {}
}

policy_section! {
    /// The policy of one function of an extension.
    #[derive(Debug, Clone, PartialEq)]
    pub struct FunctionPolicy;
    /// The policy of one function as set by one section; every field optional.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct FunctionOverride, read as "a table of function settings";
    keys {
        /// State-establishing: logged in the shadow log, replayed after restart.
        state: bool = false;
            "state", Domain, set Option<bool> => flag();
        /// May be re-issued after a fault.
        retryable: bool = true;
            "retryable", Domain, set Option<bool> => flag();
        /// Deadline of one call; `None`: the extension's.
        deadline: Option<Duration> = None;
            "deadline_ms", Domain, some Option<Duration> => millis();
        /// Releases the handle passed as its first Handle argument: its
        /// shadow-log entries are dropped.
        destroys: bool = false;
            "destroys", Domain, set Option<bool> => flag();
        /// A data call that advances the extension's state (an audio block, a frame through a filter with memory):
        /// while the extension's `history_mb` allows, it is kept in the shadow log with its inputs and replayed in
        /// order, so a restarted extension is back in the very state it had, not only its configuration.
        history: bool = false;
            "history", Domain, set Option<bool> => flag();
    }
    set_by_code {
        /// For a state-establishing setter: a call whose first `n` arguments
        /// equal an earlier logged call's replaces it, so the shadow log keeps
        /// only the last value (a parameter set every frame does not grow it).
        /// `None`: every call is kept. Set by class wrappers, not by policy files.
        replaces_same: Option<usize> = None;
        /// The deadline of this function's calls while its deadline is learned and too few calls have been seen to
        /// learn it (see [`ExtensionPolicy::deadline_learned`]); `None`: the extension's `deadline_ceiling`. Set by
        /// class wrappers (their default for a class call: an audio block, a frame), not by policy files.
        first_deadline: Option<Duration> = None;
    }
}

policy_section! {
    /// The effective sandbox of one domain (see [`crate::sandbox`]).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct SandboxPolicy;
    /// The sandbox settings of one policy section; every field optional.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct SandboxOverride, read as "a table of sandbox settings", then loosened_with_a_reason;
    keys {
        /// The system call filter.
        seccomp: bool = true;
            "seccomp", Domain, set Option<bool> => flag();
        /// Landlock: files read-only, no TCP, no signals or abstract sockets outside the domain.
        landlock: bool = true;
            "landlock", Domain, set Option<bool> => flag();
        /// A PID namespace of its own (with a fresh `/proc`): the host's processes out of sight, every process the
        /// extension forks ending with the domain.
        pid_namespace: bool = true;
            "pid_namespace", Domain, set Option<bool> => flag();
        /// Sockets allowed.
        network: bool = false;
            "network", Domain, set Option<bool> => flag();
        /// `execve` allowed.
        exec: bool = false;
            "exec", Domain, set Option<bool> => flag();
        /// Child processes allowed.
        fork: bool = false;
            "fork", Domain, set Option<bool> => flag();
        /// Absolute paths the extension may write beneath.
        writable: Vec<PathBuf> = Vec::new();
            "writable", Domain, set Option<Vec<PathBuf>> => AbsolutePaths;
        /// Why the sandbox is loosened (required by the file format when it is).
        reason: Option<String> = None;
            "reason", Domain, some Option<String> => text();
    }
    set_by_code {}
}

/// A sandbox section that loosens the sandbox must say why; a blank reason is none.
fn loosened_with_a_reason(section: SandboxOverride) -> Result<SandboxOverride, KeyError> {
    let loosens = section.seccomp == Some(false)
        || section.landlock == Some(false)
        || section.pid_namespace == Some(false)
        || section.network == Some(true)
        || section.exec == Some(true)
        || section.fork == Some(true)
        || section.writable.as_ref().is_some_and(|w| !w.is_empty());
    let reason = section.reason.as_deref().map(str::trim).filter(|r| !r.is_empty()).map(str::to_string);
    if loosens && reason.is_none() {
        return Err(KeyError::LoosenedWithoutReason);
    }
    Ok(SandboxOverride { reason, ..section })
}
