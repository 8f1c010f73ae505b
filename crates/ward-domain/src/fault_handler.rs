//! Recording why this process dies, and the resource limits that make runaway extensions die.
//!
//! A fault in extension code kills the domain process; the host sees that through its pidfd. Before dying, the
//! handler installed here writes a [`FaultRecord`] (signal, code, faulting address, call in flight, and a hint: the
//! stack overflowed, or the address-space limit or the descriptor table was nearly exhausted) into the shared region
//! so the host can say *what* happened. The host treats the record as a hint: it comes from a process that just
//! failed.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use ward_xpc::layout::{fault_hint, FaultRecord};
use ward_xpc::Region;

use crate::args::Limits;

/// The id of the innermost call this process is executing (0 when idle). Read by the signal handler.
pub static CURRENT_CALL: AtomicU64 = AtomicU64::new(0);

static REGION: OnceLock<Region> = OnceLock::new();
/// Lowest address of the main thread's stack mapping; faults just below it are stack overflows.
static STACK_LOW: AtomicUsize = AtomicUsize::new(0);
/// Bytes the handler tries to reserve to learn whether the address-space limit was nearly reached (a 32nd of the
/// limit; 0: no limit, no check).
static AS_PROBE: AtomicUsize = AtomicUsize::new(0);

const FATAL_SIGNALS: [i32; 7] =
    [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGABRT, libc::SIGTRAP, libc::SIGSYS];
const ALT_STACK_SIZE: usize = 256 * 1024;
/// `si_code` of a SIGSEGV on a mapped page the access is not allowed to (the libc crate lacks it).
const SEGV_ACCERR: i32 = 2;

/// Find the main thread's stack ahead, in the template: each process forked from it has the same stack, and finding
/// it reads `/proc/self/maps`. [`install`] then finds it only in an exec'd domain.
pub fn find_main_stack() {
    STACK_LOW.store(main_stack_low(), Ordering::Relaxed);
}

pub fn install(region: Region) -> std::io::Result<()> {
    let _ = REGION.set(region);
    if STACK_LOW.load(Ordering::Relaxed) == 0 {
        find_main_stack();
    }
    // SAFETY: mapping fresh anonymous memory has no preconditions; the result is checked.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ALT_STACK_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let ss = libc::stack_t { ss_sp: stack, ss_flags: 0, ss_size: ALT_STACK_SIZE };
    // SAFETY: ss describes the mapping just made, which lives for the rest of the process.
    if unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    for sig in FATAL_SIGNALS {
        if !arm(sig) {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Install the recorder for `sig`, once (SA_RESETHAND: a second fault in the handler dies at once). Async-signal-safe.
fn arm(sig: i32) -> bool {
    // SAFETY: sigaction is plain data; we fill handler, flags and an empty mask before installing it.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = record_and_die as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0
    }
}

/// Async-signal-safe: atomics, volatile stores into the region, the probes' system calls, and raise.
extern "C" fn record_and_die(sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // Not a fault: the first write into a scratch input lent from the host's arena. It now has a private copy of
    // those pages; returning retries the write there (the handler is armed again, SA_RESETHAND having disarmed it).
    if sig == libc::SIGSEGV && code == SEGV_ACCERR && ward_xpc::arena::view::on_write_fault(addr) && arm(sig) {
        return;
    }
    // A system call the sandbox refused: the record carries its number instead of an address.
    let refused = (sig == libc::SIGSYS && code == SYS_SECCOMP).then(|| {
        // SAFETY: for SIGSYS with SYS_SECCOMP the kernel fills the `_sigsys` member of the siginfo union, whose
        // `_syscall` int lies at SIGSYS_SYSCALL_OFFSET; `info` is valid for the handler's duration.
        unsafe { std::ptr::read_unaligned((info as *const u8).add(SIGSYS_SYSCALL_OFFSET) as *const i32) }
    });
    if let Some(nr) = refused {
        say_refused(nr);
    }
    let addr = refused.map_or(addr, |nr| nr as usize);
    let low = STACK_LOW.load(Ordering::Relaxed);
    let near_stack_guard = low != 0 && addr < low + 64 * 1024 && addr + 1024 * 1024 >= low;
    let hint = if refused.is_some() {
        fault_hint::SYSCALL_REFUSED
    } else if sig == libc::SIGSEGV && near_stack_guard {
        fault_hint::STACK_OVERFLOW
    } else if address_space_exhausted() {
        fault_hint::MEMORY_EXHAUSTED
    } else if descriptors_exhausted() {
        fault_hint::DESCRIPTORS_EXHAUSTED
    } else {
        fault_hint::NONE
    };
    if let Some(region) = REGION.get() {
        region.write_fault_record(&FaultRecord {
            valid: 1,
            signo: sig,
            code,
            hint,
            addr: addr as u64,
            call_id: CURRENT_CALL.load(Ordering::Relaxed),
        });
    }
    // SA_RESETHAND restored the default action. A hardware fault re-executes the instruction and dies of it when
    // we return; a sent signal (abort, raise) must be raised again, and so must a refused system call, after which
    // the program would go on with ENOSYS.
    if code <= 0 || refused.is_some() {
        // SAFETY: raise is async-signal-safe and takes no pointers.
        unsafe { libc::raise(sig) };
    }
}

/// `si_code` of a SIGSYS raised by a seccomp filter.
const SYS_SECCOMP: i32 = 1;
/// Offset of `_sigsys._syscall` in x86-64's `siginfo_t`: signo, errno, code, padding (16 bytes), `_call_addr` (8).
const SIGSYS_SYSCALL_OFFSET: usize = 24;

/// "ward-domain: the sandbox refused system call N (NAME)" on standard error. Async-signal-safe: a stack buffer and
/// one write.
fn say_refused(nr: i32) {
    let mut line = [0u8; 128];
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        let n = bytes.len().min(line.len() - len);
        line[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
    };
    put(b"ward-domain: the sandbox refused system call ");
    let mut digits = [0u8; 12];
    let mut at = digits.len();
    let mut rest = nr.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    put(&digits[at..]);
    if let Some(name) = ward_xpc::layout::syscall_name(i64::from(nr)) {
        put(b" (");
        put(name.as_bytes());
        put(b")");
    }
    put(b"\n");
    // SAFETY: write is async-signal-safe; the buffer is valid for `len` bytes.
    unsafe { libc::write(2, line.as_ptr().cast(), len) };
}

/// Whether less than a 32nd of the address-space limit is left: an extension that dies then most likely died of
/// an allocation that failed (a null pointer from `malloc` used unchecked, an `abort` in `operator new`).
/// Async-signal-safe: one mmap and one munmap.
fn address_space_exhausted() -> bool {
    let probe = AS_PROBE.load(Ordering::Relaxed);
    if probe == 0 {
        return false;
    }
    // SAFETY: a fresh private anonymous mapping with no access at an address of the kernel's choosing touches no
    // existing memory; MAP_NORESERVE so only the address-space limit, not overcommit, can refuse it.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            probe,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return true;
    }
    // SAFETY: p is the mapping of `probe` bytes just made, used by nothing.
    unsafe { libc::munmap(p, probe) };
    false
}

/// Whether the descriptor table is full: an extension that dies then most likely died of an `open` or `socket` that
/// failed. Async-signal-safe: one eventfd and one close.
fn descriptors_exhausted() -> bool {
    // SAFETY: eventfd takes no pointers; the descriptor it may return is ours and closed at once.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::EMFILE);
    }
    // SAFETY: fd was just created here and nothing else knows it.
    unsafe { libc::close(fd) };
    false
}

fn main_stack_low() -> usize {
    // SAFETY: pthread_getattr_np fills attr for the calling thread; we destroy it after reading.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return 0;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 {
            return 0;
        }
        addr as usize
    }
}

/// Address space, CPU time and descriptor limits from policy (0 = leave as is).
pub fn apply_limits(limits: &Limits) -> std::io::Result<()> {
    let set = |resource, value: u64| -> std::io::Result<()> {
        if value == 0 {
            return Ok(());
        }
        let rl = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: rl is a valid rlimit; lowering our own limits needs no privilege.
        if unsafe { libc::setrlimit(resource, &rl) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    let address_space = limits.address_space_mb.saturating_mul(1024 * 1024);
    set(libc::RLIMIT_AS, address_space)?;
    AS_PROBE.store(usize::try_from(address_space / 32).unwrap_or(usize::MAX), Ordering::Relaxed);
    set(libc::RLIMIT_CPU, limits.cpu_s)?;
    set(libc::RLIMIT_NOFILE, limits.open_files)?;
    Ok(())
}
