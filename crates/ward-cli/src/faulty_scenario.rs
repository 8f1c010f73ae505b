//! The fault kinds of the built-in `faulty` extension (numbers as in extensions/faulty.c) and the values the
//! demo's scenario expects.

/// `faulty_arm(WILD_WRITE, addr)` writes into the int64 at `addr`.
pub const WILD_WRITE: i64 = 2;

/// What the host keeps in the int64 a wild write aims at.
pub const HOST_VALUE: i64 = 42;
/// `faulty_compute(6)` of an unarmed incarnation: 6 * 6 + 1.
pub const COMPUTE_ARG: i64 = 6;
pub const COMPUTE_EXPECTED: i64 = 37;
/// `faulty_counter_add(5)` then `faulty_counter_add(7)`.
pub const ADDS: [i64; 2] = [5, 7];
pub const COUNTER_EXPECTED: i64 = 12;

/// Fault kinds 1..=13 with the demo's name for each.
pub const KINDS: [(i64, &str); 13] = [
    (1, "null dereference"),
    (2, "wild write to a host address"),
    (3, "abort"),
    (4, "exit(3)"),
    (5, "infinite loop"),
    (6, "unbounded recursion"),
    (7, "memory bomb"),
    (8, "descriptor leak"),
    (9, "raise(SIGKILL)"),
    (10, "garbage reply"),
    (11, "forged reply"),
    (12, "division by zero"),
    (13, "illegal instruction"),
];

/// Kinds that need a process domain of their own (faulty_mpk.so leaves them out): a descriptor leak, raise(SIGKILL)
/// and the two attacks on a process domain's rings.
pub const PROCESS_ONLY: [i64; 4] = [8, 9, 10, 11];

/// The second argument of `faulty_arm` for `kind` when no host address is involved: the starting depth of the
/// recursion, ignored by the others.
pub const DEFAULT_ARM_ARG: i64 = 0;
