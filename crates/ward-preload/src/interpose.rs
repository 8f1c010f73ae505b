//! `dlopen` and `dlclose` as the host sees them.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use crate::runtime;

type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

thread_local! {
    /// Set while this thread runs ward's own code: the none backend and the class adapters call `dlopen` too, and
    /// those calls must reach the real one.
    static INSIDE_WARD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's `dlopen` calls passed straight through.
pub(crate) fn inside_ward<T>(f: impl FnOnce() -> T) -> T {
    let was = INSIDE_WARD.with(|c| c.replace(true));
    let result = f();
    INSIDE_WARD.with(|c| c.set(was));
    result
}

fn real<T: Copy>(cell: &OnceLock<Option<T>>, name: &CStr) -> Option<T> {
    *cell.get_or_init(|| {
        // SAFETY: RTLD_NEXT asks for the next definition after this library, i.e. libc's; the name is a valid C
        // string. A null result is handled by the caller.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        if f.is_null() {
            None
        } else {
            // SAFETY: T is the function pointer type of the symbol looked up (DlopenFn for "dlopen", DlcloseFn for
            // "dlclose"), of pointer size, and f is non-null.
            Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&f) })
        }
    })
}

pub(crate) fn real_dlopen(filename: *const c_char, flags: c_int) -> *mut c_void {
    static REAL: OnceLock<Option<DlopenFn>> = OnceLock::new();
    match real(&REAL, c"dlopen") {
        // SAFETY: forwarding the caller's arguments unchanged to libc's dlopen, which has the same contract.
        Some(f) => unsafe { f(filename, flags) },
        None => std::ptr::null_mut(),
    }
}

fn real_dlclose(handle: *mut c_void) -> c_int {
    static REAL: OnceLock<Option<DlcloseFn>> = OnceLock::new();
    match real(&REAL, c"dlclose") {
        // SAFETY: forwarding the caller's argument unchanged to libc's dlclose, which has the same contract.
        Some(f) => unsafe { f(handle) },
        None => -1,
    }
}

/// The host's `dlopen`: passes its caller's return address on to [`dlopen_from`]. glibc searches a bare name
/// along the *caller's* `DT_RUNPATH`/`DT_RPATH`; a call forwarded from here would search along the shim's, so the
/// caller has to be known.
///
/// # Safety
/// As libc's: `filename` is null or a valid C string.
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void {
    // At entry the return address is on top of the stack: it becomes the third argument, and the tail jump leaves
    // the stack as the caller made it, so dlopen_from returns straight to the caller.
    core::arch::naked_asm!("mov rdx, [rsp]", "jmp {target}", target = sym dlopen_from)
}

/// [`dlopen`] with its caller's return address.
///
/// # Safety
/// As libc's `dlopen`: `filename` is null or a valid C string.
unsafe extern "C" fn dlopen_from(filename: *const c_char, flags: c_int, caller: *const c_void) -> *mut c_void {
    if filename.is_null() || flags & libc::RTLD_NOLOAD != 0 || INSIDE_WARD.with(Cell::get) {
        return real_dlopen(filename, flags);
    }
    // SAFETY: non-null and, by dlopen's contract, a valid C string.
    let name = unsafe { CStr::from_ptr(filename) };
    // Only paths name plugins: a bare name is a library the dynamic linker searches for (and no host names its
    // plugins that way); it is searched for as the caller would have had it searched.
    if !name.to_bytes().contains(&b'/') {
        return match crate::search::along_callers_paths(name, caller) {
            Some(path) => real_dlopen(path.as_ptr(), flags),
            None => real_dlopen(filename, flags),
        };
    }
    let path = Path::new(OsStr::from_bytes(name.to_bytes()));
    match inside_ward(|| runtime::open_plugin(path)) {
        Some(handle) => handle,
        None => real_dlopen(filename, flags),
    }
}

/// The host's `dlclose`: a proxy's plugin is let go with it.
///
/// # Safety
/// As libc's: `handle` came from `dlopen`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    if !INSIDE_WARD.with(Cell::get) {
        inside_ward(|| runtime::closing(handle));
    }
    real_dlclose(handle)
}
