//! What an LV2 bundle says about its plugins: each plugin's URI, binary and ports, read from the bundle's Turtle
//! files, for the LV2 class and its transparent-mode proxy (which must know, for a binary a host opens, what each
//! port is before the plugin runs).
//!
//! The contract:
//!
//! * **Which files.** A bundle is a directory with a `manifest.ttl`. The reader parses the manifest and every file
//!   the manifest names with `rdfs:seeAlso` as a `file:` IRI (other IRIs, such as a web page about the author, are
//!   not files and are left alone), each file once, and no other file: `rdfs:seeAlso` in those files is not followed
//!   further (lilv does the same). A named file must lie inside the bundle, symbolic links resolved, or the bundle
//!   is refused ([`BundleError::OutsideBundle`]); no file larger than [`MAX_FILE_BYTES`] is read.
//! * **Parsing.** Turtle is parsed by `oxttl` against each file's own IRI (the `file://` URL of its absolute path),
//!   so relative IRIs (`<plugin.so>`) and prefixes resolve as lilv resolves them. Blank nodes are scoped to the file
//!   they are written in. The first syntax error ends the read and names the file, line and column.
//! * **The index.** All triples of all files go into one index (subject → predicate → objects, each object with the
//!   file that stated it), built once per bundle; every plugin is then read from the index, never by rescanning a
//!   file. A plugin's triples may be spread over any of the files (manifest, its own file, presets).
//! * **Which plugins.** A plugin is a subject the manifest types `lv2:Plugin`, in the order the manifest names
//!   them. A UI is any subject with a `ui:binary`. Subjects of other kinds (presets, projects, people, port groups)
//!   are indexed and otherwise ignored.
//! * **What is checked.** Each plugin has an `lv2:binary`, ports with an integer `lv2:index`, an `lv2:symbol` and
//!   exactly one direction, and its indices are exactly `0..n`; otherwise the whole bundle is refused, with an error
//!   naming the plugin and the file. Nothing here loads or runs any code of the bundle.
//!
//! The Turtle comes from whoever could write the bundle's directory (under `LV2_PATH`, possibly the user), and is
//! read in the host's process: the parser is safe Rust, input is bounded per file, and nothing read is trusted
//! beyond being data (a path it names is only compared and reported).

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use oxrdf::{NamedOrBlankNode, Term};
use oxttl::TurtleParser;

/// The largest Turtle file read (64 MiB). lsp-plugins' largest is under half a megabyte; a file beyond this is no
/// plugin description, and the host's memory is not the place to find out what it is.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

const RDF_TYPE: &str = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type";
const RDFS_SEE_ALSO: &str = "http://www.w3.org/2000/01/rdf-schema#seeAlso";
const DOAP_NAME: &str = "http://usefulinc.com/ns/doap#name";
const XSD: &str = "http://www.w3.org/2001/XMLSchema#";

const LV2_PLUGIN: &str = "http://lv2plug.in/ns/lv2core#Plugin";
const LV2_BINARY: &str = "http://lv2plug.in/ns/lv2core#binary";
const LV2_PORT: &str = "http://lv2plug.in/ns/lv2core#port";
const LV2_INDEX: &str = "http://lv2plug.in/ns/lv2core#index";
const LV2_SYMBOL: &str = "http://lv2plug.in/ns/lv2core#symbol";
const LV2_NAME: &str = "http://lv2plug.in/ns/lv2core#name";
const LV2_PORT_BASE: &str = "http://lv2plug.in/ns/lv2core#Port";
const LV2_INPUT_PORT: &str = "http://lv2plug.in/ns/lv2core#InputPort";
const LV2_OUTPUT_PORT: &str = "http://lv2plug.in/ns/lv2core#OutputPort";
const LV2_AUDIO_PORT: &str = "http://lv2plug.in/ns/lv2core#AudioPort";
const LV2_CONTROL_PORT: &str = "http://lv2plug.in/ns/lv2core#ControlPort";
const LV2_CV_PORT: &str = "http://lv2plug.in/ns/lv2core#CVPort";
const LV2_PORT_PROPERTY: &str = "http://lv2plug.in/ns/lv2core#portProperty";
const LV2_CONNECTION_OPTIONAL: &str = "http://lv2plug.in/ns/lv2core#connectionOptional";
const LV2_DEFAULT: &str = "http://lv2plug.in/ns/lv2core#default";
const LV2_MINIMUM: &str = "http://lv2plug.in/ns/lv2core#minimum";
const LV2_MAXIMUM: &str = "http://lv2plug.in/ns/lv2core#maximum";
const LV2_REQUIRED_FEATURE: &str = "http://lv2plug.in/ns/lv2core#requiredFeature";
const LV2_OPTIONAL_FEATURE: &str = "http://lv2plug.in/ns/lv2core#optionalFeature";
const LV2_EXTENSION_DATA: &str = "http://lv2plug.in/ns/lv2core#extensionData";
const ATOM_ATOM_PORT: &str = "http://lv2plug.in/ns/ext/atom#AtomPort";
const ATOM_BUFFER_TYPE: &str = "http://lv2plug.in/ns/ext/atom#bufferType";
const ATOM_SEQUENCE: &str = "http://lv2plug.in/ns/ext/atom#Sequence";
const ATOM_SUPPORTS: &str = "http://lv2plug.in/ns/ext/atom#supports";
const RSZ_MINIMUM_SIZE: &str = "http://lv2plug.in/ns/ext/resize-port#minimumSize";
const UI_BINARY: &str = "http://lv2plug.in/ns/extensions/ui#binary";

/// One plugin of a bundle, as its Turtle describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginInfo {
    pub uri: String,
    /// The bundle directory, absolute (as it was reached: symbolic links are not resolved).
    pub bundle: PathBuf,
    /// `lv2:binary`, absolute, resolved against the file that declared it.
    pub binary: PathBuf,
    /// `doap:name` (the one without a language tag where there are several).
    pub name: Option<String>,
    /// Every `rdf:type` (`lv2:Plugin`, and classes such as `lv2:DelayPlugin`).
    pub types: Vec<String>,
    /// Ordered by index; the indices are exactly `0..ports.len()`.
    pub ports: Vec<PortInfo>,
    pub required_features: Vec<String>,
    pub optional_features: Vec<String>,
    pub extension_data: Vec<String>,
}

/// Which way a port's data flows, seen from the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `lv2:InputPort`.
    Input,
    /// `lv2:OutputPort`.
    Output,
}

/// What a port carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PortKind {
    /// `lv2:AudioPort`: a block of `f32` samples.
    Audio,
    /// `lv2:ControlPort`: one `f32`.
    Control,
    /// `lv2:CVPort`: a block of `f32` control values.
    Cv,
    /// `atom:AtomPort`; `sequence` when its `atom:bufferType` is `atom:Sequence` (MIDI, patch messages).
    Atom { sequence: bool },
    /// Anything else (the old `ev:EventPort`, a port class of some extension): the port's first `rdf:type` that is
    /// neither a direction nor `lv2:Port`, empty when it declares none.
    Other(String),
}

/// One port of a plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct PortInfo {
    pub index: u32,
    pub symbol: String,
    /// `lv2:name` (the one without a language tag where there are several).
    pub name: Option<String>,
    pub direction: Direction,
    pub kind: PortKind,
    /// `lv2:portProperty lv2:connectionOptional`: the host may connect it to NULL.
    pub connection_optional: bool,
    /// `rsz:minimumSize`: the buffer size, in bytes, the port needs at least.
    pub minimum_size: Option<u32>,
    /// `atom:supports`: the atom types the port takes or gives.
    pub supports: Vec<String>,
    pub default: Option<f32>,
    pub minimum: Option<f32>,
    pub maximum: Option<f32>,
}

/// A plugin UI the bundle declares (a subject with a `ui:binary`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiInfo {
    pub uri: String,
    /// `ui:binary`, absolute.
    pub binary: PathBuf,
}

/// Everything read from one bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    /// The bundle directory, absolute.
    pub dir: PathBuf,
    /// In the order the manifest names them.
    pub plugins: Vec<PluginInfo>,
    pub uis: Vec<UiInfo>,
}

/// Why a bundle could not be read. Each names the file it is about.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BundleError {
    /// The directory has no `manifest.ttl`: it is no LV2 bundle.
    #[error("{}: not an LV2 bundle: it has no manifest.ttl", .dir.display())]
    MissingManifest { dir: PathBuf },
    /// A file or directory could not be read.
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: Arc<io::Error>,
    },
    /// A file is larger than any plugin description ([`MAX_FILE_BYTES`]).
    #[error("{}: {size} bytes is beyond belief for a plugin description (at most {limit} are read)", .file.display())]
    FileTooLarge { file: PathBuf, size: u64, limit: u64 },
    /// The Turtle does not parse. `line` and `column` count from 1.
    #[error("{}:{line}:{column}: Turtle syntax error: {message}", .file.display())]
    Syntax { file: PathBuf, line: u64, column: u64, message: String },
    /// `rdfs:seeAlso` names a file outside the bundle (possibly through a symbolic link).
    #[error("{}: rdfs:seeAlso names {target}, which is outside the bundle {}", .file.display(), .bundle.display())]
    OutsideBundle { file: PathBuf, target: String, bundle: PathBuf },
    /// A path has no `file:` IRI (it is not absolute or not valid as an IRI).
    #[error("{}: no file IRI can name this path", .path.display())]
    Unnameable { path: PathBuf },
    /// A plugin declares no `lv2:binary`, or one that is no local file.
    #[error("{}: plugin {plugin} has no lv2:binary that is a local file{}", .file.display(), .found.as_ref().map(|f| format!(" (it names {f})")).unwrap_or_default())]
    NoBinary { file: PathBuf, plugin: String, found: Option<String> },
    /// A port of a plugin has no `lv2:index`, a second one, or one that is no integer in `u32`.
    #[error("{}: plugin {plugin}: port {port} has {problem}", .file.display())]
    BadPortIndex { file: PathBuf, plugin: String, port: String, problem: String },
    /// Two ports of a plugin have the same index.
    #[error("{}: plugin {plugin}: two ports have index {index}", .file.display())]
    DuplicatePortIndex { file: PathBuf, plugin: String, index: u32 },
    /// A plugin's port indices skip a number: they must be exactly `0..n`.
    #[error("{}: plugin {plugin}: its {count} ports have no port {index} (indices must be exactly 0..{count})", .file.display())]
    PortIndexHole { file: PathBuf, plugin: String, index: u32, count: usize },
    /// A port lacks something every port must have (a symbol, exactly one direction).
    #[error("{}: plugin {plugin}: port {index} {problem}", .file.display())]
    BadPort { file: PathBuf, plugin: String, index: u32, problem: String },
}

fn io_error(path: &Path, source: io::Error) -> BundleError {
    BundleError::Io { path: path.to_path_buf(), source: Arc::new(source) }
}

/// Reads the bundle in `dir`: its `manifest.ttl` and every file the manifest names with `rdfs:seeAlso`.
pub fn read_bundle(dir: &Path) -> Result<Bundle, BundleError> {
    let dir = std::path::absolute(dir).map_err(|e| io_error(dir, e))?;
    let manifest = dir.join("manifest.ttl");
    if !manifest.is_file() {
        return Err(BundleError::MissingManifest { dir });
    }
    let canonical_dir = fs::canonicalize(&dir).map_err(|e| io_error(&dir, e))?;

    let mut graph = Graph::default();
    graph.read_file(&manifest)?;
    // Each file once, however it is named (a second read would double its blank-node ports).
    let mut read = HashSet::from([fs::canonicalize(&manifest).map_err(|e| io_error(&manifest, e))?]);
    for (target, named_in) in graph.see_also_of_manifest() {
        let Some(path) = file_path_of_iri(&target) else {
            continue;
        };
        let canonical = fs::canonicalize(&path).map_err(|e| io_error(&path, e))?;
        if !canonical.starts_with(&canonical_dir) {
            return Err(BundleError::OutsideBundle { file: graph.files[named_in].clone(), target, bundle: dir });
        }
        if read.insert(canonical) {
            graph.read_file(&path)?;
        }
    }

    let plugins =
        graph.plugins_of_manifest().iter().map(|uri| graph.plugin(uri, &dir)).collect::<Result<Vec<_>, _>>()?;
    let uis = graph.uis();
    Ok(Bundle { dir, plugins, uis })
}

/// A bundle read once in this process, with its binaries' canonical paths.
struct CachedBundle {
    bundle: Bundle,
    /// `bundle.plugins[i].binary`, canonicalised (as it is, where it cannot be).
    plugin_binaries: Vec<PathBuf>,
    /// `bundle.uis[i].binary`, canonicalised.
    ui_binaries: Vec<PathBuf>,
}

type BundleCache = Mutex<HashMap<PathBuf, Result<Arc<CachedBundle>, BundleError>>>;

/// Bundles read in this process, by canonical directory: a host opens a binary once per plugin, and lsp-plugins'
/// bundle alone has 150. A bundle that failed to read stays failed for the process, as lilv's world would.
fn cache() -> &'static BundleCache {
    static CACHE: OnceLock<BundleCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn canonical_or_absolute(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap_or_else(|_| std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()))
}

/// The bundle `binary` lies in (its directory), read once per process.
fn cached_bundle_of(binary: &Path) -> Result<Arc<CachedBundle>, BundleError> {
    let absolute = std::path::absolute(binary).map_err(|e| io_error(binary, e))?;
    let dir = absolute.parent().unwrap_or(Path::new("/")).to_path_buf();
    let key = canonical_or_absolute(&dir);
    // A panic elsewhere while the lock was held leaves a map that is still whole (entries are inserted complete).
    let mut cache = cache().lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    // The lock is held while reading: two threads opening binaries of one bundle read it once.
    let entry = cache.entry(key).or_insert_with(|| {
        read_bundle(&dir).map(|bundle| {
            let plugin_binaries = bundle.plugins.iter().map(|p| canonical_or_absolute(&p.binary)).collect();
            let ui_binaries = bundle.uis.iter().map(|u| canonical_or_absolute(&u.binary)).collect();
            Arc::new(CachedBundle { bundle, plugin_binaries, ui_binaries })
        })
    });
    entry.clone()
}

/// The plugins whose `lv2:binary` is `binary` (compared canonicalised), from the bundle that is `binary`'s
/// directory. Bundles are read once per process.
pub fn plugins_of_binary(binary: &Path) -> Result<Vec<PluginInfo>, BundleError> {
    let cached = cached_bundle_of(binary)?;
    let wanted = canonical_or_absolute(binary);
    Ok(cached
        .bundle
        .plugins
        .iter()
        .zip(&cached.plugin_binaries)
        .filter(|(_, declared)| **declared == wanted)
        .map(|(plugin, _)| plugin.clone())
        .collect())
}

/// Whether `binary` is declared as some UI's `ui:binary` in its bundle (its directory). A file whose directory is no
/// readable bundle is no UI binary.
pub fn ui_binary(binary: &Path) -> bool {
    let Ok(cached) = cached_bundle_of(binary) else {
        return false;
    };
    let wanted = canonical_or_absolute(binary);
    cached.ui_binaries.contains(&wanted)
}

/// Where LV2 bundles are looked for: `LV2_PATH` if set (colon-separated, `~` standing for the home directory), else
/// the path Debian's lilv uses on Linux.
pub fn search_path() -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    match std::env::var_os("LV2_PATH") {
        Some(value) => value
            .as_bytes()
            .split(|&b| b == b':')
            .filter(|entry| !entry.is_empty())
            .filter_map(|entry| expand_home(entry, home.as_deref()))
            .collect(),
        None => {
            let mut path = Vec::new();
            if let Some(home) = &home {
                path.push(home.join(".lv2"));
            }
            path.push(PathBuf::from(format!("/usr/lib/{MULTIARCH}/lv2")));
            path.push(PathBuf::from("/usr/lib/lv2"));
            path.push(PathBuf::from("/usr/local/lib/lv2"));
            path
        }
    }
}

/// Debian's multiarch triplet of this build's target, for its library directory.
const MULTIARCH: &str = if cfg!(target_arch = "x86_64") {
    "x86_64-linux-gnu"
} else if cfg!(target_arch = "aarch64") {
    "aarch64-linux-gnu"
} else if cfg!(target_arch = "x86") {
    "i386-linux-gnu"
} else if cfg!(target_arch = "arm") {
    "arm-linux-gnueabihf"
} else if cfg!(target_arch = "riscv64") {
    "riscv64-linux-gnu"
} else {
    "unknown-linux-gnu"
};

/// `entry` with a leading `~` replaced by the home directory; `None` for `~` without a home.
fn expand_home(entry: &[u8], home: Option<&Path>) -> Option<PathBuf> {
    if entry == b"~" {
        return home.map(Path::to_path_buf);
    }
    match entry.strip_prefix(b"~/") {
        Some(rest) => home.map(|h| h.join(OsString::from_vec(rest.to_vec()))),
        None => Some(PathBuf::from(OsString::from_vec(entry.to_vec()))),
    }
}

/// Every bundle (a `*.lv2` directory) directly inside each directory of `path`, in the path's order and by name
/// within a directory. A directory of the path that does not exist is skipped; one that cannot be listed is an error.
pub fn all_bundles(path: &[PathBuf]) -> Vec<Result<Bundle, BundleError>> {
    let mut bundles = Vec::new();
    for dir in path {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                bundles.push(Err(io_error(dir, e)));
                continue;
            }
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|p| p.extension().is_some_and(|ext| ext == "lv2") && p.is_dir())
            .collect();
        found.sort();
        bundles.extend(found.iter().map(|bundle| read_bundle(bundle)));
    }
    bundles
}

/// A subject or an object that is no literal. Blank nodes are scoped to the file they were written in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Node {
    Iri(String),
    Blank { file: usize, id: String },
}

/// An object of a triple.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Value {
    Node(Node),
    Literal { value: String, datatype: String, language: Option<String> },
}

/// An object with the index of the file that stated it.
#[derive(Debug)]
struct Stated {
    value: Value,
    file: usize,
}

/// Every triple of a bundle's files: subject → predicate → objects.
#[derive(Default)]
struct Graph {
    /// The files read, the manifest first.
    files: Vec<PathBuf>,
    subjects: HashMap<Node, HashMap<String, Vec<Stated>>>,
    /// Subjects in the order they were first stated.
    order: Vec<Node>,
}

impl Graph {
    fn read_file(&mut self, path: &Path) -> Result<(), BundleError> {
        let file_index = self.files.len();
        self.files.push(path.to_path_buf());
        let bytes = read_bounded(path)?;
        let base = file_iri(path).ok_or_else(|| BundleError::Unnameable { path: path.to_path_buf() })?;
        let parser = TurtleParser::new()
            .with_base_iri(base)
            .map_err(|_| BundleError::Unnameable { path: path.to_path_buf() })?;
        for triple in parser.for_slice(&bytes) {
            let triple = triple.map_err(|e| {
                let at = e.location().start;
                BundleError::Syntax {
                    file: path.to_path_buf(),
                    line: at.line + 1,
                    column: at.column + 1,
                    message: e.message().to_string(),
                }
            })?;
            let subject = match triple.subject {
                NamedOrBlankNode::NamedNode(n) => Node::Iri(n.into_string()),
                NamedOrBlankNode::BlankNode(b) => Node::Blank { file: file_index, id: b.into_string() },
            };
            #[allow(unreachable_patterns)] // RDF 1.2's triple terms, where a crate of the build turns them on
            let value = match triple.object {
                Term::NamedNode(n) => Value::Node(Node::Iri(n.into_string())),
                Term::BlankNode(b) => Value::Node(Node::Blank { file: file_index, id: b.into_string() }),
                // Accessors rather than `destruct`, whose shape changes with RDF 1.2.
                Term::Literal(l) => Value::Literal {
                    value: l.value().to_string(),
                    datatype: l.datatype().as_str().to_string(),
                    language: l.language().map(str::to_string),
                },
                _ => continue,
            };
            let predicates = match self.subjects.get_mut(&subject) {
                Some(predicates) => predicates,
                None => {
                    self.order.push(subject.clone());
                    self.subjects.entry(subject).or_default()
                }
            };
            predicates.entry(triple.predicate.into_string()).or_default().push(Stated { value, file: file_index });
        }
        Ok(())
    }

    /// Every object of `predicate` about `subject`, as stated (duplicates included).
    fn objects(&self, subject: &Node, predicate: &str) -> &[Stated] {
        self.subjects.get(subject).and_then(|p| p.get(predicate)).map(Vec::as_slice).unwrap_or_default()
    }

    /// The distinct IRIs among the objects of `predicate` about `subject`, in the order first stated; literals count
    /// by their text (some bundles write features as strings).
    fn iris(&self, subject: &Node, predicate: &str) -> Vec<String> {
        let mut seen = HashSet::new();
        self.objects(subject, predicate)
            .iter()
            .filter_map(|s| match &s.value {
                Value::Node(Node::Iri(iri)) => Some(iri.clone()),
                Value::Literal { value, .. } => Some(value.clone()),
                Value::Node(Node::Blank { .. }) => None,
            })
            .filter(|iri| seen.insert(iri.clone()))
            .collect()
    }

    /// The `rdfs:seeAlso` IRIs the manifest states, each with the file that named it (the manifest).
    fn see_also_of_manifest(&self) -> Vec<(String, usize)> {
        let mut seen = HashSet::new();
        let mut found = Vec::new();
        for subject in &self.order {
            for stated in self.objects(subject, RDFS_SEE_ALSO) {
                if let (0, Value::Node(Node::Iri(iri))) = (stated.file, &stated.value) {
                    if seen.insert(iri.clone()) {
                        found.push((iri.clone(), stated.file));
                    }
                }
            }
        }
        found
    }

    /// The subjects the manifest types `lv2:Plugin`, in its order.
    fn plugins_of_manifest(&self) -> Vec<String> {
        self.order
            .iter()
            .filter_map(|subject| match subject {
                Node::Iri(uri) => Some(uri),
                Node::Blank { .. } => None,
            })
            .filter(|uri| {
                let node = Node::Iri((*uri).clone());
                self.objects(&node, RDF_TYPE)
                    .iter()
                    .any(|s| s.file == 0 && matches!(&s.value, Value::Node(Node::Iri(t)) if t == LV2_PLUGIN))
            })
            .cloned()
            .collect()
    }

    /// The text of a literal object of `predicate`: the one without a language tag, else an English one, else the
    /// first.
    fn text(&self, subject: &Node, predicate: &str) -> Option<String> {
        let literals: Vec<(&String, &Option<String>)> = self
            .objects(subject, predicate)
            .iter()
            .filter_map(|s| match &s.value {
                Value::Literal { value, language, .. } => Some((value, language)),
                Value::Node(_) => None,
            })
            .collect();
        literals
            .iter()
            .find(|(_, language)| language.is_none())
            .or_else(|| literals.iter().find(|(_, l)| l.as_deref().is_some_and(|l| l.starts_with("en"))))
            .or_else(|| literals.first())
            .map(|(value, _)| (*value).clone())
    }

    /// A number stated with a numeric XSD type (decimal, double, float, integer and its kinds).
    fn number(&self, subject: &Node, predicate: &str) -> Option<f64> {
        self.objects(subject, predicate).iter().find_map(|s| match &s.value {
            Value::Literal { value, datatype, .. } if numeric_type(datatype) => value.trim().parse::<f64>().ok(),
            _ => None,
        })
    }

    fn plugin(&self, uri: &str, bundle: &Path) -> Result<PluginInfo, BundleError> {
        let node = Node::Iri(uri.to_string());
        let manifest = &self.files[0];
        let binary_stated = self.objects(&node, LV2_BINARY).first();
        let binary = binary_stated.and_then(|s| match &s.value {
            Value::Node(Node::Iri(iri)) => file_path_of_iri(iri),
            _ => None,
        });
        let Some(binary) = binary else {
            return Err(BundleError::NoBinary {
                file: binary_stated.map_or(manifest, |s| &self.files[s.file]).clone(),
                plugin: uri.to_string(),
                found: binary_stated.map(|s| describe(&s.value)),
            });
        };

        let mut seen_ports = HashSet::new();
        let mut ports = Vec::new();
        for stated in self.objects(&node, LV2_PORT) {
            let Value::Node(port) = &stated.value else {
                continue;
            };
            if seen_ports.insert(port) {
                ports.push(self.port(uri, port, &self.files[stated.file])?);
            }
        }
        ports.sort_by_key(|(port, _)| port.index);
        for (position, (port, file)) in ports.iter().enumerate() {
            // `position` < ports.len(), which came from a slice of triples: it fits u32 wherever indices do.
            let expected = u32::try_from(position).unwrap_or(u32::MAX);
            if port.index != expected {
                return Err(if position > 0 && ports[position - 1].0.index == port.index {
                    BundleError::DuplicatePortIndex { file: file.clone(), plugin: uri.to_string(), index: port.index }
                } else {
                    BundleError::PortIndexHole {
                        file: file.clone(),
                        plugin: uri.to_string(),
                        index: expected,
                        count: ports.len(),
                    }
                });
            }
        }

        Ok(PluginInfo {
            uri: uri.to_string(),
            bundle: bundle.to_path_buf(),
            binary,
            name: self.text(&node, DOAP_NAME),
            types: self.iris(&node, RDF_TYPE),
            ports: ports.into_iter().map(|(port, _)| port).collect(),
            required_features: self.iris(&node, LV2_REQUIRED_FEATURE),
            optional_features: self.iris(&node, LV2_OPTIONAL_FEATURE),
            extension_data: self.iris(&node, LV2_EXTENSION_DATA),
        })
    }

    /// One port, with the file that named it as the plugin's (for errors).
    fn port(&self, plugin: &str, port: &Node, file: &Path) -> Result<(PortInfo, PathBuf), BundleError> {
        let symbol = self.text(port, LV2_SYMBOL);
        let what = || match (&symbol, port) {
            (Some(symbol), _) => format!("\"{symbol}\""),
            (None, Node::Iri(iri)) => iri.clone(),
            (None, Node::Blank { .. }) => "(a blank node without lv2:symbol)".to_string(),
        };
        let bad_index = |problem: String| BundleError::BadPortIndex {
            file: file.to_path_buf(),
            plugin: plugin.to_string(),
            port: what(),
            problem,
        };
        let indices: HashSet<&Value> = self.objects(port, LV2_INDEX).iter().map(|s| &s.value).collect();
        let index = match indices.into_iter().collect::<Vec<_>>().as_slice() {
            [] => return Err(bad_index("no lv2:index".to_string())),
            [Value::Literal { value, datatype, .. }] if integer_type(datatype) => value
                .trim()
                .trim_start_matches('+')
                .parse::<u32>()
                .map_err(|_| bad_index(format!("lv2:index {value}, which is no port index (0 to {})", u32::MAX)))?,
            [other] => return Err(bad_index(format!("lv2:index {}, which is no integer", describe(other)))),
            _ => return Err(bad_index("more than one lv2:index".to_string())),
        };
        let bad_port = |problem: &str| BundleError::BadPort {
            file: file.to_path_buf(),
            plugin: plugin.to_string(),
            index,
            problem: problem.to_string(),
        };
        let symbol = symbol.ok_or_else(|| bad_port("has no lv2:symbol"))?;

        let types = self.iris(port, RDF_TYPE);
        let is = |class: &str| types.iter().any(|t| t == class);
        let direction = match (is(LV2_INPUT_PORT), is(LV2_OUTPUT_PORT)) {
            (true, false) => Direction::Input,
            (false, true) => Direction::Output,
            (true, true) => return Err(bad_port("is both an lv2:InputPort and an lv2:OutputPort")),
            (false, false) => return Err(bad_port("is neither an lv2:InputPort nor an lv2:OutputPort")),
        };
        let kind = if is(LV2_AUDIO_PORT) {
            PortKind::Audio
        } else if is(LV2_CONTROL_PORT) {
            PortKind::Control
        } else if is(LV2_CV_PORT) {
            PortKind::Cv
        } else if is(ATOM_ATOM_PORT) {
            PortKind::Atom { sequence: self.iris(port, ATOM_BUFFER_TYPE).iter().any(|t| t == ATOM_SEQUENCE) }
        } else {
            PortKind::Other(
                types
                    .iter()
                    .find(|t| ![LV2_INPUT_PORT, LV2_OUTPUT_PORT, LV2_PORT_BASE].contains(&t.as_str()))
                    .cloned()
                    .unwrap_or_default(),
            )
        };
        let minimum_size = self
            .objects(port, RSZ_MINIMUM_SIZE)
            .iter()
            .find_map(|s| match &s.value {
                Value::Literal { value, datatype, .. } if integer_type(datatype) => Some(value),
                _ => None,
            })
            .map(|value| {
                value.trim().trim_start_matches('+').parse::<u32>().map_err(|_| {
                    bad_port(&format!("has rsz:minimumSize {value}, which is no size (0 to {})", u32::MAX))
                })
            })
            .transpose()?;

        let info = PortInfo {
            index,
            symbol,
            name: self.text(port, LV2_NAME),
            direction,
            kind,
            connection_optional: self.iris(port, LV2_PORT_PROPERTY).iter().any(|p| p == LV2_CONNECTION_OPTIONAL),
            minimum_size,
            supports: self.iris(port, ATOM_SUPPORTS),
            // Control values are f32 in the LV2 ABI; the literal is read as f64 and rounded once.
            default: self.number(port, LV2_DEFAULT).map(|v| v as f32),
            minimum: self.number(port, LV2_MINIMUM).map(|v| v as f32),
            maximum: self.number(port, LV2_MAXIMUM).map(|v| v as f32),
        };
        let index_file = self.objects(port, LV2_INDEX).first().map_or(file, |s| &self.files[s.file]);
        Ok((info, index_file.to_path_buf()))
    }

    /// Every subject with a `ui:binary` that is a local file, in the order first stated.
    fn uis(&self) -> Vec<UiInfo> {
        self.order
            .iter()
            .filter_map(|subject| {
                let Node::Iri(uri) = subject else {
                    return None;
                };
                let binary = self.objects(subject, UI_BINARY).iter().find_map(|s| match &s.value {
                    Value::Node(Node::Iri(iri)) => file_path_of_iri(iri),
                    _ => None,
                })?;
                Some(UiInfo { uri: uri.clone(), binary })
            })
            .collect()
    }
}

/// A value as an error message shows it.
fn describe(value: &Value) -> String {
    match value {
        Value::Node(Node::Iri(iri)) => format!("<{iri}>"),
        Value::Node(Node::Blank { .. }) => "a blank node".to_string(),
        Value::Literal { value, .. } => format!("\"{value}\""),
    }
}

fn integer_type(datatype: &str) -> bool {
    datatype.strip_prefix(XSD).is_some_and(|t| {
        matches!(
            t,
            "integer"
                | "int"
                | "long"
                | "short"
                | "byte"
                | "nonNegativeInteger"
                | "positiveInteger"
                | "unsignedInt"
                | "unsignedLong"
                | "unsignedShort"
                | "unsignedByte"
        )
    })
}

fn numeric_type(datatype: &str) -> bool {
    integer_type(datatype)
        || datatype.strip_prefix(XSD).is_some_and(|t| matches!(t, "decimal" | "double" | "float"))
        || datatype.strip_prefix(XSD).is_some_and(|t| matches!(t, "negativeInteger" | "nonPositiveInteger"))
}

/// Reads a whole file of at most [`MAX_FILE_BYTES`].
fn read_bounded(path: &Path) -> Result<Vec<u8>, BundleError> {
    let file = fs::File::open(path).map_err(|e| io_error(path, e))?;
    let metadata = file.metadata().map_err(|e| io_error(path, e))?;
    if !metadata.is_file() {
        return Err(io_error(path, io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")));
    }
    let too_large = |size| BundleError::FileTooLarge { file: path.to_path_buf(), size, limit: MAX_FILE_BYTES };
    if metadata.len() > MAX_FILE_BYTES {
        return Err(too_large(metadata.len()));
    }
    let mut bytes = Vec::new();
    // One byte more than allowed, so that a file that grew since `metadata` is still caught.
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| io_error(path, e))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Whether a byte may stand as itself in a file IRI's path (RFC 3986's unreserved characters, `/`, and the
/// sub-delimiters and `:`/`@` a path segment allows).
fn iri_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@".contains(&b)
}

/// The `file://` IRI of an absolute path, every other byte percent-encoded.
fn file_iri(path: &Path) -> Option<String> {
    if !path.is_absolute() {
        return None;
    }
    let mut iri = String::from("file://");
    for &b in path.as_os_str().as_bytes() {
        if iri_path_byte(b) {
            iri.push(char::from(b));
        } else {
            iri.push_str(&format!("%{b:02X}"));
        }
    }
    Some(iri)
}

/// The local path a `file:` IRI names (`file:///p` or `file://localhost/p`, percent-decoded, without a query or
/// fragment); `None` for any other IRI.
fn file_path_of_iri(iri: &str) -> Option<PathBuf> {
    let rest = iri.strip_prefix("file://")?;
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return None;
    }
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let mut bytes = Vec::with_capacity(rest.len());
    let raw = rest.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hex = raw.get(i + 1..i + 3)?;
            let text = std::str::from_utf8(hex).ok()?;
            bytes.push(u8::from_str_radix(text, 16).ok()?);
            i += 3;
        } else {
            bytes.push(raw[i]);
            i += 1;
        }
    }
    if bytes.contains(&0) {
        return None;
    }
    Some(PathBuf::from(OsString::from_vec(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_and_its_file_iri_round_trip() {
        for path in ["/usr/lib/lv2/amp.lv2/amp.so", "/tmp/a b/ü%#?.ttl", "/x/[y]"] {
            let iri = file_iri(Path::new(path)).expect("an absolute path has an IRI");
            assert!(!iri["file://".len()..].contains([' ', '#', '?', '[']), "{iri}");
            assert_eq!(file_path_of_iri(&iri).as_deref(), Some(Path::new(path)), "{iri}");
        }
        assert_eq!(file_iri(Path::new("relative/x")), None);
    }

    #[test]
    fn only_local_file_iris_name_paths() {
        assert_eq!(file_path_of_iri("file://localhost/a/b.so").as_deref(), Some(Path::new("/a/b.so")));
        assert_eq!(file_path_of_iri("file:///a/b.ttl#frag").as_deref(), Some(Path::new("/a/b.ttl")));
        assert_eq!(file_path_of_iri("http://example.org/a.ttl"), None);
        assert_eq!(file_path_of_iri("file://otherhost/a.ttl"), None);
        assert_eq!(file_path_of_iri("file:///a/%00b"), None);
        assert_eq!(file_path_of_iri("file:///a/%zz"), None);
    }

    #[test]
    fn lv2_path_entries_expand_the_home_directory() {
        let home = Path::new("/home/u");
        assert_eq!(expand_home(b"~/.lv2", Some(home)), Some(PathBuf::from("/home/u/.lv2")));
        assert_eq!(expand_home(b"~", Some(home)), Some(PathBuf::from("/home/u")));
        assert_eq!(expand_home(b"~/.lv2", None), None);
        assert_eq!(expand_home(b"/usr/lib/lv2", None), Some(PathBuf::from("/usr/lib/lv2")));
    }

    #[test]
    fn numbers_are_read_from_numeric_literals_only() {
        assert!(numeric_type("http://www.w3.org/2001/XMLSchema#decimal"));
        assert!(numeric_type("http://www.w3.org/2001/XMLSchema#integer"));
        assert!(!numeric_type("http://www.w3.org/2001/XMLSchema#string"));
        assert!(!integer_type("http://www.w3.org/2001/XMLSchema#decimal"));
    }
}
