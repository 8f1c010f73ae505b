//! LADSPA behind the proxy: the descriptors the host reads (built here, in the host's memory, from what the class
//! read through the domain) and the functions their pointers lead to (the class wrappers).

use std::ffi::{c_char, c_int, c_ulong, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ward::{Isolation, Supervisor};
use ward_classes::abi::{LadspaDescriptor, LadspaPortRangeHint};
use ward_classes::cache::Wire;
use ward_classes::ladspa::{Describer, Descriptor, Instance, Library, Placement, PortBuffer};
use ward_classes::ClassError;

use crate::c_string;
use crate::guard::{guarded, guarded_or};
use crate::instance;
use crate::interpose::inside_ward;
use crate::runtime::{self, report, Plugin};

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
    source: Arc<LibrarySource>,
    index: usize,
    _strings: Vec<CString>,
    _port_descriptors: Vec<c_int>,
    _port_names: Vec<*const c_char>,
    _hints: Vec<RangeHint>,
}

/// The library a proxy's descriptors lead to: opened in a domain of its own at once, or, for a library the
/// describer described, when the host first instantiates from it (a host that only scans it starts no domain).
struct LibrarySource {
    path: PathBuf,
    isolation: Option<Isolation>,
    /// What the describer read; the library's own domain must read the same.
    described: Option<Vec<Arc<Descriptor>>>,
    /// The library in its own domain, or why it could not be opened there (said once, when it failed).
    opened: OnceLock<Result<Library, String>>,
}

impl LibrarySource {
    /// The library in its own domain, opened now if it was not yet.
    fn library(&self) -> Result<&Library, &str> {
        self.opened.get_or_init(|| self.open_now()).as_ref().map_err(String::as_str)
    }

    fn open_now(&self) -> Result<Library, String> {
        let Some(rt) = runtime::get() else { return Err("ward's environment is unusable".into()) };
        let described = self.described.as_deref().unwrap_or_default();
        let opened = Library::open_as_described(rt.supervisor(), &self.path, self.isolation, described);
        rt.report();
        match opened {
            Ok(library) => {
                rt.domain_started(&self.path, "LADSPA", library.extension());
                Ok(library)
            }
            Err(e) => {
                let reason = format!("the LADSPA plugin failed under ward when the host first instantiated it: {e}");
                rt.say(&format!("{}: not instantiated: {reason}", self.path.display()));
                Err(reason)
            }
        }
    }
}

/// A LADSPA library under ward, with its descriptors built once.
pub(crate) struct ProxyLibrary {
    source: Arc<LibrarySource>,
    /// Complete before the host sees any: the vector never grows again, so the descriptors never move.
    descriptors: Vec<ProxyDescriptor>,
}

// SAFETY: the raw pointers in a ProxyDescriptor point into buffers the same struct owns, which are never changed
// after construction; sharing or moving them between threads is as safe as sharing the owned data.
unsafe impl Send for ProxyLibrary {}
// SAFETY: a ProxyLibrary is never changed after construction and its raw pointers point only into buffers it owns,
// so threads sharing it only read.
unsafe impl Sync for ProxyLibrary {}

impl ProxyLibrary {
    /// The library opened at once in a domain of its own, which reads its descriptors.
    pub(crate) fn open(
        sup: &Supervisor,
        path: &Path,
        isolation: Option<Isolation>,
    ) -> Result<ProxyLibrary, ClassError> {
        let library = Library::open(sup, path, isolation)?;
        let plugins = library.plugins().to_vec();
        let source = LibrarySource {
            path: library.path().to_path_buf(),
            isolation,
            described: None,
            opened: OnceLock::from(Ok(library)),
        };
        Ok(ProxyLibrary::of(source, &plugins))
    }

    /// The library described by `describer`, with the descriptions as the adapter wrote them (for the cache); its
    /// own domain starts when the host first instantiates from it.
    pub(crate) fn described(
        describer: &Describer,
        path: &Path,
        isolation: Option<Isolation>,
    ) -> Result<(ProxyLibrary, Wire), ClassError> {
        let (plugins, wire) = describer.describe_with_wire(path)?;
        Ok((ProxyLibrary::with_descriptions(path, isolation, plugins), wire))
    }

    /// The library at `path` with the descriptions `plugins` (a describer's, or the cache's); its own domain starts
    /// when the host first instantiates from it, and must read the same.
    pub(crate) fn with_descriptions(
        path: &Path,
        isolation: Option<Isolation>,
        plugins: Vec<Arc<Descriptor>>,
    ) -> ProxyLibrary {
        let source = LibrarySource {
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
            isolation,
            described: Some(plugins.clone()),
            opened: OnceLock::new(),
        };
        ProxyLibrary::of(source, &plugins)
    }

    fn of(source: LibrarySource, plugins: &[Arc<Descriptor>]) -> ProxyLibrary {
        let source = Arc::new(source);
        let mut descriptors = Vec::new();
        for d in plugins {
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
                source: Arc::clone(&source),
                index: d.index,
                _strings: strings,
                _port_descriptors: port_descriptors,
                _port_names: port_names,
                _hints: hints,
            });
        }
        ProxyLibrary { source, descriptors }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.source.path
    }

    /// The extension running the library, once it has a domain of its own.
    pub(crate) fn extension(&self) -> Option<ward::Extension> {
        self.source.opened.get().and_then(|o| o.as_ref().ok()).map(|l| l.extension().clone())
    }
}

/// `ladspa_descriptor` of the proxy bound to library `library`.
#[no_mangle]
pub extern "C" fn ward_preload_ladspa_descriptor(library: u64, index: c_ulong) -> *const c_void {
    guarded_or("a LADSPA ladspa_descriptor", "no descriptor", std::ptr::null(), || {
        let Some(rt) = runtime::get() else { return std::ptr::null() };
        match rt.plugin(library) {
            Some(Plugin::Ladspa(lib)) => lib
                .descriptors
                .get(index as usize)
                .map_or(std::ptr::null(), |d| &d.raw as *const RawDescriptor as *const c_void),
            _ => std::ptr::null(),
        }
    })
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
    guarded_or("a LADSPA instantiate", "no instance", std::ptr::null_mut(), || {
        if descriptor.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: our descriptors are the `raw` field, first in a repr(C) ProxyDescriptor that lives as long as its
        // library (the host must not use a descriptor after dlclose).
        let proxy = unsafe { &*(descriptor as *const ProxyDescriptor) };
        let result = inside_ward(|| match proxy.source.library() {
            Ok(library) => Ok(library.instantiate(proxy.index, sample_rate)),
            // Said once, when its opening failed.
            Err(_) => Err(()),
        });
        report();
        let Ok(result) = result else { return std::ptr::null_mut() };
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
    })
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
    guarded_or("a LADSPA activate", "without the instance activated", (), || {
        // SAFETY: the host passes an instance of ours (LADSPA contract).
        let Some(inst) = (unsafe { instance(handle) }) else { return };
        let _ = inside_ward(|| inst.instance.activate());
        report();
    })
}

unsafe extern "C" fn deactivate(handle: *mut c_void) {
    guarded_or("a LADSPA deactivate", "without the instance deactivated", (), || {
        // SAFETY: the host passes an instance of ours (LADSPA contract).
        let Some(inst) = (unsafe { instance(handle) }) else { return };
        let _ = inside_ward(|| inst.instance.deactivate());
        report();
    })
}

unsafe extern "C" fn set_run_adding_gain(handle: *mut c_void, gain: f32) {
    guarded_or("a LADSPA set_run_adding_gain", "without the gain set", (), || {
        // SAFETY: the host passes an instance of ours (LADSPA contract).
        let Some(inst) = (unsafe { instance(handle) }) else { return };
        let _ = inside_ward(|| inst.instance.set_run_adding_gain(gain));
        report();
    })
}

unsafe extern "C" fn cleanup(handle: *mut c_void) {
    // SAFETY: the host passes an instance of ours (from Box::into_raw) and never uses it again (LADSPA contract).
    unsafe { instance::release::<ProxyInstance>("a LADSPA cleanup", handle) }
}

unsafe extern "C" fn run(handle: *mut c_void, samples: c_ulong) {
    // SAFETY: the host passes an instance of ours (LADSPA contract), and has connected every port to a buffer of
    // at least `samples` values (one for a control port).
    guarded("a LADSPA run", || unsafe { block(handle, samples as usize, false) });
}

unsafe extern "C" fn run_adding(handle: *mut c_void, samples: c_ulong) {
    // SAFETY: the host passes an instance of ours (LADSPA contract), and has connected every port to a buffer of
    // at least `samples` values (one for a control port).
    guarded("a LADSPA run_adding", || unsafe { block(handle, samples as usize, true) });
}

/// The host's port buffers as the class takes them: the memory the connected ports lie in, as disjoint regions
/// (ports whose buffers overlap, an input and an output run in place above all, lie in one region, at their offsets),
/// then one region of `scratch` per unconnected port (zeros). The plugin in its domain then shares memory between
/// ports exactly as the host's buffers do. `None` when a port lies at an offset that is no whole float from its
/// region's start, which no host does.
///
/// # Safety
/// Every connected port points to at least `lengths[i]` floats the host does not touch until the block returns
/// (LADSPA's contract for `run`).
unsafe fn host_regions<'a>(
    ports: &[ward_classes::ladspa::Port],
    connected: &[*mut f32],
    lengths: &[usize],
    scratch: &'a mut [Vec<f32>],
) -> Option<(Vec<PortBuffer<'a>>, Vec<Placement>)> {
    let float = std::mem::size_of::<f32>();
    if connected.len() != ports.len() || scratch.len() != ports.len() {
        return None;
    }
    let mut order: Vec<usize> = (0..ports.len()).filter(|&i| !connected[i].is_null()).collect();
    order.sort_by_key(|&i| connected[i] as usize);
    // Each region: its first and one-past-last byte, and whether an output lies in it.
    let mut spans: Vec<(usize, usize, bool)> = Vec::new();
    let mut placements = vec![Placement { region: 0, offset: 0 }; ports.len()];
    for &i in &order {
        let start = connected[i] as usize;
        if !start.is_multiple_of(std::mem::align_of::<f32>()) {
            return None;
        }
        let end = start.checked_add(lengths[i].checked_mul(float)?)?;
        let output = ports[i].is_output();
        match spans.last_mut() {
            Some(last) if start < last.1 => {
                last.1 = last.1.max(end);
                last.2 |= output;
            }
            _ => spans.push((start, end, output)),
        }
        let region = spans.len() - 1;
        let from = start - spans[region].0;
        if !from.is_multiple_of(float) {
            return None;
        }
        placements[i] = Placement { region, offset: from / float };
    }
    let mut regions: Vec<PortBuffer<'a>> = spans
        .iter()
        .map(|&(start, end, output)| {
            let (ptr, len) = (start as *mut f32, (end - start) / float);
            if output {
                // SAFETY: the region is the union of port buffers of at least their lengths (contract), which
                // overlap one another (else they would be regions of their own), so it is one piece of the host's
                // memory; regions are disjoint, so this is the only reference to its floats; the start is aligned
                // (checked above).
                PortBuffer::Output(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
            } else {
                // SAFETY: the region is the union of overlapping port buffers of at least their lengths (contract),
                // one piece of the host's memory with an aligned start (checked above); regions are disjoint and this
                // one holds no output, so it is only read.
                PortBuffer::Input(unsafe { std::slice::from_raw_parts(ptr, len) })
            }
        })
        .collect();
    for (i, buf) in scratch.iter_mut().enumerate() {
        if !connected[i].is_null() {
            continue;
        }
        buf.clear();
        buf.resize(lengths[i], 0.0);
        placements[i] = Placement { region: regions.len(), offset: 0 };
        regions.push(if ports[i].is_input() { PortBuffer::Input(buf) } else { PortBuffer::Output(buf) });
    }
    Some((regions, placements))
}

/// # Safety
/// As for `run`: every connected port points to at least `samples` floats (one for a control port).
unsafe fn block(handle: *mut c_void, samples: usize, adding: bool) {
    // SAFETY: per the function's contract.
    let Some(inst) = (unsafe { instance(handle) }) else { return };
    let ProxyInstance { instance, connected, scratch, warned } = inst;
    let descriptor = Arc::clone(instance.descriptor());
    let ports = &descriptor.ports;
    let lengths: Vec<usize> = ports.iter().map(|p| p.values_in_block(samples)).collect();
    // SAFETY: per this function's contract, which is what `host_regions` needs.
    let outcome = match unsafe { host_regions(ports, connected, &lengths, scratch) } {
        Some((mut regions, placements)) => {
            inside_ward(|| instance.run_placed(samples, &mut regions, &placements, adding))
        }
        None => {
            // Ports at odd offsets from one another: each port copied apart, outputs with what they hold.
            for (i, buf) in scratch.iter_mut().enumerate() {
                buf.clear();
                buf.resize(lengths[i], 0.0);
                let src = connected[i];
                if !src.is_null() {
                    // SAFETY: a connected port points to at least lengths[i] floats (contract); buf is ours, so no
                    // overlap. Copied as bytes: the host's pointer may be misaligned.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src as *const u8, buf.as_mut_ptr() as *mut u8, lengths[i] * 4)
                    };
                }
            }
            let mut buffers: Vec<PortBuffer<'_>> = ports
                .iter()
                .zip(scratch.iter_mut())
                .map(|(p, b)| if p.is_input() { PortBuffer::Input(b) } else { PortBuffer::Output(b) })
                .collect();
            let outcome = inside_ward(|| {
                if adding {
                    instance.run_adding(samples, &mut buffers)
                } else {
                    instance.run(samples, &mut buffers)
                }
            });
            for (i, port) in ports.iter().enumerate() {
                let dst = connected[i];
                if port.is_output() && !dst.is_null() {
                    // SAFETY: an output port points to at least lengths[i] writable floats (contract); scratch[i] is
                    // ours and holds lengths[i] (resized above), so no overlap. Copied as bytes: the host's pointer may
                    // be misaligned.
                    unsafe {
                        std::ptr::copy_nonoverlapping(scratch[i].as_ptr() as *const u8, dst as *mut u8, lengths[i] * 4)
                    };
                }
            }
            outcome
        }
    };
    if let Err(e) = outcome {
        // The host's own mistake (a port claiming too much, say): say it once; outputs get what the wrapper left.
        if !*warned {
            eprintln!("ward: {e}");
            *warned = true;
        }
    }
    report();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ward_classes::ladspa::{Port, PORT_AUDIO, PORT_CONTROL, PORT_INPUT, PORT_OUTPUT};

    fn port(flags: i32) -> Port {
        Port { descriptor: flags, name: String::new(), hint: 0, lower: 0.0, upper: 0.0 }
    }

    /// An audio input, an audio output and a control input, as a mono effect has them.
    fn mono_effect() -> Vec<Port> {
        vec![port(PORT_INPUT | PORT_AUDIO), port(PORT_OUTPUT | PORT_AUDIO), port(PORT_INPUT | PORT_CONTROL)]
    }

    /// What the class is given: per region, its start, floats and whether it holds an output; per port, where it
    /// lies.
    type Given = (Vec<(*const f32, usize, bool)>, Vec<Placement>);

    fn given(ports: &[Port], connected: &[*mut f32], samples: usize) -> Given {
        let lengths: Vec<usize> = ports.iter().map(|p| p.values_in_block(samples)).collect();
        let mut scratch = vec![Vec::new(); ports.len()];
        // SAFETY: every pointer the tests pass points into a live vector long enough for its port.
        let (regions, placements) =
            unsafe { host_regions(ports, connected, &lengths, &mut scratch) }.expect("whole floats apart");
        let regions = regions
            .iter()
            .map(|b| match b {
                PortBuffer::Input(s) => (s.as_ptr(), s.len(), false),
                PortBuffer::Output(s) => (s.as_ptr(), s.len(), true),
            })
            .collect();
        (regions, placements)
    }

    fn at(region: usize, offset: usize) -> Placement {
        Placement { region, offset }
    }

    #[test]
    fn separate_buffers_are_regions_of_their_own() {
        let (mut input, mut output, mut gain) = (vec![0f32; 64], vec![0f32; 64], vec![1f32]);
        let connected = [input.as_mut_ptr(), output.as_mut_ptr(), gain.as_mut_ptr()];
        let (regions, placements) = given(&mono_effect(), &connected, 64);
        assert_eq!(regions.len(), 3);
        for (i, p) in placements.iter().enumerate() {
            assert_eq!(regions[p.region].0, connected[i] as *const f32);
            assert_eq!(regions[p.region].2, i == 1, "only the output's region comes back");
            assert_eq!(p.offset, 0);
        }
    }

    #[test]
    fn a_plugin_run_in_place_gets_one_buffer_for_its_input_and_output() {
        let (mut buffer, mut gain) = (vec![0f32; 64], vec![1f32]);
        let connected = [buffer.as_mut_ptr(), buffer.as_mut_ptr(), gain.as_mut_ptr()];
        let (regions, placements) = given(&mono_effect(), &connected, 64);
        assert_eq!(placements[0], placements[1]);
        assert_eq!(regions[placements[0].region], (buffer.as_ptr(), 64, true));
    }

    #[test]
    fn an_output_overlapping_an_input_by_one_sample_shares_its_region_and_adjacent_ones_do_not() {
        let mut memory = vec![0f32; 200];
        let base = memory.as_mut_ptr();
        let mut gain = vec![1f32];
        // SAFETY: both offsets and the 64 samples after them are inside `memory`.
        let (at_63, at_64) = unsafe { (base.add(63), base.add(64)) };
        let (regions, placements) = given(&mono_effect(), &[base, at_63, gain.as_mut_ptr()], 64);
        let region = placements[0].region;
        assert_eq!((placements[0], placements[1]), (at(region, 0), at(region, 63)));
        assert_eq!(regions[region], (base as *const f32, 127, true));
        let (regions, placements) = given(&mono_effect(), &[base, at_64, gain.as_mut_ptr()], 64);
        assert_ne!(placements[0].region, placements[1].region);
        assert_eq!(regions.len(), 3);
    }

    #[test]
    fn inputs_sharing_a_buffer_share_a_region_that_does_not_come_back() {
        let ports = vec![
            port(PORT_INPUT | PORT_AUDIO),
            port(PORT_INPUT | PORT_AUDIO),
            port(PORT_OUTPUT | PORT_AUDIO),
            port(PORT_OUTPUT | PORT_AUDIO),
        ];
        let (mut a, mut b, mut c) = (vec![0f32; 32], vec![0f32; 32], vec![0f32; 32]);
        let (regions, placements) =
            given(&ports, &[a.as_mut_ptr(), a.as_mut_ptr(), b.as_mut_ptr(), c.as_mut_ptr()], 32);
        assert_eq!(placements[0], placements[1]);
        assert_eq!(regions[placements[0].region], (a.as_ptr(), 32, false));
        assert_eq!(regions.len(), 3);
    }

    #[test]
    fn an_unconnected_port_gets_zeros_of_its_own() {
        let (mut input, mut gain) = (vec![1f32; 16], vec![1f32]);
        let connected = [input.as_mut_ptr(), std::ptr::null_mut(), gain.as_mut_ptr()];
        let lengths = [16, 16, 1];
        let mut scratch = vec![vec![7f32; 3]; 3];
        // SAFETY: the connected pointers point into live vectors long enough for their ports.
        let (regions, placements) =
            unsafe { host_regions(&mono_effect(), &connected, &lengths, &mut scratch) }.expect("aligned");
        match &regions[placements[1].region] {
            PortBuffer::Output(s) => assert_eq!(**s, [0f32; 16]),
            PortBuffer::Input(_) => panic!("the output's region must come back"),
        }
    }
}
