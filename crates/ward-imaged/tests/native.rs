//! `NativeTransforms` through the `Transforms` trait, without the server: calls from several threads while the
//! transform is removed, and what install refuses.

use std::path::Path;
use std::sync::{Arc, Barrier};

use ward_imaged::image::pattern;
use ward_imaged::{ApplyError, InstallError, NativeTransforms, Transforms};

fn runtime_source(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../extensions/runtime").join(format!("{name}.c"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn calls_in_flight_survive_removal_and_later_calls_find_nothing() {
    let transforms = Arc::new(NativeTransforms::new());
    transforms.install("crop", &runtime_source("crop")).expect("installing crop");
    let image = Arc::new(pattern(182, 182));
    let want = transforms.apply("crop", &image).expect("crop");
    assert_eq!((want.width(), want.height()), (91, 91));

    const THREADS: usize = 4;
    let start = Arc::new(Barrier::new(THREADS + 1));
    let callers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (transforms, image, start, want) =
                (Arc::clone(&transforms), Arc::clone(&image), Arc::clone(&start), want.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut removed = false;
                for _ in 0..300 {
                    match transforms.apply("crop", &image) {
                        // Once removed, never found again.
                        Ok(output) => assert!(!removed && output == want, "a call after removal, or wrong output"),
                        Err(ApplyError::Unknown(name)) => {
                            assert_eq!(name, "crop");
                            removed = true;
                        }
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
            })
        })
        .collect();
    start.wait();
    transforms.remove("crop").expect("removing crop");
    for caller in callers {
        caller.join().expect("a caller panicked");
    }
    assert!(matches!(transforms.apply("crop", &image), Err(ApplyError::Unknown(_))));
    assert!(transforms.names().is_empty());
}

#[test]
fn install_refuses_bad_names_nul_bytes_and_taken_names() {
    let transforms = NativeTransforms::new();
    let source = runtime_source("grayscale");
    assert!(matches!(transforms.install("../grayscale", &source), Err(InstallError::InvalidName { .. })));
    assert!(matches!(transforms.install("grayscale", "int x;\0"), Err(InstallError::InvalidSource { .. })));
    transforms.install("grayscale", &source).expect("installing grayscale");
    assert!(matches!(transforms.install("grayscale", &source), Err(InstallError::NameTaken(_))));
    assert_eq!(transforms.names(), ["grayscale"]);
}

#[test]
fn a_missing_compiler_is_the_backend_failing_not_the_source() {
    let config =
        ward_imaged::native::NativeConfig { compiler: "ward-imaged-no-such-compiler".into(), ..Default::default() };
    let transforms = NativeTransforms::with_config(config);
    match transforms.install("grayscale", &runtime_source("grayscale")) {
        Err(InstallError::Backend { reason, .. }) => assert!(reason.contains("cannot run the C compiler"), "{reason}"),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[test]
fn a_source_full_of_errors_gets_a_short_answer_that_starts_at_its_first_error() {
    let transforms = NativeTransforms::new();
    let source: String = (0..2000).map(|i| format!("int64_t x{i} = undeclared_{i} +;\n")).collect();
    match transforms.install("noisy", &source) {
        Err(InstallError::Compile { message, .. }) => {
            assert!(message.starts_with("noisy.c:1:"), "{}", &message[..message.len().min(300)]);
            assert!(message.len() <= 16 * 1024, "{} bytes of messages", message.len());
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}
