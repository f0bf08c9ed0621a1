/* A stand-in libcuda.so.1 for CI machines without a GPU: a driver that loads but
 * has no device, so the CUDA entries' "no device" refusals run (not only the "no
 * driver" ones). cuInit fails with CUDA_ERROR_NO_DEVICE (100), as a real driver
 * does on a machine without a GPU; with STUB_CUDA_INIT_OK=1 it succeeds and
 * reports zero devices instead. Only the symbols braid calls before refusing. */
#include <stdlib.h>

int cuInit(unsigned int flags) {
    const char *ok = getenv("STUB_CUDA_INIT_OK");
    (void)flags;
    return ok && ok[0] == '1' ? 0 : 100;
}

int cuDeviceGetCount(int *count) {
    *count = 0;
    return 0;
}

int cuGetErrorString(int error, const char **text) {
    *text = error == 100 ? "no CUDA-capable device is detected (stub driver)" : "unknown error (stub driver)";
    return 0;
}

int cuGetErrorName(int error, const char **name) {
    *name = error == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
