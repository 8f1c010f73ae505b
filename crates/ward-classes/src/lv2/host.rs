//! The host's side of an instance's features: the URID map and unmap and the log, reached from the domain through
//! one callback per instance. Text crosses 32 bytes a call (a callback carries registers only); the adapter caches
//! what it mapped, so a URI crosses once per instance.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ward::{Callback, RetType, Signature, ValType, Value};

use crate::ClassError;

/// What an instance's features lead to in the host. Implementations are called from any thread that calls into the
/// instance (the plugin maps URIs in `run` too); they must not block for long.
pub trait Host: Send + Sync {
    /// The URID of `uri` in the host's map (0 when it cannot map it).
    fn map(&self, uri: &str) -> u32;
    /// The URI of `urid`, if the host's map has it.
    fn unmap(&self, urid: u32) -> Option<String>;
    /// A message the plugin logged (`log:log`), of the log type `log_type` (a URID), cut at 512 bytes and bounded in
    /// rate by the adapter.
    fn log(&self, log_type: u32, message: &str);
}

/// A URID map of its own, for hosts that have none (Rust hosts, tests): URIDs from 1, in the order first mapped;
/// messages go to `tracing`.
#[derive(Debug, Default)]
pub struct UridMap {
    inner: Mutex<(HashMap<String, u32>, Vec<String>)>,
}

impl UridMap {
    pub fn new() -> UridMap {
        UridMap::default()
    }
}

impl Host for UridMap {
    fn map(&self, uri: &str) -> u32 {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&u) = g.0.get(uri) {
            return u;
        }
        g.1.push(uri.to_string());
        let u = g.1.len() as u32;
        g.0.insert(uri.to_string(), u);
        u
    }

    fn unmap(&self, urid: u32) -> Option<String> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (urid as usize).checked_sub(1).and_then(|i| g.1.get(i).cloned())
    }

    fn log(&self, log_type: u32, message: &str) {
        tracing::info!(log_type, "LV2 plugin: {}", message.trim_end());
    }
}

/// What the callback is asked (its first argument); see the adapter's HOST_* codes.
const PUT: i64 = 1;
const MAP: i64 = 2;
const UNMAP_LEN: i64 = 3;
const UNMAP_GET: i64 = 4;
const LOG: i64 = 5;

/// The most text one message or URI may gather before it is sent (a domain sending more is cut off).
const MAX_TEXT: usize = 8192;
/// The most URIs one instance may have the host map: an honest plugin maps tens, each once (the adapter caches
/// them); a hostile one calling the callback itself must not grow the host's map without bound.
const MAX_MAPPED: u32 = 65536;
/// The most log messages one instance hands the host a second (the adapter bounds them too, but the host does not
/// trust the domain to).
const MAX_LOGS_PER_SECOND: u32 = 20;

/// The text being sent by the domain, and the URI last unmapped, being fetched.
#[derive(Default)]
struct Exchange {
    text: Vec<u8>,
    unmapped: Vec<u8>,
    /// URIs mapped so far (each time the domain asked).
    mapped: u32,
    /// Log messages in the current second, and when it started.
    logged: u32,
    log_window: Option<std::time::Instant>,
}

/// The callback of one instance.
pub(crate) fn callback(host: Arc<dyn Host>) -> Result<Callback, ClassError> {
    let exchange = Mutex::new(Exchange::default());
    let signature = Signature::new(&[ValType::I64; 6], RetType::I64);
    let callback = Callback::new(signature, move |args| {
        let word = |i: usize| match args.get(i) {
            Some(Value::I64(v)) => *v,
            _ => 0,
        };
        let mut x = exchange.lock().unwrap_or_else(|e| e.into_inner());
        let result = match word(0) {
            PUT => {
                let n = (word(1).clamp(0, 32)) as usize;
                let mut bytes = [0u8; 32];
                for (i, chunk) in bytes.chunks_exact_mut(8).enumerate() {
                    chunk.copy_from_slice(&word(2 + i).to_le_bytes());
                }
                if x.text.len() + n <= MAX_TEXT {
                    x.text.extend_from_slice(&bytes[..n]);
                }
                0
            }
            MAP => {
                let text = std::mem::take(&mut x.text);
                if x.mapped >= MAX_MAPPED {
                    0
                } else {
                    x.mapped += 1;
                    match std::str::from_utf8(&text) {
                        Ok(uri) if !uri.is_empty() => i64::from(host.map(uri)),
                        _ => 0,
                    }
                }
            }
            UNMAP_LEN => match u32::try_from(word(1)).ok().and_then(|u| host.unmap(u)) {
                Some(uri) => {
                    x.unmapped = uri.into_bytes();
                    x.unmapped.len() as i64
                }
                None => {
                    x.unmapped.clear();
                    -1
                }
            },
            UNMAP_GET => {
                let at = usize::try_from(word(1)).unwrap_or(usize::MAX);
                let mut w = [0u8; 8];
                if let Some(rest) = x.unmapped.get(at..) {
                    let n = rest.len().min(8);
                    w[..n].copy_from_slice(&rest[..n]);
                }
                i64::from_le_bytes(w)
            }
            LOG => {
                let text = std::mem::take(&mut x.text);
                let now = std::time::Instant::now();
                if x.log_window.is_none_or(|w| now.duration_since(w) >= std::time::Duration::from_secs(1)) {
                    x.log_window = Some(now);
                    x.logged = 0;
                }
                if x.logged < MAX_LOGS_PER_SECOND {
                    x.logged += 1;
                    host.log(word(1) as u32, &String::from_utf8_lossy(&text));
                }
                0
            }
            _ => 0,
        };
        Value::I64(result)
    })?;
    Ok(callback)
}
