/*
 * run_device.c - `kvrail run --device`: the GPU is opened before the model
 * loads (so a missing GPU fails fast with CUDA's reason), the engine runs
 * the "cuda" compute backend, and the run's KV pool is allocated in HBM
 * (cudaMalloc), the layout the engine writes on the CPU.  Without CUDA in
 * the build, cuda:N is refused - never a silent CPU run.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_config.h"
#include "run_device.h"
#if KVR_HAVE_CUDA
#include "kvr_cuda.h"
#endif

int kvr_run_device_parse(const char *s, int *index_p)
{
    if (!strcmp(s, "cpu")) {
        *index_p = -1;
        return 0;
    }
    if (!strncmp(s, "cuda:", 5) && s[5] >= '0' && s[5] <= '9') {
        char *e;
        errno = 0;
        long n = strtol(s + 5, &e, 10);
        if (!*e && !errno && n <= 1024) {
            *index_p = (int)n;
            return 0;
        }
    }
    fprintf(stderr, "kvrail run: --device: '%s' is not a device (want cpu or cuda:N)\n", s);
    return -1;
}

kvr_status_t kvr_run_device_open(int index, char *err, size_t err_len)
{
    if (index < 0)
        return KVR_OK;
#if KVR_HAVE_CUDA
    return kvr_cuda_device_open(index, 0, err, err_len);
#else
    snprintf(err, err_len,
             "cuda:%d: this build of kvrail has no CUDA (built without the CUDA toolkit: meson "
             "setup -Dcuda=enabled); use --device cpu",
             index);
    return KVR_ERR_UNSUPPORTED;
#endif
}

const char *kvr_run_device_backend(int index)
{
    return index < 0 ? NULL : "cuda";
}

void *kvr_run_device_slab(int index, size_t bytes)
{
    size_t n = (bytes + 63) & ~(size_t)63;
    if (index < 0) {
        void *p = aligned_alloc(64, n ? n : 64);
        if (p)
            memset(p, 0, n);
        return p;
    }
#if KVR_HAVE_CUDA
    void *p = NULL;
    if (kvr_cuda_bind() != KVR_OK || cudaMalloc(&p, n ? n : 64) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    /* the memset runs on the legacy stream, which the engine's non-blocking
     * stream does not wait for: finish it here */
    if (cudaMemset(p, 0, n ? n : 64) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(p);
        return NULL;
    }
    return p;
#else
    return NULL;
#endif
}

void kvr_run_device_slab_free(int index, void *p)
{
    if (index < 0) {
        free(p);
        return;
    }
#if KVR_HAVE_CUDA
    if (p)
        cudaFree(p);
#endif
}
