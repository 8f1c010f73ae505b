/* Downsample: half the width and half the height (rounded up), each output pixel the mean of the (up to) four
 * input pixels it covers. */
#include "ward_image.h"

int64_t downsample(const uint8_t *in, int64_t width, int64_t height, uint8_t *out, int64_t out_capacity)
{
    int64_t ow = (width + 1) / 2;
    int64_t oh = (height + 1) / 2;
    int64_t need = WARD_IMAGE_HEADER + ow * oh * 3;
    if (!ward_image_args_ok(in, width, height, out, out_capacity, need))
        return -1;
    uint8_t *px = ward_image_header(out, ow, oh);
    for (int64_t y = 0; y < oh; y++) {
        for (int64_t x = 0; x < ow; x++) {
            for (int c = 0; c < 3; c++) {
                int64_t sum = 0;
                int64_t n = 0;
                for (int64_t dy = 0; dy < 2; dy++) {
                    for (int64_t dx = 0; dx < 2; dx++) {
                        int64_t sx = x * 2 + dx;
                        int64_t sy = y * 2 + dy;
                        if (sx < width && sy < height) {
                            sum += in[(sy * width + sx) * 3 + c];
                            n++;
                        }
                    }
                }
                px[(y * ow + x) * 3 + c] = (uint8_t)((sum + n / 2) / n);
            }
        }
    }
    return need;
}
