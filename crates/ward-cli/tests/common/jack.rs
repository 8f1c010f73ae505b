//! A JACK server for one test, and jalv run in it for a fixed time.
//!
//! The server is jackd2 with the dummy backend (no sound card: its driver thread wakes once a period, as a card
//! would, and calls every client's process callback with that deadline), under a server name of its own so that
//! tests and other users' servers never meet. jackd2 keeps its sockets and shared memory under the server's name in
//! /dev/shm, so the name is all that keeps servers apart; clients are told the name by `JACK_DEFAULT_SERVER` and are
//! forbidden to start a server of their own (`JACK_NO_START_SERVER`), so that a client polling before the server is
//! up never starts one from ~/.jackdrc.
//!
//! Readiness is polled, never slept for: the server is ready when `jack_lsp` (jackd2's tools) connects to it, a
//! client when its ports are listed. The xruns are read from the server's standard error when it has stopped.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::bounded::signal_group;
use super::{host, Scratch};

/// How long a server or client may take to come up, or to stop, on a loaded two-core machine: generous.
const DEADLINE: Duration = Duration::from_secs(60);
/// How often readiness is polled.
const POLL: Duration = Duration::from_millis(50);

pub const SAMPLE_RATE: u32 = 48_000;
pub const PERIOD: u32 = 128;

/// A running `jackd -d dummy`, our child; stopped (SIGINT, then SIGKILL past the deadline) when dropped.
pub struct JackServer {
    name: String,
    child: Option<Child>,
    stderr_path: PathBuf,
}

/// What JACK counted over a server's life, from its standard error.
#[derive(Debug, Clone)]
pub struct Xruns {
    /// `JackEngine::XRun: client = NAME was not finished`: a client's process callback missed the period.
    pub client: usize,
    /// `JackTimedDriver::Process XRun`: the dummy driver itself woke late (the machine's scheduling, no client's
    /// doing).
    pub driver: usize,
    /// The server's whole standard error, for the report.
    pub log: String,
}

impl JackServer {
    /// Starts `jackd -n NAME -d dummy -r 48000 -p 128` and waits until it accepts clients.
    pub fn start(scratch: &Scratch, tag: &str) -> JackServer {
        // Unique on the machine: this process's id, and a count of the servers it started (tests run in parallel).
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let name = format!("ward-test-{}-{n}-{tag}", std::process::id());
        let stderr_path = scratch.path(&format!("jackd-{n}-{tag}.err"));
        let err = std::fs::File::create(&stderr_path).expect("create the jackd log");
        let child = Command::new(host("jackd"))
            .args(["-n", &name, "-d", "dummy", "-r", &SAMPLE_RATE.to_string(), "-p", &PERIOD.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start jackd: {e}"));
        let mut server = JackServer { name, child: Some(child), stderr_path };
        let start = Instant::now();
        loop {
            if server.ports().is_some() {
                return server;
            }
            let exited = server.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            assert!(exited.is_none(), "jackd exited before accepting clients ({exited:?}): {}", server.log());
            assert!(start.elapsed() < DEADLINE, "jackd accepted no client within {DEADLINE:?}: {}", server.log());
            std::thread::sleep(POLL);
        }
    }

    /// Points a client at this server, and forbids it to start one.
    pub fn client_env<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.env("JACK_DEFAULT_SERVER", &self.name).env("JACK_NO_START_SERVER", "1")
    }

    /// Every port of the server (`jack_lsp`), or None while it accepts no client.
    pub fn ports(&self) -> Option<Vec<String>> {
        let out = self
            .client_env(&mut Command::new(host("jack_lsp")))
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run jack_lsp: {e}"));
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect())
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.stderr_path).unwrap_or_default()).into_owned()
    }

    /// Stops the server and counts its xruns.
    pub fn stop(mut self) -> Xruns {
        if let Some(child) = self.child.take() {
            stop_child(child, libc::SIGINT, "jackd");
        }
        let log = self.log();
        Xruns {
            client: log.lines().filter(|l| l.contains("JackEngine::XRun")).count(),
            driver: log.lines().filter(|l| l.contains("JackTimedDriver::Process XRun")).count(),
            log,
        }
    }
}

impl Drop for JackServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_child(child, libc::SIGINT, "jackd");
        }
    }
}

/// Sends `signal` to our child's process group and waits for it; SIGKILL past the deadline.
fn stop_child(mut child: Child, signal: i32, what: &str) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    signal_group(child.id(), signal);
    wait_or_kill(&mut child, what)
}

/// Waits for our child up to the deadline, then kills its process group; None when it had to be killed.
fn wait_or_kill(child: &mut Child, what: &str) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if start.elapsed() >= DEADLINE => {
                eprintln!("{what} did not stop within {DEADLINE:?}: killed");
                signal_group(child.id(), libc::SIGKILL);
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    }
}

/// What a jalv run gave.
pub struct JalvRun {
    /// How jalv ended (None: it had to be killed).
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    /// The server's xruns over the run (the server is started for the run and stopped after it).
    pub xruns: Xruns,
}

/// Runs `jalv` (the command `jalv`, alone or after `ward run ... --`) with `args` in a fresh JACK server: waits until
/// its client's ports are listed (it is then called every period), lets it run for `run_for` (the point of the run:
/// a time-bounded stretch of real-time processing), asks it for its output controls (`monitors`), closes its
/// standard input (jalv quits at end of input; SIGINT to its group past the deadline), then stops the server.
pub fn run_jalv(scratch: &Scratch, tag: &str, mut jalv: Command, client: &str, run_for: Duration) -> JalvRun {
    let server = JackServer::start(scratch, tag);
    let mut child = server
        .client_env(&mut jalv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {jalv:?}: {e}"));
    // jalv writes its output block-buffered to a pipe: read both streams to the end on threads, so that neither pipe
    // fills while we wait.
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let mut stdin = child.stdin.take().expect("piped stdin");

    let prefix = format!("{client}:");
    let start = Instant::now();
    let registered = loop {
        if server.ports().is_some_and(|ports| ports.iter().any(|p| p.starts_with(&prefix))) {
            break true;
        }
        if child.try_wait().ok().flatten().is_some() || start.elapsed() >= DEADLINE {
            break false;
        }
        std::thread::sleep(POLL);
    };
    if registered {
        std::thread::sleep(run_for);
        // A broken pipe here means jalv has already gone; its status says why.
        let _ = stdin.write_all(b"monitors\n");
    }
    drop(stdin);
    let status = match child.try_wait() {
        Ok(Some(status)) => Some(status),
        _ => wait_or_interrupt(&mut child),
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let xruns = server.stop();
    assert!(
        registered,
        "{client} never showed its ports in JACK within {DEADLINE:?}\nstdout: {stdout}\nstderr: {stderr}"
    );
    JalvRun { status, stdout, stderr, xruns }
}

/// Waits for jalv to quit after its input closed; SIGINT to its group past the deadline, SIGKILL past another.
fn wait_or_interrupt(child: &mut Child) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < DEADLINE {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(POLL);
    }
    eprintln!("jalv did not quit at end of input within {DEADLINE:?}: SIGINT");
    signal_group(child.id(), libc::SIGINT);
    wait_or_kill(child, "jalv")
}

fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = from.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
