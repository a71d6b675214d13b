/*
 * test_decode_node.c - kvrail-decode driven through its node protocol by
 * this test acting as the router (a real ZeroMQ ROUTER socket, the real
 * decode binary, the generated tiny model, the loop transport):
 * registration, bad frames, every Reserve rejection (named), a local
 * prefill streaming to its end with its block events, prefix reuse, lease
 * expiry, pool exhaustion, cancel with quarantine, resync and heartbeats.
 *
 *   test_decode_node KVRAIL_DECODE KVRAIL_MKMODEL
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.h>

#include "blocktab.h"
#include "kvr_blockhash.h"
#include "kvr_clock.h"
#include "kvr_proto.h"
#include "kvr_test.h"

static void *g_sock;
static pid_t g_child;

static void kill_child(void)
{
    if (g_child > 0)
        kill(g_child, SIGKILL);
}
static uint8_t g_route[KVR_PROTO_MAX_ROUTE];
static size_t g_route_len;
static uint64_t g_last_seq;
static uint32_t g_stored;

/* Waits up to ms for a message of `method` (others are handled or
 * dropped); returns it unpacked or NULL on timeout. */
static ProtobufCMessage *expect(unsigned method, int ms)
{
    uint64_t deadline = kvr_deadline_ns(ms);
    while (kvr_now_ns() < deadline) {
        zmq_pollitem_t it = {g_sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) <= 0)
            continue;
        kvr_proto_frame_t f;
        char err[256];
        kvr_status_t s = kvr_proto_recv(g_sock, true, &f, err, sizeof err);
        if (s != KVR_OK) {
            kvr_proto_frame_clear(&f);
            continue;
        }
        memcpy(g_route, f.route, f.route_len);
        g_route_len = f.route_len;
        unsigned m = f.hdr.method;
        ProtobufCMessage *msg = NULL;
        const ProtobufCMessageDescriptor *d =
            m == KVRAIL__METHOD__RESYNC ? &kvrail__resync_dump__descriptor : NULL;
        KVR_CHECK_STATUS(kvr_proto_decode(&f, d, &msg, err, sizeof err), KVR_OK);
        kvr_proto_frame_clear(&f);
        if (m == KVRAIL__METHOD__BLOCK_EVENTS) {
            Kvrail__BlockEvents *be = (Kvrail__BlockEvents *)msg;
            for (size_t i = 0; i < be->n_events; i++) {
                KVR_CHECK(be->events[i]->seq == g_last_seq + 1); /* no gaps */
                g_last_seq = be->events[i]->seq;
                if (be->events[i]->kind == KVRAIL__BLOCK_EVENT__KIND__STORED)
                    g_stored += (uint32_t)be->events[i]->n_block_hashes;
                else
                    g_stored -= (uint32_t)be->events[i]->n_block_hashes;
            }
        }
        if (m == method)
            return msg;
        protobuf_c_message_free_unpacked(msg, NULL);
    }
    return NULL;
}

static void send_msg(unsigned method, const ProtobufCMessage *m)
{
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, (uint16_t)method, 7};
    KVR_CHECK_STATUS(kvr_proto_send(g_sock, g_route, g_route_len, &h, m), KVR_OK);
}

static void reserve(uint64_t id, uint32_t *toks, size_t n, uint32_t max_tokens, bool local,
                    uint32_t lease_ms, float temperature)
{
    Kvrail__Reserve r = KVRAIL__RESERVE__INIT;
    Kvrail__SamplingParams sp = KVRAIL__SAMPLING_PARAMS__INIT;
    sp.temperature = temperature;
    sp.seed = 1;
    sp.has_seed = 1;
    r.request_id = id;
    r.token_ids = toks;
    r.n_token_ids = n;
    r.max_tokens = max_tokens;
    r.sampling = &sp;
    r.local_prefill = local;
    r.lease_ms = lease_ms;
    r.prefill_node = local ? (char *)"" : (char *)"p0";
    send_msg(KVRAIL__METHOD__RESERVE, &r.base);
}

static void expect_rejected(uint64_t id, kvr_status_t code, const char *needle)
{
    Kvrail__Rejected *rj = (Kvrail__Rejected *)expect(KVRAIL__METHOD__REJECTED, 5000);
    KVR_CHECK(rj);
    KVR_CHECK_EQ(rj->request_id, id);
    KVR_CHECK_EQ(rj->reason->code, code);
    if (!strstr(rj->reason->message, needle)) {
        fprintf(stderr, "rejection '%s' does not name '%s'\n", rj->reason->message, needle);
        exit(1);
    }
    printf("rejected %llu: %s\n", (unsigned long long)id, rj->reason->message);
    protobuf_c_message_free_unpacked(&rj->base, NULL);
}

static Kvrail__Heartbeat *heartbeat(void)
{
    Kvrail__Heartbeat *hb = (Kvrail__Heartbeat *)expect(KVRAIL__METHOD__HEARTBEAT, 3000);
    KVR_CHECK(hb);
    Kvrail__HeartbeatReply rep = KVRAIL__HEARTBEAT_REPLY__INIT;
    send_msg(KVRAIL__METHOD__HEARTBEAT, &rep.base);
    return hb;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        KVR_SKIP("usage: test_decode_node KVRAIL_DECODE KVRAIL_MKMODEL");
    char dir[512];
    KVR_CHECK(kvr_test_mkdtemp(dir, sizeof dir, "kvr-decnode"));
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s --out %s/model >/dev/null", argv[2], dir);
    KVR_CHECK_EQ(system(cmd), 0);

    void *ctx = zmq_ctx_new();
    g_sock = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(g_sock, ZMQ_LINGER, &zero, sizeof zero);
    KVR_CHECK_EQ(zmq_bind(g_sock, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t eplen = sizeof ep;
    zmq_getsockopt(g_sock, ZMQ_LAST_ENDPOINT, ep, &eplen);

    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/cluster.yaml", dir);
    FILE *f = fopen(cfg, "w");
    KVR_CHECK(f);
    fprintf(f,
            "cluster: t\nmodel: model\nblock_size: 16\nrouter:\n  client: tcp://127.0.0.1:1\n"
            "  node: %s\ntimeouts:\n  heartbeat_ms: 100\n"
            "limits:\n  reservation: whole\n" /* exhaustion below counts max_tokens */
            "nodes:\n  - name: router\n"
            "    role: router\n  - name: d0\n    role: decode\n    pool_blocks: 64\n"
            "    transport:\n      backend: loop\n",
            ep);
    fclose(f);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(argv[1], argv[1], "--config", cfg, "--node", "d0", (char *)NULL);
        _exit(127);
    }
    g_child = pid;
    atexit(kill_child);

    /* registration */
    Kvrail__RegisterRequest *reg =
        (Kvrail__RegisterRequest *)expect(KVRAIL__METHOD__REGISTER, 10000);
    KVR_CHECK(reg);
    KVR_CHECK(g_route_len == 2 && memcmp(g_route, "d0", 2) == 0);
    KVR_CHECK_EQ(reg->role, KVRAIL__ROLE__ROLE_DECODE);
    KVR_CHECK_EQ(reg->total_blocks, 64);
    KVR_CHECK_EQ(reg->n_layer_rkeys, reg->layout->layers);
    KVR_CHECK_EQ(reg->block_bytes, 2ull * reg->layout->kv_heads * 16 * reg->layout->head_dim * 4);
    KVR_CHECK_EQ(reg->layer_stride, 64 * reg->block_bytes);
    KVR_CHECK(reg->transport_address.len > 0);
    uint32_t ctxlen = reg->layout->max_context, vocab = reg->layout->vocab_size;
    protobuf_c_message_free_unpacked(&reg->base, NULL);
    Kvrail__RegisterReply rr = KVRAIL__REGISTER_REPLY__INIT;
    rr.heartbeat_interval_ms = 100;
    send_msg(KVRAIL__METHOD__REGISTER, &rr.base);

    /* the pool is pre-faulted on a thread after registering: wait, by the
     * node's heartbeats, until a Reserve could get every block, so that the
     * requests below meet the whole pool */
    for (int i = 0;; i++) {
        Kvrail__Heartbeat *hb0 = heartbeat();
        bool all = hb0->total_blocks == 64 && hb0->free_blocks == hb0->total_blocks;
        protobuf_c_message_free_unpacked(&hb0->base, NULL);
        if (all)
            break;
        KVR_CHECK(i < 50); /* 5 s of heartbeats */
    }

    /* garbage: one part; a wrong version; an unknown method */
    zmq_send(g_sock, g_route, g_route_len, ZMQ_SNDMORE);
    zmq_send(g_sock, "garbage", 7, 0);
    uint8_t env[KVR_PROTO_HDR_LEN];
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION + 1, 0, KVRAIL__METHOD__RESERVE, 1};
    kvr_proto_hdr_pack(&h, env);
    zmq_send(g_sock, g_route, g_route_len, ZMQ_SNDMORE);
    zmq_send(g_sock, env, sizeof env, ZMQ_SNDMORE);
    zmq_send(g_sock, "\x08\x01", 2, 0);
    h.version = KVR_PROTO_VERSION;
    h.method = 999;
    kvr_proto_hdr_pack(&h, env);
    zmq_send(g_sock, g_route, g_route_len, ZMQ_SNDMORE);
    zmq_send(g_sock, env, sizeof env, ZMQ_SNDMORE);
    zmq_send(g_sock, "", 0, 0);
    h.method = KVRAIL__METHOD__RESERVE; /* a Reserve whose payload is not one */
    kvr_proto_hdr_pack(&h, env);
    zmq_send(g_sock, g_route, g_route_len, ZMQ_SNDMORE);
    zmq_send(g_sock, env, sizeof env, ZMQ_SNDMORE);
    zmq_send(g_sock, "\xff\xff\xff\xff", 4, 0);

    /* every rejection names what was wrong */
    uint32_t toks[2048];
    for (int i = 0; i < 2048; i++)
        toks[i] = 4 + (uint32_t)(i * 7919 % (int)(vocab - 4));
    reserve(1, toks, 0, 4, true, 1000, 0);
    expect_rejected(1, KVR_ERR_INVALID, "prompt of 0 tokens");
    toks[3] = vocab + 5;
    reserve(2, toks, 10, 4, true, 1000, 0);
    expect_rejected(2, KVR_ERR_INVALID, "outside the vocabulary");
    toks[3] = 7;
    reserve(3, toks, 10, 0, true, 1000, 0);
    expect_rejected(3, KVR_ERR_INVALID, "max_tokens is 0");
    uint32_t *big = calloc(ctxlen + 1, sizeof *big);
    reserve(4, big, ctxlen, 4, true, 1000, 0);
    expect_rejected(4, KVR_ERR_INVALID, "the model's context");
    free(big);
    reserve(5, toks, 100, 2000, true, 1000, 0);
    expect_rejected(5, KVR_ERR_OVERLOAD, "the pool holds 64");
    reserve(6, toks, 10, 4, true, 1000, -1.0f);
    expect_rejected(6, KVR_ERR_INVALID, "temperature");

    /* a local prefill streams to its end; its two full prompt blocks are stored */
    reserve(10, toks, 40, 5, true, 1000, 0);
    Kvrail__Reserved *rs = (Kvrail__Reserved *)expect(KVRAIL__METHOD__RESERVED, 5000);
    KVR_CHECK(rs && rs->request_id == 10);
    KVR_CHECK_EQ(rs->n_block_ids, 3);
    KVR_CHECK_EQ(kvr_blocktab_runs(rs->block_ids, rs->n_block_ids), 1);
    KVR_CHECK_EQ(rs->cached_tokens, 0);
    protobuf_c_message_free_unpacked(&rs->base, NULL);
    Kvrail__PrefillDone *pd = (Kvrail__PrefillDone *)expect(KVRAIL__METHOD__PREFILL_DONE, 5000);
    KVR_CHECK(pd && pd->local && pd->status->code == 0 && pd->computed_tokens == 40);
    protobuf_c_message_free_unpacked(&pd->base, NULL);
    uint32_t first[5];
    for (uint32_t i = 0; i < 5; i++) {
        Kvrail__Token *t = (Kvrail__Token *)expect(KVRAIL__METHOD__TOKEN, 5000);
        KVR_CHECK(t && t->request_id == 10 && !t->no_token);
        KVR_CHECK_EQ(t->index, i);
        KVR_CHECK(t->token_id < vocab);
        first[i] = t->token_id;
        KVR_CHECK_EQ(t->finish, i == 4 ? KVRAIL__FINISH_REASON__FINISH_LENGTH
                                       : KVRAIL__FINISH_REASON__FINISH_NONE);
        protobuf_c_message_free_unpacked(&t->base, NULL);
    }
    Kvrail__Heartbeat *hb = heartbeat();
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    KVR_CHECK_EQ(g_stored, 2);

    /* the same prompt again: 2 cached blocks reused, the same greedy tokens */
    reserve(11, toks, 40, 5, true, 1000, 0);
    rs = (Kvrail__Reserved *)expect(KVRAIL__METHOD__RESERVED, 5000);
    KVR_CHECK(rs && rs->request_id == 11);
    KVR_CHECK_EQ(rs->cached_tokens, 32);
    protobuf_c_message_free_unpacked(&rs->base, NULL);
    for (uint32_t i = 0; i < 5; i++) {
        Kvrail__Token *t = (Kvrail__Token *)expect(KVRAIL__METHOD__TOKEN, 5000);
        KVR_CHECK(t && t->request_id == 11);
        KVR_CHECK_EQ(t->token_id, first[i]);
        KVR_CHECK_EQ(t->cached_tokens, 32);
        protobuf_c_message_free_unpacked(&t->base, NULL);
    }

    /* a remote reservation whose KV never comes: the lease expires */
    uint64_t t0 = kvr_now_ns();
    reserve(20, toks + 100, 50, 10, false, 300, 0);
    rs = (Kvrail__Reserved *)expect(KVRAIL__METHOD__RESERVED, 5000);
    KVR_CHECK(rs && rs->request_id == 20 && rs->lease_ms == 300);
    protobuf_c_message_free_unpacked(&rs->base, NULL);
    Kvrail__Token *t = (Kvrail__Token *)expect(KVRAIL__METHOD__TOKEN, 3000);
    KVR_CHECK(t && t->request_id == 20 && t->no_token);
    KVR_CHECK_EQ(t->finish, KVRAIL__FINISH_REASON__FINISH_ERROR);
    KVR_CHECK_EQ(t->status->code, KVR_ERR_TIMEOUT);
    KVR_CHECK(strstr(t->status->message, "lease expired"));
    uint64_t dt = (kvr_now_ns() - t0) / 1000000;
    KVR_CHECK(dt >= 280 && dt < 2000);
    printf("lease expired after %llu ms: %s\n", (unsigned long long)dt, t->status->message);
    protobuf_c_message_free_unpacked(&t->base, NULL);

    /* a prefill retry on another prefill node (Reserve attempt 1): the same
     * reservation, its lease renewed, but fresh blocks where the old writer
     * was writing (it may only have timed out and still write): those stay
     * quarantined, held, until it is fenced or its lease ends */
    reserve(25, toks + 150, 40, 4, false, 5000, 0);
    rs = (Kvrail__Reserved *)expect(KVRAIL__METHOD__RESERVED, 5000);
    KVR_CHECK(rs && rs->request_id == 25 && rs->cached_tokens == 0);
    uint32_t ids25[16];
    size_t n25 = rs->n_block_ids < 16 ? rs->n_block_ids : 16;
    memcpy(ids25, rs->block_ids, n25 * sizeof *ids25);
    protobuf_c_message_free_unpacked(&rs->base, NULL);
    hb = heartbeat();
    uint32_t held25 = hb->reserved_blocks;
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    Kvrail__Reserve rn = KVRAIL__RESERVE__INIT;
    rn.request_id = 25;
    rn.attempt = 1;
    rn.lease_ms = 300;
    rn.prefill_node = (char *)"p1";
    send_msg(KVRAIL__METHOD__RESERVE, &rn.base);
    rs = (Kvrail__Reserved *)expect(KVRAIL__METHOD__RESERVED, 5000);
    KVR_CHECK(rs && rs->request_id == 25);
    KVR_CHECK_EQ(rs->n_block_ids, n25);
    for (size_t i = 0; i < n25; i++)
        for (size_t j = 0; j < n25; j++)
            KVR_CHECK(rs->block_ids[i] != ids25[j]);
    protobuf_c_message_free_unpacked(&rs->base, NULL);
    hb = heartbeat(); /* the old writer's prompt blocks are held besides */
    KVR_CHECK_EQ(hb->reserved_blocks, held25 + (uint32_t)n25);
    protobuf_c_message_free_unpacked(&hb->base, NULL);
    Kvrail__NodeCancel nc = KVRAIL__NODE_CANCEL__INIT;
    nc.request_id = 25;
    send_msg(KVRAIL__METHOD__NODE_CANCEL, &nc.base);
    uint64_t deadline = kvr_deadline_ns(4000);
    uint32_t reserved = 99;
    while (kvr_now_ns() < deadline && reserved != 0) {
        hb = heartbeat();
        reserved = hb->reserved_blocks;
        protobuf_c_message_free_unpacked(&hb->base, NULL);
    }
    KVR_CHECK_EQ(reserved, 0); /* both quarantines ended with their 300 ms lease */

    /* exhaustion: 60 of 64 blocks reserved (2 cached are evicted for it),
     * then 10 more do not fit; cancel frees them after the quarantine (the
     * writer p0 never answers: held for its 5 s lease, the fence's bound) */
    reserve(30, toks + 200, 100, 860, false, 5000, 0);
    rs = (Kvrail__Reserved *)expect(KVRAIL__METHOD__RESERVED, 5000);
    KVR_CHECK(rs && rs->request_id == 30);
    protobuf_c_message_free_unpacked(&rs->base, NULL);
    /* a renewal of a reservation that does not exist is refused with
     * NOT_FOUND */
    rn.request_id = 77;
    rn.lease_ms = 9000;
    send_msg(KVRAIL__METHOD__RESERVE, &rn.base);
    expect_rejected(77, KVR_ERR_NOT_FOUND, "no reservation 77 to renew");
    reserve(31, toks + 300, 100, 60, false, 5000, 0);
    expect_rejected(31, KVR_ERR_NO_RESOURCE, "KV pool full");
    nc.request_id = 30;
    send_msg(KVRAIL__METHOD__NODE_CANCEL, &nc.base);
    deadline = kvr_deadline_ns(9000);
    reserved = 99;
    while (kvr_now_ns() < deadline && reserved != 0) {
        hb = heartbeat();
        reserved = hb->reserved_blocks;
        KVR_CHECK_EQ(hb->total_blocks, 64);
        KVR_CHECK(hb->free_blocks + hb->reserved_blocks == 64);
        protobuf_c_message_free_unpacked(&hb->base, NULL);
    }
    KVR_CHECK_EQ(reserved, 0);

    /* resync: a full dump at the last event seq, as many hashes as stored */
    Kvrail__ResyncRequest rq = KVRAIL__RESYNC_REQUEST__INIT;
    rq.reason = (char *)"test";
    send_msg(KVRAIL__METHOD__RESYNC, &rq.base);
    Kvrail__ResyncDump *rd = (Kvrail__ResyncDump *)expect(KVRAIL__METHOD__RESYNC, 3000);
    KVR_CHECK(rd);
    KVR_CHECK_EQ(rd->seq, g_last_seq);
    KVR_CHECK_EQ(rd->n_block_hashes, g_stored);
    uint64_t hs[4];
    size_t nh;
    KVR_CHECK_STATUS(kvr_blockhash_seq(toks, 40, 16, hs, 4, &nh), KVR_OK);
    (void)nh;
    printf("resync: %zu hashes at seq %llu\n", rd->n_block_hashes, (unsigned long long)rd->seq);
    protobuf_c_message_free_unpacked(&rd->base, NULL);

    kill(pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 50 && waitpid(pid, &st, WNOHANG) == 0; i++)
        usleep(100000);
    KVR_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    g_child = 0;
    zmq_close(g_sock);
    zmq_ctx_term(ctx);
    kvr_test_rmtree(dir);
    printf("decode node protocol: ok\n");
    return 0;
}
