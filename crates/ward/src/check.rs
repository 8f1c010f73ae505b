//! Which isolation kinds an extension can get, and every reason it cannot: a static reading of its file, which is
//! never loaded.
//!
//! - `none` and `process` take any 64-bit x86-64 ELF shared object that `dlopen` would take; they are refused
//!   only to position-independent executables and objects marked not to be opened.
//! - `mpk` additionally refuses extensions that contain instructions able to write PKRU, start threads, have
//!   thread-local storage of their own, need libraries other than glibc's, or import anything the domain runtime
//!   cannot honour (see the mpk backend's import table for how each import is bound).
//!
//! ```no_run
//! let report = ward::check::check("plugin.so".as_ref())?;
//! for verdict in &report.kinds {
//!     println!("{}: {}", verdict.isolation, if verdict.ok { "ok" } else { "no" });
//!     for reason in &verdict.reasons {
//!         println!("    {reason}");
//!     }
//! }
//! # Ok::<(), ward::Error>(())
//! ```

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};

use ward_mpk::assess::{self, elf, Image};

use crate::error::Error;
use crate::policy::Isolation;

pub use ward_mpk::assess::{Forbidden, ForbiddenSite, Import, ImportClass, ImportRef, Reason, SymbolKind};

/// The isolation kinds a report gives a verdict on, in report order. `auto` is not one: it picks mpk when the
/// verdict and the processor allow it, process otherwise.
pub const KINDS: [Isolation; 3] = [Isolation::None, Isolation::Process, Isolation::Mpk];

/// What `check` found out about one extension.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    #[serde(serialize_with = "lossy_path")]
    pub path: PathBuf,
    /// The extension's name, as policies name it (file name without `lib` and `.so`).
    pub name: String,
    /// One verdict per kind of [`KINDS`], in that order.
    pub kinds: Vec<KindVerdict>,
    /// Every undefined dynamic symbol and how the mpk loader would bind it, sorted by name.
    pub imports: Vec<Import>,
}

/// Whether an extension can run under one isolation kind, and if not, why.
#[derive(Debug, Clone, Serialize)]
pub struct KindVerdict {
    #[serde(serialize_with = "isolation_keyword")]
    pub isolation: Isolation,
    pub ok: bool,
    /// Empty exactly when `ok`. Serialised with a `message` beside each reason's fields.
    #[serde(serialize_with = "reasons_with_messages")]
    pub reasons: Vec<Reason>,
}

impl CheckReport {
    /// The verdict on `isolation`, if the report gives one.
    pub fn verdict(&self, isolation: Isolation) -> Option<&KindVerdict> {
        self.kinds.iter().find(|k| k.isolation == isolation)
    }

    /// Whether the extension can run under `isolation`.
    pub fn allows(&self, isolation: Isolation) -> bool {
        self.verdict(isolation).is_some_and(|k| k.ok)
    }
}

/// Checks the extension at `path`. Errors only when the file cannot be read as an x86-64 ELF shared object;
/// everything else is a verdict.
pub fn check(path: &Path) -> Result<CheckReport, Error> {
    let bytes = read(path)?;
    check_bytes(path, &bytes)
}

/// Checks an extension whose file has been read already; `path` names it in the report.
pub fn check_bytes(path: &Path, bytes: &[u8]) -> Result<CheckReport, Error> {
    let image = Image::parse(bytes).map_err(|unreadable| unreadable_error(path, unreadable))?;

    let mut loadability = Vec::new();
    if image.is_pie {
        loadability.push(Reason::PositionIndependentExecutable);
    }
    if image.no_dlopen {
        loadability.push(Reason::NotDlopenable);
    }
    let assessment = assess::assess(&image);
    let mut mpk_reasons = loadability.clone();
    mpk_reasons.extend(assessment.reasons);

    let verdict = |isolation, reasons: Vec<Reason>| KindVerdict { isolation, ok: reasons.is_empty(), reasons };
    Ok(CheckReport {
        path: path.into(),
        name: crate::extension_name(path),
        kinds: vec![
            verdict(Isolation::None, loadability.clone()),
            verdict(Isolation::Process, loadability),
            verdict(Isolation::Mpk, mpk_reasons),
        ],
        imports: assessment.imports,
    })
}

/// Refuse what is not a 64-bit x86-64 ELF shared object, by its header alone (what loading needs), for the reasons
/// [`check`] gives.
pub(crate) fn check_header(path: &Path) -> Result<(), Error> {
    let mut header = Vec::with_capacity(elf::IDENT_AND_TYPE_LEN);
    open(path)?
        .take(elf::IDENT_AND_TYPE_LEN as u64)
        .read_to_end(&mut header)
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    elf::check_ident(&header).map_err(|unreadable| unreadable_error(path, unreadable))
}

/// The error for a file that is not an x86-64 ELF shared object: not ELF at all, or ELF that cannot be used.
fn unreadable_error(path: &Path, unreadable: elf::Unreadable) -> Error {
    match unreadable {
        elf::Unreadable::NoElfHeader => Error::NotElf { path: path.into(), reason: unreadable.to_string() },
        other => Error::Unusable { path: path.into(), reason: other.to_string() },
    }
}

fn open(path: &Path) -> Result<File, Error> {
    if path.is_dir() {
        return Err(Error::NotElf { path: path.into(), reason: "a directory".into() });
    }
    File::open(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Error::NotFound { path: path.into() },
        _ => Error::io(format!("cannot open {}", path.display()), e),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    open(path)?.read_to_end(&mut bytes).map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    Ok(bytes)
}

/// Paths that are not UTF-8 are shown with replacement characters rather than failing the whole report.
fn lossy_path<S: Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&path.to_string_lossy())
}

fn isolation_keyword<S: Serializer>(isolation: &Isolation, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(isolation.as_str())
}

fn reasons_with_messages<S: Serializer>(reasons: &[Reason], s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct WithMessage<'a> {
        message: String,
        #[serde(flatten)]
        reason: &'a Reason,
    }
    s.collect_seq(reasons.iter().map(|reason| WithMessage { message: reason.to_string(), reason }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_shared_object() {
        let missing = check_header(Path::new("/nonexistent/ward.so"));
        assert!(matches!(missing, Err(Error::NotFound { .. })));
        let text = check_header(Path::new("/etc/hostname"));
        assert!(matches!(text, Err(Error::NotElf { .. })), "{text:?}");
        let exe = std::env::current_exe().unwrap();
        let r = check_header(&exe);
        // Test binaries are position-independent executables (ET_DYN too) on Debian; only check it parses.
        assert!(r.is_ok() || matches!(r, Err(Error::NotElf { .. })));
        // The same reasons as `ward check` gives: an ELF file for another processor names it.
        let mut aarch64 = vec![0u8; 64];
        aarch64[..4].copy_from_slice(b"\x7fELF");
        (aarch64[4], aarch64[5], aarch64[16], aarch64[18]) = (2, 1, 3, 183);
        let path = std::env::temp_dir().join(format!("ward-supervisor-aarch64-{}.so", std::process::id()));
        std::fs::write(&path, &aarch64).unwrap();
        let r = check_header(&path);
        std::fs::remove_file(&path).unwrap();
        let e = r.expect_err("an AArch64 object is refused");
        assert!(matches!(e, Error::Unusable { .. }) && e.to_string().contains("AArch64"), "{e}");
        assert!(matches!(check_header(&std::env::temp_dir()), Err(Error::NotElf { .. })), "a directory");
    }

    #[test]
    fn reasons_serialise_with_their_message_and_fields() {
        let verdict = KindVerdict {
            isolation: Isolation::Mpk,
            ok: false,
            reasons: vec![
                Reason::Dependency { library: "libfftw3f.so.3".into() },
                Reason::UnsupportedImport {
                    import: ImportRef { name: "mmap".into(), weak: false },
                    group: "mappings",
                    why: "maps memory",
                },
            ],
        };
        let json = serde_json::to_value(&verdict).expect("serialisable");
        assert_eq!(json["isolation"], "mpk");
        assert_eq!(json["ok"], false);
        assert_eq!(json["reasons"][0]["reason"], "dependency");
        assert_eq!(json["reasons"][0]["library"], "libfftw3f.so.3");
        assert_eq!(
            json["reasons"][0]["message"],
            "needs libfftw3f.so.3: its code would run inside the domain; not analysed"
        );
        assert_eq!(json["reasons"][1]["reason"], "unsupported_import");
        assert_eq!(json["reasons"][1]["name"], "mmap");
        assert_eq!(json["reasons"][1]["weak"], false);
        assert_eq!(json["reasons"][1]["group"], "mappings");
        assert_eq!(json["reasons"][1]["message"], "imports mmap: maps memory");
    }
}
