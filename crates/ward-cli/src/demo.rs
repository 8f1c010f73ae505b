//! `ward demo`: every fault kind of faulty.so, natively and under ward, side by side (in process domains, then in
//! mpk domains where the machine has protection keys); then the well-behaved extension under ward.
//!
//! Under ward each fault runs the same scenario as the native host: `faulty_counter_add(5)`, `faulty_counter_add(7)`,
//! `faulty_arm(kind, arg)`, `faulty_compute(6)`, `faulty_counter_get()`, then a look at the host's own data. With
//! isolation `process` or `mpk` that happens in this very process: surviving is the point. With `none` it happens in a
//! throwaway child, because there nothing stands between the fault and the host.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use ward::{Arg, Event, Isolation, Policy, RestartVia, RetType, Signature, Supervisor, ValType, Value};

use crate::faulty_scenario;
use crate::hosts::child::{self, End};
use crate::hosts::native_host::{self, NativeOutcome};
use crate::output::{self, say, Columns};
use crate::DemoIsolation;

/// The demo's policy for faulty.so: quick deadline, small limits so runaway faults end fast, the counter's adds
/// replayed after a restart, and restart limits loose enough that thirteen faults in a row never disable it.
const POLICY: &str = r#"
[extension.faulty]
deadline_ms = 1000
max_restarts = 1000
restart_period_s = 60
backoff_initial_ms = 0.1
zygote = true

[extension.faulty.limits]
open_files = 64
address_space_mb = 256

[extension.faulty.function.faulty_counter_add]
state = true

[extension.faulty_mpk]
deadline_ms = 1000
max_restarts = 1000
restart_period_s = 60
backoff_initial_ms = 0.1

# The heap quota of the mpk domain: the memory bomb ends at 64 MiB.
[extension.faulty_mpk.limits]
address_space_mb = 64

[extension.faulty_mpk.function.faulty_counter_add]
state = true
"#;

/// What one run of the scenario under ward saw. Serialisable because with isolation `none` it comes from a child.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WardRun {
    pub compute: Result<i64, String>,
    pub counter: Result<i64, String>,
    pub host_value: i64,
    pub faults: Vec<SeenFault>,
    pub recoveries: Vec<SeenRecovery>,
    /// From `Event::Retried`: did the retried call succeed.
    pub retried_ok: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeenFault {
    pub cause: String,
    pub class: String,
    pub call: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeenRecovery {
    pub took_us: u64,
    pub via: String,
    pub replayed: usize,
}

/// The demo's result for one fault kind: one table row or one JSON line.
#[derive(Debug, Serialize)]
struct FaultRow {
    #[serde(rename = "type")]
    kind_of_line: &'static str,
    fault: &'static str,
    kind: i64,
    isolation: &'static str,
    native: String,
    native_host_lost: bool,
    ward: String,
    cause: Option<String>,
    fault_class: Option<String>,
    call: Option<String>,
    restart_us: Option<u64>,
    via: Option<String>,
    replayed: Option<usize>,
    retried_ok: Option<bool>,
    compute: Option<i64>,
    counter: Option<i64>,
    host_value: Option<i64>,
    contained: bool,
}

pub fn run(isolation: DemoIsolation, json: bool) -> Result<bool> {
    if isolation == DemoIsolation::Mpk && !mpk_here(json)? {
        return Ok(true);
    }
    let mut faults_ok = fault_section(isolation, json)?;
    if isolation == DemoIsolation::Process {
        faults_ok &= mpk_fault_section(json)?;
    }
    if !json {
        say!("")?;
        say!("well-behaved extension under ward (isolation {}):", iso_name(isolation))?;
    }
    let well_ok = well_section(isolation, json)?;
    // Under `none` a plugin's crash is the host's: the plugin part runs with process isolation only. The class
    // adapters open their plugins with dlopen, which an mpk domain does not offer.
    let plugins_ok = if isolation == DemoIsolation::Process {
        crate::hosts::demo_plugins::run(Isolation::Process, json)?
    } else {
        true
    };
    // Likewise a runtime: a plugin's crash under `none` would be the host's.
    let runtime_ok = match isolation {
        DemoIsolation::Process => crate::hosts::demo_runtime::run(Isolation::Process, json)?,
        DemoIsolation::Mpk => crate::hosts::demo_runtime::run(Isolation::Mpk, json)?,
        DemoIsolation::None => true,
    };
    Ok(faults_ok && well_ok && plugins_ok && runtime_ok)
}

/// Whether this machine has protection keys; when not, says so (the mpk part then does not run).
fn mpk_here(json: bool) -> Result<bool> {
    if ward::mpk_available() {
        return Ok(true);
    }
    let why = "this machine has no memory protection keys (PKU): the mpk part did not run";
    if json {
        output::json_line(&serde_json::json!({ "type": "skipped", "isolation": "mpk", "why": why }))?;
    } else {
        say!("  {why}")?;
    }
    Ok(false)
}

/// The fault kinds of `isolation` with the extension that carries them: faulty.so, or for mpk faulty_mpk.so, which
/// leaves out the kinds that need a process of their own.
fn fault_kinds(isolation: DemoIsolation) -> (&'static str, Vec<(i64, &'static str)>) {
    match isolation {
        DemoIsolation::Mpk => (
            "faulty_mpk",
            faulty_scenario::KINDS
                .iter()
                .copied()
                .filter(|(k, _)| !faulty_scenario::PROCESS_ONLY.contains(k))
                .collect(),
        ),
        _ => ("faulty", faulty_scenario::KINDS.to_vec()),
    }
}

/// After the process rows: the same faults in mpk domains.
fn mpk_fault_section(json: bool) -> Result<bool> {
    if !json {
        say!("")?;
        if !ward::mpk_available() {
            say!("mpk domains:")?;
        }
    }
    if !mpk_here(json)? {
        return Ok(true);
    }
    fault_section(DemoIsolation::Mpk, json)
}

/// Every fault kind natively and under ward, one row each, and the count contained.
fn fault_section(isolation: DemoIsolation, json: bool) -> Result<bool> {
    let (extension, kinds) = fault_kinds(isolation);
    let faulty = builtin(extension)?;
    let iso_name = iso_name(isolation);
    let cols = Columns::new(&[2, 28, 55]);
    if !json {
        say!(
            "ward demo: {} fault kinds of {extension}.so, natively and under ward (isolation {iso_name})",
            kinds.len()
        )?;
        if isolation == DemoIsolation::Mpk {
            say!(
                "(left out: descriptor leak, raise(SIGKILL) and the ring attacks need a process of their own; an \
                 extension that imports open, raise or syscall is refused by mpk, and auto gives it a process)"
            )?;
        }
        say!(
            "scenario: counter_add(5), counter_add(7), arm(fault), compute(6) = {}?, counter_get() = {}?, host data = {}?",
            faulty_scenario::COMPUTE_EXPECTED,
            faulty_scenario::COUNTER_EXPECTED,
            faulty_scenario::HOST_VALUE
        )?;
        say!("")?;
        say!("{}", cols.row(&["#", "fault", "natively", "under ward"]))?;
    }
    let mut contained = 0;
    for &(kind, name) in &kinds {
        let native = native_host::run(&faulty, kind).with_context(|| format!("native run of fault {kind} ({name})"))?;
        let ward = match isolation {
            DemoIsolation::Process | DemoIsolation::Mpk => WardSide::Ran(
                trial(&faulty, kind, iso_of(isolation))
                    .with_context(|| format!("ward run of fault {kind} ({name})"))?,
            ),
            DemoIsolation::None => {
                in_child(&faulty, kind).with_context(|| format!("ward run of fault {kind} ({name})"))?
            }
        };
        let row = fault_row(kind, name, iso_name, native, ward);
        contained += usize::from(row.contained);
        if json {
            output::json_line(&row)?;
        } else {
            let mark = if row.contained { "" } else { "NOT CONTAINED: " };
            say!("{}", cols.row(&[&kind.to_string(), name, &row.native, &format!("{mark}{}", row.ward)]))?;
        }
    }
    if json {
        output::json_line(&serde_json::json!({
            "type": "summary",
            "isolation": iso_name,
            "faults_contained": contained,
            "faults_total": kinds.len(),
        }))?;
    } else {
        say!("")?;
        say!("{contained} of {} faults contained (isolation {iso_name})", kinds.len())?;
    }
    Ok(contained == kinds.len())
}

fn iso_of(isolation: DemoIsolation) -> Isolation {
    match isolation {
        DemoIsolation::Process => Isolation::Process,
        DemoIsolation::Mpk => Isolation::Mpk,
        DemoIsolation::None => Isolation::None,
    }
}

fn iso_name(isolation: DemoIsolation) -> &'static str {
    match isolation {
        DemoIsolation::Process => "process",
        DemoIsolation::Mpk => "mpk",
        DemoIsolation::None => "none",
    }
}

fn builtin(name: &str) -> Result<PathBuf> {
    ward_extensions::path_of(name).with_context(|| format!("cannot extract the built-in extension {name}.so"))
}

enum WardSide {
    Ran(WardRun),
    /// The throwaway host of an isolation `none` run died or hung.
    HostLost(End),
}

/// `ward __ward-host PATH KIND`: the scenario under ward with isolation `none`, in a host with ordinary limits;
/// prints the [`WardRun`] as JSON.
pub fn ward_host_main(path: &Path, kind: i64) -> Result<bool> {
    native_host::become_ordinary_host()?;
    let run = trial(path, kind, Isolation::None)?;
    output::json_line(&run)?;
    Ok(true)
}

fn in_child(path: &Path, kind: i64) -> Result<WardSide> {
    let args: Vec<OsString> = vec!["__ward-host".into(), path.as_os_str().to_owned(), kind.to_string().into()];
    let run = child::run_bounded(&args, &[], native_host::BOUND)?;
    match run.end {
        End::Exited(0) => {
            let line = run.stdout.lines().next().unwrap_or("");
            let parsed = serde_json::from_str(line)
                .with_context(|| format!("the ward host printed something unexpected: {line:?}"))?;
            Ok(WardSide::Ran(parsed))
        }
        End::Exited(1) | End::Exited(2) => bail!("the ward host failed: {}", run.stderr.trim()),
        end => Ok(WardSide::HostLost(end)),
    }
}

/// The scenario under ward, in this process.
pub fn trial(path: &Path, kind: i64, isolation: Isolation) -> Result<WardRun> {
    let policy = Policy::from_toml_str(POLICY, "the demo's built-in policy")?;
    let sup = Supervisor::new(policy);
    let events = sup.subscribe();
    let ext =
        sup.load_with(path, Some(isolation)).with_context(|| format!("cannot load {} under ward", path.display()))?;
    for d in faulty_scenario::ADDS {
        ext.call("faulty_counter_add", &mut [Arg::I64(d)], RetType::I64)
            .context("faulty_counter_add failed before any fault was armed")?;
    }
    let host_value = Box::new(AtomicI64::new(faulty_scenario::HOST_VALUE));
    let arm_arg = if kind == faulty_scenario::WILD_WRITE {
        Arg::Ptr(host_value.as_ptr() as usize)
    } else {
        Arg::I64(faulty_scenario::DEFAULT_ARM_ARG)
    };
    ext.call("faulty_arm", &mut [Arg::I64(kind), arm_arg], RetType::Void).context("faulty_arm failed")?;
    let compute = ext
        .call("faulty_compute", &mut [Arg::I64(faulty_scenario::COMPUTE_ARG)], RetType::I64)
        .map(|v| v.as_i64().unwrap_or(i64::MIN))
        .map_err(|e| e.to_string());
    let counter = ext
        .call("faulty_counter_get", &mut [], RetType::I64)
        .map(|v| v.as_i64().unwrap_or(i64::MIN))
        .map_err(|e| e.to_string());
    let mut run = WardRun {
        compute,
        counter,
        host_value: host_value.load(Ordering::SeqCst),
        faults: Vec::new(),
        recoveries: Vec::new(),
        retried_ok: None,
    };
    // Events are emitted inside the calls above, so everything is queued by now.
    for event in events.try_iter() {
        match event {
            Event::Fault { fault } => run.faults.push(SeenFault {
                cause: fault.cause(),
                class: fault.kind_name().to_string(),
                call: fault.call.clone(),
            }),
            Event::Recovered { took, via, replayed, .. } => run.recoveries.push(SeenRecovery {
                took_us: took.as_micros() as u64,
                via: via_name(via).to_string(),
                replayed,
            }),
            Event::Retried { ok, .. } => run.retried_ok = Some(ok),
            _ => {}
        }
    }
    Ok(run)
}

pub fn via_name(via: RestartVia) -> &'static str {
    match via {
        RestartVia::Zygote => "zygote",
        RestartVia::Spawn => "spawn",
        RestartVia::Reload => "reload",
        RestartVia::Snapshot => "snapshot",
    }
}

fn fault_row(
    kind: i64,
    name: &'static str,
    isolation: &'static str,
    native: NativeOutcome,
    ward: WardSide,
) -> FaultRow {
    let mut row = FaultRow {
        kind_of_line: "fault",
        fault: name,
        kind,
        isolation,
        native: native.text,
        native_host_lost: native.host_lost,
        ward: String::new(),
        cause: None,
        fault_class: None,
        call: None,
        restart_us: None,
        via: None,
        replayed: None,
        retried_ok: None,
        compute: None,
        counter: None,
        host_value: None,
        contained: false,
    };
    let run = match ward {
        WardSide::HostLost(end) => {
            row.ward = child::describe_death(end);
            return row;
        }
        WardSide::Ran(run) => run,
    };
    let first_fault = run.faults.first();
    let first_recovery = run.recoveries.first();
    row.cause = first_fault.map(|f| f.cause.clone());
    row.fault_class = first_fault.map(|f| f.class.clone());
    row.call = first_fault.and_then(|f| f.call.clone());
    row.restart_us = first_recovery.map(|r| r.took_us);
    row.via = first_recovery.map(|r| r.via.clone());
    row.replayed = first_recovery.map(|r| r.replayed);
    row.retried_ok = run.retried_ok;
    row.compute = run.compute.as_ref().ok().copied();
    row.counter = run.counter.as_ref().ok().copied();
    row.host_value = Some(run.host_value);
    row.contained = first_fault.is_some()
        && row.compute == Some(faulty_scenario::COMPUTE_EXPECTED)
        && row.counter == Some(faulty_scenario::COUNTER_EXPECTED)
        && run.host_value == faulty_scenario::HOST_VALUE;
    row.ward = describe_ward(&run);
    row
}

/// "fault caught: null dereference (SIGSEGV at 0x0) in call faulty_compute; restarted in 412 us (zygote); state
/// replayed (2 calls); call retried: correct (37)", plus whatever went wrong.
fn describe_ward(run: &WardRun) -> String {
    let mut parts = Vec::new();
    match run.faults.first() {
        Some(f) => {
            let call = f.call.as_ref().map(|c| format!(" in call {c}")).unwrap_or_default();
            let more =
                if run.faults.len() > 1 { format!(" (+{} more faults)", run.faults.len() - 1) } else { String::new() };
            parts.push(format!("fault caught: {}{call}{more}", f.cause));
        }
        None => parts.push("no fault seen".to_string()),
    }
    if let Some(r) = run.recoveries.first() {
        parts.push(format!("restarted in {} ({})", output::fmt_us(r.took_us), r.via));
        parts.push(format!("state replayed ({} calls)", r.replayed));
    }
    let compute = match &run.compute {
        Ok(v) if *v == faulty_scenario::COMPUTE_EXPECTED => format!("correct ({v})"),
        Ok(v) => format!("WRONG ({v}, expected {})", faulty_scenario::COMPUTE_EXPECTED),
        Err(e) => format!("failed: {e}"),
    };
    match run.retried_ok {
        Some(_) => parts.push(format!("call retried: {compute}")),
        None => parts.push(format!("compute: {compute}")),
    }
    match &run.counter {
        Ok(v) if *v == faulty_scenario::COUNTER_EXPECTED => {}
        Ok(v) => parts.push(format!("counter WRONG ({v}, expected {})", faulty_scenario::COUNTER_EXPECTED)),
        Err(e) => parts.push(format!("counter_get failed: {e}")),
    }
    if run.host_value != faulty_scenario::HOST_VALUE {
        parts.push(format!("host data corrupted ({} -> {:#x})", faulty_scenario::HOST_VALUE, run.host_value));
    }
    parts.join("; ")
}

#[derive(Serialize)]
struct WellLine {
    #[serde(rename = "type")]
    kind_of_line: &'static str,
    name: &'static str,
    isolation: &'static str,
    call: String,
    expected: String,
    got: String,
    ok: bool,
    note: String,
}

/// well_add, a buffer transform and a callback, each checked against what the host computes itself.
fn well_section(isolation: DemoIsolation, json: bool) -> Result<bool> {
    let iso = iso_of(isolation);
    let sup = Supervisor::new(Policy::default());
    let well = builtin("well")?;
    let ext = sup.load_with(&well, Some(iso)).with_context(|| format!("cannot load {} under ward", well.display()))?;
    let mut lines = Vec::new();

    let (a, b) = (2, 40);
    let got = ext.call("well_add", &mut [Arg::I64(a), Arg::I64(b)], RetType::I64);
    lines.push(check("well_add", format!("well_add({a}, {b})"), (a + b).to_string(), got.map(show), String::new()));

    let input = b"WardKeepsTheHostAlive";
    let key = 0x20u8;
    let mut out = vec![0u8; input.len()];
    let got = ext
        .call(
            "well_xor",
            &mut [Arg::In(input), Arg::Out(&mut out), Arg::U64(input.len() as u64), Arg::I64(i64::from(key))],
            RetType::Void,
        )
        .map(|_| String::from_utf8_lossy(&out).into_owned());
    let expected: Vec<u8> = input.iter().map(|c| c ^ key).collect();
    lines.push(check(
        "well_xor",
        format!("well_xor(\"{}\", key {key:#x})", String::from_utf8_lossy(input)),
        format!("\"{}\"", String::from_utf8_lossy(&expected)),
        got.map(|s| format!("\"{s}\"")),
        format!("{} bytes in, {} bytes out", input.len(), out.len()),
    ));

    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let square = sup.register_callback(Signature::new(&[ValType::I64], RetType::I64), move |args| {
        seen.fetch_add(1, Ordering::Relaxed);
        let x = args.first().and_then(Value::as_i64).unwrap_or(0);
        Value::I64(x * x)
    })?;
    let n = 10i64;
    let got = ext.call("well_map_sum", &mut [Arg::Callback(&square), Arg::I64(n)], RetType::I64);
    let expected: i64 = (0..n).map(|i| i * i).sum();
    lines.push(check(
        "well_map_sum",
        format!("well_map_sum(square, {n})"),
        expected.to_string(),
        got.map(show),
        format!("{} callbacks into the host", calls.load(Ordering::Relaxed)),
    ));

    let iso_name = iso_name(isolation);
    let mut all = true;
    for mut line in lines {
        line.isolation = iso_name;
        all &= line.ok;
        if json {
            output::json_line(&line)?;
        } else if line.ok {
            let note = if line.note.is_empty() { String::new() } else { format!(" ({})", line.note) };
            say!("  {} = {}: correct{note}", line.call, line.got)?;
        } else {
            say!("  {} = {}: WRONG, expected {}", line.call, line.got, line.expected)?;
        }
    }
    Ok(all)
}

fn show(v: Value) -> String {
    match v {
        Value::I64(x) => x.to_string(),
        other => format!("{other:?}"),
    }
}

fn check(
    name: &'static str,
    call: String,
    expected: String,
    got: Result<String, ward::Error>,
    note: String,
) -> WellLine {
    let got = got.unwrap_or_else(|e| format!("error: {e}"));
    WellLine { kind_of_line: "well", name, isolation: "", call, ok: got == expected, expected, got, note }
}
