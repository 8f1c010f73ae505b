/*
 * lv2_common.h -- what the built-in LV2 plugins (extensions/lv2_*.c) share: the export attribute, finding a host
 * feature, reading and writing atom sequences within the sizes the host gave, and a sine without libm. Header-only
 * (static functions), so each plugin stays one self-contained shared object.
 */
#ifndef LV2_COMMON_H
#define LV2_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ward_lv2_abi.h"

/* Built with -fvisibility=hidden: only what carries this is exported. */
#define LV2_EXPORT __attribute__((visibility("default")))

/* The data of the host feature `uri`, NULL when the host does not offer it (a NULL list offers nothing). */
static inline void *lv2_feature(const LV2_Feature *const *features, const char *uri) {
    if (features == NULL) {
        return NULL;
    }
    for (size_t i = 0; features[i] != NULL; i++) {
        if (features[i]->URI != NULL && strcmp(features[i]->URI, uri) == 0) {
            return features[i]->data;
        }
    }
    return NULL;
}

/* The descriptor entries of a plugin with nothing to undo at deactivation, an instance that is one allocation,
 * or no extension data. */
static inline void lv2_deactivate_nothing(LV2_Handle handle) {
    (void)handle;
}

static inline void lv2_cleanup_free(LV2_Handle handle) {
    free(handle);
}

static inline const void *lv2_no_extension_data(const char *uri) {
    (void)uri;
    return NULL;
}

/* `uri` mapped through the host's map; 0 (no URID) without one. */
static inline LV2_URID lv2_map(const LV2_URID_Map *map, const char *uri) {
    return map != NULL && map->map != NULL ? map->map(map->handle, uri) : 0;
}

/* Atom bodies and events are padded to 8 bytes. */
static inline uint32_t lv2_pad8(uint32_t size) {
    return (size + 7u) & ~7u;
}

/*
 * Walks the events of an input sequence without trusting it: every event must lie wholly inside the size the
 * sequence's header claims, which the caller has bounded by the buffer's capacity. Returns the next event after
 * `offset` (bytes from the start of the sequence body's events), or NULL at the end or at the first event that does
 * not fit.
 */
static inline const LV2_Atom_Event *lv2_sequence_event(const LV2_Atom_Sequence *seq, uint32_t events_size,
                                                       uint32_t *offset) {
    const uint8_t *events = (const uint8_t *)(seq + 1);
    if (*offset > events_size || events_size - *offset < sizeof(LV2_Atom_Event)) {
        return NULL;
    }
    const LV2_Atom_Event *ev = (const LV2_Atom_Event *)(events + *offset);
    uint32_t rest = events_size - *offset - (uint32_t)sizeof(LV2_Atom_Event);
    if (ev->body.size > rest) {
        return NULL;
    }
    uint32_t step = (uint32_t)sizeof(LV2_Atom_Event) + lv2_pad8(ev->body.size);
    *offset = step > events_size - *offset ? events_size : *offset + step;
    return ev;
}

/*
 * An output sequence being written: the host sets the port's atom size to the capacity of the body before each run;
 * events that would not fit are dropped, as LV2's atom forge does.
 */
struct lv2_sequence_writer {
    LV2_Atom_Sequence *seq;
    uint32_t capacity; /* bytes of body the host lent (the header's size before the run) */
};

/* Starts an empty sequence of frame-time events in `seq` (NULL: nothing is written). */
static inline struct lv2_sequence_writer lv2_sequence_begin(LV2_Atom_Sequence *seq, LV2_URID sequence_type) {
    struct lv2_sequence_writer w = {seq, 0};
    if (seq == NULL) {
        return w;
    }
    w.capacity = seq->atom.size;
    if (w.capacity < sizeof(LV2_Atom_Sequence_Body)) {
        /* Not even room for an empty sequence: leave the buffer as the host set it. */
        w.seq = NULL;
        return w;
    }
    seq->atom.type = sequence_type;
    seq->atom.size = (uint32_t)sizeof(LV2_Atom_Sequence_Body);
    seq->body.unit = 0;
    seq->body.pad = 0;
    return w;
}

/* Appends an atom:Int event at `frames`; returns 0 when it did not fit. */
static inline int lv2_sequence_append_int(struct lv2_sequence_writer *w, int64_t frames, LV2_URID int_type,
                                          int32_t value) {
    if (w->seq == NULL) {
        return 0;
    }
    uint32_t size = (uint32_t)sizeof(LV2_Atom_Event) + lv2_pad8((uint32_t)sizeof(int32_t));
    if (w->seq->atom.size > w->capacity || w->capacity - w->seq->atom.size < size) {
        return 0;
    }
    uint8_t *at = (uint8_t *)&w->seq->body + w->seq->atom.size;
    LV2_Atom_Event *ev = (LV2_Atom_Event *)at;
    ev->time.frames = frames;
    ev->body.size = (uint32_t)sizeof(int32_t);
    ev->body.type = int_type;
    memcpy(ev + 1, &value, sizeof value);
    memset((uint8_t *)(ev + 1) + sizeof value, 0, size - sizeof(LV2_Atom_Event) - sizeof value);
    w->seq->atom.size += size;
    return 1;
}

/*
 * sin(2 pi turns) for turns in [0, 1), without libm: folded into a quarter wave, then a Taylor polynomial (error
 * below 1e-7 there). Deterministic: the same turns give the same bits everywhere.
 */
static inline double lv2_sin_turns(double turns) {
    double x = turns > 0.5 ? turns - 1.0 : turns; /* [-0.5, 0.5] */
    if (x > 0.25) {
        x = 0.5 - x;
    } else if (x < -0.25) {
        x = -0.5 - x;
    }
    double t = 6.283185307179586 * x; /* [-pi/2, pi/2] */
    double t2 = t * t;
    double sum = 1.0;
    /* Horner over t^2, from the t^13 term down to t. */
    for (int k = 12; k >= 2; k -= 2) {
        sum = 1.0 - t2 / (double)(k * (k + 1)) * sum;
    }
    return t * sum;
}

/* A control input's value: the default when the host connected nothing (hosts must, but some do not). */
static inline float lv2_control(const float *port, float fallback) {
    return port != NULL ? *port : fallback;
}

/* A block number from a control value: NaN, negative and absurd values never come. */
static inline uint64_t lv2_block_number(float value) {
    if (!(value >= 0.0f && value < 1.0e15f)) {
        return UINT64_MAX;
    }
    return (uint64_t)value;
}

#endif
