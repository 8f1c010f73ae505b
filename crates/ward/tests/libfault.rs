//! Run-time library faults (policy `library_fault`, `ward::libfault`): allocation failure, memory leak and copy
//! overrun injected into the C library calls of the built-in `calls` extension, in a process domain and in a
//! native host; and everything that refuses them.

mod common;

use std::ffi::{c_char, c_void, CStr, CString, OsString};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::mpsc::Receiver;

use common::{builtin, faults, require_pku};
use ward::libfault::{self, LibraryFault, LibraryFaultKind};
use ward::policy::PolicyError;
use ward::{AdapterLoad, Arg, Error, Event, Extension, FaultKind, Isolation, Policy, RetType, SignalCause, Supervisor};

/// `calls`' policy: a call that faults fails at once (one fault per call), restarts are unlimited and immediate.
fn policy(name: &str, fault: &str) -> String {
    format!(
        r#"
[extension.{name}]
deadline_ms = 10000
on_fault = "fail"
max_restarts = 1000
restart_period_s = 1
backoff_initial_ms = 0.001
backoff_max_ms = 0.001
library_fault = {fault}
[extension.{name}.limits]
address_space_mb = 256
"#
    )
}

fn load(fault: &str) -> (Supervisor, Extension, Receiver<Event>) {
    let sup = Supervisor::new(Policy::from_toml_str(&policy("calls", fault), "test policy").unwrap());
    let events = sup.subscribe();
    let ext = sup.load(builtin("calls")).unwrap();
    (sup, ext, events)
}

fn call(ext: &Extension, f: &str, args: &mut [Arg<'_>]) -> Result<i64, Error> {
    ext.call(f, args, RetType::I64).map(|v| v.as_i64().unwrap())
}

/// The fault behind a failed call.
fn fault_of(result: Result<i64, Error>) -> ward::Fault {
    match result {
        Err(Error::Fault(f)) => f,
        other => panic!("expected a fault, got {other:?}"),
    }
}

fn signal(f: &ward::Fault) -> (i32, SignalCause) {
    match f.kind {
        FaultKind::Signal { signo, cause, .. } => (signo, cause),
        ref other => panic!("expected a signal fault, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// In a process domain
// ---------------------------------------------------------------------------

#[test]
fn without_a_fault_every_call_works() {
    let (_sup, ext, events) = load(r#""none""#);
    assert_eq!(call(&ext, "calls_alloc_sum", &mut [Arg::I64(16)]).unwrap(), 120);
    assert_eq!(call(&ext, "calls_checked_alloc", &mut [Arg::I64(32)]).unwrap(), 32);
    assert_eq!(call(&ext, "calls_churn", &mut [Arg::I64(2000), Arg::I64(1 << 20)]).unwrap(), 2000);
    for how in 0..5 {
        assert!(call(&ext, "calls_copy", &mut [Arg::I64(100), Arg::I64(how)]).unwrap() > 0, "how {how}");
    }
    let mut buf = vec![0u8; 4096];
    assert_eq!(call(&ext, "calls_fill", &mut [Arg::Out(&mut buf), Arg::U64(4096), Arg::I64(7)]).unwrap(), 4096);
    assert!(buf.iter().all(|&b| b == 7));
    assert!(faults(&events).is_empty());
    assert_eq!(ext.stats().restarts, 0);
}

#[test]
fn a_failed_allocation_used_without_a_check_faults_in_the_domain_and_is_recovered() {
    let (_sup, ext, events) = load(r#"{ kind = "alloc", nth = 1, count = 1 }"#);
    let f = fault_of(call(&ext, "calls_alloc_sum", &mut [Arg::I64(16)]));
    assert_eq!(signal(&f), (libc::SIGSEGV, SignalCause::NullDereference));
    assert_eq!(f.call.as_deref(), Some("calls_alloc_sum"));
    // The host survived and the extension was restarted: calls without allocations work.
    assert_eq!(call(&ext, "calls_add", &mut [Arg::I64(2), Arg::I64(3)]).unwrap(), 5);
    assert_eq!(ext.stats().restarts, 1);
    assert_eq!(faults(&events).len(), 1);
    // Every incarnation counts from the zygote's count: the same call fails the same way again.
    let again = fault_of(call(&ext, "calls_alloc_sum", &mut [Arg::I64(16)]));
    assert_eq!(signal(&again), (libc::SIGSEGV, SignalCause::NullDereference));
}

#[test]
fn nth_and_count_select_which_allocations_fail() {
    let (_sup, ext, events) = load(r#""alloc:nth=2,count=2""#);
    let got: Vec<i64> = (0..5).map(|_| call(&ext, "calls_checked_alloc", &mut [Arg::I64(32)]).unwrap()).collect();
    // Only the extension's own allocations count: the domain process allocates all along.
    assert_eq!(got, [32, -1, -1, 32, 32]);
    assert!(faults(&events).is_empty());
    assert_eq!(ext.stats().restarts, 0);
}

#[test]
fn a_copy_overrun_damages_the_canary_and_the_abort_is_recovered() {
    // memcpy, memmove, memset, strcpy, strncpy.
    for how in 0..5 {
        let (_sup, ext, events) = load(r#"{ kind = "copy-overrun", nth = 2, extra = 64 }"#);
        let args = |how| [Arg::I64(100), Arg::I64(how)];
        let good = call(&ext, "calls_copy", &mut args(how)).unwrap();
        let f = fault_of(call(&ext, "calls_copy", &mut args(how)));
        assert_eq!(signal(&f), (libc::SIGABRT, SignalCause::Abort), "how {how}");
        // The new incarnation counts from the zygote's count again: its first copy is right.
        assert_eq!(call(&ext, "calls_copy", &mut args(how)).unwrap(), good, "how {how}");
        assert_eq!(ext.stats().restarts, 1);
        assert_eq!(faults(&events).len(), 1, "how {how}");
    }
}

#[test]
fn a_copy_overrun_past_a_lent_buffer_hits_its_guard_page() {
    let (_sup, ext, _events) = load(r#""copy-overrun:nth=1,extra=64""#);
    let mut buf = vec![0u8; 4096];
    let f = fault_of(call(&ext, "calls_fill", &mut [Arg::Out(&mut buf), Arg::U64(4096), Arg::I64(7)]));
    assert_eq!(signal(&f), (libc::SIGSEGV, SignalCause::InvalidAccess));
    assert_eq!(call(&ext, "calls_add", &mut [Arg::I64(2), Arg::I64(3)]).unwrap(), 5);
}

#[test]
fn a_leak_runs_the_domain_out_of_address_space() {
    let (_sup, ext, _events) = load(r#"{ kind = "leak" }"#);
    // 20 000 MiB allocated and freed one at a time; with the frees dropped, malloc fails at the 256 MiB limit and
    // the extension writes through the null it got: a fault named for the exhausted address space.
    let f = fault_of(call(&ext, "calls_churn", &mut [Arg::I64(20_000), Arg::I64(1 << 20)]));
    assert_eq!(signal(&f), (libc::SIGSEGV, SignalCause::OutOfMemory));
    assert_eq!(call(&ext, "calls_checked_alloc", &mut [Arg::I64(32)]).unwrap(), 32);
}

#[test]
fn a_class_adapters_fault_targets_the_plugin_it_opens() {
    // The adapter is calls itself; the plugin a copy of it (another file, so the adapter's dlopen loads it anew).
    let dir = std::env::temp_dir().join(format!("ward-libfault-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = dir.join("plugin_copy.so");
    std::fs::copy(builtin("calls"), &plugin).unwrap();
    let adapter = builtin("calls");

    let policy = Policy::from_toml_str(&policy("plugin_copy", r#""alloc:nth=1,count=0""#), "test policy").unwrap();
    let sup = Supervisor::new(policy);
    let ext = sup.load_adapter(&AdapterLoad {
        adapter: &adapter,
        name: None,
        plugin: &plugin,
        isolation: None,
        functions: &[],
        when_disabled: None,
    });
    let ext = ext.unwrap();
    assert_eq!(ext.name(), "plugin_copy");
    // The adapter's own allocations are not the plugin's.
    assert_eq!(call(&ext, "calls_checked_alloc", &mut [Arg::I64(32)]).unwrap(), 32);
    let path = CString::new(plugin.as_os_str().as_encoded_bytes()).unwrap();
    let via = |ext: &Extension| {
        call(ext, "calls_via", &mut [Arg::Str(&path), Arg::Str(c"calls_checked_alloc"), Arg::I64(32)])
    };
    assert_eq!(via(&ext).unwrap(), -1, "the plugin's allocation fails");
    assert_eq!(via(&ext).unwrap(), -1, "and every one after it (count 0)");
    assert_eq!(call(&ext, "calls_checked_alloc", &mut [Arg::I64(32)]).unwrap(), 32);
    drop(ext);
    drop(sup);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------
// In an mpk domain (marked as needing PKU: `scripts/test` runs them, under emulation where this processor has none)
// ---------------------------------------------------------------------------

/// `calls` as a class adapter in an mpk domain, opening a copy of `calls_plugin` (calls without its own dlopen)
/// as its plugin, whose calls get `fault`:
/// the supervisor, the extension, its events, the plugin's path and the directory to remove. Fails the test without
/// PKU.
fn mpk_adapter(test: &str, fault: &str) -> (Supervisor, Extension, Receiver<Event>, CString, PathBuf) {
    mpk_adapter_with(test, fault, "")
}

/// As [`mpk_adapter`], with `more` added to the plugin's policy section.
fn mpk_adapter_with(test: &str, fault: &str, more: &str) -> (Supervisor, Extension, Receiver<Event>, CString, PathBuf) {
    require_pku();
    let dir = std::env::temp_dir().join(format!("ward-libfault-mpk-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = dir.join("plugin_copy.so");
    std::fs::copy(builtin("calls_plugin"), &plugin).unwrap();
    // `more` may set on_fault itself.
    let base = policy("plugin_copy", fault);
    let base = if more.contains("on_fault") { base.replace("on_fault = \"fail\"\n", "") } else { base };
    let text = base.replacen("[extension.plugin_copy]\n", &format!("[extension.plugin_copy]\n{more}"), 1);
    let sup = Supervisor::new(Policy::from_toml_str(&text, "test policy").unwrap());
    let events = sup.subscribe();
    let adapter = builtin("calls");
    let load = AdapterLoad {
        adapter: &adapter,
        name: None,
        plugin: &plugin,
        isolation: Some(Isolation::Mpk),
        functions: &[],
        when_disabled: None,
    };
    let ext = sup.load_adapter(&load).expect("calls and its plugin load under mpk");
    assert_eq!(ext.isolation(), Isolation::Mpk);
    let path = CString::new(plugin.as_os_str().as_encoded_bytes()).unwrap();
    (sup, ext, events, path, dir)
}

/// The plugin's `symbol(arg)`, called by the adapter.
fn via(ext: &Extension, path: &CStr, symbol: &CStr, arg: i64) -> Result<i64, Error> {
    call(ext, "calls_via", &mut [Arg::Str(path), Arg::Str(symbol), Arg::I64(arg)])
}

#[test]
#[ignore = "needs PKU"]
fn mpk_an_allocation_fault_hits_the_plugins_calls_and_not_the_adapters() {
    let (_sup, ext, events, path, dir) = mpk_adapter("alloc", r#""alloc:nth=1,count=0""#);
    assert_eq!(call(&ext, "calls_checked_alloc", &mut [Arg::I64(32)]).unwrap(), 32, "the adapter's own");
    assert_eq!(via(&ext, &path, c"calls_checked_alloc", 32).unwrap(), -1, "the plugin's allocation fails");
    assert_eq!(via(&ext, &path, c"calls_checked_alloc", 32).unwrap(), -1, "and every one after it (count 0)");
    // Used without a check: a null dereference in the domain, recovered.
    let f = fault_of(via(&ext, &path, c"calls_alloc_sum", 16));
    assert_eq!(signal(&f), (libc::SIGSEGV, SignalCause::NullDereference));
    assert_eq!(call(&ext, "calls_add", &mut [Arg::I64(2), Arg::I64(3)]).unwrap(), 5);
    assert_eq!(faults(&events).len(), 1);
    assert_eq!(ext.isolation(), Isolation::Mpk);
    drop(ext);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs PKU"]
fn mpk_a_library_fault_stays_with_its_file_when_the_plugin_restarts_from_another() {
    // The fault names the plugin's copy; after its fault the plugin restarts from the built-in file (restart_from),
    // which the fault does not target, as in a process domain.
    let more = format!("restart_from = {:?}\non_fault = \"retry\"\n", builtin("calls_plugin"));
    let (_sup, ext, events, path, dir) = mpk_adapter_with("switch", r#""alloc:nth=1,count=0""#, &more);
    assert_eq!(via(&ext, &path, c"calls_alloc_sum", 16).unwrap(), 120, "retried on the good file: no fault there");
    assert_eq!(faults(&events).len(), 1);
    assert_eq!(via(&ext, &path, c"calls_checked_alloc", 32).unwrap(), 32);
    drop(ext);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs PKU"]
fn mpk_a_copy_overrun_damages_the_canary_and_the_abort_is_recovered() {
    let fault = r#"{ kind = "copy-overrun", nth = 2, extra = 64 }"#;
    let (_sup, ext, events, path, dir) = mpk_adapter("copy", fault);
    // memcpy first (the first copy, right), then memmove (the second, 64 bytes too many): the canary is damaged.
    let f = fault_of(via(&ext, &path, c"calls_copy_every_way", 100));
    assert_eq!(signal(&f), (libc::SIGABRT, SignalCause::Abort));
    // Restored from the snapshot, the count is loading's again: the same call fails the same way.
    let again = fault_of(via(&ext, &path, c"calls_copy_every_way", 100));
    assert_eq!(signal(&again), (libc::SIGABRT, SignalCause::Abort));
    assert_eq!(faults(&events).len(), 2);
    // The adapter's own copies are right.
    assert!(call(&ext, "calls_copy_every_way", &mut [Arg::I64(100)]).unwrap() > 0);
    drop(ext);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs PKU"]
fn mpk_a_leak_runs_the_domain_out_of_its_heap() {
    let (_sup, ext, _events, path, dir) = mpk_adapter("leak", r#"{ kind = "leak" }"#);
    // 20 000 MiB allocated and freed one at a time; with the frees dropped the 256 MiB heap runs out, malloc gives
    // null and the plugin writes through it: a fault named for the exhausted memory.
    let f = fault_of(via(&ext, &path, c"calls_churn_mib", 20_000));
    assert_eq!(signal(&f), (libc::SIGSEGV, SignalCause::OutOfMemory));
    assert_eq!(via(&ext, &path, c"calls_checked_alloc", 32).unwrap(), 32, "restored, the heap is back");
    drop(ext);
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------

#[test]
fn isolation_none_is_refused_with_a_typed_error() {
    let policy = Policy::from_toml_str(&policy("calls", r#""alloc""#), "test policy").unwrap();
    let sup = Supervisor::new(policy);
    let err = sup.load_with(builtin("calls"), Some(Isolation::None)).unwrap_err();
    match &err {
        Error::LibraryFaultNeedsDomain { extension, isolation } => {
            assert_eq!(extension, "calls");
            assert_eq!(*isolation, Isolation::None);
        }
        other => panic!("expected LibraryFaultNeedsDomain, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.contains("needs a domain") && message.contains("library_fault"), "{message}");
    // `auto` gives a library fault a process domain.
    let ext = sup.load_with(builtin("calls"), Some(Isolation::Auto)).unwrap();
    assert_eq!(ext.isolation(), Isolation::Process);
    // mpk takes one (calls itself is refused for its dlopen, for another reason: see the adapter tests below).
    if let Err(e) = sup.load_with(builtin("calls"), Some(Isolation::Mpk)) {
        assert!(!matches!(e, Error::LibraryFaultNeedsDomain { .. }), "{e}");
    }
}

#[test]
fn a_library_fault_in_a_group_is_refused() {
    let text = "[extension.calls]\ngroup = \"shared\"\nlibrary_fault = \"alloc\"\n";
    let sup = Supervisor::new(Policy::from_toml_str(text, "test policy").unwrap());
    let err = sup.load(builtin("calls")).unwrap_err();
    assert!(matches!(&err, Error::LibraryFaultInGroup { group, .. } if group == "shared"), "{err:?}");
    assert!(err.to_string().contains("remove its group or the library_fault"), "{err}");
}

#[test]
fn none_in_an_extension_section_turns_off_a_default_fault() {
    let text = "[defaults]\nlibrary_fault = \"alloc\"\n[extension.calls]\nlibrary_fault = \"none\"\n";
    let policy = Policy::from_toml_str(text, "test policy").unwrap();
    assert_eq!(policy.for_extension("calls").library_fault, None);
    assert_eq!(policy.for_extension("other").library_fault, Some("alloc".parse().unwrap()));
    let sup = Supervisor::new(policy);
    let ext = sup.load_with(builtin("calls"), Some(Isolation::None)).unwrap();
    assert_eq!(call(&ext, "calls_checked_alloc", &mut [Arg::I64(32)]).unwrap(), 32);
}

#[test]
fn the_policy_key_takes_a_table_or_a_string() {
    let cases = [
        (r#"{ kind = "alloc", nth = 3, count = 1 }"#, "alloc:nth=3,count=1"),
        (r#"{ kind = "leak" }"#, "leak:nth=1,count=0"),
        (r#"{ kind = "copy-overrun", nth = 2, count = 0, extra = 8 }"#, "copy-overrun:nth=2,count=0,extra=8"),
        (r#""copy-overrun:nth=2,extra=8""#, "copy-overrun:nth=2,count=1,extra=8"),
        (r#""alloc""#, "alloc:nth=1,count=1"),
    ];
    for (value, expected) in cases {
        let text = format!("[extension.e]\nlibrary_fault = {value}\n");
        let policy = Policy::from_toml_str(&text, "test policy").unwrap_or_else(|e| panic!("{value}: {e}"));
        let fault = policy.for_extension("e").library_fault.unwrap();
        assert_eq!(fault.to_string(), expected, "{value}");
    }
    let fault = LibraryFault::new(LibraryFaultKind::CopyOverrun, 2).unwrap().with_extra(8).unwrap();
    assert_eq!(fault.to_string().parse::<LibraryFault>(), Ok(fault));
}

#[test]
fn a_malformed_policy_key_is_refused_at_its_line_saying_what_to_write() {
    let cases = [
        (r#"{ kind = "explode" }"#, "library_fault: unknown library fault kind \"explode\": expected one of \"alloc\""),
        ("{ nth = 2 }", "library_fault: a library fault needs its kind"),
        ("{ kind = 3 }", "library_fault: kind must be one of \"alloc\", \"leak\", \"copy-overrun\", got 3"),
        (r#"{ kind = "alloc", nth = 0 }"#, "library_fault: library fault `nth` must be a whole number from 1"),
        (r#"{ kind = "alloc", nth = -3 }"#, "got -3"),
        (r#"{ kind = "alloc", nth = 1.5 }"#, "got 1.5"),
        (r#"{ kind = "alloc", count = "2" }"#, "got \"2\""),
        (r#"{ kind = "alloc", colour = 1 }"#, "unknown library fault setting `colour`"),
        (r#"{ kind = "alloc", extra = 8 }"#, "`extra` applies to copy-overrun faults only, not to alloc; remove it"),
        (r#""alloc:nth=x""#, "library_fault: library fault `nth` must be"),
        (r#""alloc:nth=3;count=1""#, "must be a whole number"),
        ("3", "library_fault must be a table such as { kind = \"alloc\", nth = 3, count = 1 }, a string such as"),
        ("true", "got true"),
        ("[1]", "got an array"),
        ("1979-05-27", "got a date-time"),
    ];
    for (value, expected) in cases {
        let text = format!("[extension.e]\ndeadline_ms = 5\nlibrary_fault = {value}\n");
        match Policy::from_toml_str(&text, "test.toml") {
            Err(PolicyError::Invalid { line, reason, .. }) => {
                assert_eq!(line, 3, "{value}: {reason}");
                assert!(reason.contains(expected), "{value}: {reason}");
            }
            other => panic!("{value}: expected Invalid, got {other:?}"),
        }
    }
    match Policy::from_toml_str("[group.g]\nlibrary_fault = \"alloc\"\n", "test.toml") {
        Err(PolicyError::Invalid { line: 2, reason, .. }) => {
            assert!(reason.contains("`library_fault` is set per extension: put it in [extension.NAME]"), "{reason}")
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// A native host, and the variable itself
// ---------------------------------------------------------------------------

/// Set in the child process this file's tests start as a native host: what it does.
const CHILD_MODE: &str = "WARD_LIBFAULT_TEST_CHILD";

/// Runs `native_host_child` in a child process (this test program again) with `env`; `mode` says what it does.
fn native_host(mode: &str, env: &[(OsString, OsString)]) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["native_host_child", "--exact", "--nocapture", "--test-threads=1"]);
    cmd.env_remove("LD_PRELOAD").env_remove(libfault::ENV_VAR);
    cmd.env(CHILD_MODE, mode).env("WARD_LIBFAULT_TEST_OBJECT", builtin("calls"));
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.output().unwrap()
}

/// The line `checked_alloc: ...` a `checked` child printed.
fn checked_line(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed ({}): {stdout}\n{stderr}", out.status);
    // The harness prints the test's name on the same line first.
    let at = stdout.find("checked_alloc:").unwrap_or_else(|| panic!("{stdout}"));
    stdout[at..].lines().next().unwrap_or_default().to_string()
}

/// Not a test of its own: the native host the tests above start (it does nothing unless started by them).
#[test]
fn native_host_child() {
    let Ok(mode) = std::env::var(CHILD_MODE) else { return };
    let object = PathBuf::from(std::env::var_os("WARD_LIBFAULT_TEST_OBJECT").unwrap());
    let path = CString::new(object.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; calls has no constructors.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null());
    let sym = |name: &CStr| -> *mut c_void {
        // SAFETY: lib is an open handle and name a valid C string.
        let f = unsafe { libc::dlsym(lib, name.as_ptr() as *const c_char) };
        assert!(!f.is_null());
        f
    };
    // SAFETY: both are `int64_t f(int64_t)` in extensions/calls.c.
    let (checked, alloc_sum) = unsafe {
        (
            std::mem::transmute::<*mut c_void, extern "C" fn(i64) -> i64>(sym(c"calls_checked_alloc")),
            std::mem::transmute::<*mut c_void, extern "C" fn(i64) -> i64>(sym(c"calls_alloc_sum")),
        )
    };
    match mode.as_str() {
        "checked" => {
            let got: Vec<String> = (0..3).map(|_| checked(32).to_string()).collect();
            println!("checked_alloc: {}", got.join(" "));
        }
        "crash" => println!("alloc_sum: {}", alloc_sum(16)),
        other => panic!("unknown mode {other}"),
    }
}

#[test]
fn a_native_host_started_with_env_for_gets_the_same_fault() {
    let object = builtin("calls");
    assert_eq!(checked_line(&native_host("checked", &[])), "checked_alloc: 32 32 32");
    let env = libfault::env_for(&object, &"alloc:nth=2,count=1".parse().unwrap()).unwrap();
    assert_eq!(checked_line(&native_host("checked", &env)), "checked_alloc: 32 -1 32");

    // Natively, the allocation used without a check kills the host.
    let env = libfault::env_for(&object, &"alloc".parse().unwrap()).unwrap();
    let out = native_host("crash", &env);
    assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
    let out = native_host("crash", &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("alloc_sum: 120"), "{out:?}");
}

#[test]
fn a_malformed_variable_is_reported_in_one_line_and_nothing_is_injected() {
    let object = builtin("calls");
    let object = object.display();
    let cases = [
        (format!("kind=explode object={object}"), "kind must be alloc, leak or copy-overrun"),
        (format!("kind=alloc nth=0 object={object}"), "nth must be given once, a whole number from 1 to 1000000000"),
        (format!("kind=alloc nth=1 nth=2 object={object}"), "nth must be given once"),
        (format!("kind=alloc count=-1 object={object}"), "count must be given once"),
        (format!("kind=alloc colour=red object={object}"), "unknown key `colour`"),
        (format!("kind=alloc extra=8 object={object}"), "extra applies to kind=copy-overrun only"),
        (format!("kind=alloc nth object={object}"), "expected KEY=VALUE words"),
        (format!("nth=1 object={object}"), "kind is missing"),
        ("kind=alloc nth=1".to_string(), "object is missing"),
        ("kind=alloc object=relative/calls.so".to_string(), "object must be an absolute path"),
        ("kind=alloc object=/nonexistent/calls.so".to_string(), "cannot find object /nonexistent/calls.so"),
    ];
    let library = libfault::library_path().unwrap();
    for (value, expected) in cases {
        let env = [
            (OsString::from("LD_PRELOAD"), library.clone().into_os_string()),
            (libfault::ENV_VAR.into(), value.clone().into()),
        ];
        let out = native_host("checked", &env);
        assert_eq!(checked_line(&out), "checked_alloc: 32 32 32", "{value}: nothing injected");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("ward_libfault:")).collect();
        assert_eq!(lines.len(), 1, "{value}: {stderr}");
        assert!(
            lines[0].starts_with(&format!("ward_libfault: WARD_LIBFAULT=\"{value}\" is malformed: ")),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains(expected) && lines[0].ends_with("; no fault is injected"), "{value}: {}", lines[0]);
    }
}

#[test]
fn the_preload_library_passes_other_code_straight_through() {
    // Every allocation of the calls object fails, from the first on; the test program itself (the harness, the
    // dynamic loader, libc) allocates all along and runs to the end.
    let env = libfault::env_for(Path::new(&builtin("calls")), &"alloc:count=0".parse().unwrap()).unwrap();
    assert_eq!(checked_line(&native_host("checked", &env)), "checked_alloc: -1 -1 -1");
}
