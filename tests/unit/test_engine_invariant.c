/*
 * test_engine_invariant.c - every engine path gives the same bits for the
 * same sequence.  The reference is one full prefill of a sequence of N
 * tokens with every position's logits (all_logits) and its K/V.  Against it,
 * memcmp-equal, no tolerance:
 *  - chunked prefill (max_tokens 1, 7, 64, 512): every position's logits
 *    and the K/V;
 *  - prefill continuing from a cached prefix of every length 0..N-1 (ending
 *    on a block boundary or mid-block): the logits of the new positions;
 *  - batched prefill (kvr_engine_prefill_batch) with the sequence among
 *    2..36 others of mixed lengths and cached prefixes, at each position of
 *    the batch: its last logits and K/V;
 *  - a decode step of the sequence's next token alone and in batches of
 *    2..36 (other sequences at other lengths; every slot of a batch of 8,
 *    the ends and middle of others): the logits equal the (N+1)-token
 *    prefill's last row.
 * On Llama models stored in f32, bf16 and f16, and a Qwen2 one (biases), a
 * sliding-window Mistral one, and head_dim / hidden not multiples of 16
 * (the kernels' padded tails), head_dim 64 and 128 (attention's
 * register-resident kernels); each over KV pools of f32, bf16 and f16
 * (bf16 / f16 KV: logits close to the f32 KV's, not equal).
 *
 *   test_engine_invariant KVRAIL_MKMODEL
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_engine.h"
#include "kvr_test.h"
#include "engine_test_util.h"

#define BS   8
#define N    48 /* the sequence under test */
#define NB   8  /* blocks a sequence: up to 64 positions */
#define NOTH 36 /* other sequences */
#define NBLK ((NOTH + 1) * NB)

static kvr_model_t *model;
static int32_t V, L;
static int32_t seq[N + 1];
static int32_t oth[NOTH][N];
static int32_t oth_len[NOTH], oth_cached[NOTH];
static int32_t bt[NOTH + 1][NB]; /* bt[0]: the sequence under test */
static float *ref;               /* [N + 1][V] logits of the full prefill of N + 1 tokens */
static float *ref_f32;           /* ref of the same model with an f32 KV pool */
static struct kvr_kv_pool ref_pool;
static int32_t numerics; /* enum kvr_numerics of every context */

static void tokens(int32_t *t, int n, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)((seed >> 8) % (unsigned)V);
    }
}

static kvr_ctx_t *ctx_new(int32_t max_tokens, int32_t threads)
{
    char err[512];
    kvr_ctx_t *ctx;
    struct kvr_ctx_opts o = {
        .n_threads = threads, .max_tokens = max_tokens, .max_batch = 64, .numerics = numerics};
    KVR_CHECK_STATUS(kvr_ctx_create(model, &o, &ctx, err, sizeof(err)), KVR_OK);
    return ctx;
}

static void prefill(kvr_ctx_t *ctx, struct kvr_kv_pool *p, const int32_t *t, int32_t n,
                    int32_t cached, const int32_t *table, float *all, float *last)
{
    struct kvr_prefill_req r = {.tokens = t,
                                .n_tokens = n,
                                .n_cached = cached,
                                .block_table = table,
                                .n_blocks = NB,
                                .all_logits = all};
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, p, &r, last), KVR_OK);
}

/* the K/V of the sequence under test's first n positions, as in ref_pool */
static int kv_equal(const struct kvr_kv_pool *p, int32_t n)
{
    const struct kvr_kv_layout *l = &p->layout;
    for (int32_t layer = 0; layer < L; layer++)
        for (int32_t t = 0; t < n; t++)
            for (int kv = 0; kv < 2; kv++)
                for (int32_t h = 0; h < l->n_kv_heads; h++) {
                    int32_t blk = bt[0][t / BS];
                    if (memcmp(kvr_kv_ptr(l, p->layer_base[layer], blk, kv, h, t % BS),
                               kvr_kv_ptr(l, ref_pool.layer_base[layer], blk, kv, h, t % BS),
                               (size_t)l->head_dim * kvr_kv_dtype_size(l->dtype)) != 0)
                        return 0;
                }
    return 1;
}

static int rows_equal(const float *a, int32_t pos0, int32_t n)
{
    return memcmp(a, ref + (size_t)pos0 * (size_t)V, (size_t)n * (size_t)V * 4) == 0;
}

static void pool_clear(struct kvr_kv_pool *p)
{
    for (int l = 0; l < L; l++)
        memset(p->layer_base[l], 0, kvr_kv_layer_bytes(&p->layout, NBLK));
}

static void run_model(const char *dir, const char *what, int32_t kv_dt)
{
    char err[512];
    KVR_CHECK_STATUS(kvr_model_load(dir, &model, err, sizeof(err)), KVR_OK);
    V = kvr_model_vocab(model);
    L = kvr_model_n_layers(model);
    tokens(seq, N + 1, 7u);
    for (int s = 0; s <= NOTH; s++)
        for (int i = 0; i < NB; i++)
            bt[s][i] = s + (NOTH + 1) * i; /* interleaved across sequences */
    for (int s = 0; s < NOTH; s++) {
        oth_len[s] = 1 + (s * 7) % 13;
        oth_cached[s] = s % 3 == 0 ? 0 : (s * 5) % oth_len[s];
        tokens(oth[s], oth_len[s], 1000u + (unsigned)s);
    }
    ref = malloc((size_t)(N + 1) * (size_t)V * 4);
    float *lg = malloc((size_t)(N + 1) * (size_t)V * 4);
    float *last = malloc((size_t)(NOTH + 1) * (size_t)V * 4);
    KVR_CHECK(ref && lg && last);
    struct kvr_kv_pool pool;
    test_pool_init_dt(model, BS, L, &ref_pool, NBLK, kv_dt);
    test_pool_init_dt(model, BS, L, &pool, NBLK, kv_dt);

    /* the reference: one prefill of all N + 1 tokens, one chunk */
    kvr_ctx_t *ctx = ctx_new(512, 2);
    prefill(ctx, &ref_pool, seq, N + 1, 0, bt[0], ref, last);
    KVR_CHECK(rows_equal(last, N, 1));
    size_t nl = (size_t)(N + 1) * (size_t)V;
    if (numerics != KVR_NUMERICS_F32 && kv_dt == KVR_KV_F32) {
        /* the mode really computes other bits, close to f32's */
        int32_t saved = numerics;
        numerics = KVR_NUMERICS_F32;
        kvr_ctx_t *cf = ctx_new(512, 2);
        numerics = saved;
        pool_clear(&pool);
        prefill(cf, &pool, seq, N + 1, 0, bt[0], lg, last);
        kvr_ctx_destroy(cf);
        float e = 0, mx = 0;
        for (size_t i = 0; i < nl; i++) {
            float d = ref[i] - lg[i];
            e = d > e ? d : -d > e ? -d : e;
            mx = lg[i] > mx ? lg[i] : -lg[i] > mx ? -lg[i] : mx;
        }
        printf("%s, numerics %s: max |logit - f32 numerics'| %.2e (|logit| up to %.2f)\n", what,
               kvr_numerics_name(numerics), (double)e, (double)mx);
        KVR_CHECK(e > 0 && e < 0.02f * mx);
    }
    if (kv_dt == KVR_KV_F32) {
        free(ref_f32);
        ref_f32 = malloc(nl * 4);
        KVR_CHECK(ref_f32 != NULL);
        memcpy(ref_f32, ref, nl * 4);
    } else { /* the rounded K/V are used, and stay close */
        float e = 0, mx = 0;
        for (size_t i = 0; i < nl; i++) {
            float d = ref[i] - ref_f32[i];
            e = d > e ? d : -d > e ? -d : e;
            mx = ref_f32[i] > mx ? ref_f32[i] : -ref_f32[i] > mx ? -ref_f32[i] : mx;
        }
        printf("%s, kv %s: max |logit - f32 KV's| %.2e (|logit| up to %.2f)\n", what,
               kvr_kv_dtype_name(kv_dt), (double)e, (double)mx);
        KVR_CHECK(e > 0 && e < 0.02f * mx);
    }

    /* chunked prefill: every position's logits, and the K/V */
    static const int32_t chunks[] = {1, 7, 64, 512};
    for (size_t ci = 0; ci < sizeof(chunks) / sizeof(chunks[0]); ci++) {
        kvr_ctx_t *cc = ctx_new(chunks[ci], 2);
        pool_clear(&pool);
        prefill(cc, &pool, seq, N + 1, 0, bt[0], lg, last);
        if (!rows_equal(lg, 0, N + 1))
            printf("%s: chunk size %d: logits differ\n", what, chunks[ci]);
        KVR_CHECK(rows_equal(lg, 0, N + 1));
        KVR_CHECK(kv_equal(&pool, N + 1));
        kvr_ctx_destroy(cc);
    }

    /* a cached prefix of every length k: the new positions' logits */
    for (int32_t k = 0; k < N; k++) {
        pool_clear(&pool);
        if (k > 0)
            prefill(ctx, &pool, seq, k, 0, bt[0], NULL, last);
        prefill(ctx, &pool, seq, N, k, bt[0], lg, last);
        if (!rows_equal(lg, k, N - k))
            printf("%s: prefix of %d cached: logits differ\n", what, k);
        KVR_CHECK(rows_equal(lg, k, N - k));
        KVR_CHECK(kv_equal(&pool, N));
    }

    /* batched prefill: the sequence (N tokens, some cached) among
     * others, in several batch sizes and slots */
    static const int32_t bsz[][2] = {{2, 0}, {2, 1}, {5, 3}, {8, 7}, {17, 4}, {36, 0}, {37, 36}};
    for (size_t bi = 0; bi < sizeof(bsz) / sizeof(bsz[0]); bi++) {
        int32_t n = bsz[bi][0], slot = bsz[bi][1], cached = (int32_t)(bi * 9) % N;
        struct kvr_prefill_seq ss[NOTH + 1];
        pool_clear(&pool);
        for (int32_t i = 0, o = 0; i < n; i++) {
            if (i == slot) {
                ss[i] = (struct kvr_prefill_seq){seq, N, cached, bt[0], NB};
                continue;
            }
            ss[i] = (struct kvr_prefill_seq){oth[o], oth_len[o], oth_cached[o], bt[o + 1], NB};
            o++;
        }
        for (int32_t i = 0; i < n; i++)
            if (ss[i].n_cached > 0)
                prefill(ctx, &pool, ss[i].tokens, ss[i].n_cached, 0, ss[i].block_table, NULL, last);
        KVR_CHECK_STATUS(kvr_engine_prefill_batch(ctx, &pool, ss, (size_t)n, NULL, NULL, last),
                         KVR_OK);
        if (!rows_equal(last + (size_t)slot * (size_t)V, N - 1, 1))
            printf("%s: batch of %d, slot %d, %d cached: logits differ\n", what, n, slot, cached);
        KVR_CHECK(rows_equal(last + (size_t)slot * (size_t)V, N - 1, 1));
        KVR_CHECK(kv_equal(&pool, N));
    }

    /* decode of token N alone and among 1..35 others (batches of 2..36,
     * the decode GEMV's register tiles and its widened panels), in every
     * slot of the batch of 8 and at both ends and the middle of the
     * others, == the prefill's last row (the pool holds positions 0..N-1
     * from above) */
    struct kvr_decode_seq ds[NOTH];
    for (int o = 0; o < NOTH - 1; o++) /* the others: their prompts in the pool */
        prefill(ctx, &pool, oth[o], oth_len[o], 0, bt[o + 1], NULL, last);
    static const int32_t dsz[][2] = {{1, 0},  {2, 1},  {5, 2},  {8, 0},   {8, 1},   {8, 2},
                                     {8, 3},  {8, 4},  {8, 5},  {8, 6},   {8, 7},   {9, 8},
                                     {12, 5}, {16, 0}, {17, 9}, {33, 32}, {36, 17}, {36, 35}};
    for (size_t di = 0; di < sizeof(dsz) / sizeof(dsz[0]); di++) {
        int32_t n = dsz[di][0], slot = dsz[di][1];
        for (int32_t i = 0, o = 0; i < n; i++) {
            if (i == slot) {
                ds[i] = (struct kvr_decode_seq){seq[N], N, bt[0], NB};
                continue;
            }
            ds[i] = (struct kvr_decode_seq){oth[o][oth_len[o] - 1], oth_len[o] - 1, bt[o + 1], NB};
            o++;
        }
        KVR_CHECK_STATUS(kvr_engine_decode(ctx, &pool, ds, n, last), KVR_OK);
        if (!rows_equal(last + (size_t)slot * (size_t)V, N, 1))
            printf("%s: decode in a batch of %d, slot %d: logits differ\n", what, n, slot);
        KVR_CHECK(rows_equal(last + (size_t)slot * (size_t)V, N, 1));
        KVR_CHECK(kv_equal(&pool, N + 1));
    }
    /* and with one thread: the same bits */
    kvr_ctx_t *c1 = ctx_new(16, 1);
    pool_clear(&pool);
    prefill(c1, &pool, seq, N + 1, 0, bt[0], lg, last);
    KVR_CHECK(rows_equal(lg, 0, N + 1));
    kvr_ctx_destroy(c1);
    printf("%s, kv %s, numerics %s: chunked, prefix-continued, batched prefill and batched "
           "decode == one full prefill, bit for bit\n",
           what, kvr_kv_dtype_name(kv_dt), kvr_numerics_name(numerics));

    free(ref);
    free(lg);
    free(last);
    test_pool_free(&pool, L);
    test_pool_free(&ref_pool, L);
    kvr_ctx_destroy(ctx);
    kvr_model_destroy(model);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        KVR_SKIP("usage: test_engine_invariant KVRAIL_MKMODEL");
    static const struct {
        const char *args, *what;
    } models[] = {
        {"--arch llama --layers 2 --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 "
         "--vocab 512 --seed 11",
         "llama f32"},
        {"--arch llama --layers 2 --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 "
         "--vocab 512 --dtype bf16 --seed 12",
         "llama bf16"},
        {"--arch llama --layers 2 --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 "
         "--vocab 512 --dtype f16 --seed 13",
         "llama f16"},
        {"--arch qwen2 --layers 2 --hidden 120 --heads 4 --kv-heads 2 --intermediate 200 "
         "--vocab 300 --seed 14",
         "qwen2 f32, head_dim 30"},
        {"--arch mistral --layers 2 --hidden 128 --heads 4 --kv-heads 1 --intermediate 256 "
         "--vocab 300 --sliding-window 20 --dtype bf16 --seed 15",
         "mistral bf16, window 20"},
        /* head_dim 64 and 128: attention's register-resident kernels */
        {"--arch llama --layers 2 --hidden 256 --heads 4 --kv-heads 2 --intermediate 256 "
         "--vocab 300 --seed 16",
         "llama f32, head_dim 64"},
        {"--arch mistral --layers 1 --hidden 256 --heads 2 --kv-heads 1 --intermediate 128 "
         "--vocab 300 --sliding-window 20 --dtype f16 --seed 17",
         "mistral f16, head_dim 128, window 20"},
    };
    for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
        char d[512], cmd[8192];
        KVR_CHECK(kvr_test_mkdtemp(d, sizeof d, "kvr-test-engine-inv"));
        snprintf(cmd, sizeof(cmd), "%s --out %s %s >/dev/null", argv[1], d, models[i].args);
        KVR_CHECK(system(cmd) == 0);
        for (int32_t dt = KVR_KV_F32; dt <= KVR_KV_BF16; dt++)
            run_model(d, models[i].what, dt);
        kvr_test_rmtree(d);
    }

    /* numerics bf16dot (AVX512-BF16 vdpbf16ps on bf16 weights): the same
     * paths, the same bit-for-bit equality, on bf16 models (hidden and
     * intermediate multiples of 32 and not: the masked K tail).  Skipped on
     * a CPU without avx512_bf16, where the mode is refused at start-up. */
    static const struct {
        const char *args, *what;
    } dp_models[] = {
        {"--arch llama --layers 2 --hidden 128 --heads 4 --kv-heads 2 --intermediate 256 "
         "--vocab 512 --dtype bf16 --seed 12",
         "llama bf16"},
        {"--arch qwen2 --layers 2 --hidden 120 --heads 4 --kv-heads 2 --intermediate 200 "
         "--vocab 300 --dtype bf16 --seed 14",
         "qwen2 bf16, head_dim 30"},
        {"--arch mistral --layers 2 --hidden 256 --heads 4 --kv-heads 1 --intermediate 176 "
         "--vocab 300 --sliding-window 20 --dtype bf16 --seed 15",
         "mistral bf16, head_dim 64, window 20"},
    };
    for (size_t i = 0; i < sizeof(dp_models) / sizeof(dp_models[0]); i++) {
        char d[512], cmd[8192], err[512];
        KVR_CHECK(kvr_test_mkdtemp(d, sizeof d, "kvr-test-engine-inv"));
        snprintf(cmd, sizeof(cmd), "%s --out %s %s >/dev/null", argv[1], d, dp_models[i].args);
        KVR_CHECK(system(cmd) == 0);
        KVR_CHECK_STATUS(kvr_model_load(d, &model, err, sizeof(err)), KVR_OK);
        kvr_ctx_t *probe = NULL;
        struct kvr_ctx_opts o = {.n_threads = 1, .numerics = KVR_NUMERICS_BF16DOT};
        kvr_status_t st = kvr_ctx_create(model, &o, &probe, err, sizeof(err));
        kvr_ctx_destroy(probe);
        kvr_model_destroy(model);
        if (st == KVR_ERR_UNSUPPORTED) {
            printf("skip (exit-77 part): numerics bf16dot: %s\n", err);
        } else {
            KVR_CHECK_STATUS(st, KVR_OK);
            numerics = KVR_NUMERICS_BF16DOT;
            for (int32_t dt = KVR_KV_F32; dt <= KVR_KV_BF16; dt++)
                run_model(d, dp_models[i].what, dt);
            numerics = KVR_NUMERICS_F32;
        }
        kvr_test_rmtree(d);
        if (st == KVR_ERR_UNSUPPORTED)
            break;
    }
    free(ref_f32);
    return 0;
}
