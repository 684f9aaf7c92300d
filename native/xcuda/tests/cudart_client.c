/*
 * cudart_client.c - calls the real CUDA runtime (dlopen'ed from argv[1]), which resolves the
 * driver the way frameworks do: dlopen("libcuda.so.1"), dlsym of cuGetProcAddress_v2 on that
 * handle, everything else through it. Against the fake driver the runtime stops at
 * cuGetExportTable, after cuInit: enough to see whether xCUDA was on the path.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { printf("dlopen %s\n", dlerror()); return 2; }
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cudaGetDeviceCount");
    if (!count) return 2;
    int n = -1;
    int r = count(&n);
    printf("cudaGetDeviceCount rc=%d n=%d\n", r, n);
    return 0;
}
