/* Grayscale: each pixel becomes the luma of its colour (ITU-R BT.601 weights, in integers), same size. */
#include "ward_image.h"

int64_t grayscale(const uint8_t *in, int64_t width, int64_t height, uint8_t *out, int64_t out_capacity)
{
    int64_t pixels = width * height;
    int64_t need = WARD_IMAGE_HEADER + pixels * 3;
    if (!ward_image_args_ok(in, width, height, out, out_capacity, need))
        return -1;
    uint8_t *px = ward_image_header(out, width, height);
    for (int64_t i = 0; i < pixels; i++) {
        const uint8_t *p = in + i * 3;
        uint8_t y = (uint8_t)((299 * p[0] + 587 * p[1] + 114 * p[2] + 500) / 1000);
        px[i * 3] = y;
        px[i * 3 + 1] = y;
        px[i * 3 + 2] = y;
    }
    return need;
}
