/*
 * A caller linked against libcuda directly (-lcuda), as Triton's launchers are: its launches go
 * through the PLT to whichever cuLaunchKernel the dynamic linker bound, the shim's when preloaded.
 *   pltclient SECONDS BLOCKS
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern volatile long long dilu_fake_device_ns;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: pltclient SECONDS BLOCKS\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    unsigned blocks = (unsigned)atoi(argv[2]);
    cuInit(0);
    long long launches = 0;
    double started = now_s();
    while (now_s() - started < seconds) {
        if (cuLaunchKernel((CUfunction)"k", blocks, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
            return 1;
        }
        launches++;
    }
    double elapsed = now_s() - started;
    printf("{\"launches\": %lld, \"seconds\": %.6f, \"share\": %.5f}\n", launches, elapsed,
           (double)dilu_fake_device_ns / (elapsed * 1e9));
    return 0;
}
