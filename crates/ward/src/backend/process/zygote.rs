//! The warm zygote: a `ward-domain` process that loads the extensions once and forks each incarnation from there,
//! and says how each ended. One that fails to answer within the policy's deadline is killed and replaced.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use ward_xpc::control::ControlSocket;

use super::incarnation::{Ended, LaunchError};
use super::{spawn, ProcessBackend, KILL_TIMEOUT};
use crate::fault::FaultKind;

/// Why no incarnation could be forked from the zygote.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForkError {
    /// No zygote could be started.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("no zygote")]
    NoZygote,
    #[error("cannot create a control socket: {0}")]
    ControlSocket(#[source] std::io::Error),
    /// The zygote failed the request (and was killed): how.
    #[error("the zygote failed a fork request: {}", .0.cause())]
    Failed(FaultKind),
}

/// The live zygote: its processes and its control socket.
pub(super) struct Zygote {
    /// The process this side started (outside the zygote's PID namespace): its status is the zygote's.
    pub(super) child: spawn::DomainChild,
    /// The zygote proper (in its namespace): its id here, and its pidfd.
    pub(super) pid: i32,
    pub(super) pidfd: OwnedFd,
    pub(super) control: ControlSocket,
    /// How the last incarnation ended, when the zygote said so while the host waited for another answer.
    pub(super) exit_said: Option<String>,
}

impl ProcessBackend {
    pub(super) fn kill_zygote(&mut self) {
        if let Some(mut z) = self.zygote.take() {
            // Once the zygote's status is in, every process of its namespace has ended: its incarnations too.
            let _ = z.child.end(z.pidfd.as_fd(), KILL_TIMEOUT);
        }
    }

    pub(super) fn zygote_alive(&self) -> bool {
        self.zygote.as_ref().is_some_and(|z| !spawn::wait_dead(z.pidfd.as_fd(), Duration::ZERO))
    }

    /// The zygote failed (`how`): kill and reap it, and keep `how` for the core to report. The next restart starts
    /// a new one. A stopped zygote is killed too (SIGKILL ends a stopped process), and so is any incarnation it
    /// forked meanwhile (incarnations die with their zygote, `PR_SET_PDEATHSIG`).
    fn zygote_failed(&mut self, how: FaultKind) {
        if self.zygote.is_some() {
            self.kill_zygote();
            self.zygote_failures.push(how);
        }
    }

    /// The zygote did not give the answer it was asked for: it is dead (`Vanished`), or else it did not answer
    /// within the deadline.
    fn zygote_silent(&self) -> FaultKind {
        if self.zygote.is_some() && !self.zygote_alive() {
            FaultKind::Vanished
        } else {
            FaultKind::Timeout { deadline: self.cfg.deadline }
        }
    }

    /// Fork an incarnation from the zygote (starting one if needed): its pid, pidfd, and (with an arena) its
    /// control socket, whose other end goes with the fork request. A zygote that does not answer within the
    /// policy's deadline, or answers something else, failed: it is killed (`zygote_failed`) and this fails.
    pub(super) fn fork_from_zygote(&mut self) -> Result<(i32, OwnedFd, Option<ControlSocket>), ForkError> {
        if self.zygote.is_some() && !self.zygote_alive() {
            // It died since the last fork (nothing of ours kills a zygote without dropping it).
            self.zygote_failed(FaultKind::Vanished);
        }
        // A fork request sent with a zygote started here: its answer follows `ready`.
        let mut asked = None;
        if self.zygote.is_none() {
            let started = self.launch(spawn::Role::Zygote)?;
            asked = started.first_fork;
            self.zygote = Some(Zygote {
                child: started.child,
                pid: started.pid,
                pidfd: started.pidfd,
                control: started.control,
                exit_said: None,
            });
        }
        let deadline = self.cfg.deadline;
        let z = self.zygote.as_ref().ok_or(ForkError::NoZygote)?;
        let (ours, answer) = match asked {
            Some(first) => (first.channel, z.control.recv(Some(deadline))),
            None => {
                let channel = match self.arena {
                    true => Some(ControlSocket::pair().map_err(ForkError::ControlSocket)?),
                    false => None,
                };
                let (ours, theirs) = match channel {
                    Some((ours, theirs)) => (Some(ours), Some(theirs)),
                    None => (None, None),
                };
                let answer = match z.control.send("fork", theirs.as_ref().map(|t| t.as_fd())) {
                    Ok(()) => z.control.recv(Some(deadline)),
                    Err(e) => Err(e),
                };
                (ours, answer)
            }
        };
        let how = match answer {
            // The pid in the text is the zygote's namespace's: the pidfd says which process it is here.
            Ok(Some(m)) => match (m.text.starts_with("forked "), m.fd) {
                (true, Some(fd)) => match spawn::incarnation_of(fd.as_fd(), z.pid) {
                    Ok(pid) => return Ok((pid, fd, ours)),
                    Err(why) => FaultKind::Protocol { what: format!("it answered a fork request, but {why}") },
                },
                _ => FaultKind::Protocol { what: format!("it answered a fork request with `{}`", m.text) },
            },
            Ok(None) => self.zygote_silent(),
            Err(e) => FaultKind::Protocol { what: format!("its control socket failed: {e}") },
        };
        let why = ForkError::Failed(how.clone());
        self.zygote_failed(how);
        Err(why)
    }

    /// How the incarnation the zygote forked ended, as the zygote reports it (`exit code N`, `exit signal N`). A
    /// zygote that does not say so within the policy's deadline, or says something else, failed: it is killed
    /// (`zygote_failed`), and nothing says how the incarnation ended.
    pub(super) fn exit_from_zygote(&mut self) -> Option<Ended> {
        let deadline = self.cfg.deadline;
        let z = self.zygote.as_mut()?;
        let text = match z.exit_said.take() {
            Some(text) => text,
            None => match z.control.recv(Some(deadline)) {
                Ok(Some(m)) => m.text,
                Ok(None) => {
                    let how = self.zygote_silent();
                    self.zygote_failed(how);
                    return None;
                }
                Err(e) => {
                    self.zygote_failed(FaultKind::Protocol { what: format!("its control socket failed: {e}") });
                    return None;
                }
            },
        };
        let Some(rest) = text.strip_prefix("exit ") else {
            self.zygote_failed(FaultKind::Protocol {
                what: format!("it answered `{text}` where it was to say how an incarnation ended"),
            });
            return None;
        };
        // `exit unknown`: the zygote could not learn the status either.
        if let Some(n) = rest.strip_prefix("signal ") {
            return n.parse().ok().map(Ended::Signal);
        }
        rest.strip_prefix("code ")?.parse().ok().map(Ended::Code)
    }
}
