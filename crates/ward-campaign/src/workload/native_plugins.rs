//! The plugin workloads' native side: the libraries resolved through the trial host's loader, with the checks the
//! class adapters make (what a plugin must export), and a LADSPA instance connected as hosts connect one. The calls
//! themselves are `ward_classes::native_calls`'s, which holds the unsafe code that calls plugins; what is left here is
//! the promise that the loader's symbols stay loaded.
//!
//! Plugins are read as the class adapters read them, so that the native output of an unmutated plugin equals its
//! output under ward; the library is never unloaded (nor frei0r's `f0r_deinit` called).
#![allow(unsafe_code)]

use ward_classes::ladspa::values_in_block;
pub use ward_classes::native_calls::frei0r::{Instance as Frei0rInstance, Library as Frei0rLibrary};
pub use ward_classes::native_calls::ladspa::{
    Instance as LadspaInstance, Library as LadspaLibrary, Plugin as LadspaPlugin,
};
pub use ward_classes::native_calls::Words;

use super::{Symbols, WorkloadError};

/// The LADSPA library the trial host loaded.
pub fn ladspa(symbols: &dyn Symbols) -> Result<LadspaLibrary, WorkloadError> {
    let address = symbols.address("ladspa_descriptor")?;
    // SAFETY: the address is the library's `ladspa_descriptor` (or NULL, refused); the trial host never unloads
    // the library, so it stays loaded for as long as anything from it is used.
    Ok(unsafe { LadspaLibrary::from_entry(address) }?)
}

/// The frei0r plugin the trial host loaded, with the adapter's checks: what a plugin must export.
pub fn frei0r(symbols: &dyn Symbols) -> Result<Frei0rLibrary, WorkloadError> {
    // SAFETY: the loader's addresses are the named symbols of the plugin, which the trial host never unloads.
    let lib = unsafe { Frei0rLibrary::from_lookup(|name| symbols.address(name).ok()) }?;
    if !lib.exports("f0r_init") {
        return Err(WorkloadError::NotExported { what: "f0r_init" });
    }
    if !lib.exports("f0r_construct") || !lib.exports("f0r_destruct") {
        return Err(WorkloadError::NotExported { what: "f0r_construct or f0r_destruct" });
    }
    Ok(lib)
}

/// An instance of `plugin` at `sample_rate`, every port connected to a buffer of its own (`block` samples for an
/// audio port, one value for a control port, all zero), as hosts connect them before they activate.
pub fn instantiate<'l>(
    plugin: &LadspaPlugin<'l>,
    sample_rate: u64,
    block: usize,
) -> Result<LadspaInstance<'l>, WorkloadError> {
    let mut instance = plugin.instantiate(sample_rate)?;
    for p in 0..plugin.port_count() {
        let len = values_in_block(plugin.port_flags(p), block);
        instance.connect_port(p, Words::new(len))?;
    }
    Ok(instance)
}
