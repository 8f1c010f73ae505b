//! The template: one `ward-domain` process per monitor thread (so per supervisor), exec'd once and kept at the
//! point where nothing domain-specific has happened, from which each new domain process is forked instead of
//! exec'd. The exec, the dynamic linking of `ward-domain` and its runtime's start are then paid once per supervisor
//! instead of once per domain; everything of the domain (cgroup, namespaces, sandbox, loading) runs after the fork,
//! in the same code an exec'd domain runs (`ward-domain`'s `template.rs` says how).
//!
//! The host queues the domain's command line and shared memory on the domain's own control socket, then hands the
//! template only that socket (`start`); the template forks and closes it, so it never holds anything of a domain.
//! The fork's parent is the host (`CLONE_PARENT`), as a spawned domain's is: the host reaps it, and the template
//! may die without taking a domain with it.
//!
//! A template is used only when the domain would be exec'd with what the template was exec'd with: the same program
//! and environment, and the same working directory, credentials, capabilities, system call filters, umask, CPU
//! affinity, cgroup, namespaces, resource limits and scheduling (what a process inherits at exec and `ward-domain`
//! does not set itself; [`Inheritance`]). Otherwise it is replaced. A domain with a preload of its
//! own (policy `library_fault`) is always exec'd. A template that died, does not answer within [`ANSWER_TIMEOUT`],
//! or refuses is killed and the domain exec'd (said once, at debug level); the next start starts a new template, up
//! to [`GIVE_UP_AFTER`] failures in a row, after which domains start by exec.
//! `WARD_DOMAIN_TEMPLATE=off` in the host's environment execs every domain.
//!
//! The template lives in a thread-local of the monitor thread, which starts every domain process: the death signal
//! of the template and of every process forked from it follows that thread, as a spawned domain's does, and the
//! template goes when the thread does. A fork of the host never reaches it (the process id is checked).

use std::cell::RefCell;
use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use ward_xpc::control::{ControlSocket, MAX_CONTROL_MESSAGE};

use super::spawn::{self, DomainChild};

/// How long the template may take to answer a `start` (a fork): generous, for a loaded machine.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The host's environment variable that turns the template off (`off`): every domain is exec'd.
pub const ENV_VAR: &str = "WARD_DOMAIN_TEMPLATE";

/// What a process started by exec inherits from the thread that starts it and `ward-domain` does not set itself:
/// a template serves only domains that would inherit the same.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inheritance {
    program: PathBuf,
    env: Vec<OsString>,
    cwd: Option<PathBuf>,
    /// The lines of `/proc/thread-self/status` that say what a child inherits ([`STATUS_LINES`]).
    status: Vec<String>,
    cgroup: String,
    /// The namespaces a child would be in ([`NAMESPACES`]).
    namespaces: Vec<Option<PathBuf>>,
    limits: Vec<(u64, u64)>,
    /// Nice value and scheduling policy.
    scheduling: (i32, i32),
}

/// Credentials, capabilities, system call filters, `no_new_privs`, CPU affinity, umask.
const STATUS_LINES: [&str; 13] = [
    "Umask:",
    "Uid:",
    "Gid:",
    "Groups:",
    "CapInh:",
    "CapPrm:",
    "CapEff:",
    "CapBnd:",
    "CapAmb:",
    "NoNewPrivs:",
    "Seccomp:",
    "Seccomp_filters:",
    "Cpus_allowed:",
];

const NAMESPACES: [&str; 7] = ["mnt", "pid_for_children", "net", "ipc", "uts", "user", "cgroup"];

thread_local! {
    /// This thread's namespaces, read once: only the thread itself can change them (`unshare` and `setns` act on
    /// the caller), and the monitor thread, which starts every domain, runs only ward's code, which does neither.
    /// Everything else compared can be changed from another thread, and is read at every start.
    static THREAD_NAMESPACES: std::cell::OnceCell<Vec<Option<PathBuf>>> = const { std::cell::OnceCell::new() };
}

/// Every resource limit a process inherits.
const RESOURCES: [libc::__rlimit_resource_t; 16] = [
    libc::RLIMIT_AS,
    libc::RLIMIT_CORE,
    libc::RLIMIT_CPU,
    libc::RLIMIT_DATA,
    libc::RLIMIT_FSIZE,
    libc::RLIMIT_LOCKS,
    libc::RLIMIT_MEMLOCK,
    libc::RLIMIT_MSGQUEUE,
    libc::RLIMIT_NICE,
    libc::RLIMIT_NOFILE,
    libc::RLIMIT_NPROC,
    libc::RLIMIT_RSS,
    libc::RLIMIT_RTPRIO,
    libc::RLIMIT_RTTIME,
    libc::RLIMIT_SIGPENDING,
    libc::RLIMIT_STACK,
];

impl Inheritance {
    /// What a process exec'd now from this thread with `program` and `env` would inherit.
    fn now(program: &Path, env: &[OsString]) -> Inheritance {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
        let status =
            status.lines().filter(|l| STATUS_LINES.iter().any(|k| l.starts_with(k))).map(str::to_string).collect();
        let namespaces = THREAD_NAMESPACES.with(|read| {
            read.get_or_init(|| {
                NAMESPACES.iter().map(|ns| std::fs::read_link(format!("/proc/thread-self/ns/{ns}")).ok()).collect()
            })
            .clone()
        });
        let limits = RESOURCES
            .iter()
            .map(|&resource| {
                let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                // SAFETY: getrlimit writes one rlimit to the valid place given; a resource the kernel does not know
                // fails, leaving it zero.
                unsafe { libc::getrlimit(resource, &mut limit) };
                (limit.rlim_cur, limit.rlim_max)
            })
            .collect();
        // SAFETY: getpriority and sched_getscheduler take numbers, no pointers; on Linux both read this thread's.
        // An error's -1 is compared like any value (both sides read the same way).
        let scheduling = unsafe { (libc::getpriority(libc::PRIO_PROCESS, 0), libc::sched_getscheduler(0)) };
        Inheritance {
            program: program.to_owned(),
            env: env.to_vec(),
            cwd: std::env::current_dir().ok(),
            status,
            cgroup: std::fs::read_to_string("/proc/thread-self/cgroup").unwrap_or_default(),
            namespaces,
            limits,
            scheduling,
        }
    }
}

/// The live template.
struct Template {
    /// The process that started it: a fork of that process must not use (nor kill) it.
    host: u32,
    child: DomainChild,
    control: ControlSocket,
    inherits: Inheritance,
}

impl Template {
    fn start(inherits: Inheritance) -> std::io::Result<Template> {
        let host = std::process::id();
        let (ours, theirs) = ControlSocket::pair()?;
        let args: Vec<OsString> = vec![
            inherits.program.clone().into(),
            "--mode".into(),
            "template".into(),
            "--parent".into(),
            host.to_string().into(),
        ];
        let pid = spawn::posix_spawn(&inherits.program, &args, &inherits.env, &[theirs.as_fd()])?;
        drop(theirs);
        let pidfd = match spawn::pidfd_open(pid) {
            Ok(pidfd) => pidfd,
            Err(e) => {
                // SAFETY: kill takes no pointers; the process is our child and not reaped, so the id is still its.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                let mut raw = 0;
                // SAFETY: reaps our own child; `raw` is a valid place for its status.
                unsafe { libc::waitpid(pid, &mut raw, 0) };
                return Err(e);
            }
        };
        Ok(Template { host, child: DomainChild::adopt(pid, pidfd), control: ours, inherits })
    }

    fn alive(&self) -> bool {
        !spawn::wait_dead(self.child.pidfd(), Duration::ZERO)
    }

    /// Fork a domain process for the domain whose control socket is `theirs`: the process, a child of this one.
    fn fork(&self, theirs: ControlSocket) -> Result<DomainChild, String> {
        self.control.send("start", Some(theirs.as_fd())).map_err(|e| format!("its control socket failed: {e}"))?;
        // The template closes its copy once it has forked; ours goes now.
        drop(theirs);
        let answer = match self.control.recv(Some(ANSWER_TIMEOUT)) {
            Ok(Some(m)) => m,
            Ok(None) if self.alive() => return Err(format!("it did not answer within {ANSWER_TIMEOUT:?}")),
            Ok(None) => return Err("it died".to_string()),
            Err(e) => return Err(format!("its control socket failed: {e}")),
        };
        let pidfd = match (answer.text.as_str(), answer.fd) {
            ("started", Some(pidfd)) => pidfd,
            (text, _) => return Err(format!("it answered `{text}`")),
        };
        let pid = spawn::pid_of(pidfd.as_fd()).map_err(|e| e.to_string())?;
        // Only a child of this process is waited for and reaped here, as a spawned domain is.
        if spawn::parent_of(pid) != Some(self.host as i32) {
            spawn::kill(pidfd.as_fd());
            return Err(format!("it sent a pidfd of process {pid}, which is not a child of the host"));
        }
        Ok(DomainChild::adopt(pid, pidfd))
    }
}

impl Drop for Template {
    fn drop(&mut self) {
        // In a fork of the host the process is the original host's child: leave it alone (closing our copies of
        // its descriptors is all).
        if self.host == std::process::id() {
            self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Templates that failed in a row (died, did not answer, refused, could not be started) in this process: from
/// [`GIVE_UP_AFTER`] on, domains start by exec without trying one (a machine where the template cannot work would
/// otherwise pay for a template and an exec at every start).
static FAILURES: AtomicU32 = AtomicU32::new(0);
const GIVE_UP_AFTER: u32 = 3;

thread_local! {
    /// The monitor thread's template, once started.
    static TEMPLATE: RefCell<Option<Template>> = const { RefCell::new(None) };
}

/// Start a domain process from the template (starting or replacing it as needed): `args` is the command line
/// (the program's name first), `env` its environment, `shared` the region and the two pools, `ours` and `theirs`
/// the two ends of its control socket. None when the template cannot serve this domain, which is then exec'd.
pub(crate) fn start(
    program: &Path,
    args: &[OsString],
    env: &[OsString],
    ours: &ControlSocket,
    theirs: ControlSocket,
    shared: [BorrowedFd<'_>; 3],
) -> Option<DomainChild> {
    if std::env::var_os(ENV_VAR).is_some_and(|v| v == "off") || FAILURES.load(Ordering::Relaxed) >= GIVE_UP_AFTER {
        return None;
    }
    // The command line as one message: `args`, then each argument after a NUL.
    let mut line = String::from("args");
    for arg in &args[1..] {
        line.push('\0');
        // A command line that is not text (a non-UTF-8 path), or holds a NUL, goes the way it always went.
        line.push_str(std::str::from_utf8(arg.as_bytes()).ok().filter(|a| !a.contains('\0'))?);
    }
    if line.len() > MAX_CONTROL_MESSAGE {
        return None;
    }
    let inherits = Inheritance::now(program, env);
    TEMPLATE.with(|cell| {
        let mut template = cell.borrow_mut();
        let why_not = template.as_ref().and_then(|t| match () {
            () if t.host != std::process::id() => Some("belongs to the process this one was forked from"),
            () if t.inherits != inherits => Some("was started with another environment"),
            () if !t.alive() => Some("died"),
            () => None,
        });
        if let Some(why) = why_not {
            say_once(&format!("the domain template {why}: it is replaced"));
            *template = None;
        }
        if template.is_none() {
            match Template::start(inherits) {
                Ok(t) => *template = Some(t),
                Err(e) => {
                    say_once(&format!("the domain template could not be started ({e}): the domain starts by exec"));
                    FAILURES.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
        let t = template.as_ref()?;
        // Queued for the forked process before the socket is handed over: the template never sees them.
        let queued = ours
            .send(&line, Some(shared[0]))
            .and_then(|()| ours.send("pool-in", Some(shared[1])))
            .and_then(|()| ours.send("pool-out", Some(shared[2])));
        if let Err(e) = queued {
            say_once(&format!("cannot queue a domain's setup for the template ({e}): it starts by exec"));
            return None;
        }
        match t.fork(theirs) {
            Ok(child) => {
                FAILURES.store(0, Ordering::Relaxed);
                Some(child)
            }
            Err(why) => {
                say_once(&format!("the domain template failed ({why}): it is killed, the domain starts by exec"));
                FAILURES.fetch_add(1, Ordering::Relaxed);
                *template = None;
                None
            }
        }
    })
}

/// The template forked a process that could not start (`why`): kill the template (the next domain starts a new one)
/// and say so once.
pub(crate) fn bypass(why: &str) {
    say_once(&format!("the domain template {why}: it is killed, the domain starts by exec"));
    FAILURES.fetch_add(1, Ordering::Relaxed);
    TEMPLATE.with(|cell| *cell.borrow_mut() = None);
}

/// The first time only: a debug line of why a domain did not start from the template.
fn say_once(what: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::debug!("{what}");
    }
}
