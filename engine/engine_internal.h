/*
 * engine_internal.h - private: the model's config, weights and the compute
 * context, shared by model.c, kv.c and forward.c.
 */
#ifndef KVR_ENGINE_INTERNAL_H
#define KVR_ENGINE_INTERNAL_H

#include <string.h>

#include "kvr_engine.h"
#include "kvr_compute_backend.h"
#include "safetensors.h"

#define KVR_MAX_EOS 8

enum kvr_arch {
    KVR_ARCH_LLAMA,
    KVR_ARCH_QWEN2,
    KVR_ARCH_MISTRAL,
};

struct kvr_model_config {
    enum kvr_arch arch;
    int32_t hidden;         /* hidden_size, d */
    int32_t intermediate;   /* intermediate_size, f */
    int32_t n_layers;       /* num_hidden_layers, L */
    int32_t n_heads;        /* num_attention_heads, H */
    int32_t n_kv_heads;     /* num_key_value_heads, Hkv (H % Hkv == 0) */
    int32_t head_dim;       /* head_dim, dh */
    int32_t vocab;          /* vocab_size, V */
    int32_t max_pos;        /* max_position_embeddings */
    int32_t sliding_window; /* 0 = none */
    float norm_eps;         /* rms_norm_eps */
    double rope_theta;
    /* rope_scaling */
    int rope_kind; /* 0 none, 1 linear, 2 llama3 */
    double rope_factor, rope_low_freq, rope_high_freq;
    int32_t rope_orig_max_pos;
    bool tie_embeddings;
    int32_t bos_id;
    int32_t eos_ids[KVR_MAX_EOS];
    size_t n_eos;
};

struct kvr_layer_weights {
    float *attn_norm;         /* [d] input_layernorm */
    struct kvr_weight wq;     /* [H*dh][d] */
    struct kvr_weight wk;     /* [Hkv*dh][d] */
    struct kvr_weight wv;     /* [Hkv*dh][d] */
    struct kvr_weight wo;     /* [d][H*dh] */
    float *bq, *bk, *bv, *bo; /* [H*dh], [Hkv*dh], [Hkv*dh], [d]; NULL if none */
    float *ffn_norm;          /* [d] post_attention_layernorm */
    struct kvr_weight w_gate; /* [f][d] */
    struct kvr_weight w_up;   /* [f][d] */
    struct kvr_weight w_down; /* [d][f] */
};

struct kvr_model_weights {
    struct kvr_weight embed;          /* [V][d] */
    struct kvr_layer_weights *layers; /* [L] */
    float *final_norm;                /* [d] */
    struct kvr_weight lm_head;        /* [V][d]; = embed when tied */
};

struct kvr_model {
    char *dir;
    struct kvr_model_config cfg;
    struct kvr_model_weights w;
    struct kvr_st_file **files;
    size_t n_files;
    void **owned; /* f32 copies (norms, biases, misaligned tensors) */
    size_t n_owned, cap_owned;
    uint64_t n_params;
    uint64_t fingerprint;
    float *inv_freq; /* [dh/2] RoPE inverse frequencies, scaling applied */
};

/* Run state: every buffer the forward pass needs, sized at ctx creation. */
struct kvr_run_state {
    float *x;           /* [T][d] residual stream */
    float *xb;          /* [T][d] normed activations / projections */
    float *q;           /* [T][H*dh] */
    float *k;           /* [T][Hkv*dh] */
    float *v;           /* [T][Hkv*dh] */
    float *att;         /* [T][H*dh] attention output */
    float *hb;          /* [T][f] gate, then silu(gate) * up */
    float *hb2;         /* [T][f] up */
    float *xlast;       /* [T][d] normed rows that need logits */
    int32_t *tokens;    /* [T] */
    int32_t *pos;       /* [T] */
    const int32_t **bt; /* [T] per-row block table */
};

struct kvr_ctx {
    const kvr_model_t *model;
    struct kvr_compute_backend *be;
    int32_t max_batch, max_tokens, max_seq_len;
    int32_t T; /* rows of the run state: max(max_batch, max_tokens) */
    struct kvr_run_state s;
};

/** Validates pool against the model and ctx. */
kvr_status_t kvr_kv_check_pool(const kvr_model_t *m, const struct kvr_kv_pool *pool);
/** Checks a block table covers n_tokens positions and names pool blocks. */
kvr_status_t kvr_kv_check_table(const struct kvr_kv_pool *pool, const int32_t *bt, int32_t n_blocks,
                                int32_t n_tokens);

/* An enum's name from its table of names (dense, 0..n-1): "?" when out of
 * range; and back: the value named, or KVR_ERR_INVALID.  The KV dtype and
 * numerics names of cluster files and flags. */
static inline const char *kvr_enum_name(const char *const *names, int32_t n, int32_t v)
{
    return v >= 0 && v < n && names[v] ? names[v] : "?";
}

static inline kvr_status_t kvr_enum_parse(const char *const *names, int32_t n, const char *name,
                                          int32_t *v_p)
{
    for (int32_t v = 0; name && v < n; v++) {
        if (names[v] && !strcmp(name, names[v])) {
            *v_p = v;
            return KVR_OK;
        }
    }
    return KVR_ERR_INVALID;
}

#endif
