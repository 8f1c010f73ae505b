//! What the server asks of whatever runs its transforms: install one from C source, remove one, apply one to an
//! image. The server knows nothing else about them: ward's `Runtime` (each isolation kind), WebAssembly and the
//! native baseline ([`crate::native::NativeTransforms`]) all sit behind [`Transforms`].
//!
//! The errors keep apart what the server answers differently: a client's mistake (a bad name, a compile error, a
//! name already taken: 4xx), an unknown name (404), a fault of the transform (502: the transform, not the server,
//! failed) and a failure of the machinery itself (500).

use thiserror::Error;

use crate::image::{Image, OutputError};

/// The longest transform name accepted (a C identifier, used as the symbol's name).
pub const MAX_NAME_LEN: usize = 64;

/// Runs image transforms uploaded as C source. Object-safe: the server holds an `Arc<dyn Transforms>`.
///
/// Every method may block (compiling, calling into a domain): the server calls them on tokio's blocking pool.
/// `apply` is called from several threads at once, also while `install` and `remove` run.
pub trait Transforms: Send + Sync {
    /// Compiles `source` and links the transform it defines, `int64_t NAME(...)` with the ABI of `ward_image.h`,
    /// under `name`. `ward_image.h` is on the include path.
    fn install(&self, name: &str, source: &str) -> Result<(), InstallError>;

    /// Unlinks the transform `name`. Calls already running finish with the code they started with.
    fn remove(&self, name: &str) -> Result<(), RemoveError>;

    /// Applies the transform `name` to `image`, offering it [`Image::output_capacity`] bytes of output.
    fn apply(&self, name: &str, image: &Image) -> Result<Image, ApplyError>;

    /// The names of the installed transforms, sorted.
    fn names(&self) -> Vec<String>;

    /// What runs the transforms and with which isolation, in a few words (for the server's log).
    fn describe(&self) -> String;
}

/// Why a transform was not installed.
#[derive(Debug, Error)]
pub enum InstallError {
    /// The name is not a C identifier of at most [`MAX_NAME_LEN`] bytes.
    #[error("invalid transform name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    /// A transform of that name is installed already.
    #[error("transform {0} is installed already")]
    NameTaken(String),
    /// The compiler refused the source; `message` is its diagnostics, naming the source `NAME.c` with line and
    /// column.
    #[error("transform {name} does not compile:\n{message}")]
    Compile { name: String, message: String },
    /// The source compiled but does not define the transform's function.
    #[error("transform {name}: the source does not define `int64_t {name}(...)`")]
    MissingFunction { name: String },
    /// The source is not something the compiler can be given (a NUL byte, too large).
    #[error("transform {name}: {reason}")]
    InvalidSource { name: String, reason: String },
    /// The machinery failed (no compiler, no temporary directory, the domain died while loading): not the source's
    /// fault.
    #[error("transform {name} could not be installed: {reason}")]
    Backend { name: String, reason: String },
}

/// Why a transform was not removed.
#[derive(Debug, Error)]
pub enum RemoveError {
    #[error("no transform {0}")]
    Unknown(String),
    #[error("transform {name} could not be removed: {reason}")]
    Backend { name: String, reason: String },
}

/// Why applying a transform gave no image.
#[derive(Debug, Error)]
pub enum ApplyError {
    /// No transform of that name is installed.
    #[error("no transform {0}")]
    Unknown(String),
    /// The transform faulted; the transform is to blame, and the others go on.
    #[error("transform {name} faulted: {fault}")]
    Fault { name: String, fault: Fault },
    /// The machinery failed, not the transform.
    #[error("transform {name} could not be applied: {reason}")]
    Backend { name: String, reason: String },
}

/// How a transform failed.
#[derive(Debug, Error)]
pub enum Fault {
    /// It crashed (a signal, a trap); the text says which, as the backend saw it.
    #[error("crashed: {0}")]
    Crashed(String),
    /// It ran past the time it was allowed.
    #[error("ran past its quantum of {0} ms")]
    TimedOut(u64),
    /// It returned, but what it returned or wrote is not an image.
    #[error("bad output: {0}")]
    BadOutput(#[from] OutputError),
    /// It returned, but its output is not an image, as a backend that checks outputs itself said.
    #[error("bad output: {0}")]
    Malformed(String),
}

/// Checks that `name` can name a transform: a C identifier (ASCII letters, digits, `_`, not starting with a digit)
/// of at most [`MAX_NAME_LEN`] bytes, so it is the function's symbol and safe in a file name and a URL path.
pub fn check_name(name: &str) -> Result<(), InstallError> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("longer than 64 bytes")
    } else if name.as_bytes()[0].is_ascii_digit() {
        Some("starts with a digit")
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        Some("not a C identifier (letters, digits and _ only)")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(InstallError::InvalidName { name: name.to_owned(), reason }),
        None => Ok(()),
    }
}

/// Checks an upload before any backend compiles it: its name (see [`check_name`]) and a source with no NUL byte
/// (a C string ends at one, so the compiler would see less than the client sent).
pub fn check_upload(name: &str, source: &str) -> Result<(), InstallError> {
    check_name(name)?;
    if source.contains('\0') {
        return Err(InstallError::InvalidSource { name: name.to_owned(), reason: "the source has a NUL byte".into() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_c_identifiers() {
        for good in ["grayscale", "_x", "crop2", "A_b_9"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "2crop", "a-b", "a.b", "../x", "a b", "é", &"x".repeat(65)] {
            assert!(matches!(check_name(bad), Err(InstallError::InvalidName { .. })), "{bad:?}");
        }
        assert!(check_name(&"x".repeat(64)).is_ok());
    }
}
