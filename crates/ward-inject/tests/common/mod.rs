//! Inputs and independent checks shared by the integration tests. The checks read the ELF file and decode x86 on
//! their own (with `object` and `iced-x86` directly), so a bug in the library's own reading cannot hide itself.

#![allow(dead_code)] // Each test file uses its own subset.

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use iced_x86::{Decoder, DecoderOptions, Instruction};
use object::{Object, ObjectSection, SectionFlags};
use ward_inject::{FaultType, InjectError, Injection, Plan};

pub fn well() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let path = ward_extensions::path_of("well").expect("extract the built-in extensions");
        std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    })
}

pub fn faulty() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let path = ward_extensions::path_of("faulty").expect("extract the built-in extensions");
        std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    })
}

/// A fresh directory for one test's files.
pub fn scratch_dir(tag: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ward-inject-test-{}-{tag}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// Compiles C `source` into a shared object with `flags` and returns its bytes.
pub fn compile(tag: &str, source: &str, flags: &[&str]) -> Vec<u8> {
    let dir = scratch_dir(tag);
    let c = dir.join(format!("{tag}.c"));
    let so = dir.join(format!("{tag}.so"));
    std::fs::write(&c, source).expect("write the C source");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let out = Command::new(&cc)
        .args(flags)
        .arg("-o")
        .arg(&so)
        .arg(&c)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(out.status.success(), "{cc} failed: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&so).expect("read the compiled object");
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

/// Code shapes -O2 optimises away: locals in stack slots, parameters spilled and reloaded, a `for` loop with `<`
/// (a backward `jl`), a compare with a constant.
pub const UNOPTIMISED_C: &str = r#"
int count_below(const int *v, int n, int limit) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (v[i] < limit) {
            count++;
        }
    }
    return count;
}

long sum_locals(long a, long b) {
    long tmp[4] = {a, b, 3, 4};
    long s = 0;
    for (int i = 0; i < 4; i++) {
        s += tmp[i];
    }
    return s;
}

int clamp(int x) {
    if (x > 100) {
        return 100;
    }
    return x;
}
"#;

pub fn unoptimised() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| compile("o0", UNOPTIMISED_C, &["-O0", "-g", "-shared", "-fPIC"]))
}

/// File ranges of the executable sections, read independently of the library.
pub fn executable_ranges(bytes: &[u8]) -> Vec<Range<usize>> {
    let file = object::File::parse(bytes).expect("an ELF file");
    file.sections()
        .filter(|s| {
            let exec = u64::from(object::elf::SHF_EXECINSTR);
            matches!(s.flags(), SectionFlags::Elf { sh_flags } if sh_flags & exec != 0)
        })
        .filter_map(|s| s.file_range())
        .map(|(o, n)| o as usize..(o + n) as usize)
        .collect()
}

pub fn decode_at(bytes: &[u8], ip: u64) -> Vec<Instruction> {
    let mut d = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let mut out = Vec::new();
    while d.can_decode() {
        out.push(d.decode());
    }
    out
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

/// The instructions a fault put in place, decoded at the instruction's address.
pub fn after_instrs(f: &ward_inject::InjectedFault) -> Vec<Instruction> {
    decode_at(&unhex(&f.after_bytes), f.address)
}

pub fn before_instr(f: &ward_inject::InjectedFault) -> Instruction {
    let v = decode_at(&unhex(&f.before_bytes), f.address);
    assert_eq!(v.len(), 1, "before_bytes of {f:?} are not one instruction");
    v[0]
}

pub fn plan(fault_type: FaultType, seed: u64) -> Plan {
    Plan::new(fault_type, seed)
}

/// Every guarantee an injection must keep, checked against the original bytes:
/// - same length, report consistent with the bytes, faults do not share bytes;
/// - every changed byte inside an executable section and inside a reported fault; every byte outside the
///   executable sections (headers, tables, data) identical;
/// - each touched function decodes from its start with the original boundaries everywhere: a fault's
///   replacement ends exactly where the original instruction ended, and every other instruction is unchanged.
pub fn check_invariants(original: &[u8], injection: &Injection, fault_type: FaultType) {
    let mutated = &injection.bytes;
    assert_eq!(mutated.len(), original.len(), "length changed");
    assert!(!injection.faults.is_empty(), "no faults");

    let mut spans: Vec<Range<usize>> = Vec::new();
    for f in &injection.faults {
        assert_eq!(f.fault_type, fault_type);
        let before = unhex(&f.before_bytes);
        let after = unhex(&f.after_bytes);
        assert_eq!(before.len(), after.len(), "{f:?}: length changed");
        assert_ne!(before, after, "{f:?}: nothing changed");
        let span = f.offset as usize..f.offset as usize + before.len();
        assert_eq!(&original[span.clone()], &before[..], "{f:?}: before_bytes are not the original's");
        assert_eq!(&mutated[span.clone()], &after[..], "{f:?}: after_bytes are not what was written");
        assert!(!f.before.is_empty() && !f.after.is_empty(), "{f:?}: empty disassembly");
        assert!(spans.iter().all(|s| s.end <= span.start || span.end <= s.start), "{f:?} overlaps another fault");
        spans.push(span);
    }
    let sorted = injection.faults.windows(2).all(|w| w[0].offset < w[1].offset);
    assert!(sorted, "faults not sorted by offset");

    let exec = executable_ranges(original);
    for (i, (a, b)) in original.iter().zip(mutated.iter()).enumerate() {
        if a != b {
            assert!(exec.iter().any(|r| r.contains(&i)), "byte {i:#x} changed outside executable sections");
            assert!(spans.iter().any(|s| s.contains(&i)), "byte {i:#x} changed outside every reported fault");
        }
    }
    let outside: Vec<usize> = (0..original.len()).filter(|i| !exec.iter().any(|r| r.contains(i))).collect();
    assert!(outside.iter().all(|&i| original[i] == mutated[i]), "a non-executable byte changed");
    assert!(outside.contains(&0) && outside.contains(&63), "the ELF header must count as outside");

    let functions = ward_inject::functions(original).expect("functions");
    let touched: HashSet<&str> = injection.faults.iter().map(|f| f.function.as_str()).collect();
    for name in touched {
        let func = functions.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no function {name}"));
        let range = func.offset as usize..(func.offset + func.size) as usize;
        let faults: Vec<&ward_inject::InjectedFault> = injection.faults.iter().filter(|f| f.function == name).collect();
        for f in &faults {
            assert_eq!(f.function_offset, f.offset - func.offset, "{f:?}");
            assert_eq!(f.address, func.address + f.function_offset, "{f:?}");
        }
        check_boundaries(&original[range.clone()], &mutated[range], func.address, &faults);
    }
}

fn check_boundaries(original: &[u8], mutated: &[u8], address: u64, faults: &[&ward_inject::InjectedFault]) {
    let before = decode_at(original, address);
    let after = decode_at(mutated, address);
    let mut j = 0;
    let mut past_last_fault = 0;
    for instr in &before {
        let start = instr.ip();
        let end = instr.next_ip();
        if let Some(f) = faults.iter().find(|f| f.address == start) {
            // The replacement: one or more instructions that end exactly where the original did.
            while j < after.len() && after[j].next_ip() < end {
                assert!(!after[j].is_invalid(), "{f:?}: replacement holds an invalid instruction");
                j += 1;
            }
            assert!(j < after.len() && after[j].next_ip() == end, "{f:?}: replacement does not end at {end:#x}");
            assert!(!after[j].is_invalid(), "{f:?}: replacement holds an invalid instruction");
            j += 1;
            past_last_fault += 1;
        } else {
            let other = after.get(j).unwrap_or_else(|| panic!("decode ended early at {start:#x}"));
            assert_eq!((other.ip(), other.len(), other.code()), (start, instr.len(), instr.code()), "boundary moved");
            j += 1;
        }
    }
    assert_eq!(j, after.len(), "extra instructions after the end of the function");
    assert_eq!(past_last_fault, faults.len(), "a fault was not at an original instruction boundary");
}

pub fn inject_ok(bytes: &[u8], plan: &Plan) -> Injection {
    ward_inject::inject(bytes, plan).unwrap_or_else(|e| panic!("{plan:?}: {e}"))
}

pub fn is_no_site(result: &Result<Injection, InjectError>) -> bool {
    matches!(result, Err(InjectError::NoEligibleSite { .. }))
}

pub fn write_temp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write a temporary object");
    path
}
