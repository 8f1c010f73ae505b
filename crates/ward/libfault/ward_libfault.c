/*
 * ward_libfault.c -- run-time library faults for one target shared object.
 *
 * Preloaded (LD_PRELOAD) into a domain process or a native host, this library interposes on the C library's
 * allocation and copy functions and injects one fault into the calls made *directly* by one shared object, the
 * target: SWIFI's allocation failure, memory leak and copy overrun, at the library boundary instead of in the
 * object's code. A call is the target's when its return address lies in one of the target's executable segments;
 * calls from anywhere else (the host, libc itself, other libraries) pass straight through, and so do calls the
 * target makes indirectly (strdup's own malloc is libc's) or as a tail call (the return address is its caller's).
 *
 * Configuration, one environment variable (ward writes it; `object=` comes last and runs to the end of the value,
 * so the path may contain spaces):
 *
 *   WARD_LIBFAULT="kind=alloc nth=3 count=1 object=/abs/path/plugin.so"
 *
 *   kind=alloc         malloc, calloc, realloc (not as a free), memalign, aligned_alloc, posix_memalign fail
 *   kind=leak          free does nothing (free(NULL) is not counted)
 *   kind=copy-overrun  memcpy, memmove, memset, strcpy, strncpy (and their _chk forms) write `extra` bytes too many
 *   nth=N              the first call affected is the N-th eligible call of the process (from 1; default 1)
 *   count=C            C calls are affected, 0 = every one from then on (default 1; 0 for leak)
 *   extra=E            copy-overrun only: bytes too many (default 64)
 *
 * A malformed value is reported in one line on standard error and nothing is injected. Counting is per process:
 * a process forked after some eligible calls (ward's zygote) continues from its parent's count.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define CALLER() ((uintptr_t)__builtin_return_address(0))

/* glibc's allocator entry points: forwarding to them needs no dlsym, which itself allocates. */
extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void *__libc_memalign(size_t align, size_t size);
extern void __libc_free(void *p);

enum kind { KIND_NONE, KIND_ALLOC, KIND_LEAK, KIND_COPY };

static struct {
    enum kind kind;
    unsigned long long nth, count, extra;
    char object[PATH_MAX];
    dev_t dev;
    ino_t ino;
} cfg;

/* Eligible calls seen so far (of cfg.kind, from the target). */
static unsigned long long calls;

/* Set while this thread is inside our own bookkeeping: whatever that calls passes straight through. Initial-exec
 * TLS: a preloaded library's TLS is static, and reaching it must not itself allocate. */
static _Thread_local int busy __attribute__((tls_model("initial-exec")));

/* The copy functions, found with dlsym(RTLD_NEXT) by the constructor; before that, the slow loops below. */
static struct {
    void *(*memcpy)(void *, const void *, size_t);
    void *(*memmove)(void *, const void *, size_t);
    void *(*memset)(void *, int, size_t);
    char *(*strcpy)(char *, const char *);
    char *(*strncpy)(char *, const char *, size_t);
    void *(*memcpy_chk)(void *, const void *, size_t, size_t);
    void *(*memmove_chk)(void *, const void *, size_t, size_t);
    void *(*memset_chk)(void *, int, size_t, size_t);
    char *(*strcpy_chk)(char *, const char *, size_t);
    char *(*strncpy_chk)(char *, const char *, size_t, size_t);
    int (*dlclose)(void *);
} real;

/* ---- which code is the target's ------------------------------------------------------------------------------ */

/* Executable segments of every object seen at the last scan, the target's marked: a caller in a known segment needs
 * no scan; an unknown caller means an object was loaded since (the target is dlopen'ed after we start). */
#define MAX_RANGES 128
struct range {
    uintptr_t lo, hi;
    int target;
};
struct table {
    struct range r[MAX_RANGES];
    int n;
    unsigned long long adds, subs; /* dl_iterate_phdr's load and unload counters when built */
    unsigned long closes;          /* dlclose calls when built */
};
static struct table table;
static unsigned long closes; /* dlclose calls so far: a closed object's range may be reused */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

static int is_target(const char *name) {
    struct stat st;
    if (name == NULL || name[0] == '\0') {
        return 0;
    }
    if (strcmp(name, cfg.object) == 0) {
        return 1;
    }
    /* The same file under another name (a symbolic link, a relative path). */
    return stat(name, &st) == 0 && st.st_dev == cfg.dev && st.st_ino == cfg.ino;
}

static int scan_one(struct dl_phdr_info *info, size_t size, void *data) {
    struct table *t = data;
    int target = -1;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        t->adds = info->dlpi_adds;
        t->subs = info->dlpi_subs;
    }
    for (int i = 0; i < info->dlpi_phnum && t->n < MAX_RANGES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) {
            continue;
        }
        if (target < 0) {
            target = is_target(info->dlpi_name);
        }
        t->r[t->n].lo = info->dlpi_addr + ph->p_vaddr;
        t->r[t->n].hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
        t->r[t->n].target = target;
        t->n++;
    }
    return 0;
}

/* Reads only the load and unload counters (the first object's report carries them). */
struct generation {
    unsigned long long adds, subs;
};

static int read_generation(struct dl_phdr_info *info, size_t size, void *data) {
    struct generation *g = data;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        g->adds = info->dlpi_adds;
        g->subs = info->dlpi_subs;
    }
    return 1;
}

/* 1: the target's, 0: another object's, -1: unknown, or the table is stale. */
static int lookup(uintptr_t pc) {
    int found = -1;
    pthread_mutex_lock(&table_lock);
    if (table.closes == __atomic_load_n(&closes, __ATOMIC_ACQUIRE)) {
        for (int i = 0; i < table.n; i++) {
            if (pc >= table.r[i].lo && pc < table.r[i].hi) {
                found = table.r[i].target;
                break;
            }
        }
    }
    pthread_mutex_unlock(&table_lock);
    return found;
}

static int from_target(uintptr_t caller) {
    /* The return address follows the call; one byte before it is the calling instruction's. */
    uintptr_t pc = caller - 1;
    int found = lookup(pc);
    if (found >= 0) {
        return found;
    }
    /* dl_iterate_phdr runs outside our lock: it takes the loader's, and a thread inside dlopen may hold that one
     * while it allocates, which takes ours. */
    struct generation now = {0, 0};
    unsigned long closes_before = __atomic_load_n(&closes, __ATOMIC_ACQUIRE);
    dl_iterate_phdr(read_generation, &now);
    pthread_mutex_lock(&table_lock);
    int same = table.n > 0 && table.closes == closes_before && table.adds == now.adds && table.subs == now.subs;
    pthread_mutex_unlock(&table_lock);
    if (same) {
        return 0; /* no object came or went: the caller is code outside every object */
    }
    struct table *t = __libc_calloc(1, sizeof *t);
    if (t == NULL) {
        return 0;
    }
    dl_iterate_phdr(scan_one, t);
    t->closes = closes_before;
    pthread_mutex_lock(&table_lock);
    table = *t;
    pthread_mutex_unlock(&table_lock);
    __libc_free(t);
    return lookup(pc) == 1;
}

/* Whether this call of `kind` from `caller` gets the fault; counts it when it is eligible. */
static int inject(enum kind kind, uintptr_t caller) {
    int hit = 0;
    if (cfg.kind != kind || busy) {
        return 0;
    }
    busy = 1;
    if (from_target(caller)) {
        unsigned long long n = __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
        hit = n >= cfg.nth && (cfg.count == 0 || n - cfg.nth < cfg.count);
    }
    busy = 0;
    return hit;
}

/* ---- allocation ----------------------------------------------------------------------------------------------- */

EXPORT void *malloc(size_t size) {
    if (inject(KIND_ALLOC, CALLER())) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_malloc(size);
}

EXPORT void *calloc(size_t n, size_t size) {
    if (inject(KIND_ALLOC, CALLER())) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_calloc(n, size);
}

EXPORT void *realloc(void *p, size_t size) {
    /* realloc(p, 0) frees: it is no allocation to fail. */
    if (!(p != NULL && size == 0) && inject(KIND_ALLOC, CALLER())) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(p, size);
}

static int power_of_two(size_t x) {
    return x != 0 && (x & (x - 1)) == 0;
}

EXPORT void *memalign(size_t align, size_t size) {
    if (inject(KIND_ALLOC, CALLER())) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_memalign(align, size);
}

EXPORT void *aligned_alloc(size_t align, size_t size) {
    if (!power_of_two(align)) {
        errno = EINVAL;
        return NULL;
    }
    if (inject(KIND_ALLOC, CALLER())) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_memalign(align, size);
}

EXPORT int posix_memalign(void **out, size_t align, size_t size) {
    if (!power_of_two(align) || align % sizeof(void *) != 0) {
        return EINVAL;
    }
    if (inject(KIND_ALLOC, CALLER())) {
        return ENOMEM;
    }
    void *p = __libc_memalign(align, size);
    if (p == NULL) {
        return ENOMEM;
    }
    *out = p;
    return 0;
}

EXPORT void free(void *p) {
    if (p != NULL && inject(KIND_LEAK, CALLER())) {
        return;
    }
    __libc_free(p);
}

/* ---- copies --------------------------------------------------------------------------------------------------- */

/* Byte loops for calls made before the constructor found the real functions. Volatile, so that the compiler does
 * not turn them back into calls of the functions they stand in for. */
static void *slow_move(void *dst, const void *src, size_t n) {
    volatile unsigned char *d = dst;
    const volatile unsigned char *s = src;
    if (d < s) {
        for (size_t i = 0; i < n; i++) {
            d[i] = s[i];
        }
    } else {
        for (size_t i = n; i > 0; i--) {
            d[i - 1] = s[i - 1];
        }
    }
    return dst;
}

static void *slow_set(void *dst, int c, size_t n) {
    volatile unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) {
        d[i] = (unsigned char)c;
    }
    return dst;
}

/* How many bytes too many this copy writes. */
static size_t overrun(uintptr_t caller) {
    return inject(KIND_COPY, caller) ? (size_t)cfg.extra : 0;
}

EXPORT void *memcpy(void *dst, const void *src, size_t n) {
    n += overrun(CALLER());
    return real.memcpy ? real.memcpy(dst, src, n) : slow_move(dst, src, n);
}

EXPORT void *memmove(void *dst, const void *src, size_t n) {
    n += overrun(CALLER());
    return real.memmove ? real.memmove(dst, src, n) : slow_move(dst, src, n);
}

EXPORT void *memset(void *dst, int c, size_t n) {
    n += overrun(CALLER());
    return real.memset ? real.memset(dst, c, n) : slow_set(dst, c, n);
}

EXPORT char *strcpy(char *dst, const char *src) {
    size_t extra = overrun(CALLER());
    if (extra == 0 && real.strcpy) {
        return real.strcpy(dst, src);
    }
    /* The string, its terminator and `extra` bytes that follow it in the source. */
    size_t n = strlen(src) + 1 + extra;
    return real.memmove ? real.memmove(dst, src, n) : slow_move(dst, src, n);
}

EXPORT char *strncpy(char *dst, const char *src, size_t n) {
    n += overrun(CALLER());
    if (real.strncpy) {
        return real.strncpy(dst, src, n);
    }
    size_t len = strnlen(src, n);
    slow_move(dst, src, len);
    slow_set(dst + len, 0, n - len);
    return dst;
}

/* The fortified forms (_FORTIFY_SOURCE builds call these when the destination's size is known): the real check
 * then sees the wrong length, as it would see a caller's. */
EXPORT void *__memcpy_chk(void *dst, const void *src, size_t n, size_t dstlen) {
    n += overrun(CALLER());
    return real.memcpy_chk ? real.memcpy_chk(dst, src, n, dstlen) : slow_move(dst, src, n);
}

EXPORT void *__memmove_chk(void *dst, const void *src, size_t n, size_t dstlen) {
    n += overrun(CALLER());
    return real.memmove_chk ? real.memmove_chk(dst, src, n, dstlen) : slow_move(dst, src, n);
}

EXPORT void *__memset_chk(void *dst, int c, size_t n, size_t dstlen) {
    n += overrun(CALLER());
    return real.memset_chk ? real.memset_chk(dst, c, n, dstlen) : slow_set(dst, c, n);
}

EXPORT char *__strcpy_chk(char *dst, const char *src, size_t dstlen) {
    size_t extra = overrun(CALLER());
    if (extra == 0 && real.strcpy_chk) {
        return real.strcpy_chk(dst, src, dstlen);
    }
    size_t n = strlen(src) + 1 + extra;
    return real.memmove_chk ? real.memmove_chk(dst, src, n, dstlen) : slow_move(dst, src, n);
}

EXPORT char *__strncpy_chk(char *dst, const char *src, size_t n, size_t dstlen) {
    n += overrun(CALLER());
    if (real.strncpy_chk) {
        return real.strncpy_chk(dst, src, n, dstlen);
    }
    return strncpy(dst, src, n);
}

/* A closed object's addresses may be reused by the next one loaded: the table must be rebuilt. */
EXPORT int dlclose(void *handle) {
    int rc = real.dlclose ? real.dlclose(handle) : -1;
    __atomic_add_fetch(&closes, 1, __ATOMIC_RELEASE);
    return rc;
}

/* ---- configuration -------------------------------------------------------------------------------------------- */

#define MAX_NUMBER 1000000000ULL
#define MAX_EXTRA (1ULL << 20)

static void report(const char *value, const char *reason) {
    char line[1024];
    int n = snprintf(line, sizeof line,
                     "ward_libfault: WARD_LIBFAULT=\"%.300s\" is malformed: %s; no fault is injected\n", value, reason);
    if (n > 0) {
        size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
        ssize_t ignored = write(STDERR_FILENO, line, len);
        (void)ignored;
    }
}

/* A whole number of decimal digits within [min, max]. */
static int number(const char *s, size_t len, unsigned long long min, unsigned long long max,
                  unsigned long long *out) {
    unsigned long long v = 0;
    if (len == 0 || len > 19) {
        return 0;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return 0;
        }
        v = v * 10 + (unsigned long long)(s[i] - '0');
    }
    if (v < min || v > max) {
        return 0;
    }
    *out = v;
    return 1;
}

/* Sets cfg from the variable's value; NULL, or why the value is refused. */
static const char *configure(const char *value) {
    static char why[PATH_MAX + 64];
    enum kind kind = KIND_NONE;
    int have_nth = 0, have_count = 0, have_extra = 0, have_object = 0;
    unsigned long long nth = 1, count = 1, extra = 64;
    const char *p = value;
    while (*p != '\0') {
        while (*p == ' ') {
            p++;
        }
        if (*p == '\0') {
            break;
        }
        if (strncmp(p, "object=", 7) == 0) {
            size_t len = strlen(p + 7);
            if (have_object) {
                return "object is given twice";
            }
            if (len == 0 || p[7] != '/') {
                return "object must be an absolute path";
            }
            if (len >= sizeof cfg.object) {
                return "object is too long";
            }
            memcpy(cfg.object, p + 7, len + 1);
            have_object = 1;
            break; /* the path runs to the end */
        }
        const char *end = strchr(p, ' ');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq == NULL) {
            return "expected KEY=VALUE words (kind, nth, count, extra, object last)";
        }
        size_t key_len = (size_t)(eq - p);
        const char *v = eq + 1;
        size_t v_len = len - key_len - 1;
        if (key_len == 4 && strncmp(p, "kind", 4) == 0) {
            if (kind != KIND_NONE) {
                return "kind is given twice";
            }
            if (v_len == 5 && strncmp(v, "alloc", 5) == 0) {
                kind = KIND_ALLOC;
            } else if (v_len == 4 && strncmp(v, "leak", 4) == 0) {
                kind = KIND_LEAK;
            } else if (v_len == 12 && strncmp(v, "copy-overrun", 12) == 0) {
                kind = KIND_COPY;
            } else {
                return "kind must be alloc, leak or copy-overrun";
            }
        } else if (key_len == 3 && strncmp(p, "nth", 3) == 0) {
            if (have_nth++ || !number(v, v_len, 1, MAX_NUMBER, &nth)) {
                return "nth must be given once, a whole number from 1 to 1000000000";
            }
        } else if (key_len == 5 && strncmp(p, "count", 5) == 0) {
            if (have_count++ || !number(v, v_len, 0, MAX_NUMBER, &count)) {
                return "count must be given once, a whole number from 0 (no end) to 1000000000";
            }
        } else if (key_len == 5 && strncmp(p, "extra", 5) == 0) {
            if (have_extra++ || !number(v, v_len, 1, MAX_EXTRA, &extra)) {
                return "extra must be given once, a whole number from 1 to 1048576";
            }
        } else {
            snprintf(why, sizeof why, "unknown key `%.*s` (expected kind, nth, count, extra, object)", (int)key_len, p);
            return why;
        }
        p += len;
    }
    if (kind == KIND_NONE) {
        return "kind is missing";
    }
    if (!have_object) {
        return "object is missing (it comes last: object=/path/to/target.so)";
    }
    if (have_extra && kind != KIND_COPY) {
        return "extra applies to kind=copy-overrun only";
    }
    struct stat st;
    if (stat(cfg.object, &st) != 0) {
        snprintf(why, sizeof why, "cannot find object %s: %s", cfg.object, strerror(errno));
        return why;
    }
    cfg.dev = st.st_dev;
    cfg.ino = st.st_ino;
    cfg.nth = nth;
    cfg.count = have_count ? count : (kind == KIND_LEAK ? 0 : 1);
    cfg.extra = extra;
    cfg.kind = kind;
    return NULL;
}

/* A fork while another thread holds the table's lock must not leave the child with it held. */
static void before_fork(void) {
    pthread_mutex_lock(&table_lock);
}

static void after_fork(void) {
    pthread_mutex_unlock(&table_lock);
}

__attribute__((constructor)) static void start(void) {
    busy = 1;
    real.memcpy = (void *(*)(void *, const void *, size_t))dlsym(RTLD_NEXT, "memcpy");
    real.memmove = (void *(*)(void *, const void *, size_t))dlsym(RTLD_NEXT, "memmove");
    real.memset = (void *(*)(void *, int, size_t))dlsym(RTLD_NEXT, "memset");
    real.strcpy = (char *(*)(char *, const char *))dlsym(RTLD_NEXT, "strcpy");
    real.strncpy = (char *(*)(char *, const char *, size_t))dlsym(RTLD_NEXT, "strncpy");
    real.memcpy_chk = (void *(*)(void *, const void *, size_t, size_t))dlsym(RTLD_NEXT, "__memcpy_chk");
    real.memmove_chk = (void *(*)(void *, const void *, size_t, size_t))dlsym(RTLD_NEXT, "__memmove_chk");
    real.memset_chk = (void *(*)(void *, int, size_t, size_t))dlsym(RTLD_NEXT, "__memset_chk");
    real.strcpy_chk = (char *(*)(char *, const char *, size_t))dlsym(RTLD_NEXT, "__strcpy_chk");
    real.strncpy_chk = (char *(*)(char *, const char *, size_t, size_t))dlsym(RTLD_NEXT, "__strncpy_chk");
    real.dlclose = (int (*)(void *))dlsym(RTLD_NEXT, "dlclose");
    pthread_atfork(before_fork, after_fork, after_fork);
    const char *value = getenv("WARD_LIBFAULT");
    if (value != NULL && value[0] != '\0') {
        const char *why = configure(value);
        if (why != NULL) {
            report(value, why);
        }
    }
    busy = 0;
}
