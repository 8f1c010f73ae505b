//! The machine's own floor for a round trip between two threads through shared memory, spinning or sleeping on a
//! futex, measured in the same run as ward's figures: a target like "sleep <= 10 us" means little on a machine
//! whose bare futex round trip already takes 40 us.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, Result};

/// One word per cache line, so the two directions do not share one.
#[repr(align(64))]
#[derive(Default)]
struct Line(AtomicU32);

#[derive(Default)]
struct Pair {
    request: Line,
    reply: Line,
}

/// `n` round trips: this thread writes a sequence number, a partner thread echoes it.
pub fn ping_pong(n: u64, spin: bool) -> Result<()> {
    let n = u32::try_from(n).map_err(|_| anyhow!("too many round trips for one run: {n}"))?;
    let pair = Arc::new(Pair::default());
    let partner = {
        let pair = pair.clone();
        std::thread::spawn(move || {
            for i in 1..=n {
                await_value(&pair.request.0, i, spin);
                publish(&pair.reply.0, i, spin);
            }
        })
    };
    for i in 1..=n {
        publish(&pair.request.0, i, spin);
        await_value(&pair.reply.0, i, spin);
    }
    partner.join().map_err(|_| anyhow!("the ping-pong partner thread panicked"))
}

fn publish(word: &AtomicU32, v: u32, spin: bool) {
    word.store(v, Ordering::Release);
    if !spin {
        futex_wake(word);
    }
}

fn await_value(word: &AtomicU32, v: u32, spin: bool) {
    loop {
        let now = word.load(Ordering::Acquire);
        if now == v {
            return;
        }
        if spin {
            spin_loop();
        } else {
            futex_wait(word, now);
        }
    }
}

fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: `word` is a live, aligned u32 for the whole call; FUTEX_WAIT with no timeout only reads it, and every
    // return (woken, EAGAIN, EINTR) leads the caller to re-check the value.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE uses the address of a live u32 only as a key; the unused arguments are ignored.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            1,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}
