//! Each host thread's own room in an mpk domain: a stack, an argument area for the buffers its calls lend, the
//! floating-point control state the domain's code runs with on that thread (per thread, as in a process), and its
//! presence there (`gate::Occupant`), which a thread recovering the domain looks at. Several host threads can be
//! inside one domain at once, each in its own lane, as several threads run in one process.
//!
//! A lane is made on its thread's first call into the domain and dropped when the thread ends (or with the domain).
//! A thread finds its lane through a cache of its own, without a lock, as it finds its thread block.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::gate::{FloatControl, FloatState, Occupant};
use super::memory::{page_size, KeyedRegion};
use super::pku;

/// Bytes of a lane's stack (a thread's main stack is usually as large).
pub(crate) const STACK_BYTES: usize = 8 << 20;
/// Bytes of a lane's argument area (address space only, until used).
pub(crate) const ARGUMENT_BYTES: usize = 256 << 20;
/// Alignment of a buffer in the argument area.
const ARGUMENT_ALIGN: usize = 16;

/// One thread's room in a domain.
pub(crate) struct Lane {
    pub stack: KeyedRegion,
    arguments: KeyedRegion,
    /// The argument area's first free byte: only this lane's thread uses it, and its calls nest strictly, so it is
    /// a stack of allocations.
    arguments_top: AtomicUsize,
    /// Pages of the argument area that are guard pages now (no access): each buffer lent ends at one. They stay
    /// guards from call to call, so a host lending the same sizes again changes no protection.
    argument_guards: Mutex<BTreeSet<usize>>,
    pub occupant: Occupant,
    /// The domain's MXCSR and x87 control word on this thread, kept from call to call (the gate's).
    pub float_control: FloatControl,
    key: u32,
}

/// Why a buffer found no room in a lane's argument area.
#[derive(Debug)]
pub(crate) enum NoRoom {
    Full,
    Protect(io::Error),
}

impl std::fmt::Display for NoRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoRoom::Full => write!(f, "buffers past the mpk argument area ({ARGUMENT_BYTES} bytes)"),
            NoRoom::Protect(e) => write!(f, "cannot set a guard page in the mpk argument area: {e}"),
        }
    }
}

impl Lane {
    fn new(key: u32, float: FloatState) -> io::Result<Lane> {
        let arguments = KeyedRegion::new(ARGUMENT_BYTES, key)?;
        let top = arguments.start() as usize;
        Ok(Lane {
            stack: KeyedRegion::new(STACK_BYTES, key)?,
            arguments,
            arguments_top: AtomicUsize::new(top),
            argument_guards: Mutex::new(BTreeSet::new()),
            occupant: Occupant::for_this_thread(),
            float_control: FloatControl::new(float),
            key,
        })
    }

    /// Where the argument area's top is: what [`Lane::release_arguments`] goes back to.
    pub(crate) fn arguments_mark(&self) -> usize {
        self.arguments_top.load(Ordering::Relaxed)
    }

    /// Gives back the argument area above `mark` (what a call took).
    pub(crate) fn release_arguments(&self, mark: usize) {
        self.arguments_top.store(mark, Ordering::Relaxed);
    }

    /// Space in the argument area for a buffer of `len` bytes: its address.
    ///
    /// The buffer ends at a guard page (less up to 15 bytes: it starts 16-byte aligned), so a domain writing past
    /// it faults instead of overwriting the next buffer, as in a process domain's pools.
    pub(crate) fn argument_space(&self, len: usize) -> Result<*mut u8, NoRoom> {
        let page = page_size();
        let top = self.arguments_top.load(Ordering::Relaxed);
        let first = top.checked_next_multiple_of(page).ok_or(NoRoom::Full)?;
        let guard = len.max(1).checked_next_multiple_of(page).and_then(|l| first.checked_add(l)).ok_or(NoRoom::Full)?;
        let end = guard.checked_add(page).ok_or(NoRoom::Full)?;
        if end > self.arguments.end() as usize {
            return Err(NoRoom::Full);
        }
        let protect = |at: usize, prot: i32| {
            // SAFETY: a whole page of this lane's argument area, which it owns; only its protection changes, and no
            // buffer of a call in progress lies in it (they lie below `top`, and only this lane's thread lends here).
            unsafe { pku::protect_with_key(at as *mut u8, page, prot, self.key) }.map_err(NoRoom::Protect)
        };
        let mut guards = self.argument_guards.lock().unwrap_or_else(|e| e.into_inner());
        let in_the_way: Vec<usize> = guards.range(first..guard).copied().collect();
        for at in in_the_way {
            protect(at, libc::PROT_READ | libc::PROT_WRITE)?;
            guards.remove(&at);
        }
        if !guards.contains(&guard) {
            protect(guard, libc::PROT_NONE)?;
            guards.insert(guard);
        }
        self.arguments_top.store(end, Ordering::Relaxed);
        Ok(((guard - len) & !(ARGUMENT_ALIGN - 1)) as *mut u8)
    }

    /// The page below the stack, which a stack overflow touches.
    pub(crate) fn stack_guard(&self) -> std::ops::Range<usize> {
        let start = self.stack.start() as usize;
        start - page_size()..start
    }
}

/// A domain's lanes, one per host thread that has called it.
pub(crate) struct Lanes {
    /// Unique for the life of the process: what the threads' caches know the domain's lanes by.
    id: u64,
    key: u32,
    /// The floating-point control a new lane starts with, and a restore puts back: the loading thread's while the
    /// domain loads, then what its initialisers left.
    initial_float: FloatControl,
    /// By thread id. A lane of a thread that has ended is dropped by the thread's cache as it ends, so an id here
    /// is a live thread's.
    by_thread: Mutex<HashMap<libc::pid_t, Arc<Lane>>>,
}

impl Lanes {
    pub(crate) fn new(key: u32, float: FloatState) -> Arc<Lanes> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Arc::new(Lanes {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            key,
            initial_float: FloatControl::new(float),
            by_thread: Mutex::new(HashMap::new()),
        })
    }

    /// Makes `float` what new lanes start with and what [`Lanes::reset_float_control`] puts back (when the snapshot
    /// is taken).
    pub(crate) fn keep_float_control(&self, float: FloatState) {
        self.initial_float.set(float);
    }

    /// Puts every lane's floating-point control back as it was kept (with the rest of the domain, after a fault).
    pub(crate) fn reset_float_control(&self) {
        let float = self.initial_float.get();
        for lane in self.by_thread.lock().unwrap_or_else(|e| e.into_inner()).values() {
            lane.float_control.set(float);
        }
    }

    /// This thread's lane, made on its first call.
    pub(crate) fn for_this_thread(self: &Arc<Self>) -> io::Result<&Lane> {
        if let Some(lane) = CACHE.with(|c| c.borrow().find(self.id)) {
            // SAFETY: the cache holds lanes of this thread only, each kept by its domain's map (`by_thread`) until
            // this thread ends or the domain goes; `self` is alive for the reference's lifetime.
            return Ok(unsafe { &*lane });
        }
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let lane = {
            let mut lanes = self.by_thread.lock().unwrap_or_else(|e| e.into_inner());
            match lanes.get(&tid) {
                Some(lane) => Arc::as_ptr(lane),
                None => {
                    let lane = Arc::new(Lane::new(self.key, self.initial_float.get())?);
                    let at = Arc::as_ptr(&lane);
                    lanes.insert(tid, lane);
                    at
                }
            }
        };
        CACHE.with(|c| c.borrow_mut().add(self, lane));
        // SAFETY: as above: the map holds it.
        Ok(unsafe { &*lane })
    }

    /// Every lane now (for a thread closing the domain).
    pub(crate) fn all(&self) -> Vec<Arc<Lane>> {
        self.by_thread.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    fn forget(&self, tid: libc::pid_t) {
        self.by_thread.lock().unwrap_or_else(|e| e.into_inner()).remove(&tid);
    }
}

/// The lanes this thread has, by domain, dropped from their domains when the thread ends.
#[derive(Default)]
struct Cache {
    entries: Vec<(u64, *const Lane, Weak<Lanes>)>,
}

impl Cache {
    fn find(&self, id: u64) -> Option<*const Lane> {
        self.entries.iter().find(|(i, _, _)| *i == id).map(|(_, lane, _)| *lane)
    }

    fn add(&mut self, lanes: &Arc<Lanes>, lane: *const Lane) {
        // Entries of domains gone since are dropped here, so the list stays as long as the live domains.
        self.entries.retain(|(_, _, weak)| weak.strong_count() > 0);
        self.entries.push((lanes.id, lane, Arc::downgrade(lanes)));
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        for (_, _, weak) in &self.entries {
            if let Some(lanes) = weak.upgrade() {
                lanes.forget(tid);
            }
        }
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}
