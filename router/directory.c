/*
 * directory.c - the block directory (see directory.h): a u64map from a
 * block's sequence hash to the mask of decode nodes holding it, a count per
 * node, and two bounds (entries in all, blocks per node) checked before an
 * add.  The longest cached prefix per node is one walk over the request's
 * hashes, narrowing the mask of nodes still matching.
 */
#include "directory.h"

#include <string.h>

bool rt_dir_init(rt_dir_t *d, size_t max_entries)
{
    memset(d, 0, sizeof(*d));
    d->max_entries = max_entries;
    for (int i = 0; i < RT_DIR_MAX_NODES; i++)
        d->limit[i] = max_entries;
    return rt_u64map_init(&d->map, max_entries < 4096 ? max_entries : 4096);
}

void rt_dir_fini(rt_dir_t *d)
{
    rt_u64map_free(&d->map);
}

void rt_dir_set_limit(rt_dir_t *d, int node, uint64_t limit)
{
    d->limit[node] = limit ? limit : d->max_entries;
}

bool rt_dir_add(rt_dir_t *d, int node, uint64_t h)
{
    uint64_t bit = 1ull << node, m = 0;
    bool known = rt_u64map_get(&d->map, h, &m);
    if (m & bit)
        return true;
    if (d->blocks[node] >= d->limit[node] || (!known && d->map.n >= d->max_entries) ||
        !rt_u64map_put(&d->map, h, m | bit)) {
        d->refused++;
        return false;
    }
    d->blocks[node]++;
    return true;
}

void rt_dir_remove(rt_dir_t *d, int node, uint64_t h)
{
    uint64_t bit = 1ull << node, m = 0;
    if (!rt_u64map_get(&d->map, h, &m) || !(m & bit))
        return;
    d->blocks[node]--;
    if (m == bit)
        rt_u64map_del(&d->map, h);
    else
        rt_u64map_put(&d->map, h, m & ~bit); /* existing key: never grows */
}

void rt_dir_clear_node(rt_dir_t *d, int node)
{
    uint64_t bit = 1ull << node;
    rt_u64map_t *m = &d->map;
    for (size_t i = 0; d->blocks[node] && i < m->cap;) {
        if (m->keys[i] && (m->vals[i] & bit)) {
            d->blocks[node]--;
            if (m->vals[i] == bit) {
                rt_u64map_del_slot(m, i); /* slot i now holds a shifted entry: re-check */
                continue;
            }
            m->vals[i] &= ~bit;
        }
        i++;
    }
    d->blocks[node] = 0;
}

uint64_t rt_dir_lookup(const rt_dir_t *d, uint64_t h)
{
    uint64_t m = 0;
    rt_u64map_get(&d->map, h, &m);
    return m;
}

void rt_dir_overlap(const rt_dir_t *d, uint64_t mask, const uint64_t *hashes, size_t n,
                    uint32_t overlap_p[RT_DIR_MAX_NODES])
{
    memset(overlap_p, 0, RT_DIR_MAX_NODES * sizeof(uint32_t));
    uint64_t live = mask;
    size_t k;
    for (k = 0; k < n && live; k++) {
        uint64_t held = rt_dir_lookup(d, hashes[k]);
        for (uint64_t lost = live & ~held; lost; lost &= lost - 1)
            overlap_p[__builtin_ctzll(lost)] = (uint32_t)k;
        live &= held;
    }
    for (; live; live &= live - 1)
        overlap_p[__builtin_ctzll(live)] = (uint32_t)k;
}
