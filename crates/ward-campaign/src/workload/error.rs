//! Why a workload's step failed. A workload records the error as text in its output (see [`super::Recorder`]) and
//! does not act on it, so every variant says what the layer below said.

use ward_classes::frei0r::PluginType;
use ward_classes::{ClassError, NativeCallError};

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The core refused or failed (loading, resolving or calling).
    #[error(transparent)]
    Ward(#[from] ward::Error),
    /// A class wrapper refused or failed.
    #[error(transparent)]
    Class(#[from] ClassError),
    /// A native call into a plugin was refused (the plugin lacks what it needs, or a buffer does not fit).
    #[error(transparent)]
    NativeCall(#[from] NativeCallError),
    /// The native host's loader could not find a symbol, in the loader's words.
    #[error("{reason}")]
    Symbol { reason: String },
    /// The arguments of a native call could not be put into registers, in the core's words.
    #[error("{symbol}: {reason}")]
    Arguments { symbol: String, reason: String },
    #[error("it exports no {what}")]
    NotExported { what: &'static str },
    #[error("its f0r_init failed")]
    InitFailed,
    #[error("ladspa_descriptor returned NULL")]
    NoDescriptor,
    #[error("{plugin_type:?} is no frei0r plugin type")]
    UndefinedPluginType { plugin_type: PluginType },
}
