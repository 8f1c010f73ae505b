/*
 * hostile_common.h -- the attacks of the hostile test extensions (hostile_ladspa.c, hostile.c): what a malicious
 * plugin would try against the host that loaded it and the machine it runs on, once it runs in a process domain
 * of its own. Header-only (static inline functions), so each extension stays one self-contained shared object.
 *
 * Every attack returns 0 when it got through and -errno (or -1) at the first step that failed; a failed step is
 * not an error to the caller, who carries on as a real attacker's code would. Nothing here loops without bound,
 * and every process an attack leaves behind ends by itself within HOSTILE_SLEEP_S seconds.
 *
 * Each including file defines _GNU_SOURCE before its first #include.
 */
#ifndef HOSTILE_COMMON_H
#define HOSTILE_COMMON_H

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

/* What every attack that writes somewhere writes. */
#define HOSTILE_MARK "PWNED"
#define HOSTILE_MARK_LEN 5
/* How long a process an attack leaves behind lives at most. */
#define HOSTILE_SLEEP_S 30
/* The highest descriptor number the descriptor attacks try. */
#define HOSTILE_MAX_FD 64

extern char **environ;

/* -errno of the call that just failed (never 0: -1 if errno was not set). */
static inline int hostile_fail(void) {
    return errno > 0 ? -errno : -1;
}

/* Writes the mark to fd; 0 if all of it went, else -errno. */
static inline int hostile_mark(int fd) {
    ssize_t n = write(fd, HOSTILE_MARK, HOSTILE_MARK_LEN);
    return n == HOSTILE_MARK_LEN ? 0 : hostile_fail();
}

/* Sleeps `seconds`, going back to sleep after a signal handler ran. */
static inline void hostile_sleep(unsigned seconds) {
    struct timespec left = {.tv_sec = seconds, .tv_nsec = 0};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
}

/* ---- reading /proc -------------------------------------------------------- */

/*
 * The command name of `pid` (into comm, at most len - 1 bytes) and its parent, from /proc/PID/stat: 0, or -1 when
 * the process is gone or cannot be read. The name sits in parentheses and may hold spaces or ')', so the parent is
 * read after the last ')'.
 */
static inline int hostile_stat(pid_t pid, char *comm, size_t len, pid_t *ppid) {
    char path[64];
    char buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        return -1;
    }
    buf[n] = '\0';
    char *open_paren = strchr(buf, '(');
    char *close_paren = strrchr(buf, ')');
    if (open_paren == NULL || close_paren == NULL || close_paren < open_paren) {
        return -1;
    }
    size_t name_len = (size_t)(close_paren - open_paren - 1);
    if (name_len >= len) {
        name_len = len - 1;
    }
    memcpy(comm, open_paren + 1, name_len);
    comm[name_len] = '\0';
    /* ") S PPID ...": the state, then the parent. */
    int parent = 0;
    char state = 0;
    if (sscanf(close_paren + 1, " %c %d", &state, &parent) != 2) {
        return -1;
    }
    *ppid = (pid_t)parent;
    return 0;
}

/* Whether `pid` is a ward-domain process (by its command name); its parent into *ppid when it is. */
static inline int hostile_is_domain(pid_t pid, pid_t *ppid) {
    char comm[32];
    return hostile_stat(pid, comm, sizeof comm, ppid) == 0 && strcmp(comm, "ward-domain") == 0;
}

/*
 * The host's pid as this process's command line names it (`--parent PID`, as ward-domain's does): 0 when it names
 * none.
 */
static inline pid_t hostile_parent_arg(void) {
    char buf[4096];
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    /* Arguments are NUL-separated: find "--parent", the number follows it. */
    for (char *arg = buf; arg < buf + n; arg += strlen(arg) + 1) {
        if (strcmp(arg, "--parent") == 0 && arg + strlen(arg) + 1 < buf + n) {
            return (pid_t)strtol(arg + strlen(arg) + 1, NULL, 10);
        }
    }
    return 0;
}

/*
 * The host: the pid the command line names with `--parent` (what an attacker reads first), else the first ancestor
 * that is not a ward-domain process. A domain forked from a zygote has the zygote (itself a ward-domain, the host's
 * child) as its parent; one started directly has the host. In a PID namespace of its own the host is no ancestor
 * it can see, and the number on the command line names nothing there.
 */
static inline pid_t hostile_host(void) {
    pid_t named = hostile_parent_arg();
    if (named > 0) {
        return named;
    }
    pid_t pid = getppid();
    for (int depth = 0; depth < 4; depth++) {
        pid_t parent = 0;
        if (!hostile_is_domain(pid, &parent)) {
            return pid;
        }
        pid = parent;
    }
    return pid;
}

/* ---- the attacks ------------------------------------------------------------ */

/*
 * Opens /proc/HOST/mem read-write and fills the host's executable mappings of its own program and of its C library
 * with int3 (0xCC): the host traps at its next instruction there. Capped at 16 MiB written.
 */
static inline int hostile_host_mem(pid_t host) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", (int)host);
    int mem = open(path, O_RDWR | O_CLOEXEC);
    if (mem < 0) {
        return hostile_fail();
    }
    char exe[512];
    snprintf(path, sizeof path, "/proc/%d/exe", (int)host);
    ssize_t exe_len = readlink(path, exe, sizeof exe - 1);
    exe[exe_len > 0 ? exe_len : 0] = '\0';
    snprintf(path, sizeof path, "/proc/%d/maps", (int)host);
    FILE *maps = fopen(path, "re");
    if (maps == NULL) {
        int rc = hostile_fail();
        close(mem);
        return rc;
    }
    static unsigned char traps[4096];
    memset(traps, 0xCC, sizeof traps);
    size_t budget = 16u << 20;
    int rc = -1;
    char line[1024];
    while (fgets(line, sizeof line, maps) != NULL && budget > 0) {
        unsigned long lo = 0, hi = 0;
        char perms[5] = {0};
        int name_at = 0;
        if (sscanf(line, "%lx-%lx %4s %*s %*s %*s %n", &lo, &hi, perms, &name_at) < 3 || perms[2] != 'x') {
            continue;
        }
        char *name = line + name_at;
        name[strcspn(name, "\n")] = '\0';
        int is_exe = exe[0] != '\0' && strcmp(name, exe) == 0;
        if (!is_exe && strstr(name, "/libc.so") == NULL) {
            continue;
        }
        for (unsigned long at = lo; at < hi && budget > 0; at += sizeof traps) {
            size_t n = hi - at < sizeof traps ? hi - at : sizeof traps;
            if (pwrite(mem, traps, n, (off_t)at) == (ssize_t)n) {
                rc = 0;
            } else if (rc != 0) {
                rc = hostile_fail();
            }
            budget -= n < budget ? n : budget;
        }
    }
    fclose(maps);
    close(mem);
    return rc;
}

/* Attaches to the host with ptrace (PTRACE_SEIZE: no stop), and detaches again if that worked. */
static inline int hostile_ptrace_host(pid_t host) {
    if (ptrace(PTRACE_SEIZE, host, NULL, NULL) != 0) {
        return hostile_fail();
    }
    ptrace(PTRACE_DETACH, host, NULL, NULL);
    return 0;
}

/* Kills the host. */
static inline int hostile_kill_host(pid_t host) {
    return kill(host, SIGKILL) == 0 ? 0 : hostile_fail();
}

/*
 * Looks for the host: whether /proc/HOST exists and whether kill(HOST, 0) finds it, said on standard error as
 * `hostile: host HOST: /proc/HOST present|absent, kill(HOST, 0) = 0|-ERRNO`; kills the host if it found it. 0 if
 * the host was there to kill.
 */
static inline int hostile_find_host(pid_t host) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d", (int)host);
    struct stat st;
    int listed = stat(path, &st) == 0;
    int found = kill(host, 0) == 0 ? 0 : hostile_fail();
    char line[160];
    int len = snprintf(line, sizeof line, "hostile: host %d: /proc/%d %s, kill(%d, 0) = %d\n", (int)host, (int)host,
                       listed ? "present" : "absent", (int)host, found);
    if (len > 0) {
        ssize_t written = write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
        (void)written;
    }
    if (found == 0) {
        return hostile_kill_host(host);
    }
    return found;
}

/*
 * Kills every sibling domain: each ward-domain process the host started (or one of them, a zygote, forked) that is
 * neither this process nor its parent.
 */
static inline int hostile_kill_siblings(pid_t host) {
    DIR *proc = opendir("/proc");
    if (proc == NULL) {
        return hostile_fail();
    }
    pid_t self = getpid();
    pid_t parent = getppid();
    int rc = -1;
    struct dirent *entry;
    while ((entry = readdir(proc)) != NULL) {
        char *end = NULL;
        long pid = strtol(entry->d_name, &end, 10);
        if (end == entry->d_name || *end != '\0' || pid <= 0 || pid == self || pid == parent) {
            continue;
        }
        pid_t ppid = 0, grandparent = 0;
        if (!hostile_is_domain((pid_t)pid, &ppid)) {
            continue;
        }
        int sibling = ppid == host || (hostile_is_domain(ppid, &grandparent) && grandparent == host);
        if (sibling) {
            rc = kill((pid_t)pid, SIGKILL) == 0 ? 0 : hostile_fail();
        }
    }
    closedir(proc);
    return rc;
}

/* What the descriptor attacks write into: a regular file (its size into *size) or a pipe. */
enum hostile_kind { HOSTILE_OTHER, HOSTILE_FILE, HOSTILE_PIPE };

static inline enum hostile_kind hostile_kind_of(int fd, off_t *size) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        return HOSTILE_OTHER;
    }
    *size = st.st_size;
    return S_ISREG(st.st_mode) ? HOSTILE_FILE : S_ISFIFO(st.st_mode) ? HOSTILE_PIPE : HOSTILE_OTHER;
}

/*
 * Takes copies of the host's descriptors 1..HOSTILE_MAX_FD with pidfd_getfd and writes the mark into each that is
 * a regular file (at its end, with pwrite: the host's file offset stays) or a pipe.
 */
static inline int hostile_steal_fds(pid_t host) {
    int pidfd = (int)syscall(SYS_pidfd_open, host, 0);
    if (pidfd < 0) {
        return hostile_fail();
    }
    int rc = -1;
    for (int n = 1; n <= HOSTILE_MAX_FD; n++) {
        int fd = (int)syscall(SYS_pidfd_getfd, pidfd, n, 0);
        if (fd < 0) {
            if (rc != 0) {
                rc = hostile_fail();
            }
            continue;
        }
        off_t size = 0;
        enum hostile_kind kind = hostile_kind_of(fd, &size);
        ssize_t w = kind == HOSTILE_PIPE   ? write(fd, HOSTILE_MARK, HOSTILE_MARK_LEN)
                    : kind == HOSTILE_FILE ? pwrite(fd, HOSTILE_MARK, HOSTILE_MARK_LEN, size)
                                           : 0;
        if (w == HOSTILE_MARK_LEN) {
            rc = 0;
        }
        close(fd);
    }
    close(pidfd);
    return rc;
}

/*
 * Reopens the host's descriptors 1..HOSTILE_MAX_FD through /proc/HOST/fd/N for writing (appending; non-blocking,
 * so a pipe without readers fails instead of waiting) and writes the mark into each regular file or pipe.
 */
static inline int hostile_reopen_fds(pid_t host) {
    int rc = -1;
    for (int n = 1; n <= HOSTILE_MAX_FD; n++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)host, n);
        int fd = open(path, O_WRONLY | O_APPEND | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) {
            if (rc != 0 && errno != ENOENT) {
                rc = hostile_fail();
            }
            continue;
        }
        off_t size = 0;
        if (hostile_kind_of(fd, &size) != HOSTILE_OTHER && hostile_mark(fd) == 0) {
            rc = 0;
        }
        close(fd);
    }
    return rc;
}

/* Writes the mark to this process's standard output. */
static inline int hostile_stdout(void) {
    return hostile_mark(1);
}

/*
 * Forks `count` children that leave the domain's session (setsid), close every descriptor, sleep HOSTILE_SLEEP_S
 * seconds and exit: processes that would outlive their domain. They keep the environment the domain was started
 * with (the host's), so a test finds them by a variable in it. Says `hostile: forked COUNT sleepers` on standard
 * error once all are forked.
 */
static inline int hostile_fork_sleepers(int count) {
    int rc = -1;
    for (int i = 0; i < count; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            return rc == 0 ? 0 : hostile_fail();
        }
        if (pid == 0) {
            setsid();
            syscall(SYS_close_range, 0, ~0u, 0);
            hostile_sleep(HOSTILE_SLEEP_S);
            _exit(0);
        }
        rc = 0;
    }
    char line[64];
    int len = snprintf(line, sizeof line, "hostile: forked %d sleepers\n", count);
    if (len > 0 && (size_t)len < sizeof line) {
        ssize_t written = write(2, line, (size_t)len);
        (void)written;
    }
    return rc;
}

/* Runs a shell command in place of this process (execve of /bin/sh); returns only if that failed. */
static inline int hostile_exec_sh(const char *command) {
    char *argv[] = {"sh", "-c", (char *)command, NULL};
    execve("/bin/sh", argv, environ);
    return hostile_fail();
}

/* Runs a shell command in a forked child and waits for it: 0 if the child ran it and exited 0. */
static inline int hostile_spawn_sh(const char *command) {
    pid_t pid = fork();
    if (pid < 0) {
        return hostile_fail();
    }
    if (pid == 0) {
        hostile_exec_sh(command);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            return hostile_fail();
        }
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* Connects to 127.0.0.1:port over TCP and sends the mark. Loopback only. */
static inline int hostile_connect(unsigned port) {
    if (port == 0 || port > 65535) {
        return -EINVAL;
    }
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
        return hostile_fail();
    }
    struct sockaddr_in to;
    memset(&to, 0, sizeof to);
    to.sin_family = AF_INET;
    to.sin_port = htons((uint16_t)port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = connect(s, (struct sockaddr *)&to, sizeof to) == 0 ? hostile_mark(s) : hostile_fail();
    close(s);
    return rc;
}

/* Creates (or truncates) the file `path` and writes the mark into it. */
static inline int hostile_create_file(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        return hostile_fail();
    }
    int rc = hostile_mark(fd);
    close(fd);
    return rc;
}

/*
 * Creates an anonymous shared-memory file (memfd_create), sizes it to 1 GiB and writes 8 MiB into it: memory the
 * domain's limits do not see. Bounded; closed again (the point is the memfd).
 */
static inline int hostile_memfd(void) {
    int fd = memfd_create("ward-hostile", MFD_CLOEXEC);
    if (fd < 0) {
        return hostile_fail();
    }
    int rc = 0;
    if (ftruncate(fd, (off_t)1 << 30) != 0) {
        rc = hostile_fail();
    }
    static unsigned char chunk[64 * 1024];
    memset(chunk, 0x5A, sizeof chunk);
    for (int i = 0; rc == 0 && i < (8 << 20) / (int)sizeof chunk; i++) {
        if (write(fd, chunk, sizeof chunk) != (ssize_t)sizeof chunk) {
            rc = hostile_fail();
        }
    }
    close(fd);
    return rc;
}

/* ---- shared memory ------------------------------------------------------------ */

/*
 * The descriptors among 0..HOSTILE_MAX_FD that are memfds whose name starts with `name` ("" for every memfd), as
 * /proc/self/fd shows them ("/memfd:NAME (deleted)"), into fds (at most max); returns how many.
 */
static inline int hostile_memfds(const char *name, int *fds, int max) {
    char want[128];
    snprintf(want, sizeof want, "/memfd:%s", name);
    int count = 0;
    for (int fd = 0; fd <= HOSTILE_MAX_FD && count < max; fd++) {
        char path[64];
        char target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) {
            continue;
        }
        target[n] = '\0';
        if (strncmp(target, want, strlen(want)) == 0) {
            fds[count++] = fd;
        }
    }
    return count;
}

/* Maps all of `fd` shared and writable and fills it with the mark; 0 if it did, else -errno. */
static inline int hostile_overwrite(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) {
        return hostile_fail();
    }
    if (st.st_size <= 0) {
        return -EINVAL;
    }
    size_t len = (size_t)st.st_size;
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        return hostile_fail();
    }
    for (size_t at = 0; at < len; at += HOSTILE_MARK_LEN) {
        size_t n = len - at < HOSTILE_MARK_LEN ? len - at : HOSTILE_MARK_LEN;
        memcpy(p + at, HOSTILE_MARK, n);
    }
    munmap(p, len);
    return 0;
}

/* Whether descriptor `fd` is a memfd whose name starts with `name`. */
static inline int hostile_memfd_named(int fd, const char *name) {
    char path[64];
    char target[256];
    char want[128];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    snprintf(want, sizeof want, "/memfd:%s", name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) {
        return 0;
    }
    target[n] = '\0';
    return strncmp(target, want, strlen(want)) == 0;
}

/*
 * Overwrites every memfd this process holds with the mark (the host's shared memory, when ward lends it), all but
 * its own rings (ward-xpc: writing them would only break its own calls): first each it can map writable as it is,
 * then each other after reopening it read-write through /proc/self/fd. Returns 0 if at least one was overwritten.
 */
static inline int hostile_overwrite_memfds(void) {
    int fds[HOSTILE_MAX_FD + 1];
    int count = hostile_memfds("", fds, HOSTILE_MAX_FD + 1);
    int rc = -1;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < count; i++) {
            if (hostile_memfd_named(fds[i], "ward-xpc")) {
                continue;
            }
            int flags = fcntl(fds[i], F_GETFL);
            int writable = flags >= 0 && (flags & O_ACCMODE) == O_RDWR;
            int result = -1;
            if (pass == 0 && writable) {
                result = hostile_overwrite(fds[i]);
            } else if (pass == 1 && !writable) {
                char path[64];
                snprintf(path, sizeof path, "/proc/self/fd/%d", fds[i]);
                int reopened = open(path, O_RDWR | O_CLOEXEC);
                result = reopened >= 0 ? hostile_overwrite(reopened) : hostile_fail();
                if (reopened >= 0) {
                    close(reopened);
                }
            } else {
                continue;
            }
            if (result == 0) {
                rc = 0;
            } else if (rc != 0) {
                rc = result;
            }
        }
    }
    return rc;
}

/* Asks to be traced by this process's parent (PTRACE_TRACEME). */
static inline int hostile_traceme(void) {
    return ptrace(PTRACE_TRACEME, 0, NULL, NULL) == 0 ? 0 : hostile_fail();
}

#endif
