/* Calling into a plugin or extension with every register and stack slot it has no business reading set to a
 * poison value.
 *
 * A correct function reads only its arguments: the registers that carry none, the callee-saved ones (which it may
 * only save and restore) and the stack below its caller's frame hold nothing it may use. A faulty one may (a
 * dropped parameter load leaves a stale register in use, a dropped initialisation leaves a stale stack slot). What
 * it then finds decides between a crash and a silently wrong result: natively, whatever its host left there. Here
 * it finds a value that is wrong as everything it can be taken for, so the fault stops the plugin, ward sees it,
 * and recovery can make the host's output right, where a wrong value returned without a fault can never be taken
 * back. See docs/DECISIONS.md. */
#ifndef WARD_POISONED_CALL_H
#define WARD_POISONED_CALL_H

#include <stdint.h>

/* As a pointer: non-canonical (bits 63..47 differ), so a dereference faults. As a double, and as a float in either
 * half: a quiet NaN, which the LADSPA class sees in an output. As an integer: negative, or beyond any count. */
#define WARD_POISON_LITERAL 0xfffafffafffafffa
#define WARD_POISON ((uint64_t)WARD_POISON_LITERAL)

/* Bytes of stack below the caller's frame filled with the poison before each call: deeper than the frames of the
 * plugins we know (swh's deepest is a few KiB), and cheap next to a block of audio or a frame. */
#define WARD_POISON_STACK_BYTES 16384

/* A macro's value as a string, for the assembly. */
#define WARD_STR(x) WARD_STR_(x)
#define WARD_STR_(x) #x

/* A call's register image: the function, rdi..r9, the low 64 bits of xmm0..xmm7; then rax and xmm0 on return.
 * The assembly below hard-codes these offsets. */
struct ward_call {
    const void *fn;
    uint64_t ints[6];
    uint64_t floats[8];
    uint64_t ret_int;
    uint64_t ret_float;
};

_Static_assert(__builtin_offsetof(struct ward_call, ints) == 8, "ward_call layout");
_Static_assert(__builtin_offsetof(struct ward_call, floats) == 56, "ward_call layout");
_Static_assert(__builtin_offsetof(struct ward_call, ret_int) == 120, "ward_call layout");
_Static_assert(__builtin_offsetof(struct ward_call, ret_float) == 128, "ward_call layout");

/* Calls c->fn with c's argument registers after poisoning everything else; stores rax and xmm0 into c. Callee-saved
 * registers are saved here and restored after the call, so the poison never reaches the adapter's own code. */
void ward_call_poisoned(struct ward_call *c) __attribute__((visibility("hidden")));

__asm__(".text\n"
        ".globl ward_call_poisoned\n"
        ".hidden ward_call_poisoned\n"
        ".type ward_call_poisoned, @function\n"
        "ward_call_poisoned:\n"
        ".cfi_startproc\n"
        ".intel_syntax noprefix\n"
        /* Save the callee-saved registers and the image's address: seven pushes after the return address leave the
         * stack 16-byte aligned for the call. */
        "push rbp\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_rel_offset rbp, 0\n"
        "push rbx\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_rel_offset rbx, 0\n"
        "push r12\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_rel_offset r12, 0\n"
        "push r13\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_rel_offset r13, 0\n"
        "push r14\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_rel_offset r14, 0\n"
        "push r15\n"
        ".cfi_adjust_cfa_offset 8\n"
        ".cfi_rel_offset r15, 0\n"
        "push rdi\n"
        ".cfi_adjust_cfa_offset 8\n"
        "mov r11, rdi\n"
        /* The stack the callee's frames will occupy (the direction flag is clear, as the ABI guarantees). */
        "movabs rax, " WARD_STR(WARD_POISON_LITERAL) "\n"
        "lea rdi, [rsp - " WARD_STR(WARD_POISON_STACK_BYTES) "]\n"
        "mov ecx, " WARD_STR(WARD_POISON_STACK_BYTES) " / 8\n"
        "rep stosq\n"
        "mov rbx, rax\n"
        "mov rbp, rax\n"
        "mov r12, rax\n"
        "mov r13, rax\n"
        "mov r14, rax\n"
        "mov r15, rax\n"
        "mov rcx, rax\n"
        "movq xmm8, rax\n"
        "movq xmm9, rax\n"
        "movq xmm10, rax\n"
        "movq xmm11, rax\n"
        "movq xmm12, rax\n"
        "movq xmm13, rax\n"
        "movq xmm14, rax\n"
        "movq xmm15, rax\n"
        "mov r10, qword ptr [r11]\n"
        "mov rdi, qword ptr [r11 + 8]\n"
        "mov rsi, qword ptr [r11 + 16]\n"
        "mov rdx, qword ptr [r11 + 24]\n"
        "mov rcx, qword ptr [r11 + 32]\n"
        "mov r8, qword ptr [r11 + 40]\n"
        "mov r9, qword ptr [r11 + 48]\n"
        "movq xmm0, qword ptr [r11 + 56]\n"
        "movq xmm1, qword ptr [r11 + 64]\n"
        "movq xmm2, qword ptr [r11 + 72]\n"
        "movq xmm3, qword ptr [r11 + 80]\n"
        "movq xmm4, qword ptr [r11 + 88]\n"
        "movq xmm5, qword ptr [r11 + 96]\n"
        "movq xmm6, qword ptr [r11 + 104]\n"
        "movq xmm7, qword ptr [r11 + 112]\n"
        "mov r11, rax\n"
        /* al: the vector registers a variadic callee may read; the rest of rax stays poison. */
        "mov al, 8\n"
        "call r10\n"
        "pop rdi\n"
        ".cfi_adjust_cfa_offset -8\n"
        "mov qword ptr [rdi + 120], rax\n"
        "movq qword ptr [rdi + 128], xmm0\n"
        "pop r15\n"
        ".cfi_adjust_cfa_offset -8\n"
        ".cfi_restore r15\n"
        "pop r14\n"
        ".cfi_adjust_cfa_offset -8\n"
        ".cfi_restore r14\n"
        "pop r13\n"
        ".cfi_adjust_cfa_offset -8\n"
        ".cfi_restore r13\n"
        "pop r12\n"
        ".cfi_adjust_cfa_offset -8\n"
        ".cfi_restore r12\n"
        "pop rbx\n"
        ".cfi_adjust_cfa_offset -8\n"
        ".cfi_restore rbx\n"
        "pop rbp\n"
        ".cfi_adjust_cfa_offset -8\n"
        ".cfi_restore rbp\n"
        "ret\n"
        ".att_syntax prefix\n"
        ".cfi_endproc\n"
        ".size ward_call_poisoned, . - ward_call_poisoned\n");

/* A call image for `fn` with every argument register poisoned; the caller sets the ones the function takes. */
static inline struct ward_call ward_call_begin(const void *fn) {
    struct ward_call c;
    c.fn = fn;
    for (int i = 0; i < 6; i++)
        c.ints[i] = WARD_POISON;
    for (int i = 0; i < 8; i++)
        c.floats[i] = WARD_POISON;
    c.ret_int = WARD_POISON;
    c.ret_float = WARD_POISON;
    return c;
}

/* A pointer or integer argument. Values narrower than 64 bits are extended as the ABI's callers do (the upper bits
 * of a 32-bit argument are unspecified, and a faulty callee reading them sees what a native caller would leave). */
#define WARD_ARG(v) ((uint64_t)(uintptr_t)(v))

static inline uint64_t ward_f64_bits(double v) {
    uint64_t b;
    __builtin_memcpy(&b, &v, 8);
    return b;
}

/* A float argument: its bits in the low half, the upper half as a native caller's movss leaves it (poison here). */
static inline uint64_t ward_f32_bits(float v) {
    uint32_t b;
    __builtin_memcpy(&b, &v, 4);
    return (WARD_POISON & 0xffffffff00000000ULL) | b;
}

/* Calls with integer arguments only, returning rax. */
static inline uint64_t ward_call_i(const void *fn, int n, uint64_t a, uint64_t b, uint64_t c3) {
    struct ward_call c = ward_call_begin(fn);
    uint64_t args[3] = {a, b, c3};
    for (int i = 0; i < n && i < 3; i++)
        c.ints[i] = args[i];
    ward_call_poisoned(&c);
    return c.ret_int;
}

#define WARD_CALL0(fn) ward_call_i((const void *)(uintptr_t)(fn), 0, 0, 0, 0)
#define WARD_CALL1(fn, a) ward_call_i((const void *)(uintptr_t)(fn), 1, WARD_ARG(a), 0, 0)
#define WARD_CALL2(fn, a, b) ward_call_i((const void *)(uintptr_t)(fn), 2, WARD_ARG(a), WARD_ARG(b), 0)
#define WARD_CALL3(fn, a, b, c) ward_call_i((const void *)(uintptr_t)(fn), 3, WARD_ARG(a), WARD_ARG(b), WARD_ARG(c))

#endif
