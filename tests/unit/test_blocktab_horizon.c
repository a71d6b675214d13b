/*
 * test_blocktab_horizon.c - the block table's allocation horizon (the KV
 * pool's faulted horizon while it is pre-faulted in the background): no
 * block at or above it is ever handed out, it is not counted as free or
 * available, raising it frees what it uncovers, lowering it works only over
 * free blocks, and a random mix of operations with a horizon that grows
 * keeps every invariant.
 */
#include <stdint.h>
#include <stdio.h>

#include "blocktab.h"
#include "kvr_test.h"

#define N 256

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(void)
{
    kvr_blocktab_t *bt;
    KVR_CHECK_STATUS(kvr_blocktab_create(N, NULL, NULL, &bt), KVR_OK);
    KVR_CHECK_EQ(kvr_blocktab_horizon(bt), N);
    KVR_CHECK_STATUS(kvr_blocktab_set_horizon(bt, N + 1), KVR_ERR_INVALID);

    /* nothing faulted yet: nothing to hand out */
    KVR_CHECK_STATUS(kvr_blocktab_set_horizon(bt, 0), KVR_OK);
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(bt, &c);
    KVR_CHECK_EQ(c.total, N);
    KVR_CHECK_EQ(c.free, 0);
    KVR_CHECK_EQ(c.withheld, N);
    KVR_CHECK_EQ(kvr_blocktab_available(bt), 0);
    uint32_t ids[N];
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 1, ids), KVR_ERR_NO_RESOURCE);
    KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);

    /* 16 faulted: 16 allocatable, all below 16, the 17th refused */
    KVR_CHECK_STATUS(kvr_blocktab_set_horizon(bt, 16), KVR_OK);
    KVR_CHECK_EQ(kvr_blocktab_available(bt), 16);
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 17, ids), KVR_ERR_NO_RESOURCE);
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 10, ids), KVR_OK);
    for (int i = 0; i < 10; i++)
        KVR_CHECK(ids[i] < 16);
    uint32_t more[8];
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 7, more), KVR_ERR_NO_RESOURCE);
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 6, more), KVR_OK);
    for (int i = 0; i < 6; i++)
        KVR_CHECK(more[i] >= 10 && more[i] < 16);
    KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);

    /* lowering over referenced blocks is refused and changes nothing */
    KVR_CHECK_STATUS(kvr_blocktab_set_horizon(bt, 8), KVR_ERR_BUSY);
    KVR_CHECK_EQ(kvr_blocktab_horizon(bt), 16);
    KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);

    /* a cached block keeps the horizon from going below it, too */
    KVR_CHECK_STATUS(kvr_blocktab_store(bt, more[5], 0xabcdull), KVR_OK);
    kvr_blocktab_release(bt, more, 6);
    KVR_CHECK_STATUS(kvr_blocktab_set_horizon(bt, 12), KVR_ERR_BUSY);
    kvr_blocktab_clear_cache(bt);
    KVR_CHECK_STATUS(kvr_blocktab_set_horizon(bt, 12), KVR_OK);
    kvr_blocktab_counts(bt, &c);
    KVR_CHECK_EQ(c.free, 2);
    KVR_CHECK_EQ(c.withheld, N - 12);
    KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);

    /* raising uncovers free blocks; a run across the old horizon is one run */
    KVR_CHECK_STATUS(kvr_blocktab_set_horizon(bt, 64), KVR_OK);
    KVR_CHECK_EQ(kvr_blocktab_available(bt), 54);
    KVR_CHECK_STATUS(kvr_blocktab_alloc(bt, 20, ids + 10), KVR_OK);
    KVR_CHECK_EQ(kvr_blocktab_runs(ids + 10, 20), 1);
    KVR_CHECK_EQ(ids[10], 10);
    KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);
    kvr_blocktab_release(bt, ids, 30);
    KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);

    /* random operations while the horizon grows: nothing at or above it
     * is ever handed out; every invariant after each step */
    KVR_CHECK_STATUS(kvr_blocktab_set_horizon(bt, 0), KVR_OK);
    uint32_t held[64][16];
    uint32_t nheld[64] = {0};
    uint64_t hash = 1;
    for (int step = 0; step < 20000; step++) {
        uint32_t h = kvr_blocktab_horizon(bt);
        if (h < N && next_rand() % 50 == 0) {
            uint32_t to = h + 1 + (uint32_t)(next_rand() % 8);
            KVR_CHECK_STATUS(kvr_blocktab_set_horizon(bt, to > N ? N : to), KVR_OK);
        }
        int slot = (int)(next_rand() % 64);
        if (nheld[slot]) {
            if (next_rand() % 2)
                (void)kvr_blocktab_store(bt, held[slot][0], hash++);
            kvr_blocktab_release(bt, held[slot], nheld[slot]);
            nheld[slot] = 0;
        } else {
            uint32_t n = 1 + (uint32_t)(next_rand() % 16);
            uint32_t avail = kvr_blocktab_available(bt);
            kvr_status_t s = kvr_blocktab_alloc(bt, n, held[slot]);
            KVR_CHECK_STATUS(s, avail >= n ? KVR_OK : KVR_ERR_NO_RESOURCE);
            if (s == KVR_OK) {
                nheld[slot] = n;
                for (uint32_t i = 0; i < n; i++)
                    KVR_CHECK(held[slot][i] < kvr_blocktab_horizon(bt));
            }
        }
        KVR_CHECK_STATUS(kvr_blocktab_check(bt), KVR_OK);
    }
    KVR_CHECK_EQ(kvr_blocktab_horizon(bt), N);
    kvr_blocktab_destroy(bt);
    printf("blocktab_horizon: ok\n");
    return 0;
}
