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
//! After each domain it forks, the template is asked for a **spare** (`spare`), which it forks while the host goes
//! on: a process that ties its life to the host's, enters its PID namespace (two more forks and a `/proc` mount) and
//! takes the sandbox's steps that no domain's policy changes (`ward-domain`'s `sandbox::first_steps`) before any
//! domain exists, then waits for a setup on its own control socket. The next domain that asks for a PID
//! namespace is handed to it: its setup is queued there, the domain proper and init join the domain's cgroup, and
//! the rest of the start-up is unchanged (the waiter, outside the namespace, stays where the spare was made: see
//! `ward-domain`'s `template.rs`). One spare per template at most; it is killed and reaped with the template,
//! and dies with the host. `WARD_DOMAIN_SPARE=off` turns spares off.
//!
//! The template lives in a thread-local of the monitor thread, which starts every domain process: the death signal
//! of the template and of every process forked from it follows that thread, as a spawned domain's does, and the
//! template goes when the thread does. A fork of the host never reaches it (the process id is checked).

use std::cell::RefCell;
use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use ward_xpc::control::{ControlSocket, MAX_CONTROL_MESSAGE};

use super::spawn::{self, DomainChild};

/// How long the template may take to answer a `start` (a fork): generous, for a loaded machine.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The host's environment variable that turns the template off (`off`): every domain is exec'd.
pub const ENV_VAR: &str = "WARD_DOMAIN_TEMPLATE";

/// The host's environment variable that turns the template's spare off (`off`): every domain is forked on request.
pub const SPARE_ENV_VAR: &str = "WARD_DOMAIN_SPARE";

/// Domains this process handed to a spare made ahead (for tests and diagnosis).
static SPARES_TAKEN: AtomicU64 = AtomicU64::new(0);

/// How many domains this process started from a spare the template made ahead.
pub(crate) fn spares_taken() -> u64 {
    SPARES_TAKEN.load(Ordering::Relaxed)
}

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
    spare: SpareState,
}

/// The template's spare: a process it forked ahead that waits, already in its PID namespace, for a domain's setup.
enum SpareState {
    None,
    /// Asked for: the template's answer (`started` with its pidfd) is still to be read, before any other answer.
    Asked(ControlSocket),
    Made(Spare),
}

/// A spare made ahead: its process (the host's child, the waiter of its namespace) and its control socket, on which
/// the host queues a domain's setup.
struct Spare {
    child: DomainChild,
    control: ControlSocket,
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
        Ok(Template { host, child: DomainChild::adopt(pid, pidfd), control: ours, inherits, spare: SpareState::None })
    }

    fn alive(&self) -> bool {
        !spawn::wait_dead(self.child.pidfd(), Duration::ZERO)
    }

    /// Fork a domain process for the domain whose control socket is `theirs`: the process, a child of this one.
    fn fork(&self, theirs: ControlSocket) -> Result<DomainChild, String> {
        self.control.send("start", Some(theirs.as_fd())).map_err(|e| format!("its control socket failed: {e}"))?;
        // The template closes its copy once it has forked; ours goes now.
        drop(theirs);
        self.answer()
    }

    /// The template's answer to a `start` or `spare`: the process it forked, checked to be a child of this one.
    fn answer(&self) -> Result<DomainChild, String> {
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

    /// Ask the template for a spare, unless it has one or spares are off: the template forks it while the host goes
    /// on (the answer is read by [`Template::settle_spare`]).
    fn ask_spare(&mut self) {
        if !matches!(self.spare, SpareState::None) || std::env::var_os(SPARE_ENV_VAR).is_some_and(|v| v == "off") {
            return;
        }
        let Ok((ours, theirs)) = ControlSocket::pair() else { return };
        if self.control.send("spare", Some(theirs.as_fd())).is_ok() {
            self.spare = SpareState::Asked(ours);
        }
    }

    /// Read the template's answer to a spare asked for, if any: Err when the template failed to give it (the answers
    /// that follow could not be told apart from it: the template is replaced); a spare it could not make is said once.
    fn settle_spare(&mut self) -> Result<(), String> {
        if !matches!(self.spare, SpareState::Asked(_)) {
            return Ok(());
        }
        let answer = self.answer();
        let SpareState::Asked(control) = std::mem::replace(&mut self.spare, SpareState::None) else { return Ok(()) };
        match answer {
            Ok(child) => self.spare = SpareState::Made(Spare { child, control }),
            Err(why) if why.starts_with("it answered `error") => say_once(&format!("no spare domain: {why}")),
            Err(why) => return Err(why),
        }
        Ok(())
    }

    /// The spare, if one is made and alive (a dead one is reaped).
    fn take_spare(&mut self) -> Option<Spare> {
        match std::mem::replace(&mut self.spare, SpareState::None) {
            SpareState::Made(spare) if !spawn::wait_dead(spare.child.pidfd(), Duration::ZERO) => Some(spare),
            SpareState::Made(mut dead) => {
                let _ = dead.child.wait();
                None
            }
            other => {
                self.spare = other;
                None
            }
        }
    }
}

impl Spare {
    /// Hand the spare a domain's setup (`line`, `shared`), queued on its control socket. The spare is killed when
    /// this fails.
    fn hand(mut self, line: &str, shared: [BorrowedFd<'_>; 3]) -> Result<(DomainChild, ControlSocket), String> {
        match queue_setup(&self.control, line, shared) {
            Ok(()) => Ok((self.child, self.control)),
            Err(e) => {
                self.child.kill();
                let _ = self.child.wait();
                Err(format!("cannot queue a domain's setup for it: {e}"))
            }
        }
    }
}

/// Queue a domain's command line and shared memory on its control socket, for the process forked for it.
fn queue_setup(control: &ControlSocket, line: &str, shared: [BorrowedFd<'_>; 3]) -> std::io::Result<()> {
    control
        .send(line, Some(shared[0]))
        .and_then(|()| control.send("pool-in", Some(shared[1])))
        .and_then(|()| control.send("pool-out", Some(shared[2])))
}

impl Drop for Template {
    fn drop(&mut self) {
        // In a fork of the host the process is the original host's child: leave it alone (closing our copies of
        // its descriptors is all).
        if self.host == std::process::id() {
            // A spare asked for is known only from the answer: read it first, so that the spare is killed and reaped
            // with the template, not left behind. A dead template's answer, if it gave one, is still in the socket
            // (and its closed end makes the read return at once otherwise).
            let _ = self.settle_spare();
            if let SpareState::Made(mut spare) = std::mem::replace(&mut self.spare, SpareState::None) {
                spare.child.kill();
                let _ = spare.child.wait();
            }
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
/// (the program's name first), `env` its environment, `shared` the region and the two pools. The process (a child of
/// this one) and the host's end of its control socket; None when the template cannot serve this domain, which is
/// then exec'd. A domain that asks for a PID namespace takes the template's spare where one is made; either way, the
/// template is then asked for the next spare, which it makes while the host goes on.
pub(crate) fn start(
    program: &Path,
    args: &[OsString],
    env: &[OsString],
    shared: [BorrowedFd<'_>; 3],
) -> Option<(DomainChild, ControlSocket)> {
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
        if let Some(Err(why)) = template.as_mut().map(Template::settle_spare) {
            say_once(&format!("the domain template failed ({why}): it is replaced"));
            FAILURES.fetch_add(1, Ordering::Relaxed);
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
        let t = template.as_mut()?;
        // A spare has entered its PID namespace already: only a domain that asks for one can take it.
        let spare = match args.iter().any(|a| a == "--no-pid-namespace") {
            false => t.take_spare(),
            true => None,
        };
        if let Some(spare) = spare {
            match spare.hand(&line, shared) {
                Ok(started) => {
                    SPARES_TAKEN.fetch_add(1, Ordering::Relaxed);
                    t.ask_spare();
                    return Some(started);
                }
                Err(why) => say_once(&format!("the domain template's spare failed ({why}): the domain is forked")),
            }
        }
        let Ok((ours, theirs)) = ControlSocket::pair() else {
            say_once("cannot create a control socket for a domain forked from the template: it starts by exec");
            return None;
        };
        // Queued for the forked process before the socket is handed over: the template never sees them.
        if let Err(e) = queue_setup(&ours, &line, shared) {
            say_once(&format!("cannot queue a domain's setup for the template ({e}): it starts by exec"));
            return None;
        }
        match t.fork(theirs) {
            Ok(child) => {
                FAILURES.store(0, Ordering::Relaxed);
                t.ask_spare();
                Some((child, ours))
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

/// Read the template's answer to the spare it was asked for last, if it has not been read: called once a domain's
/// start is over, so that the spare is known (and ends with the template) from then on. A template that fails to
/// answer is replaced at the next start.
pub(crate) fn settle() {
    TEMPLATE.with(|cell| {
        let Ok(mut template) = cell.try_borrow_mut() else { return };
        if let Some(Err(why)) = template.as_mut().filter(|t| t.host == std::process::id()).map(Template::settle_spare) {
            say_once(&format!("the domain template failed ({why}): it is replaced"));
            FAILURES.fetch_add(1, Ordering::Relaxed);
            *template = None;
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
