/*
 * runtime.c - the runtime shared by kvrail-prefill and kvrail-decode
 * (node.h): start-up from the cluster file, the router connection,
 * registration and heartbeat timing, the event loop (router socket,
 * transfer event fd, engine worker events, timers), and the stats file.
 */
#include "node.h"

#include <errno.h>
#include <inttypes.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "kvr_clock.h"
#include "kvr_config.h"
#if KVR_HAVE_CUDA
#include "kvr_cuda.h"
#endif
#include "kvr_log.h"
#include "kvr_version.h"
#include "node_metrics.h"

#define COMP "node"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

bool kvr_node_stopping(void)
{
    return g_stop != 0;
}

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s --config FILE --node NAME [--stats-file PATH] [--log-level LEVEL]\n"
            "  --config FILE      the cluster file (docs/cluster-file.md)\n"
            "  --node NAME        this node's name in the cluster file\n"
            "  --stats-file PATH  write the node's counters there as JSON (for tests)\n"
            "  --log-level LEVEL  error|warn|info|debug|trace (or KVR_LOG_LEVEL)\n"
            "  --version          print the version and git revision\n",
            prog);
}

kvr_status_t kvr_node_init(kvr_node_t *node, int argc, char **argv, enum kvr_node_role role,
                           kvr_xfer_notif_cb_t notif_cb, void *notif_arg, char *err, size_t err_len)
{
    memset(node, 0, sizeof *node);
    node->xfer_fd = -1;
    node->role = role;
    const char *config = NULL, *name = NULL;
    static const struct option lo[] = {
        {"config", required_argument, 0, 'c'},
        {"node", required_argument, 0, 'n'},
        {"stats-file", required_argument, 0, 's'},
        {"log-level", required_argument, 0, 'l'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:n:h", lo, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case 'n':
            name = optarg;
            break;
        case 's':
            node->stats_path = optarg;
            break;
        case 'l': {
            int lv = kvr_log_parse_level(optarg);
            if (lv < 0) {
                snprintf(err, err_len, "--log-level: unknown level '%s'", optarg);
                return KVR_ERR_INVALID;
            }
            kvr_log_set_level((enum kvr_log_level)lv);
            break;
        }
        case 'h':
            usage(stdout, argv[0]);
            exit(0);
        case 'V':
            kvr_version_print(role == KVR_NODE_ROLE_PREFILL ? "kvrail-prefill" : "kvrail-decode");
            exit(0);
        default:
            usage(stderr, argv[0]);
            snprintf(err, err_len, "bad command line");
            return KVR_ERR_INVALID;
        }
    }
    if (!config || !name) {
        usage(stderr, argv[0]);
        snprintf(err, err_len, "--config FILE and --node NAME are required");
        return KVR_ERR_INVALID;
    }
    kvr_status_t s = kvr_cluster_load(config, &node->cluster, err, err_len);
    if (s != KVR_OK)
        return s;
    node->self = kvr_cluster_find(node->cluster, name);
    if (!node->self) {
        snprintf(err, err_len, "%s: no node named '%s'", config, name);
        return KVR_ERR_NOT_FOUND;
    }
    if (node->self->role != role) {
        snprintf(err, err_len, "%s: node '%s' has role %s, this binary runs %s nodes", config, name,
                 kvr_node_role_name(node->self->role), kvr_node_role_name(role));
        return KVR_ERR_INVALID;
    }
    if (node->self->device_index >= 0) {
        /* never a silent CPU run: the GPU is opened here or the node refuses */
#if KVR_HAVE_CUDA
        char why[400];
        s = kvr_cuda_device_open(node->self->device_index, 0, why, sizeof why);
        if (s != KVR_OK) {
            snprintf(err, err_len, "%s: node '%s' asks for device %s: %s", config, name,
                     node->self->device, why);
            return s;
        }
        /* the pool goes to HBM (pool_device.c) and the engine to the cuda
         * backend (engine/backend.c's default in a process with a GPU); the
         * one transfer backend that moves device memory is cuda_ipc */
        if (strcmp(node->self->transport, "cuda_ipc") != 0) {
            snprintf(err, err_len,
                     "%s: node '%s' asks for device %s, whose KV pool is in HBM: only transport "
                     "backend cuda_ipc (GPUs of one host) moves it in this build; set `transport: "
                     "{backend: cuda_ipc}` on the cluster's nodes, or `device: cpu`",
                     config, name, node->self->device);
            return KVR_ERR_UNSUPPORTED;
        }
#else
        snprintf(err, err_len,
                 "%s: node '%s' asks for device %s, but this build of kvrail has no CUDA "
                 "(built without the CUDA toolkit: meson setup -Dcuda=enabled); set `device: cpu` "
                 "for this node",
                 config, name, node->self->device);
        return KVR_ERR_UNSUPPORTED;
#endif
    }
    snprintf(node->name, sizeof node->name, "%s", name);
    kvr_log_set_process(node->name);
    node->incarnation = (kvr_now_ns() ^ ((uint64_t)getpid() << 40)) | 1;
    node->heartbeat_ms =
        node->cluster->timeouts.heartbeat_ms ? node->cluster->timeouts.heartbeat_ms : 1000;

    uint64_t t0 = kvr_now_ns();
    s = kvr_model_load(node->cluster->model_dir, &node->model, err, err_len);
    if (s != KVR_OK)
        return s;
    int32_t kv_dtype;
    if (kvr_kv_dtype_parse(node->cluster->kv_dtype, &kv_dtype) != KVR_OK) {
        snprintf(err, err_len, "%s: kv_dtype '%s' is not f32, bf16 or f16", config,
                 node->cluster->kv_dtype);
        return KVR_ERR_INVALID;
    }
    s = kvr_kv_layout_init(node->model, (int32_t)node->cluster->block_size, kv_dtype,
                           &node->layout);
    if (s != KVR_OK) {
        snprintf(err, err_len, "block_size %u is not usable with this model",
                 node->cluster->block_size);
        return s;
    }
    node->fingerprint = kvr_model_fingerprint(node->model);
    snprintf(node->fingerprint_str, sizeof node->fingerprint_str, "%016llx",
             (unsigned long long)node->fingerprint);
    KVR_LOG_INFO(COMP,
                 "model %s (%s, %d layers, %d kv heads x %d, vocab %d, context %d) "
                 "fingerprint %s loaded in %.1f ms",
                 node->cluster->model_dir, kvr_model_arch(node->model), node->layout.n_layers,
                 node->layout.n_kv_heads, node->layout.head_dim, kvr_model_vocab(node->model),
                 kvr_model_max_pos(node->model), node->fingerprint_str,
                 (double)(kvr_now_ns() - t0) / 1e6);

    struct kvr_xfer_config xc;
    kvr_xfer_config_init(&xc);
    xc.backend = node->self->transport[0] ? node->self->transport : NULL;
    xc.name = node->name;
    xc.require_rdma = node->self->require_rdma;
    xc.devices = node->self->devices[0] ? node->self->devices : NULL;
    xc.tls = node->self->tls[0] ? node->self->tls : NULL;
    xc.notif_cb = notif_cb;
    xc.notif_arg = notif_arg;
    /* with keys, the transfer engine accepts only the peers the router
     * introduced (the per-pair token of a Reserve, decode/decode.c) */
    xc.require_token = node->cluster->auth != KVR_AUTH_NONE;
    s = kvr_xfer_engine_create(&xc, &node->xfer);
    if (s != KVR_OK) {
        snprintf(err, err_len, "transfer engine '%s': %s", xc.backend ? xc.backend : "default",
                 kvr_status_str(s));
        return s;
    }
    if (kvr_xfer_event_fd(node->xfer, &node->xfer_fd) != KVR_OK)
        node->xfer_fd = -1;

    node->zctx = zmq_ctx_new();
    node->sock = node->zctx ? zmq_socket(node->zctx, ZMQ_DEALER) : NULL;
    if (!node->sock) {
        snprintf(err, err_len, "zmq socket: %s", zmq_strerror(errno));
        return KVR_ERR_IO;
    }
    int zero = 0, hwm = 100000;
    zmq_setsockopt(node->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(node->sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(node->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(node->sock, ZMQ_ROUTING_ID, node->name, strlen(node->name));
    /* auth: curve: this node's key pair and the router's public key */
    s = kvr_proto_curve_client(node->sock, node->cluster, node->name, err, err_len);
    if (s != KVR_OK)
        return s;
    if (zmq_connect(node->sock, node->cluster->node_endpoint) != 0) {
        snprintf(err, err_len, "cannot connect to the router's node endpoint '%s': %s",
                 node->cluster->node_endpoint, zmq_strerror(errno));
        return KVR_ERR_IO;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    s = kvr_node_metrics_start(node, err, err_len);
    if (s != KVR_OK)
        return s;
    KVR_LOG_INFO(COMP, "%s node '%s': router %s, transport %s", kvr_node_role_name(role),
                 node->name, node->cluster->node_endpoint, kvr_xfer_engine_backend(node->xfer));
    return KVR_OK;
}

void kvr_node_fini(kvr_node_t *node)
{
    kvr_node_metrics_stop();
    kvr_worker_destroy(node->worker);
    if (node->sock)
        zmq_close(node->sock);
    if (node->zctx)
        zmq_ctx_term(node->zctx);
    if (node->xfer)
        kvr_xfer_engine_destroy(node->xfer);
    if (node->model)
        kvr_model_destroy(node->model);
    if (node->cluster)
        kvr_cluster_free(node->cluster);
    memset(node, 0, sizeof *node);
}

kvr_status_t kvr_node_send(kvr_node_t *node, unsigned method, const ProtobufCMessage *msg)
{
    kvr_proto_hdr_t h = {KVR_PROTO_VERSION, 0, (uint16_t)method, 0};
    kvr_status_t s = kvr_proto_send(node->sock, NULL, 0, &h, msg);
    if (s != KVR_OK)
        KVR_LOG_WARN(COMP, "send %s to the router: %s", kvr_proto_method_name(method),
                     kvr_status_str(s));
    return s;
}

void kvr_node_fill_register(kvr_node_t *node, Kvrail__RegisterRequest *r, Kvrail__KvLayout *l,
                            const void *addr, size_t addr_len)
{
    static char host[256];
    if (!host[0] && gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "localhost");
    kvrail__kv_layout__init(l);
    l->layers = (uint32_t)node->layout.n_layers;
    l->kv_heads = (uint32_t)node->layout.n_kv_heads;
    l->head_dim = (uint32_t)node->layout.head_dim;
    l->block_size = (uint32_t)node->layout.block_size;
    l->dtype = (char *)kvr_kv_dtype_name(node->layout.dtype);
    l->numerics = node->cluster->numerics;
    l->kernels = (char *)(node->kernels ? node->kernels : "");
    l->max_context = (uint32_t)kvr_model_max_pos(node->model);
    l->vocab_size = (uint32_t)kvr_model_vocab(node->model);
    r->node_name = node->name;
    r->role = node->role == KVR_NODE_ROLE_PREFILL ? KVRAIL__ROLE__ROLE_PREFILL
                                                  : KVRAIL__ROLE__ROLE_DECODE;
    r->model_fingerprint = node->fingerprint_str;
    r->layout = l;
    r->transport = (char *)kvr_xfer_engine_backend(node->xfer);
    r->transport_address.data = (uint8_t *)addr;
    r->transport_address.len = addr_len;
    r->protocol_version = KVR_PROTO_VERSION;
    r->pid = (uint32_t)getpid();
    r->host = host;
    r->incarnation = node->incarnation;
    node->last_register_ns = kvr_now_ns();
}

#define KVR_NODE_REGISTER_BACKOFF_MAX_MS 30000u

static uint64_t register_retry_ns(const kvr_node_t *node)
{
    return (node->register_retry_ms ? node->register_retry_ms : 1000u) * 1000000ull;
}

/* The router refused a REGISTER: the next one waits twice as long. */
static void register_refused(kvr_node_t *node)
{
    uint32_t ms = node->register_retry_ms ? node->register_retry_ms : 1000u;
    node->register_retry_ms =
        ms * 2 < KVR_NODE_REGISTER_BACKOFF_MAX_MS ? ms * 2 : KVR_NODE_REGISTER_BACKOFF_MAX_MS;
    node->registered = false;
}

static bool register_due(kvr_node_t *node)
{
    return !node->registered && (node->last_register_ns == 0 ||
                                 kvr_now_ns() - node->last_register_ns > register_retry_ns(node));
}

static bool heartbeat_due(kvr_node_t *node)
{
    uint64_t now = kvr_now_ns();
    if (!node->registered || now - node->last_heartbeat_ns < node->heartbeat_ms * 1000000ull)
        return false;
    node->last_heartbeat_ns = now;
    return true;
}

static void handle_builtin(kvr_node_t *node, unsigned method, ProtobufCMessage *m)
{
    if (method == KVRAIL__METHOD__REGISTER) {
        Kvrail__RegisterReply *r = (Kvrail__RegisterReply *)m;
        if (r->status && r->status->code != 0) {
            register_refused(node);
            KVR_LOG_ERROR(COMP, "the router refused registration: %s (%s); next try in %u s",
                          r->status->message ? r->status->message : "",
                          kvr_status_str((kvr_status_t)r->status->code),
                          node->register_retry_ms / 1000);
            return;
        }
        if (r->heartbeat_interval_ms)
            node->heartbeat_ms = r->heartbeat_interval_ms;
        if (!node->registered)
            KVR_LOG_INFO(COMP, "registered with the router (heartbeat every %u ms)",
                         node->heartbeat_ms);
        node->registered = true;
        node->register_retry_ms = 0;
        node->last_hb_reply_ns = kvr_now_ns();
        node->last_heartbeat_ns = 0;
    } else if (method == KVRAIL__METHOD__HEARTBEAT) {
        Kvrail__HeartbeatReply *r = (Kvrail__HeartbeatReply *)m;
        node->last_hb_reply_ns = kvr_now_ns();
        if (r->reregister) {
            KVR_LOG_WARN(COMP, "the router does not know this node: registering again");
            node->registered = false;
            node->last_register_ns = 0;
        }
    }
}

static int drain_router(kvr_node_t *node)
{
    int n = 0;
    for (int i = 0; i < 1024; i++) {
        kvr_proto_frame_t fr;
        char err[256];
        kvr_status_t s = kvr_proto_recv(node->sock, false, &fr, err, sizeof err);
        if (s == KVR_ERR_NO_RESOURCE) {
            kvr_proto_frame_clear(&fr);
            break;
        }
        n++;
        if (s != KVR_OK) {
            node->bad_frames++;
            KVR_LOG_WARN(COMP, "dropped a bad frame from the router: %s", err);
            kvr_proto_frame_clear(&fr);
            continue;
        }
        unsigned method = fr.hdr.method;
        const ProtobufCMessageDescriptor *d;
        if (fr.hdr.flags & KVR_PROTO_F_ERROR)
            d = &kvrail__status__descriptor;
        else if (method == KVRAIL__METHOD__REGISTER || method == KVRAIL__METHOD__HEARTBEAT)
            d = kvr_proto_method_reply_desc(method);
        else
            d = kvr_proto_method_desc(method);
        ProtobufCMessage *m = NULL;
        if (!d || kvr_proto_decode(&fr, d, &m, err, sizeof err) != KVR_OK) {
            node->bad_frames++;
            KVR_LOG_WARN(COMP, "dropped a %s frame from the router: %s",
                         kvr_proto_method_name(method) ? kvr_proto_method_name(method) : "?",
                         d ? err : "no payload type");
            kvr_proto_frame_clear(&fr);
            continue;
        }
        kvr_proto_frame_clear(&fr);
        if (d == &kvrail__status__descriptor) {
            Kvrail__Status *st = (Kvrail__Status *)m;
            if (method == KVRAIL__METHOD__REGISTER) {
                register_refused(node);
                KVR_LOG_WARN(COMP,
                             "the router answered REGISTER with an error: %s; next try in %u s",
                             st->message ? st->message : "", node->register_retry_ms / 1000);
            } else {
                if (method == KVRAIL__METHOD__HEARTBEAT)
                    node->registered = false;
                KVR_LOG_WARN(COMP, "the router answered %s with an error: %s",
                             kvr_proto_method_name(method) ? kvr_proto_method_name(method) : "?",
                             st->message ? st->message : "");
            }
        } else if (method == KVRAIL__METHOD__REGISTER || method == KVRAIL__METHOD__HEARTBEAT) {
            handle_builtin(node, method, m);
        } else if (node->ops && node->ops->on_msg) {
            node->ops->on_msg(node->ops_arg, method, m);
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    return n;
}

static int drain_worker(kvr_node_t *node)
{
    int n = 0;
    struct kvr_worker_event ev;
    while (node->worker && kvr_worker_next_event(node->worker, &ev)) {
        n++;
        if (node->ops && node->ops->on_worker)
            node->ops->on_worker(node->ops_arg, &ev);
    }
    return n;
}

/* Waits up to timeout_ms for a control message, a transfer event or a
 * worker event, then progresses the transfer engine and dispatches. */
static int poll_once(kvr_node_t *node, int timeout_ms)
{
    zmq_pollitem_t items[3];
    int nitems = 0;
    items[nitems++] = (zmq_pollitem_t){node->sock, 0, ZMQ_POLLIN, 0};
    if (node->worker)
        items[nitems++] = (zmq_pollitem_t){kvr_worker_socket(node->worker), 0, ZMQ_POLLIN, 0};
    if (node->xfer_fd >= 0)
        items[nitems++] = (zmq_pollitem_t){NULL, node->xfer_fd, ZMQ_POLLIN, 0};
    else if (timeout_ms > 2)
        timeout_ms = 2; /* no event fd: poll the engine often */
    if (timeout_ms > 0 && kvr_xfer_progress(node->xfer) > 0)
        timeout_ms = 0;
    int n = 0;
    if (zmq_poll(items, nitems, timeout_ms) < 0 && errno != EINTR)
        KVR_LOG_WARN(COMP, "zmq_poll: %s", zmq_strerror(errno));
    n += kvr_xfer_progress(node->xfer);
    n += drain_router(node);
    n += drain_worker(node);
    return n;
}

kvr_status_t kvr_node_start_worker(kvr_node_t *node, const struct kvr_ctx_opts *opts, char *err,
                                   size_t err_len)
{
    /* the cluster file's numerics (checked by its parser); a CPU that
     * cannot compute them fails here, at start-up, saying so */
    struct kvr_ctx_opts o = *opts;
    if (kvr_numerics_parse(node->cluster->numerics, &o.numerics) != KVR_OK) {
        snprintf(err, err_len, "numerics '%s' is not f32 or bf16dot", node->cluster->numerics);
        return KVR_ERR_INVALID;
    }
    node->kernels = kvr_engine_kernels(o.backend);
    if (node->kernels && !strncmp(node->kernels, "cpu-base", 8))
        KVR_LOG_WARN(COMP,
                     "the engine runs its baseline kernels (cpu-base: no FMA; an x86-64 CPU "
                     "without AVX2+FMA, KVR_CPU_MATMUL=base, or an unoptimized/clang/non-x86 "
                     "build): their logits differ in the last bits from cpu-fma16 nodes', so the "
                     "router accepts this node only into a cluster of cpu-base nodes");
    return kvr_worker_create(node->zctx, node->model, &o, &node->worker, err, err_len);
}

void kvr_node_stats_dirty(kvr_node_t *node)
{
    node->stats_dirty = true;
}

void kvr_sbuf_printf(struct kvr_sbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->failed = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->failed = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

/* The node's stats object: the common fields, then the role's.  The one
 * rendering that the stats file and the metrics mirror both read. */
void kvr_node_stats_render(kvr_node_t *node, struct kvr_sbuf *b)
{
    kvr_sbuf_printf(b,
                    "{\"node\": \"%s\", \"role\": \"%s\", \"registered\": %s, \"incarnation\": "
                    "%" PRIu64 ", \"bad_frames\": %" PRIu64,
                    node->name, kvr_node_role_name(node->role), node->registered ? "true" : "false",
                    node->incarnation, node->bad_frames);
    if (node->ops && node->ops->stats)
        node->ops->stats(node->ops_arg, b);
    kvr_sbuf_printf(b, "}\n");
}

/* The stats file, written to a temporary file and renamed, so a reader
 * never sees half of it. */
static void write_stats(kvr_node_t *node)
{
    struct kvr_sbuf b = {0};
    kvr_node_stats_render(node, &b);
    if (b.failed || !b.p) {
        free(b.p);
        return;
    }
    char tmp[KVR_CLUSTER_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", node->stats_path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fputs(b.p, f);
        if (fclose(f) == 0)
            rename(tmp, node->stats_path);
    }
    free(b.p);
}

void kvr_node_run(kvr_node_t *node, const struct kvr_node_ops *ops, void *arg)
{
    node->ops = ops;
    node->ops_arg = arg;
    while (!kvr_node_stopping()) {
        if (register_due(node))
            ops->send_register(arg);
        if (heartbeat_due(node)) {
            ops->send_heartbeat(arg);
            node->stats_dirty = true;
        }
        int timeout = ops->turn(arg);
        /* wake for the next heartbeat or registration retry */
        uint64_t now = kvr_now_ns(), next;
        if (node->registered)
            next = node->last_heartbeat_ns + node->heartbeat_ms * 1000000ull;
        else
            next = node->last_register_ns + register_retry_ns(node);
        int64_t until = next > now ? (int64_t)((next - now) / 1000000ull) + 1 : 0;
        if (until < timeout)
            timeout = (int)until;
        if (node->stats_path) { /* the stats file is rewritten every 500 ms regardless */
            uint64_t due = node->last_stats_ns + (node->stats_dirty ? 50000000ull : 500000000ull);
            int64_t s_until = due > now ? (int64_t)((due - now) / 1000000ull) + 1 : 0;
            if (s_until < timeout)
                timeout = (int)s_until;
        }
        int m_until = kvr_node_metrics_update(node, now); /* Prometheus mirror, once a second */
        if (m_until < timeout)
            timeout = m_until;
        poll_once(node, timeout);
        now = kvr_now_ns();
        if (node->stats_path && (node->stats_dirty || now - node->last_stats_ns > 500000000ull) &&
            now - node->last_stats_ns > 50000000ull) {
            write_stats(node);
            node->stats_dirty = false;
            node->last_stats_ns = now;
        }
    }
}

kvr_status_t kvr_node_sampling(const Kvrail__SamplingParams *sp, uint64_t seed,
                               struct kvr_sample_params *out_p)
{
    kvr_sample_params_default(out_p);
    out_p->seed = seed;
    if (!sp)
        return KVR_OK;
    out_p->temperature = sp->temperature;
    out_p->top_k = (int32_t)sp->top_k;
    out_p->top_p = sp->top_p > 0 ? sp->top_p : 1.0f;
    out_p->repetition_penalty = sp->repetition_penalty > 0 ? sp->repetition_penalty : 1.0f;
    out_p->min_p = sp->min_p;
    out_p->presence_penalty = sp->presence_penalty;
    out_p->frequency_penalty = sp->frequency_penalty;
    if (sp->n_logit_bias && sp->n_logit_bias <= KVR_SAMPLE_MAX_LOGIT_BIAS) {
        struct kvr_logit_bias *b = malloc(sp->n_logit_bias * sizeof *b);
        if (!b)
            return KVR_ERR_NO_MEMORY;
        for (size_t i = 0; i < sp->n_logit_bias; i++) {
            b[i].token = sp->logit_bias[i]->token_id > INT32_MAX
                             ? -1 /* refused by the sampler's check */
                             : (int32_t)sp->logit_bias[i]->token_id;
            b[i].bias = sp->logit_bias[i]->bias;
        }
        out_p->logit_bias = b;
    }
    /* past the bound: no array, and the count the sampler's check refuses */
    out_p->n_logit_bias = sp->n_logit_bias;
    return KVR_OK;
}

void kvr_node_sampling_free(struct kvr_sample_params *p)
{
    if (!p)
        return;
    free((void *)p->logit_bias);
    p->logit_bias = NULL;
    p->n_logit_bias = 0;
}
