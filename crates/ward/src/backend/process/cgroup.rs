//! A cgroup per process domain: memory (shared memory and memfd pages included), process and CPU limits that hold
//! for the zygote and every incarnation it forks together, where rlimits hold per process and miss shared memory.
//!
//! The rule: one group per domain, `ward-<host pid>-<n>`, created beneath the host's own cgroup in every hierarchy
//! used (so the host's own limits still bound its domains), before the domain's first process starts, and removed
//! when the domain ends, after every process left in it is killed. The domain's processes join it themselves, first
//! thing at start-up (`ward-domain --cgroup DIR`), before any extension code runs; forks inherit it.
//!
//! Why these choices:
//! - cgroup v2 where the unified hierarchy offers `memory` and `pids` and the host's group can pass them on to a
//!   child; v1 otherwise, one directory per controller hierarchy (`memory`, `pids`, `cpu`, `cpuacct`). A v2 group
//!   that holds processes cannot enable controllers for its children ("no internal processes"), so a host that was
//!   not given a delegated subtree of its own falls back to v1, or to rlimits.
//! - Swap is kept from stretching the limit (`memory.swap.max = 0`, v1 `memory.memsw.limit_in_bytes`): a domain
//!   over its limit is killed by the kernel's OOM killer instead of paging the machine.
//! - Plain file writes, nothing else: where they are refused (not root, no delegation) the caller says once which
//!   protection is missing ([`probe`]) and the domain runs with rlimits.
//! - A host that calls `exit` without dropping its domains (most hosts of `ward run`) removes their groups in an
//!   `atexit` handler; groups of hosts that could not (killed by a signal) are removed by the next host that
//!   creates a group ([`sweep`]).
//! - One group is made ahead (a thread of its own, `ward-cgroup`, makes the next each time one is taken), with the
//!   limits of the domain that took the last: making the directories and setting the limits is a group's cost, and
//!   a domain start no longer waits for it. The spare holds no process; a domain takes it only if it wants those
//!   limits, and otherwise makes its own as before (the next spare then gets its limits). A domain with a CPU quota
//!   (v1: a directory in the CPU hierarchies too) always makes its own. The spare is removed at exit with the rest.

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::policy::Limits;

/// CPU quota period (the kernel's default, 100 ms).
const CPU_PERIOD_US: u64 = 100_000;
/// How long removing a group may wait for the processes killed in it to be gone.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Prefix of every group ward creates.
const PREFIX: &str = "ward-";

/// Why a group could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CgroupError {
    /// No hierarchy offers the controllers, or the host's group cannot pass them on.
    #[error(transparent)]
    Unavailable(#[from] LayoutError),
    /// The group's directory is not the host's to create.
    #[error("cannot create {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: std::io::Error },
    /// Writing the group's files failed.
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Why this process has no hierarchy to make its domains' groups in. Found once and kept (hence `Arc`s).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum LayoutError {
    #[error("{file}: {source}")]
    Read { file: &'static str, source: Arc<std::io::Error> },
    #[error("no cgroup v2 hierarchy is mounted")]
    NoV2Hierarchy,
    #[error("not in a v2 group")]
    NotInV2Group,
    #[error("the host's v2 group is outside the mounted hierarchy")]
    V2GroupOutsideMount,
    #[error("the cgroup v2 group {} offers no memory and pids controllers", .0.display())]
    V2LacksControllers(PathBuf),
    /// The host's group holds processes and is not the root: the host was given no subtree.
    #[error("the host's cgroup v2 group cannot pass controllers to a child ({0})")]
    V2CannotDelegate(Arc<CgroupError>),
    /// Why v2 would not do, and v1 has no memory hierarchy either.
    #[error("{v2}; and no cgroup v1 memory hierarchy is mounted")]
    NoV1Memory { v2: Box<LayoutError> },
}

/// A controller a domain's group uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Controller {
    Memory,
    Pids,
    Cpu,
    Cpuacct,
}

impl Controller {
    const ALL: [Controller; 4] = [Controller::Memory, Controller::Pids, Controller::Cpu, Controller::Cpuacct];

    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
        }
    }
}

/// Where this process's groups are, per hierarchy.
#[derive(Debug, Clone)]
enum Layout {
    /// The unified hierarchy: the host's own group, whose children get these controllers.
    V2 { own: PathBuf, controllers: Vec<Controller> },
    /// One hierarchy per controller (several may share one): the host's own group in each.
    V1 { own: Vec<(Controller, PathBuf)> },
}

/// The cgroup of one domain; removed (its processes killed) when dropped.
#[derive(Debug)]
pub(crate) struct Cgroup {
    /// One directory per hierarchy, with the controllers it holds.
    dirs: Vec<(PathBuf, Vec<Controller>)>,
    v2: bool,
    memory_mb: u64,
    /// OOM kills the kernel had counted in the group when last asked.
    oom_kills_seen: u64,
}

impl Cgroup {
    /// A new group for one domain with the policy's limits. Err when this machine gives the host no group it can
    /// write (see [`probe`]).
    pub(crate) fn create(limits: &Limits) -> Result<Cgroup, CgroupError> {
        let layout = layout()?;
        sweep();
        if limits.cpu_percent > 0 {
            // A quota's group (v1: in the CPU hierarchies too) is made on the spot.
            return Cgroup::made_with(layout, limits);
        }
        // Making a group (a directory per hierarchy, its limits) is most of the cost: the group a domain without a
        // CPU quota takes was made ahead with the limits the last domain had, off the start path, and the next is
        // made ahead in its place.
        let key = SpareLimits::of(limits);
        let group = match take_spare(key) {
            Some(group) => group,
            None => Cgroup::made_with(layout, limits)?,
        };
        make_spare_later(key);
        Ok(group)
    }

    /// A group made now with `limits` set.
    fn made_with(layout: Layout, limits: &Limits) -> Result<Cgroup, CgroupError> {
        let mut group = Cgroup::make(layout, limits.cpu_percent > 0)?;
        group.memory_mb = limits.memory_mb;
        group.set_limits(limits)?;
        group.oom_kills_seen = group.oom_kills().unwrap_or(0);
        Ok(group)
    }

    /// A group without limits yet: a directory per hierarchy (the CPU ones only if `cpu_wanted`), removed at exit
    /// unless dropped before.
    fn make(layout: Layout, cpu_wanted: bool) -> Result<Cgroup, CgroupError> {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let name = format!("{PREFIX}{}-{}", std::process::id(), COUNT.fetch_add(1, Ordering::Relaxed));
        let mut group = Cgroup { dirs: Vec::new(), v2: false, memory_mb: 0, oom_kills_seen: 0 };
        match layout {
            Layout::V2 { own, controllers } => {
                if cpu_wanted && controllers.contains(&Controller::Cpu) {
                    write(&own.join("cgroup.subtree_control"), "+cpu")?;
                }
                let dir = own.join(&name);
                make_dir(&dir)?;
                group.v2 = true;
                group.dirs.push((dir, controllers));
            }
            Layout::V1 { own } => {
                // A group in the CPU hierarchy is a scheduling entity of its own: the host and its domain would be
                // scheduled as two groups, which costs every hand-over between them (sox under `ward run` took
                // 1.8x its native time against 1.5x). So a domain joins it only for a quota it needs.
                for (controller, parent) in own {
                    let cpu = matches!(controller, Controller::Cpu | Controller::Cpuacct);
                    if cpu && !cpu_wanted {
                        continue;
                    }
                    let dir = parent.join(&name);
                    if let Some((_, held)) = group.dirs.iter_mut().find(|(d, _)| *d == dir) {
                        held.push(controller);
                        continue;
                    }
                    make_dir(&dir)?;
                    group.dirs.push((dir, vec![controller]));
                }
            }
        }
        remove_at_exit(group.dirs().map(Path::to_path_buf));
        Ok(group)
    }

    /// The group's directories, one per hierarchy: the domain writes its process id into each `cgroup.procs`.
    pub(crate) fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|(d, _)| d.as_path())
    }

    /// The `ward-domain` flags that make it join this group.
    pub(crate) fn domain_args(&self) -> Vec<std::ffi::OsString> {
        self.dirs().flat_map(|d| ["--cgroup".into(), d.as_os_str().to_owned()]).collect()
    }

    fn dir_of(&self, controller: Controller) -> Option<&Path> {
        self.dirs.iter().find(|(_, held)| held.contains(&controller)).map(|(d, _)| d.as_path())
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        if let Some(dir) = self.dir_of(Controller::Memory) {
            if limits.memory_mb > 0 {
                let bytes = limits.memory_mb.saturating_mul(1 << 20).to_string();
                if self.v2 {
                    write(&dir.join("memory.max"), &bytes)?;
                    // Absent where the kernel has no swap accounting: there is then no swap to stretch it.
                    write_if_present(&dir.join("memory.swap.max"), "0")?;
                } else {
                    write(&dir.join("memory.limit_in_bytes"), &bytes)?;
                    write_if_present(&dir.join("memory.memsw.limit_in_bytes"), &bytes)?;
                }
            }
        }
        if let Some(dir) = self.dir_of(Controller::Pids) {
            if limits.pids > 0 {
                write(&dir.join("pids.max"), &limits.pids.to_string())?;
            }
        }
        if let Some(dir) = self.dir_of(Controller::Cpu) {
            if limits.cpu_percent > 0 {
                let quota = limits.cpu_percent.saturating_mul(CPU_PERIOD_US / 100);
                if self.v2 {
                    write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                } else {
                    write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                    write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// OOM kills the kernel has counted in the group (v2 `memory.events`, v1 `memory.oom_control`).
    fn oom_kills(&self) -> Option<u64> {
        let dir = self.dir_of(Controller::Memory)?;
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        let text = fs::read_to_string(dir.join(file)).ok()?;
        text.lines().find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
    }

    /// The memory limit in MiB if the kernel's OOM killer has killed a process of the group since the last time
    /// this was asked: a domain process that died of SIGKILL was most likely that one.
    pub(crate) fn oom_killed(&mut self) -> Option<u64> {
        let now = self.oom_kills()?;
        let seen = std::mem::replace(&mut self.oom_kills_seen, now);
        (now > seen).then_some(self.memory_mb)
    }

    /// Processes in the group, from every hierarchy.
    fn processes(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self.dirs().flat_map(procs_of).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if !self.processes().is_empty() {
            tracing::debug!(dirs = ?self.dirs, "killing what is left in a domain's cgroup");
        }
        for (dir, _) in std::mem::take(&mut self.dirs) {
            LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|d| *d != dir);
            if let Err(e) = remove(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a domain's cgroup");
            }
        }
    }
}

/// Groups of this process not yet removed.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The limits a group made ahead has: those of a domain without a CPU quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SpareLimits {
    memory_mb: u64,
    pids: u64,
}

impl SpareLimits {
    fn of(limits: &Limits) -> SpareLimits {
        SpareLimits { memory_mb: limits.memory_mb, pids: limits.pids }
    }

    fn limits(self) -> Limits {
        Limits { memory_mb: self.memory_mb, pids: self.pids, cpu_percent: 0, ..Limits::default() }
    }
}

/// A group made ahead for the next domain without a CPU quota (its limits set, no process in it), with the process
/// that made it (a fork of the host leaves it to that process) and its limits.
static SPARE: Mutex<Option<(u32, SpareLimits, Cgroup)>> = Mutex::new(None);

/// The group made ahead, if this process made one with these limits.
fn take_spare(limits: SpareLimits) -> Option<Cgroup> {
    // Not waited for: in a fork of the host made while the worker held it, it stays locked (the group is then made
    // on the spot).
    let mut spare = match SPARE.try_lock() {
        Ok(spare) => spare,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return None,
    };
    match spare.take() {
        Some((maker, made_for, group)) if maker == std::process::id() && made_for == limits => Some(group),
        // Another process's (this one is a fork of it; not ours to use, nor to remove), or other limits (the next
        // spare replaces it).
        other => {
            *spare = other;
            None
        }
    }
}

/// Make the next spare group with `limits`, unless there is one: on a thread of its own, started once per process,
/// so that no domain start waits for it.
fn make_spare_later(limits: SpareLimits) {
    static WORKER: Mutex<Option<(u32, std::sync::mpsc::Sender<SpareLimits>)>> = Mutex::new(None);
    let mut worker = WORKER.lock().unwrap_or_else(|e| e.into_inner());
    let own = std::process::id();
    if let Some((started_by, wake)) = worker.as_ref() {
        // A fork of the host has no such thread: its sends would go nowhere.
        if *started_by == own && wake.send(limits).is_ok() {
            return;
        }
    }
    let (wake, woken) = std::sync::mpsc::channel::<SpareLimits>();
    let started = std::thread::Builder::new().name("ward-cgroup".into()).spawn(move || {
        while let Ok(limits) = woken.recv() {
            make_spare(limits);
        }
    });
    match started {
        Ok(_) => {
            let _ = wake.send(limits);
            *worker = Some((own, wake));
        }
        // No spare then: each domain makes its group as it starts.
        Err(e) => tracing::debug!(error = %e, "cannot start the thread that makes cgroups ahead"),
    }
}

/// Make a spare group with `limits` unless there is one with them (a failure leaves none: the next domain makes its
/// own, and reports why). One with other limits is removed.
fn make_spare(limits: SpareLimits) {
    let Ok(layout) = layout() else { return };
    let own = std::process::id();
    let old = {
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        match spare.as_ref() {
            Some((maker, made_for, _)) if *maker == own && *made_for == limits => return,
            Some((maker, _, _)) if *maker != own => return,
            _ => spare.take(),
        }
    };
    // Removed here, off the start path and outside the lock.
    drop(old);
    if let Ok(group) = Cgroup::made_with(layout, &limits.limits()) {
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        if spare.is_none() {
            *spare = Some((own, limits, group));
        }
    }
}

/// Remember `dirs` for [`remove_live_at_exit`], registered with `atexit` once.
#[allow(unsafe_code)]
fn remove_at_exit(dirs: impl Iterator<Item = PathBuf>) {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).extend(dirs);
    REGISTERED.get_or_init(|| {
        // SAFETY: registers a function that takes no arguments and never unwinds (it only reads and writes files
        // and sends signals, and gives up on a lock another thread holds).
        if unsafe { libc::atexit(remove_live_at_exit) } != 0 {
            tracing::debug!("cannot register the removal of the domains' cgroups at exit");
        }
    });
}

/// At exit: remove the groups the host did not drop (killing their processes), so that a host that calls `exit`
/// leaves none behind.
extern "C" fn remove_live_at_exit() {
    // Another thread may hold the lock as the process exits: the next host's sweep removes what is left then.
    let Ok(mut live) = LIVE.try_lock() else { return };
    for dir in std::mem::take(&mut *live) {
        let _ = remove(&dir);
    }
}

/// Kill every process in `dir` and remove it, waiting (bounded) for the killed processes to be gone.
fn remove(dir: &Path) -> std::io::Result<()> {
    let give_up = Instant::now() + REMOVE_TIMEOUT;
    loop {
        // cgroup.kill (v2, Linux 5.14) kills the whole group at once, forks racing it included.
        let _ = write_if_present(&dir.join("cgroup.kill"), "1");
        for pid in procs_of(dir) {
            if let Ok(pidfd) = super::spawn::pidfd_open(pid) {
                super::spawn::kill(std::os::fd::AsFd::as_fd(&pidfd));
            }
        }
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            // Processes still dying (or being reaped): the kernel keeps the group until they are gone.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
}

fn procs_of(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn make_dir(dir: &Path) -> Result<(), CgroupError> {
    fs::create_dir(dir).map_err(|source| CgroupError::CreateDir { path: dir.to_owned(), source })
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    // One write(2) of the whole value: cgroup files take a value per write.
    let result = fs::OpenOptions::new().write(true).open(path).and_then(|mut f| f.write_all(value.as_bytes()));
    result.map_err(|source| CgroupError::Write { path: path.to_owned(), source })
}

fn write_if_present(path: &Path, value: &str) -> Result<(), CgroupError> {
    if path.exists() {
        write(path, value)
    } else {
        Ok(())
    }
}

/// Remove the groups of hosts that have ended (`ward-<pid>-<n>` whose pid is gone), killing what is left in them.
/// Once per process, at its first group; `ward run` calls it again after its host exits.
pub(crate) fn sweep() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(sweep_now);
}

/// [`sweep`], every time it is called.
pub(crate) fn sweep_now() {
    let Ok(layout) = layout() else { return };
    let parents: Vec<PathBuf> = match layout {
        Layout::V2 { own, .. } => vec![own],
        Layout::V1 { own } => own.into_iter().map(|(_, d)| d).collect(),
    };
    for parent in parents {
        let Ok(entries) = fs::read_dir(&parent) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(host) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)).and_then(|n| n.split('-').next())
            else {
                continue;
            };
            let Ok(host) = host.parse::<u32>() else { continue };
            if host != std::process::id() && !Path::new(&format!("/proc/{host}")).exists() {
                let _ = remove(&entry.path());
            }
        }
    }
}

/// Where this process's groups are, found once.
fn layout() -> Result<Layout, CgroupError> {
    static LAYOUT: OnceLock<Result<Layout, LayoutError>> = OnceLock::new();
    Ok(LAYOUT.get_or_init(find_layout).clone()?)
}

fn find_layout() -> Result<Layout, LayoutError> {
    let read =
        |file: &'static str| fs::read_to_string(file).map_err(|e| LayoutError::Read { file, source: Arc::new(e) });
    let mountinfo = read("/proc/self/mountinfo")?;
    let own = read("/proc/self/cgroup")?;
    let mounts = parse_mounts(&mountinfo);
    let memberships = parse_memberships(&own);
    let v2_why = match v2_layout(&mounts, &memberships) {
        Ok(layout) => return Ok(layout),
        Err(why) => why,
    };
    let mut found = Vec::new();
    for controller in Controller::ALL {
        let mount = mounts.iter().find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller.name()));
        let member = memberships.iter().find(|(names, _)| names.iter().any(|n| n == controller.name()));
        if let (Some(mount), Some((_, path))) = (mount, member) {
            if let Some(dir) = mount.dir_for(path) {
                found.push((controller, dir));
            }
        }
    }
    if !found.iter().any(|(c, _)| *c == Controller::Memory) {
        return Err(LayoutError::NoV1Memory { v2: Box::new(v2_why) });
    }
    Ok(Layout::V1 { own: found })
}

/// The unified hierarchy, if it offers memory and pids and lets the host's group pass them on.
fn v2_layout(mounts: &[Mount], memberships: &[(Vec<String>, String)]) -> Result<Layout, LayoutError> {
    let mount = mounts.iter().find(|m| m.v2).ok_or(LayoutError::NoV2Hierarchy)?;
    let path =
        memberships.iter().find(|(names, _)| names.is_empty()).map(|(_, p)| p).ok_or(LayoutError::NotInV2Group)?;
    let own = mount.dir_for(path).ok_or(LayoutError::V2GroupOutsideMount)?;
    let offered = fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
    let offered: Vec<&str> = offered.split_whitespace().collect();
    if !offered.contains(&"memory") || !offered.contains(&"pids") {
        return Err(LayoutError::V2LacksControllers(own));
    }
    let mut controllers = vec![Controller::Memory, Controller::Pids];
    // `cpu` is enabled for the children only when a domain asks for a quota (see `Cgroup::create`): with it a child
    // group is a scheduling entity of its own, which costs every hand-over between host and domain.
    if offered.contains(&"cpu") {
        controllers.push(Controller::Cpu);
    }
    // Refused (EBUSY) when the host's group holds processes and is not the root: the host was given no subtree.
    write(&own.join("cgroup.subtree_control"), "+memory +pids")
        .map_err(|e| LayoutError::V2CannotDelegate(Arc::new(e)))?;
    Ok(Layout::V2 { own, controllers })
}

#[derive(Debug)]
struct Mount {
    v2: bool,
    /// The hierarchy's directory that is mounted (`/` unless the mount shows a subtree).
    root: String,
    point: PathBuf,
    controllers: Vec<String>,
}

impl Mount {
    /// The directory of group `path` (as /proc/self/cgroup names it) under this mount.
    fn dir_for(&self, path: &str) -> Option<PathBuf> {
        let rest = if self.root == "/" { path } else { path.strip_prefix(self.root.as_str())? };
        Some(self.point.join(rest.trim_start_matches('/')))
    }
}

/// cgroup mounts of /proc/self/mountinfo: `ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER`.
fn parse_mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let (root, point, fstype, options) = (left.get(3)?, left.get(4)?, right.first()?, right.get(2)?);
            let v2 = match *fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            let controllers = if v2 { Vec::new() } else { options.split(',').map(str::to_string).collect() };
            Some(Mount { v2, root: unescape(root), point: PathBuf::from(unescape(point)), controllers })
        })
        .collect()
}

/// Octal escapes of mountinfo (`\040` for a space).
fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// /proc/self/cgroup: `ID:CONTROLLERS:PATH`, controllers empty for the unified hierarchy.
fn parse_memberships(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            let names = names.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect();
            Some((names, path.to_string()))
        })
        .collect()
}

/// What of the cgroup protections this machine cannot give the host, found once by making and removing a group:
/// one entry per controller missing (its name, and why), empty when all hold.
pub(crate) fn probe() -> &'static [(&'static str, String)] {
    static PROBED: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();
    PROBED.get_or_init(|| {
        // A quota, so that the probe's group joins the CPU hierarchy too (a domain does only when it has one).
        let limits = Limits { memory_mb: 0, pids: 0, cpu_percent: 100, ..Limits::default() };
        match Cgroup::create(&limits) {
            Ok(group) => {
                let missing = [Controller::Memory, Controller::Pids, Controller::Cpu]
                    .into_iter()
                    .filter(|c| group.dir_of(*c).is_none())
                    .map(|c| (c.name(), format!("no cgroup hierarchy offers the {} controller", c.name())))
                    .collect();
                drop(group);
                missing
            }
            Err(e) => vec![("cgroup", e.to_string())],
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 30 0:23 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
28 25 0:26 /outer /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
29 25 0:27 / /sys/fs/cgroup/with\\040space rw - cgroup cgroup rw,pids
";

    #[test]
    fn a_domain_without_a_cpu_quota_takes_the_group_made_ahead_with_its_limits() {
        if let Err(e) = layout() {
            eprintln!("NOT CHECKED: groups made ahead: this machine gives no cgroup ({e})");
            return;
        }
        let limits = Limits { memory_mb: 64, pids: 16, cpu_percent: 0, ..Limits::default() };
        let other = Limits { memory_mb: 32, ..limits.clone() };
        make_spare(SpareLimits::of(&limits));
        assert!(take_spare(SpareLimits::of(&other)).is_none(), "a group made ahead with other limits is not taken");
        let spare: Vec<PathBuf> = match SPARE.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some((_, _, group)) => group.dirs().map(Path::to_path_buf).collect(),
            None => panic!("no group was made ahead"),
        };
        let group = Cgroup::create(&limits).expect("a group");
        let dirs: Vec<PathBuf> = group.dirs().map(Path::to_path_buf).collect();
        assert_eq!(dirs, spare, "the domain's group is the one made ahead");
        let memory = group.dir_of(Controller::Memory).expect("a memory group");
        let file = if group.v2 { "memory.max" } else { "memory.limit_in_bytes" };
        let limit = fs::read_to_string(memory.join(file)).expect("the memory limit");
        assert_eq!(limit.trim(), (64u64 << 20).to_string(), "the policy's memory limit is set on it");
        assert_eq!(group.memory_mb, 64, "the limit it reports an OOM kill with");
        let pids = group.dir_of(Controller::Pids).expect("a pids group");
        assert_eq!(fs::read_to_string(pids.join("pids.max")).expect("the pids limit").trim(), "16");
        drop(group);
        assert!(dirs.iter().all(|d| !d.exists()), "the group is removed with the domain");
    }

    #[test]
    fn reads_cgroup_mounts_with_their_roots_and_controllers() {
        let mounts = parse_mounts(MOUNTINFO);
        assert_eq!(mounts.len(), 4, "{mounts:?}");
        assert!(mounts[0].v2);
        assert_eq!(mounts[1].controllers, ["rw", "cpu", "cpuacct"]);
        assert_eq!(mounts[2].dir_for("/outer/a/b"), Some(PathBuf::from("/sys/fs/cgroup/memory/a/b")));
        assert_eq!(mounts[2].dir_for("/elsewhere"), None, "a group outside the mounted subtree has no directory");
        assert_eq!(mounts[3].point, PathBuf::from("/sys/fs/cgroup/with space"));
        assert_eq!(mounts[1].dir_for("/"), Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")));
    }

    #[test]
    fn a_machine_without_a_usable_hierarchy_says_why_v2_and_v1_would_not_do() {
        let why = CgroupError::from(LayoutError::NoV1Memory { v2: Box::new(LayoutError::NotInV2Group) });
        assert_eq!(why.to_string(), "not in a v2 group; and no cgroup v1 memory hierarchy is mounted");
        let refused = CgroupError::Write {
            path: PathBuf::from("/sys/fs/cgroup/x/cgroup.subtree_control"),
            source: std::io::Error::from_raw_os_error(libc::EBUSY),
        };
        let why = LayoutError::V2CannotDelegate(Arc::new(refused)).to_string();
        assert!(
            why.starts_with(
                "the host's cgroup v2 group cannot pass controllers to a child (cannot write \
                 /sys/fs/cgroup/x/cgroup.subtree_control: "
            ),
            "{why}"
        );
    }

    #[test]
    fn reads_memberships_v1_and_v2() {
        let m = parse_memberships("4:memory:/a/b\n2:cpu,cpuacct:/\n0::/user.slice\n");
        assert_eq!(m[0], (vec!["memory".to_string()], "/a/b".to_string()));
        assert_eq!(m[1].0, ["cpu", "cpuacct"]);
        assert!(m[2].0.is_empty(), "the unified hierarchy names no controllers");
    }
}
