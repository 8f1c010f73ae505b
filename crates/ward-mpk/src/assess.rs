//! What an extension must not contain or need for an mpk domain to hold it, read from its file: no PKU needed.
//!
//! [`assess`] reads an [`Image`] and gives every reason to refuse it, in a fixed order: forbidden instruction
//! bytes ([`scan`]), thread starts, other libraries' thread-local variables, libraries other than glibc's, and
//! imports the domain runtime cannot honour ([`imports`]).

use serde::Serialize;

pub mod elf;
pub mod imports;
mod reason;
pub mod scan;

pub use self::elf::{Image, SymbolKind};
pub use self::imports::ImportClass;
pub use self::reason::{ForbiddenSite, ImportRef, Reason};
pub use self::scan::Forbidden;
/// Libraries an extension may need and still run in an mpk domain: glibc's. Their functions are classified one
/// by one as imports; none of their code is loaded into the domain on the extension's behalf.
/// - libc, libm and the dynamic linker are in every process already.
/// - libmvec is glibc's vector math library, pure like libm (the compiler calls it for vectorised loops).
/// - librt, libpthread, libdl, libutil and libanl are empty since glibc 2.34: their functions moved into libc,
///   the files remain for binaries linked against the old layout (Debian's swh-plugins still need librt).
///
/// Every other library is a reason, libstdc++ and libgcc_s included: their code would run in the domain, and it
/// keeps thread-local state, starts no threads of its own but locks for them, and allocates from the host's heap.
pub const GLIBC_LIBRARIES: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "ld-linux-x86-64.so.2",
    "libmvec.so.1",
    "librt.so.1",
    "libpthread.so.0",
    "libdl.so.2",
    "libutil.so.1",
    "libanl.so.1",
];

/// One undefined dynamic symbol of an extension and how the mpk loader binds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Import {
    pub name: String,
    /// The symbol version asked for (`GLIBC_2.2.5`), when versioned.
    pub version: Option<String>,
    /// The library that version belongs to (`libm.so.6`).
    pub library: Option<String>,
    pub weak: bool,
    pub kind: SymbolKind,
    pub class: ImportClass,
    /// The classification group (`heap`, `stdio`, `libm`, `mappings`, `unknown`, ...).
    pub group: &'static str,
}

/// What the mpk loader would make of an extension.
#[derive(Debug, Clone)]
pub struct Assessment {
    /// Every import, classified, sorted by name.
    pub imports: Vec<Import>,
    /// Every reason to refuse it; empty when an mpk domain can hold it.
    pub reasons: Vec<Reason>,
}

/// Assesses the extension read as `image`.
pub fn assess(image: &Image<'_>) -> Assessment {
    let mut imports: Vec<Import> = image
        .imports
        .iter()
        .map(|raw| {
            let group = imports::classify(&raw.name, raw.library.as_deref());
            Import {
                name: raw.name.clone(),
                version: raw.version.clone(),
                library: raw.library.clone(),
                weak: raw.weak,
                kind: raw.kind,
                class: group.class,
                group: group.id,
            }
        })
        .collect();
    imports.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));

    let mut reasons = Vec::new();
    let sites = forbidden_sites(image);
    if !sites.is_empty() {
        reasons.push(Reason::ForbiddenInstructions { sites });
    }
    let in_group = |id: &str| -> Vec<ImportRef> {
        imports.iter().filter(|i| i.group == id).map(|i| ImportRef { name: i.name.clone(), weak: i.weak }).collect()
    };
    let threads = in_group(imports::THREAD_START);
    if !threads.is_empty() {
        reasons.push(Reason::Threads { imports: threads });
    }
    // Its own thread-local storage goes into the domain's thread blocks; another library's cannot.
    let mut foreign_tls: Vec<String> =
        image.imports.iter().filter(|i| i.kind == SymbolKind::Tls).map(|i| i.name.clone()).collect();
    foreign_tls.sort();
    foreign_tls.dedup();
    if !foreign_tls.is_empty() {
        reasons.push(Reason::ForeignTls { symbols: foreign_tls });
    }
    let mut foreign: Vec<&String> = image.needed.iter().filter(|n| !GLIBC_LIBRARIES.contains(&n.as_str())).collect();
    foreign.sort();
    foreign.dedup();
    reasons.extend(foreign.into_iter().map(|library| Reason::Dependency { library: library.clone() }));
    for import in imports.iter().filter(|i| !i.class.honoured()) {
        let group = imports::classify(&import.name, import.library.as_deref());
        reasons.push(Reason::UnsupportedImport {
            import: ImportRef { name: import.name.clone(), weak: import.weak },
            group: group.id,
            why: group.why,
        });
    }
    Assessment { imports, reasons }
}

/// Every forbidden instruction in the executable segments, by file offset.
fn forbidden_sites(image: &Image<'_>) -> Vec<ForbiddenSite> {
    let mut sites = Vec::new();
    for segment in &image.exec_segments {
        for (at, instruction) in scan::find_forbidden(segment.code) {
            // A hostile p_vaddr may sit near the top of the address space; the address is only reported.
            let address = segment.address.wrapping_add(at as u64);
            sites.push(ForbiddenSite {
                instruction,
                offset: segment.offset + at as u64,
                address,
                function: image.function_at(address),
                section: image.section_at(address),
            });
        }
    }
    sites.sort_by_key(|s| s.offset);
    sites.dedup_by_key(|s| s.offset);
    sites
}
