//! A panic inside ward never unwinds into the host.
//!
//! The host calls the proxies' entry points from C: a Rust panic that reached one could not unwind through the
//! host's frames, and the process would abort, the one outcome ward exists to prevent. The entry points that process
//! a block or a frame (where the calls, recoveries and late calls happen) run their body through [`guarded`]: a
//! panic there is a bug in ward, said on standard error (the panic's own message comes first, from Rust's hook),
//! and the host's call returns with the block's outputs as they stand.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a panic has been said already: one line per process, not one per block.
static SAID: AtomicBool = AtomicBool::new(false);

/// Run `body`, the work of the host's call `what`; true when it panicked (and returned early).
pub(crate) fn guarded(what: &str, body: impl FnOnce()) -> bool {
    let panicked = catch_unwind(AssertUnwindSafe(body)).is_err();
    if panicked && !SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "ward: an internal error in ward during {what} (a bug in ward: please report the panic above); the host's \
             call returned with its outputs as they stood, and the host goes on"
        );
    }
    panicked
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
    fn a_panic_inside_ward_leaves_the_thread_outside_ward() {
        assert!(!crate::interpose::is_inside_ward());
        assert!(guarded("a block", || inside_ward(|| panic!("a bug"))));
        assert!(!crate::interpose::is_inside_ward(), "the dlopen pass-through ends with the unwinding");
    }
}
