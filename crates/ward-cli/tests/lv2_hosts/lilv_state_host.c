/*
 * A small lilv host for ward's tests (lv2_interfaces.rs): it finds urn:ward:lv2:options through lilv, offers it its
 * own URID map, log, state:makePath and state:freePath, and uses its options:interface and state:interface as a
 * session host would, offering its own state:mapPath to save and restore. Everything the plugin asks of the host
 * and everything it answers is printed, one line each, so that a run under `ward run` can be compared with a native
 * one line for line.
 *
 *   lilv_state_host SESSION_DIR SCRATCH_DIR
 *
 * Exit status 0 when every step worked, 1 (with the reason on standard error) otherwise.
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lilv/lilv.h>
#include <lv2/atom/atom.h>
#include <lv2/log/log.h>
#include <lv2/options/options.h>
#include <lv2/state/state.h>
#include <lv2/urid/urid.h>

#define PLUGIN "urn:ward:lv2:options"
#define BLOCK 64

static const char *session_dir;
static const char *scratch_dir;

/* ---- the URID map: URIs numbered from 1 in the order first mapped ---- */

static char *uris[256];
static uint32_t uri_count;

static LV2_URID map(LV2_URID_Map_Handle handle, const char *uri) {
    (void)handle;
    for (uint32_t i = 0; i < uri_count; i++)
        if (strcmp(uris[i], uri) == 0)
            return i + 1;
    if (uri_count == 256)
        return 0;
    uris[uri_count] = strdup(uri);
    return ++uri_count;
}

static const char *unmap(LV2_URID_Unmap_Handle handle, LV2_URID urid) {
    (void)handle;
    return urid >= 1 && urid <= uri_count ? uris[urid - 1] : NULL;
}

/* ---- the log: every message printed ---- */

static int log_vprintf(LV2_Log_Handle handle, LV2_URID type, const char *fmt, va_list ap) {
    (void)handle;
    printf("log %s: ", unmap(NULL, type) ? unmap(NULL, type) : "?");
    int n = vprintf(fmt, ap);
    fflush(stdout);
    return n;
}

static int log_printf(LV2_Log_Handle handle, LV2_URID type, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = log_vprintf(handle, type, fmt, ap);
    va_end(ap);
    return n;
}

/* ---- the state extension's path functions ---- */

static char *joined(const char *dir, const char *path) {
    char *s = malloc(strlen(dir) + strlen(path) + 2);
    sprintf(s, "%s/%s", dir, path);
    return s;
}

static char *make_path(LV2_State_Make_Path_Handle handle, const char *path) {
    (void)handle;
    char *made = joined(scratch_dir, path);
    printf("host makePath(%s) = %s\n", path, made);
    return made;
}

static void free_path(LV2_State_Free_Path_Handle handle, char *path) {
    (void)handle;
    printf("host freePath(%s)\n", path);
    free(path);
}

static char *abstract_path(LV2_State_Map_Path_Handle handle, const char *absolute) {
    (void)handle;
    size_t n = strlen(session_dir);
    char *abstract = strncmp(absolute, session_dir, n) == 0 && absolute[n] == '/' ? strdup(absolute + n + 1)
                                                                                    : strdup(absolute);
    printf("host abstract_path(%s) = %s\n", absolute, abstract);
    return abstract;
}

static char *absolute_path(LV2_State_Map_Path_Handle handle, const char *abstract) {
    (void)handle;
    char *absolute = abstract[0] == '/' ? strdup(abstract) : joined(session_dir, abstract);
    printf("host absolute_path(%s) = %s\n", abstract, absolute);
    return absolute;
}

/* ---- the state store: properties kept in memory ---- */

struct property {
    uint32_t key, type, flags;
    size_t size;
    void *value;
};
static struct property properties[16];
static size_t property_count;

static LV2_State_Status store(LV2_State_Handle handle, uint32_t key, const void *value, size_t size, uint32_t type,
                              uint32_t flags) {
    (void)handle;
    if (property_count == 16)
        return LV2_STATE_ERR_NO_SPACE;
    struct property *p = &properties[property_count++];
    *p = (struct property){key, type, flags, size, malloc(size)};
    memcpy(p->value, value, size);
    if (type == map(NULL, LV2_ATOM__Path))
        printf("stored %s (atom:Path) %.*s\n", unmap(NULL, key), (int)size, (const char *)value);
    else if (type == map(NULL, LV2_ATOM__Float) && size == sizeof(float))
        printf("stored %s (atom:Float) %g\n", unmap(NULL, key), (double)*(const float *)value);
    else
        printf("stored %s (%s) %zu bytes\n", unmap(NULL, key), unmap(NULL, type), size);
    return LV2_STATE_SUCCESS;
}

static const void *retrieve(LV2_State_Handle handle, uint32_t key, size_t *size, uint32_t *type, uint32_t *flags) {
    (void)handle;
    for (size_t i = 0; i < property_count; i++) {
        if (properties[i].key == key) {
            *size = properties[i].size;
            *type = properties[i].type;
            *flags = properties[i].flags;
            return properties[i].value;
        }
    }
    return NULL;
}

/* ---- options ---- */

static void print_options(const char *what, const LV2_Options_Interface *options, LV2_Handle handle,
                          const char *const *keys) {
    LV2_Options_Option asked[8];
    size_t n = 0;
    for (; keys[n] != NULL; n++)
        asked[n] = (LV2_Options_Option){LV2_OPTIONS_INSTANCE, 0, map(NULL, keys[n]), 0, 0, NULL};
    asked[n] = (LV2_Options_Option){LV2_OPTIONS_INSTANCE, 0, 0, 0, 0, NULL};
    uint32_t status = options->get(handle, asked);
    printf("%s: get status %u\n", what, status);
    for (size_t i = 0; i < n; i++) {
        const LV2_Options_Option *o = &asked[i];
        if (o->value == NULL)
            printf("  %s: none\n", keys[i]);
        else if (o->type == map(NULL, LV2_ATOM__Float) && o->size == sizeof(float))
            printf("  %s: %g\n", keys[i], (double)*(const float *)o->value);
        else if (o->type == map(NULL, LV2_ATOM__Path))
            printf("  %s: \"%.*s\"\n", keys[i], (int)o->size, (const char *)o->value);
        else
            printf("  %s: %u bytes of %s\n", keys[i], o->size, unmap(NULL, o->type));
    }
}

static uint32_t set_float(const LV2_Options_Interface *options, LV2_Handle handle, const char *key, float value) {
    LV2_Options_Option set[2] = {
        {LV2_OPTIONS_INSTANCE, 0, map(NULL, key), sizeof value, map(NULL, LV2_ATOM__Float), &value},
        {LV2_OPTIONS_INSTANCE, 0, 0, 0, 0, NULL},
    };
    return options->set(handle, set);
}

static uint32_t set_path(const LV2_Options_Interface *options, LV2_Handle handle, const char *key, const char *path) {
    LV2_Options_Option set[2] = {
        {LV2_OPTIONS_INSTANCE, 0, map(NULL, key), (uint32_t)strlen(path) + 1, map(NULL, LV2_ATOM__Path), path},
        {LV2_OPTIONS_INSTANCE, 0, 0, 0, 0, NULL},
    };
    return options->set(handle, set);
}

static int fail(const char *why) {
    fprintf(stderr, "lilv_state_host: %s\n", why);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3)
        return fail("usage: lilv_state_host SESSION_DIR SCRATCH_DIR");
    session_dir = argv[1];
    scratch_dir = argv[2];
    setvbuf(stdout, NULL, _IOLBF, 0);

    LilvWorld *world = lilv_world_new();
    lilv_world_load_all(world);
    LilvNode *uri = lilv_new_uri(world, PLUGIN);
    const LilvPlugin *plugin = lilv_plugins_get_by_uri(lilv_world_get_all_plugins(world), uri);
    if (plugin == NULL)
        return fail("no " PLUGIN " on LV2_PATH");

    LV2_URID_Map map_data = {NULL, map};
    LV2_URID_Unmap unmap_data = {NULL, unmap};
    LV2_Log_Log log_data = {NULL, log_printf, log_vprintf};
    LV2_State_Make_Path make_data = {NULL, make_path};
    LV2_State_Free_Path free_data = {NULL, free_path};
    LV2_State_Map_Path map_path_data = {NULL, abstract_path, absolute_path};
    LV2_Feature map_feature = {LV2_URID__map, &map_data};
    LV2_Feature unmap_feature = {LV2_URID__unmap, &unmap_data};
    LV2_Feature log_feature = {LV2_LOG__log, &log_data};
    LV2_Feature make_feature = {LV2_STATE__makePath, &make_data};
    LV2_Feature free_feature = {LV2_STATE__freePath, &free_data};
    LV2_Feature map_path_feature = {LV2_STATE__mapPath, &map_path_data};
    const LV2_Feature *with_paths[] = {&map_feature, &unmap_feature, &log_feature, &make_feature, &free_feature, NULL};
    const LV2_Feature *without_paths[] = {&map_feature, &unmap_feature, &log_feature, NULL};
    const LV2_Feature *state_features[] = {&map_path_feature, &free_feature, NULL};

    /* The first instance: options got and set, a block run, the state saved. */
    LilvInstance *first = lilv_plugin_instantiate(plugin, 48000.0, with_paths);
    if (first == NULL)
        return fail("instantiate failed");
    const LV2_Options_Interface *options = lilv_instance_get_extension_data(first, LV2_OPTIONS__interface);
    const LV2_State_Interface *state = lilv_instance_get_extension_data(first, LV2_STATE__interface);
    printf("options interface: %s, state interface: %s\n", options ? "yes" : "no", state ? "yes" : "no");
    if (options == NULL || options->get == NULL || options->set == NULL || state == NULL)
        return fail("the plugin's interfaces are missing");
    printf("unknown interface: %s\n",
           lilv_instance_get_extension_data(first, "urn:ward:no-such-interface") ? "not NULL" : "NULL");
    float in[BLOCK], out[BLOCK];
    for (int i = 0; i < BLOCK; i++)
        in[i] = (float)i / 8.0f;
    lilv_instance_connect_port(first, 0, in);
    lilv_instance_connect_port(first, 1, out);
    lilv_instance_activate(first);
    const char *const gain_and_scratch[] = {PLUGIN "#gain", PLUGIN "#scratch", NULL};
    print_options("first", options, lilv_instance_get_handle(first), gain_and_scratch);
    printf("set gain 0.5: status %u\n", set_float(options, lilv_instance_get_handle(first), PLUGIN "#gain", 0.5f));
    printf("set gain NaN: status %u\n", set_float(options, lilv_instance_get_handle(first), PLUGIN "#gain", 0.0f / 0.0f));
    lilv_instance_run(first, BLOCK);
    printf("out: %g %g %g %g\n", (double)out[0], (double)out[1], (double)out[2], (double)out[63]);
    char *file = joined(session_dir, "takes/one.wav");
    printf("set file: status %u\n", set_path(options, lilv_instance_get_handle(first), PLUGIN "#file", file));
    free(file);
    LV2_State_Status saved = state->save(lilv_instance_get_handle(first), store, NULL, LV2_STATE_IS_POD, state_features);
    printf("save: status %u\n", saved);
    lilv_instance_deactivate(first);
    lilv_instance_free(first);

    /* The second: no makePath at instantiate, the state restored, what came back read. */
    LilvInstance *second = lilv_plugin_instantiate(plugin, 48000.0, without_paths);
    if (second == NULL)
        return fail("the second instantiate failed");
    options = lilv_instance_get_extension_data(second, LV2_OPTIONS__interface);
    state = lilv_instance_get_extension_data(second, LV2_STATE__interface);
    LV2_State_Status restored =
        state->restore(lilv_instance_get_handle(second), retrieve, NULL, LV2_STATE_IS_POD, state_features);
    printf("restore: status %u\n", restored);
    const char *const all[] = {PLUGIN "#gain", PLUGIN "#file", PLUGIN "#scratch", "urn:ward:no-such-option", NULL};
    print_options("second", options, lilv_instance_get_handle(second), all);
    lilv_instance_free(second);

    /* A plugin without options:interface: NULL, as from the plugin itself. */
    LilvNode *amp_uri = lilv_new_uri(world, "urn:ward:lv2:amp");
    const LilvPlugin *amp = lilv_plugins_get_by_uri(lilv_world_get_all_plugins(world), amp_uri);
    LilvInstance *amp_instance = amp != NULL ? lilv_plugin_instantiate(amp, 48000.0, without_paths) : NULL;
    if (amp_instance == NULL)
        return fail("urn:ward:lv2:amp is not there or not instantiated");
    printf("amp options interface: %s\n",
           lilv_instance_get_extension_data(amp_instance, LV2_OPTIONS__interface) ? "not NULL" : "NULL");
    lilv_instance_free(amp_instance);
    lilv_node_free(amp_uri);

    lilv_node_free(uri);
    lilv_world_free(world);
    return 0;
}
