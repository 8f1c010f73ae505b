//! The policy file: reading it (a regular file of bounded size), its sections and their keys, and the one message
//! a malformed policy gets (file, line, column, the key and what it accepts, or what to do).
//!
//! Every section is read by [`SectionVisitor`] from the list of its keys ([`FileSection`], generated from
//! `keys.rs`): a key the section does not take is refused at the key, with the keys it does take and the closest
//! of them; a value is checked where it is read ([`super::values`]), so toml attaches its position.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::values::{check_identifier, check_name, Keyed, ValueSeed};
use super::{ExtensionOverride, Policy};

/// Largest policy file read: a policy is a few hundred bytes; a larger file is not one.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The path names a device, a FIFO, a directory...: nothing is read from it.
    #[error("policy file {path} is not a regular file")]
    NotAFile { path: PathBuf },
    /// The file is larger than any policy.
    #[error("policy file {path} has {len} bytes; a policy has at most {MAX_POLICY_BYTES}")]
    TooLarge { path: PathBuf, len: u64 },
    /// The file could not be read.
    #[error("cannot read policy file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The text is not a valid policy. `line` and `column` start at 1
    /// (0 when unknown); `reason` names the key and what is accepted.
    #[error("{origin}:{line}:{column}: {reason}")]
    Invalid { origin: String, line: usize, column: usize, reason: String },
}

/// Why one key (or one section) of a policy file is refused: the `reason` of [`PolicyError::Invalid`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    #[error("{key} must be {expected}, got {got}")]
    Value { key: &'static str, expected: String, got: String },
    #[error("{what} must be non-empty and made of letters, digits, '_', '.' and '-', got {name:?}")]
    Name { what: &'static str, name: String },
    #[error("{what} must be a C function name (letters, digits and '_', not starting with a digit), got {name:?}")]
    FunctionName { what: &'static str, name: String },
    /// `hint` is empty or starts with "; ".
    #[error("unknown field `{key}`, expected {expected}{hint}")]
    Unknown { key: String, expected: String, hint: String },
    #[error("{key} is set per extension: put it in [extension.NAME], not [defaults]")]
    NotInDefaults { key: &'static str },
    #[error("this sandbox section loosens the sandbox: say why in `reason = \"...\"`")]
    LoosenedWithoutReason,
    #[error("writable path `{}` is not absolute", path.display())]
    RelativeWritable { path: PathBuf },
}

// --- Sections and their keys ------------------------------------------------

/// Which sections may set a key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every section: a domain-level key (a group's domain has its own).
    Domain,
    /// `[defaults]` and `[extension.NAME]`: a group's domain takes it from `[defaults]`.
    Extension,
    /// `[extension.NAME]` only (`restart_from`: one file cannot be every extension's).
    Own,
}

/// Where a section is, which decides the keys it takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    /// The document.
    Top,
    /// `[defaults]`.
    Defaults,
    /// `[extension.NAME]`.
    Extension,
    /// `[group.NAME]`.
    Group,
    /// A table within one of these (`limits`, `sandbox`, `function.NAME`).
    Nested,
}

/// One key of a section's file form.
pub(crate) struct Key {
    pub name: &'static str,
    pub scope: Scope,
}

impl Key {
    fn allowed_in(&self, section: Section) -> bool {
        match (self.scope, section) {
            (Scope::Domain, _) => true,
            (Scope::Extension, Section::Group) => false,
            (Scope::Own, Section::Group | Section::Defaults) => false,
            (Scope::Extension | Scope::Own, _) => true,
        }
    }
}

/// A section of the file form, read key by key.
pub(crate) trait FileSection: Default {
    /// Every key, in the order the documentation lists them.
    const KEYS: &'static [Key];
    /// What the section is, for "expected ..." ("a table of resource limits").
    const EXPECTING: &'static str;

    /// Reads the value of `key` (one of [`Self::KEYS`]) from `map`.
    fn read_value<'de, A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error>;

    /// Checks the section as a whole once every key is read.
    fn finish(self) -> Result<Self, KeyError> {
        Ok(self)
    }
}

/// Reads a section of type `T` found `within` the document.
pub(crate) struct SectionVisitor<T> {
    within: Section,
    section: PhantomData<T>,
}

impl<T> SectionVisitor<T> {
    pub(crate) fn new(within: Section) -> Self {
        SectionVisitor { within, section: PhantomData }
    }
}

impl<'de, T: FileSection> Visitor<'de> for SectionVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.within {
            Section::Group => f.write_str("a table of group settings"),
            _ => f.write_str(T::EXPECTING),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut section = T::default();
        while let Some(key) = map.next_key_seed(KeySeed { keys: T::KEYS, within: self.within })? {
            section.read_value(key, &mut map)?;
        }
        section.finish().map_err(de::Error::custom)
    }
}

/// A table of its own: the value of a key such as `limits`.
pub(crate) struct Table<T>(PhantomData<T>);

/// A [`Table`] of `T`.
pub(crate) fn table<T>() -> Table<T> {
    Table(PhantomData)
}

impl<T: FileSection> ValueSeed for Table<T> {
    type Value = T;

    fn read<'de, D: Deserializer<'de>>(self, _key: &'static str, d: D) -> Result<T, D::Error> {
        d.deserialize_map(SectionVisitor::new(Section::Nested))
    }
}

/// Checks a key where it is read, so that toml gives the key's position.
struct KeySeed {
    keys: &'static [Key],
    within: Section,
}

impl KeySeed {
    fn check(&self, name: &str) -> Result<&'static str, KeyError> {
        let expected: Vec<&str> = self.keys.iter().filter(|k| k.allowed_in(self.within)).map(|k| k.name).collect();
        let unknown = |hint: String| KeyError::Unknown { key: name.to_string(), expected: one_of(&expected), hint };
        match self.keys.iter().find(|k| k.name == name) {
            Some(key) if key.allowed_in(self.within) => Ok(key.name),
            Some(key) if self.within == Section::Defaults => Err(KeyError::NotInDefaults { key: key.name }),
            Some(key) => {
                let home = if key.scope == Scope::Own { "[extension.NAME]" } else { "[extension.NAME] or [defaults]" };
                Err(unknown(format!("; `{name}` is set per extension: put it in {home}")))
            }
            None => Err(unknown(did_you_mean(name, &expected))),
        }
    }
}

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = &'static str;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<&'static str, D::Error> {
        let name = String::deserialize(d)?;
        self.check(&name).map_err(de::Error::custom)
    }
}

/// serde's list of expected fields: "`a`", "`a` or `b`", "one of `a`, `b`, `c`".
fn one_of(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.as_slice() {
        [one] => one.clone(),
        [a, b] => format!("{a} or {b}"),
        _ => format!("one of {}", quoted.join(", ")),
    }
}

/// "; did you mean `x`?" for the closest of `candidates`, if close enough; else nothing.
fn did_you_mean(unknown: &str, candidates: &[&str]) -> String {
    let closest =
        candidates.iter().map(|candidate| (edit_distance(unknown, candidate), candidate)).min_by_key(|(d, _)| *d);
    let limit = (unknown.chars().count() / 3).clamp(1, 3);
    match closest {
        Some((distance, best)) if distance <= limit => format!("; did you mean `{best}`?"),
        _ => String::new(),
    }
}

/// Levenshtein distance between two short strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// Sections by name (`[extension.NAME]`, `[group.NAME]`, `function.NAME`), each name checked at its key.
pub(crate) struct Named<T> {
    within: Section,
    check_name: fn(&str) -> Result<(), KeyError>,
    section: PhantomData<T>,
}

impl<T> Named<T> {
    fn new(within: Section, check_name: fn(&str) -> Result<(), KeyError>) -> Self {
        Named { within, check_name, section: PhantomData }
    }
}

/// `function.NAME` tables: C function names.
pub(crate) fn functions<T>() -> Named<T> {
    Named::new(Section::Nested, |name| check_identifier("function name", name))
}

impl<T: FileSection> ValueSeed for Named<T> {
    type Value = BTreeMap<String, T>;

    fn read<'de, D: Deserializer<'de>>(self, _key: &'static str, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: FileSection> Visitor<'de> for Named<T> {
    type Value = BTreeMap<String, T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut sections = BTreeMap::new();
        while let Some(name) = map.next_key_seed(NameSeed(self.check_name))? {
            let section = map.next_value_seed(SectionSeed::<T>(SectionVisitor::new(self.within)))?;
            sections.insert(name, section);
        }
        Ok(sections)
    }
}

/// A section's name, checked where it is read.
struct NameSeed(fn(&str) -> Result<(), KeyError>);

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        let name = String::deserialize(d)?;
        (self.0)(&name).map_err(de::Error::custom)?;
        Ok(name)
    }
}

/// A section as the value of a map entry.
struct SectionSeed<T>(SectionVisitor<T>);

impl<'de, T: FileSection> DeserializeSeed<'de> for SectionSeed<T> {
    type Value = T;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        d.deserialize_map(self.0)
    }
}

/// The document: `[defaults]`, `[extension.NAME]`, `[group.NAME]`.
impl FileSection for Policy {
    const KEYS: &'static [Key] = &[
        Key { name: "defaults", scope: Scope::Domain },
        Key { name: "extension", scope: Scope::Domain },
        Key { name: "group", scope: Scope::Domain },
    ];
    const EXPECTING: &'static str = "a policy document";

    fn read_value<'de, A: MapAccess<'de>>(&mut self, key: &'static str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "defaults" => self.defaults = map.next_value_seed(SectionSeed(SectionVisitor::new(Section::Defaults)))?,
            "extension" => {
                let seed =
                    Named::<ExtensionOverride>::new(Section::Extension, |name| check_name("extension name", name));
                self.extensions = map.next_value_seed(Keyed { key, seed })?;
            }
            "group" => {
                let seed = Named::<ExtensionOverride>::new(Section::Group, |name| check_name("group name", name));
                self.groups = map.next_value_seed(Keyed { key, seed })?;
            }
            _ => {}
        }
        Ok(())
    }
}

// --- Reading ----------------------------------------------------------------

impl Policy {
    /// Parses and checks a policy. `origin` names the text in messages
    /// (usually the file name).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        toml::Deserializer::new(text)
            .deserialize_map(SectionVisitor::<Policy>::new(Section::Top))
            .map_err(|e| invalid(text, origin, &e))
    }

    /// Reads, parses and checks a policy file. A relative `restart_from` is taken relative to the file's directory.
    /// Only a regular file of at most [`MAX_POLICY_BYTES`] is read: a device, a FIFO or a huge file is refused
    /// before it is read.
    pub fn from_file(path: &Path) -> Result<Policy, PolicyError> {
        let text = read_policy_text(path)?;
        let mut policy = Policy::from_toml_str(&text, &path.display().to_string())?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for section in policy.extensions.values_mut() {
            if let Some(from) = section.restart_from.as_mut().filter(|p| p.is_relative()) {
                *from = dir.join(&*from);
            }
        }
        Ok(policy)
    }
}

/// The text of the policy file at `path`, if it is a regular file of at most [`MAX_POLICY_BYTES`].
fn read_policy_text(path: &Path) -> Result<String, PolicyError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let read_error = |source| PolicyError::Read { path: path.to_path_buf(), source };
    let regular = |meta: &std::fs::Metadata| {
        if !meta.is_file() {
            return Err(PolicyError::NotAFile { path: path.to_path_buf() });
        }
        if meta.len() > MAX_POLICY_BYTES {
            return Err(PolicyError::TooLarge { path: path.to_path_buf(), len: meta.len() });
        }
        Ok(())
    };
    // Looked at before it is opened (opening a FIFO blocks), and again once open, in case it changed between.
    regular(&std::fs::metadata(path).map_err(read_error)?)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(read_error)?;
    regular(&file.metadata().map_err(read_error)?)?;
    let mut bytes = Vec::new();
    // A file that grew meanwhile is read no further than the limit (and refused).
    file.take(MAX_POLICY_BYTES + 1).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > MAX_POLICY_BYTES {
        return Err(PolicyError::TooLarge { path: path.to_path_buf(), len: bytes.len() as u64 });
    }
    String::from_utf8(bytes)
        .map_err(|e| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}"))))
}

/// Turns toml's error into [`PolicyError::Invalid`].
fn invalid(text: &str, origin: &str, error: &toml::de::Error) -> PolicyError {
    let (line, column) = match error.span() {
        Some(span) => line_column(text, span.start),
        None => (0, 0),
    };
    // toml's message may continue on further lines ("invalid table
    // header" / "duplicate key ..."); keep it on one line.
    let mut reason = error.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
    if reason.is_empty() {
        reason.push_str("invalid policy");
    }
    PolicyError::Invalid { origin: origin.to_string(), line, column, reason }
}

/// Line and column (both from 1; the column counts characters) of a byte
/// offset in `text`.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}
