/* Stream capture: launches recorded into a graph are not charged; the graph's replay is. */
#ifndef DILU_CAPTURE_H
#define DILU_CAPTURE_H

#include <stdint.h>

#include "hooks.h"

/* If `stream` is being captured, adds `cost` to its graph and returns 1 (do not charge now). */
int capture_absorbs(CUstream stream, int64_t cost);

/* What one replay of an instantiated graph costs (learned from its capture; 1 if unknown). */
int64_t graph_exec_cost(CUgraphExec exec);

#endif
