/*
 * Stream-capture bookkeeping. While no capture is active (the normal case) the only cost on a
 * launch is one relaxed atomic load. During a capture, launches on any stream taking part in it
 * (the stream that began it, and every stream that joined it through an event: multi-stream
 * capture) add their cost to that capture, keyed by the driver's capture id; EndCapture hands
 * the total to the graph, every instantiation (WithFlags, WithParams) and cuGraphExecUpdate to
 * the exec, and cuGraphLaunch charges it per replay. The tables are small and only touched
 * around capture and instantiation, so one mutex is enough.
 */
#include "capture.h"

#include <pthread.h>
#include <stdlib.h>

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

/* The original three-argument form: every driver since CUDA 10.1 exports it under this name. */
typedef CUresult (*capture_info_fn)(CUstream, CUstreamCaptureStatus *, cuuint64_t *);

/* The id of the capture `stream` takes part in, or 0 when it is not capturing. */
static cuuint64_t capture_of(CUstream stream) {
    static capture_info_fn info;
    if (info == NULL) {
        info = (capture_info_fn)driver_symbol("cuStreamGetCaptureInfo");
    }
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    if (info == NULL || info(stream, &status, &id) != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        return 0;
    }
    return id != 0 ? id : (cuuint64_t)(uintptr_t)stream;
}

int capture_absorbs(CUstream stream, int64_t cost) {
    if (__atomic_load_n(&active_captures, __ATOMIC_RELAXED) == 0) {
        return 0;
    }
    cuuint64_t id = capture_of(stream);
    if (id == 0) {
        return 0;
    }
    pthread_mutex_lock(&lock);
    find(capturing, (const void *)(uintptr_t)id, 1)->cost += cost;
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
        cuuint64_t id = capture_of(stream);
        pthread_mutex_lock(&lock);
        find(capturing, (const void *)(uintptr_t)id, 1)->cost = 0;
        pthread_mutex_unlock(&lock);
        __atomic_fetch_add(&active_captures, 1, __ATOMIC_RELAXED);
    }
    return result;
}

/* `id`: the capture the stream took part in, asked before the driver ended it. */
static CUresult ended(CUresult result, cuuint64_t id, CUgraph *graph) {
    pthread_mutex_lock(&lock);
    struct cost_entry *entry = id != 0 ? find(capturing, (const void *)(uintptr_t)id, 0) : NULL;
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

static CUresult end_capture(enum hook_id id, CUstream stream, CUgraph *graph) {
    end_fn real = (end_fn)real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    cuuint64_t capture = capture_of(stream);
    return ended(real(stream, graph), capture, graph);
}

API CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) {
    return end_capture(H_END_CAPTURE, stream, graph);
}

API CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph *graph) {
    return end_capture(H_END_CAPTURE_PTSZ, stream, graph);
}

typedef CUresult (*get_nodes_fn)(CUgraph, CUgraphNode *, size_t *);
typedef CUresult (*node_type_fn)(CUgraphNode, CUgraphNodeType *);
typedef CUresult (*kernel_params_fn)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v2 *);
typedef CUresult (*child_graph_fn)(CUgraphNode, CUgraph *);

#define MAX_GRAPH_DEPTH 8
#define MAX_NODES 4096

/* The blocks of every kernel node of `graph`, child graphs included, from the driver's node API
 * (what a graph built node by node costs; 0 when the API is missing or lists no kernels). */
static int64_t cost_from_nodes(CUgraph graph, int depth) {
    static get_nodes_fn get_nodes;
    static node_type_fn node_type;
    static kernel_params_fn kernel_params;
    static child_graph_fn child_graph;
    if (get_nodes == NULL) {
        get_nodes = (get_nodes_fn)driver_symbol("cuGraphGetNodes");
        node_type = (node_type_fn)driver_symbol("cuGraphNodeGetType");
        kernel_params = (kernel_params_fn)driver_symbol("cuGraphKernelNodeGetParams_v2");
        child_graph = (child_graph_fn)driver_symbol("cuGraphChildGraphNodeGetGraph");
    }
    size_t count = 0;
    if (depth > MAX_GRAPH_DEPTH || get_nodes == NULL || node_type == NULL || kernel_params == NULL ||
        get_nodes(graph, NULL, &count) != CUDA_SUCCESS || count == 0 || count > MAX_NODES) {
        return 0;
    }
    CUgraphNode *nodes = calloc(count, sizeof(*nodes));
    if (nodes == NULL || get_nodes(graph, nodes, &count) != CUDA_SUCCESS) {
        free(nodes);
        return 0;
    }
    int64_t cost = 0;
    for (size_t i = 0; i < count; i++) {
        CUgraphNodeType type;
        if (node_type(nodes[i], &type) != CUDA_SUCCESS) {
            continue;
        }
        CUDA_KERNEL_NODE_PARAMS_v2 params;
        CUgraph child = NULL;
        if (type == CU_GRAPH_NODE_TYPE_KERNEL && kernel_params(nodes[i], &params) == CUDA_SUCCESS) {
            cost += (int64_t)params.gridDimX * params.gridDimY * params.gridDimZ;
        } else if (type == CU_GRAPH_NODE_TYPE_GRAPH && child_graph != NULL &&
                   child_graph(nodes[i], &child) == CUDA_SUCCESS) {
            cost += cost_from_nodes(child, depth + 1);
        }
    }
    free(nodes);
    return cost;
}

/* An exec (new, or updated in place) runs what its graph holds: the sum over its kernel nodes
 * where the driver lists them, else what its capture recorded. */
static CUresult takes_cost_of(CUresult result, CUgraphExec exec, CUgraph graph) {
    if (result == CUDA_SUCCESS && exec != NULL) {
        int64_t from_nodes = cost_from_nodes(graph, 0);
        pthread_mutex_lock(&lock);
        struct cost_entry *known = find(graphs, graph, 0);
        find(execs, exec, 1)->cost = from_nodes > 0 ? from_nodes : known != NULL ? known->cost : 0;
        pthread_mutex_unlock(&lock);
    }
    return result;
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    instantiate_fn real = (instantiate_fn)real_fn(H_GRAPH_INSTANTIATE_WITH_FLAGS);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = real(exec, graph, flags);
    return takes_cost_of(result, exec != NULL ? *exec : NULL, graph);
}

typedef CUresult (*instantiate_params_fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
typedef CUresult (*exec_update_fn)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);

static CUresult instantiate_with_params(enum hook_id id, CUgraphExec *exec, CUgraph graph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    instantiate_params_fn real = (instantiate_params_fn)real_fn(id);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult result = real(exec, graph, params);
    return takes_cost_of(result, exec != NULL ? *exec : NULL, graph);
}

API CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    return instantiate_with_params(H_GRAPH_INSTANTIATE_WITH_PARAMS, exec, graph, params);
}

API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                               CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    return instantiate_with_params(H_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ, exec, graph, params);
}

API CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info) {
    exec_update_fn real = (exec_update_fn)real_fn(H_GRAPH_EXEC_UPDATE_V2);
    if (real == NULL) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return takes_cost_of(real(exec, graph, info), exec, graph);
}
