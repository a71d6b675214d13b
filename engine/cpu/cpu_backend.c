/*
 * cpu_backend.c - the CPU compute backend.
 *
 * Every op is batch-invariant: a row's result does not depend on how many
 * rows are computed together, where the row sits, how a prompt is chunked
 * or which thread runs it.  Threads split work by output rows/columns and
 * heads, never inside a reduction, and every reduction has one fixed order:
 *
 *  - matmul, y[M][N] = x[M][K] W[N][K]^T, one kernel for every M (decode
 *    steps and prefill alike): W's rows split over the thread pool in
 *    panels of 4, each panel read once per L2-sized block of x rows in its
 *    file dtype (f32, f16 or bf16; widened in registers, or for larger
 *    blocks once into f32 scratch, which is exact) and dotted with 4 x rows
 *    at a time while it sits in L1.  Each output is one dot product: 16
 *    lanes accumulated over K in order, hsum()'s fixed tree, the scalar
 *    tail, + bias;
 *  - attention: each row's scores, softmax and weighted V sum over its
 *    whole key range in key order (no split of the KV sequence); rows of
 *    one sequence at consecutive positions share key loads in groups;
 *  - rmsnorm: one sequential sum a row; swiglu and exp lane by lane.
 *
 * Hot loops are compiled for x86-64-v4/v3/baseline (target_clones) and
 * picked at load by the CPU.  v4 and v3 compute the same bits (the same
 * 16-lane order; both contract a*b+c into FMA); the baseline clone has no
 * FMA and rounds differently, so the nodes of one cluster must all run the
 * v3 or v4 clone (any x86-64 CPU with AVX2+FMA, or AVX-512).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_compute_backend.h"
#include "kvr_log.h"
#include "threadpool.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KVR_CLONES
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));
__extension__ typedef _Float16 f16_t;

struct cpu_backend {
    struct kvr_compute_backend base; /* first */
    kvr_tp_t *tp;
    struct kvr_backend_params p;
    float *conv; /* [n_threads][conv_per_thread] a widened weight panel (<= 8 rows) */
    float *accs; /* [n_threads][MM_ACC_FLOATS] mm_panel8()'s accumulators between K chunks */
    size_t conv_per_thread;
    float *scores;       /* [n_threads][ATTN_RW][max_seq_len] attention scores */
    int32_t *grp;        /* [max_rows + 1] attention row groups */
    float *qpad;         /* [n_threads][ATTN_RW][head_dim rounded up to 16] */
    kvr_tp_fn mm_task;   /* the matmul kernel version for this CPU */
    kvr_tp_fn attn_task; /* the attention version, the same pick */
    int32_t numerics;    /* enum kvr_numerics */
    uint16_t *xbf;       /* bf16dot: [max_rows][xbf_ld] x rounded to bf16, zero-padded */
    size_t xbf_ld;       /* max_cols rounded up to 32 */
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

/* f16 loads by F16C's vcvtph2ps, for the matmul's own x86-64-v4 / v3
 * versions (mm_task_v4/_v3; GCC's own lowering of a _Float16 vector
 * conversion is element by element): pseudo-dtypes that only those
 * functions pass, so the instruction is only ever reached on a CPU that has
 * it.  Only with optimization, where the dead branches of the other
 * versions are folded away before the asm's operands must fit a register. */
#define DT_F16_V4 16
#define DT_F16_V3 17
typedef uint16_t v16u16u __attribute__((vector_size(32), aligned(2)));
typedef uint16_t v8u16u __attribute__((vector_size(16), aligned(2)));

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
        /* f16 -> f32 in integer lanes (GCC widens _Float16 vectors one
         * element at a time through libgcc without AVX512-FP16): the
         * exponent and mantissa moved into place and scaled by 2^112,
         * which also normalizes subnormals; inf/NaN get the all-ones
         * exponent; then the sign.  Exact, like any f16 -> f32. */
        v16u16 h;
        memcpy(&h, (const uint16_t *)w + k, 32);
        v16u32 x = __builtin_convertvector(h, v16u32);
        v16u32 em = (x & 0x7fffu) << 13;
        v16f m;
        memcpy(&m, &em, 64);
        m *= 0x1p112f;
        v16u32 u;
        memcpy(&u, &m, 64);
        v16u32 infnan = (v16u32)((x & 0x7c00u) == 0x7c00u);
        u = (u & ~infnan) | ((em | 0x7f800000u) & infnan);
        u |= (x & 0x8000u) << 16;
        memcpy(&f, &u, 64);
    }
    return f;
}

/* ld16(), plus the pseudo-dtypes: for the matmul kernel only, where dtype
 * is a constant */
static inline __attribute__((always_inline)) v16f ld16x(const void *w, int32_t dtype, size_t k)
{
    v16f f;
#if defined(__OPTIMIZE__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (dtype == DT_F16_V4) {
        __asm__("vcvtph2ps %1, %0" : "=v"(f) : "m"(*(const v16u16u *)((const uint16_t *)w + k)));
        return f;
    }
    if (dtype == DT_F16_V3) {
        typedef float v8f_ __attribute__((vector_size(32)));
        v8f_ lo, hi;
        __asm__("vcvtph2ps %1, %0" : "=x"(lo) : "m"(*(const v8u16u *)((const uint16_t *)w + k)));
        __asm__("vcvtph2ps %1, %0"
                : "=x"(hi)
                : "m"(*(const v8u16u *)((const uint16_t *)w + k + 8)));
        memcpy(&f, &lo, 32);
        memcpy((char *)&f + 32, &hi, 32);
        return f;
    }
#endif
    return ld16(w, dtype, k);
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

/* 16 floats from p, of which n valid (zeros after) */
static inline __attribute__((always_inline)) v16f ldpad(const float *p, int32_t n)
{
    if (n >= 16)
        return ldx(p);
    float f[16] = {0};
    memcpy(f, p, (size_t)n * 4);
    return ldx(f);
}

/* n (< 16) elements of weight row w (dtype) from element k, zero-padded to
 * 16, widened to f32: a dot product's tail step. */
static inline __attribute__((always_inline)) v16f ldwpad(const void *w, int32_t dtype, size_t k,
                                                         size_t n)
{
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    uint16_t h[16] = {0};
    float f[16] = {0};
    memcpy(dtype == KVR_DT_F32 ? (void *)f : (void *)h, (const char *)w + k * esz, n * esz);
    return dtype == KVR_DT_F32 ? ld16x(f, KVR_DT_F32, 0) : ld16x(h, dtype, 0);
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

/* lane by lane, x where x > m, else m */
static inline __attribute__((always_inline)) v16f vmax_sel(v16f m, v16f x)
{
    v16i gt = x > m;
    return (v16f)(((v16i)x & gt) | ((v16i)m & ~gt));
}

/* softmax(s[0..n)) as s[t] = e_t and the returned 1 / sum (p_t = e_t
 * times it, which the P V sum rounds once as it goes, where a third pass
 * over the row stored them).  The max lane by lane (exact in any order:
 * four running maxima, where one was a compare-and-select chain a vector;
 * only the sign of a zero maximum can differ, and exp(s - (+0)) =
 * exp(s - (-0)) for every s, 1 at s = +-0); e_t = exp(s_t - max) lane by
 * lane (vexp()); their sum in 16 lanes over t in order, the tail
 * zero-padded to one more vector, then hsum()'s tree: an order fixed by n
 * alone, so a row's probabilities depend only on its own scores (a scalar
 * sum in key order was a dependent add per key: with the scalar max, about
 * a third of a 1024-token prefill's attention). */
static inline __attribute__((always_inline)) float softmax_row(float *s, size_t n)
{
    v16f m0 = (v16f){0} - INFINITY, m1 = m0, m2 = m0, m3 = m0;
    size_t t = 0;
    for (; t + 64 <= n; t += 64) {
        m0 = vmax_sel(m0, ldx(s + t));
        m1 = vmax_sel(m1, ldx(s + t + 16));
        m2 = vmax_sel(m2, ldx(s + t + 32));
        m3 = vmax_sel(m3, ldx(s + t + 48));
    }
    for (; t + 16 <= n; t += 16)
        m0 = vmax_sel(m0, ldx(s + t));
    m0 = vmax_sel(vmax_sel(m0, m1), vmax_sel(m2, m3));
    float mx = -INFINITY;
    for (int i = 0; i < 16; i++)
        mx = m0[i] > mx ? m0[i] : mx;
    for (; t < n; t++)
        mx = s[t] > mx ? s[t] : mx;
    v16f acc = (v16f){0};
    for (t = 0; t + 16 <= n; t += 16) {
        v16f x = vexp(ldx(s + t) - mx);
        memcpy(s + t, &x, 64);
        acc += x;
    }
    if (t < n) {
        float tail[16];
        memcpy(tail, s + t, (n - t) * 4);
        for (size_t i = n - t; i < 16; i++)
            tail[i] = -INFINITY; /* exp -> 0 */
        v16f x = vexp(ldx(tail) - mx);
        memcpy(s + t, &x, (n - t) * 4);
        acc += x;
    }
    return 1.0f / hsum(acc);
}

/* hsum() of each of a[0..15], as lanes 0..15, with the same adds in the same
 * order: lane i + lane i+8, then + 4, then (c0 + c2) + (c1 + c3). */
static inline __attribute__((always_inline)) v16f hsum16(const v16f *a)
{
    const v16i l1a = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const v16i l1b = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const v16i l2a = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const v16i l2b = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
    const v16i l3a = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const v16i l3b = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
    const v16i l4a = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const v16i l4b = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    v16f p[8], q[4], r[2];
    for (int i = 0; i < 8; i++)
        p[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], l1a) +
               __builtin_shuffle(a[2 * i], a[2 * i + 1], l1b);
    for (int i = 0; i < 4; i++)
        q[i] = __builtin_shuffle(p[2 * i], p[2 * i + 1], l2a) +
               __builtin_shuffle(p[2 * i], p[2 * i + 1], l2b);
    for (int i = 0; i < 2; i++)
        r[i] = __builtin_shuffle(q[2 * i], q[2 * i + 1], l3a) +
               __builtin_shuffle(q[2 * i], q[2 * i + 1], l3b);
    return __builtin_shuffle(r[0], r[1], l4a) + __builtin_shuffle(r[0], r[1], l4b);
}

/* s m in every lane, broadcast from a register (a broadcast GCC can fold
 * into FMAs as a memory operand loads s again for each); H8 (the
 * x86-64-v3 versions): joined from two 8-lane broadcasts, where GCC
 * builds a 16-lane one under AVX2 lane by lane through the stack. */
static inline __attribute__((always_inline)) v16f splat_mul(const int H8, float s, float m)
{
    typedef int32_t v8i __attribute__((vector_size(32)));
    const float x = s * m;
    if (!H8)
        return __builtin_shuffle((v16f){x}, (v16i){0});
    v8f h = __builtin_shuffle((v8f){x}, (v8i){0});
    v16f f;
    memcpy(&f, &h, 32);
    memcpy((char *)&f + 32, &h, 32);
    return f;
}

/* hsum16() for the x86-64-v3 versions: the same adds on 8- and 4-lane
 * vectors, 4 sums at a time.  Under AVX2 (a v16f is two ymm) GCC lowers
 * hsum16()'s 16-lane shuffles element by element through the stack: that
 * was most of attn_task_v3's time. */
static inline __attribute__((always_inline)) v16f hsum16_h(const v16f *a)
{
    typedef int32_t v4i __attribute__((vector_size(16)));
    float out[16];
    for (int g = 0; g < 4; g++) {
        v4f f[4];
        for (int i = 0; i < 4; i++) {
            v8f lo, hi;
            memcpy(&lo, &a[4 * g + i], 32);
            memcpy(&hi, (const char *)&a[4 * g + i] + 32, 32);
            lo += hi; /* lane i + lane i+8 */
            v4f c, d;
            memcpy(&c, &lo, 16);
            memcpy(&d, (const char *)&lo + 16, 16);
            f[i] = c + d; /* + 4 */
        }
        /* (c0 + c2) + (c1 + c3) of each */
        v4f p = __builtin_shuffle(f[0], f[1], (v4i){0, 1, 4, 5}) +
                __builtin_shuffle(f[0], f[1], (v4i){2, 3, 6, 7});
        v4f q = __builtin_shuffle(f[2], f[3], (v4i){0, 1, 4, 5}) +
                __builtin_shuffle(f[2], f[3], (v4i){2, 3, 6, 7});
        v4f r =
            __builtin_shuffle(p, q, (v4i){0, 2, 4, 6}) + __builtin_shuffle(p, q, (v4i){1, 3, 5, 7});
        memcpy(out + 4 * g, &r, 16);
    }
    return ldx(out);
}

/* R weight rows x C activation rows, R*C accumulators: out[c][r] = the dot
 * of weight row r and x row c, 16 lanes accumulated over K in order (the
 * tail zero-padded to a last vector step), then hsum().  Only vector
 * arithmetic, so every instantiation (R, C, dtype) rounds alike. */
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
            wv[r] = ld16x((const char *)w + (size_t)r * ldw * esz, dtype, k);
        for (int c = 0; c < C; c++)
            xv[c] = ldx(x + (size_t)c * ldx_ + k);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                acc[r][c] += wv[r] * xv[c];
    }
    if (k < K) { /* the tail, zero-padded to one more vector step */
        v16f wv[4], xv[4];
        for (int r = 0; r < R; r++)
            wv[r] = ldwpad((const char *)w + (size_t)r * ldw * esz, dtype, k, K - k);
        for (int c = 0; c < C; c++)
            xv[c] = ldpad(x + (size_t)c * ldx_ + k, (int32_t)(K - k));
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                acc[r][c] += wv[r] * xv[c];
    }
    if (R == 4 && C == 4 && ldo == 4) { /* the 16 sums in one hsum16() network */
        v16f a16[16];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++)
                a16[c * 4 + r] = acc[r][c];
        v16f sums = hsum16(a16);
        memcpy(out, &sums, 64);
        return;
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            out[(size_t)c * ldo + (size_t)r] = hsum(acc[r][c]);
}

/* ------------------------------------------------------------ matmul */

struct mm_job {
    struct cpu_backend *c;
    float *y;
    const float *x;
    int32_t M;
    const struct kvr_weight *w;
    const float *bias;
    bool accumulate;
    int32_t per; /* weight rows a chunk, a multiple of 4 */
};

/* Rows m0..m1 of y against one panel of R weight rows wp (stride ldw, in
 * dtype) starting at weight row n: R x C tiles of micro(). */
/* The R x C micro-kernel (R 4 or 1, C 1..4) that the caller's MICRO(r, c)
 * names, each shape a constant so that the compiler unrolls it. */
#define MICRO_SHAPES(R, C)                                                                         \
    do {                                                                                           \
        if ((R) == 4) {                                                                            \
            if ((C) == 4)                                                                          \
                MICRO(4, 4);                                                                       \
            else if ((C) == 3)                                                                     \
                MICRO(4, 3);                                                                       \
            else if ((C) == 2)                                                                     \
                MICRO(4, 2);                                                                       \
            else                                                                                   \
                MICRO(4, 1);                                                                       \
        } else {                                                                                   \
            if ((C) == 4)                                                                          \
                MICRO(1, 4);                                                                       \
            else if ((C) == 3)                                                                     \
                MICRO(1, 3);                                                                       \
            else if ((C) == 2)                                                                     \
                MICRO(1, 2);                                                                       \
            else                                                                                   \
                MICRO(1, 1);                                                                       \
        }                                                                                          \
    } while (0)

/* y[m.., n + r * rs] of a panel's R x C dots in tmp (column-major, 4 a
 * column), plus the bias; added to y when the job accumulates. */
static inline __attribute__((always_inline)) void
mm_store(const struct mm_job *j, const float *tmp, int R, int C, int32_t m, int32_t n, int32_t rs)
{
    const size_t N = (size_t)j->w->rows;
    if (R == 4 && rs == 1) { /* 4 adjacent outputs a row: the same adds, 4 lanes at once */
        v4f b = {0};
        if (j->bias)
            memcpy(&b, j->bias + n, 16);
        for (int c = 0; c < C; c++) {
            v4f v;
            memcpy(&v, tmp + c * 4, 16);
            v += b;
            float *yp = &j->y[(size_t)(m + c) * N + (size_t)n];
            if (j->accumulate) {
                v4f o;
                memcpy(&o, yp, 16);
                v = o + v;
            }
            memcpy(yp, &v, 16);
        }
        return;
    }
    for (int c = 0; c < C; c++) {
        for (int r = 0; r < R; r++) {
            int32_t nr = n + r * rs;
            float v = tmp[c * 4 + r] + (j->bias ? j->bias[nr] : 0.0f);
            float *yp = &j->y[(size_t)(m + c) * N + (size_t)nr];
            *yp = j->accumulate ? *yp + v : v;
        }
    }
}

static inline __attribute__((always_inline)) void mm_panel(const struct mm_job *j, int32_t dtype,
                                                           const void *wp, size_t ldw, int R,
                                                           int32_t n, int32_t rs, int32_t m0,
                                                           int32_t m1)
{
    const size_t K = (size_t)j->w->cols;
    float tmp[4 * 4];
    for (int32_t m = m0; m < m1; m += 4) {
        int C = m1 - m < 4 ? m1 - m : 4;
        const float *xr = j->x + (size_t)m * K;
#define MICRO(r, c) micro(r, c, dtype, wp, ldw, xr, K, K, tmp, 4)
        MICRO_SHAPES(R, C);
#undef MICRO
        mm_store(j, tmp, R, C, m, n, rs);
    }
}

/* Weight rows n0..n1 of y for all M rows.  The activation rows go in blocks
 * that stay in L2 (MM_XBLOCK bytes); per block, each panel of 4 weight rows
 * (tail: 1) is read once and dotted with 4 activation rows at a time while
 * it sits in L1.  A f16/bf16 panel met by more than MM_WIDEN_ROWS rows is
 * first widened into the thread's f32 scratch (exact), so its conversion is
 * paid once per block instead of once per 4 rows.  (Copying f32 panels too
 * was faster alone with weights in cache, 1.1-1.2x at M = 32 / 128, but not
 * in the model: no gain at prefill-128, 0.86x at f32 decode batch 32.)
 * Every y element is one
 * micro() dot product in the same order whatever M, the blocking, the
 * widening or the thread: a row's result does not depend on the batch. */
#define MM_XBLOCK     (512u << 10)
#define MM_WIDEN_ROWS 8

/* A decode step (M <= MM_DECODE_ROWS) streams every weight from memory
 * once and does little arithmetic on it, so it runs at the rate the core's
 * prefetchers find the rows.  A panel of 4 adjacent rows is 4 streams of
 * one row each (24 cache lines for K = 768 in f16, 48 in f32) that start
 * anew every panel, too short for the hardware prefetcher to learn: a
 * microbenchmark of that pattern read 9-16 GB/s where a plain read of the
 * same bytes read 26 (software prefetch of the panel 4 panels ahead, what
 * this kernel did before, got 16-bit decode to about half the read rate).
 * So decode walks the thread's rows in 4 quarters, panel i = rows
 * n0 + i + {0, q, 2q, 3q}: 4 streams, each sequential through a quarter of
 * the rows, which the hardware prefetcher follows (batch-1 decode 1.4x in
 * f32, 1.8x in f16, 2.1x in bf16 against the prefetched adjacent panels;
 * software prefetch on top of the quarters made it slower).  Prefill keeps
 * adjacent panels (its arithmetic per weight hides the misses).  Which rows
 * share a panel changes no bit: each output is its own micro() dot product
 * (rows 4q.. of the range go one a panel, R = 1, the same bits as R = 4).
 * On x86-64-v4 steps of up to MM_ONEPASS_MAX rows go in halves with a
 * software prefetch instead (mm_rows2()), and larger ones in the prefill
 * tiles (mm_rows8()); so the quarters serve x86-64-v3 and the baseline. */
#define MM_DECODE_ROWS 16

/* A thread's walk over its weight rows n0..n1 in panels: adjacent rows
 * (S = 0; the tail one row a panel), or S streams (4 quarters or 2 halves)
 * of q rows each (the rows past S q one a panel). */
struct mm_walk {
    int32_t n, n1, q, i, s;
};

static inline __attribute__((always_inline)) struct mm_walk mm_walk_init(int32_t n0, int32_t n1,
                                                                         int S)
{
    int32_t q = S ? (n1 - n0) / S : 0;
    return (struct mm_walk){n0, n1, q, 0, S};
}

/* The next panel: its first row *n, the stride *rs between its rows and
 * its height (S or 1); 0 when the walk is done. */
static inline __attribute__((always_inline)) int mm_walk_next(struct mm_walk *w, int32_t *n,
                                                              int32_t *rs)
{
    if (w->i < w->q) {
        *n = w->n + w->i++;
        *rs = w->q;
        if (w->i == w->q)
            w->n += w->s * w->q, w->q = 0;
        return w->s;
    }
    if (w->n >= w->n1)
        return 0;
    int R = w->s != 2 && w->n1 - w->n >= 4 ? 4 : 1;
    *n = w->n;
    *rs = 1;
    w->n += R;
    return R;
}

/* K elements of a weight row (dtype) widened to f32 at dst (exact). */
static inline __attribute__((always_inline)) void mm_widen(float *dst, const void *src,
                                                           int32_t dtype, size_t K)
{
    size_t i = 0;
    for (; i + 16 <= K; i += 16) {
        v16f v = ld16x(src, dtype, i);
        memcpy(dst + i, &v, 64);
    }
    for (; i < K; i++)
        dst[i] = ld1(src, dtype, i);
}

/* Weight rows n0..n1 of y, all M rows of x, in x blocks of mb rows that
 * stay in L2 while the rows' panels pass over them. The version's widening
 * (WIDEN(dst, src, dtype, K): a weight row to f32, exact) and panel kernel
 * (PANEL, mm_panel()'s arguments) make it mm_rows() or mm_rows_v3(); the walk
 * is one, so both versions visit the same panels in the same order. */
#define MM_ROWS_FN(ATTR, NAME, WIDEN, PANEL)                                                       \
    ATTR void NAME(const struct mm_job *j, int32_t dtype, int32_t n0, int32_t n1, int tid)         \
    {                                                                                              \
        const size_t K = (size_t)j->w->cols;                                                       \
        const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;                                            \
        const char *W = j->w->data;                                                                \
        int32_t mb = (int32_t)(MM_XBLOCK / (K * 4)) & ~3;                                          \
        if (mb < 4)                                                                                \
            mb = 4;                                                                                \
        float *conv = j->c->conv + (size_t)tid * j->c->conv_per_thread;                            \
        for (int32_t m0 = 0; m0 < j->M; m0 += mb) {                                                \
            int32_t m1 = j->M - m0 < mb ? j->M : m0 + mb;                                          \
            bool widen = dtype != KVR_DT_F32 && m1 - m0 > MM_WIDEN_ROWS;                           \
            struct mm_walk wk = mm_walk_init(n0, n1, j->M <= MM_DECODE_ROWS ? 4 : 0);              \
            int32_t n, rs;                                                                         \
            int R;                                                                                 \
            while ((R = mm_walk_next(&wk, &n, &rs)) != 0) {                                        \
                const char *wr = W + (size_t)n * K * esz;                                          \
                if (widen) {                                                                       \
                    for (int r = 0; r < R; r++)                                                    \
                        WIDEN(conv + (size_t)r * K, wr + (size_t)r * (size_t)rs * K * esz, dtype,  \
                              K);                                                                  \
                    PANEL(j, KVR_DT_F32, conv, K, R, n, rs, m0, m1);                               \
                } else {                                                                           \
                    PANEL(j, dtype, wr, K *(size_t)rs, R, n, rs, m0, m1);                          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

MM_ROWS_FN(static inline __attribute__((always_inline)), mm_rows, mm_widen, mm_panel)

/* mm_task in three versions, picked once by the CPU (cpu_create), the same
 * choice target_clones makes for the other kernels: x86-64-v4 and v3 load
 * f16 with vcvtph2ps; every version computes the same bits. */
/* Task ith's share of the weight rows (j->per a task) in every version:
 * ROWS(j, dtype, n0, n1, tid) is the version's row walk, called with the
 * weights' dtype as a constant (F16, the version's f16 constant, for f16)
 * so that each walk is compiled for one dtype. */
#define MM_TASK_ROWS(j, ith, tid, ROWS, F16)                                                       \
    do {                                                                                           \
        int32_t n_ = (j)->w->rows, n0_ = (ith) * (j)->per;                                         \
        int32_t n1_ = n0_ + (j)->per < n_ ? n0_ + (j)->per : n_;                                   \
        if (n0_ >= n1_)                                                                            \
            break;                                                                                 \
        switch ((j)->w->dtype) {                                                                   \
        case KVR_DT_F32:                                                                           \
            ROWS(j, KVR_DT_F32, n0_, n1_, tid);                                                    \
            break;                                                                                 \
        case KVR_DT_BF16:                                                                          \
            ROWS(j, KVR_DT_BF16, n0_, n1_, tid);                                                   \
            break;                                                                                 \
        default:                                                                                   \
            ROWS(j, F16, n0_, n1_, tid);                                                           \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

static inline __attribute__((always_inline)) void mm_task_body(void *arg, int ith, int tid,
                                                               int32_t f16)
{
    const struct mm_job *j = arg;
    MM_TASK_ROWS(j, ith, tid, mm_rows, f16);
}

/* y[m..m+C-1][n..n+7] of an 8 x C tile's dots in out (out[c * 8 + r]),
 * plus the bias, added to y when the job accumulates: mm_store()'s adds,
 * 8 lanes at once. */
static inline __attribute__((always_inline)) void
mm_store8(const struct mm_job *j, const float *out, int C, int32_t m, int32_t n)
{
    const size_t N = (size_t)j->w->rows;
    v8f b = {0};
    if (j->bias)
        memcpy(&b, j->bias + n, 32);
    for (int c = 0; c < C; c++) {
        v8f v;
        memcpy(&v, out + c * 8, 32);
        v += b;
        float *yp = &j->y[(size_t)(m + c) * N + (size_t)n];
        if (j->accumulate) {
            v8f o;
            memcpy(&o, yp, 32);
            v = o + v;
        }
        memcpy(yp, &v, 32);
    }
}

#if defined(__OPTIMIZE__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
/* The x86-64-v4 matmul for M > MM_ONEPASS_MAX (prefill, and decode steps
 * of more than 10 rows): 8 adjacent weight rows x 3 x rows a tile, 24
 * accumulators of AVX-512's 32 registers.  Against micro()'s 4 x 4, each
 * x vector (the x block does not fit L1: 32 rows of K = 768 are 96 KB, so
 * x streams from L2) serves 8 weight rows instead of 4, and a k step loads
 * 11 vectors for 24 FMAs instead of 8 for 16.  Each output is micro()'s
 * dot product: 16 lanes over K in order, the same zero-padded tail, then
 * hsum16() (hsum()'s adds), so the bits are micro()'s whatever the tile.
 * The empty asm after each weight load keeps the vector in a register:
 * without it GCC folds the load into each of its 3 FMAs (27 loads a step),
 * which ran at half the speed (73 against 150 GFLOP/s for micro() at
 * M = 32, N = 2048, K = 768; 166-170 with the asm). */
#define MM_TILE_ROWS 8

/* While a panel's passes run, micro8() prefetches the next panel (its
 * lines spread evenly over the passes, one per k step): the first pass over
 * a panel no longer waits on DRAM for rows too short for the hardware
 * prefetcher to learn (48 lines at K = 768 in f32).  Only panels of at most
 * this many bytes: at K = 2048 in f32 (64 KB, rows of 128 lines the
 * hardware follows) it was slower.  Which lines are prefetched changes no
 * bit. */
#define MM_PREFETCH_PANEL (32u << 10)

/* K above MM_KSPLIT goes in chunks of at most MM_KCHUNK (whole vector
 * steps): all of a panel's passes over one chunk, then the next, each
 * pass's 24 accumulators kept in the thread's save area between chunks (a
 * store and a load: exact, and each lane still sums its k in order, so the
 * bits are unchanged).  Unchunked, the 64 KB f32 panel of K = 2048 ran at
 * 120 GFLOP/s against 190 at K = 768 and 180 at K = 1040 (M = 128). */
#define MM_KSPLIT 1536
#define MM_KCHUNK 1024
/* A packed panel (mm_pack8()) is one sequential stream, so a chunk has no
 * strided rows to keep apart and a smaller one pays: at K = 2048 in bf16
 * (M = 128) chunks of at most 768 (688 there) ran at 190-193 GFLOP/s
 * against 179-181 with 1024, at M = 32 175-176 against 169-172; unpacked
 * f32 stays at 1024 (768 and 512 ran at 145 and 140 against 155).  In the
 * model, where K = 2048 is a fifth of the flops, it reads as noise
 * (prefill-1024 bf16 1.007, prefill-128 1.001, 5 pairs). */
#define MM_KCHUNK_PACKED 768
/* a thread's save area: 24 vectors for each pass of an x block, which has
 * at most MM_XBLOCK / (4 * MM_KSPLIT) rows when K > MM_KSPLIT */
#define MM_ACC_FLOATS ((MM_XBLOCK / (4 * MM_KSPLIT) + 2) / 3 * MM_TILE_ROWS * 3 * 16)

/* PK: w is a panel mm_pack8() packed (ldw, dtype unused: f32, one
 * pointer); else 8 rows ldw elements apart in dtype. */
__attribute__((target("arch=x86-64-v4"))) static inline __attribute__((always_inline)) void
micro8(const int C, const int PK, int32_t dtype, const void *w, size_t ldw, const float *x,
       size_t ldx_, size_t K, float *out, const char *pf, size_t npf, size_t k0, size_t k1,
       float *save)
{
    v16f acc[MM_TILE_ROWS][3];
    for (int r = 0; r < MM_TILE_ROWS; r++)
        for (int c = 0; c < C; c++) {
            if (k0)
                memcpy(&acc[r][c], save + (size_t)(r * 3 + c) * 16, 64);
            else
                acc[r][c] = (v16f){0};
        }
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    size_t k = k0;
    size_t s = 0;
    for (; k + 16 <= k1; k += 16, s++) {
        v16f xv[3];
        for (int c = 0; c < C; c++)
            xv[c] = ldx(x + (size_t)c * ldx_ + k);
        if (s < npf) /* a line of the next panel (mm_panel8()) */
            __builtin_prefetch(pf + s * 64, 0, 3);
        for (int r = 0; r < MM_TILE_ROWS; r++) {
            v16f wv = PK ? ldx((const float *)w + k * MM_TILE_ROWS + r * 16)
                         : ld16x((const char *)w + (size_t)r * ldw * esz, dtype, k);
            __asm__("" : "+v"(wv));
            for (int c = 0; c < C; c++)
                acc[r][c] += wv * xv[c];
        }
    }
    if (k1 < K) { /* a K chunk: the accumulators wait in save for the next */
        for (int r = 0; r < MM_TILE_ROWS; r++)
            for (int c = 0; c < C; c++)
                memcpy(save + (size_t)(r * 3 + c) * 16, &acc[r][c], 64);
        return;
    }
    if (k < K) { /* the tail, zero-padded to one more vector step, as micro() */
        v16f xv[3];
        for (int c = 0; c < C; c++)
            xv[c] = ldpad(x + (size_t)c * ldx_ + k, (int32_t)(K - k));
        for (int r = 0; r < MM_TILE_ROWS; r++) {
            /* a packed panel: mm_pack8() zero-padded the tail */
            v16f wv = PK ? ldx((const float *)w + k * MM_TILE_ROWS + r * 16)
                         : ldwpad((const char *)w + (size_t)r * ldw * esz, dtype, k, K - k);
            for (int c = 0; c < C; c++)
                acc[r][c] += wv * xv[c];
        }
    }
    v16f a32[32];
    for (int i = 0; i < 32; i++)
        a32[i] = (v16f){0};
    for (int c = 0; c < C; c++)
        for (int r = 0; r < MM_TILE_ROWS; r++)
            a32[c * MM_TILE_ROWS + r] = acc[r][c];
    v16f s0 = hsum16(a32);
    memcpy(out, &s0, 64);
    if (C > 2) {
        v16f s1 = hsum16(a32 + 16);
        memcpy(out + 16, &s1, 64);
    }
}

/* Rows m0..m1 of y against weight rows n..n+7 (wp, stride ldw, dtype). */
__attribute__((target("arch=x86-64-v4"))) static inline __attribute__((always_inline)) void
mm_panel8(const struct mm_job *j, const int PK, int32_t dtype, const void *wp, size_t ldw,
          int32_t n, int32_t m0, int32_t m1, const char *next, size_t next_bytes, int tid)
{
    const size_t K = (size_t)j->w->cols;
    const size_t lines = (next_bytes + 63) / 64, passes = (size_t)(m1 - m0 + 2) / 3;
    const size_t per = (lines + passes - 1) / passes;
    size_t l = 0;
    float out[32];
    if (K <= MM_KSPLIT) { /* one chunk: the loop without the save area */
        const size_t steps = K / 16;
        for (int32_t m = m0; m < m1; m += 3) {
            int C = m1 - m < 3 ? m1 - m : 3;
            const float *xr = j->x + (size_t)m * K;
            size_t np = lines - l < per ? lines - l : per;
            np = np < steps ? np : steps;
            const char *pf = next + l * 64;
            if (C == 3)
                micro8(3, PK, dtype, wp, ldw, xr, K, K, out, pf, np, 0, K, NULL);
            else if (C == 2)
                micro8(2, PK, dtype, wp, ldw, xr, K, K, out, pf, np, 0, K, NULL);
            else
                micro8(1, PK, dtype, wp, ldw, xr, K, K, out, pf, np, 0, K, NULL);
            l += np;
            mm_store8(j, out, C, m, n);
        }
    } else {
        /* K in chunks of whole vector steps, at most MM_KCHUNK(_PACKED) */
        const size_t kmax = PK ? MM_KCHUNK_PACKED : MM_KCHUNK;
        const size_t nch = (K + kmax - 1) / kmax;
        const size_t kc = ((K + nch - 1) / nch + 15) & ~(size_t)15;
        for (size_t k0 = 0; k0 < K; k0 += kc) {
            const size_t k1 = K - k0 <= kc ? K : k0 + kc, steps = (k1 - k0) / 16;
            float *save = j->c->accs + (size_t)tid * MM_ACC_FLOATS;
            for (int32_t m = m0; m < m1; m += 3, save += MM_TILE_ROWS * 3 * 16) {
                int C = m1 - m < 3 ? m1 - m : 3;
                const float *xr = j->x + (size_t)m * K;
                size_t np = k1 < K ? 0 : lines - l < per ? lines - l : per;
                np = np < steps ? np : steps;
                const char *pf = next + l * 64;
                if (C == 3)
                    micro8(3, PK, dtype, wp, ldw, xr, K, K, out, pf, np, k0, k1, save);
                else if (C == 2)
                    micro8(2, PK, dtype, wp, ldw, xr, K, K, out, pf, np, k0, k1, save);
                else
                    micro8(1, PK, dtype, wp, ldw, xr, K, K, out, pf, np, k0, k1, save);
                l += np;
                if (k1 == K)
                    mm_store8(j, out, C, m, n);
            }
        }
    }
    for (; l < lines; l++) /* what the passes had no k steps left for */
        __builtin_prefetch(next + l * 64, 0, 3);
}

/* 8 weight rows (src, dtype, rows K apart) widened to f32 and packed for
 * micro8(PK): each vector step's 8 row vectors adjacent (dst[k * 8 + r *
 * 16 + i] = row r's element k + i), the tail zero-padded.  One pointer
 * then serves the whole panel (no row pointers spilled), and the panel is
 * one sequential stream.  The values and their order in each lane's sum
 * are those of the rows: the bits do not change. */
__attribute__((target("arch=x86-64-v4"))) static inline __attribute__((always_inline)) void
mm_pack8(float *dst, const char *src, int32_t dtype, size_t K)
{
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    size_t k = 0;
    for (; k + 16 <= K; k += 16)
        for (int r = 0; r < MM_TILE_ROWS; r++) {
            v16f v = ld16x(src + (size_t)r * K * esz, dtype, k);
            memcpy(dst + k * MM_TILE_ROWS + (size_t)r * 16, &v, 64);
        }
    if (k < K)
        for (int r = 0; r < MM_TILE_ROWS; r++) {
            float *d = dst + k * MM_TILE_ROWS + (size_t)r * 16;
            for (size_t i = 0; i < 16; i++)
                d[i] = k + i < K ? ld1(src + (size_t)r * K * esz, dtype, k + i) : 0.0f;
        }
}

/* f32 panels are packed (a copy) only for x blocks of more rows than
 * this: packed at decode batch 32 too, f32 read 0.93x in the model (5
 * pairs); prefill-128 gained 1.07x. */
#define MM_PACK_F32_ROWS 32

/* mm_rows() for M > MM_ONEPASS_MAX on x86-64-v4: the same x blocks and
 * widening, the weight rows in 8-row panels while 8 are left, the rest as
 * mm_rows() takes them (adjacent 4-row panels, then one row a panel). */
__attribute__((target("arch=x86-64-v4"))) static inline __attribute__((always_inline)) void
mm_rows8(const struct mm_job *j, int32_t dtype, int32_t n0, int32_t n1, int tid)
{
    const size_t K = (size_t)j->w->cols;
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    const char *W = j->w->data;
    int32_t mb = (int32_t)(MM_XBLOCK / (K * 4)) & ~3;
    if (mb < 4)
        mb = 4;
    float *conv = j->c->conv + (size_t)tid * j->c->conv_per_thread;
    for (int32_t m0 = 0; m0 < j->M; m0 += mb) {
        int32_t m1 = j->M - m0 < mb ? j->M : m0 + mb;
        /* 8-row panels packed (mm_pack8()) when widened, and f32 ones (a
         * copy) for blocks of more than MM_PACK_F32_ROWS rows */
        bool widen = dtype != KVR_DT_F32 && m1 - m0 > MM_WIDEN_ROWS;
        bool pack = widen || m1 - m0 > MM_PACK_F32_ROWS;
        int32_t nn = n0;
        const size_t pbytes = MM_TILE_ROWS * K * esz;
        for (; nn + MM_TILE_ROWS <= n1; nn += MM_TILE_ROWS) {
            const char *wr = W + (size_t)nn * K * esz;
            /* the next panel (rows nn + 8 .. nn + 15, contiguous) */
            size_t nb = nn + 2 * MM_TILE_ROWS <= n1 && pbytes <= MM_PREFETCH_PANEL ? pbytes : 0;
            if (pack) {
                mm_pack8(conv, wr, dtype, K);
                mm_panel8(j, 1, KVR_DT_F32, conv, K, nn, m0, m1, wr + pbytes, nb, tid);
            } else {
                mm_panel8(j, 0, dtype, wr, K, nn, m0, m1, wr + pbytes, nb, tid);
            }
        }
        struct mm_walk wk = mm_walk_init(nn, n1, 0);
        int32_t n, rs;
        int R;
        while ((R = mm_walk_next(&wk, &n, &rs)) != 0) {
            const char *wr = W + (size_t)n * K * esz;
            if (widen) {
                for (int r = 0; r < R; r++)
                    mm_widen(conv + (size_t)r * K, wr + (size_t)r * K * esz, dtype, K);
                mm_panel(j, KVR_DT_F32, conv, K, R, n, rs, m0, m1);
            } else {
                mm_panel(j, dtype, wr, K, R, n, rs, m0, m1);
            }
        }
    }
}

/* A decode step of at most MM_ONEPASS_ROWS rows on x86-64-v4: one pass
 * over each weight row for all the x rows, 2 weight rows (the halves of the
 * thread's rows, mm_walk) x C x rows a tile, and a software prefetch
 * MM_PF_BYTES ahead in both streams.  The quarters' 4 x 4 tile took two
 * passes over each panel at batch 8, the second from L1 with no load in
 * flight: the step was the DRAM time plus the arithmetic (f32 lm head,
 * M = 8, N = 32000, K = 768 on one thread: 55-68 GFLOP/s, 14-17 GB/s; 4 x 4
 * with the prefetch 63-77).  One pass alone did no better (3 x 8: 50-60):
 * the hardware prefetcher does not run far enough ahead of a stream that
 * the arithmetic slows.  One pass with the prefetch keeps the loads in
 * flight under the arithmetic: 110-130 GFLOP/s, 27-33 GB/s (2 x 8 and
 * 3 x 8 alike).  In the model (decode, one thread, against the quarters):
 * f32 batch 8 1.22x, bf16 1.36x, f16 1.33x, f32 batch 4 1.41x; batch 1
 * f32 1.14x, f16 1.41x, bf16 1.14x.  Prefetch distance at batch 1 / 8:
 * 2 KB 82 / 322 tok/s, 4 KB 83 / 358, 6 KB 78 / 355, 8 KB 77 / 329.  From
 * 12 rows a one-pass tile spills (2 x 16) or gains nothing (2 x 12 in the
 * model: 368 against 371 tok/s).  So a step of 9..MM_ONEPASS_MAX rows
 * takes each pair of weight rows in two one-pass tiles of at most
 * MM_ONEPASS_ROWS x rows (10 rows: 5 + 5), the second reading the pair
 * from L1; above that the prefill tiles (mm_rows8()) are faster.  Against
 * the quarters, which widen 16-bit weights above MM_WIDEN_ROWS: bf16 batch
 * 9 1.70x, f32 batch 10 1.22x.  One-pass chunks / tiles, tok/CPU-s, best
 * of 3: f32 batch 9 451 / 412, 10 459 / 410, 12 427 / 436, 16 431 / 523;
 * bf16 batch 9 563 / 560, 10 592 / 558, 12 572 / 631, 16 534 / 662.
 * bf16dot (mm_task_dp()) keeps one-pass chunks to MM_ONEPASS_MAX_DP, then
 * its 8-row panels: batch 10 796 / 607, 12 789 / 706, 16 725 / 777.
 * Each output is still micro()'s dot product (16 lanes over K in order, the
 * same zero-padded tail, hsum()): the bits do not change.  A prefetch past
 * the end of the weights is harmless: a prefetch never faults. */
#define MM_ONEPASS_ROWS   8
#define MM_ONEPASS_MAX    10
#define MM_ONEPASS_MAX_DP 12
/* TILE(C) with C = M (1..MM_ONEPASS_ROWS) as a constant, so that each
 * one-pass tile is compiled for its row count. */
#define MM_ONEPASS_CASES(M, TILE)                                                                  \
    do {                                                                                           \
        switch (M) {                                                                               \
        case 1:                                                                                    \
            TILE(1);                                                                               \
            break;                                                                                 \
        case 2:                                                                                    \
            TILE(2);                                                                               \
            break;                                                                                 \
        case 3:                                                                                    \
            TILE(3);                                                                               \
            break;                                                                                 \
        case 4:                                                                                    \
            TILE(4);                                                                               \
            break;                                                                                 \
        case 5:                                                                                    \
            TILE(5);                                                                               \
            break;                                                                                 \
        case 6:                                                                                    \
            TILE(6);                                                                               \
            break;                                                                                 \
        case 7:                                                                                    \
            TILE(7);                                                                               \
            break;                                                                                 \
        default:                                                                                   \
            TILE(8);                                                                               \
            break;                                                                                 \
        }                                                                                          \
    } while (0)
#define MM_PF_BYTES 4096

__attribute__((target("arch=x86-64-v4"))) static inline __attribute__((always_inline)) void
micro2(const int C, int32_t dtype, const void *w, size_t ldw, const float *x, size_t ldx_, size_t K,
       float *out)
{
    v16f acc[2][MM_ONEPASS_ROWS];
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = (v16f){0};
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    const char *w0 = w, *w1 = (const char *)w + ldw * esz;
    size_t k = 0;
    for (; k + 16 <= K; k += 16) {
        v16f a = ld16x(w0, dtype, k), b = ld16x(w1, dtype, k);
        __asm__("" : "+v"(a), "+v"(b));
        if (esz == 4 || (k & 16) == 0) { /* one prefetch a line */
            __builtin_prefetch(w0 + k * esz + MM_PF_BYTES, 0, 3);
            __builtin_prefetch(w1 + k * esz + MM_PF_BYTES, 0, 3);
        }
        for (int c = 0; c < C; c++) {
            v16f xv = ldx(x + (size_t)c * ldx_ + k);
            __asm__("" : "+v"(xv));
            acc[0][c] += a * xv;
            acc[1][c] += b * xv;
        }
    }
    if (k < K) { /* the tail, zero-padded to one more vector step, as micro() */
        v16f a = ldwpad(w0, dtype, k, K - k), b = ldwpad(w1, dtype, k, K - k);
        for (int c = 0; c < C; c++) {
            v16f xv = ldpad(x + (size_t)c * ldx_ + k, (int32_t)(K - k));
            acc[0][c] += a * xv;
            acc[1][c] += b * xv;
        }
    }
    for (int c = 0; c < C; c++)
        for (int r = 0; r < 2; r++)
            out[c * 4 + r] = hsum(acc[r][c]);
}

/* Weight rows n0..n1 of y for M (1..MM_ONEPASS_MAX) rows: the 2-row
 * panels of the halves walk by micro2(), for the x rows in even chunks of
 * at most MM_ONEPASS_ROWS; an odd last row by mm_panel(). */
__attribute__((target("arch=x86-64-v4"))) static inline __attribute__((always_inline)) void
mm_rows2(const struct mm_job *j, int32_t dtype, int32_t n0, int32_t n1, int tid)
{
    (void)tid; /* the signature of the other walks, for MM_TASK_ROWS */
    const size_t K = (size_t)j->w->cols;
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    const char *W = j->w->data;
    float tmp[4 * MM_ONEPASS_ROWS];
    struct mm_walk wk = mm_walk_init(n0, n1, 2);
    int32_t n, rs;
    int R;
    while ((R = mm_walk_next(&wk, &n, &rs)) != 0) {
        const char *wr = W + (size_t)n * K * esz;
        if (R == 1) {
            mm_panel(j, dtype, wr, K, 1, n, 1, 0, j->M);
            continue;
        }
        const size_t ldw = K * (size_t)rs;
        const int32_t nc = (j->M + MM_ONEPASS_ROWS - 1) / MM_ONEPASS_ROWS;
        const int32_t cw = (j->M + nc - 1) / nc;
        for (int32_t m0 = 0; m0 < j->M; m0 += cw) {
            int32_t C = j->M - m0 < cw ? j->M - m0 : cw;
            const float *xr = j->x + (size_t)m0 * K;
#define TILE2(C_) micro2(C_, dtype, wr, ldw, xr, K, K, tmp)
            MM_ONEPASS_CASES(C, TILE2);
#undef TILE2
            mm_store(j, tmp, 2, C, m0, n, rs);
        }
    }
}

__attribute__((target("arch=x86-64-v4"), noinline)) static void
mm_task_v4_onepass(const struct mm_job *j, int ith)
{
    MM_TASK_ROWS(j, ith, 0, mm_rows2, DT_F16_V4);
}

/* mm_task_v4's rows for M > MM_ONEPASS_MAX; not inlined, nor is the
 * one-pass path: each keeps its own registers (the tiles inlined beside
 * the decode walk read 0.93-0.97x at f32 decode batch 8). */
__attribute__((target("arch=x86-64-v4"), noinline)) static void
mm_task_v4_tiles(const struct mm_job *j, int ith, int tid)
{
    MM_TASK_ROWS(j, ith, tid, mm_rows8, DT_F16_V4);
}

__attribute__((target("arch=x86-64-v4"))) static void mm_task_v4(void *arg, int ith, int nth,
                                                                 int tid)
{
    const struct mm_job *j = arg;
    if (j->M > MM_ONEPASS_MAX)
        mm_task_v4_tiles(j, ith, tid);
    else
        mm_task_v4_onepass(j, ith);
}
#endif

static void mm_task_base(void *arg, int ith, int nth, int tid)
{
    mm_task_body(arg, ith, tid, KVR_DT_F16);
}

/* The kernel version for this CPU: 4 (x86-64-v4), 3 (x86-64-v3) or 0 (the
 * baseline).  KVR_CPU_MATMUL=v3|base (a test knob: the versions must agree
 * bit for bit) takes a lower version than the CPU's best. */
#if defined(__OPTIMIZE__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
static int cpu_version(void)
{
    const char *want = getenv("KVR_CPU_MATMUL");
    if (want && strcmp(want, "base") == 0)
        return 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4") && !(want && strcmp(want, "v3") == 0))
        return 4;
    if (__builtin_cpu_supports("x86-64-v3"))
        return 3;
    return 0;
}

#include <immintrin.h>

/* ------------------------------------------------------------ matmul, x86-64-v3 */

/* The matmul of AVX2+FMA CPUs (x86-64-v3) on 8-lane ymm registers.  Under
 * AVX2 each of micro()'s 16-lane vectors is two ymm, so its 4 x 4 tile
 * wants 32 accumulator registers of the 16 there are, and each f16 load
 * joins two vcvtph2ps halves through the stack (that kernel ran f16 decode
 * 3.1-3.3x slower than v4).  Here each output keeps micro()'s 16 lanes as
 * two ymm accumulators, lanes 0-7 and 8-15, each lane the same FMA chain
 * over k as micro()'s (the K tail zero-padded to a whole 16-lane step,
 * both halves), joined by hsum()'s adds (lane i + lane i+8, then the 4-lane
 * tree): micro()'s bits.  The tiles fit the 16 registers: 4 weight rows x 1
 * x row (8 accumulators; decode) and 4 x 3 a half at a time (12; several
 * x rows, micro_v3h()); f16 is widened by vcvtph2ps straight from memory,
 * bf16 by a shift. */
#define V3_INLINE __attribute__((target("arch=x86-64-v3"), always_inline)) static inline

/* 8 lanes of a weight row (dtype) from element k, widened to f32 (exact) */
V3_INLINE __m256 v3_ld8(const void *w, int32_t dtype, size_t k)
{
    if (dtype == KVR_DT_F32)
        return _mm256_loadu_ps((const float *)w + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + k));
    if (dtype == KVR_DT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* hsum() of 4 outputs, each given as its lanes 0-7 + lanes 8-15 (hsum()'s
 * first add): then lane i + lane i+4, then (c0 + c2) + (c1 + c3); output
 * i in lane i. */
V3_INLINE __m128 v3_hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m128 f0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    __m128 f1 = _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1));
    __m128 f2 = _mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1));
    __m128 f3 = _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1));
    /* [f0[0] + f0[2], f0[1] + f0[3], f1[0] + f1[2], f1[1] + f1[3]] */
    __m128 p = _mm_add_ps(_mm_shuffle_ps(f0, f1, 0x44), _mm_shuffle_ps(f0, f1, 0xee));
    __m128 q = _mm_add_ps(_mm_shuffle_ps(f2, f3, 0x44), _mm_shuffle_ps(f2, f3, 0xee));
    return _mm_add_ps(_mm_shuffle_ps(p, q, 0x88), _mm_shuffle_ps(p, q, 0xdd));
}

/* micro_v3()'s end, from its accumulators acc and step k: the K tail
 * (zero-padded to one more 16-lane step), then the sums. */
V3_INLINE void v3_finish(const int R, const int C, int32_t dtype, const void *w, size_t ldw,
                         const float *x, size_t ldx_, size_t K, size_t k, __m256 acc[2][4][3],
                         float *out, size_t ldo)
{
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    if (k < K) {
        __m256 wv[2][4];
        for (int r = 0; r < R; r++) {
            uint16_t hb[16] = {0};
            float fb[16] = {0};
            void *b = dtype == KVR_DT_F32 ? (void *)fb : (void *)hb;
            memcpy(b, (const char *)w + (size_t)r * ldw * esz + k * esz, (K - k) * esz);
            wv[0][r] = v3_ld8(b, dtype, 0);
            wv[1][r] = v3_ld8(b, dtype, 8);
        }
        for (int c = 0; c < C; c++) {
            float fb[16] = {0};
            memcpy(fb, x + (size_t)c * ldx_ + k, (K - k) * 4);
            for (int h = 0; h < 2; h++) {
                __m256 xv = _mm256_loadu_ps(fb + 8 * h);
                for (int r = 0; r < R; r++)
                    acc[h][r][c] = _mm256_fmadd_ps(wv[h][r], xv, acc[h][r][c]);
            }
        }
    }
    for (int c = 0; c < C; c++) {
        __m256 s[4];
        for (int r = 0; r < R; r++)
            s[r] = _mm256_add_ps(acc[0][r][c], acc[1][r][c]);
        __m128 o = v3_hsum4(s[0], s[R > 1 ? 1 : 0], s[R > 2 ? 2 : 0], s[R > 3 ? 3 : 0]);
        if (R == 4) {
            _mm_storeu_ps(out + (size_t)c * ldo, o);
        } else {
            float t[4];
            _mm_storeu_ps(t, o);
            for (int r = 0; r < R; r++)
                out[(size_t)c * ldo + (size_t)r] = t[r];
        }
    }
}

/* micro() on ymm halves: R (1, 2 or 4) weight rows x C (1..3) x rows,
 * R * C <= 6, out[c * ldo + r]. */
V3_INLINE void micro_v3(const int R, const int C, int32_t dtype, const void *w, size_t ldw,
                        const float *x, size_t ldx_, size_t K, float *out, size_t ldo)
{
    __m256 acc[2][4][3]; /* [half][r][c] */
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                acc[h][r][c] = _mm256_setzero_ps();
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    size_t k = 0;
    for (; k + 16 <= K; k += 16) {
        for (int h = 0; h < 2; h++) {
            __m256 wv[4];
            for (int r = 0; r < R; r++)
                wv[r] = v3_ld8((const char *)w + (size_t)r * ldw * esz, dtype, k + 8 * (size_t)h);
            for (int c = 0; c < C; c++) {
                __m256 xv = _mm256_loadu_ps(x + (size_t)c * ldx_ + k + 8 * (size_t)h);
                for (int r = 0; r < R; r++)
                    acc[h][r][c] = _mm256_fmadd_ps(wv[r], xv, acc[h][r][c]);
            }
        }
    }
    v3_finish(R, C, dtype, w, ldw, x, ldx_, K, k, acc, out, ldo);
}

/* micro_v3() for 4 weight rows x C (2..3) x rows, with the two halves of
 * each output taken one after the other over blocks of V3_KBLOCK elements
 * of K (each lane's FMA chain is its own, so the order in which the
 * chains advance changes no bit): 12 accumulators of one half, 3 x vectors
 * and 1 weight vector fill the 16 ymm registers, 7 loads for 12 FMAs where
 * both halves at once (24 accumulators) would not fit; the block's 7 rows
 * stay in L1 for the second half. */
#define V3_KBLOCK 256

V3_INLINE void micro_v3h(const int C, int32_t dtype, const void *w, size_t ldw, const float *x,
                         size_t ldx_, size_t K, float *out)
{
    __m256 acc[2][4][3]; /* [half][r][c] */
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 3; c++)
                acc[h][r][c] = _mm256_setzero_ps();
    const size_t esz = dtype == KVR_DT_F32 ? 4 : 2;
    const size_t kf = K & ~(size_t)15;
    for (size_t k0 = 0; k0 < kf; k0 += V3_KBLOCK) {
        const size_t k1 = kf - k0 < V3_KBLOCK ? kf : k0 + V3_KBLOCK;
        for (int h = 0; h < 2; h++) {
            __m256 a[4][3];
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < C; c++)
                    a[r][c] = acc[h][r][c];
            for (size_t k = k0 + 8 * (size_t)h; k < k1; k += 16) {
                __m256 xv[3];
                for (int c = 0; c < C; c++)
                    xv[c] = _mm256_loadu_ps(x + (size_t)c * ldx_ + k);
                for (int r = 0; r < 4; r++) {
                    __m256 wv = v3_ld8((const char *)w + (size_t)r * ldw * esz, dtype, k);
                    for (int c = 0; c < C; c++)
                        a[r][c] = _mm256_fmadd_ps(wv, xv[c], a[r][c]);
                }
            }
            for (int r = 0; r < 4; r++)
                for (int c = 0; c < C; c++)
                    acc[h][r][c] = a[r][c];
        }
    }
    v3_finish(4, C, dtype, w, ldw, x, ldx_, K, kf, acc, out, 4);
}

/* mm_panel() on v3 tiles: one x row against the panel's 4 weight rows
 * (micro_v3()), or 2-3 x rows against them a half at a time
 * (micro_v3h()); the panel's tail rows one at a time. */
V3_INLINE void mm_panel_v3(const struct mm_job *j, int32_t dtype, const void *wp, size_t ldw, int R,
                           int32_t n, int32_t rs, int32_t m0, int32_t m1)
{
    const size_t K = (size_t)j->w->cols;
    float tmp[4 * 4];
    for (int32_t m = m0; m < m1; m += 3) {
        int C = m1 - m < 3 ? m1 - m : 3;
        const float *xr = j->x + (size_t)m * K;
        if (R == 4 && C == 1) {
            micro_v3(4, 1, dtype, wp, ldw, xr, K, K, tmp, 4);
        } else if (R == 4) {
            if (C == 3)
                micro_v3h(3, dtype, wp, ldw, xr, K, K, tmp);
            else
                micro_v3h(2, dtype, wp, ldw, xr, K, K, tmp);
        } else if (C == 3) {
            micro_v3(1, 3, dtype, wp, ldw, xr, K, K, tmp, 4);
        } else if (C == 2) {
            micro_v3(1, 2, dtype, wp, ldw, xr, K, K, tmp, 4);
        } else {
            micro_v3(1, 1, dtype, wp, ldw, xr, K, K, tmp, 4);
        }
        mm_store(j, tmp, R, C, m, n, rs);
    }
}

/* mm_widen() on ymm registers. */
V3_INLINE void mm_widen_v3(float *dst, const void *src, int32_t dtype, size_t K)
{
    size_t i = 0;
    for (; i + 8 <= K; i += 8)
        _mm256_storeu_ps(dst + i, v3_ld8(src, dtype, i));
    for (; i < K; i++)
        dst[i] = ld1(src, dtype, i);
}

/* mm_rows() on v3 tiles: the same x blocks, panel walk and widening. */
MM_ROWS_FN(V3_INLINE, mm_rows_v3, mm_widen_v3, mm_panel_v3)

__attribute__((target("arch=x86-64-v3"))) static void mm_task_v3(void *arg, int ith, int nth,
                                                                 int tid)
{
    (void)nth;
    const struct mm_job *j = arg;
    MM_TASK_ROWS(j, ith, tid, mm_rows_v3, KVR_DT_F16);
}
#endif

/* ------------------------------------------------------------ bf16dot */

/* numerics bf16dot (KVR_NUMERICS_BF16DOT), bf16 weights only: x rounded to
 * bf16 (vcvtne2ps2bf16: to nearest even), then each output is one dot
 * product of vdpbf16ps steps, 32 products a step (pairs of lanes into 16
 * f32 lanes), over K in order (the K tail: weights loaded under a mask,
 * x zero-padded in its scratch), then hsum()'s tree, + bias.  As batch
 * invariant as the f32 kernel (an element's rounding and a dot product's
 * order depend on nothing but the row), with other bits: a node in this
 * mode and one in f32 give different logits, and a CPU without AVX512-BF16
 * cannot compute it (cpu_create refuses the mode there).  Twice the
 * products per instruction of widening to f32 FMAs, and no widening. */
#if defined(__OPTIMIZE__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define DP_TARGET __attribute__((target("arch=x86-64-v4,avx512bf16")))

struct dp_round_job {
    uint16_t *out; /* [M][ld] */
    size_t ld;
    const float *x; /* [M][K] */
    int32_t M;
    size_t K;
};

DP_TARGET static void dp_round_task(void *arg, int ith, int nth, int tid)
{
    const struct dp_round_job *j = arg;
    for (int32_t m = ith; m < j->M; m += nth) {
        const float *xr = j->x + (size_t)m * j->K;
        uint16_t *o = j->out + (size_t)m * j->ld;
        for (size_t k = 0; k < j->ld; k += 32) {
            size_t n0 = k < j->K ? j->K - k : 0, n1 = k + 16 < j->K ? j->K - k - 16 : 0;
            __mmask16 m0 = n0 >= 16 ? 0xffff : (__mmask16)((1u << n0) - 1);
            __mmask16 m1 = n1 >= 16 ? 0xffff : (__mmask16)((1u << n1) - 1);
            __m512 lo = _mm512_maskz_loadu_ps(m0, xr + k);
            __m512 hi = _mm512_maskz_loadu_ps(m1, xr + k + 16);
            _mm512_storeu_si512(o + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
    }
}

/* micro() for bf16dot: R weight rows (bf16, stride ldw elements) x C rows
 * of rounded x (stride ldx_), 16-lane vdpbf16ps accumulators over K. */
DP_TARGET static inline __attribute__((always_inline)) void
micro_dp(const int R, const int C, const uint16_t *w, size_t ldw, const uint16_t *x, size_t ldx_,
         size_t K, float *out, size_t ldo)
{
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    size_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512bh wv[4], xv[4];
        for (int r = 0; r < R; r++)
            wv[r] = (__m512bh)_mm512_loadu_si512(w + (size_t)r * ldw + k);
        for (int c = 0; c < C; c++)
            xv[c] = (__m512bh)_mm512_loadu_si512(x + (size_t)c * ldx_ + k);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv[r], xv[c]);
    }
    if (k < K) { /* weights under a mask (never past the row), x zero-padded */
        __mmask32 mk = (__mmask32)((1ull << (K - k)) - 1);
        __m512bh wv[4], xv[4];
        for (int r = 0; r < R; r++)
            wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mk, w + (size_t)r * ldw + k);
        for (int c = 0; c < C; c++)
            xv[c] = (__m512bh)_mm512_loadu_si512(x + (size_t)c * ldx_ + k);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv[r], xv[c]);
    }
    if (R == 4 && C == 4 && ldo == 4) {
        v16f a16[16];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++)
                a16[c * 4 + r] = (v16f)acc[r][c];
        v16f sums = hsum16(a16);
        memcpy(out, &sums, 64);
        return;
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            out[(size_t)c * ldo + (size_t)r] = hsum((v16f)acc[r][c]);
}

/* micro_dp() for a prefill tile of 8 weight rows x C (1..3) x rows: each
 * output is the same single accumulator of vdpbf16ps steps over K in
 * order (and the same masked tail), then hsum16() (hsum()'s adds), so the
 * bits are micro_dp()'s; 24 accumulators in registers, so that each x
 * vector (streamed from L2) serves 8 weight rows instead of 4: half the L2
 * reads a product.  out[c * 8 + r]. */
DP_TARGET static inline __attribute__((always_inline)) void
micro_dp8(const int C, const uint16_t *w, size_t ldw, const uint16_t *x, size_t ldx_, size_t K,
          float *out)
{
    __m512 acc[8][3];
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++)
            acc[r][c] = _mm512_setzero_ps();
    size_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512bh xv[3];
        for (int c = 0; c < C; c++)
            xv[c] = (__m512bh)_mm512_loadu_si512(x + (size_t)c * ldx_ + k);
        for (int r = 0; r < 8; r++) {
            __m512bh wv = (__m512bh)_mm512_loadu_si512(w + (size_t)r * ldw + k);
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv, xv[c]);
        }
    }
    if (k < K) { /* weights under a mask (never past the row), x zero-padded */
        __mmask32 mk = (__mmask32)((1ull << (K - k)) - 1);
        __m512bh xv[3];
        for (int c = 0; c < C; c++)
            xv[c] = (__m512bh)_mm512_loadu_si512(x + (size_t)c * ldx_ + k);
        for (int r = 0; r < 8; r++) {
            __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mk, w + (size_t)r * ldw + k);
            for (int c = 0; c < C; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv, xv[c]);
        }
    }
    v16f a32[32];
    for (int i = 0; i < 32; i++)
        a32[i] = (v16f){0};
    for (int c = 0; c < C; c++)
        for (int r = 0; r < 8; r++)
            a32[c * 8 + r] = (v16f)acc[r][c];
    v16f s0 = hsum16(a32), s1 = hsum16(a32 + 16);
    memcpy(out, &s0, 64);
    memcpy(out + 16, &s1, 64);
}

/* Weight rows n..n+7 (adjacent) of y for x rows m0..m1, in 8 x 3 tiles. */
DP_TARGET static inline __attribute__((always_inline)) void
mm_panel_dp8(const struct mm_job *j, const uint16_t *wp, int32_t n, int32_t m0, int32_t m1)
{
    const size_t K = (size_t)j->w->cols, ld = j->c->xbf_ld;
    float out[32];
    for (int32_t m = m0; m < m1; m += 3) {
        int C = m1 - m < 3 ? m1 - m : 3;
        const uint16_t *xr = j->c->xbf + (size_t)m * ld;
        if (C == 3)
            micro_dp8(3, wp, K, xr, ld, K, out);
        else if (C == 2)
            micro_dp8(2, wp, K, xr, ld, K, out);
        else
            micro_dp8(1, wp, K, xr, ld, K, out);
        mm_store8(j, out, C, m, n);
    }
}

/* mm_panel() for bf16dot */
DP_TARGET static inline __attribute__((always_inline)) void mm_panel_dp(const struct mm_job *j,
                                                                        const uint16_t *wp, int R,
                                                                        int32_t n, int32_t rs,
                                                                        int32_t m0, int32_t m1)
{
    const size_t K = (size_t)j->w->cols, ld = j->c->xbf_ld;
    float tmp[4 * 4];
    for (int32_t m = m0; m < m1; m += 4) {
        int C = m1 - m < 4 ? m1 - m : 4;
        const uint16_t *xr = j->c->xbf + (size_t)m * ld;
#define MICRO(r, c) micro_dp(r, c, wp, K *(size_t)rs, xr, ld, K, tmp, 4)
        MICRO_SHAPES(R, C);
#undef MICRO
        mm_store(j, tmp, R, C, m, n, rs);
    }
}

/* micro2() for bf16dot: weight rows w and w + ldw (bf16) x C (1..
 * MM_ONEPASS_ROWS) rounded x rows in one pass, each weight stream
 * prefetched MM_PF_BYTES ahead (a step reads one line of each row), out
 * [c * 4 + r].  Each output is micro_dp()'s: one accumulator of vdpbf16ps
 * steps over K in order, the same masked tail, hsum(); the same bits. */
DP_TARGET static inline __attribute__((always_inline)) void
micro_dp2(const int C, const uint16_t *w, size_t ldw, const uint16_t *x, size_t ldx_, size_t K,
          float *out)
{
    __m512 acc[2][MM_ONEPASS_ROWS];
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    const uint16_t *w0 = w, *w1 = w + ldw;
    size_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512bh a = (__m512bh)_mm512_loadu_si512(w0 + k);
        __m512bh b = (__m512bh)_mm512_loadu_si512(w1 + k);
        __builtin_prefetch((const char *)(w0 + k) + MM_PF_BYTES, 0, 3);
        __builtin_prefetch((const char *)(w1 + k) + MM_PF_BYTES, 0, 3);
        for (int c = 0; c < C; c++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (size_t)c * ldx_ + k);
            acc[0][c] = _mm512_dpbf16_ps(acc[0][c], a, xv);
            acc[1][c] = _mm512_dpbf16_ps(acc[1][c], b, xv);
        }
    }
    if (k < K) { /* weights under a mask (never past the row), x zero-padded */
        __mmask32 mk = (__mmask32)((1ull << (K - k)) - 1);
        __m512bh a = (__m512bh)_mm512_maskz_loadu_epi16(mk, w0 + k);
        __m512bh b = (__m512bh)_mm512_maskz_loadu_epi16(mk, w1 + k);
        for (int c = 0; c < C; c++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (size_t)c * ldx_ + k);
            acc[0][c] = _mm512_dpbf16_ps(acc[0][c], a, xv);
            acc[1][c] = _mm512_dpbf16_ps(acc[1][c], b, xv);
        }
    }
    for (int c = 0; c < C; c++)
        for (int r = 0; r < 2; r++)
            out[c * 4 + r] = hsum((v16f)acc[r][c]);
}

/* mm_rows2() for bf16dot: weight rows n0..n1 for M (1..MM_ONEPASS_MAX)
 * rows, 2-row panels of the halves walk in one pass (micro_dp2()) for x
 * rows in even chunks of at most MM_ONEPASS_ROWS, an odd last row by
 * mm_panel_dp(). */
DP_TARGET static inline __attribute__((always_inline)) void mm_rows_dp2(const struct mm_job *j,
                                                                        int32_t n0, int32_t n1)
{
    const size_t K = (size_t)j->w->cols, ld = j->c->xbf_ld;
    const uint16_t *W = j->w->data;
    float tmp[4 * MM_ONEPASS_ROWS];
    struct mm_walk wk = mm_walk_init(n0, n1, 2);
    int32_t n, rs;
    int R;
    while ((R = mm_walk_next(&wk, &n, &rs)) != 0) {
        const uint16_t *wr = W + (size_t)n * K;
        if (R == 1) {
            mm_panel_dp(j, wr, 1, n, 1, 0, j->M);
            continue;
        }
        const size_t ldw = K * (size_t)rs;
        const int32_t nc = (j->M + MM_ONEPASS_ROWS - 1) / MM_ONEPASS_ROWS;
        const int32_t cw = (j->M + nc - 1) / nc;
        for (int32_t m0 = 0; m0 < j->M; m0 += cw) {
            int32_t C = j->M - m0 < cw ? j->M - m0 : cw;
            const uint16_t *xr = j->c->xbf + (size_t)m0 * ld;
#define TILE2(C_) micro_dp2(C_, wr, ldw, xr, ld, K, tmp)
            MM_ONEPASS_CASES(C, TILE2);
#undef TILE2
            mm_store(j, tmp, 2, C, m0, n, rs);
        }
    }
}

/* mm_rows() for bf16dot: the same x blocks (of bf16 rows) and decode
 * walk (steps of up to MM_ONEPASS_MAX rows: mm_rows_dp2()); prefill takes the rows in 8-row panels
 * (micro_dp8) while 8 are left, then as mm_rows() does; the weights are read as they are, never
 * widened.  (The same 8 x 3 tile for the f32 kernel, micro() on widened or
 * f32 rows, was slower: 0.81-0.89x at f32/bf16 prefill-128 and f16
 * prefill-1024.) */
DP_TARGET static void mm_task_dp(void *arg, int ith, int nth, int tid)
{
    const struct mm_job *j = arg;
    const int32_t N = j->w->rows;
    const int32_t n0 = ith * j->per, n1 = n0 + j->per < N ? n0 + j->per : N;
    const size_t K = (size_t)j->w->cols;
    const uint16_t *W = j->w->data;
    if (j->M <= MM_ONEPASS_MAX_DP) {
        if (n0 < n1)
            mm_rows_dp2(j, n0, n1);
        return;
    }
    int32_t mb = (int32_t)(MM_XBLOCK / (j->c->xbf_ld * 2)) & ~3;
    if (mb < 4)
        mb = 4;
    for (int32_t m0 = 0; m0 < j->M; m0 += mb) {
        int32_t m1 = j->M - m0 < mb ? j->M : m0 + mb;
        int32_t nn = n0;
        if (j->M > MM_ONEPASS_MAX_DP) /* 8-row panels, then the walk */
            for (; nn + 8 <= n1; nn += 8)
                mm_panel_dp8(j, W + (size_t)nn * K, nn, m0, m1);
        struct mm_walk wk = mm_walk_init(nn, n1, j->M <= MM_DECODE_ROWS ? 4 : 0);
        int32_t n, rs;
        int R;
        while ((R = mm_walk_next(&wk, &n, &rs)) != 0) {
            mm_panel_dp(j, W + (size_t)n * K, R, n, rs, m0, m1);
        }
    }
}
#endif

/* Threads split W's rows (multiples of 4), never K: batch-invariant at
 * every M, so there is one kernel for decode and prefill alike. */
static void cpu_matmul(struct kvr_compute_backend *be, float *y, const float *x, int32_t M,
                       const struct kvr_weight *w, const float *bias, unsigned flags)
{
    struct cpu_backend *c = cpu(be);
    const int32_t N = w->rows;
    struct mm_job j = {c, y, x, M, w, bias, (flags & KVR_MM_ACCUMULATE) != 0, 0};
    int n_chunks = chunks_for(c, (double)M * N * w->cols, N / 16);
    j.per = ((N + n_chunks - 1) / n_chunks + 3) & ~3;
#if defined(__OPTIMIZE__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (c->numerics == KVR_NUMERICS_BF16DOT && w->dtype == KVR_DT_BF16) {
        struct dp_round_job rj = {c->xbf, c->xbf_ld, x, M, (size_t)w->cols};
        kvr_tp_run(c->tp, dp_round_task, &rj, chunks_for(c, (double)M * w->cols * 4, M));
        kvr_tp_run(c->tp, mm_task_dp, &j, (N + j.per - 1) / j.per);
        return;
    }
#endif
    kvr_tp_run(c->tp, c->mm_task, &j, (N + j.per - 1) / j.per);
}

/* Widens n elements of src (dtype) into out. */
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
        /* the sum of squares in 16 lanes over i in order, the tail
         * zero-padded, then hsum()'s tree (one sequential sum was a
         * dependent add an element: 1.7 % of a 1024-token prefill) */
        v16f acc = (v16f){0};
        int32_t k;
        for (k = 0; k < j->dim; k += 16) {
            v16f v = ldpad(xr + k, j->dim - k);
            acc += v * v;
        }
        float ss = hsum(acc);
        float s = 1.0f / sqrtf(ss / (float)j->dim + j->eps);
        /* (x s) w element by element, 16 at a time (a scalar loop: GCC
         * reloaded j->dim and j->w after every store to y) */
        const float *w = j->w;
        for (k = 0; k + 16 <= j->dim; k += 16) {
            v16f v = ldx(xr + k) * s * ldx(w + k);
            memcpy(yr + k, &v, 64);
        }
        for (; k < j->dim; k++)
            yr[k] = xr[k] * s * w[k];
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

/* f32 -> bf16, rounded to nearest even; a NaN stays a (quiet) NaN. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* f32 -> f16, rounded to nearest even (the C conversion: vcvtps2ph or
 * libgcc's, the same bits); beyond 65504 -> inf. */
static inline uint16_t f32_to_f16(float f)
{
    f16_t h = (f16_t)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* n floats of src into dst as dtype elements */
static void kv_put(void *dst, const float *src, size_t n, int32_t dtype)
{
    if (dtype == KVR_KV_F32) {
        memcpy(dst, src, n * 4);
    } else if (dtype == KVR_KV_BF16) {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = f32_to_bf16(src[i]);
    } else {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = f32_to_f16(src[i]);
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
            size_t off = ((size_t)r * (size_t)l->n_kv_heads + (size_t)h) * hd;
            kv_put(kvr_kv_ptr(l, a->layer_base, blk, 0, h, slot), k + off, hd, l->dtype);
            kv_put(kvr_kv_ptr(l, a->layer_base, blk, 1, h, slot), v + off, hd, l->dtype);
        }
    }
}

/* Attention.  Rows go in groups of up to ATTN_RW consecutive positions of
 * one sequence (a prefill chunk; a decode step's rows are groups of one).
 * A task is a group and one head, or for a group of fewer than ATTN_RQ
 * rows the group and up to ATTN_RQ / rows query heads of one KV head (a
 * decode row: all the heads of its KV head, up to 4), which read the KV
 * head's keys and values once between them (at batch 32, one query head
 * at a time read them three times and attention was a third of the step).
 * A task of more than ATTN_RQ rows is one wide unit (attn_wide(): the
 * x86-64-v4 version, head_dim 64 or 128) or units of up to ATTN_RQ rows
 * (attn_unit()).
 * Each (row, head) is computed exactly as alone: its score with key t is
 * q.k (16 lanes over head_dim in order, the tail zero-padded, then
 * hsum()'s tree, done for 16 keys at once by hsum16(), or in a wide unit
 * as vertical adds with the rows in lanes) times scale; then
 * softmax_row() (the sum in 16 lanes over the row's keys, an order fixed
 * by its key count), and O = sum over keys in key order of (p_t / sum)
 * v_t, each lane one FMA chain from 0.  A unit only shares each key's
 * loads among its items (a K vector loaded once for their score chains, a
 * V vector once for their sums).  No split of the key range, so a row's
 * output is the same whatever the chunking, the batch or the cached
 * prefix. */
#define ATTN_RQ 4
#define ATTN_RW 16

/* How far ahead a decode unit prefetches its keys (attn_unit). */
#define ATTN_PF_AHEAD 32

struct attn_job {
    struct cpu_backend *c;
    const struct kvr_attn_args *a;
    const float *q;
    float *out;
    const int32_t *grp; /* [n_groups + 1] first row of each group */
    int32_t n_groups;
};

/* Elements i..i+15 of a K or V row p in dtype dt (a weight dtype or an f16
 * pseudo-dtype; enum kvr_kv_dtype has the same numbers), widened to f32, of
 * which n valid (zeros after). */
static inline __attribute__((always_inline)) v16f ldkv(const void *p, int32_t dt, int32_t i,
                                                       int32_t n)
{
    if (n >= 16)
        return ld16x(p, dt, (size_t)i);
    if (dt == KVR_DT_F32)
        return ldpad((const float *)p + i, n);
    uint16_t h[16] = {0};
    memcpy(h, (const uint16_t *)p + i, (size_t)n * 2);
    return ld16x(h, dt, 0);
}

/* The query heads a unit of group size gr takes together: up to ATTN_RQ
 * items (row, head) in all, never more than the heads sharing a KV head. */
static inline int32_t attn_hpu(int32_t gr, int32_t group)
{
    int32_t hpu = gr >= ATTN_RQ ? 1 : ATTN_RQ / gr;
    return hpu < group ? hpu : group;
}

/* Stores the scores v of keys t0 .. t0 + nk - 1 into an item's score row,
 * whose element 0 is key lo, keeping only keys lo .. hi: one vector store
 * when all 16 are the item's. */
static inline __attribute__((always_inline)) void sc_put(float *row, v16f v, int32_t t0, int32_t nk,
                                                         int32_t lo, int32_t hi)
{
    if (nk == 16 && t0 >= lo && t0 + 15 <= hi) {
        memcpy(row + (t0 - lo), &v, 64);
        return;
    }
    float sf[16];
    memcpy(sf, &v, 64);
    for (int32_t k = 0; k < nk; k++)
        if (t0 + k >= lo && t0 + k <= hi)
            row[t0 + k - lo] = sf[k];
}

/* A unit's items, row-major over rows r0.. and heads h0..: each one's key
 * range [lo, hi], scores row sc and output row o (its query row is q at
 * o's offset). */
static inline __attribute__((always_inline)) void attn_items(const struct attn_job *j, int tid,
                                                             int32_t r0, int32_t nrow, int32_t h0,
                                                             int32_t nh, int32_t *lo, int32_t *hi,
                                                             float **sc, float **o)
{
    const struct kvr_attn_args *a = j->a;
    const int32_t H = a->n_heads, hd = a->layout->head_dim;
    const size_t msl = (size_t)j->c->p.max_seq_len;
    for (int32_t r = 0; r < nrow * nh; r++) {
        int32_t row = r0 + r / nh, h = h0 + r % nh, p = a->pos[row];
        lo[r] = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        hi[r] = p;
        sc[r] = j->c->scores + ((size_t)tid * ATTN_RW + (size_t)r) * msl;
        o[r] = j->out + ((size_t)row * (size_t)H + (size_t)h) * (size_t)hd;
    }
}

/* O = P V for the g items (attn_items(); sc holds e_t, inv 1 / sum: p_t
 * is e_t inv, the product softmax_row() rounded once as it did), 4 vectors
 * of head_dim at a time held in registers; bt the rows' block table.
 * NI: g as a constant where the items share each value's loads (HDV and
 * 2..ATTN_RQ items), else 0. */
static inline __attribute__((always_inline)) void
attn_pv(const struct attn_job *j, const int H8, const int32_t dt, const int32_t HDV, const int NI,
        int32_t g, const int32_t *lo, const int32_t *hi, float *const *sc, const float *inv,
        float *const *o, const int32_t *bt, int32_t kvh)
{
    const struct kvr_attn_args *a = j->a;
    const struct kvr_kv_layout *l = a->layout;
    const int32_t hd = l->head_dim, bs = l->block_size;
    const int32_t hdv = HDV ? HDV : (hd + 15) / 16;
    /* the rows' positions rise with the item (heads of a row share its
     * range) */
    const int32_t t_lo = lo[0], t_hi = hi[g - 1];
    for (int32_t c0 = 0; c0 < hdv; c0 += 4) {
        int32_t nv = hdv - c0 < 4 ? hdv - c0 : 4;
        v16f acc[ATTN_RQ][4];
        for (int32_t r = 0; r < ATTN_RQ; r++)
            for (int c = 0; c < 4; c++)
                acc[r][c] = (v16f){0};
        /* keys every item attends to, [f_lo, f_hi], in registers for the
         * NI items (below); the others item by item.  Each acc[r][c] takes
         * the keys in order either way: the same bits. */
        int32_t f_lo = lo[g - 1], f_hi = hi[0];
        if (!(NI && f_lo <= f_hi))
            f_lo = t_hi + 1, f_hi = t_hi;
        /* (vb, vs): key t's block and slot, stepped on with t */
        int32_t vb = t_lo / bs, vs = t_lo % bs;
        for (int32_t t = t_lo; t <= t_hi; t++) {
            if (NI && t == f_lo) {
                v16f fa[ATTN_RQ][4];
                const int NV = HDV - c0 < 4 ? HDV - c0 : 4;
                for (int32_t r = 0; r < NI; r++)
                    for (int c = 0; c < NV; c++)
                        fa[r][c] = acc[r][c];
                for (; t <= f_hi; t++) {
                    const void *vv = kvr_kv_ptr(l, a->layer_base, bt[vb], 1, kvh, vs);
                    if (++vs == bs)
                        vs = 0, vb++;
                    v16f vc[4];
                    for (int c = 0; c < NV; c++)
                        vc[c] = ld16x(vv, dt, (size_t)(c0 + c) * 16);
                    for (int32_t r = 0; r < NI; r++) {
                        v16f pv = splat_mul(H8, sc[r][t - lo[r]], inv[r]);
                        for (int c = 0; c < NV; c++)
                            fa[r][c] += pv * vc[c];
                    }
                }
                for (int32_t r = 0; r < NI; r++)
                    for (int c = 0; c < NV; c++)
                        acc[r][c] = fa[r][c];
                if (t > t_hi)
                    break;
            }
            const void *vv = kvr_kv_ptr(l, a->layer_base, bt[vb], 1, kvh, vs);
            if (++vs == bs)
                vs = 0, vb++;
            v16f vc[4];
            for (int32_t c = 0; c < nv; c++)
                vc[c] = ldkv(vv, dt, (c0 + c) * 16, hd - (c0 + c) * 16);
            for (int32_t r = 0; r < g; r++) {
                if (t < lo[r] || t > hi[r])
                    continue;
                v16f pv = splat_mul(H8, sc[r][t - lo[r]], inv[r]);
                for (int32_t c = 0; c < nv; c++)
                    acc[r][c] += pv * vc[c];
            }
        }
        for (int32_t r = 0; r < g; r++)
            for (int32_t c = 0; c < nv; c++) {
                int32_t i = (c0 + c) * 16, n = hd - i < 16 ? hd - i : 16;
                memcpy(o[r] + i, &acc[r][c], (size_t)n * 4);
            }
    }
}

/* One unit: the ni = rows x heads items (row-major) of rows r0.. and heads
 * h0.. (all of KV head kvh, all of one sequence at consecutive positions).
 * NI: ni as a constant where the items share each key's loads (HDV and
 * 2..ATTN_RQ items), else 0 (each item its own loop).  H8: the x86-64-v3
 * version (hsum16_h()). */
static inline __attribute__((always_inline)) void
attn_unit(const struct attn_job *j, int tid, const int H8, const int32_t dt, const int32_t HDV,
          const int NI, int32_t r0, int32_t nrow, int32_t h0, int32_t nh, int32_t kvh)
{
    const struct kvr_attn_args *a = j->a;
    const struct kvr_kv_layout *l = a->layout;
    const int32_t hd = l->head_dim, bs = l->block_size;
    const int32_t hdv = HDV ? HDV : (hd + 15) / 16;
    float *qpad = j->c->qpad + (size_t)tid * ATTN_RW * (size_t)hdv * 16;
    const int32_t g = nrow * nh;
    const int32_t *bt = a->block_table[r0];
    int32_t lo[ATTN_RQ] = {0}, hi[ATTN_RQ] = {0};
    float *sc[ATTN_RQ];
    float *o[ATTN_RQ];
    attn_items(j, tid, r0, nrow, h0, nh, lo, hi, sc, o);
    for (int32_t r = 0; r < g; r++) {
        float *qp = qpad + (size_t)r * (size_t)hdv * 16;
        memset(qp, 0, (size_t)hdv * 64);
        memcpy(qp, j->q + (o[r] - j->out), (size_t)hd * 4);
    }
    /* the rows' positions rise with r (heads of a row share its range) */
    const int32_t t_lo = lo[0], t_hi = hi[g - 1];
    /* scores, 16 keys at a time; (kb, ks): key t0's block and slot,
     * stepped on without a division a key */
    int32_t kb = t_lo / bs, ks = t_lo % bs;
    /* A decode row's keys are one short run per block (a KV head's slots:
     * 4 KB in f32 at head_dim 64) in blocks a whole block apart, a stream
     * the hardware prefetcher learns anew in every block: the step's
     * attention ran at a quarter of the read rate (batch 32, 128 keys).
     * So a decode unit prefetches its keys ATTN_PF_AHEAD keys ahead into
     * L1, and each key's value row into L2 as its key is scored (read after
     * the softmax).  (pb, ps): key t0 + ATTN_PF_AHEAD's block and slot.
     * Prefetches only: the same arithmetic. */
    const bool pf = nrow == 1;
    const size_t row_bytes = (size_t)hd * kvr_kv_dtype_size(l->dtype);
    const size_t v_off = (size_t)l->n_kv_heads * (size_t)bs * row_bytes;
    int32_t pb = (t_lo + ATTN_PF_AHEAD) / bs, ps = (t_lo + ATTN_PF_AHEAD) % bs;
    for (int32_t t = t_lo; pf && t < t_lo + ATTN_PF_AHEAD && t <= t_hi; t++) {
        const char *p = kvr_kv_ptr(l, a->layer_base, bt[t / bs], 0, kvh, t % bs);
        for (size_t b = 0; b < row_bytes; b += 64)
            __builtin_prefetch(p + b, 0, 3);
    }
    for (int32_t t0 = t_lo; t0 <= t_hi; t0 += 16) {
        int32_t nk = t_hi - t0 + 1 < 16 ? t_hi - t0 + 1 : 16;
        const void *kp[16];
        for (int32_t k = 0; k < nk; k++) {
            kp[k] = kvr_kv_ptr(l, a->layer_base, bt[kb], 0, kvh, ks);
            if (++ks == bs)
                ks = 0, kb++;
        }
        if (pf) {
            for (int32_t k = 0; k < nk; k++)
                for (size_t b = 0; b < row_bytes; b += 64)
                    __builtin_prefetch((const char *)kp[k] + v_off + b, 0, 2);
            for (int32_t k = 0; k < 16 && t0 + ATTN_PF_AHEAD + k <= t_hi; k++) {
                const char *p = kvr_kv_ptr(l, a->layer_base, bt[pb], 0, kvh, ps);
                for (size_t b = 0; b < row_bytes; b += 64)
                    __builtin_prefetch(p + b, 0, 3);
                if (++ps == bs)
                    ps = 0, pb++;
            }
        }
        for (int32_t k = nk; k < 16; k++)
            kp[k] = kp[0];
        /* shared: each key's vectors loaded once for the NI items, each
         * (item, key) the same FMA chain over c as below */
        v16f A[ATTN_RQ][16];
        if (NI) {
            for (int k = 0; k < 16; k++) {
                v16f kv[8]; /* HDV <= 8 */
                for (int32_t c = 0; c < HDV; c++)
                    kv[c] = ld16x(kp[k], dt, (size_t)c * 16);
                for (int32_t r = 0; r < NI; r++) {
                    const float *qp = qpad + (size_t)r * (size_t)hdv * 16;
                    v16f s1 = (v16f){0};
                    for (int32_t c = 0; c < HDV; c++)
                        s1 += ldx(qp + c * 16) * kv[c];
                    A[r][k] = s1;
                }
            }
        }
        for (int32_t r = 0; r < g; r++) {
            if (t0 + nk - 1 < lo[r] || t0 > hi[r])
                continue;
            const float *qp = qpad + (size_t)r * (size_t)hdv * 16;
            v16f acc[16];
            if (NI) {
                for (int k = 0; k < 16; k++)
                    acc[k] = A[r][k];
            } else if (HDV) { /* q in registers, one key pointer live at a time:
                                 each acc[k] the same FMA chain over c */
                for (int k = 0; k < 16; k++)
                    acc[k] = (v16f){0};
                v16f qv[8]; /* HDV <= 8 */
                for (int32_t c = 0; c < HDV; c++)
                    qv[c] = ldx(qp + c * 16);
                for (int k = 0; k < 16; k++) {
                    const void *p = kp[k];
                    for (int32_t c = 0; c < HDV; c++)
                        acc[k] += qv[c] * ld16x(p, dt, (size_t)c * 16);
                }
            } else {
                for (int k = 0; k < 16; k++)
                    acc[k] = (v16f){0};
                for (int32_t c = 0; c < hdv; c++) {
                    v16f qc = ldx(qp + c * 16);
                    for (int k = 0; k < 16; k++)
                        acc[k] += qc * ldkv(kp[k], dt, c * 16, hd - c * 16);
                }
            }
            sc_put(sc[r], (H8 ? hsum16_h(acc) : hsum16(acc)) * a->scale, t0, nk, lo[r], hi[r]);
        }
    }
    /* softmax per item: sc becomes e_t, inv 1 / sum */
    float inv[ATTN_RQ];
    for (int32_t r = 0; r < g; r++)
        inv[r] = softmax_row(sc[r], (size_t)(hi[r] - lo[r] + 1));
    attn_pv(j, H8, dt, HDV, NI, g, lo, hi, sc, inv, o, bt, kvh);
}

/* 16 copies of *p, a broadcast GCC folds into an FMA's memory operand
 * (unlike splat_mul()'s, which attn_pv() needs in a register) */
static inline __attribute__((always_inline)) v16f bcast(const float *p)
{
    return __builtin_shuffle((v16f){*p}, (v16i){0});
}

/* m[i][k] <- m[k][i], 16 x 16: four rounds, round b swapping bit b of the
 * row with bit b of the lane. */
static inline __attribute__((always_inline)) void tr16(v16f *m)
{
    static const v16i lo[4] = {
        {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
        {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
        {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
        {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
    };
    static const v16i hi[4] = {
        {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31},
        {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
        {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
        {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
    };
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < 16; i++)
            if (!(i & 1 << b)) {
                v16f x = m[i], y = m[i + (1 << b)];
                m[i] = __builtin_shuffle(x, y, lo[b]);
                m[i + (1 << b)] = __builtin_shuffle(x, y, hi[b]);
            }
}

/* Keys at a time in attn_wide()'s score loop */
#define ATTN_KB 4

/* P[k] = lane `lane` of the 16-lane q.k sum of every row with key k, the
 * rows in lanes: the chain over c of q[16c + lane] k[16c + lane] from 0,
 * as attn_unit()'s lane `lane` computes it.  qt: the queries, element d
 * of every row at qt + 16 d; kr: ATTN_KB key rows in f32. */
static inline __attribute__((always_inline)) void wlane(const int32_t HDV, const float *qt,
                                                        const float *const *kr, int lane, v16f *P)
{
    for (int k = 0; k < ATTN_KB; k++)
        P[k] = (v16f){0};
    for (int32_t c = 0; c < HDV; c++) {
        v16f qv = ldx(qt + (size_t)(c * 16 + lane) * 16);
        for (int k = 0; k < ATTN_KB; k++)
            P[k] += qv * bcast(kr[k] + c * 16 + lane);
    }
}

/* hsum()'s tree over the lanes, vertically: level 1 adds lanes l and
 * l + 8, level 2 l and l + 4 (of l < 4 here: quad(l) = (l + l+8) +
 * (l+4 + l+12)), level 3 (0 + 2) + (1 + 3). */
static inline __attribute__((always_inline)) void wquad(const int32_t HDV, const float *qt,
                                                        const float *const *kr, int l, v16f *Q)
{
    v16f a[ATTN_KB], b[ATTN_KB], c[ATTN_KB], d[ATTN_KB];
    wlane(HDV, qt, kr, l, a);
    wlane(HDV, qt, kr, l + 8, b);
    wlane(HDV, qt, kr, l + 4, c);
    wlane(HDV, qt, kr, l + 12, d);
    for (int k = 0; k < ATTN_KB; k++)
        Q[k] = (a[k] + b[k]) + (c[k] + d[k]);
}

/* A wide unit (the x86-64-v4 version, head_dim 64 or 128): rows r0..r0+n-1
 * (5 <= n <= ATTN_RW, one sequence at consecutive positions) of head h.
 * The scores come with the rows in lanes: for ATTN_KB keys at a time,
 * each row's 16 lane sums (wlane()) meet in hsum()'s tree as vertical
 * adds (wquad()), so no horizontal sum, where attn_unit() spends a
 * shuffle network (hsum16()) on every 16 scores of every row; the same
 * FMAs and adds on the same values in the same order: the same bits.  A
 * 16 x 16 transpose (tr16()) then puts each row's 16 scores in a row of
 * sc, and softmax and P V are attn_unit()'s, 4 rows at a time. */
static inline __attribute__((always_inline)) void attn_wide(const struct attn_job *j, int tid,
                                                            const int32_t dt, const int32_t HDV,
                                                            int32_t r0, int32_t n, int32_t h,
                                                            int32_t kvh)
{
    const struct kvr_attn_args *a = j->a;
    const struct kvr_kv_layout *l = a->layout;
    const int32_t hd = l->head_dim, bs = l->block_size;
    const int32_t *bt = a->block_table[r0];
    int32_t lo[ATTN_RW], hi[ATTN_RW];
    float *sc[ATTN_RW], *o[ATTN_RW];
    attn_items(j, tid, r0, n, h, 1, lo, hi, sc, o);
    /* the queries transposed: element d of row i at qt[16 d + i], zeros
     * past n */
    float *qt = j->c->qpad + (size_t)tid * ATTN_RW * (size_t)HDV * 16;
    for (int32_t d = 0; d < hd; d++)
        for (int32_t i = 0; i < 16; i++)
            qt[d * 16 + i] = i < n ? j->q[o[i] - j->out + d] : 0.0f;
    const int32_t t_lo = lo[0], t_hi = hi[n - 1];
    /* (kb, ks): the next key's block and slot */
    int32_t kb = t_lo / bs, ks = t_lo % bs;
    for (int32_t t0 = t_lo; t0 <= t_hi; t0 += 16) {
        int32_t nk = t_hi - t0 + 1 < 16 ? t_hi - t0 + 1 : 16;
        v16f S[16];
        /* the block's key rows in f32: in place, or widened here (a whole
         * block ahead of its loads) */
        const float *kr16[16];
        float kf[16][8 * 16]; /* HDV <= 8 */
        for (int32_t k = 0; k < nk; k++) {
            const void *p = kvr_kv_ptr(l, a->layer_base, bt[kb], 0, kvh, ks);
            if (++ks == bs)
                ks = 0, kb++;
            if (dt == KVR_DT_F32) {
                kr16[k] = p;
            } else {
                for (int32_t c = 0; c < HDV; c++) {
                    v16f v = ld16x(p, dt, (size_t)c * 16);
                    memcpy(kf[k] + c * 16, &v, 64);
                }
                kr16[k] = kf[k];
            }
        }
        for (int32_t k = nk; k < 16; k++)
            kr16[k] = kr16[0];
        for (int32_t k0 = 0; k0 < 16; k0 += ATTN_KB) {
            if (k0 >= nk) {
                for (int k = 0; k < ATTN_KB; k++)
                    S[k0 + k] = (v16f){0};
                continue;
            }
            const float *const *kr = kr16 + k0;
            v16f q0[ATTN_KB], q1[ATTN_KB], q2[ATTN_KB], q3[ATTN_KB];
            wquad(HDV, qt, kr, 0, q0);
            wquad(HDV, qt, kr, 2, q2);
            wquad(HDV, qt, kr, 1, q1);
            wquad(HDV, qt, kr, 3, q3);
            for (int k = 0; k < ATTN_KB; k++)
                S[k0 + k] = ((q0[k] + q2[k]) + (q1[k] + q3[k])) * a->scale;
        }
        tr16(S);
        for (int32_t i = 0; i < n; i++) {
            if (t0 + nk - 1 < lo[i] || t0 > hi[i])
                continue;
            sc_put(sc[i], S[i], t0, nk, lo[i], hi[i]);
        }
    }
    float inv[ATTN_RW];
    for (int32_t i = 0; i < n; i++)
        inv[i] = softmax_row(sc[i], (size_t)(hi[i] - lo[i] + 1));
    for (int32_t i = 0; i < n; i += ATTN_RQ) {
        int32_t m = n - i < ATTN_RQ ? n - i : ATTN_RQ;
        if (m == 4)
            attn_pv(j, 0, dt, HDV, 4, m, lo + i, hi + i, sc + i, inv + i, o + i, bt, kvh);
        else if (m == 3)
            attn_pv(j, 0, dt, HDV, 3, m, lo + i, hi + i, sc + i, inv + i, o + i, bt, kvh);
        else if (m == 2)
            attn_pv(j, 0, dt, HDV, 2, m, lo + i, hi + i, sc + i, inv + i, o + i, bt, kvh);
        else
            attn_pv(j, 0, dt, HDV, 0, m, lo + i, hi + i, sc + i, inv + i, o + i, bt, kvh);
    }
}

/* One attention task loop for KV elements of dtype dt (a constant): task
 * pi is (head h, group gi), head major (as each head's keys are read
 * again by its next group); a group of fewer than ATTN_RQ rows takes
 * attn_hpu() query heads of one KV head together (a decode step: the
 * heads sharing a KV head read its keys once), the task of the first,
 * and the tasks of the others are empty. */
static inline __attribute__((always_inline)) void attn_rows(const struct attn_job *j, int ith,
                                                            int nth, int tid, const int H8,
                                                            const int W, const int32_t dt,
                                                            const int32_t HDV)
{
    const struct kvr_attn_args *a = j->a;
    const int32_t group = a->n_heads / a->layout->n_kv_heads;
    const int32_t n_pairs = j->n_groups * a->n_heads;
    for (int32_t pi = ith; pi < n_pairs; pi += nth) {
        int32_t h = pi / j->n_groups, gi = pi % j->n_groups, hk = h % group;
        int32_t r0 = j->grp[gi], nrow = j->grp[gi + 1] - r0;
        int32_t hpu = attn_hpu(nrow, group);
        if (hk % hpu)
            continue; /* taken with the unit's first head */
        int32_t nh = group - hk < hpu ? group - hk : hpu, kvh = h / group;
        if (W && HDV && nrow > ATTN_RQ) {
            attn_wide(j, tid, dt, HDV, r0, nrow, h, kvh);
            continue;
        }
        /* units of up to ATTN_RQ rows; the shapes as constants: a prefill
         * unit of 4 rows, a decode row's 2..4 heads */
        for (int32_t s = 0; s < nrow; s += ATTN_RQ) {
            int32_t m = nrow - s < ATTN_RQ ? nrow - s : ATTN_RQ, ni = m * nh;
            if (HDV && m == 4)
                attn_unit(j, tid, H8, dt, HDV, 4, r0 + s, 4, h, 1, kvh);
            else if (HDV && m == 1 && nh == 4)
                attn_unit(j, tid, H8, dt, HDV, 4, r0 + s, 1, h, 4, kvh);
            else if (HDV && m == 1 && nh == 3)
                attn_unit(j, tid, H8, dt, HDV, 3, r0 + s, 1, h, 3, kvh);
            else if (HDV && m == 1 && nh == 2)
                attn_unit(j, tid, H8, dt, HDV, 2, r0 + s, 1, h, 2, kvh);
            else if (HDV && ni >= 2 && ni <= 4)
                attn_unit(j, tid, H8, dt, HDV,
                          ni == 4   ? 4
                          : ni == 3 ? 3
                                    : 2,
                          r0 + s, m, h, nh, kvh);
            else
                attn_unit(j, tid, H8, dt, HDV, 0, r0 + s, m, h, nh, kvh);
        }
    }
}

/* attn_task in three versions like mm_task (cpu_create picks one): the KV
 * dtype decides the loop's loads; f16 through vcvtph2ps where the version
 * has it.  Every version computes the same bits. */
static inline __attribute__((always_inline)) void attn_body(void *arg, int ith, int nth, int tid,
                                                            int32_t f16)
{
    const struct attn_job *j = arg;
    const int32_t hd = j->a->layout->head_dim, hdv = hd == 64 ? 4 : hd == 128 ? 8 : 0;
    const int h8 = f16 == DT_F16_V3, w = f16 == DT_F16_V4;
#define ATTN_HD(dt)                                                                                \
    do {                                                                                           \
        if (hdv == 4)                                                                              \
            attn_rows(j, ith, nth, tid, h8, w, dt, 4);                                             \
        else if (hdv == 8)                                                                         \
            attn_rows(j, ith, nth, tid, h8, w, dt, 8);                                             \
        else                                                                                       \
            attn_rows(j, ith, nth, tid, h8, w, dt, 0);                                             \
    } while (0)
    switch (j->a->layout->dtype) {
    case KVR_KV_F32:
        ATTN_HD(KVR_DT_F32);
        break;
    case KVR_KV_BF16:
        ATTN_HD(KVR_DT_BF16);
        break;
    default:
        ATTN_HD(f16);
        break;
    }
#undef ATTN_HD
}

#if defined(__OPTIMIZE__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("arch=x86-64-v4"))) static void attn_task_v4(void *arg, int ith, int nth,
                                                                   int tid)
{
    attn_body(arg, ith, nth, tid, DT_F16_V4);
}

__attribute__((target("arch=x86-64-v3"))) static void attn_task_v3(void *arg, int ith, int nth,
                                                                   int tid)
{
    attn_body(arg, ith, nth, tid, DT_F16_V3);
}
#endif

static void attn_task_base(void *arg, int ith, int nth, int tid)
{
    attn_body(arg, ith, nth, tid, KVR_DT_F16);
}

static void cpu_attention(struct kvr_compute_backend *be, const struct kvr_attn_args *a,
                          const float *q, float *out)
{
    struct cpu_backend *c = cpu(be);
    /* groups: runs of up to ATTN_RW rows of one sequence at consecutive
     * positions */
    int32_t n_groups = 0;
    for (int32_t r = 0; r < a->n_rows;) {
        int32_t e = r + 1;
        while (e < a->n_rows && e - r < ATTN_RW && a->block_table[e] == a->block_table[r] &&
               a->pos[e] == a->pos[e - 1] + 1)
            e++;
        c->grp[n_groups++] = r;
        r = e;
    }
    c->grp[n_groups] = a->n_rows;
    struct attn_job j = {c, a, q, out, c->grp, n_groups};
    /* work: every row attends to up to pos + 1 keys, per head */
    double work = 0;
    for (int32_t r = 0; r < a->n_rows; r++)
        work += (double)(a->pos[r] + 1);
    work *= 4.0 * a->n_heads * a->layout->head_dim;
    kvr_tp_run(c->tp, c->attn_task, &j, chunks_for(c, work, n_groups * a->n_heads));
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
    if (i < i1) { /* the tail padded to a vector: every element through vexp() */
        float gt[16] = {0}, ut[16] = {0};
        memcpy(gt, j->g + i, (i1 - i) * 4);
        memcpy(ut, j->u + i, (i1 - i) * 4);
        v16f g = ldx(gt), u = ldx(ut);
        v16f r = g / (1.0f + vexp(-g)) * u;
        memcpy(j->g + i, &r, (i1 - i) * 4);
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
    free(c->accs);
    free(c->scores);
    free(c->grp);
    free(c->qpad);
    free(c->xbf);
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
    c->mm_task = mm_task_base;
    c->attn_task = attn_task_base;
#if !(defined(__OPTIMIZE__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__))
    if (p->numerics != KVR_NUMERICS_F32) { /* no bf16dot kernel in this build */
        free(c);
        return KVR_ERR_UNSUPPORTED;
    }
#endif
#if defined(__OPTIMIZE__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    int ver = cpu_version();
    if (p->numerics == KVR_NUMERICS_BF16DOT) {
        if (ver != 4 || !__builtin_cpu_supports("avx512bf16")) {
            free(c);
            return KVR_ERR_UNSUPPORTED; /* kvr_ctx_create says why */
        }
        c->numerics = KVR_NUMERICS_BF16DOT;
        c->xbf_ld = ((size_t)p->max_cols + 31) & ~(size_t)31;
        c->xbf = aligned_alloc(64, (size_t)p->max_rows * c->xbf_ld * 2);
        if (!c->xbf) {
            free(c);
            return KVR_ERR_NO_MEMORY;
        }
    }
    if (ver == 4) {
        c->mm_task = mm_task_v4;
        c->attn_task = attn_task_v4;
    } else if (ver == 3) {
        c->mm_task = mm_task_v3;
        c->attn_task = attn_task_v3;
    }
#endif
    size_t nt = (size_t)p->n_threads;
    /* 8 rows, packed with the tail padded (mm_pack8()) */
    c->conv_per_thread = ((size_t)p->max_cols + 15) / 16 * 16 * 8;
    c->conv = aligned_alloc(64, nt * c->conv_per_thread * sizeof(float));
#ifdef MM_ACC_FLOATS
    c->accs = aligned_alloc(64, nt * MM_ACC_FLOATS * sizeof(float));
    if (!c->accs) {
        cpu_destroy(&c->base);
        return KVR_ERR_NO_MEMORY;
    }
#endif
    c->scores = aligned_alloc(64, nt * ATTN_RW * (size_t)p->max_seq_len * sizeof(float));
    c->grp = calloc((size_t)p->max_rows + 1, sizeof(int32_t));
    c->qpad = aligned_alloc(64, nt * ATTN_RW * (((size_t)p->max_head_dim + 15) & ~(size_t)15) * 4);
    kvr_status_t st = KVR_ERR_NO_MEMORY;
    if (!c->conv || !c->scores || !c->grp || !c->qpad ||
        (st = kvr_tp_create(p->n_threads, &c->tp)) != KVR_OK) {
        cpu_destroy(&c->base);
        return st;
    }
    *be_p = &c->base;
    return KVR_OK;
}

/* The CPU kernels' arithmetic revision, the class's suffix: bumped by any
 * change to a bit they compute (a sum's order, a formula), so that nodes of
 * builds that compute differently are two classes and the router never
 * puts them in one cluster (a rolling upgrade: the new nodes are refused
 * until the old ones are gone).  No suffix: up to 2026-12-02; .2: the
 * RMSNorm sum in 16 lanes. */
#define KVR_CPU_ARITH_REV ".2"

const char *kvr_cpu_kernels(void)
{
#if defined(__OPTIMIZE__) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (cpu_version() != 0)
        return "cpu-fma16" KVR_CPU_ARITH_REV; /* v4 and v3: the same bits (engine_variants) */
#endif
    return "cpu-base" KVR_CPU_ARITH_REV;
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
