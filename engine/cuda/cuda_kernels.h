/*
 * cuda_kernels.h - launchers of the CUDA backend's own kernels
 * (cuda_kernels.cu), called by cuda_backend.cu on its stream.  Every pointer
 * is device (or managed) memory; the row tables (pos, tab_off, tables) are
 * the backend's device copies of the attention arguments.
 */
#ifndef KVR_CUDA_KERNELS_H
#define KVR_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

/* KV slab element types (enum kvr_kv_dtype: the weights' numbers) */
#define KVR_CUDA_KV_F32  0
#define KVR_CUDA_KV_F16  1
#define KVR_CUDA_KV_BF16 2

/* weight dtypes (enum kvr_dtype values) */
#define KVR_CUDA_DT_F32  0
#define KVR_CUDA_DT_F16  1
#define KVR_CUDA_DT_BF16 2

/* The paged-attention geometry of one op call. */
struct kvr_cuda_attn {
    int32_t n_rows, n_heads, n_kv_heads, head_dim, block_size, kv_dtype, window;
    float scale;
    char *layer_base;       /* the layer's slab (device) */
    const int32_t *pos;     /* [n_rows] */
    const int32_t *tab_off; /* [n_rows] offset of the row's block table in tables */
    const int32_t *tables;  /* the block tables, concatenated */
    int32_t n_splits;       /* kvr_cuda_attn_splits(the most keys a row reads) */
    float *part_ml;         /* [n_rows][n_heads][n_splits][2] (max, sum) when n_splits > 1 */
    float *part_o;          /* [n_rows][n_heads][n_splits][head_dim] */
};

/* Splits attention cuts a row of max_keys keys into (the partials' size). */
int32_t kvr_cuda_attn_splits(int32_t max_keys);

void kvr_cuda_embed(cudaStream_t s, float *x, const int32_t *tokens, int32_t M, const void *emb,
                    int32_t dtype, int32_t dim);
void kvr_cuda_rmsnorm(cudaStream_t s, float *y, const float *x, int32_t M, int32_t dim,
                      const float *w, float eps);
void kvr_cuda_rope(cudaStream_t s, float *x, int32_t M, int32_t n_heads, int32_t head_dim,
                   const int32_t *pos, const float *inv_freq);
void kvr_cuda_kv_store(cudaStream_t s, const struct kvr_cuda_attn *a, const float *k,
                       const float *v);
void kvr_cuda_attention(cudaStream_t s, const struct kvr_cuda_attn *a, const float *q, float *out);
void kvr_cuda_swiglu(cudaStream_t s, float *g, const float *u, size_t n);
void kvr_cuda_add_bias(cudaStream_t s, float *y, const float *b, int32_t M, int32_t N);
/* dst[n] = (dtype) src[n], round to nearest even (dtype bf16 or f16) */
void kvr_cuda_narrow(cudaStream_t s, void *dst, const float *src, size_t n, int32_t dtype);

#endif
