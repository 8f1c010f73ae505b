//! The outward stubs' Rust side: the slot table of host functions a domain may call, the argument check each stub
//! runs before it leaves the domain, and the refusal a failed check carries.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use super::assembly::ward_mpk_refuse;
use super::RefusedCall;
use crate::domain::checks::{self, Arguments, GateCheck, Refusal, Touch};

/// Eightbytes of stack arguments an outward stub passes on to its host function: sixteen, so a call with up to
/// 22 integer arguments, or a printf with that many, arrives whole. The gate keeps that much of the top of the
/// domain's stack unused, so the copy never reads past it.
pub(super) const OUTWARD_STACK_WORDS: usize = 16;
// The copy keeps the host stack 16-byte aligned.
const _: () = assert!(OUTWARD_STACK_WORDS.is_multiple_of(2));

/// Number of distinct outward entry points (host functions a domain may be handed at once).
pub const OUTWARD_SLOTS: usize = 1024;
/// Bytes between consecutive outward stubs (a 6-byte `mov r11d, imm32` and a jump of at most 5, padded).
pub(super) const OUTWARD_STRIDE: usize = 16;

/// The host function behind each outward stub (0: none). Host memory: a domain reads it, never writes it.
pub(super) static OUTWARD_TARGETS: [AtomicUsize; OUTWARD_SLOTS] = [const { AtomicUsize::new(0) }; OUTWARD_SLOTS];

extern "C" {
    /// Start of the outward stubs; only its address is used.
    pub(super) fn ward_mpk_outward_stubs();
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
pub(super) const STACK_ARGUMENTS_AT: usize = 176;

/// Called by an outward stub, inside the domain (its stack, its rights), before it leaves: runs the slot's argument
/// check. A pointer the domain could not use faults in here, as the domain's; a refusal traps at
/// `ward_mpk_refuse`. Returns when the call may go on.
pub(super) extern "C" fn check_outward_arguments(slot: usize, image: *const u64) {
    // Each stub loads its own slot; a faulty domain that jumped into the common body past one carries any number,
    // which must not pick the host code to run.
    if OUTWARD_TARGETS.get(slot).is_none_or(|target| target.load(Ordering::Acquire) == 0) {
        // SAFETY: the trap ends the call at the gate (the handler knows its address), and nothing here continues; a
        // trap without a refusal is an illegal instruction of the domain's.
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
pub(super) fn refusal(slot: usize, code: u64) -> Option<RefusedCall> {
    let why = Refusal::from_code(code)?;
    // SAFETY: non-null entries are `&'static GateCheck`s stored by `outward_for_checked`.
    let check = unsafe { OUTWARD_CHECKS.get(slot)?.load(Ordering::Acquire).as_ref()? };
    Some(RefusedCall { function: check.name, why })
}
