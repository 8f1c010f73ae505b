//! Rough speed checks of the hot paths, ignored by default (they measure, and only make sense in release):
//!
//! ```text
//! CARGO_TARGET_DIR=/tmp/target-xpc cargo test --release -p ward-xpc --test throughput -- --ignored --nocapture
//! ```
//!
//! The targets are a 400 ns round trip and 20 million deferred records a second through one ring. The assertions
//! are loose (a loaded 2-core machine must not fail them); the printed numbers are the point.

use std::time::Instant;

use ward_xpc::ring::{RingError, WaitOutcome, MAX_RECORD};
use ward_xpc::wire::{emit_reply, ArgKind, ArgList, CallView, Message, RetKind, Status, WireArg, REPLY_LEN};
use ward_xpc::Region;

fn deferred_call(id: u64, buf: &mut [u8]) -> usize {
    let mut args = ArgList::new();
    args.push(WireArg { kind: ArgKind::Int, pool: 0, a: id, b: 0 }).unwrap();
    Message::Call { id, deferred: true, func: 3, ret: RetKind::Void, args, inline: &[] }.emit(buf).unwrap()
}

#[test]
#[ignore]
fn deferred_records_per_second() {
    const N: u64 = 20_000_000;
    let region = Region::create(1 << 20).unwrap();
    let (mut p, _replies) = region.host_endpoints();
    let (mut c, _rp) = region.domain_endpoints();
    let mut rec = [0u8; 64];
    let len = deferred_call(0, &mut rec);
    let producer = std::thread::spawn(move || {
        for id in 0..N {
            rec[8..16].copy_from_slice(&id.to_le_bytes());
            loop {
                match p.push(&rec[..len]) {
                    Ok(()) => break,
                    Err(RingError::Full) => {
                        // Back off: every retry reads the consumer's head, pulling its cache line away.
                        p.publish();
                        for _ in 0..64 {
                            std::hint::spin_loop();
                        }
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            if id % 64 == 63 {
                p.publish();
            }
        }
        p.publish();
    });
    let start = Instant::now();
    let mut buf = [0u8; MAX_RECORD];
    let mut sum = 0u64;
    let mut got = 0u64;
    // WARD_XPC_PARSE=message: full Message::parse; =none: no parsing; default: the CallView fast path.
    let mode = std::env::var("WARD_XPC_PARSE").unwrap_or_default();
    let (full, view) = (mode == "message", mode != "none");
    while got < N {
        match c.pop(&mut buf).unwrap() {
            Some(n) => {
                if full {
                    if let Message::Call { id, .. } = Message::parse(&buf[..n]).unwrap() {
                        sum = sum.wrapping_add(id);
                    }
                } else if view {
                    sum = sum.wrapping_add(CallView::parse(&buf[..n]).unwrap().id());
                } else {
                    sum = sum.wrapping_add(u64::from_le_bytes(buf[8..16].try_into().unwrap()));
                }
                got += 1;
            }
            None => assert_eq!(c.wait(10_000, None, &|| false).unwrap(), WaitOutcome::Ready),
        }
    }
    producer.join().unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(sum, N * (N - 1) / 2);
    let rate = N as f64 / secs / 1e6;
    println!("deferred: {rate:.1} M records/s (parse mode {mode:?})");
}

#[test]
#[ignore]
fn round_trip_latency() {
    const N: u64 = 1_000_000;
    let region = Region::create(1 << 16).unwrap();
    let (mut requests, mut replies) = region.host_endpoints();
    let (mut dreq, mut drep) = region.domain_endpoints();
    let domain = std::thread::spawn(move || {
        let mut buf = [0u8; MAX_RECORD];
        let mut out = [0u8; REPLY_LEN];
        for _ in 0..N {
            let n = loop {
                match dreq.pop(&mut buf).unwrap() {
                    Some(n) => break n,
                    None => assert_eq!(dreq.wait(u32::MAX, None, &|| false).unwrap(), WaitOutcome::Ready),
                }
            };
            let Message::Call { id, .. } = Message::parse(&buf[..n]).unwrap() else { panic!("not a call") };
            emit_reply(&mut out, id, Status::Ok, id + 1, 0);
            drep.push(&out).unwrap();
            drep.publish();
        }
    });
    let mut rec = [0u8; 64];
    let mut buf = [0u8; MAX_RECORD];
    let start = Instant::now();
    for id in 0..N {
        let len = deferred_call(id, &mut rec);
        rec[4] = 1; // a plain call
        requests.push(&rec[..len]).unwrap();
        requests.publish();
        let n = loop {
            match replies.pop(&mut buf).unwrap() {
                Some(n) => break n,
                None => assert_eq!(replies.wait(u32::MAX, None, &|| false).unwrap(), WaitOutcome::Ready),
            }
        };
        let Message::Reply { id: rid, ret_int, .. } = Message::parse(&buf[..n]).unwrap() else { panic!("not a reply") };
        assert_eq!((rid, ret_int), (id, id + 1));
    }
    let ns = start.elapsed().as_nanos() as f64 / N as f64;
    domain.join().unwrap();
    println!("round trip (both sides polling): {ns:.0} ns");
}
