/*
 * blocktab.c - block states, the prefix-cache map and the LRU list of the
 * decode node's KV pool (see blocktab.h).
 *
 * Per block: a refcount, an optional hash, LRU links and a free flag, all in
 * flat arrays sized at create.  The hash -> block map is open addressing with
 * linear probing (capacity a power of two >= 2 * nblocks) and backward-shift
 * deletion, so no tombstones accumulate.  Nothing allocates after create.
 * A block at or above the horizon is withheld: is_free 0, refcount 0, no
 * hash, on no list; moving the horizon flips is_free over the range.
 */
#include "blocktab.h"

#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX

struct run {
    uint32_t start, len;
};

struct kvr_blocktab {
    uint32_t n;
    uint32_t *ref;
    uint64_t *hash;
    uint8_t *hashed;
    uint8_t *is_free;
    uint32_t *prev, *next; /* LRU links; NIL-terminated */
    uint32_t lru_head;     /* oldest */
    uint32_t lru_tail;     /* newest */
    uint32_t nfree, nevictable, ncached, nref;
    uint32_t horizon; /* blocks [horizon, n) are withheld */
    uint64_t *mkeys;
    uint32_t *mvals; /* NIL = empty slot */
    uint32_t mmask;
    struct run *runs; /* scratch for alloc */
    kvr_blocktab_event_cb_t cb;
    void *cb_arg;
};

/* ---- map ---- */

static uint32_t map_slot(const kvr_blocktab_t *bt, uint64_t h)
{
    return (uint32_t)((h ^ (h >> 29)) & bt->mmask);
}

static uint32_t map_find(const kvr_blocktab_t *bt, uint64_t h)
{
    for (uint32_t i = map_slot(bt, h);; i = (i + 1) & bt->mmask) {
        if (bt->mvals[i] == NIL)
            return NIL;
        if (bt->mkeys[i] == h)
            return bt->mvals[i];
    }
}

static void map_insert(kvr_blocktab_t *bt, uint64_t h, uint32_t block)
{
    uint32_t i = map_slot(bt, h);
    while (bt->mvals[i] != NIL)
        i = (i + 1) & bt->mmask;
    bt->mkeys[i] = h;
    bt->mvals[i] = block;
}

static void map_delete(kvr_blocktab_t *bt, uint64_t h)
{
    uint32_t i = map_slot(bt, h);
    while (bt->mvals[i] != NIL && bt->mkeys[i] != h)
        i = (i + 1) & bt->mmask;
    if (bt->mvals[i] == NIL)
        return;
    /* backward-shift: move later entries of the cluster into the hole */
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & bt->mmask; bt->mvals[j] != NIL; j = (j + 1) & bt->mmask) {
        uint32_t home = map_slot(bt, bt->mkeys[j]);
        /* entry j may fill the hole if its home is not in (hole, j] cyclically */
        if (((j - home) & bt->mmask) >= ((j - hole) & bt->mmask)) {
            bt->mkeys[hole] = bt->mkeys[j];
            bt->mvals[hole] = bt->mvals[j];
            hole = j;
        }
    }
    bt->mvals[hole] = NIL;
}

/* ---- LRU ---- */

static void lru_unlink(kvr_blocktab_t *bt, uint32_t b)
{
    uint32_t p = bt->prev[b], nx = bt->next[b];
    if (p != NIL)
        bt->next[p] = nx;
    else
        bt->lru_head = nx;
    if (nx != NIL)
        bt->prev[nx] = p;
    else
        bt->lru_tail = p;
    bt->prev[b] = bt->next[b] = NIL;
    bt->nevictable--;
}

static void lru_push_newest(kvr_blocktab_t *bt, uint32_t b)
{
    bt->prev[b] = bt->lru_tail;
    bt->next[b] = NIL;
    if (bt->lru_tail != NIL)
        bt->next[bt->lru_tail] = b;
    else
        bt->lru_head = b;
    bt->lru_tail = b;
    bt->nevictable++;
}

/* ---- create/destroy ---- */

kvr_status_t kvr_blocktab_create(uint32_t nblocks, kvr_blocktab_event_cb_t cb, void *cb_arg,
                                 kvr_blocktab_t **bt_p)
{
    if (nblocks == 0 || nblocks > (1u << 30) || !bt_p)
        return KVR_ERR_INVALID;
    kvr_blocktab_t *bt = calloc(1, sizeof *bt);
    if (!bt)
        return KVR_ERR_NO_MEMORY;
    uint32_t cap = 16;
    while (cap < 2 * nblocks)
        cap <<= 1;
    bt->n = nblocks;
    bt->ref = calloc(nblocks, sizeof *bt->ref);
    bt->hash = calloc(nblocks, sizeof *bt->hash);
    bt->hashed = calloc(nblocks, 1);
    bt->is_free = malloc(nblocks);
    bt->prev = malloc(nblocks * sizeof *bt->prev);
    bt->next = malloc(nblocks * sizeof *bt->next);
    bt->mkeys = calloc(cap, sizeof *bt->mkeys);
    bt->mvals = malloc(cap * sizeof *bt->mvals);
    bt->runs = malloc((nblocks / 2 + 1) * sizeof *bt->runs);
    if (!bt->ref || !bt->hash || !bt->hashed || !bt->is_free || !bt->prev || !bt->next ||
        !bt->mkeys || !bt->mvals || !bt->runs) {
        kvr_blocktab_destroy(bt);
        return KVR_ERR_NO_MEMORY;
    }
    memset(bt->is_free, 1, nblocks);
    memset(bt->prev, 0xff, nblocks * sizeof *bt->prev);
    memset(bt->next, 0xff, nblocks * sizeof *bt->next);
    memset(bt->mvals, 0xff, cap * sizeof *bt->mvals);
    bt->mmask = cap - 1;
    bt->lru_head = bt->lru_tail = NIL;
    bt->nfree = nblocks;
    bt->horizon = nblocks;
    bt->cb = cb;
    bt->cb_arg = cb_arg;
    *bt_p = bt;
    return KVR_OK;
}

void kvr_blocktab_destroy(kvr_blocktab_t *bt)
{
    if (!bt)
        return;
    free(bt->ref);
    free(bt->hash);
    free(bt->hashed);
    free(bt->is_free);
    free(bt->prev);
    free(bt->next);
    free(bt->mkeys);
    free(bt->mvals);
    free(bt->runs);
    free(bt);
}

kvr_status_t kvr_blocktab_set_horizon(kvr_blocktab_t *bt, uint32_t h)
{
    if (h > bt->n)
        return KVR_ERR_INVALID;
    for (uint32_t b = h; b < bt->horizon; b++)
        if (!bt->is_free[b])
            return KVR_ERR_BUSY;
    for (uint32_t b = h; b < bt->horizon; b++)
        bt->is_free[b] = 0;
    for (uint32_t b = bt->horizon; b < h; b++)
        bt->is_free[b] = 1;
    bt->nfree = bt->nfree + h - bt->horizon; /* the range was free when lowering */
    bt->horizon = h;
    return KVR_OK;
}

uint32_t kvr_blocktab_horizon(const kvr_blocktab_t *bt)
{
    return bt->horizon;
}

uint32_t kvr_blocktab_available(const kvr_blocktab_t *bt)
{
    return bt->nfree + bt->nevictable;
}

/* ---- allocation ---- */

static void evict_oldest(kvr_blocktab_t *bt)
{
    uint32_t b = bt->lru_head;
    lru_unlink(bt, b);
    map_delete(bt, bt->hash[b]);
    bt->hashed[b] = 0;
    bt->ncached--;
    bt->is_free[b] = 1;
    bt->nfree++;
    if (bt->cb)
        bt->cb(bt->cb_arg, KVR_BLOCK_REMOVED, bt->hash[b], b);
}

static void take(kvr_blocktab_t *bt, uint32_t b)
{
    bt->is_free[b] = 0;
    bt->ref[b] = 1;
    bt->nfree--;
    bt->nref++;
}

static int run_cmp(const void *a, const void *b)
{
    const struct run *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->start < y->start ? -1 : (x->start > y->start);
}

kvr_status_t kvr_blocktab_alloc(kvr_blocktab_t *bt, uint32_t n, uint32_t *ids)
{
    if (n == 0)
        return KVR_OK;
    if (kvr_blocktab_available(bt) < n)
        return KVR_ERR_NO_RESOURCE;
    while (bt->nfree < n)
        evict_oldest(bt);

    /* enumerate free runs; first fit of one run covering n */
    uint32_t nruns = 0;
    for (uint32_t i = 0; i < bt->horizon;) {
        if (!bt->is_free[i]) {
            i++;
            continue;
        }
        uint32_t s = i;
        while (i < bt->horizon && bt->is_free[i])
            i++;
        if (i - s >= n) {
            for (uint32_t k = 0; k < n; k++) {
                take(bt, s + k);
                ids[k] = s + k;
            }
            return KVR_OK;
        }
        bt->runs[nruns].start = s;
        bt->runs[nruns].len = i - s;
        nruns++;
    }
    /* no single run: longest runs first */
    qsort(bt->runs, nruns, sizeof *bt->runs, run_cmp);
    uint32_t got = 0;
    for (uint32_t r = 0; r < nruns && got < n; r++)
        for (uint32_t k = 0; k < bt->runs[r].len && got < n; k++) {
            take(bt, bt->runs[r].start + k);
            ids[got++] = bt->runs[r].start + k;
        }
    return KVR_OK;
}

/* ---- prefix cache ---- */

uint32_t kvr_blocktab_peek(const kvr_blocktab_t *bt, const uint64_t *hashes, uint32_t n)
{
    uint32_t m = 0;
    while (m < n && map_find(bt, hashes[m]) != NIL)
        m++;
    return m;
}

uint32_t kvr_blocktab_match(kvr_blocktab_t *bt, const uint64_t *hashes, uint32_t n,
                            uint32_t max_match, uint32_t *ids)
{
    uint32_t m = 0;
    while (m < n && m < max_match) {
        uint32_t b = map_find(bt, hashes[m]);
        if (b == NIL)
            break;
        if (bt->ref[b] == 0) {
            lru_unlink(bt, b);
            bt->nref++;
        }
        bt->ref[b]++;
        ids[m++] = b;
    }
    return m;
}

kvr_status_t kvr_blocktab_store(kvr_blocktab_t *bt, uint32_t id, uint64_t hash)
{
    if (id >= bt->n || bt->ref[id] == 0)
        return KVR_ERR_INVALID;
    if (bt->hashed[id])
        return bt->hash[id] == hash ? KVR_OK : KVR_ERR_INVALID;
    if (map_find(bt, hash) != NIL)
        return KVR_ERR_BUSY;
    bt->hash[id] = hash;
    bt->hashed[id] = 1;
    bt->ncached++;
    map_insert(bt, hash, id);
    if (bt->cb)
        bt->cb(bt->cb_arg, KVR_BLOCK_STORED, hash, id);
    return KVR_OK;
}

void kvr_blocktab_release(kvr_blocktab_t *bt, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t b = ids[i];
        if (b >= bt->n || bt->ref[b] == 0)
            continue; /* defensive: a double release is a no-op */
        if (--bt->ref[b] > 0)
            continue;
        bt->nref--;
        if (bt->hashed[b]) {
            lru_push_newest(bt, b);
        } else {
            bt->is_free[b] = 1;
            bt->nfree++;
        }
    }
}

void kvr_blocktab_clear_cache(kvr_blocktab_t *bt)
{
    while (bt->lru_head != NIL)
        evict_oldest(bt);
}

void kvr_blocktab_foreach_cached(const kvr_blocktab_t *bt,
                                 void (*fn)(void *arg, uint64_t hash, uint32_t block), void *arg)
{
    for (uint32_t b = 0; b < bt->n; b++)
        if (bt->hashed[b])
            fn(arg, bt->hash[b], b);
}

void kvr_blocktab_counts(const kvr_blocktab_t *bt, struct kvr_blocktab_counts *c_p)
{
    c_p->total = bt->n;
    c_p->free = bt->nfree;
    c_p->referenced = bt->nref;
    c_p->cached = bt->ncached;
    c_p->evictable = bt->nevictable;
    c_p->withheld = bt->n - bt->horizon;
}

uint32_t kvr_blocktab_runs(const uint32_t *ids, uint32_t n)
{
    uint32_t r = n ? 1 : 0;
    for (uint32_t i = 1; i < n; i++)
        if (ids[i] != ids[i - 1] + 1)
            r++;
    return r;
}

kvr_status_t kvr_blocktab_check(const kvr_blocktab_t *bt)
{
    uint32_t nf = 0, nr = 0, nc = 0, ne = 0;
    for (uint32_t b = 0; b < bt->n; b++) {
        if (bt->is_free[b]) {
            if (bt->ref[b] || bt->hashed[b])
                return KVR_ERR_INTERNAL;
            nf++;
        }
        if (bt->ref[b])
            nr++;
        if (bt->hashed[b]) {
            nc++;
            if (map_find(bt, bt->hash[b]) != b)
                return KVR_ERR_INTERNAL;
        }
        if (b >= bt->horizon && (bt->is_free[b] || bt->ref[b] || bt->hashed[b]))
            return KVR_ERR_INTERNAL; /* a withheld block in use */
        if (b < bt->horizon && !bt->is_free[b] && !bt->ref[b] && !bt->hashed[b])
            return KVR_ERR_INTERNAL; /* leaked */
    }
    for (uint32_t b = bt->lru_head; b != NIL; b = bt->next[b]) {
        if (bt->ref[b] || !bt->hashed[b] || ++ne > bt->n)
            return KVR_ERR_INTERNAL;
    }
    uint32_t nm = 0;
    for (uint32_t i = 0; i <= bt->mmask; i++)
        if (bt->mvals[i] != NIL)
            nm++;
    if (nf != bt->nfree || nr != bt->nref || nc != bt->ncached || ne != bt->nevictable ||
        nm != nc || nf + nr + ne + (bt->n - bt->horizon) != bt->n)
        return KVR_ERR_INTERNAL;
    return KVR_OK;
}
