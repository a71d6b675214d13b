/*
 * mkseeds.c - writes the seed corpus of fuzz_router.c (the record format is
 * described there): whole conversations a real cluster has (nodes register
 * and heartbeat, a client generates, the decode node reserves, the prefill
 * node finishes, tokens stream, block events and a resync dump arrive,
 * cancels, status, ping) and the frames that crashed or misled the router
 * (a GENERATE with the ERROR flag, an empty rkey, a bogus registration).
 * Run once when the protocol changes; the output is committed.  With
 * --client, fuzz_client.c's seeds instead (corpus/client): replies a router
 * sends a client, and the replies that broke libkvrail-client.
 *
 *   fuzz-mkseeds DIR
 *   fuzz-mkseeds --client DIR
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvr_proto.h"

enum { R_P0, R_D0, R_D1, R_CA, R_CB };

static uint8_t buf[1 << 16];
static size_t len;

/* m packed into buf after its 16-bit little-endian length (0: no m) */
static void put_msg(const ProtobufCMessage *m)
{
    size_t n = m ? protobuf_c_message_get_packed_size(m) : 0;
    buf[len++] = (uint8_t)n;
    buf[len++] = (uint8_t)(n >> 8);
    if (n)
        protobuf_c_message_pack(m, buf + len);
    len += n;
}

static void rec(int op, int route, unsigned flags, unsigned method, uint64_t call,
                const ProtobufCMessage *m)
{
    buf[len++] = (uint8_t)op;
    buf[len++] = (uint8_t)route;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, (uint8_t)flags, (uint16_t)method, call};
    kvr_proto_hdr_pack(&h, buf + len);
    len += KVR_PROTO_HDR_LEN;
    put_msg(m);
}

static void tick(int x50ms)
{
    buf[len++] = 2;
    buf[len++] = (uint8_t)x50ms;
}

static void reg(int route, const char *name, Kvrail__Role role, const char *fp, uint32_t blocks,
                bool empty_rkey)
{
    Kvrail__KvLayout l = KVRAIL__KV_LAYOUT__INIT;
    l.layers = 2;
    l.kv_heads = 2;
    l.head_dim = 8;
    l.block_size = 16;
    l.max_context = 512;
    l.vocab_size = 1000;
    l.dtype = (char *)"f32";
    Kvrail__RegisterRequest q = KVRAIL__REGISTER_REQUEST__INIT;
    q.node_name = (char *)name;
    q.role = role;
    q.model_fingerprint = (char *)fp;
    q.layout = &l;
    q.transport = (char *)"loop";
    uint8_t addr[8] = "addr0000";
    q.transport_address.data = addr;
    q.transport_address.len = sizeof(addr);
    ProtobufCBinaryData rk[2] = {{4, (uint8_t *)"rk00"}, {4, (uint8_t *)"rk11"}};
    if (empty_rkey)
        rk[1] = (ProtobufCBinaryData){0, NULL};
    uint64_t base[2] = {4096, 8192};
    if (role == KVRAIL__ROLE__ROLE_DECODE) {
        q.n_layer_rkeys = 2;
        q.layer_rkeys = rk;
        q.n_layer_base = 2;
        q.layer_base = base;
        q.total_blocks = blocks;
        q.layer_stride = 4096;
        q.block_bytes = 64;
    }
    q.protocol_version = KVR_PROTO_VERSION;
    q.incarnation = 0x1000 + (uint64_t)route;
    rec(1, route, 0, KVRAIL__METHOD__REGISTER, 1, &q.base);
}

static void hb(int route, const char *name, uint32_t free_blocks, uint64_t seq)
{
    Kvrail__Heartbeat h = KVRAIL__HEARTBEAT__INIT;
    h.node_name = (char *)name;
    h.free_blocks = free_blocks;
    h.total_blocks = 64;
    h.block_event_seq = seq;
    h.incarnation = 0x1000 + (uint64_t)route;
    rec(1, route, 0, KVRAIL__METHOD__HEARTBEAT, 2, &h.base);
}

static void cluster_up(void)
{
    reg(R_P0, "prefill0", KVRAIL__ROLE__ROLE_PREFILL, "model-a", 0, false);
    reg(R_D0, "decode0", KVRAIL__ROLE__ROLE_DECODE, "model-a", 64, false);
    reg(R_D1, "decode1", KVRAIL__ROLE__ROLE_DECODE, "model-a", 64, false);
    hb(R_P0, "prefill0", 0, 0);
    hb(R_D0, "decode0", 64, 0);
    hb(R_D1, "decode1", 64, 0);
}

static void generate(int route, uint64_t call, size_t n_tokens, unsigned flags)
{
    uint32_t ids[300];
    for (size_t i = 0; i < n_tokens && i < 300; i++)
        ids[i] = (uint32_t)(i * 7 % 1000);
    Kvrail__GenerateRequest gq = KVRAIL__GENERATE_REQUEST__INIT;
    gq.n_token_ids = n_tokens;
    gq.token_ids = ids;
    gq.max_tokens = 8;
    char *stops[1] = {(char *)"xyz"};
    gq.n_stop = 1;
    gq.stop = stops;
    rec(0, route, flags, KVRAIL__METHOD__GENERATE, call, &gq.base);
}

static void reserved(int route, uint64_t did, size_t n_blocks, uint32_t first_id)
{
    uint32_t ids[64];
    for (size_t i = 0; i < n_blocks && i < 64; i++)
        ids[i] = first_id + (uint32_t)i;
    Kvrail__Reserved m = KVRAIL__RESERVED__INIT;
    m.request_id = did;
    m.n_block_ids = n_blocks;
    m.block_ids = ids;
    m.lease_ms = 1000;
    rec(1, route, 0, KVRAIL__METHOD__RESERVED, 0, &m.base);
}

static void prefill_done(int route, uint64_t did, int code)
{
    Kvrail__Status s = KVRAIL__STATUS__INIT;
    s.code = code;
    s.message = (char *)"x";
    Kvrail__PrefillDone m = KVRAIL__PREFILL_DONE__INIT;
    m.request_id = did;
    m.status = code ? &s : NULL;
    m.bytes_moved = 1024;
    rec(1, route, 0, KVRAIL__METHOD__PREFILL_DONE, 0, &m.base);
}

static void token(int route, uint64_t did, uint32_t index, Kvrail__FinishReason fin)
{
    Kvrail__Token m = KVRAIL__TOKEN__INIT;
    m.request_id = did;
    m.index = index;
    m.token_id = 10 + index;
    m.finish = fin;
    rec(1, route, 0, KVRAIL__METHOD__TOKEN, 0, &m.base);
}

static void events(int route, uint64_t seq, Kvrail__BlockEvent__Kind kind, size_t n)
{
    uint64_t h[16];
    for (size_t i = 0; i < n && i < 16; i++)
        h[i] = 0x1234 + i;
    Kvrail__BlockEvent e = KVRAIL__BLOCK_EVENT__INIT;
    e.seq = seq;
    e.kind = kind;
    e.n_block_hashes = n;
    e.block_hashes = h;
    Kvrail__BlockEvent *ep[1] = {&e};
    Kvrail__BlockEvents m = KVRAIL__BLOCK_EVENTS__INIT;
    m.n_events = 1;
    m.events = ep;
    rec(1, route, 0, KVRAIL__METHOD__BLOCK_EVENTS, 0, &m.base);
}

static void dump(int route, uint64_t seq, size_t n)
{
    uint64_t h[16];
    for (size_t i = 0; i < n && i < 16; i++)
        h[i] = 0x1234 + i;
    Kvrail__ResyncDump m = KVRAIL__RESYNC_DUMP__INIT;
    m.seq = seq;
    m.n_block_hashes = n;
    m.block_hashes = h;
    rec(1, route, 0, KVRAIL__METHOD__RESYNC, 0, &m.base);
}

static int write_seed(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) {
        perror(path);
        return 1;
    }
    fclose(f);
    len = 0;
    return 0;
}

/* ---- fuzz_client.c's records (the format is described there) ---- */

enum { C_CALL0, C_S1, C_S2, C_S3, C_UNARY, C_UNKNOWN };

static void cframe(int target, unsigned flags, unsigned method, const ProtobufCMessage *m)
{
    buf[len++] = 0;
    buf[len++] = (uint8_t)target;
    buf[len++] = (uint8_t)flags;
    buf[len++] = (uint8_t)method;
    put_msg(m);
}

static void cop(int op, int arg)
{
    buf[len++] = (uint8_t)op;
    if (arg >= 0)
        buf[len++] = (uint8_t)arg;
}

static void ctoken(int target, uint32_t index, int finish, const char *text, bool extras)
{
    Kvrail__GenerateChunk ch = KVRAIL__GENERATE_CHUNK__INIT;
    ch.request_id = 7;
    ch.index = index;
    ch.token_id = 100 + index;
    ch.logprob = -0.5f;
    ch.text = (char *)text;
    ch.finish = finish;
    uint32_t ids[4] = {1, 2, 3, 4};
    Kvrail__TopLogprob tl[2] = {KVRAIL__TOP_LOGPROB__INIT, KVRAIL__TOP_LOGPROB__INIT};
    Kvrail__TopLogprob *tlp[2] = {&tl[0], &tl[1]};
    tl[0].token_id = 100 + index;
    tl[0].logprob = -0.5f;
    tl[1].token_id = 9;
    tl[1].logprob = -2.0f;
    if (extras) {
        ch.prompt_token_ids = ids;
        ch.n_prompt_token_ids = 4;
        ch.top_logprobs = tlp;
        ch.n_top_logprobs = 2;
    }
    cframe(target, 0, KVRAIL__METHOD__GENERATE, &ch.base);
}

static void cend(int target, int code, int finish)
{
    Kvrail__GenerateUsage u = KVRAIL__GENERATE_USAGE__INIT;
    u.request_id = 7;
    u.finish = finish;
    u.prompt_tokens = 4;
    u.completion_tokens = 2;
    u.prefill_node = (char *)"prefill0";
    u.decode_node = (char *)"decode0";
    Kvrail__Status st = KVRAIL__STATUS__INIT;
    st.code = code;
    st.message = (char *)(code ? "ended with an error" : "");
    Kvrail__StreamEnd e = KVRAIL__STREAM_END__INIT;
    e.usage = &u;
    e.status = code ? &st : NULL;
    cframe(target, KVR_PROTO_F_END, KVRAIL__METHOD__GENERATE, &e.base);
}

static void cerror(int target, unsigned method, int code, const char *msg)
{
    Kvrail__Status st = KVRAIL__STATUS__INIT;
    st.code = code;
    st.message = (char *)msg;
    cframe(target, KVR_PROTO_F_END | KVR_PROTO_F_ERROR, method, &st.base);
}

static void cstatus_reply(size_t n_nodes, int code)
{
    Kvrail__Status st = KVRAIL__STATUS__INIT;
    st.code = code;
    st.message = (char *)(code ? "no status: shutting down" : "ok");
    Kvrail__RouterStats rs = KVRAIL__ROUTER_STATS__INIT;
    rs.uptime_ms = 1000;
    rs.requests = 3;
    Kvrail__NodeStatus ns[2] = {KVRAIL__NODE_STATUS__INIT, KVRAIL__NODE_STATUS__INIT};
    Kvrail__NodeStatus *nsp[2] = {&ns[0], &ns[1]};
    ns[0].name = (char *)"prefill0";
    ns[0].role = KVRAIL__ROLE__ROLE_PREFILL;
    ns[0].alive = 1;
    ns[1].name = (char *)"decode0";
    ns[1].role = KVRAIL__ROLE__ROLE_DECODE;
    ns[1].total_blocks = 64;
    ns[1].free_blocks = 60;
    Kvrail__StatusReply r = KVRAIL__STATUS_REPLY__INIT;
    r.model = (char *)"tiny";
    r.block_size = 16;
    r.router = &rs;
    r.nodes = nsp;
    r.n_nodes = n_nodes < 2 ? n_nodes : 2;
    r.status = &st;
    cframe(C_UNARY, KVR_PROTO_F_END, KVRAIL__METHOD__STATUS, &r.base);
}

static int client_seeds(const char *d)
{
    int rc = 0;
    /* a whole stream: the first token with prompt ids and top logprobs, the
     * last, the end with usage; taken as kvr_client_next_ready gives it */
    ctoken(C_S1, 0, 0, "Hello", true);
    ctoken(C_S1, 1, KVRAIL__FINISH_REASON__FINISH_LENGTH, " world", false);
    cend(C_S1, 0, KVRAIL__FINISH_REASON__FINISH_LENGTH);
    cop(2, -1);
    rc |= write_seed(d, "stream-whole");

    /* three streams interleaved: one ends, one fails, one is destroyed
     * with frames queued; an unknown call id, call id 0's error */
    ctoken(C_S1, 0, 0, "a", false);
    ctoken(C_S2, 0, 0, "b", true);
    ctoken(C_S3, 0, 0, "c", false);
    cframe(C_UNKNOWN, 0, KVRAIL__METHOD__GENERATE, NULL);
    cop(1, 1);
    cerror(C_S2, KVRAIL__METHOD__GENERATE, -12, "overloaded");
    cerror(C_CALL0, 0, -15, "your envelope was unreadable");
    cend(C_S1, 0, KVRAIL__FINISH_REASON__FINISH_STOP);
    cop(3, 2);
    cop(2, -1);
    cop(7, 2);
    ctoken(C_S3, 0, 0, "again", false);
    rc |= write_seed(d, "streams-interleaved");

    /* unary calls: a ping, a status (the caller's node size, then an older
     * caller's), the router's error */
    Kvrail__Ping pg = KVRAIL__PING__INIT;
    pg.nonce = 42;
    cop(4, -1);
    cframe(C_UNARY, KVR_PROTO_F_END, KVRAIL__METHOD__PING, &pg.base);
    cop(5, 0);
    cop(4, -1);
    cstatus_reply(2, 0);
    cop(5, 3);
    cop(4, -1);
    cstatus_reply(2, 0);
    cop(5, 1 | (24 << 2));
    cop(4, -1);
    cerror(C_UNARY, KVRAIL__METHOD__STATUS, -10, "no such thing");
    cop(5, 1);
    rc |= write_seed(d, "unary-ping-status-error");

    /* the connection lost with frames queued: they are delivered, then the
     * end */
    ctoken(C_S1, 0, 0, "x", false);
    ctoken(C_S2, 0, 0, "y", false);
    cop(4, -1);
    cop(6, -1);
    cop(2, -1);
    ctoken(C_S1, 1, 0, "late", false);
    rc |= write_seed(d, "connection-lost");

    /* regression: frames after a stream's error (a done, a token) were
     * queued and taken after the end: a token after KVR_ERR_CLOSED, and the
     * done's KVR_OK over the error */
    ctoken(C_S1, 0, 0, "a", false);
    cerror(C_S1, KVRAIL__METHOD__GENERATE, -5, "decode node died");
    cend(C_S1, 0, KVRAIL__FINISH_REASON__FINISH_STOP);
    ctoken(C_S1, 1, 0, "b", false);
    cop(1, 0);
    cop(1, 0);
    cop(1, 0);
    rc |= write_seed(d, "done-after-error");

    /* regression: a positive or zero code in an error (KVR_INPROGRESS) was
     * the stream's and the unary call's status: "not an error" */
    cerror(C_S1, KVRAIL__METHOD__GENERATE, 1, "in progress?");
    cend(C_S2, 1, KVRAIL__FINISH_REASON__FINISH_STOP);
    cop(4, -1);
    cerror(C_UNARY, KVRAIL__METHOD__PING, 1, "in progress?");
    cop(5, 0);
    cop(2, -1);
    rc |= write_seed(d, "error-positive-code");

    /* regression: finish reasons outside enum kvr_finish reached the
     * caller as they came */
    ctoken(C_S1, 0, 77, "a", false);
    cend(C_S1, 0, 99);
    cop(1, 0);
    rc |= write_seed(d, "finish-out-of-range");

    /* regression: a StatusReply whose status is an error was taken as a
     * status of zeros */
    cop(4, -1);
    cstatus_reply(0, -18);
    cop(5, 3);
    rc |= write_seed(d, "status-reply-error");

    /* regression: a stream nobody takes from queued whatever the router
     * sent; now its queue is bounded and the stream ends with
     * KVR_ERR_OVERLOAD after what was queued */
    char text[1001];
    memset(text, 'z', sizeof(text) - 1);
    text[sizeof(text) - 1] = 0;
    for (uint32_t i = 0; i < 24; i++)
        ctoken(C_S2, i, 0, text, false);
    cend(C_S2, 0, KVRAIL__FINISH_REASON__FINISH_LENGTH);
    cop(1, 1);
    rc |= write_seed(d, "flood");
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--client") == 0)
        return client_seeds(argv[2]);
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR | --client DIR\n", argv[0]);
        return 2;
    }
    const char *d = argv[1];
    int rc = 0;

    /* a whole disaggregated request: id 1, dispatch id 2 */
    cluster_up();
    generate(R_CA, 7, 40, 0);
    reserved(R_D0, 2, 3, 0);
    reserved(R_D1, 2, 3, 0);
    prefill_done(R_P0, 2, 0);
    token(R_D0, 2, 1, 0);
    token(R_D0, 2, 2, KVRAIL__FINISH_REASON__FINISH_LENGTH);
    rc |= write_seed(d, "request-whole");

    /* streams, a cancel, status, ping, a failed prefill and its retry */
    cluster_up();
    generate(R_CA, 7, 40, 0);
    generate(R_CB, 8, 100, 0);
    Kvrail__CancelRequest c = KVRAIL__CANCEL_REQUEST__INIT;
    c.call_id = 8;
    rec(0, R_CB, 0, KVRAIL__METHOD__CANCEL, 9, &c.base);
    Kvrail__StatusRequest sr = KVRAIL__STATUS_REQUEST__INIT;
    rec(0, R_CA, 0, KVRAIL__METHOD__STATUS, 10, &sr.base);
    Kvrail__Ping pg = KVRAIL__PING__INIT;
    rec(0, R_CA, 0, KVRAIL__METHOD__PING, 11, &pg.base);
    reserved(R_D0, 2, 3, 0);
    prefill_done(R_P0, 2, -5);
    tick(10);
    rc |= write_seed(d, "cancel-status-retry");

    /* block events, a gap, held events, the dump, a node's death */
    cluster_up();
    events(R_D0, 1, KVRAIL__BLOCK_EVENT__KIND__STORED, 4);
    events(R_D0, 3, KVRAIL__BLOCK_EVENT__KIND__STORED, 4);
    events(R_D0, 4, KVRAIL__BLOCK_EVENT__KIND__REMOVED, 2);
    dump(R_D0, 3, 8);
    events(R_D0, 5, KVRAIL__BLOCK_EVENT__KIND__CLEARED, 0);
    hb(R_D0, "decode0", 64, 9);
    hb(R_D0, "decode0", 64, 9);
    generate(R_CA, 7, 80, 0);
    tick(20);
    rc |= write_seed(d, "dirsync-death");

    /* regression: a GENERATE flagged ERROR was decoded as kvrail.Status and
     * used as a GenerateRequest (out-of-bounds read) */
    cluster_up();
    generate(R_CA, 7, 40, KVR_PROTO_F_ERROR);
    generate(R_CA, 8, 40, KVR_PROTO_F_ERROR | KVR_PROTO_F_END);
    Kvrail__Status st = KVRAIL__STATUS__INIT;
    st.code = -1;
    st.message = (char *)"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    rec(0, R_CA, KVR_PROTO_F_ERROR, KVRAIL__METHOD__GENERATE, 9, &st.base);
    rec(0, R_CA, KVR_PROTO_F_ERROR, 0, 0, &st.base);
    rec(1, R_D0, KVR_PROTO_F_ERROR, KVRAIL__METHOD__RESERVED, 1, &st.base);
    rec(1, R_D0, 0, 999, 1, &st.base);
    rc |= write_seed(d, "error-flag");

    /* regression: an empty rkey (memcpy from NULL), an oversized Reserved,
     * a prefill node sending a decode node's messages */
    reg(R_P0, "prefill0", KVRAIL__ROLE__ROLE_PREFILL, "model-a", 0, false);
    reg(R_D0, "decode0", KVRAIL__ROLE__ROLE_DECODE, "model-a", 64, true);
    generate(R_CA, 7, 40, 0);
    reserved(R_D0, 2, 60, 100);
    token(R_P0, 2, 0, 0);
    events(R_P0, 1, KVRAIL__BLOCK_EVENT__KIND__STORED, 4);
    rc |= write_seed(d, "empty-rkey-bad-reserved");

    /* regression: a bogus first registration with another model, which then
     * dies, must not lock the real nodes out */
    reg(R_D1, "decode1", KVRAIL__ROLE__ROLE_DECODE, "bogus", 64, false);
    tick(20);
    reg(R_P0, "prefill0", KVRAIL__ROLE__ROLE_PREFILL, "model-a", 0, false);
    reg(R_D0, "decode0", KVRAIL__ROLE__ROLE_DECODE, "model-a", 64, false);
    reg(R_D0, "decode0", KVRAIL__ROLE__ROLE_DECODE, "model-a", 0, false);
    rc |= write_seed(d, "fingerprint-poison");
    return rc;
}
