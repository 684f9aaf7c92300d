/*
 * state.c - GPU memory accounting shared by all processes of one workload (MuxFlow 4.2:
 * "xCUDA keeps track of the GPU memory usage and makes sure that the memory used by the
 * offline workload does not exceed the GPU memory quota").
 *
 * The state file (layout in xcuda_layout.h) holds one slot per process: pid, start time,
 * bytes held. A workload's usage is the sum over occupied slots, so a process that dies
 * leaves nothing behind but its own slot, which the next process to look reclaims:
 *   - the lock is a robust process-shared pthread mutex: a process killed while holding it
 *     hands the next locker EOWNERDEAD instead of a stall; that locker reclaims dead slots
 *     and marks the mutex consistent;
 *   - dead slots are also reclaimed when a reservation would exceed the quota, at
 *     registration, and once a second by the helper thread;
 *   - a pid is alive when kill(pid, 0) succeeds, it is not a zombie and its start time
 *     (/proc/<pid>/stat field 22) matches, so a reused pid does not keep a dead process's
 *     memory.
 * The first process to attach initializes the mutex, under flock(2) (released by the kernel
 * if that process dies). A reservation checks and adds under the lock; a release subtracts
 * with an atomic operation and needs no lock.
 *
 * The state file is writable by the workload's own code, so what it says is an account, not
 * a proof. Each process keeps its own usage in process memory (g_my_used) and counts that,
 * not its slot, against the quota; the slot is a mirror for the other processes and the
 * executor, rewritten on every change and repaired by the helper thread (xcuda_state_repair)
 * when something else wrote it: zeroing the file does not let a process allocate more. The
 * node's real enforcement reads NVML's per-process usage (hivemux.executor.memory_guard),
 * which no workload can forge.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xcuda_internal.h"

static int g_slot = -1;
static _Atomic uint64_t g_my_used; /* this process's usage: the truth its slot mirrors */

static pthread_mutex_t *state_mutex(void) { return (pthread_mutex_t *)(void *)&g_xcuda_state->lock; }

/* start time of pid (field 22 of /proc/<pid>/stat), 0 if unknown; *zombie set for Z/X */
static uint64_t proc_start_time(int pid, int *zombie) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    /* after ") " come fields 3..: the state, ..., start time is field 22 */
    p += 2;
    if (zombie) *zombie = (*p == 'Z' || *p == 'X');
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p) p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

int xcuda_slot_alive(xcuda_slot *s) {
    int pid = LOAD_RELAXED(&s->pid);
    if (pid == 0) return 0;
    if (kill(pid, 0) != 0 && errno != EPERM) return 0;
    uint64_t st = LOAD_RELAXED(&s->start_time);
    int zombie = 0;
    uint64_t now = proc_start_time(pid, &zombie);
    if (zombie) return 0; /* exited, not yet reaped: its device memory is gone */
    return st == 0 || now == 0 || st == now;
}

static void clear_slot(xcuda_slot *s) {
    STORE_RELAXED(&s->used_bytes, 0);
    STORE_RELAXED(&s->freezing, 0);
    STORE_RELAXED(&s->frozen, 0);
    STORE_RELAXED(&s->interval_ns, 0);
    STORE_RELEASE(&s->pid, 0);
}

/* with the lock held */
static void reclaim_dead_locked(void) {
    for (int i = 0; i < XCUDA_MAX_SLOTS; i++) {
        xcuda_slot *s = xcuda_slot_at(g_xcuda_state, i);
        if (i == g_slot || LOAD_RELAXED(&s->pid) == 0 || xcuda_slot_alive(s)) continue;
        uint64_t used = LOAD_RELAXED(&s->used_bytes);
        __atomic_fetch_add(&g_xcuda_state->reclaimed_bytes, used, __ATOMIC_RELAXED);
        xcuda_log("reclaimed %llu bytes of dead process %d", (unsigned long long)used, s->pid);
        clear_slot(s);
    }
}

static int state_lock(void) {
    int r = pthread_mutex_lock(state_mutex());
    if (r == EOWNERDEAD) {
        __atomic_fetch_add(&g_xcuda_state->owner_died, 1, __ATOMIC_RELAXED);
        xcuda_log("state lock holder died; reclaiming");
        reclaim_dead_locked();
        pthread_mutex_consistent(state_mutex());
        r = 0;
    }
    if (r != 0) xcuda_log("state lock failed: %s", strerror(r));
    return r;
}

static void state_unlock(void) { pthread_mutex_unlock(state_mutex()); }

static int register_slot(void) {
    if (state_lock() != 0) return -1;
    reclaim_dead_locked();
    int found = -1;
    for (int i = 0; i < XCUDA_MAX_SLOTS && found < 0; i++)
        if (LOAD_RELAXED(&xcuda_slot_at(g_xcuda_state, i)->pid) == 0) found = i;
    if (found >= 0) {
        xcuda_slot *s = xcuda_slot_at(g_xcuda_state, found);
        memset((char *)s + sizeof s->pid, 0, sizeof *s - sizeof s->pid);
        STORE_RELAXED(&s->start_time, proc_start_time(getpid(), NULL));
        STORE_RELEASE(&s->pid, (int32_t)getpid());
    }
    state_unlock();
    if (found < 0) xcuda_log("no free slot in the state file (%d processes)", XCUDA_MAX_SLOTS);
    g_slot = found;
    return found >= 0 ? 0 : -1;
}

int xcuda_state_attach(const char *path) {
    if (g_xcuda_state == NULL) {
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            xcuda_log("cannot open state file %s: %s", path, strerror(errno));
            return -1;
        }
        struct stat st;
        void *p = MAP_FAILED;
        if (fstat(fd, &st) == 0 && st.st_size >= XCUDA_STATE_SIZE)
            p = mmap(NULL, XCUDA_STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            xcuda_log("state file %s is too small or cannot be mapped", path);
            close(fd);
            return -1;
        }
        xcuda_state *s = p;
        if (LOAD_ACQUIRE(&s->magic) != XCUDA_STATE_MAGIC || s->layout_version != XCUDA_LAYOUT_VERSION) {
            xcuda_log("state file %s: magic %#x layout %u, expected layout %u", path, s->magic,
                      s->layout_version, XCUDA_LAYOUT_VERSION);
            munmap(p, XCUDA_STATE_SIZE);
            close(fd);
            return -1;
        }
        if (LOAD_ACQUIRE(&s->init_state) != XCUDA_STATE_READY) {
            flock(fd, LOCK_EX);
            if (LOAD_ACQUIRE(&s->init_state) != XCUDA_STATE_READY) {
                pthread_mutexattr_t a;
                pthread_mutexattr_init(&a);
                pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
                pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
                pthread_mutex_init((pthread_mutex_t *)(void *)&s->lock, &a);
                pthread_mutexattr_destroy(&a);
                STORE_RELAXED(&s->max_slots, XCUDA_MAX_SLOTS);
                STORE_RELEASE(&s->init_state, XCUDA_STATE_READY);
            }
            flock(fd, LOCK_UN);
        }
        close(fd);
        g_xcuda_state = s;
    }
    return register_slot();
}

xcuda_slot *xcuda_my_slot(void) {
    return (g_xcuda_state && g_slot >= 0) ? xcuda_slot_at(g_xcuda_state, g_slot) : NULL;
}

uint64_t xcuda_state_used_total(void) {
    uint64_t total = atomic_load_explicit(&g_my_used, memory_order_relaxed);
    for (int i = 0; i < XCUDA_MAX_SLOTS; i++) {
        xcuda_slot *s = xcuda_slot_at(g_xcuda_state, i);
        if (i != g_slot && LOAD_ACQUIRE(&s->pid) != 0) total += LOAD_RELAXED(&s->used_bytes);
    }
    return total;
}

void xcuda_state_repair(void) {
    xcuda_slot *me = xcuda_my_slot();
    if (!me || LOAD_ACQUIRE(&me->pid) != (int32_t)getpid()) return; /* not (or no longer) ours */
    uint64_t mine = atomic_load_explicit(&g_my_used, memory_order_relaxed);
    if (LOAD_RELAXED(&me->used_bytes) != mine) {
        xcuda_log("slot %d said %llu bytes, this process holds %llu: rewritten", g_slot,
                  (unsigned long long)LOAD_RELAXED(&me->used_bytes), (unsigned long long)mine);
        STORE_RELAXED(&me->used_bytes, mine);
    }
}

int xcuda_state_reserve(uint64_t bytes, uint64_t quota) {
    xcuda_slot *me = xcuda_my_slot();
    if (!me) return quota ? -1 : 0; /* no slot: cannot account, so refuse under a quota */
    if (bytes == 0) return 0;
    if (state_lock() != 0) return -1;
    int ok = 1;
    if (quota) {
        uint64_t used = xcuda_state_used_total();
        if (used + bytes > quota || used + bytes < used) {
            reclaim_dead_locked();
            used = xcuda_state_used_total();
            ok = used + bytes <= quota && used + bytes >= used;
        }
    }
    if (ok) STORE_RELAXED(&me->used_bytes, atomic_fetch_add_explicit(&g_my_used, bytes, memory_order_relaxed) + bytes);
    state_unlock();
    return ok ? 0 : -1;
}

void xcuda_state_release(uint64_t bytes) {
    xcuda_slot *me = xcuda_my_slot();
    if (!me || bytes == 0) return;
    uint64_t cur = atomic_load_explicit(&g_my_used, memory_order_relaxed), next;
    do {
        next = cur > bytes ? cur - bytes : 0;
    } while (!atomic_compare_exchange_weak_explicit(&g_my_used, &cur, next, memory_order_relaxed, memory_order_relaxed));
    STORE_RELAXED(&me->used_bytes, next); /* a concurrent change is mirrored by the next repair */
}

void xcuda_state_reclaim(void) {
    if (!g_xcuda_state || g_slot < 0) return;
    if (state_lock() != 0) return;
    reclaim_dead_locked();
    state_unlock();
}

void xcuda_state_detach_slot(void) {
    xcuda_slot *me = xcuda_my_slot();
    if (me && LOAD_RELAXED(&me->pid) == (int32_t)getpid()) clear_slot(me);
    g_slot = -1;
}

void xcuda_state_after_fork_child(void) {
    g_slot = -1;
    atomic_store_explicit(&g_my_used, 0, memory_order_relaxed); /* the parent's memory stays the parent's */
}
