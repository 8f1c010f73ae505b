/* The LV2 binary interface as ward uses it: the plugin descriptor and library descriptor of LV2 core, and the
 * structures of the extensions ward's LV2 class knows (URID, atom, options, buf-size, log, worker, state). Written
 * from the LV2 specification's definitions (layouts and URIs only), so that building ward needs no LV2 headers. */
#ifndef WARD_LV2_ABI_H
#define WARD_LV2_ABI_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* ---- core ---- */

#define WARD_LV2_CORE "http://lv2plug.in/ns/lv2core#"

typedef void *LV2_Handle;

typedef struct {
    const char *URI;
    void *data;
} LV2_Feature;

typedef struct LV2_Descriptor {
    const char *URI;
    LV2_Handle (*instantiate)(const struct LV2_Descriptor *descriptor, double sample_rate, const char *bundle_path,
                              const LV2_Feature *const *features);
    void (*connect_port)(LV2_Handle instance, uint32_t port, void *data_location);
    void (*activate)(LV2_Handle instance);
    void (*run)(LV2_Handle instance, uint32_t sample_count);
    void (*deactivate)(LV2_Handle instance);
    void (*cleanup)(LV2_Handle instance);
    const void *(*extension_data)(const char *uri);
} LV2_Descriptor;

typedef const LV2_Descriptor *(*LV2_Descriptor_Function)(uint32_t index);

typedef void *LV2_Lib_Handle;

typedef struct {
    LV2_Lib_Handle handle;
    uint32_t size;
    void (*cleanup)(LV2_Lib_Handle handle);
    const LV2_Descriptor *(*get_plugin)(LV2_Lib_Handle handle, uint32_t index);
} LV2_Lib_Descriptor;

typedef const LV2_Lib_Descriptor *(*LV2_Lib_Descriptor_Function)(const char *bundle_path,
                                                                 const LV2_Feature *const *features);

/* ---- urid ---- */

#define WARD_LV2_URID_MAP "http://lv2plug.in/ns/ext/urid#map"
#define WARD_LV2_URID_UNMAP "http://lv2plug.in/ns/ext/urid#unmap"

typedef uint32_t LV2_URID;
typedef void *LV2_URID_Map_Handle;
typedef void *LV2_URID_Unmap_Handle;

typedef struct {
    LV2_URID_Map_Handle handle;
    LV2_URID (*map)(LV2_URID_Map_Handle handle, const char *uri);
} LV2_URID_Map;

typedef struct {
    LV2_URID_Unmap_Handle handle;
    const char *(*unmap)(LV2_URID_Unmap_Handle handle, LV2_URID urid);
} LV2_URID_Unmap;

/* ---- atom ---- */

#define WARD_LV2_ATOM_SEQUENCE "http://lv2plug.in/ns/ext/atom#Sequence"
#define WARD_LV2_ATOM_CHUNK "http://lv2plug.in/ns/ext/atom#Chunk"
#define WARD_LV2_ATOM_OBJECT "http://lv2plug.in/ns/ext/atom#Object"
#define WARD_LV2_ATOM_BLANK "http://lv2plug.in/ns/ext/atom#Blank"
#define WARD_LV2_ATOM_INT "http://lv2plug.in/ns/ext/atom#Int"
#define WARD_LV2_ATOM_FLOAT "http://lv2plug.in/ns/ext/atom#Float"
#define WARD_LV2_ATOM_DOUBLE "http://lv2plug.in/ns/ext/atom#Double"
#define WARD_LV2_ATOM_LONG "http://lv2plug.in/ns/ext/atom#Long"
#define WARD_LV2_ATOM_PATH "http://lv2plug.in/ns/ext/atom#Path"
#define WARD_LV2_ATOM_FRAME_TIME "http://lv2plug.in/ns/ext/atom#frameTime"
#define WARD_LV2_MIDI_EVENT "http://lv2plug.in/ns/ext/midi#MidiEvent"

typedef struct {
    uint32_t size; /* bytes of the body, after this header */
    uint32_t type;
} LV2_Atom;

typedef struct {
    union {
        int64_t frames;
        double beats;
    } time;
    LV2_Atom body;
    /* the body's contents follow */
} LV2_Atom_Event;

typedef struct {
    uint32_t unit;
    uint32_t pad;
    /* events follow, each padded to 8 bytes */
} LV2_Atom_Sequence_Body;

typedef struct {
    LV2_Atom atom;
    LV2_Atom_Sequence_Body body;
} LV2_Atom_Sequence;

/* ---- options and buf-size ---- */

#define WARD_LV2_OPTIONS_OPTIONS "http://lv2plug.in/ns/ext/options#options"
#define WARD_LV2_OPTIONS_INTERFACE "http://lv2plug.in/ns/ext/options#interface"
#define WARD_LV2_BUF_SIZE_BOUNDED "http://lv2plug.in/ns/ext/buf-size#boundedBlockLength"
#define WARD_LV2_BUF_SIZE_FIXED "http://lv2plug.in/ns/ext/buf-size#fixedBlockLength"
#define WARD_LV2_BUF_SIZE_POWER_OF_2 "http://lv2plug.in/ns/ext/buf-size#powerOf2BlockLength"

typedef enum {
    LV2_OPTIONS_INSTANCE,
    LV2_OPTIONS_RESOURCE,
    LV2_OPTIONS_BLANK,
    LV2_OPTIONS_PORT
} LV2_Options_Context;

typedef struct {
    LV2_Options_Context context;
    uint32_t subject;
    LV2_URID key;
    uint32_t size;
    LV2_URID type;
    const void *value;
} LV2_Options_Option;

typedef struct {
    uint32_t (*get)(LV2_Handle instance, LV2_Options_Option *options);
    uint32_t (*set)(LV2_Handle instance, const LV2_Options_Option *options);
} LV2_Options_Interface;

/* ---- log ---- */

#define WARD_LV2_LOG_LOG "http://lv2plug.in/ns/ext/log#log"

typedef void *LV2_Log_Handle;

typedef struct {
    LV2_Log_Handle handle;
    int (*printf)(LV2_Log_Handle handle, LV2_URID type, const char *fmt, ...);
    int (*vprintf)(LV2_Log_Handle handle, LV2_URID type, const char *fmt, va_list ap);
} LV2_Log_Log;

/* ---- worker ---- */

#define WARD_LV2_WORKER_SCHEDULE "http://lv2plug.in/ns/ext/worker#schedule"
#define WARD_LV2_WORKER_INTERFACE "http://lv2plug.in/ns/ext/worker#interface"

typedef enum {
    LV2_WORKER_SUCCESS = 0,
    LV2_WORKER_ERR_UNKNOWN = 1,
    LV2_WORKER_ERR_NO_SPACE = 2
} LV2_Worker_Status;

typedef void *LV2_Worker_Respond_Handle;
typedef LV2_Worker_Status (*LV2_Worker_Respond_Function)(LV2_Worker_Respond_Handle handle, uint32_t size,
                                                         const void *data);

typedef struct {
    LV2_Worker_Status (*work)(LV2_Handle instance, LV2_Worker_Respond_Function respond,
                              LV2_Worker_Respond_Handle handle, uint32_t size, const void *data);
    LV2_Worker_Status (*work_response)(LV2_Handle instance, uint32_t size, const void *body);
    LV2_Worker_Status (*end_run)(LV2_Handle instance);
} LV2_Worker_Interface;

typedef void *LV2_Worker_Schedule_Handle;

typedef struct {
    LV2_Worker_Schedule_Handle handle;
    LV2_Worker_Status (*schedule_work)(LV2_Worker_Schedule_Handle handle, uint32_t size, const void *data);
} LV2_Worker_Schedule;

/* ---- state ---- */

#define WARD_LV2_STATE_INTERFACE "http://lv2plug.in/ns/ext/state#interface"
#define WARD_LV2_STATE_MAP_PATH "http://lv2plug.in/ns/ext/state#mapPath"
#define WARD_LV2_STATE_MAKE_PATH "http://lv2plug.in/ns/ext/state#makePath"
#define WARD_LV2_STATE_FREE_PATH "http://lv2plug.in/ns/ext/state#freePath"

typedef void *LV2_State_Handle;

typedef enum {
    LV2_STATE_IS_POD = 1,
    LV2_STATE_IS_PORTABLE = 2,
    LV2_STATE_IS_NATIVE = 4
} LV2_State_Flags;

typedef enum {
    LV2_STATE_SUCCESS = 0,
    LV2_STATE_ERR_UNKNOWN = 1,
    LV2_STATE_ERR_BAD_TYPE = 2,
    LV2_STATE_ERR_BAD_FLAGS = 3,
    LV2_STATE_ERR_NO_FEATURE = 4,
    LV2_STATE_ERR_NO_PROPERTY = 5,
    LV2_STATE_ERR_NO_SPACE = 6
} LV2_State_Status;

typedef LV2_State_Status (*LV2_State_Store_Function)(LV2_State_Handle handle, uint32_t key, const void *value,
                                                     size_t size, uint32_t type, uint32_t flags);
typedef const void *(*LV2_State_Retrieve_Function)(LV2_State_Handle handle, uint32_t key, size_t *size,
                                                   uint32_t *type, uint32_t *flags);

typedef struct {
    LV2_State_Status (*save)(LV2_Handle instance, LV2_State_Store_Function store, LV2_State_Handle handle,
                             uint32_t flags, const LV2_Feature *const *features);
    LV2_State_Status (*restore)(LV2_Handle instance, LV2_State_Retrieve_Function retrieve, LV2_State_Handle handle,
                                uint32_t flags, const LV2_Feature *const *features);
} LV2_State_Interface;

typedef void *LV2_State_Map_Path_Handle;
typedef struct {
    LV2_State_Map_Path_Handle handle;
    char *(*abstract_path)(LV2_State_Map_Path_Handle handle, const char *absolute_path);
    char *(*absolute_path)(LV2_State_Map_Path_Handle handle, const char *abstract_path);
} LV2_State_Map_Path;

typedef void *LV2_State_Make_Path_Handle;
typedef struct {
    LV2_State_Make_Path_Handle handle;
    char *(*path)(LV2_State_Make_Path_Handle handle, const char *path);
} LV2_State_Make_Path;

typedef void *LV2_State_Free_Path_Handle;
typedef struct {
    LV2_State_Free_Path_Handle handle;
    void (*free_path)(LV2_State_Free_Path_Handle handle, char *path);
} LV2_State_Free_Path;

#endif
