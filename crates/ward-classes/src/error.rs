//! Errors of the class wrappers.

use std::path::PathBuf;

/// What can go wrong in a class wrapper.
#[derive(Debug, thiserror::Error)]
pub enum ClassError {
    /// The core refused or failed (missing file, not ELF, no isolation, a fault that could not be recovered...).
    #[error(transparent)]
    Ward(#[from] ward::Error),
    /// The file is a shared object but no plugin of this class.
    #[error("{path}: not a {class} plugin library: {reason}")]
    NotAPlugin { path: PathBuf, class: &'static str, reason: String },
    /// The plugin library broke its class's rules (a malformed description, say).
    #[error("{path}: {reason}")]
    BadPlugin { path: PathBuf, reason: String },
    /// No plugin with that index or label.
    #[error("{path} has no plugin {which}; it has {count}: {labels}")]
    NoSuchPlugin { path: PathBuf, which: String, count: usize, labels: String },
    /// The plugin would not create an instance.
    #[error("{plugin} refused to create an instance ({what})")]
    Refused { plugin: String, what: String },
    /// The host's arguments do not fit the plugin (a wrong number of ports, a buffer of the wrong length).
    #[error("{plugin}: {reason}")]
    BadArguments { plugin: String, reason: String },
    /// The adapter could not be written to disk.
    #[error("cannot provide the class adapter {name}: {reason}")]
    Adapter { name: String, reason: String },
}
