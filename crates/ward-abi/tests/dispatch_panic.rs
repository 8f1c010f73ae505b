//! A panicking dispatcher must abort the process instead of unwinding into the C caller.
//!
//! The crash runs in a child: this test binary re-executed with only the crash test selected.

use core::ffi::c_void;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use ward_abi::{callback_stub, set_callback_dispatch, RegArgs, RegRet};

const CHILD_ENV: &str = "WARD_ABI_PANIC_CHILD";
/// Signal number of SIGABRT on x86-64 Linux.
const SIGABRT: i32 = 6;

fn panicking(slot: usize, _args: &RegArgs) -> RegRet {
    panic!("dispatcher panic on slot {slot}");
}

#[test]
fn panicking_dispatcher_aborts() {
    if std::env::var_os(CHILD_ENV).is_some() {
        set_callback_dispatch(panicking);
        // SAFETY: a callback stub accepts any register-only signature.
        let f = unsafe { core::mem::transmute::<*const c_void, extern "C" fn(u64) -> u64>(callback_stub(9).unwrap()) };
        f(1);
        // Not reached if the stub aborts; make the parent see a clean exit instead.
        std::process::exit(0);
    }

    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "panicking_dispatcher_aborts", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(SIGABRT), "child status {:?}, stderr:\n{stderr}", out.status);
    assert!(stderr.contains("dispatcher panic on slot 9"), "stderr:\n{stderr}");
}
