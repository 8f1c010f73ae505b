//! `ward-imaged serve`: the image server; `ward-imaged load`: its load generator. See the library's docs.

use std::io::{IsTerminal as _, Write as _};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand, ValueEnum};
use ward::{Isolation, Policy};
use ward_imaged::load::{self, LoadConfig};
use ward_imaged::native::NativeConfig;
use ward_imaged::{Image, Images, NativeTransforms, Server, Transforms, WardTransforms, WasmTransforms};

#[derive(Parser)]
#[command(name = "ward-imaged", about = "An image server whose transforms are C plugins uploaded at run time")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve images and transforms; prints the bound address on the first line of standard output.
    Serve {
        /// The loopback address to listen on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// What runs the transforms.
        #[arg(long, value_enum, default_value_t = Backend::Native)]
        backend: Backend,
        /// A binary PPM (P6) file to serve besides the generated images, named by its file name without the
        /// extension (may be repeated).
        #[arg(long = "image", value_name = "FILE.ppm")]
        images: Vec<PathBuf>,
        /// The C compiler of the native backend.
        #[arg(long, default_value = "cc")]
        cc: String,
        /// The isolation of the ward backend's runtime: process, mpk, none or auto.
        #[arg(long, default_value = "process")]
        isolation: Isolation,
        /// The ward backend's quantum: a transform running longer is a fault.
        #[arg(long, default_value_t = 2000)]
        quantum_ms: u64,
        /// A ward policy file (TOML) for the ward backend; its runtimes are named `imaged`.
        #[arg(long)]
        policy: Option<PathBuf>,
        /// The ward backend's runtimes, each transform linked into all and requests taken in turn (0: one per
        /// processor with isolation process, whose domain serves one call at a time; one otherwise).
        #[arg(long, default_value_t = 0)]
        runtimes: usize,
    },
    /// Load a server: keep-alive connections requesting one image, transformed or not, for a while.
    Load {
        /// The server's base URL, e.g. http://127.0.0.1:8080 (loopback only).
        #[arg(long)]
        url: String,
        /// The transform to apply (none: the image as it is).
        #[arg(long)]
        transform: Option<String>,
        /// The image to request.
        #[arg(long)]
        image: String,
        /// Connections, one task each.
        #[arg(long, default_value_t = 1)]
        connections: usize,
        /// Seconds to run.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// What runs the transforms.
#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    /// Compiled by the system C compiler and loaded into the server: no isolation, a faulty transform kills the
    /// server (the baseline).
    Native,
    /// A ward runtime: compiled by libtcc inside the runtime's domain (`--isolation`); a faulty transform is
    /// unlinked and its requests answered with 502.
    Ward,
    /// WebAssembly: compiled by clang to wasm32 and run by wasmtime, with the same quantum (`--quantum-ms`).
    Wasm,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ward-imaged: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    match cli.command {
        Command::Serve { listen, backend, images, cc, isolation, quantum_ms, policy, runtimes } => {
            let quantum = Duration::from_millis(quantum_ms);
            let transforms = transforms(backend, cc, isolation, quantum, policy, runtimes)?;
            runtime.block_on(serve(listen, transforms, &images))
        }
        Command::Load { url, transform, image, connections, duration, json } => {
            if !(duration.is_finite() && duration > 0.0) {
                bail!("--duration must be a positive number of seconds");
            }
            let config = LoadConfig { url, image, transform, connections, duration: Duration::from_secs_f64(duration) };
            let report = runtime.block_on(load::run(&config))?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!("{report}");
            }
            if report.requests == 0 {
                bail!("no request succeeded");
            }
            Ok(())
        }
    }
}

fn transforms(
    backend: Backend,
    cc: String,
    isolation: Isolation,
    quantum: Duration,
    policy: Option<PathBuf>,
    runtimes: usize,
) -> anyhow::Result<Arc<dyn Transforms>> {
    Ok(match backend {
        Backend::Native => {
            let config = NativeConfig { compiler: cc.into(), ..NativeConfig::default() };
            Arc::new(NativeTransforms::with_config(config))
        }
        Backend::Ward => {
            let policy = match policy {
                Some(path) => Policy::from_file(&path).with_context(|| format!("reading {}", path.display()))?,
                None => Policy::default(),
            };
            let runtimes = if runtimes == 0 { WardTransforms::default_pool(isolation) } else { runtimes };
            Arc::new(WardTransforms::new(policy, isolation, quantum, runtimes).context("starting the ward runtimes")?)
        }
        Backend::Wasm => {
            Arc::new(WasmTransforms::new(quantum).map_err(anyhow::Error::msg).context("starting wasmtime")?)
        }
    })
}

async fn serve(listen: SocketAddr, transforms: Arc<dyn Transforms>, files: &[PathBuf]) -> anyhow::Result<()> {
    // Uploaded source runs in this server (natively, with no isolation, in the baseline): answering other hosts
    // would offer them this machine.
    if !listen.ip().is_loopback() {
        bail!("{listen} is not a loopback address: ward-imaged serves this machine only");
    }
    let mut images = Images::generated();
    for file in files {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let image = Image::from_ppm(&bytes).with_context(|| format!("reading {}", file.display()))?;
        let name = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        images.add(name, image).with_context(|| format!("adding {}", file.display()))?;
    }
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let bound = listener.local_addr()?;
    // The first line of standard output is the bound address, for whoever started the server.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{bound}")?;
    stdout.flush()?;
    drop(stdout);
    tracing::info!("serving http://{bound}/ with transforms {}", transforms.describe());
    tracing::info!("images: {}", images.names().collect::<Vec<_>>().join(", "));
    Arc::new(Server::new(images, transforms)).serve(listener).await.context("serving")
}
