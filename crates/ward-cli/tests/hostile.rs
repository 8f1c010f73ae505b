//! The hostile-plugin battery (issue 28): an unmodified sox under `ward run` with a LADSPA plugin that attacks its
//! host, its sibling domains and the machine (`extensions/hostile_ladspa.c`). The plugin is an identity, so a
//! process domain that holds gives sox the same audio as a plugin that never attacked: each attack either fails
//! inside the plugin (which carries on) or kills the domain with SIGSYS, which ward reports as a fault of that
//! plugin, recovers and, after repeated faults, bypasses.
//!
//! Every test runs sox twice, writing WAV to its standard output (captured here, so a plugin that writes into the
//! host's output shows): once with attack 0 (none) and once with its attack, both through the same chain (the
//! hostile plugin, then Debian's `amp_1181`, an innocent plugin in a domain of its own). Each test has a token of
//! its own in the hosts' environment, by which it finds the processes and files an attack left; a failing run
//! removes the files it finds, and the processes an attack forks end by themselves within 30 s.

use std::io::{ErrorKind, Read};
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;
use common::{host, Scratch};

/// How long one sox run may take before the test kills it and fails: far beyond any real run.
const HOST_DEADLINE: Duration = Duration::from_secs(300);
/// How long the processes carrying a test's token get to end after the host ended: the domains end with it at once;
/// anything still there after this outlived its host.
const LINGER_DEADLINE: Duration = Duration::from_secs(10);
/// The innocent plugin after the hostile one; never reported faulty.
const INNOCENT: &str = "/usr/lib/ladspa/amp_1181.so";
const INNOCENT_DOMAIN: &str = "amp_1181";

/// The files named with a token that attack 11 creates (`ward-hostile-TOKEN-...` in /dev/shm and /tmp): listed, and
/// removed when the test ends, whatever its outcome.
struct Planted {
    token: String,
}

impl Planted {
    fn list(&self) -> Vec<PathBuf> {
        let prefix = format!("ward-hostile-{}", self.token);
        let mut found = Vec::new();
        for dir in ["/dev/shm", "/tmp"] {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    found.push(entry.path());
                }
            }
        }
        found
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        for path in self.list() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A mono 16-bit WAV of one second at 48 kHz: a sine, made by sox itself without dither.
fn sine_wav(path: &Path) {
    let out = Command::new(host("sox"))
        .args(["-D", "-n", "-r", "48000", "-c", "1", "-b", "16"])
        .arg(path)
        .args(["synth", "1", "sine", "440", "vol", "0.5"])
        .output()
        .expect("run sox");
    assert!(out.status.success(), "sox could not make a test signal: {}", String::from_utf8_lossy(&out.stderr));
}

/// The directory the built-in extensions are extracted to (LADSPA_PATH for sox).
fn builtin_dir() -> PathBuf {
    ward_extensions::extracted().expect("extract the built-in extensions")
}

/// A token no other test or run shares: this process, the attack, the time.
fn token(attack: u32) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}x{attack}x{nanos}", std::process::id())
}

/// Runs `cmd` to its end with standard output and error captured (read as they come, so a host that writes much
/// never waits on a full pipe); kills it (the process this test started, by its id, before it is reaped) if it is
/// not done within HOST_DEADLINE. Also gives its process id.
fn output_within(cmd: &mut Command) -> (Output, u32) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let pid = child.id() as libc::pid_t;
    let (done, finished) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(HOST_DEADLINE) == Err(mpsc::RecvTimeoutError::Timeout) {
            // SAFETY: kill takes no pointers; `pid` is the child started above, which is not reaped before this
            // thread is joined, so the number cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return true;
        }
        false
    });
    // Wait for the child to end without reaping it, so the watchdog can never signal a reused process id.
    // SAFETY: an all-zero siginfo_t is a valid value for waitid to overwrite.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waitid writes only into `info`, which lives across the call.
        let rc = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 || std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            break;
        }
    }
    let _ = done.send(());
    let killed = watchdog.join().expect("the watchdog thread");
    let status = child.wait().expect("reap the host");
    let out = Output {
        status,
        stdout: stdout.join().expect("the standard output reader"),
        stderr: stderr.join().expect("the standard error reader"),
    };
    assert!(!killed, "{cmd:?} did not end within {HOST_DEADLINE:?}: killed\n{}", String::from_utf8_lossy(&out.stderr));
    (out, pid as u32)
}

/// The pids of the live processes whose environment holds `WARD_HOSTILE_TOKEN=token` (those this test can read).
fn carrying(token: &str) -> Vec<i32> {
    let needle = format!("WARD_HOSTILE_TOKEN={token}");
    let Ok(proc) = std::fs::read_dir("/proc") else { return Vec::new() };
    proc.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

/// Waits (up to LINGER_DEADLINE) for every process carrying `token` to end; returns those still alive then, each
/// with its command name.
fn survivors(token: &str) -> Vec<String> {
    let start = Instant::now();
    loop {
        let alive = carrying(token);
        if alive.is_empty() {
            return Vec::new();
        }
        if start.elapsed() > LINGER_DEADLINE {
            return alive
                .iter()
                .map(|pid| {
                    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                    format!("{pid} ({})", comm.trim())
                })
                .collect();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the attack needs a system call the sandbox forbids, so the domain dies of SIGSYS and ward says so.
#[derive(Clone, Copy, PartialEq)]
enum Expect {
    /// The attack fails inside the plugin (EACCES, EPERM, ENOSYS, or harmless as with a detached stdout).
    Refused,
    /// A line `ward: hostile_ladspa: fault: ... (SIGSYS)` on sox's standard error.
    Trapped,
}

/// Runs sox through the hostile plugin (attack `attack`) and the innocent one under `ward run` (with the policy
/// file `policy`, if any); gives sox's process id too (`ward run` becomes sox).
fn sox(s: &Scratch, attack: u32, token: &str, port: u16, policy: Option<&Path>) -> (Output, u32) {
    let mut ward = Command::new(env!("CARGO_BIN_EXE_ward"));
    ward.args(["run", "--isolation", "process"]).env("WARD_CACHE_DIR", common::fresh_cache_dir());
    if let Some(policy) = policy {
        ward.arg("--policy").arg(policy);
    }
    output_within(
        ward.args(["--", host("sox"), "-D"])
            .arg(s.path("in.wav"))
            .args(["-t", "wav", "-", "ladspa", "hostile_ladspa", "hostile", &attack.to_string()])
            .args(["ladspa", INNOCENT, "amp", "-6"])
            .env("LADSPA_PATH", builtin_dir())
            .env("WARD_HOSTILE_TOKEN", token)
            .env("WARD_HOSTILE_DIR", s.dir())
            .env("WARD_HOSTILE_PORT", port.to_string()),
    )
}

/// The battery for one attack: every way the attack could have got through, all checked, all reported at once.
fn battery(attack: u32, expect: Expect) {
    battery_under(attack, expect, None);
}

/// [`battery`] under a policy (TOML), for both runs; gives sox's standard error and process id of the attack's run.
fn battery_under(attack: u32, expect: Expect, policy: Option<&str>) -> (String, u32) {
    let s = Scratch::new("hostile", &format!("attack{attack}"));
    let policy = policy.map(|text| {
        let path = s.path("policy.toml");
        std::fs::write(&path, text).expect("write the policy");
        path
    });
    sine_wav(&s.path("in.wav"));
    let token = token(attack);
    let planted = Planted { token: token.clone() };
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen on the loopback");
    let port = listener.local_addr().expect("the listener's address").port();

    let (clean, _) = sox(&s, 0, &token, port, policy.as_deref());
    let clean_err = String::from_utf8_lossy(&clean.stderr).into_owned();
    assert!(clean.status.success(), "without an attack sox finishes: {:?}\n{clean_err}", clean.status);
    assert!(clean.stdout.starts_with(b"RIFF") && clean.stdout.len() > 48000, "sox wrote a WAV: {clean_err}");
    assert!(!clean_err.contains("ward: hostile_ladspa") && !clean_err.contains("ward: amp"), "{clean_err}");

    let (out, pid) = sox(&s, attack, &token, port, policy.as_deref());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut problems = Vec::new();
    if !out.status.success() {
        let how = match out.status.signal() {
            Some(signo) => format!("killed by signal {signo}"),
            None => format!("exit status {:?}", out.status.code()),
        };
        problems.push(format!("sox did not finish: {how}"));
    }
    if out.stdout != clean.stdout {
        let marked = out.stdout.windows(5).any(|w| w == b"PWNED");
        problems.push(format!(
            "sox's output differs from the run without the attack ({} bytes against {}{})",
            out.stdout.len(),
            clean.stdout.len(),
            if marked { ", \"PWNED\" in it" } else { "" }
        ));
    }
    if err.contains("PWNED") {
        problems.push("\"PWNED\" on sox's standard error".into());
    }
    if s.path("sh-ran").exists() {
        problems.push("a shell ran: sh-ran was written".into());
    }
    listener.set_nonblocking(true).expect("a non-blocking listener");
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Err(e) => problems.push(format!("the loopback listener failed: {e}")),
        Ok((mut conn, from)) => {
            let mut got = Vec::new();
            let _ = conn.set_nonblocking(true);
            let _ = conn.read_to_end(&mut got);
            problems.push(format!(
                "the loopback listener got a connection from {from} ({:?})",
                String::from_utf8_lossy(&got)
            ));
        }
    }
    let alive = survivors(&token);
    if !alive.is_empty() {
        problems.push(format!("processes outlived the host: {}", alive.join(", ")));
    }
    let files = planted.list();
    if !files.is_empty() {
        problems.push(format!("files were left: {files:?}"));
    }
    if expect == Expect::Trapped
        && !err.lines().any(|l| l.starts_with("ward: hostile_ladspa: fault: ") && l.contains("SIGSYS"))
    {
        problems.push("no line `ward: hostile_ladspa: fault: ... (SIGSYS)` on sox's standard error".into());
    }
    if let Some(line) = err.lines().find(|l| l.starts_with(&format!("ward: {INNOCENT_DOMAIN}"))) {
        problems.push(format!("the innocent plugin was reported: {line}"));
    }
    drop(planted);
    assert!(problems.is_empty(), "attack {attack}:\n  {}\nsox's standard error:\n{err}", problems.join("\n  "));
    (err, pid)
}

/// Whether this machine gives domains a PID namespace; says so for the test `test` when it does not.
fn pid_namespace(test: &str) -> bool {
    match ward::sandbox::missing().iter().find(|m| m.protection == "pid-namespace") {
        Some(m) => {
            eprintln!("SKIPPED {test}: this machine gives domains no PID namespace ({})", m.why);
            false
        }
        None => true,
    }
}

#[test]
fn writing_into_the_hosts_code_through_proc_mem_fails() {
    battery(1, Expect::Refused);
}

#[test]
fn ptrace_attaching_to_the_host_is_trapped() {
    battery(2, Expect::Trapped);
}

#[test]
fn killing_the_host_is_trapped() {
    battery(3, Expect::Trapped);
}

#[test]
fn killing_a_sibling_domain_fails_and_the_sibling_is_never_reported() {
    // In a PID namespace of its own the plugin sees no sibling to aim at; without one, the kill is trapped.
    let in_namespace = pid_namespace("killing_a_sibling_domain_fails_and_the_sibling_is_never_reported");
    battery(4, if in_namespace { Expect::Refused } else { Expect::Trapped });
}

#[test]
fn taking_the_hosts_descriptors_with_pidfd_getfd_is_trapped() {
    battery(5, Expect::Trapped);
}

#[test]
fn reopening_the_hosts_descriptors_through_proc_fails() {
    battery(6, Expect::Refused);
}

#[test]
fn writing_to_standard_output_does_not_reach_the_hosts_output() {
    battery(7, Expect::Refused);
}

#[test]
fn forking_daemons_that_would_outlive_the_host_is_trapped() {
    battery(8, Expect::Trapped);
}

#[test]
fn running_a_shell_in_a_forked_child_is_trapped() {
    battery(9, Expect::Trapped);
}

#[test]
fn connecting_to_a_loopback_port_is_trapped() {
    battery(10, Expect::Trapped);
}

#[test]
fn creating_files_in_dev_shm_and_tmp_fails() {
    battery(11, Expect::Refused);
}

#[test]
fn a_memfd_is_trapped() {
    battery(12, Expect::Trapped);
}

#[test]
fn executing_a_shell_in_place_of_the_domain_is_trapped() {
    battery(13, Expect::Trapped);
}

/// The PID namespace alone (the system call filter and Landlock off, with a reason): the pid the domain's command
/// line gives for its host names nothing in the domain (`/proc/HOST` absent, `kill(HOST, 0)` ESRCH).
#[test]
fn the_host_is_neither_visible_nor_killable_from_the_domains_pid_namespace() {
    if !pid_namespace("the_host_is_neither_visible_nor_killable_from_the_domains_pid_namespace") {
        return;
    }
    let policy = "[extension.hostile_ladspa.sandbox]\nseccomp = false\nlandlock = false\n\
                  reason = \"the test: only the PID namespace stands between the plugin and its host\"\n";
    let (err, host) = battery_under(14, Expect::Refused, Some(policy));
    let said = err.lines().find(|l| l.starts_with("hostile: host ")).unwrap_or_else(|| panic!("no line: {err}"));
    assert_eq!(said, format!("hostile: host {host}: /proc/{host} absent, kill({host}, 0) = -{}", libc::ESRCH));
}

/// A plugin whose policy lets it fork (and, so that its children can leave its session, turns the system call
/// filter off) forks daemons: they end with its domain when the host ends, killed with the domain's PID namespace.
#[test]
fn daemons_a_plugin_may_fork_end_with_its_domain() {
    if !pid_namespace("daemons_a_plugin_may_fork_end_with_its_domain") {
        return;
    }
    let policy = "[extension.hostile_ladspa.sandbox]\nfork = true\nseccomp = false\n\
                  reason = \"the test: daemons must end with the domain all the same\"\n";
    let (err, _) = battery_under(8, Expect::Refused, Some(policy));
    assert!(err.lines().any(|l| l == "hostile: forked 20 sleepers"), "the plugin did fork its daemons: {err}");
}

#[test]
fn overwriting_every_memfd_the_domain_holds_is_trapped_and_reaches_nothing_of_the_hosts() {
    battery(15, Expect::Trapped);
}

/// The cgroup directories of the domains of host `pid` (`ward-PID-N`) beneath this test's own groups: a host of
/// `ward run` shares them, being its child.
fn cgroups_of_host(pid: u32) -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let own = std::fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    let prefix = format!("ward-{pid}-");
    let mut found = Vec::new();
    for mount in mounts.lines().filter_map(|m| m.split_once(" - ")) {
        let (left, right) = mount;
        let left: Vec<&str> = left.split(' ').collect();
        let fstype = right.split(' ').next().unwrap_or("");
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        // Every group of this process, looked for under every cgroup mount: a path that is not there is skipped.
        for path in own.lines().filter_map(|l| l.splitn(3, ':').nth(2)) {
            let rest = path.strip_prefix(left[3]).unwrap_or(path);
            let dir = Path::new(left[4]).join(rest.trim_start_matches('/'));
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if entry.file_name().to_string_lossy().starts_with(&prefix) {
                    found.push(entry.path());
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

#[test]
fn a_host_that_exits_leaves_no_cgroup_of_its_domains() {
    let missing: Vec<_> =
        ward::sandbox::missing().iter().filter(|m| m.protection.starts_with("cgroup")).map(|m| &m.why).collect();
    if !missing.is_empty() {
        eprintln!("NOT CHECKED: this machine gives domains no cgroup ({missing:?})");
        return;
    }
    let s = Scratch::new("hostile", "cgroups");
    sine_wav(&s.path("in.wav"));
    let child = Command::new(env!("CARGO_BIN_EXE_ward"))
        .env("WARD_CACHE_DIR", common::fresh_cache_dir())
        .args(["run", "--isolation", "process", "--", host("sox"), "-D"])
        .arg(s.path("in.wav"))
        .args(["-t", "wav", "-", "ladspa", INNOCENT, "amp", "-6"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ward run sox");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for sox");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && out.stdout.starts_with(b"RIFF"), "sox failed: {:?}\n{err}", out.status);
    // sox calls exit without unloading its plugins: ward removes its domains' groups at exit.
    let left = cgroups_of_host(pid);
    assert!(left.is_empty(), "cgroups left after sox (process {pid}) exited: {left:?}\n{err}");
}
