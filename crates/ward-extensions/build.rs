//! Compiles every `extensions/*.c` of the workspace into `OUT_DIR/<stem>.so` so that `src/lib.rs` can embed the
//! shared objects with `include_bytes!`.

use std::path::PathBuf;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let include = manifest_dir.join("../../include");
    // libm only where an extension calls it (well's errno checks).
    ward_embed::build::compile_dir(&manifest_dir.join("../../extensions"), &[&include], &["-Wl,--as-needed", "-lm"]);
}
