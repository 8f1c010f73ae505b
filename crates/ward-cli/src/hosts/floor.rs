//! The machine's own floor for a round trip between two threads through shared memory, spinning or sleeping on a
//! futex, measured in the same run as ward's figures: a target like "sleep <= 10 us" means little on a machine
//! whose bare futex round trip already takes 40 us. The sleeping floor comes twice: with the partner wherever the
//! scheduler puts it, and with the partner moved onto this thread's processor, as ward moves a sleeping domain
//! (`ward::placement`).

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

/// How the two sides of a ping-pong wait for each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Both spin.
    Spin,
    /// Both sleep on a futex; the scheduler places the partner.
    Futex,
    /// Both sleep on a futex; the partner runs on this thread's processor.
    FutexOneProcessor,
}

/// `n` round trips: this thread writes a sequence number, a partner thread echoes it.
pub fn ping_pong(n: u64, wait: Wait) -> Result<()> {
    let n = u32::try_from(n).map_err(|_| anyhow!("too many round trips for one run: {n}"))?;
    let spin = wait == Wait::Spin;
    let pair = Arc::new(Pair::default());
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let partner = {
        let pair = pair.clone();
        std::thread::spawn(move || {
            // SAFETY: gettid takes no arguments and cannot fail.
            let _ = tid_tx.send(unsafe { libc::gettid() });
            for i in 1..=n {
                await_value(&pair.request.0, i, spin);
                publish(&pair.reply.0, i, spin);
            }
        })
    };
    let partner_tid = tid_rx.recv().map_err(|_| anyhow!("the ping-pong partner thread ended before it started"))?;
    let mut pinned = None;
    for i in 1..=n {
        if wait == Wait::FutexOneProcessor {
            if let Some(cpu) = ward::placement::current_cpu().filter(|&c| pinned != Some(c)) {
                ward::placement::pin(partner_tid, cpu)
                    .map_err(|e| anyhow!("cannot move the ping-pong partner to processor {cpu}: {e}"))?;
                pinned = Some(cpu);
            }
        }
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
