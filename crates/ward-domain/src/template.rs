//! Template mode: a `ward-domain` process the host keeps exec'd and started up to the point where nothing
//! domain-specific has happened, from which each new domain process is forked instead of exec'd.
//!
//! `ward-domain --mode template --parent PID` has one descriptor from the host: its control socket, on fd 3. For
//! each `start` message (carrying the new domain's control socket) it forks a process and answers `started` with a
//! pidfd of it (`error ...` when it cannot). The fork is a sibling, not a child: `CLONE_PARENT` makes the host its
//! parent, exactly as if the host had spawned it, so the host reaps it and reads its status, its death signal
//! follows the host's thread, and the template dying later leaves it alone.
//!
//! The template never reads anything of a domain: the host queues the domain's command line and shared memory
//! descriptors on the domain's own control socket before handing that socket over, and only the forked process
//! reads them ([`Setup`]). The template closes its copy of the socket once it has forked, so it holds nothing of any
//! domain. The forked process then moves the descriptors to 3 to 6 and runs [`crate::start`], the same start-up an
//! exec'd `ward-domain` runs from its command line on (cgroup, namespaces, sandbox, loading): the two cannot drift.
//!
//! The forked process has a glibc whose thread descriptor still names the template's thread id unless the kernel
//! rewrites it at the fork, as glibc's own `fork` has it do (`CLONE_CHILD_SETTID` on the address the kernel knows
//! as the thread's `clear_child_tid`, which glibc set to that field). The template finds that address at start
//! (`PR_GET_TID_ADDRESS`); a kernel that cannot say it makes the template refuse every start, and the host execs.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::time::Duration;

use ward_xpc::control::ControlSocket;

use crate::startup::{close_other_descriptors, die_with};

/// The command line of the template: `--mode template --parent PID`. Its parent's id, or None for any other.
pub fn command_line(argv: &[String]) -> Option<i32> {
    match argv {
        [mode, template, parent, pid] if mode == "--mode" && template == "template" && parent == "--parent" => {
            pid.parse().ok()
        }
        _ => None,
    }
}

/// How long the forked process waits for its setup messages: the host queued them before the fork, so they are
/// there at once unless the host misbehaves.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve `start` requests until the host closes the control socket (or is gone).
pub fn run(parent: i32) -> ExitCode {
    if !die_with(parent) {
        eprintln!("ward-domain: its host (process {parent}) is gone; no domain to start");
        return ExitCode::from(2);
    }
    close_other_descriptors();
    // SAFETY: the host started this process with its control socket on fd 3, and nothing else in this process
    // owns it (template mode takes none of the descriptors a domain takes, `Inherited`).
    let control = ControlSocket::from_fd(unsafe { OwnedFd::from_raw_fd(3) });
    // No process of the same user may read or trace the template's memory. Undone in each fork (an exec'd domain
    // starts dumpable; its sandbox makes it not dumpable later).
    // SAFETY: PR_SET_DUMPABLE takes a number, no pointers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let tid_field = thread_id_field();
    // The default sandbox's system call filters, compiled once here rather than in every domain and incarnation
    // (each fork has a copy and only patches in the pid it names). Nothing of a domain: a domain whose sandbox
    // differs compiles its own. A failure here is the fork's to report, when it compiles them itself.
    let _ = crate::sandbox::prepare(&crate::sandbox::Config::strict());
    crate::fault_handler::find_main_stack();
    loop {
        let message = match control.recv(None) {
            Ok(Some(m)) => m,
            // The host closed the socket or is gone: no more domains to start.
            _ => return ExitCode::SUCCESS,
        };
        let domain = match (message.text.as_str(), message.fd) {
            ("start", Some(fd)) => fd,
            (text, _) => {
                let mut answer = format!("error unknown template request `{text}`");
                ward_xpc::control::fit(&mut answer);
                let _ = control.send(&answer, None);
                continue;
            }
        };
        let Some(tid_field) = tid_field else {
            let _ = control.send("error the kernel does not say where glibc keeps the thread id", None);
            continue;
        };
        match fork_sibling(tid_field) {
            Err(e) => {
                let _ = control.send(&format!("error fork failed: {e}"), None);
            }
            Ok(0) => {
                drop(control);
                return become_domain(domain);
            }
            Ok(pid) => {
                drop(domain);
                match pidfd_of(pid) {
                    Ok(pidfd) => {
                        let _ = control.send("started", Some(pidfd.as_fd()));
                    }
                    // The host is its parent: it learns of the process's end (and reaps it) without the pidfd.
                    Err(e) => {
                        // SAFETY: kill takes no pointers; the process is not reaped until the host reaps it, so the
                        // id still names the process just forked.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                        let _ = control.send(&format!("error pidfd_open failed: {e}"), None);
                    }
                }
            }
        }
    }
}

/// Where glibc keeps this thread's id (the address the kernel clears when the thread ends), checked to hold it.
fn thread_id_field() -> Option<usize> {
    let mut address: usize = 0;
    // SAFETY: PR_GET_TID_ADDRESS writes one pointer to the address given, a valid `usize`.
    if unsafe { libc::prctl(libc::PR_GET_TID_ADDRESS, &mut address as *mut usize) } != 0 || address == 0 {
        return None;
    }
    // SAFETY: gettid has no preconditions; the address is this (the only) thread's `clear_child_tid`, which glibc
    // points at the id field of its live thread descriptor, so it is readable memory holding an aligned int.
    let holds_it = unsafe { std::ptr::read_volatile(address as *const libc::pid_t) == libc::gettid() };
    holds_it.then_some(address)
}

/// Fork a process whose parent is this process's parent, with glibc's thread id rewritten in it: the pid in the
/// template, 0 in the fork.
fn fork_sibling(tid_field: usize) -> std::io::Result<libc::pid_t> {
    let flags = libc::CLONE_PARENT | libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD;
    // SAFETY: this process is single-threaded (the template starts no thread), so the fork is a consistent copy,
    // as glibc's fork would make it, and no lock of glibc's is held by another thread. A null stack makes the fork
    // run on its copy of this stack (like fork). `tid_field` is the thread descriptor's id field (checked in
    // `thread_id_field`), which the kernel sets to the fork's id in the fork's memory, and clears when it ends.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags as libc::c_ulong, 0usize, 0usize, tid_field, 0usize) };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(pid as libc::pid_t)
}

fn pidfd_of(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// What the host queued on a domain's control socket for the process forked for it: its command line and its
/// shared memory.
struct Setup {
    args: Vec<String>,
    region: OwnedFd,
    pool_in: OwnedFd,
    pool_out: OwnedFd,
}

/// Why the forked process could not take its setup. The host, told `unstarted ...`, starts the domain by exec.
#[derive(Debug, thiserror::Error)]
enum SetupError {
    #[error("no `{expected}` message with a descriptor from the host")]
    Missing { expected: &'static str },
    #[error("cannot move the descriptors into place: {0}")]
    Descriptors(#[source] std::io::Error),
}

fn receive_setup(control: &ControlSocket) -> Result<Setup, SetupError> {
    let next = |expected: &'static str| match control.recv(Some(SETUP_TIMEOUT)) {
        Ok(Some(ward_xpc::control::ControlMessage { text, fd: Some(fd) })) if text.starts_with(expected) => {
            Ok((text, fd))
        }
        _ => Err(SetupError::Missing { expected }),
    };
    let (args, region) = next("args")?;
    let (_, pool_in) = next("pool-in")?;
    let (_, pool_out) = next("pool-out")?;
    // `args` and then every argument, each after a NUL (which no argument can hold).
    let args = args.split('\0').skip(1).map(str::to_string).collect();
    Ok(Setup { args, region, pool_in, pool_out })
}

/// The forked process: take the setup, put it where an exec'd domain finds it, and start up as one.
fn become_domain(domain: OwnedFd) -> ExitCode {
    // Above 6 from here on, so that placing the descriptors on 3..6 cannot close it under its owner.
    let control = match copy_above_six(domain.as_fd()) {
        Ok(copy) => ControlSocket::from_fd(copy),
        Err(why) => {
            let _ = ControlSocket::from_fd(domain).send(&format!("unstarted {why}"), None);
            return ExitCode::from(2);
        }
    };
    drop(domain);
    let placed = receive_setup(&control).and_then(|setup| place(control.as_fd(), setup));
    let args = match placed {
        Ok(args) => args,
        Err(why) => {
            let mut text = format!("unstarted {why}");
            ward_xpc::control::fit(&mut text);
            let _ = control.send(&text, None);
            return ExitCode::from(2);
        }
    };
    drop(control);
    // As an exec'd domain starts: dumpable (the template is not), in a process group of its own.
    // SAFETY: prctl(PR_SET_DUMPABLE) and setpgid take numbers, no pointers.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
        libc::setpgid(0, 0);
    }
    crate::start(args)
}

/// Duplicate the control socket and the setup's descriptors onto 3, 4, 5 and 6 (where the host puts them for an
/// exec'd domain), closing every other copy; the command line.
fn place(control: std::os::fd::BorrowedFd<'_>, setup: Setup) -> Result<Vec<String>, SetupError> {
    let sources = [control, setup.region.as_fd(), setup.pool_in.as_fd(), setup.pool_out.as_fd()];
    // Copies above 6 first, so that no dup2 onto 3..6 overwrites a source not yet moved.
    let copies = sources.into_iter().map(copy_above_six).collect::<Result<Vec<_>, _>>()?;
    let Setup { args, region, pool_in, pool_out } = setup;
    drop((region, pool_in, pool_out));
    for (i, copy) in copies.iter().enumerate() {
        // SAFETY: dup2 onto 3 + i replaces whatever that number held: nothing this process still owns (the
        // template's control socket was closed before the setup came, the setup's descriptors just above, and the
        // domain's control socket is owned above 6).
        if unsafe { libc::dup2(copy.as_raw_fd(), 3 + i as RawFd) } < 0 {
            return Err(SetupError::Descriptors(std::io::Error::last_os_error()));
        }
    }
    Ok(args)
}

/// A close-on-exec copy of `fd` numbered 7 or above.
fn copy_above_six(fd: std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd, SetupError> {
    // SAFETY: F_DUPFD_CLOEXEC duplicates a descriptor open for the borrow's lifetime; the copy is new and ours.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 7) };
    if copy < 0 {
        return Err(SetupError::Descriptors(std::io::Error::last_os_error()));
    }
    // SAFETY: `copy` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}
