//! `dlopen`, `dlclose` and `dlerror` as the host sees them.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use crate::guard::guarded_or;
use crate::runtime;

type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type DlerrorFn = unsafe extern "C" fn() -> *mut c_char;

thread_local! {
    /// Set while this thread runs ward's own code: the none backend and the class adapters call `dlopen` too, and
    /// those calls must reach the real one.
    static INSIDE_WARD: Cell<bool> = const { Cell::new(false) };
    /// Why the last `dlopen` of the host on this thread was refused, until the host's next `dlerror` takes it.
    static REFUSAL: RefCell<Option<CString>> = const { RefCell::new(None) };
    /// The refusal the last `dlerror` returned: it must stay valid until the next `dlerror` call on this thread.
    static SHOWN: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Runs when the dynamic loader loads the shim, before the host's `main`: looks up the real functions while no
/// error of the host's can be pending, since a lookup resets what `dlerror` would say.
#[used]
#[link_section = ".init_array"]
static LOOK_UP_REAL_FUNCTIONS: extern "C" fn() = look_up_real_functions;

extern "C" fn look_up_real_functions() {
    let _ = real(&REAL_DLOPEN, c"dlopen");
    let _ = real(&REAL_DLCLOSE, c"dlclose");
    let _ = real(&REAL_DLERROR, c"dlerror");
}

static REAL_DLOPEN: OnceLock<Option<DlopenFn>> = OnceLock::new();
static REAL_DLCLOSE: OnceLock<Option<DlcloseFn>> = OnceLock::new();
static REAL_DLERROR: OnceLock<Option<DlerrorFn>> = OnceLock::new();

/// Whether this thread is inside ward now.
#[cfg(test)]
pub(crate) fn is_inside_ward() -> bool {
    INSIDE_WARD.with(Cell::get)
}

/// Runs `f` with this thread's `dlopen` calls passed straight through (until `f` returns or unwinds).
pub(crate) fn inside_ward<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            INSIDE_WARD.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(INSIDE_WARD.with(|c| c.replace(true)));
    f()
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
            // "dlclose", DlerrorFn for "dlerror"), of pointer size, and f is non-null.
            Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&f) })
        }
    })
}

pub(crate) fn real_dlopen(filename: *const c_char, flags: c_int) -> *mut c_void {
    match real(&REAL_DLOPEN, c"dlopen") {
        // SAFETY: forwarding the caller's arguments unchanged to libc's dlopen, which has the same contract.
        Some(f) => unsafe { f(filename, flags) },
        None => std::ptr::null_mut(),
    }
}

fn real_dlclose(handle: *mut c_void) -> c_int {
    match real(&REAL_DLCLOSE, c"dlclose") {
        // SAFETY: forwarding the caller's argument unchanged to libc's dlclose, which has the same contract.
        Some(f) => unsafe { f(handle) },
        None => -1,
    }
}

fn real_dlerror() -> *mut c_char {
    match real(&REAL_DLERROR, c"dlerror") {
        // SAFETY: libc's dlerror takes nothing and returns NULL or a string valid until the next call.
        Some(f) => unsafe { f() },
        None => std::ptr::null_mut(),
    }
}

/// A refusal for the host's next `dlerror` on this thread; whatever error the dynamic linker still held is older
/// and is dropped, as a newer error replaces an older one.
fn set_refusal(message: String) {
    let _ = real_dlerror();
    let message = CString::new(message.replace('\0', "")).unwrap_or_default();
    let _ = REFUSAL.try_with(|r| *r.borrow_mut() = Some(message));
}

/// A `dlopen` of the host that reached the real one: its outcome, not an earlier refusal, is what `dlerror` reports.
fn clear_refusal() {
    let _ = REFUSAL.try_with(|r| r.borrow_mut().take());
}

/// The host's `dlerror`: why ward refused the last `dlopen` on this thread, when it did; else libc's answer.
///
/// # Safety
/// As libc's: the string returned is valid until the next `dlerror` call on this thread.
#[no_mangle]
pub unsafe extern "C" fn dlerror() -> *mut c_char {
    if !INSIDE_WARD.with(Cell::get) {
        if let Some(message) = REFUSAL.try_with(|r| r.borrow_mut().take()).ok().flatten() {
            let shown = SHOWN.try_with(|s| {
                let mut s = s.borrow_mut();
                *s = Some(message);
                s.as_ref().map_or(std::ptr::null_mut(), |m| m.as_ptr().cast_mut())
            });
            if let Ok(pointer) = shown {
                return pointer;
            }
        }
    }
    real_dlerror()
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
    if INSIDE_WARD.with(Cell::get) {
        return real_dlopen(filename, flags);
    }
    if filename.is_null() || flags & libc::RTLD_NOLOAD != 0 {
        clear_refusal();
        return real_dlopen(filename, flags);
    }
    // SAFETY: non-null and, by dlopen's contract, a valid C string.
    let name = unsafe { CStr::from_ptr(filename) };
    // Only paths name plugins: a bare name is a library the dynamic linker searches for (and no host names its
    // plugins that way); it is searched for as the caller would have had it searched.
    if !name.to_bytes().contains(&b'/') {
        clear_refusal();
        return match crate::search::along_callers_paths(name, caller) {
            Some(path) => real_dlopen(path.as_ptr(), flags),
            None => real_dlopen(filename, flags),
        };
    }
    let path = Path::new(OsStr::from_bytes(name.to_bytes()));
    // A panic while opening refuses the plugin (fails closed): the host's dlopen fails and its dlerror says why.
    let refused = || {
        runtime::Opened::Refused(format!(
            "{}: ward failed inside while opening it (a bug in ward: please report it); the plugin is not loaded",
            path.display()
        ))
    };
    let opened = guarded_or("a dlopen", "no handle (the plugin is not loaded)", None, || {
        Some(inside_ward(|| runtime::open_plugin(path)))
    });
    match opened.unwrap_or_else(refused) {
        runtime::Opened::Proxy(handle) => {
            clear_refusal();
            handle
        }
        runtime::Opened::Native => {
            clear_refusal();
            real_dlopen(filename, flags)
        }
        runtime::Opened::Refused(message) => {
            set_refusal(message);
            std::ptr::null_mut()
        }
    }
}

/// The host's `dlclose`: a proxy's plugin is let go with it.
///
/// # Safety
/// As libc's: `handle` came from `dlopen`.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    // A proxy's copy keeps its descriptor (and so its name) until it is unloaded.
    let copy = if INSIDE_WARD.with(Cell::get) {
        None
    } else {
        guarded_or("a dlclose", "after closing the library alone", None, || inside_ward(|| runtime::closing(handle)))
    };
    let closed = real_dlclose(handle);
    drop(copy);
    closed
}

/// Have `f` called when the host exits (it calls `exit`, or returns from `main`).
pub(crate) fn at_exit(f: extern "C" fn()) {
    // SAFETY: `f` is a function of this library, which is preloaded and so stays loaded until the process ends.
    unsafe { libc::atexit(f) };
}
