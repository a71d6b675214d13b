/*
 * kvr_engine.h - the model engine: Llama-family decoder models over a paged
 * KV pool that the caller owns.
 *
 * Three objects:
 *  - kvr_model_t: weights and config of one model directory in Hugging Face
 *    layout (config.json, model.safetensors or model-*-of-*.safetensors with
 *    model.safetensors.index.json, generation_config.json /
 *    tokenizer_config.json for bos/eos).  Architectures LlamaForCausalLM
 *    (Llama 2/3, rope_scaling "llama3"), Qwen2ForCausalLM (q/k/v biases),
 *    MistralForCausalLM.  Weights f32/f16/bf16, memory-mapped; read-only
 *    after load, shared by any number of contexts and threads.
 *  - struct kvr_kv_pool: the paged KV cache, memory the CALLER owns, one slab
 *    per layer, layout (DESIGN.md "KV blocks"), elements f32, bf16 or f16
 *    (struct kvr_kv_layout's dtype; attention widens them to f32):
 *        slab[layer][block][k|v][kv_head][token][head_dim]
 *    A (layer, block) slice is contiguous (kvr_kv_block_bytes()), and so is a
 *    run of adjacent blocks within one layer.  A decode node allocates one
 *    slab per layer and registers each with the transfer engine; a prefill
 *    node has its own pool for staging.
 *  - kvr_ctx_t: a compute context: backend, threads and scratch buffers
 *    sized once at creation; prefill and decode never allocate.  One thread
 *    uses a context at a time; use one context per thread.
 *
 * A sequence's KV lives in the blocks of its block table: token at position
 * p is in block block_table[p / block_size], slot p % block_size.
 */
#ifndef KVR_ENGINE_H
#define KVR_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

typedef struct kvr_model kvr_model_t;
typedef struct kvr_ctx kvr_ctx_t;

/* ------------------------------------------------------------------ model */

/** Loads the model in directory dir.  err (may be NULL) receives a message
 *  naming the file and the key or tensor that was wrong.
 *  @return KVR_OK;
 *          KVR_ERR_NOT_FOUND (no config.json, no safetensors file, a tensor
 *            the architecture needs is missing);
 *          KVR_ERR_INVALID (malformed JSON, a missing/invalid config key, bad
 *            safetensors header, truncated file, shape mismatch);
 *          KVR_ERR_UNSUPPORTED (architecture, dtype, rope_scaling type or
 *            hidden_act not supported);
 *          KVR_ERR_IO; KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_model_load(const char *dir, kvr_model_t **model_p, char *err, size_t err_len);
void kvr_model_destroy(kvr_model_t *model);

/** Accessors (config.json values). */
int32_t kvr_model_n_layers(const kvr_model_t *m);   /* num_hidden_layers */
int32_t kvr_model_n_heads(const kvr_model_t *m);    /* num_attention_heads */
int32_t kvr_model_n_kv_heads(const kvr_model_t *m); /* num_key_value_heads */
int32_t kvr_model_head_dim(const kvr_model_t *m);   /* head_dim or hidden/heads */
int32_t kvr_model_hidden(const kvr_model_t *m);     /* hidden_size */
int32_t kvr_model_intermediate(const kvr_model_t *m);
int32_t kvr_model_vocab(const kvr_model_t *m);   /* vocab_size = logits per token */
int32_t kvr_model_max_pos(const kvr_model_t *m); /* max_position_embeddings */
/** bos id, or -1 when the model directory names none. */
int32_t kvr_model_bos_id(const kvr_model_t *m);
/** The ids that end generation (generation_config.json eos_token_id, int or
 *  list, else config.json's); returns their count and points *ids_p at them
 *  (valid while the model lives).  kvr_model_eos_id() is the first, or -1. */
size_t kvr_model_eos_ids(const kvr_model_t *m, const int32_t **ids_p);
int32_t kvr_model_eos_id(const kvr_model_t *m);
/** "LlamaForCausalLM", "Qwen2ForCausalLM" or "MistralForCausalLM". */
const char *kvr_model_arch(const kvr_model_t *m);
/** "f32", "f16" or "bf16": the dtype of the weights in the files. */
const char *kvr_model_dtype(const kvr_model_t *m);
/** Number of parameters (distinct tensors; tied embeddings counted once). */
uint64_t kvr_model_n_params(const kvr_model_t *m);
/** 64-bit fingerprint over the config values the forward pass uses and
 *  every tensor's name, dtype, shape and a hash of its bytes' first and last
 *  4 KiB.  Two nodes whose fingerprints differ do not run the same model;
 *  exchanged in the P/D layout descriptor. */
uint64_t kvr_model_fingerprint(const kvr_model_t *m);

/* --------------------------------------------------------------- KV pool */

/* The numbers are the weights' (enum kvr_dtype in safetensors.h). */
enum kvr_kv_dtype {
    KVR_KV_F32 = 0,  /* the default */
    KVR_KV_F16 = 1,  /* IEEE half: f32 rounded to nearest even (beyond 65504: inf) */
    KVR_KV_BF16 = 2, /* bfloat16: f32 rounded to nearest even */
};

/** Bytes of one element of a KV dtype (4 or 2; 0 for an unknown dtype). */
static inline size_t kvr_kv_dtype_size(int32_t dtype)
{
    return dtype == KVR_KV_F32 ? 4 : dtype == KVR_KV_BF16 || dtype == KVR_KV_F16 ? 2 : 0;
}

/** "f32", "bf16" or "f16"; "?" for an unknown dtype. */
const char *kvr_kv_dtype_name(int32_t dtype);

/** Parses a KV dtype name ("f32", "bf16", "f16") into *dtype_p.
 *  @return KVR_OK; KVR_ERR_INVALID (not one of them; *dtype_p untouched). */
kvr_status_t kvr_kv_dtype_parse(const char *name, int32_t *dtype_p);

struct kvr_kv_layout {
    int32_t n_layers;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t block_size; /* tokens per block, default 16 */
    int32_t dtype;      /* enum kvr_kv_dtype: the element type of the slabs */
};

/** Fills *layout_p for model with block_size tokens a block of dtype
 *  elements.
 *  @return KVR_OK; KVR_ERR_INVALID (block_size < 1 or > 1024, dtype not an
 *          enum kvr_kv_dtype). */
kvr_status_t kvr_kv_layout_init(const kvr_model_t *m, int32_t block_size, int32_t dtype,
                                struct kvr_kv_layout *layout_p);

/** Bytes of one (layer, block) slice:
 *  2 * n_kv_heads * block_size * head_dim * kvr_kv_dtype_size(dtype). */
static inline size_t kvr_kv_block_bytes(const struct kvr_kv_layout *l)
{
    return 2u * (size_t)l->n_kv_heads * (size_t)l->block_size * (size_t)l->head_dim *
           kvr_kv_dtype_size(l->dtype);
}

/** Bytes of one layer's slab of n_blocks blocks. */
static inline size_t kvr_kv_layer_bytes(const struct kvr_kv_layout *l, int32_t n_blocks)
{
    return kvr_kv_block_bytes(l) * (size_t)n_blocks;
}

/** Element offset (in elements of the layout's dtype), within a layer slab,
 *  of (block, kv: 0 = K / 1 = V, head, token slot). */
static inline size_t kvr_kv_offset(const struct kvr_kv_layout *l, int32_t block, int kv,
                                   int32_t head, int32_t slot)
{
    return ((((size_t)block * 2 + (size_t)kv) * (size_t)l->n_kv_heads + (size_t)head) *
                (size_t)l->block_size +
            (size_t)slot) *
           (size_t)l->head_dim;
}

/** Address of (block, kv, head, slot)'s head_dim elements in a layer slab. */
static inline void *kvr_kv_ptr(const struct kvr_kv_layout *l, void *slab, int32_t block, int kv,
                               int32_t head, int32_t slot)
{
    return (char *)slab + kvr_kv_offset(l, block, kv, head, slot) * kvr_kv_dtype_size(l->dtype);
}

/** The pool: caller-owned slabs, layer_base[l] points at n_blocks *
 *  kvr_kv_block_bytes() bytes (64-byte aligned recommended). */
struct kvr_kv_pool {
    struct kvr_kv_layout layout;
    int32_t n_blocks;
    void **layer_base; /* [n_layers] slabs of layout.dtype elements */
};

/* --------------------------------------------------------------- context */

/* How the matmuls of bf16 weights compute (kvr_ctx_opts.numerics).  The
 * bits differ between modes, so every node of a cluster runs one (the KV
 * layout descriptor carries it, docs/engine.md "Numerics"). */
enum kvr_numerics {
    KVR_NUMERICS_F32 = 0,     /* default: weights widened to f32, f32 FMA on f32 activations */
    KVR_NUMERICS_BF16DOT = 1, /* bf16 weights: activations rounded to bf16, AVX512-BF16
                                 vdpbf16ps (CPUs with avx512_bf16 only); other dtypes as f32 */
};

/** The bit class of the kernels that backend (kvr_ctx_opts.backend; NULL:
 *  the default, "cuda" in a process that opened a GPU, else "cpu") computes
 *  with in this process: nodes whose classes differ compute different
 *  logits and KV in the last bits, so a cluster runs one (the KV layout
 *  descriptor carries it, the router refuses another).  "cpu-fma16.R": the
 *  x86-64-v4 and v3 kernels (16-lane FMA chains, the same bits);
 *  "cpu-base.R": the baseline kernels (no FMA: an x86-64 CPU without
 *  AVX2+FMA, KVR_CPU_MATMUL=base, or a build without the v3/v4 kernels:
 *  unoptimized, clang or not x86-64); R: the CPU kernels' arithmetic
 *  revision (KVR_CPU_ARITH_REV: a build whose kernels compute other bits
 *  is another class); "cuda": the GPU backend; NULL for a backend this
 *  build lacks. */
const char *kvr_engine_kernels(const char *backend);

/** "f32" or "bf16dot"; "?" for an unknown mode. */
const char *kvr_numerics_name(int32_t numerics);

/** Parses a numerics mode name ("f32", "bf16dot") into *numerics_p.
 *  @return KVR_OK; KVR_ERR_INVALID (not one of them; *numerics_p untouched). */
kvr_status_t kvr_numerics_parse(const char *name, int32_t *numerics_p);

struct kvr_ctx_opts {
    const char *backend; /* "cpu" (default, NULL)                          */
    int32_t n_threads;   /* 0 = number of online cores                     */
    int32_t max_batch;   /* most sequences in one decode step; 0 = 64      */
    int32_t max_tokens;  /* most tokens one forward chunk computes; longer
                            prefills are split internally; 0 = 512         */
    int32_t max_seq_len; /* longest sequence; 0 = max_position_embeddings  */
    int32_t numerics;    /* enum kvr_numerics; 0 = KVR_NUMERICS_F32        */
};

/** Creates a compute context for model (which must outlive it).  opts may be
 *  NULL (all defaults).
 *  @return KVR_OK; KVR_ERR_INVALID (negative values, unknown numerics);
 *          KVR_ERR_NOT_FOUND (no such backend); KVR_ERR_UNSUPPORTED (numerics
 *          bf16dot on a backend or CPU without AVX512-BF16: never a silent
 *          fall-back); KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_ctx_create(const kvr_model_t *m, const struct kvr_ctx_opts *opts,
                            kvr_ctx_t **ctx_p, char *err, size_t err_len);
void kvr_ctx_destroy(kvr_ctx_t *ctx);

/* --------------------------------------------------------------- prefill */

/** Called when layer `layer`'s K/V of every token of the request have been
 *  written into the pool (layers complete in order 0..n_layers-1, once
 *  each; a prompt longer than max_tokens is computed in chunks and the
 *  calls come during its last chunk); a prefill node posts that layer's
 *  writes from here.  Return KVR_OK to go on; any error aborts the prefill,
 *  which returns that status. */
typedef kvr_status_t (*kvr_layer_done_fn)(void *arg, int32_t layer);

struct kvr_prefill_req {
    const int32_t *tokens;        /* [n_tokens] the whole sequence so far          */
    int32_t n_tokens;             /* > n_cached                                    */
    int32_t n_cached;             /* tokens[0..n_cached) already have K/V in the
                                     blocks (prefix reuse); only the rest is
                                     computed.  0 for a fresh sequence.            */
    const int32_t *block_table;   /* [n_blocks] pool block ids, position order     */
    int32_t n_blocks;             /* >= ceil(n_tokens / block_size)                */
    kvr_layer_done_fn layer_done; /* optional: NULL                              */
    void *layer_done_arg;
    float *all_logits; /* optional: [n_tokens - n_cached][vocab] logits
                          of every computed position (tests); NULL      */
};

/** Runs tokens[n_cached..n_tokens) of one sequence through the model, writes
 *  their K/V into the blocks of its block table, calls layer_done as each
 *  layer completes, and writes the logits of the last position into
 *  logits_p[vocab].
 *  @return KVR_OK; KVR_ERR_INVALID (token id outside the vocabulary, n_cached
 *          outside [0, n_tokens), n_tokens > max_seq_len, a block id outside
 *          the pool, too few blocks, pool layout not the model's);
 *          an error returned by layer_done. */
kvr_status_t kvr_engine_prefill(kvr_ctx_t *ctx, const struct kvr_kv_pool *pool,
                                const struct kvr_prefill_req *req, float *logits_p);

/** One sequence of a batched prefill (kvr_engine_prefill_batch). */
struct kvr_prefill_seq {
    const int32_t *tokens;      /* [n_tokens] the whole sequence so far     */
    int32_t n_tokens;           /* > n_cached                               */
    int32_t n_cached;           /* tokens with K/V already in the blocks    */
    const int32_t *block_table; /* [n_blocks] pool block ids, own blocks    */
    int32_t n_blocks;           /* >= ceil(n_tokens / block_size)           */
};

/** Prefills n sequences in one forward pass: the projections and the MLP
 *  run over the new rows of all of them together, attention runs per
 *  sequence through its own block table over its own cached prefix, and
 *  logits_p[n][vocab] receives each sequence's last-position logits.
 *  layer_done (optional) is called once per layer for the whole batch.  The
 *  new tokens of all sequences together must fit in one chunk (sum of
 *  n_tokens - n_cached <= max_tokens); the sequences write disjoint blocks.
 *  Each sequence's logits and K/V are bit for bit those of
 *  kvr_engine_prefill() on it alone, of any length (every kernel is
 *  batch-invariant).  n = 1 is kvr_engine_prefill().
 *  @return KVR_OK; KVR_ERR_INVALID (n < 1, too many new tokens, or a
 *          sequence invalid as for kvr_engine_prefill); an error returned by
 *          layer_done. */
kvr_status_t kvr_engine_prefill_batch(kvr_ctx_t *ctx, const struct kvr_kv_pool *pool,
                                      const struct kvr_prefill_seq *seqs, size_t n,
                                      kvr_layer_done_fn layer_done, void *layer_done_arg,
                                      float *logits_p);

/** The most new tokens one kvr_engine_prefill_batch() call takes (the
 *  context's max_tokens). */
int32_t kvr_ctx_max_tokens(const kvr_ctx_t *ctx);

/* ---------------------------------------------------------------- decode */

struct kvr_decode_seq {
    int32_t token;              /* the token at position pos (the last sampled) */
    int32_t pos;                /* its position = number of tokens before it     */
    const int32_t *block_table; /* [n_blocks]; positions 0..pos-1 hold K/V       */
    int32_t n_blocks;           /* >= pos / block_size + 1                        */
};

/** One decode step over a batch of n_seqs sequences of any lengths, one
 *  token each: writes each token's K/V at its position and writes
 *  logits_p[n_seqs][vocab].  Sequences may share read-only (prefix) blocks;
 *  the block each one writes (block_table[pos / block_size]) must be its
 *  own.  Batch invariant: each sequence's logits are bit for bit those of
 *  decoding it alone.
 *  @return KVR_OK; KVR_ERR_INVALID (n_seqs outside [1, max_batch], a token or
 *          block id out of range, pos >= max_seq_len, too few blocks, pool
 *          layout not the model's). */
kvr_status_t kvr_engine_decode(kvr_ctx_t *ctx, const struct kvr_kv_pool *pool,
                               const struct kvr_decode_seq *seqs, int32_t n_seqs, float *logits_p);

#endif
