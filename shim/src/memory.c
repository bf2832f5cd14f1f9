/*
 * The memory slice: allocations beyond DILU_MEMORY_LIMIT fail with CUDA_ERROR_OUT_OF_MEMORY,
 * and cuMemGetInfo reports the slice (total = limit, free = what is left of it, never more
 * than the device really has free). Sizes are remembered per pointer so frees give bytes back.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "config.h"
#include "gate.h"
#include "hooks.h"
#include "log.h"

#define API __attribute__((visibility("default")))
#define BUCKETS 4096

struct allocation {
    CUdeviceptr ptr;
    int64_t size;
    struct allocation *next;
};

static struct allocation *buckets[BUCKETS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t used;

static size_t bucket_of(CUdeviceptr ptr) {
    return (size_t)((ptr >> 8) ^ (ptr >> 20)) % BUCKETS;
}

static void reset_in_child(void) {
    /* A forked child owns none of its parent's device memory. */
    pthread_mutex_init(&lock, NULL);
    for (size_t i = 0; i < BUCKETS; i++) {
        buckets[i] = NULL; /* the parent's nodes leak in the child; they are few and never freed */
    }
    used = 0;
}

__attribute__((constructor)) static void memory_init(void) {
    pthread_atfork(NULL, NULL, reset_in_child);
}

static int limited(void) {
    return shim_cfg.memory_limit > 0 && !shim_cfg.disabled;
}

/* Reserves `size` bytes of the slice; 0 if that would exceed it. */
static int reserve(int64_t size) {
    if (!limited()) {
        return 1;
    }
    int64_t after = __atomic_add_fetch(&used, size, __ATOMIC_ACQ_REL);
    if (after > shim_cfg.memory_limit) {
        __atomic_sub_fetch(&used, size, __ATOMIC_ACQ_REL);
        shim_log(LOG_INFO, "allocation of %lld bytes refused: slice is %lld bytes, %lld in use",
                 (long long)size, (long long)shim_cfg.memory_limit, (long long)(after - size));
        return 0;
    }
    return 1;
}

static void unreserve(int64_t size) {
    if (limited()) {
        __atomic_sub_fetch(&used, size, __ATOMIC_ACQ_REL);
    }
}

static void remember(CUdeviceptr ptr, int64_t size) {
    struct allocation *entry = malloc(sizeof(*entry));
    if (entry == NULL) {
        return;
    }
    entry->ptr = ptr;
    entry->size = size;
    pthread_mutex_lock(&lock);
    size_t bucket = bucket_of(ptr);
    entry->next = buckets[bucket];
    buckets[bucket] = entry;
    pthread_mutex_unlock(&lock);
    gate_note_memory(size);
}

static int64_t forget(CUdeviceptr ptr) {
    int64_t size = 0;
    pthread_mutex_lock(&lock);
    for (struct allocation **link = &buckets[bucket_of(ptr)]; *link != NULL; link = &(*link)->next) {
        if ((*link)->ptr == ptr) {
            struct allocation *entry = *link;
            *link = entry->next;
            size = entry->size;
            free(entry);
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    gate_note_memory(-size);
    return size;
}

static CUresult allocated(CUresult result, CUdeviceptr *ptr, int64_t reserved, int64_t actual) {
    if (result != CUDA_SUCCESS || ptr == NULL) {
        unreserve(reserved);
        return result;
    }
    if (actual != reserved) {
        unreserve(reserved);
        if (!reserve(actual)) {
            /* Pitch padding pushed it over: the slice still holds. */
            CUresult (*real_free)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))real_fn(H_MEM_FREE_V2);
            if (real_free != NULL) {
                real_free(*ptr);
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    remember(*ptr, actual);
    return result;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    CUresult (*real)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))real_fn(H_MEM_ALLOC_V2);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!reserve((int64_t)size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return allocated(real(ptr, size), ptr, (int64_t)size, (int64_t)size);
}

API CUresult cuMemAllocManaged(CUdeviceptr *ptr, size_t size, unsigned int flags) {
    CUresult (*real)(CUdeviceptr *, size_t, unsigned) =
        (CUresult(*)(CUdeviceptr *, size_t, unsigned))real_fn(H_MEM_ALLOC_MANAGED);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!reserve((int64_t)size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return allocated(real(ptr, size, flags), ptr, (int64_t)size, (int64_t)size);
}

API CUresult cuMemAllocPitch_v2(CUdeviceptr *ptr, size_t *pitch, size_t width, size_t height,
                                unsigned int element_size) {
    CUresult (*real)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) =
        (CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))real_fn(H_MEM_ALLOC_PITCH_V2);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int64_t wanted = (int64_t)width * (int64_t)height;
    if (!reserve(wanted)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult result = real(ptr, pitch, width, height, element_size);
    int64_t actual = (result == CUDA_SUCCESS && pitch != NULL) ? (int64_t)*pitch * (int64_t)height : wanted;
    return allocated(result, ptr, wanted, actual);
}

static CUresult alloc_async(enum hook_id id, CUdeviceptr *ptr, size_t size, CUstream stream) {
    CUresult (*real)(CUdeviceptr *, size_t, CUstream) = (CUresult(*)(CUdeviceptr *, size_t, CUstream))real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!reserve((int64_t)size)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return allocated(real(ptr, size, stream), ptr, (int64_t)size, (int64_t)size);
}

API CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t size, CUstream stream) {
    return alloc_async(H_MEM_ALLOC_ASYNC, ptr, size, stream);
}

API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *ptr, size_t size, CUstream stream) {
    return alloc_async(H_MEM_ALLOC_ASYNC_PTSZ, ptr, size, stream);
}

API CUresult cuMemFree_v2(CUdeviceptr ptr) {
    CUresult (*real)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))real_fn(H_MEM_FREE_V2);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = real(ptr);
    if (result == CUDA_SUCCESS) {
        unreserve(forget(ptr));
    }
    return result;
}

static CUresult free_async(enum hook_id id, CUdeviceptr ptr, CUstream stream) {
    CUresult (*real)(CUdeviceptr, CUstream) = (CUresult(*)(CUdeviceptr, CUstream))real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = real(ptr, stream);
    if (result == CUDA_SUCCESS) {
        unreserve(forget(ptr));
    }
    return result;
}

API CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) {
    return free_async(H_MEM_FREE_ASYNC, ptr, stream);
}

API CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream stream) {
    return free_async(H_MEM_FREE_ASYNC_PTSZ, ptr, stream);
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    CUresult (*real)(size_t *, size_t *) = (CUresult(*)(size_t *, size_t *))real_fn(H_MEM_GET_INFO_V2);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = real(free_bytes, total_bytes);
    if (result != CUDA_SUCCESS || !limited()) {
        return result;
    }
    int64_t left = shim_cfg.memory_limit - __atomic_load_n(&used, __ATOMIC_ACQUIRE);
    if (left < 0) {
        left = 0;
    }
    if (free_bytes != NULL && (int64_t)*free_bytes > left) {
        *free_bytes = (size_t)left;
    }
    if (total_bytes != NULL) {
        *total_bytes = (size_t)shim_cfg.memory_limit;
    }
    return result;
}
