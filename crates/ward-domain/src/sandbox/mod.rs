//! The sandbox of a process domain: what a hostile extension cannot do from inside it.
//!
//! First of all, before the descriptors are mapped, the domain enters a PID namespace of its own with a fresh
//! `/proc` ([`namespace`]): the host's processes are out of sight, and every process an extension forks ends with
//! the domain. Where the kernel refuses it, the domain goes on without (the host says so).
//!
//! Then, once, before any extension's code runs (its constructors included), it opens what its waits read later
//! (the run queue, `ward_xpc::runqueue`) and enters the sandbox, in this order; each step has its own error,
//! reported to the host like any other start-up failure:
//!
//! 1. **standard output detached** ([`SandboxError::Stdout`]): fd 1 becomes `/dev/null`, so nothing an extension
//!    prints lands in the host's output (a host may be writing its result to its standard output). Standard error
//!    stays: it is where ward's own diagnostics go.
//! 2. **no new privileges** ([`SandboxError::NoNewPrivs`]): no set-uid program or file capability ever raises it.
//! 3. **not dumpable** ([`SandboxError::Dumpable`]): no core dump, and processes of the same user cannot attach.
//! 4. **capabilities dropped** ([`SandboxError::Capabilities`]): ambient, bounding, effective, permitted and
//!    inheritable sets emptied (a host run as root gives its domains nothing).
//! 5. **Landlock** ([`SandboxError::Landlock`]): files read and executed everywhere, written nowhere but the paths
//!    the policy lists; no TCP bind or connect unless the policy allows network; no signal to a process outside the
//!    domain and no connection to an abstract Unix socket made outside it (kernel 6.12 and later); and, being
//!    Landlock-restricted, no `ptrace` or `/proc/PID/mem` of the host. Where the kernel lacks Landlock, or a part of
//!    it, that part is missing (the host says which, once) and the rest still holds.
//! 6. **system call filter** ([`SandboxError::Filter`]): seccomp, allow-list by default ([`syscalls`]); anything
//!    else raises `SIGSYS`, which the fault recorder reports to the host as a fault of the domain naming the call.
//!
//! A serving process adds a second, narrower filter ([`serving`]): no child processes, signals to itself only. An
//! incarnation's is only what the serving list changes from the zygote's, whose filter it inherits.
//! The zygote keeps the first, since it forks and watches its incarnations.

mod bpf;
#[allow(unsafe_code)]
pub mod namespace;
pub mod syscalls;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use landlock::{path_beneath_rules, Access, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, ABI};
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

pub use syscalls::{Loosen, Role};

/// The sandbox as the host asked for it (`--no-seccomp`, `--no-landlock`, `--allow`, `--writable`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// Install the system call filter.
    pub seccomp: bool,
    /// Restrict the filesystem, network and signals with Landlock.
    pub landlock: bool,
    /// Run in a PID namespace of its own ([`namespace`]).
    pub pid_namespace: bool,
    /// What the policy gives back.
    pub loosen: Loosen,
    /// Paths the extension may write beneath (Landlock); implies `loosen.writes`.
    pub writable: Vec<PathBuf>,
}

impl Config {
    /// Every protection on, nothing loosened.
    pub fn strict() -> Config {
        Config { seccomp: true, landlock: true, pid_namespace: true, loosen: Loosen::default(), writable: Vec::new() }
    }
}

/// A step of the sandbox that failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Pointing standard output at /dev/null failed.
    #[error("cannot detach standard output: {0}")]
    Stdout(std::io::Error),
    /// `PR_SET_NO_NEW_PRIVS` failed.
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
    /// `PR_SET_DUMPABLE` failed.
    #[error("cannot make the domain non-dumpable: {0}")]
    Dumpable(std::io::Error),
    /// Emptying the capability sets failed.
    #[error("cannot drop capabilities: {0}")]
    Capabilities(std::io::Error),
    /// Landlock refused the ruleset (not: the kernel lacks Landlock, which leaves that protection missing).
    #[error("cannot restrict files and network with Landlock: {0}")]
    Landlock(String),
    /// The system call filter could not be built or installed.
    #[error("cannot install the system call filter: {0}")]
    Filter(String),
}

/// Steps 1 to 4, which every domain takes whatever its configuration says (with the run queue opened first): a
/// spare takes them before its domain's setup comes (`template.rs`), any other domain process just before
/// [`confine`].
pub fn first_steps() -> Result<(), SandboxError> {
    // First, while files can still be opened: the waits for requests read the machine's run queue through a
    // descriptor kept open (`ward_xpc::runqueue`, with `pread`, which the filter allows), above the numbers a
    // spare's setup puts the shared memory on later. Where it cannot be opened they spin briefly only, and say so
    // in their statistics, which the host reports.
    let _ = ward_xpc::runqueue::open_above(crate::startup::FIRST_OWN_FD);
    detach_stdout()?;
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map_err(SandboxError::NoNewPrivs)?;
    prctl(libc::PR_SET_DUMPABLE, 0).map_err(SandboxError::Dumpable)?;
    drop_capabilities().map_err(SandboxError::Capabilities)
}

/// Steps 5 and 6 as `config` says, for the zygote or a serving process, after [`first_steps`].
pub fn confine(config: &Config, role: Role) -> Result<(), SandboxError> {
    if config.landlock {
        landlock(config)?;
    }
    if config.seccomp {
        filter(role, loosened(config))?;
    }
    Ok(())
}

/// The narrower filter of a process that serves calls, stacked on the zygote's after a fork: only where the serving
/// list differs from the zygote's, which stays in force ([`incarnation_filter`]). The zygote's fallback filter
/// (`ENOSYS`) is inherited too, and a second copy would answer the same.
pub fn serving(config: &Config, own: i32) -> Result<(), SandboxError> {
    if config.seccomp {
        let narrower = incarnation_program(own, loosened(config))?;
        seccompiler::apply_filter(&narrower).map_err(|e| filter_error("install", e))?;
    }
    Ok(())
}

fn loosened(config: &Config) -> Loosen {
    Loosen { writes: config.loosen.writes || !config.writable.is_empty(), ..config.loosen }
}

fn detach_stdout() -> Result<(), SandboxError> {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null").map_err(SandboxError::Stdout)?;
    // SAFETY: dup2 onto fd 1 only replaces this process's standard output; `null` stays owned and is closed when
    // dropped, fd 1 keeping its own reference to /dev/null.
    if unsafe { libc::dup2(null.as_raw_fd(), 1) } < 0 {
        return Err(SandboxError::Stdout(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn prctl(option: libc::c_int, value: libc::c_ulong) -> std::io::Result<()> {
    // SAFETY: PR_SET_NO_NEW_PRIVS and PR_SET_DUMPABLE take a number and no pointers.
    if unsafe { libc::prctl(option, value, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Empty the ambient and bounding sets, then the effective, permitted and inheritable ones.
fn drop_capabilities() -> std::io::Result<()> {
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes no pointers. EINVAL on kernels without ambient capabilities, which
    // then have none to clear.
    unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) };
    let mut cap = 0;
    loop {
        // SAFETY: PR_CAPBSET_READ takes a capability number, no pointers; a negative result past the last
        // capability ends the loop.
        let held = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) };
        if held < 0 {
            break;
        }
        if held == 1 {
            // SAFETY: PR_CAPBSET_DROP takes a capability number, no pointers.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
                let err = std::io::Error::last_os_error();
                // Without CAP_SETPCAP the bounding set cannot shrink; a process without it holds no capability
                // worth dropping there either (the capset below empties what it does hold).
                if err.raw_os_error() != Some(libc::EPERM) {
                    return Err(err);
                }
            }
        }
        cap += 1;
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset reads a version-3 header and two data structs (the 64 capability bits), both valid for the
    // call; emptying our own sets needs no privilege.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The Landlock ABI ward asks for: everything up to signal and abstract-socket scoping (6). An older kernel gets
/// what it supports (best effort), and the host reports the rest missing.
const LANDLOCK_ABI: ABI = ABI::V6;

fn landlock(config: &Config) -> Result<(), SandboxError> {
    let fail = |e: landlock::RulesetError| SandboxError::Landlock(e.to_string());
    let abi = LANDLOCK_ABI;
    let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi)).map_err(fail)?;
    if !config.loosen.network {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi)).map_err(fail)?;
    }
    let ruleset = ruleset.scope(Scope::from_all(abi)).map_err(fail)?;
    let mut created =
        ruleset.create().map_err(fail)?.add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi))).map_err(fail)?;
    if !config.writable.is_empty() {
        created = created.add_rules(path_beneath_rules(&config.writable, AccessFs::from_all(abi))).map_err(fail)?;
    }
    created.restrict_self().map_err(fail)?;
    Ok(())
}

/// The pid the filters are compiled with in place of the one they name (the serving process itself, or the host
/// the zygote must not signal): above any pid the kernel gives (`pid_max` is at most 2^22), and patched to the real
/// one at install ([`with_pid`]). A filter is plain data, so compiling it once per role and loosening and patching
/// the pid into a copy gives the program compiling it with the pid would (a test compares the two for every list).
const PID_PLACEHOLDER: i32 = 0x7A5D_C0DE;
// `PID_MAX_LIMIT` on 64-bit: no process has the placeholder's id.
const _: () = assert!(PID_PLACEHOLDER > 1 << 22);

/// Which filter, without the pid it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Zygote,
    Serving,
    /// What an incarnation stacks on the zygote's filter it inherits: only where the serving list differs from the
    /// zygote's ([`incarnation_filter`]).
    Incarnation,
}

/// Filters this process compiled, with the pid left as [`PID_PLACEHOLDER`]: compiled ahead by the template and by
/// the zygote ([`prepare`]), they are copied into every process forked from them, which only patch and install.
static COMPILED: Mutex<Vec<(Kind, Loosen, Arc<BpfProgram>)>> = Mutex::new(Vec::new());
/// The second filter ([`syscalls::NOT_IMPLEMENTED`]), the same for every role and loosening.
static FALLBACKS: OnceLock<Result<BpfProgram, String>> = OnceLock::new();

/// Compile the filters of `config` ahead (both roles), so that a process forked after this installs them without
/// compiling. The template calls it for the default sandbox, a zygote for its own before it forks incarnations.
pub fn prepare(config: &Config) -> Result<(), SandboxError> {
    if config.seccomp {
        let loosen = loosened(config);
        compiled(Kind::Zygote, loosen)?;
        compiled(Kind::Serving, loosen)?;
        compiled(Kind::Incarnation, loosen)?;
        fallbacks()?;
    }
    Ok(())
}

fn filter_error(what: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Filter(format!("{what}: {e}"))
}

/// The allow-list of `kind` with `loosen`, naming [`PID_PLACEHOLDER`]: compiled at the first call, then kept.
fn compiled(kind: Kind, loosen: Loosen) -> Result<Arc<BpfProgram>, SandboxError> {
    let mut cache = COMPILED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, _, program)) = cache.iter().find(|(k, l, _)| *k == kind && *l == loosen) {
        return Ok(program.clone());
    }
    let program = Arc::new(match kind {
        Kind::Zygote => compile(Role::Zygote { host: Some(PID_PLACEHOLDER) }, loosen)?,
        Kind::Serving => compile(Role::Serving { own: PID_PLACEHOLDER }, loosen)?,
        Kind::Incarnation => incarnation_filter(PID_PLACEHOLDER, loosen)?,
    });
    cache.push((kind, loosen, program.clone()));
    Ok(program)
}

/// The allow-list for `role` with `loosen`, compiled as it stands.
fn compile(role: Role, loosen: Loosen) -> Result<BpfProgram, SandboxError> {
    bpf::compile(&syscalls::allowed(role, loosen)).map_err(|e| filter_error("compile", e))
}

/// The filter an incarnation (pid `own`) stacks on the zygote's: for every call the two lists treat differently,
/// the serving list's answer (its conditions, or a trap for a call it lacks), and allow for the rest, which the
/// zygote's filter still decides. Filters stack to the strictest answer, so this and the zygote's answer exactly as
/// the whole serving list and the zygote's (a test runs both on every call), and this one is a few calls long: the
/// kernel installs it far faster, and runs it at every call the kernel cannot answer from its cache.
fn incarnation_filter(own: i32, loosen: Loosen) -> Result<BpfProgram, SandboxError> {
    let serving = syscalls::allowed(Role::Serving { own }, loosen);
    // Both zygote lists (with and without a host to spare): a call is left to the zygote's filter only where every
    // zygote's list answers it as the serving list does.
    let zygotes = [
        syscalls::allowed(Role::Zygote { host: None }, loosen),
        syscalls::allowed(Role::Zygote { host: Some(PID_PLACEHOLDER) }, loosen),
    ];
    let same_as_zygotes = |entry: &syscalls::Allowed| {
        zygotes.iter().all(|list| list.iter().any(|z| z.nr == entry.nr && z.when == entry.when))
    };
    let serving_numbers: Vec<i64> = serving.iter().map(|entry| entry.nr).collect();
    let differing: Vec<syscalls::Allowed> = serving.into_iter().filter(|entry| !same_as_zygotes(entry)).collect();
    let mut refused: Vec<i64> =
        zygotes.iter().flatten().map(|z| z.nr).filter(|nr| !serving_numbers.contains(nr)).collect();
    refused.sort_unstable();
    refused.dedup();
    bpf::compile_with(&differing, &refused, libc::SECCOMP_RET_ALLOW).map_err(|e| filter_error("compile", e))
}

fn fallbacks() -> Result<&'static BpfProgram, SandboxError> {
    let compiled = FALLBACKS.get_or_init(|| {
        let fallbacks = syscalls::NOT_IMPLEMENTED.iter().map(|&nr| (nr, Vec::new())).collect();
        let fallbacks = SeccompFilter::new(
            fallbacks,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            TargetArch::x86_64,
        )
        .map_err(|e| format!("fallbacks: {e}"))?;
        fallbacks.try_into().map_err(|e: seccompiler::BackendError| format!("compile: {e}"))
    });
    compiled.as_ref().map_err(|e| SandboxError::Filter(e.clone()))
}

/// A copy of `program` naming `pid` where it names [`PID_PLACEHOLDER`]: every comparison of an argument with the
/// placeholder (a jump on a constant) now compares with `pid`.
fn with_pid(program: &BpfProgram, pid: i32) -> BpfProgram {
    const CLASS: u16 = 0x07;
    const JMP: u16 = 0x05;
    const SOURCE: u16 = 0x08;
    const CONSTANT: u16 = 0x00;
    let mut patched = program.clone();
    for instruction in patched.iter_mut() {
        let compares_constant = instruction.code & CLASS == JMP && instruction.code & SOURCE == CONSTANT;
        if compares_constant && instruction.k == PID_PLACEHOLDER as u32 {
            instruction.k = pid as u32;
        }
    }
    patched
}

/// The allow-list `role` installs, from the compiled program of its kind.
fn program_for(role: Role, loosen: Loosen) -> Result<BpfProgram, SandboxError> {
    let (kind, pid) = match role {
        // The placeholder stands for `outside`, which is 1 in a namespace of its own (see `syscalls::allowed`).
        Role::Zygote { host } => (Kind::Zygote, host.unwrap_or(1)),
        Role::Serving { own } => (Kind::Serving, own),
    };
    Ok(with_pid(compiled(kind, loosen)?.as_ref(), pid))
}

/// The filter an incarnation with pid `own` stacks on its zygote's, from the compiled program.
fn incarnation_program(own: i32, loosen: Loosen) -> Result<BpfProgram, SandboxError> {
    Ok(with_pid(compiled(Kind::Incarnation, loosen)?.as_ref(), own))
}

fn filter(role: Role, loosen: Loosen) -> Result<(), SandboxError> {
    let allow_list = program_for(role, loosen)?;
    // Every filter runs and the kernel takes the strictest answer (SIGSYS over ENOSYS over allow): the allow-list
    // lets clone3 and openat2 through, so the fallback filter's ENOSYS is what the caller gets.
    seccompiler::apply_filter(fallbacks()?).map_err(|e| filter_error("install", e))?;
    seccompiler::apply_filter(&allow_list).map_err(|e| filter_error("install", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every loosening there is.
    fn every_loosening() -> impl Iterator<Item = Loosen> {
        (0..16u8).map(|bits| Loosen {
            network: bits & 1 != 0,
            exec: bits & 2 != 0,
            fork: bits & 4 != 0,
            writes: bits & 8 != 0,
        })
    }

    #[test]
    fn an_incarnation_on_its_zygotes_filter_answers_as_the_whole_serving_list_on_it() {
        // The kernel's answer of stacked filters: the strictest action (KILL_PROCESS is negative as an i32).
        let strictest = |a: u32, b: u32| if (a & 0xffff_0000) as i32 <= (b & 0xffff_0000) as i32 { a } else { b };
        let x86 = 62 | 0x8000_0000 | 0x4000_0000;
        let own = 3;
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let values = [0u64, 1, 2, 3, 4, 4242, u64::from(u32::MAX), libc::CLONE_THREAD as u64, 0x8000_0000];
        for loosen in every_loosening() {
            let serving = program_for(Role::Serving { own }, loosen).expect("compiles");
            let narrower = incarnation_program(own, loosen).expect("compiles");
            assert!(narrower.len() * 4 < serving.len(), "{loosen:?}: the stacked filter is not short");
            for zygote in [Role::Zygote { host: None }, Role::Zygote { host: Some(4242) }] {
                let zygote = program_for(zygote, loosen).expect("compiles");
                for nr in 0..470u32 {
                    for _ in 0..40 {
                        let args = std::array::from_fn(|_| match next() % 3 {
                            0 => next(),
                            _ => values[(next() % values.len() as u64) as usize],
                        });
                        let run = |program: &BpfProgram| bpf::tests::run(program, nr, x86, args);
                        assert_eq!(
                            strictest(run(&zygote), run(&narrower)),
                            strictest(run(&zygote), run(&serving)),
                            "{loosen:?}: system call {nr} with {args:x?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_filter_compiled_once_and_patched_equals_one_compiled_for_the_pid() {
        for loosen in every_loosening() {
            for role in [
                Role::Zygote { host: None },
                Role::Zygote { host: Some(4242) },
                Role::Serving { own: 2 },
                Role::Serving { own: 3 },
                Role::Serving { own: 4_194_303 },
            ] {
                let direct = compile(
                    match role {
                        Role::Zygote { host: None } => Role::Zygote { host: Some(1) },
                        other => other,
                    },
                    loosen,
                )
                .expect("compiles");
                let patched = program_for(role, loosen).expect("compiles");
                let same = direct.len() == patched.len()
                    && direct.iter().zip(&patched).all(|(a, b)| (a.code, a.jt, a.jf, a.k) == (b.code, b.jt, b.jf, b.k));
                assert!(same, "{role:?} with {loosen:?}: the patched program differs from the one compiled for it");
            }
        }
    }
}
