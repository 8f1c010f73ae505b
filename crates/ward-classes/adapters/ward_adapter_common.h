/* Helpers shared by ward's class adapters: the small C libraries that run inside a domain, next to a plugin, and
 * turn the plugin's pointer-rich ABI into flat calls the generic call API can carry. */
#ifndef WARD_ADAPTER_COMMON_H
#define WARD_ADAPTER_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define WARD_ADAPTER_EXPORT __attribute__((visibility("default")))

/* Errors adapters return: negative and far below minus any size a describe call can ask for (sizes are below
 * 2^32), so the two never mix. */
#define WARD_ADAPTER_E_OPEN (-0x100000000LL - 1)     /* dlopen failed */
#define WARD_ADAPTER_E_SYMBOL (-0x100000000LL - 2)   /* the class's entry point is missing */
#define WARD_ADAPTER_E_INDEX (-0x100000000LL - 3)    /* no such descriptor or parameter */
#define WARD_ADAPTER_E_LAYOUT (-0x100000000LL - 4)   /* buffer lengths do not match the plugin's layout */
#define WARD_ADAPTER_E_NOMEM (-0x100000000LL - 5)    /* out of memory */
#define WARD_ADAPTER_E_NOTOPEN (-0x100000000LL - 6)  /* no library opened yet */
#define WARD_ADAPTER_E_INSTANCE (-0x100000000LL - 7) /* the plugin refused to create an instance */
#define WARD_ADAPTER_E_INIT (-0x100000000LL - 8)     /* the plugin's init failed */

/* Most bytes after a copy of an input that read as zeros before its guard page (the policy's read_past_input_kb,
 * which the host passes to each instance, is at most 1024). */
#define WARD_READ_PAST_INPUT_MAX (1024u * 1024u)

/* A buffer that ends exactly at a PROT_NONE guard page, so writing past its end faults instead of corrupting
 * whatever follows (Nooks' rule for buffers lent to an extension); for a copy of an input, the guard page may follow
 * read-only zeros: a plugin that reads a little past an input (frei0r's UV Map reads up to a row and a pixel past its
 * second frame) reads zeros instead of faulting, as natively it reads whatever follows the host's buffer. */
struct guarded {
    unsigned char *map; /* start of the mapping, 0 when none */
    size_t map_len;     /* bytes mapped, guard page included */
    size_t cap;         /* usable bytes before the guard (or before the zeros) */
    size_t zeros;       /* read-only zero bytes between the usable bytes and the guard */
};

static inline size_t ward_page_size(void) {
    static size_t page;
    if (page == 0)
        page = (size_t)sysconf(_SC_PAGESIZE);
    return page;
}

static inline void guarded_free(struct guarded *g) {
    if (g->map != NULL)
        munmap(g->map, g->map_len);
    g->map = NULL;
    g->map_len = 0;
    g->cap = 0;
    g->zeros = 0;
}

/* A pointer to `len` bytes ending `zeros` bytes (a multiple of the page) before the guard page, with the start
 * rounded down to `align`, a power of two, so a plugin using aligned vector loads is served (the end then lies less
 * than `align` bytes before the zeros). NULL when out of memory. The mapping is reused while it fits. */
static inline void *guarded_get_before(struct guarded *g, size_t len, size_t align, size_t zeros) {
    size_t page = ward_page_size();
    size_t need = len + align;
    if (g->map == NULL || g->cap < need || g->zeros != zeros) {
        guarded_free(g);
        size_t usable = (need + page - 1) / page * page;
        if (usable == 0)
            usable = page;
        void *m = mmap(NULL, usable + zeros + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        unsigned char *after = (unsigned char *)m + usable;
        if ((zeros != 0 && mprotect(after, zeros, PROT_READ) != 0) || mprotect(after + zeros, page, PROT_NONE) != 0) {
            munmap(m, usable + zeros + page);
            return NULL;
        }
        g->map = m;
        g->map_len = usable + zeros + page;
        g->cap = usable;
        g->zeros = zeros;
    }
    uintptr_t end = (uintptr_t)(g->map + g->cap);
    return (void *)((end - len) & ~(uintptr_t)(align - 1));
}

/* A buffer for an output: `len` bytes ending at the guard page (less the alignment). */
static inline void *guarded_get(struct guarded *g, size_t len, size_t align) {
    return guarded_get_before(g, len, align, 0);
}

/* A buffer for a copy of an input of `len` bytes: what the plugin reads past it is zeros, the few bytes the
 * alignment leaves before the page end (cleared here, they may hold an earlier copy) and `read_past` read-only bytes
 * (rounded up to whole pages, at most WARD_READ_PAST_INPUT_MAX), then the guard page. NULL when out of memory. */
static inline void *guarded_get_input(struct guarded *g, size_t len, size_t align, size_t read_past) {
    size_t page = ward_page_size();
    if (read_past > WARD_READ_PAST_INPUT_MAX)
        read_past = WARD_READ_PAST_INPUT_MAX;
    size_t zeros = (read_past + page - 1) / page * page;
    unsigned char *p = guarded_get_before(g, len, align, zeros);
    if (p != NULL)
        memset(p + len, 0, (size_t)(g->map + g->cap - (p + len)));
    return p;
}

/* Serialisation into a caller's buffer: little-endian scalars, strings as u32 length + bytes. Writing past the
 * capacity only counts, so the caller learns the size it needs. */
struct writer {
    unsigned char *out;
    size_t cap;
    size_t len;
};

static inline void put_bytes(struct writer *w, const void *p, size_t n) {
    if (w->len + n <= w->cap)
        memcpy(w->out + w->len, p, n);
    w->len += n;
}

static inline void put_u32(struct writer *w, uint32_t v) { put_bytes(w, &v, 4); }
static inline void put_i32(struct writer *w, int32_t v) { put_bytes(w, &v, 4); }
static inline void put_u64(struct writer *w, uint64_t v) { put_bytes(w, &v, 8); }
static inline void put_f32(struct writer *w, float v) { put_bytes(w, &v, 4); }
static inline void put_f64(struct writer *w, double v) { put_bytes(w, &v, 8); }

static inline void put_str(struct writer *w, const char *s) {
    size_t n = s == NULL ? 0 : strnlen(s, 65536);
    put_u32(w, (uint32_t)n);
    put_bytes(w, s, n);
}

/* The writer's result: bytes written, or minus the bytes needed when the buffer was too small. */
static inline int64_t writer_result(const struct writer *w) {
    return w->len <= w->cap ? (int64_t)w->len : -(int64_t)w->len;
}

#endif
