/*
 * scheduler.h - the (prefill, decode) pair choice, a pure function over a
 * snapshot of the nodes' load and the directory's cached prefix per node.
 * No router state, no I/O: the same snapshot and seed give the same pick.
 */
#ifndef KVR_ROUTER_SCHEDULER_H
#define KVR_ROUTER_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr_cluster.h"

/** One node as the scheduler sees it. */
struct rt_sched_node {
    enum kvr_node_role role;
    bool alive;
    /* decode nodes */
    uint32_t total_blocks;  /* pool size */
    int64_t free_est;       /* free blocks, minus reservations on their way */
    uint32_t batch_size;    /* running sequences */
    uint32_t cached_blocks; /* leading blocks of this request it holds (directory) */
    bool cooling;           /* in a cool-down after failed transfers: last choice */
    /* prefill nodes */
    uint64_t inflight_tokens; /* prefill tokens dispatched to it and not done */
};

/** The request as the scheduler sees it. */
struct rt_sched_req {
    size_t n_tokens; /* tokens to prefill (prompt + streamed, on migration) */
    uint32_t block_size;
    uint32_t local_prefill_tokens; /* uncached suffix at most this: prefill on D */
    int avoid_p;                   /* prefill node that failed it last, -1 */
    uint64_t seed;                 /* tie-break jitter */
    uint64_t avoid_d;              /* mask of decode nodes that failed its transfer (0: none) */
};

enum rt_sched_result {
    RT_SCHED_OK,
    RT_SCHED_NO_DECODE, /* no live decode node */
    RT_SCHED_POOL_FULL, /* none has free blocks for it now: queue */
    RT_SCHED_TOO_BIG,   /* no live decode pool could ever hold it */
};

struct rt_sched_pick {
    int d;                /* decode node index */
    int p;                /* prefill node index, -1 when local */
    bool local;           /* D prefills it itself */
    bool no_prefill_node; /* local because no prefill node is alive */
    uint32_t need_blocks; /* blocks D must allocate (total minus cached) */
    uint32_t cached_tokens;
    uint32_t uncached_tokens;
};

/**
 * Picks D then P for a request.  D: among live decode nodes whose free_est
 * holds the uncached blocks (a hard limit), the lowest
 *     uncached blocks + 0.5 * blocks in use + batch size + jitter [0, 0.01);
 * a decode node that failed this request's transfer (avoid_d), or one cooling
 * down after failed transfers, only when no other fits;
 * P: the live prefill node with the fewest in-flight tokens (avoid_p last).
 * The prefill is local when the uncached suffix is at most
 * local_prefill_tokens or no prefill node is alive.
 * Returns RT_SCHED_OK and fills *pick_p, or why no pick was possible.
 */
enum rt_sched_result rt_sched_pick(const struct rt_sched_node *nodes, int n_nodes,
                                   const struct rt_sched_req *q, struct rt_sched_pick *pick_p);

#endif
