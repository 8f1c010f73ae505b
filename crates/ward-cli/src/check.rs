//! `ward check`: which isolation kinds each extension can get, and why not. The library reads the files; this
//! file expands directories, keeps going past bad inputs, and prints.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use ward::check::{CheckReport, KindVerdict};
use ward::Isolation;
use ward_classes::lv2;

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
    /// Extensions (.so files), LV2 bundles (every plugin binary each names is checked), or directories: every *.so
    /// and every *.lv2 bundle directly inside one, in name order.
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
    // Inputs are the binaries checked plus the arguments and bundles that did not even give binaries.
    let mut bad = 0;
    let mut unexpanded = 0;
    let mut items = Items::default();
    for path in &args.paths {
        for message in items.expand(path) {
            eprintln!("ward: error: {message}");
            bad += 1;
            unexpanded += 1;
        }
    }

    let mut rows = Vec::new();
    let mut checked = 0;
    for item in items.list {
        let report = match &item.kind {
            ItemKind::Lv2Ui { .. } => None,
            // The Turtle chose this path: only a regular file is read (a FIFO or a device could stall the check).
            ItemKind::Lv2Plugin { bundle, .. } if item.path.exists() && !item.path.is_file() => {
                checked += 1;
                eprintln!(
                    "ward: error: {}: the LV2 bundle {} names it as a plugin binary, but it is no regular file",
                    item.path.display(),
                    bundle.display()
                );
                bad += 1;
                continue;
            }
            ItemKind::File | ItemKind::Lv2Plugin { .. } => {
                checked += 1;
                match ward::check::check(&item.path) {
                    Ok(report) => Some(report),
                    Err(e) => {
                        match &item.kind {
                            ItemKind::Lv2Plugin { bundle, .. } => {
                                eprintln!(
                                    "ward: error: {e} (a plugin binary the LV2 bundle {} names)",
                                    bundle.display()
                                )
                            }
                            _ => eprintln!("ward: error: {e}"),
                        }
                        bad += 1;
                        continue;
                    }
                }
            }
        };
        let row = Row { path: item.path, label: item.label, kind: item.kind, report };
        if args.json {
            output::json_line(&row.json(args.sandbox.then_some(&policy))?)?;
        } else {
            rows.push(row);
        }
    }

    if !args.json {
        print_human(&rows, args.brief)?;
        if args.sandbox {
            for row in &rows {
                if let Some(r) = &row.report {
                    print_sandbox(&policy, &row.label, &r.name)?;
                }
            }
        }
    }
    if bad > 0 {
        return Err(BadInputs { bad, total: checked + unexpanded }.into());
    }
    Ok(true)
}

/// What an input stands for once directories and bundles are expanded.
enum ItemKind {
    /// A file given, or found directly in a directory given: checked as any extension.
    File,
    /// An LV2 plugin binary (`lv2:binary`) of a bundle: checked, with the plugins it carries.
    Lv2Plugin { bundle: PathBuf, plugins: Vec<String> },
    /// An LV2 UI binary (`ui:binary`) that is no plugin binary: `ward run` leaves it alone, so it is only listed.
    Lv2Ui { bundle: PathBuf, uis: Vec<String> },
}

/// One binary to report on.
struct Item {
    path: PathBuf,
    /// How people see it named: the extension's name, or for an LV2 binary its bundle and its path in it.
    label: String,
    kind: ItemKind,
}

/// The binaries to report on, in the order found, each LV2 binary once.
#[derive(Default)]
struct Items {
    list: Vec<Item>,
    /// LV2 binaries met so far, by canonical path, with their place in `list`.
    lv2_seen: HashMap<PathBuf, usize>,
}

/// What an LV2 bundle says is a UI binary rather than a plugin binary.
const LV2_UI_NOTE: &str = "LV2 UI: left alone by ward run";

impl Items {
    /// Adds what `path` stands for: a file stands for itself; a bundle (a directory with a `manifest.ttl`) for its
    /// plugin and UI binaries; any other directory for the `*.so` files and the `*.lv2` bundles directly inside it,
    /// by name. Returns what could not be expanded, each a message naming it.
    fn expand(&mut self, path: &Path) -> Vec<String> {
        if !path.is_dir() {
            let label = ward::extension_name(path);
            self.list.push(Item { path: path.to_path_buf(), label, kind: ItemKind::File });
            return Vec::new();
        }
        if path.join("manifest.ttl").is_file() {
            let before = self.list.len();
            return match self.bundle(path) {
                Err(message) => vec![message],
                Ok(()) if self.list.len() == before && !self.lv2_declared(path) => {
                    vec![format!("{} is an LV2 bundle that names no plugin or UI binary", path.display())]
                }
                Ok(()) => Vec::new(),
            };
        }
        let unreadable = |e: std::io::Error| vec![format!("cannot read directory {}: {e}", path.display())];
        let entries = match std::fs::read_dir(path) {
            Ok(entries) => entries,
            Err(e) => return unreadable(e),
        };
        let mut found = Vec::new();
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => return unreadable(e),
            };
            let file = entry.path();
            let so = file.extension().is_some_and(|x| x == "so") && file.is_file();
            let bundle = file.extension().is_some_and(|x| x == "lv2") && file.is_dir();
            if so || bundle {
                found.push((file, bundle));
            }
        }
        if found.is_empty() {
            return vec![format!(
                "{} holds no *.so files and no *.lv2 bundles; give extensions, bundles or directories of them",
                path.display()
            )];
        }
        found.sort();
        let mut errors = Vec::new();
        for (file, bundle) in found {
            if !bundle {
                let label = ward::extension_name(&file);
                self.list.push(Item { path: file, label, kind: ItemKind::File });
            } else if let Err(message) = self.bundle(&file) {
                errors.push(message);
            }
        }
        errors
    }

    /// Whether an LV2 binary already listed was declared by the bundle `dir` (a bundle naming only binaries that
    /// another one named first still named some).
    fn lv2_declared(&self, dir: &Path) -> bool {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        self.list.iter().any(|item| match &item.kind {
            ItemKind::Lv2Plugin { bundle, .. } | ItemKind::Lv2Ui { bundle, .. } => *bundle == dir,
            ItemKind::File => false,
        })
    }

    /// Adds the binaries of the bundle `dir`: each plugin binary once with the URIs of every plugin it carries, then
    /// each UI binary that is no plugin binary. A binary a bundle read earlier named already gains the URIs.
    fn bundle(&mut self, dir: &Path) -> Result<(), String> {
        let bundle = lv2::bundle::read_bundle(dir).map_err(|e| format!("cannot read an LV2 bundle: {e}"))?;
        for plugin in &bundle.plugins {
            self.add_lv2(&bundle.dir, &plugin.binary, &plugin.uri, false);
        }
        for ui in &bundle.uis {
            self.add_lv2(&bundle.dir, &ui.binary, &ui.uri, true);
        }
        Ok(())
    }

    fn add_lv2(&mut self, bundle: &Path, binary: &Path, uri: &str, ui: bool) {
        let canonical = std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_path_buf());
        if let Some(&at) = self.lv2_seen.get(&canonical) {
            match &mut self.list[at].kind {
                ItemKind::Lv2Plugin { plugins, .. } if !ui => plugins.push(uri.to_string()),
                ItemKind::Lv2Ui { uis, .. } if ui => uis.push(uri.to_string()),
                // A UI binary that is some plugin's binary too is a plugin binary (it exports lv2_descriptor, which
                // is what `ward run` goes by).
                ItemKind::Lv2Plugin { .. } => {}
                kind => *kind = ItemKind::Lv2Plugin { bundle: bundle.to_path_buf(), plugins: vec![uri.to_string()] },
            }
            return;
        }
        let name = bundle.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let label = match binary.strip_prefix(bundle) {
            Ok(inside) => format!("{name}/{}", inside.display()),
            Err(_) => format!("{name}: {}", binary.display()),
        };
        let kind = if ui {
            ItemKind::Lv2Ui { bundle: bundle.to_path_buf(), uis: vec![uri.to_string()] }
        } else {
            ItemKind::Lv2Plugin { bundle: bundle.to_path_buf(), plugins: vec![uri.to_string()] }
        };
        self.lv2_seen.insert(canonical, self.list.len());
        self.list.push(Item { path: binary.to_path_buf(), label, kind });
    }
}

/// One binary reported on: checked (its report), or an LV2 UI binary only listed.
struct Row {
    path: PathBuf,
    label: String,
    kind: ItemKind,
    report: Option<CheckReport>,
}

impl Row {
    /// The JSON object of the row: the check report, with `class`, `bundle` and `plugins` for an LV2 plugin binary;
    /// for a UI binary its path, bundle and UIs, `checked: false` and why. With `policy`, the report goes under
    /// `check` beside the sandbox the policy gives.
    fn json(&self, policy: Option<&ward::Policy>) -> Result<serde_json::Value> {
        let mut value = match &self.report {
            Some(report) => serde_json::to_value(report)?,
            None => serde_json::json!({
                "path": self.path.to_string_lossy(),
                "name": ward::extension_name(&self.path),
                "checked": false,
                "message": LV2_UI_NOTE,
            }),
        };
        let object = value.as_object_mut().ok_or_else(|| anyhow::anyhow!("a check report is no JSON object"))?;
        match &self.kind {
            ItemKind::File => {}
            ItemKind::Lv2Plugin { bundle, plugins } => {
                object.insert("class".into(), "lv2".into());
                object.insert("bundle".into(), bundle.to_string_lossy().into());
                object.insert("plugins".into(), plugins.clone().into());
            }
            ItemKind::Lv2Ui { bundle, uis } => {
                object.insert("class".into(), "lv2-ui".into());
                object.insert("bundle".into(), bundle.to_string_lossy().into());
                object.insert("uis".into(), uis.clone().into());
            }
        }
        Ok(match (policy, &self.report) {
            (Some(policy), Some(report)) => {
                serde_json::json!({ "check": value, "sandbox": protections(policy, &report.name) })
            }
            _ => value,
        })
    }
}

fn print_human(rows: &[Row], brief: bool) -> Result<()> {
    let width = rows.iter().map(|r| r.label.len()).max().unwrap_or(0);
    let columns = Columns::new(&[width]);
    for row in rows {
        let Some(r) = &row.report else {
            say!("{}", columns.row(&[&row.label, LV2_UI_NOTE]))?;
            continue;
        };
        let verdicts: Vec<String> = r.kinds.iter().map(summary).collect();
        let mut summary_cell = verdicts.join("  ");
        if let ItemKind::Lv2Plugin { plugins, .. } = &row.kind {
            let s = if plugins.len() == 1 { "" } else { "s" };
            summary_cell.push_str(&format!("  (LV2, {} plugin{s})", plugins.len()));
        }
        say!("{}", columns.row(&[&row.label, &summary_cell]))?;
        if brief {
            continue;
        }
        if let ItemKind::Lv2Plugin { plugins, .. } = &row.kind {
            for uri in plugins {
                say!("    LV2 plugin: {uri}")?;
            }
        }
        for verdict in r.kinds.iter().filter(|k| !k.ok) {
            for reason in &verdict.reasons {
                say!("    {}: {reason}", verdict.isolation)?;
            }
        }
    }
    let reports: Vec<&CheckReport> = rows.iter().filter_map(|r| r.report.as_ref()).collect();
    let mpk = reports.iter().filter(|r| r.allows(Isolation::Mpk)).count();
    let s = if reports.len() == 1 { "" } else { "s" };
    say!("{mpk} of {} extension{s} can run under mpk", reports.len())?;
    // The LV2 plugins, counted by plugin: a binary carries one or many.
    let (mut plugins, mut plugins_mpk, mut binaries, mut uis) = (0, 0, 0, 0);
    for row in rows {
        match (&row.kind, &row.report) {
            (ItemKind::Lv2Plugin { plugins: uris, .. }, Some(report)) => {
                binaries += 1;
                plugins += uris.len();
                if report.allows(Isolation::Mpk) {
                    plugins_mpk += uris.len();
                }
            }
            (ItemKind::Lv2Ui { .. }, _) => uis += 1,
            _ => {}
        }
    }
    if binaries + uis > 0 {
        let s = |n: usize| if n == 1 { "" } else { "s" };
        say!(
            "LV2: {plugins_mpk} of {plugins} plugin{} (in {binaries} binar{}) can run under mpk; {uis} UI binar{} left \
             alone",
            s(plugins),
            if binaries == 1 { "y" } else { "ies" },
            if uis == 1 { "y" } else { "ies" },
        )?;
    }
    Ok(())
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

/// The sandbox of the binary `label` shows, whose policy name is `name` (an LV2 binary's label names its bundle too,
/// which the policy name does not: swh's binaries are all `plugin-linux`).
fn print_sandbox(policy: &ward::Policy, label: &str, name: &str) -> Result<()> {
    let effective = policy.for_extension(name);
    let isolation = effective.isolation;
    let named = if label == name { String::new() } else { format!(" (named {name} in policies)") };
    say!("{label}{named}: sandbox of its process domain (isolation {isolation} under this policy)")?;
    for p in protections(policy, name) {
        say!("    {:<17} {:<9} {}", p.name, p.state, p.what)?;
    }
    Ok(())
}
