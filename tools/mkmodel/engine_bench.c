/*
 * engine_bench.c - kvrail-engine-bench, the engine half of tools/bench-engine:
 * times prefill and batched decode on a model directory, and OpenBLAS's own
 * sgemm, printing one JSON object per line.  Best of --reps repetitions.
 *
 *   kvrail-engine-bench prefill MODEL N_TOKENS [REPS] [THREADS]
 *   kvrail-engine-bench decode  MODEL BATCH CONTEXT STEPS [REPS] [THREADS]
 *   kvrail-engine-bench sgemm   M N K [REPS]
 *   kvrail-engine-bench readbw  MODEL [REPS]
 *   kvrail-engine-bench peak    [REPS]
 *
 * KVR_NUMERICS=f32|bf16dot in the environment: the contexts' numerics mode
 * (kvr_ctx_opts.numerics; bf16dot fails on a CPU without AVX512-BF16).
 * KVR_KV_DTYPE=f32|bf16|f16: the KV pool's dtype (default f32; llama.cpp's
 * KV cache is f16 by default).
 * Prefill and decode also print cpu_s / tok_cpu_s: the process CPU time of
 * the best repetition (by CPU time), which a process descheduled on a
 * loaded machine does not inflate (one thread: the comparable figure).
 * Decode also prints weight_gb_s: the model's weight bytes (every matrix
 * is read once a step) per second of the best repetition.  readbw: one
 * thread summing a buffer of the model's weight bytes (the bandwidth a
 * decode step could reach), best of REPS, in GB/s.  peak: one thread's
 * f32 FMA and bf16 vdpbf16ps GFLOP/s from registers (the compute bound of
 * prefill and batched decode; x86-64-v4 only).
 */
#include <time.h>
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_clock.h"
#include "kvr_compute_backend.h"
#include "kvr_engine.h"

#define BS 16

static kvr_model_t *load(const char *dir)
{
    char err[512];
    kvr_model_t *m;
    if (kvr_model_load(dir, &m, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail-engine-bench: %s\n", err);
        exit(1);
    }
    return m;
}

static kvr_ctx_t *ctx_new(kvr_model_t *m, int threads, int batch, int tokens)
{
    char err[512];
    kvr_ctx_t *c;
    struct kvr_ctx_opts o = {.n_threads = threads, .max_batch = batch, .max_tokens = tokens};
    const char *num = getenv("KVR_NUMERICS");
    if (num && num[0] && kvr_numerics_parse(num, &o.numerics) != KVR_OK) {
        fprintf(stderr, "kvrail-engine-bench: KVR_NUMERICS=%s is not f32 or bf16dot\n", num);
        exit(1);
    }
    if (kvr_ctx_create(m, &o, &c, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail-engine-bench: %s\n", err);
        exit(1);
    }
    return c;
}

static void pool_new(kvr_model_t *m, int n_blocks, struct kvr_kv_pool *p)
{
    int32_t dt = KVR_KV_F32;
    const char *kvd = getenv("KVR_KV_DTYPE");
    if (kvd && kvd[0] && kvr_kv_dtype_parse(kvd, &dt) != KVR_OK) {
        fprintf(stderr, "kvrail-engine-bench: KVR_KV_DTYPE=%s is not f32, bf16 or f16\n", kvd);
        exit(1);
    }
    kvr_kv_layout_init(m, BS, dt, &p->layout);
    p->n_blocks = n_blocks;
    int L = kvr_model_n_layers(m);
    p->layer_base = calloc((size_t)L, sizeof(*p->layer_base));
    /* touched now, as a node prefaults its pool: no page faults in the
     * timed steps (decode writes a new block every few tokens) */
    for (int l = 0; l < L; l++) {
        size_t b = kvr_kv_layer_bytes(&p->layout, n_blocks);
        p->layer_base[l] = malloc(b);
        memset(p->layer_base[l], 0, b);
    }
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fill_tokens(int32_t *t, int n, int32_t V, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)((seed >> 8) % (unsigned)V);
    }
}

static int bench_prefill(const char *dir, int n, int reps, int threads)
{
    kvr_model_t *m = load(dir);
    kvr_ctx_t *c = ctx_new(m, threads, 1, 0);
    int nb = (n + BS - 1) / BS;
    struct kvr_kv_pool p;
    pool_new(m, nb, &p);
    int32_t *t = malloc((size_t)n * 4), *bt = malloc((size_t)nb * 4);
    float *lg = malloc((size_t)kvr_model_vocab(m) * 4);
    fill_tokens(t, n, kvr_model_vocab(m), 1);
    for (int i = 0; i < nb; i++)
        bt[i] = i;
    struct kvr_prefill_req r = {.tokens = t, .n_tokens = n, .block_table = bt, .n_blocks = nb};
    double best = 1e30, best_cpu = 1e30;
    for (int i = 0; i < reps; i++) {
        uint64_t t0 = kvr_now_ns();
        double c0 = cpu_now();
        if (kvr_engine_prefill(c, &p, &r, lg) != KVR_OK)
            return 1;
        double s = (double)(kvr_now_ns() - t0) / 1e9, cs = cpu_now() - c0;
        if (s < best)
            best = s;
        if (cs < best_cpu)
            best_cpu = cs;
    }
    /* matmul flops: 2 * tokens * (layer matrices) + the last row's lm_head */
    double d = kvr_model_hidden(m), f = kvr_model_intermediate(m);
    double qd = (double)kvr_model_n_heads(m) * kvr_model_head_dim(m),
           kd = (double)kvr_model_n_kv_heads(m) * kvr_model_head_dim(m);
    double per_tok = 2.0 * kvr_model_n_layers(m) * (d * qd * 2 + d * kd * 2 + 3 * d * f);
    double flops = per_tok * n + 2.0 * d * kvr_model_vocab(m);
    printf("{\"mode\": \"prefill\", \"tokens\": %d, \"seconds\": %.6f, \"tok_s\": %.1f, "
           "\"matmul_gflops\": %.2f, \"cpu_s\": %.6f, \"tok_cpu_s\": %.1f}\n",
           n, best, n / best, flops / best / 1e9, best_cpu, n / best_cpu);
    return 0;
}

/* bytes of the weights a decode step reads: every parameter once */
static double weight_bytes(const kvr_model_t *m)
{
    return (double)kvr_model_n_params(m) * (strcmp(kvr_model_dtype(m), "f32") ? 2 : 4);
}

typedef float v16 __attribute__((vector_size(64)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "default")))
#endif
static float
sum_bytes(const v16 *buf, size_t n)
{
    v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i + 4 <= n; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
    }
    v16 s = s0 + s1 + s2 + s3;
    return s[0];
}

/* One thread summing weight_bytes(model) bytes in 64-byte vectors, 4
 * independent sums: the read bandwidth a decode step could have. */
static int bench_readbw(const char *dir, int reps)
{
    kvr_model_t *m = load(dir);
    size_t n = (size_t)weight_bytes(m) / 64;
    v16 *buf = aligned_alloc(64, n * 64);
    if (!buf)
        return 1;
    memset(buf, 0, n * 64);
    double best = 1e30, best_cpu = 1e30;
    float keep = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = kvr_now_ns();
        double c0 = cpu_now();
        keep += sum_bytes(buf, n);
        double s = (double)(kvr_now_ns() - t0) / 1e9, cs = cpu_now() - c0;
        if (s < best)
            best = s;
        if (cs < best_cpu)
            best_cpu = cs;
    }
    printf("{\"mode\": \"readbw\", \"bytes\": %zu, \"seconds\": %.6f, \"gb_s\": %.2f, "
           "\"cpu_s\": %.6f, \"gb_cpu_s\": %.2f, \"check\": %g}\n",
           n * 64, best, (double)(n * 64) / best / 1e9, best_cpu, (double)(n * 64) / best_cpu / 1e9,
           (double)keep);
    free(buf);
    return 0;
}

static int bench_decode(const char *dir, int B, int ctxlen, int steps, int reps, int threads)
{
    kvr_model_t *m = load(dir);
    kvr_ctx_t *c = ctx_new(m, threads, B, 0);
    int nb1 = (ctxlen + steps * reps + BS) / BS;
    struct kvr_kv_pool p;
    pool_new(m, nb1 * B, &p);
    int32_t V = kvr_model_vocab(m);
    int32_t *t = malloc((size_t)ctxlen * 4), *bt = malloc((size_t)nb1 * (size_t)B * 4);
    float *lg = malloc((size_t)V * 4 * (size_t)B);
    for (int i = 0; i < nb1 * B; i++)
        bt[i] = i;
    for (int s = 0; s < B; s++) {
        fill_tokens(t, ctxlen, V, 7u + (unsigned)s);
        struct kvr_prefill_req r = {
            .tokens = t, .n_tokens = ctxlen, .block_table = bt + s * nb1, .n_blocks = nb1};
        if (kvr_engine_prefill(c, &p, &r, lg) != KVR_OK)
            return 1;
    }
    struct kvr_decode_seq *q = calloc((size_t)B, sizeof(*q));
    int pos = ctxlen;
    double best = 1e30, best_cpu = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        uint64_t t0 = kvr_now_ns();
        double c0 = cpu_now();
        for (int st = 0; st < steps; st++, pos++) {
            for (int s = 0; s < B; s++)
                q[s] = (struct kvr_decode_seq){.token = (pos * 31 + s) % V,
                                               .pos = pos,
                                               .block_table = bt + s * nb1,
                                               .n_blocks = nb1};
            if (kvr_engine_decode(c, &p, q, B, lg) != KVR_OK)
                return 1;
        }
        double s = (double)(kvr_now_ns() - t0) / 1e9, cs = cpu_now() - c0;
        if (s < best)
            best = s;
        if (cs < best_cpu)
            best_cpu = cs;
    }
    double wbytes = weight_bytes(m);
    printf("{\"mode\": \"decode\", \"batch\": %d, \"context\": %d, \"steps\": %d, \"seconds\": "
           "%.6f, \"tok_s\": %.1f, \"step_ms\": %.3f, \"cpu_s\": %.6f, \"tok_cpu_s\": %.1f, "
           "\"weight_gb_s\": %.2f, \"weight_gb_cpu_s\": %.2f}\n",
           B, ctxlen, steps, best, (double)B * steps / best, best / steps * 1e3, best_cpu,
           (double)B * steps / best_cpu, wbytes * steps / best / 1e9,
           wbytes * steps / best_cpu / 1e9);
    return 0;
}

static int bench_sgemm(int M, int N, int K, int reps)
{
    float *a = malloc((size_t)M * (size_t)K * 4), *b = malloc((size_t)N * (size_t)K * 4),
          *cc = malloc((size_t)M * (size_t)N * 4);
    for (size_t i = 0; i < (size_t)M * (size_t)K; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)N * (size_t)K; i++)
        b[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = kvr_now_ns();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, cc,
                    N);
        double s = (double)(kvr_now_ns() - t0) / 1e9;
        if (s < best)
            best = s;
    }
    printf("{\"mode\": \"sgemm\", \"M\": %d, \"N\": %d, \"K\": %d, \"gflops\": %.2f}\n", M, N, K,
           2.0 * M * N * K / best / 1e9);
    return 0;
}

/* The CPU backend's matmul (GEMV kernel up to its M threshold, sgemm above)
 * on an f32 weight, beside raw sgemm on the same operands. */
static int bench_matmul(int M, int N, int K, int reps, int threads, int gemv_max)
{
    struct kvr_backend_params bp = {.n_threads = threads,
                                    .max_rows = M,
                                    .max_cols = K,
                                    .max_seq_len = 16,
                                    .max_head_dim = 64,
                                    .gemv_max_rows = gemv_max};
    struct kvr_compute_backend *be;
    if (kvr_cpu_ops.create(&bp, &be) != KVR_OK)
        return 1;
    float *x = malloc((size_t)M * (size_t)K * 4), *w = malloc((size_t)N * (size_t)K * 4),
          *y = malloc((size_t)M * (size_t)N * 4);
    for (size_t i = 0; i < (size_t)M * (size_t)K; i++)
        x[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)N * (size_t)K; i++)
        w[i] = (float)(i % 5) * 0.1f;
    struct kvr_weight wt = {.data = w, .dtype = KVR_DT_F32, .rows = N, .cols = K};
    double best = 1e30, best_cpu = 1e30, best_blas = 1e30;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = kvr_now_ns();
        double c0 = cpu_now();
        kvr_cpu_ops.matmul(be, y, x, M, &wt, NULL, 0);
        double s = (double)(kvr_now_ns() - t0) / 1e9, cs = cpu_now() - c0;
        if (s < best)
            best = s;
        if (cs < best_cpu)
            best_cpu = cs;
        t0 = kvr_now_ns();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
        s = (double)(kvr_now_ns() - t0) / 1e9;
        if (s < best_blas)
            best_blas = s;
    }
    printf("{\"mode\": \"matmul\", \"M\": %d, \"N\": %d, \"K\": %d, \"gflops\": %.2f, "
           "\"gflops_cpu\": %.2f, \"sgemm_gflops\": %.2f}\n",
           M, N, K, 2.0 * M * N * K / best / 1e9, 2.0 * M * N * K / best_cpu / 1e9,
           2.0 * M * N * K / best_blas / 1e9);
    kvr_cpu_ops.destroy(be);
    return 0;
}

/* peak: one thread's arithmetic bound from registers, no memory: f32 FMA
 * on 16-lane vectors (12 independent accumulators, more than the FMA
 * latency times the pipes) and, where the CPU has AVX512-BF16, vdpbf16ps
 * (32 products and 32 adds an instruction, 12 accumulators).  GFLOP/s per
 * CPU second and wall, best of REPS. */
#define PEAK_ACC 12

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
/* 12 accumulators as named registers (an array of them was kept in
 * memory, a store and a reload per FMA); the empty asm after each step
 * keeps the compiler from folding the loop. */
#define PEAK_STEP(OP)                                                                              \
    do {                                                                                           \
        a0 = OP(a0), a1 = OP(a1), a2 = OP(a2), a3 = OP(a3), a4 = OP(a4), a5 = OP(a5);              \
        a6 = OP(a6), a7 = OP(a7), a8 = OP(a8), a9 = OP(a9), a10 = OP(a10), a11 = OP(a11);          \
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));         \
        __asm__ volatile("" : "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));       \
    } while (0)
#define PEAK_SUM (((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + ((a8 + a9) + (a10 + a11)))

__attribute__((target("arch=x86-64-v4"))) static float peak_fma(long iters, float m, float c)
{
    __m512 vm = _mm512_set1_ps(m), vc = _mm512_set1_ps(c);
    __m512 a0 = _mm512_set1_ps(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, a9 = a0, a10 = a0, a11 = a0;
#define FMA(x) _mm512_fmadd_ps(x, vm, vc)
    for (long it = 0; it < iters; it++)
        PEAK_STEP(FMA);
#undef FMA
    return _mm512_reduce_add_ps(PEAK_SUM);
}

__attribute__((target("arch=x86-64-v4,avx512bf16"))) static float peak_dp(long iters)
{
    __m512bh va = (__m512bh)_mm512_set1_epi16(0x3a83), vb = (__m512bh)_mm512_set1_epi16(0x3c00);
    __m512 a0 = _mm512_set1_ps(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, a9 = a0, a10 = a0, a11 = a0;
#define DP(x) _mm512_dpbf16_ps(x, va, vb)
    for (long it = 0; it < iters; it++)
        PEAK_STEP(DP);
#undef DP
    return _mm512_reduce_add_ps(PEAK_SUM);
}

static int bench_peak(int reps)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("x86-64-v4")) {
        fprintf(stderr, "kvrail-engine-bench peak: needs an x86-64-v4 (AVX-512) CPU\n");
        return 1;
    }
    const long iters = 20000000;
    double best[2] = {1e30, 1e30}, best_cpu[2] = {1e30, 1e30};
    int have_dp = __builtin_cpu_supports("avx512bf16");
    float keep = 0;
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 1 + have_dp; k++) {
            uint64_t t0 = kvr_now_ns();
            double c0 = cpu_now();
            keep += k ? peak_dp(iters) : peak_fma(iters, 0.5f, 1.0f);
            double s = (double)(kvr_now_ns() - t0) / 1e9, cs = cpu_now() - c0;
            if (s < best[k])
                best[k] = s;
            if (cs < best_cpu[k])
                best_cpu[k] = cs;
        }
    }
    /* an f32 FMA: 16 lanes x 2 flops; vdpbf16ps: 32 products + 32 adds */
    double f_fma = (double)iters * PEAK_ACC * 32, f_dp = (double)iters * PEAK_ACC * 64;
    printf("{\"mode\": \"peak\", \"f32_fma_gflops\": %.2f, \"f32_fma_gflops_cpu\": %.2f, ",
           f_fma / best[0] / 1e9, f_fma / best_cpu[0] / 1e9);
    if (have_dp)
        printf("\"bf16_dp_gflops\": %.2f, \"bf16_dp_gflops_cpu\": %.2f, ", f_dp / best[1] / 1e9,
               f_dp / best_cpu[1] / 1e9);
    printf("\"check\": %g}\n", (double)keep);
    return 0;
}
#endif

int main(int argc, char **argv)
{
    if (argc >= 5 && strcmp(argv[1], "matmul") == 0)
        return bench_matmul(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]),
                            argc > 5 ? atoi(argv[5]) : 20, argc > 6 ? atoi(argv[6]) : 2,
                            argc > 7 ? atoi(argv[7]) : 64);
    if (argc >= 4 && strcmp(argv[1], "prefill") == 0)
        return bench_prefill(argv[2], atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 3,
                             argc > 5 ? atoi(argv[5]) : 0);
    if (argc >= 6 && strcmp(argv[1], "decode") == 0)
        return bench_decode(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
                            argc > 6 ? atoi(argv[6]) : 3, argc > 7 ? atoi(argv[7]) : 0);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if (argc >= 2 && strcmp(argv[1], "peak") == 0)
        return bench_peak(argc > 2 ? atoi(argv[2]) : 3);
#endif
    if (argc >= 3 && strcmp(argv[1], "readbw") == 0)
        return bench_readbw(argv[2], argc > 3 ? atoi(argv[3]) : 5);
    if (argc >= 5 && strcmp(argv[1], "sgemm") == 0)
        return bench_sgemm(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]),
                           argc > 5 ? atoi(argv[5]) : 5);
    fprintf(stderr, "usage: kvrail-engine-bench prefill MODEL N [REPS] [THREADS]\n"
                    "       kvrail-engine-bench decode MODEL BATCH CONTEXT STEPS [REPS] "
                    "[THREADS]\n"
                    "       kvrail-engine-bench sgemm M N K [REPS]\n"
                    "       kvrail-engine-bench readbw MODEL [REPS]\n"
                    "       kvrail-engine-bench peak [REPS]\n");
    return 2;
}
