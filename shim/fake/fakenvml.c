/*
 * A fake libnvidia-ml.so.1 beside the fake driver: the calls Dilu's token manager makes
 * (through pynvml) to learn how much device time each process got. Per-process utilisation
 * comes from the simulated device's clock file (DILU_FAKE_CLOCK, see fakeclock.h): each call
 * reports, per process, the share of the time since this library's previous report that the
 * device spent on that process's kernels, in whole percent, as real NVML does.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fakeclock.h"

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
       NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_UNKNOWN = 999 };

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

static struct device_clock *clock_map;
static int64_t last_report_ns;
static struct { int32_t pid; int64_t busy_ns; } previous[FAKE_CLOCK_PROCS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int device_token;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    if (clock_map == NULL) {
        const char *path = getenv("DILU_FAKE_CLOCK");
        int fd = path != NULL && *path ? open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
        if (fd >= 0 && ftruncate(fd, sizeof(struct device_clock)) == 0) {
            void *shared = mmap(NULL, sizeof(struct device_clock), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            clock_map = shared != MAP_FAILED ? shared : NULL;
        }
        if (fd >= 0) close(fd);
        last_report_ns = now_ns();
    }
    pthread_mutex_unlock(&lock);
    return clock_map != NULL ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}
API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
    }
}
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 1;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (device == NULL || index != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &device_token;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (device == NULL || uuid == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &device_token;   /* one simulated device per clock file */
    return NVML_SUCCESS;
}

static int busy_entries(void) {
    int count = 0;
    for (int i = 0; i < FAKE_CLOCK_PROCS; i++) {
        count += __atomic_load_n(&clock_map->processes[i].pid, __ATOMIC_ACQUIRE) != 0;
    }
    return count;
}

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *samples,
                                                 unsigned int *count, unsigned long long last_seen) {
    (void)last_seen;
    if (clock_map == NULL) return NVML_ERROR_UNINITIALIZED;
    if (device != &device_token || count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    int wanted = busy_entries();
    if (wanted == 0) {
        pthread_mutex_unlock(&lock);
        *count = 0;
        return NVML_ERROR_NOT_FOUND;
    }
    if (samples == NULL || *count < (unsigned)wanted) {
        pthread_mutex_unlock(&lock);
        *count = (unsigned)wanted;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    int64_t now = now_ns(), span = now - last_report_ns;
    unsigned filled = 0;
    for (int i = 0; i < FAKE_CLOCK_PROCS && filled < *count; i++) {
        int32_t pid = __atomic_load_n(&clock_map->processes[i].pid, __ATOMIC_ACQUIRE);
        int64_t busy = __atomic_load_n(&clock_map->processes[i].busy_ns, __ATOMIC_ACQUIRE);
        if (pid == 0) continue;
        int64_t before = previous[i].pid == pid ? previous[i].busy_ns : 0;
        previous[i].pid = pid;
        previous[i].busy_ns = busy;
        int64_t used = busy - before;
        unsigned util = span > 0 && used > 0 ? (unsigned)((used * 100 + span / 2) / span) : 0;
        samples[filled++] = (nvmlProcessUtilizationSample_t){.pid = (unsigned)pid,
                                                            .timeStamp = (unsigned long long)(now / 1000),
                                                            .smUtil = util > 100 ? 100 : util};
    }
    last_report_ns = now;
    *count = filled;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}
