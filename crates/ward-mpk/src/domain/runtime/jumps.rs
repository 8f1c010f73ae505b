//! `setjmp` and `longjmp` of the domain's own: a save and restore of the callee-saved registers, the stack pointer
//! and the return address in the caller's `jmp_buf`, with no system call.
//!
//! glibc's own are not bound as pure code: `setjmp` and `sigsetjmp` may save the signal mask with a system call,
//! `__longjmp_chk` may call `sigaltstack`, and their pointer mangling holds only while the domain's copy of the
//! control block carries the host thread's pointer guard. The domain cannot change its signal mask
//! (`sigprocmask` and its kin are refused at load), so a mask saved or restored would always be the same one: these
//! save none. Both ends are ward's, so the layout of the buffer is ours too: its first eight words (glibc's
//! `__jmp_buf` is as long) hold rbx, rbp, r12-r15, the stack pointer after the return, and the return address,
//! unmangled; the rest of the caller's `jmp_buf` is left alone. They are bound through the runtime's thunks, which
//! clobber only r9 and rax (neither is an argument here).
//!
//! `__longjmp_chk` refuses, as glibc's does, a jump to a frame deeper than the current one (a `jmp_buf` whose frame
//! has returned): that is a fault of the domain, as glibc's abort would be.

use std::ffi::c_void;

use super::super::gate::{self, Ending};

std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl ward_mpk_rt_setjmp",
    ".hidden ward_mpk_rt_setjmp",
    ".type ward_mpk_rt_setjmp, @function",
    "ward_mpk_rt_setjmp:",
    "    mov [rdi], rbx",
    "    mov [rdi + 8], rbp",
    "    mov [rdi + 16], r12",
    "    mov [rdi + 24], r13",
    "    mov [rdi + 32], r14",
    "    mov [rdi + 40], r15",
    "    lea rdx, [rsp + 8]",
    "    mov [rdi + 48], rdx",
    "    mov rdx, [rsp]",
    "    mov [rdi + 56], rdx",
    "    xor eax, eax",
    "    ret",
    ".size ward_mpk_rt_setjmp, . - ward_mpk_rt_setjmp",
    "",
    ".p2align 4",
    ".globl ward_mpk_rt_longjmp",
    ".hidden ward_mpk_rt_longjmp",
    ".type ward_mpk_rt_longjmp, @function",
    "ward_mpk_rt_longjmp:",
    // setjmp returns the value given, or 1 for 0.
    "    mov eax, esi",
    "    test eax, eax",
    "    jnz 2f",
    "    mov eax, 1",
    "2:",
    "    mov rbx, [rdi]",
    "    mov rbp, [rdi + 8]",
    "    mov r12, [rdi + 16]",
    "    mov r13, [rdi + 24]",
    "    mov r14, [rdi + 32]",
    "    mov r15, [rdi + 40]",
    "    mov rsp, [rdi + 48]",
    "    jmp qword ptr [rdi + 56]",
    ".size ward_mpk_rt_longjmp, . - ward_mpk_rt_longjmp",
    "",
    ".p2align 4",
    ".globl ward_mpk_rt_longjmp_chk",
    ".hidden ward_mpk_rt_longjmp_chk",
    ".type ward_mpk_rt_longjmp_chk, @function",
    "ward_mpk_rt_longjmp_chk:",
    // The saved stack pointer is that of a frame at or above this call's (the stack grows down); below it, the
    // frame has returned.
    "    lea rdx, [rsp + 8]",
    "    cmp [rdi + 48], rdx",
    "    jb {deeper}",
    "    jmp ward_mpk_rt_longjmp",
    ".size ward_mpk_rt_longjmp_chk, . - ward_mpk_rt_longjmp_chk",
    deeper = sym longjmp_into_a_returned_frame,
);

extern "C" {
    fn ward_mpk_rt_setjmp();
    fn ward_mpk_rt_longjmp();
    fn ward_mpk_rt_longjmp_chk();
}

/// `__longjmp_chk` to a frame that has returned: glibc aborts the process; the domain faults.
extern "C" fn longjmp_into_a_returned_frame() -> ! {
    gate::end_call(Ending::Abort)
}

/// `_setjmp`, `setjmp`, `__sigsetjmp`: saves into the `jmp_buf` in rdi, returns 0.
pub(super) fn setjmp() -> *const c_void {
    ward_mpk_rt_setjmp as *const c_void
}

/// `longjmp`, `_longjmp`, `siglongjmp`.
pub(super) fn longjmp() -> *const c_void {
    ward_mpk_rt_longjmp as *const c_void
}

/// `__longjmp_chk`: `longjmp`, refusing a frame that has returned.
pub(super) fn longjmp_checked() -> *const c_void {
    ward_mpk_rt_longjmp_chk as *const c_void
}

#[cfg(test)]
mod tests {
    use super::*;

    type SetJmp = unsafe extern "C" fn(*mut [u64; 25]) -> i32;
    type LongJmp = unsafe extern "C" fn(*mut [u64; 25], i32) -> !;

    /// Calls `jump(buf, value)` from a frame below the `setjmp` that saved `buf`, and returns what `setjmp` returned
    /// the second time.
    #[inline(never)]
    fn round_trip(value: i32, jump: LongJmp) -> (i32, u64) {
        // SAFETY: the functions are the assembly above, called with their C signatures; `buf` is a jmp_buf-sized
        // buffer alive across both; the jump goes back to this frame, which has not returned, and nothing between
        // the two has a destructor to skip.
        unsafe {
            let set: SetJmp = std::mem::transmute(setjmp());
            let mut buf = [0u64; 25];
            let buf_at = std::ptr::addr_of_mut!(buf);
            let kept = std::hint::black_box(0x5157_u64);
            let r = set(buf_at);
            if r == 0 {
                deeper(buf_at, value, jump);
            }
            (r, std::hint::black_box(kept))
        }
    }

    #[inline(never)]
    fn deeper(buf: *mut [u64; 25], value: i32, jump: LongJmp) {
        let mut padding = [0u8; 256];
        std::hint::black_box(&mut padding);
        // SAFETY: `buf` was saved by a frame that is still live (round_trip, the caller's caller).
        unsafe { jump(buf, value) }
    }

    #[test]
    fn longjmp_returns_to_setjmp_with_the_value_and_the_registers() {
        // SAFETY: the assembly above, with its C signature.
        let long: LongJmp = unsafe { std::mem::transmute(longjmp()) };
        assert_eq!(round_trip(7, long), (7, 0x5157));
        assert_eq!(round_trip(0, long), (1, 0x5157), "longjmp with 0 makes setjmp return 1");
        // SAFETY: the assembly above, with its C signature.
        let checked: LongJmp = unsafe { std::mem::transmute(longjmp_checked()) };
        assert_eq!(round_trip(42, checked), (42, 0x5157), "a live outer frame passes the check");
    }
}
