/* The library a host gets from dlopen when it opens an LV2 plugin binary under `ward run`. Each opened binary gets its
 * own copy of this proxy (so that `lv2_descriptor`, which takes no context, knows which binary it stands for); the
 * shim binds the copy to its binary with ward_proxy_bind right after loading it, and leaves exported only the entry
 * points the binary exports. Everything else lives in the shim. */
#include <stdint.h>

#include "ward_lv2_abi.h"

#define EXPORT __attribute__((visibility("default")))

/* Defined by the preload shim. */
extern const LV2_Descriptor *ward_preload_lv2_descriptor(uint64_t library, uint32_t index);
extern const LV2_Lib_Descriptor *ward_preload_lv2_lib_descriptor(uint64_t library);

static uint64_t library_id;

EXPORT void ward_proxy_bind(uint64_t library) { library_id = library; }

EXPORT const LV2_Descriptor *lv2_descriptor(uint32_t index) { return ward_preload_lv2_descriptor(library_id, index); }

/* The binary in its domain has the bundle path and features of its own opening; the host's are not needed. */
EXPORT const LV2_Lib_Descriptor *lv2_lib_descriptor(const char *bundle_path, const LV2_Feature *const *features) {
    (void)bundle_path;
    (void)features;
    return ward_preload_lv2_lib_descriptor(library_id);
}
