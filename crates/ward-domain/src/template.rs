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
//! A `spare` message (with a control socket too) forks a spare instead: a process that runs, ahead of any domain,
//! the start-up steps that depend on no domain (up to and with the PID namespace, and the sandbox's first steps),
//! then waits on that socket for the setup of whichever domain the host hands it next ([`become_spare`]).
//!
//! The forked process has a glibc whose thread descriptor still names the template's thread id unless the kernel
//! rewrites it at the fork, as glibc's own `fork` has it do (`CLONE_CHILD_SETTID` on the address the kernel knows
//! as the thread's `clear_child_tid`, which glibc set to that field). The template finds that address at start
//! (`PR_GET_TID_ADDRESS`); a kernel that cannot say it makes the template refuse every start, and the host execs.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::time::Duration;

use ward_xpc::control::ControlSocket;

use crate::sandbox::namespace;
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
    let own_name = own_name();
    loop {
        let message = match control.recv(None) {
            Ok(Some(m)) => m,
            // The host closed the socket or is gone: no more domains to start.
            _ => return ExitCode::SUCCESS,
        };
        let (domain, spare) = match (message.text.as_str(), message.fd) {
            ("start", Some(fd)) => (fd, false),
            ("spare", Some(fd)) => (fd, true),
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
        // A spare is named so from its birth (the name is taken at the fork), until its domain's setup comes: what
        // tells it from the template among the host's children.
        if spare {
            crate::sandbox::namespace::set_name(Some(SPARE_NAME));
        }
        let forked = fork_sibling(tid_field);
        if spare {
            crate::sandbox::namespace::set_name(Some(&own_name));
        }
        match forked {
            Err(e) => {
                let _ = control.send(&format!("error fork failed: {e}"), None);
            }
            Ok(0) if spare => {
                drop(control);
                return become_spare(domain, parent, &own_name);
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

/// The name (`comm`) a spare has until its domain's setup comes.
const SPARE_NAME: &CStr = c"ward-spare";

/// This process's name (`comm`), as the kernel took it from the program's file at exec: what a domain exec'd from
/// the same program is named.
fn own_name() -> CString {
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into the 17-byte buffer given.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    CStr::from_bytes_until_nul(&name).map(CStr::to_owned).unwrap_or_else(|_| c"ward-domain".to_owned())
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

fn receive_setup(control: &ControlSocket, timeout: Option<Duration>) -> Result<Setup, SetupError> {
    let next = |expected: &'static str| match control.recv(timeout) {
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
    let placed = receive_setup(&control, Some(SETUP_TIMEOUT)).and_then(|setup| place(control.as_fd(), setup));
    let args = match placed {
        Ok(args) => args,
        Err(why) => return unstarted(&control, &why),
    };
    drop(control);
    as_an_execd_domain_starts();
    crate::start(args)
}

/// Tell the host, on `control`, that the forked process cannot take its setup (`why`); the host starts the domain
/// by exec instead.
fn unstarted(control: &ControlSocket, why: &dyn std::fmt::Display) -> ExitCode {
    let mut text = format!("unstarted {why}");
    ward_xpc::control::fit(&mut text);
    let _ = control.send(&text, None);
    ExitCode::from(2)
}

/// What an exec'd domain is at its start and a fork of the template is not yet: dumpable (the template is not; a
/// user namespace's id maps need it), in a process group of its own.
fn as_an_execd_domain_starts() {
    // SAFETY: prctl(PR_SET_DUMPABLE) and setpgid take numbers, no pointers.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
        libc::setpgid(0, 0);
    }
}

/// The spare: a process forked ahead, before any domain asks for it, that does at once what does not depend on the
/// domain (tie its life to the host's, a process group of its own, every other descriptor closed, the PID namespace
/// with its waiter, init and `/proc`, the sandbox's first steps: `sandbox::first_steps`), then waits, named
/// [`SPARE_NAME`], for a domain's setup on its control socket (`domain`), which it keeps on descriptor 3. Whatever is
/// per domain (cgroup, the sandbox's configured steps, limits, loading) runs after the setup comes, in the same
/// start-up code as an exec'd domain's ([`crate::start_entered`]). The host hands it a
/// domain only when that domain asks for a PID namespace; it ends with the host (its death signal, and the host
/// closing or killing it), and when its control socket closes before a setup comes.
fn become_spare(domain: OwnedFd, host: i32, own_name: &CStr) -> ExitCode {
    // SAFETY: dup2 onto 3, which this process no longer uses (the template's control socket there was closed just
    // before; `domain` came while it was open, so it is another number), makes it the domain's control socket where
    // an exec'd domain has it; `domain` is closed just after, so 3 has one owner.
    if unsafe { libc::dup2(domain.as_raw_fd(), 3) } < 0 {
        let why = std::io::Error::last_os_error();
        let _ = ControlSocket::from_fd(domain).send(&format!("unstarted cannot move its control socket: {why}"), None);
        return ExitCode::from(2);
    }
    drop(domain);
    as_an_execd_domain_starts();
    if !die_with(host) {
        return ExitCode::from(2);
    }
    close_other_descriptors();
    let entered = namespace::enter(Some(own_name));
    // What every domain's sandbox starts with, whatever its setup says: taken now, its outcome reported where an
    // exec'd domain takes these steps.
    let first_steps = crate::sandbox::first_steps();
    // SAFETY: descriptor 3 is the domain's control socket (moved there above), and nothing else in this process owns
    // it: the waiter and init, which closed their copies, never return here.
    let control = ControlSocket::from_fd(unsafe { OwnedFd::from_raw_fd(3) });
    let setup = match receive_setup(&control, None) {
        Ok(setup) => setup,
        // The host closed the socket (its template went) or sent something else: nothing to start.
        Err(why) => return unstarted(&control, &why),
    };
    // The namespace is entered already: a domain that asks for none is not one a spare can serve.
    if setup.args.iter().any(|a| a == "--no-pid-namespace") {
        let _ = control.send("unstarted a spare is in a PID namespace, and this domain asks for none", None);
        return ExitCode::from(2);
    }
    // The waiter and init took the template's name back at their forks; the domain proper takes it now.
    namespace::set_name(Some(own_name));
    let args = match place_shared(setup) {
        Ok(args) => args,
        Err(why) => return unstarted(&control, &why),
    };
    // Left open on 3, unowned, where the start-up takes it (`Inherited`) as an exec'd domain's.
    std::mem::forget(control);
    crate::start_entered(args, entered, first_steps)
}

/// Put the setup's shared memory on 4, 5 and 6 (where the host puts it for an exec'd domain), closing every other
/// copy; the command line.
fn place_shared(setup: Setup) -> Result<Vec<String>, SetupError> {
    let sources = [setup.region.as_fd(), setup.pool_in.as_fd(), setup.pool_out.as_fd()];
    let copies = sources.into_iter().map(copy_above_six).collect::<Result<Vec<_>, _>>()?;
    put_from(4, copies, setup)
}

/// Duplicate the control socket and the setup's descriptors onto 3, 4, 5 and 6 (where the host puts them for an
/// exec'd domain), closing every other copy; the command line.
fn place(control: std::os::fd::BorrowedFd<'_>, setup: Setup) -> Result<Vec<String>, SetupError> {
    let sources = [control, setup.region.as_fd(), setup.pool_in.as_fd(), setup.pool_out.as_fd()];
    // Copies above 6 first, so that no dup2 onto 3..6 overwrites a source not yet moved.
    let copies = sources.into_iter().map(copy_above_six).collect::<Result<Vec<_>, _>>()?;
    put_from(3, copies, setup)
}

/// The setup's own descriptors closed, then `copies` (all above 6) duplicated onto `first`, `first + 1`, ...; the
/// command line.
fn put_from(first: RawFd, copies: Vec<OwnedFd>, setup: Setup) -> Result<Vec<String>, SetupError> {
    let Setup { args, region, pool_in, pool_out } = setup;
    drop((region, pool_in, pool_out));
    for (i, copy) in copies.iter().enumerate() {
        // SAFETY: dup2 onto `first + i` (3 to 6) replaces whatever that number held, which is nothing this process
        // still uses: every source was copied above 6 before the first dup2, the setup's own descriptors were
        // closed just above, and the template's control socket was closed before the setup came.
        if unsafe { libc::dup2(copy.as_raw_fd(), first + i as RawFd) } < 0 {
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
