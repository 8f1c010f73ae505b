use std::time::Instant;
use ward_xpc::wire::{ArgKind, ArgList, Message, RetKind, WireArg};
#[test]
#[ignore]
fn parse_cost() {
    let mut args = ArgList::new();
    args.push(WireArg {
        kind: ArgKind::Int,
        pool: 0,
        a: 5,
        b: 0,
    })
    .unwrap();
    let mut buf = [0u8; 64];
    let n = Message::Call {
        id: 1,
        deferred: true,
        func: 3,
        ret: RetKind::Void,
        args,
        inline: &[],
    }
    .emit(&mut buf)
    .unwrap();
    let t = Instant::now();
    let mut s = 0u64;
    for i in 0..10_000_000u64 {
        buf[8..16].copy_from_slice(&i.to_le_bytes());
        if let Message::Call { id, .. } = Message::parse(std::hint::black_box(&buf[..n])).unwrap() {
            s = s.wrapping_add(id);
        }
    }
    println!("parse: {:.1} ns {s}", t.elapsed().as_nanos() as f64 / 1e7);
}
#[test]
#[ignore]
fn parse_cost_ping() {
    let mut buf = [0u8; 64];
    let n = Message::Ping { id: 1 }.emit(&mut buf).unwrap();
    let t = Instant::now();
    let mut s = 0u64;
    for i in 0..10_000_000u64 {
        buf[8..16].copy_from_slice(&i.to_le_bytes());
        if let Message::Ping { id } = Message::parse(std::hint::black_box(&buf[..n])).unwrap() {
            s = s.wrapping_add(id);
        }
    }
    println!(
        "parse ping: {:.1} ns {s}",
        t.elapsed().as_nanos() as f64 / 1e7
    );
    let t = Instant::now();
    for i in 0..10_000_000u64 {
        buf[8..16].copy_from_slice(&i.to_le_bytes());
        let h = ward_xpc::wire::RecordHeader::parse(std::hint::black_box(&buf[..n])).unwrap();
        s = s.wrapping_add(h.id);
    }
    println!(
        "parse header: {:.1} ns {s}",
        t.elapsed().as_nanos() as f64 / 1e7
    );
}
#[test]
#[ignore]
fn parse_cost_view() {
    let mut args = ArgList::new();
    args.push(WireArg {
        kind: ArgKind::Int,
        pool: 0,
        a: 5,
        b: 0,
    })
    .unwrap();
    let mut buf = [0u8; 64];
    let n = Message::Call {
        id: 1,
        deferred: true,
        func: 3,
        ret: RetKind::Void,
        args,
        inline: &[],
    }
    .emit(&mut buf)
    .unwrap();
    let t = Instant::now();
    let mut s = 0u64;
    for i in 0..10_000_000u64 {
        buf[8..16].copy_from_slice(&i.to_le_bytes());
        let v = ward_xpc::wire::CallView::parse(std::hint::black_box(&buf[..n])).unwrap();
        s = s.wrapping_add(v.id()).wrapping_add(v.arg(0).unwrap().a);
    }
    println!(
        "parse view: {:.1} ns {s}",
        t.elapsed().as_nanos() as f64 / 1e7
    );
}
