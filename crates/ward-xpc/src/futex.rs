//! Futexes on words in shared memory.
//!
//! The words live in a `MAP_SHARED` mapping used by two processes, so these use the shared (not `FUTEX_PRIVATE_FLAG`)
//! operations: the kernel keys them by the file page, not by this process' address space.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleep while `*word == expected`. Returns on a wake-up, when the value differs, after `timeout` (None: no timeout),
/// on a signal, or spuriously: callers re-check their condition.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        // Always < 1e9, fits every c_long.
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: word is a valid, aligned u32 for the duration of the call (FUTEX_WAIT only reads it); ts_ptr is null or
    // points at `ts`, alive until the call returns; the remaining arguments are unused by FUTEX_WAIT. Every outcome
    // (woken, EAGAIN, ETIMEDOUT, EINTR) is a return to the caller, who re-checks.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, ts_ptr, std::ptr::null::<u32>(), 0);
    }
}

/// Wake up to `count` sleepers on `word`.
pub fn wake(word: &AtomicU32, count: i32) {
    // SAFETY: word is a valid, aligned u32; FUTEX_WAKE does not access memory through it, it only uses the address
    // as a key. The unused arguments are ignored by FUTEX_WAKE.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            count,
            std::ptr::null::<u8>(),
            std::ptr::null::<u32>(),
            0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_returns_at_once_when_the_value_differs() {
        let w = AtomicU32::new(1);
        let t = Instant::now();
        wait(&w, 0, Some(Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn wait_times_out() {
        let w = AtomicU32::new(0);
        let t = Instant::now();
        wait(&w, 0, Some(Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(15));
    }

    #[test]
    fn wake_wakes_a_sleeper() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = Arc::clone(&w);
        let (woken, told) = std::sync::mpsc::channel();
        // The sleeper waits without a timeout, so only a wake-up (or the changed value) ends its wait; it says so on
        // a channel, which this thread reads with a bound, so a broken wake fails the test instead of hanging it.
        std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 0 {
                wait(&w2, 0, None);
            }
            let _ = woken.send(());
        });
        w.store(1, Ordering::Release);
        wake(&w, 1);
        assert!(told.recv_timeout(Duration::from_secs(60)).is_ok(), "the sleeper was not woken within 60 s");
    }
}
