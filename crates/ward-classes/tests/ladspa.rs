//! The LADSPA class on real plugin libraries (ladspa-sdk's amp.so, swh's comb_1190.so, delay_1898.so and plate_1423.so,
//! installed by scripts/deps) under every isolation kind this build has.

use std::path::Path;

use ward::{Isolation, Policy, Supervisor};
use ward_classes::ladspa::{Library, Placement, PortBuffer};
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

/// Blocks of a comb filter (swh's comb_1190, whose feedback keeps every past block in its state) at its default
/// controls, `kill_before` naming a block before which the domain is killed, as a crash between blocks would.
fn comb_blocks(history_mb: u64, kill_before: Option<usize>) -> Vec<Vec<f32>> {
    const COMB: &str = "/usr/lib/ladspa/comb_1190.so";
    const N: usize = 256;
    assert!(Path::new(COMB).exists(), "{COMB} is missing: run scripts/deps (it installs swh-plugins)");
    let policy = Policy::from_toml_str(&format!("[extension.comb_1190]\nhistory_mb = {history_mb}\n"), "test").unwrap();
    let sup = Supervisor::new(policy);
    let lib = Library::open(&sup, Path::new(COMB), Some(Isolation::Process)).unwrap();
    let plugin = lib.plugins()[0].clone();
    let mut inst = lib.instantiate(0, 48000).unwrap();
    assert_eq!(inst.activate().unwrap(), Processed::Ran);
    let mut outputs = Vec::new();
    for block in 0..6 {
        if kill_before == Some(block) {
            let pid = lib.extension().pid().expect("a process domain");
            // SAFETY: our own domain process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let input: Vec<f32> = (0..N).map(|i| (((block * N + i) as f32) * 0.05).sin()).collect();
        let controls: Vec<[f32; 1]> =
            plugin.ports.iter().map(|p| [p.default_value(48000).unwrap_or(p.lower)]).collect();
        let mut outs: Vec<Vec<f32>> = plugin.ports.iter().map(|_| vec![0f32; N]).collect();
        let mut ports: Vec<PortBuffer<'_>> = plugin
            .ports
            .iter()
            .zip(controls.iter().zip(outs.iter_mut()))
            .map(|(p, (c, o))| match (p.is_input(), p.is_audio()) {
                (true, true) => PortBuffer::Input(&input),
                (true, false) => PortBuffer::Input(c),
                (false, true) => PortBuffer::Output(o),
                (false, false) => PortBuffer::Output(&mut o[..1]),
            })
            .collect();
        assert_eq!(inst.run(N, &mut ports).unwrap(), Processed::Ran, "block {block}");
        drop(ports);
        outputs.extend(outs.into_iter().zip(&plugin.ports).filter(|(_, p)| p.is_output()).map(|(o, _)| o));
    }
    outputs
}

#[test]
fn a_real_plugin_with_memory_resumes_exactly_after_a_crash_when_its_history_is_kept() {
    let uninterrupted = comb_blocks(16, None);
    assert_eq!(comb_blocks(16, Some(4)), uninterrupted, "history replayed: the comb's state is rebuilt exactly");
    let without = comb_blocks(0, Some(4));
    assert_eq!(without[..4], uninterrupted[..4], "the blocks before the crash");
    assert_ne!(without[4..], uninterrupted[4..], "configuration only: the feedback's memory is lost");
}

fn debian(path: &str) -> &Path {
    let path = Path::new(path);
    assert!(path.exists(), "{} is missing: run scripts/deps (it installs swh-plugins)", path.display());
    path
}

/// An output sample the plugin does not write keeps what the host's buffer held, as natively (issue 33). swh's
/// delay_n with a 1 s maximum at 48 kHz has a ring of 65536 samples; its block loop restarts at index 0 when the
/// ring wraps inside a block, so of the seventh block of 10000 samples it writes only the first 5536 samples.
#[test]
fn output_samples_a_plugin_leaves_unwritten_keep_the_hosts_values() {
    let sup = Supervisor::new(Policy::default());
    const BLOCK: usize = 10_000;
    let input: Vec<f32> = (0..BLOCK).map(|i| ((i as f32) * 0.01).sin()).collect();
    let (max_delay, delay) = ([1.0f32], [0.3f32]);
    for iso in [Isolation::None, Isolation::Process] {
        let lib = Library::open(&sup, debian("/usr/lib/ladspa/delay_1898.so"), Some(iso)).unwrap();
        let index = lib.plugin("delay_n").unwrap().index;
        let mut inst = lib.instantiate(index, 48000).unwrap();
        inst.activate().unwrap();
        let mut out = vec![7.0f32; BLOCK];
        for block in 1..=7 {
            out.fill(7.0);
            let mut ports = [
                PortBuffer::Input(&input),
                PortBuffer::Output(&mut out),
                PortBuffer::Input(&max_delay),
                PortBuffer::Input(&delay),
            ];
            assert_eq!(inst.run(BLOCK, &mut ports).unwrap(), Processed::Ran, "{iso:?}: block {block}");
        }
        assert!(out[..5536].iter().all(|&x| x != 7.0), "{iso:?}: the plugin writes the start of the block");
        assert!(out[5536..].iter().all(|&x| x == 7.0), "{iso:?}: the unwritten samples are not the host's");
    }
}

/// A region holding zeros only travels as a flag, and the adapter clears its copy (which held the block before's
/// output): what the plugin leaves unwritten is the host's zeros, bit for bit, while negative zeros, which are not
/// all bits clear, travel as bytes and stay negative. The same delay_n as above, whose seventh block writes only its
/// first 5536 samples after six blocks that write all of theirs (its input never zero); its delay control is
/// zero too.
#[test]
fn output_samples_a_plugin_leaves_unwritten_keep_the_hosts_zeros_bit_for_bit() {
    let sup = Supervisor::new(Policy::default());
    const BLOCK: usize = 10_000;
    let input: Vec<f32> = (0..BLOCK).map(|i| ((i as f32) * 0.01).sin() + 2.0).collect();
    let (max_delay, delay) = ([1.0f32], [0.0f32]);
    for iso in [Isolation::None, Isolation::Process] {
        for zero in [0.0f32, -0.0] {
            let lib = Library::open(&sup, debian("/usr/lib/ladspa/delay_1898.so"), Some(iso)).unwrap();
            let index = lib.plugin("delay_n").unwrap().index;
            let mut inst = lib.instantiate(index, 48000).unwrap();
            inst.activate().unwrap();
            let mut out = vec![zero; BLOCK];
            for block in 1..=7 {
                out.fill(zero);
                let mut ports = [
                    PortBuffer::Input(&input),
                    PortBuffer::Output(&mut out),
                    PortBuffer::Input(&max_delay),
                    PortBuffer::Input(&delay),
                ];
                assert_eq!(inst.run(BLOCK, &mut ports).unwrap(), Processed::Ran, "{iso:?} {zero}: block {block}");
            }
            let what = format!("{iso:?}, the host's buffer filled with {zero:?}");
            assert!(out[..5536].iter().all(|x| x.to_bits() != zero.to_bits()), "{what}: the plugin writes those");
            assert!(out[5536..].iter().all(|x| x.to_bits() == zero.to_bits()), "{what}: the unwritten samples");
        }
    }
}

/// Ports the host runs in place share one buffer in the domain (issue 33): plate reads its input sample again after
/// writing the left output sample (for the right one), so run in place with its left output, as applyplugin runs it,
/// it gives another right output than with separate buffers, as natively.
#[test]
fn a_plugin_run_in_place_through_run_placed_shares_one_buffer_between_input_and_output() {
    let sup = Supervisor::new(Policy::default());
    const BLOCK: usize = 2048;
    let input: Vec<f32> = (0..BLOCK).map(|i| ((i as f32) * 0.01).sin()).collect();
    let controls = [[4.0f32], [0.25], [0.5]];
    for iso in [Isolation::None, Isolation::Process] {
        let lib = Library::open(&sup, debian("/usr/lib/ladspa/plate_1423.so"), Some(iso)).unwrap();
        let index = lib.plugin("plate").unwrap().index;
        let right_output = |in_place: bool| {
            let mut inst = lib.instantiate(index, 48000).unwrap();
            inst.activate().unwrap();
            let (mut shared, mut left, mut right) = (input.clone(), vec![0f32; BLOCK], vec![0f32; BLOCK]);
            for _ in 0..4 {
                shared.copy_from_slice(&input);
                let [a, b, c] = &controls;
                let outcome = if in_place {
                    let mut regions = [
                        PortBuffer::Input(a),
                        PortBuffer::Input(b),
                        PortBuffer::Input(c),
                        PortBuffer::Output(&mut shared),
                        PortBuffer::Output(&mut right),
                    ];
                    let at = |region| Placement { region, offset: 0 };
                    inst.run_placed(BLOCK, &mut regions, &[at(0), at(1), at(2), at(3), at(3), at(4)], false)
                } else {
                    let mut ports = [
                        PortBuffer::Input(a),
                        PortBuffer::Input(b),
                        PortBuffer::Input(c),
                        PortBuffer::Input(&shared),
                        PortBuffer::Output(&mut left),
                        PortBuffer::Output(&mut right),
                    ];
                    inst.run(BLOCK, &mut ports)
                };
                assert_eq!(outcome.unwrap(), Processed::Ran, "{iso:?}");
            }
            assert!(left.iter().chain(&right).all(|x| x.is_finite()), "{iso:?}: plate ran");
            right
        };
        let (in_place, apart) = (right_output(true), right_output(false));
        assert!(in_place != apart, "{iso:?}: run in place, plate mixes what it wrote into its right output");
    }
}
