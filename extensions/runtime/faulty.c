/* Faulty: a transform with a bug that fires on every image: it writes through a pointer that points nowhere (an
 * address no process maps, and past the end of any WebAssembly memory), as a miscomputed row offset would. The
 * server must answer its requests with a clean 5xx and go on serving the other transforms. */
#include "ward_image.h"

int64_t faulty(const uint8_t *in, int64_t width, int64_t height, uint8_t *out, int64_t out_capacity)
{
    if (!ward_image_args_ok(in, width, height, out, out_capacity, WARD_IMAGE_HEADER))
        return -1;
    /* The bug: an offset computed with the wrong sign lands far below `out`. */
    int64_t offset = -(int64_t)((uintptr_t)out) - 4096;
    volatile uint8_t *wild = out + offset;
    *wild = in[0];
    return WARD_IMAGE_HEADER;
}
