//! The sandbox of a process domain, as policy data, and what this machine can enforce of it.
//!
//! Every protection is on by default; a policy section `[defaults.sandbox]`, `[extension.NAME.sandbox]` or
//! `[group.NAME.sandbox]` can loosen it, and must then say why (`reason`):
//!
//! ```toml
//! [extension.netplugin.sandbox]
//! network = true                  # sockets and TCP (default false)
//! exec = false                    # run programs (default false)
//! fork = false                    # start child processes (default false)
//! writable = ["/var/cache/netplugin"]   # absolute paths it may write beneath (default none)
//! seccomp = true                  # the system call filter (default true)
//! landlock = true                 # the file, network and signal restrictions (default true)
//! pid_namespace = true            # a PID namespace of its own, with its own /proc (default true)
//! reason = "fetches its presets from a server"
//! ```
//!
//! The domain program applies it (`ward-domain`'s `sandbox` module, where each step is described); this side turns
//! the policy into the domain's command line and probes the kernel, so that a protection the machine lacks is said
//! once ([`missing`]) and shown by `ward check --sandbox`.

use std::ffi::OsString;
use std::sync::OnceLock;

// The sandbox's keys are written with every other key of the policy (`policy/keys.rs`).
pub use crate::policy::{SandboxOverride, SandboxPolicy};

impl SandboxPolicy {
    /// What this policy gives up against the default, in words ("network", "writes to /x", ...); empty when strict.
    pub fn loosened(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.seccomp {
            out.push("no system call filter".to_string());
        }
        if !self.landlock {
            out.push("no Landlock".to_string());
        }
        if !self.pid_namespace {
            out.push("no PID namespace".to_string());
        }
        if self.network {
            out.push("network".to_string());
        }
        if self.exec {
            out.push("running programs".to_string());
        }
        if self.fork {
            out.push("child processes".to_string());
        }
        for path in &self.writable {
            out.push(format!("writes beneath {}", path.display()));
        }
        out
    }

    /// The `ward-domain` flags for this sandbox.
    pub(crate) fn domain_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        if !self.seccomp {
            args.push("--no-seccomp".into());
        }
        if !self.landlock {
            args.push("--no-landlock".into());
        }
        if !self.pid_namespace {
            args.push("--no-pid-namespace".into());
        }
        for (on, what) in [(self.network, "network"), (self.exec, "exec"), (self.fork, "fork")] {
            if on {
                args.push("--allow".into());
                args.push(what.into());
            }
        }
        for path in &self.writable {
            args.push("--writable".into());
            args.push(path.as_os_str().to_owned());
        }
        args
    }
}

/// A protection of the sandbox this machine cannot give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The protection, as `ward check --sandbox` names it.
    pub protection: &'static str,
    /// Why it is missing, and what still holds.
    pub why: String,
}

/// The Landlock ABI version the kernel offers (0: none).
pub fn landlock_abi() -> u32 {
    // SAFETY: landlock_create_ruleset with a null attribute, size 0 and LANDLOCK_CREATE_RULESET_VERSION only
    // returns the ABI version (or fails); it reads no memory.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(version).unwrap_or(0)
}

const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;

/// The protections of the default sandbox this machine lacks, probed once per process.
pub fn missing() -> &'static [Missing] {
    static MISSING: OnceLock<Vec<Missing>> = OnceLock::new();
    MISSING.get_or_init(|| {
        let mut out = Vec::new();
        let abi = landlock_abi();
        if abi == 0 {
            out.push(Missing {
                protection: "landlock",
                why: "the kernel has no Landlock (or it is not enabled in the lsm= list): a domain can write files \
                      and reach the network through whatever the system call filter allows, and is not kept from \
                      signalling other processes of the user"
                    .into(),
            });
        } else {
            if abi < 4 {
                out.push(Missing {
                    protection: "landlock-network",
                    why: format!("Landlock ABI {abi} has no network rules (4 and later): sockets are still refused by the system call filter"),
                });
            }
            if abi < 6 {
                out.push(Missing {
                    protection: "landlock-scopes",
                    why: format!(
                        "Landlock ABI {abi} cannot scope signals (6 and later, Linux 6.12): the system call filter \
                         still limits a serving domain's signals to itself"
                    ),
                });
            }
        }
        if let Err(why) = pid_namespace_available() {
            out.push(Missing {
                protection: "pid-namespace",
                why: format!(
                    "{why}: a domain shares the host's PID namespace, so it sees the host's processes (the system \
                     call filter and Landlock still keep it from signalling or tracing them) and a process it forks \
                     where the policy allows that can outlive the host"
                ),
            });
        }
        for (controller, why) in crate::backend::process::cgroup::probe() {
            out.push(Missing {
                protection: match *controller {
                    "memory" => "cgroup-memory",
                    "pids" => "cgroup-pids",
                    "cpu" => "cgroup-cpu",
                    _ => "cgroup",
                },
                why: format!(
                    "{why}: a domain's memory is limited by its address space only (not the shared memory and memfd \
                     pages it touches), its processes and threads by nothing but the system call filter, its CPU by \
                     cpu_s; CPU used between calls is still a fault"
                ),
            });
        }
        if !seccomp_available() {
            out.push(Missing {
                protection: "seccomp",
                why: "the kernel has no seccomp filters: every system call is open to a domain".into(),
            });
        }
        // Read-only descriptors of shared memory are reopens through /proc/self/fd.
        if !std::path::Path::new("/proc/self/fd").is_dir() {
            out.push(Missing {
                protection: "shared-memory",
                why: "/proc is not mounted: a domain is given the input pool read-write, and the host's arena blocks \
                      are copied instead of lent"
                    .into(),
            });
        }
        out
    })
}

/// Why a domain cannot have a PID namespace of its own on this machine.
#[derive(Debug, thiserror::Error)]
enum NoPidNamespace {
    #[error("the kernel has no PID namespaces")]
    NotInKernel,
    #[error("PID namespaces are turned off (user.max_pid_namespaces = 0)")]
    TurnedOff,
    #[error("no CAP_SYS_ADMIN, and user namespaces are turned off (user.max_user_namespaces = 0)")]
    UserNamespacesOff,
    #[error(
        "no CAP_SYS_ADMIN, and unprivileged user namespaces are turned off (kernel.unprivileged_userns_clone = 0)"
    )]
    UnprivilegedUserNamespacesOff,
    #[error(
        "no CAP_SYS_ADMIN, and AppArmor restricts unprivileged user namespaces \
         (kernel.apparmor_restrict_unprivileged_userns = 1)"
    )]
    AppArmorRestricts,
}

/// Whether a domain can have a PID namespace of its own: the kernel has them, and either this process may create
/// one (CAP_SYS_ADMIN) or unprivileged user namespaces are open to it. Read from the kernel's settings rather than
/// tried, since trying means a fork of the host; a domain that finds otherwise says so when it starts.
fn pid_namespace_available() -> Result<(), NoPidNamespace> {
    let number = |path: &str| std::fs::read_to_string(path).ok().and_then(|t| t.trim().parse::<u64>().ok());
    if !std::path::Path::new("/proc/self/ns/pid").exists() {
        return Err(NoPidNamespace::NotInKernel);
    }
    if number("/proc/sys/user/max_pid_namespaces") == Some(0) {
        return Err(NoPidNamespace::TurnedOff);
    }
    if has_cap_sys_admin() {
        return Ok(());
    }
    if number("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Err(NoPidNamespace::UserNamespacesOff);
    }
    if number("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Err(NoPidNamespace::UnprivilegedUserNamespacesOff);
    }
    if number("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        return Err(NoPidNamespace::AppArmorRestricts);
    }
    Ok(())
}

/// Whether this process holds CAP_SYS_ADMIN (bit 21 of `CapEff` in `/proc/self/status`).
fn has_cap_sys_admin() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << CAP_SYS_ADMIN) != 0)
}

fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no pointers; it fails with EINVAL on kernels without seccomp.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SandboxOverride, String> {
        let section = format!("[defaults.sandbox]\n{text}\n");
        crate::policy::Policy::from_toml_str(&section, "test").map(|p| p.defaults.sandbox).map_err(|e| e.to_string())
    }

    #[test]
    fn strict_by_default() {
        let policy = SandboxPolicy::default();
        assert!(policy.seccomp && policy.landlock && policy.pid_namespace);
        assert!(!policy.network && !policy.exec && !policy.fork);
        assert!(policy.loosened().is_empty());
        assert!(policy.domain_args().is_empty(), "a strict sandbox needs no flags");
    }

    #[test]
    fn loosening_needs_a_reason() {
        let err = parse("network = true").unwrap_err();
        assert!(err.contains("reason"), "{err}");
        assert!(parse("seccomp = false").is_err());
        assert!(parse("pid_namespace = false").is_err());
        assert!(parse("writable = [\"/tmp/x\"]").is_err());
        // Tightening, or saying what is already so, needs none.
        assert!(parse("network = false\nseccomp = true").is_ok());
        let ok = parse("network = true\nreason = \"licence server\"").unwrap();
        assert_eq!(ok.network, Some(true));
        assert_eq!(ok.reason.as_deref(), Some("licence server"));
        assert!(parse("network = true\nreason = \"  \"").is_err(), "a blank reason is no reason");
    }

    #[test]
    fn writable_paths_are_absolute() {
        let err = parse("writable = [\"cache\"]\nreason = \"x\"").unwrap_err();
        assert!(err.contains("not absolute"), "{err}");
    }

    #[test]
    fn refusals_say_what_to_fix_in_the_words_the_cli_shows() {
        let err = parse("exec = true").unwrap_err();
        assert!(err.contains("this sandbox section loosens the sandbox: say why in `reason = \"...\"`"), "{err}");
        let err = parse("writable = [\"cache\"]\nreason = \"x\"").unwrap_err();
        assert!(err.contains("writable path `cache` is not absolute"), "{err}");
        assert_eq!(
            NoPidNamespace::AppArmorRestricts.to_string(),
            "no CAP_SYS_ADMIN, and AppArmor restricts unprivileged user namespaces \
             (kernel.apparmor_restrict_unprivileged_userns = 1)"
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(parse("netwrok = true").is_err());
    }

    #[test]
    fn overrides_apply_and_become_flags() {
        let mut policy = SandboxPolicy::default();
        parse("network = true\nfork = true\nwritable = [\"/var/x\"]\nlandlock = false\nreason = \"r\"")
            .unwrap()
            .apply(&mut policy);
        assert!(policy.network && policy.fork && !policy.exec && !policy.landlock);
        let args: Vec<String> = policy.domain_args().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["--no-landlock", "--allow", "network", "--allow", "fork", "--writable", "/var/x"]);
        assert_eq!(policy.loosened().len(), 4);
    }

    #[test]
    fn the_pid_namespace_can_be_turned_off_with_a_reason() {
        let mut policy = SandboxPolicy::default();
        parse("pid_namespace = false\nreason = \"reads other processes' /proc entries\"").unwrap().apply(&mut policy);
        assert!(!policy.pid_namespace);
        assert_eq!(policy.loosened(), ["no PID namespace"]);
        let args: Vec<String> = policy.domain_args().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["--no-pid-namespace"]);
    }

    #[test]
    fn as_root_here_a_pid_namespace_is_not_missing() {
        if !has_cap_sys_admin() {
            eprintln!(
                "SKIPPED as_root_here_a_pid_namespace_is_not_missing: no CAP_SYS_ADMIN here, so whether the namespace is \
                 missing depends on the machine's user-namespace settings"
            );
            return;
        }
        assert!(missing().iter().all(|m| m.protection != "pid-namespace"), "{:?}", missing());
    }
}
