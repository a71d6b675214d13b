/*
 * test_blocktab.c - the decode node's block table: contiguous allocation,
 * prefix matching with refcounts, LRU eviction with events, and a random
 * sequence of operations with every invariant checked after each one.
 */
#include <stdint.h>

#include "blocktab.h"
#include "kvr_test.h"

struct evlog {
    int stored, removed;
    uint64_t last_removed;
};

static void on_event(void *arg, enum kvr_block_event ev, uint64_t hash, uint32_t block)
{
    struct evlog *l = arg;
    (void)block;
    if (ev == KVR_BLOCK_STORED)
        l->stored++;
    else {
        l->removed++;
        l->last_removed = hash;
    }
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(void)
{
    struct evlog ev = {0};
    kvr_blocktab_t *bt;
    KVR_CHECK_STATUS(kvr_blocktab_create(0, NULL, NULL, &bt), KVR_ERR_INVALID);
    KVR_CHECK_STATUS(kvr_blocktab_create(64, on_event, &ev, &bt), KVR_OK);

    uint32_t a[64], b[64], c[64];
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 10, a), KVR_OK);
    KVR_CHECK_EQ(kvr_blocktab_runs(a, 10), 1);
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 10, b), KVR_OK);
    KVR_CHECK_EQ(kvr_blocktab_runs(b, 10), 1);
    /* free a hole of 10 at the start, then ask for 12: first fit skips the hole */
    kvr_blocktab_release(bt, a, 10);
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 12, c), KVR_OK);
    KVR_CHECK_EQ(kvr_blocktab_runs(c, 12), 1);
    KVR_CHECK(c[0] >= 20);
    KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);
    /* too many: refused, nothing changed */
    struct kvr_blocktab_counts cn;
    kvr_blocktab_counts(bt, &cn);
    KVR_CHECK_EQ(cn.free, 42);
    uint32_t big[64];
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 43, big), KVR_ERR_NO_RESOURCE);
    kvr_blocktab_counts(bt, &cn);
    KVR_CHECK_EQ(cn.free, 42);
    /* 42 = hole of 10 + tail of 32: two runs, longest first */
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 42, big), KVR_OK);
    KVR_CHECK_EQ(kvr_blocktab_runs(big, 42), 2);
    KVR_CHECK(big[0] == 32);
    kvr_blocktab_release(bt, big, 42);
    kvr_blocktab_release(bt, c, 12);

    /* cache b's blocks under hashes 100..109, release: evictable */
    for (uint32_t i = 0; i < 10; i++)
        KVR_CHECK_STATUS(kvr_blocktab_store(bt, b[i], 100 + i), KVR_OK);
    KVR_CHECK_EQ(ev.stored, 10);
    KVR_CHECK_STATUS(kvr_blocktab_store(bt, b[0], 101), KVR_ERR_INVALID);
    kvr_blocktab_release(bt, b, 10);
    kvr_blocktab_counts(bt, &cn);
    KVR_CHECK_EQ(cn.evictable, 10);
    KVR_CHECK_EQ(cn.cached, 10);
    KVR_CHECK_EQ(cn.free, 54);
    KVR_CHECK_EQ(kvr_blocktab_available(bt), 64);

    /* a duplicate hash in another block is refused (BUSY) */
    uint32_t d[1];
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 1, d), KVR_OK);
    KVR_CHECK_STATUS(kvr_blocktab_store(bt, d[0], 105), KVR_ERR_BUSY);
    kvr_blocktab_release(bt, d, 1);

    /* matching: the longest cached prefix, capped */
    uint64_t q[6] = {100, 101, 102, 103, 999, 105};
    KVR_CHECK_EQ(kvr_blocktab_peek(bt, q, 6), 4);
    uint32_t m[6];
    KVR_CHECK_EQ(kvr_blocktab_match(bt, q, 6, 3, m), 3);
    KVR_CHECK(m[0] == b[0] && m[1] == b[1] && m[2] == b[2]);
    kvr_blocktab_counts(bt, &cn);
    KVR_CHECK_EQ(cn.evictable, 7);
    KVR_CHECK_EQ(cn.referenced, 3);
    KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);

    /* exhaust: allocation evicts the oldest unreferenced cached blocks, never
     * the referenced ones */
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 56, big), KVR_OK);
    KVR_CHECK_EQ(ev.removed, 2);
    KVR_CHECK_EQ(kvr_blocktab_peek(bt, q, 6), 3);
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 5, a), KVR_OK);
    KVR_CHECK_EQ(ev.removed, 7);
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 1, a), KVR_ERR_NO_RESOURCE);
    kvr_blocktab_counts(bt, &cn);
    KVR_CHECK_EQ(cn.referenced, 64);
    KVR_CHECK_EQ(cn.cached, 3);
    kvr_blocktab_release(bt, m, 3);
    kvr_blocktab_release(bt, big, 56);
    kvr_blocktab_release(bt, a, 5);
    kvr_blocktab_clear_cache(bt);
    kvr_blocktab_counts(bt, &cn);
    KVR_CHECK_EQ(cn.free, 64);
    KVR_CHECK_EQ(ev.stored - ev.removed, 0);
    KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);
    kvr_blocktab_destroy(bt);

    /* random operations, invariants after each */
    KVR_CHECK_STATUS(kvr_blocktab_create(257, NULL, NULL, &bt), KVR_OK);
    static uint32_t held[64][40];
    static uint32_t nheld[64];
    uint64_t next_hash = 1;
    for (int it = 0; it < 20000; it++) {
        int slot = (int)(next_rand() % 64);
        if (nheld[slot]) {
            if (next_rand() % 2)
                for (uint32_t i = 0; i < nheld[slot]; i++)
                    (void)kvr_blocktab_store(bt, held[slot][i], next_hash++ % 500);
            kvr_blocktab_release(bt, held[slot], nheld[slot]);
            nheld[slot] = 0;
        } else {
            uint32_t want = 1 + (uint32_t)(next_rand() % 40);
            uint64_t hq[8];
            for (int i = 0; i < 8; i++)
                hq[i] = (next_hash + (uint64_t)i) % 500;
            uint32_t got = kvr_blocktab_match(bt, hq, 8, want / 2, held[slot]);
            kvr_status_t s = kvr_blocktab_alloc(bt, want - got, held[slot] + got);
            if (s == KVR_OK) {
                nheld[slot] = want;
            } else {
                KVR_CHECK_STATUS(s, KVR_ERR_NO_RESOURCE);
                kvr_blocktab_release(bt, held[slot], got);
            }
        }
        KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);
    }
    kvr_blocktab_destroy(bt);
    printf("blocktab: ok\n");
    return 0;
}
