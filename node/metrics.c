/*
 * metrics.c - a node's Prometheus endpoint (node_metrics.h).
 *
 * The node keeps its counters as plain fields of its loop thread; rather
 * than updating a second copy at every place they change, the loop renders
 * the same JSON object as the stats file (the runtime's common fields and
 * the role's ops->stats) at most once per KVR_NODE_METRICS_PERIOD_MS and
 * copies the fields named in the table below into registry series (a
 * counter set to a cumulative figure, a gauge to a level).  The HTTP
 * thread only ever reads the registry's atomics.  Fields a role does not
 * report are skipped, so one table serves prefill and decode.
 */
#include "node_metrics.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr_clock.h"
#include "kvr_json.h"
#include "kvr_log.h"
#include "kvr_metrics.h"
#include "kvr_metrics_http.h"

#define COMP "metrics"

struct field {
    const char *key; /* in the stats JSON */
    enum kvr_metric_type type;
    const char *name;
    const char *labels; /* extra labels, or NULL */
    double scale;       /* value = field * scale */
    const char *help;
};

#define C KVR_METRIC_COUNTER
#define G KVR_METRIC_GAUGE
static const struct field fields[] = {
    {"registered", G, "kvrail_node_registered", NULL, 1,
     "1 while the router has accepted the node"},
    {"bad_frames", C, "kvrail_bad_frames_total", NULL, 1, "Malformed frames dropped"},
    /* prefill */
    {"prefills_ok", C, "kvrail_prefill_requests_total", "result=\"ok\"", 1,
     "Prefills finished, by result"},
    {"prefills_failed", C, "kvrail_prefill_requests_total", "result=\"failed\"", 1,
     "Prefills finished, by result"},
    {"prefills_canceled", C, "kvrail_prefill_requests_total", "result=\"canceled\"", 1,
     "Prefills finished, by result"},
    {"bytes_pushed", C, "kvrail_kv_bytes_pushed_total", NULL, 1,
     "KV cache bytes written into decode nodes' pools"},
    {"transfer_ns", C, "kvrail_kv_transfer_seconds_total", NULL, 1e-9,
     "Time from the first KV write of a prefill to its completion, summed"},
    {"descriptors_raw", C, "kvrail_kv_descriptors_total", "stage=\"before_coalescing\"", 1,
     "KV write descriptors, before and after coalescing adjacent blocks"},
    {"descriptors_posted", C, "kvrail_kv_descriptors_total", "stage=\"posted\"", 1,
     "KV write descriptors, before and after coalescing adjacent blocks"},
    {"computed_tokens", C, "kvrail:prompt_tokens_total", NULL, 1,
     "Prompt tokens computed by this node"},
    {"local_cached_tokens", C, "kvrail:prefix_cache_hits_total", NULL, 1,
     "Prompt tokens found in this node's prefix cache"},
    {"queued", G, "kvrail:num_requests_waiting", NULL, 1, "Requests waiting on this node"},
    {"active", G, "kvrail:num_requests_running", NULL, 1, "Requests running on this node"},
    {"batched_prefills", C, "kvrail_prefill_batches_total", NULL, 1,
     "Prefills that ran more than one prompt at once"},
    {"staging_total", G, "kvrail_prefill_staging_blocks", "state=\"total\"", 1,
     "Prefill staging KV blocks, by state"},
    {"staging_free", G, "kvrail_prefill_staging_blocks", "state=\"free\"", 1,
     "Prefill staging KV blocks, by state"},
    {"staging_cached", G, "kvrail_prefill_staging_blocks", "state=\"cached\"", 1,
     "Prefill staging KV blocks, by state"},
    /* decode */
    {"total_blocks", G, "kvrail_kv_pool_blocks", "state=\"total\"", 1, "KV pool blocks, by state"},
    {"free_blocks", G, "kvrail_kv_pool_blocks", "state=\"free\"", 1, "KV pool blocks, by state"},
    {"evictable_blocks", G, "kvrail_kv_pool_blocks", "state=\"evictable\"", 1,
     "KV pool blocks, by state"},
    {"cached_blocks", G, "kvrail_kv_pool_blocks", "state=\"cached\"", 1,
     "KV pool blocks, by state"},
    {"reserved_blocks", G, "kvrail_kv_pool_blocks", "state=\"reserved\"", 1,
     "KV pool blocks, by state"},
    {"batch", G, "kvrail:num_requests_running", NULL, 1, "Requests running on this node"},
    {"done", C, "kvrail_decode_requests_total", "result=\"done\"", 1,
     "Decode requests finished, by result"},
    {"failed", C, "kvrail_decode_requests_total", "result=\"failed\"", 1,
     "Decode requests finished, by result"},
    {"canceled", C, "kvrail_decode_requests_total", "result=\"canceled\"", 1,
     "Decode requests finished, by result"},
    {"expired", C, "kvrail_decode_requests_total", "result=\"expired\"", 1,
     "Decode requests finished, by result"},
    {"rejected", C, "kvrail_decode_requests_total", "result=\"rejected\"", 1,
     "Decode requests finished, by result"},
    {"local_prefills", C, "kvrail_decode_prefills_total", "where=\"local\"", 1,
     "Prompts of this node's requests prefilled here (local) or by a prefill node (remote)"},
    {"remote_prefills", C, "kvrail_decode_prefills_total", "where=\"remote\"", 1,
     "Prompts of this node's requests prefilled here (local) or by a prefill node (remote)"},
    {"kv_bytes_received", C, "kvrail_kv_bytes_received_total", NULL, 1,
     "KV cache bytes written into this node's pool by prefill nodes"},
    {"tokens_out", C, "kvrail:generation_tokens_total", NULL, 1, "Tokens generated"},
    {"steps", C, "kvrail_decode_steps_total", NULL, 1, "Decode steps run"},
    {"cached_tokens_reused", C, "kvrail:prefix_cache_hits_total", NULL, 1,
     "Prompt tokens found in this node's prefix cache"},
    {"preemptions", C, "kvrail:num_preemptions_total", NULL, 1,
     "Sequences preempted when the pool was full"},
    {"bad_notifications", C, "kvrail_bad_notifications_total", NULL, 1,
     "Malformed P->D notifications dropped"},
    {"chunks", C, "kvrail_decode_prefill_chunks_total", NULL, 1, "Local prefill chunks run"},
    {"step_ns_last", G, "kvrail_decode_step_seconds", NULL, 1e-9, "Duration of the last step"},
    {"itl_ns_max", G, "kvrail_decode_inter_token_latency_max_seconds", NULL, 1e-9,
     "Longest gap between two tokens of a sequence since start"},
    {"lease_renewals", C, "kvrail_decode_lease_renewals_total", NULL, 1,
     "Reservation leases renewed by prefill progress"},
};
#undef C
#undef G
#define N_FIELDS (sizeof fields / sizeof fields[0])

static struct {
    kvr_metrics_t *reg;
    kvr_metrics_http_t *http;
    kvr_metric_t *m[N_FIELDS];
    kvr_metric_t *usage, *up, *cost;
    uint64_t last_ns;
} g;

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
    struct kvr_sbuf b = {0};
    kvr_node_stats_render(node, &b);
    kvr_json_doc_t *doc = NULL;
    char err[128];
    if (!b.failed && b.p && kvr_json_parse(b.p, b.n, &doc, err, sizeof err) == KVR_OK) {
        const kvr_json_t *root = kvr_json_root(doc);
        for (size_t i = 0; i < N_FIELDS; i++) {
            bool ok = true; /* set false on a type mismatch only */
            double v = kvr_json_get_num(root, fields[i].key, 0, &ok);
            if (!ok || !kvr_json_get(root, fields[i].key))
                continue;
            if (!g.m[i])
                g.m[i] = kvr_metrics_get(g.reg, fields[i].type, fields[i].name, fields[i].help,
                                         fields[i].labels, NULL, 0);
            kvr_metric_set(g.m[i], v * fields[i].scale);
        }
        bool ok = true;
        double total = kvr_json_get_num(root, "total_blocks", 0, &ok);
        double free_b = kvr_json_get_num(root, "free_blocks", 0, &ok) +
                        kvr_json_get_num(root, "evictable_blocks", 0, &ok);
        if (ok && total > 0) { /* evictable blocks (prefix cache) count as free */
            if (!g.usage)
                g.usage = kvr_metrics_gauge(g.reg, "kvrail:kv_cache_usage_perc",
                                            "Share of the KV pool in use (1 = full)", NULL);
            kvr_metric_set(g.usage, 1.0 - free_b / total);
        }
    } else {
        KVR_LOG_WARN(COMP, "the node's stats did not parse as JSON (%s): metrics not updated",
                     b.failed ? "out of memory" : err);
    }
    kvr_json_free(doc);
    free(b.p);
    kvr_metric_set(g.cost, (double)(kvr_now_ns() - now_ns) / 1e9);
    kvr_metrics_http_set_ready(g.http, node->registered,
                               node->registered ? "ready" : "not registered with the router");
    return KVR_NODE_METRICS_PERIOD_MS;
}

void kvr_node_metrics_stop(void)
{
    kvr_metrics_http_stop(g.http);
    kvr_metrics_destroy(g.reg);
    memset(&g, 0, sizeof g);
}
