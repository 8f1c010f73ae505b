/* Crop: the centre of the image, half its width and half its height (rounded up). */
#include "ward_image.h"

int64_t crop(const uint8_t *in, int64_t width, int64_t height, uint8_t *out, int64_t out_capacity)
{
    int64_t ow = (width + 1) / 2;
    int64_t oh = (height + 1) / 2;
    int64_t x0 = (width - ow) / 2;
    int64_t y0 = (height - oh) / 2;
    int64_t need = WARD_IMAGE_HEADER + ow * oh * 3;
    if (!ward_image_args_ok(in, width, height, out, out_capacity, need))
        return -1;
    uint8_t *px = ward_image_header(out, ow, oh);
    for (int64_t y = 0; y < oh; y++) {
        const uint8_t *row = in + ((y0 + y) * width + x0) * 3;
        uint8_t *dst = px + y * ow * 3;
        for (int64_t i = 0; i < ow * 3; i++)
            dst[i] = row[i];
    }
    return need;
}
