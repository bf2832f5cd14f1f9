/* The token gate: registration with the GPU's token manager and the per-launch check. */
#ifndef DILU_GATE_H
#define DILU_GATE_H

#include <stdint.h>

/* Installs the fork handler; no I/O (registration happens at the first launch). */
void gate_init(void);

/* Charges `cost` tokens, waiting until the manager grants them (a latency instance serving a
 * request never waits). Fails open (and says so once) when there is no manager or it has gone
 * stale. Never holds a lock while it waits. */
void gate_charge(int64_t cost);

struct dilu_shm_header;
struct dilu_slot;

/* The instance's slot and the region (through `header`) while registered and gating; else NULL. */
struct dilu_slot *gate_slot(struct dilu_shm_header **header);

/* Whether the manager's heartbeat is older than the staleness limit at `now`; if so the gate
 * latches open (as a token wait does) and every launch runs unheld. */
int gate_manager_gone(int64_t now);

/* The instance's server starts (+1) or ends (-1) serving a request. Registers first if needed;
 * the end of the last one wakes background launches held for it. */
void gate_request(int delta);

/* Reservations of device memory in the instance's shared counter (all its processes together).
 * gate_memory_reserve returns GATE_MEMORY_REFUSED when `size` would take the instance past
 * `limit` (0: no limit), GATE_MEMORY_LOCAL when there is no registered manager (the caller
 * counts the bytes itself), else the registration epoch to hand back to gate_memory_release. */
#define GATE_MEMORY_REFUSED 0u
#define GATE_MEMORY_LOCAL 1u
uint32_t gate_memory_reserve(int64_t size, int64_t limit);
void gate_memory_release(int64_t size, uint32_t epoch);

/* The instance's bytes in use over all its processes, or -1 when not registered. */
int64_t gate_memory_used(void);

#endif
