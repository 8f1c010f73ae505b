//! Transforms run by a ward runtime (`ward_classes::runtime`): compiled from the uploaded source inside the
//! runtime's domain, called with the runtime's quantum; a transform that faults is unlinked and its request answered
//! with a 502, and the server and the other transforms go on.

use std::time::Duration;

use ward::{Arg, FaultKind, Isolation, Policy, RetType, Supervisor};
use ward_classes::runtime::{Code, Runtime, RuntimeError, RuntimeOptions, Severity};

use crate::image::Image;
use crate::native::WARD_IMAGE_H;
use crate::transforms::{check_name, ApplyError, Fault, InstallError, RemoveError, Transforms};

/// The runtime's name, as a policy file's `[extension.imaged]` section names it.
pub const RUNTIME_NAME: &str = "imaged";

/// The transforms of one ward runtime.
pub struct WardTransforms {
    runtime: Runtime,
    // Kept for as long as the runtime: it owns the event bus and the policy the runtime's domain reports to.
    _supervisor: Supervisor,
}

impl WardTransforms {
    /// A runtime of the given isolation under `policy`, whose plugin calls have `quantum`.
    pub fn new(policy: Policy, isolation: Isolation, quantum: Duration) -> Result<WardTransforms, RuntimeError> {
        let supervisor = Supervisor::new(policy);
        let options = RuntimeOptions { isolation: Some(isolation), quantum, ..RuntimeOptions::default() };
        let runtime = Runtime::open(&supervisor, RUNTIME_NAME, &options)?;
        runtime.header("ward_image.h", WARD_IMAGE_H)?;
        Ok(WardTransforms { runtime, _supervisor: supervisor })
    }

    /// The runtime, for benchmarks and tests.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }
}

fn fault_of(fault: &ward::Fault) -> Fault {
    match fault.kind {
        FaultKind::Timeout { deadline } => Fault::TimedOut(u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX)),
        _ => Fault::Crashed(fault.to_string()),
    }
}

impl Transforms for WardTransforms {
    fn install(&self, name: &str, source: &str) -> Result<(), InstallError> {
        check_name(name)?;
        if source.contains('\0') {
            return Err(InstallError::InvalidSource {
                name: name.to_owned(),
                reason: "the source has a NUL byte".into(),
            });
        }
        match self.runtime.create(name, Code::Source(source)) {
            Ok(_) => Ok(()),
            Err(RuntimeError::Exists { .. }) => Err(InstallError::NameTaken(name.to_owned())),
            Err(RuntimeError::Compile { first, all, .. }) => {
                if first.file.is_none() && first.message.starts_with("no function named") {
                    return Err(InstallError::MissingFunction { name: name.to_owned() });
                }
                let errors: Vec<String> =
                    all.iter().filter(|d| d.severity == Severity::Error).map(ToString::to_string).collect();
                Err(InstallError::Compile { name: name.to_owned(), message: errors.join("\n") })
            }
            Err(RuntimeError::CompilerFault { fault, .. }) => Err(InstallError::Compile {
                name: name.to_owned(),
                message: format!("the compiler failed on this source ({fault}); the server goes on without it"),
            }),
            Err(RuntimeError::BadArguments { reason, .. }) => {
                Err(InstallError::InvalidSource { name: name.to_owned(), reason })
            }
            Err(e) => Err(InstallError::Backend { name: name.to_owned(), reason: e.to_string() }),
        }
    }

    fn remove(&self, name: &str) -> Result<(), RemoveError> {
        match self.runtime.delete(name) {
            Ok(()) => Ok(()),
            Err(RuntimeError::NoSuchPlugin { .. }) => Err(RemoveError::Unknown(name.to_owned())),
            Err(e) => Err(RemoveError::Backend { name: name.to_owned(), reason: e.to_string() }),
        }
    }

    fn apply(&self, name: &str, image: &Image) -> Result<Image, ApplyError> {
        let id = self.runtime.lookup(name).ok_or_else(|| ApplyError::Unknown(name.to_owned()))?;
        let mut out = vec![0u8; image.output_capacity()];
        // Cannot truncate: sides are at most 2^16 and the capacity at most 16 + 3 * 2^32.
        let (width, height, capacity) = (image.width() as i64, image.height() as i64, out.len() as i64);
        let returned = self.runtime.call(
            id,
            &mut [Arg::In(image.pixels()), Arg::I64(width), Arg::I64(height), Arg::Out(&mut out), Arg::I64(capacity)],
            RetType::I64,
        );
        let returned = match returned {
            Ok(value) => value.as_i64().unwrap_or(-1),
            Err(RuntimeError::PluginFault { fault, .. }) => {
                return Err(ApplyError::Fault { name: name.to_owned(), fault: fault_of(&fault) })
            }
            // Deleted (or unlinked after another request's fault) since the lookup.
            Err(RuntimeError::StalePlugin { .. }) => return Err(ApplyError::Unknown(name.to_owned())),
            Err(e) => return Err(ApplyError::Backend { name: name.to_owned(), reason: e.to_string() }),
        };
        Image::from_transform_output(&out, returned)
            .map_err(|e| ApplyError::Fault { name: name.to_owned(), fault: Fault::BadOutput(e) })
    }

    fn names(&self) -> Vec<String> {
        self.runtime.plugins()
    }

    fn describe(&self) -> String {
        format!("a ward runtime (isolation {}, compiled by libtcc in the runtime's domain)", self.runtime.isolation())
    }
}
