/* ward's LADSPA class adapter: loaded into a domain in place of the plugin library, it opens the library there and
 * turns LADSPA's pointer-rich interface into flat calls: descriptors are serialised, instances are handles, and a
 * block's port buffers travel as two packed buffers (with where each port lies in them, so ports the host ran in
 * place share memory here too), copied into buffers that end at guard pages so an overrunning plugin faults
 * instead of corrupting anything. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

#include "ward_adapter_common.h"
#include "ward_poisoned_call.h"
#include "ward_ladspa_abi.h"

/* More descriptors than any library has; a loop guard against a library that never returns NULL. */
#define MAX_DESCRIPTORS 4096
/* More ports than any plugin has (the class's MAX_PORTS): a descriptor claiming more is described without its
 * ports, and the class refuses the count, instead of the adapter walking a billion ports. */
#define WARD_LADSPA_MAX_PORTS 4096

/* Flags of a described plugin: which optional functions it has. */
#define HAS_ACTIVATE 0x1
#define HAS_DEACTIVATE 0x2
#define HAS_RUN_ADDING 0x4
#define HAS_SET_RUN_ADDING_GAIN 0x8
#define HAS_CLEANUP 0x10
#define HAS_RUN 0x20

/* One opened plugin library. Several may be open in one domain (a group, or the none backend, where every user
 * of this adapter shares it), so nothing about a library is global. */
struct library {
    void *dl;
    LADSPA_Descriptor_Function descriptor_fn;
    unsigned long count;
};

struct instance {
    const LADSPA_Descriptor *desc;
    LADSPA_Handle handle;
    unsigned long port_count;
    struct guarded *buffers; /* one per region of a block (at most one per port) */
    LADSPA_Data **region_at; /* where each region of the current block starts */
    unsigned char *region_audio; /* whether an audio port lies in each region of the current block */
    size_t read_past;        /* bytes of zeros after a copy of an input port */
    LADSPA_Data **connected; /* what each port is connected to now */
    int activate_pending;    /* activated by the host before any port was connected: done at the first block */
};

static const LADSPA_Descriptor *descriptor(const struct library *lib, uint64_t index) {
    if (index >= lib->count)
        return NULL;
    return (const LADSPA_Descriptor *)WARD_CALL1(lib->descriptor_fn, index);
}

/* Open a plugin library; NULL when it cannot be opened or is no LADSPA library, and then `why` (of `why_cap` bytes)
 * holds the reason as a u32-prefixed string. The reason travels with the call, not in a global: hosts of the none
 * backend open libraries from several threads, and an mpk domain has no thread-local storage. */
WARD_ADAPTER_EXPORT struct library *ward_ladspa_open(const char *path, unsigned char *why, uint64_t why_cap) {
    struct writer reason = {why, why_cap, 0};
    /* Hosts of audio plugins link libm, and some plugins rely on it without linking it themselves (ladspa-sdk's
     * filter.so imports cos and sqrtf but needs only libc): give the domain the libm such a host has. (An mpk
     * domain binds libm's functions for the plugin itself and refuses this open, which changes nothing.) */
    (void)dlopen("libm.so.6", RTLD_NOW | RTLD_GLOBAL);
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        const char *e = dlerror();
        put_str(&reason, e != NULL ? e : "dlopen failed");
        return NULL;
    }
    LADSPA_Descriptor_Function fn = (LADSPA_Descriptor_Function)(uintptr_t)dlsym(dl, "ladspa_descriptor");
    if (fn == NULL) {
        put_str(&reason, "it exports no ladspa_descriptor");
        return NULL;
    }
    struct library *lib = calloc(1, sizeof *lib);
    if (lib == NULL) {
        put_str(&reason, "out of memory");
        return NULL;
    }
    lib->dl = dl;
    lib->descriptor_fn = fn;
    while (lib->count < MAX_DESCRIPTORS && WARD_CALL1(fn, lib->count) != 0)
        lib->count++;
    return lib;
}

/* How many plugins the library has. */
WARD_ADAPTER_EXPORT int64_t ward_ladspa_count(const struct library *lib) { return (int64_t)lib->count; }

/* Forget the library (its code stays mapped: a plugin's static destructors are not worth the risk). */
WARD_ADAPTER_EXPORT int64_t ward_ladspa_close(struct library *lib) {
    free(lib);
    return 0;
}

/* Forget the library and unload it, as a host that only lists plugins does (the describer's use: every library a
 * host scans passes through one domain, and none is kept there once described). */
WARD_ADAPTER_EXPORT int64_t ward_ladspa_unload(struct library *lib) {
    void *dl = lib->dl;
    free(lib);
    return dlclose(dl) == 0 ? 0 : -1;
}

/* Serialise plugin `index`: u64 id, i32 properties, u32 port count, u32 flags, label, name, maker, copyright,
 * then per port i32 descriptor, i32 hint, f32 lower, f32 upper, name. */
WARD_ADAPTER_EXPORT int64_t ward_ladspa_describe(const struct library *lib, uint64_t index, unsigned char *out,
                                                 uint64_t cap) {
    const LADSPA_Descriptor *d = descriptor(lib, index);
    if (d == NULL)
        return WARD_ADAPTER_E_INDEX;
    uint32_t flags = (d->activate ? HAS_ACTIVATE : 0) | (d->deactivate ? HAS_DEACTIVATE : 0) |
                     (d->run_adding ? HAS_RUN_ADDING : 0) | (d->set_run_adding_gain ? HAS_SET_RUN_ADDING_GAIN : 0) |
                     (d->cleanup ? HAS_CLEANUP : 0) | (d->run ? HAS_RUN : 0);
    struct writer w = {out, cap, 0};
    put_u64(&w, d->UniqueID);
    put_i32(&w, d->Properties);
    put_u32(&w, d->PortCount > UINT32_MAX ? UINT32_MAX : (uint32_t)d->PortCount);
    put_u32(&w, flags);
    put_str(&w, d->Label);
    put_str(&w, d->Name);
    put_str(&w, d->Maker);
    put_str(&w, d->Copyright);
    if (d->PortCount > WARD_LADSPA_MAX_PORTS)
        return writer_result(&w);
    for (unsigned long p = 0; p < d->PortCount; p++) {
        put_i32(&w, d->PortDescriptors ? d->PortDescriptors[p] : 0);
        const LADSPA_PortRangeHint *h = d->PortRangeHints ? &d->PortRangeHints[p] : NULL;
        put_i32(&w, h ? h->HintDescriptor : 0);
        put_f32(&w, h ? h->LowerBound : 0.0f);
        put_f32(&w, h ? h->UpperBound : 0.0f);
        put_str(&w, d->PortNames ? d->PortNames[p] : NULL);
    }
    return writer_result(&w);
}

static void instance_free(struct instance *inst) {
    if (inst->buffers != NULL)
        for (unsigned long p = 0; p < inst->port_count; p++)
            guarded_free(&inst->buffers[p]);
    free(inst->buffers);
    free(inst->connected);
    free(inst->region_at);
    free(inst->region_audio);
    free(inst);
}

/* Create an instance of plugin `index`; NULL when the plugin refuses. A plugin reading past one of its input ports
 * reads `read_past_kb` KiB of zeros before a guard page (the policy's read_past_input_kb). */
WARD_ADAPTER_EXPORT struct instance *ward_ladspa_instantiate(const struct library *lib, uint64_t index,
                                                            uint64_t sample_rate, uint64_t read_past_kb) {
    const LADSPA_Descriptor *d = descriptor(lib, index);
    if (d == NULL || d->instantiate == NULL)
        return NULL;
    struct instance *inst = calloc(1, sizeof *inst);
    if (inst == NULL)
        return NULL;
    inst->desc = d;
    inst->port_count = d->PortCount;
    inst->read_past = read_past_kb > WARD_READ_PAST_INPUT_MAX / 1024 ? WARD_READ_PAST_INPUT_MAX : (size_t)read_past_kb * 1024;
    inst->buffers = calloc(d->PortCount + 1, sizeof *inst->buffers);
    inst->connected = calloc(d->PortCount + 1, sizeof *inst->connected);
    inst->region_at = calloc(d->PortCount + 1, sizeof *inst->region_at);
    inst->region_audio = calloc(d->PortCount + 1, 1);
    if (inst->buffers == NULL || inst->connected == NULL || inst->region_at == NULL || inst->region_audio == NULL) {
        instance_free(inst);
        return NULL;
    }
    inst->handle = (LADSPA_Handle)WARD_CALL2(d->instantiate, d, sample_rate);
    if (inst->handle == NULL) {
        instance_free(inst);
        return NULL;
    }
    return inst;
}

/* Every port is connected (the instance has run a block). */
static int all_connected(const struct instance *inst) {
    for (unsigned long p = 0; p < inst->port_count; p++)
        if (inst->connected[p] == NULL)
            return 0;
    return 1;
}

/* Activate the instance. Hosts connect every port before they activate, and plugins rely on it (swh's IIR filters
 * read their control ports in activate), but ports are connected here only when a block brings their buffers: an
 * instance whose ports are not connected yet is activated at its first block, after the connections and before
 * the run, which is the order such a host uses, with the control values of that block. */
WARD_ADAPTER_EXPORT int64_t ward_ladspa_activate(struct instance *inst) {
    if (inst->desc->activate == NULL)
        return 0;
    if (!all_connected(inst)) {
        inst->activate_pending = 1;
        return 0;
    }
    WARD_CALL1(inst->desc->activate, inst->handle);
    return 0;
}

WARD_ADAPTER_EXPORT int64_t ward_ladspa_deactivate(struct instance *inst) {
    if (inst->activate_pending) {
        /* Never activated in the plugin: nothing to undo. */
        inst->activate_pending = 0;
        return 0;
    }
    if (inst->desc->deactivate)
        WARD_CALL1(inst->desc->deactivate, inst->handle);
    return 0;
}

WARD_ADAPTER_EXPORT int64_t ward_ladspa_set_run_adding_gain(struct instance *inst, double gain) {
    if (inst->desc->set_run_adding_gain) {
        struct ward_call c = ward_call_begin((const void *)(uintptr_t)inst->desc->set_run_adding_gain);
        c.ints[0] = WARD_ARG(inst->handle);
        c.floats[0] = ward_f32_bits((LADSPA_Data)gain);
        ward_call_poisoned(&c);
    }
    return 0;
}

WARD_ADAPTER_EXPORT int64_t ward_ladspa_cleanup(struct instance *inst) {
    if (inst->desc->cleanup)
        WARD_CALL1(inst->desc->cleanup, inst->handle);
    instance_free(inst);
    return 0;
}

static size_t port_floats(int descriptor, uint64_t samples) {
    return (descriptor & LADSPA_PORT_AUDIO) ? (size_t)samples : 1;
}

/* Where the host's port buffers lie, as the class sends it ahead of a block (`Instance::pack` in ladspa.rs): the host's
 * buffers form regions (buffers that overlap, as an input and an output run in place do, are one region), and each
 * port lies at an offset in one region. Every region travels in `in` after the layout, with what the host's memory
 * holds, except one that holds zeros only (REGION_ZEROS: its copy here is cleared); those that hold an output come
 * back in `out`. The plugin then sees the memory the host gave it: an output that is also its input, and in an
 * output whatever the host's buffer held where the plugin writes nothing. (The outputs' old contents travel in
 * `in`, not in an in-out buffer, so a block kept as history keeps them.) */
#define REGION_RETURNS 0x1 /* it holds an output: it comes back in `out` */
#define REGION_ZEROS 0x2   /* every byte of it is zero: not in `in` */

struct layout {
    uint32_t regions;
    const unsigned char *region_words; /* per region, u32s: floats, then REGION_* flags */
    const unsigned char *port_words;   /* per port, u32s: region, then offset in floats */
    size_t header_bytes;
};

/* The i-th u32 at `at`, wherever the buffer lies (it need not be aligned). */
static uint32_t word(const unsigned char *at, size_t i) {
    uint32_t v;
    memcpy(&v, at + 4 * i, 4);
    return v;
}

static int read_layout(const struct instance *inst, uint64_t samples, const unsigned char *in, uint64_t in_len,
                       uint64_t out_len, struct layout *l) {
    const LADSPA_Descriptor *d = inst->desc;
    uint32_t regions;
    if (in_len < 4)
        return 0;
    memcpy(&regions, in, 4);
    if (regions > inst->port_count)
        return 0;
    size_t header = 4 + (size_t)regions * 8 + (size_t)inst->port_count * 8;
    if (in_len < header)
        return 0;
    l->regions = regions;
    l->region_words = in + 4;
    l->port_words = in + 4 + (size_t)regions * 8;
    l->header_bytes = header;
    uint64_t want_in = header, want_out = 0;
    for (uint32_t r = 0; r < regions; r++) {
        uint64_t bytes = (uint64_t)word(l->region_words, 2 * r) * sizeof(LADSPA_Data);
        uint32_t flags = word(l->region_words, 2 * r + 1);
        if (flags & ~(uint32_t)(REGION_RETURNS | REGION_ZEROS))
            return 0;
        if (!(flags & REGION_ZEROS))
            want_in += bytes;
        if (flags & REGION_RETURNS)
            want_out += bytes;
    }
    if (want_in != in_len || want_out != out_len)
        return 0;
    for (unsigned long p = 0; p < inst->port_count; p++) {
        uint32_t r = word(l->port_words, 2 * p), at = word(l->port_words, 2 * p + 1);
        if (r >= regions || (uint64_t)at + port_floats(d->PortDescriptors[p], samples) > word(l->region_words, 2 * r))
            return 0;
        /* An output lies in a region that comes back. */
        if (!(d->PortDescriptors[p] & LADSPA_PORT_INPUT) && !(word(l->region_words, 2 * r + 1) & REGION_RETURNS))
            return 0;
    }
    return 1;
}

/* Run one block of `samples` samples: `in` holds the layout and every region, `out` receives the regions that hold
 * an output, in region order, as the plugin left them (see `struct layout`). */
static int64_t run_block(struct instance *inst, uint64_t samples, const unsigned char *in, uint64_t in_len,
                         unsigned char *out, uint64_t out_len, int adding) {
    const LADSPA_Descriptor *d = inst->desc;
    struct layout l;
    if (!read_layout(inst, samples, in, in_len, out_len, &l))
        return WARD_ADAPTER_E_LAYOUT;
    if ((adding && d->run_adding == NULL) || (!adding && d->run == NULL))
        return WARD_ADAPTER_E_SYMBOL;

    /* One guarded buffer per region (there are no more regions than ports): audio 16-byte aligned for vector code;
     * a region of one control port ends exactly at its guard (an output) or at the read-only zeros a plugin may read
     * past an input (the instance's read_past), which end at the guard. */
    memset(inst->region_audio, 0, l.regions);
    for (unsigned long p = 0; p < inst->port_count; p++)
        if (d->PortDescriptors[p] & LADSPA_PORT_AUDIO)
            inst->region_audio[word(l.port_words, 2 * p)] = 1;
    size_t at_in = l.header_bytes;
    for (uint32_t r = 0; r < l.regions; r++) {
        size_t bytes = (size_t)word(l.region_words, 2 * r) * sizeof(LADSPA_Data);
        uint32_t flags = word(l.region_words, 2 * r + 1);
        size_t align = inst->region_audio[r] ? 16 : 4;
        struct guarded *g = &inst->buffers[r];
        LADSPA_Data *buf = (flags & REGION_RETURNS) ? guarded_get(g, bytes, align)
                                                    : guarded_get_input(g, bytes, align, inst->read_past);
        if (buf == NULL)
            return WARD_ADAPTER_E_NOMEM;
        if (flags & REGION_ZEROS) {
            memset(buf, 0, bytes);
        } else {
            memcpy(buf, in + at_in, bytes);
            at_in += bytes;
        }
        inst->region_at[r] = buf;
    }
    for (unsigned long p = 0; p < inst->port_count; p++) {
        LADSPA_Data *buf = inst->region_at[word(l.port_words, 2 * p)] + word(l.port_words, 2 * p + 1);
        if (inst->connected[p] != buf) {
            WARD_CALL3(d->connect_port, inst->handle, p, buf);
            inst->connected[p] = buf;
        }
    }
    if (inst->activate_pending) {
        inst->activate_pending = 0;
        WARD_CALL1(d->activate, inst->handle);
    }
    if (adding)
        WARD_CALL2(d->run_adding, inst->handle, samples);
    else
        WARD_CALL2(d->run, inst->handle, samples);

    size_t at_out = 0;
    for (uint32_t r = 0; r < l.regions; r++) {
        if (!(word(l.region_words, 2 * r + 1) & REGION_RETURNS))
            continue;
        size_t bytes = (size_t)word(l.region_words, 2 * r) * sizeof(LADSPA_Data);
        memcpy(out + at_out, inst->region_at[r], bytes);
        at_out += bytes;
    }
    return 0;
}

/* Six arguments each, so that every argument travels in a register. */
WARD_ADAPTER_EXPORT int64_t ward_ladspa_run(struct instance *inst, uint64_t samples, const unsigned char *in,
                                            uint64_t in_len, unsigned char *out, uint64_t out_len) {
    return run_block(inst, samples, in, in_len, out, out_len, 0);
}

WARD_ADAPTER_EXPORT int64_t ward_ladspa_run_adding(struct instance *inst, uint64_t samples, const unsigned char *in,
                                                   uint64_t in_len, unsigned char *out, uint64_t out_len) {
    return run_block(inst, samples, in, in_len, out, out_len, 1);
}
