//! A mutated extension is still a loadable shared object: the dynamic loader finds every table where it was.
//! Loading runs no mutated code (toolchain start-up code is skipped and well.so has no constructor), so the
//! objects are opened in this process.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::*;
use ward_inject::FaultType;

fn dlopen_and_find(path: &Path, symbol: &str) -> Result<(), String> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let c_symbol = CString::new(symbol).map_err(|e| e.to_string())?;
    // SAFETY: both strings are NUL-terminated and outlive the calls; the handle is used only while open.
    unsafe {
        let handle = libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if handle.is_null() {
            let err = libc::dlerror();
            let msg = if err.is_null() {
                "unknown error".to_owned()
            } else {
                std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned()
            };
            return Err(msg);
        }
        let found = !libc::dlsym(handle, c_symbol.as_ptr()).is_null();
        libc::dlclose(handle);
        if found {
            Ok(())
        } else {
            Err(format!("{symbol} not found"))
        }
    }
}

#[test]
fn mutated_well_still_loads() {
    let dir = scratch_dir("load");
    for t in [FaultType::Nop, FaultType::Branch] {
        for seed in 0..4 {
            let injection = inject_ok(well(), &plan(t, seed));
            // A distinct name per object: the loader would return the already-open one for a reused path.
            let path = write_temp(&dir, &format!("well-{t}-{seed}.so"), &injection.bytes);
            dlopen_and_find(&path, "well_sum").unwrap_or_else(|e| panic!("{t} seed {seed}: dlopen failed: {e}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
