//! The serving process of a domain (an incarnation): starting a `ward-domain` process, learning how an incarnation
//! ended (from its parent's status and the fault record it left), and watching the CPU it uses between calls.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use ward_xpc::layout::fault_hint;

use super::lending::{self, lock};
use super::monitor::{DeathWatch, PeriodicGuard, WatchGuard};
use super::{cgroup, idle_cpu, spawn, ProcessBackend};
use crate::backend::BackendError;
use crate::fault::{DomainHint, FaultKind, SignalCause};

/// Where an incarnation's exit status comes from.
pub(super) enum Parent {
    /// Forked by the zygote, which reports `exit ...` on its control socket.
    Zygote,
    /// Spawned by us.
    Us(spawn::DomainChild),
}

/// The live serving process and what the host keeps of it.
pub(super) struct Incarnation {
    /// Its id in this process's PID namespace (from its pidfd: the one it has in its own means nothing here).
    pub(super) pid: i32,
    // Field order matters: the watch must be removed before the pidfd closes.
    pub(super) _watch: WatchGuard,
    /// The check of the CPU it uses between calls (policy `idle_cpu_ms`), if on.
    pub(super) _idle_cpu: Option<PeriodicGuard>,
    pub(super) pidfd: Arc<OwnedFd>,
    pub(super) death: Arc<DeathWatch>,
    pub(super) parent: Parent,
    /// Set once we know how it ended.
    pub(super) ended: Option<FaultKind>,
    /// The one processor it may run on, once a caller has moved it there (handing over).
    pub(super) cpu: Option<usize>,
    /// The processors it could run on before the first move, to give back when calls go back to spinning.
    pub(super) spread: Option<Vec<usize>>,
    /// The arena blocks it holds, and its control socket to lend more (with an arena).
    pub(super) lending: Option<lending::Lending>,
}

/// Why a domain process could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LaunchError {
    #[error("cannot duplicate the shared memory descriptors")]
    Descriptors(#[source] std::io::Error),
    /// The monitor thread, which starts every domain process, could not run the start.
    #[error(transparent)]
    MonitorThread(std::io::Error),
    #[error(transparent)]
    Spawn(#[from] spawn::SpawnError),
}

/// How a process ended, as its parent saw it.
pub(super) enum Ended {
    Signal(i32),
    Code(i32),
}

impl ProcessBackend {
    /// Start a `ward-domain` process as `role` with the domain's extensions, sandbox and shared memory (on the
    /// monitor thread), and wait until it is ready.
    pub(super) fn launch(&self, role: spawn::Role) -> Result<spawn::Started, LaunchError> {
        let program = self.cfg.program.clone();
        let limits = self.cfg.limits.clone();
        let mut sandbox = self.cfg.sandbox.clone();
        sandbox.extend(self.cgroup.iter().flat_map(cgroup::Cgroup::domain_args));
        let extensions = self.cfg.extensions.clone();
        let spin = self.cfg.spin;
        let preload = self.cfg.preload.clone();
        let read_past = self.cfg.read_past;
        let arena = self.arena;
        let fds = {
            let pools = lock(&self.pools);
            (
                self.region.memory().fd().try_clone_to_owned(),
                // Read-only: the domain maps the input pool read-only, and cannot map it otherwise either. Without
                // /proc (`sandbox::missing` says so) it gets the read-write descriptor.
                pools
                    .input
                    .memory()
                    .read_only_fd()
                    .ok()
                    .map_or_else(|| pools.input.memory().fd().try_clone_to_owned(), Ok),
                pools.output.memory().fd().try_clone_to_owned(),
            )
        };
        let (region, pool_in, pool_out) = match fds {
            (Ok(a), Ok(b), Ok(c)) => (a, b, c),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Err(LaunchError::Descriptors(e)),
        };
        let started = self
            .monitor
            .on_thread(move || {
                spawn::spawn(&spawn::Launch {
                    program: &program,
                    role,
                    spin,
                    limits: &limits,
                    sandbox: &sandbox,
                    extensions: &extensions,
                    region: region.as_fd(),
                    pool_in: pool_in.as_fd(),
                    pool_out: pool_out.as_fd(),
                    arena,
                    read_past,
                    preload: preload.as_ref(),
                })
            })
            .map_err(LaunchError::MonitorThread)??;
        if let Some(without) = &started.without {
            // The machine's probe (`sandbox::missing`) is said once as an event; a domain that found otherwise says
            // so here, once per process.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!("a process domain runs without part of its sandbox: {without}");
            }
        }
        Ok(started)
    }

    /// How the live incarnation ended (it has ended). Asks its parent for the status, reads the fault record.
    pub(super) fn collect_death(&mut self) -> FaultKind {
        let Some(live) = self.live.as_mut() else {
            return FaultKind::Vanished;
        };
        if let Some(k) = &live.ended {
            return k.clone();
        }
        let status = match &mut live.parent {
            Parent::Us(child) => match child.wait() {
                Ok(s) => {
                    use std::os::unix::process::ExitStatusExt;
                    match (s.signal(), s.code()) {
                        (Some(sig), _) => Some(Ended::Signal(sig)),
                        (None, Some(code)) => Some(Ended::Code(code)),
                        _ => None,
                    }
                }
                Err(_) => None,
            },
            Parent::Zygote => self.exit_from_zygote(),
        };
        let record = self.region.read_fault_record();
        let kind = match status {
            Some(Ended::Signal(sig)) => {
                // The record comes from the process that just failed: use it only when it agrees with the signal
                // its parent saw.
                let trusted = record.valid == 1 && record.signo == sig;
                let addr = trusted.then_some(record.addr);
                let hint = match record.hint {
                    _ if !trusted => DomainHint::None,
                    fault_hint::STACK_OVERFLOW => DomainHint::StackOverflow,
                    fault_hint::MEMORY_EXHAUSTED => DomainHint::MemoryExhausted,
                    fault_hint::DESCRIPTORS_EXHAUSTED => DomainHint::DescriptorsExhausted,
                    fault_hint::SYSCALL_REFUSED => DomainHint::SyscallRefused,
                    _ => DomainHint::None,
                };
                FaultKind::Signal { signo: sig, cause: SignalCause::classify(sig, addr, hint), addr }
            }
            Some(Ended::Code(code)) => FaultKind::Exited { status: code },
            None => FaultKind::Vanished,
        };
        // SIGKILL comes from outside: the monitor (CPU between calls), or the kernel's OOM killer (the cgroup's
        // memory limit), each of which says so. The OOM killer may pick the zygote instead (memfd pages written
        // without a mapping count towards no process), and then nothing says how the incarnation ended.
        let killed = matches!(kind, FaultKind::Signal { signo: libc::SIGKILL, .. });
        let oom = self.cgroup.as_mut().and_then(cgroup::Cgroup::oom_killed);
        let blamed = self.live.as_ref().and_then(|l| l.death.blamed());
        let kind = match (killed, blamed, oom) {
            (true, Some(blamed), _) => blamed,
            (true, None, Some(limit_mb)) => FaultKind::MemoryLimit { limit_mb },
            (false, _, Some(limit_mb)) if kind == FaultKind::Vanished => FaultKind::MemoryLimit { limit_mb },
            _ => kind,
        };
        if let Some(live) = self.live.as_mut() {
            live.ended = Some(kind.clone());
        }
        kind
    }

    pub(super) fn live_is_dead(&self) -> bool {
        self.live.as_ref().is_none_or(|l| l.death.is_dead())
    }

    pub(super) fn fault_if_dead(&mut self) -> Result<(), BackendError> {
        if self.live_is_dead() {
            return Err(BackendError::Fault(self.collect_death()));
        }
        Ok(())
    }

    /// Check, on the monitor thread, the CPU incarnation `pid` uses between calls (`idle_cpu`): past the policy's
    /// budget it is killed, and its death reported as that fault.
    pub(super) fn watch_idle_cpu(
        &self,
        pid: i32,
        pidfd: &Arc<OwnedFd>,
        death: &Arc<DeathWatch>,
    ) -> Option<PeriodicGuard> {
        let budget = self.cfg.limits.idle_cpu_ms;
        if budget == 0 {
            return None;
        }
        let mut check = idle_cpu::IdleCpu::new(pid, budget);
        let activity = self.activity.clone();
        let (pidfd, death) = (pidfd.clone(), death.clone());
        Some(self.monitor.every(move |now| {
            if death.is_dead() || death.blamed().is_some() {
                return;
            }
            if let Some(fault) = check.sample(now, &activity) {
                tracing::warn!(pid, "{}: killing the domain", fault.cause());
                death.blame(fault);
                spawn::kill(pidfd.as_fd());
            }
        }))
    }
}
