//! The host's side of an instance's features: the URID map and unmap, the log and the state extension's path
//! functions, reached from the domain through one callback per instance. Text crosses 32 bytes a call (a callback
//! carries registers only); the adapter caches what it mapped, so a URI crosses once per instance. Everything the
//! domain sends is checked here before the host's functions see it: it comes from a plugin ward does not trust.

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
    /// `state:mapPath`'s `abstract_path`: the path to store for the absolute path `absolute` (`None`: the host
    /// cannot map it, the plugin gets NULL). Called only for a call the host offered `map_path` to.
    fn abstract_path(&self, absolute: &str) -> Option<String> {
        let _ = absolute;
        None
    }
    /// `state:mapPath`'s `absolute_path`: the absolute path of the stored path `abstract_path`.
    fn absolute_path(&self, abstract_path: &str) -> Option<String> {
        let _ = abstract_path;
        None
    }
    /// `state:makePath`: an absolute path for the plugin to create the relative path `path` at (checked before: no
    /// absolute path, no `..`), the host making its directories.
    fn make_path(&self, path: &str) -> Option<String> {
        let _ = path;
        None
    }
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
const REPLY_GET: i64 = 4;
const LOG: i64 = 5;
const ABSTRACT_PATH: i64 = 6;
const ABSOLUTE_PATH: i64 = 7;
const MAKE_PATH: i64 = 8;

/// The most text one message or URI may gather before it is sent (a domain sending more is cut off).
const MAX_TEXT: usize = 8192;
/// The most URIs one instance may have the host map: an honest plugin maps tens, each once (the adapter caches
/// them); a hostile one calling the callback itself must not grow the host's map without bound.
const MAX_MAPPED: u32 = 65536;
/// The most log messages one instance hands the host a second (the adapter bounds them too, but the host does not
/// trust the domain to).
const MAX_LOGS_PER_SECOND: u32 = 20;
/// The longest path either way (the adapter's MAX_PATH_BYTES): longer is NULL, as from a host that cannot map it.
const MAX_PATH: usize = 4096;

/// A path the domain sent, as the host's path functions may see it: UTF-8, not empty, no NUL or other control
/// character, within [`MAX_PATH`]; for makePath also relative and without `..` (it names a file in the host's own
/// directory, which the plugin must not leave).
fn checked_path(text: &[u8], relative: bool) -> Option<&str> {
    let path = std::str::from_utf8(text).ok()?;
    if path.is_empty() || path.len() > MAX_PATH || path.chars().any(char::is_control) {
        return None;
    }
    if relative && (path.starts_with('/') || path.split('/').any(|part| part == "..")) {
        return None;
    }
    Some(path)
}

/// A path the host answered, as the domain may get it: within [`MAX_PATH`] and with no NUL (the plugin reads a C
/// string).
fn answer_path(path: Option<String>) -> Option<Vec<u8>> {
    path.filter(|p| p.len() <= MAX_PATH && !p.contains('\0')).map(String::into_bytes)
}

/// The text being sent by the domain, and the host's last answer (a URI unmapped, a path), being fetched.
#[derive(Default)]
struct Exchange {
    text: Vec<u8>,
    reply: Vec<u8>,
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
                    x.reply = uri.into_bytes();
                    x.reply.len() as i64
                }
                None => {
                    x.reply.clear();
                    -1
                }
            },
            op @ (ABSTRACT_PATH | ABSOLUTE_PATH | MAKE_PATH) => {
                let text = std::mem::take(&mut x.text);
                let answer = checked_path(&text, op == MAKE_PATH).and_then(|path| {
                    answer_path(match op {
                        ABSTRACT_PATH => host.abstract_path(path),
                        ABSOLUTE_PATH => host.absolute_path(path),
                        _ => host.make_path(path),
                    })
                });
                match answer {
                    Some(bytes) => {
                        x.reply = bytes;
                        x.reply.len() as i64
                    }
                    None => {
                        x.reply.clear();
                        -1
                    }
                }
            }
            REPLY_GET => {
                let at = usize::try_from(word(1)).unwrap_or(usize::MAX);
                let mut w = [0u8; 8];
                if let Some(rest) = x.reply.get(at..) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_from_the_domain_is_checked_before_the_host_sees_it() {
        assert_eq!(checked_path(b"/home/a/take 1.wav", false), Some("/home/a/take 1.wav"));
        assert_eq!(checked_path(b"", false), None);
        assert_eq!(checked_path(b"a\0b", false), None);
        assert_eq!(checked_path(b"a\nb", false), None);
        assert_eq!(checked_path(&[0xff, 0xfe], false), None);
        assert_eq!(checked_path(&vec![b'a'; MAX_PATH + 1], false), None);
        assert_eq!(checked_path(b"scratch/x.wav", true), Some("scratch/x.wav"));
        assert_eq!(checked_path(b"/etc/passwd", true), None);
        assert_eq!(checked_path(b"a/../../x", true), None);
        assert_eq!(checked_path(b"..", true), None);
    }

    #[test]
    fn a_path_from_the_host_reaches_the_domain_only_within_bounds() {
        assert_eq!(answer_path(Some("/s/x".into())), Some(b"/s/x".to_vec()));
        assert_eq!(answer_path(Some("a\0b".into())), None);
        assert_eq!(answer_path(Some("a".repeat(MAX_PATH + 1))), None);
        assert_eq!(answer_path(None), None);
    }
}
