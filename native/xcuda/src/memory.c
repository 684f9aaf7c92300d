/*
 * memory.c - the memory hooks: every driver entry point that allocates or frees device
 * memory reserves against the workload's quota first (state.c) and returns
 * CUDA_ERROR_OUT_OF_MEMORY when the reservation does not fit, then records what it counted
 * per handle so the matching free gives back exactly that.
 *
 * What is counted:
 *   cuMemAlloc*, cuMemAllocManaged     requested bytes (pitch * height for pitched memory)
 *   cuMemAllocAsync, ...FromPoolAsync  growth of the pool's reserved memory
 *                                      (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), not the bytes
 *                                      requested: a stream-ordered allocation served from
 *                                      memory the pool already holds costs nothing, and the
 *                                      pool gives memory back only when it shrinks (at
 *                                      synchronization or cuMemPoolTrimTo), which is observed
 *                                      on every pool operation, cuMemGetInfo and once a second
 *   cuMemCreate                        size, for device locations only
 *   cuArray*, cuMipmappedArrayCreate   the driver's own figure (cu*GetMemoryRequirements),
 *                                      falling back to element size x extent x levels
 * With no state file configured every hook is a plain pass-through (MEM_HOOK below).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "xcuda_internal.h"

/* ---- per-process table: handle -> bytes counted ---- */
enum { K_PTR = 1, K_HANDLE, K_ARRAY, K_MIPMAP, K_ASYNC };
typedef struct entry { uint64_t key; uint64_t bytes; uint32_t kind; uint32_t used; } entry;
static entry *g_tab;
static size_t g_cap, g_len, g_tomb; /* live entries, tombstones */
static pthread_mutex_t g_tab_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t slot_of(uint64_t key, uint32_t kind, size_t cap) {
    uint64_t h = (key ^ ((uint64_t)kind << 59)) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static void tab_put_locked(uint32_t kind, uint64_t key, uint64_t bytes);
static void tab_grow_locked(void) {
    size_t old_cap = g_cap;
    entry *old = g_tab;
    /* rehash at the same size when tombstones, not live entries, filled the table */
    g_cap = g_cap == 0 ? 1024 : (g_len * 4 < g_cap ? g_cap : g_cap * 2);
    g_tab = calloc(g_cap, sizeof *g_tab);
    g_len = 0;
    g_tomb = 0;
    if (!g_tab) abort();
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].used == 1) tab_put_locked(old[i].kind, old[i].key, old[i].bytes);
    free(old);
}

static void tab_put_locked(uint32_t kind, uint64_t key, uint64_t bytes) {
    if ((g_len + g_tomb + 1) * 2 > g_cap) tab_grow_locked();
    size_t i = slot_of(key, kind, g_cap);
    while (g_tab[i].used == 1 && !(g_tab[i].key == key && g_tab[i].kind == kind)) i = (i + 1) & (g_cap - 1);
    if (g_tab[i].used == 2) g_tomb--;
    if (g_tab[i].used != 1) g_len++;
    g_tab[i] = (entry){key, bytes, kind, 1};
}

static void tab_put(uint32_t kind, uint64_t key, uint64_t bytes) {
    pthread_mutex_lock(&g_tab_mu);
    tab_put_locked(kind, key, bytes);
    pthread_mutex_unlock(&g_tab_mu);
}

/* removes and returns the entry; found=0 when absent */
static uint64_t tab_take(uint32_t kind, uint64_t key, int *found) {
    uint64_t bytes = 0;
    *found = 0;
    pthread_mutex_lock(&g_tab_mu);
    if (g_cap) {
        size_t i = slot_of(key, kind, g_cap);
        while (g_tab[i].used != 0) {
            if (g_tab[i].used == 1 && g_tab[i].key == key && g_tab[i].kind == kind) {
                bytes = g_tab[i].bytes;
                g_tab[i].used = 2; /* tombstone */
                g_len--;
                g_tomb++;
                *found = 1;
                break;
            }
            i = (i + 1) & (g_cap - 1);
        }
    }
    pthread_mutex_unlock(&g_tab_mu);
    return bytes;
}

/* ---- mode: 0 unknown, 1 pass-through, 2 accounting, 3 refused ---- */
static _Atomic int g_mode;
int xcuda_runtime_refused(void);

static int mode_slow(void) {
    int m;
    if (xcuda_runtime_refused()) m = 3;
    else m = xcuda_my_slot() ? 2 : 1;
    atomic_store_explicit(&g_mode, m, memory_order_release);
    return m;
}
static inline int mode(void) {
    int m = atomic_load_explicit(&g_mode, memory_order_acquire);
    return XCUDA_LIKELY(m != 0) ? m : mode_slow();
}
#define PASS_THROUGH_UNLESS_ACCOUNTING(call) \
    do { \
        int m_ = mode(); \
        if (XCUDA_LIKELY(m_ == 1)) return call; \
        if (m_ == 3) return CUDA_ERROR_NOT_PERMITTED; \
    } while (0)

static int reserve(uint64_t bytes) { return xcuda_state_reserve(bytes, xcuda_quota_bytes()); }
static void force_reserve(uint64_t bytes) { (void)xcuda_state_reserve(bytes, 0); }
static void adjust(uint64_t counted, uint64_t actual) {
    if (actual > counted) force_reserve(actual - counted);
    else if (actual < counted) xcuda_state_release(counted - actual);
}

/* ---- linear allocations ---- */
__attribute__((noinline)) static CUresult acct_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemAlloc_v2)(dptr, bytesize));
    if (reserve(bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAlloc_v2)(dptr, bytesize);
    if (r != CUDA_SUCCESS) { xcuda_state_release(bytesize); return r; }
    tab_put(K_PTR, *dptr, bytesize);
    return r;
}

__attribute__((noinline)) static CUresult acct_cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemAlloc)(dptr, bytesize));
    if (reserve(bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAlloc)(dptr, bytesize);
    if (r != CUDA_SUCCESS) { xcuda_state_release(bytesize); return r; }
    tab_put(K_PTR, *dptr, bytesize);
    return r;
}

__attribute__((noinline)) static CUresult acct_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemAllocManaged)(dptr, bytesize, flags));
    if (reserve(bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    if (r != CUDA_SUCCESS) { xcuda_state_release(bytesize); return r; }
    tab_put(K_PTR, *dptr, bytesize);
    return r;
}

__attribute__((noinline)) static CUresult acct_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                      unsigned int ElementSizeBytes) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    uint64_t want = (uint64_t)WidthInBytes * Height;
    if (reserve(want) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) { xcuda_state_release(want); return r; }
    uint64_t actual = (uint64_t)*pPitch * Height;
    if (actual > want && reserve(actual - want) != 0) {
        REAL(cuMemFree_v2)(*dptr);
        xcuda_state_release(want);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < want) xcuda_state_release(want - actual);
    tab_put(K_PTR, *dptr, actual);
    return r;
}

__attribute__((noinline)) static CUresult acct_cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                   unsigned int Height, unsigned int ElementSizeBytes) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemAllocPitch)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    uint64_t want = (uint64_t)WidthInBytes * Height;
    if (reserve(want) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAllocPitch)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS) { xcuda_state_release(want); return r; }
    uint64_t actual = (uint64_t)*pPitch * Height;
    if (actual > want && reserve(actual - want) != 0) {
        REAL(cuMemFree)(*dptr);
        xcuda_state_release(want);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < want) xcuda_state_release(want - actual);
    tab_put(K_PTR, *dptr, actual);
    return r;
}

static CUresult free_counted(uint32_t kind, uint64_t key, CUresult r_of_free_call(uint64_t)) {
    int found;
    uint64_t bytes = tab_take(kind, key, &found);
    CUresult r = r_of_free_call(key);
    if (r == CUDA_SUCCESS) xcuda_state_release(bytes);
    else if (found) tab_put(kind, key, bytes);
    return r;
}
static CUresult call_free_v2(uint64_t k) { return REAL(cuMemFree_v2)((CUdeviceptr)k); }
static CUresult call_free_v1(uint64_t k) { return REAL(cuMemFree)((CUdeviceptr_v1)k); }
static CUresult call_release(uint64_t k) { return REAL(cuMemRelease)((CUmemGenericAllocationHandle)k); }
static CUresult call_array_destroy(uint64_t k) { return REAL(cuArrayDestroy)((CUarray)(uintptr_t)k); }
static CUresult call_mipmap_destroy(uint64_t k) {
    return REAL(cuMipmappedArrayDestroy)((CUmipmappedArray)(uintptr_t)k);
}

__attribute__((noinline)) static CUresult acct_cuMemFree_v2(CUdeviceptr dptr) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemFree_v2)(dptr));
    return free_counted(K_PTR, dptr, call_free_v2);
}

__attribute__((noinline)) static CUresult acct_cuMemFree(CUdeviceptr_v1 dptr) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemFree)(dptr));
    return free_counted(K_PTR, dptr, call_free_v1);
}

/* ---- virtual memory management ---- */
__attribute__((noinline)) static CUresult acct_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemCreate)(handle, size, prop, flags));
    if (prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return REAL(cuMemCreate)(handle, size, prop, flags);
    if (reserve(size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemCreate)(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) { xcuda_state_release(size); return r; }
    tab_put(K_HANDLE, *handle, size);
    return r;
}

__attribute__((noinline)) static CUresult acct_cuMemRelease(CUmemGenericAllocationHandle handle) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemRelease)(handle));
    return free_counted(K_HANDLE, handle, call_release);
}

/* ---- arrays ---- */
static uint64_t format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}
static uint64_t max1(uint64_t v) { return v ? v : 1; }
static uint64_t extent_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch) {
    return max1(w) * max1(h) * max1(d) * format_bytes(f) * max1(ch);
}
#define CUDA_ARRAY3D_LAYERED 0x01
#define CUDA_ARRAY3D_CUBEMAP 0x04
static uint64_t array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    uint64_t total = 0, w = d->Width, h = d->Height, z = d->Depth;
    int keep_depth = (d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    for (unsigned l = 0; l < max1(levels); l++) {
        total += extent_bytes(w, h, z, d->Format, d->NumChannels);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : (d->Height ? 1 : 0);
        if (!keep_depth) z = z > 1 ? z / 2 : (d->Depth ? 1 : 0);
    }
    return total;
}

/* the driver's own size of an array, or `fallback` */
static uint64_t array_actual(CUarray a, uint64_t fallback) {
    CUdevice dev;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    memset(&req, 0, sizeof req);
    if (REAL(cuCtxGetDevice)(&dev) == CUDA_SUCCESS &&
        REAL(cuArrayGetMemoryRequirements)(&req, a, dev) == CUDA_SUCCESS && req.size > 0)
        return req.size;
    return fallback;
}

static CUresult array_finish(CUresult r, CUarray *pHandle, uint64_t counted) {
    if (r != CUDA_SUCCESS) { xcuda_state_release(counted); return r; }
    uint64_t actual = array_actual(*pHandle, counted);
    adjust(counted, actual);
    tab_put(K_ARRAY, (uint64_t)(uintptr_t)*pHandle, actual);
    return r;
}

__attribute__((noinline)) static CUresult acct_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuArrayCreate_v2)(pHandle, d));
    if (d == NULL) return REAL(cuArrayCreate_v2)(pHandle, d);
    uint64_t b = extent_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
    if (reserve(b) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    return array_finish(REAL(cuArrayCreate_v2)(pHandle, d), pHandle, b);
}

__attribute__((noinline)) static CUresult acct_cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuArrayCreate)(pHandle, d));
    if (d == NULL) return REAL(cuArrayCreate)(pHandle, d);
    uint64_t b = extent_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
    if (reserve(b) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    return array_finish(REAL(cuArrayCreate)(pHandle, d), pHandle, b);
}

__attribute__((noinline)) static CUresult acct_cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuArray3DCreate_v2)(pHandle, d));
    if (d == NULL) return REAL(cuArray3DCreate_v2)(pHandle, d);
    uint64_t b = array3d_bytes(d, 1);
    if (reserve(b) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    return array_finish(REAL(cuArray3DCreate_v2)(pHandle, d), pHandle, b);
}

__attribute__((noinline)) static CUresult acct_cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuArray3DCreate)(pHandle, d));
    if (d == NULL) return REAL(cuArray3DCreate)(pHandle, d);
    CUDA_ARRAY3D_DESCRIPTOR d2 = {d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags};
    uint64_t b = array3d_bytes(&d2, 1);
    if (reserve(b) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    return array_finish(REAL(cuArray3DCreate)(pHandle, d), pHandle, b);
}

__attribute__((noinline)) static CUresult acct_cuArrayDestroy(CUarray hArray) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuArrayDestroy)(hArray));
    return free_counted(K_ARRAY, (uint64_t)(uintptr_t)hArray, call_array_destroy);
}

__attribute__((noinline)) static CUresult acct_cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                          unsigned int numMipmapLevels) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMipmappedArrayCreate)(pHandle, d, numMipmapLevels));
    if (d == NULL) return REAL(cuMipmappedArrayCreate)(pHandle, d, numMipmapLevels);
    uint64_t b = array3d_bytes(d, numMipmapLevels);
    if (reserve(b) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMipmappedArrayCreate)(pHandle, d, numMipmapLevels);
    if (r != CUDA_SUCCESS) { xcuda_state_release(b); return r; }
    uint64_t actual = b;
    CUdevice dev;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    memset(&req, 0, sizeof req);
    if (REAL(cuCtxGetDevice)(&dev) == CUDA_SUCCESS &&
        REAL(cuMipmappedArrayGetMemoryRequirements)(&req, *pHandle, dev) == CUDA_SUCCESS && req.size > 0)
        actual = req.size;
    adjust(b, actual);
    tab_put(K_MIPMAP, (uint64_t)(uintptr_t)*pHandle, actual);
    return r;
}

__attribute__((noinline)) static CUresult acct_cuMipmappedArrayDestroy(CUmipmappedArray h) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMipmappedArrayDestroy)(h));
    return free_counted(K_MIPMAP, (uint64_t)(uintptr_t)h, call_mipmap_destroy);
}

/* ---- stream-ordered allocation: count pool reservation growth ---- */
#define MAX_POOLS 64
typedef struct pool_rec { CUmemoryPool pool; uint64_t counted; } pool_rec;
static pool_rec g_pools[MAX_POOLS];
static int g_npools;
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;

static int pool_attr(CUmemoryPool pool, CUmemPool_attribute a, uint64_t *out) {
    cuuint64_t v = 0;
    CUresult r = REAL(cuMemPoolGetAttribute)(pool, a, &v);
    *out = v;
    return r == CUDA_SUCCESS ? 0 : -1;
}

static pool_rec *pool_find_locked(CUmemoryPool pool, int create) {
    for (int i = 0; i < g_npools; i++)
        if (g_pools[i].pool == pool) return &g_pools[i];
    if (!create || g_npools == MAX_POOLS) return NULL;
    g_pools[g_npools] = (pool_rec){pool, 0};
    return &g_pools[g_npools++];
}

/* bring the counted reservation of every known pool up to date (pools shrink on their own) */
static void pools_refresh_locked(void) {
    for (int i = 0; i < g_npools; i++) {
        uint64_t reserved;
        if (pool_attr(g_pools[i].pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0) continue;
        adjust(g_pools[i].counted, reserved);
        g_pools[i].counted = reserved;
    }
}

void xcuda_pools_refresh(void) {
    if (atomic_load(&g_mode) != 2) return;
    pthread_mutex_lock(&g_pool_mu);
    pools_refresh_locked();
    pthread_mutex_unlock(&g_pool_mu);
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s,
                                int from_pool, int ptsz) {
    if (pool == NULL) {
        CUdevice dev;
        if (REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS || REAL(cuDeviceGetMemPool)(&pool, dev) != CUDA_SUCCESS)
            pool = NULL;
    }
#define CALL_ALLOC() \
    (from_pool ? (ptsz ? REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, bytesize, pool, s) \
                       : REAL(cuMemAllocFromPoolAsync)(dptr, bytesize, pool, s)) \
               : (ptsz ? REAL(cuMemAllocAsync_ptsz)(dptr, bytesize, s) : REAL(cuMemAllocAsync)(dptr, bytesize, s)))
    uint64_t reserved0, used0;
    if (pool == NULL || pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved0) != 0 ||
        pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used0) != 0) {
        /* no pool figures: count the request like cuMemAlloc */
        if (reserve(bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult r = CALL_ALLOC();
        if (r != CUDA_SUCCESS) { xcuda_state_release(bytesize); return r; }
        tab_put(K_PTR, *dptr, bytesize);
        return r;
    }
    pthread_mutex_lock(&g_pool_mu);
    pools_refresh_locked();
    pool_rec *rec = pool_find_locked(pool, 1);
    if (rec && rec->counted != reserved0) { adjust(rec->counted, reserved0); rec->counted = reserved0; }
    uint64_t growth = used0 + bytesize > reserved0 ? used0 + bytesize - reserved0 : 0;
    if (reserve(growth) != 0) {
        pthread_mutex_unlock(&g_pool_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = CALL_ALLOC();
#undef CALL_ALLOC
    uint64_t reserved1 = reserved0;
    if (pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved1) != 0) reserved1 = reserved0 + growth;
    adjust(growth, reserved1 > reserved0 ? reserved1 - reserved0 : 0);
    if (reserved1 < reserved0) xcuda_state_release(reserved0 - reserved1);
    if (rec) rec->counted = reserved1;
    pthread_mutex_unlock(&g_pool_mu);
    if (r == CUDA_SUCCESS) tab_put(K_ASYNC, *dptr, 0);
    return r;
}

__attribute__((noinline)) static CUresult acct_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemAllocAsync)(dptr, bytesize, hStream));
    return alloc_from_pool(dptr, bytesize, NULL, hStream, 0, 0);
}
__attribute__((noinline)) static CUresult acct_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemAllocAsync_ptsz)(dptr, bytesize, hStream));
    return alloc_from_pool(dptr, bytesize, NULL, hStream, 0, 1);
}
__attribute__((noinline)) static CUresult acct_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemAllocFromPoolAsync)(dptr, bytesize, pool, hStream));
    return alloc_from_pool(dptr, bytesize, pool, hStream, 1, 0);
}
__attribute__((noinline)) static CUresult acct_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream hStream) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, bytesize, pool, hStream));
    return alloc_from_pool(dptr, bytesize, pool, hStream, 1, 1);
}

static CUresult free_async(CUdeviceptr dptr, CUstream s, int ptsz) {
    int found;
    uint64_t bytes = tab_take(K_PTR, dptr, &found); /* counted like cuMemAlloc (no pool figures) */
    if (!found) (void)tab_take(K_ASYNC, dptr, &found);
    CUresult r = ptsz ? REAL(cuMemFreeAsync_ptsz)(dptr, s) : REAL(cuMemFreeAsync)(dptr, s);
    if (r == CUDA_SUCCESS) xcuda_state_release(bytes);
    xcuda_pools_refresh();
    return r;
}
__attribute__((noinline)) static CUresult acct_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemFreeAsync)(dptr, hStream));
    return free_async(dptr, hStream, 0);
}
__attribute__((noinline)) static CUresult acct_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemFreeAsync_ptsz)(dptr, hStream));
    return free_async(dptr, hStream, 1);
}

__attribute__((noinline)) static CUresult acct_cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemPoolTrimTo)(pool, minBytesToKeep));
    CUresult r = REAL(cuMemPoolTrimTo)(pool, minBytesToKeep);
    xcuda_pools_refresh();
    return r;
}

__attribute__((noinline)) static CUresult acct_cuMemPoolDestroy(CUmemoryPool pool) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemPoolDestroy)(pool));
    pthread_mutex_lock(&g_pool_mu);
    CUresult r = REAL(cuMemPoolDestroy)(pool);
    if (r == CUDA_SUCCESS) {
        for (int i = 0; i < g_npools; i++)
            if (g_pools[i].pool == pool) {
                xcuda_state_release(g_pools[i].counted);
                g_pools[i] = g_pools[--g_npools];
                break;
            }
    }
    pthread_mutex_unlock(&g_pool_mu);
    return r;
}

/* ---- what the workload sees: its quota, not the GPU ---- */
/* total = min(quota, physical); free = min(total - used by the workload, physical free) */
static int virtual_info(uint64_t *free_b, uint64_t *total_b) {
    uint64_t quota = xcuda_quota_bytes();
    if (quota == 0) return 0;
    xcuda_pools_refresh();
    uint64_t total = *total_b < quota ? *total_b : quota;
    uint64_t used = xcuda_state_used_total();
    uint64_t f = total > used ? total - used : 0;
    *free_b = f < *free_b ? f : *free_b;
    *total_b = total;
    return 1;
}

__attribute__((noinline)) static CUresult acct_cuMemGetInfo_v2(size_t *free, size_t *total) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemGetInfo_v2)(free, total));
    size_t f = 0, t = 0;
    CUresult r = REAL(cuMemGetInfo_v2)(&f, &t);
    if (r != CUDA_SUCCESS) return r;
    uint64_t f64 = f, t64 = t;
    virtual_info(&f64, &t64);
    if (free) *free = (size_t)f64;
    if (total) *total = (size_t)t64;
    return r;
}

__attribute__((noinline)) static CUresult acct_cuMemGetInfo(unsigned int *free, unsigned int *total) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuMemGetInfo)(free, total));
    size_t f = 0, t = 0;
    CUresult r = REAL(cuMemGetInfo_v2)(&f, &t);
    if (r != CUDA_SUCCESS) return REAL(cuMemGetInfo)(free, total);
    uint64_t f64 = f, t64 = t;
    virtual_info(&f64, &t64);
    if (free) *free = f64 > UINT_MAX ? UINT_MAX : (unsigned int)f64;
    if (total) *total = t64 > UINT_MAX ? UINT_MAX : (unsigned int)t64;
    return r;
}

__attribute__((noinline)) static CUresult acct_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuDeviceTotalMem_v2)(bytes, dev));
    CUresult r = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    uint64_t quota = xcuda_quota_bytes();
    if (r == CUDA_SUCCESS && bytes && quota && quota < *bytes) *bytes = (size_t)quota;
    return r;
}

__attribute__((noinline)) static CUresult acct_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    PASS_THROUGH_UNLESS_ACCOUNTING(REAL(cuDeviceTotalMem)(bytes, dev));
    CUresult r = REAL(cuDeviceTotalMem)(bytes, dev);
    uint64_t quota = xcuda_quota_bytes();
    if (r == CUDA_SUCCESS && bytes && quota && quota < *bytes) *bytes = (unsigned int)quota;
    return r;
}


/* ---- the exported hooks: the fast path (no state file) is one load, a compare and a tail
 * call of the driver's function; everything else happens in acct_<name> ---- */
#define MEM_HOOK(name, params, args) \
    XCUDA_API CUresult name params { \
        if (XCUDA_LIKELY(atomic_load_explicit(&g_mode, memory_order_relaxed) == 1)) return REAL(name) args; \
        return acct_##name args; \
    }
MEM_HOOK(cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize),
         (dptr, bytesize))
MEM_HOOK(cuMemAlloc, (CUdeviceptr_v1 *dptr, unsigned int bytesize),
         (dptr, bytesize))
MEM_HOOK(cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags),
         (dptr, bytesize, flags))
MEM_HOOK(cuMemAllocPitch_v2, (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes),
         (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes))
MEM_HOOK(cuMemAllocPitch, (CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height, unsigned int ElementSizeBytes),
         (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes))
MEM_HOOK(cuMemFree_v2, (CUdeviceptr dptr),
         (dptr))
MEM_HOOK(cuMemFree, (CUdeviceptr_v1 dptr),
         (dptr))
MEM_HOOK(cuMemCreate, (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags),
         (handle, size, prop, flags))
MEM_HOOK(cuMemRelease, (CUmemGenericAllocationHandle handle),
         (handle))
MEM_HOOK(cuArrayCreate_v2, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray),
         (pHandle, pAllocateArray))
MEM_HOOK(cuArrayCreate, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray),
         (pHandle, pAllocateArray))
MEM_HOOK(cuArray3DCreate_v2, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray),
         (pHandle, pAllocateArray))
MEM_HOOK(cuArray3DCreate, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray),
         (pHandle, pAllocateArray))
MEM_HOOK(cuArrayDestroy, (CUarray hArray),
         (hArray))
MEM_HOOK(cuMipmappedArrayCreate, (CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc, unsigned int numMipmapLevels),
         (pHandle, pMipmappedArrayDesc, numMipmapLevels))
MEM_HOOK(cuMipmappedArrayDestroy, (CUmipmappedArray hMipmappedArray),
         (hMipmappedArray))
MEM_HOOK(cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream),
         (dptr, bytesize, hStream))
MEM_HOOK(cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream),
         (dptr, bytesize, hStream))
MEM_HOOK(cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream),
         (dptr, bytesize, pool, hStream))
MEM_HOOK(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream),
         (dptr, bytesize, pool, hStream))
MEM_HOOK(cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream),
         (dptr, hStream))
MEM_HOOK(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream),
         (dptr, hStream))
MEM_HOOK(cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep),
         (pool, minBytesToKeep))
MEM_HOOK(cuMemPoolDestroy, (CUmemoryPool pool),
         (pool))
MEM_HOOK(cuMemGetInfo_v2, (size_t *free, size_t *total),
         (free, total))
MEM_HOOK(cuMemGetInfo, (unsigned int *free, unsigned int *total),
         (free, total))
MEM_HOOK(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev),
         (bytes, dev))
MEM_HOOK(cuDeviceTotalMem, (unsigned int *bytes, CUdevice dev),
         (bytes, dev))

/* the contexts were destroyed: the driver freed everything this process held */
void xcuda_memory_forget_all(void) {
    pthread_mutex_lock(&g_tab_mu);
    free(g_tab);
    g_tab = NULL;
    g_cap = g_len = g_tomb = 0;
    pthread_mutex_unlock(&g_tab_mu);
    pthread_mutex_lock(&g_pool_mu);
    g_npools = 0;
    pthread_mutex_unlock(&g_pool_mu);
    xcuda_slot *me = xcuda_my_slot();
    if (me) STORE_RELAXED(&me->used_bytes, 0);
}

void xcuda_memory_after_fork_child(void) {
    pthread_mutex_init(&g_tab_mu, NULL);
    pthread_mutex_init(&g_pool_mu, NULL);
    free(g_tab);
    g_tab = NULL;
    g_cap = g_len = g_tomb = 0;
    g_npools = 0;
    atomic_store(&g_mode, 0);
}
