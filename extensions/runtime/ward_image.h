/* The image transform ABI of the runtime plugins (issue 32): what the image server calls, the same way whether the
 * plugin was compiled by ward's run-time compiler, by a native compiler or to WebAssembly.
 *
 *     int64_t NAME(const uint8_t *in, int64_t width, int64_t height, uint8_t *out, int64_t out_capacity);
 *
 * `in` holds width * height pixels, three bytes each (red, green, blue), rows top to bottom. The transform writes a
 * header of two little-endian int64 (the output's width and height) and then the output's pixels, in the same
 * layout, to `out`, and returns the number of bytes it wrote (16 + w * h * 3). It returns a negative number, and
 * writes nothing it is not sure of, when the arguments make no sense or `out_capacity` is too small. A transform's
 * output is never larger than its input's pixels plus the header, so a host that offers 16 + width * height * 3
 * bytes is always offering enough. */
#ifndef WARD_IMAGE_H
#define WARD_IMAGE_H

#include <stdint.h>

#define WARD_IMAGE_HEADER 16

/* Writes the output header; returns where the pixels go. */
static inline uint8_t *ward_image_header(uint8_t *out, int64_t width, int64_t height)
{
    int64_t dims[2];
    dims[0] = width;
    dims[1] = height;
    for (int i = 0; i < 16; i++)
        out[i] = (uint8_t)(dims[i / 8] >> ((i % 8) * 8));
    return out + WARD_IMAGE_HEADER;
}

/* Whether the arguments describe an image and an output of at least `need` bytes. */
static inline int ward_image_args_ok(const uint8_t *in, int64_t width, int64_t height, uint8_t *out,
                                     int64_t out_capacity, int64_t need)
{
    return in && out && width > 0 && height > 0 && width <= 65536 && height <= 65536 && out_capacity >= need;
}

#endif
