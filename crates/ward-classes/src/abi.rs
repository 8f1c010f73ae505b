//! The C structs of the plugin ABIs, field for field (`ladspa.h`, `frei0r.h`, `lv2.h` and the LV2 extensions a native
//! host offers), for code that calls plugins in this process (`native_calls`) and code that stands in for one (the
//! preload shim's proxies).

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `LADSPA_PortRangeHint`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LadspaPortRangeHint {
    pub hint: c_int,
    pub lower: f32,
    pub upper: f32,
}

/// `LADSPA_Descriptor`.
#[repr(C)]
#[derive(Debug)]
pub struct LadspaDescriptor {
    pub unique_id: c_ulong,
    pub label: *const c_char,
    pub properties: c_int,
    pub name: *const c_char,
    pub maker: *const c_char,
    pub copyright: *const c_char,
    pub port_count: c_ulong,
    pub port_descriptors: *const c_int,
    pub port_names: *const *const c_char,
    pub port_range_hints: *const LadspaPortRangeHint,
    pub implementation_data: *mut c_void,
    pub instantiate: Option<unsafe extern "C" fn(*const LadspaDescriptor, c_ulong) -> *mut c_void>,
    pub connect_port: Option<unsafe extern "C" fn(*mut c_void, c_ulong, *mut f32)>,
    pub activate: Option<unsafe extern "C" fn(*mut c_void)>,
    pub run: Option<unsafe extern "C" fn(*mut c_void, c_ulong)>,
    pub run_adding: Option<unsafe extern "C" fn(*mut c_void, c_ulong)>,
    pub set_run_adding_gain: Option<unsafe extern "C" fn(*mut c_void, f32)>,
    pub deactivate: Option<unsafe extern "C" fn(*mut c_void)>,
    pub cleanup: Option<unsafe extern "C" fn(*mut c_void)>,
}

/// `f0r_plugin_info_t`.
#[repr(C)]
#[derive(Debug)]
pub struct F0rPluginInfo {
    pub name: *const c_char,
    pub author: *const c_char,
    pub plugin_type: c_int,
    pub color_model: c_int,
    pub frei0r_version: c_int,
    pub major_version: c_int,
    pub minor_version: c_int,
    pub num_params: c_int,
    pub explanation: *const c_char,
}

/// `f0r_param_info_t`.
#[repr(C)]
#[derive(Debug)]
pub struct F0rParamInfo {
    pub name: *const c_char,
    pub kind: c_int,
    pub explanation: *const c_char,
}

/// `LV2_Feature`.
#[repr(C)]
#[derive(Debug)]
pub struct Lv2Feature {
    pub uri: *const c_char,
    pub data: *mut c_void,
}

/// `LV2_Descriptor`.
#[repr(C)]
#[derive(Debug)]
pub struct Lv2Descriptor {
    pub uri: *const c_char,
    pub instantiate:
        Option<unsafe extern "C" fn(*const Lv2Descriptor, f64, *const c_char, *const *const Lv2Feature) -> *mut c_void>,
    pub connect_port: Option<unsafe extern "C" fn(*mut c_void, u32, *mut c_void)>,
    pub activate: Option<unsafe extern "C" fn(*mut c_void)>,
    pub run: Option<unsafe extern "C" fn(*mut c_void, u32)>,
    pub deactivate: Option<unsafe extern "C" fn(*mut c_void)>,
    pub cleanup: Option<unsafe extern "C" fn(*mut c_void)>,
    pub extension_data: Option<unsafe extern "C" fn(*const c_char) -> *const c_void>,
}

/// `LV2_Lib_Descriptor`.
#[repr(C)]
#[derive(Debug)]
pub struct Lv2LibDescriptor {
    pub handle: *mut c_void,
    pub size: u32,
    pub cleanup: Option<unsafe extern "C" fn(*mut c_void)>,
    pub get_plugin: Option<unsafe extern "C" fn(*mut c_void, u32) -> *const Lv2Descriptor>,
}

/// `LV2_URID_Map`.
#[repr(C)]
#[derive(Debug)]
pub struct Lv2UridMap {
    pub handle: *mut c_void,
    pub map: unsafe extern "C" fn(*mut c_void, *const c_char) -> u32,
}

/// `LV2_URID_Unmap`.
#[repr(C)]
#[derive(Debug)]
pub struct Lv2UridUnmap {
    pub handle: *mut c_void,
    pub unmap: unsafe extern "C" fn(*mut c_void, u32) -> *const c_char,
}

/// `LV2_Options_Option` (the context is a C enum, an `int`-sized `u32` here).
#[repr(C)]
#[derive(Debug)]
pub struct Lv2OptionsOption {
    pub context: u32,
    pub subject: u32,
    pub key: u32,
    pub size: u32,
    pub value_type: u32,
    pub value: *const c_void,
}
