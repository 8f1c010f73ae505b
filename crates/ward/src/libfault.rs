//! Run-time library faults: SWIFI's allocation failure, memory leak and copy overrun, injected at the boundary
//! between an extension and its C library instead of in the extension's code.
//!
//! A small C library (`crates/ward/libfault/ward_libfault.c`, embedded here) is preloaded into the process that
//! runs the extension and interposes on `malloc` and friends, `free`, and the `mem*`/`str*cpy` family. Only the
//! calls made directly by one target shared object are affected: a call is the target's when its return address
//! lies in the target's code (see `docs/DECISIONS.md`). The fault is configured by one environment variable,
//! [`ENV_VAR`], which [`env_value`] writes.
//!
//! Under ward, an extension's policy key `library_fault` (see [`crate::policy`]) starts its domain process with the
//! fault; that needs isolation `process`. A native host (a throwaway process that opens the plugin itself, as the
//! fault-injection campaign compares against) gets the same fault from the variables of [`env_for`].
//!
//! ```
//! use ward::libfault::{LibraryFault, LibraryFaultKind};
//! let fault: LibraryFault = "alloc:nth=3,count=1".parse()?;
//! assert_eq!(fault.kind(), LibraryFaultKind::Alloc);
//! assert_eq!(fault.to_string(), "alloc:nth=3,count=1");
//! # Ok::<(), ward::libfault::LibraryFaultError>(())
//! ```

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use ward_embed::{embedded, EmbeddedSet};

use crate::error::Error;
use crate::policy::{ExtensionPolicy, Isolation};

/// The environment variable the preloaded library reads its fault from.
pub const ENV_VAR: &str = "WARD_LIBFAULT";

static LIBRARY: EmbeddedSet = EmbeddedSet::new(
    "ward-libfault",
    &[embedded!("ward_libfault", "run-time library faults for one target shared object (LD_PRELOAD)")],
);

/// What a library fault does to the target's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LibraryFaultKind {
    /// Allocations (`malloc`, `calloc`, `realloc`, `memalign`, `aligned_alloc`, `posix_memalign`) fail with
    /// `ENOMEM`.
    Alloc,
    /// `free` does nothing: the memory leaks.
    Leak,
    /// Copies (`memcpy`, `memmove`, `memset`, `strcpy`, `strncpy` and their `_chk` forms) write
    /// [`LibraryFault::extra`] bytes too many.
    CopyOverrun,
}

impl LibraryFaultKind {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: &'static [LibraryFaultKind] =
        &[LibraryFaultKind::Alloc, LibraryFaultKind::Leak, LibraryFaultKind::CopyOverrun];

    /// The keyword naming this kind.
    pub fn as_str(&self) -> &'static str {
        match self {
            LibraryFaultKind::Alloc => "alloc",
            LibraryFaultKind::Leak => "leak",
            LibraryFaultKind::CopyOverrun => "copy-overrun",
        }
    }

    /// How many calls a fault of this kind affects unless told: one failed allocation or overrun, but every free
    /// from the first on (a leak of one block is hardly one).
    pub fn default_count(self) -> u64 {
        match self {
            LibraryFaultKind::Leak => 0,
            LibraryFaultKind::Alloc | LibraryFaultKind::CopyOverrun => 1,
        }
    }
}

impl fmt::Display for LibraryFaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LibraryFaultKind {
    type Err = LibraryFaultError;

    fn from_str(s: &str) -> Result<Self, LibraryFaultError> {
        LibraryFaultKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| LibraryFaultError::UnknownKind { got: s.to_string() })
    }
}

/// One run-time library fault: the `nth` eligible call of its kind made by the target, and the `count - 1` after
/// it (`count` 0: every one from the `nth` on), counted per process.
///
/// Written `KIND[:nth=N][,count=C][,extra=E]` ([`FromStr`], [`fmt::Display`]), e.g. `alloc:nth=3,count=1`,
/// `leak:nth=10`, `copy-overrun:nth=1,extra=16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LibraryFault {
    kind: LibraryFaultKind,
    nth: u64,
    count: u64,
    extra: u64,
}

impl LibraryFault {
    /// Largest `nth` and `count`.
    pub const MAX_CALLS: u64 = 1_000_000_000;
    /// Largest `extra`.
    pub const MAX_EXTRA: u64 = 1 << 20;
    /// `extra` unless told.
    pub const DEFAULT_EXTRA: u64 = 64;

    /// A fault of `kind` from the `nth` eligible call on (1 is the first), affecting the kind's
    /// [default count](LibraryFaultKind::default_count) of calls.
    pub fn new(kind: LibraryFaultKind, nth: u64) -> Result<LibraryFault, LibraryFaultError> {
        let nth = in_range("nth", nth, 1, Self::MAX_CALLS, NTH)?;
        Ok(LibraryFault { kind, nth, count: kind.default_count(), extra: Self::DEFAULT_EXTRA })
    }

    /// The same fault affecting `count` calls (0: every one from the `nth` on).
    pub fn with_count(self, count: u64) -> Result<LibraryFault, LibraryFaultError> {
        let count = in_range("count", count, 0, Self::MAX_CALLS, COUNT)?;
        Ok(LibraryFault { count, ..self })
    }

    /// The same copy overrun writing `extra` bytes too many; refused for other kinds.
    pub fn with_extra(self, extra: u64) -> Result<LibraryFault, LibraryFaultError> {
        if self.kind != LibraryFaultKind::CopyOverrun {
            return Err(LibraryFaultError::ExtraNotApplicable { kind: self.kind });
        }
        let extra = in_range("extra", extra, 1, Self::MAX_EXTRA, EXTRA)?;
        Ok(LibraryFault { extra, ..self })
    }

    pub fn kind(&self) -> LibraryFaultKind {
        self.kind
    }

    /// The first eligible call affected, from 1.
    pub fn nth(&self) -> u64 {
        self.nth
    }

    /// How many calls are affected; 0: every one from the `nth` on.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Bytes too many per overrun (copy overruns only).
    pub fn extra(&self) -> Option<u64> {
        (self.kind == LibraryFaultKind::CopyOverrun).then_some(self.extra)
    }

    /// Builds a fault from its settings (`nth`, `count`, `extra`), each given at most once.
    fn from_settings<K: AsRef<str>>(
        kind: LibraryFaultKind,
        settings: impl IntoIterator<Item = (K, Number)>,
    ) -> Result<LibraryFault, LibraryFaultError> {
        let (mut nth, mut count, mut extra) = (None, None, None);
        for (key, value) in settings {
            let (slot, key, min, max, expected) = match key.as_ref() {
                "nth" => (&mut nth, "nth", 1, Self::MAX_CALLS, NTH),
                "count" => (&mut count, "count", 0, Self::MAX_CALLS, COUNT),
                "extra" => (&mut extra, "extra", 1, Self::MAX_EXTRA, EXTRA),
                other => return Err(LibraryFaultError::UnknownKey { key: other.to_string() }),
            };
            if slot.is_some() {
                return Err(LibraryFaultError::Duplicate { key: key.to_string() });
            }
            let n =
                value.whole().ok_or_else(|| LibraryFaultError::OutOfRange { key, expected, got: value.to_string() })?;
            *slot = Some(in_range(key, n, min, max, expected)?);
        }
        let mut fault = LibraryFault::new(kind, nth.unwrap_or(1))?;
        if let Some(count) = count {
            fault = fault.with_count(count)?;
        }
        if let Some(extra) = extra {
            fault = fault.with_extra(extra)?;
        }
        Ok(fault)
    }
}

const NTH: &str = "a whole number from 1 to 1000000000";
const COUNT: &str = "a whole number from 0 (every call from nth on) to 1000000000";
const EXTRA: &str = "a whole number of bytes from 1 to 1048576";

fn in_range(key: &'static str, n: u64, min: u64, max: u64, expected: &'static str) -> Result<u64, LibraryFaultError> {
    if (min..=max).contains(&n) {
        Ok(n)
    } else {
        Err(LibraryFaultError::OutOfRange { key, expected, got: n.to_string() })
    }
}

/// A setting's value as written: a number, or something that should have been one.
enum Number {
    Int(i64),
    /// Text (quoted in messages).
    Text(String),
    /// Any other value, as written.
    Other(String),
}

impl Number {
    fn whole(&self) -> Option<u64> {
        match self {
            Number::Int(i) => u64::try_from(*i).ok(),
            // Digits only: no sign, no spaces, no underscores.
            Number::Text(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
            Number::Text(_) | Number::Other(_) => None,
        }
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::Int(i) => write!(f, "{i}"),
            Number::Text(s) => write!(f, "{s:?}"),
            Number::Other(s) => f.write_str(s),
        }
    }
}

impl fmt::Display for LibraryFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:nth={},count={}", self.kind, self.nth, self.count)?;
        if let Some(extra) = self.extra() {
            write!(f, ",extra={extra}")?;
        }
        Ok(())
    }
}

impl FromStr for LibraryFault {
    type Err = LibraryFaultError;

    /// `KIND[:KEY=VALUE,...]` with keys `nth`, `count` and `extra`.
    fn from_str(s: &str) -> Result<Self, LibraryFaultError> {
        let (kind, rest) = match s.split_once(':') {
            Some((kind, rest)) => (kind, Some(rest)),
            None => (s, None),
        };
        if kind.is_empty() {
            return Err(LibraryFaultError::MissingKind);
        }
        let kind: LibraryFaultKind = kind.parse()?;
        let mut settings = Vec::new();
        for part in rest.map(|r| r.split(',').collect::<Vec<_>>()).unwrap_or_default() {
            let (key, value) = part
                .split_once('=')
                .filter(|(key, _)| !key.is_empty())
                .ok_or_else(|| LibraryFaultError::Malformed { part: part.to_string() })?;
            settings.push((key, Number::Text(value.to_string())));
        }
        LibraryFault::from_settings(kind, settings)
    }
}

/// Why a library fault was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibraryFaultError {
    #[error("unknown library fault kind {got:?}: expected one of \"alloc\", \"leak\", \"copy-overrun\"")]
    UnknownKind { got: String },
    #[error("a library fault needs its kind: \"alloc\", \"leak\" or \"copy-overrun\" (e.g. alloc:nth=3,count=1)")]
    MissingKind,
    #[error("unknown library fault setting `{key}`: the settings are nth, count and extra (e.g. alloc:nth=3,count=1)")]
    UnknownKey { key: String },
    #[error("library fault setting `{key}` is given twice; give it once")]
    Duplicate { key: String },
    #[error("library fault setting {part:?} is not KEY=VALUE (e.g. alloc:nth=3,count=1)")]
    Malformed { part: String },
    #[error("library fault `{key}` must be {expected}, got {got}")]
    OutOfRange { key: &'static str, expected: &'static str, got: String },
    #[error("`extra` applies to copy-overrun faults only, not to {kind}; remove it")]
    ExtraNotApplicable { kind: LibraryFaultKind },
}

// ---------------------------------------------------------------------------
// The preload library and its environment
// ---------------------------------------------------------------------------

/// The preload library, written to a private per-user directory if need be.
pub fn library_path() -> Result<PathBuf, Error> {
    let context = "cannot write out the library-fault preload library ward_libfault.so";
    let path = LIBRARY.path_of("ward_libfault").map_err(|e| Error::io(context, e))?;
    // LD_PRELOAD separates its entries with spaces and colons.
    if path.as_os_str().as_encoded_bytes().iter().any(|b| matches!(b, b' ' | b':')) {
        let reason = format!(
            "{} contains a space or a colon, which LD_PRELOAD cannot carry; set TMPDIR to a directory without them",
            path.display()
        );
        return Err(Error::io(context, std::io::Error::new(std::io::ErrorKind::InvalidInput, reason)));
    }
    Ok(path)
}

/// The value of [`ENV_VAR`] that gives `fault` to the calls of `object` (made absolute against the current
/// directory; the path comes last and may contain spaces).
pub fn env_value(object: &Path, fault: &LibraryFault) -> OsString {
    let object = std::path::absolute(object).unwrap_or_else(|_| object.to_path_buf());
    let mut value = OsString::from(format!("kind={} nth={} count={}", fault.kind, fault.nth, fault.count));
    if let Some(extra) = fault.extra() {
        value.push(format!(" extra={extra}"));
    }
    value.push(" object=");
    value.push(object.as_os_str());
    value
}

/// The environment to start a native host with so that the calls `object` makes get `fault`: `LD_PRELOAD` (the
/// preload library; it replaces any other preload) and [`ENV_VAR`].
pub fn env_for(object: &Path, fault: &LibraryFault) -> Result<Vec<(OsString, OsString)>, Error> {
    Ok(vec![
        (OsString::from("LD_PRELOAD"), library_path()?.into_os_string()),
        (OsString::from(ENV_VAR), env_value(object, fault)),
    ])
}

/// What a domain process is started with to inject a library fault.
#[derive(Debug, Clone)]
pub(crate) struct Preload {
    /// The preload library.
    pub library: PathBuf,
    /// The value of [`ENV_VAR`].
    pub config: OsString,
}

/// Refuses a library fault for an isolation kind that cannot carry one: `none`, where nothing stands between the
/// extension and the host's C library (checked before the kind is resolved).
pub(crate) fn check_isolation(extension: &str, policy: &ExtensionPolicy, isolation: Isolation) -> Result<(), Error> {
    match (&policy.library_fault, isolation) {
        (None, _) | (Some(_), Isolation::Process | Isolation::Auto | Isolation::Mpk) => Ok(()),
        (Some(_), isolation) => Err(Error::LibraryFaultNeedsDomain { extension: extension.to_string(), isolation }),
    }
}

/// The preload for `extension`'s domain when its policy has a library fault: the calls of `object` (the extension,
/// or the plugin a class adapter opens) get it. A process domain of the extension's own needs one; an mpk domain
/// needs none (None).
pub(crate) fn preload(
    extension: &str,
    policy: &ExtensionPolicy,
    isolation: Isolation,
    object: &Path,
) -> Result<Option<Preload>, Error> {
    let Some(fault) = &policy.library_fault else {
        return Ok(None);
    };
    check_isolation(extension, policy, isolation)?;
    if let Some(group) = &policy.group {
        return Err(Error::LibraryFaultInGroup { extension: extension.to_string(), group: group.clone() });
    }
    // In an mpk domain the domain runtime injects it (see `ExtensionSpec::library_fault`).
    if isolation != Isolation::Process {
        return Ok(None);
    }
    preload_for(fault, object).map(Some)
}

/// The preload that gives the calls of `object` in a domain process `fault`.
pub(crate) fn preload_for(fault: &LibraryFault, object: &Path) -> Result<Preload, Error> {
    Ok(Preload { library: library_path()?, config: env_value(object, fault) })
}

// ---------------------------------------------------------------------------
// The policy key
// ---------------------------------------------------------------------------

/// What `library_fault` accepts, for messages.
const EXPECTED: &str = "a table such as { kind = \"alloc\", nth = 3, count = 1 }, a string such as \
                        \"alloc:nth=3,count=1\", or \"none\"";

/// The field name under which toml hands a date-time to a visitor.
const TOML_DATETIME_FIELD: &str = "$__toml_private_datetime";

/// Deserializes the policy key `library_fault`: a table (`kind`, `nth`, `count`, `extra`), a string
/// ([`LibraryFault`]'s form), or `"none"` (`Some(None)`: off, overriding a wider section).
pub(crate) fn de_library_fault<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<LibraryFault>>, D::Error> {
    d.deserialize_any(PolicyVisitor).map(Some)
}

struct PolicyVisitor;

fn refuse<E: de::Error>(got: impl fmt::Display) -> E {
    E::custom(format!("library_fault must be {EXPECTED}, got {got}"))
}

fn invalid<E: de::Error>(e: LibraryFaultError) -> E {
    E::custom(format!("library_fault: {e}"))
}

impl<'de> Visitor<'de> for PolicyVisitor {
    type Value = Option<LibraryFault>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        if v == "none" {
            return Ok(None);
        }
        v.parse().map(Some).map_err(invalid)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Err(refuse(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Err(refuse(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Err(refuse(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Err(refuse(format_args!("{v:?}")))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _seq: A) -> Result<Self::Value, A::Error> {
        Err(refuse("an array"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kind = None;
        let mut settings: Vec<(String, Number)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if key == TOML_DATETIME_FIELD {
                return Err(refuse("a date-time"));
            }
            let value: toml::Value = map.next_value()?;
            if key == "kind" {
                if kind.is_some() {
                    return Err(invalid(LibraryFaultError::Duplicate { key }));
                }
                match value {
                    toml::Value::String(s) => kind = Some(s.parse::<LibraryFaultKind>().map_err(invalid)?),
                    other => {
                        return Err(de::Error::custom(format!(
                            "library_fault: kind must be one of \"alloc\", \"leak\", \"copy-overrun\", got {other}"
                        )))
                    }
                }
                continue;
            }
            let number = match value {
                toml::Value::Integer(i) => Number::Int(i),
                // A number in quotes is text in a table (in the string form every value is text).
                other => Number::Other(other.to_string()),
            };
            settings.push((key, number));
        }
        let kind = kind.ok_or_else(|| invalid(LibraryFaultError::MissingKind))?;
        LibraryFault::from_settings(kind, settings).map(Some).map_err(invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_every_kind() {
        let cases = [
            ("alloc", "alloc:nth=1,count=1"),
            ("alloc:nth=3,count=1", "alloc:nth=3,count=1"),
            ("alloc:count=0,nth=7", "alloc:nth=7,count=0"),
            ("leak", "leak:nth=1,count=0"),
            ("leak:nth=10,count=5", "leak:nth=10,count=5"),
            ("copy-overrun", "copy-overrun:nth=1,count=1,extra=64"),
            ("copy-overrun:extra=16,nth=2", "copy-overrun:nth=2,count=1,extra=16"),
        ];
        for (text, shown) in cases {
            let fault: LibraryFault = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(fault.to_string(), shown, "{text}");
            assert_eq!(shown.parse::<LibraryFault>(), Ok(fault), "{shown} round-trips");
        }
        let overrun: LibraryFault = "copy-overrun:nth=2,extra=16".parse().unwrap();
        assert_eq!(
            (overrun.kind(), overrun.nth(), overrun.count(), overrun.extra()),
            (LibraryFaultKind::CopyOverrun, 2, 1, Some(16))
        );
        assert_eq!("leak".parse::<LibraryFault>().unwrap().extra(), None);
    }

    #[test]
    fn refuses_malformed_text_saying_what_is_accepted() {
        let cases = [
            ("", "needs its kind"),
            (":nth=1", "needs its kind"),
            ("explode", "unknown library fault kind \"explode\": expected one of \"alloc\""),
            ("Alloc", "unknown library fault kind"),
            ("alloc:", "setting \"\" is not KEY=VALUE"),
            ("alloc:nth", "setting \"nth\" is not KEY=VALUE"),
            ("alloc:=3", "is not KEY=VALUE"),
            ("alloc:nth=0", "`nth` must be a whole number from 1 to 1000000000, got 0"),
            ("alloc:nth=-1", "`nth` must be a whole number from 1 to 1000000000, got \"-1\""),
            ("alloc:nth=+1", "got \"+1\""),
            ("alloc:nth=1000000001", "got 1000000001"),
            ("alloc:nth=99999999999999999999999", "got \"99999999999999999999999\""),
            ("alloc:count=x", "`count` must be a whole number from 0"),
            ("alloc:nth=1,nth=2", "setting `nth` is given twice"),
            ("alloc:color=red", "unknown library fault setting `color`: the settings are nth, count and extra"),
            ("alloc:extra=8", "`extra` applies to copy-overrun faults only, not to alloc; remove it"),
            ("copy-overrun:extra=0", "`extra` must be a whole number of bytes from 1 to 1048576, got 0"),
            ("copy-overrun:extra=1048577", "got 1048577"),
        ];
        for (text, expected) in cases {
            let err = text.parse::<LibraryFault>().unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn builder_checks_its_ranges() {
        let alloc = LibraryFault::new(LibraryFaultKind::Alloc, 3).unwrap();
        assert_eq!(alloc.count(), 1);
        assert_eq!(alloc.with_count(0).unwrap().count(), 0);
        assert!(LibraryFault::new(LibraryFaultKind::Alloc, 0).is_err());
        assert!(alloc.with_count(LibraryFault::MAX_CALLS + 1).is_err());
        assert_eq!(alloc.with_extra(8), Err(LibraryFaultError::ExtraNotApplicable { kind: LibraryFaultKind::Alloc }));
        let leak = LibraryFault::new(LibraryFaultKind::Leak, 1).unwrap();
        assert_eq!(leak.count(), 0, "a leak goes on by default");
    }

    #[test]
    fn env_value_puts_the_object_last() {
        let fault: LibraryFault = "copy-overrun:nth=2,count=0,extra=8".parse().unwrap();
        let value = env_value(Path::new("/opt/my plugins/amp.so"), &fault);
        assert_eq!(value, "kind=copy-overrun nth=2 count=0 extra=8 object=/opt/my plugins/amp.so");
        let value = env_value(Path::new("/x/a.so"), &"leak:nth=4".parse().unwrap());
        assert_eq!(value, "kind=leak nth=4 count=0 object=/x/a.so");
        let relative = env_value(Path::new("a.so"), &"alloc".parse().unwrap());
        let expected = std::env::current_dir().unwrap().join("a.so");
        assert!(relative.to_string_lossy().ends_with(&format!("object={}", expected.display())), "{relative:?}");
    }

    #[test]
    fn the_preload_library_is_an_elf_shared_object() {
        let path = library_path().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"\x7fELF"), "{}", path.display());
        let env = env_for(Path::new("/x/a.so"), &"alloc".parse().unwrap()).unwrap();
        assert_eq!(env[0], (OsString::from("LD_PRELOAD"), path.into_os_string()));
        assert_eq!(env[1].0, ENV_VAR);
    }
}
