/*
 * Stream-capture bookkeeping. While no capture is active (the normal case) the only cost on a
 * launch is one relaxed atomic load. During a capture, launches on the capturing stream add
 * their cost to that capture; EndCapture hands the total to the graph, Instantiate to the exec,
 * and cuGraphLaunch charges it per replay. The tables are small and only touched around
 * capture and instantiation, so one mutex is enough.
 */
#include "capture.h"

#include <pthread.h>

#include "log.h"

#define TABLE_SIZE 256

struct cost_entry {
    const void *key;
    int64_t cost;
};

static int active_captures;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct cost_entry capturing[TABLE_SIZE], graphs[TABLE_SIZE], execs[TABLE_SIZE];

static struct cost_entry *find(struct cost_entry *table, const void *key, int create) {
    struct cost_entry *free_entry = NULL;
    for (int i = 0; i < TABLE_SIZE; i++) {
        if (table[i].key == key) {
            return &table[i];
        }
        if (table[i].key == NULL && free_entry == NULL) {
            free_entry = &table[i];
        }
    }
    if (create && free_entry != NULL) {
        free_entry->key = key;
        free_entry->cost = 0;
        return free_entry;
    }
    return create ? &table[(uintptr_t)key % TABLE_SIZE] : NULL; /* full: reuse a slot */
}

typedef CUresult (*is_capturing_fn)(CUstream, CUstreamCaptureStatus *);

int capture_absorbs(CUstream stream, int64_t cost) {
    if (__atomic_load_n(&active_captures, __ATOMIC_RELAXED) == 0) {
        return 0;
    }
    static is_capturing_fn is_capturing;
    if (is_capturing == NULL) {
        is_capturing = (is_capturing_fn)driver_symbol("cuStreamIsCapturing");
    }
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (is_capturing == NULL || is_capturing(stream, &status) != CUDA_SUCCESS ||
        status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        return 0;
    }
    pthread_mutex_lock(&lock);
    find(capturing, stream, 1)->cost += cost;
    pthread_mutex_unlock(&lock);
    return 1;
}

int64_t graph_exec_cost(CUgraphExec exec) {
    pthread_mutex_lock(&lock);
    struct cost_entry *entry = find(execs, exec, 0);
    int64_t cost = entry != NULL && entry->cost > 0 ? entry->cost : 1;
    pthread_mutex_unlock(&lock);
    return cost;
}

static CUresult begun(CUresult result, CUstream stream) {
    if (result == CUDA_SUCCESS) {
        pthread_mutex_lock(&lock);
        find(capturing, stream, 1)->cost = 0;
        pthread_mutex_unlock(&lock);
        __atomic_fetch_add(&active_captures, 1, __ATOMIC_RELAXED);
    }
    return result;
}

static CUresult ended(CUresult result, CUstream stream, CUgraph *graph) {
    pthread_mutex_lock(&lock);
    struct cost_entry *entry = find(capturing, stream, 0);
    int64_t cost = entry != NULL ? entry->cost : 0;
    if (entry != NULL) {
        entry->key = NULL;
        __atomic_fetch_sub(&active_captures, 1, __ATOMIC_RELAXED);
    }
    if (result == CUDA_SUCCESS && graph != NULL && *graph != NULL) {
        find(graphs, *graph, 1)->cost = cost;
    }
    pthread_mutex_unlock(&lock);
    shim_log(LOG_DEBUG, "capture ended: graph costs %lld tokens per replay", (long long)cost);
    return result;
}

#define API __attribute__((visibility("default")))

typedef CUresult (*begin1_fn)(CUstream);
typedef CUresult (*begin2_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*end_fn)(CUstream, CUgraph *);
typedef CUresult (*instantiate_fn)(CUgraphExec *, CUgraph, unsigned long long);

API CUresult cuStreamBeginCapture(CUstream stream) {
    begin1_fn real = (begin1_fn)real_fn(H_BEGIN_CAPTURE);
    return real ? begun(real(stream), stream) : CUDA_ERROR_NOT_SUPPORTED;
}

API CUresult cuStreamBeginCapture_ptsz(CUstream stream) {
    begin1_fn real = (begin1_fn)real_fn(H_BEGIN_CAPTURE_PTSZ);
    return real ? begun(real(stream), stream) : CUDA_ERROR_NOT_SUPPORTED;
}

API CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
    begin2_fn real = (begin2_fn)real_fn(H_BEGIN_CAPTURE_V2);
    return real ? begun(real(stream, mode), stream) : CUDA_ERROR_NOT_SUPPORTED;
}

API CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
    begin2_fn real = (begin2_fn)real_fn(H_BEGIN_CAPTURE_V2_PTSZ);
    return real ? begun(real(stream, mode), stream) : CUDA_ERROR_NOT_SUPPORTED;
}

API CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) {
    end_fn real = (end_fn)real_fn(H_END_CAPTURE);
    return real ? ended(real(stream, graph), stream, graph) : CUDA_ERROR_NOT_SUPPORTED;
}

API CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph *graph) {
    end_fn real = (end_fn)real_fn(H_END_CAPTURE_PTSZ);
    return real ? ended(real(stream, graph), stream, graph) : CUDA_ERROR_NOT_SUPPORTED;
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    instantiate_fn real = (instantiate_fn)real_fn(H_GRAPH_INSTANTIATE_WITH_FLAGS);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = real(exec, graph, flags);
    if (result == CUDA_SUCCESS && exec != NULL) {
        pthread_mutex_lock(&lock);
        struct cost_entry *known = find(graphs, graph, 0);
        find(execs, *exec, 1)->cost = known != NULL ? known->cost : 0;
        pthread_mutex_unlock(&lock);
    }
    return result;
}
