/*
 * The simulated device's clock, shared by every process of one fake GPU through the file named
 * by DILU_FAKE_CLOCK (mapped by the fake driver, read by the fake NVML library): when the
 * device is busy until, its total busy time, and each process's busy time (what NVML's
 * per-process utilisation reports on a real GPU).
 */
#ifndef DILU_FAKE_CLOCK_H
#define DILU_FAKE_CLOCK_H

#include <stdint.h>

#define FAKE_CLOCK_PROCS 256

struct fake_process_time {
    int32_t pid;       /* 0: free; claimed with a compare-and-swap */
    int32_t reserved;
    int64_t busy_ns;   /* device time of the kernels this process launched */
};

struct device_clock {
    int64_t busy_until_ns;
    int64_t busy_total_ns;
    struct fake_process_time processes[FAKE_CLOCK_PROCS];
};

#endif
