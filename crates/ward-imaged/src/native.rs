//! The native baseline: each uploaded transform is compiled by the system C compiler into a shared object that is
//! `dlopen`ed into the server process and called directly.
//!
//! **No isolation at all.** A transform runs with the server's memory, privileges and system calls: a crash kills
//! the server, a hang holds one of its threads for good, a wild write corrupts it, and a hostile transform owns it
//! (its constructors run at install). This is the baseline that ward's runtimes and WebAssembly are measured
//! against, never a way to run code one does not trust; the server says so when it starts with it.
//!
//! What it does check, as any backend must: the name is a C identifier; the source compiles with the ABI's
//! declaration of the function in force (a definition of another type is a compile error, reported with line and
//! column); the function the name resolves to is defined by the uploaded object itself, not found in a library it
//! links (a source that defines nothing called `abs` must not install libc's); the compiler runs for a bounded time;
//! and a transform's return value and output header are checked before a byte of its output is used.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsString};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use parking_lot::RwLock;
use tempfile::TempDir;

use crate::image::Image;
use crate::transforms::{check_upload, ApplyError, Fault, InstallError, RemoveError, Transforms};

/// The transform ABI's header, written into the include directory the compiler is given.
pub const WARD_IMAGE_H: &str = include_str!("../../../extensions/runtime/ward_image.h");

/// How much of the compiler's messages goes back to the client.
const MAX_MESSAGE_BYTES: usize = 16 * 1024;

/// The function type of every transform (`ward_image.h`).
type TransformFn = unsafe extern "C" fn(*const u8, i64, i64, *mut u8, i64) -> i64;

/// How the native backend compiles.
#[derive(Debug, Clone)]
pub struct NativeConfig {
    /// The C compiler (a driver that takes gcc's options: gcc or clang).
    pub compiler: OsString,
    /// How long one compilation may run before it is stopped and the install refused.
    pub compile_deadline: Duration,
}

impl Default for NativeConfig {
    fn default() -> Self {
        Self { compiler: "cc".into(), compile_deadline: Duration::from_secs(60) }
    }
}

/// Transforms compiled by the system C compiler and loaded into this process; see the module doc for what that
/// does not protect.
pub struct NativeTransforms {
    config: NativeConfig,
    installed: RwLock<HashMap<String, Arc<Loaded>>>,
}

impl Default for NativeTransforms {
    fn default() -> Self {
        Self::new()
    }
}

/// A loaded transform. The library stays open while any call holds this.
struct Loaded {
    function: TransformFn,
    _library: Library,
}

impl NativeTransforms {
    /// A backend with the default compiler (`cc`) and deadline.
    pub fn new() -> Self {
        Self::with_config(NativeConfig::default())
    }

    pub fn with_config(config: NativeConfig) -> Self {
        Self { config, installed: RwLock::new(HashMap::new()) }
    }

    /// Compiles `source` as `NAME.c` into `NAME.so`, in a temporary directory of its own with `ward_image.h`
    /// beside the source; returns the directory (the object is removed with it) and the object's path. Nothing of
    /// a compilation outlives its install, so a server that is killed leaves nothing behind.
    fn compile(&self, name: &str, source: &str) -> Result<(TempDir, PathBuf), InstallError> {
        let backend = |reason: String| InstallError::Backend { name: name.to_owned(), reason };
        let build = tempfile::Builder::new()
            .prefix(&format!("ward-imaged-{name}-"))
            .tempdir()
            .map_err(|e| backend(format!("cannot make a build directory: {e}")))?;
        let source_file = format!("{name}.c");
        let object = build.path().join(format!("{name}.so"));
        // Forced in before the source: the function's declaration with the ABI's type, so that a definition of
        // another type is the compiler's "conflicting types" error at the definition's line.
        let declaration = format!(
            "/* The transform ABI (ward_image.h): what the server calls {name} with. */\n#include <stdint.h>\n\
             int64_t {name}(const uint8_t *in, int64_t width, int64_t height, uint8_t *out, int64_t out_capacity);\n"
        );
        let write = |file: &str, text: &str| {
            std::fs::write(build.path().join(file), text).map_err(|e| backend(format!("cannot write {file}: {e}")))
        };
        write(&source_file, source)?;
        write("transform_abi.h", &declaration)?;
        write("ward_image.h", WARD_IMAGE_H)?;
        let log_path = build.path().join("compiler.log");
        let log = File::create(&log_path).map_err(|e| backend(format!("cannot make the compiler's log: {e}")))?;
        let log_err = log.try_clone().map_err(|e| backend(format!("cannot make the compiler's log: {e}")))?;

        let mut command = Command::new(&self.config.compiler);
        command
            .current_dir(build.path())
            // Messages in English with ASCII quotes, whatever the server's locale: they go to a client.
            .env("LC_ALL", "C")
            .args(["-O2", "-shared", "-fPIC", "-fdiagnostics-color=never", "-fmax-errors=20"])
            // Mistakes C compilers merely warn about that make the call's result meaningless.
            .args(["-Werror=implicit-function-declaration", "-Werror=incompatible-pointer-types"])
            .args(["-Werror=int-conversion", "-Werror=return-type"])
            .args(["-I", ".", "-include", "transform_abi.h", "-o"])
            .arg(&object)
            .arg(&source_file)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // A group of its own, so that a compilation past its deadline is stopped with every process the
            // driver started (cc1, as, ld).
            .process_group(0);
        let mut child = command
            .spawn()
            .map_err(|e| backend(format!("cannot run the C compiler {:?}: {e}", self.config.compiler)))?;
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() > self.config.compile_deadline => {
                    // SAFETY: kill(2) has no memory effects; the group is the one this call just made for the
                    // compiler it started (its pid is the group's id), and the child is not yet reaped, so the id
                    // names no other group.
                    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
                    let _ = child.wait();
                    return Err(InstallError::InvalidSource {
                        name: name.to_owned(),
                        reason: format!(
                            "the compiler ran longer than {} s and was stopped",
                            self.config.compile_deadline.as_secs()
                        ),
                    });
                }
                // Polling a child that writes to a file: no pipe to drain, and compilations take tens of ms.
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => return Err(backend(format!("cannot wait for the C compiler: {e}"))),
            }
        };
        if !status.success() {
            let mut message = std::fs::read(&log_path).unwrap_or_default();
            // The first errors are the ones that matter; the answer stays small whatever the source provokes.
            message.truncate(MAX_MESSAGE_BYTES);
            let message = String::from_utf8_lossy(&message);
            // Paths in the messages are relative to the build directory (the source, the headers beside it),
            // except the object's: the server's temporary directory is no business of the client's.
            let message = message.replace(&format!("{}/", build.path().display()), "").trim_end().to_owned();
            let message = if message.is_empty() { format!("the compiler failed ({status})") } else { message };
            return Err(InstallError::Compile { name: name.to_owned(), message });
        }
        Ok((build, object))
    }

    /// Loads the compiled object and finds the transform's function in it.
    fn load(&self, name: &str, object: &Path) -> Result<Loaded, InstallError> {
        let backend = |reason: String| InstallError::Backend { name: name.to_owned(), reason };
        // SAFETY: loading runs the object's constructors in this process. This backend's contract (module doc)
        // is that uploaded code is trusted as the server's own; the object was just compiled from the upload.
        let library = unsafe { Library::open(Some(object), RTLD_NOW | RTLD_LOCAL) }
            .map_err(|e| backend(format!("cannot load the compiled object: {e}")))?;
        // SAFETY: the symbol's type is the ABI's: the source was compiled with that declaration in force, so a
        // definition of another type did not compile. The pointer is kept only next to the library it is in.
        let function: TransformFn = match unsafe { library.get::<TransformFn>(name.as_bytes()) } {
            Ok(symbol) => *symbol,
            Err(_) => return Err(InstallError::MissingFunction { name: name.to_owned() }),
        };
        if !defined_in(function as *const libc::c_void, object) {
            return Err(InstallError::MissingFunction { name: name.to_owned() });
        }
        Ok(Loaded { function, _library: library })
    }
}

/// Whether `address` lies in the object loaded from `object` (and not in a library it links).
fn defined_in(address: *const libc::c_void, object: &Path) -> bool {
    let Ok(path) = CString::new(object.as_os_str().as_bytes()) else { return false };
    // SAFETY: an all-zero Dl_info is valid (null pointers and zeros); dladdr only reads `address` as a number and
    // fills `info`.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable Dl_info for the call.
    if unsafe { libc::dladdr(address, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dladdr succeeded and set dli_fname to a NUL-terminated path owned by the loader, valid while the
    // object stays loaded, which it does for this call (the caller holds the library).
    let loaded_from = unsafe { CStr::from_ptr(info.dli_fname) };
    loaded_from == path.as_c_str()
}

impl Transforms for NativeTransforms {
    fn install(&self, name: &str, source: &str) -> Result<(), InstallError> {
        check_upload(name, source)?;
        if self.installed.read().contains_key(name) {
            return Err(InstallError::NameTaken(name.to_owned()));
        }
        // Compiled without a lock: compilations are slow and calls go on meanwhile. The build directory (with
        // the object) is removed when `_build` drops; the loaded mapping stays.
        let (_build, object) = self.compile(name, source)?;
        let loaded = self.load(name, &object)?;
        let mut installed = self.installed.write();
        // Another upload of the same name may have finished first.
        if installed.contains_key(name) {
            return Err(InstallError::NameTaken(name.to_owned()));
        }
        installed.insert(name.to_owned(), Arc::new(loaded));
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<(), RemoveError> {
        // The library closes when the last call that holds it returns.
        match self.installed.write().remove(name) {
            Some(_) => Ok(()),
            None => Err(RemoveError::Unknown(name.to_owned())),
        }
    }

    fn apply(&self, name: &str, image: &Image) -> Result<Image, ApplyError> {
        let loaded = self.installed.read().get(name).cloned().ok_or_else(|| ApplyError::Unknown(name.to_owned()))?;
        let mut out = vec![0u8; image.output_capacity()];
        // Cannot truncate: sides are at most 2^16 and the capacity at most 16 + 3 * 2^32.
        let (width, height, capacity) = (image.width() as i64, image.height() as i64, out.len() as i64);
        // SAFETY: the function has the ABI's type (checked at compile time, see `load`) and its library stays
        // loaded while `loaded` lives. `in` points to width * height * 3 readable bytes and `out` to `capacity`
        // writable ones, as the ABI requires. What the function does beyond that is not checked: this backend
        // trusts it (module doc).
        let returned = unsafe { (loaded.function)(image.pixels().as_ptr(), width, height, out.as_mut_ptr(), capacity) };
        Image::from_transform_output(&out, returned)
            .map_err(|e| ApplyError::Fault { name: name.to_owned(), fault: Fault::BadOutput(e) })
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.installed.read().keys().cloned().collect();
        names.sort();
        names
    }

    fn describe(&self) -> String {
        "native (compiled by the system C compiler, loaded into the server: no isolation)".into()
    }
}
