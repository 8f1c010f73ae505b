//! The four runtime plugins of `extensions/runtime/`, compiled to wasm32 and run in wasmtime: right pixels, and a
//! faulty one that traps without disturbing the others.

mod common;

use std::sync::Arc;

use ward_wasm::{CallError, Image, PluginKind, Trap, WasmConfig, WasmRuntime};

fn runtime_with(names: &[&str]) -> WasmRuntime {
    let compiler = common::compiler();
    let runtime = WasmRuntime::new(WasmConfig::default()).expect("runtime");
    for name in names {
        let binary = compiler.compile(name, &common::plugin_source(name)).expect("the plugin compiles");
        let plugin = runtime.link(&binary).expect("the plugin links");
        assert_eq!(plugin.kind(), PluginKind::Transform);
    }
    runtime
}

fn check_transform(name: &str, expected: fn(&Image) -> Image) {
    let runtime = runtime_with(&[name]);
    for (width, height) in common::SIZES {
        let input = common::generated(width, height);
        let output = runtime.transform(name, &input).unwrap_or_else(|e| panic!("{name} on {width}x{height}: {e}"));
        let want = expected(&input);
        assert_eq!((output.width(), output.height()), (want.width(), want.height()), "{name} on {width}x{height}");
        assert!(output.pixels() == want.pixels(), "{name} on {width}x{height}: pixels differ");
    }
}

#[test]
fn grayscale_gives_the_luma_of_each_pixel() {
    check_transform("grayscale", common::grayscale);
}

#[test]
fn downsample_gives_the_mean_of_each_square() {
    check_transform("downsample", common::downsample);
}

#[test]
fn crop_gives_the_centre() {
    check_transform("crop", common::crop);
}

#[test]
fn a_large_image_after_a_small_one_and_back_uses_the_same_instance() {
    // The region is reused from its start: a small image after a large one must not see the large one's bytes.
    let runtime = runtime_with(&["crop"]);
    for (width, height) in [(3, 3), (640, 480), (5, 3)] {
        let input = common::generated(width, height);
        assert_eq!(runtime.transform("crop", &input).expect("crop"), common::crop(&input));
    }
}

#[test]
fn faulty_traps_and_the_runtime_goes_on() {
    let runtime = runtime_with(&["faulty", "grayscale"]);
    let input = common::generated(9, 7);
    for attempt in 0..2 {
        // The bug fires on every image: each call traps, each on a fresh instance.
        match runtime.transform("faulty", &input) {
            Err(CallError::Trap { code, message, .. }) => {
                assert_eq!(code, Trap::MemoryOutOfBounds, "attempt {attempt}: {message}");
                assert!(message.contains("out of bounds"), "attempt {attempt}: wasmtime's message: {message}");
            }
            other => panic!("attempt {attempt}: faulty should trap, got {other:?}"),
        }
        let output = runtime.transform("grayscale", &input).expect("grayscale after faulty's trap");
        assert_eq!(output, common::grayscale(&input));
    }
    assert_eq!(runtime.names(), ["faulty", "grayscale"]);
}

#[test]
fn a_negative_return_is_a_refusal() {
    // The host always offers the capacity the ABI promises is enough, so a plugin that asks for one byte more
    // stands in for a transform that finds its arguments senseless.
    let compiler = common::compiler();
    let runtime = WasmRuntime::new(WasmConfig::default()).expect("runtime");
    let source = "#include \"ward_image.h\"\n\
                  int64_t refuse(const uint8_t *in, int64_t w, int64_t h, uint8_t *out, int64_t cap)\n\
                  { return ward_image_args_ok(in, w, h, out, cap, cap + 1) ? 0 : -7; }\n";
    runtime.link(&compiler.compile("refuse", source).expect("compiles")).expect("links");
    match runtime.transform("refuse", &common::generated(2, 2)) {
        Err(CallError::Refused { code, .. }) => assert_eq!(code, -7),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn unlinked_plugins_are_gone_and_others_stay() {
    let runtime = runtime_with(&["grayscale", "crop"]);
    let input = common::generated(4, 4);
    let unlinked = runtime.unlink("grayscale").expect("grayscale was linked");
    assert!(matches!(runtime.transform("grayscale", &input), Err(CallError::NotLinked(_))));
    assert_eq!(runtime.transform("crop", &input).expect("crop"), common::crop(&input));
    // A caller still holding the unlinked plugin may finish with it.
    assert_eq!(unlinked.transform(&input).expect("held plugin"), common::grayscale(&input));
}

#[test]
fn one_plugin_is_called_from_many_threads() {
    let runtime = Arc::new(runtime_with(&["downsample"]));
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let runtime = Arc::clone(&runtime);
            std::thread::spawn(move || {
                for i in 0..20u32 {
                    let input = common::generated(5 + t, 3 + i % 4);
                    let output = runtime.transform("downsample", &input).expect("downsample");
                    assert_eq!(output, common::downsample(&input));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("caller thread");
    }
}
