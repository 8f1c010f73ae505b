//! `ward-domain`: the process that hosts the extensions of one process domain (DD/OS' driver VM, NewtOS' server
//! process, in user space).
//!
//! The host starts it with four descriptors and a command line (see [`args`]):
//!
//! | fd | what |
//! | --- | --- |
//! | 3 | control socket (`SOCK_SEQPACKET`): readiness, load errors, fork and load requests in zygote mode |
//! | 4 | the shared region (`ward-xpc` memfd): rings and the fault record |
//! | 5 | the input pool, read-only (mapped so too: the host keeps intact inputs after a crash) |
//! | 6 | the output pool |
//!
//! With `--arena` the host lends its large heap blocks in place (`ward_xpc::arena`): a serving process keeps the
//! control socket, on which each block's descriptor comes before the first call that names it (an incarnation
//! forked by a zygote gets a control socket of its own with the fork request).
//!
//! Start-up runs these steps in order, each with its own error (reported on the control socket, exit status 2):
//! tie its life to the host's (`--parent`; the host runs nothing in the child before exec), join the domain's
//! cgroup (`--cgroup`: its memory, process and CPU limits hold from here on), close every other descriptor, enter a PID namespace of its own (the process the host started stays outside as a waiter that ends
//! as the domain ends: see [`sandbox::namespace`]), map the region, install the fault recorders, map the pools,
//! enter the sandbox (see [`sandbox`]: from here on a hostile extension is contained), load the extensions, run
//! their init functions, apply the resource limits. It answers `ready` with a pidfd of itself (the host's handle on
//! it: a pid from inside a namespace means nothing outside), and on a second line what of the namespace it asked
//! for it could not have. Then, in `serve` mode, it serves calls; in `zygote` mode it waits for `fork` requests and
//! forks a fresh, already-initialised incarnation for each, which narrows its system call filter before serving
//! (see [`zygote`]).
//!
//! In `template` mode (`--mode template --parent PID`, fd 3 only) it does none of this: it stays as exec'd and forks
//! a process for each domain the host starts, which then runs the start-up above as if exec'd (see [`template`]), or
//! a spare ahead of the next domain, which runs the steps up to the PID namespace, and the sandbox's steps that depend
//! on no domain (standard output, `no_new_privs`, not dumpable, capabilities), before the domain's command line
//! comes and the rest after it.

#![deny(unsafe_code)]

mod args;
mod error;
#[allow(unsafe_code)]
mod fault_handler;
#[allow(unsafe_code)]
mod loader;
#[allow(unsafe_code)]
mod sandbox;
#[allow(unsafe_code)]
mod serve;
#[allow(unsafe_code)]
mod startup;
#[allow(unsafe_code)]
mod template;
#[allow(unsafe_code)]
mod zygote;

use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitCode;

use ward_xpc::arena::view::ArenaView;
use ward_xpc::pool::{MappedPool, PoolGeometry, POOL_IN, POOL_OUT};
use ward_xpc::Region;

use crate::args::{Args, Job};
use crate::error::SetupError;
use ward_xpc::control::ControlSocket;

use crate::startup::{close_other_descriptors, die_with, own_pidfd, Inherited};
/// Idle arena windows kept mapped between calls at most (a quarter of the address-space limit when that is lower):
/// a video host lends the same few frames again and again.
const ARENA_CACHE: usize = 256 << 20;

/// Everything a serving incarnation needs, set up once (before fork in zygote mode).
pub(crate) struct Setup {
    pub region: Region,
    pub pool_in: MappedPool,
    pub pool_out: MappedPool,
    pub arena: Option<ArenaView>,
    pub library: loader::Library,
    pub args: Args,
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match template::command_line(&argv) {
        Some(parent) => template::run(parent),
        None => start(argv),
    }
}

/// Everything a domain process runs from its command line on, whether the host exec'd it or the template forked it
/// (which then put the descriptors where an exec'd one finds them): one start-up for both.
pub(crate) fn start(argv: Vec<String>) -> ExitCode {
    let Some(args) = parse(argv) else { return ExitCode::from(2) };
    if !die_with(args.parent) {
        eprintln!("ward-domain: its host (process {}) is gone; nothing to serve", args.parent);
        return ExitCode::from(2);
    }
    // First of all, so that the waiter, init and the domain (and a zygote's incarnations) are all in it.
    let joined = join_cgroups(&args.cgroups, false);
    close_other_descriptors();
    // Before anything else: the waiter and init this starts return only as the domain proper, in the namespace.
    let entered = args.sandbox.pid_namespace.then(|| sandbox::namespace::enter(None));
    finish_start(args, joined, entered, None)
}

/// The start-up of a domain whose process a spare made ahead (`template.rs`): tied to the host's life, other
/// descriptors closed, the PID namespace entered (`entered`) and the sandbox's first steps taken (`first_steps`,
/// which depend on no domain) before its command line came. The cgroup is joined now, by the domain proper and the
/// namespace's init, before any extension code runs (the waiter, outside the namespace, runs none and stays where
/// the spare was made); the rest is [`start`]'s, the first steps' outcome reported where [`start`] takes them.
pub(crate) fn start_entered(
    argv: Vec<String>,
    entered: sandbox::namespace::Outcome,
    first_steps: Result<(), sandbox::SandboxError>,
) -> ExitCode {
    let Some(args) = parse(argv) else { return ExitCode::from(2) };
    let inside = matches!(entered, sandbox::namespace::Outcome::Inside { .. });
    let joined = join_cgroups(&args.cgroups, inside);
    finish_start(args, joined, Some(entered), Some(first_steps))
}

fn parse(argv: Vec<String>) -> Option<Args> {
    match Args::parse(argv.into_iter()) {
        Ok(a) => Some(a),
        Err(e) => {
            eprintln!("ward-domain: {e}");
            eprintln!("ward-domain is started by the ward library, not by hand; see `ward --help`.");
            None
        }
    }
}

/// The start-up from the namespace on: `entered` is what entering the PID namespace gave (None: not asked for),
/// `first_steps` the outcome of the sandbox's first steps where taken already (None: [`setup`] takes them).
fn finish_start(
    args: Args,
    joined: Result<(), SetupError>,
    entered: Option<sandbox::namespace::Outcome>,
    first_steps: Option<Result<(), sandbox::SandboxError>>,
) -> ExitCode {
    // What the host is told with `ready` about a namespace it asked for and did not get.
    let mut without = None;
    let namespace = match entered {
        Some(sandbox::namespace::Outcome::Inside { proc }) => {
            without = proc.map(|why| format!("{why}: /proc lists the host's processes (still out of reach)"));
            true
        }
        Some(sandbox::namespace::Outcome::Refused(why)) => {
            without = Some(format!("no PID namespace: {why}"));
            false
        }
        None => false,
    };
    let Some(inherited) = Inherited::take() else {
        eprintln!("ward-domain: the host's descriptors were taken twice");
        return ExitCode::from(2);
    };
    let control = ControlSocket::from_fd(inherited.control);
    if let Err(e) = joined {
        report_error(&control, &e.to_string());
        return ExitCode::from(2);
    }
    // The host knows this process by the pidfd it sends with `ready`: the pid it would say is its namespace's.
    let own = match own_pidfd() {
        Ok(fd) => fd,
        Err(e) => {
            report_error(&control, &SetupError::Pidfd(e).to_string());
            return ExitCode::from(2);
        }
    };
    match setup(args, namespace, inherited.region, inherited.pool_in, inherited.pool_out, first_steps) {
        Ok(setup) => {
            let mut ready = match &without {
                Some(why) => format!("ready\n{why}"),
                None => "ready".to_string(),
            };
            ward_xpc::control::fit(&mut ready);
            let _ = control.send(&ready, Some(own.as_fd()));
            drop(own);
            match setup.args.mode {
                Job::Serve => {
                    let mut setup = setup;
                    match setup.arena.as_mut() {
                        Some(arena) => arena.attach(control),
                        None => drop(control),
                    }
                    serve::run(setup)
                }
                Job::Zygote => zygote::run(setup, control),
            }
        }
        Err(e) => {
            report_error(&control, &e.to_string());
            ExitCode::from(2)
        }
    }
}

fn setup(
    args: Args,
    namespace: bool,
    region_fd: OwnedFd,
    in_fd: OwnedFd,
    out_fd: OwnedFd,
    first_steps: Option<Result<(), sandbox::SandboxError>>,
) -> Result<Setup, SetupError> {
    let region = Region::open_domain(region_fd).map_err(SetupError::Region)?;
    // Before the pools: finding the main thread's stack reads /proc/self/maps, longer with every mapping.
    fault_handler::install(region.clone()).map_err(SetupError::FaultHandlers)?;
    let geometry = PoolGeometry::standard(args.read_past).map_err(SetupError::PoolGeometry)?;
    let pool_in = MappedPool::map(in_fd, POOL_IN, geometry.clone(), false)
        .map_err(|source| SetupError::Pool { which: "input", source })?;
    let pool_out = MappedPool::map(out_fd, POOL_OUT, geometry, true)
        .map_err(|source| SetupError::Pool { which: "output", source })?;
    let arena = args.arena.then(|| {
        let limit = usize::try_from(args.limits.address_space_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        ArenaView::with_read_past(if limit == 0 { ARENA_CACHE } else { ARENA_CACHE.min(limit / 4) }, args.read_past)
    });
    let own = startup::own_pid();
    let role = match args.mode {
        Job::Serve => sandbox::Role::Serving { own },
        Job::Zygote => sandbox::Role::Zygote { host: (!namespace).then_some(args.parent) },
    };
    first_steps.unwrap_or_else(sandbox::first_steps)?;
    sandbox::confine(&args.sandbox, role)?;
    let library = loader::Library::load(&args.extensions)?;
    // After loading: the limits hold the extensions' calls (and the zygote's incarnations inherit them), not the
    // dynamic linker's start-up.
    fault_handler::apply_limits(&args.limits).map_err(SetupError::Limits)?;
    Ok(Setup { region, pool_in, pool_out, arena, library, args })
}

/// Move this process into the domain's cgroup, one directory per hierarchy, and with `init_too` the init of its PID
/// namespace (pid 1 here). First, before the sandbox forbids writing files and before any extension code runs; the
/// zygote's forks inherit it.
fn join_cgroups(dirs: &[std::path::PathBuf], init_too: bool) -> Result<(), SetupError> {
    use std::io::Write;
    let own = std::process::id().to_string();
    let pids: &[&str] = if init_too { &[own.as_str(), "1"] } else { &[own.as_str()] };
    for dir in dirs {
        let procs = dir.join("cgroup.procs");
        for pid in pids {
            // One pid a write: the kernel moves one process (or thread group) for each.
            std::fs::OpenOptions::new()
                .write(true)
                .open(&procs)
                .and_then(|mut f| f.write_all(pid.as_bytes()))
                .map_err(|source| SetupError::Cgroup { procs: procs.clone(), source })?;
        }
    }
    Ok(())
}

/// Best effort: if the host is gone there is nobody to tell.
fn report_error(control: &ControlSocket, message: &str) {
    let mut text = format!("error {message}");
    ward_xpc::control::fit(&mut text);
    let _ = control.send(&text, None);
}
