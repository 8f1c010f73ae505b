/*
 * bad_ladspa_wild.c -- a LADSPA library whose ladspa_descriptor(0) returns a
 * wild pointer (into the never-mapped first page): reading the descriptor
 * faults.
 */
#include <stdint.h>

#include "bad_ladspa.h"

BAD_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    (void)bad_descriptor;
    return index == 0 ? (const LADSPA_Descriptor *)(uintptr_t)0x38 : NULL;
}
