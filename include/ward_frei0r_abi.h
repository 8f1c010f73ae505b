/* The frei0r video plugin ABI (version 1.2) as ward needs it: struct layouts, constants and entry points, declared
 * from the published interface so that ward builds without the SDK installed. */
#ifndef WARD_FREI0R_ABI_H
#define WARD_FREI0R_ABI_H

#include <stdint.h>

#define FREI0R_MAJOR_VERSION 1
#define FREI0R_MINOR_VERSION 2

/* Plugin types: how many input frames update takes. */
#define F0R_PLUGIN_TYPE_FILTER 0
#define F0R_PLUGIN_TYPE_SOURCE 1
#define F0R_PLUGIN_TYPE_MIXER2 2
#define F0R_PLUGIN_TYPE_MIXER3 3

/* Colour models of the 32-bit pixels. */
#define F0R_COLOR_MODEL_BGRA8888 0
#define F0R_COLOR_MODEL_RGBA8888 1
#define F0R_COLOR_MODEL_PACKED32 2

/* Parameter types; what f0r_param_t points to for each. */
#define F0R_PARAM_BOOL 0     /* double, 0.0 or 1.0 (true when >= 0.5) */
#define F0R_PARAM_DOUBLE 1   /* double, normally in [0, 1] */
#define F0R_PARAM_COLOR 2    /* f0r_param_color_t */
#define F0R_PARAM_POSITION 3 /* f0r_param_position_t */
#define F0R_PARAM_STRING 4   /* char *: the parameter points to a string pointer */

typedef struct f0r_plugin_info {
    const char *name;
    const char *author;
    int plugin_type;
    int color_model;
    int frei0r_version;
    int major_version;
    int minor_version;
    int num_params;
    const char *explanation;
} f0r_plugin_info_t;

typedef struct f0r_param_info {
    const char *name;
    int type;
    const char *explanation;
} f0r_param_info_t;

typedef struct f0r_param_color {
    float r, g, b;
} f0r_param_color_t;

typedef struct f0r_param_position {
    double x, y;
} f0r_param_position_t;

typedef void *f0r_instance_t;
typedef void *f0r_param_t;

int f0r_init(void);
void f0r_deinit(void);
void f0r_get_plugin_info(f0r_plugin_info_t *info);
void f0r_get_param_info(f0r_param_info_t *info, int param_index);
f0r_instance_t f0r_construct(unsigned int width, unsigned int height);
void f0r_destruct(f0r_instance_t instance);
void f0r_set_param_value(f0r_instance_t instance, f0r_param_t param, int param_index);
void f0r_get_param_value(f0r_instance_t instance, f0r_param_t param, int param_index);
void f0r_update(f0r_instance_t instance, double time, const uint32_t *inframe, uint32_t *outframe);
void f0r_update2(f0r_instance_t instance, double time, const uint32_t *inframe1, const uint32_t *inframe2,
                 const uint32_t *inframe3, uint32_t *outframe);

#endif
