/*
 * requests.c - the router's client service and request table.
 *
 * GENERATE: the request is decoded and validated (prompt vs the model's
 * context, max_tokens, sampling values, stop strings), tokenized, its full
 * blocks hashed (chained sequence hashes), then dispatched or queued.
 * Dispatch picks the decode node D with the lowest cost among those with
 * enough free blocks (hard limit):
 *     cost(D) = uncached prompt blocks on D + 0.5 * blocks in use on D
 *               + batch size of D + random jitter in [0, 0.01)
 * (the uncached blocks come from the block directory), and the prefill node
 * P with the fewest in-flight prefill tokens (random tie-break).  When the
 * uncached suffix is at most thresholds.local_prefill_tokens, or no prefill
 * node is alive, D prefills locally; the decision is counted and logged.
 * Reserve goes to D and Prefill to P at the same time; Reserved is forwarded
 * to P as PrefillTarget.  The first token comes from PrefillDone or from D's
 * token 0, whichever arrives first; D's later tokens are streamed on,
 * detokenized.  The router itself enforces max_tokens, stop tokens and stop
 * strings and cancels the nodes when it ends a stream early.
 *
 * Failures: a failed or timed-out prefill is retried on another prefill
 * node (limits.prefill_retries), a decode node that dies mid-stream has its
 * requests re-dispatched with prompt + streamed tokens (migration), a pool
 * that stays full past timeouts.queue_ms gives KVR_ERR_OVERLOAD.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_blockhash.h"
#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"

#if KVR_ROUTER_HAVE_SAMPLE
#include "kvr_sample.h"
#endif

#define MS (1000000ull)

/* ---- small helpers ---- */

static struct rt_req *req_find(rt_t *r, uint64_t id)
{
    uint64_t v;
    if (!rt_u64map_get(&r->reqs, id, &v))
        return NULL;
    return (struct rt_req *)(uintptr_t)v;
}

static void q_remove(rt_t *r, struct rt_req *q)
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

static void q_push(rt_t *r, struct rt_req *q, bool front)
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
}

static void req_free(rt_t *r, struct rt_req *q)
{
    q_remove(r, q);
    if (q->did)
        rt_u64map_del(&r->reqs, q->did);
    if (q->aprev)
        q->aprev->anext = q->anext;
    else
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
#if KVR_ROUTER_HAVE_TOKENIZER
    if (q->detok)
        kvr_detok_destroy(q->detok);
#endif
    free(q);
}

static kvr_status_t send_client(rt_t *r, struct rt_req *q, unsigned flags,
                                const ProtobufCMessage *m)
{
    if (!q->route_len)
        return KVR_ERR_NOT_FOUND;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, (uint8_t)flags, KVRAIL__METHOD__GENERATE, q->call_id};
    kvr_status_t st = kvr_proto_send(r->client_sock, q->route, q->route_len, &h, m);
    if (st == KVR_ERR_NOT_FOUND) {
        /* the client's connection is gone (ZMQ_ROUTER_MANDATORY: unroutable) */
        q->route_len = 0;
    } else if (st != KVR_OK) {
        KVR_LOG_WARN("router", "request %" PRIu64 ": cannot send to client: %s", q->id,
                     kvr_status_str(st));
    }
    return st;
}

static void node_cancel(rt_t *r, int idx, uint64_t id, kvr_status_t code, const char *why)
{
    if (idx < 0)
        return;
    Kvrail__NodeCancel c = KVRAIL__NODE_CANCEL__INIT;
    Kvrail__Status s = KVRAIL__STATUS__INIT;
    s.code = code;
    s.message = (char *)why;
    c.request_id = id;
    c.reason = &s;
    rt_send_node(r, &r->nodes[idx], KVRAIL__METHOD__NODE_CANCEL, &c.base);
}

/* Undo the load estimates of the current dispatch. */
static void release_dispatch(rt_t *r, struct rt_req *q)
{
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
        struct rt_node *d = &r->nodes[q->d];
        d->free_est += q->need_blocks;
        if (d->active)
            d->active--;
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

/* Ends a request: the client gets StreamEnd (ok, canceled) or an error
 * frame; the nodes still holding it get NodeCancel when cancel_nodes. */
static void finish(rt_t *r, struct rt_req *q, kvr_status_t code, Kvrail__FinishReason fin,
                   bool cancel_nodes, uint64_t now, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static void finish(rt_t *r, struct rt_req *q, kvr_status_t code, Kvrail__FinishReason fin,
                   bool cancel_nodes, uint64_t now, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (cancel_nodes) {
        if (!q->local && !q->prefill_done)
            node_cancel(r, q->p, q->did, code ? code : KVR_ERR_CANCELED, msg);
        node_cancel(r, q->d, q->did, code ? code : KVR_ERR_CANCELED, msg);
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
            send_client(r, q, KVR_PROTO_F_END, &e.base);
        } else {
            kvr_proto_send_error(r->client_sock, q->route, q->route_len, KVRAIL__METHOD__GENERATE,
                                 q->call_id, code, "%s", msg);
        }
    }
    rt_samples_add(&r->st.overhead, q->overhead_ns);
    rt_samples_add(&r->st.overhead_cpu, q->overhead_cpu_ns);
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
    if (q->d >= 0 && code == KVR_OK) {
        /* the blocks come back to D's pool (or its prefix cache) */
        struct rt_node *d = &r->nodes[q->d];
        uint32_t bs = r->cl->block_size;
        d->free_est += (int64_t)((q->n_ctx + q->n_out - q->index_base + bs - 1) / bs);
    }
    release_dispatch(r, q);
    req_free(r, q);
    rt_queue_pump(r, now);
}

/* ---- choosing the pair and dispatching ---- */

static double jitter(rt_t *r)
{
    return (double)(rt_rand(r) >> 11) / 9007199254740992.0 * 0.01;
}

enum pick_result { PICK_OK, PICK_NO_DECODE, PICK_POOL_FULL, PICK_SEND_FAILED, PICK_TOO_BIG };

static enum pick_result dispatch(rt_t *r, struct rt_req *q, uint64_t now)
{
    uint64_t t0 = kvr_now_ns(), c0 = rt_cpu_ns();
    uint32_t bs = r->cl->block_size;
    uint32_t overlap[RT_MAX_NODES];
    rt_dir_overlap(r, q->hashes, q->n_hashes, overlap);
    uint32_t total_blocks = (uint32_t)((q->n_ctx + bs - 1) / bs);
    int best = -1;
    double best_cost = 0;
    bool any_decode = false, any_fits = false;
    for (int i = 0; i < r->n_nodes; i++) {
        struct rt_node *n = &r->nodes[i];
        if (n->role != KVR_NODE_ROLE_DECODE || !n->alive)
            continue;
        any_decode = true;
        uint32_t need = total_blocks - overlap[i];
        any_fits |= total_blocks <= n->total_blocks;
        if (n->free_est < (int64_t)need)
            continue;
        double load = (double)n->total_blocks - (double)n->free_est;
        if (load < 0)
            load = 0;
        double cost = (double)need + 0.5 * load + (double)n->batch_size + jitter(r);
        if (best < 0 || cost < best_cost) {
            best = i;
            best_cost = cost;
        }
    }
    if (best < 0) {
        q->overhead_ns += kvr_now_ns() - t0;
        q->overhead_cpu_ns += rt_cpu_ns() - c0;
        return !any_decode ? PICK_NO_DECODE : any_fits ? PICK_POOL_FULL : PICK_TOO_BIG;
    }
    struct rt_node *d = &r->nodes[best];
    uint32_t cached = overlap[best] * bs;
    uint32_t uncached = (uint32_t)q->n_ctx - cached;
    int pbest = -1;
    double pcost = 0;
    for (int i = 0; i < r->n_nodes; i++) {
        struct rt_node *n = &r->nodes[i];
        if (n->role != KVR_NODE_ROLE_PREFILL || !n->alive)
            continue;
        double c = (double)n->inflight_tokens + (i == q->bad_p ? 1e12 : 0) + jitter(r);
        if (pbest < 0 || c < pcost) {
            pbest = i;
            pcost = c;
        }
    }
    bool local = pbest < 0 || uncached <= r->cl->local_prefill_tokens;
    if (local) {
        r->st.local_prefills++;
        KVR_LOG_INFO("router",
                     "request %" PRIu64 ": prefill on decode node %s (%s: %u uncached of %zu "
                     "tokens, threshold %u)",
                     q->id, d->name, pbest < 0 ? "no live prefill node" : "short suffix", uncached,
                     q->n_ctx, r->cl->local_prefill_tokens);
        pbest = -1;
    } else {
        r->st.disagg_prefills++;
        KVR_LOG_DEBUG("router", "request %" PRIu64 ": prefill %s -> decode %s (%u cached)", q->id,
                      r->nodes[pbest].name, d->name, cached);
    }

    /* every dispatch attempt has its own id on the node protocol, so a late
     * message about an earlier attempt cannot be taken for this one */
    q->did = ++r->next_id;
    if (!rt_u64map_put(&r->reqs, q->did, (uint64_t)(uintptr_t)q)) {
        q->did = 0;
        return PICK_SEND_FAILED;
    }
    Kvrail__Reserve rs = KVRAIL__RESERVE__INIT;
    rs.request_id = q->did;
    rs.n_token_ids = q->n_ctx;
    rs.token_ids = q->ctx;
    rs.n_block_hashes = q->n_hashes;
    rs.block_hashes = q->hashes;
    rs.lease_ms = r->cl->timeouts.lease_ms;
    rs.max_tokens = q->max_tokens - q->index_base;
    rs.sampling = &q->sp;
    rs.n_stop_token_ids = q->n_stop_ids;
    rs.stop_token_ids = q->stop_ids;
    rs.ignore_eos = q->ignore_eos;
    rs.local_prefill = local;
    rs.prefill_node = (char *)(local ? "" : r->nodes[pbest].name);
    kvr_status_t st = rt_send_node(r, d, KVRAIL__METHOD__RESERVE, &rs.base);
    if (st != KVR_OK) {
        rt_u64map_del(&r->reqs, q->did);
        q->did = 0;
        q->overhead_ns += kvr_now_ns() - t0;
        q->overhead_cpu_ns += rt_cpu_ns() - c0;
        return PICK_SEND_FAILED;
    }
    if (!local) {
        Kvrail__Prefill pf = KVRAIL__PREFILL__INIT;
        pf.request_id = q->did;
        pf.n_token_ids = q->n_ctx;
        pf.token_ids = q->ctx;
        pf.sampling = &q->sp;
        pf.seed = q->sp.seed;
        pf.decode_node = d->name;
        pf.lease_ms = r->cl->timeouts.lease_ms;
        pf.n_block_hashes = q->n_hashes;
        pf.block_hashes = q->hashes;
        st = rt_send_node(r, &r->nodes[pbest], KVRAIL__METHOD__PREFILL, &pf.base);
        if (st != KVR_OK) {
            node_cancel(r, best, q->did, KVR_ERR_PEER_FAILURE, "prefill node unreachable");
            rt_u64map_del(&r->reqs, q->did);
            q->did = 0;
            q->overhead_ns += kvr_now_ns() - t0;
            q->overhead_cpu_ns += rt_cpu_ns() - c0;
            return PICK_SEND_FAILED;
        }
        r->nodes[pbest].inflight_tokens += q->n_ctx;
        r->nodes[pbest].active++;
        r->nodes[pbest].requests++;
    }
    q->d = best;
    q->p = pbest;
    q->local = local;
    q->local_any |= local;
    q->need_blocks = total_blocks - overlap[best];
    d->free_est -= q->need_blocks;
    d->active++;
    d->requests++;
    q->state = RQ_RESERVING;
    q->t_dispatch = now;
    q->prefill_deadline = now + (uint64_t)r->cl->timeouts.prefill_ms * MS;
    q->next_local = 0;
    q->overhead_ns += kvr_now_ns() - t0;
    q->overhead_cpu_ns += rt_cpu_ns() - c0;
    return PICK_OK;
}

void rt_queue_pump(rt_t *r, uint64_t now)
{
    for (struct rt_req *q = r->qhead, *next; q; q = next) {
        next = q->qnext;
        q_remove(r, q);
        enum pick_result pr = dispatch(r, q, now);
        if (pr != PICK_OK) {
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
                q_push(r, q, false);
            }
            if (pr == PICK_NO_DECODE)
                break; /* nobody can take anything */
        }
    }
}

/* Back to the queue for another dispatch (retry, reject, migration). */
static void requeue(rt_t *r, struct rt_req *q, uint64_t now)
{
    release_dispatch(r, q);
    q->queue_deadline = now + (uint64_t)r->cl->timeouts.queue_ms * MS;
    q_push(r, q, true);
}

/* ---- the stream ---- */

static bool is_stop_id(const struct rt_req *q, uint32_t t)
{
    for (size_t i = 0; i < q->n_stop_ids; i++)
        if (q->stop_ids[i] == t)
            return true;
    return false;
}

/* Streams one token; ends the request when it is the last.  Returns true if
 * the request was finished (and freed). */
static bool emit(rt_t *r, struct rt_req *q, uint32_t token, float logprob,
                 Kvrail__FinishReason node_fin, uint64_t now)
{
    if (!q->t_first)
        q->t_first = now;
    if (q->state < RQ_DECODING)
        q->state = RQ_DECODING;
    q->out[q->n_out++] = token;
    Kvrail__GenerateChunk c = KVRAIL__GENERATE_CHUNK__INIT;
    c.request_id = q->id;
    c.index = q->n_out - 1;
    c.token_id = token;
    c.logprob = logprob;
    char *text = NULL;
    size_t text_len = 0;
#if KVR_ROUTER_HAVE_TOKENIZER
    if (q->detok) {
        const char *t = NULL;
        size_t tl = 0;
        if (kvr_detok_feed(q->detok, (int32_t)token, &t, &tl) == KVR_OK && tl) {
            text = (char *)t;
            text_len = tl;
        }
    }
#endif
    Kvrail__FinishReason fin = node_fin;
    if (!fin && is_stop_id(q, token))
        fin = KVRAIL__FINISH_REASON__FINISH_STOP;
    if (!fin && q->n_stops && text_len) {
        /* keep the last max_stop_len - 1 bytes plus this text */
        size_t keep = q->tail_len < q->max_stop_len ? q->tail_len : q->max_stop_len;
        memmove(q->tail, q->tail + q->tail_len - keep, keep);
        size_t add = text_len < 2 * RT_MAX_STOPLEN ? text_len : 2 * RT_MAX_STOPLEN;
        memcpy(q->tail + keep, text + text_len - add, add);
        q->tail_len = keep + add;
        q->tail[q->tail_len] = 0;
        for (size_t i = 0; i < q->n_stops; i++)
            if (memmem(q->tail, q->tail_len, q->stops[i], strlen(q->stops[i])))
                fin = KVRAIL__FINISH_REASON__FINISH_STOP;
    }
    if (!fin && (q->n_out >= q->max_tokens || (r->context && q->n_prompt + q->n_out >= r->context)))
        fin = KVRAIL__FINISH_REASON__FINISH_LENGTH;
    char *buf = NULL;
    if (text_len) {
        buf = malloc(text_len + 1);
        if (buf) {
            memcpy(buf, text, text_len);
            buf[text_len] = 0;
        }
    }
#if KVR_ROUTER_HAVE_TOKENIZER
    if (fin && q->detok) {
        const char *t = NULL;
        size_t tl = 0;
        if (kvr_detok_flush(q->detok, &t, &tl) == KVR_OK && tl) {
            char *nb = realloc(buf, text_len + tl + 1);
            if (nb) {
                memcpy(nb + text_len, t, tl);
                text_len += tl;
                nb[text_len] = 0;
                buf = nb;
            }
        }
    }
#endif
    c.text = buf ? buf : (char *)"";
    c.finish = fin;
    if (q->n_out == 1 && q->return_prompt) {
        c.n_prompt_token_ids = q->n_prompt;
        c.prompt_token_ids = q->prompt;
    }
    kvr_status_t sst = send_client(r, q, 0, &c.base);
    free(buf);
    if (sst == KVR_ERR_NOT_FOUND) {
        r->st.client_disconnects++;
        finish(r, q, KVR_ERR_CANCELED, KVRAIL__FINISH_REASON__FINISH_CANCELED, true, now,
               "client disconnected");
        return true;
    }
    if (fin) {
        bool node_done = node_fin != KVRAIL__FINISH_REASON__FINISH_NONE;
        finish(r, q, KVR_OK, fin, !node_done, now, "%s",
               fin == KVRAIL__FINISH_REASON__FINISH_STOP ? "stop" : "length");
        return true;
    }
    return false;
}

void rt_on_reserved(rt_t *r, struct rt_node *n, const Kvrail__Reserved *m, uint64_t now)
{
    uint64_t t0 = kvr_now_ns(), c0 = rt_cpu_ns();
    struct rt_req *q = req_find(r, m->request_id);
    if (!q || q->d != n->idx || q->state != RQ_RESERVING) {
        KVR_LOG_DEBUG("router", "node %s: stale Reserved for request %" PRIu64, n->name,
                      m->request_id);
        if (!q || q->d != n->idx)
            node_cancel(r, n->idx, m->request_id, KVR_ERR_CANCELED, "request no longer here");
        return;
    }
    q->cached_tokens = m->cached_tokens;
    r->st.cached_tokens += m->cached_tokens;
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
    q->state = RQ_PREFILLING;
    if (!q->local && q->p >= 0) {
        Kvrail__PrefillTarget t = KVRAIL__PREFILL_TARGET__INIT;
        t.request_id = q->did;
        t.decode_node = n->name;
        t.decode_address.data = n->addr;
        t.decode_address.len = n->addr_len;
        ProtobufCBinaryData rk[256];
        size_t nrk = n->n_rkeys < 256 ? n->n_rkeys : 256;
        for (size_t i = 0; i < nrk; i++) {
            rk[i].data = n->rkeys[i];
            rk[i].len = n->rkey_lens[i];
        }
        t.n_layer_rkeys = nrk;
        t.layer_rkeys = rk;
        t.n_layer_base = n->n_layer_base;
        t.layer_base = n->layer_base;
        t.n_block_ids = m->n_block_ids;
        t.block_ids = m->block_ids;
        t.cached_tokens = m->cached_tokens;
        t.transport = n->transport;
        t.decode_incarnation = n->incarnation;
        t.layer_stride = n->layer_stride;
        t.block_bytes = n->block_bytes;
        if (rt_send_node(r, &r->nodes[q->p], KVRAIL__METHOD__PREFILL_TARGET, &t.base) != KVR_OK) {
            q->overhead_ns += kvr_now_ns() - t0;
            q->overhead_cpu_ns += rt_cpu_ns() - c0;
            node_cancel(r, q->d, q->did, KVR_ERR_PEER_FAILURE, "prefill node unreachable");
            q->bad_p = q->p;
            requeue(r, q, now);
            return;
        }
    }
    q->overhead_ns += kvr_now_ns() - t0;
    q->overhead_cpu_ns += rt_cpu_ns() - c0;
}

void rt_on_rejected(rt_t *r, struct rt_node *n, const Kvrail__Rejected *m, uint64_t now)
{
    struct rt_req *q = req_find(r, m->request_id);
    if (!q || q->d != n->idx)
        return;
    kvr_status_t code = m->reason ? m->reason->code : KVR_ERR_INTERNAL;
    const char *why = m->reason && m->reason->message ? m->reason->message : "no reason given";
    if (!q->local)
        node_cancel(r, q->p, q->did, KVR_ERR_CANCELED, "decode node rejected the reservation");
    if (code == KVR_ERR_NO_RESOURCE) {
        KVR_LOG_DEBUG("router", "request %" PRIu64 ": %s has no room (%s); queued", q->id, n->name,
                      why);
        n->free_est = 0; /* until its next heartbeat */
        requeue(r, q, now);
        return;
    }
    finish(r, q, code ? code : KVR_ERR_INTERNAL, KVRAIL__FINISH_REASON__FINISH_ERROR, false, now,
           "decode node %s rejected the request: %s", n->name, why);
}

static void prefill_failed(rt_t *r, struct rt_req *q, uint64_t now, kvr_status_t code,
                           const char *why)
{
    const char *pname = q->p >= 0 ? r->nodes[q->p].name : "(decode node)";
    if (q->retries < r->cl->prefill_retries && q->n_out == q->index_base) {
        q->retries++;
        r->st.retries++;
        KVR_LOG_WARN("router", "request %" PRIu64 ": prefill on %s failed (%s); retry %u of %u",
                     q->id, pname, why, q->retries, r->cl->prefill_retries);
        if (!q->local)
            node_cancel(r, q->p, q->did, KVR_ERR_CANCELED, "retrying elsewhere");
        node_cancel(r, q->d, q->did, KVR_ERR_CANCELED, "prefill retried");
        q->bad_p = q->p;
        requeue(r, q, now);
        rt_queue_pump(r, now);
        return;
    }
    finish(r, q, code, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
           "prefill on %s failed after %u retries: %s", pname, q->retries, why);
}

void rt_on_prefill_done(rt_t *r, struct rt_node *n, const Kvrail__PrefillDone *m, uint64_t now)
{
    uint64_t t0 = kvr_now_ns(), c0 = rt_cpu_ns();
    struct rt_req *q = req_find(r, m->request_id);
    if (!q || (q->p != n->idx && q->d != n->idx))
        return;
    if (m->status && m->status->code) {
        prefill_failed(r, q, now, m->status->code,
                       m->status->message ? m->status->message : "no message");
        return;
    }
    if (!q->prefill_done && q->p >= 0) {
        struct rt_node *p = &r->nodes[q->p];
        p->inflight_tokens = p->inflight_tokens > q->n_ctx ? p->inflight_tokens - q->n_ctx : 0;
    }
    q->prefill_done = true;
    q->kv_bytes += m->bytes_moved;
    if (!m->local && m->bytes_moved) {
        n->pd_bytes += m->bytes_moved;
        n->pd_ns += m->transfer_us * 1000u;
        if (q->d >= 0) {
            r->nodes[q->d].pd_bytes += m->bytes_moved;
            r->nodes[q->d].pd_ns += m->transfer_us * 1000u;
        }
    }
    q->overhead_ns += kvr_now_ns() - t0;
    q->overhead_cpu_ns += rt_cpu_ns() - c0;
    if (q->next_local == 0) {
        q->next_local = 1;
        emit(r, q, m->first_token, m->logprob, KVRAIL__FINISH_REASON__FINISH_NONE, now);
    }
}

void rt_on_token(rt_t *r, struct rt_node *n, const Kvrail__Token *m, uint64_t now)
{
    uint64_t t0 = kvr_now_ns();
    struct rt_req *q = req_find(r, m->request_id);
    if (!q || q->d != n->idx) {
        /* canceled or migrated; tell the node again (it may have missed it) */
        if (!m->finish)
            node_cancel(r, n->idx, m->request_id, KVR_ERR_CANCELED, "request no longer here");
        return;
    }
    if (m->no_token || m->finish == KVRAIL__FINISH_REASON__FINISH_ERROR ||
        m->finish == KVRAIL__FINISH_REASON__FINISH_CANCELED) {
        if (m->finish == KVRAIL__FINISH_REASON__FINISH_ERROR ||
            m->finish == KVRAIL__FINISH_REASON__FINISH_CANCELED) {
            kvr_status_t code = m->status && m->status->code ? m->status->code : KVR_ERR_INTERNAL;
            const char *why = m->status && m->status->message ? m->status->message : "";
            if (q->n_out == q->index_base && !q->prefill_done) {
                prefill_failed(r, q, now, code, why);
                return;
            }
            finish(r, q, code, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                   "decode node %s failed the request after %u tokens: %s", n->name, q->n_out, why);
            return;
        }
        finish(r, q, KVR_OK, m->finish ? m->finish : KVRAIL__FINISH_REASON__FINISH_STOP, false, now,
               "finished");
        return;
    }
    if (m->index < q->next_local)
        return; /* token 0 already delivered by PrefillDone */
    if (m->index > q->next_local)
        KVR_LOG_WARN("router", "request %" PRIu64 ": token %u from %s, expected %u", q->id,
                     m->index, n->name, q->next_local);
    q->next_local = m->index + 1;
    if (!q->prefill_done) {
        q->prefill_done = true; /* local prefill, or D overtook PrefillDone */
        if (q->p >= 0) {
            struct rt_node *p = &r->nodes[q->p];
            p->inflight_tokens = p->inflight_tokens > q->n_ctx ? p->inflight_tokens - q->n_ctx : 0;
        }
    }
    emit(r, q, m->token_id, m->logprob, m->finish, now);
    rt_samples_add(&r->st.token, kvr_now_ns() - t0);
}

/* ---- failures of nodes ---- */

void rt_node_lost(rt_t *r, struct rt_node *n, uint64_t now, const char *why)
{
    for (struct rt_req *q = r->all, *next; q; q = next) {
        next = q->anext;
        if (q->state == RQ_QUEUED)
            continue;
        if (q->p == n->idx && !q->prefill_done && !q->local) {
            char m[160];
            snprintf(m, sizeof(m), "prefill node %s %s", n->name, why);
            prefill_failed(r, q, now, KVR_ERR_PEER_FAILURE, m);
            continue;
        }
        if (q->d == n->idx) {
            if (q->retries >= r->cl->prefill_retries + 1u) {
                finish(r, q, KVR_ERR_PEER_FAILURE, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                       "decode node %s %s after %u tokens; no retries left", n->name, why,
                       q->n_out);
                continue;
            }
            q->retries++;
            r->st.retries++;
            if (q->p >= 0 && !q->local && !q->prefill_done)
                node_cancel(r, q->p, q->did, KVR_ERR_PEER_FAILURE, "decode node lost");
            /* migration: the new dispatch continues from prompt + streamed tokens */
            size_t n_ctx = q->n_prompt + q->n_out;
            uint32_t *ctx = realloc(q->ctx, n_ctx * sizeof(uint32_t));
            uint64_t *hs = realloc(q->hashes, (n_ctx / r->cl->block_size + 1) * sizeof(uint64_t));
            if (!ctx || !hs) {
                if (ctx)
                    q->ctx = ctx;
                if (hs)
                    q->hashes = hs;
                finish(r, q, KVR_ERR_NO_MEMORY, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                       "out of memory migrating the request");
                continue;
            }
            q->ctx = ctx;
            q->hashes = hs;
            memcpy(ctx, q->prompt, q->n_prompt * sizeof(uint32_t));
            memcpy(ctx + q->n_prompt, q->out, q->n_out * sizeof(uint32_t));
            q->n_ctx = n_ctx;
            kvr_blockhash_seq(ctx, n_ctx, r->cl->block_size, hs, n_ctx / r->cl->block_size + 1,
                              &q->n_hashes);
            q->index_base = q->n_out;
            /* the seed's counter restarts on the new node: greedy output is
             * unchanged, sampled output continues as a new draw */
            KVR_LOG_WARN("router",
                         "request %" PRIu64 ": decode node %s %s; migrating with %u tokens "
                         "streamed",
                         q->id, n->name, why, q->n_out);
            q->d = -1;
            requeue(r, q, now);
        }
    }
    rt_queue_pump(r, now);
}

/* ---- client calls ---- */

static void bad_request(rt_t *r, const kvr_proto_frame_t *f, kvr_status_t code, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));

static void bad_request(rt_t *r, const kvr_proto_frame_t *f, kvr_status_t code, const char *fmt,
                        ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    r->st.bad_requests++;
    if (rt_bad_log_ok(r))
        KVR_LOG_INFO("router", "client call %" PRIu64 " (%s) refused: %s", f->hdr.call_id,
                     kvr_proto_method_name(f->hdr.method), msg);
    kvr_proto_send_error(r->client_sock, f->route, f->route_len, f->hdr.method, f->hdr.call_id,
                         code, "%s", msg);
}

static kvr_status_t check_sampling(const Kvrail__SamplingParams *sp, char *err, size_t len)
{
    if (!sp)
        return KVR_OK;
    if (sp->top_k > 1u << 24) {
        snprintf(err, len, "sampling.top_k %u is out of range (0 = off, at most %u)", sp->top_k,
                 1u << 24);
        return KVR_ERR_INVALID;
    }
#if KVR_ROUTER_HAVE_SAMPLE
    struct kvr_sample_params p;
    kvr_sample_params_default(&p);
    p.temperature = sp->temperature;
    p.top_k = (int32_t)sp->top_k;
    p.top_p = sp->top_p == 0.0f ? 1.0f : sp->top_p;
    p.repetition_penalty = sp->repetition_penalty == 0.0f ? 1.0f : sp->repetition_penalty;
    p.seed = sp->seed;
    char e[256] = "";
    if (kvr_sample_params_validate(&p, e, sizeof(e)) != KVR_OK) {
        snprintf(err, len, "invalid sampling: %s", e);
        return KVR_ERR_INVALID;
    }
#else
    if (!isfinite(sp->temperature) || sp->temperature < 0 || sp->temperature > 100) {
        snprintf(err, len, "sampling.temperature %g is out of range [0, 100]", sp->temperature);
        return KVR_ERR_INVALID;
    }
    if (!isfinite(sp->top_p) || sp->top_p < 0 || sp->top_p > 1) {
        snprintf(err, len, "sampling.top_p %g is out of range (0, 1]", sp->top_p);
        return KVR_ERR_INVALID;
    }
    if (!isfinite(sp->repetition_penalty) || sp->repetition_penalty < 0 ||
        sp->repetition_penalty > 100) {
        snprintf(err, len, "sampling.repetition_penalty %g is out of range (0, 100]",
                 sp->repetition_penalty);
        return KVR_ERR_INVALID;
    }
#endif
    return KVR_OK;
}

static void on_generate(rt_t *r, const kvr_proto_frame_t *f, const Kvrail__GenerateRequest *g,
                        uint64_t now, uint64_t t0, uint64_t c0)
{
    char err[512];
    if (check_sampling(g->sampling, err, sizeof(err)) != KVR_OK) {
        bad_request(r, f, KVR_ERR_INVALID, "%s", err);
        return;
    }
    if (g->max_tokens == 0) {
        bad_request(r, f, KVR_ERR_INVALID, "max_tokens is 0 (it must be at least 1)");
        return;
    }
    if (g->max_tokens > r->cl->max_tokens_limit) {
        bad_request(r, f, KVR_ERR_INVALID, "max_tokens %u exceeds the limit %u (limits.max_tokens)",
                    g->max_tokens, r->cl->max_tokens_limit);
        return;
    }
    if (g->n_stop > RT_MAX_STOPS) {
        bad_request(r, f, KVR_ERR_INVALID, "%zu stop strings (at most %d)", g->n_stop,
                    RT_MAX_STOPS);
        return;
    }
    for (size_t i = 0; i < g->n_stop; i++)
        if (!g->stop[i][0] || strlen(g->stop[i]) > RT_MAX_STOPLEN) {
            bad_request(r, f, KVR_ERR_INVALID, "stop[%zu] is empty or longer than %d bytes", i,
                        RT_MAX_STOPLEN);
            return;
        }
    if (g->n_stop_token_ids > 32) {
        bad_request(r, f, KVR_ERR_INVALID, "%zu stop_token_ids (at most 32)", g->n_stop_token_ids);
        return;
    }
    if (!g->n_token_ids && (!g->prompt || !g->prompt[0])) {
        bad_request(r, f, KVR_ERR_INVALID, "the prompt is empty (give prompt or token_ids)");
        return;
    }
    if (r->n_queued >= r->cl->max_queue) {
        r->st.overloaded++;
        bad_request(r, f, KVR_ERR_OVERLOAD,
                    "overloaded: %zu requests already queued (limits.max_queue)", r->n_queued);
        return;
    }

    struct rt_req *q = calloc(1, sizeof(*q));
    if (!q) {
        bad_request(r, f, KVR_ERR_NO_MEMORY, "router out of memory");
        return;
    }
    q->p = q->d = q->bad_p = -1;
    uint64_t tk = 0, tk_cpu = 0;
    if (g->n_token_ids) {
        q->prompt = malloc(g->n_token_ids * sizeof(uint32_t));
        if (q->prompt) {
            memcpy(q->prompt, g->token_ids, g->n_token_ids * sizeof(uint32_t));
            q->n_prompt = g->n_token_ids;
        }
        for (size_t i = 0; r->vocab && i < q->n_prompt; i++)
            if (q->prompt[i] >= r->vocab) {
                bad_request(r, f, KVR_ERR_INVALID,
                            "token_ids[%zu] = %u is outside the vocabulary (%u ids)", i,
                            q->prompt[i], r->vocab);
                goto err_free;
            }
    } else {
#if KVR_ROUTER_HAVE_TOKENIZER
        if (!r->tok) {
            bad_request(r, f, KVR_ERR_UNSUPPORTED,
                        "the router has no tokenizer (model %s): send token_ids", r->cl->model_dir);
            goto err_free;
        }
        uint64_t t1 = kvr_now_ns(), c1 = rt_cpu_ns();
        int32_t *ids = NULL;
        size_t n = 0;
        kvr_status_t st =
            kvr_tokenizer_encode(r->tok, g->prompt, strlen(g->prompt), true, &ids, &n);
        tk = kvr_now_ns() - t1;
        tk_cpu = rt_cpu_ns() - c1;
        rt_samples_add(&r->st.tokenize, tk);
        if (st != KVR_OK) {
            bad_request(r, f, st, "tokenizing the prompt failed: %s", kvr_status_str(st));
            goto err_free;
        }
        q->prompt = (uint32_t *)ids; /* same size and representation */
        q->n_prompt = n;
#else
        bad_request(r, f, KVR_ERR_UNSUPPORTED,
                    "this router was built without the tokenizer: send token_ids");
        goto err_free;
#endif
    }
    if (!q->prompt || !q->n_prompt) {
        bad_request(r, f, KVR_ERR_INVALID, "the prompt tokenizes to nothing");
        goto err_free;
    }
    if (r->context && q->n_prompt >= r->context) {
        bad_request(r, f, KVR_ERR_INVALID,
                    "the prompt has %zu tokens; the model's context is %u tokens", q->n_prompt,
                    r->context);
        goto err_free;
    }
    if (r->context && q->n_prompt + g->max_tokens > r->context) {
        bad_request(r, f, KVR_ERR_INVALID,
                    "prompt (%zu tokens) + max_tokens (%u) exceeds the model's context (%u)",
                    q->n_prompt, g->max_tokens, r->context);
        goto err_free;
    }
    q->id = ++r->next_id;
    memcpy(q->route, f->route, f->route_len);
    q->route_len = f->route_len;
    q->client_fd = f->src_fd;
    /* events of this fd's earlier connection are handled before the request
     * takes the fd's epoch (the accept of its own connection came first) */
    rt_drain_monitor(r);
    q->client_epoch = rt_fd_epoch(r, q->client_fd);
    KVR_LOG_DEBUG("router", "request %" PRIu64 " from client fd %d", q->id, q->client_fd);
    q->call_id = f->hdr.call_id;
    q->max_tokens = g->max_tokens;
    kvrail__sampling_params__init(&q->sp);
    if (g->sampling) {
        q->sp.temperature = g->sampling->temperature;
        q->sp.top_p = g->sampling->top_p == 0.0f ? 1.0f : g->sampling->top_p;
        q->sp.top_k = g->sampling->top_k;
        q->sp.repetition_penalty =
            g->sampling->repetition_penalty == 0.0f ? 1.0f : g->sampling->repetition_penalty;
        q->sp.seed = g->sampling->seed;
        q->sp.has_seed = g->sampling->has_seed;
    } else {
        q->sp.top_p = 1.0f;
        q->sp.repetition_penalty = 1.0f;
    }
    if (!q->sp.has_seed) {
        q->sp.seed = rt_rand(r);
        q->sp.has_seed = true;
    }
    for (size_t i = 0; i < g->n_stop_token_ids; i++)
        q->stop_ids[q->n_stop_ids++] = g->stop_token_ids[i];
    q->ignore_eos = g->ignore_eos;
    for (size_t i = 0; !g->ignore_eos && i < r->n_eos && q->n_stop_ids < 64; i++)
        if (!is_stop_id(q, r->eos_ids[i]))
            q->stop_ids[q->n_stop_ids++] = r->eos_ids[i];
#if KVR_ROUTER_HAVE_TOKENIZER
    if (r->tok && !g->ignore_eos) {
        const int32_t *eos = NULL;
        size_t ne = kvr_tokenizer_eos_ids(r->tok, &eos);
        for (size_t i = 0; i < ne && q->n_stop_ids < 64; i++)
            if (!is_stop_id(q, (uint32_t)eos[i]))
                q->stop_ids[q->n_stop_ids++] = (uint32_t)eos[i];
    }
    if (r->tok && !g->no_text && kvr_detok_create(r->tok, true, &q->detok) != KVR_OK)
        q->detok = NULL;
#endif
    for (size_t i = 0; i < g->n_stop; i++) {
        q->stops[i] = strdup(g->stop[i]);
        if (!q->stops[i])
            goto err_nomem;
        q->n_stops++;
        if (strlen(g->stop[i]) > q->max_stop_len)
            q->max_stop_len = strlen(g->stop[i]);
    }
    if (q->n_stops) {
        q->tail = malloc(q->max_stop_len + 2 * RT_MAX_STOPLEN + 1);
        if (!q->tail)
            goto err_nomem;
    }
    q->no_text = g->no_text;
    q->return_prompt = g->return_prompt_tokens;
    q->out = malloc(g->max_tokens * sizeof(uint32_t));
    q->ctx = malloc(q->n_prompt * sizeof(uint32_t));
    size_t max_h = q->n_prompt / r->cl->block_size + 1;
    q->hashes = malloc(max_h * sizeof(uint64_t));
    if (!q->out || !q->ctx || !q->hashes)
        goto err_nomem;
    memcpy(q->ctx, q->prompt, q->n_prompt * sizeof(uint32_t));
    q->n_ctx = q->n_prompt;
    kvr_blockhash_seq(q->ctx, q->n_ctx, r->cl->block_size, q->hashes, max_h, &q->n_hashes);
    q->t_recv = now;
    q->deadline = now + (uint64_t)r->cl->timeouts.request_ms * MS;
    q->queue_deadline = now + (uint64_t)r->cl->timeouts.queue_ms * MS;
    q->anext = r->all;
    if (r->all)
        r->all->aprev = q;
    r->all = q;
    r->st.requests++;
    r->st.prompt_tokens += q->n_prompt;
    q->overhead_ns += kvr_now_ns() - t0 - tk;
    q->overhead_cpu_ns += rt_cpu_ns() - c0 - tk_cpu;
    enum pick_result pr = dispatch(r, q, now);
    if (pr == PICK_TOO_BIG) {
        uint32_t most = 0;
        for (int i = 0; i < r->n_nodes; i++)
            if (r->nodes[i].role == KVR_NODE_ROLE_DECODE && r->nodes[i].alive &&
                r->nodes[i].total_blocks > most)
                most = r->nodes[i].total_blocks;
        finish(r, q, KVR_ERR_NO_RESOURCE, KVRAIL__FINISH_REASON__FINISH_ERROR, false, now,
               "the prompt needs %zu KV blocks; the largest live decode pool has %u",
               (q->n_ctx + r->cl->block_size - 1) / r->cl->block_size, most);
    } else if (pr != PICK_OK) {
        q_push(r, q, false);
    }
    return;

err_nomem:
    bad_request(r, f, KVR_ERR_NO_MEMORY, "router out of memory");
err_free:
    for (size_t i = 0; i < q->n_stops; i++)
        free(q->stops[i]);
    free(q->prompt);
    free(q->ctx);
    free(q->hashes);
    free(q->out);
    free(q->tail);
#if KVR_ROUTER_HAVE_TOKENIZER
    if (q->detok)
        kvr_detok_destroy(q->detok);
#endif
    free(q);
}

static void on_cancel(rt_t *r, const kvr_proto_frame_t *f, const Kvrail__CancelRequest *c,
                      uint64_t now)
{
    struct rt_req *q = NULL;
    if (c->request_id) {
        for (struct rt_req *x = r->all; x && !q; x = x->anext)
            if (x->id == c->request_id && x->route_len == f->route_len &&
                !memcmp(x->route, f->route, f->route_len))
                q = x; /* only the connection that started it may cancel it */
    } else if (c->call_id) {
        for (struct rt_req *x = r->all; x; x = x->anext)
            if (x->call_id == c->call_id && x->route_len == f->route_len &&
                !memcmp(x->route, f->route, f->route_len)) {
                q = x;
                break;
            }
    }
    Kvrail__CancelReply rep = KVRAIL__CANCEL_REPLY__INIT;
    Kvrail__Status s = KVRAIL__STATUS__INIT;
    rep.status = &s;
    if (!q) {
        s.code = KVR_ERR_NOT_FOUND;
        s.message = (char *)"no such request on this connection (finished already?)";
    } else {
        s.code = KVR_OK;
        s.message = (char *)"canceled";
        finish(r, q, KVR_ERR_CANCELED, KVRAIL__FINISH_REASON__FINISH_CANCELED, true, now,
               "canceled by the client");
    }
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, KVR_PROTO_F_END, KVRAIL__METHOD__CANCEL,
                         f->hdr.call_id};
    kvr_proto_send(r->client_sock, f->route, f->route_len, &h, &rep.base);
}

void rt_client_gone(rt_t *r, int fd)
{
    uint64_t now = kvr_now_ns();
    for (struct rt_req *q = r->all, *next; q; q = next) {
        next = q->anext;
        if (q->client_fd != fd || q->client_epoch != rt_fd_epoch(r, fd))
            continue;
        r->st.client_disconnects++;
        q->route_len = 0; /* nothing to send to */
        finish(r, q, KVR_ERR_CANCELED, KVRAIL__FINISH_REASON__FINISH_CANCELED, true, now,
               "client disconnected");
    }
}

static void on_status(rt_t *r, const kvr_proto_frame_t *f, uint64_t now)
{
    Kvrail__StatusReply rep = KVRAIL__STATUS_REPLY__INIT;
    Kvrail__Status s = KVRAIL__STATUS__INIT;
    Kvrail__RouterStats rs = KVRAIL__ROUTER_STATS__INIT;
    Kvrail__NodeStatus ns[RT_MAX_NODES];
    Kvrail__NodeStatus *nsp[RT_MAX_NODES];
    s.message = (char *)"ok";
    rep.status = &s;
    rep.router = &rs;
    rep.model = r->cl->model_dir;
    rep.block_size = r->cl->block_size;
    rs.uptime_ms = (now - r->start_ns) / MS;
    rs.requests = r->st.requests;
    rs.queued = r->n_queued;
    for (struct rt_req *q = r->all; q; q = q->anext)
        rs.active++;
    rs.completed = r->st.completed;
    rs.failed = r->st.failed;
    rs.canceled = r->st.canceled;
    rs.overloaded = r->st.overloaded;
    rs.bad_frames = r->st.bad_frames;
    rs.bad_requests = r->st.bad_requests;
    rs.local_prefills = r->st.local_prefills;
    rs.disagg_prefills = r->st.disagg_prefills;
    rs.retries = r->st.retries;
    rs.overhead_p50_ns = rt_samples_pct(&r->st.overhead, 0.50);
    rs.overhead_p99_ns = rt_samples_pct(&r->st.overhead, 0.99);
    rs.overhead_max_ns = rt_samples_pct(&r->st.overhead, 1.0);
    rs.overhead_samples = r->st.overhead.n;
    rs.overhead_cpu_p50_ns = rt_samples_pct(&r->st.overhead_cpu, 0.50);
    rs.overhead_cpu_p99_ns = rt_samples_pct(&r->st.overhead_cpu, 0.99);
    rs.token_overhead_p50_ns = rt_samples_pct(&r->st.token, 0.50);
    rs.token_overhead_p99_ns = rt_samples_pct(&r->st.token, 0.99);
    rs.tokenize_p50_ns = rt_samples_pct(&r->st.tokenize, 0.50);
    rs.tokenize_p99_ns = rt_samples_pct(&r->st.tokenize, 0.99);
    rs.client_disconnects = r->st.client_disconnects;
    rs.resyncs = r->st.resyncs;
    rs.dead_nodes = r->st.dead_nodes;
    rs.directory_blocks = r->dir.n;
    rs.cached_tokens = r->st.cached_tokens;
    rs.prompt_tokens = r->st.prompt_tokens;
    uint64_t kb = 0, kns = 0;
    for (int i = 0; i < r->n_nodes; i++) {
        struct rt_node *n = &r->nodes[i];
        kvrail__node_status__init(&ns[i]);
        nsp[i] = &ns[i];
        ns[i].name = n->name;
        ns[i].role = n->role == KVR_NODE_ROLE_PREFILL ? KVRAIL__ROLE__ROLE_PREFILL
                                                      : KVRAIL__ROLE__ROLE_DECODE;
        ns[i].alive = n->alive;
        ns[i].host = n->host[0] ? n->host : (char *)n->conf->host;
        ns[i].transport = n->transport[0] ? n->transport : (char *)n->conf->transport;
        ns[i].last_heartbeat_ms_ago = n->registered ? (now - n->last_hb_ns) / MS : 0;
        ns[i].total_blocks = n->total_blocks;
        ns[i].free_blocks = n->free_blocks;
        ns[i].cached_blocks = (uint32_t)n->dir_blocks;
        ns[i].batch_size = n->batch_size;
        ns[i].inflight_prefill_tokens = n->inflight_prefill_hb > n->inflight_tokens
                                            ? n->inflight_prefill_hb
                                            : n->inflight_tokens;
        ns[i].queued_prefill_tokens = n->queued_prefill_hb;
        ns[i].requests = n->requests;
        /* the node's own cumulative figures, or what its PrefillDones said */
        uint64_t nb = n->kv_bytes, nt = n->kv_ns;
        if (n->pd_bytes > nb) {
            nb = n->pd_bytes;
            nt = n->pd_ns;
        }
        ns[i].kv_bytes_moved = nb;
        ns[i].kv_transfer_ns = nt;
        ns[i].kv_gbps = nt ? (double)nb / (double)nt : 0.0;
        ns[i].block_event_seq = n->ev_seq;
        ns[i].resyncs = n->resyncs;
        ns[i].model_fingerprint = n->fingerprint;
        if (n->role == KVR_NODE_ROLE_PREFILL) {
            kb += nb;
            kns += nt;
        }
    }
    rs.kv_bytes_moved = kb;
    rs.kv_transfer_ns = kns;
    rs.kv_gbps = kns ? (double)kb / (double)kns : 0.0;
    rep.n_nodes = (size_t)r->n_nodes;
    rep.nodes = nsp;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, KVR_PROTO_F_END, KVRAIL__METHOD__STATUS,
                         f->hdr.call_id};
    kvr_proto_send(r->client_sock, f->route, f->route_len, &h, &rep.base);
}

void rt_client_msg(rt_t *r, kvr_proto_frame_t *f, uint64_t now)
{
    uint64_t t0 = kvr_now_ns(), c0 = rt_cpu_ns();
    char err[512] = "";
    ProtobufCMessage *m = NULL;
    unsigned method = f->hdr.method;
    if (method >= KVRAIL__METHOD__REGISTER) {
        r->st.bad_frames++;
        bad_request(r, f, KVR_ERR_UNSUPPORTED,
                    "method %s belongs to the node service (router.node endpoint), not the "
                    "client endpoint",
                    kvr_proto_method_name(method));
        return;
    }
    kvr_status_t st = kvr_proto_decode(f, NULL, &m, err, sizeof(err));
    if (st != KVR_OK) {
        r->st.bad_frames++;
        bad_request(r, f, st, "%s", err);
        return;
    }
    switch (method) {
    case KVRAIL__METHOD__GENERATE: {
        uint64_t before = r->next_id;
        on_generate(r, f, (Kvrail__GenerateRequest *)m, now, t0, c0);
        (void)before;
        break;
    }
    case KVRAIL__METHOD__CANCEL:
        on_cancel(r, f, (Kvrail__CancelRequest *)m, now);
        break;
    case KVRAIL__METHOD__STATUS:
        on_status(r, f, now);
        break;
    case KVRAIL__METHOD__PING: {
        kvr_proto_hdr_t h = {KVR_PROTO_VERSION, KVR_PROTO_F_END, KVRAIL__METHOD__PING,
                             f->hdr.call_id};
        kvr_proto_send(r->client_sock, f->route, f->route_len, &h, m);
        break;
    }
    default:
        bad_request(r, f, KVR_ERR_UNSUPPORTED, "method %u is not served here", method);
        break;
    }
    protobuf_c_message_free_unpacked(m, NULL);
}

void rt_requests_tick(rt_t *r, uint64_t now)
{
    for (struct rt_req *q = r->all, *next; q; q = next) {
        next = q->anext;
        if (now > q->deadline) {
            finish(r, q, KVR_ERR_TIMEOUT, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                   "request deadline (timeouts.request_ms = %u) passed after %u tokens",
                   r->cl->timeouts.request_ms, q->n_out);
            continue;
        }
        if (q->state == RQ_QUEUED && now > q->queue_deadline) {
            bool any = false;
            for (int i = 0; i < r->n_nodes; i++)
                any |= r->nodes[i].role == KVR_NODE_ROLE_DECODE && r->nodes[i].alive;
            if (any)
                finish(r, q, KVR_ERR_OVERLOAD, KVRAIL__FINISH_REASON__FINISH_ERROR, false, now,
                       "overloaded: no decode node had room for %zu tokens within %u ms "
                       "(timeouts.queue_ms)",
                       q->n_ctx, r->cl->timeouts.queue_ms);
            else
                finish(r, q, KVR_ERR_NO_RESOURCE, KVRAIL__FINISH_REASON__FINISH_ERROR, false, now,
                       "no live decode node within %u ms (timeouts.queue_ms)",
                       r->cl->timeouts.queue_ms);
            continue;
        }
        if ((q->state == RQ_RESERVING || q->state == RQ_PREFILLING) && !q->t_first &&
            q->n_out == q->index_base && now > q->prefill_deadline) {
            prefill_failed(r, q, now, KVR_ERR_TIMEOUT, "no first token within timeouts.prefill_ms");
            continue;
        }
    }
}

void rt_requests_fini(rt_t *r)
{
    uint64_t now = kvr_now_ns();
    while (r->all)
        finish(r, r->all, KVR_ERR_CLOSED, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
               "router shutting down");
}
