//! `ward`: the command-line program. This file parses arguments and maps outcomes to exit statuses:
//! 0 success, 1 a check failed or the run could not complete, 2 bad input.

#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod bench;
#[allow(unsafe_code)]
mod bench_hosts;
#[allow(unsafe_code)]
mod bench_jalv;
mod bench_lv2;
mod bench_runtime;
mod campaign;
mod check;
mod corpus;
mod demo;
mod faulty_scenario;
mod hosts;
mod inject;
#[allow(unsafe_code)]
mod load;
mod output;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "ward",
    version,
    about = "Run native extensions in protection domains and keep the host alive when they fail"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inject every fault of the built-in faulty extension, natively and under ward, side by side.
    Demo(DemoArgs),
    /// Measure ward against native calls in the same run.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// Write a copy of an extension with SWIFI faults injected into its machine code (Nooks, Table II).
    Inject(inject::InjectArgs),
    /// Reliability campaign: SWIFI-mutated copies of an extension (or run-time library faults: failed allocations,
    /// leaks, copy overruns) run natively and under ward, outcomes classified (Nooks, section 4).
    Campaign(campaign::CampaignArgs),
    /// Which isolation kinds each extension can get (none, process, mpk), and every reason it cannot.
    Check(check::CheckArgs),
    /// Every installed LADSPA and frei0r plugin on a fixed input, natively and under each isolation kind: is the
    /// output identical?
    Corpus(corpus::CorpusArgs),
    /// Where the built-in extensions are (written out on first use): name, path and purpose of each.
    Builtins {
        /// Print only their directory (for LADSPA_PATH or FREI0R_PATH).
        #[arg(long, conflicts_with = "lv2_dir")]
        dir: bool,
        /// Print only the directory of the built-in LV2 bundles (for LV2_PATH).
        #[arg(long)]
        lv2_dir: bool,
    },
    /// Run an unmodified host with every plugin of a known class (LADSPA, frei0r, LV2) it opens under ward.
    Run(run::RunArgs),
    /// Internal: a throwaway host that loads PATH directly and triggers fault KIND (used by `demo`).
    #[command(name = "__native-host", hide = true)]
    NativeHost {
        path: PathBuf,
        #[arg(value_parser = clap::value_parser!(i64).range(1..=13))]
        kind: i64,
    },
    /// Internal: one demo run under ward with isolation `none`, in a throwaway host (used by `demo`).
    #[command(name = "__ward-host", hide = true)]
    WardHost {
        path: PathBuf,
        #[arg(value_parser = clap::value_parser!(i64).range(1..=13))]
        kind: i64,
    },
    /// Internal: one run of a campaign trial, in a throwaway host (used by `campaign`).
    #[command(name = "__campaign-host", hide = true)]
    CampaignHost(hosts::campaign_host::CampaignHostArgs),
    /// Internal: one plugin run (or one library listed) for `corpus`, in a throwaway process.
    #[command(name = "__corpus-run", hide = true)]
    CorpusRun(corpus::runner::RunArgs),
    /// Internal: busy work for a benchmark's `--load`, until killed or the benchmark `--parent` is gone.
    #[command(name = "__busy", hide = true)]
    Busy {
        #[arg(long)]
        parent: u32,
    },
}

#[derive(Args)]
struct DemoArgs {
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// How the faulty extension is isolated under ward (`none` shows that it does not protect).
    #[arg(long, value_enum, default_value_t = DemoIsolation::Process)]
    isolation: DemoIsolation,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoIsolation {
    /// Process domains, then mpk domains (where this machine has protection keys).
    Process,
    /// mpk domains only.
    Mpk,
    None,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Cross-domain calls: null calls, buffers, deferred calls, recovery, starting a domain.
    Xpc(bench::Flags),
    /// sox through a chain of five LADSPA plugins: native, and under `ward run` with isolation none and process.
    Sox(bench_hosts::SoxArgs),
    /// ffmpeg with a frei0r filter on 300 frames of 1920x1080: native, and under `ward run` (none, process).
    Ffmpeg(bench_hosts::FfmpegArgs),
    /// Hosts that scan every LADSPA library at start (listplugins; a test host that then processes one second of
    /// audio): native, and under `ward run` (none, process).
    Scan(bench_hosts::ScanArgs),
    /// Debian's lv2bench over every LV2 effect plugin of the corpus (or those named with --plugin), 512-frame
    /// blocks: native, and under `ward run` (process; mpk where the processor has protection keys).
    Lv2(bench_lv2::Lv2Args),
    /// jalv in a JACK server of its own (dummy backend, 48 kHz, 128 frames) with one heavy LV2 plugin: CPU time per
    /// period and xruns, natively and under `ward run` (process; mpk where the processor has protection keys).
    Jalv(bench_jalv::JalvArgs),
    /// Runtimes (issue 32): code generation, link and unlink, null calls, and the image server under load: native,
    /// ward (none, process; mpk where the processor has protection keys) and WebAssembly.
    Runtime(bench_runtime::RuntimeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let result = match cli.command {
        Command::Demo(a) => demo::run(a.isolation, a.json),
        Command::Bench { what: BenchWhat::Xpc(flags) } => bench::run(flags),
        Command::Bench { what: BenchWhat::Sox(a) } => bench_hosts::sox(a),
        Command::Bench { what: BenchWhat::Ffmpeg(a) } => bench_hosts::ffmpeg(a),
        Command::Bench { what: BenchWhat::Scan(a) } => bench_hosts::scan(a),
        Command::Bench { what: BenchWhat::Lv2(a) } => bench_lv2::lv2(a),
        Command::Bench { what: BenchWhat::Jalv(a) } => bench_jalv::jalv(a),
        Command::Bench { what: BenchWhat::Runtime(a) } => bench_runtime::runtime(a),
        Command::Inject(a) => inject::run(a),
        Command::Campaign(a) => campaign::run(a),
        Command::Check(a) => check::run(a),
        Command::Corpus(a) => corpus::run(a),
        Command::CorpusRun(a) => corpus::runner::main(a),
        Command::Run(a) => run::run(a),
        Command::Builtins { dir, lv2_dir } => run::builtins(dir, lv2_dir),
        Command::CampaignHost(a) => hosts::campaign_host::main(a),
        Command::NativeHost { path, kind } => hosts::native_host::host_main(&path, kind),
        Command::WardHost { path, kind } => demo::ward_host_main(&path, kind),
        Command::Busy { parent } => load::busy_main(parent),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        // A reader that went away (`ward bench xpc | head`) is not an error worth a message.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e)
            if inject::is_bad_input(&e)
                || campaign::is_bad_input(&e)
                || check::is_bad_input(&e)
                || run::is_bad_input(&e)
                || corpus::is_bad_input(&e) =>
        {
            eprintln!("ward: error: {}", message(&e));
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("ward: error: {}", message(&e));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes on one line, each joined by ": ", leaving out a cause whose text the line already
/// holds (library errors often say their source themselves: "cannot read F: No such file" would otherwise end in
/// the OS error twice).
fn message(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// Library events go to stderr; quiet unless RUST_LOG asks, because the demo provokes faults on purpose and the
/// library reports each one as a warning.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // The commands report faults and recoveries themselves; the library's own log only on request (RUST_LOG).
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

#[cfg(test)]
mod tests {
    use super::message;

    #[test]
    fn a_cause_the_message_already_names_is_said_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let said = io.to_string();
        let e = anyhow::Error::new(ward::policy::PolicyError::Read { path: "p.toml".into(), source: io })
            .context("cannot start the host");
        let line = message(&e);
        assert_eq!(line.matches(said.as_str()).count(), 1, "{line}");
        assert!(line.starts_with("cannot start the host: cannot read policy file p.toml"), "{line}");
    }

    #[test]
    fn causes_the_message_does_not_name_are_kept_in_order() {
        let e = anyhow::anyhow!("inner").context("middle").context("outer");
        assert_eq!(message(&e), "outer: middle: inner");
    }
}
