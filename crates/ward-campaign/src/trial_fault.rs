//! What a trial injects: a code fault type (ward-inject mutates a copy of the extension's machine code) or a
//! run-time library fault kind (the unmutated extension runs with `ward::libfault`'s preload library making its C
//! library calls fail, leak or overrun).
//!
//! Both are named on the command line, in records and in reports by one word: the code types as
//! [`FaultType::as_str`] spells them, the library kinds as [`LibraryFaultKind::as_str`] does. They are ordered code
//! types first, in [`FaultType::ALL`] order (Nooks' Table II, then ward's additions), then `alloc`, `leak` and
//! `copy-overrun`.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use ward::libfault::LibraryFaultKind;
use ward_inject::FaultType;

use crate::error::Error;

/// One kind of fault a campaign's trials inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrialFault {
    /// A fault in the extension's machine code, written into its trial's copy.
    Code(FaultType),
    /// A fault in the extension's calls to its C library, injected at run time.
    Library(LibraryFaultKind),
}

/// The library kinds a campaign can run, in their order.
pub const LIBRARY_KINDS: [LibraryFaultKind; 3] =
    [LibraryFaultKind::Alloc, LibraryFaultKind::Leak, LibraryFaultKind::CopyOverrun];

impl TrialFault {
    /// `all` on the command line: every code fault type.
    pub fn all_code() -> Vec<TrialFault> {
        FaultType::ALL.iter().map(|&t| TrialFault::Code(t)).collect()
    }

    /// `library` on the command line: every library fault kind.
    pub fn all_library() -> Vec<TrialFault> {
        LIBRARY_KINDS.iter().map(|&k| TrialFault::Library(k)).collect()
    }

    /// The name used on the command line, in records and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            TrialFault::Code(t) => t.as_str(),
            TrialFault::Library(k) => k.as_str(),
        }
    }

    /// A number that never changes across versions (names could be respelled, kinds added): a code type's place in
    /// [`FaultType::ALL`] (0 to 9), then 10, 11 and 12 for the library kinds. Trial seeds and the order of trials,
    /// rows and records rest on it.
    pub fn number(self) -> u64 {
        match self {
            TrialFault::Code(t) => FaultType::ALL.iter().position(|x| *x == t).unwrap_or(0) as u64,
            TrialFault::Library(LibraryFaultKind::Alloc) => 10,
            TrialFault::Library(LibraryFaultKind::Leak) => 11,
            TrialFault::Library(LibraryFaultKind::CopyOverrun) => 12,
        }
    }

    pub fn code(self) -> Option<FaultType> {
        match self {
            TrialFault::Code(t) => Some(t),
            TrialFault::Library(_) => None,
        }
    }

    pub fn library(self) -> Option<LibraryFaultKind> {
        match self {
            TrialFault::Code(_) => None,
            TrialFault::Library(k) => Some(k),
        }
    }

    pub fn is_library(self) -> bool {
        self.library().is_some()
    }

    /// Every name, in order: the code types, then the library kinds.
    pub fn names() -> Vec<&'static str> {
        Self::all_code().into_iter().chain(Self::all_library()).map(TrialFault::as_str).collect()
    }
}

impl From<FaultType> for TrialFault {
    fn from(t: FaultType) -> TrialFault {
        TrialFault::Code(t)
    }
}

impl From<LibraryFaultKind> for TrialFault {
    fn from(k: LibraryFaultKind) -> TrialFault {
        TrialFault::Library(k)
    }
}

impl PartialOrd for TrialFault {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TrialFault {
    fn cmp(&self, other: &Self) -> Ordering {
        self.number().cmp(&other.number())
    }
}

impl fmt::Display for TrialFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TrialFault {
    type Err = Error;

    /// One name: a code fault type or a library fault kind (not the keywords `all` and `library`).
    fn from_str(s: &str) -> Result<TrialFault, Error> {
        if let Ok(t) = s.parse::<FaultType>() {
            return Ok(TrialFault::Code(t));
        }
        LIBRARY_KINDS
            .iter()
            .find(|k| k.as_str() == s)
            .map(|&k| TrialFault::Library(k))
            .ok_or_else(|| Error::UnknownFaultType { given: s.to_string() })
    }
}

/// By name, as [`FaultType`] always was: records written before library faults existed read back unchanged.
impl Serialize for TrialFault {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TrialFault {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TrialFault, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_order() {
        let every: Vec<TrialFault> = TrialFault::all_code().into_iter().chain(TrialFault::all_library()).collect();
        assert_eq!(every.len(), 13);
        let mut sorted = every.clone();
        sorted.reverse();
        sorted.sort();
        assert_eq!(sorted, every, "code types in Table II order, then alloc, leak, copy-overrun");
        let numbers: Vec<u64> = every.iter().map(|f| f.number()).collect();
        assert_eq!(numbers, (0..13).collect::<Vec<u64>>());
        for f in every {
            assert_eq!(f.as_str().parse::<TrialFault>().unwrap(), f);
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{f}\""));
            assert_eq!(serde_json::from_str::<TrialFault>(&json).unwrap(), f);
        }
        assert_eq!("copy-overrun".parse::<TrialFault>().unwrap(), TrialFault::Library(LibraryFaultKind::CopyOverrun));
        assert_eq!("off-by-one".parse::<TrialFault>().unwrap(), TrialFault::Code(FaultType::OffByOne));
        assert!(TrialFault::Library(LibraryFaultKind::Alloc).is_library());
        assert_eq!(TrialFault::Code(FaultType::Nop).code(), Some(FaultType::Nop));
        let err = "overrun".parse::<TrialFault>().unwrap_err();
        assert!(err.is_bad_input());
        assert!(err.to_string().contains("`overrun`") && err.to_string().contains("copy-overrun"), "{err}");
        assert!(serde_json::from_str::<TrialFault>("\"library\"").is_err(), "a keyword is not a name");
    }
}
