//! ward's WebAssembly peer: the runtime's image transform plugins, compiled from the same C source to wasm32 by
//! clang and run in wasmtime, so that ward's runtimes can be compared with what a wasm host does.
//!
//! The pieces, each of which a benchmark can time on its own:
//!
//! | step | call |
//! | --- | --- |
//! | C source to a wasm32 binary (clang, in a child process) | [`WasmCompiler::compile`] |
//! | the binary to machine code (wasmtime's `Module::new`, Cranelift) | [`WasmRuntime::compile_module`] |
//! | a module to a running instance with its own store | [`WasmRuntime::instantiate`] |
//! | a null call, `int64_t NAME(void)` (see [`NULL_PLUGIN_SOURCE`]) | [`WasmPlugin::call_null`] |
//! | a transform call, copies in and out included | [`WasmPlugin::transform`] |
//!
//! [`WasmRuntime::link`] does the middle two and keeps the plugin under its name until
//! [`WasmRuntime::unlink`]; plugins are linked and unlinked while others are being called.
//!
//! Every call runs under a time quantum (epoch interruption, see `ticker`): a call past it fails with
//! [`CallError::Timeout`]. A call that traps (an access outside the instance's memory, `unreachable`, a division by
//! zero) fails with [`CallError::Trap`]. After either, the plugin's instance is thrown away with its store and a
//! fresh one made, so the plugin's next call starts from its initial state and the runtime's other plugins never
//! notice.
//!
//! What a plugin can reach is its own linear memory and nothing else: the module imports nothing this host
//! offers (no WASI), so a plugin that calls into the system fails at instantiation. Compiling is not sandboxed:
//! clang runs as the calling process (see docs/SECURITY.md).

#![forbid(unsafe_code)]

mod compiler;
mod image;
mod runtime;
mod ticker;

pub use compiler::{
    first_error, CompileError, CompileFailure, Diagnostic, ImageHeader, WasmBinary, WasmCompiler, TOOLCHAIN_PACKAGES,
};
pub use image::{Image, ImageError, IMAGE_HEADER_BYTES, MAX_IMAGE_SIDE};
pub use runtime::{CallError, LoadError, PluginKind, WasmConfig, WasmModule, WasmPlugin, WasmRuntime};
pub use wasmtime::Trap;

/// A null plugin for timing the cost of a call by itself: compile it with the name `nop`.
pub const NULL_PLUGIN_SOURCE: &str = "#include <stdint.h>\nint64_t nop(void) { return 0; }\n";
