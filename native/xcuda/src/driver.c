/*
 * driver.c - how xCUDA reaches the real driver and how applications reach xCUDA.
 *
 * Three ways an application can obtain a driver entry point, and how each lands on a hook:
 *   1. linking against libcuda.so.1: the preloaded libxcuda.so defines the same symbols and
 *      comes first in the global scope (plain LD_PRELOAD interposition);
 *   2. dlopen("libcuda.so.1") + dlsym(handle, "cuLaunchKernel"): a handle's lookup scope does
 *      not contain preloaded objects, so xCUDA interposes dlsym itself and swaps a result that
 *      is the real driver's implementation of a hooked symbol for the hook;
 *   3. cuGetProcAddress / cuGetProcAddress_v2 (the CUDA runtime >= 11.3 resolves everything
 *      this way, with a CUDA version and, for stream-ordered calls, the per-thread default
 *      stream flag): the hook asks the real driver, which applies its own version and flag
 *      routing, and hands back the hook whose real function is the one the driver chose. If
 *      the driver answers with an address that is none of its exported symbols, the hook falls
 *      back to xCUDA's own routing table (same versions and flags as the driver's).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "xcuda_internal.h"

/* ---- lazy trampolines and missing-symbol stubs, one per driver function ---- */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define XCUDA_LAZY(name, params, args) \
    static CUresult lazy_##name params { xcuda_load_driver(); return REAL(name) args; } \
    static CUresult missing_##name params { return CUDA_ERROR_NOT_FOUND; }
XCUDA_DRIVER_API(XCUDA_LAZY)
#undef XCUDA_LAZY
#pragma GCC diagnostic pop

xcuda_real xcuda_real_fns = {
#define XCUDA_LAZY_INIT(name, params, args) .name = lazy_##name,
    XCUDA_DRIVER_API(XCUDA_LAZY_INIT)
#undef XCUDA_LAZY_INIT
};

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_fn;
static void *g_driver_handle;
static pthread_once_t g_load_once = PTHREAD_ONCE_INIT;
/* set while this thread loads the driver: a dlsym from a driver constructor must not recurse */
static __thread int t_loading;

/* dlsym is called by sanitizer runtimes before they are initialized: no instrumentation */
#define XCUDA_NO_SANITIZE __attribute__((no_sanitize_address, no_sanitize("undefined")))
XCUDA_NO_SANITIZE static dlsym_fn real_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
    if (XCUDA_UNLIKELY(f == NULL)) {
        /* dlvsym is not interposed; glibc >= 2.34 versions dlsym GLIBC_2.34, older GLIBC_2.2.5 */
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (f == NULL) f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        if (f == NULL) f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
        if (f == NULL) abort();
        __atomic_store_n(&real_dlsym_fn, f, __ATOMIC_RELEASE);
    }
    return f;
}

static void load_driver_once(void) {
    t_loading = 1;
    const char *path = xcuda_setting("XCUDA_REAL_LIBCUDA");
    if (path == NULL || path[0] == '\0') path = "libcuda.so.1";
    g_driver_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (g_driver_handle == NULL) xcuda_log("cannot open the real driver %s: %s", path, dlerror());
    dlsym_fn sym = real_dlsym();
#define XCUDA_RESOLVE(name, params, args) \
    { \
        void *p = g_driver_handle ? sym(g_driver_handle, #name) : NULL; \
        __atomic_store_n(&xcuda_real_fns.name, p ? (pfn_##name)p : missing_##name, __ATOMIC_RELEASE); \
    }
    XCUDA_DRIVER_API(XCUDA_RESOLVE)
#undef XCUDA_RESOLVE
    t_loading = 0;
}

void xcuda_load_driver(void) { pthread_once(&g_load_once, load_driver_once); }

/* ---- the hooks, and the driver's routing of base names to versioned symbols ---- */
#define PTSZ 1
typedef struct hook_entry {
    const char *symbol; /* exported name of the hook and of the real function */
    void *hook;
    const char *base;   /* name as passed to cuGetProcAddress */
    int version;        /* lowest CUDA version (x 1000 + minor x 10) that gets this symbol */
    int ptsz;           /* 1 = per-thread default stream variant */
} hook_entry;

#define H(sym, base, ver, ptsz) {#sym, (void *)sym, base, ver, ptsz}
static const hook_entry g_hooks[] = {
    H(cuInit, "cuInit", 2000, 0),
    H(cuDeviceTotalMem, "cuDeviceTotalMem", 2000, 0),
    H(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0),
    H(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0),
    H(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0),
    H(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0),
    H(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0),
    H(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0),
    H(cuCtxCreate, "cuCtxCreate", 2000, 0),
    H(cuCtxCreate_v2, "cuCtxCreate", 3020, 0),
    H(cuCtxCreate_v3, "cuCtxCreate", 11040, 0),
    H(cuCtxCreate_v4, "cuCtxCreate", 12050, 0),
    H(cuCtxDestroy, "cuCtxDestroy", 2000, 0),
    H(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0),
    H(cuMemGetInfo, "cuMemGetInfo", 2000, 0),
    H(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0),
    H(cuMemAlloc, "cuMemAlloc", 2000, 0),
    H(cuMemAlloc_v2, "cuMemAlloc", 3020, 0),
    H(cuMemAllocPitch, "cuMemAllocPitch", 2000, 0),
    H(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0),
    H(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0),
    H(cuMemFree, "cuMemFree", 2000, 0),
    H(cuMemFree_v2, "cuMemFree", 3020, 0),
    H(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0),
    H(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, PTSZ),
    H(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0),
    H(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, PTSZ),
    H(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0),
    H(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, PTSZ),
    H(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, 0),
    H(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0),
    H(cuMemCreate, "cuMemCreate", 10020, 0),
    H(cuMemRelease, "cuMemRelease", 10020, 0),
    H(cuArrayCreate, "cuArrayCreate", 2000, 0),
    H(cuArrayCreate_v2, "cuArrayCreate", 3020, 0),
    H(cuArray3DCreate, "cuArray3DCreate", 2000, 0),
    H(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0),
    H(cuArrayDestroy, "cuArrayDestroy", 2000, 0),
    H(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0),
    H(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0),
    H(cuLaunchKernel, "cuLaunchKernel", 4000, 0),
    H(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, PTSZ),
    H(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0),
    H(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, PTSZ),
    H(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0),
    H(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, PTSZ),
    H(cuLaunchCooperativeKernelMultiDevice, "cuLaunchCooperativeKernelMultiDevice", 9000, 0),
    H(cuLaunch, "cuLaunch", 2000, 0),
    H(cuLaunchGrid, "cuLaunchGrid", 2000, 0),
    H(cuLaunchGridAsync, "cuLaunchGridAsync", 2000, 0),
    H(cuGraphLaunch, "cuGraphLaunch", 10000, 0),
    H(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, PTSZ),
    H(cuGetProcAddress, "cuGetProcAddress", 11030, 0),
    H(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0),
};
#undef H
#define N_HOOKS (sizeof(g_hooks) / sizeof(g_hooks[0]))

/* The real driver's address of a hooked symbol, looked up by exported name. */
static void *real_of(const hook_entry *h) {
    xcuda_load_driver();
    return g_driver_handle ? real_dlsym()(g_driver_handle, h->symbol) : NULL;
}

static void *g_real_addr[N_HOOKS];
static pthread_once_t g_addr_once = PTHREAD_ONCE_INIT;
static void fill_real_addrs(void) {
    xcuda_load_driver();
    t_loading = 1;
    for (size_t i = 0; i < N_HOOKS; i++) g_real_addr[i] = real_of(&g_hooks[i]);
    t_loading = 0;
}

/* the hook whose real function is p, or NULL */
static void *hook_for_real(void *p) {
    pthread_once(&g_addr_once, fill_real_addrs);
    for (size_t i = 0; i < N_HOOKS; i++)
        if (g_real_addr[i] == p) return g_hooks[i].hook;
    return NULL;
}

/* xCUDA's own routing, used when the driver's answer is not one of its exported symbols:
 * the highest version <= cudaVersion, the per-thread variant when asked for and present. */
static void *hook_for_request(const char *symbol, int cuda_version, cuuint64_t flags) {
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const hook_entry *best = NULL;
    for (int pass = 0; pass < 2 && best == NULL; pass++) {
        int ptsz = pass == 0 ? want_ptsz : 0;
        if (pass == 1 && !want_ptsz) break;
        for (size_t i = 0; i < N_HOOKS; i++) {
            const hook_entry *h = &g_hooks[i];
            if (h->ptsz != ptsz || h->version > cuda_version || strcmp(h->base, symbol) != 0) continue;
            if (best == NULL || h->version > best->version) best = h;
        }
    }
    return best ? best->hook : NULL;
}

static void *route(const char *symbol, void *real_pfn, int cuda_version, cuuint64_t flags) {
    void *hook = hook_for_real(real_pfn);
    if (hook == NULL) hook = hook_for_request(symbol, cuda_version, flags);
    if (g_xcuda_debug)
        xcuda_log("cuGetProcAddress(%s, %d, %llu) -> %s", symbol, cuda_version,
                  (unsigned long long)flags, hook ? "hook" : "driver");
    return hook ? hook : real_pfn;
}

XCUDA_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    CUresult r = REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL)
        *pfn = route(symbol, *pfn, cudaVersion, flags);
    return r;
}

XCUDA_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL)
        *pfn = route(symbol, *pfn, cudaVersion, flags);
    return r;
}

/*
 * dlsym interposition (way 2 above). Only names starting with "cu" are examined, and only a
 * result that is the real driver's function of a hooked symbol is replaced. Limitation:
 * dlsym(RTLD_NEXT, ...) called by the application is answered as if libxcuda.so had asked
 * (the next object after xCUDA), which differs only for symbols xCUDA itself defines.
 */
XCUDA_API XCUDA_NO_SANITIZE void *dlsym(void *handle, const char *name) {
    void *p = real_dlsym()(handle, name);
    if (p != NULL && name[0] == 'c' && name[1] == 'u' && !t_loading) {
        void *hook = hook_for_real(p);
        if (hook != NULL) p = hook;
    }
    return p;
}
