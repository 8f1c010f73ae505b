/* The library a host gets from dlopen when it opens a LADSPA plugin under `ward run`. Each opened plugin gets its
 * own copy of this proxy (so that `ladspa_descriptor`, which takes no context, knows which plugin it stands for);
 * the shim binds the copy to its plugin with ward_proxy_bind right after loading it. Everything else lives in the
 * shim, which the host's process already has preloaded. */
#include <stdint.h>

#include "ward_ladspa_abi.h"

#define EXPORT __attribute__((visibility("default")))

/* Defined by the preload shim. */
extern const LADSPA_Descriptor *ward_preload_ladspa_descriptor(uint64_t library, unsigned long index);

static uint64_t library_id;

EXPORT void ward_proxy_bind(uint64_t library) { library_id = library; }

EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    return ward_preload_ladspa_descriptor(library_id, index);
}
