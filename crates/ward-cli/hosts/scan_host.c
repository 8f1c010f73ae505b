/* A host that scans before it works, as many audio hosts do at start: it opens every LADSPA library in a directory,
 * reads every plugin's description (printing a line per plugin and per port), closes the library, and then processes
 * one second of audio (48 kHz, a 440 Hz sine) through one plugin, block by block, writing the output samples as raw
 * floats. Used by `ward bench scan` and the tests of scanning under `ward run`.
 *
 * Built by the bench and the tests with the LADSPA declarations of the workspace (include/).
 *
 * usage: scan_host DIR LIBRARY LABEL OUT [CONTROL]
 * Every control input of the plugin is set to CONTROL (default 0.5); control outputs get a place to write to. */
#include <dirent.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ward_ladspa_abi.h"

#define IS(port, kind) ((port) & LADSPA_PORT_##kind)

#define RATE 48000
#define BLOCK 1024

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static int is_library(const struct dirent *e) {
    size_t n = strlen(e->d_name);
    return n > 3 && strcmp(e->d_name + n - 3, ".so") == 0;
}

/* Print what a host reads of every plugin of one library; the number of plugins, or -1 when it is no library. */
static int scan(const char *path) {
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        printf("%s: cannot open: %s\n", path, dlerror());
        return -1;
    }
    LADSPA_Descriptor_Function fn = (LADSPA_Descriptor_Function)dlsym(dl, "ladspa_descriptor");
    int count = 0;
    if (fn != NULL) {
        const LADSPA_Descriptor *d;
        for (unsigned long i = 0; (d = fn(i)) != NULL; i++, count++) {
            printf("%s #%lu %lu %s \"%s\" by %s (%s), properties %d, %lu ports\n", path, i, d->UniqueID, d->Label,
                   d->Name, d->Maker, d->Copyright, d->Properties, d->PortCount);
            for (unsigned long p = 0; p < d->PortCount; p++) {
                const LADSPA_PortRangeHint *h = &d->PortRangeHints[p];
                /* A bound is printed only where the hint says there is one (elsewhere a plugin may leave it
                 * uninitialised). */
                printf("  port %lu \"%s\" %d hint %d", p, d->PortNames[p], d->PortDescriptors[p], h->HintDescriptor);
                if (h->HintDescriptor & LADSPA_HINT_BOUNDED_BELOW)
                    printf(" from %g", h->LowerBound);
                if (h->HintDescriptor & LADSPA_HINT_BOUNDED_ABOVE)
                    printf(" to %g", h->UpperBound);
                printf("\n");
            }
        }
    }
    dlclose(dl);
    return count;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s DIR LIBRARY LABEL OUT [CONTROL]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1], *library = argv[2], *label = argv[3], *out_path = argv[4];
    float control = argc > 5 ? strtof(argv[5], NULL) : 0.5f;

    struct dirent **entries;
    int n = scandir(dir, &entries, is_library, by_name);
    if (n < 0) {
        perror(dir);
        return 1;
    }
    int plugins = 0;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, entries[i]->d_name);
        int count = scan(path);
        if (count > 0)
            plugins += count;
        free(entries[i]);
    }
    free(entries);
    printf("scanned %d libraries, %d plugins\n", n, plugins);

    void *dl = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    LADSPA_Descriptor_Function fn = (LADSPA_Descriptor_Function)dlsym(dl, "ladspa_descriptor");
    const LADSPA_Descriptor *d = NULL;
    for (unsigned long i = 0; fn != NULL && (d = fn(i)) != NULL; i++)
        if (strcmp(d->Label, label) == 0)
            break;
    if (d == NULL || d->run == NULL) {
        fprintf(stderr, "%s: no plugin labelled %s that can run\n", library, label);
        return 1;
    }
    LADSPA_Handle h = d->instantiate(d, RATE);
    if (h == NULL) {
        fprintf(stderr, "%s: instantiate failed\n", label);
        return 1;
    }
    float *buffers = calloc(d->PortCount * BLOCK, sizeof(float));
    if (buffers == NULL)
        return 1;
    for (unsigned long p = 0; p < d->PortCount; p++) {
        float *at = buffers + p * BLOCK;
        if (IS(d->PortDescriptors[p], CONTROL) && IS(d->PortDescriptors[p], INPUT))
            at[0] = control;
        d->connect_port(h, p, at);
    }
    if (d->activate)
        d->activate(h);
    FILE *out = fopen(out_path, "wb");
    if (out == NULL) {
        perror(out_path);
        return 1;
    }
    for (long done = 0; done < RATE; done += BLOCK) {
        long samples = RATE - done < BLOCK ? RATE - done : BLOCK;
        for (unsigned long p = 0; p < d->PortCount; p++)
            if (IS(d->PortDescriptors[p], AUDIO) && IS(d->PortDescriptors[p], INPUT))
                for (long s = 0; s < samples; s++)
                    buffers[p * BLOCK + s] = 0.5f * (float)sin(2.0 * M_PI * 440.0 * (double)(done + s) / RATE);
        d->run(h, (unsigned long)samples);
        for (unsigned long p = 0; p < d->PortCount; p++)
            if (IS(d->PortDescriptors[p], AUDIO) && IS(d->PortDescriptors[p], OUTPUT))
                fwrite(buffers + p * BLOCK, sizeof(float), (size_t)samples, out);
    }
    if (d->deactivate)
        d->deactivate(h);
    d->cleanup(h);
    free(buffers);
    dlclose(dl);
    return fclose(out) == 0 ? 0 : 1;
}
