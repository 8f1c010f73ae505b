//! Compiles the library-fault preload library (`libfault/*.c`) into `OUT_DIR/<stem>.so` for `src/libfault.rs` to
//! embed.

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    ward_embed::build::compile_dir(&manifest_dir.join("libfault"), &[], &["-ldl"]);
}
