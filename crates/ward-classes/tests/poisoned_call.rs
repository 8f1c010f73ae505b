//! The class adapters call a plugin with every register and stack slot it was not given set to a poison value, so a
//! faulty plugin that reads one (a dropped parameter load, a local never initialised) faults instead of returning a
//! wrong value. The built-in stale_ladspa plugin reports what it finds in the callee-saved registers, in an argument
//! register its function does not take, and on the stack below its frame.

use ward::{Isolation, Policy, Supervisor};
use ward_classes::ladspa::{Library, PortBuffer};

/// The poison's low 32 bits, as the probe reports them (a quiet NaN as a float).
const POISON_LOW: u32 = 0xfffa_fffa;
const PROBES: [&str; 9] = ["rbx", "rbp", "r12", "r13", "r14", "r15", "rdx", "stack 1 KiB below", "stack 8 KiB below"];

fn found(isolation: Isolation) -> Vec<(String, u32)> {
    let sup = Supervisor::new(Policy::default());
    let path = ward_extensions::path_of("stale_ladspa").expect("the built-in stale_ladspa extracts");
    let lib = Library::open(&sup, &path, Some(isolation)).expect("the probe opens");
    let plugin = lib.plugin("stale_probe").expect("the probe describes itself");
    let names: Vec<String> = plugin.ports.iter().map(|p| p.name.clone()).collect();
    assert_eq!(names, PROBES);
    let mut inst = lib.instantiate(plugin.index, 48000).unwrap();
    inst.activate().unwrap();
    let mut values = [[0.0f32]; 9];
    let mut ports: Vec<PortBuffer<'_>> = values.iter_mut().map(|v| PortBuffer::Output(v)).collect();
    inst.run(1, &mut ports).expect("a block never fails the host");
    drop(ports);
    names.into_iter().zip(values.iter().map(|v| v[0].to_bits())).collect()
}

fn assert_all_poisoned(isolation: Isolation) {
    for (name, bits) in found(isolation) {
        assert_eq!(bits, POISON_LOW, "{name} under {isolation:?}: {bits:#010x}");
    }
}

#[test]
fn a_plugin_in_a_domain_process_finds_poison_in_what_it_was_not_given() {
    assert_all_poisoned(Isolation::Process);
}

#[test]
fn a_plugin_in_the_host_finds_poison_too() {
    // Under `none` the adapter runs in the host itself: its call into the plugin poisons the same way, and the host's
    // own registers are saved and restored around it.
    assert_all_poisoned(Isolation::None);
}
