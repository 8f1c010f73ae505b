//! The `ward-imaged` server with the ward backend (a runtime in a process domain), over HTTP on loopback: the
//! transforms of `extensions/runtime/` uploaded as C source and compiled in the runtime's domain, the faulty one
//! among them. Requests through the faulty transform, and through one that loops past the quantum, get a clean 502,
//! and the server and the other transforms go on answering correctly.

mod common;

use common::*;

const GOOD: [&str; 3] = ["grayscale", "downsample", "crop"];

fn ward_server() -> ServerProcess {
    ServerProcess::start(&["--backend", "ward", "--isolation", "process", "--quantum-ms", "3000"])
}

/// Every good transform of every image, as documented.
fn check_good_transforms(server: &ServerProcess) {
    for image in ["55x55", "182x182"] {
        let (status, ppm) = server.get(&format!("/images/{image}"));
        assert_eq!(status, 200);
        let original = parse_ppm(&ppm);
        for transform in GOOD {
            let (status, body) = server.get(&format!("/images/{image}?transform={transform}"));
            assert_eq!(status, 200, "{transform} of {image}: {}", String::from_utf8_lossy(&body));
            let output = parse_ppm(&body);
            let want = expected(transform, &original);
            assert_eq!((output.width, output.height), (want.width, want.height), "{transform} of {image}");
            assert!(output.pixels == want.pixels, "{transform} of {image}: pixels differ from the documented ones");
        }
    }
}

#[test]
fn the_faulty_transform_gets_a_clean_502_and_the_others_go_on() {
    let server = ward_server();
    for name in GOOD.iter().chain(&["faulty"]) {
        assert_eq!(server.install(name, &runtime_source(name)), (201, format!("installed {name}\n")));
    }
    check_good_transforms(&server);
    let (status, body) = server.get_text("/images/55x55?transform=faulty");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("faulty"), "the answer does not name the transform: {body}");
    // The faulty transform was unlinked; the others answer as before.
    let (status, _) = server.get_text("/images/55x55?transform=faulty");
    assert_eq!(status, 404);
    assert_eq!(server.get_text("/plugins"), (200, "crop\ndownsample\ngrayscale\n".into()));
    check_good_transforms(&server);
    // Uploaded again, it fails again, and is unlinked again: the server never goes down.
    assert_eq!(server.install("faulty", &runtime_source("faulty")).0, 201);
    assert_eq!(server.get_text("/images/182x182?transform=faulty").0, 502);
    check_good_transforms(&server);
}

#[test]
fn a_transform_past_the_quantum_gets_a_502_and_the_others_go_on() {
    let server = ward_server();
    for name in GOOD {
        assert_eq!(server.install(name, &runtime_source(name)).0, 201);
    }
    let spin = "#include \"ward_image.h\"\n\
                int64_t spin(const uint8_t *in, int64_t w, int64_t h, uint8_t *out, int64_t cap)\n\
                {\n    volatile int64_t n = 0;\n    for (;;) n++;\n    return 0;\n}\n";
    assert_eq!(server.install("spin", spin).0, 201);
    let (status, body) = server.get_text("/images/55x55?transform=spin");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("spin") && body.contains("quantum"), "{body}");
    check_good_transforms(&server);
}

#[test]
fn compile_errors_and_compiler_crashes_are_refused_and_the_server_goes_on() {
    let server = ward_server();
    assert_eq!(server.install("grayscale", &runtime_source("grayscale")).0, 201);
    let broken = "#include \"ward_image.h\"\n\
                  int64_t broken(const uint8_t *in, int64_t w, int64_t h, uint8_t *out, int64_t cap)\n\
                  {\n    return w + undeclared_thing;\n}\n";
    let (status, message) = server.install("broken", broken);
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("broken.c:4:16: error:"), "{message}");
    // Deep enough to overflow the compiler's stack, in the runtime's domain.
    let depth = 300_000;
    let deep = format!("long deep(void) {{ return {}1{}; }}\n", "(".repeat(depth), ")".repeat(depth));
    let (status, message) = server.install("deep", &deep);
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("compiler failed"), "{message}");
    let (status, ppm) = server.get("/images/55x55?transform=grayscale");
    assert_eq!(status, 200);
    let (_, original) = server.get("/images/55x55");
    assert!(parse_ppm(&ppm) == grayscale(&parse_ppm(&original)));
}
