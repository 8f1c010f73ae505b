//! The `ward-imaged` server with the WebAssembly backend (the peer), over HTTP on loopback: the same transforms,
//! the same answers; the faulty one traps, gets a 502, and the others go on.

mod common;

use common::*;

const GOOD: [&str; 3] = ["grayscale", "downsample", "crop"];

#[test]
fn wasm_transforms_answer_as_documented_and_the_faulty_one_gets_a_502() {
    let server = ServerProcess::start(&["--backend", "wasm", "--quantum-ms", "3000"]);
    for name in GOOD.iter().chain(&["faulty"]) {
        assert_eq!(server.install(name, &runtime_source(name)), (201, format!("installed {name}\n")));
    }
    let check = |server: &ServerProcess| {
        let (status, ppm) = server.get("/images/182x182");
        assert_eq!(status, 200);
        let original = parse_ppm(&ppm);
        for transform in GOOD {
            let (status, body) = server.get(&format!("/images/182x182?transform={transform}"));
            assert_eq!(status, 200, "{transform}: {}", String::from_utf8_lossy(&body));
            assert!(parse_ppm(&body) == expected(transform, &original), "{transform}: pixels differ");
        }
    };
    check(&server);
    let (status, body) = server.get_text("/images/55x55?transform=faulty");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("faulty"), "{body}");
    check(&server);
}
