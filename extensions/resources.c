/*
 * resources.c -- a generic extension that takes more of the machine than a domain's limits allow: what the domain's
 * cgroup and its check of the CPU used between calls must stop.
 *
 *   int64_t resources_anon(int64_t mib)    touch mib MiB of private anonymous memory, one page at a time
 *   int64_t resources_memfd(int64_t mib)   write mib MiB into a memfd (shared memory that no mapping shows)
 *   int64_t resources_shm(int64_t mib)     write mib MiB into a file in /dev/shm, unlinked at once
 *   int64_t resources_fork(int64_t n)      fork n children that wait (at most 30 s) for their parent to end
 *   int64_t resources_burn(void)           start a thread that spins forever, and return
 *   int64_t resources_ping(void)           return 42
 *
 * The memory functions return mib when they got it all (they keep what they took until the process ends), -errno
 * of the step that failed otherwise. resources_fork returns how many children it forked before the first fork
 * failed (the children stay until this process ends: a bounded sleep each, so a leak does not last).
 * resources_burn returns 0 once its thread runs, -errno if it could not start one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static const size_t MIB = 1u << 20;

EXPORT int64_t resources_anon(int64_t mib) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int64_t i = 0; i < mib; i++) {
        volatile char *block = malloc(MIB);
        if (block == NULL) {
            return -ENOMEM;
        }
        for (size_t at = 0; at < MIB; at += page) {
            block[at] = 1;
        }
    }
    return mib;
}

/* Write mib MiB into fd from the start; mib or -errno. */
static int64_t fill(int fd, int64_t mib) {
    static char chunk[1 << 20];
    memset(chunk, 0x5a, sizeof chunk);
    for (int64_t i = 0; i < mib; i++) {
        size_t done = 0;
        while (done < sizeof chunk) {
            ssize_t n = write(fd, chunk + done, sizeof chunk - done);
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return -errno;
            }
            done += (size_t)n;
        }
    }
    return mib;
}

EXPORT int64_t resources_memfd(int64_t mib) {
    int fd = memfd_create("ward-resources", MFD_CLOEXEC);
    if (fd < 0) {
        return -errno;
    }
    /* Kept open: the pages stay charged while the process lives. */
    return fill(fd, mib);
}

EXPORT int64_t resources_shm(int64_t mib) {
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/ward-resources-%d", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        return -errno;
    }
    /* Nothing is left in /dev/shm whatever happens next; the open descriptor keeps the pages. */
    unlink(path);
    return fill(fd, mib);
}

EXPORT int64_t resources_fork(int64_t n) {
    int64_t forked = 0;
    for (; forked < n; forked++) {
        pid_t pid = fork();
        if (pid < 0) {
            break;
        }
        if (pid == 0) {
            pid_t parent = getppid();
            for (int i = 0; i < 300 && getppid() == parent; i++) {
                usleep(100 * 1000);
            }
            _exit(0);
        }
    }
    return forked;
}

static void *spin(void *unused) {
    (void)unused;
    volatile uint64_t turns = 0;
    for (;;) {
        turns++;
    }
    return NULL;
}

EXPORT int64_t resources_burn(void) {
    pthread_t thread;
    int rc = pthread_create(&thread, NULL, spin, NULL);
    if (rc != 0) {
        return -rc;
    }
    pthread_detach(thread);
    return 0;
}

EXPORT int64_t resources_ping(void) {
    return 42;
}
