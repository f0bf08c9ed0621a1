/* A stand-in libcuda.so.1 for CI machines without a GPU: a driver that loads but
 * has no device, so the CUDA entries' "no device" refusals run (not only the "no
 * driver" ones). cuInit fails with CUDA_ERROR_NO_DEVICE (100), as a real driver
 * does on a machine without a GPU; with STUB_CUDA_INIT_OK=1 it succeeds and
 * reports zero devices instead.
 *
 * With STUB_CUDA_DEVICES=1 it reports one device whose context and stream open,
 * so that a device gets as far as loading its kernels: cuModuleLoadData checks
 * the image looks like braid's PTX for compute_70 (text with one of its kernels)
 * and refuses it with CUDA_ERROR_NO_DEVICE, or with
 * CUDA_ERROR_INVALID_PTX (218) when it is not PTX. Only the symbols braid calls. */
#include <stdlib.h>
#include <string.h>

static int devices_mode(void) {
    const char *d = getenv("STUB_CUDA_DEVICES");
    return d && d[0] == '1';
}

int cuInit(unsigned int flags) {
    const char *ok = getenv("STUB_CUDA_INIT_OK");
    (void)flags;
    return devices_mode() || (ok && ok[0] == '1') ? 0 : 100;
}

int cuDeviceGetCount(int *count) {
    *count = devices_mode() ? 1 : 0;
    return 0;
}

int cuGetErrorString(int error, const char **text) {
    *text = error == 100   ? "no CUDA-capable device is detected (stub driver)"
            : error == 218 ? "not PTX (stub driver)"
                           : "unknown error (stub driver)";
    return 0;
}

int cuGetErrorName(int error, const char **name) {
    *name = error == 100 ? "CUDA_ERROR_NO_DEVICE" : error == 218 ? "CUDA_ERROR_INVALID_PTX" : "CUDA_ERROR_UNKNOWN";
    return 0;
}

/* One device, one context, streams that are never used. */
static int the_context;
static void *current;

int cuDeviceGet(int *device, int ordinal) {
    if (!devices_mode() || ordinal != 0) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    *device = 0;
    return 0;
}

int cuDeviceGetAttribute(int *value, int attribute, int device) {
    (void)device;
    /* 75, 76: compute capability major, minor (7.0); anything else 0. */
    *value = attribute == 75 ? 7 : 0;
    return 0;
}

int cuDeviceGetName(char *name, int len, int device) {
    (void)device;
    strncpy(name, "stub device", (size_t)len);
    if (len > 0) name[len - 1] = 0;
    return 0;
}

int cuDevicePrimaryCtxRetain(void **ctx, int device) {
    (void)device;
    *ctx = &the_context;
    return 0;
}

int cuDevicePrimaryCtxRelease_v2(int device) {
    (void)device;
    return 0;
}

int cuCtxGetCurrent(void **ctx) {
    *ctx = current;
    return 0;
}

int cuCtxSetCurrent(void *ctx) {
    current = ctx;
    return 0;
}

int cuCtxSynchronize(void) { return 0; }

int cuStreamCreate(void **stream, unsigned int flags) {
    static int a_stream;
    (void)flags;
    *stream = &a_stream;
    return 0;
}

int cuStreamDestroy_v2(void *stream) {
    (void)stream;
    return 0;
}

int cuModuleLoadData(void **module, const void *image) {
    const char *ptx = image;
    (void)module;
    if (strncmp(ptx, "//", 2) != 0 || !strstr(ptx, ".target sm_70") || !strstr(ptx, ".entry braid_reduce_f32_sum("))
        return 218;
    return 100;
}
