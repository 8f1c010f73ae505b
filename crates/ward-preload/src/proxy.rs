//! Loading a fresh copy of a class's proxy library for one plugin.

use std::ffi::{c_void, CString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use ward_classes::Class;
use ward_embed::{embedded, Embedded};

use crate::interpose::real_dlopen;

static LADSPA_PROXY: Embedded = embedded!("ward_proxy_ladspa", "LADSPA proxy");
static FREI0R_PROXY: Embedded = embedded!("ward_proxy_frei0r", "frei0r proxy");

type BindFn = unsafe extern "C" fn(u64);

/// Load a private copy of `class`'s proxy (a copy, so that every plugin has its own, context-free entry points) and
/// bind it to library `id`. Returns the handle the host gets.
pub(crate) fn load(class: Class, id: u64) -> Result<*mut c_void, String> {
    let proxy = match class {
        Class::Ladspa => &LADSPA_PROXY,
        Class::Frei0r => &FREI0R_PROXY,
    };
    let name = CString::new(format!("ward-{}-{id}", proxy.name)).map_err(|e| e.to_string())?;
    // SAFETY: a valid C string name and no flags; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a freshly created descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    file.write_all(proxy.bytes).map_err(|e| format!("writing the proxy: {e}"))?;
    let path = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(|e| e.to_string())?;
    let handle = real_dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
    drop(file);
    if handle.is_null() {
        return Err("the proxy library would not load".into());
    }
    // SAFETY: handle is a live dlopen handle and the name a valid C string.
    let bind = unsafe { libc::dlsym(handle, c"ward_proxy_bind".as_ptr()) };
    if bind.is_null() {
        return Err("the proxy library has no ward_proxy_bind".into());
    }
    // SAFETY: ward_proxy_bind is defined in the proxies as `void ward_proxy_bind(uint64_t)`.
    let bind: BindFn = unsafe { std::mem::transmute::<*mut c_void, BindFn>(bind) };
    // SAFETY: see above; it only stores the number.
    unsafe { bind(id) };
    Ok(handle)
}
