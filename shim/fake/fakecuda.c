/*
 * A fake libcuda.so.1 for machines without a GPU.
 *
 * It exports the driver entry points Dilu's shim and tests use (including cuGetProcAddress and
 * cuGetProcAddress_v2 with the real version and per-thread-stream semantics) and models a
 * device: a kernel occupies it for (blocks x DILU_FAKE_NS_PER_BLOCK) ns, a process's kernels run
 * in launch order, synchronisation and events wait until the work before them is done, and the
 * processes of one simulated GPU (the same DILU_FAKE_CLOCK file) share it, one queue for all or
 * time-sliced by process as a GPU without MPS does (fakedevice.c), so tests can measure the
 * device time each process gets and how long one waits behind another.
 *
 * Like some real drivers, it resolves its own entry points with dlsym internally, which is
 * what trips naive dlsym interposers.
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakedevice.h"

#define API __attribute__((visibility("default")))
#define MAX_STREAMS 128


#define FAKE_GRAPH_NODES 64

struct fake_graph;
struct fake_node {
    CUgraphNodeType type;
    unsigned grid[3];           /* kernel nodes */
    struct fake_graph *child;   /* child-graph nodes */
};

/* A captured graph records only its total; one built node by node (cuGraphCreate,
 * cuGraphAdd*Node) also lists its nodes, as the driver's node API reports them. */
struct fake_graph {
    int64_t blocks;
    size_t node_count;
    struct fake_node nodes[FAKE_GRAPH_NODES];
};

static struct {
    int initialised;
    int devices;
    int64_t ns_per_block;
    int64_t memory_total;
} fake;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t memory_used;
static uint64_t next_address = 0x700000000000ull;

/* Per-process counters, readable with ctypes. */
API volatile int64_t dilu_fake_launch_count;
API volatile int64_t dilu_fake_device_ns;
API volatile int64_t dilu_fake_ptsz_calls;   /* launches that arrived through a _ptsz entry point */
API volatile int64_t dilu_fake_peak_outstanding_ns;   /* the most work this process had queued and unfinished */

static struct {
    CUstream stream;
    int64_t tail;             /* the device model's mark of its last kernel */
    int capturing;
    int origin;               /* the stream whose capture this one takes part in (itself, or one it joined) */
    cuuint64_t capture_id;
    int64_t captured_blocks;  /* on the origin: the capture's total, over every stream that joined */
} streams[MAX_STREAMS];
static cuuint64_t next_capture_id = 1;

/* An event remembers the capture it was recorded in, so a stream that waits on it joins that
 * capture (how multi-stream capture forks work), and the work it follows. */
struct fake_event {
    int capture_origin;   /* -1: recorded outside any capture */
    int64_t mark;         /* done when the device has done its stream's work up to here */
};
static int64_t process_tail;

static int64_t env_int(const char *name, int64_t fallback) {
    const char *value = getenv(name);
    return value != NULL && *value ? strtoll(value, NULL, 10) : fallback;
}

/* A forked child is a new context: the parent's marks mean nothing on it. */
static void forget_marks_in_child(void) {
    for (int i = 0; i < MAX_STREAMS; i++) {
        streams[i].tail = 0;
    }
    process_tail = 0;
}

static void init_once(void) {
    fake.devices = (int)env_int("DILU_FAKE_DEVICES", 1);
    fake.ns_per_block = env_int("DILU_FAKE_NS_PER_BLOCK", 1000);
    fake.memory_total = env_int("DILU_FAKE_MEMORY", 16LL << 30);
    device_open();
    pthread_atfork(NULL, NULL, forget_marks_in_child);
}

static void ensure_init(void) {
    pthread_once(&once, init_once);
}

static int stream_index(CUstream stream, int create) {
    for (int i = 0; i < MAX_STREAMS; i++) {
        if (streams[i].stream == stream && (i == 0 || stream != NULL)) {
            return i;
        }
    }
    if (!create) {
        return stream == NULL ? 0 : -1;
    }
    for (int i = 1; i < MAX_STREAMS; i++) {
        if (streams[i].stream == NULL) {
            streams[i].stream = stream;
            return i;
        }
    }
    return 0;
}

/* Puts `blocks` of work on the device behind this process's earlier work. */
static CUresult run_kernel(CUstream stream, int64_t blocks) {
    ensure_init();
    __atomic_fetch_add(&dilu_fake_launch_count, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock);
    int index = stream_index(stream, 1);
    if (streams[index].capturing) {
        streams[streams[index].origin].captured_blocks += blocks;
        pthread_mutex_unlock(&lock);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    int64_t duration = blocks * fake.ns_per_block;
    if (duration <= 0) {
        return CUDA_SUCCESS;
    }
    __atomic_fetch_add(&dilu_fake_device_ns, duration, __ATOMIC_RELAXED);
    int64_t mark = device_submit(duration);
    dilu_fake_peak_outstanding_ns = device_peak_outstanding();
    pthread_mutex_lock(&lock);
    if (mark > streams[index].tail) streams[index].tail = mark;
    if (mark > process_tail) process_tail = mark;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static CUresult check_device(CUdevice device) {
    ensure_init();
    return device >= 0 && device < fake.devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* ---- initialisation, devices, contexts ---- */
API CUresult cuInit(unsigned int flags) {
    (void)flags;
    ensure_init();
    fake.initialised = 1;
    return CUDA_SUCCESS;
}
API CUresult cuDriverGetVersion(int *version) {
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetCount(int *count) {
    ensure_init();
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    *count = fake.devices;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    *device = ordinal;
    return check_device(ordinal);
}
API CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    if (name == NULL || length <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)length, "Dilu fake GPU %d", device);
    return check_device(device);
}
API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) {
    if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
    memset(uuid->bytes, 0, sizeof(uuid->bytes));
    uuid->bytes[15] = (char)device;
    return check_device(device);
}
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    ensure_init();
    *bytes = (size_t)fake.memory_total;
    return check_device(device);
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
    *context = (CUcontext)(uintptr_t)(0x1000 + device);
    return check_device(device);
}
API CUresult cuCtxSetCurrent(CUcontext context) {
    (void)context;
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetCurrent(CUcontext *context) {
    if (context == NULL) return CUDA_ERROR_INVALID_VALUE;
    *context = (CUcontext)(uintptr_t)0x1000;
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetDevice(CUdevice *device) {
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    *device = 0;
    return CUDA_SUCCESS;
}
API CUresult cuCtxSynchronize(void) {
    ensure_init();
    pthread_mutex_lock(&lock);
    int64_t tail = process_tail;
    pthread_mutex_unlock(&lock);
    device_wait(tail);
    return CUDA_SUCCESS;
}

/* ---- modules ---- */
API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    (void)image;
    if (module == NULL) return CUDA_ERROR_INVALID_VALUE;
    *module = (CUmodule)malloc(16);
    return CUDA_SUCCESS;
}
API CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    if (function == NULL || module == NULL || name == NULL) return CUDA_ERROR_INVALID_VALUE;
    *function = (CUfunction)strdup(name);
    return CUDA_SUCCESS;
}

/* ---- streams and capture ---- */
API CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
    (void)flags;
    if (stream == NULL) return CUDA_ERROR_INVALID_VALUE;
    *stream = (CUstream)malloc(16);
    pthread_mutex_lock(&lock);
    stream_index(*stream, 1);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
API CUresult cuStreamDestroy_v2(CUstream stream) {
    pthread_mutex_lock(&lock);
    int index = stream_index(stream, 0);
    if (index > 0) memset(&streams[index], 0, sizeof(streams[index]));
    pthread_mutex_unlock(&lock);
    free(stream);
    return CUDA_SUCCESS;
}
static CUresult stream_sync(CUstream stream) {
    ensure_init();
    pthread_mutex_lock(&lock);
    int index = stream_index(stream, 0);
    int64_t tail = index >= 0 ? streams[index].tail : process_tail;
    pthread_mutex_unlock(&lock);
    device_wait(tail);
    return CUDA_SUCCESS;
}
API CUresult cuStreamSynchronize(CUstream stream) { return stream_sync(stream); }
API CUresult cuStreamSynchronize_ptsz(CUstream stream) { return stream_sync(stream); }

static CUresult is_capturing(CUstream stream, CUstreamCaptureStatus *status) {
    if (status == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int index = stream_index(stream, 0);
    *status = index >= 0 && streams[index].capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
API CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status) { return is_capturing(stream, status); }
API CUresult cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus *status) { return is_capturing(stream, status); }

static CUresult begin_capture(CUstream stream) {
    if (stream == NULL) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    pthread_mutex_lock(&lock);
    int index = stream_index(stream, 1);
    streams[index].capturing = 1;
    streams[index].origin = index;
    streams[index].capture_id = next_capture_id++;
    streams[index].captured_blocks = 0;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
API CUresult cuStreamBeginCapture(CUstream stream) { return begin_capture(stream); }
API CUresult cuStreamBeginCapture_ptsz(CUstream stream) { return begin_capture(stream); }
API CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) { (void)mode; return begin_capture(stream); }
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) { (void)mode; return begin_capture(stream); }

static CUresult end_capture(CUstream stream, CUgraph *graph) {
    if (graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int index = stream_index(stream, 0);
    if (index < 0 || !streams[index].capturing) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    struct fake_graph *recorded = calloc(1, sizeof(*recorded));
    recorded->blocks = streams[index].captured_blocks;
    for (int i = 0; i < MAX_STREAMS; i++) {   /* every stream that joined leaves with it */
        if (streams[i].capturing && streams[i].origin == index) {
            streams[i].capturing = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    *graph = (CUgraph)recorded;
    return CUDA_SUCCESS;
}
API CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) { return end_capture(stream, graph); }
API CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph *graph) { return end_capture(stream, graph); }

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags) {
    (void)flags;
    if (exec == NULL || graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct fake_graph *copy = malloc(sizeof(*copy));
    copy->blocks = ((struct fake_graph *)graph)->blocks;
    *exec = (CUgraphExec)copy;
    return CUDA_SUCCESS;
}
/* ---- graphs built node by node ---- */
API CUresult cuGraphCreate(CUgraph *graph, unsigned int flags) {
    (void)flags;
    if (graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    *graph = (CUgraph)calloc(1, sizeof(struct fake_graph));
    return CUDA_SUCCESS;
}
static CUresult add_node(CUgraphNode *node, CUgraph graph, struct fake_node value, int64_t blocks) {
    struct fake_graph *target = (struct fake_graph *)graph;
    if (node == NULL || target == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (target->node_count >= FAKE_GRAPH_NODES) return CUDA_ERROR_OUT_OF_MEMORY;
    target->nodes[target->node_count] = value;
    *node = (CUgraphNode)&target->nodes[target->node_count++];
    target->blocks += blocks;
    return CUDA_SUCCESS;
}
API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t count,
                                     const CUDA_KERNEL_NODE_PARAMS_v2 *params) {
    (void)deps; (void)count;
    if (params == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct fake_node value = {.type = CU_GRAPH_NODE_TYPE_KERNEL,
                              .grid = {params->gridDimX, params->gridDimY, params->gridDimZ}};
    return add_node(node, graph, value, (int64_t)params->gridDimX * params->gridDimY * params->gridDimZ);
}
API CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t count,
                                      CUgraph child) {
    (void)deps; (void)count;
    if (child == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct fake_node value = {.type = CU_GRAPH_NODE_TYPE_GRAPH, .child = (struct fake_graph *)child};
    return add_node(node, graph, value, ((struct fake_graph *)child)->blocks);
}
API CUresult cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count) {
    struct fake_graph *source = (struct fake_graph *)graph;
    if (source == NULL || count == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (nodes != NULL) {
        size_t n = *count < source->node_count ? *count : source->node_count;
        for (size_t i = 0; i < n; i++) nodes[i] = (CUgraphNode)&source->nodes[i];
    }
    *count = source->node_count;
    return CUDA_SUCCESS;
}
API CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type) {
    if (node == NULL || type == NULL) return CUDA_ERROR_INVALID_VALUE;
    *type = ((struct fake_node *)node)->type;
    return CUDA_SUCCESS;
}
API CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v2 *params) {
    struct fake_node *source = (struct fake_node *)node;
    if (source == NULL || params == NULL || source->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    memset(params, 0, sizeof(*params));
    params->gridDimX = source->grid[0];
    params->gridDimY = source->grid[1];
    params->gridDimZ = source->grid[2];
    return CUDA_SUCCESS;
}
API CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *graph) {
    struct fake_node *source = (struct fake_node *)node;
    if (source == NULL || graph == NULL || source->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    *graph = (CUgraph)source->child;
    return CUDA_SUCCESS;
}

API CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    if (exec == NULL || graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct fake_graph *copy = malloc(sizeof(*copy));
    copy->blocks = ((struct fake_graph *)graph)->blocks;
    *exec = (CUgraphExec)copy;
    if (params != NULL) params->result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
    return CUDA_SUCCESS;
}
API CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info) {
    if (exec == NULL || graph == NULL) return CUDA_ERROR_INVALID_VALUE;
    ((struct fake_graph *)exec)->blocks = ((struct fake_graph *)graph)->blocks;
    if (info != NULL) info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return CUDA_SUCCESS;
}

/* ---- events, and the capture state of a stream ---- */
API CUresult cuEventCreate(CUevent *event, unsigned int flags) {
    (void)flags;
    if (event == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct fake_event *created = malloc(sizeof(*created));
    created->capture_origin = -1;
    created->mark = 0;
    *event = (CUevent)created;
    return CUDA_SUCCESS;
}
API CUresult cuEventDestroy_v2(CUevent event) { free(event); return CUDA_SUCCESS; }
static CUresult event_record(CUevent event, CUstream stream) {
    if (event == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int index = stream_index(stream, 1);
    struct fake_event *recorded = (struct fake_event *)event;
    recorded->capture_origin = streams[index].capturing ? streams[index].origin : -1;
    if (!streams[index].capturing) {
        recorded->mark = stream == NULL ? process_tail : streams[index].tail;  /* the legacy stream waits for all */
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
API CUresult cuEventRecord(CUevent event, CUstream stream) { return event_record(event, stream); }
API CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) { return event_record(event, stream); }
API CUresult cuEventQuery(CUevent event) {
    if (event == NULL) return CUDA_ERROR_INVALID_HANDLE;
    ensure_init();
    return device_reached(((struct fake_event *)event)->mark) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult cuEventSynchronize(CUevent event) {
    if (event == NULL) return CUDA_ERROR_INVALID_HANDLE;
    ensure_init();
    device_wait(((struct fake_event *)event)->mark);
    return CUDA_SUCCESS;
}
static CUresult wait_event(CUstream stream, CUevent event) {
    if (event == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int origin = ((struct fake_event *)event)->capture_origin;
    int index = stream_index(stream, 1);
    if (origin >= 0 && streams[origin].capturing && !streams[index].capturing) {
        streams[index].capturing = 1;          /* joins the capture the event was recorded in */
        streams[index].origin = origin;
        streams[index].capture_id = streams[origin].capture_id;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
API CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) { (void)flags; return wait_event(stream, event); }
API CUresult cuStreamWaitEvent_ptsz(CUstream stream, CUevent event, unsigned int flags) { (void)flags; return wait_event(stream, event); }
static CUresult capture_info(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id) {
    if (status == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int index = stream_index(stream, 0);
    int active = index >= 0 && streams[index].capturing;
    *status = active ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id != NULL && active) *id = streams[index].capture_id;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
API CUresult cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id) {
    return capture_info(stream, status, id);
}
API CUresult cuStreamGetCaptureInfo_ptsz(CUstream stream, CUstreamCaptureStatus *status, cuuint64_t *id) {
    return capture_info(stream, status, id);
}

API CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    if (exec == NULL) return CUDA_ERROR_INVALID_VALUE;
    return run_kernel(stream, ((struct fake_graph *)exec)->blocks);
}
API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
    __atomic_fetch_add(&dilu_fake_ptsz_calls, 1, __ATOMIC_RELAXED);
    if (exec == NULL) return CUDA_ERROR_INVALID_VALUE;   /* not through cuGraphLaunch: the shim interposes it */
    return run_kernel(stream, ((struct fake_graph *)exec)->blocks);
}
API CUresult cuGraphExecDestroy(CUgraphExec exec) { free(exec); return CUDA_SUCCESS; }
API CUresult cuGraphDestroy(CUgraph graph) { free(graph); return CUDA_SUCCESS; }

/* ---- launches ---- */
static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, CUstream stream) {
    if (f == NULL) return CUDA_ERROR_INVALID_HANDLE;
    return run_kernel(stream, (int64_t)gx * gy * gz);
}
API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shared, CUstream stream, void **params, void **extra) {
    (void)bx; (void)by; (void)bz; (void)shared; (void)params; (void)extra;
    return launch(f, gx, gy, gz, stream);
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, CUstream stream, void **params, void **extra) {
    (void)bx; (void)by; (void)bz; (void)shared; (void)params; (void)extra;
    __atomic_fetch_add(&dilu_fake_ptsz_calls, 1, __ATOMIC_RELAXED);
    return launch(f, gx, gy, gz, stream);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    (void)params; (void)extra;
    if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->hStream);
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    (void)params; (void)extra;
    __atomic_fetch_add(&dilu_fake_ptsz_calls, 1, __ATOMIC_RELAXED);
    if (config == NULL) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->hStream);
}
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params) {
    (void)bx; (void)by; (void)bz; (void)shared; (void)params;
    return launch(f, gx, gy, gz, stream);
}
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shared, CUstream stream,
                                            void **params) {
    (void)bx; (void)by; (void)bz; (void)shared; (void)params;
    __atomic_fetch_add(&dilu_fake_ptsz_calls, 1, __ATOMIC_RELAXED);
    return launch(f, gx, gy, gz, stream);
}

/* ---- memory ---- */
static CUresult allocate(CUdeviceptr *ptr, size_t size) {
    ensure_init();
    if (ptr == NULL || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (memory_used + (int64_t)size > fake.memory_total) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memory_used += (int64_t)size;
    *ptr = next_address;
    next_address += (size + 0xfffu) & ~(uint64_t)0xfffu;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
struct sized { CUdeviceptr ptr; int64_t size; };
static struct sized sizes[4096];
static void note_size(CUdeviceptr ptr, int64_t size) {
    pthread_mutex_lock(&lock);
    sizes[(ptr >> 12) % 4096] = (struct sized){ptr, size};
    pthread_mutex_unlock(&lock);
}
static CUresult release(CUdeviceptr ptr) {
    pthread_mutex_lock(&lock);
    struct sized *entry = &sizes[(ptr >> 12) % 4096];
    if (entry->ptr == ptr) {
        memory_used -= entry->size;
        entry->ptr = 0;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
/* Every allocation entry point ends here, never in another exported one: a call from inside
 * this library to an exported symbol would go to whatever interposes it (the shim), twice. */
static CUresult alloc_sized(CUdeviceptr *ptr, size_t size) {
    CUresult result = allocate(ptr, size);
    if (result == CUDA_SUCCESS) note_size(*ptr, (int64_t)size);
    return result;
}
API CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size) { return alloc_sized(ptr, size); }
API CUresult cuMemAllocManaged(CUdeviceptr *ptr, size_t size, unsigned int flags) { (void)flags; return alloc_sized(ptr, size); }
API CUresult cuMemAllocPitch_v2(CUdeviceptr *ptr, size_t *pitch, size_t width, size_t height, unsigned int element) {
    (void)element;
    if (pitch == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pitch = (width + 511) & ~(size_t)511;
    return alloc_sized(ptr, *pitch * height);
}
API CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t size, CUstream stream) { (void)stream; return alloc_sized(ptr, size); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *ptr, size_t size, CUstream stream) { (void)stream; return alloc_sized(ptr, size); }
API CUresult cuMemFree_v2(CUdeviceptr ptr) { return release(ptr); }
API CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) { (void)stream; return release(ptr); }
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream stream) { (void)stream; return release(ptr); }
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *ptr, size_t size, CUmemoryPool pool, CUstream stream) {
    (void)pool; (void)stream; return alloc_sized(ptr, size);
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *ptr, size_t size, CUmemoryPool pool, CUstream stream) {
    (void)pool; (void)stream; return alloc_sized(ptr, size);
}
/* Physical allocations of the virtual memory API: a handle is the fake address of its memory. */
API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
    (void)prop; (void)flags;
    if (handle == NULL) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr ptr = 0;
    CUresult result = alloc_sized(&ptr, size);
    if (result == CUDA_SUCCESS) *handle = (CUmemGenericAllocationHandle)ptr;
    return result;
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return release((CUdeviceptr)handle); }
static cuuint64_t pool_release_threshold;
API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    (void)pool;
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) pool_release_threshold = *(cuuint64_t *)value;
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    (void)pool;
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) *(cuuint64_t *)value = pool_release_threshold;
    return CUDA_SUCCESS;
}
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    ensure_init();
    if (free_bytes == NULL || total_bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *free_bytes = (size_t)(fake.memory_total - memory_used);
    pthread_mutex_unlock(&lock);
    *total_bytes = (size_t)fake.memory_total;
    return CUDA_SUCCESS;
}

/* ---- errors, private tables ---- */
API CUresult cuGetErrorString(CUresult error, const char **text) {
    if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
    *text = error == CUDA_SUCCESS ? "no error" : error == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "fake driver error";
    return CUDA_SUCCESS;
}
API CUresult cuGetErrorName(CUresult error, const char **text) {
    if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
    *text = error == CUDA_SUCCESS ? "CUDA_SUCCESS" : error == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN";
    return CUDA_SUCCESS;
}
API CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    (void)table; (void)id;
    return CUDA_ERROR_NOT_SUPPORTED; /* the real runtime needs these private tables: not emulated */
}

/* ---- entry points by name and version ---- */
struct entry {
    const char *name;
    int since;
    const char *legacy;
    const char *ptsz;
};

static const struct entry entries[] = {
    {"cuInit", 2000, "cuInit", NULL},
    {"cuDriverGetVersion", 2020, "cuDriverGetVersion", NULL},
    {"cuDeviceGet", 2000, "cuDeviceGet", NULL},
    {"cuDeviceGetCount", 2000, "cuDeviceGetCount", NULL},
    {"cuDeviceGetName", 2000, "cuDeviceGetName", NULL},
    {"cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2", NULL},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", NULL},
    {"cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain", NULL},
    {"cuCtxSetCurrent", 4000, "cuCtxSetCurrent", NULL},
    {"cuCtxGetCurrent", 4000, "cuCtxGetCurrent", NULL},
    {"cuCtxGetDevice", 2000, "cuCtxGetDevice", NULL},
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize", NULL},
    {"cuModuleLoadData", 2000, "cuModuleLoadData", NULL},
    {"cuModuleGetFunction", 2000, "cuModuleGetFunction", NULL},
    {"cuStreamCreate", 2000, "cuStreamCreate", NULL},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2", NULL},
    {"cuStreamSynchronize", 2000, "cuStreamSynchronize", "cuStreamSynchronize_ptsz"},
    {"cuStreamIsCapturing", 10000, "cuStreamIsCapturing", "cuStreamIsCapturing_ptsz"},
    {"cuStreamBeginCapture", 10000, "cuStreamBeginCapture", "cuStreamBeginCapture_ptsz"},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz"},
    {"cuStreamEndCapture", 10000, "cuStreamEndCapture", "cuStreamEndCapture_ptsz"},
    {"cuGraphInstantiateWithFlags", 11040, "cuGraphInstantiateWithFlags", NULL},
    {"cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags", NULL},
    {"cuGraphLaunch", 10000, "cuGraphLaunch", "cuGraphLaunch_ptsz"},
    {"cuGraphExecDestroy", 10000, "cuGraphExecDestroy", NULL},
    {"cuGraphDestroy", 10000, "cuGraphDestroy", NULL},
    {"cuGraphInstantiateWithParams", 12000, "cuGraphInstantiateWithParams", NULL},
    {"cuGraphCreate", 10000, "cuGraphCreate", NULL},
    {"cuGraphAddKernelNode", 12000, "cuGraphAddKernelNode_v2", NULL},
    {"cuGraphAddChildGraphNode", 10000, "cuGraphAddChildGraphNode", NULL},
    {"cuGraphGetNodes", 10000, "cuGraphGetNodes", NULL},
    {"cuGraphNodeGetType", 10000, "cuGraphNodeGetType", NULL},
    {"cuGraphKernelNodeGetParams", 12000, "cuGraphKernelNodeGetParams_v2", NULL},
    {"cuGraphChildGraphNodeGetGraph", 10000, "cuGraphChildGraphNodeGetGraph", NULL},
    {"cuGraphExecUpdate", 12000, "cuGraphExecUpdate_v2", NULL},
    {"cuEventCreate", 2000, "cuEventCreate", NULL},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2", NULL},
    {"cuEventRecord", 2000, "cuEventRecord", "cuEventRecord_ptsz"},
    {"cuEventQuery", 2000, "cuEventQuery", NULL},
    {"cuEventSynchronize", 2000, "cuEventSynchronize", NULL},
    {"cuStreamWaitEvent", 3020, "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"},
    {"cuStreamGetCaptureInfo", 10010, "cuStreamGetCaptureInfo", "cuStreamGetCaptureInfo_ptsz"},
    {"cuLaunchKernel", 4000, "cuLaunchKernel", "cuLaunchKernel_ptsz"},
    {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},
    {"cuLaunchCooperativeKernel", 9000, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2", NULL},
    {"cuMemAllocManaged", 6000, "cuMemAllocManaged", NULL},
    {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", NULL},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
    {"cuMemFree", 3020, "cuMemFree_v2", NULL},
    {"cuMemFreeAsync", 11020, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2", NULL},
    {"cuMemCreate", 10020, "cuMemCreate", NULL},
    {"cuMemRelease", 10020, "cuMemRelease", NULL},
    {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
    {"cuMemPoolSetAttribute", 11020, "cuMemPoolSetAttribute", NULL},
    {"cuMemPoolGetAttribute", 11020, "cuMemPoolGetAttribute", NULL},
    {"cuGetProcAddress", 11030, "cuGetProcAddress", NULL},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2", NULL},
    {"cuGetExportTable", 3000, "cuGetExportTable", NULL},
    {"cuGetErrorString", 6000, "cuGetErrorString", NULL},
    {"cuGetErrorName", 6000, "cuGetErrorName", NULL},
};

static void *self_symbol(const char *symbol) {
    static void *self;
    if (self == NULL) {
        self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    }
    /* Through whatever dlsym is interposed, on purpose: a shim must pass this through. */
    return self != NULL ? dlsym(self, symbol) : NULL;
}

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
    ensure_init();
    if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    const struct entry *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
        if (strcmp(entries[i].name, symbol) == 0) {
            known = 1;
            if (entries[i].since <= version && (best == NULL || entries[i].since > best->since)) {
                best = &entries[i];
            }
        }
    }
    if (best == NULL) {
        if (status != NULL) *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    const char *name = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->ptsz ? best->ptsz : best->legacy;
    *pfn = self_symbol(name);
    if (status != NULL) *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return lookup(symbol, pfn, version, flags, NULL);
}
API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    return lookup(symbol, pfn, version, flags, status);
}
