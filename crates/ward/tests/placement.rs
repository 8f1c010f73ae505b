//! Where a process domain runs: with `wait = "sleep"` on the processor of the thread that calls it (each call a
//! hand-over on one processor), otherwise wherever the scheduler puts it.

mod common;

use common::*;
use ward::{Arg, Extension, Isolation, RetType};

/// The processors thread `tid` may run on (0: the calling thread).
fn affinity(tid: i32) -> Vec<usize> {
    // SAFETY: an all-zero `cpu_set_t` is the empty set; the kernel writes at most its size into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed.
    let rc = unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity({tid}): {}", std::io::Error::last_os_error());
    // SAFETY: every index tested is below `CPU_SETSIZE`, inside `set`.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Let the calling thread (this test's own) run on `cpus` only.
fn confine_this_thread(cpus: &[usize]) {
    // SAFETY: as in `affinity`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: `c` came from `affinity`, so it is below `CPU_SETSIZE`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid `cpu_set_t` of the size passed; the kernel only reads it.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
}

/// The processor `pid` last ran on: field 39 of `/proc/PID/stat`, counted after the command's closing parenthesis.
fn last_processor(pid: i32) -> usize {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read the domain's stat");
    let after_name = &stat[stat.rfind(')').expect("a stat line names its command in parentheses") + 2..];
    // Fields 3 onwards; the processor is field 39.
    after_name.split(' ').nth(39 - 3).and_then(|f| f.parse().ok()).expect("the processor field")
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
fn a_domain_that_spins_first_is_left_where_the_scheduler_puts_it() {
    let allowed = affinity(0);
    let (_sup, ext, _events) = faulty(Isolation::Process, "");
    let pid = ext.pid().expect("a process domain has a process");
    let before = affinity(pid);
    confine_this_thread(&allowed[..1]);
    assert_eq!(add(&ext, 1), 1);
    confine_this_thread(&allowed);
    assert_eq!(affinity(pid), before, "adaptive waiting leaves placement alone");
}
