/*
 * calls.c -- a built-in test extension whose work is C library calls, for run-time library faults
 * (policy `library_fault`, ward::libfault).
 *
 * Like much real code, some functions trust their library: they use what malloc returned without a NULL check,
 * copy into buffers of exactly the size asked for, and leave freeing to free. Others check, and report a failed
 * allocation as an error code. Every function is well-behaved when the library is.
 *
 * Built with -fvisibility=hidden: only the functions marked CALLS_EXPORT are exported. With CALLS_NO_DLOPEN
 * defined (calls_plugin.c), calls_via and its dlopen are left out.
 */
#ifndef CALLS_NO_DLOPEN
#include <dlfcn.h>
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CALLS_EXPORT __attribute__((visibility("default")))

/* Keeps every allocation observable, so the compiler cannot remove a malloc/free pair. */
static void *volatile sink;

/* No library call at all: works whatever fault the library has. */
CALLS_EXPORT int64_t calls_add(int64_t a, int64_t b) {
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

/* Allocates n bytes, fills them and sums them; uses malloc's result without a NULL check. */
CALLS_EXPORT int64_t calls_alloc_sum(int64_t n) {
    uint8_t *p = malloc((size_t)n);
    sink = p;
    int64_t sum = 0;
    for (int64_t i = 0; i < n; i++) {
        p[i] = (uint8_t)i;
    }
    for (int64_t i = 0; i < n; i++) {
        sum += p[i];
    }
    free(p);
    return sum;
}

/* Allocates n bytes with a NULL check: n, or -1 when the allocation failed. */
CALLS_EXPORT int64_t calls_checked_alloc(int64_t n) {
    void *p = malloc((size_t)n);
    sink = p;
    if (p == NULL) {
        return -1;
    }
    free(p);
    return n;
}

/* `iterations` times: allocate `size` bytes, touch both ends (no NULL check), free. Returns `iterations`. */
CALLS_EXPORT int64_t calls_churn(int64_t iterations, int64_t size) {
    for (int64_t i = 0; i < iterations; i++) {
        uint8_t *p = malloc((size_t)size);
        sink = p;
        /* Volatile keeps the order: a null p faults at address 0 first. */
        volatile uint8_t *v = p;
        v[0] = 1;
        v[size - 1] = 1;
        free(p);
    }
    return iterations;
}

/* ---- copies into buffers of exactly the size asked for ---------------------------------------------------------- */

#define AREA 4096
#define CANARY 256
#define CANARY_BYTE 0xa5

static uint8_t source[AREA + CANARY];
static uint8_t area[AREA + CANARY];
static const uint8_t *volatile source_ptr = source;

/*
 * Copies n bytes (at most 4096) into a buffer followed by a 256-byte canary, by `how`: 0 memcpy, 1 memmove,
 * 2 memset, 3 strcpy (n - 1 characters and the terminator), 4 strncpy. Aborts when the canary is damaged, as a
 * hardened build would; else returns the sum of the bytes copied.
 */
CALLS_EXPORT int64_t calls_copy(int64_t n, int64_t how) {
    if (n < 1 || n > AREA) {
        return -1;
    }
    for (size_t i = 0; i < sizeof source; i++) {
        source[i] = (uint8_t)('a' + i % 26);
    }
    source[n - 1] = '\0';
    /* Volatile: the compiler would turn a plain loop into a call of memset, a copy of this object's own. */
    volatile uint8_t *fill = area;
    for (size_t i = 0; i < sizeof area; i++) {
        fill[i] = CANARY_BYTE;
    }
    switch (how) {
    case 0:
        memcpy(area, source, (size_t)n);
        break;
    case 1:
        /* Through a pointer the compiler cannot see into, so that it keeps the memmove (it would call memcpy for
         * arrays it knows do not overlap). */
        memmove(area, source_ptr, (size_t)n);
        break;
    case 2:
        memset(area, 'x', (size_t)n);
        break;
    case 3:
        strcpy((char *)area, (const char *)source);
        break;
    case 4:
        strncpy((char *)area, (const char *)source, (size_t)n);
        break;
    default:
        return -1;
    }
    for (size_t i = (size_t)n; i < sizeof area; i++) {
        if (area[i] != CANARY_BYTE) {
            abort();
        }
    }
    int64_t sum = 0;
    for (int64_t i = 0; i < n; i++) {
        sum += area[i];
    }
    return sum;
}

/*
 * One argument each, for calls made through calls_via: calls_copy of n bytes
 * every way in turn (the sum of their sums, or -1), and calls_churn of 1 MiB
 * blocks.
 */
CALLS_EXPORT int64_t calls_copy_every_way(int64_t n) {
    int64_t total = 0;
    for (int64_t how = 0; how < 5; how++) {
        int64_t sum = calls_copy(n, how);
        if (sum < 0) {
            return -1;
        }
        total += sum;
    }
    return total;
}

CALLS_EXPORT int64_t calls_churn_mib(int64_t iterations) {
    return calls_churn(iterations, 1 << 20);
}

/* Fills the caller's buffer of len bytes with `byte`; returns len. (Returning something else than memset's result
 * keeps the call a call: a tail jump would make memset's caller the host.) */
/* The words of `text` (its first 255 bytes), split at spaces, commas and tabs with strtok, which keeps its
 * position between calls: in an mpk domain that position is the domain's own. */
CALLS_EXPORT int64_t calls_count_words(const char *text) {
    char copy[256];
    strncpy(copy, text, sizeof copy - 1);
    copy[sizeof copy - 1] = '\0';
    int64_t words = 0;
    for (char *w = strtok(copy, " ,\t"); w != NULL; w = strtok(NULL, " ,\t"))
        words++;
    return words;
}

CALLS_EXPORT int64_t calls_fill(uint8_t *out, size_t len, int64_t byte) {
    memset(out, (int)byte, len);
    return (int64_t)len;
}

#ifndef CALLS_NO_DLOPEN
/* ---- a stand-in class adapter ------------------------------------------------------------------------------------ */

/*
 * Opens the library at `path` (as a class adapter opens its plugin) and calls its `int64_t symbol(int64_t)` with
 * `arg`. -2 when the library cannot be opened, -3 when it lacks the function.
 */
CALLS_EXPORT int64_t calls_via(const char *path, const char *symbol, int64_t arg) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        return -2;
    }
    void *f = dlsym(lib, symbol);
    if (f == NULL) {
        return -3;
    }
    int64_t (*call)(int64_t);
    memcpy(&call, &f, sizeof call);
    return call(arg);
}
#endif
