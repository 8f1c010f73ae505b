//! What the host does with plugins that misbehave: a call past its quantum, traps of each kind, a length past the
//! capacity, a malformed header; and what the compiler says about source that does not compile.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use ward_wasm::{
    CallError, CompileError, ImageHeader, LoadError, PluginKind, Trap, WasmCompiler, WasmConfig, WasmRuntime,
};

/// The transform ABI's signature, for test plugins written here.
const SIGNATURE: &str = "(const uint8_t *in, int64_t width, int64_t height, uint8_t *out, int64_t cap)";

fn transform_source(name: &str, body: &str) -> String {
    format!("#include \"ward_image.h\"\nint64_t {name}{SIGNATURE}\n{{\n{body}\n}}\n")
}

fn runtime(config: WasmConfig, plugins: &[(&str, String)]) -> WasmRuntime {
    let compiler = common::compiler();
    let runtime = WasmRuntime::new(config).expect("runtime");
    for (name, source) in plugins {
        let binary = compiler.compile(name, source).unwrap_or_else(|e| panic!("{name} compiles: {e}"));
        runtime.link(&binary).unwrap_or_else(|e| panic!("{name} links: {e}"));
    }
    runtime
}

fn grayscale() -> (&'static str, String) {
    ("grayscale", common::plugin_source("grayscale"))
}

#[test]
fn a_plugin_that_loops_forever_times_out_and_the_runtime_goes_on() {
    let config = WasmConfig { quantum: Duration::from_millis(200), ..WasmConfig::default() };
    // The volatile counter keeps the loop from being folded away; it never ends.
    let spin = transform_source("spin", "volatile int64_t i = 0;\nfor (;;) i++;\nreturn 0;");
    let runtime = std::sync::Arc::new(runtime(config, &[("spin", spin), grayscale()]));
    let input = common::generated(6, 4);

    for attempt in 0..2 {
        // On a thread, so that a quantum that never fires fails the test instead of hanging it. The bound is
        // generous (a loaded machine may run the call late); it is a limit on waiting, not a timing assertion.
        let (sender, receiver) = mpsc::channel();
        let caller = std::sync::Arc::clone(&runtime);
        let image = input.clone();
        std::thread::spawn(move || {
            let _ = sender.send(caller.transform("spin", &image));
        });
        match receiver.recv_timeout(Duration::from_secs(120)) {
            Ok(Err(CallError::Timeout { quantum, .. })) => assert_eq!(quantum, Duration::from_millis(200)),
            Ok(other) => panic!("attempt {attempt}: spin should time out, got {other:?}"),
            Err(_) => panic!("attempt {attempt}: spin was not interrupted within 120 s of a 200 ms quantum"),
        }
        assert_eq!(
            runtime.transform("grayscale", &input).expect("grayscale after a timeout"),
            common::grayscale(&input)
        );
    }
}

#[test]
fn a_plugin_that_returns_past_its_capacity_is_refused() {
    let liar = transform_source("liar", "ward_image_header(out, width, height);\nreturn cap + 1;");
    let runtime = runtime(WasmConfig::default(), &[("liar", liar)]);
    let input = common::generated(3, 2);
    match runtime.transform("liar", &input) {
        Err(CallError::OutputTooLong { returned, capacity, .. }) => {
            assert_eq!(capacity, input.output_capacity() as u64);
            assert_eq!(returned, capacity as i64 + 1);
        }
        other => panic!("expected OutputTooLong, got {other:?}"),
    }
}

#[test]
fn a_header_that_does_not_match_the_length_is_refused() {
    // Claims a 1000x1000 image in a 3x2 one's bytes.
    let inflated = transform_source("inflated", "ward_image_header(out, 1000, 1000);\nreturn 16 + width * height * 3;");
    let runtime = runtime(WasmConfig::default(), &[("inflated", inflated)]);
    assert!(
        matches!(runtime.transform("inflated", &common::generated(3, 2)), Err(CallError::MalformedOutput { .. })),
        "a header past the length returned must be refused"
    );
}

fn expect_trap(body: &str, want: Trap) {
    let runtime = runtime(WasmConfig::default(), &[("trapper", transform_source("trapper", body)), grayscale()]);
    let input = common::generated(4, 3);
    match runtime.transform("trapper", &input) {
        Err(CallError::Trap { code, message, .. }) => assert_eq!(code, want, "wasmtime's message: {message}"),
        other => panic!("expected a {want:?} trap, got {other:?}"),
    }
    assert_eq!(runtime.transform("grayscale", &input).expect("grayscale after a trap"), common::grayscale(&input));
}

#[test]
fn unreachable_traps() {
    expect_trap("__builtin_trap();", Trap::UnreachableCodeReached);
}

#[test]
fn division_by_zero_traps() {
    // Through volatile, so clang cannot see the zero and fold the division away as undefined.
    expect_trap("volatile int64_t zero = 0;\nreturn width / zero;", Trap::IntegerDivisionByZero);
}

#[test]
fn an_instance_is_fresh_after_a_trap() {
    // The plugin counts its calls in a global and traps on its second: after the trap, the count starts again.
    let body = "static int64_t calls;\nif (++calls == 2) __builtin_trap();\n\
                uint8_t *px = ward_image_header(out, 1, 1);\npx[0] = px[1] = px[2] = (uint8_t)calls;\n\
                return WARD_IMAGE_HEADER + 3;";
    let runtime = runtime(WasmConfig::default(), &[("counter", transform_source("counter", body))]);
    let input = common::generated(2, 2);
    let count = |runtime: &WasmRuntime| runtime.transform("counter", &input).expect("counter").pixels().to_vec();
    assert_eq!(count(&runtime), [1, 1, 1], "first call");
    assert!(matches!(runtime.transform("counter", &input), Err(CallError::Trap { .. })), "second call traps");
    assert_eq!(count(&runtime), [1, 1, 1], "first call of the new instance");
    assert!(matches!(runtime.transform("counter", &input), Err(CallError::Trap { .. })), "its second traps");
}
#[test]
fn a_compile_error_gives_its_line_and_column() {
    let compiler = common::compiler();
    let source = "#include \"ward_image.h\"\n\nint64_t broken(void)\n{\n    return undeclared_thing;\n}\n";
    match compiler.compile("broken", source) {
        Err(CompileError::Failed(failure)) => {
            let first = failure.first_error.expect("a positioned error");
            assert_eq!((first.line, first.column), (5, 12), "{}", failure.diagnostics);
            assert_eq!(first.file, "broken.c");
            assert!(first.message.contains("undeclared_thing"), "{}", first.message);
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn a_plugin_without_its_function_is_a_link_error() {
    let compiler = common::compiler();
    match compiler.compile("absent", "#include <stdint.h>\nint64_t present(void) { return 0; }\n") {
        Err(CompileError::Failed(failure)) => {
            assert!(failure.first_error.is_none(), "the linker's error has no position");
            assert!(failure.diagnostics.contains("absent"), "{}", failure.diagnostics);
        }
        other => panic!("expected a link error, got {other:?}"),
    }
}

#[test]
fn the_header_may_be_given_as_text() {
    let text = std::fs::read_to_string(common::runtime_dir().join("ward_image.h")).expect("the header");
    let compiler = WasmCompiler::new(ImageHeader::Text(text)).expect("compiler");
    compiler.compile("crop", &common::plugin_source("crop")).expect("crop compiles against the header's text");
}

#[test]
fn a_plugin_that_needs_the_system_does_not_instantiate() {
    // puts needs WASI's fd_write, which this host does not offer.
    let source = "#include <stdio.h>\n#include <stdint.h>\nint64_t talker(void) { puts(\"hello\"); return 0; }\n";
    let compiler = common::compiler();
    let runtime = WasmRuntime::new(WasmConfig::default()).expect("runtime");
    let binary = compiler.compile("talker", source).expect("talker compiles");
    assert!(matches!(runtime.link(&binary), Err(LoadError::Instantiate { .. })));
}

#[test]
fn the_null_plugin_is_called_and_refuses_a_transform() {
    let compiler = common::compiler();
    let runtime = WasmRuntime::new(WasmConfig::default()).expect("runtime");
    let binary = compiler.compile("nop", ward_wasm::NULL_PLUGIN_SOURCE).expect("nop compiles");
    let module = runtime.compile_module(&binary).expect("Module::new");
    assert_eq!(module.kind(), PluginKind::Null);
    let plugin = runtime.instantiate(&module).expect("instantiate");
    assert_eq!(plugin.call_null().expect("null call"), 0);
    assert!(matches!(plugin.transform(&common::generated(1, 1)), Err(CallError::WrongKind { .. })));
}

#[test]
fn constructors_run_once_per_instance() {
    // The reactor's `_initialize` runs the constructor when the instance is made, and again for the instance made
    // after a trap; the calls themselves do not run it.
    let body = "static int64_t calls;\nif (++calls == 3) __builtin_trap();\n\
                uint8_t *px = ward_image_header(out, 1, 1);\npx[0] = (uint8_t)constructed;\n\
                px[1] = (uint8_t)calls;\npx[2] = 0;\nreturn WARD_IMAGE_HEADER + 3;";
    let source = format!(
        "static int constructed;\n__attribute__((constructor)) static void construct(void) {{ constructed++; }}\n{}",
        transform_source("ctor", body)
    );
    let runtime = runtime(WasmConfig::default(), &[("ctor", source)]);
    let input = common::generated(2, 2);
    let call = |runtime: &WasmRuntime| runtime.transform("ctor", &input).expect("ctor").pixels().to_vec();
    assert_eq!(call(&runtime), [1, 1, 0]);
    assert_eq!(call(&runtime), [1, 2, 0]);
    assert!(matches!(runtime.transform("ctor", &input), Err(CallError::Trap { .. })));
    assert_eq!(call(&runtime), [1, 1, 0], "the new instance ran its constructor once");
}

#[test]
fn an_image_past_the_memory_limit_is_refused_and_smaller_ones_go_on() {
    let config = WasmConfig { max_memory_bytes: 1 << 20, ..WasmConfig::default() };
    let runtime = runtime(config, &[grayscale()]);
    // 500x500 is 750,000 bytes in and as many out: past 1 MiB.
    match runtime.transform("grayscale", &common::generated(500, 500)) {
        Err(CallError::MemoryExhausted { needed, limit, .. }) => {
            assert_eq!(limit, 1 << 20);
            assert!(needed > limit, "needed {needed}");
        }
        other => panic!("expected MemoryExhausted, got {other:?}"),
    }
    let small = common::generated(100, 100);
    assert_eq!(runtime.transform("grayscale", &small).expect("a smaller image"), common::grayscale(&small));
}

#[test]
fn a_constructor_that_never_returns_fails_instantiation() {
    let config = WasmConfig { quantum: Duration::from_millis(200), ..WasmConfig::default() };
    let source = format!(
        "__attribute__((constructor)) static void never_returns(void) {{ volatile int i = 0; for (;;) i++; }}\n{}",
        transform_source("stuck", "return -1;")
    );
    let binary = common::compiler().compile("stuck", &source).expect("stuck compiles");
    let runtime = WasmRuntime::new(config).expect("runtime");
    // On a thread, for the same reason as the loop above.
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(runtime.link(&binary).map(|_| ()));
    });
    match receiver.recv_timeout(Duration::from_secs(120)) {
        Ok(Err(LoadError::Instantiate { message, .. })) => assert!(message.contains("interrupt"), "{message}"),
        Ok(other) => panic!("the constructor should be interrupted, got {other:?}"),
        Err(_) => panic!("the constructor was not interrupted within 120 s of a 200 ms quantum"),
    }
}
