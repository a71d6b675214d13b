/*
 * test_cluster.c - the cluster file loader: the shipped deploy/local files
 * load, a full file gives every value, and each kind of bad file is refused
 * with a message naming the line and the key.
 */
#include <stdio.h>
#include <string.h>

#include "kvr_cluster.h"
#include "kvr_test.h"

static const char *good =
    "cluster: t\n"
    "model: models/tiny\n"
    "block_size: 8\n"
    "kv_dtype: bf16\n"
    "router:\n"
    "  client: tcp://127.0.0.1:7000\n"
    "  node: tcp://127.0.0.1:7001\n"
    "timeouts: {lease_ms: 500, queue_ms: 100, heartbeat_ms: 50, heartbeat_timeout_ms: 200}\n"
    "thresholds: {local_prefill_tokens: 7}\n"
    "limits: {max_queue: 3, prefill_retries: 1, max_tokens: 99}\n"
    "nodes:\n"
    "  - {name: r, role: router}\n"
    "  - name: p0\n"
    "    role: prefill\n"
    "    host: 127.0.0.1\n"
    "    device: cuda:1\n"
    "    threads: 4\n"
    "    transport: {backend: verbs, devices: rxe0, require_rdma: true}\n"
    "  - name: d0\n"
    "    role: decode\n"
    "    pool_bytes: 64MiB\n"
    "    transport: loop\n";

static void check_bad(const char *text, const char *want1, const char *want2)
{
    kvr_cluster_t *cl = NULL;
    char err[512] = "";
    kvr_status_t st = kvr_cluster_parse(text, strlen(text), "bad.yaml", &cl, err, sizeof(err));
    if (st == KVR_OK || !strstr(err, want1) || (want2 && !strstr(err, want2))) {
        fprintf(stderr, "bad file accepted or wrong message: status %d, err '%s', want '%s'/'%s'\n",
                st, err, want1, want2 ? want2 : "");
        exit(1);
    }
    KVR_CHECK(cl == NULL);
    KVR_CHECK(strstr(err, "bad.yaml:") == err);
}

int main(int argc, char **argv)
{
    const char *srcdir = argc > 1 ? argv[1] : ".";
    kvr_cluster_t *cl = NULL;
    char err[512] = "";
    KVR_CHECK_STATUS(
        kvr_cluster_parse(good, strlen(good), "/etc/kvrail/c.yaml", &cl, err, sizeof(err)), KVR_OK);
    KVR_CHECK(!strcmp(cl->name, "t"));
    KVR_CHECK(!strcmp(cl->model_dir, "/etc/kvrail/models/tiny"));
    KVR_CHECK_EQ(cl->block_size, 8);
    KVR_CHECK(!strcmp(cl->kv_dtype, "bf16"));
    KVR_CHECK(!strcmp(cl->client_endpoint, "tcp://127.0.0.1:7000"));
    KVR_CHECK(!strcmp(cl->node_bind, "tcp://127.0.0.1:7001"));
    KVR_CHECK_EQ(cl->timeouts.lease_ms, 500);
    KVR_CHECK_EQ(cl->timeouts.heartbeat_timeout_ms, 200);
    KVR_CHECK_EQ(cl->timeouts.request_ms, 300000); /* default */
    KVR_CHECK_EQ(cl->local_prefill_tokens, 7);
    KVR_CHECK_EQ(cl->max_queue, 3);
    KVR_CHECK_EQ(cl->max_tokens_limit, 99);
    KVR_CHECK_EQ(cl->n_nodes, 3);
    const kvr_cluster_node_t *p0 = kvr_cluster_find(cl, "p0");
    KVR_CHECK(p0 && p0->role == KVR_NODE_ROLE_PREFILL);
    KVR_CHECK_EQ(p0->device_index, 1);
    KVR_CHECK_EQ(p0->threads, 4);
    KVR_CHECK(!strcmp(p0->transport, "verbs") && !strcmp(p0->devices, "rxe0") && p0->require_rdma);
    KVR_CHECK(kvr_cluster_node_is_local(p0));
    const kvr_cluster_node_t *d0 = kvr_cluster_first(cl, KVR_NODE_ROLE_DECODE);
    KVR_CHECK(d0 && !strcmp(d0->name, "d0"));
    KVR_CHECK_EQ(d0->pool_bytes, 64ull << 20);
    KVR_CHECK_EQ(d0->pool_blocks, 0);
    KVR_CHECK(!strcmp(d0->transport, "loop"));
    KVR_CHECK_EQ(d0->line, 19);
    KVR_CHECK(kvr_cluster_find(cl, "nope") == NULL);
    kvr_cluster_free(cl);

    /* the shipped files load */
    const char *files[] = {"deploy/local/cluster.yaml", "deploy/local/cluster-2p2d.yaml"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", srcdir, files[i]);
        kvr_status_t st = kvr_cluster_load(path, &cl, err, sizeof(err));
        if (st != KVR_OK) {
            fprintf(stderr, "%s\n", err);
            exit(1);
        }
        KVR_CHECK(kvr_cluster_first(cl, KVR_NODE_ROLE_PREFILL) != NULL);
        KVR_CHECK(strstr(cl->model_dir, ".models/tiny") != NULL);
        kvr_cluster_free(cl);
    }
    KVR_CHECK_STATUS(kvr_cluster_load("/nonexistent/c.yaml", &cl, err, sizeof(err)),
                     KVR_ERR_NOT_FOUND);
    KVR_CHECK(strstr(err, "/nonexistent/c.yaml") != NULL);

    const char *hdr = "model: m\nrouter: {client: 'tcp://h:1', node: 'tcp://h:2'}\n";
    char buf[2048];
#define BAD(body, w1, w2)                                                                          \
    do {                                                                                           \
        snprintf(buf, sizeof(buf), "%s%s", hdr, body);                                             \
        check_bad(buf, w1, w2);                                                                    \
    } while (0)
    BAD("nodes:\n  - {name: d, role: decode}\nbogus: 1\n", ":5: key 'bogus'", "unknown top-level");
    BAD("nodes:\n  - {name: d, role: decoder}\n", ":4: key 'nodes[0].role'", "decoder");
    BAD("nodes:\n  - {name: d, role: decode, threads: -2}\n", "nodes[0].threads", "negative");
    BAD("nodes:\n  - {name: d, role: decode, threads: many}\n", "nodes[0].threads",
        "not an integer");
    BAD("nodes:\n  - {name: d, role: decode}\n  - {name: d, role: prefill}\n",
        ":5:", "duplicate node name 'd'");
    BAD("nodes:\n  - {name: d, role: decode, transport: carrier-pigeon}\n", "transport",
        "carrier-pigeon");
    BAD("nodes:\n  - {name: d, role: decode, device: tpu}\n", "device", "tpu");
    BAD("nodes:\n  - {name: d, role: decode, pool_bytes: 1XB}\n", "pool_bytes", "suffix");
    BAD("nodes:\n  - {name: p, role: prefill}\n", "key 'nodes'", "no node has role decode");
    BAD("nodes: []\n", "key 'nodes'", "empty");
    BAD("nodes:\n  - {role: decode}\n", "nodes[0]", "no 'name'");
    BAD("nodes:\n  - {name: d}\n", "role", "missing");
    BAD("nodes:\n  - {name: d, role: decode}\ntimeouts: {heartbeat_ms: 100, "
        "heartbeat_timeout_ms: 50}\n",
        "heartbeat_timeout_ms", "larger");
    BAD("nodes:\n  - {name: d, role: decode}\ntimeouts: {lease: 1}\n", "key 'lease'", "unknown");
    BAD("nodes:\n  - {name: d, role: decode}\nblock_size: 0\n", "block_size", "out of range");
    BAD("nodes:\n  - {name: d, role: decode}\nkv_dtype: fp8\n", "kv_dtype",
        "'fp8' is not a KV dtype");
    BAD("nodes:\n  - {name: d, role: decode}\nlimits: {reservation: lazy}\n", "limits.reservation",
        "'lazy' is not a reservation policy");
    BAD("nodes:\n  - {name: d, role: decode}\nlimits: {prefill_chunk_tokens: -1}\n",
        "limits.prefill_chunk_tokens", "negative");
    /* the decode node's KV keys: defaults and values */
    snprintf(buf, sizeof(buf), "%snodes:\n  - {name: d, role: decode}\n", hdr);
    KVR_CHECK_STATUS(kvr_cluster_parse(buf, strlen(buf), "k.yaml", &cl, err, sizeof(err)), KVR_OK);
    KVR_CHECK(cl->reservation == KVR_RESERVE_PAGED && cl->prefill_chunk_tokens == 0 &&
              cl->reservation_headroom_blocks == 2);
    KVR_CHECK(!strcmp(cl->kv_dtype, "f32")); /* the default */
    kvr_cluster_free(cl);
    snprintf(buf, sizeof(buf),
             "%snodes:\n  - {name: d, role: decode}\nlimits: {reservation: whole, "
             "prefill_chunk_tokens: 256, reservation_headroom_blocks: 0}\n",
             hdr);
    KVR_CHECK_STATUS(kvr_cluster_parse(buf, strlen(buf), "k.yaml", &cl, err, sizeof(err)), KVR_OK);
    KVR_CHECK(cl->reservation == KVR_RESERVE_WHOLE && cl->prefill_chunk_tokens == 256 &&
              cl->reservation_headroom_blocks == 0);
    kvr_cluster_free(cl);
    /* kvrail up's restart policy per node (owner: harness) */
    snprintf(buf, sizeof(buf),
             "%snodes:\n  - {name: d, role: decode}\n  - {name: p, role: prefill, restart: "
             "always, restart_max: 0}\n  - {name: q, role: prefill, restart: never}\n",
             hdr);
    KVR_CHECK_STATUS(kvr_cluster_parse(buf, strlen(buf), "r.yaml", &cl, err, sizeof(err)), KVR_OK);
    KVR_CHECK(kvr_cluster_find(cl, "d")->restart == KVR_RESTART_ON_FAILURE &&
              kvr_cluster_find(cl, "d")->restart_max == 5);
    KVR_CHECK(kvr_cluster_find(cl, "p")->restart == KVR_RESTART_ALWAYS &&
              kvr_cluster_find(cl, "p")->restart_max == 0);
    KVR_CHECK(kvr_cluster_find(cl, "q")->restart == KVR_RESTART_NEVER);
    kvr_cluster_free(cl);
    BAD("nodes:\n  - {name: d, role: decode, restart: sometimes}\n", "nodes[0].restart",
        "'sometimes' is not a restart policy");
    BAD("nodes:\n  - {name: d, role: decode, restart_max: 1001}\n", "nodes[0].restart_max",
        "out of range");
    BAD("nodes:\n  - {name: d, role: decode}\nnodes: [\n", "YAML syntax error", NULL);
    BAD("", "key 'nodes'", "missing");
    check_bad("router: {client: 'http://x', node: 'tcp://h:2'}\nmodel: m\nnodes: []\n",
              ":1: key 'router.client'", "not a ZeroMQ endpoint");
    check_bad("model: m\nnodes:\n  - {name: d, role: decode}\n", "key 'router'", "missing");
    check_bad("router: {client: 'tcp://h:1', node: 'tcp://h:2'}\nnodes:\n  - {name: d, role: "
              "decode}\n",
              "key 'model'", "missing");
    check_bad("", "empty", NULL);
    check_bad("- a\n- b\n", "expected a mapping", NULL);
    printf("cluster: ok\n");
    return 0;
}
