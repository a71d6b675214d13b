/*
 * dispatch.c - from the queue to the nodes.  A dispatch asks the directory
 * how many leading blocks of the request each live decode node holds, hands
 * that and the nodes' load to the scheduler (a pure function), and sends
 * Reserve to the chosen D and, unless D prefills locally, Prefill to the
 * chosen P at the same time.  Every dispatch has its own id on the node
 * protocol, so a late message about an earlier attempt is never taken for
 * this one.  D's Reserved is relayed to P as PrefillTarget; Rejected with
 * NO_RESOURCE sends the request back to the queue's front.  A prefill retry
 * keeps the dispatch (its id and D's blocks): Reserve with attempt + 1
 * renews D's lease and names the new P, Prefill goes to that P with the
 * same attempt, and D's second Reserved is relayed as before.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"

#define MS (1000000ull)

/* The transfer token of the pair (p, d): random, made when this incarnation
 * of p is first introduced to this incarnation of d (registry.c forgets p's
 * tokens when p registers again; a new d incarnation makes a new one here).
 * It lives in p's node entry, one per decode node slot.  NULL when the
 * kernel gave no random bytes (logged: D then refuses P's transfers). */
static const uint8_t *pair_token(struct rt_node *p, const struct rt_node *d)
{
    if (p->token_d_inc[d->idx] == d->incarnation && d->incarnation)
        return p->pair_token[d->idx];
    uint8_t *t = p->pair_token[d->idx];
    size_t got = 0;
    while (got < RT_TOKEN_LEN) {
        ssize_t k = getrandom(t + got, RT_TOKEN_LEN - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            KVR_LOG_ERROR("router",
                          "no random bytes for the transfer token of %s -> %s (getrandom: %s): "
                          "the decode node will refuse this prefill node's transfers",
                          p->name, d->name, strerror(errno));
            p->token_d_inc[d->idx] = 0;
            return NULL;
        }
        got += (size_t)k;
    }
    p->token_d_inc[d->idx] = d->incarnation;
    return t;
}

static kvr_status_t send_prefill(rt_t *r, const struct rt_req *q, struct rt_node *p,
                                 const struct rt_node *d)
{
    Kvrail__Prefill pf = KVRAIL__PREFILL__INIT;
    pf.request_id = q->did;
    pf.attempt = q->attempt;
    pf.n_token_ids = q->n_ctx;
    pf.token_ids = q->ctx;
    pf.sampling = (Kvrail__SamplingParams *)&q->sp;
    pf.seed = q->sp.seed;
    pf.decode_node = (char *)d->name;
    pf.lease_ms = r->cl->timeouts.lease_ms;
    pf.generated = q->index_base; /* streamed before a migration: output, not prompt */
    return rt_send_node(r, p, KVRAIL__METHOD__PREFILL, &pf.base);
}

static enum rt_dispatch_result send_pick(rt_t *r, struct rt_req *q, const struct rt_sched_pick *pk,
                                         uint64_t now)
{
    struct rt_node *d = &r->nodes[pk->d];
    if (pk->local) {
        r->st.local_prefills++;
        KVR_LOG_INFO("router",
                     "request %" PRIu64 ": prefill on decode node %s (%s: %u uncached of %zu "
                     "tokens, threshold %u)",
                     q->id, d->name, pk->no_prefill_node ? "no live prefill node" : "short suffix",
                     pk->uncached_tokens, q->n_ctx, r->cl->local_prefill_tokens);
    } else {
        r->st.disagg_prefills++;
        KVR_LOG_DEBUG("router", "request %" PRIu64 ": prefill %s -> decode %s (%u cached)", q->id,
                      r->nodes[pk->p].name, d->name, pk->cached_tokens);
    }
    q->did = ++r->next_id;
    q->attempt = 0;
    q->kv_counted = false;
    q->d_held = false;
    if (!rt_u64map_put(&r->reqs, q->did, (uint64_t)(uintptr_t)q)) {
        q->did = 0;
        return RT_DISPATCH_SEND_FAILED;
    }
    Kvrail__Reserve rs = KVRAIL__RESERVE__INIT;
    rs.request_id = q->did;
    rs.n_token_ids = q->n_ctx;
    rs.token_ids = q->ctx;
    rs.lease_ms = r->cl->timeouts.lease_ms;
    rs.max_tokens = q->max_tokens - q->index_base;
    rs.generated = q->index_base;
    rs.sampling = &q->sp;
    rs.n_stop_token_ids = q->n_stop_ids;
    rs.stop_token_ids = q->stop_ids;
    rs.ignore_eos = q->ignore_eos;
    rs.local_prefill = pk->local;
    rs.prefill_node = (char *)(pk->local ? "" : r->nodes[pk->p].name);
    rs.prefill_incarnation = pk->local ? 0 : r->nodes[pk->p].incarnation;
    const uint8_t *tok = pk->local ? NULL : pair_token(&r->nodes[pk->p], d);
    if (tok) {
        rs.transport_token.data = (uint8_t *)tok;
        rs.transport_token.len = RT_TOKEN_LEN;
    }
    if (rt_send_node(r, d, KVRAIL__METHOD__RESERVE, &rs.base) != KVR_OK) {
        rt_u64map_del(&r->reqs, q->did);
        q->did = 0;
        return RT_DISPATCH_SEND_FAILED;
    }
    if (!pk->local) {
        struct rt_node *p = &r->nodes[pk->p];
        if (send_prefill(r, q, p, d) != KVR_OK) {
            rt_send_node_cancel(r, pk->d, q->did, KVR_ERR_PEER_FAILURE, "prefill node unreachable");
            rt_u64map_del(&r->reqs, q->did);
            q->did = 0;
            return RT_DISPATCH_SEND_FAILED;
        }
        p->inflight_tokens += q->n_ctx;
        p->active++;
        p->requests++;
    }
    q->d = pk->d;
    q->d_inc = d->incarnation;
    q->p = pk->p;
    q->local = pk->local;
    q->local_any |= pk->local;
    q->need_blocks = pk->need_blocks;
    d->free_est -= q->need_blocks;
    d->active++;
    d->requests++;
    rt_req_set_state(r, q, RQ_RESERVING);
    q->t_dispatch = now;
    q->prefill_deadline = now + (uint64_t)r->cl->timeouts.prefill_ms * MS;
    rt_timer_arm(r, q->prefill_deadline + 1);
    q->next_local = 0;
    return RT_DISPATCH_OK;
}

enum rt_dispatch_result rt_dispatch(rt_t *r, struct rt_req *q, uint64_t now)
{
    uint64_t t0 = kvr_now_ns(), c0 = rt_cpu_ns();
    uint32_t overlap[RT_MAX_NODES];
    rt_dir_overlap(&r->dir, rt_registry_live_decode(r), q->hashes, q->n_hashes, overlap);
    struct rt_sched_node sn[RT_MAX_NODES];
    for (int i = 0; i < r->n_nodes; i++) {
        const struct rt_node *n = &r->nodes[i];
        sn[i] = (struct rt_sched_node){
            .role = n->role,
            .alive = n->alive,
            .total_blocks = n->total_blocks,
            .free_est = n->free_est,
            .batch_size = n->batch_size,
            .cached_blocks = overlap[i],
            .inflight_tokens = n->inflight_tokens,
            .cooling = n->cool_until > now,
        };
    }
    struct rt_sched_req sq = {
        .n_tokens = q->n_ctx,
        .block_size = r->cl->block_size,
        .local_prefill_tokens = r->cl->local_prefill_tokens,
        .avoid_p = q->bad_p,
        .avoid_d = q->bad_d_mask,
        .seed = rt_rand(r),
    };
    struct rt_sched_pick pk;
    enum rt_dispatch_result res;
    switch (rt_sched_pick(sn, r->n_nodes, &sq, &pk)) {
    case RT_SCHED_OK:
        res = send_pick(r, q, &pk, now);
        break;
    case RT_SCHED_NO_DECODE:
        res = RT_DISPATCH_NO_DECODE;
        break;
    case RT_SCHED_POOL_FULL:
        res = RT_DISPATCH_POOL_FULL;
        break;
    default:
        res = RT_DISPATCH_TOO_BIG;
        break;
    }
    q->overhead_ns += kvr_now_ns() - t0;
    q->overhead_cpu_ns += rt_cpu_ns() - c0;
    return res;
}

void rt_dispatch_pump(rt_t *r, uint64_t now)
{
    for (struct rt_req *q = r->qhead, *next; q; q = next) {
        next = q->qnext;
        rt_queue_remove(r, q);
        enum rt_dispatch_result res = rt_dispatch(r, q, now);
        if (res == RT_DISPATCH_OK)
            continue;
        /* put it back where it was */
        if (next) {
            q->queued = true;
            q->state = RQ_QUEUED;
            r->n_queued++;
            q->qnext = next;
            q->qprev = next->qprev;
            if (next->qprev)
                next->qprev->qnext = q;
            else
                r->qhead = q;
            next->qprev = q;
        } else {
            rt_queue_push(r, q, false);
        }
        if (res == RT_DISPATCH_NO_DECODE)
            break; /* nobody can take anything */
    }
}

void rt_on_reserved(rt_t *r, struct rt_node *n, const Kvrail__Reserved *m, uint64_t now)
{
    uint64_t t0 = kvr_now_ns(), c0 = rt_cpu_ns();
    struct rt_req *q = rt_req_find(r, m->request_id);
    if (!q || q->d != n->idx || q->state != RQ_RESERVING) {
        KVR_LOG_DEBUG("router", "node %s: stale Reserved for request %" PRIu64, n->name,
                      m->request_id);
        if (!q || q->d != n->idx)
            rt_send_node_cancel(r, n->idx, m->request_id, KVR_ERR_CANCELED,
                                "request no longer here");
        return;
    }
    /* the block ids go to P, which writes into them: each must be inside
     * D's pool, and no more of them than the context can use */
    size_t most = q->n_ctx / r->cl->block_size + 1 + (q->max_tokens / r->cl->block_size + 1);
    const char *bad = NULL;
    if (m->n_block_ids > most)
        bad = "more block ids than the request can use";
    else if (m->cached_tokens > q->n_ctx)
        bad = "more cached tokens than the prompt has";
    for (size_t i = 0; !bad && i < m->n_block_ids; i++)
        if (n->total_blocks && m->block_ids[i] >= n->total_blocks)
            bad = "a block id outside its pool";
    if (bad) {
        r->st.bad_frames++;
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router",
                         "node %s: Reserved for request %" PRIu64 " has %s (%zu ids, pool of %u "
                         "blocks, %u cached tokens): the request goes elsewhere",
                         n->name, q->id, bad, m->n_block_ids, n->total_blocks, m->cached_tokens);
        rt_send_node_cancel(r, n->idx, q->did, KVR_ERR_INVALID, "invalid Reserved");
        if (!q->local)
            rt_send_node_cancel(r, q->p, q->did, KVR_ERR_CANCELED, "invalid reservation");
        n->free_est = 0; /* until its next heartbeat */
        rt_req_requeue(r, q, now);
        return;
    }
    if (!q->attempt) /* a retry's Reserved repeats the first one's */
        r->st.cached_tokens += m->cached_tokens;
    q->cached_tokens = m->cached_tokens;
    q->d_held = true;
    free(q->block_ids);
    q->block_ids = NULL;
    q->n_block_ids = 0;
    if (m->n_block_ids) {
        q->block_ids = malloc(m->n_block_ids * sizeof(uint32_t));
        if (q->block_ids) {
            memcpy(q->block_ids, m->block_ids, m->n_block_ids * sizeof(uint32_t));
            q->n_block_ids = m->n_block_ids;
        }
    }
    rt_req_set_state(r, q, RQ_PREFILLING);
    if (!q->local && q->p >= 0) {
        /* D's address and rkeys go to P once per D incarnation (P caches
         * them); afterwards a target is ids, block ids and cached count */
        struct rt_node *pn = &r->nodes[q->p];
        bool known = pn->sent_d_inc[n->idx] == n->incarnation;
        Kvrail__PrefillTarget t = KVRAIL__PREFILL_TARGET__INIT;
        t.request_id = q->did;
        t.attempt = q->attempt;
        t.decode_node = n->name;
        t.decode_incarnation = n->incarnation;
        t.n_block_ids = m->n_block_ids;
        t.block_ids = m->block_ids;
        t.cached_tokens = m->cached_tokens;
        ProtobufCBinaryData rk[RT_MAX_RKEYS];
        if (!known) {
            size_t nrk = n->n_rkeys < RT_MAX_RKEYS ? n->n_rkeys : RT_MAX_RKEYS;
            for (size_t i = 0; i < nrk; i++) {
                rk[i].data = n->rkeys[i];
                rk[i].len = n->rkey_lens[i];
            }
            t.decode_address.data = n->addr;
            t.decode_address.len = n->addr_len;
            t.n_layer_rkeys = nrk;
            t.layer_rkeys = rk;
            t.n_layer_base = n->n_layer_base;
            t.layer_base = n->layer_base;
            t.transport = n->transport;
            t.layer_stride = n->layer_stride;
            t.block_bytes = n->block_bytes;
            /* the token D was given in this pair's Reserve */
            if (pn->token_d_inc[n->idx] == n->incarnation && n->incarnation) {
                t.transport_token.data = pn->pair_token[n->idx];
                t.transport_token.len = RT_TOKEN_LEN;
            }
        }
        if (rt_send_node(r, pn, KVRAIL__METHOD__PREFILL_TARGET, &t.base) == KVR_OK)
            pn->sent_d_inc[n->idx] = n->incarnation;
        else {
            q->overhead_ns += kvr_now_ns() - t0;
            q->overhead_cpu_ns += rt_cpu_ns() - c0;
            rt_send_node_cancel(r, q->d, q->did, KVR_ERR_PEER_FAILURE, "prefill node unreachable");
            q->bad_p = q->p;
            rt_req_requeue(r, q, now);
            return;
        }
    }
    q->overhead_ns += kvr_now_ns() - t0;
    q->overhead_cpu_ns += rt_cpu_ns() - c0;
}

void rt_on_rejected(rt_t *r, struct rt_node *n, const Kvrail__Rejected *m, uint64_t now)
{
    struct rt_req *q = rt_req_find(r, m->request_id);
    if (!q || q->d != n->idx)
        return;
    kvr_status_t code = m->reason ? m->reason->code : KVR_ERR_INTERNAL;
    const char *why = m->reason && m->reason->message ? m->reason->message : "no reason given";
    if (!q->local)
        rt_send_node_cancel(r, q->p, q->did, KVR_ERR_CANCELED,
                            "decode node rejected the reservation");
    if (code == KVR_ERR_NOT_FOUND && q->attempt > 0) {
        /* a retry found the reservation gone (its lease ran out first) */
        KVR_LOG_WARN("router",
                     "request %" PRIu64 ": %s no longer holds its reservation (%s); "
                     "dispatched again",
                     q->id, n->name, why);
        rt_req_requeue(r, q, now);
        return;
    }
    if (code == KVR_ERR_NO_RESOURCE) {
        KVR_LOG_DEBUG("router", "request %" PRIu64 ": %s has no room (%s); queued", q->id, n->name,
                      why);
        n->free_est = 0; /* until its next heartbeat */
        rt_req_requeue(r, q, now);
        return;
    }
    rt_req_finish(r, q, code ? code : KVR_ERR_INTERNAL, KVRAIL__FINISH_REASON__FINISH_ERROR, false,
                  now, "decode node %s rejected the request: %s", n->name, why);
}

bool rt_dispatch_retry_prefill(rt_t *r, struct rt_req *q, uint64_t now)
{
    if (q->local || !q->d_held || q->d < 0 || q->p < 0 || q->state != RQ_PREFILLING)
        return false;
    struct rt_node *d = &r->nodes[q->d];
    if (!d->alive || d->incarnation != q->d_inc)
        return false;
    /* the least loaded live prefill node, the one that failed last only
     * when it is the only one left (a timeout, not a death) */
    int best = -1;
    for (int i = 0; i < r->n_nodes; i++) {
        const struct rt_node *n = &r->nodes[i];
        if (n->role != KVR_NODE_ROLE_PREFILL || !n->alive)
            continue;
        if (best < 0 || (best == q->p && i != q->p) ||
            (i != q->p && n->inflight_tokens < r->nodes[best].inflight_tokens))
            best = i;
    }
    if (best < 0)
        return false;
    struct rt_node *old = &r->nodes[q->p], *p = &r->nodes[best];
    rt_send_node_cancel(r, q->p, q->did, KVR_ERR_CANCELED, "prefill retried elsewhere");
    if (!q->prefill_done)
        old->inflight_tokens =
            old->inflight_tokens > q->n_ctx ? old->inflight_tokens - q->n_ctx : 0;
    if (old->active)
        old->active--;
    q->bad_p = q->p;
    q->p = best;
    q->attempt++;
    q->prefill_done = false;
    q->kv_counted = false;
    Kvrail__Reserve rs = KVRAIL__RESERVE__INIT;
    rs.request_id = q->did;
    rs.attempt = q->attempt;
    rs.lease_ms = r->cl->timeouts.lease_ms;
    rs.prefill_node = p->name;
    rs.prefill_incarnation = p->incarnation;
    const uint8_t *tok = pair_token(p, d);
    if (tok) {
        rs.transport_token.data = (uint8_t *)tok;
        rs.transport_token.len = RT_TOKEN_LEN;
    }
    if (rt_send_node(r, d, KVRAIL__METHOD__RESERVE, &rs.base) != KVR_OK ||
        send_prefill(r, q, p, d) != KVR_OK) {
        q->p = -1; /* its load is undone above */
        return false;
    }
    p->inflight_tokens += q->n_ctx;
    p->active++;
    p->requests++;
    rt_req_set_state(r, q, RQ_RESERVING);
    q->prefill_deadline = now + (uint64_t)r->cl->timeouts.prefill_ms * MS;
    rt_timer_arm(r, q->prefill_deadline + 1);
    KVR_LOG_WARN("router",
                 "request %" PRIu64 ": prefill attempt %u on %s, on the same reservation of %s "
                 "(lease renewed)",
                 q->id, q->attempt, p->name, d->name);
    return true;
}
