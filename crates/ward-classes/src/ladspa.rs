//! The LADSPA class: audio plugins (`ladspa.h`), typed for Rust hosts and shared by the preload shim.
//!
//! A [`Library`] is one plugin library opened through the class adapter inside a domain; its [`Descriptor`]s are
//! read once, through the domain. An [`Instance`] is one plugin instance: the host hands [`Instance::run`] one
//! [`PortBuffer`] per port (or [`Instance::run_placed`] the memory its ports share) and the block crosses
//! call-by-value-result (inputs and outputs copied in, outputs copied back only when the block succeeded), so a
//! failed block is retried on intact input after recovery. The shadow log holds what makes a restarted instance the
//! same as the old one: the library's opening, the instantiation, activation and the run-adding gain. Port
//! connections need no replay: the wrapper hands the ports over with every block.

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

/// Port flags (`LADSPA_PORT_*`).
pub const PORT_INPUT: i32 = 0x1;
pub const PORT_OUTPUT: i32 = 0x2;
pub const PORT_CONTROL: i32 = 0x4;
pub const PORT_AUDIO: i32 = 0x8;

/// Range hint flags (`LADSPA_HINT_*`).
pub const HINT_BOUNDED_BELOW: i32 = 0x1;
pub const HINT_BOUNDED_ABOVE: i32 = 0x2;
pub const HINT_TOGGLED: i32 = 0x4;
pub const HINT_SAMPLE_RATE: i32 = 0x8;
pub const HINT_LOGARITHMIC: i32 = 0x10;
pub const HINT_INTEGER: i32 = 0x20;
const HINT_DEFAULT_MASK: i32 = 0x3C0;
/// Every hint bit LADSPA 1.1 defines, and its largest default (`LADSPA_HINT_DEFAULT_440`).
const KNOWN_HINTS: i32 = 0x3FF;
const HINT_DEFAULT_LAST: i32 = 0x2C0;
/// Every property LADSPA 1.1 defines (real-time, in-place broken, hard real-time capable).
const KNOWN_PROPERTIES: i32 = 0x7;

/// Plugin property: the plugin cannot process in place.
pub const PROPERTY_INPLACE_BROKEN: i32 = 0x2;

/// Flags of the adapter's description: which optional functions the plugin has.
const HAS_ACTIVATE: u32 = 0x1;
const HAS_DEACTIVATE: u32 = 0x2;
const HAS_RUN_ADDING: u32 = 0x4;
const HAS_SET_RUN_ADDING_GAIN: u32 = 0x8;
const HAS_RUN: u32 = 0x20;

/// First guess of a description's size.
const DESCRIBE_BUFFER: usize = 16 * 1024;
/// Plugins with more ports than this are refused (a description claiming more is malformed), natively
/// (`native_calls`) as under ward. The adapter's `WARD_LADSPA_MAX_PORTS` is the same: it does not walk the ports of a
/// descriptor claiming more.
pub(crate) const MAX_PORTS: u32 = 4096;
/// The largest description believed: MAX_PORTS ports with long names. An adapter asking for more room is refused
/// rather than given it (the number comes from the domain).
const MAX_DESCRIPTION: u64 = 4 << 20;

pub(crate) const ADAPTER: &str = "ward_ladspa_adapter";

/// The bypass of a disabled plugin (see `Instance::bypass`), as the message that disables it says.
const WHEN_DISABLED: &str = "audio passes through unchanged (outputs with no input of their own are silent)";

/// The deadline of a block before the core has learned what the plugin's blocks take (DECISIONS.md): far above
/// any block a plugin fit for audio takes, even the first one on a loaded machine, so it is no false alarm; short
/// enough that a plugin hanging on every block is given up on in seconds.
const FIRST_BLOCK_DEADLINE: Duration = Duration::from_secs(1);

/// The adapter functions and what each means to the core: which establish state (replayed, in order, after a
/// restart) and which destroy the handle they are given.
fn function_policies() -> [(&'static str, FunctionPolicy); 8] {
    let state = FunctionPolicy { state: true, ..FunctionPolicy::default() };
    let destroys = FunctionPolicy { destroys: true, ..FunctionPolicy::default() };
    // Blocks advance a plugin's state (delay lines, filter memory): history, kept within the policy's history_mb
    // and history_replay_ms (on by default).
    let history =
        FunctionPolicy { history: true, first_deadline: Some(FIRST_BLOCK_DEADLINE), ..FunctionPolicy::default() };
    [
        ("ward_ladspa_run", history.clone()),
        ("ward_ladspa_run_adding", history),
        ("ward_ladspa_open", state.clone()),
        ("ward_ladspa_instantiate", state.clone()),
        ("ward_ladspa_activate", state.clone()),
        ("ward_ladspa_deactivate", state.clone()),
        // Only the last gain of an instance needs replaying.
        ("ward_ladspa_set_run_adding_gain", FunctionPolicy { replaces_same: Some(1), ..state }),
        ("ward_ladspa_cleanup", destroys),
    ]
}

/// One port of a plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    /// `PORT_*` flags.
    pub descriptor: i32,
    pub name: String,
    /// `HINT_*` flags and the default hint.
    pub hint: i32,
    pub lower: f32,
    pub upper: f32,
}

impl Port {
    pub fn is_input(&self) -> bool {
        self.descriptor & PORT_INPUT != 0
    }

    pub fn is_output(&self) -> bool {
        !self.is_input()
    }

    pub fn is_audio(&self) -> bool {
        self.descriptor & PORT_AUDIO != 0
    }

    pub fn is_control(&self) -> bool {
        !self.is_audio()
    }

    /// How many values this port's buffer holds for a block of `samples` samples.
    pub fn values_in_block(&self, samples: usize) -> usize {
        values_in_block(self.descriptor, samples)
    }

    /// The default value the plugin's hints give this control port at `sample_rate`, as LADSPA defines it (bounds
    /// scaled by the sample rate when so hinted; low, middle and high interpolated geometrically on a logarithmic
    /// port); `None` when the port has no default.
    pub fn default_value(&self, sample_rate: u64) -> Option<f32> {
        let scale = if self.hint & HINT_SAMPLE_RATE != 0 { sample_rate as f32 } else { 1.0 };
        let (lo, hi) = (self.lower * scale, self.upper * scale);
        let log = self.hint & HINT_LOGARITHMIC != 0 && lo > 0.0 && hi > 0.0;
        let between = |w: f32| {
            if log {
                (lo.ln() * (1.0 - w) + hi.ln() * w).exp()
            } else {
                lo * (1.0 - w) + hi * w
            }
        };
        let value = match self.hint & HINT_DEFAULT_MASK {
            0x40 => lo,
            0x80 => between(0.25),
            0xC0 => between(0.5),
            0x100 => between(0.75),
            0x140 => hi,
            0x200 => 0.0,
            0x240 => 1.0,
            0x280 => 100.0,
            0x2C0 => 440.0,
            _ => return None,
        };
        Some(if self.hint & HINT_INTEGER != 0 { value.round() } else { value })
    }
}

/// How many values a port with `PORT_*` flags `flags` is connected to for a block of `samples` samples: the block's
/// samples for an audio port, one value for a control port (LADSPA's rule for `run`).
pub fn values_in_block(flags: i32, samples: usize) -> usize {
    if flags & PORT_AUDIO != 0 {
        samples
    } else {
        1
    }
}

/// What a plugin says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Descriptor {
    /// Its index in the library.
    pub index: usize,
    pub unique_id: u64,
    pub label: String,
    pub properties: i32,
    pub name: String,
    pub maker: String,
    pub copyright: String,
    pub ports: Vec<Port>,
    pub has_activate: bool,
    pub has_deactivate: bool,
    pub has_run: bool,
    pub has_run_adding: bool,
    pub has_set_run_adding_gain: bool,
}

/// Whether a plugin can say this about port `p` (see `plausible`): known hint bits, a defined default, and the
/// bounds its hint declares are numbers.
fn check_port(p: u32, name: &str, hint: i32, lower: f32, upper: f32) -> Result<(), DescriptionError> {
    plausible::text(&format!("port {p}'s name"), name, Text::Name)?;
    if hint & !KNOWN_HINTS != 0 || hint & HINT_DEFAULT_MASK > HINT_DEFAULT_LAST {
        return Err(DescriptionError::UnknownHint { port: p, name: name.to_string(), hint });
    }
    for (flag, bound, which) in [(HINT_BOUNDED_BELOW, lower, "lower"), (HINT_BOUNDED_ABOVE, upper, "upper")] {
        if hint & flag != 0 && !bound.is_finite() {
            return Err(DescriptionError::BoundNotANumber { port: p, name: name.to_string(), which, bound });
        }
    }
    Ok(())
}

impl Descriptor {
    /// The adapter's description of plugin `index`, checked as the class checks what a plugin says of itself. A
    /// native host reads the same fields straight from the plugin (`native_calls::ladspa::Plugin::describe`) and
    /// checks nothing but the port count: it believes the plugin, which is what a native run is there to show.
    fn parse(index: usize, bytes: &[u8]) -> Result<Descriptor, DescriptionError> {
        let mut r = Reader::new(bytes);
        let unique_id = r.u64()?;
        let properties = r.i32()?;
        let port_count = r.u32()?;
        if port_count > MAX_PORTS {
            return Err(DescriptionError::TooManyPorts { index, count: u64::from(port_count) });
        }
        let flags = r.u32()?;
        let (label, name, maker, copyright) = (r.string()?, r.string()?, r.string()?, r.string()?);
        let mut ports = Vec::with_capacity(port_count as usize);
        for p in 0..port_count {
            let descriptor = r.i32()?;
            let (hint, lower, upper, pname) = (r.i32()?, r.f32()?, r.f32()?, r.string()?);
            let input = descriptor & PORT_INPUT != 0;
            let output = descriptor & PORT_OUTPUT != 0;
            let audio = descriptor & PORT_AUDIO != 0;
            let control = descriptor & PORT_CONTROL != 0;
            if input == output || audio == control {
                return Err(DescriptionError::PortFlags { port: p, name: pname, label, flags: descriptor });
            }
            check_port(p, &pname, hint, lower, upper)?;
            ports.push(Port { descriptor, name: pname, hint, lower, upper });
        }
        r.finish()?;
        plausible::text("the label", &label, Text::Name)?;
        if label.contains(char::is_whitespace) {
            return Err(DescriptionError::LabelWithWhiteSpace { label });
        }
        plausible::text(&format!("the name of {label}"), &name, Text::Name)?;
        plausible::text(&format!("the maker of {label}"), &maker, Text::Prose)?;
        plausible::text(&format!("the copyright of {label}"), &copyright, Text::Prose)?;
        if properties & !KNOWN_PROPERTIES != 0 {
            return Err(DescriptionError::UnknownProperties { label, properties, known: KNOWN_PROPERTIES });
        }
        Ok(Descriptor {
            index,
            unique_id,
            label,
            properties,
            name,
            maker,
            copyright,
            ports,
            has_activate: flags & HAS_ACTIVATE != 0,
            has_deactivate: flags & HAS_DEACTIVATE != 0,
            has_run: flags & HAS_RUN != 0,
            has_run_adding: flags & HAS_RUN_ADDING != 0,
            has_set_run_adding_gain: flags & HAS_SET_RUN_ADDING_GAIN != 0,
        })
    }
}

struct Functions {
    instantiate: Function,
    activate: Function,
    deactivate: Function,
    set_gain: Function,
    run: Function,
    run_adding: Function,
    cleanup: Function,
}

struct LibraryInner {
    path: PathBuf,
    ext: Extension,
    plugins: Vec<Arc<Descriptor>>,
    library: u64,
    functions: Functions,
    check_output: bool,
}

/// An opened LADSPA plugin library.
#[derive(Clone)]
pub struct Library {
    inner: Arc<LibraryInner>,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ladspa::Library({}, {} plugins)", self.inner.path.display(), self.inner.plugins.len())
    }
}

/// Every plugin descriptor of the opened library `library`.
fn describe_all(ext: &Extension, library: u64, path: &Path) -> Result<Vec<Arc<Descriptor>>, ClassError> {
    let count = ext.function_as("ward_ladspa_count", "ladspa_descriptor")?;
    let describe = ext.function_as("ward_ladspa_describe", "ladspa_descriptor")?;
    describe_with(&count, &describe, library, path).map(|(plugins, _)| plugins)
}

/// Every plugin descriptor of the opened library `library`, through the adapter's `count` and `describe`, with the
/// descriptions as the adapter wrote them.
fn describe_with(
    count: &Function,
    describe: &Function,
    library: u64,
    path: &Path,
) -> Result<(Vec<Arc<Descriptor>>, Wire), ClassError> {
    let count = count.call(&mut [Arg::Handle(library)], RetType::I64)?;
    let count = count.as_i64().filter(|&c| c >= 0).unwrap_or(0) as usize;
    if count == 0 {
        return Err(ClassError::NotAPlugin {
            path: path.to_path_buf(),
            class: "LADSPA",
            reason: "ladspa_descriptor(0) returned NULL: the library has no plugins".into(),
        });
    }
    let mut plugins = Vec::with_capacity(count);
    let mut wire = Vec::with_capacity(count);
    for index in 0..count {
        let bytes = describe_one(describe, library, index)
            .map_err(|e| ClassError::BadPlugin { path: path.to_path_buf(), reason: e.to_string() })?;
        let d = Descriptor::parse(index, &bytes).map_err(|reason| ClassError::BadPlugin {
            path: path.to_path_buf(),
            reason: format!("plugin {index}: {reason}"),
        })?;
        plugins.push(Arc::new(d));
        wire.push(bytes);
    }
    Ok((plugins, Wire(wire)))
}

/// A library's descriptions as the adapter wrote them (kept in the cache of descriptions), checked as
/// [`describe_with`] checks them: at least one plugin, each description believable.
pub(crate) fn parse_described(wire: &[Vec<u8>]) -> Result<Vec<Arc<Descriptor>>, DescriptionError> {
    if wire.is_empty() {
        return Err(DescriptionError::NoPlugins);
    }
    wire.iter().enumerate().map(|(index, bytes)| Descriptor::parse(index, bytes).map(Arc::new)).collect()
}

impl Library {
    /// Open the library at `path` in a domain of the isolation its policy gives it (or `isolation`), and read its
    /// plugins' descriptors.
    pub fn open(supervisor: &Supervisor, path: &Path, isolation: Option<Isolation>) -> Result<Library, ClassError> {
        let policies = function_policies();
        let spec = adapters::OpenSpec {
            adapter: ADAPTER,
            class: "LADSPA",
            functions: &policies,
            when_disabled: WHEN_DISABLED,
            open: "ward_ladspa_open",
            open_call: "ladspa_descriptor",
        };
        let adapters::Opened { path, ext, library } = adapters::open_library(supervisor, path, isolation, &spec)?;
        let plugins = adapters::described(&ext, "ward_ladspa_describe", || describe_all(&ext, library, &path))?;
        let functions = Functions {
            instantiate: ext.function_as("ward_ladspa_instantiate", "instantiate")?,
            activate: ext.function_as("ward_ladspa_activate", "activate")?,
            deactivate: ext.function_as("ward_ladspa_deactivate", "deactivate")?,
            set_gain: ext.function_as("ward_ladspa_set_run_adding_gain", "set_run_adding_gain")?,
            run: ext.function_as("ward_ladspa_run", "run")?,
            run_adding: ext.function_as("ward_ladspa_run_adding", "run_adding")?,
            cleanup: ext.function_as("ward_ladspa_cleanup", "cleanup")?,
        };
        let check_output = ext.policy().check_output;
        Ok(Library { inner: Arc::new(LibraryInner { path, ext, plugins, library, functions, check_output }) })
    }

    /// Open the library at `path` as [`Library::open`] does, for a host that was given `described` (what a
    /// [`Describer`] read of it) when it scanned it: the descriptions read now, in the library's own domain, must be
    /// the same, else the file changed in between and the library is refused ([`ClassError::Changed`]).
    pub fn open_as_described(
        supervisor: &Supervisor,
        path: &Path,
        isolation: Option<Isolation>,
        described: &[Arc<Descriptor>],
    ) -> Result<Library, ClassError> {
        let library = Library::open(supervisor, path, isolation)?;
        match difference(described, library.plugins()) {
            None => Ok(library),
            Some(what) => Err(ClassError::Changed { path: library.inner.path.clone(), what }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The plugins of the library, in index order.
    pub fn plugins(&self) -> &[Arc<Descriptor>] {
        &self.inner.plugins
    }

    /// The plugin labelled `label`.
    pub fn plugin(&self, label: &str) -> Result<&Arc<Descriptor>, ClassError> {
        self.inner.plugins.iter().find(|d| d.label == label).ok_or_else(|| ClassError::NoSuchPlugin {
            path: self.inner.path.clone(),
            which: format!("labelled {label}"),
            count: self.inner.plugins.len(),
            labels: self.labels(),
        })
    }

    /// The plugins' labels, comma-separated, for messages.
    fn labels(&self) -> String {
        self.inner.plugins.iter().map(|d| d.label.as_str()).collect::<Vec<_>>().join(", ")
    }

    /// The extension running the library (for its statistics and domain).
    pub fn extension(&self) -> &Extension {
        &self.inner.ext
    }

    /// Create an instance of plugin `index` at `sample_rate`.
    pub fn instantiate(&self, index: usize, sample_rate: u64) -> Result<Instance, ClassError> {
        let plugin = self.inner.plugins.get(index).cloned().ok_or_else(|| ClassError::NoSuchPlugin {
            path: self.inner.path.clone(),
            which: format!("#{index}"),
            count: self.inner.plugins.len(),
            labels: self.labels(),
        })?;
        let value = self.inner.functions.instantiate.call(
            &mut [
                Arg::Handle(self.inner.library),
                Arg::U64(index as u64),
                Arg::U64(sample_rate),
                Arg::U64(u64::from(self.inner.ext.policy().read_past_input_kb)),
            ],
            RetType::Handle,
        )?;
        let handle = match value.as_handle() {
            Some(h) if h != 0 => h,
            _ => {
                return Err(ClassError::Refused {
                    plugin: plugin.label.clone(),
                    what: format!("instantiate at {sample_rate} Hz returned NULL"),
                })
            }
        };
        let own_regions = (0..plugin.ports.len()).map(|region| Placement { region, offset: 0 }).collect();
        Ok(Instance {
            lib: self.inner.clone(),
            plugin,
            handle,
            gain: 1.0,
            input: Vec::new(),
            output: Vec::new(),
            output_at: Vec::new(),
            zero_regions: Vec::new(),
            own_regions,
            output_is_its_own: false,
        })
    }
}

/// How two readings of a library's descriptions differ, said briefly; `None` when they are the same. A bound counts
/// only where the port's hint declares it: elsewhere plugins leave it uninitialised (ladspa-sdk's sine.so), and two
/// processes read different garbage there.
pub fn difference(before: &[Arc<Descriptor>], now: &[Arc<Descriptor>]) -> Option<String> {
    if before.len() != now.len() {
        return Some(format!("it had {} plugins, it now has {}", before.len(), now.len()));
    }
    let bound = |p: &Port, flag: i32, value: f32| (p.hint & flag != 0).then_some(value.to_bits());
    let same_port = |a: &Port, b: &Port| {
        (a.descriptor, &a.name, a.hint) == (b.descriptor, &b.name, b.hint)
            && bound(a, HINT_BOUNDED_BELOW, a.lower) == bound(b, HINT_BOUNDED_BELOW, b.lower)
            && bound(a, HINT_BOUNDED_ABOVE, a.upper) == bound(b, HINT_BOUNDED_ABOVE, b.upper)
    };
    for (a, b) in before.iter().zip(now) {
        let what = |field: &str| Some(format!("plugin {} ({}): its {field} changed", a.index, a.label));
        if (a.index, a.unique_id, &a.label) != (b.index, b.unique_id, &b.label) {
            return what("identity (index, unique id or label)");
        }
        if (&a.name, &a.maker, &a.copyright, a.properties) != (&b.name, &b.maker, &b.copyright, b.properties) {
            return what("name, maker, copyright or properties");
        }
        if a.ports.len() != b.ports.len() {
            return Some(format!("plugin {} ({}): {} ports, now {}", a.index, a.label, a.ports.len(), b.ports.len()));
        }
        if let Some(p) = a.ports.iter().zip(&b.ports).position(|(x, y)| !same_port(x, y)) {
            return Some(format!("plugin {} ({}): port {p} ({}) changed", a.index, a.label, a.ports[p].name));
        }
        let functions =
            |d: &Descriptor| (d.has_activate, d.has_deactivate, d.has_run, d.has_run_adding, d.has_set_run_adding_gain);
        if functions(a) != functions(b) {
            return what("functions");
        }
    }
    None
}

/// One process domain that reads the descriptions of every LADSPA library a host scans, so that describing a
/// library does not start a domain of its own (a library's own domain starts when the host first instantiates from
/// it, [`Library::open_as_described`]). Each library is loaded there, described as [`Library::open`] describes it,
/// and unloaded. The domain is sandboxed like any process domain. A library that fails there (crashes, hangs,
/// describes itself badly) fails only its own description: the domain is dropped, the next library gets a fresh
/// one, and the caller describes the failed one the old way, in a domain of its own, where it fails as it always
/// did (DECISIONS.md).
#[derive(Debug)]
pub struct Describer(adapters::SharedDescriber);

impl Describer {
    /// A describer whose domain (started at the first description) runs with `policy`'s defaults: its extension is
    /// the adapter itself (`ward_ladspa_adapter`), not any plugin, and always a process domain. Its events go to no
    /// one: a library that fails in it is described again in its own domain, whose events the host gets.
    pub fn new(policy: ward::Policy) -> Describer {
        Describer(adapters::SharedDescriber::new(
            policy,
            adapters::DescriberSpec {
                adapter: ADAPTER,
                class: "LADSPA",
                open: ("ward_ladspa_open", "ladspa_descriptor"),
                unload: "ward_ladspa_unload",
                calls: &[("ward_ladspa_count", "ladspa_descriptor"), ("ward_ladspa_describe", "ladspa_descriptor")],
            },
        ))
    }

    /// How many domains the describer has started (one, unless a library failed in one).
    pub fn domains_started(&self) -> u64 {
        self.0.domains_started()
    }

    /// The process id of the describer's domain, while it has one.
    pub fn pid(&self) -> Option<i32> {
        self.0.pid()
    }

    /// The descriptions of the library at `path`, as [`Library::open`] would read them in a domain of its own.
    /// Any failure drops the describer's domain (the next call starts a fresh one).
    pub fn describe(&self, path: &Path) -> Result<Vec<Arc<Descriptor>>, ClassError> {
        self.describe_with_wire(path).map(|(plugins, _)| plugins)
    }

    /// As [`Describer::describe`], with the descriptions as the adapter wrote them, for the cache of descriptions.
    pub fn describe_with_wire(&self, path: &Path) -> Result<(Vec<Arc<Descriptor>>, Wire), ClassError> {
        self.0.describe(path, |calls, library, path| describe_with(&calls[0], &calls[1], library, path))
    }
}

/// Ask the adapter for a description, growing the buffer once if it says it needs more.
fn describe_one(describe: &Function, library: u64, index: usize) -> Result<Vec<u8>, DescribeError> {
    let subject = || format!("plugin {index}");
    let mut buf = vec![0u8; DESCRIBE_BUFFER];
    for _ in 0..2 {
        let cap = buf.len() as u64;
        let n = describe
            .call(&mut [Arg::Handle(library), Arg::U64(index as u64), Arg::Out(&mut buf), Arg::U64(cap)], RetType::I64)
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

/// Flags of a region in a block's layout (the adapter's `REGION_*`): it holds an output and comes back; it holds
/// zeros only and its bytes are not sent (the adapter clears its copy).
const REGION_RETURNS: u32 = 0x1;
const REGION_ZEROS: u32 = 0x2;

/// The data of one port for one block: a control port's slice holds its one value. In [`Instance::run_placed`], one
/// region of memory ports lie in: `Input` when it holds inputs only, `Output` when it holds an output.
#[derive(Debug)]
pub enum PortBuffer<'a> {
    Input(&'a [f32]),
    Output(&'a mut [f32]),
}

/// Where a port's data lies for [`Instance::run_placed`]: in region `region`, from its float `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub region: usize,
    pub offset: usize,
}

/// One instance of a plugin.
pub struct Instance {
    lib: Arc<LibraryInner>,
    plugin: Arc<Descriptor>,
    handle: u64,
    gain: f32,
    /// Packing buffers, kept between blocks: the layout and every region as the host's memory holds it; the
    /// regions holding an output as the plugin left them (see the adapter's `struct layout`). The outputs' old
    /// contents travel as an input, not in an in-out buffer: the core keeps a block's inputs as history after the
    /// call, when an in-out buffer holds the results. The history keeps `input` itself (`Arg::InVec`) and leaves
    /// another buffer in its place, so it is packed anew for every call.
    input: Vec<u8>,
    output: Vec<u8>,
    /// Where each region holding an output starts in `output`.
    output_at: Vec<usize>,
    /// Which regions of the block hold zeros only (sent as a flag, not as their bytes).
    zero_regions: Vec<bool>,
    /// Each port in a region of its own (`run` and `run_adding`).
    own_regions: Vec<Placement>,
    /// The plugin wrote a NaN or infinity again on the block retried after the recovery the first one caused: its
    /// output is its own, passed on unchecked from then on (the policy's `check_output`).
    output_is_its_own: bool,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ladspa::Instance({})", self.plugin.label)
    }
}

impl Instance {
    pub fn descriptor(&self) -> &Arc<Descriptor> {
        &self.plugin
    }

    /// Activate the instance. A disabled plugin is activated as far as the host can tell (it is bypassed).
    pub fn activate(&mut self) -> Result<Processed, ClassError> {
        self.lifecycle(true)
    }

    pub fn deactivate(&mut self) -> Result<Processed, ClassError> {
        self.lifecycle(false)
    }

    fn lifecycle(&mut self, activate: bool) -> Result<Processed, ClassError> {
        let f = if activate { &self.lib.functions.activate } else { &self.lib.functions.deactivate };
        match f.call(&mut [Arg::Handle(self.handle)], RetType::I64) {
            Ok(_) => Ok(Processed::Ran),
            Err(e) => Ok(self.degraded(e)),
        }
    }

    /// Set the gain `run_adding` mixes with.
    pub fn set_run_adding_gain(&mut self, gain: f32) -> Result<Processed, ClassError> {
        self.gain = gain;
        match self.lib.functions.set_gain.call(&mut [Arg::Handle(self.handle), Arg::F64(f64::from(gain))], RetType::I64)
        {
            Ok(_) => Ok(Processed::Ran),
            Err(e) => Ok(self.degraded(e)),
        }
    }

    /// Run one block of `samples` samples; `ports` has one buffer per port, in port order. An output's buffer comes
    /// to the plugin with what it holds, so samples a plugin leaves unwritten keep it, as they would natively.
    pub fn run(&mut self, samples: usize, ports: &mut [PortBuffer<'_>]) -> Result<Processed, ClassError> {
        self.run_in_own_regions(samples, ports, false)
    }

    /// Run one block, mixing into the outputs with the run-adding gain.
    pub fn run_adding(&mut self, samples: usize, ports: &mut [PortBuffer<'_>]) -> Result<Processed, ClassError> {
        self.run_in_own_regions(samples, ports, true)
    }

    /// A block whose every port is a region of its own (the placements kept for that, taken and put back).
    fn run_in_own_regions(
        &mut self,
        samples: usize,
        ports: &mut [PortBuffer<'_>],
        adding: bool,
    ) -> Result<Processed, ClassError> {
        let placements = std::mem::take(&mut self.own_regions);
        let result = self.run_placed(samples, ports, &placements, adding);
        self.own_regions = placements;
        result
    }

    /// Run one block (mixing, with `adding`) with ports that share memory, as a host's may (an input and an output
    /// run in place): `regions` are the disjoint pieces of memory, `placements` says where each port lies. The
    /// plugin sees the same sharing, so a plugin that reads an input after writing the output on the same buffer
    /// computes what it does natively.
    pub fn run_placed(
        &mut self,
        samples: usize,
        regions: &mut [PortBuffer<'_>],
        placements: &[Placement],
        adding: bool,
    ) -> Result<Processed, ClassError> {
        let lengths = self.check_layout(samples, regions, placements)?;
        let has = if adding { self.plugin.has_run_adding } else { self.plugin.has_run };
        if !has {
            let what = if adding { "run_adding" } else { "run" };
            return Err(self.bad(format!("the plugin has no {what} function")));
        }
        let mut attempts = 0;
        loop {
            attempts += 1;
            // Packed for every attempt: the history may have kept the last attempt's packing buffer.
            self.pack(regions, placements, &lengths);
            let checked = self.lib.check_output && !self.output_is_its_own;
            let direct = if checked { None } else { self.direct_output(regions, &lengths) };
            let took_directly = direct.is_some();
            match self.call_block(samples, adding, direct) {
                Err(e) => {
                    self.bypass(samples, regions, placements, adding);
                    return Ok(self.degraded(e));
                }
                Ok(code) if code != 0 => {
                    // (A region that took the results directly holds what the domain left in their place.)
                    return Err(self.bad(format!("the adapter refused the block (code {code})")));
                }
                Ok(_) => {}
            }
            if checked {
                if let Some(what) = self.non_finite_output(samples, placements) {
                    let call = if adding { "ward_ladspa_run_adding" } else { "ward_ladspa_run" };
                    if attempts > 1 {
                        // The retry on the recovered domain wrote it again: the plugin does so natively too.
                        self.output_is_its_own = true;
                        self.lib.ext.report_own_output(call, &what);
                        self.unpack(regions, &lengths);
                        return Ok(Processed::Ran);
                    }
                    let declared = self.lib.ext.declare_fault(call, FaultKind::BadOutput { what: what.clone() });
                    if declared.is_ok() && attempts <= self.lib.ext.policy().max_retries {
                        // The domain was recovered; the host's regions are intact: try again.
                        continue;
                    }
                    self.bypass(samples, regions, placements, adding);
                    return Ok(Processed::Bypassed { reason: format!("output check failed: {what}") });
                }
            }
            if !took_directly {
                self.unpack(regions, &lengths);
            }
            return Ok(Processed::Ran);
        }
    }

    /// The host's memory of the block's one region holding outputs, as bytes, when there is only one: the call's
    /// results go straight there, not through the packing buffer (only when they need no check first).
    fn direct_output<'r>(&self, regions: &'r mut [PortBuffer<'_>], lengths: &[usize]) -> Option<&'r mut [u8]> {
        let mut outputs = regions.iter_mut().zip(lengths).filter_map(|(region, &len)| match region {
            PortBuffer::Output(s) => Some(&mut s[..len]),
            PortBuffer::Input(_) => None,
        });
        let only = outputs.next()?;
        if outputs.next().is_some() {
            return None;
        }
        Some(bytemuck::cast_slice_mut(only))
    }

    /// One call of the adapter with the packed block; the outputs come back into `direct` if given (the one region
    /// holding outputs, see `direct_output`), else into the output packing buffer.
    fn call_block(&mut self, samples: usize, adding: bool, direct: Option<&mut [u8]>) -> Result<i64, ward::Error> {
        let in_len = self.input.len() as u64;
        let f = if adding { &self.lib.functions.run_adding } else { &self.lib.functions.run };
        let output = match direct {
            Some(bytes) => bytes,
            None => &mut self.output[..],
        };
        let out_len = output.len() as u64;
        let value = f.call(
            &mut [
                Arg::Handle(self.handle),
                Arg::U64(samples as u64),
                // The history keeps this buffer itself, not a copy of it (the next block is packed anew).
                Arg::InVec(&mut self.input),
                Arg::U64(in_len),
                Arg::Out(output),
                Arg::U64(out_len),
            ],
            RetType::I64,
        )?;
        Ok(value.as_i64().unwrap_or(0))
    }

    fn bad(&self, reason: String) -> ClassError {
        ClassError::BadArguments { plugin: self.plugin.label.clone(), reason }
    }

    /// Check that every port lies inside its region (an output in an `Output` one); the floats of each region the
    /// block uses.
    fn check_layout(
        &self,
        samples: usize,
        regions: &[PortBuffer<'_>],
        placements: &[Placement],
    ) -> Result<Vec<usize>, ClassError> {
        let ports = &self.plugin.ports;
        if placements.len() != ports.len() || regions.len() > ports.len() {
            return Err(self.bad(format!(
                "{} placements and {} buffers for {} ports",
                placements.len(),
                regions.len(),
                ports.len()
            )));
        }
        let mut lengths = vec![0usize; regions.len()];
        for (i, (port, place)) in ports.iter().zip(placements).enumerate() {
            let Some(region) = regions.get(place.region) else {
                return Err(
                    self.bad(format!("port {i} ({}) lies in region {}, which is missing", port.name, place.region))
                );
            };
            let (len, input) = match region {
                PortBuffer::Input(s) => (s.len(), true),
                PortBuffer::Output(s) => (s.len(), false),
            };
            if input && port.is_output() {
                return Err(self.bad(format!("port {i} ({}) is an output", port.name)));
            }
            let need = port.values_in_block(samples);
            let end = place.offset.checked_add(need).filter(|&e| e <= len && u32::try_from(e).is_ok());
            let Some(end) = end else {
                return Err(self.bad(format!("port {i} ({}) needs {need} values, got {len}", port.name)));
            };
            lengths[place.region] = lengths[place.region].max(end);
        }
        Ok(lengths)
    }

    /// The layout and every region into the input packing buffer; room in the output one for the regions holding an
    /// output.
    fn pack(&mut self, regions: &[PortBuffer<'_>], placements: &[Placement], lengths: &[usize]) {
        let word = |v: usize| (v as u32).to_ne_bytes();
        self.input.clear();
        self.output_at.clear();
        self.zero_regions.clear();
        // At most this, in one allocation: the buffer may be a fresh one the history left in its place.
        self.input.reserve(4 + 8 * (regions.len() + placements.len()) + 4 * lengths.iter().sum::<usize>());
        self.input.extend_from_slice(&word(regions.len()));
        // A region of zeros only (a host's fresh output buffer, silence) is said by its flag, not sent.
        let mut out_len = 0;
        for (region, &len) in regions.iter().zip(lengths) {
            let (s, mut flags): (&[f32], u32) = match region {
                PortBuffer::Input(s) => {
                    self.output_at.push(usize::MAX);
                    (&s[..len], 0)
                }
                PortBuffer::Output(s) => {
                    self.output_at.push(out_len);
                    out_len += len * 4;
                    (&s[..len], REGION_RETURNS)
                }
            };
            // Every float +0.0 (every bit clear), so the adapter's cleared copy is the same bytes.
            let zeros = crate::samples::without_trailing_zeros(s) == 0;
            if zeros {
                flags |= REGION_ZEROS;
            }
            self.zero_regions.push(zeros);
            self.input.extend_from_slice(&word(len));
            self.input.extend_from_slice(&flags.to_ne_bytes());
        }
        for place in placements {
            self.input.extend_from_slice(&word(place.region));
            self.input.extend_from_slice(&word(place.offset));
        }
        // Whole regions at a time (samples as their native bytes), not sample by sample.
        for ((region, &len), &zeros) in regions.iter().zip(lengths).zip(&self.zero_regions) {
            let s: &[f32] = match region {
                PortBuffer::Input(s) => s,
                PortBuffer::Output(s) => s,
            };
            if !zeros {
                self.input.extend_from_slice(bytemuck::cast_slice(&s[..len]));
            }
        }
        // Only its length matters: the call writes every byte of it (or fails, and it is not read).
        self.output.resize(out_len, 0);
    }

    /// The regions holding outputs from the packing buffer back into the host's memory.
    fn unpack(&self, regions: &mut [PortBuffer<'_>], lengths: &[usize]) {
        for ((region, &len), &at) in regions.iter_mut().zip(lengths).zip(&self.output_at) {
            let PortBuffer::Output(s) = region else { continue };
            // The destination as bytes: always aligned, whatever the packing buffer's alignment.
            bytemuck::cast_slice_mut::<f32, u8>(&mut s[..len]).copy_from_slice(&self.output[at..at + len * 4]);
        }
    }

    /// The first non-finite audio output sample, described.
    fn non_finite_output(&self, samples: usize, placements: &[Placement]) -> Option<String> {
        for (port, place) in self.plugin.ports.iter().zip(placements) {
            if !(port.is_output() && port.is_audio()) {
                continue;
            }
            let at = self.output_at[place.region] + place.offset * 4;
            let bytes = &self.output[at..at + samples * 4];
            if let Some(i) = crate::samples::first_non_finite(bytes) {
                return Some(format!("{} wrote a NaN or infinity to {} at sample {i}", self.plugin.label, port.name));
            }
        }
        None
    }

    /// The class's fallback for a block the plugin cannot process: the i-th audio input goes to the i-th audio
    /// output (added with the gain for run_adding), other audio outputs get silence (left as they are for
    /// run_adding); control outputs keep their values. Inputs are read before each output is written, so an
    /// output sharing its input's memory keeps it.
    fn bypass(&self, samples: usize, regions: &mut [PortBuffer<'_>], placements: &[Placement], adding: bool) {
        let ports = &self.plugin.ports;
        let audio = |input: bool| -> Vec<usize> {
            (0..ports.len()).filter(|&i| ports[i].is_audio() && ports[i].is_input() == input).collect()
        };
        let (inputs, outputs) = (audio(true), audio(false));
        for (k, &o) in outputs.iter().enumerate() {
            let source: Option<Vec<f32>> = inputs.get(k).map(|&i| {
                let at = placements[i];
                let s: &[f32] = match &regions[at.region] {
                    PortBuffer::Input(s) => s,
                    PortBuffer::Output(s) => s,
                };
                s[at.offset..at.offset + samples].to_vec()
            });
            let at = placements[o];
            let PortBuffer::Output(out) = &mut regions[at.region] else { continue };
            let out = &mut out[at.offset..at.offset + samples];
            match (source, adding) {
                (Some(src), false) => out.copy_from_slice(&src),
                (Some(src), true) => out.iter_mut().zip(src).for_each(|(d, s)| *d += s * self.gain),
                (None, false) => out.fill(0.0),
                (None, true) => {}
            }
        }
    }

    /// A call failed even after recovery (or the plugin is disabled): say so once per cause and go on.
    fn degraded(&self, e: ward::Error) -> Processed {
        tracing::debug!(plugin = %self.plugin.label, error = %e, "bypassed");
        Processed::Bypassed { reason: e.to_string() }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // A failure here leaves nothing behind in the host: the domain's memory goes with it.
        let _ = self.lib.functions.cleanup.call(&mut [Arg::Handle(self.handle)], RetType::I64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The adapter's encoding of a descriptor (see `ward_ladspa_describe`) with one port.
    fn encode(label: &str, properties: i32, port: (i32, i32, f32, f32, &str)) -> Vec<u8> {
        let mut out = Vec::new();
        let text = |out: &mut Vec<u8>, s: &str| {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        };
        out.extend_from_slice(&4950009u64.to_le_bytes());
        out.extend_from_slice(&properties.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&HAS_RUN.to_le_bytes());
        for s in [label, "Probe", "ward", "None"] {
            text(&mut out, s);
        }
        let (descriptor, hint, lower, upper, name) = port;
        out.extend_from_slice(&descriptor.to_le_bytes());
        out.extend_from_slice(&hint.to_le_bytes());
        out.extend_from_slice(&lower.to_le_bytes());
        out.extend_from_slice(&upper.to_le_bytes());
        text(&mut out, name);
        out
    }

    const GAIN: (i32, i32, f32, f32, &str) = (PORT_INPUT | PORT_CONTROL, 0x2C3, 0.0, 10.0, "Gain");

    #[test]
    fn a_descriptor_within_ladspa_1_1_parses() {
        let d = Descriptor::parse(0, &encode("probe", 0x5, GAIN)).unwrap();
        assert_eq!((d.label.as_str(), d.ports[0].hint), ("probe", 0x2C3));
    }

    #[test]
    fn values_ladspa_does_not_define_are_refused() {
        let err = |bytes: Vec<u8>| Descriptor::parse(0, &bytes).unwrap_err().to_string();
        assert!(err(encode("", 0, GAIN)).contains("the label is empty"));
        assert!(err(encode("pro be", 0, GAIN)).contains("white space"));
        assert!(err(encode("probe", 0x10, GAIN)).contains("properties 0x10"));
        assert!(err(encode("probe", 0, (GAIN.0, 0x400, 0.0, 1.0, "Gain"))).contains("hint 0x400"));
        assert!(err(encode("probe", 0, (GAIN.0, 0x300, 0.0, 1.0, "Gain"))).contains("hint 0x300"));
        assert!(err(encode("probe", 0, (GAIN.0, 0x1, f32::NAN, 1.0, "Gain"))).contains("lower bound NaN"));
        assert!(err(encode("probe", 0, (GAIN.0, 0x2, 0.0, f32::INFINITY, "Gain"))).contains("upper bound inf"));
        assert!(err(encode("probe", 0, (GAIN.0, 0, 0.0, 1.0, "G\u{1}ain"))).contains("control character 0x01"));
        // A bound its hint does not declare is not looked at.
        assert!(Descriptor::parse(0, &encode("probe", 0, (GAIN.0, 0, f32::NAN, 1.0, "Gain"))).is_ok());
    }
}
