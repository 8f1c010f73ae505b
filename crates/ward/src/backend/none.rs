//! The `none` backend: the extension is loaded into the host with `dlopen` and called directly. No protection at
//! all; it is the baseline every figure is compared with, and what a host without ward does.

use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ward_abi::RegRet;

use super::{
    Added, Backend, BackendError, Callable, ExtensionSpec, Refused, StartError, ThreadFunction, Unlocked, WireValue,
};
use crate::events::RestartVia;
use crate::tracker::Tracker;

pub(crate) struct NoneBackend {
    specs: Vec<ExtensionSpec>,
    handles: Vec<Handle>,
}

struct Handle(*mut c_void);

// SAFETY: a dlopen handle is a process-wide token; libdl's functions are thread-safe.
unsafe impl Send for Handle {}

impl NoneBackend {
    pub fn load(specs: Vec<ExtensionSpec>) -> Result<NoneBackend, OpenError> {
        let mut b = NoneBackend { specs, handles: Vec::new() };
        b.open_all()?;
        Ok(b)
    }

    fn open_all(&mut self) -> Result<(), OpenError> {
        for spec in &self.specs {
            self.handles.push(open(spec)?);
        }
        Ok(())
    }
}

/// Why an extension could not be loaded into the host.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error("{} contains a NUL byte", .0.display())]
    NulInPath(PathBuf),
    /// The dynamic linker's own words.
    #[error("{0}")]
    Dlopen(String),
    #[error("init function `{0}` not found")]
    InitMissing(String),
    #[error("init function `{init}` returned {code}")]
    InitFailed { init: String, code: i64 },
}

/// Load one extension into this process and run its init function.
fn open(spec: &ExtensionSpec) -> Result<Handle, OpenError> {
    let path =
        CString::new(spec.path.as_os_str().as_encoded_bytes()).map_err(|_| OpenError::NulInPath(spec.path.clone()))?;
    // SAFETY: a valid C string; loading runs the extension's constructors in this process, which is what the `none`
    // isolation kind means.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(OpenError::Dlopen(dlerror()));
    }
    if let Some(init) = &spec.init {
        let f = lookup(h, init).ok_or_else(|| OpenError::InitMissing(init.clone()))?;
        // SAFETY: f was resolved with dlsym in the library just loaded, and the policy declares init as
        // `int64_t init(void)`: no argument is read.
        let r = unsafe { ward_abi::call_native(f, &ward_abi::RegArgs::default()) };
        if r.int != 0 {
            return Err(OpenError::InitFailed { init: init.clone(), code: r.as_i64() });
        }
    }
    Ok(Handle(h))
}

impl Backend for NoneBackend {
    fn resolve(&mut self, ext: usize, symbol: &str) -> Result<Callable, BackendError> {
        let h = self.handles.get(ext).ok_or_else(|| BackendError::Usage(format!("no extension {ext}")))?;
        let f = lookup(h.0, symbol).ok_or(BackendError::UnknownSymbol)?;
        Ok(Callable::OnThread(Arc::new(NoneFunction(f))))
    }

    fn add_extension(&mut self, _: &mut Tracker, spec: ExtensionSpec) -> Result<Added, Refused> {
        let handle = open(&spec).map_err(|e| Refused { reason: e.to_string(), restart: false })?;
        self.handles.push(handle);
        self.specs.push(spec);
        Ok(Added::InPlace)
    }

    fn replace_image(&mut self, index: usize, path: PathBuf) {
        if let Some(spec) = self.specs.get_mut(index) {
            spec.path = path;
        }
    }

    fn extensions(&self) -> Vec<ExtensionSpec> {
        self.specs.clone()
    }

    /// Nothing to stop: the extensions are the host's own code now.
    fn stop(&mut self) {}

    /// An extension in the host cannot fail without taking the host with it; a "restart" only happens when the
    /// core reconfigures (a group gained an extension). dlopen of an already loaded object returns it as it is.
    fn restart(&mut self, _: &mut Tracker) -> Result<RestartVia, StartError> {
        self.handles.clear();
        self.open_all().map_err(StartError::new)?;
        Ok(RestartVia::Reload)
    }
}

/// A function of an extension loaded into this very process. Only [`NoneBackend`] makes one, from a successful
/// `dlsym` in an extension it loaded; dlopen handles are never closed, so the code stays mapped.
struct NoneFunction(*const c_void);

// SAFETY: a code address of a library that stays loaded, valid in every thread.
unsafe impl Send for NoneFunction {}
// SAFETY: shared use only reads the value, an immutable code address of a library that stays loaded.
unsafe impl Sync for NoneFunction {}

impl ThreadFunction for NoneFunction {
    /// Called right here with the host's own buffers, except scratch inputs, which get a private copy (the
    /// function may write them, the host's must not change). With isolation `none` there is no boundary: a fault
    /// in the extension is a fault of the host, which is what `none` means and what it is there to show; nothing
    /// can stop it either, so `deadline` is not used.
    fn call(
        &self,
        args: &mut [WireValue<'_>],
        _deadline: Duration,
        unlocked: Unlocked<'_>,
    ) -> Result<RegRet, BackendError> {
        let mut copies: smallvec::SmallVec<[Vec<u8>; 1]> = smallvec::SmallVec::new();
        let mut packer = ward_abi::ArgPacker::new();
        for a in args.iter_mut() {
            let packed = match a {
                WireValue::Int(v) => packer.push_int(*v),
                WireValue::F64(v) => packer.push_f64(*v),
                WireValue::F32(v) => packer.push_f32(*v),
                WireValue::In(b) | WireValue::Str(b) => packer.push_int(b.as_ptr() as u64),
                WireValue::Out(b) | WireValue::InOut(b) => packer.push_int(b.as_mut_ptr() as u64),
                WireValue::Scratch(b) => {
                    let mut copy = b.to_vec();
                    let at = copy.as_mut_ptr() as u64;
                    copies.push(copy);
                    packer.push_int(at)
                }
                WireValue::Callback(slot) => match ward_abi::callback_stub(*slot) {
                    Some(stub) => packer.push_int(stub as u64),
                    None => return Err(BackendError::Usage(format!("callback slot {slot} has no stub"))),
                },
            };
            packed.map_err(|e| BackendError::Usage(e.to_string()))?;
        }
        let regs = packer.finish();
        let mut ret = RegRet::default();
        unlocked(&mut || {
            // SAFETY: the address was resolved with dlsym in an extension this process loaded on purpose and never
            // unloads (NoneFunction values are only made by NoneBackend); the caller declared the signature through
            // its arguments and return type; every pointer argument names a buffer that lives until this returns:
            // the host's (borrowed by `args` for the whole call) or a private copy in `copies`.
            ret = unsafe { ward_abi::call_native(self.0, &regs) };
        });
        drop(copies);
        Ok(ret)
    }

    fn native_entry(&self) -> Option<NativeEntry> {
        Some(NativeEntry(self.0))
    }
}

/// An extension function loaded into this very process, callable by the host as its own. Only [`NoneFunction`]
/// makes one, so the address is always a `dlsym` result in a library that stays loaded.
#[derive(Clone, Copy)]
pub(crate) struct NativeEntry(*const c_void);

// SAFETY: a code address of a library that stays loaded, valid in every thread.
unsafe impl Send for NativeEntry {}
// SAFETY: shared use only reads the value, an immutable code address.
unsafe impl Sync for NativeEntry {}

impl NativeEntry {
    /// Call the function with `regs` as its argument registers. The caller packed them from a call the host
    /// declared (arguments and return type), every pointer among them naming a buffer the host lends for the call.
    #[inline]
    pub(crate) fn call(&self, regs: &ward_abi::RegArgs) -> RegRet {
        // SAFETY: the address was resolved with dlsym in an extension this process loaded on purpose and never
        // unloads (see the type); the host declared the signature through its arguments and return type, and the
        // pointers in `regs` name buffers it lends for the call. As with any function of the host's own, a fault
        // in it is the host's: that is what isolation `none` means.
        unsafe { ward_abi::call_native(self.0, regs) }
    }
}

fn lookup(handle: *mut c_void, name: &str) -> Option<*const c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: handle is from a successful dlopen; c is a valid C string.
    let f = unsafe { libc::dlsym(handle, c.as_ptr()) };
    (!f.is_null()).then_some(f as *const c_void)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a C string owned by libc, valid until the next dl call; copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}
