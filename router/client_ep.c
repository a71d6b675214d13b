/*
 * client_ep.c - the router's client endpoint.  GENERATE is admitted here,
 * and only here, checked once for the whole cluster: sampling values,
 * max_tokens (against limits.max_tokens and the model's context), stop
 * strings and stop ids, token ids against the vocabulary, the queue bound.
 * The prompt is tokenized, its full blocks hashed (chained sequence hashes),
 * and the request dispatched or queued.  CANCEL ends a request of the same
 * connection; STATUS and PING are answered.  A monitor socket reports client
 * connections: each fd has an epoch bumped on accept, so a disconnect ends
 * only the requests of the connection that made them.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvr_blockhash.h"
#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"

#define MS (1000000ull)

static void client_gone(rt_t *r, int fd);

static uint32_t fd_epoch(const rt_t *r, int fd)
{
    return fd >= 0 && fd < RT_MAX_CLIENT_FD ? r->fd_epoch[fd] : 0;
}

void rt_client_monitor(rt_t *r)
{
    for (;;) {
        zmq_msg_t ev;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, r->mon_sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (const uint8_t *)zmq_msg_data(&ev) + 2, 4);
        }
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        while (more) { /* the endpoint address part */
            zmq_msg_t p;
            zmq_msg_init(&p);
            if (zmq_msg_recv(&p, r->mon_sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&p);
                break;
            }
            more = zmq_msg_more(&p);
            zmq_msg_close(&p);
        }
        KVR_LOG_DEBUG("router", "client socket event %u fd %u", event, value);
        if (event == ZMQ_EVENT_DISCONNECTED)
            client_gone(r, (int)value);
        else if (event == ZMQ_EVENT_ACCEPTED && value < RT_MAX_CLIENT_FD)
            r->fd_epoch[value]++;
    }
}

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
                     kvr_proto_method_label(f->hdr.method), msg);
    kvr_proto_send_error(r->client_sock, f->route, f->route_len, f->hdr.method, f->hdr.call_id,
                         code, "%s", msg);
}

static kvr_status_t check_sampling(rt_t *r, const Kvrail__SamplingParams *sp, char *err, size_t len)
{
    if (!sp)
        return KVR_OK;
    if (sp->top_k > 1u << 24) {
        snprintf(err, len, "sampling.top_k %u is out of range (0 = off, at most %u)", sp->top_k,
                 1u << 24);
        return KVR_ERR_INVALID;
    }
    if (sp->top_logprobs > KVR_SAMPLE_MAX_TOP_LOGPROBS) {
        snprintf(err, len, "sampling.top_logprobs %u is out of range (0 = none, at most %d)",
                 sp->top_logprobs, KVR_SAMPLE_MAX_TOP_LOGPROBS);
        return KVR_ERR_INVALID;
    }
    if (sp->n_logit_bias > KVR_SAMPLE_MAX_LOGIT_BIAS) {
        snprintf(err, len, "sampling.logit_bias has %zu entries (at most %d)", sp->n_logit_bias,
                 KVR_SAMPLE_MAX_LOGIT_BIAS);
        return KVR_ERR_INVALID;
    }
    struct kvr_logit_bias lb[KVR_SAMPLE_MAX_LOGIT_BIAS];
    for (size_t i = 0; i < sp->n_logit_bias; i++) {
        uint32_t id = sp->logit_bias[i]->token_id;
        if (r->vocab ? id >= r->vocab : id > INT32_MAX) {
            snprintf(err, len, "sampling.logit_bias token %u is outside the vocabulary (%u ids)",
                     id, r->vocab);
            return KVR_ERR_INVALID;
        }
        lb[i].token = (int32_t)id;
        lb[i].bias = sp->logit_bias[i]->bias;
    }
    struct kvr_sample_params p;
    kvr_sample_params_default(&p);
    p.temperature = sp->temperature;
    p.top_k = (int32_t)sp->top_k;
    p.top_p = sp->top_p == 0.0f ? 1.0f : sp->top_p;
    p.repetition_penalty = sp->repetition_penalty == 0.0f ? 1.0f : sp->repetition_penalty;
    p.seed = sp->seed;
    p.min_p = sp->min_p;
    p.presence_penalty = sp->presence_penalty;
    p.frequency_penalty = sp->frequency_penalty;
    p.logit_bias = lb;
    p.n_logit_bias = sp->n_logit_bias;
    char e[256] = "";
    if (kvr_sample_params_validate(&p, e, sizeof(e)) != KVR_OK) {
        snprintf(err, len, "invalid sampling: %s", e);
        return KVR_ERR_INVALID;
    }
    return KVR_OK;
}

/* The router's copy of a request's logit bias (one allocation, freed with
 * the request: q->sp.logit_bias). */
static kvr_status_t copy_logit_bias(Kvrail__SamplingParams *dst, const Kvrail__SamplingParams *src)
{
    if (!src->n_logit_bias)
        return KVR_OK;
    size_t n = src->n_logit_bias;
    Kvrail__LogitBias **pp = malloc(n * (sizeof(*pp) + sizeof(Kvrail__LogitBias)));
    if (!pp)
        return KVR_ERR_NO_MEMORY;
    Kvrail__LogitBias *e = (Kvrail__LogitBias *)(pp + n);
    for (size_t i = 0; i < n; i++) {
        kvrail__logit_bias__init(&e[i]);
        e[i].token_id = src->logit_bias[i]->token_id;
        e[i].bias = src->logit_bias[i]->bias;
        pp[i] = &e[i];
    }
    dst->logit_bias = pp;
    dst->n_logit_bias = n;
    return KVR_OK;
}

static void on_generate(rt_t *r, const kvr_proto_frame_t *f, const Kvrail__GenerateRequest *g,
                        uint64_t now, uint64_t t0, uint64_t c0)
{
    char err[512];
    if (check_sampling(r, g->sampling, err, sizeof(err)) != KVR_OK) {
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
    size_t prompt_bytes = g->n_token_ids ? 0 : strlen(g->prompt);
    if (prompt_bytes > rt_prompt_bytes_max(r)) {
        bad_request(r, f, KVR_ERR_INVALID,
                    "the prompt is %zu bytes; at most %zu are tokenized (%u bytes per token of "
                    "the model's context): shorten it or send token_ids",
                    prompt_bytes, rt_prompt_bytes_max(r), RT_PROMPT_BYTES_PER_TOKEN);
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
        if (!r->tok) {
            bad_request(r, f, KVR_ERR_UNSUPPORTED,
                        "the router has no tokenizer (model %s): send token_ids", r->cl->model_dir);
            goto err_free;
        }
        uint64_t t1 = kvr_now_ns(), c1 = rt_cpu_ns();
        int32_t *ids = NULL;
        size_t n = 0;
        kvr_status_t st = kvr_tokenizer_encode(r->tok, g->prompt, prompt_bytes, true, &ids, &n);
        tk = kvr_now_ns() - t1;
        tk_cpu = rt_cpu_ns() - c1;
        rt_samples_add(&r->st.tokenize, tk);
        if (st != KVR_OK) {
            bad_request(r, f, st, "tokenizing the prompt failed: %s", kvr_status_str(st));
            goto err_free;
        }
        q->prompt = (uint32_t *)ids; /* same size and representation */
        q->n_prompt = n;
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
    rt_client_monitor(r);
    q->client_epoch = fd_epoch(r, q->client_fd);
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
        q->sp.min_p = g->sampling->min_p;
        q->sp.presence_penalty = g->sampling->presence_penalty;
        q->sp.frequency_penalty = g->sampling->frequency_penalty;
        q->sp.top_logprobs = g->sampling->top_logprobs;
        if (copy_logit_bias(&q->sp, g->sampling) != KVR_OK)
            goto err_nomem;
    } else {
        q->sp.top_p = 1.0f;
        q->sp.repetition_penalty = 1.0f;
    }
    if (!q->sp.has_seed) {
        q->sp.seed = rt_rand(r);
        q->sp.has_seed = true;
    }
    /* stop ids and EOS end the stream on D (it knows the model's EOS ids);
     * the router passes the client's stop ids on and checks stop strings */
    for (size_t i = 0; i < g->n_stop_token_ids; i++)
        q->stop_ids[q->n_stop_ids++] = g->stop_token_ids[i];
    q->ignore_eos = g->ignore_eos;
    if (r->tok && !g->no_text && kvr_detok_create(r->tok, true, &q->detok) != KVR_OK)
        q->detok = NULL;
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
    rt_req_add(r, q);
    r->st.requests++;
    r->st.prompt_tokens += q->n_prompt;
    q->overhead_ns += kvr_now_ns() - t0 - tk;
    q->overhead_cpu_ns += rt_cpu_ns() - c0 - tk_cpu;
    enum rt_dispatch_result pr = rt_dispatch(r, q, now);
    if (pr == RT_DISPATCH_TOO_BIG) {
        uint32_t most = 0;
        for (int i = 0; i < r->n_nodes; i++)
            if (r->nodes[i].role == KVR_NODE_ROLE_DECODE && r->nodes[i].alive &&
                r->nodes[i].total_blocks > most)
                most = r->nodes[i].total_blocks;
        rt_req_finish(r, q, KVR_ERR_NO_RESOURCE, KVRAIL__FINISH_REASON__FINISH_ERROR, false, now,
                      "the prompt needs %zu KV blocks; the largest live decode pool has %u",
                      (q->n_ctx + r->cl->block_size - 1) / r->cl->block_size, most);
    } else if (pr != RT_DISPATCH_OK) {
        rt_queue_push(r, q, false);
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
    free(q->sp.logit_bias);
    if (q->detok)
        kvr_detok_destroy(q->detok);
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
        rt_req_finish(r, q, KVR_ERR_CANCELED, KVRAIL__FINISH_REASON__FINISH_CANCELED, true, now,
                      "canceled by the client");
    }
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, KVR_PROTO_F_END, KVRAIL__METHOD__CANCEL,
                         f->hdr.call_id};
    kvr_proto_send(r->client_sock, f->route, f->route_len, &h, &rep.base);
}

static void client_gone(rt_t *r, int fd)
{
    uint64_t now = kvr_now_ns();
    for (struct rt_req *q = r->all, *next; q; q = next) {
        next = q->anext;
        if (q->client_fd != fd || q->client_epoch != fd_epoch(r, fd))
            continue;
        r->st.client_disconnects++;
        q->route_len = 0; /* nothing to send to */
        rt_req_finish(r, q, KVR_ERR_CANCELED, KVRAIL__FINISH_REASON__FINISH_CANCELED, true, now,
                      "client disconnected");
    }
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
                    kvr_proto_method_label(method));
        return;
    }
    /* never kvrail.Status cast to the method's type: an ERROR-flagged
     * request is refused (clients send no errors) */
    kvr_status_t st = kvr_proto_decode_request(f, NULL, &m, err, sizeof(err));
    if (st != KVR_OK) {
        r->st.bad_frames++;
        bad_request(r, f, st, "%s", err);
        return;
    }
    switch (method) {
    case KVRAIL__METHOD__GENERATE:
        on_generate(r, f, (Kvrail__GenerateRequest *)m, now, t0, c0);
        break;
    case KVRAIL__METHOD__CANCEL:
        on_cancel(r, f, (Kvrail__CancelRequest *)m, now);
        break;
    case KVRAIL__METHOD__STATUS:
        rt_status_reply(r, f, now);
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
