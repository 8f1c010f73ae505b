/*
 * bad_ladspa_ctor_hang.c -- a LADSPA library whose constructor never returns:
 * whoever loads it hangs in dlopen.
 */
#include "bad_ladspa.h"

__attribute__((constructor)) static void bad_hang_on_load(void) {
    /* volatile: the compiler may not assume the endless loop ends. */
    volatile int forever = 1;
    while (forever) {
    }
}

BAD_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    return index == 0 ? &bad_descriptor : NULL;
}
