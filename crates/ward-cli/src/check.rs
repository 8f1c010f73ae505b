//! `ward check`: which isolation kinds each extension can get, and why not. The library reads the files; this
//! file expands directories, keeps going past bad inputs, and prints.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use ward::check::{CheckReport, KindVerdict};
use ward::Isolation;

use crate::output::{self, say, Columns};

#[derive(Args)]
pub struct CheckArgs {
    /// One JSON object per extension per line.
    #[arg(long, conflicts_with = "brief")]
    json: bool,
    /// Only one summary line per extension, without the reasons.
    #[arg(long)]
    brief: bool,
    /// Also list the sandbox each extension's process domain gets under the policy: every protection, whether it
    /// is on, loosened by the policy (with its reason) or missing on this machine.
    #[arg(long)]
    sandbox: bool,
    /// The policy to read the sandbox settings from (default: the built-in defaults).
    #[arg(long, value_name = "FILE", requires = "sandbox")]
    policy: Option<PathBuf>,
    /// Extensions (.so files), or directories: every *.so directly inside one is checked, in name order.
    #[arg(value_name = "PATH", required = true)]
    paths: Vec<PathBuf>,
}

/// Some inputs could not be checked (each was reported on its own line); `main` exits with status 2.
#[derive(Debug)]
pub struct BadInputs {
    bad: usize,
    total: usize,
}

impl fmt::Display for BadInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.total == 1 { "" } else { "s" };
        write!(f, "{} of {} input{s} could not be checked (see above)", self.bad, self.total)
    }
}

impl std::error::Error for BadInputs {}

pub fn is_bad_input(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<BadInputs>())
}

pub fn run(args: CheckArgs) -> Result<bool> {
    let policy = match &args.policy {
        Some(path) => ward::Policy::from_file(path)?,
        None => ward::Policy::default(),
    };
    // Inputs are the files checked plus the arguments that did not even give files.
    let mut bad = 0;
    let mut unexpanded = 0;
    let mut files = Vec::new();
    for path in &args.paths {
        match expand(path) {
            Ok(found) => files.extend(found),
            Err(message) => {
                eprintln!("ward: error: {message}");
                bad += 1;
                unexpanded += 1;
            }
        }
    }

    let mut reports = Vec::new();
    for file in &files {
        match ward::check::check(file) {
            Ok(report) if args.json && args.sandbox => {
                let protections = protections(&policy, &report.name);
                output::json_line(&serde_json::json!({ "check": report, "sandbox": protections }))?
            }
            Ok(report) if args.json => output::json_line(&report)?,
            Ok(report) => reports.push(report),
            Err(e) => {
                eprintln!("ward: error: {e}");
                bad += 1;
            }
        }
    }

    if !args.json {
        print_human(&reports, args.brief)?;
        if args.sandbox {
            for r in &reports {
                print_sandbox(&policy, &r.name)?;
            }
        }
    }
    if bad > 0 {
        return Err(BadInputs { bad, total: files.len() + unexpanded }.into());
    }
    Ok(true)
}

/// A file stands for itself; a directory for the `*.so` files directly inside it, sorted by name.
fn expand(path: &Path) -> Result<Vec<PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|e| format!("cannot read directory {}: {e}", path.display()))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read directory {}: {e}", path.display()))?;
        let file = entry.path();
        if file.extension().is_some_and(|x| x == "so") && file.is_file() {
            found.push(file);
        }
    }
    if found.is_empty() {
        return Err(format!("{} holds no *.so files; give extensions or directories of them", path.display()));
    }
    found.sort();
    Ok(found)
}

fn print_human(reports: &[CheckReport], brief: bool) -> Result<()> {
    let width = reports.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let columns = Columns::new(&[width]);
    for r in reports {
        let verdicts: Vec<String> = r.kinds.iter().map(summary).collect();
        say!("{}", columns.row(&[&r.name, &verdicts.join("  ")]))?;
        if !brief {
            for verdict in r.kinds.iter().filter(|k| !k.ok) {
                for reason in &verdict.reasons {
                    say!("    {}: {reason}", verdict.isolation)?;
                }
            }
        }
    }
    let mpk = reports.iter().filter(|r| r.allows(Isolation::Mpk)).count();
    let s = if reports.len() == 1 { "" } else { "s" };
    say!("{mpk} of {} extension{s} can run under mpk", reports.len())
}

/// `mpk ok` or `mpk NO (3 reasons)`.
fn summary(verdict: &KindVerdict) -> String {
    match verdict.reasons.len() {
        _ if verdict.ok => format!("{} ok", verdict.isolation),
        1 => format!("{} NO (1 reason)", verdict.isolation),
        n => format!("{} NO ({n} reasons)", verdict.isolation),
    }
}

/// One protection of a process domain's sandbox, as `ward check --sandbox` lists it.
#[derive(serde::Serialize)]
struct Protection {
    name: &'static str,
    /// `on`, `loosened` (by the policy), `off` (by the policy), `missing` (this machine lacks it).
    state: &'static str,
    what: String,
}

/// The protections the process domain of extension `name` gets under `policy` on this machine, in the order the
/// domain applies them.
fn protections(policy: &ward::Policy, name: &str) -> Vec<Protection> {
    let effective = policy.for_extension(name);
    let sandbox = &effective.sandbox;
    let missing = ward::sandbox::missing();
    let lacks = |protection: &str| missing.iter().find(|m| m.protection == protection).map(|m| m.why.clone());
    let reason = sandbox.reason.as_deref().map(|r| format!(" (policy: {r})")).unwrap_or_default();
    let mut out = Vec::new();
    let mut push = |name, state, what: String| out.push(Protection { name, state, what });
    let what = "a PID namespace of its own with its own /proc: the host's processes out of sight, every process it \
                forks ends with the domain";
    let (state, what) = if !sandbox.pid_namespace {
        ("off", format!("no PID namespace{reason}"))
    } else if let Some(why) = lacks("pid-namespace") {
        ("missing", why)
    } else {
        ("on", what.to_string())
    };
    push("pid-namespace", state, what);
    push("stdout", "on", "standard output is /dev/null: nothing reaches the host's output".into());
    push("no-new-privs", "on", "no set-uid program or file capability raises its privileges".into());
    push("not-dumpable", "on", "no core dump; other processes of the user cannot attach".into());
    push("capabilities", "on", "every capability dropped (ambient, bounding, effective, permitted)".into());
    let landlock = |part: &'static str, what: &str, loosened: bool| -> (&'static str, String) {
        if !sandbox.landlock {
            ("off", format!("{what}: Landlock is off{reason}"))
        } else if let Some(why) = lacks(part).or_else(|| lacks("landlock")) {
            ("missing", why)
        } else if loosened {
            ("loosened", format!("{what}: loosened{reason}"))
        } else {
            ("on", what.to_string())
        }
    };
    let (state, what) = landlock(
        "landlock",
        &if sandbox.writable.is_empty() {
            "files: read and execute only, written nowhere".to_string()
        } else {
            let paths: Vec<String> = sandbox.writable.iter().map(|p| p.display().to_string()).collect();
            format!("files: read and execute only, written beneath {} only", paths.join(", "))
        },
        !sandbox.writable.is_empty(),
    );
    push("landlock-files", state, what);
    let (state, what) = landlock("landlock-network", "no TCP bind or connect", sandbox.network);
    push("landlock-network", state, what);
    let (state, what) =
        landlock("landlock-scopes", "no signal or abstract socket outside the domain; no ptrace of the host", false);
    push("landlock-scopes", state, what);
    let seccomp_state = if !sandbox.seccomp {
        "off"
    } else if lacks("seccomp").is_some() {
        "missing"
    } else if sandbox.network || sandbox.exec || sandbox.fork || !sandbox.writable.is_empty() {
        "loosened"
    } else {
        "on"
    };
    let what = match seccomp_state {
        "off" => format!("no system call filter{reason}"),
        "missing" => lacks("seccomp").unwrap_or_default(),
        _ => {
            let mut refused = vec!["ptrace", "process_vm_*", "pidfd_getfd", "signals beyond itself", "mount", "bpf"];
            for (allowed, what) in [
                (sandbox.network, "sockets"),
                (sandbox.exec, "execve"),
                (sandbox.fork, "child processes"),
                (!sandbox.writable.is_empty(), "opening files for writing"),
            ] {
                if !allowed {
                    refused.push(what);
                }
            }
            let given: Vec<String> = sandbox.loosened();
            let given = if given.is_empty() {
                String::new()
            } else {
                format!("; allowed by the policy: {}{reason}", given.join(", "))
            };
            format!("allow-list; refused among others: {}{given}", refused.join(", "))
        }
    };
    push("seccomp", seccomp_state, what);
    // Read-only descriptors hold only while reopening one read-write is refused, which is the filter's job.
    let shared = "rings read-write; the input pool and arena blocks lent as inputs through read-only descriptors; \
        of the arena, only the blocks a call lends";
    let reopenable = match seccomp_state {
        "off" | "missing" => Some("the system call filter is not there"),
        _ if !sandbox.writable.is_empty() => Some("opening files for writing is allowed"),
        _ => None,
    };
    match reopenable {
        _ if lacks("shared-memory").is_some() => {
            push("shared-memory", "missing", lacks("shared-memory").unwrap_or_default())
        }
        None => push("shared-memory", "on", shared.into()),
        Some(why) => push(
            "shared-memory",
            "loosened",
            format!("{shared}; but {why}, so a read-only descriptor can be reopened read-write{reason}"),
        ),
    }
    // Past the end of a buffer: outputs always end at a guard page; inputs may be followed by zeros (issue 33).
    let past = match effective.read_past_input_kb {
        0 => "writing past an output or reading past an input faults".to_string(),
        kb => format!(
            "writing past an output faults; reading past an input reads {kb} KiB of zeros, never the host's bytes, \
             then faults (policy read_past_input_kb)"
        ),
    };
    push("past-buffers", "on", past);
    let limits = &effective.limits;
    let mb = |v: u64| if v == 0 { "unlimited".to_string() } else { format!("{v} MiB") };
    let seconds = |v: u64| if v == 0 { "unlimited".to_string() } else { format!("{v} s") };
    push(
        "limits",
        "on",
        format!(
            "rlimits, the zygote included: address space {}, CPU {}, {} open files",
            mb(limits.address_space_mb),
            seconds(limits.cpu_s),
            limits.open_files
        ),
    );
    // The domain's cgroup: each limit is off when the policy sets 0, missing where the machine gives no cgroup.
    let cgroup = |part: &str| lacks(part).or_else(|| lacks("cgroup"));
    let limit = |part: &str, value: u64, on: String, off: &str| -> (&'static str, String) {
        match cgroup(part) {
            Some(why) => ("missing", why),
            None if value == 0 => ("off", off.to_string()),
            None => ("on", on),
        }
    };
    let (state, what) = limit(
        "cgroup-memory",
        limits.memory_mb,
        format!(
            "cgroup of the zygote and its incarnations: memory {}, shared memory and memfd pages included; over it \
             the kernel kills the domain, a fault of the extension",
            mb(limits.memory_mb)
        ),
        "cgroup: memory unlimited (policy memory_mb = 0)",
    );
    push("cgroup-memory", state, what);
    let (state, what) = limit(
        "cgroup-pids",
        limits.pids,
        format!("cgroup: at most {} processes and threads, the zygote's included", limits.pids),
        "cgroup: processes and threads unlimited (policy pids = 0)",
    );
    push("cgroup-pids", state, what);
    let (state, what) = limit(
        "cgroup-cpu",
        limits.cpu_percent,
        format!("cgroup: CPU quota {}% of one processor", limits.cpu_percent),
        "cgroup: no CPU quota (policy cpu_percent = 0), so no CPU group: scheduled with its host",
    );
    push("cgroup-cpu", state, what);
    let (state, what) = if limits.idle_cpu_ms == 0 {
        ("off", "CPU used between calls: not checked (policy)".to_string())
    } else {
        (
            "on",
            format!(
                "CPU used between calls by threads other than the serving one: over {} ms per second, a fault",
                limits.idle_cpu_ms
            ),
        )
    };
    push("idle-cpu", state, what);
    out
}

fn print_sandbox(policy: &ward::Policy, name: &str) -> Result<()> {
    let effective = policy.for_extension(name);
    let isolation = effective.isolation;
    say!("{name}: sandbox of its process domain (isolation {isolation} under this policy)")?;
    for p in protections(policy, name) {
        say!("    {:<17} {:<9} {}", p.name, p.state, p.what)?;
    }
    Ok(())
}
