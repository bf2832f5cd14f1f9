/*
 * A latency function and a training loop on the driver API, for bench/collocation.py: what an
 * instance server and a training job do to a GPU, without PyTorch. Reaches the driver the way
 * the CUDA runtime does (cuGetProcAddress), and brackets each request with the shim's request
 * API when the shim is preloaded, as Dilu's instance server does. Prints one JSON object.
 *
 *   collocate serve REQUESTS KERNELS BLOCKS closed GAP_US
 *       one request at a time: KERNELS kernels of BLOCKS blocks, synchronise, idle GAP_US
 *   collocate serve REQUESTS KERNELS BLOCKS bursty BURST PAUSE_MS SPACING_US
 *       bursts of BURST requests arriving SPACING_US apart on average (exponential, seeded),
 *       PAUSE_MS between bursts; served one at a time in arrival order; a request's latency
 *       runs from its arrival, and it counts as in flight from then on
 *   collocate train SECONDS KERNELS BLOCKS
 *       training steps of KERNELS kernels, each step synchronised (a loss read back); prints
 *       {"t", "steps"} every 50 ms (CLOCK_MONOTONIC seconds), so a caller can take the rate over
 *       any stretch of the run
 * Times printed ("t", "started", "ended") are CLOCK_MONOTONIC seconds, as Python's
 * time.monotonic() reads them.
 */
#define _GNU_SOURCE
#include <math.h>
#include <string.h>

#include "driver_client.h"

typedef void (*request_fn)(void);

static struct {
    launch_fn launch;
    sync_fn synchronize;
    request_fn begin, end;
} cu;

static void sleep_until(double at) {
    struct timespec ts = {.tv_sec = (time_t)at, .tv_nsec = (long)((at - (double)(time_t)at) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static void kernels(int count, unsigned blocks) {
    for (int i = 0; i < count; i++) {
        cu.launch((CUfunction) "kernel", blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
    }
}

static void begin_request(void) { if (cu.begin) cu.begin(); }
static void end_request(void) { if (cu.end) cu.end(); }

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(const double *sorted, int n, double q) {
    int index = (int)(q * n);
    return sorted[index < n ? index : n - 1];
}

static double exponential(unsigned *seed, double mean) {
    double u = ((double)rand_r(seed) + 1.0) / ((double)RAND_MAX + 2.0);
    return -mean * log(u);
}

static int serve(int argc, char **argv) {
    int requests = atoi(argv[2]), count = atoi(argv[3]);
    unsigned blocks = (unsigned)atoi(argv[4]);
    int bursty = strcmp(argv[5], "bursty") == 0;
    if (requests <= 0 || (bursty ? argc < 9 : argc < 7)) {
        fprintf(stderr, "collocate: serve REQUESTS KERNELS BLOCKS closed GAP_US | bursty BURST PAUSE_MS SPACING_US\n");
        return 2;
    }
    double *arrivals = calloc((size_t)requests, sizeof(double)), *latency = calloc((size_t)requests, sizeof(double));
    kernels(count, blocks);   /* warm-up request: registration happens here, not in a measured one */
    cu.synchronize();
    double started = now_s() + 0.01, busy = 0.0;
    if (bursty) {
        int burst = atoi(argv[6]);
        double pause = atof(argv[7]) / 1e3, spacing = atof(argv[8]) / 1e6, at = started;
        unsigned seed = 12345;
        for (int i = 0; i < requests; i++) {
            at += (i > 0 && i % burst == 0) ? pause : (i > 0 ? exponential(&seed, spacing) : 0.0);
            arrivals[i] = at;
        }
        int begun = 0;
        for (int i = 0; i < requests; i++) {
            if (now_s() < arrivals[i]) sleep_until(arrivals[i]);
            double serving = now_s();
            while (begun < requests && arrivals[begun] <= now_s()) {   /* arrived: in flight from now */
                begin_request();
                begun++;
            }
            kernels(count, blocks);
            cu.synchronize();
            double done = now_s();
            latency[i] = (done - arrivals[i]) * 1e3;
            busy += done - serving;
            end_request();
        }
    } else {
        double gap = atof(argv[6]) / 1e6;
        started = now_s();
        for (int i = 0; i < requests; i++) {
            double arrival = now_s();
            begin_request();
            kernels(count, blocks);
            cu.synchronize();
            double done = now_s();
            end_request();
            latency[i] = (done - arrival) * 1e3;
            busy += done - arrival;
            sleep_until(done + gap);
        }
    }
    double elapsed = now_s() - started;
    double mean = 0.0;
    for (int i = 0; i < requests; i++) mean += latency[i] / requests;
    qsort(latency, (size_t)requests, sizeof(double), compare);
    printf("{\"requests\": %d, \"p50_ms\": %.4f, \"p90_ms\": %.4f, \"p99_ms\": %.4f, \"max_ms\": %.4f, "
           "\"mean_ms\": %.4f, \"busy\": %.4f, \"started\": %.6f, \"ended\": %.6f, \"request_api\": %s}\n",
           requests, quantile(latency, requests, 0.5), quantile(latency, requests, 0.9),
           quantile(latency, requests, 0.99), latency[requests - 1], mean, busy / elapsed, started,
           started + elapsed, cu.begin ? "true" : "false");
    return 0;
}

static int train(char **argv) {
    double seconds = atof(argv[2]);
    int count = atoi(argv[3]);
    unsigned blocks = (unsigned)atoi(argv[4]);
    kernels(count, blocks);
    cu.synchronize();
    long long steps = 0;
    double started = now_s(), next_report = started;
    while (now_s() - started < seconds) {
        kernels(count, blocks);
        cu.synchronize();
        steps++;
        double now = now_s();
        if (now >= next_report) {
            printf("{\"t\": %.6f, \"steps\": %lld}\n", now, steps);
            next_report = now + 0.05;
        }
    }
    double elapsed = now_s() - started;
    printf("{\"steps\": %lld, \"seconds\": %.3f, \"per_s\": %.3f}\n", steps, elapsed, steps / elapsed);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5 || (strcmp(argv[1], "serve") == 0 && argc < 7)) {
        fprintf(stderr, "usage: collocate serve REQUESTS KERNELS BLOCKS closed GAP_US | "
                        "serve REQUESTS KERNELS BLOCKS bursty BURST PAUSE_MS SPACING_US | train SECONDS KERNELS BLOCKS\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);   /* progress lines survive a SIGTERM */
    gpa_fn gpa = NULL;
    open_driver("collocate", &gpa);
    cu.launch = (launch_fn)driver_entry(gpa, "collocate", "cuLaunchKernel", 12000);
    cu.synchronize = (sync_fn)driver_entry(gpa, "collocate", "cuCtxSynchronize", 2000);
    cu.begin = (request_fn)dlsym(RTLD_DEFAULT, "dilu_request_begin");   /* the shim's, when preloaded */
    cu.end = (request_fn)dlsym(RTLD_DEFAULT, "dilu_request_end");
    return strcmp(argv[1], "serve") == 0 ? serve(argc, argv) : train(argv);
}
