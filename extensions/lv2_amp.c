/*
 * lv2_amp.c -- urn:ward:lv2:amp, a well-behaved LV2 amplifier (bundle: extensions/lv2/lv2_amp.lv2).
 *
 * Ports: 0 `in` (audio in), 1 `out` (audio out), 2 `gain` (control in, linear, default 0.5), 3 `peak` (control
 * out: the largest |out| of the block). out[i] = in[i] * gain, element by element (so in == out works), in single
 * precision: bit-exact with any other float multiplication. Requires no feature; deterministic.
 *
 * Exports lv2_descriptor only.
 */
#include <stdint.h>
#include <stdlib.h>

#include "lv2_common.h"

#define AMP_URI "urn:ward:lv2:amp"

enum amp_port { AMP_IN, AMP_OUT, AMP_GAIN, AMP_PEAK, AMP_PORT_COUNT };

struct amp {
    float *ports[AMP_PORT_COUNT];
};

static LV2_Handle instantiate(const LV2_Descriptor *descriptor, double rate, const char *bundle_path,
                              const LV2_Feature *const *features) {
    (void)descriptor;
    (void)rate;
    (void)bundle_path;
    (void)features;
    return calloc(1, sizeof(struct amp));
}

static void connect_port(LV2_Handle handle, uint32_t port, void *data) {
    struct amp *amp = handle;
    if (port < AMP_PORT_COUNT) {
        amp->ports[port] = data;
    }
}

static void activate(LV2_Handle handle) {
    (void)handle;
}

static void run(LV2_Handle handle, uint32_t n) {
    struct amp *amp = handle;
    const float *in = amp->ports[AMP_IN];
    float *out = amp->ports[AMP_OUT];
    float gain = lv2_control(amp->ports[AMP_GAIN], 0.5f);
    float peak = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        float y = in[i] * gain;
        out[i] = y;
        float magnitude = y < 0.0f ? -y : y;
        if (magnitude > peak) {
            peak = magnitude;
        }
    }
    if (amp->ports[AMP_PEAK] != NULL) {
        *amp->ports[AMP_PEAK] = peak;
    }
}

static const LV2_Descriptor descriptor = {
    .URI = AMP_URI,
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
