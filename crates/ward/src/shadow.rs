//! The shadow log (Nooks' shadow drivers, in the small): state-establishing calls are recorded with owned copies of
//! their inputs and replayed into a new incarnation, and instance handles are remapped so the host keeps using the
//! handles it already has.

use std::collections::HashMap;
use std::ffi::CString;

use crate::call::{Arg, RetType};
use crate::callback::Callback;

/// An argument kept for replay.
#[derive(Debug, Clone)]
pub(crate) enum OwnedArg {
    I64(i64),
    U64(u64),
    F64(f64),
    F32(f32),
    Ptr(usize),
    In(Vec<u8>),
    /// Outputs are not kept; replay gives the extension a scratch buffer of the same length.
    Out(usize),
    InOut(Vec<u8>),
    Str(CString),
    Handle(u64),
    Callback(Callback),
}

impl OwnedArg {
    pub fn from_arg(arg: &Arg<'_>) -> OwnedArg {
        match arg {
            Arg::I64(v) => OwnedArg::I64(*v),
            Arg::U64(v) => OwnedArg::U64(*v),
            Arg::F64(v) => OwnedArg::F64(*v),
            Arg::F32(v) => OwnedArg::F32(*v),
            Arg::Ptr(v) => OwnedArg::Ptr(*v),
            Arg::In(b) => OwnedArg::In(b.to_vec()),
            Arg::Out(b) => OwnedArg::Out(b.len()),
            Arg::InOut(b) => OwnedArg::InOut(b.to_vec()),
            Arg::Str(s) => OwnedArg::Str((*s).to_owned()),
            Arg::Handle(h) => OwnedArg::Handle(*h),
            Arg::Callback(c) => OwnedArg::Callback((*c).clone()),
        }
    }
}

/// Two arguments that are the same scalar or handle (buffers, strings and callbacks never are).
fn same_scalar(a: &OwnedArg, b: &OwnedArg) -> bool {
    match (a, b) {
        (OwnedArg::I64(x), OwnedArg::I64(y)) => x == y,
        (OwnedArg::U64(x), OwnedArg::U64(y)) => x == y,
        (OwnedArg::F64(x), OwnedArg::F64(y)) => x.to_bits() == y.to_bits(),
        (OwnedArg::F32(x), OwnedArg::F32(y)) => x.to_bits() == y.to_bits(),
        (OwnedArg::Ptr(x), OwnedArg::Ptr(y)) => x == y,
        (OwnedArg::Handle(x), OwnedArg::Handle(y)) => x == y,
        _ => false,
    }
}

/// One recorded call.
#[derive(Debug, Clone)]
pub(crate) struct ShadowEntry {
    /// Index into the domain's symbol table.
    pub symbol: usize,
    pub args: Vec<OwnedArg>,
    pub ret: RetType,
    /// The host handle this call created, if it returned one.
    pub created: Option<u64>,
}

impl ShadowEntry {
    fn uses(&self, handle: u64) -> bool {
        self.created == Some(handle) || self.args.iter().any(|a| matches!(a, OwnedArg::Handle(h) if *h == handle))
    }
}

#[derive(Debug, Default)]
pub(crate) struct ShadowLog {
    entries: Vec<ShadowEntry>,
}

impl ShadowLog {
    pub fn record(&mut self, entry: ShadowEntry) {
        self.entries.push(entry);
    }

    /// Record `entry`, dropping earlier entries of the same function whose first `key` arguments are the same
    /// (a setter: only the last value needs replaying). Only scalars and handles count as the same.
    pub fn record_replacing(&mut self, entry: ShadowEntry, key: usize) {
        let same = |e: &ShadowEntry| {
            e.symbol == entry.symbol
                && e.args.len() >= key
                && entry.args.len() >= key
                && e.args[..key].iter().zip(&entry.args[..key]).all(|(a, b)| same_scalar(a, b))
        };
        self.entries.retain(|e| !same(e));
        self.entries.push(entry);
    }

    /// The handle's object was destroyed: its history no longer needs replaying.
    pub fn forget_handle(&mut self, handle: u64) {
        self.entries.retain(|e| !e.uses(handle));
    }

    pub fn entries(&self) -> &[ShadowEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Host handles and the objects of the current incarnation they stand for.
///
/// Host handles are ward's own numbers, never the extension's pointers: they stay valid across restarts, and a
/// pointer from a domain is never mistaken for a host address.
#[derive(Debug)]
pub(crate) struct HandleMap {
    next: u64,
    current: HashMap<u64, u64>,
}

/// Host handles count up from here, so they are recognisable in a debugger and never small integers.
const HANDLE_BASE: u64 = 0x5744_0000_0000_0000;

impl Default for HandleMap {
    fn default() -> Self {
        HandleMap { next: HANDLE_BASE, current: HashMap::new() }
    }
}

impl HandleMap {
    /// A new host handle for an object of the current incarnation.
    pub fn create(&mut self, object: u64) -> u64 {
        self.next += 1;
        self.current.insert(self.next, object);
        self.next
    }

    /// The current object behind a host handle.
    pub fn object(&self, handle: u64) -> Option<u64> {
        self.current.get(&handle).copied()
    }

    /// After replay: the handle now stands for this object of the new incarnation.
    pub fn rebind(&mut self, handle: u64, object: u64) {
        self.current.insert(handle, object);
    }

    pub fn remove(&mut self, handle: u64) -> bool {
        self.current.remove(&handle).is_some()
    }

    pub fn len(&self) -> usize {
        self.current.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setter(symbol: usize, handle: u64, index: u64, value: &[u8]) -> ShadowEntry {
        let args = vec![OwnedArg::Handle(handle), OwnedArg::U64(index), OwnedArg::In(value.to_vec())];
        ShadowEntry { symbol, args, ret: RetType::I64, created: None }
    }

    #[test]
    fn a_replacing_setter_keeps_only_its_last_value_per_key() {
        let mut log = ShadowLog::default();
        log.record(setter(0, 7, 0, b"create"));
        for frame in 0..1000u32 {
            log.record_replacing(setter(1, 7, 0, &frame.to_le_bytes()), 2);
            log.record_replacing(setter(1, 7, 1, b"other"), 2);
            log.record_replacing(setter(1, 8, 0, b"another instance"), 2);
        }
        // The creation, and one entry per (instance, index), the last in order.
        assert_eq!(log.len(), 4);
        let last = &log.entries()[1..];
        assert!(matches!(&last[0].args[2], OwnedArg::In(v) if v[..] == 999u32.to_le_bytes()));
        assert!(matches!(&last[0].args[1], OwnedArg::U64(0)));
        assert!(matches!(&last[1].args[1], OwnedArg::U64(1)));
        assert!(matches!(&last[2].args[0], OwnedArg::Handle(8)));
        // Another function's entries are never replaced.
        assert!(matches!(&log.entries()[0].args[2], OwnedArg::In(v) if v == b"create"));
    }

    #[test]
    fn handles_are_stable_across_rebinding() {
        let mut m = HandleMap::default();
        let h = m.create(0x1000);
        assert_eq!(m.object(h), Some(0x1000));
        m.rebind(h, 0);
        assert_eq!(m.object(h), Some(0));
        m.rebind(h, 0x2000);
        assert_eq!(m.object(h), Some(0x2000));
        assert!(m.remove(h));
        assert_eq!(m.object(h), None);
    }

    #[test]
    fn forgetting_a_handle_drops_its_history_only() {
        let mut log = ShadowLog::default();
        log.record(ShadowEntry { symbol: 0, args: vec![OwnedArg::I64(1)], ret: RetType::Handle, created: Some(7) });
        log.record(ShadowEntry { symbol: 1, args: vec![OwnedArg::Handle(7)], ret: RetType::I64, created: None });
        log.record(ShadowEntry { symbol: 2, args: vec![OwnedArg::I64(5)], ret: RetType::I64, created: None });
        log.forget_handle(7);
        assert_eq!(log.len(), 1);
        assert_eq!(log.entries()[0].symbol, 2);
    }
}
