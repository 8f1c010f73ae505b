//! Transforms compiled to WebAssembly and run by wasmtime (`ward-wasm`): the peer ward's runtimes are compared with.
//! The uploaded source is compiled by clang (a process of its own) to a wasm32 module, instantiated once, and
//! called with the image copied into and out of its linear memory; a trap or a call past the quantum is a fault of
//! that transform, and its instance is made afresh.

use std::sync::Mutex;
use std::time::Duration;

use ward_wasm::{CallError, CompileError, ImageHeader, LoadError, WasmCompiler, WasmConfig, WasmRuntime};

use crate::image::{Image, OutputError};
use crate::native::WARD_IMAGE_H;
use crate::transforms::{check_upload, ApplyError, Fault, InstallError, RemoveError, Transforms};

/// Transforms in wasmtime.
pub struct WasmTransforms {
    compiler: WasmCompiler,
    runtime: WasmRuntime,
    /// Installs of one name must not race (the runtime's link replaces a plugin of the same name).
    installing: Mutex<()>,
}

impl WasmTransforms {
    /// A runtime whose calls have `quantum`.
    pub fn new(quantum: Duration) -> Result<WasmTransforms, String> {
        let compiler = WasmCompiler::new(ImageHeader::Text(WARD_IMAGE_H.into())).map_err(|e| e.to_string())?;
        let runtime = WasmRuntime::new(WasmConfig { quantum, ..WasmConfig::default() }).map_err(|e| e.to_string())?;
        Ok(WasmTransforms { compiler, runtime, installing: Mutex::new(()) })
    }
}

impl Transforms for WasmTransforms {
    fn install(&self, name: &str, source: &str) -> Result<(), InstallError> {
        check_upload(name, source)?;
        let _installing = self.installing.lock().unwrap_or_else(|e| e.into_inner());
        if self.runtime.plugin(name).is_some() {
            return Err(InstallError::NameTaken(name.to_owned()));
        }
        let binary = self.compiler.compile(name, source).map_err(|e| match e {
            CompileError::Failed(failure) => InstallError::Compile {
                name: name.to_owned(),
                message: failure.first_error.map_or_else(|| failure.diagnostics.clone(), |d| d.to_string()),
            },
            CompileError::InvalidName(_) => {
                InstallError::InvalidName { name: name.to_owned(), reason: "not a C identifier" }
            }
            other => InstallError::Backend { name: name.to_owned(), reason: other.to_string() },
        })?;
        self.runtime.link(&binary).map_err(|e| match e {
            LoadError::NoEntry { .. } => InstallError::MissingFunction { name: name.to_owned() },
            other => InstallError::Backend { name: name.to_owned(), reason: other.to_string() },
        })?;
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<(), RemoveError> {
        self.runtime.unlink(name).map(|_| ()).ok_or_else(|| RemoveError::Unknown(name.to_owned()))
    }

    fn apply(&self, name: &str, image: &Image) -> Result<Image, ApplyError> {
        let plugin = self.runtime.plugin(name).ok_or_else(|| ApplyError::Unknown(name.to_owned()))?;
        // Sides are at most 2^16: they fit a u32.
        let (width, height) = (image.width() as u32, image.height() as u32);
        let fault = |fault: Fault| ApplyError::Fault { name: name.to_owned(), fault };
        match plugin.transform_pixels(image.pixels(), width, height) {
            Ok(out) => {
                let (w, h) = (out.width() as usize, out.height() as usize);
                Image::new(w, h, out.into_pixels())
                    .map_err(|e| ApplyError::Backend { name: name.to_owned(), reason: e.to_string() })
            }
            Err(CallError::Timeout { quantum, .. }) => {
                Err(fault(Fault::TimedOut(u64::try_from(quantum.as_millis()).unwrap_or(u64::MAX))))
            }
            Err(CallError::Trap { message, .. }) => Err(fault(Fault::Crashed(message))),
            Err(CallError::Refused { code, .. }) => Err(fault(Fault::BadOutput(OutputError::Refused(code)))),
            Err(CallError::OutputTooLong { returned, capacity, .. }) => {
                Err(fault(Fault::BadOutput(OutputError::Length {
                    returned,
                    capacity: usize::try_from(capacity).unwrap_or(usize::MAX),
                })))
            }
            Err(CallError::MalformedOutput { reason, .. }) => Err(fault(Fault::Malformed(reason))),
            Err(CallError::NotLinked(_)) => Err(ApplyError::Unknown(name.to_owned())),
            Err(other) => Err(ApplyError::Backend { name: name.to_owned(), reason: other.to_string() }),
        }
    }

    fn names(&self) -> Vec<String> {
        self.runtime.names()
    }

    fn describe(&self) -> String {
        "WebAssembly (clang to wasm32, run by wasmtime)".into()
    }
}
