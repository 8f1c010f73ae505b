//! The supervisor: the host's entry point. It owns the policy, loads extensions into domains of the isolation
//! kind policy asks for, watches them (process deaths, heartbeats) and reports recovery events.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::backend::mpk::{MpkBackend, MpkConfig};
use crate::backend::none::NoneBackend;
use crate::backend::process::monitor::Monitor;
use crate::backend::process::{find_program, short_gap, PaceMode, Pacing, ProcessBackend, ProcessConfig};
use crate::backend::ExtensionSpec;
use crate::backend::StartError;
use crate::call::{Arg, RetType, Signature, Value};
use crate::callback::Callback;
use crate::check::check_header;
use crate::domain::{Domain, DomainStats, PlainFunction};
use crate::error::Error;
use crate::events::{Event, EventBus};
use crate::fault::{Fault, FaultKind};
use crate::policy::{ExtensionPolicy, FunctionPolicy, Isolation, Policy};
use crate::tracker::Tracker;

/// Loads extensions into protection domains and keeps them running.
pub struct Supervisor {
    inner: Arc<Inner>,
}

struct Inner {
    policy: Policy,
    events: Arc<EventBus>,
    monitor: OnceLock<Arc<Monitor>>,
    groups: Mutex<HashMap<String, Weak<Domain>>>,
    heartbeats: Mutex<Vec<(Weak<Domain>, Duration)>>,
    heartbeat_started: AtomicBool,
    /// Whether the protections of the sandbox this machine lacks were reported (once, at the first process domain).
    sandbox_said: AtomicBool,
    stop: Arc<AtomicBool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Supervisor {
    pub fn new(policy: Policy) -> Supervisor {
        Supervisor {
            inner: Arc::new(Inner {
                policy,
                events: Arc::new(EventBus::default()),
                monitor: OnceLock::new(),
                groups: Mutex::new(HashMap::new()),
                heartbeats: Mutex::new(Vec::new()),
                heartbeat_started: AtomicBool::new(false),
                sandbox_said: AtomicBool::new(false),
                stop: Arc::new(AtomicBool::new(false)),
            }),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Recovery events from now on.
    pub fn subscribe(&self) -> Receiver<Event> {
        self.inner.events.subscribe()
    }

    /// Register a host function extensions may call back.
    pub fn register_callback(
        &self,
        signature: Signature,
        handler: impl Fn(&[Value]) -> Value + Send + Sync + 'static,
    ) -> Result<Callback, Error> {
        Callback::register(signature, handler)
    }

    /// Load an extension with the isolation its policy gives it. Its name is the file stem without a `lib` prefix.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<Extension, Error> {
        self.load_with(path, None)
    }

    /// Load an extension, overriding the policy's isolation kind.
    pub fn load_with(&self, path: impl AsRef<Path>, isolation: Option<Isolation>) -> Result<Extension, Error> {
        let path = path.as_ref();
        check_header(path)?;
        let name = extension_name(path);
        let policy = self.inner.policy.for_extension(&name);
        self.load_as(path, name, policy, isolation, None)
    }

    /// Load a class adapter in place of a plugin (see [`AdapterLoad`]): the domain runs the adapter, which opens
    /// the plugin itself; the extension is named, and its policy looked up, after the plugin.
    pub fn load_adapter(&self, load: &AdapterLoad<'_>) -> Result<Extension, Error> {
        check_header(load.plugin)?;
        check_header(load.adapter)?;
        let name = load.name.map_or_else(|| extension_name(load.plugin), str::to_string);
        let mut policy = self.inner.policy.for_extension(&name);
        for (function, default) in load.functions {
            let function = policy.functions.entry((*function).to_string()).or_insert_with(|| default.clone());
            // No policy file sets a first deadline: a function section keeps the class's.
            function.first_deadline = function.first_deadline.or(default.first_deadline);
        }
        if let Some(bypass) = load.when_disabled {
            policy.when_disabled = Some(bypass.to_string());
        }
        self.load_as(load.adapter, name, policy, load.isolation, Some(load.plugin))
    }

    fn load_as(
        &self,
        path: &Path,
        name: String,
        mut policy: ExtensionPolicy,
        isolation: Option<Isolation>,
        opened: Option<&Path>,
    ) -> Result<Extension, Error> {
        if let Some(from) = &policy.restart_from {
            check_header(from).map_err(|e| {
                let reason = match e {
                    Error::NotFound { .. } => "no such file".to_string(),
                    Error::NotElf { reason, .. } => format!("not an ELF shared object ({reason})"),
                    Error::Unusable { reason, .. } => reason,
                    other => other.to_string(),
                };
                Error::RestartImage { extension: name.clone(), path: from.clone(), reason }
            })?;
        }
        let opened = opened.map(Path::to_path_buf);
        if let Some(iso) = isolation {
            policy.isolation = iso;
        }
        crate::libfault::check_isolation(&name, &policy, policy.isolation)?;
        let needs_process = policy.poison || policy.library_fault.is_some();
        let isolation = resolve_isolation(policy.isolation, needs_process)?;
        // A library fault affects the calls of the plugin a class adapter opens, else of the extension itself.
        let preload = crate::libfault::preload(&name, &policy, isolation, opened.as_deref().unwrap_or(path))?;
        if policy.poison && isolation != Isolation::Process {
            return Err(Error::PoisonNeedsProcess { extension: name, isolation });
        }
        let spec = ExtensionSpec {
            path: path.to_path_buf(),
            init: policy.init.clone(),
            poison: policy.poison,
            opens: opened.clone(),
            library_fault: policy.library_fault,
        };

        if let Some(group) = policy.group.clone() {
            let existing =
                self.inner.groups.lock().unwrap_or_else(|e| e.into_inner()).get(&group).and_then(Weak::upgrade);
            if let Some(domain) = existing {
                if isolation != Isolation::Auto && domain.isolation() != isolation {
                    return Err(Error::IsolationUnavailable(
                        isolation.to_string(),
                        format!("group {group} already runs with isolation {}", domain.isolation()),
                    ));
                }
                let ext = domain.add_extension(spec, name.clone(), policy, opened)?;
                return Ok(Extension { domain, ext, name });
            }
            let mut domain_policy = self.inner.policy.for_group(&group);
            domain_policy.isolation = isolation;
            let (domain, started_from) = self.start_domain(group.clone(), isolation, domain_policy, spec, preload)?;
            let ext = domain.register_extension(name.clone(), policy, opened, started_from);
            self.inner.groups.lock().unwrap_or_else(|e| e.into_inner()).insert(group, Arc::downgrade(&domain));
            return Ok(Extension { domain, ext, name });
        }
        let (domain, started_from) = self.start_domain(name.clone(), isolation, policy.clone(), spec, preload)?;
        let ext = domain.register_extension(name.clone(), policy, opened, started_from);
        Ok(Extension { domain, ext, name })
    }

    fn monitor(&self) -> Result<Arc<Monitor>, Error> {
        monitor_of(&self.inner)
    }

    fn start_domain(
        &self,
        name: String,
        isolation: Isolation,
        policy: ExtensionPolicy,
        spec: ExtensionSpec,
        preload: Option<crate::libfault::Preload>,
    ) -> Result<(Arc<Domain>, Option<PathBuf>), Error> {
        let mut tracker = Tracker::new();
        // The `restart_from` file the domain was started from, when the extension's own failed to load.
        let mut started_from = None;
        let load_error = |reason: String| Error::Load { path: spec.path.clone(), reason };
        let mpk = |spec: &ExtensionSpec| {
            MpkBackend::start(MpkConfig {
                extensions: vec![spec.clone()],
                heap_bytes: heap_quota(&policy.limits),
                init_deadline: policy.deadline,
            })
        };
        let (backend, isolation): (Box<dyn crate::backend::Backend>, Isolation) = match isolation {
            Isolation::None => {
                let backend = NoneBackend::load(vec![spec.clone()]).map_err(|e| load_error(e.to_string()))?;
                (Box::new(backend), Isolation::None)
            }
            Isolation::Mpk => match mpk(&spec) {
                Ok(backend) => (Box::new(backend), Isolation::Mpk),
                // An initialiser of the extension (or of the plugin its adapter opens) crashed or hung while the
                // domain loaded it: with a `restart_from`, the domain starts from that file, as a process domain
                // recovers when the plugin crashes in the adapter's open.
                Err(e) => match (e.load_fault(), policy.restart_from.as_ref()) {
                    (Some(kind), Some(to)) => {
                        let to = std::path::absolute(to).unwrap_or_else(|_| to.clone());
                        tracing::warn!(extension = %name, "{e}; starting from {} (restart_from)", to.display());
                        // The file started from is not the one a library fault targets (see `replace_image`).
                        let mut good = ExtensionSpec { library_fault: None, ..spec.clone() };
                        match good.opens.as_mut() {
                            Some(opened) => *opened = to.clone(),
                            None => good.path = to.clone(),
                        }
                        let backend = mpk(&good).map_err(|e| load_error(e.to_string()))?;
                        let fault = Fault { kind: kind.clone(), domain: name.clone(), call: None, incarnation: 1 };
                        self.inner.events.emit(Event::Fault { fault });
                        started_from = Some(to);
                        (Box::new(backend), Isolation::Mpk)
                    }
                    _ => return Err(load_error(e.to_string())),
                },
            },
            Isolation::Auto => match mpk(&spec) {
                Ok(backend) => (Box::new(backend), Isolation::Mpk),
                Err(why) => {
                    tracing::info!(extension = %name, "auto isolation uses a process domain: {why}");
                    (Box::new(self.process_backend(&spec, &policy, preload, &mut tracker)?), Isolation::Process)
                }
            },
            Isolation::Process => {
                (Box::new(self.process_backend(&spec, &policy, preload, &mut tracker)?), Isolation::Process)
            }
        };
        let heartbeat = policy.heartbeat;
        let escalation = (isolation == Isolation::Mpk).then(|| self.escalation(&policy));
        let escalates = escalation.is_some() && policy.escalate_after > 0;
        let mut domain = Domain::new(name, isolation, policy, self.inner.events.clone(), backend, tracker);
        if let Some(escalation) = escalation {
            domain = domain.with_escalation(escalation);
        }
        let domain = Arc::new(domain);
        // An mpk domain runs on its callers' threads, so there is nothing to ping while it is idle; once it has
        // moved to a process (escalation), its heartbeat starts.
        if let Some(interval) = heartbeat {
            if isolation == Isolation::Process || escalates {
                self.add_heartbeat(&domain, interval);
            }
        }
        Ok((domain, started_from))
    }

    fn process_backend(
        &self,
        spec: &ExtensionSpec,
        policy: &ExtensionPolicy,
        preload: Option<crate::libfault::Preload>,
        tracker: &mut Tracker,
    ) -> Result<ProcessBackend, Error> {
        let backend = start_process(vec![spec.clone()], policy, preload, self.monitor()?, tracker)
            .map_err(|e| Error::Load { path: spec.path.clone(), reason: e.to_string() })?;
        let missing = crate::sandbox::missing();
        if !missing.is_empty() && !self.inner.sandbox_said.swap(true, Ordering::Relaxed) {
            let missing = missing.iter().map(|m| format!("{}: {}", m.protection, m.why)).collect();
            self.inner.events.emit(Event::SandboxIncomplete { missing });
        }
        Ok(backend)
    }

    /// How an mpk domain moves to a process domain when it escalates.
    fn escalation(&self, policy: &ExtensionPolicy) -> crate::domain::Escalation {
        let inner = Arc::downgrade(&self.inner);
        let policy = policy.clone();
        Box::new(move |specs, tracker| {
            let inner = inner.upgrade().ok_or_else(|| StartError::new("the supervisor is gone"))?;
            let monitor = monitor_of(&inner).map_err(StartError::new)?;
            // A library fault the mpk runtime injected is preloaded into the process (its count starts again).
            let preload = match (&policy.library_fault, specs.first()) {
                (Some(fault), Some(spec)) => Some(
                    crate::libfault::preload_for(fault, spec.opens.as_deref().unwrap_or(&spec.path))
                        .map_err(StartError::new)?,
                ),
                _ => None,
            };
            let backend = start_process(specs, &policy, preload, monitor, tracker)?;
            Ok(Box::new(backend) as Box<dyn crate::backend::Backend>)
        })
    }

    fn add_heartbeat(&self, domain: &Arc<Domain>, interval: Duration) {
        self.inner.heartbeats.lock().unwrap_or_else(|e| e.into_inner()).push((Arc::downgrade(domain), interval));
        if self.inner.heartbeat_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = Arc::downgrade(&self.inner);
        let stop = self.inner.stop.clone();
        let _ = std::thread::Builder::new().name("ward-heartbeat".into()).spawn(move || heartbeat_loop(inner, stop));
    }
}

/// Every domain with a heartbeat is pinged once per interval while it is idle.
fn heartbeat_loop(inner: Weak<Inner>, stop: Arc<AtomicBool>) {
    let tick = Duration::from_millis(10);
    let mut due: HashMap<usize, std::time::Instant> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        // The heartbeat's own period, not synchronisation with anything.
        std::thread::sleep(tick);
        let Some(inner) = inner.upgrade() else { return };
        let list: Vec<(Weak<Domain>, Duration)> = inner.heartbeats.lock().unwrap_or_else(|e| e.into_inner()).clone();
        drop(inner);
        let now = std::time::Instant::now();
        for (weak, interval) in list {
            let Some(domain) = weak.upgrade() else {
                continue;
            };
            let key = Arc::as_ptr(&domain) as usize;
            let next = *due.entry(key).or_insert(now + interval);
            if now >= next {
                due.insert(key, now + interval);
                domain.heartbeat(interval);
            }
        }
    }
}

/// The supervisor's monitor thread, started on first use.
fn monitor_of(inner: &Inner) -> Result<Arc<Monitor>, Error> {
    if let Some(m) = inner.monitor.get() {
        return Ok(m.clone());
    }
    let m = Monitor::start().map_err(|e| Error::io("cannot start the monitor thread", e))?;
    Ok(inner.monitor.get_or_init(|| m).clone())
}

/// A process domain for `specs`, as `policy` says.
fn start_process(
    specs: Vec<ExtensionSpec>,
    policy: &ExtensionPolicy,
    preload: Option<crate::libfault::Preload>,
    monitor: Arc<Monitor>,
    tracker: &mut Tracker,
) -> Result<ProcessBackend, StartError> {
    let program = find_program().map_err(StartError::new)?;
    let cfg = ProcessConfig {
        program,
        extensions: specs,
        limits: policy.limits.clone(),
        sandbox: policy.sandbox.domain_args(),
        spin: match policy.wait {
            crate::policy::WaitMode::Poll => u32::MAX,
            crate::policy::WaitMode::Sleep => 0,
            crate::policy::WaitMode::Adaptive => policy.spin,
        },
        pacing: match policy.wait {
            crate::policy::WaitMode::Poll => Pacing::Fixed(PaceMode::Spin),
            crate::policy::WaitMode::Sleep => Pacing::Fixed(PaceMode::HandOver),
            // Not spinning at all, an adaptive wait is a sleeping one.
            crate::policy::WaitMode::Adaptive if policy.spin == 0 => Pacing::Fixed(PaceMode::HandOver),
            crate::policy::WaitMode::Adaptive => Pacing::Learned { short_gap: short_gap(policy.spin) },
        },
        zygote: policy.zygote,
        deadline: policy.deadline,
        preload,
        read_past: ward_xpc::layout::read_past_bytes(policy.read_past_input_kb),
    };
    ProcessBackend::start(cfg, monitor, tracker).map_err(StartError::new)
}

/// The isolation kind to start a domain with. `auto` stays `auto` where protection keys exist (the domain then
/// tries mpk and falls back to a process domain when the extension cannot run in one), and is `process` elsewhere
/// or when the policy needs a process (poisoned calls, a run-time library fault).
fn resolve_isolation(iso: Isolation, needs_process: bool) -> Result<Isolation, Error> {
    match iso {
        Isolation::Auto if needs_process || !crate::backend::mpk::pku_available() => Ok(Isolation::Process),
        Isolation::Mpk if !crate::backend::mpk::pku_available() => Err(Error::IsolationUnavailable(
            "mpk".into(),
            "this machine has no memory protection keys (PKU), or its kernel does not let programs switch the FS base \
             (FSGSBASE, Linux 5.9 and later); use process, or auto (mpk where possible)"
                .into(),
        )),
        other => Ok(other),
    }
}

/// The heap an mpk domain may use: the policy's address-space limit, or 4 GiB of address space when unlimited
/// (reserved, not committed).
fn heap_quota(limits: &crate::policy::Limits) -> usize {
    match limits.address_space_mb {
        0 => 4 << 30,
        mb => usize::try_from(mb).unwrap_or(usize::MAX / (1 << 20)).saturating_mul(1 << 20),
    }
}

/// Where the `ward-domain` program is: `$WARD_DOMAIN`, else beside the running program, else one directory up.
pub fn domain_program() -> Result<PathBuf, Error> {
    find_program().map_err(|e| Error::DomainProgramMissing(e.to_string()))
}

/// The extension's name for policy: the file stem without a `lib` prefix.
pub fn extension_name(path: &Path) -> String {
    let stem = path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = stem.split(".so").next().unwrap_or(&stem).to_string();
    stem.strip_prefix("lib").map(str::to_string).unwrap_or(stem)
}

/// A class adapter to load in place of a plugin: a small library of the class (LADSPA, frei0r, ...) that opens the
/// plugin inside the domain and offers its interface as flat calls.
#[derive(Debug, Clone)]
pub struct AdapterLoad<'a> {
    /// The adapter shared object: what the domain loads.
    pub adapter: &'a Path,
    /// Names the extension for policy and events in place of the plugin's file stem (a runtime, which opens no
    /// plugin file of its own, is named by its host).
    pub name: Option<&'a str>,
    /// The plugin the adapter will open: names the extension for policy and events.
    pub plugin: &'a Path,
    /// Overrides the policy's isolation kind.
    pub isolation: Option<Isolation>,
    /// The class's policy for its adapter functions (which establish state, which destroy an instance, the first
    /// deadline of a class call); a function section of the policy file overrides them, except the first deadline.
    pub functions: &'a [(&'a str, FunctionPolicy)],
    /// What the host gets from the plugin once it is disabled (the class's bypass), for the message that says so.
    pub when_disabled: Option<&'a str>,
}

/// A loaded extension.
#[derive(Clone)]
pub struct Extension {
    domain: Arc<Domain>,
    ext: usize,
    name: String,
}

impl std::fmt::Debug for Extension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Extension({} in domain {})", self.name, self.domain.name)
    }
}

impl Extension {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The domain's name (the extension's own, or its group's).
    pub fn domain(&self) -> &str {
        &self.domain.name
    }

    pub fn isolation(&self) -> Isolation {
        self.domain.isolation()
    }

    /// Resolve a function once, for repeated calls. Its calls are named for its symbol in faults, events and
    /// messages (unless [`Extension::function_as`] named them otherwise).
    pub fn function(&self, symbol: &str) -> Result<Function, Error> {
        self.resolve(symbol, None)
    }

    /// Resolve a function once, for repeated calls, naming its calls `call` in faults, events and messages: a class
    /// wrapper resolves its adapter's `ward_ladspa_run` as `run`, the plugin's call the host made. The name is only
    /// shown; the symbol still keys the function's policy.
    pub fn function_as(&self, symbol: &str, call: &str) -> Result<Function, Error> {
        self.resolve(symbol, Some(call))
    }

    /// As [`Extension::function_as`], but a function of its own for each `instance`, though the symbol is the same:
    /// its deadline is learned from its own calls, and its failures in a row are its own. A runtime's entry point
    /// that calls whichever plugin it is handed is resolved once per plugin linked, so a plugin failing counts
    /// against nothing but itself, and its calls are named for it. The symbol still keys the policy.
    pub fn function_distinct(&self, symbol: &str, call: &str, instance: u64) -> Result<Function, Error> {
        let sym = self.domain.distinct_symbol(self.ext, symbol, call, instance)?;
        let plain = self.domain.plain_function(sym);
        Ok(Function { domain: self.domain.clone(), sym, plain, name: symbol.to_string(), call: call.to_string() })
    }

    fn resolve(&self, symbol: &str, call: Option<&str>) -> Result<Function, Error> {
        let sym = self.domain.symbol(self.ext, symbol, call)?;
        let call = call.unwrap_or(symbol).to_string();
        let plain = self.domain.plain_function(sym);
        Ok(Function { domain: self.domain.clone(), sym, plain, name: symbol.to_string(), call })
    }

    /// Call `symbol` with `args`, reading the result as `ret`. The function is resolved at its first call and
    /// found by name at the next ones; a [`Function`] kept from [`Extension::function`] skips even that.
    pub fn call(&self, symbol: &str, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, Error> {
        self.domain.call_symbol(self.ext, symbol, args, ret)
    }

    /// Queue a call to `symbol` with no reply awaited (scalars and small inputs only).
    pub fn defer(&self, symbol: &str, args: &[Arg<'_>]) -> Result<(), Error> {
        self.function(symbol)?.defer(args)
    }

    /// Send every queued deferred call.
    pub fn flush(&self) -> Result<(), Error> {
        self.domain.flush()
    }

    pub fn stats(&self) -> DomainStats {
        self.domain.stats()
    }

    /// Whether an `Out` or `InOut` buffer the extension is given ends at a guard page (so writing past its end
    /// faults): true where buffers cross through the domain's pools (process domains), false where the extension
    /// gets the host's own buffer (`none`). A class adapter may then let a plugin write such a buffer directly
    /// instead of its own guarded copy.
    pub fn lends_guarded_buffers(&self) -> bool {
        self.domain.isolation() == Isolation::Process
    }

    /// The extension's effective policy.
    pub fn policy(&self) -> ExtensionPolicy {
        self.domain.extension_policy(self.ext)
    }

    /// A class wrapper found the result of a call of `symbol` wrong (see [`crate::FaultKind::BadOutput`]): the
    /// domain is recovered as after any fault, which names the call as the function was resolved. Fails when the
    /// domain is, or now becomes, disabled.
    pub fn declare_fault(&self, symbol: &str, kind: FaultKind) -> Result<(), Error> {
        self.domain.declare_fault(self.ext, symbol, kind)
    }

    /// Say that a call's output, which a class found wrong, came out the same again right after the recovery that
    /// [`Extension::declare_fault`] made of it: it is the extension's own ([`Event::OwnOutput`]).
    pub fn report_own_output(&self, symbol: &str, what: &str) {
        self.domain.report_own_output(self.ext, symbol, what)
    }

    /// Run `f` with the extension's domain held for this thread: calls of other threads wait until it returns (a
    /// real-time call at most its period), so what `f` does in the domain is one step to them (a class saving a
    /// plugin's state and logging it as a checkpoint, with no block in between).
    pub fn exclusively<T>(&self, f: impl FnOnce() -> T) -> T {
        self.domain.exclusively(f)
    }

    /// [`Extension::declare_fault`] for a real-time caller: the recovery runs on a thread of its own, and real-time
    /// calls fail at once until it is done (see [`Function::call_realtime`]).
    pub fn declare_fault_apart(&self, symbol: &str, kind: FaultKind) -> Result<(), Error> {
        self.domain.declare_fault_apart(self.ext, symbol, kind)
    }

    /// The process id of the domain's running incarnation (process isolation only).
    pub fn pid(&self) -> Option<i32> {
        self.domain.pid()
    }
}

/// A resolved function of an extension.
#[derive(Clone)]
pub struct Function {
    domain: Arc<Domain>,
    sym: usize,
    /// How to call it on the plain path, when its calls may take it (`none`: see `domain::plain`).
    plain: Option<PlainFunction>,
    /// Its symbol.
    name: String,
    /// Its calls' name in faults, events and messages.
    call: String,
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Function({})", self.name)
    }
}

impl Function {
    /// Its symbol.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What faults, events and messages call its calls (see [`Extension::function_as`]).
    pub fn call_name(&self) -> &str {
        &self.call
    }

    // Inlined into the host's code, so a plain call (isolation `none`) is as short as the call it stands for; the
    // full path stays out of line.
    #[inline]
    pub fn call(&self, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, Error> {
        if let Some(plain) = self.plain {
            if let Some(value) = self.domain.call_plain(plain, args, ret) {
                return Ok(value);
            }
        }
        self.call_full(args, ret)
    }

    #[inline(never)]
    fn call_full(&self, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, Error> {
        self.domain.call(self.sym, &self.name, &self.call, args, ret)
    }

    pub fn defer(&self, args: &[Arg<'_>]) -> Result<(), Error> {
        self.domain.defer(self.sym, &self.name, &self.call, args)
    }

    /// Call from a real-time thread whose calls are due every `period` (an audio host's process callback): the
    /// thread never waits for a recovery. A fault fails the call at once ([`Error::Fault`]) and the domain is
    /// recovered on a thread of its own; calls made meanwhile fail at once with [`Error::Recovering`], as do calls
    /// that find the domain held by another thread's call for longer than `period`. The real-time deadline is the
    /// learned one without the policy's floor, and never below `period`. A call of a process domain that misses it
    /// fails at once with [`Error::Late`] but is no fault yet: it goes on in the domain, waited for on another thread
    /// with the function's normal deadline (calls meanwhile fail at once with [`Error::Busy`]); returned in time, it
    /// is logged as made (its outputs dropped, [`Event::Late`] says so), else it is a hang, recovered apart. Nothing
    /// is retried: the caller has the block to skip.
    pub fn call_realtime(&self, args: &mut [Arg<'_>], ret: RetType, period: Duration) -> Result<Value, Error> {
        self.domain.call_realtime(self.sym, args, ret, period)
    }

    /// Log a call of this function with `args` as if it had been made, without making it: a checkpoint of the
    /// instance its first [`Arg::Handle`] names (a class that read a plugin's state logs the call that restores
    /// it), or of the whole extension when no argument is a handle (a runtime's heap). It replaces the instance's
    /// (or the extension's) earlier checkpoint by this function, in the order of the log: a restart replays the
    /// configuration and the history kept, with this call where it was made.
    pub fn record_checkpoint(&self, args: &[Arg<'_>], ret: RetType) -> Result<(), Error> {
        self.domain.record_checkpoint(self.sym, args, ret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_extensions_by_their_stem() {
        assert_eq!(extension_name(Path::new("/usr/lib/ladspa/libamp.so")), "amp");
        assert_eq!(extension_name(Path::new("faulty.so")), "faulty");
        assert_eq!(extension_name(Path::new("x/libfoo.so.1.2")), "foo");
    }
}
