//! The gate: calling a function inside an mpk domain on the host's own thread, and getting the thread back when
//! that function faults.
//!
//! # Entering and leaving
//!
//! [`call`] fills a [`GateFrame`] (the function, its register arguments, the domain's PKRU and stack) and runs the
//! assembly below: it saves the host's callee-saved registers and stack pointer in the frame, records the host's
//! PKRU (RDPKRU) and FS base, switches to the domain's thread block (`thread_block`) and stack, writes the domain's
//! PKRU, loads the argument registers and calls. On return it puts the host's thread pointer and PKRU back, stores
//! `rax` and `xmm0` and returns to the host's stack. While the
//! domain's PKRU is in force the function can read host memory but not write it (Nooks' rule), and memory of keys
//! its PKRU does not name (other domains) is out of reach altogether.
//!
//! # Calling out
//!
//! A domain reaches host functions through [`outward_stub`]s: stub `n` saves the argument registers on the domain
//! stack, finds the thread's activation, writes the host's PKRU, marks the activation *outside*, moves to the host's
//! stack below where the gate left it, and calls the slot's target with the arguments intact; then the reverse.
//! From there the host may call into a domain again ([`nested_stack_top`] gives the same domain's stack below the
//! part in use), to any depth.
//!
//! # Faults and deadlines
//!
//! The frame in use is this thread's activation, kept in a thread-local pointer; [`call`] puts back the one it
//! replaced when it returns. The gate marks the frame *inside* from just before it gives the domain its rights
//! until just after it takes them back. A SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGTRAP raised by the processor while
//! the activation is inside and not outside is that domain's: the handler records the signal, its code, the
//! faulting address and the program counter in the frame, points the interrupted context at the gate's resume
//! path (with `rbx` = the frame) and returns. Returning from the handler restores the domain's PKRU from the signal
//! frame, so the resume path writes the host's PKRU first, then takes the host's stack pointer from the frame and
//! returns from the gate with status 1: no host frame is skipped, none is unwound, and no host lock can be held
//! (the host's code between the gate and the fault is only this assembly). Every other signal of those numbers, and
//! any sent by another process (`si_code <= 0`), goes to the handler the host had installed before, which ward
//! remembers and calls (or, for the default action, restores and re-raises).
//!
//! A call with a deadline gives it to the process's watchdog (`watchdog`), which signals the thread with
//! [`timeout_signal`] once it has passed; that ends the call the same way. If the domain is outside just then, the
//! host's code is left alone and the watchdog signals again at its next tick, so the domain is stopped once it is
//! back.
//!
//! # Several threads, and closing a domain
//!
//! Each thread's activations are its own (ACTIVE is thread-local) and each runs on a stack of its own, so threads
//! enter a domain independently. A thread recovering the domain first closes it ([`Occupancy::close`]): every call
//! made before then ends at its gate without running more of the domain's code, whether it was running there (an
//! eviction signal ends it), out in the host (it ends when it comes back) or about to enter.
//!
//! # Floating-point control
//!
//! MXCSR and the x87 control word are callee-saved in System V. The gate saves the host's on entry and gives the
//! domain its own ([`FloatControl`]), which it keeps from call to call as it would in a process of its own; the host
//! gets its own back, with the x87 exception flags cleared and the x87 registers empty, whenever its code runs
//! again: on return, after a fault and while the domain has called out.
//!
//! # Signal frames and keys
//!
//! The kernel writes a signal frame with the PKRU of the interrupted code and starts the handler with its initial
//! PKRU, which allows key 0 only. Neither the host's memory (not writable by a domain) nor a domain's (not
//! accessible to the handler) can hold that frame, so every thread that enters a domain gets an alternate signal
//! stack tagged with one more key, the *signal key*, which the domains' PKRU and the host's allow. The handler's
//! first instructions (`ward_mpk_signal_entry`, before anything touches the stack) write a PKRU that allows key 0
//! and the signal key; then the Rust handler runs. A host's own alternate stack on such a thread is replaced.
//! The host's handlers for other signals would start the same way, with a PKRU that denies the stack they run on,
//! so ward wraps them in an entry of its own that allows every key first ([`adopt_host_handlers`]).
//!
//! # The FS base
//!
//! Rust's thread-locals (the activation pointer above among them) are reached through the FS base, which inside a
//! domain points at the domain's thread block. So every entry into ward's code that may come from a domain (the
//! gate's way out, the outward stubs, both signal handler entries) first puts the host thread's pointer back, which
//! the block names (`ward_mpk_host_thread_pointer`); a signal handler puts the interrupted code's back as it
//! returns, and the resume path takes the host's from the frame.

use std::arch::global_asm;
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::io;
use std::mem::{offset_of, MaybeUninit};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use ward_abi::{RegArgs, RegRet};

use super::checks::{self, Arguments, GateCheck, Refusal, Touch};
use super::memory::KeyedRegion;
use super::pku::{self, Pkru, ProtectionKey};
use super::thread_block;
use super::watchdog;

/// What the gate needs for one call; the assembly names its fields by `offset_of!`.
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
    /// 1 while the domain has called out to the host through an outward stub (written by the stub): a fault then
    /// is the host's, not the domain's.
    outside: u64,
    /// The domain's stack pointer when it last called out: a call into the same domain made from the host while
    /// it is outside starts below it (written by the outward stub).
    domain_rsp_out: u64,
    /// 1 from just before the gate gives the domain its rights until just after it takes them back (written by
    /// the gate): a signal outside that span is not this call's, and the resume path is safe anywhere inside it.
    inside: u64,
    /// The fault, when the call ended in one (written by the signal handler; signal 0 until then).
    fault: GateFault,
    /// The thread pointer (FS base) the domain runs with: this thread's block in the domain (see `thread_block`).
    domain_fs: u64,
    /// The host's thread pointer at entry (written by the gate), put back on the way out.
    host_fs: u64,
    /// The activation this one interrupted on this thread (null: none): the chain [`nested_stack_top`] walks.
    below: *mut GateFrame,
    /// The host's MXCSR and x87 control word at entry (written by the gate): the host gets them back whenever it
    /// runs again, on return, after a fault and during an outward call.
    host_mxcsr: u32,
    host_x87_control: u32,
    /// The domain's MXCSR and x87 control word: what it starts with, and what it left (written by the gate when
    /// it returns or calls out).
    domain_mxcsr: u32,
    domain_x87_control: u32,
    /// The domain's epoch word ([`Occupancy`]), and its value when the call was made: the gate and the outward
    /// stub's way back in compare them, and do not go (back) into a domain that has been closed since.
    epoch_at: *const AtomicU64,
    epoch: u64,
    /// Where the gate and the outward stubs say whether this thread is running the domain's code (1) or not (0):
    /// its occupant's word ([`Occupant`]), or `own_running` for a call with none.
    running_at: *const AtomicU64,
    own_running: u64,
}

// The floats follow the ints, as in RegArgs: the argument loader reads both from one base.
const _: () = assert!(offset_of!(GateFrame, floats) == offset_of!(GateFrame, ints) + 48);

/// A fault raised inside a domain, as the signal handler saw it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateFault {
    pub signal: i32,
    /// `si_code`: for SIGSEGV, `SEGV_MAPERR`, `SEGV_ACCERR` or [`pku::SEGV_PKUERR`].
    pub code: i32,
    /// `si_addr`: the address accessed (SIGSEGV, SIGBUS) or the faulting instruction.
    pub addr: usize,
    /// The program counter at the fault.
    pub pc: usize,
    /// When the fault is an outward stub's argument check refusing the call: the stub's slot and the refusal's
    /// code (0: not a refusal). [`GateFault::refused`] reads them.
    refused_slot: usize,
    refusal_code: u64,
    /// When the fault is the domain asking to end the process (the runtime's `exit` or `abort`, see [`end_call`]):
    /// how (a nonzero kind the runtime defines) and the status it gave. Kind 0: not an ending.
    ending_kind: u64,
    ending_status: u64,
}

/// An outward call its argument check refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The host function the domain called, as it imported it.
    pub function: &'static str,
    pub why: Refusal,
}

impl GateFault {
    /// The refusal, when an outward stub's argument check refused the call.
    pub fn refused(&self) -> Option<Refused> {
        refusal(self.refused_slot, self.refusal_code)
    }

    /// How the domain asked to end the process, when that is what the fault is: the runtime's kind and status.
    pub fn ending(&self) -> Option<(u64, i32)> {
        (self.ending_kind != 0).then_some((self.ending_kind, self.ending_status as i32))
    }

    /// A write or read of memory the domain's key rights forbid (host memory written, another domain touched).
    pub fn is_key_violation(&self) -> bool {
        self.signal == libc::SIGSEGV && self.code == pku::SEGV_PKUERR
    }
}

global_asm!(
    // Pieces the gate and the outward stubs share. Frame fields are named by the operands at the end.
    // Floating-point control: MXCSR and the x87 control word, callee-saved in System V, so a host relies on them
    // across a call. A domain keeps its own from call to call, as it would in a process of its own.
    ".macro ward_mpk_save_domain_float_control base:req",
    "stmxcsr dword ptr [\\base + {domain_mxcsr}]",
    "fnstcw word ptr [\\base + {domain_x87_control}]",
    ".endm",
    // The x87 exception flags are cleared first: one the host (or the host code a domain called) left set, which
    // the domain's control word unmasks, would otherwise trap at the domain's next x87 instruction.
    ".macro ward_mpk_load_domain_float_control base:req",
    "fnclex",
    "ldmxcsr dword ptr [\\base + {domain_mxcsr}]",
    "fldcw word ptr [\\base + {domain_x87_control}]",
    ".endm",
    // The host's back, with the x87 exception flags cleared and every x87 register marked empty: a domain that
    // used MMX registers without `emms` leaves the x87 stack full, which System V wants empty at a call or return.
    ".macro ward_mpk_load_host_float_control base:req",
    "fnclex",
    "emms",
    "fldcw word ptr [\\base + {host_x87_control}]",
    "ldmxcsr dword ptr [\\base + {host_mxcsr}]",
    ".endm",
    // FS base := the host thread's pointer, when it is a domain's thread block (whose control block names the host
    // thread, with the check word that proves it is one); left alone otherwise. Clobbers rax and rcx. Any code that
    // may run with a domain's FS base does this before Rust code, which reads thread-locals through FS.
    ".macro ward_mpk_host_thread_pointer",
    "mov rax, qword ptr fs:[{host_pointer_at}]",
    "mov rcx, qword ptr fs:[{host_check_at}]",
    "xor rcx, rax",
    "cmp rcx, qword ptr [rip + {tcb_secret}]",
    "jne 7f",
    "wrfsbase rax",
    "7:",
    ".endm",
    // The rest of a signal handler's entry, once its stack may be used: the host thread's pointer while `handler`
    // runs (the signal may have come inside a domain), and the interrupted code's back before it resumes (the
    // kernel's signal return restores registers, not the FS base). The three arguments pass through.
    ".macro ward_mpk_signal_with_host_thread_pointer handler:req",
    "push rbx",
    "rdfsbase rbx",
    "ward_mpk_host_thread_pointer",
    "call \\handler",
    "wrfsbase rbx",
    "pop rbx",
    "ret",
    ".endm",
    // ZF := the domain's epoch is still the one the call was made in (clobbers rax).
    ".macro ward_mpk_closed_since base:req",
    "mov rax, qword ptr [\\base + {epoch_at}]",
    "mov rax, qword ptr [rax]",
    "cmp rax, qword ptr [\\base + {epoch}]",
    ".endm",
    ".macro ward_mpk_save_host_registers",
    "push rbp",
    "push rbx",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    ".endm",
    ".macro ward_mpk_restore_host_registers_and_return",
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbx",
    "pop rbp",
    "ret",
    ".endm",
    // PKRU := the dword at [base + offset] (eax, ecx and edx are clobbered).
    ".macro ward_mpk_set_pkru base:req, offset:req",
    "mov eax, dword ptr [\\base + \\offset]",
    "xor ecx, ecx",
    "xor edx, edx",
    "wrpkru",
    ".endm",
    // The fourteen argument registers := the RegArgs image at [base + offset].
    ".macro ward_mpk_load_arguments base:req, offset:req",
    "mov rdi, qword ptr [\\base + \\offset]",
    "mov rsi, qword ptr [\\base + \\offset + 8]",
    "mov rdx, qword ptr [\\base + \\offset + 16]",
    "mov rcx, qword ptr [\\base + \\offset + 24]",
    "mov r8, qword ptr [\\base + \\offset + 32]",
    "mov r9, qword ptr [\\base + \\offset + 40]",
    "movq xmm0, qword ptr [\\base + \\offset + 48]",
    "movq xmm1, qword ptr [\\base + \\offset + 56]",
    "movq xmm2, qword ptr [\\base + \\offset + 64]",
    "movq xmm3, qword ptr [\\base + \\offset + 72]",
    "movq xmm4, qword ptr [\\base + \\offset + 80]",
    "movq xmm5, qword ptr [\\base + \\offset + 88]",
    "movq xmm6, qword ptr [\\base + \\offset + 96]",
    "movq xmm7, qword ptr [\\base + \\offset + 104]",
    ".endm",
    // [rsp] := the first {stack_words} eightbytes above the return address of an outward stub's caller, whose
    // frame starts at `base` (the RegArgs image, 120 bytes, and the six saved registers, 48, lie below that return
    // address): where System V puts the arguments that do not fit the registers (the seventh integer one on, a
    // variadic function's surplus, long doubles). Clobbers rax.
    ".macro ward_mpk_copy_stack_arguments base:req",
    ".set ward_mpk_word, 0",
    ".rept {stack_words}",
    "mov rax, qword ptr [\\base + {stack_arguments_at} + ward_mpk_word * 8]",
    "mov qword ptr [rsp + ward_mpk_word * 8], rax",
    ".set ward_mpk_word, ward_mpk_word + 1",
    ".endr",
    ".endm",
    ".pushsection .text.ward_mpk_gate, \"ax\", @progbits",
    // u64 ward_mpk_gate(GateFrame *frame): 0 when the function returned, 1 when the handler sent it to resume.
    ".globl ward_mpk_gate",
    ".hidden ward_mpk_gate",
    ".type ward_mpk_gate, @function",
    ".balign 16",
    "ward_mpk_gate:",
    "ward_mpk_save_host_registers",
    "mov rbx, rdi",
    "mov qword ptr [rbx + {host_rsp}], rsp",
    "xor ecx, ecx",
    "rdpkru",
    "mov qword ptr [rbx + {host_pkru}], rax",
    "stmxcsr dword ptr [rbx + {host_mxcsr}]",
    "fnstcw word ptr [rbx + {host_x87_control}]",
    "ward_mpk_load_domain_float_control rbx",
    // The domain's thread block.
    "rdfsbase rax",
    "mov qword ptr [rbx + {host_fs}], rax",
    "mov rax, qword ptr [rbx + {domain_fs}]",
    "wrfsbase rax",
    // Into the domain: marked inside, and running, then its stack, then its rights. A thread closing the domain
    // either sees the running mark or is seen to have closed it, below: its membarrier orders this store before
    // the epoch's load (see `Occupancy::close`), so no fence is needed here. The arguments are read under the
    // domain's PKRU, which lets it read host memory.
    "mov qword ptr [rbx + {inside}], 1",
    "mov rcx, qword ptr [rbx + {running_at}]",
    "mov qword ptr [rcx], 1",
    "ward_mpk_closed_since rbx",
    "jne ward_mpk_gate_resume",
    "mov rsp, qword ptr [rbx + {stack_top}]",
    "ward_mpk_set_pkru rbx, {domain_pkru}",
    "ward_mpk_load_arguments rbx, {ints}",
    "mov r11, qword ptr [rbx + {func}]",
    // The upper bound on vector registers a variadic callee reads.
    "mov eax, 8",
    "call r11",
    // Out. rbx is the domain's to preserve, and a faulty domain may not have: the frame comes again from the
    // thread's own record, which the domain may read but not write. The direction flag, which the System V ABI
    // wants clear at a return, is cleared for the same reason before any host code runs.
    "mov r12, rax",
    "movq r13, xmm0",
    "cld",
    "ward_mpk_host_thread_pointer",
    "and rsp, -16",
    "call {active}",
    "mov rbx, rax",
    // The host's rights first, then its memory may be written.
    "ward_mpk_set_pkru rbx, {host_pkru}",
    "mov qword ptr [rbx + {inside}], 0",
    "mov rcx, qword ptr [rbx + {running_at}]",
    "mov qword ptr [rcx], 0",
    "ward_mpk_save_domain_float_control rbx",
    "ward_mpk_load_host_float_control rbx",
    "mov qword ptr [rbx + {ret_int}], r12",
    "mov qword ptr [rbx + {ret_float}], r13",
    "mov rsp, qword ptr [rbx + {host_rsp}]",
    "xor eax, eax",
    "ward_mpk_restore_host_registers_and_return",
    // The signal handler sends a faulting domain here, with rbx = the frame and the domain's PKRU restored.
    ".globl ward_mpk_gate_resume",
    ".hidden ward_mpk_gate_resume",
    "ward_mpk_gate_resume:",
    "cld",
    "ward_mpk_set_pkru rbx, {host_pkru}",
    "mov rax, qword ptr [rbx + {host_fs}]",
    "wrfsbase rax",
    "mov qword ptr [rbx + {inside}], 0",
    "mov rcx, qword ptr [rbx + {running_at}]",
    "mov qword ptr [rcx], 0",
    "ward_mpk_load_host_float_control rbx",
    "mov rsp, qword ptr [rbx + {host_rsp}]",
    "mov eax, 1",
    "ward_mpk_restore_host_registers_and_return",
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
    "ward_mpk_set_pkru rip, {handler_pkru}",
    "mov rdx, r8",
    "ward_mpk_signal_with_host_thread_pointer {on_signal}",
    ".size ward_mpk_signal_entry, . - ward_mpk_signal_entry",
    // Entry of every host handler ward wraps (see `adopt_host_handlers`): every key allowed, as host code may, before
    // anything touches the stack, then `on_host_signal`. rdx (the context) survives in r8.
    ".globl ward_mpk_host_signal_entry",
    ".hidden ward_mpk_host_signal_entry",
    ".type ward_mpk_host_signal_entry, @function",
    ".balign 16",
    "ward_mpk_host_signal_entry:",
    "mov r8, rdx",
    "xor eax, eax",
    "xor ecx, ecx",
    "xor edx, edx",
    "wrpkru",
    "mov rdx, r8",
    "ward_mpk_signal_with_host_thread_pointer {on_host_signal}",
    ".size ward_mpk_host_signal_entry, . - ward_mpk_host_signal_entry",
    // Where an outward stub's argument check refuses a call (rdi = the slot, rsi = the refusal): the trap ends the
    // call as the domain's, and the handler knows it by this address.
    ".globl ward_mpk_refuse",
    ".hidden ward_mpk_refuse",
    ".type ward_mpk_refuse, @function",
    ".balign 16",
    "ward_mpk_refuse:",
    "ud2",
    ".size ward_mpk_refuse, . - ward_mpk_refuse",
    // Where the runtime's `exit` and `abort` end the call (rdi = the kind, rsi = the status): as above. The two
    // words travel with this thread's fault, so another thread's call in the same domain cannot be taken for it.
    ".globl ward_mpk_end",
    ".hidden ward_mpk_end",
    ".type ward_mpk_end, @function",
    ".balign 16",
    "ward_mpk_end:",
    "ud2",
    ".size ward_mpk_end, . - ward_mpk_end",
    ".popsection",
    ".pushsection .text.ward_mpk_outward, \"ax\", @progbits",
    ".balign 16",
    ".globl ward_mpk_outward_stubs",
    ".hidden ward_mpk_outward_stubs",
    "ward_mpk_outward_stubs:",
    ".set slot, 0",
    ".rept {slots}",
    "mov r11d, slot",
    "jmp ward_mpk_outward_common",
    ".balign {stride}, 0xcc",
    ".set slot, slot + 1",
    ".endr",
    // Common body, entered with the domain's rights, on its stack, the arguments in their registers and the slot
    // in r11. Frame on the domain stack: the six callee-saved registers (48 bytes, with the return address 56:
    // rsp is 8 mod 16 after the pushes), then 120 bytes: a RegArgs image of the argument registers, and padding.
    "ward_mpk_outward_common:",
    "ward_mpk_save_host_registers",
    "sub rsp, 120",
    "mov qword ptr [rsp], rdi",
    "mov qword ptr [rsp + 8], rsi",
    "mov qword ptr [rsp + 16], rdx",
    "mov qword ptr [rsp + 24], rcx",
    "mov qword ptr [rsp + 32], r8",
    "mov qword ptr [rsp + 40], r9",
    "movq qword ptr [rsp + 48], xmm0",
    "movq qword ptr [rsp + 56], xmm1",
    "movq qword ptr [rsp + 64], xmm2",
    "movq qword ptr [rsp + 72], xmm3",
    "movq qword ptr [rsp + 80], xmm4",
    "movq qword ptr [rsp + 88], xmm5",
    "movq qword ptr [rsp + 96], xmm6",
    "movq qword ptr [rsp + 104], xmm7",
    "mov r12, r11",
    "mov r14, rsp",
    // The host thread's pointer for the Rust code below, the caller's (in rbp) back when it returns.
    "rdfsbase rbp",
    "ward_mpk_host_thread_pointer",
    // Which activation is this thread in? (Reads host memory only, which the domain's rights allow.) The direction
    // flag is the caller's to clear, and host code must not run with a faulty domain's.
    "cld",
    "and rsp, -16",
    "call {current}",
    "mov r13, rax",
    "test r13, r13",
    "jz 3f",
    // Still with the domain's rights, on its stack: the slot's argument check, where a pointer the domain could
    // not use itself faults as the domain's (see `checks`).
    "mov rdi, r12",
    "mov rsi, r14",
    "call {check}",
    // The stack arguments' first and last eightbytes, read with the domain's rights: the copy below reads them with
    // the host's, marked outside, where a fault would be the host's. A domain that moved its stack pointer (to the
    // top of its stack, or anywhere) faults here, as its own.
    "mov rax, qword ptr [r14 + {stack_arguments_at}]",
    "mov rax, qword ptr [r14 + {stack_arguments_at} + {stack_bytes} - 8]",
    // To the host: its rights, then its stack (below where the gate left it), marked outside. A thread closing
    // the domain does not wait for this one while it is outside.
    "ward_mpk_set_pkru r13, {host_pkru}",
    "ward_mpk_save_domain_float_control r13",
    "ward_mpk_load_host_float_control r13",
    "mov qword ptr [r13 + {outside}], 1",
    "mov rax, qword ptr [r13 + {running_at}]",
    "mov qword ptr [rax], 0",
    "mov qword ptr [r13 + {domain_rsp_out}], r14",
    "mov rsp, qword ptr [r13 + {host_rsp}]",
    "and rsp, -16",
    "sub rsp, {stack_bytes}",
    "ward_mpk_copy_stack_arguments r14",
    "call 4f",
    // Back to the domain: unmarked and running again (as at the gate's entry), its stack, its rights; the results
    // survive in rbx and r15. Not if the domain was closed meanwhile: its memory is another incarnation's
    // now, so the call ends there, as if it had faulted, with the host's rights, stack and thread pointer (rbx =
    // the frame for the resume path).
    "mov rbx, rax",
    "movq r15, xmm0",
    "mov qword ptr [r13 + {outside}], 0",
    "mov rax, qword ptr [r13 + {running_at}]",
    "mov qword ptr [rax], 1",
    "ward_mpk_closed_since r13",
    "jne 6f",
    "ward_mpk_load_domain_float_control r13",
    "wrfsbase rbp",
    "mov rsp, r14",
    "ward_mpk_set_pkru r13, {domain_pkru}",
    "mov rax, rbx",
    "movq xmm0, r15",
    "jmp 5f",
    "6:",
    "mov rbx, r13",
    "jmp ward_mpk_gate_resume",
    // Not inside a domain (a host thread calling the pointer itself): a plain call.
    "3:",
    "sub rsp, {stack_bytes}",
    "ward_mpk_copy_stack_arguments r14",
    "call 4f",
    "wrfsbase rbp",
    "mov rsp, r14",
    "5:",
    "add rsp, 120",
    "ward_mpk_restore_host_registers_and_return",
    // Load the arguments from the saved image (r14) and call the slot's target (r12); rsp is 16-byte aligned
    // before the `call 4f` that got here pushed its return address, as a C caller leaves it.
    "4:",
    "ward_mpk_load_arguments r14, 0",
    "lea r11, [rip + {targets}]",
    "mov r11, qword ptr [r11 + r12 * 8]",
    "mov eax, 8",
    "jmp r11",
    ".popsection",
    ".purgem ward_mpk_closed_since",
    ".purgem ward_mpk_save_host_registers",
    ".purgem ward_mpk_restore_host_registers_and_return",
    ".purgem ward_mpk_set_pkru",
    ".purgem ward_mpk_load_arguments",
    ".purgem ward_mpk_copy_stack_arguments",
    ".purgem ward_mpk_save_domain_float_control",
    ".purgem ward_mpk_load_domain_float_control",
    ".purgem ward_mpk_load_host_float_control",
    ".purgem ward_mpk_host_thread_pointer",
    ".purgem ward_mpk_signal_with_host_thread_pointer",
    func = const offset_of!(GateFrame, func),
    ints = const offset_of!(GateFrame, ints),
    ret_int = const offset_of!(GateFrame, ret_int),
    ret_float = const offset_of!(GateFrame, ret_float),
    domain_pkru = const offset_of!(GateFrame, domain_pkru),
    host_pkru = const offset_of!(GateFrame, host_pkru),
    stack_top = const offset_of!(GateFrame, stack_top),
    host_rsp = const offset_of!(GateFrame, host_rsp),
    outside = const offset_of!(GateFrame, outside),
    domain_rsp_out = const offset_of!(GateFrame, domain_rsp_out),
    inside = const offset_of!(GateFrame, inside),
    host_mxcsr = const offset_of!(GateFrame, host_mxcsr),
    host_x87_control = const offset_of!(GateFrame, host_x87_control),
    domain_mxcsr = const offset_of!(GateFrame, domain_mxcsr),
    domain_x87_control = const offset_of!(GateFrame, domain_x87_control),
    domain_fs = const offset_of!(GateFrame, domain_fs),
    host_fs = const offset_of!(GateFrame, host_fs),
    epoch_at = const offset_of!(GateFrame, epoch_at),
    epoch = const offset_of!(GateFrame, epoch),
    running_at = const offset_of!(GateFrame, running_at),
    host_pointer_at = const thread_block::HOST_POINTER_AT,
    host_check_at = const thread_block::HOST_CHECK_AT,
    tcb_secret = sym thread_block::TCB_SECRET,
    handler_pkru = sym HANDLER_PKRU,
    on_signal = sym on_signal,
    on_host_signal = sym on_host_signal,
    stack_words = const OUTWARD_STACK_WORDS,
    stack_arguments_at = const STACK_ARGUMENTS_AT,
    stack_bytes = const OUTWARD_STACK_WORDS * 8,
    slots = const OUTWARD_SLOTS,
    stride = const OUTWARD_STRIDE,
    current = sym current_activation_inside,
    active = sym current_activation,
    check = sym check_outward_arguments,
    targets = sym OUTWARD_TARGETS,
);

extern "C" {
    fn ward_mpk_gate(frame: *mut GateFrame) -> u64;
    fn ward_mpk_gate_resume();
    fn ward_mpk_signal_entry(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void);
    fn ward_mpk_host_signal_entry(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void);
    /// Traps, with the slot and the refusal in the argument registers, for the handler to read.
    fn ward_mpk_refuse(slot: usize, refusal: u64) -> !;
    /// Traps, with how the domain ends and its status in the argument registers, for the handler to read.
    fn ward_mpk_end(kind: u64, status: u64) -> !;
}

/// PKRU the signal handler runs with: key 0 and the signal key allowed (set once, before any handler is installed).
static HANDLER_PKRU: AtomicU32 = AtomicU32::new(0x5555_5554);

/// The signals a domain's fault raises.
const FAULT_SIGNALS: [libc::c_int; 5] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP];

/// The signal the watchdog sends a thread past its deadline: a real-time signal near the top, clear of glibc's own
/// (at the bottom of the range) and of the ones programs usually pick (`SIGRTMIN + n`). One a host sends itself
/// (anything but the watchdog's queued signal, see `watchdog::from_watchdog`) is passed on to the host's handler.
pub fn timeout_signal() -> libc::c_int {
    libc::SIGRTMAX() - 2
}

/// Every signal ward handles: the fault signals, then the timeout signal.
fn handled_signals() -> [libc::c_int; FAULT_SIGNALS.len() + 1] {
    let [a, b, c, d, e] = FAULT_SIGNALS;
    [a, b, c, d, e, timeout_signal()]
}

/// ward's handlers are installed, with this signal key. (What the host had installed before is in
/// [`HOST_ACTIONS`].)
struct Installed {
    signal_key: ProtectionKey,
}

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
struct AltStack {
    /// Held for its mapping, unmapped after the drop below unregisters it.
    _mapping: KeyedRegion,
}

impl Drop for AltStack {
    fn drop(&mut self) {
        let disable = libc::stack_t { ss_sp: ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
        // SAFETY: this runs on the thread that registered the stack, as it ends; after SS_DISABLE no signal is
        // delivered on it, so unmapping it (the region's drop, next) is safe.
        unsafe { libc::sigaltstack(&disable, ptr::null_mut()) };
    }
}

/// The process-wide signal key (allocated, and the handlers installed, on first use).
pub fn signal_key() -> io::Result<u32> {
    match INSTALLED.get_or_init(install) {
        Ok(installed) => Ok(installed.signal_key.number()),
        Err(errno) => Err(io::Error::from_raw_os_error(*errno)),
    }
}

/// Allocate the signal key and install the fault handlers, remembering the host's.
fn install() -> Result<Installed, i32> {
    thread_block::choose_secret();
    let signal_key = ProtectionKey::allocate().map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
    HANDLER_PKRU.store(Pkru::DENY_ALL.allow(pku::HOST_KEY).allow(signal_key.number()).0, Ordering::SeqCst);
    // SAFETY: all-zero is a valid sigaction (no handler, empty mask, no flags); each is overwritten below.
    let mut previous: [libc::sigaction; FAULT_SIGNALS.len() + 1] = unsafe { MaybeUninit::zeroed().assume_init() };
    let signals = handled_signals();
    let action = wards_action();
    for (i, signal) in signals.iter().enumerate() {
        // SAFETY: sigaction installs a handler that follows the C signal handler ABI (the entry stub, then
        // `on_signal`) and stores the old action in memory we own.
        let r = unsafe { real_sigaction(*signal, &action, &mut previous[i]) };
        if r != 0 {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL);
            // Put back what was there: no handler of ward's stays installed without its signal key.
            for (signal, old) in signals.iter().zip(&previous).take(i) {
                // SAFETY: `old` is what sigaction reported for that signal a moment ago.
                unsafe { real_sigaction(*signal, old, ptr::null_mut()) };
            }
            return Err(errno);
        }
    }
    for (signal, previous) in signals.iter().zip(previous) {
        remember_host_action(*signal, Some(previous));
    }
    Ok(Installed { signal_key })
}

/// ward's action for each of [`handled_signals`].
fn wards_action() -> libc::sigaction {
    // SAFETY: all-zero is a valid sigaction (no handler, empty mask, no flags).
    let mut action: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
    action.sa_sigaction = ward_mpk_signal_entry as *const () as usize;
    // SA_RESTART: the watchdog's signal may reach host code a late domain called out to; most of its system
    // calls then go on (those the kernel never restarts, such as poll, select and nanosleep, fail with EINTR,
    // as after any handled signal). Every signal is blocked while the handler runs: one delivered on top of it
    // before its first instructions have given it the signal key would have its frame written to the
    // alternate stack, tagged with that key, under the PKRU the kernel starts handlers with, which denies it,
    // and a kernel that writes frames under the thread's PKRU (the emulated machine's 6.1 does) then ends the
    // process with SIGSEGV. The watchdog's signal, queued every tick for a late thread, made that happen in
    // about half the runs of a test. `chain` gives a host's handler the mask it asked for.
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    // SAFETY: sa_mask is a valid sigset to fill.
    unsafe { libc::sigfillset(&mut action.sa_mask) };
    action
}

/// Ready this thread for gate calls: the handlers installed, an alternate signal stack tagged with the signal key,
/// this thread's host PKRU allowing the signal key (so a host fault here can still be delivered), and the timeout
/// signal unblocked (hosts often block every signal on their worker threads, and a deadline has to reach them).
/// Cheap after the first time on a thread.
fn prepare_thread() -> io::Result<()> {
    if ALT_STACK.with(|s| s.borrow().is_some()) {
        return Ok(());
    }
    let key = signal_key()?;
    adopt_host_handlers();
    unregister_rseq()?;
    let region = KeyedRegion::new(ALT_STACK_BYTES, key)?;
    let stack = libc::stack_t { ss_sp: region.start().cast(), ss_flags: 0, ss_size: region.len() };
    allow_on_this_thread(key);
    // SAFETY: the stack is a live mapping this thread keeps (ALT_STACK) until it ends, when AltStack's drop
    // unregisters it before unmapping it.
    if unsafe { libc::sigaltstack(&stack, ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    ALT_STACK.with(|s| *s.borrow_mut() = Some(AltStack { _mapping: region }));
    // SAFETY: unblocking one signal on this thread, whose handler (ward's) is installed, with a valid set.
    unsafe {
        let mut timeout = MaybeUninit::<libc::sigset_t>::zeroed().assume_init();
        libc::sigemptyset(&mut timeout);
        libc::sigaddset(&mut timeout, timeout_signal());
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &timeout, ptr::null_mut());
    }
    Ok(())
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
    let Some((offset, size)) = thread_block::rseq_area() else {
        return Ok(());
    };
    let area = thread_block::host_thread_pointer().wrapping_add_signed(offset);
    // A thread may have none: glibc registers a new thread's area only when the thread that created it had one,
    // and a thread that has called a domain has given its own up. Its `cpu_id` (the second word) is then negative.
    // SAFETY: the area lies in this thread's control block, host memory this thread reads.
    let cpu_id = unsafe { ((area + 4) as *const i32).read_volatile() };
    if cpu_id < 0 {
        return Ok(());
    }
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
pub fn allow_on_this_thread(key: u32) {
    set_this_thread(Pkru::current().allow(key));
}

/// Make `pkru` this thread's PKRU; only ever to widen the host's rights to keys ward allocated.
fn set_this_thread(pkru: Pkru) {
    // SAFETY: WRPKRU (ecx = edx = 0) only widens this thread's rights to keys ward allocated; it touches no memory.
    // The compiler may not move memory accesses across it (no `nomem`).
    unsafe {
        std::arch::asm!("wrpkru", in("eax") pkru.0, in("ecx") 0u32, in("edx") 0u32, options(nostack, preserves_flags))
    };
}

/// Whether a domain may be entered, and closing it: what a thread recovering a domain that other threads may be
/// running in needs before it puts the domain's memory back or lets it go.
///
/// Each call records the epoch it was made in. [`Occupancy::close`] moves the epoch on: from then no call made
/// before goes into the domain's code, or back into it from a call out to the host (the gate's entry and the
/// outward stub's way back in compare the epochs and end the call there, as a fault would); a thread running the
/// domain's code just then is sent an eviction (the timeout signal, see `watchdog::evict`), which ends its call
/// the same way; `close` returns once none is left in the domain's code. A thread that is out in the host stays
/// there undisturbed, and its call ends when it comes back.
#[derive(Debug, Default)]
pub struct Occupancy {
    epoch: AtomicU64,
}

/// One thread's presence in one domain, for a thread closing the domain to look at.
#[derive(Debug)]
pub struct Occupant {
    tid: libc::pid_t,
    /// 1 while the thread runs the domain's code: from the gate's entry to its way out or its resume path, less
    /// its calls out to the host. (Only one activation of a thread runs at a time, so one word does for nested
    /// calls.) Written by the gate and the outward stubs.
    running: AtomicU64,
}

/// How long [`Occupancy::close`] waits for threads to leave a domain before it says so in the log (it goes on
/// waiting: restoring the memory under a thread still running there would corrupt the new incarnation).
const CLOSE_WARN_AFTER: std::time::Duration = std::time::Duration::from_secs(5);
/// How long [`Occupancy::close`] waits before it sends a thread that has not left another eviction.
const EVICT_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(10);

impl Occupancy {
    /// The epoch calls made now are made in.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Closes the domain to every call made before (see [`Occupancy`]) and waits until none of `occupants` (every
    /// thread that has entered the domain) is running its code.
    pub fn close<'a>(&self, occupants: impl Iterator<Item = &'a Occupant> + Clone) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        // The gate marks a thread running with a plain store, then reads the epoch, and this thread stores the
        // epoch, then reads the marks: without a barrier on both sides each could miss the other's store. The
        // barrier on the gate's side is this system call, which makes every thread of the process execute one
        // (a closing is rare, a gate crossing is not).
        if let Err(e) = process_barrier() {
            tracing::warn!(
                "mpk: membarrier failed while closing a domain ({e}); a thread entering it just now may be missed"
            );
        }
        let started = std::time::Instant::now();
        let mut evicted_at: Option<std::time::Instant> = None;
        let mut warned = false;
        for round in 0u32.. {
            let running: Vec<&Occupant> = occupants.clone().filter(|o| o.is_running()).collect();
            if running.is_empty() {
                return;
            }
            // One eviction each, and again now and then for a thread that has not left (it may have had the
            // signal blocked, or been between its mark and its gate's span when the first came).
            if evicted_at.is_none_or(|at| at.elapsed() >= EVICT_AGAIN_AFTER) {
                for occupant in &running {
                    occupant.evict();
                }
                evicted_at = Some(std::time::Instant::now());
            }
            if !warned && started.elapsed() > CLOSE_WARN_AFTER {
                tracing::warn!("a thread is still running in a failed mpk domain after an eviction; waiting for it");
                warned = true;
            }
            // Waiting for other threads' signal handlers to take them out: a handler runs within microseconds, so
            // the processor is given up at first, and only then does this thread sleep between looks.
            if round < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
    }
}

impl Occupant {
    /// This thread's.
    pub fn for_this_thread() -> Occupant {
        // SAFETY: gettid has no preconditions.
        Occupant { tid: unsafe { libc::gettid() }, running: AtomicU64::new(0) }
    }

    /// Whether its thread is running the domain's code.
    fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst) != 0
    }

    /// Sends its thread an eviction.
    fn evict(&self) {
        if let Err(e) = watchdog::evict(self.tid) {
            tracing::debug!("mpk: cannot evict thread {} from a closed domain: {e}", self.tid);
        }
    }
}

/// Where a call into a domain records itself: the domain's [`Occupancy`] and this thread's [`Occupant`] there.
#[derive(Clone, Copy)]
pub struct Presence<'a> {
    pub occupancy: &'a Occupancy,
    pub occupant: &'a Occupant,
    /// The epoch the call was made in ([`Occupancy::epoch`] when it was prepared).
    pub epoch: u64,
}

/// `membarrier(2)` commands.
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Readies this process for [`Occupancy::close`]'s barrier (registers it for private expedited `membarrier`, once);
/// an error when the kernel cannot (before Linux 4.14).
pub fn closing_ready() -> io::Result<()> {
    static REGISTERED: OnceLock<Result<(), i32>> = OnceLock::new();
    let registered = REGISTERED.get_or_init(|| {
        // SAFETY: membarrier takes integers only; registering changes nothing but what the process may ask later.
        let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOSYS))
        }
    });
    registered.map_err(io::Error::from_raw_os_error)
}

/// A full memory barrier executed by every running thread of this process, as far as memory order goes.
fn process_barrier() -> io::Result<()> {
    closing_ready()?;
    // SAFETY: as above; the process is registered.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The epoch word of calls made with no [`Presence`]: never closed.
static NEVER_CLOSED: AtomicU64 = AtomicU64::new(0);

/// Call `func` inside a domain: on the stack whose top is `stack_top`, with `rights` as PKRU and `thread_pointer`
/// as the FS base (this thread's block in the domain, see `thread_block`), for at most `deadline` of time. With a
/// `presence`, the call is recorded in it, and a call made in an epoch since closed ends without going in.
///
/// Returns what it returned, or the fault it raised (a call past its deadline: [`timeout_signal`] with code
/// `SI_QUEUE`, from the [`watchdog`]); either way the thread is back in the host with the host's PKRU. Only on a
/// machine with PKU.
///
/// # Safety
/// `func` is a System V function taking only register-passed scalars valid in `args` (as for
/// [`ward_abi::call_native`]) that neither unwinds nor leaves by `longjmp`; `stack_top` is the 16-byte aligned top of
/// a stack `rights` lets it write, used by no other call in progress; `thread_pointer` is a thread block this thread
/// was given by the domain's `ThreadBlocks`, alive for the whole call; a `presence`'s occupant is this thread's.
#[allow(clippy::too_many_arguments)]
pub unsafe fn call(
    func: *const c_void,
    args: &RegArgs,
    rights: Pkru,
    stack_top: *mut u8,
    deadline: Option<std::time::Duration>,
    thread_pointer: usize,
    float_control: &FloatControl,
    presence: Option<Presence<'_>>,
) -> io::Result<Result<RegRet, GateFault>> {
    prepare_thread()?;
    // A nested call's deadline replaces its caller's for its own time; the caller's is put back after it.
    let outer_deadline = deadline.map(watchdog::arm).transpose()?;
    // The host's rights on this thread must cover the domain's memory: the outward stub reads the arguments the
    // domain left on its stack with them, and the host copies into and out of domain memory.
    let host = Pkru::current();
    let widened = host.allowing_writes_of(rights);
    if widened != host {
        set_this_thread(widened);
    }
    let below = ACTIVE.with(Cell::get);
    // A call into the domain that has called out to the host running it continues that domain's thread of
    // control, as in a process of its own: it starts with the floating-point control the domain had when it called
    // out, and leaves it what it ends with.
    // SAFETY: a non-null ACTIVE is this thread's live activation, in host memory.
    let same_domain_below =
        unsafe { below.as_ref() }.filter(|b| b.outside != 0 && b.domain_pkru == u64::from(rights.0)).is_some();
    let domain_float = if same_domain_below {
        // SAFETY: as above; the outward stub stored the domain's control there when it called out.
        unsafe { FloatState { mxcsr: (*below).domain_mxcsr, x87_control: (*below).domain_x87_control as u16 } }
    } else {
        float_control.get()
    };
    let mut frame = GateFrame {
        func,
        ints: args.ints,
        floats: args.floats,
        ret_int: 0,
        ret_float: 0,
        domain_pkru: u64::from(rights.0),
        host_pkru: 0,
        // Below the words an outward stub copies from above its caller's return address.
        stack_top: (stack_top as u64).wrapping_sub(OUTWARD_STACK_WORDS as u64 * 8),
        host_rsp: 0,
        outside: 0,
        domain_rsp_out: 0,
        inside: 0,
        fault: GateFault {
            signal: 0,
            code: 0,
            addr: 0,
            pc: 0,
            refused_slot: 0,
            refusal_code: 0,
            ending_kind: 0,
            ending_status: 0,
        },
        domain_fs: thread_pointer as u64,
        host_fs: 0,
        below,
        host_mxcsr: 0,
        host_x87_control: 0,
        domain_mxcsr: domain_float.mxcsr,
        domain_x87_control: u32::from(domain_float.x87_control),
        epoch_at: presence.map_or(&NEVER_CLOSED, |p| &p.occupancy.epoch),
        epoch: presence.map_or(0, |p| p.epoch),
        running_at: ptr::null(),
        own_running: 0,
    };
    let frame_ptr: *mut GateFrame = &mut frame;
    // SAFETY: frame_ptr is the live frame above; the field's address is taken through it, as the assembly uses it.
    unsafe {
        (*frame_ptr).running_at = match presence {
            Some(p) => &p.occupant.running,
            None => ptr::addr_of!((*frame_ptr).own_running).cast(),
        };
    }
    ACTIVE.with(|a| a.set(frame_ptr));
    // SAFETY: the frame is live for the whole call and has the layout the assembly reads (checked above); the gate
    // saves and restores every callee-saved register and the stack pointer, on both its paths, so to Rust it is an
    // ordinary C function. The call of `func` on the domain's stack is sound by the caller's guarantee, and a fault
    // in it comes back through the resume path, which the handler only takes for this activation.
    let status = unsafe { ward_mpk_gate(frame_ptr) };
    if let Some(outer) = outer_deadline {
        watchdog::restore(outer);
    }
    ACTIVE.with(|a| a.set(below));
    // SAFETY: the gate and the handler are done with the frame; reading it through the pointer they used keeps
    // the compiler from assuming it unchanged.
    let frame = unsafe { ptr::read_volatile(frame_ptr) };
    Ok(match status {
        0 => {
            if same_domain_below {
                // SAFETY: the activation below is live and this thread's; the outward stub's way back into the
                // domain loads the control from these two fields.
                unsafe {
                    (*below).domain_mxcsr = frame.domain_mxcsr;
                    (*below).domain_x87_control = frame.domain_x87_control;
                }
            }
            // The x87 control word is the low half of what `fnstcw` stored.
            float_control.set(FloatState { mxcsr: frame.domain_mxcsr, x87_control: frame.domain_x87_control as u16 });
            Ok(RegRet { int: frame.ret_int, float: frame.ret_float })
        }
        _ => Err(frame.fault),
    })
}

/// Floating-point control state: MXCSR (rounding, flush-to-zero, denormals-are-zero, exception masks and flags)
/// and the x87 control word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloatState {
    pub mxcsr: u32,
    pub x87_control: u16,
}

impl FloatState {
    /// MXCSR's exception flags (sticky status, not control).
    const MXCSR_FLAGS: u32 = 0x3f;

    /// What a process starts with on x86-64 Linux: every exception masked, round to nearest, no flush to zero;
    /// x87 at extended precision.
    #[cfg(test)]
    pub const INITIAL: FloatState = FloatState { mxcsr: 0x1f80, x87_control: 0x037f };

    /// This thread's state now, without MXCSR's exception flags.
    pub fn of_this_thread() -> FloatState {
        let mut mxcsr = 0u32;
        let mut x87_control = 0u16;
        // SAFETY: both instructions only store the current control state into the two locals.
        unsafe {
            std::arch::asm!(
                "stmxcsr dword ptr [{m}]",
                "fnstcw word ptr [{c}]",
                m = in(reg) &mut mxcsr,
                c = in(reg) &mut x87_control,
                options(nostack, preserves_flags),
            )
        };
        FloatState { mxcsr: mxcsr & !Self::MXCSR_FLAGS, x87_control }
    }

    const fn pack(self) -> u64 {
        // Widening casts (`From` is not const).
        self.mxcsr as u64 | (self.x87_control as u64) << 32
    }

    fn unpack(word: u64) -> FloatState {
        FloatState { mxcsr: word as u32, x87_control: (word >> 32) as u16 }
    }
}

/// A domain's floating-point control state, which it keeps from call to call as it would in a process of its own,
/// while the host keeps its own: the gate loads it on entry and saves what the domain leaves.
#[derive(Debug)]
pub struct FloatControl(AtomicU64);

impl FloatControl {
    pub const fn new(state: FloatState) -> FloatControl {
        FloatControl(AtomicU64::new(state.pack()))
    }

    pub fn get(&self) -> FloatState {
        FloatState::unpack(self.0.load(Ordering::Relaxed))
    }

    pub fn set(&self, state: FloatState) {
        self.0.store(state.pack(), Ordering::Relaxed);
    }
}

/// Eightbytes of stack arguments an outward stub passes on to its host function: sixteen, so a call with up to
/// 22 integer arguments, or a printf with that many, arrives whole. The gate keeps that much of the top of the
/// domain's stack unused, so the copy never reads past it.
const OUTWARD_STACK_WORDS: usize = 16;
// The copy keeps the host stack 16-byte aligned.
const _: () = assert!(OUTWARD_STACK_WORDS.is_multiple_of(2));

/// Number of distinct outward entry points (host functions a domain may be handed at once).
pub const OUTWARD_SLOTS: usize = 1024;
/// Bytes between consecutive outward stubs (a 6-byte `mov r11d, imm32` and a jump of at most 5, padded).
const OUTWARD_STRIDE: usize = 16;

/// The host function behind each outward stub (0: none). Host memory: a domain reads it, never writes it.
static OUTWARD_TARGETS: [AtomicUsize; OUTWARD_SLOTS] = [const { AtomicUsize::new(0) }; OUTWARD_SLOTS];

extern "C" {
    /// Start of the outward stubs; only its address is used.
    fn ward_mpk_outward_stubs();
}

/// This thread's newest activation: the gate's way back to its frame when the domain returns. Called on the
/// domain's stack with the domain's rights: it only reads.
extern "C" fn current_activation() -> *mut GateFrame {
    ACTIVE.with(Cell::get)
}

/// The activation this thread is running a domain in, or null when it is not inside one. Called by the outward
/// stubs on the domain's stack with the domain's rights: it only reads.
extern "C" fn current_activation_inside() -> *mut GateFrame {
    let frame = ACTIVE.with(Cell::get);
    // SAFETY: a non-null ACTIVE is this thread's live activation.
    if frame.is_null() || unsafe { (*frame).outside != 0 || (*frame).inside == 0 } {
        return ptr::null_mut();
    }
    frame
}

/// A function pointer to hand a domain in place of `target`: called from inside a domain it runs `target` in the
/// host (the host's rights, on the host's stack, every argument register passed through) and returns its `rax`
/// and `xmm0` to the domain; called from the host it is a plain call. None when `slot` is out of range.
///
/// # Safety
/// `target` must be a System V function taking register-passed arguments and at most [`OUTWARD_STACK_WORDS`]
/// eightbytes of stack-passed ones (it is called with whatever the domain passes) that returns normally, and stay
/// valid while any domain may call the stub.
pub unsafe fn outward_stub(slot: usize, target: *const c_void) -> Option<*const c_void> {
    let cell = OUTWARD_TARGETS.get(slot)?;
    cell.store(target as usize, Ordering::Release);
    let base = ward_mpk_outward_stubs as *const u8;
    Some(base.wrapping_add(slot * OUTWARD_STRIDE).cast())
}

/// The outward stub for `target`, shared by every domain: the first request for a target takes the next free slot,
/// which keeps it for the life of the process (targets are the host's library functions and callback entries, a
/// bounded set). None when every slot is taken.
pub fn outward_for(target: *const c_void) -> Option<*const c_void> {
    outward_for_checked(target, None)
}

/// The outward stub for `target`, as [`outward_for`] gives it, with `check` run on the arguments of every call made
/// through it from inside a domain (see `checks`). Every request for one target must bring the same check (the
/// imports of one function under its names, `getc` and `_IO_getc`, do).
// `target` is not dereferenced here: the stub jumps to it when a domain calls the stub. The callers are the mpk
// backend's binding of imports and callbacks, which pass only host functions that stay loaded (see the SAFETY
// comment below); making this `unsafe` would move that promise to their call sites.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn outward_for_checked(target: *const c_void, check: Option<&'static GateCheck>) -> Option<*const c_void> {
    static BY_TARGET: std::sync::Mutex<Option<std::collections::HashMap<usize, usize>>> = std::sync::Mutex::new(None);
    let mut table = BY_TARGET.lock().unwrap_or_else(|e| e.into_inner());
    let table = table.get_or_insert_with(std::collections::HashMap::new);
    let slot = match table.get(&(target as usize)) {
        Some(&slot) => slot,
        None => {
            let slot = table.len();
            if slot >= OUTWARD_SLOTS {
                return None;
            }
            table.insert(target as usize, slot);
            slot
        }
    };
    let check = check.map_or(ptr::null(), |c| c as *const GateCheck);
    OUTWARD_CHECKS.get(slot)?.store(check.cast_mut(), Ordering::Release);
    // SAFETY: targets handed here are host functions that stay loaded for the life of the process (libc's, and
    // ward_abi's callback stubs), taking register arguments and returning normally.
    unsafe { outward_stub(slot, target) }
}

/// The argument check behind each outward stub (null: none). Host memory: a domain reads it, never writes it.
static OUTWARD_CHECKS: [AtomicPtr<GateCheck>; OUTWARD_SLOTS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; OUTWARD_SLOTS];

/// Where an outward stub's caller's stack arguments begin, from its saved argument image: the image (120 bytes),
/// the six saved registers (48) and the return address (8).
const STACK_ARGUMENTS_AT: usize = 176;

/// Called by an outward stub, inside the domain (its stack, its rights), before it leaves: runs the slot's argument
/// check. A pointer the domain could not use faults in here, as the domain's; a refusal traps at
/// `ward_mpk_refuse`. Returns when the call may go on.
extern "C" fn check_outward_arguments(slot: usize, image: *const u64) {
    // Each stub loads its own slot; a faulty domain that jumped into the common body past one carries any number,
    // which must not pick the host code to run.
    if OUTWARD_TARGETS.get(slot).is_none_or(|target| target.load(Ordering::Acquire) == 0) {
        // SAFETY: as below; a trap without a refusal is an illegal instruction of the domain's.
        unsafe { ward_mpk_refuse(slot, 0) }
    }
    let Some(cell) = OUTWARD_CHECKS.get(slot) else {
        return;
    };
    // SAFETY: non-null entries are `&'static GateCheck`s stored by `outward_for_checked`.
    let Some(check) = (unsafe { cell.load(Ordering::Acquire).as_ref() }) else {
        return;
    };
    // SAFETY: `image` is the stub's saved argument image on the domain's stack: six integer registers, then the low
    // halves of eight vector registers.
    let (ints, floats) =
        unsafe { (ptr::read(image.cast::<[u64; 6]>()), ptr::read(image.wrapping_add(6).cast::<[u64; 8]>())) };
    let arguments = Arguments {
        ints,
        floats,
        stack: (image as usize).wrapping_add(STACK_ARGUMENTS_AT),
        stack_words: OUTWARD_STACK_WORDS,
    };
    if let Err(why) = checks::run(check, &arguments, &mut Touch) {
        // SAFETY: the trap ends the call at the gate (the handler knows its address); nothing here continues.
        unsafe { ward_mpk_refuse(slot, why as u64) }
    }
}

/// The refusal a trap at `ward_mpk_refuse` carries.
fn refusal(slot: usize, code: u64) -> Option<Refused> {
    let why = Refusal::from_code(code)?;
    // SAFETY: non-null entries are `&'static GateCheck`s stored by `outward_for_checked`.
    let check = unsafe { OUTWARD_CHECKS.get(slot)?.load(Ordering::Acquire).as_ref()? };
    Some(Refused { function: check.name, why })
}

/// Where a call into the domain whose stack is `stack` should put its stack when this thread is in a call out of
/// that domain, directly (A, then the host, then A) or with other domains' calls in between (A, B, then A): below
/// the part of the stack the latest such call was using (and its red zone), 16-byte aligned. None when no call of
/// this thread is out of that domain.
pub fn nested_stack_top(stack: std::ops::Range<usize>) -> Option<*mut u8> {
    let mut frame = ACTIVE.with(Cell::get);
    // SAFETY: a non-null ACTIVE is this thread's live activation, and each `below` the live one it interrupted
    // (each `call` puts the one it replaced back before it returns).
    while let Some(f) = unsafe { frame.as_ref() } {
        if f.outside != 0 && stack.contains(&(f.domain_rsp_out as usize)) {
            let top = (f.domain_rsp_out as usize).saturating_sub(128) & !15;
            return stack.contains(&top.wrapping_sub(1)).then_some(top as *mut u8);
        }
        frame = f.below;
    }
    None
}

/// The Rust half of the fault handler (after `ward_mpk_signal_entry`).
extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let frame = ACTIVE.with(Cell::get);
    // SAFETY: the kernel passes a valid siginfo.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // SAFETY: a non-null ACTIVE is this thread's live activation (see `call`), in host memory.
    let (inside, outside) = unsafe { frame.as_ref().map_or((false, false), |f| (f.inside != 0, f.outside != 0)) };
    let ours = if signal == timeout_signal() {
        // SAFETY: the kernel passes a valid siginfo.
        let queued = unsafe { &*info };
        if watchdog::is_eviction(queued) {
            // A closing thread's: this call's domain was closed while it ran (see `Occupancy`). One that finds the
            // thread in another domain's call, or out in the host, is not for it: dropped.
            // SAFETY: a non-null ACTIVE is this thread's live activation; its epoch word outlives it (the domain's,
            // held by the caller of `call`, or NEVER_CLOSED).
            let closed =
                unsafe { frame.as_ref() }.is_some_and(|f| unsafe { (*f.epoch_at).load(Ordering::SeqCst) } != f.epoch);
            inside && !outside && closed
        } else if watchdog::from_watchdog(queued) {
            watchdog::heard();
            // The watchdog's. While the domain is calling the host, the host's code is not interrupted; the domain
            // is, once it is back (the watchdog sends the signal again every tick while the deadline stays passed).
            // One that arrives after its call is over, or early for the next call, is stale: dropped.
            inside && !outside && watchdog::passed()
        } else {
            // Sent by someone else, the host itself included: not ward's.
            chain(signal, info, context);
            return;
        }
    } else {
        // Raised by the processor (code > 0) in the domain's span of its gate call.
        code > 0 && inside && !outside
    };
    if !ours {
        if signal != timeout_signal() {
            chain(signal, info, context);
        }
        return;
    }
    let uc = context.cast::<libc::ucontext_t>();
    // SAFETY: the kernel passes this thread's interrupted context; `frame` is this thread's live activation, in
    // host memory the handler may write, and the interrupted code lies in the span the gate marked inside, where
    // its resume path is safe to take.
    unsafe {
        let gregs = &mut (*uc).uc_mcontext.gregs;
        let pc = gregs[libc::REG_RIP as usize] as usize;
        // A trap at one of ward's two known addresses carries its words in the first two argument registers.
        let arguments = (gregs[libc::REG_RDI as usize] as u64, gregs[libc::REG_RSI as usize] as u64);
        let trapped_at = |at: usize| signal == libc::SIGILL && pc == at;
        let (refused_slot, refusal_code) = if trapped_at(ward_mpk_refuse as *const () as usize) {
            (arguments.0 as usize, arguments.1)
        } else {
            (0, 0)
        };
        let (ending_kind, ending_status) =
            if trapped_at(ward_mpk_end as *const () as usize) { arguments } else { (0, 0) };
        (*frame).fault = GateFault { signal, code, addr, pc, refused_slot, refusal_code, ending_kind, ending_status };
        gregs[libc::REG_RIP as usize] = ward_mpk_gate_resume as *const () as i64;
        gregs[libc::REG_RBX as usize] = frame as i64;
    }
}

/// Ends the domain's call on this thread as the domain asking to end the process: `kind` (nonzero) and `status`
/// come back in the fault ([`GateFault::ending`]). For the domain runtime, running inside the domain.
pub fn end_call(kind: u64, status: i32) -> ! {
    // SAFETY: the trap raises SIGILL at a known address; the handler takes the thread back to its gate (the
    // runtime calls this only inside a domain's call).
    unsafe { ward_mpk_end(kind, status as u32 as u64) }
}

/// Hand a signal that is not a domain's to what the host had installed.
fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    if let Some(host) = host_action(signal) {
        run_host_action(&host, signal, info, context);
    }
}

/// Do what the host's `previous` action for `signal` says, from inside a handler of ward's.
fn run_host_action(previous: &libc::sigaction, signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    if previous.sa_flags & libc::SA_RESETHAND != 0 {
        // As the kernel does for the host's own handler: the next such signal gets the default action.
        if let Some(cell) = host_action_cell(signal) {
            cell.store(ptr::addr_of!(DEFAULT_ACTION).cast_mut(), Ordering::Release);
        }
    }
    match previous.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // The default action (end the process, with a core where the signal has one), as without ward.
            // SAFETY: restoring the default disposition and re-raising is async-signal-safe; all-zero is a valid
            // sigaction (SIG_DFL, empty mask, no flags).
            unsafe {
                let default: libc::sigaction = MaybeUninit::zeroed().assume_init();
                real_sigaction(signal, &default, ptr::null_mut());
                libc::raise(signal);
            }
        }
        handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            unblock_as_the_host_asked(signal, previous, context);
            // SAFETY: the host installed this address as an SA_SIGINFO handler for this signal.
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
                unsafe { std::mem::transmute(handler) };
            handler(signal, info, context);
        }
        handler => {
            unblock_as_the_host_asked(signal, previous, context);
            // SAFETY: the host installed this address as a plain handler for this signal.
            let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            handler(signal);
        }
    }
}

/// The signal mask the kernel would have given the host's own handler: the interrupted code's, plus the handler's
/// `sa_mask`, plus the signal itself unless `SA_NODEFER`. (Returning from ward's handler restores the interrupted
/// code's mask whatever this sets.)
fn unblock_as_the_host_asked(signal: libc::c_int, previous: &libc::sigaction, context: *mut c_void) {
    let uc = context.cast::<libc::ucontext_t>();
    // SAFETY: the kernel passed this thread's interrupted context; sigset operations on valid sets and
    // pthread_sigmask are async-signal-safe.
    unsafe {
        let mut mask = (*uc).uc_sigmask;
        for other in 1..=libc::SIGRTMAX() {
            if libc::sigismember(&previous.sa_mask, other) == 1 {
                libc::sigaddset(&mut mask, other);
            }
        }
        if previous.sa_flags & libc::SA_NODEFER == 0 {
            libc::sigaddset(&mut mask, signal);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, ptr::null_mut());
    }
}

/// The host's own action for each signal ward has taken over, by signal number (null: not taken over): those it
/// handles, and those whose host handler it wraps. An entry is replaced, never freed, so a handler can read it
/// without a lock: hosts change their handlers a handful of times.
static HOST_ACTIONS: [AtomicPtr<libc::sigaction>; 65] = [const { AtomicPtr::new(ptr::null_mut()) }; 65];

/// The default action (SIG_DFL, empty mask, no flags), for a host action that asked to be reset once it has run.
/// Never written.
// SAFETY: all-zero is a valid sigaction.
static DEFAULT_ACTION: libc::sigaction = unsafe { std::mem::zeroed() };

/// The entry of [`HOST_ACTIONS`] for `signal`, if it is a signal number.
fn host_action_cell(signal: libc::c_int) -> Option<&'static AtomicPtr<libc::sigaction>> {
    HOST_ACTIONS.get(usize::try_from(signal).ok()?)
}

/// The host's action for `signal`, if ward has taken the signal over. Async-signal-safe.
fn host_action(signal: libc::c_int) -> Option<libc::sigaction> {
    let cell = host_action_cell(signal)?;
    // SAFETY: non-null entries are leaked boxes that are never freed (see HOST_ACTIONS).
    unsafe { cell.load(Ordering::Acquire).as_ref() }.copied()
}

/// Records `action` as the host's for `signal` (None: ward no longer has the signal).
fn remember_host_action(signal: libc::c_int, action: Option<libc::sigaction>) {
    if let Some(cell) = host_action_cell(signal) {
        cell.store(action.map_or(ptr::null_mut(), |a| Box::into_raw(Box::new(a))), Ordering::Release);
    }
}

extern "C" {
    /// glibc's `sigaction` under its other exported name, which a host's (or ward-preload's) `sigaction` does not
    /// interpose: ward's own changes must reach the kernel.
    fn __sigaction(signal: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int;
}

/// `sigaction` itself, past any interposer.
///
/// # Safety
/// As `sigaction`'s: `act` and `old` are null or valid, and a handler installed follows the C signal handler ABI.
unsafe fn real_sigaction(signal: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int {
    // SAFETY: the caller's guarantee.
    unsafe { __sigaction(signal, act, old) }
}

/// The entry ward wraps host handlers in (what the kernel has installed for a wrapped signal).
#[cfg(test)]
pub fn host_signal_entry() -> libc::sighandler_t {
    ward_mpk_host_signal_entry as *const () as libc::sighandler_t
}

/// `sigaction` as the host sees it once ward's handlers are in (what ward-preload's `sigaction` calls): for a
/// signal ward handles, the host's action is recorded for ward to chain to and ward's handler stays; a host handler
/// for any other signal is wrapped ([`adopt_host_handlers`]); either way `old` reports the host's own previous
/// action, never ward's. Before ward's handlers are in, and for SIGKILL and SIGSTOP, it is plain `sigaction`.
///
/// # Safety
/// As `sigaction`'s.
pub unsafe fn host_sigaction(
    signal: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    let taken_over = matches!(INSTALLED.get(), Some(Ok(_)))
        && signal != libc::SIGKILL
        && signal != libc::SIGSTOP
        && signal != GLIBC_SETXID
        && (1..=libc::SIGRTMAX()).contains(&signal);
    if !taken_over {
        // SAFETY: the caller's guarantee.
        return unsafe { real_sigaction(signal, act, old) };
    }
    let previous = match host_action(signal) {
        Some(previous) => previous,
        None => {
            // SAFETY: all-zero is a valid sigaction, overwritten by the query.
            let mut current: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
            // SAFETY: a query into memory we own.
            if unsafe { real_sigaction(signal, ptr::null(), &mut current) } != 0 {
                return -1;
            }
            current
        }
    };
    // SAFETY: the caller passes null or a valid action.
    if let Some(act) = unsafe { act.as_ref() } {
        let handler = act.sa_sigaction;
        if handled_signals().contains(&signal) {
            remember_host_action(signal, Some(*act));
        } else if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            // SAFETY: the caller's guarantee.
            if unsafe { real_sigaction(signal, act, ptr::null_mut()) } != 0 {
                return -1;
            }
            remember_host_action(signal, None);
        } else {
            wrap_host_action(signal, act);
        }
    }
    // SAFETY: the caller passes null or memory for one sigaction.
    if let Some(old) = unsafe { old.as_mut() } {
        *old = previous;
    }
    0
}

/// Wraps every handler the host has installed for a signal ward does not handle, so that it runs with the host's
/// rights wherever the signal finds the thread; and puts ward's own handler back where the host replaced it, passing
/// the host's signals on to the host's (a domain's faults would otherwise reach the host's handler).
///
/// The kernel starts a handler with its initial PKRU, which allows key 0 only. A host handler that the signal finds
/// inside a domain would run on the domain's stack, which that PKRU denies; one installed with `SA_ONSTACK` runs on
/// ward's alternate stack, tagged with the signal key, which it denies too. Either way its first push faults and
/// the process dies (or, on kernels that write signal frames with every key allowed, the fault is taken for the
/// domain's). Wrapped, the signal goes to ward's alternate stack (written under the interrupted code's PKRU, which
/// allows the signal key in the host and in every domain); ward's entry allows every key, marks the thread outside
/// its domain (a fault in the host's handler is the host's, and the watchdog leaves it alone) and runs the host's
/// action with the mask it asked for. `sigaction` then reports ward's entry for those signals; a handler the host
/// installs later is wrapped at the next domain load or the next thread's first gate call, or at once when it goes
/// through `ward-preload`'s `sigaction`. glibc's own two signals cannot be changed through `sigaction`; its set-id
/// signal is wrapped past it ([`adopt_glibc_setxid_handler`]), its cancellation signal stays as it is.
pub fn adopt_host_handlers() {
    if !matches!(INSTALLED.get(), Some(Ok(_))) {
        return;
    }
    adopt_glibc_setxid_handler();
    for signal in 1..=libc::SIGRTMAX() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: all-zero is a valid sigaction, overwritten by the query.
        let mut current: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
        // SAFETY: querying the action only, into memory we own.
        if unsafe { real_sigaction(signal, ptr::null(), &mut current) } != 0 {
            continue;
        }
        let handler = current.sa_sigaction;
        if handled_signals().contains(&signal) {
            if handler != ward_mpk_signal_entry as *const () as usize {
                // The host put its own in ward's place: ward's goes back, and passes the host's signals to it.
                remember_host_action(signal, Some(current));
                // SAFETY: ward's action, as `install` made it.
                unsafe { real_sigaction(signal, &wards_action(), ptr::null_mut()) };
            }
            continue;
        }
        if handler == libc::SIG_DFL
            || handler == libc::SIG_IGN
            || handler == ward_mpk_host_signal_entry as *const () as usize
        {
            continue;
        }
        wrap_host_action(signal, &current);
    }
}

/// glibc's set-id signal (the kernel's first real-time signal plus one): `setuid` and its kind in a multithreaded
/// process send it to every other thread, whose handler makes the same change for itself and counts down. The caller
/// waits until all have.
const GLIBC_SETXID: libc::c_int = 33;

/// The kernel's form of a signal action (`rt_sigaction`), which glibc's `sigaction` hides.
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelAction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// `rt_sigaction` itself, for the signals glibc's `sigaction` refuses.
///
/// # Safety
/// As `sigaction`'s: `act` and `old` are null or valid, and a handler installed follows the C signal handler ABI
/// and returns through `act.restorer`.
unsafe fn kernel_sigaction(signal: libc::c_int, act: *const KernelAction, old: *mut KernelAction) -> libc::c_long {
    // SAFETY: the caller's guarantee; the set size is the kernel's (64 signals).
    unsafe { libc::syscall(libc::SYS_rt_sigaction, signal, act, old, 8usize) }
}

/// Wraps glibc's handler of its set-id signal as [`wrap_host_action`] wraps a host's. A thread that `setuid` finds
/// inside a domain would otherwise run that handler on the domain's stack with the kernel's initial PKRU, and
/// through the domain's FS base: its first push faults, the fault is taken for the domain's, the handler never
/// counts down, and `setuid` waits for ever. Wrapped, it runs on ward's alternate stack with the host's rights and
/// thread pointer, as anywhere in the host.
fn adopt_glibc_setxid_handler() {
    let signal = GLIBC_SETXID;
    if signal >= libc::SIGRTMIN() {
        // Not glibc's reserved signal on this libc.
        return;
    }
    let mut current = KernelAction { handler: 0, flags: 0, restorer: 0, mask: 0 };
    // SAFETY: a query into memory we own.
    if unsafe { kernel_sigaction(signal, ptr::null(), &mut current) } != 0 {
        return;
    }
    let entry = ward_mpk_host_signal_entry as *const () as usize;
    if current.handler == libc::SIG_DFL || current.handler == libc::SIG_IGN || current.handler == entry {
        return;
    }
    // SAFETY: all-zero is a valid sigaction; sigemptyset and sigaddset write into it.
    let mut glibcs: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
    glibcs.sa_sigaction = current.handler;
    glibcs.sa_flags = current.flags as libc::c_int;
    // SAFETY: sa_mask is a valid set.
    unsafe { libc::sigemptyset(&mut glibcs.sa_mask) };
    for other in 1..=64 {
        if current.mask & (1u64 << (other - 1)) != 0 {
            // SAFETY: as above. glibc's sigaddset refuses its own two signals, so they stay out; a second set-id
            // signal cannot come while this one is handled (the caller holds glibc's lock until all have counted).
            unsafe { libc::sigaddset(&mut glibcs.sa_mask, other) };
        }
    }
    remember_host_action(signal, Some(glibcs));
    let flags = wrapped_flags(current.flags as libc::c_int) as u64;
    // Every signal blocked until the entry has allowed the keys, as for every wrapped handler; glibc's restorer kept.
    let wrapped = KernelAction { handler: entry, flags, restorer: current.restorer, mask: u64::MAX };
    // SAFETY: the entry follows the C signal handler ABI and returns through glibc's own restorer, which the kernel
    // reported for glibc's action; glibc's action is remembered above for the entry to run.
    unsafe { kernel_sigaction(signal, &wrapped, ptr::null_mut()) };
}

/// Installs ward's entry for `signal` in place of the host's `host` action, which it remembers and runs.
fn wrap_host_action(signal: libc::c_int, host: &libc::sigaction) {
    remember_host_action(signal, Some(*host));
    let mut action = *host;
    action.sa_sigaction = ward_mpk_host_signal_entry as *const () as usize;
    action.sa_flags = wrapped_flags(host.sa_flags);
    // SAFETY: sa_mask is a valid set to fill; the entry follows the C signal handler ABI (the stub, then
    // `on_host_signal`), and the host's action it replaces is remembered above.
    unsafe {
        libc::sigfillset(&mut action.sa_mask);
        real_sigaction(signal, &action, ptr::null_mut());
    }
}

/// The flags of ward's entry wrapping a handler installed with `flags`. The handler's own (SA_RESTART,
/// SA_RESETHAND, SA_NOCLDSTOP, ...) stand; the entry takes siginfo and ward's alternate stack, and never runs with
/// its signal unblocked: with a full mask, nothing interrupts it before it has allowed the keys, for the reason
/// `install` gives (`run_host_action` then applies the handler's own mask).
fn wrapped_flags(flags: libc::c_int) -> libc::c_int {
    (flags | libc::SA_SIGINFO | libc::SA_ONSTACK) & !libc::SA_NODEFER
}

/// The Rust half of a wrapped host handler (after `ward_mpk_host_signal_entry`, with every key allowed).
extern "C" fn on_host_signal(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let Some(host) = host_action(signal) else {
        return;
    };
    let frame = ACTIVE.with(Cell::get);
    // SAFETY: a non-null ACTIVE is this thread's live activation, in host memory; only this thread writes it, and
    // the code the signal interrupted is suspended until this handler returns.
    let was_outside = unsafe { frame.as_mut().map(|f| std::mem::replace(&mut f.outside, 1)) };
    run_host_action(&host, signal, info, context);
    if let Some(outside) = was_outside {
        // SAFETY: as above.
        unsafe { (*frame).outside = outside };
    }
}

#[cfg(test)]
mod tests;
