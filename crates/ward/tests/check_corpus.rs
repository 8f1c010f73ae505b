//! `ward::check` over Debian's LADSPA and frei0r plugin collections (swh-plugins, ladspa-sdk, frei0r-plugins):
//! every plugin gets a report, and what the collections are known to hold comes out as expected.
//!
//! `scripts/deps` installs the packages; `scripts/test` runs it first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ward::check::{check, CheckReport, Reason};
use ward::Isolation;

const LADSPA: &str = "/usr/lib/ladspa";
const FREI0R: &str = "/usr/lib/frei0r-1";

/// Every file of `dir`, sorted, or a failure that says how to install them.
fn plugins(dir: &str) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| {
        panic!("cannot read {dir} ({e}): install the plugin packages with scripts/deps (as root), then rerun")
    });
    let mut files: Vec<PathBuf> = entries.map(|e| e.expect("read a directory entry").path()).collect();
    files.sort();
    assert!(!files.is_empty(), "{dir} is empty: install the plugin packages with scripts/deps (as root)");
    files
}

/// Checks every plugin of `dir`, asserting the properties every report must have.
fn check_all(dir: &str) -> BTreeMap<String, CheckReport> {
    let mut reports = BTreeMap::new();
    for path in plugins(dir) {
        let report = check(&path).unwrap_or_else(|e| panic!("{} does not check: {e}", path.display()));
        for kind in [Isolation::None, Isolation::Process] {
            assert!(report.allows(kind), "{} refused for {kind}: {:?}", path.display(), report.verdict(kind));
        }
        for verdict in &report.kinds {
            assert_eq!(verdict.ok, verdict.reasons.is_empty(), "{}: {verdict:?}", path.display());
        }
        let mpk = report.verdict(Isolation::Mpk).expect("an mpk verdict");
        // Forbidden bytes would be news: none of these plugins writes protection keys.
        assert!(
            !mpk.reasons.iter().any(|r| matches!(r, Reason::ForbiddenInstructions { .. })),
            "{}: {:?}",
            path.display(),
            mpk.reasons
        );
        let stem = file_stem(&path);
        assert!(reports.insert(stem, report).is_none());
    }
    reports
}

fn file_stem(path: &Path) -> String {
    path.file_stem().expect("a file name").to_string_lossy().into_owned()
}

fn mpk_reasons<'a>(reports: &'a BTreeMap<String, CheckReport>, name: &str) -> &'a [Reason] {
    let report = reports.get(name).unwrap_or_else(|| panic!("{name} is not in the collection"));
    &report.verdict(Isolation::Mpk).expect("an mpk verdict").reasons
}

#[test]
fn ladspa_collection() {
    let reports = check_all(LADSPA);
    // swh-plugins written in C whose imports (heap, libm, gettext, rand, the stack protector) the runtime
    // covers: an mpk domain can hold them.
    let eligible = ["amp_1181", "dc_remove_1207", "delay_1898", "gverb_1216", "sc4_1882"];
    for name in eligible {
        assert!(mpk_reasons(&reports, name).is_empty(), "{name}: {:#?}", mpk_reasons(&reports, name));
    }
    // The FFT-based ones need libfftw3f, whose code would run in the domain unanalysed.
    for name in ["mbeq_1197", "pitch_scale_1193"] {
        assert!(
            mpk_reasons(&reports, name).contains(&Reason::Dependency { library: "libfftw3f.so.3".into() }),
            "{name}: {:#?}",
            mpk_reasons(&reports, name)
        );
    }
    // The oscillators share wave tables through shared memory: shm_open is a reason (the runtime's mmap makes
    // anonymous private mappings only).
    let maps = |r: &Reason| match r {
        Reason::UnsupportedImport { import, group, .. } => import.name == "shm_open" && *group == "mappings",
        _ => false,
    };
    assert!(mpk_reasons(&reports, "analogue_osc_1416").iter().any(maps));
    // ladspa-sdk's sine is C++ with nothing the runtime lacks but libstdc++ itself.
    assert_eq!(mpk_reasons(&reports, "sine"), [Reason::Dependency { library: "libstdc++.so.6".into() }]);
    let count = reports.values().filter(|r| r.allows(Isolation::Mpk)).count();
    assert!(count >= eligible.len(), "{count} LADSPA plugins can run under mpk");
}

#[test]
fn frei0r_collection() {
    let reports = check_all(FREI0R);
    // Plain C filters.
    for name in ["brightness", "colorize", "3dflippo"] {
        assert!(mpk_reasons(&reports, name).is_empty(), "{name}: {:#?}", mpk_reasons(&reports, name));
    }
    // The C++ ones need libstdc++ and its runtime (std::string, iostreams' init, exceptions).
    let reasons = mpk_reasons(&reports, "addition");
    for library in ["libgcc_s.so.1", "libstdc++.so.6"] {
        assert!(reasons.contains(&Reason::Dependency { library: library.into() }), "{reasons:#?}");
    }
    assert!(reasons.iter().any(|r| matches!(r, Reason::UnsupportedImport { group, .. } if *group == "cxx-library")));
}
