/* Reads the environment into shim_cfg (the only getenv calls in the shim).
 *
 * Two moments: how loud to be, when the library loads; what the instance is (its token
 * manager, id, memory slice), at the first driver call that needs it. The second is late on
 * purpose: a pre-initialised runtime (the worker's pool) loads the shim and imports its
 * libraries before it knows which instance it will become, and is told by setting its
 * environment; no driver call happens before that. */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

struct shim_config shim_cfg = {.log_level = 1};
static pthread_once_t instance_once = PTHREAD_ONCE_INIT;

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
    shim_cfg.log_level = (int)env_int("DILU_SHIM_LOG", 1);
}

static void load_instance(void) {
    shim_cfg.log_level = (int)env_int("DILU_SHIM_LOG", 1);
    shim_cfg.disabled = env_int("DILU_SHIM_DISABLE", 0) != 0;
    env_copy("DILU_TOKEN_SOCKET", shim_cfg.socket_path, sizeof(shim_cfg.socket_path));
    env_copy("DILU_INSTANCE_ID", shim_cfg.instance_id, sizeof(shim_cfg.instance_id));
    shim_cfg.memory_limit = env_int("DILU_MEMORY_LIMIT", 0);
    shim_cfg.stale_ns = env_int("DILU_SHIM_STALE_MS", 100) * 1000000LL;
    shim_cfg.retry_ns = env_int("DILU_SHIM_RETRY_MS", 200) * 1000000LL;
    shim_log(LOG_INFO, "configured (gating %s, memory limit %lld bytes)",
             shim_cfg.socket_path[0] && !shim_cfg.disabled ? "on" : "off", (long long)shim_cfg.memory_limit);
}

void config_settle(void) {
    pthread_once(&instance_once, load_instance);
}
