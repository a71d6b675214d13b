/*
 * test_backend_ops.c - every op of the CUDA compute backend against the CPU
 * backend on the same random inputs, as ggml's test-backend-ops: one line a
 * case with its error and tolerance, exit 1 if any case fails, 77 (skip) on
 * a machine without a usable GPU (the reason printed).
 *
 * Error: NMSE = sum (gpu - cpu)^2 / sum cpu^2 over the op's output (a
 * non-finite GPU value where the CPU's is finite fails).  Tolerances:
 *   - f32 arithmetic (rmsnorm, rope, swiglu, attention, f32 GEMM): 1e-9
 *     (the sums run in another order; exp/sin/cos differ in the last ulp);
 *   - GEMM with f16 weights: 1e-6, bf16 weights: 2e-5 - the GPU narrows the
 *     activations to the weight dtype for the tensor cores (round to
 *     nearest even: 2^-11 / 2^-8 relative), the CPU keeps them f32;
 *   - embed and the KV store: 0 (exact conversions both sides; the slabs
 *     are compared byte for byte).
 * One pair of backends runs every case.  Read-only inputs (weights, norms,
 * biases, inv_freq) are uploaded by address and cached for the CUDA
 * backend's life, as the engine's weights are: the cases keep theirs
 * allocated to the end (keep()), so no address is reused with other bytes.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "kvr_compute_backend.h"
#include "kvr_cuda.h"
#include "kvr_cuda_backend.h"

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;
static int n_ok, n_fail;

static uint32_t rnd(void)
{
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 11);
}

static float frand(void) /* [-1, 1) */
{
    return (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f;
}

static uint16_t f2bf(float f) /* round to nearest even */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

__extension__ typedef _Float16 f16_t;

static uint16_t f2h(float f)
{
    f16_t h = (f16_t)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* n random values in dtype (enum kvr_dtype; enum kvr_kv_dtype has the same numbers) */
static void *rand_typed(size_t n, int32_t dtype, float scale)
{
    bool f32 = dtype == KVR_DT_F32, bf16 = dtype == KVR_DT_BF16;
    void *p = malloc(n * (f32 ? 4 : 2));
    for (size_t i = 0; i < n; i++) {
        float v = frand() * scale;
        if (f32)
            ((float *)p)[i] = v;
        else
            ((uint16_t *)p)[i] = bf16 ? f2bf(v) : f2h(v);
    }
    return p;
}

static struct kvr_backend_params params(void)
{
    return (struct kvr_backend_params){.n_threads = 2,
                                       .max_rows = 512,
                                       .max_cols = 2048,
                                       .max_seq_len = 4096,
                                       .max_head_dim = 256,
                                       .gemv_max_rows = KVR_GEMV_ROWS};
}

struct pair {
    struct kvr_compute_backend *c, *g;
};

static struct pair g_pair;
static void **g_keep;
static size_t g_n_keep;

static struct pair pair_new(void)
{
    return g_pair;
}

static void pair_free(struct pair *b)
{
    (void)b;
}

/* a read-only input: alive until the end (see the header comment) */
static void keep(void *p)
{
    void **n = realloc(g_keep, (g_n_keep + 1) * sizeof *n);
    if (!n)
        exit(1);
    g_keep = n;
    g_keep[g_n_keep++] = p;
}

/* the same floats in a buffer of each backend */
static void twin(struct pair *b, size_t n, float **c, float **g, bool random)
{
    *c = b->c->ops->alloc(b->c, n * 4);
    *g = b->g->ops->alloc(b->g, n * 4);
    for (size_t i = 0; random && i < n; i++)
        (*c)[i] = (*g)[i] = frand();
}

static void untwin(struct pair *b, float *c, float *g)
{
    b->c->ops->free(b->c, c);
    b->g->ops->free(b->g, g);
}

static void judge(const char *name, const float *g, const float *c, size_t n, double tol)
{
    double num = 0, den = 0;
    bool bad = false;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(g[i]) && isfinite(c[i]))
            bad = true;
        double d = (double)g[i] - (double)c[i];
        num += d * d;
        den += (double)c[i] * (double)c[i];
    }
    double e = den > 0 ? num / den : num;
    bool ok = !bad && e <= tol;
    printf("%-72s NMSE %.3e <= %.0e %s\n", name, e, tol, ok ? "OK" : "FAIL");
    ok ? n_ok++ : n_fail++;
}

static const char *dtn(int32_t dt)
{
    return dt == KVR_DT_F32 ? "f32" : dt == KVR_DT_BF16 ? "bf16" : "f16";
}

/* ------------------------------------------------------------ cases */

static void t_matmul(int32_t M, int32_t N, int32_t K, int32_t dt, bool bias, bool acc, bool host_y)
{
    struct pair b = pair_new();
    void *wd = rand_typed((size_t)N * K, dt, 0.5f);
    struct kvr_weight w = {wd, dt, N, K};
    float *bv = NULL;
    if (bias) {
        bv = malloc((size_t)N * 4);
        for (int32_t i = 0; i < N; i++)
            bv[i] = frand();
    }
    float *xc, *xg, *yc, *yg;
    twin(&b, (size_t)M * K, &xc, &xg, true);
    size_t ny = (size_t)M * N;
    if (host_y) {
        yc = malloc(ny * 4);
        yg = malloc(ny * 4);
        for (size_t i = 0; i < ny; i++)
            yc[i] = yg[i] = frand();
    } else {
        twin(&b, ny, &yc, &yg, true);
    }
    unsigned fl = KVR_MM_INVARIANT | (acc ? KVR_MM_ACCUMULATE : 0);
    b.c->ops->matmul(b.c, yc, xc, M, &w, bv, fl);
    b.g->ops->matmul(b.g, yg, xg, M, &w, bv, fl);
    char name[160];
    snprintf(name, sizeof name, "matmul(M=%d,N=%d,K=%d,%s%s%s%s)", M, N, K, dtn(dt),
             bias ? ",bias" : "", acc ? ",acc" : "", host_y ? ",y=host" : "");
    judge(name, yg, yc, ny, dt == KVR_DT_F32 ? 1e-9 : dt == KVR_DT_F16 ? 1e-6 : 2e-5);
    if (host_y) {
        free(yc);
        free(yg);
    } else {
        untwin(&b, yc, yg);
    }
    untwin(&b, xc, xg);
    keep(bv);
    keep(wd);
    pair_free(&b);
}

static void t_embed(int32_t M, int32_t V, int32_t d, int32_t dt)
{
    struct pair b = pair_new();
    void *ed = rand_typed((size_t)V * d, dt, 1.0f);
    struct kvr_weight e = {ed, dt, V, d};
    int32_t *tc = b.c->ops->alloc(b.c, (size_t)M * 4), *tg = b.g->ops->alloc(b.g, (size_t)M * 4);
    for (int32_t i = 0; i < M; i++)
        tc[i] = tg[i] = (int32_t)(rnd() % (uint32_t)V);
    float *xc, *xg;
    twin(&b, (size_t)M * d, &xc, &xg, false);
    b.c->ops->embed(b.c, xc, tc, M, &e);
    b.g->ops->embed(b.g, xg, tg, M, &e);
    char name[160];
    snprintf(name, sizeof name, "embed(M=%d,V=%d,d=%d,%s)", M, V, d, dtn(dt));
    judge(name, xg, xc, (size_t)M * d, 0);
    untwin(&b, xc, xg);
    b.c->ops->free(b.c, tc);
    b.g->ops->free(b.g, tg);
    keep(ed);
    pair_free(&b);
}

static void t_rmsnorm(int32_t M, int32_t dim, bool inplace)
{
    struct pair b = pair_new();
    float *w = malloc((size_t)dim * 4);
    for (int32_t i = 0; i < dim; i++)
        w[i] = 1.0f + 0.1f * frand();
    float *xc, *xg, *yc, *yg;
    twin(&b, (size_t)M * dim, &xc, &xg, true);
    if (inplace) {
        yc = xc;
        yg = xg;
    } else {
        twin(&b, (size_t)M * dim, &yc, &yg, false);
    }
    b.c->ops->rmsnorm(b.c, yc, xc, M, dim, w, 1e-5f);
    b.g->ops->rmsnorm(b.g, yg, xg, M, dim, w, 1e-5f);
    char name[160];
    snprintf(name, sizeof name, "rmsnorm(M=%d,dim=%d%s)", M, dim, inplace ? ",in place" : "");
    judge(name, yg, yc, (size_t)M * dim, 1e-9);
    if (!inplace)
        untwin(&b, yc, yg);
    untwin(&b, xc, xg);
    keep(w);
    pair_free(&b);
}

/* inv_freq as model.c computes it: plain, linear (factor) or llama3 */
static void inv_freq_of(float *f, int32_t hd, double theta, int kind)
{
    for (int32_t i = 0; i < hd / 2; i++) {
        double v = 1.0 / pow(theta, (2.0 * i) / hd);
        if (kind == 1) {
            v /= 4.0;
        } else if (kind == 2) { /* factor 8, low 1, high 4, original 8192 */
            double wl = 2 * M_PI / v, lo_wl = 8192.0 / 1.0, hi_wl = 8192.0 / 4.0;
            if (wl > lo_wl) {
                v /= 8.0;
            } else if (wl >= hi_wl) {
                double s = (8192.0 / wl - 1.0) / (4.0 - 1.0);
                v = (1 - s) * v / 8.0 + s * v;
            }
        }
        f[i] = (float)v;
    }
}

static void t_rope(int32_t M, int32_t H, int32_t hd, int kind)
{
    struct pair b = pair_new();
    float *inv = malloc(128 * sizeof *inv);
    keep(inv);
    inv_freq_of(inv, hd, kind == 2 ? 500000.0 : 10000.0, kind);
    int32_t *pc = b.c->ops->alloc(b.c, (size_t)M * 4), *pg = b.g->ops->alloc(b.g, (size_t)M * 4);
    for (int32_t i = 0; i < M; i++)
        pc[i] = pg[i] = (int32_t)(rnd() % 12000u);
    float *xc, *xg;
    twin(&b, (size_t)M * H * hd, &xc, &xg, true);
    b.c->ops->rope(b.c, xc, M, H, hd, pc, inv);
    b.g->ops->rope(b.g, xg, M, H, hd, pg, inv);
    char name[160];
    snprintf(name, sizeof name, "rope(M=%d,heads=%d,hd=%d,%s)", M, H, hd,
             kind == 0   ? "plain"
             : kind == 1 ? "linear x4"
                         : "llama3");
    judge(name, xg, xc, (size_t)M * H * hd, 1e-9);
    untwin(&b, xc, xg);
    b.c->ops->free(b.c, pc);
    b.g->ops->free(b.g, pg);
    pair_free(&b);
}

static void t_swiglu(size_t n)
{
    struct pair b = pair_new();
    float *gc, *gg, *uc, *ug;
    twin(&b, n, &gc, &gg, true);
    twin(&b, n, &uc, &ug, true);
    for (size_t i = 0; i < n; i++)
        gc[i] = gg[i] = gc[i] * 8.0f; /* the interesting range of silu */
    b.c->ops->swiglu(b.c, gc, uc, n);
    b.g->ops->swiglu(b.g, gg, ug, n);
    char name[160];
    snprintf(name, sizeof name, "swiglu(n=%zu)", n);
    judge(name, gg, gc, n, 1e-9);
    untwin(&b, gc, gg);
    untwin(&b, uc, ug);
    pair_free(&b);
}

/* kv_store then attention for rows of several sequences.  seq_len[s] is
 * sequence s's length after this pass, new_rows[s] how many of its last
 * positions are rows of this pass (a prefill over a cached prefix: one
 * sequence, new < len; a decode step: new = 1 each). */
static void t_attention(const char *what, int32_t Hkv, int32_t group, int32_t hd, int32_t bs,
                        int32_t kvdt, int32_t window, int n_seq, const int32_t *seq_len,
                        const int32_t *new_rows)
{
    struct pair b = pair_new();
    struct kvr_kv_layout l = {0};
    l.n_layers = 1;
    l.n_kv_heads = Hkv;
    l.head_dim = hd;
    l.block_size = bs;
    l.dtype = kvdt;
    size_t esz = kvdt == 0 ? 4 : 2;
    int32_t nb = 0, n_rows = 0;
    for (int s = 0; s < n_seq; s++) {
        nb += (seq_len[s] + bs - 1) / bs;
        n_rows += new_rows[s];
    }
    size_t slab = (size_t)nb * 2 * (size_t)Hkv * (size_t)bs * (size_t)hd;
    void *cpool = rand_typed(slab, kvdt, 1.0f), *gpool = NULL;
    if (cudaMalloc(&gpool, slab * esz) != cudaSuccess ||
        cudaMemcpy(gpool, cpool, slab * esz, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc/cudaMemcpy of the pool failed\n");
        exit(1);
    }
    /* block tables: a random permutation of the pool's blocks */
    int32_t *perm = malloc((size_t)nb * 4);
    for (int32_t i = 0; i < nb; i++)
        perm[i] = i;
    for (int32_t i = nb - 1; i > 0; i--) {
        int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int32_t **btc = b.c->ops->alloc(b.c, (size_t)n_rows * sizeof(void *));
    const int32_t **btg = b.g->ops->alloc(b.g, (size_t)n_rows * sizeof(void *));
    int32_t *pc = b.c->ops->alloc(b.c, (size_t)n_rows * 4),
            *pg = b.g->ops->alloc(b.g, (size_t)n_rows * 4);
    int32_t r = 0, used = 0;
    for (int s = 0; s < n_seq; s++) {
        for (int32_t i = 0; i < new_rows[s]; i++, r++) {
            btc[r] = btg[r] = perm + used;
            pc[r] = pg[r] = seq_len[s] - new_rows[s] + i;
        }
        used += (seq_len[s] + bs - 1) / bs;
    }
    int32_t H = Hkv * group;
    float *kc, *kg, *vc, *vg, *qc, *qg, *oc, *og;
    twin(&b, (size_t)n_rows * Hkv * hd, &kc, &kg, true);
    twin(&b, (size_t)n_rows * Hkv * hd, &vc, &vg, true);
    twin(&b, (size_t)n_rows * H * hd, &qc, &qg, true);
    twin(&b, (size_t)n_rows * H * hd, &oc, &og, false);
    struct kvr_attn_args a = {.n_rows = n_rows,
                              .layout = &l,
                              .n_heads = H,
                              .window = window,
                              .scale = 1.0f / sqrtf((float)hd)};
    a.pos = pc;
    a.block_table = btc;
    a.layer_base = cpool;
    b.c->ops->kv_store(b.c, &a, kc, vc);
    b.c->ops->attention(b.c, &a, qc, oc);
    a.pos = pg;
    a.block_table = btg;
    a.layer_base = gpool;
    b.g->ops->kv_store(b.g, &a, kg, vg);
    b.g->ops->attention(b.g, &a, qg, og);
    char name[200];
    snprintf(name, sizeof name, "%s(Hkv=%d,group=%d,hd=%d,bs=%d,kv=%s,window=%d,rows=%d)", what,
             Hkv, group, hd, bs,
             kvdt == 0   ? "f32"
             : kvdt == 1 ? "bf16"
                         : "f16",
             window, n_rows);
    /* the KV store: the slabs byte for byte */
    void *back = malloc(slab * esz);
    if (cudaMemcpy(back, gpool, slab * esz, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "cudaMemcpy back failed\n");
        exit(1);
    }
    bool same = memcmp(back, cpool, slab * esz) == 0;
    printf("%-72s %s\n", "  kv_store: the slabs byte for byte", same ? "OK" : "FAIL");
    same ? n_ok++ : n_fail++;
    judge(name, og, oc, (size_t)n_rows * H * hd, 1e-9);
    free(back);
    untwin(&b, kc, kg);
    untwin(&b, vc, vg);
    untwin(&b, qc, qg);
    untwin(&b, oc, og);
    b.c->ops->free(b.c, (void *)btc);
    b.g->ops->free(b.g, (void *)btg);
    b.c->ops->free(b.c, pc);
    b.g->ops->free(b.g, pg);
    free(perm);
    free(cpool);
    cudaFree(gpool);
    pair_free(&b);
}

int main(void)
{
    char err[512];
    if (kvr_cuda_device_open(0, 0, err, sizeof err) != KVR_OK) {
        printf("SKIP: %s\n", err);
        return 77;
    }
    struct kvr_backend_params bp = params();
    if (kvr_cpu_ops.create(&bp, &g_pair.c) != KVR_OK ||
        kvr_cuda_ops.create(&bp, &g_pair.g) != KVR_OK) {
        fprintf(stderr, "cannot create the backends\n");
        return 1;
    }
    kvr_cuda_backend_set_profile(g_pair.g, true); /* each op synchronizes: outputs read at once */
    const int32_t dts[] = {KVR_DT_F32, KVR_DT_F16, KVR_DT_BF16};
    const int32_t mm[][3] = {{1, 64, 64},     {5, 192, 64},   {33, 64, 192},
                             {64, 1000, 128}, {300, 256, 96}, {1, 4096, 2048}};
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
            for (int v = 0; v < 4; v++)
                t_matmul(mm[i][0], mm[i][1], mm[i][2], dts[d], v & 1, v == 2, v == 3);
    /* logits-shaped: N beyond max_cols, y on the host, in column slices */
    t_matmul(3, 5000, 64, KVR_DT_BF16, false, false, true);
    t_matmul(2, 5000, 64, KVR_DT_F32, false, true, true);
    for (int d = 0; d < 3; d++) {
        t_embed(1, 100, 64, dts[d]);
        t_embed(17, 1000, 200, dts[d]);
    }
    t_rmsnorm(1, 64, false);
    t_rmsnorm(9, 2048, true);
    t_rmsnorm(64, 300, false);
    for (int k = 0; k < 3; k++) {
        t_rope(1, 4, 64, k);
        t_rope(7, 2, 128, k);
        t_rope(5, 3, 16, k);
    }
    t_swiglu(1);
    t_swiglu(100);
    t_swiglu(100003);
    const int32_t geo[][4] = {{2, 64, 16, 1}, {2, 64, 16, 2}, {1, 128, 8, 4},
                              {2, 80, 32, 7}, {8, 64, 16, 4}, {1, 256, 16, 2}};
    for (size_t gi = 0; gi < sizeof geo / sizeof geo[0]; gi++) {
        for (int32_t kvdt = 0; kvdt < 3; kvdt++) {
            for (int win = 0; win < 2; win++) {
                int32_t w = win ? 37 : 0;
                int32_t len1[] = {300}, new1[] = {100};
                t_attention("prefill+prefix", geo[gi][0], geo[gi][3], geo[gi][1], geo[gi][2], kvdt,
                            w, 1, len1, new1);
                int32_t len0[] = {77}, new0[] = {77};
                t_attention("prefill", geo[gi][0], geo[gi][3], geo[gi][1], geo[gi][2], kvdt, w, 1,
                            len0, new0);
                int32_t lend[] = {1, 17, 100, 257, 1000}, newd[] = {1, 1, 1, 1, 1};
                t_attention("decode", geo[gi][0], geo[gi][3], geo[gi][1], geo[gi][2], kvdt, w, 5,
                            lend, newd);
            }
        }
    }
    struct kvr_cuda_stats st;
    kvr_cuda_backend_stats(g_pair.g, &st);
    printf("cuda backend: %llu uploads (%llu bytes) for %zu read-only inputs\n",
           (unsigned long long)st.uploads, (unsigned long long)st.uploaded_bytes, g_n_keep);
    g_pair.c->ops->destroy(g_pair.c);
    g_pair.g->ops->destroy(g_pair.g);
    for (size_t i = 0; i < g_n_keep; i++)
        free(g_keep[i]);
    free(g_keep);
    printf("%d cases OK, %d FAILED\n", n_ok, n_fail);
    return n_fail ? 1 : 0;
}
