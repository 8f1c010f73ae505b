//! How a process domain is started: without a fork of the host (`posix_spawn`), so the domain ties its life to
//! the host's itself, and it starts with no signal blocked whatever the host's threads block.

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use ward::Isolation;

/// Set in the environment of this test program when it runs as the host of `host_that_waits`.
const HOST_ENV: &str = "WARD_TEST_SPAWN_HOST";

/// The parent process id of `pid`: field 4 of `/proc/PID/stat`.
fn parent_of(pid: i32) -> i32 {
    stat_field(pid, 4)
}

/// A `/proc/PID/status` field, as hex.
fn status_mask(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} line"));
    u64::from_str_radix(line[field.len()..].trim(), 16).expect("a hex mask")
}

/// Whether process `pid` has ended within `timeout`: its pidfd becomes readable.
fn ends_within(pid: i32, timeout: Duration) -> bool {
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        // Gone (and reaped) already.
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    // SAFETY: a new descriptor that we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) > 0 }
}

/// Not a test of its own: the host `a_domain_dies_with_its_host` starts (this program again). It loads the faulty
/// extension in a process domain, prints the domain's process id and waits until it is killed.
#[test]
#[ignore = "run by a_domain_dies_with_its_host as its host"]
fn host_that_waits() {
    if std::env::var_os(HOST_ENV).is_none() {
        return;
    }
    let (_sup, ext, _events) = faulty(Isolation::Process, "");
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [ward::Arg::I64(1)]), 1);
    println!("domain {}", ext.pid().expect("a process domain has a process"));
    // Until killed: the test holds standard input open and never writes to it.
    let _ = std::io::stdin().read_line(&mut String::new());
}

#[test]
fn a_domain_dies_with_its_host() {
    let mut host = Command::new(std::env::current_exe().expect("this test program"))
        .args(["--ignored", "--exact", "host_that_waits", "--nocapture", "--test-threads", "1"])
        .env(HOST_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the host");
    let stdout = host.stdout.take().expect("the host's output");
    // The test harness may print the test's name on the same line first.
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("domain "))
        .expect("the host names its domain");
    let incarnation: i32 = line.rsplit("domain ").next().unwrap_or_default().trim().parse().expect("a process id");
    let zygote = parent_of(incarnation);
    assert_ne!(zygote, host.id() as i32, "the incarnation was forked by the zygote");
    let started = started_for(zygote);
    assert_eq!(parent_of(started), host.id() as i32, "the zygote was started by the host");
    host.kill().expect("kill the host");
    host.wait().expect("reap the host");
    // Generous: the kernel sends the death signals at once, but a loaded machine may take a while to run them.
    assert!(ends_within(started, Duration::from_secs(30)), "the process started for the zygote outlived its host");
    assert!(ends_within(zygote, Duration::from_secs(30)), "the zygote outlived its host");
    assert!(ends_within(incarnation, Duration::from_secs(30)), "the incarnation outlived its host");
}

#[test]
fn a_domain_starts_with_no_signal_blocked_whatever_its_host_blocks() {
    // A thread of its own that blocks every signal before the supervisor (and its monitor thread, which inherits
    // the mask and starts the domains) exists.
    std::thread::spawn(|| {
        // SAFETY: an all-zero sigset_t is storage; sigfillset initialises it; pthread_sigmask reads it.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut()), 0);
        }
        let (_sup, ext, _events) = faulty(Isolation::Process, "");
        let pid = ext.pid().expect("a process domain has a process");
        assert_eq!(status_mask(pid, "SigBlk:"), 0, "the incarnation blocks nothing");
        assert_eq!(status_mask(parent_of(pid), "SigBlk:"), 0, "the zygote blocks nothing");
    })
    .join()
    .expect("the thread that blocks every signal");
}

#[test]
fn a_domain_whose_host_is_gone_before_it_starts_does_not_run() {
    let domain = ward::domain_program().expect("the ward-domain program");
    // Process 1 did not start this one, as a domain started by a host that died at once would find.
    let out = Command::new(domain)
        .args(["--mode", "serve", "--parent", "1", "--ext", "/nonexistent.so"])
        .stdin(Stdio::null())
        .output()
        .expect("run ward-domain");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("its host (process 1) is gone"), "stderr: {stderr}");
}

/// The process group of process `pid`.
fn process_group_of(pid: i32) -> i32 {
    stat_field(pid, 5)
}

#[test]
fn a_domain_runs_as_pid_2_of_a_namespace_of_its_own_in_a_process_group_of_its_own() {
    let (_sup, ext, _events) = faulty(Isolation::Process, "");
    let incarnation = ext.pid().expect("a process domain has a process");
    let zygote = parent_of(incarnation);
    let started = started_for(zygote);
    // SAFETY: getpgid(0) asks for this process's own process group; no pointers.
    let own_group = unsafe { libc::getpgid(0) };
    assert_eq!(process_group_of(started), started, "the process started for the domain leads a group of its own");
    assert_ne!(process_group_of(started), own_group, "the domain is outside the host's process group");
    assert_eq!(process_group_of(incarnation), started, "the incarnation stays in that group");
    if !pid_namespace_or_say("a_domain_runs_as_pid_2_of_a_namespace_of_its_own_in_a_process_group_of_its_own") {
        return;
    }
    let depth = ns_pids(std::process::id() as i32).len();
    let init = parent_of(zygote);
    assert_eq!(parent_of(init), started);
    assert_eq!(ns_pids(started).len(), depth, "the process the host started stays in the host's namespace");
    assert_eq!(ns_pids(init).len(), depth + 1);
    assert_eq!(ns_pids(init).last(), Some(&1), "init is pid 1 of the new namespace");
    assert_eq!(ns_pids(zygote).last(), Some(&2), "the zygote is pid 2");
    assert_eq!(ns_pids(incarnation).len(), depth + 1, "its incarnations live in the zygote's namespace");
}
