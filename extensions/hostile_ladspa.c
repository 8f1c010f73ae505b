/*
 * hostile_ladspa.c -- a LADSPA plugin that attacks its host: what a process domain's sandbox must hold.
 *
 * One mono plugin, label "hostile" (4950004): audio in, audio out, control in "Attack". run() copies the input to
 * the output unchanged (so a run whose attack failed, and one where ward bypassed the plugin, both give the input),
 * and on its first call in each process it performs the attack the control selects, ignoring whether it worked.
 * The host is the process the command line's `--parent` names (ward-domain's), else the first ancestor that is not
 * a ward-domain process (the domain's parent, or the parent of its zygote); natively it is the plugin's own
 * process's parent.
 *
 *    0  nothing
 *    1  write int3 over the host's code through /proc/HOST/mem
 *    2  ptrace the host (PTRACE_SEIZE, then detach)
 *    3  kill(host, SIGKILL)
 *    4  SIGKILL every sibling domain (ward-domain processes of the same host)
 *    5  pidfd_getfd the host's descriptors 1..64, write "PWNED" into its files and pipes
 *    6  reopen /proc/HOST/fd/1..64 for writing, write "PWNED" into its files and pipes
 *    7  write "PWNED" to this process's standard output
 *    8  fork 20 children that setsid and sleep 30 s (found by WARD_HOSTILE_TOKEN in their environment)
 *    9  fork and exec /bin/sh: echo PWNED > $WARD_HOSTILE_DIR/sh-ran
 *   10  connect to 127.0.0.1:$WARD_HOSTILE_PORT and send "PWNED"
 *   11  create /dev/shm/ward-hostile-$WARD_HOSTILE_TOKEN-shm and /tmp/ward-hostile-$WARD_HOSTILE_TOKEN-tmp
 *   12  memfd_create, ftruncate to 1 GiB, write 8 MiB
 *   13  exec /bin/sh in place of this process (the command of 9)
 *   14  look for the host (/proc/HOST, kill(HOST, 0)), say on standard error what was found, kill it if found
 *   15  overwrite every memfd it holds but its rings with "PWNED", mapped shared and writable (those with a
 *       read-only descriptor reopened read-write through /proc/self/fd)
 *
 * Built with -fvisibility=hidden: only ladspa_descriptor is exported.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "hostile_common.h"

#include "ward_ladspa_abi.h"

#define HOSTILE_EXPORT __attribute__((visibility("default")))

/* The shell command of attacks 9 and 13: leaves a file the test looks for. */
#define SH_COMMAND "echo PWNED > \"$WARD_HOSTILE_DIR/sh-ran\""

/* Creates /DIR/ward-hostile-TOKEN-SUFFIX (attack 11); nothing without a token. */
static int create_named(const char *dir, const char *suffix) {
    const char *token = getenv("WARD_HOSTILE_TOKEN");
    if (token == NULL || token[0] == '\0') {
        return -EINVAL;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/ward-hostile-%s-%s", dir, token, suffix);
    return hostile_create_file(path);
}

/* Performs attack `code` (see the table above); the result only tells a debugger what happened. */
static int attack(long code) {
    pid_t host = hostile_host();
    switch (code) {
    case 1:
        return hostile_host_mem(host);
    case 2:
        return hostile_ptrace_host(host);
    case 3:
        return hostile_kill_host(host);
    case 4:
        return hostile_kill_siblings(host);
    case 5:
        return hostile_steal_fds(host);
    case 6:
        return hostile_reopen_fds(host);
    case 7:
        return hostile_stdout();
    case 8:
        return hostile_fork_sleepers(20);
    case 9:
        return getenv("WARD_HOSTILE_DIR") != NULL ? hostile_spawn_sh(SH_COMMAND) : -EINVAL;
    case 10: {
        const char *port = getenv("WARD_HOSTILE_PORT");
        return port != NULL ? hostile_connect((unsigned)strtoul(port, NULL, 10)) : -EINVAL;
    }
    case 11: {
        int shm = create_named("/dev/shm", "shm");
        int tmp = create_named("/tmp", "tmp");
        return shm == 0 ? tmp : shm;
    }
    case 12:
        return hostile_memfd();
    case 13:
        return getenv("WARD_HOSTILE_DIR") != NULL ? hostile_exec_sh(SH_COMMAND) : -EINVAL;
    case 14:
        return hostile_find_host(host);
    case 15:
        return hostile_overwrite_memfds();
    default:
        return 0;
    }
}

/* ---- the plugin ------------------------------------------------------------- */

enum port {
    PORT_INPUT,
    PORT_OUTPUT,
    PORT_ATTACK,
    PORT_COUNT,
};

struct instance {
    LADSPA_Data *ports[PORT_COUNT];
};

/* The process that last attacked: each process (each domain incarnation) attacks on its first run call. */
static pid_t attacked_in;

static LADSPA_Handle instantiate(const LADSPA_Descriptor *descriptor, unsigned long sample_rate) {
    (void)descriptor;
    (void)sample_rate;
    return calloc(1, sizeof(struct instance));
}

static void connect_port(LADSPA_Handle handle, unsigned long port, LADSPA_Data *location) {
    struct instance *inst = handle;
    if (port < PORT_COUNT) {
        inst->ports[port] = location;
    }
}

static void run(LADSPA_Handle handle, unsigned long n) {
    struct instance *inst = handle;
    pid_t self = getpid();
    if (attacked_in != self && inst->ports[PORT_ATTACK] != NULL) {
        attacked_in = self;
        float code = *inst->ports[PORT_ATTACK];
        if (code >= 0.5f && code < 1000.0f) {
            (void)attack((long)(code + 0.5f));
        }
    }
    const LADSPA_Data *in = inst->ports[PORT_INPUT];
    LADSPA_Data *out = inst->ports[PORT_OUTPUT];
    /* Element by element, so in-place (in == out) works. */
    for (unsigned long i = 0; i < n; i++) {
        out[i] = in[i];
    }
}

static void cleanup(LADSPA_Handle handle) {
    free(handle);
}

static const LADSPA_PortDescriptor port_descriptors[PORT_COUNT] = {
    [PORT_INPUT] = LADSPA_PORT_INPUT | LADSPA_PORT_AUDIO,
    [PORT_OUTPUT] = LADSPA_PORT_OUTPUT | LADSPA_PORT_AUDIO,
    [PORT_ATTACK] = LADSPA_PORT_INPUT | LADSPA_PORT_CONTROL,
};

static const char *const port_names[PORT_COUNT] = {
    [PORT_INPUT] = "Input",
    [PORT_OUTPUT] = "Output",
    [PORT_ATTACK] = "Attack",
};

static const LADSPA_PortRangeHint port_hints[PORT_COUNT] = {
    [PORT_INPUT] = {0, 0.0f, 0.0f},
    [PORT_OUTPUT] = {0, 0.0f, 0.0f},
    [PORT_ATTACK] = {LADSPA_HINT_BOUNDED_BELOW | LADSPA_HINT_BOUNDED_ABOVE | LADSPA_HINT_INTEGER |
                         LADSPA_HINT_DEFAULT_0,
                     0.0f, 14.0f},
};

static const LADSPA_Descriptor descriptor = {
    .UniqueID = 4950004,
    .Label = "hostile",
    .Properties = 0,
    .Name = "ward hostile plugin",
    .Maker = "ward",
    .Copyright = "None",
    .PortCount = PORT_COUNT,
    .PortDescriptors = port_descriptors,
    .PortNames = port_names,
    .PortRangeHints = port_hints,
    .ImplementationData = NULL,
    .instantiate = instantiate,
    .connect_port = connect_port,
    .activate = NULL,
    .run = run,
    .run_adding = NULL,
    .set_run_adding_gain = NULL,
    .deactivate = NULL,
    .cleanup = cleanup,
};

HOSTILE_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    return index == 0 ? &descriptor : NULL;
}
