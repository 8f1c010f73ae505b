//! The class adapters, compiled by the build script and embedded, written to a private directory when a domain
//! needs them as files.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ward_embed::{embedded, EmbeddedSet};

use ward::policy::FunctionPolicy;
use ward::{AdapterLoad, Arg, Extension, Function, Isolation, RetType, Supervisor};

use crate::reader::Reader;
use crate::ClassError;

static ADAPTERS: EmbeddedSet = EmbeddedSet::new(
    "ward-adapters",
    &[
        embedded!("ward_frei0r_adapter", "frei0r class adapter"),
        embedded!("ward_ladspa_adapter", "LADSPA class adapter"),
        embedded!("ward_lv2_adapter", "LV2 class adapter"),
        embedded!("ward_runtime_adapter", "runtime adapter, with its compiler"),
        embedded!("ward_runtime_adapter_mpk", "runtime adapter for mpk domains, with its compiler"),
    ],
);

/// The bytes of the adapter called `name` (empty for no such adapter): what a description's format depends on.
pub(crate) fn bytes_of(name: &str) -> &'static [u8] {
    ADAPTERS.get(name).map_or(&[], |a| a.bytes)
}

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
const REASON_BYTES: usize = 4096;

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
        name: None,
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

/// A library's descriptions, read with `describe`: one that describes itself badly ([`ClassError::BadPlugin`] or
/// [`ClassError::NotAPlugin`]) is a bad call of `describe_symbol`, as much as a crash is: recovered once (the
/// restart may load another build, see `restart_from`) and asked again; refused if it does it again.
pub(crate) fn described<T>(
    ext: &Extension,
    describe_symbol: &str,
    describe: impl Fn() -> Result<T, ClassError>,
) -> Result<T, ClassError> {
    match describe() {
        Err(e @ (ClassError::BadPlugin { .. } | ClassError::NotAPlugin { .. })) => {
            let what = e.to_string();
            if ext.declare_fault(describe_symbol, ward::FaultKind::BadOutput { what }).is_err() {
                return Err(e);
            }
            describe()
        }
        other => other,
    }
}

/// The reason an adapter's open wrote (a dlopen error, say).
fn reason(why: &[u8]) -> String {
    match Reader::new(why).string() {
        Ok(s) if !s.is_empty() => s,
        _ => "the library could not be opened".into(),
    }
}

/// What a class's describer calls in its adapter.
pub(crate) struct DescriberSpec {
    /// The adapter's name among the embedded ones.
    pub adapter: &'static str,
    /// The class's name, for messages.
    pub class: &'static str,
    /// The adapter's open function (see [`OpenSpec::open`]) and the plugin's call it makes, as faults name it.
    pub open: (&'static str, &'static str),
    /// The adapter's function that forgets and unloads an opened library (`int64_t unload(library *)`, 0 when
    /// unloaded).
    pub unload: &'static str,
    /// The adapter functions that read a description, with the plugin's calls they make, in the order the class's
    /// reader takes them.
    pub calls: &'static [(&'static str, &'static str)],
}

/// One process domain in which a class's libraries are opened, described and unloaded, one after the other: the
/// shared half of `ladspa::Describer` and `frei0r::Describer`. The domain is started at the first description and
/// dropped at any failure (the next description starts a fresh one), so a library that crashes or hangs it fails
/// only its own description.
pub(crate) struct SharedDescriber {
    supervisor: Supervisor,
    spec: DescriberSpec,
    domain: Mutex<Option<Describing>>,
    started: AtomicU64,
}

/// The describer's domain and the adapter functions it calls.
struct Describing {
    ext: Extension,
    open: Function,
    unload: Function,
    calls: Vec<Function>,
}

impl std::fmt::Debug for SharedDescriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} describer ({} domains started)", self.spec.class, self.domains_started())
    }
}

impl SharedDescriber {
    /// Its domain runs the adapter itself as an extension, always in a process domain, with `policy`'s defaults;
    /// its events go to no one.
    pub(crate) fn new(policy: ward::Policy, spec: DescriberSpec) -> SharedDescriber {
        SharedDescriber {
            supervisor: Supervisor::new(policy),
            spec,
            domain: Mutex::new(None),
            started: AtomicU64::new(0),
        }
    }

    pub(crate) fn domains_started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    pub(crate) fn pid(&self) -> Option<i32> {
        self.domain.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|d| d.ext.pid())
    }

    /// Open the library at `path` in the describer's domain, `read` its description there (given the spec's calls,
    /// the adapter's handle of the library and its absolute path), and unload it. Any failure, or an unload that did
    /// not succeed, drops the domain.
    pub(crate) fn describe<T>(
        &self,
        path: &Path,
        read: impl FnOnce(&[Function], u64, &Path) -> Result<T, ClassError>,
    ) -> Result<T, ClassError> {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let mut slot = self.domain.lock().unwrap_or_else(|e| e.into_inner());
        let describing = match slot.take() {
            Some(d) => d,
            None => {
                let d = self.start()?;
                self.started.fetch_add(1, Ordering::Relaxed);
                d
            }
        };
        let not_a_plugin =
            |reason: String| ClassError::NotAPlugin { path: path.clone(), class: self.spec.class, reason };
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| not_a_plugin("the path contains a NUL byte".into()))?;
        let mut why = vec![0u8; REASON_BYTES];
        let library = describing
            .open
            .call(&mut [Arg::Str(&c_path), Arg::Out(&mut why), Arg::U64(REASON_BYTES as u64)], RetType::Handle)?
            .as_handle()
            .filter(|&h| h != 0)
            .ok_or_else(|| not_a_plugin(reason(&why)))?;
        let described = read(&describing.calls, library, &path)?;
        let unloaded = describing.unload.call(&mut [Arg::Handle(library)], RetType::I64);
        if matches!(unloaded, Ok(v) if v.as_i64() == Some(0)) {
            *slot = Some(describing);
        }
        Ok(described)
    }

    fn start(&self) -> Result<Describing, ClassError> {
        let adapter = path(self.spec.adapter)?;
        let ext = self.supervisor.load_with(&adapter, Some(Isolation::Process))?;
        let (open, open_call) = self.spec.open;
        let calls = self.spec.calls.iter().map(|&(f, call)| ext.function_as(f, call)).collect::<Result<_, _>>()?;
        Ok(Describing {
            open: ext.function_as(open, open_call)?,
            unload: ext.function_as(self.spec.unload, "dlclose")?,
            calls,
            ext,
        })
    }
}

#[cfg(test)]
mod tests {
    use ward::check::Reason;
    use ward::Isolation;

    /// The imports an mpk domain's runtime answers for an adapter loaded with its plugin (and for nothing else), so
    /// `ward check` lists them as reasons for the adapter alone.
    const LIBRARY_LOOKUP: [&str; 4] = ["dlclose", "dlerror", "dlopen", "dlsym"];

    #[test]
    fn every_adapter_can_be_placed_in_an_mpk_domain_with_its_plugin() {
        for name in ["ward_ladspa_adapter", "ward_frei0r_adapter", "ward_lv2_adapter"] {
            let path = super::path(name).unwrap_or_else(|e| panic!("{e}"));
            let report = ward::check::check(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            let mpk = report.verdict(Isolation::Mpk).expect("a verdict on mpk");
            for reason in &mpk.reasons {
                match reason {
                    Reason::UnsupportedImport { import, .. } if LIBRARY_LOOKUP.contains(&import.name.as_str()) => {}
                    other => panic!("{name} cannot be placed in an mpk domain: {other}"),
                }
            }
        }
    }

    /// The runtime adapter's mpk variant, compiler and all (its setjmp and longjmp included), is one an mpk domain
    /// holds as it is; the full adapter is refused for its shared objects alone.
    #[test]
    fn the_runtime_adapter_for_mpk_domains_passes_the_mpk_check_and_the_full_one_needs_the_dynamic_linker() {
        let path = super::path("ward_runtime_adapter_mpk").unwrap_or_else(|e| panic!("{e}"));
        let report = ward::check::check(&path).unwrap_or_else(|e| panic!("{e}"));
        let mpk = report.verdict(Isolation::Mpk).expect("a verdict on mpk");
        assert!(mpk.ok, "the mpk runtime adapter: {:?}", mpk.reasons.iter().map(|r| r.to_string()).collect::<Vec<_>>());
        let path = super::path("ward_runtime_adapter").unwrap_or_else(|e| panic!("{e}"));
        let report = ward::check::check(&path).unwrap_or_else(|e| panic!("{e}"));
        let mpk = report.verdict(Isolation::Mpk).expect("a verdict on mpk");
        assert!(!mpk.ok);
        for reason in &mpk.reasons {
            match reason {
                Reason::UnsupportedImport { import, .. } if LIBRARY_LOOKUP.contains(&import.name.as_str()) => {}
                other => panic!("the runtime adapter is refused for more than its shared objects: {other}"),
            }
        }
    }
}
