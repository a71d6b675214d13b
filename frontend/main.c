/*
 * main.c - kvrail-frontend: the OpenAI-compatible HTTP frontend of a kvrail
 * cluster, a separate process that speaks the router's protobuf client API
 * (so frontends scale by adding processes, and HTTP parsing never runs in
 * the router).
 *
 *   kvrail-frontend --config cluster.yaml [--listen HOST:PORT]
 *   kvrail-frontend --router tcp://HOST:PORT --model-name NAME [--context-len N]
 *
 * The cluster file gives the router's client endpoint and the model folder,
 * whose name is the model id served and whose config.json gives the context
 * length, and whose tokenizer_config.json the chat template.  The process
 * runs until SIGINT/SIGTERM.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvr_cluster.h"
#include "kvr_log.h"
#include "kvr_version.h"
#include "frontend.h"

struct fe_config fe_cfg = {
    .listen_host = "127.0.0.1",
    .port = 8000,
    .max_connections = 256,
    .max_body = 4u << 20,
    .max_n = 16,
    .max_prompts = 64,
    .request_timeout_ms = 300000,
    .idle_timeout_s = 60,
    .header_timeout_s = 10,
    .def_temperature = 1.0f,
    .def_top_p = 1.0f,
    .def_repetition_penalty = 1.0f,
};

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvrail-frontend --config FILE [options]\n"
            "       kvrail-frontend --router ENDPOINT --model-name NAME [options]\n"
            "OpenAI-compatible HTTP (POST /v1/completions, /v1/chat/completions; GET /v1/models,\n"
            "/health, /ready, /metrics) in front of a kvrail router.\n"
            "  --config FILE            cluster file: router endpoint, model folder\n"
            "  --router ENDPOINT        the router's client endpoint (tcp://host:port)\n"
            "  --router-link auto|direct|zmq how the request loop reaches the router:\n"
            "                           direct: ZMTP spoken on its own socket, no ZeroMQ\n"
            "                           I/O thread; zmq: a libzmq DEALER; auto (default):\n"
            "                           direct.  Both speak CURVE when its keys are set\n"
            "                           (KVRAIL_ROUTER_KEY, KVRAIL_CLIENT_KEY)\n"
            "  --listen HOST:PORT       where to serve HTTP (default 127.0.0.1:8000)\n"
            "  --model-name NAME        the model id to serve (default: the model folder's name)\n"
            "  --context-len N          the model's context length (default: config.json)\n"
            "  --max-connections N      open connections before 503 (default 256)\n"
            "  --max-body BYTES         largest request body (default 4194304)\n"
            "  --max-n N                largest n (default 16)\n"
            "  --request-timeout-ms MS  a request's whole deadline (default 300000)\n"
            "  --idle-timeout-s S       an idle connection is closed after S s (default 60)\n"
            "  --header-timeout-s S     a connection whose request (head and body) is not in\n"
            "                           S s after it opened (after --idle-timeout-s + S\n"
            "                           after its previous answer) is closed (default 10)\n"
            "  --busy-poll-us N         while requests run, after a turn that handled\n"
            "                           something, look for more without sleeping for up to\n"
            "                           N us (yielding the CPU between looks) before\n"
            "                           blocking: a router frame then finds the loop running,\n"
            "                           not a thread to wake, at up to N us of CPU per turn.\n"
            "                           Only for a frontend with a CPU of its own (default 0:\n"
            "                           off; at most 1000)\n"
            "  --version, --help\n");
}

static bool parse_uint(const char *s, unsigned long long lo, unsigned long long hi,
                       unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_listen(const char *s)
{
    const char *colon = strrchr(s, ':');
    unsigned long long port;
    if (!colon || !parse_uint(colon + 1, 0, 65535, &port))
        return false;
    size_t hl = (size_t)(colon - s);
    if (s[0] == '[' && hl >= 2 && s[hl - 1] == ']') { /* [::1]:8000 */
        s++;
        hl -= 2;
    }
    if (hl >= sizeof(fe_cfg.listen_host))
        return false;
    memcpy(fe_cfg.listen_host, s, hl);
    fe_cfg.listen_host[hl] = 0;
    fe_cfg.port = (int)port;
    return true;
}

static void read_context(const char *model_dir)
{
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof(path), "%s/config.json", model_dir);
    kvr_json_doc_t *doc = NULL;
    if (kvr_json_parse_file(path, &doc, err, sizeof(err)) != KVR_OK) {
        KVR_LOG_WARN(FE_COMP, "%s: GET /v1/models will not show the context length", err);
        return;
    }
    int64_t ctx = kvr_json_get_int(kvr_json_root(doc), "max_position_embeddings", 0, NULL);
    if (ctx > 0 && ctx < (1ll << 31))
        fe_cfg.context_len = (uint32_t)ctx;
    kvr_json_free(doc);
}

/* The model's generation_config.json: its temperature, top_p, top_k and
 * repetition_penalty become the defaults of requests that leave them out. */
static void read_gen_defaults(const char *model_dir)
{
    char path[PATH_MAX + 32], err[512];
    snprintf(path, sizeof(path), "%s/generation_config.json", model_dir);
    kvr_json_doc_t *doc = NULL;
    if (kvr_json_parse_file(path, &doc, err, sizeof(err)) != KVR_OK) {
        KVR_LOG_INFO(FE_COMP, "no generation_config.json (%s): OpenAI's sampling defaults", err);
        return;
    }
    const kvr_json_t *g = kvr_json_root(doc);
    bool ok = true;
    double t = kvr_json_get_num(g, "temperature", fe_cfg.def_temperature, &ok);
    double p = kvr_json_get_num(g, "top_p", fe_cfg.def_top_p, &ok);
    int64_t k = kvr_json_get_int(g, "top_k", fe_cfg.def_top_k, &ok);
    double rp = kvr_json_get_num(g, "repetition_penalty", fe_cfg.def_repetition_penalty, &ok);
    double mp = kvr_json_get_num(g, "min_p", 0, &ok);
    if (!ok || t < 0 || t > 2 || p <= 0 || p > 1 || k < 0 || k > (1 << 20) || rp <= 0 || rp > 10 ||
        !(mp >= 0 && mp <= 1)) {
        KVR_LOG_WARN(FE_COMP,
                     "%s: a sampling default of the wrong type or out of range; using "
                     "OpenAI's defaults",
                     path);
    } else {
        fe_cfg.def_temperature = (float)t;
        fe_cfg.def_top_p = (float)p;
        fe_cfg.def_top_k = (uint32_t)k;
        fe_cfg.def_repetition_penalty = (float)rp;
        fe_cfg.def_min_p = (float)mp;
        KVR_LOG_INFO(FE_COMP,
                     "sampling defaults from %s: temperature %g, top_p %g, top_k %u, "
                     "repetition_penalty %g, min_p %g",
                     path, t, p, (unsigned)k, rp, mp);
    }
    kvr_json_free(doc);
}

/* Every connection holds its HTTP socket (libmicrohttpd's bound is a quarter
 * above --max-connections); the rest is fixed: the loop's router client and
 * epoll sets, /ready's probe clients (at most 16 at once, three ZeroMQ
 * sockets and a TCP connection each), ZeroMQ's and the model's files.  The
 * soft limit is raised towards the hard one; a hard limit too low for
 * --max-connections is a start-up error with the fix, not a failure under
 * load. */
static bool fd_budget(void)
{
    rlim_t need = (rlim_t)fe_cfg.max_connections * 5 / 4 + 8 + 16 * 8 + 256;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return true;
    if (rl.rlim_cur >= need)
        return true;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
    struct rlimit nr = {want, rl.rlim_max};
    if (want > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &nr) == 0)
        rl.rlim_cur = want;
    if (rl.rlim_cur < need) {
        fprintf(stderr,
                "kvrail-frontend: --max-connections %u needs about %llu file descriptors, the "
                "limit is %llu (hard %llu): raise it (ulimit -n, LimitNOFILE= in the systemd "
                "unit) or lower --max-connections\n",
                fe_cfg.max_connections, (unsigned long long)need, (unsigned long long)rl.rlim_cur,
                (unsigned long long)rl.rlim_max);
        return false;
    }
    KVR_LOG_INFO(FE_COMP, "file descriptor limit raised to %llu for %u connections",
                 (unsigned long long)rl.rlim_cur, fe_cfg.max_connections);
    return true;
}

int main(int argc, char **argv)
{
    enum {
        O_CONFIG = 1000,
        O_ROUTER,
        O_LISTEN,
        O_MODEL,
        O_CTX,
        O_MAXCONN,
        O_BODY,
        O_MAXN,
        O_TIMEOUT,
        O_IDLE,
        O_LINK,
        O_HDRTIMEOUT,
        O_BUSYPOLL,
        O_VERSION,
        O_HELP
    };
    static const struct option opts[] = {
        {"config", required_argument, 0, O_CONFIG},
        {"router", required_argument, 0, O_ROUTER},
        {"listen", required_argument, 0, O_LISTEN},
        {"model-name", required_argument, 0, O_MODEL},
        {"context-len", required_argument, 0, O_CTX},
        {"max-connections", required_argument, 0, O_MAXCONN},
        {"max-body", required_argument, 0, O_BODY},
        {"max-n", required_argument, 0, O_MAXN},
        {"request-timeout-ms", required_argument, 0, O_TIMEOUT},
        {"idle-timeout-s", required_argument, 0, O_IDLE},
        {"router-link", required_argument, 0, O_LINK},
        {"header-timeout-s", required_argument, 0, O_HDRTIMEOUT},
        {"busy-poll-us", required_argument, 0, O_BUSYPOLL},
        {"version", no_argument, 0, O_VERSION},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    const char *config = NULL;
    unsigned long long v;
    int o;
    kvr_log_set_process("frontend");
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        bool ok = true;
        switch (o) {
        case O_CONFIG:
            config = optarg;
            break;
        case O_ROUTER:
            snprintf(fe_cfg.router, sizeof(fe_cfg.router), "%s", optarg);
            break;
        case O_LISTEN:
            ok = parse_listen(optarg);
            break;
        case O_MODEL:
            ok = optarg[0] && strlen(optarg) < sizeof(fe_cfg.model_name);
            snprintf(fe_cfg.model_name, sizeof(fe_cfg.model_name), "%s", optarg);
            break;
        case O_CTX:
            ok = parse_uint(optarg, 1, 1u << 30, &v);
            fe_cfg.context_len = (uint32_t)v;
            break;
        case O_MAXCONN:
            ok = parse_uint(optarg, 1, 100000, &v);
            fe_cfg.max_connections = (uint32_t)v;
            break;
        case O_BODY:
            ok = parse_uint(optarg, 1024, 1ull << 30, &v);
            fe_cfg.max_body = (size_t)v;
            break;
        case O_MAXN:
            ok = parse_uint(optarg, 1, 128, &v);
            fe_cfg.max_n = (uint32_t)v;
            break;
        case O_TIMEOUT:
            ok = parse_uint(optarg, 100, 24ull * 3600 * 1000, &v);
            fe_cfg.request_timeout_ms = (int)v;
            break;
        case O_IDLE:
            ok = parse_uint(optarg, 1, 3600, &v);
            fe_cfg.idle_timeout_s = (int)v;
            break;
        case O_HDRTIMEOUT:
            ok = parse_uint(optarg, 1, 3600, &v);
            fe_cfg.header_timeout_s = (int)v;
            break;
        case O_BUSYPOLL:
            ok = parse_uint(optarg, 0, 1000, &v);
            fe_cfg.busy_poll_us = (unsigned)v;
            break;
        case O_LINK:
            ok = !strcmp(optarg, "auto") || !strcmp(optarg, "direct") || !strcmp(optarg, "zmq");
            fe_cfg.router_zmq = !strcmp(optarg, "zmq");
            break;
        case O_VERSION:
            kvr_version_print("kvrail-frontend");
            return 0;
        case O_HELP:
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvrail-frontend: bad value '%s' for --%s (see --help)\n", optarg,
                    opts[o - O_CONFIG].name);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvrail-frontend: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (config) {
        char err[1024];
        kvr_cluster_t *cl = NULL;
        if (kvr_cluster_load(config, &cl, err, sizeof(err)) != KVR_OK) {
            fprintf(stderr, "kvrail-frontend: %s\n", err);
            return 1;
        }
        if (!fe_cfg.router[0])
            snprintf(fe_cfg.router, sizeof(fe_cfg.router), "%s", cl->client_endpoint);
        if (!fe_cfg.model_name[0]) {
            const char *base = cl->model_dir;
            size_t n = strlen(base);
            while (n > 1 && base[n - 1] == '/')
                n--;
            const char *slash = memrchr(base, '/', n);
            const char *name = slash ? slash + 1 : base;
            snprintf(fe_cfg.model_name, sizeof(fe_cfg.model_name), "%.*s",
                     (int)(n - (size_t)(name - base)), name);
        }
        if (!fe_cfg.context_len)
            read_context(cl->model_dir);
        fe_cfg.max_tokens_limit = cl->max_tokens_limit;
        read_gen_defaults(cl->model_dir);
        fe_chat_init(cl->model_dir);
        bool curve = cl->auth == KVR_AUTH_CURVE;
        kvr_cluster_free(cl);
        if (curve && !(getenv("KVRAIL_ROUTER_KEY") && getenv("KVRAIL_CLIENT_KEY"))) {
            /* the router would drop this client's handshakes without a word */
            fprintf(stderr,
                    "kvrail-frontend: %s has auth: curve; set KVRAIL_ROUTER_KEY (the router's "
                    ".pub) and KVRAIL_CLIENT_KEY (a client's .key from kvrail keygen, "
                    "docs/security.md)\n",
                    config);
            return 1;
        }
    } else {
        fe_chat_init(NULL);
    }
    if (!fe_cfg.router[0] || !fe_cfg.model_name[0]) {
        fprintf(stderr, "kvrail-frontend: give --config FILE, or --router ENDPOINT and "
                        "--model-name NAME (see --help)\n");
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (!fd_budget())
        return 1;
    if (fe_http_start() != KVR_OK)
        return 1;
    fe_http_serve(&stop_flag);
    KVR_LOG_INFO(FE_COMP, "stopping");
    fe_http_stop();
    fe_client_pool_close();
    return 0;
}
