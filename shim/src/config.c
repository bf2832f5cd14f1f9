/* Reads the environment once into shim_cfg (the only getenv calls in the shim). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

struct shim_config shim_cfg;

static int64_t env_int(const char *name, int64_t fallback) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') {
        return fallback;
    }
    char *end = NULL;
    long long parsed = strtoll(value, &end, 10);
    return (end != NULL && *end == '\0') ? (int64_t)parsed : fallback;
}

static void env_copy(const char *name, char *into, size_t size) {
    const char *value = getenv(name);
    into[0] = '\0';
    if (value != NULL && strlen(value) < size) {
        strcpy(into, value);
    }
}

void config_load(void) {
    shim_cfg.disabled = env_int("DILU_SHIM_DISABLE", 0) != 0;
    shim_cfg.log_level = (int)env_int("DILU_SHIM_LOG", 1);
    env_copy("DILU_TOKEN_SOCKET", shim_cfg.socket_path, sizeof(shim_cfg.socket_path));
    env_copy("DILU_INSTANCE_ID", shim_cfg.instance_id, sizeof(shim_cfg.instance_id));
    shim_cfg.memory_limit = env_int("DILU_MEMORY_LIMIT", 0);
    shim_cfg.stale_ns = env_int("DILU_SHIM_STALE_MS", 100) * 1000000LL;
    shim_cfg.retry_ns = env_int("DILU_SHIM_RETRY_MS", 200) * 1000000LL;
}
