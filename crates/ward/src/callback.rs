//! Host functions an extension can call back: a process-wide table of slots, one C-callable stub each.
//!
//! A slot is the callback's identity on every backend: a direct (`none`) extension calls the stub in this process,
//! a process domain calls the same slot's stub in its own process, which forwards the call here over the ring.

use std::sync::{Arc, Once, RwLock};

use ward_abi::{RegArgs, RegRet, CALLBACK_SLOTS};

use crate::call::{Signature, Value};
use crate::error::Error;

type Handler = dyn Fn(&[Value]) -> Value + Send + Sync;

struct Entry {
    signature: Signature,
    handler: Box<Handler>,
}

static SLOTS: RwLock<Vec<Option<Arc<Entry>>>> = RwLock::new(Vec::new());
static DISPATCH: Once = Once::new();

/// A registered callback. Cloning shares it; the slot is freed when the last clone is dropped (the tracker keeps a
/// clone for as long as a domain may still call it).
#[derive(Clone)]
pub struct Callback {
    inner: Arc<SlotGuard>,
}

struct SlotGuard {
    slot: usize,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut slots = SLOTS.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slots.get_mut(self.slot) {
            *s = None;
        }
    }
}

impl std::fmt::Debug for Callback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Callback(slot {})", self.inner.slot)
    }
}

impl Callback {
    /// Register a host function extensions may call back (as [`crate::Supervisor::register_callback`], for code
    /// that holds no supervisor: a class instance registering the host's features).
    pub fn new(
        signature: Signature,
        handler: impl Fn(&[Value]) -> Value + Send + Sync + 'static,
    ) -> Result<Callback, Error> {
        Callback::register(signature, handler)
    }

    pub(crate) fn register(
        signature: Signature,
        handler: impl Fn(&[Value]) -> Value + Send + Sync + 'static,
    ) -> Result<Callback, Error> {
        DISPATCH.call_once(|| ward_abi::set_callback_dispatch(dispatch_in_process));
        let mut slots = SLOTS.write().unwrap_or_else(|e| e.into_inner());
        if slots.is_empty() {
            slots.resize(CALLBACK_SLOTS, None);
        }
        let slot = slots.iter().position(Option::is_none).ok_or(Error::TooManyCallbacks(CALLBACK_SLOTS))?;
        slots[slot] = Some(Arc::new(Entry { signature, handler: Box::new(handler) }));
        Ok(Callback { inner: Arc::new(SlotGuard { slot }) })
    }

    pub fn slot(&self) -> usize {
        self.inner.slot
    }
}

/// Run the callback in `slot` with captured registers. None if nothing is registered there.
pub(crate) fn invoke(slot: usize, regs: &RegArgs) -> Option<RegRet> {
    let entry = {
        let slots = SLOTS.read().unwrap_or_else(|e| e.into_inner());
        slots.get(slot)?.clone()?
    };
    let args = entry.signature.decode(regs);
    let ret = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (entry.handler)(&args)));
    match ret {
        Ok(v) => Some(v.to_regs()),
        Err(_) => {
            tracing::error!(slot, "a host callback panicked; returning zero to the extension");
            Some(RegRet::default())
        }
    }
}

/// Where stubs land when an extension runs in this very process (the `none` backend).
fn dispatch_in_process(slot: usize, regs: &RegArgs) -> RegRet {
    invoke(slot, regs).unwrap_or_default()
}
