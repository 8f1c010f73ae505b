//! Floating-point control (MXCSR and the x87 control word): the host's and each domain's kept apart across the gate.

use std::sync::atomic::{AtomicU64, Ordering};

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
