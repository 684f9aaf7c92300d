/*
 * launch.c - the launch hooks. Fast path: one relaxed load of the process-local gate word
 * and a branch, then a tail call of the real function. The gate is non-zero only while the
 * PID controller asks for a launch interval (controller.c) or a freeze is in force
 * (freeze.c); the helper thread keeps it in step with the control block.
 *
 * Slow path, in order:
 *   frozen by this process's SIGINT/SIGTERM  wait until the contexts are released, then
 *                                            fail with CUDA_ERROR_CONTEXT_IS_DESTROYED
 *   frozen by the executor or a peer         wait until unfrozen
 *   throttled                                admit at the controller's interval: each launch
 *                                            takes the next admission time max(now, next)
 *                                            and moves it by the interval (shared by the
 *                                            process's threads, lock-free), then sleeps
 *                                            until its time in slices of at most 5 ms so a
 *                                            lower interval or a freeze takes effect at once
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "xcuda_internal.h"

_Atomic uint64_t g_xcuda_interval_ns;
static _Atomic uint64_t g_next_admit_ns;

static void wait_gate(uint32_t seen, long ns) {
    struct timespec ts = {0, ns};
    syscall(SYS_futex, (uint32_t *)&g_xcuda_gate, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

CUresult xcuda_launch_gate_slow(void) {
    for (;;) {
        uint32_t g = atomic_load_explicit(&g_xcuda_gate, memory_order_acquire);
        if (g & GATE_FREEZE_SIGNAL) {
            if (xcuda_contexts_released()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
            wait_gate(g, 1000000);
            continue;
        }
        if (g & (GATE_FREEZE_EXEC | GATE_FREEZE_PEER)) {
            wait_gate(g, 10000000);
            continue;
        }
        if (!(g & GATE_THROTTLE)) return CUDA_SUCCESS;
        uint64_t iv = atomic_load_explicit(&g_xcuda_interval_ns, memory_order_relaxed);
        if (iv == 0) return CUDA_SUCCESS;
        uint64_t now = xcuda_now_ns();
        uint64_t next = atomic_load_explicit(&g_next_admit_ns, memory_order_relaxed), base;
        do {
            base = next > now ? next : now;
        } while (!atomic_compare_exchange_weak_explicit(&g_next_admit_ns, &next, base + iv, memory_order_relaxed,
                                                        memory_order_relaxed));
        if (base <= now) return CUDA_SUCCESS;
        xcuda_slot *me = xcuda_my_slot();
        if (me) __atomic_fetch_add(&me->delayed_launches, 1, __ATOMIC_RELAXED);
        while (now < base) {
            uint64_t slice = base - now < 5000000ull ? base - now : 5000000ull;
            sleep_until(now + slice);
            uint32_t g2 = atomic_load_explicit(&g_xcuda_gate, memory_order_acquire);
            if (g2 & (GATE_FREEZE_SIGNAL | GATE_FREEZE_EXEC | GATE_FREEZE_PEER)) break;
            uint64_t iv2 = atomic_load_explicit(&g_xcuda_interval_ns, memory_order_relaxed);
            if (!(g2 & GATE_THROTTLE) || iv2 == 0) return CUDA_SUCCESS;
            if (iv2 < iv) { /* the controller relaxed: admit by the new interval */
                uint64_t nb = base - (base - now) * (iv - iv2) / iv;
                base = nb;
                iv = iv2;
            }
            now = xcuda_now_ns();
        }
        if (now >= base) return CUDA_SUCCESS;
        /* a freeze arrived while sleeping: loop to honour it */
    }
}

/* Both branches are tail calls, so the fast path needs no stack frame: load the gate,
 * test, load the real function, jump (objdump -d build/libxcuda.so). For functions with
 * arguments on the stack (cuLaunchKernel's last five) GCC also copies those arguments onto
 * themselves before the jump, a handful of register moves. */
#define LAUNCH_HOOK(name, params, args) \
    __attribute__((noinline, cold)) static CUresult slow_##name params { \
        CUresult r = xcuda_launch_gate_slow(); \
        if (r != CUDA_SUCCESS) return r; \
        return REAL(name) args; \
    } \
    XCUDA_API CUresult name params { \
        if (XCUDA_UNLIKELY(atomic_load_explicit(&g_xcuda_gate, memory_order_relaxed) != 0)) return slow_##name args; \
        return REAL(name) args; \
    }

#define LAUNCH_KERNEL_PARAMS \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
     unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, \
     void **kernelParams, void **extra)
#define LAUNCH_KERNEL_ARGS \
    (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)
#define COOP_PARAMS \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, \
     unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, \
     void **kernelParams)
#define COOP_ARGS \
    (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)

LAUNCH_HOOK(cuLaunchKernel, LAUNCH_KERNEL_PARAMS, LAUNCH_KERNEL_ARGS)
LAUNCH_HOOK(cuLaunchKernel_ptsz, LAUNCH_KERNEL_PARAMS, LAUNCH_KERNEL_ARGS)
LAUNCH_HOOK(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),
            (config, f, kernelParams, extra))
LAUNCH_HOOK(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra),
            (config, f, kernelParams, extra))
LAUNCH_HOOK(cuLaunchCooperativeKernel, COOP_PARAMS, COOP_ARGS)
LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, COOP_PARAMS, COOP_ARGS)
LAUNCH_HOOK(cuLaunchCooperativeKernelMultiDevice,
            (CUDA_LAUNCH_PARAMS *launchParamsList, unsigned int numDevices, unsigned int flags),
            (launchParamsList, numDevices, flags))
LAUNCH_HOOK(cuLaunch, (CUfunction f), (f))
LAUNCH_HOOK(cuLaunchGrid, (CUfunction f, int grid_width, int grid_height), (f, grid_width, grid_height))
LAUNCH_HOOK(cuLaunchGridAsync, (CUfunction f, int grid_width, int grid_height, CUstream hStream),
            (f, grid_width, grid_height, hStream))
LAUNCH_HOOK(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))
LAUNCH_HOOK(cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))
