//! Libraries loaded into a domain together with an extension, and the `dl*` functions that open them there.
//!
//! A class adapter opens its plugin with `dlopen` and looks its entry points up with `dlsym`. In an mpk domain
//! the host's dynamic linker must not run on the domain's behalf (it would map the plugin with the host's key and
//! run its initialisers with the host's rights), so the backend loads the plugin into the domain with the adapter,
//! and these functions answer from a table of what was loaded: `dlopen` of that path gives its handle, `dlsym` its
//! exports; anything else fails as `dlopen` fails, with a message for `dlerror`. Nothing here allocates: the
//! runtime runs with the domain's rights and the host's heap is not the domain's to write.
//!
//! The table lies in read-only pages of the domain's key. It is `u64` words, offsets counted from its start:
//! the number of libraries; per library `[path offset, path length, exports offset, export count]`; per export,
//! sorted by name, `[name offset, name length, address]`; then the strings. A library's handle is the address of
//! its entry.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};

use super::{block, RuntimeBlock};

/// Bytes of the `dlerror` message, its NUL included.
pub const ERROR_BYTES: usize = 256;
const LIBRARY_WORDS: usize = 4;
const EXPORT_WORDS: usize = 3;

/// A table of libraries, laid out for the domain.
pub struct LibraryTable {
    pub bytes: Vec<u8>,
}

impl LibraryTable {
    /// The table of `libraries`: each a path and its exports (name to address).
    pub fn new(libraries: &[(&[u8], &HashMap<String, usize>)]) -> LibraryTable {
        let exports: usize = libraries.iter().map(|(_, e)| e.len()).sum();
        let mut words: Vec<u64> = Vec::with_capacity(1 + libraries.len() * LIBRARY_WORDS + exports * EXPORT_WORDS);
        let mut strings: Vec<u8> = Vec::new();
        let strings_at = (1 + libraries.len() * LIBRARY_WORDS + exports * EXPORT_WORDS) * 8;
        words.push(libraries.len() as u64);
        let mut export_at = 1 + libraries.len() * LIBRARY_WORDS;
        let mut export_words = Vec::new();
        for (path, table) in libraries {
            words.extend([(strings_at + strings.len()) as u64, path.len() as u64, (export_at * 8) as u64]);
            words.push(table.len() as u64);
            strings.extend_from_slice(path);
            let mut sorted: Vec<(&String, &usize)> = table.iter().collect();
            sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            for (name, &address) in sorted {
                export_words.extend([(strings_at + strings.len()) as u64, name.len() as u64, address as u64]);
                strings.extend_from_slice(name.as_bytes());
            }
            export_at += table.len() * EXPORT_WORDS;
        }
        words.extend(export_words);
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend(strings);
        LibraryTable { bytes }
    }
}

/// The table as the domain reads it, every offset checked against its length.
struct View<'a> {
    at: usize,
    bytes: &'a [u8],
}

impl View<'_> {
    fn of(b: &RuntimeBlock) -> View<'_> {
        let bytes = if b.libraries == 0 {
            &[][..]
        } else {
            // SAFETY: the backend laid the table out at this address with this length, in read-only pages of the
            // domain's key; a block the domain overwrote can only point it at memory the domain may read anyway.
            unsafe { std::slice::from_raw_parts(b.libraries as *const u8, b.libraries_len) }
        };
        View { at: b.libraries, bytes }
    }

    fn word(&self, index: usize) -> Option<usize> {
        let from = index.checked_mul(8)?;
        let w = self.bytes.get(from..from.checked_add(8)?)?;
        usize::try_from(u64::from_le_bytes(w.try_into().ok()?)).ok()
    }

    fn text(&self, offset: usize, len: usize) -> Option<&[u8]> {
        self.bytes.get(offset..offset.checked_add(len)?)
    }

    fn count(&self) -> usize {
        self.word(0).unwrap_or(0)
    }

    /// The first word of library `i`'s entry.
    fn entry(i: usize) -> usize {
        1 + i * LIBRARY_WORDS
    }

    fn path(&self, i: usize) -> Option<&[u8]> {
        self.text(self.word(Self::entry(i))?, self.word(Self::entry(i) + 1)?)
    }

    fn handle(&self, i: usize) -> usize {
        self.at + Self::entry(i) * 8
    }

    /// The library a handle names.
    fn library(&self, handle: usize) -> Option<usize> {
        let offset = handle.checked_sub(self.at)?.checked_sub(8)?;
        let i = offset / (LIBRARY_WORDS * 8);
        (offset.is_multiple_of(LIBRARY_WORDS * 8) && i < self.count()).then_some(i)
    }

    fn symbol(&self, i: usize, name: &[u8]) -> Option<usize> {
        let first = self.word(Self::entry(i) + 2)? / 8;
        let n = self.word(Self::entry(i) + 3)?;
        let (mut low, mut high) = (0, n);
        while low < high {
            let mid = low + (high - low) / 2;
            let at = first + mid * EXPORT_WORDS;
            let found = self.text(self.word(at)?, self.word(at + 1)?)?;
            match found.cmp(name) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return self.word(at + 2),
            }
        }
        None
    }
}

/// Sets the message `dlerror` returns next: the parts one after the other, cut to fit.
fn set_error(b: &mut RuntimeBlock, parts: &[&[u8]]) {
    let mut n = 0;
    for part in parts {
        let take = part.len().min(ERROR_BYTES - 1 - n);
        b.dl_error[n..n + take].copy_from_slice(&part[..take]);
        n += take;
    }
    b.dl_error[n] = 0;
    b.dl_error_pending = 1;
}

fn c_text<'a>(p: *const c_char) -> &'a [u8] {
    // SAFETY: the extension passes a NUL-terminated string, in memory the domain can read.
    unsafe { CStr::from_ptr(p) }.to_bytes()
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_dlopen(
    path: *const c_char,
    _: i32,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> usize {
    let mut locked = block(b);
    let b = &mut *locked;
    if path.is_null() {
        set_error(b, &[b"dlopen(NULL): an mpk domain has no global scope to open"]);
        return 0;
    }
    let wanted = c_text(path);
    let view = View::of(b);
    let bare = !wanted.contains(&b'/');
    let found = (0..view.count()).find(|&i| {
        view.path(i).is_some_and(|p| p == wanted || (bare && p.rsplit(|&c| c == b'/').next() == Some(wanted)))
    });
    match found {
        Some(i) => view.handle(i),
        None => {
            set_error(b, &[wanted, b": an mpk domain opens only the libraries loaded into it with the extension"]);
            0
        }
    }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_dlsym(
    handle: usize,
    name: *const c_char,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> usize {
    let mut locked = block(b);
    let b = &mut *locked;
    let view = View::of(b);
    let Some(i) = view.library(handle) else {
        set_error(b, &[b"dlsym: not a handle dlopen returned in this domain"]);
        return 0;
    };
    let name = c_text(name);
    match view.symbol(i, name) {
        Some(address) => address,
        None => {
            set_error(b, &[b"undefined symbol: ", name]);
            0
        }
    }
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_dlerror(
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> *const c_void {
    let mut locked = block(b);
    let b = &mut *locked;
    if b.dl_error_pending == 0 {
        return std::ptr::null();
    }
    b.dl_error_pending = 0;
    b.dl_error.as_ptr().cast()
}

/// # Safety
/// The thunk contract (the runtime's module doc).
pub(super) unsafe extern "C" fn rt_dlclose(
    handle: usize,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    b: *mut RuntimeBlock,
) -> i32 {
    let mut locked = block(b);
    let b = &mut *locked;
    if View::of(b).library(handle).is_some() {
        // The library stays loaded for the life of the domain, as the adapters expect of a process too.
        return 0;
    }
    set_error(b, &[b"dlclose: not a handle dlopen returned in this domain"]);
    1
}

#[cfg(test)]
mod tests {
    use super::super::tests::fresh;
    use super::*;

    #[test]
    fn dlopen_finds_the_loaded_library_by_path_and_dlsym_its_exports() {
        // SAFETY: the thunk contract: `bp` is a block laid out by `fresh`, alive for the test, and every name is a
        // NUL-terminated string, as is the message `dlerror` hands back.
        unsafe {
            let exports: HashMap<String, usize> =
                [("ladspa_descriptor", 0x1000), ("a", 0x2000), ("zz", 0x3000)].map(|(n, a)| (n.to_string(), a)).into();
            let other: HashMap<String, usize> = [("f0r_init".to_string(), 0x4000)].into();
            let table = LibraryTable::new(&[(b"/usr/lib/ladspa/amp.so", &exports), (b"/x/frei0r.so", &other)]);
            let mut heap = vec![0u8; 4096];
            let mut b = fresh(&mut heap);
            b.set_libraries(table.bytes.as_ptr() as usize, table.bytes.len());
            let bp: *mut RuntimeBlock = &mut **b;

            let amp = rt_dlopen(c"/usr/lib/ladspa/amp.so".as_ptr(), 2, 0, 0, 0, bp);
            assert_ne!(amp, 0);
            assert_eq!(rt_dlopen(c"amp.so".as_ptr(), 2, 0, 0, 0, bp), amp, "a bare name finds it too");
            assert_eq!(rt_dlsym(amp, c"ladspa_descriptor".as_ptr(), 0, 0, 0, bp), 0x1000);
            assert_eq!(rt_dlsym(amp, c"zz".as_ptr(), 0, 0, 0, bp), 0x3000);
            assert_eq!(rt_dlsym(amp, c"f0r_init".as_ptr(), 0, 0, 0, bp), 0, "another library's export");
            let message = rt_dlerror(0, 0, 0, 0, 0, bp);
            // The message: dlerror returned the block's NUL-terminated one.
            assert_eq!(CStr::from_ptr(message.cast()).to_bytes(), b"undefined symbol: f0r_init");
            assert!(rt_dlerror(0, 0, 0, 0, 0, bp).is_null(), "read once");
            let frei0r = rt_dlopen(c"/x/frei0r.so".as_ptr(), 2, 0, 0, 0, bp);
            assert_eq!(rt_dlsym(frei0r, c"f0r_init".as_ptr(), 0, 0, 0, bp), 0x4000);
            assert_eq!(rt_dlclose(frei0r, 0, 0, 0, 0, bp), 0);
        }
    }

    #[test]
    fn dlopen_of_anything_else_fails_with_a_reason() {
        // SAFETY: the thunk contract: `bp` is a block laid out by `fresh`, alive for the test, and every name is a
        // NUL-terminated string, as is the message `dlerror` hands back.
        unsafe {
            let mut heap = vec![0u8; 4096];
            let mut b = fresh(&mut heap);
            let bp: *mut RuntimeBlock = &mut **b;
            assert_eq!(rt_dlopen(c"libm.so.6".as_ptr(), 2, 0, 0, 0, bp), 0);
            let message = rt_dlerror(0, 0, 0, 0, 0, bp);
            // The message: dlerror returned the block's NUL-terminated one.
            let text = CStr::from_ptr(message.cast()).to_str().expect("text");
            assert!(text.starts_with("libm.so.6: an mpk domain opens only"), "{text}");
            assert_eq!(rt_dlsym(1234, c"x".as_ptr(), 0, 0, 0, bp), 0);
            assert_eq!(rt_dlclose(1234, 0, 0, 0, 0, bp), 1);
        }
    }
}
