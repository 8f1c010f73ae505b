/*
 * stale_ladspa.c -- a LADSPA plugin that reports what it was not given.
 *
 * One plugin, stale_probe (4950003), with control outputs only. Its run reads,
 * as a buggy plugin might, registers and stack that carry nothing for it: the
 * callee-saved rbx, rbp and r12..r15, the argument register rdx (run takes two
 * arguments), and the stack 1 KiB and 8 KiB below its return address. Each
 * output port gets the low 32 bits of one of them, as float bits. A correct
 * plugin never looks at any of these; what a faulty one finds there decides
 * whether its fault crashes or returns a wrong value, so tests of ward's
 * poisoned calls use this plugin to see what a plugin finds under ward.
 *
 * Self-contained; built with -fvisibility=hidden: only ladspa_descriptor is
 * exported.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ward_ladspa_abi.h"

#define STALE_EXPORT __attribute__((visibility("default")))

enum { RBX, RBP, R12, R13, R14, R15, RDX, STACK_1K, STACK_8K, PORT_COUNT };

/* What the last run found, filled by stale_run's entry before any compiled code can change it. */
uint64_t stale_found[PORT_COUNT] __attribute__((visibility("hidden")));

struct instance {
    LADSPA_Data *ports[PORT_COUNT];
};

static LADSPA_Handle instantiate(const LADSPA_Descriptor *descriptor, unsigned long sample_rate) {
    (void)descriptor;
    (void)sample_rate;
    return calloc(1, sizeof(struct instance));
}

static void connect_port(LADSPA_Handle handle, unsigned long port, LADSPA_Data *location) {
    if (port < PORT_COUNT)
        ((struct instance *)handle)->ports[port] = location;
}

static void cleanup(LADSPA_Handle handle) { free(handle); }

/* The second half of run: the registers are saved, compiled code may run. */
void stale_report(LADSPA_Handle handle) __attribute__((visibility("hidden")));
void stale_report(LADSPA_Handle handle) {
    struct instance *inst = handle;
    for (int p = 0; p < PORT_COUNT; p++) {
        uint32_t low = (uint32_t)stale_found[p];
        if (inst->ports[p] != NULL)
            memcpy(inst->ports[p], &low, sizeof low);
    }
}

void stale_run(LADSPA_Handle handle, unsigned long n) __attribute__((visibility("hidden")));

/* run(handle, n): save what the plugin was not given, then report it. rdi (the handle) is untouched until the tail
 * call. */
__asm__(".text\n"
        ".type stale_run, @function\n"
        "stale_run:\n"
        ".intel_syntax noprefix\n"
        "mov qword ptr [rip + stale_found + 0], rbx\n"
        "mov qword ptr [rip + stale_found + 8], rbp\n"
        "mov qword ptr [rip + stale_found + 16], r12\n"
        "mov qword ptr [rip + stale_found + 24], r13\n"
        "mov qword ptr [rip + stale_found + 32], r14\n"
        "mov qword ptr [rip + stale_found + 40], r15\n"
        "mov qword ptr [rip + stale_found + 48], rdx\n"
        "mov rax, qword ptr [rsp - 1024]\n"
        "mov qword ptr [rip + stale_found + 56], rax\n"
        "mov rax, qword ptr [rsp - 8192]\n"
        "mov qword ptr [rip + stale_found + 64], rax\n"
        "jmp stale_report\n"
        ".att_syntax prefix\n"
        ".size stale_run, . - stale_run\n");

static const LADSPA_PortDescriptor port_descriptors[PORT_COUNT] = {
    [RBX] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,      [RBP] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,
    [R12] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,      [R13] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,
    [R14] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,      [R15] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,
    [RDX] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,      [STACK_1K] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,
    [STACK_8K] = LADSPA_PORT_OUTPUT | LADSPA_PORT_CONTROL,
};

static const char *const port_names[PORT_COUNT] = {
    [RBX] = "rbx", [RBP] = "rbp", [R12] = "r12", [R13] = "r13", [R14] = "r14", [R15] = "r15",
    [RDX] = "rdx", [STACK_1K] = "stack 1 KiB below", [STACK_8K] = "stack 8 KiB below",
};

static const LADSPA_PortRangeHint port_hints[PORT_COUNT];

static const LADSPA_Descriptor descriptor = {
    .UniqueID = 4950003,
    .Label = "stale_probe",
    .Properties = 0,
    .Name = "ward stale register and stack probe",
    .Maker = "ward",
    .Copyright = "None",
    .PortCount = PORT_COUNT,
    .PortDescriptors = port_descriptors,
    .PortNames = port_names,
    .PortRangeHints = port_hints,
    .ImplementationData = NULL,
    .instantiate = instantiate,
    .connect_port = connect_port,
    .run = stale_run,
    .cleanup = cleanup,
};

STALE_EXPORT const LADSPA_Descriptor *ladspa_descriptor(unsigned long index) {
    return index == 0 ? &descriptor : NULL;
}
