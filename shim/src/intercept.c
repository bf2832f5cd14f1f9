/*
 * How callers reach the driver, and how the shim gets in between:
 * - dlsym: callers that dlopen libcuda and look entry points up by name (cudart asks for
 *   cuGetProcAddress_v2 this way; ctypes and Triton ask for launches). Exact names only; the
 *   caller's own handle decides whether the symbol exists; calls from inside the driver pass
 *   through untouched (a driver that uses dlsym internally must get its own functions).
 *   RTLD_NEXT means "after the object that called dlsym": glibc reads that from its caller, which
 *   is now the shim, so the shim finds the next definition after its real caller itself.
 * - cuGetProcAddress / _v2: the CUDA runtime fetches every entry point through these. The real
 *   one is always called first with the same (symbol, version, flags); only then is the returned
 *   pointer recorded as the real function of that exact variant and replaced by the wrapper.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "hooks.h"
#include "log.h"

#define API __attribute__((visibility("default")))

static void *driver_base;

static int caller_is_driver(const void *return_address) {
    void *base = __atomic_load_n(&driver_base, __ATOMIC_ACQUIRE);
    if (base == NULL) {
        void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (handle == NULL) {
            return 0; /* not loaded yet: the caller cannot be inside it */
        }
        Dl_info info;
        void *probe = real_dlsym(handle, "cuInit");
        if (probe == NULL || dladdr(probe, &info) == 0) {
            return 0;
        }
        base = info.dli_fbase;
        __atomic_store_n(&driver_base, base, __ATOMIC_RELEASE);
    }
    Dl_info caller;
    return dladdr(return_address, &caller) != 0 && caller.dli_fbase == base;
}

static struct link_map *object_of(const void *address) {
    Dl_info info;
    struct link_map *map = NULL;
    if (dladdr1(address, &info, (void **)&map, RTLD_DL_LINKMAP) == 0) {
        return NULL;
    }
    return map;
}

/* dlsym(RTLD_NEXT, symbol) as seen from `caller`: the first definition in an object loaded after
 * the caller's (link-map order is the global search order). */
static void *next_after(const void *caller, const char *symbol) {
    struct link_map *own = object_of(caller);
    if (own == NULL) {
        return NULL;
    }
    for (struct link_map *map = own->l_next; map != NULL; map = map->l_next) {
        if (map->l_name == NULL || map->l_name[0] == '\0') {
            continue; /* the vDSO: nothing a caller looks up by name */
        }
        void *handle = dlopen(map->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (handle == NULL) {
            continue;
        }
        void *found = real_dlsym(handle, symbol);
        dlclose(handle);
        /* A handle also searches its object's dependencies: keep only a definition in the object
         * itself, so the walk finds each definition in load order. */
        if (found != NULL && object_of(found) == map) {
            return found;
        }
    }
    return NULL;
}

API void *dlsym(void *handle, const char *symbol) {
    void *found = handle == RTLD_NEXT ? next_after(__builtin_return_address(0), symbol) : real_dlsym(handle, symbol);
    if (found == NULL) {
        return NULL;
    }
    int id = hook_by_symbol(symbol);
    if (id < 0 || is_wrapper(found) || caller_is_driver(__builtin_return_address(0))) {
        return found;
    }
    record_real((enum hook_id)id, found);
    shim_log(LOG_DEBUG, "dlsym %s -> wrapper", symbol);
    return hooks[id].wrapper;
}

/* Which hook serves (symbol, version, flags), or -1 for symbols the shim leaves alone. */
static int hook_for_request(const char *symbol, int version, cuuint64_t flags) {
    int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    if (symbol == NULL || strncmp(symbol, "cu", 2) != 0) {
        return -1;
    }
    if (strcmp(symbol, "cuLaunchKernel") == 0) return ptds ? H_LAUNCH_KERNEL_PTSZ : H_LAUNCH_KERNEL;
    if (strcmp(symbol, "cuLaunchKernelEx") == 0) return ptds ? H_LAUNCH_KERNEL_EX_PTSZ : H_LAUNCH_KERNEL_EX;
    if (strcmp(symbol, "cuLaunchCooperativeKernel") == 0)
        return ptds ? H_LAUNCH_COOPERATIVE_PTSZ : H_LAUNCH_COOPERATIVE;
    if (strcmp(symbol, "cuGraphLaunch") == 0) return ptds ? H_GRAPH_LAUNCH_PTSZ : H_GRAPH_LAUNCH;
    if (strcmp(symbol, "cuStreamBeginCapture") == 0) {
        if (version >= 10010) return ptds ? H_BEGIN_CAPTURE_V2_PTSZ : H_BEGIN_CAPTURE_V2;
        return ptds ? H_BEGIN_CAPTURE_PTSZ : H_BEGIN_CAPTURE;
    }
    if (strcmp(symbol, "cuStreamEndCapture") == 0) return ptds ? H_END_CAPTURE_PTSZ : H_END_CAPTURE;
    if (strcmp(symbol, "cuGraphInstantiateWithFlags") == 0) return H_GRAPH_INSTANTIATE_WITH_FLAGS;
    if (strcmp(symbol, "cuGraphInstantiate") == 0 && version >= 12000) return H_GRAPH_INSTANTIATE_WITH_FLAGS;
    if (strcmp(symbol, "cuGraphInstantiateWithParams") == 0)
        return ptds ? H_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ : H_GRAPH_INSTANTIATE_WITH_PARAMS;
    if (strcmp(symbol, "cuGraphExecUpdate") == 0 && version >= 12000) return H_GRAPH_EXEC_UPDATE_V2;
    if (strcmp(symbol, "cuMemAlloc") == 0 && version >= 3020) return H_MEM_ALLOC_V2;
    if (strcmp(symbol, "cuMemAllocPitch") == 0 && version >= 3020) return H_MEM_ALLOC_PITCH_V2;
    if (strcmp(symbol, "cuMemFree") == 0 && version >= 3020) return H_MEM_FREE_V2;
    if (strcmp(symbol, "cuMemGetInfo") == 0 && version >= 3020) return H_MEM_GET_INFO_V2;
    if (strcmp(symbol, "cuMemAllocManaged") == 0) return H_MEM_ALLOC_MANAGED;
    if (strcmp(symbol, "cuMemAllocAsync") == 0) return ptds ? H_MEM_ALLOC_ASYNC_PTSZ : H_MEM_ALLOC_ASYNC;
    if (strcmp(symbol, "cuMemFreeAsync") == 0) return ptds ? H_MEM_FREE_ASYNC_PTSZ : H_MEM_FREE_ASYNC;
    if (strcmp(symbol, "cuMemCreate") == 0) return H_MEM_CREATE;
    if (strcmp(symbol, "cuMemRelease") == 0) return H_MEM_RELEASE;
    if (strcmp(symbol, "cuMemAllocFromPoolAsync") == 0)
        return ptds ? H_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ : H_MEM_ALLOC_FROM_POOL_ASYNC;
    if (strcmp(symbol, "cuMemPoolSetAttribute") == 0) return H_MEM_POOL_SET_ATTRIBUTE;
    if (strcmp(symbol, "cuGetProcAddress") == 0) return version >= 12000 ? H_GET_PROC_ADDRESS_V2 : H_GET_PROC_ADDRESS;
    return -1;
}

static void wrap_result(const char *symbol, int version, cuuint64_t flags, void **pfn) {
    if (pfn == NULL || *pfn == NULL) {
        return;
    }
    int id = hook_for_request(symbol, version, flags);
    if (id < 0 || is_wrapper(*pfn)) {
        return;
    }
    record_real((enum hook_id)id, *pfn);
    *pfn = hooks[id].wrapper;
    shim_log(LOG_DEBUG, "wrapped %s ver=%d flags=%llu", symbol, version, (unsigned long long)flags);
}

typedef CUresult (*gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    gpa_v1_fn real = (gpa_v1_fn)real_fn(H_GET_PROC_ADDRESS);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = real(symbol, pfn, version, flags);
    if (result == CUDA_SUCCESS) {
        wrap_result(symbol, version, flags, pfn);
    }
    return result;
}

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    gpa_v2_fn real = (gpa_v2_fn)real_fn(H_GET_PROC_ADDRESS_V2);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = real(symbol, pfn, version, flags, status);
    if (result == CUDA_SUCCESS && (status == NULL || *status == CU_GET_PROC_ADDRESS_SUCCESS)) {
        wrap_result(symbol, version, flags, pfn);
    }
    return result;
}
