/*
 * The shared-memory layout between a GPU's token manager and the shims of its instances.
 *
 * The manager creates one region per GPU (a memfd handed to each shim over the registration
 * socket with SCM_RIGHTS). A slot is an instance: every process of it (forked children, spawned
 * workers) registers with the instance's id and shares the slot, so they draw from one budget
 * and one memory counter. Each process also has a process entry with its own memory, which the
 * manager returns to the instance when the process exits.
 * Every field has one kind of writer, so neither side needs a lock:
 *   header.heartbeat_ns, header.refill_gen, header.latency_mask, slot.granted, .granted_at_ns,
 *   .rate_per_s, .pid, .gen, .mem_returned, .processes, .flags, .window, proc.pid, proc.slot:
 *   the manager;
 *   slot.consumed, slot.launches, slot.blocked_ns, slot.mem_used, slot.held_ns: the instance's
 *   shims (atomic adds); slot.outstanding: the latest launching shim; slot.inflight: the
 *   instance's server, through the shim's request API (atomic adds); header.release_gen: every
 *   latency instance's shim (atomic adds); proc.mem_used: that process's shim.
 * The instance's memory in use is slot.mem_used - slot.mem_returned.
 * Tokens accrue continuously: at time t an instance may have consumed up to
 *   granted + rate_per_s * (t - granted_at_ns) / 1e9
 * The manager rebases (granted, granted_at_ns, rate_per_s) every period, capping what an idle
 * instance can bank at one period's worth. The launch fast path only compares consumed with
 * granted; the clock is read only when that credit is used up.
 * Isolation (release.c): the manager marks latency instances' slots in latency_mask and their
 * flags; a batch instance's shim holds its launches while any of those slots has a request in
 * flight (unless the manager set DILU_SLOT_FLOOR: its floor is due) and keeps at most `window`
 * tokens of its launched work unfinished on the device. A latency instance whose last request
 * ends bumps release_gen and wakes its futex, so held launches go on at once.
 * The Python side (worker/tokens/region.py) mirrors these offsets; bump DILU_SHM_ABI on change.
 */
#ifndef DILU_SHM_H
#define DILU_SHM_H

#include <stdint.h>

#define DILU_SHM_MAGIC 0x554c4944u /* "DILU" little-endian */
#define DILU_SHM_ABI 4u
#define DILU_SHM_MAX_SLOTS 64u
#define DILU_SHM_MAX_PROCS 256u

struct dilu_shm_header {
    uint32_t magic;
    uint32_t abi;
    uint32_t slots;
    uint32_t period_us;
    int64_t heartbeat_ns;   /* CLOCK_MONOTONIC of the manager's last period */
    uint32_t refill_gen;    /* futex word: bumped after every refill */
    uint32_t release_gen;   /* futex word: bumped when a latency instance's last request ends */
    uint64_t latency_mask;  /* bit i: slot i is a latency instance's */
    uint8_t pad[24];
};

#define DILU_SLOT_LATENCY 1u  /* never waits for tokens while it has a request in flight */
#define DILU_SLOT_FLOOR 2u    /* a batch instance below its floor: not held for latency work */

struct dilu_slot {
    int32_t pid;
    uint32_t gen;
    int64_t granted;     /* cumulative tokens the instance could consume at granted_at_ns */
    int64_t consumed;    /* cumulative tokens charged by launches (may exceed granted: waiting) */
    int64_t launches;
    int64_t blocked_ns;  /* time launches spent waiting for tokens */
    int64_t mem_used;    /* bytes allocated through the shim */
    int64_t rate_per_s;  /* tokens accruing per second (the share x the GPU's capacity) */
    int64_t granted_at_ns;
    int64_t mem_returned; /* bytes of exited processes that mem_used still counts */
    int32_t processes;    /* live processes registered in the slot */
    uint32_t flags;       /* DILU_SLOT_* */
    int64_t window;       /* tokens a batch process may have unfinished on the device; 0: unbounded */
    int64_t held_ns;      /* time launches were held for latency work */
    int64_t outstanding;  /* tokens unfinished on the device after the latest launch (telemetry) */
    int32_t inflight;     /* requests the instance is serving */
    uint32_t reserved0;
    int64_t reserved[2];
};

struct dilu_proc {
    int32_t pid;
    uint32_t slot;
    int64_t mem_used;    /* bytes this process holds (its share of slot.mem_used) */
};

_Static_assert(sizeof(struct dilu_shm_header) == 64, "header is one cache line");
_Static_assert(sizeof(struct dilu_slot) == 128, "slot is two cache lines");
_Static_assert(sizeof(struct dilu_proc) == 16, "process entry");

#define DILU_SHM_SLOTS_OFFSET sizeof(struct dilu_shm_header)
#define DILU_SHM_PROCS_OFFSET (DILU_SHM_SLOTS_OFFSET + DILU_SHM_MAX_SLOTS * sizeof(struct dilu_slot))
#define DILU_SHM_SIZE (DILU_SHM_PROCS_OFFSET + DILU_SHM_MAX_PROCS * sizeof(struct dilu_proc))

#endif
