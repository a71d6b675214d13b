/*
 * streams.c - the token stream from the decode node to the client.  Every
 * token, the first included, comes from D's Token messages, in order (index
 * per dispatch, offset by the tokens streamed before a migration); P's
 * PrefillDone is load accounting (and failure) only.  Each token is
 * detokenized incrementally and sent as a GenerateChunk.  Stop strings are
 * the router's (the last bytes of text kept in a small tail); EOS, stop ids
 * and max_tokens are D's, which marks the token that ends the stream.  The
 * router still cuts a stream at max_tokens: the bound of what it streams,
 * should a node run past it.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"

/* Streams one token; ends the request when it is the last.  Returns true if
 * the request was finished (and freed). */
static bool emit(rt_t *r, struct rt_req *q, const Kvrail__Token *m, uint32_t token, float logprob,
                 Kvrail__FinishReason node_fin, uint64_t now)
{
    if (!q->t_first)
        q->t_first = now;
    if (q->state < RQ_DECODING)
        rt_req_set_state(r, q, RQ_DECODING);
    q->out[q->n_out++] = token;
    Kvrail__GenerateChunk c = KVRAIL__GENERATE_CHUNK__INIT;
    c.request_id = q->id;
    c.index = q->n_out - 1;
    c.token_id = token;
    c.logprob = logprob;
    if (m && q->sp.top_logprobs) { /* D's alternatives, at most what was asked */
        c.n_top_logprobs =
            m->n_top_logprobs < q->sp.top_logprobs ? m->n_top_logprobs : q->sp.top_logprobs;
        c.top_logprobs = m->top_logprobs;
    }
    char *text = NULL;
    size_t text_len = 0;
    if (q->detok) {
        const char *t = NULL;
        size_t tl = 0;
        if (kvr_detok_feed(q->detok, (int32_t)token, &t, &tl) == KVR_OK && tl) {
            text = (char *)t;
            text_len = tl;
        }
    }
    Kvrail__FinishReason fin = node_fin;
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
    if (!fin && q->n_out >= q->max_tokens) {
        /* D ends the stream at max_tokens; this is the bound of the
         * client's stream (and of q->out) should a node run past it */
        fin = KVRAIL__FINISH_REASON__FINISH_LENGTH;
    }
    char *buf = NULL;
    if (text_len) {
        buf = malloc(text_len + 1);
        if (buf) {
            memcpy(buf, text, text_len);
            buf[text_len] = 0;
        }
    }
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
    c.text = buf ? buf : (char *)"";
    c.finish = fin;
    if (q->n_out == 1 && q->return_prompt) {
        c.n_prompt_token_ids = q->n_prompt;
        c.prompt_token_ids = q->prompt;
    }
    kvr_status_t sst = rt_send_client(r, q, 0, &c.base);
    free(buf);
    if (sst == KVR_ERR_NOT_FOUND) {
        r->st.client_disconnects++;
        rt_req_finish(r, q, KVR_ERR_CANCELED, KVRAIL__FINISH_REASON__FINISH_CANCELED, true, now,
                      "client disconnected");
        return true;
    }
    if (fin) {
        bool node_done = node_fin != KVRAIL__FINISH_REASON__FINISH_NONE;
        rt_req_finish(r, q, KVR_OK, fin, !node_done, now, "%s",
                      fin == KVRAIL__FINISH_REASON__FINISH_STOP ? "stop" : "length");
        return true;
    }
    return false;
}

void rt_on_prefill_done(rt_t *r, struct rt_node *n, const Kvrail__PrefillDone *m, uint64_t now)
{
    uint64_t t0 = kvr_now_ns(), c0 = rt_cpu_ns();
    struct rt_req *q = rt_req_find(r, m->request_id);
    if (!q || (q->p != n->idx && q->d != n->idx))
        return;
    if (!m->local && m->attempt != q->attempt) {
        KVR_LOG_DEBUG("router", "request %" PRIu64 ": PrefillDone of attempt %u from %s, now at %u",
                      q->id, m->attempt, n->name, q->attempt);
        return; /* an earlier attempt, retried since */
    }
    if (m->status && m->status->code) {
        if (q->n_out > q->index_base)
            return; /* D streams already: it has the KV (e.g. P canceled after all) */
        if (q->p == n->idx && q->d >= 0)
            n->sent_d_inc[q->d] = 0; /* the retry carries D's address and rkeys again */
        const char *why = m->status->message ? m->status->message : "no message";
        if (m->decode_fault && !m->local && q->p == n->idx && q->d >= 0 && !q->local) {
            rt_failover_decode_failed(r, q, now, m->status->code, why);
            return;
        }
        n->blamed++; /* its own failure */
        rt_failover_prefill_failed(r, q, now, m->status->code, why);
        return;
    }
    if (!q->prefill_done && q->p >= 0) {
        struct rt_node *p = &r->nodes[q->p];
        p->inflight_tokens = p->inflight_tokens > q->n_ctx ? p->inflight_tokens - q->n_ctx : 0;
    }
    q->prefill_done = true;
    if (!q->kv_counted)
        q->kv_bytes += m->bytes_moved;
    q->kv_counted = true;
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
}

void rt_on_token(rt_t *r, struct rt_node *n, const Kvrail__Token *m, uint64_t now)
{
    uint64_t t0 = kvr_now_ns();
    struct rt_req *q = rt_req_find(r, m->request_id);
    if (!q || q->d != n->idx) {
        /* canceled or migrated; tell the node again (it may have missed it) */
        if (!m->finish)
            rt_send_node_cancel(r, n->idx, m->request_id, KVR_ERR_CANCELED,
                                "request no longer here");
        return;
    }
    if (m->no_token || m->finish == KVRAIL__FINISH_REASON__FINISH_ERROR ||
        m->finish == KVRAIL__FINISH_REASON__FINISH_CANCELED) {
        if (m->finish == KVRAIL__FINISH_REASON__FINISH_ERROR ||
            m->finish == KVRAIL__FINISH_REASON__FINISH_CANCELED) {
            kvr_status_t code = m->status && m->status->code ? m->status->code : KVR_ERR_INTERNAL;
            const char *why = m->status && m->status->message ? m->status->message : "";
            if (q->n_out == q->index_base && !q->prefill_done) {
                q->d_held = false; /* D ended it: a retry reserves again */
                /* D's own prefill failed: another decode node takes it */
                if (q->local)
                    rt_failover_decode_failed(r, q, now, code, why);
                else
                    rt_failover_prefill_failed(r, q, now, code, why);
                return;
            }
            rt_req_finish(r, q, code, KVRAIL__FINISH_REASON__FINISH_ERROR, true, now,
                          "decode node %s failed the request after %u tokens: %s", n->name,
                          q->n_out, why);
            return;
        }
        rt_req_finish(r, q, KVR_OK, m->finish ? m->finish : KVRAIL__FINISH_REASON__FINISH_STOP,
                      false, now, "finished");
        return;
    }
    if (m->index < q->next_local) {
        r->st.bad_frames++; /* D streams each index once */
        if (rt_bad_log_ok(r))
            KVR_LOG_WARN("router", "request %" PRIu64 ": token %u from %s again: dropped", q->id,
                         m->index, n->name);
        return;
    }
    if (m->index > q->next_local)
        KVR_LOG_WARN("router", "request %" PRIu64 ": token %u from %s, expected %u", q->id,
                     m->index, n->name, q->next_local);
    q->next_local = m->index + 1;
    if (m->kv_bytes && !q->kv_counted) {
        q->kv_bytes += m->kv_bytes; /* overtook P's PrefillDone, which has the same count */
        q->kv_counted = true;
    }
    if (m->index == 0 && !q->local)
        n->blame_streak = 0; /* a transfer to it worked */
    if (!q->prefill_done) {
        q->prefill_done = true; /* local prefill, or D overtook PrefillDone */
        if (q->p >= 0 && !q->local && q->attempt > 0)
            /* the KV of an attempt that was retried reached D after all:
             * the retry's prefill is not needed */
            rt_send_node_cancel(r, q->p, q->did, KVR_ERR_CANCELED, "decode node has the KV");
        if (q->p >= 0) {
            struct rt_node *p = &r->nodes[q->p];
            p->inflight_tokens = p->inflight_tokens > q->n_ctx ? p->inflight_tokens - q->n_ctx : 0;
        }
    }
    emit(r, q, m, m->token_id, m->logprob, m->finish, now);
    rt_samples_add(&r->st.token, kvr_now_ns() - t0);
}
