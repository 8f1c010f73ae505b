/*
 * threads.c -- a built-in test extension for several host threads in one domain at once: a function that waits
 * inside the domain until the host lets it go, one whose threads share the domain's heap and a mutex, and one
 * that crashes.
 *
 * Built with -fvisibility=hidden: only the functions marked THREADS_EXPORT are exported.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define THREADS_EXPORT __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t shared;

/* Tells the host it has arrived (arrived() returns to it at once), then waits in the domain, calling nothing,
 * until the host word *go is non-zero; returns that word. */
THREADS_EXPORT int64_t threads_wait(const volatile int64_t *go, int64_t (*arrived)(void)) {
    arrived();
    while (*go == 0)
        __builtin_ia32_pause();
    return *go;
}

/* Adds 1 to the shared count n times, each under the mutex and with an allocation of its own; returns the count
 * then, or -1 when an allocation failed. */
THREADS_EXPORT int64_t threads_count(int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        int64_t *cell = malloc(sizeof *cell);
        if (cell == NULL)
            return -1;
        pthread_mutex_lock(&lock);
        *cell = shared;
        shared = *cell + 1;
        pthread_mutex_unlock(&lock);
        free(cell);
    }
    pthread_mutex_lock(&lock);
    int64_t now = shared;
    pthread_mutex_unlock(&lock);
    return now;
}

/* Dereferences NULL. */
THREADS_EXPORT int64_t threads_crash(void) {
    volatile int64_t *nothing = NULL;
    return *nothing;
}
