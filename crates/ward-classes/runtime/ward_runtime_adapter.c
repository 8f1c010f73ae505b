/* ward's runtime adapter (issue 32): the inside of a runtime's domain. It holds the compiler (libtcc, linked in
 * statically), the plugins linked so far (a namespace of named entry points), the runtime's heap, and the host's
 * built-ins, and it offers them as flat calls the generic call API carries:
 *
 *   ward_rt_open(heap_bytes)                              a runtime (handle) with its heap
 *   ward_rt_close(rt)                                     the runtime and everything in it freed
 *   ward_rt_header(rt, name, text, len)                   a header plugins may #include
 *   ward_rt_builtin(rt, name, fn)                         a host function plugins may call by name
 *   ward_rt_compile(rt, name, src, len, report, cap)      C source -> plugin (handle) or NULL, diagnostics in report
 *   ward_rt_link_object(rt, name, obj, len, report, cap)  a relocatable object -> plugin
 *   ward_rt_link_shared(rt, name, path, report, cap)      a shared object -> plugin
 *   ward_rt_set_linked(plugin, 0 or 1)                the plugin leaves or re-enters the namespace
 *   ward_rt_unlink(plugin)                            the plugin is gone; its code is freed
 *   ward_rt_invoke(plugin, a1..a5)                    calls the plugin's entry with a1..a5 (and any float args)
 *   ward_rt_heap_save(rt, out, len) / _restore(rt, in, len)  the heap as bytes, for the host's snapshots
 *
 * The compiler is extension code like any other: it runs here, so source that crashes or hangs it costs this domain
 * a recovery, never the host. Everything it would ask of the system goes through the ward_tcc_* functions below (the
 * build renames libtcc's references to them): it reads headers and sources from memory, never from files, loads no
 * libraries, and resolves a plugin's undefined names against the namespace, the built-ins and a short list of C
 * library functions, nothing else. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <libtcc.h>

#include "ward_adapter_common.h"

#define WARD_RT_MAX_PLUGINS 1024
#define WARD_RT_MAX_NAME 64
#define WARD_RT_MAX_FILES 256
#define WARD_RT_MAX_BUILTINS 256
#define WARD_RT_MAX_DEPS 64
#define WARD_RT_OPEN_FILES 32
/* Virtual descriptors are numbered from here, far above any the process has. */
#define WARD_RT_FD_BASE 0x40000000

#define WARD_RT_INCLUDE_DIR "/ward/include"
#define WARD_RT_SOURCE_DIR "/ward/src"
#define WARD_RT_LIB_DIR "/ward/lib"

/* ---- the streams and environment libtcc refers to (renamed by the build; hidden, so its non-PIC references
 * resolve inside this object) ---- */

FILE *ward_tcc_stdout;
FILE *ward_tcc_stderr;
static char *no_environment[1];
char **ward_tcc_environ = no_environment;

__attribute__((constructor)) static void ward_rt_streams(void) {
    ward_tcc_stdout = stdout;
    ward_tcc_stderr = stderr;
}

/* The lexer's current file: libtcc's `BufferedFile`, whose first members are the read position, the end of the
 * buffered text and the descriptor it reads. Only those three are used, and only when the descriptor is the one
 * this adapter handed out for the source being compiled, to turn an error's position into a column. */
struct ward_tcc_file_head {
    unsigned char *buf_ptr;
    unsigned char *buf_end;
    int fd;
};
extern struct ward_tcc_file_head *ward_tcc_lexer_file;

/* ---- one lock: the compiler keeps global state, and the namespace is shared ---- */

static atomic_flag rt_lock = ATOMIC_FLAG_INIT;

static void lock(void) {
    while (atomic_flag_test_and_set_explicit(&rt_lock, memory_order_acquire))
        __builtin_ia32_pause();
}

static void unlock(void) { atomic_flag_clear_explicit(&rt_lock, memory_order_release); }

/* ---- files in memory: headers the host declared, the source or object being linked ---- */

struct vfile {
    char path[128];
    unsigned char *data;
    size_t len;
};

struct vfd {
    const struct vfile *file; /* NULL: free */
    size_t pos;
};

struct plugin;

struct builtin {
    char name[WARD_RT_MAX_NAME];
    void *fn;
};

/* One runtime: a domain may hold several (a group, or every runtime of isolation none in the host's process). */
struct runtime {
    struct vfile files[WARD_RT_MAX_FILES]; /* headers, and the source or object being linked */
    size_t file_count;
    struct plugin *plugins[WARD_RT_MAX_PLUGINS];
    struct builtin builtins[WARD_RT_MAX_BUILTINS];
    size_t builtin_count;
    unsigned char *heap;
    uint64_t heap_len;
    /* ward_heap() and ward_heap_size() of this runtime: compiled for it when it opens, so plugins, compiled or
     * linked from objects, call them like any function and get this runtime's heap. */
    void *heap_fn;
    void *heap_size_fn;
    void *stub_code;
    size_t stub_len;
};

/* The runtime whose plugin is being linked, for the compiler's file and name lookups (under the lock). */
static struct runtime *current;
static struct vfd open_files[WARD_RT_OPEN_FILES];

static struct vfile *file_find(struct runtime *rt, const char *path) {
    for (size_t i = 0; rt != NULL && i < rt->file_count; i++)
        if (strcmp(rt->files[i].path, path) == 0)
            return &rt->files[i];
    return NULL;
}

/* Adds or replaces the file at `path` with a copy of `data`. 0, or -1 when out of room. */
static int file_put(struct runtime *rt, const char *path, const void *data, size_t len) {
    if (strlen(path) >= sizeof rt->files[0].path)
        return -1;
    struct vfile *f = file_find(rt, path);
    if (f == NULL) {
        if (rt->file_count == WARD_RT_MAX_FILES)
            return -1;
        f = &rt->files[rt->file_count++];
        snprintf(f->path, sizeof f->path, "%s", path);
        f->data = NULL;
        f->len = 0;
    }
    unsigned char *copy = malloc(len ? len : 1);
    if (copy == NULL)
        return -1;
    memcpy(copy, data, len);
    free(f->data);
    f->data = copy;
    f->len = len;
    return 0;
}

static void file_remove(struct runtime *rt, const char *path) {
    struct vfile *f = file_find(rt, path);
    if (f == NULL)
        return;
    free(f->data);
    *f = rt->files[--rt->file_count];
}

static struct vfd *vfd_of(int fd) {
    if (fd < WARD_RT_FD_BASE || fd >= WARD_RT_FD_BASE + WARD_RT_OPEN_FILES)
        return NULL;
    struct vfd *v = &open_files[fd - WARD_RT_FD_BASE];
    return v->file != NULL ? v : NULL;
}

int ward_tcc_open(const char *path, int flags, ...) {
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_CREAT)) {
        errno = EACCES;
        return -1;
    }
    const struct vfile *f = file_find(current, path);
    /* A quoted #include looks beside the source first: serve the declared headers there too. */
    if (f == NULL && strncmp(path, WARD_RT_SOURCE_DIR "/", sizeof WARD_RT_SOURCE_DIR) == 0) {
        char header[160];
        snprintf(header, sizeof header, WARD_RT_INCLUDE_DIR "/%s", path + sizeof WARD_RT_SOURCE_DIR);
        f = file_find(current, header);
    }
    /* The libraries the compiler links every plugin with: empty, the resolver below stands in for them. */
    static const struct vfile empty_libc = {WARD_RT_LIB_DIR "/libc.a", (unsigned char *)"!<arch>\n", 8};
    static const struct vfile empty_libtcc1 = {WARD_RT_LIB_DIR "/libtcc1.a", (unsigned char *)"!<arch>\n", 8};
    if (f == NULL && strcmp(path, empty_libc.path) == 0)
        f = &empty_libc;
    if (f == NULL && strcmp(path, empty_libtcc1.path) == 0)
        f = &empty_libtcc1;
    if (f == NULL) {
        errno = ENOENT;
        return -1;
    }
    for (int i = 0; i < WARD_RT_OPEN_FILES; i++) {
        if (open_files[i].file == NULL) {
            open_files[i].file = f;
            open_files[i].pos = 0;
            return WARD_RT_FD_BASE + i;
        }
    }
    errno = EMFILE;
    return -1;
}

ssize_t ward_tcc_read(int fd, void *buf, size_t len) {
    struct vfd *v = vfd_of(fd);
    if (v == NULL) {
        errno = EBADF;
        return -1;
    }
    size_t left = v->pos < v->file->len ? v->file->len - v->pos : 0;
    size_t n = len < left ? len : left;
    memcpy(buf, v->file->data + v->pos, n);
    v->pos += n;
    return (ssize_t)n;
}

off_t ward_tcc_lseek(int fd, off_t offset, int whence) {
    struct vfd *v = vfd_of(fd);
    if (v == NULL) {
        errno = EBADF;
        return -1;
    }
    off_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? (off_t)v->pos : (off_t)v->file->len;
    if (whence != SEEK_SET && whence != SEEK_CUR && whence != SEEK_END) {
        errno = EINVAL;
        return -1;
    }
    if (base + offset < 0) {
        errno = EINVAL;
        return -1;
    }
    v->pos = (size_t)(base + offset);
    return (off_t)v->pos;
}

int ward_tcc_close(int fd) {
    struct vfd *v = vfd_of(fd);
    if (v == NULL) {
        errno = EBADF;
        return -1;
    }
    v->file = NULL;
    return 0;
}

/* The compiler writes no files, reads no environment, and loads no libraries. */
FILE *ward_tcc_fdopen(int fd, const char *mode) {
    (void)fd;
    (void)mode;
    errno = EACCES;
    return NULL;
}

int ward_tcc_unlink(const char *path) {
    (void)path;
    errno = EACCES;
    return -1;
}

char *ward_tcc_getcwd(char *buf, size_t len) {
    if (buf == NULL || len < sizeof WARD_RT_SOURCE_DIR) {
        errno = ERANGE;
        return NULL;
    }
    memcpy(buf, WARD_RT_SOURCE_DIR, sizeof WARD_RT_SOURCE_DIR);
    return buf;
}

char *ward_tcc_getenv(const char *name) {
    (void)name;
    return NULL;
}

void *ward_tcc_dlopen(const char *path, int flags) {
    (void)path;
    (void)flags;
    return NULL;
}

int ward_tcc_dlclose(void *handle) {
    (void)handle;
    return 0;
}

/* Run-time code is never writable and executable at once (W^X, in every isolation kind): the compiler asks for
 * its code pages read-write-execute while it still copies the next section in, so the requests are only noted
 * here, and the link makes the pages read-and-execute once the compiler is done with them (code_protect). In an
 * mpk domain the domain runtime's mprotect scans the pages first and refuses code holding an instruction an mpk
 * domain may not run (EPERM). */
#define WARD_RT_MAX_CODE_RANGES 8

static struct {
    void *addr;
    size_t len;
} code_ranges[WARD_RT_MAX_CODE_RANGES];
static size_t code_range_count;
static int code_ranges_overflow;

int ward_tcc_mprotect(void *addr, size_t len, int prot) {
    if (!(prot & PROT_EXEC))
        return mprotect(addr, len, prot);
    for (size_t i = 0; i < code_range_count; i++)
        if (code_ranges[i].addr == addr && code_ranges[i].len == len)
            return 0;
    if (code_range_count == WARD_RT_MAX_CODE_RANGES) {
        code_ranges_overflow = 1;
        return 0;
    }
    code_ranges[code_range_count].addr = addr;
    code_ranges[code_range_count].len = len;
    code_range_count++;
    return 0;
}

/* The lock above serialises the compiler; its own semaphore has nothing left to do. */
int ward_tcc_sem_init(void *sem, int shared, unsigned value) {
    (void)sem;
    (void)shared;
    (void)value;
    return 0;
}

int ward_tcc_sem_wait(void *sem) {
    (void)sem;
    return 0;
}

int ward_tcc_sem_post(void *sem) {
    (void)sem;
    return 0;
}

/* Only `tcc_run`'s crash reporting installs handlers, and it is never called: a plugin's faults are ward's. */
int ward_tcc_sigaction(int sig, const void *act, void *old) {
    (void)sig;
    (void)act;
    (void)old;
    errno = ENOSYS;
    return -1;
}

int ward_tcc_sigemptyset(void *set) {
    (void)set;
    return 0;
}

/* libtcc exits on an error outside a compilation: that is a broken compiler, a fault of this domain. */
void ward_tcc_exit(int status) {
    (void)status;
    abort();
}

/* ---- the namespace ---- */

struct plugin {
    void *entry; /* first member: ward_rt_invoke jumps through it */
    char name[WARD_RT_MAX_NAME];
    void *code; /* the relocated code and data (compiled or object plugins) */
    size_t code_len;
    void *library; /* the dlopen handle (shared-object plugins) */
    int linked;    /* in the namespace: later plugins resolve its name */
    struct runtime *rt;
};

/* The plugin holding `name`, linked or not (a name stays taken while its plugin is unlinked). */
static struct plugin *plugin_named(struct runtime *rt, const char *name) {
    for (size_t i = 0; i < WARD_RT_MAX_PLUGINS; i++)
        if (rt->plugins[i] != NULL && strcmp(rt->plugins[i]->name, name) == 0)
            return rt->plugins[i];
    return NULL;
}

/* C library functions a plugin may call: pure functions of their arguments. */
static const struct {
    const char *name;
    void *fn;
} libc_allowed[] = {
    {"memcpy", (void *)memcpy}, {"memmove", (void *)memmove}, {"memset", (void *)memset},
    {"memcmp", (void *)memcmp}, {"strlen", (void *)strlen},   {"strcmp", (void *)strcmp},
    {"strncmp", (void *)strncmp}, {"strchr", (void *)strchr}, {"strcpy", (void *)strcpy},
    {"strncpy", (void *)strncpy}, {"abs", (void *)abs},       {"labs", (void *)labs},
    {"llabs", (void *)llabs},     {"sqrt", (void *)sqrt},     {"sqrtf", (void *)sqrtf},
    {"floor", (void *)floor},     {"ceil", (void *)ceil},     {"fabs", (void *)fabs},
    {"round", (void *)round},     {"sin", (void *)sin},       {"cos", (void *)cos},
    {"tan", (void *)tan},         {"exp", (void *)exp},       {"log", (void *)log},
    {"log2", (void *)log2},       {"log10", (void *)log10},   {"pow", (void *)pow},
    {"fmin", (void *)fmin},       {"fmax", (void *)fmax},
};

/* What one link is doing, for the resolver and the error handler. */
struct link {
    struct runtime *rt;
    const char *name;   /* the plugin being linked */
    const char *also;   /* another function to find in it, or NULL */
    void *also_addr;
    int source_fd;      /* its source's virtual descriptor, -1 until open */
    const char *source; /* its text, for columns */
    size_t source_len;
    char *report; /* diagnostics, or the plugins it uses */
    size_t report_cap;
    size_t report_len;
    const char *deps[WARD_RT_MAX_DEPS];
    size_t dep_count;
    int deps_overflow;
};

static struct link *linking;

static void report_add(struct link *l, const char *fmt, ...) {
    if (l->report == NULL || l->report_len + 1 >= l->report_cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->report + l->report_len, l->report_cap - l->report_len, fmt, ap);
    va_end(ap);
    if (n > 0)
        l->report_len += (size_t)n < l->report_cap - l->report_len ? (size_t)n : l->report_cap - l->report_len - 1;
}

/* libtcc's resolver for names a plugin uses but does not define: the built-ins, the other plugins (which this one
 * then depends on), the allowed C library functions. Anything else stays undefined, and the link fails naming it. */
void *ward_tcc_dlsym(void *handle, const char *name) {
    (void)handle;
    struct runtime *rt = current;
    if (rt == NULL)
        return NULL;
    if (strcmp(name, "ward_heap") == 0)
        return rt->heap_fn;
    if (strcmp(name, "ward_heap_size") == 0)
        return rt->heap_size_fn;
    for (size_t i = 0; i < rt->builtin_count; i++)
        if (strcmp(rt->builtins[i].name, name) == 0)
            return rt->builtins[i].fn;
    struct plugin *p = plugin_named(rt, name);
    if (p != NULL && p->linked) {
        if (linking != NULL) {
            if (linking->dep_count < WARD_RT_MAX_DEPS)
                linking->deps[linking->dep_count++] = p->name;
            else
                linking->deps_overflow = 1;
        }
        return p->entry;
    }
    for (size_t i = 0; i < sizeof libc_allowed / sizeof libc_allowed[0]; i++)
        if (strcmp(libc_allowed[i].name, name) == 0)
            return libc_allowed[i].fn;
    return NULL;
}

/* The column of an error, from where the lexer stands in the source: the start of the token it last read. 0 when
 * the lexer is not in the source (an error in a header, or at link time). The line is reported beside it so the
 * host uses the column only when it matches the line of the message. */
static void error_position(const struct link *l, size_t *line, size_t *column) {
    *line = 0;
    *column = 0;
    const struct ward_tcc_file_head *f = ward_tcc_lexer_file;
    if (l->source == NULL || f == NULL || f->fd != l->source_fd)
        return;
    const struct vfd *v = vfd_of(f->fd);
    if (v == NULL || f->buf_ptr > f->buf_end || (size_t)(f->buf_end - f->buf_ptr) > v->pos)
        return;
    size_t at = v->pos - (size_t)(f->buf_end - f->buf_ptr);
    if (at > l->source_len)
        return;
    const char *s = l->source;
    /* Back over the token just read: a word, or one punctuation character, after any blanks. */
    size_t p = at;
    while (p > 0 && (s[p - 1] == ' ' || s[p - 1] == '\t'))
        p--;
    size_t word = p;
    while (word > 0 && (s[word - 1] == '_' || (s[word - 1] >= '0' && s[word - 1] <= '9') ||
                        ((s[word - 1] | 0x20) >= 'a' && (s[word - 1] | 0x20) <= 'z')))
        word--;
    p = word < p ? word : (p > 0 && s[p - 1] != '\n' ? p - 1 : p);
    size_t start = p;
    while (start > 0 && s[start - 1] != '\n')
        start--;
    size_t n = 1;
    for (size_t i = 0; i < start; i++)
        n += s[i] == '\n';
    *line = n;
    *column = p - start + 1;
}

static void on_error(void *opaque, const char *message) {
    struct link *l = opaque;
    size_t line, column;
    error_position(l, &line, &column);
    /* One message per line: "LINE\tCOLUMN\tMESSAGE", newlines inside a message flattened. */
    report_add(l, "%zu\t%zu\t", line, column);
    for (const char *c = message; *c; c++)
        report_add(l, "%c", *c == '\n' || *c == '\t' ? ' ' : *c);
    report_add(l, "\n");
}

static int plugin_slot(struct runtime *rt) {
    for (int i = 0; i < WARD_RT_MAX_PLUGINS; i++)
        if (rt->plugins[i] == NULL)
            return i;
    return -1;
}

static int name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n >= WARD_RT_MAX_NAME)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        int ok = c == '_' || (c >= '0' && c <= '9' && i > 0) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
        if (!ok)
            return 0;
    }
    return 1;
}

/* On success, the report lists the plugins the new one uses ("uses\tNAME" lines). */
static void report_deps(struct link *l) {
    l->report_len = 0;
    if (l->report != NULL && l->report_cap > 0)
        l->report[0] = '\0';
    for (size_t i = 0; i < l->dep_count; i++) {
        int seen = 0;
        for (size_t j = 0; j < i; j++)
            seen |= strcmp(l->deps[i], l->deps[j]) == 0;
        if (!seen)
            report_add(l, "uses\t%s\n", l->deps[i]);
    }
}

/* Makes the code pages the compiler asked for read-and-execute. 0, or -1 with the reason in the report. */
static int code_protect(struct link *l) {
    if (code_ranges_overflow) {
        report_add(l, "0\t0\terror: the plugin's code is in more than %d pieces\n", WARD_RT_MAX_CODE_RANGES);
        return -1;
    }
    for (size_t i = 0; i < code_range_count; i++) {
        if (mprotect(code_ranges[i].addr, code_ranges[i].len, PROT_READ | PROT_EXEC) != 0) {
            if (errno == EPERM)
                report_add(l, "0\t0\terror: an mpk runtime runs no code holding the bytes of WRPKRU, XRSTOR, "
                              "XRSTORS or WRFSBASE, and the plugin's code holds one (isolation process runs it)\n");
            else
                report_add(l, "0\t0\terror: cannot make the plugin's code executable: %s\n", strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Compiles (or links the object at) `path` in memory into a new plugin named `name`. */
static struct plugin *tcc_link(struct link *l, const char *path) {
    struct plugin *made = NULL;
    TCCState *s = tcc_new();
    if (s == NULL) {
        report_add(l, "0\t0\terror: out of memory\n");
        return NULL;
    }
    tcc_set_error_func(s, l, on_error);
    /* Not -nostdlib: that also turns off resolving undefined names (ward_tcc_dlsym). The C library and libtcc1
     * the compiler then asks for are empty archives in memory. */
    tcc_set_options(s, "-nostdinc");
    tcc_set_lib_path(s, WARD_RT_LIB_DIR);
    tcc_add_library_path(s, WARD_RT_LIB_DIR);
    tcc_set_output_type(s, TCC_OUTPUT_MEMORY);
    tcc_add_include_path(s, WARD_RT_INCLUDE_DIR);
    tcc_define_symbol(s, "WARD_RUNTIME", "1");
    linking = l;
    current = l->rt;
    code_range_count = 0;
    code_ranges_overflow = 0;
    /* The compiler lays code out first, then the data, each section only aligned as it asks: data aligned to a
     * page keeps every writable byte off the code's pages, which become read-only. */
    if (tcc_compile_string(s, "__asm__(\".data\\n.p2align 12\\n\");") < 0)
        goto out;
    if (tcc_add_file(s, path) < 0)
        goto out;
    int size = tcc_relocate(s, NULL);
    if (size < 0)
        goto out;
    size_t len = ((size_t)size + ward_page_size() - 1) & ~(ward_page_size() - 1);
    void *code = mmap(NULL, len ? len : ward_page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        report_add(l, "0\t0\terror: out of memory for %d bytes of code\n", size);
        goto out;
    }
    if (tcc_relocate(s, code) < 0 || code_protect(l) < 0) {
        munmap(code, len);
        goto out;
    }
    void *entry = tcc_get_symbol(s, l->name);
    if (entry == NULL) {
        report_add(l, "0\t0\terror: no function named '%s': a plugin's entry point has the plugin's name\n", l->name);
        munmap(code, len);
        goto out;
    }
    if (l->also != NULL)
        l->also_addr = tcc_get_symbol(s, l->also);
    made = calloc(1, sizeof *made);
    if (made == NULL) {
        munmap(code, len);
        report_add(l, "0\t0\terror: out of memory\n");
        goto out;
    }
    made->entry = entry;
    made->code = code;
    made->code_len = len;
out:
    linking = NULL;
    current = NULL;
    tcc_delete(s);
    return made;
}

static struct plugin *add(struct link *l, struct plugin *p) {
    int slot = plugin_slot(l->rt);
    if (p == NULL)
        return NULL;
    if (slot < 0) {
        if (p->code != NULL)
            munmap(p->code, p->code_len);
        free(p);
        report_add(l, "0\t0\terror: the runtime holds %d plugins, its most\n", WARD_RT_MAX_PLUGINS);
        return NULL;
    }
    snprintf(p->name, sizeof p->name, "%s", l->name);
    p->linked = 1;
    p->rt = l->rt;
    l->rt->plugins[slot] = p;
    report_deps(l);
    return p;
}

static int link_start(struct link *l, struct runtime *rt, const char *name, char *report, uint64_t report_cap) {
    memset(l, 0, sizeof *l);
    l->rt = rt;
    l->name = name;
    l->source_fd = -1;
    l->report = report;
    l->report_cap = (size_t)report_cap;
    if (report != NULL && report_cap > 0)
        report[0] = '\0';
    if (!name_ok(name)) {
        report_add(l, "0\t0\terror: '%s' is not a plugin name: letters, digits and '_', at most %d, not starting "
                      "with a digit\n", name, WARD_RT_MAX_NAME - 1);
        return -1;
    }
    if (plugin_named(rt, name) != NULL) {
        report_add(l, "0\t0\terror: a plugin named '%s' is linked already\n", name);
        return -1;
    }
    return 0;
}

/* The heap functions of `rt`, compiled for it: they return its heap's address and size as constants. */
static int heap_stubs(struct runtime *rt) {
    char source[256];
    snprintf(source, sizeof source,
             "void *ward_heap(void) { return (void *)%luUL; }\n"
             "unsigned long ward_heap_size(void) { return %luUL; }\n",
             (unsigned long)(uintptr_t)rt->heap, (unsigned long)rt->heap_len);
    struct link l;
    memset(&l, 0, sizeof l);
    l.rt = rt;
    l.name = "ward_heap";
    l.also = "ward_heap_size";
    l.source_fd = -1;
    if (file_put(rt, WARD_RT_SOURCE_DIR "/ward_heap.c", source, strlen(source)) < 0)
        return -1;
    struct plugin *stub = tcc_link(&l, WARD_RT_SOURCE_DIR "/ward_heap.c");
    file_remove(rt, WARD_RT_SOURCE_DIR "/ward_heap.c");
    if (stub == NULL || l.also_addr == NULL) {
        if (stub != NULL)
            munmap(stub->code, stub->code_len);
        free(stub);
        return -1;
    }
    rt->heap_fn = stub->entry;
    rt->heap_size_fn = l.also_addr;
    rt->stub_code = stub->code;
    rt->stub_len = stub->code_len;
    free(stub);
    return 0;
}

/* A plugin's code (or library) and record, freed. */
static void plugin_free(struct plugin *p) {
    if (p->code != NULL)
        munmap(p->code, p->code_len);
#ifndef WARD_RT_NO_SHARED
    if (p->library != NULL)
        dlclose(p->library);
#endif
    free(p);
}

static void runtime_free(struct runtime *rt) {
    for (size_t i = 0; i < WARD_RT_MAX_PLUGINS; i++) {
        if (rt->plugins[i] != NULL)
            plugin_free(rt->plugins[i]);
    }
    for (size_t i = 0; i < rt->file_count; i++)
        free(rt->files[i].data);
    if (rt->stub_code != NULL)
        munmap(rt->stub_code, rt->stub_len);
    if (rt->heap != NULL)
        munmap(rt->heap, rt->heap_len);
    free(rt);
}

/* A new runtime with a heap of `heap_bytes`; NULL when out of memory. */
WARD_ADAPTER_EXPORT struct runtime *ward_rt_open(uint64_t heap_bytes) {
    struct runtime *rt = calloc(1, sizeof *rt);
    if (rt == NULL)
        return NULL;
    if (heap_bytes > 0) {
        void *h = mmap(NULL, heap_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (h == MAP_FAILED) {
            free(rt);
            return NULL;
        }
        rt->heap = h;
        rt->heap_len = heap_bytes;
    }
    lock();
    int stubs = heap_stubs(rt);
    unlock();
    if (stubs < 0) {
        runtime_free(rt);
        return NULL;
    }
    return rt;
}

WARD_ADAPTER_EXPORT int64_t ward_rt_close(struct runtime *rt) {
    lock();
    runtime_free(rt);
    unlock();
    return 0;
}

WARD_ADAPTER_EXPORT int64_t ward_rt_header(struct runtime *rt, const char *name, const uint8_t *text, uint64_t len) {
    char path[160];
    if (strchr(name, '/') != NULL || strlen(name) > 100)
        return WARD_ADAPTER_E_LAYOUT;
    snprintf(path, sizeof path, WARD_RT_INCLUDE_DIR "/%s", name);
    lock();
    int r = file_put(rt, path, text, (size_t)len);
    unlock();
    return r < 0 ? WARD_ADAPTER_E_NOMEM : 0;
}

WARD_ADAPTER_EXPORT int64_t ward_rt_builtin(struct runtime *rt, const char *name, void *fn) {
    if (!name_ok(name) || fn == NULL)
        return WARD_ADAPTER_E_LAYOUT;
    lock();
    int64_t r = 0;
    size_t i = 0;
    while (i < rt->builtin_count && strcmp(rt->builtins[i].name, name) != 0)
        i++;
    if (i == rt->builtin_count) {
        if (rt->builtin_count == WARD_RT_MAX_BUILTINS)
            r = WARD_ADAPTER_E_NOMEM;
        else
            rt->builtin_count++;
    }
    if (r == 0) {
        snprintf(rt->builtins[i].name, sizeof rt->builtins[i].name, "%s", name);
        rt->builtins[i].fn = fn;
    }
    unlock();
    return r;
}

/* Links the plugin `name` from `bytes` given to the compiler as the in-memory file NAME.EXT: C source ("c") or a
 * relocatable object ("o"). */
static struct plugin *link_bytes(struct runtime *rt, const char *name, const char *ext, const uint8_t *bytes,
                                 uint64_t len, char *report, uint64_t report_cap) {
    struct link l;
    lock();
    struct plugin *p = NULL;
    if (link_start(&l, rt, name, report, report_cap) == 0) {
        char path[160];
        snprintf(path, sizeof path, WARD_RT_SOURCE_DIR "/%s.%s", name, ext);
        if (file_put(rt, path, bytes, (size_t)len) == 0) {
            if (strcmp(ext, "c") == 0) {
                l.source = (const char *)file_find(rt, path)->data;
                l.source_len = (size_t)len;
                /* The source's descriptor is the first free one: the compiler opens it before anything else. */
                for (int i = 0; i < WARD_RT_OPEN_FILES; i++) {
                    if (open_files[i].file == NULL) {
                        l.source_fd = WARD_RT_FD_BASE + i;
                        break;
                    }
                }
            }
            p = add(&l, tcc_link(&l, path));
            file_remove(rt, path);
        } else {
            report_add(&l, "0\t0\terror: out of memory for the %s\n", strcmp(ext, "c") == 0 ? "source" : "object");
        }
    }
    unlock();
    return p;
}

WARD_ADAPTER_EXPORT void *ward_rt_compile(struct runtime *rt, const char *name, const uint8_t *source, uint64_t len,
                                          char *report, uint64_t report_cap) {
    return link_bytes(rt, name, "c", source, len, report, report_cap);
}

WARD_ADAPTER_EXPORT void *ward_rt_link_object(struct runtime *rt, const char *name, const uint8_t *object,
                                              uint64_t len, char *report, uint64_t report_cap) {
    return link_bytes(rt, name, "o", object, len, report, report_cap);
}

#ifdef WARD_RT_NO_SHARED
/* The variant an mpk domain runs: code enters such a domain only through ward's loader (scanned and keyed), never
 * through the dynamic linker, so shared objects are refused and the adapter imports no dl* function. */
WARD_ADAPTER_EXPORT void *ward_rt_link_shared(struct runtime *rt, const char *name, const char *path, char *report,
                                              uint64_t report_cap) {
    struct link l;
    (void)path;
    lock();
    if (link_start(&l, rt, name, report, report_cap) == 0)
        report_add(&l, "0\t0\terror: an mpk runtime links no shared objects: link a relocatable object, or use "
                       "isolation process\n");
    unlock();
    return NULL;
}
#else
WARD_ADAPTER_EXPORT void *ward_rt_link_shared(struct runtime *rt, const char *name, const char *path, char *report,
                                              uint64_t report_cap) {
    struct link l;
    lock();
    struct plugin *p = NULL;
    if (link_start(&l, rt, name, report, report_cap) == 0) {
        void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (library == NULL) {
            const char *why = dlerror();
            report_add(&l, "0\t0\terror: cannot load %s: %s\n", path, why ? why : "unknown reason");
        } else {
            void *entry = dlsym(library, name);
            if (entry == NULL) {
                report_add(&l, "0\t0\terror: %s has no function named '%s': a plugin's entry point has the "
                               "plugin's name\n", path, name);
                dlclose(library);
            } else {
                struct plugin *made = calloc(1, sizeof *made);
                if (made == NULL) {
                    dlclose(library);
                    report_add(&l, "0\t0\terror: out of memory\n");
                } else {
                    made->entry = entry;
                    made->library = library;
                    p = add(&l, made);
                    if (p == NULL)
                        dlclose(library);
                }
            }
        }
    }
    unlock();
    return p;
}
#endif

/* Dynamic linking proper: the plugin enters (1) or leaves (0) the namespace; its code stays where it is. */
WARD_ADAPTER_EXPORT int64_t ward_rt_set_linked(struct plugin *p, int64_t linked) {
    lock();
    int64_t r = WARD_ADAPTER_E_INDEX;
    for (size_t i = 0; p != NULL && i < WARD_RT_MAX_PLUGINS; i++) {
        if (p->rt->plugins[i] == p) {
            p->linked = linked != 0;
            r = 0;
            break;
        }
    }
    unlock();
    return r;
}

WARD_ADAPTER_EXPORT int64_t ward_rt_unlink(struct plugin *p) {
    lock();
    int64_t r = WARD_ADAPTER_E_INDEX;
    for (size_t i = 0; p != NULL && i < WARD_RT_MAX_PLUGINS; i++) {
        if (p->rt->plugins[i] == p) {
            p->rt->plugins[i] = NULL;
            plugin_free(p);
            r = 0;
            break;
        }
    }
    unlock();
    return r;
}

/* Calls a plugin's entry with the five integer arguments after the plugin, and the float arguments untouched: the
 * arguments move down one register and the entry is jumped to, so it returns straight to the caller. */
__asm__(".text\n"
        ".globl ward_rt_invoke\n"
        ".type ward_rt_invoke, @function\n"
        "ward_rt_invoke:\n"
        "    movq (%rdi), %rax\n"
        "    movq %rsi, %rdi\n"
        "    movq %rdx, %rsi\n"
        "    movq %rcx, %rdx\n"
        "    movq %r8, %rcx\n"
        "    movq %r9, %r8\n"
        "    jmp *%rax\n"
        ".size ward_rt_invoke, .-ward_rt_invoke\n");

WARD_ADAPTER_EXPORT int64_t ward_rt_heap_save(struct runtime *rt, uint8_t *out, uint64_t len) {
    if (len != rt->heap_len)
        return WARD_ADAPTER_E_LAYOUT;
    if (len > 0)
        memcpy(out, rt->heap, len);
    return 0;
}

WARD_ADAPTER_EXPORT int64_t ward_rt_heap_restore(struct runtime *rt, const uint8_t *in, uint64_t len) {
    if (len != rt->heap_len)
        return WARD_ADAPTER_E_LAYOUT;
    if (len > 0)
        memcpy(rt->heap, in, len);
    return 0;
}
