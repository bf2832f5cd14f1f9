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

struct dilu_board;
struct dilu_grant;
struct dilu_usage;
struct dilu_signal;

/* What this process reads and writes while registered and gating. */
struct gate_view {
    const struct dilu_board *board;
    const struct dilu_grant *grant;
    struct dilu_usage *usage;
    unsigned slot;
};

/* Fills `view` and returns 1 while registered and gating; else 0. */
int gate_view(struct gate_view *view);

/* Latency slot `index`'s signal, read-only (asked of the manager once per instance in the slot);
 * NULL when no latency instance is there or the manager did not say. */
const struct dilu_signal *gate_peer_signal(unsigned index);

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
