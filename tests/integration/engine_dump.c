/*
 * engine_dump.c - test driver for the NumPy reference comparison: loads a
 * model, prefills a prompt (every position's logits), then decodes N steps
 * greedily, and writes
 *   OUT.f32   raw little-endian f32 logits [n_prompt + N][vocab]
 *   OUT.json  {"tokens": [...every token fed...], "vocab": V}
 * so the reference can run the same token sequence and compare each row.
 * The block table is scattered over the pool (reversed, strided) so paging
 * is exercised.
 *
 *   engine_dump MODEL_DIR PROMPT_TOKENS(1,2,3) N_DECODE OUT [BLOCK_SIZE] [MAX_TOKENS]
 *               [KV_DTYPE(f32|bf16|f16)]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_engine.h"

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr,
                "usage: %s MODEL TOKENS N_DECODE OUT [BLOCK_SIZE] [MAX_TOKENS] [KV_DTYPE] "
                "[NUMERICS]\n",
                argv[0]);
        return 2;
    }
    int n_dec = atoi(argv[3]);
    int bs = argc > 5 ? atoi(argv[5]) : 16;
    int max_tokens = argc > 6 ? atoi(argv[6]) : 0;
    int32_t kv_dtype = KVR_KV_F32;
    if (argc > 7 && kvr_kv_dtype_parse(argv[7], &kv_dtype) != KVR_OK) {
        fprintf(stderr, "KV_DTYPE '%s' is not f32, bf16 or f16\n", argv[7]);
        return 2;
    }
    int32_t numerics = KVR_NUMERICS_F32;
    if (argc > 8 && kvr_numerics_parse(argv[8], &numerics) != KVR_OK) {
        fprintf(stderr, "NUMERICS '%s' is not f32 or bf16dot\n", argv[8]);
        return 2;
    }
    int32_t toks[8192];
    int n = 0;
    for (char *s = argv[2]; *s && n < 4096;) {
        toks[n++] = (int32_t)strtol(s, &s, 10);
        if (*s == ',')
            s++;
    }
    char err[512];
    kvr_model_t *m;
    kvr_status_t st = kvr_model_load(argv[1], &m, err, sizeof(err));
    if (st != KVR_OK) {
        fprintf(stderr, "load: %s: %s\n", kvr_status_name(st), err);
        return 1;
    }
    struct kvr_ctx_opts o = {.max_tokens = max_tokens, .numerics = numerics};
    kvr_ctx_t *ctx;
    if ((st = kvr_ctx_create(m, &o, &ctx, err, sizeof(err))) != KVR_OK) {
        fprintf(stderr, "ctx: %s\n", err);
        return 1;
    }
    int32_t V = kvr_model_vocab(m), L = kvr_model_n_layers(m);
    int total = n + n_dec;
    int nb = (total + bs - 1) / bs;
    int pool_blocks = 3 * nb + 1;
    struct kvr_kv_pool pool;
    kvr_kv_layout_init(m, bs, kv_dtype, &pool.layout);
    pool.n_blocks = pool_blocks;
    pool.layer_base = calloc((size_t)L, sizeof(*pool.layer_base));
    for (int l = 0; l < L; l++)
        pool.layer_base[l] = calloc(1, kvr_kv_layer_bytes(&pool.layout, pool_blocks));
    int32_t *bt = malloc((size_t)nb * sizeof(int32_t));
    for (int i = 0; i < nb; i++)
        bt[i] = pool_blocks - 1 - 3 * i; /* reversed and strided */
    float *logits = malloc((size_t)total * (size_t)V * sizeof(float));
    float *last = malloc((size_t)V * sizeof(float));
    struct kvr_prefill_req req = {
        .tokens = toks, .n_tokens = n, .block_table = bt, .n_blocks = nb, .all_logits = logits};
    if ((st = kvr_engine_prefill(ctx, &pool, &req, last)) != KVR_OK) {
        fprintf(stderr, "prefill: %s\n", kvr_status_name(st));
        return 1;
    }
    if (memcmp(last, logits + (size_t)(n - 1) * (size_t)V, (size_t)V * 4) != 0) {
        fprintf(stderr, "prefill: last-position logits differ from all_logits' last row\n");
        return 1;
    }
    for (int i = 0; i < n_dec; i++) {
        const float *prev = logits + (size_t)(n - 1 + i) * (size_t)V;
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (prev[v] > prev[best])
                best = v;
        toks[n + i] = best;
        struct kvr_decode_seq q = {.token = best, .pos = n + i, .block_table = bt, .n_blocks = nb};
        if ((st = kvr_engine_decode(ctx, &pool, &q, 1, logits + (size_t)(n + i) * (size_t)V)) !=
            KVR_OK) {
            fprintf(stderr, "decode: %s\n", kvr_status_name(st));
            return 1;
        }
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s.f32", argv[4]);
    FILE *f = fopen(path, "wb");
    if (!f ||
        fwrite(logits, sizeof(float), (size_t)total * (size_t)V, f) != (size_t)total * (size_t)V) {
        perror(path);
        return 1;
    }
    fclose(f);
    snprintf(path, sizeof(path), "%s.json", argv[4]);
    f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    /* the fed tokens: the prompt, then each decoded token (the last decoded
     * token's own logits row is the final one) */
    fprintf(f, "{\"vocab\": %d, \"n_prompt\": %d, \"tokens\": [", V, n);
    for (int i = 0; i < total; i++)
        fprintf(f, "%s%d", i ? "," : "", toks[i]);
    fprintf(f, "]}\n");
    fclose(f);
    kvr_ctx_destroy(ctx);
    for (int l = 0; l < L; l++)
        free(pool.layer_base[l]);
    free(pool.layer_base);
    free(bt);
    free(logits);
    free(last);
    kvr_model_destroy(m);
    return 0;
}
