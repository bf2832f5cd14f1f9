/*
 * Background release. A GPU without MPS runs one process's kernels at a time, in the order they
 * were queued: a latency kernel waits behind whatever background work is already on the device,
 * and throttling how fast the background process launches does not shorten that queue. So a
 * batch instance's launches are released, not merely paced:
 * - hold: while any latency instance on the GPU serves a request (its server counts requests in
 *   its signal through the request API; this shim maps each latency slot's signal read-only), a
 *   batch launch waits; the end of the last request wakes it at once. The manager exempts a batch instance below its floor (DILU_SLOT_FLOOR), so
 *   training never starves under a saturating latency load.
 * - window: a batch process keeps at most slot.window tokens of launched but unfinished work on
 *   the device, tracked with events recorded after its launches (one kernel may always go).
 * So a latency request waits at most for one window of background work, and none after it
 * starts. Nothing here runs for latency instances or while no latency instance shares the GPU
 * (the manager then leaves the window unbounded and the latency mask empty): their launch path
 * is the token gate alone.
 */
#define _GNU_SOURCE
#include "release.h"

#include <linux/futex.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../include/dilu_shm.h"
#include "clock.h"
#include "gate.h"
#include "log.h"

#define RING 64                       /* events of one process's unfinished launches */
#define HOLD_POLL_NS 1000000          /* a held launch looks at its floor and the manager this often */

typedef CUresult (*event_create_fn)(CUevent *, unsigned int);
typedef CUresult (*event_record_fn)(CUevent, CUstream);
typedef CUresult (*event_fn)(CUevent);

static struct {
    pthread_mutex_t lock;
    CUevent events[RING];
    int64_t positions[RING];          /* tokens launched up to and including the event's launch */
    unsigned head, count;
    int64_t launched, completed;      /* tokens, while the window was bounded */
    int windowed;                     /* the window was bounded at this process's latest launch */
    CUevent fence;                    /* waited on once when the window becomes bounded */
    int resolved, disabled;
    event_create_fn create;
    event_record_fn record, record_ptsz;
    event_fn query, synchronize;
} track = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void forget_events_in_child(void) {
    /* The parent's events belong to its context; a child starts without any. */
    memset(&track, 0, sizeof(track));
    pthread_mutex_init(&track.lock, NULL);
}

void release_init(void) {
    pthread_atfork(NULL, NULL, forget_events_in_child);
}

static void stop_tracking(const char *why) {
    if (!track.disabled) {
        shim_log(LOG_WARN, "%s: this process's unfinished work is not bounded", why);
    }
    track.disabled = 1;
}

/* Caller holds the lock. */
static int resolve_events(void) {
    if (!track.resolved) {
        track.resolved = 1;
        track.create = (event_create_fn)driver_symbol("cuEventCreate");
        track.record = (event_record_fn)driver_symbol("cuEventRecord");
        track.record_ptsz = (event_record_fn)driver_symbol("cuEventRecord_ptsz");
        track.query = (event_fn)driver_symbol("cuEventQuery");
        track.synchronize = (event_fn)driver_symbol("cuEventSynchronize");
        if (!track.create || !track.record || !track.query || !track.synchronize) {
            stop_tracking("the driver has no event API");
        }
    }
    return !track.disabled;
}

/* Drops the events the device has passed. Caller holds the lock. */
static void poll_events(void) {
    while (track.count > 0) {
        CUresult result = track.query(track.events[track.head]);
        if (result == CUDA_ERROR_NOT_READY) {
            return;
        }
        track.completed = track.positions[track.head];   /* done, or broken: either way not waiting */
        track.head = (track.head + 1) % RING;
        track.count--;
    }
}

/* The window just became bounded (a latency instance arrived): what this process launched
 * before was not tracked, so it waits once for the stream's queue to drain, then tracks from
 * empty. Caller holds the lock; returns the event to wait for (NULL: nothing to wait for). */
static CUevent fence(CUstream stream, int ptsz) {
    track.windowed = 1;
    if (track.fence == NULL && track.create(&track.fence, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        stop_tracking("creating an event failed");
        return NULL;
    }
    event_record_fn record = ptsz && track.record_ptsz ? track.record_ptsz : track.record;
    return record(track.fence, stream) == CUDA_SUCCESS ? track.fence : NULL;
}

/* Whether a launch of `cost` on `stream` must wait for the window; if so, the event to wait for. */
static int window_full(CUstream stream, int ptsz, int64_t cost, int64_t window, CUevent *wait_for) {
    pthread_mutex_lock(&track.lock);
    int full = 0;
    if (resolve_events() && !track.windowed) {
        *wait_for = fence(stream, ptsz);
        full = *wait_for != NULL;
    } else if (resolve_events()) {
        poll_events();
        int64_t outstanding = track.launched - track.completed;
        if (track.count > 0 && (outstanding + cost > window || track.count == RING)) {
            /* The oldest event whose completion leaves room, else the newest. */
            unsigned index = (track.head + track.count - 1) % RING;
            for (unsigned k = 0; k < track.count; k++) {
                unsigned at = (track.head + k) % RING;
                if (track.launched - track.positions[at] + cost <= window) {
                    index = at;
                    break;
                }
            }
            *wait_for = track.events[index];
            full = 1;
        }
    }
    pthread_mutex_unlock(&track.lock);
    return full;
}

/* Whether a latency instance on the GPU serves a request; if so, the futex word of the first one
 * found and its value before its requests were counted (a wait on it ends when they end). */
static int latency_serving(const struct dilu_board *board, unsigned own, const uint32_t **word, uint32_t *value) {
    uint64_t mask = __atomic_load_n(&board->latency_mask, __ATOMIC_ACQUIRE) & ~(1ull << own);
    while (mask != 0) {
        unsigned index = (unsigned)__builtin_ctzll(mask);
        const struct dilu_signal *signal = gate_peer_signal(index);
        if (signal != NULL) {
            uint32_t generation = __atomic_load_n(&signal->release_gen, __ATOMIC_ACQUIRE);
            if (__atomic_load_n(&signal->inflight, __ATOMIC_ACQUIRE) > 0) {
                *word = &signal->release_gen;
                *value = generation;
                return 1;
            }
        }
        mask &= mask - 1;
    }
    return 0;
}

static void account_held(struct dilu_usage *usage, int64_t now, int64_t *since) {
    __atomic_fetch_add(&usage->held_ns, now - *since, __ATOMIC_RELAXED);
    *since = now;
}

void release_before(CUstream stream, int ptsz, int64_t cost) {
    struct gate_view view;
    if (!gate_view(&view) || (__atomic_load_n(&view.grant->flags, __ATOMIC_ACQUIRE) & DILU_SLOT_LATENCY)) {
        return;
    }
    int64_t held_since = 0;   /* only holds for latency work count as held: the floor's signal */
    for (;;) {
        int floor_due = (__atomic_load_n(&view.grant->flags, __ATOMIC_ACQUIRE) & DILU_SLOT_FLOOR) != 0;
        const uint32_t *word = NULL;
        uint32_t generation = 0;
        if (!floor_due && latency_serving(view.board, view.slot, &word, &generation)) {
            int64_t now = shim_now_ns();
            if (held_since == 0) held_since = now;
            if (gate_manager_gone(now)) break;
            account_held(view.usage, now, &held_since);
            struct timespec timeout = {.tv_sec = 0, .tv_nsec = HOLD_POLL_NS};
            syscall(SYS_futex, word, FUTEX_WAIT, generation, &timeout, NULL, 0);
            continue;
        }
        if (held_since != 0) {
            account_held(view.usage, shim_now_ns(), &held_since);
            held_since = 0;
        }
        int64_t window = __atomic_load_n(&view.grant->window, __ATOMIC_ACQUIRE);
        CUevent wait_for = NULL;
        if (window <= 0) {
            __atomic_store_n(&track.windowed, 0, __ATOMIC_RELAXED);   /* untracked from here */
            return;
        }
        if (!window_full(stream, ptsz, cost, window, &wait_for)) {
            return;
        }
        track.synchronize(wait_for);   /* no lock held: other threads may launch meanwhile */
    }
    if (held_since != 0) {
        account_held(view.usage, shim_now_ns(), &held_since);
    }
}

void release_after(CUstream stream, int ptsz, int64_t cost) {
    struct gate_view view;
    if (!gate_view(&view) || (__atomic_load_n(&view.grant->flags, __ATOMIC_ACQUIRE) & DILU_SLOT_LATENCY) ||
        __atomic_load_n(&view.grant->window, __ATOMIC_ACQUIRE) <= 0) {
        return;
    }
    pthread_mutex_lock(&track.lock);
    if (resolve_events()) {
        track.launched += cost;
        if (track.count < RING) {
            unsigned index = (track.head + track.count) % RING;
            CUresult result = CUDA_SUCCESS;
            if (track.events[index] == NULL) {
                result = track.create(&track.events[index], CU_EVENT_DISABLE_TIMING);
            }
            if (result == CUDA_SUCCESS) {
                event_record_fn record = ptsz && track.record_ptsz ? track.record_ptsz : track.record;
                result = record(track.events[index], stream);
            }
            if (result == CUDA_SUCCESS) {
                track.positions[index] = track.launched;
                track.count++;
            } else {
                stop_tracking("recording an event after a launch failed");
            }
        }
        __atomic_store_n(&view.usage->outstanding, track.launched - track.completed, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&track.lock);
}
