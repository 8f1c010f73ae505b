//! Across processes: a forked child plays the domain. It maps the region and pools through duplicated descriptors,
//! as `ward-domain` does, and either serves records or proves that a forbidden write kills it with SIGSEGV.

use std::os::fd::AsFd;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use ward_xpc::layout::{rep_data_off, REQ_DATA_OFF};
use ward_xpc::pool::{HostPool, MappedPool, PoolGeometry, SlotClass, POOL_IN, POOL_OUT};
use ward_xpc::ring::{RingError, WaitOutcome, MAX_RECORD};
use ward_xpc::wire::{inline_base, ArgKind, ArgList, Message, RetKind, WireArg};
use ward_xpc::{Deadline, Region};

#[derive(Debug, PartialEq, Eq)]
enum Exit {
    Code(i32),
    Signal(i32),
}

/// Run `f` in a forked child and report how the child ended. The child never returns into the test harness: a
/// panic becomes exit code 101, and it leaves with `_exit` (no atexit handlers, no harness state).
fn in_child(f: impl FnOnce() -> i32) -> Exit {
    // SAFETY: fork has no memory-safety preconditions. The child runs only `f` on this thread and then `_exit`s;
    // glibc keeps malloc usable after fork, and the child touches no lock another test thread could hold except
    // through allocation and (on a panic) stderr.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: _exit ends the process at once; nothing after it runs.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: pid is our child; status is a valid int to fill.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid);
    if libc::WIFSIGNALED(status) {
        Exit::Signal(libc::WTERMSIG(status))
    } else {
        Exit::Code(libc::WEXITSTATUS(status))
    }
}

/// In a child about to fault on purpose: no core dump.
fn no_core() {
    let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: zero is a valid rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
}

/// Request `seq`: a call with one inline argument of a length that varies with `seq`.
fn request(seq: u64, inline: &mut [u8; 512], out: &mut [u8; MAX_RECORD]) -> usize {
    let n = (seq as usize * 37) % inline.len();
    for (i, b) in inline[..n].iter_mut().enumerate() {
        *b = (seq as u8).wrapping_add(i as u8);
    }
    let mut args = ArgList::new();
    args.push(WireArg { kind: ArgKind::Int, pool: 0, a: seq, b: 0 }).unwrap();
    args.push(WireArg { kind: ArgKind::Inline, pool: 0, a: inline_base(2) as u64, b: n as u64 }).unwrap();
    let m = Message::Call { id: seq, deferred: seq % 3 == 1, func: 1, ret: RetKind::Int, args, inline: &inline[..n] };
    m.emit(out).unwrap()
}

#[test]
fn a_child_domain_echoes_records() {
    const N: u64 = 50_000;
    let region = Region::create(1 << 16).unwrap();
    let fd = region.memory().fd().try_clone_to_owned().unwrap();
    // SAFETY: fork has no memory-safety preconditions; the child runs only `echo` on this thread and then `_exit`s
    // (glibc keeps malloc usable after fork). The parent side below runs on this thread only.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = std::panic::catch_unwind(AssertUnwindSafe(move || echo(fd, N))).unwrap_or(101);
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(code) };
    }
    drop(fd);
    let (mut requests, mut replies) = region.host_endpoints();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut inline = [0u8; 512];
    let mut out = [0u8; MAX_RECORD];
    let mut back = [0u8; MAX_RECORD];
    let mut sent = 0u64;
    let mut got = 0u64;
    let check = |len: usize, back: &[u8], got: &mut u64| {
        let mut want = [0u8; MAX_RECORD];
        let mut inl = [0u8; 512];
        let n = request(*got, &mut inl, &mut want);
        assert_eq!(len, n);
        assert_eq!(&back[..n], &want[..n], "record {got}");
        *got += 1;
    };
    while got < N {
        if sent < N {
            let n = request(sent, &mut inline, &mut out);
            match requests.push(&out[..n]) {
                Ok(()) => {
                    sent += 1;
                    if sent % 7 == 1 || sent == N {
                        requests.publish();
                    }
                    continue;
                }
                Err(RingError::Full) => {
                    requests.publish();
                }
                Err(e) => panic!("{e}"),
            }
        }
        match replies.pop(&mut back).unwrap() {
            Some(len) => check(len, &back, &mut got),
            None => {
                let outcome = replies.wait(100, Some(&mut Deadline::at(deadline)), &|| false).unwrap();
                assert_eq!(outcome, WaitOutcome::Ready, "after {got} replies");
            }
        }
    }
    assert!(replies.is_empty().unwrap());
    let mut status = 0;
    // SAFETY: pid is our child; status is a valid int to fill.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
}

/// The child's side: pop each request, check it parses, push it back unchanged. Sleeps (spin 0) when idle.
fn echo(fd: std::os::fd::OwnedFd, n: u64) -> i32 {
    let region = match Region::open_domain(fd) {
        Ok(r) => r,
        Err(_) => return 2,
    };
    let (mut requests, mut replies) = region.domain_endpoints();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = [0u8; MAX_RECORD];
    let mut done = 0u64;
    while done < n {
        let len = match requests.pop(&mut buf) {
            Ok(Some(len)) => len,
            Ok(None) => {
                replies.publish();
                match requests.wait(0, Some(&mut Deadline::at(deadline)), &|| false) {
                    Ok(WaitOutcome::Ready) => continue,
                    _ => return 3,
                }
            }
            Err(_) => return 4,
        };
        match Message::parse(&buf[..len]) {
            Ok(Message::Call { id, .. }) if id == done => {}
            _ => return 5,
        }
        loop {
            match replies.push(&buf[..len]) {
                Ok(()) => break,
                Err(RingError::Full) => {
                    replies.publish();
                    if Instant::now() > deadline {
                        return 6;
                    }
                    std::thread::yield_now();
                }
                Err(_) => return 7,
            }
        }
        done += 1;
    }
    replies.publish();
    0
}

#[test]
fn the_domain_cannot_write_requests() {
    let region = Region::create(1 << 16).unwrap();
    let fd = region.memory().fd().try_clone_to_owned().unwrap();
    let exit = in_child(move || {
        no_core();
        let dom = Region::open_domain(fd).unwrap();
        let base = dom.memory().as_ptr();
        // SAFETY: both offsets lie inside the mapping (the region is REQ_DATA_OFF + 2 * capacity bytes); the reply
        // data is writable here, the request data readable. Nothing else uses these bytes.
        unsafe {
            base.add(rep_data_off(dom.capacity())).write_volatile(1);
            let _ = base.add(REQ_DATA_OFF).read_volatile();
        }
        // SAFETY: inside the mapping, but read-only in this process: this write must kill the child with SIGSEGV.
        unsafe { base.add(REQ_DATA_OFF + 100).write_volatile(1) };
        0
    });
    assert_eq!(exit, Exit::Signal(libc::SIGSEGV));
    // The host still writes there.
    region.memory().write_at(REQ_DATA_OFF + 100, &[1]).unwrap();
}

fn geometry() -> PoolGeometry {
    PoolGeometry::new(&[SlotClass { size: 4096, count: 4 }, SlotClass { size: 65536, count: 2 }]).unwrap()
}

#[test]
fn a_write_past_a_buffer_hits_the_guard_page() {
    let mut host = HostPool::create(POOL_OUT, geometry()).unwrap();
    let lease = host.alloc(100).unwrap();
    let rich = lease.rich;
    let fd = host.memory().fd().as_fd().try_clone_to_owned().unwrap();
    let exit = in_child(move || {
        no_core();
        let pool = MappedPool::map(fd, POOL_OUT, geometry(), true).unwrap();
        let p = pool.resolve(&rich).unwrap();
        // SAFETY: [p, p + 100) is the leased buffer, inside one slot's writable data (resolve checked it).
        unsafe {
            for i in 0..rich.len as usize {
                p.add(i).write_volatile(0x5a);
            }
        }
        // The buffer ends 112 bytes before the guard (100 rounded to 16): the bytes up to there are still data.
        // SAFETY: p + 111 is the last byte of the slot's data, still writable.
        unsafe { p.add(111).write_volatile(0x5a) };
        // SAFETY: p + 112 is the first byte of the guard page, PROT_NONE here: this must kill the child.
        unsafe { p.add(112).write_volatile(0x5a) };
        0
    });
    assert_eq!(exit, Exit::Signal(libc::SIGSEGV));
    let mut out = [0u8; 100];
    host.read(&lease, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0x5a), "the child's writes reached the host");
}

#[test]
fn the_input_pool_is_read_only_in_the_domain() {
    let mut host = HostPool::create(POOL_IN, geometry()).unwrap();
    let lease = host.alloc(64).unwrap();
    host.write(&lease, b"immutable input").unwrap();
    let rich = lease.rich;
    let fd = host.memory().fd().as_fd().try_clone_to_owned().unwrap();
    let exit = in_child(move || {
        no_core();
        let pool = MappedPool::map(fd, POOL_IN, geometry(), false).unwrap();
        let p = pool.resolve(&rich).unwrap();
        let mut seen = [0u8; 15];
        for (i, b) in seen.iter_mut().enumerate() {
            // SAFETY: inside the leased buffer, mapped readable.
            *b = unsafe { p.add(i).read_volatile() };
        }
        if &seen != b"immutable input" {
            return 2;
        }
        // SAFETY: the input pool is mapped read-only here: this write must kill the child.
        unsafe { p.write_volatile(b'X') };
        0
    });
    assert_eq!(exit, Exit::Signal(libc::SIGSEGV));
    let mut out = [0u8; 15];
    host.read(&lease, &mut out).unwrap();
    assert_eq!(&out, b"immutable input");
}

#[test]
fn a_child_that_exits_normally_is_told_apart() {
    // The helper itself: a plain exit is not mistaken for a fault.
    assert_eq!(in_child(|| 7), Exit::Code(7));
    assert_eq!(in_child(|| panic!("on purpose")), Exit::Code(101));
}
