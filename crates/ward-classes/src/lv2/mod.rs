//! The LV2 class: the plugin standard of today's Linux audio hosts (`lv2.h` and its extensions), typed for Rust hosts
//! and shared by the preload shim.
//!
//! A [`Library`] is one plugin binary opened through the class adapter inside a domain; its [`Descriptor`]s are read
//! once, through the domain. What LV2 keeps outside the binary (a plugin's ports) comes from its bundle
//! ([`bundle`]), read on the host's side: the wrapper never asks the domain what it must copy. An [`Instance`] gets
//! the host's features proxied ([`Features`], [`Host`]): the URID map is the host's own, reached through a callback
//! and cached in the domain; the log reaches the host bounded in size and rate; worker requests come back to the host
//! to schedule as it would; options are copied in; the state extension's path functions reach the host's, their
//! strings bounded and checked both ways. `options:interface` is a wrapper: options are copied out of and into the
//! domain, and a set is state the shadow log replays. A block's ports cross call-by-value-result, every buffer ending at
//! a guard page in the domain, and an atom sequence the plugin writes is checked before the host sees it ([`atom`]).
//!
//! The shadow log holds instantiation (with its features and ports), activation, options set (the last set of each
//! set of keys) and the last restored state; blocks,
//! worker requests and responses are history, replayed in order after a restart.

pub mod atom;
pub mod bundle;
mod host;
mod instance;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ward::policy::FunctionPolicy;
use ward::{Arg, Extension, Function, Isolation, RetType, Supervisor};

use crate::adapters::{self, ADAPTER_ERROR_BELOW};
use crate::error::{DescribeError, DescriptionError};
use crate::reader::Reader;
use crate::ClassError;

pub use host::{Host, UridMap};
pub use instance::{Instance, OptionKey, Options, PortBuffer};

const ADAPTER: &str = "ward_lv2_adapter";

/// The bypass of a disabled plugin, as the message that disables it says.
const WHEN_DISABLED: &str =
    "audio passes through unchanged (outputs with no input of their own are silent), atom outputs are empty";

/// The deadline of a block before the core has learned what the plugin's blocks take (as for LADSPA).
const FIRST_BLOCK_DEADLINE: Duration = Duration::from_secs(1);

/// Flags of the adapter's description.
const HAS_ACTIVATE: u32 = 0x1;
const HAS_DEACTIVATE: u32 = 0x2;
const HAS_RUN: u32 = 0x8;
const HAS_STATE: u32 = 0x10;
const HAS_WORKER: u32 = 0x20;
const HAS_OPTIONS: u32 = 0x40;

/// The largest description believed (a URI and flags).
const MAX_DESCRIPTION: u64 = 64 * 1024;
const DESCRIBE_BUFFER: usize = 1024;

/// URIs of the features and interfaces the class knows.
pub mod uri {
    pub const URID_MAP: &str = "http://lv2plug.in/ns/ext/urid#map";
    pub const URID_UNMAP: &str = "http://lv2plug.in/ns/ext/urid#unmap";
    pub const OPTIONS: &str = "http://lv2plug.in/ns/ext/options#options";
    pub const OPTIONS_INTERFACE: &str = "http://lv2plug.in/ns/ext/options#interface";
    pub const LOG: &str = "http://lv2plug.in/ns/ext/log#log";
    pub const WORKER_SCHEDULE: &str = "http://lv2plug.in/ns/ext/worker#schedule";
    pub const WORKER_INTERFACE: &str = "http://lv2plug.in/ns/ext/worker#interface";
    pub const STATE_INTERFACE: &str = "http://lv2plug.in/ns/ext/state#interface";
    pub const STATE_MAP_PATH: &str = "http://lv2plug.in/ns/ext/state#mapPath";
    pub const STATE_MAKE_PATH: &str = "http://lv2plug.in/ns/ext/state#makePath";
    pub const STATE_FREE_PATH: &str = "http://lv2plug.in/ns/ext/state#freePath";
    pub const BOUNDED_BLOCK_LENGTH: &str = "http://lv2plug.in/ns/ext/buf-size#boundedBlockLength";
    pub const FIXED_BLOCK_LENGTH: &str = "http://lv2plug.in/ns/ext/buf-size#fixedBlockLength";
    pub const POWER_OF_2_BLOCK_LENGTH: &str = "http://lv2plug.in/ns/ext/buf-size#powerOf2BlockLength";
    pub const IS_LIVE: &str = "http://lv2plug.in/ns/lv2core#isLive";
    pub const ATOM_SEQUENCE: &str = "http://lv2plug.in/ns/ext/atom#Sequence";
    pub const ATOM_CHUNK: &str = "http://lv2plug.in/ns/ext/atom#Chunk";
    pub const ATOM_FRAME_TIME: &str = "http://lv2plug.in/ns/ext/atom#frameTime";
    pub const ATOM_BEAT_TIME: &str = "http://lv2plug.in/ns/ext/atom#beatTime";
    /// Features a host offers with no data, which say something about the host (passed on as they are).
    pub const FLAG_FEATURES: &[&str] = &[
        "http://lv2plug.in/ns/lv2core#isLive",
        "http://lv2plug.in/ns/lv2core#hardRTCapable",
        "http://lv2plug.in/ns/lv2core#inPlaceBroken",
        "http://lv2plug.in/ns/ext/port-props#supportsStrictBounds",
        "http://lv2plug.in/ns/ext/state#threadSafeRestore",
        "http://lv2plug.in/ns/ext/state#loadDefaultState",
        "http://lv2plug.in/ns/ext/buf-size#coarseBlockLength",
    ];
}

/// The adapter functions and what each means to the core.
fn function_policies() -> Vec<(&'static str, FunctionPolicy)> {
    let state = FunctionPolicy { state: true, ..FunctionPolicy::default() };
    let destroys = FunctionPolicy { destroys: true, ..FunctionPolicy::default() };
    // Blocks advance a plugin's state; so do the worker's requests and responses, and fetching the requests a block
    // queued (replayed, it empties the queue at the same point, so no request is handed to the host twice).
    let history = FunctionPolicy { history: true, ..FunctionPolicy::default() };
    let block = FunctionPolicy { first_deadline: Some(FIRST_BLOCK_DEADLINE), ..history.clone() };
    vec![
        ("ward_lv2_run", block),
        ("ward_lv2_take_work", history.clone()),
        ("ward_lv2_work", history.clone()),
        ("ward_lv2_work_response", history),
        // Options set are state; a set of the same keys (the second argument names them) replaces the one before,
        // so a host that sets an option often does not grow the log.
        ("ward_lv2_set_options", FunctionPolicy { replaces_same: Some(2), ..state.clone() }),
        ("ward_lv2_open", state.clone()),
        ("ward_lv2_instantiate", state.clone()),
        ("ward_lv2_activate", state.clone()),
        ("ward_lv2_deactivate", state.clone()),
        // Only the last state restored needs replaying.
        ("ward_lv2_restore", FunctionPolicy { replaces_same: Some(1), ..state }),
        ("ward_lv2_cleanup", destroys),
    ]
}

/// One plugin of a library, as its descriptor says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Its index in the library.
    pub index: usize,
    pub uri: String,
    pub has_activate: bool,
    pub has_deactivate: bool,
    pub has_run: bool,
    /// It has `state:interface` (save and restore).
    pub has_state: bool,
    /// It has `worker:interface` (work and work_response).
    pub has_worker: bool,
    /// It has `options:interface` (get or set): see [`Instance::get_options`], [`Instance::set_options`].
    pub has_options: bool,
}

impl Descriptor {
    fn parse(index: usize, bytes: &[u8]) -> Result<Descriptor, DescriptionError> {
        let mut r = Reader::new(bytes);
        let flags = r.u32()?;
        let uri = r.string()?;
        r.finish()?;
        if uri.is_empty() {
            return Err(DescriptionError::EmptyName { what: format!("the URI of plugin {index}") });
        }
        if let Some((at, c)) = uri.char_indices().find(|(_, c)| c.is_control() || c.is_whitespace()) {
            return Err(DescriptionError::ControlCharacter {
                what: "the URI".into(),
                value: uri.clone(),
                code: c as u32,
                at,
            });
        }
        Ok(Descriptor {
            index,
            uri,
            has_activate: flags & HAS_ACTIVATE != 0,
            has_deactivate: flags & HAS_DEACTIVATE != 0,
            has_run: flags & HAS_RUN != 0,
            has_state: flags & HAS_STATE != 0,
            has_worker: flags & HAS_WORKER != 0,
            has_options: flags & HAS_OPTIONS != 0,
        })
    }
}

/// What kind of data a port carries, as its bundle says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortKind {
    /// A block of samples (`lv2:AudioPort`).
    Audio,
    /// One value (`lv2:ControlPort`).
    Control,
    /// A block of control samples (`lv2:CVPort`).
    Cv,
    /// An atom (`atom:AtomPort`): a sequence of events, mostly.
    Atom,
    /// A kind the class does not know: it can only be left unconnected.
    Other,
}

/// One port as the class needs it: what it carries, which way, and whether the host may leave it unconnected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    pub kind: PortKind,
    pub output: bool,
    pub connection_optional: bool,
}

impl PortSpec {
    fn wire_kind(self) -> u32 {
        match self.kind {
            PortKind::Audio => 0,
            PortKind::Control => 1,
            PortKind::Cv => 2,
            PortKind::Atom => 3,
            PortKind::Other => 4,
        }
    }
}

impl From<&bundle::PortInfo> for PortSpec {
    fn from(p: &bundle::PortInfo) -> PortSpec {
        let kind = match p.kind {
            bundle::PortKind::Audio => PortKind::Audio,
            bundle::PortKind::Control => PortKind::Control,
            bundle::PortKind::Cv => PortKind::Cv,
            bundle::PortKind::Atom { .. } => PortKind::Atom,
            bundle::PortKind::Other(_) => PortKind::Other,
        };
        PortSpec { kind, output: p.direction == bundle::Direction::Output, connection_optional: p.connection_optional }
    }
}

/// One option the host gives (`options:options`): its value's bytes are copied into the domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionValue {
    /// `LV2_Options_Context`: 0 instance, 1 resource, 2 blank, 3 port.
    pub context: u32,
    pub subject: u32,
    pub key: u32,
    /// The value's type, a URID of the host's map.
    pub value_type: u32,
    pub value: Vec<u8>,
}

/// The features a host offers an instance. The callbacks behind them are the [`Host`]'s.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    pub urid_map: bool,
    pub urid_unmap: bool,
    pub log: bool,
    /// `worker:schedule`: requests the plugin schedules come back to the host ([`Instance::take_work`]).
    pub worker_schedule: bool,
    pub bounded_block_length: bool,
    pub fixed_block_length: bool,
    pub power_of_2_block_length: bool,
    /// `options:options`, when offered (an empty list is still offered).
    pub options: Option<Vec<OptionValue>>,
    /// Features without data that say something of the host ([`uri::FLAG_FEATURES`]).
    pub flags: Vec<String>,
    /// The state extension's path features: `make_path` and `free_path` are offered at instantiate, and all of them
    /// to [`Instance::save`] and [`Instance::restore`] (a host offering them per call uses
    /// [`Instance::save_offering`] and [`Instance::restore_offering`]). They lead to the [`Host`]'s path functions.
    pub paths: PathFeatures,
}

/// The state extension's path features (`state:mapPath`, `state:makePath`, `state:freePath`) a host offers a call.
/// The plugin gets each offered one as ward's, which reaches the [`Host`]'s; one not offered stays out of its list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathFeatures {
    pub map_path: bool,
    pub make_path: bool,
    pub free_path: bool,
}

impl PathFeatures {
    fn wire_flags(self) -> u32 {
        u32::from(self.map_path) * 0x100 + u32::from(self.make_path) * 0x200 + u32::from(self.free_path) * 0x400
    }
}

impl Features {
    fn wire_flags(&self) -> u32 {
        let mut f = 0;
        for (on, bit) in [
            (self.urid_map, 0x1),
            (self.urid_unmap, 0x2),
            (self.log, 0x4),
            (self.worker_schedule, 0x8),
            (self.bounded_block_length, 0x10),
            (self.fixed_block_length, 0x20),
            (self.power_of_2_block_length, 0x40),
            (self.options.is_some(), 0x80),
        ] {
            if on {
                f |= bit;
            }
        }
        // mapPath belongs to save and restore, not to instantiate.
        f | PathFeatures { map_path: false, ..self.paths }.wire_flags()
    }
}

/// What an instance is created with.
pub struct Setup {
    pub sample_rate: f64,
    /// The bundle directory the plugin is told it lives in.
    pub bundle: PathBuf,
    /// Every port of the plugin, in index order.
    pub ports: Vec<PortSpec>,
    pub features: Features,
    /// Where the URID map, the unmap and the log lead.
    pub host: Arc<dyn Host>,
    /// The host calls `run` from a real-time thread (it offered `lv2:isLive`): a block never waits for a recovery
    /// (it is bypassed, and the plugin is recovered on a thread of its own), and checkpoints are taken off that
    /// thread.
    pub realtime: bool,
}

/// The functions of an opened library.
struct Functions {
    instantiate: Function,
    activate: Function,
    deactivate: Function,
    run: Function,
    take_work: Function,
    work: Function,
    work_response: Function,
    save: Function,
    restore: Function,
    get_options: Function,
    set_options: Function,
    cleanup: Function,
}

pub(crate) struct LibraryInner {
    path: PathBuf,
    ext: Extension,
    plugins: Vec<Arc<Descriptor>>,
    library: u64,
    functions: Functions,
    /// What the blocks need of the extension's policy, read once: reading it takes the domain's lock, which a
    /// real-time block must not wait for while the domain is recovered.
    policy: BlockPolicy,
}

/// The extension's policy as the blocks of its instances use it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockPolicy {
    pub check_output: bool,
    pub max_retries: u32,
    pub read_past_input_kb: u32,
    pub checkpoint: Duration,
    pub history_mb: u64,
}

/// An LV2 plugin binary opened in its domain.
#[derive(Clone)]
pub struct Library {
    inner: Arc<LibraryInner>,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lv2::Library({}, {} plugins)", self.inner.path.display(), self.inner.plugins.len())
    }
}

impl Library {
    /// Open the binary at `path` in a domain of the isolation its policy gives it (or `isolation`), and read its
    /// plugins' descriptors.
    pub fn open(supervisor: &Supervisor, path: &Path, isolation: Option<Isolation>) -> Result<Library, ClassError> {
        let policies = function_policies();
        let spec = adapters::OpenSpec {
            adapter: ADAPTER,
            class: "LV2",
            functions: &policies,
            when_disabled: WHEN_DISABLED,
            open: "ward_lv2_open",
            open_call: "lv2_descriptor",
        };
        let adapters::Opened { path, ext, library } = adapters::open_library(supervisor, path, isolation, &spec)?;
        let plugins = adapters::described(&ext, "ward_lv2_describe", || describe_all(&ext, library, &path))?;
        let functions = Functions {
            instantiate: ext.function_as("ward_lv2_instantiate", "instantiate")?,
            activate: ext.function_as("ward_lv2_activate", "activate")?,
            deactivate: ext.function_as("ward_lv2_deactivate", "deactivate")?,
            run: ext.function_as("ward_lv2_run", "run")?,
            take_work: ext.function_as("ward_lv2_take_work", "schedule_work")?,
            work: ext.function_as("ward_lv2_work", "work")?,
            work_response: ext.function_as("ward_lv2_work_response", "work_response")?,
            save: ext.function_as("ward_lv2_save", "save")?,
            restore: ext.function_as("ward_lv2_restore", "restore")?,
            get_options: ext.function_as("ward_lv2_get_options", "options_get")?,
            set_options: ext.function_as("ward_lv2_set_options", "options_set")?,
            cleanup: ext.function_as("ward_lv2_cleanup", "cleanup")?,
        };
        let p = ext.policy();
        let policy = BlockPolicy {
            check_output: p.check_output,
            max_retries: p.max_retries,
            read_past_input_kb: p.read_past_input_kb,
            checkpoint: p.checkpoint,
            history_mb: p.history_mb,
        };
        Ok(Library { inner: Arc::new(LibraryInner { path, ext, plugins, library, functions, policy }) })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The plugins of the library, in index order.
    pub fn plugins(&self) -> &[Arc<Descriptor>] {
        &self.inner.plugins
    }

    /// The plugin with the URI `uri`.
    pub fn plugin(&self, uri: &str) -> Result<&Arc<Descriptor>, ClassError> {
        self.inner.plugins.iter().find(|d| d.uri == uri).ok_or_else(|| ClassError::NoSuchPlugin {
            path: self.inner.path.clone(),
            which: uri.to_string(),
            count: self.inner.plugins.len(),
            labels: self.inner.plugins.iter().map(|d| d.uri.as_str()).collect::<Vec<_>>().join(", "),
        })
    }

    /// The extension running the library.
    pub fn extension(&self) -> &Extension {
        &self.inner.ext
    }

    /// Create an instance of plugin `index` with `setup`.
    pub fn instantiate(&self, index: usize, setup: Setup) -> Result<Instance, ClassError> {
        let plugin = self.inner.plugins.get(index).cloned().ok_or_else(|| ClassError::NoSuchPlugin {
            path: self.inner.path.clone(),
            which: format!("#{index}"),
            count: self.inner.plugins.len(),
            labels: self.inner.plugins.iter().map(|d| d.uri.as_str()).collect::<Vec<_>>().join(", "),
        })?;
        Instance::create(Arc::clone(&self.inner), plugin, setup)
    }
}

/// Every plugin descriptor of the opened library `library`.
fn describe_all(ext: &Extension, library: u64, path: &Path) -> Result<Vec<Arc<Descriptor>>, ClassError> {
    let count = ext.function_as("ward_lv2_count", "lv2_descriptor")?;
    let describe = ext.function_as("ward_lv2_describe", "lv2_descriptor")?;
    let count = count.call(&mut [Arg::Handle(library)], RetType::I64)?;
    let count = count.as_i64().filter(|&c| c >= 0).unwrap_or(0) as usize;
    if count == 0 {
        return Err(ClassError::NotAPlugin {
            path: path.to_path_buf(),
            class: "LV2",
            reason: "its descriptor function returned NULL for index 0: the library has no plugins".into(),
        });
    }
    let mut plugins = Vec::with_capacity(count);
    for index in 0..count {
        let bytes = describe_one(&describe, library, index)
            .map_err(|e| ClassError::BadPlugin { path: path.to_path_buf(), reason: e.to_string() })?;
        let d = Descriptor::parse(index, &bytes).map_err(|reason| ClassError::BadPlugin {
            path: path.to_path_buf(),
            reason: format!("plugin {index}: {reason}"),
        })?;
        plugins.push(Arc::new(d));
    }
    Ok(plugins)
}

fn describe_one(describe: &Function, library: u64, index: usize) -> Result<Vec<u8>, DescribeError> {
    let subject = || format!("plugin {index}");
    let mut buf = vec![0u8; DESCRIBE_BUFFER];
    for _ in 0..2 {
        let cap = buf.len() as u64;
        let value = describe
            .call(&mut [Arg::Handle(library), Arg::U64(index as u64), Arg::Out(&mut buf), Arg::U64(cap)], RetType::I64)
            .map_err(|e| DescribeError::Call { subject: subject(), source: Box::new(e) })?;
        let n = value.as_i64().unwrap_or(ADAPTER_ERROR_BELOW - 1);
        if n < ADAPTER_ERROR_BELOW {
            return Err(DescribeError::Adapter { subject: subject(), code: n });
        }
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let need = n.unsigned_abs();
        if need > MAX_DESCRIPTION {
            return Err(DescribeError::BeyondBelief { subject: subject(), bytes: need });
        }
        buf = vec![0u8; need as usize];
    }
    Err(DescribeError::KeepsGrowing { subject: subject() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(flags: u32, uri: &str) -> Vec<u8> {
        let mut b = flags.to_le_bytes().to_vec();
        b.extend_from_slice(&(uri.len() as u32).to_le_bytes());
        b.extend_from_slice(uri.as_bytes());
        b
    }

    #[test]
    fn a_descriptor_parses_with_its_flags() {
        let d = Descriptor::parse(3, &encode(HAS_RUN | HAS_STATE, "urn:x")).expect("parses");
        assert_eq!(d.uri, "urn:x");
        assert!(d.has_run && d.has_state && !d.has_worker && !d.has_activate);
    }

    #[test]
    fn a_uri_with_white_space_or_nothing_is_refused() {
        assert!(Descriptor::parse(0, &encode(HAS_RUN, "urn:a b")).is_err());
        assert!(Descriptor::parse(0, &encode(HAS_RUN, "")).is_err());
        let mut stray = encode(HAS_RUN, "urn:x");
        stray.push(0);
        assert!(Descriptor::parse(0, &stray).is_err());
    }
}
