//! The corpus's native runners: a plugin loaded with dlopen straight into this (throwaway) process and driven
//! through its C interface, with no ward at all, the way an ordinary host would. The C structures are declared
//! from `include/ward_ladspa_abi.h` and `include/ward_frei0r_abi.h`. Every unsafe block of the corpus is here.

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void, CStr};
use std::path::Path;

use ward_classes::ladspa::{Port, PORT_AUDIO, PORT_CONTROL, PORT_INPUT, PORT_OUTPUT};

use super::input::{self, Digest, BLOCKS, HEIGHT, MAX_BLOCK, SAMPLE_RATE, TIMES, WIDTH};
use super::Listed;
use crate::native::NativeLib;

/// Values of margin on each side of a LADSPA port buffer, and rows on each side of a frei0r frame.
const PORT_MARGIN: usize = 64;
const FRAME_MARGIN_ROWS: usize = 4;

/// More plugins than any library has; the loop guard of a library whose `ladspa_descriptor` never returns NULL
/// (the class adapter's bound).
const MAX_DESCRIPTORS: usize = 4096;

/// `LADSPA_PortRangeHint`.
#[repr(C)]
struct LadspaPortRangeHint {
    hint: c_int,
    lower: f32,
    upper: f32,
}

type Handle = *mut c_void;

/// `LADSPA_Descriptor`. Fields the runner does not read are there for the layout.
#[repr(C)]
#[allow(dead_code)]
struct LadspaDescriptor {
    unique_id: c_ulong,
    label: *const c_char,
    properties: c_int,
    name: *const c_char,
    maker: *const c_char,
    copyright: *const c_char,
    port_count: c_ulong,
    port_descriptors: *const c_int,
    port_names: *const *const c_char,
    port_range_hints: *const LadspaPortRangeHint,
    implementation_data: *mut c_void,
    instantiate: Option<unsafe extern "C" fn(*const LadspaDescriptor, c_ulong) -> Handle>,
    connect_port: Option<unsafe extern "C" fn(Handle, c_ulong, *mut f32)>,
    activate: Option<unsafe extern "C" fn(Handle)>,
    run: Option<unsafe extern "C" fn(Handle, c_ulong)>,
    run_adding: Option<unsafe extern "C" fn(Handle, c_ulong)>,
    set_run_adding_gain: Option<unsafe extern "C" fn(Handle, f32)>,
    deactivate: Option<unsafe extern "C" fn(Handle)>,
    cleanup: Option<unsafe extern "C" fn(Handle)>,
}

type LadspaDescriptorFn = unsafe extern "C" fn(c_ulong) -> *const LadspaDescriptor;

/// Lower this process's core-size limit to zero: a plugin that crashes natively should not leave a core file.
pub fn no_core_files() {
    let rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `rl` is a valid rlimit; lowering our own limit needs no privilege. Failure only means core files.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &rl) };
}

/// How the native run treats memory the plugin did not initialise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// As the process leaves it (deterministic in a fresh process).
    AsIs,
    /// Fresh heap memory filled with one pattern and freed memory with another (glibc's `M_PERTURB`), and the
    /// stack the plugin is about to use scribbled over before every call into it, and the margins around input
    /// buffers filled with a pattern: output that depends on uninitialised memory, or on memory just outside the
    /// inputs, comes out different from an [`Memory::AsIs`] run.
    Perturbed,
}

/// The byte glibc fills allocations with (the complement when they are freed) in a perturbed run.
const PERTURB_BYTE: i32 = 0xA5;
/// Bytes of stack scribbled over before each call into the plugin in a perturbed run.
const SCRIBBLE_BYTES: usize = 128 * 1024;

impl Memory {
    /// What the margins around input buffers hold: reading past a buffer then gives different output in an
    /// [`Memory::AsIs`] and a [`Memory::Perturbed`] run.
    fn margin_bits(self) -> u32 {
        match self {
            Memory::AsIs => 0,
            Memory::Perturbed => 0xA5A5_A5A5,
        }
    }

    fn start(self) {
        if self == Memory::Perturbed {
            // SAFETY: mallopt only changes glibc's allocator settings; no allocation is in flight (one thread).
            // Large blocks come from the heap too (mmap'd ones are always zero, and perturbing skips them).
            unsafe {
                libc::mallopt(libc::M_PERTURB, PERTURB_BYTE);
                libc::mallopt(libc::M_MMAP_MAX, 0);
            }
        }
    }

    /// Before a call into the plugin: fill the stack below this frame, where the plugin's frames will be.
    #[inline(never)]
    fn before_call(self) {
        if self == Memory::Perturbed {
            let mut junk = [0x5Au8; SCRIBBLE_BYTES];
            std::hint::black_box(&mut junk);
        }
    }
}

fn open(path: &Path) -> Result<NativeLib, String> {
    NativeLib::open(path).map_err(|e| format!("{e:#}"))
}

/// What the margins around output buffers hold before each call, to see whether the plugin writes outside them.
const CANARY: u32 = 0x5EED_CAFE;

/// A buffer of 32-bit values (floats or pixels, as bits) with margins on both sides: the plugin gets the middle.
/// Margins around inputs are filled per [`Memory`]; margins around outputs hold [`CANARY`] and are checked.
struct Padded {
    buf: Vec<u32>,
    margin: usize,
    len: usize,
}

impl Padded {
    /// `margin` is a multiple of 4 values, so the middle keeps the allocation's 16-byte alignment.
    fn new(len: usize, margin: usize) -> Padded {
        Padded { buf: vec![0; len + 2 * margin], margin, len }
    }

    fn data(&self) -> &[u32] {
        &self.buf[self.margin..self.margin + self.len]
    }

    fn data_mut(&mut self) -> &mut [u32] {
        &mut self.buf[self.margin..self.margin + self.len]
    }

    fn ptr(&mut self) -> *mut u32 {
        self.data_mut().as_mut_ptr()
    }

    /// Fill everything from `used` values into the middle to the end, and the margin before, with `bits`.
    fn fill_outside(&mut self, used: usize, bits: u32) {
        let (margin, len) = (self.margin, self.len);
        self.buf[..margin].fill(bits);
        self.buf[margin + used.min(len)..].fill(bits);
    }

    /// Whether everything outside the first `used` values still holds `bits`.
    fn outside_holds(&self, used: usize, bits: u32) -> bool {
        let (margin, len) = (self.margin, self.len);
        self.buf[..margin].iter().chain(&self.buf[margin + used.min(len)..]).all(|&v| v == bits)
    }
}

fn as_f32(bits: &[u32]) -> Vec<f32> {
    bits.iter().map(|&b| f32::from_bits(b)).collect()
}

/// A C string of the plugin's, copied; empty for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn ladspa_entry(lib: &NativeLib) -> Result<LadspaDescriptorFn, String> {
    let sym = lib.symbol("ladspa_descriptor").map_err(|e| format!("no LADSPA library: {e:#}"))?;
    // SAFETY: `ladspa_descriptor` is declared by the LADSPA interface as
    // `const LADSPA_Descriptor *ladspa_descriptor(unsigned long index)`.
    Ok(unsafe { std::mem::transmute::<*const c_void, LadspaDescriptorFn>(sym) })
}

/// Plugin `index` of the library, or None past the last.
fn ladspa_descriptor(entry: LadspaDescriptorFn, index: usize) -> Option<&'static LadspaDescriptor> {
    // SAFETY: calling the library's entry point as its interface defines it; it returns NULL or a descriptor that
    // stays valid while the library is loaded, and the library is never unloaded in this process.
    unsafe { entry(index as c_ulong).as_ref() }
}

/// Every plugin of a LADSPA library, as `ladspa_descriptor` lists them.
pub fn ladspa_list(path: &Path) -> Result<Vec<Listed>, String> {
    let lib = open(path)?;
    let entry = ladspa_entry(&lib)?;
    let mut found = Vec::new();
    while found.len() < MAX_DESCRIPTORS {
        let Some(d) = ladspa_descriptor(entry, found.len()) else { break };
        // SAFETY: a descriptor's label and name are NULL or NUL-terminated strings (the interface's rule).
        let (label, name) = unsafe { (c_string(d.label), c_string(d.name)) };
        found.push(Listed { index: found.len(), label, name });
    }
    if found.is_empty() {
        return Err("ladspa_descriptor(0) returned NULL: the library has no plugins".into());
    }
    Ok(found)
}

/// The ports of a descriptor, in the class's representation (so that both runners compute control values alike).
fn ladspa_ports(d: &LadspaDescriptor) -> Result<Vec<Port>, String> {
    let count = d.port_count as usize;
    if count > 0 && (d.port_descriptors.is_null() || d.port_range_hints.is_null()) {
        return Err("the descriptor has ports but no port descriptors or range hints".into());
    }
    let mut ports = Vec::with_capacity(count);
    for p in 0..count {
        // SAFETY: both arrays are non-null (checked) and have PortCount entries (the interface's rule).
        let (descriptor, hint) = unsafe { (*d.port_descriptors.add(p), &*d.port_range_hints.add(p)) };
        let input = descriptor & PORT_INPUT != 0;
        let output = descriptor & PORT_OUTPUT != 0;
        let audio = descriptor & PORT_AUDIO != 0;
        let control = descriptor & PORT_CONTROL != 0;
        if input == output || audio == control {
            return Err(format!("port {p} has flags {descriptor:#x}: not one direction and kind"));
        }
        ports.push(Port { descriptor, name: String::new(), hint: hint.hint, lower: hint.lower, upper: hint.upper });
    }
    Ok(ports)
}

/// Run plugin `index` of a LADSPA library on the corpus's input: instantiate at 48 kHz, set the input controls,
/// connect every port, activate, run the blocks, deactivate, clean up. The digest covers every output port of
/// every block, ports in order.
pub fn ladspa_run(path: &Path, index: usize, memory: Memory) -> Result<Digest, String> {
    memory.start();
    let lib = open(path)?;
    let entry = ladspa_entry(&lib)?;
    let d = ladspa_descriptor(entry, index).ok_or_else(|| format!("the library has no plugin #{index}"))?;
    let ports = ladspa_ports(d)?;
    let (Some(instantiate), Some(connect), Some(run)) = (d.instantiate, d.connect_port, d.run) else {
        return Err("the plugin lacks instantiate, connect_port or run".into());
    };

    // One buffer per port, kept for the whole run: audio ports hold the largest block, control ports one value,
    // each between margins (floats as bits).
    let mut buffers: Vec<Padded> =
        ports.iter().map(|p| Padded::new(if p.is_audio() { MAX_BLOCK } else { 1 }, PORT_MARGIN)).collect();
    let mut signals = Vec::new();
    for (port, buf) in ports.iter().zip(buffers.iter_mut()) {
        if port.is_input() && port.is_control() {
            buf.data_mut()[0] = input::control_input(port).to_bits();
            buf.fill_outside(1, memory.margin_bits());
        }
        if port.is_input() && port.is_audio() {
            signals.push(input::audio_input(signals.len()));
        }
    }

    memory.before_call();
    // SAFETY: the descriptor's own instantiate, given the descriptor and a sample rate, as the interface defines.
    let handle = unsafe { instantiate(d, SAMPLE_RATE as c_ulong) };
    if handle.is_null() {
        return Err(format!("instantiate at {SAMPLE_RATE} Hz returned NULL"));
    }
    for (p, buf) in buffers.iter_mut().enumerate() {
        // SAFETY: `handle` is a live instance; the buffer holds as many floats as any block and outlives every run
        // below (the vectors are never resized, so the pointer stays valid).
        unsafe { connect(handle, p as c_ulong, buf.ptr().cast::<f32>()) };
    }
    if let Some(activate) = d.activate {
        memory.before_call();
        // SAFETY: a live instance with every port connected.
        unsafe { activate(handle) };
    }
    let mut digest = Digest::default();
    let mut at = 0;
    for samples in BLOCKS {
        let mut k = 0;
        for (port, buf) in ports.iter().zip(buffers.iter_mut()) {
            let used = if port.is_audio() { samples } else { 1 };
            if port.is_input() && port.is_audio() {
                let signal = &signals[k][at..at + samples];
                buf.data_mut()[..samples].iter_mut().zip(signal).for_each(|(d, s)| *d = s.to_bits());
                buf.fill_outside(samples, memory.margin_bits());
                k += 1;
            }
            if port.is_output() {
                buf.fill_outside(used, CANARY);
            }
        }
        memory.before_call();
        // SAFETY: a live, activated instance whose audio ports hold at least `samples` (<= MAX_BLOCK) values.
        unsafe { run(handle, samples as c_ulong) };
        for (p, (port, buf)) in ports.iter().zip(buffers.iter()).enumerate() {
            if port.is_output() {
                let used = if port.is_audio() { samples } else { 1 };
                if !buf.outside_holds(used, CANARY) {
                    return Err(format!("it writes outside output port {p} in a block of {samples} samples"));
                }
                digest.f32s(&as_f32(&buf.data()[..used]));
            }
        }
        at += samples;
    }
    if let Some(deactivate) = d.deactivate {
        // SAFETY: a live, activated instance.
        unsafe { deactivate(handle) };
    }
    if let Some(cleanup) = d.cleanup {
        // SAFETY: a live instance, not used again.
        unsafe { cleanup(handle) };
    }
    drop(buffers);
    Ok(digest)
}

/// `f0r_plugin_info_t`. Fields the runner does not read are there for the layout.
#[repr(C)]
#[allow(dead_code)]
struct F0rPluginInfo {
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

type F0rInit = unsafe extern "C" fn() -> c_int;
type F0rDeinit = unsafe extern "C" fn();
type F0rGetPluginInfo = unsafe extern "C" fn(*mut F0rPluginInfo);
type F0rConstruct = unsafe extern "C" fn(c_uint, c_uint) -> Handle;
type F0rDestruct = unsafe extern "C" fn(Handle);
type F0rUpdate = unsafe extern "C" fn(Handle, f64, *const u32, *mut u32);
type F0rUpdate2 = unsafe extern "C" fn(Handle, f64, *const u32, *const u32, *const u32, *mut u32);

/// The entry points of a frei0r library.
struct Frei0r {
    init: Option<F0rInit>,
    deinit: Option<F0rDeinit>,
    info: F0rGetPluginInfo,
    construct: F0rConstruct,
    destruct: Option<F0rDestruct>,
    update: Option<F0rUpdate>,
    update2: Option<F0rUpdate2>,
}

/// What `f0r_get_plugin_info` says, copied.
pub struct Frei0rInfo {
    pub name: String,
    pub plugin_type: i32,
}

impl Frei0r {
    fn bind(lib: &NativeLib) -> Result<Frei0r, String> {
        let required = |name: &str| lib.symbol(name).map_err(|e| format!("no frei0r library: {e:#}"));
        let optional = |name: &str| lib.symbol(name).ok();
        let (info, construct) = (required("f0r_get_plugin_info")?, required("f0r_construct")?);
        // Each symbol is given the signature frei0r.h declares for its name.
        Ok(Frei0r {
            // SAFETY: `int f0r_init(void)`.
            init: optional("f0r_init").map(|p| unsafe { std::mem::transmute::<*const c_void, F0rInit>(p) }),
            // SAFETY: `void f0r_deinit(void)`.
            deinit: optional("f0r_deinit").map(|p| unsafe { std::mem::transmute::<*const c_void, F0rDeinit>(p) }),
            // SAFETY: `void f0r_get_plugin_info(f0r_plugin_info_t *)`.
            info: unsafe { std::mem::transmute::<*const c_void, F0rGetPluginInfo>(info) },
            // SAFETY: `f0r_instance_t f0r_construct(unsigned int width, unsigned int height)`.
            construct: unsafe { std::mem::transmute::<*const c_void, F0rConstruct>(construct) },
            // SAFETY: `void f0r_destruct(f0r_instance_t)`.
            destruct: optional("f0r_destruct").map(|p| unsafe { std::mem::transmute::<*const c_void, F0rDestruct>(p) }),
            // SAFETY: `void f0r_update(f0r_instance_t, double, const uint32_t *, uint32_t *)`.
            update: optional("f0r_update").map(|p| unsafe { std::mem::transmute::<*const c_void, F0rUpdate>(p) }),
            // SAFETY: `void f0r_update2(f0r_instance_t, double, const uint32_t *, const uint32_t *,
            // const uint32_t *, uint32_t *)`.
            update2: optional("f0r_update2").map(|p| unsafe { std::mem::transmute::<*const c_void, F0rUpdate2>(p) }),
        })
    }

    fn init(&self) -> Result<(), String> {
        let Some(init) = self.init else { return Ok(()) };
        // SAFETY: the library's own `f0r_init`, called once before anything else, as frei0r requires.
        let ok = unsafe { init() };
        if ok == 0 {
            return Err("f0r_init returned 0 (failure)".into());
        }
        Ok(())
    }

    fn info(&self) -> Frei0rInfo {
        let mut raw = F0rPluginInfo {
            name: std::ptr::null(),
            author: std::ptr::null(),
            plugin_type: -1,
            color_model: -1,
            frei0r_version: 0,
            major_version: 0,
            minor_version: 0,
            num_params: 0,
            explanation: std::ptr::null(),
        };
        // SAFETY: `raw` is a valid f0r_plugin_info_t for the plugin to fill in.
        unsafe { (self.info)(&mut raw) };
        // SAFETY: the plugin's name is NULL or a NUL-terminated string of the library, which stays loaded.
        let name = unsafe { c_string(raw.name) };
        Frei0rInfo { name, plugin_type: raw.plugin_type }
    }

    fn deinit(&self) {
        if let Some(deinit) = self.deinit {
            // SAFETY: the library's own `f0r_deinit`, after its last instance is gone.
            unsafe { deinit() };
        }
    }
}

/// The one plugin of a frei0r library.
pub fn frei0r_list(path: &Path) -> Result<Vec<Listed>, String> {
    let lib = open(path)?;
    let f = Frei0r::bind(&lib)?;
    f.init()?;
    let info = f.info();
    f.deinit();
    Ok(vec![Listed { index: 0, label: info.name, name: type_name(info.plugin_type) }])
}

pub fn type_name(plugin_type: i32) -> String {
    match plugin_type {
        0 => "filter".into(),
        1 => "source".into(),
        2 => "mixer2".into(),
        3 => "mixer3".into(),
        t => format!("type {t}"),
    }
}

/// Run a frei0r library's plugin on the corpus's input: construct at 128x96 with default parameters, update three
/// frames (a filter gets one test image, a mixer two or three, a source none). The digest covers the output frames.
pub fn frei0r_run(path: &Path, memory: Memory) -> Result<Digest, String> {
    memory.start();
    let lib = open(path)?;
    let f = Frei0r::bind(&lib)?;
    f.init()?;
    let info = f.info();
    let inputs = match info.plugin_type {
        0 => 1,
        1 => 0,
        2 => 2,
        3 => 3,
        t => return Err(format!("unknown plugin type {t}")),
    };
    if inputs >= 2 && f.update2.is_none() {
        return Err("a mixer without f0r_update2".into());
    }
    if f.update.is_none() && f.update2.is_none() {
        return Err("neither f0r_update nor f0r_update2".into());
    }
    memory.before_call();
    // SAFETY: the library's constructor, after f0r_init.
    let inst = unsafe { (f.construct)(WIDTH, HEIGHT) };
    if inst.is_null() {
        return Err(format!("f0r_construct({WIDTH}, {HEIGHT}) returned NULL"));
    }
    let pixels = (WIDTH * HEIGHT) as usize;
    let margin = FRAME_MARGIN_ROWS * WIDTH as usize;
    // One output frame for all updates, as hosts (and the class adapter) keep one; every frame between margins.
    let mut out = Padded::new(pixels, margin);
    let mut images: Vec<Padded> = (0..inputs).map(|_| Padded::new(pixels, margin)).collect();
    let mut digest = Digest::default();
    for (frame, &time) in TIMES.iter().enumerate() {
        for (i, image) in images.iter_mut().enumerate() {
            image.data_mut().copy_from_slice(&input::image(i, frame));
            image.fill_outside(pixels, memory.margin_bits());
        }
        let mut arg = |i: usize| images.get_mut(i).map_or(std::ptr::null(), |v| v.ptr().cast_const());
        let (in1, in2, in3) = (arg(0), arg(1), arg(2));
        out.fill_outside(pixels, CANARY);
        let dst = out.ptr();
        memory.before_call();
        match (inputs, f.update, f.update2) {
            (0 | 1, Some(update), _) => {
                // SAFETY: a live instance; every frame holds WIDTH x HEIGHT pixels (a source's input is NULL, as
                // frei0r specifies).
                unsafe { update(inst, time, in1, dst) }
            }
            (_, _, Some(update2)) => {
                // SAFETY: as above; unused inputs are NULL.
                unsafe { update2(inst, time, in1, in2, in3, dst) }
            }
            _ => unreachable!("checked above"),
        }
        if !out.outside_holds(pixels, CANARY) {
            return Err(format!("it writes outside its output frame (frame {frame})"));
        }
        digest.u32s(out.data());
    }
    if let Some(destruct) = f.destruct {
        // SAFETY: a live instance, not used again.
        unsafe { destruct(inst) };
    }
    f.deinit();
    Ok(digest)
}
