//! The class adapters, compiled by the build script and embedded, written to a private directory when a domain
//! needs them as files.

use std::path::PathBuf;

use ward_embed::{embedded, EmbeddedSet};

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
