//! Register-level calls into C and callbacks out of C, for x86-64 Linux (System V ABI).
//!
//! ward calls functions of native extensions whose signatures it learns only at run time, and hands extensions
//! C function pointers that land back in Rust. Both directions use one convention, chosen so that a single piece
//! of machine code serves every supported signature:
//!
//! - **Arguments travel in registers only.** A supported function takes at most [`MAX_INT_ARGS`] integer-class
//!   arguments (integers, pointers, `bool`, enums), which the ABI assigns in order to `rdi, rsi, rdx, rcx, r8, r9`,
//!   and at most [`MAX_FLOAT_ARGS`] float-class arguments (`float`, `double`), assigned in order to
//!   `xmm0..xmm7`. The two sequences are independent: in `f(int a, double b, int c)`, `a` is in `rdi`, `b` in
//!   `xmm0`, `c` in `rsi`. [`ArgPacker`] performs this classification and builds a [`RegArgs`].
//! - **Every call loads all fourteen registers.** A callee that takes fewer arguments ignores the rest, so loading
//!   them is harmless. `al` is set to 8 before each call, the upper bound on vector registers used that a variadic
//!   callee (`printf`) reads; non-variadic callees ignore `al`.
//! - **Both return registers are captured.** [`RegRet`] holds `rax` and the low 64 bits of `xmm0`; the caller
//!   reads whichever the signature uses. For a `void` function both are meaningless.
//! - **Callbacks mirror calls.** [`callback_stub`] returns one of [`CALLBACK_SLOTS`] C-callable entry points. Each
//!   stores all fourteen argument registers into a [`RegArgs`], calls the process-wide [`CallbackDispatch`] with
//!   its slot number, and returns [`RegRet::int`] in `rax` and [`RegRet::float`] in `xmm0`.
//!
//! # Limits
//!
//! Not supported, and not detected (a register image has no type information): more than 6 integer or 8 float
//! arguments (the rest would go on the stack), structs or unions passed or returned by value, `long double`,
//! `__int128`, `__m128`/`__m256` vectors, and variadic arguments beyond the register budget. A function outside
//! these limits called through [`call_native`] reads garbage for the missing arguments; a stub called with such a
//! signature hands the dispatcher garbage. The callers that know the signatures must refuse them.
//!
//! Narrow values follow the ABI: an `int` argument or return uses only the low 32 bits of its register and the
//! upper bits are unspecified, so callers extend narrow integer arguments as their C type requires (for example
//! `v as i64 as u64` for a signed value) and read narrow returns with [`RegRet::as_i32`] / [`RegRet::as_u32`]. A
//! `float` occupies the low 32 bits of its XMM slot.
//!
//! Only [`call_native`] and [`call_native_poisoned`] are `unsafe`; everything else in this crate is safe to use.

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!("ward-abi supports only x86-64 Linux (System V ABI, ELF)");

// First, so that its assembly macros are in scope in the modules below.
#[macro_use]
mod regs;

mod call;
mod callback;
mod poisoned;
#[cfg(test)]
mod testutil;

pub use call::call_native;
pub use callback::{callback_stub, set_callback_dispatch, CallbackDispatch, CALLBACK_SLOTS};
pub use poisoned::{call_native_poisoned, POISON};
pub use regs::{ArgPacker, PackError, RegArgs, RegRet, MAX_FLOAT_ARGS, MAX_INT_ARGS};
