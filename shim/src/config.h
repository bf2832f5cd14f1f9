/* The shim's configuration, from the environment (config.c says when each part is read). */
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

/* At load: the log level only. */
void config_load(void);
/* Reads the instance's part (everything else) once, on first need; every reader of those
 * fields calls it first. Cheap after the first call. */
void config_settle(void);

#endif
