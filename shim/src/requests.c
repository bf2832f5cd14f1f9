/*
 * The request API: the instance's server (worker/instance) tells the GPU's token manager, through
 * the shared region, when it starts and ends serving a request, so background launches on the
 * GPU are held for exactly as long as latency work is in progress. Exported for ctypes: the
 * server finds them in the preloaded shim; without the shim there is nothing to tell.
 */
#include "gate.h"

#define API __attribute__((visibility("default")))

API void dilu_request_begin(void) {
    gate_request(+1);
}

API void dilu_request_end(void) {
    gate_request(-1);
}
