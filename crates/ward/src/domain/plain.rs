//! The call path with nothing in it: a call of a domain without isolation (`none`) whose function needs no
//! bookkeeping goes straight to the function, as the host would call it without ward.
//!
//! Such a domain cannot fail on its own (a fault in the extension is the host's), so a call of it has no deadline
//! to keep, nothing to recover, no history to keep, and nothing to learn. What the core still does for other
//! calls (the domain's lock, the symbol table, the shadow log) is needed only by functions the policy marks `state`
//! or `destroys`, by functions returning handles, by scratch copies, and once the domain has been recovered (a
//! class wrapper's `declare_fault`): those calls take the full path, [`Domain::call`]. A plain call takes no lock
//! (calls are as concurrent as the host makes them, as without ward), allocates nothing and formats nothing.

use std::sync::atomic::Ordering;

use super::Domain;
use crate::backend::{Callable, NativeEntry};
use crate::call::{Arg, RetType, Value};

/// A function resolved for plain calls, kept by the host's [`crate::Function`].
#[derive(Clone, Copy)]
pub(crate) struct PlainFunction(NativeEntry);

impl Domain {
    /// The function `sym` for plain calls, if its calls may take that path: its domain has no isolation, its
    /// backend lets the host call it directly, and its policy asks for no bookkeeping.
    pub(crate) fn plain_function(&self, sym: usize) -> Option<PlainFunction> {
        if !self.unisolated {
            return None;
        }
        let g = self.lock.lock();
        let callable = {
            let st = g.borrow();
            let s = st.symbols.get(sym)?;
            let p = &s.policy;
            if p.state || p.destroys || p.replaces_same.is_some() {
                return None;
            }
            s.func.clone()
        };
        let callable = match callable {
            Some(c) => c,
            None => self.resolved(&g, sym).ok()?,
        };
        match callable {
            Callable::OnThread(f) => f.native_entry().map(PlainFunction),
            Callable::Ring(_) => None,
        }
    }

    /// A plain call of `f`, or `None` when this call needs the full path: the domain was recovered since, the
    /// result is a handle, or an argument is a handle the full path must report, a scratch buffer, a callback
    /// without a stub, or one more than its registers hold (the full path says which).
    #[inline]
    pub(crate) fn call_plain(&self, f: PlainFunction, args: &mut [Arg<'_>], ret: RetType) -> Option<Value> {
        if !self.plain_calls.load(Ordering::Acquire) || ret == RetType::Handle {
            return None;
        }
        let mut regs = ward_abi::ArgPacker::new();
        for a in args.iter_mut() {
            let packed = match a {
                Arg::I64(v) => regs.push_int(*v as u64),
                Arg::U64(v) => regs.push_int(*v),
                Arg::Ptr(v) => regs.push_int(*v as u64),
                Arg::F64(v) => regs.push_f64(*v),
                Arg::F32(v) => regs.push_f32(*v),
                Arg::In(b) => regs.push_int(b.as_ptr() as u64),
                Arg::InVec(v) => regs.push_int(v.as_ptr() as u64),
                Arg::Out(b) | Arg::InOut(b) => regs.push_int(b.as_mut_ptr() as u64),
                Arg::Str(s) => regs.push_int(s.as_ptr() as u64),
                // Without isolation the host's own `Callback` keeps the slot alive: nothing to track.
                Arg::Callback(c) => regs.push_int(ward_abi::callback_stub(c.slot())? as u64),
                // A domain never recovered has each handle's first object: no replay has moved it.
                Arg::Handle(h) => match self.handles.lock().unwrap_or_else(|e| e.into_inner()).object(*h) {
                    Some(object) if object != 0 => regs.push_int(object),
                    _ => return None,
                },
                Arg::Scratch(_) => return None,
            };
            packed.ok()?;
        }
        Some(Value::from_regs(ret, f.0.call(regs.regs())))
    }
}
