//! The instances the proxies hand the host, when the host hands one back.

use std::ffi::c_void;

use crate::guard::guarded_or;
use crate::interpose::inside_ward;
use crate::runtime::report;

/// An instance of ours the host hands back (LADSPA and LV2 `cleanup`, frei0r `f0r_destruct`, named by `what`):
/// taken back and dropped, which ends it in its domain, and what that said reported. Null is nothing to do.
///
/// # Safety
/// `handle` is null or came from `Box::into_raw` of a `T`, and the host never uses it again (each class's contract).
pub(crate) unsafe fn release<T>(what: &str, handle: *mut c_void) {
    guarded_or(what, "with the instance left behind", (), || {
        if handle.is_null() {
            return;
        }
        // SAFETY: per the function's contract, the box is taken back once.
        let boxed = unsafe { Box::from_raw(handle as *mut T) };
        inside_ward(|| drop(boxed));
        report();
    })
}
