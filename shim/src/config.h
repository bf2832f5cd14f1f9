/* The shim's configuration: the environment, read once at initialisation. */
#ifndef DILU_CONFIG_H
#define DILU_CONFIG_H

#include <stdint.h>

struct shim_config {
    int disabled;              /* DILU_SHIM_DISABLE=1: every hook forwards untouched */
    int log_level;             /* DILU_SHIM_LOG: 0 errors, 1 warnings (default), 2 info, 3 debug */
    char socket_path[108];     /* DILU_TOKEN_SOCKET: the GPU's token manager; empty = no gating */
    char instance_id[64];      /* DILU_INSTANCE_ID */
    int64_t memory_limit;      /* DILU_MEMORY_LIMIT bytes; 0 = unlimited */
    int64_t stale_ns;          /* DILU_SHIM_STALE_MS: manager heartbeat age that means "gone" */
    int64_t retry_ns;          /* DILU_SHIM_RETRY_MS: how often to try re-registering */
};

extern struct shim_config shim_cfg;

void config_load(void);

#endif
