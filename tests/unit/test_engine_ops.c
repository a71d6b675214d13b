/*
 * test_engine_ops.c - every op of the CPU compute backend against a plain
 * scalar C version written here (double accumulation): matmul for each
 * dtype, row counts on both sides of the GEMV/sgemm switch, sizes that are
 * not multiples of the kernel tiles, bias and accumulate; the batch
 * invariance of KVR_MM_INVARIANT; rmsnorm, rope, swiglu (large
 * arguments of exp too); attention through scattered block tables on the
 * GEMM path (prefill rows) and the per-row path (decode rows), with GQA and
 * a sliding window, over f32, bf16 and f16 K/V; kv_store's rounding to bf16
 * and f16 (ties, subnormals, overflow, NaN).  Threads 1 and 3.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_compute_backend.h"
#include "kvr_test.h"

static unsigned rs = 12345;
static float frand(void)
{
    rs = rs * 1103515245u + 12345u;
    return (float)((rs >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_f16(float f) /* |f| < 2, normal range only (test data) */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    if (e <= 0)
        return (uint16_t)sign;
    return (uint16_t)(sign | ((uint32_t)e << 10) | ((u >> 13) & 0x3ff));
}

static float from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    u = e == 0 ? sign : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float maxdiff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) /* NaN counts */
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* f rounded to bf16, to nearest even (finite test data) */
static float round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* dp: a backend in numerics bf16dot, bf16 weights only, against the scalar
 * reference on the activations rounded to bf16.  v3: the same backend on
 * the x86-64-v3 kernels (KVR_CPU_MATMUL=v3), whose bits every M must give
 * (they walk the weight rows their own way: 4 quarters at decode, where
 * v4 takes one-pass halves up to 16 rows, 12 in f32, in chunks of up to 8
 * x rows); NULL to skip. */
static void test_matmul(struct kvr_compute_backend *be, struct kvr_compute_backend *v3, int dp)
{
    /* decode batches (1..36: one-pass tiles up to 16 rows, in chunks of
     * up to 8 from 9, f32 to 12, so 12 / 13 cross its edge; widened once
     * above) and prefill row counts */
    const int Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 31, 32, 33, 36, 70};
    /* K 2100: past MM_KSPLIT, the tile kernel's K chunks (and a tail) */
    const int NK[][2] = {{37, 19}, {64, 64}, {130, 48}, {9, 200}, {200, 96}, {24, 2100}};
    for (int dt = 0; dt < 3; dt++) {
        if (dp && dt != KVR_DT_BF16)
            continue;
        for (size_t s = 0; s < sizeof(NK) / sizeof(NK[0]); s++) {
            int N = NK[s][0], K = NK[s][1];
            float *wf = malloc((size_t)N * (size_t)K * 4);
            uint16_t *wh = malloc((size_t)N * (size_t)K * 2);
            for (int i = 0; i < N * K; i++) {
                float v = frand();
                if (dt == KVR_DT_BF16) {
                    wh[i] = to_bf16(v);
                    v = from_bf16(wh[i]);
                } else if (dt == KVR_DT_F16) {
                    wh[i] = to_f16(v);
                    v = from_f16(wh[i]);
                }
                wf[i] = v;
            }
            struct kvr_weight w = {.data = dt == KVR_DT_F32 ? (void *)wf : (void *)wh,
                                   .dtype = dt,
                                   .rows = N,
                                   .cols = K};
            float *bias = malloc((size_t)N * 4);
            for (int i = 0; i < N; i++)
                bias[i] = frand();
            for (size_t mi = 0; mi < sizeof(Ms) / sizeof(Ms[0]); mi++) {
                int M = Ms[mi];
                float *x = malloc((size_t)M * (size_t)K * 4),
                      *y = malloc((size_t)M * (size_t)N * 4),
                      *ref = malloc((size_t)M * (size_t)N * 4);
                for (int i = 0; i < M * K; i++)
                    x[i] = frand();
                for (int acc = 0; acc < 2; acc++) {
                    for (int i = 0; i < M * N; i++)
                        y[i] = ref[i] = acc ? frand() : 0.0f;
                    for (int m = 0; m < M; m++)
                        for (int n = 0; n < N; n++) {
                            double d = 0;
                            for (int k = 0; k < K; k++)
                                d += (double)(dp ? round_bf16(x[m * K + k]) : x[m * K + k]) *
                                     wf[n * K + k];
                            d += bias[n];
                            ref[m * N + n] = (float)(acc ? ref[m * N + n] + d : d);
                        }
                    be->ops->matmul(be, y, x, M, &w, bias, acc ? KVR_MM_ACCUMULATE : 0);
                    float e = maxdiff(y, ref, (size_t)M * (size_t)N);
                    if (!(e < 1e-4f))
                        fprintf(stderr, "matmul dtype %d%s M %d N %d K %d acc %d: max diff %g\n",
                                dt, dp ? " bf16dot" : "", M, N, K, acc, e);
                    KVR_CHECK(e < 1e-4f);
                }
                /* invariance: each row alone gives the same bits as the batch */
                be->ops->matmul(be, y, x, M, &w, NULL, KVR_MM_INVARIANT);
                for (int m = 0; m < M; m++) {
                    be->ops->matmul(be, ref, x + (size_t)m * (size_t)K, 1, &w, NULL,
                                    KVR_MM_INVARIANT);
                    KVR_CHECK(memcmp(ref, y + (size_t)m * (size_t)N, (size_t)N * 4) == 0);
                }
                if (v3) {
                    v3->ops->matmul(v3, ref, x, M, &w, NULL, KVR_MM_INVARIANT);
                    if (memcmp(ref, y, (size_t)M * (size_t)N * 4) != 0)
                        fprintf(stderr, "matmul dtype %d M %d N %d K %d: v3 bits differ\n", dt, M,
                                N, K);
                    KVR_CHECK(memcmp(ref, y, (size_t)M * (size_t)N * 4) == 0);
                }
                free(x);
                free(y);
                free(ref);
            }
            free(wf);
            free(wh);
            free(bias);
        }
    }
}

/* embed widens every one of the 65536 f16 bit patterns (subnormals, inf,
 * NaN, -0) exactly as the compiler's scalar f16 -> f32 conversion does,
 * bit for bit, in the vector body and the scalar tail (cols 36) */
static void test_f16_widen(struct kvr_compute_backend *be)
{
    const int cols = 36, rows = (65536 + cols - 1) / cols;
    uint16_t *h = calloc((size_t)rows * cols, 2);
    float *x = malloc((size_t)rows * cols * 4);
    int32_t *tok = malloc((size_t)rows * 4);
    KVR_CHECK(h && x && tok);
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    for (int r = 0; r < rows; r++)
        tok[r] = r;
    struct kvr_weight w = {.data = h, .dtype = KVR_DT_F16, .rows = rows, .cols = cols};
    be->ops->embed(be, x, tok, rows, &w);
    for (int i = 0; i < 65536; i++) {
        __extension__ _Float16 hf;
        memcpy(&hf, &h[i], 2);
        float want = (float)hf;
        uint32_t a, b;
        memcpy(&a, &x[i], 4);
        memcpy(&b, &want, 4);
        if (a != b && !(isnan(want) && isnan(x[i])))
            fprintf(stderr, "f16 0x%04x: got 0x%08x, want 0x%08x\n", i, a, b);
        KVR_CHECK(a == b || (isnan(want) && isnan(x[i])));
    }
    free(h);
    free(x);
    free(tok);
}

static void test_small_ops(struct kvr_compute_backend *be)
{
    enum { M = 20, D = 72, H = 3, HD = 24 };
    float x[M * D], y[M * D], ref[M * D], w[D];
    for (int i = 0; i < M * D; i++)
        x[i] = frand() * 3;
    for (int i = 0; i < D; i++)
        w[i] = 1 + frand() * 0.2f;
    for (int m = 0; m < M; m++) {
        double ss = 0;
        for (int i = 0; i < D; i++)
            ss += (double)x[m * D + i] * x[m * D + i];
        double s = 1.0 / sqrt(ss / D + 1e-5);
        for (int i = 0; i < D; i++)
            ref[m * D + i] = (float)(x[m * D + i] * s * w[i]);
    }
    be->ops->rmsnorm(be, y, x, M, D, w, 1e-5f);
    KVR_CHECK(maxdiff(y, ref, M * D) < 1e-5f);

    /* rope on [M][H][HD] */
    float inv[HD / 2];
    int32_t pos[M];
    for (int i = 0; i < HD / 2; i++)
        inv[i] = (float)(1.0 / pow(10000.0, 2.0 * i / HD));
    for (int m = 0; m < M; m++)
        pos[m] = m * 37;
    memcpy(y, x, sizeof(float) * M * H * HD);
    for (int m = 0; m < M; m++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < HD / 2; i++) {
                const float *v = x + (m * H + h) * HD;
                double a = (double)pos[m] * inv[i];
                ref[(m * H + h) * HD + i] = (float)(v[i] * cos(a) - v[i + HD / 2] * sin(a));
                ref[(m * H + h) * HD + i + HD / 2] =
                    (float)(v[i + HD / 2] * cos(a) + v[i] * sin(a));
            }
    be->ops->rope(be, y, M, H, HD, pos, inv);
    KVR_CHECK(maxdiff(y, ref, M * H * HD) < 2e-4f);

    /* swiglu, including arguments where exp over/underflows */
    enum { NS = 40000 };
    float *g = malloc(NS * 4), *u = malloc(NS * 4), *r = malloc(NS * 4);
    for (int i = 0; i < NS; i++) {
        g[i] = frand() * (i % 100 == 0 ? 200.0f : 12.0f);
        u[i] = frand();
        r[i] = (float)(g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    }
    be->ops->swiglu(be, g, u, NS);
    float e = 0;
    for (int i = 0; i < NS; i++) {
        float d = fabsf(g[i] - r[i]) / (1.0f + fabsf(r[i]));
        e = d > e ? d : e;
    }
    KVR_CHECK(e < 1e-5f);
    free(g);
    free(u);
    free(r);
}

/* element i of a KV slab of dtype dt, widened */
static float kv_get(const void *slab, size_t i, int32_t dt)
{
    if (dt == KVR_KV_F32)
        return ((const float *)slab)[i];
    uint16_t h = ((const uint16_t *)slab)[i];
    return dt == KVR_KV_BF16 ? from_bf16(h) : from_f16(h);
}

/* attention of n_rows rows at positions pos[] over a KV slab of dtype
 * kv_dt, against a naive version (double sums over the widened K/V). */
static void check_attention_dt(struct kvr_compute_backend *be, int H, int Hkv, int hd, int bs,
                               int window, int n_rows, const int32_t *pos, int same_seq,
                               int32_t kv_dt)
{
    struct kvr_kv_layout l = {
        .n_layers = 1, .n_kv_heads = Hkv, .head_dim = hd, .block_size = bs, .dtype = kv_dt};
    int max_pos = 0;
    for (int r = 0; r < n_rows; r++)
        max_pos = pos[r] > max_pos ? pos[r] : max_pos;
    int nb = max_pos / bs + 1, n_seq = same_seq ? 1 : n_rows, pool_blocks = nb * n_seq * 2 + 3;
    void *slab = calloc(1, kvr_kv_layer_bytes(&l, pool_blocks));
    int32_t *tables = malloc((size_t)nb * (size_t)n_seq * 4);
    const int32_t **bt = malloc((size_t)n_rows * sizeof(*bt));
    for (int s = 0; s < n_seq; s++)
        for (int i = 0; i < nb; i++)
            tables[s * nb + i] = pool_blocks - 1 - 2 * (s * nb + i); /* scattered */
    for (int r = 0; r < n_rows; r++)
        bt[r] = tables + (same_seq ? 0 : r) * nb;
    /* random K/V everywhere */
    size_t nf = kvr_kv_layer_bytes(&l, pool_blocks) / kvr_kv_dtype_size(kv_dt);
    for (size_t i = 0; i < nf; i++) {
        float f = frand();
        if (kv_dt == KVR_KV_F32)
            ((float *)slab)[i] = f;
        else
            ((uint16_t *)slab)[i] = kv_dt == KVR_KV_BF16 ? to_bf16(f) : to_f16(f);
    }
    float *q = malloc((size_t)n_rows * (size_t)H * (size_t)hd * 4);
    float *out = malloc((size_t)n_rows * (size_t)H * (size_t)hd * 4);
    float *ref = malloc((size_t)n_rows * (size_t)H * (size_t)hd * 4);
    for (int i = 0; i < n_rows * H * hd; i++)
        q[i] = frand() * 2;
    float scale = 1.0f / sqrtf((float)hd);
    double *sc = malloc(sizeof(double) * (size_t)(max_pos + 1));
    for (int r = 0; r < n_rows; r++) {
        for (int h = 0; h < H; h++) {
            int kvh = h / (H / Hkv),
                lo = window && pos[r] - window + 1 > 0 ? pos[r] - window + 1 : 0;
            const float *qv = q + (r * H + h) * hd;
            double mx = -1e300, sum = 0;
            for (int t = lo; t <= pos[r]; t++) {
                size_t k = kvr_kv_offset(&l, bt[r][t / bs], 0, kvh, t % bs);
                double d = 0;
                for (int i = 0; i < hd; i++)
                    d += (double)qv[i] * kv_get(slab, k + (size_t)i, kv_dt);
                sc[t] = d * scale;
                mx = sc[t] > mx ? sc[t] : mx;
            }
            for (int t = lo; t <= pos[r]; t++)
                sum += (sc[t] = exp(sc[t] - mx));
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int t = lo; t <= pos[r]; t++)
                    o += sc[t] / sum *
                         kv_get(slab, kvr_kv_offset(&l, bt[r][t / bs], 1, kvh, t % bs) + (size_t)i,
                                kv_dt);
                ref[(r * H + h) * hd + i] = (float)o;
            }
        }
    }
    struct kvr_attn_args a = {.n_rows = n_rows,
                              .pos = pos,
                              .block_table = bt,
                              .layer_base = slab,
                              .layout = &l,
                              .n_heads = H,
                              .window = window,
                              .scale = scale};
    be->ops->attention(be, &a, q, out);
    float e = maxdiff(out, ref, (size_t)n_rows * (size_t)H * (size_t)hd);
    if (!(e < 2e-5f))
        fprintf(stderr, "attention H %d Hkv %d hd %d bs %d window %d rows %d same %d kv %s: %g\n",
                H, Hkv, hd, bs, window, n_rows, same_seq, kvr_kv_dtype_name(kv_dt), e);
    KVR_CHECK(e < 2e-5f);
    free(slab);
    free(tables);
    free(bt);
    free(q);
    free(out);
    free(ref);
    free(sc);
}

static void check_attention(struct kvr_compute_backend *be, int H, int Hkv, int hd, int bs,
                            int window, int n_rows, const int32_t *pos, int same_seq)
{
    check_attention_dt(be, H, Hkv, hd, bs, window, n_rows, pos, same_seq, KVR_KV_F32);
}

/* f32 -> f16 rounded to nearest even, by double arithmetic (not the bit
 * tricks or instructions under test); returns the value it denotes */
static double f16_round_ref(float f)
{
    double a = fabs((double)f);
    if (isnan(f))
        return f;
    if (a >= 65520.0) /* halfway to 65536 and beyond: ties go to the even inf */
        return copysign(INFINITY, f);
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    int ex = e - 1 < -14 ? -14 : e - 1;
    double ulp = ldexp(1.0, ex - 10);
    return copysign(nearbyint(a / ulp) * ulp, f);
}

static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

/* kv_store writes bf16 / f16 rounded to nearest even: halfway cases both
 * ways, subnormals, overflow, infinities, NaN, signed zeros */
static void test_kv_store(struct kvr_compute_backend *be)
{
    enum { HD = 64, NV = HD * 2 * 8 };
    float vals[NV];
    int nv = 0;
    const float special[] = {0.0f,     -0.0f,    1.0f,        -1.0f,      65504.0f,  65519.0f,
                             65520.0f, 1e6f,     -1e6f,       INFINITY,   -INFINITY, NAN,
                             6e-8f,    3e-8f,    2.9e-8f,     6.1e-5f,    1e-40f,    -1e-41f,
                             3.4e38f,  -3.4e38f, 1.00390625f, 1.01171875f};
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
        vals[nv++] = special[i];
    /* bf16 ties: mantissa low half exactly 0x8000, with even and odd kept bit */
    const uint32_t ties[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x7f7fffffu};
    for (size_t i = 0; i < sizeof(ties) / sizeof(ties[0]); i++)
        memcpy(&vals[nv++], &ties[i], 4);
    /* f16 ties: 1 + 2^-11 (to 1), 1 + 3 2^-11 (to 1 + 2^-9) */
    vals[nv++] = 1.0f + 0x1p-11f;
    vals[nv++] = 1.0f + 3 * 0x1p-11f;
    while (nv < NV) {
        float f = frand() * ldexpf(1.0f, (int)(rs % 48) - 30);
        vals[nv++] = f;
    }
    for (int32_t dt = KVR_KV_F16; dt <= KVR_KV_BF16; dt++) {
        /* one row of 8 kv heads (k and v): NV values */
        struct kvr_kv_layout l = {
            .n_layers = 1, .n_kv_heads = 8, .head_dim = HD, .block_size = 4, .dtype = dt};
        uint16_t *slab = calloc(1, kvr_kv_layer_bytes(&l, 3));
        int32_t table[3] = {2, 0, 1}, pos = 5;
        const int32_t *bt[1] = {table};
        struct kvr_attn_args a = {
            .n_rows = 1, .pos = &pos, .block_table = bt, .layer_base = slab, .layout = &l};
        be->ops->kv_store(be, &a, vals, vals + NV / 2);
        for (int kv = 0; kv < 2; kv++)
            for (int h = 0; h < 8; h++)
                for (int i = 0; i < HD; i++) {
                    float f = vals[kv * NV / 2 + h * HD + i];
                    uint16_t got = ((uint16_t *)kvr_kv_ptr(&l, slab, 0, kv, h, 1))[i];
                    if (dt == KVR_KV_BF16) {
                        uint32_t u;
                        memcpy(&u, &f, 4);
                        /* nearest even by integer arithmetic on the dropped half */
                        uint32_t lo = u & 0xffffu, hi = u >> 16;
                        uint32_t want = lo > 0x8000u || (lo == 0x8000u && (hi & 1)) ? hi + 1 : hi;
                        if (isnan(f)) {
                            KVR_CHECK((got & 0x7f80) == 0x7f80 && (got & 0x7f) != 0);
                            continue;
                        }
                        if (got != want)
                            fprintf(stderr, "bf16 of %a (0x%08x): got 0x%04x want 0x%04x\n",
                                    (double)f, u, got, want);
                        KVR_CHECK(got == want);
                    } else {
                        double want = f16_round_ref(f), v = f16_value(got);
                        if (isnan(f)) {
                            KVR_CHECK(isnan(v));
                            continue;
                        }
                        if (!(v == want && signbit(v) == signbit(want)))
                            fprintf(stderr, "f16 of %a: got 0x%04x (%a) want %a\n", (double)f, got,
                                    v, want);
                        KVR_CHECK(v == want && signbit(v) == signbit(want));
                    }
                }
        /* nothing written outside the row's slot */
        size_t n = kvr_kv_layer_bytes(&l, 3) / 2, written = 0;
        for (size_t i = 0; i < n; i++)
            written += slab[i] != 0;
        size_t lo = kvr_kv_offset(&l, 0, 0, 0, 0), hi = kvr_kv_offset(&l, 1, 0, 0, 0);
        for (size_t i = 0; i < n; i++)
            if (i < lo || i >= hi)
                KVR_CHECK(slab[i] == 0);
        KVR_CHECK(written > NV / 2);
        free(slab);
    }
}

static void test_attention(struct kvr_compute_backend *be)
{
    int32_t pos[300];
    /* prefill rows: one sequence, consecutive positions (GEMM path), from 0
     * and continuing after a cached prefix, more rows than a 128-row tile */
    for (int i = 0; i < 300; i++)
        pos[i] = i;
    check_attention(be, 4, 4, 16, 16, 0, 40, pos, 1);
    check_attention(be, 8, 2, 24, 8, 0, 200, pos, 1);
    check_attention(be, 4, 1, 32, 16, 50, 200, pos, 1);
    for (int i = 0; i < 150; i++)
        pos[i] = 77 + i;
    check_attention(be, 6, 3, 16, 4, 0, 150, pos, 1);
    check_attention(be, 6, 3, 16, 4, 30, 150, pos, 1);
    /* decode rows: different sequences and lengths (per-row path) */
    for (int i = 0; i < 12; i++)
        pos[i] = (i * 29) % 97;
    check_attention(be, 4, 4, 16, 16, 0, 12, pos, 0);
    check_attention(be, 8, 2, 20, 8, 0, 12, pos, 0);
    check_attention(be, 8, 2, 64, 16, 13, 12, pos, 0);
    /* few rows of one sequence (per-row path for prefill) */
    for (int i = 0; i < 5; i++)
        pos[i] = 60 + i;
    check_attention(be, 4, 2, 16, 16, 0, 5, pos, 1);
    /* bf16 and f16 K/V: the same against the widened values, head_dim with
     * and without a tail, prefill groups and decode rows */
    for (int32_t dt = KVR_KV_F16; dt <= KVR_KV_BF16; dt++) {
        for (int i = 0; i < 150; i++)
            pos[i] = 3 + i;
        check_attention_dt(be, 8, 2, 24, 8, 0, 150, pos, 1, dt);
        check_attention_dt(be, 4, 4, 64, 16, 40, 90, pos, 1, dt);
        for (int i = 0; i < 12; i++)
            pos[i] = (i * 29) % 97;
        check_attention_dt(be, 8, 2, 20, 8, 0, 12, pos, 0, dt);
        check_attention_dt(be, 4, 1, 16, 16, 0, 12, pos, 0, dt);
    }
}

int main(void)
{
    const int threads[] = {1, 3};
    for (int t = 0; t < 2; t++) {
        struct kvr_backend_params p = {.n_threads = threads[t],
                                       .max_rows = 512,
                                       .max_cols = 2100,
                                       .max_seq_len = 1024,
                                       .max_head_dim = 64,
                                       .gemv_max_rows = KVR_GEMV_ROWS};
        struct kvr_compute_backend *be;
        KVR_CHECK_STATUS(kvr_cpu_ops.create(&p, &be), KVR_OK);
        struct kvr_compute_backend *v3;
        setenv("KVR_CPU_MATMUL", "v3", 1);
        KVR_CHECK_STATUS(kvr_cpu_ops.create(&p, &v3), KVR_OK);
        unsetenv("KVR_CPU_MATMUL");
        test_matmul(be, v3, 0);
        v3->ops->destroy(v3);
        test_small_ops(be);
        test_f16_widen(be);
        test_attention(be);
        test_kv_store(be);
        be->ops->destroy(be);
        /* numerics bf16dot (AVX512-BF16 only: elsewhere refused) */
        p.numerics = KVR_NUMERICS_BF16DOT;
        kvr_status_t st = kvr_cpu_ops.create(&p, &be);
        if (st == KVR_ERR_UNSUPPORTED) {
            printf("skip (part): numerics bf16dot: no AVX512-BF16 kernels here\n");
        } else {
            KVR_CHECK_STATUS(st, KVR_OK);
            test_matmul(be, NULL, 1);
            be->ops->destroy(be);
            printf("cpu backend matmul in numerics bf16dot, %d thread(s): ok\n", threads[t]);
        }
        printf("cpu backend ops, %d thread(s): ok\n", threads[t]);
    }
    return 0;
}
