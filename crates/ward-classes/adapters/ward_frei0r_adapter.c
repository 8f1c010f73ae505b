/* ward's frei0r class adapter: loaded into a domain in place of the plugin library, it opens the plugin there and
 * turns frei0r's interface into flat calls of scalars, handles and byte buffers, at most six integer arguments each
 * (a frame's time is a double and travels in a floating-point register):
 *
 *   ward_frei0r_open(path, why, why_cap)                    -> library handle, NULL when no frei0r plugin (and
 *                                                              `why` holds the reason, a u32-prefixed string)
 *   ward_frei0r_describe(lib, out, cap)                     -> the plugin's info and parameter infos, serialised
 *   ward_frei0r_construct(lib, width, height, flags)        -> instance handle, NULL when the plugin refuses
 *                                                              (flags: the two below, and from bit 8 up the KiB a
 *                                                              plugin may read past an input, reading zeros)
 *   ward_frei0r_destruct(inst)
 *   ward_frei0r_set_param(inst, index, value, len)          value encoded by the parameter's type (see below)
 *   ward_frei0r_get_param(inst, index, out, cap)            encoded likewise
 *   ward_frei0r_update(inst, time, in, in_len, out, out_len)
 *   ward_frei0r_update2(inst, time, in1, rest, rest_len, out, out_len)
 *
 * A parameter value is encoded as bool and double: one f64; color: three f32 (r, g, b); position: two f64 (x, y);
 * string: its bytes and a terminating NUL. Everything is little-endian (ward runs on x86-64 only).
 *
 * Frames are width * height 32-bit pixels, and the plugin only ever sees frames of the adapter's own, each ending at
 * a PROT_NONE guard page and starting 16-byte aligned (plugins use aligned vector loads):
 *
 * - The output frame: a plugin writing past it faults (and is recovered) instead of corrupting what follows. The
 *   adapter copies it to the caller's buffer after the update. A host whose output buffers are guarded like that
 *   already (a process domain's output pool: every buffer ends at a guard page, 16-byte aligned when its length is
 *   a multiple of 16; or a host frame lent in place, whose last page past the frame is a private copy before a
 *   guard page) says so when it constructs the instance (WARD_FREI0R_DIRECT_OUTPUT); then a caller's buffer that
 *   starts aligned is handed to the plugin as it is, which saves copying every frame once more.
 * - The input frames, copied in before the update. Passing the caller's buffers as they are would save a copy, but
 *   real plugins write into their input frames despite the const (Debian's cairogradient premultiplies its input in
 *   place): in a process domain, where the inputs lie in ward's read-only input pool, every frame of theirs would
 *   fault, and in isolation `none` they would scribble on the host's own frame. The copies are writable and
 *   private to the instance; reading a little past one reads zeros (as many KiB as the construct flags say, the
 *   policy's read_past_input_kb: natively a plugin reads whatever follows the host's frame, and UV Map reads up to
 *   a row and a pixel past its second frame), writing past one or reading further faults at its guard page. A host that sends the first input frame
 *   as a private, writable buffer ending at a guard page already (a process domain's scratch buffer) says so when
 *   it constructs the instance (WARD_FREI0R_PRIVATE_INPUT), and that frame is handed over as it is. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include "ward_adapter_common.h"
#include "ward_frei0r_abi.h"
#include "ward_poisoned_call.h"

/* More parameters than any plugin has; a plugin claiming more is refused by the host. */
#define MAX_PARAMS 1024
/* Longest parameter string read back from a plugin. */
#define MAX_STRING 65536
/* Alignment of the frames the plugin sees. */
#define FRAME_ALIGN 16

/* Flags of ward_frei0r_construct: the `out` buffers of this instance's updates end at a guard page. */
#define WARD_FREI0R_DIRECT_OUTPUT 0x1
/* ... and the first input frame is a private, writable copy ending at a guard page (a process domain's scratch
 * buffer), so the plugin may have it as it is. */
#define WARD_FREI0R_PRIVATE_INPUT 0x2
/* ... and bits 8 up: the KiB of zeros after a copy of an input frame. */
#define WARD_FREI0R_READ_PAST_SHIFT 8

/* Which optional functions the plugin has (the describe flags). */
#define HAS_UPDATE 0x1
#define HAS_UPDATE2 0x2

typedef int (*f0r_init_fn)(void);
typedef void (*f0r_deinit_fn)(void);
typedef void (*f0r_get_plugin_info_fn)(f0r_plugin_info_t *);
typedef void (*f0r_get_param_info_fn)(f0r_param_info_t *, int);
typedef f0r_instance_t (*f0r_construct_fn)(unsigned int, unsigned int);
typedef void (*f0r_destruct_fn)(f0r_instance_t);
typedef void (*f0r_param_fn)(f0r_instance_t, f0r_param_t, int);
typedef void (*f0r_update_fn)(f0r_instance_t, double, const uint32_t *, uint32_t *);
typedef void (*f0r_update2_fn)(f0r_instance_t, double, const uint32_t *, const uint32_t *, const uint32_t *,
                               uint32_t *);

/* One opened plugin library. A process opens a plugin once: f0r_init runs once per loaded library as frei0r
 * requires, even when several hosts of the none backend (which share this adapter) open the same plugin; they then
 * share the library, which nothing changes after it is opened. Libraries are never closed: a plugin's code stays
 * mapped for the life of the domain (its deinit and static destructors are not worth the risk). */
struct library {
    struct library *next;
    void *dl;
    f0r_get_plugin_info_fn get_plugin_info;
    f0r_get_param_info_fn get_param_info;
    f0r_construct_fn construct;
    f0r_destruct_fn destruct;
    f0r_param_fn set_param_value;
    f0r_param_fn get_param_value;
    f0r_update_fn update;
    f0r_update2_fn update2;
    f0r_plugin_info_t info;
    int param_count;  /* info.num_params when sane, else 0 */
    int *param_types; /* the type of each parameter */
};

struct instance {
    const struct library *lib;
    f0r_instance_t handle;
    unsigned int width;
    unsigned int height;
    size_t frame_bytes;
    int direct_output;       /* WARD_FREI0R_DIRECT_OUTPUT was given */
    int private_input;       /* WARD_FREI0R_PRIVATE_INPUT was given */
    size_t read_past;        /* bytes of zeros after a copy of an input frame */
    struct guarded out;      /* the output frame the plugin writes */
    struct guarded in[3];    /* copies of the input frames */
    struct guarded param;    /* a parameter value, exactly as large as its type */
    char **strings;          /* per parameter: the last string set, alive as long as the instance */
};

static pthread_mutex_t libraries_lock = PTHREAD_MUTEX_INITIALIZER;
static struct library *libraries;

static int known_type(int type) {
    return type == F0R_PARAM_BOOL || type == F0R_PARAM_DOUBLE || type == F0R_PARAM_COLOR ||
           type == F0R_PARAM_POSITION || type == F0R_PARAM_STRING;
}

static int needs_update2(int plugin_type) {
    return plugin_type == F0R_PLUGIN_TYPE_MIXER2 || plugin_type == F0R_PLUGIN_TYPE_MIXER3;
}

/* Look up every entry point; a reason string when a required one is missing. */
static const char *bind(struct library *lib) {
    void *dl = lib->dl;
    f0r_init_fn init = (f0r_init_fn)(uintptr_t)dlsym(dl, "f0r_init");
    lib->get_plugin_info = (f0r_get_plugin_info_fn)(uintptr_t)dlsym(dl, "f0r_get_plugin_info");
    lib->get_param_info = (f0r_get_param_info_fn)(uintptr_t)dlsym(dl, "f0r_get_param_info");
    lib->construct = (f0r_construct_fn)(uintptr_t)dlsym(dl, "f0r_construct");
    lib->destruct = (f0r_destruct_fn)(uintptr_t)dlsym(dl, "f0r_destruct");
    lib->set_param_value = (f0r_param_fn)(uintptr_t)dlsym(dl, "f0r_set_param_value");
    lib->get_param_value = (f0r_param_fn)(uintptr_t)dlsym(dl, "f0r_get_param_value");
    lib->update = (f0r_update_fn)(uintptr_t)dlsym(dl, "f0r_update");
    lib->update2 = (f0r_update2_fn)(uintptr_t)dlsym(dl, "f0r_update2");
    if (lib->get_plugin_info == NULL)
        return "it exports no f0r_get_plugin_info";
    if (init == NULL)
        return "it exports no f0r_init";
    if (lib->construct == NULL || lib->destruct == NULL)
        return "it exports no f0r_construct or f0r_destruct";
    if ((int)WARD_CALL0(init) == 0)
        return "its f0r_init failed";
    WARD_CALL1(lib->get_plugin_info, &lib->info);
    int n = lib->info.num_params;
    lib->param_count = n > 0 && n <= MAX_PARAMS ? n : 0;
    if (lib->param_count > 0) {
        if (lib->get_param_info == NULL || lib->set_param_value == NULL || lib->get_param_value == NULL)
            return "it has parameters but exports no f0r_get_param_info, f0r_set_param_value or f0r_get_param_value";
        lib->param_types = calloc((size_t)lib->param_count, sizeof *lib->param_types);
        if (lib->param_types == NULL)
            return "out of memory";
        for (int p = 0; p < lib->param_count; p++) {
            f0r_param_info_t pi = {NULL, -1, NULL};
            WARD_CALL2(lib->get_param_info, &pi, p);
            lib->param_types[p] = pi.type;
        }
    }
    if (needs_update2(lib->info.plugin_type) && lib->update2 == NULL)
        return "it is a mixer but exports no f0r_update2";
    if (!needs_update2(lib->info.plugin_type) && lib->update == NULL)
        return "it exports no f0r_update";
    return NULL;
}

/* Open a plugin library; NULL when it cannot be opened or is no frei0r plugin, and then `why` (of `why_cap` bytes)
 * holds the reason as a u32-prefixed string. The reason travels with the call, not in a global: hosts of the none
 * backend open libraries from several threads, and an mpk domain has no thread-local storage. */
WARD_ADAPTER_EXPORT struct library *ward_frei0r_open(const char *path, unsigned char *why, uint64_t why_cap) {
    struct writer reason = {why, why_cap, 0};
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        const char *e = dlerror();
        put_str(&reason, e != NULL ? e : "dlopen failed");
        return NULL;
    }
    pthread_mutex_lock(&libraries_lock);
    struct library *lib;
    for (lib = libraries; lib != NULL; lib = lib->next)
        if (lib->dl == dl)
            break;
    if (lib != NULL) {
        /* Already open (and initialised) in this process: drop the extra reference dlopen took. */
        dlclose(dl);
        pthread_mutex_unlock(&libraries_lock);
        return lib;
    }
    lib = calloc(1, sizeof *lib);
    if (lib == NULL) {
        pthread_mutex_unlock(&libraries_lock);
        put_str(&reason, "out of memory");
        return NULL;
    }
    lib->dl = dl;
    const char *missing = bind(lib);
    if (missing != NULL) {
        pthread_mutex_unlock(&libraries_lock);
        put_str(&reason, missing);
        free(lib->param_types);
        free(lib);
        /* The library stays loaded: if its f0r_init ran, unloading it now is as risky as at exit. */
        return NULL;
    }
    lib->next = libraries;
    libraries = lib;
    pthread_mutex_unlock(&libraries_lock);
    return lib;
}

/* Serialise the plugin: name, author, i32 plugin type, i32 color model, i32 frei0r version, i32 major version,
 * i32 minor version, i32 parameter count as the plugin claims it, u32 flags (HAS_*), explanation; then per
 * parameter (none when the claimed count is absurd) name, i32 type, explanation. */
WARD_ADAPTER_EXPORT int64_t ward_frei0r_describe(const struct library *lib, unsigned char *out, uint64_t cap) {
    if (lib == NULL)
        return WARD_ADAPTER_E_NOTOPEN;
    const f0r_plugin_info_t *i = &lib->info;
    uint32_t flags = (lib->update ? HAS_UPDATE : 0) | (lib->update2 ? HAS_UPDATE2 : 0);
    struct writer w = {out, cap, 0};
    put_str(&w, i->name);
    put_str(&w, i->author);
    put_i32(&w, i->plugin_type);
    put_i32(&w, i->color_model);
    put_i32(&w, i->frei0r_version);
    put_i32(&w, i->major_version);
    put_i32(&w, i->minor_version);
    put_i32(&w, i->num_params);
    put_u32(&w, flags);
    put_str(&w, i->explanation);
    for (int p = 0; p < lib->param_count; p++) {
        f0r_param_info_t pi = {NULL, -1, NULL};
        WARD_CALL2(lib->get_param_info, &pi, p);
        put_str(&w, pi.name);
        put_i32(&w, pi.type);
        put_str(&w, pi.explanation);
    }
    return writer_result(&w);
}

/* Forget the library and unload it, as a host that only lists plugins does (the describer's use: every plugin a host
 * scans passes through one domain, and none is kept there once described): f0r_deinit, then dlclose. Only for a
 * library no instance was constructed from. */
WARD_ADAPTER_EXPORT int64_t ward_frei0r_unload(struct library *lib) {
    pthread_mutex_lock(&libraries_lock);
    for (struct library **at = &libraries; *at != NULL; at = &(*at)->next)
        if (*at == lib) {
            *at = lib->next;
            break;
        }
    pthread_mutex_unlock(&libraries_lock);
    void *dl = lib->dl;
    f0r_deinit_fn deinit = (f0r_deinit_fn)(uintptr_t)dlsym(dl, "f0r_deinit");
    if (deinit != NULL)
        WARD_CALL0(deinit);
    free(lib->param_types);
    free(lib);
    return dlclose(dl) == 0 ? 0 : -1;
}

static void instance_free(struct instance *inst) {
    guarded_free(&inst->out);
    for (int k = 0; k < 3; k++)
        guarded_free(&inst->in[k]);
    guarded_free(&inst->param);
    if (inst->strings != NULL)
        for (int p = 0; p < inst->lib->param_count; p++)
            free(inst->strings[p]);
    free(inst->strings);
    free(inst);
}

/* Create an instance for frames of width x height pixels; NULL when the size is impossible or the plugin
 * refuses. `flags`: WARD_FREI0R_DIRECT_OUTPUT and WARD_FREI0R_PRIVATE_INPUT, or 0, and the KiB a plugin may read
 * past a copy of an input frame shifted by WARD_FREI0R_READ_PAST_SHIFT. */
WARD_ADAPTER_EXPORT struct instance *ward_frei0r_construct(const struct library *lib, uint64_t width,
                                                           uint64_t height, uint64_t flags) {
    if (lib == NULL || width == 0 || height == 0 || width > UINT_MAX || height > UINT_MAX ||
        width > SIZE_MAX / 4 / height)
        return NULL;
    struct instance *inst = calloc(1, sizeof *inst);
    if (inst == NULL)
        return NULL;
    inst->lib = lib;
    inst->width = (unsigned int)width;
    inst->height = (unsigned int)height;
    inst->frame_bytes = (size_t)width * (size_t)height * 4;
    inst->direct_output = (flags & WARD_FREI0R_DIRECT_OUTPUT) != 0;
    inst->private_input = (flags & WARD_FREI0R_PRIVATE_INPUT) != 0;
    uint64_t read_past_kb = flags >> WARD_FREI0R_READ_PAST_SHIFT;
    inst->read_past = read_past_kb > WARD_READ_PAST_INPUT_MAX / 1024 ? WARD_READ_PAST_INPUT_MAX : (size_t)read_past_kb * 1024;
    inst->strings = calloc((size_t)lib->param_count + 1, sizeof *inst->strings);
    if (inst->strings == NULL) {
        instance_free(inst);
        return NULL;
    }
    inst->handle = (f0r_instance_t)WARD_CALL2(lib->construct, inst->width, inst->height);
    if (inst->handle == NULL) {
        instance_free(inst);
        return NULL;
    }
    return inst;
}

WARD_ADAPTER_EXPORT int64_t ward_frei0r_destruct(struct instance *inst) {
    WARD_CALL1(inst->lib->destruct, inst->handle);
    instance_free(inst);
    return 0;
}

/* Bytes of a parameter's encoding; 0 for a string (any length) or an unknown type. */
static size_t value_size(int type) {
    switch (type) {
    case F0R_PARAM_BOOL:
    case F0R_PARAM_DOUBLE:
        return sizeof(double);
    case F0R_PARAM_COLOR:
        return sizeof(f0r_param_color_t);
    case F0R_PARAM_POSITION:
        return sizeof(f0r_param_position_t);
    default:
        return 0;
    }
}

/* Set parameter `index` from its encoding. The plugin reads the value from a buffer exactly as large as the type,
 * ending at a guard page, so a plugin reading the wrong type faults rather than reading garbage. */
WARD_ADAPTER_EXPORT int64_t ward_frei0r_set_param(struct instance *inst, uint64_t index, const unsigned char *value,
                                                  uint64_t len) {
    const struct library *lib = inst->lib;
    if (index >= (uint64_t)lib->param_count)
        return WARD_ADAPTER_E_INDEX;
    int type = lib->param_types[index];
    if (!known_type(type))
        return WARD_ADAPTER_E_LAYOUT;
    if (type == F0R_PARAM_STRING) {
        if (len == 0 || value[len - 1] != '\0')
            return WARD_ADAPTER_E_LAYOUT;
        char *copy = malloc(len);
        char **slot = guarded_get(&inst->param, sizeof(char *), sizeof(char *));
        if (copy == NULL || slot == NULL) {
            free(copy);
            return WARD_ADAPTER_E_NOMEM;
        }
        memcpy(copy, value, len);
        *slot = copy;
        WARD_CALL3(lib->set_param_value, inst->handle, slot, (int)index);
        /* The previous string may have been in use until now; this one stays until it is replaced. */
        free(inst->strings[index]);
        inst->strings[index] = copy;
        return 0;
    }
    size_t size = value_size(type);
    if (len != size)
        return WARD_ADAPTER_E_LAYOUT;
    void *p = guarded_get(&inst->param, size, type == F0R_PARAM_COLOR ? sizeof(float) : sizeof(double));
    if (p == NULL)
        return WARD_ADAPTER_E_NOMEM;
    memcpy(p, value, size);
    WARD_CALL3(lib->set_param_value, inst->handle, p, (int)index);
    return 0;
}

/* Encode parameter `index` into `out`: bytes written, or minus the bytes needed when `cap` is too small. */
WARD_ADAPTER_EXPORT int64_t ward_frei0r_get_param(struct instance *inst, uint64_t index, unsigned char *out,
                                                  uint64_t cap) {
    const struct library *lib = inst->lib;
    if (index >= (uint64_t)lib->param_count)
        return WARD_ADAPTER_E_INDEX;
    int type = lib->param_types[index];
    if (!known_type(type))
        return WARD_ADAPTER_E_LAYOUT;
    struct writer w = {out, cap, 0};
    if (type == F0R_PARAM_STRING) {
        char **slot = guarded_get(&inst->param, sizeof(char *), sizeof(char *));
        if (slot == NULL)
            return WARD_ADAPTER_E_NOMEM;
        *slot = NULL;
        WARD_CALL3(lib->get_param_value, inst->handle, slot, (int)index);
        const char *s = *slot;
        if (s != NULL)
            put_bytes(&w, s, strnlen(s, MAX_STRING));
        put_bytes(&w, "", 1);
        return writer_result(&w);
    }
    size_t size = value_size(type);
    unsigned char *p = guarded_get(&inst->param, size, type == F0R_PARAM_COLOR ? sizeof(float) : sizeof(double));
    if (p == NULL)
        return WARD_ADAPTER_E_NOMEM;
    memset(p, 0, size);
    WARD_CALL3(lib->get_param_value, inst->handle, p, (int)index);
    put_bytes(&w, p, size);
    return writer_result(&w);
}

/* Whether `buf`, one frame long, starts aligned for the plugin and ends at a page boundary (so at the guard page of
 * a host buffer that has one). */
/* Whether a caller's frame the host vouched for may go to the plugin as it is. The host's flag covers what lies past
 * the frame: a guard page right after it (a pool buffer), or a private copy of the rest of its last page and then a
 * guard page (a host frame lent in place from its arena); either way a write past the end never reaches anything of
 * the host's. What is left to check here is the alignment plugins' vector code needs. */
static int fits_guard(const unsigned char *buf) {
    return ((uintptr_t)buf & (FRAME_ALIGN - 1)) == 0;
}

/* Input frame `k` as the plugin gets it: a private, writable copy followed by the instance's read_past bytes of
 * read-only zeros and a guard page (the caller's own first frame when the host said it is a private copy ending at a
 * guard page); NULL when out of memory. */
static const uint32_t *input_frame(struct instance *inst, int k, const unsigned char *frame) {
    if (k == 0 && inst->private_input && fits_guard(frame))
        return (const uint32_t *)(const void *)frame;
    uint32_t *copy = guarded_get_input(&inst->in[k], inst->frame_bytes, FRAME_ALIGN, inst->read_past);
    if (copy != NULL)
        memcpy(copy, frame, inst->frame_bytes);
    return copy;
}

/* The frame the plugin writes: the caller's `out` itself when the host said its buffers end at a guard page and
 * this one is aligned and ends at a page boundary, else the adapter's own, ending at a guard page (exactly, when
 * the frame is a multiple of 16 bytes). Either way the plugin finds in it what the host's output frame holds
 * (`out` comes in as well as out): some plugins read their output frame (an echo reading the frame it wrote last
 * time, say) or leave pixels unwritten, and they must see exactly what they would natively. NULL when out of
 * memory. */
static uint32_t *output_frame(struct instance *inst, unsigned char *out) {
    if (inst->direct_output && fits_guard(out))
        return (uint32_t *)(void *)out;
    uint32_t *frame = guarded_get(&inst->out, inst->frame_bytes, FRAME_ALIGN);
    if (frame != NULL)
        memcpy(frame, out, inst->frame_bytes);
    return frame;
}

/* After the update: the frame into the caller's buffer, unless the plugin wrote it there. */
static void deliver(const struct instance *inst, unsigned char *out, const uint32_t *frame) {
    if ((const void *)frame != (const void *)out)
        memcpy(out, frame, inst->frame_bytes);
}

/* f0r_update(instance, time, in, out) and f0r_update2(instance, time, in1, in2, in3, out), through the poisoned
 * call. */
static void call_update(const struct library *lib, f0r_instance_t handle, double time, const uint32_t *in,
                        uint32_t *out) {
    struct ward_call c = ward_call_begin((const void *)(uintptr_t)lib->update);
    c.ints[0] = WARD_ARG(handle);
    c.ints[1] = WARD_ARG(in);
    c.ints[2] = WARD_ARG(out);
    c.floats[0] = ward_f64_bits(time);
    ward_call_poisoned(&c);
}

static void call_update2(const struct library *lib, f0r_instance_t handle, double time, const uint32_t *const in[3],
                         uint32_t *out) {
    struct ward_call c = ward_call_begin((const void *)(uintptr_t)lib->update2);
    c.ints[0] = WARD_ARG(handle);
    for (int k = 0; k < 3; k++)
        c.ints[1 + k] = WARD_ARG(in[k]);
    c.ints[4] = WARD_ARG(out);
    c.floats[0] = ward_f64_bits(time);
    ward_call_poisoned(&c);
}

/* One frame through f0r_update. `in` holds one frame (in_len 0 and no input for a source); `out` receives one. */
WARD_ADAPTER_EXPORT int64_t ward_frei0r_update(struct instance *inst, double time, const unsigned char *in,
                                               uint64_t in_len, unsigned char *out, uint64_t out_len) {
    const struct library *lib = inst->lib;
    if (out_len != inst->frame_bytes || (in_len != 0 && in_len != inst->frame_bytes))
        return WARD_ADAPTER_E_LAYOUT;
    if (lib->update == NULL)
        return WARD_ADAPTER_E_SYMBOL;
    const uint32_t *frame_in = NULL;
    if (in_len != 0 && (frame_in = input_frame(inst, 0, in)) == NULL)
        return WARD_ADAPTER_E_NOMEM;
    uint32_t *frame_out = output_frame(inst, out);
    if (frame_out == NULL)
        return WARD_ADAPTER_E_NOMEM;
    call_update(lib, inst->handle, time, frame_in, frame_out);
    deliver(inst, out, frame_out);
    return 0;
}

/* One frame through f0r_update2 (or f0r_update, for a plugin without update2 given at most one input). `in1` is the
 * first input frame or NULL; `rest` holds the further inputs back to back: none, the second, or the second and the
 * third (rest_len 0, one frame or two). Seven arguments, six of them integers: every one travels in a register.
 * in1 is one frame long: the host checks it, as its length has no register left. */
WARD_ADAPTER_EXPORT int64_t ward_frei0r_update2(struct instance *inst, double time, const unsigned char *in1,
                                                const unsigned char *rest, uint64_t rest_len, unsigned char *out,
                                                uint64_t out_len) {
    const struct library *lib = inst->lib;
    size_t frame = inst->frame_bytes;
    if (out_len != frame || (rest_len != 0 && rest_len != frame && rest_len != 2 * (uint64_t)frame))
        return WARD_ADAPTER_E_LAYOUT;
    if (rest_len != 0 && in1 == NULL)
        return WARD_ADAPTER_E_LAYOUT;
    const uint32_t *frames[3] = {NULL, NULL, NULL};
    const unsigned char *given[3] = {in1, rest_len >= frame ? rest : NULL,
                                     rest_len == 2 * (uint64_t)frame ? rest + frame : NULL};
    for (int k = 0; k < 3; k++)
        if (given[k] != NULL && (frames[k] = input_frame(inst, k, given[k])) == NULL)
            return WARD_ADAPTER_E_NOMEM;
    uint32_t *frame_out = output_frame(inst, out);
    if (frame_out == NULL)
        return WARD_ADAPTER_E_NOMEM;
    if (lib->update2 != NULL)
        call_update2(lib, inst->handle, time, frames, frame_out);
    else if (lib->update != NULL && rest_len == 0)
        call_update(lib, inst->handle, time, frames[0], frame_out);
    else
        return WARD_ADAPTER_E_SYMBOL;
    deliver(inst, out, frame_out);
    return 0;
}
