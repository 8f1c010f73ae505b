/*
 * faulty_ladspa.c -- a LADSPA library whose plugins fail on command.
 *
 * Two plugins, each with a "Fault kind", a "Fault at block" and a "Repeat"
 * control input. Every run (or run_adding) call counts one block; the fault
 * fires when kind != 0 and the block count equals "Fault at block", or is at
 * least that with "Repeat" on, or on every block when "Fault at block" is 0.
 * Except for OVERRUN it fires before any output is written.
 *
 *   index 0  faulty_amp  (4950001)  Output = Input * Gain; "Blocks" reports
 *                                   the number of blocks run so far
 *   index 1  faulty_tone (4950002)  a full-scale sine of "Frequency" Hz
 *
 * Fault kinds (numbers as in faulty.c; the kinds faulty.c has but that make
 * no sense here, 2 and 7..11, do nothing):
 *    1 NULL_DEREF     write through a NULL pointer             -> SIGSEGV
 *    3 ABORT          abort()                                  -> SIGABRT
 *    4 EXIT3          exit(3)
 *    5 INFINITE_LOOP  spin forever
 *    6 RECURSION      unbounded recursion                      -> stack overflow
 *   12 DIV_ZERO       integer division by zero                 -> SIGFPE
 *   13 ILLEGAL        __builtin_trap()                         -> SIGILL
 *   20 OVERRUN        write the output, then 64 KiB of floats past its end
 *                     (SIGSEGV when the buffer ends at a guard page)
 *   21 NAN            every output sample is NaN
 *   22 HOST_WRITE     write a byte of the host's PATH back unchanged
 *                     (SIGSEGV in an mpk domain only; harmless elsewhere)
 * Any other kind does nothing.
 *
 * Self-contained (no libm; shared helpers are header-only, in faulty_common.h):
 * each extension is one shared object. Built with -fvisibility=hidden: only ladspa_descriptor
 * is exported.
 */
#include <math.h> /* NAN only: a constant, no libm import */
#include <stddef.h>
#include <stdint.h>

#include "faulty_common.h"

#include "ward_ladspa_abi.h"

#define FAULTY_EXPORT __attribute__((visibility("default")))


#define OVERRUN_VALUE 1.0e30f /* loud enough to spot in a buffer that survives */

/* ---- the faults ---------------------------------------------------------- */

/* Writes OVERRUN_BYTES of floats starting at `end`, one past the buffer. */
static void overrun(LADSPA_Data *end) {
    volatile LADSPA_Data *p = end;
    for (size_t i = 0; i < OVERRUN_BYTES / sizeof *p; i++) {
        p[i] = OVERRUN_VALUE;
    }
}

/* ---- control values ------------------------------------------------------ */

/* Hosts must connect every port; an unconnected control reads as its default. */
static LADSPA_Data control(const LADSPA_Data *port, LADSPA_Data fallback) {
    return port != NULL ? *port : fallback;
}

/* ---- instances (shared by both plugins) --------------------------------- */

enum amp_port {
    AMP_INPUT,
    AMP_OUTPUT,
    AMP_GAIN,
    AMP_KIND,
    AMP_AT,
    AMP_REPEAT,
    AMP_BLOCKS,
    AMP_PORT_COUNT,
};

enum tone_port {
    TONE_OUTPUT,
    TONE_FREQUENCY,
    TONE_KIND,
    TONE_AT,
    TONE_REPEAT,
    TONE_PORT_COUNT,
};

#define MAX_PORTS AMP_PORT_COUNT
_Static_assert((int)TONE_PORT_COUNT <= (int)MAX_PORTS, "every plugin's ports fit an instance");

struct instance {
    LADSPA_Data *ports[MAX_PORTS];
    unsigned long port_count;
    unsigned long sample_rate;
    LADSPA_Data adding_gain;
    uint64_t blocks; /* run and run_adding calls since activate */
    double phase;    /* tone only: in turns, [0, 1) */
};

static LADSPA_Handle instantiate(const LADSPA_Descriptor *descriptor, unsigned long sample_rate) {
    /* The tone divides by the rate; refusing 0 keeps that finite. */
    if (descriptor == NULL || sample_rate == 0) {
        return NULL;
    }
    struct instance *inst = calloc(1, sizeof *inst);
    if (inst == NULL) {
        return NULL;
    }
    inst->port_count = descriptor->PortCount;
    inst->sample_rate = sample_rate;
    inst->adding_gain = 1.0f;
    return inst;
}

static void connect_port(LADSPA_Handle handle, unsigned long port, LADSPA_Data *location) {
    struct instance *inst = handle;
    if (port < inst->port_count) {
        inst->ports[port] = location;
    }
}

static void activate(LADSPA_Handle handle) {
    struct instance *inst = handle;
    inst->blocks = 0;
    inst->phase = 0.0;
}

static void set_run_adding_gain(LADSPA_Handle handle, LADSPA_Data gain) {
    struct instance *inst = handle;
    inst->adding_gain = gain;
}

static void deactivate(LADSPA_Handle handle) {
    (void)handle;
}

static void cleanup(LADSPA_Handle handle) {
    free(handle);
}

/*
 * Counts the block and performs a due crash. Returns the kind if a fault that
 * the caller carries out (OVERRUN, NAN) is due, FAULT_NONE otherwise.
 */
static long begin_block(struct instance *inst, int kind_port, int at_port, int repeat_port) {
    inst->blocks++;
    long kind = to_kind(control(inst->ports[kind_port], 0.0f));
    uint64_t at = to_count(control(inst->ports[at_port], 1.0f));
    int repeat = control(inst->ports[repeat_port], 0.0f) >= 0.5f;
    if (!fault_due(kind, inst->blocks, at, repeat)) {
        return FAULT_NONE;
    }
    crash(kind);
    return kind == FAULT_OVERRUN || kind == FAULT_NAN ? kind : FAULT_NONE;
}

/* ---- faulty_amp ----------------------------------------------------------- */

static void amp_process(LADSPA_Handle handle, unsigned long n, int adding) {
    struct instance *inst = handle;
    long fault = begin_block(inst, AMP_KIND, AMP_AT, AMP_REPEAT);
    const LADSPA_Data *in = inst->ports[AMP_INPUT];
    LADSPA_Data *out = inst->ports[AMP_OUTPUT];
    LADSPA_Data gain = control(inst->ports[AMP_GAIN], 1.0f);
    if (adding) {
        gain *= inst->adding_gain;
    }

    /* Element by element, so in-place (in == out) works. */
    for (unsigned long i = 0; i < n; i++) {
        if (fault == FAULT_NAN) {
            out[i] = NAN;
        } else if (adding) {
            out[i] += in[i] * gain;
        } else {
            out[i] = in[i] * gain;
        }
    }
    if (fault == FAULT_OVERRUN) {
        overrun(out + n);
    }
    if (inst->ports[AMP_BLOCKS] != NULL) {
        *inst->ports[AMP_BLOCKS] = (LADSPA_Data)inst->blocks;
    }
}

static void amp_run(LADSPA_Handle handle, unsigned long n) {
    amp_process(handle, n, 0);
}

static void amp_run_adding(LADSPA_Handle handle, unsigned long n) {
    amp_process(handle, n, 1);
}

static const LADSPA_PortDescriptor amp_port_descriptors[AMP_PORT_COUNT] = {
    [AMP_INPUT] = LADSPA_PORT_INPUT | LADSPA_PORT_AUDIO,
    [AMP_OUTPUT] = LADSPA_PORT_OUTPUT | LADSPA_PORT_AUDIO,
    [AMP_GAIN] = LADSPA_PORT_INPUT | LADSPA_PORT_CONTROL,
    [AMP_KIND] = LADSPA_PORT_INPUT | LADSPA_PORT_CONTROL,
    [AMP_AT] = LADSPA_PORT_INPUT | LADSPA_PORT_CONTROL,
    [AMP_REPEAT] = LADSPA_PORT_INPUT | LADSPA_PORT_CONTROL,
    [AMP_BLOCKS] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,
};

static const char *const amp_port_names[AMP_PORT_COUNT] = {
    [AMP_INPUT] = "Input",
    [AMP_OUTPUT] = "Output",
    [AMP_GAIN] = "Gain",
    [AMP_KIND] = "Fault kind",
    [AMP_AT] = "Fault at block",
    [AMP_REPEAT] = "Repeat",
    [AMP_BLOCKS] = "Blocks",
};

#define BOUNDED (LADSPA_HINT_BOUNDED_BELOW | LADSPA_HINT_BOUNDED_ABOVE)
#define KIND_HINT {BOUNDED | LADSPA_HINT_INTEGER | LADSPA_HINT_DEFAULT_0, 0.0f, 21.0f}
#define AT_HINT {BOUNDED | LADSPA_HINT_INTEGER | LADSPA_HINT_DEFAULT_1, 0.0f, 1000000.0f}
#define REPEAT_HINT {LADSPA_HINT_TOGGLED | LADSPA_HINT_DEFAULT_0, 0.0f, 0.0f}

static const LADSPA_PortRangeHint amp_port_hints[AMP_PORT_COUNT] = {
    [AMP_INPUT] = {0, 0.0f, 0.0f},
    [AMP_OUTPUT] = {0, 0.0f, 0.0f},
    [AMP_GAIN] = {BOUNDED | LADSPA_HINT_DEFAULT_1, 0.0f, 10.0f},
    [AMP_KIND] = KIND_HINT,
    [AMP_AT] = AT_HINT,
    [AMP_REPEAT] = REPEAT_HINT,
    [AMP_BLOCKS] = {LADSPA_HINT_INTEGER, 0.0f, 0.0f},
};

static const LADSPA_Descriptor amp_descriptor = {
    .UniqueID = 4950001,
    .Label = "faulty_amp",
    .Properties = 0,
    .Name = "ward faulty amplifier",
    .Maker = "ward",
    .Copyright = "None",
    .PortCount = AMP_PORT_COUNT,
    .PortDescriptors = amp_port_descriptors,
    .PortNames = amp_port_names,
    .PortRangeHints = amp_port_hints,
    .ImplementationData = NULL,
    .instantiate = instantiate,
    .connect_port = connect_port,
    .activate = activate,
    .run = amp_run,
    .run_adding = amp_run_adding,
    .set_run_adding_gain = set_run_adding_gain,
    .deactivate = deactivate,
    .cleanup = cleanup,
};

/* ---- faulty_tone ---------------------------------------------------------- */

/* sin(2 pi turns) for turns in [0, 1), without libm: fold into a quarter
 * wave, then a Taylor polynomial (error below 1e-7 there). */
static double sin_turns(double turns) {
    double x = turns > 0.5 ? turns - 1.0 : turns; /* [-0.5, 0.5] */
    if (x > 0.25) {
        x = 0.5 - x;
    } else if (x < -0.25) {
        x = -0.5 - x;
    }
    double t = 6.283185307179586 * x; /* [-pi/2, pi/2] */
    double t2 = t * t;
    return t * (1.0 + t2 / -6.0 *
                          (1.0 + t2 / -20.0 *
                                     (1.0 + t2 / -42.0 *
                                                (1.0 + t2 / -72.0 * (1.0 + t2 / -110.0 * (1.0 + t2 / -156.0))))));
}

static void tone_process(LADSPA_Handle handle, unsigned long n, int adding) {
    struct instance *inst = handle;
    long fault = begin_block(inst, TONE_KIND, TONE_AT, TONE_REPEAT);
    LADSPA_Data *out = inst->ports[TONE_OUTPUT];
    double step = (double)control(inst->ports[TONE_FREQUENCY], 440.0f) / (double)inst->sample_rate;
    /* Up to Nyquist; at most one wrap per sample keeps the phase in [0, 1). */
    if (!(step >= 0.0)) {
        step = 0.0;
    } else if (step > 0.5) {
        step = 0.5;
    }

    for (unsigned long i = 0; i < n; i++) {
        LADSPA_Data s = (LADSPA_Data)sin_turns(inst->phase);
        inst->phase += step;
        if (inst->phase >= 1.0) {
            inst->phase -= 1.0;
        }
        if (fault == FAULT_NAN) {
            out[i] = NAN;
        } else if (adding) {
            out[i] += s * inst->adding_gain;
        } else {
            out[i] = s;
        }
    }
    if (fault == FAULT_OVERRUN) {
        overrun(out + n);
    }
}

static void tone_run(LADSPA_Handle handle, unsigned long n) {
    tone_process(handle, n, 0);
}

static void tone_run_adding(LADSPA_Handle handle, unsigned long n) {
    tone_process(handle, n, 1);
}

static const LADSPA_PortDescriptor tone_port_descriptors[TONE_PORT_COUNT] = {
    [TONE_OUTPUT] = LADSPA_PORT_OUTPUT | LADSPA_PORT_AUDIO,
    [TONE_FREQUENCY] = LADSPA_PORT_INPUT | LADSPA_PORT_CONTROL,
    [TONE_KIND] = LADSPA_PORT_INPUT | LADSPA_PORT_CONTROL,
    [TONE_AT] = LADSPA_PORT_INPUT | LADSPA_PORT_CONTROL,
    [TONE_REPEAT] = LADSPA_PORT_INPUT | LADSPA_PORT_CONTROL,
};

static const char *const tone_port_names[TONE_PORT_COUNT] = {
    [TONE_OUTPUT] = "Output",
    [TONE_FREQUENCY] = "Frequency",
    [TONE_KIND] = "Fault kind",
    [TONE_AT] = "Fault at block",
    [TONE_REPEAT] = "Repeat",
};

static const LADSPA_PortRangeHint tone_port_hints[TONE_PORT_COUNT] = {
    [TONE_OUTPUT] = {0, 0.0f, 0.0f},
    [TONE_FREQUENCY] = {BOUNDED | LADSPA_HINT_DEFAULT_440, 1.0f, 20000.0f},
    [TONE_KIND] = KIND_HINT,
    [TONE_AT] = AT_HINT,
    [TONE_REPEAT] = REPEAT_HINT,
};

static const LADSPA_Descriptor tone_descriptor = {
    .UniqueID = 4950002,
    .Label = "faulty_tone",
    .Properties = 0,
    .Name = "ward faulty tone generator",
    .Maker = "ward",
    .Copyright = "None",
    .PortCount = TONE_PORT_COUNT,
    .PortDescriptors = tone_port_descriptors,
    .PortNames = tone_port_names,
    .PortRangeHints = tone_port_hints,
    .ImplementationData = NULL,
    .instantiate = instantiate,
    .connect_port = connect_port,
    .activate = activate,
    .run = tone_run,
    .run_adding = tone_run_adding,
    .set_run_adding_gain = set_run_adding_gain,
    .deactivate = deactivate,
    .cleanup = cleanup,
};

/* ---- entry point ---------------------------------------------------------- */

/*
 * Set by an initialiser when the library is loaded, as many real plugins build
 * their descriptors; a test traps faulty_ladspa_loaded to stand for a plugin
 * whose initialiser crashes. No descriptor without it.
 */
static int loaded;

__attribute__((constructor)) static void faulty_ladspa_loaded(void) {
    loaded = 1;
}

FAULTY_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    if (!loaded) {
        return NULL;
    }
    switch (index) {
    case 0:
        return &amp_descriptor;
    case 1:
        return &tone_descriptor;
    default:
        return NULL;
    }
}
