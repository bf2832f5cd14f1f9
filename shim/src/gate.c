/*
 * Token gate. Registration (first launch, and retries after the manager vanished) uses the
 * manager's Unix socket: HELLO, then the shared region's fd over SCM_RIGHTS. The fast path is
 * one atomic add on the slot's consumed counter and one load of granted: no system call.
 * When tokens run out the launch waits on the region's futex word, which the manager bumps
 * every period; if the manager's heartbeat goes stale the gate latches open and retries
 * registration every retry period.
 */
#define _GNU_SOURCE
#include "gate.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../include/dilu_shm.h"
#include "clock.h"
#include "config.h"
#include "log.h"
#include "release.h"

enum gate_state { GATE_UNREGISTERED = 0, GATE_ACTIVE = 1, GATE_OPEN = 2, GATE_OFF = 3 };

static struct {
    int state;                        /* enum gate_state, read with relaxed atomics */
    int sock;
    struct dilu_shm_header *header;
    struct dilu_slot *slot;
    struct dilu_proc *proc;
    uint32_t epoch;                   /* registrations so far: memory counted in an older region stays there */
    int64_t next_retry_ns;
    uint32_t launches_open;           /* launches since the gate latched open */
    int warned_open;
} gate = {.state = GATE_UNREGISTERED, .sock = -1, .epoch = GATE_MEMORY_LOCAL};

static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

static void next_epoch(void) {
    if (++gate.epoch <= GATE_MEMORY_LOCAL) {
        gate.epoch = GATE_MEMORY_LOCAL + 1; /* never one of the reserve results' special values */
    }
}

static int64_t now_ns(void) {
    return shim_now_ns();
}

static void forget_registration(void) {
    if (gate.sock >= 0) {
        close(gate.sock);
        gate.sock = -1;
    }
    if (gate.header != NULL) {
        munmap(gate.header, DILU_SHM_SIZE);
        gate.header = NULL;
    }
    gate.slot = NULL;
    gate.proc = NULL;
}

static void after_fork_in_child(void) {
    /* The child must not spend the parent's tokens nor share its socket: start afresh.
     * The parent's mapping stays mapped in the child but is no longer referenced. */
    if (gate.sock >= 0) {
        close(gate.sock);
    }
    gate.sock = -1;
    gate.header = NULL;
    gate.slot = NULL;
    gate.proc = NULL;
    next_epoch();
    gate.warned_open = 0;
    pthread_mutex_init(&register_lock, NULL);
    /* Registration decides again (gating off stays off: the configuration is inherited). */
    __atomic_store_n(&gate.state, GATE_UNREGISTERED, __ATOMIC_RELEASE);
}

void gate_init(void) {
    /* Unregistered until the first launch or allocation: only then is the configuration read
     * (config.c says why), and registration turns the gate off if there is no manager to use. */
    pthread_atfork(NULL, NULL, after_fork_in_child);
    release_init();
}

static int receive_fd(int sock, char *text, size_t size, int *fd) {
    struct iovec iov = {.iov_base = text, .iov_len = size - 1};
    char control[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof(control)};
    ssize_t got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (got <= 0) {
        return -1;
    }
    text[got] = '\0';
    *fd = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            memcpy(fd, CMSG_DATA(c), sizeof(int));
        }
    }
    return 0;
}

/* Connects, says HELLO and maps the region. Returns 0 on success. Caller holds register_lock. */
static int try_register(void) {
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        return -1;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, shim_cfg.socket_path, sizeof(addr.sun_path) - 1); /* both are 108 bytes, NUL-terminated */
    struct timeval timeout = {.tv_sec = 2, .tv_usec = 0};
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    if (connect(sock, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(sock);
        return -1;
    }
    char hello[160];
    int length = snprintf(hello, sizeof(hello), "HELLO %u %d %s\n", DILU_SHM_ABI, (int)getpid(),
                          shim_cfg.instance_id[0] ? shim_cfg.instance_id : "-");
    if (send(sock, hello, (size_t)length, MSG_NOSIGNAL) != length) {
        close(sock);
        return -1;
    }
    char reply[128];
    int fd = -1;
    unsigned slot_index = 0, generation = 0, proc_index = 0;
    if (receive_fd(sock, reply, sizeof(reply), &fd) != 0 || fd < 0 ||
        sscanf(reply, "OK %u %u %u", &slot_index, &generation, &proc_index) != 3 ||
        slot_index >= DILU_SHM_MAX_SLOTS || proc_index >= DILU_SHM_MAX_PROCS) {
        shim_log(LOG_WARN, "token manager refused registration: %.100s", reply);
        if (fd >= 0) {
            close(fd);
        }
        close(sock);
        return -1;
    }
    void *region = mmap(NULL, DILU_SHM_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (region == MAP_FAILED) {
        close(sock);
        return -1;
    }
    struct dilu_shm_header *header = region;
    if (header->magic != DILU_SHM_MAGIC || header->abi != DILU_SHM_ABI) {
        shim_log(LOG_WARN, "token region has abi %u (shim speaks %u); launches run ungated",
                 header->abi, DILU_SHM_ABI);
        munmap(region, DILU_SHM_SIZE);
        close(sock);
        return -1;
    }
    forget_registration();
    gate.sock = sock;
    gate.header = header;
    gate.slot = (struct dilu_slot *)((char *)region + DILU_SHM_SLOTS_OFFSET) + slot_index;
    gate.proc = (struct dilu_proc *)((char *)region + DILU_SHM_PROCS_OFFSET) + proc_index;
    next_epoch();
    /* Tokens charged before registration do not count against the new slot. */
    shim_log(LOG_INFO, "registered with the token manager (slot %u, process %u)", slot_index, proc_index);
    return 0;
}

static void open_gate(const char *why) {
    if (!gate.warned_open) {
        shim_log(LOG_WARN, "%s; launches run ungated until it is back", why);
        gate.warned_open = 1;
    }
    gate.next_retry_ns = now_ns() + shim_cfg.retry_ns;
    gate.launches_open = 0;
    __atomic_store_n(&gate.state, GATE_OPEN, __ATOMIC_RELEASE);
}

static void ensure_registered(int state) {
    config_settle();
    pthread_mutex_lock(&register_lock);
    if (__atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) == state) {
        if (!shim_cfg.socket_path[0] || shim_cfg.disabled) {
            __atomic_store_n(&gate.state, GATE_OFF, __ATOMIC_RELEASE);
        } else if (try_register() == 0) {
            gate.warned_open = 0;
            __atomic_store_n(&gate.state, GATE_ACTIVE, __ATOMIC_RELEASE);
        } else if (state == GATE_UNREGISTERED) {
            open_gate("no token manager");
        } else {
            gate.next_retry_ns = now_ns() + shim_cfg.retry_ns;
        }
    }
    pthread_mutex_unlock(&register_lock);
}

/* The credit at `now`: what was granted at the last rebase plus what has accrued since. */
static int64_t allowed_at(const struct dilu_slot *slot, int64_t now) {
    int64_t base = __atomic_load_n(&slot->granted, __ATOMIC_ACQUIRE);
    int64_t since = __atomic_load_n(&slot->granted_at_ns, __ATOMIC_ACQUIRE);
    int64_t rate = __atomic_load_n(&slot->rate_per_s, __ATOMIC_ACQUIRE);
    int64_t elapsed = now > since ? now - since : 0;
    return base + (int64_t)((__int128)rate * elapsed / 1000000000);
}

static void wait_for_tokens(struct dilu_slot *slot, int64_t position) {
    struct dilu_shm_header *header = gate.header;
    int64_t started = now_ns(), now = started;
    for (;;) {
        uint32_t generation = __atomic_load_n(&header->refill_gen, __ATOMIC_ACQUIRE);
        now = now_ns();
        int64_t allowed = allowed_at(slot, now);
        if (position <= allowed) {
            break;
        }
        if (now - __atomic_load_n(&header->heartbeat_ns, __ATOMIC_ACQUIRE) > shim_cfg.stale_ns) {
            open_gate("token manager stopped answering");
            break;
        }
        /* Sleep until enough tokens should have accrued (at most 2 ms); a refill or a slice
         * change wakes the futex earlier. */
        int64_t rate = __atomic_load_n(&slot->rate_per_s, __ATOMIC_ACQUIRE);
        int64_t wait_ns = rate > 0 ? (int64_t)((__int128)(position - allowed) * 1000000000 / rate) : 2000000;
        if (wait_ns > 2000000) wait_ns = 2000000;
        if (wait_ns < 10000) wait_ns = 10000;
        struct timespec timeout = {.tv_sec = 0, .tv_nsec = wait_ns};
        syscall(SYS_futex, &header->refill_gen, FUTEX_WAIT, generation, &timeout, NULL, 0);
    }
    if (now > started) {
        __atomic_fetch_add(&slot->blocked_ns, now - started, __ATOMIC_RELAXED);
    }
}

/* A latency instance serving a request never waits for tokens: its share bounds what it may
 * take (the manager forgives its debt), not when its work may start. */
static int serving_latency(const struct dilu_slot *slot) {
    return (__atomic_load_n(&slot->flags, __ATOMIC_RELAXED) & DILU_SLOT_LATENCY) &&
           __atomic_load_n(&slot->inflight, __ATOMIC_RELAXED) > 0;
}

void gate_charge(int64_t cost) {
    int state = __atomic_load_n(&gate.state, __ATOMIC_ACQUIRE);
    if (state == GATE_ACTIVE) {
        struct dilu_slot *slot = gate.slot;
        int64_t position = __atomic_add_fetch(&slot->consumed, cost, __ATOMIC_ACQ_REL);
        __atomic_fetch_add(&slot->launches, 1, __ATOMIC_RELAXED);
        if (position > __atomic_load_n(&slot->granted, __ATOMIC_ACQUIRE) && !serving_latency(slot)) {
            wait_for_tokens(slot, position); /* the slow path: only now is the clock read */
        }
        return;
    }
    if (state == GATE_OFF) {
        return;
    }
    if (state == GATE_UNREGISTERED) {
        ensure_registered(GATE_UNREGISTERED);
        if (__atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) == GATE_ACTIVE) {
            gate_charge(cost);
        }
        return;
    }
    /* GATE_OPEN: look at the clock only every 256 launches, then retry registration. */
    if ((++gate.launches_open & 255u) == 0 && now_ns() >= gate.next_retry_ns) {
        ensure_registered(GATE_OPEN);
    }
}

struct dilu_slot *gate_slot(struct dilu_shm_header **header) {
    if (__atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) != GATE_ACTIVE) {
        return NULL;
    }
    *header = gate.header;
    return gate.slot;
}

int gate_manager_gone(int64_t now) {
    if (now - __atomic_load_n(&gate.header->heartbeat_ns, __ATOMIC_ACQUIRE) <= shim_cfg.stale_ns) {
        return 0;
    }
    open_gate("token manager stopped answering");
    return 1;
}

void gate_request(int delta) {
    if (__atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) == GATE_UNREGISTERED) {
        ensure_registered(GATE_UNREGISTERED);   /* a request may come before the first launch */
    }
    if (__atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) != GATE_ACTIVE) {
        return;
    }
    int32_t now_serving = __atomic_add_fetch(&gate.slot->inflight, delta, __ATOMIC_ACQ_REL);
    if (delta < 0 && now_serving <= 0) {
        /* The last request ended: held background launches may go on at once. */
        __atomic_fetch_add(&gate.header->release_gen, 1, __ATOMIC_ACQ_REL);
        syscall(SYS_futex, &gate.header->release_gen, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
    }
}

uint32_t gate_memory_reserve(int64_t size, int64_t limit) {
    int state = __atomic_load_n(&gate.state, __ATOMIC_ACQUIRE);
    if (state == GATE_UNREGISTERED) {
        ensure_registered(GATE_UNREGISTERED); /* memory is often allocated before the first launch */
        state = __atomic_load_n(&gate.state, __ATOMIC_ACQUIRE);
    }
    if (state != GATE_ACTIVE) {
        return GATE_MEMORY_LOCAL;
    }
    struct dilu_slot *slot = gate.slot;
    int64_t after = __atomic_add_fetch(&slot->mem_used, size, __ATOMIC_ACQ_REL) -
                    __atomic_load_n(&slot->mem_returned, __ATOMIC_ACQUIRE);
    if (limit > 0 && after > limit) {
        __atomic_sub_fetch(&slot->mem_used, size, __ATOMIC_ACQ_REL);
        shim_log(LOG_INFO, "allocation of %lld bytes refused: the instance's slice is %lld bytes, %lld in use",
                 (long long)size, (long long)limit, (long long)(after - size));
        return GATE_MEMORY_REFUSED;
    }
    __atomic_add_fetch(&gate.proc->mem_used, size, __ATOMIC_ACQ_REL);
    return gate.epoch;
}

void gate_memory_release(int64_t size, uint32_t epoch) {
    if (epoch == gate.epoch && __atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) == GATE_ACTIVE) {
        __atomic_sub_fetch(&gate.slot->mem_used, size, __ATOMIC_ACQ_REL);
        __atomic_sub_fetch(&gate.proc->mem_used, size, __ATOMIC_ACQ_REL);
    }
}

int64_t gate_memory_used(void) {
    if (__atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) != GATE_ACTIVE) {
        return -1;
    }
    return __atomic_load_n(&gate.slot->mem_used, __ATOMIC_ACQUIRE) -
           __atomic_load_n(&gate.slot->mem_returned, __ATOMIC_ACQUIRE);
}
