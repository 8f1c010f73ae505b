//! How the mpk loader binds each import of an extension: the classification table.
//!
//! An extension in an mpk domain runs on the host's thread with the host's memory read-only (DESIGN.md §1, §7), on
//! a stack and a heap of its own, with the FS base switched to a thread block of its own. Each undefined dynamic
//! symbol is bound to one of:
//!
//! - the **domain runtime**: ward's own implementation, working on the domain's memory (heap, errno, atexit
//!   list, random-number state);
//! - **pure** library code, bound to the host's libc or libm and run inside the domain: it reads its arguments,
//!   read-only tables and the caller's thread block, and writes only memory it was handed, the stack, and errno.
//!   The runtime lays a domain's thread block out like the host's static TLS block (libc's errno and locale
//!   pointers at the same offsets, the stack guard at `%fs:0x28`), so this code finds its own copies there;
//! - a **host gate**: the call leaves the domain and runs on the host's side with the host's rights, because the
//!   function keeps state in the host's libc (stdio buffers and locks, the gettext catalogue cache, the time-zone
//!   state). The gate passes the argument registers and the first sixteen eightbytes of stack arguments on, which
//!   serves variadic functions as it is. What a gate returns may point into host memory, which the domain can read;
//! - a **fault**: the function ends the process (or says the extension is broken), so calling it is reported as a
//!   fault of the domain and recovered (DESIGN.md §4, step 1);
//! - a **toolchain hook**: bound to null, exactly as in a process that loads no profiler, transactional-memory
//!   library or Java runtime; the start-up code tests these before use;
//! - **unsupported**: everything else. Each unsupported import is a reason the mpk loader refuses the extension.
//!
//! Weak imports are classified like strong ones. Binding an unsupported weak import to null would be legal ELF, but it
//! changes behaviour silently: code that tests `__pthread_key_create` before it uses threads (libstdc++'s gthreads do)
//! would stop locking while the host calls in from two threads. So a weak import is bound to what a process would bind
//! it to, or it is a reason, marked weak.
//!
//! A name is looked up as written, then under its base name: fortified `__X_chk` as `X`, libm's `__X_finite`
//! as `X`, the vector ABI's `_ZGV..._X` (libmvec) as `X`, and the C standard's `__isoc99_X`/`__isoc23_X` as `X`.
//! Names not in the table are recognised as libm's by the library their version comes from (`libm.so.6`,
//! `libmvec.so.1`) or by the math function list, and as the C++ runtime's and thread library's by their prefixes.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::Serialize;

/// How the mpk loader binds an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImportClass {
    DomainRuntime,
    Pure,
    HostGate,
    Fault,
    Toolchain,
    Unsupported,
}

impl ImportClass {
    /// Whether the mpk loader can bind an import of this class.
    pub fn honoured(self) -> bool {
        self != ImportClass::Unsupported
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ImportClass::DomainRuntime => "domain runtime",
            ImportClass::Pure => "pure",
            ImportClass::HostGate => "host gate",
            ImportClass::Fault => "fault",
            ImportClass::Toolchain => "toolchain hook",
            ImportClass::Unsupported => "unsupported",
        }
    }
}

/// Imports the runtime treats alike, and how it honours them (or why it cannot).
#[derive(Debug)]
pub struct Group {
    /// A short identifier, carried in reports (`heap`, `stdio`, `mappings`).
    pub id: &'static str,
    pub class: ImportClass,
    /// For people: how the group is bound, or why it is refused.
    pub why: &'static str,
    pub names: &'static [&'static str],
}

/// Identifiers of groups the analysis treats specially.
pub const THREAD_START: &str = "thread-start";
/// The imports of the `dynamic-loading` group the domain runtime answers for an extension loaded together with the
/// libraries it opens (a class adapter and its plugin): for any other extension they stay reasons.
pub const LIBRARY_LOOKUP: &[&str] = &["dlopen", "dlsym", "dlerror", "dlclose"];
pub const TLS: &str = "tls";

use ImportClass::*;

/// The table. A name appears in at most one group (a test checks).
const GROUPS: &[Group] = &[
    // ---- domain runtime ----
    // A domain's memory must carry its protection key, and memory the host's malloc hands out (or maps later)
    // carries key 0: so the domain allocates from a heap of its own. strdup and friends allocate too; their
    // results are freed with the domain's free.
    Group {
        id: "heap",
        class: DomainRuntime,
        why: "allocates from the domain's own heap",
        names: &[
            "malloc",
            "calloc",
            "realloc",
            "reallocarray",
            "free",
            "cfree",
            "posix_memalign",
            "aligned_alloc",
            "memalign",
            "valloc",
            "pvalloc",
            "malloc_usable_size",
            "strdup",
            "strndup",
            "__strdup",
            "__strndup",
            "wcsdup",
        ],
    },
    // C++ operator new and delete, plain, sized, nothrow and aligned, on the domain's heap. The throwing forms
    // report exhaustion as a fault: exceptions do not cross the domain runtime. `std::nothrow` is the tag object
    // the nothrow forms take; the runtime defines it.
    Group {
        id: "cxx-heap",
        class: DomainRuntime,
        why: "C++ new and delete on the domain's own heap",
        names: &[
            "_Znwm",
            "_Znam",
            "_ZdlPv",
            "_ZdaPv",
            "_ZdlPvm",
            "_ZdaPvm",
            "_ZnwmRKSt9nothrow_t",
            "_ZnamRKSt9nothrow_t",
            "_ZdlPvRKSt9nothrow_t",
            "_ZdaPvRKSt9nothrow_t",
            "_ZnwmSt11align_val_t",
            "_ZnamSt11align_val_t",
            "_ZnwmSt11align_val_tRKSt9nothrow_t",
            "_ZnamSt11align_val_tRKSt9nothrow_t",
            "_ZdlPvSt11align_val_t",
            "_ZdaPvSt11align_val_t",
            "_ZdlPvmSt11align_val_t",
            "_ZdaPvmSt11align_val_t",
            "_ZdlPvSt11align_val_tRKSt9nothrow_t",
            "_ZdaPvSt11align_val_tRKSt9nothrow_t",
            "_ZSt7nothrow",
        ],
    },
    // glibc 2.36's qsort takes its scratch buffer from the host's malloc for arrays past a size, which a domain
    // cannot write: the runtime sorts in place with its own implementation instead.
    Group { id: "sort", class: DomainRuntime, why: "sorted by the domain runtime", names: &["qsort", "qsort_r"] },
    // errno lives in the thread block, and the domain runs with blocks of its own (the gate switches the FS base).
    Group {
        id: "errno",
        class: Pure,
        why: "the domain's own errno, in its thread block",
        names: &["__errno_location"],
    },
    // The extension's own thread-local storage lives in the domain's thread blocks, below the host's static TLS
    // copy; the runtime finds a module's block there.
    Group {
        id: TLS,
        class: DomainRuntime,
        why: "the extension's own thread-local storage, in the domain's thread blocks",
        names: &["__tls_get_addr"],
    },
    // Destructors an extension registers run when its domain is torn down or restarted, never in the host's
    // exit; `__cxa_finalize` (which every .so's start-up code references, weakly) runs the domain's list.
    Group {
        id: "atexit",
        class: DomainRuntime,
        why: "registered with the domain, run when it is torn down",
        names: &["__cxa_atexit", "__cxa_finalize"],
    },
    // Anonymous private mappings come from the domain's heap, and re-protection is limited to the heap's pages,
    // with the domain's key: a guard page an extension makes still faults, and nothing changes key. Heap pages
    // become executable only read-only and once scanned as the loader scans an image (code a compiler in the
    // domain makes). Files, shared memory and fixed addresses are refused when called.
    Group {
        id: "domain-mappings",
        class: DomainRuntime,
        why: "anonymous mappings from the domain's heap, re-protected with its key",
        names: &["mmap", "mmap64", "munmap", "mprotect"],
    },
    Group {
        id: "system-configuration",
        class: DomainRuntime,
        why: "answered by the domain runtime (the page size, the processor count)",
        names: &["sysconf", "__sysconf"],
    },
    // Mutexes in the domain's memory: the runtime keeps glibc's layout and types, a thread finding one held by
    // another waits for it, and a normal mutex a thread locks twice (a hang) is a fault.
    Group {
        id: "domain-locks",
        class: DomainRuntime,
        why: "mutexes in the domain's memory, shared by the threads in the domain",
        names: &[
            "pthread_mutex_init",
            "pthread_mutex_destroy",
            "pthread_mutex_lock",
            "pthread_mutex_trylock",
            "pthread_mutex_unlock",
            "pthread_mutexattr_init",
            "pthread_mutexattr_destroy",
            "pthread_mutexattr_settype",
            "pthread_mutexattr_gettype",
        ],
    },
    // Generators with hidden state get a state of the domain's own: the extension's sequence neither disturbs
    // nor depends on the host's, and starts again with a restart.
    Group {
        id: "random",
        class: DomainRuntime,
        why: "random-number state of the domain's own",
        names: &[
            "rand",
            "srand",
            "random",
            "srandom",
            "initstate",
            "setstate",
            "drand48",
            "srand48",
            "lrand48",
            "mrand48",
            "seed48",
            "lcong48",
        ],
    },
    // Non-local jumps (libtcc recovers from a compile error with one): the runtime's own save and restore of the
    // registers, with no pointer mangling (the guard is in the host's thread block) and no signal mask (the domain
    // cannot change its own). `__longjmp_chk` refuses a frame that has returned, as glibc's does.
    Group {
        id: "jumps",
        class: DomainRuntime,
        why: "setjmp and longjmp of the domain runtime, without system calls",
        names: &["_setjmp", "setjmp", "__sigsetjmp", "longjmp", "_longjmp", "siglongjmp", "__longjmp_chk"],
    },
    // strtok's position, likewise: the domain's own.
    Group { id: "strtok", class: DomainRuntime, why: "strtok's position of the domain's own", names: &["strtok"] },
    // ---- pure ----
    // Memory and string functions that do not allocate: they write only the buffers they are given.
    Group {
        id: "string",
        class: Pure,
        why: "runs in the domain: writes only its arguments",
        names: &[
            "memcpy",
            "memmove",
            "memset",
            "memcmp",
            "memchr",
            "memrchr",
            "rawmemchr",
            "memmem",
            "mempcpy",
            "memccpy",
            "bcmp",
            "bcopy",
            "bzero",
            "explicit_bzero",
            "strlen",
            "strnlen",
            "strcpy",
            "strncpy",
            "stpcpy",
            "stpncpy",
            "strcat",
            "strncat",
            "strlcpy",
            "strlcat",
            "strcmp",
            "strncmp",
            "strcasecmp",
            "strncasecmp",
            "strcoll",
            "strxfrm",
            "strverscmp",
            "strchr",
            "strrchr",
            "strchrnul",
            "index",
            "rindex",
            "strstr",
            "strcasestr",
            "strspn",
            "strcspn",
            "strpbrk",
            "strsep",
            "strtok_r",
            "__strtok_r",
            "wcslen",
            "wcsnlen",
            "wcscpy",
            "wcsncpy",
            "wcscat",
            "wcscmp",
            "wcsncmp",
            "wcschr",
            "wcsrchr",
            "wcsstr",
            "wmemcpy",
            "wmemmove",
            "wmemset",
            "wmemcmp",
            "wmemchr",
            "mbstowcs",
            "wcstombs",
        ],
    },
    // Number conversion and arithmetic helpers; they read the locale through the thread block and set errno.
    // `rand_r` and the `*rand48` functions that take their state as an argument keep no hidden state.
    // `__libc_single_threaded` is a byte the host's libc owns and the domain only reads.
    Group {
        id: "numeric",
        class: Pure,
        why: "runs in the domain: writes only its arguments and errno",
        names: &[
            "strtol",
            "strtoul",
            "strtoll",
            "strtoull",
            "strtoq",
            "strtouq",
            "strtoimax",
            "strtoumax",
            "strtod",
            "strtof",
            "strtold",
            "atoi",
            "atol",
            "atoll",
            "atof",
            "wcstol",
            "wcstoul",
            "wcstod",
            "abs",
            "labs",
            "llabs",
            "imaxabs",
            "div",
            "ldiv",
            "lldiv",
            "imaxdiv",
            "ffs",
            "ffsl",
            "ffsll",
            "bsearch",
            "lfind",
            "lsearch",
            "difftime",
            "rand_r",
            "erand48",
            "nrand48",
            "jrand48",
            "__libc_single_threaded",
        ],
    },
    // Character classes: the tables are the host's, read-only to the domain; the pointers to them are in the
    // thread block, which the runtime initialises from the host's.
    Group {
        id: "ctype",
        class: Pure,
        why: "runs in the domain: reads the locale's tables",
        names: &[
            "__ctype_b_loc",
            "__ctype_tolower_loc",
            "__ctype_toupper_loc",
            "__ctype_get_mb_cur_max",
            "isalnum",
            "isalpha",
            "isblank",
            "iscntrl",
            "isdigit",
            "isgraph",
            "islower",
            "isprint",
            "ispunct",
            "isspace",
            "isupper",
            "isxdigit",
            "isascii",
            "toascii",
            "tolower",
            "toupper",
            "iswalnum",
            "iswalpha",
            "iswdigit",
            "iswspace",
            "iswupper",
            "iswlower",
            "iswprint",
            "iswpunct",
            "towlower",
            "towupper",
        ],
    },
    // Clocks read the vDSO's data page (readable from a domain like all host memory) and write only their
    // argument; the slow path is a plain system call. No gate is needed, unlike the calendar functions below.
    Group {
        id: "clock",
        class: Pure,
        why: "runs in the domain: reads the vDSO clock",
        names: &["time", "gettimeofday", "clock_gettime", "clock_getres", "clock"],
    },
    // ---- host gates ----
    // stdio: FILE objects, their buffers and locks belong to the host. `stdin`, `stdout` and `stderr` are data
    // symbols the domain reads (host memory is readable) and passes back to gated functions. The printf family,
    // even the string-only sprintf and snprintf, goes through the gate too: glibc's formatter falls back to the
    // host's malloc for large field widths and precisions (and for `%m`/`%ms` in scanf), which a domain cannot
    // write; a pure binding would fail rare formats.
    Group {
        id: "stdio",
        class: HostGate,
        why: "host gate: stdio state is the host's",
        names: &[
            "stdin",
            "stdout",
            "stderr",
            "printf",
            "fprintf",
            "dprintf",
            "vprintf",
            "vfprintf",
            "vdprintf",
            "sprintf",
            "snprintf",
            "vsprintf",
            "vsnprintf",
            "scanf",
            "fscanf",
            "sscanf",
            "vscanf",
            "vfscanf",
            "vsscanf",
            "puts",
            "fputs",
            "fputc",
            "putc",
            "putchar",
            "_IO_putc",
            "fputs_unlocked",
            "fputc_unlocked",
            "putc_unlocked",
            "putchar_unlocked",
            "fwrite",
            "fwrite_unlocked",
            "fread",
            "fread_unlocked",
            "fgets",
            "fgets_unlocked",
            "fgetc",
            "getc",
            "getchar",
            "_IO_getc",
            "getc_unlocked",
            "ungetc",
            "__uflow",
            "__overflow",
            "fopen",
            "fopen64",
            "fdopen",
            "freopen",
            "fclose",
            "fflush",
            "fflush_unlocked",
            "fseek",
            "fseeko",
            "fseeko64",
            "ftell",
            "ftello",
            "ftello64",
            "rewind",
            "fgetpos",
            "fsetpos",
            "feof",
            "ferror",
            "clearerr",
            "fileno",
            "setvbuf",
            "setbuf",
            "setlinebuf",
            "perror",
        ],
    },
    // gettext: the catalogue cache, the bound domains and the conversion descriptors are the host's (and
    // allocated lazily). The strings returned are in host memory, read-only to the domain.
    Group {
        id: "gettext",
        class: HostGate,
        why: "host gate: message catalogues are the host's",
        names: &[
            "gettext",
            "dgettext",
            "dcgettext",
            "ngettext",
            "dngettext",
            "dcngettext",
            "textdomain",
            "bindtextdomain",
            "bind_textdomain_codeset",
        ],
    },
    // Calendar time: even gmtime_r takes the host's time-zone lock, and the others load the zone file. The
    // non-reentrant forms return the host's static buffer, which the domain reads.
    Group {
        id: "calendar",
        class: HostGate,
        why: "host gate: time-zone state is the host's",
        names: &[
            "localtime",
            "localtime_r",
            "gmtime",
            "gmtime_r",
            "mktime",
            "timegm",
            "timelocal",
            "strftime",
            "tzset",
            "ctime",
            "ctime_r",
            "asctime",
            "asctime_r",
        ],
    },
    // Waiting: on the host's side, where ward sees the domain waiting and its deadline applies.
    Group {
        id: "sleep",
        class: HostGate,
        why: "host gate: the host sees the wait",
        names: &["sleep", "usleep", "nanosleep", "clock_nanosleep"],
    },
    // The environment belongs to the host, which may reallocate it (setenv) while a domain reads.
    Group {
        id: "environment",
        class: HostGate,
        why: "host gate: the environment is the host's",
        names: &["getenv", "secure_getenv"],
    },
    // Message texts: strerror and strsignal format unknown numbers into a buffer the host's libc allocates, and
    // all of them, strerror_r too, translate through gettext's catalogue cache. localeconv and nl_langinfo read
    // the host's locale. What they return may point into host memory.
    Group {
        id: "host-text",
        class: HostGate,
        why: "host gate: returns text the host's libc keeps",
        names: &["strerror", "strerror_l", "strerror_r", "__xpg_strerror_r", "strsignal", "localeconv", "nl_langinfo"],
    },
    // ---- faults ----
    // Ending the process, or declaring the extension broken (a failed assertion, a smashed stack, a failed
    // fortify check, a pure virtual call, std::terminate): the domain has failed; ward recovers it instead of
    // letting it take the host down. err() and friends print first; as faults, they do not.
    Group {
        id: "exit",
        class: Fault,
        why: "becomes a fault of the domain",
        names: &[
            "exit",
            "_exit",
            "_Exit",
            "quick_exit",
            "abort",
            "__assert_fail",
            "__assert_perror_fail",
            "__assert",
            "__stack_chk_fail",
            "__chk_fail",
            "__fortify_fail",
            "err",
            "errx",
            "verr",
            "verrx",
            "__cxa_pure_virtual",
            "__cxa_deleted_virtual",
            "_ZSt9terminatev",
        ],
    },
    // ---- toolchain hooks ----
    // Referenced weakly by the C runtime's start-up files of every shared object and tested before use.
    Group {
        id: "toolchain",
        class: Toolchain,
        why: "bound to null, as in any process without a profiler or transactional memory",
        names: &["__gmon_start__", "_ITM_registerTMCloneTable", "_ITM_deregisterTMCloneTable", "_Jv_RegisterClasses"],
    },
    // ---- unsupported ----
    // A thread started from a domain would run outside every gate, with no thread block of the domain's own.
    Group {
        id: THREAD_START,
        class: Unsupported,
        why: "starts threads, which would run outside the domain's gates",
        names: &["pthread_create", "thrd_create", "clone", "clone3"],
    },
    // Destructors of thread-local objects (C++ `thread_local`) would have to run as each host thread ends, inside
    // the domain, from the host's thread exit.
    Group {
        id: "thread-exit",
        class: Unsupported,
        why: "registers destructors to run as each thread ends",
        names: &["__cxa_thread_atexit_impl", "__cxa_thread_atexit"],
    },
    // glibc's locks, once-flags and keys read and write the calling thread's descriptor (its tid, robust list,
    // specific-data array), which a domain's thread block does not mirror. Names with these prefixes not listed
    // here fall into this group too.
    Group {
        id: "thread-sync",
        class: Unsupported,
        why: "thread synchronisation reads the host thread's descriptor",
        names: &[
            "pthread_exit",
            "pthread_self",
            "pthread_key_create",
            "pthread_once",
            "sem_init",
            "sem_wait",
            "sem_post",
        ],
    },
    // New mappings get protection key 0, the host's; mprotect and the pkey calls can change a page's rights or
    // key behind the domain's back.
    Group {
        id: "mappings",
        class: Unsupported,
        why: "maps or re-protects memory, bypassing the domain's protection key",
        names: &[
            "mremap",
            "pkey_mprotect",
            "pkey_alloc",
            "pkey_free",
            "pkey_set",
            "pkey_get",
            "madvise",
            "posix_madvise",
            "msync",
            "mlock",
            "munlock",
            "mlockall",
            "munlockall",
            "shm_open",
            "shm_unlink",
            "shmget",
            "shmat",
            "shmdt",
            "memfd_create",
            "brk",
            "sbrk",
        ],
    },
    // Descriptors are the host's; the tracker does not record a domain's yet, so recovery could not close them.
    Group {
        id: "descriptors",
        class: Unsupported,
        why: "uses file descriptors, which the tracker does not yet record for an mpk domain",
        names: &[
            "open",
            "open64",
            "openat",
            "creat",
            "close",
            "read",
            "write",
            "pread",
            "pread64",
            "pwrite",
            "pwrite64",
            "readv",
            "writev",
            "lseek",
            "lseek64",
            "fstat",
            "fstat64",
            "stat",
            "stat64",
            "lstat",
            "__fxstat",
            "__fxstat64",
            "__xstat",
            "__xstat64",
            "fcntl",
            "fcntl64",
            "ioctl",
            "dup",
            "dup2",
            "dup3",
            "pipe",
            "pipe2",
            "ftruncate",
            "ftruncate64",
            "fsync",
            "fdatasync",
            "socket",
            "socketpair",
            "connect",
            "bind",
            "listen",
            "accept",
            "accept4",
            "send",
            "recv",
            "sendto",
            "recvfrom",
            "sendmsg",
            "recvmsg",
            "poll",
            "ppoll",
            "select",
            "epoll_create",
            "epoll_create1",
            "epoll_ctl",
            "epoll_wait",
            "eventfd",
            "opendir",
            "fdopendir",
            "readdir",
            "readdir64",
            "closedir",
        ],
    },
    // Functions that allocate on the caller's behalf with the host's malloc (or grow the caller's buffer with the
    // host's realloc): the memory would be the host's, and the domain's free could not take it back.
    Group {
        id: "host-allocation",
        class: Unsupported,
        why: "allocates with the host's malloc on the extension's behalf",
        names: &["getline", "getdelim", "__getdelim", "asprintf", "vasprintf", "open_memstream", "realpath"],
    },
    // Signal dispositions and masks are the host's (and ward's own fault handling depends on them).
    Group {
        id: "signals",
        class: Unsupported,
        why: "changes or waits for signals, which are the host's",
        names: &[
            "signal",
            "sigaction",
            "sigprocmask",
            "raise",
            "kill",
            "killpg",
            "pause",
            "alarm",
            "setitimer",
            "sigsuspend",
            "sigwait",
            "sigaltstack",
            "bsd_signal",
            "__sysv_signal",
        ],
    },
    Group {
        id: "processes",
        class: Unsupported,
        why: "creates or changes processes",
        names: &[
            "fork",
            "vfork",
            "execv",
            "execve",
            "execvp",
            "execvpe",
            "execl",
            "execlp",
            "execle",
            "system",
            "popen",
            "pclose",
            "posix_spawn",
            "posix_spawnp",
            "wait",
            "waitpid",
            "waitid",
            "daemon",
            "setsid",
            "setuid",
            "setgid",
            "prctl",
        ],
    },
    // A raw system call can do any of the above, and more.
    Group { id: "syscall", class: Unsupported, why: "makes raw system calls", names: &["syscall"] },
    Group {
        id: "dynamic-loading",
        class: Unsupported,
        why: "loads or looks up code outside the domain's loader",
        names: &[
            "dlopen",
            "dlmopen",
            "dlsym",
            "dlvsym",
            "dlclose",
            "dlerror",
            "dladdr",
            "dladdr1",
            "dlinfo",
            "dl_iterate_phdr",
        ],
    },
    // Functions that write state of the host's libc or libm: the global locale and environment, the hidden
    // conversion state of mblen/mbtowc/wctomb, lgamma's `signgam`; and the floating-point
    // environment of the host's thread (rounding mode, exception masks), which the gate does not save and restore.
    Group {
        id: "host-state",
        class: Unsupported,
        why: "changes state of the host's libc, libm or thread",
        names: &[
            "setlocale",
            "uselocale",
            "setenv",
            "putenv",
            "unsetenv",
            "clearenv",
            "mblen",
            "mbtowc",
            "wctomb",
            "lgamma",
            "lgammaf",
            "lgammal",
            "gamma",
            "gammaf",
            "gammal",
            "fesetround",
            "fesetenv",
            "feupdateenv",
            "feholdexcept",
            "feclearexcept",
            "feraiseexcept",
            "fesetexceptflag",
            "feenableexcept",
            "fedisableexcept",
            "atexit",
            "on_exit",
        ],
    },
    // C++ exceptions and RTTI: throwing allocates from libstdc++'s emergency pool and the host's malloc,
    // unwinding takes libgcc's global locks and walks the host's frames; the type_info vtables live in
    // libstdc++. Names with the prefixes `__cxa_`, `__gxx_`, `_Unwind_`, `_ZTI`, `_ZTS` and
    // `_ZTVN10__cxxabiv1` not listed elsewhere fall into this group too.
    Group {
        id: "cxx-exceptions",
        class: Unsupported,
        why: "C++ exceptions and RTTI need libstdc++'s and libgcc's runtime",
        names: &[
            "__cxa_throw",
            "__cxa_rethrow",
            "__cxa_begin_catch",
            "__cxa_end_catch",
            "__cxa_allocate_exception",
            "__cxa_free_exception",
            "__gxx_personality_v0",
            "_Unwind_Resume",
        ],
    },
];

/// What is not in [`GROUPS`], recognised otherwise.
mod fallback {
    use super::{Group, ImportClass::*};

    /// libm, recognised by the library its symbol version comes from or by name: pure. The functions set errno
    /// through the thread block; sincos, frexp, modf and remquo write only through their pointer arguments.
    pub(super) const LIBM: Group = Group { id: "libm", class: Pure, why: "runs in the domain: libm", names: &[] };
    /// libstdc++'s own code (std::string, iostreams, the `__gnu_cxx` helpers, static-local guards): it would run
    /// in the domain and call the host's operator new and throw through the host's unwinder. A later step could
    /// load a private libstdc++ into each domain with its imports bound to the runtime; until then, refused.
    pub(super) const CXX_LIBRARY: Group = Group {
        id: "cxx-library",
        class: Unsupported,
        why: "the C++ standard library's code would run in the domain with the host's heap",
        names: &[],
    };
    pub(super) const UNKNOWN: Group =
        Group { id: "unknown", class: Unsupported, why: "not known to the domain runtime", names: &[] };
}

/// libm's functions by their double-precision name; `f`, `l`, `f32`, `f64`, `f128`, `f32x` and `f64x` suffixes
/// are recognised too. For imports without a symbol version (some toolchains leave libm calls unversioned).
const LIBM_FUNCTIONS: &[&str] = &[
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "atan2",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "sincos",
    "exp",
    "exp2",
    "exp10",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "logb",
    "ilogb",
    "llogb",
    "pow",
    "pow10",
    "sqrt",
    "cbrt",
    "hypot",
    "erf",
    "erfc",
    "tgamma",
    "lgamma_r",
    "lgammaf_r",
    "lgammal_r",
    "ceil",
    "floor",
    "trunc",
    "round",
    "roundeven",
    "lround",
    "llround",
    "rint",
    "lrint",
    "llrint",
    "nearbyint",
    "fmod",
    "remainder",
    "drem",
    "remquo",
    "fabs",
    "fdim",
    "fmax",
    "fmin",
    "fmaxmag",
    "fminmag",
    "fma",
    "copysign",
    "nan",
    "frexp",
    "ldexp",
    "scalb",
    "scalbn",
    "scalbln",
    "modf",
    "nextafter",
    "nexttoward",
    "nextup",
    "nextdown",
    "significand",
    "j0",
    "j1",
    "jn",
    "y0",
    "y1",
    "yn",
    "finite",
    "isinf",
    "isnan",
    "__finite",
    "__isinf",
    "__isnan",
    "__signbit",
    "__fpclassify",
    "fegetround",
    "fegetenv",
    "fetestexcept",
    "fegetexceptflag",
    "fegetexcept",
];

/// Libraries whose exports are libm's.
pub const LIBM_LIBRARIES: &[&str] = &["libm.so.6", "libmvec.so.1"];

/// Name prefixes of the C++ runtime, checked in order (the first match wins).
const CXX_PREFIXES: &[(&str, &str)] = &[
    ("__cxa_guard_", "cxx-library"),
    ("__cxa_", "cxx-exceptions"),
    ("__gxx_", "cxx-exceptions"),
    ("_Unwind_", "cxx-exceptions"),
    ("_ZTVN10__cxxabiv1", "cxx-exceptions"),
    ("_ZTI", "cxx-exceptions"),
    ("_ZTS", "cxx-exceptions"),
    ("_ZNS", "cxx-library"),
    ("_ZNKS", "cxx-library"),
    ("_ZSt", "cxx-library"),
    ("_ZTV", "cxx-library"),
    ("_ZN9__gnu_cxx", "cxx-library"),
    ("_ZNK9__gnu_cxx", "cxx-library"),
];

/// Prefixes of the thread library's synchronisation functions.
const THREAD_SYNC_PREFIXES: &[&str] = &["pthread_", "thrd_", "mtx_", "cnd_", "tss_", "sem_"];

fn table() -> &'static HashMap<&'static str, &'static Group> {
    static TABLE: OnceLock<HashMap<&'static str, &'static Group>> = OnceLock::new();
    TABLE.get_or_init(|| GROUPS.iter().flat_map(|g| g.names.iter().map(move |n| (*n, g))).collect())
}

fn group_by_id(id: &str) -> &'static Group {
    match id {
        "cxx-library" => &fallback::CXX_LIBRARY,
        // Every other id named in this file is a group of the table.
        _ => GROUPS.iter().find(|g| g.id == id).unwrap_or(&fallback::UNKNOWN),
    }
}

/// The base names `name` may stand for, most specific first: the name itself, then with the fortify, finite,
/// vector-ABI or ISO C prefix or suffix taken off.
fn base_names(name: &str) -> impl Iterator<Item = &str> {
    let chk = name.strip_prefix("__").and_then(|n| n.strip_suffix("_chk"));
    let finite = name.strip_prefix("__").and_then(|n| n.strip_suffix("_finite"));
    // `_ZGV` + ISA letter + mask + lanes + parameter kinds + `_` + the scalar name.
    let vector = name.strip_prefix("_ZGV").and_then(|n| n.split_once('_')).map(|(_, scalar)| scalar);
    let iso = name.strip_prefix("__isoc99_").or_else(|| name.strip_prefix("__isoc23_"));
    std::iter::once(name).chain(chk).chain(finite).chain(vector).chain(iso)
}

fn is_libm_function(name: &str) -> bool {
    if LIBM_FUNCTIONS.contains(&name) {
        return true;
    }
    ["f", "l", "f32", "f64", "f128", "f32x", "f64x"]
        .iter()
        .filter_map(|suffix| name.strip_suffix(suffix))
        .any(|stem| LIBM_FUNCTIONS.contains(&stem))
}

/// Every name the table binds through a host gate.
#[cfg(test)]
pub fn host_gate_names() -> impl Iterator<Item = &'static str> {
    GROUPS.iter().filter(|g| g.class == HostGate).flat_map(|g| g.names.iter().copied())
}

/// How the import `name`, whose version (if any) comes from `library`, is bound.
pub fn classify(name: &str, library: Option<&str>) -> &'static Group {
    let table = table();
    for base in base_names(name) {
        if let Some(group) = table.get(base) {
            return group;
        }
    }
    if library.is_some_and(|l| LIBM_LIBRARIES.contains(&l)) || base_names(name).any(is_libm_function) {
        return &fallback::LIBM;
    }
    if let Some((_, id)) = CXX_PREFIXES.iter().find(|(prefix, _)| name.starts_with(prefix)) {
        return group_by_id(id);
    }
    if THREAD_SYNC_PREFIXES.iter().any(|prefix| name.starts_with(prefix)) {
        return group_by_id("thread-sync");
    }
    &fallback::UNKNOWN
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str) -> ImportClass {
        classify(name, None).class
    }

    fn id(name: &str, library: Option<&str>) -> &'static str {
        classify(name, library).id
    }

    #[test]
    fn no_name_is_in_two_groups() {
        let mut seen = HashMap::new();
        for group in GROUPS {
            for name in group.names {
                if let Some(other) = seen.insert(*name, group.id) {
                    panic!("{name} is in both {other} and {}", group.id);
                }
            }
        }
        for name in LIBM_FUNCTIONS {
            assert!(!seen.contains_key(name), "{name} is both a libm function and in group {}", seen[name]);
        }
    }

    #[test]
    fn every_prefix_names_a_group() {
        for (_, id) in CXX_PREFIXES {
            assert_ne!(group_by_id(id).id, "unknown", "{id}");
        }
        assert_eq!(group_by_id("thread-sync").id, "thread-sync");
    }

    #[test]
    fn domain_runtime() {
        for name in ["malloc", "calloc", "free", "posix_memalign", "strdup", "_Znwm", "_ZdlPvm", "_ZnamRKSt9nothrow_t"]
        {
            assert_eq!(class(name), DomainRuntime, "{name}");
        }
        for name in ["__cxa_atexit", "__cxa_finalize", "__tls_get_addr", "rand", "srand", "random", "qsort", "strtok"] {
            assert_eq!(class(name), DomainRuntime, "{name}");
        }
        for name in ["_setjmp", "__sigsetjmp", "longjmp", "__longjmp_chk", "siglongjmp"] {
            assert_eq!(id(name, None), "jumps", "{name}");
        }
        for name in ["mmap", "munmap", "mprotect", "sysconf", "pthread_mutex_lock", "pthread_mutex_unlock"] {
            assert_eq!(class(name), DomainRuntime, "{name}");
        }
    }

    #[test]
    fn every_domain_runtime_name_has_a_function() {
        for group in GROUPS.iter().filter(|g| g.class == DomainRuntime) {
            for name in group.names.iter().filter(|&&n| n != "_ZSt7nothrow") {
                assert!(crate::domain::runtime::function(name).is_some(), "{name} of {}", group.id);
            }
        }
        for name in LIBRARY_LOOKUP {
            assert_eq!(id(name, None), "dynamic-loading", "{name}");
            assert!(crate::domain::runtime::function(name).is_some(), "{name}");
        }
    }

    #[test]
    fn pure() {
        for name in ["memcpy", "memset", "strlen", "strtol", "__ctype_b_loc", "bsearch", "abs", "rand_r", "time"] {
            assert_eq!(class(name), Pure, "{name}");
        }
        // Fortified variants follow their base function.
        assert_eq!(id("__memcpy_chk", None), "string");
        assert_eq!(id("__strcpy_chk", None), "string");
        // libm by name, by version library, and in its finite and vector forms.
        for name in ["sin", "cosf", "expf", "pow", "floor", "lrintf", "sqrt", "sincosf", "atan2l", "__powf_finite"] {
            assert_eq!(id(name, None), "libm", "{name}");
        }
        assert_eq!(id("_ZGVbN4v_expf", Some("libmvec.so.1")), "libm");
        assert_eq!(id("_ZGVdN8vv_powf", None), "libm");
        assert_eq!(id("some_new_math_function", Some("libm.so.6")), "libm");
        assert_eq!(id("some_new_math_function", Some("libc.so.6")), "unknown");
    }

    #[test]
    fn host_gates() {
        for name in ["printf", "fprintf", "puts", "fwrite", "fopen", "fclose", "fgets", "stderr", "stdout"] {
            assert_eq!(id(name, None), "stdio", "{name}");
        }
        for name in ["snprintf", "sprintf", "__sprintf_chk", "__snprintf_chk", "__fprintf_chk", "__isoc99_sscanf"] {
            assert_eq!(id(name, None), "stdio", "{name}");
        }
        for name in ["gettext", "dgettext", "dcgettext", "bindtextdomain"] {
            assert_eq!(id(name, None), "gettext", "{name}");
        }
        assert_eq!(id("localtime_r", None), "calendar");
        assert_eq!(id("getenv", None), "environment");
    }

    #[test]
    fn faults() {
        for name in ["exit", "_exit", "abort", "__assert_fail", "__stack_chk_fail", "__cxa_pure_virtual"] {
            assert_eq!(class(name), Fault, "{name}");
        }
    }

    #[test]
    fn toolchain_hooks() {
        for name in ["__gmon_start__", "_ITM_registerTMCloneTable", "_ITM_deregisterTMCloneTable"] {
            assert_eq!(class(name), Toolchain, "{name}");
        }
    }

    #[test]
    fn unsupported() {
        assert_eq!(id("pthread_create", None), THREAD_START);
        assert_eq!(id("thrd_create", None), THREAD_START);
        assert_eq!(id("__cxa_thread_atexit_impl", None), "thread-exit");
        assert_eq!(id("pthread_cond_wait", None), "thread-sync");
        for name in ["mremap", "pkey_mprotect", "madvise"] {
            assert_eq!(id(name, None), "mappings", "{name}");
        }
        assert_eq!(id("dlopen", None), "dynamic-loading");
        assert_eq!(id("fork", None), "processes");
        assert_eq!(id("sigaction", None), "signals");
        assert_eq!(id("signal", None), "signals");
        assert_eq!(id("syscall", None), "syscall");
        assert_eq!(id("open", None), "descriptors");
        assert_eq!(id("lgamma", Some("libm.so.6")), "host-state");
        assert_eq!(id("fesetround", Some("libm.so.6")), "host-state");
        for name in ["__cxa_throw", "__cxa_begin_catch", "_Unwind_Resume", "__gxx_personality_v0"] {
            assert_eq!(id(name, None), "cxx-exceptions", "{name}");
        }
        assert_eq!(id("_ZTVN10__cxxabiv117__class_type_infoE", None), "cxx-exceptions");
        assert_eq!(id("__cxa_guard_acquire", None), "cxx-library");
        assert_eq!(id("__getdelim", None), "host-allocation");
        for name in ["_ZNSt8ios_base4InitC1Ev", "_ZNKSt5ctypeIcE8do_widenEc", "_ZSt19__throw_logic_errorPKc"] {
            assert_eq!(id(name, None), "cxx-library", "{name}");
        }
        assert_eq!(id("fftwf_execute", None), "unknown");
        assert!(!class("fftwf_execute").honoured());
    }
}
