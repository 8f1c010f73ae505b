//! `restart_from`: after its first failure an extension restarts from another file (a known-good or patched
//! version), its state replayed into that one, and the call in flight is retried there.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use ward::{Arg, Error, Event, Isolation, Policy, RetType, Supervisor};

/// A private directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ward-restart-from-{}-{test}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A copy of `src` at `dst` whose function `symbol` dies of SIGILL when called.
fn broken_copy(src: &Path, symbol: &str, dst: &Path) {
    ward_extensions::copy_with_trap(src, symbol, dst).unwrap();
}

fn load(policy: &str, path: &Path) -> (Supervisor, ward::Extension, std::sync::mpsc::Receiver<Event>) {
    let sup = Supervisor::new(Policy::from_toml_str(policy, "test policy").unwrap());
    let events = sup.subscribe();
    let ext = sup.load_with(path, Some(Isolation::Process)).unwrap();
    (sup, ext, events)
}

/// What the unbroken extension answers after the same state-establishing calls.
fn expected_compute() -> i64 {
    let (_sup, ext, _events) = load(FAULTY_POLICY, &builtin("faulty"));
    i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(12)]);
    i64_call(&ext, "faulty_compute", &mut [Arg::I64(6)])
}

#[test]
fn a_broken_extension_restarts_from_the_good_file_with_its_state_and_the_call_succeeds() {
    let dir = scratch("switch");
    let broken = dir.join("libfaulty.so");
    broken_copy(&builtin("faulty"), "faulty_compute", &broken);
    let policy = FAULTY_POLICY.replacen(
        "[extension.faulty]\n",
        &format!("[extension.faulty]\nrestart_from = {:?}\n", builtin("faulty")),
        1,
    );
    let (_sup, ext, events) = load(&policy, &broken);

    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(5)]), 5);
    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(7)]), 12);
    let value = ext.call("faulty_compute", &mut [Arg::I64(6)], RetType::I64).expect("retried on the good file");
    assert_eq!(value.as_i64(), Some(expected_compute()));
    // The replayed counter lives in the new image.
    assert_eq!(i64_call(&ext, "faulty_counter_get", &mut []), 12);

    let seen: Vec<Event> = events.try_iter().collect();
    let switched: Vec<&PathBuf> = seen
        .iter()
        .filter_map(|e| match e {
            Event::ImageSwitched { path, extension, .. } if extension == "faulty" => Some(path),
            _ => None,
        })
        .collect();
    assert_eq!(switched, [&builtin("faulty")], "{seen:?}");
    assert_eq!(seen.iter().filter(|e| matches!(e, Event::Fault { .. })).count(), 1, "{seen:?}");
    assert!(seen.iter().any(|e| e.to_string().contains("restarts from")), "{seen:?}");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn without_restart_from_the_same_broken_file_fails_again_at_the_retry() {
    let dir = scratch("same");
    let broken = dir.join("libfaulty.so");
    broken_copy(&builtin("faulty"), "faulty_compute", &broken);
    let (_sup, ext, events) = load(FAULTY_POLICY, &broken);

    assert_eq!(i64_call(&ext, "faulty_counter_add", &mut [Arg::I64(12)]), 12);
    let err = ext.call("faulty_compute", &mut [Arg::I64(6)], RetType::I64).expect_err("the retry runs ud2 again");
    assert!(matches!(err, Error::Fault(_)), "{err}");
    let seen: Vec<Event> = events.try_iter().collect();
    assert!(!seen.iter().any(|e| matches!(e, Event::ImageSwitched { .. })), "{seen:?}");
    assert_eq!(seen.iter().filter(|e| matches!(e, Event::Fault { .. })).count(), 2, "{seen:?}");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_restart_from_that_is_not_a_shared_object_is_refused_at_load() {
    let dir = scratch("refused");
    let text = dir.join("notes.txt");
    fs::write(&text, "not a library").unwrap();
    for (target, says) in [(dir.join("missing.so"), "no such file"), (text, "not an ELF shared object")] {
        let policy = format!("[extension.faulty]\nrestart_from = {target:?}\n");
        let sup = Supervisor::new(Policy::from_toml_str(&policy, "test policy").unwrap());
        let err = sup.load_with(builtin("faulty"), Some(Isolation::Process)).expect_err("refused");
        let message = err.to_string();
        assert!(matches!(err, Error::RestartImage { .. }), "{message}");
        assert!(message.contains("restart_from") && message.contains(says), "{message}");
        assert!(message.contains(&target.display().to_string()), "{message}");
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn restart_from_is_per_extension_and_relative_to_the_policy_file() {
    let err = Policy::from_toml_str("[defaults]\nrestart_from = \"x.so\"\n", "p.toml").unwrap_err();
    assert!(err.to_string().contains("put it in [extension.NAME]"), "{err}");
    assert!(err.to_string().starts_with("p.toml:2:"), "{err}");
    let err = Policy::from_toml_str("[group.g]\nrestart_from = \"x.so\"\n", "p.toml").unwrap_err();
    assert!(err.to_string().contains("set per extension"), "{err}");
    let err = Policy::from_toml_str("[extension.a]\nrestart_from = 3\n", "p.toml").unwrap_err();
    assert!(err.to_string().contains("restart_from must be the path of a shared object"), "{err}");

    let dir = scratch("relative");
    let file = dir.join("policy.toml");
    fs::write(&file, "[extension.a]\nrestart_from = \"v2/liba.so\"\n[extension.b]\nrestart_from = \"/abs/libb.so\"\n")
        .unwrap();
    let policy = Policy::from_file(&file).unwrap();
    assert_eq!(policy.for_extension("a").restart_from, Some(dir.join("v2/liba.so")));
    assert_eq!(policy.for_extension("b").restart_from, Some(PathBuf::from("/abs/libb.so")));
    assert_eq!(policy.for_extension("c").restart_from, None);
    let _ = fs::remove_dir_all(&dir);
}
