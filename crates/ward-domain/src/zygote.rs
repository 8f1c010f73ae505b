//! Zygote mode: stay loaded and initialised, and fork a fresh incarnation for every `fork` request.
//!
//! Restarting from a warm zygote skips exec, dynamic linking, `dlopen` and init: recovery costs a fork. The zygote
//! stays single-threaded, so forking it is safe. It reports how each child it forked ended (`exit code N`,
//! `exit signal N`), since only a parent can read that status. When a group gains a member the host asks the
//! zygote to `load` it too ([`LoadRequest`]), so later incarnations are forked with it; the zygote therefore waits
//! for its child and for the host's requests at once. It loads a new member in a throwaway child first: the
//! running incarnation is the zygote's child and dies with it (`PR_SET_PDEATHSIG`), so a constructor that crashes
//! must not crash the zygote (a file already loaded is exempt, having no constructor left to run).

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;

use ward_xpc::control::{ControlSocket, LoadRequest};

use crate::args::ExtensionArg;
use crate::error::TrialLoadError;
use crate::{loader, serve, Setup};

/// The incarnation forked last, until its end is reported.
struct Child {
    pid: i32,
    pidfd: OwnedFd,
}

pub fn run(mut setup: Setup, control: ControlSocket) -> ExitCode {
    // The incarnations' filter, compiled once here (if the template did not already) so each fork only patches in
    // its pid; a failure here is the incarnation's to report, when it compiles the filter itself.
    let _ = crate::sandbox::prepare(&setup.args.sandbox);
    let mut child: Option<Child> = None;
    loop {
        match wait_either(&control, child.as_ref()) {
            Ready::Child => {
                if let Some(c) = child.take() {
                    let _ = control.send(&wait_for(c.pid), None);
                }
                continue;
            }
            Ready::Control => {}
            // The host is gone, or polling itself failed: nothing left to serve.
            Ready::Neither => return ExitCode::SUCCESS,
        }
        let message = match control.recv(None) {
            Ok(Some(m)) => m,
            // The host closed the socket or is gone: nothing left to serve.
            _ => return ExitCode::SUCCESS,
        };
        if let Some(request) = LoadRequest::parse(&message.text) {
            let ext = ExtensionArg {
                path: request.path.into(),
                init: request.init.map(str::to_string),
                poison: request.poison,
            };
            // A file this process has loaded already runs no constructor again (dlopen counts a reference), so
            // only an init function could fail: the trial is for the rest.
            let risky = ext.init.is_some() || !loader::is_loaded(&ext.path);
            let tried = if risky { trial_load(&mut setup, &ext) } else { Ok(()) };
            let loaded = tried.and_then(|()| Ok(setup.library.load_one(&ext)?));
            let mut answer = match loaded {
                Ok(index) => format!("loaded {index}"),
                Err(reason) => format!("error {reason}"),
            };
            ward_xpc::control::fit(&mut answer);
            let _ = control.send(&answer, None);
            continue;
        }
        if message.text != "fork" {
            let _ = control.send(&format!("error unknown control message `{}`", message.text), None);
            continue;
        }
        if let Some(c) = child.take() {
            // The host forks the next incarnation only after the last one ended; should it not, the status of
            // the last is reported first so the answers keep their order.
            let _ = control.send(&wait_for(c.pid), None);
        }
        // With an arena, the incarnation's own control socket comes with the request; the zygote keeps no copy.
        let channel = message.fd.map(ControlSocket::from_fd);
        // SAFETY: getpid has no preconditions.
        let zygote = unsafe { libc::getpid() };
        // SAFETY: this process is single-threaded (the zygote never starts threads), so the child is a consistent
        // copy.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let _ = control.send(&format!("error fork failed: {}", std::io::Error::last_os_error()), None);
            continue;
        }
        if pid == 0 {
            drop(control);
            return serve_child(setup, zygote, channel);
        }
        drop(channel);
        // SAFETY: pidfd_open on our own, not yet reaped child.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if pidfd < 0 {
            let _ = control.send(&format!("error pidfd_open failed: {}", std::io::Error::last_os_error()), None);
            // SAFETY: killing the child we just forked.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = wait_for(pid);
            continue;
        }
        // SAFETY: pidfd_open returned a new descriptor that we own.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
        // The pid is this namespace's, for a reader of the messages; the host goes by the pidfd.
        let _ = control.send(&format!("forked {pid}"), Some(pidfd.as_fd()));
        child = Some(Child { pid, pidfd });
    }
}

/// How long a trial load may take: less than the host waits for the answer, so the host hears why.
const TRIAL_TIMEOUT_MS: i32 = 30_000;

/// Load `ext` in a forked child, which then exits: Err when loading it killed or hung that child. A load that merely
/// fails (dlopen's error, an init function's result) is reported by the zygote's own attempt.
fn trial_load(setup: &mut Setup, ext: &ExtensionArg) -> Result<(), TrialLoadError> {
    // SAFETY: this process is single-threaded (the zygote never starts threads), so the child is a consistent copy.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(TrialLoadError::Fork(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: prctl has no memory preconditions; _exit ends the child without running the extensions'
        // destructors or flushing anything the zygote owns.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let _ = setup.library.load_one(ext);
            libc::_exit(0);
        }
    }
    // SAFETY: pidfd_open on our own, not yet reaped child.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd >= 0 {
        // SAFETY: pidfd_open returned a new descriptor that we own.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
        let mut fd = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut fd, 1, TRIAL_TIMEOUT_MS) };
        if ready == 0 {
            // SAFETY: killing the child we forked, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = wait_for(pid);
            return Err(TrialLoadError::TimedOut { seconds: (TRIAL_TIMEOUT_MS / 1000) as u64 });
        }
    }
    match wait_for(pid).as_str() {
        "exit code 0" => Ok(()),
        ended => Err(TrialLoadError::Killed { ended: ended.trim_start_matches("exit ").to_string() }),
    }
}

enum Ready {
    Child,
    Control,
    Neither,
}

/// Wait until the child has ended or the host sent something; the child first, so its status goes out before the
/// answer to anything the host sent after it.
fn wait_either(control: &ControlSocket, child: Option<&Child>) -> Ready {
    let mut fds = [
        libc::pollfd { fd: child.map_or(-1, |c| c.pidfd.as_raw_fd()), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: control.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    loop {
        // SAFETY: fds is an array of two valid pollfd structures; a negative fd is ignored by poll.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Ready::Neither;
        }
        if fds[0].revents != 0 {
            return Ready::Child;
        }
        if fds[1].revents != 0 {
            return Ready::Control;
        }
    }
}

/// An incarnation (`channel`: its control socket, for arena blocks): dies with the zygote (`zygote`: its process
/// id), which the host kills when it fails to answer in time, so an incarnation it forked meanwhile never serves the
/// rings beside the next one.
fn serve_child(mut setup: Setup, zygote: libc::pid_t, channel: Option<ControlSocket>) -> ExitCode {
    // SAFETY: prctl and getppid have no memory preconditions.
    let parent = unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::getppid()
    };
    if parent != zygote {
        // The zygote died before the death signal was set: it would never come.
        return ExitCode::from(2);
    }
    // SAFETY: getpid has no preconditions.
    let own = unsafe { libc::getpid() };
    if let Err(e) = crate::sandbox::serving(&setup.args.sandbox, own) {
        eprintln!("ward-domain: {e}");
        return ExitCode::from(2);
    }
    if let (Some(arena), Some(channel)) = (setup.arena.as_mut(), channel) {
        arena.attach(channel);
    }
    serve::run(setup)
}

fn wait_for(pid: i32) -> String {
    let mut status = 0;
    loop {
        // SAFETY: status is a valid int to write to.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            break;
        }
        if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return "exit unknown".into();
        }
    }
    if libc::WIFSIGNALED(status) {
        format!("exit signal {}", libc::WTERMSIG(status))
    } else {
        format!("exit code {}", libc::WEXITSTATUS(status))
    }
}
