/*
 * kvr_cuda_backend.h - the CUDA compute backend's own surface beside
 * kvr_compute_ops: its ops table and the counters benchmarks and tests read.
 */
#ifndef KVR_CUDA_BACKEND_H
#define KVR_CUDA_BACKEND_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kvr_compute_backend;
struct kvr_compute_ops;

struct kvr_cuda_stats {
    uint64_t uploads;        /* read-only host inputs copied to the GPU (once each) */
    uint64_t uploaded_bytes; /* their bytes */
    uint64_t gemms;          /* cuBLAS GEMM calls */
    double gemm_flops;       /* 2 M N K summed */
};

/** The backend's counters so far. */
void kvr_cuda_backend_stats(struct kvr_compute_backend *be, struct kvr_cuda_stats *st);

extern const struct kvr_compute_ops kvr_cuda_ops;

#ifdef __cplusplus
}
#endif

#endif
