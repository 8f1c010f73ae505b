//! Transforms run by a ward runtime (`ward_classes::runtime`): compiled from the uploaded source inside the
//! runtime's domain, called with the runtime's quantum; a transform that faults is unlinked and its request answered
//! with a 502, and the server and the other transforms go on.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use ward::{Arg, FaultKind, Isolation, Policy, RetType, Supervisor};
use ward_classes::runtime::{Code, Runtime, RuntimeError, RuntimeOptions, Severity};

use crate::image::Image;
use crate::native::WARD_IMAGE_H;
use crate::transforms::{check_upload, ApplyError, Fault, InstallError, RemoveError, Transforms};

/// The runtime's name, as a policy file's `[extension.imaged]` section names it.
pub const RUNTIME_NAME: &str = "imaged";

/// The transforms of a pool of ward runtimes: each transform is linked into every runtime of the pool, and each
/// request goes to the next runtime in turn. A process domain serves one call at a time, so a pool of one per
/// processor is what lets requests run in parallel, as they do natively (an mpk or `none` runtime runs calls from
/// several threads at once, and needs one).
pub struct WardTransforms {
    runtimes: Vec<Runtime>,
    /// The transforms linked into every runtime (requests see a transform only once it is in all of them).
    installed: RwLock<HashSet<String>>,
    /// Installs and removals, one at a time.
    changing: Mutex<()>,
    next: AtomicUsize,
    // Kept for as long as the runtimes: it owns the event bus and the policy their domains report to.
    _supervisor: Supervisor,
}

impl WardTransforms {
    /// `runtimes` runtimes (at least one) of the given isolation under `policy`, whose plugin calls have `quantum`.
    pub fn new(
        policy: Policy,
        isolation: Isolation,
        quantum: Duration,
        runtimes: usize,
    ) -> Result<WardTransforms, RuntimeError> {
        let supervisor = Supervisor::new(policy);
        let options = RuntimeOptions { isolation: Some(isolation), quantum, ..RuntimeOptions::default() };
        let mut pool = Vec::with_capacity(runtimes.max(1));
        for _ in 0..runtimes.max(1) {
            let runtime = Runtime::open(&supervisor, RUNTIME_NAME, &options)?;
            runtime.header("ward_image.h", WARD_IMAGE_H)?;
            pool.push(runtime);
        }
        Ok(WardTransforms {
            runtimes: pool,
            installed: RwLock::new(HashSet::new()),
            changing: Mutex::new(()),
            next: AtomicUsize::new(0),
            _supervisor: supervisor,
        })
    }

    /// The pool's size a server on this machine wants for `isolation`: one per processor for process domains, one
    /// for the others.
    pub fn default_pool(isolation: Isolation) -> usize {
        match isolation {
            Isolation::Process => std::thread::available_parallelism().map_or(1, |n| n.get()),
            _ => 1,
        }
    }

    /// The pool's runtimes, for benchmarks and tests.
    pub fn runtimes(&self) -> &[Runtime] {
        &self.runtimes
    }

    /// Takes `name` out of every runtime of the pool (those that hold it) and out of the installed set.
    fn forget(&self, name: &str) {
        self.installed.write().unwrap_or_else(|e| e.into_inner()).remove(name);
        for runtime in &self.runtimes {
            match runtime.delete(name) {
                Ok(()) | Err(RuntimeError::NoSuchPlugin { .. }) => {}
                Err(e) => tracing::warn!(transform = name, error = %e, "removing a transform from a runtime"),
            }
        }
    }
}

fn fault_of(fault: &ward::Fault) -> Fault {
    match fault.kind {
        FaultKind::Timeout { deadline } => Fault::TimedOut(u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX)),
        _ => Fault::Crashed(fault.to_string()),
    }
}

/// What the server answers for a runtime's refusal; `later` when an earlier runtime of the pool took the same source.
fn install_error(name: &str, e: RuntimeError, later: bool) -> InstallError {
    let backend = |e: RuntimeError| InstallError::Backend { name: name.to_owned(), reason: e.to_string() };
    if later {
        return backend(e);
    }
    match e {
        RuntimeError::Exists { .. } => InstallError::NameTaken(name.to_owned()),
        RuntimeError::Compile { first, all, .. } => {
            if first.file.is_none() && first.message.starts_with("no function named") {
                return InstallError::MissingFunction { name: name.to_owned() };
            }
            let errors: Vec<String> =
                all.iter().filter(|d| d.severity == Severity::Error).map(ToString::to_string).collect();
            InstallError::Compile { name: name.to_owned(), message: errors.join("\n") }
        }
        RuntimeError::CompilerFault { fault, .. } => InstallError::Compile {
            name: name.to_owned(),
            message: format!("the compiler failed on this source ({fault}); the server goes on without it"),
        },
        RuntimeError::BadArguments { reason, .. } => InstallError::InvalidSource { name: name.to_owned(), reason },
        other => backend(other),
    }
}

impl Transforms for WardTransforms {
    fn install(&self, name: &str, source: &str) -> Result<(), InstallError> {
        check_upload(name, source)?;
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        for (i, runtime) in self.runtimes.iter().enumerate() {
            if let Err(e) = runtime.create(name, Code::Source(source)) {
                // What the first runtime refused, all would; a later one failing is the machinery's failure.
                for earlier in &self.runtimes[..i] {
                    let _ = earlier.delete(name);
                }
                return Err(install_error(name, e, i > 0));
            }
        }
        self.installed.write().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned());
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<(), RemoveError> {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        if !self.installed.read().unwrap_or_else(|e| e.into_inner()).contains(name) {
            return Err(RemoveError::Unknown(name.to_owned()));
        }
        self.forget(name);
        Ok(())
    }

    fn apply(&self, name: &str, image: &Image) -> Result<Image, ApplyError> {
        if !self.installed.read().unwrap_or_else(|e| e.into_inner()).contains(name) {
            return Err(ApplyError::Unknown(name.to_owned()));
        }
        let runtime = &self.runtimes[self.next.fetch_add(1, Ordering::Relaxed) % self.runtimes.len()];
        let id = runtime.lookup(name).ok_or_else(|| ApplyError::Unknown(name.to_owned()))?;
        let mut out = vec![0u8; image.output_capacity()];
        // Cannot truncate: sides are at most 2^16 and the capacity at most 16 + 3 * 2^32.
        let (width, height, capacity) = (image.width() as i64, image.height() as i64, out.len() as i64);
        let returned = runtime.call(
            id,
            &mut [Arg::In(image.pixels()), Arg::I64(width), Arg::I64(height), Arg::Out(&mut out), Arg::I64(capacity)],
            RetType::I64,
        );
        let returned = match returned {
            Ok(value) => value.as_i64().unwrap_or(-1),
            Err(RuntimeError::PluginFault { fault, .. }) => {
                // The runtime it failed in unlinked it; the pool's others let it go too.
                let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
                self.forget(name);
                return Err(ApplyError::Fault { name: name.to_owned(), fault: fault_of(&fault) });
            }
            // Deleted (or unlinked after another request's fault) since the lookup.
            Err(RuntimeError::StalePlugin { .. }) => return Err(ApplyError::Unknown(name.to_owned())),
            Err(e) => return Err(ApplyError::Backend { name: name.to_owned(), reason: e.to_string() }),
        };
        Image::from_transform_output(&out, returned)
            .map_err(|e| ApplyError::Fault { name: name.to_owned(), fault: Fault::BadOutput(e) })
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.installed.read().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect();
        names.sort();
        names
    }

    fn describe(&self) -> String {
        format!(
            "{} ward runtime{} (isolation {}, compiled by libtcc in each runtime's domain)",
            self.runtimes.len(),
            if self.runtimes.len() == 1 { "" } else { "s" },
            self.runtimes[0].isolation()
        )
    }
}
