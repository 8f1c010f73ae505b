//! Modules, instances and calls: the wasm host side of the transform ABI.
//!
//! Memory: the host places the images in the instance's linear memory itself, in a bump region that starts at the
//! module's `__heap_base` (past its data and its stack) and is reused from its start by every call: the input at
//! the first 16-byte boundary, the output right after it, the memory grown (never shrunk) until both fit. The
//! plugins allocate nothing, so no allocator has to be linked into them or exported, and the host needs no call
//! into the module before the transform's own. The region is the plugin's to scribble on, as a native plugin's
//! buffers are; all the host trusts is the bounds of the memory, which wasmtime keeps.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use wasmtime::{
    Config, Engine, ExternType, Instance, Memory, Module, OptLevel, Store, StoreLimits, StoreLimitsBuilder, Trap,
    TypedFunc, ValType,
};

use crate::compiler::WasmBinary;
use crate::image::{pixel_bytes, side_ok, Image, IMAGE_HEADER_BYTES};
use crate::ticker::Ticker;

/// A wasm page.
const PAGE_BYTES: u64 = 65536;
/// The most a wasm32 memory can address.
const WASM32_MEMORY_BYTES: u64 = 1 << 32;

/// How a runtime runs its plugins.
#[derive(Debug, Clone)]
pub struct WasmConfig {
    /// How long one call may run before it is interrupted with [`CallError::Timeout`]. A call runs at least this
    /// long, and at most about a tenth more (one tick of the epoch) before it is interrupted.
    pub quantum: Duration,
    /// The most linear memory one plugin's instance may have (its data, its stack, and the images of a call).
    pub max_memory_bytes: usize,
}

impl Default for WasmConfig {
    fn default() -> Self {
        Self { quantum: Duration::from_secs(1), max_memory_bytes: 1 << 30 }
    }
}

/// What went wrong making a module or an instance.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("wasmtime engine: {0}")]
    Engine(String),
    #[error("starting the epoch ticker thread: {0}")]
    Ticker(#[source] std::io::Error),
    #[error("module {name}: {message}")]
    Module { name: String, message: String },
    /// The module does not export a function named like the plugin, with a signature the host knows.
    #[error("module {name} exports no function {name} of the transform ABI or the null ABI ({found})")]
    NoEntry { name: String, found: String },
    #[error("module {name} exports no memory named \"memory\"")]
    NoMemory { name: String },
    /// wasmtime refused to instantiate, e.g. for an import (WASI or anything else) this host does not offer.
    #[error("instantiating {name}: {message}")]
    Instantiate { name: String, message: String },
}

/// What went wrong in a call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no plugin {0} is linked")]
    NotLinked(String),
    /// The call ran past its quantum and was interrupted; the instance was re-created.
    #[error("{name} ran past its quantum of {quantum:?} and was interrupted")]
    Timeout { name: String, quantum: Duration },
    /// The call trapped; the instance was re-created.
    #[error("{name} trapped: {message}")]
    Trap {
        name: String,
        code: Trap,
        /// wasmtime's message for the trap, e.g. `wasm trap: out of bounds memory access`.
        message: String,
        /// The message with the wasm backtrace wasmtime gives (functions and code offsets), several lines.
        detail: String,
    },
    /// The transform returned a negative number: it refused its arguments.
    #[error("{name} refused the image (returned {code})")]
    Refused { name: String, code: i64 },
    /// The transform claims to have written more than it was offered.
    #[error("{name} returned {returned} bytes written, more than the {capacity} it was offered")]
    OutputTooLong { name: String, returned: i64, capacity: u64 },
    /// The output's header does not describe an image of the length returned.
    #[error("{name} wrote a malformed output: {reason}")]
    MalformedOutput { name: String, reason: String },
    /// The image and the output do not fit in the memory the plugin may have.
    #[error("{name} would need {needed} bytes of linear memory for this image, past its limit of {limit}")]
    MemoryExhausted { name: String, needed: u64, limit: u64 },
    /// The call is not of the plugin's kind (a transform called as a null plugin, or the reverse).
    #[error("{name} is a {kind:?} plugin")]
    WrongKind { name: String, kind: PluginKind },
    /// The plugin has no instance: re-creating it after an earlier failure failed.
    #[error("{0}")]
    Instance(#[from] LoadError),
    /// wasmtime failed the call for a reason other than a trap.
    #[error("{name}: {message}")]
    Host { name: String, message: String },
}

/// Which ABI a plugin's export has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// `int64_t NAME(const uint8_t *in, int64_t width, int64_t height, uint8_t *out, int64_t out_capacity)`.
    Transform,
    /// `int64_t NAME(void)`, for timing a call by itself.
    Null,
}

type TransformFn = TypedFunc<(i32, i64, i64, i32, i64), i64>;
type NullFn = TypedFunc<(), i64>;

/// A module compiled to machine code, not yet instantiated.
#[derive(Clone)]
pub struct WasmModule {
    name: String,
    kind: PluginKind,
    module: Module,
}

impl WasmModule {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn kind(&self) -> PluginKind {
        self.kind
    }
}

impl std::fmt::Debug for WasmModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmModule").field("name", &self.name).field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// The engine, the epoch ticker and the plugins linked by name.
pub struct WasmRuntime {
    engine: Engine,
    config: WasmConfig,
    /// Epoch deadline of each call, in ticks from its start.
    deadline_ticks: u64,
    ticker: Arc<Ticker>,
    plugins: RwLock<HashMap<String, Arc<WasmPlugin>>>,
}

impl std::fmt::Debug for WasmRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmRuntime").field("config", &self.config).finish_non_exhaustive()
    }
}

impl WasmRuntime {
    pub fn new(config: WasmConfig) -> Result<Self, LoadError> {
        let mut engine_config = Config::new();
        engine_config.epoch_interruption(true).cranelift_opt_level(OptLevel::Speed);
        let engine = Engine::new(&engine_config).map_err(|e| LoadError::Engine(e.to_string()))?;
        // A tenth of the quantum, between 1 ms and 100 ms: fine enough that a call is interrupted soon after its
        // quantum, coarse enough that the ticker costs nothing next to the calls it times.
        let tick = (config.quantum / 10).clamp(Duration::from_millis(1), Duration::from_millis(100));
        // The first tick after a call starts may come at once (the ticker was already running for another call),
        // so one tick more than the quantum holds keeps every call running for at least its quantum.
        let quantum_ticks = config.quantum.as_nanos().div_ceil(tick.as_nanos());
        let deadline_ticks = u64::try_from(quantum_ticks).unwrap_or(u64::MAX - 1).saturating_add(1);
        let ticker = Arc::new(Ticker::start(engine.clone(), tick).map_err(LoadError::Ticker)?);
        Ok(Self { engine, config, deadline_ticks, ticker, plugins: RwLock::new(HashMap::new()) })
    }

    pub fn config(&self) -> &WasmConfig {
        &self.config
    }

    /// Compiles a binary to machine code (wasmtime's `Module::new`) and checks that it exports its plugin's
    /// function and its memory.
    pub fn compile_module(&self, binary: &WasmBinary) -> Result<WasmModule, LoadError> {
        let name = binary.name().to_owned();
        let module = Module::new(&self.engine, binary.bytes())
            .map_err(|e| LoadError::Module { name: name.clone(), message: e.to_string() })?;
        let kind = entry_kind(&module, &name)?;
        if !matches!(module.get_export("memory"), Some(ExternType::Memory(_))) {
            return Err(LoadError::NoMemory { name });
        }
        Ok(WasmModule { name, kind, module })
    }

    /// Instantiates a module into a plugin with a store of its own, not linked under its name (see
    /// [`WasmRuntime::link_plugin`]).
    pub fn instantiate(&self, module: &WasmModule) -> Result<WasmPlugin, LoadError> {
        let mut plugin = WasmPlugin {
            module: module.clone(),
            engine: self.engine.clone(),
            ticker: Arc::clone(&self.ticker),
            quantum: self.config.quantum,
            deadline_ticks: self.deadline_ticks,
            max_memory_bytes: self.config.max_memory_bytes,
            instance: Mutex::new(None),
        };
        let instance = plugin.new_instance()?;
        *plugin.instance.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(instance);
        Ok(plugin)
    }

    /// Compiles, instantiates and links a binary under its name; see [`WasmRuntime::link_plugin`].
    pub fn link(&self, binary: &WasmBinary) -> Result<Arc<WasmPlugin>, LoadError> {
        let module = self.compile_module(binary)?;
        let plugin = self.instantiate(&module)?;
        Ok(self.link_plugin(plugin))
    }

    /// Links a plugin under its name, replacing any plugin of that name: calls already in the old one finish
    /// there, later calls by name reach the new one.
    pub fn link_plugin(&self, plugin: WasmPlugin) -> Arc<WasmPlugin> {
        let plugin = Arc::new(plugin);
        let mut plugins = self.plugins.write().unwrap_or_else(PoisonError::into_inner);
        plugins.insert(plugin.name().to_owned(), Arc::clone(&plugin));
        plugin
    }

    /// Unlinks the plugin of that name; it ends when its last call does.
    pub fn unlink(&self, name: &str) -> Option<Arc<WasmPlugin>> {
        self.plugins.write().unwrap_or_else(PoisonError::into_inner).remove(name)
    }

    pub fn plugin(&self, name: &str) -> Option<Arc<WasmPlugin>> {
        self.plugins.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }

    /// The names of the linked plugins, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.plugins.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect();
        names.sort();
        names
    }

    /// Calls the transform linked under `name`.
    pub fn transform(&self, name: &str, input: &Image) -> Result<Image, CallError> {
        let plugin = self.plugin(name).ok_or_else(|| CallError::NotLinked(name.to_owned()))?;
        plugin.transform(input)
    }
}

/// One plugin: its module and its one instance, whose store a mutex guards so that calls may come from many
/// threads (one at a time per plugin; plugins run in parallel).
pub struct WasmPlugin {
    module: WasmModule,
    engine: Engine,
    ticker: Arc<Ticker>,
    quantum: Duration,
    deadline_ticks: u64,
    max_memory_bytes: usize,
    /// `None` only after a failed call whose instance could not be re-created; the next call tries again.
    instance: Mutex<Option<PluginInstance>>,
}

impl std::fmt::Debug for WasmPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmPlugin").field("module", &self.module).finish_non_exhaustive()
    }
}

impl WasmPlugin {
    pub fn name(&self) -> &str {
        &self.module.name
    }

    pub fn kind(&self) -> PluginKind {
        self.module.kind
    }

    /// Calls a null plugin (`int64_t NAME(void)`) and returns what it returns: the cost of a call with no copy.
    pub fn call_null(&self) -> Result<i64, CallError> {
        let mut guard = self.lock();
        let PluginInstance { store, entry, .. } = self.ready(&mut guard)?;
        let Entry::Null(entry) = entry else {
            return Err(CallError::WrongKind { name: self.name().to_owned(), kind: self.kind() });
        };
        store.set_epoch_deadline(self.deadline_ticks);
        let result = {
            let _in_flight = self.ticker.call();
            entry.call(&mut *store, ())
        };
        result.map_err(|error| self.failed(&mut guard, &error))
    }

    /// Calls a transform: copies the input into the instance's memory, calls, checks the length returned and the
    /// header, and copies the output out.
    pub fn transform(&self, input: &Image) -> Result<Image, CallError> {
        self.transform_pixels(input.pixels(), input.width(), input.height())
    }

    /// [`WasmPlugin::transform`] of an image the caller holds as pixels (`width * height * 3` bytes), so a host
    /// with images of its own type copies them only into the instance's memory.
    pub fn transform_pixels(&self, pixels: &[u8], width: u32, height: u32) -> Result<Image, CallError> {
        let name = self.name();
        if pixel_bytes(width, height) != Some(pixels.len()) {
            return Err(CallError::Host {
                name: name.to_owned(),
                message: format!("{} bytes of pixels for a {width}x{height} image", pixels.len()),
            });
        }
        let mut guard = self.lock();
        let PluginInstance { store, entry, memory, heap_base, .. } = self.ready(&mut guard)?;
        let Entry::Transform(entry) = entry else {
            return Err(CallError::WrongKind { name: name.to_owned(), kind: self.kind() });
        };

        let in_len = pixels.len() as u64;
        let capacity = (IMAGE_HEADER_BYTES + pixels.len()) as u64;
        let in_at = align16(*heap_base);
        let out_at = align16(in_at + in_len);
        let end = out_at + capacity;
        let limit = (self.max_memory_bytes as u64).min(WASM32_MEMORY_BYTES);
        if end > limit {
            return Err(CallError::MemoryExhausted { name: name.to_owned(), needed: end, limit });
        }
        let size = memory.data_size(&*store) as u64;
        if end > size {
            let pages = (end - size).div_ceil(PAGE_BYTES);
            memory.grow(&mut *store, pages).map_err(|_| CallError::MemoryExhausted {
                name: name.to_owned(),
                needed: end,
                limit,
            })?;
        }
        // In range: `end` fits the memory just grown, and addresses below 2^32 fit a usize on a 64-bit host.
        let Some(input_region) = memory.data_mut(&mut *store).get_mut(in_at as usize..(in_at + in_len) as usize) else {
            return Err(CallError::MemoryExhausted { name: name.to_owned(), needed: end, limit });
        };
        input_region.copy_from_slice(pixels);

        store.set_epoch_deadline(self.deadline_ticks);
        let result = {
            let _in_flight = self.ticker.call();
            // Addresses are wasm32's unsigned 32-bit ones; `as i32` keeps their bits, as the ABI's pointers do.
            entry.call(&mut *store, (in_at as i32, width.into(), height.into(), out_at as i32, capacity as i64))
        };
        let returned = match result {
            Ok(returned) => returned,
            Err(error) => return Err(self.failed(&mut guard, &error)),
        };

        if returned < 0 {
            return Err(CallError::Refused { name: name.to_owned(), code: returned });
        }
        if returned as u64 > capacity {
            return Err(CallError::OutputTooLong { name: name.to_owned(), returned, capacity });
        }
        let malformed = |reason: String| CallError::MalformedOutput { name: name.to_owned(), reason };
        let output = memory
            .data(&*store)
            .get(out_at as usize..(out_at + returned as u64) as usize)
            .ok_or_else(|| malformed("output outside the memory".into()))?;
        let (header, pixels) = output
            .split_at_checked(IMAGE_HEADER_BYTES)
            .ok_or_else(|| malformed(format!("{returned} bytes, shorter than the header")))?;
        let (width, height) = read_header(header);
        if !side_ok(width) || !side_ok(height) {
            return Err(malformed(format!("header says {width}x{height}")));
        }
        // Both sides are in 1..=65536 here, so they fit a u32.
        let (width, height) = (width as u32, height as u32);
        if pixel_bytes(width, height) != Some(pixels.len()) {
            return Err(malformed(format!("header says {width}x{height} but {} bytes of pixels follow", pixels.len())));
        }
        Image::new(width, height, pixels.to_vec()).map_err(|e| malformed(e.to_string()))
    }

    fn lock(&self) -> MutexGuard<'_, Option<PluginInstance>> {
        // A panic while the lock was held can only be the host's own; the instance is re-created by the call that
        // finds it gone, and a poisoned lock holds nothing worse than a finished call left.
        self.instance.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The instance, re-created first if an earlier failure left none.
    fn ready<'g>(&self, guard: &'g mut Option<PluginInstance>) -> Result<&'g mut PluginInstance, CallError> {
        let instance = match guard.take() {
            Some(instance) => instance,
            None => self.new_instance()?,
        };
        Ok(guard.insert(instance))
    }

    /// Classifies a failed call and replaces the instance, whose store may be in any state.
    fn failed(&self, guard: &mut Option<PluginInstance>, error: &wasmtime::Error) -> CallError {
        // When re-creating fails, the plugin is left without an instance and its next call tries again and says why.
        *guard = self.new_instance().ok();
        let name = self.name().to_owned();
        match error.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => CallError::Timeout { name, quantum: self.quantum },
            Some(code) => CallError::Trap {
                name,
                code: *code,
                message: error.root_cause().to_string(),
                detail: format!("{error:#}"),
            },
            None => CallError::Host { name, message: format!("{error:#}") },
        }
    }

    /// A fresh store and instance, its constructors run (under the quantum too).
    fn new_instance(&self) -> Result<PluginInstance, LoadError> {
        let name = self.name();
        let failed = |e: wasmtime::Error| LoadError::Instantiate { name: name.to_owned(), message: format!("{e:#}") };
        let mut instance = PluginInstance::new(&self.engine, &self.module, self.max_memory_bytes)?;
        if let Some(initialize) = instance.initialize.take() {
            instance.store.set_epoch_deadline(self.deadline_ticks);
            let _in_flight = self.ticker.call();
            initialize.call(&mut instance.store, ()).map_err(failed)?;
        }
        Ok(instance)
    }
}

enum Entry {
    Transform(TransformFn),
    Null(NullFn),
}

/// An instance and the store that owns it.
struct PluginInstance {
    store: Store<StoreLimits>,
    entry: Entry,
    memory: Memory,
    /// Where the host's region starts: `__heap_base`, or the memory's initial end when the module does not say.
    heap_base: u64,
    /// The reactor's `_initialize`, until it has been called.
    initialize: Option<TypedFunc<(), ()>>,
}

impl PluginInstance {
    fn new(engine: &Engine, module: &WasmModule, max_memory_bytes: usize) -> Result<Self, LoadError> {
        let name = &module.name;
        let limits = StoreLimitsBuilder::new().memory_size(max_memory_bytes).instances(1).build();
        let mut store = Store::new(engine, limits);
        store.limiter(|limits| limits);
        store.epoch_deadline_trap();
        let instance = Instance::new(&mut store, &module.module, &[])
            .map_err(|e| LoadError::Instantiate { name: name.clone(), message: e.to_string() })?;
        let entry_error = |e: wasmtime::Error| LoadError::Instantiate { name: name.clone(), message: e.to_string() };
        let entry = match module.kind {
            PluginKind::Transform => Entry::Transform(instance.get_typed_func(&mut store, name).map_err(entry_error)?),
            PluginKind::Null => Entry::Null(instance.get_typed_func(&mut store, name).map_err(entry_error)?),
        };
        let memory =
            instance.get_memory(&mut store, "memory").ok_or_else(|| LoadError::NoMemory { name: name.clone() })?;
        let heap_base = instance
            .get_global(&mut store, "__heap_base")
            .and_then(|global| global.get(&mut store).i32())
            // The global holds a wasm32 address: its bits are unsigned.
            .map(|base| u64::from(base as u32))
            .unwrap_or_else(|| memory.data_size(&store) as u64);
        // A module without `_initialize` has no constructors to run; one whose `_initialize` has another signature
        // is not a reactor this host knows.
        let initialize = match instance.get_func(&mut store, "_initialize") {
            Some(func) => Some(func.typed(&store).map_err(entry_error)?),
            None => None,
        };
        Ok(Self { store, entry, memory, heap_base, initialize })
    }
}

/// The kind of the function the module exports under the plugin's name.
fn entry_kind(module: &Module, name: &str) -> Result<PluginKind, LoadError> {
    let no_entry = |found: String| LoadError::NoEntry { name: name.to_owned(), found };
    let Some(export) = module.get_export(name) else {
        return Err(no_entry("no such export".into()));
    };
    let ExternType::Func(func) = export else {
        return Err(no_entry("an export that is not a function".into()));
    };
    let params: Vec<ValType> = func.params().collect();
    let results: Vec<ValType> = func.results().collect();
    let is = |types: &[ValType], want: &[ValType]| {
        types.len() == want.len() && types.iter().zip(want).all(|(t, w)| ValType::eq(t, w))
    };
    if is(&results, &[ValType::I64]) {
        if is(&params, &[ValType::I32, ValType::I64, ValType::I64, ValType::I32, ValType::I64]) {
            return Ok(PluginKind::Transform);
        }
        if params.is_empty() {
            return Ok(PluginKind::Null);
        }
    }
    Err(no_entry(format!("found {func}")))
}

fn align16(address: u64) -> u64 {
    address.div_ceil(16) * 16
}

fn read_header(header: &[u8]) -> (i64, i64) {
    let field = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&header[at..at + 8]);
        i64::from_le_bytes(bytes)
    };
    (field(0), field(8))
}
