/*
 * test_scheduler.c - the router's pair choice (router/scheduler.c), a pure
 * function over a snapshot of the nodes: cached-prefix credit against load,
 * free blocks as a hard limit, the local-prefill threshold, no live prefill
 * node -> local, the prefill node by in-flight tokens (the one that failed
 * the request last avoided), and why no pick was possible.
 */
#include <stdint.h>
#include <string.h>

#include "kvr_test.h"
#include "scheduler.h"

#define BS 16

static struct rt_sched_node decode(uint32_t total, int64_t free_est, uint32_t batch,
                                   uint32_t cached)
{
    struct rt_sched_node n;
    memset(&n, 0, sizeof(n));
    n.role = KVR_NODE_ROLE_DECODE;
    n.alive = true;
    n.total_blocks = total;
    n.free_est = free_est;
    n.batch_size = batch;
    n.cached_blocks = cached;
    return n;
}

static struct rt_sched_node prefill(uint64_t inflight)
{
    struct rt_sched_node n;
    memset(&n, 0, sizeof(n));
    n.role = KVR_NODE_ROLE_PREFILL;
    n.alive = true;
    n.inflight_tokens = inflight;
    return n;
}

static struct rt_sched_req req(size_t tokens, uint64_t seed)
{
    struct rt_sched_req q = {tokens, BS, 32, -1, seed};
    return q;
}

/* A prefix cached on a busier node wins while its credit exceeds the load
 * difference, and loses once the load outweighs it. */
static void cached_credit_vs_load(void)
{
    struct rt_sched_node n[3];
    struct rt_sched_pick pk;
    struct rt_sched_req q = req(64 * BS, 1); /* 64 blocks */
    n[0] = prefill(0);
    /* node 1: idle, nothing cached; node 2: 40 of 64 blocks cached, 20 blocks
     * in use and 4 running: cost 24 + 10 + 4 = 38 < 64 */
    n[1] = decode(1000, 1000, 0, 0);
    n[2] = decode(1000, 980, 4, 40);
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &q, &pk), RT_SCHED_OK);
    KVR_CHECK_EQ(pk.d, 2);
    KVR_CHECK_EQ(pk.need_blocks, 24);
    KVR_CHECK_EQ(pk.cached_tokens, 40 * BS);
    KVR_CHECK_EQ(pk.uncached_tokens, 24 * BS);
    KVR_CHECK(!pk.local);
    KVR_CHECK_EQ(pk.p, 0);
    /* now node 2 is loaded: 100 blocks in use, 20 running: 24 + 50 + 20 = 94 > 64 */
    n[2] = decode(1000, 900, 20, 40);
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &q, &pk), RT_SCHED_OK);
    KVR_CHECK_EQ(pk.d, 1);
    KVR_CHECK_EQ(pk.need_blocks, 64);
    KVR_CHECK_EQ(pk.cached_tokens, 0);
    /* equal nodes: the seed breaks the tie, and both sides come up */
    n[1] = decode(1000, 1000, 0, 0);
    n[2] = decode(1000, 1000, 0, 0);
    int seen[3] = {0, 0, 0};
    for (uint64_t s = 1; s <= 64; s++) {
        q.seed = s;
        KVR_CHECK_EQ(rt_sched_pick(n, 3, &q, &pk), RT_SCHED_OK);
        seen[pk.d]++;
        struct rt_sched_pick again;
        rt_sched_pick(n, 3, &q, &again);
        KVR_CHECK_EQ(again.d, pk.d); /* pure: same snapshot, same seed, same pick */
    }
    KVR_CHECK(seen[1] > 0 && seen[2] > 0);
}

/* Free blocks are a hard limit: the cheapest node is skipped when it cannot
 * hold the uncached blocks; cached blocks do not count against it. */
static void free_blocks_hard_limit(void)
{
    struct rt_sched_node n[3];
    struct rt_sched_pick pk;
    struct rt_sched_req q = req(10 * BS, 7); /* 10 blocks */
    n[0] = prefill(0);
    n[1] = decode(10, 9, 0, 0); /* cheapest by load, but 9 < 10 free */
    n[2] = decode(100, 50, 8, 0);
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &q, &pk), RT_SCHED_OK);
    KVR_CHECK_EQ(pk.d, 2);
    n[1] = decode(10, 9, 0, 2); /* 2 cached: needs 8 <= 9 */
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &q, &pk), RT_SCHED_OK);
    KVR_CHECK_EQ(pk.d, 1);
    KVR_CHECK_EQ(pk.need_blocks, 8);
    /* nobody has room now, though both could hold it: queue */
    n[1] = decode(100, 5, 0, 0);
    n[2] = decode(100, -3, 0, 0); /* estimates may go below zero */
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &q, &pk), RT_SCHED_POOL_FULL);
    /* no live pool could ever hold it: too big */
    struct rt_sched_req big = req(101 * BS, 7);
    n[1] = decode(100, 100, 0, 0);
    n[2] = decode(100, 100, 0, 0);
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &big, &pk), RT_SCHED_TOO_BIG);
    /* a partial last block counts as a block */
    struct rt_sched_req edge = req(100 * BS + 1, 7);
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &edge, &pk), RT_SCHED_TOO_BIG);
    struct rt_sched_req fits = req(100 * BS, 7);
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &fits, &pk), RT_SCHED_OK);
    KVR_CHECK_EQ(pk.need_blocks, 100);
    /* dead decode nodes do not count: none live */
    n[1].alive = n[2].alive = false;
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &q, &pk), RT_SCHED_NO_DECODE);
}

/* The uncached suffix decides local vs disaggregated, at the threshold. */
static void local_threshold(void)
{
    struct rt_sched_node n[2];
    struct rt_sched_pick pk;
    n[0] = prefill(0);
    n[1] = decode(1000, 1000, 0, 0);
    struct rt_sched_req q = req(32, 3); /* 32 tokens, threshold 32 */
    KVR_CHECK_EQ(rt_sched_pick(n, 2, &q, &pk), RT_SCHED_OK);
    KVR_CHECK(pk.local);
    KVR_CHECK_EQ(pk.p, -1);
    KVR_CHECK(!pk.no_prefill_node);
    q.n_tokens = 33;
    KVR_CHECK_EQ(rt_sched_pick(n, 2, &q, &pk), RT_SCHED_OK);
    KVR_CHECK(!pk.local);
    KVR_CHECK_EQ(pk.p, 0);
    /* a long prompt whose prefix is cached: only the suffix counts */
    q.n_tokens = 10 * BS + 20; /* 10 full blocks cached, 20 tokens left */
    n[1] = decode(1000, 1000, 0, 10);
    KVR_CHECK_EQ(rt_sched_pick(n, 2, &q, &pk), RT_SCHED_OK);
    KVR_CHECK(pk.local);
    KVR_CHECK_EQ(pk.uncached_tokens, 20);
    KVR_CHECK_EQ(pk.need_blocks, 2); /* 16 + 4 tokens */
    /* threshold 0: always disaggregated while a prefill node lives */
    q.local_prefill_tokens = 0;
    KVR_CHECK_EQ(rt_sched_pick(n, 2, &q, &pk), RT_SCHED_OK);
    KVR_CHECK(!pk.local);
}

static void no_prefill_node(void)
{
    struct rt_sched_node n[3];
    struct rt_sched_pick pk;
    struct rt_sched_req q = req(1000, 5);
    n[0] = prefill(0);
    n[0].alive = false;
    n[1] = decode(1000, 1000, 0, 0);
    n[2] = prefill(0);
    n[2].alive = false;
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &q, &pk), RT_SCHED_OK);
    KVR_CHECK(pk.local);
    KVR_CHECK(pk.no_prefill_node);
    KVR_CHECK_EQ(pk.p, -1);
    KVR_CHECK_EQ(pk.d, 1);
    /* one comes back */
    n[2].alive = true;
    KVR_CHECK_EQ(rt_sched_pick(n, 3, &q, &pk), RT_SCHED_OK);
    KVR_CHECK(!pk.local);
    KVR_CHECK_EQ(pk.p, 2);
}

static void prefill_choice(void)
{
    struct rt_sched_node n[4];
    struct rt_sched_pick pk;
    struct rt_sched_req q = req(1000, 9);
    n[0] = prefill(5000);
    n[1] = decode(1000, 1000, 0, 0);
    n[2] = prefill(100);
    n[3] = prefill(300);
    KVR_CHECK_EQ(rt_sched_pick(n, 4, &q, &pk), RT_SCHED_OK);
    KVR_CHECK_EQ(pk.p, 2);
    /* the one that failed the request last is avoided while another lives */
    q.avoid_p = 2;
    KVR_CHECK_EQ(rt_sched_pick(n, 4, &q, &pk), RT_SCHED_OK);
    KVR_CHECK_EQ(pk.p, 3);
    n[0].alive = n[3].alive = false;
    KVR_CHECK_EQ(rt_sched_pick(n, 4, &q, &pk), RT_SCHED_OK);
    KVR_CHECK_EQ(pk.p, 2); /* the only one left */
}

int main(void)
{
    cached_credit_vs_load();
    free_blocks_hard_limit();
    local_threshold();
    no_prefill_node();
    prefill_choice();
    printf("scheduler: ok\n");
    return 0;
}
