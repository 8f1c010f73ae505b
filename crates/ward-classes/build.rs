//! Compiles the class adapters (`adapters/*.c`) into `OUT_DIR/<stem>.so` for `src/adapters.rs` to embed.

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let include = manifest_dir.join("../../include");
    ward_embed::build::compile_dir(&manifest_dir.join("adapters"), &[&include], &["-ldl"]);
}
