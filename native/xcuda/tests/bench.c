/*
 * bench.c - per-call cost of cuLaunchKernel and cuMemAlloc_v2 through xCUDA's fast path,
 * against the fake driver's own function, in one process: the hook comes from
 * dlopen("libcuda.so.1") + dlsym (xCUDA preloaded), the driver's function from its second
 * name fake_direct_<name> (same address; xCUDA leaves non-"cu" names alone). Blocks of CALLS
 * calls alternate between the two.
 *   bench launch|alloc CALLS BLOCKS      prints "block direct_ns hook_ns" per block pair
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "xcuda_cuda.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static CUdeviceptr *ptrs;
static __typeof__(&cuMemFree_v2) p_free;

static double time_launches(__typeof__(&cuLaunchKernel) f, long calls) {
    double t0 = now();
    for (long i = 0; i < calls; i++) f(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    return (now() - t0) / (double)calls;
}

static double time_allocs(__typeof__(&cuMemAlloc_v2) f, long calls) {
    double t0 = now();
    for (long i = 0; i < calls; i++) f(&ptrs[i], 256);
    double t = (now() - t0) / (double)calls;
    for (long i = calls - 1; i >= 0; i--) p_free(ptrs[i]);
    return t;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    long calls = atol(argv[2]), blocks = atol(argv[3]);
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) return 2;
#define GET(name) __typeof__(&name) p_##name = (__typeof__(&name))dlsym(h, #name)
    GET(cuInit);
    GET(cuDevicePrimaryCtxRetain);
    GET(cuCtxSetCurrent);
    GET(cuLaunchKernel);
    GET(cuMemAlloc_v2);
    __typeof__(&cuLaunchKernel) d_launch = (__typeof__(&cuLaunchKernel))dlsym(h, "fake_direct_cuLaunchKernel");
    __typeof__(&cuMemAlloc_v2) d_alloc = (__typeof__(&cuMemAlloc_v2))dlsym(h, "fake_direct_cuMemAlloc_v2");
    p_free = (__typeof__(&cuMemFree_v2))dlsym(h, "fake_direct_cuMemFree_v2");
    if (!d_launch || !d_alloc || !p_free) return 3;
    CUcontext ctx;
    if (p_cuInit(0) || p_cuDevicePrimaryCtxRetain(&ctx, 0) || p_cuCtxSetCurrent(ctx)) return 3;
    ptrs = calloc((size_t)calls, sizeof *ptrs);
    if (!ptrs) return 4;
    int launch = strcmp(argv[1], "launch") == 0;
    if (launch) time_launches(p_cuLaunchKernel, calls); /* warm up both paths */
    else time_allocs(p_cuMemAlloc_v2, calls);
    for (long b = 0; b < blocks; b++) {
        double d, x;
        if (b % 2 == 0) {
            d = launch ? time_launches(d_launch, calls) : time_allocs(d_alloc, calls);
            x = launch ? time_launches(p_cuLaunchKernel, calls) : time_allocs(p_cuMemAlloc_v2, calls);
        } else {
            x = launch ? time_launches(p_cuLaunchKernel, calls) : time_allocs(p_cuMemAlloc_v2, calls);
            d = launch ? time_launches(d_launch, calls) : time_allocs(d_alloc, calls);
        }
        printf("block %.3f %.3f\n", d, x);
    }
    printf("hook_is_xcuda %d\n", (void *)p_cuLaunchKernel != (void *)d_launch);
    free(ptrs);
    return 0;
}
