/*
 * kvr_cublas_dl.h - cuBLAS loaded at run time, not at link time.
 *
 * A binary built with CUDA must start on a machine that has no GPU and no
 * CUDA libraries at all (a CPU node, the debian:12-slim image): the CUDA
 * runtime is linked statically (libcudart_static, which itself loads the
 * driver only when asked), and cuBLAS, the one other CUDA library the engine
 * calls, is opened with dlopen by kvr_cuda_device_open(), so a missing
 * libcublas is an error of `device: cuda:N` at start ("install the CUDA 13
 * cuBLAS runtime"), never a loader failure of every binary.
 *
 * Code that calls cuBLAS includes this header instead of <cublas_v2.h>; the
 * handful of entry points the engine uses are redirected to the pointers
 * kvr_cublas_load() resolved.  Calling one before a successful load is a
 * bug (kvr_cuda_device_open() loads it before it reports success).
 */
#ifndef KVR_CUBLAS_DL_H
#define KVR_CUBLAS_DL_H

#include <stddef.h>
#include <cublas_v2.h>

#include "kvr_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The cuBLAS entry points kvrail calls, as the library exports them. */
struct kvr_cublas_fns {
    __typeof__(&cublasCreate_v2) create;
    __typeof__(&cublasDestroy_v2) destroy;
    __typeof__(&cublasSetStream_v2) set_stream;
    __typeof__(&cublasSetMathMode) set_math_mode;
    /* spelled out: C++ overloads cublasGemmEx (a cudaDataType compute type) */
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void *, const void *, cudaDataType, int, const void *,
                              cudaDataType, int, const void *, void *, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
    __typeof__(&cublasGetStatusString) status_string;
};

/** Resolved by kvr_cublas_load(); NULL members before. */
extern struct kvr_cublas_fns kvr_cublas;

/** Opens libcublas.so.<major of the headers built against> (the loader's
 *  search path, then the toolkit's lib64 this build was configured with) and
 *  resolves every entry point; once per process, later calls return the
 *  first outcome.  err receives, e.g., "libcublas.so.13: cannot open shared
 *  object file: install the CUDA 13 cuBLAS runtime (libcublas) or run on
 *  device: cpu".
 *  @return KVR_OK; KVR_ERR_NOT_FOUND (library or a symbol missing). */
kvr_status_t kvr_cublas_load(char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#ifndef KVR_CUBLAS_DL_IMPL
#undef cublasCreate
#undef cublasDestroy
#undef cublasSetStream
#define cublasCreate          (kvr_cublas.create)
#define cublasDestroy         (kvr_cublas.destroy)
#define cublasSetStream       (kvr_cublas.set_stream)
#define cublasSetMathMode     (kvr_cublas.set_math_mode)
#define cublasGemmEx          (kvr_cublas.gemm_ex)
#define cublasGetStatusString (kvr_cublas.status_string)
#endif

#endif
