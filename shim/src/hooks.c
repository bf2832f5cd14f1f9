/* The hook table, real-symbol resolution, and the one-time initialisation. */
#define _GNU_SOURCE
#include "hooks.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "config.h"
#include "gate.h"
#include "log.h"

/* Wrappers are defined in launch.c, capture.c, memory.c and intercept.c, declared by cuda.h. */

#define HOOK(id, name) [id] = {#name, (void *)name, NULL}
struct hook hooks[H_COUNT] = {
    HOOK(H_LAUNCH_KERNEL, cuLaunchKernel),
    HOOK(H_LAUNCH_KERNEL_PTSZ, cuLaunchKernel_ptsz),
    HOOK(H_LAUNCH_KERNEL_EX, cuLaunchKernelEx),
    HOOK(H_LAUNCH_KERNEL_EX_PTSZ, cuLaunchKernelEx_ptsz),
    HOOK(H_LAUNCH_COOPERATIVE, cuLaunchCooperativeKernel),
    HOOK(H_LAUNCH_COOPERATIVE_PTSZ, cuLaunchCooperativeKernel_ptsz),
    HOOK(H_GRAPH_LAUNCH, cuGraphLaunch),
    HOOK(H_GRAPH_LAUNCH_PTSZ, cuGraphLaunch_ptsz),
    HOOK(H_BEGIN_CAPTURE, cuStreamBeginCapture),
    HOOK(H_BEGIN_CAPTURE_PTSZ, cuStreamBeginCapture_ptsz),
    HOOK(H_BEGIN_CAPTURE_V2, cuStreamBeginCapture_v2),
    HOOK(H_BEGIN_CAPTURE_V2_PTSZ, cuStreamBeginCapture_v2_ptsz),
    HOOK(H_END_CAPTURE, cuStreamEndCapture),
    HOOK(H_END_CAPTURE_PTSZ, cuStreamEndCapture_ptsz),
    HOOK(H_GRAPH_INSTANTIATE_WITH_FLAGS, cuGraphInstantiateWithFlags),
    HOOK(H_GRAPH_INSTANTIATE_WITH_PARAMS, cuGraphInstantiateWithParams),
    HOOK(H_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ, cuGraphInstantiateWithParams_ptsz),
    HOOK(H_GRAPH_EXEC_UPDATE_V2, cuGraphExecUpdate_v2),
    HOOK(H_MEM_ALLOC_V2, cuMemAlloc_v2),
    HOOK(H_MEM_ALLOC_MANAGED, cuMemAllocManaged),
    HOOK(H_MEM_ALLOC_PITCH_V2, cuMemAllocPitch_v2),
    HOOK(H_MEM_ALLOC_ASYNC, cuMemAllocAsync),
    HOOK(H_MEM_ALLOC_ASYNC_PTSZ, cuMemAllocAsync_ptsz),
    HOOK(H_MEM_FREE_V2, cuMemFree_v2),
    HOOK(H_MEM_FREE_ASYNC, cuMemFreeAsync),
    HOOK(H_MEM_FREE_ASYNC_PTSZ, cuMemFreeAsync_ptsz),
    HOOK(H_MEM_GET_INFO_V2, cuMemGetInfo_v2),
    HOOK(H_MEM_CREATE, cuMemCreate),
    HOOK(H_MEM_RELEASE, cuMemRelease),
    HOOK(H_MEM_ALLOC_FROM_POOL_ASYNC, cuMemAllocFromPoolAsync),
    HOOK(H_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, cuMemAllocFromPoolAsync_ptsz),
    HOOK(H_MEM_POOL_SET_ATTRIBUTE, cuMemPoolSetAttribute),
    HOOK(H_GET_PROC_ADDRESS, cuGetProcAddress),
    HOOK(H_GET_PROC_ADDRESS_V2, cuGetProcAddress_v2),
};
#undef HOOK

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn glibc_dlsym;
static void *libcuda;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    config_load();
    /* dlvsym, not dlsym: our own dlsym must never be asked for the real one. */
    glibc_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (glibc_dlsym == NULL) {
        glibc_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    }
    if (glibc_dlsym == NULL) {
        glibc_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
    }
    gate_init();
}

void shim_init(void) {
    pthread_once(&once, init_once);
}

void *real_dlsym(void *handle, const char *symbol) {
    shim_init();
    return glibc_dlsym != NULL ? glibc_dlsym(handle, symbol) : NULL;
}

static void *driver_handle(void) {
    void *handle = __atomic_load_n(&libcuda, __ATOMIC_ACQUIRE);
    if (handle == NULL) {
        handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (handle == NULL) {
            handle = dlopen("libcuda.so.1", RTLD_NOW);
        }
        if (handle == NULL) {
            shim_log(LOG_ERROR, "cannot load libcuda.so.1: %s", dlerror());
            return NULL;
        }
        __atomic_store_n(&libcuda, handle, __ATOMIC_RELEASE);
    }
    return handle;
}

int is_wrapper(const void *fn) {
    for (int i = 0; i < H_COUNT; i++) {
        if (hooks[i].wrapper == fn) {
            return 1;
        }
    }
    return 0;
}

void record_real(enum hook_id id, void *fn) {
    if (fn != NULL && !is_wrapper(fn)) {
        __atomic_store_n(&hooks[id].real, fn, __ATOMIC_RELEASE);
    }
}

void *real_fn(enum hook_id id) {
    void *fn = __atomic_load_n(&hooks[id].real, __ATOMIC_ACQUIRE);
    if (fn != NULL) {
        return fn;
    }
    void *handle = driver_handle();
    if (handle == NULL) {
        return NULL;
    }
    record_real(id, real_dlsym(handle, hooks[id].symbol));
    return __atomic_load_n(&hooks[id].real, __ATOMIC_ACQUIRE);
}

void *driver_symbol(const char *symbol) {
    void *handle = driver_handle();
    return handle != NULL ? real_dlsym(handle, symbol) : NULL;
}

int hook_by_symbol(const char *symbol) {
    if (symbol == NULL || symbol[0] != 'c' || symbol[1] != 'u') {
        return -1;
    }
    for (int i = 0; i < H_COUNT; i++) {
        if (strcmp(hooks[i].symbol, symbol) == 0) {
            return i;
        }
    }
    return -1;
}

__attribute__((constructor)) static void shim_constructor(void) {
    /* Only the log level and pthread_atfork here: no CUDA, no sockets (see gate.c), and not the
     * instance's configuration, which may not be set yet (config.c). */
    shim_init();
}
