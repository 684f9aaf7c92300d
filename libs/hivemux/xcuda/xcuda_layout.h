/*
 * xcuda_layout.h - THE one definition of the two files shared by the executor and xCUDA
 * (MuxFlow section 4.2, workload-level protection).
 *
 *   control block  written by the executor, mapped read-only by every offline process:
 *                  memory quota, launch-control parameters of eq. 1-2 and the PID controller,
 *                  the executor's freeze flag, the MPS active thread percentage (SM share)
 *                  xCUDA sets in the client's environment before the driver initializes.
 *   state file     shared read-write by all processes of one offline workload: the robust
 *                  process-shared lock, per-process memory usage, the freeze marks that play
 *                  the part of the paper's shared pipe, and what each process's controller did.
 *
 * C includes this header (libxcuda.so, the test programs); Python parses it
 * (hivemux.xcuda.layout): the field tables below are X-macros of the form
 *   X(type, name, byte offset, "meaning")
 * and every "#define XCUDA_<NAME> <integer>" is a constant. Keep one field per line and
 * types among uint32_t, int32_t, uint64_t, double, xcuda_lock_area. Changing any offset or
 * meaning requires bumping XCUDA_LAYOUT_VERSION; both sides refuse a file of another version.
 * The C side checks every offset with _Static_assert (src/xcuda_internal.h).
 */
#ifndef XCUDA_LAYOUT_H
#define XCUDA_LAYOUT_H

#include <stdint.h>

#define XCUDA_LAYOUT_VERSION 2
#define XCUDA_CONTROL_MAGIC 0x58435443
#define XCUDA_STATE_MAGIC 0x58435354
#define XCUDA_CONTROL_SIZE 256
#define XCUDA_STATE_HEADER_SIZE 128
#define XCUDA_SLOT_SIZE 64
#define XCUDA_MAX_SLOTS 64
#define XCUDA_STATE_SIZE 4224

/* control.flags bits */
#define XCUDA_FLAG_THROTTLE 1
#define XCUDA_FLAG_FREEZE 2

/* state.init_state values */
#define XCUDA_STATE_UNINITIALIZED 0
#define XCUDA_STATE_READY 2

typedef union xcuda_lock_area {
    unsigned char bytes[64];
    uint64_t align;
} xcuda_lock_area;

#define XCUDA_CONTROL_FIELDS(X) \
    X(uint32_t, magic, 0, "XCUDA_CONTROL_MAGIC") \
    X(uint32_t, layout_version, 4, "XCUDA_LAYOUT_VERSION of the writer") \
    X(uint32_t, size, 8, "XCUDA_CONTROL_SIZE") \
    X(uint32_t, seq, 12, "seqlock: odd while the executor rewrites the parameters below") \
    X(uint32_t, flags, 16, "XCUDA_FLAG_THROTTLE enables launch control; XCUDA_FLAG_FREEZE blocks every launch") \
    X(uint32_t, sample_seq, 20, "incremented with each new (u_sm, c_sm) sample; one PID step per sample") \
    X(uint64_t, mem_quota_bytes, 24, "GPU memory quota of the workload in bytes, 0 = no quota") \
    X(double, u_sm, 32, "U_SM: current SM activity of the GPU, 0..1") \
    X(double, c_sm, 40, "C_SM: current SM clock, MHz") \
    X(double, c_h, 48, "C_H: highest SM clock, MHz") \
    X(double, t_sm, 56, "T_SM: SM clock threshold, MHz") \
    X(double, a_l, 64, "a_L: weight of a clock below T_SM (eq. 2)") \
    X(double, a_h, 72, "a_H: weight of a clock above T_SM (eq. 2)") \
    X(double, kp, 80, "PID proportional gain, microseconds of launch interval per unit of error") \
    X(double, ki, 88, "PID integral gain, microseconds per unit of error and second") \
    X(double, kd, 96, "PID derivative gain, microseconds times seconds per unit of error") \
    X(double, target, 104, "target GPU load U_GPU the controller holds, 0..1") \
    X(double, max_interval_us, 112, "upper bound of the launch interval, microseconds") \
    X(uint64_t, sample_time_ns, 120, "CLOCK_MONOTONIC time of the sample, nanoseconds; dt of the PID step") \
    X(uint64_t, generation, 128, "bumped by the executor on every write; diagnostics only") \
    X(double, active_thread_percentage, 136, "the workload's SM share: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE xCUDA sets before the driver initializes and before each context is created; 0 = leave the variable alone")

#define XCUDA_STATE_FIELDS(X) \
    X(uint32_t, magic, 0, "XCUDA_STATE_MAGIC") \
    X(uint32_t, layout_version, 4, "XCUDA_LAYOUT_VERSION of the creator") \
    X(uint32_t, size, 8, "XCUDA_STATE_SIZE") \
    X(uint32_t, init_state, 12, "XCUDA_STATE_READY once the robust lock is initialized (under flock)") \
    X(uint32_t, event_seq, 16, "futex word: bumped and woken on a freeze event (the shared pipe)") \
    X(uint32_t, max_slots, 20, "XCUDA_MAX_SLOTS") \
    X(uint64_t, reclaimed_bytes, 24, "bytes reclaimed from processes that died holding memory") \
    X(uint64_t, owner_died, 32, "times a process found the lock held by a dead process") \
    X(uint64_t, reserved0, 40, "zero") \
    X(uint64_t, reserved1, 48, "zero") \
    X(uint64_t, reserved2, 56, "zero") \
    X(xcuda_lock_area, lock, 64, "pthread mutex, PTHREAD_PROCESS_SHARED and PTHREAD_MUTEX_ROBUST")

/* slot i lives at XCUDA_STATE_HEADER_SIZE + i * XCUDA_SLOT_SIZE; pid 0 = free */
#define XCUDA_SLOT_FIELDS(X) \
    X(int32_t, pid, 0, "process id, 0 when the slot is free") \
    X(uint32_t, freezing, 4, "1 while this process freezes launches and releases its contexts after SIGINT/SIGTERM") \
    X(uint64_t, start_time, 8, "process start time (clock ticks since boot) to tell a reused pid") \
    X(uint64_t, used_bytes, 16, "device memory this process holds, bytes") \
    X(uint64_t, delayed_launches, 24, "launches the controller delayed") \
    X(uint64_t, interval_ns, 32, "current minimum interval between launches set by the PID controller, 0 = free") \
    X(double, u_gpu, 40, "U_GPU = U_SM * a_C at the last PID step (eq. 1)") \
    X(double, a_c, 48, "a_C at the last PID step (eq. 2)") \
    X(uint32_t, frozen, 56, "1 while this process holds launches (executor or peer freeze seen)") \
    X(uint32_t, pid_steps, 60, "PID steps taken (wraps)")

#endif /* XCUDA_LAYOUT_H */
