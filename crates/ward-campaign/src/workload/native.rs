//! The plugin ABIs called directly, in this process, as a host without ward calls them: the structs of
//! `include/ward_ladspa_abi.h` and `include/ward_frei0r_abi.h` read through the plugin's pointers, and the plugin's
//! functions called through the pointers it gives. The plugin workloads' only unsafe code is here.
//!
//! Nothing here can make a plugin safe to call. A native host trusts the plugin to keep its ABI (descriptors that
//! point where they should, functions that do what they say); a mutated plugin breaks that trust by design, and
//! seeing what that does to a host is the point of the native run, which is why it runs in a throwaway process.
//! What this module does keep is the host's side of the ABI: every buffer it hands a plugin is valid, as large as
//! the ABI says, aligned as plugins expect (16 bytes), and alive for as long as the plugin may use it.
//!
//! Plugins are read as the class adapters read them (`crates/ward-classes/adapters`), so that the native output of
//! an unmutated plugin equals its output under ward: a NULL string is empty, a string is read up to 64 KiB, a
//! missing port array reads as zeros, and the library is never unloaded (nor frei0r's `f0r_deinit` called).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};

use ward_classes::frei0r::{ColorModel, ParamInfo, ParamKind, PluginInfo, PluginType};
use ward_classes::ladspa::{Descriptor, Port, PORT_AUDIO};

use super::Symbols;

/// Longest string read from a plugin, as the adapters read them.
const MAX_STRING: usize = 65536;
/// More descriptors than any LADSPA library has: a guard against one that never returns NULL (the adapter's).
const MAX_DESCRIPTORS: usize = 4096;
/// Plugins with more ports are refused (as the LADSPA class refuses them).
const MAX_PORTS: c_ulong = 4096;
/// Parameter counts beyond this are not believed (the frei0r adapter's).
const MAX_PARAMS: c_int = 1024;

/// A string of the plugin's: empty when NULL, at most [`MAX_STRING`] bytes, invalid UTF-8 replaced.
fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the plugin's ABI makes `p` a NUL-terminated string (see the module's note on trust); strnlen reads
    // no further than its NUL or MAX_STRING bytes.
    let len = unsafe { libc::strnlen(p, MAX_STRING) };
    // SAFETY: the `len` bytes at `p` were just read by strnlen.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Sixteen pixels' worth of alignment: what hosts give plugins that use aligned vector loads.
#[repr(C, align(16))]
#[derive(Clone, Copy, Default)]
struct Quad([u32; 4]);

/// A buffer of 32-bit words (samples as `f32` bits, or pixels), 16-byte aligned.
pub struct Words {
    quads: Vec<Quad>,
    len: usize,
}

impl Words {
    pub fn new(len: usize) -> Words {
        Words { quads: vec![Quad::default(); len.div_ceil(4).max(1)], len }
    }

    pub fn words(&self) -> &[u32] {
        // SAFETY: `Quad` is `repr(C)` over `[u32; 4]`, so the quads are `4 * quads.len() >= len` contiguous,
        // initialised `u32`s, borrowed as long as `self`.
        unsafe { std::slice::from_raw_parts(self.quads.as_ptr().cast::<u32>(), self.len) }
    }

    pub fn words_mut(&mut self) -> &mut [u32] {
        // SAFETY: as in `words`, borrowed mutably as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.quads.as_mut_ptr().cast::<u32>(), self.len) }
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
        self.quads.as_ptr().cast()
    }

    fn as_mut_ptr(&mut self) -> *mut u32 {
        self.quads.as_mut_ptr().cast()
    }
}

// ------------------------------------------------------------------------------------------------------------
// LADSPA
// ------------------------------------------------------------------------------------------------------------

#[repr(C)]
struct RawRangeHint {
    hint: c_int,
    lower: f32,
    upper: f32,
}

/// `LADSPA_Descriptor`.
#[repr(C)]
struct RawDescriptor {
    unique_id: c_ulong,
    label: *const c_char,
    properties: c_int,
    name: *const c_char,
    maker: *const c_char,
    copyright: *const c_char,
    port_count: c_ulong,
    port_descriptors: *const c_int,
    port_names: *const *const c_char,
    port_range_hints: *const RawRangeHint,
    implementation_data: *mut c_void,
    instantiate: Option<unsafe extern "C" fn(*const RawDescriptor, c_ulong) -> *mut c_void>,
    connect_port: Option<unsafe extern "C" fn(*mut c_void, c_ulong, *mut f32)>,
    activate: Option<unsafe extern "C" fn(*mut c_void)>,
    run: Option<unsafe extern "C" fn(*mut c_void, c_ulong)>,
    run_adding: Option<unsafe extern "C" fn(*mut c_void, c_ulong)>,
    set_run_adding_gain: Option<unsafe extern "C" fn(*mut c_void, f32)>,
    deactivate: Option<unsafe extern "C" fn(*mut c_void)>,
    cleanup: Option<unsafe extern "C" fn(*mut c_void)>,
}

type DescriptorFn = unsafe extern "C" fn(c_ulong) -> *const RawDescriptor;

/// A LADSPA library loaded into this process.
pub struct LadspaLibrary {
    descriptor: DescriptorFn,
}

/// One plugin of a library: its descriptor, which the library keeps for as long as it is loaded (for ever here).
pub struct LadspaPlugin {
    raw: *const RawDescriptor,
}

impl LadspaLibrary {
    pub fn resolve(symbols: &dyn Symbols) -> Result<LadspaLibrary, String> {
        let address = symbols.address("ladspa_descriptor")?;
        if address.is_null() {
            return Err("ladspa_descriptor is NULL".into());
        }
        // SAFETY: `address` is the library's non-null `ladspa_descriptor`, which ladspa.h declares as
        // `const LADSPA_Descriptor *ladspa_descriptor(unsigned long)`: `DescriptorFn` is that type.
        let descriptor = unsafe { std::mem::transmute::<*const c_void, DescriptorFn>(address) };
        Ok(LadspaLibrary { descriptor })
    }

    /// Plugin `index`, or `None` past the last.
    pub fn plugin(&self, index: usize) -> Option<LadspaPlugin> {
        // SAFETY: calls `ladspa_descriptor` with its declared type (see `resolve`).
        let raw = unsafe { (self.descriptor)(index as c_ulong) };
        (!raw.is_null()).then_some(LadspaPlugin { raw })
    }

    /// How many plugins the library has: descriptors until the first NULL, as the adapter counts them.
    pub fn count(&self) -> usize {
        (0..MAX_DESCRIPTORS).find(|&i| self.plugin(i).is_none()).unwrap_or(MAX_DESCRIPTORS)
    }
}

impl LadspaPlugin {
    fn raw(&self) -> &RawDescriptor {
        // SAFETY: `raw` is a non-null descriptor from `ladspa_descriptor`, valid while the library is loaded,
        // which is for the life of the process.
        unsafe { &*self.raw }
    }

    /// The plugin's descriptor, read as the adapter reads it; `index` is its place in the library.
    pub fn describe(&self, index: usize) -> Result<Descriptor, String> {
        let d = self.raw();
        if d.port_count > MAX_PORTS {
            return Err(format!("plugin {index} claims {} ports", d.port_count));
        }
        let mut ports = Vec::with_capacity(d.port_count as usize);
        for p in 0..d.port_count as usize {
            // SAFETY: the descriptor's arrays hold `port_count` elements each (ladspa.h); NULL arrays are not read.
            let (descriptor, hint, name) = unsafe {
                let descriptor = if d.port_descriptors.is_null() { 0 } else { *d.port_descriptors.add(p) };
                let hint = if d.port_range_hints.is_null() { None } else { Some(&*d.port_range_hints.add(p)) };
                let name = if d.port_names.is_null() { std::ptr::null() } else { *d.port_names.add(p) };
                (descriptor, hint, name)
            };
            ports.push(Port {
                descriptor,
                name: text(name),
                hint: hint.map_or(0, |h| h.hint),
                lower: hint.map_or(0.0, |h| h.lower),
                upper: hint.map_or(0.0, |h| h.upper),
            });
        }
        Ok(Descriptor {
            index,
            unique_id: d.unique_id,
            label: text(d.label),
            properties: d.properties,
            name: text(d.name),
            maker: text(d.maker),
            copyright: text(d.copyright),
            ports,
            has_activate: d.activate.is_some(),
            has_deactivate: d.deactivate.is_some(),
            has_run: d.run.is_some(),
            has_run_adding: d.run_adding.is_some(),
            has_set_run_adding_gain: d.set_run_adding_gain.is_some(),
        })
    }

    /// An instance at `sample_rate`, every port connected to a buffer of its own (`block` samples for an audio
    /// port, one value for a control port, all zero), as hosts connect them before they activate.
    pub fn instantiate(&self, sample_rate: u64, block: usize) -> Result<LadspaInstance, String> {
        let d = self.raw();
        let instantiate = d.instantiate.ok_or("the descriptor has no instantiate")?;
        let connect = d.connect_port.ok_or("the descriptor has no connect_port")?;
        // SAFETY: a descriptor's `instantiate` takes the descriptor itself and the sample rate (ladspa.h).
        let handle = unsafe { instantiate(self.raw, sample_rate as c_ulong) };
        if handle.is_null() {
            return Err("instantiate returned NULL".into());
        }
        let mut instance = LadspaInstance { raw: self.raw, handle, block, buffers: Vec::new() };
        let count = d.port_count.min(MAX_PORTS) as usize;
        for p in 0..count {
            // SAFETY: `port_descriptors` holds `port_count` elements (ladspa.h); NULL reads as 0, as the adapter
            // reads it.
            let flags = if d.port_descriptors.is_null() { 0 } else { unsafe { *d.port_descriptors.add(p) } };
            let len = if flags & PORT_AUDIO != 0 { block } else { 1 };
            instance.buffers.push(Words::new(len));
            let buffer = instance.buffers[p].as_mut_ptr().cast::<f32>();
            // SAFETY: `handle` is the instance `instantiate` returned; `buffer` holds `len` floats (a block for an
            // audio port, one value for a control port) and lives in `instance`, which cleans the plugin up before
            // the buffers go (its `Drop`).
            unsafe { connect(handle, p as c_ulong, buffer) };
        }
        Ok(instance)
    }
}

/// An instance of a LADSPA plugin with its port buffers; cleaned up when dropped.
pub struct LadspaInstance {
    raw: *const RawDescriptor,
    handle: *mut c_void,
    /// Samples of an audio port's buffer.
    block: usize,
    /// One per port, connected. Their heap blocks never move: the vector is not resized after connecting.
    buffers: Vec<Words>,
}

impl LadspaInstance {
    fn raw(&self) -> &RawDescriptor {
        // SAFETY: as in `LadspaPlugin::raw`.
        unsafe { &*self.raw }
    }

    /// The values in the buffer of `port` (none past the last port).
    pub fn values(&self, port: usize) -> Vec<f32> {
        self.buffers.get(port).map_or_else(Vec::new, Words::floats)
    }

    /// Put `values` into the buffer of `port` (as many as it holds; nothing past the last port).
    pub fn set_values(&mut self, port: usize, values: &[f32]) {
        if let Some(b) = self.buffers.get_mut(port) {
            b.set_floats(values);
        }
    }

    pub fn activate(&mut self) {
        if let Some(activate) = self.raw().activate {
            // SAFETY: `activate` takes the instance's handle (ladspa.h); every port is connected.
            unsafe { activate(self.handle) };
        }
    }

    /// Run one block of `samples` samples, at most the `block` the instance was made with.
    pub fn run(&mut self, samples: usize) -> Result<(), String> {
        let run = self.raw().run.ok_or("the descriptor has no run")?;
        if samples > self.block {
            return Err(format!("a block of {samples} samples is longer than the {} of the port buffers", self.block));
        }
        // SAFETY: `run` takes the handle and a sample count (ladspa.h); every audio port's buffer holds at least
        // `samples` floats (checked above against the block the buffers were made for).
        unsafe { run(self.handle, samples as c_ulong) };
        Ok(())
    }

    pub fn deactivate(&mut self) {
        if let Some(deactivate) = self.raw().deactivate {
            // SAFETY: `deactivate` takes the instance's handle (ladspa.h).
            unsafe { deactivate(self.handle) };
        }
    }
}

impl Drop for LadspaInstance {
    fn drop(&mut self) {
        if let Some(cleanup) = self.raw().cleanup {
            // SAFETY: `cleanup` takes the handle and ends the instance; it is not used again.
            unsafe { cleanup(self.handle) };
        }
    }
}

// ------------------------------------------------------------------------------------------------------------
// frei0r
// ------------------------------------------------------------------------------------------------------------

/// `f0r_plugin_info_t`.
#[repr(C)]
struct RawPluginInfo {
    name: *const c_char,
    author: *const c_char,
    plugin_type: c_int,
    color_model: c_int,
    frei0r_version: c_int,
    major_version: c_int,
    minor_version: c_int,
    num_params: c_int,
    explanation: *const c_char,
}

/// `f0r_param_info_t`.
#[repr(C)]
struct RawParamInfo {
    name: *const c_char,
    kind: c_int,
    explanation: *const c_char,
}

type UpdateFn = unsafe extern "C" fn(*mut c_void, f64, *const u32, *mut u32);
type Update2Fn = unsafe extern "C" fn(*mut c_void, f64, *const u32, *const u32, *const u32, *mut u32);

/// A frei0r plugin loaded into this process: its entry points.
pub struct Frei0rLibrary {
    init: unsafe extern "C" fn() -> c_int,
    get_plugin_info: unsafe extern "C" fn(*mut RawPluginInfo),
    get_param_info: Option<unsafe extern "C" fn(*mut RawParamInfo, c_int)>,
    construct: unsafe extern "C" fn(c_uint, c_uint) -> *mut c_void,
    destruct: unsafe extern "C" fn(*mut c_void),
    update: Option<UpdateFn>,
    update2: Option<Update2Fn>,
}

/// Resolves `name` to a function pointer of type `F`; `None` when the plugin does not export it.
///
/// # Safety
/// `F` must be the C type frei0r.h declares for `name` (a function pointer type).
unsafe fn function<F: Copy>(symbols: &dyn Symbols, name: &str) -> Option<F> {
    let address = symbols.address(name).ok().filter(|a| !a.is_null())?;
    // SAFETY: `F` is a function pointer type (the caller's contract), as large as a data pointer on x86-64.
    Some(unsafe { std::mem::transmute_copy::<*const c_void, F>(&address) })
}

impl Frei0rLibrary {
    /// The plugin's entry points, with the adapter's checks: what a plugin must export.
    pub fn resolve(symbols: &dyn Symbols) -> Result<Frei0rLibrary, String> {
        // SAFETY: each type is the declaration of its function in frei0r.h (include/ward_frei0r_abi.h).
        unsafe {
            let get_plugin_info =
                function(symbols, "f0r_get_plugin_info").ok_or("it exports no f0r_get_plugin_info")?;
            let init = function(symbols, "f0r_init").ok_or("it exports no f0r_init")?;
            let construct = function(symbols, "f0r_construct");
            let destruct = function(symbols, "f0r_destruct");
            let (Some(construct), Some(destruct)) = (construct, destruct) else {
                return Err("it exports no f0r_construct or f0r_destruct".into());
            };
            Ok(Frei0rLibrary {
                init,
                get_plugin_info,
                get_param_info: function(symbols, "f0r_get_param_info"),
                construct,
                destruct,
                update: function(symbols, "f0r_update"),
                update2: function(symbols, "f0r_update2"),
            })
        }
    }

    /// `f0r_init`: false when it fails.
    pub fn init(&self) -> bool {
        // SAFETY: `f0r_init(void) -> int`, called once, before anything else of the plugin's.
        unsafe { (self.init)() != 0 }
    }

    /// What the plugin says about itself, read as the adapter reads it.
    pub fn info(&self) -> PluginInfo {
        let mut raw = RawPluginInfo {
            name: std::ptr::null(),
            author: std::ptr::null(),
            plugin_type: 0,
            color_model: 0,
            frei0r_version: 0,
            major_version: 0,
            minor_version: 0,
            num_params: 0,
            explanation: std::ptr::null(),
        };
        // SAFETY: `f0r_get_plugin_info` fills the struct it is given, which is an `f0r_plugin_info_t`.
        unsafe { (self.get_plugin_info)(&mut raw) };
        let count = if raw.num_params > 0 && raw.num_params <= MAX_PARAMS { raw.num_params } else { 0 };
        let mut params = Vec::new();
        if let Some(get_param_info) = self.get_param_info {
            for p in 0..count {
                let mut pi = RawParamInfo { name: std::ptr::null(), kind: -1, explanation: std::ptr::null() };
                // SAFETY: `f0r_get_param_info` fills the `f0r_param_info_t` it is given for parameter `p`, which
                // is below the count the plugin gave.
                unsafe { get_param_info(&mut pi, p) };
                params.push(ParamInfo {
                    name: text(pi.name),
                    kind: param_kind(pi.kind),
                    explanation: text(pi.explanation),
                });
            }
        }
        PluginInfo {
            name: text(raw.name),
            author: text(raw.author),
            plugin_type: plugin_type(raw.plugin_type),
            color_model: color_model(raw.color_model),
            frei0r_version: raw.frei0r_version,
            major_version: raw.major_version,
            minor_version: raw.minor_version,
            explanation: text(raw.explanation),
            params,
            has_update: self.update.is_some(),
            has_update2: self.update2.is_some(),
        }
    }

    /// An instance for frames of `width` x `height` pixels.
    pub fn construct(&self, width: u32, height: u32) -> Result<Frei0rInstance<'_>, String> {
        // SAFETY: `f0r_construct(unsigned width, unsigned height) -> f0r_instance_t`.
        let handle = unsafe { (self.construct)(width, height) };
        if handle.is_null() {
            return Err(format!("f0r_construct({width}, {height}) returned NULL"));
        }
        Ok(Frei0rInstance { lib: self, handle, pixels: width as usize * height as usize })
    }
}

fn plugin_type(v: c_int) -> PluginType {
    match v {
        0 => PluginType::Filter,
        1 => PluginType::Source,
        2 => PluginType::Mixer2,
        3 => PluginType::Mixer3,
        other => PluginType::Other(other),
    }
}

fn color_model(v: c_int) -> ColorModel {
    match v {
        0 => ColorModel::Bgra8888,
        1 => ColorModel::Rgba8888,
        2 => ColorModel::Packed32,
        other => ColorModel::Other(other),
    }
}

fn param_kind(v: c_int) -> ParamKind {
    match v {
        0 => ParamKind::Bool,
        1 => ParamKind::Double,
        2 => ParamKind::Color,
        3 => ParamKind::Position,
        4 => ParamKind::String,
        other => ParamKind::Other(other),
    }
}

/// An instance of a frei0r plugin; destructed when dropped.
pub struct Frei0rInstance<'l> {
    lib: &'l Frei0rLibrary,
    handle: *mut c_void,
    pixels: usize,
}

impl Frei0rInstance<'_> {
    fn check(&self, frames: &[Option<&Words>], output: &Words) -> Result<(), String> {
        let wrong = frames.iter().flatten().chain(std::iter::once(&output)).find(|f| f.len != self.pixels);
        match wrong {
            Some(f) => Err(format!("a frame of {} pixels, not {}", f.len, self.pixels)),
            None => Ok(()),
        }
    }

    /// `f0r_update`: `input` is `None` for a source.
    pub fn update(&mut self, time: f64, input: Option<&Words>, output: &mut Words) -> Result<(), String> {
        let update = self.lib.update.ok_or("it exports no f0r_update")?;
        self.check(&[input], output)?;
        let input = input.map_or(std::ptr::null(), Words::as_ptr);
        // SAFETY: `f0r_update(instance, time, inframe, outframe)`; each frame given holds the instance's
        // width * height pixels (checked above), 16-byte aligned, and outlives the call.
        unsafe { update(self.handle, time, input, output.as_mut_ptr()) };
        Ok(())
    }

    /// `f0r_update2` with up to three input frames (`None` crosses as NULL).
    pub fn update2(&mut self, time: f64, inputs: [Option<&Words>; 3], output: &mut Words) -> Result<(), String> {
        let update2 = self.lib.update2.ok_or("it exports no f0r_update2")?;
        self.check(&inputs, output)?;
        let [a, b, c] = inputs.map(|f| f.map_or(std::ptr::null(), Words::as_ptr));
        // SAFETY: as in `update`, with `f0r_update2`'s three input frames.
        unsafe { update2(self.handle, time, a, b, c, output.as_mut_ptr()) };
        Ok(())
    }
}

impl Drop for Frei0rInstance<'_> {
    fn drop(&mut self) {
        // SAFETY: `f0r_destruct` takes the instance `f0r_construct` returned; it is not used again.
        unsafe { (self.lib.destruct)(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_aligned_and_as_long_as_asked() {
        for len in [0, 1, 3, 4, 5, 1024, 3072] {
            let mut w = Words::new(len);
            assert_eq!(w.words().len(), len);
            assert_eq!(w.as_ptr() as usize % 16, 0);
            w.words_mut().iter_mut().enumerate().for_each(|(i, x)| *x = i as u32);
            assert!(w.words().iter().enumerate().all(|(i, &x)| x == i as u32));
        }
        let mut f = Words::new(3);
        f.set_floats(&[0.5, -1.0, 2.0]);
        assert_eq!(f.floats(), [0.5, -1.0, 2.0]);
    }

    #[test]
    fn reads_strings_as_the_adapters_do() {
        assert_eq!(text(std::ptr::null()), "");
        assert_eq!(text(c"amp_mono".as_ptr()), "amp_mono");
    }
}
