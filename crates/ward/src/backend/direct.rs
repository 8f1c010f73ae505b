//! The `none` backend: the extension is loaded into the host with `dlopen` and called directly. No protection at
//! all; it is the baseline every figure is compared with, and what a host without ward does.

use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;
use ward_xpc::Deadline;

use ward_abi::{RegArgs, RegRet};

use super::{Added, Backend, BackendError, ExtensionSpec, Frame, Refused, Step, WireValue};
use crate::call::RetType;
use crate::events::RestartVia;
use crate::tracker::Tracker;

pub(crate) struct DirectBackend {
    specs: Vec<ExtensionSpec>,
    handles: Vec<Handle>,
    functions: Vec<*const c_void>,
}

struct Handle(*mut c_void);

// SAFETY: a dlopen handle is a process-wide token; libdl's functions are thread-safe.
unsafe impl Send for Handle {}
// SAFETY: function addresses are plain code addresses, valid in every thread.
unsafe impl Send for DirectBackend {}

impl DirectBackend {
    pub fn load(specs: Vec<ExtensionSpec>) -> Result<DirectBackend, String> {
        let mut b = DirectBackend { specs, handles: Vec::new(), functions: Vec::new() };
        b.open_all()?;
        Ok(b)
    }

    fn open_all(&mut self) -> Result<(), String> {
        for spec in &self.specs {
            self.handles.push(open(spec)?);
        }
        Ok(())
    }
}

/// Load one extension into this process and run its init function.
fn open(spec: &ExtensionSpec) -> Result<Handle, String> {
    let path = CString::new(spec.path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{} contains a NUL byte", spec.path.display()))?;
    // SAFETY: a valid C string; loading runs the extension's constructors in this process, which is what the `none`
    // isolation kind means.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(dlerror());
    }
    if let Some(init) = &spec.init {
        let f = lookup(h, init).ok_or_else(|| format!("init function `{init}` not found"))?;
        // SAFETY: policy declares init as `int64_t init(void)`.
        let r = unsafe { ward_abi::call_native(f, &ward_abi::RegArgs::default()) };
        if r.int != 0 {
            return Err(format!("init function `{init}` returned {}", r.as_i64()));
        }
    }
    Ok(Handle(h))
}

impl DirectBackend {}

impl Backend for DirectBackend {
    fn resolve(&mut self, ext: usize, symbol: &str) -> Result<u32, BackendError> {
        let h = self.handles.get(ext).ok_or_else(|| BackendError::Usage(format!("no extension {ext}")))?;
        let f = lookup(h.0, symbol).ok_or(BackendError::UnknownSymbol)?;
        self.functions.push(f);
        Ok((self.functions.len() - 1) as u32)
    }

    fn direct_function(&self, func: u32) -> Option<DirectFn> {
        self.functions.get(func as usize).map(|&f| DirectFn(f))
    }

    fn is_direct(&self) -> bool {
        true
    }

    fn add_extension(&mut self, _: &mut Tracker, spec: ExtensionSpec) -> Result<Added, Refused> {
        let handle = open(&spec).map_err(|reason| Refused { reason, restart: false })?;
        self.handles.push(handle);
        self.specs.push(spec);
        Ok(Added::InPlace)
    }

    fn replace_image(&mut self, index: usize, path: PathBuf) {
        if let Some(spec) = self.specs.get_mut(index) {
            spec.path = path;
        }
    }

    fn begin(&mut self, _: &mut Tracker, _: u32, _: &[WireValue<'_>], _: RetType) -> Result<Frame, BackendError> {
        Err(BackendError::Usage("the direct backend is called through its addresses".into()))
    }

    fn wait(&mut self, _: &Frame, _: &mut Deadline) -> Result<Step, BackendError> {
        Err(BackendError::Usage("the direct backend has no calls in flight".into()))
    }

    fn answer_callback(&mut self, _: u64, _: RegRet) -> Result<(), BackendError> {
        Err(BackendError::Usage("the direct backend has no calls in flight".into()))
    }

    fn finish(&mut self, _: &mut Tracker, _: Frame, _: &mut [&mut [u8]]) {}

    fn abandon(&mut self, _: Frame) {}

    fn defer(&mut self, _: u32, _: &[WireValue<'_>]) -> Result<(), BackendError> {
        Err(BackendError::Usage("the direct backend is called through its addresses".into()))
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    fn ping(&mut self, _: &mut Deadline) -> Result<(), BackendError> {
        Ok(())
    }

    fn stop(&mut self) {}

    /// A direct extension cannot fail without taking the host with it; a "restart" only happens when the core
    /// reconfigures (a group gained an extension). dlopen of an already loaded object returns it as it is.
    fn restart(&mut self, _: &mut Tracker) -> Result<RestartVia, String> {
        self.functions.clear();
        self.handles.clear();
        self.open_all()?;
        Ok(RestartVia::Reload)
    }
}

/// A function of an extension loaded into this very process. Only this backend makes one, from a successful
/// `dlsym` in an extension it loaded, which stays loaded as long as the backend does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirectFn(*const c_void);

impl DirectFn {
    /// Call it with register arguments. With isolation `none` there is no boundary: a fault in the extension is a
    /// fault of the host, which is what `none` means and what it is there to show.
    pub fn call(self, args: &RegArgs) -> RegRet {
        // SAFETY: the pointer was resolved with dlsym in an extension this process loaded on purpose and has not
        // unloaded (DirectFn values are only made by DirectBackend, which keeps the handles open); the caller
        // declared the signature through its arguments and return type, and every pointer argument the core packed
        // borrows live host memory for the duration of the call.
        unsafe { ward_abi::call_native(self.0, args) }
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
