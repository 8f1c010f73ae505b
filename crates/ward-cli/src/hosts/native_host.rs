//! The native side of the demo: a host that loads faulty.so directly, as hosts do without ward.
//!
//! `ward __native-host PATH KIND` is that host, run as a child so whatever the fault does ends there. It prints one
//! line on stdout: `ok 37`, `returned -1`, or `corrupted 42->0x... returned 37`; a setup failure prints
//! `error ...` and exits with [`SETUP_FAILED`]. [`run`] starts one and says how it ended.

use std::ffi::{c_void, CStr, CString, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::faulty_scenario;
use crate::hosts::child::{self, End};

/// A host with ordinary limits: the memory bomb and the descriptor leak end instead of eating the machine.
const HOST_ADDRESS_SPACE: u64 = 512 << 20;
/// How long a native host may run before it counts as hung.
pub const BOUND: Duration = Duration::from_secs(5);
/// Exit status of a child host that could not even set itself up.
pub const SETUP_FAILED: i32 = 125;

/// A shared object opened with dlopen in this process.
pub struct NativeLib {
    handle: *mut c_void,
    path: String,
}

impl NativeLib {
    pub fn open(path: &Path) -> Result<NativeLib> {
        let c = CString::new(path.as_os_str().as_bytes())
            .with_context(|| format!("{} contains a NUL byte", path.display()))?;
        // SAFETY: `c` is a valid NUL-terminated path; loading runs the object's constructors, which is the point.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            bail!("cannot dlopen {}: {}", path.display(), dlerror());
        }
        Ok(NativeLib { handle, path: path.display().to_string() })
    }

    /// The address of `name`.
    pub fn symbol(&self, name: &str) -> Result<*const c_void> {
        let c = CString::new(name).context("symbol name contains a NUL byte")?;
        // SAFETY: `handle` came from a successful dlopen and is never closed; `c` is NUL-terminated.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        if p.is_null() {
            bail!("symbol {name} not found in {}", self.path);
        }
        Ok(p as *const c_void)
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on this thread.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (see above), and copied out at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Give this process the limits of an ordinary host (with the demo's address space), no core files, and the default
/// action for SIGSEGV/SIGBUS.
pub fn become_ordinary_host() -> Result<()> {
    crate::hosts::ordinary::become_ordinary_host(HOST_ADDRESS_SPACE)
}

/// The child: load, run the scenario, report. Does not return when the fault takes the process down.
pub fn host_main(path: &Path, kind: i64) -> Result<bool> {
    let line = match scenario(path, kind) {
        Ok(line) => line,
        Err(e) => {
            println!("error {e:#}");
            std::process::exit(SETUP_FAILED);
        }
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).context("cannot write the result")?;
    Ok(true)
}

type Add = unsafe extern "C" fn(i64) -> i64;
type Arm = unsafe extern "C" fn(i64, i64);
type Compute = unsafe extern "C" fn(i64) -> i64;

fn scenario(path: &Path, kind: i64) -> Result<String> {
    become_ordinary_host()?;
    let lib = NativeLib::open(path)?;
    let (add, arm, compute) =
        (lib.symbol("faulty_counter_add")?, lib.symbol("faulty_arm")?, lib.symbol("faulty_compute")?);
    // SAFETY: faulty.c defines `int64_t faulty_counter_add(int64_t)`.
    let add = unsafe { std::mem::transmute::<*const c_void, Add>(add) };
    // SAFETY: faulty.c defines `void faulty_arm(int64_t, int64_t)`.
    let arm = unsafe { std::mem::transmute::<*const c_void, Arm>(arm) };
    // SAFETY: faulty.c defines `int64_t faulty_compute(int64_t)`.
    let compute = unsafe { std::mem::transmute::<*const c_void, Compute>(compute) };

    // The host's own data, on the heap like most host state; a wild write aims at it.
    let host_value = Box::new(AtomicI64::new(faulty_scenario::HOST_VALUE));
    let arm_arg =
        if kind == faulty_scenario::WILD_WRITE { host_value.as_ptr() as i64 } else { faulty_scenario::DEFAULT_ARM_ARG };
    // SAFETY: the calls match the signatures above; what the armed fault then does to this process is the point
    // of this throwaway host.
    let result = unsafe {
        for d in faulty_scenario::ADDS {
            add(d);
        }
        arm(kind, arm_arg);
        compute(faulty_scenario::COMPUTE_ARG)
    };
    let now = host_value.load(Ordering::SeqCst);
    Ok(if now != faulty_scenario::HOST_VALUE {
        format!("corrupted {}->{now:#x} returned {result}", faulty_scenario::HOST_VALUE)
    } else if result == faulty_scenario::COMPUTE_EXPECTED {
        format!("ok {result}")
    } else {
        format!("returned {result}")
    })
}

/// What happened to the native host, in words.
#[derive(Debug, Clone)]
pub struct NativeOutcome {
    pub text: String,
    /// The host process died or hung.
    pub host_lost: bool,
}

/// Run the native host for `kind` and judge it.
pub fn run(path: &Path, kind: i64) -> Result<NativeOutcome> {
    let args: Vec<OsString> = vec!["__native-host".into(), path.as_os_str().to_owned(), kind.to_string().into()];
    let run = child::run_bounded(&args, &[], BOUND)?;
    let line = run.stdout.lines().next().unwrap_or("").trim().to_string();
    if let Some(msg) = line.strip_prefix("error ") {
        bail!("the native host could not start: {msg}");
    }
    match run.end {
        End::Exited(0) => Ok(NativeOutcome { text: judge_line(&line)?, host_lost: false }),
        End::Exited(SETUP_FAILED) | End::Exited(2) => {
            Err(anyhow!("the native host could not start: {}", run.stderr.trim()))
        }
        end => Ok(NativeOutcome { text: child::describe_death(end), host_lost: true }),
    }
}

fn judge_line(line: &str) -> Result<String> {
    if let Some(rest) = line.strip_prefix("corrupted ") {
        let change = rest.split(" returned").next().unwrap_or(rest);
        return Ok(format!("host data corrupted silently ({})", change.replace("->", " -> ")));
    }
    if let Some(v) = line.strip_prefix("ok ") {
        return Ok(format!("ran normally (returned {v})"));
    }
    if let Some(v) = line.strip_prefix("returned ") {
        return Ok(format!("no visible effect (returned {v})"));
    }
    bail!("the native host printed something unexpected: {line:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_the_hosts_line() {
        assert_eq!(
            judge_line("corrupted 42->0x5741524457415244 returned 37").unwrap(),
            "host data corrupted silently (42 -> 0x5741524457415244)"
        );
        assert_eq!(judge_line("returned -1").unwrap(), "no visible effect (returned -1)");
        assert!(judge_line("garbage").is_err());
    }
}
