/*
 * kvr_cuda_backend.h - the CUDA compute backend's own surface beside
 * kvr_compute_ops: its ops table and the counters benchmarks and tests read.
 */
#ifndef KVR_CUDA_BACKEND_H
#define KVR_CUDA_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kvr_compute_backend;
struct kvr_compute_ops;

/* the ops, as kvr_cuda_stats.op_ms indexes them */
enum kvr_cuda_op {
    KVR_CUDA_OP_MATMUL,
    KVR_CUDA_OP_EMBED,
    KVR_CUDA_OP_RMSNORM,
    KVR_CUDA_OP_ROPE,
    KVR_CUDA_OP_KV_STORE,
    KVR_CUDA_OP_ATTENTION,
    KVR_CUDA_OP_SWIGLU,
    KVR_CUDA_OP_N,
};

/** "matmul", "embed", ... */
const char *kvr_cuda_op_name(int op);

struct kvr_cuda_stats {
    uint64_t uploads;        /* read-only host inputs copied to the GPU (once each) */
    uint64_t uploaded_bytes; /* their bytes */
    uint64_t gemms;          /* cuBLAS GEMM calls */
    double gemm_flops;       /* 2 M N K summed */
    /* GPU time (CUDA events on the backend's stream) of each op, and of the
     * cuBLAS calls alone inside matmul (the rest of matmul: narrowing the
     * activations, bias, copies of host-bound outputs) */
    double op_ms[KVR_CUDA_OP_N];
    double gemm_ms;
    uint64_t op_calls[KVR_CUDA_OP_N];
};

/** Profiling on: every op synchronizes the stream and its GPU time (and
 *  the cuBLAS calls' inside matmul) is measured by CUDA events; off (the
 *  default): ops run asynchronously, op_ms and gemm_ms stay 0. */
void kvr_cuda_backend_set_profile(struct kvr_compute_backend *be, bool on);

/** Zeroes the counters (the upload cache stays). */
void kvr_cuda_backend_stats_reset(struct kvr_compute_backend *be);

/** The backend's counters so far. */
void kvr_cuda_backend_stats(struct kvr_compute_backend *be, struct kvr_cuda_stats *st);

extern const struct kvr_compute_ops kvr_cuda_ops;

#ifdef __cplusplus
}
#endif

#endif
