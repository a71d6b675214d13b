/*
 * metrics.c - a node's Prometheus endpoint (node_metrics.h).
 *
 * The node keeps its counters as plain fields of its loop thread; rather
 * than updating a second copy at every place they change, the loop asks
 * the role for them (ops->counters: one put(id, value) per figure, read
 * straight from its fields) at most once per KVR_NODE_METRICS_PERIOD_MS and
 * copies them into registry series (a counter set to a cumulative figure, a
 * gauge to a level) by the table below, indexed by id.  The cost does not
 * depend on the node's state (no stats JSON is rendered or parsed; the
 * decode node's stats file lists every cached block hash).  Per-event
 * figures - inter-token latency, KV bytes and seconds per transfer,
 * transfer failures by status - are observed where they happen.  The HTTP
 * thread only ever reads the registry's atomics.  Figures a role does not
 * report are never created, so one table serves prefill and decode.
 */
#include "node_metrics.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "kvr_metrics.h"
#include "kvr_metrics_http.h"

#define COMP "metrics"

struct field {
    enum kvr_metric_type type;
    const char *name;
    const char *labels; /* extra labels, or NULL */
    double scale;       /* value = figure * scale */
    const char *help;
};

#define C KVR_METRIC_COUNTER
#define G KVR_METRIC_GAUGE
static const struct field fields[KVR_NC_COUNT] = {
    /* prefill */
    [KVR_NC_PREFILLS_OK] = {C, "kvrail_prefill_requests_total", "result=\"ok\"", 1,
                            "Prefills finished, by result"},
    [KVR_NC_PREFILLS_FAILED] = {C, "kvrail_prefill_requests_total", "result=\"failed\"", 1,
                                "Prefills finished, by result"},
    [KVR_NC_PREFILLS_CANCELED] = {C, "kvrail_prefill_requests_total", "result=\"canceled\"", 1,
                                  "Prefills finished, by result"},
    [KVR_NC_BYTES_PUSHED] = {C, "kvrail_kv_bytes_pushed_total", NULL, 1,
                             "KV cache bytes written into decode nodes' pools"},
    [KVR_NC_TRANSFER_NS] = {C, "kvrail_kv_transfer_seconds_total", NULL, 1e-9,
                            "Time from the first KV write of a prefill to its completion, summed"},
    [KVR_NC_DESCRIPTORS_RAW] =
        {C, "kvrail_kv_descriptors_total", "stage=\"before_coalescing\"", 1,
         "KV write descriptors, before and after coalescing adjacent blocks"},
    [KVR_NC_DESCRIPTORS_POSTED] = {C, "kvrail_kv_descriptors_total", "stage=\"posted\"", 1,
                                   "KV write descriptors, before and after coalescing adjacent "
                                   "blocks"},
    [KVR_NC_COMPUTED_TOKENS] = {C, "kvrail:prompt_tokens_total", NULL, 1,
                                "Prompt tokens computed by this node"},
    [KVR_NC_LOCAL_CACHED_TOKENS] = {C, "kvrail:prefix_cache_hits_total", NULL, 1,
                                    "Prompt tokens found in this node's prefix cache"},
    [KVR_NC_QUEUED] = {G, "kvrail:num_requests_waiting", NULL, 1, "Requests waiting on this node"},
    [KVR_NC_ACTIVE] = {G, "kvrail:num_requests_running", NULL, 1, "Requests running on this node"},
    [KVR_NC_BATCHED_PREFILLS] = {C, "kvrail_prefill_batches_total", NULL, 1,
                                 "Prefills that ran more than one prompt at once"},
    [KVR_NC_STAGING_TOTAL] = {G, "kvrail_prefill_staging_blocks", "state=\"total\"", 1,
                              "Prefill staging KV blocks, by state"},
    [KVR_NC_STAGING_FREE] = {G, "kvrail_prefill_staging_blocks", "state=\"free\"", 1,
                             "Prefill staging KV blocks, by state"},
    [KVR_NC_STAGING_CACHED] = {G, "kvrail_prefill_staging_blocks", "state=\"cached\"", 1,
                               "Prefill staging KV blocks, by state"},
    /* decode */
    [KVR_NC_TOTAL_BLOCKS] = {G, "kvrail_kv_pool_blocks", "state=\"total\"", 1,
                             "KV pool blocks, by state"},
    [KVR_NC_FREE_BLOCKS] = {G, "kvrail_kv_pool_blocks", "state=\"free\"", 1,
                            "KV pool blocks, by state"},
    [KVR_NC_EVICTABLE_BLOCKS] = {G, "kvrail_kv_pool_blocks", "state=\"evictable\"", 1,
                                 "KV pool blocks, by state"},
    [KVR_NC_CACHED_BLOCKS] = {G, "kvrail_kv_pool_blocks", "state=\"cached\"", 1,
                              "KV pool blocks, by state"},
    [KVR_NC_RESERVED_BLOCKS] = {G, "kvrail_kv_pool_blocks", "state=\"reserved\"", 1,
                                "KV pool blocks, by state"},
    [KVR_NC_BATCH] = {G, "kvrail:num_requests_running", NULL, 1, "Requests running on this node"},
    [KVR_NC_DONE] = {C, "kvrail_decode_requests_total", "result=\"done\"", 1,
                     "Decode requests finished, by result"},
    [KVR_NC_FAILED] = {C, "kvrail_decode_requests_total", "result=\"failed\"", 1,
                       "Decode requests finished, by result"},
    [KVR_NC_CANCELED] = {C, "kvrail_decode_requests_total", "result=\"canceled\"", 1,
                         "Decode requests finished, by result"},
    [KVR_NC_EXPIRED] = {C, "kvrail_decode_requests_total", "result=\"expired\"", 1,
                        "Decode requests finished, by result"},
    [KVR_NC_REJECTED] = {C, "kvrail_decode_requests_total", "result=\"rejected\"", 1,
                         "Decode requests finished, by result"},
    [KVR_NC_LOCAL_PREFILLS] = {C, "kvrail_decode_prefills_total", "where=\"local\"", 1,
                               "Prompts of this node's requests prefilled here (local) or by a "
                               "prefill node (remote)"},
    [KVR_NC_REMOTE_PREFILLS] = {C, "kvrail_decode_prefills_total", "where=\"remote\"", 1,
                                "Prompts of this node's requests prefilled here (local) or by a "
                                "prefill node (remote)"},
    [KVR_NC_KV_BYTES_RECEIVED] = {C, "kvrail_kv_bytes_received_total", NULL, 1,
                                  "KV cache bytes written into this node's pool by prefill nodes"},
    [KVR_NC_TOKENS_OUT] = {C, "kvrail:generation_tokens_total", NULL, 1, "Tokens generated"},
    [KVR_NC_STEPS] = {C, "kvrail_decode_steps_total", NULL, 1, "Decode steps run"},
    [KVR_NC_CACHED_TOKENS_REUSED] = {C, "kvrail:prefix_cache_hits_total", NULL, 1,
                                     "Prompt tokens found in this node's prefix cache"},
    [KVR_NC_PREEMPTIONS] = {C, "kvrail:num_preemptions_total", NULL, 1,
                            "Sequences preempted when the pool was full"},
    [KVR_NC_BAD_NOTIFICATIONS] = {C, "kvrail_bad_notifications_total", NULL, 1,
                                  "Malformed P->D notifications dropped"},
    [KVR_NC_CHUNKS] = {C, "kvrail_decode_prefill_chunks_total", NULL, 1,
                       "Local prefill chunks run"},
    [KVR_NC_STEP_NS_LAST] = {G, "kvrail_decode_step_seconds", NULL, 1e-9,
                             "Duration of the last step"},
    [KVR_NC_ITL_NS_MAX] = {G, "kvrail_decode_inter_token_latency_max_seconds", NULL, 1e-9,
                           "Longest gap between two tokens of a sequence since start"},
    [KVR_NC_LEASE_RENEWALS] = {C, "kvrail_decode_lease_renewals_total", NULL, 1,
                               "Reservation leases renewed by prefill progress"},
};
#undef C
#undef G

/* bytes per transfer: 4 KiB .. 4 GiB, by 4x */
static const double kv_bytes_buckets[] = {4096.0,      16384.0,      65536.0,     262144.0,
                                          1048576.0,   4194304.0,    16777216.0,  67108864.0,
                                          268435456.0, 1073741824.0, 4294967296.0};

static struct {
    kvr_metrics_t *reg;
    kvr_metrics_http_t *http;
    kvr_metric_t *m[KVR_NC_COUNT];
    double v[KVR_NC_COUNT];
    bool have[KVR_NC_COUNT];
    kvr_metric_t *usage, *up, *cost, *registered, *bad_frames;
    kvr_metric_t *itl, *xfer_bytes, *xfer_secs;
    uint64_t last_ns;
} g;

static void put(void *ctx, int id, double v)
{
    (void)ctx;
    if (id < 0 || id >= KVR_NC_COUNT)
        return;
    g.v[id] = v;
    g.have[id] = true;
}

kvr_status_t kvr_node_metrics_start(kvr_node_t *node, char *err, size_t err_len)
{
    if (!node->self->metrics_port)
        return KVR_OK;
    const char *model = strrchr(node->cluster->model_dir, '/');
    model = model && model[1] ? model + 1 : node->cluster->model_dir;
    char base[KVR_METRICS_LABELS_MAX] = "";
    kvr_metrics_label(base, sizeof base, "node", node->name);
    kvr_metrics_label(base, sizeof base, "role", kvr_node_role_name(node->role));
    kvr_metrics_label(base, sizeof base, "model", model);
    kvr_status_t s = kvr_metrics_create(base, &g.reg);
    if (s != KVR_OK) {
        snprintf(err, err_len, "metrics: %s", kvr_status_str(s));
        return s;
    }
    g.up = kvr_metrics_gauge(g.reg, "kvrail_process_start_time_seconds",
                             "Start time of the process since the Unix epoch", NULL);
    g.cost = kvr_metrics_gauge(g.reg, "kvrail_metrics_update_seconds",
                               "Loop time the last copy of the figures into the registry took "
                               "(once a second)",
                               NULL);
    g.registered = kvr_metrics_gauge(g.reg, "kvrail_node_registered",
                                     "1 while the router has accepted the node", NULL);
    g.bad_frames =
        kvr_metrics_counter(g.reg, "kvrail_bad_frames_total", "Malformed frames dropped", NULL);
    const double *lb = kvr_metrics_latency_buckets;
    size_t nl = kvr_metrics_latency_n;
    if (node->role == KVR_NODE_ROLE_DECODE) {
        g.itl = kvr_metrics_get(g.reg, KVR_METRIC_HISTOGRAM, "kvrail:inter_token_latency_seconds",
                                "Time between two consecutive tokens of a sequence", NULL, lb, nl);
    } else {
        g.xfer_bytes =
            kvr_metrics_get(g.reg, KVR_METRIC_HISTOGRAM, "kvrail_kv_transfer_bytes",
                            "KV bytes written per request into a decode node's pool", NULL,
                            kv_bytes_buckets, sizeof kv_bytes_buckets / sizeof kv_bytes_buckets[0]);
        g.xfer_secs = kvr_metrics_get(g.reg, KVR_METRIC_HISTOGRAM, "kvrail_kv_transfer_seconds",
                                      "Time on the wire of one request's KV writes (each layer's "
                                      "post to its completion, summed)",
                                      NULL, lb, nl);
        /* present (0) before the first failure, so a rate() works from the start */
        kvr_node_metrics_transfer_failed(KVR_OK);
    }
    s = kvr_metrics_http_start(g.reg, node->self->host, node->self->metrics_port, &g.http, err,
                               err_len);
    if (s != KVR_OK) {
        kvr_metrics_destroy(g.reg);
        g.reg = NULL;
        return s;
    }
    kvr_metrics_http_set_ready(g.http, false, "not registered with the router yet");
    return KVR_OK;
}

int kvr_node_metrics_update(kvr_node_t *node, uint64_t now_ns)
{
    if (!g.reg)
        return INT_MAX;
    uint64_t period = KVR_NODE_METRICS_PERIOD_MS * 1000000ull;
    if (g.last_ns && now_ns - g.last_ns < period)
        return (int)((period - (now_ns - g.last_ns)) / 1000000ull) + 1;
    g.last_ns = now_ns;
    if (kvr_metric_value(g.up) == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        kvr_metric_set(g.up, (double)ts.tv_sec + ts.tv_nsec / 1e9);
    }
    if (node->ops && node->ops->counters) {
        memset(g.have, 0, sizeof g.have);
        node->ops->counters(node->ops_arg, put, NULL);
        for (int i = 0; i < KVR_NC_COUNT; i++) {
            if (!g.have[i])
                continue;
            if (!g.m[i])
                g.m[i] = kvr_metrics_get(g.reg, fields[i].type, fields[i].name, fields[i].help,
                                         fields[i].labels, NULL, 0);
            kvr_metric_set(g.m[i], g.v[i] * fields[i].scale);
        }
        if (g.have[KVR_NC_TOTAL_BLOCKS] && g.v[KVR_NC_TOTAL_BLOCKS] > 0) {
            /* evictable blocks (prefix cache) count as free */
            if (!g.usage)
                g.usage = kvr_metrics_gauge(g.reg, "kvrail:kv_cache_usage_perc",
                                            "Share of the KV pool in use (1 = full)", NULL);
            kvr_metric_set(g.usage, 1.0 - (g.v[KVR_NC_FREE_BLOCKS] + g.v[KVR_NC_EVICTABLE_BLOCKS]) /
                                              g.v[KVR_NC_TOTAL_BLOCKS]);
        }
    }
    kvr_metric_set(g.registered, node->registered ? 1 : 0);
    kvr_metric_set(g.bad_frames, (double)node->bad_frames);
    kvr_metric_set(g.cost, (double)(kvr_now_ns() - now_ns) / 1e9);
    kvr_metrics_http_set_ready(g.http, node->registered,
                               node->registered ? "ready" : "not registered with the router");
    return KVR_NODE_METRICS_PERIOD_MS;
}

void kvr_node_metrics_itl(uint64_t ns)
{
    if (g.itl)
        kvr_metric_observe(g.itl, (double)ns / 1e9);
}

void kvr_node_metrics_kv_transfer(uint64_t bytes, uint64_t ns)
{
    if (g.xfer_bytes)
        kvr_metric_observe(g.xfer_bytes, (double)bytes);
    if (g.xfer_secs)
        kvr_metric_observe(g.xfer_secs, (double)ns / 1e9);
}

void kvr_node_metrics_transfer_failed(kvr_status_t st)
{
    if (!g.reg)
        return;
    /* KVR_OK only creates the series; a status gets its own label value */
    char l[KVR_METRICS_LABELS_MAX] = "";
    kvr_metrics_label(l, sizeof l, "status", st == KVR_OK ? "none" : kvr_status_name(st));
    kvr_metric_t *m = kvr_metrics_counter(
        g.reg, "kvrail_kv_transfer_failures_total",
        "KV transfers to a decode node that failed, by status (timeout, peer failure, ...)", l);
    if (st != KVR_OK)
        kvr_metric_add(m, 1);
}

void kvr_node_metrics_stop(void)
{
    kvr_metrics_http_stop(g.http);
    kvr_metrics_destroy(g.reg);
    memset(&g, 0, sizeof g);
}
