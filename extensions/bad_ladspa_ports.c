/*
 * bad_ladspa_ports.c -- a LADSPA descriptor claiming a billion ports while its
 * port arrays hold two: a host walking the ports reads far past them.
 */
#include "bad_ladspa.h"

BAD_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    if (index != 0)
        return NULL;
    bad_descriptor.PortCount = 1000000000UL;
    return &bad_descriptor;
}
