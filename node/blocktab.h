/*
 * blocktab.h - the decode node's block table: which KV pool block is free,
 * referenced by requests, or held by the prefix cache.
 *
 * Every block is in exactly one of three states:
 *   free       - on no list; allocatable;
 *   referenced - refcount > 0 (reserved by, or shared among, requests);
 *                may also carry a hash (a cached prefix block in use);
 *   evictable  - refcount 0 and carrying a hash: in the prefix cache, on the
 *                LRU list, reusable by a later request with the same prefix,
 *                or evicted (oldest first) when allocation runs out of free
 *                blocks.
 * The prefix cache maps a chained sequence hash (kvr_blockhash.h) to the
 * block holding it.  Every hash that enters or leaves the cache is reported
 * through the event callback (BlockStored / BlockRemoved to the router).
 *
 * Allocation prefers contiguous runs: first fit of one run covering the whole
 * request, else the longest free runs first, so that a layer of a request is
 * as few one-sided writes as possible.  Everything is allocated at create.
 *
 * The allocation horizon (kvr_blocktab_set_horizon) withholds the blocks at
 * and above it: they are in none of the three states, never handed out and
 * not counted as free.  The decode node keeps it at the KV pool's faulted
 * horizon (pool.h) while the pool is pre-faulted in the background, so no
 * request is given a block whose pages were never touched.
 */
#ifndef KVR_BLOCKTAB_H
#define KVR_BLOCKTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_status.h"

enum kvr_block_event {
    KVR_BLOCK_STORED = 0,
    KVR_BLOCK_REMOVED = 1,
};

/** Called for every hash entering (STORED) or leaving (REMOVED) the cache. */
typedef void (*kvr_blocktab_event_cb_t)(void *arg, enum kvr_block_event ev, uint64_t hash,
                                        uint32_t block);

typedef struct kvr_blocktab kvr_blocktab_t;

struct kvr_blocktab_counts {
    uint32_t total;
    uint32_t free;       /* state free */
    uint32_t referenced; /* refcount > 0 */
    uint32_t cached;     /* carrying a hash (referenced or evictable) */
    uint32_t evictable;  /* cached and refcount 0 */
    uint32_t withheld;   /* at or above the horizon: total - withheld are usable */
};

/** @return KVR_OK; KVR_ERR_INVALID (nblocks 0); KVR_ERR_NO_MEMORY. */
kvr_status_t kvr_blocktab_create(uint32_t nblocks, kvr_blocktab_event_cb_t cb, void *cb_arg,
                                 kvr_blocktab_t **bt_p);
void kvr_blocktab_destroy(kvr_blocktab_t *bt);

/** Sets the allocation horizon: only blocks [0, h) are handed out (it
 *  starts at nblocks).  Raising it makes the blocks it uncovers free;
 *  lowering it is allowed over free blocks only.
 *  @return KVR_OK; KVR_ERR_INVALID (h > nblocks); KVR_ERR_BUSY (a block of
 *          [h, horizon) is referenced or cached; nothing changed). */
kvr_status_t kvr_blocktab_set_horizon(kvr_blocktab_t *bt, uint32_t h);

/** The allocation horizon (nblocks unless set lower). */
uint32_t kvr_blocktab_horizon(const kvr_blocktab_t *bt);

/** Blocks that an allocation could obtain now (free + evictable). */
uint32_t kvr_blocktab_available(const kvr_blocktab_t *bt);

/** Allocates n blocks (refcount 1), evicting LRU cached blocks when the free
 *  ones are too few.  ids[0..n) receive the blocks in allocation order.
 *  @return KVR_OK; KVR_ERR_NO_RESOURCE (fewer than n available; nothing
 *          changed). */
kvr_status_t kvr_blocktab_alloc(kvr_blocktab_t *bt, uint32_t n, uint32_t *ids);

/** Longest prefix of hashes[0..n) held in the cache: takes a reference on
 *  each of those blocks (removing them from the LRU), writes them to ids and
 *  returns how many matched.  At most max_match are taken. */
uint32_t kvr_blocktab_match(kvr_blocktab_t *bt, const uint64_t *hashes, uint32_t n,
                            uint32_t max_match, uint32_t *ids);

/** Counts the longest cached prefix of hashes[0..n) without taking anything. */
uint32_t kvr_blocktab_peek(const kvr_blocktab_t *bt, const uint64_t *hashes, uint32_t n);

/** Gives a referenced block (holding full, final KV) the hash that names its
 *  content.  @return KVR_OK (now cached, STORED reported); KVR_ERR_BUSY (the
 *  hash is already cached in another block: this one stays uncached);
 *  KVR_ERR_INVALID (bad id, unreferenced, or already hashed differently). */
kvr_status_t kvr_blocktab_store(kvr_blocktab_t *bt, uint32_t id, uint64_t hash);

/** Drops one reference from each block: a block reaching 0 becomes
 *  evictable (cached, most recently used) or free. */
void kvr_blocktab_release(kvr_blocktab_t *bt, const uint32_t *ids, uint32_t n);

/** Evicts every evictable block (REMOVED reported for each). */
void kvr_blocktab_clear_cache(kvr_blocktab_t *bt);

/** Calls fn for every cached (hash, block), in block order (for a full dump). */
void kvr_blocktab_foreach_cached(const kvr_blocktab_t *bt,
                                 void (*fn)(void *arg, uint64_t hash, uint32_t block), void *arg);

void kvr_blocktab_counts(const kvr_blocktab_t *bt, struct kvr_blocktab_counts *c_p);

/** Number of maximal runs of consecutive ids in ids[0..n) (1 = contiguous). */
uint32_t kvr_blocktab_runs(const uint32_t *ids, uint32_t n);

/** Checks every invariant (lists, counts, map); KVR_ERR_INTERNAL on a bug. */
kvr_status_t kvr_blocktab_check(const kvr_blocktab_t *bt);

#endif
