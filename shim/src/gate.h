/* The token gate: registration with the GPU's token manager and the per-launch check. */
#ifndef DILU_GATE_H
#define DILU_GATE_H

#include <stdint.h>

/* Installs the fork handler; no I/O (registration happens at the first launch). */
void gate_init(void);

/* Charges `cost` tokens, waiting until the manager grants them. Fails open (and says so once)
 * when there is no manager or it has gone stale. Never holds a lock while it waits. */
void gate_charge(int64_t cost);

/* Adds allocated bytes to the slot's telemetry (best effort). */
void gate_note_memory(int64_t delta);

#endif
