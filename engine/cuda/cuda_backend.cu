/*
 * cuda_backend.cu - the CUDA compute backend ("cuda"): kvr_compute_ops on
 * one GPU (the process's, kvr_cuda.h), every op on one stream.
 *
 * Memory.  alloc() returns CUDA managed memory, so the engine core
 * (forward.c) keeps writing the run state's tokens, positions and block
 * tables from the host and kernels address the activations directly; the
 * backend reads those small arrays on the host and stages them (with the
 * block tables, concatenated) into device memory once per forward pass
 * (embed, its first op, starts a pass).  Read-only inputs that arrive as
 * host pointers - weights, norms, biases, RoPE frequencies - are uploaded on
 * first use and kept for the backend's life, keyed by address: the model's
 * weights go to HBM once.  The KV pool must be device memory (a node's pool
 * in HBM, transport/cuda/); attention and the KV store refuse a host slab.
 * A matmul whose output is host memory (the logits) runs in column slices
 * through device scratch and copies each slice back.
 *
 * GEMMs are cuBLAS: f32 weights as SGEMM-equivalent (CUBLAS_COMPUTE_32F, no
 * TF32); bf16/f16 weights with the activations narrowed to the weight dtype
 * (round to nearest even) and f32 accumulation and output.  The other ops
 * are cuda_kernels.cu.
 *
 * Synchronization and errors.  Ops are asynchronous on the stream, and the
 * backend synchronizes where the engine core's host code reads GPU results
 * (forward.c as it is): after a matmul that accumulates into the residual
 * stream (the end of attention and of the MLP: forward.c then gathers rows
 * of it on the host, and a prefill node's layer_done reads the layer's KV
 * from the pool) and after a matmul whose output is host memory (the
 * logits).  Tokens, positions and block tables are read by the host only:
 * the backend stages its own copies.  An ops->sync hook in forward.c would
 * make that explicit (asked for in /work/notes/cuda-to-engine.md).  With
 * profiling on (kvr_cuda_backend_set_profile: benchmarks, and the op tests,
 * which read every output at once) every op synchronizes and is timed by
 * CUDA events.  A CUDA error is found at the next synchronization; it is
 * logged and aborts the process: after a kernel fault the CUDA context is
 * unusable, and an op has no way to return it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvr_cublas_dl.h" /* cuBLAS, opened at run time */
#include <cuda_runtime.h>

extern "C" {
#include "kvr_compute_backend.h"
#include "kvr_log.h"
}
#include "kvr_cuda.h"
#include "kvr_cuda_backend.h"
#include "cuda_kernels.h"

#define COMP "cuda"

/* one entry of the upload cache: host address -> device copy */
struct wc_entry {
    const void *host;
    size_t bytes;
    void *dev;
};

struct cuda_backend {
    struct kvr_compute_backend base; /* first */
    struct kvr_backend_params p;
    int device;
    cudaStream_t stream;
    cudaEvent_t ev_op[2], ev_gemm[2]; /* op timing (kvr_cuda_stats) */
    bool profile;                     /* every op synchronizes and is timed */
    cublasHandle_t blas;
    struct kvr_cuda_stats stats;
    /* the upload cache: open addressing on the host address, power-of-two capacity */
    struct wc_entry *wc;
    size_t wc_n, wc_cap;
    /* the current pass's row arguments, staged: [tokens | pos | tab_off | tables] */
    int32_t *h_rows, *d_rows; /* pinned host / device, rows_cap int32s */
    size_t rows_cap;
    cudaEvent_t rows_ev; /* the last upload from h_rows has been read */
    bool rows_valid;     /* d_rows holds staged rows */
    bool rows_tables;    /* ... with their block tables */
    int32_t rows_n;
    size_t rows_total; /* int32s staged after the tokens */
    int32_t *h_build;  /* the next staging, built on the host to compare */
    size_t build_cap;
    int32_t *d_tokens, *d_pos, *d_off, *d_tab; /* into d_rows */
    /* scratch */
    void *xn;    /* [max_rows][max_cols] the activations narrowed to bf16/f16 */
    float *ycol; /* [max_rows][max_cols] a column slice of a host-bound output */
    float *part; /* attention's split partials (kvr_cuda_attn), grown on demand */
    size_t part_cap;
};

static struct cuda_backend *cu(struct kvr_compute_backend *be)
{
    return (struct cuda_backend *)be;
}

/* An op's CUDA failure: see the header comment. */
static void die(const char *what, const char *why)
{
    KVR_LOG_ERROR(COMP, "%s: %s; the CUDA context cannot be trusted after this, stopping", what,
                  why);
    abort();
}

#define OP_CHECK(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            kvr_cuda_fail(e_, #call, __FILE__, __LINE__);                                          \
            die(#call, cudaGetErrorString(e_));                                                    \
        }                                                                                          \
    } while (0)

#define BLAS_CHECK(call)                                                                           \
    do {                                                                                           \
        cublasStatus_t b_ = (call);                                                                \
        if (b_ != CUBLAS_STATUS_SUCCESS)                                                           \
            die(#call, cublasGetStatusString(b_));                                                 \
    } while (0)

/* End of an op: launch errors now; a stream synchronize where the host
 * reads results next (host_sync), or for every op when profiling (which
 * also makes its GPU time known). */
static void op_end(struct cuda_backend *c, int op, bool host_sync)
{
    const char *name = kvr_cuda_op_name(op);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && c->profile)
        e = cudaEventRecord(c->ev_op[1], c->stream);
    if (e == cudaSuccess && (host_sync || c->profile))
        e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        kvr_cuda_fail(e, name, __FILE__, __LINE__);
        die(name, cudaGetErrorString(e));
    }
    float ms = 0;
    if (c->profile && cudaEventElapsedTime(&ms, c->ev_op[0], c->ev_op[1]) == cudaSuccess)
        c->stats.op_ms[op] += ms;
    c->stats.op_calls[op]++;
}

static void op_begin(struct cuda_backend *c)
{
    if (cudaSetDevice(c->device) != cudaSuccess)
        die("cudaSetDevice", "cannot bind the engine thread to its GPU");
    if (c->profile)
        OP_CHECK(cudaEventRecord(c->ev_op[0], c->stream));
}

/* ------------------------------------------------------------ uploads */

static size_t wc_slot(const struct cuda_backend *c, const void *host)
{
    uintptr_t h = (uintptr_t)host;
    h ^= h >> 17;
    h *= 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (c->wc_cap - 1);
}

static void wc_grow(struct cuda_backend *c)
{
    size_t ncap = c->wc_cap ? c->wc_cap * 2 : 256;
    struct wc_entry *old = c->wc;
    size_t ocap = c->wc_cap;
    c->wc = (struct wc_entry *)calloc(ncap, sizeof *c->wc);
    if (!c->wc)
        die("upload cache", "out of host memory");
    c->wc_cap = ncap;
    for (size_t i = 0; i < ocap; i++) {
        if (!old[i].host)
            continue;
        size_t s = wc_slot(c, old[i].host);
        while (c->wc[s].host)
            s = (s + 1) & (ncap - 1);
        c->wc[s] = old[i];
    }
    free(old);
}

/* A device address for bytes of read-only data at p: p itself when a kernel
 * can address it, else its device copy (uploaded on first use). */
static const void *dev_ro(struct cuda_backend *c, const void *p, size_t bytes)
{
    if (!p)
        return NULL;
    if (c->wc_cap) {
        for (size_t s = wc_slot(c, p);; s = (s + 1) & (c->wc_cap - 1)) {
            if (!c->wc[s].host)
                break;
            if (c->wc[s].host == p && c->wc[s].bytes >= bytes)
                return c->wc[s].dev;
            if (c->wc[s].host == p) {            /* seen shorter: upload again */
                c->wc[s].host = (const void *)1; /* tombstone: never a real address */
                break;
            }
        }
    }
    if (kvr_cuda_is_device_ptr(p))
        return p;
    if (c->wc_n * 2 + 2 > c->wc_cap)
        wc_grow(c);
    void *d = NULL;
    OP_CHECK(cudaMalloc(&d, bytes));
    OP_CHECK(cudaMemcpy(d, p, bytes, cudaMemcpyHostToDevice));
    size_t s = wc_slot(c, p);
    while (c->wc[s].host)
        s = (s + 1) & (c->wc_cap - 1);
    c->wc[s] = (struct wc_entry){p, bytes, d};
    c->wc_n++;
    c->stats.uploaded_bytes += bytes;
    c->stats.uploads++;
    return d;
}

static size_t dt_size(int32_t dtype)
{
    return dtype == KVR_CUDA_DT_F32 ? 4 : 2;
}

/* Stages n int32s from the host into d_rows at offset off (the caller
 * waits for rows_ev before reusing h_rows). */
static void rows_reserve(struct cuda_backend *c, size_t need)
{
    if (need <= c->rows_cap)
        return;
    OP_CHECK(cudaStreamSynchronize(c->stream));
    size_t cap = c->rows_cap ? c->rows_cap : 4096;
    while (cap < need)
        cap *= 2;
    cudaFreeHost(c->h_rows);
    cudaFree(c->d_rows);
    c->h_rows = NULL;
    c->d_rows = NULL;
    OP_CHECK(cudaMallocHost((void **)&c->h_rows, cap * 4));
    OP_CHECK(cudaMalloc((void **)&c->d_rows, cap * 4));
    c->rows_cap = cap;
    c->rows_valid = false;
    KVR_LOG_DEBUG(COMP, "row staging grown to %zu entries", cap);
}

/* Makes d_pos, d_off and d_tab hold these rows' positions and block tables
 * (tables of consecutive rows that share one table array are staged once,
 * long enough for the highest of their positions).  They are built on the
 * host and compared with what was uploaded last: the same content (the
 * layers of one pass, rope after attention) is not uploaded again, and
 * nothing is assumed from the arrays' addresses.  bt NULL: positions only. */
static void rows_stage(struct cuda_backend *c, int32_t n, const int32_t *pos,
                       const int32_t *const *bt, int32_t bs)
{
    size_t nt = 0;
    for (int32_t r = 0; bt && r < n;) {
        int32_t hi = pos[r], e = r + 1;
        for (; e < n && bt[e] == bt[r]; e++)
            hi = pos[e] > hi ? pos[e] : hi;
        nt += (size_t)(hi / bs) + 1;
        r = e;
    }
    size_t total = 2 * (size_t)n + nt;
    if (total > c->build_cap) {
        free(c->h_build);
        c->build_cap = total * 2;
        c->h_build = (int32_t *)malloc(c->build_cap * 4);
        if (!c->h_build)
            die("row staging", "out of host memory");
        c->rows_valid = false;
    }
    int32_t *h_pos = c->h_build, *h_off = h_pos + n, *h_tab = h_off + n;
    memcpy(h_pos, pos, (size_t)n * 4);
    nt = 0;
    for (int32_t r = 0; r < n;) {
        int32_t hi = pos[r], e = r + 1;
        for (; bt && e < n && bt[e] == bt[r]; e++)
            hi = pos[e] > hi ? pos[e] : hi;
        int32_t nb = bt ? hi / bs + 1 : 0;
        for (int32_t i = r; i < e; i++)
            h_off[i] = (int32_t)nt;
        if (nb)
            memcpy(h_tab + nt, bt[r], (size_t)nb * 4);
        nt += (size_t)nb;
        r = e;
    }
    /* what is staged: the same rows, and tables wherever these need them */
    if (c->rows_valid && c->rows_n == n && (!bt || (c->rows_tables && c->rows_total == total)) &&
        memcmp(c->h_rows + c->p.max_rows, h_pos, (bt ? total : (size_t)n) * 4) == 0)
        return;
    OP_CHECK(cudaEventSynchronize(c->rows_ev));
    rows_reserve(c, (size_t)c->p.max_rows + total); /* the tokens were uploaded and used */
    memcpy(c->h_rows + c->p.max_rows, h_pos, total * 4);
    OP_CHECK(cudaMemcpyAsync(c->d_rows + c->p.max_rows, c->h_rows + c->p.max_rows, total * 4,
                             cudaMemcpyHostToDevice, c->stream));
    OP_CHECK(cudaEventRecord(c->rows_ev, c->stream));
    c->d_pos = c->d_rows + c->p.max_rows;
    c->d_off = c->d_pos + n;
    c->d_tab = c->d_off + n;
    c->rows_valid = true;
    c->rows_n = n;
    c->rows_tables = bt != NULL;
    c->rows_total = total;
}

/* ------------------------------------------------------------ ops */

static void cuda_matmul(struct kvr_compute_backend *be, float *y, const float *x, int32_t M,
                        const struct kvr_weight *w, const float *bias, unsigned flags)
{
    struct cuda_backend *c = cu(be);
    op_begin(c);
    if (M < 1)
        return;
    const int32_t N = w->rows, K = w->cols;
    const bool acc = (flags & KVR_MM_ACCUMULATE) != 0;
    const void *W = dev_ro(c, w->data, (size_t)N * (size_t)K * dt_size(w->dtype));
    const float *b = (const float *)dev_ro(c, bias, (size_t)N * 4);
    if (!kvr_cuda_is_device_ptr(x))
        die("matmul", "x is host memory (activations must come from alloc())");
    if (M > c->p.max_rows || K > c->p.max_cols)
        die("matmul", "shape beyond the sizes given at create");
    const void *X = x;
    cudaDataType_t ty = CUDA_R_32F;
    if (w->dtype != KVR_CUDA_DT_F32) {
        ty = w->dtype == KVR_CUDA_DT_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        kvr_cuda_narrow(c->stream, c->xn, x, (size_t)M * (size_t)K, w->dtype);
        X = c->xn;
    }
    const float one = 1.0f, zero = 0.0f;
    bool host_y = !kvr_cuda_is_device_ptr(y);
    /* column slices of at most max_cols outputs when y is on the host */
    int32_t step = host_y ? c->p.max_cols : N;
    for (int32_t n0 = 0; n0 < N; n0 += step) {
        int32_t nn = N - n0 < step ? N - n0 : step;
        float *Y = host_y ? c->ycol : y + n0;
        int ldy = host_y ? nn : N;
        if (host_y && acc)
            OP_CHECK(cudaMemcpy2DAsync(c->ycol, (size_t)nn * 4, y + n0, (size_t)N * 4,
                                       (size_t)nn * 4, (size_t)M, cudaMemcpyHostToDevice,
                                       c->stream));
        /* column-major: Y^T[nn][M] = W[n0..][K] (as K x nn, transposed) * X^T[K][M] */
        const char *Wn = (const char *)W + (size_t)n0 * (size_t)K * dt_size(w->dtype);
        if (c->profile)
            OP_CHECK(cudaEventRecord(c->ev_gemm[0], c->stream));
        BLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, nn, M, K, &one, Wn, ty, K, X, ty,
                                K, acc ? &one : &zero, Y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
        if (c->profile) {
            OP_CHECK(cudaEventRecord(c->ev_gemm[1], c->stream));
            OP_CHECK(cudaEventSynchronize(c->ev_gemm[1]));
            float gms = 0;
            if (cudaEventElapsedTime(&gms, c->ev_gemm[0], c->ev_gemm[1]) == cudaSuccess)
                c->stats.gemm_ms += gms;
        }
        if (b)
            kvr_cuda_add_bias(c->stream, Y, b + n0, M, nn);
        if (host_y)
            OP_CHECK(cudaMemcpy2DAsync(y + n0, (size_t)N * 4, c->ycol, (size_t)nn * 4,
                                       (size_t)nn * 4, (size_t)M, cudaMemcpyDeviceToHost,
                                       c->stream));
    }
    c->stats.gemms++;
    c->stats.gemm_flops += 2.0 * M * (double)N * K;
    op_end(c, KVR_CUDA_OP_MATMUL, acc || host_y);
}

static void cuda_embed(struct kvr_compute_backend *be, float *x, const int32_t *tokens, int32_t M,
                       const struct kvr_weight *emb)
{
    struct cuda_backend *c = cu(be);
    op_begin(c);
    c->rows_valid =
        false; /* a new pass (the tokens' upload overwrote nothing else, but be plain) */
    if (M < 1)
        return;
    if (M > c->p.max_rows)
        die("embed", "more rows than max_rows");
    const void *E =
        dev_ro(c, emb->data, (size_t)emb->rows * (size_t)emb->cols * dt_size(emb->dtype));
    OP_CHECK(cudaEventSynchronize(c->rows_ev));
    memcpy(c->h_rows, tokens, (size_t)M * 4);
    OP_CHECK(
        cudaMemcpyAsync(c->d_rows, c->h_rows, (size_t)M * 4, cudaMemcpyHostToDevice, c->stream));
    OP_CHECK(cudaEventRecord(c->rows_ev, c->stream));
    kvr_cuda_embed(c->stream, x, c->d_rows, M, E, emb->dtype, emb->cols);
    op_end(c, KVR_CUDA_OP_EMBED, false);
}

static void cuda_rmsnorm(struct kvr_compute_backend *be, float *y, const float *x, int32_t M,
                         int32_t dim, const float *w, float eps)
{
    struct cuda_backend *c = cu(be);
    op_begin(c);
    const float *W = (const float *)dev_ro(c, w, (size_t)dim * 4);
    kvr_cuda_rmsnorm(c->stream, y, x, M, dim, W, eps);
    op_end(c, KVR_CUDA_OP_RMSNORM, false);
}

static void cuda_rope(struct kvr_compute_backend *be, float *x, int32_t M, int32_t n_heads,
                      int32_t head_dim, const int32_t *pos, const float *inv_freq)
{
    struct cuda_backend *c = cu(be);
    op_begin(c);
    if (M < 1)
        return;
    const float *F = (const float *)dev_ro(c, inv_freq, (size_t)(head_dim / 2) * 4);
    rows_stage(c, M, pos, NULL, 1); /* positions only (reuses a staging with tables) */
    kvr_cuda_rope(c->stream, x, M, n_heads, head_dim, c->d_pos, F);
    op_end(c, KVR_CUDA_OP_ROPE, false);
}

static struct kvr_cuda_attn attn_of(struct cuda_backend *c, const struct kvr_attn_args *a)
{
    const struct kvr_kv_layout *l = a->layout;
    if (a->n_rows > c->p.max_rows)
        die("attention", "more rows than max_rows");
    if (!kvr_cuda_is_device_ptr((const void *)a->layer_base))
        die("attention", "the KV pool is host memory; a cuda node's pool must be in HBM");
    rows_stage(c, a->n_rows, a->pos, a->block_table, l->block_size);
    struct kvr_cuda_attn g;
    g.n_rows = a->n_rows;
    g.n_heads = a->n_heads;
    g.n_kv_heads = l->n_kv_heads;
    g.head_dim = l->head_dim;
    g.block_size = l->block_size;
    g.kv_dtype = l->dtype;
    g.window = a->window;
    g.scale = a->scale;
    g.layer_base = (char *)a->layer_base;
    g.pos = c->d_pos;
    g.tab_off = c->d_off;
    g.tables = c->d_tab;
    /* splits of the longest row's keys, and room for their partials */
    int32_t most = 1;
    for (int32_t r = 0; r < a->n_rows; r++) {
        int32_t p = a->pos[r], lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        most = p - lo + 1 > most ? p - lo + 1 : most;
    }
    g.n_splits = kvr_cuda_attn_splits(most);
    g.part_ml = g.part_o = NULL;
    if (g.n_splits > 1) {
        size_t rh = (size_t)a->n_rows * (size_t)a->n_heads * (size_t)g.n_splits;
        size_t need = rh * (2 + (size_t)l->head_dim);
        if (need > c->part_cap) {
            OP_CHECK(cudaStreamSynchronize(c->stream));
            cudaFree(c->part);
            c->part = NULL;
            c->part_cap = 0;
            OP_CHECK(cudaMalloc((void **)&c->part, need * 2 * sizeof(float)));
            c->part_cap = need * 2;
            KVR_LOG_DEBUG(COMP, "attention partials grown to %zu floats", c->part_cap);
        }
        g.part_ml = c->part;
        g.part_o = c->part + 2 * rh;
    }
    return g;
}

static void cuda_kv_store(struct kvr_compute_backend *be, const struct kvr_attn_args *a,
                          const float *k, const float *v)
{
    struct cuda_backend *c = cu(be);
    op_begin(c);
    if (a->n_rows < 1)
        return;
    struct kvr_cuda_attn g = attn_of(c, a);
    kvr_cuda_kv_store(c->stream, &g, k, v);
    op_end(c, KVR_CUDA_OP_KV_STORE, false);
}

static void cuda_attention(struct kvr_compute_backend *be, const struct kvr_attn_args *a,
                           const float *q, float *out)
{
    struct cuda_backend *c = cu(be);
    op_begin(c);
    if (a->n_rows < 1)
        return;
    if (a->layout->head_dim > 256 || a->n_heads % a->layout->n_kv_heads)
        die("attention", "head_dim above 256 or heads not a multiple of KV heads");
    struct kvr_cuda_attn g = attn_of(c, a);
    kvr_cuda_attention(c->stream, &g, q, out);
    op_end(c, KVR_CUDA_OP_ATTENTION, false);
}

static void cuda_swiglu(struct kvr_compute_backend *be, float *g, const float *u, size_t n)
{
    struct cuda_backend *c = cu(be);
    op_begin(c);
    kvr_cuda_swiglu(c->stream, g, u, n);
    op_end(c, KVR_CUDA_OP_SWIGLU, false);
}

/* ------------------------------------------------------------ lifetime */

static void *cuda_alloc(struct kvr_compute_backend *be, size_t bytes)
{
    struct cuda_backend *c = cu(be);
    op_begin(c);
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = NULL;
    if (cudaMallocManaged(&p, n ? n : 64, cudaMemAttachGlobal) != cudaSuccess) {
        (void)cudaGetLastError();
        KVR_LOG_ERROR(COMP, "cudaMallocManaged of %zu bytes failed", n);
        return NULL;
    }
    if (cudaMemset(p, 0, n ? n : 64) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_free(struct kvr_compute_backend *be, void *p)
{
    if (p)
        cudaFree(p);
}

static void cuda_destroy(struct kvr_compute_backend *be)
{
    struct cuda_backend *c = cu(be);
    if (!c)
        return;
    cudaSetDevice(c->device);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    for (size_t i = 0; i < c->wc_cap; i++)
        if (c->wc[i].dev)
            cudaFree(c->wc[i].dev);
    free(c->wc);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->rows_ev)
        cudaEventDestroy(c->rows_ev);
    for (int i = 0; i < 2; i++) {
        if (c->ev_op[i])
            cudaEventDestroy(c->ev_op[i]);
        if (c->ev_gemm[i])
            cudaEventDestroy(c->ev_gemm[i]);
    }
    cudaFreeHost(c->h_rows);
    cudaFree(c->d_rows);
    free(c->h_build);
    cudaFree(c->xn);
    cudaFree(c->ycol);
    cudaFree(c->part);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    KVR_LOG_DEBUG(COMP, "backend destroyed: %llu uploads (%llu bytes), %llu GEMMs",
                  (unsigned long long)c->stats.uploads, (unsigned long long)c->stats.uploaded_bytes,
                  (unsigned long long)c->stats.gemms);
    free(c);
}

static kvr_status_t cuda_create_inner(struct cuda_backend *c)
{
    const struct kvr_backend_params *p = &c->p;
    KVR_CUDA_CHECK(cudaSetDevice(c->device));
    KVR_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    KVR_CUDA_CHECK(cudaEventCreateWithFlags(&c->rows_ev, cudaEventDisableTiming));
    KVR_CUDA_CHECK(cudaEventRecord(c->rows_ev, c->stream));
    for (int i = 0; i < 2; i++) {
        KVR_CUDA_CHECK(cudaEventCreate(&c->ev_op[i]));
        KVR_CUDA_CHECK(cudaEventCreate(&c->ev_gemm[i]));
    }
    size_t mc = (size_t)p->max_cols, mr = (size_t)p->max_rows;
    KVR_CUDA_CHECK(cudaMalloc(&c->xn, mr * mc * 2));
    KVR_CUDA_CHECK(cudaMalloc((void **)&c->ycol, mr * mc * 4));
    /* tokens + pos + off + one table of max_seq_len/16 blocks a row */
    size_t rows = mr * 3 + mr * ((size_t)p->max_seq_len / 16 + 1);
    c->rows_cap = 0;
    size_t cap = 4096;
    while (cap < rows)
        cap *= 2;
    KVR_CUDA_CHECK(cudaMallocHost((void **)&c->h_rows, cap * 4));
    KVR_CUDA_CHECK(cudaMalloc((void **)&c->d_rows, cap * 4));
    c->rows_cap = cap;
    if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        KVR_LOG_ERROR(COMP, "cublasCreate failed");
        return KVR_ERR_IO;
    }
    if (cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS)
        return KVR_ERR_IO;
    return KVR_OK;
}

static kvr_status_t cuda_create(const struct kvr_backend_params *p,
                                struct kvr_compute_backend **be_p)
{
    int dev = kvr_cuda_device();
    if (dev < 0) {
        KVR_LOG_ERROR(COMP, "no GPU opened in this process: kvr_cuda_device_open(N) first (a "
                            "node does it for device: cuda:N, kvrail run for --device cuda:N)");
        return KVR_ERR_NOT_FOUND;
    }
    if (p->max_head_dim > 256) {
        KVR_LOG_ERROR(COMP, "head_dim %d: the CUDA attention kernel takes at most 256",
                      p->max_head_dim);
        return KVR_ERR_UNSUPPORTED;
    }
    struct cuda_backend *c = (struct cuda_backend *)calloc(1, sizeof *c);
    if (!c)
        return KVR_ERR_NO_MEMORY;
    c->base.ops = &kvr_cuda_ops;
    c->base.n_threads = 1;
    c->p = *p;
    c->device = dev;
    kvr_status_t s = cuda_create_inner(c);
    if (s != KVR_OK) {
        cuda_destroy(&c->base);
        return s;
    }
    *be_p = &c->base;
    return KVR_OK;
}

extern "C" const char *kvr_cuda_op_name(int op)
{
    static const char *const n[KVR_CUDA_OP_N] = {"matmul",   "embed",     "rmsnorm", "rope",
                                                 "kv_store", "attention", "swiglu"};
    return op >= 0 && op < KVR_CUDA_OP_N ? n[op] : "?";
}

extern "C" void kvr_cuda_backend_set_profile(struct kvr_compute_backend *be, bool on)
{
    struct cuda_backend *c = cu(be);
    cudaStreamSynchronize(c->stream);
    c->profile = on;
}

extern "C" void kvr_cuda_backend_stats_reset(struct kvr_compute_backend *be)
{
    memset(&cu(be)->stats, 0, sizeof cu(be)->stats);
}

extern "C" void kvr_cuda_backend_stats(struct kvr_compute_backend *be, struct kvr_cuda_stats *st)
{
    *st = cu(be)->stats;
}

extern "C" const struct kvr_compute_ops kvr_cuda_ops = {
    "cuda",     cuda_create,  cuda_destroy, cuda_alloc,    cuda_free,      cuda_matmul,
    cuda_embed, cuda_rmsnorm, cuda_rope,    cuda_kv_store, cuda_attention, cuda_swiglu,
};
