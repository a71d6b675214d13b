/*
 * metrics.c - the router's Prometheus endpoint (rt_metrics.h).
 *
 * The histograms are observed when a request ends (rt_req_finish): time to
 * first token and end-to-end latency from the request's arrival at the
 * router, time per output token after the first.  The counters and gauges
 * are the router's own figures (rt.st, the request table, the node rows),
 * copied into the registry by the loop at most once a second; the router
 * wakes at least that often while nodes heartbeat, and a scrape sees
 * figures at most about a second old.
 */
#include "rt_metrics.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "kvr_metrics.h"
#include "kvr_metrics_http.h"

#define COMP "metrics"

/* a per-node row */
struct node_m {
    kvr_metric_t *alive, *hb_age, *total, *free, *kv_bytes, *kv_secs, *requests, *cached;
    kvr_metric_t *blamed, *cooldowns, *cooling;
};

static struct {
    kvr_metrics_t *reg;
    kvr_metrics_http_t *http;
    uint64_t last_ns;
    kvr_metric_t *ttft, *e2e, *tpot, *prompt_hist, *gen_hist;
    kvr_metric_t *requests, *completed, *failed, *canceled, *overloaded, *bad_frames, *bad_requests,
        *local, *disagg, *retries, *decode_faults, *disconnects, *resyncs, *dead, *migrations,
        *success_stop, *success_length, *cached, *prompt, *refused, *running, *waiting, *dir_blocks,
        *start, *cost;
    struct node_m nodes[RT_MAX_NODES];
} g;

static const double token_buckets[] = {1,   8,    16,   32,   64,   128,  256,
                                       512, 1024, 2048, 4096, 8192, 16384};

static kvr_metric_t *counter(const char *name, const char *help, const char *labels)
{
    return kvr_metrics_counter(g.reg, name, help, labels);
}

static kvr_metric_t *gauge(const char *name, const char *help, const char *labels)
{
    return kvr_metrics_gauge(g.reg, name, help, labels);
}

bool rt_metrics_start(rt_t *r)
{
    if (!r->self || !r->self->metrics_port)
        return true;
    const char *model = strrchr(r->cl->model_dir, '/');
    model = model && model[1] ? model + 1 : r->cl->model_dir;
    char base[KVR_METRICS_LABELS_MAX] = "";
    kvr_metrics_label(base, sizeof base, "node", r->self->name);
    kvr_metrics_label(base, sizeof base, "role", "router");
    kvr_metrics_label(base, sizeof base, "model", model);
    if (kvr_metrics_create(base, &g.reg) != KVR_OK)
        return false;
    const double *lb = kvr_metrics_latency_buckets;
    size_t nb = kvr_metrics_latency_n;
    g.ttft = kvr_metrics_get(g.reg, KVR_METRIC_HISTOGRAM, "kvrail:time_to_first_token_seconds",
                             "Time from a request's arrival at the router to its first token", NULL,
                             lb, nb);
    g.e2e = kvr_metrics_get(g.reg, KVR_METRIC_HISTOGRAM, "kvrail:e2e_request_latency_seconds",
                            "Time from a request's arrival at the router to its end", NULL, lb, nb);
    g.tpot =
        kvr_metrics_get(g.reg, KVR_METRIC_HISTOGRAM, "kvrail:request_time_per_output_token_seconds",
                        "Mean time per output token after the first, per request", NULL, lb, nb);
    size_t nt = sizeof token_buckets / sizeof token_buckets[0];
    g.prompt_hist = kvr_metrics_get(g.reg, KVR_METRIC_HISTOGRAM, "kvrail:request_prompt_tokens",
                                    "Prompt tokens per request", NULL, token_buckets, nt);
    g.gen_hist = kvr_metrics_get(g.reg, KVR_METRIC_HISTOGRAM, "kvrail:request_generation_tokens",
                                 "Tokens generated per request", NULL, token_buckets, nt);
    const char *rq = "Requests that ended at the router, by result";
    g.requests =
        counter("kvrail_router_requests_received_total", "Generate requests received", NULL);
    g.completed = counter("kvrail_router_requests_total", rq, "result=\"ok\"");
    g.failed = counter("kvrail_router_requests_total", rq, "result=\"failed\"");
    g.canceled = counter("kvrail_router_requests_total", rq, "result=\"canceled\"");
    g.overloaded = counter("kvrail_router_requests_total", rq, "result=\"overloaded\"");
    g.bad_frames = counter("kvrail_bad_frames_total", "Malformed frames dropped", NULL);
    g.bad_requests =
        counter("kvrail_router_bad_requests_total", "Client requests refused as invalid", NULL);
    const char *pf = "Prefills dispatched: on a prefill node (remote) or the decode node (local)";
    g.local = counter("kvrail_router_prefills_total", pf, "where=\"local\"");
    g.disagg = counter("kvrail_router_prefills_total", pf, "where=\"remote\"");
    g.retries = counter("kvrail_router_retries_total", "Prefills retried on another node", NULL);
    g.decode_faults = counter("kvrail_router_decode_faults_total",
                              "Prefills failed by the decode node's fault (its address, rkeys, "
                              "reservation or a transfer to it): dispatched to another decode node",
                              NULL);
    g.disconnects = counter("kvrail_router_client_disconnects_total",
                            "Clients gone with a request open (both halves canceled)", NULL);
    g.resyncs = counter("kvrail_router_resyncs_total",
                        "Block directory resyncs asked of nodes (event gaps)", NULL);
    g.dead = counter("kvrail_router_node_deaths_total", "Nodes declared dead", NULL);
    const char *sr = "Requests that ended ok, by finish reason (stop: EOS, a stop token or "
                     "string; length: max_tokens or the context)";
    g.success_stop = counter("kvrail:request_success_total", sr, "finished_reason=\"stop\"");
    g.success_length = counter("kvrail:request_success_total", sr, "finished_reason=\"length\"");
    g.migrations = counter("kvrail_router_migrations_total",
                           "Requests moved to another decode node mid-stream (prompt + the tokens "
                           "streamed so far dispatched again)",
                           NULL);
    g.cached = counter("kvrail:prefix_cache_hits_total",
                       "Prompt tokens found cached on the chosen decode node", NULL);
    g.prompt = counter("kvrail:prefix_cache_queries_total",
                       "Prompt tokens looked up in the prefix cache (all prompt tokens)", NULL);
    g.refused =
        counter("kvrail_router_refused_registrations_total", "Node registrations refused", NULL);
    g.running = gauge("kvrail:num_requests_running", "Requests dispatched and not ended", NULL);
    g.waiting = gauge("kvrail:num_requests_waiting", "Requests waiting for capacity", NULL);
    g.dir_blocks = gauge("kvrail_router_directory_blocks", "Blocks in the block directory", NULL);
    g.start = gauge("kvrail_process_start_time_seconds",
                    "Start time of the process since the Unix epoch", NULL);
    g.cost = gauge("kvrail_metrics_update_seconds",
                   "Loop time the last copy of the figures into the registry took (once a second)",
                   NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    kvr_metric_set(g.start, (double)ts.tv_sec + ts.tv_nsec / 1e9);
    char err[512];
    if (kvr_metrics_http_start(g.reg, r->self->host, r->self->metrics_port, &g.http, err,
                               sizeof err) != KVR_OK) {
        KVR_LOG_ERROR(COMP, "%s", err);
        kvr_metrics_destroy(g.reg);
        g.reg = NULL;
        return false;
    }
    kvr_metrics_http_set_ready(g.http, false, "no decode node registered yet");
    return true;
}

static void node_row(struct rt_node *n, int i)
{
    struct node_m *m = &g.nodes[i];
    if (!m->alive) {
        char l[KVR_METRICS_LABELS_MAX] = "";
        kvr_metrics_label(l, sizeof l, "peer", n->name);
        kvr_metrics_label(l, sizeof l, "peer_role", kvr_node_role_name(n->role));
        m->alive = gauge("kvrail_node_up", "1 while the router sees the node alive", l);
        m->hb_age =
            gauge("kvrail_node_heartbeat_age_seconds", "Time since the node's last heartbeat", l);
        m->total = gauge("kvrail_node_kv_blocks_capacity", "KV blocks of the node's pool", l);
        m->free = gauge("kvrail_node_kv_blocks_free", "Free KV blocks, from heartbeats", l);
        m->cached = gauge("kvrail_node_directory_blocks", "Blocks the directory places there", l);
        m->kv_bytes = counter("kvrail_node_kv_bytes_total", "KV bytes moved, by node", l);
        m->kv_secs =
            counter("kvrail_node_kv_transfer_seconds_total", "KV transfer time, by node", l);
        m->requests = counter("kvrail_node_requests_total", "Requests assigned, by node", l);
        m->blamed = counter("kvrail_node_failures_blamed_total",
                            "Prefill attempts failed by this node's own fault (a decode node's: "
                            "its address, rkeys, reservation or a transfer to it)",
                            l);
        m->cooldowns = counter("kvrail_node_cooldowns_total",
                               "Cool-downs of a decode node after failed transfers in a row", l);
        m->cooling = gauge("kvrail_node_cooling", "1 while a decode node is cooling down", l);
    }
    (void)i;
}

void rt_metrics_update(rt_t *r, uint64_t now)
{
    if (!g.reg || (g.last_ns && now - g.last_ns < 1000000000ull))
        return;
    g.last_ns = now;
    const struct rt_stats *s = &r->st;
    kvr_metric_set(g.requests, (double)s->requests);
    kvr_metric_set(g.completed, (double)s->completed);
    kvr_metric_set(g.failed, (double)s->failed);
    kvr_metric_set(g.canceled, (double)s->canceled);
    kvr_metric_set(g.overloaded, (double)s->overloaded);
    kvr_metric_set(g.bad_frames, (double)s->bad_frames);
    kvr_metric_set(g.bad_requests, (double)s->bad_requests);
    kvr_metric_set(g.local, (double)s->local_prefills);
    kvr_metric_set(g.disagg, (double)s->disagg_prefills);
    kvr_metric_set(g.retries, (double)s->retries);
    kvr_metric_set(g.decode_faults, (double)s->decode_faults);
    kvr_metric_set(g.disconnects, (double)s->client_disconnects);
    kvr_metric_set(g.resyncs, (double)s->resyncs);
    kvr_metric_set(g.dead, (double)s->dead_nodes);
    kvr_metric_set(g.cached, (double)s->cached_tokens);
    kvr_metric_set(g.prompt, (double)s->prompt_tokens);
    kvr_metric_set(g.refused, (double)s->refused_registrations);
    size_t running = 0;
    for (const struct rt_req *q = r->all; q; q = q->anext)
        running++;
    kvr_metric_set(g.waiting, (double)r->n_queued);
    kvr_metric_set(g.running, (double)(running - (running >= r->n_queued ? r->n_queued : 0)));
    kvr_metric_set(g.dir_blocks, (double)rt_dir_entries(&r->dir));
    bool decode_alive = false;
    for (int i = 0; i < r->n_nodes && i < RT_MAX_NODES; i++) {
        struct rt_node *n = &r->nodes[i];
        node_row(n, i);
        struct node_m *m = &g.nodes[i];
        kvr_metric_set(m->alive, n->alive ? 1 : 0);
        kvr_metric_set(m->hb_age, n->registered ? (double)(now - n->last_hb_ns) / 1e9 : 0);
        kvr_metric_set(m->total, n->total_blocks);
        kvr_metric_set(m->free, n->free_blocks);
        kvr_metric_set(m->cached, (double)rt_dir_node_blocks(&r->dir, n->idx));
        uint64_t nb = n->kv_bytes, nt = n->kv_ns;
        if (n->pd_bytes > nb) {
            nb = n->pd_bytes;
            nt = n->pd_ns;
        }
        kvr_metric_set(m->kv_bytes, (double)nb);
        kvr_metric_set(m->kv_secs, (double)nt / 1e9);
        kvr_metric_set(m->requests, (double)n->requests);
        kvr_metric_set(m->blamed, (double)n->blamed);
        kvr_metric_set(m->cooldowns, (double)n->cooldowns);
        kvr_metric_set(m->cooling, n->cool_until > now ? 1 : 0);
        decode_alive |= n->alive && n->role == KVR_NODE_ROLE_DECODE;
    }
    kvr_metrics_http_set_ready(g.http, decode_alive,
                               decode_alive ? "ready" : "no live decode node registered");
    kvr_metric_set(g.cost, (double)(kvr_now_ns() - now) / 1e9);
}

void rt_metrics_request_done(rt_t *r, const struct rt_req *q, kvr_status_t code,
                             Kvrail__FinishReason fin, uint64_t now)
{
    (void)r;
    if (!g.reg)
        return;
    if (q->t_recv && now >= q->t_recv && code == KVR_OK)
        kvr_metric_observe(g.e2e, (double)(now - q->t_recv) / 1e9);
    if (q->t_first && q->t_recv && q->t_first >= q->t_recv)
        kvr_metric_observe(g.ttft, (double)(q->t_first - q->t_recv) / 1e9);
    if (code == KVR_OK && q->t_first && q->n_out > 1 && now >= q->t_first)
        kvr_metric_observe(g.tpot, (double)(now - q->t_first) / 1e9 / (double)(q->n_out - 1));
    if (code == KVR_OK) {
        kvr_metric_add(
            fin == KVRAIL__FINISH_REASON__FINISH_LENGTH ? g.success_length : g.success_stop, 1);
        kvr_metric_observe(g.prompt_hist, (double)q->n_prompt);
        kvr_metric_observe(g.gen_hist, (double)q->n_out);
    }
}

void rt_metrics_migration(void)
{
    if (g.migrations)
        kvr_metric_add(g.migrations, 1);
}

void rt_metrics_stop(void)
{
    kvr_metrics_http_stop(g.http);
    kvr_metrics_destroy(g.reg);
    memset(&g, 0, sizeof g);
}
