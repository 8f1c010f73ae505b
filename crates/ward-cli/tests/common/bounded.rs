//! A host program run with a deadline: the corpus runs hundreds of them, and a plugin that hangs must cost one
//! deadline, not the test. The program runs in a process group of its own, so that on the deadline the group (the
//! program, and under `ward run` the host it started) is killed, and nothing else.

use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How a bounded run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signalled(i32),
    /// Still running at the deadline: its process group was killed.
    TimedOut(Duration),
}

impl Ending {
    pub fn success(&self) -> bool {
        *self == Ending::Exited(0)
    }
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ending::Exited(code) => write!(f, "exit status {code}"),
            Ending::Signalled(sig) => write!(f, "killed by signal {sig}"),
            Ending::TimedOut(limit) => write!(f, "timed out (killed after {} s)", limit.as_secs()),
        }
    }
}

/// What a bounded run did: how it ended, its standard error, how long it took.
pub struct Finished {
    pub ending: Ending,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Runs `cmd` (standard input and output on /dev/null, standard error into `stderr_file`) and kills its process
/// group when it is still running after `limit`. The test fails when the program cannot be started.
pub fn run_within(cmd: &mut Command, limit: Duration, stderr_file: &Path) -> Finished {
    let err = File::create(stderr_file).unwrap_or_else(|e| panic!("create {}: {e}", stderr_file.display()));
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let ending = loop {
        // `try_wait` reaps the child only once it has ended, so until then its pid (and group id) is still ours to
        // signal.
        match child.try_wait() {
            Ok(Some(status)) => {
                break match (status.code(), status.signal()) {
                    (Some(code), _) => Ending::Exited(code),
                    (None, Some(sig)) => Ending::Signalled(sig),
                    (None, None) => Ending::Exited(-1),
                };
            }
            Ok(None) if start.elapsed() >= limit => {
                kill_group(child.id());
                let _ = child.wait();
                break Ending::TimedOut(limit);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("waiting for {cmd:?}: {e}"),
        }
    };
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&std::fs::read(stderr_file).unwrap_or_default()).into_owned();
    Finished { ending, stderr, elapsed }
}

/// SIGKILL to the process group `leader` leads: a child of ours started with `process_group(0)`, not yet reaped.
pub fn kill_group(leader: u32) {
    signal_group(leader, libc::SIGKILL);
}

/// `signal` to the process group `leader` leads (a child of ours started with `process_group(0)`, not yet reaped).
pub fn signal_group(leader: u32, signal: i32) {
    let Ok(pgid) = i32::try_from(leader) else { return };
    // SAFETY: kill(2) takes no pointers; the negative pid names the process group of our own unreaped child, whose
    // id cannot have been reused while the child is unreaped.
    unsafe {
        libc::kill(-pgid, signal);
    }
}
