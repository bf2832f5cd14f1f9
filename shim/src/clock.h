/* The shim's one clock: CLOCK_MONOTONIC in nanoseconds (vDSO: no system call). */
#ifndef DILU_CLOCK_H
#define DILU_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t shim_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#endif
