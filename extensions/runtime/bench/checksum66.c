/* The kernel-plugins paper's code-generation figure is for a 66-line function: this is one, of ordinary C (loops,
 * branches, a switch, table lookups, arithmetic), for `ward bench runtime` to compile. It summarises a buffer the way
 * a packet filter or a transcoder's sanity check might: CRC-32, Adler-32, a byte class histogram and run lengths. */
#include <stdint.h>

int64_t checksum66(const uint8_t *data, int64_t len, uint32_t *out, int64_t out_len)
{
    if (data == 0 || out == 0 || len < 0 || out_len < 10)
        return -1;
    uint32_t table[256];
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[n] = c;
    }
    uint32_t crc = 0xFFFFFFFFu;
    uint32_t a = 1, b = 0;
    uint32_t digits = 0, letters = 0, spaces = 0, other = 0;
    uint32_t longest_run = 0, run = 0;
    int prev = -1;
    uint32_t fold = 0;
    uint64_t squares = 0;
    for (int64_t i = 0; i < len; i++) {
        uint8_t c = data[i];
        crc = table[(crc ^ c) & 0xFF] ^ (crc >> 8);
        a = (a + c) % 65521u;
        b = (b + a) % 65521u;
        fold = (fold << 5 | fold >> 27) ^ c;
        squares += (uint64_t)c * c;
        switch (c) {
        case ' ':
        case '\t':
        case '\n':
        case '\r':
            spaces++;
            break;
        default:
            if (c >= '0' && c <= '9')
                digits++;
            else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
                letters++;
            else
                other++;
            break;
        }
        if (c == prev) {
            run++;
        } else {
            if (run > longest_run)
                longest_run = run;
            run = 1;
            prev = c;
        }
    }
    if (run > longest_run)
        longest_run = run;
    out[0] = crc ^ 0xFFFFFFFFu;
    out[1] = (b << 16) | a;
    out[2] = digits;
    out[3] = letters;
    out[4] = spaces;
    out[5] = other;
    out[6] = longest_run;
    out[7] = (uint32_t)len;
    out[8] = fold;
    out[9] = (uint32_t)(squares ^ (squares >> 32));
    if (len > 0 && squares / (uint64_t)len > 0xFFFFu)
        return -2;
    return 10;
}
