//! The LADSPA class on a real plugin library (ladspa-sdk's amp.so, installed by scripts/deps) under every
//! isolation kind this build has.

use std::path::Path;

use ward::{Isolation, Policy, Supervisor};
use ward_classes::ladspa::{Library, PortBuffer};
use ward_classes::{ClassError, Processed};

const AMP: &str = "/usr/lib/ladspa/amp.so";

fn amp() -> &'static Path {
    let path = Path::new(AMP);
    assert!(path.exists(), "{AMP} is missing: run scripts/deps (it installs ladspa-sdk)");
    path
}

#[test]
fn amp_descriptors_read_through_the_domain() {
    let sup = Supervisor::new(Policy::default());
    for iso in [Isolation::None, Isolation::Process] {
        let lib = Library::open(&sup, amp(), Some(iso)).unwrap();
        let labels: Vec<&str> = lib.plugins().iter().map(|d| d.label.as_str()).collect();
        assert_eq!(labels, ["amp_mono", "amp_stereo"], "{iso:?}");
        let mono = lib.plugin("amp_mono").unwrap();
        assert_eq!(mono.unique_id, 1048);
        assert_eq!(mono.ports.len(), 3);
        assert_eq!(mono.ports[0].name, "Gain");
        assert!(mono.ports[0].is_input() && mono.ports[0].is_control());
        assert_eq!(mono.ports[0].default_value(48000), Some(1.0));
        assert!(mono.ports[2].is_output() && mono.ports[2].is_audio());
    }
}

#[test]
fn amp_processes_identically_under_none_and_process() {
    let sup = Supervisor::new(Policy::default());
    let input: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.01).sin()).collect();
    let mut results = Vec::new();
    for iso in [Isolation::None, Isolation::Process] {
        let lib = Library::open(&sup, amp(), Some(iso)).unwrap();
        let mut inst = lib.instantiate(0, 48000).unwrap();
        assert_eq!(inst.activate().unwrap(), Processed::Ran);
        let gain = [0.5f32];
        let mut out = vec![0f32; input.len()];
        let outcome = inst
            .run(input.len(), &mut [PortBuffer::Input(&gain), PortBuffer::Input(&input), PortBuffer::Output(&mut out)])
            .unwrap();
        assert_eq!(outcome, Processed::Ran);
        results.push(out);
    }
    let expected: Vec<f32> = input.iter().map(|x| x * 0.5).collect();
    assert_eq!(results[0], expected);
    assert_eq!(results[1], expected);
}

#[test]
fn wrong_port_buffers_are_the_hosts_error() {
    let sup = Supervisor::new(Policy::default());
    let lib = Library::open(&sup, amp(), Some(Isolation::Process)).unwrap();
    let mut inst = lib.instantiate(0, 48000).unwrap();
    let gain = [1.0f32];
    let short = [0f32; 10];
    let mut out = [0f32; 100];
    let err = inst.run(100, &mut [PortBuffer::Input(&gain), PortBuffer::Input(&short), PortBuffer::Output(&mut out)]);
    assert!(matches!(err, Err(ClassError::BadArguments { .. })), "{err:?}");
    let err = inst.run(10, &mut [PortBuffer::Input(&gain), PortBuffer::Output(&mut out)]);
    assert!(matches!(err, Err(ClassError::BadArguments { .. })), "{err:?}");
}

#[test]
fn a_library_that_is_no_ladspa_plugin_is_refused_by_name() {
    let sup = Supervisor::new(Policy::default());
    let well = ward_extensions::path_of("well").unwrap();
    let err = Library::open(&sup, &well, Some(Isolation::Process)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ClassError::NotAPlugin { .. }), "{msg}");
    assert!(msg.contains("well.so") && msg.contains("LADSPA"), "{msg}");
    let err = Library::open(&sup, Path::new("/nonexistent/x.so"), Some(Isolation::Process)).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/x.so"), "{err}");
}
