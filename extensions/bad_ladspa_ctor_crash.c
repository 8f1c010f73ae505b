/*
 * bad_ladspa_ctor_crash.c -- a LADSPA library whose constructor dereferences
 * NULL: it dies of SIGSEGV the moment it is loaded, before any LADSPA call.
 */
#include "bad_ladspa.h"

/* NULL, read at run time: a constant NULL would let the compiler drop the store (and the constructor with it). */
static int *volatile bad_nowhere;

__attribute__((constructor)) static void bad_crash_on_load(void) { *bad_nowhere = 1; }

BAD_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    return index == 0 ? &bad_descriptor : NULL;
}
