/*
 * lv2_counter.c -- urn:ward:lv2:counter, a stateful LV2 plugin without state:interface (bundle:
 * extensions/lv2/lv2_counter.lv2).
 *
 * Ports: 0 `in` (audio in), 1 `out` (audio out). With k the number of samples processed since activation before
 * the sample (every run call's sample count added up):
 *     out[i] = in[i] + (float)(k % 1024) * 2^-14
 * in single precision (the ramp's values are exact), so the output shows how many samples came before: a restart
 * that replays no history is visible. Requires no feature; deterministic.
 */
#include <stdint.h>
#include <stdlib.h>

#include "lv2_common.h"

#define COUNTER_URI "urn:ward:lv2:counter"
#define RAMP_PERIOD 1024u
#define RAMP_STEP 0x1p-14f

enum counter_port { COUNTER_IN, COUNTER_OUT, COUNTER_PORT_COUNT };

struct counter {
    float *ports[COUNTER_PORT_COUNT];
    uint64_t samples;
};

static LV2_Handle instantiate(const LV2_Descriptor *descriptor, double rate, const char *bundle_path,
                              const LV2_Feature *const *features) {
    (void)descriptor;
    (void)rate;
    (void)bundle_path;
    (void)features;
    return calloc(1, sizeof(struct counter));
}

static void connect_port(LV2_Handle handle, uint32_t port, void *data) {
    struct counter *counter = handle;
    if (port < COUNTER_PORT_COUNT) {
        counter->ports[port] = data;
    }
}

static void activate(LV2_Handle handle) {
    struct counter *counter = handle;
    counter->samples = 0;
}

static void run(LV2_Handle handle, uint32_t n) {
    struct counter *counter = handle;
    const float *in = counter->ports[COUNTER_IN];
    float *out = counter->ports[COUNTER_OUT];
    for (uint32_t i = 0; i < n; i++) {
        out[i] = in[i] + (float)(uint32_t)(counter->samples % RAMP_PERIOD) * RAMP_STEP;
        counter->samples++;
    }
}

static const LV2_Descriptor descriptor = {
    .URI = COUNTER_URI,
    .instantiate = instantiate,
    .connect_port = connect_port,
    .activate = activate,
    .run = run,
    .deactivate = lv2_deactivate_nothing,
    .cleanup = lv2_cleanup_free,
    .extension_data = lv2_no_extension_data,
};

LV2_EXPORT const LV2_Descriptor *lv2_descriptor(uint32_t index) {
    return index == 0 ? &descriptor : NULL;
}
