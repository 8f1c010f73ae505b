//! Which trials a campaign holds and the seed of each. A trial is named by its fault type and its number within
//! that type; its seed depends on nothing else but the campaign seed, so adding or dropping other fault types never
//! changes what a trial injects.

use ward_inject::{FaultType, InjectError, Plan};

use crate::error::Error;

/// One trial: the `index`-th of its fault type (from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrialId {
    pub fault_type: FaultType,
    pub index: u32,
}

impl TrialId {
    /// The injector's seed for this trial.
    pub fn seed(self, campaign_seed: u64) -> u64 {
        // The type's place in Table II order is stable across versions; names could be respelled.
        let type_number = FaultType::ALL.iter().position(|t| *t == self.fault_type).unwrap_or(0) as u64;
        mix(mix(campaign_seed) ^ ((type_number + 1) << 32) ^ u64::from(self.index))
    }

    /// `nop-0007`: a name for files of this trial.
    pub fn slug(self) -> String {
        format!("{}-{:04}", self.fault_type, self.index)
    }
}

/// SplitMix64's finaliser: neighbouring inputs give unrelated outputs (also the workloads' source of test noise).
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Every trial of `types`, `trials_per_type` of each, in Table II order.
pub fn trials(types: &[FaultType], trials_per_type: u32) -> Vec<TrialId> {
    types.iter().flat_map(|&fault_type| (0..trials_per_type).map(move |index| TrialId { fault_type, index })).collect()
}

/// Splits `types` into those with at least one site in `extension` and those with none. Whether a type has a site
/// does not depend on the seed, so one probe per type decides it for every trial.
pub fn eligible(extension: &[u8], types: &[FaultType]) -> Result<(Vec<FaultType>, Vec<FaultType>), InjectError> {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for &t in types {
        match ward_inject::inject(extension, &Plan { fault_type: t, seed: 0, count: 1, function: None }) {
            Ok(_) => with.push(t),
            Err(InjectError::NoEligibleSite { .. }) => without.push(t),
            Err(e) => return Err(e),
        }
    }
    Ok((with, without))
}

/// The error when no type asked for has a site.
pub(crate) fn nothing_to_inject(extension: &str, types: &[FaultType]) -> Error {
    Error::NothingToInject { extension: extension.to_string(), types: crate::config::type_list(types) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_stable_and_distinct() {
        let a = TrialId { fault_type: FaultType::Nop, index: 0 };
        let b = TrialId { fault_type: FaultType::Nop, index: 1 };
        let c = TrialId { fault_type: FaultType::Text, index: 0 };
        assert_eq!(a.seed(7), a.seed(7));
        assert_ne!(a.seed(7), b.seed(7));
        assert_ne!(a.seed(7), c.seed(7));
        assert_ne!(a.seed(7), a.seed(8));
        assert_eq!(a.slug(), "nop-0000");
    }

    #[test]
    fn plans_every_trial_in_order() {
        let t = trials(&[FaultType::Branch, FaultType::Nop], 2);
        let names: Vec<String> = t.iter().map(|t| t.slug()).collect();
        assert_eq!(names, ["branch-0000", "branch-0001", "nop-0000", "nop-0001"]);
    }

    #[test]
    fn well_has_no_init_site_but_every_other_type() {
        let well = std::fs::read(ward_extensions::path_of("well").unwrap()).unwrap();
        let (with, without) = eligible(&well, &FaultType::ALL).unwrap();
        assert_eq!(without, vec![FaultType::Init], "well.so is built -O2: no stack-slot stores to drop");
        assert_eq!(with.len(), 9);
    }
}
