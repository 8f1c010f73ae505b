//! Policy `poison`: a generic extension's functions are called with poison in every register and stack slot they
//! are not given, so what a faulty function finds there is the poison, not what the domain left.

mod common;

use common::*;
use ward::{Arg, Error, Isolation, Policy, RetType, Supervisor, Value};

const POISON: u64 = 0xfffa_fffa_fffa_fffa;

fn stale(policy: &str, isolation: Isolation) -> Result<(Supervisor, ward::Extension), Error> {
    let sup = Supervisor::new(Policy::from_toml_str(policy, "test").unwrap());
    let ext = sup.load_with(builtin("stale"), Some(isolation))?;
    Ok((sup, ext))
}

fn u64_call(ext: &ward::Extension, f: &str, args: &mut [Arg<'_>]) -> u64 {
    i64_call(ext, f, args) as u64
}

#[test]
fn a_poisoned_function_finds_poison_in_what_it_was_not_given() {
    let (_sup, ext) = stale("[extension.stale]\npoison = true\n", Isolation::Process).unwrap();
    assert_eq!(u64_call(&ext, "stale_rbx", &mut []), POISON, "callee-saved rbx");
    assert_eq!(u64_call(&ext, "stale_r15", &mut []), POISON, "callee-saved r15");
    assert_eq!(u64_call(&ext, "stale_second_arg", &mut [Arg::I64(7)]), POISON, "an argument register not given");
    assert_eq!(u64_call(&ext, "stale_stack_8k", &mut []), POISON, "the stack below its frame");
    assert_eq!(u64_call(&ext, "stale_first_arg", &mut [Arg::I64(7)]), 7, "its own argument, intact");
}

#[test]
fn without_the_policy_it_finds_what_the_domain_left() {
    let (_sup, ext) = stale("", Isolation::Process).unwrap();
    assert_ne!(u64_call(&ext, "stale_second_arg", &mut [Arg::I64(7)]), POISON);
    assert_ne!(u64_call(&ext, "stale_stack_8k", &mut []), POISON);
}

#[test]
fn poisoned_calls_of_a_correct_extension_give_the_same_results() {
    let sup = Supervisor::new(Policy::from_toml_str("[defaults]\npoison = true\n", "test").unwrap());
    let ext = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    assert_eq!(i64_call(&ext, "well_add", &mut [Arg::I64(-5), Arg::I64(3)]), -2);
    let fma = ext.call("well_fma", &mut [Arg::F64(1.5), Arg::F64(2.0), Arg::F64(0.25)], RetType::F64).unwrap();
    assert_eq!(fma, Value::F64(3.25));
    let half = ext.call("well_halve", &mut [Arg::F32(3.0)], RetType::F32).unwrap();
    assert_eq!(half, Value::F32(1.5));
    let mut out = [0u8; 5];
    ext.call("well_copy", &mut [Arg::In(b"poison"), Arg::Out(&mut out), Arg::I64(5)], RetType::Void).unwrap();
    assert_eq!(&out, b"poiso");
    // Deferred calls go through the same trampoline in batches; the synchronous call after them sees their effect.
    let add = ext.function("counter_add").unwrap();
    for _ in 0..10 {
        add.defer(&[Arg::I64(3)]).unwrap();
    }
    assert_eq!(i64_call(&ext, "counter_get", &mut []), 30);
}

#[test]
fn poison_outside_a_process_domain_is_refused_at_load() {
    let err = stale("[extension.stale]\npoison = true\n", Isolation::None).err().expect("refused");
    assert!(matches!(err, Error::PoisonNeedsProcess { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("extension stale has poison = true") && text.contains("isolation `none`"), "{text}");
}

#[test]
fn a_bad_poison_value_is_refused_with_its_line() {
    let err = Policy::from_toml_str("[defaults]\nspin = 1\npoison = \"yes\"\n", "p.toml").unwrap_err().to_string();
    assert!(err.contains("p.toml:3:") && err.contains("poison must be true or false"), "{err}");
    let err = Policy::from_toml_str("[group.g]\npoison = true\n", "p.toml").unwrap_err().to_string();
    assert!(err.contains("`poison` is set per extension"), "{err}");
}
