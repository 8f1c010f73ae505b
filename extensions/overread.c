/*
 * overread.c -- a generic extension that reads past its input or writes past its output: what ward must answer
 * with zeros (a read a little past an input) or a fault (a read further on, any write past an output).
 *
 *   int64_t overread_sum(const uint8_t *in, uint64_t len, uint64_t past)
 *       the sum of the `past` bytes after in[0..len), each plus one, so that zeros count: past when they are all
 *       zeros, more when any is not; a read that reaches unreadable memory faults
 *   int64_t overread_write_past(uint8_t *out, uint64_t len, uint64_t past)
 *       fill out[0..len) with 0x5a, then write one byte `past` bytes after its end (out[len + past - 1]); past 0
 *       writes nothing past; returns len
 *
 * Every read is volatile, so the compiler keeps each one: a read past the allowance must reach the guard page.
 */
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int64_t overread_sum(const uint8_t *in, uint64_t len, uint64_t past) {
    const volatile uint8_t *p = in + len;
    int64_t total = 0;
    for (uint64_t i = 0; i < past; i++)
        total += (int64_t)p[i] + 1;
    return total;
}

EXPORT int64_t overread_write_past(uint8_t *out, uint64_t len, uint64_t past) {
    volatile uint8_t *p = out;
    for (uint64_t i = 0; i < len; i++)
        p[i] = 0x5a;
    if (past > 0)
        p[len + past - 1] = 0xa5;
    return (int64_t)len;
}
