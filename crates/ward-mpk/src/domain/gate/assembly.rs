//! The gate's machine code: entering a domain and leaving it (`ward_mpk_gate` and its resume path), the signal
//! handlers' first instructions, the traps that end a call, and the outward stubs. Fields of [`GateFrame`] and the
//! other values it needs are named by the operands at the end.

use std::arch::global_asm;
use std::ffi::c_void;
use std::mem::offset_of;

use super::handlers::{on_signal, HANDLER_PKRU};
use super::host_signals::on_host_signal;
use super::outward::{
    check_outward_arguments, OUTWARD_SLOTS, OUTWARD_STACK_WORDS, OUTWARD_STRIDE, OUTWARD_TARGETS, STACK_ARGUMENTS_AT,
};
use super::{current_activation, current_activation_inside, GateFrame};
use crate::domain::thread_block;

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
    ward_abi::load_argument_registers!("\\base + \\offset"),
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
    ward_abi::store_argument_registers!("rsp"),
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
    pub(super) fn ward_mpk_gate(frame: *mut GateFrame) -> u64;
    pub(super) fn ward_mpk_gate_resume();
    pub(super) fn ward_mpk_signal_entry(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void);
    pub(super) fn ward_mpk_host_signal_entry(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void);
    /// Traps, with the slot and the refusal in the argument registers, for the handler to read.
    pub(super) fn ward_mpk_refuse(slot: usize, refusal: u64) -> !;
    /// Traps, with how the domain ends and its status in the argument registers, for the handler to read.
    pub(super) fn ward_mpk_end(kind: u64, status: u64) -> !;
}
