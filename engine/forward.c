/*
 * forward.c - the transformer forward pass over the paged KV pool, and the
 * compute context that holds its run state.
 *
 * One routine, forward(), runs M rows through the model; a row is one token
 * of some sequence, with its position and that sequence's block table.
 * Prefill passes the new tokens of one sequence (in chunks of at most
 * max_tokens rows); a decode step passes one row per sequence.  Per layer,
 * as in llama2.c:
 *
 *   xb  = rmsnorm(x) * attn_norm
 *   q, k, v = xb Wq^T + bq, xb Wk^T + bk, xb Wv^T + bv
 *   q, k = rope(q, pos), rope(k, pos)
 *   pool[layer][block(pos)][k|v][:, slot(pos)] = k, v
 *   att = softmax(q K^T / sqrt(dh)) V   over positions <= pos (GQA)
 *   x  += att Wo^T (+ bo)
 *   xb  = rmsnorm(x) * ffn_norm
 *   x  += (silu(xb Wg^T) * (xb Wu^T)) Wd^T
 *
 * then logits = rmsnorm(x) * final_norm Wlm^T for the rows that need them.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_internal.h"
#include "kvr_log.h"

#define ERR(...)                                                                                   \
    do {                                                                                           \
        if (err && err_len)                                                                        \
            snprintf(err, err_len, __VA_ARGS__);                                                   \
    } while (0)

/* Attention arguments of a forward pass over the M rows of the run state. */
static struct kvr_attn_args attn_args(const struct kvr_model_config *c,
                                      const struct kvr_run_state *s, const struct kvr_kv_pool *pool,
                                      int32_t M)
{
    return (struct kvr_attn_args){
        .n_rows = M,
        .pos = s->pos,
        .block_table = s->bt,
        .layout = &pool->layout,
        .n_heads = c->n_heads,
        .window = c->sliding_window,
        .scale = 1.0f / sqrtf((float)c->head_dim),
    };
}

/* Runs the M rows of the run state through the model; then, if out, the
 * logits of n_out rows: out_rows[i] (NULL: rows 0..n_out-1) into out[i][V].
 * Every op is batch-invariant (kvr_compute_backend.h), so each row's result
 * is the same whatever else is in the pass. */
static kvr_status_t forward(kvr_ctx_t *ctx, const struct kvr_kv_pool *pool, int32_t M,
                            kvr_layer_done_fn layer_done, void *arg, const int32_t *out_rows,
                            int32_t n_out, float *out)
{
    const unsigned acc = KVR_MM_INVARIANT | KVR_MM_ACCUMULATE, inv = KVR_MM_INVARIANT;
    const kvr_model_t *m = ctx->model;
    const struct kvr_model_config *c = &m->cfg;
    const struct kvr_model_weights *w = &m->w;
    const struct kvr_compute_ops *ops = ctx->be->ops;
    struct kvr_compute_backend *be = ctx->be;
    struct kvr_run_state *s = &ctx->s;
    const int32_t d = c->hidden;

    ops->embed(be, s->x, s->tokens, M, &w->embed);
    struct kvr_attn_args a = attn_args(c, s, pool, M);
    for (int32_t l = 0; l < c->n_layers; l++) {
        const struct kvr_layer_weights *lw = &w->layers[l];
        /* attention */
        ops->rmsnorm(be, s->xb, s->x, M, d, lw->attn_norm, c->norm_eps);
        ops->matmul(be, s->q, s->xb, M, &lw->wq, lw->bq, inv);
        ops->matmul(be, s->k, s->xb, M, &lw->wk, lw->bk, inv);
        ops->matmul(be, s->v, s->xb, M, &lw->wv, lw->bv, inv);
        ops->rope(be, s->q, M, c->n_heads, c->head_dim, s->pos, m->inv_freq);
        ops->rope(be, s->k, M, c->n_kv_heads, c->head_dim, s->pos, m->inv_freq);
        a.layer_base = pool->layer_base[l];
        ops->kv_store(be, &a, s->k, s->v);
        ops->attention(be, &a, s->q, s->att);
        ops->matmul(be, s->x, s->att, M, &lw->wo, lw->bo, acc);
        /* feed-forward */
        ops->rmsnorm(be, s->xb, s->x, M, d, lw->ffn_norm, c->norm_eps);
        ops->matmul(be, s->hb, s->xb, M, &lw->w_gate, NULL, inv);
        ops->matmul(be, s->hb2, s->xb, M, &lw->w_up, NULL, inv);
        ops->swiglu(be, s->hb, s->hb2, (size_t)M * (size_t)c->intermediate);
        ops->matmul(be, s->x, s->hb, M, &lw->w_down, NULL, acc);
        if (layer_done) {
            kvr_status_t st = layer_done(arg, l);
            if (st != KVR_OK)
                return st;
        }
    }
    if (!out || n_out < 1)
        return KVR_OK;
    const float *xl = s->x;
    if (out_rows) { /* gather the rows that need logits */
        for (int32_t i = 0; i < n_out; i++)
            memcpy(s->xb + (size_t)i * (size_t)d, s->x + (size_t)out_rows[i] * (size_t)d,
                   (size_t)d * sizeof(float));
        xl = s->xb;
    }
    ops->rmsnorm(be, s->xlast, xl, n_out, d, w->final_norm, c->norm_eps);
    ops->matmul(be, out, s->xlast, n_out, &w->lm_head, NULL, inv);
    return KVR_OK;
}

static kvr_status_t check_tokens(const kvr_model_t *m, const int32_t *t, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        if (t[i] < 0 || t[i] >= m->cfg.vocab) {
            KVR_LOG_ERROR("engine", "token %d at index %d outside the vocabulary [0, %d)", t[i], i,
                          m->cfg.vocab);
            return KVR_ERR_INVALID;
        }
    }
    return KVR_OK;
}

kvr_status_t kvr_engine_prefill(kvr_ctx_t *ctx, const struct kvr_kv_pool *pool,
                                const struct kvr_prefill_req *req, float *logits_p)
{
    if (!ctx || !req || !req->tokens || !logits_p)
        return KVR_ERR_INVALID;
    const kvr_model_t *m = ctx->model;
    kvr_status_t st;
    if (req->n_tokens < 1 || req->n_cached < 0 || req->n_cached >= req->n_tokens) {
        KVR_LOG_ERROR("engine", "prefill: n_cached %d must be in [0, n_tokens %d)", req->n_cached,
                      req->n_tokens);
        return KVR_ERR_INVALID;
    }
    if (req->n_tokens > ctx->max_seq_len) {
        KVR_LOG_ERROR("engine", "prefill: %d tokens exceed max_seq_len %d", req->n_tokens,
                      ctx->max_seq_len);
        return KVR_ERR_INVALID;
    }
    if ((st = kvr_kv_check_pool(m, pool)) ||
        (st = kvr_kv_check_table(pool, req->block_table, req->n_blocks, req->n_tokens)) ||
        (st = check_tokens(m, req->tokens, req->n_tokens)))
        return st;
    const int32_t V = m->cfg.vocab;
    for (int32_t c0 = req->n_cached; c0 < req->n_tokens; c0 += ctx->max_tokens) {
        int32_t M = req->n_tokens - c0 < ctx->max_tokens ? req->n_tokens - c0 : ctx->max_tokens;
        bool last = c0 + M == req->n_tokens;
        for (int32_t i = 0; i < M; i++) {
            ctx->s.tokens[i] = req->tokens[c0 + i];
            ctx->s.pos[i] = c0 + i;
            ctx->s.bt[i] = req->block_table;
        }
        float *out = req->all_logits ? req->all_logits + (size_t)(c0 - req->n_cached) * (size_t)V
                     : last          ? logits_p
                                     : NULL;
        int32_t last_row = M - 1;
        st = forward(ctx, pool, M, last ? req->layer_done : NULL, req->layer_done_arg,
                     req->all_logits ? NULL : &last_row, req->all_logits ? M : 1, out);
        if (st != KVR_OK)
            return st;
        if (last && req->all_logits)
            memcpy(logits_p, out + (size_t)(M - 1) * (size_t)V, (size_t)V * sizeof(float));
    }
    return KVR_OK;
}

int32_t kvr_ctx_max_tokens(const kvr_ctx_t *ctx)
{
    return ctx ? ctx->max_tokens : 0;
}

kvr_status_t kvr_engine_prefill_batch(kvr_ctx_t *ctx, const struct kvr_kv_pool *pool,
                                      const struct kvr_prefill_seq *seqs, size_t n,
                                      kvr_layer_done_fn layer_done, void *layer_done_arg,
                                      float *logits_p)
{
    if (!ctx || !seqs || !logits_p || n < 1) {
        KVR_LOG_ERROR("engine", "prefill_batch: NULL argument or empty batch");
        return KVR_ERR_INVALID;
    }
    if (n == 1) {
        struct kvr_prefill_req r = {
            .tokens = seqs[0].tokens,
            .n_tokens = seqs[0].n_tokens,
            .n_cached = seqs[0].n_cached,
            .block_table = seqs[0].block_table,
            .n_blocks = seqs[0].n_blocks,
            .layer_done = layer_done,
            .layer_done_arg = layer_done_arg,
        };
        return kvr_engine_prefill(ctx, pool, &r, logits_p);
    }
    const kvr_model_t *m = ctx->model;
    kvr_status_t st;
    if ((st = kvr_kv_check_pool(m, pool)))
        return st;
    if (n > (size_t)ctx->max_tokens) {
        KVR_LOG_ERROR("engine", "prefill_batch: %zu sequences exceed max_tokens %d", n,
                      ctx->max_tokens);
        return KVR_ERR_INVALID;
    }
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const struct kvr_prefill_seq *q = &seqs[i];
        if (!q->tokens || q->n_tokens < 1 || q->n_cached < 0 || q->n_cached >= q->n_tokens) {
            KVR_LOG_ERROR("engine",
                          "prefill_batch: sequence %zu: n_cached %d must be in [0, n_tokens %d)", i,
                          q->n_cached, q->n_tokens);
            return KVR_ERR_INVALID;
        }
        if (q->n_tokens > ctx->max_seq_len) {
            KVR_LOG_ERROR("engine", "prefill_batch: sequence %zu: %d tokens exceed max_seq_len %d",
                          i, q->n_tokens, ctx->max_seq_len);
            return KVR_ERR_INVALID;
        }
        if ((st = kvr_kv_check_table(pool, q->block_table, q->n_blocks, q->n_tokens)) ||
            (st = check_tokens(m, q->tokens, q->n_tokens)))
            return st;
        total += q->n_tokens - q->n_cached;
    }
    if (total > ctx->max_tokens) {
        KVR_LOG_ERROR("engine", "prefill_batch: %" PRId64 " new tokens exceed max_tokens %d", total,
                      ctx->max_tokens);
        return KVR_ERR_INVALID;
    }
    /* rows: each sequence's new tokens in the caller's order; out_rows
     * (the one allocation of this call) its last row */
    int32_t *out_rows = calloc(n, sizeof(int32_t));
    if (!out_rows)
        return KVR_ERR_NO_MEMORY;
    int32_t M = 0;
    for (size_t i = 0; i < n; i++) {
        const struct kvr_prefill_seq *q = &seqs[i];
        int32_t nn = q->n_tokens - q->n_cached;
        for (int32_t j = 0; j < nn; j++) {
            ctx->s.tokens[M + j] = q->tokens[q->n_cached + j];
            ctx->s.pos[M + j] = q->n_cached + j;
            ctx->s.bt[M + j] = q->block_table;
        }
        M += nn;
        out_rows[i] = M - 1;
    }
    st = forward(ctx, pool, M, layer_done, layer_done_arg, out_rows, (int32_t)n, logits_p);
    free(out_rows);
    return st;
}

kvr_status_t kvr_engine_decode(kvr_ctx_t *ctx, const struct kvr_kv_pool *pool,
                               const struct kvr_decode_seq *seqs, int32_t n_seqs, float *logits_p)
{
    if (!ctx || !seqs || !logits_p)
        return KVR_ERR_INVALID;
    const kvr_model_t *m = ctx->model;
    kvr_status_t st;
    if (n_seqs < 1 || n_seqs > ctx->max_batch) {
        KVR_LOG_ERROR("engine", "decode: batch of %d outside [1, max_batch %d]", n_seqs,
                      ctx->max_batch);
        return KVR_ERR_INVALID;
    }
    if ((st = kvr_kv_check_pool(m, pool)))
        return st;
    for (int32_t i = 0; i < n_seqs; i++) {
        const struct kvr_decode_seq *q = &seqs[i];
        if (q->pos < 0 || q->pos >= ctx->max_seq_len) {
            KVR_LOG_ERROR("engine", "decode: sequence %d: position %d outside [0, %d)", i, q->pos,
                          ctx->max_seq_len);
            return KVR_ERR_INVALID;
        }
        if ((st = kvr_kv_check_table(pool, q->block_table, q->n_blocks, q->pos + 1)) ||
            (st = check_tokens(m, &q->token, 1)))
            return st;
        ctx->s.tokens[i] = q->token;
        ctx->s.pos[i] = q->pos;
        ctx->s.bt[i] = q->block_table;
    }
    return forward(ctx, pool, n_seqs, NULL, NULL, NULL, n_seqs, logits_p);
}

/* ------------------------------------------------------------ context */

static const char *const numerics_names[] = {
    [KVR_NUMERICS_F32] = "f32",
    [KVR_NUMERICS_BF16DOT] = "bf16dot",
};

#define N_NUMERICS ((int32_t)(sizeof(numerics_names) / sizeof(numerics_names[0])))

const char *kvr_engine_kernels(const char *backend)
{
    /* the backend kvr_ctx_create would take: NULL is "cuda" in a process
     * that opened a GPU (engine/backend.c) */
    const struct kvr_compute_ops *ops = kvr_compute_backend_find(backend);
    if (!ops)
        return NULL;
    if (!strcmp(ops->name, "cpu"))
        return kvr_cpu_kernels();
    return ops->name; /* "cuda": cuBLAS and its own kernels, bits of their own */
}

const char *kvr_numerics_name(int32_t numerics)
{
    return kvr_enum_name(numerics_names, N_NUMERICS, numerics);
}

kvr_status_t kvr_numerics_parse(const char *name, int32_t *numerics_p)
{
    return kvr_enum_parse(numerics_names, N_NUMERICS, name, numerics_p);
}

void kvr_ctx_destroy(kvr_ctx_t *ctx)
{
    if (!ctx)
        return;
    if (ctx->be) {
        struct kvr_compute_backend *be = ctx->be;
        void *bufs[] = {ctx->s.x,     ctx->s.xb,     ctx->s.q,   ctx->s.k,
                        ctx->s.v,     ctx->s.att,    ctx->s.hb,  ctx->s.hb2,
                        ctx->s.xlast, ctx->s.tokens, ctx->s.pos, (void *)ctx->s.bt};
        for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
            if (bufs[i])
                be->ops->free(be, bufs[i]);
        be->ops->destroy(be);
    }
    free(ctx);
}

kvr_status_t kvr_ctx_create(const kvr_model_t *m, const struct kvr_ctx_opts *opts,
                            kvr_ctx_t **ctx_p, char *err, size_t err_len)
{
    struct kvr_ctx_opts o = {0};
    if (opts)
        o = *opts;
    if (!m || !ctx_p) {
        ERR("kvr_ctx_create: NULL argument");
        return KVR_ERR_INVALID;
    }
    if (o.n_threads < 0 || o.max_batch < 0 || o.max_tokens < 0 || o.max_seq_len < 0) {
        ERR("kvr_ctx_create: negative option");
        return KVR_ERR_INVALID;
    }
    if (!strcmp(kvr_numerics_name(o.numerics), "?")) {
        ERR("kvr_ctx_create: numerics %d is not a mode (f32, bf16dot)", o.numerics);
        return KVR_ERR_INVALID;
    }
    const struct kvr_compute_ops *ops = kvr_compute_backend_find(o.backend);
    if (!ops) {
        ERR("compute backend \"%s\" not available (cpu)", o.backend);
        return KVR_ERR_NOT_FOUND;
    }
    if (o.numerics != KVR_NUMERICS_F32 && strcmp(ops->name, "cpu")) {
        ERR("numerics %s is a CPU backend mode; backend %s computes f32 only (set numerics f32)",
            kvr_numerics_name(o.numerics), ops->name);
        return KVR_ERR_UNSUPPORTED;
    }
    if (o.n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o.n_threads = n > 0 ? (int32_t)n : 1;
    }
    if (o.max_batch == 0)
        o.max_batch = 64;
    if (o.max_tokens == 0)
        o.max_tokens = 512;
    if (o.max_seq_len == 0 || o.max_seq_len > m->cfg.max_pos)
        o.max_seq_len = m->cfg.max_pos;
    kvr_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return KVR_ERR_NO_MEMORY;
    ctx->model = m;
    ctx->max_batch = o.max_batch;
    ctx->max_tokens = o.max_tokens;
    ctx->max_seq_len = o.max_seq_len;
    ctx->T = o.max_batch > o.max_tokens ? o.max_batch : o.max_tokens;
    const struct kvr_model_config *c = &m->cfg;
    int32_t qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    struct kvr_backend_params bp = {
        .n_threads = o.n_threads,
        .max_rows = ctx->T,
        .max_cols = c->intermediate > c->hidden ? c->intermediate : c->hidden,
        .max_seq_len = o.max_seq_len,
        .max_head_dim = c->head_dim,
        .gemv_max_rows = KVR_GEMV_ROWS,
        .numerics = o.numerics,
    };
    if (qd > bp.max_cols)
        bp.max_cols = qd;
    kvr_status_t st = ops->create(&bp, &ctx->be);
    if (st == KVR_ERR_UNSUPPORTED && o.numerics == KVR_NUMERICS_BF16DOT) {
        ERR("numerics bf16dot needs a CPU with AVX512-BF16 (vdpbf16ps: avx512_bf16 in "
            "/proc/cpuinfo, e.g. Zen 4+, Cooper Lake, Sapphire Rapids+) and this one lacks it%s; "
            "run every node with numerics f32",
            getenv("KVR_CPU_MATMUL") ? " (or KVR_CPU_MATMUL chose a lower kernel version)" : "");
        free(ctx);
        return st;
    }
    if (st != KVR_OK) {
        ERR("compute backend %s: %s", ops->name, kvr_status_str(st));
        free(ctx);
        return st;
    }
    struct kvr_compute_backend *be = ctx->be;
    size_t T = (size_t)ctx->T, d = (size_t)c->hidden, f = (size_t)c->intermediate;
    struct kvr_run_state *s = &ctx->s;
    s->x = be->ops->alloc(be, T * d * 4);
    s->xb = be->ops->alloc(be, T * d * 4);
    s->q = be->ops->alloc(be, T * (size_t)qd * 4);
    s->k = be->ops->alloc(be, T * (size_t)kd * 4);
    s->v = be->ops->alloc(be, T * (size_t)kd * 4);
    s->att = be->ops->alloc(be, T * (size_t)qd * 4);
    s->hb = be->ops->alloc(be, T * f * 4);
    s->hb2 = be->ops->alloc(be, T * f * 4);
    s->xlast = be->ops->alloc(be, T * d * 4);
    s->tokens = be->ops->alloc(be, T * sizeof(int32_t));
    s->pos = be->ops->alloc(be, T * sizeof(int32_t));
    s->bt = be->ops->alloc(be, T * sizeof(*s->bt));
    if (!s->x || !s->xb || !s->q || !s->k || !s->v || !s->att || !s->hb || !s->hb2 || !s->xlast ||
        !s->tokens || !s->pos || !s->bt) {
        ERR("kvr_ctx_create: out of memory for %zu-row run state", T);
        kvr_ctx_destroy(ctx);
        return KVR_ERR_NO_MEMORY;
    }
    KVR_LOG_DEBUG("engine", "ctx: backend %s, %d threads, max batch %d, max tokens %d, max seq %d",
                  ops->name, o.n_threads, o.max_batch, o.max_tokens, o.max_seq_len);
    *ctx_p = ctx;
    return KVR_OK;
}
