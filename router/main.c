/*
 * main.c - kvrail-router: the cluster's router process.
 *
 *   kvrail-router --config FILE [--node NAME] [--log-level LEVEL]
 *
 * Loads the cluster file, the model's tokenizer and context length
 * (MODEL/tokenizer.json, MODEL/config.json), binds the client endpoint and
 * the node endpoint (two ZeroMQ ROUTER sockets) and runs one event loop
 * (zmq_poll) over them and a monitor socket that reports client
 * disconnections (the fd of each client connection is kept from ZMQ_SRCFD).
 * Timers (heartbeat deadlines, queue/prefill/request deadlines, resync
 * retries) run every 10 ms.  SIGINT/SIGTERM end the loop; every request
 * still open gets a final status.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "kvr_clock.h"
#include "kvr_json.h"
#include "kvr_log.h"
#include "router.h"

#define TICK_MS 10

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

uint64_t rt_rand(rt_t *r)
{
    /* splitmix64 */
    uint64_t z = (r->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t rt_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool rt_bad_log_ok(rt_t *r)
{
    uint64_t now = kvr_now_ns();
    if (now - r->bad_log_window_ns > 1000000000ull) {
        if (r->bad_log_suppressed)
            KVR_LOG_WARN("router", "%" PRIu64 " more log lines about bad input suppressed",
                         r->bad_log_suppressed);
        r->bad_log_window_ns = now;
        r->bad_log_count = 0;
        r->bad_log_suppressed = 0;
    }
    if (r->bad_log_count < 20) {
        r->bad_log_count++;
        return true;
    }
    r->bad_log_suppressed++;
    return false;
}

void rt_samples_add(struct rt_samples *s, uint64_t ns)
{
    s->v[s->n % RT_SAMPLES] = ns;
    s->n++;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t rt_samples_pct(const struct rt_samples *s, double q)
{
    size_t n = s->n < RT_SAMPLES ? s->n : RT_SAMPLES;
    if (!n)
        return 0;
    static uint64_t tmp[RT_SAMPLES];
    memcpy(tmp, s->v, n * sizeof(uint64_t));
    qsort(tmp, n, sizeof(uint64_t), cmp_u64);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return tmp[i < n ? i : n - 1];
}

kvr_status_t rt_send_node(rt_t *r, struct rt_node *n, unsigned method, const ProtobufCMessage *msg)
{
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, (uint16_t)method, 0};
    kvr_status_t st = kvr_proto_send(r->node_sock, n->name, strlen(n->name), &h, msg);
    if (st == KVR_ERR_NOT_FOUND && n->alive && !n->conn_lost) {
        /* its connection is gone: the next tick declares it dead */
        n->conn_lost = true;
    }
    if (st != KVR_OK)
        KVR_LOG_WARN("router", "cannot send %s to node %s: %s", kvr_proto_method_name(method),
                     n->name, kvr_status_str(st));
    return st;
}

static void add_eos(rt_t *r, const kvr_json_t *root)
{
    const kvr_json_t *e = kvr_json_get(root, "eos_token_id");
    if (!e)
        return;
    if (e->type == KVR_JSON_NUMBER && e->is_int && e->i64 >= 0 && r->n_eos < 16)
        r->eos_ids[r->n_eos++] = (uint32_t)e->i64;
    if (e->type == KVR_JSON_ARRAY)
        for (size_t i = 0; i < e->n && r->n_eos < 16; i++)
            if (e->items[i]->type == KVR_JSON_NUMBER && e->items[i]->is_int &&
                e->items[i]->i64 >= 0)
                r->eos_ids[r->n_eos++] = (uint32_t)e->items[i]->i64;
}

static void load_model_info(rt_t *r)
{
    char path[KVR_CLUSTER_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/config.json", r->cl->model_dir);
    kvr_json_doc_t *doc = NULL;
    char err[512];
    char gpath[KVR_CLUSTER_PATH_MAX + 32];
    snprintf(gpath, sizeof(gpath), "%s/generation_config.json", r->cl->model_dir);
    if (kvr_json_parse_file(gpath, &doc, err, sizeof(err)) == KVR_OK) {
        add_eos(r, kvr_json_root(doc));
        kvr_json_free(doc);
        doc = NULL;
    }
    if (kvr_json_parse_file(path, &doc, err, sizeof(err)) == KVR_OK) {
        if (!r->n_eos)
            add_eos(r, kvr_json_root(doc));
        const kvr_json_t *root = kvr_json_root(doc);
        int64_t ctx = kvr_json_get_int(root, "max_position_embeddings", 0, NULL);
        int64_t voc = kvr_json_get_int(root, "vocab_size", 0, NULL);
        if (ctx > 0 && ctx < (1ll << 31))
            r->context = (uint32_t)ctx;
        if (voc > 0 && voc < (1ll << 31))
            r->vocab = (uint32_t)voc;
        kvr_json_free(doc);
        KVR_LOG_INFO("router", "model %s: context %u tokens, vocabulary %u", r->cl->model_dir,
                     r->context, r->vocab);
    } else {
        KVR_LOG_WARN("router", "%s (context and vocabulary come from the nodes instead)", err);
    }
#if KVR_ROUTER_HAVE_TOKENIZER
    kvr_status_t st = kvr_tokenizer_load(r->cl->model_dir, &r->tok, err, sizeof(err));
    if (st != KVR_OK) {
        r->tok = NULL;
        KVR_LOG_WARN("router", "no tokenizer: %s (clients must send token ids)", err);
    } else if (!r->vocab) {
        r->vocab = (uint32_t)kvr_tokenizer_vocab_size(r->tok);
    }
#endif
}

static void *make_router_socket(rt_t *r, const char *bind, const char *what)
{
    void *s = zmq_socket(r->zctx, ZMQ_ROUTER);
    if (!s)
        return NULL;
    int one = 1, zero = 0, hwm = 1000000;
    zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
    zmq_setsockopt(s, ZMQ_ROUTER_HANDOVER, &one, sizeof(one));
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    if (zmq_bind(s, bind) != 0) {
        KVR_LOG_ERROR("router", "cannot bind the %s endpoint %s: %s", what, bind,
                      zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    KVR_LOG_INFO("router", "%s endpoint on %s", what, bind);
    return s;
}

uint32_t rt_fd_epoch(const rt_t *r, int fd)
{
    return fd >= 0 && fd < RT_MAX_CLIENT_FD ? r->fd_epoch[fd] : 0;
}

void rt_drain_monitor(rt_t *r)
{
    for (;;) {
        zmq_msg_t ev;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, r->mon_sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (const uint8_t *)zmq_msg_data(&ev) + 2, 4);
        }
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        while (more) { /* the endpoint address part */
            zmq_msg_t p;
            zmq_msg_init(&p);
            if (zmq_msg_recv(&p, r->mon_sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&p);
                break;
            }
            more = zmq_msg_more(&p);
            zmq_msg_close(&p);
        }
        KVR_LOG_DEBUG("router", "client socket event %u fd %u", event, value);
        if (event == ZMQ_EVENT_DISCONNECTED)
            rt_client_gone(r, (int)value);
        else if (event == ZMQ_EVENT_ACCEPTED && value < RT_MAX_CLIENT_FD)
            r->fd_epoch[value]++;
    }
}

static void drain(rt_t *r, void *sock, bool client)
{
    for (int i = 0; i < 1024; i++) {
        kvr_proto_frame_t f;
        char err[512] = "";
        kvr_status_t st = kvr_proto_recv(sock, true, &f, err, sizeof(err));
        if (st == KVR_ERR_NO_RESOURCE)
            return;
        uint64_t now = kvr_now_ns();
        if (st != KVR_OK) {
            r->st.bad_frames++;
            if (rt_bad_log_ok(r))
                KVR_LOG_WARN("router", "%s endpoint: bad message from '%.*s': %s (%s)",
                             client ? "client" : "node", (int)f.route_len, (const char *)f.route,
                             err, kvr_status_name(st));
            if (f.route_len)
                kvr_proto_send_error(sock, f.route, f.route_len,
                                     f.have_hdr && st != KVR_ERR_UNSUPPORTED ? f.hdr.method : 0u,
                                     f.have_hdr ? f.hdr.call_id : 0u, st, "%s", err);
        } else if (client) {
            rt_client_msg(r, &f, now);
        } else {
            rt_node_msg(r, &f, now);
        }
        kvr_proto_frame_clear(&f);
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvrail-router --config FILE [--node NAME] [--log-level LEVEL]\n"
               "  --config FILE   cluster file (docs/cluster-file.md)\n"
               "  --node NAME     this router's node in the file (default: the first with "
               "role router)\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"node", required_argument, NULL, 'n'},
        {"log-level", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config = NULL, *node = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "c:n:l:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case 'n':
            node = optarg;
            break;
        case 'l': {
            int lv = kvr_log_parse_level(optarg);
            if (lv < 0) {
                fprintf(stderr, "kvrail-router: unknown log level '%s'\n", optarg);
                return 2;
            }
            kvr_log_set_level((enum kvr_log_level)lv);
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!config || optind != argc) {
        usage(stderr);
        return 2;
    }
    static rt_t rt;
    rt_t *r = &rt;
    char err[1024];
    int rc = 1;
    if (kvr_cluster_load(config, &r->cl, err, sizeof(err)) != KVR_OK) {
        fprintf(stderr, "kvrail-router: %s\n", err);
        return 1;
    }
    r->self = node ? kvr_cluster_find(r->cl, node) : kvr_cluster_first(r->cl, KVR_NODE_ROLE_ROUTER);
    if (node && !r->self) {
        fprintf(stderr, "kvrail-router: %s: no node named '%s'\n", config, node);
        goto out_cluster;
    }
    if (r->self && r->self->role != KVR_NODE_ROLE_ROUTER) {
        fprintf(stderr, "kvrail-router: %s: node '%s' has role %s, not router\n", config,
                r->self->name, kvr_node_role_name(r->self->role));
        goto out_cluster;
    }
    kvr_log_set_process(r->self ? r->self->name : "router");
    r->start_ns = kvr_now_ns();
    r->rng = r->start_ns ^ ((uint64_t)getpid() << 32);
    if (rt_nodes_init(r) != KVR_OK || !rt_u64map_init(&r->reqs, 1024))
        goto out_cluster;
    load_model_info(r);

    r->zctx = zmq_ctx_new();
    r->client_sock = make_router_socket(r, r->cl->client_bind, "client");
    if (!r->client_sock)
        goto out_ctx;
    r->node_sock = make_router_socket(r, r->cl->node_bind, "node");
    if (!r->node_sock)
        goto out_ctx;
    char mon_ep[64];
    snprintf(mon_ep, sizeof(mon_ep), "inproc://kvr-router-mon-%d", (int)getpid());
    if (zmq_socket_monitor(r->client_sock, mon_ep, ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPTED) !=
        0) {
        KVR_LOG_ERROR("router", "zmq_socket_monitor: %s", zmq_strerror(zmq_errno()));
        goto out_ctx;
    }
    r->mon_sock = zmq_socket(r->zctx, ZMQ_PAIR);
    if (!r->mon_sock || zmq_connect(r->mon_sock, mon_ep) != 0)
        goto out_ctx;

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    KVR_LOG_INFO("router", "cluster %s: %d prefill/decode nodes, block size %u, ready", r->cl->name,
                 r->n_nodes, r->cl->block_size);
    uint64_t next_tick = kvr_now_ns();
    while (!stop_flag) {
        zmq_pollitem_t items[] = {
            {r->client_sock, 0, ZMQ_POLLIN, 0},
            {r->node_sock, 0, ZMQ_POLLIN, 0},
            {r->mon_sock, 0, ZMQ_POLLIN, 0},
        };
        uint64_t now = kvr_now_ns();
        long wait_ms = next_tick > now ? (long)((next_tick - now) / 1000000u) : 0;
        int n = zmq_poll(items, 3, wait_ms);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            KVR_LOG_ERROR("router", "zmq_poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        /* nodes first: tokens and reservations unblock clients */
        if (items[1].revents & ZMQ_POLLIN)
            drain(r, r->node_sock, false);
        if (items[0].revents & ZMQ_POLLIN)
            drain(r, r->client_sock, true);
        if (items[2].revents & ZMQ_POLLIN)
            rt_drain_monitor(r);
        now = kvr_now_ns();
        if (now >= next_tick) {
            if (r->bad_log_suppressed && now - r->bad_log_window_ns > 1000000000ull)
                rt_bad_log_ok(r); /* logs how many lines were suppressed */
            rt_nodes_tick(r, now);
            rt_requests_tick(r, now);
            next_tick = now + TICK_MS * 1000000ull;
        }
    }
    KVR_LOG_INFO("router", "shutting down");
    rc = 0;
    rt_requests_fini(r);

out_ctx:
    if (r->mon_sock)
        zmq_close(r->mon_sock);
    if (r->client_sock)
        zmq_close(r->client_sock);
    if (r->node_sock)
        zmq_close(r->node_sock);
    if (r->zctx)
        zmq_ctx_term(r->zctx);
#if KVR_ROUTER_HAVE_TOKENIZER
    if (r->tok)
        kvr_tokenizer_destroy(r->tok);
#endif
    rt_u64map_free(&r->reqs);
    rt_nodes_fini(r);
out_cluster:
    kvr_cluster_free(r->cl);
    return rc;
}
