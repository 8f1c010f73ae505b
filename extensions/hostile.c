/*
 * hostile.c -- a generic extension that attacks the machine it runs on, not the process that calls it: what a
 * process domain's sandbox must refuse to any extension.
 *
 *   int64_t hostile_attack(int64_t n)
 *
 * The low 8 bits of n select the attack, the bits above them are its argument:
 *   1  exec /bin/sh in place of this process (it runs `exit 0`)
 *   2  connect to 127.0.0.1:ARG over TCP and send "PWNED" (loopback only)
 *   3  fork a child that exits at once, and wait for it
 *   4  memfd_create, ftruncate to 1 GiB, write 8 MiB (closed again)
 *   5  create /tmp/ward-hostile-ARG-lib and write "PWNED" into it
 *   6  ptrace(PTRACE_TRACEME): ask to be traced by the parent
 *   7  kill(ARG, 0): whether process ARG (the caller's pid, say) can be signalled from here
 *   8  stat /proc/ARG: whether process ARG is listed in this process's /proc
 *   9  not an attack: the pid /proc/self/stat gives, if it is this process's getpid() (else -1)
 *  10  overwrite every memfd it holds but its rings with "PWNED", mapped shared and writable (those with a
 *      read-only descriptor reopened read-write through /proc/self/fd)
 * Returns 0 when the attack got through, -errno of the step that failed otherwise (and -EINVAL for an unknown
 * attack).
 *
 *   int64_t hostile_arena(const unsigned char *buf, int64_t len)
 *
 * Looks for the host's arena blocks among its descriptors (memfds named ward-arena) and overwrites, with "PWNED",
 * every one it can map shared and writable as it is; `buf` is whatever the host lends it. Returns the number found
 * times 256 plus the number overwritten.
 *
 * Built with -fvisibility=hidden: only hostile_attack and hostile_arena are exported.
 */
#define _GNU_SOURCE
#include <stdint.h>

#include "hostile_common.h"

#define HOSTILE_EXPORT __attribute__((visibility("default")))

/* The pid in /proc/self/stat if it is getpid(), else -1: /proc shows this process's own PID namespace. */
static int64_t proc_self(void) {
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return hostile_fail();
    }
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        return -1;
    }
    buf[n] = '\0';
    long pid = strtol(buf, NULL, 10);
    return pid == (long)getpid() ? pid : -1;
}

/* Forks a child that exits at once; 0 if it did. */
static int fork_and_reap(void) {
    pid_t pid = fork();
    if (pid < 0) {
        return hostile_fail();
    }
    if (pid == 0) {
        _exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            return hostile_fail();
        }
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

HOSTILE_EXPORT int64_t hostile_attack(int64_t n) {
    int64_t arg = n >> 8;
    switch (n & 0xff) {
    case 1:
        return hostile_exec_sh("exit 0");
    case 2:
        return arg > 0 && arg <= 65535 ? hostile_connect((unsigned)arg) : -EINVAL;
    case 3:
        return fork_and_reap();
    case 4:
        return hostile_memfd();
    case 5: {
        char path[96];
        snprintf(path, sizeof path, "/tmp/ward-hostile-%lld-lib", (long long)arg);
        return hostile_create_file(path);
    }
    case 6:
        return hostile_traceme();
    case 7:
        return kill((pid_t)arg, 0) == 0 ? 0 : hostile_fail();
    case 8: {
        char path[64];
        struct stat st;
        snprintf(path, sizeof path, "/proc/%lld", (long long)arg);
        return stat(path, &st) == 0 ? 0 : hostile_fail();
    }
    case 9:
        return proc_self();
    case 10:
        return hostile_overwrite_memfds();
    default:
        return -EINVAL;
    }
}

HOSTILE_EXPORT int64_t hostile_arena(const unsigned char *buf, int64_t len) {
    (void)buf;
    (void)len;
    int fds[HOSTILE_MAX_FD + 1];
    int found = hostile_memfds("ward-arena", fds, HOSTILE_MAX_FD + 1);
    int overwritten = 0;
    for (int i = 0; i < found; i++) {
        overwritten += hostile_overwrite(fds[i]) == 0;
    }
    return (int64_t)found * 256 + overwritten;
}
