//! The command line the host library builds for `ward-domain`.
//!
//! `ward-domain --mode serve|zygote --parent PID --spin N [--as-mb N] [--cpu-s N] [--nofile N] [--arena]
//! [--no-seccomp] [--no-landlock] [--no-pid-namespace] [--allow network|exec|fork]... [--writable PATH]...
//! [--cgroup DIR]... (--ext PATH [--init SYMBOL] [--poison])...`
//!
//! `--parent` names the host process, which the domain must not outlive; `--arena` says the host may lend blocks of
//! its arena in place (their descriptors come on the control socket). The sandbox ([`crate::sandbox`]) is on unless a
//! `--no-*` flag turns a part of it off; `--allow` and `--writable` loosen it as the policy says. `--cgroup` names a
//! directory of the domain's cgroup (one per hierarchy) that the process joins before anything else.
//!
//! (`--mode template --parent PID` is the template's command line, read before this one: see [`crate::template`].)

use std::path::PathBuf;

use crate::error::ArgsError;
use crate::sandbox;

/// What this process was started to do (`--mode serve` or `--mode zygote`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Load, then serve calls until killed.
    Serve,
    /// Load, then fork a serving incarnation for every `fork` request.
    Zygote,
}

#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub address_space_mb: u64,
    pub cpu_s: u64,
    pub open_files: u64,
}

#[derive(Debug, Clone)]
pub struct ExtensionArg {
    pub path: PathBuf,
    pub init: Option<String>,
    /// Call its functions with poison in everything they are not given (`ward_abi::call_native_poisoned`).
    pub poison: bool,
}

#[derive(Debug, Clone)]
pub struct Args {
    pub mode: Job,
    /// The process that started this one: it dies with it.
    pub parent: i32,
    pub spin: u32,
    pub limits: Limits,
    pub extensions: Vec<ExtensionArg>,
    /// The host lends arena blocks in place.
    pub arena: bool,
    /// Bytes of zeros after every input (a multiple of the page): the pools' geometry and the arena's.
    pub read_past: usize,
    pub sandbox: sandbox::Config,
    /// Directories of the cgroup to join (`cgroup.procs` in each).
    pub cgroups: Vec<PathBuf>,
}

impl Args {
    pub fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, ArgsError> {
        let mut mode = None;
        let mut parent = None;
        let mut spin = 2000u32;
        let mut limits = Limits::default();
        let mut extensions: Vec<ExtensionArg> = Vec::new();
        let mut arena = false;
        let mut read_past = ward_xpc::layout::READ_PAST_INPUT;
        let mut sandbox = sandbox::Config::strict();
        let mut cgroups = Vec::new();
        while let Some(flag) = it.next() {
            let mut value = || it.next().ok_or_else(|| ArgsError::NeedsValue { flag: flag.clone() });
            match flag.as_str() {
                "--mode" => {
                    mode = Some(match value()?.as_str() {
                        "serve" => Job::Serve,
                        "zygote" => Job::Zygote,
                        other => return Err(ArgsError::UnknownMode { mode: other.to_string() }),
                    })
                }
                "--parent" => parent = Some(number(&flag, &value()?)?),
                "--spin" => spin = number(&flag, &value()?)?,
                "--as-mb" => limits.address_space_mb = number(&flag, &value()?)?,
                "--cpu-s" => limits.cpu_s = number(&flag, &value()?)?,
                "--nofile" => limits.open_files = number(&flag, &value()?)?,
                "--arena" => arena = true,
                "--read-past" => read_past = number(&flag, &value()?)?,
                "--no-seccomp" => sandbox.seccomp = false,
                "--no-landlock" => sandbox.landlock = false,
                "--no-pid-namespace" => sandbox.pid_namespace = false,
                "--allow" => match value()?.as_str() {
                    "network" => sandbox.loosen.network = true,
                    "exec" => sandbox.loosen.exec = true,
                    "fork" => sandbox.loosen.fork = true,
                    "writes" => sandbox.loosen.writes = true,
                    other => return Err(ArgsError::UnknownAllowance { what: other.to_string() }),
                },
                "--writable" => sandbox.writable.push(PathBuf::from(value()?)),
                "--cgroup" => cgroups.push(PathBuf::from(value()?)),
                "--ext" => extensions.push(ExtensionArg { path: PathBuf::from(value()?), init: None, poison: false }),
                "--poison" => {
                    let last = extensions.last_mut().ok_or(ArgsError::BeforeExtension { flag: "--poison" })?;
                    last.poison = true;
                }
                "--init" => {
                    let sym = value()?;
                    let last = extensions.last_mut().ok_or(ArgsError::BeforeExtension { flag: "--init" })?;
                    last.init = Some(sym);
                }
                other => return Err(ArgsError::UnknownArgument { arg: other.to_string() }),
            }
        }
        let mode = mode.ok_or(ArgsError::Missing { flag: "--mode" })?;
        let parent = parent.ok_or(ArgsError::Missing { flag: "--parent" })?;
        if extensions.is_empty() {
            return Err(ArgsError::NoExtension);
        }
        Ok(Args { mode, parent, spin, limits, extensions, arena, read_past, sandbox, cgroups })
    }
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, ArgsError> {
    text.parse().map_err(|_| ArgsError::NotANumber { flag: flag.to_string(), text: text.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, ArgsError> {
        Args::parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn parses_a_full_command_line() {
        let a = parse(
            "--mode zygote --parent 42 --spin 7 --as-mb 256 --nofile 64 --arena --ext /a.so --init a_init --ext /b.so \
             --poison",
        )
        .unwrap();
        assert!(a.arena);
        assert!(!parse("--mode serve --parent 1 --ext /a.so").unwrap().arena);
        assert_eq!(a.mode, Job::Zygote);
        assert_eq!(a.parent, 42);
        assert_eq!(a.spin, 7);
        assert_eq!(a.limits.address_space_mb, 256);
        assert_eq!(a.limits.open_files, 64);
        assert_eq!(a.extensions.len(), 2);
        assert_eq!(a.extensions[0].init.as_deref(), Some("a_init"));
        assert_eq!(a.extensions[1].init, None);
        assert_eq!((a.extensions[0].poison, a.extensions[1].poison), (false, true));
        assert_eq!(a.sandbox, sandbox::Config::strict(), "the sandbox is on unless turned off");
    }

    #[test]
    fn parses_sandbox_loosening() {
        let a =
            parse("--mode serve --parent 1 --no-landlock --allow network --allow fork --writable /var/x --ext /a.so")
                .unwrap();
        assert!(a.sandbox.seccomp && !a.sandbox.landlock);
        assert!(a.sandbox.loosen.network && a.sandbox.loosen.fork && !a.sandbox.loosen.exec);
        assert_eq!(a.sandbox.writable, vec![PathBuf::from("/var/x")]);
        let c = parse("--mode serve --parent 1 --cgroup /cg/memory/w --cgroup /cg/pids/w --ext /a.so").unwrap();
        assert_eq!(c.cgroups, [PathBuf::from("/cg/memory/w"), PathBuf::from("/cg/pids/w")]);
        assert!(parse("--mode serve --parent 1 --allow everything --ext /a.so").is_err());
        assert!(!parse("--mode serve --parent 1 --no-seccomp --ext /a.so").unwrap().sandbox.seccomp);
        assert!(!parse("--mode serve --parent 1 --no-pid-namespace --ext /a.so").unwrap().sandbox.pid_namespace);
    }

    #[test]
    fn refuses_bad_command_lines() {
        assert!(parse("--parent 1 --ext /a.so").is_err());
        assert!(parse("--mode serve --parent 1").is_err());
        assert!(parse("--mode serve --ext /a.so").is_err(), "the parent is required");
        assert!(parse("--mode serve --parent me --ext /a.so").is_err());
        assert!(parse("--mode other --parent 1 --ext /a.so").is_err());
        assert!(parse("--mode serve --parent 1 --init x --ext /a.so").is_err());
        assert!(parse("--mode serve --parent 1 --poison --ext /a.so").is_err());
        assert!(parse("--mode serve --parent 1 --spin many --ext /a.so").is_err());
    }
}
