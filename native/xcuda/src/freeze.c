/*
 * freeze.c - mixed error handling, the SIGINT/SIGTERM part (MuxFlow 4.3 of the preprint,
 * section 5 of the journal version: "when xCUDA gets these signals, it will freeze all
 * kernel launches and release CUDA context actively"; "all GPU processes/threads share the
 * same pipe file to monitor the freeze signal from each other").
 *
 * Design note - states of one process:
 *   RUNNING --SIGINT/SIGTERM--> FREEZING --contexts synchronized and released--> RELEASED
 *   RELEASED --> the signal's own action: the application's handler, chained, or the default
 *   (the process ends with the signal, as it would have without xCUDA).
 * In FREEZING the signal handler has only set the gate bit GATE_FREEZE_SIGNAL, this
 * process's slot.freezing and bumped state.event_seq (futex wake: all async-signal-safe).
 * The helper thread then waits a grace period for launches that had passed the gate,
 * synchronizes every context the process created or retained, destroys the created ones and
 * releases the retained primary contexts, clears slot.freezing and chains. Launches are held
 * during FREEZING and fail with CUDA_ERROR_CONTEXT_IS_DESTROYED after RELEASED.
 * The other processes of the workload see slot.freezing (the shared pipe) and hold their
 * launches while it is set; a dead process's mark is ignored.
 *
 * The application keeps its own signal handling: the disposition found when xCUDA installs
 * its handler, and every later sigaction()/signal() for SIGINT/SIGTERM, is recorded and
 * chained instead of replacing xCUDA's handler. A signal the application ignores is not
 * acted upon. Limitation: a launch that passed the gate just before the signal and reaches
 * the driver after the grace period (2 ms) finds its context destroyed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "xcuda_internal.h"

int xcuda_runtime_active(void);
void xcuda_memory_forget_all(void);

/* ---- contexts this process holds ---- */
#define MAX_CTX 64
#define MAX_DEV 64
static CUcontext g_created[MAX_CTX];
static int g_ncreated;
static struct { CUcontext ctx; int refs; } g_primary[MAX_DEV];
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;

void xcuda_track_ctx_created(CUcontext ctx) {
    pthread_mutex_lock(&g_ctx_mu);
    if (g_ncreated < MAX_CTX) g_created[g_ncreated++] = ctx;
    pthread_mutex_unlock(&g_ctx_mu);
}
void xcuda_track_ctx_destroyed(CUcontext ctx) {
    pthread_mutex_lock(&g_ctx_mu);
    for (int i = 0; i < g_ncreated; i++)
        if (g_created[i] == ctx) { g_created[i] = g_created[--g_ncreated]; break; }
    pthread_mutex_unlock(&g_ctx_mu);
}
void xcuda_track_primary_retained(CUdevice dev, CUcontext ctx) {
    if (dev < 0 || dev >= MAX_DEV) return;
    pthread_mutex_lock(&g_ctx_mu);
    g_primary[dev].ctx = ctx;
    g_primary[dev].refs++;
    pthread_mutex_unlock(&g_ctx_mu);
}
void xcuda_track_primary_released(CUdevice dev, int reset) {
    if (dev < 0 || dev >= MAX_DEV) return;
    pthread_mutex_lock(&g_ctx_mu);
    if (reset || g_primary[dev].refs <= 1) { g_primary[dev].refs = 0; g_primary[dev].ctx = NULL; }
    else g_primary[dev].refs--;
    pthread_mutex_unlock(&g_ctx_mu);
}

/* ---- context hooks ---- */
static CUresult after_create(CUresult r, CUcontext *pctx) {
    if (r == CUDA_SUCCESS && pctx) xcuda_track_ctx_created(*pctx);
    return r;
}
XCUDA_API CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    xcuda_ensure_runtime();
    xcuda_pin_share();
    return after_create(REAL(cuCtxCreate)(pctx, flags, dev), pctx);
}
XCUDA_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    xcuda_ensure_runtime();
    xcuda_pin_share();
    return after_create(REAL(cuCtxCreate_v2)(pctx, flags, dev), pctx);
}
XCUDA_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                  unsigned int flags, CUdevice dev) {
    xcuda_ensure_runtime();
    xcuda_pin_share();
    return after_create(REAL(cuCtxCreate_v3)(pctx, paramsArray, numParams, flags, dev), pctx);
}
XCUDA_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                  CUdevice dev) {
    xcuda_ensure_runtime();
    xcuda_pin_share();
    return after_create(REAL(cuCtxCreate_v4)(pctx, ctxCreateParams, flags, dev), pctx);
}
XCUDA_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CUresult r = REAL(cuCtxDestroy_v2)(ctx);
    if (r == CUDA_SUCCESS) xcuda_track_ctx_destroyed(ctx);
    return r;
}
XCUDA_API CUresult cuCtxDestroy(CUcontext ctx) {
    CUresult r = REAL(cuCtxDestroy)(ctx);
    if (r == CUDA_SUCCESS) xcuda_track_ctx_destroyed(ctx);
    return r;
}
XCUDA_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    xcuda_ensure_runtime();
    xcuda_pin_share();
    CUresult r = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    if (r == CUDA_SUCCESS && pctx) xcuda_track_primary_retained(dev, *pctx);
    return r;
}
XCUDA_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CUresult r = REAL(cuDevicePrimaryCtxRelease_v2)(dev);
    if (r == CUDA_SUCCESS) xcuda_track_primary_released(dev, 0);
    return r;
}
XCUDA_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    CUresult r = REAL(cuDevicePrimaryCtxRelease)(dev);
    if (r == CUDA_SUCCESS) xcuda_track_primary_released(dev, 0);
    return r;
}
XCUDA_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    CUresult r = REAL(cuDevicePrimaryCtxReset_v2)(dev);
    if (r == CUDA_SUCCESS) xcuda_track_primary_released(dev, 1);
    return r;
}
XCUDA_API CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    CUresult r = REAL(cuDevicePrimaryCtxReset)(dev);
    if (r == CUDA_SUCCESS) xcuda_track_primary_released(dev, 1);
    return r;
}

/* ---- signals ---- */
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction_fn;
static sigaction_fn real_sigaction(void) {
    sigaction_fn f = __atomic_load_n(&real_sigaction_fn, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
        __atomic_store_n(&real_sigaction_fn, f, __ATOMIC_RELEASE);
    }
    return f;
}

static const int g_sigs[2] = {SIGINT, SIGTERM};
static struct sigaction g_app[2];       /* the application's disposition, chained */
static _Atomic int g_installed[2];
static _Atomic int g_pending_sig;       /* signal being handled, 0 = none */
static _Atomic int g_released;
static _Atomic int g_handled;           /* the freeze sequence ran in this process */
static _Atomic int g_fail_launches;     /* released and chained: held launches now fail */

static int sig_index(int sig) { return sig == SIGINT ? 0 : (sig == SIGTERM ? 1 : -1); }

int xcuda_signal_pending(void) { return atomic_load(&g_pending_sig) != 0 && !atomic_load(&g_handled); }
int xcuda_contexts_released(void) { return atomic_load(&g_fail_launches); }

/* run the application's disposition for sig, from a handler or from the helper thread */
static void chain(int sig, siginfo_t *si, void *uc) {
    int i = sig_index(sig);
    struct sigaction app = g_app[i];
    if (app.sa_handler == SIG_IGN) return;
    if (app.sa_handler == SIG_DFL) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        real_sigaction()(sig, &dfl, NULL);
        atomic_store(&g_installed[i], 0);
        raise(sig); /* delivered when the current handler (if any) returns */
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        return;
    }
    if (app.sa_flags & SA_SIGINFO) app.sa_sigaction(sig, si, uc);
    else app.sa_handler(sig);
}

static void on_signal(int sig, siginfo_t *si, void *uc) {
    int saved = errno;
    int i = sig_index(sig);
    if (i < 0 || !xcuda_runtime_active() || atomic_load(&g_released)) {
        chain(sig, si, uc); /* not (or no longer) a CUDA process: behave as without xCUDA */
    } else if (g_app[i].sa_handler != SIG_IGN) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&g_pending_sig, &expected, sig)) {
            atomic_fetch_or(&g_xcuda_gate, GATE_FREEZE_SIGNAL);
            xcuda_slot *me = xcuda_my_slot();
            if (me) STORE_RELEASE(&me->freezing, 1);
            xcuda_wake_helper();
        }
    }
    errno = saved;
}

void xcuda_install_signal_handlers(void) {
    for (int i = 0; i < 2; i++) {
        struct sigaction old, act;
        if (real_sigaction()(g_sigs[i], NULL, &old) != 0) continue;
        if (old.sa_handler == SIG_IGN && !(old.sa_flags & SA_SIGINFO)) continue; /* e.g. nohup */
        if (old.sa_sigaction == on_signal) continue;
        g_app[i] = old;
        memset(&act, 0, sizeof act);
        act.sa_sigaction = on_signal;
        act.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&act.sa_mask);
        sigaddset(&act.sa_mask, SIGINT);
        sigaddset(&act.sa_mask, SIGTERM);
        if (real_sigaction()(g_sigs[i], &act, NULL) == 0) atomic_store(&g_installed[i], 1);
    }
}

/* the application changes SIGINT/SIGTERM: record it as the chained disposition */
XCUDA_API int sigaction(int sig, const struct sigaction *act, struct sigaction *oldact) {
    int i = sig_index(sig);
    if (i < 0 || !atomic_load(&g_installed[i])) return real_sigaction()(sig, act, oldact);
    if (oldact) *oldact = g_app[i];
    if (act) g_app[i] = *act;
    return 0;
}

XCUDA_API sighandler_t signal(int sig, sighandler_t handler) {
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = handler;
    act.sa_flags = SA_RESTART;
    sigemptyset(&act.sa_mask);
    if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
    return old.sa_handler;
}

static void sync_and_release(void) {
    CUcontext saved = NULL;
    REAL(cuCtxGetCurrent)(&saved);
    pthread_mutex_lock(&g_ctx_mu);
    /* 1. synchronize everything the process queued */
    for (int i = 0; i < g_ncreated; i++) {
        if (REAL(cuCtxPushCurrent_v2)(g_created[i]) != CUDA_SUCCESS) continue;
        REAL(cuCtxSynchronize)();
        CUcontext popped;
        REAL(cuCtxPopCurrent_v2)(&popped);
    }
    for (int d = 0; d < MAX_DEV; d++) {
        if (g_primary[d].refs <= 0) continue;
        if (REAL(cuCtxPushCurrent_v2)(g_primary[d].ctx) != CUDA_SUCCESS) continue;
        REAL(cuCtxSynchronize)();
        CUcontext popped;
        REAL(cuCtxPopCurrent_v2)(&popped);
    }
    /* 2. release them */
    for (int i = 0; i < g_ncreated; i++) REAL(cuCtxDestroy_v2)(g_created[i]);
    g_ncreated = 0;
    for (int d = 0; d < MAX_DEV; d++) {
        while (g_primary[d].refs > 0) {
            if (REAL(cuDevicePrimaryCtxRelease_v2)(d) != CUDA_SUCCESS) break;
            g_primary[d].refs--;
        }
        g_primary[d].refs = 0;
        g_primary[d].ctx = NULL;
    }
    pthread_mutex_unlock(&g_ctx_mu);
}

void xcuda_freeze_run(void) {
    atomic_store(&g_handled, 1);
    int sig = atomic_load(&g_pending_sig);
    xcuda_log("freeze: signal %d", sig);
    /* launches that passed the gate before it closed reach the driver within this grace */
    struct timespec grace = {0, 2000000};
    nanosleep(&grace, NULL);
    sync_and_release();
    xcuda_memory_forget_all();
    atomic_store(&g_released, 1);
    xcuda_slot *me = xcuda_my_slot();
    if (me) STORE_RELEASE(&me->freezing, 0);
    xcuda_wake_helper(); /* peers: the freeze is over */
    xcuda_log("released: chaining signal %d", sig);
    /* hand the signal back to its owner: reinstate the application's disposition and raise
     * it again, so a handler gets a real siginfo and the default action ends the process.
     * Held launches stay held until then, so the process cannot slip out through exit(). */
    int i = sig_index(sig);
    if (i >= 0 && g_app[i].sa_handler != SIG_IGN) {
        real_sigaction()(sig, &g_app[i], NULL);
        atomic_store(&g_installed[i], 0);
        raise(sig);
    }
    /* the application's handler returned: the process goes on without contexts */
    atomic_store(&g_fail_launches, 1);
    syscall(SYS_futex, (uint32_t *)&g_xcuda_gate, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}
