//! Loading the extensions with the domain's own libc (`dlopen`), running their init functions, and resolving
//! symbols into the function table the host refers to by index.

use std::ffi::{c_void, CStr, CString};

use crate::args::ExtensionArg;
use crate::error::LoadError;

pub struct Library {
    handles: Vec<*mut c_void>,
    /// Per extension: call its functions poisoned.
    poisoned: Vec<bool>,
    functions: Vec<Callee>,
}

/// A resolved function and how to call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Callee {
    pub func: *const c_void,
    /// With poison in every register and stack slot it is not given (policy `poison`).
    pub poisoned: bool,
}

impl Library {
    pub fn load(extensions: &[ExtensionArg]) -> Result<Library, LoadError> {
        let mut library = Library { handles: Vec::new(), poisoned: Vec::new(), functions: Vec::new() };
        for ext in extensions {
            library.load_one(ext)?;
        }
        Ok(library)
    }

    /// Load one more extension and run its init function; returns its index. When init fails the extension is
    /// closed again, so the set loaded is the set the host knows.
    pub fn load_one(&mut self, ext: &ExtensionArg) -> Result<u32, LoadError> {
        let path = CString::new(ext.path.as_os_str().as_encoded_bytes())
            .map_err(|_| LoadError::NulInPath { path: ext.path.clone() })?;
        // SAFETY: path is a valid C string; dlopen runs the extension's constructors, which is what loading means.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(LoadError::Dlopen { path: ext.path.clone(), reason: dlerror() });
        }
        if let Some(init) = &ext.init {
            let failed = match lookup(handle, init) {
                None => Some(LoadError::NoInit { init: init.clone(), path: ext.path.clone() }),
                Some(f) => {
                    // SAFETY: policy declares `init` as `int64_t init(void)`; no arguments are read.
                    let ret = unsafe { ward_abi::call_native(f, &ward_abi::RegArgs::default()) };
                    (ret.int != 0).then(|| LoadError::InitFailed {
                        init: init.clone(),
                        path: ext.path.clone(),
                        code: ret.int as i64,
                    })
                }
            };
            if let Some(reason) = failed {
                // SAFETY: handle came from the dlopen above and nothing of the extension is in use.
                unsafe { libc::dlclose(handle) };
                return Err(reason);
            }
        }
        self.handles.push(handle);
        self.poisoned.push(ext.poison);
        u32::try_from(self.handles.len() - 1).map_err(|_| LoadError::TooMany)
    }

    /// The function table, by the indices [`Library::resolve`] returned.
    pub fn functions(&self) -> &[Callee] {
        &self.functions
    }

    /// Resolve `name` in extension `ext`; returns its index in the function table.
    pub fn resolve(&mut self, ext: u32, name: &[u8]) -> Option<u32> {
        let handle = *self.handles.get(ext as usize)?;
        let name = std::str::from_utf8(name).ok()?;
        let callee = Callee { func: lookup(handle, name)?, poisoned: self.poisoned[ext as usize] };
        if let Some(i) = self.functions.iter().position(|&g| g == callee) {
            return Some(i as u32);
        }
        self.functions.push(callee);
        Some((self.functions.len() - 1) as u32)
    }

    pub fn function(&self, id: u32) -> Option<Callee> {
        self.functions.get(id as usize).copied()
    }
}

/// Whether `path` is loaded in this process already (the same file loaded again runs no constructors).
pub fn is_loaded(path: &std::path::Path) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a valid C string; RTLD_NOLOAD loads nothing, it only finds a loaded object and counts a reference.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return false;
    }
    // SAFETY: the reference RTLD_NOLOAD just counted, given back.
    unsafe { libc::dlclose(handle) };
    true
}

fn lookup(handle: *mut c_void, name: &str) -> Option<*const c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: handle came from a successful dlopen and c is a valid C string.
    let f = unsafe { libc::dlsym(handle, c.as_ptr()) };
    (!f.is_null()).then_some(f as *const c_void)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a valid C string owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated, valid until the next dl* call; we copy it now.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}
