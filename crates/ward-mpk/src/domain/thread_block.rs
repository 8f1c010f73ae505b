//! Thread blocks: what the FS base points at while a thread runs inside an mpk domain.
//!
//! On x86-64 glibc the FS base is the thread pointer. Above it lies the thread's control block (the stack guard at
//! `%fs:0x28`, a pointer to itself at `%fs:0`); below it, the static TLS block, where libc keeps errno and the
//! locale pointers at offsets fixed when the program started. Library code bound as pure runs inside a domain and
//! reaches both through FS, so a domain gets thread blocks of its own, one per host thread that calls it, laid out
//! like the host thread's: a copy of the host's static TLS block, tagged with the domain's key (so `errno = EDOM`
//! in libm lands in the domain's copy), and a copy of the control block on a page of the host's key, which the
//! domain reads but cannot write. The gate switches the FS base at every crossing.
//!
//! An extension's own thread-local storage (`__thread`) lies further down in the same blocks, below the host's
//! static TLS copy, at an offset fixed when the domain is loaded ([`TlsLayout`]): the loader resolves the image's
//! initial-exec accesses to it, and the domain runtime's `__tls_get_addr` (general and local dynamic accesses) finds
//! it through a table of module offsets in the control block page.
//!
//! The control block copy carries two words of ward's own in a part of glibc's `tcbhead_t` glibc leaves unused:
//! the host thread's own thread pointer, and that pointer combined with a secret. Code that runs with an unknown FS
//! base (the outward stubs, the signal handlers' entries, the gate's way out) tells a domain's block from a host
//! thread's by the pair and switches back to the host's pointer before any Rust code reads a thread-local.

use std::ffi::c_void;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::loader::{TlsModule, TlsTemplate};
use super::memory::{page_size, KeyedRegion};
use super::per_thread::PerThread;
use super::pku;

/// Offset from the thread pointer of the word holding the host thread's pointer: inside `tcbhead_t`'s
/// `__glibc_unused2` (bytes 0x80 to 0x280), which glibc keeps only for the struct's size.
pub const HOST_POINTER_AT: usize = 0x200;
/// Offset of the check word: the host thread's pointer XOR [`TCB_SECRET`].
pub const HOST_CHECK_AT: usize = 0x208;

/// Offset of the table of the extensions' TLS modules: word `i` is how far below the thread pointer module `i + 1`'s
/// block starts. It ends before `__glibc_unused2` does (0x280).
pub const TLS_MODULES_AT: usize = 0x210;
/// How many images of one domain may have thread-local storage of their own.
pub const TLS_MODULES: usize = 12;
const _: () = assert!(TLS_MODULES_AT + TLS_MODULES * 8 <= 0x280);

std::arch::global_asm!(
    // void *__tls_get_addr(tls_index *ti) for a domain's images: the thread pointer, less the module's offset, plus
    // the variable's. Runs in the domain, on its thread block. A module number no image has traps.
    ".pushsection .text.ward_mpk_tls_get_addr, \"ax\", @progbits",
    ".globl ward_mpk_tls_get_addr",
    ".hidden ward_mpk_tls_get_addr",
    ".type ward_mpk_tls_get_addr, @function",
    ".balign 16",
    "ward_mpk_tls_get_addr:",
    "mov rax, qword ptr [rdi]",
    "sub rax, 1",
    "cmp rax, {modules}",
    "jae 1f",
    "mov rcx, qword ptr fs:[{table} + rax * 8]",
    "test rcx, rcx",
    "jz 1f",
    "mov rax, qword ptr fs:[0]",
    "sub rax, rcx",
    "add rax, qword ptr [rdi + 8]",
    "ret",
    "1:",
    "ud2",
    ".size ward_mpk_tls_get_addr, . - ward_mpk_tls_get_addr",
    ".popsection",
    modules = const TLS_MODULES,
    table = const TLS_MODULES_AT,
);

extern "C" {
    fn ward_mpk_tls_get_addr();
}

/// The domain runtime's `__tls_get_addr`.
pub fn tls_get_addr() -> *const c_void {
    ward_mpk_tls_get_addr as *const c_void
}

/// The secret of the check word: random, odd (so never 0, and an all-zero control block never passes), set once
/// before the first block is made.
pub static TCB_SECRET: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

/// Makes the secret random; called once, before any thread block exists (with the fault handlers' installation).
pub fn choose_secret() {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom fills at most the 8 bytes of the buffer it is given.
    let filled = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if filled == 8 {
        TCB_SECRET.store(u64::from_ne_bytes(bytes) | 1, Ordering::SeqCst);
    }
}

/// Whether the kernel lets user code read and write the FS base itself (`rdfsbase`/`wrfsbase`, Linux 5.9 and
/// later on processors that have them): the gate switches the thread block with them, a system call being far
/// too slow for a crossing.
pub fn fsgsbase_enabled() -> bool {
    const HWCAP2_FSGSBASE: u64 = 1 << 1;
    // SAFETY: getauxval reads the auxiliary vector the kernel gave the process.
    let hwcap2 = unsafe { libc::getauxval(libc::AT_HWCAP2) };
    hwcap2 & HWCAP2_FSGSBASE != 0
}

/// This thread's thread pointer (the FS base), read where it is the host's.
pub fn host_thread_pointer() -> usize {
    let pointer: usize;
    // SAFETY: on x86-64 glibc the first word of the thread control block, at fs:0, points at the block itself.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) pointer, options(nostack, readonly, preserves_flags))
    };
    pointer
}

/// Bytes of the host's static TLS block (with glibc's surplus for libraries loaded later) and of the control block
/// that follows it, as glibc's dynamic loader reports them.
fn static_tls_size() -> io::Result<usize> {
    static SIZE: OnceLock<Result<usize, String>> = OnceLock::new();
    SIZE.get_or_init(|| ask_static_tls_size().map_err(|e| e.to_string())).clone().map_err(io::Error::other)
}

fn ask_static_tls_size() -> io::Result<usize> {
    type Info = unsafe extern "C" fn(*mut usize, *mut usize);
    // SAFETY: dlsym with a NUL-terminated name only looks the symbol up.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_get_tls_static_info".as_ptr()) };
    if sym.is_null() {
        return Err(io::Error::other("glibc's dynamic loader does not report its static TLS size"));
    }
    // SAFETY: glibc's `_dl_get_tls_static_info(size_t *size, size_t *align)` has this signature on every version
    // that exports it.
    let info: Info = unsafe { std::mem::transmute::<*mut c_void, Info>(sym) };
    let (mut size, mut align) = (0usize, 0usize);
    // SAFETY: the function stores one word in each pointer, both live locals.
    unsafe { info(&mut size, &mut align) };
    if size == 0 {
        return Err(io::Error::other("glibc's dynamic loader reports a static TLS block of 0 bytes"));
    }
    Ok(size)
}

extern "C" {
    /// glibc (2.35 and later): where a thread's rseq area lies from the thread pointer, and its size (0: none).
    static __rseq_offset: isize;
    static __rseq_size: u32;
}

/// Where glibc keeps each thread's restartable-sequences area, from the thread pointer, and its size; None when
/// glibc registers none.
pub fn rseq_area() -> Option<(isize, u32)> {
    // SAFETY: plain reads of two constants glibc sets before any user code runs.
    let (offset, size) = unsafe { (__rseq_offset, __rseq_size) };
    (size > 0).then_some((offset, size))
}

/// Copies `len` bytes from `from` in this process to `to`, page by page, leaving zeros where `from` is not mapped
/// readable: the bytes below a thread pointer that belong to the thread's TLS are mapped, but how far the mapping
/// reaches is glibc's business, and a read past it must not fault.
fn copy_mapped(from: usize, to: *mut u8, len: usize) {
    let page = page_size();
    let mut done = 0;
    while done < len {
        let at = from + done;
        let chunk = (page - at % page).min(len - done);
        let local = libc::iovec { iov_base: to.wrapping_add(done).cast(), iov_len: chunk };
        let remote = libc::iovec { iov_base: at as *mut c_void, iov_len: chunk };
        // SAFETY: process_vm_readv on this process reads `remote` through the kernel (an unmapped page is an error,
        // not a fault) into `local`, which lies in the destination the caller hands over.
        unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        done += chunk;
    }
}

/// Where a domain's images keep their own thread-local storage in its thread blocks: below the host's static TLS
/// copy, each block aligned as its image asks.
#[derive(Debug, Clone, Default)]
pub struct TlsLayout {
    modules: Vec<(TlsModule, TlsTemplate)>,
}

impl TlsLayout {
    /// Lays out the templates (one per image, in order; None for an image without TLS) and gives each image its
    /// module.
    pub fn new(templates: &[Option<TlsTemplate>]) -> io::Result<(TlsLayout, Vec<Option<TlsModule>>)> {
        let mut below = static_tls_size()?;
        let mut layout = TlsLayout::default();
        let mut modules = Vec::with_capacity(templates.len());
        for template in templates {
            let Some(template) = template else {
                modules.push(None);
                continue;
            };
            let id = layout.modules.len() + 1;
            if id > TLS_MODULES {
                return Err(io::Error::other(format!(
                    "more than {TLS_MODULES} images of one domain have thread-local storage of their own"
                )));
            }
            // The thread pointer is page-aligned, so a block at an offset that is a multiple of its alignment is
            // aligned.
            below = (below + template.size).div_ceil(template.align) * template.align;
            let module = TlsModule { id, below };
            layout.modules.push((module, template.clone()));
            modules.push(Some(module));
        }
        Ok((layout, modules))
    }

    /// Bytes below the thread pointer a block needs, the host's static TLS copy included.
    fn extent(&self) -> io::Result<usize> {
        let host = static_tls_size()?;
        Ok(self.modules.iter().map(|(m, _)| m.below).max().unwrap_or(host).max(host))
    }
}

/// One host thread's block in one domain.
struct ThreadBlock {
    /// The static TLS copy (the domain's key), then the control block page (the host's key).
    region: KeyedRegion,
    /// The thread pointer a domain call of this thread runs with: the start of the control block page.
    pointer: usize,
    /// The static TLS copy as it was made (or last kept), which a restore puts back.
    pristine: Mutex<Vec<u8>>,
}

impl ThreadBlock {
    fn new(key: u32, host_pointer: usize, layout: &TlsLayout) -> io::Result<ThreadBlock> {
        let page = page_size();
        let host = static_tls_size()?;
        let tls = layout.extent()?.div_ceil(page) * page;
        let region = KeyedRegion::new(tls + page, key)?;
        let pointer = region.start() as usize + tls;
        // SAFETY: the control block page lies inside the region just made; only its key changes, to the host's, so
        // the domain reads it but cannot change where the gate goes back to.
        unsafe { pku::protect_with_key(pointer as *mut u8, page, libc::PROT_READ | libc::PROT_WRITE, pku::HOST_KEY)? };
        copy_mapped(host_pointer - host, (pointer - host) as *mut u8, host + page);
        for (module, template) in &layout.modules {
            // SAFETY: the module's block lies in the TLS part (the extent covers it), writable by this thread, and
            // the template's initialised bytes are at most its size.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    template.init.as_ptr(),
                    (pointer - module.below) as *mut u8,
                    template.init.len(),
                )
            };
        }
        // The copy of the kernel's restartable-sequences area says "not registered", so glibc's `sched_getcpu` in the
        // domain asks the kernel rather than read a processor number that is only true of the moment of the copy.
        let cpu_id_at = rseq_area().and_then(|(offset, _)| usize::try_from(offset.checked_add(4)?).ok());
        if let Some(at) = cpu_id_at.filter(|at| at + 4 <= page) {
            // SAFETY: the word lies in the control block page, writable by this thread.
            unsafe { ((pointer + at) as *mut i32).write(-1) };
        }
        let words = pointer as *mut usize;
        let secret = TCB_SECRET.load(Ordering::SeqCst) as usize;
        // SAFETY: the words lie in the control block page, writable by this thread (the host's key): glibc's
        // `tcb` and `self` pointers (offsets 0 and 0x10) name the copy, and ward's pair names the host thread.
        unsafe {
            words.write(pointer);
            words.byte_add(0x10).write(pointer);
            words.byte_add(HOST_POINTER_AT).write(host_pointer);
            words.byte_add(HOST_CHECK_AT).write(host_pointer ^ secret);
            for id in 0..TLS_MODULES {
                let below = layout.modules.get(id).map_or(0, |(module, _)| module.below);
                words.byte_add(TLS_MODULES_AT + id * 8).write(below);
            }
        }
        // SAFETY: the TLS copy is the first `tls` bytes of the region, readable by this thread.
        let pristine = unsafe { std::slice::from_raw_parts(region.start(), tls) }.to_vec();
        Ok(ThreadBlock { region, pointer, pristine: Mutex::new(pristine) })
    }

    /// Takes the static TLS copy as it is now as what a restore puts back.
    fn keep_as_pristine(&self) {
        let mut pristine = self.pristine.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the copy is the first `pristine.len()` bytes of the region, readable by this thread (the caller's
        // host rights cover the domain's key), and no call is running on this block.
        let now = unsafe { std::slice::from_raw_parts(self.region.start(), pristine.len()) };
        pristine.copy_from_slice(now);
    }

    /// Puts the static TLS copy back as it was made (or last kept).
    ///
    /// # Safety
    /// No call may be running on this block, and this thread must be allowed to write the domain's key.
    unsafe fn reset(&self) {
        let pristine = self.pristine.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the copy is the first `pristine.len()` bytes of the region, which the caller may write.
        unsafe { std::ptr::copy_nonoverlapping(pristine.as_ptr(), self.region.start(), pristine.len()) };
    }
}

/// A domain's thread blocks, one per host thread that has called it.
pub struct ThreadBlocks {
    key: u32,
    tls: TlsLayout,
    blocks: Arc<PerThread<ThreadBlock>>,
}

impl ThreadBlocks {
    pub fn new(key: u32, tls: TlsLayout) -> ThreadBlocks {
        ThreadBlocks { key, tls, blocks: PerThread::new() }
    }

    /// The thread pointer this thread runs this domain's code with, made on its first call.
    pub fn pointer_for_this_thread(&self) -> io::Result<usize> {
        let block = self.blocks.get_or_make(|| ThreadBlock::new(self.key, host_thread_pointer(), &self.tls))?;
        Ok(block.pointer)
    }

    /// Puts every block's static TLS copy back as it was made (after a fault, with the rest of the domain's
    /// memory).
    ///
    /// # Safety
    /// No call may be running in the domain, and this thread must be allowed to write the domain's key.
    pub unsafe fn reset(&self) {
        for block in self.blocks.all() {
            // SAFETY: no call runs in the domain and this thread may write its key (this function's contract).
            unsafe { block.reset() };
        }
    }

    /// Makes every block's static TLS copy, as it is now, what a restore puts back: called once the domain's
    /// initialisers have run, when its snapshot is taken, so that thread-locals they set come back with the rest.
    /// Blocks made later start from the images' templates, as a thread that did not load the library would.
    pub fn keep_as_pristine(&self) {
        for block in self.blocks.all() {
            block.keep_as_pristine();
        }
    }
}
