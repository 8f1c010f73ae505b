//! `ward inject` end to end: files in, files out, exit statuses and messages. No domain process is involved.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

fn ward() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ward"))
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("cannot run the ward binary")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A fresh directory holding a copy of well.so, so no test can harm the shared extraction.
fn scratch_with_well(tag: &str) -> (PathBuf, PathBuf) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ward-cli-inject-{}-{tag}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    let well = ward_extensions::path_of("well").expect("extract the built-in extensions");
    let input = dir.join("well.so");
    std::fs::copy(&well, &input).expect("copy well.so");
    (dir, input)
}

fn assert_bad_input(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "exit status {:?}; stderr: {err}", out.status);
    for needle in needles {
        assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    }
    assert!(stdout(out).is_empty(), "nothing on stdout for a bad input: {}", stdout(out));
}

fn inject(input: &Path, output: &Path, args: &[&str]) -> Output {
    run(ward().arg("inject").args(args).arg(input).arg("-o").arg(output))
}

#[test]
fn json_lines_carry_every_field_and_the_input_stays_as_it_was() {
    let (dir, input) = scratch_with_well("json");
    let original = std::fs::read(&input).expect("read input");
    let output = dir.join("out.so");
    let out = inject(&input, &output, &["--type", "branch", "--seed", "7", "--json"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), 5, "{lines:#?}");
    for line in &lines {
        assert_eq!(line["fault_type"], "branch", "{line}");
        assert_eq!(line["seed"], 7, "{line}");
        assert!(line["function"].as_str().is_some_and(|f| !f.is_empty()), "{line}");
        assert!(line["offset"].as_u64().is_some(), "{line}");
        assert!(line["function_offset"].as_u64().is_some(), "{line}");
        assert!(line["before"].as_str().is_some_and(|b| b.starts_with('j')), "{line}");
        assert!(line["after"].as_str().is_some_and(|a| a.starts_with("nop")), "{line}");
        assert!(line["before_bytes"].is_string() && line["after_bytes"].is_string(), "{line}");
    }
    assert_eq!(std::fs::read(&input).expect("read input"), original, "the input changed");
    let mutated = std::fs::read(&output).expect("read output");
    assert_eq!(mutated.len(), original.len());
    assert_ne!(mutated, original);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn text_output_has_one_line_per_fault_and_repeats_itself() {
    let (dir, input) = scratch_with_well("text");
    let (a, b) = (dir.join("a.so"), dir.join("b.so"));
    let out_a = inject(&input, &a, &["--type", "off-by-one", "--seed", "3", "--count", "2"]);
    let out_b = inject(&input, &b, &["--type", "off-by-one", "--seed", "3", "--count", "2"]);
    assert!(out_a.status.success(), "stderr: {}", stderr(&out_a));
    let text = stdout(&out_a);
    let faults: Vec<&str> = text.lines().filter(|l| l.contains(" -> ")).collect();
    assert_eq!(faults.len(), 2, "{text}");
    assert!(faults.iter().all(|l| l.contains("off-by-one") && l.contains('+')), "{text}");
    assert_eq!(stdout(&out_b).replace("b.so", "a.so"), text, "same seed, different report");
    assert_eq!(std::fs::read(&a).expect("read a"), std::fs::read(&b).expect("read b"), "same seed, different bytes");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_input_is_named() {
    let out = run(ward().args(["inject", "--type", "nop", "/nonexistent/plugin.so", "-o", "/tmp/never-written.so"]));
    assert_bad_input(&out, &["/nonexistent/plugin.so", "cannot read"]);
    assert!(!Path::new("/tmp/never-written.so").exists());
}

#[test]
fn a_file_that_is_not_elf_is_refused() {
    let (dir, _) = scratch_with_well("notelf");
    let text = if Path::new("/etc/hostname").is_file() {
        PathBuf::from("/etc/hostname")
    } else {
        let p = dir.join("hostname");
        std::fs::write(&p, "somehost\n").expect("write a text file");
        p
    };
    let out = inject(&text, &dir.join("out.so"), &["--type", "nop"]);
    assert_bad_input(&out, &[&text.display().to_string(), "not an ELF"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_32_bit_elf_is_refused() {
    let (dir, _) = scratch_with_well("elf32");
    let mut header = vec![0u8; 52];
    header[..4].copy_from_slice(b"\x7fELF");
    header[4] = 1; // ELFCLASS32
    header[5] = 1; // little-endian
    header[16] = 3; // ET_DYN
    header[18] = 3; // EM_386
    let path = dir.join("i386.so");
    std::fs::write(&path, &header).expect("write a 32-bit header");
    let out = inject(&path, &dir.join("out.so"), &["--type", "nop"]);
    assert_bad_input(&out, &["i386.so", "32-bit"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_fault_type_lists_the_valid_ones() {
    let (dir, input) = scratch_with_well("bogus");
    let out = inject(&input, &dir.join("out.so"), &["--type", "bogus"]);
    let names = [
        "bogus",
        "source",
        "destination",
        "pointer",
        "interface",
        "branch",
        "loop",
        "text",
        "nop",
        "init",
        "off-by-one",
    ];
    assert_bad_input(&out, &names);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_function_is_named() {
    let (dir, input) = scratch_with_well("nofn");
    let out = inject(&input, &dir.join("out.so"), &["--type", "nop", "--function", "no_such_fn"]);
    assert_bad_input(&out, &["no_such_fn", "--list-functions"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_type_with_no_site_says_so() {
    let (dir, input) = scratch_with_well("nosite");
    let out = inject(&input, &dir.join("out.so"), &["--type", "init"]);
    assert_bad_input(&out, &["no eligible site", "init"]);
    assert!(!dir.join("out.so").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_object_without_code_is_refused() {
    let (dir, _) = scratch_with_well("nocode");
    let c = dir.join("data.c");
    let so = dir.join("data.so");
    std::fs::write(&c, "int data = 5;\n").expect("write C");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&cc).args(["-shared", "-fPIC", "-nostdlib", "-o"]).arg(&so).arg(&c).status();
    assert!(status.is_ok_and(|s| s.success()), "{cc} failed");
    let out = inject(&so, &dir.join("out.so"), &["--type", "nop"]);
    assert_bad_input(&out, &["data.so", "no executable code"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_output_may_not_be_the_input() {
    let (dir, input) = scratch_with_well("same");
    let original = std::fs::read(&input).expect("read input");
    let out = inject(&input, &input, &["--type", "nop"]);
    assert_bad_input(&out, &["refusing to overwrite", "well.so"]);
    // Another spelling of the same path, and a hard link to it.
    let respelled = dir.join(".").join("well.so");
    assert_bad_input(&inject(&input, &respelled, &["--type", "nop"]), &["refusing"]);
    let link = dir.join("link.so");
    std::fs::hard_link(&input, &link).expect("hard link");
    assert_bad_input(&inject(&input, &link, &["--type", "nop"]), &["refusing"]);
    assert_eq!(std::fs::read(&input).expect("read input"), original, "the input changed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn list_functions_shows_the_extension_code() {
    let (dir, input) = scratch_with_well("list");
    let out = run(ward().args(["inject", "--list-functions"]).arg(&input));
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.lines().any(|l| l.starts_with("well_sum ")), "{text}");
    let out = run(ward().args(["inject", "--list-functions", "--json"]).arg(&input));
    let lines: Vec<Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    assert!(lines.iter().any(|f| f["name"] == "well_map_sum" && f["size"].as_u64().is_some_and(|s| s > 0)));
    let _ = std::fs::remove_dir_all(&dir);
}
