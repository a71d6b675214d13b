/*
 * u64map.h - an open-addressing hash map from uint64 keys to uint64 values
 * (linear probing, backward-shift deletion, grows at 70% load).  Used for
 * the block directory (sequence hash -> bitmask of decode nodes holding it)
 * and the request table (request id -> pointer).  Key 0 is remapped, so any
 * 64-bit key may be stored.  Single-threaded; lookups do not allocate.
 */
#ifndef KVR_ROUTER_U64MAP_H
#define KVR_ROUTER_U64MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct rt_u64map {
    uint64_t *keys; /* 0 = empty slot */
    uint64_t *vals;
    size_t cap; /* power of two */
    size_t n;
} rt_u64map_t;

#define RT_U64MAP_ZERO_KEY 0x9e3779b97f4a7c15ull

static inline uint64_t rt_u64map_fix(uint64_t k)
{
    return k ? k : RT_U64MAP_ZERO_KEY;
}

static inline size_t rt_u64map_slot(const rt_u64map_t *m, uint64_t k)
{
    uint64_t h = k * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 29)) & (m->cap - 1);
}

static inline bool rt_u64map_init(rt_u64map_t *m, size_t cap)
{
    size_t c = 16;
    while (c < cap)
        c <<= 1;
    m->keys = calloc(c, sizeof(uint64_t));
    m->vals = calloc(c, sizeof(uint64_t));
    m->cap = c;
    m->n = 0;
    return m->keys && m->vals;
}

static inline void rt_u64map_free(rt_u64map_t *m)
{
    free(m->keys);
    free(m->vals);
    m->keys = m->vals = NULL;
    m->cap = m->n = 0;
}

static inline bool rt_u64map_get(const rt_u64map_t *m, uint64_t k, uint64_t *v_p)
{
    k = rt_u64map_fix(k);
    for (size_t i = rt_u64map_slot(m, k);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == k) {
            *v_p = m->vals[i];
            return true;
        }
        if (!m->keys[i])
            return false;
    }
}

static inline bool rt_u64map_put(rt_u64map_t *m, uint64_t k, uint64_t v);

static inline bool rt_u64map_grow(rt_u64map_t *m)
{
    rt_u64map_t n2;
    if (!rt_u64map_init(&n2, m->cap * 2)) {
        rt_u64map_free(&n2);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i])
            rt_u64map_put(&n2, m->keys[i], m->vals[i]);
    rt_u64map_free(m);
    *m = n2;
    return true;
}

/** Inserts or replaces.  Returns false only when growing failed. */
static inline bool rt_u64map_put(rt_u64map_t *m, uint64_t k, uint64_t v)
{
    if ((m->n + 1) * 10 > m->cap * 7 && !rt_u64map_grow(m))
        return false;
    k = rt_u64map_fix(k);
    for (size_t i = rt_u64map_slot(m, k);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == k) {
            m->vals[i] = v;
            return true;
        }
        if (!m->keys[i]) {
            m->keys[i] = k;
            m->vals[i] = v;
            m->n++;
            return true;
        }
    }
}

static inline void rt_u64map_del_slot(rt_u64map_t *m, size_t i)
{
    size_t mask = m->cap - 1;
    m->keys[i] = 0;
    m->n--;
    for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
        size_t home = rt_u64map_slot(m, m->keys[j]);
        /* move j back to i when its home is not in (i, j] (cyclically) */
        bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            m->keys[j] = 0;
            i = j;
        }
    }
}

static inline bool rt_u64map_del(rt_u64map_t *m, uint64_t k)
{
    k = rt_u64map_fix(k);
    for (size_t i = rt_u64map_slot(m, k);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == k) {
            rt_u64map_del_slot(m, i);
            return true;
        }
        if (!m->keys[i])
            return false;
    }
}

#endif
