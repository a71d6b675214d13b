/*
 * router_badinput.c - a real kvrail-router (started here as a process) fed
 * bad input at both endpoints by raw ZeroMQ peers, while a well-behaved
 * client (libkvrail-client) keeps being answered between every bad message.
 *
 * Client endpoint: garbage frames, a truncated envelope, a wrong protocol
 * version, an unknown method, a node method, a garbage payload, extra
 * frames, a prompt longer than the model's context, token ids outside the
 * vocabulary, max_tokens 0 and huge, invalid sampling values -> each gets an
 * error frame with the right status and a message naming what was wrong.
 * Node endpoint: garbage, a message before registering, a node name not in
 * the cluster file, a layout that disagrees with the file (block size).
 * Then a raw peer registers as decode node "decode0" and the test checks the
 * Reserve the router sends for a queued request (token ids, chained block
 * hashes, lease), that a Rejected reaches the client as an error, and that a
 * gap in block-event sequence numbers makes the router ask for a resync
 * whose dump then shows in the directory.  The router's counters must have
 * seen every bad frame and request.
 *
 * usage: router_badinput PATH/TO/kvrail-router
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.h>

#include "kvr_blockhash.h"
#include "kvr_client.h"
#include "kvr_clock.h"
#include "kvr_proto.h"
#include "kvr_test.h"

static void *zctx;
static kvr_client_t *good;
static char client_ep[64], node_ep[64];

static void *dealer(const char *ep, const char *id)
{
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    if (id)
        zmq_setsockopt(s, ZMQ_ROUTING_ID, id, strlen(id));
    KVR_CHECK(zmq_connect(s, ep) == 0);
    return s;
}

static void send_parts(void *s, int n, const void *const *parts, const size_t *lens)
{
    for (int i = 0; i < n; i++)
        KVR_CHECK(zmq_send(s, parts[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

static void send_msg(void *s, unsigned method, uint64_t call, const ProtobufCMessage *m)
{
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, (uint16_t)method, call};
    KVR_CHECK_STATUS(kvr_proto_send(s, NULL, 0, &h, m), KVR_OK);
}

static bool recv_frame(void *s, int timeout_ms, kvr_proto_frame_t *f)
{
    uint64_t dl = kvr_deadline_ns(timeout_ms);
    for (;;) {
        char err[256];
        kvr_status_t st = kvr_proto_recv(s, false, f, err, sizeof(err));
        if (st == KVR_OK)
            return true;
        KVR_CHECK(st == KVR_ERR_NO_RESOURCE);
        if (kvr_now_ns() > dl)
            return false;
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        zmq_poll(&it, 1, 50);
    }
}

/* Receives the next frame of method `method` (others are skipped). */
static bool recv_method(void *s, unsigned method, int timeout_ms, kvr_proto_frame_t *f)
{
    uint64_t dl = kvr_deadline_ns(timeout_ms);
    while (kvr_now_ns() < dl) {
        if (!recv_frame(s, 100, f))
            continue;
        if (f->hdr.method == method)
            return true;
        kvr_proto_frame_clear(f);
    }
    return false;
}

/* Expects an ERROR|END frame for call `call` with status `code` and a
 * message containing `what`. */
static void expect_error(void *s, uint64_t call, kvr_status_t code, const char *what)
{
    kvr_proto_frame_t f;
    if (!recv_frame(s, 3000, &f)) {
        fprintf(stderr, "no reply for call %llu (want %s '%s')\n", (unsigned long long)call,
                kvr_status_name(code), what);
        exit(1);
    }
    KVR_CHECK_EQ(f.hdr.call_id, call);
    KVR_CHECK_EQ(f.hdr.flags, KVR_PROTO_F_END | KVR_PROTO_F_ERROR);
    ProtobufCMessage *m = NULL;
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, NULL, 0), KVR_OK);
    Kvrail__Status *st = (Kvrail__Status *)m;
    if (st->code != code || !strstr(st->message, what)) {
        fprintf(stderr, "call %llu: got %s '%s', want %s '%s'\n", (unsigned long long)call,
                kvr_status_name(st->code), st->message, kvr_status_name(code), what);
        exit(1);
    }
    printf("  ok: call %llu -> %s: %s\n", (unsigned long long)call, kvr_status_name(code),
           st->message);
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
}

static struct kvr_cluster_status cs;

/* The well-behaved client is served between every bad message. */
static void good_client_served(void)
{
    uint64_t t0 = kvr_now_ns();
    KVR_CHECK_STATUS(kvr_client_status(good, 3000, &cs), KVR_OK);
    KVR_CHECK_STATUS(kvr_client_ping(good, 3000), KVR_OK);
    KVR_CHECK(kvr_now_ns() - t0 < 2000000000ull);
}

/* Status until field reaches want (messages on the node socket may still be
 * in flight when the client's Status arrives). */
#define WAIT_STATUS(field, want)                                                                   \
    do {                                                                                           \
        uint64_t _dl = kvr_deadline_ns(3000);                                                      \
        do {                                                                                       \
            good_client_served();                                                                  \
        } while (cs.field != (want) && kvr_now_ns() < _dl);                                        \
        KVR_CHECK_EQ(cs.field, want);                                                              \
    } while (0)

static void gen(void *s, uint64_t call, const uint32_t *ids, size_t n, uint32_t max_tokens,
                float temp, float top_p)
{
    Kvrail__GenerateRequest g = KVRAIL__GENERATE_REQUEST__INIT;
    Kvrail__SamplingParams sp = KVRAIL__SAMPLING_PARAMS__INIT;
    sp.temperature = temp;
    sp.top_p = top_p;
    g.sampling = &sp;
    g.token_ids = (uint32_t *)ids;
    g.n_token_ids = n;
    g.max_tokens = max_tokens;
    send_msg(s, KVRAIL__METHOD__GENERATE, call, &g.base);
}

static void client_endpoint_cases(void)
{
    printf("client endpoint:\n");
    void *bad = dealer(client_ep, "bad-client");
    uint8_t env[KVR_PROTO_HDR_LEN];
    const char *junk = "\x16\x03\x01 this is not kvrail";
    const void *p1[] = {junk};
    size_t l1[] = {strlen(junk)};
    send_parts(bad, 1, p1, l1);
    expect_error(bad, 0, KVR_ERR_CORRUPT, "envelope is");
    good_client_served();

    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__STATUS, 10};
    kvr_proto_hdr_pack(&h, env);
    const void *p2[] = {env, ""};
    size_t l2[] = {7, 0};
    send_parts(bad, 2, p2, l2);
    expect_error(bad, 0, KVR_ERR_CORRUPT, "envelope is 7 bytes");

    h = (kvr_proto_hdr_t){9, 0, KVRAIL__METHOD__STATUS, 11};
    kvr_proto_hdr_pack(&h, env);
    l2[0] = sizeof(env);
    send_parts(bad, 2, p2, l2);
    expect_error(bad, 11, KVR_ERR_VERSION, "protocol version 9");
    good_client_served();

    h = (kvr_proto_hdr_t){KVR_PROTO_VERSION, 0, 999, 12};
    kvr_proto_hdr_pack(&h, env);
    send_parts(bad, 2, p2, l2);
    expect_error(bad, 12, KVR_ERR_UNSUPPORTED, "unknown method 999");

    h = (kvr_proto_hdr_t){KVR_PROTO_VERSION, 0, KVRAIL__METHOD__GENERATE, 13};
    kvr_proto_hdr_pack(&h, env);
    const uint8_t garbage[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 'x'};
    const void *p3[] = {env, garbage};
    size_t l3[] = {sizeof(env), sizeof(garbage)};
    send_parts(bad, 2, p3, l3);
    expect_error(bad, 13, KVR_ERR_INVALID, "kvrail.GenerateRequest");
    good_client_served();

    const void *p4[] = {env, "", "extra"};
    size_t l4[] = {sizeof(env), 0, 5};
    h.call_id = 14;
    kvr_proto_hdr_pack(&h, env);
    send_parts(bad, 3, p4, l4);
    expect_error(bad, 14, KVR_ERR_CORRUPT, "3 frames");

    Kvrail__RegisterRequest rq = KVRAIL__REGISTER_REQUEST__INIT;
    send_msg(bad, KVRAIL__METHOD__REGISTER, 15, &rq.base);
    expect_error(bad, 15, KVR_ERR_UNSUPPORTED, "node service");

    uint32_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = (uint32_t)(i % 200) + 1;
    gen(bad, 20, ids, 100, 4, 0, 0); /* context is 64 */
    expect_error(bad, 20, KVR_ERR_INVALID, "context is 64 tokens");
    gen(bad, 21, ids, 60, 10, 0, 0);
    expect_error(bad, 21, KVR_ERR_INVALID, "exceeds the model's context");
    gen(bad, 22, ids, 8, 0, 0, 0);
    expect_error(bad, 22, KVR_ERR_INVALID, "max_tokens is 0");
    gen(bad, 23, ids, 8, 1u << 30, 0, 0);
    expect_error(bad, 23, KVR_ERR_INVALID, "exceeds the limit");
    good_client_served();
    gen(bad, 24, ids, 8, 4, -1.0f, 0);
    expect_error(bad, 24, KVR_ERR_INVALID, "temperature");
    gen(bad, 25, ids, 8, 4, NAN, 0);
    expect_error(bad, 25, KVR_ERR_INVALID, "temperature");
    gen(bad, 26, ids, 8, 4, 0.5f, 5.0f);
    expect_error(bad, 26, KVR_ERR_INVALID, "top_p");
    uint32_t oov[3] = {1, 5000, 2};
    gen(bad, 27, oov, 3, 4, 0, 0);
    expect_error(bad, 27, KVR_ERR_INVALID, "vocabulary");
    gen(bad, 28, NULL, 0, 4, 0, 0);
    expect_error(bad, 28, KVR_ERR_INVALID, "prompt is empty");
    good_client_served();
    zmq_close(bad);
}

/* 3000 messages of random parts (some with a valid envelope and random
 * method, flags and payload); the router must stay up and keep serving. */
static void random_frames(const char *ep)
{
    void *s = dealer(ep, NULL);
    uint64_t x = 0x243f6a8885a308d3ull;
    uint8_t buf[300];
    for (int i = 0; i < 3000; i++) {
        int parts = 1 + (int)(x % 4);
        for (int k = 0; k < parts; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            size_t len = (size_t)(x >> 33) % sizeof(buf);
            for (size_t j = 0; j < len; j++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                buf[j] = (uint8_t)(x >> 56);
            }
            if (k == 0 && (x & 1)) { /* a valid envelope, random method/flags/call */
                kvr_proto_hdr_t h = {KVR_PROTO_VERSION, (uint8_t)(x >> 8),
                                     (uint16_t)((x >> 16) % 32), x >> 24};
                kvr_proto_hdr_pack(&h, buf);
                len = KVR_PROTO_HDR_LEN;
            }
            zmq_send(s, buf, len, (k + 1 < parts ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT);
        }
    }
    good_client_served();
    zmq_close(s);
    printf("  ok: 3000 random messages to %s, router still serving (bad frames so far %llu)\n", ep,
           (unsigned long long)cs.bad_frames);
}

static void node_endpoint_cases(void **decode_p)
{
    printf("node endpoint:\n");
    void *n = dealer(node_ep, "decode0");
    const char *junk = "garbage";
    const void *p1[] = {junk, junk};
    size_t l1[] = {7, 7};
    send_parts(n, 2, p1, l1);
    expect_error(n, 0, KVR_ERR_CORRUPT, "envelope is 7 bytes");

    Kvrail__Token t = KVRAIL__TOKEN__INIT;
    t.request_id = 1;
    send_msg(n, KVRAIL__METHOD__TOKEN, 30, &t.base);
    expect_error(n, 30, KVR_ERR_NOT_FOUND, "not registered");
    good_client_served();

    Kvrail__RegisterRequest rq = KVRAIL__REGISTER_REQUEST__INIT;
    Kvrail__KvLayout lay = KVRAIL__KV_LAYOUT__INIT;
    lay.layers = 2;
    lay.kv_heads = 2;
    lay.head_dim = 8;
    lay.block_size = 8; /* the file says 16 */
    lay.dtype = "f32";
    lay.max_context = 64;
    lay.vocab_size = 300;
    rq.node_name = "decode0";
    rq.role = KVRAIL__ROLE__ROLE_DECODE;
    rq.model_fingerprint = "test-model";
    rq.layout = &lay;
    rq.transport = "loop";
    rq.total_blocks = 4;
    rq.protocol_version = KVR_PROTO_VERSION;
    rq.incarnation = 77;
    send_msg(n, KVRAIL__METHOD__REGISTER, 31, &rq.base);
    expect_error(n, 31, KVR_ERR_MISMATCH, "block size 8");

    void *intruder = dealer(node_ep, "intruder");
    rq.node_name = "intruder";
    lay.block_size = 16;
    send_msg(intruder, KVRAIL__METHOD__REGISTER, 32, &rq.base);
    expect_error(intruder, 32, KVR_ERR_NOT_FOUND, "not a prefill/decode node");
    zmq_close(intruder);

    rq.node_name = "prefill0"; /* routing id decode0, name prefill0 */
    send_msg(n, KVRAIL__METHOD__REGISTER, 33, &rq.base);
    expect_error(n, 33, KVR_ERR_INVALID, "differs from routing id");
    good_client_served();

    rq.node_name = "decode0";
    send_msg(n, KVRAIL__METHOD__REGISTER, 34, &rq.base);
    kvr_proto_frame_t f;
    KVR_CHECK(recv_frame(n, 3000, &f));
    KVR_CHECK_EQ(f.hdr.call_id, 34);
    KVR_CHECK_EQ(f.hdr.flags & KVR_PROTO_F_ERROR, 0);
    ProtobufCMessage *m = NULL;
    KVR_CHECK_STATUS(kvr_proto_decode(&f, &kvrail__register_reply__descriptor, &m, NULL, 0),
                     KVR_OK);
    KVR_CHECK_EQ(((Kvrail__RegisterReply *)m)->heartbeat_timeout_ms, 3000);
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
    printf("  ok: decode0 registered\n");
    *decode_p = n;
}

static void heartbeat(void *n, uint32_t free_blocks, uint64_t seq)
{
    Kvrail__Heartbeat hb = KVRAIL__HEARTBEAT__INIT;
    hb.node_name = "decode0";
    hb.free_blocks = free_blocks;
    hb.total_blocks = 4;
    hb.incarnation = 77;
    hb.block_event_seq = seq;
    send_msg(n, KVRAIL__METHOD__HEARTBEAT, 0, &hb.base);
}

static void dispatch_cases(void *n)
{
    printf("dispatch through a registered decode node:\n");
    heartbeat(n, 4, 0);
    /* 40 tokens = 2 full blocks + 8; no prefill node is alive: local prefill */
    uint32_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = (uint32_t)(i * 7 % 250) + 1;
    struct kvr_gen_params p;
    kvr_gen_params_default(&p);
    p.token_ids = ids;
    p.n_token_ids = 40;
    p.max_tokens = 4;
    kvr_gen_stream_t *s = NULL;
    KVR_CHECK_STATUS(kvr_client_generate_start(good, &p, &s), KVR_OK);
    kvr_proto_frame_t f;
    KVR_CHECK(recv_method(n, KVRAIL__METHOD__RESERVE, 3000, &f));
    ProtobufCMessage *m = NULL;
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, NULL, 0), KVR_OK);
    Kvrail__Reserve *r = (Kvrail__Reserve *)m;
    KVR_CHECK_EQ(r->n_token_ids, 40);
    KVR_CHECK(!memcmp(r->token_ids, ids, sizeof(ids)));
    KVR_CHECK(r->local_prefill); /* no prefill node registered */
    /* the node hashes its own prompt blocks (Reserve carries no hashes) */
    uint64_t want[4];
    size_t nh = 0;
    KVR_CHECK_STATUS(kvr_blockhash_seq(ids, 40, 16, want, 4, &nh), KVR_OK);
    KVR_CHECK_EQ(nh, 2);
    KVR_CHECK_EQ(r->lease_ms, 10000);
    KVR_CHECK_EQ(r->max_tokens, 4);
    KVR_CHECK(r->sampling && r->sampling->has_seed);
    uint64_t rid = r->request_id;
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
    printf("  ok: Reserve{40 tokens, local prefill}\n");

    /* a reply for a request that does not exist is dropped; then reject */
    Kvrail__Rejected rj = KVRAIL__REJECTED__INIT;
    Kvrail__Status rs = KVRAIL__STATUS__INIT;
    rs.code = KVR_ERR_INVALID;
    rs.message = "test rejects this";
    rj.reason = &rs;
    rj.request_id = rid + 1000;
    send_msg(n, KVRAIL__METHOD__REJECTED, 0, &rj.base);
    rj.request_id = rid;
    send_msg(n, KVRAIL__METHOD__REJECTED, 0, &rj.base);
    struct kvr_gen_token tok;
    KVR_CHECK_STATUS(kvr_gen_stream_next(s, 3000, &tok), KVR_ERR_CLOSED);
    const struct kvr_gen_result *res = kvr_gen_stream_result(s);
    KVR_CHECK_EQ(res->status, KVR_ERR_INVALID);
    KVR_CHECK(strstr(res->message, "test rejects this"));
    printf("  ok: Rejected -> client error: %s\n", res->message);
    kvr_gen_stream_destroy(s);

    /* a token stream through the router: Reserve -> tokens -> StreamEnd */
    heartbeat(n, 4, 0);
    KVR_CHECK_STATUS(kvr_client_generate_start(good, &p, &s), KVR_OK);
    KVR_CHECK(recv_method(n, KVRAIL__METHOD__RESERVE, 3000, &f));
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, NULL, 0), KVR_OK);
    rid = ((Kvrail__Reserve *)m)->request_id;
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
    Kvrail__Reserved rd = KVRAIL__RESERVED__INIT;
    uint32_t blocks[3] = {0, 1, 2};
    rd.request_id = rid;
    rd.block_ids = blocks;
    rd.n_block_ids = 3;
    send_msg(n, KVRAIL__METHOD__RESERVED, 0, &rd.base);
    for (uint32_t i = 0; i < 6; i++) { /* index 1 sent twice: dropped once */
        Kvrail__Token t = KVRAIL__TOKEN__INIT;
        t.request_id = rid;
        t.index = i < 2 ? i : i - 1;
        t.token_id = 100 + t.index;
        t.logprob = -0.5f;
        send_msg(n, KVRAIL__METHOD__TOKEN, 0, &t.base);
    }
    for (uint32_t i = 0; i < 4; i++) {
        KVR_CHECK_STATUS(kvr_gen_stream_next(s, 3000, &tok), KVR_OK);
        KVR_CHECK_EQ(tok.index, i);
        KVR_CHECK_EQ(tok.token_id, 100 + i);
        KVR_CHECK_EQ(tok.finish, i == 3 ? KVR_FINISH_LENGTH : KVR_FINISH_NONE);
    }
    KVR_CHECK_STATUS(kvr_gen_stream_next(s, 3000, &tok), KVR_ERR_CLOSED);
    res = kvr_gen_stream_result(s);
    KVR_CHECK_STATUS(res->status, KVR_OK);
    KVR_CHECK_EQ(res->completion_tokens, 4);
    KVR_CHECK(!strcmp(res->decode_node, "decode0"));
    KVR_CHECK(res->local_prefill);
    kvr_gen_stream_destroy(s);
    /* the router ended it at max_tokens and tells the node */
    KVR_CHECK(recv_method(n, KVRAIL__METHOD__NODE_CANCEL, 3000, &f));
    kvr_proto_frame_clear(&f);
    printf("  ok: 4 tokens streamed in order (duplicate dropped), LENGTH, NodeCancel sent\n");

    /* a client that disconnects while its request waits for the prefill:
     * the router sees the connection close and cancels the node's half */
    heartbeat(n, 4, 0);
    void *leaver = dealer(client_ep, "leaver");
    gen(leaver, 50, ids, 40, 4, 0, 0);
    KVR_CHECK(recv_method(n, KVRAIL__METHOD__RESERVE, 3000, &f));
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, NULL, 0), KVR_OK);
    rid = ((Kvrail__Reserve *)m)->request_id;
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
    zmq_close(leaver); /* the connection closes; no Cancel is sent */
    KVR_CHECK(recv_method(n, KVRAIL__METHOD__NODE_CANCEL, 3000, &f));
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, NULL, 0), KVR_OK);
    KVR_CHECK_EQ(((Kvrail__NodeCancel *)m)->request_id, rid);
    KVR_CHECK(strstr(((Kvrail__NodeCancel *)m)->reason->message, "disconnected"));
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
    WAIT_STATUS(client_disconnects, 1);
    printf("  ok: client disconnect -> NodeCancel to decode0\n");

    /* block events: seq 1 ok, then a gap (3) -> RESYNC request */
    heartbeat(n, 4, 0);
    Kvrail__BlockEvent ev = KVRAIL__BLOCK_EVENT__INIT;
    Kvrail__BlockEvent *evp[1] = {&ev};
    Kvrail__BlockEvents be = KVRAIL__BLOCK_EVENTS__INIT;
    be.node_name = "decode0";
    be.events = evp;
    be.n_events = 1;
    ev.seq = 1;
    ev.kind = KVRAIL__BLOCK_EVENT__KIND__STORED;
    ev.block_hashes = want;
    ev.n_block_hashes = 2;
    send_msg(n, KVRAIL__METHOD__BLOCK_EVENTS, 0, &be.base);
    WAIT_STATUS(directory_blocks, 2);
    ev.seq = 3;
    send_msg(n, KVRAIL__METHOD__BLOCK_EVENTS, 0, &be.base);
    KVR_CHECK(recv_method(n, KVRAIL__METHOD__RESYNC, 3000, &f));
    kvr_proto_frame_clear(&f);
    Kvrail__ResyncDump d = KVRAIL__RESYNC_DUMP__INIT;
    uint64_t dump[3] = {want[0], want[1], 12345};
    d.node_name = "decode0";
    d.seq = 3;
    d.block_hashes = dump;
    d.n_block_hashes = 3;
    send_msg(n, KVRAIL__METHOD__RESYNC, 0, &d.base);
    WAIT_STATUS(directory_blocks, 3);
    KVR_CHECK_EQ(cs.resyncs, 1);
    printf("  ok: gap in block events -> resync -> directory has the dump's 3 blocks\n");

    /* a prefix-sharing request now gets cached credit; reject with NO_RESOURCE -> queued ->
     * overload */
    heartbeat(n, 4, 3);
    KVR_CHECK_STATUS(kvr_client_generate_start(good, &p, &s), KVR_OK);
    KVR_CHECK(recv_method(n, KVRAIL__METHOD__RESERVE, 3000, &f));
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, NULL, 0), KVR_OK);
    rj.request_id = ((Kvrail__Reserve *)m)->request_id;
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
    rs.code = KVR_ERR_NO_RESOURCE;
    rs.message = "pool full";
    send_msg(n, KVRAIL__METHOD__REJECTED, 0, &rj.base);
    heartbeat(n, 0, 3); /* still alive, no room */
    uint64_t t0 = kvr_now_ns();
    KVR_CHECK_STATUS(kvr_gen_stream_next(s, 5000, &tok), KVR_ERR_CLOSED);
    res = kvr_gen_stream_result(s);
    KVR_CHECK_EQ(res->status, KVR_ERR_OVERLOAD);
    KVR_CHECK(strstr(res->message, "queue_ms"));
    KVR_CHECK(kvr_now_ns() - t0 >= 300000000ull); /* waited the queue timeout */
    printf("  ok: pool full -> queued -> %s\n", res->message);
    kvr_gen_stream_destroy(s);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: %s PATH/TO/kvrail-router\n", argv[0]);
        return 2;
    }
    char dir[200];
    KVR_CHECK(kvr_test_mkdtemp(dir, sizeof dir, "kvr-badinput"));
    char path[512];
    snprintf(path, sizeof(path), "%s/model", dir);
    KVR_CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof(path), "%s/model/config.json", dir);
    FILE *f = fopen(path, "w");
    KVR_CHECK(f);
    fprintf(f, "{\"max_position_embeddings\": 64, \"vocab_size\": 300}\n");
    fclose(f);
    int port = 20000 + (int)(getpid() % 20000);
    snprintf(client_ep, sizeof(client_ep), "tcp://127.0.0.1:%d", port);
    snprintf(node_ep, sizeof(node_ep), "tcp://127.0.0.1:%d", port + 1);
    char cfg[256];
    snprintf(cfg, sizeof(cfg), "%s/cluster.yaml", dir);
    f = fopen(cfg, "w");
    KVR_CHECK(f);
    fprintf(f,
            "model: model\nblock_size: 16\nrouter: {client: '%s', node: '%s'}\n"
            "timeouts: {queue_ms: 400, heartbeat_ms: 1000, heartbeat_timeout_ms: 3000}\n"
            "limits: {max_tokens: 1000}\n"
            "nodes:\n  - {name: router, role: router}\n  - {name: prefill0, role: prefill}\n"
            "  - {name: decode0, role: decode}\n",
            client_ep, node_ep);
    fclose(f);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
        execl(argv[1], argv[1], "--config", cfg, "--log-level",
              getenv("KVR_TEST_LOG") ? getenv("KVR_TEST_LOG") : "info", (char *)NULL);
        _exit(127);
    }
    zctx = zmq_ctx_new();
    KVR_CHECK_STATUS(kvr_client_connect(client_ep, &good), KVR_OK);
    uint64_t dl = kvr_deadline_ns(10000);
    while (kvr_client_ping(good, 200) != KVR_OK) {
        int ws;
        if (waitpid(pid, &ws, WNOHANG) == pid) {
            fprintf(stderr, "kvrail-router exited early (status %d)\n", ws);
            return 1;
        }
        KVR_CHECK(kvr_now_ns() < dl);
    }
    client_endpoint_cases();
    random_frames(client_ep);
    random_frames(node_ep);
    void *n = NULL;
    node_endpoint_cases(&n);
    dispatch_cases(n);

    good_client_served();
    printf("router counters: bad_frames %llu, bad_requests %llu, overloaded %llu\n",
           (unsigned long long)cs.bad_frames, (unsigned long long)cs.bad_requests,
           (unsigned long long)cs.overloaded);
    KVR_CHECK(cs.bad_frames >= 9);
    usleep(1100000); /* the router reports the log lines it suppressed */
    KVR_CHECK(cs.bad_requests >= 11);
    KVR_CHECK_EQ(cs.overloaded, 1);
    KVR_CHECK_EQ(cs.completed, 1);
    zmq_close(n);
    kvr_client_close(good);
    zmq_ctx_term(zctx);

    /* the router is still alive after all this, and stops cleanly on SIGTERM */
    int ws;
    KVR_CHECK(waitpid(pid, &ws, WNOHANG) == 0);
    kill(pid, SIGTERM);
    dl = kvr_deadline_ns(5000);
    while (waitpid(pid, &ws, WNOHANG) == 0) {
        KVR_CHECK(kvr_now_ns() < dl);
        usleep(10000);
    }
    KVR_CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    kvr_test_rmtree(dir);
    printf("router_badinput: ok\n");
    return 0;
}
