/*
 * generate.c - runs an OpenAI completion request on the router and writes
 * its answer, whole (JSON) or as Server-Sent Events.
 *
 * A request of P prompts and n choices is P * n streams on one router client
 * borrowed from the pool (choice i*n + j is prompt i's j-th sample; with a
 * seed, sample j uses seed + j).  Tokens are gathered per choice.  Stop
 * strings go to the router, which ends the stream when it sees one in the
 * text, and the frontend cuts the text at the first occurrence (the stop
 * text and anything after it are not returned, as OpenAI does).  While
 * streaming, the end of the text that could still become a stop string is
 * held back until it cannot.  The first event of every stream is awaited
 * before any byte is sent, so errors the router finds in a request (prompt
 * too long, overload) get their own HTTP status, not a 200 stream.
 *
 * Nothing here waits: the streams live on the event loop's router client
 * (http.c), which hands each stream that has frames to fe_run_on_stream();
 * that takes them and wakes the request's connection (resume) when there
 * is something for it: every choice's first event, a token to stream, or
 * the end.  A peer that left cancels every stream at once (fe_run_cancel:
 * the router cancels both halves); fe_run_tick enforces the deadline and
 * gives up on a router that sends nothing at all.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "frontend.h"

/* ---- the router client pool ---- */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static kvr_client_t **pool;
static size_t pool_n, pool_cap;
static void *zctx; /* one ZeroMQ context (one I/O thread) for every client */
static atomic_uint_fast64_t router_seen_ns; /* a client last had an answer (ping, request) */

kvr_client_t *fe_client_get(char *err, size_t err_len)
{
    pthread_mutex_lock(&pool_mu);
    kvr_client_t *c = pool_n ? pool[--pool_n] : NULL;
    if (!zctx) {
        zctx = zmq_ctx_new();
        /* one router client per connection at most, three sockets each (its
         * DEALER and the monitor's pair); ZeroMQ's default bound is 1023 */
        if (zctx)
            zmq_ctx_set(zctx, ZMQ_MAX_SOCKETS, (int)fe_cfg.max_connections * 5 / 4 * 3 + 64);
    }
    void *ctx = zctx;
    pthread_mutex_unlock(&pool_mu);
    if (c)
        return c;
    if (!ctx) {
        snprintf(err, err_len, "cannot create a ZeroMQ context: %s", zmq_strerror(zmq_errno()));
        KVR_LOG_ERROR(FE_COMP, "%s", err);
        return NULL;
    }
    kvr_status_t st = kvr_client_connect_ctx(ctx, fe_cfg.router, &c);
    if (st != KVR_OK) {
        snprintf(err, err_len, "cannot create a client of the router at %s: %s", fe_cfg.router,
                 kvr_status_str(st));
        KVR_LOG_ERROR(FE_COMP, "%s", err);
        return NULL;
    }
    /* a new connection: make sure the router is there before a request waits on
     * it - unless a client had an answer from it in the last FE_ROUTER_FRESH_MS */
    uint64_t now = kvr_now_ns(), seen = atomic_load_explicit(&router_seen_ns, memory_order_relaxed);
    if (seen && now - seen < (uint64_t)FE_ROUTER_FRESH_MS * 1000000u)
        return c;
    st = kvr_client_ping(c, FE_PING_MS);
    if (st != KVR_OK) {
        snprintf(err, err_len, "the router at %s does not answer (no PING reply within %d ms)",
                 fe_cfg.router, FE_PING_MS);
        KVR_LOG_WARN(FE_COMP, "%s", err);
        kvr_client_close(c);
        return NULL;
    }
    atomic_store_explicit(&router_seen_ns, kvr_now_ns(), memory_order_relaxed);
    return c;
}

void fe_client_put(kvr_client_t *c, bool healthy)
{
    if (!c)
        return;
    pthread_mutex_lock(&pool_mu);
    if (healthy && pool_n < FE_POOL_IDLE_MAX && pool_n < fe_cfg.max_connections) {
        if (pool_n == pool_cap) {
            size_t cap = pool_cap ? 2 * pool_cap : 16;
            kvr_client_t **p = realloc(pool, cap * sizeof(*p));
            if (p) {
                pool = p;
                pool_cap = cap;
            }
        }
        if (pool_n < pool_cap) {
            pool[pool_n++] = c;
            c = NULL;
        }
    }
    pthread_mutex_unlock(&pool_mu);
    kvr_client_close(c);
}

void fe_client_pool_close(void)
{
    pthread_mutex_lock(&pool_mu);
    for (size_t i = 0; i < pool_n; i++)
        kvr_client_close(pool[i]);
    free(pool);
    pool = NULL;
    pool_n = pool_cap = 0;
    pthread_mutex_unlock(&pool_mu);
}

/* ---- one request ---- */
struct tokrec {
    uint32_t id;
    float logprob;
    size_t off, len; /* its text in the choice's text */
    size_t top_off;  /* its alternatives: choice.top[top_off .. + n_top) */
    uint32_t n_top;
};

struct topent {
    uint32_t id;
    float logprob;
};

struct choice {
    struct fe_run *run;
    kvr_gen_stream_t *s;
    bool ended;   /* the router's stream is over (res valid) */
    bool stopped; /* the frontend found a stop string (text cut there) */
    bool first;   /* a token or the end has been seen */
    bool final_sent;
    bool role_sent; /* chat: the first delta (with the role) is out */
    enum kvr_finish finish;
    struct kvr_gen_result res;
    struct fe_buf text;
    size_t emitted; /* bytes of text already streamed */
    struct tokrec *toks;
    size_t n_toks, cap_toks, toks_emitted;
    struct topent *top; /* the tokens' alternatives (top-N logprobs) */
    size_t n_top, cap_top;
};

struct fe_run {
    struct fe_req *req;
    kvr_client_t *client; /* the event loop's: not this run's to close */
    fe_wake_fn wake;
    void *wake_arg;
    bool want_tokens; /* streaming: wake on every token, not only the first and the end */
    uint64_t t_rx;    /* the oldest frame taken and not yet streamed (0: none) */
    kvr_status_t err; /* the run failed here (canceled, timeout, router silent) */
    unsigned err_http;
    char err_msg[512];
    struct choice *ch;
    size_t n_ch;
    uint64_t t0, t_sent, deadline;
    bool ttft_done, done_sent, usage_counted;
    uint64_t ttft_ns;   /* arrival -> first token here */
    size_t ttft_choice; /* the choice it came from */
    char id[40];
    long long created;
    size_t max_stop;
    /* streaming: every event's start, "data: {...,\"choices\":[{\"index\":",
     * built once at the run's first event instead of formatted per token */
    struct fe_buf sse_head;
};

static const char *finish_name(enum kvr_finish f)
{
    return f == KVR_FINISH_LENGTH ? "length" : "stop";
}

/* The earliest stop string in text[from..), or -1. */
static long find_stop(const struct fe_req *r, const struct fe_buf *t, size_t from)
{
    long best = -1;
    for (size_t i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        if (t->len < from + sl)
            continue;
        const char *p = memmem(t->p + from, t->len - from, r->stop[i], sl);
        if (p && (best < 0 || p - t->p < best))
            best = p - t->p;
    }
    return best;
}

/* Bytes at the end of text[emitted..) that are a proper prefix of a stop
 * string: they may still become one, so they are not streamed yet. */
static size_t holdback(const struct fe_req *r, const struct choice *c)
{
    size_t best = 0, avail = c->text.len - c->emitted;
    for (size_t i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        for (size_t k = sl - 1 < avail ? sl - 1 : avail; k > best; k--)
            if (!memcmp(c->text.p + c->text.len - k, r->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

static void absorb(struct fe_run *run, struct choice *c, const struct kvr_gen_token *t)
{
    c->first = true;
    if (!run->ttft_done) {
        run->ttft_done = true;
        run->ttft_ns = kvr_now_ns() - run->t0;
        run->ttft_choice = (size_t)(c - run->ch);
        fe_metrics_ttft(run->ttft_ns);
    }
    if (c->stopped)
        return; /* text after the stop: the stream is being canceled */
    if (c->n_toks == c->cap_toks) {
        size_t cap = c->cap_toks ? 2 * c->cap_toks : 64;
        struct tokrec *p = realloc(c->toks, cap * sizeof(*p));
        if (!p) {
            c->text.oom = true;
            return;
        }
        c->toks = p;
        c->cap_toks = cap;
    }
    size_t before = c->text.len;
    size_t ntop = t->n_top;
    if (c->n_top + ntop > c->cap_top) {
        size_t cap = c->cap_top ? 2 * c->cap_top : 256;
        while (cap < c->n_top + ntop)
            cap *= 2;
        struct topent *p = realloc(c->top, cap * sizeof(*p));
        if (!p) {
            c->text.oom = true;
            return;
        }
        c->top = p;
        c->cap_top = cap;
    }
    for (size_t i = 0; i < ntop; i++)
        c->top[c->n_top + i] = (struct topent){t->top_ids[i], t->top_logprobs[i]};
    c->toks[c->n_toks++] =
        (struct tokrec){t->token_id, t->logprob, before, t->text_len, c->n_top, (uint32_t)ntop};
    c->n_top += ntop;
    fe_buf_put(&c->text, t->text, t->text_len);
    if (t->finish != KVR_FINISH_NONE)
        c->finish = t->finish;
    if (run->req->n_stop && t->text_len) {
        size_t from = before >= run->max_stop ? before - run->max_stop + 1 : 0;
        long at = find_stop(run->req, &c->text, from);
        if (at >= 0) {
            c->text.len = (size_t)at;
            c->text.p[at] = 0;
            c->stopped = true;
            c->finish = KVR_FINISH_STOP;
            if (t->finish == KVR_FINISH_NONE)
                kvr_gen_stream_cancel(c->s); /* the router has not seen it: stop it here */
        }
    }
}

/* Takes every event queued for choice c.  Returns true if one came. */
static bool take_all(struct fe_run *run, struct choice *c)
{
    bool any = false;
    while (!c->ended) {
        struct kvr_gen_token t;
        kvr_status_t st = kvr_gen_stream_take(c->s, &t); /* what the loop's wait filed */
        if (st == KVR_OK) {
            absorb(run, c, &t);
            any = true;
            continue;
        }
        if (st == KVR_ERR_CLOSED) {
            c->ended = true;
            c->first = true;
            c->res = *kvr_gen_stream_result(c->s);
            if (c->stopped && c->res.status == KVR_ERR_CANCELED)
                c->res.status = KVR_OK; /* canceled by us at the stop string */
            if (!c->finish)
                c->finish =
                    c->res.finish == KVR_FINISH_LENGTH ? KVR_FINISH_LENGTH : KVR_FINISH_STOP;
            any = true;
        }
        break;
    }
    return any;
}

static bool all_first(const struct fe_run *run)
{
    for (size_t i = 0; i < run->n_ch; i++)
        if (!run->ch[i].first)
            return false;
    return true;
}

static bool all_ended(const struct fe_run *run)
{
    for (size_t i = 0; i < run->n_ch; i++)
        if (!run->ch[i].ended)
            return false;
    return true;
}

/* The first choice that ended with an error, or NULL. */
static const struct choice *failed(const struct fe_run *run)
{
    for (size_t i = 0; i < run->n_ch; i++)
        if (run->ch[i].ended && run->ch[i].res.status != KVR_OK)
            return &run->ch[i];
    return NULL;
}

static void error_of(const struct choice *c, unsigned *http_status_p, char *msg, size_t msg_len)
{
    *http_status_p = fe_http_status(c->res.status);
    snprintf(msg, msg_len, "%s (router status %s)", c->res.message[0] ? c->res.message : "error",
             kvr_status_name(c->res.status));
}

kvr_status_t fe_run_start(struct fe_req *req, kvr_client_t *client, uint64_t t_arrival,
                          fe_wake_fn wake, void *wake_arg, struct fe_run **run_p,
                          unsigned *http_status_p, char *msg, size_t msg_len)
{
    struct fe_run *run = calloc(1, sizeof(*run));
    size_t n = req->n_prompts * req->n;
    if (!run || !(run->ch = calloc(n, sizeof(*run->ch)))) {
        free(run);
        *http_status_p = 500;
        snprintf(msg, msg_len, "out of memory");
        return KVR_ERR_NO_MEMORY;
    }
    run->req = req;
    run->client = client;
    run->wake = wake;
    run->wake_arg = wake_arg;
    run->n_ch = n;
    run->t0 = t_arrival;
    run->t_sent = kvr_now_ns();
    run->deadline = run->t0 + (uint64_t)fe_cfg.request_timeout_ms * 1000000u;
    run->created = (long long)time(NULL);
    static atomic_uint_fast64_t seq;
    static unsigned pid; /* asked of the kernel once: a system call less per request */
    if (!pid)
        pid = (unsigned)getpid();
    uint64_t n_id = atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed);
    snprintf(run->id, sizeof(run->id), "cmpl-%08x%08" PRIx64, pid, n_id);
    for (size_t i = 0; i < req->n_stop; i++)
        if (strlen(req->stop[i]) > run->max_stop)
            run->max_stop = strlen(req->stop[i]);
    for (size_t i = 0; i < n; i++) {
        const struct fe_prompt *pr = &req->prompts[i / req->n];
        struct kvr_gen_params p;
        kvr_gen_params_default(&p);
        p.prompt = pr->text;
        p.token_ids = pr->ids;
        p.n_token_ids = pr->n_ids;
        p.max_tokens = req->max_tokens;
        p.temperature = req->temperature;
        p.top_p = req->top_p;
        p.top_k = req->top_k;
        p.repetition_penalty = req->repetition_penalty;
        p.min_p = req->min_p;
        p.presence_penalty = req->presence_penalty;
        p.frequency_penalty = req->frequency_penalty;
        p.logit_bias = req->logit_bias;
        p.n_logit_bias = req->n_logit_bias;
        p.top_logprobs = req->logprobs > 0 ? (uint32_t)req->logprobs : 0;
        p.has_seed = req->has_seed;
        p.seed = req->seed + i % req->n;
        p.stop = req->stop;
        p.n_stop = req->n_stop;
        p.stop_token_ids = req->stop_token_ids;
        p.n_stop_token_ids = req->n_stop_token_ids;
        p.ignore_eos = req->ignore_eos;
        run->ch[i].run = run;
        kvr_status_t st = kvr_client_generate_start(client, &p, &run->ch[i].s);
        if (st != KVR_OK) {
            *http_status_p = st == KVR_ERR_NO_RESOURCE ? 503 : 500;
            snprintf(msg, msg_len, "cannot send the request to the router: %s",
                     kvr_client_error(client));
            fe_run_free(run);
            return st;
        }
        kvr_gen_stream_set_user(run->ch[i].s, &run->ch[i]);
    }
    *run_p = run;
    return KVR_OK;
}

void fe_run_on_stream(kvr_gen_stream_t *s)
{
    struct choice *c = kvr_gen_stream_user(s);
    if (!c)
        return;
    struct fe_run *run = c->run;
    bool was_first = all_first(run);
    bool any = take_all(run, c);
    if (!any || run->err)
        return;
    if (!run->t_rx)
        run->t_rx = kvr_now_ns();
    if (run->want_tokens || c->ended || (!was_first && all_first(run)))
        run->wake(run->wake_arg);
}

void fe_run_set_streaming(struct fe_run *run)
{
    run->want_tokens = true;
}

static void fail(struct fe_run *run, kvr_status_t st, unsigned http, const char *msg)
{
    if (run->err)
        return;
    run->err = st;
    run->err_http = http;
    snprintf(run->err_msg, sizeof(run->err_msg), "%s", msg);
    for (size_t i = 0; i < run->n_ch; i++)
        if (!run->ch[i].ended)
            kvr_gen_stream_cancel(run->ch[i].s); /* the router cancels both halves */
}

void fe_run_cancel(struct fe_run *run)
{
    fail(run, KVR_ERR_CANCELED, 499, "the client closed the connection");
}

bool fe_run_tick(struct fe_run *run, uint64_t now)
{
    if (run->err || all_ended(run))
        return false;
    if (now > run->deadline) {
        fail(run, KVR_ERR_TIMEOUT, 504,
             all_first(run) ? "the request did not finish within the request timeout "
                              "(--request-timeout-ms)"
                            : "no first token within the request timeout (--request-timeout-ms)");
        return true;
    }
    /* nothing at all from the router since the request went out (and a PING
     * was sent then, when it had been quiet): it does not answer */
    if (!all_first(run) && now > run->t_sent &&
        now - run->t_sent > (uint64_t)FE_PING_MS * 1000000u &&
        kvr_client_last_rx_ns(run->client) < run->t_sent) {
        char m[sizeof(run->err_msg)];
        /* the direct link knows why it is not up; libzmq's does not say */
        const char *why = fe_cfg.router_zmq ? "" : kvr_client_error(run->client);
        snprintf(m, sizeof(m),
                 "the router at %s does not answer (nothing from it within %d ms)%s%s",
                 fe_cfg.router, FE_PING_MS, why[0] ? ": " : "", why);
        fail(run, KVR_ERR_PEER_FAILURE, 503, m);
        return true;
    }
    return false;
}

kvr_status_t fe_run_first(struct fe_run *run, unsigned *http_status_p, char *msg, size_t msg_len)
{
    if (run->err) {
        *http_status_p = run->err_http;
        snprintf(msg, msg_len, "%s", run->err_msg);
        return run->err;
    }
    if (!all_first(run))
        return KVR_INPROGRESS;
    const struct choice *bad = failed(run);
    if (bad) {
        error_of(bad, http_status_p, msg, msg_len);
        return bad->res.status != KVR_OK ? bad->res.status : KVR_ERR_INTERNAL;
    }
    return KVR_OK;
}

static void put_bytes(struct fe_buf *b, const char *p, size_t len)
{
    fe_buf_puts(b, ",\"bytes\":[");
    for (size_t k = 0; k < len; k++)
        fe_buf_printf(b, "%s%u", k ? "," : "", (unsigned char)p[k]);
    fe_buf_puts(b, "]");
}

/* The chat form: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]};
 * top_logprobs lists the N most likely tokens at the position, best first. */
static void put_chat_logprobs(struct fe_buf *b, struct choice *c, size_t from, size_t to)
{
    fe_buf_puts(b, "{\"content\":[");
    for (size_t i = from; i < to; i++) {
        const struct tokrec *t = &c->toks[i];
        size_t len = t->off + t->len > c->text.len ? c->text.len - t->off : t->len;
        fe_buf_puts(b, i > from ? ",{\"token\":" : "{\"token\":");
        fe_buf_json_str(b, c->text.p + t->off, len);
        fe_buf_puts(b, ",\"logprob\":");
        fe_buf_json_num(b, t->logprob);
        put_bytes(b, c->text.p + t->off, len);
        fe_buf_puts(b, ",\"top_logprobs\":[");
        for (uint32_t k = 0; k < t->n_top; k++) {
            const struct topent *e = &c->top[t->top_off + k];
            char *text = NULL;
            size_t tl = 0;
            if (fe_token_text(e->id, &text, &tl) != KVR_OK)
                tl = 0;
            fe_buf_puts(b, k ? ",{\"token\":" : "{\"token\":");
            fe_buf_json_str(b, text ? text : "", tl);
            fe_buf_puts(b, ",\"logprob\":");
            fe_buf_json_num(b, e->logprob);
            put_bytes(b, text ? text : "", tl);
            fe_buf_puts(b, "}");
            free(text);
        }
        fe_buf_puts(b, "]}");
    }
    fe_buf_puts(b, "]}");
}

/* The completions form of one token's alternatives: {"text": logprob, ...},
 * the N most likely and the sampled token (vLLM's completions shape), best
 * first.  Two ids whose texts are equal (e.g. halves of one UTF-8
 * character, both U+FFFD alone) would give a duplicate key, which JSON
 * parsers resolve to the last: only the first (the more likely) is kept. */
static void put_top_dict(struct fe_buf *b, const struct choice *c, const struct tokrec *t)
{
    char *texts[FE_MAX_TOP_LOGPROBS + 1];
    size_t lens[FE_MAX_TOP_LOGPROBS + 1];
    uint32_t ids[FE_MAX_TOP_LOGPROBS + 1];
    float lps[FE_MAX_TOP_LOGPROBS + 1];
    size_t n = 0;
    bool sampled_in = false;
    for (uint32_t k = 0; k < t->n_top && n < FE_MAX_TOP_LOGPROBS; k++) {
        const struct topent *e = &c->top[t->top_off + k];
        sampled_in |= e->id == t->id;
        ids[n] = e->id;
        lps[n++] = e->logprob;
    }
    if (!sampled_in) {
        ids[n] = t->id;
        lps[n++] = t->logprob;
    }
    fe_buf_puts(b, "{");
    bool any = false;
    for (size_t k = 0; k < n; k++) {
        texts[k] = NULL;
        if (fe_token_text(ids[k], &texts[k], &lens[k]) != KVR_OK || !texts[k])
            lens[k] = 0;
        bool dup = false;
        for (size_t j = 0; j < k && !dup; j++)
            dup = lens[j] == lens[k] && (!lens[k] || !memcmp(texts[j], texts[k], lens[k]));
        if (dup)
            continue;
        if (any)
            fe_buf_puts(b, ",");
        any = true;
        fe_buf_json_str(b, texts[k] ? texts[k] : "", lens[k]);
        fe_buf_puts(b, ":");
        fe_buf_json_num(b, lps[k]);
    }
    for (size_t k = 0; k < n; k++)
        free(texts[k]);
    fe_buf_puts(b, "}");
}

static void put_logprobs(struct fe_buf *b, bool chat, bool top, struct choice *c, size_t upto,
                         bool final)
{
    /* the tokens whose text starts before upto (all that remain when final) */
    size_t from = c->toks_emitted, to = from;
    while (to < c->n_toks &&
           (c->toks[to].off < upto || (final && !c->stopped && c->toks[to].off <= upto)))
        to++;
    c->toks_emitted = to;
    if (chat) {
        put_chat_logprobs(b, c, from, to);
        return;
    }
    fe_buf_puts(b, "{\"tokens\":[");
    for (size_t i = from; i < to; i++) {
        const struct tokrec *t = &c->toks[i];
        size_t len = t->off + t->len > c->text.len ? c->text.len - t->off : t->len;
        if (i > from)
            fe_buf_puts(b, ",");
        fe_buf_json_str(b, c->text.p + t->off, len);
    }
    fe_buf_puts(b, "],\"token_logprobs\":[");
    for (size_t i = from; i < to; i++) {
        if (i > from)
            fe_buf_puts(b, ",");
        fe_buf_json_num(b, c->toks[i].logprob);
    }
    if (top) { /* logprobs N > 0 */
        fe_buf_puts(b, "],\"top_logprobs\":[");
        for (size_t i = from; i < to; i++) {
            if (i > from)
                fe_buf_puts(b, ",");
            put_top_dict(b, c, &c->toks[i]);
        }
        fe_buf_puts(b, "],\"text_offset\":[");
    } else {
        fe_buf_puts(b, "],\"top_logprobs\":null,\"text_offset\":[");
    }
    for (size_t i = from; i < to; i++)
        fe_buf_printf(b, "%s%zu", i > from ? "," : "", c->toks[i].off);
    fe_buf_puts(b, "]}");
}

static void put_usage(struct fe_buf *b, struct fe_run *run)
{
    uint64_t prompt = 0, completion = 0, cached = 0;
    for (size_t i = 0; i < run->n_ch; i++) {
        const struct choice *c = &run->ch[i];
        completion += c->res.completion_tokens;
        if (i % run->req->n == 0) { /* a prompt counts once, not once per sample */
            prompt += c->res.prompt_tokens;
            cached += c->res.cached_tokens;
        }
    }
    if (!run->usage_counted) {
        run->usage_counted = true;
        fe_metrics_tokens(prompt, completion);
        uint64_t router_ns = run->ch[run->ttft_choice].res.ttft_us * 1000u;
        if (run->ttft_done && router_ns && router_ns < run->ttft_ns)
            fe_metrics_added_ttft(run->ttft_ns - router_ns);
    }
    fe_buf_printf(b,
                  "\"usage\":{\"prompt_tokens\":%" PRIu64 ",\"completion_tokens\":%" PRIu64
                  ",\"total_tokens\":%" PRIu64
                  ",\"prompt_tokens_details\":{\"cached_tokens\":%" PRIu64 "}}",
                  prompt, completion, prompt + completion, cached);
}

static void put_head(struct fe_buf *b, const struct fe_run *run, bool chunk)
{
    const char *object = !run->req->chat ? "text_completion"
                         : chunk         ? "chat.completion.chunk"
                                         : "chat.completion";
    fe_buf_printf(b, "{\"id\":\"%s%s\",\"object\":\"%s\",\"created\":%lld,\"model\":",
                  run->req->chat ? "chat" : "", run->id, object, run->created);
    fe_buf_json_str(b, fe_cfg.model_name, strlen(fe_cfg.model_name));
}

kvr_status_t fe_run_finish_json(struct fe_run *run, struct fe_buf *out, unsigned *http_status_p,
                                char *msg, size_t msg_len)
{
    if (run->err) {
        *http_status_p = run->err_http;
        snprintf(msg, msg_len, "%s", run->err_msg);
        return run->err;
    }
    if (!all_ended(run))
        return KVR_INPROGRESS;
    const struct choice *bad = failed(run);
    if (bad) {
        error_of(bad, http_status_p, msg, msg_len);
        return bad->res.status;
    }
    bool chat = run->req->chat;
    put_head(out, run, false);
    fe_buf_puts(out, ",\"choices\":[");
    for (size_t i = 0; i < run->n_ch; i++) {
        struct choice *c = &run->ch[i];
        fe_buf_printf(out, "%s{\"index\":%zu,%s", i ? "," : "", i,
                      chat ? "\"message\":{\"role\":\"assistant\",\"content\":" : "\"text\":");
        fe_buf_json_str(out, c->text.p ? c->text.p : "", c->text.len);
        fe_buf_puts(out, chat ? "},\"logprobs\":" : ",\"logprobs\":");
        if (run->req->logprobs >= 0)
            put_logprobs(out, chat, run->req->logprobs > 0, c, c->text.len, true);
        else
            fe_buf_puts(out, "null");
        fe_buf_printf(out, ",\"finish_reason\":\"%s\"}", finish_name(c->finish));
        if (c->text.oom)
            out->oom = true;
    }
    fe_buf_puts(out, "],");
    put_usage(out, run);
    fe_buf_puts(out, "}");
    if (out->oom) {
        *http_status_p = 500;
        snprintf(msg, msg_len, "out of memory building the response");
        return KVR_ERR_NO_MEMORY;
    }
    return KVR_OK;
}

/* Appends ",<i>," -- a choice's index in an event, without printf (per token). */
static void put_index(struct fe_buf *b, size_t i)
{
    char d[24];
    size_t n = sizeof(d);
    d[--n] = ',';
    do
        d[--n] = (char)('0' + i % 10);
    while ((i /= 10) && n > 0);
    fe_buf_put(b, d + n, sizeof(d) - n);
}

/* Streams what choice i may send now: its text up to the hold-back, and its
 * finish once its text is all out. */
static void sse_choice(struct fe_run *run, size_t i, struct fe_buf *out)
{
    struct choice *c = &run->ch[i];
    if (c->final_sent)
        return;
    bool over = c->ended || c->stopped;
    size_t upto = over ? c->text.len : c->text.len - holdback(run->req, c);
    bool has_tok = c->toks_emitted < c->n_toks && c->toks[c->toks_emitted].off < upto;
    if (upto <= c->emitted && !over && !(run->req->logprobs >= 0 && has_tok))
        return;
    bool chat = run->req->chat;
    if (!run->sse_head.len) {
        fe_buf_puts(&run->sse_head, "data: ");
        put_head(&run->sse_head, run, true);
        fe_buf_puts(&run->sse_head, ",\"choices\":[{\"index\":");
        if (run->sse_head.oom)
            out->oom = true;
    }
    fe_buf_put(out, run->sse_head.p, run->sse_head.len);
    put_index(out, i);
    if (chat)
        fe_buf_puts(out, c->role_sent ? "\"delta\":{\"content\":"
                                      : "\"delta\":{\"role\":\"assistant\",\"content\":");
    else
        fe_buf_puts(out, "\"text\":");
    c->role_sent = true;
    fe_buf_json_str(out, c->text.p ? c->text.p + c->emitted : "", upto - c->emitted);
    fe_buf_puts(out, chat ? "},\"logprobs\":" : ",\"logprobs\":");
    if (run->req->logprobs >= 0)
        put_logprobs(out, chat, run->req->logprobs > 0, c, upto, over);
    else
        fe_buf_puts(out, "null");
    c->emitted = upto;
    if (over) {
        fe_buf_puts(out, c->finish == KVR_FINISH_LENGTH ? ",\"finish_reason\":\"length\"}]}\n\n"
                                                        : ",\"finish_reason\":\"stop\"}]}\n\n");
        c->final_sent = true;
    } else {
        fe_buf_puts(out, ",\"finish_reason\":null}]}\n\n");
    }
}

kvr_status_t fe_run_next_sse(struct fe_run *run, struct fe_buf *out)
{
    if (run->done_sent)
        return KVR_ERR_CLOSED;
    if (run->err == KVR_ERR_CANCELED)
        return KVR_ERR_CANCELED;
    const struct choice *bad = failed(run);
    if (bad || run->err) { /* the router's error, or this run's (timeout, router silent) */
        unsigned hs = run->err_http;
        char m[700];
        if (run->err)
            snprintf(m, sizeof(m), "%s", run->err_msg);
        else
            error_of(bad, &hs, m, sizeof(m));
        fe_buf_puts(out, "data: ");
        fe_error_json(out, hs, "", m);
        fe_buf_puts(out, "\n\ndata: [DONE]\n\n");
        run->done_sent = true;
        return KVR_ERR_CLOSED;
    }
    size_t before = out->len;
    for (size_t i = 0; i < run->n_ch; i++)
        sse_choice(run, i, out);
    if (all_ended(run)) {
        if (run->req->include_usage) {
            fe_buf_puts(out, "data: ");
            put_head(out, run, true);
            fe_buf_puts(out, ",\"choices\":[],");
            put_usage(out, run);
            fe_buf_puts(out, "}\n\n");
        } else {
            struct fe_buf dummy = {0};
            put_usage(&dummy, run); /* counts the tokens */
            fe_buf_free(&dummy);
        }
        if (run->t_rx)
            fe_metrics_to_client(kvr_now_ns() - run->t_rx);
        fe_buf_puts(out, "data: [DONE]\n\n");
        run->done_sent = true;
        return KVR_ERR_CLOSED;
    }
    if (out->len == before)
        return KVR_INPROGRESS;
    if (run->t_rx) /* the frames these events carry: their time in the loop */
        fe_metrics_to_client(kvr_now_ns() - run->t_rx);
    run->t_rx = 0;
    return KVR_OK;
}

void fe_run_free(struct fe_run *run)
{
    if (!run)
        return;
    for (size_t i = 0; i < run->n_ch; i++) {
        struct choice *c = &run->ch[i];
        kvr_gen_stream_destroy(c->s); /* cancels it if it has not ended */
        fe_buf_free(&c->text);
        free(c->toks);
        free(c->top);
    }
    fe_buf_free(&run->sse_head);
    free(run->ch);
    free(run);
}
