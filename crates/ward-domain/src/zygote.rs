//! Zygote mode: stay loaded and initialised, and fork a fresh incarnation for every `fork` request.
//!
//! Restarting from a warm zygote skips exec, dynamic linking, `dlopen` and init: recovery costs a fork. The zygote
//! stays single-threaded, so forking it is safe. It waits for each child it forks and reports how it ended
//! (`exit code N`, `exit signal N`), since only a parent can read that status.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::process::ExitCode;

use ward_xpc::control::ControlSocket;

use crate::{faults, serve, Setup};

pub fn run(setup: Setup, control: ControlSocket) -> ExitCode {
    let _ = control.send("ready", None);
    loop {
        let message = match control.recv(None) {
            Ok(Some(m)) => m,
            // The host closed the socket or is gone: nothing left to serve.
            _ => return ExitCode::SUCCESS,
        };
        if message.text != "fork" {
            let _ = control.send(&format!("error unknown control message `{}`", message.text), None);
            continue;
        }
        // SAFETY: this process is single-threaded (the zygote never starts threads), so the child is a consistent
        // copy.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let _ = control.send(&format!("error fork failed: {}", std::io::Error::last_os_error()), None);
            continue;
        }
        if pid == 0 {
            drop(control);
            return child(setup);
        }
        // SAFETY: pidfd_open on our own, not yet reaped child.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if pidfd < 0 {
            let _ = control.send(&format!("error pidfd_open failed: {}", std::io::Error::last_os_error()), None);
            // SAFETY: killing the child we just forked.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        } else {
            // SAFETY: pidfd_open returned a new descriptor that we own.
            let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
            let _ = control.send(&format!("forked {pid}"), Some(pidfd.as_fd()));
        }
        let _ = control.send(&wait_for(pid), None);
    }
}

fn child(setup: Setup) -> ExitCode {
    // SAFETY: prctl and getppid have no memory preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    if let Err(e) = faults::apply_limits(&setup.args.limits) {
        eprintln!("ward-domain: cannot apply resource limits: {e}");
        return ExitCode::from(2);
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
