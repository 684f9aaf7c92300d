/*
 * fake_cuda.c - a fake libcuda.so.1 for testing xCUDA without a GPU.
 *
 * It implements every entry point of include/xcuda_cuda.h with device memory that exists
 * only as numbers, contexts, memory pools that grow by granules and shrink at
 * synchronization, cuGetProcAddress with version and per-thread-stream routing, and a GPU
 * timeline: each launch occupies the fake GPU for FAKE_CUDA_LAUNCH_BUSY_US, launches are
 * asynchronous up to FAKE_CUDA_QUEUE_DEPTH queued ones (then the launch blocks, as a full
 * launch queue does), and synchronization waits for the timeline to drain.
 *
 * Environment:
 *   FAKE_CUDA_TOTAL_MEM=bytes          device memory (default 16 GiB)
 *   FAKE_CUDA_DEVICES=n                devices (default 1)
 *   FAKE_CUDA_LAUNCH_BUSY_US=us        GPU time per launch (default 0)
 *   FAKE_CUDA_QUEUE_DEPTH=n            launches queued before a launch blocks (default 64)
 *   FAKE_CUDA_OOM_AT=n                 the n-th allocation call (1-based) fails with OUT_OF_MEMORY
 *   FAKE_CUDA_ILLEGAL_ADDRESS_AT=n     the n-th launch faults: every later call returns
 *                                      CUDA_ERROR_ILLEGAL_ADDRESS (sticky, like the real one)
 *   FAKE_CUDA_MPS_ERROR=805..810       from call FAKE_CUDA_MPS_ERROR_AT (default 1) on, every
 *                                      call returns this MPS error
 *   FAKE_CUDA_LOG=path                 append "start_ns end_ns pid name result details" per call
 *   FAKE_CUDA_LOG_LAUNCHES=0           leave launches out of the log
 *   FAKE_CUDA_STATS=path               file of 3 uint64 counters: launches, busy ns, calls
 *   FAKE_CUDA_PROC_TRAMPOLINES=1       cuGetProcAddress returns wrappers, not exported symbols
 *   FAKE_CUDA_DRIVER_VERSION=v         default 13000
 *   FAKE_CUDA_ARRAY_ALIGN=bytes        array allocation granule (default 65536)
 *   FAKE_CUDA_POOL_GRANULE=bytes       memory pool growth granule (default 2 MiB)
 *   FAKE_CUDA_PITCH_ALIGN=bytes        pitch alignment (default 512)
 *   FAKE_CUDA_USAGE_DIR=dir            keep <dir>/<pid> holding the device memory this process
 *                                      holds (decimal bytes, rewritten on every change): what
 *                                      the driver knows, which the fake NVML reports per process
 *                                      (its "procdir" directive), whatever xCUDA counted
 *   FAKE_CUDA_DEVICES=dir              (a path: the fake MPS's device nodes, dir/nvidia<i>) one
 *                                      device; a context without MPS holds dir/nvidia<i> (i: the
 *                                      first of CUDA_VISIBLE_DEVICES) with an exclusive flock and
 *                                      is refused with CUDA_ERROR_DEVICE_UNAVAILABLE while an MPS
 *                                      server or another context holds it (EXCLUSIVE_PROCESS)
 *
 * MPS, as the real driver (nvidia-cuda-mps-control(1)): cuInit connects to the control daemon of
 * CUDA_MPS_PIPE_DIRECTORY (the fake one, libs/hivemux/executor/cpu_devices/fake_mps_control.py,
 * listening on <pipe>/control.sock) and asks for a server with its
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, read from the environment at that moment; it blocks while
 * the daemon serves another uid, keeps the connection while the process lives and gets the
 * percentage the server grants (the variable only lowers the server's limit). No daemon there:
 * the process runs without MPS. The cuInit line of FAKE_CUDA_LOG says what was asked and granted
 * ("percentage=<env> mps_server=<pid> mps_percentage=<granted>"); context creation logs the
 * variable as it is then.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "xcuda_cuda.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- configuration ---- */
static uint64_t cfg_total = 16ull << 30;
static int cfg_devices = 1;
static uint64_t cfg_busy_ns;
static uint64_t cfg_depth = 64;
static long cfg_oom_at = -1, cfg_illegal_at = -1, cfg_mps_at = 1;
static int cfg_mps_error;
static int cfg_log_fd = -1, cfg_log_launches = 1, cfg_trampolines;
static int cfg_version = 13000;
static uint64_t cfg_array_align = 65536, cfg_granule = 2ull << 20, cfg_pitch_align = 512;
static uint64_t *stats; /* launches, busy_ns, calls */
static const char *cfg_usage_dir; /* FAKE_CUDA_USAGE_DIR */
static const char *cfg_device_dir; /* FAKE_CUDA_DEVICES as a directory */

static uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *v = getenv(name);
    return (v && *v) ? strtoull(v, NULL, 0) : dflt;
}

__attribute__((constructor)) static void fake_init(void) {
    cfg_total = env_u64("FAKE_CUDA_TOTAL_MEM", cfg_total);
    const char *devices = getenv("FAKE_CUDA_DEVICES");
    if (devices && strchr(devices, '/')) cfg_device_dir = devices; /* the fake MPS's device nodes */
    else cfg_devices = (int)env_u64("FAKE_CUDA_DEVICES", 1);
    cfg_busy_ns = env_u64("FAKE_CUDA_LAUNCH_BUSY_US", 0) * 1000ull;
    cfg_depth = env_u64("FAKE_CUDA_QUEUE_DEPTH", 64);
    cfg_oom_at = (long)env_u64("FAKE_CUDA_OOM_AT", (uint64_t)-1);
    cfg_illegal_at = (long)env_u64("FAKE_CUDA_ILLEGAL_ADDRESS_AT", (uint64_t)-1);
    cfg_mps_error = (int)env_u64("FAKE_CUDA_MPS_ERROR", 0);
    cfg_mps_at = (long)env_u64("FAKE_CUDA_MPS_ERROR_AT", 1);
    cfg_log_launches = (int)env_u64("FAKE_CUDA_LOG_LAUNCHES", 1);
    cfg_trampolines = (int)env_u64("FAKE_CUDA_PROC_TRAMPOLINES", 0);
    cfg_version = (int)env_u64("FAKE_CUDA_DRIVER_VERSION", 13000);
    cfg_array_align = env_u64("FAKE_CUDA_ARRAY_ALIGN", cfg_array_align);
    cfg_granule = env_u64("FAKE_CUDA_POOL_GRANULE", cfg_granule);
    cfg_pitch_align = env_u64("FAKE_CUDA_PITCH_ALIGN", cfg_pitch_align);
    const char *usage = getenv("FAKE_CUDA_USAGE_DIR");
    if (usage && *usage) cfg_usage_dir = usage;
    const char *log = getenv("FAKE_CUDA_LOG");
    if (log && *log) cfg_log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    const char *st = getenv("FAKE_CUDA_STATS");
    if (st && *st) {
        int fd = open(st, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0 && ftruncate(fd, 4096) == 0) {
            void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) stats = p;
        }
        if (fd >= 0) close(fd);
    }
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static void logf_(uint64_t t0, const char *name, CUresult r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void logf_(uint64_t t0, const char *name, CUresult r, const char *fmt, ...) {
    if (cfg_log_fd < 0) return;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%llu %llu %d %s %d ", (unsigned long long)t0,
                     (unsigned long long)now_ns(), (int)getpid(), name, (int)r);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) m = 0;
    size_t len = (size_t)n + ((size_t)m < sizeof buf - (size_t)n - 1 ? (size_t)m : sizeof buf - (size_t)n - 2);
    buf[len++] = '\n';
    ssize_t w = write(cfg_log_fd, buf, len);
    (void)w;
}
#define LOG(name, r, ...) logf_(t0, name, r, __VA_ARGS__)

/* ---- sticky errors and call counting ---- */
static _Atomic long n_calls, n_allocs, n_launches;
static _Atomic int sticky;
static _Atomic int initialized;

static CUresult enter(void) {
    long c = atomic_fetch_add(&n_calls, 1) + 1;
    if (stats) __atomic_fetch_add(&stats[2], 1, __ATOMIC_RELAXED);
    if (cfg_mps_error && c >= cfg_mps_at) return (CUresult)cfg_mps_error;
    int s = atomic_load(&sticky);
    if (s) return (CUresult)s;
    return CUDA_SUCCESS;
}
#define ENTER() \
    uint64_t t0 = now_ns(); \
    do { \
        CUresult e_ = enter(); \
        if (e_ != CUDA_SUCCESS) { LOG(__func__, e_, "%s", "error"); return e_; } \
    } while (0)
#define NEED_INIT() \
    do { if (!atomic_load(&initialized)) { LOG(__func__, CUDA_ERROR_NOT_INITIALIZED, "%s", "-"); return CUDA_ERROR_NOT_INITIALIZED; } } while (0)

/* ---- memory ---- */
typedef struct fpool { uint64_t reserved, used, threshold; int dev; int alive; } fpool;
typedef struct alloc { uint64_t key, size; fpool *from; int kind; } alloc;
enum { A_LINEAR = 1, A_HANDLE, A_ARRAY, A_MIPMAP, A_POOL };
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static alloc *allocs;
static size_t n_alloc, cap_alloc;
static uint64_t used_linear; /* everything except pools */
static fpool default_pools[8];
static fpool *pools[64];
static int n_pools;
static uint64_t next_addr = 0x1000000;

static uint64_t round_up(uint64_t v, uint64_t a) { return a ? (v + a - 1) / a * a : v; }

static uint64_t used_total_locked(void) {
    uint64_t u = used_linear;
    for (int d = 0; d < 8; d++) u += default_pools[d].reserved;
    for (int i = 0; i < n_pools; i++) if (pools[i]->alive) u += pools[i]->reserved;
    return u;
}

/* FAKE_CUDA_USAGE_DIR: this process's usage as the driver sees it, for the fake NVML */
static int usage_fd = -1, usage_pid;
static uint64_t usage_written = ~0ull;

static void publish_usage_locked(void) {
    if (!cfg_usage_dir) return;
    if (usage_pid != (int)getpid()) { /* first time, or a forked child: a file of its own */
        if (usage_fd >= 0) close(usage_fd);
        char path[512];
        snprintf(path, sizeof path, "%s/%d", cfg_usage_dir, (int)getpid());
        usage_fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        usage_pid = (int)getpid();
        usage_written = ~0ull;
    }
    uint64_t used = used_total_locked();
    if (usage_fd < 0 || used == usage_written) return;
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%020llu\n", (unsigned long long)used); /* fixed width: one pwrite */
    if (pwrite(usage_fd, buf, (size_t)n, 0) == n) usage_written = used;
}

static void mu_unlock(void) {
    publish_usage_locked();
    pthread_mutex_unlock(&mu);
}

static int oom_injected(void) {
    long n = atomic_fetch_add(&n_allocs, 1) + 1;
    return n == cfg_oom_at;
}

static void add_alloc_locked(uint64_t key, uint64_t size, fpool *from, int kind) {
    if (n_alloc == cap_alloc) {
        cap_alloc = cap_alloc ? cap_alloc * 2 : 256;
        allocs = realloc(allocs, cap_alloc * sizeof *allocs);
        if (!allocs) abort();
    }
    allocs[n_alloc++] = (alloc){key, size, from, kind};
}

static int take_alloc_locked(uint64_t key, int kind, alloc *out) {
    for (size_t i = n_alloc; i-- > 0;) /* newest first: frees are mostly LIFO */
        if (allocs[i].key == key && allocs[i].kind == kind) {
            *out = allocs[i];
            allocs[i] = allocs[--n_alloc];
            return 1;
        }
    return 0;
}

static CUresult linear_alloc(uint64_t size, uint64_t *addr, int kind, int count) {
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (oom_injected()) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    if (count && used_total_locked() + size > cfg_total) { mu_unlock(); return CUDA_ERROR_OUT_OF_MEMORY; }
    *addr = next_addr;
    next_addr += round_up(size, 4096);
    if (count) used_linear += size;
    add_alloc_locked(*addr, count ? size : 0, NULL, kind);
    mu_unlock();
    return CUDA_SUCCESS;
}

static CUresult linear_free(uint64_t key, int kind) {
    alloc a;
    pthread_mutex_lock(&mu);
    int ok = take_alloc_locked(key, kind, &a);
    if (ok) used_linear -= a.size;
    mu_unlock();
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- contexts ---- */
typedef struct CUctx_st { int dev; int primary; int alive; int refs; } fake_ctx;
static fake_ctx primaries[8];
static __thread CUcontext ctx_stack[16];
static __thread int ctx_depth;
static CUcontext current(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL; }

/* ---- GPU timeline ---- */
static _Atomic uint64_t busy_until;

static void timeline_launch(void) {
    if (stats) __atomic_fetch_add(&stats[0], 1, __ATOMIC_RELAXED);
    if (cfg_busy_ns == 0) return;
    uint64_t now = now_ns(), cur = atomic_load(&busy_until), next;
    do {
        next = (cur > now ? cur : now) + cfg_busy_ns;
    } while (!atomic_compare_exchange_weak(&busy_until, &cur, next));
    if (stats) __atomic_fetch_add(&stats[1], cfg_busy_ns, __ATOMIC_RELAXED);
    uint64_t limit = cfg_depth * cfg_busy_ns;
    if (next - now > limit) sleep_until(next - limit);
}

static void timeline_drain(void) {
    uint64_t t = atomic_load(&busy_until);
    if (t > now_ns()) sleep_until(t);
}

static void pools_shrink_locked(void) {
    for (int d = 0; d < 8; d++) {
        fpool *p = &default_pools[d];
        uint64_t floor = round_up(p->used, cfg_granule);
        if (p->reserved > floor) p->reserved = floor > p->threshold ? floor : (p->threshold < p->reserved ? p->threshold : p->reserved);
    }
    for (int i = 0; i < n_pools; i++) {
        fpool *p = pools[i];
        uint64_t floor = round_up(p->used, cfg_granule);
        if (p->reserved > floor) p->reserved = floor > p->threshold ? floor : (p->threshold < p->reserved ? p->threshold : p->reserved);
    }
}

/* ---- MPS and EXCLUSIVE_PROCESS (header comment) ---- */
static int mps_fd = -1, mps_server; /* the control daemon's connection, held while the process lives */
static char mps_granted[32] = "-";
static int device_fd = -1;          /* a context of its own: the GPU held exclusively */

static const char *env_or_dash(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : "-";
}

/* CUDA_SUCCESS when connected, or when there is no daemon to connect to (no MPS) */
static CUresult mps_connect(void) {
    const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (mps_fd >= 0 || pipe == NULL || *pipe == '\0') return CUDA_SUCCESS;
    int dir = open(pipe, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return CUDA_SUCCESS;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/control.sock", dir); /* pipe paths can be long */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) { /* no daemon: no MPS */
        if (fd >= 0) close(fd);
        close(dir);
        return CUDA_SUCCESS;
    }
    close(dir);
    char req[96], answer[128];
    int n = snprintf(req, sizeof req, "connect %.60s\n", env_or_dash("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    size_t got = 0;
    if (write(fd, req, (size_t)n) != n) goto failed;
    while (got < sizeof answer - 1 && (got == 0 || answer[got - 1] != '\n')) { /* blocks while another uid is served */
        ssize_t r = read(fd, answer + got, sizeof answer - 1 - got);
        if (r <= 0) goto failed;
        got += (size_t)r;
    }
    answer[got] = '\0';
    if (sscanf(answer, "ok %d %31s", &mps_server, mps_granted) != 2) goto failed;
    mps_fd = fd;
    return CUDA_SUCCESS;
failed:
    close(fd);
    return CUDA_ERROR_MPS_CONNECTION_FAILED;
}

/* A context without MPS takes its GPU exclusively (the GPUs are in EXCLUSIVE_PROCESS mode). */
static CUresult own_device(void) {
    if (mps_fd >= 0 || cfg_device_dir == NULL || device_fd >= 0) return CUDA_SUCCESS;
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    char path[1024];
    snprintf(path, sizeof path, "%s/nvidia%d", cfg_device_dir, visible && *visible ? atoi(visible) : 0);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_NO_DEVICE;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    device_fd = fd;
    return CUDA_SUCCESS;
}

/* ================= the API ================= */
EXPORT CUresult cuInit(unsigned int Flags) {
    ENTER();
    char asked[64];
    snprintf(asked, sizeof asked, "%s", env_or_dash("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    CUresult r = mps_connect();
    if (r != CUDA_SUCCESS) {
        LOG(__func__, r, "%u percentage=%s mps=refused", Flags, asked);
        return r;
    }
    atomic_store(&initialized, 1);
    for (int d = 0; d < 8; d++) { default_pools[d].dev = d; default_pools[d].alive = 1; }
    LOG(__func__, CUDA_SUCCESS, "%u percentage=%s mps_server=%d mps_percentage=%s", Flags, asked,
        mps_fd >= 0 ? mps_server : 0, mps_fd >= 0 ? mps_granted : "-");
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = cfg_version;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    ENTER();
    NEED_INIT();
    if (!device || ordinal < 0 || ordinal >= cfg_devices) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    LOG(__func__, CUDA_SUCCESS, "%d", ordinal);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    ENTER();
    NEED_INIT();
    *count = cfg_devices;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    ENTER();
    NEED_INIT();
    if (dev < 0 || dev >= cfg_devices) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = cfg_total;
    LOG(__func__, CUDA_SUCCESS, "%llu", (unsigned long long)cfg_total);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    ENTER();
    NEED_INIT();
    if (dev < 0 || dev >= cfg_devices) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = cfg_total > 0xffffffffull ? 0xffffffffu : (unsigned)cfg_total;
    LOG(__func__, CUDA_SUCCESS, "%u", *bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    ENTER();
    if (dev < 0 || dev >= cfg_devices) return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = (CUmemoryPool)(void *)&default_pools[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *p, CUdevice dev) { return cuDeviceGetDefaultMemPool(p, dev); }

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    ENTER();
    NEED_INIT();
    if (dev < 0 || dev >= cfg_devices) return CUDA_ERROR_INVALID_DEVICE;
    CUresult held = own_device();
    if (held != CUDA_SUCCESS) { LOG(__func__, held, "dev=%d %s", dev, "exclusive_process"); return held; }
    pthread_mutex_lock(&mu);
    fake_ctx *c = &primaries[dev];
    c->dev = dev;
    c->primary = 1;
    c->alive = 1;
    c->refs++;
    int refs = c->refs;
    mu_unlock();
    *pctx = c;
    LOG(__func__, CUDA_SUCCESS, "dev=%d refs=%d percentage=%s", dev, refs, env_or_dash("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    return CUDA_SUCCESS;
}

static CUresult primary_release(const char *name, CUdevice dev, uint64_t t0) {
    if (dev < 0 || dev >= cfg_devices) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    fake_ctx *c = &primaries[dev];
    CUresult r = CUDA_SUCCESS;
    if (c->refs <= 0) r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--c->refs == 0) c->alive = 0;
    int refs = c->refs;
    mu_unlock();
    logf_(t0, name, r, "dev=%d refs=%d", dev, refs);
    return r;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { ENTER(); return primary_release(__func__, dev, t0); }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { ENTER(); return primary_release(__func__, dev, t0); }
static CUresult primary_reset(const char *name, CUdevice dev, uint64_t t0) {
    if (dev < 0 || dev >= cfg_devices) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    primaries[dev].refs = 0;
    primaries[dev].alive = 0;
    mu_unlock();
    logf_(t0, name, CUDA_SUCCESS, "dev=%d", dev);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { ENTER(); return primary_reset(__func__, dev, t0); }
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { ENTER(); return primary_reset(__func__, dev, t0); }

static CUresult ctx_create(const char *name, CUcontext *pctx, CUdevice dev, uint64_t t0) {
    if (!atomic_load(&initialized)) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= cfg_devices) return CUDA_ERROR_INVALID_DEVICE;
    CUresult held = own_device();
    if (held != CUDA_SUCCESS) { logf_(t0, name, held, "dev=%d %s", dev, "exclusive_process"); return held; }
    fake_ctx *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->dev = dev;
    c->alive = 1;
    if (ctx_depth < 16) ctx_stack[ctx_depth++] = c;
    *pctx = c;
    logf_(t0, name, CUDA_SUCCESS, "dev=%d ctx=%p percentage=%s", dev, (void *)c, env_or_dash("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    ENTER(); (void)flags; return ctx_create(__func__, pctx, dev, t0);
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    ENTER(); (void)flags; return ctx_create(__func__, pctx, dev, t0);
}
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev) {
    ENTER(); (void)p; (void)n; (void)flags; return ctx_create(__func__, pctx, dev, t0);
}
EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice dev) {
    ENTER(); (void)p; (void)flags; return ctx_create(__func__, pctx, dev, t0);
}
static CUresult ctx_destroy(const char *name, CUcontext ctx, uint64_t t0) {
    if (!ctx || ctx->primary || !ctx->alive) return CUDA_ERROR_INVALID_CONTEXT;
    timeline_drain();
    ctx->alive = 0; /* kept allocated: handles stay comparable */
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] == ctx) { memmove(&ctx_stack[i], &ctx_stack[i + 1], (size_t)(ctx_depth - i - 1) * sizeof(CUcontext)); ctx_depth--; break; }
    logf_(t0, name, CUDA_SUCCESS, "ctx=%p", (void *)ctx);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) { ENTER(); return ctx_destroy(__func__, ctx, t0); }
EXPORT CUresult cuCtxDestroy(CUcontext ctx) { ENTER(); return ctx_destroy(__func__, ctx, t0); }

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    ENTER();
    if (!ctx || !ctx->alive) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 16) return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    ENTER();
    if (!ctx_depth) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = ctx_stack[--ctx_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    ENTER();
    if (ctx == NULL) { if (ctx_depth) ctx_depth--; return CUDA_SUCCESS; }
    if (!ctx->alive) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth) ctx_stack[ctx_depth - 1] = ctx;
    else ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
    ENTER();
    *pctx = current();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    ENTER();
    CUcontext c = current();
    if (!c || !c->alive) return CUDA_ERROR_INVALID_CONTEXT;
    *device = c->dev;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSynchronize(void) {
    ENTER();
    CUcontext c = current();
    if (!c || !c->alive) { LOG(__func__, CUDA_ERROR_INVALID_CONTEXT, "%s", "-"); return CUDA_ERROR_INVALID_CONTEXT; }
    timeline_drain();
    pthread_mutex_lock(&mu);
    pools_shrink_locked();
    mu_unlock();
    LOG(__func__, CUDA_SUCCESS, "ctx=%p", (void *)c);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) {
    ENTER();
    timeline_drain();
    pthread_mutex_lock(&mu);
    pools_shrink_locked();
    mu_unlock();
    LOG(__func__, CUDA_SUCCESS, "stream=%p", (void *)s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
    ENTER();
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&mu);
    uint64_t used = used_total_locked();
    mu_unlock();
    *free_b = cfg_total > used ? cfg_total - used : 0;
    *total = cfg_total;
    LOG(__func__, CUDA_SUCCESS, "free=%zu total=%zu", *free_b, *total);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total) {
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_b = f > 0xffffffffull ? 0xffffffffu : (unsigned)f;
        *total = t > 0xffffffffull ? 0xffffffffu : (unsigned)t;
    }
    return r;
}

#define NEED_CTX() do { if (!current()) { LOG(__func__, CUDA_ERROR_INVALID_CONTEXT, "%s", "-"); return CUDA_ERROR_INVALID_CONTEXT; } } while (0)

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    ENTER();
    NEED_CTX();
    uint64_t a = 0;
    CUresult r = linear_alloc(bytesize, &a, A_LINEAR, 1);
    if (r == CUDA_SUCCESS) *dptr = a;
    LOG(__func__, r, "%zu", bytesize);
    return r;
}
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    ENTER();
    NEED_CTX();
    uint64_t a = 0;
    CUresult r = linear_alloc(bytesize, &a, A_LINEAR, 1);
    if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr_v1)a;
    LOG(__func__, r, "%u", bytesize);
    return r;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    ENTER();
    NEED_CTX();
    uint64_t a = 0;
    CUresult r = linear_alloc(bytesize, &a, A_LINEAR, 1);
    if (r == CUDA_SUCCESS) *dptr = a;
    LOG(__func__, r, "%zu flags=%u", bytesize, flags);
    return r;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t w, size_t h, unsigned int elem) {
    ENTER();
    NEED_CTX();
    if (elem != 4 && elem != 8 && elem != 16) return CUDA_ERROR_INVALID_VALUE;
    uint64_t pitch = round_up(w, cfg_pitch_align), a = 0;
    CUresult r = linear_alloc(pitch * h, &a, A_LINEAR, 1);
    if (r == CUDA_SUCCESS) { *dptr = a; *pPitch = pitch; }
    LOG(__func__, r, "%zux%zu pitch=%llu", w, h, (unsigned long long)pitch);
    return r;
}
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int w, unsigned int h,
                                unsigned int elem) {
    size_t pitch = 0;
    CUdeviceptr p = 0;
    CUresult r = cuMemAllocPitch_v2(&p, &pitch, w, h, elem);
    if (r == CUDA_SUCCESS) { *dptr = (CUdeviceptr_v1)p; *pPitch = (unsigned)pitch; }
    return r;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    ENTER();
    CUresult r = linear_free(dptr, A_LINEAR);
    LOG(__func__, r, "%#llx", (unsigned long long)dptr);
    return r;
}
EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    ENTER();
    CUresult r = linear_free(dptr, A_LINEAR);
    LOG(__func__, r, "%#x", dptr);
    return r;
}

/* ---- pools ---- */
static CUresult pool_alloc(const char *name, CUdeviceptr *dptr, size_t size, fpool *p, uint64_t t0) {
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!p || !p->alive || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (oom_injected()) { logf_(t0, name, CUDA_ERROR_OUT_OF_MEMORY, "%zu injected", size); return CUDA_ERROR_OUT_OF_MEMORY; }
    pthread_mutex_lock(&mu);
    uint64_t used = p->used + size, reserved = p->reserved;
    if (used > reserved) reserved = round_up(used, cfg_granule);
    if (used_total_locked() - p->reserved + reserved > cfg_total) {
        mu_unlock();
        logf_(t0, name, CUDA_ERROR_OUT_OF_MEMORY, "%zu", size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->used = used;
    p->reserved = reserved;
    *dptr = next_addr;
    next_addr += round_up(size, 4096);
    add_alloc_locked(*dptr, size, p, A_POOL);
    mu_unlock();
    logf_(t0, name, CUDA_SUCCESS, "%zu reserved=%llu", size, (unsigned long long)reserved);
    return CUDA_SUCCESS;
}
static fpool *current_pool(void) {
    CUcontext c = current();
    return c ? &default_pools[c->dev] : NULL;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s) {
    ENTER(); (void)s; return pool_alloc(__func__, dptr, bytesize, current_pool(), t0);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s) {
    ENTER(); (void)s; return pool_alloc(__func__, dptr, bytesize, current_pool(), t0);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool p, CUstream s) {
    ENTER(); (void)s; return pool_alloc(__func__, dptr, bytesize, (fpool *)(void *)p, t0);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool p, CUstream s) {
    ENTER(); (void)s; return pool_alloc(__func__, dptr, bytesize, (fpool *)(void *)p, t0);
}
static CUresult pool_free(const char *name, CUdeviceptr dptr, uint64_t t0) {
    alloc a;
    pthread_mutex_lock(&mu);
    int ok = take_alloc_locked(dptr, A_POOL, &a);
    if (ok) a.from->used -= a.size;
    mu_unlock();
    CUresult r = ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    logf_(t0, name, r, "%#llx", (unsigned long long)dptr);
    return r;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { ENTER(); (void)s; return pool_free(__func__, dptr, t0); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { ENTER(); (void)s; return pool_free(__func__, dptr, t0); }

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool hp, CUmemPool_attribute attr, void *value) {
    ENTER();
    fpool *p = (fpool *)(void *)hp;
    if (!p || !p->alive || !value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    cuuint64_t v;
    CUresult r = CUDA_SUCCESS;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = p->reserved; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = p->used; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v = p->threshold; break;
    default: v = 0; r = CUDA_ERROR_NOT_SUPPORTED;
    }
    mu_unlock();
    if (r == CUDA_SUCCESS) memcpy(value, &v, sizeof v);
    return r;
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool hp, size_t keep) {
    ENTER();
    fpool *p = (fpool *)(void *)hp;
    if (!p || !p->alive) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    uint64_t floor = round_up(p->used, cfg_granule);
    if (p->reserved > keep) p->reserved = keep > floor ? keep : floor;
    uint64_t res = p->reserved;
    mu_unlock();
    LOG(__func__, CUDA_SUCCESS, "keep=%zu reserved=%llu", keep, (unsigned long long)res);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *out, const CUmemPoolProps *props) {
    ENTER();
    if (!props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (n_pools == 64) { mu_unlock(); return CUDA_ERROR_OUT_OF_MEMORY; }
    fpool *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->dev = props->location.id;
    p->alive = 1;
    pools[n_pools++] = p;
    mu_unlock();
    *out = (CUmemoryPool)(void *)p;
    LOG(__func__, CUDA_SUCCESS, "%p", (void *)p);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool hp) {
    ENTER();
    fpool *p = (fpool *)(void *)hp;
    if (!p || !p->alive) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    p->alive = 0;
    p->reserved = p->used = 0;
    mu_unlock();
    LOG(__func__, CUDA_SUCCESS, "%p", (void *)p);
    return CUDA_SUCCESS;
}

/* ---- VMM ---- */
static _Atomic unsigned long long next_handle = 1;
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    ENTER();
    NEED_CTX();
    if (!prop || size == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    int device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    if (oom_injected()) { LOG(__func__, CUDA_ERROR_OUT_OF_MEMORY, "%zu injected", size); return CUDA_ERROR_OUT_OF_MEMORY; }
    pthread_mutex_lock(&mu);
    if (device && used_total_locked() + size > cfg_total) {
        mu_unlock();
        LOG(__func__, CUDA_ERROR_OUT_OF_MEMORY, "%zu", size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = atomic_fetch_add(&next_handle, 1);
    if (device) used_linear += size;
    add_alloc_locked(*handle, device ? size : 0, NULL, A_HANDLE);
    mu_unlock();
    LOG(__func__, CUDA_SUCCESS, "%zu loc=%d", size, (int)prop->location.type);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    ENTER();
    CUresult r = linear_free(handle, A_HANDLE);
    LOG(__func__, r, "%llu", handle);
    return r;
}

/* ---- arrays ---- */
typedef struct CUarray_st { uint64_t size; } fake_array;
typedef struct CUmipmappedArray_st { uint64_t size; } fake_mipmap;
static uint64_t fmt_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}
static uint64_t m1(uint64_t v) { return v ? v : 1; }
static CUresult array_make(const char *name, CUarray *out, uint64_t w, uint64_t h, uint64_t d, CUarray_format f,
                           unsigned ch, uint64_t t0) {
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    if (!out || w == 0 || !fmt_bytes(f) || (ch != 1 && ch != 2 && ch != 4)) return CUDA_ERROR_INVALID_VALUE;
    uint64_t size = round_up(w * m1(h) * m1(d) * fmt_bytes(f) * ch, cfg_array_align);
    if (oom_injected()) { logf_(t0, name, CUDA_ERROR_OUT_OF_MEMORY, "injected"); return CUDA_ERROR_OUT_OF_MEMORY; }
    pthread_mutex_lock(&mu);
    if (used_total_locked() + size > cfg_total) { mu_unlock(); return CUDA_ERROR_OUT_OF_MEMORY; }
    fake_array *a = malloc(sizeof *a);
    if (!a) abort();
    a->size = size;
    used_linear += size;
    add_alloc_locked((uint64_t)(uintptr_t)a, size, NULL, A_ARRAY);
    mu_unlock();
    *out = a;
    logf_(t0, name, CUDA_SUCCESS, "size=%llu", (unsigned long long)size);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuArrayCreate_v2(CUarray *p, const CUDA_ARRAY_DESCRIPTOR *d) {
    ENTER();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_make(__func__, p, d->Width, d->Height, 1, d->Format, d->NumChannels, t0);
}
EXPORT CUresult cuArrayCreate(CUarray *p, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    ENTER();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_make(__func__, p, d->Width, d->Height, 1, d->Format, d->NumChannels, t0);
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *p, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    ENTER();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_make(__func__, p, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, t0);
}
EXPORT CUresult cuArray3DCreate(CUarray *p, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    ENTER();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_make(__func__, p, d->Width, d->Height, d->Depth, d->Format, d->NumChannels, t0);
}
EXPORT CUresult cuArrayDestroy(CUarray a) {
    ENTER();
    alloc x;
    pthread_mutex_lock(&mu);
    int ok = a && take_alloc_locked((uint64_t)(uintptr_t)a, A_ARRAY, &x);
    if (ok) used_linear -= x.size;
    mu_unlock();
    if (ok) free(a);
    LOG(__func__, ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE, "%s", "-");
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
EXPORT CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUarray a, CUdevice dev) {
    ENTER();
    (void)dev;
    if (!req || !a) return CUDA_ERROR_INVALID_VALUE;
    memset(req, 0, sizeof *req);
    req->size = a->size;
    req->alignment = cfg_array_align;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *out, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    ENTER();
    NEED_CTX();
    if (!out || !d || d->Width == 0 || !fmt_bytes(d->Format) || levels == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t w = d->Width, h = d->Height, z = d->Depth, size = 0;
    for (unsigned l = 0; l < levels; l++) {
        size += round_up(m1(w) * m1(h) * m1(z) * fmt_bytes(d->Format) * m1(d->NumChannels), cfg_array_align);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        z = z > 1 ? z / 2 : z;
    }
    if (oom_injected()) { LOG(__func__, CUDA_ERROR_OUT_OF_MEMORY, "injected"); return CUDA_ERROR_OUT_OF_MEMORY; }
    pthread_mutex_lock(&mu);
    if (used_total_locked() + size > cfg_total) { mu_unlock(); return CUDA_ERROR_OUT_OF_MEMORY; }
    fake_mipmap *m = malloc(sizeof *m);
    if (!m) abort();
    m->size = size;
    used_linear += size;
    add_alloc_locked((uint64_t)(uintptr_t)m, size, NULL, A_MIPMAP);
    mu_unlock();
    *out = m;
    LOG(__func__, CUDA_SUCCESS, "levels=%u size=%llu", levels, (unsigned long long)size);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
    ENTER();
    alloc x;
    pthread_mutex_lock(&mu);
    int ok = m && take_alloc_locked((uint64_t)(uintptr_t)m, A_MIPMAP, &x);
    if (ok) used_linear -= x.size;
    mu_unlock();
    if (ok) free(m);
    LOG(__func__, ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE, "%s", "-");
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
EXPORT CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUmipmappedArray m,
                                                      CUdevice dev) {
    ENTER();
    (void)dev;
    if (!req || !m) return CUDA_ERROR_INVALID_VALUE;
    memset(req, 0, sizeof *req);
    req->size = m->size;
    req->alignment = cfg_array_align;
    return CUDA_SUCCESS;
}

/* ---- launches ---- */
static CUresult launch(const char *name, uint64_t t0) {
    CUcontext c = current();
    if (!c || !c->alive) { logf_(t0, name, CUDA_ERROR_INVALID_CONTEXT, "-"); return CUDA_ERROR_INVALID_CONTEXT; }
    long n = atomic_fetch_add(&n_launches, 1) + 1;
    if (n == cfg_illegal_at) {
        atomic_store(&sticky, CUDA_ERROR_ILLEGAL_ADDRESS);
        logf_(t0, name, CUDA_ERROR_ILLEGAL_ADDRESS, "fault at launch %ld", n);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    timeline_launch();
    if (cfg_log_launches) logf_(t0, name, CUDA_SUCCESS, "n=%ld", n);
    return CUDA_SUCCESS;
}
#define LAUNCH_PARAMS \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
     unsigned int bz, unsigned int shm, CUstream s, void **kp, void **extra)
#define UNUSED_LAUNCH (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)s; (void)kp
EXPORT CUresult cuLaunchKernel LAUNCH_PARAMS { ENTER(); UNUSED_LAUNCH; (void)extra; return launch(__func__, t0); }
EXPORT CUresult cuLaunchKernel_ptsz LAUNCH_PARAMS { ENTER(); UNUSED_LAUNCH; (void)extra; return launch(__func__, t0); }
#define COOP_PARAMS \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
     unsigned int bz, unsigned int shm, CUstream s, void **kp)
EXPORT CUresult cuLaunchCooperativeKernel COOP_PARAMS { ENTER(); UNUSED_LAUNCH; return launch(__func__, t0); }
EXPORT CUresult cuLaunchCooperativeKernel_ptsz COOP_PARAMS { ENTER(); UNUSED_LAUNCH; return launch(__func__, t0); }
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **kp, void **extra) {
    ENTER(); (void)f; (void)kp; (void)extra;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return launch(__func__, t0);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **kp, void **extra) {
    ENTER(); (void)f; (void)kp; (void)extra;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return launch(__func__, t0);
}
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *l, unsigned int n, unsigned int flags) {
    ENTER(); (void)l; (void)n; (void)flags; return launch(__func__, t0);
}
EXPORT CUresult cuLaunch(CUfunction f) { ENTER(); (void)f; return launch(__func__, t0); }
EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) { ENTER(); (void)f; (void)w; (void)h; return launch(__func__, t0); }
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
    ENTER(); (void)f; (void)w; (void)h; (void)s; return launch(__func__, t0);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { ENTER(); (void)g; (void)s; return launch(__func__, t0); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { ENTER(); (void)g; (void)s; return launch(__func__, t0); }

/* ---- cuGetProcAddress with the driver's version and stream routing ---- */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define TRAMP(name, params, args) static CUresult tramp_##name params { return name args; }
XCUDA_DRIVER_API(TRAMP)
#undef TRAMP
#pragma GCC diagnostic pop

typedef struct proc { const char *base; int version; int ptsz; void *fn; void *tramp; } proc;
#define P(base, sym, ver, ptsz) {base, ver, ptsz, (void *)sym, (void *)tramp_##sym}
static const proc procs[] = {
    P("cuInit", cuInit, 2000, 0),
    P("cuDriverGetVersion", cuDriverGetVersion, 2020, 0),
    P("cuDeviceGet", cuDeviceGet, 2000, 0),
    P("cuDeviceGetCount", cuDeviceGetCount, 2000, 0),
    P("cuDeviceTotalMem", cuDeviceTotalMem, 2000, 0),
    P("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020, 0),
    P("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool, 11020, 0),
    P("cuDeviceGetMemPool", cuDeviceGetMemPool, 11020, 0),
    P("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000, 0),
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease, 7000, 0),
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000, 0),
    P("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset, 7000, 0),
    P("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2, 11000, 0),
    P("cuCtxCreate", cuCtxCreate, 2000, 0),
    P("cuCtxCreate", cuCtxCreate_v2, 3020, 0),
    P("cuCtxCreate", cuCtxCreate_v3, 11040, 0),
    P("cuCtxCreate", cuCtxCreate_v4, 12050, 0),
    P("cuCtxDestroy", cuCtxDestroy, 2000, 0),
    P("cuCtxDestroy", cuCtxDestroy_v2, 4000, 0),
    P("cuCtxPushCurrent", cuCtxPushCurrent_v2, 4000, 0),
    P("cuCtxPopCurrent", cuCtxPopCurrent_v2, 4000, 0),
    P("cuCtxSetCurrent", cuCtxSetCurrent, 4000, 0),
    P("cuCtxGetCurrent", cuCtxGetCurrent, 4000, 0),
    P("cuCtxGetDevice", cuCtxGetDevice, 2000, 0),
    P("cuCtxSynchronize", cuCtxSynchronize, 2000, 0),
    P("cuStreamSynchronize", cuStreamSynchronize, 2000, 0),
    P("cuMemGetInfo", cuMemGetInfo, 2000, 0),
    P("cuMemGetInfo", cuMemGetInfo_v2, 3020, 0),
    P("cuMemAlloc", cuMemAlloc, 2000, 0),
    P("cuMemAlloc", cuMemAlloc_v2, 3020, 0),
    P("cuMemAllocPitch", cuMemAllocPitch, 2000, 0),
    P("cuMemAllocPitch", cuMemAllocPitch_v2, 3020, 0),
    P("cuMemAllocManaged", cuMemAllocManaged, 6000, 0),
    P("cuMemFree", cuMemFree, 2000, 0),
    P("cuMemFree", cuMemFree_v2, 3020, 0),
    P("cuMemAllocAsync", cuMemAllocAsync, 11020, 0),
    P("cuMemAllocAsync", cuMemAllocAsync_ptsz, 11020, 1),
    P("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, 11020, 0),
    P("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync_ptsz, 11020, 1),
    P("cuMemFreeAsync", cuMemFreeAsync, 11020, 0),
    P("cuMemFreeAsync", cuMemFreeAsync_ptsz, 11020, 1),
    P("cuMemPoolGetAttribute", cuMemPoolGetAttribute, 11020, 0),
    P("cuMemPoolTrimTo", cuMemPoolTrimTo, 11020, 0),
    P("cuMemPoolCreate", cuMemPoolCreate, 11020, 0),
    P("cuMemPoolDestroy", cuMemPoolDestroy, 11020, 0),
    P("cuMemCreate", cuMemCreate, 10020, 0),
    P("cuMemRelease", cuMemRelease, 10020, 0),
    P("cuArrayCreate", cuArrayCreate, 2000, 0),
    P("cuArrayCreate", cuArrayCreate_v2, 3020, 0),
    P("cuArray3DCreate", cuArray3DCreate, 2000, 0),
    P("cuArray3DCreate", cuArray3DCreate_v2, 3020, 0),
    P("cuArrayDestroy", cuArrayDestroy, 2000, 0),
    P("cuArrayGetMemoryRequirements", cuArrayGetMemoryRequirements, 11060, 0),
    P("cuMipmappedArrayCreate", cuMipmappedArrayCreate, 5000, 0),
    P("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy, 5000, 0),
    P("cuMipmappedArrayGetMemoryRequirements", cuMipmappedArrayGetMemoryRequirements, 11060, 0),
    P("cuLaunchKernel", cuLaunchKernel, 4000, 0),
    P("cuLaunchKernel", cuLaunchKernel_ptsz, 7000, 1),
    P("cuLaunchKernelEx", cuLaunchKernelEx, 11060, 0),
    P("cuLaunchKernelEx", cuLaunchKernelEx_ptsz, 11060, 1),
    P("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel, 9000, 0),
    P("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel_ptsz, 9000, 1),
    P("cuLaunchCooperativeKernelMultiDevice", cuLaunchCooperativeKernelMultiDevice, 9000, 0),
    P("cuLaunch", cuLaunch, 2000, 0),
    P("cuLaunchGrid", cuLaunchGrid, 2000, 0),
    P("cuLaunchGridAsync", cuLaunchGridAsync, 2000, 0),
    P("cuGraphLaunch", cuGraphLaunch, 10000, 0),
    P("cuGraphLaunch", cuGraphLaunch_ptsz, 10000, 1),
    P("cuGetProcAddress", cuGetProcAddress, 11030, 0),
    P("cuGetProcAddress", cuGetProcAddress_v2, 12000, 0),
};
#undef P

static CUresult proc_lookup(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status) {
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const proc *best = NULL;
    int known = 0;
    for (int pass = 0; pass < 2 && !best; pass++) {
        if (pass == 1 && !want_ptsz) break;
        int ptsz = pass == 0 ? want_ptsz : 0;
        for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
            if (strcmp(procs[i].base, symbol) != 0) continue;
            known = 1;
            if (procs[i].ptsz != ptsz || procs[i].version > ver) continue;
            if (!best || procs[i].version > best->version) best = &procs[i];
        }
    }
    if (!best) {
        *pfn = NULL;
        if (status) *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = cfg_trampolines ? best->tramp : best->fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    uint64_t t0 = now_ns();
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = proc_lookup(symbol, pfn, cudaVersion, flags, NULL);
    LOG(__func__, r, "%s %d %llu", symbol, cudaVersion, (unsigned long long)flags);
    return r;
}
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    uint64_t t0 = now_ns();
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = proc_lookup(symbol, pfn, cudaVersion, flags, status);
    LOG(__func__, r, "%s %d %llu", symbol, cudaVersion, (unsigned long long)flags);
    return r;
}

__attribute__((destructor)) static void fake_fini(void) {
    uint64_t t0 = now_ns();
    LOG("exit", CUDA_SUCCESS, "calls=%ld", atomic_load(&n_calls));
}

/* Second names of the benchmarked entry points, at the same addresses: a process with xCUDA
 * preloaded can time the driver's own function next to the hook (xCUDA only ever swaps
 * "cu*" names), in the same process and cache state. */
EXPORT CUresult fake_direct_cuLaunchKernel LAUNCH_PARAMS __attribute__((alias("cuLaunchKernel")));
EXPORT CUresult fake_direct_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) __attribute__((alias("cuMemAlloc_v2")));
EXPORT CUresult fake_direct_cuMemFree_v2(CUdeviceptr dptr) __attribute__((alias("cuMemFree_v2")));
