/*
 * fuzz_router.c - fuzz target over kvrail-router's frame handling: the
 * envelope parser, the payload decoders of every method, and the client and
 * node endpoints driven as a state machine (registrations, heartbeats,
 * Generate, Reserved, PrefillDone, Token, BlockEvents, resync dumps, cancels,
 * timers), with the router's own modules (router_core) on real ZeroMQ ROUTER
 * sockets bound to inproc endpoints nobody connects to (so every send is
 * refused as a gone peer, which is exercised too).
 *
 * An input is a list of records; each record is
 *   op (1 byte): bits 0-1: 0 client frame, 1 node frame, 2 advance the
 *                clock by (byte 1) x 50 ms and run the timers, 3 the same
 *   route (1 byte): index into the routes below (node names, client ids,
 *                   strangers)
 *   envelope (16 bytes): as on the wire (magic, version, flags, method,
 *                        call id), parsed by kvr_proto_hdr_unpack
 *   length (2 bytes, little-endian), then that many payload bytes (cut at
 *                                    the end of the input)
 * The router state is made afresh for every input.  Built two ways: with
 * libFuzzer (tests/fuzz/libfuzzer.sh, clang -fsanitize=fuzzer,address,
 * undefined) and as a plain driver over the seed corpus (fuzz_main.c).
 * mkseeds.c writes the seed corpus.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvr_clock.h"
#include "kvr_log.h"
#include "router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char cluster_yaml[] = "cluster: fuzz\n"
                                   "model: /nonexistent-model\n"
                                   "block_size: 16\n"
                                   "router:\n"
                                   "  client: inproc://fuzz-client\n"
                                   "  node: inproc://fuzz-node\n"
                                   "timeouts:\n"
                                   "  heartbeat_ms: 100\n"
                                   "  heartbeat_timeout_ms: 300\n"
                                   "  queue_ms: 1000\n"
                                   "  prefill_ms: 2000\n"
                                   "  request_ms: 5000\n"
                                   "limits:\n"
                                   "  max_queue: 8\n"
                                   "  max_tokens: 64\n"
                                   "nodes:\n"
                                   "  - name: router\n"
                                   "    role: router\n"
                                   "  - name: prefill0\n"
                                   "    role: prefill\n"
                                   "  - name: decode0\n"
                                   "    role: decode\n"
                                   "    pool_blocks: 64\n"
                                   "  - name: decode1\n"
                                   "    role: decode\n"
                                   "    pool_blocks: 64\n";

static const char *const routes[] = {"prefill0", "decode0", "decode1", "client-a",
                                     "client-b", "router",  "",        "decode0\0x"};
static const size_t route_lens[] = {8, 7, 7, 8, 8, 6, 0, 9};

static struct {
    bool ready;
    kvr_cluster_t *cl;
    void *zctx, *client_sock, *node_sock, *mon_sock;
} g;

static void *bound_router(const char *ep)
{
    void *s = zmq_socket(g.zctx, ZMQ_ROUTER);
    int one = 1, zero = 0;
    zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(s, ep) != 0) {
        fprintf(stderr, "fuzz_router: bind %s: %s\n", ep, zmq_strerror(zmq_errno()));
        abort();
    }
    return s;
}

static void setup_once(void)
{
    if (g.ready)
        return;
    kvr_log_set_level(KVR_LOG_ERROR); /* quiet: bad input is logged by design */
    char err[512];
    if (kvr_cluster_parse(cluster_yaml, sizeof(cluster_yaml) - 1, "/tmp/fuzz.yaml", &g.cl, err,
                          sizeof(err)) != KVR_OK) {
        fprintf(stderr, "fuzz_router: cluster: %s\n", err);
        abort();
    }
    g.zctx = zmq_ctx_new();
    g.client_sock = bound_router("inproc://fuzz-client");
    g.node_sock = bound_router("inproc://fuzz-node");
    g.mon_sock = zmq_socket(g.zctx, ZMQ_PAIR); /* nothing connects: no events */
    g.ready = true;
}

static uint16_t le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    static rt_t rt;
    rt_t *r = &rt;
    memset(r, 0, sizeof(*r));
    r->cl = g.cl;
    r->zctx = g.zctx;
    r->client_sock = g.client_sock;
    r->node_sock = g.node_sock;
    r->mon_sock = g.mon_sock;
    r->context = 512;
    r->vocab = 1000;
    r->rng = 42;
    r->next_deadline = UINT64_MAX;
    if (rt_registry_init(r) != KVR_OK || !rt_requests_init(r))
        abort();
    uint64_t now = kvr_now_ns();
    r->start_ns = now;
    size_t pos = 0;
    while (pos + 2 <= size) {
        uint8_t op = data[pos] & 3, sel = data[pos + 1];
        pos += 2;
        if (op >= 2) {
            now += (uint64_t)sel * 50000000ull;
            rt_loop_timers(r, now);
            continue;
        }
        if (pos + KVR_PROTO_HDR_LEN + 2 > size)
            break;
        kvr_proto_frame_t f;
        memset(&f, 0, sizeof(f));
        f.src_fd = sel >> 4;
        size_t ri = sel % (sizeof(routes) / sizeof(routes[0]));
        memcpy(f.route, routes[ri], route_lens[ri]);
        f.route_len = route_lens[ri];
        char err[512] = "";
        kvr_status_t st =
            kvr_proto_hdr_unpack(data + pos, KVR_PROTO_HDR_LEN, &f.hdr, err, sizeof(err));
        f.have_hdr = st == KVR_OK || st == KVR_ERR_VERSION || st == KVR_ERR_UNSUPPORTED;
        f.nparts = 2;
        pos += KVR_PROTO_HDR_LEN;
        size_t len = le16(data + pos);
        pos += 2;
        if (len > size - pos)
            len = size - pos;
        if (len && st == KVR_OK) {
            /* a copy of its own, as kvr_proto_recv makes, so ASan sees any
             * read past the payload */
            f.payload = malloc(len);
            memcpy(f.payload, data + pos, len);
            f.payload_len = len;
        }
        pos += len;
        rt_loop_frame(r, op == 0 ? r->client_sock : r->node_sock, op == 0, &f, st, err, now);
        kvr_proto_frame_clear(&f);
        /* the bounds on what peers feed the router hold after every frame */
        for (int i = 0; i < r->n_nodes; i++) {
            const struct rt_node *n = &r->nodes[i];
            if (n->n_ev_buf > 4096 || n->ev_buf_bytes > RT_HELD_EVENT_BYTES ||
                rt_dir_node_blocks(&r->dir, i) > r->dir.limit[i])
                abort();
        }
        if (r->n_queued > r->cl->max_queue)
            abort();
    }
    rt_requests_fini(r);
    rt_registry_fini(r);
    return 0;
}
