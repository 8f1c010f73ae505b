//! The `ward-imaged` server binary with the native backend, over HTTP on loopback: the transforms of
//! `extensions/runtime/` (all but `faulty`, which would kill a native server) uploaded and applied to every image
//! and compared with what their documentation says, compile errors, name conflicts, removal, a transform with bad
//! output, PPM files from the command line, and the load generator.

mod common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

/// The transforms the native server can run (`faulty` crashes by design).
const TRANSFORMS: [&str; 3] = ["grayscale", "downsample", "crop"];

#[test]
fn uploaded_transforms_transform_every_image_as_documented() {
    let server = ServerProcess::start(&[]);
    for name in TRANSFORMS {
        assert_eq!(server.install(name, &runtime_source(name)), (201, format!("installed {name}\n")));
    }
    assert_eq!(server.get_text("/plugins"), (200, "crop\ndownsample\ngrayscale\n".into()));

    let (status, listing) = server.get_text("/images");
    assert_eq!(status, 200);
    let names: Vec<&str> = listing.lines().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(names, ["1050x1050", "182x182", "300x300", "55x55"]);
    for name in names {
        let (status, ppm) = server.get(&format!("/images/{name}"));
        assert_eq!(status, 200, "{name}");
        let original = parse_ppm(&ppm);
        assert_eq!(format!("{}x{}", original.width, original.height), name);
        for transform in TRANSFORMS {
            let (status, body) = server.get(&format!("/images/{name}?transform={transform}"));
            assert_eq!(status, 200, "{transform} of {name}: {}", String::from_utf8_lossy(&body));
            let output = parse_ppm(&body);
            let want = expected(transform, &original);
            assert_eq!((output.width, output.height), (want.width, want.height), "{transform} of {name}: size");
            assert!(output.pixels == want.pixels, "{transform} of {name}: pixels differ from the documented ones");
            assert_ne!(output.pixels, original.pixels, "{transform} of {name} changed nothing");
        }
    }
}

#[test]
fn a_source_that_does_not_compile_is_refused_with_line_and_column() {
    let server = ServerProcess::start(&[]);
    let source = "#include \"ward_image.h\"\n\
                  int64_t broken(const uint8_t *in, int64_t w, int64_t h, uint8_t *out, int64_t cap)\n\
                  {\n    return w + ;\n}\n";
    let (status, message) = server.install("broken", source);
    assert_eq!(status, 400, "{message}");
    // The compiler's own message: the file the client uploaded, line 4, a column, an error.
    let at = message.find("broken.c:4:").unwrap_or_else(|| panic!("no line in {message:?}"));
    let column: String = message[at + "broken.c:4:".len()..].chars().take_while(char::is_ascii_digit).collect();
    assert!(!column.is_empty(), "no column in {message:?}");
    assert!(message.contains("error"), "{message}");
    // Nothing was installed, and the server goes on.
    assert_eq!(server.get_text("/plugins"), (200, String::new()));
    assert_eq!(server.install("crop", &runtime_source("crop")).0, 201);
}

#[test]
fn a_source_without_the_function_or_of_the_wrong_type_is_refused() {
    let server = ServerProcess::start(&[]);
    // Defines `grayscale`, not `other`.
    let (status, message) = server.install("other", &runtime_source("grayscale"));
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("does not define `int64_t other(...)`"), "{message}");
    // Defines the name with another type: the declaration of the ABI makes it a compile error at its line.
    let (status, message) = server.install("wrong", "int wrong(int x)\n{\n    return x;\n}\n");
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("wrong.c:1:") && message.contains("conflicting types"), "{message}");
    // A name libc defines and the source does not is not libc's function installed under it.
    let (status, message) = server.install("puts", "int unrelated(void)\n{\n    return 0;\n}\n");
    assert_eq!(status, 400, "{message}");
    assert!(message.contains("does not define"), "{message}");
    assert_eq!(server.get_text("/plugins"), (200, String::new()));
}

#[test]
fn names_taken_unknown_and_removed_get_their_status() {
    let server = ServerProcess::start(&[]);
    let source = runtime_source("crop");
    assert_eq!(server.install("crop", &source).0, 201);
    let (status, message) = server.install("crop", &source);
    assert_eq!(status, 409, "{message}");
    assert!(message.contains("crop"), "{message}");

    assert_eq!(server.get("/images/55x55?transform=grayscale").0, 404);
    assert_eq!(server.get("/images/nope").0, 404);
    assert_eq!(server.get("/images/nope?transform=crop").0, 404);
    assert_eq!(server.get("/elsewhere").0, 404);
    assert_eq!(server.get("/images/55x55?transfrom=crop").0, 400);
    assert_eq!(server.install("not-a-name", &source).0, 400);
    assert_eq!(server.request("POST", "/plugins/crop", b"").0, 405);

    let (status, message) = server.request("DELETE", "/plugins/grayscale", b"");
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&message));
    assert_eq!(server.get("/images/55x55?transform=crop").0, 200);
    assert_eq!(server.request("DELETE", "/plugins/crop", b""), (204, Vec::new()));
    assert_eq!(server.get_text("/plugins"), (200, String::new()));
    assert_eq!(server.get("/images/55x55?transform=crop").0, 404);
    assert_eq!(server.request("DELETE", "/plugins/crop", b"").0, 404);

    // The name is free again, and the new code is what runs.
    assert_eq!(server.install("crop", &runtime_source("grayscale").replace("grayscale", "crop")).0, 201);
    let original = parse_ppm(&server.get("/images/55x55").1);
    let (status, body) = server.get("/images/55x55?transform=crop");
    assert_eq!(status, 200);
    assert_eq!(parse_ppm(&body), grayscale(&original));
}

#[test]
fn a_transform_with_bad_output_answers_502_and_the_others_go_on() {
    let server = ServerProcess::start(&[]);
    // Claims more bytes than its header's size makes.
    let overlong = "#include \"ward_image.h\"\n\
        int64_t overlong(const uint8_t *in, int64_t w, int64_t h, uint8_t *out, int64_t cap)\n\
        {\n    ward_image_header(out, 1, 1);\n    return WARD_IMAGE_HEADER + 6;\n}\n";
    // Refuses every image.
    let refuses = "#include \"ward_image.h\"\n\
        int64_t refuses(const uint8_t *in, int64_t w, int64_t h, uint8_t *out, int64_t cap)\n\
        {\n    return -7;\n}\n";
    // Says it wrote more than it was offered.
    let beyond = "#include \"ward_image.h\"\n\
        int64_t beyond(const uint8_t *in, int64_t w, int64_t h, uint8_t *out, int64_t cap)\n\
        {\n    return cap + 1;\n}\n";
    for (name, source) in [("overlong", overlong), ("refuses", refuses), ("beyond", beyond)] {
        assert_eq!(server.install(name, source).0, 201, "{name}");
    }
    assert_eq!(server.install("grayscale", &runtime_source("grayscale")).0, 201);
    for (name, fault) in [("overlong", "returned 22"), ("refuses", "returned -7"), ("beyond", "returned 9092")] {
        let (status, message) = server.get_text(&format!("/images/55x55?transform={name}"));
        assert_eq!(status, 502, "{name}: {message}");
        assert!(message.contains(&format!("transform {name} faulted")), "{message}");
        assert!(message.contains(fault), "{name}: {message}");
        assert!(message.len() < 200, "not a short message: {message}");
    }
    let original = parse_ppm(&server.get("/images/182x182").1);
    let (status, body) = server.get("/images/182x182?transform=grayscale");
    assert_eq!(status, 200);
    assert_eq!(parse_ppm(&body), grayscale(&original));
}

#[test]
fn ppm_files_on_the_command_line_are_served_and_transformed() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (width, height) = (5usize, 3usize);
    let pixels: Vec<u8> = (0..width * height * 3).map(|i| (i * 17 % 256) as u8).collect();
    let mut ppm = format!("P6\n# made by the test\n{width} {height}\n255\n").into_bytes();
    ppm.extend_from_slice(&pixels);
    let path: PathBuf = dir.path().join("tiny.ppm");
    std::fs::write(&path, &ppm).expect("writing the PPM");

    let server = ServerProcess::start(&["--image", path.to_str().expect("UTF-8 path")]);
    let (status, body) = server.get("/images/tiny");
    assert_eq!(status, 200);
    let served = parse_ppm(&body);
    assert_eq!(served, Rgb { width, height, pixels });
    assert_eq!(server.install("downsample", &runtime_source("downsample")).0, 201);
    let (status, body) = server.get("/images/tiny?transform=downsample");
    assert_eq!(status, 200);
    assert_eq!(parse_ppm(&body), downsample(&served));
}

#[test]
fn a_listen_address_off_loopback_is_refused() {
    let output = Command::new(BINARY).args(["serve", "--listen", "0.0.0.0:0"]).output().expect("running ward-imaged");
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a loopback address"));
}

#[test]
fn the_load_generator_completes_requests_and_reports_them() {
    let server = ServerProcess::start(&[]);
    assert_eq!(server.install("grayscale", &runtime_source("grayscale")).0, 201);
    let load = |extra: &[&str]| {
        let output = Command::new(BINARY)
            .args(["load", "--url", &server.url(), "--transform", "grayscale", "--image", "55x55"])
            .args(["--connections", "2", "--duration", "1"])
            .args(extra)
            .output()
            .expect("running ward-imaged load");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "load failed: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        stdout
    };

    let json: serde_json::Value = serde_json::from_str(&load(&["--json"])).expect("JSON report");
    assert!(json["requests"].as_u64().expect("requests") > 0, "{json}");
    assert_eq!(json["failures"].as_u64(), Some(0), "{json}");
    assert_eq!(json["connections"].as_u64(), Some(2));
    assert!(json["requests_per_s"].as_f64().expect("requests_per_s") > 0.0);
    for field in ["median", "p90", "p99", "max"] {
        assert!(json["latency_ms"][field].as_f64().expect(field) > 0.0, "{field}: {json}");
    }
    let median = json["latency_ms"]["median"].as_f64().unwrap_or_default();
    assert!(median <= json["latency_ms"]["max"].as_f64().unwrap_or_default());

    let text = load(&[]);
    for field in ["requests:", "requests/s:", "median", "p90", "p99", "max"] {
        assert!(text.contains(field), "no {field} in {text}");
    }

    // A load whose every request fails says so and fails.
    let output = Command::new(BINARY)
        .args(["load", "--url", &server.url(), "--transform", "absent", "--image", "55x55"])
        .args(["--connections", "1", "--duration", "0.2"])
        .output()
        .expect("running ward-imaged load");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains("404 Not Found: no transform absent"));
}
