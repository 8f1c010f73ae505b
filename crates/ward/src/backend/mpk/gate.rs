//! The gate: calling a function inside an mpk domain on the host's own thread, and getting the thread back when
//! that function faults.
//!
//! # Entering and leaving
//!
//! [`call`] fills a [`GateFrame`] (the function, its register arguments, the domain's PKRU and stack) and runs the
//! assembly below: it saves the host's callee-saved registers and stack pointer in the frame, records the host's
//! PKRU (RDPKRU), switches to the domain's stack, writes the domain's PKRU, loads the argument registers and calls.
//! On return it writes the host's PKRU back, stores `rax` and `xmm0` and returns to the host's stack. While the
//! domain's PKRU is in force the function can read host memory but not write it (Nooks' rule), and memory of keys
//! its PKRU does not name (other domains) is out of reach altogether.
//!
//! # Faults
//!
//! The frame in use is this thread's activation, kept in a thread-local pointer; [`call`] puts back the one it
//! replaced when it returns (calls nest: host → domain → host → domain). A SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGTRAP raised by the
//! processor while a thread has an activation is that domain's: the handler records the signal, its code, the
//! faulting address and the program counter in the frame, points the interrupted context at the gate's resume
//! path (with `rbx` = the frame) and returns. Returning from the handler restores the domain's PKRU from the signal
//! frame, so the resume path writes the host's PKRU first, then takes the host's stack pointer from the frame and
//! returns from the gate with status 1: no host frame is skipped, none is unwound, and no host lock can be held
//! (the host's code between the gate and the fault is only this assembly). Every other signal of those numbers, and
//! any sent by another process (`si_code <= 0`), goes to the handler the host had installed before, which ward
//! remembers and calls (or, for the default action, restores and re-raises).
//!
//! # Signal frames and keys
//!
//! The kernel writes a signal frame with the PKRU of the interrupted code and starts the handler with its initial
//! PKRU, which allows key 0 only. Neither the host's memory (not writable by a domain) nor a domain's (not
//! accessible to the handler) can hold that frame, so every thread that enters a domain gets an alternate signal
//! stack tagged with one more key, the *signal key*, which the domains' PKRU and the host's allow. The handler's
//! first instructions (`ward_mpk_signal_entry`, before anything touches the stack) write a PKRU that allows key 0
//! and the signal key; then the Rust handler runs. A host's own alternate stack on such a thread is replaced.

use std::arch::global_asm;
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::io;
use std::mem::{offset_of, MaybeUninit};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use ward_abi::{RegArgs, RegRet};

use super::memory::KeyedRegion;
use super::pku::{self, Pkru, ProtectionKey};

/// What the gate needs for one call; the assembly hard-codes the offsets (checked below).
#[repr(C)]
#[derive(Debug)]
struct GateFrame {
    func: *const c_void,
    ints: [u64; 6],
    floats: [u64; 8],
    ret_int: u64,
    ret_float: u64,
    /// PKRU inside the domain (low 32 bits).
    domain_pkru: u64,
    /// PKRU of the host at entry, restored on the way out (written by the gate).
    host_pkru: u64,
    /// The top of the domain stack, 16-byte aligned.
    stack_top: u64,
    /// The host's stack pointer after saving its registers (written by the gate).
    host_rsp: u64,
    /// The fault, when the call ended in one (written by the signal handler; signal 0 until then).
    fault: GateFault,
}

const _: () = {
    assert!(offset_of!(GateFrame, ints) == 8);
    assert!(offset_of!(GateFrame, floats) == 56);
    assert!(offset_of!(GateFrame, ret_int) == 120);
    assert!(offset_of!(GateFrame, ret_float) == 128);
    assert!(offset_of!(GateFrame, domain_pkru) == 136);
    assert!(offset_of!(GateFrame, host_pkru) == 144);
    assert!(offset_of!(GateFrame, stack_top) == 152);
    assert!(offset_of!(GateFrame, host_rsp) == 160);
};

/// A fault raised inside a domain, as the signal handler saw it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GateFault {
    pub signal: i32,
    /// `si_code`: for SIGSEGV, `SEGV_MAPERR`, `SEGV_ACCERR` or [`pku::SEGV_PKUERR`].
    pub code: i32,
    /// `si_addr`: the address accessed (SIGSEGV, SIGBUS) or the faulting instruction.
    pub addr: usize,
    /// The program counter at the fault.
    pub pc: usize,
}

impl GateFault {
    /// A write or read of memory the domain's key rights forbid (host memory written, another domain touched).
    pub(crate) fn is_key_violation(&self) -> bool {
        self.signal == libc::SIGSEGV && self.code == pku::SEGV_PKUERR
    }
}

global_asm!(
    ".pushsection .text.ward_mpk_gate, \"ax\", @progbits",
    // u64 ward_mpk_gate(GateFrame *frame): 0 when the function returned, 1 when the handler sent it to resume.
    ".globl ward_mpk_gate",
    ".hidden ward_mpk_gate",
    ".type ward_mpk_gate, @function",
    ".balign 16",
    "ward_mpk_gate:",
    "push rbp",
    "push rbx",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "mov rbx, rdi",
    "mov qword ptr [rbx + 160], rsp",
    "xor ecx, ecx",
    "rdpkru",
    "mov qword ptr [rbx + 144], rax",
    // Into the domain: its stack, then its rights. The arguments are read under the domain's PKRU, which lets it
    // read host memory.
    "mov rsp, qword ptr [rbx + 152]",
    "mov eax, dword ptr [rbx + 136]",
    "xor ecx, ecx",
    "xor edx, edx",
    "wrpkru",
    "mov rdi, qword ptr [rbx + 8]",
    "mov rsi, qword ptr [rbx + 16]",
    "mov rdx, qword ptr [rbx + 24]",
    "mov rcx, qword ptr [rbx + 32]",
    "mov r8, qword ptr [rbx + 40]",
    "mov r9, qword ptr [rbx + 48]",
    "movq xmm0, qword ptr [rbx + 56]",
    "movq xmm1, qword ptr [rbx + 64]",
    "movq xmm2, qword ptr [rbx + 72]",
    "movq xmm3, qword ptr [rbx + 80]",
    "movq xmm4, qword ptr [rbx + 88]",
    "movq xmm5, qword ptr [rbx + 96]",
    "movq xmm6, qword ptr [rbx + 104]",
    "movq xmm7, qword ptr [rbx + 112]",
    "mov r11, qword ptr [rbx]",
    // The upper bound on vector registers a variadic callee reads.
    "mov eax, 8",
    "call r11",
    // Out: the host's rights first, then its memory may be written.
    "mov r12, rax",
    "movq r13, xmm0",
    "mov eax, dword ptr [rbx + 144]",
    "xor ecx, ecx",
    "xor edx, edx",
    "wrpkru",
    "mov qword ptr [rbx + 120], r12",
    "mov qword ptr [rbx + 128], r13",
    "mov rsp, qword ptr [rbx + 160]",
    "xor eax, eax",
    "jmp 2f",
    // The signal handler sends a faulting domain here, with rbx = the frame and the domain's PKRU restored.
    ".globl ward_mpk_gate_resume",
    ".hidden ward_mpk_gate_resume",
    "ward_mpk_gate_resume:",
    "mov eax, dword ptr [rbx + 144]",
    "xor ecx, ecx",
    "xor edx, edx",
    "wrpkru",
    "mov rsp, qword ptr [rbx + 160]",
    "mov eax, 1",
    "2:",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbx",
    "pop rbp",
    "ret",
    ".size ward_mpk_gate, . - ward_mpk_gate",
    // The handler's first instructions: rights to key 0 and the signal key before the stack is touched (it is the
    // alternate stack, tagged with the signal key, which the kernel's initial PKRU denies). rdx (the context)
    // survives in r8.
    ".globl ward_mpk_signal_entry",
    ".hidden ward_mpk_signal_entry",
    ".type ward_mpk_signal_entry, @function",
    ".balign 16",
    "ward_mpk_signal_entry:",
    "mov r8, rdx",
    "mov eax, dword ptr [rip + {handler_pkru}]",
    "xor ecx, ecx",
    "xor edx, edx",
    "wrpkru",
    "mov rdx, r8",
    "jmp {on_signal}",
    ".size ward_mpk_signal_entry, . - ward_mpk_signal_entry",
    ".popsection",
    handler_pkru = sym HANDLER_PKRU,
    on_signal = sym on_signal,
);

extern "C" {
    fn ward_mpk_gate(frame: *mut GateFrame) -> u64;
    fn ward_mpk_gate_resume();
    fn ward_mpk_signal_entry(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void);
}

/// PKRU the signal handler runs with: key 0 and the signal key allowed (set once, before any handler is installed).
static HANDLER_PKRU: AtomicU32 = AtomicU32::new(0x5555_5554);

/// The signals a domain's fault raises.
const FAULT_SIGNALS: [libc::c_int; 5] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP];

/// What the process had installed for each of [`FAULT_SIGNALS`] before ward, and the signal key.
struct Installed {
    previous: [libc::sigaction; FAULT_SIGNALS.len()],
    signal_key: ProtectionKey,
}

// SAFETY: sigaction structs are plain data (handler addresses, masks, flags); the key is a number.
unsafe impl Sync for Installed {}
// SAFETY: as above.
unsafe impl Send for Installed {}

static INSTALLED: OnceLock<Result<Installed, i32>> = OnceLock::new();

thread_local! {
    /// The newest gate activation of this thread, or null: the only state the signal handler reads.
    static ACTIVE: Cell<*mut GateFrame> = const { Cell::new(ptr::null_mut()) };
    /// This thread's alternate signal stack, tagged with the signal key (made on its first gate call).
    static ALT_STACK: RefCell<Option<AltStack>> = const { RefCell::new(None) };
}

/// Bytes of a thread's alternate signal stack: the signal frame (with the XSAVE area) and the handler.
const ALT_STACK_BYTES: usize = 64 * 1024;

/// A thread's alternate signal stack, unregistered and unmapped when the thread ends.
struct AltStack(KeyedRegion);

impl Drop for AltStack {
    fn drop(&mut self) {
        let disable = libc::stack_t { ss_sp: ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
        // SAFETY: this runs on the thread that registered the stack, as it ends; after SS_DISABLE no signal is
        // delivered on it, so unmapping it (the region's drop, next) is safe.
        unsafe { libc::sigaltstack(&disable, ptr::null_mut()) };
    }
}

/// The process-wide signal key (allocated, and the handlers installed, on first use).
pub(crate) fn signal_key() -> io::Result<u32> {
    match INSTALLED.get_or_init(install) {
        Ok(installed) => Ok(installed.signal_key.number()),
        Err(errno) => Err(io::Error::from_raw_os_error(*errno)),
    }
}

/// Allocate the signal key and install the fault handlers, remembering the host's.
fn install() -> Result<Installed, i32> {
    let signal_key = ProtectionKey::allocate().map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
    HANDLER_PKRU.store(Pkru::DENY_ALL.allow(pku::HOST_KEY).allow(signal_key.number()).0, Ordering::SeqCst);
    // SAFETY: all-zero is a valid sigaction (no handler, empty mask, no flags); each is overwritten below.
    let mut previous: [libc::sigaction; FAULT_SIGNALS.len()] = unsafe { MaybeUninit::zeroed().assume_init() };
    for (signal, old) in FAULT_SIGNALS.iter().zip(previous.iter_mut()) {
        // SAFETY: as above.
        let mut action: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
        action.sa_sigaction = ward_mpk_signal_entry as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        // SAFETY: sa_mask is a valid sigset to empty; sigaction installs a handler that follows the C signal
        // handler ABI (the entry stub, then `on_signal`) and stores the old action in memory we own.
        let r = unsafe {
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(*signal, &action, old)
        };
        if r != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL));
        }
    }
    Ok(Installed { previous, signal_key })
}

/// Ready this thread for gate calls: the handlers installed, an alternate signal stack tagged with the signal key,
/// and this thread's host PKRU allowing the signal key (so a host fault here can still be delivered). Cheap after
/// the first time on a thread.
fn prepare_thread() -> io::Result<()> {
    if ALT_STACK.with(|s| s.borrow().is_some()) {
        return Ok(());
    }
    let key = signal_key()?;
    unregister_rseq()?;
    let region = KeyedRegion::new(ALT_STACK_BYTES, key)?;
    let stack = libc::stack_t { ss_sp: region.start().cast(), ss_flags: 0, ss_size: region.len() };
    allow_on_this_thread(key);
    // SAFETY: the stack is a live mapping this thread keeps (ALT_STACK) until it ends, when AltStack's drop
    // unregisters it before unmapping it.
    if unsafe { libc::sigaltstack(&stack, ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    ALT_STACK.with(|s| *s.borrow_mut() = Some(AltStack(region)));
    Ok(())
}

extern "C" {
    /// glibc (2.35 and later): where this thread's rseq area lies from the thread pointer, and its size (0 when
    /// glibc registered none).
    static __rseq_offset: isize;
    static __rseq_size: u32;
}

/// The signature glibc registers its rseq areas with on x86.
const RSEQ_SIG: u32 = 0x5305_3053;
const RSEQ_FLAG_UNREGISTER: u64 = 1;

/// Take this thread's restartable-sequences area away from the kernel.
///
/// glibc registers one per thread, inside the thread's control block (host memory, key 0), and the kernel writes
/// it whenever it delivers a signal to the thread or returns to it after moving it to another CPU, with the PKRU
/// of the code it interrupted. Inside a domain that PKRU forbids writing key 0: the write fails and the kernel
/// kills the process with SIGSEGV. Unregistered, the kernel leaves the area alone; glibc only reads it to answer
/// `sched_getcpu`, and falls back to the system call once the kernel marks it unregistered.
fn unregister_rseq() -> io::Result<()> {
    // SAFETY: plain reads of two constants glibc sets before any user code runs.
    let (offset, size) = unsafe { (__rseq_offset, __rseq_size) };
    if size == 0 {
        return Ok(());
    }
    let thread_pointer: usize;
    // SAFETY: on x86-64 glibc the first word of the thread control block, at fs:0, points at the block itself.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) thread_pointer, options(nostack, readonly, preserves_flags))
    };
    let area = thread_pointer.wrapping_add_signed(offset);
    // The kernel wants the length registered: 32 bytes for every glibc so far, `__rseq_size` if a later one differs.
    let mut last = io::Error::from_raw_os_error(libc::EINVAL);
    for len in [32, size] {
        // SAFETY: unregistering this thread's own area only stops the kernel writing it; nothing reads it but
        // glibc, which copes (see above).
        let r = unsafe { libc::syscall(libc::SYS_rseq, area, len, RSEQ_FLAG_UNREGISTER, RSEQ_SIG) };
        if r == 0 {
            return Ok(());
        }
        last = io::Error::last_os_error();
    }
    Err(last)
}

/// Allow `key` in this thread's PKRU (the host's rights on this thread).
pub(crate) fn allow_on_this_thread(key: u32) {
    let pkru = Pkru::current().allow(key);
    // SAFETY: WRPKRU (ecx = edx = 0) only widens this thread's rights to a key ward allocated; it touches no memory.
    // The compiler may not move memory accesses across it (no `nomem`).
    unsafe {
        std::arch::asm!("wrpkru", in("eax") pkru.0, in("ecx") 0u32, in("edx") 0u32, options(nostack, preserves_flags))
    };
}

/// Call `func` inside a domain: on the stack whose top is `stack_top`, with `rights` as PKRU.
///
/// Returns what it returned, or the fault it raised; either way the thread is back in the host with the host's
/// PKRU. Only on a machine with PKU.
///
/// # Safety
/// `func` is a System V function taking only register-passed scalars valid in `args` (as for
/// [`ward_abi::call_native`]) that neither unwinds nor leaves by `longjmp`; `stack_top` is the 16-byte aligned top of
/// a stack `rights` lets it write, used by no other call in progress.
pub(crate) unsafe fn call(
    func: *const c_void,
    args: &RegArgs,
    rights: Pkru,
    stack_top: *mut u8,
) -> io::Result<Result<RegRet, GateFault>> {
    prepare_thread()?;
    let below = ACTIVE.with(Cell::get);
    let mut frame = GateFrame {
        func,
        ints: args.ints,
        floats: args.floats,
        ret_int: 0,
        ret_float: 0,
        domain_pkru: u64::from(rights.0),
        host_pkru: 0,
        stack_top: stack_top as u64,
        host_rsp: 0,
        fault: GateFault { signal: 0, code: 0, addr: 0, pc: 0 },
    };
    let frame_ptr: *mut GateFrame = &mut frame;
    ACTIVE.with(|a| a.set(frame_ptr));
    // SAFETY: the frame is live for the whole call and has the layout the assembly reads (checked above); the gate
    // saves and restores every callee-saved register and the stack pointer, on both its paths, so to Rust it is an
    // ordinary C function. The call of `func` on the domain's stack is sound by the caller's guarantee, and a fault
    // in it comes back through the resume path, which the handler only takes for this activation.
    let status = unsafe { ward_mpk_gate(frame_ptr) };
    ACTIVE.with(|a| a.set(below));
    // SAFETY: the gate and the handler are done with the frame; reading it through the pointer they used keeps
    // the compiler from assuming it unchanged.
    let frame = unsafe { ptr::read_volatile(frame_ptr) };
    Ok(match status {
        0 => Ok(RegRet { int: frame.ret_int, float: frame.ret_float }),
        _ => Err(frame.fault),
    })
}

/// The Rust half of the fault handler (after `ward_mpk_signal_entry`).
extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let frame = ACTIVE.with(Cell::get);
    // SAFETY: the kernel passes a valid siginfo.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if !frame.is_null() && code > 0 {
        let uc = context.cast::<libc::ucontext_t>();
        // SAFETY: the kernel passes this thread's interrupted context; `frame` is this thread's live activation
        // (set by `call` and cleared after the gate returns), in host memory the handler may write.
        unsafe {
            let gregs = &mut (*uc).uc_mcontext.gregs;
            (*frame).fault = GateFault { signal, code, addr, pc: gregs[libc::REG_RIP as usize] as usize };
            gregs[libc::REG_RIP as usize] = ward_mpk_gate_resume as *const () as i64;
            gregs[libc::REG_RBX as usize] = frame as i64;
        }
        return;
    }
    chain(signal, info, context);
}

/// Hand a signal that is not a domain's to what the host had installed.
fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let Some(Ok(installed)) = INSTALLED.get() else {
        return;
    };
    let Some(index) = FAULT_SIGNALS.iter().position(|&s| s == signal) else {
        return;
    };
    let previous = &installed.previous[index];
    match previous.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // The default action (end the process, with a core where the signal has one), as without ward.
            // SAFETY: restoring the default disposition and re-raising is async-signal-safe.
            unsafe {
                libc::signal(signal, libc::SIG_DFL);
                libc::raise(signal);
            }
        }
        handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the host installed this address as an SA_SIGINFO handler for this signal.
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(handler) };
            handler(signal, info, context);
        }
        handler => {
            // SAFETY: the host installed this address as a plain handler for this signal.
            let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            handler(signal);
        }
    }
}

#[cfg(test)]
mod tests;
