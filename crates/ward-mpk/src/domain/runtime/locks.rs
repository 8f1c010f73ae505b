//! Mutexes inside the domain. A lock is words in the domain's memory, with glibc's layout so that
//! `PTHREAD_MUTEX_INITIALIZER` and the mutex types keep their meaning. Several host threads may be in the domain at
//! once: a thread finding the lock held by another waits for it (spinning, then yielding); one finding it held by
//! itself gets what the type says, and a normal mutex locked again (which would hang a process forever) stops the
//! domain instead. The holder is named by its thread pointer in the domain, which is its own thread block.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use super::{give_way, stop, RuntimeBlock};

/// glibc's `pthread_mutex_t` on x86-64, the part the runtime uses (40 bytes in all). `holder` takes the place of
/// `__list.__prev`, which glibc uses for robust mutexes only.
#[repr(C)]
struct Mutex {
    lock: AtomicI32,
    count: AtomicU32,
    owner: AtomicI32,
    users: AtomicU32,
    kind: AtomicI32,
    spins: i16,
    elision: i16,
    holder: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Mutex>() <= 40);

/// The mutex types' bits of `kind` (`PTHREAD_MUTEX_KIND_MASK_NP`).
const KIND_MASK: i32 = 3;

/// The mutex at `m`.
///
/// # Safety
/// `m` is a `pthread_mutex_t *` the extension passed (the thunk contract): 40 bytes it may write, alive for `'a`.
unsafe fn mutex<'a>(m: usize) -> &'a Mutex {
    // SAFETY: by this function's contract `m` names 40 bytes of the domain's, laid out as above, every field an
    // integer that any bits make valid; the extension may only lie about memory it can write itself. The fields
    // are atomics, so threads of the domain share it soundly.
    unsafe { &*(m as *const Mutex) }
}

/// This thread, as a holder: its thread pointer (in a domain, its own thread block there).
fn this_thread() -> u64 {
    let pointer: u64;
    // SAFETY: reads the FS base into a register (FSGSBASE is on wherever mpk domains run); touches no memory.
    unsafe { std::arch::asm!("rdfsbase {}", out(reg) pointer, options(nomem, nostack, preserves_flags)) };
    pointer
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_mutex_init(
    m: usize,
    attr: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    let kind = if attr == 0 {
        0
    } else {
        // SAFETY: a `pthread_mutexattr_t *`, whose first int holds the type in glibc.
        unsafe { *(attr as *const i32) & KIND_MASK }
    };
    // SAFETY: the extension passes a `pthread_mutex_t *` (the thunk contract), 40 bytes it may write, which a Mutex
    // fits; initialising is not concurrent with using (POSIX), so a plain write does.
    unsafe {
        (m as *mut Mutex).write(Mutex {
            lock: AtomicI32::new(0),
            count: AtomicU32::new(0),
            owner: AtomicI32::new(0),
            users: AtomicU32::new(0),
            kind: AtomicI32::new(kind),
            spins: 0,
            elision: 0,
            holder: AtomicU64::new(0),
        })
    };
    0
}

/// `pthread_mutex_destroy` and `pthread_mutexattr_destroy`: a mutex or attribute is only words in the caller's
/// memory, so there is nothing to release.
///
/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_destroy(
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    0
}

/// What one try at a lock came to.
enum Take {
    /// Taken (or, for this thread's own, the type's answer).
    Done(i32),
    /// Held by another thread.
    Busy,
    /// A normal mutex this thread holds already.
    Deadlock,
}

fn try_take(m: &Mutex, me: u64) -> Take {
    if m.lock.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok() {
        m.holder.store(me, Ordering::Relaxed);
        m.count.store(1, Ordering::Relaxed);
        return Take::Done(0);
    }
    // Only this thread stores its own name there, and it clears it before it lets go.
    if m.holder.load(Ordering::Relaxed) != me {
        return Take::Busy;
    }
    match m.kind.load(Ordering::Relaxed) & KIND_MASK {
        libc::PTHREAD_MUTEX_RECURSIVE => {
            let count = m.count.load(Ordering::Relaxed);
            match count.checked_add(1) {
                Some(more) => {
                    m.count.store(more, Ordering::Relaxed);
                    Take::Done(0)
                }
                None => Take::Done(libc::EAGAIN),
            }
        }
        libc::PTHREAD_MUTEX_ERRORCHECK => Take::Done(libc::EDEADLK),
        _ => Take::Deadlock,
    }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_mutex_lock(
    m: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    let (m, me) = (mutex(m), this_thread());
    let mut tries = 0u32;
    loop {
        match try_take(m, me) {
            Take::Done(r) => return r,
            // A process would hang here forever.
            Take::Deadlock => stop(),
            Take::Busy => {
                std::hint::spin_loop();
                tries += 1;
                if tries.is_multiple_of(128) {
                    give_way();
                }
            }
        }
    }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_mutex_trylock(
    m: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    match try_take(mutex(m), this_thread()) {
        Take::Done(0) => 0,
        _ => libc::EBUSY,
    }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_mutex_unlock(
    m: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    let m = mutex(m);
    let kind = m.kind.load(Ordering::Relaxed) & KIND_MASK;
    let mine = m.lock.load(Ordering::Relaxed) != 0 && m.holder.load(Ordering::Relaxed) == this_thread();
    if !mine {
        // Unlocking a mutex one does not hold: an error for the checking types, undefined (and ignored) for a
        // normal one, which must not let another thread's lock go.
        return if kind == libc::PTHREAD_MUTEX_NORMAL { 0 } else { libc::EPERM };
    }
    if kind == libc::PTHREAD_MUTEX_RECURSIVE && m.count.load(Ordering::Relaxed) > 1 {
        m.count.fetch_sub(1, Ordering::Relaxed);
        return 0;
    }
    m.count.store(0, Ordering::Relaxed);
    m.holder.store(0, Ordering::Relaxed);
    m.lock.store(0, Ordering::Release);
    0
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_mutexattr_init(
    a: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    // SAFETY: a `pthread_mutexattr_t *` (4 bytes).
    unsafe { *(a as *mut i32) = 0 };
    0
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_mutexattr_settype(
    a: usize,
    kind: i32,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    if !(0..=KIND_MASK).contains(&kind) {
        return libc::EINVAL;
    }
    // SAFETY: a `pthread_mutexattr_t *` (4 bytes, the thunk contract), which the extension may write.
    unsafe { *(a as *mut i32) = (*(a as *const i32) & !KIND_MASK) | kind };
    0
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_mutexattr_gettype(
    a: usize,
    out: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    // SAFETY: `a` is a `pthread_mutexattr_t *` (4 bytes) and `out` an `int *` (the thunk contract).
    unsafe { *(out as *mut i32) = *(a as *const i32) & KIND_MASK };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<T>(x: &mut T) -> usize {
        x as *mut T as usize
    }

    /// Whether this machine has FSGSBASE (as every machine with mpk domains does); when not, says so.
    fn fsgsbase_here() -> bool {
        let here = crate::domain::thread_block::fsgsbase_enabled();
        if !here {
            eprintln!("no FSGSBASE on this machine: the runtime's mutexes name their holders with it; not run");
        }
        here
    }

    #[test]
    fn a_static_mutex_locks_and_unlocks_and_a_held_one_is_busy() {
        if !fsgsbase_here() {
            return;
        }
        // SAFETY: the thunk contract: the lock functions never read the block, so a null one does, and every mutex and
        // attribute is a live local of the size pthread gives it.
        unsafe {
            let mut m = [0u8; 40];
            let b = std::ptr::null_mut();
            assert_eq!(rt_mutex_lock(raw(&mut m), 0, 0, 0, 0, b), 0);
            assert_eq!(rt_mutex_trylock(raw(&mut m), 0, 0, 0, 0, b), libc::EBUSY);
            assert_eq!(rt_mutex_unlock(raw(&mut m), 0, 0, 0, 0, b), 0);
            assert_eq!(rt_mutex_trylock(raw(&mut m), 0, 0, 0, 0, b), 0);
        }
    }

    #[test]
    fn a_mutex_held_by_one_thread_makes_another_wait_for_it() {
        if !fsgsbase_here() {
            return;
        }
        // SAFETY: the thunk contract: the lock functions never read the block, so a null one does, and every mutex and
        // attribute is a live local of the size pthread gives it; the counter outlives the threads, which write it
        // holding the mutex.
        unsafe {
            let mut m = [0u8; 40];
            let at = raw(&mut m);
            let b = std::ptr::null_mut::<RuntimeBlock>() as usize;
            // Not atomic: only the mutex keeps the two threads' increments apart.
            let mut counter = 0u64;
            let counter_at = raw(&mut counter);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(move || {
                        let b = b as *mut RuntimeBlock;
                        for _ in 0..100_000 {
                            assert_eq!(rt_mutex_lock(at, 0, 0, 0, 0, b), 0);
                            // The counter outlives the scope, and the mutex is held.
                            {
                                let c = counter_at as *mut u64;
                                c.write_volatile(c.read_volatile() + 1);
                            }
                            assert_eq!(rt_mutex_unlock(at, 0, 0, 0, 0, b), 0);
                        }
                    });
                }
            });
            assert_eq!(counter, 200_000, "no increment lost");
            assert_eq!(rt_mutex_trylock(at, 0, 0, 0, 0, std::ptr::null_mut()), 0, "free at the end");
        }
    }

    #[test]
    fn a_mutex_another_thread_holds_is_busy_to_trylock_and_not_unlocked_by_this_one() {
        if !fsgsbase_here() {
            return;
        }
        // SAFETY: the thunk contract: the lock functions never read the block, so a null one does, and every mutex and
        // attribute is a live local of the size pthread gives it.
        unsafe {
            let mut m = [0u8; 40];
            let at = raw(&mut m);
            let b = std::ptr::null_mut();
            assert_eq!(rt_mutex_lock(at, 0, 0, 0, 0, b), 0);
            let there = std::thread::scope(|s| {
                s.spawn(move || {
                    let b = std::ptr::null_mut();
                    (
                        rt_mutex_trylock(at, 0, 0, 0, 0, b),
                        rt_mutex_unlock(at, 0, 0, 0, 0, b),
                        rt_mutex_trylock(at, 0, 0, 0, 0, b),
                    )
                })
                .join()
                .unwrap()
            });
            assert_eq!(there, (libc::EBUSY, 0, libc::EBUSY), "held here, so busy there, before and after its unlock");
            assert_eq!(rt_mutex_unlock(at, 0, 0, 0, 0, b), 0);
        }
    }

    #[test]
    fn recursive_and_error_checking_mutexes_keep_their_meaning() {
        if !fsgsbase_here() {
            return;
        }
        // SAFETY: the thunk contract: the lock functions never read the block, so a null one does, and every mutex and
        // attribute is a live local of the size pthread gives it.
        unsafe {
            let mut attr = 0i32;
            let b = std::ptr::null_mut();
            assert_eq!(rt_mutexattr_init(raw(&mut attr), 0, 0, 0, 0, b), 0);
            assert_eq!(rt_mutexattr_settype(raw(&mut attr), libc::PTHREAD_MUTEX_RECURSIVE, 0, 0, 0, b), 0);
            let mut m = [0u8; 40];
            assert_eq!(rt_mutex_init(raw(&mut m), raw(&mut attr), 0, 0, 0, b), 0);
            assert_eq!(rt_mutex_lock(raw(&mut m), 0, 0, 0, 0, b), 0);
            assert_eq!(rt_mutex_lock(raw(&mut m), 0, 0, 0, 0, b), 0, "again, recursively");
            assert_eq!(rt_mutex_unlock(raw(&mut m), 0, 0, 0, 0, b), 0);
            assert_eq!(rt_mutex_trylock(raw(&mut m), 0, 0, 0, 0, b), 0, "still held once: taken again");

            assert_eq!(rt_mutexattr_settype(raw(&mut attr), libc::PTHREAD_MUTEX_ERRORCHECK, 0, 0, 0, b), 0);
            let mut e = [0u8; 40];
            assert_eq!(rt_mutex_init(raw(&mut e), raw(&mut attr), 0, 0, 0, b), 0);
            assert_eq!(rt_mutex_unlock(raw(&mut e), 0, 0, 0, 0, b), libc::EPERM, "not held");
            assert_eq!(rt_mutex_lock(raw(&mut e), 0, 0, 0, 0, b), 0);
            assert_eq!(rt_mutex_lock(raw(&mut e), 0, 0, 0, 0, b), libc::EDEADLK);
            assert_eq!(rt_mutexattr_settype(raw(&mut attr), 7, 0, 0, 0, b), libc::EINVAL);
        }
    }
}
