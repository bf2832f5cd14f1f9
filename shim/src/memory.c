/*
 * The memory slice: allocations beyond DILU_MEMORY_LIMIT fail with CUDA_ERROR_OUT_OF_MEMORY,
 * and cuMemGetInfo reports the slice (total = limit, free = what is left of it, never more
 * than the device really has free). The slice is the instance's: while registered with the
 * token manager, bytes are counted in the instance's shared counter, so its processes together
 * stay within it and an exited process's bytes go back. Without a manager each process counts
 * its own. Sizes are remembered per pointer (with where they were counted) so frees give bytes
 * back.
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
    uint32_t counted;     /* GATE_MEMORY_LOCAL, or the registration epoch of the shared counter */
    struct allocation *next;
};

/* Device pointers (cuMemAlloc*, pools) and physical allocations of the virtual memory API
 * (cuMemCreate handles) are remembered apart: both are 64-bit values and could coincide. */
static struct allocation *pointers[BUCKETS], *handles[BUCKETS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t used; /* bytes counted locally (no manager) */

static size_t bucket_of(CUdeviceptr ptr) {
    return (size_t)((ptr >> 8) ^ (ptr >> 20)) % BUCKETS;
}

static void reset_in_child(void) {
    /* A forked child owns none of its parent's device memory. */
    pthread_mutex_init(&lock, NULL);
    for (size_t i = 0; i < BUCKETS; i++) {
        pointers[i] = handles[i] = NULL; /* the parent's nodes leak in the child; few, never freed */
    }
    used = 0;
}

__attribute__((constructor)) static void memory_init(void) {
    pthread_atfork(NULL, NULL, reset_in_child);
}

static int limited(void) {
    config_settle();
    return shim_cfg.memory_limit > 0 && !shim_cfg.disabled;
}

/* Reserves `size` bytes of the slice: GATE_MEMORY_REFUSED if that would exceed it, else where
 * they were counted (to hand back to unreserve). */
static uint32_t reserve(int64_t size) {
    int64_t limit = limited() ? shim_cfg.memory_limit : 0;
    uint32_t counted = shim_cfg.disabled ? GATE_MEMORY_LOCAL : gate_memory_reserve(size, limit);
    if (counted != GATE_MEMORY_LOCAL) {
        return counted;
    }
    int64_t after = __atomic_add_fetch(&used, size, __ATOMIC_ACQ_REL);
    if (limit > 0 && after > limit) {
        __atomic_sub_fetch(&used, size, __ATOMIC_ACQ_REL);
        shim_log(LOG_INFO, "allocation of %lld bytes refused: slice is %lld bytes, %lld in use",
                 (long long)size, (long long)limit, (long long)(after - size));
        return GATE_MEMORY_REFUSED;
    }
    return GATE_MEMORY_LOCAL;
}

static void unreserve(int64_t size, uint32_t counted) {
    if (counted == GATE_MEMORY_LOCAL) {
        __atomic_sub_fetch(&used, size, __ATOMIC_ACQ_REL);
    } else if (counted != GATE_MEMORY_REFUSED) {
        gate_memory_release(size, counted);
    }
}

static void remember(struct allocation **buckets, CUdeviceptr ptr, int64_t size, uint32_t counted) {
    struct allocation *entry = malloc(sizeof(*entry));
    if (entry == NULL) {
        return;
    }
    entry->ptr = ptr;
    entry->size = size;
    entry->counted = counted;
    pthread_mutex_lock(&lock);
    size_t bucket = bucket_of(ptr);
    entry->next = buckets[bucket];
    buckets[bucket] = entry;
    pthread_mutex_unlock(&lock);
}

/* Forgets an allocation and gives its bytes back to where they were counted. */
static void forget(struct allocation **buckets, CUdeviceptr ptr) {
    int64_t size = 0;
    uint32_t counted = GATE_MEMORY_REFUSED;
    pthread_mutex_lock(&lock);
    for (struct allocation **link = &buckets[bucket_of(ptr)]; *link != NULL; link = &(*link)->next) {
        if ((*link)->ptr == ptr) {
            struct allocation *entry = *link;
            *link = entry->next;
            size = entry->size;
            counted = entry->counted;
            free(entry);
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    unreserve(size, counted);
}

static CUresult allocated(CUresult result, CUdeviceptr *ptr, int64_t reserved, int64_t actual, uint32_t counted) {
    if (result != CUDA_SUCCESS || ptr == NULL) {
        unreserve(reserved, counted);
        return result;
    }
    if (actual != reserved) {
        unreserve(reserved, counted);
        counted = reserve(actual);
        if (counted == GATE_MEMORY_REFUSED) {
            /* Pitch padding pushed it over: the slice still holds. */
            CUresult (*real_free)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))real_fn(H_MEM_FREE_V2);
            if (real_free != NULL) {
                real_free(*ptr);
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    remember(pointers, *ptr, actual, counted);
    return result;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) {
    CUresult (*real)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))real_fn(H_MEM_ALLOC_V2);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    uint32_t counted = reserve((int64_t)size);
    if (counted == GATE_MEMORY_REFUSED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return allocated(real(ptr, size), ptr, (int64_t)size, (int64_t)size, counted);
}

API CUresult cuMemAllocManaged(CUdeviceptr *ptr, size_t size, unsigned int flags) {
    CUresult (*real)(CUdeviceptr *, size_t, unsigned) =
        (CUresult(*)(CUdeviceptr *, size_t, unsigned))real_fn(H_MEM_ALLOC_MANAGED);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    uint32_t counted = reserve((int64_t)size);
    if (counted == GATE_MEMORY_REFUSED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return allocated(real(ptr, size, flags), ptr, (int64_t)size, (int64_t)size, counted);
}

API CUresult cuMemAllocPitch_v2(CUdeviceptr *ptr, size_t *pitch, size_t width, size_t height,
                                unsigned int element_size) {
    CUresult (*real)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) =
        (CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))real_fn(H_MEM_ALLOC_PITCH_V2);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int64_t wanted = (int64_t)width * (int64_t)height;
    uint32_t counted = reserve(wanted);
    if (counted == GATE_MEMORY_REFUSED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult result = real(ptr, pitch, width, height, element_size);
    int64_t actual = (result == CUDA_SUCCESS && pitch != NULL) ? (int64_t)*pitch * (int64_t)height : wanted;
    return allocated(result, ptr, wanted, actual, counted);
}

static CUresult alloc_async(enum hook_id id, CUdeviceptr *ptr, size_t size, CUstream stream) {
    CUresult (*real)(CUdeviceptr *, size_t, CUstream) = (CUresult(*)(CUdeviceptr *, size_t, CUstream))real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    uint32_t counted = reserve((int64_t)size);
    if (counted == GATE_MEMORY_REFUSED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return allocated(real(ptr, size, stream), ptr, (int64_t)size, (int64_t)size, counted);
}

static CUresult alloc_from_pool(enum hook_id id, CUdeviceptr *ptr, size_t size, CUmemoryPool pool,
                                CUstream stream) {
    CUresult (*real)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
        (CUresult(*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream))real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    uint32_t counted = reserve((int64_t)size);
    if (counted == GATE_MEMORY_REFUSED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return allocated(real(ptr, size, pool, stream), ptr, (int64_t)size, (int64_t)size, counted);
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
        forget(pointers, ptr);
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
        forget(pointers, ptr);
    }
    return result;
}

API CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) {
    return free_async(H_MEM_FREE_ASYNC, ptr, stream);
}

API CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream stream) {
    return free_async(H_MEM_FREE_ASYNC_PTSZ, ptr, stream);
}

API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *ptr, size_t size, CUmemoryPool pool, CUstream stream) {
    return alloc_from_pool(H_MEM_ALLOC_FROM_POOL_ASYNC, ptr, size, pool, stream);
}

API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *ptr, size_t size, CUmemoryPool pool, CUstream stream) {
    return alloc_from_pool(H_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ, ptr, size, pool, stream);
}

/* The virtual memory API (PyTorch's expandable segments): cuMemCreate makes the physical
 * memory, counted here; cuMemMap only maps it (costs nothing more), cuMemRelease gives it back. */
API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
    CUresult (*real)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long) =
        (CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))
            real_fn(H_MEM_CREATE);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    uint32_t counted = reserve((int64_t)size);
    if (counted == GATE_MEMORY_REFUSED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult result = real(handle, size, prop, flags);
    if (result != CUDA_SUCCESS || handle == NULL) {
        unreserve((int64_t)size, counted);
        return result;
    }
    remember(handles, (CUdeviceptr)*handle, (int64_t)size, counted);
    return result;
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult (*real)(CUmemGenericAllocationHandle) = (CUresult(*)(CUmemGenericAllocationHandle))real_fn(H_MEM_RELEASE);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = real(handle);
    if (result == CUDA_SUCCESS) {
        forget(handles, (CUdeviceptr)handle);
    }
    return result;
}

/* A pool keeps freed memory up to its release threshold instead of returning it; a threshold
 * past the slice would let it hold more than the slice, so it is capped at the slice. */
API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CUresult (*real)(CUmemoryPool, CUmemPool_attribute, void *) =
        (CUresult(*)(CUmemoryPool, CUmemPool_attribute, void *))real_fn(H_MEM_POOL_SET_ATTRIBUTE);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && value != NULL && limited()) {
        cuuint64_t threshold = *(cuuint64_t *)value;
        if (threshold > (cuuint64_t)shim_cfg.memory_limit) {
            shim_log(LOG_INFO, "pool release threshold %llu capped at the slice (%lld bytes)",
                     (unsigned long long)threshold, (long long)shim_cfg.memory_limit);
            threshold = (cuuint64_t)shim_cfg.memory_limit;
        }
        return real(pool, attr, &threshold);
    }
    return real(pool, attr, value);
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
    int64_t shared = gate_memory_used();
    int64_t left = shim_cfg.memory_limit - __atomic_load_n(&used, __ATOMIC_ACQUIRE) - (shared > 0 ? shared : 0);
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
