/*
 * test_client_abi.c - libkvrail-client's ABI (.so.2): the structs a caller
 * allocates (kvr_gen_params, kvr_gen_token, kvr_cluster_status,
 * kvr_node_info) carry the caller's size, and the library reads and writes
 * no byte past it.
 *
 * A caller built against an older, shorter header is played by a buffer
 * whose size field says where its struct ends, with a canary pattern
 * after it.  The router is played by a ZeroMQ ROUTER socket in this test
 * (the wire format is kvr_proto's, decoded with the real descriptors):
 *   1. kvr_gen_params_init(p, old size) sets the defaults and the size and
 *      leaves the bytes past the old size alone;
 *   2. kvr_client_generate_start() with such a struct, garbage past its
 *      size, sends the caller's fields and the defaults for the rest
 *      (min_p, penalties, logit bias, top logprobs), never the garbage;
 *      params whose size is 0 are refused with a message naming the fix;
 *   3. kvr_gen_stream_next() into an old, shorter kvr_gen_token fills the
 *      fields it has (size says how many bytes), not the canary after it;
 *      a full-size token gets the rest (top logprobs) too;
 *   4. kvr_client_status() (the test's router, on a thread, answers STATUS
 *      with 70 nodes, more than .so.1's fixed array of 64 held): a full-size
 *      caller gets every node and every field; an older caller's shorter
 *      kvr_cluster_status is filled up to its size (canary after it left
 *      alone) and its shorter kvr_node_info elements are laid out at its
 *      own stride, each filled up to its size; a later caller's longer
 *      elements read 0 past what the library has; sizes that cannot be a
 *      caller's sizeof are refused with a message naming the fix.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include "kvr_client.h"
#include "kvr_proto.h"
#include "kvr_test.h"

#define GARBAGE 0xAB
#define CANARY  0xCD

static bool all_bytes(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* The test's router: one frame from the client, decoded as GENERATE. */
static Kvrail__GenerateRequest *recv_generate(void *router, kvr_proto_frame_t *f)
{
    char err[256];
    zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
    KVR_CHECK(zmq_poll(&it, 1, 5000) == 1);
    KVR_CHECK_STATUS(kvr_proto_recv(router, true, f, err, sizeof(err)), KVR_OK);
    KVR_CHECK_EQ(f->hdr.method, KVRAIL__METHOD__GENERATE);
    ProtobufCMessage *m = NULL;
    KVR_CHECK_STATUS(
        kvr_proto_decode_request(f, &kvrail__generate_request__descriptor, &m, err, sizeof(err)),
        KVR_OK);
    return (Kvrail__GenerateRequest *)m;
}

static void send_chunk(void *router, const kvr_proto_frame_t *f, uint32_t token_id)
{
    Kvrail__GenerateChunk ch = KVRAIL__GENERATE_CHUNK__INIT;
    Kvrail__TopLogprob tl[3], *tlp[3];
    for (int i = 0; i < 3; i++) {
        kvrail__top_logprob__init(&tl[i]);
        tl[i].token_id = 100 + (uint32_t)i;
        tl[i].logprob = -1.0f - (float)i;
        tlp[i] = &tl[i];
    }
    ch.request_id = 7;
    ch.token_id = token_id;
    ch.logprob = -0.25f;
    ch.text = (char *)"hi";
    ch.top_logprobs = tlp;
    ch.n_top_logprobs = 3;
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__GENERATE, f->hdr.call_id};
    KVR_CHECK_STATUS(kvr_proto_send(router, f->route, f->route_len, &h, &ch.base), KVR_OK);
}

#define N_NODES 70

/* The test's router answering STATUS: N_NODES nodes, node i named "n<i>"
 * with failures_blamed i and cooling on odd i; arg: how many to answer. */
static void *status_server(void *arg)
{
    void **a = arg;
    void *router = a[0];
    int n = (int)(intptr_t)a[1];
    static char names[N_NODES][16];
    static Kvrail__NodeStatus ns[N_NODES];
    static Kvrail__NodeStatus *nsp[N_NODES];
    for (int i = 0; i < N_NODES; i++) {
        kvrail__node_status__init(&ns[i]);
        snprintf(names[i], sizeof(names[i]), "n%d", i);
        ns[i].name = names[i];
        ns[i].role = i % 2 ? KVRAIL__ROLE__ROLE_DECODE : KVRAIL__ROLE__ROLE_PREFILL;
        ns[i].alive = true;
        ns[i].failures_blamed = (uint64_t)i;
        ns[i].cooling = i % 2;
        nsp[i] = &ns[i];
    }
    Kvrail__RouterStats rs = KVRAIL__ROUTER_STATS__INIT;
    rs.requests = 1234;
    rs.unresponsive_nodes = 5;
    Kvrail__StatusReply r = KVRAIL__STATUS_REPLY__INIT;
    r.model = (char *)"abi-model";
    r.block_size = 16;
    r.router = &rs;
    r.nodes = nsp;
    r.n_nodes = N_NODES;
    for (int k = 0; k < n; k++) {
        kvr_proto_frame_t f;
        char err[256];
        zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 5000) != 1 ||
            kvr_proto_recv(router, true, &f, err, sizeof(err)) != KVR_OK)
            return NULL; /* the client's call then times out and the test fails */
        if (f.hdr.method == KVRAIL__METHOD__STATUS) {
            kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, KVRAIL__METHOD__STATUS, f.hdr.call_id};
            kvr_proto_send(router, f.route, f.route_len, &h, &r.base);
        } else {
            k--; /* a CANCEL of section 3's stream */
        }
        kvr_proto_frame_clear(&f);
    }
    return NULL;
}

static void check_status(void *router)
{
    kvr_client_t *c = NULL;
    char ep[256];
    size_t eplen = sizeof(ep);
    KVR_CHECK(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &eplen) == 0);
    KVR_CHECK_STATUS(kvr_client_connect(ep, &c), KVR_OK);
    void *arg[2] = {router, (void *)(intptr_t)4};
    pthread_t th;
    KVR_CHECK(pthread_create(&th, NULL, status_server, arg) == 0);

    /* a full-size caller */
    struct kvr_cluster_status st;
    memset(&st, GARBAGE, sizeof(st));
    KVR_CHECK_STATUS(kvr_client_status(c, 5000, &st), KVR_OK);
    KVR_EXPECT(st.size == sizeof(st) && !strcmp(st.model, "abi-model") && st.block_size == 16 &&
                   st.requests == 1234 && st.unresponsive_nodes == 5 && st.n_nodes == N_NODES,
               "full status: size %zu, model %.20s, requests %llu, unresponsive %llu, %zu nodes",
               st.size, st.model, (unsigned long long)st.requests,
               (unsigned long long)st.unresponsive_nodes, st.n_nodes);
    for (size_t i = 0; i < st.n_nodes && i < N_NODES; i++) {
        char want[16];
        snprintf(want, sizeof(want), "n%zu", i);
        const struct kvr_node_info *n = &st.nodes[i];
        KVR_EXPECT(n->size == sizeof(*n) && !strcmp(n->name, want) && n->alive &&
                       !strcmp(n->role, i % 2 ? "decode" : "prefill") && n->failures_blamed == i &&
                       n->cooling == (i % 2 == 1),
                   "node %zu: size %zu, name %.16s, blamed %llu, cooling %d", i, n->size, n->name,
                   (unsigned long long)n->failures_blamed, n->cooling);
    }

    /* an older caller: its status ends before unresponsive_nodes, its node
     * info before cooldowns */
    const size_t sold = offsetof(struct kvr_cluster_status, unresponsive_nodes);
    const size_t nold = offsetof(struct kvr_node_info, cooldowns);
    union {
        struct kvr_cluster_status s;
        unsigned char b[sizeof(struct kvr_cluster_status) + 64];
    } us;
    memset(&us, CANARY, sizeof(us));
    KVR_CHECK_STATUS(kvr_client_status_sized(c, 5000, &us.s, sold, nold), KVR_OK);
    KVR_EXPECT(us.s.size == sold && us.s.requests == 1234 && !strcmp(us.s.model, "abi-model"),
               "old status: size %zu, want %zu", us.s.size, sold);
    KVR_EXPECT(all_bytes(us.b + sold, sizeof(us) - sold, CANARY),
               "kvr_client_status wrote past the caller's %zu bytes", sold);
    /* its nodes: read at its stride, as a program built with its header
     * indexes them (the fields are where its header has them) */
    struct kvr_cluster_status full;
    KVR_CHECK_STATUS(kvr_client_status_sized(c, 5000, &full, sizeof(full), nold), KVR_OK);
    const unsigned char *base = (const unsigned char *)full.nodes;
    KVR_CHECK(full.n_nodes == N_NODES && base);
    for (size_t i = 0; i < N_NODES; i++) {
        struct kvr_node_info n;
        memset(&n, 0, sizeof(n));
        memcpy(&n, base + i * nold, nold);
        char want[16];
        snprintf(want, sizeof(want), "n%zu", i);
        KVR_EXPECT(n.size == nold && !strcmp(n.name, want) && n.failures_blamed == i,
                   "old node %zu at stride %zu: size %zu, name %.16s, blamed %llu", i, nold, n.size,
                   n.name, (unsigned long long)n.failures_blamed);
    }

    /* a later caller: longer node info; what the library lacks reads 0 */
    const size_t nnew = sizeof(struct kvr_node_info) + 24;
    KVR_CHECK_STATUS(kvr_client_status_sized(c, 5000, &full, sizeof(full), nnew), KVR_OK);
    base = (const unsigned char *)full.nodes;
    for (size_t i = 0; i < N_NODES; i++) {
        const struct kvr_node_info *n = (const struct kvr_node_info *)(base + i * nnew);
        KVR_EXPECT(n->size == sizeof(*n) && n->failures_blamed == i &&
                       all_bytes(base + i * nnew + sizeof(*n), 24, 0),
                   "new node %zu: size %zu, blamed %llu, its extra bytes not 0", i, n->size,
                   (unsigned long long)n->failures_blamed);
    }
    pthread_join(th, NULL);

    /* sizes that cannot be a caller's sizeof: refused before anything is sent */
    KVR_CHECK_STATUS(kvr_client_status_sized(c, 100, &full, sizeof(full), 0), KVR_ERR_INVALID);
    KVR_EXPECT(strstr(kvr_client_error(c), "kvr_client_status()"),
               "node size 0 refused without naming the fix: %s", kvr_client_error(c));
    KVR_CHECK_STATUS(kvr_client_status_sized(c, 100, &full, 0, sizeof(struct kvr_node_info)),
                     KVR_ERR_INVALID);
    KVR_CHECK_STATUS(
        kvr_client_status_sized(c, 100, &full, sizeof(full), KVR_CLIENT_MAX_NODE_INFO + 1),
        KVR_ERR_INVALID);
    kvr_client_close(c);
}

int main(void)
{
    void *zctx = zmq_ctx_new();
    void *router = zmq_socket(zctx, ZMQ_ROUTER);
    KVR_CHECK(router && zmq_bind(router, "tcp://127.0.0.1:*") == 0);
    char ep[256];
    size_t eplen = sizeof(ep);
    KVR_CHECK(zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &eplen) == 0);

    /* 1. an old caller's params: up to (not including) min_p */
    const size_t old = offsetof(struct kvr_gen_params, min_p);
    union {
        struct kvr_gen_params p;
        unsigned char b[sizeof(struct kvr_gen_params) + 64];
    } u;
    memset(&u, GARBAGE, sizeof(u));
    kvr_gen_params_init(&u.p, old);
    KVR_EXPECT(u.p.size == old, "size %zu, want %zu", u.p.size, old);
    KVR_EXPECT(u.p.max_tokens == 16 && u.p.top_p == 1.0f && u.p.repetition_penalty == 1.0f &&
                   u.p.temperature == 0.0f && !u.p.prompt && !u.p.n_stop,
               "defaults not set in the old caller's part");
    KVR_EXPECT(all_bytes(u.b + old, sizeof(u) - old, GARBAGE),
               "kvr_gen_params_init wrote past the caller's %zu bytes", old);

    /* 2. generate_start reads only the caller's part */
    kvr_client_t *c = NULL;
    KVR_CHECK_STATUS(kvr_client_connect(ep, &c), KVR_OK);
    static const uint32_t ids[3] = {5, 6, 7};
    u.p.token_ids = ids;
    u.p.n_token_ids = 3;
    u.p.max_tokens = 5;
    u.p.temperature = 0.5f;
    kvr_gen_stream_t *s = NULL;
    KVR_CHECK_STATUS(kvr_client_generate_start(c, &u.p, &s), KVR_OK);
    kvr_proto_frame_t f;
    Kvrail__GenerateRequest *g = recv_generate(router, &f);
    KVR_EXPECT(g->n_token_ids == 3 && g->token_ids[2] == 7 && g->max_tokens == 5,
               "the caller's prompt and max_tokens");
    KVR_EXPECT(g->sampling && g->sampling->temperature == 0.5f, "the caller's temperature");
    KVR_EXPECT(g->sampling && g->sampling->min_p == 0.0f && g->sampling->presence_penalty == 0.0f &&
                   g->sampling->frequency_penalty == 0.0f && g->sampling->n_logit_bias == 0 &&
                   g->sampling->top_logprobs == 0,
               "fields past the caller's size must be defaults, not its garbage (min_p %g, "
               "top_logprobs %u, logit biases %zu)",
               g->sampling ? g->sampling->min_p : -1.0,
               g->sampling ? g->sampling->top_logprobs : 0u,
               g->sampling ? g->sampling->n_logit_bias : 0);
    protobuf_c_message_free_unpacked(&g->base, NULL);

    struct kvr_gen_params z;
    memset(&z, 0, sizeof(z));
    kvr_gen_stream_t *s0 = NULL;
    KVR_CHECK_STATUS(kvr_client_generate_start(c, &z, &s0), KVR_ERR_INVALID);
    KVR_EXPECT(strstr(kvr_client_error(c), "kvr_gen_params_default"),
               "size 0 refused without naming the fix: %s", kvr_client_error(c));

    /* 3. a token into an old caller's shorter struct (up to n_top), then a full one */
    const size_t told = offsetof(struct kvr_gen_token, n_top);
    union {
        struct kvr_gen_token t;
        unsigned char b[sizeof(struct kvr_gen_token) + 64];
    } tk;
    memset(&tk, CANARY, sizeof(tk));
    send_chunk(router, &f, 42);
    KVR_CHECK_STATUS(kvr_gen_stream_next_sized(s, 5000, &tk.t, told), KVR_OK);
    KVR_EXPECT(tk.t.size == told, "token size %zu, want %zu", tk.t.size, told);
    KVR_EXPECT(tk.t.token_id == 42 && tk.t.logprob == -0.25f && tk.t.text_len == 2 &&
                   !strcmp(tk.t.text, "hi"),
               "the old caller's token fields");
    KVR_EXPECT(all_bytes(tk.b + told, sizeof(tk) - told, CANARY),
               "kvr_gen_stream_next wrote past the caller's %zu bytes", told);

    struct kvr_gen_token full;
    send_chunk(router, &f, 43);
    KVR_CHECK_STATUS(kvr_gen_stream_next(s, 5000, &full), KVR_OK);
    KVR_EXPECT(full.size == sizeof(full) && full.token_id == 43 && full.n_top == 3 &&
                   full.top_ids[2] == 102 && full.top_logprobs[2] == -3.0f,
               "a full token: size %zu, id %u, n_top %zu", full.size, full.token_id, full.n_top);

    kvr_proto_frame_clear(&f);
    kvr_gen_stream_destroy(s);
    kvr_client_close(c);

    /* 4. the status and its nodes, sized by the caller */
    check_status(router);
    zmq_close(router);
    zmq_ctx_term(zctx);
    if (kvr_test_fails)
        return 1;
    printf("client ABI: params, tokens, status and nodes sized by the caller; nothing read or "
           "written past it\n");
    return 0;
}
