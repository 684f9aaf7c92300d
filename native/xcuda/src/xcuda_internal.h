/* xcuda_internal.h - what the parts of libxcuda.so share. Not installed. */
#ifndef XCUDA_INTERNAL_H
#define XCUDA_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "xcuda_cuda.h"
#include "xcuda_layout.h"

#define XCUDA_API __attribute__((visibility("default")))
#define XCUDA_LIKELY(x) __builtin_expect(!!(x), 1)
#define XCUDA_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- the shared layout, generated from xcuda_layout.h and checked field by field ---- */
#define XCUDA_STRUCT_MEMBER(type, name, offset, doc) type name;
typedef struct xcuda_control { XCUDA_CONTROL_FIELDS(XCUDA_STRUCT_MEMBER) } xcuda_control;
typedef struct xcuda_state { XCUDA_STATE_FIELDS(XCUDA_STRUCT_MEMBER) } xcuda_state;
typedef struct xcuda_slot { XCUDA_SLOT_FIELDS(XCUDA_STRUCT_MEMBER) } xcuda_slot;
#undef XCUDA_STRUCT_MEMBER
#define XCUDA_CHECK_OFFSET(type, name, offset, doc) \
    _Static_assert(offsetof(XCUDA_CHECKED, name) == (offset), "layout offset of " #name);
#define XCUDA_CHECKED xcuda_control
XCUDA_CONTROL_FIELDS(XCUDA_CHECK_OFFSET)
#undef XCUDA_CHECKED
#define XCUDA_CHECKED xcuda_state
XCUDA_STATE_FIELDS(XCUDA_CHECK_OFFSET)
#undef XCUDA_CHECKED
#define XCUDA_CHECKED xcuda_slot
XCUDA_SLOT_FIELDS(XCUDA_CHECK_OFFSET)
#undef XCUDA_CHECKED
#undef XCUDA_CHECK_OFFSET
_Static_assert(sizeof(xcuda_control) <= XCUDA_CONTROL_SIZE, "control block too large");
_Static_assert(sizeof(xcuda_state) <= XCUDA_STATE_HEADER_SIZE, "state header too large");
_Static_assert(sizeof(xcuda_slot) == XCUDA_SLOT_SIZE, "slot size");
_Static_assert(XCUDA_STATE_HEADER_SIZE + XCUDA_MAX_SLOTS * XCUDA_SLOT_SIZE == XCUDA_STATE_SIZE,
               "state size");
_Static_assert(sizeof(pthread_mutex_t) <= sizeof(xcuda_lock_area), "mutex fits the lock area");

static inline xcuda_slot *xcuda_slot_at(xcuda_state *st, int i) {
    return (xcuda_slot *)((char *)st + XCUDA_STATE_HEADER_SIZE + (size_t)i * XCUDA_SLOT_SIZE);
}

/* relaxed/acquire accessors for words in the shared mappings */
#define LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
static inline double load_double(const double *p) { double v; __atomic_load(p, &v, __ATOMIC_RELAXED); return v; }
static inline void store_double(double *p, double v) { __atomic_store(p, &v, __ATOMIC_RELAXED); }

/* ---- the real driver (driver.c) ---- */
#define XCUDA_PFN_TYPE(name, params, args) typedef CUresult(*pfn_##name) params;
XCUDA_DRIVER_API(XCUDA_PFN_TYPE)
#undef XCUDA_PFN_TYPE
typedef struct xcuda_real {
#define XCUDA_PFN_MEMBER(name, params, args) pfn_##name name;
    XCUDA_DRIVER_API(XCUDA_PFN_MEMBER)
#undef XCUDA_PFN_MEMBER
} xcuda_real;
/* Each member starts as a lazy trampoline that loads the driver, then holds the driver's
 * function (or a fallback that returns CUDA_ERROR_NOT_FOUND when the driver lacks the symbol). */
extern xcuda_real xcuda_real_fns;
#define REAL(name) (__atomic_load_n(&xcuda_real_fns.name, __ATOMIC_RELAXED))
void xcuda_load_driver(void);

/* ---- configuration and runtime (runtime.c) ---- */
/* bits of g_xcuda_gate: any bit set sends launches to the slow path */
#define GATE_THROTTLE 1u      /* the controller asks for a launch interval > 0 */
#define GATE_FREEZE_EXEC 2u   /* the executor froze the workload (control block) */
#define GATE_FREEZE_PEER 4u   /* another process of the workload is freezing (shared pipe) */
#define GATE_FREEZE_SIGNAL 8u /* this process got SIGINT/SIGTERM */
extern _Atomic uint32_t g_xcuda_gate;
extern const xcuda_control *g_xcuda_ctl; /* NULL when no control block is configured */
extern xcuda_state *g_xcuda_state;       /* NULL when no state file is configured */
extern int g_xcuda_debug;
void xcuda_ensure_runtime(void);         /* idempotent: maps files, starts the helper thread */
void xcuda_wake_helper(void);            /* async-signal-safe */
uint64_t xcuda_now_ns(void);
void xcuda_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t xcuda_quota_bytes(void);        /* 0 = none */
/* XCUDA_CONTROL, XCUDA_STATE, XCUDA_REAL_LIBCUDA: from XCUDA_CONFIG_FILE when it exists (the
 * sandbox's, node-owned: the environment is then ignored), else from the environment */
#define XCUDA_CONFIG_FILE "/etc/xcuda.conf"
const char *xcuda_setting(const char *name);
/* CUDA_MPS_ACTIVE_THREAD_PERCENTAGE := the control block's share (nothing when it is 0) */
void xcuda_pin_share(void);

/* ---- shared accounting (state.c) ---- */
int xcuda_state_attach(const char *path); /* 0 ok */
int xcuda_state_reserve(uint64_t bytes, uint64_t quota); /* 0 ok, -1 over quota */
void xcuda_state_release(uint64_t bytes);
uint64_t xcuda_state_used_total(void);   /* all live processes of the workload (this one: its own tally) */
void xcuda_state_repair(void);           /* rewrite this process's slot from its own tally */
xcuda_slot *xcuda_my_slot(void);         /* NULL without a state file */
int xcuda_slot_alive(xcuda_slot *s);
void xcuda_state_detach_slot(void);
void xcuda_state_after_fork_child(void);

/* ---- launch control (launch.c, controller.c) ---- */
CUresult xcuda_launch_gate_slow(void);    /* returns CUDA_SUCCESS to proceed */
extern _Atomic uint64_t g_xcuda_interval_ns;
typedef struct xcuda_pid {
    double integral;
    double prev_error;
    uint64_t prev_time_ns;
    uint32_t prev_sample_seq;
    int primed;
} xcuda_pid;
typedef struct xcuda_params {
    uint32_t flags, sample_seq;
    uint64_t quota, sample_time_ns;
    double u_sm, c_sm, c_h, t_sm, a_l, a_h, kp, ki, kd, target, max_interval_us;
    double active_thread_percentage;
} xcuda_params;
int xcuda_read_params(const xcuda_control *ctl, xcuda_params *out); /* seqlock read */
double xcuda_clock_factor(const xcuda_params *p);                   /* eq. 2 */
double xcuda_pid_step(xcuda_pid *pid, const xcuda_params *p, double u_gpu, double dt_s); /* interval, us */

/* ---- freeze and graceful exit (freeze.c) ---- */
void xcuda_install_signal_handlers(void);
void xcuda_freeze_run(void);              /* helper thread: freeze -> sync -> release -> exit */
int xcuda_signal_pending(void);
int xcuda_contexts_released(void);
void xcuda_track_ctx_created(CUcontext ctx);
void xcuda_track_ctx_destroyed(CUcontext ctx);
void xcuda_track_primary_retained(CUdevice dev, CUcontext ctx);
void xcuda_track_primary_released(CUdevice dev, int reset);

/* ---- memory (memory.c) ---- */
void xcuda_memory_after_fork_child(void);

#endif
