//! Where the dynamic linker would look for a bare library name on behalf of the object that called `dlopen`.
//!
//! glibc searches a name without a slash along the calling object's `DT_RPATH` (before `LD_LIBRARY_PATH`) or
//! `DT_RUNPATH` (after it), with `$ORIGIN` standing for the caller's directory, then in its cache and the default
//! directories. The shim forwards `dlopen` from its own code, so glibc would take the shim for the caller: for a
//! caller with such a path, this module does that part of the search itself and hands glibc the full path; the cache
//! and the default directories are left to glibc (the name is then forwarded as it is).

use std::ffi::{c_int, c_void, CStr, CString, OsStr};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_RPATH: i64 = 15;
const DT_RUNPATH: i64 = 29;

/// One entry of an ELF dynamic section (`Elf64_Dyn`).
#[repr(C)]
struct Dyn {
    tag: i64,
    value: u64,
}

/// An object's search paths, as written in its dynamic section.
struct SearchPaths {
    runpath: Option<Vec<u8>>,
    rpath: Option<Vec<u8>>,
}

/// The loaded object an address lies in.
struct Object {
    /// Load bias (`dlpi_addr`).
    base: usize,
    /// Its path as the dynamic linker has it; empty for the main program.
    name: PathBuf,
    /// Its dynamic section in memory, if it has one.
    dynamic: Option<usize>,
}

/// The search path of `name` for a call from `caller`, when the caller's object has a `DT_RUNPATH` or `DT_RPATH`
/// and the file is found along it (or along `LD_LIBRARY_PATH`, in the order glibc uses); `None` otherwise.
pub(crate) fn along_callers_paths(name: &CStr, caller: *const c_void) -> Option<CString> {
    let object = object_of(caller as usize)?;
    let SearchPaths { runpath, rpath } = search_paths(&object)?;
    let origin = origin(&object)?;
    let library_path: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|v| v.as_bytes().split(|&b| b == b':' || b == b';').map(dir_or_dot).collect())
        .unwrap_or_default();
    let dirs: Vec<PathBuf> = match (runpath, rpath) {
        (Some(runpath), _) => library_path.into_iter().chain(expand(&runpath, &origin)).collect(),
        (None, Some(rpath)) => expand(&rpath, &origin).into_iter().chain(library_path).collect(),
        (None, None) => return None,
    };
    let file = Path::new(OsStr::from_bytes(name.to_bytes()));
    let found = dirs.iter().map(|d| d.join(file)).find(|p| p.is_file())?;
    CString::new(found.into_os_string().into_vec()).ok()
}

fn dir_or_dot(entry: &[u8]) -> PathBuf {
    // An empty entry means the current directory, to glibc as to a shell.
    PathBuf::from(if entry.is_empty() { OsStr::new(".") } else { OsStr::from_bytes(entry) })
}

/// The directories of a `DT_RUNPATH`/`DT_RPATH` string, `$ORIGIN` replaced; entries with other tokens (`$LIB`,
/// `$PLATFORM`) are left out, for glibc's own search to find what they name.
fn expand(paths: &[u8], origin: &Path) -> Vec<PathBuf> {
    let origin = origin.as_os_str().as_bytes();
    paths
        .split(|&b| b == b':')
        .filter_map(|entry| {
            let mut out = Vec::with_capacity(entry.len());
            let mut rest = entry;
            while let Some(at) = rest.iter().position(|&b| b == b'$') {
                out.extend_from_slice(&rest[..at]);
                let after = &rest[at + 1..];
                let token_len = if after.starts_with(b"{ORIGIN}") {
                    8
                } else if after.starts_with(b"ORIGIN") {
                    6
                } else {
                    return None;
                };
                out.extend_from_slice(origin);
                rest = &after[token_len..];
            }
            out.extend_from_slice(rest);
            Some(dir_or_dot(&out))
        })
        .collect()
}

/// The directory of the object: `$ORIGIN`.
fn origin(object: &Object) -> Option<PathBuf> {
    let path = if object.name.as_os_str().is_empty() {
        std::fs::read_link("/proc/self/exe").ok()?
    } else {
        std::fs::canonicalize(&object.name).unwrap_or_else(|_| object.name.clone())
    };
    path.parent().map(Path::to_path_buf)
}

/// The object's `DT_RUNPATH` and `DT_RPATH` strings; `None` when it has neither.
fn search_paths(object: &Object) -> Option<SearchPaths> {
    let mut at = object.dynamic?;
    let (mut strtab, mut runpath, mut rpath) = (None, None, None);
    loop {
        // SAFETY: `at` walks the dynamic section of an object the dynamic linker has loaded (found through
        // dl_iterate_phdr), which ends with a DT_NULL entry; entries are read in place, never written.
        let entry = unsafe { std::ptr::read(at as *const Dyn) };
        match entry.tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(entry.value as usize),
            DT_RUNPATH => runpath = Some(entry.value as usize),
            DT_RPATH => rpath = Some(entry.value as usize),
            _ => {}
        }
        at += std::mem::size_of::<Dyn>();
    }
    if runpath.is_none() && rpath.is_none() {
        return None;
    }
    // glibc relocates the address in the dynamic section in place on x86-64; an unrelocated one is below the bias.
    let strtab = strtab.map(|t| if t < object.base { t + object.base } else { t })?;
    let string = |offset: usize| {
        // SAFETY: DT_RUNPATH and DT_RPATH are offsets into the object's string table, which is mapped with it;
        // its strings are NUL-terminated.
        unsafe { CStr::from_ptr((strtab + offset) as *const std::ffi::c_char) }.to_bytes().to_vec()
    };
    Some(SearchPaths { runpath: runpath.map(string), rpath: rpath.map(string) })
}

/// The loaded object whose segments hold `address`.
fn object_of(address: usize) -> Option<Object> {
    struct Search {
        address: usize,
        found: Option<Object>,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the duration of the call, and `data` is the Search the
        // caller below passed, not otherwise borrowed while the iteration runs.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        let base = info.dlpi_addr as usize;
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers of the object.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        let contains = headers.iter().any(|h| {
            let start = base + h.p_vaddr as usize;
            h.p_type == libc::PT_LOAD && (start..start + h.p_memsz as usize).contains(&search.address)
        });
        if !contains {
            return 0;
        }
        let dynamic = headers.iter().find(|h| h.p_type == libc::PT_DYNAMIC).map(|h| base + h.p_vaddr as usize);
        let name = if info.dlpi_name.is_null() {
            PathBuf::new()
        } else {
            // SAFETY: a non-null dlpi_name is a NUL-terminated string owned by the dynamic linker.
            let bytes = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
            PathBuf::from(OsStr::from_bytes(bytes))
        };
        search.found = Some(Object { base, name, dynamic });
        1
    }
    let mut search = Search { address, found: None };
    // SAFETY: `visit` matches dl_iterate_phdr's callback type and only reads what it is given; `search` outlives
    // the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void) };
    search.found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_is_replaced_and_other_tokens_left_to_glibc() {
        let o = Path::new("/opt/app/bin");
        let dirs = expand(b"$ORIGIN/../lib:${ORIGIN}/plugins:/usr/local/lib:$LIB/x:", o);
        let want = ["/opt/app/bin/../lib", "/opt/app/bin/plugins", "/usr/local/lib", "."];
        assert_eq!(dirs, want.iter().map(PathBuf::from).collect::<Vec<_>>());
    }

    #[test]
    fn the_object_holding_an_address_is_found() {
        let here = the_object_holding_an_address_is_found as *const c_void;
        let object = object_of(here as usize).expect("the test binary contains its own code");
        assert!(object.dynamic.is_some());
        assert!(object_of(0).is_none());
    }
}
