/*
 * kvr_compute_backend.h - the interface that compute backends implement
 * (engine/cpu/, later engine/cuda/).  Only the engine core and backends
 * include it.
 *
 * forward.c expresses one transformer step as calls through this ops table;
 * a backend owns its threads and scratch, sized once from
 * struct kvr_backend_params at create time: no op allocates.  All float
 * buffers passed to the ops are row-major and belong to the backend's memory
 * space (host memory for cpu).  Weights are [rows = out features][cols = in
 * features] as Hugging Face stores nn.Linear, in their file dtype.
 */
#ifndef KVR_COMPUTE_BACKEND_H
#define KVR_COMPUTE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"
#include "kvr_engine.h"
#include "safetensors.h"

struct kvr_weight {
    const void *data; /* [rows][cols] in dtype; NULL when absent (e.g. no bias) */
    int32_t dtype;    /* enum kvr_dtype */
    int32_t rows;
    int32_t cols;
};

struct kvr_backend_params {
    int32_t n_threads;   /* >= 1 */
    int32_t max_rows;    /* most rows (tokens) any op sees */
    int32_t max_cols;    /* largest weight cols (K) */
    int32_t max_seq_len; /* longest sequence attention reads */
    int32_t max_head_dim;
    /* unused since every matmul is batch-invariant at any M; kept so that
     * callers that set it still compile */
    int32_t gemv_max_rows;
    int32_t numerics; /* enum kvr_numerics; create fails KVR_ERR_UNSUPPORTED
                         for a mode the backend or CPU cannot compute */
};

#define KVR_GEMV_ROWS 32 /* the former gemv_max_rows; no longer a limit */

enum kvr_mm_flags {
    KVR_MM_ACCUMULATE = 1, /* y += instead of y = */
    KVR_MM_INVARIANT = 2,  /* each row's result must not depend on M; the CPU
                              backend's matmul is invariant with or without
                              it (every path bit for bit the same) */
};

/* Attention over the paged pool for n_rows query rows.  Row r is a token at
 * position pos[r] of the sequence whose block table is block_table[r]; it
 * attends to positions max(0, pos[r] - window + 1) .. pos[r] of that
 * sequence (window = 0: all), whose K/V are already in the pool. */
struct kvr_attn_args {
    int32_t n_rows;
    const int32_t *pos;                /* [n_rows] */
    const int32_t *const *block_table; /* [n_rows] */
    void *layer_base;                  /* this layer's slab, layout->dtype elements */
    const struct kvr_kv_layout *layout;
    int32_t n_heads;
    int32_t window;
    float scale; /* 1 / sqrt(head_dim) */
};

struct kvr_compute_backend;

struct kvr_compute_ops {
    const char *name;
    kvr_status_t (*create)(const struct kvr_backend_params *p, struct kvr_compute_backend **be_p);
    void (*destroy)(struct kvr_compute_backend *be);
    /* Buffers in the backend's memory (64-byte aligned, zeroed). */
    void *(*alloc)(struct kvr_compute_backend *be, size_t bytes);
    void (*free)(struct kvr_compute_backend *be, void *p);

    /* y[M][N] = x[M][K] W[N][K]^T (+ bias[N]); flags: enum kvr_mm_flags. */
    void (*matmul)(struct kvr_compute_backend *be, float *y, const float *x, int32_t M,
                   const struct kvr_weight *w, const float *bias, unsigned flags);
    /* x[M][dim] = emb[tokens[m]] (rows converted to f32). */
    void (*embed)(struct kvr_compute_backend *be, float *x, const int32_t *tokens, int32_t M,
                  const struct kvr_weight *emb);
    /* y[M][dim] = x / rms(x) * w; y may be x. */
    void (*rmsnorm)(struct kvr_compute_backend *be, float *y, const float *x, int32_t M,
                    int32_t dim, const float *w, float eps);
    /* Rotates x[M][n_heads][head_dim] in place, rotate-half (HF) convention:
     * pairs (i, i + head_dim/2) by angle pos[m] * inv_freq[i]. */
    void (*rope)(struct kvr_compute_backend *be, float *x, int32_t M, int32_t n_heads,
                 int32_t head_dim, const int32_t *pos, const float *inv_freq);
    /* Writes k, v [n_rows][n_kv_heads][head_dim] at each row's position,
     * converted to the layout's dtype (bf16 / f16: rounded to nearest
     * even, as the hardware conversions do). */
    void (*kv_store)(struct kvr_compute_backend *be, const struct kvr_attn_args *a, const float *k,
                     const float *v);
    /* out[n_rows][n_heads][head_dim] = softmax(q K^T * scale) V, causal;
     * rows may belong to different sequences.  K and V are read in the
     * layout's dtype and widened to f32 (exact); every sum is in f32.  A
     * row's result must not depend on the other rows (batch invariance). */
    void (*attention)(struct kvr_compute_backend *be, const struct kvr_attn_args *a, const float *q,
                      float *out);
    /* g[i] = silu(g[i]) * u[i] for i < n. */
    void (*swiglu)(struct kvr_compute_backend *be, float *g, const float *u, size_t n);
};

struct kvr_compute_backend {
    const struct kvr_compute_ops *ops;
    int32_t n_threads;
};

/** The registry: the backend called name ("cpu"), or NULL. */
const struct kvr_compute_ops *kvr_compute_backend_find(const char *name);

/* The CPU backend (engine/cpu/). */
extern const struct kvr_compute_ops kvr_cpu_ops;

/* The bit class of the kernels the CPU backend picks in this process
 * (kvr_engine_kernels()): "cpu-fma16.R" or "cpu-base.R" (R: the arithmetic
 * revision). */
const char *kvr_cpu_kernels(void);

#endif
