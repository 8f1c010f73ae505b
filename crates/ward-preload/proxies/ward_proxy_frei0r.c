/* The library a host gets from dlopen when it opens a frei0r plugin under `ward run`: one copy per opened plugin,
 * bound to it by the shim (ward_proxy_bind), forwarding the entry points that carry no instance to the shim with
 * the plugin's number. Instance functions carry the shim's own instance pointer and need no binding. */
#include <stdint.h>

#include "ward_frei0r_abi.h"

#define EXPORT __attribute__((visibility("default")))

/* Defined by the preload shim. */
extern int ward_preload_f0r_init(uint64_t library);
extern void ward_preload_f0r_deinit(uint64_t library);
extern void ward_preload_f0r_get_plugin_info(uint64_t library, f0r_plugin_info_t *info);
extern void ward_preload_f0r_get_param_info(uint64_t library, f0r_param_info_t *info, int index);
extern f0r_instance_t ward_preload_f0r_construct(uint64_t library, unsigned int width, unsigned int height);
extern void ward_preload_f0r_destruct(f0r_instance_t instance);
extern void ward_preload_f0r_set_param_value(f0r_instance_t instance, f0r_param_t param, int index);
extern void ward_preload_f0r_get_param_value(f0r_instance_t instance, f0r_param_t param, int index);
extern void ward_preload_f0r_update(f0r_instance_t instance, double time, const uint32_t *in, uint32_t *out);
extern void ward_preload_f0r_update2(f0r_instance_t instance, double time, const uint32_t *in1, const uint32_t *in2,
                                     const uint32_t *in3, uint32_t *out);

static uint64_t library_id;

EXPORT void ward_proxy_bind(uint64_t library) { library_id = library; }

EXPORT int f0r_init(void) { return ward_preload_f0r_init(library_id); }
EXPORT void f0r_deinit(void) { ward_preload_f0r_deinit(library_id); }
EXPORT void f0r_get_plugin_info(f0r_plugin_info_t *info) { ward_preload_f0r_get_plugin_info(library_id, info); }
EXPORT void f0r_get_param_info(f0r_param_info_t *info, int index) {
    ward_preload_f0r_get_param_info(library_id, info, index);
}
EXPORT f0r_instance_t f0r_construct(unsigned int width, unsigned int height) {
    return ward_preload_f0r_construct(library_id, width, height);
}
EXPORT void f0r_destruct(f0r_instance_t instance) { ward_preload_f0r_destruct(instance); }
EXPORT void f0r_set_param_value(f0r_instance_t instance, f0r_param_t param, int index) {
    ward_preload_f0r_set_param_value(instance, param, index);
}
EXPORT void f0r_get_param_value(f0r_instance_t instance, f0r_param_t param, int index) {
    ward_preload_f0r_get_param_value(instance, param, index);
}
EXPORT void f0r_update(f0r_instance_t instance, double time, const uint32_t *in, uint32_t *out) {
    ward_preload_f0r_update(instance, time, in, out);
}
EXPORT void f0r_update2(f0r_instance_t instance, double time, const uint32_t *in1, const uint32_t *in2,
                        const uint32_t *in3, uint32_t *out) {
    ward_preload_f0r_update2(instance, time, in1, in2, in3, out);
}
