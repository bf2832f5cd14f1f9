/*
 * Token gate. Registration (first launch, and retries after the manager vanished) uses the
 * instance's own socket to the manager: HELLO, then four memfds over SCM_RIGHTS (the GPU's
 * board and the instance's grant, both read-only, its usage and its signal; dilu_shm.h). The
 * fast path is one atomic add on the usage's consumed counter and one load of the grant's
 * credit: no system call. When tokens run out the launch waits on the board's futex word, which
 * the manager bumps every period; if the manager's heartbeat goes stale the gate latches open
 * and retries registration every retry period. A latency slot's signal is asked for on the same
 * socket when a batch launch first needs it (gate_peer_signal).
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
    struct dilu_board *board;         /* read-only */
    struct dilu_grant *grant;         /* read-only */
    struct dilu_usage *usage;
    struct dilu_signal *signal;
    unsigned slot;
    unsigned proc;                    /* this process's entry in usage.proc_mem */
    uint32_t epoch;                   /* registrations so far: memory counted in an older region stays there */
    int64_t next_retry_ns;
    uint32_t launches_open;           /* launches since the gate latched open */
    int warned_open;
} gate = {.state = GATE_UNREGISTERED, .sock = -1, .epoch = GATE_MEMORY_LOCAL};

static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

/* Latency slots' signals, mapped read-only once asked for. A mapping is replaced in place
 * (MAP_FIXED) when its slot gets a new instance, so a reader never touches an unmapped page. */
static struct {
    struct dilu_signal *map;          /* the page, once mapped; never unmapped */
    const struct dilu_signal *current; /* map, or NULL: no latency instance in the slot */
    uint32_t gen;                     /* the slot generation `current` is for */
    int known;
} peers[DILU_SHM_MAX_SLOTS];
static pthread_mutex_t peers_lock = PTHREAD_MUTEX_INITIALIZER;

static void *map_page(int fd, int writable) {
    void *page = mmap(NULL, DILU_SHM_PAGE, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    return page == MAP_FAILED ? NULL : page;
}

static void unmap_page(void *page) {
    if (page != NULL) {
        munmap(page, DILU_SHM_PAGE);
    }
}

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
    unmap_page(gate.board);
    unmap_page(gate.grant);
    unmap_page(gate.usage);
    unmap_page(gate.signal);
    gate.board = NULL;
    gate.grant = NULL;
    gate.usage = NULL;
    gate.signal = NULL;
    for (unsigned i = 0; i < DILU_SHM_MAX_SLOTS; i++) {
        __atomic_store_n(&peers[i].known, 0, __ATOMIC_RELEASE);   /* asked again of the new manager */
    }
}

static void after_fork_in_child(void) {
    /* The child must not spend the parent's tokens nor share its socket: start afresh.
     * The parent's mappings stay mapped in the child but are no longer referenced. */
    if (gate.sock >= 0) {
        close(gate.sock);
    }
    gate.sock = -1;
    gate.board = NULL;
    gate.grant = NULL;
    gate.usage = NULL;
    gate.signal = NULL;
    for (unsigned i = 0; i < DILU_SHM_MAX_SLOTS; i++) {
        peers[i].known = 0;
    }
    pthread_mutex_init(&peers_lock, NULL);
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

/* One message and the descriptors it carries (up to `most`; the rest of `fds` is -1). */
static int receive_fds(int sock, char *text, size_t size, int *fds, int most) {
    struct iovec iov = {.iov_base = text, .iov_len = size - 1};
    char control[CMSG_SPACE(4 * sizeof(int))];
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof(control)};
    for (int i = 0; i < most; i++) {
        fds[i] = -1;
    }
    ssize_t got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (got <= 0) {
        return -1;
    }
    text[got] = '\0';
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            int received[4];
            memcpy(received, CMSG_DATA(c), (size_t)(count < 4 ? count : 4) * sizeof(int));
            for (int i = 0; i < count && i < 4; i++) {
                if (i < most) {
                    fds[i] = received[i];
                } else {
                    close(received[i]);
                }
            }
        }
    }
    return 0;
}

static void close_all(int *fds, int count) {
    for (int i = 0; i < count; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
}

/* Connects, says HELLO and maps what the manager hands over. Returns 0 on success. Caller
 * holds register_lock. */
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
    char reply[160] = "";
    int fds[4];
    unsigned slot_index = 0, generation = 0, proc_index = 0;
    if (receive_fds(sock, reply, sizeof(reply), fds, 4) != 0 || fds[3] < 0 ||
        sscanf(reply, "OK %u %u %u", &slot_index, &generation, &proc_index) != 3 ||
        slot_index >= DILU_SHM_MAX_SLOTS || proc_index >= DILU_SHM_MAX_PROCS) {
        shim_log(LOG_WARN, "token manager refused registration: %.120s", reply[0] ? reply : "no answer");
        close_all(fds, 4);
        close(sock);
        return -1;
    }
    struct dilu_board *board = map_page(fds[0], 0);
    struct dilu_grant *grant = map_page(fds[1], 0);
    struct dilu_usage *usage = map_page(fds[2], 1);
    struct dilu_signal *signal = map_page(fds[3], 1);
    close_all(fds, 4);
    if (board == NULL || grant == NULL || usage == NULL || signal == NULL ||
        board->magic != DILU_SHM_MAGIC || board->abi != DILU_SHM_ABI) {
        shim_log(LOG_WARN, "token manager's memory is not abi %u; launches run ungated", DILU_SHM_ABI);
        unmap_page(board);
        unmap_page(grant);
        unmap_page(usage);
        unmap_page(signal);
        close(sock);
        return -1;
    }
    forget_registration();
    gate.sock = sock;
    gate.board = board;
    gate.grant = grant;
    gate.usage = usage;
    gate.signal = signal;
    gate.slot = slot_index;
    gate.proc = proc_index;
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
static int64_t allowed_at(const struct dilu_grant *grant, int64_t now) {
    int64_t base = __atomic_load_n(&grant->granted, __ATOMIC_ACQUIRE);
    int64_t since = __atomic_load_n(&grant->granted_at_ns, __ATOMIC_ACQUIRE);
    int64_t rate = __atomic_load_n(&grant->rate_per_s, __ATOMIC_ACQUIRE);
    int64_t elapsed = now > since ? now - since : 0;
    return base + (int64_t)((__int128)rate * elapsed / 1000000000);
}

static void wait_for_tokens(int64_t position) {
    struct dilu_board *board = gate.board;
    const struct dilu_grant *grant = gate.grant;
    int64_t started = now_ns(), now = started;
    for (;;) {
        uint32_t generation = __atomic_load_n(&board->refill_gen, __ATOMIC_ACQUIRE);
        now = now_ns();
        int64_t allowed = allowed_at(grant, now);
        if (position <= allowed) {
            break;
        }
        if (now - __atomic_load_n(&board->heartbeat_ns, __ATOMIC_ACQUIRE) > shim_cfg.stale_ns) {
            open_gate("token manager stopped answering");
            break;
        }
        /* Sleep until enough tokens should have accrued (at most 2 ms); a refill or a slice
         * change wakes the futex earlier. */
        int64_t rate = __atomic_load_n(&grant->rate_per_s, __ATOMIC_ACQUIRE);
        int64_t wait_ns = rate > 0 ? (int64_t)((__int128)(position - allowed) * 1000000000 / rate) : 2000000;
        if (wait_ns > 2000000) wait_ns = 2000000;
        if (wait_ns < 10000) wait_ns = 10000;
        struct timespec timeout = {.tv_sec = 0, .tv_nsec = wait_ns};
        syscall(SYS_futex, &board->refill_gen, FUTEX_WAIT, generation, &timeout, NULL, 0);
    }
    if (now > started) {
        __atomic_fetch_add(&gate.usage->blocked_ns, now - started, __ATOMIC_RELAXED);
    }
}

/* A latency instance serving a request never waits for tokens: its share bounds what it may
 * take (the manager forgives its debt), not when its work may start. */
static int serving_latency(void) {
    return (__atomic_load_n(&gate.grant->flags, __ATOMIC_RELAXED) & DILU_SLOT_LATENCY) &&
           __atomic_load_n(&gate.signal->inflight, __ATOMIC_RELAXED) > 0;
}

void gate_charge(int64_t cost) {
    int state = __atomic_load_n(&gate.state, __ATOMIC_ACQUIRE);
    if (state == GATE_ACTIVE) {
        struct dilu_usage *usage = gate.usage;
        int64_t position = __atomic_add_fetch(&usage->consumed, cost, __ATOMIC_ACQ_REL);
        __atomic_fetch_add(&usage->launches, 1, __ATOMIC_RELAXED);
        if (position > __atomic_load_n(&gate.grant->granted, __ATOMIC_ACQUIRE) && !serving_latency()) {
            wait_for_tokens(position); /* the slow path: only now is the clock read */
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

int gate_view(struct gate_view *view) {
    if (__atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) != GATE_ACTIVE) {
        return 0;
    }
    view->board = gate.board;
    view->grant = gate.grant;
    view->usage = gate.usage;
    view->slot = gate.slot;
    return 1;
}

/* Asks the manager for slot `index`'s signal and maps it. Caller holds peers_lock. */
static void ask_for_signal(unsigned index, uint32_t board_gen) {
    char request[32], reply[64] = "";
    int length = snprintf(request, sizeof(request), "SIGNAL %u\n", index);
    int fd = -1;
    unsigned slot = 0, gen = board_gen;
    const struct dilu_signal *current = NULL;
    pthread_mutex_lock(&register_lock);           /* the socket is the registration's */
    int asked = gate.sock >= 0 && send(gate.sock, request, (size_t)length, MSG_NOSIGNAL) == length &&
                receive_fds(gate.sock, reply, sizeof(reply), &fd, 1) == 0;
    pthread_mutex_unlock(&register_lock);
    if (asked && fd >= 0 && sscanf(reply, "SIG %u %u", &slot, &gen) == 2 && slot == index) {
        void *page = peers[index].map == NULL
                         ? mmap(NULL, DILU_SHM_PAGE, PROT_READ, MAP_SHARED, fd, 0)
                         : mmap(peers[index].map, DILU_SHM_PAGE, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
        if (page != MAP_FAILED) {
            peers[index].map = page;
            current = page;
        }
    } else if (!(asked && sscanf(reply, "NOSIG %u %u", &slot, &gen) == 2 && slot == index)) {
        gen = board_gen;   /* no answer: this generation counts as idle (a stale manager opens the gate) */
    }
    if (fd >= 0) {
        close(fd);
    }
    __atomic_store_n(&peers[index].current, current, __ATOMIC_RELEASE);
    __atomic_store_n(&peers[index].gen, gen, __ATOMIC_RELEASE);
    __atomic_store_n(&peers[index].known, 1, __ATOMIC_RELEASE);
}

const struct dilu_signal *gate_peer_signal(unsigned index) {
    if (index >= DILU_SHM_MAX_SLOTS || gate.board == NULL) {
        return NULL;
    }
    uint32_t board_gen = __atomic_load_n(&gate.board->slot_gen[index], __ATOMIC_ACQUIRE);
    if (!__atomic_load_n(&peers[index].known, __ATOMIC_ACQUIRE) ||
        __atomic_load_n(&peers[index].gen, __ATOMIC_ACQUIRE) != board_gen) {
        pthread_mutex_lock(&peers_lock);
        if (!__atomic_load_n(&peers[index].known, __ATOMIC_ACQUIRE) ||
            __atomic_load_n(&peers[index].gen, __ATOMIC_ACQUIRE) != board_gen) {
            ask_for_signal(index, board_gen);
        }
        pthread_mutex_unlock(&peers_lock);
    }
    return __atomic_load_n(&peers[index].current, __ATOMIC_ACQUIRE);
}

int gate_manager_gone(int64_t now) {
    if (now - __atomic_load_n(&gate.board->heartbeat_ns, __ATOMIC_ACQUIRE) <= shim_cfg.stale_ns) {
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
    struct dilu_signal *signal = gate.signal;
    int32_t now_serving = __atomic_add_fetch(&signal->inflight, delta, __ATOMIC_ACQ_REL);
    if (delta < 0 && now_serving <= 0) {
        /* The last request ended: held background launches may go on at once. */
        __atomic_fetch_add(&signal->release_gen, 1, __ATOMIC_ACQ_REL);
        syscall(SYS_futex, &signal->release_gen, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
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
    struct dilu_usage *usage = gate.usage;
    int64_t after = __atomic_add_fetch(&usage->mem_used, size, __ATOMIC_ACQ_REL) -
                    __atomic_load_n(&gate.grant->mem_returned, __ATOMIC_ACQUIRE);
    if (limit > 0 && after > limit) {
        __atomic_sub_fetch(&usage->mem_used, size, __ATOMIC_ACQ_REL);
        shim_log(LOG_INFO, "allocation of %lld bytes refused: the instance's slice is %lld bytes, %lld in use",
                 (long long)size, (long long)limit, (long long)(after - size));
        return GATE_MEMORY_REFUSED;
    }
    __atomic_add_fetch(&usage->proc_mem[gate.proc], size, __ATOMIC_ACQ_REL);
    return gate.epoch;
}

void gate_memory_release(int64_t size, uint32_t epoch) {
    if (epoch == gate.epoch && __atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) == GATE_ACTIVE) {
        __atomic_sub_fetch(&gate.usage->mem_used, size, __ATOMIC_ACQ_REL);
        __atomic_sub_fetch(&gate.usage->proc_mem[gate.proc], size, __ATOMIC_ACQ_REL);
    }
}

int64_t gate_memory_used(void) {
    if (__atomic_load_n(&gate.state, __ATOMIC_ACQUIRE) != GATE_ACTIVE) {
        return -1;
    }
    return __atomic_load_n(&gate.usage->mem_used, __ATOMIC_ACQUIRE) -
           __atomic_load_n(&gate.grant->mem_returned, __ATOMIC_ACQUIRE);
}
