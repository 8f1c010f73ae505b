/*
 * lilv_block_host.c -- a small lilv host that runs ward's built-in urn:ward:lv2:delay over blocks a proxy must pass
 * on exactly: loud ones, silent ones, ones that end or begin in silence, with an output buffer the host fills with
 * a marker before every block. It runs one instance on separate input and output buffers and another in place
 * (input and output connected to the same buffer), and prints, per block, a hash of the output's bytes and three
 * samples, and the control output. Run natively and under `ward run`, the two printouts must be the same.
 */
#include <lilv/lilv.h>
#include <lv2/urid/urid.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLUGIN "urn:ward:lv2:delay"
#define BLOCK 256
#define BLOCKS 8

static char uris[64][256];
static unsigned uri_count;

static LV2_URID map(LV2_URID_Map_Handle handle, const char *uri) {
    (void)handle;
    for (unsigned i = 0; i < uri_count; i++)
        if (strcmp(uris[i], uri) == 0)
            return i + 1;
    if (uri_count == 64 || strlen(uri) >= sizeof uris[0])
        return 0;
    strcpy(uris[uri_count], uri);
    return ++uri_count;
}

/* The input of block `b`, sample `i`: silence, a tone, or a tone that starts or stops within the block. */
static float signal(int b, int i) {
    float tone = (float)((i * 37 + b * 11) % 97) / 97.0f - 0.5f;
    switch (b % 4) {
    case 0:
        return tone;
    case 1:
        return i < BLOCK / 3 ? tone : 0.0f;
    case 2:
        return 0.0f;
    default:
        return i >= BLOCK / 2 ? tone : 0.0f;
    }
}

static uint64_t fnv(const void *data, size_t len) {
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int run(const LilvPlugin *plugin, const LV2_Feature *const *features, int in_place) {
    LilvInstance *inst = lilv_plugin_instantiate(plugin, 48000.0, features);
    if (inst == NULL) {
        fprintf(stderr, "instantiate failed\n");
        return 1;
    }
    static float in[BLOCK], out[BLOCK];
    float mix = 0.5f, blocks = -1.0f;
    lilv_instance_connect_port(inst, 0, in);
    lilv_instance_connect_port(inst, 1, in_place ? in : out);
    lilv_instance_connect_port(inst, 2, &mix);
    lilv_instance_connect_port(inst, 3, &blocks);
    lilv_instance_activate(inst);
    for (int b = 0; b < BLOCKS; b++) {
        for (int i = 0; i < BLOCK; i++) {
            in[i] = signal(b, i);
            out[i] = 7.0f;
        }
        lilv_instance_run(inst, BLOCK);
        const float *o = in_place ? in : out;
        printf("%s block %d: %016llx %g %g %g blocks %g\n", in_place ? "in place" : "separate", b,
               (unsigned long long)fnv(o, sizeof out), (double)o[0], (double)o[BLOCK / 2], (double)o[BLOCK - 1],
               (double)blocks);
    }
    lilv_instance_deactivate(inst);
    lilv_instance_free(inst);
    return 0;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    LilvWorld *world = lilv_world_new();
    lilv_world_load_all(world);
    LilvNode *uri = lilv_new_uri(world, PLUGIN);
    const LilvPlugin *plugin = lilv_plugins_get_by_uri(lilv_world_get_all_plugins(world), uri);
    if (plugin == NULL) {
        fprintf(stderr, "no " PLUGIN " on LV2_PATH\n");
        return 1;
    }
    LV2_URID_Map map_data = {NULL, map};
    LV2_Feature map_feature = {LV2_URID__map, &map_data};
    const LV2_Feature *features[] = {&map_feature, NULL};
    int failed = run(plugin, features, 0) || run(plugin, features, 1);
    lilv_node_free(uri);
    lilv_world_free(world);
    return failed;
}
