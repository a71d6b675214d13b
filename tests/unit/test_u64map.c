/*
 * test_u64map.c - the router's open-addressing map (router/u64map.h), used
 * for the block directory and the request table: 200k random put/get/del
 * operations checked against a plain reference array (backward-shift
 * deletion must never lose an entry), key 0, growth, and the "delete while
 * scanning slots" pattern the directory uses to clear one node's bits.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvr_test.h"
#include "u64map.h"

#define NKEYS 3000

int main(void)
{
    rt_u64map_t m;
    KVR_CHECK(rt_u64map_init(&m, 4));
    static uint64_t keys[NKEYS], vals[NKEYS];
    static bool present[NKEYS];
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < NKEYS; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* clustered keys collide in the probe sequence */
        keys[i] = i == 0 ? 0 : (i % 3 == 0 ? (uint64_t)i : x);
    }
    size_t n = 0;
    for (int op = 0; op < 200000; op++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % NKEYS);
        uint64_t v;
        switch ((x >> 20) % 3) {
        case 0:
            KVR_CHECK(rt_u64map_put(&m, keys[k], x));
            n += !present[k];
            present[k] = true;
            vals[k] = x;
            break;
        case 1:
            KVR_CHECK_EQ(rt_u64map_del(&m, keys[k]), present[k]);
            n -= present[k];
            present[k] = false;
            break;
        default:
            KVR_CHECK_EQ(rt_u64map_get(&m, keys[k], &v), present[k]);
            if (present[k])
                KVR_CHECK(v == vals[k]);
        }
        KVR_CHECK_EQ(m.n, n);
    }
    for (int k = 0; k < NKEYS; k++) {
        uint64_t v;
        KVR_CHECK_EQ(rt_u64map_get(&m, keys[k], &v), present[k]);
    }
    /* clear bit 0 everywhere, deleting entries that become 0, scanning slots */
    for (int k = 0; k < NKEYS; k++)
        if (present[k])
            rt_u64map_put(&m, keys[k], (uint64_t)(k % 2 ? 1 : 3));
    for (size_t i = 0; i < m.cap;) {
        if (m.keys[i] && (m.vals[i] & 1)) {
            if (m.vals[i] == 1) {
                rt_u64map_del_slot(&m, i);
                continue;
            }
            m.vals[i] &= ~1ull;
        }
        i++;
    }
    for (int k = 0; k < NKEYS; k++) {
        uint64_t v = 0;
        bool want = present[k] && k % 2 == 0;
        KVR_CHECK_EQ(rt_u64map_get(&m, keys[k], &v), want);
        if (want)
            KVR_CHECK_EQ(v, 2);
    }
    rt_u64map_free(&m);
    printf("u64map: ok\n");
    return 0;
}
