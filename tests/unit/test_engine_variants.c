/*
 * test_engine_variants.c - the CPU backend's kernel versions compute the
 * same bits.  The matmul and attention kernels are built for x86-64-v4
 * (AVX-512) and x86-64-v3 (AVX2+FMA) and one is picked at context creation
 * by the CPU; KVR_CPU_MATMUL=v3 takes v3 on a v4 CPU.  The nodes of one
 * cluster may run on either kind of machine, so the two must agree bit for
 * bit: here a context of each version prefills the same prompt (every
 * position's logits: the widened-panel matmul of many rows, prefill
 * attention) and runs decode steps of a batch of 3 sequences (the GEMV of
 * few rows, decode attention), and the logits and the KV pool are compared
 * with memcmp, on f32, bf16 and f16 weights, head_dim 64 (attention's
 * register-resident kernels) and 30 (padded tails), over f32, bf16 and f16
 * KV pools.  (The baseline version has no FMA and rounds differently: it is
 * not a cluster node's version, docs/engine.md.  Norms, SwiGLU and the
 * embedding are target_clones picked by the loader, the same in both runs.)
 *
 * numerics bf16dot (AVX512-BF16 vdpbf16ps, one version only: other bits
 * than these, test_engine_invariant checks its paths) is refused at context
 * creation, with an error naming avx512_bf16, where the kernels in use
 * lack it: KVR_CPU_MATMUL=v3 here, and on a CPU without the feature also
 * without it; never a silent fall-back to f32.
 *
 * Exits 77 on a CPU without both versions or in a build without them
 * (unoptimized: only the baseline is compiled).
 *
 *   test_engine_variants KVRAIL_MKMODEL
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_test_util.h"
#include "kvr_engine.h"
#include "kvr_test.h"

#define BS    TEST_SEQS_BS
#define NB    TEST_SEQS_NB
#define NP    TEST_SEQS_NP
#define NSEQ  TEST_SEQS_N
#define STEPS TEST_SEQS_STEPS

static void compare(const char *dir, const char *what)
{
    char err[512];
    kvr_model_t *m;
    KVR_CHECK_STATUS(kvr_model_load(dir, &m, err, sizeof(err)), KVR_OK);
    const int32_t V = kvr_model_vocab(m), L = kvr_model_n_layers(m);
    static const char *kvn[] = {"f32", "f16", "bf16"};
    for (int32_t dt = KVR_KV_F32; dt <= KVR_KV_BF16; dt++) {
        struct test_seqs a, b;
        unsetenv("KVR_CPU_MATMUL");
        test_seqs_run(m, dt, KVR_NUMERICS_F32, &a);
        setenv("KVR_CPU_MATMUL", "v3", 1);
        test_seqs_run(m, dt, KVR_NUMERICS_F32, &b);
        unsetenv("KVR_CPU_MATMUL");
        KVR_EXPECT(memcmp(a.prefill, b.prefill, (size_t)NP * (size_t)V * 4) == 0,
                   "%s, KV %s: prefill logits differ between the v4 and v3 kernels", what, kvn[dt]);
        KVR_EXPECT(memcmp(a.decode, b.decode, (size_t)STEPS * NSEQ * (size_t)V * 4) == 0,
                   "%s, KV %s: decode logits differ between the v4 and v3 kernels", what, kvn[dt]);
        int kv_same = 1;
        for (int32_t l = 0; l < L; l++)
            kv_same &= memcmp(a.pool.layer_base[l], b.pool.layer_base[l],
                              kvr_kv_layer_bytes(&a.pool.layout, NSEQ * NB)) == 0;
        KVR_EXPECT(kv_same, "%s, KV %s: the KV pools differ between the v4 and v3 kernels", what,
                   kvn[dt]);
        /* the decode logits are not all alike (the comparison means something) */
        KVR_EXPECT(memcmp(a.decode, a.decode + V, (size_t)V * 4) != 0,
                   "%s: two sequences' decode logits are equal", what);
        test_seqs_free(&a, L);
        test_seqs_free(&b, L);
    }
    kvr_model_destroy(m);
}

/* Prompts of every length 1..MAXM (the matmul at M = 1..MAXM: each x-row
 * tile shape and tail of the v3 kernels, widened and not), every
 * position's logits, v4 against v3. */
#define MAXM 36

static void prefill_lengths(const char *dir, const char *what)
{
    char err[512];
    kvr_model_t *m;
    KVR_CHECK_STATUS(kvr_model_load(dir, &m, err, sizeof(err)), KVR_OK);
    const int32_t V = kvr_model_vocab(m), L = kvr_model_n_layers(m);
    struct kvr_ctx_opts o = {.n_threads = 2, .max_tokens = 64, .max_batch = 1};
    kvr_ctx_t *ctx[2];
    struct kvr_kv_pool pool[2];
    float *lg[2], *last = malloc((size_t)V * 4);
    KVR_CHECK(last);
    for (int v = 0; v < 2; v++) {
        if (v)
            setenv("KVR_CPU_MATMUL", "v3", 1);
        KVR_CHECK_STATUS(kvr_ctx_create(m, &o, &ctx[v], err, sizeof(err)), KVR_OK);
        unsetenv("KVR_CPU_MATMUL");
        test_pool_init_dt(m, BS, L, &pool[v], NB, KVR_KV_F32);
        lg[v] = malloc((size_t)MAXM * (size_t)V * 4);
        KVR_CHECK(lg[v]);
    }
    int32_t bt[NB];
    for (int b = 0; b < NB; b++)
        bt[b] = b;
    int same = 0;
    for (int32_t n = 1; n <= MAXM; n++) {
        int32_t t[MAXM];
        test_tokens(t, n, 200u + (unsigned)n, V);
        for (int v = 0; v < 2; v++) {
            struct kvr_prefill_req r = {
                .tokens = t, .n_tokens = n, .block_table = bt, .n_blocks = NB, .all_logits = lg[v]};
            KVR_CHECK_STATUS(kvr_engine_prefill(ctx[v], &pool[v], &r, last), KVR_OK);
        }
        int eq = memcmp(lg[0], lg[1], (size_t)n * (size_t)V * 4) == 0;
        KVR_EXPECT(eq, "%s: prefill of %d tokens: logits differ between the v4 and v3 kernels",
                   what, n);
        same += eq;
    }
    printf("%s: prefill of 1..%d tokens, v4 == v3 at %d lengths\n", what, MAXM, same);
    for (int v = 0; v < 2; v++) {
        kvr_ctx_destroy(ctx[v]);
        test_pool_free(&pool[v], L);
        free(lg[v]);
    }
    free(last);
    kvr_model_destroy(m);
}

/* numerics bf16dot where the kernels in use have no AVX512-BF16: refused */
static void numerics_refusal(const char *dir)
{
    char err[512] = "";
    kvr_model_t *m;
    kvr_ctx_t *ctx = NULL;
    KVR_CHECK_STATUS(kvr_model_load(dir, &m, err, sizeof(err)), KVR_OK);
    struct kvr_ctx_opts o = {.n_threads = 1, .numerics = KVR_NUMERICS_BF16DOT};
    setenv("KVR_CPU_MATMUL", "v3", 1);
    kvr_status_t st = kvr_ctx_create(m, &o, &ctx, err, sizeof(err));
    unsetenv("KVR_CPU_MATMUL");
    printf("numerics bf16dot with the v3 kernels: %s\n", err);
    KVR_EXPECT(st == KVR_ERR_UNSUPPORTED && !ctx, "bf16dot on v3 kernels: status %d, not refused",
               st);
    KVR_EXPECT(strstr(err, "numerics bf16dot") && strstr(err, "avx512_bf16"),
               "the refusal does not name the mode and avx512_bf16: %s", err);
    err[0] = 0;
    st = kvr_ctx_create(m, &o, &ctx, err, sizeof(err));
    if (__builtin_cpu_supports("avx512bf16")) {
        KVR_EXPECT(st == KVR_OK, "bf16dot on this avx512_bf16 CPU refused: %s", err);
    } else {
        printf("numerics bf16dot on this CPU (no avx512_bf16): %s\n", err);
        KVR_EXPECT(st == KVR_ERR_UNSUPPORTED && strstr(err, "avx512_bf16"),
                   "bf16dot on a CPU without avx512_bf16: status %d, %s", st, err);
    }
    kvr_ctx_destroy(ctx);
    ctx = NULL;
    o.numerics = 7;
    KVR_EXPECT(kvr_ctx_create(m, &o, &ctx, err, sizeof(err)) == KVR_ERR_INVALID && !ctx,
               "numerics 7 accepted");
    kvr_model_destroy(m);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        KVR_SKIP("usage: test_engine_variants KVRAIL_MKMODEL");
#if !defined(__OPTIMIZE__) || !defined(__x86_64__) || !defined(__GNUC__) || defined(__clang__)
    KVR_SKIP("the v4/v3 kernel versions are built only by GCC with optimization on x86-64");
#else
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("x86-64-v4"))
        KVR_SKIP("this CPU has no x86-64-v4 (AVX-512): only one kernel version can run");
    static const struct {
        const char *args, *what;
    } models[] = {
        {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 256 "
         "--vocab 300 --seed 21",
         "llama f32, head_dim 64"},
        {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 256 "
         "--vocab 300 --dtype bf16 --seed 22",
         "llama bf16, head_dim 64"},
        {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 256 "
         "--vocab 300 --dtype f16 --seed 23",
         "llama f16, head_dim 64"},
        {"--arch qwen2 --layers 2 --hidden 120 --heads 4 --kv-heads 2 --intermediate 200 "
         "--vocab 300 --dtype f16 --seed 24",
         "qwen2 f16, head_dim 30"},
        /* K = 347 (odd; past the v3 prefill kernel's 256-element K blocks,
         * a tail of 11: one half whole, the other 3 lanes) and N = 301
         * (single-row panels), in each weight dtype */
        {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 347 "
         "--vocab 301 --seed 25",
         "llama f32, K 347, N 301"},
        {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 347 "
         "--vocab 301 --dtype bf16 --seed 26",
         "llama bf16, K 347, N 301"},
        {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 347 "
         "--vocab 301 --dtype f16 --seed 27",
         "llama f16, K 347, N 301"},
    };
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
        char d[512], cmd[8192];
        KVR_CHECK(kvr_test_mkdtemp(d, sizeof d, "kvr-test-engine-var"));
        snprintf(cmd, sizeof(cmd), "%s --out %s %s >/dev/null", argv[1], d, models[i].args);
        KVR_CHECK(system(cmd) == 0);
        compare(d, models[i].what);
        if (i >= 3)
            prefill_lengths(d, models[i].what);
        if (i == 1)
            numerics_refusal(d);
        kvr_test_rmtree(d);
    }
    return kvr_test_fails ? 1 : 0;
#endif
}
