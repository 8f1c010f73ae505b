/*
 * lv2_options.c -- urn:ward:lv2:options, a gain set through options:interface that saves a file path through
 * state:mapPath (bundle: extensions/lv2/lv2_options.lv2).
 *
 * Ports: 0 `in` (audio in), 1 `out` (audio out): out[i] = in[i] * gain, in single precision.
 *
 * Options (context instance, subject 0), through options:interface's get and set:
 *   urn:ward:lv2:options#gain        atom:Float, 4 bytes, finite: the gain (1.0 at instantiate, or the value of this
 *                                    key in options:options when the host gives one);
 *   urn:ward:lv2:options#file        atom:Path, a NUL-terminated string of at most 4096 bytes ("" at instantiate):
 *                                    a file the plugin only remembers (it never opens it);
 *   urn:ward:lv2:options#scratch     atom:Path, read-only: what state:makePath answered for "scratch.wav" at
 *                                    instantiate ("" when the host offered no makePath, or it answered NULL);
 *   urn:ward:lv2:options#implausible get only: answered with a size of 0x7fffffff, a value no honest plugin gives.
 * `get` answers each option it knows and sets LV2_OPTIONS_ERR_BAD_KEY for the others; `set` sets BAD_KEY for an
 * unknown or read-only key and BAD_VALUE for a value of the wrong type or size (and then changes nothing of it).
 *
 * state:interface: `save` stores urn:ward:lv2:options#gain (atom:Float) and, when the file is not "", #file
 * (atom:Path): the path as state:mapPath's abstract_path gives it when the save has mapPath, else the path itself.
 * `restore` takes the gain back, and the file through absolute_path when the restore has mapPath (else as stored);
 * a missing or malformed property leaves its value as it is. Strings the host's features return are freed with
 * state:freePath when offered (at that call or at instantiate), with free otherwise, as the state extension says.
 *
 * Requires urid:map (instantiate returns NULL without it). log:log is optional: when offered, instantiate logs one
 * log:Note, "lv2_options: instantiated at RATE Hz\n" (RATE as printf's %g), through the log's printf.
 */
#define _POSIX_C_SOURCE 200809L /* strnlen */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lv2_common.h"

#define OPTIONS_URI "urn:ward:lv2:options"
#define GAIN_KEY OPTIONS_URI "#gain"
#define FILE_KEY OPTIONS_URI "#file"
#define SCRATCH_KEY OPTIONS_URI "#scratch"
#define IMPLAUSIBLE_KEY OPTIONS_URI "#implausible"
#define ATOM_FLOAT "http://lv2plug.in/ns/ext/atom#Float"
#define ATOM_PATH "http://lv2plug.in/ns/ext/atom#Path"
#define LOG_NOTE "http://lv2plug.in/ns/ext/log#Note"
#define MAX_PATH_BYTES 4096u

/* The status bits of options:interface. */
#define OPTIONS_SUCCESS 0u
#define OPTIONS_ERR_BAD_KEY 4u
#define OPTIONS_ERR_BAD_VALUE 8u

enum options_port { OPTIONS_IN, OPTIONS_OUT, OPTIONS_PORT_COUNT };

struct options {
    float *ports[OPTIONS_PORT_COUNT];
    LV2_URID float_type, path_type, gain_key, file_key, scratch_key, implausible_key;
    const LV2_State_Free_Path *free_path; /* offered at instantiate, or NULL */
    float gain;
    char file[MAX_PATH_BYTES];
    char scratch[MAX_PATH_BYTES];
};

/* A string a host feature returned, freed as the state extension says: with freePath when offered, else free. */
static void release(const LV2_State_Free_Path *free_path, char *path) {
    if (path == NULL) {
        return;
    }
    if (free_path != NULL && free_path->free_path != NULL) {
        free_path->free_path(free_path->handle, path);
    } else {
        free(path);
    }
}

/* Copies `path` into `to` (MAX_PATH_BYTES) when it fits; 0 when it does not. */
static int keep_path(char *to, const char *path, size_t size) {
    size_t n = strnlen(path, size);
    if (n >= MAX_PATH_BYTES || n == size) {
        return 0;
    }
    memcpy(to, path, n);
    to[n] = 0;
    return 1;
}

static LV2_Handle instantiate(const LV2_Descriptor *descriptor, double rate, const char *bundle_path,
                              const LV2_Feature *const *features) {
    (void)descriptor;
    (void)bundle_path;
    const LV2_URID_Map *map = lv2_feature(features, WARD_LV2_URID_MAP);
    if (map == NULL || map->map == NULL) {
        return NULL;
    }
    struct options *self = calloc(1, sizeof *self);
    if (self == NULL) {
        return NULL;
    }
    self->float_type = lv2_map(map, ATOM_FLOAT);
    self->path_type = lv2_map(map, ATOM_PATH);
    self->gain_key = lv2_map(map, GAIN_KEY);
    self->file_key = lv2_map(map, FILE_KEY);
    self->scratch_key = lv2_map(map, SCRATCH_KEY);
    self->implausible_key = lv2_map(map, IMPLAUSIBLE_KEY);
    self->gain = 1.0f;
    const LV2_Options_Option *given = lv2_feature(features, WARD_LV2_OPTIONS_OPTIONS);
    for (size_t i = 0; given != NULL && i < 1024 && (given[i].key != 0 || given[i].value != NULL); i++) {
        if (given[i].key == self->gain_key && given[i].type == self->float_type && given[i].size == sizeof(float) &&
            given[i].value != NULL) {
            memcpy(&self->gain, given[i].value, sizeof(float));
        }
    }
    self->free_path = lv2_feature(features, WARD_LV2_STATE_FREE_PATH);
    const LV2_State_Make_Path *make_path = lv2_feature(features, WARD_LV2_STATE_MAKE_PATH);
    if (make_path != NULL && make_path->path != NULL) {
        char *scratch = make_path->path(make_path->handle, "scratch.wav");
        if (scratch != NULL) {
            (void)keep_path(self->scratch, scratch, MAX_PATH_BYTES + 1);
        }
        release(self->free_path, scratch);
    }
    const LV2_Log_Log *log = lv2_feature(features, WARD_LV2_LOG_LOG);
    if (log != NULL && log->printf != NULL) {
        log->printf(log->handle, lv2_map(map, LOG_NOTE), "lv2_options: instantiated at %g Hz\n", rate);
    }
    return self;
}

static void connect_port(LV2_Handle handle, uint32_t port, void *data) {
    struct options *self = handle;
    if (port < OPTIONS_PORT_COUNT) {
        self->ports[port] = data;
    }
}

static void run(LV2_Handle handle, uint32_t n) {
    struct options *self = handle;
    const float *in = self->ports[OPTIONS_IN];
    float *out = self->ports[OPTIONS_OUT];
    for (uint32_t i = 0; i < n; i++) {
        out[i] = in[i] * self->gain;
    }
}

static int is_end(const LV2_Options_Option *o) {
    return o->key == 0 && o->value == NULL;
}

static uint32_t get(LV2_Handle handle, LV2_Options_Option *options) {
    struct options *self = handle;
    uint32_t status = OPTIONS_SUCCESS;
    for (LV2_Options_Option *o = options; !is_end(o); o++) {
        if (o->context != LV2_OPTIONS_INSTANCE) {
            status |= OPTIONS_ERR_BAD_KEY;
        } else if (o->key == self->gain_key) {
            o->type = self->float_type;
            o->size = sizeof self->gain;
            o->value = &self->gain;
        } else if (o->key == self->file_key || o->key == self->scratch_key) {
            const char *s = o->key == self->file_key ? self->file : self->scratch;
            o->type = self->path_type;
            o->size = (uint32_t)strlen(s) + 1;
            o->value = s;
        } else if (o->key == self->implausible_key) {
            o->type = self->float_type;
            o->size = 0x7fffffffu;
            o->value = &self->gain;
        } else {
            status |= OPTIONS_ERR_BAD_KEY;
        }
    }
    return status;
}

static uint32_t set(LV2_Handle handle, const LV2_Options_Option *options) {
    struct options *self = handle;
    uint32_t status = OPTIONS_SUCCESS;
    for (const LV2_Options_Option *o = options; !is_end(o); o++) {
        if (o->context != LV2_OPTIONS_INSTANCE) {
            status |= OPTIONS_ERR_BAD_KEY;
        } else if (o->key == self->gain_key) {
            float gain;
            if (o->type != self->float_type || o->size != sizeof gain || o->value == NULL) {
                status |= OPTIONS_ERR_BAD_VALUE;
                continue;
            }
            memcpy(&gain, o->value, sizeof gain);
            if (gain - gain != 0.0f) {
                status |= OPTIONS_ERR_BAD_VALUE; /* NaN or infinite */
                continue;
            }
            self->gain = gain;
        } else if (o->key == self->file_key) {
            if (o->type != self->path_type || o->value == NULL || o->size == 0 ||
                !keep_path(self->file, o->value, o->size)) {
                status |= OPTIONS_ERR_BAD_VALUE;
            }
        } else {
            status |= OPTIONS_ERR_BAD_KEY;
        }
    }
    return status;
}

static LV2_State_Status save(LV2_Handle handle, LV2_State_Store_Function store, LV2_State_Handle state,
                             uint32_t flags, const LV2_Feature *const *features) {
    struct options *self = handle;
    (void)flags;
    LV2_State_Status status =
        store(state, self->gain_key, &self->gain, sizeof self->gain, self->float_type, LV2_STATE_IS_POD);
    if (status != LV2_STATE_SUCCESS || self->file[0] == 0) {
        return status;
    }
    const LV2_State_Map_Path *map_path = lv2_feature(features, WARD_LV2_STATE_MAP_PATH);
    const LV2_State_Free_Path *free_path = lv2_feature(features, WARD_LV2_STATE_FREE_PATH);
    if (free_path == NULL) {
        free_path = self->free_path;
    }
    if (map_path == NULL || map_path->abstract_path == NULL) {
        return store(state, self->file_key, self->file, strlen(self->file) + 1, self->path_type, LV2_STATE_IS_POD);
    }
    char *abstract = map_path->abstract_path(map_path->handle, self->file);
    if (abstract == NULL) {
        return LV2_STATE_ERR_UNKNOWN;
    }
    status = store(state, self->file_key, abstract, strlen(abstract) + 1, self->path_type, LV2_STATE_IS_POD);
    release(free_path, abstract);
    return status;
}

static LV2_State_Status restore(LV2_Handle handle, LV2_State_Retrieve_Function retrieve, LV2_State_Handle state,
                                uint32_t flags, const LV2_Feature *const *features) {
    struct options *self = handle;
    (void)flags;
    size_t size = 0;
    uint32_t type = 0, value_flags = 0;
    const void *gain = retrieve(state, self->gain_key, &size, &type, &value_flags);
    if (gain != NULL && size == sizeof self->gain && type == self->float_type) {
        memcpy(&self->gain, gain, sizeof self->gain);
    }
    const char *file = retrieve(state, self->file_key, &size, &type, &value_flags);
    if (file == NULL || type != self->path_type || size == 0 || size > MAX_PATH_BYTES || file[size - 1] != 0) {
        return LV2_STATE_SUCCESS;
    }
    const LV2_State_Map_Path *map_path = lv2_feature(features, WARD_LV2_STATE_MAP_PATH);
    const LV2_State_Free_Path *free_path = lv2_feature(features, WARD_LV2_STATE_FREE_PATH);
    if (free_path == NULL) {
        free_path = self->free_path;
    }
    if (map_path == NULL || map_path->absolute_path == NULL) {
        (void)keep_path(self->file, file, size);
        return LV2_STATE_SUCCESS;
    }
    char *absolute = map_path->absolute_path(map_path->handle, file);
    if (absolute == NULL) {
        return LV2_STATE_ERR_UNKNOWN;
    }
    (void)keep_path(self->file, absolute, MAX_PATH_BYTES + 1);
    release(free_path, absolute);
    return LV2_STATE_SUCCESS;
}

static const LV2_Options_Interface options_interface = {get, set};
static const LV2_State_Interface state_interface = {save, restore};

static const void *extension_data(const char *uri) {
    if (strcmp(uri, WARD_LV2_OPTIONS_INTERFACE) == 0) {
        return &options_interface;
    }
    if (strcmp(uri, WARD_LV2_STATE_INTERFACE) == 0) {
        return &state_interface;
    }
    return NULL;
}

static const LV2_Descriptor descriptor = {
    .URI = OPTIONS_URI,
    .instantiate = instantiate,
    .connect_port = connect_port,
    .activate = NULL,
    .run = run,
    .deactivate = lv2_deactivate_nothing,
    .cleanup = lv2_cleanup_free,
    .extension_data = extension_data,
};

LV2_EXPORT const LV2_Descriptor *lv2_descriptor(uint32_t index) {
    return index == 0 ? &descriptor : NULL;
}
