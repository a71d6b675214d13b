/*
 * directory.h - the router's block directory: which decode nodes hold which
 * KV blocks.  A leaf module (no router state): a map from a block's chained
 * sequence hash to a 64-bit mask of node indices, with a count per node and
 * a bound on the number of entries, so that no node can grow it without
 * limit.  Single-threaded; lookups do not allocate.
 */
#ifndef KVR_ROUTER_DIRECTORY_H
#define KVR_ROUTER_DIRECTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "u64map.h"

#define RT_DIR_MAX_NODES 64 /* node masks are 64-bit */

typedef struct rt_dir {
    rt_u64map_t map;                   /* sequence hash -> mask of nodes holding the block */
    uint64_t blocks[RT_DIR_MAX_NODES]; /* entries per node */
    uint64_t limit[RT_DIR_MAX_NODES];  /* most entries a node may have */
    size_t max_entries;                /* most hashes in the map */
    uint64_t refused;                  /* adds refused by a bound */
} rt_dir_t;

/** Empty directory holding at most max_entries distinct hashes (and each node
 * at most that many).  False when out of memory. */
bool rt_dir_init(rt_dir_t *d, size_t max_entries);
void rt_dir_fini(rt_dir_t *d);
/** A node may hold at most limit blocks (its pool size); more adds are
 * refused.  0 restores the directory-wide bound. */
void rt_dir_set_limit(rt_dir_t *d, int node, uint64_t limit);
/** Node holds block h.  False when a bound (or memory) refused it: the
 * directory then under-reports that node, which only costs cache credit. */
bool rt_dir_add(rt_dir_t *d, int node, uint64_t h);
/** Node no longer holds block h (no-op if it did not). */
void rt_dir_remove(rt_dir_t *d, int node, uint64_t h);
/** Node holds nothing (it died, restarted or dumped its cache). */
void rt_dir_clear_node(rt_dir_t *d, int node);
/** Mask of the nodes holding block h (0: none). */
uint64_t rt_dir_lookup(const rt_dir_t *d, uint64_t h);
/** For every node in mask: how many leading hashes of hashes[0..n) it holds,
 * in overlap_p[node] (the longest cached prefix, in blocks).  Entries of nodes
 * outside mask are set to 0. */
void rt_dir_overlap(const rt_dir_t *d, uint64_t mask, const uint64_t *hashes, size_t n,
                    uint32_t overlap_p[RT_DIR_MAX_NODES]);
/** Distinct hashes held by any node. */
static inline size_t rt_dir_entries(const rt_dir_t *d)
{
    return d->map.n;
}
/** Blocks the directory holds for node. */
static inline uint64_t rt_dir_node_blocks(const rt_dir_t *d, int node)
{
    return d->blocks[node];
}

#endif
