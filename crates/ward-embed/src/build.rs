//! The build-script half: compile every `*.c` of a directory into `OUT_DIR/<stem>.so`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Flags every embedded shared object is compiled with (after the compiler's own).
const FLAGS: &[&str] =
    &["-std=c11", "-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"];

/// Compile every `dir/*.c` (headers in `dir` and `includes`) into `OUT_DIR/<stem>.so`, each linked with `libs`
/// (e.g. `"-ldl"`). Panics with the compiler's output when a source does not compile: a build script has no
/// better way to report.
pub fn compile_dir(dir: &Path, includes: &[&Path], libs: &[&str]) {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    // Rerun when a source is added or removed, too.
    println!("cargo:rerun-if-changed={}", dir.display());

    let mut sources = Vec::new();
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display())).path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("c") => sources.push(path),
            Some("h") => println!("cargo:rerun-if-changed={}", path.display()),
            _ => {}
        }
    }
    sources.sort();
    for include in includes {
        println!("cargo:rerun-if-changed={}", include.display());
    }

    let compiler = cc::Build::new().get_compiler();
    for source in &sources {
        println!("cargo:rerun-if-changed={}", source.display());
        compile(&compiler, &dir, includes, libs, source, &out_dir);
    }
}

fn compile(compiler: &cc::Tool, dir: &Path, includes: &[&Path], libs: &[&str], source: &Path, out_dir: &Path) {
    let stem = source
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_else(|| panic!("{}: file name is not UTF-8", source.display()));
    let output = out_dir.join(format!("{stem}.so"));

    let mut cmd = compiler.to_command();
    cmd.args(FLAGS).arg(format!("-I{}", dir.display()));
    for include in includes {
        cmd.arg(format!("-I{}", include.display()));
    }
    cmd.arg("-o").arg(&output).arg(source).args(libs);
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
