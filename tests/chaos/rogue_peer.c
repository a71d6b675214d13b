/*
 * rogue_peer.c - a hostile peer of the router's node endpoint, for the
 * authentication tests (auth_test.py): connects a DEALER whose routing id
 * is NAME (any name, a running node's included), with no CURVE keys, with
 * keys of its own choosing, or with a node's stolen key, sends a REGISTER as
 * NAME with the layout given, and prints what came back:
 *   REPLY <code> <message>   a RegisterReply (code 0: registered) or error
 *   NO-REPLY                 nothing within --wait-ms (the handshake failed)
 * then, registered or not, waits --listen-ms for anything the router sends
 * it (a prompt would be a PREFILL or RESERVE) and prints
 *   RECEIVED <method>        per message
 * --black-hole: once registered, heartbeats every 200 ms with a pool of
 * --blocks free blocks and answers nothing else (a decode node that accepts
 * reservations and never answers them).
 * --address-file FILE / --rkeys N: register with FILE's bytes as the
 * transport address (a checksummed but garbage blob, garbage_blob_test.py)
 * and N rkeys of garbage; --reserve: answer every RESERVE with a Reserved
 * (block ids 0..), so that a prefill node is sent the address.
 * --fail-after-done (as a prefill node): answers every PREFILL_TARGET with a
 * PrefillDone that succeeded and then a second one that says the KV
 * transfer to the target's decode node failed (decode_fault): what a real
 * prefill node sends when a transfer fails after the first PrefillDone
 * (transfer_fail_test.py: the router must retry at once, on another
 * decode node, blaming the decode node).
 * --xfer-connect HEX [--xfer-token HEX]: instead of all that, a peer of a
 * node's transfer engine: connects to the address blob HEX (a decode node
 * publishes it in its stats file), with no token or the one given (made
 * up), sends two notifications, progresses 300 ms and prints
 *   XFER <connect status> <notify status>
 * (a target with require_token refuses them and counts them: its
 * transfer_refused stat, auth_test.py).  --xfer-hello NAME:INC sends, in
 * place of the two, a well-formed HELLO claiming to be prefill node NAME
 * restarted as incarnation INC (hex) (cancel_fence_test.py: it must not
 * end that node's quarantines).
 * --forge NODE (as a registered prefill node, with its own key): heartbeats
 * like --black-hole; takes the decode node's address and the transfer
 * token the router gives it with a PrefillTarget (its own, for the pair)
 * and connects with it, printing "TOKEN <decode node> <request>"; answers
 * nothing (it holds the request).  Then, for every line "FORGE ID_FROM
 * ID_TO BLOCKS" on its stdin, it sends a KV_ABORT and a KV_PROGRESS naming
 * prefill node NODE for every request id in [ID_FROM, ID_TO] (its own
 * left out) and first block in [0, BLOCKS), attempt 0, on that connection
 * - another prefill node's requests, under its own token - and prints
 * "FORGED <notifications> <status>" (forged_notif_test.py: the real
 * writer's reservation and quarantine must not be touched).
 *
 *   kvr-rogue-peer --endpoint EP --name NAME [--role prefill|decode]
 *       [--router-pub FILE --key FILE | --random-key] [--layers N
 *       --kv-heads N --head-dim N --dtype S] [--numerics S] [--kernels S] [--fingerprint S]
 *       [--blocks N]
 *       [--black-hole] [--wait-ms N] [--listen-ms N]
 */
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "kvr_clock.h"
#include "kvr_proto.h"
#include "kvr_xfer.h"
#include "notif.h"

static int unhex(const char *h, uint8_t *out, size_t cap, size_t *n_p)
{
    size_t n = strlen(h);
    if (n % 2 || n / 2 > cap)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    *n_p = n / 2;
    return 0;
}

/* --xfer-connect: a transfer-engine peer that no router introduced */
static int xfer_rogue(const char *addr_hex, const char *token_hex, const char *hello)
{
    static uint8_t blob[65536];
    uint8_t tok[KVR_XFER_TOKEN_LEN];
    size_t n = 0, nt = 0;
    if (unhex(addr_hex, blob, sizeof blob, &n) != 0 || n == 0 ||
        (token_hex && (unhex(token_hex, tok, sizeof tok, &nt) != 0 || nt != sizeof tok))) {
        fprintf(stderr, "--xfer-connect wants an address in hex, --xfer-token %d bytes in hex\n",
                KVR_XFER_TOKEN_LEN);
        return 2;
    }
    struct kvr_xfer_config xc;
    kvr_xfer_config_init(&xc);
    xc.name = "rogue";
    kvr_xfer_engine_t *e = NULL;
    kvr_status_t s = kvr_xfer_engine_create(&xc, &e);
    if (s != KVR_OK) {
        printf("XFER-ENGINE %s\n", kvr_status_name(s));
        return 1;
    }
    kvr_xfer_peer_t *peer = NULL;
    s = token_hex ? kvr_xfer_connect_token(e, blob, n, tok, &peer)
                  : kvr_xfer_connect(e, blob, n, &peer);
    kvr_status_t ns = KVR_ERR_NOT_FOUND;
    if (s == KVR_OK && hello) {
        struct kvr_notif hn = {0};
        const char *colon = strchr(hello, ':');
        hn.kind = KVR_NOTIF_HELLO;
        hn.incarnation = colon ? strtoull(colon + 1, NULL, 16) : 1;
        snprintf(hn.node, sizeof hn.node, "%.*s", colon ? (int)(colon - hello) : (int)strlen(hello),
                 hello);
        hn.proto_version = KVR_PROTO_VERSION;
        uint8_t wire[KVR_NOTIF_WIRE_MAX];
        size_t wl = kvr_notif_encode(&hn, wire, sizeof wire);
        ns = wl ? kvr_xfer_notify(peer, wire, wl) : KVR_ERR_INVALID;
    } else if (s == KVR_OK) {
        static const char msg[] = "KV_READY from nobody the router introduced";
        ns = kvr_xfer_notify(peer, msg, sizeof msg);
        if (ns == KVR_OK)
            ns = kvr_xfer_notify(peer, msg, sizeof msg);
    }
    uint64_t end = kvr_now_ns() + 300000000ull;
    while (kvr_now_ns() < end) {
        kvr_xfer_progress(e);
        usleep(1000);
    }
    printf("XFER %s %s\n", kvr_status_name(s), kvr_status_name(ns));
    fflush(stdout);
    if (peer)
        kvr_xfer_disconnect(peer);
    kvr_xfer_engine_destroy(e);
    return 0;
}

/* --forge: a registered prefill node speaking for another */
static struct {
    const char *node; /* the prefill node it names */
    kvr_xfer_engine_t *e;
    kvr_xfer_peer_t *peer;
    uint64_t own[64]; /* its own requests' ids */
    int n_own;
    bool eof; /* stdin closed */
} fg;

static void forge_target(const Kvrail__PrefillTarget *t)
{
    if (fg.n_own < 64)
        fg.own[fg.n_own++] = t->request_id;
    if (fg.peer || t->decode_address.len == 0 || t->transport_token.len != KVR_XFER_TOKEN_LEN)
        return;
    struct kvr_xfer_config xc;
    kvr_xfer_config_init(&xc);
    xc.name = "forger";
    kvr_status_t s = kvr_xfer_engine_create(&xc, &fg.e);
    if (s == KVR_OK)
        s = kvr_xfer_connect_token(fg.e, t->decode_address.data, t->decode_address.len,
                                   t->transport_token.data, &fg.peer);
    printf("TOKEN %s %" PRIu64 " %s\n", t->decode_node, t->request_id, kvr_status_name(s));
    fflush(stdout);
}

static void forge(uint64_t from, uint64_t to, uint32_t blocks)
{
    kvr_status_t s = fg.peer ? KVR_OK : KVR_ERR_NOT_FOUND;
    uint64_t n = 0;
    for (uint64_t id = from; s == KVR_OK && id <= to && id - from < 1024; id++) {
        bool own = false;
        for (int i = 0; i < fg.n_own; i++)
            own |= fg.own[i] == id;
        for (uint32_t b = 0; !own && s == KVR_OK && b < blocks && b < 65536; b++) {
            static const uint16_t kinds[] = {KVR_NOTIF_KV_ABORT, KVR_NOTIF_KV_PROGRESS};
            for (int k = 0; k < 2 && s == KVR_OK; k++) {
                struct kvr_notif fn = {0};
                fn.kind = kinds[k];
                fn.request_id = id;
                fn.first_block = b;
                fn.attempt = 0;
                fn.status = KVR_ERR_CANCELED;
                snprintf(fn.node, sizeof fn.node, "%s", fg.node);
                uint8_t wire[KVR_NOTIF_WIRE_MAX];
                size_t wl = kvr_notif_encode(&fn, wire, sizeof wire);
                s = wl ? kvr_xfer_notify(fg.peer, wire, wl) : KVR_ERR_INVALID;
                n += s == KVR_OK;
                if ((n & 255) == 0)
                    kvr_xfer_progress(fg.e);
            }
        }
    }
    if (s == KVR_OK)
        s = kvr_xfer_flush(fg.peer, 10000);
    printf("FORGED %" PRIu64 " %s\n", n, kvr_status_name(s));
    fflush(stdout);
}

/* a line on stdin: "FORGE ID_FROM ID_TO BLOCKS" */
static void forge_stdin(void)
{
    static char line[256];
    static size_t used;
    ssize_t k = read(0, line + used, sizeof line - 1 - used);
    if (k <= 0) {
        fg.eof = true;
        return;
    }
    used += (size_t)k;
    line[used] = 0;
    char *nl;
    while ((nl = strchr(line, '\n'))) {
        *nl = 0;
        unsigned long long a, b;
        unsigned nb;
        if (sscanf(line, "FORGE %llu %llu %u", &a, &b, &nb) == 3)
            forge(a, b, nb);
        used -= (size_t)(nl + 1 - line);
        memmove(line, nl + 1, used + 1);
    }
    if (used == sizeof line - 1)
        used = 0;
}

static int read_key(const char *path, int lines, char *l1, char *l2)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char b[128];
    int ok = fgets(b, sizeof(b), f) != NULL;
    if (ok) {
        b[strcspn(b, "\r\n")] = 0;
        snprintf(l1, 41, "%.40s", b);
    }
    if (ok && lines == 2 && fgets(b, sizeof(b), f)) {
        b[strcspn(b, "\r\n")] = 0;
        snprintf(l2, 41, "%.40s", b);
    }
    fclose(f);
    return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"endpoint", required_argument, NULL, 'e'},
        {"name", required_argument, NULL, 'n'},
        {"role", required_argument, NULL, 'r'},
        {"router-pub", required_argument, NULL, 'p'},
        {"key", required_argument, NULL, 'k'},
        {"random-key", no_argument, NULL, 'R'},
        {"layers", required_argument, NULL, 'L'},
        {"kv-heads", required_argument, NULL, 'H'},
        {"head-dim", required_argument, NULL, 'D'},
        {"dtype", required_argument, NULL, 't'},
        {"numerics", required_argument, NULL, 'u'},
        {"kernels", required_argument, NULL, 'Z'},
        {"wait-ms", required_argument, NULL, 'w'},
        {"listen-ms", required_argument, NULL, 'l'},
        {"fingerprint", required_argument, NULL, 'f'},
        {"blocks", required_argument, NULL, 'b'},
        {"black-hole", no_argument, NULL, 'B'},
        {"address-file", required_argument, NULL, 'A'},
        {"rkeys", required_argument, NULL, 'K'},
        {"reserve", no_argument, NULL, 'V'},
        {"fail-after-done", no_argument, NULL, 'F'},
        {"xfer-connect", required_argument, NULL, 'X'},
        {"xfer-token", required_argument, NULL, 'T'},
        {"xfer-hello", required_argument, NULL, 'O'},
        {"forge", required_argument, NULL, 'G'},
        {NULL, 0, NULL, 0},
    };
    const char *ep = NULL, *name = NULL, *role = "prefill", *rpub = NULL, *key = NULL;
    const char *dtype = "f32", *numerics = "", *kernels = "";
    bool random_key = false, black_hole = false, reserve = false, fail_after_done = false;
    const char *addr_file = NULL, *xfer_addr = NULL, *xfer_token = NULL, *xfer_hello = NULL;
    uint32_t nrkeys = 0;
    const char *fp = "rogue";
    uint32_t blocks = 64;
    uint32_t layers = 2, heads = 2, hdim = 16;
    int wait_ms = 3000, listen_ms = 0, c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'e':
            ep = optarg;
            break;
        case 'n':
            name = optarg;
            break;
        case 'r':
            role = optarg;
            break;
        case 'p':
            rpub = optarg;
            break;
        case 'k':
            key = optarg;
            break;
        case 'R':
            random_key = true;
            break;
        case 'L':
            layers = (uint32_t)atoi(optarg);
            break;
        case 'H':
            heads = (uint32_t)atoi(optarg);
            break;
        case 'D':
            hdim = (uint32_t)atoi(optarg);
            break;
        case 't':
            dtype = optarg;
            break;
        case 'u':
            numerics = optarg;
            break;
        case 'Z':
            kernels = optarg;
            break;
        case 'w':
            wait_ms = atoi(optarg);
            break;
        case 'f':
            fp = optarg;
            break;
        case 'b':
            blocks = (uint32_t)atoi(optarg);
            break;
        case 'B':
            black_hole = true;
            break;
        case 'A':
            addr_file = optarg;
            break;
        case 'K':
            nrkeys = (uint32_t)atoi(optarg);
            break;
        case 'V':
            reserve = true;
            break;
        case 'F':
            fail_after_done = true;
            break;
        case 'X':
            xfer_addr = optarg;
            break;
        case 'T':
            xfer_token = optarg;
            break;
        case 'O':
            xfer_hello = optarg;
            break;
        case 'G':
            fg.node = optarg;
            black_hole = true; /* heartbeats, answers nothing */
            break;
        case 'l':
            listen_ms = atoi(optarg);
            break;
        default:
            return 2;
        }
    }
    if (xfer_addr)
        return xfer_rogue(xfer_addr, xfer_token, xfer_hello);
    if (!ep || !name) {
        fprintf(stderr, "usage: kvr-rogue-peer --endpoint EP --name NAME ...\n");
        return 2;
    }
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_ROUTING_ID, name, strlen(name));
    char spub[41] = "", pub[41] = "", sec[41] = "", err[256];
    if (rpub && read_key(rpub, 1, spub, NULL) != 0) {
        fprintf(stderr, "cannot read %s\n", rpub);
        return 2;
    }
    if (key && read_key(key, 2, pub, sec) != 0) {
        fprintf(stderr, "cannot read %s\n", key);
        return 2;
    }
    if (random_key)
        zmq_curve_keypair(pub, sec);
    if (spub[0] && pub[0] &&
        kvr_proto_curve_client_keys(s, spub, pub, sec, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    zmq_connect(s, ep);

    Kvrail__KvLayout l = KVRAIL__KV_LAYOUT__INIT;
    l.layers = layers;
    l.kv_heads = heads;
    l.head_dim = hdim;
    l.block_size = 16;
    l.dtype = (char *)dtype;
    l.numerics = (char *)numerics;
    l.kernels = (char *)kernels;
    Kvrail__RegisterRequest q = KVRAIL__REGISTER_REQUEST__INIT;
    q.node_name = (char *)name;
    q.role = !strcmp(role, "decode") ? KVRAIL__ROLE__ROLE_DECODE : KVRAIL__ROLE__ROLE_PREFILL;
    q.model_fingerprint = (char *)fp;
    q.layout = &l;
    q.transport = (char *)"ucx";
    q.total_blocks = blocks;
    q.protocol_version = KVR_PROTO_VERSION;
    q.incarnation = 0xbad;
    static uint8_t addr[65536], garbage[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ProtobufCBinaryData rks[64];
    uint64_t bases[64] = {0};
    if (addr_file) {
        FILE *af = fopen(addr_file, "rb");
        if (!af) {
            fprintf(stderr, "cannot read %s\n", addr_file);
            return 2;
        }
        q.transport_address.len = fread(addr, 1, sizeof(addr), af);
        q.transport_address.data = addr;
        fclose(af);
    }
    if (nrkeys > 64)
        nrkeys = 64;
    for (uint32_t i = 0; i < nrkeys; i++)
        rks[i] = (ProtobufCBinaryData){sizeof(garbage), garbage};
    q.n_layer_rkeys = nrkeys;
    q.layer_rkeys = rks;
    q.n_layer_base = nrkeys;
    q.layer_base = bases;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__REGISTER, 1};
    kvr_proto_send(s, NULL, 0, &h, &q.base);

    bool replied = false;
    uint64_t end = kvr_now_ns() + (uint64_t)wait_ms * 1000000ull;
    uint64_t listen_end = 0, next_hb = 0;
    for (;;) {
        uint64_t now = kvr_now_ns();
        if (black_hole && replied && now >= next_hb) {
            Kvrail__Heartbeat hb = KVRAIL__HEARTBEAT__INIT;
            hb.node_name = (char *)name;
            hb.total_blocks = blocks;
            hb.free_blocks = blocks;
            hb.incarnation = 0xbad;
            kvr_proto_hdr_t hh = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__HEARTBEAT, 2};
            kvr_proto_send(s, NULL, 0, &hh, &hb.base);
            next_hb = now + 200000000ull;
        }
        if (!replied && now >= end)
            break;
        if (replied && now >= listen_end)
            break;
        zmq_pollitem_t it[2] = {{s, 0, ZMQ_POLLIN, 0}, {NULL, 0, ZMQ_POLLIN, 0}};
        uint64_t until = replied ? listen_end : end;
        if (black_hole && replied && next_hb < until)
            until = next_hb;
        if (fg.e && now + 10000000ull < until)
            until = now + 10000000ull; /* the transfer engine progressed too */
        if (until < now)
            until = now;
        zmq_poll(it, fg.node && !fg.eof ? 2 : 1, (long)((until - now) / 1000000u) + 1);
        if (fg.e)
            kvr_xfer_progress(fg.e);
        if (fg.node && !fg.eof && (it[1].revents & ZMQ_POLLIN))
            forge_stdin();
        kvr_proto_frame_t f;
        while (kvr_proto_recv(s, false, &f, err, sizeof(err)) != KVR_ERR_NO_RESOURCE) {
            if (f.hdr.method == KVRAIL__METHOD__REGISTER && !replied) {
                ProtobufCMessage *m = NULL;
                int code = -999;
                const char *msg = "";
                if (f.hdr.flags & KVR_PROTO_F_ERROR) {
                    if (kvr_proto_decode(&f, NULL, &m, err, sizeof(err)) == KVR_OK) {
                        code = ((Kvrail__Status *)m)->code;
                        msg = ((Kvrail__Status *)m)->message;
                    }
                } else if (kvr_proto_decode(&f, &kvrail__register_reply__descriptor, &m, err,
                                            sizeof(err)) == KVR_OK) {
                    Kvrail__RegisterReply *rr = (Kvrail__RegisterReply *)m;
                    code = rr->status ? rr->status->code : 0;
                    msg = rr->status ? rr->status->message : "";
                }
                printf("REPLY %d %s\n", code, msg);
                fflush(stdout);
                if (m)
                    protobuf_c_message_free_unpacked(m, NULL);
                replied = true;
                listen_end = kvr_now_ns() + (uint64_t)listen_ms * 1000000ull;
            } else if (f.have_hdr) {
                printf("RECEIVED %s\n", kvr_proto_method_label(f.hdr.method));
                fflush(stdout);
                ProtobufCMessage *m = NULL;
                if (reserve && f.hdr.method == KVRAIL__METHOD__RESERVE &&
                    kvr_proto_decode(&f, &kvrail__reserve__descriptor, &m, err, sizeof(err)) ==
                        KVR_OK) {
                    Kvrail__Reserve *rq = (Kvrail__Reserve *)m;
                    uint32_t ids[4096];
                    size_t nb = (rq->n_token_ids + 15) / 16;
                    nb = nb ? (nb < 4096 ? nb : 4096) : 1;
                    for (size_t i = 0; i < nb; i++)
                        ids[i] = (uint32_t)i;
                    Kvrail__Reserved rd = KVRAIL__RESERVED__INIT;
                    rd.request_id = rq->request_id;
                    rd.n_block_ids = nb;
                    rd.block_ids = ids;
                    rd.lease_ms = rq->lease_ms;
                    rd.node_name = (char *)name;
                    kvr_proto_hdr_t rh = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__RESERVED, 3};
                    kvr_proto_send(s, NULL, 0, &rh, &rd.base);
                }
                if (fg.node && f.hdr.method == KVRAIL__METHOD__PREFILL_TARGET &&
                    kvr_proto_decode(&f, &kvrail__prefill_target__descriptor, &m, err,
                                     sizeof(err)) == KVR_OK)
                    forge_target((const Kvrail__PrefillTarget *)m);
                if (fail_after_done && f.hdr.method == KVRAIL__METHOD__PREFILL_TARGET &&
                    kvr_proto_decode(&f, &kvrail__prefill_target__descriptor, &m, err,
                                     sizeof(err)) == KVR_OK) {
                    Kvrail__PrefillTarget *t = (Kvrail__PrefillTarget *)m;
                    char why[200];
                    snprintf(why, sizeof why,
                             "KV transfer to decode node '%s' failed after the prompt was "
                             "computed: %s",
                             t->decode_node, kvr_status_str(KVR_ERR_PEER_FAILURE));
                    Kvrail__Status ok = KVRAIL__STATUS__INIT, bad = KVRAIL__STATUS__INIT;
                    bad.code = KVR_ERR_PEER_FAILURE;
                    bad.message = why;
                    Kvrail__PrefillDone d = KVRAIL__PREFILL_DONE__INIT;
                    d.request_id = t->request_id;
                    d.attempt = t->attempt;
                    d.node_name = (char *)name;
                    d.status = &ok;
                    kvr_proto_hdr_t dh = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__PREFILL_DONE, 4};
                    kvr_proto_send(s, NULL, 0, &dh, &d.base);
                    d.status = &bad;
                    d.decode_fault = true;
                    kvr_proto_send(s, NULL, 0, &dh, &d.base);
                    printf("FAILED-AFTER-DONE %s\n", t->decode_node);
                    fflush(stdout);
                }
                if (m)
                    protobuf_c_message_free_unpacked(m, NULL);
            }
            kvr_proto_frame_clear(&f);
        }
    }
    if (!replied)
        printf("NO-REPLY\n");
    if (fg.peer)
        kvr_xfer_disconnect(fg.peer);
    if (fg.e)
        kvr_xfer_engine_destroy(fg.e);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return 0;
}
