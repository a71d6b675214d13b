/*
 * requests.c - the router's request table: every open request is on the
 * list r->all, the queued ones also on the queue (a doubly linked list, a
 * requeued one at its front), and the current dispatch id of each maps to it
 * in r->reqs.  finish() is the one way a request ends: the final frame to
 * the client (StreamEnd or an error), NodeCancel to the nodes still holding
 * it, the counters, the load estimates given back, and a queue pump asked
 * of the loop (its blocks may let a queued request in).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"
#include "rt_metrics.h"

bool rt_requests_init(rt_t *r)
{
    return rt_u64map_init(&r->reqs, 1024);
}

struct rt_req *rt_req_find(rt_t *r, uint64_t did)
{
    uint64_t v;
    if (!rt_u64map_get(&r->reqs, did, &v))
        return NULL;
    return (struct rt_req *)(uintptr_t)v;
}

void rt_req_add(rt_t *r, struct rt_req *q)
{
    q->anext = r->all;
    q->aprev = NULL;
    if (r->all)
        r->all->aprev = q;
    r->all = q;
    rt_timer_arm(r, q->deadline + 1);
}

void rt_queue_remove(rt_t *r, struct rt_req *q)
{
    if (!q->queued)
        return;
    if (q->qprev)
        q->qprev->qnext = q->qnext;
    else
        r->qhead = q->qnext;
    if (q->qnext)
        q->qnext->qprev = q->qprev;
    else
        r->qtail = q->qprev;
    q->qnext = q->qprev = NULL;
    q->queued = false;
    r->n_queued--;
}

void rt_queue_push(rt_t *r, struct rt_req *q, bool front)
{
    if (q->queued)
        return;
    q->queued = true;
    q->state = RQ_QUEUED;
    r->n_queued++;
    if (front) {
        q->qprev = NULL;
        q->qnext = r->qhead;
        if (r->qhead)
            r->qhead->qprev = q;
        else
            r->qtail = q;
        r->qhead = q;
    } else {
        q->qnext = NULL;
        q->qprev = r->qtail;
        if (r->qtail)
            r->qtail->qnext = q;
        else
            r->qhead = q;
        r->qtail = q;
    }
    rt_timer_arm(r, q->queue_deadline + 1);
    rt_timer_arm(r, q->deadline + 1);
}

void rt_req_free(rt_t *r, struct rt_req *q)
{
    rt_queue_remove(r, q);
    if (q->did)
        rt_u64map_del(&r->reqs, q->did);
    if (q->aprev)
        q->aprev->anext = q->anext;
    else if (r->all == q)
        r->all = q->anext;
    if (q->anext)
        q->anext->aprev = q->aprev;
    free(q->prompt);
    free(q->ctx);
    free(q->hashes);
    free(q->block_ids);
    free(q->out);
    free(q->tail);
    for (size_t i = 0; i < q->n_stops; i++)
        free(q->stops[i]);
    free(q->sp.logit_bias); /* client_ep.c's copy_logit_bias */
    if (q->detok)
        kvr_detok_destroy(q->detok);
    free(q);
}

/* D's blocks count for this request only while D is the incarnation that
 * reserved them: a restarted node's pool starts empty. */
static struct rt_node *same_d(rt_t *r, const struct rt_req *q)
{
    if (q->d < 0)
        return NULL;
    struct rt_node *d = &r->nodes[q->d];
    return d->incarnation == q->d_inc ? d : NULL;
}

void rt_req_set_state(rt_t *r, struct rt_req *q, enum rt_req_state st)
{
    struct rt_node *d = same_d(r, q);
    if (d && q->state == RQ_RESERVING && st != RQ_RESERVING)
        d->reserving_blocks -=
            d->reserving_blocks < q->need_blocks ? d->reserving_blocks : q->need_blocks;
    if (d && st == RQ_RESERVING && q->state != RQ_RESERVING)
        d->reserving_blocks += q->need_blocks;
    q->state = st;
}

void rt_req_release(rt_t *r, struct rt_req *q)
{
    rt_req_set_state(r, q, RQ_QUEUED);
    if (q->p >= 0) {
        struct rt_node *p = &r->nodes[q->p];
        if (!q->prefill_done) {
            uint64_t t = q->n_ctx;
            p->inflight_tokens = p->inflight_tokens > t ? p->inflight_tokens - t : 0;
        }
        if (p->active)
            p->active--;
    }
    if (q->d >= 0) {
        struct rt_node *d = same_d(r, q);
        if (d)
            d->free_est += q->need_blocks;
        if (r->nodes[q->d].active)
            r->nodes[q->d].active--;
    }
    q->p = q->d = -1;
    if (q->did)
        rt_u64map_del(&r->reqs, q->did);
    q->did = 0;
    q->need_blocks = 0;
    free(q->block_ids);
    q->block_ids = NULL;
    q->n_block_ids = 0;
    q->prefill_done = false;
    q->kv_counted = false;
}

void rt_req_requeue(rt_t *r, struct rt_req *q, uint64_t now)
{
    rt_req_release(r, q);
    q->queue_deadline = now + (uint64_t)r->cl->timeouts.queue_ms * 1000000ull;
    rt_queue_push(r, q, true);
}

static void fill_usage(rt_t *r, struct rt_req *q, Kvrail__GenerateUsage *u, uint64_t now,
                       Kvrail__FinishReason fin)
{
    u->request_id = q->id;
    u->prompt_tokens = (uint32_t)q->n_prompt;
    u->completion_tokens = q->n_out;
    u->cached_tokens = q->cached_tokens;
    u->local_prefill = q->local_any;
    u->prefill_node = (char *)(q->p >= 0 && !q->local ? r->nodes[q->p].name : "");
    u->decode_node = (char *)(q->d >= 0 ? r->nodes[q->d].name : "");
    u->kv_bytes_moved = q->kv_bytes;
    u->ttft_us = q->t_first ? (q->t_first - q->t_recv) / 1000u : 0;
    u->total_us = (now - q->t_recv) / 1000u;
    u->router_overhead_ns = q->overhead_ns;
    u->router_overhead_cpu_ns = q->overhead_cpu_ns;
    u->finish = fin;
}

void rt_req_finish(rt_t *r, struct rt_req *q, kvr_status_t code, Kvrail__FinishReason fin,
                   bool cancel_nodes, uint64_t now, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (cancel_nodes) {
        if (!q->local && !q->prefill_done)
            rt_send_node_cancel(r, q->p, q->did, code ? code : KVR_ERR_CANCELED, msg);
        rt_send_node_cancel(r, q->d, q->did, code ? code : KVR_ERR_CANCELED, msg);
    }
    if (q->route_len) {
        if (code == KVR_OK || code == KVR_ERR_CANCELED) {
            Kvrail__StreamEnd e = KVRAIL__STREAM_END__INIT;
            Kvrail__Status s = KVRAIL__STATUS__INIT;
            Kvrail__GenerateUsage u = KVRAIL__GENERATE_USAGE__INIT;
            s.code = code;
            s.message = msg;
            fill_usage(r, q, &u, now, fin);
            e.status = &s;
            e.usage = &u;
            rt_send_client(r, q, KVR_PROTO_F_END, &e.base);
        } else {
            kvr_proto_send_error(r->client_sock, q->route, q->route_len, KVRAIL__METHOD__GENERATE,
                                 q->call_id, code, "%s", msg);
        }
    }
    rt_samples_add(&r->st.overhead, q->overhead_ns);
    rt_samples_add(&r->st.overhead_cpu, q->overhead_cpu_ns);
    rt_metrics_request_done(r, q, code, fin, now);
    if (code == KVR_OK)
        r->st.completed++;
    else if (code == KVR_ERR_CANCELED)
        r->st.canceled++;
    else if (code == KVR_ERR_OVERLOAD)
        r->st.overloaded++;
    else
        r->st.failed++;
    if (code != KVR_OK)
        KVR_LOG_INFO("router", "request %" PRIu64 " ends: %s: %s", q->id, kvr_status_name(code),
                     msg);
    struct rt_node *d = same_d(r, q);
    if (d && code == KVR_OK) {
        /* the blocks come back to D's pool (or its prefix cache) */
        uint32_t bs = r->cl->block_size;
        d->free_est += (int64_t)((q->n_ctx + q->n_out - q->index_base + bs - 1) / bs);
    }
    rt_req_release(r, q);
    rt_req_free(r, q);
    r->pump_wanted = true;
}

void rt_requests_fini(rt_t *r)
{
    uint64_t now = kvr_now_ns();
    while (r->all)
        rt_req_finish(r, r->all, KVR_ERR_CLOSED, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                      "router shutting down");
    rt_u64map_free(&r->reqs);
}
