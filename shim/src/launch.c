/*
 * The launch gate: every kernel-launch entry point, legacy and per-thread-default-stream.
 * A launch costs its grid size in blocks (the fake driver's device time is proportional to it;
 * on a GPU it is a proxy that the manager's budgets are calibrated against). Launches that a
 * stream capture records are not charged; a graph replay is charged what its capture recorded.
 * A charged launch first waits for its tokens, then for its release (release.c: a batch
 * instance's work stays out of a latency request's way), and is tracked once the driver took it.
 */
#include <stdint.h>

#include "capture.h"
#include "gate.h"
#include "hooks.h"
#include "release.h"

#define API __attribute__((visibility("default")))

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*cooperative_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, CUstream, void **);
typedef CUresult (*graph_launch_fn)(CUgraphExec, CUstream);

static inline int64_t grid_cost(unsigned x, unsigned y, unsigned z) {
    int64_t blocks = (int64_t)x * (int64_t)y * (int64_t)z;
    return blocks > 0 ? blocks : 1;
}

static inline int per_thread_stream(enum hook_id id) {
    return id == H_LAUNCH_KERNEL_PTSZ || id == H_LAUNCH_KERNEL_EX_PTSZ || id == H_LAUNCH_COOPERATIVE_PTSZ ||
           id == H_GRAPH_LAUNCH_PTSZ;
}

/* Returns whether the launch was charged (a captured one is not: it does not run now). */
static inline int admit(CUstream stream, enum hook_id id, int64_t cost) {
    if (capture_absorbs(stream, cost)) {
        return 0;
    }
    gate_charge(cost);
    release_before(stream, per_thread_stream(id), cost);
    return 1;
}

static inline CUresult launched(CUresult result, int charged, CUstream stream, enum hook_id id, int64_t cost) {
    if (charged && result == CUDA_SUCCESS) {
        release_after(stream, per_thread_stream(id), cost);
    }
    return result;
}

static CUresult launch(enum hook_id id, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params, void **extra) {
    launch_fn real = (launch_fn)real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int64_t cost = grid_cost(gx, gy, gz);
    int charged = admit(stream, id, cost);
    return launched(real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra), charged, stream, id, cost);
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shared, CUstream stream, void **params, void **extra) {
    return launch(H_LAUNCH_KERNEL, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params,
                                 void **extra) {
    return launch(H_LAUNCH_KERNEL_PTSZ, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

static CUresult launch_ex(enum hook_id id, const CUlaunchConfig *config, CUfunction f, void **params,
                          void **extra) {
    launch_ex_fn real = (launch_ex_fn)real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (config == NULL) {
        return real(config, f, params, extra);
    }
    int64_t cost = grid_cost(config->gridDimX, config->gridDimY, config->gridDimZ);
    int charged = admit(config->hStream, id, cost);
    return launched(real(config, f, params, extra), charged, config->hStream, id, cost);
}

API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    return launch_ex(H_LAUNCH_KERNEL_EX, config, f, params, extra);
}

API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    return launch_ex(H_LAUNCH_KERNEL_EX_PTSZ, config, f, params, extra);
}

static CUresult cooperative(enum hook_id id, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params) {
    cooperative_fn real = (cooperative_fn)real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int64_t cost = grid_cost(gx, gy, gz);
    int charged = admit(stream, id, cost);
    return launched(real(f, gx, gy, gz, bx, by, bz, shared, stream, params), charged, stream, id, cost);
}

API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shared, CUstream stream,
                                       void **params) {
    return cooperative(H_LAUNCH_COOPERATIVE, f, gx, gy, gz, bx, by, bz, shared, stream, params);
}

API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shared, CUstream stream,
                                            void **params) {
    return cooperative(H_LAUNCH_COOPERATIVE_PTSZ, f, gx, gy, gz, bx, by, bz, shared, stream, params);
}

static CUresult graph_launch(enum hook_id id, CUgraphExec exec, CUstream stream) {
    graph_launch_fn real = (graph_launch_fn)real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int64_t cost = graph_exec_cost(exec);
    int charged = admit(stream, id, cost);
    return launched(real(exec, stream), charged, stream, id, cost);
}

API CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    return graph_launch(H_GRAPH_LAUNCH, exec, stream);
}

API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
    return graph_launch(H_GRAPH_LAUNCH_PTSZ, exec, stream);
}
