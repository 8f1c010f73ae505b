//! Runtimes (issue 32): plugins compiled from C at run time inside a runtime's domain, linked and unlinked while it
//! runs, called; and after each kind of failure (a plugin that crashes, loops past the quantum, overruns a buffer,
//! source that crashes the compiler) the runtime's other plugins answer correctly.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ward::{Arg, Isolation, Policy, RetType, Signature, Supervisor, ValType, Value};
use ward_classes::runtime::{Code, Runtime, RuntimeError, RuntimeOptions, Severity};

const ADD: &str = "#include <stdint.h>\nint64_t add(int64_t a, int64_t b) { return a + b; }\n";

fn transforms_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../extensions/runtime")
}

fn transform_source(name: &str) -> String {
    std::fs::read_to_string(transforms_dir().join(format!("{name}.c"))).unwrap()
}

fn image_header() -> String {
    std::fs::read_to_string(transforms_dir().join("ward_image.h")).unwrap()
}

fn supervisor(policy: &str) -> Supervisor {
    Supervisor::new(Policy::from_toml_str(policy, "runtime test policy").unwrap())
}

fn options(isolation: Isolation) -> RuntimeOptions {
    // Generous: the machine may be loaded; the looping plugin is the only one that reaches it.
    RuntimeOptions { isolation: Some(isolation), quantum: Duration::from_secs(3), ..RuntimeOptions::default() }
}

fn add(rt: &Runtime, a: i64, b: i64) -> i64 {
    let id = rt.lookup("add").expect("add is linked");
    rt.call(id, &mut [Arg::I64(a), Arg::I64(b)], RetType::I64).unwrap().as_i64().unwrap()
}

/// Runs grayscale over a 2x1 image and returns the output's pixels.
fn gray(rt: &Runtime) -> Vec<u8> {
    let id = rt.lookup("grayscale").expect("grayscale is linked");
    let input = [10u8, 20, 30, 255, 0, 0];
    let mut out = vec![0u8; 16 + 6];
    let n = rt
        .call(id, &mut [Arg::In(&input), Arg::I64(2), Arg::I64(1), Arg::Out(&mut out), Arg::I64(22)], RetType::I64)
        .unwrap();
    assert_eq!(n.as_i64(), Some(22));
    assert_eq!(&out[..16], &[2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    out[16..].to_vec()
}

const GRAY_PIXELS: [u8; 6] = [18, 18, 18, 76, 76, 76];

fn runtime_with_basics(sup: &Supervisor, isolation: Isolation) -> Runtime {
    let rt = Runtime::open(sup, "basics", &options(isolation)).unwrap();
    rt.header("ward_image.h", &image_header()).unwrap();
    rt.create("add", Code::Source(ADD)).unwrap();
    rt.create("grayscale", Code::Source(&transform_source("grayscale"))).unwrap();
    rt
}

#[test]
fn creates_looks_up_calls_and_deletes_plugins() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    assert_eq!(rt.isolation(), Isolation::Process);
    assert_eq!(rt.plugins(), ["add", "grayscale"]);
    assert_eq!(add(&rt, 2, 40), 42);
    assert_eq!(gray(&rt), GRAY_PIXELS);

    let id = rt.lookup("add").unwrap();
    rt.delete("add").unwrap();
    assert_eq!(rt.lookup("add"), None);
    assert!(matches!(
        rt.call(id, &mut [Arg::I64(1), Arg::I64(2)], RetType::I64),
        Err(RuntimeError::StalePlugin { .. })
    ));
    assert!(matches!(rt.delete("add"), Err(RuntimeError::NoSuchPlugin { .. })));
    // The name is free again, and the new plugin is a new id.
    let again = rt.create("add", Code::Source(ADD)).unwrap();
    assert_ne!(again, id);
    assert_eq!(add(&rt, 5, 6), 11);
    assert!(matches!(rt.create("add", Code::Source(ADD)), Err(RuntimeError::Exists { .. })));
    assert_eq!(gray(&rt), GRAY_PIXELS);
}

#[test]
fn runs_without_isolation_too() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::None);
    assert_eq!(add(&rt, 20, 22), 42);
    assert_eq!(gray(&rt), GRAY_PIXELS);
}

#[test]
fn a_compile_error_has_line_and_column() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    let source = "#include <stdint.h>\nint64_t broken(int64_t a) {\n    return a + missing;\n}\n";
    let Err(RuntimeError::Compile { plugin, first, all }) = rt.create("broken", Code::Source(source)) else {
        panic!("a broken source compiled");
    };
    assert_eq!(plugin, "broken");
    assert_eq!(first.severity, Severity::Error);
    assert_eq!(first.file.as_deref(), Some("broken.c"));
    assert_eq!(first.line, Some(3), "{first}");
    assert!(first.message.contains("missing"), "{first}");
    // `missing` starts in column 16.
    assert_eq!(first.column, Some(16), "{first}");
    assert!(!all.is_empty());
    // An undefined name is a link error, named.
    let Err(RuntimeError::Compile { first, .. }) =
        rt.create("calls_exit", Code::Source("void exit(int);\nlong calls_exit(void) { exit(1); return 0; }\n"))
    else {
        panic!("a plugin calling exit linked");
    };
    assert!(first.message.contains("exit"), "{first}");
    // A source without the plugin's entry point.
    let Err(RuntimeError::Compile { first, .. }) = rt.create("entry", Code::Source("long other(void) { return 1; }"))
    else {
        panic!("a plugin without its entry point linked");
    };
    assert!(first.message.contains("no function named 'entry'"), "{first}");
    // None of it touched the plugins linked.
    assert_eq!(rt.plugins(), ["add", "grayscale"]);
    assert_eq!(add(&rt, 1, 1), 2);
}

#[test]
fn a_crashing_plugin_is_unlinked_and_the_others_answer() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    let crash = "long crash(long x) { volatile long *p = (long *)0; return *p + x; }\n";
    let id = rt.create("crash", Code::Source(crash)).unwrap();
    let pid = rt.extension().pid();
    let Err(RuntimeError::PluginFault { plugin, fault, unlinked }) = rt.call(id, &mut [Arg::I64(1)], RetType::I64)
    else {
        panic!("a null read did not fault");
    };
    assert_eq!(plugin, "crash");
    assert_eq!(fault.kind_name(), "signal");
    assert_eq!(unlinked, ["crash"]);
    assert_eq!(rt.lookup("crash"), None);
    // A process domain was restarted, and the other plugins came back linked.
    assert_ne!(rt.extension().pid(), pid);
    assert_eq!(add(&rt, 3, 4), 7);
    assert_eq!(gray(&rt), GRAY_PIXELS);
}

#[test]
fn the_faulty_transform_is_unlinked_and_the_others_answer() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    let id = rt.create("faulty", Code::Source(&transform_source("faulty"))).unwrap();
    let input = [1u8; 12];
    let mut out = vec![0u8; 28];
    let r =
        rt.call(id, &mut [Arg::In(&input), Arg::I64(2), Arg::I64(2), Arg::Out(&mut out), Arg::I64(28)], RetType::I64);
    assert!(matches!(r, Err(RuntimeError::PluginFault { .. })), "{r:?}");
    assert_eq!(gray(&rt), GRAY_PIXELS);
}

#[test]
fn a_plugin_past_its_quantum_is_unlinked_and_the_others_answer() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    let spin = "long spin(long x) { volatile long n = x; for (;;) n++; return n; }\n";
    let id = rt.create("spin", Code::Source(spin)).unwrap();
    let Err(RuntimeError::PluginFault { plugin, fault, .. }) = rt.call(id, &mut [Arg::I64(1)], RetType::I64) else {
        panic!("an endless loop returned");
    };
    assert_eq!(plugin, "spin");
    assert_eq!(fault.kind_name(), "timeout");
    assert_eq!(add(&rt, 10, 11), 21);
    assert_eq!(gray(&rt), GRAY_PIXELS);
}

#[test]
fn a_plugin_overrunning_its_buffer_is_unlinked_and_the_others_answer() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    // Writes well past the end of the buffer it was handed, as an off-by-a-row loop would.
    let overrun =
        "#include <stdint.h>\nint64_t overrun(uint8_t *out, int64_t len) {\n    for (int64_t i = 0; i < len + \
                   65536; i++) out[i] = 7;\n    return len;\n}\n";
    let id = rt.create("overrun", Code::Source(overrun)).unwrap();
    let mut out = vec![0u8; 1000];
    let r = rt.call(id, &mut [Arg::Out(&mut out), Arg::I64(1000)], RetType::I64);
    assert!(matches!(r, Err(RuntimeError::PluginFault { .. })), "{r:?}");
    // The failed call's output was not copied back.
    assert!(out.iter().all(|&b| b == 0));
    assert_eq!(add(&rt, 1, 2), 3);
    assert_eq!(gray(&rt), GRAY_PIXELS);
}

#[test]
fn source_that_crashes_the_compiler_costs_a_recovery_not_the_host() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    // Nesting deep enough to overflow the compiler's stack as it parses.
    let depth = 300_000;
    let source = format!("long deep(void) {{ return {}1{}; }}\n", "(".repeat(depth), ")".repeat(depth));
    match rt.create("deep", Code::Source(&source)) {
        Err(RuntimeError::CompilerFault { plugin, .. }) => assert_eq!(plugin, "deep"),
        other => panic!("the compiler survived {depth} parentheses: {other:?}"),
    }
    assert_eq!(rt.lookup("deep"), None);
    assert_eq!(add(&rt, 30, 12), 42);
    assert_eq!(gray(&rt), GRAY_PIXELS);
    // And the runtime still compiles.
    rt.create("add2", Code::Source("long add2(long a) { return a + 2; }")).unwrap();
    assert_eq!(rt.call(rt.lookup("add2").unwrap(), &mut [Arg::I64(40)], RetType::I64).unwrap(), Value::I64(42));
}

#[test]
fn a_plugin_calls_a_built_in_of_the_host() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    let seen = Arc::new(AtomicI64::new(0));
    let seen_by_host = seen.clone();
    rt.builtin("host_scale", Signature::new(&[ValType::I64], RetType::I64), move |args| {
        let x = args.first().and_then(Value::as_i64).unwrap_or(0);
        seen_by_host.fetch_add(1, Ordering::SeqCst);
        Value::I64(x * 3)
    })
    .unwrap();
    let source = "long host_scale(long);\nlong scaled(long x) { return host_scale(x) + 1; }\n";
    let id = rt.create("scaled", Code::Source(source)).unwrap();
    assert_eq!(rt.call(id, &mut [Arg::I64(5)], RetType::I64).unwrap(), Value::I64(16));
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    // After a crash elsewhere the plugin is linked again and still reaches the host.
    let crash = rt.create("crash", Code::Source("long crash(void) { return *(volatile long *)8; }")).unwrap();
    assert!(matches!(rt.call(crash, &mut [], RetType::I64), Err(RuntimeError::PluginFault { .. })));
    assert_eq!(rt.call(id, &mut [Arg::I64(7)], RetType::I64).unwrap(), Value::I64(22));
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    assert_eq!(gray(&rt), GRAY_PIXELS);
}

#[test]
fn plugins_call_each_other_and_a_failure_takes_its_callers_along() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    let twice = "long add(long, long);\nlong twice(long x) { return add(x, x); }\n";
    let twice_id = rt.create("twice", Code::Source(twice)).unwrap();
    assert_eq!(rt.call(twice_id, &mut [Arg::I64(21)], RetType::I64).unwrap(), Value::I64(42));
    match rt.delete("add") {
        Err(RuntimeError::InUse { plugin, users }) => assert_eq!((plugin.as_str(), users.as_str()), ("add", "twice")),
        other => panic!("deleted a plugin another calls: {other:?}"),
    }
    // A plugin that crashes on some inputs, and one that calls it.
    let fragile = "long fragile(long x) { if (x < 0) return *(volatile long *)0; return x + 1; }\n";
    rt.create("fragile", Code::Source(fragile)).unwrap();
    let caller =
        rt.create("caller", Code::Source("long fragile(long);\nlong caller(long x) { return fragile(x) * 2; }"));
    let caller = caller.unwrap();
    assert_eq!(rt.call(caller, &mut [Arg::I64(1)], RetType::I64).unwrap(), Value::I64(4));
    let fragile = rt.lookup("fragile").unwrap();
    let Err(RuntimeError::PluginFault { unlinked, .. }) = rt.call(fragile, &mut [Arg::I64(-1)], RetType::I64) else {
        panic!("fragile did not fail");
    };
    assert_eq!(unlinked, ["caller", "fragile"]);
    assert_eq!(rt.plugins(), ["add", "grayscale", "twice"]);
    assert_eq!(rt.call(twice_id, &mut [Arg::I64(4)], RetType::I64).unwrap(), Value::I64(8));
}

const COUNTER: &str = "#include <ward_runtime.h>\nlong count(void) { long *n = ward_heap(); return ++*n; }\n";
const CRASH: &str = "long crash(void) { return *(volatile long *)0; }\n";

fn counts_across_a_fault(policy: &str) -> (Vec<i64>, i64) {
    let sup = supervisor(policy);
    let rt = Runtime::open(&sup, "heap", &options(Isolation::Process)).unwrap();
    let count = rt.create("count", Code::Source(COUNTER)).unwrap();
    let crash = rt.create("crash", Code::Source(CRASH)).unwrap();
    let before: Vec<i64> = (0..3).map(|_| rt.call(count, &mut [], RetType::I64).unwrap().as_i64().unwrap()).collect();
    assert!(matches!(rt.call(crash, &mut [], RetType::I64), Err(RuntimeError::PluginFault { .. })));
    (before, rt.call(count, &mut [], RetType::I64).unwrap().as_i64().unwrap())
}

#[test]
fn the_heap_outlives_calls_and_comes_back_from_its_snapshot() {
    // checkpoint_ms = 1: a snapshot after any call that comes a millisecond or more after the last snapshot.
    let sup = supervisor("[extension.heap]\ncheckpoint_ms = 1\n");
    let rt = Runtime::open(&sup, "heap", &options(Isolation::Process)).unwrap();
    let count = rt.create("count", Code::Source(COUNTER)).unwrap();
    let crash = rt.create("crash", Code::Source(CRASH)).unwrap();
    let logged = rt.extension().stats().shadow_log;
    // Count until a call is followed by a snapshot (the shadow log grows by the snapshot's entry).
    let mut counted = 0;
    while rt.extension().stats().shadow_log == logged {
        counted = rt.call(count, &mut [], RetType::I64).unwrap().as_i64().unwrap();
        assert!(counted < 100_000_000, "no snapshot was taken");
    }
    assert!(matches!(rt.call(crash, &mut [], RetType::I64), Err(RuntimeError::PluginFault { .. })));
    assert_eq!(rt.call(count, &mut [], RetType::I64).unwrap(), Value::I64(counted + 1));
}

#[test]
fn the_heap_comes_back_zeroed_without_snapshots() {
    let (before, after) = counts_across_a_fault("[extension.heap]\ncheckpoint_ms = 0\n");
    assert_eq!(before, [1, 2, 3]);
    assert_eq!(after, 1);
}

#[test]
fn an_explicit_snapshot_is_what_a_recovery_restores() {
    let sup = supervisor("[extension.heap]\ncheckpoint_ms = 0\n");
    let rt = Runtime::open(&sup, "heap", &options(Isolation::Process)).unwrap();
    let count = rt.create("count", Code::Source(COUNTER)).unwrap();
    let crash = rt.create("crash", Code::Source(CRASH)).unwrap();
    for _ in 0..5 {
        rt.call(count, &mut [], RetType::I64).unwrap();
    }
    rt.snapshot().unwrap();
    rt.call(count, &mut [], RetType::I64).unwrap();
    assert!(matches!(rt.call(crash, &mut [], RetType::I64), Err(RuntimeError::PluginFault { .. })));
    assert_eq!(rt.call(count, &mut [], RetType::I64).unwrap(), Value::I64(6));
}

/// Compiles `source` with the system C compiler into `out` with `flags`.
fn cc(source: &str, flags: &[&str], out: &Path) {
    let dir = out.parent().unwrap();
    let c = dir.join("plugin.c");
    std::fs::write(&c, source).unwrap();
    let status = Command::new("cc").args(flags).arg("-o").arg(out).arg(&c).status().unwrap();
    assert!(status.success(), "cc {flags:?} failed");
}

#[test]
fn links_relocatable_and_shared_objects_into_a_running_runtime() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    let dir = tempdir();
    let object = dir.join("mul.o");
    cc("long add(long, long);\nlong mul(long a, long b) { long r = 0; for (long i = 0; i < b; i++) r = add(r, a); return r; }\n",
        &["-c", "-O2", "-fPIC", "-fno-stack-protector"], &object);
    let mul = rt.create("mul", Code::Object(&std::fs::read(&object).unwrap())).unwrap();
    assert_eq!(rt.call(mul, &mut [Arg::I64(6), Arg::I64(7)], RetType::I64).unwrap(), Value::I64(42));
    let shared = dir.join("libsub.so");
    cc("long sub(long a, long b) { return a - b; }\n", &["-shared", "-fPIC", "-O2"], &shared);
    let sub = rt.create("sub", Code::Shared(&shared)).unwrap();
    assert_eq!(rt.call(sub, &mut [Arg::I64(50), Arg::I64(8)], RetType::I64).unwrap(), Value::I64(42));
    rt.delete("sub").unwrap();
    rt.delete("mul").unwrap();
    assert_eq!(add(&rt, 1, 2), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn refuses_bad_names_and_too_many_arguments() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    for bad in ["", "1x", "a-b", "a/b", &"x".repeat(64)] {
        assert!(matches!(rt.create(bad, Code::Source(ADD)), Err(RuntimeError::BadArguments { .. })), "{bad:?}");
    }
    let id = rt.lookup("add").unwrap();
    let mut args: Vec<Arg<'_>> = (0..6).map(Arg::I64).collect();
    assert!(matches!(rt.call(id, &mut args, RetType::I64), Err(RuntimeError::BadArguments { .. })));
    assert!(matches!(
        Runtime::open(&sup, "no such", &RuntimeOptions::default()),
        Err(RuntimeError::BadArguments { .. })
    ));
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ward-runtime-test-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn unique() -> u64 {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

#[test]
fn unlinked_plugins_keep_their_code_and_link_again_without_a_restart() {
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    let pid = rt.extension().pid();
    let id = rt.lookup("add").unwrap();
    rt.unlink("add").unwrap();
    assert_eq!(rt.lookup("add"), None);
    assert_eq!(rt.plugins(), ["grayscale"]);
    assert!(matches!(rt.call(id, &mut [Arg::I64(1), Arg::I64(2)], RetType::I64), Err(RuntimeError::Unlinked { .. })));
    // Out of the namespace: a new plugin cannot resolve it, and its name stays taken.
    let uses_add = "long add(long, long);\nlong uses_add(long x) { return add(x, 1); }\n";
    assert!(matches!(rt.create("uses_add", Code::Source(uses_add)), Err(RuntimeError::Compile { .. })));
    assert!(matches!(rt.create("add", Code::Source(ADD)), Err(RuntimeError::Exists { .. })));
    rt.link("add").unwrap();
    assert_eq!(rt.lookup("add"), Some(id));
    assert_eq!(add(&rt, 40, 2), 42);
    rt.create("uses_add", Code::Source(uses_add)).unwrap();
    // Unlinked across a recovery, it stays unlinked.
    rt.unlink("grayscale").unwrap();
    let crash = rt.create("crash", Code::Source(CRASH)).unwrap();
    assert!(matches!(rt.call(crash, &mut [], RetType::I64), Err(RuntimeError::PluginFault { .. })));
    assert_ne!(rt.extension().pid(), pid);
    assert_eq!(rt.lookup("grayscale"), None);
    rt.link("grayscale").unwrap();
    assert_eq!(gray(&rt), GRAY_PIXELS);
    assert_eq!(rt.call(rt.lookup("uses_add").unwrap(), &mut [Arg::I64(41)], RetType::I64).unwrap(), Value::I64(42));
}

#[test]
fn runtimes_sharing_a_process_keep_their_own_plugins_and_heaps() {
    let sup = supervisor("[defaults]\ncheckpoint_ms = 0\n");
    let one = Runtime::open(&sup, "one", &options(Isolation::None)).unwrap();
    let two = Runtime::open(&sup, "two", &options(Isolation::None)).unwrap();
    let count_one = one.create("count", Code::Source(COUNTER)).unwrap();
    let count_two = two.create("count", Code::Source(COUNTER)).unwrap();
    two.create("add", Code::Source(ADD)).unwrap();
    assert_eq!(one.lookup("add"), None);
    for expected in 1..=3 {
        assert_eq!(one.call(count_one, &mut [], RetType::I64).unwrap(), Value::I64(expected));
    }
    assert_eq!(two.call(count_two, &mut [], RetType::I64).unwrap(), Value::I64(1));
    drop(one);
    assert_eq!(two.call(count_two, &mut [], RetType::I64).unwrap(), Value::I64(2));
    assert_eq!(add(&two, 1, 1), 2);
}

#[test]
fn a_hostile_plugin_in_a_process_runtime_meets_the_sandbox_and_the_others_answer() {
    // The system call filter is what stops a plugin that calls the kernel itself; ward always installs it (it needs
    // no privilege), so this test has nothing to skip.
    let sup = supervisor("");
    let rt = runtime_with_basics(&sup, Isolation::Process);
    // The compiler reads no file: an #include names only what the runtime was given.
    let Err(RuntimeError::Compile { first, .. }) =
        rt.create("snoop", Code::Source("#include \"/etc/passwd\"\nlong snoop(void) { return 0; }\n"))
    else {
        panic!("a source including /etc/passwd compiled");
    };
    assert!(first.message.contains("not found"), "{first}");
    // socket(AF_INET, SOCK_STREAM, 0) made directly, past the C library the runtime offers.
    let socket =
        "long net(void) {\n    long r;\n    __asm__ volatile(\"syscall\" : \"=a\"(r) : \"a\"(41L), \"D\"(2L), \
                  \"S\"(1L), \"d\"(0L) : \"rcx\", \"r11\", \"memory\");\n    return r;\n}\n";
    let net = rt.create("net", Code::Source(socket)).unwrap();
    let Err(RuntimeError::PluginFault { plugin, fault, .. }) = rt.call(net, &mut [], RetType::I64) else {
        panic!("a plugin opened a socket in a sandboxed runtime");
    };
    assert_eq!(plugin, "net");
    assert!(fault.to_string().contains("sandbox"), "{fault}");
    assert_eq!(add(&rt, 2, 2), 4);
    assert_eq!(gray(&rt), GRAY_PIXELS);
}
