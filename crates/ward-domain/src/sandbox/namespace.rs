//! A PID namespace of the domain's own, and the mount namespace its fresh `/proc` needs: the host's processes are
//! out of sight (no pid of theirs names anything inside), and every process the extension forks ends with the
//! domain.
//!
//! `unshare(CLONE_NEWPID)` leaves the caller in the old namespace and makes its next child pid 1 of the new one. A
//! pid 1 ignores the signals it sends itself while their action is the default, so an extension's `abort()` and the
//! fault recorder's re-raise would not end it, and every orphan of the namespace is reparented to it. So the domain
//! is three processes (see [`enter`]):
//!
//! - the **waiter**, the process the host started, stays in the host's namespace and does nothing but wait for
//!   init and then end the way the domain ended (the same signal raised on itself, or the same exit code), so the
//!   host reads the domain's status from its own child as before; it dies with the host (`--parent`);
//! - **init**, pid 1 of the namespace, which dies with the waiter (`PR_SET_PDEATHSIG`), mounts the fresh `/proc`,
//!   reaps every process of the namespace, and hands the domain's status to the waiter on a pipe; when it ends,
//!   the kernel kills every other process of the namespace;
//! - the **domain** proper, pid 2, which runs everything `ward-domain` runs without a namespace.
//!
//! As root `unshare(CLONE_NEWPID | CLONE_NEWNS)` works; elsewhere a user namespace (the caller's uid and gid mapped
//! to themselves) gives the right to it; where neither works, the domain goes on in the host's namespace and the
//! host says this protection is missing (`ward::sandbox::missing`).

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Where the domain runs after [`enter`].
#[derive(Debug)]
pub enum Outcome {
    /// This process is the domain proper, pid 2 of a namespace of its own. `proc` says why a fresh `/proc` could
    /// not be mounted, if it could not (the namespace still holds: no signal reaches outside it, but `/proc` lists
    /// the host's processes).
    Inside { proc: Option<String> },
    /// The kernel refused a namespace (why): this process goes on as the domain, in the host's namespace.
    Refused(String),
}

/// Enter a PID namespace (with a mount namespace and a fresh `/proc`). Returns in the domain proper only; the
/// waiter and init this creates never return from here. Must run while the process is single-threaded (a user
/// namespace requires it, and forking requires it to be safe), after the descriptors the domain keeps are the only
/// ones open: the waiter and init close all of them, so that a dead domain's control socket reads as closed.
///
/// `rename`: a process name (`comm`) the waiter and init take once each has forked the next process, which keeps the
/// caller's (a spare, named so until its domain's setup comes, see `template.rs`).
pub fn enter(rename: Option<&CStr>) -> Outcome {
    let user = match unshare_pid_and_mounts() {
        Ok(user) => user,
        Err(why) => return Outcome::Refused(why.to_string()),
    };
    // Private before anything is mounted: the fresh /proc must not propagate into the host's mount namespace.
    // SAFETY: mount with null source, type and data and MS_REC | MS_PRIVATE only changes propagation of the mounts
    // of this (new) mount namespace; the target is a NUL-terminated literal.
    let private = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    } == 0;
    let private_error = (!private).then(|| format!("cannot make mounts private: {}", io::Error::last_os_error()));
    // Nothing any of the three writes to standard output may reach the host's (and none of them holds the host's
    // output open once the host has ended). Failing this, the sandbox's own step says why.
    detach_stdout();
    let (status_read, status_write) = match pipe() {
        Ok(p) => p,
        Err(e) => fatal(&format!("cannot create the status pipe of the PID namespace: {e}")),
    };
    // SAFETY: the process is single-threaded (the caller's contract), so the child is a consistent copy.
    let init = unsafe { libc::fork() };
    if init < 0 {
        fatal(&format!("cannot start the PID namespace's init: {}", io::Error::last_os_error()));
    }
    if init > 0 {
        set_name(rename);
        drop(status_write);
        close_all_but(status_read.as_raw_fd());
        wait_and_mirror(init, status_read);
    }
    drop(status_read);
    run_init(status_write, user, private_error, rename)
}

/// Set this process's name (`comm`), if one is given.
pub(crate) fn set_name(name: Option<&CStr>) {
    if let Some(name) = name {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string (at most 16 bytes taken), valid for the call.
        unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
    }
}

/// Why the domain has no PID namespace of its own, or no fresh `/proc` in it.
#[derive(Debug, thiserror::Error)]
enum NamespaceError {
    #[error("unshare(CLONE_NEWPID | CLONE_NEWNS): {plain}")]
    Unshare { plain: io::Error },
    #[error(
        "unshare(CLONE_NEWPID | CLONE_NEWNS): {plain}; with a user namespace: {with_user} (no unprivileged user \
         namespaces here?)"
    )]
    UnshareWithUser { plain: io::Error, with_user: io::Error },
    #[error("cannot mount a fresh /proc: {source}{hint}")]
    MountProc { source: io::Error, hint: &'static str },
}

/// `unshare(CLONE_NEWPID | CLONE_NEWNS)`, with a user namespace where the caller lacks the privilege for it: Ok(true)
/// when a user namespace was needed.
fn unshare_pid_and_mounts() -> Result<bool, NamespaceError> {
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) } == 0 {
        return Ok(false);
    }
    let plain = io::Error::last_os_error();
    if plain.raw_os_error() != Some(libc::EPERM) {
        return Err(NamespaceError::Unshare { plain });
    }
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // SAFETY: unshare takes flags only; the process is single-threaded, as CLONE_NEWUSER requires.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS) } != 0 {
        let with_user = io::Error::last_os_error();
        return Err(NamespaceError::UnshareWithUser { plain, with_user });
    }
    // Now in a user namespace: without its own uid and gid mapped, the domain would read files as nobody. The
    // kernel lets a process map its own ids (after giving up setgroups); failing that, the domain cannot work.
    let mapped = std::fs::write("/proc/self/setgroups", "deny")
        .and_then(|()| std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")))
        .and_then(|()| std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")));
    if let Err(e) = mapped {
        fatal(&format!("cannot map uid {uid} and gid {gid} into the domain's user namespace: {e}"));
    }
    Ok(true)
}

/// pid 1 of the namespace: die with the waiter, mount the fresh `/proc`, start the domain proper, reap everything,
/// and hand the domain's status to the waiter. Returns in the domain proper only.
fn run_init(status: OwnedFd, user: bool, private_error: Option<String>, rename: Option<&CStr>) -> Outcome {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number, no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    if !reader_alive(&status) {
        // The waiter died before the death signal was set: it would never come.
        // SAFETY: _exit ends this process at once.
        unsafe { libc::_exit(1) };
    }
    let proc = match private_error {
        Some(why) => Some(why),
        None => mount_proc(user).err().map(|e| e.to_string()),
    };
    // SAFETY: init is single-threaded (a fork of a single-threaded process), so the child is a consistent copy.
    let domain = unsafe { libc::fork() };
    if domain < 0 {
        let mut line =
            format!("ward-domain: cannot start the domain in its PID namespace: {}\n", io::Error::last_os_error());
        line.truncate(256);
        write_stderr(&line);
        // SAFETY: _exit ends init; the waiter exits with status 1 then, and the host reports a failed start.
        unsafe { libc::_exit(1) };
    }
    if domain == 0 {
        drop(status);
        // SAFETY: prctl and getppid have no memory preconditions.
        let orphan = unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            libc::getppid() != 1
        };
        if orphan {
            // Init died before the death signal was set (the namespace is going away).
            // SAFETY: _exit ends this process at once.
            unsafe { libc::_exit(1) };
        }
        return Outcome::Inside { proc };
    }
    set_name(rename);
    close_all_but(status.as_raw_fd());
    loop {
        let mut raw = 0;
        // SAFETY: waits for any child of init (the domain, and every orphan of the namespace); `raw` is a valid
        // place for a status.
        let pid = unsafe { libc::waitpid(-1, &mut raw, 0) };
        if pid == domain {
            let bytes = raw.to_ne_bytes();
            // SAFETY: writes the 4 bytes of `bytes`, valid for the call. Ending init then kills what is left.
            unsafe {
                libc::write(status.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0);
            }
        }
        if pid < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // SAFETY: _exit ends init (no child left to wait for: cannot happen while the domain lives).
            unsafe { libc::_exit(1) };
        }
    }
}

/// Mount a fresh `proc` on `/proc`, showing this namespace's processes (`/proc/self` of a plugin keeps working).
fn mount_proc(user: bool) -> Result<(), NamespaceError> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: source, target and type are NUL-terminated literals; no data. Mounts are private in this namespace
    // (checked by the caller), so nothing reaches the host's mount namespace.
    let rc = unsafe { libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), flags, std::ptr::null()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        let hint = if user { " (in a user namespace the kernel wants an unobstructed /proc to copy)" } else { "" };
        return Err(NamespaceError::MountProc { source: e, hint });
    }
    Ok(())
}

/// The waiter: wait for init, then end as the domain ended (its status from init, or else init's own), so the
/// host's view of a domain's exit status is what it was without a namespace.
fn wait_and_mirror(init: libc::pid_t, status: OwnedFd) -> ! {
    let mut raw = 0;
    loop {
        // SAFETY: waits for our own child; `raw` is a valid place for its status.
        let rc = unsafe { libc::waitpid(init, &mut raw, 0) };
        if rc == init {
            break;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // SAFETY: _exit ends this process at once.
            unsafe { libc::_exit(1) };
        }
    }
    let mut bytes = [0u8; 4];
    // SAFETY: reads at most 4 bytes into `bytes`; init has ended, so this does not block.
    let n = unsafe { libc::read(status.as_raw_fd(), bytes.as_mut_ptr().cast(), bytes.len()) };
    let domain = if n == 4 { i32::from_ne_bytes(bytes) } else { raw };
    mirror(domain)
}

/// End this process with the wait status `status`: raise its signal (without a core dump: the domain dumped none
/// either, being non-dumpable), or exit with its code.
fn mirror(status: i32) -> ! {
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: setrlimit reads a valid rlimit; prctl takes a number; signal and sigprocmask take a valid signal
        // number and a set built here; raise takes a number. None of them touches memory the program uses.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::prctl(libc::PR_SET_DUMPABLE, 0);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(sig);
        }
        // A signal whose default is not to end a process cannot have ended the domain; say so in the usual way.
        // SAFETY: _exit ends this process at once.
        unsafe { libc::_exit(128 + sig) };
    }
    // SAFETY: _exit ends this process at once.
    unsafe { libc::_exit(libc::WEXITSTATUS(status)) }
}

/// Whether the read end of the pipe `write_end` belongs to is still open somewhere (a pipe with no reader polls
/// POLLERR on its write end).
fn reader_alive(write_end: &OwnedFd) -> bool {
    let mut fd = libc::pollfd { fd: write_end.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: one valid pollfd; a zero timeout does not block.
    let rc = unsafe { libc::poll(&mut fd, 1, 0) };
    rc >= 0 && fd.revents & libc::POLLERR == 0
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Close every descriptor from 3 on but `keep` (the domain's control socket, region, pools and arena among them).
fn close_all_but(keep: RawFd) {
    // SAFETY: close_range only closes descriptors; the ones closed belong to the domain proper, which holds its own
    // copies, and nothing in this process uses them again.
    unsafe {
        if keep > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, (keep - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (keep + 1) as u32, u32::MAX, 0u32);
    }
}

fn detach_stdout() {
    // SAFETY: the path is a NUL-terminated literal; the descriptor opened is closed after dup2 gives fd 1 its own.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 1);
            libc::close(null);
        }
    }
}

fn write_stderr(line: &str) {
    // SAFETY: writes `line`'s bytes, valid for the call.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// A failure after the namespace was entered, where going on without it is no longer possible: said on standard
/// error, exit status 2 (the host reports the start as failed with that status).
fn fatal(message: &str) -> ! {
    write_stderr(&format!("ward-domain: {message}\n"));
    // SAFETY: _exit ends this process at once.
    unsafe { libc::_exit(2) }
}
