/*
 * lv2_faulty.c -- LV2 plugins that fail on purpose, one URI per way (bundle: extensions/lv2/lv2_faulty.lv2).
 *
 * Every plugin has ports 0 `in` (audio in), 1 `out` (audio out) and 2 `at_block` (control in, default 10); the two
 * atom ones also 3 `notify` (atom:Sequence out, lv2:connectionOptional so that hosts without atom ports, lv2apply,
 * load them). Blocks (run calls) are numbered from 0 since activation, each instance its own count. Before block
 * `at_block`, and after it where the process survives, a plugin is an identity (out[i] = in[i] exactly) and writes
 * an empty sequence to `notify` when the host connected one and offered urid:map (without the map it cannot name
 * the type and leaves the port alone). At block `at_block`:
 *
 *   urn:ward:lv2:faulty#crash           writes through NULL (SIGSEGV), before any output
 *   urn:ward:lv2:faulty#hang            loops forever, before any output
 *   urn:ward:lv2:faulty#abort           abort() (SIGABRT), before any output
 *   urn:ward:lv2:faulty#atom-overrun    writes atom:Int events into `notify` from its start until 16 MiB past the
 *                                       capacity the host set in its atom size, and a header claiming all of it
 *   urn:ward:lv2:faulty#atom-malformed  writes two atom:Int events out of time order (frame 5, then frame 1; only
 *                                       if they fit) and a header whose size claims 64 KiB more than it wrote
 *   urn:ward:lv2:faulty#work-crash      schedules work (the block number, a native uint32); `work` writes through
 *                                       NULL. Requires worker:schedule (instantiate returns NULL without it).
 *   urn:ward:lv2:faulty#save-crash      nothing: its state:interface `save` writes through NULL whenever it is
 *                                       called (`restore` succeeds and changes nothing); `at_block` is unused
 *
 * At the fault block the atom plugins write to whatever the host connected to `notify`, NULL included (a plugin
 * that ignores connectionOptional). lv2apply 0.24 lends that port a float of its own (it takes a port of a type it
 * does not know for a control port): the overrun runs off its heap (SIGSEGV), the malformed sequence overwrites the
 * 12 bytes after the float. urid:map is optional for all of them (without it the atom ones leave `notify` alone
 * before the fault block).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lv2_common.h"

#define FAULTY_URI "urn:ward:lv2:faulty"
#define OVERRUN_BYTES (16u * 1024u * 1024u)
#define MALFORMED_EXTRA (64u * 1024u)

enum mode { CRASH, HANG, ABORT, ATOM_OVERRUN, ATOM_MALFORMED, WORK_CRASH, SAVE_CRASH, MODE_COUNT };

enum faulty_port { FAULTY_IN, FAULTY_OUT, FAULTY_AT_BLOCK, FAULTY_NOTIFY, FAULTY_PORT_COUNT };

struct faulty {
    void *ports[FAULTY_PORT_COUNT];
    uint32_t port_count;
    enum mode mode;
    uint64_t blocks;
    const LV2_Worker_Schedule *schedule;
    LV2_URID sequence_type; /* 0 without urid:map */
    LV2_URID int_type;
};

static void write_null(void) {
    /* A volatile pointer variable: the compiler cannot see it is NULL. */
    volatile int *volatile p = NULL;
    *p = 1;
}

static void hang(void) {
    volatile unsigned long spins = 0;
    for (;;) {
        spins = spins + 1;
    }
}

/* One atom:Int event as it lies in a sequence: 16 bytes of event header, 4 of body, 4 of padding. */
struct int_event {
    int64_t frames;
    uint32_t size;
    uint32_t type;
    int32_t value;
    uint32_t pad;
};

static void write_event(volatile struct int_event *ev, int64_t frames, uint32_t type, int32_t value) {
    ev->frames = frames;
    ev->size = (uint32_t)sizeof(int32_t);
    ev->type = type;
    ev->value = value;
    ev->pad = 0;
}

/* Events from the start of the body until OVERRUN_BYTES past the capacity, and a header claiming them all. */
static void atom_overrun(struct faulty *faulty) {
    volatile LV2_Atom_Sequence *seq = faulty->ports[FAULTY_NOTIFY];
    uint64_t capacity = seq != NULL ? seq->atom.size : 0;
    uint64_t end = capacity + OVERRUN_BYTES;
    seq->atom.type = faulty->sequence_type;
    seq->atom.size = (uint32_t)(end > UINT32_MAX ? UINT32_MAX : end);
    seq->body.unit = 0;
    seq->body.pad = 0;
    volatile struct int_event *events = (volatile struct int_event *)(seq + 1);
    uint64_t count = (end - sizeof(LV2_Atom_Sequence_Body)) / sizeof(struct int_event) + 1;
    for (uint64_t i = 0; i < count; i++) {
        write_event(&events[i], 0, faulty->int_type, (int32_t)i);
    }
}

/* Two events out of time order, if they fit, and a header size 64 KiB beyond them. */
static void atom_malformed(struct faulty *faulty) {
    volatile LV2_Atom_Sequence *seq = faulty->ports[FAULTY_NOTIFY];
    uint32_t capacity = seq != NULL ? seq->atom.size : 0;
    uint32_t written = (uint32_t)sizeof(LV2_Atom_Sequence_Body);
    if (capacity >= written + 2 * sizeof(struct int_event)) {
        volatile struct int_event *events = (volatile struct int_event *)(seq + 1);
        write_event(&events[0], 5, faulty->int_type, 1);
        write_event(&events[1], 1, faulty->int_type, 2);
        written += 2 * (uint32_t)sizeof(struct int_event);
    }
    seq->atom.type = faulty->sequence_type;
    seq->atom.size = written + MALFORMED_EXTRA;
    seq->body.unit = 0;
    seq->body.pad = 0;
}

static const LV2_Descriptor descriptors[MODE_COUNT];

static LV2_Handle instantiate(const LV2_Descriptor *descriptor, double rate, const char *bundle_path,
                              const LV2_Feature *const *features) {
    (void)rate;
    (void)bundle_path;
    if (descriptor < descriptors || descriptor >= descriptors + MODE_COUNT) {
        return NULL;
    }
    enum mode mode = (enum mode)(descriptor - descriptors);
    const LV2_URID_Map *map = lv2_feature(features, WARD_LV2_URID_MAP);
    const LV2_Worker_Schedule *schedule = lv2_feature(features, WARD_LV2_WORKER_SCHEDULE);
    if (mode == WORK_CRASH && (schedule == NULL || schedule->schedule_work == NULL)) {
        return NULL;
    }
    struct faulty *faulty = calloc(1, sizeof *faulty);
    if (faulty == NULL) {
        return NULL;
    }
    faulty->mode = mode;
    faulty->port_count = mode == ATOM_OVERRUN || mode == ATOM_MALFORMED ? FAULTY_PORT_COUNT : FAULTY_NOTIFY;
    faulty->schedule = schedule;
    faulty->sequence_type = lv2_map(map, WARD_LV2_ATOM_SEQUENCE);
    faulty->int_type = lv2_map(map, WARD_LV2_ATOM_INT);
    return faulty;
}

static void connect_port(LV2_Handle handle, uint32_t port, void *data) {
    struct faulty *faulty = handle;
    if (port < faulty->port_count) {
        faulty->ports[port] = data;
    }
}

static void activate(LV2_Handle handle) {
    struct faulty *faulty = handle;
    faulty->blocks = 0;
}

static void run(LV2_Handle handle, uint32_t n) {
    struct faulty *faulty = handle;
    uint64_t number = faulty->blocks++;
    int due = number == lv2_block_number(lv2_control(faulty->ports[FAULTY_AT_BLOCK], 10.0f));
    int atom = faulty->mode == ATOM_OVERRUN || faulty->mode == ATOM_MALFORMED;
    if (due) {
        switch (faulty->mode) {
        case CRASH:
            write_null();
            break;
        case HANG:
            hang();
            break;
        case ABORT:
            abort();
        case ATOM_OVERRUN:
            atom_overrun(faulty);
            break;
        case ATOM_MALFORMED:
            atom_malformed(faulty);
            break;
        case WORK_CRASH: {
            uint32_t body = (uint32_t)number;
            (void)faulty->schedule->schedule_work(faulty->schedule->handle, sizeof body, &body);
            break;
        }
        case SAVE_CRASH:
        case MODE_COUNT:
            break;
        }
    } else if (atom && faulty->sequence_type != 0) {
        (void)lv2_sequence_begin(faulty->ports[FAULTY_NOTIFY], faulty->sequence_type);
    }
    const float *in = faulty->ports[FAULTY_IN];
    float *out = faulty->ports[FAULTY_OUT];
    for (uint32_t i = 0; i < n; i++) {
        out[i] = in[i];
    }
}

static LV2_Worker_Status work(LV2_Handle handle, LV2_Worker_Respond_Function respond,
                              LV2_Worker_Respond_Handle respond_handle, uint32_t size, const void *data) {
    (void)handle;
    (void)respond;
    (void)respond_handle;
    (void)size;
    (void)data;
    write_null();
    return LV2_WORKER_ERR_UNKNOWN;
}

static LV2_Worker_Status work_response(LV2_Handle handle, uint32_t size, const void *body) {
    (void)handle;
    (void)size;
    (void)body;
    return LV2_WORKER_SUCCESS;
}

static LV2_State_Status save(LV2_Handle handle, LV2_State_Store_Function store, LV2_State_Handle state,
                             uint32_t flags, const LV2_Feature *const *features) {
    (void)handle;
    (void)store;
    (void)state;
    (void)flags;
    (void)features;
    write_null();
    return LV2_STATE_ERR_UNKNOWN;
}

static LV2_State_Status restore(LV2_Handle handle, LV2_State_Retrieve_Function retrieve, LV2_State_Handle state,
                                uint32_t flags, const LV2_Feature *const *features) {
    (void)handle;
    (void)retrieve;
    (void)state;
    (void)flags;
    (void)features;
    return LV2_STATE_SUCCESS;
}

static const LV2_Worker_Interface worker_interface = {work, work_response, NULL};
static const LV2_State_Interface state_interface = {save, restore};

static const void *work_crash_extension_data(const char *uri) {
    return strcmp(uri, WARD_LV2_WORKER_INTERFACE) == 0 ? &worker_interface : NULL;
}

static const void *save_crash_extension_data(const char *uri) {
    return strcmp(uri, WARD_LV2_STATE_INTERFACE) == 0 ? &state_interface : NULL;
}

#define FAULTY_DESCRIPTOR(fragment, extension_data_function)                                                         \
    {                                                                                                                \
        .URI = FAULTY_URI "#" fragment, .instantiate = instantiate, .connect_port = connect_port,                    \
        .activate = activate, .run = run, .deactivate = lv2_deactivate_nothing, .cleanup = lv2_cleanup_free,         \
        .extension_data = extension_data_function,                                                                   \
    }

static const LV2_Descriptor descriptors[MODE_COUNT] = {
    [CRASH] = FAULTY_DESCRIPTOR("crash", lv2_no_extension_data),
    [HANG] = FAULTY_DESCRIPTOR("hang", lv2_no_extension_data),
    [ABORT] = FAULTY_DESCRIPTOR("abort", lv2_no_extension_data),
    [ATOM_OVERRUN] = FAULTY_DESCRIPTOR("atom-overrun", lv2_no_extension_data),
    [ATOM_MALFORMED] = FAULTY_DESCRIPTOR("atom-malformed", lv2_no_extension_data),
    [WORK_CRASH] = FAULTY_DESCRIPTOR("work-crash", work_crash_extension_data),
    [SAVE_CRASH] = FAULTY_DESCRIPTOR("save-crash", save_crash_extension_data),
};

LV2_EXPORT const LV2_Descriptor *lv2_descriptor(uint32_t index) {
    return index < MODE_COUNT ? &descriptors[index] : NULL;
}
