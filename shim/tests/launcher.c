/*
 * A driver-API client that reaches launches the way the CUDA runtime does: dlopen libcuda,
 * dlsym("cuGetProcAddress_v2"), then cuGetProcAddress for everything else. Used by the
 * benchmarks and tests. Prints one JSON object.
 *
 *   launcher count N BLOCKS            N launches as fast as possible (ns per launch)
 *   launcher run SECONDS BLOCKS SYNC   launch for SECONDS, synchronising every SYNC launches
 *   launcher trace SECONDS BLOCKS MS   launch for SECONDS, printing (time, cumulative device ns) every MS
 */
#include <string.h>

#include "driver_client.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: launcher count N BLOCKS | run SECONDS BLOCKS SYNC | trace SECONDS BLOCKS MS\n");
        return 2;
    }
    gpa_fn gpa = NULL;
    void *driver = open_driver("launcher", &gpa);
    launch_fn launch = (launch_fn)driver_entry(gpa, "launcher", "cuLaunchKernel", 12000);
    sync_fn synchronize = (sync_fn)driver_entry(gpa, "launcher", "cuCtxSynchronize", 2000);
    volatile long long *device_ns = dlsym(driver, "dilu_fake_device_ns");
    CUfunction kernel = (CUfunction)"kernel";
    unsigned blocks = (unsigned)atoi(argv[3]);
    long long launches = 0;
    double started = now_s(), elapsed;
    if (strcmp(argv[1], "count") == 0) {
        long long n = atoll(argv[2]);
        for (long long i = 0; i < n; i++) {
            launch(kernel, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        }
        launches = n;
        elapsed = now_s() - started;
    } else if (strcmp(argv[1], "trace") == 0) {
        double seconds = atof(argv[2]), tick = atof(argv[4]) / 1000.0;
        double next_sample = started;
        while (now_s() - started < seconds) {
            launch(kernel, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            launches++;
            double now = now_s();
            if (now >= next_sample) {
                printf("{\"t\": %.6f, \"device_ns\": %lld}\n", now, device_ns ? *device_ns : 0LL);
                next_sample = now + tick;
            }
        }
        elapsed = now_s() - started;
    } else {
        double seconds = atof(argv[2]);
        long long sync_every = argc > 4 ? atoll(argv[4]) : 0;
        while (now_s() - started < seconds) {
            launch(kernel, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
            launches++;
            if (sync_every > 0 && launches % sync_every == 0) {
                synchronize();
            }
        }
        elapsed = now_s() - started;
    }
    printf("{\"launches\": %lld, \"seconds\": %.6f, \"ns_per_launch\": %.2f, \"device_ns\": %lld}\n", launches,
           elapsed, elapsed * 1e9 / (double)(launches ? launches : 1), device_ns ? *device_ns : -1LL);
    return 0;
}
