/*
 * scheduler.c - the pair choice (see scheduler.h).  Decode first, since the
 * cached prefix on D decides how much there is to prefill; then the prefill
 * node by queued work; then local vs disaggregated by the uncached suffix.
 * The jitter is a splitmix64 stream from the request's seed, so ties break
 * at random and a test can still reproduce a pick.
 */
#include "scheduler.h"

static double jitter(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 * 0.01;
}

enum rt_sched_result rt_sched_pick(const struct rt_sched_node *nodes, int n_nodes,
                                   const struct rt_sched_req *q, struct rt_sched_pick *pick_p)
{
    uint64_t rng = q->seed;
    uint32_t bs = q->block_size;
    uint32_t total = (uint32_t)((q->n_tokens + bs - 1) / bs);
    int best = -1;
    double best_cost = 0;
    bool any_decode = false, any_fits = false;
    for (int i = 0; i < n_nodes; i++) {
        const struct rt_sched_node *n = &nodes[i];
        if (n->role != KVR_NODE_ROLE_DECODE || !n->alive)
            continue;
        any_decode = true;
        any_fits |= total <= n->total_blocks;
        uint32_t cached = n->cached_blocks < total ? n->cached_blocks : total;
        uint32_t need = total - cached;
        if (n->free_est < (int64_t)need)
            continue;
        double load = (double)n->total_blocks - (double)n->free_est;
        if (load < 0)
            load = 0;
        double cost = (double)need + 0.5 * load + (double)n->batch_size + jitter(&rng);
        if (i < 64 && (q->avoid_d >> i & 1))
            cost += 2e12; /* last of all */
        else if (n->cooling)
            cost += 1e12;
        if (best < 0 || cost < best_cost) {
            best = i;
            best_cost = cost;
        }
    }
    if (best < 0)
        return !any_decode ? RT_SCHED_NO_DECODE : any_fits ? RT_SCHED_POOL_FULL : RT_SCHED_TOO_BIG;
    int pbest = -1;
    double pcost = 0;
    for (int i = 0; i < n_nodes; i++) {
        const struct rt_sched_node *n = &nodes[i];
        if (n->role != KVR_NODE_ROLE_PREFILL || !n->alive)
            continue;
        double c = (double)n->inflight_tokens + (i == q->avoid_p ? 1e12 : 0) + jitter(&rng);
        if (pbest < 0 || c < pcost) {
            pbest = i;
            pcost = c;
        }
    }
    uint32_t cached_blocks = nodes[best].cached_blocks < total ? nodes[best].cached_blocks : total;
    uint64_t cached = (uint64_t)cached_blocks * bs;
    if (cached > q->n_tokens)
        cached = q->n_tokens;
    struct rt_sched_pick pk;
    pk.d = best;
    pk.cached_tokens = (uint32_t)cached;
    pk.uncached_tokens = (uint32_t)(q->n_tokens - cached);
    pk.need_blocks = total - cached_blocks;
    pk.no_prefill_node = pbest < 0;
    pk.local = pbest < 0 || pk.uncached_tokens <= q->local_prefill_tokens;
    pk.p = pk.local ? -1 : pbest;
    *pick_p = pk;
    return RT_SCHED_OK;
}
