//! frei0r behind the proxy: plugin and parameter information the host reads (kept here, in the host's memory) and
//! the instance functions (the class wrappers).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ward::{Isolation, Supervisor};
use ward_classes::cache::Wire;
use ward_classes::frei0r::{Describer, Instance, Library, ParamKind, ParamValue, PluginInfo};
use ward_classes::ClassError;

use crate::c_string;
use crate::guard::{guarded, guarded_or};
use crate::instance;
use crate::interpose::inside_ward;
use crate::runtime::{self, report, Plugin};

use ward_classes::abi::{F0rParamInfo as RawParamInfo, F0rPluginInfo as RawPluginInfo};

/// The C names of one parameter.
struct ParamNames {
    name: CString,
    explanation: CString,
}

/// A frei0r plugin under ward, with the strings the host may keep pointers to. It is opened in a domain of its own
/// at once, or, when the describer described it, when the host first constructs an instance (a host that only
/// scans it starts no domain; `f0r_init` and the information calls are answered from the description).
pub(crate) struct ProxyLibrary {
    path: PathBuf,
    isolation: Option<Isolation>,
    /// What the host is told; the plugin's own domain must read the same.
    info: PluginInfo,
    /// The plugin in its own domain, or why it could not be opened there (said once, when it failed).
    opened: OnceLock<Result<Library, String>>,
    name: CString,
    author: CString,
    explanation: CString,
    params: Vec<ParamNames>,
}

impl ProxyLibrary {
    /// The plugin opened at once in a domain of its own, which reads what it says about itself.
    pub(crate) fn open(
        sup: &Supervisor,
        path: &Path,
        isolation: Option<Isolation>,
    ) -> Result<ProxyLibrary, ClassError> {
        let library = Library::open(sup, path, isolation)?;
        let (path, info) = (library.path().to_path_buf(), library.info().clone());
        Ok(ProxyLibrary::of(path, isolation, info, OnceLock::from(Ok(library))))
    }

    /// The plugin described by `describer`, with the description as the adapter wrote it (for the cache); its own
    /// domain starts when the host first constructs an instance.
    pub(crate) fn described(
        describer: &Describer,
        path: &Path,
        isolation: Option<Isolation>,
    ) -> Result<(ProxyLibrary, Wire), ClassError> {
        let (info, wire) = describer.describe_with_wire(path)?;
        Ok((ProxyLibrary::with_description(path, isolation, info), wire))
    }

    /// The plugin at `path` with the description `info` (a describer's, or the cache's); its own domain starts when
    /// the host first constructs an instance, and must read the same.
    pub(crate) fn with_description(path: &Path, isolation: Option<Isolation>, info: PluginInfo) -> ProxyLibrary {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        ProxyLibrary::of(path, isolation, info, OnceLock::new())
    }

    fn of(
        path: PathBuf,
        isolation: Option<Isolation>,
        info: PluginInfo,
        opened: OnceLock<Result<Library, String>>,
    ) -> ProxyLibrary {
        let params = info
            .params
            .iter()
            .map(|p| ParamNames { name: c_string(&p.name), explanation: c_string(&p.explanation) })
            .collect();
        ProxyLibrary {
            name: c_string(&info.name),
            author: c_string(&info.author),
            explanation: c_string(&info.explanation),
            params,
            path,
            isolation,
            info,
            opened,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The extension running the plugin, once it has a domain of its own.
    pub(crate) fn extension(&self) -> Option<ward::Extension> {
        self.opened.get().and_then(|o| o.as_ref().ok()).map(|l| l.extension().clone())
    }

    /// The plugin in its own domain, opened now if it was not yet.
    fn library(&self) -> Result<&Library, &str> {
        self.opened.get_or_init(|| self.open_now()).as_ref().map_err(String::as_str)
    }

    fn open_now(&self) -> Result<Library, String> {
        let Some(rt) = runtime::get() else { return Err("ward's environment is unusable".into()) };
        let opened = Library::open_as_described(rt.supervisor(), &self.path, self.isolation, &self.info);
        rt.report();
        match opened {
            Ok(library) => {
                rt.domain_started(&self.path, "frei0r", library.extension());
                Ok(library)
            }
            Err(e) => {
                let reason = format!("the frei0r plugin failed under ward when the host first constructed it: {e}");
                rt.say(&format!("{}: not constructed: {reason}", self.path.display()));
                Err(reason)
            }
        }
    }
}

fn library(id: u64) -> Option<std::sync::Arc<ProxyLibrary>> {
    match runtime::get()?.plugin(id)? {
        Plugin::Frei0r(lib) => Some(lib),
        _ => None,
    }
}

/// The plugin was initialised when it was described (in the describer's domain, or in its own when it was opened at
/// once); its own domain initialises it again when it starts.
#[no_mangle]
pub extern "C" fn ward_preload_f0r_init(library_id: u64) -> c_int {
    guarded_or("a frei0r f0r_init", "failure", 0, || c_int::from(library(library_id).is_some()))
}

/// Nothing to do: the plugin's domain goes when the host closes the library.
#[no_mangle]
pub extern "C" fn ward_preload_f0r_deinit(_library_id: u64) {}

/// # Safety
/// `info` points to a writable `f0r_plugin_info_t` (frei0r contract).
#[no_mangle]
pub unsafe extern "C" fn ward_preload_f0r_get_plugin_info(library_id: u64, info: *mut c_void) {
    guarded_or("a frei0r f0r_get_plugin_info", "with the information unwritten", (), || {
        let Some(lib) = library(library_id) else { return };
        let i = &lib.info;
        let raw = RawPluginInfo {
            name: lib.name.as_ptr(),
            author: lib.author.as_ptr(),
            plugin_type: i.plugin_type.raw(),
            color_model: i.color_model.raw(),
            frei0r_version: i.frei0r_version,
            major_version: i.major_version,
            minor_version: i.minor_version,
            num_params: lib.params.len() as c_int,
            explanation: lib.explanation.as_ptr(),
        };
        if !info.is_null() {
            // SAFETY: a non-null `info` points to a writable f0r_plugin_info_t (frei0r contract), which RawPluginInfo
            // lays out; the strings live as long as the library (the host must not use them after dlclose, as with any
            // plugin).
            unsafe { (info as *mut RawPluginInfo).write(raw) };
        }
    })
}

/// # Safety
/// `info` points to a writable `f0r_param_info_t` (frei0r contract).
#[no_mangle]
pub unsafe extern "C" fn ward_preload_f0r_get_param_info(library_id: u64, info: *mut c_void, index: c_int) {
    guarded_or("a frei0r f0r_get_param_info", "with the information unwritten", (), || {
        let Some(lib) = library(library_id) else { return };
        let (Some(names), Some(param)) = (lib.params.get(index as usize), lib.info.params.get(index as usize)) else {
            return;
        };
        if !info.is_null() {
            let raw = RawParamInfo {
                name: names.name.as_ptr(),
                kind: param.kind.raw(),
                explanation: names.explanation.as_ptr(),
            };
            // SAFETY: a non-null `info` points to a writable f0r_param_info_t (frei0r contract), which RawParamInfo lays
            // out; the strings live as long as the library.
            unsafe { (info as *mut RawParamInfo).write(raw) };
        }
    })
}

/// One instance as the host holds it.
struct ProxyInstance {
    instance: Instance,
    library: std::sync::Arc<ProxyLibrary>,
    pixels: usize,
    /// Strings returned by get_param_value, kept until the next call for the same parameter.
    strings: Vec<Option<CString>>,
    /// Copies of input frames the host passed overlapping the output frame.
    scratch: [Vec<u8>; 3],
}

#[no_mangle]
pub extern "C" fn ward_preload_f0r_construct(library_id: u64, width: c_uint, height: c_uint) -> *mut c_void {
    guarded_or("a frei0r f0r_construct", "no instance", std::ptr::null_mut(), || {
        let Some(lib) = library(library_id) else { return std::ptr::null_mut() };
        let result = inside_ward(|| lib.library().map(|library| library.construct(width, height)));
        report();
        // Said once, when its opening failed.
        let Ok(result) = result else { return std::ptr::null_mut() };
        match result {
            Ok(instance) => {
                let params = lib.params.len();
                Box::into_raw(Box::new(ProxyInstance {
                    instance,
                    library: lib,
                    pixels: width as usize * height as usize,
                    strings: vec![None; params],
                    scratch: Default::default(),
                })) as *mut c_void
            }
            Err(e) => {
                eprintln!("ward: {e}");
                std::ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `instance` came from our construct and was not destructed; one thread at a time (frei0r's rule).
unsafe fn instance<'a>(instance: *mut c_void) -> Option<&'a mut ProxyInstance> {
    // SAFETY: per the function's contract.
    unsafe { (instance as *mut ProxyInstance).as_mut() }
}

/// # Safety
/// `instance` came from our construct and is not used again (frei0r contract).
#[no_mangle]
pub unsafe extern "C" fn ward_preload_f0r_destruct(instance: *mut c_void) {
    // SAFETY: the host passes an instance our construct returned (from Box::into_raw) and never uses it again
    // (frei0r contract).
    unsafe { instance::release::<ProxyInstance>("a frei0r f0r_destruct", instance) }
}

/// # Safety
/// `param` points to a value of the parameter's type (frei0r contract: a double, a colour, a position, or a
/// pointer to a C string).
#[no_mangle]
pub unsafe extern "C" fn ward_preload_f0r_set_param_value(instance_ptr: *mut c_void, param: *mut c_void, index: c_int) {
    guarded_or("a frei0r f0r_set_param_value", "without the value set", (), || {
        // SAFETY: the host passes an instance of ours (frei0r contract).
        let Some(inst) = (unsafe { instance(instance_ptr) }) else { return };
        let Some(info) = inst.library.info.params.get(index as usize) else { return };
        if param.is_null() {
            return;
        }
        // SAFETY: param points to a value of the parameter's declared type (contract): a double, three floats, two
        // doubles, or a pointer to a NUL-terminated string (checked for null before it is read).
        let value = unsafe {
            match info.kind {
                ParamKind::Bool => ParamValue::Bool(*(param as *const f64)),
                ParamKind::Double => ParamValue::Double(*(param as *const f64)),
                ParamKind::Color => {
                    let c = std::slice::from_raw_parts(param as *const f32, 3);
                    ParamValue::Color { r: c[0], g: c[1], b: c[2] }
                }
                ParamKind::Position => {
                    let p = std::slice::from_raw_parts(param as *const f64, 2);
                    ParamValue::Position { x: p[0], y: p[1] }
                }
                ParamKind::String => {
                    let s = *(param as *const *const c_char);
                    if s.is_null() {
                        return;
                    }
                    ParamValue::String(CStr::from_ptr(s).to_string_lossy().into_owned())
                }
                ParamKind::Other(_) => return,
            }
        };
        let _ = inside_ward(|| inst.instance.set_param(index as usize, &value));
        report();
    })
}

/// # Safety
/// `param` points to writable storage for the parameter's type (frei0r contract).
#[no_mangle]
pub unsafe extern "C" fn ward_preload_f0r_get_param_value(instance_ptr: *mut c_void, param: *mut c_void, index: c_int) {
    guarded_or("a frei0r f0r_get_param_value", "without the value written", (), || {
        // SAFETY: the host passes an instance of ours (frei0r contract).
        let Some(inst) = (unsafe { instance(instance_ptr) }) else { return };
        if param.is_null() {
            return;
        }
        let result = inside_ward(|| inst.instance.get_param(index as usize));
        report();
        let Ok(value) = result else { return };
        match value {
            // SAFETY: param points to storage for the parameter's declared type (contract), which the class checked
            // the value against: one double, three floats or two doubles.
            ParamValue::Bool(v) | ParamValue::Double(v) => unsafe { *(param as *mut f64) = v },
            // SAFETY: param points to storage for the parameter's declared type (contract), as which the class decoded
            // the value: a colour, three floats.
            ParamValue::Color { r, g, b } => unsafe {
                let c = param as *mut f32;
                c.write(r);
                c.add(1).write(g);
                c.add(2).write(b);
            },
            // SAFETY: param points to storage for the parameter's declared type (contract), as which the class decoded
            // the value: a position, two doubles.
            ParamValue::Position { x, y } => unsafe {
                let p = param as *mut f64;
                p.write(x);
                p.add(1).write(y);
            },
            ParamValue::String(s) => {
                let Some(slot) = inst.strings.get_mut(index as usize) else { return };
                let c = slot.insert(c_string(&s));
                // SAFETY: the string lives in the instance until the next get for this parameter.
                unsafe { *(param as *mut *const c_char) = c.as_ptr() };
            }
        }
    })
}

/// An input frame as bytes the wrapper may read while the output frame is written: copied when it overlaps the
/// output (a host processing in place).
///
/// # Safety
/// `frame` is null or points to `bytes` readable bytes.
unsafe fn input(frame: *const u32, bytes: usize, out: *mut u32, scratch: &mut Vec<u8>) -> Option<&[u8]> {
    if frame.is_null() {
        return None;
    }
    let (a, b) = (frame as usize, out as usize);
    let overlaps = a < b + bytes && b < a + bytes;
    // SAFETY: per the function's contract.
    let frame = unsafe { std::slice::from_raw_parts(frame as *const u8, bytes) };
    if overlaps {
        scratch.clear();
        scratch.extend_from_slice(frame);
        Some(scratch)
    } else {
        // It does not overlap the output, so no &mut aliases it.
        Some(frame)
    }
}

/// The host's `f0r_update`: the plugin gets its own `f0r_update` too (not `f0r_update2`, which a plugin may
/// implement differently), and a fault names the call the host made.
///
/// # Safety
/// `in_frame` (null for a source) and `out_frame` point to width × height pixels (frei0r contract).
#[no_mangle]
pub unsafe extern "C" fn ward_preload_f0r_update(
    instance_ptr: *mut c_void,
    time: f64,
    in_frame: *const u32,
    out_frame: *mut u32,
) {
    // SAFETY: per this function's contract, which `update_frame`'s is.
    guarded("a frei0r update", || unsafe { update_frame(instance_ptr, time, in_frame, out_frame) });
}

/// The work of `ward_preload_f0r_update`.
///
/// # Safety
/// As `ward_preload_f0r_update`.
unsafe fn update_frame(instance_ptr: *mut c_void, time: f64, in_frame: *const u32, out_frame: *mut u32) {
    // SAFETY: the host passes an instance of ours (frei0r contract).
    let Some(inst) = (unsafe { instance(instance_ptr) }) else { return };
    if out_frame.is_null() {
        return;
    }
    let bytes = inst.pixels * 4;
    let [scratch, ..] = &mut inst.scratch;
    // SAFETY: `in_frame` is null (a source) or points to width × height pixels, `bytes` readable bytes (frei0r
    // contract), as `input` needs.
    let frame_in = unsafe { input(in_frame, bytes, out_frame, scratch) };
    // SAFETY: the output frame has `bytes` bytes (contract) and the input slice does not alias it (copied if it did).
    let out = unsafe { std::slice::from_raw_parts_mut(out_frame as *mut u8, bytes) };
    let instance = &mut inst.instance;
    let result = inside_ward(|| instance.update_bytes(time, frame_in.unwrap_or_default(), out));
    if let Err(e) = result {
        eprintln!("ward: {e}");
    }
    report();
}

/// # Safety
/// Every non-null frame points to width × height pixels (frei0r contract).
#[no_mangle]
pub unsafe extern "C" fn ward_preload_f0r_update2(
    instance_ptr: *mut c_void,
    time: f64,
    in1: *const u32,
    in2: *const u32,
    in3: *const u32,
    out_frame: *mut u32,
) {
    // SAFETY: per this function's contract, which `update2_frame`'s is.
    guarded("a frei0r update2", || unsafe { update2_frame(instance_ptr, time, [in1, in2, in3], out_frame) });
}

/// The work of `ward_preload_f0r_update2`, its three input frames together.
///
/// # Safety
/// As `ward_preload_f0r_update2`.
unsafe fn update2_frame(instance_ptr: *mut c_void, time: f64, inputs: [*const u32; 3], out_frame: *mut u32) {
    let [in1, in2, in3] = inputs;
    // SAFETY: the host passes an instance of ours (frei0r contract).
    let Some(inst) = (unsafe { instance(instance_ptr) }) else { return };
    if out_frame.is_null() {
        return;
    }
    // Frames cross as bytes, as the host has them: no conversion to pixels and back.
    let bytes = inst.pixels * 4;
    let [s1, s2, s3] = &mut inst.scratch;
    // SAFETY: each input frame is null or points to width × height pixels, `bytes` readable bytes (frei0r
    // contract), as `input` needs.
    let (i1, i2, i3) = unsafe {
        (input(in1, bytes, out_frame, s1), input(in2, bytes, out_frame, s2), input(in3, bytes, out_frame, s3))
    };
    // SAFETY: the output frame has `bytes` bytes (contract) and no input slice aliases it (copied if it did).
    let out = unsafe { std::slice::from_raw_parts_mut(out_frame as *mut u8, bytes) };
    let instance = &mut inst.instance;
    let result = inside_ward(|| instance.update2_bytes(time, i1, i2, i3, out));
    if let Err(e) = result {
        eprintln!("ward: {e}");
    }
    report();
}
