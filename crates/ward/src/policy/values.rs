//! What each kind of policy key accepts (a duration, a whole number in a range, a keyword, a name...), and the
//! message that says so when a value is refused. Every value is checked where it is read, so the message carries
//! the value's position.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::file::KeyError;
use super::keywords::Keyword;
use crate::libfault::LibraryFault;

/// How the value of one key is read. The key is given for the messages.
pub(crate) trait ValueSeed {
    type Value;

    fn read<'de, D: Deserializer<'de>>(self, key: &'static str, d: D) -> Result<Self::Value, D::Error>;
}

/// A [`ValueSeed`] with its key: what a map's `next_value_seed` takes.
pub(crate) struct Keyed<S> {
    pub key: &'static str,
    pub seed: S,
}

impl<'de, S: ValueSeed> DeserializeSeed<'de> for Keyed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.seed.read(self.key, d)
    }
}

/// A single value checked by a function of the key and the value; a refusal becomes a serde error, to which toml
/// attaches the value's position.
pub(crate) struct Check<F>(F);

/// What a [`Check`] runs: the key (for messages) and the value read give the value or why it is refused.
pub(crate) trait CheckFn<T>: FnOnce(&'static str, &Scalar) -> Result<T, KeyError> {}

impl<T, F: FnOnce(&'static str, &Scalar) -> Result<T, KeyError>> CheckFn<T> for F {}

/// A [`Check`] of `f`.
pub(crate) fn check<T, F: FnOnce(&'static str, &Scalar) -> Result<T, KeyError>>(f: F) -> Check<F> {
    Check(f)
}

impl<T, F: FnOnce(&'static str, &Scalar) -> Result<T, KeyError>> ValueSeed for Check<F> {
    type Value = T;

    fn read<'de, D: Deserializer<'de>>(self, key: &'static str, d: D) -> Result<T, D::Error> {
        let value = Scalar::deserialize(d)?;
        (self.0)(key, &value).map_err(de::Error::custom)
    }
}

// --- Scalars ----------------------------------------------------------------

/// Any TOML value, as far as messages about it need to know.
pub(crate) enum Scalar {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    /// An array, table or date-time, described ("an array").
    Other(&'static str),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(v) => write!(f, "{v}"),
            // Debug keeps the fraction visible: "10.0", not "10".
            Scalar::Float(v) => write!(f, "{v:?}"),
            Scalar::Bool(v) => write!(f, "{v}"),
            Scalar::Str(v) => write!(f, "{v:?}"),
            Scalar::Other(what) => f.write_str(what),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

/// The field name under which toml hands a date-time to a visitor.
const TOML_DATETIME_FIELD: &str = "$__toml_private_datetime";

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other("an array"))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        let mut what = "a table";
        if let Some(key) = map.next_key::<String>()? {
            if key == TOML_DATETIME_FIELD {
                what = "a date-time";
            }
            map.next_value::<IgnoredAny>()?;
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        }
        Ok(Scalar::Other(what))
    }
}

/// "`key` must be `expected`, got `value`".
pub(crate) fn refuse(key: &'static str, expected: impl Into<String>, value: &Scalar) -> KeyError {
    KeyError::Value { key, expected: expected.into(), got: value.to_string() }
}

// --- Kinds of values --------------------------------------------------------

/// Longest duration accepted anywhere: 100 years.
const MAX_DURATION_S: u64 = 100 * 365 * 24 * 60 * 60;

/// Unit of a duration key.
#[derive(Clone, Copy)]
pub(crate) enum Unit {
    Milliseconds,
    Seconds,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Milliseconds => "milliseconds",
            Unit::Seconds => "seconds",
        }
    }

    fn nanos(self) -> u64 {
        match self {
            Unit::Milliseconds => 1_000_000,
            Unit::Seconds => 1_000_000_000,
        }
    }

    /// `MAX_DURATION_S` in this unit.
    fn max(self) -> u64 {
        MAX_DURATION_S * (1_000_000_000 / self.nanos())
    }
}

/// A duration written as an integer or float count of `unit`. Zero is accepted only if `zero` is `Some(note)`,
/// the note saying what zero means.
pub(crate) fn duration(
    key: &'static str,
    unit: Unit,
    zero: Option<&str>,
    value: &Scalar,
) -> Result<Duration, KeyError> {
    let expected = match zero {
        Some(note) => format!("a non-negative number of {}{note}", unit.name()),
        None => format!("a positive number of {}", unit.name()),
    };
    let nanos: u128 = match value {
        Scalar::Int(v) if *v >= 0 => v.unsigned_abs() * u128::from(unit.nanos()),
        Scalar::Float(v) if v.is_finite() && *v >= 0.0 => {
            // Bounded below; the upper bound is checked next.
            let nanos = (v * unit.nanos() as f64).round();
            if nanos > u128::from(u64::MAX) as f64 {
                u128::MAX
            } else {
                nanos as u128
            }
        }
        _ => return Err(refuse(key, expected, value)),
    };
    if nanos > u128::from(MAX_DURATION_S) * 1_000_000_000 {
        let expected = format!("{expected} of at most {} (100 years)", unit.max());
        return Err(refuse(key, expected, value));
    }
    if nanos == 0 && zero.is_none() {
        return Err(refuse(key, expected, value));
    }
    // At most MAX_DURATION_S seconds, so it fits.
    Ok(Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
}

/// A positive duration in milliseconds.
pub(crate) fn millis() -> Check<impl CheckFn<Duration>> {
    check(|key, v| duration(key, Unit::Milliseconds, None, v))
}

/// A duration in milliseconds that may be zero, `note` saying what zero means.
pub(crate) fn millis_or_zero(note: &'static str) -> Check<impl CheckFn<Duration>> {
    check(move |key, v| duration(key, Unit::Milliseconds, Some(note), v))
}

/// A whole number within `min..=max`, as a `T` that holds every number of that range.
pub(crate) fn whole<T: TryFrom<u64>>(min: u64, max: u64, expected: &'static str) -> Check<impl CheckFn<T>> {
    check(move |key, v| {
        whole_in(key, min, max, expected, v).and_then(|n| T::try_from(n).map_err(|_| refuse(key, expected, v)))
    })
}

/// A whole number within `min..=max`.
pub(crate) fn whole_in(key: &'static str, min: u64, max: u64, expected: &str, value: &Scalar) -> Result<u64, KeyError> {
    match value {
        Scalar::Int(v) if *v >= i128::from(min) && *v <= i128::from(max) => {
            u64::try_from(*v).map_err(|_| refuse(key, expected, value))
        }
        _ => Err(refuse(key, expected, value)),
    }
}

/// `true` or `false`.
pub(crate) fn flag() -> Check<impl CheckFn<bool>> {
    check(|key, v| match v {
        Scalar::Bool(v) => Ok(*v),
        _ => Err(refuse(key, "true or false", v)),
    })
}

/// One of the keywords of `T`.
pub(crate) fn keyword<T: Keyword>() -> Check<impl CheckFn<T>> {
    check(|key, v| {
        let found = match v {
            Scalar::Str(s) => T::ALL.iter().copied().find(|k| k.as_str() == s),
            _ => None,
        };
        found.ok_or_else(|| refuse(key, format!("one of {}", T::quoted_list()), v))
    })
}

/// A group or extension name: non-empty, of `[A-Za-z0-9_.-]`.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<(), KeyError> {
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if valid {
        Ok(())
    } else {
        Err(KeyError::Name { what, name: name.to_string() })
    }
}

/// A C function name: `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn check_identifier(what: &'static str, name: &str) -> Result<(), KeyError> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(KeyError::FunctionName { what, name: name.to_string() })
    }
}

/// A group's name (`group = "demo"`).
pub(crate) fn group_name() -> Check<impl CheckFn<String>> {
    check(|key, v| match v {
        Scalar::Str(s) => check_name(key, s).map(|()| s.clone()),
        _ => Err(refuse(key, "a group name (a string of letters, digits, '_', '.' and '-')", v)),
    })
}

/// The name of a C function (`init = "well_init"`).
pub(crate) fn function_name() -> Check<impl CheckFn<String>> {
    check(|key, v| match v {
        Scalar::Str(s) => check_identifier(key, s).map(|()| s.clone()),
        _ => Err(refuse(key, "the name of a C function (a string)", v)),
    })
}

/// The path of a shared object.
pub(crate) fn library_path() -> Check<impl CheckFn<PathBuf>> {
    check(|key, v| match v {
        Scalar::Str(s) if !s.is_empty() && !s.contains('\0') => Ok(PathBuf::from(s)),
        _ => Err(refuse(key, "the path of a shared object (a non-empty string)", v)),
    })
}

/// Some words (a reason).
pub(crate) fn text() -> Check<impl CheckFn<String>> {
    check(|key, v| match v {
        Scalar::Str(s) => Ok(s.clone()),
        _ => Err(refuse(key, "a string", v)),
    })
}

/// Largest address-space limit whose size in bytes fits a u64.
const MAX_ADDRESS_SPACE_MB: u64 = u64::MAX >> 20;

/// A memory limit in MiB: 0 for none, else at least what an empty domain needs.
pub(crate) fn domain_megabytes() -> Check<impl CheckFn<u64>> {
    use super::MIN_ADDRESS_SPACE_MB;
    check(|key, v| {
        let expected = format!(
            "0 (unlimited) or a whole number of MiB from {MIN_ADDRESS_SPACE_MB} (less cannot hold a domain) to \
             {MAX_ADDRESS_SPACE_MB}"
        );
        match whole_in(key, 0, MAX_ADDRESS_SPACE_MB, &expected, v)? {
            1..MIN_ADDRESS_SPACE_MB => Err(refuse(key, expected, v)),
            mb => Ok(mb),
        }
    })
}

/// A pids limit: 0 for none, else at least what a domain's processes and threads need.
pub(crate) fn pids() -> Check<impl CheckFn<u64>> {
    use super::MIN_PIDS;
    check(|key, v| {
        let expected = format!(
            "0 (unlimited) or a whole number of at least {MIN_PIDS} (the zygote, an incarnation and their threads)"
        );
        match whole_in(key, 0, u64::from(u32::MAX), &expected, v)? {
            1..MIN_PIDS => Err(refuse(key, expected, v)),
            n => Ok(n),
        }
    })
}

/// A growth factor of at least 1.
pub(crate) fn factor() -> Check<impl CheckFn<f64>> {
    check(|key, v| {
        let factor = match v {
            Scalar::Int(i) => *i as f64,
            Scalar::Float(f) => *f,
            _ => f64::NAN,
        };
        if factor.is_finite() && factor >= 1.0 {
            Ok(factor)
        } else {
            Err(refuse(key, "a number of at least 1.0", v))
        }
    })
}

/// Absolute paths (an array of strings).
pub(crate) struct AbsolutePaths;

impl ValueSeed for AbsolutePaths {
    type Value = Vec<PathBuf>;

    fn read<'de, D: Deserializer<'de>>(self, _key: &'static str, d: D) -> Result<Vec<PathBuf>, D::Error> {
        let paths = Vec::<PathBuf>::deserialize(d)?;
        match paths.iter().find(|p| !p.is_absolute()) {
            Some(relative) => Err(de::Error::custom(KeyError::RelativeWritable { path: relative.clone() })),
            None => Ok(paths),
        }
    }
}

/// A library fault, or `"none"` ([`crate::libfault`] reads it).
pub(crate) struct LibraryFaultValue;

impl ValueSeed for LibraryFaultValue {
    type Value = Option<LibraryFault>;

    fn read<'de, D: Deserializer<'de>>(self, _key: &'static str, d: D) -> Result<Option<LibraryFault>, D::Error> {
        crate::libfault::de_library_fault(d).map(Option::flatten)
    }
}
