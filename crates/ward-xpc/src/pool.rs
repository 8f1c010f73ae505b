//! Buffers the host lends to the domain, named by rich pointers.
//!
//! A pool is one memfd cut into slots of a few size classes, laid out class after class; every slot's data is
//! followed by [`PoolGeometry::read_past`] bytes and one guard page, inaccessible in the domain
//! ([`SharedMemory::guard`]). A buffer is placed at the *end* of its slot's data (rounded to 16 bytes), so an
//! extension that writes past its end faults at once instead of corrupting a neighbour. In the input pool the bytes
//! after a slot's data read as zeros (the host never writes them, and the domain cannot), so an extension that reads
//! a little past an input reads zeros instead of faulting, as natively it would read whatever follows the host's
//! buffer; it never reaches the next slot. In the output pool they are inaccessible like the guard page.
//!
//! The host owns the memfds ([`HostPool`]) and only ever copies in and out with bounds checks; the domain maps them
//! ([`MappedPool`]), the input pool read-only, from a read-only descriptor (so inputs survive a crash intact,
//! NewtOS-style immutable pools, and a hostile domain cannot map them writable either) and
//! the output pool writable, and turns the rich pointers of a call into addresses only after checking that each lies
//! inside one slot's data. The geometry travels out of band: both sides build it from the same classes.

use std::os::fd::OwnedFd;

use crate::layout::PAGE;
use crate::ring::RECORD_ALIGN;
use crate::shm::{Protection, SharedMemory, ShmError};

/// A buffer in a pool, as it travels in a call: `(pool, offset, len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RichPtr {
    pub pool: u32,
    pub offset: u64,
    pub len: u64,
}

/// `count` slots of `size` bytes (a multiple of the page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotClass {
    pub size: usize,
    pub count: usize,
}

/// The classes both sides use.
pub const DEFAULT_CLASSES: &[SlotClass] = &[
    SlotClass { size: 4096, count: 64 },
    SlotClass { size: 65536, count: 32 },
    SlotClass { size: 1 << 20, count: 8 },
    SlotClass { size: 16 << 20, count: 2 },
];

/// The input pool: read-only in the domain.
pub const POOL_IN: u32 = 0;
/// The output pool: writable in the domain.
pub const POOL_OUT: u32 = 1;

/// Errors of the pools.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Every slot big enough is in use.
    #[error("no free slot for {len} bytes")]
    NoFreeSlot { len: usize },
    /// Larger than the largest slot.
    #[error("{len} bytes is more than the largest buffer of {max}")]
    TooLarge { len: usize, max: usize },
    /// A range is not inside one slot's data, or a copy is longer than its lease.
    #[error("range is outside the buffer or slot")]
    OutOfBounds,
    /// A rich pointer or lease of another pool.
    #[error("rich pointer of another pool")]
    WrongPool,
    /// A lease whose slot was returned by `free_all` (and may have been lent again).
    #[error("lease no longer valid")]
    StaleLease,
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// The classes are empty, not page multiples, not strictly increasing in size, or the pool's file does not
    /// match them.
    #[error("bad pool geometry")]
    BadGeometry,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    /// Offset of the slot's data; its guard page starts at `offset + size`.
    offset: usize,
    size: usize,
    class: usize,
}

/// Where each slot lies. Slots are numbered class after class, in increasing offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolGeometry {
    classes: Vec<SlotClass>,
    slots: Vec<Slot>,
    /// Bytes between each slot's data and its guard page (a multiple of the page).
    read_past: usize,
    total_len: usize,
}

impl PoolGeometry {
    /// Lay out `classes`: sizes non-zero multiples of the page and strictly increasing, counts non-zero; each slot's
    /// data is followed by its guard page.
    pub fn new(classes: &[SlotClass]) -> Result<Self, PoolError> {
        Self::with_read_past(classes, 0)
    }

    /// The geometry both sides of a process domain use: [`DEFAULT_CLASSES`], `read_past` bytes (a multiple of the
    /// page: [`crate::layout::read_past_bytes`]) after each slot's data.
    pub fn standard(read_past: usize) -> Result<Self, PoolError> {
        Self::with_read_past(DEFAULT_CLASSES, read_past)
    }

    /// Lay out `classes` as [`PoolGeometry::new`] does, with `read_past` bytes (a multiple of the page) between each
    /// slot's data and its guard page: zeros an extension may read past an input.
    pub fn with_read_past(classes: &[SlotClass], read_past: usize) -> Result<Self, PoolError> {
        if classes.is_empty() || !read_past.is_multiple_of(PAGE) {
            return Err(PoolError::BadGeometry);
        }
        let mut slots = Vec::new();
        let mut offset = 0usize;
        let mut last = 0usize;
        for (class, c) in classes.iter().enumerate() {
            if c.size == 0 || c.size % PAGE != 0 || c.size <= last || c.count == 0 {
                return Err(PoolError::BadGeometry);
            }
            last = c.size;
            let stride =
                c.size.checked_add(read_past).and_then(|n| n.checked_add(PAGE)).ok_or(PoolError::BadGeometry)?;
            for _ in 0..c.count {
                slots.push(Slot { offset, size: c.size, class });
                offset = offset.checked_add(stride).ok_or(PoolError::BadGeometry)?;
            }
        }
        // Offsets travel as u64 and are handed to mmap as off_t-sized lengths.
        if i64::try_from(offset).is_err() {
            return Err(PoolError::BadGeometry);
        }
        Ok(PoolGeometry { classes: classes.to_vec(), slots, read_past, total_len: offset })
    }

    /// Bytes after each slot's data before its guard page: zeros in the input pool, inaccessible in the output pool.
    pub fn read_past(&self) -> usize {
        self.read_past
    }

    /// Bytes of the whole pool, guard pages included.
    pub fn total_len(&self) -> usize {
        self.total_len
    }

    /// Largest buffer a slot holds.
    pub fn max_buffer(&self) -> usize {
        self.classes.last().map_or(0, |c| c.size)
    }

    /// Number of slots.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// `(offset, size)` of slot `slot`'s data; [`PoolGeometry::read_past`] bytes and its guard page follow it.
    pub fn slot_range(&self, slot: usize) -> Option<(usize, usize)> {
        self.slots.get(slot).map(|s| (s.offset, s.size))
    }

    /// The slot whose data holds all of `[offset, offset + len)` (a zero-length range may sit at the data's end).
    pub fn slot_of(&self, offset: u64, len: u64) -> Option<usize> {
        let offset = usize::try_from(offset).ok()?;
        let end = offset.checked_add(usize::try_from(len).ok()?)?;
        // The last slot starting at or before `offset`.
        let i = self.slots.partition_point(|s| s.offset <= offset).checked_sub(1)?;
        let s = &self.slots[i];
        (end <= s.offset + s.size).then_some(i)
    }
}

/// A buffer lent from a [`HostPool`]. Not `Clone`: it is freed once.
#[derive(Debug, PartialEq, Eq)]
pub struct Lease {
    pub rich: RichPtr,
    slot: usize,
    generation: u64,
}

impl Lease {
    /// What names the lease to [`HostPool::free_slot`] (with the pool it came from).
    pub fn slot_and_generation(&self) -> (usize, u64) {
        (self.slot, self.generation)
    }
}

/// The host's side of a pool: owns the memfd, lends slots.
#[derive(Debug)]
pub struct HostPool {
    id: u32,
    geometry: PoolGeometry,
    mem: SharedMemory,
    /// Free slots of each class (a stack: the most recently freed is lent first, still warm).
    free: Vec<Vec<usize>>,
    /// Per slot: the generation of its current lease, or None when free.
    leased: Vec<Option<u64>>,
    next_generation: u64,
    in_use: usize,
}

fn round16(len: usize) -> Option<usize> {
    len.checked_add(RECORD_ALIGN - 1).map(|n| n & !(RECORD_ALIGN - 1))
}

impl HostPool {
    /// Create the pool's memfd (`ward-pool-in`, `ward-pool-out`, or `ward-pool-<id>`), every slot free.
    pub fn create(id: u32, geometry: PoolGeometry) -> Result<Self, PoolError> {
        let name = match id {
            POOL_IN => "ward-pool-in".to_owned(),
            POOL_OUT => "ward-pool-out".to_owned(),
            other => format!("ward-pool-{other}"),
        };
        let mem = SharedMemory::create(&name, geometry.total_len())?;
        let mut free = vec![Vec::new(); geometry.classes.len()];
        // Reverse, so the lowest slot of a class is lent first.
        for (i, s) in geometry.slots.iter().enumerate().rev() {
            free[s.class].push(i);
        }
        let leased = vec![None; geometry.slots.len()];
        Ok(HostPool { id, geometry, mem, free, leased, next_generation: 0, in_use: 0 })
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn memory(&self) -> &SharedMemory {
        &self.mem
    }

    pub fn geometry(&self) -> &PoolGeometry {
        &self.geometry
    }

    /// Lend the smallest free slot that holds `len` bytes. The buffer ends `round_up(len, 16)` bytes before the
    /// slot's guard page; `len` 0 gets an empty buffer right at the guard page.
    pub fn alloc(&mut self, len: usize) -> Result<Lease, PoolError> {
        let max = self.geometry.max_buffer();
        let need = match round16(len) {
            Some(n) if n <= max => n,
            _ => return Err(PoolError::TooLarge { len, max }),
        };
        let class = self
            .geometry
            .classes
            .iter()
            .enumerate()
            .position(|(i, c)| c.size >= need && !self.free[i].is_empty())
            .ok_or(PoolError::NoFreeSlot { len })?;
        let slot = self.free[class].pop().ok_or(PoolError::NoFreeSlot { len })?;
        let s = &self.geometry.slots[slot];
        let offset = s.offset + s.size - need;
        // The rounding between the buffer's end and the slot's data end may hold an earlier buffer's bytes: zeros,
        // like what follows it, for an extension that reads a little past.
        self.mem.write_at(offset + len, &[0u8; RECORD_ALIGN][..need - len])?;
        let generation = self.next_generation;
        self.next_generation += 1;
        self.leased[slot] = Some(generation);
        self.in_use += 1;
        Ok(Lease { rich: RichPtr { pool: self.id, offset: offset as u64, len: len as u64 }, slot, generation })
    }

    fn check(&self, lease: &Lease) -> Result<(), PoolError> {
        if lease.rich.pool != self.id {
            return Err(PoolError::WrongPool);
        }
        match self.leased.get(lease.slot) {
            Some(Some(g)) if *g == lease.generation => Ok(()),
            _ => Err(PoolError::StaleLease),
        }
    }

    /// Return the slot of a lease known by [`Lease::slot_and_generation`] only (its owner kept those two numbers,
    /// not the lease). One made stale by [`HostPool::free_all`], or never lent, is ignored.
    pub fn free_slot(&mut self, slot: usize, generation: u64) {
        if !matches!(self.leased.get(slot), Some(Some(g)) if *g == generation) {
            return;
        }
        self.leased[slot] = None;
        self.free[self.geometry.slots[slot].class].push(slot);
        self.in_use -= 1;
    }

    /// Return a slot. A lease of another pool, or one made stale by [`HostPool::free_all`], is ignored.
    pub fn free(&mut self, lease: Lease) {
        if lease.rich.pool == self.id {
            self.free_slot(lease.slot, lease.generation);
        }
    }

    /// Recovery: return every slot (outstanding leases become stale).
    pub fn free_all(&mut self) {
        for (i, l) in self.leased.iter_mut().enumerate() {
            if l.take().is_some() {
                self.free[self.geometry.slots[i].class].push(i);
            }
        }
        self.in_use = 0;
    }

    /// Slots lent out.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    /// Copy `src` to the start of the lease's buffer.
    pub fn write(&self, lease: &Lease, src: &[u8]) -> Result<(), PoolError> {
        self.check(lease)?;
        if src.len() as u64 > lease.rich.len {
            return Err(PoolError::OutOfBounds);
        }
        // alloc placed the buffer inside the slot, so the offset fits a usize.
        self.mem.write_at(lease.rich.offset as usize, src)?;
        Ok(())
    }

    /// Copy the start of the lease's buffer into `dst` (the domain may be writing it: the copy is what counts).
    pub fn read(&self, lease: &Lease, dst: &mut [u8]) -> Result<(), PoolError> {
        self.check(lease)?;
        if dst.len() as u64 > lease.rich.len {
            return Err(PoolError::OutOfBounds);
        }
        self.mem.read_at(lease.rich.offset as usize, dst)?;
        Ok(())
    }
}

/// The domain's side of a pool: the mapping, guard pages that fault on access, rich pointers checked and
/// translated.
#[derive(Debug)]
pub struct MappedPool {
    id: u32,
    geometry: PoolGeometry,
    mem: SharedMemory,
    writable: bool,
}

impl MappedPool {
    /// Map the pool `fd` (read-write if `writable`, else read-only) and make every guard page inaccessible. The bytes
    /// between a slot's data and its guard page stay readable in a read-only pool (zeros an extension may read past
    /// an input: the host never writes them) and become inaccessible in a writable one (writing past an output must
    /// fault).
    pub fn map(fd: OwnedFd, id: u32, geometry: PoolGeometry, writable: bool) -> Result<Self, PoolError> {
        let prot = if writable { Protection::ReadWrite } else { Protection::ReadOnly };
        let mem = SharedMemory::from_fd(fd, prot)?;
        if mem.len() != geometry.total_len() {
            return Err(PoolError::BadGeometry);
        }
        let guards: Vec<(usize, usize)> = geometry
            .slots
            .iter()
            .map(|s| {
                let end = s.offset + s.size;
                if writable {
                    (end, geometry.read_past + PAGE)
                } else {
                    (end + geometry.read_past, PAGE)
                }
            })
            .collect();
        mem.guard_all(&guards)?;
        Ok(MappedPool { id, geometry, mem, writable })
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn geometry(&self) -> &PoolGeometry {
        &self.geometry
    }

    pub fn memory(&self) -> &SharedMemory {
        &self.mem
    }

    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The address of a rich pointer of this pool, if its whole range lies inside one slot's data.
    pub fn resolve(&self, rich: &RichPtr) -> Result<*mut u8, PoolError> {
        if rich.pool != self.id {
            return Err(PoolError::WrongPool);
        }
        self.geometry.slot_of(rich.offset, rich.len).ok_or(PoolError::OutOfBounds)?;
        // slot_of proved offset + len lies inside the mapping, so offset fits a usize and the address is in bounds.
        Ok(self.mem.as_ptr().wrapping_add(rich.offset as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::READ_PAST_INPUT;
    use std::os::fd::AsFd;

    fn small() -> PoolGeometry {
        PoolGeometry::new(&[SlotClass { size: 4096, count: 2 }, SlotClass { size: 8192, count: 1 }]).unwrap()
    }

    #[test]
    fn geometry_lays_slots_out_with_guards() {
        let g = small();
        assert_eq!(g.slot_count(), 3);
        assert_eq!(g.slot_range(0), Some((0, 4096)));
        assert_eq!(g.slot_range(1), Some((8192, 4096)));
        assert_eq!(g.slot_range(2), Some((16384, 8192)));
        assert_eq!(g.slot_range(3), None);
        assert_eq!(g.total_len(), 16384 + 8192 + 4096);
        assert_eq!(g.max_buffer(), 8192);
        let d = PoolGeometry::new(DEFAULT_CLASSES).unwrap();
        assert_eq!(d.slot_count(), 64 + 32 + 8 + 2);
        assert_eq!(d.total_len(), 64 * 8192 + 32 * 69632 + 8 * ((1 << 20) + 4096) + 2 * ((16 << 20) + 4096));
        assert_eq!(d.max_buffer(), 16 << 20);
    }

    #[test]
    fn bad_geometries_are_refused() {
        for classes in [
            &[][..],
            &[SlotClass { size: 100, count: 1 }],
            &[SlotClass { size: 4096, count: 0 }],
            &[SlotClass { size: 8192, count: 1 }, SlotClass { size: 4096, count: 1 }],
            &[SlotClass { size: 4096, count: 1 }, SlotClass { size: 4096, count: 1 }],
            &[SlotClass { size: usize::MAX - 4095, count: 2 }],
        ] {
            assert!(matches!(PoolGeometry::new(classes), Err(PoolError::BadGeometry)), "{classes:?}");
        }
    }

    #[test]
    fn slot_of_needs_one_slot_data() {
        let g = small();
        assert_eq!(g.slot_of(0, 4096), Some(0));
        assert_eq!(g.slot_of(4000, 96), Some(0));
        assert_eq!(g.slot_of(4096, 0), Some(0)); // empty, at the guard
        assert_eq!(g.slot_of(4000, 97), None); // into the guard page
        assert_eq!(g.slot_of(4097, 1), None); // in the guard page
        assert_eq!(g.slot_of(4096, 4097), None); // across into the next slot
        assert_eq!(g.slot_of(0, 16384), None); // across two slots
        assert_eq!(g.slot_of(8192, 4096), Some(1));
        assert_eq!(g.slot_of(16384, 8192), Some(2));
        assert_eq!(g.slot_of(16384, 8193), None);
        assert_eq!(g.slot_of(30000, 1), None); // past the end
        assert_eq!(g.slot_of(u64::MAX, 1), None);
        assert_eq!(g.slot_of(100, u64::MAX), None);
    }

    #[test]
    fn alloc_is_end_aligned_smallest_first() {
        let mut p = HostPool::create(POOL_IN, small()).unwrap();
        let a = p.alloc(100).unwrap();
        assert_eq!(a.rich, RichPtr { pool: POOL_IN, offset: 4096 - 112, len: 100 });
        let b = p.alloc(4096).unwrap();
        assert_eq!(b.rich.offset, 8192);
        // The 4 KiB class is used up: the next small buffer goes to the 8 KiB slot.
        let c = p.alloc(0).unwrap();
        assert_eq!(c.rich, RichPtr { pool: POOL_IN, offset: 16384 + 8192, len: 0 });
        assert_eq!(p.in_use(), 3);
        assert!(matches!(p.alloc(1), Err(PoolError::NoFreeSlot { len: 1 })));
        assert!(matches!(p.alloc(8193), Err(PoolError::TooLarge { len: 8193, max: 8192 })));
        assert!(matches!(p.alloc(usize::MAX), Err(PoolError::TooLarge { .. })));
        p.free(b);
        assert_eq!(p.in_use(), 2);
        let d = p.alloc(5000);
        assert!(matches!(d, Err(PoolError::NoFreeSlot { len: 5000 })));
        let e = p.alloc(16).unwrap();
        assert_eq!(e.rich.offset, 8192 + 4096 - 16);
        p.free_all();
        assert_eq!(p.in_use(), 0);
        // Stale leases neither free nor copy.
        assert!(matches!(p.write(&a, b"x"), Err(PoolError::StaleLease)));
        let f = p.alloc(8192).unwrap();
        p.free(c);
        assert_eq!(p.in_use(), 1);
        p.free(f);
        assert_eq!(p.in_use(), 0);
    }

    #[test]
    fn copies_are_bounded_by_the_lease() {
        let mut p = HostPool::create(POOL_OUT, small()).unwrap();
        let l = p.alloc(10).unwrap();
        p.write(&l, b"0123456789").unwrap();
        assert!(matches!(p.write(&l, b"0123456789a"), Err(PoolError::OutOfBounds)));
        let mut out = [0u8; 10];
        p.read(&l, &mut out).unwrap();
        assert_eq!(&out, b"0123456789");
        assert!(matches!(p.read(&l, &mut [0u8; 11]), Err(PoolError::OutOfBounds)));
        let mut other = HostPool::create(POOL_IN, small()).unwrap();
        assert!(matches!(other.write(&l, b"x"), Err(PoolError::WrongPool)));
        let theirs = other.alloc(10).unwrap();
        p.free(theirs);
        assert_eq!(p.in_use(), 1);
    }

    #[test]
    fn an_input_pool_reads_zeros_past_its_slots_and_rounding() {
        let g = PoolGeometry::with_read_past(&[SlotClass { size: 4096, count: 2 }], 8192).unwrap();
        assert_eq!(g.slot_range(1), Some((4096 + 8192 + 4096, 4096)));
        assert_eq!(g.total_len(), 2 * (4096 + 8192 + 4096));
        assert!(matches!(
            PoolGeometry::with_read_past(&[SlotClass { size: 4096, count: 1 }], 100),
            Err(PoolError::BadGeometry)
        ));
        let standard = PoolGeometry::standard(READ_PAST_INPUT).unwrap();
        assert_eq!(standard.read_past(), READ_PAST_INPUT);
        assert_eq!(crate::layout::read_past_bytes(5), 8192);
        assert_eq!(crate::layout::read_past_bytes(0), 0);
        let mut host = HostPool::create(POOL_IN, g.clone()).unwrap();
        let fd = host.memory().read_only_fd().unwrap();
        let m = MappedPool::map(fd, POOL_IN, g, false).unwrap();
        let long = host.alloc(4096).unwrap();
        host.write(&long, &[0xff; 4096]).unwrap();
        host.free(long);
        // A shorter buffer in the same slot: the rounding after it held the longer one's bytes.
        let short = host.alloc(4090).unwrap();
        host.write(&short, &[0xee; 4090]).unwrap();
        m.resolve(&short.rich).unwrap();
        let mut past = vec![0xaau8; 6 + 8192];
        m.memory().read_at(short.rich.offset as usize + 4090, &mut past).unwrap();
        assert!(past.iter().all(|&b| b == 0), "what follows an input reads as zeros");
    }

    #[test]
    fn resolve_checks_pool_and_range() {
        let mut host = HostPool::create(POOL_OUT, small()).unwrap();
        let fd = host.memory().fd().as_fd().try_clone_to_owned().unwrap();
        let m = MappedPool::map(fd, POOL_OUT, small(), true).unwrap();
        let l = host.alloc(5).unwrap();
        let p = m.resolve(&l.rich).unwrap();
        assert_eq!(p as usize - m.memory().as_ptr() as usize, l.rich.offset as usize);
        host.write(&l, b"hello").unwrap();
        let mut out = [0u8; 5];
        m.memory().read_at(l.rich.offset as usize, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        let wrong = RichPtr { pool: POOL_IN, ..l.rich };
        assert!(matches!(m.resolve(&wrong), Err(PoolError::WrongPool)));
        for (offset, len) in [(4090, 16), (4096, 4097), (0, 8192), (30000, 1), (u64::MAX, 2)] {
            let r = RichPtr { pool: POOL_OUT, offset, len };
            assert!(matches!(m.resolve(&r), Err(PoolError::OutOfBounds)), "{offset} {len}");
        }
        // A pool file that does not match the geometry.
        let fd = host.memory().fd().as_fd().try_clone_to_owned().unwrap();
        let bigger = PoolGeometry::new(&[SlotClass { size: 4096, count: 9 }]).unwrap();
        assert!(matches!(MappedPool::map(fd, POOL_OUT, bigger, true), Err(PoolError::BadGeometry)));
    }
}
