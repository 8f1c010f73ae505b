//! Starting `ward-domain` processes: finding the program, handing over the descriptors, waiting until it is loaded.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use ward_xpc::control::ControlSocket;

use crate::backend::ExtensionSpec;
use crate::policy::Limits;

/// How long a domain may take to load its extensions before the start counts as failed.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the `ward-domain` program was not found.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProgramNotFound {
    /// `$WARD_DOMAIN` names something that is not a file.
    #[error("WARD_DOMAIN={} is not a file", .0.display())]
    NotAFile(PathBuf),
    /// The running program's own path is unknown, so there is nowhere beside it to look.
    #[error("cannot find the running program: {0}")]
    NoCurrentExe(#[source] std::io::Error),
    /// None of the places looked in holds it.
    #[error("looked in {}", display_paths(.0))]
    NotBeside(Vec<PathBuf>),
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Why a domain process did not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnError {
    #[error("cannot create a control socket: {0}")]
    ControlSocket(#[source] std::io::Error),
    #[error("cannot start {}: {source}", program.display())]
    Start { program: PathBuf, source: std::io::Error },
    #[error("pidfd_open: {0}")]
    PidfdOpen(#[source] std::io::Error),
    #[error("the domain said it was ready without a pidfd of itself")]
    ReadyWithoutPidfd,
    /// The pidfd the domain sent of itself names another process.
    #[error(transparent)]
    BadPidfd(#[from] PidfdError),
    /// The domain's own account of why it could not start (it said `error ...`), or whatever else it said.
    #[error("{0}")]
    Refused(String),
    /// A process forked from the template could not take what the host queued for it: it ran nothing of the
    /// domain's start-up (the domain is then started by exec).
    #[error("the process forked from the template did not start: {0}")]
    Unstarted(String),
    /// Its control socket closed or failed before it was ready; with its exit status where it could be read.
    #[error("the domain process ended during start-up ({0})")]
    EndedDuringStartUp(String),
}

/// Why a pidfd a domain or zygote sent is not taken as the process it claims to be.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PidfdError {
    #[error("cannot read {path}: {source}")]
    Fdinfo { path: String, source: std::io::Error },
    #[error("the descriptor it sent is not a pidfd")]
    NotAPidfd,
    #[error("the process of the pidfd it sent has ended")]
    Ended,
    #[error("the pidfd it sent names a process outside this one's PID namespace")]
    OutsideNamespace,
    #[error("the domain sent a pidfd of process {0}, which is not the domain process")]
    NotTheDomain(i32),
    #[error("it sent a pidfd of process {0}, which it did not fork")]
    NotForked(i32),
}

/// Where the `ward-domain` program is: `$WARD_DOMAIN`, else beside the running program, else one directory up
/// (test and bench programs live in `target/<profile>/deps`).
pub(crate) fn find_program() -> Result<PathBuf, ProgramNotFound> {
    if let Some(p) = std::env::var_os("WARD_DOMAIN") {
        let p = PathBuf::from(p);
        return if p.is_file() { Ok(p) } else { Err(ProgramNotFound::NotAFile(p)) };
    }
    let exe = std::env::current_exe().map_err(ProgramNotFound::NoCurrentExe)?;
    let mut tried = Vec::new();
    for dir in exe.parent().into_iter().chain(exe.parent().and_then(Path::parent)) {
        let candidate = dir.join("ward-domain");
        if candidate.is_file() {
            return Ok(candidate);
        }
        tried.push(candidate);
    }
    Err(ProgramNotFound::NotBeside(tried))
}

/// What a started domain process is to be: one that serves calls, or a zygote that forks those that do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Serve,
    Zygote,
}

pub(crate) struct Launch<'a> {
    pub program: &'a Path,
    pub role: Role,
    pub spin: u32,
    pub limits: &'a Limits,
    /// The sandbox's flags (`SandboxPolicy::domain_args`).
    pub sandbox: &'a [OsString],
    pub extensions: &'a [ExtensionSpec],
    pub region: BorrowedFd<'a>,
    /// Read-only: the domain can map it only for reading.
    pub pool_in: BorrowedFd<'a>,
    pub pool_out: BorrowedFd<'a>,
    /// The host has an arena (`ward_xpc::arena`): calls may lend its blocks in place, whose descriptors come on
    /// the control socket.
    pub arena: bool,
    /// Bytes of zeros after every input (a multiple of the page).
    pub read_past: usize,
    /// A run-time library fault for the domain (policy `library_fault`).
    pub preload: Option<&'a crate::libfault::Preload>,
}

/// A started domain.
///
/// In a PID namespace of its own the domain is not the process this side started: that one (`child`) waits outside
/// the namespace and ends as the domain ends, so its exit status is the domain's; the domain proper, pid 2 of the
/// namespace, sends a pidfd of itself with `ready` (`pid`, `pidfd`). Without a namespace both are one process.
pub(crate) struct Started {
    pub child: DomainChild,
    /// The domain proper's id in this process's PID namespace, read from its pidfd (never from what it says).
    pub pid: i32,
    pub pidfd: OwnedFd,
    pub control: ControlSocket,
    /// What of its sandbox the domain could not have, as it said with `ready` (a PID namespace the kernel refused).
    pub without: Option<String>,
    /// A zygote's first fork request, sent before it was ready (None: not sent, or not a zygote).
    pub first_fork: Option<FirstFork>,
}

/// A fork request queued on a zygote's control socket with its start, behind its setup: the zygote reads it as soon
/// as it has said `ready`, and forks without waiting for the host to read `ready` and ask. Its answer (`forked`)
/// follows `ready`, read as any fork request's is.
pub(crate) struct FirstFork {
    /// This side's end of the incarnation's own control socket (with an arena), whose other end went with it.
    pub channel: Option<ControlSocket>,
}

/// Queue the first fork request on a zygote's control socket (`control`), for `launch` with the zygote role; None
/// where it is not one, or the request could not be queued (the host then asks once the zygote is ready).
fn ask_first_fork(launch: &Launch<'_>, control: &ControlSocket) -> Option<FirstFork> {
    if launch.role != Role::Zygote {
        return None;
    }
    let (channel, theirs) = match launch.arena {
        true => ControlSocket::pair().ok().map(|(ours, theirs)| (Some(ours), Some(theirs)))?,
        false => (None, None),
    };
    control.send("fork", theirs.as_ref().map(|t| t.as_fd())).ok()?;
    Some(FirstFork { channel })
}

/// A domain process this process started: its id and pidfd, and its exit status once waited for.
#[derive(Debug)]
pub(crate) struct DomainChild {
    pid: i32,
    pidfd: OwnedFd,
    status: Option<ExitStatus>,
}

impl DomainChild {
    /// A child of this process, not yet reaped, known by `pidfd` (checked to name `pid`).
    pub(super) fn adopt(pid: i32, pidfd: OwnedFd) -> DomainChild {
        DomainChild { pid, pidfd, status: None }
    }

    pub(super) fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// End the domain whose process proper is `domain`, and reap this one: SIGKILL to the domain, which this process
    /// then mirrors once every process of the domain's namespace has ended; should this process not end within
    /// `timeout` (a domain that named another process as itself), SIGKILL to it too, which ends the namespace.
    pub fn end(&mut self, domain: BorrowedFd<'_>, timeout: Duration) -> std::io::Result<ExitStatus> {
        if self.status.is_none() {
            kill(domain);
            if !wait_dead(self.pidfd.as_fd(), timeout) {
                self.kill();
            }
        }
        self.wait()
    }

    /// Wait for it to end (at once if it has) and reap it; later calls give the same status.
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let mut raw = 0;
        loop {
            // SAFETY: waits for our own child; `raw` is a valid place for its status.
            let rc = unsafe { libc::waitpid(self.pid, &mut raw, 0) };
            if rc == self.pid {
                let status = ExitStatus::from_raw(raw);
                self.status = Some(status);
                return Ok(status);
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    /// SIGKILL, unless it has been reaped. Its death signal then ends the domain's namespace too.
    pub(super) fn kill(&self) {
        if self.status.is_none() {
            kill(self.pidfd.as_fd());
        }
    }
}

/// Start a domain process and wait for `ready`: forked from the host's template where it can be (see
/// [`super::template`]), else spawned from the program. Must run on the monitor thread (see there why: the template
/// lives there too).
pub(crate) fn spawn(launch: &Launch<'_>) -> Result<Started, SpawnError> {
    let args = command_line(launch);
    let env = environment(launch);
    // A domain with a preload of its own needs the dynamic linker to run for it: an exec.
    if launch.preload.is_none() {
        let shared = [launch.region, launch.pool_in, launch.pool_out];
        if let Some((child, ours)) = super::template::start(launch.program, &args, &env, shared) {
            let first_fork = ask_first_fork(launch, &ours);
            let started = wait_ready(child, ours, first_fork);
            // The spare asked for meanwhile is known from here on (and ends with the template).
            super::template::settle();
            match started {
                Err(SpawnError::Unstarted(why)) => super::template::bypass(&format!("its fork could not start: {why}")),
                started => return started,
            }
        }
    }
    let (ours, theirs) = ControlSocket::pair().map_err(SpawnError::ControlSocket)?;
    // Descriptors 3, 4, 5, 6 in the domain, in this order.
    let sources: Vec<BorrowedFd<'_>> = vec![theirs.as_fd(), launch.region, launch.pool_in, launch.pool_out];
    let pid = posix_spawn(launch.program, &args, &env, &sources)
        .map_err(|source| SpawnError::Start { program: launch.program.to_owned(), source })?;
    drop(theirs);
    let child = match pidfd_open(pid) {
        Ok(pidfd) => DomainChild { pid, pidfd, status: None },
        Err(e) => {
            // SAFETY: kill takes no pointers; the process is our child and not reaped, so the id is still its.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let mut raw = 0;
            // SAFETY: reaps our own child; `raw` is a valid place for its status.
            unsafe { libc::waitpid(pid, &mut raw, 0) };
            return Err(SpawnError::PidfdOpen(e));
        }
    };
    let first_fork = ask_first_fork(launch, &ours);
    wait_ready(child, ours, first_fork)
}

/// `ward-domain`'s command line for `launch`, its name first.
fn command_line(launch: &Launch<'_>) -> Vec<OsString> {
    let mode = match launch.role {
        Role::Serve => "serve",
        Role::Zygote => "zygote",
    };
    let mut args: Vec<OsString> = vec![launch.program.into()];
    for (flag, value) in [
        ("--mode", mode.to_string()),
        ("--parent", std::process::id().to_string()),
        ("--spin", launch.spin.to_string()),
        ("--as-mb", launch.limits.address_space_mb.to_string()),
        ("--cpu-s", launch.limits.cpu_s.to_string()),
        ("--nofile", launch.limits.open_files.to_string()),
        ("--read-past", launch.read_past.to_string()),
    ] {
        args.push(flag.into());
        args.push(value.into());
    }
    if launch.arena {
        args.push("--arena".into());
    }
    args.extend(launch.sandbox.iter().cloned());
    for ext in launch.extensions {
        args.push("--ext".into());
        args.push(ext.path.as_os_str().to_owned());
        if let Some(init) = &ext.init {
            args.push("--init".into());
            args.push(init.into());
        }
        if ext.poison {
            args.push("--poison".into());
        }
    }
    args
}

/// The domain's environment (`KEY=VALUE` each): the host's, without the host's preload, with the domain's own.
fn environment(launch: &Launch<'_>) -> Vec<OsString> {
    // A preload shim (`ward run`) belongs to the host: the domain must load the plugin itself, not a proxy.
    let mut env: Vec<OsString> = std::env::vars_os()
        .filter(|(k, _)| k != "LD_PRELOAD" && k != crate::libfault::ENV_VAR)
        .map(|(k, v)| env_entry(&k, &v))
        .collect();
    if let Some(preload) = launch.preload {
        // The domain's own preload, not the host's: it injects the library fault policy asks for into the calls of
        // one object.
        env.push(env_entry("LD_PRELOAD".as_ref(), preload.library.as_os_str()));
        env.push(env_entry(crate::libfault::ENV_VAR.as_ref(), preload.config.as_ref()));
    }
    env
}

/// Wait until the domain process `child` (this process's child) says `ready` on `ours`, its control socket.
/// `first_fork`: the fork request queued behind the setup, if any.
fn wait_ready(
    mut child: DomainChild,
    ours: ControlSocket,
    first_fork: Option<FirstFork>,
) -> Result<Started, SpawnError> {
    let pid = child.pid;
    let said = match ours.recv(Some(START_TIMEOUT)) {
        // A domain that ended with a message of ours unread (the first fork request, queued behind its setup): the
        // kernel reports that before what the domain said, which the next read gives.
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => ours.try_recv(),
        said => said,
    };
    match said {
        Ok(Some(m)) if m.text == "ready" || m.text.starts_with("ready\n") => {
            let domain = m.fd.ok_or(SpawnError::ReadyWithoutPidfd);
            match domain.and_then(|fd| Ok((the_domain_proper(&fd, pid)?, fd))) {
                Ok((domain, pidfd)) => {
                    let without = m.text.strip_prefix("ready\n").map(str::to_string);
                    Ok(Started { child, pid: domain, pidfd, control: ours, without, first_fork })
                }
                Err(why) => {
                    child.kill();
                    let _ = child.wait();
                    Err(why)
                }
            }
        }
        Ok(Some(m)) => {
            child.kill();
            let _ = child.wait();
            match m.text.strip_prefix("unstarted ") {
                Some(why) => Err(SpawnError::Unstarted(why.to_string())),
                None => Err(SpawnError::Refused(m.text.strip_prefix("error ").unwrap_or(&m.text).to_string())),
            }
        }
        Ok(None) | Err(_) => {
            child.kill();
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            Err(SpawnError::EndedDuringStartUp(status))
        }
    }
}

fn env_entry(key: &OsStr, value: &OsStr) -> OsString {
    let mut entry = key.to_owned();
    entry.push("=");
    entry.push(value);
    entry
}

/// Start `program` with `args` (the first is its name) and the environment `env` (`KEY=VALUE` each), `sources` on
/// descriptors 3, 4, ... in order, standard input from `/dev/null`, standard output and error shared with this
/// process, no signal blocked, `SIGPIPE` at its default, and in a process group of its own.
///
/// `posix_spawn`, not fork and exec: glibc's shares this process's memory with the child until it execs (like
/// `vfork`), where a fork copies the page tables of the whole host first, which costs a host of a few gigabytes
/// tens of milliseconds for every domain it starts. Nothing runs in the child before exec but the file actions,
/// so the domain ties its life to ours itself (`--parent`).
pub(super) fn posix_spawn(
    program: &Path,
    args: &[OsString],
    env: &[OsString],
    sources: &[BorrowedFd<'_>],
) -> std::io::Result<i32> {
    let c = |s: &OsStr| CString::new(s.as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let program = c(program.as_os_str())?;
    let args = args.iter().map(|a| c(a)).collect::<std::io::Result<Vec<_>>>()?;
    let env = env.iter().map(|e| c(e)).collect::<std::io::Result<Vec<_>>>()?;
    let mut argv: Vec<*mut libc::c_char> = args.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let mut envp: Vec<*mut libc::c_char> = env.iter().map(|e| e.as_ptr().cast_mut()).collect();
    envp.push(std::ptr::null_mut());
    // Copies above every target number, so that no `dup2` onto 3, 4, ... overwrites a source not yet moved. They
    // close on exec; the copies the child gets from `dup2` do not.
    let moved = sources
        .iter()
        .map(|fd| copy_above(*fd, 3 + sources.len() as RawFd))
        .collect::<std::io::Result<Vec<OwnedFd>>>()?;
    let mut actions = FileActions::new()?;
    for (i, fd) in moved.iter().enumerate() {
        actions.dup2(fd.as_raw_fd(), 3 + i as RawFd)?;
    }
    actions.open_dev_null(0)?;
    let mut attr = SpawnAttr::new()?;
    attr.clean_signals()?;
    let mut pid: libc::pid_t = 0;
    // SAFETY: `program`, `argv` and `envp` are NUL-terminated strings and NULL-terminated arrays of them that
    // outlive the call; `actions` and `attr` are initialised; `pid` is a valid place for the child's id.
    let rc =
        unsafe { libc::posix_spawn(&mut pid, program.as_ptr(), &*actions.0, &*attr.0, argv.as_ptr(), envp.as_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(pid)
}

/// A close-on-exec copy of `fd` numbered `floor` or above.
fn copy_above(fd: BorrowedFd<'_>, floor: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC duplicates a descriptor that is open for the borrow's lifetime; the new one is ours.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) };
    if copy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `copy` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// A `posix_spawn*_t` on the heap, initialised by its `init` function.
fn initialised<T>(init: unsafe extern "C" fn(*mut T) -> libc::c_int) -> std::io::Result<Box<T>> {
    // SAFETY: a zeroed value is only storage (these are plain C structs); `init` fills it in before any use.
    let mut value = Box::new(unsafe { std::mem::zeroed::<T>() });
    // SAFETY: `value` points to storage for a `T`, which `init` initialises.
    check(unsafe { init(&mut *value) })?;
    Ok(value)
}

/// `posix_spawn_file_actions_t`, destroyed when dropped.
struct FileActions(Box<libc::posix_spawn_file_actions_t>);

impl FileActions {
    fn new() -> std::io::Result<Self> {
        initialised(libc::posix_spawn_file_actions_init).map(FileActions)
    }

    fn dup2(&mut self, fd: RawFd, target: RawFd) -> std::io::Result<()> {
        // SAFETY: initialised actions; the call records the action (glibc allocates), it touches no descriptor.
        check(unsafe { libc::posix_spawn_file_actions_adddup2(&mut *self.0, fd, target) })
    }

    fn open_dev_null(&mut self, target: RawFd) -> std::io::Result<()> {
        // SAFETY: the actions were initialised in `new`; the call only records the open for the child (glibc
        // allocates and copies the path, a NUL-terminated literal), it touches no descriptor now.
        check(unsafe {
            libc::posix_spawn_file_actions_addopen(&mut *self.0, target, c"/dev/null".as_ptr(), libc::O_RDONLY, 0)
        })
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, destroyed once here.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut *self.0) };
    }
}

/// `posix_spawnattr_t`, destroyed when dropped.
struct SpawnAttr(Box<libc::posix_spawnattr_t>);

impl SpawnAttr {
    fn new() -> std::io::Result<Self> {
        initialised(libc::posix_spawnattr_init).map(SpawnAttr)
    }

    /// No signal blocked in the child, whatever the calling thread blocks, and `SIGPIPE` at its default (Rust
    /// programs ignore it), as `std::process::Command` leaves them; and the child in a process group of its own.
    fn clean_signals(&mut self) -> std::io::Result<()> {
        // SAFETY: all-zero `sigset_t`s are valid storage; sigemptyset and sigaddset initialise and fill them.
        let (mut none, mut pipe): (libc::sigset_t, libc::sigset_t) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: valid `sigset_t`s; SIGPIPE is a valid signal number; the attribute calls copy the sets.
        unsafe {
            libc::sigemptyset(&mut none);
            libc::sigemptyset(&mut pipe);
            libc::sigaddset(&mut pipe, libc::SIGPIPE);
            check(libc::posix_spawnattr_setsigmask(&mut *self.0, &none))?;
            check(libc::posix_spawnattr_setsigdefault(&mut *self.0, &pipe))?;
            // A process group of its own: no signal a terminal sends the host's foreground group (Ctrl-C), and none
            // sent to the host's process group, reaches a domain. It still ends with the host (`--parent`). Not a
            // session of its own: the kernel schedules each session as a group of its own (autogroup), and host and
            // domain scheduled as two groups took sox under `ward run` from 1.44x its native time to 1.79x. The
            // terminal the domain then shares it cannot type into (TIOCSTI is refused by the filter and Landlock)
            // nor write (Landlock), and reading it from a background group stops or fails.
            let flags = (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF | libc::POSIX_SPAWN_SETPGROUP)
                as libc::c_short;
            check(libc::posix_spawnattr_setpgroup(&mut *self.0, 0))?;
            check(libc::posix_spawnattr_setflags(&mut *self.0, flags))
        }
    }
}

impl Drop for SpawnAttr {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`, destroyed once here.
        unsafe { libc::posix_spawnattr_destroy(&mut *self.0) };
    }
}

/// The `posix_spawn*` functions return an error number instead of setting `errno`.
fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// The id, in this process's PID namespace, of the process a domain sent a pidfd of as itself, checked to be the
/// domain proper of the process this side started (`started`): that process itself (no namespace), or its
/// grandchild (its child is the namespace's init, whose only child is the domain).
fn the_domain_proper(pidfd: &OwnedFd, started: i32) -> Result<i32, PidfdError> {
    let pid = pid_of(pidfd.as_fd())?;
    let grandparent = parent_of(pid).and_then(parent_of);
    if pid != started && grandparent != Some(started) {
        return Err(PidfdError::NotTheDomain(pid));
    }
    Ok(pid)
}

/// The id, in this process's PID namespace, of the process an incarnation's pidfd names, checked to be a child of
/// the zygote `zygote` (a zygote could otherwise have this side kill, pin or watch a process of its choosing).
pub(crate) fn incarnation_of(pidfd: BorrowedFd<'_>, zygote: i32) -> Result<i32, PidfdError> {
    let pid = pid_of(pidfd)?;
    if parent_of(pid) != Some(zygote) {
        return Err(PidfdError::NotForked(pid));
    }
    Ok(pid)
}

/// The process id a pidfd names, as this process sees it: the `Pid:` line of its `/proc/self/fdinfo` entry. A
/// domain in a PID namespace knows itself by another number, which means nothing here.
pub(crate) fn pid_of(pidfd: BorrowedFd<'_>) -> Result<i32, PidfdError> {
    let path = format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd());
    let info = std::fs::read_to_string(&path).map_err(|source| PidfdError::Fdinfo { path, source })?;
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|p| p.trim().parse::<i32>().ok())
        .ok_or(PidfdError::NotAPidfd)?;
    match pid {
        -1 => Err(PidfdError::Ended),
        p if p <= 0 => Err(PidfdError::OutsideNamespace),
        p => Ok(p),
    }
}

/// The parent of process `pid` (field 4 of `/proc/PID/stat`); None once it is gone.
pub(super) fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold anything: the fields after the last ')' are the state, the parent.
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

pub(crate) fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// SIGKILL through a pidfd (no pid reuse race).
pub(crate) fn kill(pidfd: BorrowedFd<'_>) {
    // SAFETY: pidfd_send_signal with a null siginfo; the pidfd names exactly our process.
    unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<u8>(), 0) };
}

/// Wait until the process behind the pidfd has ended (its pidfd becomes readable), at most `timeout`.
pub(crate) fn wait_dead(pidfd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc >= 0 {
            return rc > 0;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_domain_program_names_every_place_looked_in() {
        let why = ProgramNotFound::NotBeside(vec![PathBuf::from("/a/ward-domain"), PathBuf::from("/b/ward-domain")]);
        assert_eq!(why.to_string(), "looked in /a/ward-domain, /b/ward-domain");
        assert_eq!(
            ProgramNotFound::NotAFile(PathBuf::from("/nowhere")).to_string(),
            "WARD_DOMAIN=/nowhere is not a file"
        );
    }

    #[test]
    fn a_pidfd_of_another_process_is_refused_naming_it() {
        let why = SpawnError::from(PidfdError::NotTheDomain(42));
        assert_eq!(why.to_string(), "the domain sent a pidfd of process 42, which is not the domain process");
        assert_eq!(PidfdError::NotForked(7).to_string(), "it sent a pidfd of process 7, which it did not fork");
    }

    #[test]
    fn pid_of_refuses_a_descriptor_that_is_not_a_pidfd() {
        let file = std::fs::File::open("/proc/self/stat").expect("opens /proc/self/stat");
        assert!(matches!(pid_of(file.as_fd()), Err(PidfdError::NotAPidfd)));
    }
}
