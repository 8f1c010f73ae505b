//! The shim's state: one supervisor for the host process, the plugins opened under it, and the proxies handed out.

use std::collections::HashMap;
use std::ffi::c_void;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, OnceLock};

use ward::{Event, Isolation, Policy, Supervisor};
use ward_classes::cache::{Described, DescriptionCache, FileIdentity, Wire};
use ward_classes::{inspect, Class, ClassError, Classification, ClassifyError};

use crate::{frei0r, ladspa, lv2, proxy};

/// A plugin library opened under ward, as the proxies see it.
#[derive(Clone)]
pub(crate) enum Plugin {
    Ladspa(Arc<ladspa::ProxyLibrary>),
    Frei0r(Arc<frei0r::ProxyLibrary>),
    Lv2(Arc<lv2::ProxyLibrary>),
}

pub(crate) struct Runtime {
    supervisor: Supervisor,
    /// The policy the supervisor was made with (for `native_fallback`, which only the shim looks at).
    policy: Policy,
    isolation: Option<Isolation>,
    plugins: Mutex<HashMap<u64, Plugin>>,
    /// Proxy handles given to the host, the plugin each stands for, and the descriptor of its copy (open while it is
    /// loaded, see `proxy::load`).
    proxies: Mutex<HashMap<usize, (u64, OwnedFd)>>,
    next_id: AtomicU64,
    events: Mutex<Receiver<Event>>,
    log: Option<Mutex<std::fs::File>>,
    /// Say which plugins are put under ward (`ward run --verbose`).
    verbose: bool,
    /// The domains that describe the LADSPA libraries and frei0r plugins the host opens, each started with the
    /// first of its class.
    ladspa_describer: ward_classes::ladspa::Describer,
    frei0r_describer: ward_classes::frei0r::Describer,
    /// The user's cache of descriptions (its directory made and checked at first use).
    cache: DescriptionCache,
    /// How many LADSPA libraries and frei0r plugins were described from the cache (said at exit, `--verbose`).
    from_cache: [AtomicU64; 2],
    /// Whether a problem of the cache (a directory not used, an entry not written) was said (`--verbose`, once).
    cache_said: AtomicBool,
}

static RUNTIME: OnceLock<Result<Runtime, EnvironmentError>> = OnceLock::new();

/// Why the environment `ward run` set is unusable.
#[derive(Debug, thiserror::Error)]
enum EnvironmentError {
    /// In the core's words.
    #[error("WARD_ISOLATION: {0}")]
    Isolation(ward::policy::UnknownKeyword),
    #[error("the policy (WARD_POLICY) is unusable: {0}")]
    Policy(ward::policy::PolicyError),
    #[error("cannot open the log {}: {source}", path.display())]
    Log { path: PathBuf, source: std::io::Error },
}

/// The runtime, set up from the environment on first use; `None` when the environment is unusable.
pub(crate) fn get() -> Option<&'static Runtime> {
    runtime_or_why().ok()
}

/// Report the recovery events so far ([`Runtime::report`]), if the runtime is up: after every proxied call.
pub(crate) fn report() {
    if let Some(rt) = get() {
        rt.report();
    }
}

/// The runtime, or why the environment is unusable (a policy that cannot be read, say), in which case no plugin of
/// a known class is loaded at all: without ward it would be unprotected, and ward cannot run it as asked.
fn runtime_or_why() -> Result<&'static Runtime, &'static EnvironmentError> {
    RUNTIME.get_or_init(Runtime::from_env).as_ref()
}

impl Runtime {
    fn from_env() -> Result<Runtime, EnvironmentError> {
        let isolation = match std::env::var("WARD_ISOLATION") {
            Ok(s) if !s.is_empty() => Some(s.parse::<Isolation>().map_err(EnvironmentError::Isolation)?),
            _ => None,
        };
        let policy = match std::env::var_os("WARD_POLICY") {
            Some(p) if !p.is_empty() => Policy::from_file(Path::new(&p)).map_err(EnvironmentError::Policy)?,
            _ => Policy::default(),
        };
        let log = match std::env::var_os("WARD_LOG") {
            Some(p) if !p.is_empty() => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&p)
                    .map_err(|source| EnvironmentError::Log { path: PathBuf::from(&p), source })?;
                Some(Mutex::new(file))
            }
            _ => None,
        };
        let supervisor = Supervisor::new(policy.clone());
        let ladspa_describer = ward_classes::ladspa::Describer::new(policy.clone());
        let frei0r_describer = ward_classes::frei0r::Describer::new(policy.clone());
        let events = Mutex::new(supervisor.subscribe());
        let verbose = std::env::var_os("WARD_VERBOSE").is_some_and(|v| v == "1");
        if verbose {
            crate::interpose::at_exit(say_what_came_from_the_cache);
        }
        Ok(Runtime {
            supervisor,
            policy,
            isolation,
            plugins: Mutex::new(HashMap::new()),
            proxies: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            events,
            log,
            verbose,
            ladspa_describer,
            frei0r_describer,
            cache: DescriptionCache::from_env(),
            from_cache: [AtomicU64::new(0), AtomicU64::new(0)],
            cache_said: AtomicBool::new(false),
        })
    }

    pub(crate) fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// Whether the plugin library at `path` is described in the describer's domain, its own domain (or its place
    /// in its group's) coming only when the host first instantiates from it: where that domain would be a process
    /// domain, with nothing in its policy that acts on the library's loading (a restart image, a library fault,
    /// poisoning), which are left as they were (DECISIONS.md).
    fn describes_apart(&self, path: &Path) -> bool {
        self.describes_apart_under(&self.policy.for_extension(&ward::extension_name(path)))
    }

    fn describes_apart_under(&self, policy: &ward::policy::ExtensionPolicy) -> bool {
        let process = match self.isolation.unwrap_or(policy.isolation) {
            Isolation::Process => true,
            Isolation::Auto => !ward::mpk_available(),
            _ => false,
        };
        process && policy.restart_from.is_none() && policy.library_fault.is_none() && !policy.poison
    }

    /// The cache of descriptions, where it applies to the library at `path`: a library described apart whose policy
    /// keeps its descriptions (`describe_cache`). Whether its directory can be used is asked apart (reading makes
    /// no directory, writing does).
    fn cache_for(&self, path: &Path) -> Option<&DescriptionCache> {
        let policy = self.policy.for_extension(&ward::extension_name(path));
        (policy.describe_cache && self.describes_apart_under(&policy)).then_some(&self.cache)
    }

    /// Say once (`--verbose`) why the cache's directory is not used.
    fn cache_refused(&self, why: &ward_classes::cache::CacheRefused) {
        self.say_once_about_the_cache(&format!("the cache of descriptions is not used: {why}"));
    }

    fn say_once_about_the_cache(&self, what: &str) {
        if self.verbose && !self.cache_said.swap(true, Ordering::Relaxed) {
            self.say(what);
        }
    }

    /// The library the host opened as `path`, whose file has `identity`, as the cache holds it (described before
    /// and unchanged since): its class, its entry points and a proxy library of its descriptions, no describer
    /// started and nothing of the file read. `None` for a miss, or where the cache does not apply to it.
    fn described_from_cache(&self, path: &Path, identity: &FileIdentity) -> Option<(Class, Vec<String>, Plugin)> {
        let cache = self.cache_for(path)?;
        match cache.readable() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(why) => {
                self.cache_refused(why);
                return None;
            }
        }
        let cached = cache.get(path, identity)?;
        let plugin = match cached.described {
            Described::Ladspa(plugins) => {
                Plugin::Ladspa(Arc::new(ladspa::ProxyLibrary::with_descriptions(path, self.isolation, plugins)))
            }
            Described::Frei0r(info) => {
                Plugin::Frei0r(Arc::new(frei0r::ProxyLibrary::with_description(path, self.isolation, info)))
            }
        };
        let counter = if cached.class == Class::Ladspa { 0 } else { 1 };
        self.from_cache[counter].fetch_add(1, Ordering::Relaxed);
        if self.verbose {
            self.say(&format!(
                "{}: {} plugin described under ward, from the cache (its domain starts when the host first {})",
                path.display(),
                cached.class.name(),
                first_use(cached.class),
            ));
        }
        Some((cached.class, cached.entry_points, plugin))
    }

    /// Keep what the describer read (`wire`) of the library at `path`, which exports `exports`, in the cache, if the
    /// cache applies to it and its file still has `identity` (the one it had before it was described).
    fn remember(&self, path: &Path, identity: Option<&FileIdentity>, class: Class, exports: &[String], wire: &Wire) {
        let Some(identity) = identity else { return };
        let Some(cache) = self.cache_for(path) else { return };
        if let Err(why) = cache.usable() {
            self.cache_refused(why);
            return;
        }
        if FileIdentity::of(path).ok().as_ref() != Some(identity) {
            return;
        }
        if let Err(e) = cache.put(path, identity, class, exports, wire) {
            self.say_once_about_the_cache(&format!("cannot keep descriptions in the cache: {e}"));
        }
    }

    /// A plugin library got its domain (`ward run --verbose` says so).
    pub(crate) fn domain_started(&self, path: &Path, class: &str, ext: &ward::Extension) {
        if self.verbose {
            let pid = ext.pid().map(|p| format!(", domain process {p}")).unwrap_or_default();
            self.say(&format!("{}: {class} plugin under ward (isolation {}{pid})", path.display(), ext.isolation()));
        }
    }

    /// A plugin library described in its class's describer domain, or, where that fails, opened in a domain of its
    /// own (which fails as it always did, with its own events, if the library is at fault).
    /// What it read is kept in the cache of descriptions (see [`Runtime::remember`]), never what failed.
    fn describe(
        &self,
        class: Class,
        path: &Path,
        identity: Option<&FileIdentity>,
        exports: &[String],
    ) -> Result<Plugin, ClassError> {
        let (before, described) = match class {
            // Hosts of LV2 read descriptions from the bundle and open a binary only to instantiate from it.
            Class::Lv2 => return self.open_at_once(class, path),
            Class::Ladspa => (
                self.ladspa_describer.domains_started(),
                ladspa::ProxyLibrary::described(&self.ladspa_describer, path, self.isolation)
                    .map(|(l, wire)| (Plugin::Ladspa(Arc::new(l)), wire)),
            ),
            Class::Frei0r => (
                self.frei0r_describer.domains_started(),
                frei0r::ProxyLibrary::described(&self.frei0r_describer, path, self.isolation)
                    .map(|(l, wire)| (Plugin::Frei0r(Arc::new(l)), wire)),
            ),
        };
        if self.verbose {
            let (started, pid) = match class {
                Class::Ladspa => (self.ladspa_describer.domains_started(), self.ladspa_describer.pid()),
                Class::Frei0r => (self.frei0r_describer.domains_started(), self.frei0r_describer.pid()),
                Class::Lv2 => (before, None),
            };
            if started != before {
                let pid = pid.map(|p| format!(" (domain process {p})")).unwrap_or_default();
                self.say(&format!(
                    "{} describer started{pid}: libraries the host only scans get no domain",
                    class.name()
                ));
            }
        }
        match described {
            Ok((plugin, wire)) => {
                self.remember(path, identity, class, exports, &wire);
                if self.verbose {
                    self.say(&format!(
                        "{}: {} plugin described under ward (its domain starts when the host first {})",
                        path.display(),
                        class.name(),
                        first_use(class),
                    ));
                }
                Ok(plugin)
            }
            Err(e) => {
                if self.verbose {
                    self.say(&format!("{}: not described by the describer ({e}): opened at once", path.display()));
                }
                self.open_at_once(class, path)
            }
        }
    }

    /// A plugin library opened at once in a domain of its own, which reads its descriptions.
    fn open_at_once(&self, class: Class, path: &Path) -> Result<Plugin, ClassError> {
        let (plugin, ext) = match class {
            Class::Ladspa => {
                let l = ladspa::ProxyLibrary::open(&self.supervisor, path, self.isolation)?;
                let ext = l.extension();
                (Plugin::Ladspa(Arc::new(l)), ext)
            }
            Class::Frei0r => {
                let l = frei0r::ProxyLibrary::open(&self.supervisor, path, self.isolation)?;
                let ext = l.extension();
                (Plugin::Frei0r(Arc::new(l)), ext)
            }
            Class::Lv2 => {
                let l = lv2::ProxyLibrary::open(&self.supervisor, path, self.isolation)?;
                let ext = l.extension();
                (Plugin::Lv2(Arc::new(l)), ext)
            }
        };
        if let Some(ext) = ext {
            self.domain_started(path, class.name(), &ext);
        }
        Ok(plugin)
    }

    pub(crate) fn plugin(&self, id: u64) -> Option<Plugin> {
        self.plugins.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned()
    }

    /// Report the recovery events so far: one line each on standard error (and in the log). Called after every
    /// proxied call, on the caller's thread, so nothing is lost when the host exits right after a recovery.
    pub(crate) fn report(&self) {
        let Ok(events) = self.events.try_lock() else { return };
        while let Ok(event) = events.try_recv() {
            if self.verbose || !event.is_informational() {
                self.say(&event.to_string());
            }
        }
    }

    /// [`Runtime::say`] under `ward run --verbose` only.
    pub(crate) fn verbose_say(&self, what: &str) {
        if self.verbose {
            self.say(what);
        }
    }

    /// One line on standard error and in the log.
    pub(crate) fn say(&self, what: &str) {
        let line = format!("ward: {what}\n");
        let _ = std::io::stderr().write_all(line.as_bytes());
        if let Some(log) = &self.log {
            let _ = log.lock().unwrap_or_else(|e| e.into_inner()).write_all(line.as_bytes());
        }
    }
}

/// What a host does first with a library of `class` that starts its domain.
fn first_use(class: Class) -> &'static str {
    match class {
        Class::Ladspa | Class::Lv2 => "instantiates one of its plugins",
        Class::Frei0r => "constructs an instance",
    }
}

/// At exit under `ward run --verbose`: how many libraries were described from the cache, if any.
extern "C" fn say_what_came_from_the_cache() {
    let Some(Ok(rt)) = RUNTIME.get() else { return };
    let [ladspa, frei0r] = [0, 1].map(|i| rt.from_cache[i].load(Ordering::Relaxed));
    if ladspa + frei0r == 0 {
        return;
    }
    let dir = rt.cache.dir().map(|d| d.display().to_string()).unwrap_or_default();
    rt.say(&format!(
        "{ladspa} LADSPA libraries and {frei0r} frei0r plugins were described from the cache in {dir}, with no \
         describer and none of their code loaded"
    ));
}

/// What becomes of a file the host opens.
pub(crate) enum Opened {
    /// Not ours: the real dlopen takes it.
    Native,
    /// A plugin under ward: the proxy's handle.
    Proxy(*mut c_void),
    /// Neither: the host's dlopen fails, and its dlerror says this.
    Refused(String),
}

/// Plugins refused so far, by canonical path, with the reason: each is refused again at once, and reported once.
static REFUSED: Mutex<Option<HashMap<PathBuf, String>>> = Mutex::new(None);

/// Why `path` was refused before, if it was. Its canonical path is looked for only when something was refused: a
/// host's scan opens a hundred libraries, and canonicalizing each costs a system call per component of its path.
fn refused_before(path: &Path) -> Option<String> {
    let refused = REFUSED.lock().unwrap_or_else(|e| e.into_inner());
    let refused = refused.as_ref().filter(|r| !r.is_empty())?;
    refused.get(&refusal_key(path)).cloned()
}

/// What a refusal is remembered by: the canonical path, so that another name of the same file is refused too.
fn refusal_key(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The host opens `path`. A plugin of a known class is opened under ward and the host gets a proxy; if that fails
/// for any reason the host gets a load error, never the plugin loaded without ward. A file ward cannot take (one it
/// cannot classify, a plugin of an ABI it has no class for) loads without ward unless the policy's
/// `native_fallback` says no; anything else is not ours.
pub(crate) fn open_plugin(path: &Path) -> Opened {
    if let Some(reason) = refused_before(path) {
        return Opened::Refused(dlerror_text(path, &reason));
    }
    // Described before and unchanged since: its class, entry points and descriptions come from the cache, and
    // nothing of the file is read (not even to classify it).
    let identity = FileIdentity::of(path).ok();
    if let (Some(identity), Ok(rt)) = (&identity, runtime_or_why()) {
        if let Some((class, entry_points, plugin)) = rt.described_from_cache(path, identity) {
            return hand_over(rt, path, class, Ok(plugin), &entry_points);
        }
    }
    let (class, exports) = match inspect(path).map(|i| (i.classification, i.exports)) {
        Ok((Classification::Plugin(class), exports)) => (class, exports),
        Ok((Classification::NotAPlugin, _)) => return Opened::Native,
        Ok((Classification::OtherPlugin { abi: "LV2 UI" }, _)) => {
            // A plugin's user interface runs in the host's GUI thread and talks to the plugin through the host:
            // ward leaves it alone for now (DECISIONS.md), and says so.
            if let Some(rt) = runtime_or_why().ok().filter(|rt| rt.verbose) {
                rt.say(&format!("{}: an LV2 UI, left alone: loaded without ward", path.display()));
            }
            return Opened::Native;
        }
        Ok((Classification::OtherPlugin { abi }, _)) => {
            return unless_fallback(path, &format!("a {abi} plugin, which ward has no class for"))
        }
        // No file there (hosts try each directory of a search path in turn): nothing is loaded, with ward or
        // without, and the real dlopen fails as it would natively. Nothing to say.
        Err(ClassifyError::Io { source, .. })
            if matches!(source.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) =>
        {
            return Opened::Native
        }
        Err(e) => return unless_fallback(path, &format!("ward cannot tell what it is ({e})")),
    };
    let rt = match runtime_or_why() {
        Ok(rt) => rt,
        Err(why) => return refuse(path, None, &why.to_string()),
    };
    let plugin = if rt.describes_apart(path) {
        rt.describe(class, path, identity.as_ref(), &exports)
    } else {
        rt.open_at_once(class, path)
    };
    hand_over(rt, path, class, plugin, &exports)
}

/// The host gets a proxy for `plugin`, the library at `path`, which exports `exports`; or, where opening it failed,
/// a load error.
fn hand_over(
    rt: &Runtime,
    path: &Path,
    class: Class,
    plugin: Result<Plugin, ClassError>,
    exports: &[String],
) -> Opened {
    let id = rt.next_id.fetch_add(1, Ordering::Relaxed);
    // The events of a failed open (faults, restarts) come first, then why it is refused.
    rt.report();
    let plugin = match plugin {
        Ok(p) => p,
        Err(e) => {
            let reason = format!("the {} plugin failed under ward, so it is not loaded at all: {e}", class.name());
            return refuse(path, Some(rt), &reason);
        }
    };
    rt.plugins.lock().unwrap_or_else(|e| e.into_inner()).insert(id, plugin);
    match proxy::load(class, id, exports) {
        Ok((handle, fd)) => {
            rt.proxies.lock().unwrap_or_else(|e| e.into_inner()).insert(handle as usize, (id, fd));
            rt.report();
            Opened::Proxy(handle)
        }
        Err(e) => {
            rt.plugins.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            refuse(path, Some(rt), &format!("ward cannot give the host a proxy for it ({e})"))
        }
    }
}

/// `path`, which ward cannot take for `reason`: loaded without ward, or refused where the policy's
/// `native_fallback` for it is false.
fn unless_fallback(path: &Path, reason: &str) -> Opened {
    let rt = runtime_or_why().ok();
    let fallback = rt.is_none_or(|rt| rt.policy.for_extension(&ward::extension_name(path)).native_fallback);
    if fallback {
        if let Some(rt) = rt.filter(|rt| rt.verbose) {
            rt.say(&format!("{}: loaded without ward: {reason}", path.display()));
        }
        return Opened::Native;
    }
    refuse(path, rt, &format!("{reason}; the policy says native_fallback = false"))
}

/// Refuse `path` for `reason`: said on standard error (and in the log) the first time, remembered for next time.
fn refuse(path: &Path, rt: Option<&Runtime>, reason: &str) -> Opened {
    let first = REFUSED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(refusal_key(path), reason.to_string())
        .is_none();
    if first {
        let line = format!("{}: not loaded: {reason}", path.display());
        match rt {
            Some(rt) => rt.say(&line),
            None => {
                let _ = std::io::stderr().write_all(format!("ward: {line}\n").as_bytes());
            }
        }
    }
    Opened::Refused(dlerror_text(path, reason))
}

/// What the host's `dlerror` says about a refused plugin.
fn dlerror_text(path: &Path, reason: &str) -> String {
    format!("{}: refused by ward: {reason}", path.display())
}

/// The host closes `handle`: if it is a proxy, its plugin is let go (instances the host still holds keep it alive).
/// Returns the descriptor of the proxy's copy, to be closed once the copy is unloaded.
pub(crate) fn closing(handle: *mut c_void) -> Option<OwnedFd> {
    let Some(Ok(rt)) = RUNTIME.get() else { return None };
    let (id, fd) = rt.proxies.lock().unwrap_or_else(|e| e.into_inner()).remove(&(handle as usize))?;
    let plugin = rt.plugins.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    if let (true, Some(plugin)) = (rt.verbose, plugin) {
        let (ext, path) = match &plugin {
            Plugin::Ladspa(l) => (l.extension(), l.path()),
            Plugin::Frei0r(l) => (l.extension(), l.path()),
            Plugin::Lv2(l) => (l.extension(), l.path()),
        };
        match ext {
            None => rt.say(&format!("{}: closed by the host (only described: no domain of its own)", path.display())),
            Some(ext) => {
                let stats = ext.stats();
                rt.say(&format!(
                    "{}: closed by the host ({} restarts, {} buffers lent in place)",
                    ext.name(),
                    stats.restarts,
                    stats.lent_in_place
                ));
            }
        }
    }
    Some(fd)
}
