//! Which class a shared object belongs to, from the symbols it exports: what the preload shim asks of every library
//! a host opens, before deciding whether to put it under ward.

use std::path::Path;

use object::{Object, ObjectSymbol};

/// A plugin ABI ward has a class for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Ladspa,
    Frei0r,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Ladspa => "LADSPA",
            Class::Frei0r => "frei0r",
        }
    }
}

/// The class of the shared object at `path`, or `None` when it is no plugin of a known class (or cannot be read:
/// the host's own dlopen will then say what is wrong with it).
pub fn class_of(path: &Path) -> Option<Class> {
    let bytes = std::fs::read(path).ok()?;
    class_of_bytes(&bytes)
}

/// As [`class_of`], on the file's bytes.
pub fn class_of_bytes(bytes: &[u8]) -> Option<Class> {
    let file = object::File::parse(bytes).ok()?;
    let exported = |name: &str| file.dynamic_symbols().any(|s| s.is_definition() && s.name().is_ok_and(|n| n == name));
    if exported("ladspa_descriptor") {
        Some(Class::Ladspa)
    } else if exported("f0r_construct") && exported("f0r_get_plugin_info") {
        Some(Class::Frei0r)
    } else {
        None
    }
}
