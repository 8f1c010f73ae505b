//! The cache of descriptions: what a describer read, kept and read back, is what the describer read; an entry is
//! only ever of the very file it was kept for; a directory that is not private is not used. Debian's LADSPA and
//! frei0r plugins come from scripts/deps.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ward::Policy;
use ward_classes::cache::{Described, DescriptionCache, FileIdentity};
use ward_classes::{frei0r, inspect, ladspa, Class};

mod common;
use common::Scratch;

/// The names `path` exports, as the shim passes them.
fn exports(path: &Path) -> Vec<String> {
    inspect(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).exports
}

#[test]
fn what_a_describer_read_comes_back_from_the_cache_only_for_the_same_file() {
    let s = Scratch::new("describe-cache", "round-trip");
    let cache = DescriptionCache::at(s.path("cache"));
    let describer = ladspa::Describer::new(Policy::default());
    for name in ["amp.so", "delay.so", "sine.so", "comb_1190.so"] {
        let path = Path::new("/usr/lib/ladspa").join(name);
        let identity = FileIdentity::of(&path).unwrap_or_else(|e| panic!("{name}: {e}: run scripts/deps"));
        assert!(cache.get(&path, &identity).is_none(), "{name}: nothing kept yet");
        let (plugins, wire) = describer.describe_with_wire(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        cache.put(&path, &identity, Class::Ladspa, &exports(&path), &wire).expect("kept");
        let cached = cache.get(&path, &identity).expect("found");
        assert_eq!(cached.class, Class::Ladspa);
        assert_eq!(cached.entry_points, ["ladspa_descriptor"], "{name}: the class's entry points only");
        assert_eq!(cached.described, Described::Ladspa(plugins), "{name}");
        // The same path with another identity (the file replaced or changed) misses.
        let changed = FileIdentity { changed: (identity.changed.0 + 1, identity.changed.1), ..identity };
        assert!(cache.get(&path, &changed).is_none(), "{name}");
        let replaced = FileIdentity { inode: identity.inode + 1, ..identity };
        assert!(cache.get(&path, &replaced).is_none(), "{name}");
    }

    let path = Path::new("/usr/lib/frei0r-1/invert0r.so");
    let identity = FileIdentity::of(path).expect("invert0r.so: run scripts/deps");
    let (info, wire) = frei0r::Describer::new(Policy::default()).describe_with_wire(path).expect("described");
    cache.put(path, &identity, Class::Frei0r, &exports(path), &wire).expect("kept");
    let cached = cache.get(path, &identity).expect("found");
    assert_eq!(cached.class, Class::Frei0r);
    assert!(cached.entry_points.iter().any(|e| e == "f0r_construct"), "{:?}", cached.entry_points);
    assert_eq!(cached.described, Described::Frei0r(info));
}

#[test]
fn a_cache_directory_that_is_not_private_is_not_used() {
    let s = Scratch::new("describe-cache", "not-private");
    let path = Path::new("/usr/lib/ladspa/amp.so");
    let identity = FileIdentity::of(path).expect("amp.so: run scripts/deps");
    let (_, wire) = ladspa::Describer::new(Policy::default()).describe_with_wire(path).expect("described");
    let open = s.path("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let private = s.path("private");
    let link = s.path("link");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&private, &link).unwrap();
    for dir in [open, link] {
        let cache = DescriptionCache::at(&dir);
        let why = cache.usable().expect_err("refused").to_string();
        assert!(why.contains("not a directory (a symbolic link is none) owned by uid"), "{why}");
        assert!(cache.put(path, &identity, Class::Ladspa, &exports(path), &wire).is_err());
        assert!(cache.get(path, &identity).is_none());
    }
    assert_eq!(std::fs::read_dir(&private).unwrap().count(), 0, "nothing written through the link");
    // A directory it makes is private.
    let made = s.path("made/ward");
    DescriptionCache::at(&made).usable().expect("made");
    assert_eq!(std::fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o700);
}
