//! The plugin ABIs called directly, in this process, as a host without ward calls them: the structs of
//! `include/ward_ladspa_abi.h`, `include/ward_frei0r_abi.h` and `include/ward_lv2_abi.h` read through the plugin's
//! pointers, and the plugin's functions called through the pointers it gives (LV2's in [`lv2`]). Every unsafe call into a plugin, of any host in the workspace
//! that calls plugins natively (the campaign's native runs, the corpus's native runner), is here.
//!
//! Nothing here can make a plugin safe to call. A native host trusts the plugin to keep its ABI (descriptors that
//! point where they should, functions that do what they say); a mutated or broken plugin breaks that trust, and
//! seeing what that does to a host is the point of a native run, which is why such runs are in throwaway
//! processes. What this module does keep is the host's side of the ABI: every buffer it hands a plugin is valid, as
//! large as the ABI says, aligned as plugins expect (16 bytes), and alive for as long as the plugin may use it.
//!
//! Plugins are read as the class adapters read them (`crates/ward-classes/adapters`): a NULL string is empty, a
//! string is read up to 64 KiB, a missing port array reads as zeros. A library is found through a symbol lookup
//! (dlsym, or a trial host's loader); it must stay loaded for as long as anything from it is used.

use std::ffi::c_char;

pub mod lv2;

/// Longest string read from a plugin, as the adapters read them.
const MAX_STRING: usize = 65536;

/// A string of the plugin's: empty when NULL, at most [`MAX_STRING`] bytes, invalid UTF-8 replaced.
fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    let mut len = 0;
    // SAFETY: the plugin's ABI makes `p` a NUL-terminated string (see the module's note on trust); the loop reads
    // no further than its NUL or MAX_STRING bytes.
    while len < MAX_STRING && unsafe { *p.add(len) } != 0 {
        len += 1;
    }
    // SAFETY: the `len` bytes at `p` were just read by the loop.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Sixteen pixels' worth of alignment: what hosts give plugins that use aligned vector loads.
#[repr(C, align(16))]
#[derive(Clone, Copy, Default)]
struct Quad([u32; 4]);

/// A buffer of 32-bit words (samples as `f32` bits, or pixels) for a plugin, 16-byte aligned, optionally between
/// margins the plugin is not given (to see whether it reads or writes past its buffer).
pub struct Words {
    quads: Vec<Quad>,
    /// Words before the plugin's part, a multiple of 4 (so the part stays 16-byte aligned).
    margin: usize,
    len: usize,
}

impl Words {
    pub fn new(len: usize) -> Words {
        Words::padded(len, 0)
    }

    /// `len` words for the plugin, with at least `margin` words before and after them (rounded up to a multiple
    /// of 4, which keeps the plugin's part 16-byte aligned).
    pub fn padded(len: usize, margin: usize) -> Words {
        let margin = margin.next_multiple_of(4);
        Words { quads: vec![Quad::default(); (len + 2 * margin).div_ceil(4).max(1)], margin, len }
    }

    /// The words the plugin is given.
    pub fn words(&self) -> &[u32] {
        &self.all()[self.margin..self.margin + self.len]
    }

    pub fn words_mut(&mut self) -> &mut [u32] {
        let (margin, len) = (self.margin, self.len);
        &mut self.all_mut()[margin..margin + len]
    }

    /// Every word of the buffer: the margin before, the plugin's words from [`Words::margin`], then the rest.
    pub fn all(&self) -> &[u32] {
        // SAFETY: `Quad` is `repr(C)` over `[u32; 4]`, so the quads are `4 * quads.len()` contiguous, initialised
        // `u32`s, borrowed as long as `self`.
        unsafe { std::slice::from_raw_parts(self.quads.as_ptr().cast::<u32>(), 4 * self.quads.len()) }
    }

    pub fn all_mut(&mut self) -> &mut [u32] {
        // SAFETY: `Quad` is `repr(C)` over `[u32; 4]`, so the quads are `4 * quads.len()` contiguous, initialised
        // `u32`s (any bit pattern is a valid `u32`), borrowed mutably as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.quads.as_mut_ptr().cast::<u32>(), 4 * self.quads.len()) }
    }

    /// Where the plugin's words start in [`Words::all`].
    pub fn margin(&self) -> usize {
        self.margin
    }

    pub fn floats(&self) -> Vec<f32> {
        self.words().iter().map(|&w| f32::from_bits(w)).collect()
    }

    pub fn set_floats(&mut self, values: &[f32]) {
        for (w, v) in self.words_mut().iter_mut().zip(values) {
            *w = v.to_bits();
        }
    }

    fn as_ptr(&self) -> *const u32 {
        self.words().as_ptr()
    }

    fn as_mut_ptr(&mut self) -> *mut u32 {
        self.words_mut().as_mut_ptr()
    }
}

/// LADSPA (`ladspa.h`): a library's descriptors, and instances of its plugins.
pub mod ladspa {
    use std::ffi::{c_ulong, c_void};

    use super::{text, Words};
    use crate::abi::LadspaDescriptor as RawDescriptor;
    use crate::error::NativeCallError;
    use crate::ladspa::{Descriptor, Port};

    /// More descriptors than any LADSPA library has: a guard against one that never returns NULL (the adapter's).
    pub const MAX_DESCRIPTORS: usize = 4096;
    /// Plugins with more ports are refused by [`Plugin::describe`] (the LADSPA class's bound).
    pub const MAX_PORTS: usize = crate::ladspa::MAX_PORTS as usize;

    type DescriptorFn = unsafe extern "C" fn(c_ulong) -> *const RawDescriptor;

    /// The optional functions of a LADSPA descriptor.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Entry {
        Instantiate,
        ConnectPort,
        Activate,
        Run,
        RunAdding,
        Deactivate,
        Cleanup,
    }

    /// A LADSPA library loaded into this process: its `ladspa_descriptor`.
    pub struct Library {
        descriptor: DescriptorFn,
    }

    impl Library {
        /// The library whose `ladspa_descriptor` is at `address`; an error when it is NULL.
        ///
        /// # Safety
        /// A non-null `address` is the `ladspa_descriptor` of a library that stays loaded for as long as the
        /// returned value and everything from it are used.
        pub unsafe fn from_entry(address: *const c_void) -> Result<Library, NativeCallError> {
            if address.is_null() {
                return Err(NativeCallError::NullEntry { symbol: "ladspa_descriptor" });
            }
            // SAFETY: `address` is the library's non-null `ladspa_descriptor` (the caller's contract), which
            // ladspa.h declares as `const LADSPA_Descriptor *ladspa_descriptor(unsigned long)`: `DescriptorFn`.
            let descriptor = unsafe { std::mem::transmute::<*const c_void, DescriptorFn>(address) };
            Ok(Library { descriptor })
        }

        /// The library whose symbols `lookup` finds (`None` for a missing one).
        ///
        /// # Safety
        /// As [`Library::from_entry`], for what `lookup` returns for `ladspa_descriptor`.
        pub unsafe fn from_lookup(lookup: impl Fn(&str) -> Option<*const c_void>) -> Result<Library, NativeCallError> {
            let address =
                lookup("ladspa_descriptor").ok_or(NativeCallError::NotExported { symbol: "ladspa_descriptor" })?;
            // SAFETY: the caller's contract is this function's.
            unsafe { Library::from_entry(address) }
        }

        /// Plugin `index`, or `None` past the last.
        pub fn plugin(&self, index: usize) -> Option<Plugin<'_>> {
            // SAFETY: calls `ladspa_descriptor` with its declared type (see `from_entry`); it returns NULL or a
            // descriptor that stays valid while the library is loaded, which is as long as `self` (the contract
            // of `from_entry`).
            let raw = unsafe { (self.descriptor)(index as c_ulong).as_ref() };
            raw.map(|raw| Plugin { raw })
        }

        /// How many plugins the library has: descriptors until the first NULL, as the adapter counts them.
        pub fn count(&self) -> usize {
            (0..MAX_DESCRIPTORS).find(|&i| self.plugin(i).is_none()).unwrap_or(MAX_DESCRIPTORS)
        }
    }

    /// One plugin of a library: a view of its descriptor.
    #[derive(Clone, Copy)]
    pub struct Plugin<'l> {
        raw: &'l RawDescriptor,
    }

    impl<'l> Plugin<'l> {
        pub fn unique_id(&self) -> u64 {
            self.raw.unique_id
        }

        pub fn label(&self) -> String {
            text(self.raw.label)
        }

        pub fn name(&self) -> String {
            text(self.raw.name)
        }

        pub fn maker(&self) -> String {
            text(self.raw.maker)
        }

        pub fn copyright(&self) -> String {
            text(self.raw.copyright)
        }

        pub fn properties(&self) -> i32 {
            self.raw.properties
        }

        /// `PortCount`, as the plugin says.
        pub fn port_count(&self) -> usize {
            self.raw.port_count as usize
        }

        /// Whether the descriptor has the array of port flags and the array of range hints.
        pub fn has_port_arrays(&self) -> bool {
            !self.raw.port_descriptors.is_null() && !self.raw.port_range_hints.is_null()
        }

        /// The `PORT_*` flags of port `p`: 0 without the array or past the last port.
        pub fn port_flags(&self, p: usize) -> i32 {
            let d = self.raw;
            if d.port_descriptors.is_null() || p >= self.port_count() {
                return 0;
            }
            // SAFETY: the array holds `port_count` elements (ladspa.h); `p` is below it.
            unsafe { *d.port_descriptors.add(p) }
        }

        /// The range hint of port `p` (hint flags, lower, upper): zeros without the array or past the last port.
        pub fn port_hint(&self, p: usize) -> (i32, f32, f32) {
            let d = self.raw;
            if d.port_range_hints.is_null() || p >= self.port_count() {
                return (0, 0.0, 0.0);
            }
            // SAFETY: the array holds `port_count` elements (ladspa.h); `p` is below it.
            let h = unsafe { &*d.port_range_hints.add(p) };
            (h.hint, h.lower, h.upper)
        }

        /// The name of port `p`: empty without the array or past the last port.
        pub fn port_name(&self, p: usize) -> String {
            let d = self.raw;
            if d.port_names.is_null() || p >= self.port_count() {
                return String::new();
            }
            // SAFETY: the array holds `port_count` elements (ladspa.h); `p` is below it.
            text(unsafe { *d.port_names.add(p) })
        }

        /// Port `p`, read as the adapter reads it.
        pub fn port(&self, p: usize) -> Port {
            let (hint, lower, upper) = self.port_hint(p);
            Port { descriptor: self.port_flags(p), name: self.port_name(p), hint, lower, upper }
        }

        /// Whether the plugin provides `function`.
        pub fn has(&self, function: Entry) -> bool {
            let r = self.raw;
            match function {
                Entry::Instantiate => r.instantiate.is_some(),
                Entry::ConnectPort => r.connect_port.is_some(),
                Entry::Activate => r.activate.is_some(),
                Entry::Run => r.run.is_some(),
                Entry::RunAdding => r.run_adding.is_some(),
                Entry::Deactivate => r.deactivate.is_some(),
                Entry::Cleanup => r.cleanup.is_some(),
            }
        }

        /// The plugin's descriptor, read as the adapter reads it; `index` is its place in the library. Unlike the
        /// class (`ladspa::Descriptor::parse`), nothing the plugin says is checked for plausibility but its port
        /// count: a native host believes the plugin, and a native run is there to show what that costs.
        pub fn describe(&self, index: usize) -> Result<Descriptor, NativeCallError> {
            let d = self.raw;
            if self.port_count() > MAX_PORTS {
                return Err(NativeCallError::TooManyPorts { index, count: d.port_count });
            }
            Ok(Descriptor {
                index,
                unique_id: d.unique_id,
                label: self.label(),
                properties: d.properties,
                name: self.name(),
                maker: self.maker(),
                copyright: self.copyright(),
                ports: (0..self.port_count()).map(|p| self.port(p)).collect(),
                has_activate: d.activate.is_some(),
                has_deactivate: d.deactivate.is_some(),
                has_run: d.run.is_some(),
                has_run_adding: d.run_adding.is_some(),
                has_set_run_adding_gain: d.set_run_adding_gain.is_some(),
            })
        }

        /// An instance at `sample_rate`, no port connected yet.
        pub fn instantiate(&self, sample_rate: u64) -> Result<Instance<'l>, NativeCallError> {
            let d = self.raw;
            let instantiate = d.instantiate.ok_or(NativeCallError::NoFunction { function: "instantiate" })?;
            let connect = d.connect_port.ok_or(NativeCallError::NoFunction { function: "connect_port" })?;
            // SAFETY: a descriptor's `instantiate` takes the descriptor itself and the sample rate (ladspa.h).
            let handle = unsafe { instantiate(d, sample_rate as c_ulong) };
            if handle.is_null() {
                return Err(NativeCallError::InstantiateReturnedNull);
            }
            Ok(Instance { plugin: *self, connect, handle, ports: Vec::new(), live: true })
        }
    }

    /// A port's buffer, connected.
    struct Connected {
        buffer: Words,
        /// The port's `PORT_*` flags.
        flags: i32,
    }

    /// An instance of a LADSPA plugin with the buffers connected to its ports; cleaned up when dropped.
    pub struct Instance<'l> {
        plugin: Plugin<'l>,
        connect: unsafe extern "C" fn(*mut c_void, c_ulong, *mut f32),
        handle: *mut c_void,
        /// By port. A buffer's heap block never moves while it is here (`Words` is never resized), so the plugin's
        /// pointer to it stays valid until the instance is cleaned up (its `Drop`), before the buffers go.
        ports: Vec<Option<Connected>>,
        /// Not cleaned up yet, nor abandoned.
        live: bool,
    }

    impl Instance<'_> {
        /// Connect `port` to `buffer`, which the instance keeps (replacing the buffer connected before, if any).
        pub fn connect_port(&mut self, port: usize, mut buffer: Words) -> Result<(), NativeCallError> {
            if port >= self.plugin.port_count() {
                return Err(NativeCallError::NoSuchPort { port, count: self.plugin.port_count() });
            }
            let flags = self.plugin.port_flags(port);
            // SAFETY: `handle` is the live instance `instantiate` returned; `buffer` is kept below, alive and
            // unmoved until the plugin is cleaned up or the port connected elsewhere, and `run` checks that it
            // holds as many values as the plugin is told to use.
            unsafe { (self.connect)(self.handle, port as c_ulong, buffer.as_mut_ptr().cast::<f32>()) };
            if self.ports.len() <= port {
                self.ports.resize_with(port + 1, || None);
            }
            self.ports[port] = Some(Connected { buffer, flags });
            Ok(())
        }

        /// The buffer connected to `port`.
        pub fn buffer(&self, port: usize) -> Option<&Words> {
            self.ports.get(port)?.as_ref().map(|c| &c.buffer)
        }

        pub fn buffer_mut(&mut self, port: usize) -> Option<&mut Words> {
            self.ports.get_mut(port)?.as_mut().map(|c| &mut c.buffer)
        }

        /// `activate`, when the plugin has it.
        pub fn activate(&mut self) {
            if let Some(activate) = self.plugin.raw.activate {
                // SAFETY: `activate` takes the instance's handle (ladspa.h).
                unsafe { activate(self.handle) };
            }
        }

        /// Every port connected to a buffer of at least `samples` values (an audio port) or one (a control port).
        fn check(&self, samples: usize) -> Result<(), NativeCallError> {
            for p in 0..self.plugin.port_count() {
                let c = self.ports.get(p).and_then(Option::as_ref).ok_or(NativeCallError::NotConnected { port: p })?;
                let need = crate::ladspa::values_in_block(c.flags, samples);
                if c.buffer.len < need {
                    return Err(NativeCallError::BufferTooShort { samples, len: c.buffer.len, port: p });
                }
            }
            Ok(())
        }

        /// `run` on a block of `samples` samples.
        pub fn run(&mut self, samples: usize) -> Result<(), NativeCallError> {
            let run = self.plugin.raw.run.ok_or(NativeCallError::NoFunction { function: "run" })?;
            self.check(samples)?;
            // SAFETY: `run` takes the handle and a sample count (ladspa.h); every port is connected to a buffer
            // that holds at least `samples` floats if it is an audio port, one if a control port (checked).
            unsafe { run(self.handle, samples as c_ulong) };
            Ok(())
        }

        /// `run_adding` on a block of `samples` samples.
        pub fn run_adding(&mut self, samples: usize) -> Result<(), NativeCallError> {
            let run_adding =
                self.plugin.raw.run_adding.ok_or(NativeCallError::NoFunction { function: "run_adding" })?;
            self.check(samples)?;
            // SAFETY: `run_adding` takes the handle and a sample count (ladspa.h); every port is connected to a
            // buffer that holds at least `samples` floats if it is an audio port, one if a control port (checked).
            unsafe { run_adding(self.handle, samples as c_ulong) };
            Ok(())
        }

        /// `deactivate`, when the plugin has it.
        pub fn deactivate(&mut self) {
            if let Some(deactivate) = self.plugin.raw.deactivate {
                // SAFETY: `deactivate` takes the instance's handle (ladspa.h).
                unsafe { deactivate(self.handle) };
            }
        }

        /// Give the instance up without calling the plugin again (no `cleanup`): after it misbehaved, say.
        pub fn abandon(mut self) {
            self.live = false;
        }
    }

    impl Drop for Instance<'_> {
        fn drop(&mut self) {
            if !self.live {
                return;
            }
            if let Some(cleanup) = self.plugin.raw.cleanup {
                // SAFETY: `cleanup` takes the handle and ends the instance, which is not used again; the buffers
                // are dropped after it.
                unsafe { cleanup(self.handle) };
            }
        }
    }
}

/// frei0r (`frei0r.h`): a plugin's entry points, what it says about itself, and its instances.
pub mod frei0r {
    use std::ffi::{c_int, c_uint, c_void};

    use super::{text, Words};
    use crate::abi::{F0rParamInfo as RawParamInfo, F0rPluginInfo as RawPluginInfo};
    use crate::error::NativeCallError;
    use crate::frei0r::{ColorModel, ParamInfo, ParamKind, PluginInfo, PluginType};

    /// Parameter counts beyond this are not believed (the frei0r class's and its adapter's).
    const MAX_PARAMS: c_int = crate::frei0r::MAX_PARAMS;

    type InitFn = unsafe extern "C" fn() -> c_int;
    type DeinitFn = unsafe extern "C" fn();
    type GetPluginInfoFn = unsafe extern "C" fn(*mut RawPluginInfo);
    type GetParamInfoFn = unsafe extern "C" fn(*mut RawParamInfo, c_int);
    type ConstructFn = unsafe extern "C" fn(c_uint, c_uint) -> *mut c_void;
    type DestructFn = unsafe extern "C" fn(*mut c_void);
    type UpdateFn = unsafe extern "C" fn(*mut c_void, f64, *const u32, *mut u32);
    type Update2Fn = unsafe extern "C" fn(*mut c_void, f64, *const u32, *const u32, *const u32, *mut u32);

    /// A frei0r plugin loaded into this process: its entry points.
    pub struct Library {
        init: Option<InitFn>,
        deinit: Option<DeinitFn>,
        get_plugin_info: GetPluginInfoFn,
        get_param_info: Option<GetParamInfoFn>,
        construct: Option<ConstructFn>,
        destruct: Option<DestructFn>,
        update: Option<UpdateFn>,
        update2: Option<Update2Fn>,
    }

    /// `address` as a function pointer of type `F`; `None` when NULL.
    ///
    /// # Safety
    /// `F` must be a function pointer type, the C type frei0r.h declares for the symbol at `address`.
    unsafe fn function<F: Copy>(address: Option<*const c_void>) -> Option<F> {
        let address = address.filter(|a| !a.is_null())?;
        // SAFETY: `F` is a function pointer type (the caller's contract), as large as a data pointer.
        Some(unsafe { std::mem::transmute_copy::<*const c_void, F>(&address) })
    }

    impl Library {
        /// The plugin whose symbols `lookup` finds (`None`, or NULL, for a missing one). It must export
        /// `f0r_get_plugin_info`; every other entry point is optional here (see [`Library::exports`]).
        ///
        /// # Safety
        /// What `lookup` returns for a `f0r_*` name is that symbol of a library that stays loaded for as long as
        /// the returned value and everything from it are used.
        pub unsafe fn from_lookup(lookup: impl Fn(&str) -> Option<*const c_void>) -> Result<Library, NativeCallError> {
            // SAFETY: `GetPluginInfoFn` is the declaration of `f0r_get_plugin_info` in frei0r.h
            // (include/ward_frei0r_abi.h), and the address is that function (the caller's contract).
            let get_plugin_info = unsafe { function(lookup("f0r_get_plugin_info")) };
            let get_plugin_info =
                get_plugin_info.ok_or(NativeCallError::NotExported { symbol: "f0r_get_plugin_info" })?;
            // SAFETY: each field's type is the declaration of its function in frei0r.h, and each address is that
            // function (the caller's contract).
            unsafe {
                Ok(Library {
                    init: function(lookup("f0r_init")),
                    deinit: function(lookup("f0r_deinit")),
                    get_plugin_info,
                    get_param_info: function(lookup("f0r_get_param_info")),
                    construct: function(lookup("f0r_construct")),
                    destruct: function(lookup("f0r_destruct")),
                    update: function(lookup("f0r_update")),
                    update2: function(lookup("f0r_update2")),
                })
            }
        }

        /// Whether the plugin exports `symbol` (one of frei0r's entry points; false for any other name).
        pub fn exports(&self, symbol: &str) -> bool {
            match symbol {
                "f0r_init" => self.init.is_some(),
                "f0r_deinit" => self.deinit.is_some(),
                "f0r_get_plugin_info" => true,
                "f0r_get_param_info" => self.get_param_info.is_some(),
                "f0r_construct" => self.construct.is_some(),
                "f0r_destruct" => self.destruct.is_some(),
                "f0r_update" => self.update.is_some(),
                "f0r_update2" => self.update2.is_some(),
                _ => false,
            }
        }

        /// `f0r_init` (once, before anything else of the plugin's): false when it fails; true without one.
        pub fn init(&self) -> bool {
            match self.init {
                // SAFETY: `f0r_init(void) -> int`.
                Some(init) => unsafe { init() != 0 },
                None => true,
            }
        }

        /// `f0r_deinit`, when the plugin has it (after its last instance is gone).
        pub fn deinit(&self) {
            if let Some(deinit) = self.deinit {
                // SAFETY: `f0r_deinit(void)`.
                unsafe { deinit() };
            }
        }

        /// `f0r_get_plugin_info` on a struct whose type and colour model are `unset` until the plugin fills them.
        fn raw_info(&self, unset: c_int) -> RawPluginInfo {
            let mut raw = RawPluginInfo {
                name: std::ptr::null(),
                author: std::ptr::null(),
                plugin_type: unset,
                color_model: unset,
                frei0r_version: 0,
                major_version: 0,
                minor_version: 0,
                num_params: 0,
                explanation: std::ptr::null(),
            };
            // SAFETY: `f0r_get_plugin_info` fills the struct it is given, which is an `f0r_plugin_info_t`.
            unsafe { (self.get_plugin_info)(&mut raw) };
            raw
        }

        /// What the plugin says about itself and its parameters, read as the adapter reads it. Unlike the class
        /// (`frei0r::PluginInfo::parse`), nothing is checked for plausibility: a native host believes the plugin.
        pub fn info(&self) -> PluginInfo {
            let raw = self.raw_info(0);
            let count = if raw.num_params > 0 && raw.num_params <= MAX_PARAMS { raw.num_params } else { 0 };
            let mut params = Vec::new();
            if let Some(get_param_info) = self.get_param_info {
                for p in 0..count {
                    let mut pi = RawParamInfo { name: std::ptr::null(), kind: -1, explanation: std::ptr::null() };
                    // SAFETY: `f0r_get_param_info` fills the `f0r_param_info_t` it is given for parameter `p`,
                    // which is below the count the plugin gave.
                    unsafe { get_param_info(&mut pi, p) };
                    params.push(ParamInfo {
                        name: text(pi.name),
                        kind: ParamKind::from_raw(pi.kind),
                        explanation: text(pi.explanation),
                    });
                }
            }
            PluginInfo {
                name: text(raw.name),
                author: text(raw.author),
                plugin_type: PluginType::from_raw(raw.plugin_type),
                color_model: ColorModel::from_raw(raw.color_model),
                frei0r_version: raw.frei0r_version,
                major_version: raw.major_version,
                minor_version: raw.minor_version,
                explanation: text(raw.explanation),
                params,
                has_update: self.update.is_some(),
                has_update2: self.update2.is_some(),
            }
        }

        /// The plugin's name and raw type (-1 when it leaves the type unset), from `f0r_get_plugin_info` alone.
        pub fn name_and_type(&self) -> (String, i32) {
            let raw = self.raw_info(-1);
            (text(raw.name), raw.plugin_type)
        }

        /// `f0r_construct`: an instance for frames of `width` x `height` pixels.
        pub fn construct(&self, width: u32, height: u32) -> Result<Instance<'_>, NativeCallError> {
            let construct = self.construct.ok_or(NativeCallError::NotExported { symbol: "f0r_construct" })?;
            // SAFETY: `f0r_construct(unsigned width, unsigned height) -> f0r_instance_t`.
            let handle = unsafe { construct(width, height) };
            if handle.is_null() {
                return Err(NativeCallError::ConstructReturnedNull { width, height });
            }
            Ok(Instance { lib: self, handle, pixels: width as usize * height as usize, live: true })
        }
    }

    /// An instance of a frei0r plugin; destructed (when the plugin has `f0r_destruct`) when dropped.
    pub struct Instance<'l> {
        lib: &'l Library,
        handle: *mut c_void,
        pixels: usize,
        /// Not destructed yet, nor abandoned.
        live: bool,
    }

    impl Instance<'_> {
        fn check(&self, frames: &[Option<&Words>], output: &Words) -> Result<(), NativeCallError> {
            let wrong = frames.iter().flatten().chain(std::iter::once(&output)).find(|f| f.len != self.pixels);
            match wrong {
                Some(f) => Err(NativeCallError::FrameSize { len: f.len, pixels: self.pixels }),
                None => Ok(()),
            }
        }

        /// `f0r_update`: `input` is `None` for a source.
        pub fn update(&mut self, time: f64, input: Option<&Words>, output: &mut Words) -> Result<(), NativeCallError> {
            let update = self.lib.update.ok_or(NativeCallError::NotExported { symbol: "f0r_update" })?;
            self.check(&[input], output)?;
            let input = input.map_or(std::ptr::null(), Words::as_ptr);
            // SAFETY: `f0r_update(instance, time, inframe, outframe)`; each frame given holds the instance's
            // width * height pixels (checked above), 16-byte aligned, and outlives the call.
            unsafe { update(self.handle, time, input, output.as_mut_ptr()) };
            Ok(())
        }

        /// `f0r_update2` with up to three input frames (`None` crosses as NULL).
        pub fn update2(
            &mut self,
            time: f64,
            inputs: [Option<&Words>; 3],
            output: &mut Words,
        ) -> Result<(), NativeCallError> {
            let update2 = self.lib.update2.ok_or(NativeCallError::NotExported { symbol: "f0r_update2" })?;
            self.check(&inputs, output)?;
            let [a, b, c] = inputs.map(|f| f.map_or(std::ptr::null(), Words::as_ptr));
            // SAFETY: `f0r_update2(instance, time, inframe1, inframe2, inframe3, outframe)`; each frame given (the
            // others NULL) holds the instance's width * height pixels (checked above), 16-byte aligned, and outlives
            // the call.
            unsafe { update2(self.handle, time, a, b, c, output.as_mut_ptr()) };
            Ok(())
        }

        /// Give the instance up without calling the plugin again (no `f0r_destruct`): after it misbehaved, say.
        pub fn abandon(mut self) {
            self.live = false;
        }
    }

    impl Drop for Instance<'_> {
        fn drop(&mut self) {
            if !self.live {
                return;
            }
            if let Some(destruct) = self.lib.destruct {
                // SAFETY: `f0r_destruct` takes the instance `f0r_construct` returned; it is not used again.
                unsafe { destruct(self.handle) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_aligned_and_as_long_as_asked() {
        for margin in [0, 3, 64] {
            for len in [0, 1, 3, 4, 5, 1024, 3072] {
                let mut w = Words::padded(len, margin);
                assert_eq!(w.words().len(), len);
                assert_eq!(w.as_ptr() as usize % 16, 0);
                assert!(w.margin() >= margin && w.all().len() >= len + 2 * margin);
                w.words_mut().iter_mut().enumerate().for_each(|(i, x)| *x = i as u32 + 1);
                assert!(w.words().iter().enumerate().all(|(i, &x)| x == i as u32 + 1));
                assert!(w.all()[..w.margin()].iter().chain(&w.all()[w.margin() + len..]).all(|&x| x == 0));
            }
        }
        let mut f = Words::new(3);
        f.set_floats(&[0.5, -1.0, 2.0]);
        assert_eq!(f.floats(), [0.5, -1.0, 2.0]);
    }

    #[test]
    fn reads_strings_as_the_adapters_do() {
        assert_eq!(text(std::ptr::null()), "");
        assert_eq!(text(c"amp_mono".as_ptr()), "amp_mono");
        let long = std::ffi::CString::new(vec![b'x'; MAX_STRING + 10]).unwrap();
        assert_eq!(text(long.as_ptr()).len(), MAX_STRING);
    }
}
