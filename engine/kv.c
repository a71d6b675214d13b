/*
 * kv.c - the paged KV pool's layout and the checks on pools and block
 * tables that prefill and decode run before touching any block, so a bad
 * block id from a caller is KVR_ERR_INVALID, never a stray write; the KV
 * dtype names (f32, bf16, f16) that cluster files and flags use.
 */
#include <string.h>

#include "engine_internal.h"
#include "kvr_log.h"

static const char *const kv_dtype_names[] = {
    [KVR_KV_F32] = "f32",
    [KVR_KV_BF16] = "bf16",
    [KVR_KV_F16] = "f16",
};

#define N_KV_DTYPES ((int32_t)(sizeof(kv_dtype_names) / sizeof(kv_dtype_names[0])))

const char *kvr_kv_dtype_name(int32_t dtype)
{
    return kvr_enum_name(kv_dtype_names, N_KV_DTYPES, dtype);
}

kvr_status_t kvr_kv_dtype_parse(const char *name, int32_t *dtype_p)
{
    return kvr_enum_parse(kv_dtype_names, N_KV_DTYPES, name, dtype_p);
}

kvr_status_t kvr_kv_layout_init(const kvr_model_t *m, int32_t block_size, int32_t dtype,
                                struct kvr_kv_layout *layout_p)
{
    if (!m || !layout_p || block_size < 1 || block_size > 1024 || kvr_kv_dtype_size(dtype) == 0)
        return KVR_ERR_INVALID;
    layout_p->n_layers = m->cfg.n_layers;
    layout_p->n_kv_heads = m->cfg.n_kv_heads;
    layout_p->head_dim = m->cfg.head_dim;
    layout_p->block_size = block_size;
    layout_p->dtype = dtype;
    return KVR_OK;
}

kvr_status_t kvr_kv_check_pool(const kvr_model_t *m, const struct kvr_kv_pool *pool)
{
    if (!pool || !pool->layer_base) {
        KVR_LOG_ERROR("engine", "KV pool or its layer_base is NULL");
        return KVR_ERR_INVALID;
    }
    const struct kvr_kv_layout *l = &pool->layout;
    if (l->n_layers != m->cfg.n_layers || l->n_kv_heads != m->cfg.n_kv_heads ||
        l->head_dim != m->cfg.head_dim || kvr_kv_dtype_size(l->dtype) == 0 || l->block_size < 1 ||
        pool->n_blocks < 1) {
        KVR_LOG_ERROR("engine",
                      "KV pool layout (layers %d, kv heads %d, head dim %d, block %d, dtype %s, "
                      "%d blocks) does not fit the model (layers %d, kv heads %d, head dim %d)",
                      l->n_layers, l->n_kv_heads, l->head_dim, l->block_size,
                      kvr_kv_dtype_name(l->dtype), pool->n_blocks, m->cfg.n_layers,
                      m->cfg.n_kv_heads, m->cfg.head_dim);
        return KVR_ERR_INVALID;
    }
    for (int32_t i = 0; i < l->n_layers; i++) {
        if (!pool->layer_base[i]) {
            KVR_LOG_ERROR("engine", "KV pool: layer_base[%d] is NULL", i);
            return KVR_ERR_INVALID;
        }
    }
    return KVR_OK;
}

kvr_status_t kvr_kv_check_table(const struct kvr_kv_pool *pool, const int32_t *bt, int32_t n_blocks,
                                int32_t n_tokens)
{
    int32_t need = (n_tokens + pool->layout.block_size - 1) / pool->layout.block_size;
    if (!bt || n_blocks < need) {
        KVR_LOG_ERROR("engine", "block table has %d blocks, %d tokens need %d", n_blocks, n_tokens,
                      need);
        return KVR_ERR_INVALID;
    }
    for (int32_t i = 0; i < need; i++) {
        if (bt[i] < 0 || bt[i] >= pool->n_blocks) {
            KVR_LOG_ERROR("engine", "block table entry %d = %d outside the pool's %d blocks", i,
                          bt[i], pool->n_blocks);
            return KVR_ERR_INVALID;
        }
    }
    return KVR_OK;
}
