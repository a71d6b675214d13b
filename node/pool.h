/*
 * pool.h - a node's KV pool: one slab per layer (the engine's layout,
 * kvr_engine.h), allocated and registered with the transfer engine once at
 * start, pre-faulted so that neither the engine nor an incoming write ever
 * takes a page fault, with transparent huge pages asked for where the
 * kernel has them.  The decode node packs one rkey per layer for the
 * router to relay; the prefill node's staging pool needs none.
 */
#ifndef KVR_NODE_POOL_H
#define KVR_NODE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_engine.h"
#include "kvr_xfer.h"

struct kvr_node_pool {
    struct kvr_kv_pool kv; /* what the engine reads and writes */
    kvr_xfer_mem_t **mem;  /* [n_layers] */
    void **rkeys;          /* [n_layers] packed rkeys, or NULL */
    size_t *rkey_lens;
    uint64_t setup_ns; /* allocation + registration + pre-fault, all layers */
    bool huge;         /* MADV_HUGEPAGE was accepted on every slab */
};

/** Allocates n_blocks blocks of layout per layer from xfer (memory the
 *  transport reaches fastest), pre-faults them and, when pack_rkeys, packs
 *  one rkey per layer.  err receives which layer and what failed.
 *  @return KVR_OK; KVR_ERR_INVALID (a slab over 4 GiB); errors of
 *          kvr_xfer_mem_alloc / kvr_xfer_mem_pack; KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_node_pool_create(kvr_xfer_engine_t *xfer, const struct kvr_kv_layout *layout,
                                  uint64_t n_blocks, bool pack_rkeys, struct kvr_node_pool *pool_p,
                                  char *err, size_t err_len);

/** Deregisters and frees every slab; a zeroed pool is a no-op. */
void kvr_node_pool_destroy(struct kvr_node_pool *pool);

#endif
