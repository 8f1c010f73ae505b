//! The describers: one process domain per class reads the descriptions of every library a host scans. What it reads
//! is what a library's own domain reads; a library that changed on disk before its own domain opens it is refused.
//! Debian's LADSPA and frei0r plugins come from scripts/deps.

use std::path::{Path, PathBuf};

use ward::{Isolation, Policy, Supervisor};
use ward_classes::frei0r;
use ward_classes::ladspa::{difference, Describer, Library};
use ward_classes::ClassError;

mod common;
use common::Scratch;

const LADSPA_DIR: &str = "/usr/lib/ladspa";

const FREI0R_DIR: &str = "/usr/lib/frei0r-1";

/// Every LADSPA library Debian installed, in name order; fails (never skips) when there are none.
fn libraries() -> Vec<PathBuf> {
    libraries_in(LADSPA_DIR)
}

/// Every library in `dir`, in name order; fails (never skips) when there are few.
fn libraries_in(dir: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}: run scripts/deps (it installs the LADSPA and frei0r plugins)"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "so"))
        .collect();
    found.sort();
    assert!(found.len() > 10, "too few libraries in {dir}: run scripts/deps");
    found
}

#[test]
fn the_describer_reads_of_every_debian_library_what_its_own_domain_reads() {
    let sup = Supervisor::new(Policy::default());
    let describer = Describer::new(Policy::default());
    let mut compared = 0;
    for path in libraries() {
        let own = match Library::open(&sup, &path, Some(Isolation::Process)) {
            Ok(library) => library,
            // A library ward refuses in its own domain is refused by the describer too.
            Err(e) => {
                assert!(describer.describe(&path).is_err(), "{}: own domain refused it ({e})", path.display());
                continue;
            }
        };
        let described = describer.describe(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(difference(&described, own.plugins()), None, "{}", path.display());
        assert_eq!(described.len(), own.plugins().len());
        compared += 1;
    }
    assert!(compared > 10, "only {compared} libraries compared");
    assert_eq!(describer.domains_started(), 1, "one describer domain for every library");
}

#[test]
fn a_library_replaced_on_disk_after_it_was_described_is_refused_by_its_own_domain() {
    let s = Scratch::new("describer", "changed");
    let path = s.path("plugin.so");
    std::fs::copy(Path::new(LADSPA_DIR).join("amp.so"), &path).expect("copy amp.so");
    let describer = Describer::new(Policy::default());
    let described = describer.describe(&path).expect("amp described");
    let sup = Supervisor::new(Policy::default());
    // Unchanged: its own domain reads the same and opens it.
    Library::open_as_described(&sup, &path, Some(Isolation::Process), &described).expect("unchanged amp opens");
    // Replaced by another library under the same name (a new file: the old one's mappings stay intact).
    std::fs::remove_file(&path).expect("remove");
    std::fs::copy(Path::new(LADSPA_DIR).join("delay.so"), &path).expect("copy delay.so");
    match Library::open_as_described(&sup, &path, Some(Isolation::Process), &described) {
        // amp.so has two plugins, delay.so one.
        Err(ClassError::Changed { what, .. }) => assert!(what.contains("it had 2 plugins, it now has 1"), "{what}"),
        other => panic!("a changed library must be refused, got {other:?}"),
    }
}

#[test]
fn a_library_that_fails_in_the_describer_costs_it_its_domain_and_the_next_library_is_described() {
    let describer = Describer::new(Policy::default());
    let amp = Path::new(LADSPA_DIR).join("amp.so");
    describer.describe(&amp).expect("amp described");
    // Not a LADSPA library at all: libm has no ladspa_descriptor.
    let not_ladspa = Path::new("/lib/x86_64-linux-gnu/libm.so.6");
    assert!(matches!(describer.describe(not_ladspa), Err(ClassError::NotAPlugin { .. })));
    let described = describer.describe(&amp).expect("amp described after the failure");
    assert_eq!(described[0].label, "amp_mono");
    assert_eq!(describer.domains_started(), 2, "a fresh domain after the failure");
    // A library whose constructor crashes the describer's domain: that library fails, the next is described.
    let builtin = ward_extensions::extracted().expect("extract the built-in extensions");
    let crashing = builtin.join("bad_ladspa_ctor_crash.so");
    assert!(describer.describe(&crashing).is_err(), "a library that crashes cannot be described");
    let described = describer.describe(&amp).expect("amp described after the crash");
    assert_eq!(described[0].label, "amp_mono");
    assert_eq!(describer.domains_started(), 3, "a fresh domain after the crash");
}

#[test]
fn the_frei0r_describer_reads_of_every_debian_plugin_what_its_own_domain_reads() {
    let sup = Supervisor::new(Policy::default());
    let describer = frei0r::Describer::new(Policy::default());
    let mut compared = 0;
    for path in libraries_in(FREI0R_DIR) {
        let own = match frei0r::Library::open(&sup, &path, Some(Isolation::Process)) {
            Ok(library) => library,
            Err(e) => {
                assert!(describer.describe(&path).is_err(), "{}: own domain refused it ({e})", path.display());
                continue;
            }
        };
        let described = describer.describe(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(&described, own.info(), "{}", path.display());
        compared += 1;
    }
    assert!(compared > 10, "only {compared} plugins compared");
    assert_eq!(describer.domains_started(), 1, "one describer domain for every plugin");
}

#[test]
fn a_frei0r_plugin_replaced_on_disk_after_it_was_described_is_refused_by_its_own_domain() {
    let s = Scratch::new("describer", "frei0r-changed");
    let path = s.path("filter.so");
    std::fs::copy(Path::new(FREI0R_DIR).join("invert0r.so"), &path).expect("copy invert0r.so");
    let describer = frei0r::Describer::new(Policy::default());
    let described = describer.describe(&path).expect("invert0r described");
    let sup = Supervisor::new(Policy::default());
    frei0r::Library::open_as_described(&sup, &path, Some(Isolation::Process), &described).expect("unchanged opens");
    std::fs::remove_file(&path).expect("remove");
    std::fs::copy(Path::new(FREI0R_DIR).join("vignette.so"), &path).expect("copy vignette.so");
    match frei0r::Library::open_as_described(&sup, &path, Some(Isolation::Process), &described) {
        Err(ClassError::Changed { what, .. }) => assert!(what.contains("Vignette"), "{what}"),
        other => panic!("a changed plugin must be refused, got {other:?}"),
    }
}
