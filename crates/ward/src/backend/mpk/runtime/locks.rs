//! Mutexes inside the domain. The core runs one call of a domain at a time (nested calls on the same thread
//! through callbacks aside), so a lock taken inside the domain can never be contended by another thread: a lock
//! is a word in the domain's memory, with glibc's layout so that `PTHREAD_MUTEX_INITIALIZER` and the mutex types
//! keep their meaning. A normal mutex locked again (which would hang a process forever) stops the domain instead.

use super::{stop, RuntimeBlock};

/// glibc's `pthread_mutex_t` on x86-64, the part the runtime uses.
#[repr(C)]
struct Mutex {
    lock: i32,
    count: u32,
    owner: i32,
    users: u32,
    kind: i32,
}

/// The mutex types' bits of `kind` (`PTHREAD_MUTEX_KIND_MASK_NP`).
const KIND_MASK: i32 = 3;

fn mutex<'a>(m: usize) -> &'a mut Mutex {
    // SAFETY: the extension passes a `pthread_mutex_t *` (40 bytes, of which the first 20 are these fields); it may
    // only lie about memory it can write itself.
    unsafe { &mut *(m as *mut Mutex) }
}

pub(super) extern "C" fn rt_mutex_init(
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
    *mutex(m) = Mutex { lock: 0, count: 0, owner: 0, users: 0, kind };
    0
}

/// `pthread_mutex_destroy` and `pthread_mutexattr_destroy`: a mutex or attribute is only words in the caller's
/// memory, so there is nothing to release.
pub(super) extern "C" fn rt_destroy(_: usize, _: usize, _: usize, _: usize, _: usize, _: *mut RuntimeBlock) -> i32 {
    0
}

/// Takes the lock when it is free, or again when the mutex is recursive; else the error the type gives.
fn take(m: &mut Mutex) -> Option<i32> {
    if m.lock == 0 {
        m.lock = 1;
        m.count = 1;
        return Some(0);
    }
    match m.kind & KIND_MASK {
        libc::PTHREAD_MUTEX_RECURSIVE => {
            m.count = m.count.checked_add(1)?;
            Some(0)
        }
        libc::PTHREAD_MUTEX_ERRORCHECK => Some(libc::EDEADLK),
        _ => None,
    }
}

pub(super) extern "C" fn rt_mutex_lock(m: usize, _: usize, _: usize, _: usize, _: usize, _: *mut RuntimeBlock) -> i32 {
    match take(mutex(m)) {
        Some(r) => r,
        // Held already by this very thread (no other can be in the domain): a process would hang here forever.
        None => stop(),
    }
}

pub(super) extern "C" fn rt_mutex_trylock(
    m: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    match take(mutex(m)) {
        Some(0) => 0,
        _ => libc::EBUSY,
    }
}

pub(super) extern "C" fn rt_mutex_unlock(
    m: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    let m = mutex(m);
    if m.lock == 0 {
        return if m.kind & KIND_MASK == libc::PTHREAD_MUTEX_ERRORCHECK { libc::EPERM } else { 0 };
    }
    if m.kind & KIND_MASK == libc::PTHREAD_MUTEX_RECURSIVE && m.count > 1 {
        m.count -= 1;
        return 0;
    }
    m.lock = 0;
    m.count = 0;
    0
}

pub(super) extern "C" fn rt_mutexattr_init(
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

pub(super) extern "C" fn rt_mutexattr_settype(
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
    // SAFETY: as in rt_mutexattr_init.
    unsafe { *(a as *mut i32) = (*(a as *const i32) & !KIND_MASK) | kind };
    0
}

pub(super) extern "C" fn rt_mutexattr_gettype(
    a: usize,
    out: usize,
    _: usize,
    _: usize,
    _: usize,
    _: *mut RuntimeBlock,
) -> i32 {
    // SAFETY: as in rt_mutexattr_init; `out` is an `int *`.
    unsafe { *(out as *mut i32) = *(a as *const i32) & KIND_MASK };
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<T>(x: &mut T) -> usize {
        x as *mut T as usize
    }

    #[test]
    fn a_static_mutex_locks_and_unlocks_and_a_held_one_is_busy() {
        let mut m = [0u8; 40];
        let b = std::ptr::null_mut();
        assert_eq!(rt_mutex_lock(raw(&mut m), 0, 0, 0, 0, b), 0);
        assert_eq!(rt_mutex_trylock(raw(&mut m), 0, 0, 0, 0, b), libc::EBUSY);
        assert_eq!(rt_mutex_unlock(raw(&mut m), 0, 0, 0, 0, b), 0);
        assert_eq!(rt_mutex_trylock(raw(&mut m), 0, 0, 0, 0, b), 0);
    }

    #[test]
    fn recursive_and_error_checking_mutexes_keep_their_meaning() {
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
