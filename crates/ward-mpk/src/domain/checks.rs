//! What a host gate checks of the arguments a domain hands it, before the host's function sees them.
//!
//! A gated function runs with the host's rights. Handed a pointer the domain could not use itself (unmapped, or
//! host memory to write into) it would fault in the host's code, perhaps holding one of libc's locks (stdio's,
//! gettext's), where ward cannot tell the fault from the host's own: the host would die. Or it would write the
//! host's memory on the domain's behalf. So an outward stub whose import has a check runs it first, still on the
//! domain's stack and with the domain's rights (Nooks' wrappers checked parameters the same way): the check reads
//! every string and input buffer the call will read, and writes a byte of every page of every output buffer with a
//! locked `or` of zero (a write that changes nothing). A pointer the domain may not use faults there, as the
//! domain's own fault, and is recovered; the host's function never runs.
//!
//! What touching cannot show is refused: a `FILE` pointer that is no stream, a format that needs more arguments
//! than the stub passes on, a fortified call glibc would end the process for. The check then stops at a trap the
//! fault handler knows ([`refuse`]), and the call ends as a protocol fault naming the function and the reason.
//!
//! `sprintf`'s output is checked whole: the check formats the call once itself, with `vsnprintf` and no buffer,
//! inside the domain, to learn its length, then touches every byte the host will write (and refuses a fortified
//! call whose object is too small for it, which glibc would end the process for). It does so only for formats whose
//! formatting cannot allocate (no argument named by position, no wide characters, no `%m`, widths and precisions of
//! at most 4096): glibc's `malloc` writes the host's heap, which the domain may not.
//!
//! Limits, kept on purpose: other unbounded outputs (`sprintf` with such a format, `%s` in `scanf` without a
//! width) are checked at their first byte only, since their length is known only once the host has formatted or
//! read them; arguments a format names by position (`%2$s`) are not checked; and a check cannot tell a stream the
//! host made from a copy of one in the domain's memory.

/// What a host gate checks before its function runs: the checks of one import.
#[derive(Debug)]
pub struct GateCheck {
    /// The import, as the extension names it.
    pub name: &'static str,
    pub checks: &'static [Check],
}

/// One argument check. `arg` is the index of an integer-class argument (0 = `rdi`).
#[derive(Debug, Clone, Copy)]
pub enum Check {
    /// A NUL-terminated string the function reads.
    Str { arg: usize, null_ok: bool },
    /// Bytes the function reads.
    Read { arg: usize, len: Len, null_ok: bool },
    /// Bytes the function writes.
    Write { arg: usize, len: Len, null_ok: bool },
    /// A `FILE *`: readable, and carrying glibc's stream magic.
    Stream { arg: usize, null_ok: bool },
    /// A printf format and the arguments it takes. `fortify_flag`: the `flag` argument of a `__X_chk` form, which,
    /// when positive, makes glibc end the process on `%n`. `output`: the buffer an unbounded `sprintf` writes.
    Printf { format: usize, rest: Rest, fortify_flag: Option<usize>, output: Option<Output> },
    /// A scanf format and the pointers it writes through.
    Scanf { format: usize, rest: Rest },
    /// A rule of glibc's fortified forms, checked before the call: glibc ends the process when it fails.
    Fortify(Fortify),
}

/// How long a buffer is.
#[derive(Debug, Clone, Copy)]
pub enum Len {
    Bytes(usize),
    /// The value of an integer argument.
    Arg(usize),
    /// An `int` argument: nothing when it is zero or negative.
    IntArg(usize),
    /// The product of two integer arguments (`size * n`), wrapping as glibc computes it.
    Product(usize, usize),
}

/// The buffer `sprintf` writes: as long as the formatted text and its NUL.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// The argument that points at the buffer.
    pub dst: usize,
    /// The argument that gives the buffer's size, in a fortified form (`(size_t) -1`: unknown).
    pub object: Option<usize>,
}

/// Where the arguments after a format are.
#[derive(Debug, Clone, Copy)]
pub enum Rest {
    /// In the call's own variadic arguments, after the format.
    Variadic,
    /// In a `va_list` that is this argument.
    VaList(usize),
}

/// The fortified forms' argument rules (glibc's `debug/` functions), which end the process with `__chk_fail`.
#[derive(Debug, Clone, Copy)]
pub enum Fortify {
    /// `__snprintf_chk`: the object size must not be smaller than `maxlen`.
    MaxlenFits { maxlen: usize, slen: usize },
    /// `__sprintf_chk`: the object must not be of zero bytes.
    NonEmpty { slen: usize },
    /// `__fread_chk`: `size * n` must neither overflow nor exceed the object.
    ReadFits { object: usize, size: usize, n: usize },
}

/// Why a gate refused a call (the code the trap carries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Refusal {
    NotAStream = 1,
    TooManyArguments = 2,
    Fortified = 3,
}

impl Refusal {
    pub fn from_code(code: u64) -> Option<Refusal> {
        match code {
            1 => Some(Refusal::NotAStream),
            2 => Some(Refusal::TooManyArguments),
            3 => Some(Refusal::Fortified),
            _ => None,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Refusal::NotAStream => "a FILE pointer that is no stream",
            Refusal::TooManyArguments => "more arguments than a host gate passes on",
            Refusal::Fortified => "arguments its fortified form would end the process for",
        }
    }
}

/// glibc's stream magic, in the high half of a `FILE`'s first word (`_IO_MAGIC`).
const STREAM_MAGIC: u32 = 0xfbad_0000;
const STREAM_MAGIC_MASK: u32 = 0xffff_0000;
/// `sizeof(FILE)` in glibc on x86-64: what stdio reads of a stream.
const STREAM_BYTES: usize = 216;
/// `BUFSIZ`, the buffer `setbuf` hands a stream.
const STDIO_BUFSIZ: usize = 8192;
/// `sizeof(struct tm)`, `sizeof(time_t)`, `sizeof(struct timespec)`, `sizeof(fpos_t)`.
const TM_BYTES: usize = 56;
const TIME_BYTES: usize = 8;
const TIMESPEC_BYTES: usize = 16;
const FPOS_BYTES: usize = 16;
/// The buffer `ctime_r` and `asctime_r` write (26 bytes, by the standard).
const ASCTIME_BYTES: usize = 26;

/// How a check reaches memory: by touching it inside the domain ([`Touch`]), or a record of what it would touch
/// (the tests').
pub trait Probe {
    /// A byte of memory the function reads.
    fn byte(&mut self, at: usize) -> u8;
    /// Eight bytes the check itself needs (a `va_list`, a stack argument, a stream's flags).
    fn word(&mut self, at: usize) -> u64;
    /// Bytes the function reads.
    fn read(&mut self, at: usize, len: usize);
    /// Bytes the function writes.
    fn write(&mut self, at: usize, len: usize);
}

/// The arguments as the outward stub saved them: six integer registers, eight vector registers (their low eight
/// bytes), and the caller's stack arguments.
pub struct Arguments {
    pub ints: [u64; 6],
    /// The low eight bytes of `xmm0` to `xmm7`.
    pub floats: [u64; 8],
    /// Where the caller's stack arguments begin (a domain address).
    pub stack: usize,
    /// How many eightbytes of them the stub passes on.
    pub stack_words: usize,
}

/// Runs every check of one import. Err: the call is refused.
pub fn run(check: &GateCheck, args: &Arguments, probe: &mut impl Probe) -> Result<(), Refusal> {
    for c in check.checks {
        run_one(*c, args, probe)?;
    }
    Ok(())
}

fn run_one(check: Check, args: &Arguments, probe: &mut impl Probe) -> Result<(), Refusal> {
    let int = |i: usize| args.ints.get(i).copied().unwrap_or(0);
    match check {
        Check::Str { arg, null_ok } => {
            if !(null_ok && int(arg) == 0) {
                string(probe, int(arg) as usize, None, false);
            }
        }
        Check::Read { arg, len, null_ok } => {
            let len = length(len, args);
            if len > 0 && !(null_ok && int(arg) == 0) {
                probe.read(int(arg) as usize, len);
            }
        }
        Check::Write { arg, len, null_ok } => {
            let len = length(len, args);
            if len > 0 && !(null_ok && int(arg) == 0) {
                probe.write(int(arg) as usize, len);
            }
        }
        Check::Stream { arg, null_ok } => {
            if !(null_ok && int(arg) == 0) {
                stream(probe, int(arg) as usize)?;
            }
        }
        Check::Printf { format, rest, fortify_flag, output } => {
            let forbid_n = fortify_flag.is_some_and(|f| (int(f) as i32) > 0);
            let mut cursor = Cursor::new(rest, format, args, probe);
            let plain = printf(probe, int(format) as usize, &mut cursor, forbid_n)?;
            if let Some(Output { dst, object }) = output {
                let needed = if plain { formatted_length(format, rest, args, probe).map(|n| n + 1) } else { None };
                if let (Some(needed), Some(object)) = (needed, object) {
                    if (int(object) as usize) < needed {
                        return Err(Refusal::Fortified);
                    }
                }
                probe.write(int(dst) as usize, needed.unwrap_or(1));
            }
        }
        Check::Scanf { format, rest } => {
            let mut cursor = Cursor::new(rest, format, args, probe);
            scanf(probe, int(format) as usize, &mut cursor)?;
        }
        Check::Fortify(rule) => {
            let ok = match rule {
                Fortify::MaxlenFits { maxlen, slen } => int(slen) >= int(maxlen),
                Fortify::NonEmpty { slen } => int(slen) != 0,
                Fortify::ReadFits { object, size, n } => {
                    int(size).checked_mul(int(n)).is_some_and(|bytes| bytes <= int(object))
                }
            };
            if !ok {
                return Err(Refusal::Fortified);
            }
        }
    }
    Ok(())
}

fn length(len: Len, args: &Arguments) -> usize {
    let int = |i: usize| args.ints.get(i).copied().unwrap_or(0);
    match len {
        Len::Bytes(n) => n,
        Len::Arg(i) => int(i) as usize,
        Len::IntArg(i) => (int(i) as i32).max(0) as usize,
        Len::Product(a, b) => int(a).wrapping_mul(int(b)) as usize,
    }
}

/// Reads a string to its NUL, or to `max` characters; `wide`: of 4-byte characters.
fn string(probe: &mut impl Probe, at: usize, max: Option<usize>, wide: bool) {
    let unit = if wide { 4 } else { 1 };
    let mut n = 0usize;
    loop {
        if max.is_some_and(|m| n >= m) {
            return;
        }
        let p = at.wrapping_add(n * unit);
        let zero = if wide { probe.word(p) as u32 == 0 } else { probe.byte(p) == 0 };
        if zero {
            return;
        }
        n += 1;
    }
}

fn stream(probe: &mut impl Probe, at: usize) -> Result<(), Refusal> {
    probe.read(at, STREAM_BYTES);
    if (probe.word(at) as u32) & STREAM_MAGIC_MASK != STREAM_MAGIC {
        return Err(Refusal::NotAStream);
    }
    Ok(())
}

/// The arguments after a format, taken one at a time as `va_arg` would.
enum Cursor {
    /// The stub's saved registers, then the caller's stack.
    Call { ints: [u64; 6], next_int: usize, next_float: usize, stack: usize, stack_word: usize, stack_words: usize },
    /// A `va_list` (System V: `gp_offset`, `fp_offset`, `overflow_arg_area`, `reg_save_area`), copied: the host's
    /// function reads the domain's own.
    List { gp_offset: u64, fp_offset: u64, overflow: usize, save: usize },
}

/// Where the integer registers end in a `va_list`'s save area, and the vector ones.
const GP_SAVE_END: u64 = 48;
const FP_SAVE_END: u64 = 176;

impl Cursor {
    fn new(rest: Rest, format: usize, args: &Arguments, probe: &mut impl Probe) -> Cursor {
        match rest {
            Rest::Variadic => Cursor::Call {
                ints: args.ints,
                next_int: format + 1,
                next_float: 0,
                stack: args.stack,
                stack_word: 0,
                stack_words: args.stack_words,
            },
            Rest::VaList(i) => {
                let list = args.ints.get(i).copied().unwrap_or(0) as usize;
                let offsets = probe.word(list);
                Cursor::List {
                    gp_offset: offsets & 0xffff_ffff,
                    fp_offset: offsets >> 32,
                    overflow: probe.word(list.wrapping_add(8)) as usize,
                    save: probe.word(list.wrapping_add(16)) as usize,
                }
            }
        }
    }

    /// The next stack eightbyte(s), `align` of them aligned (a `long double` takes two, 16-byte aligned).
    fn stack(&mut self, probe: &mut impl Probe, words: usize) -> Result<u64, Refusal> {
        match self {
            Cursor::Call { stack, stack_word, stack_words, .. } => {
                if words == 2 {
                    *stack_word += *stack_word % 2;
                }
                if *stack_word + words > *stack_words {
                    return Err(Refusal::TooManyArguments);
                }
                let value = probe.word(stack.wrapping_add(*stack_word * 8));
                *stack_word += words;
                Ok(value)
            }
            Cursor::List { overflow, .. } => {
                if words == 2 {
                    *overflow = (*overflow).wrapping_add(15) & !15;
                }
                let value = probe.word(*overflow);
                *overflow = overflow.wrapping_add(words * 8);
                Ok(value)
            }
        }
    }

    fn int(&mut self, probe: &mut impl Probe) -> Result<u64, Refusal> {
        match self {
            Cursor::Call { ints, next_int, .. } if *next_int < ints.len() => {
                let value = ints[*next_int];
                *next_int += 1;
                Ok(value)
            }
            Cursor::List { gp_offset, save, .. } if *gp_offset < GP_SAVE_END => {
                let value = probe.word(save.wrapping_add(*gp_offset as usize));
                *gp_offset += 8;
                Ok(value)
            }
            _ => self.stack(probe, 1),
        }
    }

    fn double(&mut self, probe: &mut impl Probe) -> Result<(), Refusal> {
        match self {
            Cursor::Call { next_float, .. } if *next_float < 8 => {
                *next_float += 1;
                Ok(())
            }
            Cursor::List { fp_offset, .. } if *fp_offset < FP_SAVE_END => {
                *fp_offset += 16;
                Ok(())
            }
            _ => self.stack(probe, 1).map(drop),
        }
    }

    fn long_double(&mut self, probe: &mut impl Probe) -> Result<(), Refusal> {
        self.stack(probe, 2).map(drop)
    }
}

/// A conversion's length modifier.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Size {
    Char,
    Short,
    Default,
    Long,
    LongLong,
    LongDouble,
    Word,
}

impl Size {
    /// Bytes an integer of this size takes (what `%n` or a scanf integer conversion writes).
    fn int_bytes(self) -> usize {
        match self {
            Size::Char => 1,
            Size::Short => 2,
            Size::Default => 4,
            Size::Long | Size::LongLong | Size::Word | Size::LongDouble => 8,
        }
    }
}

/// Reads the length modifier at `at`; returns it and where the conversion letter is.
fn size(probe: &mut impl Probe, mut at: usize) -> (Size, usize) {
    let size = match probe.byte(at) {
        b'h' => {
            at += 1;
            if probe.byte(at) == b'h' {
                at += 1;
                Size::Char
            } else {
                Size::Short
            }
        }
        b'l' => {
            at += 1;
            if probe.byte(at) == b'l' {
                at += 1;
                Size::LongLong
            } else {
                Size::Long
            }
        }
        b'q' => {
            at += 1;
            Size::LongLong
        }
        b'L' => {
            at += 1;
            Size::LongDouble
        }
        b'j' | b'z' | b'Z' | b't' => {
            at += 1;
            Size::Word
        }
        _ => Size::Default,
    };
    (size, at)
}

/// Digits at `at`: their value (saturating) and where they end.
fn digits(probe: &mut impl Probe, mut at: usize) -> (usize, usize) {
    let mut value = 0usize;
    loop {
        let b = probe.byte(at);
        if !b.is_ascii_digit() {
            return (value, at);
        }
        value = value.saturating_mul(10).saturating_add(usize::from(b - b'0'));
        at += 1;
    }
}

/// Whether the conversion at `at` (just after `%`) names its argument by position (`%2$s`).
fn positional(probe: &mut impl Probe, at: usize) -> bool {
    let (_, end) = digits(probe, at);
    end != at && probe.byte(end) == b'$'
}

/// What comes next in a format.
enum Next {
    /// A conversion, beginning here (just after its `%`).
    Conversion(usize),
    /// The end of the format.
    End,
    /// A conversion that names its argument by position (`%2$s`): such arguments are taken in any order, so the
    /// rest of the format has only been read.
    Positional,
}

/// What comes next in the format at `at`.
fn next_conversion(probe: &mut impl Probe, mut at: usize) -> Next {
    loop {
        let b = probe.byte(at);
        at += 1;
        match b {
            0 => return Next::End,
            b'%' if probe.byte(at) == b'%' => at += 1,
            b'%' if positional(probe, at) => {
                string(probe, at, None, false);
                return Next::Positional;
            }
            b'%' => return Next::Conversion(at),
            _ => {}
        }
    }
}

/// Widths and precisions up to this formatting does without `malloc` (glibc takes larger work buffers from the
/// heap past its stack limit).
const PLAIN_WIDTH: usize = 4096;

/// The `va_list` of System V x86-64 (one element of its array type).
#[repr(C)]
struct VaList {
    gp_offset: u32,
    fp_offset: u32,
    overflow_arg_area: usize,
    reg_save_area: usize,
}

extern "C" {
    /// glibc's, with the `va_list` spelled out.
    fn vsnprintf(s: *mut std::ffi::c_char, n: usize, format: *const std::ffi::c_char, list: *mut VaList) -> i32;
}

/// How long the text of the printf call in `args` is (without its NUL), found by formatting it with no buffer:
/// only for formats [`printf`] found plain. None when glibc reports an error.
fn formatted_length(format: usize, rest: Rest, args: &Arguments, probe: &mut impl Probe) -> Option<usize> {
    // A register save area as a variadic callee's prologue would lay it out: six integer registers, then eight
    // vector registers of sixteen bytes (only the low eight are passed for a double).
    let mut save = [0u64; 22];
    let mut list = match rest {
        Rest::Variadic => {
            save[..6].copy_from_slice(&args.ints);
            for (i, float) in args.floats.iter().enumerate() {
                save[6 + 2 * i] = *float;
            }
            VaList {
                gp_offset: u32::try_from((format + 1) * 8).unwrap_or(u32::MAX).min(GP_SAVE_END as u32),
                fp_offset: GP_SAVE_END as u32,
                overflow_arg_area: args.stack,
                reg_save_area: save.as_mut_ptr() as usize,
            }
        }
        Rest::VaList(i) => {
            // A copy: the host's function reads the domain's own from its start.
            let list = args.ints.get(i).copied().unwrap_or(0) as usize;
            let offsets = probe.word(list);
            VaList {
                gp_offset: offsets as u32,
                fp_offset: (offsets >> 32) as u32,
                overflow_arg_area: probe.word(list.wrapping_add(8)) as usize,
                reg_save_area: probe.word(list.wrapping_add(16)) as usize,
            }
        }
    };
    let format = args.ints.get(format).copied().unwrap_or(0) as *const std::ffi::c_char;
    // SAFETY: with no buffer vsnprintf writes only its own stack; it reads the format and the arguments, which the
    // walk has just read (inside a domain, where it may not read, it faults as the domain's; see `Touch`), through
    // a `va_list` laid out as System V lays out a variadic call's. The format is plain, so nothing allocates.
    let n = unsafe { vsnprintf(std::ptr::null_mut(), 0, format, &mut list) };
    usize::try_from(n).ok()
}

/// Walks a printf format through its arguments; Ok(true) when the format is plain (its formatting cannot allocate:
/// see the module's notes).
fn printf(probe: &mut impl Probe, format: usize, args: &mut Cursor, forbid_n: bool) -> Result<bool, Refusal> {
    let mut at = format;
    let mut plain = true;
    loop {
        at = match next_conversion(probe, at) {
            Next::Conversion(at) => at,
            Next::End => return Ok(plain),
            Next::Positional => return Ok(false),
        };
        while matches!(probe.byte(at), b'-' | b'+' | b' ' | b'#' | b'0' | b'\'' | b'I') {
            // `I`: the locale's digits, which glibc converts through its wide-character machinery.
            plain &= probe.byte(at) != b'I';
            at += 1;
        }
        let width = if probe.byte(at) == b'*' {
            at += 1;
            (args.int(probe)? as i32).unsigned_abs() as usize
        } else {
            let (width, end) = digits(probe, at);
            at = end;
            width
        };
        let mut precision = None;
        if probe.byte(at) == b'.' {
            at += 1;
            if probe.byte(at) == b'*' {
                let p = args.int(probe)? as i32;
                precision = usize::try_from(p).ok();
                at += 1;
            } else {
                let (p, end) = digits(probe, at);
                precision = Some(p);
                at = end;
            }
        }
        plain &= width <= PLAIN_WIDTH && precision.is_none_or(|p| p <= PLAIN_WIDTH);
        let (size, letter_at) = size(probe, at);
        at = letter_at;
        let letter = probe.byte(at);
        if letter == 0 {
            return Ok(plain);
        }
        at += 1;
        // Wide characters and strings go through the locale's conversion, which may load and allocate; `%m` looks
        // up a message, which may too.
        let wide = matches!(letter, b'C' | b'S') || (matches!(letter, b'c' | b's') && size == Size::Long);
        plain &= !wide && letter != b'm';
        match letter {
            b'd' | b'i' | b'o' | b'u' | b'x' | b'X' | b'c' | b'C' | b'p' => {
                args.int(probe)?;
            }
            b'e' | b'E' | b'f' | b'F' | b'g' | b'G' | b'a' | b'A' => {
                if size == Size::LongDouble {
                    args.long_double(probe)?;
                } else {
                    args.double(probe)?;
                }
            }
            b's' | b'S' => {
                let p = args.int(probe)? as usize;
                // glibc prints "(null)" for a null string.
                if p != 0 {
                    string(probe, p, precision, letter == b'S' || size == Size::Long);
                }
            }
            b'n' => {
                if forbid_n {
                    return Err(Refusal::Fortified);
                }
                let p = args.int(probe)? as usize;
                probe.write(p, size.int_bytes());
            }
            // `%m` takes nothing; an unknown conversion is printed as it is.
            _ => {}
        }
    }
}

fn scanf(probe: &mut impl Probe, format: usize, args: &mut Cursor) -> Result<(), Refusal> {
    let mut at = format;
    while let Next::Conversion(conversion) = next_conversion(probe, at) {
        at = conversion;
        let assigns = probe.byte(at) != b'*';
        if !assigns {
            at += 1;
        }
        let (width, end) = digits(probe, at);
        let width = (end != at).then_some(width);
        at = end;
        // `m`: the function allocates the string and writes the pointer (the host's heap; the domain cannot free it).
        let allocates = probe.byte(at) == b'm';
        if allocates {
            at += 1;
        }
        let (size, letter_at) = size(probe, at);
        at = letter_at;
        let letter = probe.byte(at);
        if letter == 0 {
            return Ok(());
        }
        at += 1;
        if letter == b'[' {
            // The set: a `]` right after `[` or `[^` belongs to it.
            if probe.byte(at) == b'^' {
                at += 1;
            }
            if probe.byte(at) == b']' {
                at += 1;
            }
            loop {
                match probe.byte(at) {
                    0 => break,
                    b']' => {
                        at += 1;
                        break;
                    }
                    _ => at += 1,
                }
            }
        }
        if !assigns {
            continue;
        }
        let unit = if size == Size::Long { 4 } else { 1 };
        let bytes = match letter {
            _ if allocates && matches!(letter, b's' | b'c' | b'[' | b'S' | b'C') => 8,
            b'd' | b'i' | b'o' | b'u' | b'x' | b'X' | b'n' => size.int_bytes(),
            b'e' | b'E' | b'f' | b'F' | b'g' | b'G' | b'a' | b'A' => match size {
                Size::LongDouble => 16,
                Size::Long => 8,
                _ => 4,
            },
            b'p' => 8,
            // Up to the width, and the NUL; without a width only its first byte can be checked.
            b's' | b'[' => width.map_or(unit, |w| w.saturating_add(1).saturating_mul(unit)),
            b'S' => width.map_or(4, |w| w.saturating_add(1).saturating_mul(4)),
            b'c' => width.unwrap_or(1).saturating_mul(unit),
            b'C' => width.unwrap_or(1).saturating_mul(4),
            // An unknown conversion ends the scan.
            _ => return Ok(()),
        };
        let p = args.int(probe)? as usize;
        probe.write(p, bytes);
    }
    Ok(())
}

/// The probe a gate runs: it touches the memory inside the domain, with the domain's rights, so a pointer the
/// domain may not use faults here as the domain's.
pub struct Touch;

/// The smallest page: touching one byte in each 4 KiB of a range touches every page of it.
const PAGE: usize = 4096;

impl Touch {
    /// Every page of `[at, at + len)`, once: its first byte, then the start of each page after it (a fault names the
    /// first address the function would have failed at). A range that wraps around the address space touches the
    /// last address, which is never mapped in user space.
    fn pages(at: usize, len: usize, mut touch: impl FnMut(usize)) {
        if len == 0 {
            return;
        }
        let Some(last) = at.checked_add(len - 1) else {
            touch(usize::MAX);
            return;
        };
        touch(at);
        let mut page = at & !(PAGE - 1);
        while page < last & !(PAGE - 1) {
            page += PAGE;
            touch(page);
        }
    }
}

impl Probe for Touch {
    fn byte(&mut self, at: usize) -> u8 {
        // SAFETY: a read of any address, under the domain's rights: where the domain may read it, the read is
        // harmless; where it may not, the processor faults and the gate's handler ends the call there (this
        // function never continues, and no state of it is observed afterwards).
        unsafe { std::ptr::read_volatile(at as *const u8) }
    }

    fn word(&mut self, at: usize) -> u64 {
        // SAFETY: a read of any address, under the domain's rights: harmless where the domain may read, a fault the
        // gate's handler ends the call on where it may not; read bytewise-unaligned since a domain's pointers need
        // not be aligned.
        u64::from_le_bytes(unsafe { std::ptr::read_volatile(at as *const [u8; 8]) })
    }

    fn read(&mut self, at: usize, len: usize) {
        Touch::pages(at, len, |p| {
            self.byte(p);
        });
    }

    fn write(&mut self, at: usize, len: usize) {
        Touch::pages(at, len, |p| {
            // SAFETY: a locked `or` of zero changes no byte, even with another thread writing the same one; where
            // the domain may not write, the processor faults before anything is written, and the gate's handler
            // ends the call (see `byte`). Written out because the compiler turns an atomic `or` of zero into a
            // load, which would check reading only.
            unsafe { std::arch::asm!("lock or byte ptr [{p}], 0", p = in(reg) p, options(nostack)) };
        });
    }
}

/// The checks of the host-gated imports, by the name the extension imports. An import not named here is passed
/// to the host as it is (callbacks, and functions whose arguments are all values).
pub fn for_import(name: &str) -> Option<&'static GateCheck> {
    TABLE.iter().find(|c| c.name == name)
}

use Check::{Printf, Read, Scanf, Str, Stream, Write};

const fn s(arg: usize) -> Check {
    Str { arg, null_ok: false }
}
const fn s_or_null(arg: usize) -> Check {
    Str { arg, null_ok: true }
}
const fn file(arg: usize) -> Check {
    Stream { arg, null_ok: false }
}
const fn read(arg: usize, len: Len) -> Check {
    Read { arg, len, null_ok: false }
}
const fn write(arg: usize, len: Len) -> Check {
    Write { arg, len, null_ok: false }
}
const fn write_or_null(arg: usize, len: Len) -> Check {
    Write { arg, len, null_ok: true }
}
const fn printf_call(format: usize) -> Check {
    Printf { format, rest: Rest::Variadic, fortify_flag: None, output: None }
}
const fn printf_list(format: usize) -> Check {
    Printf { format, rest: Rest::VaList(format + 1), fortify_flag: None, output: None }
}
const fn printf_chk(flag: usize, format: usize, rest: Rest) -> Check {
    Printf { format, rest, fortify_flag: Some(flag), output: None }
}
/// `sprintf` and `vsprintf` (format and rest after the buffer).
const fn sprintf(rest: Rest) -> Check {
    Printf { format: 1, rest, fortify_flag: None, output: Some(Output { dst: 0, object: None }) }
}
/// `__sprintf_chk` and `__vsprintf_chk`: buffer, flag, object size, format, rest.
const fn sprintf_chk(rest: Rest) -> Check {
    Printf { format: 3, rest, fortify_flag: Some(1), output: Some(Output { dst: 0, object: Some(2) }) }
}
const fn scanf_call(format: usize) -> Check {
    Scanf { format, rest: Rest::Variadic }
}
const fn scanf_list(format: usize) -> Check {
    Scanf { format, rest: Rest::VaList(format + 1) }
}
const fn gate(name: &'static str, checks: &'static [Check]) -> GateCheck {
    GateCheck { name, checks }
}

use Len::{Arg, Bytes, IntArg, Product};

const TABLE: &[GateCheck] = &[
    // ---- stdio ----
    gate("printf", &[printf_call(0)]),
    gate("fprintf", &[file(0), printf_call(1)]),
    gate("dprintf", &[printf_call(1)]),
    gate("vprintf", &[printf_list(0)]),
    gate("vfprintf", &[file(0), printf_list(1)]),
    gate("vdprintf", &[printf_list(1)]),
    // The output of sprintf is as long as the formatting makes it: the check formats it first (see the notes above).
    gate("sprintf", &[sprintf(Rest::Variadic)]),
    gate("vsprintf", &[sprintf(Rest::VaList(2))]),
    gate("snprintf", &[write(0, Arg(1)), printf_call(2)]),
    gate("vsnprintf", &[write(0, Arg(1)), printf_list(2)]),
    gate("__printf_chk", &[printf_chk(0, 1, Rest::Variadic)]),
    gate("__fprintf_chk", &[file(0), printf_chk(1, 2, Rest::Variadic)]),
    gate("__dprintf_chk", &[printf_chk(1, 2, Rest::Variadic)]),
    gate("__vprintf_chk", &[printf_chk(0, 1, Rest::VaList(2))]),
    gate("__vfprintf_chk", &[file(0), printf_chk(1, 2, Rest::VaList(3))]),
    gate("__vdprintf_chk", &[printf_chk(1, 2, Rest::VaList(3))]),
    gate("__sprintf_chk", &[Check::Fortify(Fortify::NonEmpty { slen: 2 }), sprintf_chk(Rest::Variadic)]),
    gate("__vsprintf_chk", &[Check::Fortify(Fortify::NonEmpty { slen: 2 }), sprintf_chk(Rest::VaList(4))]),
    gate(
        "__snprintf_chk",
        &[
            Check::Fortify(Fortify::MaxlenFits { maxlen: 1, slen: 3 }),
            write(0, Arg(1)),
            printf_chk(2, 4, Rest::Variadic),
        ],
    ),
    gate(
        "__vsnprintf_chk",
        &[
            Check::Fortify(Fortify::MaxlenFits { maxlen: 1, slen: 3 }),
            write(0, Arg(1)),
            printf_chk(2, 4, Rest::VaList(5)),
        ],
    ),
    gate("scanf", &[scanf_call(0)]),
    gate("fscanf", &[file(0), scanf_call(1)]),
    gate("sscanf", &[s(0), scanf_call(1)]),
    gate("vscanf", &[scanf_list(0)]),
    gate("vfscanf", &[file(0), scanf_list(1)]),
    gate("vsscanf", &[s(0), scanf_list(1)]),
    gate("__isoc99_scanf", &[scanf_call(0)]),
    gate("__isoc99_fscanf", &[file(0), scanf_call(1)]),
    gate("__isoc99_sscanf", &[s(0), scanf_call(1)]),
    gate("__isoc99_vscanf", &[scanf_list(0)]),
    gate("__isoc99_vfscanf", &[file(0), scanf_list(1)]),
    gate("__isoc99_vsscanf", &[s(0), scanf_list(1)]),
    gate("__isoc23_scanf", &[scanf_call(0)]),
    gate("__isoc23_fscanf", &[file(0), scanf_call(1)]),
    gate("__isoc23_sscanf", &[s(0), scanf_call(1)]),
    gate("__isoc23_vscanf", &[scanf_list(0)]),
    gate("__isoc23_vfscanf", &[file(0), scanf_list(1)]),
    gate("__isoc23_vsscanf", &[s(0), scanf_list(1)]),
    gate("puts", &[s(0)]),
    gate("fputs", &[s(0), file(1)]),
    gate("fputs_unlocked", &[s(0), file(1)]),
    gate("fputc", &[file(1)]),
    gate("putc", &[file(1)]),
    gate("_IO_putc", &[file(1)]),
    gate("fputc_unlocked", &[file(1)]),
    gate("putc_unlocked", &[file(1)]),
    gate("__overflow", &[file(0)]),
    gate("fwrite", &[read(0, Product(1, 2)), file(3)]),
    gate("fwrite_unlocked", &[read(0, Product(1, 2)), file(3)]),
    gate("fread", &[write(0, Product(1, 2)), file(3)]),
    gate("fread_unlocked", &[write(0, Product(1, 2)), file(3)]),
    gate(
        "__fread_chk",
        &[Check::Fortify(Fortify::ReadFits { object: 1, size: 2, n: 3 }), write(0, Product(2, 3)), file(4)],
    ),
    gate(
        "__fread_unlocked_chk",
        &[Check::Fortify(Fortify::ReadFits { object: 1, size: 2, n: 3 }), write(0, Product(2, 3)), file(4)],
    ),
    gate("fgets", &[write(0, IntArg(1)), file(2)]),
    gate("fgets_unlocked", &[write(0, IntArg(1)), file(2)]),
    gate("__fgets_chk", &[write(0, IntArg(2)), file(3)]),
    gate("__fgets_unlocked_chk", &[write(0, IntArg(2)), file(3)]),
    gate("fgetc", &[file(0)]),
    gate("getc", &[file(0)]),
    gate("_IO_getc", &[file(0)]),
    gate("getc_unlocked", &[file(0)]),
    gate("__uflow", &[file(0)]),
    gate("ungetc", &[file(1)]),
    gate("fopen", &[s(0), s(1)]),
    gate("fopen64", &[s(0), s(1)]),
    gate("fdopen", &[s(1)]),
    gate("freopen", &[s_or_null(0), s(1), file(2)]),
    gate("fclose", &[file(0)]),
    gate("fflush", &[Stream { arg: 0, null_ok: true }]),
    gate("fflush_unlocked", &[Stream { arg: 0, null_ok: true }]),
    gate("fseek", &[file(0)]),
    gate("fseeko", &[file(0)]),
    gate("fseeko64", &[file(0)]),
    gate("ftell", &[file(0)]),
    gate("ftello", &[file(0)]),
    gate("ftello64", &[file(0)]),
    gate("rewind", &[file(0)]),
    gate("fgetpos", &[file(0), write(1, Bytes(FPOS_BYTES))]),
    gate("fsetpos", &[file(0), read(1, Bytes(FPOS_BYTES))]),
    gate("feof", &[file(0)]),
    gate("ferror", &[file(0)]),
    gate("clearerr", &[file(0)]),
    gate("fileno", &[file(0)]),
    // The buffer a stream is given stays the stream's: checked now, written later.
    gate("setvbuf", &[file(0), write_or_null(1, Arg(3))]),
    gate("setbuf", &[file(0), write_or_null(1, Bytes(STDIO_BUFSIZ))]),
    gate("setlinebuf", &[file(0)]),
    gate("perror", &[s_or_null(0)]),
    // ---- gettext: a null domain means the current one; a null message gives null ----
    gate("gettext", &[s_or_null(0)]),
    gate("dgettext", &[s_or_null(0), s_or_null(1)]),
    gate("dcgettext", &[s_or_null(0), s_or_null(1)]),
    gate("ngettext", &[s_or_null(0), s_or_null(1)]),
    gate("dngettext", &[s_or_null(0), s_or_null(1), s_or_null(2)]),
    gate("dcngettext", &[s_or_null(0), s_or_null(1), s_or_null(2)]),
    gate("textdomain", &[s_or_null(0)]),
    gate("bindtextdomain", &[s_or_null(0), s_or_null(1)]),
    gate("bind_textdomain_codeset", &[s_or_null(0), s_or_null(1)]),
    // ---- calendar time ----
    gate("localtime", &[read(0, Bytes(TIME_BYTES))]),
    gate("gmtime", &[read(0, Bytes(TIME_BYTES))]),
    gate("localtime_r", &[read(0, Bytes(TIME_BYTES)), write(1, Bytes(TM_BYTES))]),
    gate("gmtime_r", &[read(0, Bytes(TIME_BYTES)), write(1, Bytes(TM_BYTES))]),
    // mktime and its kind normalise the fields they are given.
    gate("mktime", &[write(0, Bytes(TM_BYTES))]),
    gate("timegm", &[write(0, Bytes(TM_BYTES))]),
    gate("timelocal", &[write(0, Bytes(TM_BYTES))]),
    gate("strftime", &[write(0, Arg(1)), s(2), read(3, Bytes(TM_BYTES))]),
    gate("ctime", &[read(0, Bytes(TIME_BYTES))]),
    gate("ctime_r", &[read(0, Bytes(TIME_BYTES)), write(1, Bytes(ASCTIME_BYTES))]),
    gate("asctime", &[read(0, Bytes(TM_BYTES))]),
    gate("asctime_r", &[read(0, Bytes(TM_BYTES)), write(1, Bytes(ASCTIME_BYTES))]),
    // ---- waiting ----
    gate("nanosleep", &[read(0, Bytes(TIMESPEC_BYTES)), write_or_null(1, Bytes(TIMESPEC_BYTES))]),
    gate("clock_nanosleep", &[read(2, Bytes(TIMESPEC_BYTES)), write_or_null(3, Bytes(TIMESPEC_BYTES))]),
    // ---- the environment ----
    gate("getenv", &[s(0)]),
    gate("secure_getenv", &[s(0)]),
    // ---- message texts ----
    gate("strerror_r", &[write(1, Arg(2))]),
    gate("__xpg_strerror_r", &[write(1, Arg(2))]),
];

#[cfg(test)]
mod tests;
