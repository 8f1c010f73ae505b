//! The shared region between a host and one domain process. `extensions/ward_xpc_layout.h` mirrors these numbers
//! for C code; a test checks that the two agree.
//!
//! ```text
//! page 0   header: magic u64 @0, version u32 @8, ring capacity u32 @12, fault record @64
//! page 1   request ring control (host -> domain; its consumer's processor and wait statistics: the domain's)
//! page 2   reply ring control   (domain -> host; its consumer's processor and wait statistics: the host's)
//! page 3.. request ring data (capacity bytes; read-only in the domain)
//! then     reply ring data   (capacity bytes)
//! ```
//!
//! The host never reads the header back: it keeps the capacity it chose. The domain checks the header against the
//! size of the file it was given, which the host sealed.

use std::mem::offset_of;
use std::os::fd::OwnedFd;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::ring::{Consumer, Producer, RingShared, MAX_RECORD};
use crate::shm::{Protection, SharedMemory, ShmError};

/// Name of the region's memfd.
pub const MEMFD_NAME: &str = "ward-xpc";
/// Page size the layout is built on.
pub const PAGE: usize = 4096;
/// `"WARDXPC1"` read as a little-endian u64.
pub const MAGIC: u64 = 0x3143_5058_4452_4157;
/// Version of this layout and of the records in [`crate::wire`].
pub const VERSION: u32 = 1;
/// Bytes after an input that an extension may read as zeros before a guard page, unless told otherwise (the policy's
/// `read_past_input_kb`): after every slot of a process domain's input pool and after its arena inputs lent in
/// place. A plugin that reads a little past an input works natively, reading whatever follows the host's buffer
/// (frei0r's UV Map reads up to a row and a pixel past its second frame: 15 KiB at 3840 pixels a row); under ward it
/// reads zeros, never the host's bytes, and faults further on.
pub const READ_PAST_INPUT: usize = 16 << 10;

/// `kb` KiB of zeros after an input, in whole pages, as both sides of a process domain lay them out.
pub fn read_past_bytes(kb: u32) -> usize {
    (kb as usize).saturating_mul(1024).div_ceil(PAGE).saturating_mul(PAGE)
}
/// Ring capacity the host uses unless told otherwise.
pub const DEFAULT_RING_CAPACITY: usize = 1 << 20;
/// Smallest ring capacity: room for a largest record behind the largest padding.
pub const MIN_RING_CAPACITY: usize = 2 * MAX_RECORD;
/// Largest ring capacity.
pub const MAX_RING_CAPACITY: usize = 1 << 30;

/// Header: magic (u64).
pub const HDR_MAGIC: usize = 0;
/// Header: version (u32).
pub const HDR_VERSION: usize = 8;
/// Header: ring capacity (u32, power of two, multiple of the page).
pub const HDR_RING_CAPACITY: usize = 12;
/// Header: the [`FaultRecord`].
pub const HDR_FAULT: usize = 64;

/// Offset of the request ring's control page.
pub const REQ_CTRL_OFF: usize = PAGE;
/// Offset of the reply ring's control page.
pub const REP_CTRL_OFF: usize = 2 * PAGE;
/// Offset of the request ring's data; the reply ring's data follows it ([`rep_data_off`]).
pub const REQ_DATA_OFF: usize = 3 * PAGE;

/// Ring control: tail (u64), written by the producer only.
pub const CTRL_TAIL: usize = 0;
/// Ring control: head (u64), written by the consumer only (own cache line).
pub const CTRL_HEAD: usize = 128;
/// Ring control: waiting flag (u32), set by the consumer before it sleeps.
pub const CTRL_WAITING: usize = 256;
/// Ring control: doorbell (u32), the futex word the producer bumps to wake a sleeping consumer.
pub const CTRL_DOORBELL: usize = 260;

/// Ring control: the processor the consumer last waited on, plus one (u32; 0: not known), on a cache line of its
/// own. The consumer writes it when a wait of its turns slow; the other ring's consumer (its partner, whom it waits
/// for) reads it to tell whether spinning for this side can pay. Only a hint: a wrong value costs speed, no more.
pub const CTRL_CPU: usize = 384;
/// Ring control: the consumer's wait statistics, on a cache line of their own, written by the consumer only, for
/// tests and diagnosis (nothing decides anything on them): flags (u32, [`WAIT_FLAG_NO_RUNQUEUE`]) ...
pub const CTRL_WAIT_FLAGS: usize = 448;
/// ... spin turns in its waits so far (u64) ...
pub const CTRL_SPIN_TURNS: usize = 456;
/// ... sleeps on the doorbell so far (u64) ...
pub const CTRL_SLEEPS: usize = 464;
/// ... and waits whose spin stopped early because the partner could not be running (u64).
pub const CTRL_CUT_SHORT: usize = 472;
/// [`CTRL_WAIT_FLAGS`]: the consumer cannot read the machine's run queue, and its waits spin briefly only.
pub const WAIT_FLAG_NO_RUNQUEUE: u32 = 1;

/// The wait statistics a ring's consumer published (see [`CTRL_WAIT_FLAGS`]); a claim of whoever consumes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitStats {
    /// [`CTRL_WAIT_FLAGS`].
    pub flags: u32,
    pub spin_turns: u64,
    pub sleeps: u64,
    pub cut_short: u64,
}

/// Read the wait statistics of the ring whose control page is at `ctrl_off` ([`REQ_CTRL_OFF`]: the domain's, as
/// the request ring's consumer; [`REP_CTRL_OFF`]: the host's) in a mapping of a region.
pub fn wait_stats(mem: &SharedMemory, ctrl_off: usize) -> Result<WaitStats, ShmError> {
    let mut raw = [0u8; 32];
    mem.read_at(ctrl_off + CTRL_WAIT_FLAGS, &mut raw)?;
    let u64_at = |off: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&raw[off - CTRL_WAIT_FLAGS..off - CTRL_WAIT_FLAGS + 8]);
        u64::from_le_bytes(b)
    };
    Ok(WaitStats {
        flags: u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]),
        spin_turns: u64_at(CTRL_SPIN_TURNS),
        sleeps: u64_at(CTRL_SLEEPS),
        cut_short: u64_at(CTRL_CUT_SHORT),
    })
}

// The statistics are one cache line apart from the processor, which is apart from `waiting` and the doorbell.
const _: () = assert!(CTRL_CPU / 64 != CTRL_WAITING / 64 && CTRL_WAIT_FLAGS / 64 != CTRL_CPU / 64);
const _: () = assert!(CTRL_CUT_SHORT + 8 - CTRL_WAIT_FLAGS <= 32 && CTRL_CUT_SHORT + 8 <= PAGE);

/// Offset of the reply ring's data for a ring capacity.
pub const fn rep_data_off(capacity: usize) -> usize {
    REQ_DATA_OFF + capacity
}

/// Size of the whole region for a ring capacity.
pub const fn region_len(capacity: usize) -> usize {
    REQ_DATA_OFF + 2 * capacity
}

/// What the domain's signal handler leaves behind before the process dies. Read by the host after the death, as a
/// copy; every field is only a claim of the (crashed, possibly hostile) domain.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultRecord {
    /// Non-zero when the record was written; stored last.
    pub valid: u32,
    pub signo: i32,
    /// `si_code`.
    pub code: i32,
    /// One of [`fault_hint`].
    pub hint: u32,
    /// `si_addr`.
    pub addr: u64,
    /// Id of the call in flight, 0 if none.
    pub call_id: u64,
}

/// Values of [`FaultRecord::hint`].
pub mod fault_hint {
    pub const NONE: u32 = 0;
    pub const STACK_OVERFLOW: u32 = 1;
    /// Less than a 32nd of the address-space limit was left when the signal came.
    pub const MEMORY_EXHAUSTED: u32 = 2;
    /// The descriptor table was full when the signal came.
    pub const DESCRIPTORS_EXHAUSTED: u32 = 3;
    /// The domain's sandbox refused a system call (SIGSYS); the record's `addr` is the call's number.
    pub const SYSCALL_REFUSED: u32 = 4;
}

/// The name of an x86-64 system call number, for messages about a refused one: the calls a hostile or unusual
/// extension is most likely to be refused.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    use libc::*;
    let names: [(i64, &str); 28] = [
        (SYS_ptrace, "ptrace"),
        (SYS_process_vm_readv, "process_vm_readv"),
        (SYS_process_vm_writev, "process_vm_writev"),
        (SYS_pidfd_open, "pidfd_open"),
        (SYS_pidfd_getfd, "pidfd_getfd"),
        (SYS_pidfd_send_signal, "pidfd_send_signal"),
        (SYS_kill, "kill"),
        (SYS_tgkill, "tgkill"),
        (SYS_tkill, "tkill"),
        (SYS_execve, "execve"),
        (SYS_execveat, "execveat"),
        (SYS_clone, "clone"),
        (SYS_fork, "fork"),
        (SYS_vfork, "vfork"),
        (SYS_socket, "socket"),
        (SYS_socketpair, "socketpair"),
        (SYS_open, "open"),
        (SYS_openat, "openat"),
        (SYS_creat, "creat"),
        (SYS_memfd_create, "memfd_create"),
        (SYS_ftruncate, "ftruncate"),
        (SYS_fallocate, "fallocate"),
        (SYS_mount, "mount"),
        (SYS_unshare, "unshare"),
        (SYS_setns, "setns"),
        (SYS_bpf, "bpf"),
        (SYS_io_uring_setup, "io_uring_setup"),
        (SYS_shmget, "shmget"),
    ];
    names.iter().find(|(n, _)| *n == nr).map(|(_, name)| *name)
}

// The fault record must fit the header page and keep its u64 fields aligned.
const _: () = assert!(HDR_FAULT & 7 == 0 && HDR_FAULT + std::mem::size_of::<FaultRecord>() <= PAGE);
const _: () = assert!(std::mem::size_of::<FaultRecord>() == 32);

/// Errors of [`Region`].
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// The capacity is not a power of two in `[MIN_RING_CAPACITY, MAX_RING_CAPACITY]`.
    #[error("ring capacity {0} is not a power of two between {MIN_RING_CAPACITY} and {MAX_RING_CAPACITY}")]
    BadCapacity(u64),
    /// The header does not start with [`MAGIC`].
    #[error("bad magic {0:#x}: not a ward-xpc region")]
    BadMagic(u64),
    /// The header is of another version.
    #[error("region version {0}, expected {VERSION}")]
    BadVersion(u32),
    /// The file's size does not match the capacity in its header.
    #[error("region is {actual} bytes, its header implies {expected}")]
    SizeMismatch { expected: usize, actual: usize },
}

/// The mapped region. Cheap to clone (one `Arc`); endpoints hold a clone, so the mapping lives as long as any of
/// them.
#[derive(Clone, Debug)]
pub struct Region {
    mem: Arc<SharedMemory>,
    capacity: usize,
}

fn valid_capacity(capacity: u64) -> Result<usize, LayoutError> {
    match usize::try_from(capacity) {
        Ok(c) if c.is_power_of_two() && (MIN_RING_CAPACITY..=MAX_RING_CAPACITY).contains(&c) => Ok(c),
        _ => Err(LayoutError::BadCapacity(capacity)),
    }
}

impl Region {
    /// Host: create the memfd with an initialised header and empty rings (a fresh memfd reads as zeroes).
    pub fn create(ring_capacity: usize) -> Result<Region, LayoutError> {
        let capacity = valid_capacity(ring_capacity as u64)?;
        let mem = SharedMemory::create(MEMFD_NAME, region_len(capacity))?;
        mem.write_at(HDR_MAGIC, &MAGIC.to_le_bytes())?;
        mem.write_at(HDR_VERSION, &VERSION.to_le_bytes())?;
        // valid_capacity bounds it by MAX_RING_CAPACITY, which fits a u32.
        mem.write_at(HDR_RING_CAPACITY, &(capacity as u32).to_le_bytes())?;
        Ok(Region { mem: Arc::new(mem), capacity })
    }

    /// Domain: map the region the host created, check it, and make the request ring's data read-only here.
    pub fn open_domain(fd: OwnedFd) -> Result<Region, LayoutError> {
        let mem = SharedMemory::from_fd(fd, Protection::ReadWrite)?;
        let mut header = [0u8; 16];
        mem.read_at(0, &mut header).map_err(|_| LayoutError::SizeMismatch { expected: PAGE, actual: mem.len() })?;
        let [m0, m1, m2, m3, m4, m5, m6, m7, v0, v1, v2, v3, c0, c1, c2, c3] = header;
        let magic = u64::from_le_bytes([m0, m1, m2, m3, m4, m5, m6, m7]);
        if magic != MAGIC {
            return Err(LayoutError::BadMagic(magic));
        }
        let version = u32::from_le_bytes([v0, v1, v2, v3]);
        if version != VERSION {
            return Err(LayoutError::BadVersion(version));
        }
        let capacity = valid_capacity(u64::from(u32::from_le_bytes([c0, c1, c2, c3])))?;
        if mem.len() != region_len(capacity) {
            return Err(LayoutError::SizeMismatch { expected: region_len(capacity), actual: mem.len() });
        }
        mem.protect(REQ_DATA_OFF, capacity, Protection::ReadOnly)?;
        Ok(Region { mem: Arc::new(mem), capacity })
    }

    pub fn memory(&self) -> &SharedMemory {
        &self.mem
    }

    /// Capacity of each ring in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The domain's wait statistics, as it claims them (it consumes the request ring).
    pub fn domain_wait_stats(&self) -> WaitStats {
        wait_stats(&self.mem, REQ_CTRL_OFF).unwrap_or_default()
    }

    /// The host's wait statistics (it consumes the reply ring).
    pub fn host_wait_stats(&self) -> WaitStats {
        wait_stats(&self.mem, REP_CTRL_OFF).unwrap_or_default()
    }

    fn request_ring(&self) -> RingShared {
        RingShared::new(self.clone(), REQ_CTRL_OFF, REQ_DATA_OFF)
    }

    fn reply_ring(&self) -> RingShared {
        RingShared::new(self.clone(), REP_CTRL_OFF, rep_data_off(self.capacity))
    }

    /// Host: producer of the request ring, consumer of the reply ring. Take them when the rings are empty and the
    /// domain is not running (after [`Region::create`] or [`Region::reset`]): they start at position 0.
    pub fn host_endpoints(&self) -> (Producer, Consumer) {
        (Producer::new(self.request_ring()), Consumer::new(self.reply_ring(), self.request_ring()))
    }

    /// Domain: consumer of the request ring, producer of the reply ring (both start at position 0).
    pub fn domain_endpoints(&self) -> (Consumer, Producer) {
        (Consumer::new(self.request_ring(), self.reply_ring()), Producer::new(self.reply_ring()))
    }

    /// Host, between incarnations (no domain running): zero both ring controls and the fault record. Endpoints
    /// taken before are stale afterwards; take new ones.
    pub fn reset(&self) {
        for ring in [self.request_ring(), self.reply_ring()] {
            ring.reset();
        }
        self.write_fault_record(&FaultRecord::default());
    }

    /// Wake whoever sleeps on the reply ring, so it re-checks its stop condition.
    pub fn kick_reply_ring(&self) {
        self.reply_ring().kick();
    }

    /// Wake whoever sleeps on the request ring.
    pub fn kick_request_ring(&self) {
        self.request_ring().kick();
    }

    fn fault_ptr(&self) -> *mut FaultRecord {
        self.mem.as_ptr().wrapping_add(HDR_FAULT).cast()
    }

    fn fault_valid(&self) -> &AtomicU32 {
        // SAFETY: the fault record lies inside the header page of the mapping (const-asserted above), which is
        // mapped read-write in both processes and lives as long as &self (self holds the Arc); `valid` is its first
        // field at a 64-byte offset into a page-aligned mapping, so it is aligned for AtomicU32. Every access to this
        // word goes through atomics or volatile operations, and the peer is another process.
        unsafe { &*self.fault_ptr().cast::<AtomicU32>() }
    }

    /// Copy the fault record out of the region.
    pub fn read_fault_record(&self) -> FaultRecord {
        let valid = self.fault_valid().load(Ordering::Acquire);
        let p = self.fault_ptr();
        // SAFETY: p points at the FaultRecord inside the mapping (see fault_valid), aligned for each field; every
        // field is plain data for which any bit pattern is valid, and each is read exactly once with a volatile read,
        // so a concurrent writer can only make the values stale.
        unsafe {
            FaultRecord {
                valid,
                signo: ptr::read_volatile(ptr::addr_of!((*p).signo)),
                code: ptr::read_volatile(ptr::addr_of!((*p).code)),
                hint: ptr::read_volatile(ptr::addr_of!((*p).hint)),
                addr: ptr::read_volatile(ptr::addr_of!((*p).addr)),
                call_id: ptr::read_volatile(ptr::addr_of!((*p).call_id)),
            }
        }
    }

    /// Domain: write the fault record. Async-signal-safe: plain volatile stores, then `valid` with a release store.
    pub fn write_fault_record(&self, rec: &FaultRecord) {
        let p = self.fault_ptr();
        // Clear `valid` first so a reader never pairs a set flag with half-written fields.
        self.fault_valid().store(0, Ordering::Release);
        // SAFETY: p points at the FaultRecord inside the header page (see fault_valid), aligned for each field and
        // writable in both processes; the fields are plain data, and the stores are volatile so none is elided or
        // merged with the flag store below (which is ordered after them by Release).
        unsafe {
            ptr::write_volatile(ptr::addr_of_mut!((*p).signo), rec.signo);
            ptr::write_volatile(ptr::addr_of_mut!((*p).code), rec.code);
            ptr::write_volatile(ptr::addr_of_mut!((*p).hint), rec.hint);
            ptr::write_volatile(ptr::addr_of_mut!((*p).addr), rec.addr);
            ptr::write_volatile(ptr::addr_of_mut!((*p).call_id), rec.call_id);
        }
        self.fault_valid().store(rec.valid, Ordering::Release);
    }
}

// `valid` must be the first field for `fault_valid`.
const _: () = assert!(offset_of!(FaultRecord, valid) == 0);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;
    use std::os::fd::AsFd;

    /// Every numeric `#define WARD_XPC_*` of the C header, by name without the prefix, as Rust sees it.
    fn rust_value(name: &str) -> Option<u64> {
        let v = match name {
            "PAGE" => PAGE as u64,
            "MAGIC" => MAGIC,
            "VERSION" => u64::from(VERSION),
            "HDR_MAGIC" => HDR_MAGIC as u64,
            "HDR_VERSION" => HDR_VERSION as u64,
            "HDR_RING_CAPACITY" => HDR_RING_CAPACITY as u64,
            "REQ_CTRL_OFF" => REQ_CTRL_OFF as u64,
            "REP_CTRL_OFF" => REP_CTRL_OFF as u64,
            "REQ_DATA_OFF" => REQ_DATA_OFF as u64,
            "CTRL_TAIL" => CTRL_TAIL as u64,
            "CTRL_HEAD" => CTRL_HEAD as u64,
            "CTRL_WAITING" => CTRL_WAITING as u64,
            "CTRL_DOORBELL" => CTRL_DOORBELL as u64,
            "REC_LEN" => wire::field::LEN.start as u64,
            "REC_OP" => wire::field::OP as u64,
            "REC_NARGS" => wire::field::NARGS as u64,
            "REC_RET" => wire::field::RET as u64,
            "REC_FLAGS" => wire::field::FLAGS as u64,
            "REC_ID" => wire::field::ID.start as u64,
            "REC_HEADER_LEN" => wire::HEADER_LEN as u64,
            "OP_REPLY" => u64::from(u8::from(wire::Op::Reply)),
            "REPLY_STATUS" => wire::field::REPLY_STATUS.start as u64,
            "REPLY_RET_INT" => wire::field::REPLY_RET_INT.start as u64,
            "REPLY_RET_FLOAT" => wire::field::REPLY_RET_FLOAT.start as u64,
            "REPLY_LEN" => wire::REPLY_LEN as u64,
            _ => return None,
        };
        Some(v)
    }

    fn parse_c_number(text: &str) -> Option<u64> {
        let t = text.trim_end_matches(['u', 'U', 'l', 'L']);
        match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => t.parse().ok(),
        }
    }

    #[test]
    fn c_header_agrees() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../extensions/ward_xpc_layout.h");
        let text = std::fs::read_to_string(path).expect("the C layout header is readable");
        let mut numeric = 0;
        let mut saw_name = false;
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("#define") {
                continue;
            }
            let Some(name) = words.next().and_then(|n| n.strip_prefix("WARD_XPC_")) else {
                continue;
            };
            let Some(value) = words.next() else { continue }; // include guard
            if name == "MEMFD_NAME" {
                assert_eq!(value, format!("\"{MEMFD_NAME}\""));
                saw_name = true;
                continue;
            }
            let c = parse_c_number(value).unwrap_or_else(|| panic!("WARD_XPC_{name}: cannot read {value:?}"));
            let rust =
                rust_value(name).unwrap_or_else(|| panic!("WARD_XPC_{name} has no Rust counterpart in the test"));
            assert_eq!(c, rust, "WARD_XPC_{name}");
            numeric += 1;
        }
        assert!(saw_name);
        assert!(numeric >= 25, "only {numeric} numeric constants found");
    }

    #[test]
    fn capacity_is_checked() {
        for bad in [0, 4096, 3 * 8192, MAX_RING_CAPACITY * 2] {
            assert!(matches!(Region::create(bad), Err(LayoutError::BadCapacity(_))), "{bad}");
        }
        let r = Region::create(MIN_RING_CAPACITY).unwrap();
        assert_eq!(r.memory().len(), region_len(MIN_RING_CAPACITY));
    }

    #[test]
    fn domain_checks_the_header() {
        let host = Region::create(1 << 16).unwrap();
        let fd = host.memory().fd().try_clone_to_owned().unwrap();
        let dom = Region::open_domain(fd).unwrap();
        assert_eq!(dom.capacity(), 1 << 16);

        host.memory().write_at(HDR_VERSION, &2u32.to_le_bytes()).unwrap();
        let fd = host.memory().fd().try_clone_to_owned().unwrap();
        assert!(matches!(Region::open_domain(fd), Err(LayoutError::BadVersion(2))));
        host.memory().write_at(HDR_VERSION, &VERSION.to_le_bytes()).unwrap();

        host.memory().write_at(HDR_RING_CAPACITY, &(1u32 << 15).to_le_bytes()).unwrap();
        let fd = host.memory().fd().try_clone_to_owned().unwrap();
        assert!(matches!(Region::open_domain(fd), Err(LayoutError::SizeMismatch { .. })));
        host.memory().write_at(HDR_RING_CAPACITY, &12345u32.to_le_bytes()).unwrap();
        let fd = host.memory().fd().try_clone_to_owned().unwrap();
        assert!(matches!(Region::open_domain(fd), Err(LayoutError::BadCapacity(12345))));

        host.memory().write_at(HDR_MAGIC, &0u64.to_le_bytes()).unwrap();
        let fd = host.memory().fd().try_clone_to_owned().unwrap();
        assert!(matches!(Region::open_domain(fd), Err(LayoutError::BadMagic(0))));

        let other = SharedMemory::create("not-ward", 100).unwrap();
        let fd = other.fd().as_fd().try_clone_to_owned().unwrap();
        assert!(matches!(Region::open_domain(fd), Err(LayoutError::BadMagic(0))));
    }

    #[test]
    fn each_side_publishes_its_wait_statistics_in_the_ring_it_consumes() {
        let region = Region::create(MIN_RING_CAPACITY).unwrap();
        let (_requests, mut replies) = region.host_endpoints();
        let (mut requests, _replies) = region.domain_endpoints();
        replies.set_crowding(|_| crate::runqueue::Crowding::Crowded);
        requests.set_crowding(|_| crate::runqueue::Crowding::Room);
        let stopped = crate::ring::WaitOutcome::Stopped;
        // The domain's first: the host's, on this same thread, says it waits on this processor, where the domain's
        // would then not spin.
        assert_eq!(requests.wait(1_000, None, &|| true).unwrap(), stopped);
        assert_eq!(replies.wait(10_000, None, &|| true).unwrap(), stopped);
        let host = region.host_wait_stats();
        let domain = region.domain_wait_stats();
        assert_eq!((host.spin_turns, host.cut_short), (crate::ring::FIRST_LOOK, 1), "the host's wait was cut short");
        assert_eq!((domain.spin_turns, domain.cut_short), (256, 0), "the domain's ran to its first stop check");
        assert_eq!((host.flags, domain.flags, host.sleeps, domain.sleeps), (0, 0, 0, 0));
        assert_eq!(wait_stats(region.memory(), REP_CTRL_OFF).unwrap(), host);
    }

    #[test]
    fn fault_record_round_trips_and_resets() {
        let host = Region::create(MIN_RING_CAPACITY).unwrap();
        let dom = Region::open_domain(host.memory().fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(host.read_fault_record(), FaultRecord::default());
        let rec = FaultRecord {
            valid: 1,
            signo: libc::SIGSEGV,
            code: 2,
            hint: fault_hint::STACK_OVERFLOW,
            addr: 0xdead_beef,
            call_id: 77,
        };
        dom.write_fault_record(&rec);
        assert_eq!(host.read_fault_record(), rec);
        let mut raw = [0u8; 32];
        host.memory().read_at(HDR_FAULT, &mut raw).unwrap();
        assert_eq!(&raw[16..24], &0xdead_beefu64.to_le_bytes());
        host.reset();
        assert_eq!(host.read_fault_record(), FaultRecord::default());
    }
}
