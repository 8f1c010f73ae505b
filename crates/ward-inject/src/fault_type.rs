//! The fault types: Nooks' Table II (after the Rio injector), plus two ward adds for errors the paper's campaign
//! names in its text (uninitialised locals, inverted or off-by-one tests).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::error::UnknownFaultType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultType {
    /// Change a source operand: another register of the same size, or one bit of an immediate.
    Source,
    /// Change the destination register to another of the same size.
    Destination,
    /// Change the address computation of a memory operand: its displacement, base or index register.
    Pointer,
    /// Drop the copy or reload of an incoming parameter, so a stale register or slot is used instead.
    Interface,
    /// Delete a conditional branch.
    Branch,
    /// Invert the condition of a backward conditional branch (the test that ends a loop).
    Loop,
    /// Flip one bit of an instruction.
    Text,
    /// Delete an instruction.
    Nop,
    /// Drop the store that initialises a stack slot.
    Init,
    /// Turn `<` into `<=` and the like, or move a compare's constant by one.
    OffByOne,
}

impl FaultType {
    /// Every fault type, in the order of Nooks' Table II followed by ward's additions.
    pub const ALL: [FaultType; 10] = [
        FaultType::Source,
        FaultType::Destination,
        FaultType::Pointer,
        FaultType::Interface,
        FaultType::Branch,
        FaultType::Loop,
        FaultType::Text,
        FaultType::Nop,
        FaultType::Init,
        FaultType::OffByOne,
    ];

    /// The name used on the command line and in reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            FaultType::Source => "source",
            FaultType::Destination => "destination",
            FaultType::Pointer => "pointer",
            FaultType::Interface => "interface",
            FaultType::Branch => "branch",
            FaultType::Loop => "loop",
            FaultType::Text => "text",
            FaultType::Nop => "nop",
            FaultType::Init => "init",
            FaultType::OffByOne => "off-by-one",
        }
    }

    /// Every name, in [`FaultType::ALL`] order.
    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|t| t.as_str()).collect()
    }
}

impl fmt::Display for FaultType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FaultType {
    type Err = UnknownFaultType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|t| t.as_str() == s).ok_or_else(|| UnknownFaultType { given: s.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_serde() {
        for t in FaultType::ALL {
            assert_eq!(t.as_str().parse::<FaultType>(), Ok(t));
            let json = serde_json::to_string(&t).expect("serialises");
            assert_eq!(json, format!("\"{}\"", t.as_str()));
        }
    }

    #[test]
    fn unknown_name_lists_the_valid_ones() {
        let err = "bogus".parse::<FaultType>().expect_err("not a type");
        let msg = err.to_string();
        assert!(msg.contains("`bogus`"), "{msg}");
        for name in FaultType::names() {
            assert!(msg.contains(name), "{msg} lacks {name}");
        }
    }
}
