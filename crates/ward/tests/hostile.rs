//! A process domain's sandbox against an extension that attacks the machine, not its caller (`extensions/hostile.c`,
//! issue 28): an exec, a loopback connection, a fork, a memfd, `PTRACE_TRACEME` are forbidden system calls, so the
//! call ends in a SIGSYS fault of that extension; a file under /tmp is refused (the filesystem is read-only to the
//! domain). Either way the test process is unaffected and the extension serves the next call. Without the sandbox
//! these attacks get through and the tests fail their assertions, harmlessly: the exec runs `exit 0`, the fork's
//! child exits at once, the memfd is closed again, the file is removed.
//!
//! The host's arena (its large heap blocks under `ward run`) is lent block by block: a domain holds descriptors only
//! of the blocks it was lent, read-only unless lent as an output, and cannot reopen one read-write.

mod common;

use std::io::ErrorKind;
use std::net::TcpListener;

use common::*;
use ward::{Arg, Error, FaultKind, Isolation, Policy, RetType, Supervisor, Value};
use ward_xpc::arena::host;

/// The attacks of hostile.c (the low 8 bits of its argument).
const EXEC: i64 = 1;
const CONNECT: i64 = 2;
const FORK: i64 = 3;
const MEMFD: i64 = 4;
const TMP_FILE: i64 = 5;
const TRACEME: i64 = 6;
const SIGNAL_0: i64 = 7;
const PROC_ENTRY: i64 = 8;
const PROC_SELF: i64 = 9;
const OVERWRITE_MEMFDS: i64 = 10;

/// A fault ends the call (no retry: the retried call would attack again), and the extension restarts on the next.
const POLICY: &str = r#"
[extension.hostile]
on_fault = "fail"
deadline_ms = 30000
max_restarts = 1000
restart_period_s = 1
backoff_initial_ms = 0.001
backoff_max_ms = 0.001
"#;

/// What one attack came to: the call's result and the faults reported while it ran.
struct Outcome {
    result: Result<i64, Error>,
    faults: Vec<ward::Fault>,
}

/// Calls `hostile_attack(code | arg << 8)` in a process domain of its own, then checks that the extension serves the
/// next call (attack 0, which hostile.c refuses with -EINVAL) and that nobody traces the test process.
fn attack(code: i64, arg: i64) -> Outcome {
    attack_under(POLICY, code, arg)
}

/// [`attack`] under `policy`.
fn attack_under(policy: &str, code: i64, arg: i64) -> Outcome {
    let policy = Policy::from_toml_str(policy, "hostile policy").expect("the policy parses");
    let sup = Supervisor::new(policy);
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("hostile"), Some(Isolation::Process)).expect("load hostile in a process domain");
    let result = ext
        .call("hostile_attack", &mut [Arg::I64(code | (arg << 8))], RetType::I64)
        .map(|v| v.as_i64().expect("an i64 result"));
    let faults = faults(&events);
    let next = ext.call("hostile_attack", &mut [Arg::I64(0)], RetType::I64).map(|v| v.as_i64());
    assert_eq!(next.ok(), Some(Some(-i64::from(libc::EINVAL))), "the extension serves the call after the attack");
    assert_eq!(tracer_of_this_process(), 0, "nobody traces the test process");
    Outcome { result, faults }
}

/// TracerPid of this process, from /proc/self/status.
fn tracer_of_this_process() -> i32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:")?.trim().parse().ok())
        .expect("a TracerPid line in /proc/self/status")
}

/// The attack ended in a SIGSYS fault of the hostile extension: the call failed with it, and it was reported.
fn assert_trapped(what: &str, outcome: &Outcome) {
    let sigsys = |kind: &FaultKind| matches!(kind, FaultKind::Signal { signo, .. } if *signo == libc::SIGSYS);
    match &outcome.result {
        Err(Error::Fault(f)) => {
            assert!(sigsys(&f.kind), "{what}: the call failed, but not of SIGSYS: {f}");
            assert_eq!(f.domain, "hostile", "{what}: {f}");
        }
        other => panic!("{what}: the call was no SIGSYS fault: {other:?} (0 means the attack got through)"),
    }
    assert!(
        outcome.faults.iter().any(|f| f.domain == "hostile" && sigsys(&f.kind)),
        "{what}: no SIGSYS fault event of hostile: {:?}",
        outcome.faults
    );
}

#[test]
fn exec_is_trapped() {
    assert_trapped("execve of /bin/sh", &attack(EXEC, 0));
}

#[test]
fn a_loopback_connection_is_trapped_and_nothing_arrives() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen on the loopback");
    let port = listener.local_addr().expect("the listener's address").port();
    let outcome = attack(CONNECT, i64::from(port));
    listener.set_nonblocking(true).expect("a non-blocking listener");
    let accepted = listener.accept();
    assert!(
        matches!(&accepted, Err(e) if e.kind() == ErrorKind::WouldBlock),
        "the listener got a connection: {accepted:?}"
    );
    assert_trapped("connect to the loopback", &outcome);
}

#[test]
fn fork_is_trapped() {
    assert_trapped("fork", &attack(FORK, 0));
}

#[test]
fn a_memfd_is_trapped() {
    assert_trapped("memfd_create", &attack(MEMFD, 0));
}

#[test]
fn ptrace_traceme_is_trapped() {
    assert_trapped("ptrace(PTRACE_TRACEME)", &attack(TRACEME, 0));
}

#[test]
fn a_file_under_tmp_is_refused() {
    // hostile.c creates /tmp/ward-hostile-ARG-lib; this process's id makes the name this test's own.
    let id = i64::from(std::process::id());
    let path = std::path::PathBuf::from(format!("/tmp/ward-hostile-{id}-lib"));
    let _ = std::fs::remove_file(&path);
    let outcome = attack(TMP_FILE, id);
    let created = path.exists();
    let _ = std::fs::remove_file(&path);
    assert!(!created, "{} was created", path.display());
    let refused = [libc::EACCES, libc::EPERM, libc::EROFS].map(|e| -i64::from(e));
    match &outcome.result {
        Ok(rc) => assert!(refused.contains(rc), "creating the file returned {rc}, not EACCES, EPERM or EROFS"),
        // A sandbox may trap the open as well.
        Err(_) => assert_trapped("creating a file under /tmp", &outcome),
    }
}

/// The domain's PID namespace: this process (its host) is not in the domain's `/proc`, whose `/proc/self` is the
/// domain itself.
#[test]
fn the_host_is_not_in_the_domains_proc_and_proc_self_is_the_domain() {
    if !pid_namespace_or_say("the_host_is_not_in_the_domains_proc_and_proc_self_is_the_domain") {
        return;
    }
    let host = i64::from(std::process::id());
    assert_eq!(attack(PROC_ENTRY, host).result.ok(), Some(-i64::from(libc::ENOENT)), "/proc/HOST in the domain");
    let own = attack(PROC_SELF, 0).result.ok();
    assert!(own.is_some_and(|pid| pid > 1), "/proc/self/stat gives the domain's own pid: {own:?}");
}

/// The PID namespace alone (the system call filter and Landlock off): the host cannot be signalled, its pid names
/// nothing in the domain.
#[test]
fn the_host_cannot_be_signalled_from_the_domains_pid_namespace() {
    if !pid_namespace_or_say("the_host_cannot_be_signalled_from_the_domains_pid_namespace") {
        return;
    }
    let policy = format!(
        "{POLICY}[extension.hostile.sandbox]\nseccomp = false\nlandlock = false\n\
         reason = \"the test: only the PID namespace stands between the extension and its host\"\n"
    );
    let host = i64::from(std::process::id());
    assert_eq!(attack_under(&policy, SIGNAL_0, host).result.ok(), Some(-i64::from(libc::ESRCH)));
}

/// A block of the host's arena filled with one byte, freed on drop.
struct ArenaBlock {
    ptr: *mut u8,
    len: usize,
}

impl ArenaBlock {
    fn new(len: usize, byte: u8) -> ArenaBlock {
        host::enable(1 << 30).expect("the arena");
        let ptr = host::alloc(len, 64).expect("an arena block");
        // SAFETY: the block is `len` writable bytes this test owns.
        unsafe { std::ptr::write_bytes(ptr, byte, len) };
        ArenaBlock { ptr, len }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the block is `len` bytes this test owns until drop; `&mut self` makes the slice the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn filled_with(&mut self, byte: u8) -> bool {
        self.bytes().iter().all(|&b| b == byte)
    }
}

impl Drop for ArenaBlock {
    fn drop(&mut self) {
        host::free(self.ptr);
    }
}

#[test]
fn a_domain_reaches_only_the_arena_blocks_it_was_lent_and_writes_only_those_lent_writable() {
    const LEN: usize = 2 << 20;
    // Before the domain starts: a domain gets arena blocks when the host has an arena.
    host::enable(1 << 30).expect("the arena");
    let policy = Policy::from_toml_str(POLICY, "hostile policy").expect("the policy parses");
    let sup = Supervisor::new(policy);
    let events = sup.subscribe();
    let ext = sup.load_with(builtin("hostile"), Some(Isolation::Process)).expect("load hostile in a process domain");
    let mut input = ArenaBlock::new(LEN, 0x11);
    let mut never_lent = ArenaBlock::new(LEN, 0x22);
    let mut output = ArenaBlock::new(LEN, 0x33);
    let scan = |buffer: Arg<'_>| match ext.call("hostile_arena", &mut [buffer, Arg::I64(LEN as i64)], RetType::I64) {
        Ok(Value::I64(found_and_overwritten)) => (found_and_overwritten / 256, found_and_overwritten % 256),
        other => panic!("hostile_arena: {other:?}"),
    };
    // Lent as an input: the domain holds that block alone, read-only.
    assert_eq!(scan(Arg::In(input.bytes())), (1, 0), "(blocks found, blocks overwritten) lent one input");
    // Lent an output as well: it holds both, and can write the output (lent writable), never the input.
    assert_eq!(scan(Arg::InOut(output.bytes())), (2, 1), "(blocks found, blocks overwritten) lent an output too");
    assert!(input.filled_with(0x11), "the input lent read-only changed");
    assert!(never_lent.filled_with(0x22), "a block never lent changed");
    assert!(output.bytes().starts_with(b"PWNED"), "the output lent writable is the domain's to write");
    assert_eq!(ext.stats().lent_in_place, 2, "both crossed in place");
    // Reopening a read-only descriptor read-write is refused: a SIGSYS fault of the extension.
    let result = ext
        .call("hostile_attack", &mut [Arg::I64(OVERWRITE_MEMFDS)], RetType::I64)
        .map(|v| v.as_i64().expect("an i64 result"));
    let outcome = Outcome { result, faults: faults(&events) };
    assert_trapped("reopening the arena and the input pool read-write", &outcome);
    assert!(input.filled_with(0x11), "the input lent read-only changed");
    assert!(never_lent.filled_with(0x22), "a block never lent changed");
}
