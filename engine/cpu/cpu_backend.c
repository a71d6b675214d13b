/*
 * cpu_backend.c - the CPU compute backend.
 *
 * matmul, y[M][N] = x[M][K] W[N][K]^T:
 *  - M <= gemv_max_rows, or KVR_MM_INVARIANT (decode steps, short prompts,
 *    last-token logits):
 *    our own kernel, W's rows split over the thread pool; each group of 4
 *    weight rows is read once in its file dtype (f32, f16 or bf16, widened
 *    in registers) and dotted with 4 activation rows at a time while it
 *    sits in L1.  Each output is one dot product summed in a fixed order,
 *    so a row's result does not depend on the batch (batch invariance:
 *    batched decode == decoding alone, bit for bit);
 *  - larger M (prefill): OpenBLAS cblas_sgemm, single-threaded, on slices
 *    of W's rows run by our pool (one set of threads: OpenBLAS's own pool
 *    and ours spinning against each other on few cores lost ~2x);
 *    f16/bf16 slices are widened into per-thread scratch just before their
 *    sgemm, so the model stays in its mapped file dtype.
 * Attention reads K/V through the block tables: for prefill (rows of one
 * sequence at consecutive positions) per kv head a gather of its K/V and
 * two sgemms per query head and 128-row tile (S = Q K^T, masked softmax,
 * O = S V); for decode one (row, head) pair per task with a vectorized dot
 * and exp.  Hot loops are compiled for x86-64-v4/v3/baseline
 * (target_clones) and picked at load by the CPU.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_compute_backend.h"
#include "kvr_log.h"
#include "threadpool.h"

#define CONV_FLOATS   (4u << 20) /* f32 scratch for widened weight rows: 16 MiB in all */
#define ATTN_S_FLOATS (1u << 20) /* score tile of the GEMM attention: 4 MiB a thread */
#define ATTN_ROWS     128        /* query rows per score tile */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KVR_CLONES
#endif

/* Provided by OpenBLAS; absent from other CBLAS implementations. */
extern void openblas_set_num_threads(int n) __attribute__((weak));

typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));
__extension__ typedef _Float16 f16_t;
typedef f16_t v16f16 __attribute__((vector_size(32)));

struct cpu_backend {
    struct kvr_compute_backend base; /* first */
    kvr_tp_t *tp;
    struct kvr_backend_params p;
    float *conv; /* [n_threads][conv_per_thread] widened weight rows for sgemm */
    size_t conv_per_thread, kv_per_thread;
    float *scores; /* [n_threads][max_seq_len] attention scores */
    float *kbuf;   /* [n_threads][max_seq_len][head_dim] a kv head's K, gathered */
    float *vbuf;   /* [n_threads][max_seq_len][head_dim] and its V */
    float *sbuf;   /* [n_threads][ATTN_S_FLOATS] score tiles of the GEMM attention */
};

static struct cpu_backend *cpu(struct kvr_compute_backend *be)
{
    return (struct cpu_backend *)be;
}

/* Chunks for a parallel op of `work` flops-ish, at most max_chunks: one
 * (inline, no handoff) below PAR_MIN_WORK, else a few per thread so that a
 * descheduled thread's share is picked up by the others. */
#define PAR_MIN_WORK 200000.0

static int chunks_for(const struct cpu_backend *c, double work, int max_chunks)
{
    if (c->p.n_threads <= 1 || work < PAR_MIN_WORK || max_chunks <= 1)
        return 1;
    int n = c->p.n_threads * 4;
    return n < max_chunks ? n : max_chunks;
}

/* ------------------------------------------------------------ loads */

static inline __attribute__((always_inline)) v16f ld16(const void *w, int32_t dtype, size_t k)
{
    v16f f;
    if (dtype == KVR_DT_F32) {
        memcpy(&f, (const float *)w + k, 64);
    } else if (dtype == KVR_DT_BF16) {
        v16u16 h;
        memcpy(&h, (const uint16_t *)w + k, 32);
        v16u32 u = __builtin_convertvector(h, v16u32) << 16;
        memcpy(&f, &u, 64);
    } else {
        v16f16 hv;
        memcpy(&hv, (const uint16_t *)w + k, 32);
        f = __builtin_convertvector(hv, v16f);
    }
    return f;
}

static inline __attribute__((always_inline)) float ld1(const void *w, int32_t dtype, size_t k)
{
    if (dtype == KVR_DT_F32)
        return ((const float *)w)[k];
    if (dtype == KVR_DT_BF16) {
        uint32_t u = (uint32_t)((const uint16_t *)w)[k] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    f16_t h;
    memcpy(&h, (const uint16_t *)w + k, 2);
    return (float)h;
}

typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

/* Horizontal sum as a tree (halves added), a fixed order. */
static inline __attribute__((always_inline)) float hsum(v16f v)
{
    v8f a, b;
    memcpy(&a, &v, 32);
    memcpy(&b, (const char *)&v + 32, 32);
    a += b;
    v4f c, d;
    memcpy(&c, &a, 16);
    memcpy(&d, (const char *)&a + 16, 16);
    c += d;
    return (c[0] + c[2]) + (c[1] + c[3]);
}

static inline __attribute__((always_inline)) v16f ldx(const float *x)
{
    v16f f;
    memcpy(&f, x, 64);
    return f;
}

typedef int32_t v16i __attribute__((vector_size(64)));

/* exp(x) for 16 lanes: 2^n * 2^f with n = round(x log2 e), |f| <= 1/2, and
 * 2^f by its Taylor series to degree 7 (relative error < 2e-8 + float
 * rounding).  Inputs below -87 give 0, above 88 are clamped. */
static inline __attribute__((always_inline)) v16f vexp(v16f x)
{
    const v16f hi = (v16f){0} + 88.0f, lo = (v16f){0} - 87.0f;
    v16i mhi = x > hi, mlo = x < lo;
    x = (v16f)(((v16i)x & ~mhi) | ((v16i)hi & mhi));
    v16f t = x * 1.44269504088896341f;
    const v16f magic = (v16f){0} + 12582912.0f; /* 1.5 * 2^23: rounds to integer */
    v16f n = (t + magic) - magic;
    v16f f = (t - n) * 0.69314718055994531f; /* 2^(t-n) = e^f, |f| <= ln2/2 */
    v16f p = (v16f){0} + (1.0f / 5040.0f);
    p = p * f + (1.0f / 720.0f);
    p = p * f + (1.0f / 120.0f);
    p = p * f + (1.0f / 24.0f);
    p = p * f + (1.0f / 6.0f);
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    v16i e = (__builtin_convertvector(n, v16i) + 127) << 23;
    v16f r = p * (v16f)e;
    return (v16f)((v16i)r & ~mlo); /* x < -87: 0 */
}

static inline __attribute__((always_inline)) void vexp_inplace(float *v, size_t n, float sub)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        v16f x = ldx(v + i) - sub;
        x = vexp(x);
        memcpy(v + i, &x, 64);
    }
    if (i < n) {
        float tail[16] = {0};
        memcpy(tail, v + i, (n - i) * 4);
        v16f x = ldx(tail) - sub;
        x = vexp(x);
        memcpy(v + i, &x, (n - i) * 4);
    }
}

/* R weight rows x C activation rows, R*C accumulators. */
static inline __attribute__((always_inline)) void micro(const int R, const int C, int32_t dtype,
                                                        const void *w, size_t ldw, const float *x,
                                                        size_t ldx_, size_t K, float *out,
                                                        size_t ldo)
{
    v16f acc[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = (v16f){0};
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    size_t k = 0;
    for (; k + 16 <= K; k += 16) {
        v16f wv[4], xv[4];
        for (int r = 0; r < R; r++)
            wv[r] = ld16((const char *)w + (size_t)r * ldw * esz, dtype, k);
        for (int c = 0; c < C; c++)
            xv[c] = ldx(x + (size_t)c * ldx_ + k);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                acc[r][c] += wv[r] * xv[c];
    }
    for (int r = 0; r < R; r++) {
        for (int c = 0; c < C; c++) {
            float s = hsum(acc[r][c]);
            for (size_t kk = k; kk < K; kk++)
                s += ld1((const char *)w + (size_t)r * ldw * esz, dtype, kk) *
                     x[(size_t)c * ldx_ + kk];
            out[(size_t)c * ldo + (size_t)r] = s;
        }
    }
}

/* ------------------------------------------------------------ GEMV */

struct gemv_job {
    float *y;
    const float *x;
    int32_t M;
    const struct kvr_weight *w;
    const float *bias;
    bool accumulate;
};

/* Rows n0..n1 of y: 4 weight rows at a time (tail: 1), each group dotted
 * with 4 activation rows at a time (tail: 1..3) while it sits in L1.  Every
 * y element is one dot product summed in the same order whatever M, the
 * tile or the thread: a row's result does not depend on the batch. */
static inline __attribute__((always_inline)) void gemv_rows(const struct gemv_job *j, int32_t dtype,
                                                            int32_t n0, int32_t n1)
{
    const size_t K = (size_t)j->w->cols, N = (size_t)j->w->rows;
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    const char *W = j->w->data;
    float tmp[4 * 4];
    for (int32_t n = n0; n < n1;) {
        int R = n1 - n >= 4 ? 4 : 1;
        const void *wr = W + (size_t)n * K * esz;
        for (int32_t m = 0; m < j->M; m += 4) {
            int C = j->M - m < 4 ? j->M - m : 4;
            const float *xr = j->x + (size_t)m * K;
#define MICRO(r, c) micro(r, c, dtype, wr, K, xr, K, K, tmp, 4)
            if (R == 4) {
                switch (C) {
                case 4:
                    MICRO(4, 4);
                    break;
                case 3:
                    MICRO(4, 3);
                    break;
                case 2:
                    MICRO(4, 2);
                    break;
                default:
                    MICRO(4, 1);
                    break;
                }
            } else {
                switch (C) {
                case 4:
                    MICRO(1, 4);
                    break;
                case 3:
                    MICRO(1, 3);
                    break;
                case 2:
                    MICRO(1, 2);
                    break;
                default:
                    MICRO(1, 1);
                    break;
                }
            }
#undef MICRO
            for (int c = 0; c < C; c++) {
                for (int r = 0; r < R; r++) {
                    float v = tmp[c * 4 + r] + (j->bias ? j->bias[n + r] : 0.0f);
                    float *yp = &j->y[(size_t)(m + c) * N + (size_t)(n + r)];
                    *yp = j->accumulate ? *yp + v : v;
                }
            }
        }
        n += R;
    }
}

KVR_CLONES static void gemv_task(void *arg, int ith, int nth, int tid)
{
    const struct gemv_job *j = arg;
    int32_t N = j->w->rows;
    /* split in multiples of 4 rows */
    int32_t per = ((N + nth - 1) / nth + 3) & ~3;
    int32_t n0 = ith * per, n1 = n0 + per < N ? n0 + per : N;
    if (n0 >= n1)
        return;
    switch (j->w->dtype) {
    case KVR_DT_F32:
        gemv_rows(j, KVR_DT_F32, n0, n1);
        break;
    case KVR_DT_BF16:
        gemv_rows(j, KVR_DT_BF16, n0, n1);
        break;
    default:
        gemv_rows(j, KVR_DT_F16, n0, n1);
        break;
    }
}

/* ------------------------------------------------------------ GEMM */

struct conv_job {
    float *out;
    const void *src;
    int32_t dtype;
    size_t n;
};

KVR_CLONES static void conv_task(void *arg, int ith, int nth, int tid)
{
    const struct conv_job *j = arg;
    size_t per = ((j->n + (size_t)nth - 1) / (size_t)nth + 15) & ~(size_t)15;
    size_t i0 = (size_t)ith * per, i1 = i0 + per < j->n ? i0 + per : j->n;
    size_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        v16f v = ld16(j->src, j->dtype, i);
        memcpy(j->out + i, &v, 64);
    }
    for (; i < i1; i++)
        j->out[i] = ld1(j->src, j->dtype, i);
}

/* sgemm over a slice of W's rows [n0, n1), on one thread: OpenBLAS runs
 * single-threaded inside our pool, so one set of threads does all the work
 * (two pools spinning against each other on few cores lose a lot). */
struct sgemm_job {
    struct cpu_backend *c;
    float *y;
    const float *x;
    int32_t M;
    const struct kvr_weight *w;
    bool accumulate;
};

KVR_CLONES static void sgemm_task(void *arg, int chunk, int n_chunks, int tid)
{
    const struct sgemm_job *j = arg;
    const int32_t N = j->w->rows, K = j->w->cols;
    int32_t per = ((N + n_chunks - 1) / n_chunks + 15) & ~15;
    int32_t n0 = chunk * per, n1 = n0 + per < N ? n0 + per : N;
    if (n0 >= n1)
        return;
    if (j->w->dtype == KVR_DT_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->M, n1 - n0, K, 1.0f, j->x, K,
                    (const float *)j->w->data + (size_t)n0 * (size_t)K, K,
                    j->accumulate ? 1.0f : 0.0f, j->y + n0, N);
        return;
    }
    /* f16/bf16: widen rows into this thread's scratch, multiply, next rows */
    float *conv = j->c->conv + (size_t)tid * j->c->conv_per_thread;
    int32_t rows = (int32_t)(j->c->conv_per_thread / (size_t)K);
    for (int32_t r0 = n0; r0 < n1; r0 += rows) {
        int32_t nr = n1 - r0 < rows ? n1 - r0 : rows;
        struct conv_job cj = {conv, (const uint16_t *)j->w->data + (size_t)r0 * (size_t)K,
                              j->w->dtype, (size_t)nr * (size_t)K};
        conv_task(&cj, 0, 1, tid);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->M, nr, K, 1.0f, j->x, K, conv, K,
                    j->accumulate ? 1.0f : 0.0f, j->y + r0, N);
    }
}

static void cpu_matmul(struct kvr_compute_backend *be, float *y, const float *x, int32_t M,
                       const struct kvr_weight *w, const float *bias, unsigned flags)
{
    struct cpu_backend *c = cpu(be);
    const int32_t N = w->rows, K = w->cols;
    const bool accumulate = flags & KVR_MM_ACCUMULATE;
    if (M <= c->p.gemv_max_rows || (flags & KVR_MM_INVARIANT)) {
        struct gemv_job j = {y, x, M, w, bias, accumulate};
        kvr_tp_run(c->tp, gemv_task, &j, chunks_for(c, (double)M * N * K, N / 16));
        return;
    }
    struct sgemm_job j = {c, y, x, M, w, accumulate};
    /* one slice of >= 64 rows of W per thread: each sgemm call packs x
     * again, so more slices cost more than the balance they buy */
    int n_chunks = c->p.n_threads < N / 64 ? c->p.n_threads : N / 64;
    kvr_tp_run(c->tp, sgemm_task, &j, n_chunks > 1 ? n_chunks : 1);
    if (bias)
        for (int32_t m = 0; m < M; m++)
            for (int32_t n = 0; n < N; n++)
                y[(size_t)m * (size_t)N + (size_t)n] += bias[n];
}

/* ------------------------------------------------------------ small ops */

static void cpu_embed(struct kvr_compute_backend *be, float *x, const int32_t *tokens, int32_t M,
                      const struct kvr_weight *emb)
{
    size_t d = (size_t)emb->cols, esz = emb->dtype == KVR_DT_F32 ? 4 : 2;
    for (int32_t m = 0; m < M; m++) {
        struct conv_job cj = {x + (size_t)m * d,
                              (const char *)emb->data + (size_t)tokens[m] * d * esz, emb->dtype, d};
        conv_task(&cj, 0, 1, 0);
    }
}

struct norm_job {
    float *y;
    const float *x;
    int32_t M, dim;
    const float *w;
    float eps;
};

KVR_CLONES static void norm_task(void *arg, int ith, int nth, int tid)
{
    const struct norm_job *j = arg;
    for (int32_t m = ith; m < j->M; m += nth) {
        const float *xr = j->x + (size_t)m * (size_t)j->dim;
        float *yr = j->y + (size_t)m * (size_t)j->dim;
        float ss = 0;
        for (int32_t i = 0; i < j->dim; i++)
            ss += xr[i] * xr[i];
        float s = 1.0f / sqrtf(ss / (float)j->dim + j->eps);
        for (int32_t i = 0; i < j->dim; i++)
            yr[i] = xr[i] * s * j->w[i];
    }
}

static void cpu_rmsnorm(struct kvr_compute_backend *be, float *y, const float *x, int32_t M,
                        int32_t dim, const float *w, float eps)
{
    struct norm_job j = {y, x, M, dim, w, eps};
    kvr_tp_run(cpu(be)->tp, norm_task, &j, chunks_for(cpu(be), (double)M * dim * 4, M));
}

static void cpu_rope(struct kvr_compute_backend *be, float *x, int32_t M, int32_t n_heads,
                     int32_t head_dim, const int32_t *pos, const float *inv_freq)
{
    int32_t half = head_dim / 2;
    float cs[512], sn[512];
    for (int32_t m = 0; m < M; m++) {
        for (int32_t i = 0; i < half; i++) {
            float a = (float)pos[m] * inv_freq[i];
            cs[i] = cosf(a);
            sn[i] = sinf(a);
        }
        for (int32_t h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)m * (size_t)n_heads + (size_t)h) * (size_t)head_dim;
            for (int32_t i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * sn[i];
                v[i + half] = b * cs[i] + a * sn[i];
            }
        }
    }
}

static void cpu_kv_store(struct kvr_compute_backend *be, const struct kvr_attn_args *a,
                         const float *k, const float *v)
{
    const struct kvr_kv_layout *l = a->layout;
    size_t hd = (size_t)l->head_dim;
    for (int32_t r = 0; r < a->n_rows; r++) {
        int32_t p = a->pos[r];
        int32_t blk = a->block_table[r][p / l->block_size], slot = p % l->block_size;
        for (int32_t h = 0; h < l->n_kv_heads; h++) {
            const float *src = (size_t)r * (size_t)l->n_kv_heads * hd + (size_t)h * hd + k;
            memcpy(a->layer_base + kvr_kv_offset(l, blk, 0, h, slot), src, hd * 4);
            src = (size_t)r * (size_t)l->n_kv_heads * hd + (size_t)h * hd + v;
            memcpy(a->layer_base + kvr_kv_offset(l, blk, 1, h, slot), src, hd * 4);
        }
    }
}

struct attn_job {
    struct cpu_backend *c;
    const struct kvr_attn_args *a;
    const float *q;
    float *out;
};

KVR_CLONES static void attn_task(void *arg, int ith, int nth, int tid)
{
    const struct attn_job *j = arg;
    const struct kvr_attn_args *a = j->a;
    const struct kvr_kv_layout *l = a->layout;
    const int32_t H = a->n_heads, hd = l->head_dim, bs = l->block_size;
    const int32_t group = H / l->n_kv_heads;
    float *sc = j->c->scores + (size_t)tid * (size_t)j->c->p.max_seq_len;
    int32_t n_pairs = a->n_rows * H;
    for (int32_t pi = ith; pi < n_pairs; pi += nth) {
        int32_t r = pi / H, h = pi % H, kvh = h / group;
        int32_t p = a->pos[r];
        int32_t lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        const float *qv = j->q + ((size_t)r * (size_t)H + (size_t)h) * (size_t)hd;
        const int32_t *bt = a->block_table[r];
        float mx = -INFINITY;
        for (int32_t t = lo; t <= p; t++) {
            const float *kv = a->layer_base + kvr_kv_offset(l, bt[t / bs], 0, kvh, t % bs);
            float s = 0;
            int32_t i = 0;
            if (hd % 16 == 0) {
                v16f acc = {0};
                for (; i < hd; i += 16)
                    acc += ldx(qv + i) * ldx(kv + i);
                s = hsum(acc);
            }
            for (; i < hd; i++)
                s += qv[i] * kv[i];
            s *= a->scale;
            sc[t - lo] = s;
            if (s > mx)
                mx = s;
        }
        float sum = 0;
        vexp_inplace(sc, (size_t)(p - lo + 1), mx);
        for (int32_t t = lo; t <= p; t++)
            sum += sc[t - lo];
        float inv = 1.0f / sum;
        float *o = j->out + ((size_t)r * (size_t)H + (size_t)h) * (size_t)hd;
        memset(o, 0, (size_t)hd * 4);
        for (int32_t t = lo; t <= p; t++) {
            const float *vv = a->layer_base + kvr_kv_offset(l, bt[t / bs], 1, kvh, t % bs);
            float pr = sc[t - lo] * inv;
            for (int32_t i = 0; i < hd; i++)
                o[i] += pr * vv[i];
        }
    }
}

/* Prefill attention with two GEMMs per head and row tile: S = Q K^T * scale
 * over the keys up to the tile's last row, a masked softmax per row, O = S V.
 * K and V of the kv head are first gathered from the blocks. */
struct smax_job {
    float *s;
    int32_t ld, first_pos, lo_key, window, n_rows;
};

static inline __attribute__((always_inline)) void smax_row(const struct smax_job *j, int32_t r)
{
    float *row = j->s + (size_t)r * (size_t)j->ld;
    int32_t pos = j->first_pos + r; /* absolute position of this query */
    int32_t b = pos - j->lo_key;    /* last key index in the tile */
    int32_t a = 0;
    if (j->window > 0 && pos - j->window + 1 - j->lo_key > 0)
        a = pos - j->window + 1 - j->lo_key;
    float mx = -INFINITY;
    for (int32_t t = a; t <= b; t++)
        mx = row[t] > mx ? row[t] : mx;
    vexp_inplace(row + a, (size_t)(b - a + 1), mx);
    float sum = 0;
    for (int32_t t = a; t <= b; t++)
        sum += row[t];
    float inv = 1.0f / sum;
    for (int32_t t = a; t <= b; t++)
        row[t] *= inv;
    if (a > 0)
        memset(row, 0, (size_t)a * 4);
    if (b + 1 < j->ld)
        memset(row + b + 1, 0, (size_t)(j->ld - b - 1) * 4);
}

struct attn_gemm_job {
    struct cpu_backend *c;
    const struct kvr_attn_args *a;
    const float *q;
    float *out;
    int32_t lo, rows;
};

/* One kv head: gather its K/V, then for each query head of its group and
 * each tile of rows, S = Q K^T, masked softmax, O = S V. */
KVR_CLONES static void attn_gemm_task(void *arg, int kvh, int n_chunks, int tid)
{
    const struct attn_gemm_job *j = arg;
    const struct kvr_attn_args *a = j->a;
    const struct kvr_kv_layout *l = a->layout;
    struct cpu_backend *c = j->c;
    const int32_t M = a->n_rows, H = a->n_heads, hd = l->head_dim, bs = l->block_size;
    const int32_t group = H / l->n_kv_heads, p0 = a->pos[0], n_keys = p0 + M, lo = j->lo;
    const size_t ldq = (size_t)H * (size_t)hd;
    const int32_t *bt = a->block_table[0];
    float *kbuf = c->kbuf + (size_t)tid * c->kv_per_thread;
    float *vbuf = c->vbuf + (size_t)tid * c->kv_per_thread;
    float *sbuf = c->sbuf + (size_t)tid * ATTN_S_FLOATS;
    for (int32_t t = lo; t < n_keys; t++) {
        size_t off = kvr_kv_offset(l, bt[t / bs], 0, kvh, t % bs);
        memcpy(kbuf + (size_t)(t - lo) * (size_t)hd, a->layer_base + off, (size_t)hd * 4);
        off = kvr_kv_offset(l, bt[t / bs], 1, kvh, t % bs);
        memcpy(vbuf + (size_t)(t - lo) * (size_t)hd, a->layer_base + off, (size_t)hd * 4);
    }
    for (int32_t g = 0; g < group; g++) {
        int32_t h = kvh * group + g;
        for (int32_t r0 = 0; r0 < M; r0 += j->rows) {
            int32_t mr = M - r0 < j->rows ? M - r0 : j->rows;
            /* keys this tile needs: from the window start of its first row
             * to its last row's position */
            int32_t k0 =
                a->window > 0 && p0 + r0 - a->window + 1 > lo ? p0 + r0 - a->window + 1 : lo;
            int32_t nkk = p0 + r0 + mr - k0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mr, nkk, hd, a->scale,
                        j->q + (size_t)r0 * ldq + (size_t)h * (size_t)hd, (int)ldq,
                        kbuf + (size_t)(k0 - lo) * (size_t)hd, hd, 0.0f, sbuf, nkk);
            struct smax_job sj = {sbuf, nkk, p0 + r0, k0, a->window, mr};
            for (int32_t r = 0; r < mr; r++)
                smax_row(&sj, r);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mr, hd, nkk, 1.0f, sbuf, nkk,
                        vbuf + (size_t)(k0 - lo) * (size_t)hd, hd, 0.0f,
                        j->out + (size_t)r0 * ldq + (size_t)h * (size_t)hd, (int)ldq);
        }
    }
}

static bool attn_gemm(struct cpu_backend *c, const struct kvr_attn_args *a, const float *q,
                      float *out)
{
    const int32_t M = a->n_rows;
    if (M < 16)
        return false;
    for (int32_t r = 1; r < M; r++)
        if (a->block_table[r] != a->block_table[0] || a->pos[r] != a->pos[0] + r)
            return false;
    const int32_t p0 = a->pos[0], n_keys = p0 + M;
    int32_t lo = a->window > 0 && p0 - a->window + 1 > 0 ? p0 - a->window + 1 : 0;
    int32_t nk = n_keys - lo;
    int32_t rows = ATTN_ROWS < M ? ATTN_ROWS : M;
    if ((size_t)rows * (size_t)nk > ATTN_S_FLOATS)
        rows = (int32_t)(ATTN_S_FLOATS / (size_t)nk);
    if (rows < 1 || (size_t)nk * (size_t)a->layout->head_dim > c->kv_per_thread)
        return false;
    struct attn_gemm_job j = {c, a, q, out, lo, rows};
    kvr_tp_run(c->tp, attn_gemm_task, &j, a->layout->n_kv_heads);
    return true;
}

static void cpu_attention(struct kvr_compute_backend *be, const struct kvr_attn_args *a,
                          const float *q, float *out)
{
    if (attn_gemm(cpu(be), a, q, out))
        return;
    struct attn_job j = {cpu(be), a, q, out};
    /* work: every row attends to up to pos + 1 keys, per head */
    double work = 0;
    for (int32_t r = 0; r < a->n_rows; r++)
        work += (double)(a->pos[r] + 1);
    work *= 4.0 * a->n_heads * a->layout->head_dim;
    kvr_tp_run(cpu(be)->tp, attn_task, &j, chunks_for(cpu(be), work, a->n_rows * a->n_heads));
}

struct swiglu_job {
    float *g;
    const float *u;
    size_t n;
};

KVR_CLONES static void swiglu_task(void *arg, int ith, int nth, int tid)
{
    const struct swiglu_job *j = arg;
    /* slices in whole vectors, so an element's result (vector exp or the
     * scalar tail) does not depend on how the range was split */
    size_t per = ((j->n + (size_t)nth - 1) / (size_t)nth + 15) & ~(size_t)15;
    size_t i0 = (size_t)ith * per, i1 = i0 + per < j->n ? i0 + per : j->n;
    size_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        v16f g = ldx(j->g + i), u = ldx(j->u + i);
        v16f r = g / (1.0f + vexp(-g)) * u;
        memcpy(j->g + i, &r, 64);
    }
    for (; i < i1; i++) {
        float g = j->g[i];
        j->g[i] = g / (1.0f + expf(-g)) * j->u[i];
    }
}

static void cpu_swiglu(struct kvr_compute_backend *be, float *g, const float *u, size_t n)
{
    struct swiglu_job j = {g, u, n};
    kvr_tp_run(cpu(be)->tp, swiglu_task, &j, chunks_for(cpu(be), (double)n * 16, (int)(n / 1024)));
}

/* ------------------------------------------------------------ lifetime */

static void *cpu_alloc(struct kvr_compute_backend *be, size_t bytes)
{
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p)
        memset(p, 0, n);
    return p;
}

static void cpu_free(struct kvr_compute_backend *be, void *p)
{
    free(p);
}

static void cpu_destroy(struct kvr_compute_backend *be)
{
    struct cpu_backend *c = cpu(be);
    if (!c)
        return;
    kvr_tp_destroy(c->tp);
    free(c->conv);
    free(c->scores);
    free(c->kbuf);
    free(c->vbuf);
    free(c->sbuf);
    free(c);
}

static kvr_status_t cpu_create(const struct kvr_backend_params *p,
                               struct kvr_compute_backend **be_p)
{
    struct cpu_backend *c = calloc(1, sizeof(*c));
    if (!c)
        return KVR_ERR_NO_MEMORY;
    c->base.ops = &kvr_cpu_ops;
    c->base.n_threads = p->n_threads;
    c->p = *p;
    size_t nt = (size_t)p->n_threads;
    c->conv_per_thread = (CONV_FLOATS / nt) & ~(size_t)15;
    if (c->conv_per_thread < (size_t)p->max_cols * 16)
        c->conv_per_thread = (size_t)p->max_cols * 16;
    c->kv_per_thread = ((size_t)p->max_seq_len * (size_t)p->max_head_dim + 15) & ~(size_t)15;
    c->conv = aligned_alloc(64, nt * c->conv_per_thread * sizeof(float));
    c->scores = aligned_alloc(64, (nt * (size_t)p->max_seq_len * 4 + 63) & ~(size_t)63);
    c->kbuf = aligned_alloc(64, nt * c->kv_per_thread * sizeof(float));
    c->vbuf = aligned_alloc(64, nt * c->kv_per_thread * sizeof(float));
    c->sbuf = aligned_alloc(64, nt * ATTN_S_FLOATS * sizeof(float));
    kvr_status_t st = KVR_ERR_NO_MEMORY;
    if (!c->conv || !c->scores || !c->kbuf || !c->vbuf || !c->sbuf ||
        (st = kvr_tp_create(p->n_threads, &c->tp)) != KVR_OK) {
        cpu_destroy(&c->base);
        return st;
    }
    /* OpenBLAS runs single-threaded inside our pool's threads */
    if (openblas_set_num_threads)
        openblas_set_num_threads(1);
    *be_p = &c->base;
    return KVR_OK;
}

const struct kvr_compute_ops kvr_cpu_ops = {
    .name = "cpu",
    .create = cpu_create,
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .matmul = cpu_matmul,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
};
