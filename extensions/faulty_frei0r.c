/*
 * faulty_frei0r.c -- a frei0r filter that fails on command.
 *
 * "faulty_invert" inverts R, G and B (alpha kept) of RGBA8888 frames. Each
 * f0r_update call is counted; the fault fires when "kind" != 0 and the call
 * number equals "frame", or is at least that with "repeat" on, or on every
 * call when "frame" is 0. Except for OVERRUN it fires before any output is
 * written. Same rules as the LADSPA plugins of faulty_ladspa.c.
 *
 * Parameters (plain numbers, not scaled into [0, 1]):
 *   0 kind    F0R_PARAM_DOUBLE  fault kind, rounded to the nearest integer
 *   1 frame   F0R_PARAM_DOUBLE  call that faults, 1-based; 0 = every call
 *   2 repeat  F0R_PARAM_BOOL    fault on every call from "frame" on
 *
 * Fault kinds (numbers as in faulty.c; the kinds faulty.c has but that make
 * no sense here, 2 and 7..11, do nothing):
 *    1 NULL_DEREF     write through a NULL pointer             -> SIGSEGV
 *    3 ABORT          abort()                                  -> SIGABRT
 *    4 EXIT3          exit(3)
 *    5 INFINITE_LOOP  spin forever
 *    6 RECURSION      unbounded recursion                      -> stack overflow
 *   12 DIV_ZERO       integer division by zero                 -> SIGFPE
 *   13 ILLEGAL        __builtin_trap()                         -> SIGILL
 *   20 OVERRUN        write the frame, then 64 KiB past its end
 *                     (SIGSEGV when the frame ends at a guard page)
 *   22 HOST_WRITE     write a byte of the host's PATH back unchanged
 *                     (SIGSEGV in an mpk domain only; harmless elsewhere)
 * Any other kind does nothing.
 *
 * Self-contained (no libm; shared helpers are header-only, in faulty_common.h):
 * each extension is one shared object. Built with -fvisibility=hidden: only the f0r_* entry
 * points are exported.
 */
#include <stddef.h>
#include <stdint.h>

#include "faulty_common.h"

#include "ward_frei0r_abi.h"

#define FAULTY_EXPORT __attribute__((visibility("default")))


enum param {
    PARAM_KIND,
    PARAM_FRAME,
    PARAM_REPEAT,
    PARAM_COUNT,
};

#define OVERRUN_VALUE 0xDEADBEEFu /* easy to spot in a frame that survives */
#define INVERT_MASK 0x00FFFFFFu   /* R, G and B of an RGBA8888 pixel, little-endian */

/* ---- the faults ---------------------------------------------------------- */

/* Writes OVERRUN_BYTES of pixels starting at `end`, one past the frame. */
static void overrun(uint32_t *end) {
    volatile uint32_t *p = end;
    for (size_t i = 0; i < OVERRUN_BYTES / sizeof *p; i++) {
        p[i] = OVERRUN_VALUE;
    }
}

/* ---- parameters ---------------------------------------------------------- */

/* ---- the plugin ------------------------------------------------------------ */

struct instance {
    unsigned int width;
    unsigned int height;
    double params[PARAM_COUNT]; /* as set, so get returns what set stored */
    uint64_t calls;             /* f0r_update calls so far */
};

static const f0r_param_info_t param_info[PARAM_COUNT] = {
    [PARAM_KIND] = {"kind", F0R_PARAM_DOUBLE, "Fault kind number (0 = none)"},
    [PARAM_FRAME] = {"frame", F0R_PARAM_DOUBLE, "Update call that faults, 1-based (0 = every call)"},
    [PARAM_REPEAT] = {"repeat", F0R_PARAM_BOOL, "Fault on every call from frame on"},
};

static const double param_defaults[PARAM_COUNT] = {
    [PARAM_KIND] = 0.0,
    [PARAM_FRAME] = 1.0,
    [PARAM_REPEAT] = 0.0,
};

FAULTY_EXPORT int f0r_init(void) {
    return 1;
}

FAULTY_EXPORT void f0r_deinit(void) {}

FAULTY_EXPORT void f0r_get_plugin_info(f0r_plugin_info_t *info) {
    info->name = "faulty_invert";
    info->author = "ward";
    info->plugin_type = F0R_PLUGIN_TYPE_FILTER;
    info->color_model = F0R_COLOR_MODEL_RGBA8888;
    info->frei0r_version = FREI0R_MAJOR_VERSION;
    info->major_version = 1;
    info->minor_version = 0;
    info->num_params = PARAM_COUNT;
    info->explanation = "Inverts colours; fails on command";
}

FAULTY_EXPORT void f0r_get_param_info(f0r_param_info_t *info, int param_index) {
    if (param_index >= 0 && param_index < PARAM_COUNT) {
        *info = param_info[param_index];
    }
}

FAULTY_EXPORT f0r_instance_t f0r_construct(unsigned int width, unsigned int height) {
    struct instance *inst = calloc(1, sizeof *inst);
    if (inst == NULL) {
        return NULL;
    }
    inst->width = width;
    inst->height = height;
    for (int i = 0; i < PARAM_COUNT; i++) {
        inst->params[i] = param_defaults[i];
    }
    return inst;
}

FAULTY_EXPORT void f0r_destruct(f0r_instance_t instance) {
    free(instance);
}

/* Every parameter (double or bool) is passed as a pointer to a double. */
FAULTY_EXPORT void f0r_set_param_value(f0r_instance_t instance, f0r_param_t param, int param_index) {
    struct instance *inst = instance;
    if (inst != NULL && param != NULL && param_index >= 0 && param_index < PARAM_COUNT) {
        inst->params[param_index] = *(const double *)param;
    }
}

FAULTY_EXPORT void f0r_get_param_value(f0r_instance_t instance, f0r_param_t param, int param_index) {
    struct instance *inst = instance;
    if (inst != NULL && param != NULL && param_index >= 0 && param_index < PARAM_COUNT) {
        *(double *)param = inst->params[param_index];
    }
}

FAULTY_EXPORT void f0r_update(f0r_instance_t instance, double time, const uint32_t *inframe, uint32_t *outframe) {
    (void)time;
    struct instance *inst = instance;
    inst->calls++;
    long kind = to_kind(inst->params[PARAM_KIND]);
    uint64_t at = to_count(inst->params[PARAM_FRAME]);
    int repeat = inst->params[PARAM_REPEAT] >= 0.5;
    int due = fault_due(kind, inst->calls, at, repeat);
    if (due) {
        crash(kind);
    }

    size_t pixels = (size_t)inst->width * inst->height;
    for (size_t i = 0; i < pixels; i++) {
        outframe[i] = inframe[i] ^ INVERT_MASK;
    }
    if (due && kind == FAULT_OVERRUN) {
        overrun(outframe + pixels);
    }
}

FAULTY_EXPORT void f0r_update2(f0r_instance_t instance, double time, const uint32_t *inframe1,
                               const uint32_t *inframe2, const uint32_t *inframe3, uint32_t *outframe) {
    (void)inframe2;
    (void)inframe3;
    f0r_update(instance, time, inframe1, outframe);
}
