/*
 * fuzz_decode.c - fuzz target over the decode node's message handlers:
 * what kvrail-decode accepts from the router (Reserve, with prefill retries
 * by attempt; NodeCancel; Resync; any other method) and from prefill peers
 * (the P -> D notifications HELLO, KV_READY, KV_ABORT, KV_PROGRESS), with
 * its batch steps run for real on the engine worker (the tiny model of
 * tests/fuzz/data/model) and its leases expired at will.
 *
 * decode/decode.c is compiled into this file (its main renamed), so the
 * handlers are the node's own; the node runtime around them is what
 * kvr_node_init would set up, minus the transfer engine: the DEALER socket
 * to "the router" is connected to a ROUTER here that reads back and decodes
 * every message the node sends.  The KV pool is plain memory.
 *
 * An input is a list of records, op byte first:
 *   op % 8 == 0  raw control frame: method, flags, length (1 byte), payload;
 *                decoded as kvr_node_run does (an ERROR-flagged or
 *                undecodable frame is dropped), then handed to the node
 *            1   Reserve built from 6 bytes (request id 1..4, prompt of a
 *                shared prefix + a suffix, max_tokens, attempt, local or
 *                remote prefill, the prefill node's name, its transfer
 *                token: none, its own or the other node's)
 *            2   NodeCancel of request id 1..4
 *            3   raw notification: length (1 byte), bytes, to the decoder
 *            4   notification built from 5 bytes (kind, request, sender,
 *                attempt, first block: the request's own or a stray one,
 *                first token; HELLO with the right or a wrong layout;
 *                the token it came under: none, the sender's or the
 *                other node's)
 *            5   one engine step (submitted, waited for, its DONE handled)
 *            6   every lease and quarantine expires (check_leases)
 *            7   Resync (a full dump of the cached blocks)
 * After every record the block table is consistent (kvr_blocktab_check)
 * and every message the node sent decodes as its method's type.  At the
 * end of the input every request is ended and no block may stay
 * referenced: nothing is stranded.
 */
#include <zmq.h>

/* the decode node itself */
int kvr_decode_node_main(int argc, char **argv);
#define main kvr_decode_node_main
#include "decode.c"
#undef main

#ifndef KVR_FUZZ_DATA
#error "KVR_FUZZ_DATA: the tests/fuzz/data directory"
#endif

#define FUZZ_BLOCKS 40
#define FUZZ_BATCH  4

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char cluster_yaml[] = "cluster: fuzz\n"
                                   "model: " KVR_FUZZ_DATA "/model\n"
                                   "block_size: 4\n"
                                   "router:\n"
                                   "  client: inproc://fuzz-decode-client\n"
                                   "  node: inproc://fuzz-decode-router\n"
                                   "timeouts:\n"
                                   "  lease_ms: 10000\n"
                                   "limits:\n"
                                   "  prefill_chunk_tokens: 8\n"
                                   "nodes:\n"
                                   "  - name: prefill0\n"
                                   "    role: prefill\n"
                                   "  - name: decode0\n"
                                   "    role: decode\n"
                                   "    pool_blocks: 40\n";

static struct {
    bool ready;
    void *router; /* reads what the node sends */
    void *slabs[64];
} g;

static struct decode D;

static void setup_once(void)
{
    if (g.ready)
        return;
    struct decode *d = &D;
    kvr_log_set_level(KVR_LOG_ERROR); /* quiet: bad input is logged by design */
    char err[512];
    if (kvr_cluster_parse(cluster_yaml, sizeof cluster_yaml - 1, "/tmp/fuzz-decode.yaml",
                          &d->node.cluster, err, sizeof err) != KVR_OK ||
        kvr_model_load(KVR_FUZZ_DATA "/model", &d->node.model, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "fuzz_decode: %s\n", err);
        abort();
    }
    kvr_node_t *n = &d->node;
    n->self = kvr_cluster_find(n->cluster, "decode0");
    n->role = KVR_NODE_ROLE_DECODE;
    snprintf(n->name, sizeof n->name, "decode0");
    n->incarnation = 1;
    n->xfer_fd = -1;
    /* the layout kvr_node_init makes (f32 KV: the zero dtype) */
    memset(&n->layout, 0, sizeof n->layout);
    n->layout.n_layers = kvr_model_n_layers(n->model);
    n->layout.n_kv_heads = kvr_model_n_kv_heads(n->model);
    n->layout.head_dim = kvr_model_head_dim(n->model);
    n->layout.block_size = (int32_t)n->cluster->block_size;
    n->fingerprint = kvr_model_fingerprint(n->model);
    n->zctx = zmq_ctx_new();
    g.router = zmq_socket(n->zctx, ZMQ_ROUTER);
    n->sock = zmq_socket(n->zctx, ZMQ_DEALER);
    if (zmq_bind(g.router, "inproc://fuzz-decode-router") != 0 ||
        zmq_setsockopt(n->sock, ZMQ_ROUTING_ID, "decode0", 7) != 0 ||
        zmq_connect(n->sock, "inproc://fuzz-decode-router") != 0)
        abort();
    struct kvr_ctx_opts co = {.n_threads = 1, .max_batch = FUZZ_BATCH};
    if (kvr_node_start_worker(n, &co, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "fuzz_decode: worker: %s\n", err);
        abort();
    }
    const struct kvr_kv_layout *L = &n->layout;
    d->npool.kv.layout = *L;
    d->npool.kv.n_blocks = FUZZ_BLOCKS;
    d->npool.kv.layer_base = (void *)g.slabs;
    for (int l = 0; l < L->n_layers; l++)
        g.slabs[l] = calloc(1, kvr_kv_layer_bytes(L, FUZZ_BLOCKS));
    d->vocab = kvr_model_vocab(n->model);
    d->maxpos = kvr_model_max_pos(n->model);
    d->max_batch = FUZZ_BATCH;
    d->n_eos = kvr_model_eos_ids(n->model, &d->eos);
    d->job.logits = malloc((size_t)FUZZ_BATCH * (size_t)d->vocab * sizeof *d->job.logits);
    d->job.chunk_logits = malloc((size_t)d->vocab * sizeof *d->job.chunk_logits);
    d->job.seqs = calloc(FUZZ_BATCH, sizeof *d->job.seqs);
    d->job.members = calloc(FUZZ_BATCH, sizeof *d->job.members);
    d->batch = calloc(FUZZ_BATCH, sizeof *d->batch);
    d->chunk = (int32_t)n->cluster->prefill_chunk_tokens;
    d->headroom = 1;
    g.ready = true;
}

/* Reads back everything the node sent: each message decodes as its
 * method's type. */
static void drain_sent(void)
{
    for (;;) {
        kvr_proto_frame_t f;
        char err[256];
        kvr_status_t s = kvr_proto_recv(g.router, true, &f, err, sizeof err);
        if (s == KVR_ERR_NO_RESOURCE) {
            kvr_proto_frame_clear(&f);
            return;
        }
        ProtobufCMessage *m = NULL;
        if (s != KVR_OK || kvr_proto_decode_request(&f, NULL, &m, err, sizeof err) != KVR_OK) {
            fprintf(stderr, "fuzz_decode: the node sent a bad message: %s\n", err);
            abort();
        }
        protobuf_c_message_free_unpacked(m, NULL);
        kvr_proto_frame_clear(&f);
    }
}

/* Submits a step when there is work and waits for its DONE. */
static void run_step(struct decode *d)
{
    if (!d->busy)
        start_step(d);
    if (!d->busy)
        return;
    void *ws = kvr_worker_socket(d->node.worker);
    for (int tries = 0; d->busy; tries++) {
        zmq_pollitem_t it = {ws, 0, ZMQ_POLLIN, 0};
        if (tries > 600 || zmq_poll(&it, 1, 100) < 0) {
            fprintf(stderr, "fuzz_decode: the engine step did not end\n");
            abort();
        }
        struct kvr_worker_event ev;
        while (kvr_worker_next_event(d->node.worker, &ev))
            on_worker(d, &ev);
    }
}

static uint8_t take(const uint8_t *data, size_t size, size_t *pos)
{
    return *pos < size ? data[(*pos)++] : 0;
}

/* the transfer tokens the router gives prefill0's and prefill1's pairs */
static const uint8_t fz_tokens[2][KVR_XFER_TOKEN_LEN] = {
    {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
    {17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}};

static void op_reserve(struct decode *d, const uint8_t b[6])
{
    uint32_t tokens[96];
    /* a shared prefix of 0, 8 or 16 tokens (two full blocks of 4 each
     * give the prefix cache something to match), then a suffix */
    size_t np = (size_t)(b[1] % 3) * 8, ns = 1 + b[2] % 24;
    for (size_t i = 0; i < np; i++)
        tokens[i] = (uint32_t)(7 * i + 11);
    for (size_t i = 0; i < ns; i++)
        tokens[np + i] = (uint32_t)((b[2] * 31u + (unsigned)i * b[3]) % 300u);
    if (b[5] == 0xff)
        tokens[0] = 5000; /* outside the vocabulary */
    Kvrail__Reserve m = KVRAIL__RESERVE__INIT;
    Kvrail__SamplingParams sp = KVRAIL__SAMPLING_PARAMS__INIT;
    sp.seed = b[3];
    sp.temperature = (b[3] & 1) ? 0.8f : 0.0f;
    m.request_id = 1 + b[0] % 4;
    m.token_ids = tokens;
    m.n_token_ids = np + ns;
    m.max_tokens = b[3] % 12;
    m.attempt = (b[4] >> 4) % 3;
    m.local_prefill = b[4] & 1;
    m.prefill_node = (b[4] & 2) ? "prefill1" : "prefill0";
    if (b[5] & 0x20) { /* its pair's token, or (0x40) the other node's */
        m.transport_token.data = (uint8_t *)fz_tokens[((b[4] >> 1) & 1) ^ ((b[5] >> 6) & 1)];
        m.transport_token.len = KVR_XFER_TOKEN_LEN;
    }
    m.sampling = &sp;
    m.lease_ms = b[5] & 0x10 ? 1 : 0;
    on_msg(d, KVRAIL__METHOD__RESERVE, &m.base);
}

static void op_notif(struct decode *d, const uint8_t b[5])
{
    struct kvr_notif n;
    memset(&n, 0, sizeof n);
    n.kind = (uint16_t)(1 + b[0] % 4);
    n.request_id = 1 + b[1] % 4;
    snprintf(n.node, sizeof n.node, "%s", (b[0] & 0x10) ? "prefill1" : "prefill0");
    n.incarnation = (b[0] & 0x20) ? 2 : 1;
    n.attempt = (b[2] >> 4) % 3;
    const struct kvr_kv_layout *L = &d->node.layout;
    n.fingerprint = d->node.fingerprint ^ ((b[0] & 0x40) ? 1 : 0);
    n.n_layers = L->n_layers;
    n.n_kv_heads = L->n_kv_heads;
    n.head_dim = L->head_dim;
    n.block_size = L->block_size;
    n.dtype = L->dtype;
    n.proto_version = KVR_PROTO_VERSION;
    n.first_token = (int32_t)b[3] * ((b[0] & 0x80) ? 7 : 1);
    n.first_block = b[4];
    if (b[2] & 1) /* the first uncached block of a live request with that id */
        for (struct dreq *r = d->reqs; r; r = r->next)
            if (r->id == n.request_id && r->n_cached_blocks < r->n_blocks)
                n.first_block = r->blocks[r->n_cached_blocks];
    uint8_t buf[KVR_NOTIF_WIRE_MAX];
    size_t len = kvr_notif_encode(&n, buf, sizeof buf);
    if (!len)
        abort();
    /* under no token (2), the sender's, or (4) the other node's */
    const uint8_t *tok = (b[2] & 2) ? NULL : fz_tokens[((b[0] >> 4) & 1) ^ ((b[2] >> 2) & 1)];
    on_notif(d, buf, len, tok);
}

static void op_raw_frame(struct decode *d, unsigned method, uint8_t flags, const uint8_t *p,
                         size_t len)
{
    kvr_proto_frame_t f;
    memset(&f, 0, sizeof f);
    f.hdr.version = KVR_PROTO_VERSION;
    f.hdr.method = (uint16_t)method;
    f.hdr.flags = flags;
    f.have_hdr = true;
    f.nparts = 2;
    if (len) {
        f.payload = malloc(len);
        memcpy(f.payload, p, len);
        f.payload_len = len;
    }
    const ProtobufCMessageDescriptor *desc =
        method == KVRAIL__METHOD__REGISTER || method == KVRAIL__METHOD__HEARTBEAT
            ? kvr_proto_method_reply_desc(method)
            : kvr_proto_method_desc(method);
    ProtobufCMessage *m = NULL;
    char err[256];
    if (desc && !(flags & KVR_PROTO_F_ERROR) && method != KVRAIL__METHOD__REGISTER &&
        method != KVRAIL__METHOD__HEARTBEAT &&
        kvr_proto_decode(&f, desc, &m, err, sizeof err) == KVR_OK) {
        on_msg(d, method, m);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    kvr_proto_frame_clear(&f);
}

static void check(struct decode *d)
{
    if (kvr_blocktab_check(d->bt) != KVR_OK) {
        fprintf(stderr, "fuzz_decode: block table inconsistent\n");
        abort();
    }
    for (struct dreq *r = d->reqs; r; r = r->next)
        if (r->n_blocks > r->max_blocks || r->n_cached_blocks > r->n_blocks)
            abort();
    if (d->n_batch < 0 || d->n_batch > d->max_batch)
        abort();
    drain_sent();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    struct decode *d = &D;
    if (kvr_blocktab_create(FUZZ_BLOCKS, on_block_event, d, &d->bt) != KVR_OK)
        abort();
    d->paged = size > 0 && (data[0] & 1);
    d->node.cluster->reservation = d->paged ? KVR_RESERVE_PAGED : KVR_RESERVE_WHOLE;
    d->n_peers = 0;
    d->ev.n = 0;
    d->ev_seq = 0;
    size_t pos = size > 0 ? 1 : 0;
    while (pos < size) {
        uint8_t op = take(data, size, &pos);
        uint8_t b[6];
        switch (op % 8) {
        case 0: {
            unsigned method = take(data, size, &pos) % 24;
            uint8_t flags = take(data, size, &pos);
            size_t len = take(data, size, &pos);
            if (len > size - pos)
                len = size - pos;
            op_raw_frame(d, method, flags, data + pos, len);
            pos += len;
            break;
        }
        case 1:
            for (int i = 0; i < 6; i++)
                b[i] = take(data, size, &pos);
            op_reserve(d, b);
            break;
        case 2: {
            Kvrail__NodeCancel c = KVRAIL__NODE_CANCEL__INIT;
            c.request_id = 1 + take(data, size, &pos) % 4;
            on_msg(d, KVRAIL__METHOD__NODE_CANCEL, &c.base);
            break;
        }
        case 3: {
            size_t len = take(data, size, &pos);
            if (len > size - pos)
                len = size - pos;
            uint8_t *copy = malloc(len ? len : 1);
            memcpy(copy, data + pos, len);
            on_notif(d, copy, len, NULL);
            free(copy);
            pos += len;
            break;
        }
        case 4:
            for (int i = 0; i < 5; i++)
                b[i] = take(data, size, &pos);
            op_notif(d, b);
            break;
        case 5:
            run_step(d);
            break;
        case 6:
            for (struct dreq *r = d->reqs; r; r = r->next)
                r->deadline = 0;
            check_leases(d);
            break;
        default:
            on_msg(d, KVRAIL__METHOD__RESYNC, NULL);
            break;
        }
        flush_events(d);
        check(d);
    }
    /* the end: the step in flight finishes, every request ends */
    run_step(d);
    while (d->busy)
        run_step(d);
    while (d->reqs)
        req_end(d, d->reqs, false);
    flush_events(d);
    check(d);
    struct kvr_blocktab_counts c;
    kvr_blocktab_counts(d->bt, &c);
    if (c.referenced != 0 || d->n_batch != 0) {
        fprintf(stderr, "fuzz_decode: %u blocks stranded after every request ended\n",
                c.referenced);
        abort();
    }
    kvr_blocktab_destroy(d->bt);
    d->bt = NULL;
    return 0;
}
