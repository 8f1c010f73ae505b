//! The `process` backend (DD/OS, NewtOS): extensions run in a `ward-domain` process with their own libc; calls
//! cross shared-memory rings, buffers cross in shared pools addressed by rich pointers.
//!
//! Per domain there is one shared region (two rings) and two pools, created once and kept across incarnations:
//! the input pool is read-only in the domain, so after a crash the host still holds intact inputs; every lent
//! buffer ends at a guard page. A warm zygote (loaded and initialised, never serving) forks each incarnation; when
//! the zygote is disabled or gone, a fresh process is spawned instead.
//!
//! Nothing the domain writes is trusted: replies are copied out of the ring and parsed into a private copy, a
//! reply whose id is not the innermost call in flight is a protocol violation, and so is a malformed record.

pub(crate) mod cgroup;
mod idle_cpu;
mod lending;
mod pace;
#[allow(unsafe_code)]
mod spawn;

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smallvec::SmallVec;

use ward_abi::{RegArgs, RegRet};
use ward_xpc::arena::{self, BlockRef, POOL_ARENA};
use ward_xpc::batch::BatchWriter;
use ward_xpc::control::{ControlSocket, LoadRequest};
use ward_xpc::layout::{fault_hint, DEFAULT_RING_CAPACITY};
use ward_xpc::pool::{HostPool, Lease, PoolGeometry, POOL_IN, POOL_OUT};
use ward_xpc::ring::{Consumer, Producer, RingError, WaitOutcome, MAX_RECORD};
use ward_xpc::wire::{emit_call, ArgKind, ArgList, Message, RetKind, Status, WireArg};
use ward_xpc::{Deadline, Region};

pub(crate) use pace::{short_gap, Mode as PaceMode, Pacing};
pub(crate) use spawn::find_program;

use super::{
    Added, Backend, BackendError, Callable, ExtensionSpec, Frame, Loan, Refused, Ring, StartError, Step, WireValue,
};
use crate::call::RetType;
use crate::events::RestartVia;
use crate::fault::{DomainHint, FaultKind, SignalCause};
use crate::monitor::{DeathWatch, Monitor, PeriodicGuard, WatchGuard};
use crate::placement;
use crate::policy::Limits;
use crate::tracker::{ResourceKind, Tracker};

/// How long to wait for a domain's answer to a resolve request.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a killed process may take to be gone.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
/// Deferred records are published at least this often, so a long batch keeps the domain busy.
const DEFER_BATCH: u32 = 64;
/// Handing over, how many times the caller yields its processor to the domain before it sleeps for the reply. A
/// domain that runs there takes it at the first and gives it back when it sleeps after the reply; the rest cover
/// a domain that is preempted or (its move refused) runs elsewhere, for a few tens of microseconds at most.
const HAND_OVER_YIELDS: u32 = 64;
/// Buffers in the host's arena at least this large are lent in place; smaller ones cost less to copy than the
/// domain's two protection changes.
const LEND_IN_PLACE_MIN: usize = 64 << 10;
/// Room for why a domain could not load an extension (dlerror's message, an init function's result).
const LOAD_REASON_LEN: usize = 1024;

pub(crate) struct ProcessConfig {
    pub program: PathBuf,
    pub extensions: Vec<ExtensionSpec>,
    pub limits: Limits,
    /// The domain's sandbox, as `ward-domain` flags.
    pub sandbox: Vec<std::ffi::OsString>,
    pub spin: u32,
    /// Spin on two processors, hand the caller's processor over for each call, or choose from the calls (`pace`).
    pub pacing: Pacing,
    pub zygote: bool,
    /// How long the zygote may take to answer (a fork request, how an incarnation ended) before it is a fault: the
    /// policy's deadline.
    pub deadline: Duration,
    /// A run-time library fault to preload into every incarnation (policy `library_fault`).
    pub preload: Option<crate::libfault::Preload>,
    /// Bytes of zeros after every input in the domain (policy `read_past_input_kb`, in whole pages).
    pub read_past: usize,
}

struct Pools {
    input: HostPool,
    output: HostPool,
}

type SharedPools = Arc<Mutex<Pools>>;

fn lock(pools: &SharedPools) -> std::sync::MutexGuard<'_, Pools> {
    pools.lock().unwrap_or_else(|e| e.into_inner())
}

struct Zygote {
    /// The process this side started (outside the zygote's PID namespace): its status is the zygote's.
    child: spawn::DomainChild,
    /// The zygote proper (in its namespace): its id here, and its pidfd.
    pid: i32,
    pidfd: OwnedFd,
    control: ControlSocket,
    /// How the last incarnation ended, when the zygote said so while the host waited for another answer.
    exit_said: Option<String>,
}

/// Where an incarnation's exit status comes from.
enum Parent {
    /// Forked by the zygote, which reports `exit ...` on its control socket.
    Zygote,
    /// Spawned by us.
    Us(spawn::DomainChild),
}

struct Incarnation {
    /// Its id in this process's PID namespace (from its pidfd: the one it has in its own means nothing here).
    pid: i32,
    // Field order matters: the watch must be removed before the pidfd closes.
    _watch: WatchGuard,
    /// The check of the CPU it uses between calls (policy `idle_cpu_ms`), if on.
    _idle_cpu: Option<PeriodicGuard>,
    pidfd: Arc<OwnedFd>,
    death: Arc<DeathWatch>,
    parent: Parent,
    /// Set once we know how it ended.
    ended: Option<FaultKind>,
    /// The one processor it may run on, once a caller has moved it there (handing over).
    cpu: Option<usize>,
    /// The processors it could run on before the first move, to give back when calls go back to spinning.
    spread: Option<Vec<usize>>,
    /// The arena blocks it holds, and its control socket to lend more (with an arena).
    lending: Option<lending::Lending>,
}

pub(crate) struct ProcessBackend {
    cfg: ProcessConfig,
    monitor: Arc<Monitor>,
    region: Region,
    requests: Producer,
    replies: Consumer,
    pools: SharedPools,
    zygote: Option<Zygote>,
    live: Option<Incarnation>,
    next_id: u64,
    /// Ids of calls sent and not answered, innermost last (calls nest strictly).
    in_flight: Vec<u64>,
    deferred_unpublished: u32,
    /// Scalar deferred calls not yet on the ring: they go in one batch record (one domain crossing).
    batch: BatchWriter,
    record: Box<[u8]>,
    /// The host has an arena: buffers in its blocks are lent in place, each block's descriptor sent to the domain
    /// the first time.
    arena: bool,
    /// Arena pages lent to calls in flight, as `[first, end)` of wire references (`BlockRef::to_wire`): one range is
    /// never lent twice at once (the domain would take it back when the inner call ends).
    in_place_pages: Vec<(u64, u64)>,
    /// Buffers lent in place so far.
    lent_in_place: u64,
    /// Callbacks handed to the core by `wait` and not yet answered: what is sent meanwhile is made from inside one
    /// of them, and marked nested so the domain runs it at once.
    callbacks_open: u32,
    /// How this side and the domain wait for each other now.
    pace: pace::Pace,
    /// The domain could not be moved to its caller's processor once: it is not tried again.
    cannot_move: bool,
    /// Whether the calling thread is held on its processor while it waits, handing over.
    stay: pace::Stay,
    /// Callbacks of deferred calls that came while the host waited for something that cannot serve them (a
    /// resolve, a heartbeat): handed out by the next `wait`, on the thread that makes calls.
    stashed: VecDeque<(u64, usize, RegArgs)>,
    /// Zygotes that failed and were killed, with how, for the core to report (`take_zygote_failures`).
    zygote_failures: Vec<FaultKind>,
    /// Whether a call is in the domain, for the check of the CPU it uses between calls.
    activity: Arc<idle_cpu::Activity>,
    /// The domain's cgroup (zygote and incarnations), where the machine gives one; dropped after the processes.
    cgroup: Option<cgroup::Cgroup>,
}

impl ProcessBackend {
    pub fn start(cfg: ProcessConfig, monitor: Arc<Monitor>, tracker: &mut Tracker) -> Result<ProcessBackend, String> {
        let region = Region::create(DEFAULT_RING_CAPACITY).map_err(|e| format!("cannot create the rings: {e}"))?;
        let geometry = PoolGeometry::standard(cfg.read_past).map_err(|e| format!("bad pool geometry: {e}"))?;
        let input =
            HostPool::create(POOL_IN, geometry.clone()).map_err(|e| format!("cannot create the input pool: {e}"))?;
        let output = HostPool::create(POOL_OUT, geometry).map_err(|e| format!("cannot create the output pool: {e}"))?;
        let (requests, replies) = region.host_endpoints();
        let pacing = cfg.pacing;
        let cgroup = match cgroup::Cgroup::create(&cfg.limits) {
            Ok(group) => Some(group),
            // Said once as a missing protection (`sandbox::missing`); the rlimits still hold.
            Err(e) if cgroup::probe().iter().any(|(what, _)| *what == "cgroup") => {
                tracing::debug!(error = %e, "the domain runs without a cgroup");
                None
            }
            Err(e) => return Err(format!("cannot create the domain's cgroup: {e}")),
        };
        let mut b = ProcessBackend {
            cfg,
            monitor,
            region,
            requests,
            replies,
            pools: Arc::new(Mutex::new(Pools { input, output })),
            zygote: None,
            live: None,
            next_id: 1,
            in_flight: Vec::new(),
            deferred_unpublished: 0,
            batch: BatchWriter::new(),
            record: vec![0u8; MAX_RECORD].into_boxed_slice(),
            arena: arena::host::enabled(),
            in_place_pages: Vec::new(),
            lent_in_place: 0,
            callbacks_open: 0,
            pace: pace::Pace::new(pacing),
            cannot_move: false,
            stay: pace::Stay::default(),
            stashed: VecDeque::new(),
            zygote_failures: Vec::new(),
            activity: Arc::new(idle_cpu::Activity::default()),
            cgroup,
        };
        b.start_incarnation(tracker)?;
        Ok(b)
    }

    /// The live incarnation's process id (for tests and diagnostics).
    fn launch(&self, mode: spawn::Mode) -> Result<spawn::Started, String> {
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
            _ => return Err("cannot duplicate the shared memory descriptors".into()),
        };
        let started = self
            .monitor
            .on_thread(move || {
                spawn::spawn(&spawn::Launch {
                    program: &program,
                    mode,
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
            .map_err(|e| e.to_string())??;
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

    fn kill_zygote(&mut self) {
        if let Some(mut z) = self.zygote.take() {
            // Once the zygote's status is in, every process of its namespace has ended: its incarnations too.
            let _ = z.child.end(z.pidfd.as_fd(), KILL_TIMEOUT);
        }
    }

    fn zygote_alive(&self) -> bool {
        self.zygote.as_ref().is_some_and(|z| !spawn::wait_dead(z.pidfd.as_fd(), Duration::ZERO))
    }

    /// The zygote failed (`how`): kill and reap it, and keep `how` for the core to report. The next restart starts
    /// a new one. A stopped zygote is killed too (SIGKILL ends a stopped process), and so is any incarnation it
    /// forked meanwhile (incarnations die with their zygote, `PR_SET_PDEATHSIG`).
    fn zygote_failed(&mut self, how: FaultKind) {
        if self.zygote.is_some() {
            self.kill_zygote();
            self.zygote_failures.push(how);
        }
    }

    /// The zygote did not give the answer it was asked for: it is dead (`Vanished`), or else it did not answer
    /// within the deadline.
    fn zygote_silent(&self) -> FaultKind {
        if self.zygote.is_some() && !self.zygote_alive() {
            FaultKind::Vanished
        } else {
            FaultKind::Timeout { deadline: self.cfg.deadline }
        }
    }

    /// Fork an incarnation from the zygote (starting one if needed): its pid, pidfd, and (with an arena) its
    /// control socket, whose other end goes with the fork request. A zygote that does not answer within the
    /// policy's deadline, or answers something else, failed: it is killed (`zygote_failed`) and this fails.
    fn fork_from_zygote(&mut self) -> Result<(i32, OwnedFd, Option<ControlSocket>), String> {
        if self.zygote.is_some() && !self.zygote_alive() {
            // It died since the last fork (nothing of ours kills a zygote without dropping it).
            self.zygote_failed(FaultKind::Vanished);
        }
        if self.zygote.is_none() {
            let started = self.launch(spawn::Mode::Zygote)?;
            self.zygote = Some(Zygote {
                child: started.child,
                pid: started.pid,
                pidfd: started.pidfd,
                control: started.control,
                exit_said: None,
            });
        }
        let deadline = self.cfg.deadline;
        let z = self.zygote.as_ref().ok_or("no zygote")?;
        let channel = match self.arena {
            true => Some(ControlSocket::pair().map_err(|e| format!("cannot create a control socket: {e}"))?),
            false => None,
        };
        let (ours, theirs) = match channel {
            Some((ours, theirs)) => (Some(ours), Some(theirs)),
            None => (None, None),
        };
        let answer = match z.control.send("fork", theirs.as_ref().map(|t| t.as_fd())) {
            Ok(()) => z.control.recv(Some(deadline)),
            Err(e) => Err(e),
        };
        let how = match answer {
            // The pid in the text is the zygote's namespace's: the pidfd says which process it is here.
            Ok(Some(m)) => match (m.text.starts_with("forked "), m.fd) {
                (true, Some(fd)) => match spawn::incarnation_of(fd.as_fd(), z.pid) {
                    Ok(pid) => return Ok((pid, fd, ours)),
                    Err(why) => FaultKind::Protocol { what: format!("it answered a fork request, but {why}") },
                },
                _ => FaultKind::Protocol { what: format!("it answered a fork request with `{}`", m.text) },
            },
            Ok(None) => self.zygote_silent(),
            Err(e) => FaultKind::Protocol { what: format!("its control socket failed: {e}") },
        };
        let why = format!("the zygote failed a fork request: {}", how.cause());
        self.zygote_failed(how);
        Err(why)
    }

    /// How the incarnation the zygote forked ended, as the zygote reports it (`exit code N`, `exit signal N`). A
    /// zygote that does not say so within the policy's deadline, or says something else, failed: it is killed
    /// (`zygote_failed`), and nothing says how the incarnation ended.
    fn exit_from_zygote(&mut self) -> Option<Ended> {
        let deadline = self.cfg.deadline;
        let z = self.zygote.as_mut()?;
        let text = match z.exit_said.take() {
            Some(text) => text,
            None => match z.control.recv(Some(deadline)) {
                Ok(Some(m)) => m.text,
                Ok(None) => {
                    let how = self.zygote_silent();
                    self.zygote_failed(how);
                    return None;
                }
                Err(e) => {
                    self.zygote_failed(FaultKind::Protocol { what: format!("its control socket failed: {e}") });
                    return None;
                }
            },
        };
        let Some(rest) = text.strip_prefix("exit ") else {
            self.zygote_failed(FaultKind::Protocol {
                what: format!("it answered `{text}` where it was to say how an incarnation ended"),
            });
            return None;
        };
        // `exit unknown`: the zygote could not learn the status either.
        if let Some(n) = rest.strip_prefix("signal ") {
            return n.parse().ok().map(Ended::Signal);
        }
        rest.strip_prefix("code ")?.parse().ok().map(Ended::Code)
    }

    /// Ask the zygote to load one more extension. Ok(true): it has it; Ok(false): the zygote answered out of turn
    /// and was stopped (the next one is started with the whole set); Err: the extension is refused.
    fn zygote_load(&mut self, request: &str) -> Result<bool, Refused> {
        let refused = |reason: String| Refused { reason, restart: false };
        let Some(z) = self.zygote.as_ref() else {
            return Ok(false);
        };
        if z.control.send(request, None).is_err() {
            self.kill_zygote();
            return Ok(false);
        }
        let deadline = std::time::Instant::now() + spawn::START_TIMEOUT;
        let answer = loop {
            let Some(z) = self.zygote.as_mut() else {
                return Ok(false);
            };
            let answer = z.control.recv(Some(deadline.saturating_duration_since(std::time::Instant::now())));
            match answer {
                // The running incarnation ended meanwhile: its status is for collect_death.
                Ok(Some(m)) if m.text.starts_with("exit ") => z.exit_said = Some(m.text),
                other => break other,
            }
        };
        let expected = self.cfg.extensions.len();
        match answer {
            Ok(Some(m)) if m.text.strip_prefix("loaded ").and_then(|n| n.parse::<usize>().ok()) == Some(expected) => {
                Ok(true)
            }
            Ok(Some(m)) => match m.text.strip_prefix("error ") {
                Some(reason) => Err(refused(reason.to_string())),
                None => {
                    self.kill_zygote();
                    Ok(false)
                }
            },
            // The zygote closed its end (it is dying) or did not answer in time: the extension's constructors or
            // init function killed or hung it.
            other => {
                let closed = matches!(other, Ok(None)) && std::time::Instant::now() < deadline;
                let status = match self.zygote.as_mut() {
                    Some(z) if closed && spawn::wait_dead(z.pidfd.as_fd(), KILL_TIMEOUT) => z.child.wait().ok(),
                    _ => None,
                };
                self.kill_zygote();
                Err(refused(match status {
                    Some(s) => format!("the domain's process died loading it ({s})"),
                    None => format!("loading it did not finish within {} s", spawn::START_TIMEOUT.as_secs()),
                }))
            }
        }
    }

    /// Load one more extension into the running incarnation.
    fn load_live(&mut self, tracker: &mut Tracker, spec: &ExtensionSpec) -> Result<(), Refused> {
        let lost = |reason: String| Refused { reason, restart: true };
        let refused = |reason: String| Refused { reason, restart: false };
        let path = spec.path.to_str().ok_or_else(|| refused("its path is not UTF-8".into()))?;
        let init = spec.init.as_deref().unwrap_or("");
        let loan = self
            .lend(tracker, POOL_OUT, None, LOAD_REASON_LEN, true)
            .map_err(|e| refused(format!("cannot lend a buffer for the answer: {e:?}")))?;
        let outcome = self.send_load(path.as_bytes(), init.as_bytes(), spec.poison, loan.rich);
        let answer = match outcome {
            Ok((Status::Ok, ret)) if ret.int == self.cfg.extensions.len() as u64 => Ok(()),
            Ok((Status::Ok, ret)) => Err(lost(format!(
                "the domain loaded it as extension {} where the host expected {}",
                ret.int,
                self.cfg.extensions.len()
            ))),
            Ok((_, ret)) => {
                let mut reason = vec![0u8; (ret.int as usize).min(LOAD_REASON_LEN)];
                let read = lock(&self.pools).output.memory().read_at(loan.rich.offset as usize, &mut reason);
                Err(refused(match read {
                    Ok(()) if !reason.is_empty() => String::from_utf8_lossy(&reason).into_owned(),
                    _ => "the domain could not load it and gave no reason".into(),
                }))
            }
            Err(BackendError::Fault(kind)) => Err(lost(format!("the domain failed loading it: {}", kind.cause()))),
            Err(BackendError::TimedOut) => {
                Err(lost(format!("loading it did not finish within {} s", spawn::START_TIMEOUT.as_secs())))
            }
            Err(BackendError::Usage(what)) => Err(refused(what)),
            Err(BackendError::UnknownSymbol) => Err(lost("the domain answered a load as a resolve".into())),
            // Only an mpk domain is closed under a call.
            Err(BackendError::Closed) => Err(lost("the domain was closed while loading it".into())),
        };
        if let Some(record) = loan.record {
            tracker.release(record);
        }
        answer
    }

    /// Send a request that is not a call (a resolve, a ping, a load) and wait for its reply, keeping callbacks of
    /// deferred calls that come first for the next `wait`. `message` makes the record from the request's id.
    fn request<'m>(
        &mut self,
        message: impl FnOnce(u64) -> Message<'m>,
        deadline: &mut Deadline,
    ) -> Result<(u64, Status, RegRet), BackendError> {
        self.fault_if_dead()?;
        self.close_batch()?;
        let id = self.next_id;
        self.next_id += 1;
        self.pace_request();
        let len = self.encode(&message(id))?;
        self.push(len)?;
        self.publish_request();
        self.in_flight.push(id);
        self.next_reply(deadline)
    }

    /// Send a Load request and wait for its reply: the status and what it returned.
    fn send_load(
        &mut self,
        path: &[u8],
        init: &[u8],
        poison: bool,
        reason: ward_xpc::RichPtr,
    ) -> Result<(Status, RegRet), BackendError> {
        let load = |id| Message::Load { id, poison, path, init, reason: (reason.offset, reason.len) };
        // Loading runs the extension's constructors.
        self.activity.began();
        let (id, status, ret) = self.request(load, &mut Deadline::after(spawn::START_TIMEOUT))?;
        if status == Status::LoadFailed {
            // Answered, and not a status check_reply knows: pop it here.
            if self.in_flight.last() != Some(&id) {
                return Err(protocol(format!("reply for call {id:#x}, which is not in flight")));
            }
            self.in_flight.pop();
            if self.in_flight.is_empty() {
                self.activity.settled();
            }
            return Ok((status, ret));
        }
        self.check_reply(id, status)?;
        Ok((status, ret))
    }

    /// How the live incarnation ended (it has ended). Asks its parent for the status, reads the fault record.
    fn collect_death(&mut self) -> FaultKind {
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

    fn live_is_dead(&self) -> bool {
        self.live.as_ref().is_none_or(|l| l.death.is_dead())
    }

    fn fault_if_dead(&mut self) -> Result<(), BackendError> {
        if self.live_is_dead() {
            return Err(BackendError::Fault(self.collect_death()));
        }
        Ok(())
    }

    /// A request the caller will wait for is about to go out: choose how the two sides wait for it (`pace`) and
    /// place the domain to match. Before the record is made, which says how the domain is to wait after it.
    fn pace_request(&mut self) {
        let before = self.pace.mode();
        match self.pace.call(std::time::Instant::now) {
            PaceMode::HandOver => self.move_to_caller(),
            PaceMode::Spin if before == PaceMode::HandOver => self.release_domain(),
            PaceMode::Spin => {}
        }
    }

    /// Publish a request the caller will wait for, telling `pace` whether the domain had to be woken for it.
    fn publish_request(&mut self) {
        let woke = self.requests.publish();
        self.pace.published(woke, std::time::Instant::now);
    }

    /// Move the domain to the calling thread's processor, so the wake-up and the reply's are hand-overs on one
    /// processor (`crate::placement`). Only when the processor changed.
    fn move_to_caller(&mut self) {
        if self.cannot_move {
            return;
        }
        let (Some(live), Some(cpu)) = (self.live.as_mut(), placement::current_cpu()) else {
            return;
        };
        if live.cpu == Some(cpu) {
            return;
        }
        if live.spread.is_none() {
            live.spread = placement::affinity(live.pid).ok();
        }
        match placement::pin(live.pid, cpu) {
            Ok(()) => live.cpu = Some(cpu),
            // Gone: the wait that follows finds out why.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => {
                // A processor set that forbids it (a cgroup's, say). Sleeping at once still holds for `sleep`; an
                // adaptive wait goes back to spinning, which pays off without a move.
                tracing::warn!(error = %e, "cannot move the domain to its caller's processor; it stays where the \
                    scheduler puts it");
                self.cannot_move = true;
                if matches!(self.cfg.pacing, Pacing::Learned { .. }) {
                    self.pace.fix(PaceMode::Spin);
                }
            }
        }
    }

    /// Let the domain run where it could before it was first moved (where this thread may, if that was not read).
    fn release_domain(&mut self) {
        let Some(live) = self.live.as_mut() else { return };
        if live.cpu.take().is_none() {
            return;
        }
        let Some(spread) = live.spread.clone().or_else(|| placement::affinity(0).ok()) else { return };
        if let Err(e) = placement::confine(live.pid, &spread) {
            tracing::debug!(error = %e, "cannot give the domain back its processors");
        }
    }

    /// Push one record; if the ring is full, publish and wait for the domain to make room.
    fn push(&mut self, len: usize) -> Result<(), BackendError> {
        if self.callbacks_open > 0 {
            ward_xpc::wire::mark_nested(&mut self.record[..len]);
        }
        if self.pace.mode() == PaceMode::HandOver {
            ward_xpc::wire::mark_hand_over(&mut self.record[..len]);
        }
        loop {
            match self.requests.push(&self.record[..len]) {
                Ok(()) => return Ok(()),
                Err(RingError::Full) => {
                    self.requests.publish();
                    self.fault_if_dead()?;
                    std::hint::spin_loop();
                }
                Err(e) => return Err(BackendError::Fault(FaultKind::Protocol { what: format!("request ring: {e}") })),
            }
        }
    }

    fn encode(&mut self, message: &Message<'_>) -> Result<usize, BackendError> {
        message.emit(&mut self.record).map_err(|e| BackendError::Usage(format!("cannot encode the call: {e}")))
    }

    fn lend(
        &mut self,
        tracker: &mut Tracker,
        pool_id: u32,
        bytes: Option<&[u8]>,
        len: usize,
        output: bool,
    ) -> Result<Loan, BackendError> {
        let mut pools = lock(&self.pools);
        let pool = if pool_id == POOL_IN { &mut pools.input } else { &mut pools.output };
        let lease =
            pool.alloc(len).map_err(|e| BackendError::Usage(format!("cannot lend a {len}-byte buffer: {e}")))?;
        if let Some(b) = bytes {
            pool.write(&lease, b).map_err(|e| BackendError::Usage(format!("cannot fill a lent buffer: {e}")))?;
        }
        let rich = lease.rich;
        drop(pools);
        let pools = self.pools.clone();
        let record = tracker.track(ResourceKind::PoolBuffer, move || free(&pools, pool_id, lease));
        Ok(Loan { record: Some(record), pool: pool_id, rich, output })
    }

    /// Lend `bytes` in place if they lie in one block of the host's arena (and are worth it, and no call in flight
    /// has their pages): the wire argument naming them, and its loan. None: copy them through a pool instead.
    fn lend_in_place(&mut self, bytes: &[u8], kind: ArgKind, output: bool) -> Option<(WireArg, Loan)> {
        if !self.arena || bytes.len() < LEND_IN_PLACE_MIN {
            return None;
        }
        let at = arena::host::locate(bytes.as_ptr(), bytes.len())?;
        let offset = at.to_wire()?;
        let len = bytes.len() as u64;
        let pages = arena::pages_of(offset, len);
        if self.in_place_pages.iter().any(|&(a, b)| a < pages.1 && pages.0 < b) {
            return None;
        }
        // The domain gets the block's descriptor the first time (read-write only for an output).
        let in_flight = &self.in_place_pages;
        let busy = |block: u64| in_flight.iter().any(|&(first, _)| BlockRef::from_wire(first).block == block);
        let lending = self.live.as_mut()?.lending.as_mut()?;
        if !lending.ensure(at.block, output, busy) {
            return None;
        }
        self.in_place_pages.push(pages);
        self.lent_in_place += 1;
        let rich = ward_xpc::RichPtr { pool: POOL_ARENA, offset, len };
        let wire = WireArg { kind, pool: POOL_ARENA, a: offset, b: len };
        Some((wire, Loan { record: None, pool: POOL_ARENA, rich, output }))
    }

    /// A loan ended (its call returned or was abandoned): its arena pages may be lent again.
    fn unlend(&mut self, loan: &Loan) {
        if loan.pool == POOL_ARENA {
            let pages = arena::pages_of(loan.rich.offset, loan.rich.len);
            if let Some(i) = self.in_place_pages.iter().position(|&p| p == pages) {
                self.in_place_pages.swap_remove(i);
            }
        }
    }

    fn wire_args(
        &mut self,
        tracker: &mut Tracker,
        args: &[WireValue<'_>],
        loans: &mut Vec<Loan>,
    ) -> Result<SmallVec<[WireArg; 6]>, BackendError> {
        if args.len() > ward_xpc::wire::MAX_ARGS {
            return Err(BackendError::Usage("too many arguments (at most 14)".into()));
        }
        let mut list = SmallVec::new();
        for a in args {
            if let Some(scalar) = scalar_wire(a) {
                list.push(scalar);
                continue;
            }
            let in_place = match a {
                WireValue::In(b) => self.lend_in_place(b, ArgKind::BufIn, false),
                WireValue::Scratch(b) => self.lend_in_place(b, ArgKind::BufScratch, false),
                WireValue::InOut(b) => self.lend_in_place(b, ArgKind::BufInOut, true),
                _ => None,
            };
            if let Some((wire, loan)) = in_place {
                loans.push(loan);
                list.push(wire);
                continue;
            }
            let wire = match a {
                WireValue::Int(_) | WireValue::F64(_) | WireValue::F32(_) | WireValue::Callback(_) => continue,
                WireValue::In(b) | WireValue::Str(b) => {
                    let loan = self.lend(tracker, POOL_IN, Some(b), b.len(), false)?;
                    let kind = if matches!(a, WireValue::Str(_)) { ArgKind::Str } else { ArgKind::BufIn };
                    let w = WireArg { kind, pool: loan.pool, a: loan.rich.offset, b: loan.rich.len };
                    loans.push(loan);
                    w
                }
                WireValue::Out(out) => {
                    let loan = self.lend(tracker, POOL_OUT, None, out.len(), true)?;
                    let w = WireArg { kind: ArgKind::BufOut, pool: loan.pool, a: loan.rich.offset, b: loan.rich.len };
                    loans.push(loan);
                    w
                }
                WireValue::InOut(b) => {
                    let loan = self.lend(tracker, POOL_OUT, Some(b), b.len(), true)?;
                    let w = WireArg { kind: ArgKind::BufInOut, pool: loan.pool, a: loan.rich.offset, b: loan.rich.len };
                    loans.push(loan);
                    w
                }
                WireValue::Scratch(b) => {
                    // Writable in the domain (the output pool), ending at a guard page; not an output, so
                    // nothing comes back.
                    let loan = self.lend(tracker, POOL_OUT, Some(b), b.len(), false)?;
                    let w = WireArg { kind: ArgKind::BufInOut, pool: loan.pool, a: loan.rich.offset, b: loan.rich.len };
                    loans.push(loan);
                    w
                }
            };
            list.push(wire);
        }
        Ok(list)
    }

    /// Copy the next reply-ring record into `self.record` and parse it. Only replies and callbacks may come.
    fn next_from_domain(&mut self, deadline: &mut Deadline) -> Result<Incoming, BackendError> {
        loop {
            match self.replies.pop(&mut self.record) {
                Err(e) => return Err(protocol(format!("reply ring: {e}"))),
                Ok(Some(len)) => {
                    let message = Message::parse(&self.record[..len])
                        .map_err(|e| protocol(format!("malformed record from the domain: {e}")))?;
                    return match message {
                        Message::Reply { id, status, ret_int, ret_float } => {
                            self.pace.replied(std::time::Instant::now);
                            Ok(Incoming::Reply { id, status, ret: RegRet { int: ret_int, float: ret_float } })
                        }
                        Message::Callback { id, slot, ints, floats, .. } => {
                            Ok(Incoming::Callback { id, slot: slot as usize, regs: RegArgs { ints, floats } })
                        }
                        other => Err(protocol(format!("unexpected {} record from the domain", op_name(&other)))),
                    };
                }
                Ok(None) => {
                    self.fault_if_dead()?;
                    // Handing over, the domain runs on this processor: spinning would only keep it waiting.
                    let spin = if self.pace.mode() == PaceMode::HandOver { 0 } else { self.cfg.spin };
                    let Some(live) = &self.live else {
                        return Err(BackendError::Fault(FaultKind::Vanished));
                    };
                    let handing_over = spin == 0;
                    if handing_over {
                        // The ring is empty, as when a wait would look at the deadline: look here, or an extension
                        // that calls back at once, in a loop, would have its next callback ready after every turn.
                        if deadline.passed() && self.replies.is_empty().unwrap_or(true) {
                            return Err(BackendError::TimedOut);
                        }
                        // The domain runs on this processor: yield it, and the reply needs no wake-up, which
                        // the scheduler could deliver on another processor. Sleep only if it is slow to come.
                        let yielded = self
                            .replies
                            .yield_for(HAND_OVER_YIELDS, &|| live.death.is_dead())
                            .map_err(|e| protocol(format!("reply ring: {e}")))?;
                        if yielded.is_some() {
                            continue;
                        }
                    }
                    let held = if handing_over && self.stay.hold() {
                        placement::hold_here().unwrap_or_else(|e| {
                            tracing::debug!(error = %e, "cannot hold the caller on its processor");
                            self.stay.give_up();
                            None
                        })
                    } else {
                        None
                    };
                    // Only a caller that hands over is watched for being woken elsewhere.
                    let slept_on = handing_over.then(placement::current_cpu);
                    let outcome = self.replies.wait(spin, Some(&mut *deadline), &|| live.death.is_dead());
                    drop(held);
                    if let Some(slept_on) = slept_on {
                        self.stay.waited(slept_on != placement::current_cpu());
                    }
                    let outcome = outcome.map_err(|e| protocol(format!("reply ring: {e}")))?;
                    if outcome == WaitOutcome::TimedOut && self.replies.is_empty().unwrap_or(true) {
                        return Err(BackendError::TimedOut);
                    }
                }
            }
        }
    }

    /// The next reply, for a request that cannot serve callbacks (a resolve, a heartbeat). Callbacks of deferred
    /// calls that come first are kept for the next `wait`: the domain answers these requests while it waits for
    /// the callback's answer.
    fn next_reply(&mut self, deadline: &mut Deadline) -> Result<(u64, Status, RegRet), BackendError> {
        loop {
            match self.next_from_domain(deadline)? {
                Incoming::Reply { id, status, ret } => return Ok((id, status, ret)),
                Incoming::Callback { id, slot, regs } => self.stashed.push_back((id, slot, regs)),
            }
        }
    }

    /// Put the collected deferred calls on the ring as one batch record (not yet published). Everything else that
    /// goes on the ring closes the batch first, so calls reach the domain in the order the host made them.
    fn close_batch(&mut self) -> Result<(), BackendError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let id = self.next_id;
        self.next_id += 1;
        let len = {
            let record = self.batch.finish(id);
            self.record[..record.len()].copy_from_slice(record);
            record.len()
        };
        self.batch.clear();
        self.push(len)
    }

    /// Publish deferred records in batches, so a long run of them keeps the domain busy without a wake-up each.
    fn after_deferred_push(&mut self) {
        self.deferred_unpublished += 1;
        if self.deferred_unpublished >= DEFER_BATCH {
            self.requests.publish();
            self.deferred_unpublished = 0;
        }
    }

    /// Expect the reply to the innermost call in flight.
    fn check_reply(&mut self, id: u64, status: Status) -> Result<(), BackendError> {
        match self.in_flight.last() {
            Some(&expected) if expected == id => {
                self.in_flight.pop();
                if self.in_flight.is_empty() {
                    self.activity.settled();
                }
            }
            _ => return Err(protocol(format!("reply for call {id:#x}, which is not in flight"))),
        }
        match status {
            Status::Ok => Ok(()),
            Status::UnknownFunction => Err(protocol("the domain does not know a function it resolved".into())),
            Status::BadArgs => Err(protocol("the domain rejected arguments the host built".into())),
            Status::ResolveFailed => Err(BackendError::UnknownSymbol),
            Status::UnknownOp | Status::LoadFailed | Status::Unknown(_) => {
                Err(protocol(format!("unexpected status {status:?}")))
            }
        }
    }
}

enum Ended {
    Signal(i32),
    Code(i32),
}

enum Incoming {
    Reply { id: u64, status: Status, ret: RegRet },
    Callback { id: u64, slot: usize, regs: RegArgs },
}

/// The wire form of a scalar argument; None for buffers and strings.
fn scalar_wire(a: &WireValue<'_>) -> Option<WireArg> {
    Some(match a {
        WireValue::Int(v) => WireArg { kind: ArgKind::Int, pool: 0, a: *v, b: 0 },
        WireValue::F64(v) => WireArg { kind: ArgKind::F64, pool: 0, a: v.to_bits(), b: 0 },
        WireValue::F32(v) => WireArg { kind: ArgKind::F32, pool: 0, a: u64::from(v.to_bits()), b: 0 },
        WireValue::Callback(slot) => WireArg { kind: ArgKind::Callback, pool: 0, a: *slot as u64, b: 0 },
        WireValue::In(_) | WireValue::Out(_) | WireValue::InOut(_) | WireValue::Scratch(_) | WireValue::Str(_) => {
            return None
        }
    })
}

fn protocol(what: String) -> BackendError {
    BackendError::Fault(FaultKind::Protocol { what })
}

fn op_name(m: &Message<'_>) -> &'static str {
    match m {
        Message::Call { .. } => "call",
        Message::Reply { .. } => "reply",
        Message::Callback { .. } => "callback",
        Message::CallbackReply { .. } => "callback-reply",
        Message::Resolve { .. } => "resolve",
        Message::Ping { .. } => "ping",
        Message::Load { .. } => "load",
    }
}

fn free(pools: &SharedPools, pool_id: u32, lease: Lease) {
    let mut p = lock(pools);
    if pool_id == POOL_IN {
        p.input.free(lease);
    } else {
        p.output.free(lease);
    }
}

impl Backend for ProcessBackend {
    fn resolve(&mut self, ext: usize, symbol: &str) -> Result<Callable, BackendError> {
        let resolve = |id| Message::Resolve { id, ext: ext as u32, name: symbol.as_bytes() };
        match self.request(resolve, &mut Deadline::after(RESOLVE_TIMEOUT)) {
            Ok((id, status, ret)) => {
                self.check_reply(id, status)?;
                u32::try_from(ret.int).map(Callable::Ring).map_err(|_| protocol("function id out of range".into()))
            }
            Err(BackendError::TimedOut) => Err(BackendError::Fault(FaultKind::Timeout { deadline: RESOLVE_TIMEOUT })),
            Err(e) => Err(e),
        }
    }

    fn add_extension(&mut self, tracker: &mut Tracker, spec: ExtensionSpec) -> Result<Added, Refused> {
        let Some(request) = load_request_text(&spec) else {
            // A path the control socket cannot carry: restart with it on the command line, from a new zygote.
            self.cfg.extensions.push(spec);
            self.kill_zygote();
            return Ok(Added::NeedsRestart);
        };
        // The zygote first: loading there leaves the running incarnation alone, so an extension that fails to
        // load, or kills the process loading it, is refused while the others go on serving.
        let zygote_has_it = if self.cfg.zygote && self.zygote_alive() {
            self.zygote_load(&request)?
        } else {
            // No zygote, or a dead one: the next one is started with the whole set.
            self.kill_zygote();
            false
        };
        if self.live_is_dead() {
            // Whatever stopped it is found at the next call; the restart then brings the new extension along.
            self.cfg.extensions.push(spec);
            return Ok(Added::NeedsRestart);
        }
        match self.load_live(tracker, &spec) {
            Ok(()) => {
                self.cfg.extensions.push(spec);
                Ok(Added::InPlace)
            }
            // The zygote has it: a fresh incarnation forked from it has it too.
            Err(_) if zygote_has_it => {
                self.cfg.extensions.push(spec);
                Ok(Added::NeedsRestart)
            }
            Err(refused) => Err(refused),
        }
    }

    fn replace_image(&mut self, index: usize, path: PathBuf) {
        if let Some(spec) = self.cfg.extensions.get_mut(index) {
            spec.path = path;
            // The zygote has the old image loaded.
            self.kill_zygote();
        }
    }

    fn pid(&self) -> Option<i32> {
        self.live.as_ref().map(|l| l.pid)
    }

    fn lent_in_place(&self) -> u64 {
        self.lent_in_place
    }

    fn take_zygote_failures(&mut self) -> Vec<FaultKind> {
        std::mem::take(&mut self.zygote_failures)
    }

    fn stop(&mut self) {
        if let Some(live) = &self.live {
            if !live.death.is_dead() {
                spawn::kill(live.pidfd.as_fd());
            }
            spawn::wait_dead(live.pidfd.as_fd(), KILL_TIMEOUT);
            // Reap it and learn its status (so a zygote's `exit` message is consumed before the next fork).
            self.collect_death();
        }
        self.live = None;
        self.activity.settled();
        self.in_flight.clear();
        self.callbacks_open = 0;
        self.stashed.clear();
        self.in_place_pages.clear();
        self.deferred_unpublished = 0;
        // Queued calls name functions by this incarnation's ids: they are dropped with it (DECISIONS.md).
        self.batch.clear();
    }

    fn restart(&mut self, tracker: &mut Tracker) -> Result<RestartVia, StartError> {
        self.start_incarnation(tracker).map_err(StartError::new)
    }

    fn ring(&mut self) -> Option<&mut dyn Ring> {
        Some(self)
    }

    fn extensions(&self) -> Vec<ExtensionSpec> {
        self.cfg.extensions.clone()
    }
}

impl Ring for ProcessBackend {
    fn begin(
        &mut self,
        tracker: &mut Tracker,
        func: u32,
        args: &[WireValue<'_>],
        ret: RetType,
    ) -> Result<Frame, BackendError> {
        self.fault_if_dead()?;
        self.activity.began();
        let mut loans = Vec::new();
        let list = match self.wire_args(tracker, args, &mut loans) {
            Ok(l) => l,
            Err(e) => {
                for loan in loans {
                    self.unlend(&loan);
                    if let Some(record) = loan.record {
                        tracker.release(record);
                    }
                }
                return Err(e);
            }
        };
        self.close_batch()?;
        let id = self.next_id;
        self.next_id += 1;
        self.pace_request();
        let len = match emit_call(&mut self.record, id, false, func, ret_kind(ret), list.iter().copied()) {
            Ok(len) => len,
            Err(e) => {
                for loan in &loans {
                    self.unlend(loan);
                }
                return Err(BackendError::Usage(format!("cannot encode the call: {e}")));
            }
        };
        self.push(len)?;
        self.publish_request();
        self.deferred_unpublished = 0;
        self.in_flight.push(id);
        Ok(Frame { id, loans })
    }

    fn wait(&mut self, frame: &Frame, deadline: &mut Deadline) -> Result<Step, BackendError> {
        if let Some((token, slot, regs)) = self.stashed.pop_front() {
            self.callbacks_open += 1;
            return Ok(Step::Callback { token, slot, regs });
        }
        match self.next_from_domain(deadline)? {
            Incoming::Reply { id, status, ret } => {
                if id != frame.id {
                    return Err(protocol(format!("reply for call {id:#x}, which is not in flight")));
                }
                self.check_reply(id, status)?;
                Ok(Step::Done(ret))
            }
            Incoming::Callback { id, slot, regs } => {
                self.callbacks_open += 1;
                Ok(Step::Callback { token: id, slot, regs })
            }
        }
    }

    fn answer_callback(&mut self, token: u64, ret: RegRet) -> Result<(), BackendError> {
        self.fault_if_dead()?;
        // Deferred calls the callback made go first, nested in it like the reply.
        self.close_batch()?;
        let len = self.encode(&Message::CallbackReply { id: token, ret_int: ret.int, ret_float: ret.float })?;
        self.push(len)?;
        self.callbacks_open = self.callbacks_open.saturating_sub(1);
        if self.pace.mode() == PaceMode::HandOver {
            // The answer goes from wherever this thread runs now.
            self.move_to_caller();
        }
        self.requests.publish();
        Ok(())
    }

    fn finish(&mut self, tracker: &mut Tracker, frame: Frame, outputs: &mut [&mut [u8]]) {
        let mut outputs = outputs.iter_mut();
        let pools = lock(&self.pools);
        for loan in &frame.loans {
            if loan.output {
                let dst = outputs.next();
                // An output lent in place already holds what the domain wrote.
                if let (Some(dst), false) = (dst, loan.pool == POOL_ARENA) {
                    let len = dst.len().min(loan.rich.len as usize);
                    let _ = pools.output.memory().read_at(loan.rich.offset as usize, &mut dst[..len]);
                }
            }
        }
        drop(pools);
        for loan in frame.loans {
            self.unlend(&loan);
            if let Some(record) = loan.record {
                tracker.release(record);
            }
        }
    }

    fn abandon(&mut self, frame: Frame) {
        // Pool loans are released by the tracker with everything else of the failed incarnation.
        for loan in &frame.loans {
            self.unlend(loan);
        }
    }

    fn defer(&mut self, func: u32, args: &[WireValue<'_>]) -> Result<(), BackendError> {
        self.fault_if_dead()?;
        self.activity.began();
        // The common case, scalars only: into the batch, which goes to the domain as one record when it is full,
        // at a flush, or before any other request.
        if args.iter().all(|a| scalar_wire(a).is_some()) {
            if !self.batch.fits(args.len()) {
                self.close_batch()?;
                self.requests.publish();
            }
            let wires = args.iter().map(|a| scalar_wire(a).unwrap_or_default());
            return self
                .batch
                .push(func, wires)
                .map_err(|e| BackendError::Usage(format!("cannot queue the call: {e}")));
        }
        self.close_batch()?;
        let mut list = ArgList::new();
        let mut inline: Vec<u8> = Vec::new();
        let inline_base = ward_xpc::wire::inline_base(args.len());
        for a in args {
            let wire = match a {
                WireValue::Int(_) | WireValue::F64(_) | WireValue::F32(_) | WireValue::Callback(_) => {
                    scalar_wire(a).unwrap_or_default()
                }
                WireValue::In(b) | WireValue::Str(b) => {
                    // Each input starts 8-byte aligned; the record ends right after the last one.
                    while inline.len() & 7 != 0 {
                        inline.push(0);
                    }
                    let offset = inline_base + inline.len();
                    inline.extend_from_slice(b);
                    WireArg { kind: ArgKind::Inline, pool: 0, a: offset as u64, b: b.len() as u64 }
                }
                WireValue::Out(_) | WireValue::InOut(_) | WireValue::Scratch(_) => {
                    return Err(BackendError::Usage("a deferred call cannot have output or scratch buffers".into()))
                }
            };
            list.push(wire).map_err(|_| BackendError::Usage("too many arguments (at most 14)".into()))?;
        }
        let id = self.next_id;
        self.next_id += 1;
        let message = Message::Call { id, deferred: true, func, ret: RetKind::Void, args: list, inline: &inline };
        if message.wire_len() > MAX_RECORD {
            return Err(BackendError::Usage(format!(
                "deferred call inputs too large ({} bytes; at most about {} fit in one record)",
                inline.len(),
                MAX_RECORD - inline_base
            )));
        }
        let len = self.encode(&message)?;
        self.push(len)?;
        self.after_deferred_push();
        Ok(())
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        self.close_batch()?;
        self.requests.publish();
        self.deferred_unpublished = 0;
        self.fault_if_dead()
    }

    fn ping(&mut self, deadline: &mut Deadline) -> Result<(), BackendError> {
        let (id, status, _) = self.request(|id| Message::Ping { id }, deadline)?;
        self.check_reply(id, status)
    }
}

impl ProcessBackend {
    /// Stops the running incarnation, if any, and starts the next: forked from the zygote, else spawned.
    fn start_incarnation(&mut self, tracker: &mut Tracker) -> Result<RestartVia, String> {
        self.stop();
        // The old incarnation is gone: its rings start over, and the host starts from positions zero too.
        self.region.reset();
        let (requests, replies) = self.region.host_endpoints();
        self.requests = requests;
        self.replies = replies;
        let (pid, pidfd, parent, via, channel) = if self.cfg.zygote {
            match self.fork_from_zygote() {
                Ok((pid, fd, channel)) => (pid, fd, Parent::Zygote, RestartVia::Zygote, channel),
                Err(first) => {
                    // A zygote that misbehaves is replaced once. If the new one fails a fork too (a deadline too
                    // short for this machine's load, say), the incarnation is spawned instead, so recovery goes
                    // on; a zygote that cannot be started at all is reported.
                    self.kill_zygote();
                    let failed = self.zygote_failures.len();
                    match self.fork_from_zygote() {
                        Ok((pid, fd, channel)) => (pid, fd, Parent::Zygote, RestartVia::Zygote, channel),
                        Err(_) if self.zygote_failures.len() > failed => {
                            let started = self.launch(spawn::Mode::Serve)?;
                            (
                                started.pid,
                                started.pidfd,
                                Parent::Us(started.child),
                                RestartVia::Spawn,
                                Some(started.control),
                            )
                        }
                        Err(second) => return Err(format!("{first}; then {second}")),
                    }
                }
            }
        } else {
            let started = self.launch(spawn::Mode::Serve)?;
            (started.pid, started.pidfd, Parent::Us(started.child), RestartVia::Spawn, Some(started.control))
        };
        // A serving process keeps its control socket: arena blocks come on it.
        let open_files = self.cfg.limits.open_files;
        let lending = channel.filter(|_| self.arena).map(|c| lending::Lending::new(c, open_files));
        let death = DeathWatch::new(self.region.clone());
        let watch = self.monitor.watch(pidfd.as_fd(), death.clone()).map_err(|e| format!("cannot watch: {e}"))?;
        let pidfd = Arc::new(pidfd);
        let held = pidfd.clone();
        tracker.track(ResourceKind::Descriptor, move || drop(held));
        let idle_cpu = self.watch_idle_cpu(pid, &pidfd, &death);
        self.live = Some(Incarnation {
            pid,
            _watch: watch,
            _idle_cpu: idle_cpu,
            pidfd,
            death,
            parent,
            ended: None,
            cpu: None,
            spread: None,
            lending,
        });
        Ok(via)
    }
}

impl ProcessBackend {
    /// Check, on the monitor thread, the CPU incarnation `pid` uses between calls (`idle_cpu`): past the policy's
    /// budget it is killed, and its death reported as that fault.
    fn watch_idle_cpu(&self, pid: i32, pidfd: &Arc<OwnedFd>, death: &Arc<DeathWatch>) -> Option<PeriodicGuard> {
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

impl Drop for ProcessBackend {
    fn drop(&mut self) {
        self.stop();
        self.kill_zygote();
    }
}

/// The zygote's `load` request for an extension; None when the control socket cannot carry it (a path that is not
/// UTF-8 or too long).
fn load_request_text(spec: &ExtensionSpec) -> Option<String> {
    LoadRequest { path: spec.path.to_str()?, init: spec.init.as_deref(), poison: spec.poison }.to_text()
}

fn ret_kind(ret: RetType) -> RetKind {
    match ret {
        RetType::Void => RetKind::Void,
        RetType::I64 | RetType::Handle => RetKind::Int,
        RetType::F64 => RetKind::F64,
        RetType::F32 => RetKind::F32,
    }
}
