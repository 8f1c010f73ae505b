//! The C structs of the plugin ABIs, field for field (`ladspa.h`, `frei0r.h`), for code that calls plugins in this
//! process (`native_calls`) and code that stands in for one (the preload shim's proxies).

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
