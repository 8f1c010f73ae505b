/*
 * stale.c -- a built-in generic extension whose functions return what they were not given.
 *
 * Each reads, as a buggy function might, a register or stack slot that carries nothing for it and returns its
 * value: the callee-saved rbx and r15, the second argument register of a one-argument function, and the stack
 * 8 KiB below its return address. A correct function never looks at any of these; tests of policy `poison` call
 * these to see what an extension finds there under ward (the poison, 0xfffafffafffafffa, when poisoned).
 *
 * Written in assembly so that no compiled prologue changes a register before it is read. Built with
 * -fvisibility=hidden: only the functions below are exported.
 */
#include <stdint.h>

#define STALE_EXPORT __attribute__((visibility("default")))

STALE_EXPORT uint64_t stale_rbx(void);
STALE_EXPORT uint64_t stale_r15(void);
STALE_EXPORT uint64_t stale_second_arg(uint64_t first);
STALE_EXPORT uint64_t stale_first_arg(uint64_t first);
STALE_EXPORT uint64_t stale_stack_8k(void);

__asm__(".text\n"
        ".intel_syntax noprefix\n"
        ".globl stale_rbx\n"
        ".type stale_rbx, @function\n"
        "stale_rbx:\n"
        "mov rax, rbx\n"
        "ret\n"
        ".size stale_rbx, . - stale_rbx\n"
        ".globl stale_r15\n"
        ".type stale_r15, @function\n"
        "stale_r15:\n"
        "mov rax, r15\n"
        "ret\n"
        ".size stale_r15, . - stale_r15\n"
        ".globl stale_second_arg\n"
        ".type stale_second_arg, @function\n"
        "stale_second_arg:\n"
        "mov rax, rsi\n"
        "ret\n"
        ".size stale_second_arg, . - stale_second_arg\n"
        ".globl stale_first_arg\n"
        ".type stale_first_arg, @function\n"
        "stale_first_arg:\n"
        "mov rax, rdi\n"
        "ret\n"
        ".size stale_first_arg, . - stale_first_arg\n"
        ".globl stale_stack_8k\n"
        ".type stale_stack_8k, @function\n"
        "stale_stack_8k:\n"
        "mov rax, qword ptr [rsp - 8192]\n"
        "ret\n"
        ".size stale_stack_8k, . - stale_stack_8k\n"
        ".att_syntax prefix\n");
