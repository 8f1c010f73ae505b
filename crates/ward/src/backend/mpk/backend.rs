//! The mpk backend: a domain's memory (its extensions' images, the runtime's block and thunks, the heap), loading
//! into it, calling through the gate, and restoring it from the snapshot taken after load.
//!
//! # Memory
//!
//! One region tagged with the domain's key holds, in order: each extension's image, the runtime page (the
//! [`RuntimeBlock`]), the thunk pages, and the heap (`heap_bytes`, the domain's quota). Each host thread that calls
//! the domain has a stack and an argument area of its own (its `lanes::Lane`), regions with the same key, each
//! between guard pages: a stack overflow is a fault on the guard below the stack. A group's member added while the
//! domain runs gets a region of its own too. The domain's PKRU reads the host's memory (key 0), reads and writes its
//! own key and the signal key, and denies every other key: other domains are out of reach.
//!
//! # Calls
//!
//! Scalars go in registers. An input buffer or a string is passed as the host's own address (the domain may read
//! it, never write it); an output, in-out or scratch buffer is copied into the argument area, passed, and an
//! output copied back when the call returns (call-by-value-result). A callback becomes an outward stub to its
//! host-side entry. The core calls through its functions ([`ThreadFunction`]) without holding its own state borrowed, so a callback may
//! call the same domain again: the nested call starts on the domain's stack below the part in use. Other host
//! threads may be in the domain meanwhile, each in its own lane.
//!
//! # Recovery
//!
//! After load and initialisation every writable page of the images, the runtime page and the used part of the heap
//! are copied aside. A restart copies them back and clears the heap the failed incarnation used beyond them: the
//! domain is as it was just after initialisation, in microseconds, and the core replays its shadow log. Before
//! that, stopping the domain closes it (`gate::Occupancy`): the other threads' calls in it end, and none that was
//! out in the host goes back in.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ward_abi::{RegArgs, RegRet};
use ward_mpk::assess::imports::{self, ImportClass};
use ward_mpk::assess::{assess, scan, Image, Reason};
use ward_mpk::domain::checks;
use ward_mpk::domain::gate::{self, Ending, FloatState, GateFault, Occupancy, Presence};
use ward_mpk::domain::lanes::Lanes;
use ward_mpk::domain::loader::{self, ImportRequest, Placed};
use ward_mpk::domain::memory::{self, page_size, KeyedRegion};
use ward_mpk::domain::pku::{self, Pkru, ProtectionKey};
use ward_mpk::domain::runtime::{self, LibraryTable, RuntimeBlock};
use ward_mpk::domain::thread_block::{ThreadBlocks, TlsLayout};

use crate::backend::{
    Added, Backend, BackendError, Callable, ExtensionSpec, Refused, StartError, ThreadFunction, Unlocked, WireValue,
};
use crate::events::RestartVia;
use crate::fault::{DomainHint, FaultKind, SignalCause};
use crate::libfault::LibraryFaultKind;
use crate::tracker::Tracker;

/// Bytes of one thunk (`mov r9, imm64; mov rax, imm64; jmp rax`, padded with `int3`).
const THUNK_BYTES: usize = 32;
const PROT_READ_WRITE: i32 = libc::PROT_READ | libc::PROT_WRITE;

/// What an mpk domain is made of.
#[derive(Debug, Clone)]
pub(crate) struct MpkConfig {
    pub extensions: Vec<ExtensionSpec>,
    /// The heap quota in bytes.
    pub heap_bytes: usize,
    /// The deadline of the initialisers run at load.
    pub init_deadline: Duration,
}

/// Why a domain could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MpkError {
    #[error("this machine has no memory protection keys (PKU), or its kernel does not let programs switch the FS base (FSGSBASE)")]
    NoPku,
    #[error("cannot read it: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("no mpk domain can hold it: {why}")]
    Refused { path: PathBuf, why: String },
    #[error("no mpk domain can hold {}, which it opens: {why}", path.display())]
    RefusedLibrary { path: PathBuf, why: String },
    #[error("{source}")]
    Load { path: PathBuf, source: loader::LoadError },
    #[error("{what}: {source}")]
    System { what: &'static str, source: std::io::Error },
    #[error("{what} faulted during loading ({fault})")]
    InitFault { path: PathBuf, what: String, fault: String, kind: Option<FaultKind> },
    #[error("init function `{name}` {why}")]
    Init { path: PathBuf, name: String, why: String },
    #[error(
        "cannot keep a copy of its initialised state: the host could not allocate {bytes} bytes for it; give the \
         host more memory or run the extension in a process domain"
    )]
    Snapshot { bytes: usize },
}

fn system(what: &'static str) -> impl FnOnce(std::io::Error) -> MpkError {
    move |source| MpkError::System { what, source }
}

/// The memory of one incarnation's images and everything it needs to run, shared with calls in flight (which
/// keep it mapped until they return, even across a reload).
pub(crate) struct DomainMemory {
    rights: Pkru,
    key: u32,
    region: KeyedRegion,
    /// Each calling thread's stack and argument area.
    lanes: Lanes,
    /// Whether calls may enter, and closing the domain to the calls in it when it fails.
    occupancy: Occupancy,
    block: *mut RuntimeBlock,
    /// Every image, in the region's order.
    images: Vec<Placed>,
    /// Per extension, its index in `images`.
    extension_images: Vec<usize>,
    /// Where the heap starts (it runs to the end of `region`).
    heap_start: usize,
    /// The table of the libraries the extensions open (see `runtime::LibraryTable`), when they open any.
    _libraries: Option<KeyedRegion>,
    /// Those libraries (path, exports), from which a member added in place makes the table anew.
    opened: Mutex<Vec<OpenedLibrary>>,
    /// Extensions loaded into the running incarnation after it started, in order (their indices follow the
    /// others').
    additions: Mutex<Vec<Addition>>,
    /// The thread blocks the domain's code runs with, one per host thread that calls it.
    thread_blocks: ThreadBlocks,
    // Declared last: dropped after the regions tagged with it are unmapped.
    _key: ProtectionKey,
}

// SAFETY: the raw block pointer points into `region`, owned by this object; which thread may touch domain memory
// is up to PKRU. The host reads the block only while no call runs (between calls, or once `close` has returned).
unsafe impl Send for DomainMemory {}
// SAFETY: the block pointer points into `region`, owned by this object; the host makes a reference to the block only
// while no call runs (`RuntimeBlock::exhausted` reads it as shared memory). PKRU decides which thread may touch domain
// memory; the fields shared between threads lock or are atomic.
unsafe impl Sync for DomainMemory {}

impl DomainMemory {
    /// Lets this thread (as the host) read and write the domain's memory: a thread's PKRU starts without the
    /// domain's key.
    fn host_access(&self) {
        if !Pkru::current().writes(self.key) {
            gate::allow_on_this_thread(self.key);
        }
    }

    /// Makes the whole heap read-write again (the domain may have made guard pages in it), so the host can copy
    /// it; [`DomainMemory::reprotect`] puts the domain's protections back.
    fn heap_writable(&self) {
        let len = self.region.end() as usize - self.heap_start;
        // SAFETY: the heap is the tail of this domain's region; only protections change.
        if let Err(e) = unsafe { pku::protect_with_key(self.heap_start as *mut u8, len, PROT_READ_WRITE, self.key) } {
            tracing::warn!("cannot make an mpk domain's heap writable: {e}");
        }
    }

    /// Applies the protections the runtime block records for the heap (clamped to the heap by the block), and
    /// makes the heap past its committed end inaccessible again.
    fn reprotect(&self) {
        for (start, len, prot) in self.runtime().protected_ranges() {
            // SAFETY: the range lies in the heap (the block clamps its ranges to it), the tail of this domain's
            // region; only protections change.
            if let Err(e) = unsafe { pku::protect_with_key(start as *mut u8, len, prot, self.key) } {
                tracing::warn!("cannot re-protect part of an mpk domain's heap: {e}");
            }
        }
        if let Some(committed) = self.runtime().heap_committed() {
            let len = self.region.end() as usize - committed;
            // SAFETY: [committed, end) is the heap's unused tail (the block clamps `committed` to the heap), inside
            // this domain's region; only protections change.
            if let Err(e) = unsafe { pku::protect_with_key(committed as *mut u8, len, libc::PROT_NONE, self.key) } {
                tracing::warn!("cannot make an mpk domain's unused heap inaccessible again: {e}");
            }
        }
    }

    fn runtime(&self) -> &RuntimeBlock {
        self.host_access();
        // SAFETY: the block lies in `region`, laid out by RuntimeBlock::init; no thread runs in the domain (this is
        // asked while it loads, once it is closed, or as it is dropped).
        unsafe { &*self.block }
    }

    /// Calls `func` inside the domain, on this thread's stack there, as a call made in `epoch` (see
    /// `gate::Occupancy`): a call made before the domain was closed ends with [`BackendError::Closed`].
    fn enter(
        &self,
        func: usize,
        args: &RegArgs,
        deadline: Option<Duration>,
        epoch: u64,
    ) -> Result<RegRet, BackendError> {
        let lane = self.lanes.for_this_thread().map_err(|e| {
            BackendError::Usage(format!("cannot make this thread's stack and argument area in an mpk domain: {e}"))
        })?;
        // Below the part in use when this thread is in a call out of the domain; else at the top.
        let top = gate::nested_stack_top(lane.stack.start() as usize..lane.stack.end() as usize)
            .unwrap_or_else(|| lane.stack.end());
        let thread_pointer = self
            .thread_blocks
            .pointer_for_this_thread()
            .map_err(|e| BackendError::Usage(format!("cannot make this thread's block in an mpk domain: {e}")))?;
        let presence = Presence { occupancy: &self.occupancy, occupant: &lane.occupant, epoch };
        // SAFETY: func is code of this domain's images (resolved from their exports or initialisers); it takes
        // register arguments only (the policy's contract, as for a process domain) and cannot unwind into the host
        // (it is C, or returns through the gate); the stack is this thread's in this domain (no other thread uses
        // it), and a nested call starts below the part in use; the thread block and the occupant are this
        // thread's in this domain, owned by it for as long as the domain.
        let r = unsafe {
            gate::call(
                func as *const c_void,
                args,
                self.rights,
                top,
                deadline,
                thread_pointer,
                &lane.float_control,
                Some(presence),
            )
        };
        match r {
            Ok(Ok(ret)) => Ok(ret),
            Ok(Err(_)) if self.occupancy.epoch() != epoch => Err(BackendError::Closed),
            Ok(Err(fault)) => Err(self.classify(&fault)),
            Err(e) => Err(BackendError::Usage(format!("cannot prepare this thread for mpk calls: {e}"))),
        }
    }

    /// Calls `func` inside the domain as a call made now.
    fn enter_now(&self, func: usize, args: &RegArgs, deadline: Option<Duration>) -> Result<RegRet, BackendError> {
        self.enter(func, args, deadline, self.occupancy.epoch())
    }

    /// Ends every call in the domain (see `gate::Occupancy`); returns once no thread runs its code.
    fn close(&self) {
        let lanes = self.lanes.all();
        self.occupancy.close(lanes.iter().map(|lane| &lane.occupant));
    }

    /// What a fault at the gate means.
    fn classify(&self, fault: &GateFault) -> BackendError {
        let fault = match fault {
            GateFault::Signal(fault) => fault,
            GateFault::Refused(refused) => {
                return BackendError::Fault(FaultKind::Protocol {
                    what: format!("the extension called {} with {}", refused.function, refused.why.describe()),
                })
            }
            // How the domain asked to end the process comes with this thread's fault, not from the shared block.
            GateFault::Ended(Ending::Exit { status }) => {
                return BackendError::Fault(FaultKind::Exited { status: *status })
            }
            GateFault::Ended(Ending::Abort) => {
                return BackendError::Fault(FaultKind::Signal {
                    signo: libc::SIGABRT,
                    cause: SignalCause::Abort,
                    addr: None,
                })
            }
            GateFault::Closed => return BackendError::Closed,
        };
        if fault.signal == gate::timeout_signal() {
            return BackendError::TimedOut;
        }
        // The program counter is in no fault message (it means nothing to a user); with the placement lines it
        // says which instruction of which image faulted.
        tracing::debug!(
            signal = fault.signal,
            code = fault.code,
            addr = format_args!("{:#x}", fault.addr),
            pc = format_args!("{:#x}", fault.pc),
            "mpk: fault in a domain"
        );
        // The fault is this thread's, so the stack it overflowed is this thread's lane's.
        let overflowed = self.lanes.for_this_thread().is_ok_and(|lane| lane.stack_guard().contains(&fault.addr));
        self.host_access();
        // SAFETY: the block lies in `region`, laid out by RuntimeBlock::init.
        let exhausted = unsafe { RuntimeBlock::exhausted(self.block) };
        let hint = if fault.signal == libc::SIGSEGV && overflowed {
            DomainHint::StackOverflow
        } else if exhausted {
            DomainHint::MemoryExhausted
        } else {
            DomainHint::None
        };
        let addr = Some(fault.addr as u64);
        // A key violation is memory the domain may not touch (the host's, written; another domain's), whatever
        // its address.
        let cause = if fault.is_key_violation() && hint == DomainHint::None {
            SignalCause::InvalidAccess
        } else {
            SignalCause::classify(fault.signal, addr, hint)
        };
        BackendError::Fault(FaultKind::Signal { signo: fault.signal, cause, addr })
    }
}

/// An extension loaded into a running domain (a group's new member), with the library it opens, in a region of its
/// own with the domain's key.
struct Addition {
    _region: KeyedRegion,
    images: Vec<Placed>,
    /// The extension's index in `images` (the last: the library it opens comes first).
    extension: usize,
    /// The library table that replaced the domain's, when it opens a library.
    _libraries: Option<KeyedRegion>,
}

/// A library an extension opens in the domain: its path and its exports (name to address).
type OpenedLibrary = (Vec<u8>, HashMap<String, usize>);

/// Bytes of thunk pages for the imports of `files`.
fn thunk_pages_for(files: &[ToPlace], page: usize) -> usize {
    let bytes = files.iter().map(|f| f.classes.len()).sum::<usize>().max(1) * THUNK_BYTES;
    bytes.div_ceil(page) * page
}

/// Places `files` one after the other from `base` (fresh memory of the domain's key, writable by this thread),
/// binding their imports through `thunks`.
fn place_files(
    files: &[ToPlace],
    base: usize,
    tls_modules: Vec<Option<loader::TlsModule>>,
    thunks: &mut Thunks,
    block: *mut RuntimeBlock,
    page: usize,
) -> Result<Vec<Placed>, MpkError> {
    let mut placed = Vec::new();
    let mut at = base;
    for (file, tls_module) in files.iter().zip(tls_modules) {
        let load_error = |source| MpkError::Load { path: file.path.clone(), source };
        // SAFETY: [at, at + span) is part of the caller's fresh region, writable by this thread, used by nothing
        // else.
        let image = unsafe {
            loader::place(&file.bytes, at as *mut u8, file.span, page, tls_module, |request| {
                bind(request, &file.classes, thunks, block, file.library_fault)
            })
        }
        .map_err(load_error)?;
        tracing::debug!(path = %file.path.display(), base = format_args!("{at:#x}"), "mpk: image placed");
        placed.push(image);
        at += file.span;
    }
    Ok(placed)
}

/// Refuses thunks whose bytes spell a forbidden instruction, then makes their pages executable.
fn seal_thunks(at: usize, len: usize, key: u32, path: &Path) -> Result<(), MpkError> {
    // The thunks hold addresses; an address whose bytes spell WRPKRU, XRSTOR or WRFSBASE would give the domain one.
    // SAFETY: the thunk pages were written by the caller and lie in its region.
    let code = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
    if !scan::find_forbidden(code).is_empty() {
        return Err(MpkError::Refused {
            path: path.to_path_buf(),
            why: "an address in the runtime's thunks contains a forbidden instruction's bytes".into(),
        });
    }
    // SAFETY: the thunk pages are the caller's region's.
    unsafe { pku::protect_with_key(at as *mut u8, len, libc::PROT_READ | libc::PROT_EXEC, key) }
        .map_err(system("cannot protect the thunks"))
}

/// Page protections, keyed: each image's pages as its segments say.
fn protect_images(placed: &[Placed], base: usize, page: usize, key: u32) -> Result<(), MpkError> {
    let mut at = base;
    for image in placed {
        let mut p = 0;
        while p < image.page_prot.len() {
            let prot = image.page_prot[p];
            let run = image.page_prot[p..].iter().take_while(|&&q| q == prot).count();
            // SAFETY: the pages are the caller's region's; their protections are this domain's to set.
            unsafe { pku::protect_with_key((at + p * page) as *mut u8, run * page, prot, key) }
                .map_err(system("cannot protect the image"))?;
            p += run;
        }
        at += image.page_prot.len() * page;
    }
    Ok(())
}

/// The table of `libraries` (path, exports) for the runtime's dlopen, in read-only pages of the key, handed to the
/// runtime `block`; None when there are none.
fn library_table(
    libraries: &[OpenedLibrary],
    key: u32,
    block: *mut RuntimeBlock,
) -> Result<Option<KeyedRegion>, MpkError> {
    if libraries.is_empty() {
        return Ok(None);
    }
    let entries: Vec<(&[u8], &HashMap<String, usize>)> = libraries.iter().map(|(p, e)| (p.as_slice(), e)).collect();
    let table = LibraryTable::new(&entries);
    let pages = KeyedRegion::new(table.bytes.len(), key).map_err(system("cannot map the library table"))?;
    // SAFETY: the table fits the fresh region (made for its length), writable by this thread.
    unsafe { std::ptr::copy_nonoverlapping(table.bytes.as_ptr(), pages.start(), table.bytes.len()) };
    // SAFETY: the region is this domain's, made above.
    unsafe { pku::protect_with_key(pages.start(), pages.len(), libc::PROT_READ, key) }
        .map_err(system("cannot protect the library table"))?;
    // SAFETY: the block is laid out and writable by this thread; the runtime's lock keeps threads running in the
    // domain from reading the two words half-written.
    unsafe { runtime::with_block(block, |b| b.set_libraries(pages.start() as usize, table.bytes.len())) };
    Ok(Some(pages))
}

/// Runs, inside the domain, the initialisers of `images` (placed from `files`: a library's before the extension
/// that opens it), then each extension's init function as its policy names it (`cfg.extensions`).
fn initialise(memory: &DomainMemory, images: &[Placed], files: &[ToPlace], cfg: &MpkConfig) -> Result<(), MpkError> {
    for (image, file) in images.iter().zip(files) {
        for &f in &image.init {
            memory.enter_now(f, &RegArgs::default(), Some(cfg.init_deadline)).map_err(|e| MpkError::InitFault {
                path: file.path.clone(),
                what: "an initialiser".into(),
                fault: describe(&e),
                kind: fault_kind(e, cfg.init_deadline),
            })?;
        }
        let Some(name) = file.extension.and_then(|i| cfg.extensions.get(i)).and_then(|s| s.init.as_ref()) else {
            continue;
        };
        let f = image.export(name).ok_or_else(|| MpkError::Init {
            path: file.path.clone(),
            name: name.clone(),
            why: "is not exported".into(),
        })?;
        let r = memory.enter_now(f, &RegArgs::default(), Some(cfg.init_deadline)).map_err(|e| MpkError::InitFault {
            path: file.path.clone(),
            what: format!("`{name}`"),
            fault: describe(&e),
            kind: fault_kind(e, cfg.init_deadline),
        })?;
        if r.int != 0 {
            return Err(MpkError::Init {
                path: file.path.clone(),
                name: name.clone(),
                why: format!("returned {}", r.as_i64()),
            });
        }
    }
    Ok(())
}

/// A file to place in a domain: an extension, or a library loaded with one.
struct ToPlace {
    path: PathBuf,
    bytes: Vec<u8>,
    classes: HashMap<String, ImportClass>,
    span: usize,
    /// The extension's index, when it is one.
    extension: Option<usize>,
    /// The kind of run-time library fault its calls get, if any.
    library_fault: Option<LibraryFaultKind>,
}

/// The pages saved after load and initialisation.
struct Snapshot {
    /// Ranges saved byte for byte.
    pages: Vec<(usize, Vec<u8>)>,
    /// Ranges of the heap that were all zero, as (start, end): saved as nothing, cleared on restore. A plugin that
    /// reserves a large buffer while it initialises and writes little of it costs the host no copy of the rest.
    zeros: Vec<(usize, usize)>,
    heap_top: usize,
}

pub(crate) struct MpkBackend {
    cfg: MpkConfig,
    memory: Option<Arc<DomainMemory>>,
    snapshot: Option<Snapshot>,
    /// The extension list changed since the snapshot: the next restart loads afresh.
    reload: bool,
    /// Set between a fault and the restart.
    stopped: bool,
}

impl MpkBackend {
    pub fn start(cfg: MpkConfig) -> Result<MpkBackend, MpkError> {
        if !super::pku_available() {
            return Err(MpkError::NoPku);
        }
        let mut b = MpkBackend { cfg, memory: None, snapshot: None, reload: true, stopped: false };
        b.load()?;
        Ok(b)
    }

    /// Reads and assesses one file to place: an extension, or a library loaded with it (`opens_libraries` says the
    /// extension opens such libraries, so its `dlopen` and `dlsym` are the runtime's).
    fn read(path: &Path, opens_libraries: bool) -> Result<ToPlace, MpkError> {
        let page = page_size();
        let bytes = std::fs::read(path).map_err(|source| MpkError::Read { path: path.to_path_buf(), source })?;
        let image =
            Image::parse(&bytes).map_err(|why| MpkError::Refused { path: path.to_path_buf(), why: why.to_string() })?;
        let mut assessment = assess(&image);
        let lifted = |name: &str| opens_libraries && imports::LIBRARY_LOOKUP.contains(&name);
        assessment.reasons.retain(|r| !matches!(r, Reason::UnsupportedImport { import, .. } if lifted(&import.name)));
        if !assessment.reasons.is_empty() {
            let why = assessment.reasons.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("; ");
            return Err(MpkError::Refused { path: path.to_path_buf(), why });
        }
        let classes: HashMap<String, ImportClass> = assessment
            .imports
            .iter()
            .map(|i| (i.name.clone(), if lifted(&i.name) { ImportClass::DomainRuntime } else { i.class }))
            .collect();
        let span = loader::span(&bytes, page).map_err(|source| MpkError::Load { path: path.to_path_buf(), source })?;
        Ok(ToPlace { path: path.to_path_buf(), bytes, classes, span, extension: None, library_fault: None })
    }

    /// The files to place for extension `index`: the library it opens, if any, then the extension itself.
    fn files_of(spec: &ExtensionSpec, index: usize) -> Result<Vec<ToPlace>, MpkError> {
        let mut files = Vec::new();
        // The library fault goes to the calls of the plugin an adapter opens, else of the extension.
        let faulted = spec.library_fault.map(|f| f.kind());
        if let Some(library) = &spec.opens {
            let mut file = Self::read(library, false).map_err(|e| match e {
                MpkError::Refused { path, why } => MpkError::RefusedLibrary { path, why },
                other => other,
            })?;
            file.library_fault = faulted;
            files.push(file);
        }
        let mut file = Self::read(&spec.path, spec.opens.is_some())?;
        file.extension = Some(index);
        if spec.opens.is_none() {
            file.library_fault = faulted;
        }
        files.push(file);
        Ok(files)
    }

    /// Loads every extension afresh (each after the library it opens, if any), runs the initialisers, and takes
    /// the snapshot.
    fn load(&mut self) -> Result<(), MpkError> {
        self.memory = None;
        self.snapshot = None;
        let page = page_size();
        let mut files = Vec::new();
        for (i, spec) in self.cfg.extensions.iter().enumerate() {
            files.extend(Self::files_of(spec, i)?);
        }
        let thunk_pages = thunk_pages_for(&files, page);
        let runtime_page = (runtime::LOCK_BYTES + std::mem::size_of::<RuntimeBlock>()).div_ceil(page) * page;
        let images: usize = files.iter().map(|f| f.span).sum();
        // Under an address-space limit the domain reserves at most half of what the host has left, so that
        // neither fails for lack of room: the domain's quota is then the smaller of the two.
        let room = memory::address_space_room().map_or(usize::MAX, |room| room / 2);
        let heap = self.cfg.heap_bytes.min(room).div_ceil(page) * page;

        let key = ProtectionKey::allocate().map_err(system("cannot allocate a protection key"))?;
        let signal = gate::signal_key().map_err(system("cannot install the fault handlers"))?;
        gate::closing_ready().map_err(system("cannot register for membarrier, which closing a failed domain needs"))?;
        // Host handlers installed since the last look run with the host's rights wherever their signal comes.
        gate::adopt_host_handlers();
        let k = key.number();
        let region = KeyedRegion::new(images + runtime_page + thunk_pages + heap, k)
            .map_err(system("cannot map the domain's memory"))?;
        gate::allow_on_this_thread(k);
        let base = region.start() as usize;
        // The runtime's lock word, then its block.
        let block_at = base + images + runtime::LOCK_BYTES;
        let thunks_at = base + images + runtime_page;
        let heap_at = thunks_at + thunk_pages;
        let block = block_at as *mut RuntimeBlock;
        // SAFETY: the runtime page lies in the region just mapped, writable by this thread, page-aligned.
        unsafe { RuntimeBlock::init(block, heap_at, heap, k) };
        // The heap is inaccessible until the runtime hands it out, so a write off the end of the last block faults.
        // SAFETY: the heap is the region's tail, mapped above; only its protection changes.
        unsafe { pku::protect_with_key(heap_at as *mut u8, heap, libc::PROT_NONE, k) }
            .map_err(system("cannot protect the domain's heap"))?;
        // SAFETY: the block was just laid out.
        unsafe { (*block).guard_heap_top() };
        if let Some(fault) = self.cfg.extensions.iter().find_map(|s| s.library_fault.as_ref()) {
            // SAFETY: the block was just laid out, and nothing runs in the domain yet.
            unsafe { (*block).set_library_fault(fault) };
        }

        // The images' own thread-local storage, in every thread block below the host's.
        let templates = files
            .iter()
            .map(|file| {
                loader::tls_template(&file.bytes, page)
                    .map_err(|source| MpkError::Load { path: file.path.clone(), source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (tls, tls_modules) =
            TlsLayout::new(&templates).map_err(system("cannot lay out the domain's thread-local storage"))?;

        let mut thunks =
            Thunks { next: thunks_at, end: thunks_at + thunk_pages, block: block_at, made: HashMap::new() };
        let placed = place_files(&files, base, tls_modules, &mut thunks, block, page)?;
        seal_thunks(thunks_at, thunk_pages, k, &self.cfg.extensions[0].path)?;
        protect_images(&placed, base, page, k)?;

        // The libraries the extensions open, in read-only pages of the key, for the runtime's dlopen.
        let opened: Vec<OpenedLibrary> = files
            .iter()
            .zip(&placed)
            .filter(|(f, _)| f.extension.is_none())
            .map(|(f, image)| (f.path.as_os_str().as_encoded_bytes().to_vec(), image.exports.clone()))
            .collect();
        let libraries = library_table(&opened, k, block)?;
        let extension_images =
            files.iter().enumerate().filter(|(_, f)| f.extension.is_some()).map(|(j, _)| j).collect();

        let rights = Pkru::DENY_ALL.read_only(pku::HOST_KEY).allow(k).allow(signal);
        let memory = Arc::new(DomainMemory {
            rights,
            key: k,
            region,
            // A domain starts with the state of the thread that loads it, as a plugin loaded natively would.
            lanes: Lanes::new(k, FloatState::of_this_thread()),
            occupancy: Occupancy::default(),
            block,
            images: placed,
            extension_images,
            heap_start: heap_at,
            _libraries: libraries,
            opened: Mutex::new(opened),
            additions: Mutex::new(Vec::new()),
            thread_blocks: ThreadBlocks::new(k, tls),
            _key: key,
        });

        // Initialisers (a library's before the extension that opens it), then the policy's init function, inside
        // the domain.
        initialise(&memory, &memory.images, &files, &self.cfg)?;
        let snapshot = take_snapshot(&memory, page).map_err(|bytes| MpkError::Snapshot { bytes })?;
        // What the initialisers left on the loading thread is what every thread starts with, and a restore puts back.
        if let Ok(lane) = memory.lanes.for_this_thread() {
            memory.lanes.keep_float_control(lane.float_control.get());
        }
        // The loading thread's thread-locals as the initialisers left them are part of the state a restore brings
        // back, like the rest of the snapshot.
        memory.thread_blocks.keep_as_pristine();
        self.snapshot = Some(snapshot);
        self.memory = Some(memory);
        self.reload = false;
        self.stopped = false;
        Ok(())
    }

    /// Loads one more extension into the running incarnation (a group's new member), in a region of its own with
    /// the domain's key, and runs its initialisers there: the members already there keep their state. The snapshot
    /// no longer describes the domain, so the next restart loads every extension afresh.
    ///
    /// `Ok(None)` when it cannot be done in place (no running incarnation; thread-local storage, which the thread
    /// blocks were laid out without; a run-time library fault): the caller lists it for the next restart.
    fn add_in_place(&mut self, spec: &ExtensionSpec) -> Result<Option<()>, Refused> {
        let refused = |reason: String, restart: bool| Refused { reason, restart };
        let Some(memory) = self.memory.clone().filter(|_| !self.stopped) else { return Ok(None) };
        if spec.library_fault.is_some() {
            return Ok(None);
        }
        let page = page_size();
        let index = self.cfg.extensions.len();
        let files = Self::files_of(spec, index).map_err(|e| refused(e.to_string(), false))?;
        for file in &files {
            let template = loader::tls_template(&file.bytes, page)
                .map_err(|source| refused(MpkError::Load { path: file.path.clone(), source }.to_string(), false))?;
            if template.is_some() {
                return Ok(None);
            }
        }
        let thunk_pages = thunk_pages_for(&files, page);
        let images: usize = files.iter().map(|f| f.span).sum();
        let k = memory.key;
        memory.host_access();
        let region = KeyedRegion::new(images + thunk_pages, k)
            .map_err(|e| refused(format!("cannot map memory for it in the mpk domain: {e}"), false))?;
        let base = region.start() as usize;
        let thunks_at = base + images;
        let mut thunks = Thunks {
            next: thunks_at,
            end: thunks_at + thunk_pages,
            block: memory.block as usize,
            made: HashMap::new(),
        };
        let mut placing = || -> Result<(Vec<Placed>, Option<KeyedRegion>), MpkError> {
            let placed = place_files(&files, base, vec![None; files.len()], &mut thunks, memory.block, page)?;
            seal_thunks(thunks_at, thunk_pages, k, &spec.path)?;
            protect_images(&placed, base, page, k)?;
            // The domain's dlopen finds the libraries it opened before and the new member's. The table it used
            // stays mapped: handles the domain holds point into it.
            let mut opened = memory.opened.lock().unwrap_or_else(|e| e.into_inner());
            let mut all = opened.clone();
            all.extend(
                files
                    .iter()
                    .zip(&placed)
                    .filter(|(f, _)| f.extension.is_none())
                    .map(|(f, image)| (f.path.as_os_str().as_encoded_bytes().to_vec(), image.exports.clone())),
            );
            let libraries = if all.len() > opened.len() { library_table(&all, k, memory.block)? } else { None };
            *opened = all;
            Ok((placed, libraries))
        };
        let (placed, libraries) = placing().map_err(|e| refused(e.to_string(), false))?;
        // From here the domain has changed: whatever happens next, the next restart loads afresh.
        self.reload = true;
        self.cfg.extensions.push(spec.clone());
        let initialised = initialise(&memory, &placed, &files, &self.cfg);
        // Kept mapped either way until the domain is loaded afresh: code the initialisers ran may have left
        // pointers to it behind.
        let extension = placed.len() - 1;
        memory.additions.lock().unwrap_or_else(|e| e.into_inner()).push(Addition {
            _region: region,
            images: placed,
            extension,
            _libraries: libraries,
        });
        if let Err(e) = initialised {
            // Its initialiser failed in the running domain, which may have been left changed: the group restarts
            // without it.
            self.cfg.extensions.pop();
            return Err(refused(e.to_string(), true));
        }
        Ok(Some(()))
    }

    /// Puts the domain's memory back as it was after initialisation.
    fn restore(&mut self) -> bool {
        let (Some(memory), Some(snapshot)) = (&self.memory, &self.snapshot) else {
            return false;
        };
        memory.host_access();
        memory.heap_writable();
        let (heap_start, heap_top) = memory.runtime().heap_used();
        let heap_end = memory.region.end() as usize;
        // The failed incarnation may have written any value there: clamp it to the heap.
        let used_to = heap_top.clamp(heap_start, heap_end);
        // SAFETY: the snapshot was taken of this memory, every range of it writable by the host now, and
        // [heap start, used_to) is the heap.
        unsafe { snapshot.put_back(used_to) };
        memory.reprotect();
        // SAFETY: no call is running (the domain was closed when it was stopped), and the host may write the
        // domain's key.
        unsafe { memory.thread_blocks.reset() };
        memory.lanes.reset_float_control();
        true
    }

    fn memory(&self) -> Result<&Arc<DomainMemory>, BackendError> {
        match &self.memory {
            Some(m) if !self.stopped => Ok(m),
            _ => Err(BackendError::Fault(FaultKind::Vanished)),
        }
    }
}

impl Drop for MpkBackend {
    fn drop(&mut self) {
        // Destructors the extension registered run as the domain goes, inside it; a fault there only ends them.
        let Some(memory) = &self.memory else { return };
        if self.stopped {
            return;
        }
        for (func, arg) in memory.runtime().destructors() {
            let mut args = RegArgs::default();
            args.ints[0] = arg as u64;
            if memory.enter_now(func, &args, Some(self.cfg.init_deadline)).is_err() {
                break;
            }
        }
    }
}

/// The fault a failed call into the domain was, if it was one (and not a misuse).
fn fault_kind(e: BackendError, deadline: Duration) -> Option<FaultKind> {
    match e {
        BackendError::Fault(kind) => Some(kind),
        BackendError::TimedOut => Some(FaultKind::Timeout { deadline }),
        // Loading and tearing down run on one thread, with no other call to close the domain under them.
        BackendError::Usage(_) | BackendError::UnknownSymbol | BackendError::Closed => None,
    }
}

impl MpkError {
    /// The fault of the extension's own code that made loading fail, when that is why (an initialiser crashed or
    /// hung): a fault like any other, which `restart_from` may recover from.
    pub(crate) fn load_fault(&self) -> Option<&FaultKind> {
        match self {
            MpkError::InitFault { kind, .. } => kind.as_ref(),
            _ => None,
        }
    }
}

fn describe(e: &BackendError) -> String {
    match e {
        BackendError::Fault(kind) => kind.cause(),
        BackendError::TimedOut => "past its deadline".into(),
        BackendError::Usage(why) => why.clone(),
        BackendError::UnknownSymbol => "unknown symbol".into(),
        BackendError::Closed => "ended: the domain was closed under it".into(),
    }
}

/// Copies what the domain's writable memory holds after initialisation. Fails, with the number of bytes it would
/// have had to keep, when the host cannot allocate the copy: the size is the extension's doing, so it must not abort
/// the host.
fn take_snapshot(memory: &DomainMemory, page: usize) -> Result<Snapshot, usize> {
    memory.host_access();
    let (heap_start, heap_top) = memory.runtime().heap_used();
    let mut snapshot = Snapshot { pages: Vec::new(), zeros: Vec::new(), heap_top };
    let mut at = memory.region.start() as usize;
    for image in &memory.images {
        for (i, prot) in image.page_prot.iter().enumerate() {
            if prot & libc::PROT_WRITE != 0 {
                let address = at + i * page;
                // SAFETY: a writable page of the region, readable by the host.
                snapshot.save(address, unsafe { std::slice::from_raw_parts(address as *const u8, page) })?;
            }
        }
        at += image.page_prot.len() * page;
    }
    // The block and its lock word before it (free now: a restore frees it if a failed call left it held).
    let block = memory.block as usize - runtime::LOCK_BYTES;
    let block_len = runtime::LOCK_BYTES + std::mem::size_of::<RuntimeBlock>();
    // SAFETY: the lock word and the block lie in the region.
    snapshot.save(block, unsafe { std::slice::from_raw_parts(block as *const u8, block_len) })?;
    // Guard pages the extension made while it initialised would stop the copy; they are back after it.
    memory.heap_writable();
    let saved = snapshot.save_heap(heap_start, heap_top, page);
    memory.reprotect();
    saved?;
    Ok(snapshot)
}

impl Snapshot {
    /// Keeps a copy of `bytes`, found at `address`.
    fn save(&mut self, address: usize, bytes: &[u8]) -> Result<(), usize> {
        let mut copy = Vec::new();
        copy.try_reserve_exact(bytes.len()).map_err(|_| bytes.len())?;
        copy.extend_from_slice(bytes);
        self.pages.push((address, copy));
        Ok(())
    }

    /// Keeps the used heap `[start, top)` page by page: runs of pages holding data are copied, runs of zero pages
    /// are only noted.
    fn save_heap(&mut self, start: usize, top: usize, page: usize) -> Result<(), usize> {
        let mut run: Option<(usize, bool)> = None;
        let mut at = start;
        while at < top {
            let end = (at + page - at % page).min(top);
            // SAFETY: [at, end) lies in the used heap, in the region, readable by the host now.
            let zero = unsafe { std::slice::from_raw_parts(at as *const u8, end - at) }.iter().all(|&b| b == 0);
            match run {
                Some((_, was_zero)) if was_zero == zero => {}
                Some((from, was_zero)) => {
                    self.save_run(from, at, was_zero)?;
                    run = Some((at, zero));
                }
                None => run = Some((at, zero)),
            }
            at = end;
        }
        match run {
            Some((from, zero)) => self.save_run(from, top, zero),
            None => Ok(()),
        }
    }

    /// Writes every saved range back and clears the heap from the snapshot's top to `used_to`.
    ///
    /// # Safety
    /// The memory the snapshot was taken of must still be mapped and writable by this thread, and the snapshot's
    /// heap must run at least to `used_to` (private anonymous memory).
    unsafe fn put_back(&self, used_to: usize) {
        for (address, bytes) in &self.pages {
            // SAFETY: each saved range lies in that memory (the caller's guarantee).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), *address as *mut u8, bytes.len()) };
        }
        for &(start, end) in &self.zeros {
            // SAFETY: a range of the heap, as above.
            unsafe { clear(start, end) };
        }
        if used_to > self.heap_top {
            // SAFETY: [top, used_to) lies in the heap (the caller's guarantee).
            unsafe { clear(self.heap_top, used_to) };
        }
    }

    fn save_run(&mut self, start: usize, end: usize, zero: bool) -> Result<(), usize> {
        if zero {
            self.zeros.push((start, end));
            Ok(())
        } else {
            // SAFETY: [start, end) lies in the used heap (save_heap's caller), readable by the host now.
            self.save(start, unsafe { std::slice::from_raw_parts(start as *const u8, end - start) })
        }
    }
}

/// Sets `[start, end)` of the domain's heap to zero. Whole pages go back to the kernel (zero on next touch, key and
/// protection kept), so a large range costs no time to clear; the part pages at either end are cleared by hand.
///
/// # Safety
/// `[start, end)` must lie in a domain's heap (private anonymous memory), writable by this thread.
unsafe fn clear(start: usize, end: usize) {
    let page = page_size();
    let first_page = start.div_ceil(page) * page;
    let last_page = end / page * page;
    if last_page <= first_page || last_page - first_page < CLEAR_BY_KERNEL {
        // SAFETY: the caller's range, writable.
        unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) };
        return;
    }
    // SAFETY: the part pages of the caller's range, writable.
    unsafe {
        std::ptr::write_bytes(start as *mut u8, 0, first_page - start);
        std::ptr::write_bytes(last_page as *mut u8, 0, end - last_page);
    }
    // SAFETY: whole pages of the caller's range; MADV_DONTNEED on private anonymous memory only drops their contents
    // (they read as zero again).
    if unsafe { libc::madvise(first_page as *mut c_void, last_page - first_page, libc::MADV_DONTNEED) } != 0 {
        // SAFETY: [first_page, last_page) lies in the caller's range, writable (this function's contract).
        unsafe { std::ptr::write_bytes(first_page as *mut u8, 0, last_page - first_page) };
    }
}

/// Below this many bytes of whole pages, clearing them by hand is cheaper than a system call and the page faults
/// that follow it.
const CLEAR_BY_KERNEL: usize = 64 * 1024;

/// The thunks being written into a domain's thunk pages.
struct Thunks {
    next: usize,
    end: usize,
    block: usize,
    made: HashMap<usize, usize>,
}

impl Thunks {
    /// A thunk that calls `function` with the block as its sixth argument.
    fn to(&mut self, function: *const c_void) -> Option<usize> {
        if let Some(&t) = self.made.get(&(function as usize)) {
            return Some(t);
        }
        if self.next + THUNK_BYTES > self.end {
            return None;
        }
        let mut code = [0xccu8; THUNK_BYTES];
        code[..2].copy_from_slice(&[0x49, 0xb9]); // mov r9, imm64
        code[2..10].copy_from_slice(&(self.block as u64).to_le_bytes());
        code[10..12].copy_from_slice(&[0x48, 0xb8]); // mov rax, imm64
        code[12..20].copy_from_slice(&(function as u64).to_le_bytes());
        code[20..22].copy_from_slice(&[0xff, 0xe0]); // jmp rax
        let at = self.next;
        // SAFETY: [at, at + THUNK_BYTES) lies in the thunk pages (checked above), still writable.
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, THUNK_BYTES) };
        self.next += THUNK_BYTES;
        self.made.insert(function as usize, at);
        Some(at)
    }
}

/// Binds one import by its class (DESIGN.md §7; the table in `imports`).
fn bind(
    request: &ImportRequest<'_>,
    classes: &HashMap<String, ImportClass>,
    thunks: &mut Thunks,
    block: *mut RuntimeBlock,
    library_fault: Option<LibraryFaultKind>,
) -> Option<usize> {
    if let Some(f) = library_fault.and_then(|kind| runtime::library_fault_function(kind, request.name)) {
        return thunks.to(f);
    }
    let class = classes.get(request.name).copied().unwrap_or(ImportClass::Unsupported);
    match class {
        ImportClass::DomainRuntime => {
            if request.name == "_ZSt7nothrow" {
                return Some(RuntimeBlock::nothrow_address(block));
            }
            thunks.to(runtime::function(request.name)?)
        }
        ImportClass::Fault => thunks.to(runtime::fault_function(request.name)),
        ImportClass::Toolchain => Some(0),
        // Data the host's libraries define (`stderr`, tables) is read in place.
        _ if request.object => host_symbol(request),
        ImportClass::Pure => host_symbol(request).or_else(|| math_library_symbol(request)),
        ImportClass::HostGate => {
            let target = host_symbol(request)?;
            gate::outward_for_checked(target as *const c_void, checks::for_import(request.name)).map(|p| p as usize)
        }
        ImportClass::Unsupported => None,
    }
}

/// The host's definition of an import, as the dynamic linker would bind it.
fn host_symbol(request: &ImportRequest<'_>) -> Option<usize> {
    let name = CString::new(request.name).ok()?;
    let found = match request.version.and_then(|v| CString::new(v).ok()) {
        // SAFETY: valid C strings; RTLD_DEFAULT searches the host's global scope.
        Some(version) => unsafe { libc::dlvsym(libc::RTLD_DEFAULT, name.as_ptr(), version.as_ptr()) },
        None => std::ptr::null_mut(),
    };
    let found = if found.is_null() {
        // SAFETY: `name` is a valid C string; RTLD_DEFAULT searches the host's global scope.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
    } else {
        found
    };
    (!found.is_null()).then_some(found as usize)
}

/// A pure import from one of libm's libraries that the host itself has not loaded (`libmvec.so.1`, whose vector
/// functions GCC calls from auto-vectorised loops; the host's own code rarely needs it). The library is opened in
/// the host and never closed, as the dynamic linker would have opened it for the extension (opening it again for the
/// next import gives the same handle): libm's libraries keep no state, so running their code in the domain is what
/// binding a loaded one does.
fn math_library_symbol(request: &ImportRequest<'_>) -> Option<usize> {
    let library = request.library.filter(|l| imports::LIBM_LIBRARIES.contains(l))?;
    let library = CString::new(library).ok()?;
    let name = CString::new(request.name).ok()?;
    // SAFETY: a valid C string; libm's libraries have no initialisers that touch the host's state. Opened with
    // RTLD_LOCAL, they add nothing to the host's global scope, and the handle is kept (never closed) because the
    // domain's bindings point into the library.
    let handle = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    let found = match request.version.and_then(|v| CString::new(v).ok()) {
        // SAFETY: a handle dlopen returned and valid C strings.
        Some(version) => unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) },
        // SAFETY: a handle dlopen returned (never closed) and a valid C string.
        None => unsafe { libc::dlsym(handle, name.as_ptr()) },
    };
    (!found.is_null()).then_some(found as usize)
}

/// A domain function, called on the host's thread through the gate.
struct GatedFunction {
    memory: Arc<DomainMemory>,
    func: usize,
}

/// Buffers of one gated call in the argument area, to copy back and release.
struct GatedFrame {
    /// Where the argument area's top was before the call.
    mark: usize,
    /// Per output (`Out`/`InOut`, in argument order): its copy in the argument area.
    outputs: smallvec::SmallVec<[(usize, usize); 2]>,
}

impl ThreadFunction for GatedFunction {
    /// Inputs the domain may read in place are passed as they are; outputs and writable inputs get a copy in this
    /// thread's argument area, and outputs are copied back when the call returned and still counts.
    fn call(
        &self,
        args: &mut [WireValue<'_>],
        deadline: Duration,
        unlocked: Unlocked<'_>,
    ) -> Result<RegRet, BackendError> {
        // The domain's epoch when the call was made (see `gate::Occupancy`): read while the core still holds the
        // domain, so a recovery after it ends this call.
        let epoch = self.memory.occupancy.epoch();
        let (regs, frame) = self.prepare(args)?;
        let mut result = Err(BackendError::Closed);
        let counts = unlocked(&mut || result = self.memory.enter(self.func, &regs, Some(deadline), epoch));
        let returned = counts && result.is_ok();
        self.finish(frame, returned.then_some(args));
        result
    }
}

impl GatedFunction {
    /// Copies what must be copied into the domain and packs the registers.
    fn prepare(&self, args: &[WireValue<'_>]) -> Result<(RegArgs, GatedFrame), BackendError> {
        let memory = &self.memory;
        let lane = memory.lanes.for_this_thread().map_err(|e| {
            BackendError::Usage(format!("cannot make this thread's stack and argument area in an mpk domain: {e}"))
        })?;
        let mark = lane.arguments_mark();
        let mut frame = GatedFrame { mark, outputs: smallvec::SmallVec::new() };
        let mut packer = ward_abi::ArgPacker::new();
        let mut pack = |a: &WireValue<'_>| -> Result<(), BackendError> {
            let usage = |e: &dyn std::fmt::Display| BackendError::Usage(e.to_string());
            let space = |len: usize| {
                memory.host_access();
                lane.argument_space(len).map_err(|e| usage(&e))
            };
            match a {
                WireValue::Int(v) => packer.push_int(*v),
                WireValue::F64(v) => packer.push_f64(*v),
                WireValue::F32(v) => packer.push_f32(*v),
                WireValue::In(b) => packer.push_int(b.as_ptr() as u64),
                WireValue::Str(s) => packer.push_int(s.as_ptr() as u64),
                WireValue::Out(b) => {
                    let len = b.len();
                    let at = space(len)?;
                    // SAFETY: `argument_space` gave `len` bytes of this thread's argument area, which host_access
                    // (in `space`) made writable by the host.
                    unsafe { std::ptr::write_bytes(at, 0, len) };
                    frame.outputs.push((at as usize, len));
                    packer.push_int(at as u64)
                }
                WireValue::InOut(b) => {
                    let at = space(b.len())?;
                    // SAFETY: `b.len()` bytes of this thread's argument area, writable by the host (host_access in
                    // `space`); the source is the host's buffer, which does not overlap the domain's memory.
                    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), at, b.len()) };
                    frame.outputs.push((at as usize, b.len()));
                    packer.push_int(at as u64)
                }
                WireValue::Scratch(b) => {
                    let at = space(b.len())?;
                    // SAFETY: `b.len()` bytes of this thread's argument area, writable by the host (host_access in
                    // `space`); the source is the host's buffer, which does not overlap the domain's memory.
                    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), at, b.len()) };
                    packer.push_int(at as u64)
                }
                WireValue::Callback(slot) => {
                    let stub = ward_abi::callback_stub(*slot)
                        .ok_or_else(|| BackendError::Usage(format!("callback slot {slot} has no stub")))?;
                    let outward = gate::outward_for(stub)
                        .ok_or_else(|| BackendError::Usage("no outward stub left for a callback".into()))?;
                    packer.push_int(outward as u64)
                }
            }
            .map_err(|e| usage(&e))
        };
        if let Err(e) = args.iter().try_for_each(&mut pack) {
            // Whatever the call took of the argument area goes back with the error.
            lane.release_arguments(mark);
            return Err(e);
        }
        Ok((packer.finish(), frame))
    }

    /// Copies outputs back into the host's buffers in `args` (when the call returned and counts) and releases the
    /// call's part of the argument area.
    fn finish(&self, frame: GatedFrame, args: Option<&mut [WireValue<'_>]>) {
        if let (Some(args), false) = (args, frame.outputs.is_empty()) {
            self.memory.host_access();
            for ((at, len), out) in frame.outputs.iter().zip(crate::backend::outputs(args)) {
                let n = (*len).min(out.len());
                // SAFETY: the copy lies in this thread's argument area, which host_access made readable by the
                // host, and holds `len` bytes; `out` is the host's buffer, at least `n` long.
                unsafe { std::ptr::copy_nonoverlapping(*at as *const u8, out.as_mut_ptr(), n) };
            }
        }
        // The lane is this thread's, which prepared the call.
        if let Ok(lane) = self.memory.lanes.for_this_thread() {
            lane.release_arguments(frame.mark);
        }
    }
}

impl Backend for MpkBackend {
    fn resolve(&mut self, ext: usize, symbol: &str) -> Result<Callable, BackendError> {
        let memory = self.memory()?;
        let no_such = || BackendError::Usage(format!("no extension {ext}"));
        let started_with = memory.extension_images.len();
        let export = if ext < started_with {
            let image = memory.extension_images.get(ext).and_then(|&i| memory.images.get(i)).ok_or_else(no_such)?;
            image.export(symbol)
        } else {
            let additions = memory.additions.lock().unwrap_or_else(|e| e.into_inner());
            let added = additions.get(ext - started_with).ok_or_else(no_such)?;
            added.images.get(added.extension).ok_or_else(no_such)?.export(symbol)
        };
        let func = export.ok_or(BackendError::UnknownSymbol)?;
        Ok(Callable::OnThread(Arc::new(GatedFunction { memory: memory.clone(), func })))
    }

    fn stop(&mut self) {
        self.stopped = true;
        // Other threads' calls in the domain end before its memory is put back or let go.
        if let Some(memory) = &self.memory {
            memory.close();
        }
    }

    fn restart(&mut self, _: &mut Tracker) -> Result<RestartVia, StartError> {
        if !self.reload && self.restore() {
            self.stopped = false;
            return Ok(RestartVia::Snapshot);
        }
        self.load().map_err(StartError::new)?;
        Ok(RestartVia::Reload)
    }

    fn add_extension(&mut self, _: &mut Tracker, spec: ExtensionSpec) -> Result<Added, Refused> {
        if self.add_in_place(&spec)?.is_some() {
            return Ok(Added::InPlace);
        }
        self.cfg.extensions.push(spec);
        self.reload = true;
        Ok(Added::NeedsRestart)
    }

    fn extensions(&self) -> Vec<ExtensionSpec> {
        self.cfg.extensions.clone()
    }

    fn replace_image(&mut self, index: usize, path: PathBuf) {
        if let Some(spec) = self.cfg.extensions.get_mut(index) {
            spec.path = path;
            // A library fault targets the file it was given for, as a process domain's preloaded library names
            // the object by path: the file restarted from is not it. (An adapter's fault is its plugin's.)
            if spec.opens.is_none() {
                spec.library_fault = None;
            }
            self.reload = true;
        }
    }

    fn replace_opened(&mut self, index: usize, path: PathBuf) {
        // The library table answers the adapter's dlopen only for the files loaded with it: the rewritten open
        // finds the new file only once the next incarnation loads it in place of the old one.
        if let Some(spec) = self.cfg.extensions.get_mut(index).filter(|s| s.opens.is_some()) {
            spec.opens = Some(path);
            // As in `replace_image`: the fault was the old plugin file's.
            spec.library_fault = None;
            self.reload = true;
        }
    }
}

#[cfg(test)]
mod snapshot_tests {
    use super::{page_size, Snapshot, CLEAR_BY_KERNEL};

    /// Private anonymous memory, as a domain's heap is, unmapped when dropped.
    struct Anonymous {
        at: *mut u8,
        len: usize,
    }

    impl Anonymous {
        fn new(len: usize) -> Anonymous {
            // SAFETY: a fresh private anonymous mapping; nothing else uses its range.
            let at = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(at, libc::MAP_FAILED, "mmap");
            Anonymous { at: at.cast(), len }
        }

        fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: the whole mapping, readable and writable, borrowed through `self`.
            unsafe { std::slice::from_raw_parts_mut(self.at, self.len) }
        }
    }

    impl Drop for Anonymous {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, no longer borrowed.
            unsafe { libc::munmap(self.at.cast(), self.len) };
        }
    }

    #[test]
    fn a_heap_snapshot_keeps_pages_with_data_notes_zero_pages_and_puts_both_back() {
        let page = page_size();
        let zero_run = CLEAR_BY_KERNEL / page + 3;
        // Pages: two with data, a long zero run (cleared by the kernel), one with data, one zero page (cleared
        // by hand), then 100 bytes of data in a part page: the heap's top.
        let data_after = 2 + zero_run;
        let part = data_after + 2;
        let pages = part + 8;
        let mut heap = Anonymous::new(pages * page);
        let start = heap.at as usize;
        let top = start + part * page + 100;
        let bytes = heap.bytes();
        for (i, b) in bytes[..2 * page].iter_mut().enumerate() {
            *b = (i % 251) as u8 + 1;
        }
        bytes[data_after * page + 17] = 0x42;
        bytes[part * page..part * page + 100].fill(0x17);
        let before = bytes[..top - start].to_vec();

        let mut snapshot = Snapshot { pages: Vec::new(), zeros: Vec::new(), heap_top: top };
        snapshot.save_heap(start, top, page).unwrap();
        let saved: Vec<(usize, usize)> = snapshot.pages.iter().map(|(at, b)| (at - start, b.len())).collect();
        assert_eq!(saved, [(0, 2 * page), (data_after * page, page), (part * page, 100)]);
        let zeros: Vec<(usize, usize)> = snapshot.zeros.iter().map(|(a, b)| (a - start, b - start)).collect();
        assert_eq!(zeros, [(2 * page, data_after * page), ((data_after + 1) * page, part * page)]);

        // The failed incarnation wrote everywhere, past the old top too.
        heap.bytes().fill(0x5a);
        let used_to = start + pages * page - 10;
        // SAFETY: the snapshot was taken of this mapping, which is still mapped, writable and anonymous, and
        // `used_to` lies in it.
        unsafe { snapshot.put_back(used_to) };
        let bytes = heap.bytes();
        assert!(bytes[..top - start] == before[..], "the heap below the top is as it was");
        assert!(bytes[top - start..used_to - start].iter().all(|&b| b == 0), "above the top it is cleared");
        assert!(bytes[used_to - start..].iter().all(|&b| b == 0x5a), "past what was used it is untouched");
    }
}
