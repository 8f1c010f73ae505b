//! Which trials a campaign holds and the seed of each. A trial is named by its fault type (a code fault type or a
//! library fault kind) and its number within that type; its seed depends on nothing else but the campaign seed, so
//! adding or dropping other fault types never changes what a trial injects.

use std::collections::BTreeSet;
use std::path::Path;

use object::{Object, ObjectSymbol};
use ward::libfault::{LibraryFault, LibraryFaultKind};
use ward_inject::{InjectError, Plan};

use crate::error::Error;
use crate::trial_fault::TrialFault;

/// One trial: the `index`-th of its fault type (from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrialId {
    pub fault_type: TrialFault,
    pub index: u32,
}

impl TrialId {
    /// The trial's seed: the injector's for a code fault type, the one [`library_fault`] draws from for a library
    /// kind.
    pub fn seed(self, campaign_seed: u64) -> u64 {
        // The type's number is stable across versions (a code type's place in Table II order, then the library
        // kinds'); names could be respelled.
        let type_number = self.fault_type.number();
        mix(mix(campaign_seed) ^ ((type_number + 1) << 32) ^ u64::from(self.index))
    }

    /// `nop-0007`: a name for files of this trial.
    pub fn slug(self) -> String {
        format!("{}-{:04}", self.fault_type, self.index)
    }
}

/// SplitMix64 of one step: neighbouring inputs give unrelated outputs (also the workloads' source of test noise).
pub(crate) fn mix(z: u64) -> u64 {
    ward_xpc::mix::splitmix64(z)
}

/// A library-fault trial's first affected call is drawn from 1 to this.
pub const LIBRARY_NTH_MAX: u64 = 8;

/// The library fault of a trial of `kind` with seed `seed`: from its `nth` call on, `nth` drawn from 1 to
/// [`LIBRARY_NTH_MAX`]; one failed allocation, every free from the `nth` on, or one copy overrun by
/// [`LibraryFault::DEFAULT_EXTRA`] bytes (the kind's defaults).
pub fn library_fault(kind: LibraryFaultKind, seed: u64) -> Result<LibraryFault, Error> {
    Ok(LibraryFault::new(kind, 1 + seed % LIBRARY_NTH_MAX)?)
}

/// Every trial of `types`, `trials_per_type` of each, in the order of `types`.
pub fn trials(types: &[TrialFault], trials_per_type: u32) -> Vec<TrialId> {
    types.iter().flat_map(|&fault_type| (0..trials_per_type).map(move |index| TrialId { fault_type, index })).collect()
}

/// The functions each library kind intercepts, as an extension imports them: a kind has a site in an extension
/// that imports at least one (the preload library acts on the extension's direct calls only).
pub fn intercepted(kind: LibraryFaultKind) -> &'static [&'static str] {
    match kind {
        LibraryFaultKind::Alloc => &["malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign"],
        LibraryFaultKind::Leak => &["free"],
        LibraryFaultKind::CopyOverrun => &[
            "memcpy",
            "memmove",
            "memset",
            "strcpy",
            "strncpy",
            "__memcpy_chk",
            "__memmove_chk",
            "__memset_chk",
            "__strcpy_chk",
            "__strncpy_chk",
        ],
    }
}

/// The names of the functions `extension` imports: the undefined symbols of its dynamic symbol table.
pub fn imports(extension: &[u8]) -> Result<BTreeSet<String>, object::Error> {
    let file = object::File::parse(extension)?;
    let mut names = BTreeSet::new();
    for symbol in file.dynamic_symbols().filter(|s| s.is_undefined()) {
        if let Ok(name) = symbol.name() {
            if !name.is_empty() {
                names.insert(name.to_string());
            }
        }
    }
    Ok(names)
}

/// Splits `types` into those with at least one site in the extension at `path` (its bytes: `extension`) and those
/// with none. Whether a type has a site does not depend on the seed, so one probe per type decides it for every
/// trial: a code type's is an injection, a library kind's the extension's imports.
pub fn eligible(
    path: &Path,
    extension: &[u8],
    types: &[TrialFault],
) -> Result<(Vec<TrialFault>, Vec<TrialFault>), Error> {
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let mut imported = None;
    for &t in types {
        let has_site = match t {
            TrialFault::Code(fault_type) => {
                match ward_inject::inject(extension, &Plan { fault_type, seed: 0, count: 1, function: None }) {
                    Ok(_) => true,
                    Err(InjectError::NoEligibleSite { .. }) => false,
                    Err(source) => return Err(Error::Inject { path: path.to_path_buf(), source }),
                }
            }
            TrialFault::Library(kind) => {
                let names = match &mut imported {
                    Some(names) => names,
                    None => imported.insert(
                        imports(extension)
                            .map_err(|e| Error::Imports { path: path.to_path_buf(), reason: e.to_string() })?,
                    ),
                };
                intercepted(kind).iter().any(|n| names.contains(*n))
            }
        };
        if has_site {
            with.push(t);
        } else {
            without.push(t);
        }
    }
    Ok((with, without))
}

/// The error when no type asked for has a site.
pub(crate) fn nothing_to_inject(extension: &str, types: &[TrialFault]) -> Error {
    Error::NothingToInject { extension: extension.to_string(), types: crate::config::type_list(types) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ward_inject::FaultType;

    fn id(fault_type: impl Into<TrialFault>, index: u32) -> TrialId {
        TrialId { fault_type: fault_type.into(), index }
    }

    #[test]
    fn seeds_are_stable_and_distinct() {
        let a = id(FaultType::Nop, 0);
        let b = id(FaultType::Nop, 1);
        let c = id(FaultType::Text, 0);
        assert_eq!(a.seed(7), a.seed(7));
        assert_ne!(a.seed(7), b.seed(7));
        assert_ne!(a.seed(7), c.seed(7));
        assert_ne!(a.seed(7), a.seed(8));
        assert_eq!(a.slug(), "nop-0000");
    }

    /// Seeds computed before library faults existed: recorded campaigns resume only if these never change.
    #[test]
    fn code_type_seeds_are_those_recorded_campaigns_used() {
        assert_eq!(id(FaultType::Nop, 0).seed(7), 9_868_026_775_742_323_372);
        assert_eq!(id(FaultType::Source, 1).seed(4), 6_953_376_437_203_518_205);
    }

    #[test]
    fn library_kinds_have_seeds_of_their_own() {
        let mut seeds: Vec<u64> = TrialFault::all_code()
            .into_iter()
            .chain(TrialFault::all_library())
            .flat_map(|t| (0..4).map(move |i| id(t, i).seed(7)))
            .collect();
        let n = seeds.len();
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(seeds.len(), n, "every trial of every type has its own seed");
        let alloc = id(LibraryFaultKind::Alloc, 0);
        assert_eq!(alloc.seed(7), mix(mix(7) ^ (11 << 32)), "alloc is number 10");
        assert_eq!(alloc.slug(), "alloc-0000");
        assert_eq!(id(LibraryFaultKind::CopyOverrun, 3).slug(), "copy-overrun-0003");
    }

    #[test]
    fn library_faults_are_drawn_from_the_seed() {
        for seed in [0, 1, 7, 8, 12_345, u64::MAX] {
            let alloc = library_fault(LibraryFaultKind::Alloc, seed).unwrap();
            assert_eq!(alloc.nth(), 1 + seed % 8);
            assert_eq!((alloc.count(), alloc.extra()), (1, None));
            let leak = library_fault(LibraryFaultKind::Leak, seed).unwrap();
            assert_eq!((leak.nth(), leak.count()), (alloc.nth(), 0), "every free from the nth on");
            let overrun = library_fault(LibraryFaultKind::CopyOverrun, seed).unwrap();
            assert_eq!((overrun.count(), overrun.extra()), (1, Some(64)));
            assert_eq!(library_fault(LibraryFaultKind::Alloc, seed).unwrap(), alloc, "deterministic");
        }
        assert_eq!(library_fault(LibraryFaultKind::Alloc, 2).unwrap().to_string(), "alloc:nth=3,count=1");
        assert_eq!(
            library_fault(LibraryFaultKind::CopyOverrun, 9).unwrap().to_string(),
            "copy-overrun:nth=2,count=1,extra=64"
        );
    }

    #[test]
    fn plans_every_trial_in_order() {
        let t = trials(&[FaultType::Branch.into(), FaultType::Nop.into(), LibraryFaultKind::Leak.into()], 2);
        let names: Vec<String> = t.iter().map(|t| t.slug()).collect();
        assert_eq!(names, ["branch-0000", "branch-0001", "nop-0000", "nop-0001", "leak-0000", "leak-0001"]);
    }

    #[test]
    fn well_has_no_init_site_but_every_other_type() {
        let path = ward_extensions::path_of("well").unwrap();
        let well = std::fs::read(&path).unwrap();
        let every: Vec<TrialFault> = TrialFault::all_code().into_iter().chain(TrialFault::all_library()).collect();
        let (with, without) = eligible(&path, &well, &every).unwrap();
        assert_eq!(without, vec![FaultType::Init.into()], "well.so is built -O2: no stack-slot stores to drop");
        assert_eq!(with.len(), 12, "well.so imports malloc, free and memcpy: {with:?}");
    }

    #[test]
    fn a_library_kind_needs_an_imported_function_it_intercepts() {
        // Debian's amp_1181.so allocates its descriptors and frees them, but copies nothing with the C library.
        let path = Path::new("/usr/lib/ladspa/amp_1181.so");
        assert!(path.exists(), "{} is missing: run scripts/deps", path.display());
        let bytes = std::fs::read(path).unwrap();
        let names = imports(&bytes).unwrap();
        assert!(names.contains("malloc") && names.contains("free"), "{names:?}");
        let (with, without) = eligible(path, &bytes, &TrialFault::all_library()).unwrap();
        assert_eq!(with, vec![LibraryFaultKind::Alloc.into(), LibraryFaultKind::Leak.into()]);
        assert_eq!(without, vec![LibraryFaultKind::CopyOverrun.into()]);
        let err = eligible(path, b"not an ELF file", &TrialFault::all_library()).unwrap_err();
        assert!(err.is_bad_input() && err.to_string().contains("imported functions"), "{err}");
    }
}
