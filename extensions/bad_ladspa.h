/*
 * bad_ladspa.h -- the one well-formed plugin every bad_ladspa_*.c starts from.
 *
 * "bad" (unique ID 4950100) is a mono pass-through: one audio input, one audio
 * output. Each bad_ladspa_*.c file includes this header once and breaks one
 * thing about it (its constructor, or the descriptor ladspa_descriptor hands
 * out), so a host that loads it natively crashes or hangs, and ward must refuse
 * it instead of loading it without ward. Built with -fvisibility=hidden: only
 * what a file marks BAD_EXPORT (ladspa_descriptor) is exported.
 */
#ifndef BAD_LADSPA_H
#define BAD_LADSPA_H

#include <stdlib.h>
#include <string.h>

#include "ward_ladspa_abi.h"

#define BAD_EXPORT __attribute__((visibility("default")))

struct bad_instance {
    LADSPA_Data *ports[2];
};

static LADSPA_Handle bad_instantiate(const LADSPA_Descriptor *descriptor, unsigned long sample_rate) {
    (void)descriptor;
    (void)sample_rate;
    return calloc(1, sizeof(struct bad_instance));
}

static void bad_connect_port(LADSPA_Handle handle, unsigned long port, LADSPA_Data *location) {
    if (port < 2)
        ((struct bad_instance *)handle)->ports[port] = location;
}

/* Copies the input to the output. */
static void bad_run(LADSPA_Handle handle, unsigned long samples) {
    struct bad_instance *inst = handle;
    memmove(inst->ports[1], inst->ports[0], samples * sizeof(LADSPA_Data));
}

static void bad_cleanup(LADSPA_Handle handle) { free(handle); }

static const LADSPA_PortDescriptor bad_port_descriptors[2] = {
    LADSPA_PORT_INPUT | LADSPA_PORT_AUDIO,
    LADSPA_PORT_OUTPUT | LADSPA_PORT_AUDIO,
};
static const char *const bad_port_names[2] = {"Input", "Output"};
static const LADSPA_PortRangeHint bad_hints[2] = {{0, 0.0f, 0.0f}, {0, 0.0f, 0.0f}};

/* Not const: the files that break the descriptor change one field of it. */
static LADSPA_Descriptor bad_descriptor = {
    .UniqueID = 4950100,
    .Label = "bad",
    .Properties = 0,
    .Name = "Bad pass-through",
    .Maker = "ward",
    .Copyright = "MIT OR Apache-2.0",
    .PortCount = 2,
    .PortDescriptors = bad_port_descriptors,
    .PortNames = bad_port_names,
    .PortRangeHints = bad_hints,
    .instantiate = bad_instantiate,
    .connect_port = bad_connect_port,
    .run = bad_run,
    .cleanup = bad_cleanup,
};

#endif
