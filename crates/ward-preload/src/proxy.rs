//! Loading a fresh copy of a class's proxy library for one plugin.

use std::ffi::{c_void, CString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use ward_classes::Class;
use ward_embed::{embedded, Embedded};

use crate::interpose::real_dlopen;

static LADSPA_PROXY: Embedded = embedded!("ward_proxy_ladspa", "LADSPA proxy");
static FREI0R_PROXY: Embedded = embedded!("ward_proxy_frei0r", "frei0r proxy");
static LV2_PROXY: Embedded = embedded!("ward_proxy_lv2", "LV2 proxy");

type BindFn = unsafe extern "C" fn(u64);

/// Why the host could not be given a proxy: a bug in the embedded proxies, or a process out of resources.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    /// A name with a NUL byte (none of ward's has one).
    #[error("{0}")]
    Nul(#[from] std::ffi::NulError),
    #[error("memfd_create: {0}")]
    Memfd(std::io::Error),
    #[error("writing the proxy: {0}")]
    Write(std::io::Error),
    #[error("the proxy library would not load")]
    WouldNotLoad,
    #[error("the proxy library has no ward_proxy_bind")]
    NoBind,
    #[error("the proxy is not a readable ELF file: {0}")]
    NotElf(object::read::Error),
    #[error("the proxy has no dynamic symbol table")]
    NoDynamicSymbols,
    #[error("the proxy does not define all of {names}")]
    Undefined { names: String },
    #[error("the proxy's dynamic symbol table lies outside it")]
    SymbolTableOutside,
    #[error("a misaligned dynamic symbol in the proxy")]
    MisalignedSymbol,
}

/// Load a private copy of `class`'s proxy (a copy, so that every plugin has its own, context-free entry points) and
/// bind it to library `id`. The copy exports the class's entry points that the plugin exports (`exports`), no
/// others: a host that looks a symbol up to learn what the plugin is (`f0r_update` or only `f0r_update2`) finds what
/// it would natively. Returns the handle the host gets, and the descriptor of the copy, which must stay open until
/// the copy is unloaded: the dynamic linker knows the copy by its name, `/proc/self/fd/N`, and hands out a loaded
/// object again for a name it already has, so a later copy loaded under the number of a closed descriptor would be
/// this one (its entry points, its binding) rather than a copy of its own.
pub(crate) fn load(class: Class, id: u64, exports: &[String]) -> Result<(*mut c_void, OwnedFd), ProxyError> {
    let proxy = match class {
        Class::Ladspa => &LADSPA_PROXY,
        Class::Frei0r => &FREI0R_PROXY,
        Class::Lv2 => &LV2_PROXY,
    };
    // Each class's proxy defines every entry point of the class; a copy keeps those the plugin exports too.
    let entries = class.entry_points();
    let missing: Vec<&str> = entries.iter().copied().filter(|e| !exports.iter().any(|x| x == e)).collect();
    let mut bytes = proxy.bytes.to_vec();
    hide_definitions(&mut bytes, &missing)?;
    let name = CString::new(format!("ward-{}-{id}", proxy.name))?;
    // SAFETY: a valid C string name and no flags; the result is checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(ProxyError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a freshly created descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    file.write_all(&bytes).map_err(ProxyError::Write)?;
    let path = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let handle = real_dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
    let fd = OwnedFd::from(file);
    if handle.is_null() {
        return Err(ProxyError::WouldNotLoad);
    }
    // SAFETY: handle is a live dlopen handle and the name a valid C string.
    let bind = unsafe { libc::dlsym(handle, c"ward_proxy_bind".as_ptr()) };
    if bind.is_null() {
        return Err(ProxyError::NoBind);
    }
    // SAFETY: ward_proxy_bind is defined in the proxies as `void ward_proxy_bind(uint64_t)`.
    let bind: BindFn = unsafe { std::mem::transmute::<*mut c_void, BindFn>(bind) };
    // SAFETY: see above; it only stores the number.
    unsafe { bind(id) };
    Ok((handle, fd))
}

/// Turn the dynamic symbols of `elf` named in `names` into undefined ones of value 0, which the dynamic linker's
/// lookups (`dlsym` among them) pass over, as if the library did not define them. Nothing in the proxy refers to its
/// own entry points, so no relocation needs them. Every name must be found: a proxy built without one is a bug.
fn hide_definitions(elf: &mut [u8], names: &[&str]) -> Result<(), ProxyError> {
    use object::read::elf::{FileHeader, SectionHeader, Sym};
    type Header = object::elf::FileHeader64<object::LittleEndian>;
    type Symbol = object::elf::Sym64<object::LittleEndian>;
    if names.is_empty() {
        return Ok(());
    }
    let endian = object::LittleEndian;
    let mut hidden = Vec::with_capacity(names.len());
    {
        let data: &[u8] = elf;
        let bad = ProxyError::NotElf;
        let header = Header::parse(data).map_err(bad)?;
        let sections = header.sections(endian, data).map_err(bad)?;
        let (index, dynsym) = sections
            .iter()
            .enumerate()
            .find(|(_, s)| s.sh_type(endian) == object::elf::SHT_DYNSYM)
            .ok_or(ProxyError::NoDynamicSymbols)?;
        let symbols = sections.symbols(endian, data, object::elf::SHT_DYNSYM).map_err(bad)?;
        debug_assert_eq!(symbols.section().0, index);
        let table_at = dynsym.sh_offset(endian) as usize;
        for (i, symbol) in symbols.iter().enumerate() {
            let name = symbol.name(endian, symbols.strings()).unwrap_or_default();
            if symbol.is_definition(endian) && names.iter().any(|n| n.as_bytes() == name) {
                hidden.push(table_at + i * std::mem::size_of::<Symbol>());
            }
        }
    }
    if hidden.len() != names.len() {
        return Err(ProxyError::Undefined { names: names.join(", ") });
    }
    for at in hidden {
        let entry = elf.get_mut(at..at + std::mem::size_of::<Symbol>()).ok_or(ProxyError::SymbolTableOutside)?;
        let symbol: &mut Symbol = object::pod::from_bytes_mut(entry).map_err(|()| ProxyError::MisalignedSymbol)?.0;
        symbol.st_shndx = object::U16::new(endian, object::elf::SHN_UNDEF);
        symbol.st_value = object::U64::new(endian, 0);
        symbol.st_size = object::U64::new(endian, 0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defined(elf: &[u8]) -> Vec<String> {
        use object::{Object, ObjectSymbol};
        let file = object::File::parse(elf).expect("the proxy parses");
        file.dynamic_symbols().filter(|s| s.is_definition()).filter_map(|s| s.name().ok().map(String::from)).collect()
    }

    #[test]
    fn a_hidden_entry_point_is_no_longer_defined_and_the_others_are() {
        let mut bytes = FREI0R_PROXY.bytes.to_vec();
        hide_definitions(&mut bytes, &["f0r_update"]).expect("hidden");
        let names = defined(&bytes);
        assert!(!names.iter().any(|n| n == "f0r_update"), "{names:?}");
        for kept in ["f0r_update2", "f0r_construct", "ward_proxy_bind"] {
            assert!(names.iter().any(|n| n == kept), "{kept} missing: {names:?}");
        }
    }

    #[test]
    fn a_name_the_proxy_does_not_define_is_an_error() {
        let mut bytes = LADSPA_PROXY.bytes.to_vec();
        assert!(hide_definitions(&mut bytes, &["no_such_entry"]).is_err());
    }
}
