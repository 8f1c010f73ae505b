//! LADSPA behind the proxy: the descriptors the host reads (built here, in the host's memory, from what the class
//! read through the domain) and the functions their pointers lead to (the class wrappers).

use std::ffi::{c_char, c_int, c_ulong, c_void, CString};
use std::path::Path;
use std::sync::Arc;

use ward::{Isolation, Supervisor};
use ward_classes::abi::{LadspaDescriptor, LadspaPortRangeHint};
use ward_classes::ladspa::{Instance, Library, PortBuffer};
use ward_classes::{ClassError, Processed};

use crate::c_string;
use crate::interpose::inside_ward;
use crate::runtime::{self, Plugin};

type RawDescriptor = LadspaDescriptor;
type RangeHint = LadspaPortRangeHint;
type HandleFn = unsafe extern "C" fn(*mut c_void);
type RunFn = unsafe extern "C" fn(*mut c_void, c_ulong);
type GainFn = unsafe extern "C" fn(*mut c_void, f32);

/// One descriptor handed to the host, with everything its pointers point to. `raw` comes first so that the
/// descriptor pointer the host passes back to `instantiate` is a pointer to this struct.
#[repr(C)]
struct ProxyDescriptor {
    raw: RawDescriptor,
    library: Library,
    index: usize,
    _strings: Vec<CString>,
    _port_descriptors: Vec<c_int>,
    _port_names: Vec<*const c_char>,
    _hints: Vec<RangeHint>,
}

/// A LADSPA library under ward, with its descriptors built once.
pub(crate) struct ProxyLibrary {
    library: Library,
    /// Complete before the host sees any: the vector never grows again, so the descriptors never move.
    descriptors: Vec<ProxyDescriptor>,
}

// SAFETY: the raw pointers in a ProxyDescriptor point into buffers the same struct owns, which are never changed
// after construction; sharing or moving them between threads is as safe as sharing the owned data.
unsafe impl Send for ProxyLibrary {}
// SAFETY: as above: immutable after construction.
unsafe impl Sync for ProxyLibrary {}

impl ProxyLibrary {
    pub(crate) fn open(
        sup: &Supervisor,
        path: &Path,
        isolation: Option<Isolation>,
    ) -> Result<ProxyLibrary, ClassError> {
        let library = Library::open(sup, path, isolation)?;
        let mut descriptors = Vec::new();
        for d in library.plugins() {
            let mut strings = Vec::new();
            let mut keep = |s: &str| {
                let c = c_string(s);
                let p = c.as_ptr();
                strings.push(c);
                p
            };
            let (label, name, maker, copyright) = (keep(&d.label), keep(&d.name), keep(&d.maker), keep(&d.copyright));
            let port_names: Vec<*const c_char> = d.ports.iter().map(|p| keep(&p.name)).collect();
            let port_descriptors: Vec<c_int> = d.ports.iter().map(|p| p.descriptor).collect();
            let hints: Vec<RangeHint> =
                d.ports.iter().map(|p| RangeHint { hint: p.hint, lower: p.lower, upper: p.upper }).collect();
            let raw = RawDescriptor {
                unique_id: d.unique_id as c_ulong,
                label,
                properties: d.properties,
                name,
                maker,
                copyright,
                port_count: d.ports.len() as c_ulong,
                port_descriptors: port_descriptors.as_ptr(),
                port_names: port_names.as_ptr(),
                port_range_hints: hints.as_ptr(),
                implementation_data: std::ptr::null_mut(),
                instantiate: Some(instantiate),
                connect_port: Some(connect_port),
                activate: d.has_activate.then_some(activate as HandleFn),
                run: d.has_run.then_some(run as RunFn),
                run_adding: d.has_run_adding.then_some(run_adding as RunFn),
                set_run_adding_gain: d.has_set_run_adding_gain.then_some(set_run_adding_gain as GainFn),
                deactivate: d.has_deactivate.then_some(deactivate as HandleFn),
                cleanup: Some(cleanup),
            };
            descriptors.push(ProxyDescriptor {
                raw,
                library: library.clone(),
                index: d.index,
                _strings: strings,
                _port_descriptors: port_descriptors,
                _port_names: port_names,
                _hints: hints,
            });
        }
        Ok(ProxyLibrary { library, descriptors })
    }
}

impl ProxyLibrary {
    pub(crate) fn extension(&self) -> ward::Extension {
        self.library.extension().clone()
    }
}

/// `ladspa_descriptor` of the proxy bound to library `library`.
#[no_mangle]
pub extern "C" fn ward_preload_ladspa_descriptor(library: u64, index: c_ulong) -> *const c_void {
    let Some(rt) = runtime::get() else { return std::ptr::null() };
    match rt.plugin(library) {
        Some(Plugin::Ladspa(lib)) => lib
            .descriptors
            .get(index as usize)
            .map_or(std::ptr::null(), |d| &d.raw as *const RawDescriptor as *const c_void),
        _ => std::ptr::null(),
    }
}

/// One instance as the host holds it: the wrapper's instance, where the host connected each port, and the
/// wrapper's own copies of the port data (so the host's buffers, which may alias, are only read and written here).
struct ProxyInstance {
    instance: Instance,
    connected: Vec<*mut f32>,
    scratch: Vec<Vec<f32>>,
    warned: bool,
}

/// # Safety
/// `descriptor` is one of ours (the host got it from our `ladspa_descriptor`).
unsafe extern "C" fn instantiate(descriptor: *const RawDescriptor, sample_rate: c_ulong) -> *mut c_void {
    if descriptor.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: our descriptors are the `raw` field, first in a repr(C) ProxyDescriptor that lives as long as its
    // library (the host must not use a descriptor after dlclose).
    let proxy = unsafe { &*(descriptor as *const ProxyDescriptor) };
    let result = inside_ward(|| proxy.library.instantiate(proxy.index, sample_rate));
    report();
    match result {
        Ok(instance) => {
            let ports = instance.descriptor().ports.len();
            let boxed = Box::new(ProxyInstance {
                instance,
                connected: vec![std::ptr::null_mut(); ports],
                scratch: vec![Vec::new(); ports],
                warned: false,
            });
            Box::into_raw(boxed) as *mut c_void
        }
        Err(e) => {
            eprintln!("ward: {e}");
            std::ptr::null_mut()
        }
    }
}

fn report() {
    if let Some(rt) = runtime::get() {
        rt.report();
    }
}

/// # Safety
/// `handle` came from our `instantiate` and was not cleaned up; the host does not call into one instance from two
/// threads at once (LADSPA's rule).
unsafe fn instance<'a>(handle: *mut c_void) -> Option<&'a mut ProxyInstance> {
    // SAFETY: per the function's contract.
    unsafe { (handle as *mut ProxyInstance).as_mut() }
}

unsafe extern "C" fn connect_port(handle: *mut c_void, port: c_ulong, location: *mut f32) {
    // SAFETY: the host passes an instance of ours (LADSPA contract).
    let Some(inst) = (unsafe { instance(handle) }) else { return };
    if let Some(slot) = inst.connected.get_mut(port as usize) {
        *slot = location;
    }
}

unsafe extern "C" fn activate(handle: *mut c_void) {
    // SAFETY: the host passes an instance of ours (LADSPA contract).
    let Some(inst) = (unsafe { instance(handle) }) else { return };
    let _ = inside_ward(|| inst.instance.activate());
    report();
}

unsafe extern "C" fn deactivate(handle: *mut c_void) {
    // SAFETY: the host passes an instance of ours (LADSPA contract).
    let Some(inst) = (unsafe { instance(handle) }) else { return };
    let _ = inside_ward(|| inst.instance.deactivate());
    report();
}

unsafe extern "C" fn set_run_adding_gain(handle: *mut c_void, gain: f32) {
    // SAFETY: the host passes an instance of ours (LADSPA contract).
    let Some(inst) = (unsafe { instance(handle) }) else { return };
    let _ = inside_ward(|| inst.instance.set_run_adding_gain(gain));
    report();
}

unsafe extern "C" fn cleanup(handle: *mut c_void) {
    if handle.is_null() {
        return;
    }
    // SAFETY: the host passes an instance of ours and never uses it again (LADSPA contract); it came from
    // Box::into_raw.
    let boxed = unsafe { Box::from_raw(handle as *mut ProxyInstance) };
    inside_ward(|| drop(boxed));
    report();
}

unsafe extern "C" fn run(handle: *mut c_void, samples: c_ulong) {
    // SAFETY: the host passes an instance of ours (LADSPA contract), and has connected every port to a buffer of
    // at least `samples` values (one for a control port).
    unsafe { block(handle, samples as usize, false) }
}

unsafe extern "C" fn run_adding(handle: *mut c_void, samples: c_ulong) {
    // SAFETY: as for run.
    unsafe { block(handle, samples as usize, true) }
}

/// # Safety
/// As for `run`: every connected port points to at least `samples` floats (one for a control port).
unsafe fn block(handle: *mut c_void, samples: usize, adding: bool) {
    // SAFETY: per the function's contract.
    let Some(inst) = (unsafe { instance(handle) }) else { return };
    let ProxyInstance { instance, connected, scratch, warned } = inst;
    let descriptor = Arc::clone(instance.descriptor());
    let ports = &descriptor.ports;
    // Copy in: inputs, and for run_adding the outputs' current contents.
    for (i, port) in ports.iter().enumerate() {
        let n = if port.is_audio() { samples } else { 1 };
        let buf = &mut scratch[i];
        buf.clear();
        buf.resize(n, 0.0);
        let src = connected[i];
        if !src.is_null() && (port.is_input() || adding) {
            // SAFETY: a connected port points to at least n floats (contract); buf is ours, so no overlap.
            unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), n) };
        }
    }
    let outcome = {
        let mut buffers: Vec<PortBuffer<'_>> = ports
            .iter()
            .zip(scratch.iter_mut())
            .map(|(p, b)| if p.is_input() { PortBuffer::Input(b) } else { PortBuffer::Output(b) })
            .collect();
        inside_ward(|| {
            if adding {
                instance.run_adding(samples, &mut buffers)
            } else {
                instance.run(samples, &mut buffers)
            }
        })
    };
    match outcome {
        Ok(Processed::Ran) | Ok(Processed::Bypassed { .. }) => {}
        Err(e) => {
            // The host's own mistake (a port left unconnected, say): say it once; outputs get what the wrapper left.
            if !*warned {
                eprintln!("ward: {e}");
                *warned = true;
            }
        }
    }
    // Copy out.
    for (i, port) in ports.iter().enumerate() {
        let dst = connected[i];
        if port.is_output() && !dst.is_null() {
            let n = if port.is_audio() { samples } else { 1 };
            // SAFETY: a connected port points to at least n floats (contract); scratch is ours, so no overlap.
            unsafe { std::ptr::copy_nonoverlapping(scratch[i].as_ptr(), dst, n) };
        }
    }
    report();
}
