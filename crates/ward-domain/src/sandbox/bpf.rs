//! The allow-list compiled to classic BPF as a binary search on the system call number, instead of seccompiler's
//! chain of one comparison per call.
//!
//! Installing a filter costs the kernel more than running it: it precomputes, for every system call number, whether
//! the filter allows it whatever the arguments, by running the filter on that number alone. Through a chain that is
//! the whole chain for most numbers (about 450 numbers times some 400 instructions), which made installing the
//! allow-list cost several hundred microseconds, paid by every domain and again by every incarnation. A search
//! reaches any number's rules in eight comparisons. The program decides exactly as seccompiler's does for the same
//! list (a test runs both on every number and many arguments): the architecture checked first (another kills the
//! process), the listed calls allowed when one alternative of their conditions holds (each on an argument's low 32
//! bits), everything else trapped.

use seccompiler::{sock_filter, BpfProgram};

use super::syscalls::{Allowed, Arg};

// Instruction codes (`linux/bpf_common.h`): class, then operation and source.
/// `BPF_LD | BPF_W | BPF_ABS`.
const LD_W_ABS: u16 = 0x20;
/// `BPF_ALU | BPF_AND | BPF_K`.
const ALU_AND_K: u16 = 0x54;
/// `BPF_JMP | BPF_JA`.
const JA: u16 = 0x05;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const JEQ_K: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const JGE_K: u16 = 0x35;
/// `BPF_JMP | BPF_JSET | BPF_K`.
const JSET_K: u16 = 0x45;
/// `BPF_RET | BPF_K`.
const RET_K: u16 = 0x06;

/// `struct seccomp_data`: the number, the architecture, the arguments (the low half of each, little-endian).
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
const ARGS_OFFSET: u32 = 16;
/// `AUDIT_ARCH_X86_64`.
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// The kernel takes at most this many instructions.
const MAX_LEN: usize = 4096;
/// Numbers compared one after the other at the bottom of the search.
const LEAF: usize = 8;

/// Why the list cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("system call {0} is not a number the filter can compare")]
    Number(i64),
    #[error("system call {nr}: argument {index} cannot be compared with {value:#x} (only its low 32 bits are)")]
    Value { nr: i64, index: u8, value: u64 },
    #[error("system call {0} is listed twice")]
    Twice(i64),
    #[error("the filter would have {0} instructions, more than the kernel takes")]
    TooLong(usize),
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// `list` as a filter that allows what it lists and traps everything else.
pub fn compile(list: &[Allowed]) -> Result<BpfProgram, CompileError> {
    compile_with(list, &[], libc::SECCOMP_RET_TRAP)
}

/// `list` as a filter that allows what it lists (under its conditions, trapping the rest of those calls), traps the
/// calls `refused` names, and answers `otherwise` for every other call.
pub fn compile_with(list: &[Allowed], refused: &[i64], otherwise: u32) -> Result<BpfProgram, CompileError> {
    let number = |nr: i64| u32::try_from(nr).map_err(|_| CompileError::Number(nr));
    let mut entries: Vec<(u32, Vec<sock_filter>)> = Vec::with_capacity(list.len() + refused.len());
    for entry in list {
        entries.push((number(entry.nr)?, rules_of(entry)?));
    }
    for &nr in refused {
        entries.push((number(nr)?, vec![stmt(RET_K, libc::SECCOMP_RET_TRAP)]));
    }
    entries.sort_by_key(|(nr, _)| *nr);
    if let Some(pair) = entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(CompileError::Twice(i64::from(pair[0].0)));
    }
    let mut program = vec![
        stmt(LD_W_ABS, ARCH_OFFSET),
        jump(JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(LD_W_ABS, NR_OFFSET),
    ];
    // The search first, its leaves jumping to each number's rules (`JA` takes any distance), then the rules.
    let numbers: Vec<(u32, bool)> = entries.iter().map(|(nr, rules)| (*nr, rules.is_empty())).collect();
    let mut leaps = Vec::new();
    search(&numbers, 0, otherwise, &mut program, &mut leaps);
    let mut starts = Vec::with_capacity(entries.len());
    for (_, rules) in &entries {
        // An empty one is never jumped to.
        starts.push(program.len());
        program.extend_from_slice(rules);
    }
    for (at, entry) in leaps {
        // A forward jump: the rules come after the whole search.
        program[at].k = (starts[entry] - at - 1) as u32;
    }
    if program.len() > MAX_LEN {
        return Err(CompileError::TooLong(program.len()));
    }
    Ok(program)
}

/// The search over `numbers` (sorted, the `first`-th of the list on; each with whether it is allowed whatever its
/// arguments), answering `otherwise` for a number not among them: `leaps` gets each leaf's `JA` to rules and the entry
/// it goes to, to be aimed once the rules are placed.
fn search(
    numbers: &[(u32, bool)],
    first: usize,
    otherwise: u32,
    program: &mut Vec<sock_filter>,
    leaps: &mut Vec<(usize, usize)>,
) {
    if numbers.len() <= LEAF {
        // A number allowed whatever its arguments jumps to the leaf's own allow at its end; the others to their
        // rules (`JA`). At most 2 * LEAF + 2 instructions, so every jump inside fits.
        let mut to_allow = Vec::new();
        for (i, &(nr, always)) in numbers.iter().enumerate() {
            if always {
                to_allow.push(program.len());
                program.push(jump(JEQ_K, nr, 0, 0));
            } else {
                program.push(jump(JEQ_K, nr, 0, 1));
                leaps.push((program.len(), first + i));
                program.push(stmt(JA, 0));
            }
        }
        program.push(stmt(RET_K, otherwise));
        let allow = program.len();
        program.push(stmt(RET_K, libc::SECCOMP_RET_ALLOW));
        for at in to_allow {
            program[at].jt = (allow - at - 1) as u8;
        }
        return;
    }
    let half = numbers.len() / 2;
    // Below numbers[half]: the lower half, which follows the `JA` over it; from it on, the upper half.
    program.push(jump(JGE_K, numbers[half].0, 0, 1));
    let over = program.len();
    program.push(stmt(JA, 0));
    search(&numbers[..half], first, otherwise, program, leaps);
    program[over].k = (program.len() - over - 1) as u32;
    search(&numbers[half..], first + half, otherwise, program, leaps);
}

/// One number's rules, with the system call number in the accumulator: allow when any alternative holds, else trap;
/// none for a number allowed whatever its arguments.
fn rules_of(entry: &Allowed) -> Result<Vec<sock_filter>, CompileError> {
    if entry.when.is_empty() {
        // Allowed whatever its arguments: the search answers it.
        return Ok(Vec::new());
    }
    let mut rules = Vec::new();
    for alternative in &entry.when {
        // Each test jumps, when it fails, past the rest of its alternative (to the next one, or the trap).
        let tests = alternative.iter().map(|&arg| test(entry.nr, arg)).collect::<Result<Vec<_>, _>>()?;
        let mut left: usize = tests.iter().map(Vec::len).sum::<usize>() + 1;
        for mut test in tests {
            left -= test.len();
            let fail = u8::try_from(left).map_err(|_| CompileError::TooLong(left))?;
            if let Some(last) = test.last_mut() {
                // Tests are built with 1 where they fail: their own last instruction jumps over the rest.
                if last.jt == 1 {
                    last.jt = fail;
                } else {
                    last.jf = fail;
                }
            }
            rules.extend(test);
        }
        rules.push(stmt(RET_K, libc::SECCOMP_RET_ALLOW));
    }
    rules.push(stmt(RET_K, libc::SECCOMP_RET_TRAP));
    Ok(rules)
}

/// One condition: load the argument's low half, and end with a jump whose failing side is 1 (set by `rules_of`).
fn test(nr: i64, arg: Arg) -> Result<Vec<sock_filter>, CompileError> {
    let (index, value) = match arg {
        Arg::Is(i, v) | Arg::IsNot(i, v) | Arg::Clear(i, v) | Arg::Set(i, v) => (i, v),
        Arg::NotNegative(i) => (i, 0),
    };
    let constant = u32::try_from(value).map_err(|_| CompileError::Value { nr, index, value })?;
    if index > 5 {
        return Err(CompileError::Value { nr, index, value });
    }
    let load = stmt(LD_W_ABS, ARGS_OFFSET + 8 * u32::from(index));
    Ok(match arg {
        Arg::Is(..) => vec![load, jump(JEQ_K, constant, 0, 1)],
        Arg::IsNot(..) => vec![load, jump(JEQ_K, constant, 1, 0)],
        Arg::Clear(..) => vec![load, jump(JSET_K, constant, 1, 0)],
        Arg::Set(..) => vec![load, stmt(ALU_AND_K, constant), jump(JEQ_K, constant, 0, 1)],
        Arg::NotNegative(..) => vec![load, jump(JSET_K, 0x8000_0000, 1, 0)],
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::syscalls::{allowed, rules, Loosen, Role};
    use super::*;

    /// A classic BPF interpreter for what these programs use: the answer for (number, architecture, arguments).
    pub(in crate::sandbox) fn run(program: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let word = |offset: u32| -> u32 {
            match offset {
                0 => nr,
                4 => arch,
                o if (16..64).contains(&o) => {
                    let arg = args[((o - 16) / 8) as usize];
                    if (o - 16) % 8 == 0 {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
                o => panic!("load of offset {o}"),
            }
        };
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let i = &program[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => a = word(i.k),
                ALU_AND_K => a &= i.k,
                JA => pc += i.k as usize,
                JEQ_K | JGE_K | JSET_K | 0x25 /* JGT */ => {
                    let taken = match i.code {
                        JEQ_K => a == i.k,
                        JGE_K => a >= i.k,
                        JSET_K => a & i.k != 0,
                        _ => a > i.k,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                RET_K => return i.k,
                code => panic!("instruction {code:#x}"),
            }
        }
    }

    fn every_loosening() -> impl Iterator<Item = Loosen> {
        (0..16u8).map(|b| Loosen { network: b & 1 != 0, exec: b & 2 != 0, fork: b & 4 != 0, writes: b & 8 != 0 })
    }

    #[test]
    fn the_search_decides_as_seccompilers_chain_for_every_number_and_many_arguments() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for role in [Role::Zygote { host: None }, Role::Zygote { host: Some(4242) }, Role::Serving { own: 3 }] {
            for loosen in every_loosening() {
                let list = allowed(role, loosen);
                let ours = compile(&list).expect("compiles");
                let filter = seccompiler::SeccompFilter::new(
                    rules(role, loosen).expect("rules"),
                    seccompiler::SeccompAction::Trap,
                    seccompiler::SeccompAction::Allow,
                    seccompiler::TargetArch::x86_64,
                )
                .expect("a valid filter");
                let theirs: BpfProgram = filter.try_into().expect("compiles");
                // Every constant the list compares with, and its neighbours and masks' parts.
                let mut values = vec![0u64, 1, 2, 3, u64::from(u32::MAX), 0x8000_0000, 1 << 32, u64::MAX];
                for entry in &list {
                    for alternative in &entry.when {
                        for &arg in alternative {
                            if let Arg::Is(_, v) | Arg::IsNot(_, v) | Arg::Clear(_, v) | Arg::Set(_, v) = arg {
                                values.extend([v, v.wrapping_add(1), v.wrapping_sub(1), v | (7 << 32), v & !1]);
                                values.extend((0..32).map(|bit| v & (1 << bit)).filter(|&b| b != 0));
                            }
                        }
                    }
                }
                let arches = [AUDIT_ARCH_X86_64, 0x4000_0003];
                for nr in (0..470u32).chain([0x4000_0000, 0x4000_0001, 0x4000_0101, u32::MAX]) {
                    for arch in arches {
                        let tries = if arch == AUDIT_ARCH_X86_64 { 300 } else { 1 };
                        for _ in 0..tries {
                            let args = std::array::from_fn(|_| match next() % 4 {
                                0 => next(),
                                _ => values[(next() % values.len() as u64) as usize],
                            });
                            assert_eq!(
                                run(&ours, nr, arch, args),
                                run(&theirs, nr, arch, args),
                                "{role:?} {loosen:?}: system call {nr} (arch {arch:#x}) with {args:x?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_listed_call_is_allowed_and_others_trapped() {
        let list = allowed(Role::Serving { own: 3 }, Loosen::default());
        let program = compile(&list).expect("compiles");
        let x86 = AUDIT_ARCH_X86_64;
        assert_eq!(run(&program, libc::SYS_read as u32, x86, [0; 6]), libc::SECCOMP_RET_ALLOW);
        assert_eq!(run(&program, libc::SYS_ptrace as u32, x86, [0; 6]), libc::SECCOMP_RET_TRAP);
        assert_eq!(run(&program, libc::SYS_kill as u32, x86, [3, 9, 0, 0, 0, 0]), libc::SECCOMP_RET_ALLOW);
        assert_eq!(run(&program, libc::SYS_kill as u32, x86, [1, 9, 0, 0, 0, 0]), libc::SECCOMP_RET_TRAP);
        assert_eq!(run(&program, libc::SYS_read as u32, 0x4000_0003, [0; 6]), libc::SECCOMP_RET_KILL_PROCESS);
    }
}
