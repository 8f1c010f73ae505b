//! Compiles the class adapters (`adapters/*.c`) into `OUT_DIR/<stem>.so` for `src/adapters.rs` to embed, and the
//! runtime adapter (`runtime/ward_runtime_adapter.c`) with the compiler it carries, libtcc.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's `libtcc-dev` puts the library (a static archive only).
const LIBTCC: &str = "/usr/lib/x86_64-linux-gnu/libtcc.a";

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let include = manifest_dir.join("../../include");
    let adapters = manifest_dir.join("adapters");
    ward_embed::build::compile_dir(&adapters, &[&include], &["-ldl"]);
    runtime_adapter(&manifest_dir.join("runtime"), &adapters, &include);
}

/// The runtime adapter links libtcc in. Debian builds the archive as position-dependent code that reaches the C
/// library's `stdout`, `stderr` and `environ` directly, which no shared object may, and it would reach the file
/// system and the dynamic linker: its references to those are renamed (`runtime/tcc_redefine.txt`) to the
/// adapter's own functions, which serve files from memory and resolve names against the runtime's namespace.
fn runtime_adapter(dir: &Path, adapters: &Path, include: &Path) {
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let source = dir.join("ward_runtime_adapter.c");
    let renames = dir.join("tcc_redefine.txt");
    for path in [&source, &renames] {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed={LIBTCC}");
    if !Path::new(LIBTCC).is_file() || !Path::new("/usr/include/libtcc.h").is_file() {
        panic!(
            "{LIBTCC} is missing: ward's runtimes compile plugins with libtcc. Install it with `apt-get install \
             libtcc-dev` (scripts/deps does), then build again."
        );
    }
    let archive = out_dir.join("libtcc_ward.a");
    run(Command::new("objcopy").arg(format!("--redefine-syms={}", renames.display())).arg(LIBTCC).arg(&archive));
    // Twice: the adapter, and the variant an mpk domain runs, which links no shared objects (it would need the
    // dynamic linker, which an mpk domain never runs).
    link_runtime_adapter(&source, &archive, adapters, include, &out_dir.join("ward_runtime_adapter.so"), &[]);
    link_runtime_adapter(
        &source,
        &archive,
        adapters,
        include,
        &out_dir.join("ward_runtime_adapter_mpk.so"),
        &["-DWARD_RT_NO_SHARED"],
    );
}

fn link_runtime_adapter(source: &Path, archive: &Path, adapters: &Path, include: &Path, out: &Path, defines: &[&str]) {
    let compiler = cc::Build::new().get_compiler();
    let mut cmd = compiler.to_command();
    cmd.args(["-std=c11", "-shared", "-fPIC", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"])
        .arg(format!("-I{}", adapters.display()))
        .arg(format!("-I{}", include.display()))
        .args(defines)
        .arg("-o")
        .arg(out)
        .arg(source)
        .arg(archive)
        // libtcc's own names stay inside the adapter: only the adapter's exports are visible.
        .args(["-Wl,--exclude-libs,ALL", "-Wl,-z,noexecstack", "-ldl", "-lm"]);
    run(&mut cmd);
}

fn run(cmd: &mut Command) {
    let result = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !result.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}{}",
            result.status,
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        );
    }
}
