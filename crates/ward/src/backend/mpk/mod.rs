//! The mpk backend: extensions on the host's thread, in memory tagged with a protection key of their own
//! (DESIGN.md §1, §7).
//!
//! Two halves. The loader's knowledge needs no hardware: what an extension must not contain or need for an mpk
//! domain to hold it. [`assess`] reads an [`Image`] and gives every reason to refuse it, in a fixed order: forbidden
//! instruction bytes ([`scan`]), thread starts, other libraries' thread-local variables, libraries other than
//! glibc's, and imports the domain runtime cannot honour ([`imports`]). The domain's machinery needs PKU: protection
//! keys ([`pku`]), memory tagged with them ([`memory`]), the gate and its fault handler ([`gate`]), the thread blocks
//! the domain runs with (`thread_block`), call deadlines (`watchdog`), the loader and the domain runtime, and the
//! backend that puts them together.

#[allow(unsafe_code)]
mod backend;
// Touches the memory a domain's pointers name, inside the domain.
#[allow(unsafe_code)]
mod checks;
pub(crate) mod elf;
// The domain's machinery: protection keys, memory tagged with them, the gate and its fault handler, the loader and
// the domain runtime: the modules whose job is unsafe code.
#[allow(unsafe_code)]
pub(crate) mod gate;
pub(crate) mod imports;
// Each host thread's stack and argument area in a domain.
#[allow(unsafe_code)]
mod lanes;
// `signal`, `sysv_signal` and `sigset` for hosts, built on the gate's `host_sigaction`.
#[allow(unsafe_code)]
mod legacy_signals;
// Values a domain keeps per host thread, found without a lock.
#[allow(unsafe_code)]
mod loader;
#[allow(unsafe_code)]
pub(crate) mod memory;
#[allow(unsafe_code)]
mod per_thread;
#[allow(unsafe_code)]
pub(crate) mod pku;
mod reason;
#[allow(unsafe_code)]
mod runtime;
pub(crate) mod scan;
// The FS base a domain runs with: copies of the host thread's TLS and control blocks.
#[allow(unsafe_code)]
mod thread_block;
// Call deadlines: one thread signals the threads that are late.
#[allow(unsafe_code)]
mod watchdog;

pub(crate) use self::backend::{MpkBackend, MpkConfig};
pub(crate) use self::gate::host_sigaction;
pub(crate) use self::legacy_signals::{host_signal, host_sigset, host_sysv_signal, SIG_HOLD};

/// Whether mpk domains can run here: the processor has memory protection keys and the kernel enables them, and the
/// kernel lets user code switch the FS base itself (FSGSBASE, Linux 5.9 and later), which the gate does at every
/// crossing. Every processor with PKU has FSGSBASE.
pub(crate) fn pku_available() -> bool {
    pku::available() && thread_block::fsgsbase_enabled()
}

/// For the tests that need PKU, which are marked `#[ignore = "needs PKU"]` (`scripts/test` runs them where the
/// processor has PKU, under emulation where it has not): fails the test, saying why, where there is no PKU, so that
/// a test run with `--include-ignored` on such a machine fails instead of passing without having run.
#[cfg(test)]
pub(crate) fn require_pku() {
    assert!(
        pku_available(),
        "this test needs memory protection keys (PKU), which this machine does not have: run it under scripts/pku-vm"
    );
}

use serde::Serialize;

pub(crate) use self::elf::Image;
pub use self::elf::SymbolKind;
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
const GLIBC_LIBRARIES: &[&str] = &[
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
pub(crate) struct Assessment {
    /// Every import, classified, sorted by name.
    pub imports: Vec<Import>,
    /// Every reason to refuse it; empty when an mpk domain can hold it.
    pub reasons: Vec<Reason>,
}

/// Assesses the extension read as `image`.
pub(crate) fn assess(image: &Image<'_>) -> Assessment {
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
