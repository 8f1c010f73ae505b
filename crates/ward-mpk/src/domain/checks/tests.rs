//! The checks, run on the host's own memory with a probe that records what it would touch.

use std::collections::BTreeSet;

use super::*;
use crate::assess::imports::{self, ImportClass};

/// Reads real memory (the tests' own buffers) and records which bytes a check reads and which ranges it reads or
/// writes whole.
#[derive(Default)]
struct Record {
    bytes: BTreeSet<usize>,
    reads: Vec<(usize, usize)>,
    writes: Vec<(usize, usize)>,
}

impl Probe for Record {
    fn byte(&mut self, at: usize) -> u8 {
        self.bytes.insert(at);
        // SAFETY: the tests hand the checks pointers to their own live buffers.
        unsafe { *(at as *const u8) }
    }
    fn word(&mut self, at: usize) -> u64 {
        // SAFETY: the tests hand the checks pointers to their own live buffers.
        unsafe { (at as *const u64).read_unaligned() }
    }
    fn read(&mut self, at: usize, len: usize) {
        self.reads.push((at, len));
    }
    fn write(&mut self, at: usize, len: usize) {
        self.writes.push((at, len));
    }
}

impl Record {
    /// Whether every byte of the C string at `s`, its NUL included, was read.
    fn read_whole_string(&self, s: &std::ffi::CStr) -> bool {
        let at = s.as_ptr() as usize;
        (at..=at + s.to_bytes().len()).all(|b| self.bytes.contains(&b))
    }
}

fn p<T>(x: &T) -> u64 {
    x as *const T as u64
}

fn with(ints: [u64; 6], stack: &[u64]) -> Arguments {
    Arguments { ints, floats: [0; 8], stack: stack.as_ptr() as usize, stack_words: stack.len() }
}

fn check(name: &str, args: &Arguments) -> (Result<(), Refusal>, Record) {
    let mut record = Record::default();
    let gate = for_import(name).unwrap_or_else(|| panic!("{name} has checks"));
    (run(gate, args, &mut record), record)
}

#[test]
fn printf_reads_every_string_argument_and_checks_where_n_writes() {
    let format = c"%d %s %.*s %5.2f %n %Lf %c %hhn";
    let whole = c"whole";
    let bounded = c"bounded";
    let (n, hhn) = (0i32, 0u8);
    // %Lf and %c and %hhn come from the stack (the six registers are spent by then): the long double aligned to
    // two eightbytes, the rest one each.
    let stack = [0u64, 0, u64::from(b'c'), p(&hhn)];
    let args = with([format.as_ptr() as u64, 7, whole.as_ptr() as u64, 3, bounded.as_ptr() as u64, p(&n)], &stack);
    let (result, record) = check("printf", &args);
    assert_eq!(result, Ok(()));
    assert!(record.read_whole_string(format));
    assert!(record.read_whole_string(whole));
    let b = bounded.as_ptr() as usize;
    assert!((b..b + 3).all(|x| record.bytes.contains(&x)), "the precision's three bytes");
    assert!(!record.bytes.contains(&(b + 3)), "not past the precision");
    assert_eq!(record.writes, vec![(p(&n) as usize, 4), (p(&hhn) as usize, 1)]);
}

#[test]
fn a_format_wanting_more_stack_than_the_stub_passes_is_refused() {
    let format = c"%d %d %d %d %d %d %d";
    // Five integers in registers after the format, two on the stack: one stack word allowed.
    let stack = [1u64];
    let args = with([format.as_ptr() as u64, 1, 2, 3, 4, 5], &stack);
    assert_eq!(check("printf", &args).0, Err(Refusal::TooManyArguments));
    let stack = [1u64, 2];
    let args = with([format.as_ptr() as u64, 1, 2, 3, 4, 5], &stack);
    assert_eq!(check("printf", &args).0, Ok(()));
}

/// A System V `va_list`.
#[repr(C)]
struct VaList {
    gp_offset: u32,
    fp_offset: u32,
    overflow: *const u64,
    save: *const u64,
}

#[test]
fn vfprintf_follows_the_va_list_from_the_save_area_to_the_overflow_area() {
    let format = c"%s %f %s %s %s %s";
    let strings = [c"one", c"two", c"three", c"four", c"five"];
    // Registers: the save area's integer part holds four more (from gp_offset 16), then the overflow area.
    let mut save = [0u64; 22];
    for (i, s) in strings[..4].iter().enumerate() {
        save[2 + i] = s.as_ptr() as u64;
    }
    let overflow = [strings[4].as_ptr() as u64];
    let list = VaList { gp_offset: 16, fp_offset: 48, overflow: overflow.as_ptr(), save: save.as_ptr() };
    let stream = stream_like();
    let args = with([p(&stream), format.as_ptr() as u64, p(&list), 0, 0, 0], &[]);
    let (result, record) = check("vfprintf", &args);
    assert_eq!(result, Ok(()));
    for s in strings {
        assert!(record.read_whole_string(s), "{s:?}");
    }
    assert_eq!(record.reads, vec![(p(&stream) as usize, STREAM_BYTES)]);
}

/// Bytes that pass for a stream: glibc's magic in the first word.
fn stream_like() -> [u64; STREAM_BYTES / 8] {
    let mut file = [0u64; STREAM_BYTES / 8];
    file[0] = u64::from(STREAM_MAGIC | 0x2084);
    file
}

#[test]
fn a_file_pointer_without_the_stream_magic_is_refused_and_a_null_one_where_allowed_passes() {
    let zeros = [0u64; STREAM_BYTES / 8];
    let text = c"ward";
    let args = with([text.as_ptr() as u64, p(&zeros), 0, 0, 0, 0], &[]);
    assert_eq!(check("fputs", &args).0, Err(Refusal::NotAStream));
    let stream = stream_like();
    let args = with([text.as_ptr() as u64, p(&stream), 0, 0, 0, 0], &[]);
    assert_eq!(check("fputs", &args).0, Ok(()));
    // fflush(NULL) flushes every stream.
    assert_eq!(check("fflush", &with([0; 6], &[])).0, Ok(()));
}

#[test]
fn scanf_checks_each_target_for_what_its_conversion_writes() {
    let format = c"%d %5s %[^],] %lf %*d %3c %ms %hn %Lf";
    let targets = [0u64; 8];
    let t = |i: usize| p(&targets[i]);
    let input = c"1 two x 3.0 4 abc def 5 6";
    let stack = [t(4), t(5), t(6), t(7)];
    let args = with([input.as_ptr() as u64, format.as_ptr() as u64, t(0), t(1), t(2), t(3)], &stack);
    let (result, record) = check("sscanf", &args);
    assert_eq!(result, Ok(()));
    assert!(record.read_whole_string(input));
    let expected: Vec<(usize, usize)> = [(0, 4), (1, 6), (2, 1), (3, 8), (4, 3), (5, 8), (6, 2), (7, 16)]
        .iter()
        .map(|&(i, n)| (t(i) as usize, n))
        .collect();
    assert_eq!(record.writes, expected);
}

#[test]
fn fortified_forms_are_refused_where_glibc_would_end_the_process() {
    let format = c"%n";
    let buffer = [0u8; 16];
    let n = 0i32;
    // __snprintf_chk(s, maxlen, flag, slen, format, ...): an object smaller than maxlen.
    let args = with([p(&buffer), 16, 1, 8, format.as_ptr() as u64, p(&n)], &[]);
    assert_eq!(check("__snprintf_chk", &args).0, Err(Refusal::Fortified));
    // The object is large enough, but flag 1 forbids %n.
    let args = with([p(&buffer), 16, 1, 16, format.as_ptr() as u64, p(&n)], &[]);
    assert_eq!(check("__snprintf_chk", &args).0, Err(Refusal::Fortified));
    // Flag 0 allows it: the output buffer and the %n target are checked for writing.
    let args = with([p(&buffer), 16, 0, 16, format.as_ptr() as u64, p(&n)], &[]);
    let (result, record) = check("__snprintf_chk", &args);
    assert_eq!(result, Ok(()));
    assert_eq!(record.writes, vec![(p(&buffer) as usize, 16), (p(&n) as usize, 4)]);
    // __fread_chk(ptr, ptrlen, size, n, fp): 4 * 5 bytes into 16.
    let stream = stream_like();
    let args = with([p(&buffer), 16, 4, 5, p(&stream), 0], &[]);
    assert_eq!(check("__fread_chk", &args).0, Err(Refusal::Fortified));
    let args = with([p(&buffer), 16, 4, 4, p(&stream), 0], &[]);
    assert_eq!(check("__fread_chk", &args).0, Ok(()));
}

#[test]
fn gettext_reads_its_strings_and_takes_a_null_domain() {
    let message = c"Delay";
    let args = with([0, message.as_ptr() as u64, 5, 0, 0, 0], &[]);
    let (result, record) = check("dcgettext", &args);
    assert_eq!(result, Ok(()));
    assert!(record.read_whole_string(message));
    assert!(!record.bytes.contains(&0), "a null domain is not read");
}

#[test]
fn touching_a_range_touches_every_page_once_from_its_first_byte() {
    let mut touched = Vec::new();
    Touch::pages(4090, 8200, |p| touched.push(p));
    assert_eq!(touched, vec![4090, 4096, 8192, 12288]);
    touched.clear();
    Touch::pages(100, 1, |p| touched.push(p));
    assert_eq!(touched, vec![100]);
    touched.clear();
    Touch::pages(usize::MAX - 2, 8, |p| touched.push(p));
    assert_eq!(touched, vec![usize::MAX], "a range past the end of the address space");
}

/// Host-gated imports whose arguments are all values (or the host's own data): nothing to check.
const VALUES_ONLY: &[&str] = &[
    "stdin",
    "stdout",
    "stderr",
    "putchar",
    "putchar_unlocked",
    "getchar",
    "sleep",
    "usleep",
    "tzset",
    "strerror",
    "strsignal",
    "localeconv",
    "nl_langinfo",
    // A locale object: the host's, which the domain only got from it.
    "strerror_l",
];

#[test]
fn every_host_gated_import_with_a_pointer_has_checks_and_every_check_is_of_a_host_gate() {
    for name in imports::host_gate_names() {
        assert!(
            VALUES_ONLY.contains(&name) || for_import(name).is_some(),
            "{name} is a host gate with pointer arguments and no checks"
        );
    }
    for gate in TABLE {
        assert_eq!(imports::classify(gate.name, None).class, ImportClass::HostGate, "{}", gate.name);
    }
}

#[test]
fn sprintf_checks_every_byte_it_will_write() {
    let format = c"%s and %d and %5.2f";
    let word = c"abc";
    let mut buffer = [0u8; 64];
    let dst = buffer.as_mut_ptr() as u64;
    let mut args = with([dst, format.as_ptr() as u64, word.as_ptr() as u64, 42, 0, 0], &[]);
    args.floats[0] = 3.25f64.to_bits();
    let (result, record) = check("sprintf", &args);
    assert_eq!(result, Ok(()));
    // "abc and 42 and  3.25" and its NUL.
    assert_eq!(record.writes, vec![(dst as usize, 21)], "the whole text, as the host will write it");
}

#[test]
fn vsprintf_checks_every_byte_it_will_write_from_its_va_list() {
    let format = c"%d-%d";
    let overflow = [7u64, 1234];
    // Everything from the overflow area, as after six integer arguments.
    let list = VaList { gp_offset: 48, fp_offset: 176, overflow: overflow.as_ptr(), save: std::ptr::null() };
    let mut buffer = [0u8; 16];
    let dst = buffer.as_mut_ptr() as u64;
    let (result, record) = check("vsprintf", &with([dst, format.as_ptr() as u64, p(&list), 0, 0, 0], &[]));
    assert_eq!(result, Ok(()));
    assert_eq!(record.writes, vec![(dst as usize, 7)], "\"7-1234\" and its NUL");
}

#[test]
fn a_fortified_sprintf_whose_object_is_too_small_is_refused_and_one_that_fits_is_checked_whole() {
    let format = c"%s";
    let word = c"twelve chars";
    let mut buffer = [0u8; 64];
    let dst = buffer.as_mut_ptr() as u64;
    let call = |object: u64| with([dst, 1, object, format.as_ptr() as u64, word.as_ptr() as u64, 0], &[]);
    assert_eq!(check("__sprintf_chk", &call(12)).0, Err(Refusal::Fortified), "13 bytes into 12");
    let (result, record) = check("__sprintf_chk", &call(13));
    assert_eq!(result, Ok(()));
    assert_eq!(record.writes, vec![(dst as usize, 13)]);
    let (result, record) = check("__sprintf_chk", &call(u64::MAX));
    assert_eq!(result, Ok(()), "an object of unknown size");
    assert_eq!(record.writes, vec![(dst as usize, 13)]);
}

#[test]
fn a_sprintf_whose_formatting_could_allocate_is_checked_at_its_first_byte() {
    let mut buffer = [0u8; 64];
    let dst = buffer.as_mut_ptr() as u64;
    let word = c"abc";
    for format in [c"%1$s", c"%5000d", c"%m", c"%ls"] {
        let (result, record) =
            check("sprintf", &with([dst, format.as_ptr() as u64, word.as_ptr() as u64, 0, 0, 0], &[]));
        assert_eq!(result, Ok(()), "{format:?}");
        assert_eq!(record.writes, vec![(dst as usize, 1)], "{format:?}");
    }
}
