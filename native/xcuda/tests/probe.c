/*
 * probe.c - a small CUDA driver API client for the xCUDA tests.
 *
 *   probe MODE CMD...        MODE: link (only in probe_linked: calls the linked driver),
 *                            dlsym (dlopen libcuda.so.1 + dlsym), proc (dlsym
 *                            cuGetProcAddress_v2 only, everything else through it, as the
 *                            CUDA runtime does), proc1 (the same through cuGetProcAddress)
 * Environment: PROBE_CUDA_VERSION (default 12080), PROBE_PROC_FLAGS (default 0).
 * Commands print one line each, "<cmd> rc=<CUresult> ...":
 *   init | ctx                       cuInit + primary context (as the runtime does) | cuCtxCreate
 *   alloc:KIND:BYTES                 KIND: linear linear1 pitch managed async pool vmm vmmhost
 *                                    array array3d mipmap; prints the handle index
 *   free:I                           frees handle I the matching way
 *   info | info1 | total             cuMemGetInfo_v2 | cuMemGetInfo | cuDeviceTotalMem_v2
 *   sync | ssync | trim:BYTES        cuCtxSynchronize | cuStreamSynchronize | trim the pool
 *   launch:N | launchex:N | coop:N | graph:N    N launches, prints the first error
 *   rate:MS:WIN                      launch for MS ms, print launches per WIN ms window
 *   loop                             launch until a launch fails (prints "looping" first)
 *   threads:T:N                      T threads x N launches
 *   proc:SYM:VER:FLAGS               cuGetProcAddress_v2 answer, and where it points (dladdr)
 *   apphandler                       install an application SIGTERM handler that exits 3
 *   sleep:MS | waitfile:PATH | touch:PATH
 *   fork                             the child runs the remaining commands and exits, then
 *                                    the parent (having waited for it) runs them too
 *   zerostate                        what a hostile workload tries: zero used_bytes of every slot
 *                                    of $XCUDA_STATE (rc = errno of open, 0 when written)
 *   writecontrol:QUOTA               the same with $XCUDA_CONTROL: set mem_quota_bytes to QUOTA
 *                                    (0 = none); rc = errno of open, 0 when written
 *   cuinit | newctx                  cuInit alone | cuCtxCreate alone (after cuinit)
 *   getenv:NAME | setenv:NAME=VALUE | unsetenv:NAME    the process's own environment, as a
 *                                    workload edits it ("getenv NAME=<value or (unset)>")
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe_api.h"
#include "xcuda_layout.h"

#define PROBE_OFFSET(type, name, offset, doc) probe_off_##name = offset,
enum { XCUDA_SLOT_FIELDS(PROBE_OFFSET) };
#define PROBE_CTL_OFFSET(type, name, offset, doc) probe_ctl_##name = offset,
enum { XCUDA_CONTROL_FIELDS(PROBE_CTL_OFFSET) };

static probe_api api;
static int cuda_version = 12080;
static unsigned long long proc_flags;

static void load(const char *mode) {
    if (strcmp(mode, "link") == 0) {
#ifdef PROBE_LINKED
#define LINK(member, sym, base, ver) api.member = &sym;
        PROBE_API(LINK)
#undef LINK
        return;
#else
        fprintf(stderr, "link mode needs probe_linked\n");
        exit(2);
#endif
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); exit(2); }
    if (strcmp(mode, "dlsym") == 0) {
#define DLSYM(member, sym, base, ver) api.member = (__typeof__(api.member))dlsym(h, #sym);
        PROBE_API(DLSYM)
#undef DLSYM
        return;
    }
    if (strcmp(mode, "proc") == 0 || strcmp(mode, "proc1") == 0) {
        CUresult r;
        if (strcmp(mode, "proc") == 0) {
            api.GetProcAddress = (__typeof__(api.GetProcAddress))dlsym(h, "cuGetProcAddress_v2");
#define PROC(member, sym, base, ver) \
    { \
        void *p = NULL; \
        CUdriverProcAddressQueryResult st; \
        r = api.GetProcAddress(base, &p, (ver) ? (ver) : cuda_version, proc_flags, &st); \
        api.member = r == CUDA_SUCCESS ? (__typeof__(api.member))p : NULL; \
    }
            PROBE_API(PROC)
        } else {
            CUresult (*gpa)(const char *, void **, int, cuuint64_t) =
                (CUresult(*)(const char *, void **, int, cuuint64_t))dlsym(h, "cuGetProcAddress");
#undef PROC
#define PROC(member, sym, base, ver) \
    { \
        void *p = NULL; \
        r = gpa(base, &p, (ver) ? (ver) : cuda_version, proc_flags); \
        api.member = r == CUDA_SUCCESS ? (__typeof__(api.member))p : NULL; \
    }
            PROBE_API(PROC)
#undef PROC
            api.GetProcAddress = (__typeof__(api.GetProcAddress))dlsym(h, "cuGetProcAddress_v2");
        }
        (void)r;
        return;
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    exit(2);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct handle { char kind[16]; unsigned long long v; } handle;
static handle handles[4096];
static int nhandles;
static CUcontext ctx;
static CUdevice dev;
static CUmemoryPool user_pool;

#define CHECK_FN(f) do { if (!api.f) { printf("missing %s\n", #f); fflush(stdout); return; } } while (0)

static CUresult launch_one(const char *kind) {
    if (strcmp(kind, "launchex") == 0) {
        CUlaunchConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
        return api.LaunchKernelEx(&cfg, NULL, NULL, NULL);
    }
    if (strcmp(kind, "coop") == 0) return api.LaunchCooperativeKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
    if (strcmp(kind, "graph") == 0) return api.GraphLaunch(NULL, NULL);
    return api.LaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
}

static void do_alloc(const char *kind, unsigned long long bytes) {
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    unsigned long long v = 0;
    if (strcmp(kind, "linear") == 0) { CUdeviceptr p = 0; r = api.MemAlloc(&p, bytes); v = p; }
    else if (strcmp(kind, "linear1") == 0) { CUdeviceptr_v1 p = 0; r = api.MemAlloc1(&p, (unsigned)bytes); v = p; }
    else if (strcmp(kind, "managed") == 0) { CUdeviceptr p = 0; r = api.MemAllocManaged(&p, bytes, 1); v = p; }
    else if (strcmp(kind, "pitch") == 0) {
        CUdeviceptr p = 0;
        size_t pitch = 0;
        r = api.MemAllocPitch(&p, &pitch, bytes, 4, 4); /* BYTES wide, 4 rows */
        v = p;
        if (r == CUDA_SUCCESS) printf("pitch=%zu ", pitch);
    } else if (strcmp(kind, "async") == 0) { CUdeviceptr p = 0; r = api.MemAllocAsync(&p, bytes, NULL); v = p; }
    else if (strcmp(kind, "pool") == 0) {
        if (!user_pool) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = dev;
            api.MemPoolCreate(&user_pool, &props);
        }
        CUdeviceptr p = 0;
        r = api.MemAllocFromPoolAsync(&p, bytes, user_pool, NULL);
        v = p;
    } else if (strcmp(kind, "vmm") == 0 || strcmp(kind, "vmmhost") == 0) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = strcmp(kind, "vmm") == 0 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
        CUmemGenericAllocationHandle hnd = 0;
        r = api.MemCreate(&hnd, bytes, &prop, 0);
        v = hnd;
    } else if (strcmp(kind, "array") == 0) { /* BYTES = width of a float 2D array, 16 rows */
        CUDA_ARRAY_DESCRIPTOR d = {bytes, 16, CU_AD_FORMAT_FLOAT, 1};
        CUarray a = NULL;
        r = api.ArrayCreate(&a, &d);
        v = (unsigned long long)(uintptr_t)a;
    } else if (strcmp(kind, "array3d") == 0) { /* BYTES wide, 8 x 4, 2 channels of half */
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes, 8, 4, CU_AD_FORMAT_HALF, 2, 0};
        CUarray a = NULL;
        r = api.Array3DCreate(&a, &d);
        v = (unsigned long long)(uintptr_t)a;
    } else if (strcmp(kind, "mipmap") == 0) { /* BYTES x BYTES uint8, 4 levels */
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes, bytes, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
        CUmipmappedArray m = NULL;
        r = api.MipmappedArrayCreate(&m, &d, 4);
        v = (unsigned long long)(uintptr_t)m;
    }
    int idx = -1;
    if (r == CUDA_SUCCESS && nhandles < 4096) {
        idx = nhandles++;
        snprintf(handles[idx].kind, sizeof handles[idx].kind, "%s", kind);
        handles[idx].v = v;
    }
    printf("alloc %s %llu rc=%d h=%d\n", kind, bytes, (int)r, idx);
}

static void do_free(int i) {
    if (i < 0 || i >= nhandles) { printf("free rc=-1\n"); return; }
    const char *k = handles[i].kind;
    unsigned long long v = handles[i].v;
    CUresult r;
    if (strcmp(k, "linear1") == 0) r = api.MemFree1((CUdeviceptr_v1)v);
    else if (strcmp(k, "async") == 0 || strcmp(k, "pool") == 0) r = api.MemFreeAsync(v, NULL);
    else if (strncmp(k, "vmm", 3) == 0) r = api.MemRelease(v);
    else if (strncmp(k, "array", 5) == 0) r = api.ArrayDestroy((CUarray)(uintptr_t)v);
    else if (strcmp(k, "mipmap") == 0) r = api.MipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)v);
    else r = api.MemFree(v);
    printf("free %d rc=%d\n", i, (int)r);
}

typedef struct thr { int n; int errors; } thr;
static void *thread_main(void *arg) {
    thr *t = arg;
    api.CtxSetCurrent(ctx);
    for (int i = 0; i < t->n; i++)
        if (launch_one("launch") != CUDA_SUCCESS) t->errors++;
    return NULL;
}

static int app_log_fd = -1;
static void app_handler(int sig) {
    char msg[128];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long long t = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
    int n = snprintf(msg, sizeof msg, "%llu %llu %d apphandler 0 %d\n", t, t, (int)getpid(), sig);
    ssize_t w = app_log_fd >= 0 ? write(app_log_fd, msg, (size_t)n) : 0;
    n = snprintf(msg, sizeof msg, "apphandler %d\n", sig);
    w = write(1, msg, (size_t)n);
    (void)w;
    _exit(3);
}

static void run(const char *cmd) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", cmd);
    char *arg1 = strchr(buf, ':'), *arg2 = NULL;
    if (arg1) { *arg1++ = '\0'; arg2 = strchr(arg1, ':'); if (arg2) *arg2++ = '\0'; }
    if (strcmp(buf, "init") == 0) {
        CHECK_FN(Init);
        CUresult r = api.Init(0);
        if (r == CUDA_SUCCESS) r = api.DeviceGet(&dev, 0);
        if (r == CUDA_SUCCESS) r = api.PrimaryCtxRetain(&ctx, dev);
        if (r == CUDA_SUCCESS) r = api.CtxSetCurrent(ctx);
        printf("init rc=%d\n", (int)r);
    } else if (strcmp(buf, "ctx") == 0) {
        CUresult r = api.Init(0);
        if (r == CUDA_SUCCESS) r = api.DeviceGet(&dev, 0);
        if (r == CUDA_SUCCESS) r = api.CtxCreate(&ctx, 0, dev);
        printf("ctx rc=%d\n", (int)r);
    } else if (strcmp(buf, "cuinit") == 0) {
        printf("cuinit rc=%d\n", (int)api.Init(0));
    } else if (strcmp(buf, "newctx") == 0) {
        CUresult r = api.DeviceGet(&dev, 0);
        if (r == CUDA_SUCCESS) r = api.CtxCreate(&ctx, 0, dev);
        printf("newctx rc=%d\n", (int)r);
    } else if (strcmp(buf, "getenv") == 0) {
        const char *v = getenv(arg1);
        printf("getenv %s=%s\n", arg1, v ? v : "(unset)");
    } else if (strcmp(buf, "setenv") == 0) {
        char *eq = strchr(arg1, '=');
        if (eq) *eq++ = '\0';
        printf("setenv rc=%d\n", eq ? setenv(arg1, eq, 1) : -1);
    } else if (strcmp(buf, "unsetenv") == 0) {
        printf("unsetenv rc=%d\n", unsetenv(arg1));
    } else if (strcmp(buf, "alloc") == 0) {
        do_alloc(arg1, strtoull(arg2, NULL, 0));
    } else if (strcmp(buf, "free") == 0) {
        do_free(atoi(arg1));
    } else if (strcmp(buf, "info") == 0) {
        size_t f = 0, t = 0;
        CUresult r = api.MemGetInfo(&f, &t);
        printf("info rc=%d free=%zu total=%zu\n", (int)r, f, t);
    } else if (strcmp(buf, "info1") == 0) {
        unsigned int f = 0, t = 0;
        CUresult r = api.MemGetInfo1(&f, &t);
        printf("info1 rc=%d free=%u total=%u\n", (int)r, f, t);
    } else if (strcmp(buf, "total") == 0) {
        size_t t = 0;
        CUresult r = api.DeviceTotalMem(&t, dev);
        printf("total rc=%d total=%zu\n", (int)r, t);
    } else if (strcmp(buf, "sync") == 0) {
        printf("sync rc=%d\n", (int)api.CtxSynchronize());
    } else if (strcmp(buf, "ssync") == 0) {
        printf("ssync rc=%d\n", (int)api.StreamSynchronize(NULL));
    } else if (strcmp(buf, "trim") == 0) {
        CUmemoryPool p;
        api.DeviceGetMemPool(&p, dev);
        printf("trim rc=%d\n", (int)api.MemPoolTrimTo(p, strtoull(arg1, NULL, 0)));
    } else if (strcmp(buf, "launch") == 0 || strcmp(buf, "launchex") == 0 || strcmp(buf, "coop") == 0 ||
               strcmp(buf, "graph") == 0) {
        long n = atol(arg1), ok = 0;
        CUresult first = CUDA_SUCCESS;
        for (long i = 0; i < n; i++) {
            CUresult r = launch_one(buf);
            if (r == CUDA_SUCCESS) ok++;
            else if (first == CUDA_SUCCESS) first = r;
        }
        printf("%s rc=%d ok=%ld\n", buf, (int)first, ok);
    } else if (strcmp(buf, "rate") == 0) {
        uint64_t dur = strtoull(arg1, NULL, 0) * 1000000ull, win = strtoull(arg2, NULL, 0) * 1000000ull;
        uint64_t start = now_ns(), wstart = start;
        long count = 0;
        while (now_ns() - start < dur) {
            launch_one("launch");
            count++;
            uint64_t t = now_ns();
            if (t - wstart >= win) {
                printf("rate t=%.3f n=%ld\n", (double)(t - start) / 1e9, count);
                fflush(stdout);
                count = 0;
                wstart = t;
            }
        }
    } else if (strcmp(buf, "loop") == 0) {
        printf("looping\n");
        fflush(stdout);
        long n = 0;
        CUresult r;
        while ((r = launch_one("launch")) == CUDA_SUCCESS) n++;
        printf("loop rc=%d n=%ld\n", (int)r, n);
    } else if (strcmp(buf, "threads") == 0) {
        int T = atoi(arg1), N = atoi(arg2), errors = 0;
        pthread_t th[256];
        thr args[256];
        if (T > 256) T = 256;
        uint64_t t0 = now_ns();
        for (int i = 0; i < T; i++) { args[i].n = N; args[i].errors = 0; pthread_create(&th[i], NULL, thread_main, &args[i]); }
        for (int i = 0; i < T; i++) { pthread_join(th[i], NULL); errors += args[i].errors; }
        printf("threads rc=0 errors=%d elapsed_ms=%.1f\n", errors, (double)(now_ns() - t0) / 1e6);
    } else if (strcmp(buf, "proc") == 0) {
        char *arg3 = arg2 ? strchr(arg2, ':') : NULL;
        if (arg3) *arg3++ = '\0';
        void *p = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
        CUresult r = api.GetProcAddress(arg1, &p, atoi(arg2), arg3 ? strtoull(arg3, NULL, 0) : 0, &st);
        Dl_info info;
        memset(&info, 0, sizeof info);
        if (p) dladdr(p, &info);
        const char *lib = info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
        printf("proc %s rc=%d status=%d lib=%s sym=%s\n", arg1, (int)r, (int)st,
               lib ? lib + 1 : (info.dli_fname ? info.dli_fname : "-"), info.dli_sname ? info.dli_sname : "-");
    } else if (strcmp(buf, "apphandler") == 0) {
        const char *lp = getenv("FAKE_CUDA_LOG");
        if (lp) app_log_fd = open(lp, O_WRONLY | O_APPEND | O_CREAT, 0644);
        signal(SIGTERM, app_handler);
        printf("apphandler installed\n");
    } else if (strcmp(buf, "sleep") == 0) {
        struct timespec ts = {atol(arg1) / 1000, (atol(arg1) % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    } else if (strcmp(buf, "waitfile") == 0) {
        while (access(arg1, F_OK) != 0) usleep(1000);
    } else if (strcmp(buf, "touch") == 0) {
        int fd = open(arg1, O_CREAT | O_WRONLY, 0644);
        if (fd >= 0) close(fd);
    } else if (strcmp(buf, "zerostate") == 0) {
        const char *path = getenv("XCUDA_STATE");
        int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
        int err = fd < 0 ? errno : 0;
        for (int i = 0; fd >= 0 && i < XCUDA_MAX_SLOTS; i++) {
            uint64_t zero = 0;
            off_t at = XCUDA_STATE_HEADER_SIZE + (off_t)i * XCUDA_SLOT_SIZE + probe_off_used_bytes;
            if (pwrite(fd, &zero, sizeof zero, at) != (ssize_t)sizeof zero) err = errno;
        }
        if (fd >= 0) close(fd);
        printf("zerostate rc=%d\n", err);
    } else if (strcmp(buf, "writecontrol") == 0) {
        const char *path = getenv("XCUDA_CONTROL");
        int fd = path ? open(path, O_RDWR | O_CLOEXEC) : -1;
        int err = fd < 0 ? errno : 0;
        uint64_t quota = strtoull(arg1, NULL, 0);
        if (fd >= 0 && pwrite(fd, &quota, sizeof quota, probe_ctl_mem_quota_bytes) != (ssize_t)sizeof quota) err = errno;
        if (fd >= 0) close(fd);
        printf("writecontrol rc=%d\n", err);
    } else {
        printf("unknown %s\n", cmd);
    }
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: probe MODE CMD...\n"); return 2; }
    const char *v = getenv("PROBE_CUDA_VERSION");
    if (v) cuda_version = atoi(v);
    const char *f = getenv("PROBE_PROC_FLAGS");
    if (f) proc_flags = strtoull(f, NULL, 0);
    load(argv[1]);
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "fork") == 0) {
            /* the child runs the commands after "fork" and exits; the parent waits for it,
             * then runs them too (a data-loader worker and its trainer) */
            fflush(stdout);
            pid_t child = fork();
            if (child == 0) {
                printf("child\n");
                for (int j = i + 1; j < argc; j++) run(argv[j]);
                fflush(stdout);
                exit(0);
            }
            int status = 0;
            waitpid(child, &status, 0);
            printf("parent child_status=%d\n", status);
            continue;
        }
        run(argv[i]);
    }
    return 0;
}
