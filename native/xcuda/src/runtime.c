/*
 * runtime.c - per-process setup of xCUDA and its helper thread.
 *
 * Setup happens on the first intercepted cuInit (or any memory hook), not at load: a process
 * that never touches CUDA (a shell, a data loader) pays nothing but the preload. It maps the
 * control block read-only and the state file read-write, registers this process in a state
 * slot, installs the SIGINT/SIGTERM handlers and starts one helper thread. The helper thread
 *   - mirrors the control block into the process-local launch gate (the only word the launch
 *     fast path reads), runs one PID step per new (U_SM, C_SM) sample (controller.c),
 *   - watches the other processes' freeze marks (the paper's shared pipe): a futex on
 *     state.event_seq wakes it at once, a poll (XCUDA_POLL_US, default 5 ms) bounds the delay
 *     of control-block changes,
 *   - and runs the freeze sequence after a signal (freeze.c).
 * After fork the child starts from scratch: it is a new process of the workload.
 *
 * Where the files are (xcuda_setting): in the executor's sandbox a node-owned configuration
 * file, XCUDA_CONFIG_FILE (/etc/xcuda.conf, lines NAME=VALUE for XCUDA_CONTROL, XCUDA_STATE and
 * XCUDA_REAL_LIBCUDA), is authoritative: the environment is not consulted, so a workload that
 * unsets or rewrites those variables changes nothing (the sandbox's own /etc/ld.so.preload
 * loads this library into every process, so dropping LD_PRELOAD changes nothing either).
 * Without the file (no sandbox) the environment says where the files are, as before.
 *
 * The SM share (xcuda_pin_share): MPS gives a client the CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of
 * its environment, capped by its server's set_active_thread_percentage, and reads it when the
 * client initializes. The server's cap is one per server, i.e. per uid, i.e. per GPU here (all
 * clients of a GPU share its uid), so it cannot tell an offline client from the online one;
 * the client's own variable is what separates them. xCUDA therefore rewrites the variable from
 * the control block (active_thread_percentage) when the library loads, right before the real
 * cuInit and before every context is created, whatever the workload put there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "xcuda_internal.h"

_Atomic uint32_t g_xcuda_gate;
const xcuda_control *g_xcuda_ctl;
xcuda_state *g_xcuda_state;
int g_xcuda_debug;

static int g_log_fd = -1;
static uint64_t g_poll_ns = 5000000;
static uint32_t g_local_wake;
static uint32_t *g_wake_word = &g_local_wake;

/* 0 = not started in this process, 1 = starting, 2 = running, 3 = refused (bad files) */
static _Atomic int g_runtime;
static pthread_mutex_t g_runtime_mu = PTHREAD_MUTEX_INITIALIZER;

uint64_t xcuda_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void xcuda_log(const char *fmt, ...) {
    if (!g_xcuda_debug && g_log_fd < 0) return;
    char buf[512];
    uint64_t t = xcuda_now_ns();
    int n = snprintf(buf, sizeof buf, "%llu %llu %d xcuda ", (unsigned long long)t,
                     (unsigned long long)t, (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) return;
    size_t len = (size_t)n + ((size_t)m < sizeof buf - (size_t)n - 1 ? (size_t)m : sizeof buf - (size_t)n - 2);
    buf[len++] = '\n';
    int fd = g_log_fd >= 0 ? g_log_fd : 2;
    ssize_t w = write(fd, buf, len);
    (void)w;
}

/* ---- where the files are: the sandbox's configuration file, else the environment ---- */
static const char *const g_setting_names[] = {"XCUDA_CONTROL", "XCUDA_STATE", "XCUDA_REAL_LIBCUDA"};
#define N_SETTINGS (sizeof g_setting_names / sizeof g_setting_names[0])
static char g_setting_values[N_SETTINGS][1024];
static int g_setting_set[N_SETTINGS];
static int g_config_file;   /* 1: XCUDA_CONFIG_FILE exists; the environment is not consulted */
static int g_config_broken; /* 1: it exists but cannot be read: nothing runs (fail closed) */
static pthread_once_t g_config_once = PTHREAD_ONCE_INIT;

static void read_config(void) {
    int fd = open(XCUDA_CONFIG_FILE, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) g_config_file = g_config_broken = 1;
        return;
    }
    g_config_file = 1;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0 || n == (ssize_t)sizeof buf - 1) { /* unreadable, or longer than any file the executor writes */
        g_config_broken = 1;
        return;
    }
    buf[n] = '\0';
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *eq = strchr(line, '=');
        if (line[0] == '#' || eq == NULL) continue;
        *eq = '\0';
        for (size_t i = 0; i < N_SETTINGS; i++) {
            if (strcmp(line, g_setting_names[i]) != 0) continue;
            if (strlen(eq + 1) >= sizeof g_setting_values[i]) {
                g_config_broken = 1;
                return;
            }
            strcpy(g_setting_values[i], eq + 1);
            g_setting_set[i] = 1;
        }
    }
}

const char *xcuda_setting(const char *name) {
    pthread_once(&g_config_once, read_config);
    if (!g_config_file) return getenv(name);
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (strcmp(name, g_setting_names[i]) == 0) return g_setting_set[i] ? g_setting_values[i] : NULL;
    return NULL;
}

/* ---- the SM share (module comment) ---- */
static void set_share(double percentage) {
    if (!(percentage > 0.0)) return; /* 0: no share given; NaN never */
    if (percentage > 100.0) percentage = 100.0;
    char want[32];
    snprintf(want, sizeof want, "%g", percentage);
    const char *have = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    if (have == NULL || strcmp(have, want) != 0) setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", want, 1);
}

void xcuda_pin_share(void) {
    xcuda_params p;
    if (g_xcuda_ctl == NULL) return;
    /* a write that never completes (a writer that died mid-way): the field itself, one aligned word */
    set_share(xcuda_read_params(g_xcuda_ctl, &p) == 0 ? p.active_thread_percentage
                                                      : load_double(&g_xcuda_ctl->active_thread_percentage));
}

/* At load, before the program's own code: the share from the control block read with pread
 * (no mapping: most processes of a sandbox never touch CUDA). */
static void pin_share_at_load(void) {
    const char *path = xcuda_setting("XCUDA_CONTROL");
    if (path == NULL || path[0] == '\0') return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    for (int tries = 0; tries < 100; tries++) {
        xcuda_control c;
        uint32_t seq_after;
        if (pread(fd, &c, sizeof c, 0) != (ssize_t)sizeof c) break;
        if (c.magic != XCUDA_CONTROL_MAGIC || c.layout_version != XCUDA_LAYOUT_VERSION) break;
        if (pread(fd, &seq_after, sizeof seq_after, offsetof(xcuda_control, seq)) != (ssize_t)sizeof seq_after) break;
        if ((c.seq & 1u) || seq_after != c.seq) continue;
        set_share(c.active_thread_percentage);
        break;
    }
    close(fd);
}

uint64_t xcuda_quota_bytes(void) {
    return g_xcuda_ctl ? LOAD_RELAXED(&g_xcuda_ctl->mem_quota_bytes) : 0;
}

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

void xcuda_wake_helper(void) {
    __atomic_fetch_add(g_wake_word, 1, __ATOMIC_RELEASE);
    futex(g_wake_word, FUTEX_WAKE, 0x7fffffff, NULL);
}

static const xcuda_control *map_control(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        xcuda_log("cannot open control block %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size >= XCUDA_CONTROL_SIZE)
        p = mmap(NULL, XCUDA_CONTROL_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        xcuda_log("control block %s is too small or cannot be mapped", path);
        return NULL;
    }
    const xcuda_control *c = p;
    if (LOAD_ACQUIRE(&c->magic) != XCUDA_CONTROL_MAGIC || c->layout_version != XCUDA_LAYOUT_VERSION) {
        xcuda_log("control block %s: magic %#x layout %u, expected layout %u", path, c->magic,
                  c->layout_version, XCUDA_LAYOUT_VERSION);
        munmap(p, XCUDA_CONTROL_SIZE);
        return NULL;
    }
    return c;
}

/* ---- the helper thread ---- */
static xcuda_pid g_pid;

static void publish_gate(uint32_t set, uint32_t clear) {
    uint32_t before = atomic_fetch_or(&g_xcuda_gate, set);
    uint32_t mid = atomic_fetch_and(&g_xcuda_gate, ~clear | set);
    /* waiters in the launch slow path sleep on the gate word */
    if (before != (mid & (~clear | set)))
        futex((uint32_t *)&g_xcuda_gate, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL);
}

static int peers_freezing(void) {
    if (!g_xcuda_state) return 0;
    xcuda_slot *me = xcuda_my_slot();
    for (int i = 0; i < XCUDA_MAX_SLOTS; i++) {
        xcuda_slot *s = xcuda_slot_at(g_xcuda_state, i);
        if (s == me || !LOAD_RELAXED(&s->freezing)) continue;
        if (xcuda_slot_alive(s)) return 1;
    }
    return 0;
}

void xcuda_pools_refresh(void);
void xcuda_state_reclaim(void);

static void helper_tick(void) {
    uint32_t set = 0, clear = 0;
    /* the last consistent parameters stay in force while a write is in progress (or was
     * abandoned half-way by a dying writer): never fall back to "no control" */
    static xcuda_params p;
    static int have;
    xcuda_params fresh;
    if (g_xcuda_ctl && xcuda_read_params(g_xcuda_ctl, &fresh) == 0) {
        p = fresh;
        have = 1;
    }
    if (have && (p.flags & XCUDA_FLAG_FREEZE)) set |= GATE_FREEZE_EXEC; else clear |= GATE_FREEZE_EXEC;
    if (peers_freezing()) set |= GATE_FREEZE_PEER; else clear |= GATE_FREEZE_PEER;
    xcuda_slot *me = xcuda_my_slot();
    if (have && (p.flags & XCUDA_FLAG_THROTTLE)) {
        if (!g_pid.primed || p.sample_seq != g_pid.prev_sample_seq) {
            double dt = 0.0;
            if (g_pid.primed && p.sample_time_ns > g_pid.prev_time_ns)
                dt = (double)(p.sample_time_ns - g_pid.prev_time_ns) / 1e9;
            double a_c = xcuda_clock_factor(&p);
            double u_gpu = p.u_sm * a_c; /* eq. 1 */
            double interval_us = xcuda_pid_step(&g_pid, &p, u_gpu, dt);
            g_pid.prev_sample_seq = p.sample_seq;
            g_pid.prev_time_ns = p.sample_time_ns;
            uint64_t iv = (uint64_t)(interval_us * 1000.0);
            atomic_store_explicit(&g_xcuda_interval_ns, iv, memory_order_relaxed);
            if (me) {
                STORE_RELAXED(&me->interval_ns, iv);
                store_double(&me->u_gpu, u_gpu);
                store_double(&me->a_c, a_c);
                STORE_RELAXED(&me->pid_steps, me->pid_steps + 1);
            }
            if (g_xcuda_debug) xcuda_log("pid step U_GPU=%.3f a_C=%.3f interval=%.1fus", u_gpu, a_c, interval_us);
        }
        if (atomic_load_explicit(&g_xcuda_interval_ns, memory_order_relaxed) > 0) set |= GATE_THROTTLE;
        else clear |= GATE_THROTTLE;
    } else {
        memset(&g_pid, 0, sizeof g_pid);
        atomic_store_explicit(&g_xcuda_interval_ns, 0, memory_order_relaxed);
        if (me) STORE_RELAXED(&me->interval_ns, 0);
        clear |= GATE_THROTTLE;
    }
    publish_gate(set, clear);
    xcuda_state_repair(); /* a slot zeroed or rewritten by the workload's code is restored */
    if (me)
        STORE_RELAXED(&me->frozen, (atomic_load(&g_xcuda_gate) & (GATE_FREEZE_EXEC | GATE_FREEZE_PEER |
                                                                   GATE_FREEZE_SIGNAL)) != 0);
}

static void *helper_main(void *arg) {
    (void)arg;
    uint64_t last_slow = 0;
    for (;;) {
        uint32_t seen = __atomic_load_n(g_wake_word, __ATOMIC_ACQUIRE);
        if (xcuda_signal_pending()) xcuda_freeze_run();
        helper_tick();
        uint64_t now = xcuda_now_ns();
        if (now - last_slow > 1000000000ull) { /* once a second: dead peers, pool shrinkage */
            last_slow = now;
            xcuda_state_reclaim();
            xcuda_pools_refresh();
        }
        struct timespec ts = {(time_t)(g_poll_ns / 1000000000ull), (long)(g_poll_ns % 1000000000ull)};
        futex(g_wake_word, FUTEX_WAIT, seen, &ts);
    }
    return NULL;
}

static int start_runtime(void) {
    const char *dbg = getenv("XCUDA_DEBUG");
    g_xcuda_debug = dbg && dbg[0] && strcmp(dbg, "0") != 0;
    const char *logp = getenv("XCUDA_LOG");
    if (logp && logp[0] && g_log_fd < 0) g_log_fd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const char *poll = getenv("XCUDA_POLL_US");
    if (poll && atol(poll) > 0) g_poll_ns = (uint64_t)atol(poll) * 1000ull;
    pthread_once(&g_config_once, read_config);
    if (g_config_broken) {
        xcuda_log("%s cannot be read: refused", XCUDA_CONFIG_FILE);
        return -1;
    }
    xcuda_load_driver();
    const char *ctl = xcuda_setting("XCUDA_CONTROL");
    if (ctl && ctl[0] && g_xcuda_ctl == NULL) { /* after fork the parent's mapping is kept */
        g_xcuda_ctl = map_control(ctl);
        if (!g_xcuda_ctl) return -1;
    }
    const char *st = xcuda_setting("XCUDA_STATE");
    if (st && st[0]) {
        if (xcuda_state_attach(st) != 0) return -1;
        g_wake_word = &g_xcuda_state->event_seq;
    }
    helper_tick();
    xcuda_install_signal_handlers();
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, helper_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        xcuda_log("cannot start the helper thread: %s", strerror(rc));
        return -1;
    }
    xcuda_log("started: control=%s state=%s (%s)", ctl ? ctl : "-", st ? st : "-",
              g_config_file ? XCUDA_CONFIG_FILE : "environment");
    return 0;
}

/* 0 when running, -1 when the configured files were refused (fail closed) */
static int ensure(void) {
    int s = atomic_load_explicit(&g_runtime, memory_order_acquire);
    if (XCUDA_LIKELY(s == 2)) return 0;
    if (s == 3) return -1;
    pthread_mutex_lock(&g_runtime_mu);
    s = atomic_load(&g_runtime);
    if (s == 0) {
        atomic_store(&g_runtime, 1);
        s = start_runtime() == 0 ? 2 : 3;
        atomic_store_explicit(&g_runtime, s, memory_order_release);
    }
    pthread_mutex_unlock(&g_runtime_mu);
    return s == 2 ? 0 : -1;
}

void xcuda_ensure_runtime(void) { (void)ensure(); }
int xcuda_runtime_active(void) { return atomic_load_explicit(&g_runtime, memory_order_acquire) == 2; }
int xcuda_runtime_refused(void) { return ensure() != 0; }

static void atfork_child(void) {
    pthread_mutex_init(&g_runtime_mu, NULL);
    atomic_store(&g_runtime, 0);
    atomic_store(&g_xcuda_gate, 0);
    atomic_store(&g_xcuda_interval_ns, 0);
    memset(&g_pid, 0, sizeof g_pid);
    xcuda_state_after_fork_child();
    xcuda_memory_after_fork_child();
}

__attribute__((constructor)) static void xcuda_constructor(void) {
    pthread_atfork(NULL, NULL, atfork_child);
    pin_share_at_load();
}

__attribute__((destructor)) static void xcuda_destructor(void) {
    xcuda_state_detach_slot();
}

XCUDA_API CUresult cuInit(unsigned int Flags) {
    if (ensure() != 0) return CUDA_ERROR_NOT_PERMITTED;
    xcuda_pin_share(); /* the driver connects to MPS here and reads the share */
    return REAL(cuInit)(Flags);
}

/* for tests and the Python side: the layout this library was built with */
XCUDA_API unsigned int xcuda_layout_version(void) { return XCUDA_LAYOUT_VERSION; }
