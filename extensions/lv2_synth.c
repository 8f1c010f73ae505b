/*
 * lv2_synth.c -- urn:ward:lv2:synth, a well-behaved LV2 instrument (bundle: extensions/lv2/lv2_synth.lv2).
 *
 * Ports: 0 `control` (atom:Sequence in, MIDI events; rsz:minimumSize 8192), 1 `out` (audio out), 2 `notify`
 * (atom:Sequence out). Requires urid:map (instantiate returns NULL without it).
 *
 * A sine per held note (one voice per note number, whatever the channel): note on (0x9n, velocity > 0) starts the
 * note's voice at phase 0 with amplitude 0.2 * velocity / 127, note off (0x8n, or 0x9n with velocity 0) ends it.
 * Frequencies are equal-tempered from A4 = 440 Hz. Events take effect at their frame offsets (times outside the
 * block or going backwards are clamped into it, in order), so output is event-accurate. Other events and MIDI
 * messages are ignored. The sine is computed without libm: the same input gives the same bits everywhere.
 *
 * Notifications: in every block that had at least one MIDI event, one atom:Int event at frame 0 holding the number
 * of notes held at the end of the block; otherwise an empty sequence. An event that does not fit the capacity the
 * host set in the port's atom size is dropped.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lv2_common.h"

#define SYNTH_URI "urn:ward:lv2:synth"
#define NOTES 128
#define AMPLITUDE 0.2f

enum synth_port { SYNTH_CONTROL, SYNTH_OUT, SYNTH_NOTIFY, SYNTH_PORT_COUNT };

struct voice {
    float amplitude; /* 0: not held */
    double phase;    /* turns, [0, 1) */
};

struct synth {
    void *ports[SYNTH_PORT_COUNT];
    double rate;
    LV2_URID sequence_type;
    LV2_URID midi_type;
    LV2_URID int_type;
    uint32_t held;
    struct voice voices[NOTES];
};

/* 2^(k/12), k = 0..11. */
static const double SEMITONE[12] = {
    1.0,
    1.0594630943592953,
    1.122462048309373,
    1.189207115002721,
    1.2599210498948732,
    1.3348398541700344,
    1.4142135623730951,
    1.4983070768766815,
    1.5874010519681994,
    1.681792830507429,
    1.7817974362806785,
    1.887748625363387,
};

/* The note's frequency in turns per sample, below Nyquist. */
static double step_of(const struct synth *synth, unsigned note) {
    unsigned semis = note + 120u - 69u; /* >= 51 for note >= 0 */
    double frequency = 440.0 * SEMITONE[semis % 12u];
    for (int octave = (int)(semis / 12u) - 10; octave > 0; octave--) {
        frequency *= 2.0;
    }
    for (int octave = (int)(semis / 12u) - 10; octave < 0; octave++) {
        frequency *= 0.5;
    }
    double step = frequency / synth->rate;
    return step < 0.5 ? step : 0.0;
}

static LV2_Handle instantiate(const LV2_Descriptor *descriptor, double rate, const char *bundle_path,
                              const LV2_Feature *const *features) {
    (void)descriptor;
    (void)bundle_path;
    const LV2_URID_Map *map = lv2_feature(features, WARD_LV2_URID_MAP);
    if (map == NULL || map->map == NULL || !(rate >= 1.0)) {
        return NULL;
    }
    struct synth *synth = calloc(1, sizeof *synth);
    if (synth == NULL) {
        return NULL;
    }
    synth->rate = rate;
    synth->sequence_type = lv2_map(map, WARD_LV2_ATOM_SEQUENCE);
    synth->midi_type = lv2_map(map, WARD_LV2_MIDI_EVENT);
    synth->int_type = lv2_map(map, WARD_LV2_ATOM_INT);
    return synth;
}

static void connect_port(LV2_Handle handle, uint32_t port, void *data) {
    struct synth *synth = handle;
    if (port < SYNTH_PORT_COUNT) {
        synth->ports[port] = data;
    }
}

static void activate(LV2_Handle handle) {
    struct synth *synth = handle;
    memset(synth->voices, 0, sizeof synth->voices);
    synth->held = 0;
}

/* Writes frames [from, to) of the held voices. */
static void render(struct synth *synth, float *out, uint32_t from, uint32_t to) {
    for (uint32_t i = from; i < to; i++) {
        out[i] = 0.0f;
    }
    if (synth->held == 0) {
        return;
    }
    for (unsigned note = 0; note < NOTES; note++) {
        struct voice *voice = &synth->voices[note];
        if (voice->amplitude == 0.0f) {
            continue;
        }
        double step = step_of(synth, note);
        for (uint32_t i = from; i < to; i++) {
            out[i] += voice->amplitude * (float)lv2_sin_turns(voice->phase);
            voice->phase += step;
            if (voice->phase >= 1.0) {
                voice->phase -= 1.0;
            }
        }
    }
}

static void midi(struct synth *synth, const uint8_t *message, uint32_t size) {
    if (size < 3) {
        return;
    }
    uint8_t status = message[0] & 0xf0u;
    unsigned note = message[1] & 0x7fu;
    unsigned velocity = message[2] & 0x7fu;
    struct voice *voice = &synth->voices[note];
    int was_held = voice->amplitude != 0.0f;
    if (status == 0x90u && velocity > 0) {
        voice->amplitude = AMPLITUDE * (float)velocity / 127.0f;
        voice->phase = 0.0;
        synth->held += was_held ? 0 : 1;
    } else if (status == 0x80u || status == 0x90u) {
        voice->amplitude = 0.0f;
        synth->held -= was_held ? 1 : 0;
    }
}

static void run(LV2_Handle handle, uint32_t n) {
    struct synth *synth = handle;
    const LV2_Atom_Sequence *events = synth->ports[SYNTH_CONTROL];
    float *out = synth->ports[SYNTH_OUT];
    struct lv2_sequence_writer notify = lv2_sequence_begin(synth->ports[SYNTH_NOTIFY], synth->sequence_type);

    uint32_t done = 0;
    int had_midi = 0;
    if (events != NULL && events->atom.type == synth->sequence_type &&
        events->atom.size >= sizeof(LV2_Atom_Sequence_Body)) {
        uint32_t events_size = events->atom.size - (uint32_t)sizeof(LV2_Atom_Sequence_Body);
        uint32_t offset = 0;
        const LV2_Atom_Event *ev;
        while ((ev = lv2_sequence_event(events, events_size, &offset)) != NULL) {
            if (ev->body.type != synth->midi_type) {
                continue;
            }
            int64_t at = ev->time.frames;
            uint32_t frame = at < (int64_t)done ? done : at > (int64_t)n ? n : (uint32_t)at;
            render(synth, out, done, frame);
            done = frame;
            midi(synth, (const uint8_t *)(ev + 1), ev->body.size);
            had_midi = 1;
        }
    }
    render(synth, out, done, n);
    if (had_midi) {
        lv2_sequence_append_int(&notify, 0, synth->int_type, (int32_t)synth->held);
    }
}

static const LV2_Descriptor descriptor = {
    .URI = SYNTH_URI,
    .instantiate = instantiate,
    .connect_port = connect_port,
    .activate = activate,
    .run = run,
    .deactivate = lv2_deactivate_nothing,
    .cleanup = lv2_cleanup_free,
    .extension_data = lv2_no_extension_data,
};

LV2_EXPORT const LV2_Descriptor *lv2_descriptor(uint32_t index) {
    return index == 0 ? &descriptor : NULL;
}
