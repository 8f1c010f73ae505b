/*
 * crash_once_ladspa.c -- a LADSPA library that is another one, except that it crashes once, mid-stream.
 *
 * It offers every plugin of the library WARD_CRASH_ONCE_LADSPA names (a path) with the same descriptor (label,
 * ports, hints), forwarding every call, and dereferences NULL at the block (run or run_adding call, counted over
 * every instance of the process) WARD_CRASH_ONCE_AT_BLOCK says (default 10). It stands for a build with a fault
 * that the good file does not have: under ward, with the good file as the policy's `restart_from`, the fault
 * strikes once, and a restart replays the wrapped plugin's history into the good file (the acceptance test of
 * history in crates/ward-cli/tests/run.rs runs Debian's reverbs and delays so).
 *
 * Built with -fvisibility=hidden: only ladspa_descriptor is exported.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#include "ward_ladspa_abi.h"

#define CRASH_ONCE_EXPORT __attribute__((visibility("default")))

/* More plugins than any one library of Debian's has. */
#define MAX_PLUGINS 64
#define DEFAULT_CRASH_AT 10

struct instance {
    const LADSPA_Descriptor *inner;
    LADSPA_Handle handle;
};

static LADSPA_Descriptor outer[MAX_PLUGINS];
static const LADSPA_Descriptor *inner[MAX_PLUGINS];
static uint64_t blocks;

/* The wrapped library's descriptor function, opened on first use; NULL when it cannot be. */
static LADSPA_Descriptor_Function wrapped(void) {
    static LADSPA_Descriptor_Function function;
    static int tried;
    if (!tried) {
        tried = 1;
        const char *path = getenv("WARD_CRASH_ONCE_LADSPA");
        void *library = path != NULL ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
        if (library != NULL) {
            function = (LADSPA_Descriptor_Function)dlsym(library, "ladspa_descriptor");
        }
    }
    return function;
}

static void count_block(void) {
    const char *at = getenv("WARD_CRASH_ONCE_AT_BLOCK");
    uint64_t crash_at = at != NULL ? strtoull(at, NULL, 10) : DEFAULT_CRASH_AT;
    if (++blocks == crash_at) {
        *(volatile int *)NULL = 0;
    }
}

static LADSPA_Handle instantiate(const LADSPA_Descriptor *descriptor, unsigned long sample_rate) {
    const LADSPA_Descriptor *of = inner[descriptor - outer];
    struct instance *inst = calloc(1, sizeof *inst);
    if (inst == NULL) {
        return NULL;
    }
    inst->inner = of;
    inst->handle = of->instantiate(of, sample_rate);
    if (inst->handle == NULL) {
        free(inst);
        return NULL;
    }
    return inst;
}

static void connect_port(LADSPA_Handle handle, unsigned long port, LADSPA_Data *location) {
    struct instance *inst = handle;
    inst->inner->connect_port(inst->handle, port, location);
}

static void activate(LADSPA_Handle handle) {
    struct instance *inst = handle;
    if (inst->inner->activate != NULL) {
        inst->inner->activate(inst->handle);
    }
}

static void run(LADSPA_Handle handle, unsigned long sample_count) {
    struct instance *inst = handle;
    count_block();
    inst->inner->run(inst->handle, sample_count);
}

static void run_adding(LADSPA_Handle handle, unsigned long sample_count) {
    struct instance *inst = handle;
    count_block();
    inst->inner->run_adding(inst->handle, sample_count);
}

static void set_run_adding_gain(LADSPA_Handle handle, LADSPA_Data gain) {
    struct instance *inst = handle;
    inst->inner->set_run_adding_gain(inst->handle, gain);
}

static void deactivate(LADSPA_Handle handle) {
    struct instance *inst = handle;
    if (inst->inner->deactivate != NULL) {
        inst->inner->deactivate(inst->handle);
    }
}

static void cleanup(LADSPA_Handle handle) {
    struct instance *inst = handle;
    inst->inner->cleanup(inst->handle);
    free(inst);
}

CRASH_ONCE_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    LADSPA_Descriptor_Function function = wrapped();
    if (function == NULL || index >= MAX_PLUGINS) {
        return NULL;
    }
    if (inner[index] == NULL) {
        const LADSPA_Descriptor *of = function(index);
        if (of == NULL) {
            return NULL;
        }
        inner[index] = of;
        outer[index] = *of;
        outer[index].instantiate = instantiate;
        outer[index].connect_port = connect_port;
        outer[index].activate = activate;
        outer[index].run = run;
        outer[index].run_adding = of->run_adding != NULL ? run_adding : NULL;
        outer[index].set_run_adding_gain = of->set_run_adding_gain != NULL ? set_run_adding_gain : NULL;
        outer[index].deactivate = deactivate;
        outer[index].cleanup = cleanup;
    }
    return &outer[index];
}
