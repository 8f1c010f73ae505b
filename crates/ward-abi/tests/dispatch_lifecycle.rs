//! The process-wide dispatcher: zero returns before any is installed, then install and replace.
//!
//! One test in its own binary, so no other test has installed a dispatcher first.

use core::ffi::c_void;
use ward_abi::{call_native, callback_stub, set_callback_dispatch, ArgPacker, RegArgs, RegRet};

fn first(slot: usize, args: &RegArgs) -> RegRet {
    RegRet { int: slot as u64 + args.ints[0], float: 1.0f64.to_bits() }
}

fn second(slot: usize, args: &RegArgs) -> RegRet {
    RegRet { int: (slot as u64) * 1000 + args.ints[0], float: (f64::from_bits(args.floats[0]) * 4.0).to_bits() }
}

type Sig = extern "C" fn(u64, f64) -> u64;

fn typed(slot: usize) -> Sig {
    let stub = callback_stub(slot).unwrap();
    // SAFETY: a callback stub accepts any register-only signature and returns in rax and xmm0.
    unsafe { core::mem::transmute::<*const c_void, Sig>(stub) }
}

fn call_stub(stub: *const c_void, args: &RegArgs) -> RegRet {
    // SAFETY: `stub` comes from `callback_stub`, which accepts any register-only signature.
    unsafe { call_native(stub, args) }
}

#[test]
fn zero_before_install_then_install_then_replace() {
    let mut p = ArgPacker::new();
    p.push_int(7).unwrap();
    p.push_f64(2.5).unwrap();
    let args = p.finish();
    let stub = callback_stub(3).unwrap();

    assert_eq!(call_stub(stub, &args), RegRet { int: 0, float: 0 });
    assert_eq!(typed(3)(7, 2.5), 0);

    set_callback_dispatch(first);
    assert_eq!(call_stub(stub, &args), RegRet { int: 10, float: 1.0f64.to_bits() });
    assert_eq!(typed(250)(5, 0.0), 255);

    set_callback_dispatch(second);
    let r = call_stub(stub, &args);
    assert_eq!(r.int, 3007);
    assert_eq!(r.as_f64(), 10.0);
    assert_eq!(typed(4)(1, 0.0), 4001);
}
