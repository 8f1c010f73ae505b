//! `restart_from` through a class adapter: the adapter opens the plugin by path inside the domain, so after a
//! failure ward rewrites that open (the recorded one it replays, and the one in flight when the open itself failed)
//! to the good file. A broken build of the built-in faulty_ladspa (one function made to trap) stands for a plugin
//! whose fault does not survive a reload.

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

mod common;

use common::{require_pku, switched_to};
use ward::{Event, Isolation, Policy, Supervisor};
use ward_classes::ladspa::{Library, PortBuffer};
use ward_classes::Processed;

const N: usize = 64;
const GAIN: f32 = 0.5;

fn good() -> PathBuf {
    ward_extensions::path_of("faulty_ladspa").expect("the built-in faulty_ladspa extracts")
}

/// A copy of faulty_ladspa whose `function` traps, in a directory of its own, under the same file name.
fn broken(test: &str, function: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ward-classes-restart-from-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(good().file_name().unwrap());
    ward_extensions::copy_with_trap(&good(), function, &path).unwrap();
    path
}

fn open(path: &Path, restart_from: Option<&Path>, isolation: Isolation) -> (Supervisor, Library, Receiver<Event>) {
    let key = restart_from.map(|p| format!("restart_from = {p:?}\n")).unwrap_or_default();
    let text = format!("[extension.faulty_ladspa]\n{key}");
    let sup = Supervisor::new(Policy::from_toml_str(&text, "restart_from policy").unwrap());
    let events = sup.subscribe();
    let lib = Library::open(&sup, path, Some(isolation)).expect("the library opens");
    (sup, lib, events)
}

/// One block of faulty_amp (no fault armed) on a fresh, activated instance: what it processed and its output.
fn amp_block(lib: &Library) -> (Processed, Vec<f32>) {
    let index = lib.plugin("faulty_amp").unwrap().index;
    let mut inst = lib.instantiate(index, 48000).unwrap();
    inst.activate().unwrap();
    let input: Vec<f32> = (0..N).map(|i| (i as f32 - 32.0) / 8.0).collect();
    let mut out = vec![0.0f32; N];
    let (gain, kind, at, repeat) = ([GAIN], [0.0f32], [1.0f32], [0.0f32]);
    let mut blocks = [0.0f32];
    let mut ports = [
        PortBuffer::Input(&input),
        PortBuffer::Output(&mut out),
        PortBuffer::Input(&gain),
        PortBuffer::Input(&kind),
        PortBuffer::Input(&at),
        PortBuffer::Input(&repeat),
        PortBuffer::Output(&mut blocks),
    ];
    let processed = inst.run(N, &mut ports).expect("a block never fails the host");
    (processed, out)
}

fn expected() -> Vec<f32> {
    (0..N).map(|i| (i as f32 - 32.0) / 8.0 * GAIN).collect()
}

#[test]
fn a_library_that_crashes_when_opened_is_reopened_from_the_good_file() {
    let path = broken("open", "ladspa_descriptor");
    let (_sup, lib, events) = open(&path, Some(&good()), Isolation::Process);
    assert_eq!(amp_block(&lib), (Processed::Ran, expected()));
    assert_eq!(switched_to(&events), [good()]);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn a_plugin_that_crashes_in_run_is_restarted_from_the_good_file_and_the_block_retried() {
    let path = broken("run", "amp_run");
    let (_sup, lib, events) = open(&path, Some(&good()), Isolation::Process);
    assert_eq!(amp_block(&lib), (Processed::Ran, expected()), "retried on the good build: the plugin's own output");
    assert_eq!(switched_to(&events), [good()]);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn without_restart_from_the_broken_plugin_is_bypassed() {
    let path = broken("bypass", "amp_run");
    let (_sup, lib, events) = open(&path, None, Isolation::Process);
    let (processed, out) = amp_block(&lib);
    assert!(matches!(processed, Processed::Bypassed { .. }), "{processed:?}");
    assert_ne!(out, expected());
    assert!(switched_to(&events).is_empty());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

// In an mpk domain the plugin is loaded with the adapter, and its `dlopen` opens only what was loaded: the restart
// must load the good file for the rewritten open to find it.

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_a_library_that_crashes_when_opened_is_reopened_from_the_good_file() {
    require_pku();
    let path = broken("mpk-open", "ladspa_descriptor");
    let (_sup, lib, events) = open(&path, Some(&good()), Isolation::Mpk);
    assert_eq!(amp_block(&lib), (Processed::Ran, expected()));
    assert_eq!(switched_to(&events), [good()]);
    assert_eq!(lib.extension().isolation(), Isolation::Mpk, "recovered in mpk, not by escalating to a process");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_a_plugin_that_crashes_in_run_is_restarted_from_the_good_file() {
    require_pku();
    let path = broken("mpk-run", "amp_run");
    let (_sup, lib, events) = open(&path, Some(&good()), Isolation::Mpk);
    assert_eq!(amp_block(&lib), (Processed::Ran, expected()), "retried on the good build: the plugin's own output");
    assert_eq!(switched_to(&events), [good()]);
    assert_eq!(lib.extension().isolation(), Isolation::Mpk, "recovered in mpk, not by escalating to a process");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn a_plugin_whose_initialiser_crashes_is_reopened_from_the_good_file() {
    let path = broken("init", "faulty_ladspa_loaded");
    let (_sup, lib, events) = open(&path, Some(&good()), Isolation::Process);
    assert_eq!(amp_block(&lib), (Processed::Ran, expected()));
    assert_eq!(switched_to(&events), [good()]);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

// An mpk domain loads the plugin with its adapter, initialisers included: a crash there happens while the domain
// is made, and with `restart_from` the domain starts from the good file instead.
#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_a_plugin_whose_initialiser_crashes_starts_from_the_good_file() {
    require_pku();
    let path = broken("mpk-init", "faulty_ladspa_loaded");
    let (_sup, lib, events) = open(&path, Some(&good()), Isolation::Mpk);
    assert_eq!(amp_block(&lib), (Processed::Ran, expected()));
    let all: Vec<Event> = events.try_iter().collect();
    assert!(all.iter().any(|e| matches!(e, Event::Fault { .. })), "the initialiser's fault is reported: {all:?}");
    assert!(
        all.iter().any(|e| matches!(e, Event::ImageSwitched { path, .. } if *path == good())),
        "the domain started from the good file: {all:?}"
    );
    assert_eq!(lib.extension().isolation(), Isolation::Mpk);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
#[ignore = "needs PKU"]
fn in_an_mpk_domain_without_restart_from_a_crashing_initialiser_fails_the_load_and_says_so() {
    require_pku();
    let path = broken("mpk-init-alone", "faulty_ladspa_loaded");
    let sup = Supervisor::new(Policy::default());
    let Err(e) = Library::open(&sup, &path, Some(Isolation::Mpk)) else { panic!("the load must fail") };
    let message = e.to_string();
    assert!(message.contains("initialiser") && message.contains("faulted"), "{message}");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
