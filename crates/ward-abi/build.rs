//! Compiles the poisoned-call trampoline (shared with the class adapters, in the workspace's `include/`).

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let include = manifest_dir.join("../../include");
    let source = manifest_dir.join("c/poisoned_call.c");
    println!("cargo:rerun-if-changed={}", source.display());
    println!("cargo:rerun-if-changed={}", include.join("ward_poisoned_call.h").display());
    cc::Build::new().file(&source).include(&include).warnings(true).compile("ward_poisoned_call");
}
