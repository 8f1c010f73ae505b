/*
 * faulty.c -- ward's deliberately faulty built-in test extension.
 *
 * Every way a native extension can take its process down (or try to fool the
 * host), available either armed (faulty_arm(kind, arg) makes the next
 * faulty_compute() call trigger it) or immediately (one faulty_* entry point
 * per kind that faults on every call). Also keeps a counter so tests can see
 * that a crashed and restarted domain lost its state.
 *
 * Fault kinds (enum fault_kind; the numbers are part of the interface):
 *    1 NULL_DEREF     write through a NULL pointer             -> SIGSEGV
 *    2 WILD_WRITE     write 0x5741524457415244 to the int64_t at address arg
 *    3 ABORT          abort()                                  -> SIGABRT
 *    4 EXIT3          exit(3)
 *    5 INFINITE_LOOP  spin forever
 *    6 RECURSION      unbounded recursion                      -> stack overflow
 *    7 MEMORY_BOMB    allocate and touch 1 MiB blocks forever; no NULL check,
 *                     so hitting the address-space limit ends in SIGSEGV
 *    8 FD_LEAK        open /dev/null forever; abort() once open fails
 *    9 RAISE_KILL     raise(SIGKILL)
 *   10 GARBAGE_REPLY  write 48 bytes of 0xA5 into ward's reply ring
 *   11 FORGED_REPLY   write a well-formed reply with an id no call uses
 *   12 DIV_ZERO       integer division by zero                 -> SIGFPE
 *   13 ILLEGAL        __builtin_trap()                         -> SIGILL
 *
 * GARBAGE_REPLY and FORGED_REPLY only do something inside a ward process
 * domain (where the shared memfd "ward-xpc" is mapped): they publish their
 * record, ring the doorbell and then block forever. Natively they return -1.
 *
 * Built with -fvisibility=hidden: only the functions marked FAULTY_EXPORT are
 * exported.
 *
 * With FAULTY_IN_PROCESS defined (faulty_mpk.c), the kinds that need a process
 * of their own are left out (FD_LEAK, RAISE_KILL, GARBAGE_REPLY, FORGED_REPLY:
 * faulty_arm disarms them), and so are their imports (descriptors, signals,
 * raw system calls), which an mpk domain cannot take.
 *
 * faulty_slow(ms) is no fault: a call that takes ms milliseconds (process
 * domains only), for the tests of learned deadlines.
 *
 * The faulty_gate_* functions hand C library functions pointers they cannot
 * use (see below); they are not kinds faulty_arm knows.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <libintl.h>
#include <linux/futex.h>
#include <locale.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ward_xpc_layout.h"

#define FAULTY_EXPORT __attribute__((visibility("default")))

enum fault_kind {
    FAULT_NONE = 0,
    FAULT_NULL_DEREF = 1,
    FAULT_WILD_WRITE = 2,
    FAULT_ABORT = 3,
    FAULT_EXIT3 = 4,
    FAULT_INFINITE_LOOP = 5,
    FAULT_RECURSION = 6,
    FAULT_MEMORY_BOMB = 7,
    FAULT_FD_LEAK = 8,
    FAULT_RAISE_KILL = 9,
    FAULT_GARBAGE_REPLY = 10,
    FAULT_FORGED_REPLY = 11,
    FAULT_DIV_ZERO = 12,
    FAULT_ILLEGAL = 13,
};

#define WILD_WRITE_VALUE 0x5741524457415244ll /* "DRAWDRAW" little-endian */
#define FORGED_REPLY_ID 0x7761726400000001ull
#define FORGED_REPLY_RET_INT 42
#define BOMB_BLOCK (1024u * 1024u)
#define RECURSION_FRAME 1024

/* ---- counter ------------------------------------------------------------ */

static int64_t counter;

FAULTY_EXPORT int64_t faulty_counter_add(int64_t d) {
    return __atomic_add_fetch(&counter, d, __ATOMIC_SEQ_CST);
}

FAULTY_EXPORT int64_t faulty_counter_get(void) {
    return __atomic_load_n(&counter, __ATOMIC_SEQ_CST);
}

/* ---- the faults ---------------------------------------------------------- */

FAULTY_EXPORT void faulty_null_deref(void) {
    /* A volatile pointer variable: the compiler cannot see it is NULL. */
    volatile int64_t *volatile p = NULL;
    *p = 1;
}

FAULTY_EXPORT void faulty_wild_write(int64_t *addr) {
    *(volatile int64_t *)addr = WILD_WRITE_VALUE;
}

/* The address a buffer has in this process: lent buffers live at addresses of
 * ward's choosing, and a test hands this one back to faulty_wild_write after
 * the call, as an extension keeping a pointer past its call would use it. */
FAULTY_EXPORT int64_t faulty_address_of(const void *buf) {
    return (int64_t)(uintptr_t)buf;
}

FAULTY_EXPORT void faulty_abort(void) {
    abort();
}

FAULTY_EXPORT void faulty_exit3(void) {
    exit(3);
}

FAULTY_EXPORT void faulty_infinite_loop(void) {
    volatile uint64_t spins = 0;
    for (;;) {
        spins = spins + 1;
    }
}

#ifndef FAULTY_IN_PROCESS
/*
 * Not a fault: a call that legitimately takes `ms` milliseconds (asleep), for
 * the tests of learned deadlines. Returns `ms` (0 at once for ms <= 0).
 */
FAULTY_EXPORT int64_t faulty_slow(int64_t ms) {
    if (ms <= 0) {
        return 0;
    }
    struct timespec left = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    return ms;
}
#endif

/* Never set: only there so the compiler cannot prove the recursion endless. */
static volatile int recursion_stop;

/*
 * Each frame owns a volatile array that is written before and read after the
 * recursive call, so the call is not in tail position and cannot be turned
 * into a loop.
 */
__attribute__((noinline)) FAULTY_EXPORT int64_t faulty_recursion(int64_t depth) {
    volatile uint8_t frame[RECURSION_FRAME];
    for (size_t i = 0; i < sizeof frame; i += 64) {
        frame[i] = (uint8_t)(depth + (int64_t)i);
    }
    if (recursion_stop) {
        return depth;
    }
    int64_t deeper = faulty_recursion(depth + 1);
    return deeper + frame[(uint64_t)depth % sizeof frame];
}

struct bomb_block {
    struct bomb_block *next;
};

/* Every block stays reachable, so nothing can be optimised away or freed. */
static struct bomb_block *bomb_list;

FAULTY_EXPORT void faulty_memory_bomb(void) {
    for (;;) {
        /* Deliberately no NULL check: at the limit memset writes to NULL. */
        struct bomb_block *p = malloc(BOMB_BLOCK);
        memset(p, 1, BOMB_BLOCK);
        p->next = bomb_list;
        bomb_list = p;
    }
}

#ifndef FAULTY_IN_PROCESS
FAULTY_EXPORT void faulty_fd_leak(void) {
    for (;;) {
        if (open("/dev/null", O_RDONLY) < 0) {
            abort();
        }
    }
}

FAULTY_EXPORT void faulty_raise_kill(void) {
    raise(SIGKILL);
    /* Not reached; SIGKILL cannot be caught. */
    for (;;) {
        pause();
    }
}

#endif

FAULTY_EXPORT void faulty_div_zero(void) {
    volatile int64_t zero = 0;
    volatile int64_t one = 1;
    volatile int64_t result = one / zero;
    (void)result;
    /* Only reached on architectures whose division does not trap. */
#ifdef FAULTY_IN_PROCESS
    __builtin_trap();
#else
    raise(SIGFPE);
#endif
}

FAULTY_EXPORT void faulty_illegal(void) {
    __builtin_trap();
}

/*
 * Returns 7 having broken the calling convention: every callee-saved register
 * but the stack pointer points at zeroed memory of the extension's, and the
 * direction flag is set. A caller that trusts any of them afterwards (a frame
 * pointer kept in rbx, a copy that assumes the flag clear) goes wrong.
 * Assembly, so that no compiled epilogue puts them back.
 */
FAULTY_EXPORT int64_t faulty_clobber_callee_saved(void);
static uint8_t faulty_zeroes[4096] __attribute__((used));
__asm__(".text\n"
        ".intel_syntax noprefix\n"
        ".globl faulty_clobber_callee_saved\n"
        ".type faulty_clobber_callee_saved, @function\n"
        "faulty_clobber_callee_saved:\n"
        "lea rbx, [rip + faulty_zeroes + 2048]\n"
        "mov rbp, rbx\n"
        "mov r12, rbx\n"
        "mov r13, rbx\n"
        "mov r14, rbx\n"
        "mov r15, rbx\n"
        "std\n"
        "mov eax, 7\n"
        "ret\n"
        ".size faulty_clobber_callee_saved, . - faulty_clobber_callee_saved\n"
        ".att_syntax prefix\n");

/* This thread's MXCSR. */
FAULTY_EXPORT int64_t faulty_float_control(void) {
    uint32_t mxcsr;
    __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
    return mxcsr;
}

/*
 * Sets flush-to-zero and denormals-are-zero in MXCSR and leaves them set, as
 * audio code does to keep denormals out of its filters; returns MXCSR. Loaded
 * natively, that changes the host's arithmetic too.
 */
FAULTY_EXPORT int64_t faulty_flush_denormals(void) {
    uint32_t mxcsr = (uint32_t)faulty_float_control() | 0x8040u;
    __asm__ volatile("ldmxcsr %0" : : "m"(mxcsr));
    return faulty_float_control();
}

/*
 * Writes `len + past` bytes of 0xAB into `out`, which the host lends as `len`
 * bytes: a positive `past` writes past its end. `other` is a second buffer
 * the host lends, which this never touches.
 */
FAULTY_EXPORT void faulty_overrun(uint8_t *out, int64_t len, int64_t past, uint8_t *other) {
    (void)other;
    volatile uint8_t *p = out;
    for (int64_t i = 0; i < len + past; i++) {
        p[i] = 0xAB;
    }
}

/*
 * Allocates 64 bytes and writes `64 + past` bytes into them, as a loop with a
 * wrong bound does: with a large `past` it runs off the end of the heap, which
 * kills a native host or corrupts it, depending on how its heap lies. Returns
 * the last byte written.
 */
FAULTY_EXPORT int64_t faulty_heap_overrun(int64_t past) {
    volatile uint8_t *p = malloc(64);
    if (p == NULL) {
        return -1;
    }
    for (int64_t i = 0; i < 64 + past; i++) {
        p[i] = (uint8_t)i;
    }
    int64_t last = p[63 + past];
    free((void *)p);
    return last;
}

/*
 * Copies n bytes into a 16-byte buffer through glibc's fortified memcpy, as a
 * _FORTIFY_SOURCE build does when it knows the destination's size: n > 16
 * fails the check, and glibc ends the process (natively, SIGABRT).
 */
extern void *__memcpy_chk(void *dst, const void *src, size_t n, size_t dstlen);

FAULTY_EXPORT int64_t faulty_fortified_copy(int64_t n) {
    static const uint8_t source[4096];
    uint8_t buf[16];
    __memcpy_chk(buf, source, (size_t)n, sizeof buf);
    return (int64_t)((volatile uint8_t *)buf)[0];
}

/* ---- library calls handed bad pointers ---------------------------------- */

/*
 * Each hands a C library function a pointer it cannot use. Natively (and in a
 * process domain) the library faults inside its own code; in an mpk domain
 * these functions run on the host's side of a gate, whose check must turn the
 * call into a fault of the domain before the host's code sees the pointer.
 */

/* Reads a string at `address` (gettext's message catalogue lookup). */
FAULTY_EXPORT int64_t faulty_gate_read(int64_t address) {
    return dcgettext((const char *)(uintptr_t)address, "ward", LC_MESSAGES) != NULL;
}

/* Writes a formatted number to `address`. */
FAULTY_EXPORT int64_t faulty_gate_write(int64_t address) {
    return snprintf((char *)(uintptr_t)address, 16, "%d", 42);
}

/* Formats the string at `address`, which printf reads. */
FAULTY_EXPORT int64_t faulty_gate_format(int64_t address) {
    char out[32];
    return snprintf(out, sizeof out, "[%s]", (const char *)(uintptr_t)address);
}

/* Writes to something that is not a stream: zeroed memory of the extension's own. */
FAULTY_EXPORT int64_t faulty_gate_stream(void) {
    static uint64_t not_a_stream[32];
    return fputs("ward", (FILE *)not_a_stream);
}

#ifndef FAULTY_IN_PROCESS
/* ---- attacks on ward's wire protocol ------------------------------------ */

/*
 * Finds the ward-xpc region in /proc/self/maps. The region is one mapping of
 * the memfd, possibly split into several lines by mprotect; its base is
 * start - offset of any of its lines, preferring the line at offset 0 with
 * the lowest start. *len receives how far the mapped lines for that base
 * extend. Returns NULL if there is no such mapping.
 */
static uint8_t *find_xpc_region(size_t *len) {
    static const char needle[] = "/memfd:" WARD_XPC_MEMFD_NAME;
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps == NULL) {
        return NULL;
    }

    uintptr_t best = 0;
    int best_offset_zero = 0;
    int found = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, maps) > 0) {
        char *name = strstr(line, needle);
        if (name == NULL) {
            continue;
        }
        char after = name[sizeof needle - 1];
        if (after != '\0' && after != '\n' && after != ' ') {
            continue; /* a different memfd whose name starts the same */
        }
        unsigned long start = 0;
        unsigned long end = 0;
        unsigned long long offset = 0;
        if (sscanf(line, "%lx-%lx %*s %llx", &start, &end, &offset) != 3 ||
            offset > start) {
            continue;
        }
        uintptr_t base = (uintptr_t)(start - offset);
        int offset_zero = offset == 0;
        if (!found || (offset_zero && !best_offset_zero) ||
            (offset_zero == best_offset_zero && base < best)) {
            best = base;
            best_offset_zero = offset_zero;
            found = 1;
        }
    }

    /* Second pass: how far do the lines belonging to that base reach? */
    size_t extent = 0;
    if (found) {
        rewind(maps);
        while (getline(&line, &cap, maps) > 0) {
            char *name = strstr(line, needle);
            if (name == NULL) {
                continue;
            }
            char after = name[sizeof needle - 1];
            if (after != '\0' && after != '\n' && after != ' ') {
                continue;
            }
            unsigned long start = 0;
            unsigned long end = 0;
            unsigned long long offset = 0;
            if (sscanf(line, "%lx-%lx %*s %llx", &start, &end, &offset) != 3 ||
                offset > start || (uintptr_t)(start - offset) != best) {
                continue;
            }
            if (end - best > extent) {
                extent = end - best;
            }
        }
    }
    free(line);
    fclose(maps);
    if (!found) {
        return NULL;
    }
    *len = extent;
    return (uint8_t *)best;
}

/*
 * Publishes `rec` (WARD_XPC_REPLY_LEN bytes) as the next record of the reply
 * ring, rings the doorbell and blocks forever. Returns -1 without touching
 * anything if the ward-xpc region is not mapped or does not look like one.
 */
static int64_t inject_reply(const uint8_t *rec) {
    size_t len = 0;
    uint8_t *base = find_xpc_region(&len);
    if (base == NULL || len < WARD_XPC_REQ_DATA_OFF) {
        return -1;
    }
    uint64_t magic;
    uint32_t capacity;
    memcpy(&magic, base + WARD_XPC_HDR_MAGIC, sizeof magic);
    memcpy(&capacity, base + WARD_XPC_HDR_RING_CAPACITY, sizeof capacity);
    if (magic != WARD_XPC_MAGIC || capacity < WARD_XPC_REPLY_LEN ||
        (capacity & (capacity - 1)) != 0 ||
        len < (size_t)WARD_XPC_REQ_DATA_OFF + 2 * (size_t)capacity) {
        return -1;
    }

    uint8_t *ctrl = base + WARD_XPC_REP_CTRL_OFF;
    uint8_t *data = base + WARD_XPC_REQ_DATA_OFF + capacity;
    uint64_t *tail_word = (uint64_t *)(void *)(ctrl + WARD_XPC_CTRL_TAIL);
    uint32_t *doorbell = (uint32_t *)(void *)(ctrl + WARD_XPC_CTRL_DOORBELL);

    uint64_t tail = __atomic_load_n(tail_word, __ATOMIC_ACQUIRE);
    /*
     * Byte by byte with wrap-around, so even a record that would straddle the
     * end of the data area stays inside the ring (it is an attack: the host
     * has to cope with whatever it finds there).
     */
    for (size_t i = 0; i < WARD_XPC_REPLY_LEN; i++) {
        data[(tail + i) & (uint64_t)(capacity - 1)] = rec[i];
    }
    __atomic_store_n(tail_word, tail + WARD_XPC_REPLY_LEN, __ATOMIC_RELEASE);
    __atomic_fetch_add(doorbell, 1u, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, doorbell, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);

    /* Stay here so that nothing (not even our own reply) overwrites it. */
    for (;;) {
        pause();
    }
}

FAULTY_EXPORT int64_t faulty_garbage_reply(void) {
    uint8_t rec[WARD_XPC_REPLY_LEN];
    memset(rec, 0xA5, sizeof rec);
    return inject_reply(rec);
}

FAULTY_EXPORT int64_t faulty_forged_reply(void) {
    uint8_t rec[WARD_XPC_REPLY_LEN];
    memset(rec, 0, sizeof rec);
    uint32_t rec_len = WARD_XPC_REPLY_LEN;
    uint64_t id = FORGED_REPLY_ID;
    uint32_t status = 0;
    uint64_t ret_int = FORGED_REPLY_RET_INT;
    uint64_t ret_float = 0;
    memcpy(rec + WARD_XPC_REC_LEN, &rec_len, sizeof rec_len);
    rec[WARD_XPC_REC_OP] = WARD_XPC_OP_REPLY;
    rec[WARD_XPC_REC_NARGS] = 0;
    rec[WARD_XPC_REC_RET] = 0;
    rec[WARD_XPC_REC_FLAGS] = 0;
    memcpy(rec + WARD_XPC_REC_ID, &id, sizeof id);
    memcpy(rec + WARD_XPC_REPLY_STATUS, &status, sizeof status);
    memcpy(rec + WARD_XPC_REPLY_RET_INT, &ret_int, sizeof ret_int);
    memcpy(rec + WARD_XPC_REPLY_RET_FLOAT, &ret_float, sizeof ret_float);
    return inject_reply(rec);
}

#endif

/* ---- armed faults --------------------------------------------------------- */

static int64_t armed_kind;
static int64_t armed_arg;

/*
 * Arms `kind` for the next faulty_compute() call; `arg` is the address for
 * WILD_WRITE and the starting depth for RECURSION. A kind outside 1..13
 * (e.g. 0) disarms.
 */
FAULTY_EXPORT void faulty_arm(int64_t kind, int64_t arg) {
    if (kind < FAULT_NULL_DEREF || kind > FAULT_ILLEGAL) {
        kind = FAULT_NONE;
    }
#ifdef FAULTY_IN_PROCESS
    if (kind >= FAULT_FD_LEAK && kind <= FAULT_FORGED_REPLY) {
        kind = FAULT_NONE;
    }
#endif
    armed_arg = arg;
    armed_kind = kind;
}

FAULTY_EXPORT int64_t faulty_compute(int64_t x) {
    int64_t kind = armed_kind;
    int64_t arg = armed_arg;
    armed_kind = FAULT_NONE;
    armed_arg = 0;

    switch (kind) {
    case FAULT_NULL_DEREF:
        faulty_null_deref();
        break;
    case FAULT_WILD_WRITE:
        faulty_wild_write((int64_t *)(uintptr_t)arg);
        break;
    case FAULT_ABORT:
        faulty_abort();
        break;
    case FAULT_EXIT3:
        faulty_exit3();
        break;
    case FAULT_INFINITE_LOOP:
        faulty_infinite_loop();
        break;
    case FAULT_RECURSION:
        return faulty_recursion(arg);
    case FAULT_MEMORY_BOMB:
        faulty_memory_bomb();
        break;
#ifndef FAULTY_IN_PROCESS
    case FAULT_FD_LEAK:
        faulty_fd_leak();
        break;
    case FAULT_RAISE_KILL:
        faulty_raise_kill();
        break;
    case FAULT_GARBAGE_REPLY:
        return faulty_garbage_reply();
    case FAULT_FORGED_REPLY:
        return faulty_forged_reply();
#endif
    case FAULT_DIV_ZERO:
        faulty_div_zero();
        break;
    case FAULT_ILLEGAL:
        faulty_illegal();
        break;
    default:
        break;
    }
    /* Not armed (or a fault that somehow returned, e.g. a harmless wild write). */
    return (int64_t)((uint64_t)x * (uint64_t)x + 1u);
}
