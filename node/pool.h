/*
 * pool.h - a node's KV pool: one slab per layer (the engine's layout,
 * kvr_engine.h), allocated and registered with the transfer engine once at
 * start, pre-faulted so that neither the engine nor an incoming write ever
 * takes a page fault, with transparent huge pages asked for where the
 * kernel has them.  The decode node packs one rkey per layer for the
 * router to relay; the prefill node's staging pool needs none.
 *
 * Pre-faulting a large pool is seconds on a VM whose first touch of a page
 * is slow (1 GiB: 262,144 faults of 10-16 us).  kvr_node_pool_create does
 * it before it returns; kvr_node_pool_create_async returns once the slabs
 * are registered and faults them on a thread of its own, in chunks of
 * whole blocks (about 2 MiB of each layer), every layer's part of a chunk
 * before the next chunk, and publishes the "faulted horizon": blocks
 * [0, kvr_node_pool_faulted()) are resident in every layer.  The owner
 * hands out only blocks below the horizon (kvr_blocktab_set_horizon), so
 * the node can register and serve at once and still no page of the data
 * path is touched first by a request.
 */
#ifndef KVR_NODE_POOL_H
#define KVR_NODE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_engine.h"
#include "kvr_xfer.h"

struct kvr_node_pool_fault; /* the pre-fault thread's state (pool.c) */

struct kvr_node_pool {
    struct kvr_kv_pool kv; /* what the engine reads and writes */
    kvr_xfer_mem_t **mem;  /* [n_layers] */
    void **rkeys;          /* [n_layers] packed rkeys, or NULL */
    size_t *rkey_lens;
    uint64_t setup_ns; /* allocation + registration (+ the pre-fault, when not async) */
    bool huge;         /* MADV_HUGEPAGE was accepted on every slab */
    struct kvr_node_pool_fault *fault; /* NULL: every block resident */
};

/** Allocates n_blocks blocks of layout per layer from xfer (memory the
 *  transport reaches fastest), pre-faults them and, when pack_rkeys, packs
 *  one rkey per layer.  err receives which layer and what failed.
 *  @return KVR_OK; KVR_ERR_INVALID (a slab over 4 GiB); errors of
 *          kvr_xfer_mem_alloc / kvr_xfer_mem_pack / kvr_xfer_mem_populate;
 *          KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_node_pool_create(kvr_xfer_engine_t *xfer, const struct kvr_kv_layout *layout,
                                  uint64_t n_blocks, bool pack_rkeys, struct kvr_node_pool *pool_p,
                                  char *err, size_t err_len);

/** As kvr_node_pool_create, but the slabs are registered unfaulted
 *  (KVR_XFER_MEM_DEFER_PREFAULT) and a thread faults them in the
 *  background (above); the horizon starts at 0.  The environment variable
 *  KVR_NODE_PREFAULT_GATE=PATH (for tests) holds the thread after its
 *  first chunk until PATH exists (at most 120 s).
 *  @return as kvr_node_pool_create; KVR_ERR_IO (no thread). */
kvr_status_t kvr_node_pool_create_async(kvr_xfer_engine_t *xfer, const struct kvr_kv_layout *layout,
                                        uint64_t n_blocks, bool pack_rkeys,
                                        struct kvr_node_pool *pool_p, char *err, size_t err_len);

/** The faulted horizon: blocks [0, n) are resident in every layer (any
 *  thread; n_blocks once the pre-fault is done or for a synchronous pool).
 *  It stops short of n_blocks for good when the pre-fault failed
 *  (kvr_node_pool_fault_status). */
uint32_t kvr_node_pool_faulted(const struct kvr_node_pool *pool);

/** Nanoseconds from the start of the pre-fault until every block was
 *  resident; 0 while it runs (or after it failed). */
uint64_t kvr_node_pool_fault_ns(const struct kvr_node_pool *pool);

/** KVR_OK, or why the pre-fault thread stopped short (logged there). */
kvr_status_t kvr_node_pool_fault_status(const struct kvr_node_pool *pool);

/** Stops and joins the pre-fault thread, deregisters and frees every slab;
 *  a zeroed pool is a no-op. */
void kvr_node_pool_destroy(struct kvr_node_pool *pool);

#endif
