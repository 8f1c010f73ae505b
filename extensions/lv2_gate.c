/*
 * lv2_gate.c -- urn:ward:lv2:gate, a stateful LV2 plugin whose block can be made to wait for its host (bundle:
 * extensions/lv2/lv2_gate.lv2): a real-time block that misses its period on purpose, for as long as a test likes.
 *
 * Ports: 0 `in` (audio in), 1 `out` (audio out), 2 `wait` (control in, default 0). With t the sum of the first
 * input sample of every block run since activation, this one's included:
 *     out[i] = in[i] + t
 * in single precision (exact for small integer inputs), so the output shows which blocks the plugin really ran: a
 * restart that replays a different stream is visible. A block run with `wait` nonzero first opens the file `gate`
 * in its bundle directory for reading and reads one byte from it: a FIFO there holds the block until its host
 * writes to it (or closes it). Without that file the block does not wait. No state:interface; requires no feature.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lv2_common.h"

#define GATE_URI "urn:ward:lv2:gate"
#define GATE_FILE "gate"
#define GATE_PATH_MAX 4096

enum gate_port { GATE_IN, GATE_OUT, GATE_WAIT, GATE_PORT_COUNT };

struct gate {
    float *ports[GATE_PORT_COUNT];
    float total;
    /* The bundle directory's `gate`, or "" when its path does not fit. */
    char path[GATE_PATH_MAX];
};

static LV2_Handle instantiate(const LV2_Descriptor *descriptor, double rate, const char *bundle_path,
                              const LV2_Feature *const *features) {
    (void)descriptor;
    (void)rate;
    (void)features;
    struct gate *gate = calloc(1, sizeof *gate);
    if (gate == NULL) {
        return NULL;
    }
    size_t len = bundle_path != NULL ? strlen(bundle_path) : 0;
    int slash = len > 0 && bundle_path[len - 1] == '/';
    if (len + (slash ? 0 : 1) + sizeof GATE_FILE <= sizeof gate->path) {
        memcpy(gate->path, bundle_path, len);
        if (!slash) {
            gate->path[len++] = '/';
        }
        memcpy(gate->path + len, GATE_FILE, sizeof GATE_FILE);
    }
    return gate;
}

static void connect_port(LV2_Handle handle, uint32_t port, void *data) {
    struct gate *gate = handle;
    if (port < GATE_PORT_COUNT) {
        gate->ports[port] = data;
    }
}

static void activate(LV2_Handle handle) {
    struct gate *gate = handle;
    gate->total = 0.0f;
}

/* Wait for one byte (or the end) of the gate file, if there is one. */
static void wait_at_gate(const struct gate *gate) {
    if (gate->path[0] == '\0') {
        return;
    }
    int fd;
    do {
        fd = open(gate->path, O_RDONLY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        return;
    }
    char byte;
    while (read(fd, &byte, 1) < 0 && errno == EINTR) {
    }
    close(fd);
}

static void run(LV2_Handle handle, uint32_t n) {
    struct gate *gate = handle;
    const float *in = gate->ports[GATE_IN];
    float *out = gate->ports[GATE_OUT];
    if (lv2_control(gate->ports[GATE_WAIT], 0.0f) != 0.0f) {
        wait_at_gate(gate);
    }
    if (n > 0) {
        gate->total += in[0];
    }
    for (uint32_t i = 0; i < n; i++) {
        out[i] = in[i] + gate->total;
    }
}

static const LV2_Descriptor descriptor = {
    .URI = GATE_URI,
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
