//! A resolved function's calls allocate nothing on the calling thread (issue 30: "a call path with nothing in
//! it"), with isolation `none` and in a process domain, scalars and buffers alike. Counted by a global allocator
//! that counts the allocations of the thread that asks.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::*;
use ward::{Arg, Function, Isolation, Policy, RetType, Supervisor, Value};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every request is passed to the system allocator unchanged; the count is a thread-local cell without a
// destructor, which allocates nothing itself.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from System.alloc with this layout (every allocation here does).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: as for dealloc; new_size is the caller's, as GlobalAlloc::realloc requires.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Allocations per call of `call` over many calls, after a warm-up (the first calls may size buffers once).
fn allocations_per_call(mut call: impl FnMut()) -> f64 {
    for _ in 0..100 {
        call();
    }
    let before = allocations();
    let calls = 2000;
    for _ in 0..calls {
        call();
    }
    (allocations() - before) as f64 / calls as f64
}

fn functions(iso: Isolation) -> (Supervisor, Function, Function, Function) {
    // Polling keeps the process domain's calls on the path a busy host takes; the test only counts allocations.
    let policy = Policy::from_toml_str("[extension.well]\nwait = \"poll\"\n", "test").unwrap();
    let sup = Supervisor::new(policy);
    let ext = sup.load_with(builtin("well"), Some(iso)).unwrap();
    let null = ext.function("well_null").unwrap();
    let add = ext.function("well_add").unwrap();
    let xor = ext.function("well_xor").unwrap();
    (sup, null, add, xor)
}

#[test]
fn calls_of_a_resolved_function_allocate_nothing() {
    for iso in [Isolation::None, Isolation::Process] {
        let (_sup, null, add, xor) = functions(iso);
        let per_null = allocations_per_call(|| {
            null.call(&mut [], RetType::Void).unwrap();
        });
        assert_eq!(per_null, 0.0, "{iso}: a null call");
        let per_add = allocations_per_call(|| {
            assert_eq!(add.call(&mut [Arg::I64(2), Arg::I64(3)], RetType::I64).unwrap(), Value::I64(5));
        });
        assert_eq!(per_add, 0.0, "{iso}: a call with scalars");
        let input = vec![0x5au8; 4096];
        let mut output = vec![0u8; 4096];
        let per_xor = allocations_per_call(|| {
            xor.call(&mut [Arg::In(&input), Arg::Out(&mut output), Arg::U64(4096), Arg::U64(0xff)], RetType::Void)
                .unwrap();
        });
        assert_eq!(per_xor, 0.0, "{iso}: a call with an input and an output buffer");
        assert_eq!(output[0], 0x5a ^ 0xff);
    }
}
