//! Starting `ward-domain` processes: finding the program, handing over the descriptors, waiting until it is loaded.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ward_xpc::control::ControlSocket;

use crate::backend::ExtensionSpec;
use crate::policy::Limits;

/// How long a domain may take to load its extensions before the start counts as failed.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the `ward-domain` program is: `$WARD_DOMAIN`, else beside the running program, else one directory up
/// (test and bench programs live in `target/<profile>/deps`).
pub(crate) fn find_program() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("WARD_DOMAIN") {
        let p = PathBuf::from(p);
        return if p.is_file() { Ok(p) } else { Err(format!("WARD_DOMAIN={} is not a file", p.display())) };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the running program: {e}"))?;
    let mut tried = Vec::new();
    for dir in exe.parent().into_iter().chain(exe.parent().and_then(Path::parent)) {
        let candidate = dir.join("ward-domain");
        if candidate.is_file() {
            return Ok(candidate);
        }
        tried.push(candidate.display().to_string());
    }
    Err(format!("looked in {}", tried.join(", ")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Serve,
    Zygote,
}

pub(crate) struct Launch<'a> {
    pub program: &'a Path,
    pub mode: Mode,
    pub spin: u32,
    pub limits: &'a Limits,
    pub extensions: &'a [ExtensionSpec],
    pub region: BorrowedFd<'a>,
    pub pool_in: BorrowedFd<'a>,
    pub pool_out: BorrowedFd<'a>,
    /// The host's arena (`ward_xpc::arena`), whose blocks calls may lend in place.
    pub arena: Option<BorrowedFd<'a>>,
    /// A run-time library fault for the domain (policy `library_fault`).
    pub preload: Option<&'a crate::libfault::Preload>,
}

/// A started domain process with its pidfd.
pub(crate) struct Started {
    pub child: Child,
    pub pidfd: OwnedFd,
    pub control: ControlSocket,
}

/// Spawn and wait for `ready`. Must run on the monitor thread (see there why).
pub(crate) fn spawn(launch: &Launch<'_>) -> Result<Started, String> {
    let (ours, theirs) = ControlSocket::pair().map_err(|e| format!("cannot create a control socket: {e}"))?;
    let mut cmd = Command::new(launch.program);
    cmd.arg("--mode").arg(match launch.mode {
        Mode::Serve => "serve",
        Mode::Zygote => "zygote",
    });
    cmd.arg("--spin").arg(launch.spin.to_string());
    cmd.arg("--as-mb").arg(launch.limits.address_space_mb.to_string());
    cmd.arg("--cpu-s").arg(launch.limits.cpu_s.to_string());
    cmd.arg("--nofile").arg(launch.limits.open_files.to_string());
    if launch.arena.is_some() {
        cmd.arg("--arena");
    }
    for ext in launch.extensions {
        cmd.arg("--ext").arg(&ext.path);
        if let Some(init) = &ext.init {
            cmd.arg("--init").arg(init);
        }
        if ext.poison {
            cmd.arg("--poison");
        }
    }
    // A preload shim (`ward run`) belongs to the host: the domain must load the plugin itself, not a proxy.
    cmd.env_remove("LD_PRELOAD");
    cmd.env_remove(crate::libfault::ENV_VAR);
    if let Some(preload) = launch.preload {
        // The domain's own preload, not the host's: it injects the library fault policy asks for into the calls of
        // one object.
        cmd.env("LD_PRELOAD", &preload.library).env(crate::libfault::ENV_VAR, &preload.config);
    }
    cmd.stdin(Stdio::null());
    // Descriptors 3, 4, 5, 6 and (with an arena) 7 in the domain, in this order.
    let mut sources: [RawFd; 5] = [
        std::os::fd::AsFd::as_fd(&theirs).as_raw_fd(),
        launch.region.as_raw_fd(),
        launch.pool_in.as_raw_fd(),
        launch.pool_out.as_raw_fd(),
        -1,
    ];
    let count = match launch.arena {
        Some(fd) => {
            sources[4] = fd.as_raw_fd();
            5
        }
        None => 4,
    };
    // SAFETY: the closure runs in the forked child before exec and only calls async-signal-safe functions (fcntl,
    // dup2, prctl) on descriptors that are open in the parent and therefore in the child.
    unsafe {
        cmd.pre_exec(move || {
            // Move every source out of the way first so no dup2 clobbers a source not yet moved.
            let mut moved = [0 as RawFd; 5];
            for (i, src) in sources[..count].iter().enumerate() {
                let fd = libc::fcntl(*src, libc::F_DUPFD_CLOEXEC, 16);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                moved[i] = fd;
            }
            for (i, fd) in moved[..count].iter().enumerate() {
                // dup2 clears close-on-exec on the new descriptor.
                if libc::dup2(*fd, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", launch.program.display()))?;
    drop(theirs);
    let pidfd = match pidfd_open(child.id() as i32) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("pidfd_open: {e}"));
        }
    };
    match ours.recv(Some(START_TIMEOUT)) {
        Ok(Some(m)) if m.text == "ready" => Ok(Started { child, pidfd, control: ours }),
        Ok(Some(m)) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(m.text.strip_prefix("error ").unwrap_or(&m.text).to_string())
        }
        Ok(None) | Err(_) => {
            let _ = child.kill();
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            Err(format!("the domain process ended during start-up ({status})"))
        }
    }
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
