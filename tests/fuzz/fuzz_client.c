/*
 * fuzz_client.c - fuzz target over libkvrail-client's handling of what the
 * router sends: the frames client.c files by call id (file_frame), a
 * stream's tokens, end and errors as the caller takes them (take), a unary
 * reply (unary_reply) and a status reply (status_of), on a client with no
 * socket (client.c is included: its per-frame handlers are static, and the
 * socket I/O around them is not what is under test; a send, a cancel,
 * fails at once with no socket).  Three streams, call ids 1-3, are open at
 * the start.  The input is records, each an op byte:
 *
 *   0  a frame: target byte (call id: 0, stream 1-3, the pending unary
 *      call, an unknown 99, or 7: the 16-byte envelope raw from the input),
 *      flags byte, method byte, payload length (2 bytes, little-endian),
 *      payload; parsed by kvr_proto_frame_parts and filed, as both links do
 *   1  take from stream (next byte % 3 + 1) until it has nothing
 *   2  take from every stream kvr_client_next_ready returns
 *   3  destroy stream (next byte % 3 + 1)
 *   4  a unary call is pending (a fresh call id)
 *   5  the pending call's reply handled as PING (next byte even) or STATUS
 *      (odd: the nodes' size from the next byte)
 *   6  the connection to the router is lost
 *   7  reopen stream (next byte % 3 + 1) if destroyed
 *
 * Beyond crashes, leaks and sanitizer reports, the target aborts when the
 * client breaks what it promises its caller: no token after a stream's end,
 * an end's status never positive, a finish inside enum kvr_finish, a
 * stream's queue within its bound (lowered here to 16 KiB so inputs reach
 * it).  Seeds: corpus/client, from fuzz-mkseeds --client (replies encoded
 * by the protoc-c code).
 */
#include "client.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NS 3

struct in {
    const uint8_t *p;
    size_t n;
};

static bool get(struct in *in, void *out, size_t len)
{
    if (in->n < len)
        return false;
    memcpy(out, in->p, len);
    in->p += len;
    in->n -= len;
    return true;
}

static uint8_t byte(struct in *in)
{
    uint8_t b = 0;
    (void)get(in, &b, 1);
    return b;
}

/* A stream as kvr_client_generate_start leaves it, without the send. */
static kvr_gen_stream_t *open_stream(kvr_client_t *c, uint64_t id)
{
    kvr_gen_stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        abort();
    s->c = c;
    s->res.size = sizeof(s->res);
    s->call_id = id;
    s->next = c->streams;
    c->streams = s;
    return s;
}

static void check(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_client: %s\n", what);
        abort();
    }
}

/* Takes until the stream has nothing; checks what the caller is promised. */
static void drain(kvr_gen_stream_t *s, bool small)
{
    for (;;) {
        struct kvr_gen_token t;
        /* kvr_gen_stream_user: set once the caller was told the end */
        bool was_closed = kvr_gen_stream_user(s) != NULL;
        /* a caller built against an older header: only its first bytes */
        kvr_status_t st = kvr_gen_stream_take_sized(
            s, &t, small ? offsetof(struct kvr_gen_token, text) : sizeof(t));
        check(s->queued_bytes <= stream_queue_cap, "a stream's queue past its bound");
        if (st == KVR_OK) {
            check(!was_closed, "a token after the stream's end");
            if (!small) {
                check(t.finish <= KVR_FINISH_ERROR, "a token's finish outside enum kvr_finish");
                check(t.n_top <= KVR_GEN_MAX_TOP, "more top logprobs than a token holds");
                check(strlen(t.text) == t.text_len, "a token's text_len");
            }
            continue;
        }
        if (st == KVR_ERR_CLOSED) {
            kvr_gen_stream_set_user(s, s);
            const struct kvr_gen_result *r = kvr_gen_stream_result(s);
            check(r->status <= 0, "a stream ended with a positive status");
            check(r->finish <= KVR_FINISH_ERROR, "a result's finish outside enum kvr_finish");
            check(s->ended, "CLOSED from a stream not ended");
            check(memchr(r->message, 0, sizeof(r->message)) != NULL, "an unterminated message");
        } else {
            check(st == KVR_ERR_TIMEOUT, "take: an unexpected status");
        }
        return;
    }
}

static kvr_gen_stream_t *find(kvr_client_t *c, uint64_t id)
{
    for (kvr_gen_stream_t *s = c->streams; s; s = s->next)
        if (s->call_id == id)
            return s;
    return NULL;
}

static void frame(kvr_client_t *c, struct in *in)
{
    uint8_t target = byte(in), flags = byte(in), method = byte(in);
    uint8_t env[KVR_PROTO_HDR_LEN];
    uint64_t ids[7] = {0, 1, 2, 3, c->want_call, 99, c->next_call};
    if (target % 8 == 7) {
        if (!get(in, env, sizeof(env)))
            return;
    } else {
        kvr_proto_hdr_t h = {KVR_PROTO_VERSION, flags, method, ids[target % 8]};
        kvr_proto_hdr_pack(&h, env);
    }
    uint8_t lb[2] = {0, 0};
    (void)get(in, lb, 2);
    size_t len = (size_t)lb[0] | (size_t)lb[1] << 8;
    if (len > in->n)
        len = in->n;
    kvr_proto_frame_t f;
    memset(&f, 0, sizeof(f));
    f.src_fd = -1;
    char err[256];
    if (kvr_proto_frame_parts(&f, 2, env, sizeof(env), in->p, len, err, sizeof(err)) == KVR_OK)
        (void)file_frame(c, &f);
    else
        kvr_proto_frame_clear(&f);
    in->p += len;
    in->n -= len;
}

static void reply(kvr_client_t *c, struct in *in)
{
    uint8_t b = byte(in);
    if (!c->have_reply)
        return;
    ProtobufCMessage *m = NULL;
    if (!(b & 1)) {
        if (unary_reply(c, KVRAIL__METHOD__PING, &kvrail__ping__descriptor, &m) == KVR_OK)
            protobuf_c_message_free_unpacked(m, NULL);
        return;
    }
    if (unary_reply(c, KVRAIL__METHOD__STATUS, &kvrail__status_reply__descriptor, &m) != KVR_OK)
        return;
    /* a caller's kvr_node_info: its own size, or an older (smaller) one */
    size_t node_size = b & 2 ? sizeof(struct kvr_node_info) : sizeof(size_t) + (size_t)(b >> 2);
    const Kvrail__Status *rs = ((Kvrail__StatusReply *)m)->status;
    bool failed = rs && rs->code;
    struct kvr_cluster_status o;
    kvr_status_t st = status_of(c, m, &o, node_size);
    check(!failed || st < 0, "a status reply saying an error taken as a status");
    if (st == KVR_OK) {
        check(o.n_nodes <= KVR_CLIENT_MAX_NODES, "a status past KVR_CLIENT_MAX_NODES");
        check(c->nodes_cap >= o.n_nodes * node_size, "nodes outside the status's buffer");
        check(memchr(o.model, 0, sizeof(o.model)) != NULL, "an unterminated model");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    stream_queue_cap = 16u << 10;
    kvr_client_t *c = calloc(1, sizeof(*c));
    if (!c)
        abort();
    c->next_call = 100;
    for (uint64_t i = 1; i <= NS; i++)
        open_stream(c, i);
    struct in in = {data, size};
    while (in.n) {
        uint8_t op = byte(&in);
        switch (op % 8) {
        case 0:
            frame(c, &in);
            break;
        case 1: {
            uint8_t b = byte(&in);
            kvr_gen_stream_t *s = find(c, b % NS + 1);
            if (s)
                drain(s, b & 0x80);
            break;
        }
        case 2: {
            kvr_gen_stream_t *s;
            while ((s = kvr_client_next_ready(c)))
                drain(s, false);
            break;
        }
        case 3:
            kvr_gen_stream_destroy(find(c, byte(&in) % NS + 1));
            break;
        case 4:
            c->want_call = ++c->next_call;
            c->reply_lost = false;
            break;
        case 5:
            reply(c, &in);
            break;
        case 6:
            connection_lost(c, NULL);
            break;
        case 7: {
            uint64_t id = byte(&in) % NS + 1;
            if (!find(c, id))
                open_stream(c, id);
            break;
        }
        }
    }
    /* every stream to its end: what was queued is taken, nothing is left */
    for (kvr_gen_stream_t *s = c->streams; s; s = s->next)
        drain(s, false);
    kvr_client_close(c);
    return 0;
}
