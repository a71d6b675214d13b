/*
 * metrics.c - the frontend's own Prometheus metrics, served at GET /metrics
 * in the text exposition format (version 0.0.4).
 *
 * Every metric is a fixed array of relaxed atomics (no lock, no allocation
 * on the request path): requests by endpoint and status class, in-flight
 * requests, connections (open, rejected past the bound), malformed HTTP,
 * prompt and generated tokens, and histograms with fixed buckets: time to
 * first token and end-to-end latency of generation requests (the names vLLM
 * uses, under the kvrail: prefix), the duration of every request by
 * endpoint (coarse buckets, 1 ms ... 60 s), and the frontend's own share of
 * the latency (fine buckets, 50 us ... 50 ms).  One observe() and one
 * render_hist() serve every histogram, given its bucket bounds.
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

/* A histogram's bucket bounds, in seconds: coarse for request latencies,
 * fine for the frontend's own share (microseconds). */
struct bounds {
    const double *le;
    size_t n;
};
static const double coarse_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                   0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
static const double fine_le[] = {0.00005, 0.0001, 0.0002, 0.0005, 0.001,
                                 0.002,   0.005,  0.01,   0.02,   0.05};
#define N_LE(a) (sizeof(a) / sizeof((a)[0]))
static const struct bounds coarse = {coarse_le, N_LE(coarse_le)};
static const struct bounds fine = {fine_le, N_LE(fine_le)};
#define MAX_LE N_LE(coarse_le)
_Static_assert(N_LE(fine_le) <= MAX_LE, "a histogram holds at most MAX_LE buckets");

struct hist {
    atomic_uint_fast64_t count[MAX_LE + 1]; /* per bucket (not cumulative); then +Inf */
    atomic_uint_fast64_t sum_ns;
};

static atomic_uint_fast64_t requests[FE_EP_COUNT][N_CODES];
static struct hist duration[FE_EP_COUNT];       /* coarse */
static struct hist ttft, e2e;                   /* coarse */
static struct hist added, to_router, to_client; /* fine */
static atomic_int_fast64_t inflight, connections, connections_max;
static atomic_uint_fast64_t rejected, bad_http, prompt_tokens, gen_tokens;

const char *fe_endpoint_name(enum fe_endpoint ep)
{
    return ep < FE_EP_COUNT ? ep_names[ep] : "other";
}

static void observe(struct hist *h, const struct bounds *bd, uint64_t ns)
{
    double s = (double)ns / 1e9;
    size_t i = 0;
    while (i < bd->n && s > bd->le[i])
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
    observe(&duration[ep], &coarse, latency_ns);
    if ((ep == FE_EP_COMPLETIONS || ep == FE_EP_CHAT) && status == 200)
        observe(&e2e, &coarse, latency_ns);
}

void fe_metrics_ttft(uint64_t ns)
{
    observe(&ttft, &coarse, ns);
}

void fe_metrics_added_ttft(uint64_t ns)
{
    observe(&added, &fine, ns);
}

void fe_metrics_to_router(uint64_t ns)
{
    observe(&to_router, &fine, ns);
}

void fe_metrics_to_client(uint64_t ns)
{
    observe(&to_client, &fine, ns);
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

/* One histogram in the text format: its HELP and TYPE lines when help is
 * given (once per family), then its cumulative buckets, sum and count. */
static void render_hist(struct fe_buf *b, const char *name, const char *help, const char *labels,
                        struct hist *h, const struct bounds *bd)
{
    if (help)
        fe_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i <= bd->n; i++) {
        cum += ld(&h->count[i]);
        if (i < bd->n)
            fe_buf_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, labels, bd->le[i],
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
    static const struct {
        const char *name, *help;
        struct hist *h;
        const struct bounds *bd;
    } hists[] = {
        {"kvrail:time_to_first_token_seconds",
         "Request received -> first token ready to send, at the frontend.", &ttft, &coarse},
        {"kvrail:e2e_request_latency_seconds",
         "Generation requests answered 200: received -> last byte queued.", &e2e, &coarse},
        {"kvrail_frontend_added_ttft_seconds",
         "The frontend's share of TTFT: its TTFT minus the router's (HTTP and JSON parsing, the "
         "hops to and from the router, the first event).",
         &added, &fine},
        {"kvrail_frontend_to_router_seconds",
         "A generation request's time in the frontend before the router has it: body complete "
         "-> parsed, checked and sent (ZeroMQ queue).",
         &to_router, &fine},
        {"kvrail_frontend_to_client_seconds",
         "A token's time in the frontend's loop: its frame taken from the router client -> its "
         "SSE event handed to the socket.",
         &to_client, &fine},
    };
    for (size_t i = 0; i < sizeof(hists) / sizeof(hists[0]); i++)
        render_hist(b, hists[i].name, hists[i].help, base, hists[i].h, hists[i].bd);
    for (size_t e = 0; e < FE_EP_COUNT; e++) {
        char l[512];
        snprintf(l, sizeof(l), "%s,endpoint=\"%s\"", base, ep_names[e]);
        render_hist(b, "kvrail_frontend_request_duration_seconds",
                    e == 0 ? "Every HTTP request, by endpoint." : NULL, l, &duration[e], &coarse);
    }
}
