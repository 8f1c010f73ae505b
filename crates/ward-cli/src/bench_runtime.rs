//! `ward bench runtime`: ward's runtimes (issue 32) beside the kernel plugins paper's figures, the native baseline
//! and WebAssembly, in one run.
//!
//! - **code generation**: creating a plugin from C source (compiled by libtcc in the runtime's domain, linked into
//!   its namespace) and deleting it again, for the paper's 66-line function and for the image transforms;
//! - **link, unlink**: a compiled plugin leaving the namespace and entering it again (no code generated);
//! - **null call**: calling a plugin that does nothing, beside the floor of its isolation kind: ward's null call
//!   into an extension's exported function in a domain of the same kind and policy;
//! - **image server**: `ward-imaged` in this process on loopback, its load generator over keep-alive connections,
//!   every image size, one transform: requests per second and latency, for the native baseline (the transform
//!   compiled by the system C compiler and loaded into the server), ward's runtime with isolation none (the same
//!   run-time compiled code, no boundary), process and mpk, and WebAssembly.
//!
//! Every figure is the median over repeated runs, with the range; ratios are against the baseline measured in the
//! same run. mpk lines run only where the processor has protection keys; the report says when it cannot.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use ward::{Isolation, Policy, RetType, Supervisor};
use ward_classes::runtime::{Code, Runtime, RuntimeOptions};
use ward_imaged::load::{self, LoadConfig};
use ward_imaged::native::NativeConfig;
use ward_imaged::{Images, NativeTransforms, Server, Transforms, WardTransforms, WasmTransforms};
use ward_wasm::{ImageHeader, WasmCompiler, WasmConfig, WasmRuntime};

use crate::bench::per_op_runs as measure;
use crate::bench_hosts::summarise;
use crate::output::{fmt_ns, json_line, say, Columns};

/// The paper's figures (kernel plugins, section 6), for the lines that have one.
const PAPER_CODEGEN_66: &str = "4 ms";
const PAPER_LINK: &str = "3.1 us";
const PAPER_UNLINK: &str = "1.6 us";
const PAPER_CALL: &str = "0.45-0.62 us";

/// Targets of issue 32.
const LINK_TARGET_NS: f64 = 1000.0;
const CALL_TARGET_RATIO: f64 = 1.5;
const MPK_THROUGHPUT_TARGET: f64 = 0.95;
const PROCESS_THROUGHPUT_TARGET: f64 = 1.0 / 1.5;

const CHECKSUM66: &str = include_str!("../../../extensions/runtime/bench/checksum66.c");
const TRANSFORMS: [(&str, &str); 3] = [
    ("grayscale", include_str!("../../../extensions/runtime/grayscale.c")),
    ("downsample", include_str!("../../../extensions/runtime/downsample.c")),
    ("crop", include_str!("../../../extensions/runtime/crop.c")),
];
const NOP: &str = "long nop(void) { return 0; }\n";

#[derive(Args)]
pub struct RuntimeArgs {
    #[command(flatten)]
    flags: crate::bench::Flags,
    /// The transform the image server applies.
    #[arg(long, default_value = "grayscale", value_parser = ["grayscale", "downsample", "crop"])]
    transform: String,
    /// Seconds of load per server run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Connections of the load generator.
    #[arg(long, default_value_t = 2)]
    connections: usize,
    /// Skip the image server (the micro-benchmarks only).
    #[arg(long)]
    no_server: bool,
}

struct Plan {
    runs: usize,
    codegen_ops: u64,
    link_ops: u64,
    call_ops: u64,
    server_runs: usize,
}

const FULL: Plan = Plan { runs: 11, codegen_ops: 20, link_ops: 2_000, call_ops: 20_000, server_runs: 3 };
const QUICK: Plan = Plan { runs: 3, codegen_ops: 2, link_ops: 50, call_ops: 200, server_runs: 1 };

/// The isolation kinds a runtime is measured with, and why mpk is not, where it is not.
fn isolations() -> (Vec<Isolation>, Option<String>) {
    let mut kinds = vec![Isolation::None, Isolation::Process];
    if ward::mpk_available() {
        kinds.push(Isolation::Mpk);
        (kinds, None)
    } else {
        (kinds, Some(crate::bench_lv2::mpk_unavailable()))
    }
}

#[derive(Serialize)]
struct Line<'a> {
    bench: &'static str,
    group: &'a str,
    variant: String,
    median_ns: f64,
    min_ns: f64,
    max_ns: f64,
    runs: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    paper: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    met: Option<bool>,
    load: usize,
}

struct Out {
    json: bool,
    cols: Columns,
    load: usize,
}

impl Out {
    #[allow(clippy::too_many_arguments)]
    fn line(
        &self,
        group: &str,
        variant: String,
        ns: &[f64],
        ratio: Option<f64>,
        paper: Option<&'static str>,
        target: Option<(String, bool)>,
    ) -> Result<()> {
        let s = summarise(ns);
        if self.json {
            return json_line(&Line {
                bench: "runtime",
                group,
                variant,
                median_ns: s.median,
                min_ns: s.min,
                max_ns: s.max,
                runs: ns.len(),
                ratio,
                paper,
                met: target.as_ref().map(|t| t.1),
                target: target.map(|t| t.0),
                load: self.load,
            });
        }
        let ratio = ratio.map_or_else(String::new, |r| format!("{r:.2}x"));
        let range = format!("{}-{}", fmt_ns(s.min), fmt_ns(s.max));
        let target = target.map_or_else(String::new, |(t, met)| format!("{t}: {}", if met { "met" } else { "MISSED" }));
        say!("{}", self.cols.row(&[group, &variant, &fmt_ns(s.median), &range, &ratio, paper.unwrap_or(""), &target]))
    }
}

pub fn runtime(args: RuntimeArgs) -> Result<bool> {
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        bail!("--seconds must be a positive number of seconds");
    }
    if args.connections == 0 {
        bail!("--connections must be at least 1");
    }
    let plan = if args.flags.quick { QUICK } else { FULL };
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build of ward; build with --release for representative numbers");
    }
    let load = crate::load::Load::start(args.flags.load)?;
    let (kinds, no_mpk) = isolations();
    let out = Out { json: args.flags.json, cols: Columns::new(&[12, 28, 9, 19, 7, 12]), load: load.processes() };
    if !args.flags.json {
        say!(
            "ward bench runtime: medians of {} runs per line, {} CPUs; ratios against the baseline of each group",
            plan.runs,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        )?;
        if let Some(text) = load.describe() {
            say!("{text}")?;
        }
        if let Some(why) = &no_mpk {
            say!("mpk: not measured: {why}")?;
        }
        say!("")?;
        say!("{}", out.cols.row(&["group", "variant", "median", "range (min-max)", "ratio", "paper", "target"]))?;
    }
    codegen(&out, &plan, &kinds)?;
    linking(&out, &plan, &kinds)?;
    null_calls(&out, &plan, &kinds)?;
    if !args.no_server {
        server(&out, &plan, &args, &kinds, no_mpk.as_deref())?;
    }
    Ok(true)
}

fn supervisor() -> Result<Supervisor> {
    // No heap snapshots: they are a recovery feature, timed nowhere here.
    Ok(Supervisor::new(Policy::from_toml_str("[defaults]\ncheckpoint_ms = 0\n", "the benchmark's policy")?))
}

fn open(sup: &Supervisor, name: &str, isolation: Isolation) -> Result<Runtime> {
    let options = RuntimeOptions { isolation: Some(isolation), ..RuntimeOptions::default() };
    Runtime::open(sup, name, &options).with_context(|| format!("cannot open a runtime with isolation {isolation}"))
}

fn codegen(out: &Out, plan: &Plan, kinds: &[Isolation]) -> Result<()> {
    let sup = supervisor()?;
    let sources: Vec<(&str, &str)> = std::iter::once(("checksum66", CHECKSUM66)).chain(TRANSFORMS).collect();
    for isolation in kinds {
        let rt = open(&sup, &format!("codegen_{isolation}"), *isolation)?;
        rt.header("ward_image.h", ward_imaged::native::WARD_IMAGE_H)?;
        for (name, source) in &sources {
            let create = measure(plan.runs, plan.codegen_ops, |n| {
                for _ in 0..n {
                    rt.create(name, Code::Source(source)).with_context(|| format!("cannot create {name}"))?;
                    rt.delete(name)?;
                }
                Ok(())
            })?;
            let paper = (*name == "checksum66").then_some(PAPER_CODEGEN_66);
            // The function's own lines (from its signature to its end), as the paper counts them.
            let lines = source.lines().skip_while(|l| !l.starts_with(&format!("int64_t {name}("))).count();
            out.line("codegen", format!("{name} ({lines}-line fn), {isolation}"), &create, None, paper, None)?;
        }
    }
    wasm_codegen(out, plan, &sources)
}

/// The peer's code generation: clang to a wasm32 module (a process of its own), wasmtime's compile of the module to
/// machine code, and an instance.
fn wasm_codegen(out: &Out, plan: &Plan, sources: &[(&str, &str)]) -> Result<()> {
    let compiler = WasmCompiler::new(ImageHeader::Text(ward_imaged::native::WARD_IMAGE_H.into()))?;
    let runtime = WasmRuntime::new(WasmConfig::default())?;
    // Each step is timed over its own runs: clang dominates, and timing the steps apart says where the time goes.
    let runs = plan.runs.min(5);
    for (name, source) in sources {
        let clang = measure(runs, 1, |_| {
            black_box(compiler.compile(name, source)?);
            Ok(())
        })?;
        out.line("codegen", format!("{name}, wasm: clang"), &clang, None, None, None)?;
        let binary = compiler.compile(name, source)?;
        // The checksum has neither the transform's nor the null plugin's signature: the peer's host takes those
        // only, so its module is compiled by clang and no further.
        if *name == "checksum66" {
            continue;
        }
        let module = measure(plan.runs, plan.codegen_ops, |n| {
            for _ in 0..n {
                black_box(runtime.compile_module(&binary)?);
            }
            Ok(())
        })?;
        out.line("codegen", format!("{name}, wasm: Module::new"), &module, None, None, None)?;
        let compiled = runtime.compile_module(&binary)?;
        let instantiate = measure(plan.runs, plan.codegen_ops, |n| {
            for _ in 0..n {
                black_box(runtime.instantiate(&compiled)?);
            }
            Ok(())
        })?;
        out.line("codegen", format!("{name}, wasm: instantiate"), &instantiate, None, None, None)?;
    }
    Ok(())
}

fn linking(out: &Out, plan: &Plan, kinds: &[Isolation]) -> Result<()> {
    let sup = supervisor()?;
    for isolation in kinds {
        let rt = open(&sup, &format!("link_{isolation}"), *isolation)?;
        rt.create("nop", Code::Source(NOP))?;
        let mut unlink = Vec::new();
        let mut link = Vec::new();
        // Unlink and link alternate; each is timed on its own.
        measure(plan.runs, 1, |_| {
            let (mut u, mut l) = (Duration::ZERO, Duration::ZERO);
            for _ in 0..plan.link_ops {
                let t = Instant::now();
                rt.unlink("nop")?;
                u += t.elapsed();
                let t = Instant::now();
                rt.link("nop")?;
                l += t.elapsed();
            }
            unlink.push(u.as_nanos() as f64 / plan.link_ops as f64);
            link.push(l.as_nanos() as f64 / plan.link_ops as f64);
            Ok(())
        })?;
        // The warm-up run's figures are not kept.
        unlink.remove(0);
        link.remove(0);
        let target = |ns: &[f64]| {
            (*isolation == Isolation::Mpk)
                .then(|| ("<= 1 us (mpk)".to_string(), summarise(ns).median <= LINK_TARGET_NS))
        };
        out.line("link", format!("link, {isolation}"), &link, None, Some(PAPER_LINK), target(&link))?;
        out.line("link", format!("unlink, {isolation}"), &unlink, None, Some(PAPER_UNLINK), target(&unlink))?;
    }
    Ok(())
}

fn null_calls(out: &Out, plan: &Plan, kinds: &[Isolation]) -> Result<()> {
    let well = ward_extensions::path_of("well").context("cannot extract the built-in extension well.so")?;
    for isolation in kinds {
        let sup = supervisor()?;
        let ext = sup
            .load_with(&well, Some(*isolation))
            .with_context(|| format!("cannot load {} with isolation {isolation}", well.display()))?;
        let null = ext.function("well_null")?;
        let floor = measure(plan.runs, plan.call_ops, |n| {
            for _ in 0..n {
                black_box(null.call(&mut [], RetType::Void)?);
            }
            Ok(())
        })?;
        let rt = open(&sup, &format!("call_{isolation}"), *isolation)?;
        let nop = rt.create("nop", Code::Source(NOP))?;
        let calls = measure(plan.runs, plan.call_ops, |n| {
            for _ in 0..n {
                black_box(rt.call(nop, &mut [], RetType::I64)?);
            }
            Ok(())
        })?;
        let ratio = summarise(&calls).median / summarise(&floor).median;
        out.line("null call", format!("floor: extension call, {isolation}"), &floor, None, None, None)?;
        // The target is the cost over a cross-domain call; isolation none has no boundary to cross.
        let target = (*isolation != Isolation::None)
            .then(|| (format!("<= {CALL_TARGET_RATIO}x floor"), ratio <= CALL_TARGET_RATIO));
        out.line("null call", format!("runtime call, {isolation}"), &calls, Some(ratio), Some(PAPER_CALL), target)?;
    }
    let compiler = WasmCompiler::new(ImageHeader::Text(ward_imaged::native::WARD_IMAGE_H.into()))?;
    let runtime = WasmRuntime::new(WasmConfig::default())?;
    let nop = runtime.link(&compiler.compile("nop", ward_wasm::NULL_PLUGIN_SOURCE)?)?;
    let calls = measure(plan.runs, plan.call_ops, |n| {
        for _ in 0..n {
            black_box(nop.call_null()?);
        }
        Ok(())
    })?;
    out.line("null call", "wasmtime call".into(), &calls, None, None, None)
}

/// What runs the server's transforms in one server line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backend {
    Native,
    Ward(Isolation),
    Wasm,
}

impl Backend {
    fn name(self) -> String {
        match self {
            Backend::Native => "native (cc -O2)".into(),
            Backend::Ward(Isolation::Process) => {
                format!("ward process x{}", WardTransforms::default_pool(Isolation::Process))
            }
            Backend::Ward(isolation) => format!("ward {isolation}"),
            Backend::Wasm => "wasmtime".into(),
        }
    }

    fn start(self, transform: &str, source: &str) -> Result<Arc<dyn Transforms>> {
        let transforms: Arc<dyn Transforms> = match self {
            Backend::Native => Arc::new(NativeTransforms::with_config(NativeConfig::default())),
            Backend::Ward(isolation) => {
                let policy = Policy::from_toml_str("[defaults]\ncheckpoint_ms = 0\n", "the benchmark's policy")?;
                let pool = WardTransforms::default_pool(isolation);
                Arc::new(WardTransforms::new(policy, isolation, Duration::from_secs(10), pool)?)
            }
            Backend::Wasm => Arc::new(WasmTransforms::new(Duration::from_secs(10)).map_err(anyhow::Error::msg)?),
        };
        transforms
            .install(transform, source)
            .with_context(|| format!("cannot install {transform} in {}", self.name()))?;
        Ok(transforms)
    }
}

#[derive(Serialize)]
struct ServerLine<'a> {
    bench: &'static str,
    group: &'static str,
    image: &'a str,
    backend: String,
    transform: &'a str,
    connections: usize,
    requests_per_s: f64,
    requests_per_s_min: f64,
    requests_per_s_max: f64,
    latency_ms_median: f64,
    latency_ms_p90: f64,
    latency_ms_p99: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    throughput_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    met: Option<bool>,
    runs: usize,
    load: usize,
}

fn server(out: &Out, plan: &Plan, args: &RuntimeArgs, kinds: &[Isolation], no_mpk: Option<&str>) -> Result<()> {
    let source = TRANSFORMS
        .iter()
        .find(|(name, _)| *name == args.transform)
        .map(|(_, source)| *source)
        .context("no such transform")?;
    let mut backends = vec![Backend::Native];
    backends.extend(kinds.iter().map(|k| Backend::Ward(*k)));
    backends.push(Backend::Wasm);
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    let cols = Columns::new(&[10, 16, 12, 21, 7, 26, 30]);
    if !out.json {
        say!("")?;
        say!(
            "image server: {} of each image over {} keep-alive connection{}, {} run{} of {} s per line; \
             medians, range of requests/s in brackets",
            args.transform,
            args.connections,
            if args.connections == 1 { "" } else { "s" },
            plan.server_runs,
            if plan.server_runs == 1 { "" } else { "s" },
            args.seconds
        )?;
        say!("{}", cols.row(&["image", "backend", "requests/s", "range", "ratio", "latency p50/p90/p99", "target"]))?;
    }
    let seconds = if args.flags.quick { args.seconds.min(0.5) } else { args.seconds };
    let mut native_rates = Vec::new();
    for backend in &backends {
        let transforms = backend.start(&args.transform, source)?;
        let (address, stop) = tokio.block_on(start_server(transforms.clone()))?;
        let mut per_image = Vec::new();
        for image in ward_imaged::image::generated().iter().map(|(name, _)| name.clone()) {
            let mut rates = Vec::new();
            let mut latency = Vec::new();
            for _ in 0..plan.server_runs {
                let config = LoadConfig {
                    url: format!("http://{address}"),
                    image: image.clone(),
                    transform: Some(args.transform.clone()),
                    connections: args.connections,
                    duration: Duration::from_secs_f64(seconds),
                };
                let report = tokio.block_on(load::run(&config)).with_context(|| format!("loading {address}"))?;
                if report.failures > 0 {
                    bail!(
                        "{} answered {} of its requests for {image} with errors: {}",
                        backend.name(),
                        report.failures,
                        report.first_failure.unwrap_or_default()
                    );
                }
                rates.push(report.requests_per_s);
                latency.push(report.latency_ms);
            }
            per_image.push((image, rates, latency));
        }
        stop.abort();
        results_for(out, &cols, args, *backend, per_image, &mut native_rates)?;
    }
    if let Some(why) = no_mpk {
        if !out.json {
            say!(
                "ward mpk: not measured ({why}); target throughput >= {:.0}% of native and ahead of wasmtime",
                MPK_THROUGHPUT_TARGET * 100.0
            )?;
        }
    }
    Ok(())
}

fn results_for(
    out: &Out,
    cols: &Columns,
    args: &RuntimeArgs,
    backend: Backend,
    per_image: Vec<(String, Vec<f64>, Vec<load::Latency>)>,
    native_rates: &mut Vec<(String, f64)>,
) -> Result<()> {
    for (image, rates, latency) in per_image {
        let s = summarise(&rates);
        let p50 = summarise(&latency.iter().map(|l| l.median).collect::<Vec<_>>()).median;
        let p90 = summarise(&latency.iter().map(|l| l.p90).collect::<Vec<_>>()).median;
        let p99 = summarise(&latency.iter().map(|l| l.p99).collect::<Vec<_>>()).median;
        let native = native_rates.iter().find(|(i, _)| *i == image).map(|(_, r)| *r);
        if backend == Backend::Native {
            native_rates.push((image.clone(), s.median));
        }
        let ratio = native.filter(|_| backend != Backend::Native).map(|n| s.median / n);
        let target = match (backend, ratio) {
            (Backend::Ward(Isolation::Mpk), Some(r)) => {
                Some((">= 95% of native".to_string(), r >= MPK_THROUGHPUT_TARGET))
            }
            (Backend::Ward(Isolation::Process), Some(r)) => {
                Some(("within 1.5x of native".to_string(), r >= PROCESS_THROUGHPUT_TARGET))
            }
            _ => None,
        };
        if out.json {
            json_line(&ServerLine {
                bench: "runtime",
                group: "server",
                image: &image,
                backend: backend.name(),
                transform: &args.transform,
                connections: args.connections,
                requests_per_s: s.median,
                requests_per_s_min: s.min,
                requests_per_s_max: s.max,
                latency_ms_median: p50,
                latency_ms_p90: p90,
                latency_ms_p99: p99,
                throughput_ratio: ratio,
                met: target.as_ref().map(|t| t.1),
                target: target.map(|t| t.0),
                runs: rates.len(),
                load: out.load,
            })?;
            continue;
        }
        say!(
            "{}",
            cols.row(&[
                &image,
                &backend.name(),
                &format!("{:.0}", s.median),
                &format!("[{:.0}-{:.0}]", s.min, s.max),
                &ratio.map_or_else(String::new, |r| format!("{r:.2}x")),
                &format!("{p50:.2}/{p90:.2}/{p99:.2} ms"),
                &target.map_or_else(String::new, |(t, met)| format!("{t}: {}", if met { "met" } else { "MISSED" })),
            ])
        )?;
    }
    Ok(())
}

/// The server on a free loopback port, serving until the returned task is aborted.
async fn start_server(transforms: Arc<dyn Transforms>) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding a loopback port")?;
    let address = listener.local_addr()?;
    let server = Arc::new(Server::new(Images::generated(), transforms));
    let task = tokio::spawn(async move {
        if let Err(e) = server.serve(listener).await {
            tracing::warn!(error = %e, "the benchmark's image server stopped");
        }
    });
    Ok((address, task))
}
