//! Each host thread's own room in an mpk domain: a stack, an argument area for the buffers its calls lend, the
//! floating-point control state the domain's code runs with on that thread (per thread, as in a process), and its
//! presence there (`gate::Occupant`), which a thread recovering the domain looks at. Several host threads can be
//! inside one domain at once, each in its own lane, as several threads run in one process.
//!
//! A lane is made on its thread's first call into the domain and dropped when the thread ends (or with the domain)
//! (`per_thread`).

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::gate::{FloatControl, FloatState, Occupant};
use super::memory::{page_size, KeyedRegion};
use super::per_thread::PerThread;
use super::pku;

/// Bytes of a lane's stack (a thread's main stack is usually as large).
pub const STACK_BYTES: usize = 8 << 20;
/// Bytes of a lane's argument area (address space only, until used).
pub const ARGUMENT_BYTES: usize = 256 << 20;
/// Alignment of a buffer in the argument area.
const ARGUMENT_ALIGN: usize = 16;

/// One thread's room in a domain.
pub struct Lane {
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
pub enum NoRoom {
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
    pub fn arguments_mark(&self) -> usize {
        self.arguments_top.load(Ordering::Relaxed)
    }

    /// Gives back the argument area above `mark` (what a call took).
    pub fn release_arguments(&self, mark: usize) {
        self.arguments_top.store(mark, Ordering::Relaxed);
    }

    /// Space in the argument area for a buffer of `len` bytes: its address.
    ///
    /// The buffer ends at a guard page (less up to 15 bytes: it starts 16-byte aligned), so a domain writing past
    /// it faults instead of overwriting the next buffer, as in a process domain's pools.
    pub fn argument_space(&self, len: usize) -> Result<*mut u8, NoRoom> {
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
    pub fn stack_guard(&self) -> std::ops::Range<usize> {
        let start = self.stack.start() as usize;
        start - page_size()..start
    }
}

/// A domain's lanes, one per host thread that has called it.
pub struct Lanes {
    key: u32,
    /// The floating-point control a new lane starts with, and a restore puts back: the loading thread's while the
    /// domain loads, then what its initialisers left.
    initial_float: FloatControl,
    lanes: Arc<PerThread<Lane>>,
}

impl Lanes {
    pub fn new(key: u32, float: FloatState) -> Lanes {
        Lanes { key, initial_float: FloatControl::new(float), lanes: PerThread::new() }
    }

    /// Makes `float` what new lanes start with and what [`Lanes::reset_float_control`] puts back (when the snapshot
    /// is taken).
    pub fn keep_float_control(&self, float: FloatState) {
        self.initial_float.set(float);
    }

    /// Puts every lane's floating-point control back as it was kept (with the rest of the domain, after a fault).
    pub fn reset_float_control(&self) {
        let float = self.initial_float.get();
        for lane in self.lanes.all() {
            lane.float_control.set(float);
        }
    }

    /// This thread's lane, made on its first call.
    pub fn for_this_thread(&self) -> io::Result<&Lane> {
        self.lanes.get_or_make(|| Lane::new(self.key, self.initial_float.get()))
    }

    /// Every lane now (for a thread closing the domain).
    pub fn all(&self) -> Vec<Arc<Lane>> {
        self.lanes.all()
    }
}
