/*
 * metrics.c - the frontend's own Prometheus metrics, served at GET /metrics
 * in the text exposition format (version 0.0.4).
 *
 * Every metric is a fixed array of relaxed atomics (no lock, no allocation
 * on the request path): requests by endpoint and status class, in-flight
 * requests, connections (open, rejected past the bound), malformed HTTP,
 * prompt and generated tokens, and three histograms with fixed buckets:
 * time to first token and end-to-end latency of generation requests (the
 * names vLLM uses, under the kvrail: prefix) and the duration of every
 * request by endpoint.
 */
#include <stdatomic.h>
#include <string.h>

#include "frontend.h"

static const char *const ep_names[FE_EP_COUNT] = {
    [FE_EP_COMPLETIONS] = "/v1/completions",
    [FE_EP_CHAT] = "/v1/chat/completions",
    [FE_EP_MODELS] = "/v1/models",
    [FE_EP_HEALTH] = "/health",
    [FE_EP_READY] = "/ready",
    [FE_EP_METRICS] = "/metrics",
    [FE_EP_OTHER] = "other",
};

/* the statuses the frontend answers; anything else is counted as "other" */
static const unsigned codes[] = {200, 400, 404, 405, 413, 415, 429, 499, 500, 501, 503, 504};
#define N_CODES (sizeof(codes) / sizeof(codes[0]) + 1)

static const double buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                 0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
#define N_BUCKETS (sizeof(buckets) / sizeof(buckets[0]))

struct hist {
    atomic_uint_fast64_t count[N_BUCKETS + 1]; /* per bucket (not cumulative); last = +Inf */
    atomic_uint_fast64_t sum_ns;
};

/* the frontend's own share of TTFT: microseconds, so its own buckets */
static const double fine[] = {0.00005, 0.0001, 0.0002, 0.0005, 0.001,
                              0.002,   0.005,  0.01,   0.02,   0.05};
#define N_FINE (sizeof(fine) / sizeof(fine[0]))
struct fine_hist {
    atomic_uint_fast64_t count[N_FINE + 1], sum_ns;
};
static struct fine_hist added, to_router, to_client;

static atomic_uint_fast64_t requests[FE_EP_COUNT][N_CODES];
static struct hist duration[FE_EP_COUNT];
static struct hist ttft, e2e;
static atomic_int_fast64_t inflight, connections, connections_max;
static atomic_uint_fast64_t rejected, bad_http, prompt_tokens, gen_tokens;

const char *fe_endpoint_name(enum fe_endpoint ep)
{
    return ep < FE_EP_COUNT ? ep_names[ep] : "other";
}

static void render_fine(struct fe_buf *b, const char *name, const char *base, struct fine_hist *h)
{
    uint64_t cum = 0;
    for (size_t i = 0; i <= N_FINE; i++) {
        cum += atomic_load_explicit(&h->count[i], memory_order_relaxed);
        if (i < N_FINE)
            fe_buf_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, base, fine[i],
                          (unsigned long long)cum);
        else
            fe_buf_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, base,
                          (unsigned long long)cum);
    }
    fe_buf_printf(b, "%s_sum{%s} %.9f\n", name, base,
                  (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9);
    fe_buf_printf(b, "%s_count{%s} %llu\n", name, base, (unsigned long long)cum);
}

static void observe(struct hist *h, uint64_t ns)
{
    double s = (double)ns / 1e9;
    size_t i = 0;
    while (i < N_BUCKETS && s > buckets[i])
        i++;
    atomic_fetch_add_explicit(&h->count[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void fe_metrics_request_done(enum fe_endpoint ep, unsigned status, uint64_t latency_ns)
{
    if (ep >= FE_EP_COUNT)
        ep = FE_EP_OTHER;
    size_t c = N_CODES - 1;
    for (size_t i = 0; i < N_CODES - 1; i++)
        if (codes[i] == status)
            c = i;
    atomic_fetch_add_explicit(&requests[ep][c], 1, memory_order_relaxed);
    observe(&duration[ep], latency_ns);
    if ((ep == FE_EP_COMPLETIONS || ep == FE_EP_CHAT) && status == 200)
        observe(&e2e, latency_ns);
}

void fe_metrics_ttft(uint64_t ns)
{
    observe(&ttft, ns);
}

static void observe_fine(struct fine_hist *h, uint64_t ns)
{
    double s = (double)ns / 1e9;
    size_t i = 0;
    while (i < N_FINE && s > fine[i])
        i++;
    atomic_fetch_add_explicit(&h->count[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void fe_metrics_added_ttft(uint64_t ns)
{
    observe_fine(&added, ns);
}

void fe_metrics_to_router(uint64_t ns)
{
    observe_fine(&to_router, ns);
}

void fe_metrics_to_client(uint64_t ns)
{
    observe_fine(&to_client, ns);
}

void fe_metrics_tokens(uint64_t prompt, uint64_t completion)
{
    atomic_fetch_add_explicit(&prompt_tokens, prompt, memory_order_relaxed);
    atomic_fetch_add_explicit(&gen_tokens, completion, memory_order_relaxed);
}

void fe_metrics_inflight(int delta)
{
    atomic_fetch_add_explicit(&inflight, delta, memory_order_relaxed);
}

void fe_metrics_connection(int delta, bool was_rejected)
{
    int_fast64_t now = atomic_fetch_add_explicit(&connections, delta, memory_order_relaxed) + delta;
    int_fast64_t peak = atomic_load_explicit(&connections_max, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&connections_max, &peak, now,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
    if (was_rejected)
        atomic_fetch_add_explicit(&rejected, 1, memory_order_relaxed);
}

void fe_metrics_bad_http(void)
{
    atomic_fetch_add_explicit(&bad_http, 1, memory_order_relaxed);
}

static uint64_t ld(atomic_uint_fast64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

static void render_hist(struct fe_buf *b, const char *name, const char *labels, struct hist *h)
{
    uint64_t cum = 0;
    for (size_t i = 0; i <= N_BUCKETS; i++) {
        cum += ld(&h->count[i]);
        if (i < N_BUCKETS)
            fe_buf_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, buckets[i],
                          (unsigned long long)cum);
        else
            fe_buf_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, labels,
                          (unsigned long long)cum);
    }
    fe_buf_printf(b, "%s_sum{%s} %.9f\n", name, labels, (double)ld(&h->sum_ns) / 1e9);
    fe_buf_printf(b, "%s_count{%s} %llu\n", name, labels, (unsigned long long)cum);
}

void fe_metrics_render(struct fe_buf *b)
{
    char model[300];
    kvr_json_escape(model, sizeof(model), fe_cfg.model_name, strlen(fe_cfg.model_name));
    char base[400]; /* model is a JSON string literal, which is also a valid label value */
    snprintf(base, sizeof(base), "role=\"frontend\",model=%s", model);

    fe_buf_puts(b, "# HELP kvrail_frontend_requests_total HTTP requests answered, by endpoint "
                   "and status.\n# TYPE kvrail_frontend_requests_total counter\n");
    for (size_t e = 0; e < FE_EP_COUNT; e++)
        for (size_t c = 0; c < N_CODES; c++) {
            uint64_t v = ld(&requests[e][c]);
            if (!v && c != 0)
                continue;
            char code[16];
            if (c < N_CODES - 1)
                snprintf(code, sizeof(code), "%u", codes[c]);
            else
                snprintf(code, sizeof(code), "other");
            fe_buf_printf(b,
                          "kvrail_frontend_requests_total{%s,endpoint=\"%s\",status=\"%s\"} %llu\n",
                          base, ep_names[e], code, (unsigned long long)v);
        }
    fe_buf_printf(b,
                  "# HELP kvrail_frontend_requests_in_flight Requests being answered now.\n"
                  "# TYPE kvrail_frontend_requests_in_flight gauge\n"
                  "kvrail_frontend_requests_in_flight{%s} %lld\n",
                  base, (long long)atomic_load(&inflight));
    fe_buf_printf(b,
                  "# HELP kvrail_frontend_connections Open HTTP connections.\n"
                  "# TYPE kvrail_frontend_connections gauge\n"
                  "kvrail_frontend_connections{%s} %lld\n"
                  "# HELP kvrail_frontend_connections_max Most HTTP connections open at once "
                  "since start.\n"
                  "# TYPE kvrail_frontend_connections_max gauge\n"
                  "kvrail_frontend_connections_max{%s} %lld\n"
                  "# HELP kvrail_frontend_connections_rejected_total Connections answered 503 "
                  "past the connection bound.\n"
                  "# TYPE kvrail_frontend_connections_rejected_total counter\n"
                  "kvrail_frontend_connections_rejected_total{%s} %llu\n"
                  "# HELP kvrail_frontend_bad_http_total Requests refused as malformed (body, "
                  "JSON, headers).\n"
                  "# TYPE kvrail_frontend_bad_http_total counter\n"
                  "kvrail_frontend_bad_http_total{%s} %llu\n",
                  base, (long long)atomic_load(&connections), base,
                  (long long)atomic_load(&connections_max), base, (unsigned long long)ld(&rejected),
                  base, (unsigned long long)ld(&bad_http));
    fe_buf_printf(b,
                  "# HELP kvrail:prompt_tokens_total Prompt tokens of answered requests.\n"
                  "# TYPE kvrail:prompt_tokens_total counter\n"
                  "kvrail:prompt_tokens_total{%s} %llu\n"
                  "# HELP kvrail:generation_tokens_total Tokens generated for answered requests.\n"
                  "# TYPE kvrail:generation_tokens_total counter\n"
                  "kvrail:generation_tokens_total{%s} %llu\n",
                  base, (unsigned long long)ld(&prompt_tokens), base,
                  (unsigned long long)ld(&gen_tokens));
    fe_buf_puts(b, "# HELP kvrail:time_to_first_token_seconds Request received -> first token "
                   "ready to send, at the frontend.\n"
                   "# TYPE kvrail:time_to_first_token_seconds histogram\n");
    render_hist(b, "kvrail:time_to_first_token_seconds", base, &ttft);
    fe_buf_puts(b, "# HELP kvrail:e2e_request_latency_seconds Generation requests answered 200: "
                   "received -> last byte queued.\n"
                   "# TYPE kvrail:e2e_request_latency_seconds histogram\n");
    render_hist(b, "kvrail:e2e_request_latency_seconds", base, &e2e);
    fe_buf_puts(b, "# HELP kvrail_frontend_added_ttft_seconds The frontend's share of TTFT: its "
                   "TTFT minus the router's (HTTP and JSON parsing, the hops to and from the "
                   "router, the first event).\n"
                   "# TYPE kvrail_frontend_added_ttft_seconds histogram\n");
    render_fine(b, "kvrail_frontend_added_ttft_seconds", base, &added);
    fe_buf_puts(b, "# HELP kvrail_frontend_to_router_seconds A generation request's time in the "
                   "frontend before the router has it: body complete -> parsed, checked and "
                   "sent (ZeroMQ queue).\n"
                   "# TYPE kvrail_frontend_to_router_seconds histogram\n");
    render_fine(b, "kvrail_frontend_to_router_seconds", base, &to_router);
    fe_buf_puts(b, "# HELP kvrail_frontend_to_client_seconds A token's time in the frontend's "
                   "loop: its frame taken from the router client -> its SSE event handed to "
                   "the socket.\n"
                   "# TYPE kvrail_frontend_to_client_seconds histogram\n");
    render_fine(b, "kvrail_frontend_to_client_seconds", base, &to_client);
    fe_buf_puts(b, "# HELP kvrail_frontend_request_duration_seconds Every HTTP request, by "
                   "endpoint.\n"
                   "# TYPE kvrail_frontend_request_duration_seconds histogram\n");
    for (size_t e = 0; e < FE_EP_COUNT; e++) {
        char l[512];
        snprintf(l, sizeof(l), "%s,endpoint=\"%s\"", base, ep_names[e]);
        render_hist(b, "kvrail_frontend_request_duration_seconds", l, &duration[e]);
    }
}
