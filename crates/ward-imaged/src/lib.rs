//! ward-imaged: the application of ward's runtimes (issue 32), after the kernel-plugins paper's image server. An
//! HTTP server holds RGB images in memory; clients upload image transforms as C source (`PUT /plugins/NAME`),
//! which are compiled and linked at run time, and fetch images transformed by them
//! (`GET /images/IMAGE?transform=NAME`). A transform that faults answers its request with a clean 5xx and the
//! server and the other transforms go on, as far as the backend that runs the transforms can hold it.
//!
//! - [`image`]: images in the transform ABI's layout (`extensions/runtime/ward_image.h`), PPM, the default images;
//! - [`transforms`]: the [`Transforms`] trait the server runs transforms through, and its errors;
//! - [`native`]: the native baseline, compiled by the system C compiler and loaded into the server (no isolation);
//! - [`ward`]: transforms in a ward runtime: compiled in the runtime's domain, a faulting one unlinked;
//! - [`wasm`]: transforms compiled to WebAssembly and run by wasmtime, the peer;
//! - [`server`]: the HTTP server (hyper, tokio);
//! - [`load`]: the load generator the benchmark uses.

#![deny(unsafe_code)]

pub mod image;
pub mod load;
pub mod native;
pub mod server;
pub mod transforms;
pub mod ward;
pub mod wasm;

pub use image::Image;
pub use native::NativeTransforms;
pub use server::{Images, Server};
pub use transforms::{ApplyError, Fault, InstallError, RemoveError, Transforms};
pub use ward::WardTransforms;
pub use wasm::WasmTransforms;
