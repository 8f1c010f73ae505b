//! LV2 (`lv2.h`) called directly in this process: a binary opened with `dlopen`, its plugins found by URI through
//! `lv2_lib_descriptor` or `lv2_descriptor` (in the class adapter's order), and instances given the features a Rust
//! host offers: the URID map and unmap of a [`Host`] (the same map the class reaches through its callback, so URIDs
//! and with them atom outputs come out the same natively and under ward), `options:options`, the `buf-size` flags and
//! features without data. A host offering `log:log` or `worker:schedule` is refused
//! ([`NativeCallError::FeatureNotOffered`]): this host has neither.
//!
//! The setup is the class's ([`Setup`]) and the buffers of a block are the class's [`PortBuffer`]s, borrowed for
//! that block only: every port is connected again before each `run`, so the plugin never holds a pointer to memory
//! the caller has since let go (LV2 lets a plugin touch port buffers only inside `run`). `activate` waits for the
//! first block's connections, as the class adapter's does, so both call the plugin in the same order.
//!
//! A library, once opened, stays loaded for the life of the process: plugins that start threads or register
//! destructors crash a host that unloads them, and the hosts here are tests and throwaway processes.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::text;
use crate::abi::{Lv2Descriptor, Lv2Feature, Lv2LibDescriptor, Lv2OptionsOption, Lv2UridMap, Lv2UridUnmap};
use crate::error::NativeCallError;
use crate::lv2::{uri, Features, Host, PortBuffer, PortKind, PortSpec, Setup};

/// More descriptors than any LV2 library has (the adapter's bound).
pub const MAX_DESCRIPTORS: u32 = 4096;
/// Bytes of an atom's header (size, type).
const ATOM_HEADER: usize = 8;

type DescriptorFn = unsafe extern "C" fn(u32) -> *const Lv2Descriptor;
type LibDescriptorFn = unsafe extern "C" fn(*const c_char, *const *const Lv2Feature) -> *const Lv2LibDescriptor;

/// Where a library's descriptors come from.
enum Entry {
    Lib(&'static Lv2LibDescriptor),
    Plain(DescriptorFn),
}

/// An LV2 plugin binary loaded into this process.
pub struct Library {
    entry: Entry,
    path: String,
}

/// The `dlerror` text, or `fallback`.
fn dl_error(fallback: &str) -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message valid until the next dl call on this thread.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        fallback.to_string()
    } else {
        text(p)
    }
}

impl Library {
    /// Load the binary at `path` (its bundle is its directory, as for the class adapter) and find its descriptors:
    /// `lv2_lib_descriptor` when it exports one that gives a descriptor, else `lv2_descriptor`.
    pub fn open(path: &Path) -> Result<Library, NativeCallError> {
        let shown = path.display().to_string();
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| NativeCallError::NulInString { what: "the library path" })?;
        let mut bundle = path.parent().map(|d| d.as_os_str().as_encoded_bytes().to_vec()).unwrap_or_default();
        bundle.push(b'/');
        let bundle = CString::new(bundle).map_err(|_| NativeCallError::NulInString { what: "the bundle path" })?;
        // SAFETY: dlopen with a C string; loading runs the library's constructors, which a native host trusts (see
        // the module's note on trust). The handle is never closed (see this module's note).
        let dl = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if dl.is_null() {
            return Err(NativeCallError::Load { path: shown, reason: dl_error("dlopen failed") });
        }
        // SAFETY: dlsym on the live handle with C strings.
        let (lib_fn, plain_fn) =
            unsafe { (libc::dlsym(dl, c"lv2_lib_descriptor".as_ptr()), libc::dlsym(dl, c"lv2_descriptor".as_ptr())) };
        if !lib_fn.is_null() {
            // SAFETY: `lv2_lib_descriptor` is declared in lv2.h as `LibDescriptorFn`.
            let lib_fn = unsafe { std::mem::transmute::<*mut c_void, LibDescriptorFn>(lib_fn) };
            let no_features = [std::ptr::null::<Lv2Feature>()];
            // SAFETY: called with a NUL-terminated bundle path and an empty, NULL-terminated feature list (as the
            // adapter calls it); it returns NULL or a descriptor valid while the library is loaded, which is for the
            // process's life.
            let lib = unsafe { lib_fn(bundle.as_ptr(), no_features.as_ptr()).as_ref() };
            if let Some(lib) = lib.filter(|l| l.get_plugin.is_some()) {
                return Ok(Library { entry: Entry::Lib(lib), path: shown });
            }
        }
        if plain_fn.is_null() {
            return Err(NativeCallError::NotExported { symbol: "lv2_descriptor" });
        }
        // SAFETY: `lv2_descriptor` is declared in lv2.h as `DescriptorFn`.
        let plain = unsafe { std::mem::transmute::<*mut c_void, DescriptorFn>(plain_fn) };
        Ok(Library { entry: Entry::Plain(plain), path: shown })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Plugin `index`, or `None` past the last.
    pub fn plugin(&self, index: u32) -> Option<Plugin<'_>> {
        if index >= MAX_DESCRIPTORS {
            return None;
        }
        let raw = match self.entry {
            // SAFETY: `get_plugin` (checked present when opened) takes the library's handle and an index and returns
            // NULL or a descriptor valid while the library is loaded.
            Entry::Lib(lib) => unsafe { lib.get_plugin.map(|g| g(lib.handle, index)) },
            // SAFETY: `lv2_descriptor` returns NULL or a descriptor valid while the library is loaded.
            Entry::Plain(f) => Some(unsafe { f(index) }),
        };
        // SAFETY: NULL or a descriptor that lives as long as the library (above), hence as long as `self`.
        raw.and_then(|p| unsafe { p.as_ref() }).map(|raw| Plugin { raw })
    }

    /// Every plugin, in index order (until the first NULL).
    pub fn plugins(&self) -> Vec<Plugin<'_>> {
        (0..MAX_DESCRIPTORS).map_while(|i| self.plugin(i)).collect()
    }

    /// The plugin whose URI is `uri`.
    pub fn find(&self, uri: &str) -> Result<Plugin<'_>, NativeCallError> {
        let all = self.plugins();
        let count = all.len();
        all.into_iter().find(|p| p.uri() == uri).ok_or_else(|| NativeCallError::NoSuchPlugin { uri: uri.into(), count })
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        if let Entry::Lib(lib) = self.entry {
            if let Some(cleanup) = lib.cleanup {
                // SAFETY: the library descriptor's cleanup takes its handle; no plugin of it outlives `self` (they
                // borrow it) and the descriptor is not used again.
                unsafe { cleanup(lib.handle) };
            }
        }
    }
}

/// One plugin of a library: a view of its descriptor.
#[derive(Clone, Copy)]
pub struct Plugin<'l> {
    raw: &'l Lv2Descriptor,
}

impl<'l> Plugin<'l> {
    pub fn uri(&self) -> String {
        text(self.raw.uri)
    }

    /// `extension_data(uri)` is not NULL.
    pub fn has_extension(&self, interface: &str) -> bool {
        let (Some(f), Ok(c)) = (self.raw.extension_data, CString::new(interface)) else {
            return false;
        };
        // SAFETY: `extension_data` takes a C string and returns NULL or the plugin's static interface.
        !unsafe { f(c.as_ptr()) }.is_null()
    }

    /// An instance made with `setup`'s sample rate, bundle, ports and features (its `realtime` says nothing to a
    /// native host). No port is connected and it is not active yet.
    pub fn instantiate(&self, setup: Setup) -> Result<Instance<'l>, NativeCallError> {
        let d = self.raw;
        let instantiate = d.instantiate.ok_or(NativeCallError::NoFunction { function: "instantiate" })?;
        let connect = d.connect_port.ok_or(NativeCallError::NoFunction { function: "connect_port" })?;
        let mut bundle = setup.bundle.as_os_str().as_encoded_bytes().to_vec();
        if bundle.last() != Some(&b'/') {
            bundle.push(b'/');
        }
        let bundle = CString::new(bundle).map_err(|_| NativeCallError::NulInString { what: "the bundle path" })?;
        let features = FeatureSet::new(&setup.features, Arc::clone(&setup.host))?;
        // SAFETY: lv2.h's `instantiate`: the descriptor itself, the rate, a NUL-terminated bundle path ending in
        // '/', and a NULL-terminated feature list that stays valid (heap memory the instance owns) until cleanup.
        let handle = unsafe { instantiate(d, setup.sample_rate, bundle.as_ptr(), features.list.as_ptr()) };
        if handle.is_null() {
            return Err(NativeCallError::InstantiateReturnedNull);
        }
        Ok(Instance { raw: d, connect, handle, ports: setup.ports, _features: features, state: Activation::Inactive })
    }
}

/// What the URID features' handles lead to: the host, and the URIs unmapped so far (a plugin may keep the pointer
/// `unmap` gives it for as long as the instance lives).
struct HostGlue {
    host: Arc<dyn Host>,
    unmapped: Mutex<HashMap<u32, CString>>,
}

unsafe extern "C" fn map_uri(handle: *mut c_void, uri: *const c_char) -> u32 {
    if handle.is_null() || uri.is_null() {
        return 0;
    }
    // SAFETY: the handle is the instance's `HostGlue`, alive until its cleanup; `uri` is a NUL-terminated string
    // (urid.h's contract).
    let (glue, uri) = unsafe { (&*handle.cast::<HostGlue>(), CStr::from_ptr(uri)) };
    match uri.to_str() {
        Ok(u) if !u.is_empty() => glue.host.map(u),
        _ => 0,
    }
}

unsafe extern "C" fn unmap_urid(handle: *mut c_void, urid: u32) -> *const c_char {
    if handle.is_null() {
        return std::ptr::null();
    }
    // SAFETY: the handle is the instance's `HostGlue`, alive until its cleanup.
    let glue = unsafe { &*handle.cast::<HostGlue>() };
    let mut unmapped = glue.unmapped.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = unmapped.get(&urid) {
        return c.as_ptr();
    }
    match glue.host.unmap(urid).and_then(|u| CString::new(u).ok()) {
        // A CString's bytes live on the heap: they stay where they are when the map grows, until the instance ends.
        Some(c) => unmapped.entry(urid).or_insert(c).as_ptr(),
        None => std::ptr::null(),
    }
}

/// The features an instance was given, at stable heap addresses for as long as it lives.
struct FeatureSet {
    _glue: Box<HostGlue>,
    _map: Box<Lv2UridMap>,
    _unmap: Box<Lv2UridUnmap>,
    _options: Vec<Lv2OptionsOption>,
    /// Each option's value, 8-byte aligned.
    _option_values: Vec<Vec<u64>>,
    _uris: Vec<CString>,
    _features: Vec<Lv2Feature>,
    /// What the plugin is given: pointers into `_features`, then NULL.
    list: Vec<*const Lv2Feature>,
}

impl FeatureSet {
    fn new(f: &Features, host: Arc<dyn Host>) -> Result<FeatureSet, NativeCallError> {
        if f.log {
            return Err(NativeCallError::FeatureNotOffered { feature: uri::LOG });
        }
        if f.worker_schedule {
            return Err(NativeCallError::FeatureNotOffered { feature: uri::WORKER_SCHEDULE });
        }
        let mut glue = Box::new(HostGlue { host, unmapped: Mutex::new(HashMap::new()) });
        let handle = (&mut *glue as *mut HostGlue).cast::<c_void>();
        let mut map = Box::new(Lv2UridMap { handle, map: map_uri });
        let mut unmap = Box::new(Lv2UridUnmap { handle, unmap: unmap_urid });
        let mut option_values = Vec::new();
        let mut options = Vec::new();
        for o in f.options.as_deref().unwrap_or_default() {
            let mut words = vec![0u64; o.value.len().div_ceil(8)];
            bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..o.value.len()].copy_from_slice(&o.value);
            options.push(Lv2OptionsOption {
                context: o.context,
                subject: o.subject,
                key: o.key,
                size: o.value.len() as u32,
                value_type: o.value_type,
                // A Vec's heap block stays put when the Vec moves into `option_values`.
                value: words.as_ptr().cast::<c_void>(),
            });
            option_values.push(words);
        }
        // The list's end: an option of key 0 and a NULL value.
        options.push(Lv2OptionsOption {
            context: 0,
            subject: 0,
            key: 0,
            size: 0,
            value_type: 0,
            value: std::ptr::null(),
        });
        // In the adapter's order: map, unmap, options, the buf-size flags, then the features without data.
        let mut offered: Vec<(String, *mut c_void)> = Vec::new();
        if f.urid_map {
            offered.push((uri::URID_MAP.into(), (&mut *map as *mut Lv2UridMap).cast()));
        }
        if f.urid_unmap {
            offered.push((uri::URID_UNMAP.into(), (&mut *unmap as *mut Lv2UridUnmap).cast()));
        }
        if f.options.is_some() {
            offered.push((uri::OPTIONS.into(), options.as_mut_ptr().cast()));
        }
        for (on, name) in [
            (f.bounded_block_length, uri::BOUNDED_BLOCK_LENGTH),
            (f.fixed_block_length, uri::FIXED_BLOCK_LENGTH),
            (f.power_of_2_block_length, uri::POWER_OF_2_BLOCK_LENGTH),
        ] {
            if on {
                offered.push((name.into(), std::ptr::null_mut()));
            }
        }
        offered.extend(f.flags.iter().map(|name| (name.clone(), std::ptr::null_mut())));
        let uris = offered
            .iter()
            .map(|(name, _)| CString::new(name.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| NativeCallError::NulInString { what: "a feature's URI" })?;
        let features: Vec<Lv2Feature> =
            uris.iter().zip(&offered).map(|(u, &(_, data))| Lv2Feature { uri: u.as_ptr(), data }).collect();
        let list = features.iter().map(|f| f as *const Lv2Feature).chain(std::iter::once(std::ptr::null())).collect();
        Ok(FeatureSet {
            _glue: glue,
            _map: map,
            _unmap: unmap,
            _options: options,
            _option_values: option_values,
            _uris: uris,
            _features: features,
            list,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    Inactive,
    /// `activate` asked for, called at the next block after its connections.
    Pending,
    Active,
}

/// An instance of an LV2 plugin; deactivated (if active) and cleaned up when dropped.
pub struct Instance<'l> {
    raw: &'l Lv2Descriptor,
    connect: unsafe extern "C" fn(*mut c_void, u32, *mut c_void),
    handle: *mut c_void,
    ports: Vec<PortSpec>,
    /// Lent to the plugin at `instantiate`: dropped after its cleanup.
    _features: FeatureSet,
    state: Activation,
}

impl Instance<'_> {
    /// The ports the instance was made with.
    pub fn ports(&self) -> &[PortSpec] {
        &self.ports
    }

    /// Activate the instance: at its next block, once that block's buffers are connected.
    pub fn activate(&mut self) {
        if self.state == Activation::Inactive {
            self.state = Activation::Pending;
        }
    }

    pub fn deactivate(&mut self) {
        match self.state {
            Activation::Inactive => {}
            Activation::Pending => self.state = Activation::Inactive,
            Activation::Active => {
                if let Some(deactivate) = self.raw.deactivate {
                    // SAFETY: lv2.h's `deactivate` takes the live instance's handle.
                    unsafe { deactivate(self.handle) };
                }
                self.state = Activation::Inactive;
            }
        }
    }

    /// Check `ports` against the instance's ports for a block of `samples`, as the class checks them.
    fn check(&self, samples: usize, ports: &[PortBuffer<'_>]) -> Result<(), NativeCallError> {
        if ports.len() != self.ports.len() {
            return Err(NativeCallError::PortCount { given: ports.len(), ports: self.ports.len() });
        }
        for (port, (spec, buf)) in self.ports.iter().zip(ports).enumerate() {
            let wrong = |what: String| Err(NativeCallError::WrongBuffer { port, what });
            let short = |len: usize| format!("{len} samples for a block of {samples}");
            match (spec.kind, spec.output, buf) {
                (_, _, PortBuffer::Unconnected) => {}
                (PortKind::Audio | PortKind::Cv, false, PortBuffer::Input(s)) if s.len() < samples => {
                    return wrong(short(s.len()))
                }
                (PortKind::Audio | PortKind::Cv, true, PortBuffer::Output(s)) if s.len() < samples => {
                    return wrong(short(s.len()))
                }
                (PortKind::Audio | PortKind::Cv, false, PortBuffer::Input(_))
                | (PortKind::Audio | PortKind::Cv, true, PortBuffer::Output(_)) => {}
                (PortKind::Control, false, PortBuffer::Input(s)) if !s.is_empty() => {}
                (PortKind::Control, true, PortBuffer::Output(s)) if !s.is_empty() => {}
                (PortKind::Atom, false, PortBuffer::AtomInput(s)) => {
                    if s.len() < ATOM_HEADER || !(s.as_ptr() as usize).is_multiple_of(8) {
                        return wrong(format!("an atom of {} bytes, or not 8-byte aligned", s.len()));
                    }
                    let size = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
                    if ATOM_HEADER.saturating_add(size) > s.len() {
                        return wrong(format!("an atom claims {size} bytes in a buffer of {}", s.len()));
                    }
                }
                (PortKind::Atom, true, PortBuffer::AtomOutput(s)) => {
                    if s.len() < ATOM_HEADER
                        || !(s.as_ptr() as usize).is_multiple_of(8)
                        || s.len() - ATOM_HEADER > u32::MAX as usize
                    {
                        return wrong(format!("an atom buffer of {} bytes, or not 8-byte aligned", s.len()));
                    }
                }
                (kind, output, _) => {
                    let dir = if output { "output" } else { "input" };
                    return wrong(format!("a buffer of another kind for a {kind:?} {dir}"));
                }
            }
        }
        Ok(())
    }

    /// Run one block of `samples` samples with `ports` (one buffer per port, in port order): each port connected to
    /// its buffer (NULL for [`PortBuffer::Unconnected`]), an atom output's size set to its capacity (its type left
    /// as the caller set it), a pending activation done, then `run`. What the plugin writes stays where it wrote it.
    pub fn run(&mut self, samples: usize, ports: &mut [PortBuffer<'_>]) -> Result<(), NativeCallError> {
        let run = self.raw.run.ok_or(NativeCallError::NoFunction { function: "run" })?;
        self.check(samples, ports)?;
        let samples = u32::try_from(samples)
            .map_err(|_| NativeCallError::WrongBuffer { port: 0, what: format!("a block of {samples} samples") })?;
        for (port, buf) in ports.iter_mut().enumerate() {
            let data: *mut c_void = match buf {
                PortBuffer::Unconnected => std::ptr::null_mut(),
                PortBuffer::Input(s) => s.as_ptr().cast_mut().cast(),
                PortBuffer::Output(s) => s.as_mut_ptr().cast(),
                PortBuffer::AtomInput(s) => s.as_ptr().cast_mut().cast(),
                PortBuffer::AtomOutput(s) => {
                    let capacity = (s.len() - ATOM_HEADER) as u32;
                    s[..4].copy_from_slice(&capacity.to_le_bytes());
                    s.as_mut_ptr().cast()
                }
            };
            // SAFETY: lv2.h's `connect_port` with the live handle and a port below the count the setup gave; the
            // buffer fits the port's kind and the block (checked) and outlives the `run` below, the only call that
            // may use it. An input's buffer is the caller's shared slice: a plugin writing to an input breaks LV2's
            // contract, which a native host trusts (see the module's note on trust).
            unsafe { (self.connect)(self.handle, port as u32, data) };
        }
        if self.state == Activation::Pending {
            if let Some(activate) = self.raw.activate {
                // SAFETY: lv2.h's `activate` takes the live instance's handle; its ports are connected (above).
                unsafe { activate(self.handle) };
            }
            self.state = Activation::Active;
        }
        // SAFETY: lv2.h's `run` with the live handle and the block's length; every port is connected to a buffer
        // that holds the block (checked) and is alive for the call.
        unsafe { run(self.handle, samples) };
        Ok(())
    }

    /// Give the instance up without calling the plugin again (no `deactivate`, no `cleanup`): after it misbehaved,
    /// say. Its features stay allocated (the plugin may still point at them).
    pub fn abandon(self) {
        std::mem::forget(self);
    }
}

impl Drop for Instance<'_> {
    fn drop(&mut self) {
        self.deactivate();
        if let Some(cleanup) = self.raw.cleanup {
            // SAFETY: lv2.h's `cleanup` ends the live instance, which is not used again; its features are dropped
            // after it.
            unsafe { cleanup(self.handle) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lv2::{OptionValue, UridMap};

    /// The feature `name` of `set`'s list, read as a plugin reads it.
    fn feature(set: &FeatureSet, name: &str) -> Option<*mut c_void> {
        set.list.iter().take_while(|f| !f.is_null()).find_map(|&f| {
            // SAFETY: every pointer before the NULL points into `set._features`, whose URIs are C strings of
            // `set._uris`; `set` outlives this read.
            let f = unsafe { &*f };
            // SAFETY: the feature's URI is a C string of `set._uris` (above).
            let uri = unsafe { CStr::from_ptr(f.uri) };
            (uri.to_str() == Ok(name)).then_some(f.data)
        })
    }

    #[test]
    fn the_features_lead_to_the_hosts_map_and_end_where_lv2_says() {
        let host = Arc::new(UridMap::new());
        let known = host.map("urn:ward:known");
        let features = Features {
            urid_map: true,
            urid_unmap: true,
            fixed_block_length: true,
            options: Some(vec![OptionValue { context: 0, subject: 0, key: 7, value_type: 9, value: vec![1, 2, 3] }]),
            flags: vec![uri::IS_LIVE.to_string()],
            ..Features::default()
        };
        let set = FeatureSet::new(&features, host.clone()).expect("features it offers");
        assert_eq!(set.list.len(), 6, "map, unmap, options, one buf-size flag, one flag, then NULL");
        assert!(set.list.last().is_some_and(|f| f.is_null()));
        assert_eq!(feature(&set, uri::FIXED_BLOCK_LENGTH), Some(std::ptr::null_mut()));
        assert_eq!(feature(&set, uri::IS_LIVE), Some(std::ptr::null_mut()));
        assert_eq!(feature(&set, uri::BOUNDED_BLOCK_LENGTH), None);

        let map = feature(&set, uri::URID_MAP).expect("urid:map").cast::<Lv2UridMap>();
        let unmap = feature(&set, uri::URID_UNMAP).expect("urid:unmap").cast::<Lv2UridUnmap>();
        // SAFETY: the features' data are the map and unmap structs `set` owns; their functions take their handles
        // and C strings, as a plugin calls them.
        unsafe {
            let (map, unmap) = (&*map, &*unmap);
            assert_eq!((map.map)(map.handle, c"urn:ward:known".as_ptr()), known, "the host's own URIDs");
            let fresh = (map.map)(map.handle, c"urn:ward:fresh".as_ptr());
            assert_eq!(host.unmap(fresh).as_deref(), Some("urn:ward:fresh"), "mapped in the host's map");
            let first = (unmap.unmap)(unmap.handle, fresh);
            assert_eq!(CStr::from_ptr(first).to_str(), Ok("urn:ward:fresh"));
            assert_eq!((unmap.unmap)(unmap.handle, fresh), first, "the same pointer every time");
            assert!((unmap.unmap)(unmap.handle, 999).is_null(), "an unknown URID unmaps to NULL");
        }

        let options = feature(&set, uri::OPTIONS).expect("options:options").cast::<Lv2OptionsOption>();
        // SAFETY: the options feature's data is `set._options`, two entries long (one option, then the end).
        let (first, end) = unsafe { (&*options, &*options.add(1)) };
        assert_eq!((first.key, first.value_type, first.size), (7, 9, 3));
        assert_eq!(first.value as usize % 8, 0, "values are 8-byte aligned");
        // SAFETY: the value holds `size` bytes (copied in by `FeatureSet::new`).
        assert_eq!(unsafe { std::slice::from_raw_parts(first.value.cast::<u8>(), 3) }, [1, 2, 3]);
        assert!(end.key == 0 && end.value.is_null(), "the list ends with a zero key and a NULL value");
    }

    #[test]
    fn a_log_or_a_worker_is_refused() {
        for f in
            [Features { log: true, ..Features::default() }, Features { worker_schedule: true, ..Features::default() }]
        {
            let refused = FeatureSet::new(&f, Arc::new(UridMap::new())).err();
            assert!(matches!(refused, Some(NativeCallError::FeatureNotOffered { .. })));
        }
    }
}
