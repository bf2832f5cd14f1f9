/* Background release: keeps a batch instance's work out of a latency instance's way. */
#ifndef DILU_RELEASE_H
#define DILU_RELEASE_H

#include <stdint.h>

#include "hooks.h"

/* Installs the fork handler (a child has no events of its parent's). */
void release_init(void);

/* Right before a batch instance's launch of `cost` tokens on `stream` reaches the driver: waits
 * while a latency instance on the GPU serves a request (unless the manager granted this instance
 * its floor) and while this process has its window's worth of launched work unfinished on the
 * device. Returns at once for latency instances, unregistered processes and an open gate. */
void release_before(CUstream stream, int ptsz, int64_t cost);

/* After the driver accepted that launch on `stream` (through a per-thread-default-stream entry
 * point when `ptsz`): tracks it with an event while the instance's window is bounded. */
void release_after(CUstream stream, int ptsz, int64_t cost);

#endif
