/*
 * failover.c - what the router does when something does not come back.  A
 * failed or timed-out prefill is retried on another prefill node (P that
 * failed it is avoided next; limits.prefill_retries), on the same
 * reservation of D when D holds one (its lease renewed, dispatch.c), else
 * as a new dispatch.  A prefill that failed by the decode node's fault (P
 * says so: PrefillDone.decode_fault - D's address or rkeys refused, its
 * reservation unusable, a transfer to it failed) is D's blame, not P's:
 * D's reservation is released and the request dispatched afresh to another
 * decode node (D avoided for it; RT_BLAME_STREAK such faults in a row cool
 * D down for a lease, in which it is everyone's last choice).  A decode node that
 * dies or re-registers has its requests migrated: a new dispatch of prompt +
 * the tokens already streamed, continuing the stream where it stopped.  The
 * deadlines (request, queue, first token) are scanned here when the loop's
 * timer fires, and the next one is armed.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_blockhash.h"
#include "kvr_log.h"
#include "router.h"
#include "rt_metrics.h"

void rt_failover_prefill_failed(rt_t *r, struct rt_req *q, uint64_t now, kvr_status_t code,
                                const char *why)
{
    const char *pname = q->p >= 0 ? r->nodes[q->p].name : "(decode node)";
    if (!q->first_why[0])
        snprintf(q->first_why, sizeof q->first_why, "on %s: %s", pname, why);
    if (q->retries < r->cl->prefill_retries && q->n_out == q->index_base) {
        q->retries++;
        r->st.retries++;
        KVR_LOG_WARN("router", "request %" PRIu64 ": prefill on %s failed (%s); retry %u of %u",
                     q->id, pname, why, q->retries, r->cl->prefill_retries);
        if (rt_dispatch_retry_prefill(r, q, now))
            return;
        if (!q->local)
            rt_send_node_cancel(r, q->p, q->did, KVR_ERR_CANCELED, "retrying elsewhere");
        rt_send_node_cancel(r, q->d, q->did, KVR_ERR_CANCELED, "prefill retried");
        q->bad_p = q->p;
        rt_req_requeue(r, q, now);
        r->pump_wanted = true;
        return;
    }
    /* the last failure may be a symptom of the first (a retry against the
     * same bad peer): the client is told both */
    char last[256];
    snprintf(last, sizeof last, "on %s: %s", pname, why);
    if (q->retries && strcmp(last, q->first_why) != 0)
        rt_req_finish(r, q, code, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                      "prefill failed after %u retries; first %s; last %s", q->retries,
                      q->first_why, last);
    else
        rt_req_finish(r, q, code, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                      "prefill on %s failed after %u retries: %s", pname, q->retries, why);
}

void rt_failover_decode_failed(rt_t *r, struct rt_req *q, uint64_t now, kvr_status_t code,
                               const char *why)
{
    struct rt_node *d = &r->nodes[q->d];
    d->blamed++;
    r->st.decode_faults++;
    if (++d->blame_streak >= RT_BLAME_STREAK) {
        d->blame_streak = 0;
        d->cooldowns++;
        d->cool_until = now + (uint64_t)r->cl->timeouts.lease_ms * 1000000ull;
        KVR_LOG_WARN("router",
                     "decode node %s failed %u transfers in a row: other decode nodes are "
                     "preferred for %u ms (timeouts.lease_ms; cool-down %" PRIu64 ")",
                     d->name, RT_BLAME_STREAK, r->cl->timeouts.lease_ms, d->cooldowns);
    }
    if (!q->first_why[0])
        snprintf(q->first_why, sizeof q->first_why, "on decode node %s: %s", d->name, why);
    bool other = false;
    for (int i = 0; i < r->n_nodes && !other; i++)
        other = i != q->d && r->nodes[i].role == KVR_NODE_ROLE_DECODE && r->nodes[i].alive;
    if (other && q->retries < r->cl->prefill_retries && q->n_out == q->index_base) {
        q->retries++;
        r->st.retries++;
        KVR_LOG_WARN("router",
                     "request %" PRIu64 ": prefill failed by decode node %s (%s): its reservation "
                     "is released and the request dispatched to another decode node (retry %u "
                     "of %u)",
                     q->id, d->name, why, q->retries, r->cl->prefill_retries);
        if (!q->local)
            rt_send_node_cancel(r, q->p, q->did, KVR_ERR_CANCELED, "decode node failed");
        rt_send_node_cancel(r, q->d, q->did, KVR_ERR_PEER_FAILURE,
                            "the prefill node could not use this reservation");
        q->bad_d_mask |= 1ull << q->d;
        rt_req_requeue(r, q, now);
        r->pump_wanted = true;
        return;
    }
    char last[256];
    snprintf(last, sizeof last, "on decode node %s: %s", d->name, why);
    const char *none = other ? "retries spent" : "no other live decode node";
    if (q->retries && strcmp(last, q->first_why) != 0)
        rt_req_finish(r, q, code, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                      "prefill failed after %u retries (%s); first %s; last %s", q->retries, none,
                      q->first_why, last);
    else
        rt_req_finish(r, q, code, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                      "prefill failed by decode node %s after %u retries (%s): %s", d->name,
                      q->retries, none, why);
}

/* The new dispatch continues from prompt + streamed tokens.  False when out
 * of memory (the request is finished then). */
static bool migrate(rt_t *r, struct rt_req *q, struct rt_node *n, uint64_t now, const char *why)
{
    size_t n_ctx = q->n_prompt + q->n_out;
    uint32_t bs = r->cl->block_size;
    uint32_t *ctx = realloc(q->ctx, n_ctx * sizeof(uint32_t));
    if (ctx)
        q->ctx = ctx;
    uint64_t *hs = ctx ? realloc(q->hashes, (n_ctx / bs + 1) * sizeof(uint64_t)) : NULL;
    if (!hs) {
        rt_req_finish(r, q, KVR_ERR_NO_MEMORY, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                      "out of memory migrating the request");
        return false;
    }
    q->hashes = hs;
    memcpy(ctx, q->prompt, q->n_prompt * sizeof(uint32_t));
    memcpy(ctx + q->n_prompt, q->out, q->n_out * sizeof(uint32_t));
    q->n_ctx = n_ctx;
    kvr_blockhash_seq(ctx, n_ctx, bs, hs, n_ctx / bs + 1, &q->n_hashes);
    q->index_base = q->n_out;
    /* the new dispatch says how many of its tokens were generated
     * (Reserve/Prefill.generated = index_base): the nodes' samplers count
     * them as output and continue the seed's stream after them, so sampled
     * output (penalties included) goes on as one process would */
    KVR_LOG_WARN("router",
                 "request %" PRIu64 ": decode node %s %s; migrating with %u tokens streamed", q->id,
                 n->name, why, q->n_out);
    rt_metrics_migration();
    rt_req_requeue(r, q, now);
    return true;
}

void rt_failover_node_lost(rt_t *r, struct rt_node *n, uint64_t now, const char *why)
{
    for (struct rt_req *q = r->all, *next; q; q = next) {
        next = q->anext;
        if (q->state == RQ_QUEUED)
            continue;
        if (q->p == n->idx && !q->prefill_done && !q->local) {
            char m[160];
            snprintf(m, sizeof(m), "prefill node %s %s", n->name, why);
            n->blamed++;
            rt_failover_prefill_failed(r, q, now, KVR_ERR_PEER_FAILURE, m);
            continue;
        }
        if (q->d != n->idx)
            continue;
        if (q->retries >= r->cl->prefill_retries + 1u) {
            rt_req_finish(r, q, KVR_ERR_PEER_FAILURE, KVRAIL__FINISH_REASON__FINISH_ERROR, true,
                          now, "decode node %s %s after %u tokens; no retries left", n->name, why,
                          q->n_out);
            continue;
        }
        q->retries++;
        r->st.retries++;
        if (q->p >= 0 && !q->local && !q->prefill_done)
            rt_send_node_cancel(r, q->p, q->did, KVR_ERR_PEER_FAILURE, "decode node lost");
        migrate(r, q, n, now, why);
    }
    r->pump_wanted = true;
}

void rt_failover_tick(rt_t *r, uint64_t now)
{
    for (struct rt_req *q = r->all, *next; q; q = next) {
        next = q->anext;
        if (now > q->deadline) {
            rt_req_finish(r, q, KVR_ERR_TIMEOUT, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                          "request deadline (timeouts.request_ms = %u) passed after %u tokens",
                          r->cl->timeouts.request_ms, q->n_out);
            continue;
        }
        if (q->state == RQ_QUEUED && now > q->queue_deadline) {
            if (rt_registry_live_decode(r))
                rt_req_finish(r, q, KVR_ERR_OVERLOAD, KVRAIL__FINISH_REASON__FINISH_ERROR, false,
                              now,
                              "overloaded: no decode node had room for %zu tokens within %u ms "
                              "(timeouts.queue_ms)",
                              q->n_ctx, r->cl->timeouts.queue_ms);
            else
                rt_req_finish(r, q, KVR_ERR_NO_RESOURCE, KVRAIL__FINISH_REASON__FINISH_ERROR, false,
                              now, "no live decode node within %u ms (timeouts.queue_ms)",
                              r->cl->timeouts.queue_ms);
            continue;
        }
        bool awaiting_first = (q->state == RQ_RESERVING || q->state == RQ_PREFILLING) &&
                              !q->t_first && q->n_out == q->index_base;
        if (awaiting_first && now > q->prefill_deadline) {
            if (q->d >= 0 && (q->state == RQ_RESERVING || q->local)) {
                /* D's: a Reserve unanswered (it heartbeats, or its heartbeat
                 * timeout is longer than prefill_ms), or its own prefill not
                 * done: another decode node takes the request */
                rt_failover_decode_failed(r, q, now, KVR_ERR_TIMEOUT,
                                          q->state == RQ_RESERVING
                                              ? "Reserve unanswered within timeouts.prefill_ms"
                                              : "its local prefill gave no first token within "
                                                "timeouts.prefill_ms");
                continue;
            }
            if (q->state == RQ_PREFILLING && !q->prefill_done && !q->local && q->p >= 0)
                r->nodes[q->p].blamed++; /* D reserved; P did not finish */
            rt_failover_prefill_failed(r, q, now, KVR_ERR_TIMEOUT,
                                       "no first token within timeouts.prefill_ms");
            continue;
        }
        /* still open: its next deadline */
        rt_timer_arm(r, q->deadline + 1);
        if (q->state == RQ_QUEUED)
            rt_timer_arm(r, q->queue_deadline + 1);
        if (awaiting_first)
            rt_timer_arm(r, q->prefill_deadline + 1);
    }
}
