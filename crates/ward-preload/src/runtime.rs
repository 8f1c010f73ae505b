//! The shim's state: one supervisor for the host process, the plugins opened under it, and the proxies handed out.

use std::collections::HashMap;
use std::ffi::c_void;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, OnceLock};

use ward::{Event, Isolation, Policy, Supervisor};
use ward_classes::{class_of, Class};

use crate::{frei0r, ladspa, proxy};

/// A plugin library opened under ward, as the proxies see it.
#[derive(Clone)]
pub(crate) enum Plugin {
    Ladspa(Arc<ladspa::ProxyLibrary>),
    Frei0r(Arc<frei0r::ProxyLibrary>),
}

pub(crate) struct Runtime {
    supervisor: Supervisor,
    isolation: Option<Isolation>,
    plugins: Mutex<HashMap<u64, Plugin>>,
    /// Proxy handles given to the host, and the plugin each stands for.
    proxies: Mutex<HashMap<usize, u64>>,
    next_id: AtomicU64,
    events: Mutex<Receiver<Event>>,
    log: Option<Mutex<std::fs::File>>,
    /// Say which plugins are put under ward (`ward run --verbose`).
    verbose: bool,
}

static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();

/// The runtime, set up from the environment on first use; `None` (after one message) when the environment is
/// unusable, in which case plugins load natively.
pub(crate) fn get() -> Option<&'static Runtime> {
    RUNTIME
        .get_or_init(|| match Runtime::from_env() {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("ward: {e}; plugins load without ward");
                None
            }
        })
        .as_ref()
}

impl Runtime {
    fn from_env() -> Result<Runtime, String> {
        let isolation = match std::env::var("WARD_ISOLATION") {
            Ok(s) if !s.is_empty() => Some(s.parse::<Isolation>().map_err(|e| format!("WARD_ISOLATION: {e}"))?),
            _ => None,
        };
        let policy = match std::env::var_os("WARD_POLICY") {
            Some(p) if !p.is_empty() => Policy::from_file(Path::new(&p)).map_err(|e| e.to_string())?,
            _ => Policy::default(),
        };
        let log = match std::env::var_os("WARD_LOG") {
            Some(p) if !p.is_empty() => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&p)
                    .map_err(|e| format!("cannot open the log {}: {e}", PathBuf::from(&p).display()))?;
                Some(Mutex::new(file))
            }
            _ => None,
        };
        let supervisor = Supervisor::new(policy);
        let events = Mutex::new(supervisor.subscribe());
        Ok(Runtime {
            supervisor,
            isolation,
            plugins: Mutex::new(HashMap::new()),
            proxies: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            events,
            log,
            verbose: std::env::var_os("WARD_VERBOSE").is_some_and(|v| v == "1"),
        })
    }

    pub(crate) fn plugin(&self, id: u64) -> Option<Plugin> {
        self.plugins.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned()
    }

    /// Report the recovery events so far: one line each on standard error (and in the log). Called after every
    /// proxied call, on the caller's thread, so nothing is lost when the host exits right after a recovery.
    pub(crate) fn report(&self) {
        let Ok(events) = self.events.try_lock() else { return };
        while let Ok(event) = events.try_recv() {
            self.say(&event.to_string());
        }
    }

    /// One line on standard error and in the log.
    fn say(&self, what: &str) {
        let line = format!("ward: {what}\n");
        let _ = std::io::stderr().write_all(line.as_bytes());
        if let Some(log) = &self.log {
            let _ = log.lock().unwrap_or_else(|e| e.into_inner()).write_all(line.as_bytes());
        }
    }
}

/// The host opens `path`: if it is a plugin of a known class, open it under ward and return the proxy's handle.
/// `None`: not ours, the real dlopen takes it.
pub(crate) fn open_plugin(path: &Path) -> Option<*mut c_void> {
    let class = class_of(path)?;
    let rt = get()?;
    let id = rt.next_id.fetch_add(1, Ordering::Relaxed);
    let plugin = match class {
        Class::Ladspa => ladspa::ProxyLibrary::open(&rt.supervisor, path, rt.isolation).map(|l| {
            let ext = l.extension();
            (ext.isolation(), ext.pid(), Plugin::Ladspa(Arc::new(l)))
        }),
        Class::Frei0r => frei0r::ProxyLibrary::open(&rt.supervisor, path, rt.isolation).map(|l| {
            let ext = l.extension();
            (ext.isolation(), ext.pid(), Plugin::Frei0r(Arc::new(l)))
        }),
    };
    let plugin = match plugin {
        Ok((isolation, pid, p)) => {
            if rt.verbose {
                let pid = pid.map(|p| format!(", domain process {p}")).unwrap_or_default();
                rt.say(&format!("{}: {} plugin under ward (isolation {isolation}{pid})", path.display(), class.name()));
            }
            p
        }
        Err(e) => {
            eprintln!("ward: cannot put {} under ward ({e}); loading it without ward", path.display());
            return None;
        }
    };
    rt.plugins.lock().unwrap_or_else(|e| e.into_inner()).insert(id, plugin);
    match proxy::load(class, id) {
        Ok(handle) => {
            rt.proxies.lock().unwrap_or_else(|e| e.into_inner()).insert(handle as usize, id);
            rt.report();
            Some(handle)
        }
        Err(e) => {
            rt.plugins.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            eprintln!("ward: cannot give the host a proxy for {} ({e}); loading it without ward", path.display());
            None
        }
    }
}

/// The host closes `handle`: if it is a proxy, its plugin is let go (instances the host still holds keep it alive).
pub(crate) fn closing(handle: *mut c_void) {
    let Some(Some(rt)) = RUNTIME.get() else { return };
    let id = rt.proxies.lock().unwrap_or_else(|e| e.into_inner()).remove(&(handle as usize));
    if let Some(id) = id {
        let plugin = rt.plugins.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        if let (true, Some(plugin)) = (rt.verbose, plugin) {
            let ext = match &plugin {
                Plugin::Ladspa(l) => l.extension(),
                Plugin::Frei0r(l) => l.extension(),
            };
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
