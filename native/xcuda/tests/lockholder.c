/*
 * lockholder.c - a workload process that allocates device memory through the driver (so
 * through xCUDA when preloaded), then takes the workload's state lock (the robust mutex in
 * the state file) and holds it until killed: the "SIGKILLed lock holder" of the tests.
 *   lockholder STATE_FILE BYTES      prints "holding" once it owns the lock
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "xcuda_cuda.h"
#include "xcuda_layout.h"

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    __typeof__(&cuInit) init = (__typeof__(&cuInit))dlsym(h, "cuInit");
    __typeof__(&cuDevicePrimaryCtxRetain) retain = (__typeof__(&cuDevicePrimaryCtxRetain))dlsym(h, "cuDevicePrimaryCtxRetain");
    __typeof__(&cuCtxSetCurrent) setcur = (__typeof__(&cuCtxSetCurrent))dlsym(h, "cuCtxSetCurrent");
    __typeof__(&cuMemAlloc_v2) alloc = (__typeof__(&cuMemAlloc_v2))dlsym(h, "cuMemAlloc_v2");
    CUcontext ctx;
    CUdeviceptr p;
    if (init(0) || retain(&ctx, 0) || setcur(ctx) || alloc(&p, strtoull(argv[2], NULL, 0))) {
        fprintf(stderr, "driver calls failed\n");
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) { perror("open"); return 2; }
    unsigned char *m = mmap(NULL, XCUDA_STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 2; }
    if (*(uint32_t *)(void *)(m + 12) != XCUDA_STATE_READY) { fprintf(stderr, "lock not initialized\n"); return 2; }
    int r = pthread_mutex_lock((pthread_mutex_t *)(void *)(m + 64));
    printf("holding rc=%d\n", r);
    fflush(stdout);
    for (;;) pause();
}
