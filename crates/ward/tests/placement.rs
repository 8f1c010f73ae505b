//! Where a process domain runs: with `wait = "sleep"` on the processor of the thread that calls it (each call a
//! hand-over on one processor); with `wait = "poll"` wherever the scheduler puts it; with the default adaptive
//! wait, on the caller's processor while calls keep finding the domain asleep, and back where the scheduler puts it
//! once calls come close together again. The caller's own processors are never taken from it.

mod common;

use common::*;
use ward::{Arg, Extension, Isolation, RetType};

/// The processors thread `tid` may run on (0: the calling thread).
fn affinity(tid: i32) -> Vec<usize> {
    ward::placement::affinity(tid).unwrap_or_else(|e| panic!("sched_getaffinity({tid}): {e}"))
}

/// Let the calling thread (this test's own) run on `cpus` only.
fn confine_this_thread(cpus: &[usize]) {
    ward::placement::confine(0, cpus).unwrap_or_else(|e| panic!("sched_setaffinity: {e}"));
}

/// The processor `pid` last ran on: field 39 of `/proc/PID/stat`.
fn last_processor(pid: i32) -> usize {
    stat_field(pid, 39)
}

fn add(ext: &Extension, d: i64) -> i64 {
    match ext.call("faulty_counter_add", &mut [Arg::I64(d)], RetType::I64) {
        Ok(ward::Value::I64(v)) => v,
        other => panic!("faulty_counter_add: {other:?}"),
    }
}

#[test]
fn a_sleeping_domain_runs_on_the_processor_of_the_thread_that_calls_it_and_follows_it() {
    let allowed = affinity(0);
    let (_sup, ext, _events) = faulty(Isolation::Process, "wait = \"sleep\"");
    // Two processors where there are two; on a machine with one, following has nowhere else to go.
    let mut total = 0;
    for &cpu in allowed.iter().take(2) {
        confine_this_thread(&[cpu]);
        total += 1;
        assert_eq!(add(&ext, 1), total);
        let pid = ext.pid().expect("a process domain has a process");
        assert_eq!(affinity(pid), vec![cpu], "the domain may run on its caller's processor only");
        assert_eq!(last_processor(pid), cpu, "and the call ran there");
    }
    confine_this_thread(&allowed);
}

#[test]
fn a_restarted_sleeping_domain_is_moved_to_its_caller_again() {
    let allowed = affinity(0);
    let (_sup, ext, _events) = faulty(Isolation::Process, "wait = \"sleep\"");
    let cpu = *allowed.last().expect("this thread may run somewhere");
    confine_this_thread(&[cpu]);
    assert_eq!(add(&ext, 2), 2);
    let first = ext.pid().expect("a process domain has a process");
    assert!(ext.call("faulty_null_deref", &mut [], RetType::Void).is_err(), "the crash is reported");
    assert_eq!(add(&ext, 3), 5, "the restarted domain has its state back");
    let second = ext.pid().expect("a process domain has a process");
    assert_ne!(first, second, "a new incarnation");
    assert_eq!(affinity(second), vec![cpu]);
    assert_eq!(last_processor(second), cpu);
    confine_this_thread(&allowed);
}

#[test]
fn a_polling_domain_is_left_where_the_scheduler_puts_it() {
    let allowed = affinity(0);
    let (_sup, ext, _events) = faulty(Isolation::Process, "wait = \"poll\"");
    let pid = ext.pid().expect("a process domain has a process");
    let before = affinity(pid);
    confine_this_thread(&allowed[..1]);
    for i in 1..=100 {
        assert_eq!(add(&ext, 1), i);
    }
    confine_this_thread(&allowed);
    assert_eq!(affinity(pid), before, "polling leaves placement alone");
}

#[test]
fn an_adaptive_domain_is_handed_over_while_calls_find_it_asleep_and_given_back_when_they_come_close() {
    let allowed = affinity(0);
    let (_sup, ext, _events) = faulty(Isolation::Process, "");
    let pid = ext.pid().expect("a process domain has a process");
    let spread = affinity(pid);
    let cpu = allowed[0];
    confine_this_thread(&[cpu]);
    let mut total = 0;
    // Short calls further apart than the domain spins (2,000 turns, well under a millisecond) find it asleep; once
    // a few have, it is moved here. The bound is generous: on a loaded machine a domain can be kept from its sleep.
    let mut handed_over = false;
    for _ in 0..500 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        total += 1;
        assert_eq!(add(&ext, 1), total);
        if affinity(pid) == vec![cpu] {
            handed_over = true;
            break;
        }
    }
    assert!(handed_over, "calls that kept finding the domain asleep did not move it to their processor");
    assert_eq!(last_processor(pid), cpu, "and it ran there");
    // Calls back to back: each comes microseconds after the last reply, so spinning pays again.
    let mut given_back = false;
    for _ in 0..100_000 {
        total += 1;
        assert_eq!(add(&ext, 1), total);
        if affinity(pid) == spread {
            given_back = true;
            break;
        }
    }
    confine_this_thread(&allowed);
    assert!(given_back, "calls back to back did not give the domain its processors back");
}

#[test]
fn a_thread_that_calls_a_sleeping_domain_keeps_its_own_processors_between_calls() {
    // A caller the scheduler keeps waking elsewhere is held on its processor while it sleeps for a reply; whether
    // it is held or not, what it may run on is its own again by the time a call returns.
    std::thread::spawn(|| {
        let allowed = affinity(0);
        let (_sup, ext, _events) = faulty(Isolation::Process, "wait = \"sleep\"");
        for i in 1..=2_000 {
            assert_eq!(add(&ext, 1), i);
            assert_eq!(affinity(0), allowed, "after call {i}");
        }
    })
    .join()
    .expect("the calling thread");
}
