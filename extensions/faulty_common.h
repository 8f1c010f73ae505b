/*
 * faulty_common.h -- what the faulty plugins share (faulty_ladspa.c, faulty_frei0r.c): the fault kinds (numbered
 * as in faulty.c), the faults that end or stop the process, and the rule deciding when a fault fires. Header-only
 * (static functions), so each plugin stays one self-contained shared object.
 */
#ifndef FAULTY_COMMON_H
#define FAULTY_COMMON_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

enum fault_kind {
    FAULT_NONE = 0,
    FAULT_NULL_DEREF = 1,
    FAULT_ABORT = 3,
    FAULT_EXIT3 = 4,
    FAULT_INFINITE_LOOP = 5,
    FAULT_RECURSION = 6,
    FAULT_DIV_ZERO = 12,
    FAULT_ILLEGAL = 13,
    FAULT_OVERRUN = 20,
    FAULT_NAN = 21, /* LADSPA only */
    FAULT_HOST_WRITE = 22,
};

/* Bytes an OVERRUN writes past the end of the output. */
#define OVERRUN_BYTES (64u * 1024u)
#define RECURSION_FRAME 1024
/* Largest block or call number a control value maps to; far beyond any real run. */
#define MAX_COUNT 1.0e15

/*
 * Every frame owns a volatile array that is used after the recursive call, so
 * the call cannot become a loop; the volatile read in the exit test keeps the
 * recursion from being provably endless (-Winfinite-recursion).
 */
__attribute__((noinline)) static unsigned recurse(unsigned depth) {
    volatile unsigned char frame[RECURSION_FRAME];
    for (size_t i = 0; i < sizeof frame; i += 64) {
        frame[i] = (unsigned char)depth;
    }
    if (frame[0] != (unsigned char)depth) {
        return depth;
    }
    return recurse(depth + 1) + frame[(depth % (RECURSION_FRAME / 64)) * 64];
}

/* Performs the kinds that end (or stop) the process; returns for the others. */
static inline void crash(long kind) {
    switch (kind) {
    case FAULT_NULL_DEREF: {
        /* A volatile pointer variable: the compiler cannot see it is NULL. */
        volatile int *volatile p = NULL;
        *p = 1;
        break;
    }
    case FAULT_ABORT:
        abort();
    case FAULT_EXIT3:
        exit(3);
    case FAULT_INFINITE_LOOP: {
        volatile unsigned long spins = 0;
        for (;;) {
            spins = spins + 1;
        }
    }
    case FAULT_RECURSION:
        (void)recurse(0);
        break;
    case FAULT_DIV_ZERO: {
        volatile int zero = 0;
        volatile int one = 1;
        volatile int result = one / zero;
        (void)result;
        /* Only reached on architectures whose division does not trap. */
        __builtin_trap();
        break;
    }
    case FAULT_ILLEGAL:
        __builtin_trap();
    case FAULT_HOST_WRITE: {
        /*
         * Writes the first byte of the environment's PATH back unchanged: harmless where the plugin has a process
         * to itself (natively, or in a domain process), a fault where the host's memory is read-only to it (an mpk
         * domain). Nothing happens without a PATH.
         */
        volatile char *path = getenv("PATH");
        if (path != NULL) {
            *path = *path;
        }
        break;
    }
    default:
        break;
    }
}

/* Nearest integer; NaN and absurd values mean "no fault". */
static inline long to_kind(double v) {
    if (!(v > -1.0e6 && v < 1.0e6)) {
        return FAULT_NONE;
    }
    return v >= 0.0 ? (long)(v + 0.5) : -(long)(0.5 - v);
}

/* Nearest block or call number; anything below 0.5 (NaN too) is 0, "every one". */
static inline uint64_t to_count(double v) {
    if (!(v >= 0.5)) {
        return 0;
    }
    if (v >= MAX_COUNT) {
        return (uint64_t)MAX_COUNT;
    }
    return (uint64_t)(v + 0.5);
}

/* Whether the fault fires on block or call `count` (1-based). */
static inline int fault_due(long kind, uint64_t count, uint64_t at, int repeat) {
    if (kind == FAULT_NONE) {
        return 0;
    }
    return at == 0 || count == at || (repeat && count >= at);
}

#endif
