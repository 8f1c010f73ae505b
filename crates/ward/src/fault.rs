//! The fault taxonomy: every way an extension can fail ends as one [`Fault`] with its cause.

use std::fmt;
use std::time::Duration;

/// What went wrong, as the supervisor saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// The domain died of a signal (or, in-process, took one).
    Signal { signo: i32, cause: SignalCause, addr: Option<u64> },
    /// The domain process called `exit` (or returned from main).
    Exited { status: i32 },
    /// A call ran past its deadline; the domain was stopped.
    Timeout { deadline: Duration },
    /// The domain did not answer a heartbeat within its interval.
    HeartbeatMissed { interval: Duration },
    /// The domain broke the protocol: a malformed record, a reply for a call not in flight, a pointer outside its
    /// pool. The host trusts no byte the domain writes.
    Protocol { what: String },
    /// A class wrapper's output check failed (audio with NaN or infinity, say): the call returned, but what it
    /// returned is wrong.
    BadOutput { what: String },
    /// The domain ended and nothing says how.
    Vanished,
    /// Recovering from a fault did not bring the domain back: the new incarnation could not be started, or did not
    /// take the replay of its shadow log. Recovery goes round again, within the restart limits.
    RestartFailed { reason: String },
    /// A call from another thread found the domain held by a call that was out in a host callback, and that
    /// callback did not return within the call's deadline: a callback that waits for such a call would never
    /// return. The call was not made; the domain itself is fine and keeps serving the call it is in.
    BusyInCallback { deadline: Duration },
    /// The domain's cgroup reached its memory limit (the policy's `memory_mb`; memory of its processes, and the
    /// shared memory and memfd pages they touched) and the kernel's OOM killer killed the process (SIGKILL).
    MemoryLimit { limit_mb: u64 },
    /// While no call was in flight, threads of the domain other than the one serving calls used more CPU than the
    /// policy allows (`idle_cpu_ms` per second): `used` over `over` of time between calls, where `allowed` was the
    /// budget for that time. The monitor killed the domain.
    IdleCpu { used: Duration, over: Duration, allowed: Duration },
}

/// What the domain's signal handler saw as it died: a claim of the failed process, used only when its record
/// agrees with the signal its parent saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DomainHint {
    #[default]
    None,
    /// The faulting address was just below the stack.
    StackOverflow,
    /// Less than a 32nd of the address-space limit was left.
    MemoryExhausted,
    /// The descriptor table was full.
    DescriptorsExhausted,
    /// The domain's sandbox refused a system call; the fault's address is the call's number.
    SyscallRefused,
}

/// What a fatal signal most likely means, from the signal, its code, the address and the domain's own hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalCause {
    NullDereference,
    StackOverflow,
    /// Any fatal signal with the address-space limit (nearly) reached: most likely an allocation that failed and a
    /// null pointer used, or an abort on the failure.
    OutOfMemory,
    /// Any fatal signal with the descriptor table full: most likely an open that failed.
    OutOfDescriptors,
    /// SIGSYS from the domain's sandbox: the extension made a system call it is not allowed (the fault's address
    /// is the call's number).
    SandboxRefused,
    InvalidAccess,
    Abort,
    Killed,
    IllegalInstruction,
    Arithmetic,
    Bus,
    Trap,
    Other,
}

impl SignalCause {
    pub fn classify(signo: i32, addr: Option<u64>, hint: DomainHint) -> SignalCause {
        match signo {
            libc::SIGSEGV if hint == DomainHint::StackOverflow => SignalCause::StackOverflow,
            libc::SIGSYS if hint == DomainHint::SyscallRefused => SignalCause::SandboxRefused,
            // SIGKILL cannot be caught: a record with it is stale or forged, and says nothing.
            libc::SIGKILL => SignalCause::Killed,
            _ if hint == DomainHint::MemoryExhausted => SignalCause::OutOfMemory,
            _ if hint == DomainHint::DescriptorsExhausted => SignalCause::OutOfDescriptors,
            libc::SIGSEGV if addr.is_some_and(|a| a < 64 * 1024) => SignalCause::NullDereference,
            libc::SIGSEGV => SignalCause::InvalidAccess,
            libc::SIGABRT => SignalCause::Abort,
            libc::SIGILL => SignalCause::IllegalInstruction,
            libc::SIGFPE => SignalCause::Arithmetic,
            libc::SIGBUS => SignalCause::Bus,
            libc::SIGTRAP => SignalCause::Trap,
            _ => SignalCause::Other,
        }
    }

    pub fn describe(&self) -> &'static str {
        match self {
            SignalCause::NullDereference => "null dereference",
            SignalCause::StackOverflow => "stack overflow",
            SignalCause::OutOfMemory => "out of memory (address-space limit reached)",
            SignalCause::OutOfDescriptors => "out of descriptors (open-files limit reached)",
            SignalCause::SandboxRefused => "system call refused by the sandbox",
            SignalCause::InvalidAccess => "invalid memory access",
            SignalCause::Abort => "abort",
            SignalCause::Killed => "killed",
            SignalCause::IllegalInstruction => "illegal instruction",
            SignalCause::Arithmetic => "arithmetic error",
            SignalCause::Bus => "bus error",
            SignalCause::Trap => "trap",
            SignalCause::Other => "fatal signal",
        }
    }
}

/// One fault of one domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    /// The domain (extension name, or group name for a shared domain).
    pub domain: String,
    /// The function whose call was in flight, if any.
    pub call: Option<String>,
    /// Which incarnation of the domain failed (1 is the first).
    pub incarnation: u64,
}

impl Fault {
    /// A short machine-friendly name of the kind: `signal`, `exit`, `timeout`, `heartbeat`, `protocol`,
    /// `bad-output`, `vanished`, `restart-failed`, `busy`, `memory`, `idle-cpu`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            FaultKind::Signal { .. } => "signal",
            FaultKind::Exited { .. } => "exit",
            FaultKind::Timeout { .. } => "timeout",
            FaultKind::HeartbeatMissed { .. } => "heartbeat",
            FaultKind::Protocol { .. } => "protocol",
            FaultKind::BadOutput { .. } => "bad-output",
            FaultKind::Vanished => "vanished",
            FaultKind::RestartFailed { .. } => "restart-failed",
            FaultKind::BusyInCallback { .. } => "busy",
            FaultKind::MemoryLimit { .. } => "memory",
            FaultKind::IdleCpu { .. } => "idle-cpu",
        }
    }

    /// The human cause without the call: "null dereference (SIGSEGV at 0x0)".
    pub fn cause(&self) -> String {
        self.kind.cause()
    }
}

impl FaultKind {
    /// The human cause: "null dereference (SIGSEGV at 0x0)".
    pub fn cause(&self) -> String {
        match self {
            FaultKind::Signal { signo, cause, addr } => match addr {
                Some(nr) if *cause == SignalCause::SandboxRefused => {
                    let name = i64::try_from(*nr).ok().and_then(ward_xpc::layout::syscall_name);
                    let call = name.map_or_else(|| format!("system call {nr}"), |n| format!("{n}, system call {nr}"));
                    format!("{} ({}: {call})", cause.describe(), signal_name(*signo))
                }
                Some(a) if matches!(signo, &libc::SIGSEGV | &libc::SIGBUS) => {
                    format!("{} ({} at {a:#x})", cause.describe(), signal_name(*signo))
                }
                _ => format!("{} ({})", cause.describe(), signal_name(*signo)),
            },
            FaultKind::Exited { status } => format!("exit({status})"),
            FaultKind::Timeout { deadline } => {
                format!("hang (no reply within {})", fmt_duration(*deadline))
            }
            FaultKind::HeartbeatMissed { interval } => {
                format!("missed heartbeat (no answer within {})", fmt_duration(*interval))
            }
            FaultKind::Protocol { what } => format!("protocol violation: {what}"),
            FaultKind::BadOutput { what } => format!("output check failed: {what}"),
            FaultKind::Vanished => "domain vanished".into(),
            FaultKind::RestartFailed { reason } => format!("recovery failed: {reason}"),
            FaultKind::BusyInCallback { deadline } => format!(
                "no turn within {}: the domain was busy in a host callback of another thread's call all that time \
                 (a callback that waits for a call into the same domain from another thread would never return)",
                fmt_duration(*deadline)
            ),
            FaultKind::MemoryLimit { limit_mb } => {
                format!("memory limit of {limit_mb} MiB reached (killed by the kernel's OOM killer, SIGKILL)")
            }
            FaultKind::IdleCpu { used, over, allowed } => format!(
                "used {} ms of CPU in {} between calls (policy allows {} ms)",
                used.as_millis(),
                fmt_duration(*over),
                allowed.as_millis()
            ),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.cause())?;
        if let Some(call) = &self.call {
            write!(f, " in call {call}")?;
        }
        write!(f, " (domain {}, incarnation {})", self.domain, self.incarnation)
    }
}

pub fn signal_name(signo: i32) -> String {
    let name = match signo {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGABRT => "SIGABRT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGSYS => "SIGSYS",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        _ => return format!("signal {signo}"),
    };
    name.into()
}

pub(crate) fn fmt_duration(d: Duration) -> String {
    if d.as_secs() >= 1 && d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else if d.as_millis() >= 1 {
        format!("{} ms", d.as_millis())
    } else {
        format!("{} us", d.as_micros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_signals() {
        use DomainHint as H;
        assert_eq!(SignalCause::classify(libc::SIGSEGV, Some(0), H::None), SignalCause::NullDereference);
        assert_eq!(SignalCause::classify(libc::SIGSEGV, Some(0x7fff_0000), H::None), SignalCause::InvalidAccess);
        assert_eq!(
            SignalCause::classify(libc::SIGSEGV, Some(0x7fff_0000), H::StackOverflow),
            SignalCause::StackOverflow
        );
        assert_eq!(SignalCause::classify(libc::SIGABRT, None, H::None), SignalCause::Abort);
        assert_eq!(SignalCause::classify(libc::SIGKILL, None, H::None), SignalCause::Killed);
        assert_eq!(SignalCause::classify(libc::SIGFPE, None, H::None), SignalCause::Arithmetic);
        assert_eq!(SignalCause::classify(libc::SIGSYS, Some(101), H::SyscallRefused), SignalCause::SandboxRefused);
        assert_eq!(SignalCause::classify(libc::SIGSYS, None, H::None), SignalCause::Other);
    }

    #[test]
    fn names_a_refused_system_call() {
        let kind = FaultKind::Signal {
            signo: libc::SIGSYS,
            cause: SignalCause::SandboxRefused,
            addr: Some(libc::SYS_ptrace as u64),
        };
        assert_eq!(kind.cause(), "system call refused by the sandbox (SIGSYS: ptrace, system call 101)");
    }

    #[test]
    fn resource_hints_name_the_exhausted_resource_whatever_the_signal() {
        use DomainHint as H;
        assert_eq!(SignalCause::classify(libc::SIGSEGV, Some(0), H::MemoryExhausted), SignalCause::OutOfMemory);
        assert_eq!(SignalCause::classify(libc::SIGABRT, None, H::MemoryExhausted), SignalCause::OutOfMemory);
        assert_eq!(SignalCause::classify(libc::SIGABRT, None, H::DescriptorsExhausted), SignalCause::OutOfDescriptors);
        // A stack overflow is a SIGSEGV's own story; an uncatchable SIGKILL came from outside.
        assert_eq!(SignalCause::classify(libc::SIGABRT, None, H::StackOverflow), SignalCause::Abort);
        assert_eq!(SignalCause::classify(libc::SIGKILL, None, H::MemoryExhausted), SignalCause::Killed);
    }

    #[test]
    fn describes_a_fault_with_its_call() {
        let f = Fault {
            kind: FaultKind::Signal { signo: libc::SIGSEGV, cause: SignalCause::NullDereference, addr: Some(0) },
            domain: "faulty".into(),
            call: Some("faulty_compute".into()),
            incarnation: 1,
        };
        assert_eq!(
            f.to_string(),
            "null dereference (SIGSEGV at 0x0) in call faulty_compute (domain faulty, incarnation 1)"
        );
        assert_eq!(f.kind_name(), "signal");
    }
}
