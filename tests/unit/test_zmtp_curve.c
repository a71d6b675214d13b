/*
 * test_zmtp_curve.c - libkvrail-client's direct router link with CURVE
 * (router/client/zmtp.c + zmtp_curve.c) against libzmq's own CURVE server:
 * a ROUTER socket in this process, no ZAP, keys from zmq_curve_keypair.
 *
 * - messages queued before the handshake is done (sealed at OPEN) arrive
 *   first and in order;
 * - two-part messages of sizes around the frame-header boundaries (0, 1,
 *   222, 223, 255, 256, 70000) and one of 3 MiB go both ways byte for byte
 *   (the link's in-place opening, long frames, the input buffer's growth);
 * - a burst of 3000 small messages from the router arrives whole and in
 *   order (many sealed frames per read: the opened/sealed gap compacted);
 * - a link given another server key fails the handshake, naming
 *   KVRAIL_ROUTER_KEY, and never opens.
 * Every wait is bounded (10 s).
 */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvr_clock.h"
#include "kvr_status.h"
#include "kvr_test.h"
#include "zmtp.h"

#define MAX_FRAME (16u << 20)

static void fill_pattern(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8));
}

/* Drives the link and the router until the router has a message (its
 * parts into parts[], the routing id into rid); false after 10 s. */
static bool router_recv(void *r, kvr_zmtp_t *z, zmq_msg_t *parts, int *n, zmq_msg_t *rid)
{
    uint64_t end = kvr_now_ns() + 10000000000ull;
    while (kvr_now_ns() < end) {
        kvr_zmtp_io(z);
        zmq_msg_init(rid);
        if (zmq_msg_recv(rid, r, ZMQ_DONTWAIT) >= 0) {
            *n = 0;
            while (zmq_msg_more(*n ? &parts[*n - 1] : rid)) {
                zmq_msg_init(&parts[*n]);
                KVR_CHECK(zmq_msg_recv(&parts[*n], r, 0) >= 0);
                (*n)++;
            }
            return true;
        }
        zmq_msg_close(rid);
        zmq_pollitem_t it[2] = {{r, 0, ZMQ_POLLIN, 0}, {NULL, kvr_zmtp_fd(z), ZMQ_POLLIN, 0}};
        zmq_poll(it, 2, 10);
    }
    return false;
}

/* The link's next message; false after 10 s. */
static bool link_recv(kvr_zmtp_t *z, struct kvr_zmtp_msg *m)
{
    uint64_t end = kvr_now_ns() + 10000000000ull;
    while (kvr_now_ns() < end) {
        kvr_zmtp_io(z);
        if (kvr_zmtp_recv(z, m) == KVR_OK)
            return true;
        struct pollfd p = {kvr_zmtp_fd(z), POLLIN, 0};
        poll(&p, 1, 10);
    }
    return false;
}

static void keys_of(const char *server_pub, const char *pub, const char *sec,
                    struct kvr_zmtp_curve_keys *k)
{
    KVR_CHECK(zmq_z85_decode(k->server, server_pub));
    KVR_CHECK(zmq_z85_decode(k->pub, pub));
    KVR_CHECK(zmq_z85_decode(k->sec, sec));
}

int main(void)
{
    if (!zmq_has("curve"))
        KVR_SKIP("this libzmq has no CURVE");
    char spub[41], ssec[41], cpub[41], csec[41], opub[41], osec[41];
    KVR_CHECK(zmq_curve_keypair(spub, ssec) == 0);
    KVR_CHECK(zmq_curve_keypair(cpub, csec) == 0);
    KVR_CHECK(zmq_curve_keypair(opub, osec) == 0);

    void *ctx = zmq_ctx_new();
    void *r = zmq_socket(ctx, ZMQ_ROUTER);
    int one = 1, zero = 0;
    zmq_setsockopt(r, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(r, ZMQ_SNDHWM, &zero, sizeof(zero)); /* the burst: none dropped */
    KVR_CHECK(zmq_setsockopt(r, ZMQ_CURVE_SERVER, &one, sizeof(one)) == 0);
    KVR_CHECK(zmq_setsockopt(r, ZMQ_CURVE_SECRETKEY, ssec, 40) == 0);
    KVR_CHECK(zmq_bind(r, "tcp://127.0.0.1:*") == 0);
    char ep[256];
    size_t epl = sizeof(ep);
    KVR_CHECK(zmq_getsockopt(r, ZMQ_LAST_ENDPOINT, ep, &epl) == 0);

    struct kvr_zmtp_curve_keys k;
    keys_of(spub, cpub, csec, &k);
    kvr_zmtp_t *z = NULL;
    char err[256];
    KVR_CHECK_STATUS(kvr_zmtp_open(ep, MAX_FRAME, &k, &z, err, sizeof(err)), KVR_OK);

    /* queued before OPEN: sealed at OPEN, in order */
    for (unsigned i = 0; i < 3; i++) {
        uint8_t tag = (uint8_t)i, body[300];
        fill_pattern(body, sizeof(body), i);
        struct iovec v[2] = {{&tag, 1}, {body, 100 * i}};
        KVR_CHECK_STATUS(kvr_zmtp_send(z, v, 2), KVR_OK);
    }
    KVR_CHECK(!kvr_zmtp_up(z));
    zmq_msg_t parts[8], rid;
    int n;
    for (unsigned i = 0; i < 3; i++) {
        KVR_CHECK(router_recv(r, z, parts, &n, &rid));
        KVR_CHECK_EQ(n, 2);
        KVR_CHECK_EQ(zmq_msg_size(&parts[0]), 1);
        KVR_CHECK_EQ(((uint8_t *)zmq_msg_data(&parts[0]))[0], i);
        uint8_t want[300];
        fill_pattern(want, sizeof(want), i);
        KVR_CHECK_EQ(zmq_msg_size(&parts[1]), 100 * i);
        KVR_CHECK(memcmp(zmq_msg_data(&parts[1]), want, 100 * i) == 0);
        for (int j = 0; j < n; j++)
            zmq_msg_close(&parts[j]);
        if (i < 2)
            zmq_msg_close(&rid);
    }
    KVR_CHECK(kvr_zmtp_up(z));
    printf("3 messages queued before the CURVE handshake: sealed at OPEN, in order\n");

    /* sizes both ways, byte for byte */
    static const size_t sizes[] = {0, 1, 222, 223, 255, 256, 70000, 3u << 20};
    uint8_t *buf = malloc(3u << 20), *want = malloc(3u << 20);
    KVR_CHECK(buf && want);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t len = sizes[s];
        fill_pattern(buf, len, (unsigned)s + 10);
        uint8_t tag = (uint8_t)s;
        struct iovec v[2] = {{&tag, 1}, {buf, len}};
        KVR_CHECK_STATUS(kvr_zmtp_send(z, v, 2), KVR_OK);
        zmq_msg_close(&rid);
        KVR_CHECK(router_recv(r, z, parts, &n, &rid));
        KVR_CHECK_EQ(n, 2);
        KVR_CHECK_EQ(zmq_msg_size(&parts[1]), len);
        KVR_CHECK(memcmp(zmq_msg_data(&parts[1]), buf, len) == 0);
        /* echoed back (the link's buffer is checked against a fresh pattern) */
        zmq_msg_t to;
        zmq_msg_init(&to);
        zmq_msg_copy(&to, &rid);
        KVR_CHECK(zmq_msg_send(&to, r, ZMQ_SNDMORE) >= 0);
        KVR_CHECK(zmq_msg_send(&parts[0], r, ZMQ_SNDMORE) >= 0);
        KVR_CHECK(zmq_msg_send(&parts[1], r, 0) >= 0);
        memset(buf, 0, len);
        struct kvr_zmtp_msg m;
        KVR_CHECK(link_recv(z, &m));
        KVR_CHECK_EQ(m.nparts, 2);
        KVR_CHECK_EQ(m.len[0], 1);
        KVR_CHECK_EQ(m.part[0][0], s);
        KVR_CHECK_EQ(m.len[1], len);
        fill_pattern(want, len, (unsigned)s + 10);
        KVR_CHECK(memcmp(m.part[1], want, len) == 0);
    }
    printf("%zu sizes (0 to 3 MiB) both ways over CURVE, byte for byte\n",
           sizeof(sizes) / sizeof(sizes[0]));

    /* a burst from the router (to the routing id it last saw): many sealed
     * frames per read */
    unsigned burst = 3000;
    for (unsigned i = 0; i < burst; i++) {
        uint32_t seq = i;
        KVR_CHECK(zmq_send(r, zmq_msg_data(&rid), zmq_msg_size(&rid), ZMQ_SNDMORE) >= 0);
        KVR_CHECK(zmq_send(r, &seq, sizeof(seq), ZMQ_SNDMORE) >= 0);
        KVR_CHECK(zmq_send(r, "payload", 7, 0) >= 0);
    }
    for (unsigned i = 0; i < burst; i++) {
        struct kvr_zmtp_msg m;
        if (!link_recv(z, &m)) {
            fprintf(stderr, "burst: message %u of %u not received: %s\n", i, burst,
                    kvr_zmtp_error(z));
            return 1;
        }
        KVR_CHECK_EQ(m.nparts, 2);
        uint32_t seq;
        KVR_CHECK_EQ(m.len[0], sizeof(seq));
        memcpy(&seq, m.part[0], sizeof(seq));
        KVR_CHECK_EQ(seq, i);
        KVR_CHECK(m.len[1] == 7 && !memcmp(m.part[1], "payload", 7));
    }
    KVR_CHECK(kvr_zmtp_up(z));
    printf("a burst of %u messages from the router: whole, in order\n", burst);
    kvr_zmtp_close(z);

    /* another server key: the handshake fails, naming it */
    keys_of(opub, cpub, csec, &k);
    KVR_CHECK_STATUS(kvr_zmtp_open(ep, MAX_FRAME, &k, &z, err, sizeof(err)), KVR_OK);
    uint64_t end = kvr_now_ns() + 10000000000ull;
    while (kvr_now_ns() < end && !strstr(kvr_zmtp_error(z), "KVRAIL_ROUTER_KEY")) {
        kvr_zmtp_io(z);
        KVR_CHECK(!kvr_zmtp_up(z));
        struct pollfd p = {kvr_zmtp_fd(z), POLLIN, 0};
        poll(&p, 1, 10);
    }
    printf("another server key: %s\n", kvr_zmtp_error(z));
    KVR_CHECK(strstr(kvr_zmtp_error(z), "not the one in KVRAIL_ROUTER_KEY"));
    KVR_CHECK(!kvr_zmtp_up(z));
    kvr_zmtp_close(z);

    zmq_msg_close(&rid);
    free(buf);
    free(want);
    zmq_close(r);
    zmq_ctx_term(ctx);
    printf("PASS\n");
    return 0;
}
