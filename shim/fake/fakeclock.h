/*
 * The simulated device's clock, shared by every process of one fake GPU through the file named
 * by DILU_FAKE_CLOCK (mapped by the fake driver, read by the fake NVML library and by tests):
 * how the device schedules the work of different processes, what each process submitted and
 * got done, and each process's busy time (what NVML's per-process utilisation reports on a real
 * GPU). fakedevice.c says how the two scheduling models use it.
 */
#ifndef DILU_FAKE_CLOCK_H
#define DILU_FAKE_CLOCK_H

#include <stdint.h>

#define FAKE_CLOCK_PROCS 256
#define FAKE_CLOCK_MAGIC 0x4b434c46u /* "FLCK": the header below is initialised */

enum fake_sched { FAKE_SCHED_FIFO = 0, FAKE_SCHED_TIMESLICE = 1 };

struct fake_process_time {
    int32_t pid;       /* 0: free; claimed with a compare-and-swap */
    int32_t reserved;
    int64_t busy_ns;   /* device time of this process's kernels (queued: fifo; executed: timeslice) */
    int64_t queued_ns; /* work submitted so far (timeslice) */
    int64_t done_ns;   /* work executed so far (timeslice) */
    int64_t peak_outstanding_ns; /* most unfinished work right after a submit (fifo: until its end) */
    int64_t reserved2[3];
};

struct device_clock {
    uint32_t magic;          /* set last, by the first process to open the file */
    int32_t sched;           /* enum fake_sched, from the first opener's DILU_FAKE_SCHED */
    int64_t slice_ns;        /* timeslice length (DILU_FAKE_TIMESLICE_US) */
    int64_t busy_until_ns;   /* fifo: when the device's queue drains */
    int64_t busy_total_ns;
    int32_t lock;            /* timeslice: pid of the process advancing the simulation, 0 free */
    int32_t current;         /* timeslice: index of the process on the device, -1 none */
    int64_t advanced_ns;     /* timeslice: the simulation has run up to here */
    int64_t slice_started_ns;
    int32_t used;            /* entries ever claimed (a bound for scans) */
    int32_t reserved0;
    int64_t reserved[8];
    struct fake_process_time processes[FAKE_CLOCK_PROCS];
};

#endif
