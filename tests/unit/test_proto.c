/*
 * test_proto.c - the control-plane framing (proto/kvr_proto.h) over real
 * ZeroMQ sockets (inproc ROUTER <-> DEALER): envelope round trips, streaming
 * flags, error frames, and every kind of bad message (garbage, truncated
 * envelope, wrong version, unknown method, missing or extra frames, garbage
 * payload) reported with its own status while the next good message still
 * arrives intact.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "kvr_proto.h"
#include "kvr_test.h"

static void *router_s, *dealer_s;

static kvr_status_t recv_wait(void *s, bool routed, kvr_proto_frame_t *f, char *err, size_t n)
{
    for (int i = 0; i < 2000; i++) {
        kvr_status_t st = kvr_proto_recv(s, routed, f, err, n);
        if (st != KVR_ERR_NO_RESOURCE)
            return st;
        usleep(1000);
    }
    return KVR_ERR_TIMEOUT;
}

static void send_raw(int nparts, const void *const *parts, const size_t *lens)
{
    for (int i = 0; i < nparts; i++)
        KVR_CHECK(zmq_send(dealer_s, parts[i], lens[i], i + 1 < nparts ? ZMQ_SNDMORE : 0) >= 0);
}

static void good_roundtrip(uint64_t call_id)
{
    Kvrail__GenerateRequest g = KVRAIL__GENERATE_REQUEST__INIT;
    uint32_t ids[3] = {5, 6, 70000};
    g.n_token_ids = 3;
    g.token_ids = ids;
    g.max_tokens = 17;
    g.prompt = "hello";
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__GENERATE, call_id};
    KVR_CHECK_STATUS(kvr_proto_send(dealer_s, NULL, 0, &h, &g.base), KVR_OK);
    kvr_proto_frame_t f;
    char err[256] = "";
    KVR_CHECK_STATUS(recv_wait(router_s, true, &f, err, sizeof(err)), KVR_OK);
    KVR_CHECK(f.have_hdr);
    KVR_CHECK_EQ(f.hdr.method, KVRAIL__METHOD__GENERATE);
    KVR_CHECK_EQ(f.hdr.call_id, call_id);
    KVR_CHECK_EQ(f.route_len, 5);
    KVR_CHECK(!memcmp(f.route, "cli-1", 5));
    ProtobufCMessage *m = NULL;
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, err, sizeof(err)), KVR_OK);
    Kvrail__GenerateRequest *r = (Kvrail__GenerateRequest *)m;
    KVR_CHECK_EQ(r->max_tokens, 17);
    KVR_CHECK_EQ(r->n_token_ids, 3);
    KVR_CHECK_EQ(r->token_ids[2], 70000);
    KVR_CHECK(!strcmp(r->prompt, "hello"));
    protobuf_c_message_free_unpacked(m, NULL);

    /* reply: a chunk, then END, then an error frame, routed back */
    Kvrail__GenerateChunk c = KVRAIL__GENERATE_CHUNK__INIT;
    c.token_id = 42;
    c.text = "x";
    kvr_proto_hdr_t rh = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__GENERATE, call_id};
    KVR_CHECK_STATUS(kvr_proto_send(router_s, f.route, f.route_len, &rh, &c.base), KVR_OK);
    Kvrail__StreamEnd e = KVRAIL__STREAM_END__INIT;
    rh.flags = KVR_PROTO_F_END;
    KVR_CHECK_STATUS(kvr_proto_send(router_s, f.route, f.route_len, &rh, &e.base), KVR_OK);
    KVR_CHECK_STATUS(kvr_proto_send_error(router_s, f.route, f.route_len, KVRAIL__METHOD__GENERATE,
                                          call_id, KVR_ERR_OVERLOAD, "queue full (%d waiting)", 3),
                     KVR_OK);
    kvr_proto_frame_clear(&f);

    KVR_CHECK_STATUS(recv_wait(dealer_s, false, &f, err, sizeof(err)), KVR_OK);
    KVR_CHECK_EQ(f.hdr.flags, 0);
    KVR_CHECK_STATUS(
        kvr_proto_decode(&f, kvr_proto_method_reply_desc(f.hdr.method), &m, err, sizeof(err)),
        KVR_OK);
    KVR_CHECK_EQ(((Kvrail__GenerateChunk *)m)->token_id, 42);
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
    KVR_CHECK_STATUS(recv_wait(dealer_s, false, &f, err, sizeof(err)), KVR_OK);
    KVR_CHECK_EQ(f.hdr.flags, KVR_PROTO_F_END);
    KVR_CHECK_EQ(f.payload_len, 0); /* empty StreamEnd packs to nothing */
    KVR_CHECK_STATUS(kvr_proto_decode(&f, &kvrail__stream_end__descriptor, &m, err, sizeof(err)),
                     KVR_OK);
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
    KVR_CHECK_STATUS(recv_wait(dealer_s, false, &f, err, sizeof(err)), KVR_OK);
    KVR_CHECK_EQ(f.hdr.flags, KVR_PROTO_F_END | KVR_PROTO_F_ERROR);
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, err, sizeof(err)), KVR_OK);
    Kvrail__Status *s = (Kvrail__Status *)m;
    KVR_CHECK_EQ(s->code, KVR_ERR_OVERLOAD);
    KVR_CHECK(!strcmp(s->message, "queue full (3 waiting)"));
    protobuf_c_message_free_unpacked(m, NULL);
    kvr_proto_frame_clear(&f);
}

static void expect_bad(kvr_status_t want, bool have_hdr, const char *msg_part)
{
    kvr_proto_frame_t f;
    char err[256] = "";
    KVR_CHECK_STATUS(recv_wait(router_s, true, &f, err, sizeof(err)), want);
    KVR_CHECK_EQ(f.have_hdr, have_hdr);
    if (!strstr(err, msg_part)) {
        fprintf(stderr, "error '%s' does not mention '%s'\n", err, msg_part);
        exit(1);
    }
    KVR_CHECK(f.payload == NULL);
    kvr_proto_frame_clear(&f);
}

int main(void)
{
    /* envelope pack/unpack */
    uint8_t env[KVR_PROTO_HDR_LEN];
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, KVR_PROTO_F_END, KVRAIL__METHOD__TOKEN,
                         0x1122334455667788ull};
    kvr_proto_hdr_pack(&h, env);
    KVR_CHECK(env[0] == 'K' && env[1] == 'R' && env[2] == 1 && env[3] == 1);
    KVR_CHECK(env[4] == 24 && env[5] == 0 && env[8] == 0x88 && env[15] == 0x11);
    kvr_proto_hdr_t h2;
    KVR_CHECK_STATUS(kvr_proto_hdr_unpack(env, sizeof(env), &h2, NULL, 0), KVR_OK);
    KVR_CHECK(h2.call_id == h.call_id && h2.method == h.method && h2.flags == h.flags);
    char err[256];
    KVR_CHECK_STATUS(kvr_proto_hdr_unpack(env, 15, &h2, err, sizeof(err)), KVR_ERR_CORRUPT);
    KVR_CHECK(strstr(err, "15 bytes"));
    KVR_CHECK(kvr_proto_method_name(KVRAIL__METHOD__PREFILL_TARGET) != NULL);
    KVR_CHECK(!strcmp(kvr_proto_method_name(KVRAIL__METHOD__GENERATE), "GENERATE"));
    KVR_CHECK(kvr_proto_method_name(999) == NULL);
    KVR_CHECK(kvr_proto_method_name(0) == NULL);
    KVR_CHECK(kvr_proto_method_desc(KVRAIL__METHOD__RESERVE) == &kvrail__reserve__descriptor);

    void *ctx = zmq_ctx_new();
    router_s = zmq_socket(ctx, ZMQ_ROUTER);
    dealer_s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(router_s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(dealer_s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(dealer_s, ZMQ_ROUTING_ID, "cli-1", 5);
    KVR_CHECK(zmq_bind(router_s, "inproc://proto-test") == 0);
    KVR_CHECK(zmq_connect(dealer_s, "inproc://proto-test") == 0);

    kvr_proto_frame_t f;
    KVR_CHECK_STATUS(kvr_proto_recv(router_s, true, &f, err, sizeof(err)), KVR_ERR_NO_RESOURCE);
    good_roundtrip(1);

    /* garbage in place of the envelope (one frame only) */
    const char *junk = "GET / HTTP/1.1\r\n\r\n";
    const void *p1[] = {junk};
    size_t l1[] = {strlen(junk)};
    send_raw(1, p1, l1);
    expect_bad(KVR_ERR_CORRUPT, false, "envelope is 18 bytes");
    good_roundtrip(2);

    /* truncated envelope + payload */
    const void *p2[] = {env, "x"};
    size_t l2[] = {9, 1};
    send_raw(2, p2, l2);
    expect_bad(KVR_ERR_CORRUPT, false, "envelope is 9 bytes");

    /* bad magic */
    uint8_t bad[KVR_PROTO_HDR_LEN];
    memcpy(bad, env, sizeof(bad));
    bad[0] = 'X';
    const void *p3[] = {bad, ""};
    size_t l3[] = {sizeof(bad), 0};
    send_raw(2, p3, l3);
    expect_bad(KVR_ERR_CORRUPT, false, "magic");

    /* wrong version: header still known so the caller can answer */
    kvr_proto_hdr_t hv = {7, 0, KVRAIL__METHOD__STATUS, 99};
    kvr_proto_hdr_pack(&hv, bad);
    send_raw(2, p3, l3);
    {
        KVR_CHECK_STATUS(recv_wait(router_s, true, &f, err, sizeof(err)), KVR_ERR_VERSION);
        KVR_CHECK(f.have_hdr && f.hdr.call_id == 99);
        KVR_CHECK(strstr(err, "version 7"));
        kvr_proto_frame_clear(&f);
    }

    /* unknown method */
    kvr_proto_hdr_t hm = {KVR_PROTO_VERSION, 0, 4242, 100};
    kvr_proto_hdr_pack(&hm, bad);
    send_raw(2, p3, l3);
    {
        KVR_CHECK_STATUS(recv_wait(router_s, true, &f, err, sizeof(err)), KVR_ERR_UNSUPPORTED);
        KVR_CHECK(f.have_hdr && f.hdr.call_id == 100 && f.hdr.method == 4242);
        KVR_CHECK(strstr(err, "unknown method 4242"));
        kvr_proto_frame_clear(&f);
    }

    /* envelope without payload frame, and with an extra frame */
    kvr_proto_hdr_t hs = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__STATUS, 101};
    kvr_proto_hdr_pack(&hs, bad);
    send_raw(1, p3, l3);
    expect_bad(KVR_ERR_CORRUPT, true, "1 frames");
    const void *p4[] = {bad, "", "extra"};
    size_t l4[] = {sizeof(bad), 0, 5};
    send_raw(3, p4, l4);
    expect_bad(KVR_ERR_CORRUPT, true, "3 frames");
    good_roundtrip(3);

    /* garbage payload under a good envelope: recv ok, decode refuses */
    kvr_proto_hdr_t hg = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__GENERATE, 102};
    kvr_proto_hdr_pack(&hg, bad);
    const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    const void *p5[] = {bad, garbage};
    size_t l5[] = {sizeof(bad), sizeof(garbage)};
    send_raw(2, p5, l5);
    KVR_CHECK_STATUS(recv_wait(router_s, true, &f, err, sizeof(err)), KVR_OK);
    ProtobufCMessage *m = NULL;
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, err, sizeof(err)), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "kvrail.GenerateRequest"));
    kvr_proto_frame_clear(&f);

    /* truncated payload: a valid message cut in the middle of a string */
    Kvrail__GenerateRequest g = KVRAIL__GENERATE_REQUEST__INIT;
    g.prompt = "a fairly long prompt that will be cut";
    uint8_t *buf;
    size_t len;
    KVR_CHECK_STATUS(kvr_proto_pack(&g.base, &buf, &len), KVR_OK);
    const void *p6[] = {bad, buf};
    size_t l6[] = {sizeof(bad), len - 5};
    send_raw(2, p6, l6);
    free(buf);
    KVR_CHECK_STATUS(recv_wait(router_s, true, &f, err, sizeof(err)), KVR_OK);
    KVR_CHECK_STATUS(kvr_proto_decode(&f, NULL, &m, err, sizeof(err)), KVR_ERR_INVALID);
    KVR_CHECK(strstr(err, "truncated"));
    kvr_proto_frame_clear(&f);
    good_roundtrip(4);

    zmq_close(router_s);
    zmq_close(dealer_s);
    zmq_ctx_term(ctx);
    printf("proto: ok\n");
    return 0;
}
