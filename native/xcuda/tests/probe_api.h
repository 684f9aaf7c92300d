/* probe_api.h - the driver entry points the probe uses, obtained one of four ways. */
#ifndef PROBE_API_H
#define PROBE_API_H
#include "xcuda_cuda.h"

/* member, exported symbol, base name for cuGetProcAddress, version asked for (0 = probe's) */
#define PROBE_API(X) \
    X(Init, cuInit, "cuInit", 0) \
    X(DeviceGet, cuDeviceGet, "cuDeviceGet", 0) \
    X(PrimaryCtxRetain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 0) \
    X(PrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 0) \
    X(CtxCreate, cuCtxCreate_v2, "cuCtxCreate", 3020) \
    X(CtxDestroy, cuCtxDestroy_v2, "cuCtxDestroy", 0) \
    X(CtxSetCurrent, cuCtxSetCurrent, "cuCtxSetCurrent", 0) \
    X(CtxSynchronize, cuCtxSynchronize, "cuCtxSynchronize", 0) \
    X(StreamSynchronize, cuStreamSynchronize, "cuStreamSynchronize", 0) \
    X(MemGetInfo, cuMemGetInfo_v2, "cuMemGetInfo", 0) \
    X(MemGetInfo1, cuMemGetInfo, "cuMemGetInfo", 2000) \
    X(DeviceTotalMem, cuDeviceTotalMem_v2, "cuDeviceTotalMem", 0) \
    X(MemAlloc, cuMemAlloc_v2, "cuMemAlloc", 0) \
    X(MemAlloc1, cuMemAlloc, "cuMemAlloc", 2000) \
    X(MemAllocPitch, cuMemAllocPitch_v2, "cuMemAllocPitch", 0) \
    X(MemAllocManaged, cuMemAllocManaged, "cuMemAllocManaged", 0) \
    X(MemFree, cuMemFree_v2, "cuMemFree", 0) \
    X(MemFree1, cuMemFree, "cuMemFree", 2000) \
    X(MemAllocAsync, cuMemAllocAsync, "cuMemAllocAsync", 0) \
    X(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 0) \
    X(MemFreeAsync, cuMemFreeAsync, "cuMemFreeAsync", 0) \
    X(MemPoolCreate, cuMemPoolCreate, "cuMemPoolCreate", 0) \
    X(MemPoolDestroy, cuMemPoolDestroy, "cuMemPoolDestroy", 0) \
    X(MemPoolTrimTo, cuMemPoolTrimTo, "cuMemPoolTrimTo", 0) \
    X(MemPoolGetAttribute, cuMemPoolGetAttribute, "cuMemPoolGetAttribute", 0) \
    X(DeviceGetMemPool, cuDeviceGetMemPool, "cuDeviceGetMemPool", 0) \
    X(MemCreate, cuMemCreate, "cuMemCreate", 0) \
    X(MemRelease, cuMemRelease, "cuMemRelease", 0) \
    X(ArrayCreate, cuArrayCreate_v2, "cuArrayCreate", 0) \
    X(Array3DCreate, cuArray3DCreate_v2, "cuArray3DCreate", 0) \
    X(ArrayDestroy, cuArrayDestroy, "cuArrayDestroy", 0) \
    X(MipmappedArrayCreate, cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 0) \
    X(MipmappedArrayDestroy, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 0) \
    X(LaunchKernel, cuLaunchKernel, "cuLaunchKernel", 0) \
    X(LaunchKernelEx, cuLaunchKernelEx, "cuLaunchKernelEx", 0) \
    X(LaunchCooperativeKernel, cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 0) \
    X(GraphLaunch, cuGraphLaunch, "cuGraphLaunch", 0) \
    X(GetProcAddress, cuGetProcAddress_v2, "cuGetProcAddress", 0)

typedef struct probe_api {
#define PROBE_MEMBER(member, sym, base, ver) __typeof__(&sym) member;
    PROBE_API(PROBE_MEMBER)
#undef PROBE_MEMBER
} probe_api;
#endif
