/*
 * test_engine_batch.c - the batched prefill (kvr_engine_prefill_batch):
 * sequences of different lengths, some continuing from a cached prefix
 * (ending on a block boundary or mid-block), short and long ones (all rows
 * in one batch-invariant matmul), prefilled in one call give each sequence's
 * last-position logits and every K/V block bit for bit equal (memcmp, no
 * tolerance) to prefilling it alone with kvr_engine_prefill; layer_done runs
 * once per layer for the whole batch, after that layer's K/V of every
 * sequence are in the pool; bad batches are KVR_ERR_INVALID.  Run on an f32
 * Qwen2 model (biases) and a bf16 Llama one (converted-weight GEMM path).
 *
 *   test_engine_batch KVRAIL_MKMODEL
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_engine.h"
#include "kvr_test.h"
#include "engine_test_util.h"

#define BS   8
#define NSEQ 9
#define NB   20 /* blocks a sequence */

static kvr_model_t *model;
static int32_t V, L;

static void pool_init(struct kvr_kv_pool *p, int32_t n_blocks)
{
    test_pool_init(model, BS, L, p, n_blocks);
}

static void pool_free(struct kvr_kv_pool *p)
{
    test_pool_free(p, L);
}

static void tokens(int32_t *t, int n, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)((seed >> 8) % (unsigned)V);
    }
}

struct cb_state {
    const struct kvr_kv_pool *pool;
    const struct kvr_prefill_seq *seqs;
    int32_t next;
};

/* once per layer, in order; every sequence's last token's K is in this
 * layer and not yet in the next */
static kvr_status_t on_layer(void *arg, int32_t layer)
{
    struct cb_state *s = arg;
    KVR_CHECK_EQ(layer, s->next);
    s->next++;
    const struct kvr_kv_layout *l = &s->pool->layout;
    for (int i = 0; i < NSEQ; i++) {
        int32_t p = s->seqs[i].n_tokens - 1;
        int32_t blk = s->seqs[i].block_table[p / BS];
        const float *k = kvr_kv_ptr(l, s->pool->layer_base[layer], blk, 0, 0, p % BS);
        KVR_CHECK(k[0] != 0.0f || k[1] != 0.0f);
        if (layer + 1 < L) {
            const float *k2 = kvr_kv_ptr(l, s->pool->layer_base[layer + 1], blk, 0, 0, p % BS);
            KVR_CHECK(k2[0] == 0.0f && k2[1] == 0.0f);
        }
    }
    return KVR_OK;
}

static void run_model(const char *dir, const char *what)
{
    char err[512];
    KVR_CHECK_STATUS(kvr_model_load(dir, &model, err, sizeof(err)), KVR_OK);
    V = kvr_model_vocab(model);
    L = kvr_model_n_layers(model);
    kvr_ctx_t *ctx;
    struct kvr_ctx_opts o = {.n_threads = 2, .max_tokens = 512};
    KVR_CHECK_STATUS(kvr_ctx_create(model, &o, &ctx, err, sizeof(err)), KVR_OK);
    KVR_CHECK_EQ(kvr_ctx_max_tokens(ctx), 512);

    /* lengths / cached prefixes: 1 new token, short ones, 32 and 33 (the
     * former GEMV/GEMM switch), block-boundary and mid-block prefixes, long
     * ones */
    static const int32_t len[NSEQ] = {5, 20, 32, 33, 64, 40, 100, 61, 130};
    static const int32_t cached[NSEQ] = {4, 0, 0, 0, 0, 16, 29, 3, 24};
    int32_t t[NSEQ][160], bt[NSEQ][NB];
    struct kvr_kv_pool batch, alone;
    pool_init(&batch, NSEQ * NB);
    pool_init(&alone, NSEQ * NB);
    struct kvr_prefill_seq seqs[NSEQ];
    float *lg = malloc((size_t)V * 4), *lb = malloc((size_t)NSEQ * (size_t)V * 4);
    float *la = malloc((size_t)NSEQ * (size_t)V * 4);
    for (int s = 0; s < NSEQ; s++) {
        tokens(t[s], len[s], 100u + (unsigned)s);
        for (int i = 0; i < NB; i++)
            bt[s][i] = s + NSEQ * i; /* interleaved across sequences */
        seqs[s] = (struct kvr_prefill_seq){.tokens = t[s],
                                           .n_tokens = len[s],
                                           .n_cached = cached[s],
                                           .block_table = bt[s],
                                           .n_blocks = NB};
        if (cached[s] > 0) { /* the same prefix K/V in both pools */
            struct kvr_prefill_req r = {
                .tokens = t[s], .n_tokens = cached[s], .block_table = bt[s], .n_blocks = NB};
            KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &batch, &r, lg), KVR_OK);
            KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &alone, &r, lg), KVR_OK);
        }
    }
    /* the next layer's slots of the last tokens are still zero before */
    struct cb_state cs = {.pool = &batch, .seqs = seqs};
    KVR_CHECK_STATUS(kvr_engine_prefill_batch(ctx, &batch, seqs, NSEQ, on_layer, &cs, lb), KVR_OK);
    KVR_CHECK_EQ(cs.next, L);
    for (int s = 0; s < NSEQ; s++) {
        struct kvr_prefill_req r = {.tokens = t[s],
                                    .n_tokens = len[s],
                                    .n_cached = cached[s],
                                    .block_table = bt[s],
                                    .n_blocks = NB};
        KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &alone, &r, la + (size_t)s * (size_t)V), KVR_OK);
    }
    int bad = 0;
    for (int s = 0; s < NSEQ; s++) {
        if (memcmp(lb + (size_t)s * (size_t)V, la + (size_t)s * (size_t)V, (size_t)V * 4) != 0) {
            printf("%s: sequence %d (%d tokens, %d cached): logits differ\n", what, s, len[s],
                   cached[s]);
            bad++;
        }
    }
    KVR_CHECK_EQ(bad, 0);
    for (int l = 0; l < L; l++)
        KVR_CHECK(memcmp(batch.layer_base[l], alone.layer_base[l],
                         kvr_kv_layer_bytes(&batch.layout, NSEQ * NB)) == 0);
    printf("%s: batch of %d sequences (%d..%d tokens) == each alone, bit for bit (logits, K/V)\n",
           what, NSEQ, len[0], len[NSEQ - 1]);

    /* n = 1 is the single prefill (and may be longer than a chunk) */
    KVR_CHECK_STATUS(kvr_engine_prefill_batch(ctx, &batch, &seqs[8], 1, NULL, NULL, lg), KVR_OK);
    KVR_CHECK(memcmp(lg, la + (size_t)8 * (size_t)V, (size_t)V * 4) == 0);

    /* bad batches */
    KVR_CHECK_STATUS(kvr_engine_prefill_batch(ctx, &batch, seqs, 0, NULL, NULL, lb),
                     KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_engine_prefill_batch(ctx, &batch, NULL, 2, NULL, NULL, lb),
                     KVR_ERR_INVALID);
    struct kvr_prefill_seq bs[2] = {seqs[1], seqs[2]};
    bs[1].n_cached = bs[1].n_tokens; /* nothing to compute */
    KVR_CHECK_STATUS(kvr_engine_prefill_batch(ctx, &batch, bs, 2, NULL, NULL, lb), KVR_ERR_INVALID);
    bs[1] = seqs[2];
    bs[1].n_blocks = 1; /* too few blocks */
    KVR_CHECK_STATUS(kvr_engine_prefill_batch(ctx, &batch, bs, 2, NULL, NULL, lb), KVR_ERR_INVALID);
    int32_t badtok[4] = {1, 2, V, 3};
    bs[1] = (struct kvr_prefill_seq){
        .tokens = badtok, .n_tokens = 4, .block_table = bt[2], .n_blocks = NB};
    KVR_CHECK_STATUS(kvr_engine_prefill_batch(ctx, &batch, bs, 2, NULL, NULL, lb), KVR_ERR_INVALID);
    kvr_ctx_t *small;
    struct kvr_ctx_opts os = {.n_threads = 1, .max_tokens = 64};
    KVR_CHECK_STATUS(kvr_ctx_create(model, &os, &small, err, sizeof(err)), KVR_OK);
    bs[0] = seqs[4]; /* 64 + 20 new tokens > max_tokens 64 */
    bs[1] = seqs[1];
    KVR_CHECK_STATUS(kvr_engine_prefill_batch(small, &batch, bs, 2, NULL, NULL, lb),
                     KVR_ERR_INVALID);
    kvr_ctx_destroy(small);

    free(lg);
    free(lb);
    free(la);
    pool_free(&batch);
    pool_free(&alone);
    kvr_ctx_destroy(ctx);
    kvr_model_destroy(model);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        KVR_SKIP("usage: test_engine_batch KVRAIL_MKMODEL");
    char d1[512], d2[512];
    KVR_CHECK(kvr_test_mkdtemp(d1, sizeof d1, "kvr-test-engine-batch") &&
              kvr_test_mkdtemp(d2, sizeof d2, "kvr-test-engine-batch2"));
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "%s --out %s --arch qwen2 --heads 4 --kv-heads 2 --seed 5", argv[1],
             d1);
    KVR_CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof(cmd),
             "%s --out %s --arch llama --layers 2 --hidden 256 --heads 8 --kv-heads 4 "
             "--intermediate 512 --vocab 1024 --dtype bf16 --seed 6",
             argv[1], d2);
    KVR_CHECK(system(cmd) == 0);
    run_model(d1, "qwen2 f32");
    run_model(d2, "llama bf16");
    kvr_test_rmtree(d1);
    kvr_test_rmtree(d2);
    return 0;
}
