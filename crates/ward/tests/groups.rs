//! Groups: one process domain for several extensions. A member added while the group runs is loaded into the
//! running process (and its zygote), so the members already there keep their state; one that cannot be loaded is
//! refused and the group goes on without it.

mod common;

use std::path::Path;

use common::*;
use ward::{Arg, Error, Isolation, Policy, Supervisor};

/// `well` and `faulty` in group `g`; well's counter is not marked state-establishing, so only a member that joined
/// without a restart keeps it. `[group.g]` gets `group_extra`.
fn group_policy(group_extra: &str) -> String {
    format!(
        r#"
[group.g]
{group_extra}
[extension.well]
group = "g"
[extension.faulty]
group = "g"
[extension.faulty.function.faulty_counter_add]
state = true
[extension.broken]
group = "g"
[extension.boom]
group = "g"
"#
    )
}

fn group_with_well(group_extra: &str) -> (Supervisor, ward::Extension) {
    let sup = Supervisor::new(Policy::from_toml_str(&group_policy(group_extra), "test").unwrap());
    let well = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    assert_eq!(i64_call(&well, "counter_add", &mut [Arg::I64(20)]), 20);
    (sup, well)
}

fn joins_the_running_process(group_extra: &str) {
    let (sup, well) = group_with_well(group_extra);
    let pid = well.pid();
    let faulty = sup.load_with(builtin("faulty"), Some(Isolation::Process)).unwrap();
    assert_eq!(faulty.domain(), "g");
    assert_eq!(faulty.pid(), pid, "the new member runs in the process that was running");
    assert_eq!(well.stats().restarts, 0);
    assert_eq!(i64_call(&well, "counter_add", &mut [Arg::I64(1)]), 21, "state no replay restores is still there");
    // A fault of the new member restarts the group; the new incarnation has both members.
    assert_eq!(arm_and_compute(&faulty, 1, 0).as_i64(), Some(37));
    assert_ne!(faulty.pid(), pid);
    assert_eq!(i64_call(&faulty, "faulty_counter_get", &mut []), 12);
    assert_eq!(i64_call(&well, "counter_get", &mut []), 0, "well's counter is not replayed: this is a restart");
    assert_eq!(i64_call(&well, "well_sum", &mut [Arg::In(&[1, 2, 3]), Arg::U64(3)]), 6);
}

#[test]
fn a_member_added_to_a_running_group_joins_the_running_process() {
    joins_the_running_process("");
}

#[test]
fn without_a_zygote_a_member_still_joins_the_running_process() {
    joins_the_running_process("zygote = false");
}

fn is_refused_and_the_group_goes_on(group_extra: &str, library: &Path, expect: &str) {
    let (sup, well) = group_with_well(group_extra);
    let pid = well.pid();
    let e = sup.load_with(library, Some(Isolation::Process)).unwrap_err();
    assert!(matches!(e, Error::Load { .. }), "{e}");
    assert!(e.to_string().contains(expect), "{e}");
    assert_eq!(well.pid(), pid, "the running process was left alone");
    assert_eq!(i64_call(&well, "counter_add", &mut [Arg::I64(1)]), 21);
    // The group still takes members, and forks them from a zygote that does not have the refused one.
    let faulty = sup.load_with(builtin("faulty"), Some(Isolation::Process)).unwrap();
    assert_eq!(arm_and_compute(&faulty, 1, 0).as_i64(), Some(37));
    assert_eq!(i64_call(&well, "well_sum", &mut [Arg::In(&[4, 5]), Arg::U64(2)]), 9);
}

#[test]
fn a_member_that_cannot_be_loaded_is_refused_and_the_group_goes_on() {
    let so = library_with_a_missing_dependency(&scratch_dir("groups-missing"));
    is_refused_and_the_group_goes_on("", &so, "libward_missing_dependency");
    // Without a zygote the running process itself tries, and says why through a lent buffer.
    is_refused_and_the_group_goes_on("zygote = false", &so, "libward_missing_dependency");
}

#[test]
fn a_member_whose_constructor_crashes_is_refused_and_the_group_goes_on() {
    let so = library_with_a_crashing_constructor(&scratch_dir("groups-boom"));
    // The zygote tries it in a throwaway child, which dies; the running process never sees it.
    is_refused_and_the_group_goes_on("", &so, "killed the process loading it (signal 11)");
}

#[test]
fn without_a_zygote_a_member_that_kills_the_running_process_is_refused_and_the_group_restarts() {
    let so = library_with_a_crashing_constructor(&scratch_dir("groups-boom-live"));
    let policy = group_policy("zygote = false").replace(
        "[extension.well]\ngroup = \"g\"\n",
        "[extension.well]\ngroup = \"g\"\n[extension.well.function.counter_add]\nstate = true\n",
    );
    let sup = Supervisor::new(Policy::from_toml_str(&policy, "test").unwrap());
    let well = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    assert_eq!(i64_call(&well, "counter_add", &mut [Arg::I64(20)]), 20);
    let pid = well.pid();
    let e = sup.load_with(&so, Some(Isolation::Process)).unwrap_err();
    assert!(matches!(e, Error::Load { .. }), "{e}");
    assert!(e.to_string().contains("failed loading it"), "{e}");
    // The process it killed was replaced, without it, and the old member's state replayed.
    assert_ne!(well.pid(), pid);
    assert_eq!(i64_call(&well, "counter_get", &mut []), 20);
}

/// A host that loads a member from inside a callback of another: the load crosses while the domain waits for the
/// callback's answer, nested in it.
#[test]
fn a_member_loaded_from_inside_a_callback_joins_the_running_process() {
    let sup = std::sync::Arc::new(Supervisor::new(Policy::from_toml_str(&group_policy(""), "test").unwrap()));
    let well = sup.load_with(builtin("well"), Some(Isolation::Process)).unwrap();
    let pid = well.pid();
    let joined: std::sync::Arc<std::sync::Mutex<Option<ward::Extension>>> = Default::default();
    let callback = {
        let (loader, joined) = (sup.clone(), joined.clone());
        sup.register_callback(ward::Signature::new(&[ward::ValType::I64], ward::RetType::I64), move |a| {
            let mut joined = joined.lock().unwrap();
            if joined.is_none() {
                *joined = Some(loader.load_with(builtin("faulty"), Some(Isolation::Process)).unwrap());
            }
            let faulty = joined.as_ref().unwrap();
            // The new member answers at once, nested in well's call.
            let x = a[0].as_i64().unwrap();
            ward::Value::I64(i64_call(faulty, "faulty_compute", &mut [Arg::I64(x)]))
        })
        .unwrap()
    };
    // well_map_sum(f, 3) = f(0) + f(1) + f(2); faulty_compute(x) = x * x + 1.
    assert_eq!(i64_call(&well, "well_map_sum", &mut [Arg::Callback(&callback), Arg::I64(3)]), 1 + 2 + 5);
    let joined = joined.lock().unwrap();
    assert_eq!(joined.as_ref().unwrap().pid(), pid);
    assert_eq!(well.pid(), pid);
    assert_eq!(well.stats().restarts, 0);
}
