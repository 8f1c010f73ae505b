//! The system calls a domain may make, as data: one entry per call, with the condition on its arguments and who
//! needs it. Everything not listed is refused with `SIGSYS`, which the fault recorder reports to the host as a fault
//! of the domain ("system call N refused by the sandbox").
//!
//! The list was built from what `ward-domain` itself calls and from tracing every LADSPA and frei0r plugin Debian
//! packages under `ward corpus` (`strace -f`): C runtime start-up, `dlopen`, `malloc`, threads, time, reading
//! files. Three roles differ (see [`Role`]): the zygote forks and watches its incarnations; a serving process never
//! forks and signals only itself. Loosening ([`Loosen`]) adds network, program execution, child processes or file
//! writes back, per extension, from the policy.

#[cfg(test)]
use seccompiler::{BackendError, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition, SeccompRule};

/// Which process the filter is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The zygote: forks incarnations (and trial loads), watches them through pidfds and kills them. Plugin
    /// constructors run here too, before the first fork. `host`: the host's pid where the zygote shares the host's
    /// PID namespace; None in a namespace of its own, where no pid names a process outside it.
    Zygote { host: Option<i32> },
    /// A process that serves calls (serve mode, or an incarnation forked from the zygote): `own` is its pid.
    Serving { own: i32 },
}

/// What the policy gives back, per extension (`[extension.NAME.sandbox]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Loosen {
    /// Sockets of any kind (`network = true`).
    pub network: bool,
    /// `execve` (`exec = true`).
    pub exec: bool,
    /// Child processes (`fork = true`).
    pub fork: bool,
    /// Opening files for writing (`writable = [...]`; Landlock then limits where).
    pub writes: bool,
}

/// A condition on one argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arg {
    /// The argument's low 32 bits equal the value.
    Is(u8, u64),
    /// The argument's low 32 bits differ from the value.
    IsNot(u8, u64),
    /// The argument's bits under the mask are all clear.
    Clear(u8, u64),
    /// The argument's bits under the mask are all set.
    Set(u8, u64),
    /// The argument, as a 32-bit signed number, is not negative.
    NotNegative(u8),
}

/// `when` lists alternatives (any may match); each alternative is a list of conditions (all must hold); an empty
/// `when` allows the call whatever its arguments.
pub(super) struct Allowed {
    pub(super) nr: i64,
    pub(super) when: Vec<Vec<Arg>>,
}

fn always(nr: i64) -> Allowed {
    Allowed { nr, when: Vec::new() }
}

fn when(nr: i64, alternatives: Vec<Vec<Arg>>) -> Allowed {
    Allowed { nr, when: alternatives }
}

/// Opening for writing, creating or truncating: refused unless the policy allows writes (Landlock still limits
/// where). `O_TMPFILE` needs `O_WRONLY` or `O_RDWR`, so it is refused with them.
const WRITE_FLAGS: u64 = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_APPEND) as u64;
/// `madvise` advice that reaches the file behind a shared mapping (punching a hole in the host's pool or arena) or
/// poisons pages.
const MADV_REFUSED: [u64; 3] = [libc::MADV_REMOVE as u64, libc::MADV_HWPOISON as u64, 101 /* MADV_SOFT_OFFLINE */];
/// Terminal ioctls that type into, or drive, the terminal the host's standard error may be on.
const IOCTL_REFUSED: [u64; 2] = [libc::TIOCSTI, libc::TIOCLINUX];
/// `fcntl` commands: descriptor flags, status flags, duplication and locks. Not `F_SETOWN`/`F_SETSIG` (signals to
/// another process), leases, notifications or seals.
const FCNTL_ALLOWED: [u64; 15] = [
    libc::F_DUPFD as u64,
    libc::F_GETFD as u64,
    libc::F_SETFD as u64,
    libc::F_GETFL as u64,
    libc::F_SETFL as u64,
    libc::F_GETLK as u64,
    libc::F_SETLK as u64,
    libc::F_SETLKW as u64,
    libc::F_DUPFD_CLOEXEC as u64,
    libc::F_OFD_GETLK as u64,
    libc::F_OFD_SETLK as u64,
    libc::F_OFD_SETLKW as u64,
    libc::F_GET_SEALS as u64,
    libc::F_GETPIPE_SZ as u64,
    libc::F_GETOWN as u64,
];

/// The allow-list for `role` with `loosen` applied.
pub(super) fn allowed(role: Role, loosen: Loosen) -> Vec<Allowed> {
    use libc::*;
    let mut list = vec![
        // Reading and writing descriptors it holds: the control socket, the pools, files it opened, stderr.
        always(SYS_read),
        always(SYS_write),
        always(SYS_readv),
        always(SYS_writev),
        // pread64 also reads the run queue, for the waits for requests (ward_xpc::runqueue).
        always(SYS_pread64),
        // The arena view writes back the edges of a range lent writable (ward_xpc::arena::view), through the
        // read-write descriptor of a block lent as an output; a read-only one refuses it (EBADF).
        always(SYS_pwrite64),
        always(SYS_preadv),
        always(SYS_preadv2),
        always(SYS_close),
        always(SYS_close_range),
        always(SYS_lseek),
        always(SYS_dup),
        always(SYS_dup2),
        always(SYS_dup3),
        always(SYS_pipe),
        always(SYS_pipe2),
        // Control socket messages (ward_xpc::control), and the descriptors of arena blocks the host lends on it
        // (recvmsg); sockets of its own need `network`.
        always(SYS_sendmsg),
        always(SYS_recvmsg),
        always(SYS_sendto),
        always(SYS_recvfrom),
        always(SYS_shutdown),
        // Looking at files: dlopen, fopen of plugin data, stdio's isatty.
        always(SYS_fstat),
        always(SYS_stat),
        always(SYS_lstat),
        always(SYS_newfstatat),
        always(SYS_statx),
        always(SYS_statfs),
        always(SYS_fstatfs),
        always(SYS_access),
        always(SYS_faccessat),
        always(SYS_faccessat2),
        always(SYS_readlink),
        always(SYS_readlinkat),
        always(SYS_getdents64),
        always(SYS_getcwd),
        always(SYS_chdir),
        always(SYS_fchdir),
        always(SYS_fadvise64),
        always(SYS_readahead),
        always(SYS_flock),
        always(SYS_fsync),
        always(SYS_fdatasync),
        always(SYS_umask),
        // Memory: malloc, dlopen, thread stacks, pools, arena windows, guard regions.
        always(SYS_brk),
        always(SYS_mmap),
        always(SYS_munmap),
        always(SYS_mremap),
        always(SYS_mprotect),
        always(SYS_msync),
        always(SYS_mincore),
        always(SYS_mlock),
        always(SYS_mlock2),
        always(SYS_munlock),
        always(SYS_membarrier),
        always(SYS_get_mempolicy),
        when(SYS_madvise, vec![MADV_REFUSED.iter().map(|&a| Arg::IsNot(2, a)).collect()]),
        // Signals of its own: the fault recorder, its alternate stack, Rust's and glibc's start-up.
        always(SYS_rt_sigaction),
        always(SYS_rt_sigprocmask),
        always(SYS_rt_sigreturn),
        always(SYS_rt_sigpending),
        always(SYS_rt_sigtimedwait),
        always(SYS_rt_sigsuspend),
        always(SYS_pause),
        always(SYS_sigaltstack),
        // Threads and waiting: pthreads, the serving loop's futexes and yields, glibc's rseq.
        always(SYS_futex),
        always(SYS_set_robust_list),
        always(SYS_get_robust_list),
        always(SYS_set_tid_address),
        always(SYS_rseq),
        always(SYS_arch_prctl),
        always(SYS_sched_yield),
        always(SYS_sched_getaffinity),
        always(SYS_sched_getparam),
        always(SYS_sched_getscheduler),
        always(SYS_sched_get_priority_max),
        always(SYS_sched_get_priority_min),
        always(SYS_getcpu),
        always(SYS_getpriority),
        // Its own scheduling only (a domain must not pin or slow down the host).
        when(SYS_sched_setaffinity, vec![vec![Arg::Is(0, 0)]]),
        when(SYS_sched_setscheduler, vec![vec![Arg::Is(0, 0)]]),
        when(SYS_sched_setparam, vec![vec![Arg::Is(0, 0)]]),
        when(SYS_setpriority, vec![vec![Arg::Is(1, 0)]]),
        always(SYS_poll),
        always(SYS_ppoll),
        always(SYS_select),
        always(SYS_pselect6),
        always(SYS_epoll_create1),
        always(SYS_epoll_ctl),
        always(SYS_epoll_wait),
        always(SYS_epoll_pwait),
        // The fault recorder's probe for a full descriptor table.
        always(SYS_eventfd2),
        always(SYS_timerfd_create),
        always(SYS_timerfd_settime),
        always(SYS_timerfd_gettime),
        // Time.
        always(SYS_clock_gettime),
        always(SYS_clock_getres),
        always(SYS_clock_nanosleep),
        always(SYS_nanosleep),
        always(SYS_gettimeofday),
        always(SYS_time),
        always(SYS_getitimer),
        always(SYS_setitimer),
        always(SYS_alarm),
        always(SYS_times),
        always(SYS_getrusage),
        // Who it is, and its own limits (`prlimit64` on itself only: another process's limits are the host's).
        always(SYS_getpid),
        always(SYS_gettid),
        always(SYS_getppid),
        always(SYS_getuid),
        always(SYS_geteuid),
        always(SYS_getgid),
        always(SYS_getegid),
        always(SYS_getgroups),
        always(SYS_getresuid),
        always(SYS_getresgid),
        always(SYS_getpgrp),
        always(SYS_getpgid),
        always(SYS_getsid),
        always(SYS_capget),
        always(SYS_uname),
        always(SYS_sysinfo),
        always(SYS_getrandom),
        always(SYS_getrlimit),
        always(SYS_setrlimit),
        when(SYS_prlimit64, vec![vec![Arg::Is(0, 0)]]),
        // Thread names (Rust's std), PR_SET_PDEATHSIG after a fork; every prctl that reaches outside the process
        // needs a capability, and the domain holds none.
        always(SYS_prctl),
        when(SYS_ioctl, vec![IOCTL_REFUSED.iter().map(|&r| Arg::IsNot(1, r)).collect()]),
        when(SYS_fcntl, FCNTL_ALLOWED.iter().map(|&c| vec![Arg::Is(1, c)]).collect()),
        // Ending: exit, exit_group; waiting for its own children (none unless the zygote or `fork`).
        always(SYS_exit),
        always(SYS_exit_group),
        always(SYS_restart_syscall),
        always(SYS_wait4),
        always(SYS_waitid),
        // Answered ENOSYS by the second filter ([`NOT_IMPLEMENTED`]); allowed here so that answer wins.
        always(SYS_clone3),
        always(SYS_openat2),
    ];
    let opens_for_writing = if loosen.writes { Vec::new() } else { vec![vec![Arg::Clear(1, WRITE_FLAGS)]] };
    let openat_for_writing = if loosen.writes { Vec::new() } else { vec![vec![Arg::Clear(2, WRITE_FLAGS)]] };
    list.push(when(SYS_open, opens_for_writing));
    list.push(when(SYS_openat, openat_for_writing));
    if loosen.writes {
        for nr in [
            SYS_creat,
            SYS_ftruncate,
            SYS_truncate,
            SYS_fallocate,
            SYS_unlink,
            SYS_unlinkat,
            SYS_rename,
            SYS_renameat,
            SYS_renameat2,
            SYS_mkdir,
            SYS_mkdirat,
            SYS_rmdir,
            SYS_fchmod,
            SYS_utimensat,
        ] {
            list.push(always(nr));
        }
    }
    if loosen.network {
        for nr in [
            SYS_socket,
            SYS_socketpair,
            SYS_connect,
            SYS_bind,
            SYS_listen,
            SYS_accept,
            SYS_accept4,
            SYS_getsockname,
            SYS_getpeername,
            SYS_setsockopt,
            SYS_getsockopt,
            SYS_sendmmsg,
            SYS_recvmmsg,
        ] {
            list.push(always(nr));
        }
    }
    if loosen.exec {
        list.push(always(SYS_execve));
        list.push(always(SYS_execveat));
    }
    match role {
        Role::Zygote { host } => {
            // Forking incarnations and trial loads (glibc's fork is `clone` without CLONE_THREAD), watching and
            // killing them. Never a signal to a process group (0 is its own, negative numbers name one) or to every
            // process (-1), nor to the host where it shares the host's PID namespace. In a namespace of its own
            // every other pid names a process of the namespace (its incarnations) but 1, its init, which ignores
            // them anyway.
            list.push(always(SYS_clone));
            list.push(always(SYS_pidfd_open));
            // An incarnation stacks the serving filter on this one after the fork (a filter can only narrow).
            list.push(always(SYS_seccomp));
            let outside = host.map_or(1, |host| host as u64);
            let not_host = |nr| when(nr, vec![vec![Arg::NotNegative(0), Arg::IsNot(0, 0), Arg::IsNot(0, outside)]]);
            list.push(not_host(SYS_kill));
            list.push(not_host(SYS_tgkill));
        }
        Role::Serving { own } => {
            // Threads only, unless the policy allows child processes.
            if loosen.fork {
                list.push(always(SYS_clone));
            } else {
                list.push(when(SYS_clone, vec![vec![Arg::Set(0, libc::CLONE_THREAD as u64)]]));
            }
            // Signals to itself only: raise, abort, the fault recorder's re-raise.
            list.push(when(SYS_kill, vec![vec![Arg::Is(0, own as u64)]]));
            list.push(when(SYS_tgkill, vec![vec![Arg::Is(0, own as u64)]]));
        }
    }
    list
}

/// A rule of the allow-list seccompiler would not take.
#[cfg(test)]
#[derive(Debug, thiserror::Error)]
#[error("system call {nr}: {source}")]
pub struct RuleError {
    nr: i64,
    source: BackendError,
}

/// The allow-list as seccompiler rules (the filter is compiled by `bpf`; the tests compare the two).
#[cfg(test)]
pub fn rules(role: Role, loosen: Loosen) -> Result<std::collections::BTreeMap<i64, Vec<SeccompRule>>, RuleError> {
    let mut map = std::collections::BTreeMap::new();
    for entry in allowed(role, loosen) {
        let mut rules = Vec::new();
        for alternative in &entry.when {
            let rule_error = |source| RuleError { nr: entry.nr, source };
            let conditions = alternative.iter().map(|arg| condition(*arg)).collect::<Result<Vec<_>, _>>();
            rules.push(SeccompRule::new(conditions.map_err(rule_error)?).map_err(rule_error)?);
        }
        map.insert(entry.nr, rules);
    }
    Ok(map)
}

#[cfg(test)]
fn condition(arg: Arg) -> Result<SeccompCondition, BackendError> {
    let (index, op, value) = match arg {
        Arg::Is(i, v) => (i, Op::Eq, v),
        Arg::IsNot(i, v) => (i, Op::Ne, v),
        Arg::Clear(i, mask) => (i, Op::MaskedEq(mask), 0),
        Arg::Set(i, mask) => (i, Op::MaskedEq(mask), mask),
        Arg::NotNegative(i) => (i, Op::MaskedEq(0x8000_0000), 0),
    };
    SeccompCondition::new(index, Len::Dword, op, value)
}

/// System calls answered with `ENOSYS` instead of a fault, so that the C library falls back to one the list
/// checks: `clone3` (its flags are behind a pointer; glibc then uses `clone`) and `openat2` (likewise).
pub const NOT_IMPLEMENTED: [i64; 2] = [libc::SYS_clone3, libc::SYS_openat2];

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed_numbers(role: Role, loosen: Loosen) -> Vec<i64> {
        allowed(role, loosen).iter().map(|a| a.nr).collect()
    }

    #[test]
    fn the_dangerous_calls_are_not_on_any_list() {
        let strict = Loosen::default();
        for role in [Role::Zygote { host: Some(100) }, Role::Zygote { host: None }, Role::Serving { own: 200 }] {
            let list = allowed_numbers(role, strict);
            for nr in [
                libc::SYS_ptrace,
                libc::SYS_process_vm_readv,
                libc::SYS_process_vm_writev,
                libc::SYS_pidfd_getfd,
                libc::SYS_pidfd_send_signal,
                libc::SYS_execve,
                libc::SYS_execveat,
                libc::SYS_socket,
                libc::SYS_memfd_create,
                libc::SYS_mount,
                libc::SYS_unshare,
                libc::SYS_setns,
                libc::SYS_bpf,
                libc::SYS_io_uring_setup,
                libc::SYS_ftruncate,
                libc::SYS_fork,
                libc::SYS_vfork,
                libc::SYS_tkill,
                libc::SYS_shmget,
            ] {
                assert!(!list.contains(&nr), "{role:?} allows system call {nr}");
            }
        }
        assert!(!allowed_numbers(Role::Serving { own: 1 }, strict).contains(&libc::SYS_pidfd_open));
    }

    #[test]
    fn loosening_gives_back_what_it_names() {
        let serving = Role::Serving { own: 7 };
        let all = Loosen { network: true, exec: true, fork: true, writes: true };
        let list = allowed_numbers(serving, all);
        for nr in [libc::SYS_socket, libc::SYS_connect, libc::SYS_execve, libc::SYS_ftruncate, libc::SYS_unlink] {
            assert!(list.contains(&nr), "loosened list lacks {nr}");
        }
        assert!(!list.contains(&libc::SYS_ptrace), "no loosening gives ptrace back");
    }

    #[test]
    fn every_list_compiles_to_a_filter() {
        for role in [Role::Zygote { host: Some(100) }, Role::Zygote { host: None }, Role::Serving { own: 200 }] {
            for loosen in [Loosen::default(), Loosen { network: true, exec: true, fork: true, writes: true }] {
                let rules = rules(role, loosen).expect("rules");
                let filter = seccompiler::SeccompFilter::new(
                    rules,
                    seccompiler::SeccompAction::Trap,
                    seccompiler::SeccompAction::Allow,
                    seccompiler::TargetArch::x86_64,
                )
                .expect("a valid filter");
                let program: seccompiler::BpfProgram = filter.try_into().expect("compiles");
                assert!(!program.is_empty());
            }
        }
    }
}
