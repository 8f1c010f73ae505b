/* ward's LV2 class adapter: loaded into a domain in place of the plugin library, it opens the library there and
 * turns LV2's pointer-rich interface into flat calls. Descriptors are serialised; instances are handles; the host's
 * features are proxied, not passed through: the URID map and unmap, the log, the state extension's path functions
 * and the worker's schedule reach the host through one host callback per instance (or are queued here and fetched by
 * the class), the options are copied in; options:interface's get and set copy the options out and in. A block's port buffers travel in one packed buffer, are copied into buffers that end at guard pages (so an
 * overrunning plugin faults instead of corrupting anything), and the outputs come back in another.
 *
 * What LV2 keeps outside the binary (which ports a plugin has, of what kind) the class reads from the bundle on the
 * host's side and hands over at instantiation. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ward_adapter_common.h"
#include "ward_lv2_abi.h"
#include "ward_poisoned_call.h"

/* More descriptors than any library has; a loop guard against a library that never returns NULL. */
#define MAX_DESCRIPTORS 4096
/* More ports than any plugin has; the class refuses more before it gets here. */
#define MAX_PORTS 4096
/* The largest buffer of one port, atom ports included (lsp's oscilloscopes ask 48 MiB for an atom output). */
#define MAX_PORT_BYTES (64u << 20)
/* The most bytes of worker requests (or of responses to one request) queued at once; more is LV2_WORKER_ERR_NO_SPACE,
 * as from a host whose ring is full. */
#define WORK_QUEUE_BYTES (64u * 1024u)
/* The worker requests a queue holds at most: those not yet handed to the class (WORK_QUEUE_BYTES) and those handed
 * out but not yet acknowledged (see ward_lv2_take_work). */
#define WORK_QUEUE_HELD_BYTES (2u * WORK_QUEUE_BYTES)
/* Log messages: longer ones are cut; more than LOG_BURST within a second are dropped and counted. */
#define LOG_MESSAGE_BYTES 512
#define LOG_BURST 20
/* URIs longer than this are not mapped (0, as the spec's failure value). */
#define MAX_URI_BYTES 4096
/* Paths longer than this are not mapped (NULL, as from a host that cannot). */
#define MAX_PATH_BYTES 4096
/* The most options one get or set carries, and the largest value of one. */
#define MAX_OPTIONS 1024
#define MAX_OPTION_BYTES 65536
#define URI_CACHE_SLOTS 1024

/* Flags of a described plugin. */
#define HAS_ACTIVATE 0x1
#define HAS_DEACTIVATE 0x2
#define HAS_CLEANUP 0x4
#define HAS_RUN 0x8
#define HAS_STATE 0x10
#define HAS_WORKER 0x20
#define HAS_OPTIONS 0x40

/* The features the host offers, as the class sends them. */
#define FEATURE_MAP 0x1
#define FEATURE_UNMAP 0x2
#define FEATURE_LOG 0x4
#define FEATURE_SCHEDULE 0x8
#define FEATURE_BOUNDED 0x10
#define FEATURE_FIXED 0x20
#define FEATURE_POWER_OF_2 0x40
#define FEATURE_OPTIONS 0x80
#define FEATURE_MAP_PATH 0x100
#define FEATURE_MAKE_PATH 0x200
#define FEATURE_FREE_PATH 0x400
#define PATH_FEATURES (FEATURE_MAP_PATH | FEATURE_MAKE_PATH | FEATURE_FREE_PATH)

/* Port kinds, as the class sends them. */
#define PORT_AUDIO 0
#define PORT_CONTROL 1
#define PORT_CV 2
#define PORT_ATOM 3
#define PORT_OTHER 4

/* What the host callback is asked (its first argument). */
#define HOST_PUT 1        /* append (arg) bytes of w0..w3 to the text being sent */
#define HOST_MAP 2        /* map the text sent: the URID, 0 when it cannot */
#define HOST_UNMAP_LEN 3  /* unmap URID (arg): the URI's length, -1 when unknown; the host keeps the URI */
#define HOST_REPLY_GET 4  /* 8 bytes of the text the host keeps (a URI unmapped, a path), from offset (arg) */
#define HOST_LOG 5        /* log the text sent, of log type URID (arg) */
#define HOST_ABSTRACT_PATH 6 /* state:mapPath's abstract_path of the text sent: its length, -1 for NULL; kept */
#define HOST_ABSOLUTE_PATH 7 /* state:mapPath's absolute_path of the text sent, as above */
#define HOST_MAKE_PATH 8     /* state:makePath's path of the text sent, as above */

typedef int64_t (*host_fn)(uint64_t op, uint64_t arg, uint64_t w0, uint64_t w1, uint64_t w2, uint64_t w3);

struct library {
    void *dl;
    const LV2_Lib_Descriptor *lib;      /* when the library exports lv2_lib_descriptor */
    LV2_Descriptor_Function descriptor; /* otherwise */
    uint32_t count;
};

/* A spin lock: cheap, and usable in every kind of domain (an mpk domain has no thread-local storage). */
static void lock(volatile int *l) {
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(l, __ATOMIC_RELAXED))
            __builtin_ia32_pause();
}
static void unlock(volatile int *l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }

struct uri_slot {
    char *uri;      /* owned; NULL when free */
    LV2_URID urid;
};

struct queue {
    unsigned char *bytes;
    size_t len;
    /* The first `held` bytes were handed out by the take numbered `handed` (0: none since the last acknowledgement)
     * and are kept until the class says it received them (the work queue's only). */
    size_t held;
    uint64_t handed;
};

struct instance {
    const LV2_Descriptor *desc;
    LV2_Handle handle;
    host_fn host;
    uint32_t features;
    volatile int host_lock; /* one text in flight to the host at a time */

    /* Ports. */
    uint32_t port_count;
    uint32_t *port_kind;
    unsigned char *port_output;
    struct guarded *buffers;
    void **connected;
    unsigned char *ever_connected;
    size_t read_past;
    int activate_pending;

    /* Features as the plugin sees them. */
    LV2_URID_Map map;
    LV2_URID_Unmap unmap;
    LV2_Log_Log log;
    LV2_Worker_Schedule schedule;
    LV2_Feature feature_map, feature_unmap, feature_log, feature_schedule, feature_options;
    LV2_Feature feature_bounded, feature_fixed, feature_pow2;
    /* The state extension's path functions, offered at instantiate (makePath, freePath) as the host did, and to a
     * save or restore as the host does for that call. */
    LV2_State_Map_Path map_path;
    LV2_State_Make_Path make_path;
    LV2_State_Free_Path free_path;
    LV2_Feature feature_map_path, feature_make_path, feature_free_path;
    LV2_Feature *flag_features;
    uint32_t flag_feature_count;
    const LV2_Feature **features_list;
    LV2_Options_Option *options;
    unsigned char *option_values;

    /* The URID caches: URIs mapped, URIs unmapped. */
    struct uri_slot mapped[URI_CACHE_SLOTS];
    struct uri_slot unmapped[URI_CACHE_SLOTS];
    volatile int cache_lock;

    /* Log rate. */
    int64_t log_window_start_ms;
    uint32_t log_in_window;
    uint32_t log_dropped;

    /* options:interface, when the plugin has it. */
    const LV2_Options_Interface *options_iface;

    /* Worker: requests the plugin scheduled, responses its work gave. */
    const LV2_Worker_Interface *worker;
    struct queue work;
    struct queue responses;
    volatile int work_lock;

    /* State: a save not yet taken whole. */
    const LV2_State_Interface *state;
    unsigned char *saved;
    size_t saved_len, saved_cap;
    int saved_pending;
    /* A restore that came while the activation waited for the first block (a restart replaying a checkpoint): done
     * right after that activation, so the plugin's activate does not clear what it restored. */
    unsigned char *pending_restore;
    size_t pending_restore_len;
    uint32_t pending_restore_features;
};

/* ---- reading the class's packed inputs ---- */

struct reader {
    const unsigned char *at;
    size_t left;
    int bad;
};

static uint32_t get_u32(struct reader *r) {
    uint32_t v = 0;
    if (r->left < 4) {
        r->bad = 1;
        return 0;
    }
    memcpy(&v, r->at, 4);
    r->at += 4;
    r->left -= 4;
    return v;
}

static const unsigned char *get_bytes(struct reader *r, size_t n) {
    if (r->left < n) {
        r->bad = 1;
        return NULL;
    }
    const unsigned char *p = r->at;
    r->at += n;
    r->left -= n;
    return p;
}

/* A string (u32 length, bytes) copied into a new NUL-terminated one; NULL when malformed or out of memory. */
static char *get_str(struct reader *r) {
    uint32_t n = get_u32(r);
    const unsigned char *p = get_bytes(r, n);
    if (p == NULL)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (s == NULL) {
        r->bad = 1;
        return NULL;
    }
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

/* ---- the library ---- */

static const LV2_Descriptor *descriptor(const struct library *lib, uint32_t index) {
    if (index >= lib->count && lib->count != 0)
        return NULL;
    if (lib->lib != NULL)
        return (const LV2_Descriptor *)WARD_CALL2(lib->lib->get_plugin, lib->lib->handle, index);
    return (const LV2_Descriptor *)WARD_CALL1(lib->descriptor, index);
}

/* The directory of `path` with a trailing slash, as hosts pass a bundle path; NULL when out of memory. */
static char *bundle_of(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t n = slash == NULL ? 0 : (size_t)(slash - path) + 1;
    char *b = malloc(n + 3);
    if (b == NULL)
        return NULL;
    if (n == 0) {
        memcpy(b, "./", 3);
    } else {
        memcpy(b, path, n);
        b[n] = 0;
    }
    return b;
}

/* Open a plugin library; NULL when it cannot be opened or is no LV2 library, and then `why` holds the reason as a
 * u32-prefixed string (see ward_ladspa_open). */
WARD_ADAPTER_EXPORT struct library *ward_lv2_open(const char *path, unsigned char *why, uint64_t why_cap) {
    struct writer reason = {why, why_cap, 0};
    (void)dlopen("libm.so.6", RTLD_NOW | RTLD_GLOBAL);
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        const char *e = dlerror();
        put_str(&reason, e != NULL ? e : "dlopen failed");
        return NULL;
    }
    struct library *lib = calloc(1, sizeof *lib);
    if (lib == NULL) {
        put_str(&reason, "out of memory");
        return NULL;
    }
    lib->dl = dl;
    LV2_Lib_Descriptor_Function lib_fn = (LV2_Lib_Descriptor_Function)(uintptr_t)dlsym(dl, "lv2_lib_descriptor");
    if (lib_fn != NULL) {
        char *bundle = bundle_of(path);
        static const LV2_Feature *const no_features[] = {NULL};
        if (bundle != NULL)
            lib->lib = (const LV2_Lib_Descriptor *)WARD_CALL2(lib_fn, bundle, no_features);
        free(bundle);
    }
    if (lib->lib == NULL) {
        lib->descriptor = (LV2_Descriptor_Function)(uintptr_t)dlsym(dl, "lv2_descriptor");
        if (lib->descriptor == NULL) {
            put_str(&reason, lib_fn != NULL ? "lv2_lib_descriptor returned NULL and it exports no lv2_descriptor"
                                            : "it exports neither lv2_descriptor nor lv2_lib_descriptor");
            free(lib);
            return NULL;
        }
    }
    while (lib->count < MAX_DESCRIPTORS) {
        const LV2_Descriptor *d = lib->lib != NULL
                                      ? (const LV2_Descriptor *)WARD_CALL2(lib->lib->get_plugin, lib->lib->handle, lib->count)
                                      : (const LV2_Descriptor *)WARD_CALL1(lib->descriptor, lib->count);
        if (d == NULL)
            break;
        lib->count++;
    }
    return lib;
}

WARD_ADAPTER_EXPORT int64_t ward_lv2_count(const struct library *lib) { return (int64_t)lib->count; }

/* Forget the library (its code stays mapped, as for LADSPA). */
WARD_ADAPTER_EXPORT int64_t ward_lv2_close(struct library *lib) {
    free(lib);
    return 0;
}

/* Forget the library and unload it (the describer's use). */
WARD_ADAPTER_EXPORT int64_t ward_lv2_unload(struct library *lib) {
    void *dl = lib->dl;
    if (lib->lib != NULL && lib->lib->cleanup != NULL)
        WARD_CALL1(lib->lib->cleanup, lib->lib->handle);
    free(lib);
    return dlclose(dl) == 0 ? 0 : -1;
}

static const void *extension(const LV2_Descriptor *d, const char *uri) {
    if (d->extension_data == NULL)
        return NULL;
    return (const void *)WARD_CALL1(d->extension_data, uri);
}

/* Serialise plugin `index`: u32 flags (HAS_*), then its URI. */
WARD_ADAPTER_EXPORT int64_t ward_lv2_describe(const struct library *lib, uint64_t index, unsigned char *out,
                                              uint64_t cap) {
    const LV2_Descriptor *d = descriptor(lib, (uint32_t)index);
    if (index >= lib->count || d == NULL)
        return WARD_ADAPTER_E_INDEX;
    uint32_t flags = (d->activate ? HAS_ACTIVATE : 0) | (d->deactivate ? HAS_DEACTIVATE : 0) |
                     (d->cleanup ? HAS_CLEANUP : 0) | (d->run ? HAS_RUN : 0);
    const LV2_State_Interface *state = extension(d, WARD_LV2_STATE_INTERFACE);
    if (state != NULL && state->save != NULL && state->restore != NULL)
        flags |= HAS_STATE;
    const LV2_Worker_Interface *worker = extension(d, WARD_LV2_WORKER_INTERFACE);
    if (worker != NULL && worker->work != NULL && worker->work_response != NULL)
        flags |= HAS_WORKER;
    const LV2_Options_Interface *options = extension(d, WARD_LV2_OPTIONS_INTERFACE);
    if (options != NULL && (options->get != NULL || options->set != NULL))
        flags |= HAS_OPTIONS;
    struct writer w = {out, cap, 0};
    put_u32(&w, flags);
    put_str(&w, d->URI);
    return writer_result(&w);
}

/* ---- features: talking to the host ---- */

/* Send `text` (n bytes) to the host, 32 bytes a call. Called with the instance's host lock held. */
static void send_text(struct instance *inst, const char *text, size_t n) {
    for (size_t at = 0; at < n; at += 32) {
        uint64_t w[4] = {0, 0, 0, 0};
        size_t chunk = n - at < 32 ? n - at : 32;
        memcpy(w, text + at, chunk);
        inst->host(HOST_PUT, chunk, w[0], w[1], w[2], w[3]);
    }
}

static uint64_t hash_uri(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static LV2_URID map_uri(LV2_URID_Map_Handle handle, const char *uri) {
    struct instance *inst = handle;
    if (uri == NULL)
        return 0;
    size_t n = strnlen(uri, MAX_URI_BYTES + 1);
    if (n > MAX_URI_BYTES)
        return 0;
    uint64_t h = hash_uri(uri, n);
    lock(&inst->cache_lock);
    for (uint32_t probe = 0; probe < URI_CACHE_SLOTS; probe++) {
        struct uri_slot *s = &inst->mapped[(h + probe) % URI_CACHE_SLOTS];
        if (s->uri == NULL)
            break;
        if (strcmp(s->uri, uri) == 0) {
            LV2_URID urid = s->urid;
            unlock(&inst->cache_lock);
            return urid;
        }
    }
    unlock(&inst->cache_lock);
    lock(&inst->host_lock);
    send_text(inst, uri, n);
    int64_t got = inst->host(HOST_MAP, n, 0, 0, 0, 0);
    unlock(&inst->host_lock);
    LV2_URID urid = got > 0 && got <= UINT32_MAX ? (LV2_URID)got : 0;
    if (urid == 0)
        return 0;
    lock(&inst->cache_lock);
    for (uint32_t probe = 0; probe < URI_CACHE_SLOTS; probe++) {
        struct uri_slot *s = &inst->mapped[(h + probe) % URI_CACHE_SLOTS];
        if (s->uri == NULL) {
            s->uri = strndup(uri, n);
            s->urid = urid;
            break;
        }
        if (strcmp(s->uri, uri) == 0)
            break;
    }
    unlock(&inst->cache_lock);
    return urid;
}

/* The host's reply of `len` bytes (a length the host just answered, checked against `max`), fetched eight bytes at a
 * time into a new NUL-terminated string; NULL when the length is out of bounds or memory is short. Called with
 * host_lock held. */
static char *fetch_reply(struct instance *inst, int64_t len, int64_t max) {
    char *out = NULL;
    if (len < 0 || len > max || (out = malloc((size_t)len + 8)) == NULL)
        return NULL;
    for (int64_t at = 0; at < len; at += 8) {
        int64_t w = inst->host(HOST_REPLY_GET, (uint64_t)at, 0, 0, 0, 0);
        memcpy(out + at, &w, 8);
    }
    out[len] = 0;
    return out;
}

static const char *unmap_urid(LV2_URID_Unmap_Handle handle, LV2_URID urid) {
    struct instance *inst = handle;
    if (urid == 0)
        return NULL;
    lock(&inst->cache_lock);
    for (uint32_t probe = 0; probe < URI_CACHE_SLOTS; probe++) {
        struct uri_slot *s = &inst->unmapped[(urid + probe) % URI_CACHE_SLOTS];
        if (s->uri == NULL)
            break;
        if (s->urid == urid) {
            const char *uri = s->uri;
            unlock(&inst->cache_lock);
            return uri;
        }
    }
    unlock(&inst->cache_lock);
    lock(&inst->host_lock);
    char *uri = fetch_reply(inst, inst->host(HOST_UNMAP_LEN, urid, 0, 0, 0, 0), MAX_URI_BYTES);
    unlock(&inst->host_lock);
    if (uri == NULL)
        return NULL;
    lock(&inst->cache_lock);
    for (uint32_t probe = 0; probe < URI_CACHE_SLOTS; probe++) {
        struct uri_slot *s = &inst->unmapped[(urid + probe) % URI_CACHE_SLOTS];
        if (s->uri == NULL) {
            s->uri = uri;
            s->urid = urid;
            unlock(&inst->cache_lock);
            return uri;
        }
        if (s->urid == urid) {
            unlock(&inst->cache_lock);
            free(uri);
            return s->uri;
        }
    }
    unlock(&inst->cache_lock);
    /* The cache is full: the string is leaked rather than freed under a plugin that may keep it. */
    return uri;
}

/* A path the host's state feature (`op`) makes of `path`, copied into a new string here (the plugin frees it with the
 * freePath offered, or free); NULL when the path is too long or the host answers NULL. */
static char *host_path(struct instance *inst, uint64_t op, const char *path) {
    if (path == NULL)
        return NULL;
    size_t n = strnlen(path, MAX_PATH_BYTES + 1);
    if (n > MAX_PATH_BYTES)
        return NULL;
    lock(&inst->host_lock);
    send_text(inst, path, n);
    char *out = fetch_reply(inst, inst->host(op, n, 0, 0, 0, 0), MAX_PATH_BYTES);
    unlock(&inst->host_lock);
    return out;
}

static char *abstract_path(LV2_State_Map_Path_Handle handle, const char *absolute) {
    return host_path(handle, HOST_ABSTRACT_PATH, absolute);
}

static char *absolute_path(LV2_State_Map_Path_Handle handle, const char *abstract) {
    return host_path(handle, HOST_ABSOLUTE_PATH, abstract);
}

static char *make_path(LV2_State_Make_Path_Handle handle, const char *path) {
    return host_path(handle, HOST_MAKE_PATH, path);
}

/* The strings handed out above are this adapter's: freed here, whatever the host's freePath does with its own. */
static void free_path(LV2_State_Free_Path_Handle handle, char *path) {
    (void)handle;
    free(path);
}

/* The path features offered to a save or restore (`features`, FEATURE_* bits), NULL-terminated, in `list` (4). */
static const LV2_Feature *const *state_features(struct instance *inst, uint32_t features, const LV2_Feature **list) {
    size_t n = 0;
    if (features & FEATURE_MAP_PATH)
        list[n++] = &inst->feature_map_path;
    if (features & FEATURE_MAKE_PATH)
        list[n++] = &inst->feature_make_path;
    if (features & FEATURE_FREE_PATH)
        list[n++] = &inst->feature_free_path;
    list[n] = NULL;
    return list;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int log_vprintf(LV2_Log_Handle handle, LV2_URID type, const char *fmt, va_list ap) {
    struct instance *inst = handle;
    char text[LOG_MESSAGE_BYTES + 64];
    lock(&inst->host_lock);
    int64_t now = now_ms();
    if (now - inst->log_window_start_ms >= 1000) {
        inst->log_window_start_ms = now;
        inst->log_in_window = 0;
    }
    if (inst->log_in_window >= LOG_BURST) {
        inst->log_dropped++;
        unlock(&inst->host_lock);
        return 0;
    }
    inst->log_in_window++;
    int n = vsnprintf(text, LOG_MESSAGE_BYTES, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n >= LOG_MESSAGE_BYTES ? LOG_MESSAGE_BYTES - 1 : (size_t)n;
    if (inst->log_dropped != 0) {
        int m = snprintf(text + len, sizeof text - len, " (%u earlier messages dropped)", inst->log_dropped);
        if (m > 0)
            len += (size_t)m < sizeof text - len ? (size_t)m : sizeof text - len - 1;
        inst->log_dropped = 0;
    }
    send_text(inst, text, len);
    inst->host(HOST_LOG, type, 0, 0, 0, 0);
    unlock(&inst->host_lock);
    return n;
}

static int log_printf(LV2_Log_Handle handle, LV2_URID type, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = log_vprintf(handle, type, fmt, ap);
    va_end(ap);
    return n;
}

/* Append `size` bytes of `data`, prefixed by their size, to `q`; false when the queue would pass its bound (bytes
 * handed out and held until acknowledged do not count against it, up to as many again). */
static int enqueue(struct queue *q, uint32_t size, const void *data) {
    size_t record = 4 + (size_t)size;
    if (q->len - q->held + record > WORK_QUEUE_BYTES || q->len + record > WORK_QUEUE_HELD_BYTES)
        return 0;
    if (q->bytes == NULL && (q->bytes = malloc(WORK_QUEUE_HELD_BYTES)) == NULL)
        return 0;
    memcpy(q->bytes + q->len, &size, 4);
    memcpy(q->bytes + q->len + 4, data, size);
    q->len += 4 + (size_t)size;
    return 1;
}

static LV2_Worker_Status schedule_work(LV2_Worker_Schedule_Handle handle, uint32_t size, const void *data) {
    struct instance *inst = handle;
    if (size != 0 && data == NULL)
        return LV2_WORKER_ERR_UNKNOWN;
    lock(&inst->work_lock);
    int queued = enqueue(&inst->work, size, data);
    unlock(&inst->work_lock);
    return queued ? LV2_WORKER_SUCCESS : LV2_WORKER_ERR_NO_SPACE;
}

static LV2_Worker_Status respond(LV2_Worker_Respond_Handle handle, uint32_t size, const void *data) {
    struct instance *inst = handle;
    if (size != 0 && data == NULL)
        return LV2_WORKER_ERR_UNKNOWN;
    return enqueue(&inst->responses, size, data) ? LV2_WORKER_SUCCESS : LV2_WORKER_ERR_NO_SPACE;
}

/* ---- instances ---- */

static void instance_free(struct instance *inst) {
    if (inst->buffers != NULL)
        for (uint32_t p = 0; p < inst->port_count; p++)
            guarded_free(&inst->buffers[p]);
    free(inst->buffers);
    free(inst->connected);
    free(inst->ever_connected);
    free(inst->port_kind);
    free(inst->port_output);
    for (uint32_t i = 0; i < inst->flag_feature_count; i++)
        free((char *)inst->flag_features[i].URI);
    free(inst->flag_features);
    free(inst->features_list);
    free(inst->options);
    free(inst->option_values);
    for (int i = 0; i < URI_CACHE_SLOTS; i++) {
        free(inst->mapped[i].uri);
        free(inst->unmapped[i].uri);
    }
    free(inst->work.bytes);
    free(inst->responses.bytes);
    free(inst->saved);
    free(inst->pending_restore);
    free(inst);
}

/* Read the instantiation's packed inputs (see `Instantiation::pack` in lv2.rs) into `inst`: 0 when malformed. */
static int read_setup(struct instance *inst, const unsigned char *in, uint64_t in_len, char **bundle) {
    struct reader r = {in, in_len, 0};
    inst->features = get_u32(&r);
    uint32_t read_past_kb = get_u32(&r);
    inst->read_past = read_past_kb > WARD_READ_PAST_INPUT_MAX / 1024 ? WARD_READ_PAST_INPUT_MAX
                                                                      : (size_t)read_past_kb * 1024;
    *bundle = get_str(&r);
    inst->port_count = get_u32(&r);
    if (r.bad || *bundle == NULL || inst->port_count > MAX_PORTS)
        return 0;
    size_t n = inst->port_count + 1;
    inst->port_kind = calloc(n, sizeof *inst->port_kind);
    inst->port_output = calloc(n, 1);
    inst->buffers = calloc(n, sizeof *inst->buffers);
    inst->connected = calloc(n, sizeof *inst->connected);
    inst->ever_connected = calloc(n, 1);
    if (!inst->port_kind || !inst->port_output || !inst->buffers || !inst->connected || !inst->ever_connected)
        return 0;
    for (uint32_t p = 0; p < inst->port_count; p++) {
        inst->port_kind[p] = get_u32(&r);
        inst->port_output[p] = get_u32(&r) != 0;
        if (inst->port_kind[p] > PORT_OTHER)
            return 0;
    }
    uint32_t options = get_u32(&r);
    if (r.bad || options > 1024)
        return 0;
    /* The values first travel as they come; they are copied once their total is known. */
    inst->options = calloc((size_t)options + 1, sizeof *inst->options);
    if (inst->options == NULL)
        return 0;
    const unsigned char **values = calloc((size_t)options + 1, sizeof *values);
    if (values == NULL)
        return 0;
    size_t total = 0;
    for (uint32_t i = 0; i < options; i++) {
        LV2_Options_Option *o = &inst->options[i];
        o->context = (LV2_Options_Context)get_u32(&r);
        o->subject = get_u32(&r);
        o->key = get_u32(&r);
        o->type = get_u32(&r);
        o->size = get_u32(&r);
        values[i] = get_bytes(&r, o->size);
        if (r.bad || o->size > 65536)
            break;
        total += ((size_t)o->size + 7) & ~(size_t)7;
    }
    if (!r.bad && (inst->option_values = malloc(total + 8)) != NULL) {
        size_t at = 0;
        for (uint32_t i = 0; i < options; i++) {
            memcpy(inst->option_values + at, values[i], inst->options[i].size);
            inst->options[i].value = inst->option_values + at;
            at += ((size_t)inst->options[i].size + 7) & ~(size_t)7;
        }
    }
    free(values);
    if (r.bad || inst->option_values == NULL)
        return 0;
    inst->flag_feature_count = get_u32(&r);
    if (r.bad || inst->flag_feature_count > 256)
        return 0;
    inst->flag_features = calloc((size_t)inst->flag_feature_count + 1, sizeof *inst->flag_features);
    if (inst->flag_features == NULL)
        return 0;
    for (uint32_t i = 0; i < inst->flag_feature_count; i++) {
        inst->flag_features[i].URI = get_str(&r);
        if (inst->flag_features[i].URI == NULL)
            return 0;
    }
    return !r.bad && r.left == 0;
}

/* The feature list the plugin gets: what the host offers, each proxied here. */
static int build_features(struct instance *inst) {
    inst->map = (LV2_URID_Map){inst, map_uri};
    inst->unmap = (LV2_URID_Unmap){inst, unmap_urid};
    inst->log = (LV2_Log_Log){inst, log_printf, log_vprintf};
    inst->schedule = (LV2_Worker_Schedule){inst, schedule_work};
    inst->feature_map = (LV2_Feature){WARD_LV2_URID_MAP, &inst->map};
    inst->feature_unmap = (LV2_Feature){WARD_LV2_URID_UNMAP, &inst->unmap};
    inst->feature_log = (LV2_Feature){WARD_LV2_LOG_LOG, &inst->log};
    inst->feature_schedule = (LV2_Feature){WARD_LV2_WORKER_SCHEDULE, &inst->schedule};
    inst->feature_options = (LV2_Feature){WARD_LV2_OPTIONS_OPTIONS, inst->options};
    inst->feature_bounded = (LV2_Feature){WARD_LV2_BUF_SIZE_BOUNDED, NULL};
    inst->feature_fixed = (LV2_Feature){WARD_LV2_BUF_SIZE_FIXED, NULL};
    inst->feature_pow2 = (LV2_Feature){WARD_LV2_BUF_SIZE_POWER_OF_2, NULL};
    inst->map_path = (LV2_State_Map_Path){inst, abstract_path, absolute_path};
    inst->make_path = (LV2_State_Make_Path){inst, make_path};
    inst->free_path = (LV2_State_Free_Path){inst, free_path};
    inst->feature_map_path = (LV2_Feature){WARD_LV2_STATE_MAP_PATH, &inst->map_path};
    inst->feature_make_path = (LV2_Feature){WARD_LV2_STATE_MAKE_PATH, &inst->make_path};
    inst->feature_free_path = (LV2_Feature){WARD_LV2_STATE_FREE_PATH, &inst->free_path};
    inst->features_list = calloc(16 + (size_t)inst->flag_feature_count + 1, sizeof *inst->features_list);
    if (inst->features_list == NULL)
        return 0;
    size_t n = 0;
    uint32_t f = inst->features;
    if (f & FEATURE_MAP)
        inst->features_list[n++] = &inst->feature_map;
    if (f & FEATURE_UNMAP)
        inst->features_list[n++] = &inst->feature_unmap;
    if (f & FEATURE_LOG)
        inst->features_list[n++] = &inst->feature_log;
    if (f & FEATURE_SCHEDULE)
        inst->features_list[n++] = &inst->feature_schedule;
    if (f & FEATURE_OPTIONS)
        inst->features_list[n++] = &inst->feature_options;
    if (f & FEATURE_BOUNDED)
        inst->features_list[n++] = &inst->feature_bounded;
    if (f & FEATURE_FIXED)
        inst->features_list[n++] = &inst->feature_fixed;
    if (f & FEATURE_POWER_OF_2)
        inst->features_list[n++] = &inst->feature_pow2;
    /* The state extension lets a host offer these two at instantiate (mapPath belongs to save and restore). */
    if (f & FEATURE_MAKE_PATH)
        inst->features_list[n++] = &inst->feature_make_path;
    if (f & FEATURE_FREE_PATH)
        inst->features_list[n++] = &inst->feature_free_path;
    for (uint32_t i = 0; i < inst->flag_feature_count; i++)
        inst->features_list[n++] = &inst->flag_features[i];
    inst->features_list[n] = NULL;
    return 1;
}

/* Create an instance of plugin `index` at `sample_rate` with the features, ports and options `setup` packs (see
 * read_setup) and `host` as its way to the host; NULL when the plugin refuses or the setup is malformed. */
WARD_ADAPTER_EXPORT struct instance *ward_lv2_instantiate(const struct library *lib, uint64_t index,
                                                         const unsigned char *setup, uint64_t setup_len,
                                                         host_fn host, double sample_rate) {
    const LV2_Descriptor *d = descriptor(lib, (uint32_t)index);
    if (index >= lib->count || d == NULL || d->instantiate == NULL)
        return NULL;
    struct instance *inst = calloc(1, sizeof *inst);
    if (inst == NULL)
        return NULL;
    inst->desc = d;
    inst->host = host;
    char *bundle = NULL;
    if (!read_setup(inst, setup, setup_len, &bundle) || !build_features(inst)) {
        free(bundle);
        instance_free(inst);
        return NULL;
    }
    inst->log_window_start_ms = now_ms();
    struct ward_call c = ward_call_begin((const void *)(uintptr_t)d->instantiate);
    c.ints[0] = WARD_ARG(d);
    c.floats[0] = ward_f64_bits(sample_rate);
    c.ints[1] = WARD_ARG(bundle);
    c.ints[2] = WARD_ARG(inst->features_list);
    ward_call_poisoned(&c);
    free(bundle);
    inst->handle = (LV2_Handle)(uintptr_t)c.ret_int;
    if (inst->handle == NULL) {
        instance_free(inst);
        return NULL;
    }
    const LV2_Worker_Interface *worker = extension(d, WARD_LV2_WORKER_INTERFACE);
    if (worker != NULL && worker->work != NULL && worker->work_response != NULL)
        inst->worker = worker;
    const LV2_State_Interface *state = extension(d, WARD_LV2_STATE_INTERFACE);
    if (state != NULL && state->save != NULL && state->restore != NULL)
        inst->state = state;
    const LV2_Options_Interface *options = extension(d, WARD_LV2_OPTIONS_INTERFACE);
    if (options != NULL && (options->get != NULL || options->set != NULL))
        inst->options_iface = options;
    return inst;
}

static int all_connected(const struct instance *inst) {
    for (uint32_t p = 0; p < inst->port_count; p++)
        if (!inst->ever_connected[p])
            return 0;
    return 1;
}

/* Activate the instance: at once when every port is connected, else at the first block, after its connections (see
 * ward_ladspa_activate: plugins read their controls in activate). */
WARD_ADAPTER_EXPORT int64_t ward_lv2_activate(struct instance *inst) {
    if (inst->desc->activate == NULL)
        return 0;
    if (!all_connected(inst)) {
        inst->activate_pending = 1;
        return 0;
    }
    WARD_CALL1(inst->desc->activate, inst->handle);
    return 0;
}

WARD_ADAPTER_EXPORT int64_t ward_lv2_deactivate(struct instance *inst) {
    if (inst->activate_pending) {
        inst->activate_pending = 0;
        return 0;
    }
    if (inst->desc->deactivate)
        WARD_CALL1(inst->desc->deactivate, inst->handle);
    return 0;
}

WARD_ADAPTER_EXPORT int64_t ward_lv2_cleanup(struct instance *inst) {
    if (inst->desc->cleanup)
        WARD_CALL1(inst->desc->cleanup, inst->handle);
    instance_free(inst);
    return 0;
}

static int64_t restore_now(struct instance *inst, const unsigned char *in, uint64_t in_len, uint32_t features);

/* Run one block of `samples` samples. `in` holds, per port, u32 bytes of its buffer (0: not connected) and u32 bytes
 * sent (at most those), then the bytes sent of each port in port order: an input's data, an output's present
 * contents (an atom output's header only, the capacity in its size). `out` receives every connected output's whole
 * buffer, in port order, as the plugin left it. Returns 0, the bytes of worker requests queued and not yet handed
 * out when there are any (the class fetches them with ward_lv2_take_work), or an error code. */
WARD_ADAPTER_EXPORT int64_t ward_lv2_run(struct instance *inst, uint64_t samples, const unsigned char *in,
                                         uint64_t in_len, unsigned char *out, uint64_t out_len) {
    const LV2_Descriptor *d = inst->desc;
    if (d->run == NULL)
        return WARD_ADAPTER_E_SYMBOL;
    size_t header = (size_t)inst->port_count * 8;
    if (in_len < header)
        return WARD_ADAPTER_E_LAYOUT;
    uint64_t want_in = header, want_out = 0;
    for (uint32_t p = 0; p < inst->port_count; p++) {
        uint32_t bytes, sent;
        memcpy(&bytes, in + 8 * (size_t)p, 4);
        memcpy(&sent, in + 8 * (size_t)p + 4, 4);
        if (sent > bytes || bytes > MAX_PORT_BYTES)
            return WARD_ADAPTER_E_LAYOUT;
        uint32_t kind = inst->port_kind[p];
        if (bytes != 0) {
            if ((kind == PORT_AUDIO || kind == PORT_CV) && bytes != samples * 4)
                return WARD_ADAPTER_E_LAYOUT;
            if (kind == PORT_CONTROL && bytes != 4)
                return WARD_ADAPTER_E_LAYOUT;
            if (kind == PORT_ATOM && bytes < sizeof(LV2_Atom))
                return WARD_ADAPTER_E_LAYOUT;
        }
        want_in += sent;
        if (inst->port_output[p])
            want_out += bytes;
    }
    if (want_in != in_len || want_out != out_len)
        return WARD_ADAPTER_E_LAYOUT;

    size_t at_in = header;
    for (uint32_t p = 0; p < inst->port_count; p++) {
        uint32_t bytes, sent;
        memcpy(&bytes, in + 8 * (size_t)p, 4);
        memcpy(&sent, in + 8 * (size_t)p + 4, 4);
        void *buf = NULL;
        if (bytes != 0) {
            size_t align = inst->port_kind[p] == PORT_AUDIO || inst->port_kind[p] == PORT_CV ? 16 : 8;
            buf = inst->port_output[p] ? guarded_get(&inst->buffers[p], bytes, align)
                                       : guarded_get_input(&inst->buffers[p], bytes, align, inst->read_past);
            if (buf == NULL)
                return WARD_ADAPTER_E_NOMEM;
            memcpy(buf, in + at_in, sent);
            /* The rest of a port sent short is zeros; an atom output's body is the plugin's to write, and can be
             * large (its capacity), so it is left as it is. */
            if (sent < bytes && !(inst->port_kind[p] == PORT_ATOM && inst->port_output[p]))
                memset((unsigned char *)buf + sent, 0, bytes - sent);
            at_in += sent;
        }
        if (!inst->ever_connected[p] || inst->connected[p] != buf) {
            WARD_CALL3(d->connect_port, inst->handle, p, buf);
            inst->connected[p] = buf;
            inst->ever_connected[p] = 1;
        }
    }
    if (inst->activate_pending) {
        inst->activate_pending = 0;
        WARD_CALL1(d->activate, inst->handle);
    }
    if (inst->pending_restore != NULL) {
        (void)restore_now(inst, inst->pending_restore, inst->pending_restore_len, inst->pending_restore_features);
        free(inst->pending_restore);
        inst->pending_restore = NULL;
    }
    WARD_CALL2(d->run, inst->handle, samples);
    /* Responses the host delivered came before this run; the block is over for the worker too. */
    if (inst->worker != NULL && inst->worker->end_run != NULL)
        WARD_CALL1(inst->worker->end_run, inst->handle);

    size_t at_out = 0;
    for (uint32_t p = 0; p < inst->port_count; p++) {
        uint32_t bytes;
        memcpy(&bytes, in + 8 * (size_t)p, 4);
        if (!inst->port_output[p] || bytes == 0)
            continue;
        size_t copy = bytes;
        if (inst->port_kind[p] == PORT_ATOM) {
            /* The atom as far as its header says, within the buffer: the host reads no further. */
            uint32_t size;
            memcpy(&size, inst->connected[p], 4);
            if ((size_t)size + sizeof(LV2_Atom) < copy)
                copy = (size_t)size + sizeof(LV2_Atom);
        }
        memcpy(out + at_out, inst->connected[p], copy);
        at_out += bytes;
    }
    lock(&inst->work_lock);
    size_t queued = inst->work.len - inst->work.held;
    unlock(&inst->work_lock);
    return (int64_t)queued;
}

/* Copy the worker requests queued so far into `out` (each a u32 size and its bytes), as the take numbered `take`
 * (numbers the class gives its takes, never 0, never the same twice for an instance); the bytes written, or minus the
 * bytes needed (nothing handed out) when `cap` is too small. What a take hands out stays queued until the class
 * acknowledges it: `received`, the number of the last take whose bytes it got (0: none), drops the bytes that take
 * handed out when it was the last here. A take whose bytes never reached the class (its call ran late, its output
 * dropped) is not acknowledged, and the next hands them out again, with whatever came since: none is lost, none is
 * handed twice. A restarted domain has handed out nothing, or only what its replayed takes did (the same, numbered
 * the same), so an acknowledgement of the incarnation before cannot drop what the class never got. */
WARD_ADAPTER_EXPORT int64_t ward_lv2_take_work(struct instance *inst, unsigned char *out, uint64_t cap,
                                               uint64_t received, uint64_t take) {
    struct queue *q = &inst->work;
    lock(&inst->work_lock);
    if (received != 0 && received == q->handed) {
        if (q->held != 0)
            memmove(q->bytes, q->bytes + q->held, q->len - q->held);
        q->len -= q->held;
        q->held = 0;
        q->handed = 0;
    }
    size_t len = q->len;
    if (len > cap) {
        unlock(&inst->work_lock);
        return -(int64_t)len;
    }
    if (len != 0)
        memcpy(out, q->bytes, len);
    q->held = len;
    q->handed = take;
    unlock(&inst->work_lock);
    return (int64_t)len;
}

/* Run the plugin's `work` on one request (`in`, `in_len` bytes); its responses go into `out` as the queue's records
 * (u32 size, bytes). The bytes written, or an error code; responses beyond `cap` were refused to the plugin
 * (LV2_WORKER_ERR_NO_SPACE), as a full ring would. */
WARD_ADAPTER_EXPORT int64_t ward_lv2_work(struct instance *inst, const unsigned char *in, uint64_t in_len,
                                          unsigned char *out, uint64_t cap) {
    if (inst->worker == NULL)
        return WARD_ADAPTER_E_SYMBOL;
    if (in_len > WORK_QUEUE_BYTES)
        return WARD_ADAPTER_E_LAYOUT;
    inst->responses.len = 0;
    struct ward_call c = ward_call_begin((const void *)(uintptr_t)inst->worker->work);
    c.ints[0] = WARD_ARG(inst->handle);
    c.ints[1] = WARD_ARG(respond);
    c.ints[2] = WARD_ARG(inst);
    c.ints[3] = WARD_ARG((uint32_t)in_len);
    c.ints[4] = WARD_ARG(in);
    ward_call_poisoned(&c);
    size_t len = inst->responses.len;
    if (len > cap)
        len = 0;
    if (len != 0)
        memcpy(out, inst->responses.bytes, len);
    inst->responses.len = 0;
    return (int64_t)len;
}

/* Deliver one response of the plugin's `work` to its `work_response`. */
WARD_ADAPTER_EXPORT int64_t ward_lv2_work_response(struct instance *inst, const unsigned char *in, uint64_t in_len) {
    if (inst->worker == NULL)
        return WARD_ADAPTER_E_SYMBOL;
    WARD_CALL3(inst->worker->work_response, inst->handle, (uint32_t)in_len, in);
    return 0;
}

/* ---- state ---- */

static LV2_State_Status store(LV2_State_Handle handle, uint32_t key, const void *value, size_t size, uint32_t type,
                              uint32_t flags) {
    struct instance *inst = handle;
    if (size > MAX_PORT_BYTES || (size != 0 && value == NULL))
        return LV2_STATE_ERR_UNKNOWN;
    size_t need = inst->saved_len + 16 + ((size + 7) & ~(size_t)7);
    if (need > inst->saved_cap) {
        size_t cap = inst->saved_cap == 0 ? 4096 : inst->saved_cap;
        while (cap < need)
            cap *= 2;
        unsigned char *grown = realloc(inst->saved, cap);
        if (grown == NULL)
            return LV2_STATE_ERR_NO_SPACE;
        inst->saved = grown;
        inst->saved_cap = cap;
    }
    uint32_t head[4] = {key, type, flags, (uint32_t)size};
    memcpy(inst->saved + inst->saved_len, head, 16);
    memcpy(inst->saved + inst->saved_len + 16, value, size);
    memset(inst->saved + inst->saved_len + 16 + size, 0, ((size + 7) & ~(size_t)7) - size);
    inst->saved_len = need;
    return LV2_STATE_SUCCESS;
}

/* Save the plugin's state: its properties as records (u32 key, type, flags, size; the value padded to 8 bytes) into
 * `out`, with the path features `features` (FEATURE_* bits) offered. The bytes written; minus the bytes needed when
 * `cap` is too small (the save is kept for the next call, which then takes it without saving again); an error code
 * when the plugin has no state interface or its save failed. */
WARD_ADAPTER_EXPORT int64_t ward_lv2_save(struct instance *inst, uint64_t features, unsigned char *out, uint64_t cap) {
    if (inst->state == NULL)
        return WARD_ADAPTER_E_SYMBOL;
    if (!inst->saved_pending) {
        const LV2_Feature *list[4];
        const LV2_Feature *const *offered = state_features(inst, (uint32_t)features & PATH_FEATURES, list);
        inst->saved_len = 0;
        struct ward_call c = ward_call_begin((const void *)(uintptr_t)inst->state->save);
        c.ints[0] = WARD_ARG(inst->handle);
        c.ints[1] = WARD_ARG(store);
        c.ints[2] = WARD_ARG(inst);
        c.ints[3] = WARD_ARG((uint32_t)(LV2_STATE_IS_POD | LV2_STATE_IS_PORTABLE));
        c.ints[4] = WARD_ARG(offered);
        ward_call_poisoned(&c);
        if ((uint32_t)c.ret_int != LV2_STATE_SUCCESS)
            return WARD_ADAPTER_E_INSTANCE;
    }
    if (inst->saved_len > cap) {
        inst->saved_pending = 1;
        return -(int64_t)inst->saved_len;
    }
    inst->saved_pending = 0;
    if (inst->saved_len != 0)
        memcpy(out, inst->saved, inst->saved_len);
    return (int64_t)inst->saved_len;
}

struct retrieving {
    const unsigned char *at;
    size_t len;
};

static const void *retrieve(LV2_State_Handle handle, uint32_t key, size_t *size, uint32_t *type, uint32_t *flags) {
    const struct retrieving *r = handle;
    size_t at = 0;
    while (at + 16 <= r->len) {
        uint32_t head[4];
        memcpy(head, r->at + at, 16);
        size_t padded = ((size_t)head[3] + 7) & ~(size_t)7;
        if (at + 16 + padded > r->len)
            break;
        if (head[0] == key) {
            if (size != NULL)
                *size = head[3];
            if (type != NULL)
                *type = head[1];
            if (flags != NULL)
                *flags = head[2];
            return r->at + at + 16;
        }
        at += 16 + padded;
    }
    return NULL;
}

/* Restore the plugin's state from records as ward_lv2_save writes them, with the path features `features` offered.
 * The values are read where they lie (8-byte aligned when `in` is): the plugin copies what it keeps, as LV2 asks.
 * While an activation waits for the first block, the records are kept and restored right after it. */
WARD_ADAPTER_EXPORT int64_t ward_lv2_restore(struct instance *inst, const unsigned char *in, uint64_t in_len,
                                             uint64_t features) {
    if (inst->state == NULL)
        return WARD_ADAPTER_E_SYMBOL;
    if (inst->activate_pending) {
        unsigned char *copy = malloc(in_len + 8);
        if (copy == NULL)
            return WARD_ADAPTER_E_NOMEM;
        memcpy(copy, in, in_len);
        free(inst->pending_restore);
        inst->pending_restore = copy;
        inst->pending_restore_len = in_len;
        inst->pending_restore_features = (uint32_t)features & PATH_FEATURES;
        return 0;
    }
    return restore_now(inst, in, in_len, (uint32_t)features & PATH_FEATURES);
}

static int64_t restore_now(struct instance *inst, const unsigned char *in, uint64_t in_len, uint32_t features) {
    const LV2_Feature *list[4];
    const LV2_Feature *const *offered = state_features(inst, features, list);
    struct retrieving r = {in, in_len};
    struct ward_call c = ward_call_begin((const void *)(uintptr_t)inst->state->restore);
    c.ints[0] = WARD_ARG(inst->handle);
    c.ints[1] = WARD_ARG(retrieve);
    c.ints[2] = WARD_ARG(&r);
    c.ints[3] = WARD_ARG((uint32_t)(LV2_STATE_IS_POD | LV2_STATE_IS_PORTABLE));
    c.ints[4] = WARD_ARG(offered);
    ward_call_poisoned(&c);
    return (uint32_t)c.ret_int == LV2_STATE_SUCCESS ? 0 : WARD_ADAPTER_E_INSTANCE;
}

/* ---- options:interface ---- */

/* Read `count` options of a get or set request (u32 context, subject, key each, and for a set u32 type, u32 size and
 * the value's bytes) into a NULL-terminated array whose values (for a set) are copied into `*values`; NULL when
 * malformed or out of memory. */
static LV2_Options_Option *read_options(struct reader *r, int with_values, unsigned char **values) {
    uint32_t count = get_u32(r);
    if (r->bad || count > MAX_OPTIONS)
        return NULL;
    LV2_Options_Option *options = calloc((size_t)count + 1, sizeof *options);
    const unsigned char **sent = calloc((size_t)count + 1, sizeof *sent);
    size_t total = 0;
    if (options == NULL || sent == NULL) {
        free(options);
        free(sent);
        return NULL;
    }
    for (uint32_t i = 0; i < count && !r->bad; i++) {
        LV2_Options_Option *o = &options[i];
        o->context = (LV2_Options_Context)get_u32(r);
        o->subject = get_u32(r);
        o->key = get_u32(r);
        if (with_values) {
            o->type = get_u32(r);
            o->size = get_u32(r);
            if (o->size > MAX_OPTION_BYTES)
                r->bad = 1;
            else
                sent[i] = get_bytes(r, o->size);
            total += ((size_t)o->size + 7) & ~(size_t)7;
        }
    }
    *values = r->bad || r->left != 0 ? NULL : malloc(total + 8);
    if (*values == NULL) {
        free(options);
        free(sent);
        return NULL;
    }
    size_t at = 0;
    for (uint32_t i = 0; with_values && i < count; i++) {
        memcpy(*values + at, sent[i], options[i].size);
        options[i].value = *values + at;
        at += ((size_t)options[i].size + 7) & ~(size_t)7;
    }
    free(sent);
    return options;
}

/* options:interface's get on the options `in` asks for (u32 count; u32 context, subject, key each). `out` receives
 * u32 status, u32 count, then per option u32 type, u32 size and the value's bytes (type and size 0: not answered).
 * The bytes written; minus the bytes needed when `cap` is too small; WARD_ADAPTER_E_SYMBOL when the plugin has no
 * get; WARD_ADAPTER_E_LAYOUT for a malformed request or an answer no plugin gives (a value larger than
 * MAX_OPTION_BYTES, or NULL with a size): the class calls that a fault. */
WARD_ADAPTER_EXPORT int64_t ward_lv2_get_options(struct instance *inst, const unsigned char *in, uint64_t in_len,
                                                 unsigned char *out, uint64_t cap) {
    if (inst->options_iface == NULL || inst->options_iface->get == NULL)
        return WARD_ADAPTER_E_SYMBOL;
    struct reader r = {in, in_len, 0};
    unsigned char *values = NULL;
    LV2_Options_Option *options = read_options(&r, 0, &values);
    if (options == NULL)
        return WARD_ADAPTER_E_LAYOUT;
    uint32_t count = 0;
    while (options[count].key != 0 || options[count].value != NULL)
        count++;
    /* The plugin may overwrite the array's keys: what was asked is kept apart. */
    uint32_t status = (uint32_t)WARD_CALL2(inst->options_iface->get, inst->handle, options);
    size_t need = 8;
    int64_t result = 0;
    for (uint32_t i = 0; i < count; i++) {
        const LV2_Options_Option *o = &options[i];
        if (o->size > MAX_OPTION_BYTES || (o->size != 0 && o->value == NULL)) {
            result = WARD_ADAPTER_E_LAYOUT;
            break;
        }
        need += 8 + (o->value != NULL ? o->size : 0);
    }
    if (result == 0 && need > cap)
        result = -(int64_t)need;
    if (result == 0) {
        struct writer w = {out, cap, 0};
        put_u32(&w, status);
        put_u32(&w, count);
        for (uint32_t i = 0; i < count; i++) {
            const LV2_Options_Option *o = &options[i];
            uint32_t size = o->value != NULL ? o->size : 0;
            put_u32(&w, o->value != NULL ? o->type : 0);
            put_u32(&w, size);
            put_bytes(&w, o->value, size);
        }
        result = writer_result(&w);
    }
    free(options);
    free(values);
    return result;
}

/* options:interface's set of the options `in` carries (u32 count; u32 context, subject, key, type, size and the value
 * each): the plugin's status, WARD_ADAPTER_E_SYMBOL when it has no set, WARD_ADAPTER_E_LAYOUT when malformed. */
WARD_ADAPTER_EXPORT int64_t ward_lv2_set_options(struct instance *inst, uint64_t keys, const unsigned char *in,
                                                 uint64_t in_len) {
    (void)keys; /* the class's name for the set of keys, for its shadow log */
    if (inst->options_iface == NULL || inst->options_iface->set == NULL)
        return WARD_ADAPTER_E_SYMBOL;
    struct reader r = {in, in_len, 0};
    unsigned char *values = NULL;
    LV2_Options_Option *options = read_options(&r, 1, &values);
    if (options == NULL)
        return WARD_ADAPTER_E_LAYOUT;
    uint32_t status = (uint32_t)WARD_CALL2(inst->options_iface->set, inst->handle, options);
    free(options);
    free(values);
    return (int64_t)status;
}
