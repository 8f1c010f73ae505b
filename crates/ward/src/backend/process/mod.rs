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
//!
//! This file holds the backend itself (its state, its start and the `Backend` methods); one file per job does the
//! rest: `spawn` (starting `ward-domain`), `template` (forking it from a template instead), `incarnation` (the
//! serving process, how it ended), `zygote` (forking incarnations), `add` (extensions added later), `send` and
//! `receive` (the two rings), `lending` (a call's buffers, and the arena blocks the domain holds), `pace` and
//! `placement` (how caller and domain wait for each other, and on which processor), `monitor` (noticing deaths,
//! periodic checks), `idle_cpu` (CPU between calls), `cgroup` (the domain's limits).

mod add;
pub(crate) mod cgroup;
mod idle_cpu;
mod incarnation;
mod lending;
#[allow(unsafe_code)]
pub(crate) mod monitor;
mod pace;
#[allow(unsafe_code)]
pub mod placement;
mod receive;
mod send;
#[allow(unsafe_code)]
mod spawn;
#[allow(unsafe_code)]
mod template;
mod zygote;

pub(crate) use template::spares_taken as domains_started_from_spares;

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ward_abi::{RegArgs, RegRet};
use ward_xpc::arena::{self, POOL_ARENA};
use ward_xpc::batch::BatchWriter;
use ward_xpc::layout::DEFAULT_RING_CAPACITY;
use ward_xpc::pool::{HostPool, PoolGeometry, POOL_IN, POOL_OUT};
use ward_xpc::ring::{Consumer, Producer, MAX_RECORD};
use ward_xpc::wire::{emit_call, ArgKind, ArgList, Message, RetKind, WireArg};
use ward_xpc::{Deadline, Region};

pub(crate) use pace::{short_gap, PaceMode, Pacing};
pub(crate) use spawn::find_program;

use add::load_request_text;
use incarnation::{Incarnation, Parent};
use lending::{lock, Pools, SharedPools};
use monitor::{DeathWatch, Monitor};
use receive::{protocol, Incoming};
use send::{ret_kind, scalar_wire};
use zygote::Zygote;

use incarnation::LaunchError;
use zygote::ForkError;

use super::{Added, Backend, BackendError, Callable, ExtensionSpec, Frame, Refused, Ring, StartError, Step, WireValue};
use crate::call::RetType;
use crate::events::RestartVia;
use crate::fault::FaultKind;
use crate::policy::Limits;
use crate::tracker::{ResourceKind, Tracker};

/// How long to wait for a domain's answer to a resolve request.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a killed process may take to be gone.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a process domain could not be started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CreateError {
    #[error("cannot create the rings: {0}")]
    Rings(#[source] ward_xpc::layout::LayoutError),
    #[error("bad pool geometry: {0}")]
    PoolGeometry(#[source] ward_xpc::pool::PoolError),
    #[error("cannot create the input pool: {0}")]
    InputPool(#[source] ward_xpc::pool::PoolError),
    #[error("cannot create the output pool: {0}")]
    OutputPool(#[source] ward_xpc::pool::PoolError),
    /// The machine gives cgroups, but not this one.
    #[error("cannot create the domain's cgroup: {0}")]
    Cgroup(#[source] cgroup::CgroupError),
    /// Its first incarnation did not start (as `restart` says it).
    #[error(transparent)]
    FirstIncarnation(IncarnationError),
}

/// Why an incarnation of a process domain did not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IncarnationError {
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The zygote failed to fork it, and so did the one started in its place.
    #[error("{first}; then {second}")]
    Zygote { first: ForkError, second: ForkError },
    #[error("cannot watch: {0}")]
    Watch(#[source] std::io::Error),
}

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

pub(crate) struct ProcessBackend {
    cfg: ProcessConfig,
    monitor: Arc<Monitor>,
    region: Region,
    requests: Producer,
    replies: Consumer,
    pools: SharedPools,
    /// The same pools, as the tracker's records of lent buffers name them.
    releaser: Arc<dyn crate::tracker::Releaser>,
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
    pub fn start(
        cfg: ProcessConfig,
        monitor: Arc<Monitor>,
        tracker: &mut Tracker,
    ) -> Result<ProcessBackend, CreateError> {
        let region = Region::create(DEFAULT_RING_CAPACITY).map_err(CreateError::Rings)?;
        let geometry = PoolGeometry::standard(cfg.read_past).map_err(CreateError::PoolGeometry)?;
        let input = HostPool::create(POOL_IN, geometry.clone()).map_err(CreateError::InputPool)?;
        let output = HostPool::create(POOL_OUT, geometry).map_err(CreateError::OutputPool)?;
        let (requests, replies) = region.host_endpoints();
        let pacing = cfg.pacing;
        let cgroup = match cgroup::Cgroup::create(&cfg.limits) {
            Ok(group) => Some(group),
            // Said once as a missing protection (`sandbox::missing`); the rlimits still hold.
            Err(e) if cgroup::probe().iter().any(|(what, _)| *what == "cgroup") => {
                tracing::debug!(error = %e, "the domain runs without a cgroup");
                None
            }
            Err(e) => return Err(CreateError::Cgroup(e)),
        };
        let pools = Arc::new(Mutex::new(Pools { input, output }));
        let mut b = ProcessBackend {
            cfg,
            monitor,
            region,
            requests,
            replies,
            pools: pools.clone(),
            releaser: pools,
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
        b.start_incarnation(tracker).map_err(CreateError::FirstIncarnation)?;
        Ok(b)
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
        in_place: bool,
    ) -> Result<Frame, BackendError> {
        self.fault_if_dead()?;
        self.activity.began();
        let mut loans = crate::backend::Loans::new();
        let list = match self.wire_args(tracker, args, &mut loans, in_place) {
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
    fn start_incarnation(&mut self, tracker: &mut Tracker) -> Result<RestartVia, IncarnationError> {
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
                            let started = self.launch(spawn::Role::Serve)?;
                            (
                                started.pid,
                                started.pidfd,
                                Parent::Us(started.child),
                                RestartVia::Spawn,
                                Some(started.control),
                            )
                        }
                        Err(second) => return Err(IncarnationError::Zygote { first, second }),
                    }
                }
            }
        } else {
            let started = self.launch(spawn::Role::Serve)?;
            (started.pid, started.pidfd, Parent::Us(started.child), RestartVia::Spawn, Some(started.control))
        };
        // A serving process keeps its control socket: arena blocks come on it.
        let open_files = self.cfg.limits.open_files;
        let lending = channel.filter(|_| self.arena).map(|c| lending::Lending::new(c, open_files));
        let death = DeathWatch::new(self.region.clone());
        let watch = self.monitor.watch(pidfd.as_fd(), death.clone()).map_err(IncarnationError::Watch)?;
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

impl Drop for ProcessBackend {
    fn drop(&mut self) {
        self.stop();
        self.kill_zygote();
    }
}
