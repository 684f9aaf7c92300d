/*
 * check_header.c - prints the numbers that must agree between include/xcuda_cuda.h and the
 * real cuda.h: enum values and struct layouts. Compiled once against each header
 * (-DUSE_CUDA_H for the toolkit's); the test compares the two outputs.
 */
#include <stddef.h>
#include <stdio.h>
#ifdef USE_CUDA_H
#include <cuda.h>
#else
#include "xcuda_cuda.h"
#endif

#define V(x) printf("%s %lld\n", #x, (long long)(x));
#define S(t) printf("sizeof %s %zu\n", #t, sizeof(t));
#define O(t, m) printf("offsetof %s.%s %zu\n", #t, #m, offsetof(t, m));

int main(void) {
    V(CUDA_SUCCESS) V(CUDA_ERROR_INVALID_VALUE) V(CUDA_ERROR_OUT_OF_MEMORY) V(CUDA_ERROR_NOT_INITIALIZED) V(CUDA_ERROR_DEVICE_UNAVAILABLE)
    V(CUDA_ERROR_INVALID_CONTEXT) V(CUDA_ERROR_NOT_FOUND) V(CUDA_ERROR_ILLEGAL_ADDRESS)
    V(CUDA_ERROR_CONTEXT_IS_DESTROYED) V(CUDA_ERROR_NOT_PERMITTED) V(CUDA_ERROR_NOT_SUPPORTED)
    V(CUDA_ERROR_MPS_CONNECTION_FAILED) V(CUDA_ERROR_MPS_RPC_FAILURE) V(CUDA_ERROR_MPS_SERVER_NOT_READY)
    V(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED) V(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED)
    V(CUDA_ERROR_MPS_CLIENT_TERMINATED) V(CUDA_ERROR_UNKNOWN)
    V(CU_GET_PROC_ADDRESS_DEFAULT) V(CU_GET_PROC_ADDRESS_LEGACY_STREAM) V(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
    V(CU_GET_PROC_ADDRESS_SUCCESS) V(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) V(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
    V(CU_AD_FORMAT_UNSIGNED_INT8) V(CU_AD_FORMAT_SIGNED_INT32) V(CU_AD_FORMAT_HALF) V(CU_AD_FORMAT_FLOAT)
    V(CU_MEM_LOCATION_TYPE_DEVICE) V(CU_MEM_LOCATION_TYPE_HOST) V(CU_MEM_ALLOCATION_TYPE_PINNED)
    V(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) V(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) V(CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    S(CUdeviceptr) S(CUdevice) S(CUmemGenericAllocationHandle)
    S(CUDA_ARRAY_DESCRIPTOR) O(CUDA_ARRAY_DESCRIPTOR, Format) O(CUDA_ARRAY_DESCRIPTOR, NumChannels)
    S(CUDA_ARRAY3D_DESCRIPTOR) O(CUDA_ARRAY3D_DESCRIPTOR, Depth) O(CUDA_ARRAY3D_DESCRIPTOR, Flags)
    S(CUDA_ARRAY_MEMORY_REQUIREMENTS) O(CUDA_ARRAY_MEMORY_REQUIREMENTS, alignment)
    S(CUmemLocation) S(CUmemAllocationProp) O(CUmemAllocationProp, location) O(CUmemAllocationProp, allocFlags)
    S(CUmemPoolProps) O(CUmemPoolProps, maxSize) O(CUmemPoolProps, usage)
    S(CUlaunchConfig) O(CUlaunchConfig, hStream) O(CUlaunchConfig, attrs) O(CUlaunchConfig, numAttrs)
    return 0;
}
