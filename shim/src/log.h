/* Logging to stderr, filtered by DILU_SHIM_LOG. */
#ifndef DILU_LOG_H
#define DILU_LOG_H

enum { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

void shim_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
