//! Loads the extracted builtins into the test process with dlopen: every
//! export the host relies on must exist, and the well-behaved functions (plus
//! the protocol attacks, which are harmless outside ward) must compute the
//! right results. Nothing here triggers a real fault.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

/// Every function each builtin must export.
const EXPORTS: &[(&str, &[&str])] = &[
    ("lv2_amp", &["lv2_descriptor"]),
    ("lv2_counter", &["lv2_descriptor"]),
    ("lv2_delay", &["lv2_descriptor"]),
    ("lv2_faulty", &["lv2_descriptor"]),
    ("lv2_gate", &["lv2_descriptor"]),
    ("lv2_options", &["lv2_descriptor"]),
    ("lv2_synth", &["lv2_descriptor"]),
    ("lv2_worker", &["lv2_descriptor"]),
    (
        "well",
        &[
            "well_null",
            "well_add",
            "well_mul3",
            "well_fma",
            "well_halve",
            "well_mix",
            "well_sqrt",
            "well_strtod",
            "well_errno",
            "well_clear_errno",
            "well_thread_add",
            "well_thread_calls_and_last",
            "well_thread_initialised",
            "well_sum",
            "well_xor",
            "well_reverse",
            "well_copy",
            "well_strlen",
            "well_map_sum",
            "well_nest",
            "well_apply_f",
            "counter_add",
            "counter_get",
            "counter_reset",
            "acc_new",
            "acc_add",
            "acc_get",
            "acc_free",
            "well_init",
            "well_initialised",
        ],
    ),
    (
        "faulty",
        &[
            "faulty_counter_add",
            "faulty_counter_get",
            "faulty_arm",
            "faulty_compute",
            "faulty_null_deref",
            "faulty_wild_write",
            "faulty_abort",
            "faulty_exit3",
            "faulty_infinite_loop",
            "faulty_slow",
            "faulty_recursion",
            "faulty_memory_bomb",
            "faulty_fd_leak",
            "faulty_raise_kill",
            "faulty_garbage_reply",
            "faulty_forged_reply",
            "faulty_div_zero",
            "faulty_illegal",
            "faulty_clobber_callee_saved",
            "faulty_float_control",
            "faulty_flush_denormals",
            "faulty_overrun",
            "faulty_gate_read",
            "faulty_gate_write",
            "faulty_gate_format",
            "faulty_gate_stream",
        ],
    ),
    ("faulty_ladspa", &["ladspa_descriptor"]),
    ("crash_once_ladspa", &["ladspa_descriptor"]),
    ("stale_ladspa", &["ladspa_descriptor"]),
    ("hostile", &["hostile_attack", "hostile_arena"]),
    ("hostile_ladspa", &["ladspa_descriptor"]),
    ("overread", &["overread_sum", "overread_write_past"]),
    (
        "resources",
        &["resources_anon", "resources_memfd", "resources_shm", "resources_fork", "resources_burn", "resources_ping"],
    ),
    ("stale", &["stale_rbx", "stale_r15", "stale_second_arg", "stale_first_arg", "stale_stack_8k"]),
    ("threads", &["threads_wait", "threads_count", "threads_crash"]),
    (
        "calls",
        &[
            "calls_add",
            "calls_alloc_sum",
            "calls_checked_alloc",
            "calls_churn",
            "calls_copy",
            "calls_copy_every_way",
            "calls_churn_mib",
            "calls_fill",
            "calls_via",
        ],
    ),
    (
        "faulty_frei0r",
        &[
            "f0r_init",
            "f0r_deinit",
            "f0r_get_plugin_info",
            "f0r_get_param_info",
            "f0r_construct",
            "f0r_destruct",
            "f0r_set_param_value",
            "f0r_get_param_value",
            "f0r_update",
            "f0r_update2",
        ],
    ),
];

/// Fault kinds of faulty.so (see the comment at the top of faulty.c).
const WILD_WRITE: i64 = 2;
const GARBAGE_REPLY: i64 = 10;
const FORGED_REPLY: i64 = 11;
const WILD_WRITE_VALUE: i64 = 0x5741_5244_5741_5244;

/// A dlopen'ed builtin; never closed (the tests share the handles anyway).
struct Lib {
    name: &'static str,
    handle: *mut c_void,
}

fn dlerror() -> String {
    // SAFETY: dlerror has no preconditions; a non-NULL result is a valid C
    // string until the next dl* call on this thread, and we copy it at once.
    unsafe {
        let msg = libc::dlerror();
        if msg.is_null() {
            "unknown error".to_owned()
        } else {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        }
    }
}

impl Lib {
    fn open(name: &'static str) -> Lib {
        let path = ward_extensions::path_of(name).unwrap();
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: c_path is a valid C string; the builtins have no
        // constructors, so loading them runs no code.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {}: {}", path.display(), dlerror());
        Lib { name, handle }
    }

    fn sym(&self, symbol: &str) -> *mut c_void {
        let c_symbol = CString::new(symbol).unwrap();
        // SAFETY: handle came from a successful dlopen and is never closed;
        // c_symbol is a valid C string.
        let ptr = unsafe { libc::dlsym(self.handle, c_symbol.as_ptr()) };
        assert!(!ptr.is_null(), "{}.so does not export {symbol}: {}", self.name, dlerror());
        ptr
    }
}

/// `func!(lib, "name", fn-pointer type)`: the symbol as a typed function
/// pointer. The caller vouches that the type matches the C declaration.
macro_rules! func {
    ($lib:expr, $name:literal, $ty:ty) => {{
        let ptr = $lib.sym($name);
        // SAFETY: the type spelled at the call site matches the C prototype
        // of this export (see extensions/*.c).
        unsafe { std::mem::transmute::<*mut c_void, $ty>(ptr) }
    }};
}

/// faulty's functions for the kinds that need a process of their own (and its slow call, which sleeps), which
/// faulty_mpk leaves out.
const FAULTY_PROCESS_ONLY: &[&str] =
    &["faulty_fd_leak", "faulty_raise_kill", "faulty_garbage_reply", "faulty_forged_reply", "faulty_slow"];

#[test]
fn every_listed_function_is_exported() {
    for b in ward_extensions::ALL {
        if b.name.starts_with("bad_ladspa_") {
            // Loading one natively crashes or hangs this test: its export is read from the file instead.
            use object::{Object, ObjectSymbol};
            // A copy: the embedded bytes need not be aligned as the ELF structures are (a heap block is).
            let bytes = b.bytes.to_vec();
            let file = object::File::parse(&*bytes).expect("an ELF file");
            let exports: Vec<&str> =
                file.dynamic_symbols().filter(|s| s.is_definition()).filter_map(|s| s.name().ok()).collect();
            assert_eq!(exports, ["ladspa_descriptor"], "{}", b.name);
            continue;
        }
        // faulty_mpk's list is faulty's (faulty_mpk_leaves_out_the_process_only_kinds checks it); calls_plugin's is
        // calls' without calls_via (checked below).
        assert!(
            b.name == "faulty_mpk" || b.name == "calls_plugin" || EXPORTS.iter().any(|(name, _)| *name == b.name),
            "no export list for {}",
            b.name
        );
    }
    for (name, symbols) in EXPORTS {
        let lib = Lib::open(name);
        for symbol in *symbols {
            lib.sym(symbol);
        }
    }
    let (_, calls) = EXPORTS.iter().find(|(name, _)| *name == "calls").expect("calls' list");
    let plugin = Lib::open("calls_plugin");
    for symbol in calls.iter().filter(|s| **s != "calls_via") {
        plugin.sym(symbol);
    }
}

type NestFn = extern "C" fn(extern "C" fn(i64) -> i64, i64) -> i64;
static WELL_NEST: OnceLock<NestFn> = OnceLock::new();

extern "C" fn square(i: i64) -> i64 {
    i * i
}

/// Calls back into well_nest until depth 0: a nested host -> ext -> host -> ext chain.
extern "C" fn nest_again(depth: i64) -> i64 {
    if depth > 0 {
        (WELL_NEST.get().unwrap())(nest_again, depth - 1) * 10
    } else {
        0
    }
}

extern "C" fn scale(x: f64, k: i64) -> f64 {
    x * k as f64
}

#[test]
fn well_behaves() {
    let well = Lib::open("well");

    func!(well, "well_null", extern "C" fn())();
    let add = func!(well, "well_add", extern "C" fn(i64, i64) -> i64);
    assert_eq!(add(2, 40), 42);
    assert_eq!(add(-7, 3), -4);
    assert_eq!(add(i64::MAX, 1), i64::MIN);
    let mul3 = func!(well, "well_mul3", extern "C" fn(i64, i64, i64) -> i64);
    assert_eq!(mul3(2, 3, -7), -42);
    let fma = func!(well, "well_fma", extern "C" fn(f64, f64, f64) -> f64);
    assert_eq!(fma(2.0, 3.0, 4.5), 10.5);
    let halve = func!(well, "well_halve", extern "C" fn(f32) -> f32);
    assert_eq!(halve(3.0), 1.5);
    let mix = func!(well, "well_mix", extern "C" fn(i64, f64, i32, f32) -> f64);
    assert_eq!(mix(3, 0.25, -2, 0.5), 1.75);
    let sqrt = func!(well, "well_sqrt", extern "C" fn(f64) -> f64);
    let strtod = func!(well, "well_strtod", unsafe extern "C" fn(*const c_char) -> f64);
    let errno = func!(well, "well_errno", extern "C" fn() -> i32);
    let clear_errno = func!(well, "well_clear_errno", extern "C" fn());
    clear_errno();
    assert!(sqrt(-1.0).is_nan());
    assert_eq!(errno(), libc::EDOM);
    clear_errno();
    assert_eq!(sqrt(4.0), 2.0);
    assert_eq!(errno(), 0);
    // SAFETY: NUL-terminated text.
    assert_eq!(unsafe { strtod(c"1e999".as_ptr()) }, f64::INFINITY);
    assert_eq!(errno(), libc::ERANGE);

    let thread_add = func!(well, "well_thread_add", extern "C" fn(i64) -> i64);
    let calls_and_last = func!(well, "well_thread_calls_and_last", extern "C" fn() -> i64);
    let here = (thread_add(5), thread_add(2), calls_and_last());
    let there = std::thread::spawn(move || (thread_add(7), calls_and_last())).join().unwrap();
    assert_eq!(here, (1005, 1007, 2002), "this thread's own");
    assert_eq!(there, (1007, 1007), "another thread's own, from the initial values");
    assert_eq!(calls_and_last(), 2002, "this thread's kept");

    let data: Vec<u8> = (0..=255u8).chain(0..10).collect();
    let sum = func!(well, "well_sum", unsafe extern "C" fn(*const u8, usize) -> i64);
    // SAFETY: data.len() readable bytes.
    assert_eq!(unsafe { sum(data.as_ptr(), data.len()) }, 32640 + 45);
    // SAFETY: a zero-length buffer is never read.
    assert_eq!(unsafe { sum(std::ptr::null(), 0) }, 0);

    let xor = func!(well, "well_xor", unsafe extern "C" fn(*const u8, *mut u8, usize, i64));
    let mut out = vec![0u8; data.len()];
    // SAFETY: both buffers hold data.len() bytes and do not overlap.
    unsafe { xor(data.as_ptr(), out.as_mut_ptr(), data.len(), 0x15a) };
    let expected: Vec<u8> = data.iter().map(|b| b ^ 0x5a).collect();
    assert_eq!(out, expected);

    let reverse = func!(well, "well_reverse", unsafe extern "C" fn(*mut u8, usize));
    for len in [0usize, 1, 2, 7, 266] {
        let mut buf = data[..len].to_vec();
        // SAFETY: buf holds len writable bytes.
        unsafe { reverse(buf.as_mut_ptr(), len) };
        let expected: Vec<u8> = data[..len].iter().rev().copied().collect();
        assert_eq!(buf, expected, "len {len}");
    }

    let copy = func!(well, "well_copy", unsafe extern "C" fn(*const u8, *mut u8, usize));
    let mut out = vec![0u8; data.len()];
    // SAFETY: both buffers hold data.len() bytes and do not overlap.
    unsafe { copy(data.as_ptr(), out.as_mut_ptr(), data.len()) };
    assert_eq!(out, data);

    let strlen = func!(well, "well_strlen", unsafe extern "C" fn(*const c_char) -> usize);
    let s = CString::new("ward extensions").unwrap();
    // SAFETY: s is NUL-terminated.
    assert_eq!(unsafe { strlen(s.as_ptr()) }, 15);

    let map_sum = func!(well, "well_map_sum", extern "C" fn(extern "C" fn(i64) -> i64, i64) -> i64);
    assert_eq!(map_sum(square, 10), 285);
    assert_eq!(map_sum(square, 0), 0);

    let nest = func!(well, "well_nest", NestFn);
    let _ = WELL_NEST.set(nest);
    assert_eq!(nest(nest_again, 0), 1);
    // nest(d) = nest_again(d) + 1 = nest(d - 1) * 10 + 1
    assert_eq!(nest(nest_again, 3), 1111);

    let apply_f = func!(well, "well_apply_f", extern "C" fn(extern "C" fn(f64, i64) -> f64, f64, i64) -> f64);
    assert_eq!(apply_f(scale, 1.5, 4), 12.0);

    let counter_add = func!(well, "counter_add", extern "C" fn(i64) -> i64);
    let counter_get = func!(well, "counter_get", extern "C" fn() -> i64);
    let counter_reset = func!(well, "counter_reset", extern "C" fn());
    counter_reset();
    assert_eq!(counter_get(), 0);
    assert_eq!(counter_add(5), 5);
    assert_eq!(counter_add(-2), 3);
    assert_eq!(counter_get(), 3);
    counter_reset();
    assert_eq!(counter_get(), 0);

    let acc_new = func!(well, "acc_new", extern "C" fn(i64) -> *mut c_void);
    let acc_add = func!(well, "acc_add", unsafe extern "C" fn(*mut c_void, i64) -> i64);
    let acc_get = func!(well, "acc_get", unsafe extern "C" fn(*mut c_void) -> i64);
    let acc_free = func!(well, "acc_free", unsafe extern "C" fn(*mut c_void));
    let a = acc_new(10);
    let b = acc_new(-1);
    assert!(!a.is_null() && !b.is_null());
    // SAFETY: a and b are live handles from acc_new, each freed exactly once.
    unsafe {
        assert_eq!(acc_add(a, 5), 15);
        assert_eq!(acc_add(b, 2), 1);
        assert_eq!(acc_get(a), 15);
        assert_eq!(acc_get(b), 1);
        acc_free(a);
        acc_free(b);
    }

    let init = func!(well, "well_init", extern "C" fn() -> i64);
    let initialised = func!(well, "well_initialised", extern "C" fn() -> i64);
    let thread_initialised = func!(well, "well_thread_initialised", extern "C" fn() -> i64);
    assert_eq!(initialised(), 0);
    assert_eq!((init(), initialised(), thread_initialised()), (0, 1, 1));
    assert_eq!(std::thread::spawn(move || thread_initialised()).join().unwrap(), 0, "only on the thread init ran on");
}

#[test]
fn faulty_is_harmless_when_not_provoked() {
    let faulty = Lib::open("faulty");

    let counter_add = func!(faulty, "faulty_counter_add", extern "C" fn(i64) -> i64);
    let counter_get = func!(faulty, "faulty_counter_get", extern "C" fn() -> i64);
    assert_eq!(counter_add(3), 3);
    assert_eq!(counter_add(4), 7);
    assert_eq!(counter_get(), 7);

    let arm = func!(faulty, "faulty_arm", extern "C" fn(i64, i64));
    let compute = func!(faulty, "faulty_compute", extern "C" fn(i64) -> i64);
    assert_eq!(compute(5), 26);
    assert_eq!(compute(-3), 10);

    // Outside ward there is no ward-xpc region: the attacks give up.
    let garbage = func!(faulty, "faulty_garbage_reply", extern "C" fn() -> i64);
    let forged = func!(faulty, "faulty_forged_reply", extern "C" fn() -> i64);
    assert_eq!(garbage(), -1);
    assert_eq!(forged(), -1);
    for kind in [GARBAGE_REPLY, FORGED_REPLY] {
        arm(kind, 0);
        assert_eq!(compute(5), -1, "kind {kind}");
        // Triggering disarms.
        assert_eq!(compute(5), 26, "kind {kind}");
    }

    // Kind 0 and unknown kinds disarm.
    arm(GARBAGE_REPLY, 0);
    arm(0, 0);
    assert_eq!(compute(2), 5);
    arm(99, 0);
    assert_eq!(compute(2), 5);

    // A "wild" write aimed at memory we own is harmless and shows the value.
    let mut target: i64 = 0;
    arm(WILD_WRITE, std::ptr::addr_of_mut!(target) as i64);
    assert_eq!(compute(4), 17);
    assert_eq!(target, WILD_WRITE_VALUE);

    let wild_write = func!(faulty, "faulty_wild_write", unsafe extern "C" fn(*mut i64));
    let mut target: i64 = 0;
    // SAFETY: target is a live, aligned i64 owned by this frame.
    unsafe { wild_write(&mut target) };
    assert_eq!(target, WILD_WRITE_VALUE);
}

#[test]
fn faulty_mpk_leaves_out_the_process_only_kinds() {
    let lib = Lib::open("faulty_mpk");
    let faulty = EXPORTS.iter().find(|(name, _)| *name == "faulty").map(|(_, symbols)| *symbols).unwrap_or_default();
    for symbol in faulty.iter().filter(|s| !FAULTY_PROCESS_ONLY.contains(s)).chain(&["faulty_address_of"]) {
        lib.sym(symbol);
    }
    for symbol in FAULTY_PROCESS_ONLY {
        let c_symbol = CString::new(*symbol).unwrap();
        // SAFETY: handle came from a successful dlopen and is never closed; c_symbol is a valid C string.
        let ptr = unsafe { libc::dlsym(lib.handle, c_symbol.as_ptr()) };
        assert!(ptr.is_null(), "faulty_mpk.so exports {symbol}");
    }
    let arm = func!(lib, "faulty_arm", extern "C" fn(i64, i64));
    let compute = func!(lib, "faulty_compute", extern "C" fn(i64) -> i64);
    // Arming a process-only kind disarms: compute returns its plain result.
    for kind in 8..=11 {
        arm(kind, 0);
        assert_eq!(compute(6), 37, "kind {kind}");
    }
}
