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
    /// The library's descriptions read in its own domain are not those the host was given when it scanned it (the
    /// file changed in between): the host would be handed ports it did not expect.
    #[error("{path} changed since the host read its descriptions ({what}); refused rather than hand the host ports it did not expect")]
    Changed { path: PathBuf, what: String },
    /// The adapter could not be written to disk.
    #[error("cannot provide the class adapter {name}: {reason}")]
    Adapter { name: String, reason: String },
}

/// Why what a plugin said about itself, as its class adapter wrote it down, was not believed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DescriptionError {
    /// The adapter's bytes end inside a field.
    #[error("description truncated at byte {at}")]
    Truncated { at: usize },
    #[error("string of {len} bytes runs past the description")]
    StringPastEnd { len: usize },
    #[error("{count} stray bytes after the description")]
    StrayBytes { count: usize },
    /// A name or label that says nothing.
    #[error("{what} is empty")]
    EmptyName { what: String },
    /// Text no plugin writes.
    #[error("{what} {value:?} has the control character {code:#04x} at byte {at}")]
    ControlCharacter { what: String, value: String, code: u32, at: usize },
    /// A library's descriptions (kept in the cache) that name no plugin.
    #[error("no plugin is described")]
    NoPlugins,
    #[error("plugin {index} claims {count} ports")]
    TooManyPorts { index: usize, count: u64 },
    #[error("port {port} ({name}) of {label} has flags {flags:#x}: not one direction and kind")]
    PortFlags { port: u32, name: String, label: String, flags: i32 },
    #[error("port {port} ({name}) has the hint {hint:#x}, which LADSPA does not define")]
    UnknownHint { port: u32, name: String, hint: i32 },
    #[error("port {port} ({name}) has the {which} bound {bound}")]
    BoundNotANumber { port: u32, name: String, which: &'static str, bound: f32 },
    #[error("the label {label:?} has white space, which LADSPA labels may not")]
    LabelWithWhiteSpace { label: String },
    #[error("{label} has properties {properties:#x}, beyond LADSPA's {known:#x}")]
    UnknownProperties { label: String, properties: i32, known: i32 },
    #[error("f0r_get_plugin_info claims {count} parameters")]
    TooManyParams { count: i32 },
    #[error("plugin type {raw} is none of frei0r's (filter, source, mixer2, mixer3)")]
    UnknownPluginType { raw: i32 },
    #[error("colour model {raw} is none of frei0r's (bgra8888, rgba8888, packed32)")]
    UnknownColorModel { raw: i32 },
    #[error("it says it was written for frei0r {version}, not {expected}")]
    OtherFrei0rVersion { version: i32, expected: i32 },
    #[error("parameter {index} ({name}) has type {raw}, none of frei0r's (bool, double, color, position, string)")]
    UnknownParamKind { index: usize, name: String, raw: i32 },
    /// A string parameter's value as the adapter wrote it lacks its NUL.
    #[error("a string value without its terminating NUL")]
    UnterminatedString,
    #[error("a value of the undefined type {raw}")]
    ValueOfUndefinedKind { raw: i32 },
}

/// Why the class adapter could not hand over a plugin's description.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DescribeError {
    /// The call into the domain failed (ward recovered the extension).
    #[error("describing {subject}: {source}")]
    Call { subject: String, source: Box<ward::Error> },
    #[error("the adapter could not describe {subject} (code {code})")]
    Adapter { subject: String, code: i64 },
    /// The adapter asked for more room than any description takes (the number comes from the domain).
    #[error("a description of {subject} of {bytes} bytes is beyond belief")]
    BeyondBelief { subject: String, bytes: u64 },
    #[error("the description of {subject} keeps growing")]
    KeepsGrowing { subject: String },
}

/// Why a plugin was not called natively (`native_calls`): it lacks what the call needs, or the host's buffers do not
/// fit it. What the plugin then does is not caught here: a native host has no protection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NativeCallError {
    #[error("{symbol} is NULL")]
    NullEntry { symbol: &'static str },
    #[error("it exports no {symbol}")]
    NotExported { symbol: &'static str },
    /// A LADSPA descriptor without a function the call needs.
    #[error("the descriptor has no {function}")]
    NoFunction { function: &'static str },
    #[error("plugin {index} claims {count} ports")]
    TooManyPorts { index: usize, count: u64 },
    #[error("instantiate returned NULL")]
    InstantiateReturnedNull,
    #[error("f0r_construct({width}, {height}) returned NULL")]
    ConstructReturnedNull { width: u32, height: u32 },
    #[error("port {port} of {count}")]
    NoSuchPort { port: usize, count: usize },
    #[error("port {port} is not connected")]
    NotConnected { port: usize },
    #[error("a block of {samples} samples is longer than the {len} of port {port}'s buffer")]
    BufferTooShort { samples: usize, len: usize, port: usize },
    #[error("a frame of {len} pixels, not {pixels}")]
    FrameSize { len: usize, pixels: usize },
    /// The library could not be loaded (`dlerror`'s words).
    #[error("cannot load {path}: {reason}")]
    Load { path: String, reason: String },
    /// A path or URI the plugin would be given holds a NUL byte, which C strings cannot.
    #[error("{what} holds a NUL byte")]
    NulInString { what: &'static str },
    /// An LV2 library without a plugin of that URI.
    #[error("no plugin {uri} among the library's {count}")]
    NoSuchPlugin { uri: String, count: usize },
    /// An LV2 feature asked for that this native host cannot offer.
    #[error("this native host offers no {feature}")]
    FeatureNotOffered { feature: &'static str },
    /// An LV2 block given a different number of buffers than the plugin has ports.
    #[error("{given} buffers for {ports} ports")]
    PortCount { given: usize, ports: usize },
    /// An LV2 port's buffer does not fit its kind, direction or the block.
    #[error("port {port}: {what}")]
    WrongBuffer { port: usize, what: String },
}
