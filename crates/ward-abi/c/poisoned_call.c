/* ward_call_poisoned for Rust callers (ward-abi's `call_native_poisoned`): the same code the class adapters use, from
 * the same header, so a generic extension and a plugin are called the same way. */
#include "ward_poisoned_call.h"
