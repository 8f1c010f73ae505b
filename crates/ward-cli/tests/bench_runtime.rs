//! `ward bench runtime --quick --json`: every group of the benchmark runs and reports what it says it reports, with
//! the baseline of its group in the same run. No figure is asserted: speed is the benchmark's to measure.

use std::process::Command;

#[test]
fn the_runtime_benchmark_reports_every_group_in_one_run() {
    let output = Command::new(env!("CARGO_BIN_EXE_ward"))
        .args(["bench", "runtime", "--quick", "--json", "--seconds", "0.3"])
        .output()
        .expect("running ward bench runtime");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "ward bench runtime failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    let group = |g: &str| lines.iter().filter(|l| l["group"] == g).collect::<Vec<_>>();
    let variants =
        |g: &str| group(g).iter().map(|l| l["variant"].as_str().unwrap_or("").to_string()).collect::<Vec<_>>();

    // Code generation: the paper's 66-line function and the transforms, in ward and for the peer.
    let codegen = variants("codegen");
    for want in ["checksum66 (66-line fn), none", "checksum66 (66-line fn), process", "grayscale, wasm: clang"] {
        assert!(codegen.iter().any(|v| v == want), "no codegen line {want:?} in {codegen:?}");
    }
    assert!(group("codegen").iter().all(|l| l["median_ns"].as_f64().is_some_and(|ns| ns > 0.0)));
    // Link and unlink, per isolation kind.
    for want in ["link, none", "unlink, none", "link, process", "unlink, process"] {
        assert!(variants("link").iter().any(|v| v == want), "no link line {want:?}");
    }
    // A null call beside its floor, with the ratio and the target for a cross-domain kind.
    let process_call = group("null call")
        .into_iter()
        .find(|l| l["variant"] == "runtime call, process")
        .expect("a process runtime's null call");
    assert!(process_call["ratio"].as_f64().is_some_and(|r| r > 0.0));
    assert!(process_call["target"].as_str().is_some_and(|t| t.contains("floor")));
    assert!(variants("null call").iter().any(|v| v == "wasmtime call"));
    // The image server: every image for every backend, with native's ratio beside the others.
    let server = group("server");
    let pool = std::thread::available_parallelism().map_or(1, |n| n.get());
    for backend in
        ["native (cc -O2)".to_string(), "ward none".into(), format!("ward process x{pool}"), "wasmtime".into()]
    {
        let images: Vec<&str> =
            server.iter().filter(|l| l["backend"] == backend).filter_map(|l| l["image"].as_str()).collect();
        assert_eq!(images.len(), 4, "{backend}: {images:?}");
        for l in server.iter().filter(|l| l["backend"] == backend) {
            assert!(l["requests_per_s"].as_f64().is_some_and(|r| r > 0.0), "{l}");
            assert_eq!(l["throughput_ratio"].is_null(), backend == "native (cc -O2)", "{l}");
        }
    }
}
