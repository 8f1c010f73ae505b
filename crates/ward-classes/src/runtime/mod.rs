//! Runtimes (the kernel plugins paper's runtimes, with its dynamic code generation and dynamic linking): a named
//! namespace that owns one domain, into which plugins are linked while it runs, from C source compiled at run time,
//! from relocatable objects or from shared objects, and out of which they are unlinked, without restarting anything.
//!
//! A plugin is a C function named like the plugin. Plugins in one runtime call each other directly by name (a plain
//! call: the compiler resolves the name to the other plugin's code), share the runtime's heap (`ward_heap()`), and
//! call the host's built-ins, host functions declared by name ([`Runtime::builtin`]) that cross the boundary like any
//! callback. The compiler (libtcc) runs inside the domain, on the adapter's side: source that crashes or hangs it
//! costs a recovery of the runtime, never the host.
//!
//! Every call of a plugin has the runtime's time quantum: a call past it is a fault. A plugin that faults (a crash,
//! the quantum, a bad write) is unlinked, with the plugins that call it, and reported; the runtime is recovered with
//! the rest: its domain restarted, the plugins linked again from the shadow log, the heap back as its last snapshot
//! (taken every `checkpoint_ms` of the runtime's policy; 0: no snapshots, the heap comes back zeroed).

mod diagnostics;

use std::collections::HashMap;
use std::ffi::CString;
use std::path::Path;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use ward::policy::FunctionPolicy;
use ward::{AdapterLoad, Arg, Callback, Extension, Fault, Function, Isolation, RetType, Signature, Supervisor, Value};

pub use diagnostics::{Diagnostic, Severity};

use crate::ClassError;

const ADAPTER: &str = "ward_runtime_adapter";
/// The adapter built without shared objects, for runtimes whose domain is mpk (see [`adapter_for`]).
const ADAPTER_MPK: &str = "ward_runtime_adapter_mpk";
/// Room for the compiler's messages about one plugin.
const REPORT_BYTES: usize = 16 * 1024;
/// Integer (or pointer) arguments a plugin call carries; float arguments do not count.
pub const MAX_INT_ARGS: usize = 5;
/// Float arguments a plugin call carries.
pub const MAX_FLOAT_ARGS: usize = 8;
/// The longest plugin or built-in name (the adapter's limit).
pub const MAX_NAME: usize = 63;

/// The headers every runtime offers its plugins: the C library's part a plugin may use, and ward's own.
const HEADERS: &[(&str, &str)] = &[
    ("stdint.h", include_str!("../../runtime/include/stdint.h")),
    ("stddef.h", include_str!("../../runtime/include/stddef.h")),
    ("stdbool.h", include_str!("../../runtime/include/stdbool.h")),
    ("string.h", include_str!("../../runtime/include/string.h")),
    ("stdlib.h", include_str!("../../runtime/include/stdlib.h")),
    ("math.h", include_str!("../../runtime/include/math.h")),
    ("ward_runtime.h", include_str!("../../runtime/include/ward_runtime.h")),
];

/// How a runtime is set up.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Overrides the policy's isolation kind for the runtime's domain.
    pub isolation: Option<Isolation>,
    /// The time quantum of one plugin call: past it, the call is a fault (a policy file's `deadline_ms` for the
    /// function `ward_rt_invoke` overrides it).
    pub quantum: Duration,
    /// The bound of one compilation or link, past which the compiler is taken to hang.
    pub compile_deadline: Duration,
    /// The size of the heap the plugins share.
    pub heap_bytes: u64,
}

impl Default for RuntimeOptions {
    fn default() -> RuntimeOptions {
        RuntimeOptions {
            isolation: None,
            quantum: Duration::from_secs(1),
            compile_deadline: Duration::from_secs(10),
            heap_bytes: 1 << 20,
        }
    }
}

/// What a plugin is made from.
#[derive(Debug, Clone, Copy)]
pub enum Code<'a> {
    /// C source, compiled in the runtime's domain.
    Source(&'a str),
    /// An ELF relocatable object for x86-64 (`cc -c`), linked in the runtime's domain.
    Object(&'a [u8]),
    /// A shared object, loaded in the runtime's domain (a process domain: with its own C library). A runtime in an
    /// mpk domain links none: its `create` is a compile error saying so.
    Shared(&'a Path),
}

/// A plugin as the runtime knows it: stable while the plugin stays linked, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PluginId(u64);

impl PluginId {
    /// The number behind the id, for a host's own tables.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Why a runtime refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("plugin {plugin} does not compile: {first}")]
    Compile {
        plugin: String,
        /// The first error.
        first: Diagnostic,
        /// Every message, warnings included, in order.
        all: Vec<Diagnostic>,
    },
    #[error("the compiler failed on plugin {plugin} ({fault}); runtime {runtime} was recovered without it")]
    CompilerFault { runtime: String, plugin: String, fault: Box<Fault> },
    #[error("plugin {plugin} failed ({fault}) and was unlinked{}", unlinked_with(.unlinked, .plugin))]
    PluginFault {
        plugin: String,
        fault: Box<Fault>,
        /// Every plugin unlinked: the one that failed and those that call it.
        unlinked: Vec<String>,
    },
    #[error("runtime {runtime} has no plugin {plugin}")]
    NoSuchPlugin { runtime: String, plugin: String },
    #[error("plugin id {id} names no plugin of runtime {runtime} now: it was deleted, or unlinked after a fault")]
    StalePlugin { runtime: String, id: u64 },
    #[error("plugin {plugin} of runtime {runtime} is unlinked; link it to call it")]
    Unlinked { runtime: String, plugin: String },
    #[error("runtime {runtime} has a plugin named {plugin} already; delete it first")]
    Exists { runtime: String, plugin: String },
    #[error("plugin {plugin} is called by {users}; delete those first")]
    InUse { plugin: String, users: String },
    #[error("{what}: {reason}")]
    BadArguments { what: String, reason: String },
    #[error(transparent)]
    Class(#[from] ClassError),
    #[error(transparent)]
    Ward(#[from] ward::Error),
}

fn unlinked_with(unlinked: &[String], plugin: &str) -> String {
    let others: Vec<&str> = unlinked.iter().map(String::as_str).filter(|p| *p != plugin).collect();
    if others.is_empty() {
        String::new()
    } else {
        format!(", with the plugins that call it: {}", others.join(", "))
    }
}

struct Plugin {
    name: String,
    /// The adapter's handle of the plugin (remapped by the core across restarts).
    handle: u64,
    /// The plugins it calls.
    uses: Vec<String>,
    /// `ward_rt_invoke` as a function of this plugin's own.
    call: Function,
    /// In the namespace: callable, and resolvable by plugins linked later.
    linked: bool,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    by_name: HashMap<String, PluginId>,
    plugins: HashMap<PluginId, Plugin>,
}

impl Table {
    /// `name` and, first, every plugin that calls it, directly or not.
    fn with_users(&self, name: &str) -> Vec<PluginId> {
        let mut order = Vec::new();
        self.collect_users(name, &mut order);
        order
    }

    /// The plugins that call `name` directly, sorted.
    fn callers(&self, name: &str) -> Vec<String> {
        let mut users: Vec<String> =
            self.plugins.values().filter(|p| p.uses.iter().any(|u| u == name)).map(|p| p.name.clone()).collect();
        users.sort_unstable();
        users
    }

    fn collect_users(&self, name: &str, order: &mut Vec<PluginId>) {
        let Some(&id) = self.by_name.get(name) else { return };
        if order.contains(&id) {
            return;
        }
        for user in self.callers(name) {
            self.collect_users(&user, order);
        }
        order.push(id);
    }
}

struct Calls {
    compile: Function,
    link_object: Function,
    link_shared: Function,
    unlink: Function,
    set_linked: Function,
    header: Function,
    builtin: Function,
    heap_save: Function,
    heap_restore: Function,
}

/// A runtime: one domain, its plugins, its heap and its built-ins. Calls are safe from many threads.
pub struct Runtime {
    name: String,
    /// The adapter's handle of this runtime (a domain may hold several).
    handle: u64,
    close: Function,
    ext: Extension,
    calls: Calls,
    heap_bytes: u64,
    table: RwLock<Table>,
    /// The built-ins' callbacks, kept for as long as the runtime: a plugin linked against one may call it any time.
    builtins: Mutex<Vec<Callback>>,
    /// When the heap was last saved.
    snapshot: Mutex<Instant>,
    /// The policy's `checkpoint_ms`: how often the heap is saved (zero: never).
    snapshot_period: Duration,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("name", &self.name).field("isolation", &self.ext.isolation()).finish()
    }
}

impl Runtime {
    /// Start a runtime named `name` (the name its policy section has) in a domain of its own.
    pub fn open(supervisor: &Supervisor, name: &str, options: &RuntimeOptions) -> Result<Runtime, RuntimeError> {
        c_identifier(name, "a runtime name")?;
        let adapter = crate::adapters::path(adapter_for(supervisor, name, options.isolation))?;
        let state = FunctionPolicy { state: true, ..FunctionPolicy::default() };
        let link = FunctionPolicy {
            retryable: false,
            deadline: Some(options.compile_deadline),
            first_deadline: Some(options.compile_deadline),
            ..state.clone()
        };
        let functions = [
            ("ward_rt_open", state.clone()),
            ("ward_rt_close", FunctionPolicy { destroys: true, ..FunctionPolicy::default() }),
            ("ward_rt_header", FunctionPolicy { replaces_same: Some(2), ..state.clone() }),
            ("ward_rt_builtin", FunctionPolicy { replaces_same: Some(2), ..state.clone() }),
            ("ward_rt_compile", link.clone()),
            ("ward_rt_link_object", link.clone()),
            ("ward_rt_link_shared", link),
            ("ward_rt_unlink", FunctionPolicy { destroys: true, ..FunctionPolicy::default() }),
            ("ward_rt_set_linked", FunctionPolicy { replaces_same: Some(1), ..state.clone() }),
            (
                "ward_rt_invoke",
                FunctionPolicy {
                    retryable: false,
                    deadline: Some(options.quantum),
                    first_deadline: Some(options.quantum),
                    ..FunctionPolicy::default()
                },
            ),
        ];
        let ext = supervisor.load_adapter(&AdapterLoad {
            adapter: &adapter,
            name: Some(name),
            plugin: &adapter,
            isolation: options.isolation,
            functions: &functions,
            when_disabled: None,
        })?;
        let calls = Calls {
            compile: ext.function("ward_rt_compile")?,
            link_object: ext.function("ward_rt_link_object")?,
            link_shared: ext.function("ward_rt_link_shared")?,
            unlink: ext.function("ward_rt_unlink")?,
            set_linked: ext.function("ward_rt_set_linked")?,
            header: ext.function("ward_rt_header")?,
            builtin: ext.function("ward_rt_builtin")?,
            heap_save: ext.function("ward_rt_heap_save")?,
            heap_restore: ext.function("ward_rt_heap_restore")?,
        };
        let opened = ext.function("ward_rt_open")?.call(&mut [Arg::U64(options.heap_bytes)], RetType::Handle)?;
        let handle = match opened.as_handle() {
            Some(handle) if handle != 0 => handle,
            _ => {
                return Err(RuntimeError::BadArguments {
                    what: format!("runtime {name}"),
                    reason: format!("cannot map a heap of {} bytes", options.heap_bytes),
                })
            }
        };
        let snapshot_period = ext.policy().checkpoint;
        let runtime = Runtime {
            name: name.to_string(),
            handle,
            close: ext.function("ward_rt_close")?,
            ext,
            calls,
            heap_bytes: options.heap_bytes,
            table: RwLock::new(Table::default()),
            builtins: Mutex::new(Vec::new()),
            snapshot: Mutex::new(Instant::now()),
            snapshot_period,
        };
        for (header, text) in HEADERS {
            runtime.header(header, text)?;
        }
        Ok(runtime)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The isolation the runtime's domain runs with.
    pub fn isolation(&self) -> Isolation {
        self.ext.isolation()
    }

    /// The extension behind the runtime (its domain's statistics, its pid).
    pub fn extension(&self) -> &Extension {
        &self.ext
    }

    /// Offer plugins a header they may `#include` (by `name`, with quotes or angle brackets); a header of the same
    /// name is replaced for the plugins linked from now on.
    pub fn header(&self, name: &str, text: &str) -> Result<(), RuntimeError> {
        let bad = |reason: &str| RuntimeError::BadArguments { what: format!("header {name}"), reason: reason.into() };
        if name.is_empty() || name.len() > 100 || name.contains('/') {
            return Err(bad("a header name is a file name of at most 100 bytes, without '/'"));
        }
        let c_name = CString::new(name).map_err(|_| bad("the name contains a NUL byte"))?;
        let r = self.calls.header.call(
            &mut [Arg::Handle(self.handle), Arg::Str(&c_name), Arg::In(text.as_bytes()), Arg::U64(text.len() as u64)],
            RetType::I64,
        )?;
        match r.as_i64() {
            Some(0) => Ok(()),
            _ => Err(bad("the runtime has no room for it")),
        }
    }

    /// Declare a host function plugins may call by `name`, as `ret name(args...)` with the types of `signature`.
    /// It crosses the boundary as any callback does. Plugins linked from now on see it; declaring a name again
    /// points the plugins linked after that to the new function.
    pub fn builtin(
        &self,
        name: &str,
        signature: Signature,
        handler: impl Fn(&[Value]) -> Value + Send + Sync + 'static,
    ) -> Result<(), RuntimeError> {
        let c_name = c_identifier(name, "a built-in name")?;
        let callback = Callback::new(signature, handler)?;
        let r = self
            .calls
            .builtin
            .call(&mut [Arg::Handle(self.handle), Arg::Str(&c_name), Arg::Callback(&callback)], RetType::I64)?;
        if r.as_i64() != Some(0) {
            return Err(RuntimeError::BadArguments {
                what: format!("built-in {name}"),
                reason: "the runtime holds 256 built-ins, its most".into(),
            });
        }
        self.builtins.lock().unwrap_or_else(|e| e.into_inner()).push(callback);
        Ok(())
    }

    /// Link a plugin named `name` (its entry point is the function `name` in `code`) into the running runtime. A
    /// compile or link error is [`RuntimeError::Compile`], with the compiler's messages; a compiler that crashes or
    /// hangs is [`RuntimeError::CompilerFault`], after which the runtime runs on without the plugin.
    pub fn create(&self, name: &str, code: Code<'_>) -> Result<PluginId, RuntimeError> {
        let c_name = c_identifier(name, "a plugin name")?;
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        if table.by_name.contains_key(name) {
            return Err(RuntimeError::Exists { runtime: self.name.clone(), plugin: name.to_string() });
        }
        let mut report = vec![0u8; REPORT_BYTES];
        let linked = match code {
            Code::Source(text) => self.calls.compile.call(
                &mut [
                    Arg::Handle(self.handle),
                    Arg::Str(&c_name),
                    Arg::In(text.as_bytes()),
                    Arg::U64(text.len() as u64),
                    Arg::Out(&mut report),
                    Arg::U64(REPORT_BYTES as u64),
                ],
                RetType::Handle,
            ),
            Code::Object(bytes) => self.calls.link_object.call(
                &mut [
                    Arg::Handle(self.handle),
                    Arg::Str(&c_name),
                    Arg::In(bytes),
                    Arg::U64(bytes.len() as u64),
                    Arg::Out(&mut report),
                    Arg::U64(REPORT_BYTES as u64),
                ],
                RetType::Handle,
            ),
            Code::Shared(path) => {
                let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
                let c_path =
                    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| RuntimeError::BadArguments {
                        what: format!("plugin {name}"),
                        reason: format!("the path {} contains a NUL byte", path.display()),
                    })?;
                self.calls.link_shared.call(
                    &mut [
                        Arg::Handle(self.handle),
                        Arg::Str(&c_name),
                        Arg::Str(&c_path),
                        Arg::Out(&mut report),
                        Arg::U64(REPORT_BYTES as u64),
                    ],
                    RetType::Handle,
                )
            }
        };
        let handle = match linked {
            Ok(value) => value.as_handle().unwrap_or(0),
            Err(ward::Error::Fault(fault)) => {
                return Err(RuntimeError::CompilerFault {
                    runtime: self.name.clone(),
                    plugin: name.into(),
                    fault: Box::new(fault),
                })
            }
            Err(e) => return Err(e.into()),
        };
        let report = text_of(&report);
        if handle == 0 {
            let mut all = diagnostics::parse(&report);
            if let Code::Source(text) = code {
                diagnostics::refine_columns(&mut all, &format!("{name}.c"), text);
            }
            let first = all.iter().find(|d| d.severity == Severity::Error).cloned().unwrap_or_else(|| Diagnostic {
                severity: Severity::Error,
                file: None,
                line: None,
                column: None,
                message: "the compiler refused the plugin and said nothing".into(),
            });
            return Err(RuntimeError::Compile { plugin: name.to_string(), first, all });
        }
        let uses = report.lines().filter_map(|l| l.strip_prefix("uses\t")).map(str::to_string).collect();
        let id = PluginId(table.next_id);
        table.next_id += 1;
        let call = self.ext.function_distinct("ward_rt_invoke", name, id.0)?;
        table.by_name.insert(name.to_string(), id);
        table.plugins.insert(id, Plugin { name: name.to_string(), handle, uses, call, linked: true });
        Ok(id)
    }

    /// The plugin linked under `name`, if any.
    pub fn lookup(&self, name: &str) -> Option<PluginId> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        table.by_name.get(name).copied().filter(|id| table.plugins.get(id).is_some_and(|p| p.linked))
    }

    /// The names of the plugins linked now, sorted.
    pub fn plugins(&self) -> Vec<String> {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = table.plugins.values().filter(|p| p.linked).map(|p| p.name.clone()).collect();
        names.sort();
        names
    }

    /// Take the plugin `name` out of the namespace, keeping its code: it cannot be called, nor resolved by plugins
    /// linked from now on, until [`Runtime::link`] puts it back. Plugins linked earlier that call it keep calling
    /// its code. Nothing restarts; a recovery keeps it unlinked.
    pub fn unlink(&self, name: &str) -> Result<(), RuntimeError> {
        self.set_linked(name, false)
    }

    /// Put the plugin `name`, unlinked earlier, back into the namespace.
    pub fn link(&self, name: &str) -> Result<(), RuntimeError> {
        self.set_linked(name, true)
    }

    fn set_linked(&self, name: &str, linked: bool) -> Result<(), RuntimeError> {
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let no_such = || RuntimeError::NoSuchPlugin { runtime: self.name.clone(), plugin: name.to_string() };
        let id = *table.by_name.get(name).ok_or_else(no_such)?;
        let plugin = table.plugins.get_mut(&id).ok_or_else(no_such)?;
        if plugin.linked == linked {
            return Ok(());
        }
        self.calls.set_linked.call(&mut [Arg::Handle(plugin.handle), Arg::I64(i64::from(linked))], RetType::I64)?;
        plugin.linked = linked;
        Ok(())
    }

    /// Unlink the plugin `name` and free its code; the runtime and its other plugins go on. Refused while other
    /// plugins call it.
    pub fn delete(&self, name: &str) -> Result<(), RuntimeError> {
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let Some(&id) = table.by_name.get(name) else {
            return Err(RuntimeError::NoSuchPlugin { runtime: self.name.clone(), plugin: name.to_string() });
        };
        let users = table.callers(name);
        if !users.is_empty() {
            return Err(RuntimeError::InUse { plugin: name.to_string(), users: users.join(", ") });
        }
        self.free(&mut table, id)?;
        Ok(())
    }

    fn free(&self, table: &mut Table, id: PluginId) -> Result<(), ward::Error> {
        let Some(plugin) = table.plugins.remove(&id) else { return Ok(()) };
        table.by_name.remove(&plugin.name);
        self.calls.unlink.call(&mut [Arg::Handle(plugin.handle)], RetType::I64).map(|_| ())
    }

    /// Call the plugin `id` with `args` (at most [`MAX_INT_ARGS`] integer, pointer or buffer arguments and
    /// [`MAX_FLOAT_ARGS`] float ones, passed as the C function's parameters in order), reading its result as `ret`.
    /// A plugin that faults is unlinked, with those that call it: [`RuntimeError::PluginFault`].
    pub fn call(&self, id: PluginId, args: &mut [Arg<'_>], ret: RetType) -> Result<Value, RuntimeError> {
        let (ints, floats) = args.iter().fold((0, 0), |(i, f), a| match a {
            Arg::F64(_) | Arg::F32(_) => (i, f + 1),
            _ => (i + 1, f),
        });
        if ints > MAX_INT_ARGS || floats > MAX_FLOAT_ARGS {
            return Err(RuntimeError::BadArguments {
                what: format!("call of plugin #{}", id.0),
                reason: format!(
                    "{ints} integer and {floats} float arguments; a plugin takes at most {MAX_INT_ARGS} and \
                     {MAX_FLOAT_ARGS}"
                ),
            });
        }
        let fault = {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            let Some(plugin) = table.plugins.get(&id) else {
                return Err(RuntimeError::StalePlugin { runtime: self.name.clone(), id: id.0 });
            };
            if !plugin.linked {
                return Err(RuntimeError::Unlinked { runtime: self.name.clone(), plugin: plugin.name.clone() });
            }
            let mut full: Vec<Arg<'_>> = Vec::with_capacity(args.len() + 1);
            full.push(Arg::Handle(plugin.handle));
            full.extend(args.iter_mut().map(Arg::reborrow));
            match plugin.call.call(&mut full, ret) {
                Ok(value) => {
                    drop(table);
                    self.maybe_snapshot();
                    return Ok(value);
                }
                Err(ward::Error::Fault(fault)) => (plugin.name.clone(), fault),
                Err(e) => return Err(e.into()),
            }
        };
        let (plugin, fault) = fault;
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let mut unlinked = Vec::new();
        for victim in table.with_users(&plugin) {
            if let Some(p) = table.plugins.get(&victim) {
                unlinked.push(p.name.clone());
            }
            // The runtime may be disabled by now; the plugin leaves the namespace all the same.
            if let Err(e) = self.free(&mut table, victim) {
                tracing::warn!(runtime = %self.name, error = %e, "unlinking a failed plugin");
            }
        }
        tracing::warn!(runtime = %self.name, %plugin, %fault, unlinked = ?unlinked, "plugin failed and was unlinked");
        Err(RuntimeError::PluginFault { plugin, fault: Box::new(fault), unlinked })
    }

    /// The heap's bytes now (what a snapshot saves).
    pub fn heap(&self) -> Result<Vec<u8>, RuntimeError> {
        let mut bytes = vec![0u8; usize::try_from(self.heap_bytes).unwrap_or(usize::MAX)];
        let len = bytes.len() as u64;
        self.calls
            .heap_save
            .call(&mut [Arg::Handle(self.handle), Arg::Out(&mut bytes), Arg::U64(len)], RetType::I64)?;
        Ok(bytes)
    }

    /// Save the heap now, as the snapshot a recovery restores.
    pub fn snapshot(&self) -> Result<(), RuntimeError> {
        self.ext.exclusively(|| {
            let bytes = self.heap()?;
            let len = bytes.len() as u64;
            let args = [Arg::Handle(self.handle), Arg::In(&bytes), Arg::U64(len)];
            self.calls.heap_restore.record_checkpoint(&args, RetType::I64)?;
            *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            Ok(())
        })
    }

    /// After a call: save the heap when the policy's checkpoint period has passed since the last save.
    fn maybe_snapshot(&self) {
        let period = self.snapshot_period;
        if period.is_zero() || self.heap_bytes == 0 {
            return;
        }
        if self.snapshot.lock().unwrap_or_else(|e| e.into_inner()).elapsed() < period {
            return;
        }
        if let Err(e) = self.snapshot() {
            tracing::warn!(runtime = %self.name, error = %e, "cannot save the runtime's heap");
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Frees the runtime in its domain: what matters where several share one (isolation none, a group).
        if let Err(e) = self.close.call(&mut [Arg::Handle(self.handle)], RetType::I64) {
            tracing::debug!(runtime = %self.name, error = %e, "closing the runtime");
        }
    }
}

/// The adapter a runtime's domain runs. An mpk domain takes code only through ward's loader, never the dynamic
/// linker, so a runtime whose domain will be mpk (asked for, or `auto` on a processor with protection keys) runs the
/// adapter built without shared objects: `Code::Shared` is then a compile error saying so.
fn adapter_for(supervisor: &Supervisor, name: &str, isolation: Option<Isolation>) -> &'static str {
    match isolation.unwrap_or_else(|| supervisor.policy().for_extension(name).isolation) {
        Isolation::Mpk => ADAPTER_MPK,
        Isolation::Auto if ward::mpk_available() => ADAPTER_MPK,
        _ => ADAPTER,
    }
}

/// The text the adapter wrote into a report buffer (up to its first NUL).
fn text_of(report: &[u8]) -> String {
    let end = report.iter().position(|&b| b == 0).unwrap_or(report.len());
    String::from_utf8_lossy(&report[..end]).into_owned()
}

/// A name the adapter accepts, a C identifier of at most [`MAX_NAME`] bytes, as the C string it is passed as.
fn c_identifier(name: &str, what: &str) -> Result<CString, RuntimeError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().enumerate().all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
    let bad = || RuntimeError::BadArguments {
        what: format!("{name:?}"),
        reason: format!(
            "{what} is a C identifier: letters, digits and '_', at most {MAX_NAME} bytes, not starting with a digit"
        ),
    };
    // An identifier has no NUL byte, so the C string cannot fail; `bad` covers it all the same.
    if ok {
        CString::new(name).map_err(|_| bad())
    } else {
        Err(bad())
    }
}
