/*
 * lv2_worker.c -- urn:ward:lv2:worker, a well-behaved LV2 plugin that does its work through worker:schedule
 * (bundle: extensions/lv2/lv2_worker.lv2).
 *
 * Ports: 0 `in` (audio in), 1 `out` (audio out): out[i] = in[i] * gain, in single precision.
 *
 * Blocks are numbered from 0 since activation. On every block whose number is a multiple of 16 (0, 16, 32, ...)
 * `run`, before processing, schedules work whose body is that number (a native uint32). `work` answers with the gain
 * 0.25 * (1 + (number / 16) % 4) (a native float: 0.25, 0.5, 0.75 or 1.0, in turn); `work_response` stores it, and
 * the runs after it apply it. The gain is 1.0 until the first response. A host that runs work synchronously, or
 * delivers responses before the next run as the worker extension asks, gets the same output every time.
 * worker:interface has no end_run.
 *
 * Requires worker:schedule and urid:map (instantiate returns NULL without either). log:log is optional: when the host
 * offers it, instantiate logs one log:Note, "lv2_worker: instantiated at RATE Hz\n" (RATE as printf's %g), through
 * the log's vprintf, as LV2's logger utility does.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lv2_common.h"

#define WORKER_URI "urn:ward:lv2:worker"
#define LOG_NOTE "http://lv2plug.in/ns/ext/log#Note"
#define WORK_EVERY 16u

enum worker_port { WORKER_IN, WORKER_OUT, WORKER_PORT_COUNT };

struct worker {
    float *ports[WORKER_PORT_COUNT];
    const LV2_Worker_Schedule *schedule;
    uint32_t blocks;
    float gain;
};

__attribute__((format(printf, 3, 4))) static void log_note(const LV2_Log_Log *log, LV2_URID note, const char *fmt,
                                                           ...) {
    va_list args;
    va_start(args, fmt);
    log->vprintf(log->handle, note, fmt, args);
    va_end(args);
}

static LV2_Handle instantiate(const LV2_Descriptor *descriptor, double rate, const char *bundle_path,
                              const LV2_Feature *const *features) {
    (void)descriptor;
    (void)bundle_path;
    const LV2_URID_Map *map = lv2_feature(features, WARD_LV2_URID_MAP);
    const LV2_Worker_Schedule *schedule = lv2_feature(features, WARD_LV2_WORKER_SCHEDULE);
    const LV2_Log_Log *log = lv2_feature(features, WARD_LV2_LOG_LOG);
    if (map == NULL || map->map == NULL || schedule == NULL || schedule->schedule_work == NULL) {
        return NULL;
    }
    struct worker *worker = calloc(1, sizeof *worker);
    if (worker == NULL) {
        return NULL;
    }
    worker->schedule = schedule;
    worker->gain = 1.0f;
    if (log != NULL && log->vprintf != NULL) {
        log_note(log, lv2_map(map, LOG_NOTE), "lv2_worker: instantiated at %g Hz\n", rate);
    }
    return worker;
}

static void connect_port(LV2_Handle handle, uint32_t port, void *data) {
    struct worker *worker = handle;
    if (port < WORKER_PORT_COUNT) {
        worker->ports[port] = data;
    }
}

static void activate(LV2_Handle handle) {
    struct worker *worker = handle;
    worker->blocks = 0;
    worker->gain = 1.0f;
}

static void run(LV2_Handle handle, uint32_t n) {
    struct worker *worker = handle;
    uint32_t number = worker->blocks++;
    if (number % WORK_EVERY == 0) {
        /* A full queue loses this change of gain; the next one comes 16 blocks later. */
        (void)worker->schedule->schedule_work(worker->schedule->handle, sizeof number, &number);
    }
    const float *in = worker->ports[WORKER_IN];
    float *out = worker->ports[WORKER_OUT];
    float gain = worker->gain;
    for (uint32_t i = 0; i < n; i++) {
        out[i] = in[i] * gain;
    }
}

static void deactivate(LV2_Handle handle) {
    (void)handle;
}

static void cleanup(LV2_Handle handle) {
    free(handle);
}

static LV2_Worker_Status work(LV2_Handle handle, LV2_Worker_Respond_Function respond,
                              LV2_Worker_Respond_Handle respond_handle, uint32_t size, const void *data) {
    (void)handle;
    uint32_t number;
    if (size != sizeof number || data == NULL) {
        return LV2_WORKER_ERR_UNKNOWN;
    }
    memcpy(&number, data, sizeof number);
    float gain = 0.25f * (float)(1u + (number / WORK_EVERY) % 4u);
    return respond(respond_handle, sizeof gain, &gain);
}

static LV2_Worker_Status work_response(LV2_Handle handle, uint32_t size, const void *body) {
    struct worker *worker = handle;
    if (size != sizeof worker->gain || body == NULL) {
        return LV2_WORKER_ERR_UNKNOWN;
    }
    memcpy(&worker->gain, body, sizeof worker->gain);
    return LV2_WORKER_SUCCESS;
}

static const LV2_Worker_Interface worker_interface = {work, work_response, NULL};

static const void *extension_data(const char *uri) {
    if (strcmp(uri, WARD_LV2_WORKER_INTERFACE) == 0) {
        return &worker_interface;
    }
    return NULL;
}

static const LV2_Descriptor descriptor = {
    .URI = WORKER_URI,
    .instantiate = instantiate,
    .connect_port = connect_port,
    .activate = activate,
    .run = run,
    .deactivate = deactivate,
    .cleanup = cleanup,
    .extension_data = extension_data,
};

LV2_EXPORT const LV2_Descriptor *lv2_descriptor(uint32_t index) {
    return index == 0 ? &descriptor : NULL;
}
