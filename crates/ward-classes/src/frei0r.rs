//! The frei0r class: video plugins (`frei0r.h`, version 1.x), typed for Rust hosts.
//!
//! A [`Library`] is one plugin library (frei0r has one plugin per library) opened through the class adapter inside
//! a domain; its [`PluginInfo`] is read once, through the domain. An [`Instance`] is one plugin instance for frames
//! of a fixed size; [`Instance::update`] and [`Instance::update2`] send one frame through it. Frames cross
//! call-by-value-result (the output comes back only when the update succeeded), so a failed update is retried on
//! intact input after recovery, and if it fails even then the instance degrades: the output becomes a copy of the
//! (first) input frame and the host learns why from [`Processed::Bypassed`].
//!
//! The shadow log holds what makes a restarted instance the same as the old one: the library's opening, the
//! construction and every parameter set since. Setting a parameter to the value it already has is skipped, so a
//! host that sets every parameter on every frame (as many do) does not grow the log.
//!
//! Frames are `width * height` 32-bit pixels in the plugin's [`ColorModel`], as `u32` slices ([`Instance::update`])
//! or, saving a conversion each way, as byte slices in native byte order ([`Instance::update_bytes`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ward::policy::FunctionPolicy;
use ward::{Arg, Extension, FaultKind, Function, Isolation, RetType, Supervisor};

use crate::adapters::ADAPTER_ERROR_BELOW;
use crate::cache::Wire;
use crate::error::{DescribeError, DescriptionError};
use crate::plausible::{self, Text};
use crate::reader::Reader;
use crate::{adapters, ClassError, Processed};

pub(crate) const ADAPTER: &str = "ward_frei0r_adapter";
const CLASS: &str = "frei0r";

/// The bypass of a disabled plugin (see `Instance::update`), as the message that disables it says.
const WHEN_DISABLED: &str = "frames pass through unchanged (a source's frames are left as the host gave them)";

/// The deadline of a frame before the core has learned what the plugin's frames take (DECISIONS.md): a first
/// frame may be slow (tables built, memory touched for the first time, a loaded machine), so it is generous; short
/// enough that a plugin hanging on every frame is given up on within seconds.
const FIRST_FRAME_DEADLINE: Duration = Duration::from_secs(2);

/// The frei0r major version of the ABI the adapter speaks (`FREI0R_MAJOR_VERSION` of frei0r 1.x).
const FREI0R_MAJOR_VERSION: i32 = 1;

const E_SYMBOL: i64 = ADAPTER_ERROR_BELOW - 2;
const E_INDEX: i64 = ADAPTER_ERROR_BELOW - 3;
const E_LAYOUT: i64 = ADAPTER_ERROR_BELOW - 4;
const E_NOMEM: i64 = ADAPTER_ERROR_BELOW - 5;

/// First guess of a description's size.
const DESCRIBE_BUFFER: usize = 16 * 1024;
/// Largest description accepted (a domain asking for more is not believed).
const MAX_DESCRIPTION: u64 = 16 << 20;
/// First guess of an encoded parameter's size (a string may need more).
const PARAM_BUFFER: usize = 256;
/// Largest encoded parameter accepted (the adapter reads back at most 64 KiB of a string).
const MAX_VALUE: u64 = 1 << 20;
/// Plugins with more parameters than this are refused (a description claiming more is malformed); a native host
/// (`native_calls`) believes no larger count either, and the adapter's `MAX_PARAMS` is the same.
pub(crate) const MAX_PARAMS: i32 = 1024;

/// Flag of the adapter's construct: the output buffers of the instance's updates end at a guard page, so the plugin
/// may write them directly. True of a process domain, whose output pool puts every buffer at the end of its slot,
/// before a guard page, and which gives a host frame lent in place a private copy of the rest of its last page and
/// then a guard page (see `ward::Arg`); the adapter still checks each buffer's alignment.
const DIRECT_OUTPUT: u64 = 0x1;
/// Flag of the adapter's construct: the first input frame of an update is a private, writable buffer ending at a
/// guard page (an [`Arg::Scratch`] in a process domain), so the plugin may have it without the adapter's copy.
const PRIVATE_INPUT: u64 = 0x2;
/// Where the adapter's construct flags carry the KiB a plugin may read past a copy of an input frame, reading zeros
/// (the policy's `read_past_input_kb`).
const READ_PAST_SHIFT: u32 = 8;

/// Flags of the adapter's description: which optional functions the plugin has.
const HAS_UPDATE: u32 = 0x1;
const HAS_UPDATE2: u32 = 0x2;

/// The adapter functions and what each means to the core: which establish state (replayed, in order, after a
/// restart), which destroy the handle they are given, and that a frame may be processed again after a fault.
fn function_policies() -> [(&'static str, FunctionPolicy); 6] {
    let state = FunctionPolicy { state: true, ..FunctionPolicy::default() };
    let destroys = FunctionPolicy { destroys: true, ..FunctionPolicy::default() };
    // Frames advance the state of a filter with memory (an echo, a temporal blur): history, kept within the
    // policy's history_mb and history_replay_ms (on by default).
    let frames = FunctionPolicy {
        retryable: true,
        history: true,
        first_deadline: Some(FIRST_FRAME_DEADLINE),
        ..FunctionPolicy::default()
    };
    [
        ("ward_frei0r_open", state.clone()),
        ("ward_frei0r_construct", state.clone()),
        // Only a parameter's last value needs replaying: (instance, index) is the key.
        ("ward_frei0r_set_param", FunctionPolicy { replaces_same: Some(2), ..state.clone() }),
        ("ward_frei0r_destruct", destroys),
        ("ward_frei0r_update", frames.clone()),
        ("ward_frei0r_update2", frames),
    ]
}

/// What a plugin does, and so how many input frames an update takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginType {
    /// One input frame.
    Filter,
    /// No input frame.
    Source,
    /// Two input frames (update2 only).
    Mixer2,
    /// Three input frames (update2 only).
    Mixer3,
    /// A type frei0r does not define.
    Other(i32),
}

impl PluginType {
    /// The types frei0r.h defines, each at its C value (`F0R_PLUGIN_TYPE_*`).
    const DEFINED: [PluginType; 4] = [PluginType::Filter, PluginType::Source, PluginType::Mixer2, PluginType::Mixer3];

    pub(crate) fn from_raw(v: i32) -> PluginType {
        defined_or(&Self::DEFINED, v, PluginType::Other)
    }

    /// The C value (what a host reads in `f0r_plugin_info_t`).
    pub fn raw(self) -> i32 {
        match self {
            PluginType::Other(v) => v,
            defined => raw_of(&Self::DEFINED, defined),
        }
    }

    /// How many input frames an update takes; `None` for a type frei0r does not define.
    pub fn input_frames(self) -> Option<usize> {
        match self {
            PluginType::Source => Some(0),
            PluginType::Filter => Some(1),
            PluginType::Mixer2 => Some(2),
            PluginType::Mixer3 => Some(3),
            PluginType::Other(_) => None,
        }
    }
}

/// The layout of a frame's 32-bit pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColorModel {
    /// 8 bits each of blue, green, red and alpha, in this byte order.
    Bgra8888,
    /// 8 bits each of red, green, blue and alpha, in this byte order.
    Rgba8888,
    /// Any 32-bit packed format: the plugin only moves pixels around.
    Packed32,
    Other(i32),
}

impl ColorModel {
    /// The colour models frei0r.h defines, each at its C value (`F0R_COLOR_MODEL_*`).
    const DEFINED: [ColorModel; 3] = [ColorModel::Bgra8888, ColorModel::Rgba8888, ColorModel::Packed32];

    pub(crate) fn from_raw(v: i32) -> ColorModel {
        defined_or(&Self::DEFINED, v, ColorModel::Other)
    }

    /// The C value (what a host reads in `f0r_plugin_info_t`).
    pub fn raw(self) -> i32 {
        match self {
            ColorModel::Other(v) => v,
            defined => raw_of(&Self::DEFINED, defined),
        }
    }
}

/// The type of a parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    Bool,
    Double,
    Color,
    Position,
    String,
    /// A type frei0r does not define: it can be neither set nor read.
    Other(i32),
}

impl ParamKind {
    /// The parameter types frei0r.h defines, each at its C value (`F0R_PARAM_*`).
    const DEFINED: [ParamKind; 5] =
        [ParamKind::Bool, ParamKind::Double, ParamKind::Color, ParamKind::Position, ParamKind::String];

    pub(crate) fn from_raw(v: i32) -> ParamKind {
        defined_or(&Self::DEFINED, v, ParamKind::Other)
    }

    /// The C value (what a host reads in `f0r_param_info_t`).
    pub fn raw(self) -> i32 {
        match self {
            ParamKind::Other(v) => v,
            defined => raw_of(&Self::DEFINED, defined),
        }
    }
}

/// The value of `defined` whose C value (its index) is `v`, else `other(v)`: one table per enum serves both
/// directions, reading a plugin's words and writing them for a host (the preload shim's proxy).
fn defined_or<T: Copy>(defined: &[T], v: i32, other: fn(i32) -> T) -> T {
    usize::try_from(v).ok().and_then(|i| defined.get(i)).copied().unwrap_or_else(|| other(v))
}

/// The C value of `value`, one of `defined`.
fn raw_of<T: Copy + PartialEq>(defined: &[T], value: T) -> i32 {
    // The tables hold a handful of values, so the index always fits.
    defined.iter().position(|&d| d == value).map_or(-1, |i| i as i32)
}

/// One parameter of a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    pub name: String,
    pub kind: ParamKind,
    pub explanation: String,
}

/// What a plugin says about itself (`f0r_get_plugin_info` and `f0r_get_param_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    pub name: String,
    pub author: String,
    pub plugin_type: PluginType,
    pub color_model: ColorModel,
    /// The frei0r API version the plugin was written for.
    pub frei0r_version: i32,
    pub major_version: i32,
    pub minor_version: i32,
    pub explanation: String,
    pub params: Vec<ParamInfo>,
    /// The plugin has `f0r_update` ([`Instance::update`]).
    pub has_update: bool,
    /// The plugin has `f0r_update2` ([`Instance::update2`] with more than one input frame).
    pub has_update2: bool,
}

impl PluginInfo {
    /// What the adapter wrote (in a domain, or kept in the cache of descriptions), checked.
    pub(crate) fn parse(bytes: &[u8]) -> Result<PluginInfo, DescriptionError> {
        let mut r = Reader::new(bytes);
        let (name, author) = (r.string()?, r.string()?);
        let plugin_type = PluginType::from_raw(r.i32()?);
        let color_model = ColorModel::from_raw(r.i32()?);
        let (frei0r_version, major_version, minor_version) = (r.i32()?, r.i32()?, r.i32()?);
        let count = r.i32()?;
        if !(0..=MAX_PARAMS).contains(&count) {
            return Err(DescriptionError::TooManyParams { count });
        }
        let flags = r.u32()?;
        let explanation = r.string()?;
        let mut params = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let (pname, kind, pexplanation) = (r.string()?, ParamKind::from_raw(r.i32()?), r.string()?);
            params.push(ParamInfo { name: pname, kind, explanation: pexplanation });
        }
        r.finish()?;
        let info = PluginInfo {
            name,
            author,
            plugin_type,
            color_model,
            frei0r_version,
            major_version,
            minor_version,
            explanation,
            params,
            has_update: flags & HAS_UPDATE != 0,
            has_update2: flags & HAS_UPDATE2 != 0,
        };
        info.check()?;
        Ok(info)
    }

    /// Whether a plugin built against frei0r 1.x can say this about itself (see `plausible`).
    fn check(&self) -> Result<(), DescriptionError> {
        plausible::text("the name", &self.name, Text::Name)?;
        plausible::text("the author", &self.author, Text::Name)?;
        plausible::text("the explanation", &self.explanation, Text::Prose)?;
        if let PluginType::Other(raw) = self.plugin_type {
            return Err(DescriptionError::UnknownPluginType { raw });
        }
        if let ColorModel::Other(raw) = self.color_model {
            return Err(DescriptionError::UnknownColorModel { raw });
        }
        if self.frei0r_version != FREI0R_MAJOR_VERSION {
            return Err(DescriptionError::OtherFrei0rVersion {
                version: self.frei0r_version,
                expected: FREI0R_MAJOR_VERSION,
            });
        }
        for (index, p) in self.params.iter().enumerate() {
            plausible::text(&format!("parameter {index}'s name"), &p.name, Text::Name)?;
            plausible::text(&format!("parameter {index}'s explanation"), &p.explanation, Text::Prose)?;
            if let ParamKind::Other(raw) = p.kind {
                return Err(DescriptionError::UnknownParamKind { index, name: p.name.clone(), raw });
            }
        }
        Ok(())
    }
}

/// The value of a parameter. Bools are doubles in frei0r (true when at least 0.5).
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Bool(f64),
    Double(f64),
    Color { r: f32, g: f32, b: f32 },
    Position { x: f64, y: f64 },
    String(String),
}

impl ParamValue {
    /// The kind of parameter this value is for.
    pub fn kind(&self) -> ParamKind {
        match self {
            ParamValue::Bool(_) => ParamKind::Bool,
            ParamValue::Double(_) => ParamKind::Double,
            ParamValue::Color { .. } => ParamKind::Color,
            ParamValue::Position { .. } => ParamKind::Position,
            ParamValue::String(_) => ParamKind::String,
        }
    }

    /// The adapter's encoding, into `out` (cleared first).
    fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            ParamValue::Bool(v) | ParamValue::Double(v) => out.extend_from_slice(&v.to_le_bytes()),
            ParamValue::Color { r, g, b } => {
                for c in [r, g, b] {
                    out.extend_from_slice(&c.to_le_bytes());
                }
            }
            ParamValue::Position { x, y } => {
                out.extend_from_slice(&x.to_le_bytes());
                out.extend_from_slice(&y.to_le_bytes());
            }
            ParamValue::String(s) => {
                out.extend_from_slice(s.as_bytes());
                out.push(0);
            }
        }
    }

    /// Decode what the adapter wrote for a parameter of `kind`.
    fn decode(kind: ParamKind, bytes: &[u8]) -> Result<ParamValue, DescriptionError> {
        let mut r = Reader::new(bytes);
        let value = match kind {
            ParamKind::Bool => ParamValue::Bool(r.f64()?),
            ParamKind::Double => ParamValue::Double(r.f64()?),
            ParamKind::Color => ParamValue::Color { r: r.f32()?, g: r.f32()?, b: r.f32()? },
            ParamKind::Position => ParamValue::Position { x: r.f64()?, y: r.f64()? },
            ParamKind::String => {
                return match bytes.split_last() {
                    Some((0, text)) => Ok(ParamValue::String(String::from_utf8_lossy(text).into_owned())),
                    _ => Err(DescriptionError::UnterminatedString),
                }
            }
            ParamKind::Other(raw) => return Err(DescriptionError::ValueOfUndefinedKind { raw }),
        };
        r.finish()?;
        Ok(value)
    }
}

struct Functions {
    construct: Function,
    destruct: Function,
    set_param: Function,
    get_param: Function,
    update: Function,
    update2: Function,
}

struct LibraryInner {
    path: PathBuf,
    ext: Extension,
    info: PluginInfo,
    library: u64,
    functions: Functions,
}

/// An opened frei0r plugin library.
#[derive(Clone)]
pub struct Library {
    inner: Arc<LibraryInner>,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "frei0r::Library({}, {})", self.inner.path.display(), self.inner.info.name)
    }
}

impl Library {
    /// Open the plugin at `path` in a domain of the isolation its policy gives it (or `isolation`), and read what
    /// it says about itself. A shared object that is no frei0r plugin is [`ClassError::NotAPlugin`].
    pub fn open(supervisor: &Supervisor, path: &Path, isolation: Option<Isolation>) -> Result<Library, ClassError> {
        let policies = function_policies();
        let spec = adapters::OpenSpec {
            adapter: ADAPTER,
            class: CLASS,
            functions: &policies,
            when_disabled: WHEN_DISABLED,
            open: "ward_frei0r_open",
            open_call: "f0r_init",
        };
        let adapters::Opened { path, ext, library } = adapters::open_library(supervisor, path, isolation, &spec)?;
        let describe = ext.function_as("ward_frei0r_describe", "f0r_get_plugin_info")?;
        let bad_plugin = |reason: String| ClassError::BadPlugin { path: path.clone(), reason };
        // Err(Ok(what)): the plugin described itself badly; Err(Err(e)): the call failed (ward recovered it).
        let describe_info = || -> Result<PluginInfo, Result<String, DescribeError>> {
            let bytes = describe_plugin(&describe, library).map_err(|e| match e {
                e @ DescribeError::Call { .. } => Err(e),
                e => Ok(e.to_string()),
            })?;
            PluginInfo::parse(&bytes).map_err(|e| Ok(format!("its description: {e}")))
        };
        // A plugin that describes itself badly is a bad call, as much as a crash is: recovered once (the restart
        // may load another build, see `restart_from`) and asked again; refused if it does it again.
        let info = match describe_info() {
            Ok(info) => info,
            Err(Err(e)) => return Err(bad_plugin(e.to_string())),
            Err(Ok(what)) => {
                if ext.declare_fault("ward_frei0r_describe", FaultKind::BadOutput { what: what.clone() }).is_err() {
                    return Err(bad_plugin(what));
                }
                describe_info().map_err(|e| match e {
                    Ok(reason) => bad_plugin(reason),
                    Err(e) => bad_plugin(e.to_string()),
                })?
            }
        };
        let functions = Functions {
            construct: ext.function_as("ward_frei0r_construct", "f0r_construct")?,
            destruct: ext.function_as("ward_frei0r_destruct", "f0r_destruct")?,
            set_param: ext.function_as("ward_frei0r_set_param", "f0r_set_param_value")?,
            get_param: ext.function_as("ward_frei0r_get_param", "f0r_get_param_value")?,
            update: ext.function_as("ward_frei0r_update", "f0r_update")?,
            update2: ext.function_as("ward_frei0r_update2", "f0r_update2")?,
        };
        Ok(Library { inner: Arc::new(LibraryInner { path, ext, info, library, functions }) })
    }

    /// Open the plugin at `path` as [`Library::open`] does, for a host that was given `described` (what a
    /// [`Describer`] read of it) when it scanned it: what the plugin says of itself now, in its own domain, must be
    /// the same, else the file changed in between and the plugin is refused ([`ClassError::Changed`]).
    pub fn open_as_described(
        supervisor: &Supervisor,
        path: &Path,
        isolation: Option<Isolation>,
        described: &PluginInfo,
    ) -> Result<Library, ClassError> {
        let library = Library::open(supervisor, path, isolation)?;
        if library.info() == described {
            return Ok(library);
        }
        let what = if library.info().name != described.name {
            format!("it was {:?}, it is now {:?}", described.name, library.info().name)
        } else if library.info().params != described.params {
            format!("{}: its parameters changed", described.name)
        } else {
            format!("{}: its type, colour model, versions or texts changed", described.name)
        };
        Err(ClassError::Changed { path: library.inner.path.clone(), what })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What the plugin says about itself.
    pub fn info(&self) -> &PluginInfo {
        &self.inner.info
    }

    /// The extension running the library (for its statistics and domain).
    pub fn extension(&self) -> &Extension {
        &self.inner.ext
    }

    /// Create an instance for frames of `width` x `height` pixels.
    pub fn construct(&self, width: u32, height: u32) -> Result<Instance, ClassError> {
        let info = &self.inner.info;
        let bad = |reason: String| ClassError::BadArguments { plugin: info.name.clone(), reason };
        if width == 0 || height == 0 {
            return Err(bad(format!("a frame of {width}x{height} pixels is empty")));
        }
        let pixels = (width as usize)
            .checked_mul(height as usize)
            .filter(|p| p.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| bad(format!("a frame of {width}x{height} pixels is too large")))?;
        let guarded = if self.inner.ext.lends_guarded_buffers() { DIRECT_OUTPUT | PRIVATE_INPUT } else { 0 };
        let flags = guarded | u64::from(self.inner.ext.policy().read_past_input_kb) << READ_PAST_SHIFT;
        let value = self.inner.functions.construct.call(
            &mut [
                Arg::Handle(self.inner.library),
                Arg::U64(u64::from(width)),
                Arg::U64(u64::from(height)),
                Arg::U64(flags),
            ],
            RetType::Handle,
        )?;
        let handle = match value.as_handle() {
            Some(h) if h != 0 => h,
            _ => {
                return Err(ClassError::Refused {
                    plugin: info.name.clone(),
                    what: format!("f0r_construct({width}, {height}) returned NULL"),
                })
            }
        };
        Ok(Instance {
            lib: self.inner.clone(),
            handle,
            width,
            height,
            pixels,
            input: Vec::new(),
            rest: Vec::new(),
            output: Vec::new(),
            value: Vec::new(),
            last_set: vec![None; info.params.len()],
        })
    }
}

/// One process domain that reads what every frei0r plugin a host scans says about itself, so that describing a
/// plugin does not start a domain of its own (its own domain starts when the host first constructs an instance,
/// [`Library::open_as_described`]). Each plugin is loaded there, initialised (`f0r_init`), described as
/// [`Library::open`] describes it, deinitialised (`f0r_deinit`) and unloaded, as a host that lists plugins does. As
/// for LADSPA (`crate::ladspa::Describer`): sandboxed like any process domain, and a plugin that fails there costs
/// the describer its domain and is described again in a domain of its own, where it fails as it always did.
#[derive(Debug)]
pub struct Describer(adapters::SharedDescriber);

impl Describer {
    /// A describer whose domain (started at the first description) runs with `policy`'s defaults; its events go to
    /// no one.
    pub fn new(policy: ward::Policy) -> Describer {
        Describer(adapters::SharedDescriber::new(
            policy,
            adapters::DescriberSpec {
                adapter: ADAPTER,
                class: CLASS,
                open: ("ward_frei0r_open", "f0r_init"),
                unload: "ward_frei0r_unload",
                calls: &[("ward_frei0r_describe", "f0r_get_plugin_info")],
            },
        ))
    }

    /// How many domains the describer has started (one, unless a plugin failed in one).
    pub fn domains_started(&self) -> u64 {
        self.0.domains_started()
    }

    /// The process id of the describer's domain, while it has one.
    pub fn pid(&self) -> Option<i32> {
        self.0.pid()
    }

    /// What the plugin at `path` says about itself, as [`Library::open`] would read it in a domain of its own. Any
    /// failure drops the describer's domain (the next call starts a fresh one).
    pub fn describe(&self, path: &Path) -> Result<PluginInfo, ClassError> {
        self.describe_with_wire(path).map(|(info, _)| info)
    }

    /// As [`Describer::describe`], with the description as the adapter wrote it, for the cache of descriptions.
    pub fn describe_with_wire(&self, path: &Path) -> Result<(PluginInfo, Wire), ClassError> {
        self.0.describe(path, |calls, library, path| {
            let bad_plugin = |reason: String| ClassError::BadPlugin { path: path.to_path_buf(), reason };
            let bytes = describe_plugin(&calls[0], library).map_err(|e| bad_plugin(e.to_string()))?;
            let info = PluginInfo::parse(&bytes).map_err(|e| bad_plugin(format!("its description: {e}")))?;
            Ok((info, Wire(vec![bytes])))
        })
    }
}

/// Ask the adapter for the description, growing the buffer once if it says it needs more.
fn describe_plugin(describe: &Function, library: u64) -> Result<Vec<u8>, DescribeError> {
    let subject = || "the plugin".to_string();
    let mut buf = vec![0u8; DESCRIBE_BUFFER];
    for _ in 0..2 {
        let cap = buf.len() as u64;
        let n = describe
            .call(&mut [Arg::Handle(library), Arg::Out(&mut buf), Arg::U64(cap)], RetType::I64)
            .map_err(|source| DescribeError::Call { subject: subject(), source: Box::new(source) })?
            .as_i64()
            .unwrap_or(ADAPTER_ERROR_BELOW);
        if n >= 0 && n as u64 <= cap {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        if n <= ADAPTER_ERROR_BELOW {
            return Err(DescribeError::Adapter { subject: subject(), code: n });
        }
        if n.unsigned_abs() > MAX_DESCRIPTION {
            return Err(DescribeError::BeyondBelief { subject: subject(), bytes: n.unsigned_abs() });
        }
        buf = vec![0u8; n.unsigned_abs() as usize];
    }
    Err(DescribeError::KeepsGrowing { subject: subject() })
}

/// What one frame through the adapter came to.
enum Frame {
    Ran,
    /// The plugin could not process it: the output is left to the fallback.
    Failed(String),
    /// The adapter refused the arguments: the host's (or this wrapper's) error.
    Refused(String),
}

/// One plugin instance, for frames of a fixed size.
pub struct Instance {
    lib: Arc<LibraryInner>,
    handle: u64,
    width: u32,
    height: u32,
    pixels: usize,
    /// Packing buffers, kept between frames: the first input frame, the further input frames back to back, the
    /// output frame, a parameter value.
    input: Vec<u8>,
    rest: Vec<u8>,
    output: Vec<u8>,
    value: Vec<u8>,
    /// The value each parameter was last set to successfully, if known.
    last_set: Vec<Option<ParamValue>>,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "frei0r::Instance({}, {}x{})", self.lib.info.name, self.width, self.height)
    }
}

impl Instance {
    pub fn info(&self) -> &PluginInfo {
        &self.lib.info
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    /// Pixels of one frame (`width * height`).
    pub fn pixels(&self) -> usize {
        self.pixels
    }

    fn bad(&self, reason: String) -> ClassError {
        ClassError::BadArguments { plugin: self.lib.info.name.clone(), reason }
    }

    fn param(&self, index: usize) -> Result<&ParamInfo, ClassError> {
        let params = &self.lib.info.params;
        params.get(index).ok_or_else(|| self.bad(format!("no parameter {index} (it has {})", params.len())))
    }

    /// Set parameter `index`. The value must be of the parameter's kind. A disabled plugin takes the value as far
    /// as the host can tell (it is bypassed).
    pub fn set_param(&mut self, index: usize, value: &ParamValue) -> Result<Processed, ClassError> {
        let param = self.param(index)?;
        if param.kind != value.kind() {
            return Err(self.bad(format!(
                "parameter {index} ({}) is a {:?}, not a {:?}",
                param.name,
                param.kind,
                value.kind()
            )));
        }
        if let ParamValue::String(s) = value {
            if s.contains('\0') {
                return Err(self.bad(format!("the string for parameter {index} ({}) contains a NUL", param.name)));
            }
        }
        if self.last_set[index].as_ref() == Some(value) {
            // The plugin (and the shadow log) already hold this value.
            return Ok(Processed::Ran);
        }
        value.encode(&mut self.value);
        let len = self.value.len() as u64;
        let result = self.lib.functions.set_param.call(
            &mut [Arg::Handle(self.handle), Arg::U64(index as u64), Arg::In(&self.value), Arg::U64(len)],
            RetType::I64,
        );
        self.last_set[index] = None;
        match result.map(|v| v.as_i64().unwrap_or(0)) {
            Ok(0) => {
                self.last_set[index] = Some(value.clone());
                Ok(Processed::Ran)
            }
            Ok(code) => match classify(code, "the parameter") {
                Frame::Refused(reason) => Err(self.bad(reason)),
                Frame::Failed(reason) => Ok(self.degraded(reason)),
                Frame::Ran => Ok(Processed::Ran),
            },
            Err(e) => Ok(self.degraded(e.to_string())),
        }
    }

    /// The current value of parameter `index`, read from the plugin.
    pub fn get_param(&self, index: usize) -> Result<ParamValue, ClassError> {
        let param = self.param(index)?;
        if let ParamKind::Other(t) = param.kind {
            return Err(
                self.bad(format!("parameter {index} ({}) has type {t}, which frei0r does not define", param.name))
            );
        }
        let mut buf = vec![0u8; PARAM_BUFFER];
        for _ in 0..2 {
            let cap = buf.len() as u64;
            let n = self
                .lib
                .functions
                .get_param
                .call(
                    &mut [Arg::Handle(self.handle), Arg::U64(index as u64), Arg::Out(&mut buf), Arg::U64(cap)],
                    RetType::I64,
                )?
                .as_i64()
                .unwrap_or(ADAPTER_ERROR_BELOW);
            if n >= 0 && n as u64 <= cap {
                return ParamValue::decode(param.kind, &buf[..n as usize]).map_err(|reason| ClassError::BadPlugin {
                    path: self.lib.path.clone(),
                    reason: format!("parameter {index} ({}): {reason}", param.name),
                });
            }
            let bad_plugin = |reason: String| ClassError::BadPlugin {
                path: self.lib.path.clone(),
                reason: format!("parameter {index} ({}): {reason}", param.name),
            };
            if n <= ADAPTER_ERROR_BELOW {
                return Err(match classify(n, "the parameter") {
                    Frame::Refused(reason) => self.bad(reason),
                    Frame::Failed(reason) => bad_plugin(reason),
                    Frame::Ran => bad_plugin(format!("the adapter answered {n}")),
                });
            }
            if n.unsigned_abs() > MAX_VALUE {
                return Err(bad_plugin(format!("a value of {} bytes is beyond belief", n.unsigned_abs())));
            }
            buf = vec![0u8; n.unsigned_abs() as usize];
        }
        Err(ClassError::BadPlugin {
            path: self.lib.path.clone(),
            reason: format!("the value of parameter {index} ({}) keeps growing", param.name),
        })
    }

    /// Send one frame through a filter (or, with an empty `input`, a source): `f0r_update`. `input` and `output`
    /// hold [`Instance::pixels`] pixels each. If the plugin cannot process the frame (it failed even after
    /// recovery, or it is disabled), `output` becomes a copy of `input` (a source's is left as it is) and the
    /// result says why.
    pub fn update(&mut self, time: f64, input: &[u32], output: &mut [u32]) -> Result<Processed, ClassError> {
        let input = self.check_update(input.len(), output.len(), 1)?.then_some(input);
        if let Some(input) = input {
            words_to_bytes(input, vec_of(&mut self.input, self.pixels * 4));
        }
        // The plugin sees what the host's output frame holds, as natively (see call_frame).
        let out = vec_of(&mut self.output, self.pixels * 4);
        words_to_bytes(output, out);
        let in_bytes = input.map(|_| self.input.as_slice());
        match call_frame(&self.lib, self.handle, time, in_bytes, None, out, false) {
            Frame::Ran => {
                bytes_to_words(&self.output, output);
                Ok(Processed::Ran)
            }
            Frame::Failed(reason) => {
                if let Some(input) = input {
                    output.copy_from_slice(input);
                }
                Ok(self.degraded(reason))
            }
            Frame::Refused(reason) => Err(self.bad(reason)),
        }
    }

    /// [`Instance::update`] on frames as bytes (4 per pixel, in native byte order): no conversion on the way.
    pub fn update_bytes(&mut self, time: f64, input: &[u8], output: &mut [u8]) -> Result<Processed, ClassError> {
        let input = self.check_update(input.len(), output.len(), 4)?.then_some(input);
        match call_frame(&self.lib, self.handle, time, input, None, output, false) {
            Frame::Ran => Ok(Processed::Ran),
            Frame::Failed(reason) => {
                if let Some(input) = input {
                    output.copy_from_slice(input);
                }
                Ok(self.degraded(reason))
            }
            Frame::Refused(reason) => Err(self.bad(reason)),
        }
    }

    /// Send one frame through the plugin with `f0r_update2`: as many input frames as the plugin's type takes
    /// (none for a source, `in1` for a filter, `in1` and `in2` for a mixer2, all three for a mixer3; further
    /// frames are not sent). A plugin without `f0r_update2` is served with `f0r_update` when it takes at most one
    /// input. If the plugin cannot process the frame, `output` becomes a copy of `in1` (left as it is when there
    /// is none) and the result says why.
    pub fn update2(
        &mut self,
        time: f64,
        in1: Option<&[u32]>,
        in2: Option<&[u32]>,
        in3: Option<&[u32]>,
        output: &mut [u32],
    ) -> Result<Processed, ClassError> {
        let lens = [in1.map(<[u32]>::len), in2.map(<[u32]>::len), in3.map(<[u32]>::len)];
        let count = self.check_update2(lens, output.len(), 1)?;
        let frame = self.pixels * 4;
        let in1 = in1.filter(|_| count >= 1);
        if let Some(in1) = in1 {
            words_to_bytes(in1, vec_of(&mut self.input, frame));
        }
        if count >= 2 {
            let rest = vec_of(&mut self.rest, frame * (count - 1));
            for (k, src) in [in2, in3].into_iter().take(count - 1).enumerate() {
                words_to_bytes(src.unwrap_or_default(), &mut rest[k * frame..(k + 1) * frame]);
            }
        }
        // The plugin sees what the host's output frame holds, as natively (see call_frame).
        let out = vec_of(&mut self.output, frame);
        words_to_bytes(output, out);
        let first = in1.map(|_| self.input.as_slice());
        let rest = (count >= 2).then_some(self.rest.as_slice());
        match call_frame(&self.lib, self.handle, time, first, rest, out, true) {
            Frame::Ran => {
                bytes_to_words(&self.output, output);
                Ok(Processed::Ran)
            }
            Frame::Failed(reason) => {
                if let Some(in1) = in1 {
                    output.copy_from_slice(in1);
                }
                Ok(self.degraded(reason))
            }
            Frame::Refused(reason) => Err(self.bad(reason)),
        }
    }

    /// [`Instance::update2`] on frames as bytes (4 per pixel, in native byte order). A mixer2's frames cross as
    /// they are; a mixer3's second and third frames are first packed together (one copy).
    pub fn update2_bytes(
        &mut self,
        time: f64,
        in1: Option<&[u8]>,
        in2: Option<&[u8]>,
        in3: Option<&[u8]>,
        output: &mut [u8],
    ) -> Result<Processed, ClassError> {
        let lens = [in1.map(<[u8]>::len), in2.map(<[u8]>::len), in3.map(<[u8]>::len)];
        let count = self.check_update2(lens, output.len(), 4)?;
        let frame = self.pixels * 4;
        let in1 = in1.filter(|_| count >= 1);
        let rest = match (count, in2, in3) {
            (2, Some(in2), _) => Some(in2),
            (3, Some(in2), Some(in3)) => {
                let rest = vec_of(&mut self.rest, 2 * frame);
                rest[..frame].copy_from_slice(in2);
                rest[frame..].copy_from_slice(in3);
                Some(self.rest.as_slice())
            }
            _ => None,
        };
        match call_frame(&self.lib, self.handle, time, in1, rest, output, true) {
            Frame::Ran => Ok(Processed::Ran),
            Frame::Failed(reason) => {
                if let Some(in1) = in1 {
                    output.copy_from_slice(in1);
                }
                Ok(self.degraded(reason))
            }
            Frame::Refused(reason) => Err(self.bad(reason)),
        }
    }

    /// Check an update's frames (lengths in `unit`s, 1 for pixels, 4 for bytes); true when the input is sent.
    fn check_update(&self, input: usize, output: usize, unit: usize) -> Result<bool, ClassError> {
        let info = &self.lib.info;
        let want = self.pixels * unit;
        let what = if unit == 1 { "pixels" } else { "bytes" };
        if matches!(info.plugin_type, PluginType::Mixer2 | PluginType::Mixer3) || !info.has_update {
            return Err(self.bad(format!("a {:?} plugin takes its frames through update2", info.plugin_type)));
        }
        if output != want {
            return Err(self.bad(format!("the output frame has {output} {what}, not {want}")));
        }
        if info.plugin_type == PluginType::Source {
            return Ok(false);
        }
        if input == want {
            Ok(true)
        } else if input == 0 && info.plugin_type != PluginType::Filter {
            Ok(false)
        } else {
            Err(self.bad(format!("the input frame has {input} {what}, not {want}")))
        }
    }

    /// Check an update2's frames (lengths in `unit`s); the number of input frames sent.
    fn check_update2(&self, inputs: [Option<usize>; 3], output: usize, unit: usize) -> Result<usize, ClassError> {
        let info = &self.lib.info;
        let want = self.pixels * unit;
        let what = if unit == 1 { "pixels" } else { "bytes" };
        if output != want {
            return Err(self.bad(format!("the output frame has {output} {what}, not {want}")));
        }
        let given = inputs.iter().take_while(|i| i.is_some()).count();
        if inputs[given..].iter().any(Option::is_some) {
            return Err(self.bad(format!("input frame {} is given without input frame {}", given + 2, given + 1)));
        }
        let count = info.plugin_type.input_frames().unwrap_or(given);
        if given < count {
            return Err(self.bad(format!("a {:?} plugin takes {count} input frames, not {given}", info.plugin_type)));
        }
        for (k, len) in inputs.iter().take(count).enumerate() {
            if let Some(len) = len.filter(|&l| l != want) {
                return Err(self.bad(format!("input frame {} has {len} {what}, not {want}", k + 1)));
            }
        }
        if count > 1 && !info.has_update2 {
            return Err(self.bad("the plugin has no f0r_update2 for several input frames".into()));
        }
        Ok(count)
    }

    /// A call failed even after recovery (or the plugin is disabled): say why and go on.
    fn degraded(&self, reason: String) -> Processed {
        tracing::debug!(plugin = %self.lib.info.name, %reason, "bypassed");
        Processed::Bypassed { reason }
    }
}

/// What an adapter result other than 0 means for the host.
fn classify(code: i64, what: &str) -> Frame {
    match code {
        E_LAYOUT => Frame::Refused(format!("the adapter refused {what}: its layout does not fit the plugin")),
        E_INDEX => Frame::Refused(format!("the adapter refused {what}: no such parameter")),
        E_SYMBOL => Frame::Refused(format!("the adapter refused {what}: the plugin lacks the function")),
        E_NOMEM => Frame::Failed(format!("the domain ran out of memory for {what}")),
        other => Frame::Failed(format!("the adapter failed on {what} (code {other})")),
    }
}

/// One frame through `ward_frei0r_update` (`two` false; `rest` unused) or `ward_frei0r_update2`. Absent frames
/// cross as NULL. The output frame goes in as well as out: some plugins read their output frame (an
/// echo reading what it wrote last time) or leave pixels unwritten, and they must find what the host's frame holds,
/// as they would natively. It comes back only when the frame was processed.
fn call_frame(
    lib: &LibraryInner,
    handle: u64,
    time: f64,
    in1: Option<&[u8]>,
    rest: Option<&[u8]>,
    out: &mut [u8],
    two: bool,
) -> Frame {
    let out_len = out.len() as u64;
    let absent = || Arg::U64(0);
    // In a process domain the first input crosses as scratch: the plugin may write it (some do, despite the
    // const) and the adapter need not copy it once more. Elsewhere the adapter makes its private copy.
    let first = if lib.ext.lends_guarded_buffers() { Arg::Scratch } else { Arg::In };
    let result = if two {
        let rest_len = rest.map_or(0, |r| r.len() as u64);
        let in1 = in1.map_or_else(absent, first);
        let rest = rest.map_or_else(absent, Arg::In);
        lib.functions.update2.call(
            &mut [
                Arg::Handle(handle),
                Arg::F64(time),
                in1,
                rest,
                Arg::U64(rest_len),
                Arg::InOut(out),
                Arg::U64(out_len),
            ],
            RetType::I64,
        )
    } else {
        let in_len = in1.map_or(0, |i| i.len() as u64);
        let in1 = in1.map_or_else(absent, first);
        lib.functions.update.call(
            &mut [Arg::Handle(handle), Arg::F64(time), in1, Arg::U64(in_len), Arg::InOut(out), Arg::U64(out_len)],
            RetType::I64,
        )
    };
    match result.map(|v| v.as_i64().unwrap_or(0)) {
        Ok(0) => Frame::Ran,
        Ok(code) => classify(code, "the frame"),
        Err(e) => Frame::Failed(e.to_string()),
    }
}

/// `buf` resized to `len` bytes (allocating only when it grows), as a slice.
fn vec_of(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    buf.resize(len, 0);
    buf.as_mut_slice()
}

/// Pixels to bytes in native byte order (a loop the compiler turns into vector moves).
fn words_to_bytes(words: &[u32], bytes: &mut [u8]) {
    for (b, w) in bytes.chunks_exact_mut(4).zip(words) {
        b.copy_from_slice(&w.to_ne_bytes());
    }
}

/// Bytes in native byte order to pixels.
fn bytes_to_words(bytes: &[u8], words: &mut [u32]) {
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(4)) {
        *w = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // A failure here leaves nothing behind in the host: the domain's memory goes with it.
        let _ = self.lib.functions.destruct.call(&mut [Arg::Handle(self.handle)], RetType::I64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The adapter's encoding of a description (see `ward_frei0r_describe`).
    fn encode(plugin_type: i32, color_model: i32, frei0r_version: i32, params: &[(&str, i32)]) -> Vec<u8> {
        let mut out = Vec::new();
        let text = |out: &mut Vec<u8>, s: &str| {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        };
        text(&mut out, "probe");
        text(&mut out, "ward");
        for v in [plugin_type, color_model, frei0r_version, 0, 1, params.len() as i32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&HAS_UPDATE.to_le_bytes());
        text(&mut out, "a test");
        for (name, kind) in params {
            text(&mut out, name);
            out.extend_from_slice(&kind.to_le_bytes());
            text(&mut out, "");
        }
        out
    }

    #[test]
    fn a_description_within_frei0r_1_parses() {
        let info = PluginInfo::parse(&encode(0, 1, 1, &[("Amount", 1), ("Colour", 2)])).unwrap();
        assert_eq!(info.plugin_type, PluginType::Filter);
        assert_eq!(info.params[1].kind, ParamKind::Color);
    }

    #[test]
    fn c_values_read_and_written_through_one_table_agree_with_frei0r_h() {
        assert_eq!(PluginType::from_raw(2), PluginType::Mixer2);
        assert_eq!(ColorModel::from_raw(1), ColorModel::Rgba8888);
        assert_eq!(ParamKind::from_raw(4), ParamKind::String);
        assert_eq!(PluginType::Source.raw(), 1);
        assert_eq!(ColorModel::Packed32.raw(), 2);
        assert_eq!(ParamKind::Position.raw(), 3);
        for v in -2..8 {
            assert_eq!(PluginType::from_raw(v).raw(), v);
            assert_eq!(ColorModel::from_raw(v).raw(), v);
            assert_eq!(ParamKind::from_raw(v).raw(), v);
        }
        assert_eq!(PluginType::from_raw(4), PluginType::Other(4));
        assert_eq!(ParamKind::from_raw(-1), ParamKind::Other(-1));
    }

    #[test]
    fn values_frei0r_does_not_define_are_refused() {
        let err = |bytes: Vec<u8>| PluginInfo::parse(&bytes).unwrap_err().to_string();
        assert!(err(encode(-327686, 1, 1, &[])).contains("plugin type -327686"));
        assert!(err(encode(0, 2049, 1, &[])).contains("colour model 2049"));
        assert!(err(encode(0, 1, 0, &[])).contains("written for frei0r 0, not 1"));
        assert!(err(encode(0, 1, 1, &[("Amount", 16385)])).contains("parameter 0 (Amount) has type 16385"));
        assert!(err(encode(0, 1, 1, &[("", 1)])).contains("parameter 0's name is empty"));
    }
}
