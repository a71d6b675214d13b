/*
 * engine_test_util.h - helpers shared by the engine's unit tests: a KV pool
 * of the test model's layout in plain heap memory.
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

#endif
