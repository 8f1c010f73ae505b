/* What a ward runtime gives the plugins linked into it, besides each other (a plugin calls another by its name,
 * declared as an external function) and the host's built-ins (declared the same way, by the names the host gave
 * them).
 *
 * The heap is the runtime's memory that outlives calls, shared by every plugin in the runtime: how they divide it
 * is theirs to agree on. After a failure it comes back as the runtime's last snapshot, or zeroed, as the policy's
 * checkpoint_ms says. A plugin's own global variables start afresh whenever it is linked again. */
#ifndef WARD_RUNTIME_H
#define WARD_RUNTIME_H
#include <stdint.h>
void *ward_heap(void);
uint64_t ward_heap_size(void);
#endif
