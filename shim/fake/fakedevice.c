/*
 * The fake device's scheduling, shared by every process of one simulated GPU (fakeclock.h).
 *
 * Two models, chosen by the first process to open the clock file (DILU_FAKE_SCHED):
 * - fifo (the default): one queue for the whole device. Each kernel runs after everything any
 *   process queued before it; a kernel's end is known when it is launched.
 * - timeslice: what a GPU without MPS does. Each process is a context with its own queue; one
 *   context runs at a time. A context keeps the device while it has work, for at most a
 *   timeslice (DILU_FAKE_TIMESLICE_US) when another context has work too, and is switched out
 *   at once when it runs dry. Its timeslice restarts every slice length while it runs alone, so
 *   work that arrives from another context waits for the rest of the current slice, as the
 *   hardware's runlist scheduler makes it. Kernels are preempted at slice ends (compute
 *   preemption). Nothing decides the schedule ahead: whoever touches the device (a launch, a
 *   query, a wait) first runs the simulation up to the present under the clock's lock. Work
 *   arriving later cannot change the past, so the result is exact.
 * In both, a process may have at most DILU_FAKE_QUEUE_NS of work outstanding (a real launch
 * queue is bounded too): a launch past that waits.
 */
#define _GNU_SOURCE
#include "fakedevice.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fakeclock.h"

#define CLOCK_INITIALISING 1u

static struct {
    int64_t queue_ns;
    struct device_clock *clock;
    struct device_clock local;
} device;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Waits wake within microseconds, as a real synchronisation (which spins) returns: the
 * kernel's default timer slack (50 us) would add its own delay to every wait on the device. */
static void sleep_until(int64_t deadline) {
    static __thread int precise;
    if (!precise) {
        prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
        precise = 1;
    }
    struct timespec ts = {.tv_sec = deadline / 1000000000LL, .tv_nsec = deadline % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static int64_t env_int(const char *name, int64_t fallback) {
    const char *value = getenv(name);
    return value != NULL && *value ? strtoll(value, NULL, 10) : fallback;
}

static int pid_gone(int32_t pid) {
    return pid != 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

/* The first process to see the file fills its header; the others wait for the magic. A file
 * left by an older layout (any other first word) is started afresh. */
static void initialise_clock(struct device_clock *clock) {
    for (;;) {
        uint32_t seen = __atomic_load_n(&clock->magic, __ATOMIC_ACQUIRE);
        if (seen == FAKE_CLOCK_MAGIC) {
            return;
        }
        if (seen == CLOCK_INITIALISING) {
            sched_yield();
            continue;
        }
        if (__atomic_compare_exchange_n(&clock->magic, &seen, CLOCK_INITIALISING, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            memset((char *)clock + sizeof(clock->magic), 0, sizeof(*clock) - sizeof(clock->magic));
            const char *sched = getenv("DILU_FAKE_SCHED");
            clock->sched = sched != NULL && strcmp(sched, "timeslice") == 0 ? FAKE_SCHED_TIMESLICE : FAKE_SCHED_FIFO;
            clock->slice_ns = env_int("DILU_FAKE_TIMESLICE_US", 2000) * 1000;
            if (clock->slice_ns <= 0) clock->slice_ns = 2000000;
            clock->current = -1;
            __atomic_store_n(&clock->magic, FAKE_CLOCK_MAGIC, __ATOMIC_RELEASE);
            return;
        }
    }
}

void device_open(void) {
    device.queue_ns = env_int("DILU_FAKE_QUEUE_NS", 20000000);
    device.clock = &device.local;
    const char *path = getenv("DILU_FAKE_CLOCK");
    if (path != NULL && *path) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0 && ftruncate(fd, sizeof(struct device_clock)) == 0) {
            void *shared = mmap(NULL, sizeof(struct device_clock), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (shared != MAP_FAILED) {
                device.clock = shared;
            }
        }
        if (fd >= 0) {
            close(fd);
        }
    }
    initialise_clock(device.clock);
}

/* ---- the timeslice model's lock: a pid in the clock, taken over from a process that died ---- */
static void lock_clock(void) {
    int32_t me = (int32_t)getpid();
    for (unsigned spins = 0;; spins++) {
        int32_t holder = 0;
        if (__atomic_compare_exchange_n(&device.clock->lock, &holder, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            return;
        }
        if ((spins & 1023u) == 1023u && pid_gone(holder)) {
            __atomic_compare_exchange_n(&device.clock->lock, &holder, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
        }
        sched_yield();
    }
}

static void unlock_clock(void) {
    __atomic_store_n(&device.clock->lock, 0, __ATOMIC_RELEASE);
}

/* This process's entry (claimed on first use, again after a fork); a dead process's entry is
 * taken over. NULL when the table is full. */
static struct fake_process_time *own_entry(int *index) {
    static struct fake_process_time *entry;
    static int entry_index;
    static pid_t owner;
    pid_t pid = getpid();
    if (entry != NULL && owner == pid) {
        *index = entry_index;
        return entry;
    }
    entry = NULL;
    struct device_clock *clock = device.clock;
    for (int pass = 0; pass < 2 && entry == NULL; pass++) {
        for (int i = 0; i < FAKE_CLOCK_PROCS && entry == NULL; i++) {
            struct fake_process_time *slot = &clock->processes[i];
            int32_t seen = __atomic_load_n(&slot->pid, __ATOMIC_ACQUIRE);
            int usable = pass == 0 ? seen == 0 : pid_gone(seen);
            if (usable && __atomic_compare_exchange_n(&slot->pid, &seen, (int32_t)pid, 0, __ATOMIC_ACQ_REL,
                                                      __ATOMIC_ACQUIRE)) {
                entry = slot;
                entry_index = i;
            }
        }
    }
    owner = pid;
    if (entry != NULL) {
        int timeslice = clock->sched == FAKE_SCHED_TIMESLICE;
        if (timeslice) lock_clock();
        entry->queued_ns = entry->done_ns = entry->peak_outstanding_ns = 0;
        __atomic_store_n(&entry->busy_ns, 0, __ATOMIC_RELEASE);
        if (entry_index + 1 > clock->used) clock->used = entry_index + 1;
        if (timeslice) unlock_clock();
    }
    *index = entry_index;
    return entry;
}

/* ---- the timeslice model's simulation ---- */
struct sim {
    int used;
    int current;
    int64_t t;
    int64_t slice_started;
    int64_t slice;
    int64_t pending[FAKE_CLOCK_PROCS];
    int64_t ran[FAKE_CLOCK_PROCS];
};

static void sim_load(struct sim *s) {
    const struct device_clock *clock = device.clock;
    s->used = clock->used;
    s->current = clock->current;
    s->t = clock->advanced_ns;
    s->slice_started = clock->slice_started_ns;
    s->slice = clock->slice_ns;
    for (int i = 0; i < s->used; i++) {
        const struct fake_process_time *p = &clock->processes[i];
        s->pending[i] = p->queued_ns - p->done_ns;
        s->ran[i] = 0;
    }
}

static void sim_commit(const struct sim *s) {
    struct device_clock *clock = device.clock;
    int64_t total = 0;
    for (int i = 0; i < s->used; i++) {
        if (s->ran[i] > 0) {
            clock->processes[i].done_ns += s->ran[i];
            __atomic_fetch_add(&clock->processes[i].busy_ns, s->ran[i], __ATOMIC_RELEASE);
            total += s->ran[i];
        }
    }
    __atomic_fetch_add(&clock->busy_total_ns, total, __ATOMIC_RELAXED);
    clock->current = s->current;
    clock->advanced_ns = s->t;
    clock->slice_started_ns = s->slice_started;
}

/* The next context with work after `after`, round robin (`after` itself last); -1: none. */
static int next_runnable(const struct sim *s, int after) {
    for (int step = 1; step <= s->used; step++) {
        int i = ((after < 0 ? -1 : after) + step) % s->used;
        if (s->pending[i] > 0) return i;
    }
    return -1;
}

static int others_runnable(const struct sim *s, int current) {
    for (int i = 0; i < s->used; i++) {
        if (i != current && s->pending[i] > 0) return 1;
    }
    return 0;
}

/* Runs the schedule up to `until`, stopping early once context `who` has at most `left` pending
 * (then returns that moment). Returns -1 when `who` is -1 or was not reached. */
static int64_t sim_run(struct sim *s, int64_t until, int who, int64_t left) {
    if (s->t <= 0) s->t = until;      /* a fresh device starts now */
    while (s->t < until) {
        if (who >= 0 && s->pending[who] <= left) return s->t;
        int current = s->current;
        if (current < 0 || current >= s->used || s->pending[current] <= 0) {
            int next = next_runnable(s, current);
            if (next < 0) {
                s->current = -1;
                s->t = until;         /* idle until the next submit */
                break;
            }
            s->current = current = next;
            s->slice_started = s->t;
        }
        int64_t span = until - s->t;
        if (span > s->pending[current]) span = s->pending[current];
        if (who == current && span > s->pending[who] - left) span = s->pending[who] - left;
        if (others_runnable(s, current)) {
            int64_t slice_end = s->slice_started + s->slice;
            if (slice_end <= s->t) {  /* its slice is over: the next context's turn */
                s->current = next_runnable(s, current);
                s->slice_started = s->t;
                continue;
            }
            if (span > slice_end - s->t) span = slice_end - s->t;
        }
        s->pending[current] -= span;
        s->ran[current] += span;
        s->t += span;
        if (s->slice > 0 && !others_runnable(s, current) && s->t - s->slice_started >= s->slice) {
            s->slice_started += (s->t - s->slice_started) / s->slice * s->slice;   /* alone: slices renew */
        }
    }
    return who >= 0 && s->pending[who] <= left ? s->t : -1;
}

/* Brings the shared simulation up to `now`. Caller holds the clock's lock. */
static void advance_to(int64_t now, struct sim *s) {
    sim_load(s);
    if (now > s->t) {
        sim_run(s, now, -1, 0);
        sim_commit(s);
    }
}

static int64_t timeslice_submit(int64_t duration_ns) {
    int index = 0;
    struct fake_process_time *mine = own_entry(&index);
    if (mine == NULL) return 0;
    static __thread struct sim s;
    lock_clock();
    advance_to(now_ns(), &s);
    mine->queued_ns += duration_ns;
    int64_t outstanding = mine->queued_ns - mine->done_ns, mark = mine->queued_ns;
    if (outstanding > mine->peak_outstanding_ns) mine->peak_outstanding_ns = outstanding;
    unlock_clock();
    if (outstanding > device.queue_ns) {
        device_wait(mark - device.queue_ns);   /* the launch queue is full: wait for room */
    }
    return mark;
}

static int timeslice_reached(int64_t mark) {
    int index = 0;
    struct fake_process_time *mine = own_entry(&index);
    if (mine == NULL) return 1;
    static __thread struct sim s;
    lock_clock();
    advance_to(now_ns(), &s);
    int reached = mine->done_ns >= mark;
    unlock_clock();
    return reached;
}

static void timeslice_wait(int64_t mark) {
    int index = 0;
    struct fake_process_time *mine = own_entry(&index);
    if (mine == NULL) return;
    static __thread struct sim s;
    for (;;) {
        int64_t now = now_ns();
        lock_clock();
        advance_to(now, &s);
        if (mine->done_ns >= mark) {
            unlock_clock();
            return;
        }
        /* When it will be done if nothing else arrives (a dry run); arrivals only delay it, so
         * sleeping until then and looking again is never late. */
        int64_t left = mine->queued_ns - mark;
        int64_t at = sim_run(&s, now + 1000000000LL, index, left);
        unlock_clock();
        sleep_until(at > now ? at : now + 1000000);
    }
}

/* ---- the fifo model ---- */
static int64_t fifo_submit(int64_t duration_ns) {
    int index = 0;
    int64_t now = now_ns(), busy, end;
    do {
        busy = __atomic_load_n(&device.clock->busy_until_ns, __ATOMIC_ACQUIRE);
        end = (busy > now ? busy : now) + duration_ns;
    } while (!__atomic_compare_exchange_n(&device.clock->busy_until_ns, &busy, end, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    __atomic_fetch_add(&device.clock->busy_total_ns, duration_ns, __ATOMIC_RELAXED);
    struct fake_process_time *mine = own_entry(&index);
    if (mine != NULL) {
        __atomic_fetch_add(&mine->busy_ns, duration_ns, __ATOMIC_RELAXED);
        if (end - now > mine->peak_outstanding_ns) mine->peak_outstanding_ns = end - now;
    }
    if (end - now > device.queue_ns) {
        sleep_until(end - device.queue_ns); /* the launch queue is full: wait for room */
    }
    return end;
}

int64_t device_submit(int64_t duration_ns) {
    if (duration_ns <= 0) return 0;
    return device.clock->sched == FAKE_SCHED_TIMESLICE ? timeslice_submit(duration_ns) : fifo_submit(duration_ns);
}

int device_reached(int64_t mark) {
    if (mark <= 0) return 1;
    return device.clock->sched == FAKE_SCHED_TIMESLICE ? timeslice_reached(mark) : now_ns() >= mark;
}

void device_wait(int64_t mark) {
    if (mark <= 0) return;
    if (device.clock->sched == FAKE_SCHED_TIMESLICE) {
        timeslice_wait(mark);
    } else {
        sleep_until(mark);
    }
}

int64_t device_peak_outstanding(void) {
    int index = 0;
    struct fake_process_time *mine = own_entry(&index);
    return mine != NULL ? __atomic_load_n(&mine->peak_outstanding_ns, __ATOMIC_ACQUIRE) : 0;
}
