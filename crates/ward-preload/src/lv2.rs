//! LV2 behind the proxy: the descriptors the host reads (built here, in the host's memory, from what the class read
//! through the domain and the plugin's bundle says), the host's features proxied for the plugin, and the functions
//! the descriptors' pointers lead to (the class wrappers), with the worker, state and options interfaces a plugin has.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use ward::{Isolation, Supervisor};
use ward_classes::lv2::bundle::{self, PluginInfo};
use ward_classes::lv2::{
    self as class, Features, Host, Instance, Library, OptionKey, OptionValue, PathFeatures, PortBuffer, PortKind,
    PortSpec,
};
use ward_classes::{ClassError, Processed};

use crate::guard::{guarded, guarded_or};
use crate::instance;
use crate::interpose::inside_ward;
use crate::runtime::{self, report, Plugin};

// ---- the C layouts (include/ward_lv2_abi.h) ----

#[repr(C)]
struct Feature {
    uri: *const c_char,
    data: *mut c_void,
}

type InstantiateFn =
    unsafe extern "C" fn(*const RawDescriptor, f64, *const c_char, *const *const Feature) -> *mut c_void;
type ConnectFn = unsafe extern "C" fn(*mut c_void, u32, *mut c_void);
type HandleFn = unsafe extern "C" fn(*mut c_void);
type RunFn = unsafe extern "C" fn(*mut c_void, u32);
type ExtensionDataFn = unsafe extern "C" fn(*const c_char) -> *const c_void;

#[repr(C)]
struct RawDescriptor {
    uri: *const c_char,
    instantiate: Option<InstantiateFn>,
    connect_port: Option<ConnectFn>,
    activate: Option<HandleFn>,
    run: Option<RunFn>,
    deactivate: Option<HandleFn>,
    cleanup: Option<HandleFn>,
    extension_data: Option<ExtensionDataFn>,
}

#[repr(C)]
pub(crate) struct RawLibDescriptor {
    handle: *mut c_void,
    size: u32,
    cleanup: Option<unsafe extern "C" fn(*mut c_void)>,
    get_plugin: Option<unsafe extern "C" fn(*mut c_void, u32) -> *const RawDescriptor>,
}

#[repr(C)]
struct UridMapFeature {
    handle: *mut c_void,
    map: Option<unsafe extern "C" fn(*mut c_void, *const c_char) -> u32>,
}

#[repr(C)]
struct UridUnmapFeature {
    handle: *mut c_void,
    unmap: Option<unsafe extern "C" fn(*mut c_void, u32) -> *const c_char>,
}

#[repr(C)]
struct LogFeature {
    handle: *mut c_void,
    printf: Option<unsafe extern "C" fn(*mut c_void, u32, *const c_char, ...) -> c_int>,
    vprintf: *const c_void,
}

#[repr(C)]
struct ScheduleFeature {
    handle: *mut c_void,
    schedule_work: Option<unsafe extern "C" fn(*mut c_void, u32, *const c_void) -> u32>,
}

#[repr(C)]
struct RawOption {
    context: u32,
    subject: u32,
    key: u32,
    size: u32,
    value_type: u32,
    value: *const c_void,
}

/// `state:mapPath`'s two functions and `state:makePath`'s: a path in, a string the host allocated out (or NULL).
type PathFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_char;
type FreePathFn = unsafe extern "C" fn(*mut c_void, *mut c_char);

#[repr(C)]
struct MapPathFeature {
    handle: *mut c_void,
    abstract_path: Option<PathFn>,
    absolute_path: Option<PathFn>,
}

#[repr(C)]
struct MakePathFeature {
    handle: *mut c_void,
    path: Option<PathFn>,
}

#[repr(C)]
struct FreePathFeature {
    handle: *mut c_void,
    free_path: Option<FreePathFn>,
}

#[repr(C)]
struct OptionsInterface {
    get: unsafe extern "C" fn(*mut c_void, *mut RawOption) -> u32,
    set: unsafe extern "C" fn(*mut c_void, *const RawOption) -> u32,
}

type RespondFn = unsafe extern "C" fn(*mut c_void, u32, *const c_void) -> u32;

#[repr(C)]
struct WorkerInterface {
    work: unsafe extern "C" fn(*mut c_void, Option<RespondFn>, *mut c_void, u32, *const c_void) -> u32,
    work_response: unsafe extern "C" fn(*mut c_void, u32, *const c_void) -> u32,
    end_run: unsafe extern "C" fn(*mut c_void) -> u32,
}

type StoreFn = unsafe extern "C" fn(*mut c_void, u32, *const c_void, usize, u32, u32) -> u32;
type RetrieveFn = unsafe extern "C" fn(*mut c_void, u32, *mut usize, *mut u32, *mut u32) -> *const c_void;

#[repr(C)]
struct StateInterface {
    save: unsafe extern "C" fn(*mut c_void, Option<StoreFn>, *mut c_void, u32, *const *const Feature) -> u32,
    restore: unsafe extern "C" fn(*mut c_void, Option<RetrieveFn>, *mut c_void, u32, *const *const Feature) -> u32,
}

const WORKER_SUCCESS: u32 = 0;
const WORKER_ERR_UNKNOWN: u32 = 1;
const STATE_SUCCESS: u32 = 0;
const STATE_ERR_UNKNOWN: u32 = 1;
const OPTIONS_ERR_UNKNOWN: u32 = 1;
const OPTIONS_ERR_BAD_VALUE: u32 = 8;

// ---- descriptors ----

/// One descriptor handed to the host, with everything its pointers point to. `raw` comes first so that the
/// descriptor pointer the host passes back to `instantiate` is a pointer to this struct.
#[repr(C)]
struct ProxyDescriptor {
    raw: RawDescriptor,
    library: Arc<Library>,
    index: usize,
    /// The plugin as its bundle describes it.
    info: PluginInfo,
    _uri: CString,
    /// Keys instances of the plugin stored at their saves in this process: what a restore retrieves from the host
    /// (a session saved by one instance is restored into another, maybe after the host closed and reopened the
    /// binary).
    state_keys: StateKeys,
}

/// The state keys one plugin's instances stored, shared by them.
type StateKeys = Arc<Mutex<Vec<u32>>>;

/// The state keys of each plugin (by URI) seen stored in this process, kept across the binary's closing.
static STATE_KEYS: Mutex<Option<HashMap<String, StateKeys>>> = Mutex::new(None);

fn state_keys_of(uri: &str) -> StateKeys {
    let mut all = STATE_KEYS.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(all.get_or_insert_with(HashMap::new).entry(uri.to_string()).or_default())
}

/// An LV2 binary under ward, with its descriptors built once.
pub(crate) struct ProxyLibrary {
    library: Arc<Library>,
    /// Complete before the host sees any: the vector never grows again, so the descriptors never move.
    descriptors: Vec<ProxyDescriptor>,
    /// What `lv2_lib_descriptor` returns (for binaries that export it), made at the first call, when the library
    /// has its place (and its number) in the runtime.
    lib_descriptor: OnceLock<RawLibDescriptor>,
}

// SAFETY: the raw pointers in a ProxyLibrary point into buffers the same struct owns, never changed after
// construction (the lib descriptor's handle is only an identifier); sharing or moving them between threads is as safe
// as sharing the owned data.
unsafe impl Send for ProxyLibrary {}
// SAFETY: as above; threads sharing it only read.
unsafe impl Sync for ProxyLibrary {}

impl ProxyLibrary {
    /// The binary at `path` opened at once in a domain of its own, and its plugins' ports read from its bundle. A
    /// plugin its bundle does not describe cannot be run (nothing says what to copy): it is left out, and said.
    pub(crate) fn open(
        sup: &Supervisor,
        path: &Path,
        isolation: Option<Isolation>,
    ) -> Result<ProxyLibrary, ClassError> {
        let infos = bundle::plugins_of_binary(path).map_err(|e| ClassError::BadPlugin {
            path: path.to_path_buf(),
            reason: format!("its bundle cannot be read: {e}"),
        })?;
        let library = Arc::new(Library::open(sup, path, isolation)?);
        let mut descriptors = Vec::new();
        for d in library.plugins() {
            let Some(info) = infos.iter().find(|i| i.uri == d.uri) else {
                // A binary may carry plugins its bundle does not offer (x42's UI variants, say): a host, which finds
                // plugins by the bundle's URIs, never asks for them.
                if let Some(rt) = runtime::get() {
                    rt.verbose_say(&format!(
                        "{}: plugin {} is not in its bundle's description: left out",
                        path.display(),
                        d.uri
                    ));
                }
                continue;
            };
            let uri = crate::c_string(&d.uri);
            let raw = RawDescriptor {
                uri: uri.as_ptr(),
                instantiate: Some(instantiate),
                connect_port: Some(connect_port),
                activate: d.has_activate.then_some(activate as HandleFn),
                run: Some(run),
                deactivate: d.has_deactivate.then_some(deactivate as HandleFn),
                cleanup: Some(cleanup),
                extension_data: Some(extension_data_for(d.has_state, d.has_worker, d.has_options)),
            };
            descriptors.push(ProxyDescriptor {
                raw,
                library: Arc::clone(&library),
                index: d.index,
                info: info.clone(),
                _uri: uri,
                state_keys: state_keys_of(&d.uri),
            });
        }
        Ok(ProxyLibrary { library, descriptors, lib_descriptor: OnceLock::new() })
    }

    pub(crate) fn path(&self) -> &Path {
        self.library.path()
    }

    pub(crate) fn extension(&self) -> Option<ward::Extension> {
        Some(self.library.extension().clone())
    }

    fn descriptor(&self, index: u32) -> *const c_void {
        self.descriptors
            .get(index as usize)
            .map_or(std::ptr::null(), |d| &d.raw as *const RawDescriptor as *const c_void)
    }
}

fn library(id: u64) -> Option<Arc<ProxyLibrary>> {
    match runtime::get()?.plugin(id)? {
        Plugin::Lv2(lib) => Some(lib),
        _ => None,
    }
}

/// `lv2_descriptor` of the proxy bound to library `id`.
#[no_mangle]
pub extern "C" fn ward_preload_lv2_descriptor(id: u64, index: u32) -> *const c_void {
    guarded_or("an LV2 lv2_descriptor", "no descriptor", std::ptr::null(), || {
        library(id).map_or(std::ptr::null(), |l| l.descriptor(index))
    })
}

/// `lv2_lib_descriptor` of the proxy bound to library `id`: the features given here are the library's, not an
/// instance's; the binary in its domain was given none, which plugins that export it accept.
#[no_mangle]
pub extern "C" fn ward_preload_lv2_lib_descriptor(id: u64) -> *const c_void {
    guarded_or("an LV2 lv2_lib_descriptor", "no library descriptor", std::ptr::null(), || {
        let Some(l) = library(id) else { return std::ptr::null() };
        let d = l.lib_descriptor.get_or_init(|| RawLibDescriptor {
            handle: id as usize as *mut c_void,
            size: std::mem::size_of::<RawLibDescriptor>() as u32,
            cleanup: Some(lib_cleanup),
            get_plugin: Some(lib_get_plugin),
        });
        // The library stays in the runtime (in an Arc that does not move it) until the host closes the binary.
        d as *const RawLibDescriptor as *const c_void
    })
}

unsafe extern "C" fn lib_get_plugin(handle: *mut c_void, index: u32) -> *const RawDescriptor {
    ward_preload_lv2_descriptor(handle as usize as u64, index) as *const RawDescriptor
}

/// Nothing to do: the library's domain goes when the host closes the binary.
unsafe extern "C" fn lib_cleanup(_handle: *mut c_void) {}

// ---- the host's features ----

/// The state extension's path functions a host offered, at instantiate or to one save or restore (handles as
/// numbers: they are the host's, only passed back).
#[derive(Default, Clone, Copy)]
struct HostPaths {
    /// `state:mapPath`: abstract_path, absolute_path.
    map: Option<(usize, PathFn, PathFn)>,
    make: Option<(usize, PathFn)>,
    free: Option<(usize, FreePathFn)>,
}

impl HostPaths {
    /// The path features of a feature list (the first of each, as a plugin looking one up finds it).
    ///
    /// # Safety
    /// `features` is NULL or a NULL-terminated array of valid features (LV2's contract).
    unsafe fn of(features: *const *const Feature) -> HostPaths {
        let mut paths = HostPaths::default();
        if features.is_null() {
            return paths;
        }
        let mut at = features;
        // SAFETY: walking a NULL-terminated array per the function's contract.
        while let Some(f) = unsafe { (*at).as_ref() } {
            at = at.wrapping_add(1);
            if f.uri.is_null() || f.data.is_null() {
                continue;
            }
            // SAFETY: a feature's URI is a C string.
            let uri = unsafe { CStr::from_ptr(f.uri) }.to_bytes();
            if uri == class::uri::STATE_MAP_PATH.as_bytes() {
                // SAFETY: the state:mapPath feature's data is an LV2_State_Map_Path.
                let m = unsafe { &*(f.data as *const MapPathFeature) };
                if let (Some(a), Some(b), None) = (m.abstract_path, m.absolute_path, paths.map) {
                    paths.map = Some((m.handle as usize, a, b));
                }
            } else if uri == class::uri::STATE_MAKE_PATH.as_bytes() {
                // SAFETY: the state:makePath feature's data is an LV2_State_Make_Path.
                let m = unsafe { &*(f.data as *const MakePathFeature) };
                if let (Some(path), None) = (m.path, paths.make) {
                    paths.make = Some((m.handle as usize, path));
                }
            } else if uri == class::uri::STATE_FREE_PATH.as_bytes() {
                // SAFETY: the state:freePath feature's data is an LV2_State_Free_Path.
                let m = unsafe { &*(f.data as *const FreePathFeature) };
                if let (Some(free), None) = (m.free_path, paths.free) {
                    paths.free = Some((m.handle as usize, free));
                }
            }
        }
        paths
    }

    fn offered(&self) -> PathFeatures {
        PathFeatures { map_path: self.map.is_some(), make_path: self.make.is_some(), free_path: self.free.is_some() }
    }
}

/// The host's URID map, unmap, log and path functions, as the class reaches them.
struct HostFeatures {
    map: Option<(usize, unsafe extern "C" fn(*mut c_void, *const c_char) -> u32)>,
    unmap: Option<(usize, unsafe extern "C" fn(*mut c_void, u32) -> *const c_char)>,
    log: Option<(usize, unsafe extern "C" fn(*mut c_void, u32, *const c_char, ...) -> c_int)>,
    /// URIs mapped by a host that offers no map (a plugin that requires none still gets one: the class's own).
    own: class::UridMap,
    /// makePath and freePath as offered at instantiate (valid for the instance's life).
    paths: HostPaths,
    /// The path functions of the save or restore in progress (valid only during it).
    call_paths: Mutex<Option<HostPaths>>,
    /// What the host's absolute_path answered, by abstract path: a restore replayed after a restart, when the host's
    /// functions of that restore are gone, gets the same answers.
    absolute_of: Mutex<HashMap<String, String>>,
}

impl HostFeatures {
    /// Run `f` (a save or restore) with the host's path functions `paths` in force.
    fn during<T>(&self, paths: HostPaths, f: impl FnOnce() -> T) -> T {
        *self.call_paths.lock().unwrap_or_else(|e| e.into_inner()) = Some(paths);
        let result = f();
        *self.call_paths.lock().unwrap_or_else(|e| e.into_inner()) = None;
        result
    }

    fn call_paths(&self) -> Option<HostPaths> {
        *self.call_paths.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Call one of the host's path functions on `path`: its answer copied, and the host's string freed with its
    /// freePath (of the call, or of the instance), or with `free` where it offers none, as the state extension says.
    fn host_path(&self, call: Option<HostPaths>, function: (usize, PathFn), path: &str) -> Option<String> {
        let c = CString::new(path).ok()?;
        let (handle, f) = function;
        // SAFETY: a path function the host offered for this call (or the instance's life), given a C string.
        let answer = unsafe { f(handle as *mut c_void, c.as_ptr()) };
        if answer.is_null() {
            return None;
        }
        // SAFETY: non-NULL, a NUL-terminated string the host allocated.
        let text = unsafe { CStr::from_ptr(answer) }.to_str().ok().map(str::to_owned);
        match call.and_then(|p| p.free).or(self.paths.free) {
            // SAFETY: the host's freePath, on the string its own function returned.
            Some((handle, free)) => unsafe { free(handle as *mut c_void, answer) },
            // SAFETY: without freePath the host's string is the C library's to free (the state extension).
            None => unsafe { libc::free(answer as *mut c_void) },
        }
        text
    }
}

impl Host for HostFeatures {
    fn map(&self, uri: &str) -> u32 {
        let Some((handle, map)) = self.map else { return self.own.map(uri) };
        let Ok(c) = CString::new(uri) else { return 0 };
        // SAFETY: the host offered this map for the instance's lifetime (LV2's contract for features), and may be
        // called from any thread; the string is a valid C string.
        unsafe { map(handle as *mut c_void, c.as_ptr()) }
    }

    fn unmap(&self, urid: u32) -> Option<String> {
        let Some((handle, unmap)) = self.unmap else { return self.own.unmap(urid) };
        // SAFETY: as for map; the result is NULL or a C string the host keeps.
        let p = unsafe { unmap(handle as *mut c_void, urid) };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-NULL, a NUL-terminated string per the unmap contract.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    fn log(&self, log_type: u32, message: &str) {
        let Some((handle, printf)) = self.log else { return };
        let c = crate::c_string(message);
        // SAFETY: the host's log printf, offered for the instance's lifetime, with a format that reads one string.
        unsafe {
            printf(handle as *mut c_void, log_type, c"%s".as_ptr(), c.as_ptr());
        }
    }

    fn abstract_path(&self, absolute: &str) -> Option<String> {
        let call = self.call_paths();
        let (handle, to_abstract, _) = call?.map?;
        self.host_path(call, (handle, to_abstract), absolute)
    }

    fn absolute_path(&self, abstract_path: &str) -> Option<String> {
        let call = self.call_paths();
        let mut known = self.absolute_of.lock().unwrap_or_else(|e| e.into_inner());
        let Some((handle, _, to_absolute)) = call.and_then(|p| p.map) else {
            return known.get(abstract_path).cloned();
        };
        let answer = self.host_path(call, (handle, to_absolute), abstract_path)?;
        known.insert(abstract_path.to_string(), answer.clone());
        Some(answer)
    }

    fn make_path(&self, path: &str) -> Option<String> {
        let call = self.call_paths();
        let make = call.and_then(|p| p.make).or(self.paths.make)?;
        self.host_path(call, make, path)
    }
}

/// What the host offered an instance, read off its feature list.
struct Offered {
    features: Features,
    host: HostFeatures,
    schedule: Option<(usize, unsafe extern "C" fn(*mut c_void, u32, *const c_void) -> u32)>,
    /// Features with data the class does not know: left out of the list the plugin sees.
    unknown: Vec<String>,
}

/// # Safety
/// `features` is NULL or a NULL-terminated array of valid features (LV2's contract for instantiate).
unsafe fn offered(features: *const *const Feature) -> Offered {
    let mut o = Offered {
        features: Features::default(),
        host: HostFeatures {
            map: None,
            unmap: None,
            log: None,
            own: class::UridMap::new(),
            // SAFETY: per the function's contract.
            paths: unsafe { HostPaths::of(features) },
            call_paths: Mutex::new(None),
            absolute_of: Mutex::new(HashMap::new()),
        },
        schedule: None,
        unknown: Vec::new(),
    };
    o.features.paths = PathFeatures { map_path: false, ..o.host.paths.offered() };
    if features.is_null() {
        return o;
    }
    let mut at = features;
    // SAFETY: walking a NULL-terminated array per the function's contract; each non-NULL entry is a valid feature.
    while let Some(f) = unsafe { (*at).as_ref() } {
        at = at.wrapping_add(1);
        if f.uri.is_null() {
            continue;
        }
        // SAFETY: a feature's URI is a C string.
        let uri = unsafe { CStr::from_ptr(f.uri) }.to_string_lossy().into_owned();
        let data = f.data;
        match uri.as_str() {
            class::uri::URID_MAP if !data.is_null() => {
                // SAFETY: the urid:map feature's data is an LV2_URID_Map.
                let m = unsafe { &*(data as *const UridMapFeature) };
                if let Some(map) = m.map {
                    o.host.map = Some((m.handle as usize, map));
                    o.features.urid_map = true;
                }
            }
            class::uri::URID_UNMAP if !data.is_null() => {
                // SAFETY: the urid:unmap feature's data is an LV2_URID_Unmap.
                let m = unsafe { &*(data as *const UridUnmapFeature) };
                if let Some(unmap) = m.unmap {
                    o.host.unmap = Some((m.handle as usize, unmap));
                    o.features.urid_unmap = true;
                }
            }
            class::uri::LOG if !data.is_null() => {
                // SAFETY: the log:log feature's data is an LV2_Log_Log.
                let l = unsafe { &*(data as *const LogFeature) };
                if let Some(printf) = l.printf {
                    o.host.log = Some((l.handle as usize, printf));
                    o.features.log = true;
                }
            }
            class::uri::WORKER_SCHEDULE if !data.is_null() => {
                // SAFETY: the worker:schedule feature's data is an LV2_Worker_Schedule.
                let s = unsafe { &*(data as *const ScheduleFeature) };
                if let Some(schedule) = s.schedule_work {
                    o.schedule = Some((s.handle as usize, schedule));
                    o.features.worker_schedule = true;
                }
            }
            class::uri::OPTIONS => {
                // SAFETY: the options feature's data is NULL or an array of options ending with a zero key.
                o.features.options = Some(unsafe { options(data as *const RawOption) });
            }
            // Read above; mapPath belongs to save and restore, where the host gives it again.
            class::uri::STATE_MAKE_PATH | class::uri::STATE_FREE_PATH | class::uri::STATE_MAP_PATH
                if !data.is_null() => {}
            class::uri::BOUNDED_BLOCK_LENGTH => o.features.bounded_block_length = true,
            class::uri::FIXED_BLOCK_LENGTH => o.features.fixed_block_length = true,
            class::uri::POWER_OF_2_BLOCK_LENGTH => o.features.power_of_2_block_length = true,
            known if class::uri::FLAG_FEATURES.contains(&known) && data.is_null() => o.features.flags.push(uri),
            _ => o.unknown.push(uri),
        }
    }
    o
}

/// The options most a host gives; more is taken as a missing terminator.
const MAX_OPTIONS: usize = 1024;

/// # Safety
/// `list` is NULL or an array of options ending with one whose key (and value) is zero (LV2's contract).
unsafe fn options(list: *const RawOption) -> Vec<OptionValue> {
    let mut out = Vec::new();
    if list.is_null() {
        return out;
    }
    for i in 0..MAX_OPTIONS {
        // SAFETY: within the array up to its terminator, per the function's contract.
        let o = unsafe { &*list.add(i) };
        if o.key == 0 && o.value.is_null() {
            break;
        }
        let value = if o.value.is_null() || o.size as usize > 65536 {
            Vec::new()
        } else {
            // SAFETY: an option's value points to `size` bytes.
            unsafe { std::slice::from_raw_parts(o.value as *const u8, o.size as usize) }.to_vec()
        };
        out.push(OptionValue { context: o.context, subject: o.subject, key: o.key, value_type: o.value_type, value });
    }
    out
}

// ---- instances ----

/// One instance as the host holds it: the wrapper's instance, where the host connected each port, and the wrapper's
/// own copies of the port data (the host's buffers may alias: an input and an output run in place).
struct ProxyInstance {
    instance: Instance,
    uri: String,
    specs: Vec<PortSpec>,
    connected: Vec<*mut c_void>,
    samples: Vec<Vec<f32>>,
    atoms: Vec<Vec<u8>>,
    /// The byte ranges of the host's connected buffers in the current block (see [`host_extents`]), kept to save an
    /// allocation per block.
    extents: Vec<(usize, usize)>,
    extents_sorted: Vec<(usize, usize)>,
    schedule: Option<(usize, unsafe extern "C" fn(*mut c_void, u32, *const c_void) -> u32)>,
    /// Keys the plugin's instances stored at their saves through this proxy (its descriptor's).
    state_keys: StateKeys,
    /// The host's features as the class reaches them (the path functions of a save or restore are set here).
    host: Arc<HostFeatures>,
    /// The values of the last options:interface get, where the host's options point until the next get.
    option_values: Mutex<Vec<Vec<u8>>>,
}

/// Plugins whose left-out features were reported (once each, with `-v`).
static REPORTED_UNKNOWN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// # Safety
/// `descriptor` is one of ours (the host got it from our `lv2_descriptor`); `bundle_path` is NULL or a C string;
/// `features` per LV2's contract.
unsafe extern "C" fn instantiate(
    descriptor: *const RawDescriptor,
    sample_rate: f64,
    bundle_path: *const c_char,
    features: *const *const Feature,
) -> *mut c_void {
    guarded_or("an LV2 instantiate", "no instance", std::ptr::null_mut(), || {
        if descriptor.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: our descriptors are the `raw` field, first in a repr(C) ProxyDescriptor that lives as long as its
        // library (the host must not use a descriptor after dlclose).
        let proxy = unsafe { &*(descriptor as *const ProxyDescriptor) };
        // SAFETY: per the function's contract.
        let offered = unsafe { offered(features) };
        let bundle = if bundle_path.is_null() {
            proxy.info.bundle.clone()
        } else {
            // SAFETY: a C string per the function's contract.
            PathBuf::from(unsafe { CStr::from_ptr(bundle_path) }.to_string_lossy().into_owned())
        };
        if !offered.unknown.is_empty() {
            report_unknown(&proxy.info.uri, &offered.unknown);
        }
        let specs: Vec<PortSpec> = proxy.info.ports.iter().map(PortSpec::from).collect();
        let realtime = offered.features.flags.iter().any(|f| f == class::uri::IS_LIVE);
        if let (Some(rt), true) = (runtime::get(), realtime) {
            rt.verbose_say(&format!("{}: instantiated by a real-time host (it offers lv2:isLive)", proxy.info.uri));
        }
        let host = Arc::new(offered.host);
        let setup = class::Setup {
            realtime,
            sample_rate,
            bundle,
            ports: specs.clone(),
            features: offered.features,
            host: Arc::clone(&host) as Arc<dyn Host>,
        };
        let result = inside_ward(|| proxy.library.instantiate(proxy.index, setup));
        report();
        match result {
            Ok(instance) => {
                let n = specs.len();
                let boxed = Box::new(ProxyInstance {
                    instance,
                    uri: proxy.info.uri.clone(),
                    specs,
                    connected: vec![std::ptr::null_mut(); n],
                    samples: vec![Vec::new(); n],
                    atoms: vec![Vec::new(); n],
                    extents: Vec::with_capacity(n),
                    extents_sorted: Vec::with_capacity(n),
                    schedule: offered.schedule,
                    state_keys: Arc::clone(&proxy.state_keys),
                    host,
                    option_values: Mutex::new(Vec::new()),
                });
                Box::into_raw(boxed) as *mut c_void
            }
            Err(e) => {
                if let Some(rt) = runtime::get() {
                    rt.say(&format!("{}: not instantiated: {e}", proxy.info.uri));
                }
                std::ptr::null_mut()
            }
        }
    })
}

fn report_unknown(uri: &str, unknown: &[String]) {
    let Some(rt) = runtime::get() else { return };
    let mut reported = REPORTED_UNKNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if reported.get_or_insert_with(HashSet::new).insert(uri.to_string()) {
        rt.verbose_say(&format!(
            "{uri}: features ward's LV2 class does not know were left out of what the plugin sees: {}",
            unknown.join(", ")
        ));
    }
}

/// # Safety
/// `handle` came from our `instantiate` and was not cleaned up. LV2's threading rules let the host call `run` (and
/// the audio-thread functions) from one thread at a time, and the worker and state functions, which take only a
/// shared reference here, from others.
unsafe fn instance<'a>(handle: *mut c_void) -> Option<&'a mut ProxyInstance> {
    // SAFETY: per the function's contract.
    unsafe { (handle as *mut ProxyInstance).as_mut() }
}

unsafe extern "C" fn connect_port(handle: *mut c_void, port: u32, location: *mut c_void) {
    // SAFETY: the host passes an instance of ours (LV2 contract).
    let Some(inst) = (unsafe { instance(handle) }) else { return };
    if let Some(slot) = inst.connected.get_mut(port as usize) {
        *slot = location;
    }
}

unsafe extern "C" fn activate(handle: *mut c_void) {
    guarded_or("an LV2 activate", "without the instance activated", (), || {
        // SAFETY: the host passes an instance of ours (LV2 contract).
        let Some(inst) = (unsafe { instance(handle) }) else { return };
        let _ = inside_ward(|| inst.instance.activate());
        report();
    })
}

unsafe extern "C" fn deactivate(handle: *mut c_void) {
    guarded_or("an LV2 deactivate", "without the instance deactivated", (), || {
        // SAFETY: the host passes an instance of ours (LV2 contract).
        let Some(inst) = (unsafe { instance(handle) }) else { return };
        let _ = inside_ward(|| inst.instance.deactivate());
        report();
    })
}

unsafe extern "C" fn cleanup(handle: *mut c_void) {
    // SAFETY: the host passes an instance of ours (from Box::into_raw) and never uses it again (LV2 contract).
    unsafe { instance::release::<ProxyInstance>("an LV2 cleanup", handle) }
}

/// The largest atom buffer taken from a host (its capacity is the host's word; the class's bound).
const MAX_ATOM_BYTES: usize = 64 << 20;

/// Whether the calling thread is scheduled in real time (`SCHED_FIFO` or `SCHED_RR`: a JACK process thread, say),
/// asked once per thread.
fn thread_is_realtime() -> bool {
    thread_local! {
        static REALTIME: bool = ward::placement::realtime_scheduling().is_some();
    }
    REALTIME.with(|r| *r)
}

unsafe extern "C" fn run(handle: *mut c_void, samples: u32) {
    // SAFETY: the host passes an instance of ours with its ports connected (LV2 contract), as `run_block` needs.
    guarded("an LV2 run", || unsafe { run_block(handle, samples) });
}

/// The work of `run`.
///
/// # Safety
/// `handle` is an instance of ours whose connected ports each hold at least `samples` values (LV2 contract).
unsafe fn run_block(handle: *mut c_void, samples: u32) {
    // SAFETY: the host passes an instance of ours (LV2 contract).
    let Some(inst) = (unsafe { instance(handle) }) else { return };
    let n = samples as usize;
    if !inst.instance.is_realtime() && thread_is_realtime() {
        // A host that runs the plugin on a real-time thread without saying so at instantiation (jalv under JACK).
        inst.instance.set_realtime();
        if let Some(rt) = runtime::get() {
            rt.verbose_say(&format!("{}: run from a real-time thread: blocks never wait for a recovery", inst.uri));
        }
    }
    // SAFETY: `n` is this run's block length (the host's contract for every connected port).
    if unsafe { host_extents(inst, n) } {
        let mut ports: Vec<PortBuffer<'_>> = Vec::with_capacity(inst.specs.len());
        for (i, spec) in inst.specs.iter().enumerate() {
            let p = inst.connected[i];
            let len = inst.extents.get(i).map_or(0, |&(start, end)| end - start);
            // SAFETY: `host_extents` found every connected buffer aligned for its kind and no two of them
            // overlapping, so each is borrowed once; the host connected each to at least `len` bytes, valid and
            // not touched by the host during this run (LV2's contract), and the borrows end with this block.
            ports.push(unsafe {
                match (p.is_null() || len == 0, spec.kind, spec.output) {
                    (true, _, _) | (_, PortKind::Other, _) => PortBuffer::Unconnected,
                    (_, PortKind::Atom, false) => {
                        PortBuffer::AtomInput(std::slice::from_raw_parts(p as *const u8, len))
                    }
                    (_, PortKind::Atom, true) => {
                        PortBuffer::AtomOutput(std::slice::from_raw_parts_mut(p as *mut u8, len))
                    }
                    (_, _, false) => PortBuffer::Input(std::slice::from_raw_parts(p as *const f32, len / 4)),
                    (_, _, true) => PortBuffer::Output(std::slice::from_raw_parts_mut(p as *mut f32, len / 4)),
                }
            });
        }
        let result = inside_ward(|| inst.instance.run(n, &mut ports));
        drop(ports);
        after_run(inst, result);
        return;
    }
    // Buffers that overlap (an input and an output run in place): every connected port copied to a buffer of its
    // own here, and the outputs copied back.
    for i in 0..inst.specs.len() {
        let p = inst.connected[i];
        if p.is_null() {
            continue;
        }
        match inst.specs[i].kind {
            PortKind::Audio | PortKind::Cv | PortKind::Control => {
                let len = if inst.specs[i].kind == PortKind::Control { 1 } else { n };
                let buf = &mut inst.samples[i];
                buf.resize(len, 0.0);
                // SAFETY: the host connected the port to at least `len` floats (one for a control port), valid for
                // this run (LV2's contract); copied, not borrowed, as ports may alias.
                unsafe { std::ptr::copy(p as *const f32, buf.as_mut_ptr(), len) };
            }
            PortKind::Atom => {
                let mut header = [0u8; 8];
                // SAFETY: an atom port points to at least an atom header (LV2's contract).
                unsafe { std::ptr::copy(p as *const u8, header.as_mut_ptr(), 8) };
                let size = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
                let total = (8 + size).min(MAX_ATOM_BYTES);
                let buf = &mut inst.atoms[i];
                buf.resize(total, 0);
                // An output's body is the plugin's to write (only its header, the capacity, goes in).
                let read = if inst.specs[i].output { 8 } else { total };
                // SAFETY: an input atom is its header and `size` bytes, an output at least its header (LV2's
                // contract for atom ports); readable for this run.
                unsafe { std::ptr::copy(p as *const u8, buf.as_mut_ptr(), read) };
            }
            PortKind::Other => {}
        }
    }
    let mut ports: Vec<PortBuffer<'_>> = Vec::with_capacity(inst.specs.len());
    let (samples_bufs, atom_bufs) = (&mut inst.samples, &mut inst.atoms);
    for ((spec, (s, a)), p) in
        inst.specs.iter().zip(samples_bufs.iter_mut().zip(atom_bufs.iter_mut())).zip(&inst.connected)
    {
        ports.push(match (p.is_null(), spec.kind, spec.output) {
            (true, _, _) | (_, PortKind::Other, _) => PortBuffer::Unconnected,
            (_, PortKind::Atom, false) => PortBuffer::AtomInput(a),
            (_, PortKind::Atom, true) => PortBuffer::AtomOutput(a),
            (_, _, false) => PortBuffer::Input(s),
            (_, _, true) => PortBuffer::Output(s),
        });
    }
    let result = inside_ward(|| inst.instance.run(n, &mut ports));
    drop(ports);
    copy_outputs_back(inst);
    after_run(inst, result);
}

/// Where the host's connected buffers lie for a block of `n` samples, into `inst.extents` (one byte range per port,
/// empty for one not connected): true when they can be borrowed as they are, each aligned for what it holds and no
/// two overlapping; false when they must be copied (a host that runs a plugin in place, an atom larger than the
/// proxy takes).
///
/// # Safety
/// The host connected every non-NULL port to a buffer valid for this run: `n` floats for audio and CV, one for a
/// control port, an atom header and the size it says for an atom (LV2's contract).
unsafe fn host_extents(inst: &mut ProxyInstance, n: usize) -> bool {
    inst.extents.clear();
    for (spec, &p) in inst.specs.iter().zip(&inst.connected) {
        let start = p as usize;
        let len = match spec.kind {
            _ if p.is_null() => 0,
            PortKind::Other => 0,
            PortKind::Audio | PortKind::Cv => n * 4,
            PortKind::Control => 4,
            PortKind::Atom => {
                let mut size = [0u8; 4];
                // SAFETY: an atom port points to at least an atom header (the function's contract).
                unsafe { std::ptr::copy(p as *const u8, size.as_mut_ptr(), 4) };
                let total = 8 + u32::from_le_bytes(size) as usize;
                if total > MAX_ATOM_BYTES {
                    return false;
                }
                total
            }
        };
        let align = if spec.kind == PortKind::Atom { 1 } else { 4 };
        if len != 0 && !start.is_multiple_of(align) {
            return false;
        }
        inst.extents.push((start, start + len));
    }
    let sorted = &mut inst.extents_sorted;
    sorted.clear();
    sorted.extend(inst.extents.iter().copied().filter(|r| r.0 != r.1));
    sorted.sort_unstable();
    sorted.windows(2).all(|w| w[0].1 <= w[1].0)
}

/// The outputs of a block run on the proxy's own copies back into the host's buffers.
fn copy_outputs_back(inst: &ProxyInstance) {
    for i in 0..inst.specs.len() {
        let p = inst.connected[i];
        if p.is_null() || !inst.specs[i].output {
            continue;
        }
        match inst.specs[i].kind {
            PortKind::Audio | PortKind::Cv | PortKind::Control => {
                let buf = &inst.samples[i];
                // SAFETY: the same buffer the host connected, of at least this many floats, writable for this run.
                unsafe { std::ptr::copy(buf.as_ptr(), p as *mut f32, buf.len()) };
            }
            PortKind::Atom => {
                let buf = &inst.atoms[i];
                let size = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                let total = (8 + size).min(buf.len());
                // SAFETY: within the capacity the host gave (checked by the class), writable for this run.
                unsafe { std::ptr::copy(buf.as_ptr(), p as *mut u8, total) };
            }
            PortKind::Other => {}
        }
    }
}

/// What follows every block: a refusal said, the requests it scheduled handed to the host, events reported.
fn after_run(inst: &ProxyInstance, result: Result<Processed, ClassError>) {
    if let Err(e) = &result {
        if let Some(rt) = runtime::get() {
            rt.say(&format!("{}: block refused: {e}", inst.uri));
        }
    }
    // Requests the block scheduled go to the host's worker, as the plugin would have sent them.
    if let Some((sched_handle, schedule)) = inst.schedule {
        for request in inst.instance.take_work() {
            // SAFETY: the host's schedule_work, offered for the instance's lifetime and callable from run.
            unsafe { schedule(sched_handle as *mut c_void, request.len() as u32, request.as_ptr() as *const c_void) };
        }
    }
    report();
}

// ---- extension data: the worker, state and options interfaces, where the plugin has them ----

static WORKER: WorkerInterface = WorkerInterface { work, work_response, end_run };
static STATE: StateInterface = StateInterface { save, restore };
static OPTIONS: OptionsInterface = OptionsInterface { get: options_get, set: options_set };

/// The `extension_data` of a plugin with the interfaces its parameters say (it takes no instance, so one function
/// per combination): any other URI gets NULL, as from a plugin that lacks it.
///
/// # Safety
/// `uri` is NULL or a C string (LV2's contract).
unsafe extern "C" fn ext_lookup<const STATE_: bool, const WORKER_: bool, const OPTIONS_: bool>(
    uri: *const c_char,
) -> *const c_void {
    guarded_or("an LV2 extension_data", "no extension", std::ptr::null(), || {
        if uri.is_null() {
            return std::ptr::null();
        }
        // SAFETY: per the function's contract.
        let uri = unsafe { CStr::from_ptr(uri) }.to_bytes();
        if STATE_ && uri == class::uri::STATE_INTERFACE.as_bytes() {
            return &STATE as *const StateInterface as *const c_void;
        }
        if WORKER_ && uri == class::uri::WORKER_INTERFACE.as_bytes() {
            return &WORKER as *const WorkerInterface as *const c_void;
        }
        if OPTIONS_ && uri == class::uri::OPTIONS_INTERFACE.as_bytes() {
            return &OPTIONS as *const OptionsInterface as *const c_void;
        }
        std::ptr::null()
    })
}

fn extension_data_for(state: bool, worker: bool, options: bool) -> ExtensionDataFn {
    match (state, worker, options) {
        (false, false, false) => ext_lookup::<false, false, false>,
        (true, false, false) => ext_lookup::<true, false, false>,
        (false, true, false) => ext_lookup::<false, true, false>,
        (true, true, false) => ext_lookup::<true, true, false>,
        (false, false, true) => ext_lookup::<false, false, true>,
        (true, false, true) => ext_lookup::<true, false, true>,
        (false, true, true) => ext_lookup::<false, true, true>,
        (true, true, true) => ext_lookup::<true, true, true>,
    }
}

/// The options of a host's list up to its terminator (a zero key with a NULL value), at most [`MAX_OPTIONS`].
///
/// # Safety
/// `list` is NULL or an array of options ending as above (LV2's contract).
unsafe fn option_list<'a>(list: *const RawOption) -> Vec<&'a RawOption> {
    let mut out = Vec::new();
    for i in 0..if list.is_null() { 0 } else { MAX_OPTIONS } {
        // SAFETY: within the array up to its terminator, per the function's contract.
        let o = unsafe { &*list.add(i) };
        if o.key == 0 && o.value.is_null() {
            break;
        }
        out.push(o);
    }
    out
}

/// options:interface's get: the options asked answered through the domain. The values stay where they are put
/// until the instance's next get.
unsafe extern "C" fn options_get(handle: *mut c_void, list: *mut RawOption) -> u32 {
    guarded_or("an LV2 options get", "an unknown error", OPTIONS_ERR_UNKNOWN, || {
        // SAFETY: the host passes an instance of ours.
        let Some(inst) = (unsafe { (handle as *const ProxyInstance).as_ref() }) else { return OPTIONS_ERR_UNKNOWN };
        // SAFETY: the host passes a terminated option list (LV2 contract).
        let asked: Vec<OptionKey> = unsafe { option_list(list) }
            .iter()
            .map(|o| OptionKey { context: o.context, subject: o.subject, key: o.key })
            .collect();
        if asked.iter().any(|k| k.key == 0) {
            return OPTIONS_ERR_UNKNOWN;
        }
        let got = inside_ward(|| inst.instance.get_options(&asked));
        report();
        let Ok(got) = got else { return OPTIONS_ERR_UNKNOWN };
        let mut kept = inst.option_values.lock().unwrap_or_else(|e| e.into_inner());
        kept.clear();
        for (i, value) in got.values.into_iter().enumerate() {
            let Some(value) = value else { continue };
            // The bytes stay put while the outer vector grows (each is a heap buffer of its own); one byte more, so
            // that even an empty value has a place to point to.
            let mut bytes = value.value;
            let size = bytes.len() as u32;
            bytes.push(0);
            // SAFETY: `i` is within the list just walked, which the host lets the plugin fill in (LV2 contract).
            let o = unsafe { &mut *list.add(i) };
            o.size = size;
            o.value_type = value.value_type;
            o.value = bytes.as_ptr() as *const c_void;
            kept.push(bytes);
        }
        got.status
    })
}

/// options:interface's set: the options copied into the domain (and replayed after a restart).
unsafe extern "C" fn options_set(handle: *mut c_void, list: *const RawOption) -> u32 {
    guarded_or("an LV2 options set", "an unknown error", OPTIONS_ERR_UNKNOWN, || {
        // SAFETY: the host passes an instance of ours.
        let Some(inst) = (unsafe { (handle as *const ProxyInstance).as_ref() }) else { return OPTIONS_ERR_UNKNOWN };
        let mut options = Vec::new();
        // SAFETY: the host passes a terminated option list (LV2 contract).
        for o in unsafe { option_list(list) } {
            if o.key == 0 || o.size as usize > 65536 || (o.value.is_null() && o.size != 0) {
                return OPTIONS_ERR_BAD_VALUE;
            }
            let value = if o.size == 0 {
                Vec::new()
            } else {
                // SAFETY: an option's value points to `size` bytes (LV2 contract).
                unsafe { std::slice::from_raw_parts(o.value as *const u8, o.size as usize) }.to_vec()
            };
            options.push(OptionValue {
                context: o.context,
                subject: o.subject,
                key: o.key,
                value_type: o.value_type,
                value,
            });
        }
        let status = inside_ward(|| inst.instance.set_options(&options));
        report();
        status.unwrap_or(OPTIONS_ERR_UNKNOWN)
    })
}

unsafe extern "C" fn work(
    handle: *mut c_void,
    respond: Option<RespondFn>,
    respond_handle: *mut c_void,
    size: u32,
    data: *const c_void,
) -> u32 {
    guarded_or("an LV2 worker call", "an unknown error", WORKER_ERR_UNKNOWN, || {
        // SAFETY: the host passes an instance of ours; the worker runs beside run, on a shared reference.
        let Some(inst) = (unsafe { (handle as *const ProxyInstance).as_ref() }) else { return WORKER_ERR_UNKNOWN };
        // SAFETY: the request's `size` bytes, valid for this call (LV2 contract).
        let request = unsafe { host_bytes(data, size) };
        let responses = inside_ward(|| inst.instance.work(&request));
        report();
        let Ok(responses) = responses else { return WORKER_ERR_UNKNOWN };
        let Some(respond) = respond else { return WORKER_SUCCESS };
        for r in responses {
            // SAFETY: the host's respond function for this request.
            unsafe { respond(respond_handle, r.len() as u32, r.as_ptr() as *const c_void) };
        }
        WORKER_SUCCESS
    })
}

/// A copy of the `size` bytes the host passes at `data` to a worker call or response (none when null or empty).
///
/// # Safety
/// A non-null `data` points to `size` readable bytes for the call.
unsafe fn host_bytes(data: *const c_void, size: u32) -> Vec<u8> {
    if data.is_null() || size == 0 {
        return Vec::new();
    }
    // SAFETY: non-null, so `size` readable bytes (the function's contract).
    unsafe { std::slice::from_raw_parts(data as *const u8, size as usize) }.to_vec()
}

unsafe extern "C" fn work_response(handle: *mut c_void, size: u32, body: *const c_void) -> u32 {
    guarded_or("an LV2 worker response", "an unknown error", WORKER_ERR_UNKNOWN, || {
        // SAFETY: the host passes an instance of ours, from the audio thread (LV2 contract).
        let Some(inst) = (unsafe { (handle as *const ProxyInstance).as_ref() }) else { return WORKER_ERR_UNKNOWN };
        // SAFETY: the response's `size` bytes, valid for this call (LV2 contract).
        let response = unsafe { host_bytes(body, size) };
        let _ = inside_ward(|| inst.instance.work_response(&response));
        report();
        WORKER_SUCCESS
    })
}

/// Done by the adapter after each run (DECISIONS.md): nothing left for the host's call.
unsafe extern "C" fn end_run(_handle: *mut c_void) -> u32 {
    WORKER_SUCCESS
}

/// A state record: key, type, flags, and the value.
fn state_records(blob: &[u8]) -> Vec<(u32, u32, u32, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    let word = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    while at + 16 <= blob.len() {
        let (key, kind, flags, size) = (word(blob, at), word(blob, at + 4), word(blob, at + 8), word(blob, at + 12));
        let size = size as usize;
        let padded = (size + 7) & !7;
        let Some(value) = blob.get(at + 16..at + 16 + size) else { break };
        out.push((key, kind, flags, value));
        at += 16 + padded;
    }
    out
}

unsafe extern "C" fn save(
    handle: *mut c_void,
    store: Option<StoreFn>,
    store_handle: *mut c_void,
    _flags: u32,
    features: *const *const Feature,
) -> u32 {
    guarded_or("an LV2 state save", "an unknown error", STATE_ERR_UNKNOWN, || {
        // SAFETY: the host passes an instance of ours.
        let Some(inst) = (unsafe { (handle as *const ProxyInstance).as_ref() }) else { return STATE_ERR_UNKNOWN };
        let Some(store) = store else { return STATE_ERR_UNKNOWN };
        // SAFETY: the host passes a NULL-terminated feature list, valid during the save (LV2 contract).
        let paths = unsafe { HostPaths::of(features) };
        let blob = inst.host.during(paths, || inside_ward(|| inst.instance.save_offering(paths.offered())));
        report();
        let Ok(blob) = blob else { return STATE_ERR_UNKNOWN };
        let records = state_records(&blob);
        let mut keys = inst.state_keys.lock().unwrap_or_else(|e| e.into_inner());
        for r in &records {
            if !keys.contains(&r.0) {
                keys.push(r.0);
            }
        }
        drop(keys);
        for (key, kind, flags, value) in records {
            // SAFETY: the host's store function for this save; the value lives until it returns.
            let status = unsafe { store(store_handle, key, value.as_ptr() as *const c_void, value.len(), kind, flags) };
            if status != STATE_SUCCESS {
                return status;
            }
        }
        STATE_SUCCESS
    })
}

unsafe extern "C" fn restore(
    handle: *mut c_void,
    retrieve: Option<RetrieveFn>,
    retrieve_handle: *mut c_void,
    _flags: u32,
    features: *const *const Feature,
) -> u32 {
    guarded_or("an LV2 state restore", "an unknown error", STATE_ERR_UNKNOWN, || {
        // SAFETY: the host passes an instance of ours.
        let Some(inst) = (unsafe { (handle as *const ProxyInstance).as_ref() }) else { return STATE_ERR_UNKNOWN };
        let Some(retrieve) = retrieve else { return STATE_ERR_UNKNOWN };
        // SAFETY: the host passes a NULL-terminated feature list, valid during the restore (LV2 contract).
        let paths = unsafe { HostPaths::of(features) };
        // The keys to ask the host for: those the plugin's instances stored at their saves here, else those it stores
        // now (a restore from a session saved by another process).
        let mut keys = inst.state_keys.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if keys.is_empty() {
            if let Ok(blob) = inside_ward(|| inst.instance.save_offering(PathFeatures::default())) {
                keys = state_records(&blob).iter().map(|r| r.0).collect();
            }
        }
        let mut blob = Vec::new();
        for key in keys {
            let (mut size, mut kind, mut flags) = (0usize, 0u32, 0u32);
            // SAFETY: the host's retrieve function for this restore, with valid out-pointers.
            let value = unsafe { retrieve(retrieve_handle, key, &mut size, &mut kind, &mut flags) };
            if value.is_null() || size > 256 << 20 {
                continue;
            }
            // SAFETY: the host returned `size` bytes at `value`, valid until the restore returns.
            let bytes = unsafe { std::slice::from_raw_parts(value as *const u8, size) };
            for w in [key, kind, flags, size as u32] {
                blob.extend_from_slice(&w.to_le_bytes());
            }
            blob.extend_from_slice(bytes);
            blob.resize((blob.len() + 7) & !7, 0);
        }
        let restored =
            inst.host.during(paths, || inside_ward(|| inst.instance.restore_offering(&blob, paths.offered())));
        report();
        match restored {
            Ok(_) => STATE_SUCCESS,
            Err(_) => STATE_ERR_UNKNOWN,
        }
    })
}
