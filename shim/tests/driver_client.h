/*
 * What the test clients share: reaching the driver the way the CUDA runtime does (dlopen
 * libcuda, dlsym("cuGetProcAddress_v2"), then cuGetProcAddress for everything else), and a clock.
 */
#ifndef DILU_DRIVER_CLIENT_H
#define DILU_DRIVER_CLIENT_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*init_fn)(unsigned);

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* libcuda's handle and its cuGetProcAddress_v2, the driver initialised; exits 2 on failure. */
static inline void *open_driver(const char *client, gpa_fn *gpa) {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (driver == NULL) {
        fprintf(stderr, "%s: %s\n", client, dlerror());
        exit(2);
    }
    *gpa = (gpa_fn)dlsym(driver, "cuGetProcAddress_v2");
    void *init = NULL;
    CUdriverProcAddressQueryResult status;
    if (*gpa == NULL || (*gpa)("cuInit", &init, 2000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != CUDA_SUCCESS ||
        init == NULL || ((init_fn)init)(0) != CUDA_SUCCESS) {
        fprintf(stderr, "%s: the driver did not initialise\n", client);
        exit(2);
    }
    return driver;
}

/* A driver entry point by name and version, as the runtime asks for it; exits 2 if missing. */
static inline void *driver_entry(gpa_fn gpa, const char *client, const char *name, int version) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult status;
    if (gpa(name, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != CUDA_SUCCESS || fn == NULL) {
        fprintf(stderr, "%s: %s not available\n", client, name);
        exit(2);
    }
    return fn;
}

#endif
