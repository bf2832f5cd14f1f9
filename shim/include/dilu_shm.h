/*
 * The shared memory between a GPU's token manager and the shims of its instances.
 *
 * Nothing is shared that one instance could use against another: each mapping is a memfd of its
 * own, handed over the instance's registration socket with SCM_RIGHTS, and the kernel enforces
 * who may write it.
 *   board   one per GPU, sealed read-only for everyone but the manager: heartbeat, the refill
 *           futex, the latency mask and each slot's generation. No pids, no counters.
 *   grant   one per instance, sealed read-only for it: its credit, rate, flags, window and the
 *           memory its exited processes gave back. Written by the manager alone.
 *   usage   one per instance, read-write for its processes only: what they consumed and
 *           launched, waited and were held, their memory (in all and per process). The manager
 *           reads it and bounds what it reads: a counter an instance writes can hurt only it.
 *   signal  one per instance: requests in flight and the release futex, written by the
 *           instance's server through the shim's request API. A batch instance's shim asks the
 *           manager for a latency slot's signal ("SIGNAL <slot>" on its socket; the answer
 *           "SIG <slot> <gen>" brings a read-only descriptor, "NOSIG <slot>" says it is no latency
 *           slot) and maps it read-only.
 * A slot is an instance: every process of it (forked children, spawned workers) registers with
 * the instance's id and gets the same grant, usage and signal, so they draw from one budget and
 * one memory counter; each process has an entry in usage.proc_mem, which the manager returns to
 * the instance (grant.mem_returned) when the process exits. A slot used again by a later
 * instance gets fresh memfds and a new generation, so nothing an earlier one kept reaches it.
 * The instance's memory in use is usage.mem_used - grant.mem_returned.
 * Tokens accrue continuously: at time t an instance may have consumed up to
 *   granted + rate_per_s * (t - granted_at_ns) / 1e9
 * The manager rebases (granted, granted_at_ns, rate_per_s) every period, capping what an idle
 * instance can bank at one period's worth. The launch fast path only compares consumed with
 * granted; the clock is read only when that credit is used up.
 * Isolation (release.c): the manager marks latency instances in board.latency_mask and their
 * grant flags; a batch instance's shim holds its launches while any of those instances has a
 * request in flight (unless the manager set DILU_SLOT_FLOOR: its floor is due) and keeps at most
 * `window` tokens of its launched work unfinished on the device. A latency instance whose last
 * request ends bumps its signal's release_gen and wakes that futex, so held launches go on at once.
 * The Python side (worker/tokens/region.py) mirrors these layouts; bump DILU_SHM_ABI on change.
 */
#ifndef DILU_SHM_H
#define DILU_SHM_H

#include <stdint.h>

#define DILU_SHM_MAGIC 0x554c4944u /* "DILU" little-endian */
#define DILU_SHM_ABI 5u
#define DILU_SHM_MAX_SLOTS 64u
#define DILU_SHM_MAX_PROCS 32u     /* processes of one instance registered at once */
#define DILU_SHM_PAGE 4096u        /* the size of each memfd */

struct dilu_board {
    uint32_t magic;
    uint32_t abi;
    uint32_t slots;
    uint32_t period_us;
    int64_t heartbeat_ns;   /* CLOCK_MONOTONIC of the manager's last period */
    uint32_t refill_gen;    /* futex word: bumped after every refill */
    uint32_t reserved0;
    uint64_t latency_mask;  /* bit i: slot i is a latency instance's */
    uint8_t pad[24];
    uint32_t slot_gen[DILU_SHM_MAX_SLOTS];   /* the generation of each slot's current instance */
};

#define DILU_SLOT_LATENCY 1u  /* never waits for tokens while it has a request in flight */
#define DILU_SLOT_FLOOR 2u    /* a batch instance below its floor: not held for latency work */

struct dilu_grant {
    uint32_t gen;
    uint32_t flags;       /* DILU_SLOT_* */
    int64_t granted;      /* cumulative tokens the instance could consume at granted_at_ns */
    int64_t granted_at_ns;
    int64_t rate_per_s;   /* tokens accruing per second (the share x the GPU's capacity) */
    int64_t window;       /* tokens a batch process may have unfinished on the device; 0: unbounded */
    int64_t mem_returned; /* bytes of exited processes that usage.mem_used still counts */
    int64_t reserved[2];
};

struct dilu_usage {
    int64_t consumed;     /* cumulative tokens charged by launches (may exceed granted: waiting) */
    int64_t launches;
    int64_t blocked_ns;   /* time launches spent waiting for tokens */
    int64_t held_ns;      /* time launches were held for latency work */
    int64_t mem_used;     /* bytes allocated through the shim */
    int64_t outstanding;  /* tokens unfinished on the device after the latest launch (telemetry) */
    int64_t reserved[2];
    int64_t proc_mem[DILU_SHM_MAX_PROCS];   /* bytes each registered process holds */
};

struct dilu_signal {
    int32_t inflight;     /* requests the instance is serving */
    uint32_t release_gen; /* futex word: bumped when its last request ends */
    int64_t reserved[7];
};

_Static_assert(sizeof(struct dilu_board) == 64 + 4 * DILU_SHM_MAX_SLOTS, "board");
_Static_assert(sizeof(struct dilu_grant) == 64, "grant is one cache line");
_Static_assert(sizeof(struct dilu_usage) == 64 + 8 * DILU_SHM_MAX_PROCS, "usage");
_Static_assert(sizeof(struct dilu_signal) == 64, "signal is one cache line");

#endif
