/*
 * status.c - `kvrail status`: the cluster as the router sees it.
 *
 *   kvrail status [--router ENDPOINT] [--config FILE] [--timeout MS] [--json]
 *
 * Prints the router's counters (requests, local vs disaggregated prefills,
 * bad frames, its own per-request overhead p50/p99), then one line per node:
 * role, alive, load (batch, in-flight prefill tokens), blocks (free/total,
 * cached in the directory) and the KV bytes moved prefill -> decode with the
 * rate, and the trust counters of every process: the router's (connections
 * and messages refused by auth: curve, registrations refused, bad frames and
 * requests, block events dropped during a resync, decode nodes declared
 * unresponsive) and each node's own (frames from the router and, on a decode
 * node, P->D notifications it dropped).  With a cluster file (--config or KVRAIL_CONFIG), the nodes
 * it places that the router has never seen register are listed with the host where they are
 * expected.  --json prints one JSON object with the same fields.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_client.h"
#include "kvr_cluster.h"
#include "kvr_cmd.h"
#include "kvr_json.h"

static void jstr(const char *s)
{
    char buf[1024];
    kvr_json_escape(buf, sizeof(buf), s, strlen(s));
    fputs(buf, stdout);
}

static void print_json(const struct kvr_cluster_status *s)
{
    printf("{\"model\": ");
    jstr(s->model);
    printf(", \"block_size\": %u, \"router\": {", s->block_size);
    printf("\"uptime_ms\": %" PRIu64 ", \"requests\": %" PRIu64 ", \"active\": %" PRIu64
           ", \"queued\": %" PRIu64 ", \"completed\": %" PRIu64 ", \"failed\": %" PRIu64
           ", \"canceled\": %" PRIu64 ", \"overloaded\": %" PRIu64 ", \"bad_frames\": %" PRIu64
           ", \"bad_requests\": %" PRIu64 ", \"local_prefills\": %" PRIu64
           ", \"disagg_prefills\": %" PRIu64 ", \"retries\": %" PRIu64,
           s->uptime_ms, s->requests, s->active, s->queued, s->completed, s->failed, s->canceled,
           s->overloaded, s->bad_frames, s->bad_requests, s->local_prefills, s->disagg_prefills,
           s->retries);
    printf(", \"overhead_p50_ns\": %" PRIu64 ", \"overhead_p99_ns\": %" PRIu64
           ", \"overhead_max_ns\": %" PRIu64 ", \"overhead_samples\": %" PRIu64
           ", \"token_overhead_p50_ns\": %" PRIu64 ", \"token_overhead_p99_ns\": %" PRIu64
           ", \"tokenize_p50_ns\": %" PRIu64 ", \"tokenize_p99_ns\": %" PRIu64
           ", \"overhead_cpu_p50_ns\": %" PRIu64 ", \"overhead_cpu_p99_ns\": %" PRIu64,
           s->overhead_p50_ns, s->overhead_p99_ns, s->overhead_max_ns, s->overhead_samples,
           s->token_overhead_p50_ns, s->token_overhead_p99_ns, s->tokenize_p50_ns,
           s->tokenize_p99_ns, s->overhead_cpu_p50_ns, s->overhead_cpu_p99_ns);
    printf(", \"kv_bytes_moved\": %" PRIu64 ", \"kv_transfer_ns\": %" PRIu64
           ", \"kv_gbps\": %.6f, \"directory_blocks\": %" PRIu64 ", \"cached_tokens\": %" PRIu64
           ", \"prompt_tokens\": %" PRIu64 ", \"client_disconnects\": %" PRIu64
           ", \"resyncs\": %" PRIu64 ", \"dead_nodes\": %" PRIu64,
           s->kv_bytes_moved, s->kv_transfer_ns, s->kv_gbps, s->directory_blocks, s->cached_tokens,
           s->prompt_tokens, s->client_disconnects, s->resyncs, s->dead_nodes);
    printf(", \"auth_refused\": %" PRIu64 ", \"refused_registrations\": %" PRIu64
           ", \"held_event_drops\": %" PRIu64 ", \"unresponsive_nodes\": %" PRIu64
           "}, \"nodes\": [",
           s->auth_refused, s->refused_registrations, s->held_event_drops, s->unresponsive_nodes);
    for (size_t i = 0; i < s->n_nodes; i++) {
        const struct kvr_node_info *n = &s->nodes[i];
        printf("%s{\"name\": ", i ? ", " : "");
        jstr(n->name);
        printf(", \"role\": \"%s\", \"alive\": %s, \"host\": ", n->role,
               n->alive ? "true" : "false");
        jstr(n->host);
        printf(", \"transport\": ");
        jstr(n->transport);
        printf(", \"kv_dtype\": ");
        jstr(n->kv_dtype);
        printf(", \"kernels\": ");
        jstr(n->kernels);
        printf(", \"last_heartbeat_ms_ago\": %" PRIu64 ", \"total_blocks\": %u, \"free_blocks\": %u"
               ", \"cached_blocks\": %u, \"batch_size\": %u, \"inflight_prefill_tokens\": %" PRIu64
               ", \"queued_prefill_tokens\": %" PRIu64 ", \"requests\": %" PRIu64
               ", \"kv_bytes_moved\": %" PRIu64 ", \"kv_transfer_ns\": %" PRIu64
               ", \"kv_gbps\": %.6f, \"block_event_seq\": %" PRIu64 ", \"resyncs\": %" PRIu64
               ", \"bad_frames\": %" PRIu64 ", \"bad_notifications\": %" PRIu64
               ", \"quarantined_blocks\": %u, \"quarantines_fenced\": %" PRIu64
               ", \"quarantines_expired\": %" PRIu64 ", \"self_fenced\": %" PRIu64
               ", \"failures_blamed\": %" PRIu64 ", \"cooldowns\": %" PRIu64 ", \"cooling\": %s}",
               n->last_heartbeat_ms_ago, n->total_blocks, n->free_blocks, n->cached_blocks,
               n->batch_size, n->inflight_prefill_tokens, n->queued_prefill_tokens, n->requests,
               n->kv_bytes_moved, n->kv_transfer_ns, n->kv_gbps, n->block_event_seq, n->resyncs,
               n->bad_frames, n->bad_notifications, n->quarantined_blocks, n->quarantines_fenced,
               n->quarantines_expired, n->self_fenced, n->failures_blamed, n->cooldowns,
               n->cooling ? "true" : "false");
    }
    printf("]");
}

/* The file's prefill/decode nodes that the router does not know: never
 * registered (a node that registered and died is listed by the router, not
 * alive).  Returns how many; prints them as JSON or text. */
static size_t print_unregistered(const kvr_cluster_t *cf, const struct kvr_cluster_status *s,
                                 bool json)
{
    size_t n = 0;
    if (json)
        printf(", \"unregistered\": [");
    for (size_t i = 0; cf && i < cf->n_nodes; i++) {
        const kvr_cluster_node_t *cn = &cf->nodes[i];
        if (cn->role == KVR_NODE_ROLE_ROUTER)
            continue;
        bool seen = false;
        for (size_t j = 0; j < s->n_nodes && !seen; j++)
            seen = !strcmp(s->nodes[j].name, cn->name);
        if (seen)
            continue;
        if (json) {
            printf("%s{\"name\": ", n ? ", " : "");
            jstr(cn->name);
            printf(", \"role\": \"%s\", \"host\": ", kvr_node_role_name(cn->role));
            jstr(cn->host);
            printf("}");
        } else {
            if (!n)
                printf("\nnever registered (start them there, e.g. `kvrail up FILE` on that "
                       "host):\n");
            printf("%-12s %-8s expected on %s\n", cn->name, kvr_node_role_name(cn->role), cn->host);
        }
        n++;
    }
    if (json)
        printf("]");
    return n;
}

static void print_text(const char *ep, const struct kvr_cluster_status *s)
{
    printf("router %s: model %s, block size %u, up %.1f s\n", ep, s->model, s->block_size,
           (double)s->uptime_ms / 1000.0);
    printf("requests %" PRIu64 " (active %" PRIu64 ", queued %" PRIu64 ", completed %" PRIu64
           ", failed %" PRIu64 ", canceled %" PRIu64 ", overloaded %" PRIu64 ")\n",
           s->requests, s->active, s->queued, s->completed, s->failed, s->canceled, s->overloaded);
    printf("prefills: %" PRIu64 " disaggregated, %" PRIu64 " local on the decode node; %" PRIu64
           " of %" PRIu64 " prompt tokens from prefix caches\n",
           s->disagg_prefills, s->local_prefills, s->cached_tokens, s->prompt_tokens);
    printf("retries %" PRIu64 ", client disconnects %" PRIu64 ", resyncs %" PRIu64 "\n", s->retries,
           s->client_disconnects, s->resyncs);
    printf("trust (router): auth refused %" PRIu64 ", registrations refused %" PRIu64
           ", bad frames %" PRIu64 ", bad requests %" PRIu64 ", block events dropped %" PRIu64
           ", decode nodes unresponsive %" PRIu64 "\n",
           s->auth_refused, s->refused_registrations, s->bad_frames, s->bad_requests,
           s->held_event_drops, s->unresponsive_nodes);
    printf("router overhead per request: p50 %.1f us, p99 %.1f us, max %.1f us (%" PRIu64
           " requests; CPU time p50 %.1f us, p99 %.1f us); per token p99 %.1f us\n",
           (double)s->overhead_p50_ns / 1e3, (double)s->overhead_p99_ns / 1e3,
           (double)s->overhead_max_ns / 1e3, s->overhead_samples,
           (double)s->overhead_cpu_p50_ns / 1e3, (double)s->overhead_cpu_p99_ns / 1e3,
           (double)s->token_overhead_p99_ns / 1e3);
    /* transfer time: each layer's post to the completion the prefill node saw
     * (at its next layer boundary), so the rate is a lower bound */
    double secs = (double)s->kv_transfer_ns / 1e9;
    double rate = secs > 0 ? (double)s->kv_bytes_moved / secs : 0.0;
    printf("KV moved prefill -> decode: %" PRIu64 " bytes (%.2f MiB) in %.3f ms of transfer time"
           ", at least %.1f MB/s (%.3f GB/s)\n\n",
           s->kv_bytes_moved, (double)s->kv_bytes_moved / 1048576.0, secs * 1e3, rate / 1e6,
           rate / 1e9);
    /* FENCE: a decode node's blocks held until their writer is fenced, a
     * prefill node's pushes given up after half a lease of silence; BLAMED:
     * request failures laid on the node ("+cool" while a decode node is
     * taken last after repeated faults) */
    printf("%-12s %-8s %-5s %-10s %-5s %-10s %7s %13s %8s %6s %10s %12s %9s %9s %9s %6s %11s\n",
           "NODE", "ROLE", "ALIVE", "TRANSPORT", "KV", "KERNELS", "HB AGO", "FREE/TOTAL", "CACHED",
           "BATCH", "PREFILL TK", "KV BYTES", "GB/S", "BAD FRMS", "BAD NOTIF", "FENCE", "BLAMED");
    for (size_t i = 0; i < s->n_nodes; i++) {
        const struct kvr_node_info *n = &s->nodes[i];
        char blocks[32], hb[32];
        snprintf(blocks, sizeof(blocks), "%u/%u", n->free_blocks, n->total_blocks);
        snprintf(hb, sizeof(hb), "%" PRIu64 "ms", n->last_heartbeat_ms_ago);
        uint64_t fence = strcmp(n->role, "decode") == 0 ? n->quarantined_blocks : n->self_fenced;
        char blamed[32];
        snprintf(blamed, sizeof(blamed), "%" PRIu64 "%s", n->failures_blamed,
                 n->cooling ? "+cool" : "");
        printf("%-12s %-8s %-5s %-10s %-5s %-10s %7s %13s %8u %6u %10" PRIu64 " %12" PRIu64
               " %9.3f %9" PRIu64 " %9" PRIu64 " %6" PRIu64 " %11s\n",
               n->name, n->role, n->alive ? "yes" : "no", n->transport,
               n->kv_dtype[0] ? n->kv_dtype : "-", n->kernels[0] ? n->kernels : "-", hb, blocks,
               n->cached_blocks, n->batch_size, n->inflight_prefill_tokens, n->kv_bytes_moved,
               n->kv_gbps, n->bad_frames, n->bad_notifications, fence, blamed);
    }
}

int kvr_cmd_status(int argc, char **argv)
{
    static const struct option opts[] = {
        {"router", required_argument, NULL, 'r'},  {"config", required_argument, NULL, 'c'},
        {"timeout", required_argument, NULL, 'T'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    const char *router = NULL, *config = NULL;
    bool json = false;
    int timeout_ms = 5000;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:c:T:jh", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            router = optarg;
            break;
        case 'c':
            config = optarg;
            break;
        case 'T':
            timeout_ms = atoi(optarg);
            if (timeout_ms <= 0) {
                fprintf(stderr, "kvrail status: --timeout '%s' must be a positive number of ms\n",
                        optarg);
                return 2;
            }
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            printf("usage: kvrail status [--router ENDPOINT] [--config FILE] [--timeout MS] "
                   "[--json]\n");
            return 0;
        default:
            fprintf(stderr, "usage: kvrail status [--router ENDPOINT] [--config FILE] "
                            "[--timeout MS] [--json]\n");
            return 2;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "kvrail status: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    char buf[512];
    const char *ep = kvr_cmd_router_endpoint(router, config, buf, sizeof(buf));
    if (!ep)
        return 1;
    kvr_client_t *cl = NULL;
    kvr_status_t st = kvr_client_connect(ep, &cl);
    if (st != KVR_OK) {
        fprintf(stderr, "kvrail status: cannot connect to %s: %s\n", ep, kvr_status_str(st));
        return 1;
    }
    static struct kvr_cluster_status s;
    st = kvr_client_status(cl, timeout_ms, &s);
    if (st != KVR_OK) {
        fprintf(stderr, "kvrail status: %s: %s\n", ep, kvr_client_error(cl));
        kvr_client_close(cl);
        return 1;
    }
    /* the cluster file, when there is one, says which nodes never registered */
    kvr_cluster_t *cf = NULL;
    const char *cfg = config ? config : getenv("KVRAIL_CONFIG");
    char err[512];
    if (cfg && kvr_cluster_load(cfg, &cf, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail status: %s\n", err);
        cf = NULL;
    }
    if (json) {
        print_json(&s);
        print_unregistered(cf, &s, true);
        printf("}\n");
    } else {
        print_text(ep, &s);
        print_unregistered(cf, &s, false);
    }
    kvr_cluster_free(cf);
    kvr_client_close(cl);
    return 0;
}
