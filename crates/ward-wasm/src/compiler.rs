//! C source text to a wasm32 module, by running clang.
//!
//! The module is a WASI reactor: no entry point; it exports `_initialize` (the C constructors, which the host
//! calls once per instance), the plugin's function (named like the plugin), its memory (`memory`) and
//! `__heap_base`, the first address past its data and stack, where the host puts the images it passes (see
//! `runtime`). A reactor's exports are called as they are; a command's (clang's default) would each be wrapped in
//! a call of the constructors and destructors, on every call. The stack comes first in memory (`--stack-first`), so a stack overflow runs
//! below address 0 and traps instead of overwriting the module's data. WASI's libc is linked for what a plugin may
//! call that needs no system (`memcpy`, `memset`, math); a plugin that calls something needing the system imports
//! it from WASI, which this host does not offer, so it fails at instantiation and never runs half-linked.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// The Debian packages that hold the toolchain (the compiler, the wasm32 linker, WASI's libc and compiler-rt's
/// wasm32 builtins), named in the error when clang is missing.
pub const TOOLCHAIN_PACKAGES: &str = "clang lld wasi-libc libclang-rt-14-dev-wasm32";

/// The names tried, in order, for clang on `PATH`.
const CLANG_NAMES: [&str; 2] = ["clang", "clang-14"];

/// The header every plugin includes; a compiler given the header's text writes it under this name.
const HEADER_NAME: &str = "ward_image.h";

/// What went wrong turning C source into a module.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Neither `clang` nor `clang-14` is on `PATH`.
    #[error("no clang on PATH (tried {tried}): install the Debian packages {packages}")]
    ClangMissing { tried: String, packages: &'static str },
    /// The plugin's name is not a C identifier, so it cannot be the function the module exports.
    #[error("plugin name {0:?} is not a C identifier")]
    InvalidName(String),
    /// The header directory does not hold the header the plugins include.
    #[error("{} holds no {HEADER_NAME}", dir.display())]
    HeaderMissing { dir: PathBuf },
    /// A file of the compilation could not be written or read, or clang could not be started.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// clang (or the linker it ran) refused the source: its diagnostics, and the first error parsed.
    #[error("{0}")]
    Failed(CompileFailure),
}

/// The diagnostics of a compilation that failed.
#[derive(Debug, Clone)]
pub struct CompileFailure {
    /// Everything clang and the linker wrote to standard error.
    pub diagnostics: String,
    /// The first error with a position (`file:line:column: error: message`); `None` for an error without one
    /// (the linker's, e.g. a plugin that does not define the function it is named after).
    pub first_error: Option<Diagnostic>,
}

impl fmt::Display for CompileFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.first_error {
            Some(first) => write!(f, "compile error at {first}"),
            None => {
                let first_line = self.diagnostics.lines().find(|l| l.contains("error")).unwrap_or("no diagnostics");
                write!(f, "compile error: {first_line}")
            }
        }
    }
}

/// One positioned diagnostic of clang's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file as clang named it (the plugin's source is `NAME.c`).
    pub file: String,
    /// 1-based.
    pub line: u32,
    /// 1-based.
    pub column: u32,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.column, self.message)
    }
}

/// Where `#include "ward_image.h"` is found.
#[derive(Debug, Clone)]
pub enum ImageHeader {
    /// A directory that holds `ward_image.h` (passed to clang as `-I`).
    Directory(PathBuf),
    /// The header's text, written once into the compiler's own directory.
    Text(String),
}

/// A compiled module: the bytes of a wasm32 binary exporting `name`.
#[derive(Debug, Clone)]
pub struct WasmBinary {
    name: String,
    bytes: Vec<u8>,
}

impl WasmBinary {
    /// The plugin's name, which is also the function the module exports.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// Compiles plugins' C source to wasm32 with clang. Compilations may run from many threads at once: each has a
/// directory of its own.
#[derive(Debug)]
pub struct WasmCompiler {
    clang: PathBuf,
    include_dir: PathBuf,
    /// The compiler's scratch directory: the header written from text, and one directory per compilation.
    scratch: ScratchDir,
    next_job: AtomicU64,
}

impl WasmCompiler {
    /// Finds clang and makes the header reachable.
    pub fn new(header: ImageHeader) -> Result<Self, CompileError> {
        let clang = find_clang()?;
        let scratch = ScratchDir::create()?;
        let include_dir = match header {
            ImageHeader::Directory(dir) => {
                if !dir.join(HEADER_NAME).is_file() {
                    return Err(CompileError::HeaderMissing { dir });
                }
                dir
            }
            ImageHeader::Text(text) => {
                let path = scratch.path.join(HEADER_NAME);
                fs::write(&path, text)
                    .map_err(|source| CompileError::Io { what: format!("writing {}", path.display()), source })?;
                scratch.path.clone()
            }
        };
        Ok(Self { clang, include_dir, scratch, next_job: AtomicU64::new(0) })
    }

    /// The clang this compiler runs.
    pub fn clang(&self) -> &Path {
        &self.clang
    }

    /// Compiles `source` (C text defining `int64_t NAME(...)`) to a module exporting `name`, at `-O2`.
    pub fn compile(&self, name: &str, source: &str) -> Result<WasmBinary, CompileError> {
        if !is_c_identifier(name) {
            return Err(CompileError::InvalidName(name.to_owned()));
        }
        let job = self.next_job.fetch_add(1, Ordering::Relaxed);
        let dir = self.scratch.path.join(format!("job-{job}"));
        fs::create_dir(&dir)
            .map_err(|source| CompileError::Io { what: format!("creating {}", dir.display()), source })?;
        let result = self.compile_in(&dir, name, source);
        // The job's files are of no use once read; a failure to remove them leaves them to the scratch directory's
        // own removal.
        let _ = fs::remove_dir_all(&dir);
        result
    }

    fn compile_in(&self, dir: &Path, name: &str, source: &str) -> Result<WasmBinary, CompileError> {
        let source_path = dir.join(format!("{name}.c"));
        let output_path = dir.join(format!("{name}.wasm"));
        fs::write(&source_path, source)
            .map_err(|source| CompileError::Io { what: format!("writing {}", source_path.display()), source })?;
        let output = Command::new(&self.clang)
            .current_dir(dir)
            .args(["--target=wasm32-wasi", "-mexec-model=reactor", "-O2", "-fno-color-diagnostics"])
            .arg(format!("-I{}", self.include_dir.display()))
            .args(["-Wl,--no-entry", "-Wl,--stack-first", "-Wl,--strip-debug", "-Wl,--export=__heap_base"])
            .arg(format!("-Wl,--export={name}"))
            .arg("-o")
            .arg(&output_path)
            // Relative, so that diagnostics name the file as the plugin's author knows it.
            .arg(format!("{name}.c"))
            .output()
            .map_err(|source| CompileError::Io { what: format!("running {}", self.clang.display()), source })?;
        if !output.status.success() {
            let diagnostics = String::from_utf8_lossy(&output.stderr).into_owned();
            let first_error = first_error(&diagnostics);
            return Err(CompileError::Failed(CompileFailure { diagnostics, first_error }));
        }
        let bytes = fs::read(&output_path)
            .map_err(|source| CompileError::Io { what: format!("reading {}", output_path.display()), source })?;
        Ok(WasmBinary { name: name.to_owned(), bytes })
    }
}

/// The first `file:line:column: error: message` (or `fatal error`) line of clang's diagnostics.
pub fn first_error(diagnostics: &str) -> Option<Diagnostic> {
    diagnostics.lines().find_map(|line| {
        let (position, message) = line.split_once(": error: ").or_else(|| line.split_once(": fatal error: "))?;
        // The file name may itself hold colons; line and column are the last two fields.
        let mut fields = position.rsplitn(3, ':');
        let column = fields.next()?.parse().ok()?;
        let line_number = fields.next()?.parse().ok()?;
        let file = fields.next()?.to_owned();
        Some(Diagnostic { file, line: line_number, column, message: message.to_owned() })
    })
}

fn is_c_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fn find_clang() -> Result<PathBuf, CompileError> {
    find_clang_in(&std::env::var_os("PATH").unwrap_or_default())
}

/// clang in the directories of a `PATH`-like list.
fn find_clang_in(path: &std::ffi::OsStr) -> Result<PathBuf, CompileError> {
    for name in CLANG_NAMES {
        for dir in std::env::split_paths(path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(CompileError::ClangMissing { tried: CLANG_NAMES.join(", "), packages: TOOLCHAIN_PACKAGES })
}

/// A directory of the compiler's own under the system's temporary directory, removed with the compiler.
#[derive(Debug)]
struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    fn create() -> Result<Self, CompileError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        // The process id and a counter make the name unique on the machine; `create_dir` refuses a name that
        // exists, so a stale directory of an earlier process with the same id is never reused.
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("ward-wasm-{}-{n}", std::process::id()));
            match fs::create_dir(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(CompileError::Io { what: format!("creating {}", path.display()), source });
                }
            }
        }
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_error_is_parsed_into_line_and_column() {
        let text = "grey.c:3:5: warning: unused variable 'x'\n\
                    grey.c:7:21: error: use of undeclared identifier 'y'\n\
                    grey.c:9:1: error: expected '}'\n";
        let first = first_error(text).expect("an error line");
        assert_eq!(
            first,
            Diagnostic {
                file: "grey.c".into(),
                line: 7,
                column: 21,
                message: "use of undeclared identifier 'y'".into()
            }
        );
    }

    #[test]
    fn fatal_errors_count_and_linker_errors_have_no_position() {
        let fatal = first_error("a.c:1:10: fatal error: 'nope.h' file not found\n").expect("a fatal error");
        assert_eq!((fatal.line, fatal.column), (1, 10));
        assert_eq!(first_error("wasm-ld: error: symbol exported via --export not found: crop\n"), None);
    }

    #[test]
    fn missing_clang_names_the_packages_to_install() {
        let empty = ScratchDir::create().expect("scratch directory");
        match find_clang_in(empty.path.as_os_str()) {
            Err(error @ CompileError::ClangMissing { .. }) => {
                let message = error.to_string();
                assert!(message.contains("clang, clang-14"), "{message}");
                assert!(message.contains(TOOLCHAIN_PACKAGES), "{message}");
            }
            other => panic!("expected ClangMissing, got {other:?}"),
        }
    }

    #[test]
    fn names_must_be_c_identifiers() {
        assert!(is_c_identifier("grayscale"));
        assert!(is_c_identifier("_x1"));
        assert!(!is_c_identifier("1x"));
        assert!(!is_c_identifier("a,--export=b"));
        assert!(!is_c_identifier(""));
    }
}
