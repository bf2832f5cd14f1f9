/*
 * The table of intercepted driver entry points, indexed by enum hook_id.
 * Each entry names the exported symbol, points at the shim's wrapper, and holds the real
 * driver function for that exact variant (legacy or _ptsz), filled from what the driver itself
 * returned (cuGetProcAddress or dlsym on libcuda), never guessed.
 */
#ifndef DILU_HOOKS_H
#define DILU_HOOKS_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

enum hook_id {
    H_LAUNCH_KERNEL,
    H_LAUNCH_KERNEL_PTSZ,
    H_LAUNCH_KERNEL_EX,
    H_LAUNCH_KERNEL_EX_PTSZ,
    H_LAUNCH_COOPERATIVE,
    H_LAUNCH_COOPERATIVE_PTSZ,
    H_GRAPH_LAUNCH,
    H_GRAPH_LAUNCH_PTSZ,
    H_BEGIN_CAPTURE,
    H_BEGIN_CAPTURE_PTSZ,
    H_BEGIN_CAPTURE_V2,
    H_BEGIN_CAPTURE_V2_PTSZ,
    H_END_CAPTURE,
    H_END_CAPTURE_PTSZ,
    H_GRAPH_INSTANTIATE_WITH_FLAGS,
    H_GRAPH_INSTANTIATE_WITH_PARAMS,
    H_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
    H_GRAPH_EXEC_UPDATE_V2,
    H_MEM_ALLOC_V2,
    H_MEM_ALLOC_MANAGED,
    H_MEM_ALLOC_PITCH_V2,
    H_MEM_ALLOC_ASYNC,
    H_MEM_ALLOC_ASYNC_PTSZ,
    H_MEM_FREE_V2,
    H_MEM_FREE_ASYNC,
    H_MEM_FREE_ASYNC_PTSZ,
    H_MEM_GET_INFO_V2,
    H_MEM_CREATE,
    H_MEM_RELEASE,
    H_MEM_ALLOC_FROM_POOL_ASYNC,
    H_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
    H_MEM_POOL_SET_ATTRIBUTE,
    H_GET_PROC_ADDRESS,
    H_GET_PROC_ADDRESS_V2,
    H_COUNT
};

struct hook {
    const char *symbol;
    void *wrapper;
    void *volatile real;
};

extern struct hook hooks[H_COUNT];

/* Runs the one-time initialisation (idempotent, thread-safe). */
void shim_init(void);

/* The real function for a hook, resolved from libcuda on first use; NULL if the driver lacks it. */
void *real_fn(enum hook_id id);

/* The glibc dlsym, never the shim's. */
void *real_dlsym(void *handle, const char *symbol);

/* Any symbol of the real driver (for calls the shim makes itself); NULL if missing. */
void *driver_symbol(const char *symbol);

/* The hook for an exact exported symbol name, or -1. */
int hook_by_symbol(const char *symbol);

/* Is this address one of the shim's wrappers? */
int is_wrapper(const void *fn);

/* Records the real function of a hook unless it is one of the shim's own wrappers. */
void record_real(enum hook_id id, void *fn);

#endif
