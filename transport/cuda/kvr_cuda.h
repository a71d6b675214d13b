/*
 * kvr_cuda.h - what every CUDA part of kvrail shares: the one mapping of
 * cudaError_t to kvr_status_t, the CUDA_CHECK macro built on it, and the
 * process's GPU (one per process: a node runs on the cuda:N its cluster file
 * names).
 *
 * Nothing here touches the GPU until kvr_cuda_device_open() is called, so a
 * binary built with CUDA starts and runs on the CPU on a machine without a
 * GPU or driver; only a run that asks for cuda:N probes, and gets an error
 * that says what is missing.
 */
#ifndef KVR_CUDA_H
#define KVR_CUDA_H

#include <stddef.h>
#include <cuda_runtime_api.h>

#include "kvr_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The one mapping of CUDA runtime errors to kvrail's statuses:
 *  cudaErrorMemoryAllocation -> KVR_ERR_NO_MEMORY; no device / no driver /
 *  invalid device -> KVR_ERR_NOT_FOUND; invalid value / pitch / symbol ->
 *  KVR_ERR_INVALID; not supported / not permitted -> KVR_ERR_UNSUPPORTED;
 *  launch timeout -> KVR_ERR_TIMEOUT; anything else (kernel faults, ECC,
 *  launch failures) -> KVR_ERR_IO. */
kvr_status_t kvr_cuda_status(cudaError_t e);

/** Logs "what failed at file:line: cudaErrorX: <CUDA's words>" and returns
 *  kvr_cuda_status(e).  What KVR_CUDA_CHECK calls. */
kvr_status_t kvr_cuda_fail(cudaError_t e, const char *what, const char *file, int line);

/** In a function returning kvr_status_t: runs a CUDA runtime call and
 *  returns its mapped status (logged) if it failed. */
#define KVR_CUDA_CHECK(call)                                                                       \
    do {                                                                                           \
        cudaError_t kvr_cuda_e_ = (call);                                                          \
        if (kvr_cuda_e_ != cudaSuccess)                                                            \
            return kvr_cuda_fail(kvr_cuda_e_, #call, __FILE__, __LINE__);                          \
    } while (0)

/** Makes GPU `device` this process's GPU after checking that it exists and
 *  has need_bytes free (0: no check).  err receives, e.g.,
 *  "cuda:0: cudaGetDeviceCount: no CUDA-capable device is detected
 *  (cudaErrorNoDevice): this machine has no usable GPU; run the node with
 *  device: cpu", "cuda:3: this machine has 1 GPU (cuda:0)" or "cuda:0
 *  (NVIDIA H200): 900 MiB free, 1200 MiB needed".  Safe to call again with
 *  the same device (another thread, e.g. the engine worker, binds it too).
 *  @return KVR_OK; KVR_ERR_NOT_FOUND (no driver, no GPU, no such index);
 *          KVR_ERR_NO_MEMORY (not enough free); KVR_ERR_INVALID (device < 0);
 *          KVR_ERR_BUSY (another device was opened before). */
kvr_status_t kvr_cuda_device_open(int device, size_t need_bytes, char *err, size_t err_len);

/** This process's GPU (kvr_cuda_device_open), or -1 when none was opened. */
int kvr_cuda_device(void);

/** Binds the calling thread to the process's GPU (cudaSetDevice; cheap when
 *  already bound).  @return KVR_OK; KVR_ERR_NOT_FOUND (none opened). */
kvr_status_t kvr_cuda_bind(void);

/** 1 when p is memory a kernel can address (device or managed), 0 when it is
 *  host memory (pageable or pinned): such inputs are copied. */
int kvr_cuda_is_device_ptr(const void *p);

#ifdef __cplusplus
}
#endif

#endif
