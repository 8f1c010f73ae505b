/*
 * well.c -- ward's well-behaved built-in test extension.
 *
 * Exercises the host side of ward without ever misbehaving: scalar
 * arithmetic (integer, double, float and mixed argument lists), byte buffers
 * (in, out and in-out), strings, callbacks into the host (including nested
 * calls back into this extension), process-wide state (a counter and an
 * "initialised" flag, both lost when a domain restarts) and opaque instance
 * handles. Every function here is safe to call natively as well.
 *
 * Built with -fvisibility=hidden: only the functions marked WELL_EXPORT are
 * exported.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WELL_EXPORT __attribute__((visibility("default")))

/* ---- call-path benchmark ---------------------------------------------- */

WELL_EXPORT void well_null(void) {}

/* ---- scalar arithmetic ------------------------------------------------- */

WELL_EXPORT int64_t well_add(int64_t a, int64_t b) {
    /* Wrap instead of invoking undefined behaviour on overflow. */
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

WELL_EXPORT int64_t well_mul3(int64_t a, int64_t b, int64_t c) {
    return (int64_t)((uint64_t)a * (uint64_t)b * (uint64_t)c);
}

WELL_EXPORT double well_fma(double a, double b, double c) {
    return a * b + c;
}

WELL_EXPORT float well_halve(float x) {
    return x / 2.0f;
}

WELL_EXPORT double well_mix(int64_t i, double d, int32_t j, float f) {
    return (double)i + d + (double)j + (double)f;
}

/* ---- errno set by the C library ----------------------------------------- */

/* libm's sqrt and libc's strtod set errno (EDOM for a negative x, ERANGE for
 * "1e999"); well_errno reads it back in a later call. Each is one call or
 * less, so nothing is kept in a stack slot across a call (the fault-injection
 * campaign expects no stack-slot stores in this library). */
WELL_EXPORT double well_sqrt(double x) {
    return sqrt(x);
}

WELL_EXPORT double well_strtod(const char *text) {
    return strtod(text, NULL);
}

WELL_EXPORT int well_errno(void) {
    return errno;
}

WELL_EXPORT void well_clear_errno(void) {
    errno = 0;
}

/* ---- thread-local storage ---------------------------------------------- */

/* A running total per thread that starts at 1000 (general dynamic access, an
 * exported symbol), the last value added (local dynamic) and a count of calls
 * (initial-exec: in the static TLS block). Each thread that calls sees its
 * own three. */
WELL_EXPORT __thread int64_t well_thread_total = 1000;
static __thread int64_t well_thread_last;
static __thread int64_t well_thread_calls __attribute__((tls_model("initial-exec")));

WELL_EXPORT int64_t well_thread_add(int64_t x) {
    well_thread_calls++;
    well_thread_last = x;
    well_thread_total += x;
    return well_thread_total;
}

/* The count of well_thread_add calls on this thread, times 1000, plus the
 * last value added (below 1000 in the tests). */
WELL_EXPORT int64_t well_thread_calls_and_last(void) {
    return well_thread_calls * 1000 + well_thread_last;
}

/* ---- buffers ----------------------------------------------------------- */

WELL_EXPORT int64_t well_sum(const uint8_t *buf, size_t len) {
    int64_t total = 0;
    for (size_t i = 0; i < len; i++) {
        total += buf[i];
    }
    return total;
}

WELL_EXPORT void well_xor(const uint8_t *in, uint8_t *out, size_t len,
                          int64_t key) {
    uint8_t k = (uint8_t)key;
    for (size_t i = 0; i < len; i++) {
        out[i] = in[i] ^ k;
    }
}

WELL_EXPORT void well_reverse(uint8_t *buf, size_t len) {
    if (len < 2) {
        return;
    }
    size_t i = 0;
    size_t j = len - 1;
    while (i < j) {
        uint8_t t = buf[i];
        buf[i] = buf[j];
        buf[j] = t;
        i++;
        j--;
    }
}

WELL_EXPORT void well_copy(const uint8_t *in, uint8_t *out, size_t len) {
    if (len > 0) {
        memcpy(out, in, len);
    }
}

WELL_EXPORT size_t well_strlen(const char *s) {
    return strlen(s);
}

/* ---- callbacks into the host ------------------------------------------- */

WELL_EXPORT int64_t well_map_sum(int64_t (*f)(int64_t), int64_t n) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        total = (int64_t)((uint64_t)total + (uint64_t)f(i));
    }
    return total;
}

/* The host's callback may call well_nest again with depth - 1. */
WELL_EXPORT int64_t well_nest(int64_t (*f)(int64_t), int64_t depth) {
    return (int64_t)((uint64_t)f(depth) + 1u);
}

WELL_EXPORT double well_apply_f(double (*f)(double, int64_t), double x,
                                int64_t k) {
    return f(x, k) * 2.0;
}

/* ---- process-wide counter ---------------------------------------------- */

static int64_t counter;

WELL_EXPORT int64_t counter_add(int64_t delta) {
    return __atomic_add_fetch(&counter, delta, __ATOMIC_SEQ_CST);
}

WELL_EXPORT int64_t counter_get(void) {
    return __atomic_load_n(&counter, __ATOMIC_SEQ_CST);
}

WELL_EXPORT void counter_reset(void) {
    __atomic_store_n(&counter, 0, __ATOMIC_SEQ_CST);
}

/* ---- instances behind opaque handles ------------------------------------ */

struct acc {
    int64_t value;
};

/* Returns NULL if the allocation fails; the other acc_* tolerate NULL. */
WELL_EXPORT void *acc_new(int64_t initial) {
    struct acc *a = malloc(sizeof *a);
    if (a != NULL) {
        a->value = initial;
    }
    return a;
}

WELL_EXPORT int64_t acc_add(void *h, int64_t d) {
    struct acc *a = h;
    if (a == NULL) {
        return 0;
    }
    a->value = (int64_t)((uint64_t)a->value + (uint64_t)d);
    return a->value;
}

WELL_EXPORT int64_t acc_get(void *h) {
    const struct acc *a = h;
    return a == NULL ? 0 : a->value;
}

WELL_EXPORT void acc_free(void *h) {
    free(h);
}

/* ---- initialisation ---------------------------------------------------- */

static int initialised;

/* Set by well_init on the thread that runs it: the others keep 0. */
static __thread int64_t thread_initialised;

WELL_EXPORT int64_t well_init(void) {
    __atomic_store_n(&initialised, 1, __ATOMIC_SEQ_CST);
    thread_initialised = 1;
    return 0;
}

WELL_EXPORT int64_t well_initialised(void) {
    return __atomic_load_n(&initialised, __ATOMIC_SEQ_CST) ? 1 : 0;
}

/* Whether well_init ran on this thread. */
WELL_EXPORT int64_t well_thread_initialised(void) {
    return thread_initialised;
}
