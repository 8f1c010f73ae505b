//! The class adapters, compiled by the build script and embedded, written to a private directory when a domain
//! needs them as files.

use std::path::PathBuf;

use ward_embed::{embedded, EmbeddedSet};

use ward::{Arg, Extension, RetType, Value};

use crate::reader::Reader;
use crate::ClassError;

static ADAPTERS: EmbeddedSet = EmbeddedSet::new(
    "ward-adapters",
    &[
        embedded!("ward_frei0r_adapter", "frei0r class adapter"),
        embedded!("ward_ladspa_adapter", "LADSPA class adapter"),
    ],
);

/// The path of the adapter called `name`, extracted if need be.
pub(crate) fn path(name: &str) -> Result<PathBuf, ClassError> {
    ADAPTERS.path_of(name).map_err(|e| ClassError::Adapter { name: name.to_string(), reason: e.to_string() })
}

/// The adapter's last error message (a dlopen error, say).
pub(crate) fn last_error(ext: &Extension, function: &str) -> String {
    let mut buf = vec![0u8; 4096];
    let cap = buf.len() as u64;
    match ext.call(function, &mut [Arg::Out(&mut buf), Arg::U64(cap)], RetType::I64) {
        Ok(Value::I64(n)) if n >= 4 && n as u64 <= cap => {
            let mut r = Reader::new(&buf[..n as usize]);
            match r.string() {
                Ok(s) if !s.is_empty() => s,
                _ => "the library could not be opened".into(),
            }
        }
        _ => "the library could not be opened".into(),
    }
}
