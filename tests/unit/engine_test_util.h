/*
 * engine_test_util.h - helpers shared by the engine's unit tests: a KV pool
 * of the test model's layout in plain heap memory, and a fixed run of
 * prefills and decode steps to compare or fingerprint kernels by.
 */
#ifndef KVR_ENGINE_TEST_UTIL_H
#define KVR_ENGINE_TEST_UTIL_H

#include <stdlib.h>

#include "kvr_engine.h"
#include "kvr_test.h"

static inline void test_pool_init_dt(const kvr_model_t *m, int32_t block_size, int32_t n_layers,
                                     struct kvr_kv_pool *p, int32_t n_blocks, int32_t kv_dtype)
{
    KVR_CHECK_STATUS(kvr_kv_layout_init(m, block_size, kv_dtype, &p->layout), KVR_OK);
    p->n_blocks = n_blocks;
    p->layer_base = calloc((size_t)n_layers, sizeof(*p->layer_base));
    KVR_CHECK(p->layer_base != NULL);
    for (int l = 0; l < n_layers; l++) {
        p->layer_base[l] = calloc(1, kvr_kv_layer_bytes(&p->layout, n_blocks));
        KVR_CHECK(p->layer_base[l] != NULL);
    }
}

static inline void test_pool_init(const kvr_model_t *m, int32_t block_size, int32_t n_layers,
                                  struct kvr_kv_pool *p, int32_t n_blocks)
{
    test_pool_init_dt(m, block_size, n_layers, p, n_blocks, KVR_KV_F32);
}

static inline void test_pool_free(struct kvr_kv_pool *p, int32_t n_layers)
{
    for (int l = 0; l < n_layers; l++)
        free(p->layer_base[l]);
    free(p->layer_base);
}

/* The token ids 0..V-1 of a seeded LCG: a test's prompt. */
static inline void test_tokens(int32_t *t, int n, unsigned seed, int32_t V)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        t[i] = (int32_t)((seed >> 8) % (unsigned)V);
    }
}

/* test_seqs_run(): TEST_SEQS_N sequences of 40, 33 and 26 prompt tokens
 * prefilled one by one (every position's logits of the first kept: the
 * matmul of many rows, prefill attention), then TEST_SEQS_STEPS decode
 * steps of the three together (the GEMV of few rows, decode attention),
 * into a KV pool of kv_dtype, with the kernels KVR_CPU_MATMUL names
 * (unset: the CPU's best).  What kernel tests compare or fingerprint. */
#define TEST_SEQS_BS    8
#define TEST_SEQS_NP    40 /* the first prompt's tokens */
#define TEST_SEQS_NB    8  /* blocks a sequence: up to 64 positions */
#define TEST_SEQS_N     3  /* sequences decoded together */
#define TEST_SEQS_STEPS 4

struct test_seqs {
    float *prefill; /* [TEST_SEQS_NP][V] every position's logits of sequence 0 */
    float *decode;  /* [TEST_SEQS_STEPS][TEST_SEQS_N][V] */
    struct kvr_kv_pool pool;
};

static inline void test_seqs_run(kvr_model_t *m, int32_t kv_dtype, int32_t numerics,
                                 struct test_seqs *out)
{
    enum { NP = TEST_SEQS_NP, NB = TEST_SEQS_NB, NSEQ = TEST_SEQS_N, STEPS = TEST_SEQS_STEPS };
    char err[512];
    const int32_t V = kvr_model_vocab(m), L = kvr_model_n_layers(m);
    kvr_ctx_t *ctx;
    struct kvr_ctx_opts o = {
        .n_threads = 2, .max_tokens = 64, .max_batch = NSEQ, .numerics = numerics};
    KVR_CHECK_STATUS(kvr_ctx_create(m, &o, &ctx, err, sizeof(err)), KVR_OK);
    test_pool_init_dt(m, TEST_SEQS_BS, L, &out->pool, NSEQ * NB, kv_dtype);
    out->prefill = malloc((size_t)NP * (size_t)V * 4);
    out->decode = malloc((size_t)STEPS * NSEQ * (size_t)V * 4);
    float *last = malloc((size_t)V * 4);
    KVR_CHECK(out->prefill && out->decode && last);
    int32_t bt[NSEQ][NB], len[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        for (int b = 0; b < NB; b++)
            bt[s][b] = s * NB + b;
        int32_t t[NP];
        len[s] = NP - 7 * s; /* 40, 33, 26 */
        test_tokens(t, len[s], 100u + (unsigned)s, V);
        struct kvr_prefill_req r = {.tokens = t,
                                    .n_tokens = len[s],
                                    .block_table = bt[s],
                                    .n_blocks = NB,
                                    .all_logits = s == 0 ? out->prefill : NULL};
        KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &out->pool, &r, last), KVR_OK);
    }
    for (int st = 0; st < STEPS; st++) {
        struct kvr_decode_seq q[NSEQ];
        for (int s = 0; s < NSEQ; s++)
            q[s] = (struct kvr_decode_seq){.token = (st * 31 + s * 7) % V,
                                           .pos = len[s] + st,
                                           .block_table = bt[s],
                                           .n_blocks = NB};
        KVR_CHECK_STATUS(kvr_engine_decode(ctx, &out->pool, q, NSEQ,
                                           out->decode + (size_t)st * NSEQ * (size_t)V),
                         KVR_OK);
    }
    free(last);
    kvr_ctx_destroy(ctx);
}

static inline void test_seqs_free(struct test_seqs *r, int32_t n_layers)
{
    free(r->prefill);
    free(r->decode);
    test_pool_free(&r->pool, n_layers);
}

#endif
