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
//!
//! # Where each part is
//!
//! Here: the frame, [`call`], how a call ends ([`GateFault`]) and the activation chain. `assembly`: the machine
//! code of the gate, the handler entries, the traps and the outward stubs. `outward`: the stubs' slot table and
//! argument checks. `handlers`: ward's fault handlers, installed and chained to the host's. `host_signals`:
//! `sigaction`, `signal`, `sysv_signal` and `sigset` as the host sees them. `occupancy`: closing a domain.
//! `float`: floating-point control.

use std::cell::Cell;
use std::ffi::c_void;
use std::io;
use std::mem::offset_of;
use std::ptr;
use std::sync::atomic::AtomicU64;

use ward_abi::{RegArgs, RegRet};

use self::assembly::{ward_mpk_end, ward_mpk_gate};
use self::handlers::prepare_thread;
use self::occupancy::NEVER_CLOSED;
use self::outward::{refusal, OUTWARD_STACK_WORDS};
use super::checks::Refusal;
use super::pku::{self, Pkru};
use super::watchdog;

mod assembly;
mod float;
mod handlers;
mod host_signals;
mod occupancy;
mod outward;

pub use self::float::{FloatControl, FloatState};
pub use self::handlers::{signal_key, timeout_signal};
#[cfg(test)]
pub use self::host_signals::host_signal_entry;
pub use self::host_signals::{
    adopt_host_handlers, host_sigaction, host_signal, host_sigset, host_sysv_signal, SIG_HOLD,
};
pub use self::occupancy::{closing_ready, Occupancy, Occupant, Presence};
pub use self::outward::{outward_for, outward_for_checked, outward_stub, OUTWARD_SLOTS};

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
    fault: Caught,
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

/// How a call into a domain ended when it did not return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateFault {
    /// A signal ended it: one the processor raised in the domain's code, or [`timeout_signal`], sent by the
    /// [`watchdog`] past the call's deadline (code `SI_QUEUE`) or by a thread closing the domain.
    Signal(SignalFault),
    /// An outward stub's argument check refused a call the domain made to the host.
    Refused(RefusedCall),
    /// The domain asked to end the process: the runtime's `exit` or `abort` ([`end_call`]).
    Ended(Ending),
    /// The gate ended it without a signal: the domain was closed ([`Occupancy::close`]) since the call was made,
    /// and the call was about to go into it, or back into it from the host.
    Closed,
}

/// A signal that ended a call, as the handler saw it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalFault {
    pub signal: i32,
    /// `si_code`: for SIGSEGV, `SEGV_MAPERR`, `SEGV_ACCERR` or [`pku::SEGV_PKUERR`].
    pub code: i32,
    /// `si_addr`: the address accessed (SIGSEGV, SIGBUS) or the faulting instruction.
    pub addr: usize,
    /// The program counter at the fault.
    pub pc: usize,
}

impl SignalFault {
    /// A write or read of memory the domain's key rights forbid (host memory written, another domain touched).
    pub fn is_key_violation(&self) -> bool {
        self.signal == libc::SIGSEGV && self.code == pku::SEGV_PKUERR
    }
}

/// An outward call its argument check refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusedCall {
    /// The host function the domain called, as it imported it.
    pub function: &'static str,
    pub why: Refusal,
}

/// How the domain asked to end the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// `exit` (and its kind) with this status.
    Exit { status: i32 },
    /// `abort`.
    Abort,
}

impl Ending {
    /// The two words the trap at `ward_mpk_end` carries: a nonzero kind, and the status.
    fn words(self) -> (u64, u64) {
        match self {
            Ending::Exit { status } => (1, u64::from(status as u32)),
            Ending::Abort => (2, 0),
        }
    }

    fn from_words(kind: u64, status: u64) -> Option<Ending> {
        match kind {
            1 => Some(Ending::Exit { status: status as u32 as i32 }),
            2 => Some(Ending::Abort),
            _ => None,
        }
    }
}

/// What the signal handler records in the frame of the call it ends (signal 0 while it has recorded nothing: the
/// gate ended the call itself); made a [`GateFault`] once the call is back in the host. In the frame, so of C's
/// layout like it (the assembly never touches it).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Caught {
    signal: SignalFault,
    /// What the trap's argument registers said, when the signal is a trap at one of ward's two known addresses.
    trap: Trap,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
enum Trap {
    None,
    /// At `ward_mpk_refuse`: the outward stub's slot and the refusal's code.
    Refusal {
        slot: usize,
        code: u64,
    },
    /// At `ward_mpk_end`: the words of an [`Ending`].
    Ending {
        kind: u64,
        status: u64,
    },
}

impl Caught {
    const NOTHING: Caught = Caught { signal: SignalFault { signal: 0, code: 0, addr: 0, pc: 0 }, trap: Trap::None };

    /// A trap whose words name no refusal (a slot with no stub or no check) or no ending is the illegal
    /// instruction it is.
    fn into_fault(self) -> GateFault {
        match self.trap {
            Trap::Refusal { slot, code } => {
                if let Some(refused) = refusal(slot, code) {
                    return GateFault::Refused(refused);
                }
            }
            Trap::Ending { kind, status } => {
                if let Some(ending) = Ending::from_words(kind, status) {
                    return GateFault::Ended(ending);
                }
            }
            Trap::None => {}
        }
        if self.signal.signal == 0 {
            GateFault::Closed
        } else {
            GateFault::Signal(self.signal)
        }
    }
}

thread_local! {
    /// The newest gate activation of this thread, or null: the only state the signal handler reads.
    static ACTIVE: Cell<*mut GateFrame> = const { Cell::new(ptr::null_mut()) };
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
        // SAFETY: `below`, non-null here, is this thread's live activation, in host memory; the outward stub stored
        // the domain's control there when it called out.
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
        fault: Caught::NOTHING,
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
        _ => Err(frame.fault.into_fault()),
    })
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

/// Ends the domain's call on this thread as the domain asking to end the process: the call comes back as
/// [`GateFault::Ended`]. For the domain runtime, running inside the domain.
pub fn end_call(ending: Ending) -> ! {
    let (kind, status) = ending.words();
    // SAFETY: the trap raises SIGILL at a known address; the handler takes the thread back to its gate (the
    // runtime calls this only inside a domain's call).
    unsafe { ward_mpk_end(kind, status) }
}

#[cfg(test)]
mod tests;
