/*
 * bad_ladspa_unterminated.c -- a LADSPA descriptor whose name has no NUL: a
 * page of 'A's followed by an inaccessible page, so reading the name to its end
 * faults.
 */
#define _GNU_SOURCE
#include <sys/mman.h>
#include <unistd.h>

#include "bad_ladspa.h"

BAD_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    if (index != 0)
        return NULL;
    static char *name;
    if (name == NULL) {
        long page = sysconf(_SC_PAGESIZE);
        char *pages = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (pages == MAP_FAILED)
            return NULL;
        memset(pages, 'A', (size_t)page);
        /* The page after the name: any read of it faults. */
        if (mprotect(pages + page, (size_t)page, PROT_NONE) != 0)
            return NULL;
        name = pages;
    }
    bad_descriptor.Name = name;
    return &bad_descriptor;
}
