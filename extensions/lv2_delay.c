/*
 * lv2_delay.c -- urn:ward:lv2:delay, a feedback delay with a long tail and state:interface (bundle:
 * extensions/lv2/lv2_delay.lv2).
 *
 * Ports: 0 `in` (audio in), 1 `out` (audio out), 2 `mix` (control in, 0..1, default 0.5), 3 `blocks` (control out:
 * the run calls since activation, from the internal block counter).
 *
 * The line holds 0.25 s at the instance's rate (rounded, at least one sample). Per sample:
 *     d = line[pos]; line[pos] = in + 0.6 * d; pos = (pos + 1) % length; out = (1 - mix) * in + mix * d
 * so with mix > 0 every output depends on all past input: a restart without the state shows.
 *
 * state:interface: `save` stores two properties, `urn:ward:lv2:delay#line`, an atom:Chunk holding the length and the
 * write position (two native uint32) and then the whole line (native floats), and `urn:ward:lv2:delay#blocks`, an
 * atom:Int holding the block counter (its 32 bits). `restore` checks both (types, sizes, the length matching this
 * instance's rate, the position inside the line) before setting either, and changes nothing when one is missing or
 * wrong. The line starts empty at instantiate; `activate` empties it again unless a restore came since instantiate
 * or the last deactivate, so a host may restore before or after activating. Requires urid:map (instantiate returns
 * NULL without it).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lv2_common.h"

#define DELAY_URI "urn:ward:lv2:delay"
#define DELAY_LINE_KEY DELAY_URI "#line"
#define DELAY_BLOCKS_KEY DELAY_URI "#blocks"

#define DELAY_SECONDS 0.25
#define FEEDBACK 0.6f
/* Rates beyond any audio interface's: a line of at most 384000 samples. */
#define MAX_RATE 1536000.0

enum delay_port { DELAY_IN, DELAY_OUT, DELAY_MIX, DELAY_BLOCKS, DELAY_PORT_COUNT };

struct delay {
    float *ports[DELAY_PORT_COUNT];
    LV2_URID chunk_type;
    LV2_URID int_type;
    LV2_URID line_key;
    LV2_URID blocks_key;
    uint32_t length;
    uint32_t position;
    uint32_t blocks;
    int restored; /* a restore since instantiate or the last deactivate: activate keeps the line */
    float *line;
};

/* The chunk's header, before the line. */
struct line_header {
    uint32_t length;
    uint32_t position;
};

static LV2_Handle instantiate(const LV2_Descriptor *descriptor, double rate, const char *bundle_path,
                              const LV2_Feature *const *features) {
    (void)descriptor;
    (void)bundle_path;
    const LV2_URID_Map *map = lv2_feature(features, WARD_LV2_URID_MAP);
    if (map == NULL || map->map == NULL || !(rate >= 1.0 && rate <= MAX_RATE)) {
        return NULL;
    }
    struct delay *delay = calloc(1, sizeof *delay);
    if (delay == NULL) {
        return NULL;
    }
    uint32_t length = (uint32_t)(rate * DELAY_SECONDS + 0.5);
    delay->length = length > 0 ? length : 1;
    delay->line = calloc(delay->length, sizeof *delay->line);
    if (delay->line == NULL) {
        free(delay);
        return NULL;
    }
    delay->chunk_type = lv2_map(map, WARD_LV2_ATOM_CHUNK);
    delay->int_type = lv2_map(map, WARD_LV2_ATOM_INT);
    delay->line_key = lv2_map(map, DELAY_LINE_KEY);
    delay->blocks_key = lv2_map(map, DELAY_BLOCKS_KEY);
    return delay;
}

static void connect_port(LV2_Handle handle, uint32_t port, void *data) {
    struct delay *delay = handle;
    if (port < DELAY_PORT_COUNT) {
        delay->ports[port] = data;
    }
}

static void activate(LV2_Handle handle) {
    struct delay *delay = handle;
    if (!delay->restored) {
        memset(delay->line, 0, delay->length * sizeof *delay->line);
        delay->position = 0;
        delay->blocks = 0;
    }
}

static void run(LV2_Handle handle, uint32_t n) {
    struct delay *delay = handle;
    const float *in = delay->ports[DELAY_IN];
    float *out = delay->ports[DELAY_OUT];
    float mix = lv2_control(delay->ports[DELAY_MIX], 0.5f);
    float dry = 1.0f - mix;
    uint32_t position = delay->position;
    for (uint32_t i = 0; i < n; i++) {
        float x = in[i];
        float delayed = delay->line[position];
        delay->line[position] = x + FEEDBACK * delayed;
        position = position + 1 == delay->length ? 0 : position + 1;
        out[i] = dry * x + mix * delayed;
    }
    delay->position = position;
    delay->blocks++;
    if (delay->ports[DELAY_BLOCKS] != NULL) {
        *delay->ports[DELAY_BLOCKS] = (float)delay->blocks;
    }
}

static void deactivate(LV2_Handle handle) {
    struct delay *delay = handle;
    delay->restored = 0;
}

static void cleanup(LV2_Handle handle) {
    struct delay *delay = handle;
    free(delay->line);
    free(delay);
}

static LV2_State_Status save(LV2_Handle handle, LV2_State_Store_Function store, LV2_State_Handle state,
                             uint32_t flags, const LV2_Feature *const *features) {
    (void)flags;
    (void)features;
    struct delay *delay = handle;
    size_t line_bytes = (size_t)delay->length * sizeof *delay->line;
    size_t size = sizeof(struct line_header) + line_bytes;
    uint8_t *chunk = malloc(size);
    if (chunk == NULL) {
        return LV2_STATE_ERR_UNKNOWN;
    }
    struct line_header header = {delay->length, delay->position};
    memcpy(chunk, &header, sizeof header);
    memcpy(chunk + sizeof header, delay->line, line_bytes);
    LV2_State_Status status = store(state, delay->line_key, chunk, size, delay->chunk_type, LV2_STATE_IS_POD);
    free(chunk);
    if (status != LV2_STATE_SUCCESS) {
        return status;
    }
    int32_t blocks;
    memcpy(&blocks, &delay->blocks, sizeof blocks);
    return store(state, delay->blocks_key, &blocks, sizeof blocks, delay->int_type, LV2_STATE_IS_POD);
}

static LV2_State_Status restore(LV2_Handle handle, LV2_State_Retrieve_Function retrieve, LV2_State_Handle state,
                                uint32_t flags, const LV2_Feature *const *features) {
    (void)flags;
    (void)features;
    struct delay *delay = handle;
    size_t line_size = 0;
    uint32_t line_type = 0;
    uint32_t line_flags = 0;
    const uint8_t *chunk = retrieve(state, delay->line_key, &line_size, &line_type, &line_flags);
    size_t blocks_size = 0;
    uint32_t blocks_type = 0;
    uint32_t blocks_flags = 0;
    const void *blocks = retrieve(state, delay->blocks_key, &blocks_size, &blocks_type, &blocks_flags);
    if (chunk == NULL || blocks == NULL) {
        return LV2_STATE_ERR_NO_PROPERTY;
    }
    size_t line_bytes = (size_t)delay->length * sizeof *delay->line;
    if (line_type != delay->chunk_type || line_size != sizeof(struct line_header) + line_bytes ||
        blocks_type != delay->int_type || blocks_size != sizeof(int32_t)) {
        return LV2_STATE_ERR_BAD_TYPE;
    }
    struct line_header header;
    memcpy(&header, chunk, sizeof header);
    if (header.length != delay->length || header.position >= delay->length) {
        return LV2_STATE_ERR_BAD_TYPE;
    }
    memcpy(delay->line, chunk + sizeof header, line_bytes);
    delay->position = header.position;
    memcpy(&delay->blocks, blocks, sizeof delay->blocks);
    delay->restored = 1;
    return LV2_STATE_SUCCESS;
}

static const LV2_State_Interface state_interface = {save, restore};

static const void *extension_data(const char *uri) {
    if (strcmp(uri, WARD_LV2_STATE_INTERFACE) == 0) {
        return &state_interface;
    }
    return NULL;
}

static const LV2_Descriptor descriptor = {
    .URI = DELAY_URI,
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
