/*
 * test_directory.c - the router's block directory (router/directory.c):
 * add/remove/lookup with per-node counts, the longest cached prefix per
 * node (a node holding blocks 0,1,3 of a chain gets credit for 2, not 3),
 * the bounds (entries in all, blocks per node), clearing one node while
 * others keep their entries, and a randomized run checked against a plain
 * reference table.
 */
#include <stdint.h>
#include <string.h>

#include "directory.h"
#include "kvr_test.h"

static void basics(void)
{
    rt_dir_t d;
    KVR_CHECK(rt_dir_init(&d, 1000));
    KVR_CHECK(rt_dir_add(&d, 0, 11));
    KVR_CHECK(rt_dir_add(&d, 0, 11)); /* again: no double count */
    KVR_CHECK(rt_dir_add(&d, 5, 11));
    KVR_CHECK(rt_dir_add(&d, 5, 0)); /* hash 0 is a valid key */
    KVR_CHECK_EQ(rt_dir_lookup(&d, 11), (1ull << 0) | (1ull << 5));
    KVR_CHECK_EQ(rt_dir_lookup(&d, 0), 1ull << 5);
    KVR_CHECK_EQ(rt_dir_lookup(&d, 12), 0);
    KVR_CHECK_EQ(rt_dir_entries(&d), 2);
    KVR_CHECK_EQ(rt_dir_node_blocks(&d, 0), 1);
    KVR_CHECK_EQ(rt_dir_node_blocks(&d, 5), 2);
    rt_dir_remove(&d, 0, 11);
    rt_dir_remove(&d, 0, 11); /* not held any more: no-op */
    rt_dir_remove(&d, 3, 11); /* never held: no-op */
    KVR_CHECK_EQ(rt_dir_lookup(&d, 11), 1ull << 5);
    KVR_CHECK_EQ(rt_dir_node_blocks(&d, 0), 0);
    KVR_CHECK_EQ(rt_dir_entries(&d), 2);
    rt_dir_remove(&d, 5, 11); /* last holder: the entry goes */
    KVR_CHECK_EQ(rt_dir_entries(&d), 1);
    KVR_CHECK_EQ(rt_dir_lookup(&d, 11), 0);
    rt_dir_add(&d, 63, 99); /* the highest node index */
    KVR_CHECK_EQ(rt_dir_lookup(&d, 99), 1ull << 63);
    rt_dir_fini(&d);
}

static void longest_prefix(void)
{
    rt_dir_t d;
    KVR_CHECK(rt_dir_init(&d, 1000));
    const uint64_t h[5] = {101, 102, 103, 104, 105};
    /* node 0: blocks 0..4; node 1: 0,1,3 (a hole); node 2: 1..4 (no block 0);
     * node 3: 0..2; node 4: nothing */
    for (int i = 0; i < 5; i++)
        rt_dir_add(&d, 0, h[i]);
    rt_dir_add(&d, 1, h[0]);
    rt_dir_add(&d, 1, h[1]);
    rt_dir_add(&d, 1, h[3]);
    for (int i = 1; i < 5; i++)
        rt_dir_add(&d, 2, h[i]);
    for (int i = 0; i < 3; i++)
        rt_dir_add(&d, 3, h[i]);
    uint32_t ov[RT_DIR_MAX_NODES];
    memset(ov, 0xff, sizeof(ov));
    uint64_t mask = 0x1f; /* nodes 0..4 */
    rt_dir_overlap(&d, mask, h, 5, ov);
    KVR_CHECK_EQ(ov[0], 5);
    KVR_CHECK_EQ(ov[1], 2);
    KVR_CHECK_EQ(ov[2], 0);
    KVR_CHECK_EQ(ov[3], 3);
    KVR_CHECK_EQ(ov[4], 0);
    KVR_CHECK_EQ(ov[5], 0); /* outside the mask: zeroed */
    /* a node left out of the mask gets nothing, whatever it holds */
    rt_dir_overlap(&d, 0x1e, h, 5, ov);
    KVR_CHECK_EQ(ov[0], 0);
    KVR_CHECK_EQ(ov[3], 3);
    /* a shorter query is capped by its own length */
    rt_dir_overlap(&d, mask, h, 2, ov);
    KVR_CHECK_EQ(ov[0], 2);
    KVR_CHECK_EQ(ov[1], 2);
    KVR_CHECK_EQ(ov[3], 2);
    /* the walk stops at each node's first miss, in query order */
    const uint64_t other[3] = {102, 101, 103};
    rt_dir_overlap(&d, mask, other, 3, ov);
    KVR_CHECK_EQ(ov[0], 3);
    KVR_CHECK_EQ(ov[1], 2);
    KVR_CHECK_EQ(ov[2], 1);
    KVR_CHECK_EQ(ov[3], 3);
    rt_dir_fini(&d);
}

static void bounds(void)
{
    rt_dir_t d;
    KVR_CHECK(rt_dir_init(&d, 100));
    for (uint64_t h = 1; h <= 100; h++)
        KVR_CHECK(rt_dir_add(&d, 0, h));
    KVR_CHECK(!rt_dir_add(&d, 0, 1000)); /* a new hash past the bound */
    KVR_CHECK(!rt_dir_add(&d, 1, 1000));
    KVR_CHECK(rt_dir_add(&d, 1, 50)); /* another holder of a known hash: no new entry */
    KVR_CHECK_EQ(rt_dir_entries(&d), 100);
    KVR_CHECK_EQ(d.refused, 2);
    KVR_CHECK_EQ(rt_dir_lookup(&d, 1000), 0);
    /* per-node bound: node 2 may hold 3 */
    rt_dir_set_limit(&d, 2, 3);
    for (uint64_t h = 1; h <= 3; h++)
        KVR_CHECK(rt_dir_add(&d, 2, h));
    KVR_CHECK(!rt_dir_add(&d, 2, 4));
    KVR_CHECK_EQ(rt_dir_node_blocks(&d, 2), 3);
    rt_dir_remove(&d, 2, 1);
    KVR_CHECK(rt_dir_add(&d, 2, 4)); /* room again */
    /* a removal frees room for a new hash */
    rt_dir_clear_node(&d, 0);
    KVR_CHECK(rt_dir_add(&d, 0, 1000));
    rt_dir_fini(&d);
}

static void clear_node(void)
{
    rt_dir_t d;
    KVR_CHECK(rt_dir_init(&d, 100000));
    /* many entries so that clearing shifts slots (backward-shift delete) */
    for (uint64_t h = 1; h <= 20000; h++) {
        rt_dir_add(&d, 7, h * 0x9e3779b97f4a7c15ull);
        if (h % 3 == 0)
            rt_dir_add(&d, 9, h * 0x9e3779b97f4a7c15ull);
    }
    KVR_CHECK_EQ(rt_dir_node_blocks(&d, 7), 20000);
    KVR_CHECK_EQ(rt_dir_node_blocks(&d, 9), 6666);
    rt_dir_clear_node(&d, 7);
    KVR_CHECK_EQ(rt_dir_node_blocks(&d, 7), 0);
    KVR_CHECK_EQ(rt_dir_entries(&d), 6666);
    for (uint64_t h = 1; h <= 20000; h++)
        KVR_CHECK_EQ(rt_dir_lookup(&d, h * 0x9e3779b97f4a7c15ull), h % 3 == 0 ? 1ull << 9 : 0);
    rt_dir_clear_node(&d, 9);
    KVR_CHECK_EQ(rt_dir_entries(&d), 0);
    rt_dir_fini(&d);
}

#define NH 500
#define NN 8

static void randomized(void)
{
    rt_dir_t d;
    KVR_CHECK(rt_dir_init(&d, 1u << 20));
    static uint64_t ref[NH]; /* mask per hash index */
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int op = 0; op < 200000; op++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int h = (int)(x % NH), node = (int)((x >> 16) % NN);
        uint64_t key = (uint64_t)h * 1000003u;
        switch ((x >> 32) % 9) {
        case 0:
        case 1:
        case 2:
        case 3:
            rt_dir_add(&d, node, key);
            ref[h] |= 1ull << node;
            break;
        case 4:
        case 5:
        case 6:
        case 7:
            rt_dir_remove(&d, node, key);
            ref[h] &= ~(1ull << node);
            break;
        default:
            if ((x >> 40) % 50 == 0) {
                rt_dir_clear_node(&d, node);
                for (int i = 0; i < NH; i++)
                    ref[i] &= ~(1ull << node);
            }
            break;
        }
    }
    size_t entries = 0;
    uint64_t per[NN] = {0};
    for (int i = 0; i < NH; i++) {
        KVR_CHECK_EQ(rt_dir_lookup(&d, (uint64_t)i * 1000003u), ref[i]);
        entries += ref[i] != 0;
        for (int k = 0; k < NN; k++)
            per[k] += (ref[i] >> k) & 1;
    }
    KVR_CHECK_EQ(rt_dir_entries(&d), entries);
    for (int k = 0; k < NN; k++)
        KVR_CHECK_EQ(rt_dir_node_blocks(&d, k), per[k]);
    rt_dir_fini(&d);
}

int main(void)
{
    basics();
    longest_prefix();
    bounds();
    clear_node();
    randomized();
    printf("directory: ok\n");
    return 0;
}
