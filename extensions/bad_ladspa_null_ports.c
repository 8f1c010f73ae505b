/*
 * bad_ladspa_null_ports.c -- a LADSPA descriptor with two ports and NULL port
 * descriptor, name and hint arrays: a host reading a port dereferences NULL.
 */
#include "bad_ladspa.h"

BAD_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    if (index != 0)
        return NULL;
    bad_descriptor.PortDescriptors = NULL;
    bad_descriptor.PortNames = NULL;
    bad_descriptor.PortRangeHints = NULL;
    return &bad_descriptor;
}
