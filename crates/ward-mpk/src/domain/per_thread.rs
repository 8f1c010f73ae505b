//! Values a domain keeps per host thread (its thread blocks, its lanes): made on the thread's first call, found by
//! the thread again without a lock (through a cache of its own), listed for the host to go through, and dropped
//! when the thread ends or with the domain.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// One domain's values of type `T`, one per host thread.
pub struct PerThread<T> {
    /// Unique for the life of the process: what the threads' caches know these values by.
    id: u64,
    /// By thread id. A value of a thread that has ended is dropped by the thread's cache as it ends, so an id here
    /// is a live thread's.
    by_thread: Mutex<HashMap<libc::pid_t, Arc<T>>>,
}

impl<T: Send + Sync + 'static> PerThread<T> {
    pub fn new() -> Arc<PerThread<T>> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Arc::new(PerThread { id: NEXT_ID.fetch_add(1, Ordering::Relaxed), by_thread: Mutex::new(HashMap::new()) })
    }

    /// This thread's value, made by `make` on its first call.
    pub fn get_or_make(self: &Arc<Self>, make: impl FnOnce() -> io::Result<T>) -> io::Result<&T> {
        if let Some(value) = CACHE.with(|c| c.borrow().find(self.id)) {
            // SAFETY: the cache holds this thread's values only, each kept by its map (`by_thread`) until this
            // thread ends or the map goes; `self` is alive for the reference's lifetime.
            return Ok(unsafe { &*value.cast::<T>() });
        }
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let value = {
            let mut values = self.by_thread.lock().unwrap_or_else(|e| e.into_inner());
            match values.get(&tid) {
                Some(value) => Arc::as_ptr(value),
                None => {
                    let value = Arc::new(make()?);
                    let at = Arc::as_ptr(&value);
                    values.insert(tid, value);
                    at
                }
            }
        };
        let forget: Arc<dyn Forget> = self.clone();
        CACHE.with(|c| c.borrow_mut().add(self.id, value.cast(), Arc::downgrade(&forget)));
        // SAFETY: the map holds the value until this thread ends or the map goes, and `self` is alive for the
        // reference's lifetime.
        Ok(unsafe { &*value })
    }

    /// Every thread's value now.
    pub fn all(&self) -> Vec<Arc<T>> {
        self.by_thread.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }
}

/// What a thread's cache calls as the thread ends: drop its value from the map.
trait Forget: Send + Sync {
    fn forget(&self, tid: libc::pid_t);
}

impl<T: Send + Sync + 'static> Forget for PerThread<T> {
    fn forget(&self, tid: libc::pid_t) {
        self.by_thread.lock().unwrap_or_else(|e| e.into_inner()).remove(&tid);
    }
}

/// The values this thread has, by map, dropped from their maps when the thread ends.
#[derive(Default)]
struct Cache {
    entries: Vec<(u64, *const (), Weak<dyn Forget>)>,
}

impl Cache {
    fn find(&self, id: u64) -> Option<*const ()> {
        self.entries.iter().find(|(i, _, _)| *i == id).map(|(_, value, _)| *value)
    }

    fn add(&mut self, id: u64, value: *const (), map: Weak<dyn Forget>) {
        // Entries of maps gone since are dropped here, so the list stays as long as the live maps.
        self.entries.retain(|(_, _, map)| map.strong_count() > 0);
        self.entries.push((id, value, map));
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        for (_, _, map) in &self.entries {
            if let Some(map) = map.upgrade() {
                map.forget(tid);
            }
        }
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_gets_its_own_value_made_once_and_an_ended_threads_is_dropped() {
        let map: Arc<PerThread<u64>> = PerThread::new();
        let made = AtomicU64::new(0);
        let make = || {
            made.fetch_add(1, Ordering::SeqCst);
            // SAFETY: gettid has no preconditions.
            Ok(u64::from(unsafe { libc::gettid() } as u32))
        };
        let here = *map.get_or_make(make).unwrap();
        assert_eq!(*map.get_or_make(make).unwrap(), here, "found again");
        let there = std::thread::scope(|s| s.spawn(|| *map.get_or_make(make).unwrap()).join().unwrap());
        assert_ne!(there, here, "another thread's own");
        assert_eq!(made.load(Ordering::SeqCst), 2, "one value per thread");
        assert_eq!(map.all(), vec![Arc::new(here)], "the ended thread's value was dropped");
    }
}
