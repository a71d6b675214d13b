/*
 * cuda_device.c - the process's GPU and the one cudaError_t mapping
 * (kvr_cuda.h).
 *
 * The GPU is opened once, by whoever first asks for cuda:N (the node's start
 * path, `kvrail run --device`), after the checks that turn a missing driver,
 * a missing GPU or a full one into a sentence; every other thread that
 * issues CUDA work binds itself to it with kvr_cuda_bind().
 */
#include <stdatomic.h>
#include <stdio.h>

#include "kvr_cuda.h"
#include "kvr_cublas_dl.h"
#include "kvr_log.h"

static atomic_int g_device = -1;

kvr_status_t kvr_cuda_status(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return KVR_OK;
    case cudaErrorMemoryAllocation:
        return KVR_ERR_NO_MEMORY;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
        return KVR_ERR_NOT_FOUND;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidSymbol:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
        return KVR_ERR_INVALID;
    case cudaErrorNotSupported:
    case cudaErrorNotPermitted:
        return KVR_ERR_UNSUPPORTED;
    case cudaErrorLaunchTimeout:
        return KVR_ERR_TIMEOUT;
    default:
        return KVR_ERR_IO;
    }
}

kvr_status_t kvr_cuda_fail(cudaError_t e, const char *what, const char *file, int line)
{
    KVR_LOG_ERROR("cuda", "%s at %s:%d: %s: %s", what, file, line, cudaGetErrorName(e),
                  cudaGetErrorString(e));
    return kvr_cuda_status(e);
}

kvr_status_t kvr_cuda_device_open(int device, size_t need_bytes, char *err, size_t err_len)
{
    if (device < 0) {
        snprintf(err, err_len, "cuda:%d: not a device index", device);
        return KVR_ERR_INVALID;
    }
    int cur = atomic_load(&g_device);
    if (cur >= 0 && cur != device) {
        snprintf(err, err_len, "cuda:%d: this process already runs on cuda:%d (one GPU a process)",
                 device, cur);
        return KVR_ERR_BUSY;
    }
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(err, err_len,
                 "cuda:%d: cudaGetDeviceCount: %s (%s): this machine has no usable GPU (no "
                 "NVIDIA driver, or no device); run on device: cpu",
                 device, cudaGetErrorString(e), cudaGetErrorName(e));
        return kvr_cuda_status(e);
    }
    if (device >= n) {
        snprintf(err, err_len, "cuda:%d: no such GPU: this machine has %d (cuda:0..cuda:%d)",
                 device, n, n - 1);
        return KVR_ERR_NOT_FOUND;
    }
    struct cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess ||
        (e = cudaSetDevice(device)) != cudaSuccess) {
        snprintf(err, err_len, "cuda:%d: %s (%s)", device, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return kvr_cuda_status(e);
    }
    size_t free_b = 0, total_b = 0;
    if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
        snprintf(err, err_len, "cuda:%d (%s): cudaMemGetInfo: %s (%s)", device, prop.name,
                 cudaGetErrorString(e), cudaGetErrorName(e));
        return kvr_cuda_status(e);
    }
    if (need_bytes > free_b) {
        snprintf(err, err_len,
                 "cuda:%d (%s): %zu MiB free of %zu MiB, %zu MiB needed (weights + KV pool); "
                 "lower kv_blocks or use a larger GPU",
                 device, prop.name, free_b >> 20, total_b >> 20, need_bytes >> 20);
        return KVR_ERR_NO_MEMORY;
    }
    char why[512];
    if (kvr_cublas_load(why, sizeof why) != KVR_OK) {
        snprintf(err, err_len, "cuda:%d (%s): %s", device, prop.name, why);
        return KVR_ERR_NOT_FOUND;
    }
    atomic_store(&g_device, device);
    KVR_LOG_INFO("cuda", "cuda:%d: %s, sm_%d%d, %d SMs, %zu MiB free of %zu MiB", device, prop.name,
                 prop.major, prop.minor, prop.multiProcessorCount, free_b >> 20, total_b >> 20);
    return KVR_OK;
}

int kvr_cuda_device(void)
{
    return atomic_load(&g_device);
}

kvr_status_t kvr_cuda_bind(void)
{
    int dev = atomic_load(&g_device);
    if (dev < 0)
        return KVR_ERR_NOT_FOUND;
    KVR_CUDA_CHECK(cudaSetDevice(dev));
    return KVR_OK;
}

int kvr_cuda_is_device_ptr(const void *p)
{
    struct cudaPointerAttributes at;
    if (!p || cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* not a CUDA pointer: clear the error */
        return 0;
    }
    return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}
