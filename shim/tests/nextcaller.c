/*
 * An interposer of its own, preloaded after the shim (as a profiler or another tool would be):
 * it defines cuDriverGetVersion and forwards to the next definition, found with
 * dlsym(RTLD_NEXT, ...). That must be the driver's, never this library's own function (which
 * would recurse forever).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef int (*version_fn)(int *);

__attribute__((visibility("default"))) int cuDriverGetVersion(int *version) {
    version_fn next = (version_fn)dlsym(RTLD_NEXT, "cuDriverGetVersion");
    if (next == (version_fn)cuDriverGetVersion) {
        return -1; /* found itself: the lookup ignored who asked */
    }
    return next != NULL ? next(version) : -2;
}

/* Where dlsym(RTLD_NEXT, symbol) from this library leads: the defining object's path, or "". */
__attribute__((visibility("default"))) const char *next_library(const char *symbol) {
    void *found = dlsym(RTLD_NEXT, symbol);
    Dl_info info;
    if (found == NULL || dladdr(found, &info) == 0 || info.dli_fname == NULL) {
        return "";
    }
    return info.dli_fname;
}
