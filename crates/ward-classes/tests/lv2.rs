//! The LV2 class on real plugin binaries from Debian (swh-lv2, x42-plugins; installed by scripts/deps) under every
//! isolation kind this build runs them in.

use std::path::Path;
use std::sync::Arc;

use ward::{Isolation, Policy, Supervisor};
use ward_classes::lv2::{Features, Library, PortBuffer, PortKind, PortSpec, Setup, UridMap};
use ward_classes::Processed;

const SWH_AMP: &str = "/usr/lib/lv2/amp-swh.lv2/plugin-linux.so";

fn installed(path: &str) -> &Path {
    let p = Path::new(path);
    assert!(p.exists(), "{path} is missing: run scripts/deps (it installs Debian's LV2 plugin packages)");
    p
}

fn port(kind: PortKind, output: bool) -> PortSpec {
    PortSpec { kind, output, connection_optional: false }
}

fn amp_setup() -> Setup {
    Setup {
        sample_rate: 48000.0,
        bundle: "/usr/lib/lv2/amp-swh.lv2".into(),
        ports: vec![port(PortKind::Control, false), port(PortKind::Audio, false), port(PortKind::Audio, true)],
        features: Features::default(),
        host: Arc::new(UridMap::new()),
        realtime: false,
    }
}

#[test]
fn swh_amp_is_described_and_amplifies_exactly_under_none_and_process() {
    let sup = Supervisor::new(Policy::default());
    let input: Vec<f32> = (0..1024).map(|i| ((i as f32) * 0.01).sin() * 0.5).collect();
    for iso in [Isolation::None, Isolation::Process] {
        let lib = Library::open(&sup, installed(SWH_AMP), Some(iso)).unwrap();
        let d = lib.plugin("http://plugin.org.uk/swh-plugins/amp").unwrap();
        assert!(d.has_run, "{iso:?}");
        let inst = lib.instantiate(d.index, amp_setup()).unwrap();
        assert_eq!(inst.activate().unwrap(), Processed::Ran);
        let gain = [20.0f32];
        let mut out = vec![0f32; 256];
        for block in input.chunks(256) {
            let mut ports = [PortBuffer::Input(&gain), PortBuffer::Input(block), PortBuffer::Output(&mut out)];
            assert_eq!(inst.run(block.len(), &mut ports).unwrap(), Processed::Ran, "{iso:?}");
            let want: Vec<f32> = block.iter().map(|x| x * 10.0).collect();
            assert_eq!(out, want, "{iso:?}: +20 dB is a gain of exactly 10");
        }
    }
}

#[test]
fn a_buffer_of_the_wrong_kind_or_length_is_refused_before_the_domain_sees_it() {
    let sup = Supervisor::new(Policy::default());
    let lib = Library::open(&sup, installed(SWH_AMP), Some(Isolation::Process)).unwrap();
    let inst = lib.instantiate(0, amp_setup()).unwrap();
    let gain = [0.0f32];
    let input = [0.0f32; 64];
    let mut out = [0f32; 32];
    let mut short = [PortBuffer::Input(&gain), PortBuffer::Input(&input), PortBuffer::Output(&mut out)];
    assert!(inst.run(64, &mut short).is_err());
    let mut atom = [0u8; 64];
    let mut wrong = [PortBuffer::Input(&gain), PortBuffer::Input(&input), PortBuffer::AtomOutput(&mut atom)];
    assert!(inst.run(64, &mut wrong).is_err());
}

/// swh's amp with a gain of 1000 dB writes infinity natively on every block: under the default policy (output checks on) the
/// first such block costs one recovery; the same output again from the recovered domain is the plugin's own and is
/// passed on from then on, as natively, with no more faults.
#[test]
fn a_plugin_whose_own_output_is_infinite_costs_one_recovery_then_has_it_passed_on() {
    for realtime in [false, true] {
        let sup = Supervisor::new(Policy::default());
        let events = sup.subscribe();
        let lib = Library::open(&sup, installed(SWH_AMP), Some(Isolation::Process)).unwrap();
        assert!(lib.extension().policy().check_output, "output checks are on by default");
        let inst = lib.instantiate(0, Setup { realtime, ..amp_setup() }).unwrap();
        assert_eq!(inst.activate().unwrap(), Processed::Ran);
        let gain = [1000.0f32];
        let input = [0.25f32; 64];
        let mut out = [0f32; 64];
        let (mut passed, mut bypassed) = (0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while passed < 3 {
            assert!(std::time::Instant::now() < deadline, "realtime {realtime}: no block passed on");
            let mut ports = [PortBuffer::Input(&gain), PortBuffer::Input(&input), PortBuffer::Output(&mut out)];
            match inst.run(64, &mut ports).unwrap() {
                Processed::Ran => {
                    assert!(
                        out.iter().all(|v| v.is_infinite()),
                        "realtime {realtime}: the plugin's own output: {out:?}"
                    );
                    passed += 1;
                }
                // On the real-time thread the first infinite block is bypassed while the domain recovers apart.
                other => {
                    assert!(realtime, "{other:?}");
                    bypassed += 1;
                }
            }
        }
        let seen: Vec<ward::Event> = events.try_iter().collect();
        let faults = seen.iter().filter(|e| matches!(e, ward::Event::Fault { .. })).count();
        let own = seen.iter().filter(|e| matches!(e, ward::Event::OwnOutput { .. })).count();
        assert_eq!((faults, own), (1, 1), "realtime {realtime}: {seen:?}");
        assert_eq!(lib.extension().stats().restarts, 1, "realtime {realtime}");
        if realtime {
            assert!(bypassed >= 1, "the first infinite block is bypassed on the real-time thread");
        }
    }
}
