//! A panic inside ward never unwinds into the host.
//!
//! The host calls the proxies' entry points, and the interposed `dlopen` and `dlclose`, from C: a Rust panic that
//! reached one could not unwind through the host's frames, and the process would abort, the one outcome ward exists
//! to prevent. Every entry point that does ward's work runs it through [`guarded_or`] (or [`guarded`], for a block
//! or a frame): a panic there is a bug in ward, said once on standard error (the panic's own message comes first,
//! from Rust's hook), and the host's call returns what the entry point's contract allows for a failure (no
//! descriptor, no instance, an error status, the block's outputs as they stand), so the host goes on.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a panic has been said already: one line per process, not one per block.
static SAID: AtomicBool = AtomicBool::new(false);

/// Run `body`, the work of the host's call `what`; its value, or `fallback` when it panicked (the host is told
/// once that its call returned `instead`, which says what `fallback` means to it).
pub(crate) fn guarded_or<T>(what: &str, instead: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            if !SAID.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "ward: an internal error in ward during {what} (a bug in ward: please report the panic above); \
                     the host's call returned {instead}, and the host goes on"
                );
            }
            fallback
        }
    }
}

/// [`guarded_or`] for a block or a frame: true when `body` panicked (and returned early, the outputs as they stood).
pub(crate) fn guarded(what: &str, body: impl FnOnce()) -> bool {
    guarded_or(what, "with its outputs as they stood", true, || {
        body();
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interpose::inside_ward;

    #[test]
    fn a_panic_in_the_body_returns_to_the_caller() {
        let mut ran = false;
        assert!(!guarded("a block", || ran = true));
        assert!(ran);
        assert!(guarded("a block", || panic!("a bug")));
        assert!(guarded("a block", || {
            let v: Vec<u8> = Vec::new();
            let _ = v[usize::from(std::hint::black_box(3u8))];
        }));
    }

    #[test]
    fn a_panic_gives_the_host_the_fallback_and_a_value_otherwise() {
        assert_eq!(guarded_or("a descriptor", "no descriptor", 0usize, || 7), 7);
        assert_eq!(guarded_or("a descriptor", "no descriptor", 0usize, || panic!("a bug")), 0);
        let null: *const u8 = std::ptr::null();
        assert!(guarded_or("an instantiate", "no instance", null, || panic!("a bug")).is_null());
    }

    #[test]
    fn a_panic_inside_ward_leaves_the_thread_outside_ward() {
        assert!(!crate::interpose::is_inside_ward());
        assert!(guarded("a block", || inside_ward(|| panic!("a bug"))));
        assert!(!crate::interpose::is_inside_ward(), "the dlopen pass-through ends with the unwinding");
    }
}
