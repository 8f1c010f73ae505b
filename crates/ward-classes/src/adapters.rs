//! The class adapters, compiled by the build script and embedded, written to a private directory when a domain
//! needs them as files.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use ward_embed::{embedded, EmbeddedSet};

use ward::policy::FunctionPolicy;
use ward::{AdapterLoad, Arg, Extension, Isolation, RetType, Supervisor};

use crate::reader::Reader;
use crate::ClassError;

static ADAPTERS: EmbeddedSet = EmbeddedSet::new(
    "ward-adapters",
    &[
        embedded!("ward_frei0r_adapter", "frei0r class adapter"),
        embedded!("ward_ladspa_adapter", "LADSPA class adapter"),
    ],
);

/// The path of the adapter called `name`, extracted if need be.
pub(crate) fn path(name: &str) -> Result<PathBuf, ClassError> {
    ADAPTERS.path_of(name).map_err(|e| ClassError::Adapter { name: name.to_string(), reason: e.to_string() })
}

/// Adapter results below this are its error codes (see `ward_adapter_common.h`), above it minus a needed size.
pub(crate) const ADAPTER_ERROR_BELOW: i64 = -0x1_0000_0000;

/// How a class opens a plugin library through its adapter.
pub(crate) struct OpenSpec<'a> {
    /// The adapter's name among the embedded ones.
    pub adapter: &'static str,
    /// The class's name, for messages.
    pub class: &'static str,
    /// The adapter functions' policies (see [`AdapterLoad::functions`]).
    pub functions: &'a [(&'a str, FunctionPolicy)],
    /// What the host gets from a disabled plugin of the class (see [`AdapterLoad::when_disabled`]).
    pub when_disabled: &'static str,
    /// The adapter's open function: `library *open(const char *path, unsigned char *why, uint64_t why_cap)`,
    /// which writes why it failed (a u32-prefixed string) into `why` when it returns NULL.
    pub open: &'static str,
    /// The plugin's call the open makes, as faults name it (the adapter's open loads the plugin and calls it).
    pub open_call: &'static str,
}

/// Room for the reason an open failed.
pub(crate) const REASON_BYTES: usize = 4096;

/// A plugin library opened in its domain.
pub(crate) struct Opened {
    /// The plugin's absolute path.
    pub path: PathBuf,
    pub ext: Extension,
    /// The adapter's handle of the library.
    pub library: u64,
}

/// Load `spec`'s adapter in place of the plugin at `path` and open the plugin there. A shared object the adapter
/// cannot open as a plugin of the class is [`ClassError::NotAPlugin`], with the adapter's reason.
pub(crate) fn open_library(
    supervisor: &Supervisor,
    path: &Path,
    isolation: Option<Isolation>,
    spec: &OpenSpec<'_>,
) -> Result<Opened, ClassError> {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let adapter = self::path(spec.adapter)?;
    let ext = supervisor.load_adapter(&AdapterLoad {
        adapter: &adapter,
        plugin: &path,
        isolation,
        functions: spec.functions,
        when_disabled: Some(spec.when_disabled),
    })?;
    let not_a_plugin = |reason: String| ClassError::NotAPlugin { path: path.clone(), class: spec.class, reason };
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| not_a_plugin("the path contains a NUL byte".into()))?;
    let mut why = vec![0u8; REASON_BYTES];
    let library = ext
        .function_as(spec.open, spec.open_call)?
        .call(&mut [Arg::Str(&c_path), Arg::Out(&mut why), Arg::U64(REASON_BYTES as u64)], RetType::Handle)?;
    match library.as_handle() {
        Some(library) if library != 0 => Ok(Opened { path, ext, library }),
        _ => Err(not_a_plugin(reason(&why))),
    }
}

/// The reason an adapter's open wrote (a dlopen error, say).
pub(crate) fn reason(why: &[u8]) -> String {
    match Reader::new(why).string() {
        Ok(s) if !s.is_empty() => s,
        _ => "the library could not be opened".into(),
    }
}
