//! What every fault type must keep: determinism, untouched non-code bytes, instruction boundaries, the input file.

mod common;

use std::collections::HashSet;

use common::*;
use ward_inject::{FaultType, InjectError, Plan};

/// well.so is built with -O2: its locals live in registers, so it has no stack slot to leave uninitialised.
fn absent_from_well(t: FaultType) -> bool {
    t == FaultType::Init
}

#[test]
fn every_type_injects_into_well_and_keeps_every_guarantee() {
    for t in FaultType::ALL {
        for seed in 0..6 {
            let result = ward_inject::inject(well(), &plan(t, seed));
            if absent_from_well(t) {
                assert!(is_no_site(&result), "{t}: expected the no-eligible-site error, got {result:?}");
                let msg = result.expect_err("no site").to_string();
                assert!(msg.contains("init") && msg.contains("no eligible site"), "{msg}");
                continue;
            }
            let injection = result.unwrap_or_else(|e| panic!("{t} seed {seed}: {e}"));
            check_invariants(well(), &injection, t);
        }
    }
}

#[test]
fn every_type_injects_into_unoptimised_code_and_keeps_every_guarantee() {
    for t in FaultType::ALL {
        for seed in 0..6 {
            let injection = inject_ok(unoptimised(), &plan(t, seed));
            check_invariants(unoptimised(), &injection, t);
        }
    }
}

#[test]
fn every_type_injects_into_faulty_and_keeps_every_guarantee() {
    for t in FaultType::ALL {
        let result = ward_inject::inject(faulty(), &plan(t, 11));
        match result {
            Ok(injection) => check_invariants(faulty(), &injection, t),
            Err(e) => assert!(absent_from_well(t) && matches!(e, InjectError::NoEligibleSite { .. }), "{t}: {e}"),
        }
    }
}

#[test]
fn five_faults_by_default_each_on_its_own_instruction() {
    for t in [FaultType::Nop, FaultType::Text, FaultType::Source, FaultType::Pointer] {
        let injection = inject_ok(well(), &plan(t, 3));
        assert_eq!(injection.faults.len(), ward_inject::DEFAULT_COUNT, "{t}");
        let offsets: HashSet<u64> = injection.faults.iter().map(|f| f.offset).collect();
        assert_eq!(offsets.len(), injection.faults.len(), "{t}: two faults on one instruction");
    }
}

#[test]
fn same_seed_gives_identical_bytes_and_report() {
    for (name, object) in [("well", well()), ("unoptimised", unoptimised())] {
        for t in FaultType::ALL {
            for seed in [0, 1, 0xdead_beef] {
                let a = ward_inject::inject(object, &plan(t, seed));
                let b = ward_inject::inject(object, &plan(t, seed));
                match (a, b) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{name} {t} seed {seed}"),
                    (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                    (a, b) => panic!("{name} {t} seed {seed}: {a:?} vs {b:?}"),
                }
            }
        }
    }
}

#[test]
fn different_seeds_give_different_faults() {
    for (name, object) in [("well", well()), ("unoptimised", unoptimised())] {
        for t in FaultType::ALL {
            if name == "well" && absent_from_well(t) {
                continue;
            }
            // One fault per trial: with five, a type with few sites (loop: four in well.so) takes them all.
            let outputs: HashSet<Vec<u8>> =
                (0..12).map(|seed| inject_ok(object, &Plan { count: 1, ..plan(t, seed) }).bytes).collect();
            assert!(outputs.len() >= 2, "{name} {t}: twelve seeds, one output");
        }
    }
    let a = inject_ok(well(), &plan(FaultType::Text, 1));
    let b = inject_ok(well(), &plan(FaultType::Text, 2));
    assert_ne!(a.bytes, b.bytes, "text faults of seeds 1 and 2");
}

#[test]
fn the_input_file_is_never_written() {
    let path = ward_extensions::path_of("well").expect("extract the built-in extensions");
    let before = std::fs::read(&path).expect("read well.so");
    for t in FaultType::ALL {
        let _ = ward_inject::inject(&before, &plan(t, 5));
    }
    assert_eq!(std::fs::read(&path).expect("read well.so"), before);
    assert_eq!(before, well());
}

#[test]
fn a_named_function_gets_every_fault() {
    let injection = inject_ok(well(), &Plan { function: Some("well_map_sum".into()), ..plan(FaultType::Nop, 9) });
    assert_eq!(injection.faults.len(), 5);
    assert!(injection.faults.iter().all(|f| f.function == "well_map_sum"), "{:#?}", injection.faults);
    check_invariants(well(), &injection, FaultType::Nop);
}

#[test]
fn toolchain_code_is_skipped_unless_named() {
    // GCC's crtbeginS.o gives its frame_dummy no size, so a stand-in of that name with a size plays its part.
    let source = "void frame_dummy(void) { __asm__ volatile(\"nop\\n\\tnop\"); }\n\
                  int own(int x) { return x > 3 ? x + 1 : x - 1; }\n";
    let object = compile("toolchain", source, &["-O2", "-shared", "-fPIC"]);
    let functions = ward_inject::functions(&object).expect("functions");
    let toolchain: Vec<&str> = functions.iter().filter(|f| f.toolchain).map(|f| f.name.as_str()).collect();
    assert_eq!(toolchain, ["frame_dummy"], "{functions:?}");
    assert!(functions.iter().any(|f| f.name == "own" && !f.toolchain && f.size > 0), "{functions:?}");
    for seed in 0..20 {
        let injection = inject_ok(&object, &Plan { count: 1, ..plan(FaultType::Nop, seed) });
        assert_eq!(injection.faults[0].function, "own", "seed {seed}");
    }
    let named =
        inject_ok(&object, &Plan { function: Some("frame_dummy".into()), count: 1, ..plan(FaultType::Text, 0) });
    assert_eq!(named.faults[0].function, "frame_dummy");
}

#[test]
fn fewer_sites_than_asked_gives_as_many_as_there_are() {
    // well.so has four backward conditional branches.
    let injection = inject_ok(well(), &Plan { count: 50, ..plan(FaultType::Loop, 0) });
    assert_eq!(injection.faults.len(), 4, "{:#?}", injection.faults);
}

#[test]
fn bad_inputs_get_their_own_errors() {
    let err = |bytes: &[u8], plan: &Plan| ward_inject::inject(bytes, plan).expect_err("must fail");
    let p = plan(FaultType::Nop, 0);
    assert!(matches!(err(b"just some text\n", &p), InjectError::NotElf));
    assert!(matches!(err(&[], &p), InjectError::NotElf));

    let unknown = err(well(), &Plan { function: Some("no_such_function".into()), ..p.clone() });
    assert!(matches!(&unknown, InjectError::UnknownFunction { name } if name == "no_such_function"));
    assert!(unknown.to_string().contains("--list-functions"), "{unknown}");

    // A function with no conditional branch: well_add is `lea rax, [rdi+rsi]; ret`.
    let none = err(well(), &Plan { function: Some("well_add".into()), ..plan(FaultType::Branch, 0) });
    assert!(matches!(none, InjectError::NoEligibleSite { fault_type: FaultType::Branch, .. }), "{none}");
    assert!(none.to_string().contains("well_add"), "{none}");

    let data_only = compile("data", "int data = 5;\n", &["-shared", "-fPIC", "-nostdlib"]);
    assert!(matches!(err(&data_only, &p), InjectError::NoExecutableCode), "{}", err(&data_only, &p));
}

#[test]
fn stripped_objects_fall_back_to_dynamic_symbols() {
    let dir = scratch_dir("strip");
    let path = write_temp(&dir, "well.so", well());
    let status = std::process::Command::new("strip").arg("--strip-all").arg(&path).status();
    let Ok(status) = status else {
        eprintln!("strip is not installed; skipping");
        return;
    };
    assert!(status.success());
    let stripped = std::fs::read(&path).expect("read the stripped object");
    let functions = ward_inject::functions(&stripped).expect("functions");
    // Only exported functions remain (visibility is hidden by default in well.c): no toolchain code.
    assert!(functions.iter().any(|f| f.name == "well_sum"), "{functions:?}");
    assert!(functions.iter().all(|f| !f.toolchain), "{functions:?}");
    let injection = inject_ok(&stripped, &plan(FaultType::Branch, 4));
    check_invariants(&stripped, &injection, FaultType::Branch);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hidden functions: once stripped, neither .symtab nor .dynsym names them.
const HIDDEN: &str = "__attribute__((visibility(\"hidden\"))) int twice(int x) { return x < 10 ? x * 2 : x; }\n\
                      __attribute__((visibility(\"hidden\"))) int thrice(int x) { return twice(x) + x; }\n\
                      int exported(int x) { return thrice(x) - 1; }\n";

#[test]
fn stripped_objects_name_their_internal_functions_from_the_unwind_tables() {
    let dir = scratch_dir("unwind");
    let so = write_temp(&dir, "unwind.so", &compile("unwind", HIDDEN, &["-O1", "-shared", "-fPIC", "-fno-inline"]));
    let Ok(status) = std::process::Command::new("strip").arg("--strip-all").arg(&so).status() else {
        eprintln!("strip is not installed; skipping");
        return;
    };
    assert!(status.success());
    let bytes = std::fs::read(&so).expect("read the stripped object");
    let functions = ward_inject::functions(&bytes).expect("functions");
    assert!(functions.iter().any(|f| f.name == "exported"), "{functions:?}");
    let unnamed: Vec<_> = functions.iter().filter(|f| f.name.starts_with("sub_")).collect();
    assert_eq!(unnamed.len(), 2, "twice and thrice: {functions:?}");
    for f in &unnamed {
        assert_eq!(f.name, format!("sub_{:x}", f.address));
        assert!(!f.toolchain && f.section == ".text", "{f:?}");
    }
    for pair in functions.windows(2) {
        assert!(pair[0].offset + pair[0].size <= pair[1].offset, "functions overlap: {pair:?}");
    }
    let injection = inject_ok(&bytes, &plan(FaultType::Nop, 6));
    assert!(injection.faults.iter().any(|f| f.function.starts_with("sub_")), "{:#?}", injection.faults);
    check_invariants(&bytes, &injection, FaultType::Nop);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sections_stand_in_when_there_are_no_function_symbols() {
    // Every function hidden, then stripped, and no unwind tables: nothing names or bounds a function.
    let source = "__attribute__((visibility(\"hidden\"))) int twice(int x) { return x < 10 ? x * 2 : x; }\n\
                  __attribute__((visibility(\"hidden\"))) int thrice(int x) { return twice(x) + x; }\n";
    let dir = scratch_dir("nosym");
    let flags = ["-O2", "-shared", "-fPIC", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"];
    let so = write_temp(&dir, "nosym.so", &compile("nosym", source, &flags));
    let Ok(status) = std::process::Command::new("strip").arg("--strip-all").arg(&so).status() else {
        eprintln!("strip is not installed; skipping");
        return;
    };
    assert!(status.success());
    let bytes = std::fs::read(&so).expect("read the stripped object");
    let functions = ward_inject::functions(&bytes).expect("functions");
    assert!(functions.iter().any(|f| f.name == ".text" && f.section == ".text"), "{functions:?}");
    assert!(functions.iter().all(|f| f.name.starts_with('.')), "{functions:?}");
    let injection = inject_ok(&bytes, &plan(FaultType::Nop, 2));
    assert!(injection.faults.iter().all(|f| f.function == ".text"), "{:#?}", injection.faults);
    check_invariants(&bytes, &injection, FaultType::Nop);
    let _ = std::fs::remove_dir_all(&dir);
}
