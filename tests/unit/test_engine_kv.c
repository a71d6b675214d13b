/*
 * test_engine_kv.c - the engine over the paged pool: prefill continued from
 * a cached prefix equals a full prefill; a batched decode step over
 * sequences of different lengths equals decoding each alone; layer_done
 * runs once per layer, in order, after that layer's K/V are in the blocks;
 * chunked prefill equals one-shot; bad arguments are KVR_ERR_INVALID.
 *
 *   test_engine_kv KVRAIL_MKMODEL
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_engine.h"
#include "kvr_test.h"
#include "engine_test_util.h"

#define BS 8

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

static float max_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (d > m)
            m = d;
    }
    return m;
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
    int32_t block, slot, next;
    kvr_status_t fail_at_status;
    int32_t fail_at;
};

static kvr_status_t on_layer(void *arg, int32_t layer)
{
    struct cb_state *s = arg;
    KVR_CHECK_EQ(layer, s->next); /* in order, once each */
    s->next++;
    const struct kvr_kv_layout *l = &s->pool->layout;
    /* this layer's K of the last token is written, the next layer's not yet */
    const float *k = kvr_kv_ptr(l, s->pool->layer_base[layer], s->block, 0, 0, s->slot);
    KVR_CHECK(k[0] != 0.0f || k[1] != 0.0f);
    if (layer + 1 < L) {
        const float *k2 = kvr_kv_ptr(l, s->pool->layer_base[layer + 1], s->block, 0, 0, s->slot);
        KVR_CHECK(k2[0] == 0.0f && k2[1] == 0.0f);
    }
    if (layer == s->fail_at)
        return s->fail_at_status;
    return KVR_OK;
}

static void test_prefix_and_chunks(kvr_ctx_t *ctx, kvr_ctx_t *ctx_chunk)
{
    enum { N = 45, K = 24 }; /* K: a block boundary (3 blocks of 8) */
    int32_t t[N];
    tokens(t, N, 1);
    struct kvr_kv_pool a, b;
    pool_init(&a, 16);
    pool_init(&b, 16);
    int32_t bt[6] = {3, 9, 1, 14, 6, 0};
    float *full = malloc((size_t)N * (size_t)V * 4), *last = malloc((size_t)V * 4);
    struct cb_state cs = {
        .pool = &a, .block = bt[(N - 1) / BS], .slot = (N - 1) % BS, .fail_at = -1};
    struct kvr_prefill_req r = {.tokens = t,
                                .n_tokens = N,
                                .block_table = bt,
                                .n_blocks = 6,
                                .all_logits = full,
                                .layer_done = on_layer,
                                .layer_done_arg = &cs};
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &a, &r, last), KVR_OK);
    KVR_CHECK_EQ(cs.next, L);
    KVR_CHECK(memcmp(last, full + (size_t)(N - 1) * (size_t)V, (size_t)V * 4) == 0);

    /* prefix K cached (by a prefill of the prefix alone), then the rest */
    float *part = malloc((size_t)N * (size_t)V * 4), *last2 = malloc((size_t)V * 4);
    struct kvr_prefill_req r1 = {.tokens = t, .n_tokens = K, .block_table = bt, .n_blocks = 3};
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &b, &r1, last2), KVR_OK);
    KVR_CHECK(max_diff(last2, full + (size_t)(K - 1) * (size_t)V, (size_t)V) < 1e-4f);
    struct kvr_prefill_req r2 = {.tokens = t,
                                 .n_tokens = N,
                                 .n_cached = K,
                                 .block_table = bt,
                                 .n_blocks = 6,
                                 .all_logits = part};
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &b, &r2, last2), KVR_OK);
    float e = max_diff(part, full + (size_t)K * (size_t)V, (size_t)(N - K) * (size_t)V);
    printf("prefix reuse (%d cached of %d): max |diff| %.2e\n", K, N, e);
    KVR_CHECK(e < 1e-4f);
    /* the pools' K/V agree too */
    for (int l = 0; l < L; l++)
        KVR_CHECK(max_diff(a.layer_base[l], b.layer_base[l],
                           kvr_kv_layer_bytes(&a.layout, 16) / 4) < 1e-4f);
    /* a prefix that ends mid-block */
    struct kvr_prefill_req r3 = {.tokens = t,
                                 .n_tokens = N,
                                 .n_cached = 29,
                                 .block_table = bt,
                                 .n_blocks = 6,
                                 .all_logits = part};
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &b, &r3, last2), KVR_OK);
    KVR_CHECK(max_diff(part, full + (size_t)29 * (size_t)V, (size_t)(N - 29) * (size_t)V) < 1e-4f);

    /* chunked prefill (max_tokens 8) equals one shot; callbacks still once a layer */
    struct kvr_kv_pool c;
    pool_init(&c, 16);
    cs = (struct cb_state){
        .pool = &c, .block = bt[(N - 1) / BS], .slot = (N - 1) % BS, .fail_at = -1};
    r.layer_done_arg = &cs;
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx_chunk, &c, &r, last2), KVR_OK);
    KVR_CHECK_EQ(cs.next, L);
    e = max_diff(last2, last, (size_t)V);
    printf("chunked prefill (8-token chunks): max |diff| %.2e\n", e);
    KVR_CHECK(e < 1e-4f);

    /* layer_done's error aborts the prefill with that status */
    memset(c.layer_base[0], 0, kvr_kv_layer_bytes(&c.layout, 16));
    for (int l = 1; l < L; l++)
        memset(c.layer_base[l], 0, kvr_kv_layer_bytes(&c.layout, 16));
    cs = (struct cb_state){.pool = &c,
                           .block = bt[(N - 1) / BS],
                           .slot = (N - 1) % BS,
                           .fail_at = 0,
                           .fail_at_status = KVR_ERR_CANCELED};
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &c, &r, last2), KVR_ERR_CANCELED);
    KVR_CHECK_EQ(cs.next, 1);

    pool_free(&a);
    pool_free(&b);
    pool_free(&c);
    free(full);
    free(last);
    free(part);
    free(last2);
}

static void test_batched_decode(kvr_ctx_t *ctx)
{
    /* 36 sequences: more than KVR_GEMV_ROWS, so the invariant flag (not
     * the row count) must keep the batched results equal */
    enum { S = 36, STEPS = 5 };
    int len[S];
    int32_t t[S][64];
    int32_t bt[S][8];
    struct kvr_kv_pool batch, alone;
    pool_init(&batch, S * 8);
    pool_init(&alone, S * 8);
    float *lg = malloc((size_t)V * 4);
    for (int s = 0; s < S; s++) {
        len[s] = 5 + (s * 7) % 40;
        tokens(t[s], len[s], 10u + (unsigned)s);
        for (int i = 0; i < 8; i++)
            bt[s][i] = s + S * i; /* interleaved across sequences */
        struct kvr_prefill_req r = {
            .tokens = t[s], .n_tokens = len[s], .block_table = bt[s], .n_blocks = 8};
        KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &batch, &r, lg), KVR_OK);
        KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &alone, &r, lg), KVR_OK);
        t[s][len[s]] = (int32_t)((unsigned)(s * 7 + 3) % (unsigned)V);
    }
    float *lb = malloc((size_t)S * (size_t)V * 4), *la = malloc((size_t)V * 4);
    float worst = 0;
    for (int step = 0; step < STEPS; step++) {
        struct kvr_decode_seq q[S];
        for (int s = 0; s < S; s++)
            q[s] = (struct kvr_decode_seq){.token = t[s][len[s] + step],
                                           .pos = len[s] + step,
                                           .block_table = bt[s],
                                           .n_blocks = 8};
        KVR_CHECK_STATUS(kvr_engine_decode(ctx, &batch, q, S, lb), KVR_OK);
        for (int s = 0; s < S; s++) {
            KVR_CHECK_STATUS(kvr_engine_decode(ctx, &alone, &q[s], 1, la), KVR_OK);
            float e = max_diff(lb + (size_t)s * (size_t)V, la, (size_t)V);
            if (e > worst)
                worst = e;
            /* next token: greedy from the solo logits */
            int32_t best = 0;
            for (int32_t v = 1; v < V; v++)
                if (la[v] > la[best])
                    best = v;
            t[s][len[s] + step + 1] = best;
        }
    }
    printf("batched decode (%d sequences of lengths 5..44, %d steps) vs alone: max |diff| "
           "%.2e\n",
           S, STEPS, worst);
    KVR_CHECK(worst == 0.0f); /* batch invariance: bit for bit */
    pool_free(&batch);
    pool_free(&alone);
    free(lb);
    free(la);
    free(lg);
}

static void test_bad_args(kvr_ctx_t *ctx)
{
    struct kvr_kv_pool p;
    pool_init(&p, 4);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t bt[2] = {0, 1};
    float *lg = malloc((size_t)V * 4 * 2);
    struct kvr_prefill_req r = {.tokens = t, .n_tokens = 8, .block_table = bt, .n_blocks = 1};
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &p, &r, lg), KVR_OK);
    r.n_tokens = 9; /* needs 2 blocks */
    int32_t t9[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    r.tokens = t9;
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &p, &r, lg), KVR_ERR_INVALID);
    r.n_blocks = 2;
    bt[1] = 4; /* outside the pool */
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &p, &r, lg), KVR_ERR_INVALID);
    bt[1] = 1;
    t9[3] = V; /* token outside the vocabulary */
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &p, &r, lg), KVR_ERR_INVALID);
    t9[3] = -1;
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &p, &r, lg), KVR_ERR_INVALID);
    t9[3] = 4;
    r.n_cached = 9; /* nothing left to compute */
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &p, &r, lg), KVR_ERR_INVALID);
    r.n_cached = 0;
    p.layout.n_kv_heads++; /* layout of another model */
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &p, &r, lg), KVR_ERR_INVALID);
    p.layout.n_kv_heads--;
    KVR_CHECK_STATUS(kvr_engine_prefill(ctx, &p, &r, lg), KVR_OK);
    struct kvr_decode_seq q[2] = {{.token = 1, .pos = 9, .block_table = bt, .n_blocks = 2},
                                  {.token = 2, .pos = 16, .block_table = bt, .n_blocks = 2}};
    KVR_CHECK_STATUS(kvr_engine_decode(ctx, &p, q, 1, lg), KVR_OK);
    KVR_CHECK_STATUS(kvr_engine_decode(ctx, &p, q, 2, lg), KVR_ERR_INVALID); /* pos 16: 3 blocks */
    KVR_CHECK_STATUS(kvr_engine_decode(ctx, &p, q, 0, lg), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_engine_decode(ctx, &p, q, 41, lg), KVR_ERR_INVALID);
    q[0].token = V;
    KVR_CHECK_STATUS(kvr_engine_decode(ctx, &p, q, 1, lg), KVR_ERR_INVALID);
    q[0].token = 1;
    q[0].pos = kvr_model_max_pos(model);
    KVR_CHECK_STATUS(kvr_engine_decode(ctx, &p, q, 1, lg), KVR_ERR_INVALID);
    struct kvr_kv_layout lay;
    KVR_CHECK_STATUS(kvr_kv_layout_init(model, 0, KVR_KV_F32, &lay), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_kv_layout_init(model, 16, 3, &lay), KVR_ERR_INVALID);
    pool_free(&p);
    free(lg);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        KVR_SKIP("usage: test_engine_kv KVRAIL_MKMODEL");
    char dir[512], dir2[512];
    KVR_CHECK(kvr_test_mkdtemp(dir, sizeof dir, "kvr-test-engine-kv") &&
              kvr_test_mkdtemp(dir2, sizeof dir2, "kvr-test-engine-kv2"));
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "%s --out %s --arch qwen2 --heads 4 --kv-heads 2 --seed 3", argv[1],
             dir);
    KVR_CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof(cmd), "%s --out %s --arch qwen2 --heads 4 --kv-heads 2 --seed 4", argv[1],
             dir2);
    KVR_CHECK(system(cmd) == 0);
    char err[512];
    KVR_CHECK_STATUS(kvr_model_load(dir, &model, err, sizeof(err)), KVR_OK);
    V = kvr_model_vocab(model);
    L = kvr_model_n_layers(model);

    /* accessors and fingerprint */
    KVR_CHECK_EQ(L, 2);
    KVR_CHECK_EQ(kvr_model_n_heads(model), 4);
    KVR_CHECK_EQ(kvr_model_n_kv_heads(model), 2);
    KVR_CHECK_EQ(kvr_model_head_dim(model), 16);
    KVR_CHECK_EQ(kvr_model_hidden(model), 64);
    KVR_CHECK_EQ(V, 512);
    KVR_CHECK_EQ(kvr_model_max_pos(model), 4096);
    KVR_CHECK(strcmp(kvr_model_arch(model), "Qwen2ForCausalLM") == 0);
    KVR_CHECK(strcmp(kvr_model_dtype(model), "f32") == 0);
    KVR_CHECK(kvr_model_bos_id(model) >= 0 && kvr_model_eos_id(model) >= 0);
    KVR_CHECK(kvr_model_bos_id(model) != kvr_model_eos_id(model));
    KVR_CHECK(kvr_model_n_params(model) > 50000);
    kvr_model_t *again, *other;
    KVR_CHECK_STATUS(kvr_model_load(dir, &again, err, sizeof(err)), KVR_OK);
    KVR_CHECK_STATUS(kvr_model_load(dir2, &other, err, sizeof(err)), KVR_OK);
    KVR_CHECK(kvr_model_fingerprint(model) == kvr_model_fingerprint(again));
    KVR_CHECK(kvr_model_fingerprint(model) != kvr_model_fingerprint(other));
    kvr_model_destroy(again);
    kvr_model_destroy(other);
    struct kvr_kv_layout lay;
    KVR_CHECK_STATUS(kvr_kv_layout_init(model, 16, KVR_KV_F32, &lay), KVR_OK);
    KVR_CHECK_EQ(kvr_kv_block_bytes(&lay), 2 * 2 * 16 * 16 * 4);
    KVR_CHECK_EQ(kvr_kv_layer_bytes(&lay, 10), 10 * 2 * 2 * 16 * 16 * 4);
    KVR_CHECK_EQ(kvr_kv_offset(&lay, 1, 1, 1, 1), ((1 * 2 + 1) * 2 + 1) * 16 * 16 + 16);
    /* bf16 / f16: half the bytes, the same element offsets */
    for (int32_t dt = KVR_KV_F16; dt <= KVR_KV_BF16; dt++) {
        struct kvr_kv_layout h;
        KVR_CHECK_STATUS(kvr_kv_layout_init(model, 16, dt, &h), KVR_OK);
        KVR_CHECK_EQ(kvr_kv_block_bytes(&h) * 2, kvr_kv_block_bytes(&lay));
        KVR_CHECK_EQ(kvr_kv_offset(&h, 1, 1, 1, 1), kvr_kv_offset(&lay, 1, 1, 1, 1));
        static char slab[2 * 2 * 2 * 16 * 16 * 2];
        KVR_CHECK((char *)kvr_kv_ptr(&h, slab, 1, 1, 1, 1) - slab ==
                  (ptrdiff_t)kvr_kv_offset(&h, 1, 1, 1, 1) * 2);
    }
    int32_t dt = -1;
    KVR_CHECK_STATUS(kvr_kv_dtype_parse("bf16", &dt), KVR_OK);
    KVR_CHECK_EQ(dt, KVR_KV_BF16);
    KVR_CHECK_STATUS(kvr_kv_dtype_parse("f16", &dt), KVR_OK);
    KVR_CHECK_EQ(dt, KVR_KV_F16);
    KVR_CHECK_STATUS(kvr_kv_dtype_parse("f32", &dt), KVR_OK);
    KVR_CHECK_EQ(dt, KVR_KV_F32);
    KVR_CHECK_STATUS(kvr_kv_dtype_parse("fp8", &dt), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_kv_dtype_parse(NULL, &dt), KVR_ERR_INVALID);
    KVR_CHECK_EQ(dt, KVR_KV_F32);
    KVR_CHECK(strcmp(kvr_kv_dtype_name(KVR_KV_BF16), "bf16") == 0);
    KVR_CHECK(strcmp(kvr_kv_dtype_name(7), "?") == 0);

    struct kvr_ctx_opts o = {.n_threads = 2, .max_batch = 40};
    struct kvr_ctx_opts oc = {.n_threads = 2, .max_tokens = 8};
    kvr_ctx_t *ctx, *ctx_chunk;
    KVR_CHECK_STATUS(kvr_ctx_create(model, &o, &ctx, err, sizeof(err)), KVR_OK);
    KVR_CHECK_STATUS(kvr_ctx_create(model, &oc, &ctx_chunk, err, sizeof(err)), KVR_OK);
    struct kvr_ctx_opts bad = {.backend = "tpu"};
    kvr_ctx_t *x;
    KVR_CHECK_STATUS(kvr_ctx_create(model, &bad, &x, err, sizeof(err)), KVR_ERR_NOT_FOUND);
    KVR_CHECK(strstr(err, "tpu") != NULL);

    test_prefix_and_chunks(ctx, ctx_chunk);
    test_batched_decode(ctx);
    test_bad_args(ctx);

    kvr_ctx_destroy(ctx);
    kvr_ctx_destroy(ctx_chunk);
    kvr_model_destroy(model);
    kvr_test_rmtree(dir);
    kvr_test_rmtree(dir2);
    printf("engine_kv: ok\n");
    return 0;
}
