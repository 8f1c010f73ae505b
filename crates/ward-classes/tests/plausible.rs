//! A plugin whose description is impossible (here a name with a control character, as a corrupted pointer or a
//! faulty build gives) is a bad call: the class declares a fault, ward restarts the extension and the description is
//! read again. With `restart_from` the second reading comes from the good build and the host never sees the bad
//! words; without it the same bad description comes back and the plugin is refused with the reason.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

mod common;

use common::switched_to;
use ward::{Event, Isolation, Policy, Supervisor};
use ward_classes::{frei0r, ladspa, ClassError};

fn good(name: &str) -> PathBuf {
    ward_extensions::path_of(name).expect("the built-in extracts")
}

/// A copy of the built-in `name` with the string `from` (NUL-terminated in the file) replaced by `to` of the same
/// length, in a directory of its own, under the same file name.
fn patched(test: &str, name: &str, from: &str, to: &str) -> PathBuf {
    assert_eq!(from.len(), to.len());
    let dir = std::env::temp_dir().join(format!("ward-classes-plausible-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(good(name).file_name().unwrap());
    let mut bytes = std::fs::read(good(name)).unwrap();
    let needle = [from.as_bytes(), b"\0"].concat();
    let mut replaced = 0;
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(needle.len()).position(|w| w == needle.as_slice()) {
        bytes[at + i..at + i + to.len()].copy_from_slice(to.as_bytes());
        at += i + needle.len();
        replaced += 1;
    }
    assert!(replaced > 0, "{from:?} not found in {name}");
    std::fs::write(&path, bytes).unwrap();
    path
}

fn supervisor(extension: &str, restart_from: Option<&Path>) -> (Supervisor, Receiver<Event>) {
    let key = restart_from.map(|p| format!("restart_from = {p:?}\n")).unwrap_or_default();
    let text = format!("[extension.{extension}]\n{key}");
    let sup = Supervisor::new(Policy::from_toml_str(&text, "plausible policy").unwrap());
    let events = sup.subscribe();
    (sup, events)
}

#[test]
fn a_ladspa_label_with_a_control_character_is_read_again_from_the_good_build() {
    let path = patched("ladspa-good", "faulty_ladspa", "faulty_amp", "faulty\u{7}amp");
    let (sup, events) = supervisor("faulty_ladspa", Some(&good("faulty_ladspa")));
    let lib = ladspa::Library::open(&sup, &path, Some(Isolation::Process)).expect("reopened from the good build");
    assert!(lib.plugin("faulty_amp").is_ok(), "{:?}", lib.plugins().iter().map(|p| &p.label).collect::<Vec<_>>());
    assert_eq!(switched_to(&events), [good("faulty_ladspa")]);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn a_ladspa_label_with_a_control_character_twice_is_refused_with_the_reason() {
    let path = patched("ladspa-refused", "faulty_ladspa", "faulty_amp", "faulty\u{7}amp");
    let (sup, events) = supervisor("faulty_ladspa", None);
    let err = ladspa::Library::open(&sup, &path, Some(Isolation::Process)).unwrap_err();
    assert!(matches!(err, ClassError::BadPlugin { .. }), "{err:?}");
    assert!(err.to_string().contains("control character 0x07"), "{err}");
    assert!(switched_to(&events).is_empty());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn a_frei0r_name_with_a_control_character_is_read_again_from_the_good_build() {
    let path = patched("frei0r-good", "faulty_frei0r", "faulty_invert", "faulty\u{1b}invert");
    let (sup, events) = supervisor("faulty_frei0r", Some(&good("faulty_frei0r")));
    let lib = frei0r::Library::open(&sup, &path, Some(Isolation::Process)).expect("reopened from the good build");
    assert_eq!(lib.info().name, "faulty_invert");
    assert_eq!(switched_to(&events), [good("faulty_frei0r")]);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn a_frei0r_name_with_a_control_character_twice_is_refused_with_the_reason() {
    let path = patched("frei0r-refused", "faulty_frei0r", "faulty_invert", "faulty\u{1b}invert");
    let (sup, _events) = supervisor("faulty_frei0r", None);
    let err = frei0r::Library::open(&sup, &path, Some(Isolation::Process)).unwrap_err();
    assert!(matches!(err, ClassError::BadPlugin { .. }), "{err:?}");
    assert!(err.to_string().contains("control character 0x1b"), "{err}");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
