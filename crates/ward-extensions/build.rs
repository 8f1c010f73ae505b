//! Compiles every `extensions/*.c` into `OUT_DIR/<stem>.so` so that `src/lib.rs`
//! can embed the shared objects with `include_bytes!`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Flags every built-in extension is compiled with (after the compiler's own).
const FLAGS: &[&str] =
    &["-std=c11", "-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"];

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let ext_dir = manifest_dir.join("../../extensions");
    let ext_dir = ext_dir.canonicalize().unwrap_or(ext_dir);

    // Rerun when a source is added or removed, too.
    println!("cargo:rerun-if-changed={}", ext_dir.display());

    let mut sources = Vec::new();
    let mut headers = Vec::new();
    let entries = fs::read_dir(&ext_dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", ext_dir.display()));
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("cannot read {}: {e}", ext_dir.display())).path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("c") => sources.push(path),
            Some("h") => headers.push(path),
            _ => {}
        }
    }
    sources.sort();
    headers.sort();
    for header in &headers {
        println!("cargo:rerun-if-changed={}", header.display());
    }

    let compiler = cc::Build::new().get_compiler();
    for source in &sources {
        println!("cargo:rerun-if-changed={}", source.display());
        compile(&compiler, &ext_dir, source, &out_dir);
    }
}

fn compile(compiler: &cc::Tool, include: &Path, source: &Path, out_dir: &Path) {
    let stem = source
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_else(|| panic!("{}: file name is not UTF-8", source.display()));
    let output = out_dir.join(format!("{stem}.so"));

    let mut cmd = compiler.to_command();
    cmd.args(FLAGS).arg(format!("-I{}", include.display())).arg("-o").arg(&output).arg(source);
    let result = cmd.output().unwrap_or_else(|e| panic!("cannot run the C compiler ({cmd:?}): {e}"));
    if !result.status.success() {
        panic!(
            "compiling {} failed ({}):\n{cmd:?}\n{}{}",
            source.display(),
            result.status,
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr),
        );
    }
}
