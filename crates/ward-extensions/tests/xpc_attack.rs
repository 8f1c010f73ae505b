//! The protocol attacks of faulty.so (GARBAGE_REPLY, FORGED_REPLY) against a
//! simulated ward-xpc region: a child process (this test binary again) maps a
//! memfd named "ward-xpc" laid out as in `extensions/ward_xpc_layout.h`, with
//! the request data made read-only as in a domain (which splits the mapping),
//! and calls the attack; the parent watches the reply ring through its own
//! mapping of the same memfd. The child never returns from the attack and is
//! killed.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "WARD_EXTENSIONS_ATTACK_CHILD";
const CAPACITY: u64 = 8192;
/// Initial reply tail: wrapped around three times, then 80 bytes in.
const START_TAIL: u64 = 3 * CAPACITY + 80;

/// The `#define WARD_XPC_*` numbers of the layout header.
fn layout() -> HashMap<String, u64> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../extensions/ward_xpc_layout.h");
    let text = std::fs::read_to_string(path).unwrap();
    let mut map = HashMap::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        let value = value.trim_end_matches(['u', 'U', 'l', 'L']);
        let parsed = match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => value.parse().ok(),
        };
        if let Some(v) = parsed {
            map.insert(name.to_owned(), v);
        }
    }
    map
}

struct Region {
    fd: i32,
    base: *mut u8,
    len: usize,
    layout: HashMap<String, u64>,
}

impl Region {
    fn c(&self, name: &str) -> usize {
        *self.layout.get(name).unwrap_or_else(|| panic!("{name} missing")) as usize
    }

    fn map(fd: i32) -> Region {
        let layout = layout();
        let len = layout["WARD_XPC_REQ_DATA_OFF"] as usize + 2 * CAPACITY as usize;
        // SAFETY: fd is a memfd of at least len bytes; a fresh shared mapping
        // aliases no Rust object.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        assert_ne!(base, libc::MAP_FAILED, "mmap");
        Region { fd, base: base.cast(), len, layout }
    }

    fn read_u64(&self, off: usize) -> u64 {
        assert!(off + 8 <= self.len);
        // SAFETY: in bounds (checked) of a live mapping; volatile because the
        // other process writes it.
        unsafe { std::ptr::read_volatile(self.base.add(off).cast::<u64>()) }
    }

    fn read_u32(&self, off: usize) -> u32 {
        assert!(off + 4 <= self.len);
        // SAFETY: in bounds (checked) of a live mapping, 4-aligned (the
        // callers pass a u32 field's offset); volatile because the other
        // process writes it.
        unsafe { std::ptr::read_volatile(self.base.add(off).cast::<u32>()) }
    }

    fn write(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len);
        // SAFETY: in bounds (checked) of a live writable mapping.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(off), bytes.len()) }
    }

    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        (off..off + len)
            .map(|i| {
                assert!(i < self.len);
                // SAFETY: in bounds (checked) of a live mapping.
                unsafe { std::ptr::read_volatile(self.base.add(i)) }
            })
            .collect()
    }
}

/// Runs in the child: map the region the parent prepared, then attack.
#[test]
fn attack_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return; // only meaningful when spawned by `attack` below
    };
    let (fd, func) = spec.split_once(':').unwrap();
    let region = Region::map(fd.parse().unwrap());
    // As in a domain: the request data is read-only, which splits the mapping.
    let req_data = region.c("WARD_XPC_REQ_DATA_OFF");
    // SAFETY: the range is page-aligned and inside the mapping.
    let rc = unsafe { libc::mprotect(region.base.add(req_data).cast(), CAPACITY as usize, libc::PROT_READ) };
    assert_eq!(rc, 0, "mprotect");
    // SAFETY: region.fd stays open in the parent and in the mapping; closing
    // our copy does not affect the mapping.
    unsafe { libc::close(region.fd) };

    let path = CString::new(ward_extensions::path_of("faulty").unwrap().into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: path is a valid C string; faulty.so has no constructors.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null());
    let name = CString::new(func).unwrap();
    // SAFETY: handle is live, name a valid C string.
    let sym = unsafe { libc::dlsym(handle, name.as_ptr()) };
    assert!(!sym.is_null());
    // SAFETY: both attacks are `int64_t f(void)`.
    let attack = unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> i64>(sym) };
    let ret = attack();
    panic!("{func} returned {ret} instead of blocking");
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prepares a region, lets a child run `func` against it, returns the 48
/// bytes that appeared in the reply ring.
fn attack(func: &str) -> Vec<u8> {
    let name = CString::new("ward-xpc").unwrap();
    // SAFETY: name is a valid C string. No MFD_CLOEXEC: the child inherits it.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create");
    let layout = layout();
    let len = layout["WARD_XPC_REQ_DATA_OFF"] + 2 * CAPACITY;
    // SAFETY: fd is our memfd.
    assert_eq!(unsafe { libc::ftruncate(fd, len as libc::off_t) }, 0);
    let region = Region::map(fd);

    region.write(region.c("WARD_XPC_HDR_MAGIC"), &region.layout["WARD_XPC_MAGIC"].to_le_bytes());
    region.write(region.c("WARD_XPC_HDR_VERSION"), &(region.layout["WARD_XPC_VERSION"] as u32).to_le_bytes());
    region.write(region.c("WARD_XPC_HDR_RING_CAPACITY"), &(CAPACITY as u32).to_le_bytes());
    let ctrl = region.c("WARD_XPC_REP_CTRL_OFF");
    let tail_off = ctrl + region.c("WARD_XPC_CTRL_TAIL");
    let doorbell_off = ctrl + region.c("WARD_XPC_CTRL_DOORBELL");
    region.write(tail_off, &START_TAIL.to_le_bytes());
    region.write(ctrl + region.c("WARD_XPC_CTRL_HEAD"), &START_TAIL.to_le_bytes());

    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "attack_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{fd}:{func}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    // SAFETY: the child has its own copy of fd (and the mapping keeps ours alive).
    unsafe { libc::close(fd) };

    let reply_len = region.layout["WARD_XPC_REPLY_LEN"];
    let deadline = Instant::now() + Duration::from_secs(30);
    while region.read_u64(tail_off) == START_TAIL {
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("child exited with {status} before publishing a reply");
        }
        assert!(Instant::now() < deadline, "no reply within 30 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(region.read_u64(tail_off), START_TAIL + reply_len);
    assert_eq!(region.read_u32(doorbell_off), 1);
    // It blocks instead of returning into the (simulated) domain.
    std::thread::sleep(Duration::from_millis(100));
    assert!(child.0.try_wait().unwrap().is_none(), "child did not block");

    let data = region.c("WARD_XPC_REQ_DATA_OFF") + CAPACITY as usize;
    let at = data + (START_TAIL & (CAPACITY - 1)) as usize;
    // Nothing else in the ring was touched.
    assert!(region.bytes(data, at - data).iter().all(|&b| b == 0));
    let after = at + reply_len as usize;
    assert!(region.bytes(after, data + CAPACITY as usize - after).iter().all(|&b| b == 0));
    let record = region.bytes(at, reply_len as usize);
    drop(child);
    // SAFETY: base/len describe our mapping, no longer used.
    unsafe { libc::munmap(region.base.cast(), region.len) };
    record
}

#[test]
fn garbage_reply_fills_the_next_reply_record_with_0xa5() {
    let record = attack("faulty_garbage_reply");
    assert_eq!(record, vec![0xa5; record.len()]);
}

#[test]
fn forged_reply_is_a_well_formed_reply_with_an_unused_id() {
    let record = attack("faulty_forged_reply");
    let l = layout();
    let at = |name: &str| l[name] as usize;
    let u32_at = |off: usize| u32::from_le_bytes(record[off..off + 4].try_into().unwrap());
    let u64_at = |off: usize| u64::from_le_bytes(record[off..off + 8].try_into().unwrap());
    assert_eq!(u64::from(u32_at(at("WARD_XPC_REC_LEN"))), l["WARD_XPC_REPLY_LEN"]);
    assert_eq!(u64::from(record[at("WARD_XPC_REC_OP")]), l["WARD_XPC_OP_REPLY"]);
    assert_eq!(record[at("WARD_XPC_REC_NARGS")], 0);
    assert_eq!(record[at("WARD_XPC_REC_RET")], 0);
    assert_eq!(record[at("WARD_XPC_REC_FLAGS")], 0);
    assert_eq!(u64_at(at("WARD_XPC_REC_ID")), 0x7761_7264_0000_0001);
    assert_eq!(u32_at(at("WARD_XPC_REPLY_STATUS")), 0);
    assert_eq!(u64_at(at("WARD_XPC_REPLY_RET_INT")), 42);
    assert_eq!(u64_at(at("WARD_XPC_REPLY_RET_FLOAT")), 0);
}
