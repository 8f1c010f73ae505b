//! Throwaway hosts: re-run this program with a hidden subcommand in a child process, wait a bounded time, and
//! say how it ended. The demo survives whatever the child does.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signaled(i32),
    /// Still running at the bound; it was killed.
    Hung(Duration),
}

#[derive(Debug)]
pub struct ChildRun {
    pub end: End,
    pub stdout: String,
    pub stderr: String,
}

/// Run `ward ARGS...` with `env` added to (or replacing variables of) this process's environment, and wait at
/// most `bound` for it.
pub fn run_bounded(args: &[OsString], env: &[(OsString, OsString)], bound: Duration) -> Result<ChildRun> {
    let exe = std::env::current_exe().context("cannot find the running ward program to start a child host")?;
    let mut child = Command::new(&exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start a child host ({})", exe.display()))?;
    // Readers on their own threads, so a chatty child cannot block on a full pipe while we wait for it.
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + bound;
    let end = loop {
        if let Some(status) = child.try_wait().context("cannot wait for the child host")? {
            break match (status.code(), status.signal()) {
                (Some(code), _) => End::Exited(code),
                (None, Some(sig)) => End::Signaled(sig),
                (None, None) => End::Exited(-1),
            };
        }
        if Instant::now() >= deadline {
            // Already dead is fine: wait() below reaps it either way.
            let _ = child.kill();
            child.wait().context("cannot reap the child host")?;
            break End::Hung(bound);
        }
        // Polling interval of the bound, not synchronisation: exit is observed within 2 ms.
        std::thread::sleep(Duration::from_millis(2));
    };
    Ok(ChildRun { end, stdout: joined(out), stderr: joined(err) })
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<String>> {
    let mut pipe = pipe?;
    Some(std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    }))
}

fn joined(h: Option<JoinHandle<String>>) -> String {
    h.and_then(|h| h.join().ok()).unwrap_or_default()
}

/// "host killed by SIGSEGV", "host hung (killed after 5 s)", "host exited with status 3".
pub fn describe_death(end: End) -> String {
    match end {
        End::Exited(code) => format!("host exited with status {code}"),
        End::Signaled(sig) => format!("host killed by {}", ward::fault::signal_name(sig)),
        End::Hung(bound) => format!("host hung (killed after {} s)", bound.as_secs()),
    }
}
