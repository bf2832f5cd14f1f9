/* One formatted line per call, written with a single write(2) so lines never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "config.h"

void shim_log(int level, const char *fmt, ...) {
    if (level > shim_cfg.log_level) {
        return;
    }
    char line[512];
    int used = snprintf(line, sizeof(line), "[dilu-shim %d] ", (int)getpid());
    va_list args;
    va_start(args, fmt);
    int more = vsnprintf(line + used, sizeof(line) - (size_t)used - 1, fmt, args);
    va_end(args);
    size_t length = (size_t)used + (more > 0 ? (size_t)more : 0);
    if (length > sizeof(line) - 2) {
        length = sizeof(line) - 2;
    }
    line[length++] = '\n';
    ssize_t ignored = write(2, line, length);
    (void)ignored;
}
