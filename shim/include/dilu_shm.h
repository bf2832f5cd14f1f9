/*
 * The shared-memory layout between a GPU's token manager and the shims of its instances.
 *
 * The manager creates one region per GPU (a memfd handed to each shim over the registration
 * socket with SCM_RIGHTS). Every field has exactly one writer, so neither side needs a lock:
 *   header.heartbeat_ns, header.refill_gen, slot.granted, slot.pid, slot.gen: the manager;
 *   slot.consumed, slot.launches, slot.blocked_ns, slot.mem_used: the shim (atomic adds).
 * A launch may proceed while consumed <= granted (both cumulative token counts).
 * The Python side (worker/tokens/region.py) mirrors these offsets; bump DILU_SHM_ABI on change.
 */
#ifndef DILU_SHM_H
#define DILU_SHM_H

#include <stdint.h>

#define DILU_SHM_MAGIC 0x554c4944u /* "DILU" little-endian */
#define DILU_SHM_ABI 1u
#define DILU_SHM_MAX_SLOTS 64u

struct dilu_shm_header {
    uint32_t magic;
    uint32_t abi;
    uint32_t slots;
    uint32_t period_us;
    int64_t heartbeat_ns;   /* CLOCK_MONOTONIC of the manager's last period */
    uint32_t refill_gen;    /* futex word: bumped after every refill */
    uint32_t reserved0;
    uint8_t pad[32];
};

struct dilu_slot {
    int32_t pid;
    uint32_t gen;
    int64_t granted;     /* cumulative tokens the instance may consume */
    int64_t consumed;    /* cumulative tokens charged by launches (may exceed granted: waiting) */
    int64_t launches;
    int64_t blocked_ns;  /* time launches spent waiting for tokens */
    int64_t mem_used;    /* bytes allocated through the shim */
    uint8_t pad[16];
};

_Static_assert(sizeof(struct dilu_shm_header) == 64, "header is one cache line");
_Static_assert(sizeof(struct dilu_slot) == 64, "slot is one cache line");

#define DILU_SHM_SIZE (sizeof(struct dilu_shm_header) + DILU_SHM_MAX_SLOTS * sizeof(struct dilu_slot))

#endif
