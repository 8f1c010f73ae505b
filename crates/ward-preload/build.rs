//! Compiles the proxies (`proxies/*.c`) into `OUT_DIR/<stem>.so` for `src/proxy.rs` to embed.

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let include = manifest_dir.join("../../include");
    ward_embed::build::compile_dir(&manifest_dir.join("proxies"), &[&include], &[]);
}
