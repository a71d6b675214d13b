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
 * Timers run by next deadline: the modules arm the earliest time something
 * is due (heartbeat deadlines, resync retries, request/queue/prefill
 * deadlines), the poll sleeps until then, and an idle router does not wake.
 * After every message and every timer run the loop hands the registry's
 * events (dead or re-registered nodes) to failover and runs the queue pump
 * when room may have appeared.  SIGINT/SIGTERM end the loop; every request
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
#include "kvr_endpoint.h"
#include "kvr_json.h"
#include "kvr_log.h"
#include "kvr_version.h"
#include "router.h"
#include "rt_metrics.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void load_model_info(rt_t *r)
{
    char path[KVR_CLUSTER_PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/config.json", r->cl->model_dir);
    kvr_json_doc_t *doc = NULL;
    char err[512];
    if (kvr_json_parse_file(path, &doc, err, sizeof(err)) == KVR_OK) {
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
    kvr_status_t st = kvr_tokenizer_load(r->cl->model_dir, &r->tok, err, sizeof(err));
    if (st != KVR_OK) {
        r->tok = NULL;
        KVR_LOG_WARN("router", "no tokenizer: %s (clients must send token ids)", err);
    } else if (!r->vocab) {
        r->vocab = (uint32_t)kvr_tokenizer_vocab_size(r->tok);
    }
}

static void *make_router_socket(rt_t *r, const char *bind, const char *what, bool client)
{
    void *s = zmq_socket(r->zctx, ZMQ_ROUTER);
    if (!s)
        return NULL;
    int one = 1, zero = 0, hwm = 1000000;
    zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
    /* A restarted node takes its routing id back at once (handover) with
     * auth: none.  With CURVE a second connection under a name in use is
     * refused instead: a holder of one node's key must not take over the
     * connection (and the messages) of another; a restarted node gets its
     * name once its old connection is gone (reconnects every 100 ms). */
    if (r->cl->auth != KVR_AUTH_CURVE)
        zmq_setsockopt(s, ZMQ_ROUTER_HANDOVER, &one, sizeof(one));
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof(hwm));
    char err[512];
    if (r->cl->auth == KVR_AUTH_CURVE &&
        kvr_proto_curve_server(s, r->cl, client ? "client" : "node", err, sizeof(err)) != KVR_OK) {
        KVR_LOG_ERROR("router", "%s endpoint: %s", what, err);
        zmq_close(s);
        return NULL;
    }
    char addr[512];
    if (kvr_endpoint_bind_form(bind, addr, sizeof(addr), err, sizeof(err)) != KVR_OK) {
        KVR_LOG_ERROR("router", "cannot bind the %s endpoint: %s", what, err);
        zmq_close(s);
        return NULL;
    }
    if (zmq_bind(s, addr) != 0) {
        KVR_LOG_ERROR("router", "cannot bind the %s endpoint %s (%s): %s", what, bind, addr,
                      zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    KVR_LOG_INFO("router", "%s endpoint on %s", what, bind);
    return s;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvrail-router --config FILE [--node NAME] [--log-level LEVEL]\n"
               "  --config FILE   cluster file (docs/cluster-file.md)\n"
               "  --node NAME     this router's node in the file (default: the first with "
               "role router)\n"
               "  --version       print the version and git revision\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},    {"node", required_argument, NULL, 'n'},
        {"log-level", required_argument, NULL, 'l'}, {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},         {NULL, 0, NULL, 0},
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
        case 'V':
            kvr_version_print("kvrail-router");
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
    r->next_deadline = UINT64_MAX;
    if (rt_registry_init(r) != KVR_OK || !rt_requests_init(r))
        goto out_cluster;
    load_model_info(r);

    r->zctx = zmq_ctx_new();
    if (rt_auth_init(r) != KVR_OK)
        goto out_ctx;
    r->client_sock = make_router_socket(r, r->cl->client_bind, "client", true);
    if (!r->client_sock)
        goto out_ctx;
    r->node_sock = make_router_socket(r, r->cl->node_bind, "node", false);
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

    if (!rt_metrics_start(r))
        goto out_ctx;
    KVR_LOG_INFO("router", "cluster %s: %d prefill/decode nodes, block size %u, ready", r->cl->name,
                 r->n_nodes, r->cl->block_size);
    while (!stop_flag) {
        zmq_pollitem_t items[] = {
            {r->client_sock, 0, ZMQ_POLLIN, 0},
            {r->node_sock, 0, ZMQ_POLLIN, 0},
            {r->mon_sock, 0, ZMQ_POLLIN, 0},
            {r->zap_sock, 0, ZMQ_POLLIN, 0},
        };
        uint64_t now = kvr_now_ns();
        long wait_ms = -1; /* nothing due: sleep until a message */
        if (r->next_deadline <= now)
            wait_ms = 0;
        else if (r->next_deadline != UINT64_MAX)
            wait_ms = (long)((r->next_deadline - now + 999999u) / 1000000u);
        int n = zmq_poll(items, r->zap_sock ? 4 : 3, wait_ms);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            KVR_LOG_ERROR("router", "zmq_poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        if (r->zap_sock && (items[3].revents & ZMQ_POLLIN))
            rt_auth_zap(r); /* handshakes wait on it */
        /* nodes first: tokens and reservations unblock clients */
        if (items[1].revents & ZMQ_POLLIN)
            rt_loop_drain(r, r->node_sock, false);
        if (items[0].revents & ZMQ_POLLIN)
            rt_loop_drain(r, r->client_sock, true);
        now = kvr_now_ns();
        if (items[2].revents & ZMQ_POLLIN) {
            rt_client_monitor(r);
            rt_loop_settle(r, now);
        }
        if (now >= r->next_deadline)
            rt_loop_timers(r, now);
        rt_metrics_update(r, now); /* Prometheus mirror, at most once a second */
    }
    KVR_LOG_INFO("router", "shutting down");
    rc = 0;
    rt_requests_fini(r);

out_ctx:
    rt_metrics_stop();
    rt_auth_fini(r);
    if (r->mon_sock)
        zmq_close(r->mon_sock);
    if (r->client_sock)
        zmq_close(r->client_sock);
    if (r->node_sock)
        zmq_close(r->node_sock);
    if (r->zctx)
        zmq_ctx_term(r->zctx);
    if (r->tok)
        kvr_tokenizer_destroy(r->tok);
    rt_registry_fini(r);
out_cluster:
    kvr_cluster_free(r->cl);
    return rc;
}
