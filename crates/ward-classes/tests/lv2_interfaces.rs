//! The LV2 interfaces ward wraps rather than passes: `options:interface` (get and set copied through the domain, an
//! implausible answer a fault, a set replayed after a restart) and the state extension's path features (`mapPath`,
//! `makePath`, `freePath`: the plugin's calls reach the host's functions), on the built-in `lv2_options` in a
//! process domain.

use std::sync::{Arc, Mutex};

use ward::{Event, Isolation, Policy, Supervisor};
use ward_classes::lv2::bundle;
use ward_classes::lv2::{
    Features, Host, Instance, Library, OptionKey, OptionValue, PathFeatures, PortBuffer, PortSpec, Setup, UridMap,
};
use ward_classes::Processed;

const URI: &str = "urn:ward:lv2:options";
const GAIN: &str = "urn:ward:lv2:options#gain";
const FILE: &str = "urn:ward:lv2:options#file";
const SCRATCH: &str = "urn:ward:lv2:options#scratch";
const IMPLAUSIBLE: &str = "urn:ward:lv2:options#implausible";
const ATOM_FLOAT: &str = "http://lv2plug.in/ns/ext/atom#Float";
const ATOM_PATH: &str = "http://lv2plug.in/ns/ext/atom#Path";
const BLOCK: usize = 64;
/// options:interface's status bits.
const BAD_KEY: u32 = 4;
const BAD_VALUE: u32 = 8;

/// A host with a URID map and path functions of its own, which says what it was asked: abstract paths are the
/// absolute ones under `/session/` made relative, and `ABSTRACT:` before anything else; makePath answers under
/// `/session/scratch/`.
#[derive(Default)]
struct PathHost {
    map: UridMap,
    asked: Mutex<Vec<String>>,
    logged: Mutex<Vec<String>>,
}

impl PathHost {
    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

impl Host for PathHost {
    fn map(&self, uri: &str) -> u32 {
        self.map.map(uri)
    }
    fn unmap(&self, urid: u32) -> Option<String> {
        self.map.unmap(urid)
    }
    fn log(&self, _log_type: u32, message: &str) {
        self.logged.lock().unwrap().push(message.to_string());
    }
    fn abstract_path(&self, absolute: &str) -> Option<String> {
        self.asked.lock().unwrap().push(format!("abstract {absolute}"));
        Some(match absolute.strip_prefix("/session/") {
            Some(inside) => inside.to_string(),
            None => format!("ABSTRACT:{absolute}"),
        })
    }
    fn absolute_path(&self, abstract_path: &str) -> Option<String> {
        self.asked.lock().unwrap().push(format!("absolute {abstract_path}"));
        Some(match abstract_path.strip_prefix("ABSTRACT:") {
            Some(absolute) => absolute.to_string(),
            None => format!("/session/{abstract_path}"),
        })
    }
    fn make_path(&self, path: &str) -> Option<String> {
        self.asked.lock().unwrap().push(format!("make {path}"));
        Some(format!("/session/scratch/{path}"))
    }
}

struct Plugin {
    lib: Library,
    host: Arc<PathHost>,
    events: std::sync::mpsc::Receiver<Event>,
}

fn open(policy: &str) -> Plugin {
    let sup = Supervisor::new(Policy::from_toml_str(policy, "test policy").unwrap());
    let events = sup.subscribe();
    let binary = ward_extensions::lv2_bundle_of("lv2_options").unwrap().join("lv2_options.so");
    let lib = Library::open(&sup, &binary, Some(Isolation::Process)).unwrap();
    Plugin { lib, host: Arc::new(PathHost::default()), events }
}

impl Plugin {
    fn instantiate(&self, paths: PathFeatures) -> Instance {
        let dir = ward_extensions::lv2_bundle_of("lv2_options").unwrap();
        let infos = bundle::plugins_of_binary(&dir.join("lv2_options.so")).unwrap();
        let info = infos.iter().find(|i| i.uri == URI).unwrap();
        let setup = Setup {
            sample_rate: 48000.0,
            bundle: dir,
            ports: info.ports.iter().map(PortSpec::from).collect(),
            features: Features { urid_map: true, urid_unmap: true, log: true, paths, ..Features::default() },
            host: Arc::clone(&self.host) as Arc<dyn Host>,
            realtime: false,
        };
        let d = self.lib.plugin(URI).unwrap().clone();
        assert!(d.has_options && d.has_state, "the descriptor says which interfaces the plugin has");
        let inst = self.lib.instantiate(d.index, setup).unwrap();
        assert_eq!(inst.activate().unwrap(), Processed::Ran);
        inst
    }

    fn key(&self, uri: &str) -> OptionKey {
        OptionKey { context: 0, subject: 0, key: self.host.map(uri) }
    }

    fn float(&self, key: &str, value: f32) -> OptionValue {
        OptionValue {
            context: 0,
            subject: 0,
            key: self.host.map(key),
            value_type: self.host.map(ATOM_FLOAT),
            value: value.to_ne_bytes().to_vec(),
        }
    }

    fn path(&self, key: &str, path: &str) -> OptionValue {
        let mut value = path.as_bytes().to_vec();
        value.push(0);
        OptionValue { context: 0, subject: 0, key: self.host.map(key), value_type: self.host.map(ATOM_PATH), value }
    }

    fn gain(&self, inst: &Instance) -> f32 {
        let got = inst.get_options(&[self.key(GAIN)]).unwrap();
        assert_eq!(got.status, 0);
        let v = got.values[0].as_ref().expect("the gain is answered");
        assert_eq!(v.value_type, self.host.map(ATOM_FLOAT));
        f32::from_ne_bytes(v.value[..].try_into().expect("4 bytes"))
    }

    fn string(&self, inst: &Instance, key: &str) -> String {
        let got = inst.get_options(&[self.key(key)]).unwrap();
        assert_eq!(got.status, 0);
        let v = got.values[0].as_ref().expect("the path is answered");
        assert_eq!(v.value_type, self.host.map(ATOM_PATH));
        let (nul, text) = v.value.split_last().expect("a C string");
        assert_eq!(*nul, 0);
        String::from_utf8(text.to_vec()).unwrap()
    }
}

/// One block of a ramp through the instance: the output.
fn block(inst: &Instance) -> Vec<f32> {
    let input: Vec<f32> = (0..BLOCK).map(|i| i as f32 / 8.0).collect();
    let mut out = vec![0f32; BLOCK];
    let mut ports = [PortBuffer::Input(&input), PortBuffer::Output(&mut out)];
    assert_eq!(inst.run(BLOCK, &mut ports).unwrap(), Processed::Ran);
    out
}

fn ramp_times(gain: f32) -> Vec<f32> {
    (0..BLOCK).map(|i| i as f32 / 8.0 * gain).collect()
}

#[test]
fn options_are_got_and_set_through_the_domain() {
    let p = open("");
    let inst = p.instantiate(PathFeatures::default());
    assert_eq!(p.gain(&inst), 1.0);
    assert_eq!(block(&inst), ramp_times(1.0));
    assert_eq!(inst.set_options(&[p.float(GAIN, 0.5)]).unwrap(), 0);
    assert_eq!(p.gain(&inst), 0.5, "the set reached the plugin");
    assert_eq!(block(&inst), ramp_times(0.5), "and the plugin uses it");
    assert_eq!(inst.set_options(&[p.path(FILE, "/data/take.wav")]).unwrap(), 0);
    assert_eq!(p.string(&inst, FILE), "/data/take.wav");

    // What the plugin refuses comes back as its status, and changes nothing.
    let wrong_type = OptionValue { value_type: p.host.map(ATOM_PATH), ..p.float(GAIN, 3.0) };
    assert_eq!(inst.set_options(&[wrong_type]).unwrap(), BAD_VALUE);
    assert_eq!(inst.set_options(&[p.float(SCRATCH, 1.0)]).unwrap(), BAD_KEY, "scratch is read-only");
    assert_eq!(inst.set_options(&[p.float(GAIN, f32::NAN)]).unwrap(), BAD_VALUE);
    assert_eq!(p.gain(&inst), 0.5);

    // Several at once, one unknown: the known ones answered, the unknown one not.
    let got = inst.get_options(&[p.key(GAIN), p.key("urn:ward:no-such-option"), p.key(FILE)]).unwrap();
    assert_eq!(got.status, BAD_KEY);
    assert!(got.values[0].is_some() && got.values[1].is_none() && got.values[2].is_some());
}

#[test]
fn a_plugin_without_the_options_interface_has_none() {
    let sup = Supervisor::new(Policy::default());
    let dir = ward_extensions::lv2_bundle_of("lv2_amp").unwrap();
    let binary = dir.join("lv2_amp.so");
    let lib = Library::open(&sup, &binary, Some(Isolation::Process)).unwrap();
    let d = lib.plugin("urn:ward:lv2:amp").unwrap().clone();
    assert!(!d.has_options);
    let infos = bundle::plugins_of_binary(&binary).unwrap();
    let setup = Setup {
        sample_rate: 48000.0,
        bundle: dir,
        ports: infos[0].ports.iter().map(PortSpec::from).collect(),
        features: Features::default(),
        host: Arc::new(UridMap::new()),
        realtime: false,
    };
    let inst = lib.instantiate(d.index, setup).unwrap();
    assert!(inst.get_options(&[OptionKey { context: 0, subject: 0, key: 1 }]).is_err());
    assert!(inst.set_options(&[]).is_err());
}

#[test]
fn an_option_set_before_a_crash_is_in_force_after_it() {
    // No checkpoints: only the shadow log's set can bring the gain back.
    let p = open("[defaults]\ncheckpoint_ms = 0\n");
    let inst = p.instantiate(PathFeatures::default());
    assert_eq!(inst.set_options(&[p.float(GAIN, 0.25)]).unwrap(), 0);
    assert_eq!(block(&inst), ramp_times(0.25));
    let pid = p.lib.extension().pid().expect("a process domain");
    // SAFETY: kill(2) with a pid and a signal number; the pid is the domain process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    assert_eq!(block(&inst), ramp_times(0.25), "the gain set before the crash");
    assert_eq!(p.lib.extension().stats().restarts, 1);
    assert!(p.events.try_iter().any(|e| matches!(e, Event::Recovered { .. })));
    assert_eq!(p.gain(&inst), 0.25);
    // A later set of the same key replaces the earlier one, and is what the next restart replays.
    assert_eq!(inst.set_options(&[p.float(GAIN, 2.0)]).unwrap(), 0);
    let pid = p.lib.extension().pid().expect("a process domain");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    assert_eq!(block(&inst), ramp_times(2.0));
    assert_eq!(p.lib.extension().stats().restarts, 2);
}

#[test]
fn an_implausible_option_answer_is_a_fault_and_the_plugin_is_recovered() {
    let p = open("");
    let inst = p.instantiate(PathFeatures::default());
    let err = inst.get_options(&[p.key(IMPLAUSIBLE)]).unwrap_err();
    assert!(err.to_string().contains("implausibly"), "{err}");
    let faults = p.events.try_iter().filter(|e| matches!(e, Event::Fault { .. })).count();
    assert!(faults >= 1, "the answer was declared a fault");
    assert!(p.lib.extension().stats().restarts >= 1);
}

#[test]
fn paths_go_through_the_hosts_map_on_save_and_restore_and_make_path_at_instantiate() {
    let p = open("");
    let all = PathFeatures { map_path: true, make_path: true, free_path: true };
    let inst = p.instantiate(all);
    assert_eq!(p.host.asked(), ["make scratch.wav"], "makePath at instantiate reached the host");
    assert_eq!(p.string(&inst, SCRATCH), "/session/scratch/scratch.wav", "and its answer the plugin");
    assert_eq!(inst.set_options(&[p.path(FILE, "/session/takes/one.wav")]).unwrap(), 0);
    let state = inst.save().unwrap();
    assert!(p.host.asked().contains(&"abstract /session/takes/one.wav".to_string()));
    assert!(contains(&state, b"takes/one.wav\0") && !contains(&state, b"/session/"), "the abstract path is stored");

    let other = p.instantiate(PathFeatures { make_path: false, ..all });
    assert_eq!(p.string(&other, SCRATCH), "", "no makePath offered: none in the plugin's features");
    assert_eq!(other.restore(&state).unwrap(), Processed::Ran);
    assert!(p.host.asked().contains(&"absolute takes/one.wav".to_string()));
    assert_eq!(p.string(&other, FILE), "/session/takes/one.wav", "the host's absolute path came back");

    // Offered per call (as lilv does), and not at all.
    let plain = p.instantiate(PathFeatures::default());
    assert_eq!(plain.set_options(&[p.path(FILE, "/elsewhere/two.wav")]).unwrap(), 0);
    let asked = p.host.asked().len();
    let unmapped = plain.save().unwrap();
    assert_eq!(p.host.asked().len(), asked, "no mapPath offered: the host is not asked");
    assert!(contains(&unmapped, b"/elsewhere/two.wav\0"));
    let mapped = plain.save_offering(PathFeatures { map_path: true, ..PathFeatures::default() }).unwrap();
    assert!(contains(&mapped, b"ABSTRACT:/elsewhere/two.wav\0"));
    assert_eq!(
        plain.restore_offering(&mapped, PathFeatures { map_path: true, ..PathFeatures::default() }).unwrap(),
        Processed::Ran
    );
    assert_eq!(p.string(&plain, FILE), "/elsewhere/two.wav");
}

#[test]
fn the_plugins_log_reaches_the_host() {
    let p = open("");
    let _inst = p.instantiate(PathFeatures::default());
    assert_eq!(*p.host.logged.lock().unwrap(), ["lv2_options: instantiated at 48000 Hz\n"]);
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
