//! The shadow log (Nooks' shadow drivers, in the small): state-establishing calls are recorded with owned copies of
//! their inputs and replayed into a new incarnation, and instance handles are remapped so the host keeps using the
//! handles it already has.

use std::collections::HashMap;
use std::ffi::{CStr, CString};

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
    Scratch(Vec<u8>),
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
            Arg::Scratch(b) => OwnedArg::Scratch(b.to_vec()),
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
    /// A data call kept as history (see [`crate::policy::FunctionPolicy::history`]), not a state call.
    pub history: bool,
}

impl ShadowEntry {
    /// Bytes this entry holds: its inputs, and a fixed charge for the entry itself (so calls with scalar
    /// arguments only count too).
    fn held(&self) -> usize {
        64 + self
            .args
            .iter()
            .map(|a| match a {
                OwnedArg::In(b) | OwnedArg::InOut(b) | OwnedArg::Scratch(b) => b.len(),
                _ => 0,
            })
            .sum::<usize>()
    }

    fn uses(&self, handle: u64) -> bool {
        self.created == Some(handle) || self.args.iter().any(|a| matches!(a, OwnedArg::Handle(h) if *h == handle))
    }
}

#[derive(Debug, Default)]
pub(crate) struct ShadowLog {
    entries: Vec<ShadowEntry>,
    /// Input bytes held by history entries.
    history_bytes: usize,
    /// The history outgrew its bound once: it was dropped and is no longer kept.
    history_dropped: bool,
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

    /// Keep a data call (`entry.history` set) while the history holds at most `bound` bytes of input. Past the
    /// bound the whole history is dropped, for good: replaying part of it would not rebuild the state either.
    /// Returns false when the entry was not kept.
    pub fn record_history(&mut self, entry: ShadowEntry, bound: usize) -> bool {
        if self.history_dropped {
            return false;
        }
        let held = entry.held();
        if self.history_bytes + held > bound {
            self.entries.retain(|e| !e.history);
            self.history_bytes = 0;
            self.history_dropped = true;
            return false;
        }
        self.history_bytes += held;
        self.entries.push(entry);
        true
    }

    /// Forget the latest history entry of a symbol `of` accepts (a call whose result turned out wrong).
    pub fn drop_last_history(&mut self, of: impl Fn(usize) -> bool) {
        if let Some(at) = self.entries.iter().rposition(|e| e.history && of(e.symbol)) {
            let entry = self.entries.remove(at);
            self.history_bytes -= entry.held();
        }
    }

    /// Whether the history outgrew its bound and was dropped.
    pub fn history_dropped(&self) -> bool {
        self.history_dropped
    }

    /// The handle's object was destroyed: its history no longer needs replaying.
    pub fn forget_handle(&mut self, handle: u64) {
        self.entries.retain(|e| !e.uses(handle));
        self.history_bytes = self.entries.iter().filter(|e| e.history).map(ShadowEntry::held).sum();
    }

    /// In the entries of the symbols `of` accepts, replace string arguments equal to `from` by `to`; returns how
    /// many were replaced. How a class adapter's `open(path)` is pointed at another file (`restart_from`).
    pub fn replace_string(&mut self, of: impl Fn(usize) -> bool, from: &CStr, to: &CStr) -> usize {
        let mut replaced = 0;
        for entry in self.entries.iter_mut().filter(|e| of(e.symbol)) {
            for arg in &mut entry.args {
                if matches!(arg, OwnedArg::Str(s) if s.as_c_str() == from) {
                    *arg = OwnedArg::Str(to.to_owned());
                    replaced += 1;
                }
            }
        }
        replaced
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
        ShadowEntry { symbol, args, ret: RetType::I64, created: None, history: false }
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

    fn data_call(symbol: usize, handle: u64, block: &[u8]) -> ShadowEntry {
        let args = vec![OwnedArg::Handle(handle), OwnedArg::In(block.to_vec()), OwnedArg::Out(block.len())];
        ShadowEntry { symbol, args, ret: RetType::I64, created: None, history: true }
    }

    #[test]
    fn history_is_kept_in_order_within_its_bound_then_dropped_for_good() {
        let mut log = ShadowLog::default();
        log.record(setter(0, 7, 0, b"create"));
        // Each block holds 64 + 100 bytes: six fit in 1000, the seventh does not.
        for block in 0..6u8 {
            assert!(log.record_history(data_call(1, 7, &[block; 100]), 1000));
            log.record_replacing(setter(2, 7, 0, &[block]), 2);
        }
        let blocks: Vec<u8> = log
            .entries()
            .iter()
            .filter(|e| e.history)
            .map(|e| match &e.args[1] {
                OwnedArg::In(b) => b[0],
                _ => unreachable!("a data call's block"),
            })
            .collect();
        assert_eq!(blocks, [0, 1, 2, 3, 4, 5]);
        // The wrong result of the latest block is forgotten.
        log.drop_last_history(|s| s == 1);
        assert_eq!(log.entries().iter().filter(|e| e.history).count(), 5);
        assert!(log.record_history(data_call(1, 7, &[5; 100]), 1000));
        assert!(!log.record_history(data_call(1, 7, &[6; 100]), 1000), "past the bound");
        assert!(log.history_dropped());
        assert!(log.entries().iter().all(|e| !e.history), "all of it dropped");
        assert_eq!(log.len(), 2, "the state calls stay");
        assert!(!log.record_history(data_call(1, 7, &[7; 1]), 1000), "no history once dropped");
    }

    #[test]
    fn destroying_an_instance_forgets_its_history_and_frees_its_bound() {
        let mut log = ShadowLog::default();
        for _ in 0..5 {
            assert!(log.record_history(data_call(1, 7, &[0; 100]), 1000));
        }
        log.forget_handle(7);
        assert_eq!(log.len(), 0);
        for _ in 0..6 {
            assert!(log.record_history(data_call(1, 8, &[0; 100]), 1000), "the bound is free again");
        }
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
        log.record(ShadowEntry {
            symbol: 0,
            args: vec![OwnedArg::I64(1)],
            ret: RetType::Handle,
            created: Some(7),
            history: false,
        });
        log.record(ShadowEntry {
            symbol: 1,
            args: vec![OwnedArg::Handle(7)],
            ret: RetType::I64,
            created: None,
            history: false,
        });
        log.record(ShadowEntry {
            symbol: 2,
            args: vec![OwnedArg::I64(5)],
            ret: RetType::I64,
            created: None,
            history: false,
        });
        log.forget_handle(7);
        assert_eq!(log.len(), 1);
        assert_eq!(log.entries()[0].symbol, 2);
    }
}
