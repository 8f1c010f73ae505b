//! `ward run`: an unmodified host with the preload shim, so that every plugin of a known class it opens runs under
//! ward (DESIGN.md §5, transparent mode).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use clap::Args;
use ward::{Isolation, Policy};

/// Name of the shim's shared object, built by the workspace beside the `ward` program.
const SHIM: &str = "libward_preload.so";

#[derive(Args)]
pub struct RunArgs {
    /// Isolation of the plugins the host opens: auto, mpk, process or none.
    #[arg(long, default_value = "auto")]
    isolation: String,
    /// Policy file (TOML); the defaults without one.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Also append the recovery events to this file.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Say which plugins are put under ward, one line each on standard error.
    #[arg(long, short)]
    verbose: bool,
    /// The host program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "HOST ARGS")]
    command: Vec<OsString>,
}

/// A mistake in what the user asked for (exit status 2).
#[derive(Debug)]
pub struct BadInput(pub String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

pub fn is_bad_input(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<BadInput>().is_some() || c.downcast_ref::<ward::policy::PolicyError>().is_some())
}

pub fn run(args: RunArgs) -> Result<bool> {
    let isolation: Isolation =
        args.isolation.parse().map_err(|e: ward::policy::UnknownKeyword| anyhow!(BadInput(e.to_string())))?;
    if isolation == Isolation::Mpk && !ward::mpk_available() {
        return Err(anyhow!(BadInput(
            "--isolation mpk: this machine has no memory protection keys (PKU); use auto (which then runs process \
             domains), process or none"
                .into()
        )));
    }
    // A policy that cannot work stops here, before the host starts: in the host, the shim would refuse every plugin.
    if let Some(path) = &args.policy {
        let policy = Policy::from_file(path)?;
        check_restart_files(path, &policy)?;
    }
    if let Some(log) = &args.log {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| anyhow!(BadInput(format!("cannot open the log file {}: {e}", log.display()))))?;
    }
    let (host, host_args) = args.command.split_first().ok_or_else(|| anyhow!(BadInput("no host program".into())))?;
    let host_path = find_in_path(Path::new(host)).ok_or_else(|| {
        anyhow!(BadInput(format!("no program {} (not a file, and not found in PATH)", Path::new(host).display())))
    })?;
    refuse_unpreloadable(&host_path)?;
    let shim = find_shim()?;
    let domain = ward::domain_program().context("cannot find the ward-domain program")?;

    let mut preload = shim.into_os_string();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let mut cmd = std::process::Command::new(&host_path);
    cmd.arg0(host).args(host_args);
    cmd.env("LD_PRELOAD", preload).env("WARD_DOMAIN", domain).env("WARD_ISOLATION", isolation.to_string());
    match &args.policy {
        Some(p) => cmd.env("WARD_POLICY", std::path::absolute(p).unwrap_or_else(|_| p.clone())),
        None => cmd.env_remove("WARD_POLICY"),
    };
    // Each `ward run` says once how the host's heap is served, in whichever of its processes comes first.
    cmd.env_remove("WARD_ARENA_SAID");
    if args.verbose {
        cmd.env("WARD_VERBOSE", "1");
    } else {
        cmd.env_remove("WARD_VERBOSE");
    }
    match &args.log {
        Some(p) => cmd.env("WARD_LOG", std::path::absolute(p).unwrap_or_else(|_| p.clone())),
        None => cmd.env_remove("WARD_LOG"),
    };
    // exec returns only on failure: the host's exit status is `ward run`'s.
    let e = cmd.exec();
    Err(anyhow!(e).context(format!("cannot run {}", host_path.display())))
}

/// Every `restart_from` of the policy at `path` must name a regular file: a restart from anything else fails, and
/// then the plugin with it.
fn check_restart_files(path: &Path, policy: &Policy) -> Result<()> {
    for (name, section) in &policy.extensions {
        let Some(from) = &section.restart_from else { continue };
        let problem = match std::fs::metadata(from) {
            Ok(meta) if meta.is_file() => continue,
            Ok(_) => "not a regular file".to_string(),
            Err(e) => e.to_string(),
        };
        return Err(anyhow!(BadInput(format!(
            "{}: [extension.{name}] restart_from names {}, which cannot be used ({problem})",
            path.display(),
            from.display()
        ))));
    }
    Ok(())
}

/// Hosts the dynamic linker will not preload the shim into, refused with the reason: a statically linked program,
/// position-dependent or static-PIE (no dynamic linker at all), and a set-user-ID or set-group-ID one (the linker
/// ignores `LD_PRELOAD` for it). A script is fine: its interpreter is what runs; so is the dynamic linker run as a
/// program (`ld.so PROGRAM`), which has no interpreter of its own but honours `LD_PRELOAD`.
fn refuse_unpreloadable(host: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(host).with_context(|| format!("cannot read {}", host.display()))?;
    if meta.permissions().mode() & 0o6000 != 0 {
        return Err(anyhow!(BadInput(format!(
            "{} is set-user-ID or set-group-ID: the dynamic linker ignores LD_PRELOAD for it, so ward cannot see \
             the plugins it opens",
            host.display()
        ))));
    }
    let file = std::fs::File::open(host).with_context(|| format!("cannot read {}", host.display()))?;
    let kind = match static_kind(&object::read::ReadCache::new(file)) {
        Some(kind) => kind,
        None => return Ok(()),
    };
    Err(anyhow!(BadInput(format!(
        "{} is {kind}: there is no dynamic linker to preload ward into (and it cannot load plugins with dlopen \
         anyway)",
        host.display()
    ))))
}

/// Program headers and dynamic sections larger than this are not a host's: such a file is left to the kernel.
const MAX_HEADER_BYTES: u64 = 1 << 20;

/// How a 64-bit ELF program is statically linked ("statically linked", "a static-PIE program"), or `None` when it
/// has a dynamic linker, is the dynamic linker, or is not a 64-bit ELF program at all. Reads the file header, the
/// program headers and the dynamic section, each bounded, never the whole file.
fn static_kind<'data, R: object::ReadRef<'data>>(data: R) -> Option<&'static str> {
    use object::elf::{DF_1_PIE, DT_FLAGS_1, ET_DYN, ET_EXEC, PT_DYNAMIC, PT_INTERP};
    use object::read::elf::{Dyn, FileHeader, ProgramHeader};
    let endian = object::LittleEndian;
    let header = object::elf::FileHeader64::<object::LittleEndian>::parse(data).ok()?;
    let table = u64::from(header.e_phnum.get(endian)) * u64::from(header.e_phentsize.get(endian));
    if table > MAX_HEADER_BYTES {
        return None;
    }
    let segments = header.program_headers(endian, data).ok()?;
    if segments.iter().any(|s| s.p_type(endian) == PT_INTERP) {
        return None;
    }
    match header.e_type.get(endian) {
        ET_EXEC => Some("statically linked"),
        // Without an interpreter an ET_DYN file is either a static-PIE program (DF_1_PIE) or a shared object run
        // directly, the dynamic linker itself among them.
        ET_DYN => {
            let dynamic = segments.iter().find(|s| s.p_type(endian) == PT_DYNAMIC)?;
            if dynamic.p_filesz(endian) > MAX_HEADER_BYTES {
                return None;
            }
            let entries = dynamic.dynamic(endian, data).ok()??;
            let pie = entries
                .iter()
                .any(|d| d.d_tag(endian) == u64::from(DT_FLAGS_1) && d.d_val(endian) & u64::from(DF_1_PIE) != 0);
            pie.then_some("a static-PIE program (statically linked)")
        }
        _ => None,
    }
}

/// `program` itself when it names a path, else the first match in PATH.
fn find_in_path(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|candidate| candidate.is_file())
}

/// The shim: `$WARD_PRELOAD`, else beside the running program, else one directory up.
fn find_shim() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("WARD_PRELOAD") {
        let p = PathBuf::from(p);
        return if p.is_file() { Ok(p) } else { Err(anyhow!("WARD_PRELOAD={} is not a file", p.display())) };
    }
    let exe = std::env::current_exe().context("cannot find the running program")?;
    let dirs: Vec<&Path> = exe.parent().into_iter().chain(exe.parent().and_then(Path::parent)).collect();
    dirs.iter().map(|d| d.join(SHIM)).find(|p| p.is_file()).ok_or_else(|| {
        anyhow!(
            "cannot find {SHIM} (looked in {}); build the whole workspace: cargo build --release --workspace",
            dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// `ward builtins`: the extracted built-in extensions.
pub fn builtins(dir_only: bool, lv2_dir_only: bool) -> Result<bool> {
    let dir = ward_extensions::extracted().context("cannot write out the built-in extensions")?;
    if dir_only {
        println!("{}", dir.display());
        return Ok(true);
    }
    let lv2 = ward_extensions::lv2_bundles().context("cannot write out the built-in LV2 bundles")?;
    if lv2_dir_only {
        println!("{}", lv2.display());
        return Ok(true);
    }
    for b in ward_extensions::ALL {
        println!("{:<14} {:<60} {}", b.name, dir.join(b.file_name).display(), b.description);
    }
    println!("LV2 bundles (for LV2_PATH): {}", lv2.display());
    Ok(true)
}
